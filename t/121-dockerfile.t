# The Dockerfile cannot drift away from the Makefile's build unnoticed
# (docker itself does not run here): every package it installs is one that
# scripts/setup.sh installs, every make target it runs exists, every COPY
# source is in the repository, every path it names in the built tree is the
# one `make build` produces, the paths it hands the entrypoint are the ones
# the entrypoint uses, and the entrypoint renders a configuration that
# passes `nginx -t` with the built module.

use strict;
use warnings;

use Test::More;
use File::Temp qw(tempdir);
use Cwd qw(abs_path);

my $nginx  = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';
my $module = abs_path($ENV{TEST_NGINX_LOAD_MODULES}
                      || 'build/ngx_http_idempotency_module.so');

sub slurp {
    open my $h, '<', $_[0] or die "$_[0]: $!\n";
    local $/;
    return <$h>;
}

# instructions as [stage, keyword, arguments], continuation lines joined
my (@ins, $stage);
my $text = slurp('Dockerfile');
$text =~ s/\\\n\s*/ /g;
for (split /\n/, $text) {
    next if /^\s*(#|$)/;
    my ($kw, $args) = /^\s*(\w+)\s+(.*?)\s*$/ or next;
    $kw = uc $kw;
    if ($kw eq 'FROM') {
        ($stage) = $args =~ /\bAS\s+(\S+)/i;
        $stage //= 'final';
    }
    push @ins, [$stage, $kw, $args];
}
my @final = grep { $_->[0] eq 'final' } @ins;

sub args_of {
    my ($st, $kw) = @_;
    return map { $_->[2] } grep { $_->[0] eq $st && $_->[1] eq $kw } @ins;
}

sub exec_form {
    my ($s) = @_;
    return map { /^"(.*)"$/ ? $1 : $_ } $s =~ /("(?:[^"\\]|\\.)*")/g;
}

# -- base images: Debian 12, what setup.sh and the build scripts expect
for (grep { $_->[1] eq 'FROM' } @ins) {
    like($_->[2], qr/^debian:bookworm\S*/, "FROM $_->[2]: Debian 12");
}

# -- packages
my %setup_sets = map { $_ => 1 }
    slurp('scripts/setup.sh') =~ /^\s+(\w+)\)\s+want=/mg;
my %setup_pkgs;
for my $set (keys %setup_sets) {
    $setup_pkgs{$_} = 1 for split /\n/, `sh scripts/setup.sh --list $set`;
}
ok(%setup_pkgs, 'scripts/setup.sh --list names its packages');

# a package apt knows: installed here (one dpkg-query), or in apt's lists
my %installed = map { $_ => 1 }
    split /\n/, qx{dpkg-query -W -f='\${Package}\n' 2>/dev/null};
sub known_to_apt {
    my ($p) = @_;
    return $installed{$p}
        || system("apt-cache show $p > /dev/null 2>&1") == 0;
}

my $runs = 0;
for my $i (grep { $_->[1] eq 'RUN' } @ins) {
    my $cmd = $i->[2];
    $runs++;
    for my $set ($cmd =~ m{\bsetup\.sh\s+(\w+)}g) {
        ok($setup_sets{$set}, "RUN setup.sh $set: a set of scripts/setup.sh");
        for my $p (split /\n/, `sh scripts/setup.sh --list $set`) {
            ok(known_to_apt($p), "  its package $p is known to apt");
        }
    }
    for my $list ($cmd =~ /apt-get\s+install\s+([^&;|]+)/g) {
        for my $p (grep { !/^-/ } split ' ', $list) {
            ok($setup_pkgs{$p} || known_to_apt($p),
               "RUN apt-get install $p: installed by setup.sh or known to apt");
        }
    }
    for my $t ($cmd =~ /\bmake\s+([\w-]+)/g) {
        like(slurp('Makefile'), qr/^\Q$t\E:/m, "RUN make $t: a Makefile target");
    }
}
ok($runs, 'the Dockerfile has RUN steps');
like(join(' ', args_of('build', 'RUN')), qr/\bmake build\b/,
     'the build stage runs make build, as on a host');

