# Scopes: an empty scope is never a namespace shared by the clients it
# cannot tell apart (cookie sessions, anonymous clients: 400 UNSCOPED),
# a constant scope is the explicit shared namespace, and
# idempotency_scope_secret keys the scope hash (HMAC-SHA-256) so that
# Redis key names reveal nothing testable about credentials, while replays
# work across a reload and on a second nginx reading the same file.
#
# The secret lives in a directory of this test run, outside the server
# root (which the runner wipes when it restarts nginx).

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use Digest::SHA ();
use File::Path ();
use IO::Socket::INET ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t160-$$-" . time() . ":";

our $SecretDir = "/tmp/t160-secret-$$";
our $Secret = "s3cret-for-t160-" . time() . "\n";   # a trailing newline
File::Path::make_path($SecretDir);
{
    open my $fh, '>', "$SecretDir/scope.key" or die "$SecretDir: $!";
    print $fh $Secret;
    close $fh;
}
END { File::Path::remove_tree($SecretDir) if $SecretDir }

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

our $Config = qq{
    # the default scope, \$http_authorization: empty without the header
    location = /default {
        idempotency on;
        add_header X-Idempotency-Status \$idempotency_status always;
        proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/backend;
    }

    # cookie sessions: the session is the scope
    location = /session {
        idempotency on;
        idempotency_scope \$cookie_session;
        add_header X-Idempotency-Status \$idempotency_status always;
        proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/backend;
    }

    # a deliberate shared namespace: a constant
    location = /hooks {
        idempotency on;
        idempotency_scope hooks;
        add_header X-Idempotency-Status \$idempotency_status always;
        proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /secret {
        idempotency on;
        idempotency_scope_secret $SecretDir/scope.key;
        add_header X-Idempotency-Status \$idempotency_status always;
        proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created for session=\$cookie_session \$request_id\\n";
    }
};

# the Redis keys of this run
sub rkeys {
    return split /\n/, main::redis_cli('--scan', '--pattern',
                                       "$ENV{TEST_NGINX_PREFIX}*");
}

# the nginx pid of the running test server
sub nginx_pid {
    my $pidfile = "$ENV{TEST_NGINX_SERVER_ROOT}/logs/nginx.pid";
    open my $fh, '<', $pidfile or die "no $pidfile: $!";
    my $pid = <$fh>;
    chomp $pid;
    return $pid;
}

sub http_post {
    my ($port, $uri, $key, $auth) = @_;
    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                     PeerPort => $port, Timeout => 10)
        or return '';
    print $sock "POST $uri HTTP/1.1\r\nHost: localhost\r\n"
                . "Idempotency-Key: $key\r\nAuthorization: $auth\r\n"
                . "Content-Length: 1\r\nConnection: close\r\n\r\nx";
    local $/;
    my $resp = <$sock>;
    return $resp // '';
}

# A second nginx (own prefix, configuration and port) reading the same
# secret file; returns its pid and port.
sub start_node {
    my $dir = "$SecretDir/node2";
    File::Path::make_path("$dir/logs", "$dir/conf");
    my $port = Test::Nginx::Socket::free_port()
        if defined &Test::Nginx::Socket::free_port;
    $port //= 20000 + int rand(20000);
    my $mods = join '', map { "load_module $_;\n" }
                        split ' ', $ENV{TEST_NGINX_LOAD_MODULES} // '';
    open my $fh, '>', "$dir/conf/nginx.conf" or die $!;
    print $fh <<"EOF";
$mods
daemon on;
master_process on;
worker_processes 1;
error_log $dir/logs/error.log info;
pid $dir/logs/nginx.pid;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path $dir/client_body_temp;
    proxy_temp_path $dir/proxy_temp;
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
    server {
        listen 127.0.0.1:$port;
        location = /secret {
            idempotency on;
            idempotency_scope_secret $SecretDir/scope.key;
            proxy_pass http://127.0.0.1:$port/ran;
        }
        location = /ran {
            return 500 "node 2 ran the request\\n";
        }
    }
}
EOF
    close $fh;
    my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
    ($bin) = grep { -x } map { "$_/$bin" } split(/:/, $ENV{PATH}), '/usr/sbin'
        unless $bin =~ m{/};
    system($bin, '-p', "$dir/", '-c', "$dir/conf/nginx.conf") == 0
        or die "the second nginx did not start";
    for (1 .. 100) {
        last if IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                      PeerPort => $port);
        select(undef, undef, undef, 0.1);
    }
    open my $pf, '<', "$dir/logs/nginx.pid" or die "no pid file: $!";
    my $pid = <$pf>;
    chomp $pid;
    return ($pid, $port);
}

master_on();     # reloads (HUP) need a master process
no_shuffle();
run_tests();

__DATA__

