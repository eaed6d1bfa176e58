# docs/recipes.md, "Keys scoped by the JWT subject from auth_request": the
# variable set by auth_request_set is there when the module computes the
# scope, so the same subject with a refreshed token gets the replay and
# another subject with the same key runs its own request; a request the
# auth service refuses never reaches the store.

use Test::Nginx::Socket 'no_plan';

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t131-$$-" . time() . ":";

our $HttpConfig = q{
    log_format exec 'EXEC $request_method $uri $http_idempotency_key';
    idempotency_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT
                      prefix=$TEST_NGINX_PREFIX;
};

our $Config = q{
    location = /v1/orders {
        auth_request /_auth;
        auth_request_set $jwt_subject $upstream_http_x_subject;

        idempotency on;
        idempotency_required on;
        # per subject; no subject (empty): 400, never a shared scope
        idempotency_scope $jwt_subject;

        proxy_set_header X-Subject $jwt_subject;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /_auth {
        internal;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/verify;
        proxy_pass_request_body off;
        proxy_set_header Content-Length "";
    }

    # stand-in auth service: every token but "Bearer bad" is valid, for
    # the subject the test names in X-Test-Subject (no regex: under ASan
    # nginx's PCRE2 context counts as a leak)
    location = /verify {
        if ($http_authorization = "Bearer bad") {
            return 401;
        }
        add_header X-Subject $http_x_test_subject;
        return 204;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created for $http_x_subject\n";
    }
};

no_shuffle();
run_tests();

__DATA__

=== TEST 1: alice's first request runs
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /v1/orders
{"sku":"A1"}
--- more_headers
Idempotency-Key: jwt-1
Authorization: Bearer token-1
X-Test-Subject: alice
--- error_code: 201
--- response_body
created for alice
--- grep_error_log: EXEC POST /backend jwt-1
--- grep_error_log_out
EXEC POST /backend jwt-1



=== TEST 2: alice with a refreshed token gets the replay (same subject)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /v1/orders
{"sku":"A1"}
--- more_headers
Idempotency-Key: jwt-1
Authorization: Bearer token-2
X-Test-Subject: alice
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
created for alice
--- no_error_log
EXEC POST



=== TEST 3: bob with the same key runs his own request (other scope)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /v1/orders
{"sku":"A1"}
--- more_headers
Idempotency-Key: jwt-1
Authorization: Bearer token-3
X-Test-Subject: bob
--- error_code: 201
--- response_body
created for bob
--- grep_error_log: EXEC POST /backend jwt-1
--- grep_error_log_out
EXEC POST /backend jwt-1



=== TEST 4: a token the auth service refuses gets 401, never the replay
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /v1/orders
{"sku":"A1"}
--- more_headers
Idempotency-Key: jwt-1
Authorization: Bearer bad
X-Test-Subject: alice
--- error_code: 401
--- raw_response_headers_unlike: Idempotent-Replayed
--- no_error_log
EXEC POST



=== TEST 5: a subject the auth service leaves empty gets 400, never a shared scope
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /v1/orders
{"sku":"A1"}
--- more_headers
Idempotency-Key: jwt-1
Authorization: Bearer token-4
--- error_code: 400
--- response_body_like: "type":"urn:ngx-idempotency:missing-scope"
--- raw_response_headers_unlike: Idempotent-Replayed
--- no_error_log
EXEC POST
