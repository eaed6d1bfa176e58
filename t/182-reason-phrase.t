# The status line of a 422 names its reason, "Unprocessable Entity", which
# nginx has no text for: in the module's own problem responses (MISMATCH,
# OVERSIZE) and when a stored upstream 422 is replayed.

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t182-$$-" . time() . ":";

our $HttpConfig = qq{
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
    idempotency_scope "test:\$http_authorization";
};

our $Config = q{
    location = /t {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /small {
        idempotency on;
        idempotency_max_response_size 4;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /invalid {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/unprocessable;
    }

    location = /backend {
        return 201 "created\n";
    }

    location = /unprocessable {
        return 422 "no such account\n";
    }
};

no_shuffle();
run_tests();

__DATA__

=== TEST 1: MISMATCH: 422 Unprocessable Entity
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request eval
["POST /t\nfirst", "POST /t\nsecond"]
--- more_headers
Idempotency-Key: reason-1
--- error_code eval
[201, 422]
--- raw_response_headers_like eval
[qr{^HTTP/1\.1 201 Created\r\n}, qr{^HTTP/1\.1 422 Unprocessable Entity\r\n}]



=== TEST 2: OVERSIZE: 422 Unprocessable Entity
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request eval
["POST /small\nx", "POST /small\nx"]
--- more_headers
Idempotency-Key: reason-2
--- error_code eval
[201, 422]
--- raw_response_headers_like eval
[qr{^HTTP/1\.1 201 }, qr{^HTTP/1\.1 422 Unprocessable Entity\r\n}]



=== TEST 3: a stored upstream 422 is replayed with the reason phrase
(the first answer has the upstream's status line: here an nginx without one)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request eval
["POST /invalid\nx", "POST /invalid\nx"]
--- more_headers
Idempotency-Key: reason-3
--- error_code eval
[422, 422]
--- response_headers eval
["X-Idempotency-Status: MISS", "X-Idempotency-Status: HIT"]
--- raw_response_headers_like eval
[qr{^HTTP/1\.1 422 }, qr{^HTTP/1\.1 422 Unprocessable Entity\r\n}]
--- response_body eval
["no such account\n", "no such account\n"]
