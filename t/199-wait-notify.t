# Waiting duplicates (idempotency_wait) are woken by a notification: the
# first request's store publishes its key's hash on "<prefix>done" when a
# waiter marked the record, each node's worker 0 hears it and wakes the
# waiters of that key on every worker of the node.  A duplicate on the
# worker that ran the first request, one on the other worker and one on
# another nginx node all get the replay, while their fallback poll is a
# minute away: the status counters say a notification woke them.  A
# notification that is never published (the mark removed) still ends in
# the replay, by the slow poll; a listener whose subscription is killed
# (CLIENT KILL TYPE pubsub) sends its node's waiters back to the quick
# poll, and they get the replay too.  A release (the first response not
# stored) wakes the waiter as well, which then claims the key and runs.
#
# The upstream is this test: it accepts the first request's connection
# and answers it when the duplicates are seen waiting (their mark is in
# Redis), so nothing depends on timings.  A plain Test::More file with two
# nginx (2 workers and 1) in front of make test's Redis, stopped by pid.
# Run from the repository root (prove does).

use strict;
use warnings;
use Test::More;
use Digest::SHA ();
use IO::Select ();
use IO::Socket::INET ();

use lib 't/lib';
use IdemTest;
use Roads ();
use WaitNotify;

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES} && $ENV{TEST_NGINX_REDIS_PORT};

my $prefix = "t199-$$-" . time() . ':';
my @port = (free_port(), free_port());

# the upstream: connections wait in its backlog until the test accepts them
my $backend = backend();
my $bport = $backend->sockport;

$SIG{INT} = $SIG{TERM} = sub { Roads::stop(); exit 130 };

# the fallback polls: far away in /slow, near in /lossy
my $lossy_poll = 2 * $Slow;

sub http_conf {
    my ($port) = @_;
    return <<HTTP;
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$prefix;
    server {
        listen 127.0.0.1:$port reuseport;
        location = /pid {
            return 200 "\$pid";
        }
        location = /status {
            idempotency_status;
        }
        location = /slow {
            idempotency on;
            idempotency_scope test;
            idempotency_wait 120s poll=60s;
            proxy_read_timeout 120s;
            proxy_pass http://127.0.0.1:$bport;
        }
        location = /lossy {
            idempotency on;
            idempotency_scope test;
            idempotency_wait 60s poll=${lossy_poll}s;
            proxy_read_timeout 120s;
            proxy_pass http://127.0.0.1:$bport;
        }
    }
HTTP
}

my @dir = (Roads::tempdir('t199-n1'), Roads::tempdir('t199-n2'));
Roads::start_nginx($dir[0], $port[0], http_conf($port[0]), 2);
Roads::start_nginx($dir[1], $port[1], http_conf($port[1]), 1);

# --- helpers ----------------------------------------------------------------

sub rkey { $prefix . Digest::SHA::sha256_hex('test') . ":$_[0]" }

# the waiters' mark of $key (no braces in it: "<prefix>{<record key>}:wait")
sub mark { $prefix . '{' . rkey($_[0]) . '}:wait' }

sub listeners {
    my (undef, $n) = split /\n/, redis_cli('PUBSUB', 'NUMSUB', "${prefix}done");
    return $n // 0;
}

# A keep-alive connection to $port served by a worker for which $want->($pid)
# holds (reuseport spreads new connections over the workers): ($sock, $pid)
sub conn_on {
    my ($port, $want) = @_;
    for (1 .. 200) {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                      PeerPort => $port, Timeout => 10)
            or next;
        $s->autoflush(1);
        print $s "GET /pid HTTP/1.1\r\nHost: localhost\r\n\r\n";
        my ($status, undef, $pid) = read_response($s, 10);
        return ($s, $pid) if $status == 200 && $want->($pid);
        close $s;
    }
    die "no connection to the worker wanted\n";
}

# a duplicate on $s, seen waiting: its mark (and the claim behind it) is in
sub duplicate {
    my ($s, $uri, $key) = @_;
    redis_cli('DEL', mark($key));
    send_post($s, $uri, $key);
    return Roads::wait_for(10, sub { redis_cli('EXISTS', mark($key)) eq '1' });
}

sub replayed {
    my ($s, $what) = @_;
    my ($status, $head, $body) = read_response($s, 10);
    is("$status $body", "201 done\n", "$what: the first one's response");
    like($head, qr/^Idempotent-Replayed: true\r?$/mi, "$what: a replay");
}

ok(Roads::wait_for(10, sub { listeners() == 2 }),
   "each node's worker 0 listens on \"<prefix>done\"");

# --- TEST 1: same worker, another worker, another node ----------------------

