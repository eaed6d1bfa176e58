# wait_replicas=1 over TLS: the WAIT goes on the TLS connection that
# carried the writes.  A TLS-only master and its replica (replication over
# TLS too; plain ports for the test's redis-cli), certificates made here
# with openssl, one nginx: a claim runs and is replayed, the master counts
# WAITs; with the replica killed a claim is refused (503) and never
# reaches the upstream.  Skipped when openssl is missing or redis-server
# has no TLS.
#
# A plain Test::More file: every process is its own, stopped by its pid
# (nginx by t/lib/Roads).  Run from the repository root (prove does).

use strict;
use warnings;
use Test::More;
use File::Path ();
use POSIX ();
use Time::HiRes ();

use lib 't/lib';
use IdemTest ();
use RedisTopology ();
use Roads ();
use WaitTest ();

WaitTest::plan_needs('openssl', 'redis-server', 'redis-cli');

my $Prefix = 't213:';

# kept when a test fails; read by nginx workers that may not be root
my $dir = Roads::tempdir('t213', 1);

my (%pid, %plain, %tls);
my $port = IdemTest::free_port();

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

Roads::start_nginx($dir, $port, http_conf(), 1);

my $r1 = post('tls-1');
is($r1->{status}, 201, 'over TLS with wait_replicas=1: a claim runs')
    or diag(WaitTest::tail("$dir/nginx/logs/error.log"));
my $r2 = post('tls-1');
ok($r2->{status} == 201 && $r2->{replayed}, 'and is replayed');
my $waits = WaitTest::wait_calls(cli('master', 'INFO', 'commandstats'));
cmp_ok($waits, '>', 0, 'the master got WAITs over TLS');
ok(cli('replica', '--scan', '--pattern', "$Prefix*:tls-1") ne '',
   'the record is on the replica');

my $rpid = delete $pid{replica};
kill 'TERM', $rpid;
waitpid($rpid, 0);

is(post('tls-down')->{status}, 503,
   'with the replica gone a claim is refused (503)');
ok(!WaitTest::exec_counts($dir)->{'tls-down'},
   'and never reached the upstream');

stop_all();
WaitTest::done($dir);


# --- helpers -----------------------------------------------------------------

sub wait_for { Roads::wait_for(@_) }

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
    return WaitTest::post($port, '/t', $key);
}

sub http_conf {
    return WaitTest::http_conf($port, <<HTTP);
        location = /t {
            idempotency on;
            idempotency_redis 127.0.0.1:$tls{master} prefix=$Prefix tls
                              tls_trusted_certificate=$dir/ca.crt
                              wait_replicas=1 wait_timeout=300ms;
            proxy_pass http://127.0.0.1:$port/backend;
        }
HTTP
}

sub stop_all {
    Roads::stop();

    for my $name (keys %pid) {
        kill 'TERM', $pid{$name};
        waitpid($pid{$name}, 0);
    }
    %pid = ();
}
