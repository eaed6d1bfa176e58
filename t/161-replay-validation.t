# Replays are validated: a record written or edited by someone with write
# access to Redis is replayed only with what the capture could have stored.
# Headers the capture never stores (hop-by-hop, framing, Date, Server, the
# replay marker) are left out whatever the record says; a record with a
# status that is not final (1xx, 7xx) or with a header that is not well
# formed is corrupt: logged with its key hash and answered like a Redis
# failure (idempotency_on_store_error), never replayed.
#
# The records are written with redis-cli (make test's Redis control
# script); the blocks that need them are skipped without it.

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use Digest::SHA ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t161-$$-" . time() . ":";

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
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

    location = /open {
        idempotency on;
        idempotency_on_store_error open;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "ran\n";
    }
};

# Writes a completed record for "POST $uri" with body "x" under $key: the
# status line's three digits, the header lines, the body.
sub plant {
    my ($uri, $key, $status, $headers, $body) = @_;
    my $fp = Digest::SHA::sha256_hex("POST $uri\nx");
    my $rkey = $ENV{TEST_NGINX_PREFIX} . Digest::SHA::sha256_hex('test:')
               . ":$key";
    my $rec = "idem1 done $fp " . ('ab' x 20) . ' ' . time() . " $status\r\n"
              . join('', map { "$_\r\n" } @$headers) . "\r\n$body";
    main::redis_cli('SET', $rkey, $rec, 'PX', 600000);
}

# The same as a split record (a body of 16 KiB or more kept in a second
# key, in the record's hash slot): the head holds the body's length, or
# $announce.  A chunk goes in pieces of 64 KiB (one argument of a command
# line has at most 128 KiB).
sub plant_split {
    my ($uri, $key, $status, $headers, $body, $announce) = @_;
    my $fp = Digest::SHA::sha256_hex("POST $uri\nx");
    my $owner = 'cd' x 20;
    my $rkey = $ENV{TEST_NGINX_PREFIX} . Digest::SHA::sha256_hex('test:')
               . ":$key";
    my $rec = "idem1 split $fp $owner " . time() . " $status\r\n"
              . join('', map { "$_\r\n" } @$headers) . "\r\n"
              . ($announce // length($body));
    # the body in chunks of 1 MiB: "<body key>:0", ":1" ...
    my $i = 0;
    for (my $off = 0; $off < length $body; $off += 1 << 20) {
        my $chunk = substr($body, $off, 1 << 20);
        my $ckey = "$ENV{TEST_NGINX_PREFIX}\{$rkey\}:body:$owner:" . $i++;
        main::redis_cli('SET', $ckey, substr($chunk, 0, 65536), 'PX', 600000);
        for (my $p = 65536; $p < length $chunk; $p += 65536) {
            main::redis_cli('APPEND', $ckey, substr($chunk, $p, 65536));
        }
    }
    main::redis_cli('SET', $rkey, $rec, 'PX', 600000);
}

no_shuffle();
run_tests();

__DATA__

=== TEST 1: a record naming hop-by-hop and framing headers is replayed without them
--- skip_eval: 8: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::plant('/t', 'hop-1', '200', [
    'Content-Type: text/plain',
    'Transfer-Encoding: chunked',
    'Connection: close',
    'Keep-Alive: timeout=1',
    'Content-Length: 999',
    'Content-Length: 5',
    'Date: Mon, 01 Jan 2001 00:00:00 GMT',
    'Server: evil',
    'Upgrade: h2c',
    'Idempotent-Replayed: false',
    'X-Order: 8812',
], 'hello');
--- request
POST /t
x
--- more_headers
Idempotency-Key: hop-1
--- error_code: 200
--- response_headers
X-Order: 8812
Idempotent-Replayed: true
X-Idempotency-Status: HIT
Content-Length: 5
--- response_body chop
hello
--- raw_response_headers_unlike: (?i)transfer-encoding|server: evil|keep-alive: timeout|content-length: 999|2001|upgrade|replayed: false
--- error_log eval
qr/the record key_hash=${\ main::key_hash('hop-1')} holds 9 header\(s\) the module never stores .*: left out of the replay/



=== TEST 2: a record with a 1xx status is refused as corrupt: 503, logged, nothing of it replayed
--- skip_eval: 8: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::plant('/t', 'one-xx-1', '101', ['Upgrade: websocket',
                                     'Connection: upgrade',
                                     'X-Planted: 1'], 'planted');
--- request
POST /t
x
--- more_headers
Idempotency-Key: one-xx-1
--- error_code: 503
--- response_headers
X-Idempotency-Status: ERROR
!X-Planted
!Upgrade
--- response_body_unlike: planted
--- error_log eval
[qr/the record key_hash=${\ main::key_hash('one-xx-1')} is corrupt or not of this module/,
 qr/Redis failed, request refused with 503, key_hash=${\ main::key_hash('one-xx-1')}/]
--- no_error_log
EXEC POST



=== TEST 3: a record with a 7xx status is refused as corrupt
--- skip_eval: 6: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::plant('/t', 'seven-xx-1', '700', ['X-Planted: 1'], 'planted');
--- request
POST /t
x
--- more_headers
Idempotency-Key: seven-xx-1
--- error_code: 503
--- response_headers
X-Idempotency-Status: ERROR
!X-Planted
--- response_body_unlike: planted
--- error_log eval
qr/the record key_hash=${\ main::key_hash('seven-xx-1')} is corrupt or not of this module/
--- no_error_log
EXEC POST



=== TEST 4: a header value with a control character makes the record corrupt
--- skip_eval: 6: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::plant('/t', 'ctl-1', '200', ["X-Planted: a\x1b[31mb"], 'planted');
--- request
POST /t
x
--- more_headers
Idempotency-Key: ctl-1
--- error_code: 503
--- response_headers
X-Idempotency-Status: ERROR
!X-Planted
--- response_body_unlike: planted
--- error_log eval
qr/the record key_hash=${\ main::key_hash('ctl-1')} is corrupt: a header value holds a control character; not replayed/
--- no_error_log
EXEC POST



=== TEST 5: a header name that is not a token makes the record corrupt
--- skip_eval: 4: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::plant('/t', 'name-1', '200', ['Bad Name: v'], 'planted');
--- request
POST /t
x
--- more_headers
Idempotency-Key: name-1
--- error_code: 503
--- response_body_unlike: planted
--- error_log eval
qr/the record key_hash=${\ main::key_hash('name-1')} is corrupt: a header name is not a token/
--- no_error_log
EXEC POST



=== TEST 6: with idempotency_on_store_error open a corrupt record is passed through unprotected, never replayed
--- skip_eval: 5: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::plant('/open', 'open-1', '199', ['X-Planted: 1'], 'planted');
--- request
POST /open
x
--- more_headers
Idempotency-Key: open-1
--- error_code: 201
--- response_headers
X-Idempotency-Status: ERROR
!X-Planted
--- response_body
ran
--- grep_error_log: EXEC POST /backend open-1
--- grep_error_log_out
EXEC POST /backend open-1



=== TEST 7: a split record (its body in a second key) is validated, then replayed with its body
--- skip_eval: 5: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};
main::plant_split('/t', 'split-1', '200',
                  ['Content-Type: text/plain', 'Connection: close',
                   'X-Order: 8813'], 'y' x 20000);