{
    my $key = "notify-$$";
    my ($first, $pid) = conn_on($port[0], sub { 1 });
    my ($same) = conn_on($port[0], sub { $_[0] == $pid });
    my ($other) = conn_on($port[0], sub { $_[0] != $pid });
    my $node2 = new_conn($port[1]);

    send_post($first, '/slow', $key);
    my $up = upstream_request($backend);
    ok($up, 'TEST 1: the first request reached the upstream');

    ok(duplicate($same, '/slow', $key),
       'TEST 1: a duplicate waits on the same worker');
    ok(duplicate($other, '/slow', $key),
       'TEST 1: a duplicate waits on the other worker');
    ok(duplicate($node2, '/slow', $key),
       'TEST 1: a duplicate waits on the other node');

    answer($up);

    my ($status, undef, $body) = read_response($first, 10);
    is("$status $body", "201 done\n", 'TEST 1: the first request is answered');
    replayed($same, 'TEST 1: same worker');
    replayed($other, 'TEST 1: other worker');
    replayed($node2, 'TEST 1: other node');

    is(waits($port[0]), 'notified 2, polled 0',
       'TEST 1: both duplicates of node 1 were woken by the notification');
    is(waits($port[1]), 'notified 1, polled 0',
       'TEST 1: the duplicate of node 2 was woken by the notification');
    ok(!IO::Select->new($backend)->can_read(0),
       'TEST 1: the upstream saw the key once');
    is(redis_cli('EXISTS', mark($key)), '0',
       'TEST 1: the store took the mark away');
}

# --- TEST 2: no notification: the slow poll ---------------------------------

{
    my $key = "lost-$$";
    my $first = new_conn($port[0]);
    my $dup = new_conn($port[0]);

    send_post($first, '/lossy', $key);
    my $up = upstream_request($backend);
    ok($up, 'TEST 2: the first request reached the upstream');
    ok(duplicate($dup, '/lossy', $key), 'TEST 2: a duplicate waits');

    # as if the waiter's mark were lost: the store publishes nothing
    redis_cli('DEL', mark($key));
    answer($up);

    read_response($first, 10);
    replayed($dup, 'TEST 2: without a notification');
    is(waits($port[0]), 'notified 2, polled 1',
       'TEST 2: the duplicate was woken by its poll');
}

# --- TEST 3: the listener's subscription killed -----------------------------

{
    my $key = "killed-$$";
    my $first = new_conn($port[0]);
    my $dup = new_conn($port[1]);

    send_post($first, '/slow', $key);
    my $up = upstream_request($backend);
    ok($up, 'TEST 3: the first request reached the upstream');
    ok(duplicate($dup, '/slow', $key), 'TEST 3: a duplicate waits on node 2');

    redis_cli('CLIENT', 'KILL', 'TYPE', 'pubsub');
    answer($up);

    read_response($first, 10);
    # within 10 s: its fallback poll (a minute) did not wake it
    replayed($dup, 'TEST 3: the listener lost');
    like(waits($port[1]), qr/^notified 1, polled 1$|^notified 2, polled 0$/,
         'TEST 3: woken once more, by the quick poll or a notification');
    ok(Roads::wait_for(10, sub { listeners() == 2 }),
       'TEST 3: both listeners subscribed again');
}

# --- TEST 4: a release wakes the waiter, which then runs -------------------

{
    my $key = "released-$$";
    my ($n0, $p0) = waits($port[1]) =~ /(\d+), polled (\d+)/;
    my $first = new_conn($port[0]);
    my $dup = new_conn($port[1]);

    send_post($first, '/slow', $key);
    my $up = upstream_request($backend);
    ok($up, 'TEST 4: the first request reached the upstream');
    ok(duplicate($dup, '/slow', $key), 'TEST 4: a duplicate waits on node 2');

    # a 503 is not stored: the claim is released
    print $up "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\n"
              . "Connection: close\r\n\r\nbusy\n";
    close $up;

    my ($status) = read_response($first, 10);
    is($status, 503, 'TEST 4: the first request gets its 503');

    # within 10 s: the fallback poll is a minute away
    my $again = upstream_request($backend);
    ok($again, 'TEST 4: the duplicate claimed the key and ran');
    answer($again) if $again;

    my ($st, $head, $body) = read_response($dup, 10);
    is("$st $body", "201 done\n", 'TEST 4: the duplicate gets its own response');
    unlike($head, qr/^Idempotent-Replayed:/mi, 'TEST 4: not a replay');
    is(waits($port[1]), 'notified ' . ($n0 + 1) . ", polled $p0",
       'TEST 4: the release woke it by a notification');
}

# --- TEST 5: a large record (its head stored after its body) ----------------

{
    my $key = "large-$$";
    my $body = join '', map { sprintf "%07d\n", $_ } 1 .. 4096;   # 32 KiB
    my ($n0, $p0) = waits($port[1]) =~ /(\d+), polled (\d+)/;
    my $first = new_conn($port[0]);
    my $dup = new_conn($port[1]);

    send_post($first, '/slow', $key);
    my $up = upstream_request($backend);
    ok($up, 'TEST 5: the first request reached the upstream');
    ok(duplicate($dup, '/slow', $key), 'TEST 5: a duplicate waits on node 2');

    answer($up, $body);

    my ($status, undef, $got) = read_response($first, 10);
    is($status, 201, 'TEST 5: the first request is answered');
    my $head;
    ($status, $head, $got) = read_response($dup, 10);
    ok($status == 201 && $got eq $body,
       'TEST 5: the duplicate gets the whole 32 KiB body');
    like($head, qr/^Idempotent-Replayed: true\r?$/mi, 'TEST 5: a replay');
    is(waits($port[1]), 'notified ' . ($n0 + 1) . ", polled $p0",
       'TEST 5: woken by the notification sent once the head was stored');
}

Roads::stop();
close $backend;

done_testing();