# -- COPY sources: in the repository, or the build stage's make build
my ($workdir) = args_of('build', 'WORKDIR');
my ($made) = slurp('Makefile') =~ /^MODULE\s*:=\s*(\S+)/m;
# $(B): build/ unless NGINX_VERSION or HIREDIS pick another build directory
my ($b) = slurp('Makefile') =~ /^B\s*:=\s*(\S+)/m;
is($b, 'build', "the Makefile's default build directory is build/");
$made =~ s/\$\(B\)/$b/;
SKIP: {
    skip 'a run against another nginx or hiredis: build/ may not be built', 1
        if $ENV{NGINX_VERSION} || $ENV{HIREDIS};
    ok(-f $made, "the Makefile's MODULE ($made) is built");
}
my %dest;    # repository path or build-tree path -> where it lands
for my $i (grep { $_->[1] eq 'COPY' } @ins) {
    my @w = split ' ', $i->[2];
    my ($from) = map { /^--from=(\S+)/ ? $1 : () } @w;
    @w = grep { !/^--/ } @w;
    my $to = pop @w;
    for my $src (@w) {
        my $landing = $to =~ m{/$} ? $to . (split m{/}, $src)[-1] : $to;
        if ($from) {
            is($from, 'build', "COPY --from=$from: the build stage");
            my $rel = $src =~ s{^\Q$workdir\E/}{}r;
            is($rel, $made, "COPY --from $src is the module make build makes");
            $dest{module} = $landing;
        } else {
            ok(-e $src, "COPY $src: in the repository");
            $dest{$src} = $landing unless $src eq '.';
        }
    }
}

# -- what operators load into Prometheus and Grafana, where the
# documentation says the image has them
my $obs = slurp('docs/observability.md');
ok($dest{contrib}, 'the image ships contrib/ (alert rules, dashboard)');
like($obs, qr/\Q$dest{contrib}\E/,
     "  in $dest{contrib}, as docs/observability.md says")
    if $dest{contrib};

