# The replay cache (idempotency_cache_zone, idempotency_cache): completed
# records kept in the node's shared memory and looked up before Redis.  A
# record stored by this node, or read from Redis by it, is replayed with
# Redis stopped; a different request with its key gets 422 from the cache;
# an entry goes when its record's TTL ends, when it is purged through
# idempotency_admin, and when a small zone needs room (least recently used
# first); a reload keeps the entries; the counters and $idempotency_cache
# say where a replay came from; nginx -t refuses a misuse.
#
# Each block primes the cache from "--- init" through the same nginx (the
# zone lives as long as that nginx), then asks.

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use Digest::SHA ();
use IO::Socket::INET ();
use JSON::PP ();
use Roads ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t190-$$-" . time() . ":";
our $Port2 = free_port();

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX}
                      timeout=${\ (500 * $Slow)}ms
                      connect_timeout=${\ (500 * $Slow)}ms;
    idempotency_cache_zone replays:1m;
    idempotency_cache_zone tiny:32k max_size=16k;

    # the same records (same Redis, scope and URI) without the cache
    server {
        listen 127.0.0.1:$Port2;
        location = /t {
            idempotency on;
            idempotency_scope test;
            # not "return" here: it would answer before the module runs
            proxy_pass http://127.0.0.1:$Port2/backend;
        }
        location = /backend {
            return 201 "created\n";
        }
    }
};

