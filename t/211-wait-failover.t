# wait_replicas=1 across a master's death: no key runs twice.  A master, a
# replica that lags 200 ms behind it (its replication link goes through a
# t/lib/DelayProxy that holds the master's stream) and three sentinels
# (down-after 500 ms).  Lanes of clients claim new keys, three clients
# per key that retry until each has its answer, on two locations behind
# the same sentinels: /w with wait_replicas=1, /p without.  The master is
# SIGKILLed while they run; once the replica is promoted, the old master
# comes back empty and the sentinels make it the new master's replica, so
# that /w can be acknowledged again and its keys finish.  The upstream
# logs one EXEC line per execution: /w has no key twice, /p has some (the
# writes the replica had not received died with the master: the gap that
# wait_replicas= closes; without the kill neither location has any).
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
use RedisTopology;
use Roads ();
use WaitTest ();

WaitTest::plan_needs('redis-server', 'redis-cli');
plan skip_all => 'not under valgrind (the failover choreography)'
    if $ENV{TEST_NGINX_USE_VALGRIND};

my $Prefix = 't211:';
my $Name = 'mymaster';
# lanes per location, each one key after another (a /w key takes two
# acknowledgements, 2 x 200 ms: more lanes keep as many keys in flight)
my %Lanes = (w => 8, p => 4);
my $Lag = 0.2;          # seconds the replica lags behind

my $dir = Roads::tempdir('t211', 1);    # kept when a test fails

my $topo = RedisTopology->new(dir => $dir, name => $Name, down_after => 500,
                              replica_delay => $Lag);
unless ($topo->start) {
    my $why = $topo->error;
    $topo->stop;
    File::Path::remove_tree($dir);
    plan skip_all => "no Sentinel topology: $why";
}

my @lanes;
my $port = IdemTest::free_port();

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

my $s = join ' ', map { "127.0.0.1:$_" } @{ $topo->{sentinel_ports} };
Roads::start_nginx($dir, $port, WaitTest::http_conf($port, <<HTTP), 2);
        location = /w {
            idempotency on;
            idempotency_redis $s sentinel=$Name prefix=$Prefix
                              timeout=500ms connect_timeout=300ms
                              wait_replicas=1 wait_timeout=2s;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /p {
            idempotency on;
            idempotency_redis $s sentinel=$Name prefix=$Prefix
                              timeout=500ms connect_timeout=300ms;
            proxy_pass http://127.0.0.1:$port/backend;
        }
HTTP

ok(wait_for(15, sub { post('/w', 'warm-w') == 201
                      && post('/p', 'warm-p') == 201 }),
   'both locations run claims through the sentinels')
    or diag(WaitTest::tail("$dir/nginx/logs/error.log"));

my $master = $topo->{master_port};
my $replica = $topo->{replica_port};

# lanes of retrying clients on both locations, new keys until $stop_new

my $t0 = Time::HiRes::time();
my $stop_new = "$dir/stop-new";

for my $loc ('w', 'p') {
    for my $lane (1 .. $Lanes{$loc}) {
        push @lanes, lane($loc, $lane);
    }
}

Time::HiRes::sleep(2.5);

$topo->kill_server($master);
my $killed = Time::HiRes::time() - $t0;

# keys claimed in the last moments before the kill are what counts
Time::HiRes::sleep(0.5);
RedisTopology::write_file($stop_new, '');

ok(wait_for(20, sub { ($topo->master_port // '') eq $replica }),
   'the sentinels promote the replica')
    or diag($topo->sentinel('SENTINEL', 'master', $Name));

# the old master comes back empty: the sentinels make it a replica
$topo->spawn($master, "$dir/$master.conf")
    or BAIL_OUT('the old master did not start again');

ok(wait_for(20, sub {
       $topo->cli($master, 'INFO', 'replication')
           =~ /role:slave.*master_link_status:up/s }),
   'the old master is the new master\'s replica');

# every lane ends: each key's three clients got their answer (or 30 s)
for my $pid (@lanes) {
    waitpid($pid, 0);
}
@lanes = ();

my %count = %{ WaitTest::exec_counts($dir) };

for my $loc ('w', 'p') {
    my @keys = map { /^(\S+) (\d) (\d+)$/ ? [$1, $2, $3] : () }
               map { split /\n/, Roads::slurp("$dir/lane-$loc-$_") }
               1 .. $Lanes{$loc};
    my @twice = grep { ($count{$_->[0]} // 0) > 1 } @keys;
    my @open = grep { !$_->[1] } @keys;
    my $refused = 0;
    $refused += $_->[2] for @keys;

    diag(sprintf('/%s: %d keys, %d ran twice, %d not answered, %d answers '
                 . '503; master killed after %.1f s', $loc, scalar @keys,
                 scalar @twice, scalar @open, $refused, $killed));

    cmp_ok(scalar @keys, '>=', 10, "/$loc: keys were claimed");

    if ($loc eq 'w') {
        is(scalar @twice, 0, '/w (wait_replicas=1): no key ran twice')
            or diag(join ' ', map { $_->[0] } @twice);
        is(scalar @open, 0, '/w: every client got its answer');
        ok(!grep({ !$count{$_->[0]} } @keys), '/w: every key ran');

    } else {
        cmp_ok(scalar @twice, '>', 0, '/p (no wait_replicas): some keys '
               . 'ran twice, lost with the master (the test can fail)');
    }
}

like(Roads::slurp("$dir/nginx/logs/error.log"),
     qr/WAIT: 0 of 1 replicas acknowledged/,
     'while the new master had no replica, /w refused its claims');

stop_all();
WaitTest::done($dir);


# --- helpers -----------------------------------------------------------------

sub wait_for { Roads::wait_for(@_) }

# A lane: new keys "<loc>-<lane>-<i>" one after another until $stop_new
# exists, each sent by three clients at once, each client sending again
# (50 ms apart) until it has a 2xx answer; "<key> <1: all answered> <503s>"
# in lane-<loc>-<lane>.
sub lane {
    my ($loc, $lane) = @_;

    my $pid = fork();
    die "fork: $!" unless defined $pid;
    return $pid if $pid;

    $SIG{INT} = $SIG{TERM} = 'DEFAULT';
    open my $out, '>', "$dir/lane-$loc-$lane" or POSIX::_exit(1);
    $out->autoflush(1);

    for (my $i = 1; !-e $stop_new; $i++) {
        my $key = "$loc-$lane-$i";
        my $until = Time::HiRes::time() + 30;
        my @todo = (1, 2, 3);
        my $refused = 0;

        while (@todo && Time::HiRes::time() < $until) {
            my %s;
            for my $c (@todo) {
                $s{$c} = WaitTest::send_post($port, "/$loc", $key);
            }

            my @status = map {
                [$_, WaitTest::status_of(WaitTest::answer($s{$_}, 10))]
            } @todo;
            $refused += grep { $_->[1] == 503 } @status;
            @todo = map { $_->[0] } grep { $_->[1] !~ /^2/ } @status;
            Time::HiRes::sleep(0.05) if @todo;
        }

        print $out "$key " . (@todo ? 0 : 1) . " $refused\n";
    }

    close $out;
    POSIX::_exit(0);
}

sub post {
    my ($loc, $key) = @_;
    return WaitTest::post($port, $loc, $key)->{status};
}

sub stop_all {
    kill 'TERM', $_ for @lanes;
    waitpid($_, 0) for @lanes;
    @lanes = ();

    Roads::stop();
    $topo->stop if $topo;
}