# -- the final image: entrypoint, its inputs, the command
my $entry = slurp('scripts/docker-entrypoint.sh');
my %default = $entry =~ /\$\{(\w+):-([^}]+)\}/g;
my ($ep) = exec_form((args_of('final', 'ENTRYPOINT'))[0] // '');
is($ep, $dest{'scripts/docker-entrypoint.sh'},
   'ENTRYPOINT is where COPY puts scripts/docker-entrypoint.sh');
is("$default{IDEMPOTENCY_LIB}/render-conf.sh", $dest{'scripts/render-conf.sh'},
   'the entrypoint finds render-conf.sh where COPY puts it');
is($default{IDEMPOTENCY_TEMPLATE}, $dest{'examples/nginx.conf'},
   'the entrypoint renders examples/nginx.conf from where COPY puts it');
is($default{MODULE_PATH}, $dest{module},
   'the entrypoint loads the module from where COPY puts it');
my @cmd = exec_form((args_of('final', 'CMD'))[0] // '');
is($cmd[0], 'nginx', 'CMD runs nginx');
my %opt = @cmd[1 .. $#cmd];
is($opt{'-c'}, $default{IDEMPOTENCY_CONF},
   'with the configuration the entrypoint renders');
is($opt{'-g'}, 'daemon off;', 'in the foreground (daemon off)');
ok(system("dpkg -L nginx-common | grep -qx '$opt{-p}'") == 0
   || system("dpkg -L nginx-common | grep -qx '" . ($opt{-p} =~ s{/$}{}r)
             . "'") == 0,
   "its prefix $opt{-p} comes with Debian's nginx");

my $env = join ' ', args_of('final', 'ENV');
like($env, qr/\bREDIS_ADDRESS=/, 'ENV sets REDIS_ADDRESS');
like($entry, qr/\$\{REDIS_ADDRESS:-/, 'which the entrypoint reads');
my ($health) = args_of('final', 'HEALTHCHECK');
like($health // '', qr{CMD .*http://127\.0\.0\.1:\$\{PORT\}(/\S*)"},
     'HEALTHCHECK asks nginx on $PORT');
my ($path) = ($health // '') =~ m{\$\{PORT\}(/[^"\s]*)};
like(slurp('examples/nginx.conf'), qr/location \Q$path\E\b/,
     "on a location of examples/nginx.conf ($path)");
like(join(' ', args_of('final', 'EXPOSE')), qr/\b8080\b/,
     'EXPOSE the default PORT');

# -- the entrypoint, run outside the image with the checkout's paths,
# renders a configuration that passes nginx -t with the built module
my $tmp = tempdir(CLEANUP => 1);
for my $redis ('127.0.0.1:6379', 'unix:/run/redis/redis.sock') {
    local $ENV{IDEMPOTENCY_LIB} = 'scripts';
    local $ENV{IDEMPOTENCY_TEMPLATE} = 'examples/nginx.conf';
    local $ENV{IDEMPOTENCY_CONF} = "$tmp/idempotency.conf";
    local $ENV{MODULE_PATH} = $module;
    local $ENV{REDIS_ADDRESS} = $redis;
    local $ENV{PORT} = 18080;
    my $out = `sh scripts/docker-entrypoint.sh $nginx -q -t -e stderr -p $tmp/ -c $tmp/idempotency.conf 2>&1`;
    is($?, 0, "REDIS_ADDRESS=$redis: the rendered configuration passes nginx -t")
        or diag($out);
    like(slurp("$tmp/idempotency.conf"), qr/idempotency_redis \Q$redis\E;/,
         '  and points the module at that Redis');
}

# -- Dockerfile.official: the official nginx image of NGINX_VERSION with
# the module built against that version's source (--with-compat)
my (@off, %arg);
my $ostage = 'args';    # ARGs before the first FROM
my $otext = slurp('Dockerfile.official');
$otext =~ s/\\\n\s*/ /g;
for (split /\n/, $otext) {
    next if /^\s*(#|$)/;
    my ($kw, $args) = /^\s*(\w+)\s+(.*?)\s*$/ or next;
    $kw = uc $kw;
    $arg{$1} = $2 if $kw eq 'ARG' && $args =~ /^(\w+)=(\S+)/;
    if ($kw eq 'FROM') {
        ($ostage) = $args =~ /\bAS\s+(\S+)/i;
        $ostage //= 'final';
        is($args =~ s/\s+AS\s+\S+$//ir, 'nginx:${NGINX_VERSION}',
           "Dockerfile.official: $ostage stage FROM the official nginx image");
    }
    push @off, [$ostage, $kw, $args];
}
sub off_args {
    my ($st, $kw) = @_;
    return map { $_->[2] } grep { $_->[0] eq $st && $_->[1] eq $kw } @off;
}
like($arg{NGINX_VERSION} // '', qr/^1\.(2[2-9]|3[01])\.\d+$/,
     "Dockerfile.official: the default NGINX_VERSION ($arg{NGINX_VERSION}) is a supported one");
like(slurp('README.md'), qr/\Q$arg{NGINX_VERSION}\E/,
     '  which README.md names');
my $orun = join ' ; ', off_args('build', 'RUN');
like($orun, qr{nginx-\$\{NGINX_VERSION\}\.tar\.gz},
     'Dockerfile.official: the build stage fetches that version\'s source');
like($orun, qr{\./configure --with-compat --add-dynamic-module=(\S+)},
     '  configures it --with-compat with the module');
my ($modsrc) = $orun =~ /--add-dynamic-module=(\S+)/;
like($orun, qr/\bmake modules\b/, '  and runs make modules');
for my $i (grep { $_->[1] eq 'RUN' } @off) {
    for my $list ($i->[2] =~ /apt-get\s+install\s+([^&;|]+)/g) {
        # "$(cat /tmp/hiredis.pkg)": the libhiredis-dev's runtime package
        for my $p (grep { !/^-/ && !/[\$"()]/ } split ' ', $list) {
            ok($setup_pkgs{$p} || known_to_apt($p),
               "Dockerfile.official: apt-get install $p: a known package");
        }
    }
}
my %odest;
for my $i (grep { $_->[1] eq 'COPY' } @off) {
    my @w = split ' ', $i->[2];
    my ($from) = map { /^--from=(\S+)/ ? $1 : () } @w;
    @w = grep { !/^--/ } @w;
    my $to = pop @w;
    for my $src (@w) {
        if ($from) {
            $odest{$src =~ s{.*/}{}r} = $to;
            next;
        }
        ok(-e $src, "Dockerfile.official: COPY $src: in the repository");
        # the module's sources land where configure looks for them
        like($to, qr{^\Q$modsrc\E/}, "  $src into the module's directory")
            if $i->[0] eq 'build';
        my $landing = $to =~ m{/$} ? $to . ($src =~ s{.*/}{}r) : $to;
        is($landing, $dest{$src}, "  $src lands where Dockerfile puts it")
            if $i->[0] eq 'final';
    }
}
ok(scalar(grep { m{^contrib\s} } off_args('final', 'COPY')),
   'Dockerfile.official: the image ships contrib/ too');
my ($oworkdir) = off_args('build', 'WORKDIR');
my ($omod) = grep { m{/objs/ngx_http_idempotency_module\.so\s} }
    off_args('final', 'COPY');
like($omod // '', qr{^--from=build /usr/src/nginx/objs/},
     'Dockerfile.official: the module is copied from the configured tree\'s objs/');
like($orun, qr{mv "nginx-\$\{NGINX_VERSION\}" nginx},
     '  which is the extracted source, renamed to nginx/');
is($odest{'ngx_http_idempotency_module.so'} . 'ngx_http_idempotency_module.so',
   $default{MODULE_PATH},
   'Dockerfile.official: the module lands where the entrypoint loads it');
my @ocmd = exec_form((off_args('final', 'CMD'))[0] // '');
my %oopt = @ocmd[1 .. $#ocmd];
is($oopt{'-c'}, $default{IDEMPOTENCY_CONF},
   'Dockerfile.official: CMD runs the configuration the entrypoint renders');
is((exec_form((off_args('final', 'ENTRYPOINT'))[0] // ''))[0],
   $dest{'scripts/docker-entrypoint.sh'},
   'Dockerfile.official: the same entrypoint as Dockerfile');

done_testing();
