# A split record's body is stored in chunks of 1 MiB ("<body key>:0", ":1"
# ...), written from the captured response (the store takes it over from
# the request, no copy) with at most two chunks queued at once, and read
# back one chunk per command for a replay, streamed to the client: the
# next chunk is fetched while the one before it is sent (HTTP/1.0, 1.1,
# 2).  Small enough (3 MiB plus a byte) to run under valgrind and ASan,
# where t/171's 60 MB are not run.  A body whose first chunk is gone is
# answered 503; a chunk gone mid-stream cuts the response (the connection
# is closed, the HTTP/2 stream reset): never a body with a hole in a
# complete framing.  A client that leaves mid-replay costs nothing more.
#
# The records are read and edited with redis-cli (make test's Redis).

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use Digest::SHA ();
use File::Temp ();
use IO::Socket::INET ();
use JSON::PP ();
use POSIX ();

our $H2 = (`curl -V 2>/dev/null` // '') =~ /^Features:.*\bHTTP2\b/m;

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

# bodies of unknown length around the chunk's size: the capture's room
# ends at one chunk, the blocks after it are the next chunks
our %Edge = (e1 => 1048576, e2 => 1048577, e3 => 2097152, e4 => 16383);
for my $f (sort keys %Edge) {
    open my $fh, '>:raw', "$Dir/$f.bin" or die "$Dir/$f.bin: $!";
    print $fh substr($Body x 2, 7, $Edge{$f});
    close $fh or die "$Dir/$f.bin: $!";
}

our $Big = qq{
    location = /big {
        idempotency on;
        idempotency_scope "t";
        idempotency_max_response_size 10m;
        proxy_buffering off;
        proxy_method GET;
        proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/files/big.bin;
    }
};

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};

    # HTTP/2 (curl, prior knowledge), nginx 1.22 syntax
    server {
        listen 127.0.0.1:\$TEST_NGINX_RAND_PORT_1 http2;
        server_name h2;
$Big
    }
};

