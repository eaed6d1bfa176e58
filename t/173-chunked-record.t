# A split record's body is stored in chunks of 1 MiB ("<body key>:0", ":1"
# ...), written from the captured response (the store takes it over from
# the request, no copy) with at most two chunks queued at once, and read
# back one chunk per command for a replay.  Small enough (3 MiB plus a
# byte) to run under valgrind and ASan, where t/171's 60 MB are not run.
# A body with a chunk missing is never replayed.
#
# The records are read and edited with redis-cli (make test's Redis).

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use Digest::SHA ();
use File::Temp ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t173-$$-" . time() . ":";

our $Dir = File::Temp::tempdir('t173-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $Dir;    # read by nginx workers that may not be root

# 3 MiB and one byte: three full chunks and a last one of one byte
our $Body = join('', map { pack('N', $_) x 256 } 1 .. 3 * 1024) . 'z';
{
    open my $fh, '>:raw', "$Dir/big.bin" or die "$Dir/big.bin: $!";
    print $fh $Body;
    close $fh or die "$Dir/big.bin: $!";
}

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

our $Config = qq{
    location = /big {
        idempotency on;
        idempotency_scope "t";
        idempotency_max_response_size 10m;
        proxy_buffering off;
        proxy_method GET;
        proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/files/big.bin;
    }

    location /files/ {
        access_log logs/error.log exec;
        sendfile off;
        alias $Dir/;
    }
};

# the record key of $key and its head (polled until it is split)
sub split_head {
    my ($key) = @_;
    my $rkey = $ENV{TEST_NGINX_PREFIX} . Digest::SHA::sha256_hex('t')
               . ":$key";
    my $end = time + 10 * $Slow;
    my $head = '';
    while (time < $end) {
        $head = main::redis_cli('GET', $rkey);
        last if $head =~ /^idem1 split /;
        select(undef, undef, undef, 0.1);
    }
    return ($rkey, $head);
}

# the body key of the split record of $key
sub body_key {
    my ($key) = @_;
    my ($rkey, $head) = split_head($key);
    my ($owner) = $head =~ /^idem1 split [0-9a-f]{64} ([0-9a-f]+) /;
    return "$ENV{TEST_NGINX_PREFIX}\{$rkey\}:body:" . ($owner // '');
}

sub check_chunks {
    my ($key) = @_;
    my ($rkey, $head) = split_head($key);
    Test::More::like($head, qr/\r\n\r\n${\ length $::Body}$/,
                     'the head is split and names the body length');
    my $bkey = body_key($key);
    my @len = map { main::redis_cli('STRLEN', "$bkey:$_") } 0 .. 4;
    Test::More::is("@len", '1048576 1048576 1048576 1 0',
                   'the body is in four chunks, the last of one byte');
    Test::More::is(main::redis_cli('GET', "$bkey:3"), 'z',
                   'the last chunk is the last byte');
    Test::More::cmp_ok(main::redis_cli('PTTL', "$bkey:3"), '>',
                       main::redis_cli('PTTL', $rkey),
                       'the chunks outlive the head');
}

no_shuffle();
run_tests();

__DATA__

=== TEST 1: a response of 3 MiB and a byte is stored, split in chunks
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /big
x
--- more_headers
Idempotency-Key: c-1
--- error_code: 200
--- response_body eval
$::Body
--- no_error_log
[error]
[alert]



=== TEST 2: its retry is replayed byte for byte from the chunks
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::check_chunks('c-1');
--- request
POST /big
x
--- more_headers
Idempotency-Key: c-1
--- error_code: 200
--- response_headers
Idempotent-Replayed: true
--- response_body eval
$::Body
--- grep_error_log: EXEC GET /files/big.bin
--- grep_error_log_out
--- no_error_log
[error]
[alert]



=== TEST 3: a second record
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /big
x
--- more_headers
Idempotency-Key: c-2
--- error_code: 200
--- response_body eval
$::Body



=== TEST 4: a body with a chunk gone is never replayed: the retry is refused
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::split_head('c-2');
main::redis_cli('DEL', main::body_key('c-2') . ':1');
--- request
POST /big
x
--- more_headers
Idempotency-Key: c-2
--- error_code: 503
--- error_log
is missing or short
--- grep_error_log: EXEC GET /files/big.bin
--- grep_error_log_out
