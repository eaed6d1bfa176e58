# wait_replicas= on a single server: Redis reads nothing more of a
# connection whose WAIT waits for its replicas, so the module's two
# connections to the server take turns.  While a WAIT holds the first
# (the replica stopped with SIGSTOP, wait_timeout=10s), a replay (HIT) and
# a new claim are answered on the other one; they do not wait for that
# WAIT's end.  Without the turns both would come back only once the WAIT
# gave up, after the held request's 503.
#
# One worker (the held WAIT and the requests after it share it); a master
# and a replica of the test's own, stopped by their pids.  A plain
# Test::More file, run from the repository root (prove does).

use strict;
use warnings;
use Test::More;

use lib 't/lib';
use IdemTest ();
use Roads ();
use WaitTest ();

WaitTest::plan_needs('redis-server', 'redis-cli');

my $Prefix = 't214:';
my $dir = Roads::tempdir('t214', 1);    # kept when a test fails
my $port = IdemTest::free_port();
my $master = IdemTest::free_port();
my $replica = IdemTest::free_port();
my ($mpid, $rpid);

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

$mpid = IdemTest::start_redis_on('127.0.0.1', $master, $dir)
    or BAIL_OUT('the master did not start');

$rpid = Roads::spawn(sub {
    open STDOUT, '>>', "$dir/replica.out" or POSIX::_exit(127);
    open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
    exec 'redis-server', '--bind', '127.0.0.1', '--port', $replica,
         '--save', '', '--appendonly', 'no', '--dir', $dir,
         '--dbfilename', 'replica.rdb',
         '--replicaof', '127.0.0.1', $master
        or POSIX::_exit(127);
});

ok(wait_for(15, sub {
       cli($replica, 'INFO', 'replication') =~ /master_link_status:up/
   }), 'the replica follows the master');

Roads::start_nginx($dir, $port, WaitTest::http_conf($port, <<LOC), 1);
        location = /t {
            idempotency on;
            idempotency_redis 127.0.0.1:$master prefix=$Prefix
                              wait_replicas=1 wait_timeout=10s;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /status {
            idempotency_status;
        }
LOC

ok(wait_for(15, sub { post('warm')->{status} == 201 }),
   'with the replica up a claim runs')
    or diag(WaitTest::tail("$dir/nginx/logs/error.log"));

my $first = post('stored');
is($first->{idem}, 'MISS', 'a key is run and stored (MISS)');

ok(wait_for(10, sub {
       scalar(() = status() =~ /"127\.0\.0\.1:$master"/g) >= 2
   }), 'the worker has its two connections to the server')
    or diag(status());


# --- a WAIT holds the first connection ---------------------------------------

kill 'STOP', $rpid;

my $held = WaitTest::send_post($port, '/t', 'held');
ok(wait_for(10, sub { blocked_waits() >= 1 }),
   'a new claim\'s WAIT waits on the master (the replica is stopped)')
    or diag(cli($master, 'CLIENT', 'LIST'));

my $hit = post('stored');
is($hit->{idem}, 'HIT', 'meanwhile a retry of the stored key is replayed');
is($hit->{body}, $first->{body}, 'with the stored body');
cmp_ok(blocked_waits(), '>=', 1,
       'while that WAIT still waits: the replay did not queue behind it');
ok(!readable($held), 'and the held request is still unanswered');

my $other = WaitTest::send_post($port, '/t', 'other');
ok(wait_for(10, sub {
       cli($master, '--scan', '--pattern', "$Prefix*:other") ne ''
   }), 'a claim of another key reaches the master meanwhile');
cmp_ok(blocked_waits(), '>=', 1, 'the first WAIT still waiting then');

kill 'CONT', $rpid;

like(WaitTest::answer($held, 15), qr{^HTTP/1\.1 201},
     'the replica back, the held request is answered');
like(WaitTest::answer($other, 15), qr{^HTTP/1\.1 201},
     'and so is the other one');

my $c = WaitTest::exec_counts($dir);
is($c->{stored}, 1, 'the stored key ran once');
is($c->{held}, 1, 'the held one once');
is($c->{other}, 1, 'the other one once');

stop_all();
WaitTest::done($dir);


# --- helpers -----------------------------------------------------------------

sub wait_for { Roads::wait_for(@_) }

sub cli {
    my ($p, @args) = @_;
    return '' unless Roads::port_open($p);
    open(my $fh, '-|', 'redis-cli', '-p', $p, @args) or return '';
    local $/;
    my $out = <$fh> // '';
    close $fh;
    return $out;
}

# the master's clients blocked in a WAIT
sub blocked_waits {
    return scalar grep { /\bflags=\S*b/ && /\bcmd=wait\b/ }
                       split /\n/, cli($master, 'CLIENT', 'LIST');
}

sub readable {
    my ($s) = @_;
    return 1 unless $s;
    my $rin = '';
    vec($rin, fileno($s), 1) = 1;
    return select($rin, undef, undef, 0) > 0;
}

sub status {
    return IdemTest::exchange($port, "GET /status HTTP/1.0\r\n\r\n");
}

sub post {
    my ($key) = @_;
    return WaitTest::post($port, '/t', $key);
}

sub stop_all {
    kill 'CONT', $rpid if $rpid;
    Roads::stop();
    if ($mpid) {
        kill 'TERM', $mpid;
        waitpid($mpid, 0);
        $mpid = undef;
    }
}
