# wait_replicas=, wait_aof, wait_timeout= (idempotency_redis): a claim and
# a stored record count only once a replica acknowledged them.  A master,
# a replica and three sentinels (t/lib/RedisTopology), one nginx with two
# workers and four locations: behind Sentinel, a single server (the
# master's address), the same by a name the workers resolve (resolve,
# t/lib/TinyDNS) and wait_aof.  Claims with the replica up are MISS,
# HIT (a replay sends no WAIT), and one WAIT acknowledges many of them
# (group commit); a store the replica does not acknowledge (SIGSTOP) is
# sent again until it does; a renewal it does not acknowledge is counted
# and leaves the claim in place; with the replica stopped a claim is refused
# (503) and never reaches the upstream;
# wait_aof with the AOF off (and, on Redis 7.2 or newer, on); the eviction
# policy warned about and shown.  nginx -t refuses bad option values.
#
# A plain Test::More file: every process is its own, stopped by its pid
# (nginx by t/lib/Roads, under valgrind with make test-valgrind).
# Run from the repository root (prove does).

use strict;
use warnings;
use Test::More;
use File::Path ();
use IO::Socket::INET ();

use lib 't/lib';
use IdemTest ();
use RedisTopology;
use DelayProxy ();
use Roads ();
use TinyDNS;
use WaitTest ();

WaitTest::plan_needs('redis-server', 'redis-cli');

my $Prefix = 't210:';
my $Name = 'mymaster';

my $dir = Roads::tempdir('t210', 1);    # kept when a test fails

my $topo;
my ($dns, $slow_pid, $slow, $long_pid, $long);
my $port = IdemTest::free_port();

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };


# --- nginx -t: the options' values -----------------------------------------

for my $case (['wait_replicas=0', qr/invalid option value "wait_replicas=0"/],
              ['wait_replicas=x', qr/invalid option value "wait_replicas=x"/],
              ['wait_replicas=17',
               qr/invalid option value "wait_replicas=17"/],
              ['wait_replicas=1 wait_timeout=0',
               qr/invalid option value "wait_timeout=0"/],
              ['wait_timeout=1s',
               qr/"wait_timeout=" needs "wait_replicas=" or "wait_aof"/])
{
    my ($opts, $re) = @$case;
    my $out = nginx_t("idempotency_redis 127.0.0.1:6379 $opts;");
    like($out, $re, "nginx -t refuses $opts");
}

like(nginx_t('idempotency_redis 127.0.0.1:6379 wait_replicas=2 wait_aof '
             . 'wait_timeout=250ms;'),
     qr/test is successful/, 'nginx -t takes wait_replicas=2 wait_aof '
     . 'wait_timeout=250ms');


# --- the topology ------------------------------------------------------------

$topo = RedisTopology->new(dir => $dir, name => $Name);
unless ($topo->start) {
    my $why = $topo->error;
    $topo->stop;
    File::Path::remove_tree($dir);
    done_testing();
    exit 0 if $why =~ /Sentinel/;
    BAIL_OUT("no topology: $why");
}

my $master = $topo->{master_port};
my $replica = $topo->{replica_port};

# the master by a name the workers resolve (resolve)
$dns = TinyDNS->new(dir => $dir, ttl => 1);
$dns->set('redis.test' => '127.0.0.1');

# the upstream 1 s away (/slow)
($slow_pid, $slow) = DelayProxy::start($port, 1);
# the upstream 4 s away (/long; 24 s under valgrind, where each step is slow)
my $Long = 4 * $IdemTest::Slow;
($long_pid, $long) = DelayProxy::start($port, $Long);

# a policy that may evict keys with a TTL (maxmemory 0: none is evicted)
$topo->cli($master, 'CONFIG', 'SET', 'maxmemory-policy', 'volatile-lru');

Roads::start_nginx($dir, $port, http_conf(), 2);

ok(wait_for(15, sub { post('/s', 'warm-s')->{status} == 201 }),
   'behind Sentinel with wait_replicas=1: a claim runs')
    or diag(WaitTest::tail("$dir/nginx/logs/error.log"));
ok(wait_for(10, sub { post('/d', 'warm-d')->{status} == 201 }),
   'a single server with wait_replicas=1: a claim runs')
    or diag(WaitTest::tail("$dir/nginx/logs/error.log"));
ok(wait_for(10, sub { post('/r', 'warm-r')->{status} == 201 }),
   'a name resolved by the workers (resolve) with wait_replicas=1: a '
   . 'claim runs')
    or diag(WaitTest::tail("$dir/nginx/logs/error.log"));


# --- the replica up: MISS, HIT, WAIT sent ---------------------------------

for my $loc ('/s', '/d', '/r') {
    my $r1 = post($loc, "k$loc");
    is($r1->{idem}, 'MISS', "$loc: a new key runs (MISS)");
    my $r2 = post($loc, "k$loc");
    is($r2->{idem}, 'HIT', "$loc: its retry is replayed (HIT)");
    is($r2->{body}, $r1->{body}, "$loc: with the same body");
    ok(record_on($replica, "k$loc"), "$loc: the record is on the replica");
}

