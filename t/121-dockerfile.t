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
ok(-f $made, "the Makefile's MODULE ($made) is built");
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

done_testing();
