# Bodies: binary responses of any size are replayed byte for byte, and the
# fingerprint covers request bodies however nginx holds them.

use Test::Nginx::Socket 'no_plan';

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t030-$$-" . time() . ":";

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

# the upstream serves a static file; POST becomes GET on the way there
our $FileConfig = q{
    location /t/ {
        idempotency on;
        proxy_method GET;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/files/;
    }

    location /files/ {
        access_log logs/error.log exec;
        alias html/;
        default_type application/octet-stream;
    }
};

our $EchoConfig = q{
    client_body_buffer_size 1k;

    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "got $content_length bytes\n";
    }
};

# the same with proxy_request_buffering off: the module reads the body in
# full for its fingerprint before the upstream is chosen, so the upstream
# still gets it whole, with a Content-Length, and only once
(our $UnbufferedConfig = $EchoConfig) =~ s{(idempotency on;)}
    {$1\n        proxy_request_buffering off;\n        proxy_http_version 1.1;};

our $Binary = pack("C*", 0 .. 255) x 256;                 # 64 KiB, NULs
our $Big = join("", map { chr(($_ * 7) % 256) } 0 .. 102399);   # 100 KiB
our $MiB = pack("C*", reverse 0 .. 255) x 4096;           # 1 MiB

our $Spooled = "x" x 20000;

no_shuffle();
run_tests();

__DATA__

=== TEST 1: a binary body with NUL bytes: first run
--- http_config eval: $::HttpConfig
--- config eval: $::FileConfig
--- user_files eval
">>> bin.dat\n" . $::Binary
--- request
POST /t/bin.dat
x
--- more_headers
Idempotency-Key: bin-1
--- response_headers
Content-Type: application/octet-stream
--- response_body eval
$::Binary
--- grep_error_log: EXEC GET /files/bin.dat
--- grep_error_log_out
EXEC GET /files/bin.dat



=== TEST 2: a binary body with NUL bytes is replayed byte for byte
--- http_config eval: $::HttpConfig
--- config eval: $::FileConfig
--- request
POST /t/bin.dat
x
--- more_headers
Idempotency-Key: bin-1
--- response_headers
Idempotent-Replayed: true
Content-Type: application/octet-stream
Content-Length: 65536
--- response_body eval
$::Binary
--- no_error_log
EXEC
[error]



=== TEST 3: a 100 KiB body: first run
--- http_config eval: $::HttpConfig
--- config eval: $::FileConfig
--- user_files eval
">>> big.dat\n" . $::Big
--- request
POST /t/big.dat
x
--- more_headers
Idempotency-Key: big-1
--- response_body eval
$::Big
--- grep_error_log: EXEC GET /files/big.dat
--- grep_error_log_out
EXEC GET /files/big.dat



=== TEST 4: a 100 KiB body is replayed byte for byte
--- http_config eval: $::HttpConfig
--- config eval: $::FileConfig
--- request
POST /t/big.dat
x
--- more_headers
Idempotency-Key: big-1
--- response_headers
Idempotent-Replayed: true
Content-Length: 102400
--- response_body eval
$::Big
--- no_error_log
EXEC
[error]



=== TEST 5: a 1 MiB body (the default limit): first run
--- http_config eval: $::HttpConfig
--- config eval: $::FileConfig
--- user_files eval
">>> mib.dat\n" . $::MiB
--- request
POST /t/mib.dat
x
--- more_headers
Idempotency-Key: mib-1
--- response_body eval
$::MiB
--- grep_error_log: EXEC GET /files/mib.dat
--- grep_error_log_out
EXEC GET /files/mib.dat



=== TEST 6: a 1 MiB body is replayed byte for byte
--- http_config eval: $::HttpConfig
--- config eval: $::FileConfig
--- request
POST /t/mib.dat
x
--- more_headers
Idempotency-Key: mib-1
--- response_headers
Idempotent-Replayed: true
Content-Length: 1048576
--- response_body eval
$::MiB
--- no_error_log
EXEC
[error]



=== TEST 7: a request body spooled to a temporary file is fingerprinted
--- http_config eval: $::HttpConfig
--- config eval: $::EchoConfig
--- request eval
"POST /t\n" . $::Spooled
--- more_headers
Idempotency-Key: spool-1
--- error_code: 201
--- response_body
got 20000 bytes
--- error_log
a client request body is buffered to a temporary file
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 8: the same spooled body is a replay
--- http_config eval: $::HttpConfig
--- config eval: $::EchoConfig
--- request eval
"POST /t\n" . $::Spooled
--- more_headers
Idempotency-Key: spool-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- no_error_log
EXEC



=== TEST 9: a spooled body that differs in its last byte is a mismatch
--- http_config eval: $::HttpConfig
--- config eval: $::EchoConfig
--- request eval
"POST /t\n" . ("x" x 19999) . "y"
--- more_headers
Idempotency-Key: spool-1
--- error_code: 422
--- no_error_log
EXEC



=== TEST 10: a chunked request body fingerprints like the same bytes sent with a length
--- http_config eval: $::HttpConfig
--- config eval: $::EchoConfig
--- raw_request eval
"POST /t HTTP/1.1\r
Host: localhost\r
Connection: close\r
Idempotency-Key: spool-1\r
Transfer-Encoding: chunked\r
\r
2710\r
" . ("x" x 10000) . "\r
2710\r
" . ("x" x 10000) . "\r
0\r
\r
"
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
got 20000 bytes
--- no_error_log
EXEC



=== TEST 11: the URI is part of the fingerprint
--- http_config eval: $::HttpConfig
--- config eval: $::EchoConfig
--- request eval
"POST /t?again=1\n" . $::Spooled
--- more_headers
Idempotency-Key: spool-1
--- error_code: 422
--- no_error_log
EXEC



=== TEST 12: proxy_request_buffering off: a chunked body spooled to a file reaches the upstream whole, with its length
--- http_config eval: $::HttpConfig
--- config eval: $::UnbufferedConfig
--- raw_request eval
"POST /t HTTP/1.1\r
Host: localhost\r
Connection: close\r
Idempotency-Key: unbuffered-1\r
Transfer-Encoding: chunked\r
\r
2710\r
" . ("y" x 10000) . "\r
2710\r
" . ("y" x 10000) . "\r
0\r
\r
"
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- response_body
got 20000 bytes
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 13: proxy_request_buffering off: the same bytes with a length are a replay
--- http_config eval: $::HttpConfig
--- config eval: $::UnbufferedConfig
--- request eval
"POST /t\n" . ("y" x 20000)
--- more_headers
Idempotency-Key: unbuffered-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
got 20000 bytes
--- no_error_log
EXEC



=== TEST 14: proxy_request_buffering off: a body that differs in its last byte is a mismatch, the upstream not called
--- http_config eval: $::HttpConfig
--- config eval: $::UnbufferedConfig
--- request eval
"POST /t\n" . ("y" x 19999) . "z"
--- more_headers
Idempotency-Key: unbuffered-1
--- error_code: 422
--- no_error_log
EXEC
