# HTTP/2 behaves exactly like HTTP/1.1: same claim, same fingerprint (also
# for bodies spooled to a file and bodies without Content-Length), same
# replay, same problems.
#
# Test::Nginx's own HTTP/2 mode needs nginx 1.25 ("http2 on;"), so the
# HTTP/2 requests are made with curl from "--- init" against a second
# server ("listen ... http2", nginx 1.22 syntax) that has the same
# locations, and asserted there with Test::More.  The block's own request
# is an HTTP/1.1 cross-check against the same records.  The HTTP/2 port is
# $TEST_NGINX_RAND_PORT_1; init reads it back from the generated nginx.conf
# (the real Test::Nginx substitutes it in the config but does not export it).

BEGIN {
    my $nginx = $ENV{TEST_NGINX_BINARY} || 'nginx';
    my $curl_v = `curl -V 2>/dev/null` // '';
    my $nginx_v = `'$nginx' -V 2>&1` // '';
    my $why = $curl_v eq ''                          ? 'curl is not installed'
            : $curl_v !~ /^Features:.*\bHTTP2\b/m    ? 'curl lacks HTTP/2'
            : $nginx_v !~ /--with-http_v2_module\b/   ? 'nginx lacks HTTP/2'
            : undef;
    if ($why) {
        require Test::More;
        Test::More::plan(skip_all => $why);
    }
}

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use IO::Socket::INET;
use POSIX ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t080-$$-" . time() . ":";

our $Rate = int(80 / $Slow);
$ENV{TEST_NGINX_RATE} = $Rate;

# the protected locations, in both servers
our $Locations = q{
        location = /t {
            idempotency on;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
        }

        location = /unbuffered {
            idempotency on;
            proxy_request_buffering off;
            proxy_http_version 1.1;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
        }

        location = /busy {
            idempotency on;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
        }

        location = /wait {
            idempotency on;
            idempotency_wait 60s;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
        }
};

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};

    # bodies over 1k go to a temporary file, over HTTP/2 and HTTP/1.1 alike
    client_body_buffer_size 1k;

    server {
        listen 127.0.0.1:\$TEST_NGINX_RAND_PORT_1 http2;
        server_name h2;
        client_max_body_size 30M;
$Locations
    }
};

our $Config = $Locations . q{
        location = /backend {
            access_log logs/error.log exec;
            return 201 "got $content_length bytes\n";
        }

        # about 2 s for the response (limit_rate counts the header too)
        location = /slow {
            access_log logs/error.log exec;
            limit_rate $TEST_NGINX_RATE;
            return 201 "slow done\n";
        }
};

our $Small = '{"amount":100}';
our $Spooled = 'x' x 20000;

# the port of the HTTP/2 server, from the nginx.conf of this block
sub h2_port {
    my $conf = "$ENV{TEST_NGINX_SERVER_ROOT}/conf/nginx.conf";
    open my $in, '<', $conf or die "$conf: $!\n";
    local $/;
    my $text = <$in>;
    $text =~ /listen\s+127\.0\.0\.1:(\d+)\s+http2\s*;/
        or die "no http2 listen in $conf\n";
    return $1;
}

