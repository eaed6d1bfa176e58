# wait_replicas=1 on a Redis Cluster: each master's writes are
# acknowledged by a WAIT on that master's own connection.  Three masters
# with a replica each (t/lib/IdemCluster), one nginx: keys spread over the
# shards are MISS, then HIT, and every master got WAITs; with the replica
# of one master killed, the keys of that master's slots are refused (503)
# and never reach the upstream, while the other shards go on.  The status
# lists the worker's connection to each master with the master's eviction
# policy (one of them evicts: allkeys-lru), which the log warns about.
#
# A plain Test::More file: every process is its own, stopped by its pid
# (nginx by t/lib/Roads).  Run from the repository root (prove does).

use strict;
use warnings;
use Test::More;
use Digest::SHA ();

use lib 't/lib';
use IdemTest ();
use IdemCluster;
use Roads ();
use WaitTest ();

WaitTest::plan_needs();

my $Prefix = 't212:';

my $cl = IdemCluster->start(3)
    or plan skip_all => "no cluster: $IdemCluster::Error";

my @replica = map { $cl->add_replica($_) } 0 .. 2;
$cl->wait_ok(20) or BAIL_OUT('the cluster with replicas is not ok');

# master 1 may evict keys with a TTL: the status and the log say so
is($cl->cli(1, 'CONFIG', 'SET', 'maxmemory-policy', 'allkeys-lru'), 'OK',
   'master 1 evicts (allkeys-lru)');

my $dir = Roads::tempdir('t212', 1);    # kept when a test fails
my $port = IdemTest::free_port();

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

Roads::start_nginx($dir, $port, http_conf(), 1);

ok(wait_for(15, sub { (post('warm'))[0] == 201 }),
   'nginx claims a key on the cluster with wait_replicas=1')
    or diag(WaitTest::tail("$dir/nginx/logs/error.log"));

# keys on every master
my %on;     # master index => [keys]
for my $i (1 .. 300) {
    my $m = $cl->owner(IdemTest::key_slot(rkey("k$i")));
    push @{ $on{$m} }, "k$i" if defined $m && @{ $on{$m} // [] } < 3;
    last if keys %on == 3 && !grep { @{ $on{$_} } < 3 } keys %on;
}
is(scalar(keys %on), 3, 'keys found on the three masters');

my %waits0 = map { $_ => wait_calls($_) } 0 .. 2;

for my $m (sort keys %on) {
    for my $k (@{ $on{$m} }) {
        my ($s1) = post($k);
        my ($s2, $replayed) = post($k);
        ok($s1 == 201 && $s2 == 201 && $replayed,
           "master $m: $k runs, then is replayed");
    }
}

for my $m (0 .. 2) {
    cmp_ok(wait_calls($m) - $waits0{$m}, '>', 0,
           "master $m got WAITs for its own writes");
}

# each master's connection in the status, with its eviction policy
my $st = IdemTest::exchange($port, "GET /status HTTP/1.0\r\n\r\n");
for my $m (0 .. 2) {
    my $policy = $m == 1 ? 'allkeys-lru' : 'noeviction';
    my $p = $cl->port($m);
    like($st, qr/\{"pid": \d+, "redis": "127\.0\.0\.1:$p", "connection": "main", "ready": true[^}]*"maxmemory_policy": "$policy"\}/,
         "status: the connection to master $m, its policy $policy");
}
like(Roads::slurp("$dir/nginx/logs/error.log"),
     qr/"127\.0\.0\.1:@{[ $cl->port(1) ]}" has maxmemory-policy allkeys-lru: under memory pressure it may evict/,
     'the evicting master is warned about, by its address');

# the replica of master 0 dies: its shard refuses, the others go on

$cl->kill_node($replica[0]);

my (%new, %status);
for my $i (301 .. 2000) {
    my $m = $cl->owner(IdemTest::key_slot(rkey("n$i")));
    next unless defined $m && !$new{$m};
    $new{$m} = "n$i";
    last if keys %new == 3;
}

for my $m (sort keys %new) {
    ($status{$m}) = post($new{$m});
}

is($status{0}, 503, 'the key of the master without its replica is refused');
is($status{1}, 201, 'a key of another master runs');
is($status{2}, 201, 'and of the third');

my %count = %{ WaitTest::exec_counts($dir) };
ok(!$count{ $new{0} }, 'the refused key never reached the upstream');

stop_all();
WaitTest::done($dir);


# --- helpers -----------------------------------------------------------------

sub wait_for { Roads::wait_for(@_) }

sub rkey {
    return $Prefix . Digest::SHA::sha256_hex('test:') . ":$_[0]";
}

sub wait_calls {
    my ($m) = @_;
    return WaitTest::wait_calls($cl->cli($m, 'INFO', 'commandstats'));
}

sub post {
    my ($key) = @_;
    return IdemCluster::post('/t', $key, $port);
}

sub http_conf {
    my $seeds = $cl->seeds;

    return WaitTest::http_conf($port, <<HTTP);
        location = /t {
            idempotency on;
            idempotency_redis $seeds cluster prefix=$Prefix
                              wait_replicas=1 wait_timeout=300ms;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /status {
            idempotency_status;
        }
HTTP
}

sub stop_all {
    Roads::stop();
    $cl->stop if $cl;
}
