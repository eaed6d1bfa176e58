# Read-after-complete, made certain: the first request's Redis commands
# (its claim, then its store or release) go through a proxy that holds
# them for 300 ms, while the retry goes straight to Redis through another
# server.  A client that has read the whole response by its framing (the
# end of a header-only response's header, or the last byte an announced
# Content-Length counts; not the connection's close) and retries at once
# must get the replay (or, after a release, a fresh run), never a 409:
# the end of the response waits for Redis to acknowledge.
#
# The roads: a 204 (the header is all), a Content-Length body through the
# event pipe and unbuffered, over HTTP/1.1 and 1.0, a 429 that releases,
# and an over-size response spooled to a temporary file and sent from it
# (sendfile), whose last byte is read back from the file.

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use DelayProxy;
use IO::Socket::INET;

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t154-$$-" . time() . ":";

our ($ProxyPid, $ProxyPort) =
    DelayProxy::start($ENV{TEST_NGINX_REDIS_PORT}, 0.3);

END { DelayProxy::stop($ProxyPid) if $ProxyPid && $$ != $ProxyPid; }

# the server whose Redis is slow
our $SlowPort = free_tcp_port();

our $Body = join '', map { sprintf "line %05d %s\n", $_, '.' x 40 } 1 .. 1500;

# the same locations on both servers; $r: which Redis
sub locations {
    my ($server_port) = @_;
    return qq{
        location = /204 {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$server_port/b/204;
        }

        location = /len {
            idempotency on;
            idempotency_scope "t";
            proxy_method GET;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$server_port/b/body.txt;
        }

        location = /len-unbuffered {
            idempotency on;
            idempotency_scope "t";
            proxy_method GET;
            proxy_buffering off;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$server_port/b/body.txt;
        }

        location = /429 {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$server_port/b/429;
        }

        location = /spooled {
            idempotency on;
            idempotency_scope "t";
            idempotency_max_response_size 1k;
            proxy_method GET;
            proxy_buffer_size 4k;
            proxy_buffers 4 4k;
            sendfile on;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$server_port/b/body.txt;
        }
    };
}

our $HttpConfig = qq~
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX} timeout=5s;

    server {
        listen 127.0.0.1:$SlowPort;
        idempotency_redis 127.0.0.1:$ProxyPort
                          prefix=$ENV{TEST_NGINX_PREFIX} timeout=5s;
~ . locations('$TEST_NGINX_SERVER_PORT') . "\n    }\n";

our $Config = locations('$TEST_NGINX_SERVER_PORT') . q{
        location /b/ {
            access_log logs/error.log exec;
            alias html/;

            location = /b/204 { return 204; }
            location = /b/429 { return 429 "slow down\n"; }
        }
};

# One request, read by its framing only (never waiting for the close):
# the header, then as many body bytes as Content-Length says.  Returns
# "status idempotency-status body-length".
sub ask {
    my ($port, $uri, $key, $proto) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Timeout => 10 * $Slow)
        or die "connect: $!\n";
    print $s "POST $uri $proto\r\nHost: localhost\r\n"
             . "Idempotency-Key: $key\r\nContent-Length: 1\r\n\r\nx";
    my $raw = '';
    my ($head, $len);
    while (1) {
        if (!defined $head && $raw =~ /\r\n\r\n/) {
            ($head, $raw) = split /\r\n\r\n/, $raw, 2;
            ($len) = $head =~ /^Content-Length: (\d+)/mi;
            $len //= 0;
        }
        last if defined $head && length($raw) >= $len;
        my $n = sysread($s, my $buf, 262144);
        last unless $n;
        $raw .= $buf;
    }
    my ($status) = ($head // '') =~ m{^HTTP/\S+ (\d+)};
    my ($st) = ($head // '') =~ m{^X-Idempotency-Status: (\S+)}mi;
    # the socket stays open until the retry was answered
    return ("@{[ $status // 0 ]} @{[ $st // '' ]} " . length($raw), $s);
}

# first on the slow server, read to the last byte, retry at once on the
# fast one
sub first_and_retry {
    my ($uri, $key, $proto) = @_;
    my ($first, $s1) = ask($SlowPort, $uri, $key, $proto);
    my ($retry, $s2) = ask($ENV{TEST_NGINX_SERVER_PORT}, $uri, $key, $proto);
    close $s1;
    close $s2;
    return ($first, $retry);
}


no_shuffle();
run_tests();

__DATA__

=== TEST 1: 204: a client that has the header retries at once and gets the replay (HTTP/1.1 and 1.0)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
for my $proto ('HTTP/1.1', 'HTTP/1.0') {
    my ($first, $retry) = main::first_and_retry('/204', "h-$proto", $proto);
    Test::More::is($first, '204 MISS 0', "$proto: first");
    Test::More::is($retry, '204 HIT 0', "$proto: the retry at once replays");
}
--- request
GET /b/429
--- error_code: 429



=== TEST 2: Content-Length body: a client that counted the last byte retries at once and gets the replay
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- user_files eval
[["body.txt", $::Body]]
--- init
my $n = length $::Body;
for my $uri ('/len', '/len-unbuffered') {
    for my $proto ('HTTP/1.1', 'HTTP/1.0') {
        my ($first, $retry) =
            main::first_and_retry($uri, "l-$uri-$proto", $proto);
        Test::More::is($first, "200 MISS $n", "$uri $proto: first");
        Test::More::is($retry, "200 HIT $n",
                       "$uri $proto: the retry at once replays");
    }
}
--- request
GET /b/429
--- error_code: 429



=== TEST 3: 429 releases: a client that has it retries at once and runs again
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
my ($first, $retry) = main::first_and_retry('/429', 'r-1', 'HTTP/1.1');
Test::More::is($first, '429 MISS 10', 'first');
Test::More::is($retry, '429 MISS 10', 'the retry at once runs again');
--- request
GET /b/429
--- error_code: 429



=== TEST 4: an over-size response spooled to a temporary file and sent from it: the retry at once gets the over-size answer, not 409
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- user_files eval
[["body.txt", $::Body]]
--- init
my $n = length $::Body;
my ($first, $retry) = main::first_and_retry('/spooled', 's-1', 'HTTP/1.1');
Test::More::is($first, "200 MISS $n", 'first, sent from the temporary file');
Test::More::like($retry, qr/^\d+ OVERSIZE /,
                 "the retry at once gets the over-size answer ($retry)");
--- request
GET /b/429
--- error_code: 429
--- no_error_log
[alert]
