# The core: claim, replay and record through Redis.
#
# The upstream is a location of the same server that writes one "EXEC" line
# into the error log each time it runs, so a block can assert whether the
# operation ran (grep_error_log) or did not (no_error_log).  Records persist
# in Redis from one block to the next; every run uses a fresh key prefix.

use Test::Nginx::Socket 'no_plan';

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t010-$$-" . time() . ":";

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

our $Config = q{
    location = /t {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        add_header X-Order 8812;
        add_header Set-Cookie session=abc;
        return 201 "created\n";
    }
};

no_shuffle();
run_tests();

__DATA__

=== TEST 1: the first request runs and is recorded
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
{"amount":100}
--- more_headers
Idempotency-Key: order-1
--- error_code: 201
--- response_headers
X-Order: 8812
X-Idempotency-Status: MISS
!Idempotent-Replayed
--- response_body
created
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend
--- no_error_log
[error]



=== TEST 2: a retry is replayed by nginx and the upstream does not run
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
{"amount":100}
--- more_headers
Idempotency-Key: order-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
X-Order: 8812
Content-Type: text/plain
Content-Length: 8
X-Idempotency-Status: HIT
!Set-Cookie
--- response_body
created
--- no_error_log
EXEC
[error]



=== TEST 3: the quoted form of the same key is the same record
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
{"amount":100}
--- more_headers
Idempotency-Key: "order-1"
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
created
--- no_error_log
EXEC



=== TEST 4: GET is not protected and always runs
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
GET /t
--- more_headers
Idempotency-Key: order-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
X-Idempotency-Status: BYPASS
--- grep_error_log: EXEC GET /backend
--- grep_error_log_out
EXEC GET /backend



=== TEST 5: PUT is not protected by default and always runs
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
PUT /t
{"amount":100}
--- more_headers
Idempotency-Key: order-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- grep_error_log: EXEC PUT /backend
--- grep_error_log_out
EXEC PUT /backend



=== TEST 6: a POST without a key passes through
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
{"amount":100}
--- error_code: 201
--- response_headers
!Idempotent-Replayed
X-Idempotency-Status: BYPASS
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 7: the same key with another body is a 422 mismatch
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
{"amount":999}
--- more_headers
Idempotency-Key: order-1
--- error_code: 422
--- response_headers
Content-Type: application/problem+json
X-Idempotency-Status: MISMATCH
--- response_body_like chomp
^\{"type":"[^"]+","title":"Idempotency-Key is already used","status":422,"detail":"[^"]+"\}$
--- no_error_log
EXEC



=== TEST 8: an invalid key is a 400 problem
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
{"amount":100}
--- more_headers
Idempotency-Key: "unterminated
--- error_code: 400
--- response_headers
Content-Type: application/problem+json
X-Idempotency-Status: INVALID
--- response_body_like chomp
"title":"Idempotency-Key is invalid"
--- no_error_log
EXEC



=== TEST 9: a key sent twice is a 400 problem
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
{"amount":100}
--- more_headers
Idempotency-Key: a
Idempotency-Key: b
--- error_code: 400
--- response_body_like chomp
"status":400
--- no_error_log
EXEC



=== TEST 10: a 5xx is not stored: first run
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log exec;
        return 500 "boom\n";
    }
--- request
POST /t
x
--- more_headers
Idempotency-Key: k5xx
--- error_code: 500
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 11: a 5xx is not stored: the retry runs again
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log exec;
        return 200 "second\n";
    }
--- request
POST /t
x
--- more_headers
Idempotency-Key: k5xx
--- response_headers
!Idempotent-Replayed
--- response_body
second
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 12: a 429 is not stored: first run
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log exec;
        return 429 "slow down\n";
    }
--- request
POST /t
x
--- more_headers
Idempotency-Key: k429
--- error_code: 429
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 13: a 429 is not stored: the retry runs again
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log exec;
        return 429 "slow down\n";
    }
--- request
POST /t
x
--- more_headers
Idempotency-Key: k429
--- error_code: 429
--- response_headers
!Idempotent-Replayed
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 14: a 4xx is stored: first run
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log exec;
        return 404 "no such account\n";
    }
--- request
POST /t
x
--- more_headers
Idempotency-Key: k404
--- error_code: 404
--- response_body
no such account
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 15: a 4xx is stored: the retry is replayed
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log exec;
        return 200 "must not run\n";
    }
--- request
POST /t
x
--- more_headers
Idempotency-Key: k404
--- error_code: 404
--- response_headers
Idempotent-Replayed: true
--- response_body
no such account
--- no_error_log
EXEC



=== TEST 16: a response over the size limit reaches the client in full
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        idempotency_max_response_size 10;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log exec;
        return 200 "0123456789abcdefghij\n";
    }
--- request
POST /t
x
--- more_headers
Idempotency-Key: kbig
--- response_body
0123456789abcdefghij
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 17: a retry of an over-size response never runs again: 422
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        idempotency_max_response_size 10;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log exec;
        return 200 "0123456789abcdefghij\n";
    }
--- request
POST /t
x
--- more_headers
Idempotency-Key: kbig
--- error_code: 422
--- response_headers
Content-Type: application/problem+json
--- response_body_like chomp
"title":"Response for this Idempotency-Key is not available"
--- no_error_log
EXEC



=== TEST 18: Redis unreachable, closed policy: 503 and nothing runs
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        idempotency_redis 127.0.0.1:1;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }
--- request
POST /t
x
--- more_headers
Idempotency-Key: kdown
--- error_code: 503
--- response_headers
Retry-After: 1
Content-Type: application/problem+json
X-Idempotency-Status: ERROR
--- response_body_like chomp
"status":503
--- no_error_log
EXEC



=== TEST 19: Redis unreachable, open policy: passes through and logs it
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        idempotency_redis 127.0.0.1:1;
        idempotency_on_store_error open;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }
--- request
POST /t
x
--- more_headers
Idempotency-Key: kdown
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- error_log
request passed through unprotected
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 20: idempotency off leaves a request untouched
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency off;
        add_header X-Idempotency-Status "[$idempotency_status]" always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }
--- request
POST /t
{"amount":100}
--- more_headers
Idempotency-Key: order-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
X-Idempotency-Status: []
--- response_body
created
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend
