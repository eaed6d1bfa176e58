# Hostile input: requests at nginx's header and body limits, keys of every
# length around idempotency_key_max_length, bodies over client_max_body_size,
# slow and stalled bodies, thousands of distinct keys, and keys made of
# characters that mean something to Redis (glob patterns, hash tags) or to
# HTTP (quotes, backslashes, CR, LF, NUL).
#
# What every block checks besides the status: whether the operation ran (the
# upstream logs an "EXEC" line with the key) and what Redis holds afterwards,
# read with a small binary-safe RESP client (redis_cli() passes arguments
# through a shell, which keys with quotes would not survive).  A rejected
# request must leave no record: no claim can be left behind.
#
# t/070-contract.t covers the key syntax cases (control bytes, non-ASCII,
# escapes, 255/256 and 300/301); this file covers what it leaves out.
# Records persist from block to block (a fresh key prefix per run); blocks
# without a "--- config" reuse the nginx of the block before, and their log
# checks name their own keys.

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use Digest::SHA ();
use IO::Select ();
use IO::Socket::INET ();
use Time::HiRes ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t100-$$-" . time() . ":";
$ENV{TEST_NGINX_BODY_TIMEOUT} = 1 * $Slow;
$ENV{TEST_NGINX_FULL_PORT} = free_port();

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri key=\$http_idempotency_key';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

# the Redis key of a record: no Authorization header, so the scope is "test:"
our $Base = $ENV{TEST_NGINX_PREFIX} . Digest::SHA::sha256_hex('test:') . ':';

# ------------------------------------------------------------ Redis

# One command over its own connection, every argument a bulk string:
# returns the reply (array replies as array references, errors as
# "ERR ..." strings prefixed with "-").
sub redis {
    my @replies = redis_pipeline([@_]);
    return $replies[0];
}

# the state word of a record (the second word of its first line), or the
# reply itself when it is not a record (nil, an error)
sub rstate {
    my $v = redis('GET', $_[0]);
    return defined $v && $v =~ /^idem1 (\S+) / ? $1 : $v;
}

# Several commands on one connection, sent at once, replies in order.
sub redis_pipeline {
    my (@cmds) = @_;
    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                     PeerPort => $ENV{TEST_NGINX_REDIS_PORT},
                                     Timeout => 10)
        or die "cannot connect to Redis: $!\n";
    binmode $sock;
    my $out = '';
    for my $cmd (@cmds) {
        $out .= '*' . @$cmd . "\r\n";
        $out .= '$' . length($_) . "\r\n$_\r\n" for @$cmd;
    }
    print $sock $out;
    my @replies = map { resp_read($sock) } @cmds;
    close $sock;
    return @replies;
}

sub resp_read {
    my ($sock) = @_;
    my $line = <$sock>;
    die "Redis closed the connection\n" unless defined $line;
    $line =~ s/\r\n\z//;
    my ($type, $rest) = (substr($line, 0, 1), substr($line, 1));
    return $rest if $type eq '+' || $type eq ':';
    return "-$rest" if $type eq '-';
    if ($type eq '$') {
        return undef if $rest < 0;
        my $buf = '';
        while (length $buf < $rest + 2) {
            read($sock, $buf, $rest + 2 - length $buf, length $buf) or last;
        }
        return substr($buf, 0, $rest);
    }
    if ($type eq '*') {
        return undef if $rest < 0;
        return [map { resp_read($sock) } 1 .. $rest];
    }
    die "unexpected Redis reply: $line\n";
}

# every Redis key of this run whose idempotency key starts with $tag
sub records {
    my ($tag) = @_;
    my ($cursor, @keys) = (0);
    do {
        my $r = redis('SCAN', $cursor, 'MATCH', "$ENV{TEST_NGINX_PREFIX}*",
                      'COUNT', 1000);
        $cursor = $r->[0];
        push @keys, grep { index($_, $Base . $tag) == 0 } @{ $r->[1] };
    } while ($cursor ne '0');
    return sort @keys;
}

# true once the record $rkey is in $state (the store follows the response
# by a moment), false after $secs
sub wait_state {
    my ($rkey, $state, $secs) = @_;
    my $end = Time::HiRes::time() + $secs;
    while (Time::HiRes::time() < $end) {
        return 1 if (rstate($rkey) // '') eq $state;
        Time::HiRes::sleep(0.05);
    }
    return 0;
}

# true once a line of nginx's error log matches $re, false after $secs
sub wait_log {
    my ($re, $secs) = @_;
    my $file = "$ENV{TEST_NGINX_SERVER_ROOT}/logs/error.log";
    my $end = Time::HiRes::time() + $secs;
    while (Time::HiRes::time() < $end) {
        if (open my $fh, '<', $file) {
            while (<$fh>) {
                return 1 if $_ =~ $re;
            }
        }
        Time::HiRes::sleep(0.1);
    }
    return 0;
}

# the idempotency keys (without prefix and scope) recorded under $tag
sub recorded_keys {
    my ($tag) = @_;
    return map { substr($_, length $Base) } records($tag);
}

# ------------------------------------------------------------ HTTP

# A raw POST with a body (default one byte) and exactly the given header
# lines, as in t/070-contract.t.
sub raw_post {
    my ($uri, $lines, $body) = @_;
    $body //= 'x';
    return "POST $uri HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
           . join('', map { "$_\r\n" } @$lines)
           . 'Content-Length: ' . length($body) . "\r\n\r\n$body";
}

sub connect_nginx {
    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                     PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
                                     Timeout => 10 * $Slow)
        or die "cannot connect to nginx: $!\n";
    binmode $sock;
    return $sock;
}