=== TEST 1: a cookie session without Authorization: a key gets 400 UNSCOPED, nothing runs
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /default
{"amount":1}
--- more_headers
Idempotency-Key: shared-1
Cookie: session=alice
--- error_code: 400
--- response_headers
X-Idempotency-Status: UNSCOPED
Content-Type: application/problem+json
--- response_body_like: "type":"urn:ngx-idempotency:missing-scope".*"status":400
--- error_log
has an empty idempotency_scope, refused with 400 (UNSCOPED)
--- no_error_log
EXEC POST



=== TEST 2: another cookie with the same key and body never gets the first one's response
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /default
{"amount":1}
--- more_headers
Idempotency-Key: shared-1
Cookie: session=mallory
--- error_code: 400
--- response_headers
X-Idempotency-Status: UNSCOPED
!Idempotent-Replayed
--- response_body_unlike: alice
--- no_error_log
EXEC POST



=== TEST 3: the empty-scope warning is rate limited: one line for many requests
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::first_request('/default', 'shared-2', 0, 0.2);
main::first_request('/default', 'shared-3', 0, 0.2);
--- request
POST /default
x
--- more_headers
Idempotency-Key: shared-4
--- error_code: 400
--- grep_error_log: refused with 400 (UNSCOPED)
--- grep_error_log_out
refused with 400 (UNSCOPED)



=== TEST 4: without a key the empty scope does not matter: BYPASS
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /default
x
--- error_code: 201
--- response_headers
X-Idempotency-Status: BYPASS



=== TEST 5: scoped by the session cookie: alice's request runs
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /session
{"amount":1}
--- more_headers
Idempotency-Key: cookie-1
Cookie: session=alice
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- response_body_like: ^created for session=alice
--- grep_error_log: EXEC POST /backend cookie-1
--- grep_error_log_out
EXEC POST /backend cookie-1



=== TEST 6: mallory with the same key and body runs her own request, never alice's
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /session
{"amount":1}
--- more_headers
Idempotency-Key: cookie-1
Cookie: session=mallory
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
!Idempotent-Replayed
--- response_body_like: ^created for session=mallory
--- grep_error_log: EXEC POST /backend cookie-1
--- grep_error_log_out
EXEC POST /backend cookie-1



=== TEST 7: alice's retry gets her replay
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /session
{"amount":1}
--- more_headers
Idempotency-Key: cookie-1
Cookie: session=alice
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
Idempotent-Replayed: true
--- response_body_like: ^created for session=alice
--- no_error_log
EXEC POST



=== TEST 8: a constant scope is a deliberate shared namespace: the first client's request runs
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /hooks
{"event":1}
--- more_headers
Idempotency-Key: delivery-1
Cookie: session=provider
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS



=== TEST 9: ... and any client with the same key and body gets its replay
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /hooks
{"event":1}
--- more_headers
Idempotency-Key: delivery-1
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
--- response_body_like: ^created for session=provider
--- no_error_log
EXEC POST



=== TEST 10: with idempotency_scope_secret the request runs and is recorded
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /secret
x
--- more_headers
Idempotency-Key: secret-1
Authorization: Basic YWxpY2U6cGFzc3dvcmQ=
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- grep_error_log: EXEC POST /backend secret-1
--- grep_error_log_out
EXEC POST /backend secret-1



=== TEST 11: no Redis key holds the plain SHA-256 of the credential, only its HMAC under the secret (newline trimmed)
--- skip_eval: 4: !$ENV{TEST_NGINX_REDIS_CTL}
--- init
my @keys = main::rkeys();
my $cred = 'Basic YWxpY2U6cGFzc3dvcmQ=';
my $plain = Digest::SHA::sha256_hex($cred);
(my $secret = $::Secret) =~ s/\n\z//;
my $hmac = Digest::SHA::hmac_sha256_hex($cred, $secret);
Test::More::is(scalar(grep { /\Q$plain\E/ } @keys), 0,
               'no key names the plain SHA-256 of the credential');
Test::More::is(scalar(grep { $_ eq "$ENV{TEST_NGINX_PREFIX}$hmac:secret-1" }
                      @keys), 1,
               'the record is named by HMAC-SHA-256(secret, scope)');
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /secret
x
--- more_headers
Idempotency-Key: secret-1
Authorization: Basic YWxpY2U6cGFzc3dvcmQ=
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT



=== TEST 12: the replay still works after a reload (the file is read again)
# no configuration: the nginx of the block before, which runs already
--- skip_eval: 3: $ENV{TEST_NGINX_USE_VALGRIND}
--- init
kill 'HUP', main::nginx_pid() or die "cannot HUP: $!";
select(undef, undef, undef, 1.5 * $main::Slow);
--- request
POST /secret
x
--- more_headers
Idempotency-Key: secret-1
Authorization: Basic YWxpY2U6cGFzc3dvcmQ=
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
--- no_error_log
EXEC POST



