# The idempotency_admin location against one Redis: GET shows the record
# of a key in a scope (done, in flight, over-size), DELETE removes it (a
# stuck claim too) so that the key runs again; 404 without a record, 405
# for other methods, 400 problems for bad arguments, nginx -t misuse.
#
# Records are made from "--- init" by requests to the protected locations
# of the same nginx; the scope is the Authorization header's value (the
# default idempotency_scope), or the constant "shared" of /slow.

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use Digest::SHA ();
use IO::Socket::INET ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t180-$$-" . time() . ":";
$ENV{TEST_NGINX_RATE} = int(80 / $Slow);

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

our $Config = q{
    location = /admin {
        idempotency_admin;
        allow 127.0.0.1;
        deny all;
    }

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

    # a constant scope: the explicit shared namespace of clients that send
    # no Authorization (first_request sends none)
    location = /slow {
        idempotency on;
        idempotency_scope shared;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow-backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }

    # about 2 s for the response (limit_rate counts the header too)
    location = /slow-backend {
        access_log logs/error.log exec;
        limit_rate $TEST_NGINX_RATE;
        return 201 "slow done\n";
    }
};

# POST $uri with a key and an optional Authorization value, read to the end
sub post {
    my ($uri, $key, $auth) = @_;
    my $sock = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1',
        PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
        Timeout  => 10,
    ) or die "connect: $!";
    print $sock "POST $uri HTTP/1.1\r\nHost: localhost\r\n"
                . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
                . (defined $auth ? "Authorization: $auth\r\n" : '')
                . "Connection: close\r\n\r\nx";
    local $/;
    my $resp = <$sock> // '';
    my ($status) = $resp =~ m{^HTTP/1\.[01] (\d{3})};
    return $status // 0;
}

sub scope_hash { Digest::SHA::sha256_hex($_[0]) }

# GET $uri, read to the end: the status
sub get {
    my ($uri) = @_;
    my $sock = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1',
        PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
        Timeout  => 10,
    ) or die "connect: $!";
    print $sock "GET $uri HTTP/1.1\r\nHost: localhost\r\n"
                . "Connection: close\r\n\r\n";
    local $/;
    my $resp = <$sock> // '';
    my ($status) = $resp =~ m{^HTTP/1\.[01] (\d{3})};
    return $status // 0;
}

# a short command timeout, so that a paused Redis is noticed quickly
our $Timeout = 300 * $Slow;
our $FailHttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX}
                      timeout=${Timeout}ms connect_timeout=${Timeout}ms;
};

no_shuffle();
run_tests();

__DATA__

=== TEST 1: no record: 404 problem
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
GET /admin?key=never-used&scope=Bearer%20alice
--- error_code: 404
--- response_headers
Content-Type: application/problem+json
--- response_body_like chomp
"title":"No record for this key"



=== TEST 2: a stored response: done, its status, TTL, size, key hash
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::post('/t', 'done-1', 'Bearer alice') == 201 or die "post failed";
--- request
GET /admin?key=done-1&scope=Bearer+alice
--- error_code: 200
--- response_headers
Content-Type: application/json
Cache-Control: no-store
--- response_body_like eval
my $h = main::scope_hash('Bearer alice');
my $kh = main::key_hash('done-1', 'Bearer alice');
qr/\A\{
  "key": "done-1",
  "redis_key": "\Q$ENV{TEST_NGINX_PREFIX}\E$h:done-1",
  "key_hash": "$kh",
  "state": "done",
  "status": 201,
  "ttl_ms": (86[0-3]\d{5}|86400000),
  "size": [1-9]\d*,
  "created": 1\d{9},
  "fingerprint": "[0-9a-f]{64}"
\}\n\z/



=== TEST 3: the scope by its hash, in either case
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request eval
"GET /admin?key=done-1&scope_hash=" . uc(main::scope_hash('Bearer alice'))
--- error_code: 200
--- response_body_like
"state": "done",
  "status": 201,



=== TEST 4: another scope does not see the record
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
GET /admin?key=done-1&scope=Bearer%20bob
--- error_code: 404



=== TEST 5: HEAD answers like GET, without a body
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
HEAD /admin?key=done-1&scope=Bearer%20alice
--- error_code: 200
--- response_headers
Content-Type: application/json
--- response_body