# One HTTP/2 request with curl (prior knowledge: h2c without Upgrade).
#   h2(path => '/t', key => 'k1', body => '...', stream => 1, headers => [...])
# stream: send the body from stdin, so curl does not know its length and
# sends no Content-Length.  Returns { proto, status, headers => {lc name =>
# [values]}, body, raw }.
sub h2 {
    my (%o) = @_;
    my $file = "$ENV{TEST_NGINX_SERVER_ROOT}/h2-body.$$";
    my @cmd = ('curl', '-sS', '--http2-prior-knowledge', '-i',
               '--max-time', 15 * $main::Slow, '-X', $o{method} // 'POST');
    push @cmd, '-H', "Idempotency-Key: $o{key}" if defined $o{key};
    push @cmd, '-H', $_ for @{ $o{headers} || [] };

    if (defined $o{body}) {
        open my $out, '>:raw', $file or die "$file: $!\n";
        print $out $o{body};
        close $out;
        push @cmd, $o{stream} ? ('-T', '-') : ('--data-binary', "\@$file");
    }
    push @cmd, 'http://127.0.0.1:' . h2_port() . $o{path};

    my $pid = open(my $from, '-|');
    die "fork: $!\n" unless defined $pid;
    if ($pid == 0) {
        open STDIN, '<', $o{stream} ? $file : '/dev/null';
        open STDERR, '>&', \*STDOUT;
        exec { $cmd[0] } @cmd or POSIX::_exit(127);
    }
    binmode $from;
    my $raw = do { local $/; <$from> } // '';
    close $from;
    unlink $file;

    my %res = (raw => $raw, headers => {});
    my ($head, $body) = split /\r\n\r\n/, $raw, 2;
    my ($status, @lines) = split /\r\n/, $head // '';
    @res{qw(proto status)} = ($status // '') =~ m{^(HTTP/\S+) (\d+)};
    for (@lines) {
        push @{ $res{headers}{lc $1} }, $2 if /^([^:]+):\s*(.*?)\s*$/;
    }
    $res{body} = $body // '';
    return \%res;
}

# asserts the parts of an HTTP/2 response that are named in %want:
# status, body (string or qr), headers => { name => value or undef (absent) }
sub h2_is {
    my ($label, $res, %want) = @_;
    Test::More::is($res->{proto}, 'HTTP/2', "$label - answered over HTTP/2")
        or Test::More::diag($res->{raw});
    Test::More::is($res->{status}, $want{status}, "$label - status");
    if (defined $want{body}) {
        if (ref $want{body}) {
            Test::More::like($res->{body}, $want{body}, "$label - body");
        } else {
            Test::More::is($res->{body}, $want{body}, "$label - body");
        }
    }
    for my $name (sort keys %{ $want{headers} || {} }) {
        my $got = $res->{headers}{lc $name};
        my $val = $want{headers}{$name};
        if (defined $val) {
            Test::More::is($got ? join(', ', @$got) : undef, $val,
                           "$label - header $name");
        } else {
            Test::More::ok(!$got, "$label - no header $name");
        }
    }
}


no_shuffle();
run_tests();

__DATA__

=== TEST 1: an HTTP/2 POST with a body runs once and is recorded; its HTTP/1.1 retry replays it
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::h2_is('h2 first', main::h2(path => '/t', key => 'h2-1', body => $::Small),
    status => 201, body => "got 14 bytes\n",
    headers => { 'X-Idempotency-Status' => 'MISS',
                 'Idempotent-Replayed' => undef });
--- request eval
"POST /t\n$::Small"
--- more_headers
Idempotency-Key: h2-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
X-Idempotency-Status: HIT
--- response_body
got 14 bytes
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 2: an HTTP/2 retry is replayed: same status and body, Idempotent-Replayed, upstream not called
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::h2_is('h2 retry', main::h2(path => '/t', key => 'h2-1', body => $::Small),
    status => 201, body => "got 14 bytes\n",
    headers => { 'Idempotent-Replayed' => 'true',
                 'X-Idempotency-Status' => 'HIT',
                 'Content-Type' => 'text/plain',
                 'Content-Length' => 13 });
--- request eval
"POST /t\n$::Small"
--- more_headers
Idempotency-Key: h2-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
got 14 bytes
--- no_error_log
EXEC



=== TEST 3: an HTTP/2 request with the same key and another body is a 422 mismatch
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::h2_is('h2 mismatch',
    main::h2(path => '/t', key => 'h2-1', body => '{"amount":999}'),
    status => 422,
    body => qr/\A\{[^{}]*"type":"urn:ngx-idempotency:key-reused"[^{}]*\}\n?\z/,
    headers => { 'Content-Type' => 'application/problem+json',
                 'X-Idempotency-Status' => 'MISMATCH' });
--- request
POST /t
{"amount":999}
--- more_headers
Idempotency-Key: h2-1
--- error_code: 422
--- response_headers
Content-Type: application/problem+json
--- no_error_log
EXEC



=== TEST 4: an HTTP/1.1 POST runs and is recorded
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request eval
"POST /t\n$::Small"
--- more_headers
Idempotency-Key: h1-1
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 5: an HTTP/2 retry of an HTTP/1.1 request is replayed
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::h2_is('h2 retry of h1', main::h2(path => '/t', key => 'h1-1', body => $::Small),
    status => 201, body => "got 14 bytes\n",
    headers => { 'Idempotent-Replayed' => 'true' });
--- request eval
"POST /t\n$::Small"
--- more_headers
Idempotency-Key: h1-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- no_error_log
EXEC



=== TEST 6: an HTTP/2 body spooled to a temporary file is fingerprinted like the same body over HTTP/1.1
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::h2_is('h2 spooled', main::h2(path => '/t', key => 'h2-spool', body => $::Spooled),
    status => 201, body => "got 20000 bytes\n",
    headers => { 'X-Idempotency-Status' => 'MISS' });
--- request eval
"POST /t\n$::Spooled"
--- more_headers
Idempotency-Key: h2-spool
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
got 20000 bytes
--- error_log eval
qr{a client request body is buffered to a temporary file .*request: "POST /t HTTP/2\.0"}
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend



=== TEST 7: an HTTP/2 body without Content-Length fingerprints like the same bytes sent with one
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::h2_is('h2 streamed',
    main::h2(path => '/t', key => 'h2-spool', body => $::Spooled, stream => 1),
    status => 201, body => "got 20000 bytes\n",
    headers => { 'Idempotent-Replayed' => 'true' });
--- request eval
"POST /t\n$::Spooled"
--- more_headers
Idempotency-Key: h2-spool
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- error_log eval
qr{a client request body is buffered to a temporary file .*request: "POST /t HTTP/2\.0"}
--- no_error_log
EXEC
http2 header: "content-length:



=== TEST 8: a spooled HTTP/2 body that differs in its last byte is a mismatch
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::h2_is('h2 spooled mismatch',
    main::h2(path => '/t', key => 'h2-spool', body => ('x' x 19999) . 'y'),
    status => 422, headers => { 'X-Idempotency-Status' => 'MISMATCH' });
--- request eval
"POST /t\n" . ('x' x 19999) . 'y'
--- more_headers
Idempotency-Key: h2-spool
--- error_code: 422
--- no_error_log
EXEC



=== TEST 9: an invalid key over HTTP/2 is a 400 invalid-key problem
# No body over HTTP/2 here and in TEST 10: an answer given before the body
# arrived ends the stream with RST_STREAM(NO_ERROR) (RFC 9113 8.1), and
# curl 7.88 then sometimes fails with "(92) Stream error in the HTTP/2
# framing layer" - as for a plain "return 400", not the module's doing.
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::h2_is('h2 invalid key',
    main::h2(path => '/t', key => '"open-quote'),
    status => 400,
    body => qr/\A\{[^{}]*"type":"urn:ngx-idempotency:invalid-key"[^{}]*\}\n?\z/,
    headers => { 'Content-Type' => 'application/problem+json',
                 'X-Idempotency-Status' => 'INVALID' });
--- request eval
"POST /t\n$::Small"
--- more_headers
Idempotency-Key: "open-quote
--- error_code: 400
--- response_headers
X-Idempotency-Status: INVALID
--- no_error_log
EXEC



=== TEST 10: a key sent twice over HTTP/2 is a 400
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::h2_is('h2 key twice',
    main::h2(path => '/t', key => 'h2-twice',
             headers => ['Idempotency-Key: h2-twice']),
    status => 400, headers => { 'X-Idempotency-Status' => 'INVALID' });
--- request eval
"POST /t\n$::Small"
--- more_headers
Idempotency-Key: h2-twice
Idempotency-Key: h2-twice
--- error_code: 400
--- no_error_log
EXEC



=== TEST 11: with idempotency_wait, an HTTP/2 duplicate of a running request waits and gets the replay
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::first_request('/wait', 'h2-wait-1');
main::h2_is('h2 waiting duplicate',
    main::h2(path => '/wait', key => 'h2-wait-1', body => 'x'),
    status => 201, body => "slow done\n",
    headers => { 'Idempotent-Replayed' => 'true',
                 'X-Idempotency-Status' => 'HIT' });
--- request
POST /wait
x
--- more_headers
Idempotency-Key: h2-wait-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
slow done
--- grep_error_log: EXEC POST /slow
--- grep_error_log_out
EXEC POST /slow



=== TEST 12: an HTTP/2 duplicate of a running request gets a 409 problem with Retry-After
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::first_request('/busy', 'h2-busy-1');
main::h2_is('h2 duplicate',
    main::h2(path => '/busy', key => 'h2-busy-1', body => 'x'),
    status => 409,
    body => qr/\A\{[^{}]*"type":"urn:ngx-idempotency:request-in-progress"[^{}]*\}\n?\z/,
    headers => { 'Retry-After' => 1,
                 'Content-Type' => 'application/problem+json',
                 'X-Idempotency-Status' => 'CONFLICT' });
--- request
POST /busy
x
--- more_headers
Idempotency-Key: h2-busy-1
--- error_code: 409
--- response_headers
Retry-After: 1
--- wait eval: 3 * $::Slow
--- grep_error_log: EXEC POST /slow
--- grep_error_log_out
EXEC POST /slow



=== TEST 13: proxy_request_buffering off: an HTTP/2 body without Content-Length reaches the upstream whole, with its length, once
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::h2_is('h2 unbuffered',
    main::h2(path => '/unbuffered', key => 'h2-unbuffered', body => $::Spooled,
             stream => 1),
    status => 201, body => "got 20000 bytes\n",
    headers => { 'X-Idempotency-Status' => 'MISS' });
--- request eval
"POST /unbuffered\n$::Spooled"
--- more_headers
Idempotency-Key: h2-unbuffered
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
got 20000 bytes
--- grep_error_log: EXEC POST /backend
--- grep_error_log_out
EXEC POST /backend
