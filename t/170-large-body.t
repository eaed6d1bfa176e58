# Large request bodies: the fingerprint is hashed as nginx reads the body,
# so a 1 GiB upload spooled to a temporary file never stalls the worker
# (no read-back of the file once it is complete) and the claim that
# follows keeps its Redis connection.  A GET loop on the same worker, on a
# keep-alive connection, is answered in every quarter of the upload.
#
# The fingerprint stays what it was (SHA-256 of method, URI with arguments
# and body), so records written before the change still match.
#
# Needs `make test`'s Redis control script (TEST_NGINX_REDIS_CTL) to read
# the record: skipped without it.

# Under valgrind (make test-valgrind) the sizes would take many minutes and
# the timings mean nothing: the split-record and bulk-connection paths are
# run there by t/161, t/172 and t/150's 2 MB responses instead.
use Test::Nginx::Socket $ENV{TEST_NGINX_USE_VALGRIND}
    ? (skip_all => 'gigabyte and 60 MB transfers are not run under valgrind')
    : $ENV{TEST_NGINX_REDIS_CTL}
    ? 'no_plan'
    : (skip_all => 'needs TEST_NGINX_REDIS_CTL (run via make test)');
use lib 't/lib';
use IdemTest;
use Digest::SHA ();
use IO::Socket::INET;
use POSIX ();
use Time::HiRes ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t170-$$-" . time() . ":";

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key '
                    'at \$msec';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

# the upstream never sees the body: only the fingerprint needs it
our $Config = q{
    location = /up {
        client_max_body_size 2g;
        client_body_buffer_size 16k;
        idempotency on;
        idempotency_scope "t";
        proxy_pass_request_body off;
        proxy_set_header Content-Length "";
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "stored\n";
    }

    location = /plain {
        client_max_body_size 2g;
        client_body_buffer_size 16k;
        proxy_pass_request_body off;
        proxy_set_header Content-Length "";
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /ping {
        access_log off;
        return 204;
    }
};

our $Size = 1024 * 1024 * 1024;
our $Chunk = join '', map { chr(($_ * 31 + 7) % 256) } 0 .. 65535;

our $Spooled = join '', map { chr(($_ * 13) % 256) } 0 .. 5 * 1024 * 1024 - 1;

# the record's fingerprint, the third word of its first line
sub record_fp {
    my ($key) = @_;
    my $rkey = $ENV{TEST_NGINX_PREFIX} . Digest::SHA::sha256_hex('t')
               . ":$key";
    my $rec = redis_cli('GETRANGE', $rkey, 0, 255);
    my ($fp) = $rec =~ /^idem1 \w+ ([0-9a-f]{64}) /;
    return $fp // '';
}

# Answers GET /ping on keep-alive connections until $stop becomes readable
# (closed by the parent); prints to $out the time of each answer, one a
# line.
sub ping_loop {
    my ($stop, $out) = @_;

    my ($sock, @at);
    my $rin = '';
    vec($rin, fileno($stop), 1) = 1;

    for (;;) {
        last if select(my $r = $rin, undef, undef, 0);

        # a new connection when nginx ends one (keepalive_requests)
        $sock //= IO::Socket::INET->new(
            PeerAddr => '127.0.0.1',
            PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
            Timeout  => 10,
        ) or last;

        print $sock "GET /ping HTTP/1.1\r\nHost: localhost\r\n\r\n";
        my $head = '';
        while ($head !~ /\r\n\r\n/) {
            if (!sysread($sock, $head, 4096, length $head)) {
                undef $sock;
                last;
            }
        }
        next unless $sock;

        push @at, Time::HiRes::time();
    }

    print $out map { "$_\n" } @at;
    close $out;
    POSIX::_exit(0);
}

# POST $uri with a body of $size bytes made of $Chunk, streamed; returns the
# status line and the times at which the client had sent 0, 1/4, 2/4, 3/4
# and all of the body (a quarter is 256 MiB: far more than the socket
# buffers between the client and nginx hold, so nginx had read most of it)
sub upload {
    my ($uri, $key, $size) = @_;

    my $sock = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1',
        PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
        Timeout  => 60,
    ) or die "connect: $!";

    print $sock "POST $uri HTTP/1.1\r\nHost: localhost\r\n"
                . "Idempotency-Key: $key\r\nContent-Length: $size\r\n"
                . "Connection: close\r\n\r\n";

    my ($sent, @marks) = (0, Time::HiRes::time());
    while ($sent < $size) {
        my $len = $size - $sent < length $::Chunk
                  ? $size - $sent : length $::Chunk;
        my $n = syswrite($sock, $::Chunk, $len);
        die "upload: $!" unless $n;
        $sent += $n;
        push @marks, Time::HiRes::time()
            while @marks < 5 && $sent >= $size * @marks / 4;
    }

    local $/ = "\r\n";
    my $status = <$sock> // '';
    $status =~ s/\r\n$//;
    return ($status, @marks);
}

