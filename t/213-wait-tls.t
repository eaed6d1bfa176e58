# wait_replicas=1 over TLS: the WAIT goes on the TLS connection that
# carried the writes.  A TLS-only master and its replica (replication over
# TLS too; plain ports for the test's redis-cli), certificates made here
# with openssl, one nginx: a claim runs and is replayed, the master counts
# WAITs; with the replica killed a claim is refused (503) and never
# reaches the upstream.  Skipped when openssl is missing or redis-server
# has no TLS.
#
# A plain Test::More file: every process is its own, stopped by its pid.
# Run from the repository root (prove does).

use strict;
use warnings;
use Test::More;
use File::Path ();
use File::Spec ();
use File::Temp ();
use IO::Socket::INET ();
use POSIX ();
use Time::HiRes ();

use lib 't/lib';
use IdemTest ();
use RedisTopology ();

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'openssl, redis-server and redis-cli are needed'
    unless `sh -c 'command -v openssl && command -v redis-server &&
                   command -v redis-cli'` =~ /redis-cli/;

my $Prefix = 't213:';
my $Nginx = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t213-XXXXXX',
                                                   DIR => $base));
chmod 0755, $dir;    # read by nginx workers that may not be root

my (%pid, %plain, %tls, $nginx_pid);
my $port = RedisTopology::free_port();

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

my $ec = '-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';
RedisTopology::write_file("$dir/san.ext", "subjectAltName=IP:127.0.0.1\n");
unless (ssl("req -x509 $ec -keyout $dir/ca.key -out $dir/ca.crt -days 2"
            . " -subj /CN=t213-ca")
        && ssl("req $ec -keyout $dir/server.key -out $dir/server.csr"
               . " -subj /CN=redis.test")
        && ssl("x509 -req -in $dir/server.csr -CA $dir/ca.crt"
               . " -CAkey $dir/ca.key -CAcreateserial -days 2"
               . " -extfile $dir/san.ext -out $dir/server.crt"))
{
    File::Path::remove_tree($dir);
    plan skip_all => 'openssl could not make the certificates';
}
chmod 0644, glob("$dir/*");

unless (redis('master') && redis('replica', '--replicaof', '127.0.0.1',
                                 $tls{master}))
{
    stop_all();
    File::Path::remove_tree($dir);
    plan skip_all => 'redis-server has no TLS';
}

ok(wait_for(20, sub { cli('replica', 'INFO', 'replication')
                      =~ /master_link_status:up/ }),
   'the replica follows the master over TLS');

start_nginx();

my $r1 = post('tls-1');
is($r1->{status}, 201, 'over TLS with wait_replicas=1: a claim runs')
    or diag(tail("$dir/nginx/logs/error.log"));
my $r2 = post('tls-1');
ok($r2->{status} == 201 && $r2->{replayed}, 'and is replayed');
my ($waits) = cli('master', 'INFO', 'commandstats')
              =~ /^cmdstat_wait:calls=(\d+)/m;