--- request
POST /t
x
--- more_headers
Idempotency-Key: split-1
--- error_code: 200
--- response_headers
X-Order: 8813
X-Idempotency-Status: HIT
Content-Length: 20000
--- response_body eval
'y' x 20000
--- no_error_log
EXEC POST



=== TEST 8: a split record with a malformed header is refused before its body is read
--- skip_eval: 5: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};
main::plant_split('/t', 'split-2', '200', ['X-Planted: 1', 'Bad Name: v'],
                  'planted' x 3000);
--- request
POST /t
x
--- more_headers
Idempotency-Key: split-2
--- error_code: 503
--- response_headers
X-Idempotency-Status: ERROR
!X-Planted
--- response_body_unlike: planted
--- error_log eval
qr/the record key_hash=${\ main::key_hash('split-2')} is corrupt: a header name is not a token/
--- no_error_log
EXEC POST



=== TEST 9: a split head announcing 10 GB is refused as corrupt before anything is sent, although its first chunk is there
--- skip_eval: 5: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};
main::plant_split('/t', 'split-3', '200', ['X-Planted: 1'],
                  substr('planted' x 149797, 0, 1 << 20),
                  10 * 1024 * 1024 * 1024);
--- request
POST /t
x
--- more_headers
Idempotency-Key: split-3
--- error_code: 503
--- response_headers
X-Idempotency-Status: ERROR
!X-Planted
--- response_body_unlike: planted
--- error_log eval
qr/the record key_hash=${\ main::key_hash('split-3')} is corrupt \(body length\), not used/
--- no_error_log
EXEC POST



=== TEST 10: a split record whose body is over idempotency_max_response_size is refused as corrupt, all its chunks there or not
--- skip_eval: 5: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval
$::Config . q{
    location = /small {
        idempotency on;
        idempotency_max_response_size 32k;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
}
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};
main::plant_split('/small', 'split-4', '200', ['X-Planted: 1'],
                  'planted' x 6000);
--- request
POST /small
x
--- more_headers
Idempotency-Key: split-4
--- error_code: 503
--- response_headers
X-Idempotency-Status: ERROR
!X-Planted
--- response_body_unlike: planted
--- error_log eval
qr/the record key_hash=${\ main::key_hash('split-4')} is corrupt \(body length\), not used/
--- no_error_log
EXEC POST
