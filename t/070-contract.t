# The contract, item by item: key syntax (exact bytes), scope, problem
# responses, what a replay carries, the status policy, headers that cannot
# be passed, and a client that goes away under proxy_ignore_client_abort.
#
# As in the other suites, the upstream is a location of the same server
# whose access_log writes an "EXEC" line into the error log, so a block
# asserts whether the operation ran.  Records persist in Redis from block to
# block (a fresh key prefix per run); blocks that belong together use the
# same key and follow each other.  Every block has its own "--- config", so
# the log checks see only that block's lines.

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use IO::Socket::INET;
use IO::Compress::Gzip qw(gzip $GzipError);
use POSIX ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t070-$$-" . time() . ":";

our $Rate = int(80 / $Slow);
$ENV{TEST_NGINX_RATE} = $Rate;
$ENV{TEST_NGINX_RATE_BIG} = int(8000 / $Slow);

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri tenant=\$http_x_tenant';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

# ------------------------------------------------------------ 1. key syntax

our $KeyConfig = q{
    location = /k {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        add_header X-Idempotency-Key "[$idempotency_key]" always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /k300 {
        idempotency on;
        idempotency_key_max_length 300;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }
};

# A raw POST with a one-byte body and exactly the given header lines: the
# key bytes reach nginx as written, nothing normalises them.
sub raw_post {
    my ($uri, @lines) = @_;
    return "POST $uri HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
           . join('', map { "$_\r\n" } @lines)
           . "Content-Length: 1\r\n\r\nx";
}

# a key of exactly $len characters that starts with $tag
sub key_of {
    my ($tag, $len) = @_;
    return $tag . ('k' x ($len - length $tag));
}

# 255 characters once decoded, 5 of them '"' and 5 '\': 267 on the wire
our $Decoded255 = 'esc255-' . ('"\\' x 5);
$Decoded255 .= 'q' x (255 - length $Decoded255);
(our $Quoted255 = $Decoded255) =~ s/(["\\])/\\$1/g;
$Quoted255 = qq{"$Quoted255"};

# ------------------------------------------------------------ 2. scope

our $ScopeConfig = q{
    location = /scoped {
        idempotency on;
        idempotency_scope $http_x_tenant;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/tenant;
    }

    location = /tenant {
        access_log logs/error.log exec;
        return 201 "tenant=$http_x_tenant\n";
    }
};

# ------------------------------------------------------------ 3. problems

our $ProblemConfig = q{
    location = /p {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /p/required {
        idempotency on;
        idempotency_required on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /p/slow {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
    }

    location = /p/small {
        idempotency on;
        idempotency_max_response_size 10;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/big;
    }

    location = /p/down {
        idempotency on;
        idempotency_redis 127.0.0.1:1;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /p/typed {
        idempotency on;
        idempotency_problem_type https://docs.example.com/problems/;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }

    location = /big {
        access_log logs/error.log exec;
        return 200 "0123456789abcdefghij\n";
    }

    # about 2 s for the response (limit_rate counts the header too)
    location = /slow {
        access_log logs/error.log exec;
        limit_rate $TEST_NGINX_RATE;
        return 201 "slow done\n";
    }
};

# An RFC 9457 body: one JSON object with type, title, status and detail, in
# any order, nothing nested.
sub problem {
    my ($type, $status, $title) = @_;
    my $t = defined $title ? quotemeta($title) : '[^"]+';
    my $re = '\A\{'
             . '(?=[^{}]*"type":"' . quotemeta($type) . '")'
             . '(?=[^{}]*"title":"' . $t . '")'
             . '(?=[^{}]*"status":' . $status . '[,}])'
             . '(?=[^{}]*"detail":"[^"]+")'
             . '[^{}]*\}\n?\z';
    return qr/$re/;
}

# ------------------------------------------------------------ 4. replay

# The upstream is a static file (POST becomes GET on the way there) with a
# gzip body, served with every header a replay must give back.  Upstream
# Date and Server are passed through to the client, so the capture does see
# them and has to leave them out; the upstream says "nginx/x.y.z", the
# protected locations (server_tokens off) say "nginx".
our $ReplayConfig = q{
    location = /r/default {
        idempotency on;
        server_tokens off;
        proxy_pass_header Date;
        proxy_pass_header Server;
        proxy_method GET;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/files/order.json.gz;
    }

    location = /r/pass-cookie {
        idempotency on;
        idempotency_pass_header Set-Cookie;
        proxy_method GET;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/files/order.json.gz;
    }

    location = /r/hide {
        idempotency on;
        idempotency_hide_header X-Request-Trace;
        idempotency_hide_header cache-control;
        proxy_method GET;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/files/order.json.gz;
    }

    location = /r/gzip-on {
        idempotency on;
        gzip on;
        gzip_types application/json;
        gzip_min_length 1;
        proxy_method GET;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/files/order.json.gz;
    }

    location = /r/relative {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/created;
    }

    location = /created {
        access_log logs/error.log exec;
        add_header Location /orders/8812;
        return 201 "created\n";
    }

    location /files/ {
        access_log logs/error.log exec;
        alias html/;
        server_tokens on;
        default_type application/json;
        add_header Location https://api.example.com/orders/8812;
        add_header ETag '"order-8812-v1"';
        add_header Content-Encoding gzip;
        add_header X-Request-Trace trace-7f3a9c;
        add_header Link '</orders/8812/items>; rel="items"';
        add_header Link '</orders/8812/receipt>; rel="receipt"';
        add_header Set-Cookie 'session=s3cr3t; Path=/; HttpOnly';
        add_header Cache-Control 'private, max-age=60';
    }
};

our $Json = qq{{"order":8812,"status":"created","items":[1,2,3]}\n};
our $Gz;
gzip(\$Json => \$Gz, Minimal => 1) or die "gzip: $GzipError\n";
our $GzLen = length $Gz;

# a Date line, and both Link lines in order
our $LinksAndDate = do {
    my $items = quotemeta '</orders/8812/items>; rel="items"';
    my $receipt = quotemeta '</orders/8812/receipt>; rel="receipt"';
    qr{(?s)\A(?=.*\nDate:\ [^\r\n]+\r\n)
       (?=.*\nLink:\ $items\r\n(?:.*\r\n)?Link:\ $receipt\r\n)}x;
};
our $TwoDates = qr{(?s)\nDate:.*\nDate:};

# ------------------------------------------------------------ 5. status

our $PolicyConfig = q{
    location = /s/2xx {
        idempotency on;
        idempotency_store_status 2xx;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/status/404;
    }

    location = /s/default {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/status/404;
    }

    location = /s/not201 {
        idempotency on;
        idempotency_store_status 2xx !201;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/status/201;
    }

    location = /s/not201-200 {
        idempotency on;
        idempotency_store_status 2xx !201;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/status/200;
    }

    location = /status/404 {
        access_log logs/error.log exec;
        return 404 "no such account\n";
    }

    location = /status/201 {
        access_log logs/error.log exec;
        return 201 "created\n";
    }

    location = /status/200 {
        access_log logs/error.log exec;
        return 200 "ok\n";
    }
};

# ------------------------------------------------------------ 7. aborts

our $AbortConfig = q{
    location = /a/ignore {
        idempotency on;
        proxy_ignore_client_abort on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
    }

    location = /a/default {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
    }

    # about 2 s for the response (limit_rate counts the header too)
    location = /slow {
        access_log logs/error.log exec;
        limit_rate $TEST_NGINX_RATE;
        return 201 "slow done\n";
    }

    # a 20000-byte response over about 2.5 s: it reaches nginx, and goes on
    # to the client, in several buffers (POST becomes GET on the way there)
    location = /a/ignore-big {
        idempotency on;
        proxy_ignore_client_abort on;
        proxy_method GET;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow-big/body.txt;
    }

    location /slow-big/ {
        access_log logs/error.log exec;
        alias html/;
        limit_rate $TEST_NGINX_RATE_BIG;
    }
};

our $Body20k = join '', map { sprintf "line %04d %s\n", $_, '.' x 29 } 1 .. 500;


no_shuffle();
run_tests();

__DATA__

=== TEST 1: key syntax: a control byte (\x01) in the key is a 400 invalid-key problem
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', "Idempotency-Key: ctl\x01byte")
--- error_code: 400
--- response_headers
Content-Type: application/problem+json
X-Idempotency-Status: INVALID
X-Idempotency-Key: []
--- response_body_like eval
main::problem('urn:ngx-idempotency:invalid-key', 400, 'Idempotency-Key is invalid')
--- no_error_log
EXEC



=== TEST 2: key syntax: DEL (\x7f) in the key is a 400
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', "Idempotency-Key: del\x7fbyte")
--- error_code: 400
--- response_headers
X-Idempotency-Status: INVALID
--- no_error_log
EXEC



=== TEST 3: key syntax: a tab inside a bare key is a 400
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', "Idempotency-Key: tab\tinside")
--- error_code: 400
--- response_headers
X-Idempotency-Status: INVALID
--- no_error_log
EXEC



=== TEST 4: key syntax: a non-ASCII (UTF-8) key is a 400
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', "Idempotency-Key: caf\xc3\xa9-1")
--- error_code: 400
--- response_headers
X-Idempotency-Status: INVALID
--- no_error_log
EXEC



=== TEST 5: key syntax: an empty value is a 400
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', "Idempotency-Key:")
--- error_code: 400
--- response_headers
X-Idempotency-Status: INVALID
--- response_body_like eval
main::problem('urn:ngx-idempotency:invalid-key', 400)
--- no_error_log
EXEC



=== TEST 6: key syntax: an empty quoted string is a 400
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', 'Idempotency-Key: ""')
--- error_code: 400
--- response_headers
X-Idempotency-Status: INVALID
--- no_error_log
EXEC



=== TEST 7: key syntax: an unterminated quote is a 400
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', 'Idempotency-Key: "open-quote')
--- error_code: 400
--- response_headers
X-Idempotency-Status: INVALID
--- no_error_log
EXEC



=== TEST 8: key syntax: text after the closing quote is a 400
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', 'Idempotency-Key: "closed"trailing')
--- error_code: 400
--- response_headers
X-Idempotency-Status: INVALID
--- no_error_log
EXEC



=== TEST 9: key syntax: an escape other than \" and \\ in a quoted key is a 400
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', 'Idempotency-Key: "bad\nescape"')
--- error_code: 400
--- response_headers
X-Idempotency-Status: INVALID
--- no_error_log
EXEC



=== TEST 10: key syntax: two Idempotency-Key lines, even with the same value, are a 400
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', 'Idempotency-Key: twice-1', 'idempotency-key: twice-1')
--- error_code: 400
--- response_headers
X-Idempotency-Status: INVALID
--- response_body_like eval
main::problem('urn:ngx-idempotency:invalid-key', 400)
--- no_error_log
EXEC



=== TEST 11: key syntax: a quoted key with \" and \\ escapes is accepted and decoded
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', 'Idempotency-Key: "esc-a\"b\\\\c"')
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
X-Idempotency-Key: [esc-a"b\c]
!Idempotent-Replayed
--- response_body
created
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 12: key syntax: the identical quoted form with escapes replays
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', 'Idempotency-Key: "esc-a\"b\\\\c"')
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
Idempotent-Replayed: true
--- response_body
created
--- no_error_log
EXEC



=== TEST 13: key syntax: the bare form of the decoded key (esc-a"b\c) is the same record
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', 'Idempotency-Key: esc-a"b\\c')
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
X-Idempotency-Key: [esc-a"b\c]
Idempotent-Replayed: true
--- no_error_log
EXEC



=== TEST 14: key syntax: "sf-abc" (quoted) runs and is recorded
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', 'Idempotency-Key: "sf-abc"')
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
X-Idempotency-Key: [sf-abc]
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 15: key syntax: sf-abc (bare) replays the record of "sf-abc"
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', 'Idempotency-Key: sf-abc')
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
Idempotent-Replayed: true
--- response_body
created
--- no_error_log
EXEC



=== TEST 16: key length: 255 characters are accepted by default
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', 'Idempotency-Key: ' . main::key_of('len255-', 255))
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 17: key length: 256 characters are a 400 by default
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', 'Idempotency-Key: ' . main::key_of('len256-', 256))
--- error_code: 400
--- response_headers
X-Idempotency-Status: INVALID
--- response_body_like eval
main::problem('urn:ngx-idempotency:invalid-key', 400)
--- no_error_log
EXEC



=== TEST 18: key length is counted after decoding: 255 quoted characters with escapes (267 bytes) are accepted
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k', "Idempotency-Key: $::Quoted255")
--- error_code: 201
--- response_headers eval
"X-Idempotency-Status: MISS\nX-Idempotency-Key: [$::Decoded255]"
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 19: key length: with idempotency_key_max_length 300, 256 characters are accepted
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k300', 'Idempotency-Key: ' . main::key_of('len256-', 256))
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 20: key length: with idempotency_key_max_length 300, 300 characters are accepted
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k300', 'Idempotency-Key: ' . main::key_of('len300-', 300))
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 21: key length: with idempotency_key_max_length 300, 301 characters are a 400
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k300', 'Idempotency-Key: ' . main::key_of('len301-', 301))
--- error_code: 400
--- response_headers
X-Idempotency-Status: INVALID
--- no_error_log
EXEC



=== TEST 22: key length: a 300-character key is replayed under idempotency_key_max_length 300
--- http_config eval: $::HttpConfig
--- config eval: $::KeyConfig
--- raw_request eval
main::raw_post('/k300', 'Idempotency-Key: ' . main::key_of('len300-', 300))
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
Idempotent-Replayed: true
--- no_error_log
EXEC



=== TEST 23: scope: tenant acme runs with key shared-1
--- http_config eval: $::HttpConfig
--- config eval: $::ScopeConfig
--- request
POST /scoped
x
--- more_headers
X-Tenant: acme
Idempotency-Key: shared-1
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
!Idempotent-Replayed
--- response_body
tenant=acme
--- grep_error_log eval: qr/EXEC POST \S+ tenant=\S*/
--- grep_error_log_out
EXEC POST /tenant tenant=acme



=== TEST 24: scope: tenant globex with the same key runs too and never sees acme's response
--- http_config eval: $::HttpConfig
--- config eval: $::ScopeConfig
--- request
POST /scoped
x
--- more_headers
X-Tenant: globex
Idempotency-Key: shared-1
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
!Idempotent-Replayed
--- response_body
tenant=globex
--- grep_error_log eval: qr/EXEC POST \S+ tenant=\S*/
--- grep_error_log_out
EXEC POST /tenant tenant=globex



=== TEST 25: scope: acme's retry replays acme's own response
--- http_config eval: $::HttpConfig
--- config eval: $::ScopeConfig
--- request
POST /scoped
x
--- more_headers
X-Tenant: acme
Idempotency-Key: shared-1
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
Idempotent-Replayed: true
--- response_body
tenant=acme
--- no_error_log
EXEC



=== TEST 26: scope: globex's retry replays globex's own response
--- http_config eval: $::HttpConfig
--- config eval: $::ScopeConfig
--- request
POST /scoped
x
--- more_headers
X-Tenant: globex
Idempotency-Key: shared-1
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
Idempotent-Replayed: true
--- response_body
tenant=globex
--- no_error_log
EXEC



=== TEST 27: scope: scope "a" with key "b:c" runs
--- http_config eval: $::HttpConfig
--- config eval: $::ScopeConfig
--- request
POST /scoped
x
--- more_headers
X-Tenant: a
Idempotency-Key: b:c
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- response_body
tenant=a
--- grep_error_log eval: qr/EXEC POST \S+ tenant=\S*/
--- grep_error_log_out
EXEC POST /tenant tenant=a



=== TEST 28: scope: scope "a:b" with key "c" is another record and runs too
--- http_config eval: $::HttpConfig
--- config eval: $::ScopeConfig
--- request
POST /scoped
x
--- more_headers
X-Tenant: a:b
Idempotency-Key: c
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
!Idempotent-Replayed
--- response_body
tenant=a:b
--- grep_error_log eval: qr/EXEC POST \S+ tenant=\S*/
--- grep_error_log_out
EXEC POST /tenant tenant=a:b



=== TEST 29: scope: scope "a" with key "b:c" still replays its own response
--- http_config eval: $::HttpConfig
--- config eval: $::ScopeConfig
--- request
POST /scoped
x
--- more_headers
X-Tenant: a
Idempotency-Key: b:c
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
Idempotent-Replayed: true
--- response_body
tenant=a
--- no_error_log
EXEC



=== TEST 30: problem: a missing key with idempotency_required on is a 400 missing-key problem
--- http_config eval: $::HttpConfig
--- config eval: $::ProblemConfig
--- request
POST /p/required
x
--- error_code: 400
--- response_headers
Content-Type: application/problem+json
Cache-Control: no-store
X-Idempotency-Status: MISSING
--- response_body_like eval
main::problem('urn:ngx-idempotency:missing-key', 400, 'Idempotency-Key is missing')
--- no_error_log
EXEC



=== TEST 31: problem: an invalid key is a 400 invalid-key problem
--- http_config eval: $::HttpConfig
--- config eval: $::ProblemConfig
--- request
POST /p
x
--- more_headers
Idempotency-Key: "open-quote
--- error_code: 400
--- response_headers
Content-Type: application/problem+json
Cache-Control: no-store
X-Idempotency-Status: INVALID
--- response_body_like eval
main::problem('urn:ngx-idempotency:invalid-key', 400, 'Idempotency-Key is invalid')
--- no_error_log
EXEC



=== TEST 32: problem: a duplicate of a running request is a 409 request-in-progress problem with Retry-After
--- http_config eval: $::HttpConfig
--- config eval: $::ProblemConfig
--- init
main::first_request('/p/slow', 'p409-1');
--- request
POST /p/slow
x
--- more_headers
Idempotency-Key: p409-1
--- error_code: 409
--- response_headers
Content-Type: application/problem+json
Cache-Control: no-store
Retry-After: 1
X-Idempotency-Status: CONFLICT
--- response_body_like eval
main::problem('urn:ngx-idempotency:request-in-progress', 409, 'A request is outstanding for this Idempotency-Key')
--- wait eval: 3 * $::Slow
--- grep_error_log: EXEC POST /slow
--- grep_error_log_out
EXEC POST /slow



=== TEST 33: problem: the same key with another body is a 422 key-reused problem
--- http_config eval: $::HttpConfig
--- config eval: $::ProblemConfig
--- request eval
["POST /p\n{\"amount\":1}", "POST /p\n{\"amount\":2}"]
--- more_headers
Idempotency-Key: p422-1
--- error_code eval
[201, 422]
--- response_headers eval
["X-Idempotency-Status: MISS",
 "Content-Type: application/problem+json\nCache-Control: no-store\nX-Idempotency-Status: MISMATCH"]
--- response_body_like eval
[qr/\Acreated\n\z/,
 main::problem('urn:ngx-idempotency:key-reused', 422, 'Idempotency-Key is already used')]



=== TEST 34: problem: the retry of an over-size response is a 422 response-not-stored problem
--- http_config eval: $::HttpConfig
--- config eval: $::ProblemConfig
--- request eval
["POST /p/small\nx", "POST /p/small\nx"]
--- more_headers
Idempotency-Key: p422-big
--- error_code eval
[200, 422]
--- response_headers eval
["X-Idempotency-Status: MISS",
 "Content-Type: application/problem+json\nCache-Control: no-store\nX-Idempotency-Status: OVERSIZE"]
--- response_body_like eval
[qr/\A0123456789abcdefghij\n\z/,
 main::problem('urn:ngx-idempotency:response-not-stored', 422, 'Response for this Idempotency-Key is not available')]



=== TEST 35: problem: Redis unreachable is a 503 store-unavailable problem with Retry-After
--- http_config eval: $::HttpConfig
--- config eval: $::ProblemConfig
--- request
POST /p/down
x
--- more_headers
Idempotency-Key: p503-1
--- error_code: 503
--- response_headers
Content-Type: application/problem+json
Cache-Control: no-store
Retry-After: 1
X-Idempotency-Status: ERROR
--- response_body_like eval
main::problem('urn:ngx-idempotency:store-unavailable', 503, 'Idempotency store is unavailable')
--- no_error_log
EXEC



=== TEST 36: problem: idempotency_problem_type sets the prefix of the type
--- http_config eval: $::HttpConfig
--- config eval: $::ProblemConfig
--- request
POST /p/typed
x
--- more_headers
Idempotency-Key: "open-quote
--- error_code: 400
--- response_headers
Content-Type: application/problem+json
X-Idempotency-Status: INVALID
--- response_body_like eval
main::problem('https://docs.example.com/problems/invalid-key', 400, 'Idempotency-Key is invalid')
--- no_error_log
EXEC



=== TEST 37: problem: idempotency_problem_type set on the server is inherited by its locations
--- http_config eval: $::HttpConfig
--- config
    idempotency_problem_type https://docs.example.com/problems/;

    location = /p/down {
        idempotency on;
        idempotency_redis 127.0.0.1:1;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }
--- request
POST /p/down
x
--- more_headers
Idempotency-Key: p503-typed
--- error_code: 503
--- response_headers
Content-Type: application/problem+json
Retry-After: 1
--- response_body_like eval
main::problem('https://docs.example.com/problems/store-unavailable', 503)
--- no_error_log
EXEC



=== TEST 38: replay: the first response carries every upstream header, Set-Cookie and the upstream's Server included
--- http_config eval: $::HttpConfig
--- config eval: $::ReplayConfig
--- user_files eval
[["order.json.gz", $::Gz]]
--- request
POST /r/default
x
--- more_headers
Idempotency-Key: r-default-1
--- error_code: 200
--- response_headers eval
"Content-Type: application/json
Content-Length: $::GzLen
Location: https://api.example.com/orders/8812
ETag: \"order-8812-v1\"
Content-Encoding: gzip
X-Request-Trace: trace-7f3a9c
Cache-Control: private, max-age=60
Set-Cookie: session=s3cr3t; Path=/; HttpOnly
!Idempotent-Replayed"
--- raw_response_headers_like eval
qr{\nServer: nginx/[0-9.]+\r\n}
--- response_body eval
$::Gz
--- grep_error_log: EXEC GET /files/order.json.gz
--- grep_error_log_out
EXEC GET /files/order.json.gz



=== TEST 39: replay: every stored header comes back as it was, Set-Cookie does not
--- http_config eval: $::HttpConfig
--- config eval: $::ReplayConfig
--- user_files eval
[["order.json.gz", $::Gz]]
--- request
POST /r/default
x
--- more_headers
Idempotency-Key: r-default-1
--- error_code: 200
--- response_headers eval
"Idempotent-Replayed: true
Content-Type: application/json
Content-Length: $::GzLen
Location: https://api.example.com/orders/8812
ETag: \"order-8812-v1\"
Content-Encoding: gzip
X-Request-Trace: trace-7f3a9c
Cache-Control: private, max-age=60
Link: </orders/8812/items>; rel=\"items\", </orders/8812/receipt>; rel=\"receipt\"
!Set-Cookie"
--- raw_response_headers_like eval
$::LinksAndDate
--- response_body eval
$::Gz
--- no_error_log
EXEC



=== TEST 40: replay: Date and Server are regenerated, not replayed from the upstream's
--- http_config eval: $::HttpConfig
--- config eval: $::ReplayConfig
--- user_files eval
[["order.json.gz", $::Gz]]
--- request
POST /r/default
x
--- more_headers
Idempotency-Key: r-default-1
--- error_code: 200
--- response_headers
Idempotent-Replayed: true
Server: nginx
--- raw_response_headers_unlike eval
$::TwoDates
--- no_error_log
EXEC



=== TEST 41: replay: with idempotency_pass_header Set-Cookie, the first run
--- http_config eval: $::HttpConfig
--- config eval: $::ReplayConfig
--- user_files eval
[["order.json.gz", $::Gz]]
--- request
POST /r/pass-cookie
x
--- more_headers
Idempotency-Key: r-cookie-1
--- error_code: 200
--- response_headers
Set-Cookie: session=s3cr3t; Path=/; HttpOnly
!Idempotent-Replayed
--- grep_error_log: EXEC GET /files/order.json.gz
--- grep_error_log_out
EXEC GET /files/order.json.gz



=== TEST 42: replay: with idempotency_pass_header Set-Cookie, the cookie is replayed
--- http_config eval: $::HttpConfig
--- config eval: $::ReplayConfig
--- user_files eval
[["order.json.gz", $::Gz]]
--- request
POST /r/pass-cookie
x
--- more_headers
Idempotency-Key: r-cookie-1
--- error_code: 200
--- response_headers
Idempotent-Replayed: true
Set-Cookie: session=s3cr3t; Path=/; HttpOnly
X-Request-Trace: trace-7f3a9c
--- response_body eval
$::Gz
--- no_error_log
EXEC



=== TEST 43: replay: with idempotency_hide_header, the first run still sends the hidden headers
--- http_config eval: $::HttpConfig
--- config eval: $::ReplayConfig
--- user_files eval
[["order.json.gz", $::Gz]]
--- request
POST /r/hide
x
--- more_headers
Idempotency-Key: r-hide-1
--- error_code: 200
--- response_headers
X-Request-Trace: trace-7f3a9c
Cache-Control: private, max-age=60
!Idempotent-Replayed
--- grep_error_log: EXEC GET /files/order.json.gz
--- grep_error_log_out
EXEC GET /files/order.json.gz



=== TEST 44: replay: the headers named by idempotency_hide_header (any letter case) are not replayed
--- http_config eval: $::HttpConfig
--- config eval: $::ReplayConfig
--- user_files eval
[["order.json.gz", $::Gz]]
--- request
POST /r/hide
x
--- more_headers
Idempotency-Key: r-hide-1
--- error_code: 200
--- response_headers
Idempotent-Replayed: true
!X-Request-Trace
!Cache-Control
!Set-Cookie
ETag: "order-8812-v1"
Content-Encoding: gzip
Location: https://api.example.com/orders/8812
--- response_body eval
$::Gz
--- no_error_log
EXEC




=== TEST 45: replay: under gzip on, the first response's gzip body passes untouched
--- http_config eval: $::HttpConfig
--- config eval: $::ReplayConfig
--- user_files eval
[["order.json.gz", $::Gz]]
--- request
POST /r/gzip-on
x
--- more_headers
Idempotency-Key: r-gzip-1
Accept-Encoding: gzip
--- error_code: 200
--- response_headers
Content-Encoding: gzip
!Idempotent-Replayed
--- response_body eval
$::Gz
--- grep_error_log: EXEC GET /files/order.json.gz
--- grep_error_log_out
EXEC GET /files/order.json.gz



=== TEST 46: replay: under gzip on, the replayed gzip body is not compressed a second time
--- http_config eval: $::HttpConfig
--- config eval: $::ReplayConfig
--- user_files eval
[["order.json.gz", $::Gz]]
--- request
POST /r/gzip-on
x
--- more_headers
Idempotency-Key: r-gzip-1
Accept-Encoding: gzip
--- error_code: 200
--- response_headers
Idempotent-Replayed: true
Content-Encoding: gzip
--- response_body eval
$::Gz
--- no_error_log
EXEC



=== TEST 47: replay: a relative Location from the upstream reaches the first client as it is
--- http_config eval: $::HttpConfig
--- config eval: $::ReplayConfig
--- request
POST /r/relative
x
--- more_headers
Idempotency-Key: r-relative-1
--- error_code: 201
--- response_headers
Location: /orders/8812
!Idempotent-Replayed
--- grep_error_log: EXEC POST /created
--- grep_error_log_out
EXEC POST /created



=== TEST 48: replay: the replayed relative Location is the one the first client got, not made absolute
--- http_config eval: $::HttpConfig
--- config eval: $::ReplayConfig
--- request
POST /r/relative
x
--- more_headers
Idempotency-Key: r-relative-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
Location: /orders/8812
--- response_body
created
--- no_error_log
EXEC


=== TEST 49: status policy: under idempotency_store_status 2xx a 404 runs
--- http_config eval: $::HttpConfig
--- config eval: $::PolicyConfig
--- request
POST /s/2xx
x
--- more_headers
Idempotency-Key: s-2xx-1
--- error_code: 404
--- response_body
no such account
--- grep_error_log: EXEC POST /status/404
--- grep_error_log_out
EXEC POST /status/404



=== TEST 50: status policy: under idempotency_store_status 2xx the 404 was not stored, the retry runs again
--- http_config eval: $::HttpConfig
--- config eval: $::PolicyConfig
--- request
POST /s/2xx
x
--- more_headers
Idempotency-Key: s-2xx-1
--- error_code: 404
--- response_headers
!Idempotent-Replayed
--- grep_error_log: EXEC POST /status/404
--- grep_error_log_out
EXEC POST /status/404



=== TEST 51: status policy: by default a 404 runs
--- http_config eval: $::HttpConfig
--- config eval: $::PolicyConfig
--- request
POST /s/default
x
--- more_headers
Idempotency-Key: s-default-1
--- error_code: 404
--- grep_error_log: EXEC POST /status/404
--- grep_error_log_out
EXEC POST /status/404



=== TEST 52: status policy: by default the 404 is stored and replayed
--- http_config eval: $::HttpConfig
--- config eval: $::PolicyConfig
--- request
POST /s/default
x
--- more_headers
Idempotency-Key: s-default-1
--- error_code: 404
--- response_headers
Idempotent-Replayed: true
--- response_body
no such account
--- no_error_log
EXEC



=== TEST 53: status policy: under 2xx !201 a 201 runs
--- http_config eval: $::HttpConfig
--- config eval: $::PolicyConfig
--- request
POST /s/not201
x
--- more_headers
Idempotency-Key: s-not201-1
--- error_code: 201
--- grep_error_log: EXEC POST /status/201
--- grep_error_log_out
EXEC POST /status/201



=== TEST 54: status policy: under 2xx !201 the 201 was not stored, the retry runs again
--- http_config eval: $::HttpConfig
--- config eval: $::PolicyConfig
--- request
POST /s/not201
x
--- more_headers
Idempotency-Key: s-not201-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- grep_error_log: EXEC POST /status/201
--- grep_error_log_out
EXEC POST /status/201



=== TEST 55: status policy: under 2xx !201 a 200 runs
--- http_config eval: $::HttpConfig
--- config eval: $::PolicyConfig
--- request
POST /s/not201-200
x
--- more_headers
Idempotency-Key: s-not201-200
--- error_code: 200
--- grep_error_log: EXEC POST /status/200
--- grep_error_log_out
EXEC POST /status/200



=== TEST 56: status policy: under 2xx !201 the 200 is still stored and replayed
--- http_config eval: $::HttpConfig
--- config eval: $::PolicyConfig
--- request
POST /s/not201-200
x
--- more_headers
Idempotency-Key: s-not201-200
--- error_code: 200
--- response_headers
Idempotent-Replayed: true
--- response_body
ok
--- no_error_log
EXEC



=== TEST 57: idempotency_pass_header Date fails nginx -t
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        idempotency_pass_header Date;
        return 204;
    }
--- must_die
--- error_log
[emerg]
in "idempotency_pass_header" directive



=== TEST 58: idempotency_pass_header Connection fails nginx -t
--- http_config eval: $::HttpConfig
--- config
    idempotency_pass_header Connection;

    location = /t {
        idempotency on;
        return 204;
    }
--- must_die
--- error_log
[emerg]
in "idempotency_pass_header" directive



=== TEST 59: idempotency_pass_header Server fails nginx -t
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        idempotency_pass_header Server;
        return 204;
    }
--- must_die
--- error_log
[emerg]
in "idempotency_pass_header" directive



=== TEST 60: idempotency_pass_header transfer-encoding (any letter case) fails nginx -t
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        idempotency_pass_header transfer-encoding;
        return 204;
    }
--- must_die
--- error_log
[emerg]
in "idempotency_pass_header" directive



=== TEST 61: idempotency_pass_header Content-Length fails nginx -t
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        idempotency_pass_header Content-Length;
        return 204;
    }
--- must_die
--- error_log
[emerg]
in "idempotency_pass_header" directive



=== TEST 62: client abort: under proxy_ignore_client_abort the operation completes once and the retry gets the replay
# the client hangs up 0.2 s after sending, while the upstream (about 2 s)
# is still working; init waits until the upstream finished
--- http_config eval: $::HttpConfig
--- config eval: $::AbortConfig
--- init
main::first_request('/a/ignore', 'abort-ignore-1', 0.2, 3.5);
--- request
POST /a/ignore
x
--- more_headers
Idempotency-Key: abort-ignore-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
X-Idempotency-Status: HIT
--- response_body
slow done
--- grep_error_log: EXEC POST /slow
--- grep_error_log_out
EXEC POST /slow
--- no_error_log
did not complete



=== TEST 63: client abort: under proxy_ignore_client_abort a response sent in several parts after the client left is still recorded
# as TEST 62, but the response is written to the gone client in more than
# one write: the retry, after the upstream finished, must get the replay
--- http_config eval: $::HttpConfig
--- config eval: $::AbortConfig
--- user_files eval
[["body.txt", $::Body20k]]
--- init
main::first_request('/a/ignore-big', 'abort-ignore-big-1', 0.2, 5);
--- request
POST /a/ignore-big
x
--- more_headers
Idempotency-Key: abort-ignore-big-1
--- error_code: 200
--- response_headers
Idempotent-Replayed: true
X-Idempotency-Status: HIT
--- response_body eval
$::Body20k
--- grep_error_log: EXEC GET /slow-big/body.txt
--- grep_error_log_out
EXEC GET /slow-big/body.txt
--- no_error_log
did not complete



=== TEST 64: client abort: without proxy_ignore_client_abort too, the operation completes once and the retry gets the replay
# contrast for TEST 62 and 63: the default configuration.  The module lets
# the upstream exchange of a claimed request finish when its client goes
# away (t/151-settle.t has the HTTP/2 and mid-body cases).
--- http_config eval: $::HttpConfig
--- config eval: $::AbortConfig
--- init
main::first_request('/a/default', 'abort-default-1', 0.2, 3.5);
--- request
POST /a/default
x
--- more_headers
Idempotency-Key: abort-default-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
X-Idempotency-Status: HIT
--- response_body
slow done
--- grep_error_log: EXEC POST /slow
--- grep_error_log_out
EXEC POST /slow
--- no_error_log
did not complete
