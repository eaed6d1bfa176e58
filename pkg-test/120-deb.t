# make deb's package installs, loads and goes away cleanly: built with
# `make deb`, installed with apt-get, its .so and modules-enabled link are
# where Debian's nginx looks, `nginx -t` accepts a configuration that uses
# the module through that link, its documentation (README, the directive
# reference, README.Debian, an example site, the alert rules and dashboard
# of contrib/) is installed, and a purge
# leaves /etc/nginx, the modules
# directory and modules-available as they were. Installs packages: runs as
# root only (make test-deb), and never starts or reloads the system nginx.

use strict;
use warnings;

use Test::More;
use File::Temp qw(tempdir);
use Cwd qw(abs_path);
use File::Basename qw(dirname);

my $root = abs_path(dirname(__FILE__) . '/..');
my $pkg  = 'libnginx-mod-http-idempotency';
my $so   = '/usr/lib/nginx/modules/ngx_http_idempotency_module.so';
my $conf = '/usr/share/nginx/modules-available/mod-http-idempotency.conf';
my $link = '/etc/nginx/modules-enabled/50-mod-http-idempotency.conf';
my $nginx = $ENV{NGINX_BIN} || '/usr/sbin/nginx';

plan skip_all => 'installs a package: run as root (make test-deb)'
    if $> != 0;

sub pkg_status {
    my $s = `dpkg-query -W -f='\${Status}' $pkg 2>/dev/null`;
    return $s eq '' ? 'not-installed' : $s;
}

plan skip_all => "$pkg is on this machine already (" . pkg_status()
    . "); not touching it"
    if pkg_status() !~ /not-installed/;

# what must look the same after the purge
sub snapshot {
    my @lines;
    for my $dir ('/etc/nginx/modules-enabled',
                 '/usr/share/nginx/modules-available',
                 '/usr/lib/nginx/modules')
    {
        opendir my $dh, $dir or next;
        for my $e (sort grep { !/^\.\.?$/ } readdir $dh) {
            my $p = "$dir/$e";
            push @lines, -l $p ? "$p -> " . readlink($p) : $p;
        }
    }
    return join "\n", @lines, '';
}

my $before = snapshot();
my $installed;

my @apt = ('apt-get', '-y', '-q', '--no-install-recommends',
           '-o', 'DPkg::Lock::Timeout=300');
$ENV{DEBIAN_FRONTEND} = 'noninteractive';

sub run_quiet {
    my $out = `@_ 2>&1`;
    diag($out) if $?;
    return $? == 0;
}

END {
    local $?;    # the exit status of the test, not of these commands
    # a failure half-way must not leave the package installed
    if ($installed && pkg_status() !~ /not-installed/) {
        system(@apt, 'purge', $pkg);
    }
}