# Uploads while the ping loop runs; returns the status line, the number of
# GET /ping answers in each quarter of the upload (by the bytes the client
# had sent) and the longest wait (ms) between two answers during it.
sub upload_while_pinging {
    my ($uri, $key, $size) = @_;

    pipe(my $stop_r, my $stop_w) or die "pipe: $!";
    pipe(my $res_r, my $res_w) or die "pipe: $!";

    my $pid = fork();
    die "fork: $!" unless defined $pid;

    if ($pid == 0) {
        close $stop_w;
        close $res_r;
        ping_loop($stop_r, $res_w);
    }

    close $stop_r;
    close $res_w;

    my ($status, @marks) = upload($uri, $key, $size);

    close $stop_w;
    my @at = <$res_r>;
    waitpid($pid, 0);

    my @quarters = (0) x 4;
    my ($max, $last) = (0, $marks[0]);
    for my $t (@at) {
        next if $t < $marks[0] || $t >= $marks[-1];
        my $q = 0;
        $q++ while $q < 3 && $t >= $marks[$q + 1];
        $quarters[$q]++;
        $max = $t - $last if $t - $last > $max;
        $last = $t;
    }

    return ($status, \@quarters, int($max * 1000));
}

# A GET loop on the worker while 1 GiB comes in: what this asserts is that
# the worker keeps answering during every quarter of the upload, never that
# an answer came within so many ms (a loaded machine decides that).  How
# much longer the worker makes a GET wait with the module than without it
# is a measurement (docs/benchmarks.md): T170_VERBOSE=1 prints it, after
# the same upload to a location without the module.
sub large_upload {
    if ($ENV{T170_VERBOSE}) {
        my ($plain, $pq, $pgap) = upload_while_pinging('/plain', 'plain',
                                                       $Size);
        Test::More::is($plain, 'HTTP/1.1 201 Created',
                       'the upload without the module is answered');
        Test::More::diag("GET /ping during $Size bytes without the module: "
                         . "answers per quarter @$pq, longest wait "
                         . "$pgap ms");
    }

    my ($status, $q, $gap) = upload_while_pinging('/up', 'big-1', $Size);
    my $n = 0;
    $n += $_ for @$q;

    Test::More::diag("GET /ping during $Size bytes with the module: answers "
                     . "per quarter @$q, longest wait $gap ms")
        if $ENV{T170_VERBOSE} || $ENV{TEST_VERBOSE};

    Test::More::is($status, 'HTTP/1.1 201 Created',
                   'the upload with the module is answered');
    Test::More::cmp_ok($n, '>=', 10,
                       "GET /ping was answered while the body came in ($n)");
    Test::More::is(scalar(grep { $_ == 0 } @$q), 0,
                   'in every quarter of the upload (answers: @$q)');
}

no_shuffle();
run_tests();

__DATA__

=== TEST 1: a 1 GiB upload: a GET loop on the worker is answered throughout, the claim keeps its connection
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- log_level: info
--- init
main::large_upload();
--- request
GET /ping
--- error_code: 204
--- grep_error_log: EXEC POST /backend big-1
--- grep_error_log_out
EXEC POST /backend big-1
--- no_error_log
reconnecting
no reply in time
[alert]
[error]
--- timeout: 120



=== TEST 2: a duplicate with another body is a mismatch: the record holds the big body's fingerprint
--- request
POST /up
x
--- more_headers
Idempotency-Key: big-1
--- error_code: 422
--- grep_error_log: EXEC POST /backend big-1
--- grep_error_log_out
EXEC POST /backend big-1



=== TEST 3: a body spooled to a file has the same fingerprint as before: SHA-256 of method, URI and body
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request eval
"POST /up?a=1\n$::Spooled"
--- more_headers
Idempotency-Key: fp-1
--- error_code: 201
--- response_body
stored



=== TEST 4: ... which the record carries
--- init
Test::More::is(main::record_fp('fp-1'),
               Digest::SHA::sha256_hex("POST /up?a=1\n$::Spooled"),
               'the fingerprint is unchanged');
--- request
POST /up?a=1
x
--- more_headers
Idempotency-Key: fp-1
--- error_code: 422