our $Config = qq{
    location = /big2 {
        idempotency on;
        idempotency_scope "t";
        idempotency_max_response_size 10m;
        proxy_buffering off;
        proxy_method GET;
        proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/files/big.bin;
    }
$Big
    location = /status {
        idempotency_status;
    }

    # the same body without a Content-Length (sub_filter drops it, the
    # upstream request is HTTP/1.0): captured in blocks of a chunk
    location = /unknown {
        idempotency on;
        idempotency_scope "t";
        idempotency_max_response_size 10m;
        proxy_buffering off;
        proxy_method GET;
        proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/unframed/big.bin;
    }

    location = /edge {
        idempotency on;
        idempotency_scope "t";
        idempotency_max_response_size 10m;
        proxy_method GET;
        proxy_pass http://127.0.0.1:\$server_port/unframed/\$arg_f.bin;
    }

    location /unframed/ {
        access_log logs/error.log exec;
        sendfile off;
        alias $Dir/;
        sub_filter_types *;
        sub_filter 'no such text' '';
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

# "$line HTTP/$v" with $key and a one-byte body, sent on a socket of its
# own, which is returned (undef if nginx cannot be reached)
sub send_one {
    my ($line, $v, $key) = @_;
    my $sock = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1',
        PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
        Timeout  => 30 * $Slow,
    ) or return;
    print $sock "$line HTTP/$v\r\nHost: localhost\r\n"
                . "Idempotency-Key: $key\r\nContent-Length: 1\r\n\r\nx";
    return $sock;
}

# One request on a socket of its own: "POST /big" with $key, HTTP/$v;
# with $leave, the client closes after the header and that many body
# bytes.  Returns (status, Content-Length, body bytes received, their
# sha256, whether the connection was closed by nginx).
sub raw {
    my ($key, $v, $method, $leave) = @_;
    my $sock = send_one("$method /big", $v, $key) or return (0);
    my $buf = '';
    while ($buf !~ /\r\n\r\n/) {
        sysread($sock, $buf, 65536, length $buf) or return (0);
    }
    my ($head, $body) = split /\r\n\r\n/, $buf, 2;
    my ($status) = $head =~ m{^HTTP/1\.\d (\d+)};
    my ($cl) = $head =~ /^Content-Length: (\d+)/mi;
    if (defined $leave) {
        sysread($sock, $body, $leave - length $body, length $body)
            while length $body < $leave;
        close $sock;
        return ($status, $cl, length $body);
    }
    my $want = $cl // 0;
    my $eof = 0;
    while (length $body < $want) {
        my $n = sysread($sock, $body, 1 << 20, length $body);
        if (!$n) { $eof = 1; last; }
    }
    return ($status, $cl, length $body, Digest::SHA::sha256_hex($body),
            $eof);
}

# POST /edge?f=$f over HTTP/1.0 (a response of unknown length then ends
# with the connection): (status, Content-Length or '-', body)
sub edge {
    my ($f, $key) = @_;
    my $sock = send_one("POST /edge?f=$f", '1.0', $key) or return (0);
    my $buf = '';
    1 while sysread($sock, $buf, 1 << 20, length $buf);
    my ($head, $body) = split /\r\n\r\n/, $buf, 2;
    my ($status) = $head =~ m{^HTTP/1\.\d (\d+)};
    my ($cl) = $head =~ /^Content-Length: (\d+)/mi;
    return ($status // 0, $cl // '-', $body // '');
}

# each edge size: answered whole, stored (split from 16 KiB on), replayed
# with its Content-Length, byte for byte
sub check_edges {
    for my $f (sort keys %Edge) {
        my $want = substr($Body x 2, 7, $Edge{$f});
        my ($s1, $cl1, $b1) = edge($f, "edge-$f");
        my ($rkey, $head) = $Edge{$f} >= 16384 ? split_head("edge-$f") : ();
        select(undef, undef, undef, 0.3 * $Slow) unless $rkey;
        my ($s2, $cl2, $b2) = edge($f, "edge-$f");
        Test::More::ok($s1 == 200 && $cl1 eq '-' && $b1 eq $want,
                       "$f ($Edge{$f} bytes): the first answer is whole, "
                       . "without a Content-Length");
        Test::More::like($head, qr/^idem1 split .*\r\n\r\n$Edge{$f}$/s,
                         "$f: stored split, the head names its length")
            if $rkey;
        Test::More::ok($s2 == 200 && $cl2 eq $Edge{$f} && $b2 eq $want,
                       "$f: the retry is the replay, byte for byte");
    }
}

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

# one HTTP/2 POST /big with curl: (curl's exit code, status, body sha256,
# body length)
sub h2 {
    my ($key) = @_;
    my $out = "$ENV{TEST_NGINX_SERVER_ROOT}/h2-body.$$";
    my @cmd = ('curl', '-sS', '--http2-prior-knowledge', '--max-time',
               30 * $Slow, '-o', $out, '-w', '%{http_code}', '-H',
               "Idempotency-Key: $key", '--data-binary', 'x',
               'http://127.0.0.1:' . h2_port() . '/big');
    my $pid = open(my $from, '-|');
    die "fork: $!\n" unless defined $pid;
    if ($pid == 0) {
        open STDERR, '>', '/dev/null';
        exec { $cmd[0] } @cmd or POSIX::_exit(127);
    }
    my $code = do { local $/; <$from> } // '';
    close $from;
    my $rc = $? >> 8;
    open my $in, '<:raw', $out or return ($rc, $code, '', 0);
    my $body = do { local $/; <$in> } // '';
    close $in;
    unlink $out;
    return ($rc, $code, Digest::SHA::sha256_hex($body), length $body);
}

our $Sha = Digest::SHA::sha256_hex($Body);
our $Len = length $Body;

sub replays {
    my @r = raw('c-1', '1.0', 'POST');
    Test::More::is("@r[0..3]", "200 $Len $Len $Sha",
                   'an HTTP/1.0 retry is replayed byte for byte');
    @r = raw('c-1', '1.1', 'POST');
    Test::More::is("@r[0..3]", "200 $Len $Len $Sha",
                   'an HTTP/1.1 retry too');
  SKIP: {
        Test::More::skip('curl lacks HTTP/2', 1) unless $H2;
        my @h = h2('c-1');
        Test::More::is("@h", "0 200 $Sha $Len",
                       'an HTTP/2 retry is replayed byte for byte');
    }
}

sub cut {
    my @r = raw('c-3', '1.1', 'POST');
    Test::More::is("@r[0..2]", "200 $Len " . 2 * 1048576,
                   'a chunk gone mid-stream: the replay stops before it');
    Test::More::ok($r[4], 'and the connection is closed, short of its '
                   . 'Content-Length');
  SKIP: {
        Test::More::skip('curl lacks HTTP/2', 2) unless $H2;
        my @h = h2('c-3');
        Test::More::isnt($h[0], 0, 'over HTTP/2, curl sees the stream '
                         . 'fail');
        Test::More::cmp_ok($h[3], '<', $Len, 'short of its length');
    }
}

sub leave {
    # five clients that read a bit of the body and leave
    for my $i (1 .. 5) {
        my @r = raw('c-1', '1.1', 'POST', 4096);
        Test::More::is($r[0], 200, "client $i left mid-replay");
    }
}

# idempotency_status: the worker's Redis connections, the bulk one with
# the chunks it carried (four written, four read per replay)
sub status_json {
    my $sock = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1',
        PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
        Timeout  => 10 * $Slow,
    ) or die "connect: $!";
    print $sock "GET /status?format=json HTTP/1.0\r\nHost: localhost\r\n\r\n";
    my $res = do { local $/; <$sock> } // '';
    my ($body) = $res =~ /\r\n\r\n(.*)\z/s;
    my $s = eval { JSON::PP::decode_json($body // '') } || {};
    return ($s, $body);
}

sub connections {
    # replays of c-1 (the first one may go on the main connection while
    # the bulk one connects)
    my ($s, $body, @c);
    for (1 .. 5) {
        raw('c-1', '1.1', 'POST');
        ($s, $body) = status_json();
        @c = @{ $s->{redis_connections} || [] };
        last if grep { $_->{connection} eq 'bulk' && $_->{commands} >= 4 }
                     @c;
    }
    my ($main) = grep { $_->{connection} eq 'main' } @c;
    my ($bulk) = grep { $_->{connection} eq 'bulk' } @c;
    Test::More::ok($main && $bulk, 'the status shows the main and the bulk '
                   . 'connection of the worker') or Test::More::diag($body);
    Test::More::cmp_ok($bulk->{commands} // 0, '>=', 4,
                       'the bulk one carried the chunks');
    Test::More::is(join(' ', map { $bulk->{$_} // '-' }
                                 qw(in_flight in_flight_bytes parked)),
                   '0 0 0', 'none in flight or parked now');
    Test::More::is($bulk->{pid}, $main->{pid}, 'both of one worker');
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



=== TEST 4: a body whose first chunk is gone is never replayed: the retry is refused
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::split_head('c-2');
main::redis_cli('DEL', main::body_key('c-2') . ':0');
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



=== TEST 5: replays stream over HTTP/1.0, 1.1 and 2
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::replays();
--- request
POST /big
x
--- more_headers
Idempotency-Key: c-1
--- error_code: 200
--- response_headers
Idempotent-Replayed: true
--- grep_error_log: EXEC GET /files/big.bin
--- grep_error_log_out
--- no_error_log
[error]
[alert]



=== TEST 6: a third record
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /big
x
--- more_headers
Idempotency-Key: c-3
--- error_code: 200



=== TEST 7: a chunk gone mid-stream cuts the replay: the connection is closed, the HTTP/2 stream reset
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::split_head('c-3');
main::redis_cli('DEL', main::body_key('c-3') . ':2');
main::cut();
--- request
GET /files/big.bin
--- error_code: 200
--- error_log eval
qr/the replay of key_hash=\w+ is cut after 2097152 of 3145729 bytes/
--- no_error_log
[alert]



=== TEST 8: clients that leave mid-replay: the worker goes on
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::leave();
--- request
POST /big
x
--- more_headers
Idempotency-Key: c-1
--- error_code: 200
--- response_body eval
$::Body
--- no_error_log
[alert]



=== TEST 9: idempotency_status shows the worker's main and bulk connections
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::connections();
--- request
GET /status?format=prometheus
--- error_code: 200
--- response_body_like
nginx_idempotency_redis_in_flight\{pid="\d+",redis="[^"]+",connection="bulk"\} 0



=== TEST 10: a response of unknown length (3 MiB and a byte) is captured in blocks and stored split
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /unknown
x
--- more_headers
Idempotency-Key: c-u
--- error_code: 200
--- response_headers
!Content-Length
--- response_body eval
$::Body
--- no_error_log
[error]
[alert]



=== TEST 11: its chunks are the body's, and its retry is replayed byte for byte
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::check_chunks('c-u');
--- request
POST /unknown
x
--- more_headers
Idempotency-Key: c-u
--- error_code: 200
--- response_headers
Idempotent-Replayed: true
Content-Length: 3145729
--- response_body eval
$::Body
--- grep_error_log: EXEC GET /unframed/big.bin
--- grep_error_log_out
--- no_error_log
[error]
[alert]



=== TEST 12: bodies of unknown length around a chunk's size (16383 B, 1 MiB, 1 MiB + 1, 2 MiB) are stored and replayed whole
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::check_edges();
--- request
GET /status
--- error_code: 200
--- no_error_log
[error]
[alert]
