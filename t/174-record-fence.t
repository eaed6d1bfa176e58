# A split record, whatever the key's spelling, and its chunks' lives:
# - a key with braces but no hash tag ("big{1", "a}b", "x{}y") is split
#   too: its chunks are in the record key's slot under a tag of the
#   module's own, start with the prefix, and the record replays byte for
#   byte;
# - the store sets every chunk's expiry with the head: a chunk written
#   long before (here: one whose TTL the test shortens while the head
#   waits behind a slow Redis) never expires before its head;
# - a store refused by its fence (the claim was removed with
#   idempotency_admin while the upstream ran) removes the chunks it wrote,
#   and the log says why;
# - the log line of a missing chunk names the record's key_hash, as the
#   503 line of the same replay does.
#
# The records are read and edited with redis-cli (make test's Redis).

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use DelayProxy;
use Digest::SHA ();
use File::Temp ();
use IO::Socket::INET ();
use POSIX ();
use Time::HiRes ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t174-$$-" . time() . ":";

our $Dir = File::Temp::tempdir('t174-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $Dir;    # read by nginx workers that may not be root

# 3 MiB and one byte: three full chunks and a last one of one byte
our $Body = join('', map { pack('N', $_) x 256 } 1 .. 3 * 1024) . 'z';
{
    open my $fh, '>:raw', "$Dir/big.bin" or die "$Dir/big.bin: $!";
    print $fh $Body;
    close $fh or die "$Dir/big.bin: $!";
}

# Redis 0.3 s away: a store's head reaches it a while after its
# first chunks
our ($ProxyPid, $ProxyPort) =
    DelayProxy::start($ENV{TEST_NGINX_REDIS_PORT}, 0.3);

# an upstream that answers $Body once the file "$Dir/go" exists
our $UpPort;
our $UpPid = do {
    my $l = IO::Socket::INET->new(Listen => 8, LocalAddr => '127.0.0.1',
                                  LocalPort => 0, ReuseAddr => 1)
        or die "upstream: listen: $!\n";
    $UpPort = $l->sockport;
    my $parent = $$;
    my $pid = fork();
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        local $SIG{ALRM} = sub { POSIX::_exit(0) };
        alarm(600);
        while (getppid() == $parent) {
            my $c = $l->accept or next;
            my $buf = '';
            while ($buf !~ /\r\n\r\n/) {
                sysread($c, $buf, 65536, length $buf) or last;
            }
            Time::HiRes::sleep(0.05) until -e "$Dir/go" || getppid() != $parent;
            my $resp = "HTTP/1.1 200 OK\r\nContent-Length: " . length($Body)
                       . "\r\nConnection: close\r\n\r\n$Body";
            while (length $resp) {
                my $n = syswrite($c, $resp) or last;
                substr($resp, 0, $n, '');
            }
            close $c;
        }
        POSIX::_exit(0);
    }
    close $l;
    $pid;
};

END {
    if ($$ != ($ProxyPid // 0) && $$ != ($UpPid // 0)) {
        DelayProxy::stop($ProxyPid) if $ProxyPid;
        kill 'TERM', $UpPid if $UpPid;
    }
}

our $DelayedPort = free_port();

our $Big = q{
        idempotency on;
        idempotency_scope "t";
        idempotency_max_response_size 10m;
        proxy_buffering off;
        proxy_method GET;
};

our $HttpConfig = qq{
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};

    server {
        listen 127.0.0.1:$DelayedPort;
        idempotency_redis 127.0.0.1:$ProxyPort
                          prefix=$ENV{TEST_NGINX_PREFIX} timeout=10s;

        location = /delayed {
$Big
            proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/files/big.bin;
        }
    }
};

our $Config = qq{
    location = /big {
$Big
        proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/files/big.bin;
    }

    location = /slow {
$Big
        proxy_pass http://127.0.0.1:$UpPort;
    }

    location = /admin {
        idempotency_admin;
    }

    location /files/ {
        sendfile off;
        alias $Dir/;
    }
};

sub rkey { $ENV{TEST_NGINX_PREFIX} . Digest::SHA::sha256_hex('t') . ":$_[0]" }