my $waits0 = wait_calls();
cmp_ok($waits0, '>', 0, 'WAIT was sent to the master');

# 60 claims at once: one WAIT covers a batch of them
my $n = 60;
my %res = %{ concurrent('/s', 'many', $n) };
is(scalar(grep { $_ == 201 } values %res), $n, "$n concurrent claims run");
my $waits = wait_calls() - $waits0;
my $c = exec_counts();
is(scalar(grep { /^many-/ && $c->{$_} == 1 } keys %$c), $n,
   'each once at the upstream');
# each request writes twice (claim, store): one WAIT per write would be
# 2 * $n; one per batch, sent while the one before is on its way, is far
# fewer (13 on an idle machine), and fewer still under load
cmp_ok($waits, '<', $n,
       "fewer WAITs ($waits) than the $n claims alone, with their $n stores "
       . '(group commit)');

# a replay wrote nothing: no WAIT for it
my $before = wait_calls();
my $hits = grep { post('/s', "many-$_")->{idem} eq 'HIT' } 1 .. 20;
is($hits, 20, 'the keys are replayed (HIT)');
is(wait_calls() - $before, 0, 'and the replays sent no WAIT');

my $st = status();
like($st, qr/"waits": [1-9]/, 'status: waits counted');
like($st, qr/"waited": [1-9]/, 'status: writes that waited counted');
like($st, qr/"redis_wait_ms": \{"buckets": .*"count": [1-9]/,
     'status: the wait-time histogram');
like($st, qr/"maxmemory_policy": "volatile-lru"/,
     'status: the eviction policy of the connection');
like(Roads::slurp("$dir/nginx/logs/error.log"),
     qr/has maxmemory-policy volatile-lru: under memory pressure it may evict/,
     'the eviction policy is warned about at the handshake');


# --- a store the replica does not acknowledge is sent again -----------------

# the upstream answers 1 s late (a delaying proxy in front of it): the
# claim is acknowledged, then the replica stops before the store
my $sock = WaitTest::send_post($port, '/slow', 'resend-1');
ok(wait_for(5, sub { record_on($replica, 'resend-1') }),
   'a slow request\'s claim reaches the replica');
kill 'STOP', $topo->{pids}{$replica};
ok(wait_for(10, sub { status() =~ /"store_resent": [1-9]/ }),
   'its store, not acknowledged, is sent again (store_resent)');
kill 'CONT', $topo->{pids}{$replica};
my $resp = WaitTest::answer($sock, 15);
like($resp, qr{^HTTP/1\.1 201}, 'the client got its answer');
ok(wait_for(10, sub { post('/slow', 'resend-1')->{idem} eq 'HIT' }),
   'once the replica is back the record is stored: a retry is replayed');
ok(wait_for(5, sub {
       $topo->cli($replica, 'GET', record_key('resend-1')) =~ /^idem1 done /
   }), 'and the replica has it complete');
is(exec_counts()->{'resend-1'}, 1, 'the operation ran once');


# --- a renewal the replica does not acknowledge -----------------------------

# the upstream answers $Long s late, the lock TTL is 3 s: the claim is renewed
# every second; the replica stops once it has the claim, so a renewal is
# short of its acknowledgement.  The claim stays, the request goes on.
my $refused0 = short_count('claim_refused');
$sock = WaitTest::send_post($port, '/long', 'renew-1');
ok(wait_for(5, sub { record_on($replica, 'renew-1') }),
   'a long request\'s claim reaches the replica');
kill 'STOP', $topo->{pids}{$replica};
ok(wait_for(10, sub { short_count('claim_refused') > $refused0 }),
   'a renewal too few replicas acknowledged is counted (claim_refused)');
is(post('/long', 'renew-1')->{status}, 409,
   'a retry meanwhile gets 409: the claim was left in place');
kill 'CONT', $topo->{pids}{$replica};
like(WaitTest::answer($sock, 15 + $Long), qr{^HTTP/1\.1 201},
     'the long request got its answer');
ok(wait_for(10, sub { post('/long', 'renew-1')->{idem} eq 'HIT' }),
   'its record is stored: a retry is replayed');
is(exec_counts()->{'renew-1'}, 1, 'the operation ran once');


# --- the replica down: claims refused, nothing runs -------------------------

$topo->kill_server($replica);

for my $loc ('/s', '/d', '/r') {
    my $r = post($loc, "down$loc");
    is($r->{status}, 503, "$loc: with the replica down a claim is refused "
       . '(503)');
}

$c = exec_counts();
ok(!$c->{'down/s'} && !$c->{'down/d'} && !$c->{'down/r'},
   'and the refused claims never reached the upstream');

$st = status();
like($st, qr/"claim_refused": [1-9]/, 'status: claims refused counted');
like(Roads::slurp("$dir/nginx/logs/error.log"),
     qr/WAIT: 0 of 1 replicas acknowledged the writes within wait_timeout/,
     'the short acknowledgement is logged');
ok(wait_for(5, sub { !record_on($master, 'down/s') }),
   'the refused claim is released on the master');

my $r = post('/open', 'down-open');
is($r->{status}, 201, 'idempotency_on_store_error open: passed through');


# --- wait_aof ------------------------------------------------------------------

like(post('/aof', 'aof-off')->{status}, qr/^503$/,
     'wait_aof without AOF (or WAITAOF): refused (503)');
ok(!exec_counts()->{'aof-off'}, 'and not run');
like(Roads::slurp("$dir/nginx/logs/error.log"),
     qr/wait_aof cannot be used.*(?:no WAITAOF|AOF is off)/,
     'a clear error-log line at the handshake');

SKIP: {
    skip 'WAITAOF needs Redis 7.2 or newer', 2
        if IdemTest::redis_older(7, 2);

    $topo->cli($master, 'CONFIG', 'SET', 'appendonly', 'yes');
    ok(wait_for(15, sub { post('/aof', 'aof-on')->{status} == 201 }),
       'wait_aof with appendonly yes: a claim runs')
        or diag(WaitTest::tail("$dir/nginx/logs/error.log"));
    is(exec_counts()->{'aof-on'}, 1, 'once');
}

stop_all();
WaitTest::done($dir);


# --- helpers -----------------------------------------------------------------

sub wait_for { Roads::wait_for(@_) }

sub nginx_t {
    my ($directive) = @_;
    return (IdemTest::nginx_t_http(<<HTTP))[0];
    $directive
    server {
        listen 127.0.0.1:$port;
        location / { idempotency on; return 200; }
    }
HTTP
}

sub wait_calls {
    return WaitTest::wait_calls(
        $topo->cli($topo->master_port, 'INFO', 'commandstats'));
}

sub exec_counts { WaitTest::exec_counts($dir) }

sub record_key {
    my ($key) = @_;
    return $topo->cli($master, '--scan', '--pattern', "$Prefix*:$key");
}

sub record_on {
    my ($mport, $key) = @_;
    return $topo->cli($mport, '--scan', '--pattern', "$Prefix*:$key") ne '';
}

sub status {
    return IdemTest::exchange($port, "GET /status HTTP/1.0\r\n\r\n");
}

# a member of the status' redis_wait_short
sub short_count {
    my ($name) = @_;
    return status() =~ /"redis_wait_short": \{[^}]*"$name": (\d+)/ ? $1 : -1;
}

sub post {
    my ($loc, $key) = @_;
    return WaitTest::post($port, $loc, $key);
}

# $n requests with keys "$prefix-1" ... sent at once: key => status
sub concurrent {
    my ($loc, $prefix, $count) = @_;
    my (%sock, %out);

    for my $i (1 .. $count) {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                      PeerPort => $port, Timeout => 10)
            or next;
        $sock{"$prefix-$i"} = $s;
    }

    for my $k (keys %sock) {
        print { $sock{$k} } WaitTest::request($loc, $k);
    }

    for my $k (keys %sock) {
        $out{$k} = WaitTest::status_of(WaitTest::answer($sock{$k}, 10));
    }

    return \%out;
}