our $Config = q{
    location = /status {
        idempotency_status;
    }

    location = /admin {
        idempotency_admin;
    }

    location = /t {
        idempotency on;
        idempotency_scope test;
        idempotency_cache replays;
        add_header X-Idempotency-Status $idempotency_status always;
        add_header X-Idempotency-Cache $idempotency_cache always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /short {
        idempotency on;
        idempotency_scope test;
        idempotency_ttl 1s;
        idempotency_cache replays;
        add_header X-Idempotency-Cache $idempotency_cache always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /big {
        idempotency on;
        idempotency_scope test;
        idempotency_cache tiny;
        add_header X-Idempotency-Cache $idempotency_cache always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/big-backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }

    # about 3.5 KB, a page each: nine of them do not fit in the 32 KB zone
    location = /big-backend {
        access_log logs/error.log exec;
        return 201 "BIG";
    }
};

$Config =~ s/BIG/'b' x 3500/e;

# One request on its own connection, read to the end: (status, head, body).
our $Port;

sub http {
    my ($method, $uri, $headers, $body) = @_;
    my $sock = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1',
        PeerPort => $Port // $ENV{TEST_NGINX_SERVER_PORT},
        Timeout  => 10,
    ) or die "connect: $!";
    my $req = "$method $uri HTTP/1.1\r\nHost: localhost\r\n"
              . "Connection: close\r\n";
    $req .= "$_\r\n" for @{ $headers // [] };
    $req .= 'Content-Length: ' . length($body) . "\r\n" if defined $body;
    print $sock $req, "\r\n", $body // '';
    local $/;
    my $resp = <$sock> // '';
    close $sock;
    my ($head, $content) = split /\r\n\r\n/, $resp, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.[01] (\d{3})};
    return ($status // 0, $head // '', $content // '');
}

# POST with a key: "status cache" (the X-Idempotency-Cache value)
sub post {
    my ($uri, $key, $body) = @_;
    my ($status, $head) = http('POST', $uri, ["Idempotency-Key: $key"],
                               $body // 'x');
    my ($cache) = $head =~ /^X-Idempotency-Cache: (\S+)/mi;
    return "$status " . ($cache // 'none');
}

# The record of $key stored through the server without the cache, then
# replayed here from Redis: true when that replay was a Redis HIT (the
# cache missed)
sub from_redis {
    my ($key) = @_;
    {
        local $main::Port = $main::Port2;
        Test::More::is(post('/t', $key), '201 none', 'stored elsewhere');
    }
    my ($status, $head) = http('POST', '/t', ["Idempotency-Key: $key"], 'x');
    return $status == 201 && $head =~ /^X-Idempotency-Status: HIT\r?$/mi
           && $head =~ /^X-Idempotency-Cache: MISS\r?$/mi;
}

sub cache_json {
    my ($status, $head, $body) = http('GET', '/status?format=json');
    die "status: $status\n" unless $status == 200;
    return JSON::PP::decode_json($body)->{cache};
}

# A second node: another nginx with its own cache zone in front of the same
# Redis and prefix, listening on $Port3; returns its pid.
our $Port3 = free_port();

sub start_node2 {
    my $dir = Roads::tempdir('t190-node2');
    return Roads::start_nginx($dir, $Port3, <<HTTP);
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
    idempotency_cache_zone n2:1m;
    server {
        listen 127.0.0.1:$Port3;
        location = /t {
            idempotency on;
            idempotency_scope test;
            idempotency_cache n2;
            add_header X-Idempotency-Cache \$idempotency_cache always;
            proxy_pass http://127.0.0.1:$Port3/backend;
        }
        location = /backend {
            return 201 "created\n";
        }
    }
HTTP
}

# subscribers to the purge channel (every node's worker 0)
sub listeners {
    my $out = redis_cli('PUBSUB', 'NUMSUB', "$ENV{TEST_NGINX_PREFIX}purge");
    my (undef, $n) = split /\n/, $out;
    return $n // 0;
}

# waits up to $secs (scaled) for $cond
sub wait_until {
    my ($secs, $cond) = @_;
    for (1 .. $secs * 20 * $Slow) {
        return 1 if $cond->();
        select(undef, undef, undef, 0.05);
    }
    return 0;
}

# the replay's fetch of the record's TTL is a second round trip after it
sub settle { select(undef, undef, undef, 0.3 * $Slow) }

master_on();
workers(2);
no_shuffle();
run_tests();

__DATA__

=== TEST 1: a stored record is replayed from the cache, the same bytes and marker as from Redis
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
Test::More::is(main::post('/t', 'k1'), '201 MISS', 'the first request runs');
main::settle();
--- request
POST /t
x
--- more_headers
Idempotency-Key: k1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
X-Idempotency-Status: HIT
X-Idempotency-Cache: HIT
--- response_body
created
--- no_error_log
[error]



=== TEST 2: a record read from Redis enters the cache: first a Redis HIT, then a cache HIT
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
Test::More::ok(main::from_redis('k2'),
               'replayed from Redis, not from the cache');
main::settle();
--- request
POST /t
x
--- more_headers
Idempotency-Key: k2
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
X-Idempotency-Cache: HIT



=== TEST 3: another request with a cached key gets 422 from the cache
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
Test::More::is(main::post('/t', 'k3'), '201 MISS', 'the first request runs');
main::settle();
--- request
POST /t
different
--- more_headers
Idempotency-Key: k3
--- error_code: 422
--- response_headers
X-Idempotency-Status: MISMATCH
X-Idempotency-Cache: HIT



=== TEST 4: Redis stopped: a cached record is still replayed
--- skip_eval: 4: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
Test::More::is(main::post('/t', 'k4'), '201 MISS', 'the first request runs');
main::settle();
main::redis_ctl('kill');
select(undef, undef, undef, 0.3 * $main::Slow);
--- request
POST /t
x
--- more_headers
Idempotency-Key: k4
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
X-Idempotency-Cache: HIT



=== TEST 5: Redis stopped: a key the cache does not hold still gets 503
--- skip_eval: 2: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
x
--- more_headers
Idempotency-Key: k5
--- error_code: 503
--- response_headers
X-Idempotency-Cache: MISS



=== TEST 6: Redis is back for the blocks after
--- skip_eval: 1: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
main::redis_ctl('start');
select(undef, undef, undef, 2.5 * $main::Slow);
--- request
POST /t
x
--- more_headers
Idempotency-Key: k6
--- error_code: 201



=== TEST 7: Redis paused (CLIENT PAUSE): a cached record is replayed at once
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
Test::More::is(main::post('/t', 'k7'), '201 MISS', 'the first request runs');
main::settle();
main::redis_cli('CLIENT', 'PAUSE', 1000, 'ALL');
--- request
POST /t
x
--- more_headers
Idempotency-Key: k7
--- error_code: 201
--- response_headers
X-Idempotency-Cache: HIT
--- wait: 1



=== TEST 8: an entry goes when its record's TTL ends: the key runs again
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
# Redis answers again (a paused Redis answers when the pause ends)
main::redis_cli('PING');
Test::More::is(main::post('/short', 'k8'), '201 MISS', 'the first runs');
# (under valgrind the second request may come after the TTL already)
Test::More::is(main::post('/short', 'k8'), '201 HIT', 'then it is cached')
    unless $ENV{TEST_NGINX_USE_VALGRIND};
select(undef, undef, undef, 1.5);
--- request
POST /short
x
--- more_headers
Idempotency-Key: k8
--- error_code: 201
--- response_headers
!Idempotent-Replayed
X-Idempotency-Cache: MISS
--- error_log
EXEC POST /backend k8



=== TEST 9: a purge through idempotency_admin removes the entry at once
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
Test::More::is(main::post('/t', 'k9'), '201 MISS', 'the first request runs');
main::settle();
Test::More::is(main::post('/t', 'k9'), '201 HIT', 'cached');
my ($s) = main::http('DELETE', '/admin?key=k9&scope=test');
Test::More::is($s, 204, 'purged');
--- request
POST /t
x
--- more_headers
Idempotency-Key: k9
--- error_code: 201
--- response_headers
!Idempotent-Replayed
X-Idempotency-Cache: MISS



=== TEST 10: a full zone evicts the least recently used entry, counted
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
for my $k (map { "k10$_" } 'a' .. 'i') {
    Test::More::is(main::post('/big', $k), '201 MISS', "$k runs");
}
main::settle();
Test::More::cmp_ok(main::cache_json()->{evictions}, '>', 0, 'evictions');
Test::More::is(main::post('/big', 'k10i'), '201 HIT', 'the last one cached');
--- request
POST /big
x
--- more_headers
Idempotency-Key: k10a
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
X-Idempotency-Cache: MISS



=== TEST 11: the counters: hits, misses, entries and bytes
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::post('/t', 'k11');
main::settle();
main::post('/t', 'k11');
main::post('/t', 'k11');
my $c = main::cache_json();
Test::More::is($c->{hits}, 2, 'two hits');
Test::More::is($c->{misses}, 1, 'one miss');
Test::More::is($c->{entries}, 1, 'one entry');
Test::More::is($c->{evictions}, 0, 'no eviction');
# an entry's bytes: the record, its key, the node (104 bytes on 64-bit
# builds) and, for a record this node stored, the in-flight record the
# store replaced (its fence, about 140 bytes)
my $hash = Digest::SHA::sha256_hex('test');
my $rkey = "$ENV{TEST_NGINX_PREFIX}$hash:k11";
chomp(my $len = main::redis_cli('STRLEN', $rkey));
Test::More::cmp_ok($len, '>', 100, 'the record in Redis');
my $fence = $c->{bytes} - (104 + length($rkey) + $len);
Test::More::ok($fence > 100 && $fence < 200,
               "stored here: record, key, node and fence ($fence)");
# a record read from Redis has no fence: its bytes are exact
Test::More::ok(main::from_redis('k11b'), 'replayed from Redis');
main::settle();
my $rkey2 = "$ENV{TEST_NGINX_PREFIX}$hash:k11b";
chomp(my $len2 = main::redis_cli('STRLEN', $rkey2));
my $c2 = main::cache_json();
Test::More::is($c2->{entries}, 2, 'two entries');
Test::More::is($c2->{bytes} - $c->{bytes}, 104 + length($rkey2) + $len2,
               'read from Redis: record, key and node');
--- request
GET /status?format=prometheus
--- error_code: 200
--- response_body_like eval
qr/# TYPE nginx_idempotency_cache_entries gauge\nnginx_idempotency_cache_entries 2\n/



=== TEST 12: a reload keeps the entries
--- skip_eval: 3: $ENV{TEST_NGINX_USE_VALGRIND}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if $ENV{TEST_NGINX_USE_VALGRIND};    # skipped (the real Test::Nginx runs init anyway)
Test::More::is(main::post('/t', 'k12'), '201 MISS', 'the first request runs');
main::settle();
open my $fh, '<', "$ENV{TEST_NGINX_SERVER_ROOT}/logs/nginx.pid" or die $!;
chomp(my $pid = <$fh>);
kill 'HUP', $pid or die "cannot HUP $pid";
select(undef, undef, undef, 1.5);
--- request
POST /t
x
--- more_headers
Idempotency-Key: k12
--- error_code: 201
--- response_headers
X-Idempotency-Cache: HIT



=== TEST 13: a purge on one node reaches the cache of another node sharing the Redis
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
my $pid = main::start_node2();
Test::More::ok(main::wait_until(10, sub { main::listeners() >= 2 }),
               'both nodes listen for purges');
{
    local $main::Port = $main::Port3;
    Test::More::is(main::post('/t', 'k13'), '201 MISS', 'node 2 runs it');
    Test::More::is(main::post('/t', 'k13'), '201 HIT', 'node 2 cached it');
}
my ($s) = main::http('DELETE', '/admin?key=k13&scope=test');
Test::More::is($s, 204, 'purged through node 1');
{
    local $main::Port = $main::Port3;
    Test::More::ok(main::wait_until(5, sub {
                       main::post('/t', 'k13') eq '201 MISS' }),
                   'node 2 no longer replays it from its cache');
}
Roads::stop($pid);
--- request
GET /status
--- error_code: 200



=== TEST 14a: a seventeenth idempotency_cache_zone is refused (a worker walks at most 16)
--- http_config
    idempotency_cache_zone z0:1m;
    idempotency_cache_zone z1:1m;
    idempotency_cache_zone z2:1m;
    idempotency_cache_zone z3:1m;
    idempotency_cache_zone z4:1m;
    idempotency_cache_zone z5:1m;
    idempotency_cache_zone z6:1m;
    idempotency_cache_zone z7:1m;
    idempotency_cache_zone z8:1m;
    idempotency_cache_zone z9:1m;
    idempotency_cache_zone z10:1m;
    idempotency_cache_zone z11:1m;
    idempotency_cache_zone z12:1m;
    idempotency_cache_zone z13:1m;
    idempotency_cache_zone z14:1m;
    idempotency_cache_zone z15:1m;
    idempotency_cache_zone z16:1m;
--- config
--- must_die
--- error_log
at most 16 "idempotency_cache_zone" zones



=== TEST 14: idempotency_cache of a zone never declared: the error names the directive and its place
--- config
    location = /t {
        idempotency_cache nowhere;
    }
--- must_die
--- error_log eval
qr/"idempotency_cache" directive: zone "nowhere" is not declared by "idempotency_cache_zone" in the http block in \S+nginx\.conf:\d+$/



=== TEST 15: a zone too small
--- http_config
    idempotency_cache_zone small:16k;
--- config
--- must_die
--- error_log eval
qr/"idempotency_cache_zone" directive: zone "small" is too small: 16384 bytes, at least \d+ in \S+nginx\.conf:\d+$/



=== TEST 16: max_size above half the zone: the message says what to write
--- http_config
    idempotency_cache_zone z:64k max_size=64k;
--- config
--- must_die
--- error_log eval
qr/"idempotency_cache_zone" directive: max_size of zone "z" must be at most half its size: max_size=32768 or less for 65536 bytes in \S+nginx\.conf:\d+$/



=== TEST 16a: without max_size a small zone is valid: the default is half the zone below 512k
--- http_config
    idempotency_cache_zone z:256k;
    idempotency_cache_zone small:32k;
--- config
    location = /t {
        idempotency_cache z;
        return 200 "ok\n";
    }
--- request
GET /t
--- response_body
ok



=== TEST 17: a body that comes after the headers, in a later packet: the replay still comes from the cache
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
Test::More::is(main::post('/t', 'k17', 'late body'), '201 MISS',
               'the first request runs');
main::settle();
--- request eval
[["POST /t\n", {value => "late body", delay_before => 0.2}]]
--- more_headers
Idempotency-Key: k17
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
X-Idempotency-Status: HIT
X-Idempotency-Cache: HIT
--- response_body
created
--- no_error_log
[error]



=== TEST 18: a late body that differs gets 422 from the cache; HTTP/1.0 gets the replay too
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
Test::More::is(main::post('/t', 'k18', 'first'), '201 MISS',
               'the first request runs');
main::settle();
--- request eval
[["POST /t\n", {value => "other", delay_before => 0.2}],
 "POST /t HTTP/1.0\nfirst"]
--- more_headers
Idempotency-Key: k18
--- error_code eval
[422, 201]
--- response_headers eval
["X-Idempotency-Cache: HIT", "X-Idempotency-Cache: HIT"]