# Sends $req on a new connection and reads until nginx closes it; returns
# (status or 0 when nothing came back, headers, body).
sub http {
    my ($req) = @_;
    my $sock = connect_nginx();
    print $sock $req;
    return read_response($sock);
}

sub read_response {
    my ($sock) = @_;
    local $/;
    my $raw = <$sock> // '';
    close $sock;
    my ($head, $body) = split /\r\n\r\n/, $raw, 2;
    my ($status) = ($head // '') =~ m{\AHTTP/1\.1 (\d{3})};
    return ($status // 0, $head // '', $body // '');
}

# True once nginx has read every byte $sock sent it (the kernel holds none
# of them for nginx's end of the connection, in /proc/net/tcp), false
# after $secs: what a test waits for instead of a pause before it looks at
# what nginx did with a part of a request.
sub nginx_read_all {
    my ($sock, $secs) = @_;
    my $end = Time::HiRes::time() + ($secs // 10 * $Slow);
    my $id = sprintf ':%04X [0-9A-F]+:%04X ', $sock->peerport,
                     $sock->sockport;

    while (Time::HiRes::time() < $end) {
        open my $fh, '<', '/proc/net/tcp' or return 0;
        while (<$fh>) {
            # sl local rem st tx_queue:rx_queue
            return 1 if /$id\w\w [0-9A-F]+:0+ /;
        }
        Time::HiRes::sleep(0.02);
    }
    return 0;
}

# true when nginx has neither answered nor closed $sock yet
sub still_waiting {
    my ($sock) = @_;
    return !IO::Select->new($sock)->can_read(0);
}

# Waits until a just started worker has its Redis connection (it is opened
# asynchronously: under valgrind the first requests can get 503), with
# POSTs to $uri under keys "warm-N".
sub redis_ready {
    my ($uri) = @_;
    for my $i (1 .. 50) {
        my ($st) = http(raw_post($uri, ["Idempotency-Key: warm-$i"]));
        return if $st != 503;
        Time::HiRes::sleep(0.2);
    }
    die "no Redis connection after 50 tries\n";
}

# $n requests on keep-alive connections, one after the other; $make->($i)
# gives request $i.  Returns the statuses.
sub keepalive_run {
    my ($n, $make) = @_;
    my ($sock, @status);
    for my $i (0 .. $n - 1) {
        # nginx closes a connection after keepalive_requests (1000)
        if ($i % 500 == 0) {
            close $sock if $sock;
            $sock = connect_nginx();
        }
        print $sock $make->($i);
        my $line = <$sock> // die "nginx closed the connection\n";
        my ($st) = $line =~ m{\AHTTP/1\.1 (\d{3})};
        my $len = 0;
        while (defined(my $h = <$sock>)) {
            last if $h eq "\r\n";
            $len = $1 if $h =~ /^Content-Length:\s*(\d+)/i;
        }
        my $body = '';
        read($sock, $body, $len - length $body, length $body)
            while length $body < $len;
        push @status, $st;
    }
    close $sock;
    return @status;
}

# ------------------------------------------------------------ problems

# an RFC 9457 body with the given type and status (as t/070-contract.t)
sub problem {
    my ($name, $status) = @_;
    my $type = quotemeta "urn:ngx-idempotency:$name";
    return qr/\A\{(?=[^{}]*"type":"$type")(?=[^{}]*"status":$status[,}])
              [^{}]*\}\n?\z/x;
}

# nginx's own "Request Header Or Cookie Too Large" page
our $TooLarge = qr{<title>400 Request Header Or Cookie Too Large</title>};


# ============================================================ configs

# nginx's default header buffers: client_header_buffer_size 1k,
# large_client_header_buffers 4 8k.
our $HeaderConfig = q{
    location = /h {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        add_header X-Idempotency-Key "[$idempotency_key]" always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /h/max8192 {
        idempotency on;
        idempotency_key_max_length 8192;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "ran $http_idempotency_key\n";
    }
};

# header buffers large enough for the longest key idempotency_key_max_length
# allows (8192)
our $LengthConfig = q{
    large_client_header_buffers 4 16k;

    location = /len {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /len10 {
        idempotency on;
        idempotency_key_max_length 10;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /len8192 {
        idempotency on;
        idempotency_key_max_length 8192;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "ran\n";
    }
};

our $BodyConfig = q{
    client_header_timeout $TEST_NGINX_BODY_TIMEOUT;

    location = /b {
        idempotency on;
        client_max_body_size 1k;
        client_body_timeout $TEST_NGINX_BODY_TIMEOUT;
        # a refused body is not waited for longer than this
        lingering_timeout 500ms;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /k {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "ran $http_idempotency_key $content_length\n";
    }
};

our $ManyConfig = q{
    location = /m {
        idempotency on;
        idempotency_ttl 300s;
        idempotency_lock_ttl 20s;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /m/slow {
        idempotency on;
        idempotency_ttl 300s;
        idempotency_lock_ttl 20s;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow;
    }

    location = /m/full {
        idempotency on;
        idempotency_lock_ttl 20s;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow-full;
    }

    location = /backend {
        return 201 '{"id":"$http_idempotency_key","status":"created"}\n';
    }

    # TEST 23's upstream (IdemTest::held_upstream): it answers when told to
    location = /slow-full {
        access_log logs/error.log exec;
        proxy_pass http://127.0.0.1:$TEST_NGINX_FULL_PORT;
    }

    location = /slow {
        limit_rate 50;
        return 201 "slow done, slow done, slow done, slow done\n";
    }
};

our $CharConfig = q{
    location = /c {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        add_header X-Idempotency-Key "[$idempotency_key]" always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "ran [$http_idempotency_key]\n";
    }
};


# ============================================================ data

# a header block that puts the key line across the end of the first 1k
# buffer (client_header_buffer_size): the line starts at byte 1000
our $StraddleKey = 'hdr-straddle-' . ('s' x 80);
our $StraddleReq = do {
    my $start = "POST /h HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n";
    my $pad = 1000 - length($start) - length("X-Pad: \r\n");
    $start . 'X-Pad: ' . ('p' x $pad) . "\r\n"
        . "Idempotency-Key: $StraddleKey\r\nContent-Length: 1\r\n\r\nx";
};

# "Idempotency-Key: " is 17 bytes and the line ends in CRLF: a key of 8173
# characters makes a header line of exactly 8192 bytes, the size of a large
# header buffer
our $Key8173 = 'hdr-8173-' . ('k' x (8173 - 9));
our $Key8174 = 'hdr-8174-' . ('k' x (8174 - 9));

# 100 other headers: the key lives in a later part of nginx's header list
our @Filler = map { sprintf 'X-Filler-%03d: %s', $_, 'f' x 20 } 1 .. 100;

# 40 headers of 1000 bytes: more than the four 8k buffers hold together
our @Huge = map { sprintf 'X-Huge-%02d: %s', $_, 'h' x 1000 } 1 .. 40;

# request lines: about 8000 bytes fits a large buffer, 8300 does not
sub long_uri {
    my ($len) = @_;
    my $uri = '/h?';
    return $uri . ('a' x ($len - length("POST $uri HTTP/1.1\r\n")));
}

our @RedisChars = (
    'chr-a*', 'chr-ab', 'chr-a?', 'chr-a[bc]', 'chr-[^x]', 'chr-a\\*',
    'chr-{x}', '{chr-x}', 'chr-{}', 'chr-}{', 'chr-{a}{b}',
    "chr-'single'", 'chr-back\\slash', 'chr-]]--', 'chr-%2A%0D%0A',
    'chr-$(id);`x`', 'chr-#!|&<>=~^',
);


no_shuffle();
run_tests();

__DATA__

=== TEST 1: header limits: a key line that crosses the end of nginx's first 1k header buffer is read whole
--- http_config eval: $::HttpConfig
--- config eval: $::HeaderConfig
--- raw_request eval: $::StraddleReq
--- error_code: 201
--- response_headers eval
"X-Idempotency-Status: MISS\nX-Idempotency-Key: [$::StraddleKey]"
--- response_body eval
"ran $::StraddleKey\n"
--- grep_error_log eval: qr/EXEC POST \S+ key=hdr-straddle-s+/
--- grep_error_log_out eval
"EXEC POST /backend key=$::StraddleKey\n"



=== TEST 2: header limits: a key whose header line is exactly 8192 bytes (a large header buffer) is accepted
--- raw_request eval
main::raw_post('/h/max8192', ["Idempotency-Key: $::Key8173"])
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- grep_error_log eval: qr/EXEC POST \S+ key=hdr-8173-/
--- grep_error_log_out
EXEC POST /backend key=hdr-8173-



=== TEST 3: header limits: one byte more is nginx's own 400 "Request Header Or Cookie Too Large", the module never sees it
--- raw_request eval
main::raw_post('/h/max8192', ["Idempotency-Key: $::Key8174"])
--- error_code: 400
--- response_headers
Content-Type: text/html
!X-Idempotency-Status
--- response_body_like eval: $::TooLarge
--- error_log
client sent too long header line
--- no_error_log eval
[qr/EXEC POST \S+ key=hdr-8174-/, '[alert]', '[crit]']



=== TEST 4: header limits: a key after 100 other headers (a later part of nginx's header list) is found
--- raw_request eval
main::raw_post('/h', [@::Filler, 'Idempotency-Key: hdr-after-100'])
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
X-Idempotency-Key: [hdr-after-100]
--- grep_error_log eval: qr/EXEC POST \S+ key=hdr-after-100/
--- grep_error_log_out
EXEC POST /backend key=hdr-after-100



=== TEST 5: header limits: a second key header 100 headers after the first is a 400 invalid-key problem
--- raw_request eval
main::raw_post('/h', ['Idempotency-Key: hdr-dup-far', @::Filler,
                      'Idempotency-Key: hdr-dup-far'])
--- error_code: 400
--- response_headers
Content-Type: application/problem+json
X-Idempotency-Status: INVALID
--- response_body_like eval
main::problem('invalid-key', 400)
--- error_log
header sent more than once
--- no_error_log eval
qr/EXEC POST \S+ key=hdr-dup-far/



=== TEST 6: header limits: more headers than the four 8k buffers hold is nginx's own 400, the module never sees it
--- raw_request eval
main::raw_post('/h', ['Idempotency-Key: hdr-huge', @::Huge])
--- error_code: 400
--- response_headers
!X-Idempotency-Status
--- response_body_like eval: $::TooLarge
--- no_error_log eval
[qr/EXEC POST \S+ key=hdr-huge/, '[alert]', '[crit]']



=== TEST 7: request line limits: an 8000-byte request line with a key is served and recorded
--- raw_request eval
main::raw_post(main::long_uri(8000), ['Idempotency-Key: hdr-uri-8000'])
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- grep_error_log eval: qr/EXEC POST \S+ key=hdr-uri-8000/
--- grep_error_log_out
EXEC POST /backend key=hdr-uri-8000



=== TEST 8: request line limits: a request line over 8k is nginx's own 414, the module never sees it
--- raw_request eval
main::raw_post(main::long_uri(8300), ['Idempotency-Key: hdr-uri-8300'])
--- error_code: 414
--- response_headers
!X-Idempotency-Status
--- error_log
client sent too long URI
--- no_error_log eval
[qr/EXEC POST \S+ key=hdr-uri-8300/, '[alert]', '[crit]']



=== TEST 9: header limits: Redis holds exactly the accepted keys, none of the rejected ones; the 414's key then runs
--- init
my @want = sort map { $::Base . $_ }
    $::StraddleKey, $::Key8173, 'hdr-after-100', 'hdr-uri-8000';
Test::More::is_deeply([main::records('hdr-')], \@want,
                      'Redis has a record for each accepted key only');
Test::More::is(main::rstate($::Base . $::Key8173), 'done',
               'the 8173-character key is one record, completed');
--- raw_request eval
main::raw_post('/h', ['Idempotency-Key: hdr-uri-8300'])
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- grep_error_log eval: qr/EXEC POST \S+ key=hdr-uri-8300/
--- grep_error_log_out
EXEC POST /backend key=hdr-uri-8300



=== TEST 10: key lengths around the limits: exact status, problem type and record for each
# default (255), a configured 10, and the largest, 8192 (with 16k header
# buffers so that such a key can arrive), in both key forms
--- http_config eval: $::HttpConfig
--- config eval: $::LengthConfig
--- init
main::redis_ready('/len');
my @cases = (
    # location, key as sent, decoded key or undef when rejected
    ['/len', 'k', 'k'],
    ['/len', 'len-' . 'a' x 250, 'len-' . 'a' x 250],          # 254
    ['/len', 'len-' . 'b' x 251, 'len-' . 'b' x 251],          # 255
    ['/len', 'len-' . 'c' x 252, undef],                       # 256
    ['/len', 'len-' . 'd' x 253, undef],                       # 257
    ['/len', 'len-' . 'e' x 4092, undef],                      # 4096
    ['/len', '"len-' . 'f' x 251 . '"', 'len-' . 'f' x 251],   # 255 quoted
    ['/len', '"len-' . 'g' x 252 . '"', undef],                # 256 quoted
    ['/len10', 'len10-abc', 'len10-abc'],                      # 9
    ['/len10', 'len10-abcd', 'len10-abcd'],                    # 10
    ['/len10', 'len10-abcde', undef],                          # 11
    ['/len10', '"len10-\\"\\\\de"', 'len10-"\\de'],            # 10 decoded
    ['/len10', '"len10-\\"\\\\def"', undef],                   # 11 decoded
    ['/len8192', 'len-' . 'h' x 8187, 'len-' . 'h' x 8187],    # 8191
    ['/len8192', 'len-' . 'i' x 8188, 'len-' . 'i' x 8188],    # 8192
    ['/len8192', 'len-' . 'j' x 8189, undef],                  # 8193
    ['/len8192', '"len-' . 'k' x 8188 . '"', 'len-' . 'k' x 8188],
    ['/len8192', 'len-' . 'l' x 12000, undef],                 # 12004
);
my @want;
for my $c (@cases) {
    my ($loc, $sent, $key) = @$c;
    my $what = "$loc, " . length($sent) . ' bytes sent';
    my ($st, $head, $body) =
        main::http(main::raw_post($loc, ["Idempotency-Key: $sent"]));
    if (defined $key) {
        push @want, $::Base . $key;
        Test::More::is($st, 201, "$what: accepted");
        Test::More::like($head, qr/\nX-Idempotency-Status: MISS(?:\r\n|\z)/,
                         "$what: MISS");
    } else {
        Test::More::is($st, 400, "$what: 400");
        Test::More::like($head, qr/\nX-Idempotency-Status: INVALID(?:\r\n|\z)/,
                         "$what: INVALID");
        Test::More::like($body, main::problem('invalid-key', 400),
                         "$what: invalid-key problem");
    }
}
Test::More::is_deeply([main::records('len')],
                      [sort grep { index($_, $::Base . "len") == 0 } @want],
                      'Redis has a record for each accepted key only');
Test::More::is_deeply([main::records('k')], [$::Base . 'k'],
                      'the one-character key is a record');
--- raw_request eval
main::raw_post('/len8192', ['Idempotency-Key: len-' . 'i' x 8188])
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
Idempotent-Replayed: true
--- no_error_log
[alert]



=== TEST 11: bodies: a Content-Length over client_max_body_size is nginx's own 413, before the module runs
--- http_config eval: $::HttpConfig
--- config eval: $::BodyConfig
--- raw_request eval
main::raw_post('/b', ['Idempotency-Key: body-cl-1025'], 'y' x 1025)
--- error_code: 413
--- response_headers
Content-Type: text/html
X-Idempotency-Status: BYPASS
--- error_log
client intended to send too large body: 1025 bytes
--- no_error_log eval
[qr/EXEC POST \S+ key=body-/, '[alert]', '[crit]']



=== TEST 12: bodies: a chunked body over client_max_body_size is a 413 while the module reads it
--- raw_request eval
"POST /b HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
. "Idempotency-Key: body-chunked-1025\r\nTransfer-Encoding: chunked\r\n\r\n"
. "200\r\n" . ('y' x 512) . "\r\n201\r\n" . ('y' x 513) . "\r\n0\r\n\r\n"
--- error_code: 413
--- error_log
client intended to send too large chunked body
--- no_error_log eval
[qr/EXEC POST \S+ key=body-/, '[alert]', '[crit]']



=== TEST 13: bodies: a chunked body that goes over the limit only in a later packet is a 413 too
# the module is already waiting for the body when the second chunk comes
--- init
my $sock = main::connect_nginx();
print $sock "POST /b HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            . "Idempotency-Key: body-chunked-late\r\n"
            . "Transfer-Encoding: chunked\r\n\r\n"
            . "300\r\n" . ('y' x 768) . "\r\n";
Test::More::ok(main::nginx_read_all($sock), 'nginx has read the first chunk');
Test::More::is(main::redis('EXISTS', $::Base . 'body-chunked-late'), 0,
               'no record while the chunked body is being read');
print $sock "300\r\n" . ('y' x 768) . "\r\n0\r\n\r\n";
my ($st) = main::read_response($sock);
Test::More::is($st, 413, 'the chunk that goes over the limit is a 413');
--- raw_request eval
"POST /b HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
. "Idempotency-Key: body-overflow\r\n"
. "Content-Length: 99999999999999999999\r\n\r\nx"
--- error_code: 400
--- error_log
client intended to send too large chunked body
client sent invalid "Content-Length" header
--- no_error_log eval
[qr/EXEC POST \S+ key=body-/, '[alert]', '[crit]']



=== TEST 14: bodies: a 10 GB Content-Length is a 413 at once
--- raw_request eval
"POST /b HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
. "Idempotency-Key: body-10g\r\nContent-Length: 10737418240\r\n\r\nyyyy"
--- error_code: 413
--- error_log
client intended to send too large body: 10737418240 bytes
--- no_error_log eval
[qr/EXEC POST \S+ key=body-/, '[alert]', '[crit]']



=== TEST 15: bodies: no over-size request left a record; a body of exactly 1k with Content-Length passes
--- init
Test::More::is_deeply([main::records('body-')], [],
                      'no record for any request refused with 413 or 400');
--- raw_request eval
main::raw_post('/b', ['Idempotency-Key: body-cl-1025'], 'y' x 1024)
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- response_body
ran body-cl-1025 1024
--- grep_error_log eval: qr/EXEC POST \S+ key=body-cl-1025/
--- grep_error_log_out
EXEC POST /backend key=body-cl-1025



=== TEST 16: bodies: a chunked body of exactly 1k passes and is recorded
--- raw_request eval
"POST /b HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
. "Idempotency-Key: body-chunked-1025\r\nTransfer-Encoding: chunked\r\n\r\n"
. "200\r\n" . ('y' x 512) . "\r\n200\r\n" . ('y' x 512) . "\r\n0\r\n\r\n"
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- response_body
ran body-chunked-1025 1024
--- grep_error_log eval: qr/EXEC POST \S+ key=body-chunked-1025/
--- grep_error_log_out
EXEC POST /backend key=body-chunked-1025



=== TEST 17: slow body: the claim is made only once the whole body is in; other requests are served meanwhile
# the client sends the body in four parts, each once nginx has read the one
# before (/k: nginx's default client_body_timeout, so that a loaded
# machine cannot make it time out): while it trickles in there is no
# record, a request of another client is answered, and the slow one then
# runs
--- init
my $key = 'slow-drip';
my $sock = main::connect_nginx();
print $sock "POST /k HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            . "Idempotency-Key: $key\r\nContent-Length: 8\r\n\r\nab";
for my $part ('cd', 'ef', 'gh') {
    Test::More::ok(main::nginx_read_all($sock),
                   "nginx has read the body so far (before '$part')");
    Test::More::is(main::redis('EXISTS', $::Base . $key), 0,
                   "no record while the body is incomplete (before '$part')");
    print $sock $part;
}
my ($st, $head, $body) = main::read_response($sock);
Test::More::is($st, 201, 'the slow request runs once its body is complete');
Test::More::is($body, "ran $key 8\n", 'with its whole body');
Test::More::ok(main::wait_state($::Base . $key, 'done', 10 * $::Slow),
               'and is recorded');
--- raw_request eval
main::raw_post('/k', ['Idempotency-Key: slow-other'])
--- error_code: 201
--- grep_error_log eval: qr/EXEC POST \S+ key=slow-other/
--- grep_error_log_out
EXEC POST /backend key=slow-other



=== TEST 18: slow body: a client that stops mid-body gets no answer after client_body_timeout, and leaves no claim
# while a body the module reads stalls (on /k, whose client_body_timeout is
# nginx's default: it still waits when the other answer comes, however
# loaded the machine), another client is served
--- init
my $wait = main::connect_nginx();
print $wait "POST /k HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            . "Idempotency-Key: slow-waiting\r\nContent-Length: 100\r\n\r\n"
            . ('z' x 50);
Test::More::ok(main::nginx_read_all($wait), 'nginx has read half the body');
my ($st) = main::http(main::raw_post('/k',
                                     ['Idempotency-Key: slow-meanwhile']));
Test::More::is($st, 201, 'another request is served while the body stalls');
Test::More::ok(main::still_waiting($wait),
               'the stalled request is still waiting then');
close $wait;
# on /b it ends after client_body_timeout
my $sock = main::connect_nginx();
print $sock "POST /b HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            . "Idempotency-Key: slow-stalled\r\nContent-Length: 100\r\n\r\n"
            . ('z' x 50);
Test::More::ok(main::nginx_read_all($sock), 'nginx has read half the body');
Test::More::is(main::redis('EXISTS', $::Base . 'slow-stalled'), 0,
               'no record while the body is incomplete');
my ($stalled, $head) = main::read_response($sock);
Test::More::is($stalled, 0, 'nginx closes the stalled connection, no response');
Test::More::is(main::redis('EXISTS', $::Base . 'slow-stalled'), 0,
               'no record after the timeout');
--- raw_request eval
main::raw_post('/b', ['Idempotency-Key: slow-stalled'], 'z' x 100)
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- response_body
ran slow-stalled 100
--- access_log
"POST /b HTTP/1.1" 408 0
--- grep_error_log eval: qr/EXEC POST \S+ key=slow-stalled/
--- grep_error_log_out
EXEC POST /backend key=slow-stalled



=== TEST 19: slow body: a client that hangs up mid-body leaves no claim; its retry runs
--- init
my $sock = main::connect_nginx();
print $sock "POST /b HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            . "Idempotency-Key: slow-hangup\r\nContent-Length: 100\r\n\r\n"
            . ('z' x 50);
Test::More::ok(main::nginx_read_all($sock), 'nginx has read half the body');
close $sock;
Test::More::ok(main::wait_log(qr/client prematurely closed connection.*request: "POST \/b /,
                              10 * $::Slow),
               'nginx saw the client go');
Test::More::is(main::redis('EXISTS', $::Base . 'slow-hangup'), 0,
               'no record after the client went away mid-body');
--- raw_request eval
main::raw_post('/b', ['Idempotency-Key: slow-hangup'], 'z' x 100)
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- error_log
client prematurely closed connection
--- grep_error_log eval: qr/EXEC POST \S+ key=slow-hangup/
--- grep_error_log_out
EXEC POST /backend key=slow-hangup



=== TEST 20: slow headers: a client that never finishes its headers is closed after client_header_timeout; the module never sees it
# the classic slowloris: the key header is there, the blank line never
# comes; another client is served meanwhile (that a stalled request does
# not hold the worker up is shown by TEST 18 for a body the module reads:
# headers never reach the module)
--- init
my $sock = main::connect_nginx();
print $sock "POST /b HTTP/1.1\r\nHost: localhost\r\n"
            . "Idempotency-Key: slow-headers\r\nX-Drip: 1\r\n";
Test::More::ok(main::nginx_read_all($sock), 'nginx has read the headers sent');
my ($st) = main::http(main::raw_post('/k', ['Idempotency-Key: slow-beside']));
Test::More::is($st, 201, 'another request is served');
my ($stalled) = main::read_response($sock);
Test::More::is($stalled, 0, 'nginx closes the stalled connection, no response');
Test::More::is(main::redis('EXISTS', $::Base . 'slow-headers'), 0,
               'no record');
--- raw_request eval
main::raw_post('/b', ['Idempotency-Key: slow-headers'])
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- error_log
client timed out (110: Connection timed out) while reading client request headers
--- grep_error_log eval: qr/EXEC POST \S+ key=slow-headers/
--- grep_error_log_out
EXEC POST /backend key=slow-headers



=== TEST 21: many keys: 2000 distinct keys from one client make 2000 records, each with idempotency_ttl as its TTL
--- http_config eval: $::HttpConfig
--- config eval: $::ManyConfig
--- init
main::redis_ready('/m');
my $n = 2000;
my @st = main::keepalive_run($n, sub {
    my $key = sprintf 'many-%05d', $_[0];
    return "POST /m HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: $key\r\n"
           . "Content-Type: application/json\r\nContent-Length: 13\r\n\r\n"
           . '{"amount":10}';
});
Test::More::is(scalar(grep { $_ == 201 } @st), $n, "$n requests ran");
my @keys = main::records('many-');
Test::More::is(scalar @keys, $n, "$n records in Redis");
my @pttl = main::redis_pipeline(map { ['PTTL', $_] } @keys);
Test::More::is(scalar(grep { $_ > 0 && $_ <= 300000 } @pttl), $n,
               'every record expires within idempotency_ttl (300 s)');
Test::More::is(scalar(grep { $_ < 0 } @pttl), 0,
               'no record without a TTL (-1) or gone (-2)');
my @mem = main::redis_pipeline(map { ['MEMORY', 'USAGE', $_] } @keys);
my $sum = 0;
$sum += $_ for @mem;
my $avg = $sum / @mem;
Test::More::note("MEMORY USAGE per record: $avg bytes on average");
Test::More::cmp_ok($avg, '<', 1024,
                   'a small record takes under 1 KiB (docs/operations.md)');
--- request
POST /m
{"amount":10}
--- more_headers
Idempotency-Key: many-00042
Content-Type: application/json
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
{"id":"many-00042","status":"created"}



=== TEST 22: many keys: a claim in flight expires by itself too, after idempotency_lock_ttl
--- init
# the client hangs up once its claim is in Redis (a hang-up before that,
# during the claim, would release it): the claim is left to its lock TTL
my $rkey = $::Base . 'many-inflight';
my $sock = main::connect_nginx();
print $sock main::raw_post('/m/slow', ['Idempotency-Key: many-inflight']);
Test::More::ok(main::wait_state($rkey, 'inflight', 10 * $::Slow),
               'the claim is in flight');
close $sock;
my $pttl = main::redis('PTTL', $rkey);
Test::More::ok($pttl > 0 && $pttl <= 20000,
               "the claim expires within idempotency_lock_ttl ($pttl ms)");
--- request
POST /m/slow
x
--- more_headers
Idempotency-Key: many-inflight
--- error_code: 409



=== TEST 23: many keys: a response that completes while Redis is full (maxmemory, noeviction) is stored once Redis has room again
# Redis refuses every write with OOM once used_memory is over maxmemory, the
# store of a request claimed just before included: it is kept and retried
# until the lock TTL ends, as after a restart, not dropped (which would let
# a retry run the operation again once the claim expired)
# the upstream answers only once Redis is full (held_upstream): no race
# between the response and the test filling Redis
--- init
my $rkey = $::Base . 'many-full';
main::redis('CONFIG', 'SET', 'maxmemory', 0);
my $go = "$ENV{TEST_NGINX_SERVER_ROOT}/logs/t100-answer";
unlink $go;
my $pid = main::held_upstream(
    port => $ENV{TEST_NGINX_FULL_PORT}, go => $go,
    body => sub {
        my ($key) = $_[0] =~ /^Idempotency-Key:\s*(\S+)/mi;
        return "stored after Redis had room again ($key)\n";
    });
main::first_request('/m/full', 'many-full', 0, 0);
Test::More::ok(main::wait_state($rkey, 'inflight', 10 * $::Slow),
               'claimed before Redis is full');
main::redis('CONFIG', 'SET', 'maxmemory', 1);
open my $fh, '>', $go or die "$go: $!\n";
close $fh;
my $hash = main::key_hash('many-full');
Test::More::ok(main::wait_log(qr/store of key_hash=$hash failed \(Redis is out of memory \(maxmemory\)\), kept for a retry/,
                              30 * $::Slow),
               'the store met a full Redis and is kept for a retry');
my $state = main::rstate($rkey);
main::redis('CONFIG', 'SET', 'maxmemory', 0);
waitpid($pid, 0);
Test::More::is($state, 'inflight', 'Redis refused the store while full');
Test::More::ok(main::wait_state($rkey, 'done', 30 * $::Slow),
               'stored once Redis had room again');
--- request
POST /m/full
x
--- more_headers
Idempotency-Key: many-full
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
stored after Redis had room again (many-full)
--- error_log
(Redis is out of memory (maxmemory)), kept for a retry
--- grep_error_log eval: qr/EXEC POST \S+ key=many-full/
--- grep_error_log_out
EXEC POST /slow-full key=many-full



=== TEST 24: Redis characters: key chr-ab runs and is recorded
--- http_config eval: $::HttpConfig
--- config eval: $::CharConfig
--- raw_request eval
main::raw_post('/c', ['Idempotency-Key: chr-ab'])
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- response_body
ran [chr-ab]
--- grep_error_log eval: qr/EXEC POST \S+ key=chr-\S+/
--- grep_error_log_out
EXEC POST /backend key=chr-ab



=== TEST 25: Redis characters: key chr-a* is its own record: it runs, it is not a glob that finds chr-ab
--- raw_request eval
main::raw_post('/c', ['Idempotency-Key: chr-a*'])
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
X-Idempotency-Key: [chr-a*]
--- response_body
ran [chr-a*]
--- grep_error_log eval: qr/EXEC POST \S+ key=chr-a\*/
--- grep_error_log_out
EXEC POST /backend key=chr-a*



=== TEST 26: Redis characters: chr-ab still replays its own response after chr-a*
--- raw_request eval
main::raw_post('/c', ['Idempotency-Key: chr-ab'])
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
--- response_body
ran [chr-ab]



=== TEST 27: Redis characters: glob, hash-tag, quote, backslash and shell characters are stored under their exact bytes
--- init
for my $key (@::RedisChars[2 .. $#::RedisChars]) {
    my ($st, $head, $body) =
        main::http(main::raw_post('/c', ["Idempotency-Key: $key"]));
    Test::More::is($st, 201, "$key: runs");
    Test::More::is($body, "ran [$key]\n", "$key: its own response");
    ($st, $head, $body) =
        main::http(main::raw_post('/c', ["Idempotency-Key: $key"]));
    Test::More::like($head, qr/\nIdempotent-Replayed: true(?:\r\n|\z)/,
                     "$key: the retry is a replay");
    Test::More::is($body, "ran [$key]\n", "$key: of its own response");
    Test::More::is(main::rstate($::Base . $key), 'done',
                   "$key: the Redis key is the exact bytes");
}
Test::More::is_deeply([main::records('chr-')],
                      [sort map { $::Base . $_ } grep { /^chr-/ } @::RedisChars],
                      'no other Redis key with the chr- tag');
Test::More::is(main::redis('EXISTS', $::Base . '{chr-x}'), 1,
               'a key that starts with a hash tag is stored as it is');
--- raw_request eval
main::raw_post('/c', ['Idempotency-Key: chr-a*'])
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
--- response_body
ran [chr-a*]



=== TEST 28: Redis characters: a quoted key with spaces, a quote and a backslash is stored decoded, exactly
--- raw_request eval
main::raw_post('/c', ['Idempotency-Key: "chr-sp ace \"q\" \\\\b"'])
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
X-Idempotency-Key: [chr-sp ace "q" \b]
--- grep_error_log eval: qr/EXEC POST \S+ key=\S+chr-sp ace/
--- grep_error_log_out
EXEC POST /backend key=\x22chr-sp ace



=== TEST 29: Redis characters: the record of the quoted key has the decoded name; spaces and tabs around a bare key are not part of it
--- init
Test::More::is(main::rstate($::Base . 'chr-sp ace "q" \\b'),
               'done', 'the decoded key is the Redis key');
--- raw_request eval
main::raw_post('/c', ["Idempotency-Key: \t chr-around \t"])
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
X-Idempotency-Key: [chr-around]



=== TEST 30: HTTP characters: a CR inside the key is nginx's own 400, the module never sees it
--- raw_request eval
main::raw_post('/c', ["Idempotency-Key: chr-cr\rinside"])
--- error_code: 400
--- response_headers
Content-Type: text/html
!X-Idempotency-Status
--- error_log
client sent invalid header line
--- no_error_log eval
qr/EXEC POST \S+ key=chr-(?:cr|nul|fold)/



=== TEST 31: HTTP characters: a NUL inside the key is nginx's own 400
--- raw_request eval
main::raw_post('/c', ["Idempotency-Key: chr-nul\0inside"])
--- error_code: 400
--- response_headers
!X-Idempotency-Status
--- error_log
client sent invalid header line
--- no_error_log eval
qr/EXEC POST \S+ key=chr-(?:cr|nul|fold)/



=== TEST 32: HTTP characters: a folded key line (obs-fold) is nginx's own 400
--- raw_request eval
main::raw_post('/c', ["Idempotency-Key: chr-fold", " continued"])
--- error_code: 400
--- response_headers
!X-Idempotency-Status
--- no_error_log eval
qr/EXEC POST \S+ key=chr-(?:cr|nul|fold)/



=== TEST 33: HTTP characters: a bare LF ends the key line: the key is what came before it, the rest is another header
--- raw_request eval
main::raw_post('/c', ["Idempotency-Key: chr-lf\nX-After-LF: 1"])
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
X-Idempotency-Key: [chr-lf]
--- response_body
ran [chr-lf]



=== TEST 34: HTTP characters: what nginx lets through but the key syntax refuses (obs-text, tab, DEL, controls inside quotes) is a 400 invalid-key problem
# t/070-contract.t has these in the bare form; here inside the quoted form,
# and keys that are nothing but such bytes
--- init
for my $c (["chr-q-tab", "\"chr-q-tab\tx\""],
           ["chr-q-obs", "\"chr-q-obs\xe9\""],
           ["chr-q-obs-ff", "\"chr-q-obs\xff\""],
           ["chr-q-del", "\"chr-q-del\x7f\""],
           ["chr-q-ctl", "\"chr-q-ctl\x01\""],
           ["chr-obs-only", "\x80\x81"],
           ["chr-tab-only", "\t"]) {
    my ($what, $sent) = @$c;
    my ($st, $head, $body) =
        main::http(main::raw_post('/c', ["Idempotency-Key: $sent"]));
    Test::More::is($st, 400, "$what: 400");
    Test::More::like($body, main::problem('invalid-key', 400),
                     "$what: invalid-key problem");
}
--- raw_request eval
main::raw_post('/c', ["Idempotency-Key: \"chr-q-sp\xa0\""])
--- error_code: 400
--- response_headers
Content-Type: application/problem+json
X-Idempotency-Status: INVALID
--- response_body_like eval
main::problem('invalid-key', 400)
--- no_error_log eval
qr/EXEC POST \S+ key=\S*chr-q-/



=== TEST 35: HTTP characters: no record name holds a CR, LF, NUL or tab, and none was made for a rejected key
--- init
my @keys = main::recorded_keys('chr-');
Test::More::is(scalar(grep { /[\r\n\0\t]/ } @keys), 0,
               'no CR, LF, NUL or tab in any record name');
Test::More::is(scalar(grep { /^chr-(?:cr|nul|fold|q-)/ } @keys), 0,
               'no record for a key nginx rejected');
--- raw_request eval
main::raw_post('/c', ["Idempotency-Key: chr-lf"])
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
--- response_body
ran [chr-lf]