sub http_conf {
    my $s = join ' ', map { "127.0.0.1:$_" } @{ $topo->{sentinel_ports} };

    return WaitTest::http_conf($port, <<HTTP);
        location = /s {
            idempotency on;
            idempotency_redis $s sentinel=$Name prefix=$Prefix
                              timeout=1s connect_timeout=300ms
                              wait_replicas=1 wait_timeout=300ms;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /d {
            idempotency on;
            idempotency_redis 127.0.0.1:$master prefix=$Prefix
                              wait_replicas=1 wait_timeout=300ms;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /r {
            idempotency on;
            resolver 127.0.0.1:@{[ $dns->port ]} valid=1s;
            idempotency_redis redis.test:$master resolve prefix=$Prefix
                              wait_replicas=1 wait_timeout=300ms;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /open {
            idempotency on;
            idempotency_on_store_error open;
            idempotency_redis 127.0.0.1:$master prefix=$Prefix
                              wait_replicas=1 wait_timeout=300ms;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /aof {
            idempotency on;
            idempotency_redis 127.0.0.1:$master prefix=$Prefix wait_aof;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /slow {
            idempotency on;
            idempotency_redis $s sentinel=$Name prefix=$Prefix
                              timeout=1s connect_timeout=300ms
                              wait_replicas=1 wait_timeout=300ms;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$slow/backend;
        }

        location = /long {
            idempotency on;
            idempotency_lock_ttl 3s;
            idempotency_redis 127.0.0.1:$master prefix=$Prefix
                              timeout=1s wait_replicas=1
                              wait_timeout=300ms;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$long/backend;
        }

        location = /status {
            idempotency_status;
        }
HTTP
}

sub stop_all {
    Roads::stop();
    $topo->stop if $topo;
    $dns->stop if $dns;
    DelayProxy::stop($slow_pid) if $slow_pid;
    undef $slow_pid;
    DelayProxy::stop($long_pid) if $long_pid;
    undef $long_pid;
}