=== TEST 6: an in-flight claim (the constant scope): inflight, no status yet
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::first_request('/slow', 'busy-1');
--- request
GET /admin?key=busy-1&scope=shared
--- error_code: 200
--- response_body_like
"state": "inflight",
  "status": null,
--- wait eval: 3 * $::Slow



=== TEST 7: a response larger than idempotency_max_response_size: oversize
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::post('/small', 'big-1', 'Bearer alice') == 201 or die "post failed";
--- request
GET /admin?key=big-1&scope=Bearer%20alice
--- error_code: 200
--- response_body_like
"state": "oversize",
  "status": 201,



=== TEST 8: DELETE removes a stored record: 204, and it is gone
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::post('/t', 'gone-1', 'Bearer alice') == 201 or die "post failed";
--- request
DELETE /admin?key=gone-1&scope=Bearer%20alice
--- error_code: 204
--- response_body
--- error_log eval
qr/\[notice\] .*idempotency admin: record key_hash=\Q${\ main::key_hash('gone-1', 'Bearer alice')}\E removed/



=== TEST 9: DELETE of a key without a record: 404
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
DELETE /admin?key=gone-1&scope=Bearer%20alice
--- error_code: 404
--- response_headers
Content-Type: application/problem+json



=== TEST 10: a deleted key runs again (MISS, the upstream is called)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::post('/t', 'again-1', 'Bearer alice') == 201 or die "post failed";
main::post('/t', 'again-1', 'Bearer alice') == 201 or die "post failed";
main::post('/admin?key=again-1&scope=Bearer%20alice', 'x') == 405
    or die "POST to /admin was not refused";
my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                              PeerPort => $ENV{TEST_NGINX_SERVER_PORT})
    or die "connect: $!";
print $s "DELETE /admin?key=again-1&scope=Bearer%20alice HTTP/1.1\r\n"
         . "Host: localhost\r\nConnection: close\r\n\r\n";
local $/;
<$s> =~ m{^HTTP/1\.1 204 } or die "DELETE failed";
--- request
POST /t
x
--- more_headers
Idempotency-Key: again-1
Authorization: Bearer alice
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- grep_error_log: EXEC POST /backend again-1
--- grep_error_log_out
EXEC POST /backend again-1
EXEC POST /backend again-1



=== TEST 11: DELETE of an in-flight claim frees the key at once
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::first_request('/slow', 'stuck-1');
my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                              PeerPort => $ENV{TEST_NGINX_SERVER_PORT})
    or die "connect: $!";
print $s "DELETE /admin?key=stuck-1&scope=shared HTTP/1.1\r\n"
         . "Host: localhost\r\nConnection: close\r\n\r\n";
local $/;
<$s> =~ m{^HTTP/1\.1 204 } or die "DELETE failed";
--- request
POST /slow
x
--- more_headers
Idempotency-Key: stuck-1
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- timeout eval: 10 * $::Slow
--- wait eval: 3 * $::Slow



=== TEST 11a: an empty scope: 400, such keys are never stored
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
GET /admin?key=busy-1&scope=
--- error_code: 400
--- response_body_like: The scope is empty



=== TEST 12: other methods: 405 with Allow
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /admin?key=done-1&scope=Bearer%20alice
x
--- error_code: 405
--- response_headers
Allow: GET, HEAD, DELETE
Content-Type: application/problem+json



=== TEST 13: no key: 400 problem
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
GET /admin?scope=Bearer%20alice
--- error_code: 400
--- response_headers
Content-Type: application/problem+json
--- response_body_like chomp
The key argument is missing



=== TEST 14: no scope: 400 problem
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
GET /admin?key=done-1
--- error_code: 400
--- response_body_like chomp
The scope \(or scope_hash\) argument is missing



=== TEST 15: scope and scope_hash together: 400
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request eval
"GET /admin?key=done-1&scope=x&scope_hash=" . main::scope_hash('x')
--- error_code: 400
--- response_body_like chomp
not both



=== TEST 16: a scope_hash that is not 64 hex digits: 400
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request eval
["GET /admin?key=done-1&scope_hash=abc",
 "GET /admin?key=done-1&scope_hash=" . ('g' x 64)]
