package WaitNotify;

# Helpers of the waiting-duplicate suites (t/199, t/200): raw HTTP/1.1 on
# sockets, and an upstream that is the test itself: the first request of a
# key waits in its backlog until the test answers it, so that duplicates
# can be seen waiting first (their mark in Redis) without any timing.

use strict;
use warnings;

use Exporter 'import';
use IO::Select ();
use IO::Socket::INET ();
use JSON::PP ();

use IdemTest ();

our @EXPORT = qw(read_response send_post new_conn backend upstream_request
                 answer waits);

my $Slow = $IdemTest::Slow;

# reads one response with a Content-Length from $s: (status, head, body)
sub read_response {
    my ($s, $secs) = @_;
    my $sel = IO::Select->new($s);
    my $buf = '';
    my $end = time + $secs * $Slow;
    while (time < $end) {
        if ($buf =~ /\r\n\r\n/) {
            my ($head, $body) = split /\r\n\r\n/, $buf, 2;
            my ($len) = $head =~ /^Content-Length: (\d+)/mi;
            if (defined $len && length($body) >= $len) {
                my ($status) = $head =~ m{^HTTP/1\.[01] (\d{3})};
                return ($status, $head, substr($body, 0, $len));
            }
        }
        next unless $sel->can_read(0.1);
        my $n = sysread($s, my $chunk, 65536);
        last unless $n;
        $buf .= $chunk;
    }
    return (0, '', '');
}

sub send_post {
    my ($s, $uri, $key) = @_;
    print $s "POST $uri HTTP/1.1\r\nHost: localhost\r\n"
             . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
             . "Connection: close\r\n\r\nx";
}

sub new_conn {
    my ($port) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Timeout => 10)
        or die "connect: $!\n";
    $s->autoflush(1);
    return $s;
}

# the upstream: connections wait in its backlog until the test accepts them
sub backend {
    my $s = IO::Socket::INET->new(Listen => 16, LocalAddr => '127.0.0.1',
                                  LocalPort => 0, Proto => 'tcp',
                                  ReuseAddr => 1)
        or die "backend: $!\n";
    return $s;
}

# the first request of a key reaches the upstream: its connection
sub upstream_request {
    my ($backend) = @_;
    my $sel = IO::Select->new($backend);
    return undef unless $sel->can_read(10 * $Slow);
    my $c = $backend->accept or return undef;
    my $req = '';
    my $csel = IO::Select->new($c);
    while ($req !~ /\r\n\r\nx/ && $csel->can_read(10 * $Slow)) {
        sysread($c, $req, 4096, length $req) or last;
    }
    return $c;
}

# answers the first request: 201 with $body (default "done\n")
sub answer {
    my ($c, $body) = @_;
    $body //= "done\n";
    print $c "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\n"
             . 'Content-Length: ' . length($body) . "\r\n"
             . "Connection: close\r\n\r\n$body";
    close $c;
}

# the node's waits counters (status location /status): "notified N, polled M"
sub waits {
    my ($port) = @_;
    my $s = new_conn($port);
    print $s "GET /status?format=json HTTP/1.1\r\nHost: localhost\r\n"
             . "Connection: close\r\n\r\n";
    my ($status, undef, $body) = read_response($s, 10);
    die "status: $status\n" unless $status == 200;
    my $w = JSON::PP::decode_json($body)->{waits};
    return "notified $w->{notified}, polled $w->{polled}";
}

1;