cmp_ok($waits // 0, '>', 0, 'the master got WAITs over TLS');
ok(cli('replica', '--scan', '--pattern', "$Prefix*:tls-1") ne '',
   'the record is on the replica');

my $rpid = delete $pid{replica};
kill 'TERM', $rpid;
waitpid($rpid, 0);

is(post('tls-down')->{status}, 503,
   'with the replica gone a claim is refused (503)');
ok(slurp("$dir/nginx/logs/exec.log") !~ /^EXEC tls-down$/m,
   'and never reached the upstream');

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


# --- helpers -----------------------------------------------------------------

sub ssl {
    return system("openssl @_ >>'$dir/openssl.log' 2>&1") == 0;
}

# a TLS redis-server (plain port for redis-cli), ours to stop
sub redis {
    my ($name, @args) = @_;
    $plain{$name} = RedisTopology::free_port();
    $tls{$name} = RedisTopology::free_port();

    my $pid = fork();
    die "fork: $!" unless defined $pid;

    if ($pid == 0) {
        open STDOUT, '>>', "$dir/$name.log";
        open STDERR, '>&', \*STDOUT;
        exec 'redis-server', '--bind', '127.0.0.1',
             '--port', $plain{$name}, '--tls-port', $tls{$name},
             '--save', '', '--appendonly', 'no', '--dir', $dir,
             '--dbfilename', "$name.rdb",
             '--tls-cert-file', "$dir/server.crt",
             '--tls-key-file', "$dir/server.key",
             '--tls-ca-cert-file', "$dir/ca.crt",
             '--tls-auth-clients', 'no', '--tls-replication', 'yes', @args
            or POSIX::_exit(127);
    }

    $pid{$name} = $pid;

    for (1 .. 200) {
        return 1 if RedisTopology::port_open($tls{$name});
        return 0 if waitpid($pid, POSIX::WNOHANG()) == $pid;
        Time::HiRes::sleep(0.05);
    }

    return 0;
}

sub cli {
    my ($name, @args) = @_;
    return RedisTopology::run_cli($plain{$name}, undef, @args);
}

sub post {
    my ($key) = @_;
    my $resp = IdemTest::exchange($port,
                 "POST /t HTTP/1.1\r\nHost: localhost\r\n"
                 . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
                 . "Connection: close\r\n\r\nx", 10);
    my ($status) = $resp =~ m{^HTTP/1\.\d (\d+)};
    return { status => $status // 0,
             replayed => $resp =~ /^Idempotent-Replayed: true/mi ? 1 : 0 };
}

sub wait_for {
    my ($seconds, $cond) = @_;
    my $until = Time::HiRes::time() + $seconds;

    while (Time::HiRes::time() < $until) {
        return 1 if $cond->();
        Time::HiRes::sleep(0.1);
    }

    return 0;
}

sub start_nginx {
    my $prefix = "$dir/nginx";
    File::Path::make_path("$prefix/conf", "$prefix/logs");

    RedisTopology::write_file("$prefix/conf/nginx.conf", <<CONF);
load_module $ENV{TEST_NGINX_LOAD_MODULES};
daemon off;
master_process on;
worker_processes 1;
error_log logs/error.log info;
pid logs/nginx.pid;

events {
    worker_connections 256;
}

http {
    access_log off;
    log_format exec 'EXEC \$http_idempotency_key';
    idempotency_scope "test:\$http_authorization";

    server {
        listen 127.0.0.1:$port;

        location = /t {
            idempotency on;
            idempotency_redis 127.0.0.1:$tls{master} prefix=$Prefix tls
                              tls_trusted_certificate=$dir/ca.crt
                              wait_replicas=1 wait_timeout=300ms;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /backend {
            access_log logs/exec.log exec;
            return 201 "ran \$request_id\\n";
        }
    }
}
CONF

    $nginx_pid = fork();
    die "fork: $!" unless defined $nginx_pid;

    if ($nginx_pid == 0) {
        open STDERR, '>>', "$prefix/logs/stderr.log";
        exec $Nginx, '-p', "$prefix/", '-c', 'conf/nginx.conf'
            or POSIX::_exit(127);
    }

    wait_for(10, sub { RedisTopology::port_open($port) })
        or BAIL_OUT('nginx did not start: ' . tail("$prefix/logs/stderr.log")
                    . tail("$prefix/logs/error.log"));
}

sub stop_all {
    if ($nginx_pid) {
        kill 'QUIT', $nginx_pid;

        for (1 .. 100) {
            last if waitpid($nginx_pid, POSIX::WNOHANG()) != 0;
            Time::HiRes::sleep(0.05);
            kill 'KILL', $nginx_pid if $_ == 100;
        }

        waitpid($nginx_pid, 0);
        undef $nginx_pid;
    }

    for my $name (keys %pid) {
        kill 'TERM', $pid{$name};
        waitpid($pid{$name}, 0);
    }
    %pid = ();
}

sub slurp {
    my ($path) = @_;
    open my $fh, '<', $path or return '';
    local $/;
    return <$fh>;
}

sub tail {
    my ($path) = @_;
    my @l = split /\n/, slurp($path);
    splice @l, 0, -30 if @l > 30;
    return join("\n", @l) . "\n";
}