--- error_code eval
[400, 400]
--- response_body_like eval
[qr/must be 64 hexadecimal digits/, qr/must be 64 hexadecimal digits/]



=== TEST 17: a key the header parser refuses: 400, with its reason
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request eval
["GET /admin?key=%22open&scope=x",
 "GET /admin?key=" . ('k' x 256) . "&scope=x",
 "GET /admin?key=&scope=x"]
--- error_code eval
[400, 400, 400]
--- response_body_like eval
[qr/not a quoted string/, qr/too long/, qr/empty/]



=== TEST 18: a quoted key is the same key as the bare one
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
GET /admin?key=%22done-1%22&scope=Bearer%20alice
--- error_code: 200
--- response_body_like
"key": "done-1",



=== TEST 19: access control is the operator's (deny)
--- http_config eval: $::HttpConfig
--- config
    location = /admin {
        idempotency_admin;
        deny all;
    }
--- request
GET /admin?key=done-1&scope=Bearer%20alice
--- error_code: 403



=== TEST 20: idempotency_admin without idempotency_redis fails nginx -t
--- http_config
--- config
    location = /admin {
        idempotency_admin;
    }
--- must_die
--- error_log
"idempotency_admin" needs an "idempotency_redis" for its location



=== TEST 21: idempotency_admin twice is a duplicate
--- http_config eval: $::HttpConfig
--- config
    location = /admin {
        idempotency_admin;
        idempotency_admin;
    }
--- must_die
--- error_log
"idempotency_admin" directive is duplicate



=== TEST 22: Redis paused past the timeout: 503 problem, logged
--- skip_eval: 4: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::FailHttpConfig
--- config eval: $::Config
--- init
# the connection is ready first: its handshake is over
main::get('/admin?key=pause-1&scope=x') == 404 or die "admin not ready";
main::redis_pause_all(int(1500 * $main::Slow));
--- request
GET /admin?key=pause-1&scope=x
--- error_code: 503
--- response_headers
Content-Type: application/problem+json
--- error_log
idempotency admin: Redis timed out, key_hash=
--- wait eval: 1.5 * $::Slow



=== TEST 23: scripts flushed in Redis: GET and DELETE still work (EVAL)
--- skip_eval: 4: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::get('/admin?key=flush-1&scope=x') == 404 or die "admin not ready";
main::redis_cli('SCRIPT', 'FLUSH');
main::post('/t', 'flush-1', 'x') == 201 or die "post failed";
main::get('/admin?key=flush-1&scope=x') == 200 or die "GET after FLUSH";
main::redis_cli('SCRIPT', 'FLUSH');
--- request
DELETE /admin?key=flush-1&scope=x
--- error_code: 204
--- no_error_log
[error]



=== TEST 24: a value that is not a record: unreadable, and DELETE removes it
--- skip_eval: 5: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::redis_cli('SET', $ENV{TEST_NGINX_PREFIX} . main::scope_hash('x')
                . ':junk-1', 'not a record', 'PX', 60000);
main::get('/admin?key=junk-1&scope=x') == 200 or die "GET failed";
--- request eval
["GET /admin?key=junk-1&scope=x", "DELETE /admin?key=junk-1&scope=x",
 "GET /admin?key=junk-1&scope=x"]
--- error_code eval
[200, 204, 404]
--- response_body_like eval
[qr/"state": "unreadable",\n  "status": null,\n  "ttl_ms": \d+,\n  "size": 12,\n  "created": null,\n  "fingerprint": ""\n/,
 qr/^$/, qr/No record/]



=== TEST 25: a split record (its body in a second key) is done, marked split
--- skip_eval: 2: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};
main::redis_cli('SET', $ENV{TEST_NGINX_PREFIX} . main::scope_hash('x')
                . ':split-1', 'idem1 split ' . ('a' x 64) . ' ' . ('b' x 40)
                . ' ' . time() . " 201\r\nX-A: 1\r\n\r\n20000", 'PX', 60000);
--- request
GET /admin?key=split-1&scope=x
--- error_code: 200
--- response_body_like
"state": "done",
  "split": true,
  "status": 201,