=== TEST 13: a second nginx reading the same secret file replays the first one's record
--- skip_eval: 5: $ENV{TEST_NGINX_USE_VALGRIND}
--- init
my ($pid, $port) = main::start_node();
my $resp = main::http_post($port, '/secret', 'secret-1',
                           'Basic YWxpY2U6cGFzc3dvcmQ=');
kill 'QUIT', $pid;
for (1 .. 50) { last unless kill 0, $pid; select(undef, undef, undef, 0.1) }
Test::More::like($resp, qr{^HTTP/1\.1 201 }, 'node 2: the stored status');
Test::More::like($resp, qr/\r\nIdempotent-Replayed: true\r\n/i,
                 'node 2: a replay');
Test::More::unlike($resp, qr/node 2 ran/, 'node 2: nothing ran there');
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /secret
x
--- more_headers
Idempotency-Key: secret-1
Authorization: Basic YWxpY2U6cGFzc3dvcmQ=
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT



=== TEST 14: a rotated secret is a new namespace: records of the old one are not found, the request runs
--- skip_eval: 3: $ENV{TEST_NGINX_USE_VALGRIND}
--- init
open my $fh, '>', "$::SecretDir/scope.key" or die $!;
print $fh "another-secret\n";
close $fh;
kill 'HUP', main::nginx_pid() or die "cannot HUP: $!";
select(undef, undef, undef, 1.5 * $main::Slow);
--- request
POST /secret
x
--- more_headers
Idempotency-Key: secret-1
Authorization: Basic YWxpY2U6cGFzc3dvcmQ=
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- grep_error_log: EXEC POST /backend secret-1
--- grep_error_log_out
EXEC POST /backend secret-1



=== TEST 15: a missing secret file is an error naming the file and the directive
--- config
    location = /t {
        idempotency_scope_secret /nonexistent/t160/scope.key;
    }
--- must_die
--- error_log
open() "/nonexistent/t160/scope.key" named by "idempotency_scope_secret" failed



=== TEST 16: an empty secret file (a newline alone) is an error
--- user_files
>>> empty.key

--- config
    location = /t {
        idempotency_scope_secret ../html/empty.key;
    }
--- must_die
--- error_log
empty.key" named by "idempotency_scope_secret" is empty



=== TEST 17: a relative path is taken from the configuration's directory, and the secret is inherited
--- http_config eval
$::HttpConfig . "    idempotency_scope_secret ../html/rel.key;\n"
--- user_files
>>> rel.key
relative-secret
--- config
    location = /t {
        idempotency on;
        idempotency_scope "tenant-a";
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 201 "ok\n";
    }
--- request
POST /t
x
--- more_headers
Idempotency-Key: rel-1
--- error_code: 201



=== TEST 18: the inherited secret named the record (HMAC of "tenant-a")
--- skip_eval: 2: !$ENV{TEST_NGINX_REDIS_CTL}
--- init
my $hmac = Digest::SHA::hmac_sha256_hex('tenant-a', 'relative-secret');
my @keys = main::rkeys();
Test::More::is(scalar(grep { $_ eq "$ENV{TEST_NGINX_PREFIX}$hmac:rel-1" }
                      @keys), 1, 'keyed by the inherited secret');
--- config
    location = /t {
        return 204;
    }
--- request
GET /t
--- error_code: 204



=== TEST 19: one credential without the secret, then with it: two namespaces (a worker's last scope hash is kept with the secret it was keyed by)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request eval
["POST /default\nx", "POST /secret\nx", "POST /default\nx"]
--- more_headers eval
["Idempotency-Key: memo-1\nAuthorization: Bearer memo-credential",
 "Idempotency-Key: memo-1\nAuthorization: Bearer memo-credential",
 "Idempotency-Key: memo-1\nAuthorization: Bearer memo-credential"]
--- error_code eval
[201, 201, 201]
--- response_headers eval
["X-Idempotency-Status: MISS", "X-Idempotency-Status: MISS",
 "X-Idempotency-Status: HIT"]



=== TEST 20: scopes of the same length one after another stay apart, and each one's retry finds its own record
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request eval
["POST /default\nx", "POST /default\nx", "POST /default\nx",
 "POST /default\nx"]
--- more_headers eval
["Idempotency-Key: memo-2\nAuthorization: Bearer aaaa",
 "Idempotency-Key: memo-2\nAuthorization: Bearer aaab",
 "Idempotency-Key: memo-2\nAuthorization: Bearer aaaa",
 "Idempotency-Key: memo-2\nAuthorization: Bearer aaab"]
--- error_code eval
[201, 201, 201, 201]
--- response_headers eval
["X-Idempotency-Status: MISS", "X-Idempotency-Status: MISS",
 "X-Idempotency-Status: HIT", "X-Idempotency-Status: HIT"]