my ($version) = do {
    open my $h, '<', "$root/src/ngx_http_idempotency_version.h" or die $!;
    map { /^#define NGX_HTTP_IDEMPOTENCY_VERSION\s+"([^"]+)"/ ? $1 : () } <$h>;
};
ok($version, "version $version from src/ngx_http_idempotency_version.h");

ok(run_quiet("make -C '$root' --no-print-directory deb"), 'make deb');
chomp(my $arch = `dpkg-architecture -qDEB_HOST_ARCH`);
my $deb = "$root/build/deb/${pkg}_${version}_$arch.deb";
ok(-f $deb, "make deb made build/deb/${pkg}_${version}_$arch.deb")
    or BAIL_OUT('no package to install');

like(`dpkg-deb -f '$deb' Depends`, qr/\bnginx-abi-[\d.]+-\d+\b/,
     'it depends on the nginx ABI it was built against');
like(`dpkg-deb -f '$deb' Depends`, qr/\blibhiredis0\.14\b/,
     'and on libhiredis0.14');

$installed = 1;
ok(run_quiet(@apt, 'install', $deb), "apt-get install $deb");
like(pkg_status(), qr/install ok installed/, 'the package is installed');

ok(-f $so, "the module is in $so");
ok(-f $conf, "the load_module snippet is in $conf");
is(do { local (@ARGV, $/) = $conf; <> },
   "load_module modules/ngx_http_idempotency_module.so;\n",
   'the snippet loads the module from nginx\'s modules directory');
is(readlink($link), $conf, "$link links to it");

# nginx -t with a configuration of our own that takes the module in
# through the installed link (Debian's nginx.conf includes
# modules-enabled/*.conf the same way); its prefix stays nginx's, so
# "modules/" is /usr/share/nginx/modules -> /usr/lib/nginx/modules
my $tmp = tempdir(CLEANUP => 1);
my $http = <<"CONF";
events {}
http {
    access_log off;
    idempotency_redis 127.0.0.1:6379 prefix=idem:;
    server {
        listen 127.0.0.1:8080;
        location /v1/ {
            idempotency on;
            idempotency_scope \$http_authorization;
            proxy_pass http://127.0.0.1:9000;
        }
    }
}
CONF
open my $c, '>', "$tmp/nginx.conf" or die $!;
print $c "pid $tmp/nginx.pid;\nerror_log stderr;\ninclude $link;\n$http";
close $c;
ok(run_quiet($nginx, '-q', '-t', '-e', 'stderr', '-c', "$tmp/nginx.conf"),
   'nginx -t: a configuration using the module, loaded through the link');

# the package documents itself: README, the directive reference (and the
# other pages it links to), README.Debian on purging and rebuilding, and
# an example site that nginx accepts through the link
my $doc = "/usr/share/doc/$pkg";
ok(-f "$doc/README.md", "$doc/README.md is installed");
ok(-f "$doc/docs/directives.md", "  and docs/directives.md");
like(do { local (@ARGV, $/) = "$doc/docs/directives.md"; <> // '' },
     qr/^### idempotency_admin$/m, '  which documents every directive');
my $readme = do { local (@ARGV, $/) = "$doc/README.md"; <> // '' };
my @links = grep { m{^docs/} } $readme =~ /\]\(([^)#\s]+)(?:#[^)]*)?\)/g;
my @missing = grep { !-e "$doc/$_" } @links;
ok(@links >= 5 && !@missing, 'every docs/ page README.md links to is '
   . 'installed next to it (' . scalar(@links) . ' links)')
    or diag("missing: @missing");
my ($debian) = grep { -f } map { "$doc/README.Debian$_" } ('', '.gz');
ok($debian, "$doc/README.Debian is installed");
my $notes = $debian && $debian =~ /\.gz$/ ? `zcat '$debian'`
          : $debian ? do { local (@ARGV, $/) = $debian; <> } : '';
like($notes, qr/unknown directive/, '  it says to remove the directives '
     . 'before purging');
like($notes, qr/nginx-abi/, '  and to rebuild for a new nginx ABI');
# what operators load into Prometheus and Grafana, uncompressed, where
# docs/observability.md says
for my $f ('contrib/prometheus/nginx-idempotency-alerts.yml',
           'contrib/prometheus/nginx-idempotency-alerts.test.yml',
           'contrib/grafana/nginx-idempotency-dashboard.json')
{
    ok(-f "$doc/$f", "$doc/$f is installed");
}
like(do { local (@ARGV, $/) = "$doc/docs/observability.md"; <> // '' },
     qr{\Q$doc/contrib/\E}, '  where docs/observability.md says');
my $site = "$doc/examples/debian-site.conf";
ok(-f $site, "$site is installed");
open $c, '>', "$tmp/site.conf" or die $!;
print $c "pid $tmp/nginx.pid;\nerror_log stderr;\ninclude $link;\n"
         . "events {}\nhttp {\n    access_log off;\n    include $site;\n}\n";
close $c;
ok(run_quiet($nginx, '-q', '-t', '-e', 'stderr', '-c', "$tmp/site.conf"),
   'nginx -t accepts the example site');

# the same configuration without the link fails: the test above does
# depend on the installed module
open $c, '>', "$tmp/bare.conf" or die $!;
print $c "pid $tmp/nginx.pid;\nerror_log stderr;\n$http";
close $c;
like(`$nginx -q -t -e stderr -c $tmp/bare.conf 2>&1`,
     qr/unknown directive "idempotency_redis"/,
     'without the link nginx does not know the directives');

ok(run_quiet(@apt, 'purge', $pkg), "apt-get purge $pkg");
like(pkg_status(), qr/not-installed/, 'the package is gone');
ok(!-e $so, 'the module is gone');
ok(!-e $conf, 'the snippet is gone');
ok(!-e $doc, "$doc is gone");
ok(!-l $link && !-l "$link.removed", 'the modules-enabled link is gone');
is(snapshot(), $before,
   'modules-enabled, modules-available and the modules directory are as before');

done_testing();
