# The replay cache's purges behind Sentinel, a Redis Cluster and a name
# the workers resolve ("resolve"): two nginx nodes share each Redis, each
# with its own cache zone; a key purged through one node's
# idempotency_admin is no longer replayed from the other node's cache.
# Each node's worker 0 listens where its own connection is (the master
# the sentinels name, any Cluster node, the address the name resolves to)
# and follows that connection when it moves: after SENTINEL FAILOVER and
# after the name moves to another server, both nodes listen at the new
# master and purges still reach them.
#
# A plain Test::More file with its own redis-servers, sentinels, Cluster,
# DNS server and two nginx, all on free loopback ports and stopped by pid.
# Run from the repository root (prove does).

use strict;
use warnings;
use Test::More;
use Digest::SHA ();
use File::Path ();
use File::Spec ();
use File::Temp ();

use lib 't/lib';
use IdemCluster ();
use IdemTest ();
use RedisTopology;
use Roads ();
use TinyDNS;

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'redis-server and redis-cli are needed'
    unless `sh -c 'command -v redis-server && command -v redis-cli'`
           =~ /redis-cli/;

my $Slow = $IdemTest::Slow;
my ($A, $B) = ('127.0.0.2', '127.0.0.3');

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t193-XXXXXX',
                                                   DIR => $base));
chmod 0755, $dir;

my (%redis, $topo, $cl, $dns);
my %prefix = (sentinel => 't193s:', cluster => 't193c:', named => 't193n:');
my $rport = IdemTest::free_port_on($A, $B);
my @port = (IdemTest::free_port(), IdemTest::free_port());

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

# --- the three Redis set-ups -------------------------------------------------

$topo = RedisTopology->new(dir => $dir, sentinel_password => 'sentinel-pw');
unless ($topo->start) {
    my $why = $topo->error;
    stop_all();
    plan skip_all => "no Sentinel topology: $why";
}

$cl = IdemCluster->start(3);
unless ($cl) {
    stop_all();
    plan skip_all => "no Redis Cluster: $IdemCluster::Error";
}

$dns = TinyDNS->new(dir => $dir, ttl => 1);
$dns->set('redis.test' => $A);

for my $ip ($A, $B) {
    $redis{$ip} = IdemTest::start_redis_on($ip, $rport, $dir) or do {
        stop_all();
        plan skip_all => "redis-server on $ip:$rport did not start";
    };
}

is(rcli($B, 'REPLICAOF', $A, $rport), 'OK', 'B replicates A');

Roads::start_nginx("$dir/n$_", $port[$_], http_conf($_)) for 0, 1;

# the locations of each Redis, the Redis servers a subscription may be at
my %where = (
    sentinel => sub { map { ['127.0.0.1', $_] }
                      $topo->{master_port}, $topo->{replica_port} },
    cluster  => sub { map { ['127.0.0.1', $cl->port($_)] } 0 .. 2 },
    named    => sub { map { [$_, $rport] } $A, $B },
);

for my $loc (qw(sentinel cluster named)) {
    ok(wait_for(30, sub { post(0, $loc, "warm-$loc") =~ /^201 / }),
       "$loc: node 1 works");
    ok(wait_for(30, sub { post(1, $loc, "warm-$loc") =~ /^201 / }),
       "$loc: node 2 works");
    ok(wait_for(20, sub { listeners($loc) >= 2 }),
       "$loc: both nodes listen for purges")
        or diag(join(', ', map { "$_->[0]:$_->[1] " . numsub(@$_, $loc) }
                               $where{$loc}->()));

    purged_everywhere($loc, "$loc-1");
}

# a Cluster key of each master: the purge is published where the key
# lives, the subscription may be on another node
{
    my @keys = map { first_key_of($_) } 0 .. 2;
    purged_everywhere('cluster', $_) for @keys;
}


# --- Sentinel: a failover moves the subscriptions -----------------------------

my $old = $topo->{master_port};
is($topo->sentinel('SENTINEL', 'FAILOVER', 'mymaster'), 'OK',
   'sentinel: SENTINEL FAILOVER accepted');

ok(wait_for(30, sub {
       my $m = $topo->master_port;
       $m && $m != $old && numsub('127.0.0.1', $m, 'sentinel') >= 2
   }), 'sentinel: after the failover both nodes listen at the new master')
    or diag(tail(0), tail(1));

ok(wait_for(30, sub {
       post(0, 'sentinel', 'after-failover-0') =~ /^201 /
       && post(1, 'sentinel', 'after-failover-1') =~ /^201 /
   }), 'sentinel: both nodes store on the new master');

ok(log_has(1, qr/the subscription to "t193s:purge" moves from 127\.0\.0\.1:$old to 127\.0\.0\.1:\d+/),
   'sentinel: the move is logged');

purged_everywhere('sentinel', 'sentinel-2');


# --- resolve: the name moves to another server --------------------------------

is(rcli($B, 'REPLICAOF', 'NO', 'ONE'), 'OK', 'B becomes a master');
is(rcli($A, 'REPLICAOF', $B, $rport), 'OK', 'A becomes a replica of B');
$dns->set('redis.test' => $B);

ok(wait_for(40, sub {
       numsub($B, $rport, 'named') >= 2 && numsub($A, $rport, 'named') == 0
   }), 'named: both nodes listen at B once the name resolves to it')
    or diag(tail(0), tail(1));

ok(wait_for(30, sub {
       my $k = 'moved-' . int(rand(1e9));
       post(0, 'named', $k) =~ /^201 / && post(1, 'named', $k) =~ /^201 /
   }), 'named: both nodes store on B');

