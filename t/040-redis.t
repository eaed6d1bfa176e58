# Redis side: one key per record with the expected TTL, expiry, Redis going
# away and coming back without a reload, and nginx reloads with live
# connections.
#
# Under valgrind nginx runs without a master process, so the reload blocks
# are skipped there.  Blocks without a "--- config" reuse the nginx of the block before, so the
# same workers (and their Redis connections) see Redis die and return.
# Those blocks need `make test`'s Redis control script and are skipped
# without it.  The upstream logs the key it ran for, and a block that reuses
# nginx only counts lines of its own key: the error log is not cut between
# such blocks.

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use Digest::SHA ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t040-$$-" . time() . ":";


our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX} timeout=500ms;
};

our $Config = q{
    location = /t {
        idempotency on;
        idempotency_ttl 300s;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /short {
        idempotency on;
        idempotency_ttl 1s;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }
};



master_on();
no_shuffle();
run_tests();

__DATA__

=== TEST 1: a request is recorded (with a secret scope)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
{"amount":1}
--- more_headers
Idempotency-Key: layout-1
Authorization: Bearer SECRET-TOKEN-123
--- error_code: 201
--- grep_error_log: EXEC POST /backend layout-1
--- grep_error_log_out
EXEC POST /backend layout-1



=== TEST 2: redis-cli shows one string per record, with the TTL, no scope in clear
--- skip_eval: 10: !$ENV{TEST_NGINX_REDIS_CTL}
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
my @keys = split /\n/, main::redis_cli('--scan', '--pattern',
                                       "$ENV{TEST_NGINX_PREFIX}*");
Test::More::is(scalar @keys, 1, "one key for one record");
Test::More::like($keys[0] // '',
                 qr/^\Q$ENV{TEST_NGINX_PREFIX}\E[0-9a-f]{64}:layout-1$/,
                 "prefix, hashed scope, key");
my $ttl = main::redis_cli('TTL', $keys[0] // 'none');
Test::More::ok($ttl > 290 && $ttl <= 300, "TTL is idempotency_ttl ($ttl)");
Test::More::is(main::redis_cli('TYPE', $keys[0] // 'none'), 'string',
               "the record is one string");
my $all = main::redis_cli('GET', $keys[0] // 'none');
my $fp = Digest::SHA::sha256_hex("POST /t\n" . '{"amount":1}');
my $now = time();
Test::More::like($all,
    qr/^idem1 done \Q$fp\E [0-9a-f]{40} (\d+) 201\r\n/,
    "the record is complete: state, fingerprint, owner, created, status");
my ($created) = $all =~ /^idem1 \S+ \S+ \S+ (\d+) /;
Test::More::ok(defined $created && $created <= $now && $created > $now - 60,
               "created is the claim's Unix time");
Test::More::like($all,
    qr{ 201\r\n(?:[^\r\n]+\r\n)*Content-Type: [^\r\n]+\r\n(?:[^\r\n]+\r\n)*\r\ncreated\n?$},
    "then the header lines, an empty line and the body");
Test::More::unlike($all, qr/SECRET-TOKEN/, "the scope is not stored");
--- request
POST /t
{"amount":1}
--- more_headers
Idempotency-Key: layout-1
Authorization: Bearer SECRET-TOKEN-123
--- error_code: 201
--- response_headers
Idempotent-Replayed: true



=== TEST 3: another scope with the same key is another record: it runs
--- request
POST /t
{"amount":1}
--- more_headers
Idempotency-Key: layout-1
Authorization: Bearer OTHER-TOKEN
--- error_code: 201
--- response_headers
!Idempotent-Replayed



=== TEST 4: a short TTL: first run
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /short
x
--- more_headers
Idempotency-Key: ttl-1
--- error_code: 201
--- grep_error_log: EXEC POST /backend ttl-1
--- grep_error_log_out
EXEC POST /backend ttl-1



=== TEST 5: a short TTL: after it expires the operation runs again
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
select(undef, undef, undef, 1.3);
--- request
POST /short
x
--- more_headers
Idempotency-Key: ttl-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- grep_error_log: EXEC POST /backend ttl-1
--- grep_error_log_out
EXEC POST /backend ttl-1



=== TEST 6: a record of an older version (a Redis hash) is refused with 503, logged, left alone
--- skip_eval: 3: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
main::redis_cli('HSET', $ENV{TEST_NGINX_PREFIX} . Digest::SHA::sha256_hex('test:')
                        . ':old-1', 'state', 'done', 'status', '201');
--- request
POST /t
x
--- more_headers
Idempotency-Key: old-1
--- error_code: 503
--- error_log eval
qr/the record key_hash=${\ main::key_hash('old-1')} is not a Redis string/
--- no_error_log
EXEC POST /backend old-1



=== TEST 7: a string that is not a record of this format is refused with 503 and logged
--- skip_eval: 3: !$ENV{TEST_NGINX_REDIS_CTL}
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
main::redis_cli('SET', $ENV{TEST_NGINX_PREFIX} . Digest::SHA::sha256_hex('test:')
                       . ':garbage-1', 'idem1 done not-hex');
--- request
POST /t
x
--- more_headers
Idempotency-Key: garbage-1
--- error_code: 503
--- error_log eval
qr/the record key_hash=${\ main::key_hash('garbage-1')} is corrupt or not of this module/
--- no_error_log
EXEC POST /backend garbage-1



=== TEST 8: with idempotency_on_store_error open, a record of an older version lets the request through
--- skip_eval: 4: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        idempotency_on_store_error open;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
Test::More::is(main::redis_cli('TYPE', $ENV{TEST_NGINX_PREFIX}
                               . Digest::SHA::sha256_hex('test:') . ':old-1'),
               'hash', "the old record was left alone");
--- request
POST /t
x
--- more_headers
Idempotency-Key: old-1
--- error_code: 201
--- grep_error_log: EXEC POST /backend old-1
--- grep_error_log_out
EXEC POST /backend old-1



=== TEST 9: the workers talk to Redis
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
x
--- more_headers
Idempotency-Key: down-0
--- error_code: 201



=== TEST 10: Redis killed: requests get 503 and nothing runs
--- skip_eval: 2: !$ENV{TEST_NGINX_REDIS_CTL}
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
main::redis_ctl('kill');
select(undef, undef, undef, 0.2);
--- request
POST /t
x
--- more_headers
Idempotency-Key: down-1
--- error_code: 503
--- no_error_log
EXEC POST /backend down-1



=== TEST 11: Redis back: the same workers recover without a reload
--- skip_eval: 3: !$ENV{TEST_NGINX_REDIS_CTL}
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
main::redis_ctl('start');
select(undef, undef, undef, 2.5 * $main::Slow);
--- request
POST /t
x
--- more_headers
Idempotency-Key: down-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- grep_error_log: EXEC POST /backend down-1
--- grep_error_log_out
EXEC POST /backend down-1



=== TEST 12: nginx reloaded with live Redis connections keeps working
--- skip_eval: 2: $ENV{TEST_NGINX_USE_VALGRIND}
--- init
return if $ENV{TEST_NGINX_USE_VALGRIND};    # skipped (the real Test::Nginx runs init anyway)
my $pidfile = "$ENV{TEST_NGINX_SERVER_ROOT}/logs/nginx.pid";
open my $fh, '<', $pidfile or die "no $pidfile: $!";
my $pid = <$fh>;
chomp $pid;
kill 'HUP', $pid or die "cannot HUP $pid";
select(undef, undef, undef, 1.5 * $main::Slow);
--- request
POST /t
x
--- more_headers
Idempotency-Key: reload-1
--- error_code: 201
--- grep_error_log: EXEC POST /backend reload-1
--- grep_error_log_out
EXEC POST /backend reload-1



=== TEST 13: after the reload, replays work and the old workers left cleanly
--- skip_eval: 4: $ENV{TEST_NGINX_USE_VALGRIND}
--- request
POST /t
x
--- more_headers
Idempotency-Key: reload-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- wait eval: 1 * $::Slow
--- no_error_log
[alert]
[emerg]



=== TEST 14: the claim is Redis' own SET NX GET from Redis 7.0 on (and on Valkey), the claim script before
The worker's connection is through its handshake (its HELLO told the
server's version) before the request: Redis then counts one EVALSHA for
the store alone, or two (claim and store) on Redis 6.x, where the claim
is src/lua/claim.lua.
--- skip_eval: 3: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};
my $log = "$ENV{TEST_NGINX_SERVER_ROOT}/logs/error.log";
my $end = time() + 10 * $main::Slow;
until (time() > $end) {
    open my $fh, '<', $log or last;
    last if grep { /idempotency redis: "[^"]+" ready/ } <$fh>;
    select(undef, undef, undef, 0.05);
}
main::redis_cli('CONFIG', 'RESETSTAT');
--- request
POST /t
x
--- more_headers
Idempotency-Key: claim-kind-1
--- error_code: 201
--- grep_error_log: EXEC POST /backend claim-kind-1
--- grep_error_log_out
EXEC POST /backend claim-kind-1



=== TEST 15: ... and its retry is a replay
--- skip_eval: 3: !$ENV{TEST_NGINX_REDIS_CTL}
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};
my ($calls) = main::redis_cli('INFO', 'commandstats')
    =~ /^cmdstat_evalsha:calls=(\d+)/m;
Test::More::is($calls // 0, main::redis_older(7, 0) ? 2 : 1,
               'EVALSHA: the store, and the claim before Redis 7.0');
--- request
POST /t
x
--- more_headers
Idempotency-Key: claim-kind-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
