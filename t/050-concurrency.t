# Duplicates that arrive while the first request is still running: 409 with
# Retry-After at once, or with idempotency_wait a wait for the replay.
#
# The upstream is slowed down with limit_rate; the first request is sent by
# a background client from "--- init", the duplicate is the block's request.

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use IO::Socket::INET;
use POSIX ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t050-$$-" . time() . ":";

our $Rate = int(80 / $Slow);

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

# about 2 s for the upstream's response (limit_rate counts the header too),
# longer under valgrind
our $Config = q{
    location = /t {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /wait {
        idempotency on;
        idempotency_wait 60s;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        limit_rate $TEST_NGINX_RATE;
        return 201 "slow done\n";
    }
};


$ENV{TEST_NGINX_RATE} = $Rate;

# TEST 6a's Redis user: may claim (SET) but not run the scripts.  Made
# before any nginx starts, as workers connect at once.
main::redis_cli('ACL', 'SETUSER', 'norenew', 'reset', 'on', '>n0renew',
                "~$ENV{TEST_NGINX_PREFIX}*", '+set', '+get', '+script|load')
    if $ENV{TEST_NGINX_REDIS_CTL};

no_shuffle();
run_tests();

__DATA__

=== TEST 1: a duplicate of a running request gets 409 with Retry-After
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::first_request('/t', 'busy-1');
--- request
POST /t
x
--- more_headers
Idempotency-Key: busy-1
--- error_code: 409
--- response_headers
Retry-After: 1
Content-Type: application/problem+json
X-Idempotency-Status: CONFLICT
--- response_body_like chomp
"title":"A request is outstanding for this Idempotency-Key"
--- wait eval: 3 * $::Slow
--- grep_error_log: EXEC POST /backend busy-1
--- grep_error_log_out
EXEC POST /backend busy-1



=== TEST 2: once the first one finished, the retry gets its response
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
x
--- more_headers
Idempotency-Key: busy-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
slow done
--- no_error_log
EXEC POST /backend busy-1



=== TEST 3: with idempotency_wait the duplicate waits and gets the replay
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::first_request('/wait', 'wait-1');
--- request
POST /wait
x
--- more_headers
Idempotency-Key: wait-1
--- timeout eval: 10 * $::Slow
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
X-Idempotency-Status: HIT
--- response_body
slow done
--- grep_error_log: EXEC POST /backend wait-1
--- grep_error_log_out
EXEC POST /backend wait-1




=== TEST 4: a wait shorter than the first request ends in 409
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        idempotency_wait 300ms;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        limit_rate $TEST_NGINX_RATE;
        return 201 "slow done\n";
    }
--- init
main::first_request('/t', 'wait-2');
--- request
POST /t
x
--- more_headers
Idempotency-Key: wait-2
--- error_code: 409
--- response_headers
Retry-After: 1



=== TEST 5: a client that went away after its request went upstream keeps the claim while the upstream runs
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::first_request('/t', 'gone-1', 0.2);
--- request
POST /t
x
--- more_headers
Idempotency-Key: gone-1
--- error_code: 409
--- wait eval: 3 * $::Slow
--- grep_error_log: EXEC POST /backend gone-1
--- grep_error_log_out
EXEC POST /backend gone-1
--- no_error_log
did not complete



=== TEST 6: a claim is renewed while its upstream runs longer than the lock TTL
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        idempotency_lock_ttl 300ms;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        limit_rate $TEST_NGINX_RATE;
        return 201 "slow done\n";
    }
--- init
main::first_request('/t', 'renew-1', 0, 0.7);
--- request
POST /t
x
--- more_headers
Idempotency-Key: renew-1
--- error_code: 409
--- wait eval: 2 * $::Slow
--- grep_error_log: EXEC POST /backend renew-1
--- grep_error_log_out
EXEC POST /backend renew-1
--- no_error_log
was lost



=== TEST 6a: a renewal Redis refuses is logged with the reason
An ACL user that may claim (SET) but not run the scripts: the claim is
made, each renewal gets NOPERM, and the worker says so.  The request goes
once the worker's connection is through its handshake (the claim is the
claim script before, which works on every server but which this user may
not run).  Skipped before Redis 7.0: there the claim is always a script
(no SET ... NX GET).
--- http_config eval
qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      user=norenew password=n0renew
                      prefix=$ENV{TEST_NGINX_PREFIX};
}
--- config
    location = /t {
        idempotency on;
        idempotency_lock_ttl 300ms;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        limit_rate $TEST_NGINX_RATE;
        return 201 "slow done\n";
    }
--- skip_eval: 2: !$ENV{TEST_NGINX_REDIS_CTL} || main::redis_older(7, 0)
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL} || main::redis_older(7, 0);
my $log = "$ENV{TEST_NGINX_SERVER_ROOT}/logs/error.log";
my $end = time() + 10 * $main::Slow;
until (time() > $end) {
    open my $fh, '<', $log or last;
    last if grep { /idempotency redis: "[^"]+" ready/ } <$fh>;
    select(undef, undef, undef, 0.05);
}
--- request
POST /t
x
--- more_headers
Idempotency-Key: renew-noperm-1
--- error_code: 201
--- wait eval: 0.5 * $::Slow
--- error_log eval
qr/renewing the claim on key_hash=${\ main::key_hash('renew-noperm-1')} failed: NOPERM/


=== TEST 7: a claim lost in Redis is not overwritten by its late owner
--- skip_eval: 4: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config
    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        limit_rate $TEST_NGINX_RATE;
        return 201 "slow done\n";
    }
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
use Digest::SHA ();
main::first_request('/t', 'fence-1');
# the claim disappears (as after an eviction or a Redis without
# persistence restarting): the duplicate claims the key anew.  Wait until
# the first request's claim is there (a loaded machine can take longer
# than first_request's half second).
my $rkey = $ENV{TEST_NGINX_PREFIX} . Digest::SHA::sha256_hex('test:')
           . ':fence-1';
for (1 .. 100) {
    last if main::redis_cli('EXISTS', $rkey) =~ /1/;
    select(undef, undef, undef, 0.05);
}
main::redis_cli('DEL', $rkey);
--- request
POST /t
x
--- more_headers
Idempotency-Key: fence-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- wait eval: 1 * $::Slow
--- error_log eval
qr/the claim on key_hash=${\ main::key_hash('fence-1')} was lost/
