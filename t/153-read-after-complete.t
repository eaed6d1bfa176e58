# Read-after-complete: a client that has received the whole response and
# retries at once gets the replay, never a 409; after a response that
# releases the claim (429) it gets a fresh run, never a 409.  The last
# bytes of a response go out only once Redis acknowledged the store (or
# the release).
#
# Two workers, so that the retry may be claimed on another Redis connection
# than the one the store goes on (with one worker both share a pipelined
# connection and are applied in order anyway), and large responses, whose
# store takes Redis a while to read.

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use IO::Socket::INET;

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t153-$$-" . time() . ":";

master_on();
workers(2);

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

our $Config = q{
        location = /big {
            idempotency on;
            idempotency_scope "t";
            idempotency_max_response_size 4m;
            proxy_method GET;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/big.bin;
        }

        location = /r429 {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/429;
        }

        location /b/ {
            access_log logs/error.log exec;
            alias html/;

            location = /b/429 { return 429 "slow down\n"; }
        }
};

# 3 MB
our $Big = join '', map { sprintf "line %06d %s\n", $_, '.' x 50 } 1 .. 50000;

# One request on its own connection, read to its end; returns the status,
# $idempotency_status and the body length.
sub post {
    my ($uri, $key) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
                                  Timeout => 10 * $Slow)
        or die "connect: $!\n";
    print $s "POST $uri HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
             . "Idempotency-Key: $key\r\nContent-Length: 1\r\n\r\nx";
    my $raw = '';
    while (sysread($s, my $buf, 262144)) {
        $raw .= $buf;
    }
    close $s;
    my ($head, $body) = split /\r\n\r\n/, $raw, 2;
    my ($status) = ($head // '') =~ m{^HTTP/\S+ (\d+)};
    my ($st) = ($head // '') =~ m{^X-Idempotency-Status: (\S+)}mi;
    return ($status // 0, $st // '', length($body // ''));
}


no_shuffle();
run_tests();

__DATA__

=== TEST 1: a client that has the whole response (3 MB) and retries at once gets the replay, every time
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- user_files eval
[["big.bin", $::Big]]
--- init
my @got;
for my $i (1 .. 8) {
    my $k = "rac-$i";
    my @first = main::post('/big', $k);
    Test::More::is("@first", "200 MISS " . length($::Big), "$k: first");
    push @got, join ' ', main::post('/big', $k);
}
Test::More::is_deeply(\@got, [("200 HIT " . length($::Big)) x 8],
                      'each retry at once is a replay');
--- request
GET /b/429
--- error_code: 429



=== TEST 2: after a response that releases the claim (429), a retry at once runs again, every time
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
my @got;
for my $i (1 .. 8) {
    my $k = "rel-$i";
    main::post('/r429', $k);
    push @got, join ' ', (main::post('/r429', $k))[0, 1];
}
Test::More::is_deeply(\@got, [('429 MISS') x 8],
                      'each retry at once runs again');
--- request
GET /b/429
--- error_code: 429