# A, standalone again, no longer hears what is published on B
is(rcli($A, 'REPLICAOF', 'NO', 'ONE'), 'OK', 'A leaves B');

purged_everywhere('named', 'named-2');

for my $n (0, 1) {
    unlike(Roads::slurp(error_log($n)), qr/\[(?:alert|crit|emerg)\]/,
           "node " . ($n + 1) . ": no alert in the error log");
}

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


# --- helpers -------------------------------------------------------------

# $key stored through node 2 and cached there, purged through node 1:
# node 2 soon runs it again instead of replaying it from its cache
sub purged_everywhere {
    my ($loc, $key) = @_;

    is(post(1, $loc, $key), '201 MISS', "$loc: node 2 runs $key");
    is(post(1, $loc, $key), '201 HIT', "$loc: node 2 replays it from its cache");
    is(purge(0, $loc, $key), 204, "$loc: $key purged through node 1");
    ok(wait_for(5, sub { post(1, $loc, $key) eq '201 MISS' }),
       "$loc: node 2 heard the purge of $key")
        or diag(tail(1));
}

# a key whose Cluster slot is on master $i
sub first_key_of {
    my ($i) = @_;
    my $id = $cl->id($i);

    for my $n (1 .. 1000) {
        my $key = "slot-$i-$n";
        my $owner = $cl->owner(IdemTest::key_slot($prefix{cluster}
                                   . Digest::SHA::sha256_hex('test:')
                                   . ":$key"));
        return $key if defined $owner && $owner == $i;
    }

    die "no key for master $i\n";
}

# subscribers to the location's purge channel, summed over its servers
sub listeners {
    my ($loc) = @_;
    my $n = 0;
    $n += numsub(@$_, $loc) for $where{$loc}->();
    return $n;
}

sub numsub {
    my ($ip, $p, $loc) = @_;
    my $out = `redis-cli -h $ip -p $p PUBSUB NUMSUB $prefix{$loc}purge 2>/dev/null`;
    my (undef, $n) = split /\n/, $out;
    return $n // 0;
}

sub rcli {
    my ($ip, @args) = @_;
    my $out = `redis-cli -h $ip -p $rport @args 2>/dev/null`;
    chomp $out;
    return $out;
}

# one request to node $n, read to its end
sub http { IdemTest::exchange($port[$_[0]], $_[1]) }

# POST to node $n: "status cache" (the X-Idempotency-Cache value)
sub post {
    my ($n, $loc, $key) = @_;

    my $resp = http($n, "POST /$loc HTTP/1.1\r\nHost: localhost\r\n"
                        . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
                        . "Connection: close\r\n\r\nx");

    my ($status) = $resp =~ m{^HTTP/1\.\d (\d+)};
    my ($cache) = $resp =~ /^X-Idempotency-Cache: (\S+)/mi;

    return ($status // 0) . ' ' . ($cache // 'none');
}

sub purge {
    my ($n, $loc, $key) = @_;

    my $resp = http($n, "DELETE /admin-$loc?key=$key&scope=test: HTTP/1.1\r\n"
                        . "Host: localhost\r\nConnection: close\r\n\r\n");
    my ($status) = $resp =~ m{^HTTP/1\.\d (\d+)};

    return $status // 0;
}

sub error_log { "$dir/n$_[0]/nginx/logs/error.log" }

sub log_has {
    my ($n, $re) = @_;
    return wait_for(20, sub { Roads::slurp(error_log($n)) =~ $re });
}

sub wait_for { Roads::wait_for(@_) }

# node $n's http{}: a protected location and an admin one per Redis
sub http_conf {
    my ($n) = @_;

    my $s = join ' ', map { "127.0.0.1:$_" } @{ $topo->{sentinel_ports} };
    my %redis = (
        sentinel => "$s sentinel=mymaster sentinel_password=sentinel-pw",
        cluster  => "127.0.0.1:@{[ $cl->port(0) ]} cluster",
        named    => "redis.test:$rport resolve",
    );

    my $locations = '';

    for my $loc (sort keys %redis) {
        $locations .= <<LOC;
        location = /$loc {
            idempotency on;
            idempotency_redis $redis{$loc} prefix=$prefix{$loc}
                              timeout=500ms connect_timeout=300ms;
            idempotency_cache zone;
            add_header X-Idempotency-Cache \$idempotency_cache always;
            proxy_pass http://127.0.0.1:$port[$n]/backend;
        }

        location = /admin-$loc {
            idempotency_admin;
            idempotency_redis $redis{$loc} prefix=$prefix{$loc}
                              timeout=500ms connect_timeout=300ms;
        }

LOC
    }

    return <<HTTP;
    resolver 127.0.0.1:@{[ $dns->port ]} valid=1s ipv6=off;
    resolver_timeout 2s;

    idempotency_scope "test:\$http_authorization";
    idempotency_cache_zone zone:1m;

    server {
        listen 127.0.0.1:$port[$n];

$locations
        location = /backend {
            return 201 "ran \$request_id\\n";
        }
    }
HTTP
}

sub stop_all {
    Roads::stop();

    for my $ip (keys %redis) {
        my $pid = delete $redis{$ip};
        kill 'TERM', $pid;
        waitpid($pid, 0);
    }

    $topo->stop if $topo;
    $cl->stop if $cl;
    $dns->stop if $dns;
    undef $topo;
    undef $cl;
    undef $dns;
}

sub tail {
    my ($n) = @_;
    my @l = split /\n/, Roads::slurp(error_log($n));
    return "node " . ($n + 1) . ":\n"
           . join("\n", @l[($#l > 30 ? $#l - 30 : 0) .. $#l]) . "\n";
}

END {
    my $status = $?;
    stop_all();
    $? = $status;
}
