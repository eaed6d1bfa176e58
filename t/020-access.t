# Access checks come first, and a claim survives internal redirects.
#
# A stored response is never served to a request that allow/deny,
# auth_request or satisfy refuse; error_page releases the claim; the final
# response of an X-Accel-Redirect is what gets stored.

use Test::Nginx::Socket 'no_plan';

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t020-$$-" . time() . ":";

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

our $AuthConfig = q{
    location = /t {
        idempotency on;
        auth_request /auth;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /auth {
        internal;
        if ($http_x_allow = "yes") {
            return 204;
        }
        return 403;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }
};

our $SatisfyConfig = q{
    location = /t {
        idempotency on;
        satisfy any;
        deny all;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }
};

our $ErrorPageConfig = q{
    location = /t {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:1/;
        error_page 502 = @fallback;
    }

    location @fallback {
        return 200 "fallback\n";
    }
};

our $AccelConfig = q{
    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        add_header X-Accel-Redirect /final;
        return 200 "";
    }

    location = /final {
        internal;
        return 201 "accel final\n";
    }
};

no_shuffle();
run_tests();

__DATA__

=== TEST 1: an allowed request runs and is recorded
--- http_config eval: $::HttpConfig
--- config eval: $::AuthConfig
--- request
POST /t
{"amount":5}
--- more_headers
Idempotency-Key: acc-1
X-Allow: yes
--- error_code: 201
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 2: auth_request denial is not bypassed by the stored response
--- http_config eval: $::HttpConfig
--- config eval: $::AuthConfig
--- request
POST /t
{"amount":5}
--- more_headers
Idempotency-Key: acc-1
X-Allow: no
--- error_code: 403
--- response_headers
!Idempotent-Replayed
--- no_error_log
EXEC



=== TEST 3: the allowed retry gets the replay
--- http_config eval: $::HttpConfig
--- config eval: $::AuthConfig
--- request
POST /t
{"amount":5}
--- more_headers
Idempotency-Key: acc-1
X-Allow: yes
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
created
--- no_error_log
EXEC



=== TEST 4: satisfy any with deny all is not bypassed by a stored response
--- http_config eval: $::HttpConfig
--- config eval: $::SatisfyConfig
--- request
POST /t
{"amount":5}
--- more_headers
Idempotency-Key: acc-1
--- error_code: 403
--- response_headers
!Idempotent-Replayed
--- no_error_log
EXEC



=== TEST 5: under satisfy any the module never grants access
--- http_config eval: $::HttpConfig
--- config eval: $::SatisfyConfig
--- request
POST /t
{"amount":5}
--- more_headers
Idempotency-Key: acc-new
--- error_code: 403
--- no_error_log
EXEC



=== TEST 6: error_page after an upstream 502 answers the fallback
--- http_config eval: $::HttpConfig
--- config eval: $::ErrorPageConfig
--- request
POST /t
x
--- more_headers
Idempotency-Key: ep-1
--- error_code: 200
--- response_body
fallback
--- error_log
idempotency release



=== TEST 7: error_page released the claim: the retry runs again
--- http_config eval: $::HttpConfig
--- config eval: $::ErrorPageConfig
--- request
POST /t
x
--- more_headers
Idempotency-Key: ep-1
--- error_code: 200
--- response_headers
!Idempotent-Replayed
--- response_body
fallback
--- error_log
idempotency release



=== TEST 8: the final response of an X-Accel-Redirect is recorded
--- http_config eval: $::HttpConfig
--- config eval: $::AccelConfig
--- request
POST /t
x
--- more_headers
Idempotency-Key: accel-1
--- error_code: 201
--- response_body
accel final
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 9: and replayed without running the upstream again
--- http_config eval: $::HttpConfig
--- config eval: $::AccelConfig
--- request
POST /t
x
--- more_headers
Idempotency-Key: accel-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
accel final
--- no_error_log
EXEC