# the owner token of the record of $key, once it has one
sub owner {
    my ($key) = @_;
    my $end = time + 20 * $Slow;
    while (time < $end) {
        my ($o) = redis_cli('GETRANGE', rkey($key), 0, 200)
                  =~ /^idem1 \w+ [0-9a-f]{64} ([0-9a-f]+) /;
        return $o if $o;
        Time::HiRes::sleep(0.02);
    }
    return '';
}

# the head of the record of $key, once it is split ('' if never)
sub split_head {
    my ($key) = @_;
    my $end = time + 20 * $Slow;
    while (time < $end) {
        my $head = redis_cli('GET', rkey($key));
        return $head if $head =~ /^idem1 split /;
        Time::HiRes::sleep(0.05);
    }
    return '';
}

# the chunk keys of the body written by $owner, in order
sub chunks {
    my ($owner) = @_;
    my @keys = grep { length } split /\n/,
        redis_cli('KEYS', "$ENV{TEST_NGINX_PREFIX}*:body:$owner:*");
    return sort { ($a =~ /:(\d+)$/)[0] <=> ($b =~ /:(\d+)$/)[0] } @keys;
}

# one POST on its own connection to $port: (status, body, replayed)
sub post {
    my ($uri, $key, $port) = @_;
    my $sock = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1',
        PeerPort => $port // $ENV{TEST_NGINX_SERVER_PORT},
        Timeout  => 30 * $Slow,
    ) or return (0);
    print $sock "POST $uri HTTP/1.1\r\nHost: localhost\r\n"
                . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
                . "Connection: close\r\n\r\nx";
    my $resp = '';
    1 while sysread($sock, $resp, 1 << 20, length $resp);
    my ($head, $body) = split /\r\n\r\n/, $resp, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.1 (\d+)};
    my $replayed = ($head // '') =~ /^Idempotent-Replayed: true/mi ? 1 : 0;
    return ($status // 0, $body // '', $replayed);
}

# waits up to 30 s for $re in the error log; true when it is there
sub logged {
    my ($re) = @_;
    my $end = time + 30 * $Slow;
    while (time < $end) {
        if (open my $fh, '<', server_root() . '/logs/error.log') {
            local $/;
            return 1 if <$fh> =~ $re;
        }
        Time::HiRes::sleep(0.1);
    }
    if (open my $fh, '<', server_root() . '/logs/error.log') {
        Test::More::diag($_) for grep { /key_hash/ && !/\[debug\]/ } <$fh>;
    }
    return 0;
}

# 1. keys with braces but no hash tag: stored split and replayed
sub brace_keys {
    for my $key ('big{1', 'a}b', 'x{}y') {
        my ($status, $body) = post('/big', $key);
        Test::More::ok($status == 200 && $body eq $Body,
                       "$key: the first request is answered");

        my $head = split_head($key);
        Test::More::ok($head, "$key: the record is stored split");
        Test::More::cmp_ok(length $head, '<', 1024, "$key: its head is small");

        my ($owner) = $head =~ /^idem1 split [0-9a-f]{64} ([0-9a-f]+) /;
        my @chunks = chunks($owner // 'none');
        Test::More::is(scalar @chunks, 4, "$key: the body is in 4 chunks");
        my $len = 0;
        $len += redis_cli('STRLEN', $_) for @chunks;
        Test::More::is($len, length $Body, "$key: of the body's length");
        Test::More::is(scalar(grep {
                           index($_, $ENV{TEST_NGINX_PREFIX}) == 0
                           && key_slot($_) == key_slot(rkey($key))
                       } @chunks), 4,
                       "$key: each starts with the prefix, in the record's "
                       . "slot");

        my ($again, $replay, $replayed) = post('/big', $key);
        Test::More::ok($again == 200 && $replayed && $replay eq $Body,
                       "$key: the replay is the body, byte for byte");
    }
}

# 2. a chunk whose TTL runs short before its head is stored (as one
# written long before would): the store gives it the head's TTL and more
sub chunk_ttl {
    pipe(my $r, my $w) or die "pipe: $!";
    my $pid = fork();
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        close $r;
        print $w join(' ', (post('/delayed', 'ttl-1', $DelayedPort))[0]),
                 "\n";
        close $w;
        POSIX::_exit(0);
    }
    close $w;

    my $owner = owner('ttl-1');
    my $chunk0 = "$ENV{TEST_NGINX_PREFIX}\{" . rkey('ttl-1')
                 . "}:body:$owner:0";
    my $end = time + 30 * $Slow;
    Time::HiRes::sleep(0.01)
        until redis_cli('EXISTS', $chunk0) || time > $end;
    redis_cli('PEXPIRE', $chunk0, 20000);
    my $before = redis_cli('GETRANGE', rkey('ttl-1'), 0, 10);

    my $status = <$r> // '';
    chomp $status;
    waitpid($pid, 0);

    Test::More::is($status, 200, 'the request through the slow Redis is '
                   . 'answered');
    Test::More::unlike($before, qr/split/, 'its chunk 0 was shortened '
                       . 'before the head was stored');
    Test::More::ok(split_head('ttl-1'), 'the record is stored split');
    my $head = redis_cli('PTTL', rkey('ttl-1'));
    my @ttl = map { redis_cli('PTTL', $_) } chunks($owner);
    Test::More::is(scalar @ttl, 4, 'its 4 chunks are there');
    Test::More::is(scalar(grep { $_ >= $head } @ttl), 4,
                   "no chunk expires before the head (head $head ms, "
                   . "chunks @ttl)");
}

# 3. the claim removed (idempotency_admin) while the upstream runs: the
# refused store removes its chunks and says why
sub admin_removes {
    unlink "$Dir/go";
    first_request('/slow', 'orph-1', undef, 0);
    my $owner = owner('orph-1');

    my $sock = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1',
        PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
        Timeout  => 10,
    ) or die "connect: $!";
    print $sock "DELETE /admin?key=orph-1&scope=t HTTP/1.1\r\n"
                . "Host: localhost\r\nConnection: close\r\n\r\n";
    my $resp = do { local $/; <$sock> } // '';

    open my $go, '>', "$Dir/go" or die "$Dir/go: $!";
    close $go;

    my $h = key_hash('orph-1', 't');
    Test::More::ok($owner, 'the request was in flight');
    Test::More::like($resp, qr{^HTTP/1\.1 204}, 'its claim was removed');
    Test::More::ok(logged(qr/\Qthe claim on key_hash=$h was lost (the key \E
                             \Qwas gone: the claim was removed\E/x),
                   'the refused store says the key was gone');
    Test::More::is(scalar(() = chunks($owner)), 0,
                   'and left no chunk behind');
}

# 4. a chunk of a split record deleted: returns the record key's hash
sub chunk_deleted {
    my ($status) = post('/big', 'miss-1');
    my ($owner) = split_head('miss-1') =~ /^idem1 split [0-9a-f]{64} ([0-9a-f]+) /;
    my @chunks = chunks($owner // 'none');
    redis_cli('DEL', $chunks[0]) if @chunks;
    Test::More::ok($status == 200 && @chunks == 4,
                   'a split record, its first chunk deleted');
}

no_shuffle();
run_tests();

__DATA__

=== TEST 1: keys with braces but no hash tag are stored split, in the key's slot, and replayed
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::brace_keys();
--- request
POST /big
x
--- more_headers
Idempotency-Key: big{1
--- error_code: 200
--- response_headers
Idempotent-Replayed: true
--- response_body eval
$::Body
--- no_error_log
[error]
[alert]
--- timeout: 60



=== TEST 2: a chunk never expires before its head
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::chunk_ttl();
--- request
POST /big
x
--- more_headers
Idempotency-Key: big{1
--- error_code: 200
--- no_error_log
[alert]
--- timeout: 60



=== TEST 3: a store refused by its fence removes its chunks and says why
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::admin_removes();
--- request
GET /admin?key=orph-1&scope=t
--- error_code: 404
--- no_error_log
[alert]
--- timeout: 60



=== TEST 4: a missing chunk is logged with the record's key_hash, as the 503 is
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::chunk_deleted();
--- request
POST /big
x
--- more_headers
Idempotency-Key: miss-1
--- error_code: 503
--- error_log eval
["the body of the record key_hash=" . main::key_hash('miss-1', 't')
 . " is missing or short",
 "request refused with 503, key_hash=" . main::key_hash('miss-1', 't')]
--- timeout: 60
