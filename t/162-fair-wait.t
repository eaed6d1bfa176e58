# Fair waiting: duplicates waiting under idempotency_wait are bounded per
# scope as well as per worker, so one scope that floods waits cannot turn
# another scope's wait into a 409.
#
# The flooding client (scope "Bearer flood") sends more duplicates of its
# running request than a worker lets wait at all (1024); only 64 of them
# wait, the others get 409 at once.  A duplicate of another scope's running
# request ("Bearer victim"), sent after the flood, still waits and gets its
# replay.  The upstream is slowed down with limit_rate so that both first
# requests run for the whole choreography.

# Under valgrind 1100 connections cannot be opened and answered within the
# choreography's timings; the wait paths run there through t/050 and t/160.
use Test::Nginx::Socket $ENV{TEST_NGINX_USE_VALGRIND}
    ? (skip_all => 'a flood of 1100 duplicates is not run under valgrind')
    : 'no_plan';
use lib 't/lib';
use IdemTest;
use IO::Select ();
use IO::Socket::INET ();
use Time::HiRes ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t162-$$-" . time() . ":";

our $Flood = 1100;

# the response of the upstream takes about 14 s (more under valgrind)
$ENV{TEST_NGINX_RATE} = int(16 / $Slow) || 1;

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

our $Config = q{
    location = /wait {
        idempotency on;
        idempotency_scope $http_authorization;     # one scope per client
        idempotency_wait 60s;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /ping {
        return 204;
    }

    location = /backend {
        access_log logs/error.log exec;
        limit_rate $TEST_NGINX_RATE;
        return 201 "done for $http_authorization\n";
    }
};

# a connected socket with the request written, or undef
sub send_req {
    my ($auth, $key) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
                                  Timeout => 10)
        or return undef;
    $s->autoflush(1);
    print $s "POST /wait HTTP/1.1\r\nHost: localhost\r\n"
             . "Authorization: $auth\r\nIdempotency-Key: $key\r\n"
             . "Content-Length: 1\r\nConnection: close\r\n\r\nx";
    return $s;
}

# reads the whole response of one socket (the server closes it)
sub read_resp {
    my ($s, $secs) = @_;
    my $sel = IO::Select->new($s);
    my $resp = '';
    my $until = Time::HiRes::time() + $secs;
    while (Time::HiRes::time() < $until) {
        next unless $sel->can_read(0.2);
        my $n = sysread($s, my $buf, 65536);
        last unless $n;
        $resp .= $buf;
    }
    return $resp;
}

# Reads what has arrived on the flood's sockets for up to $secs seconds,
# stopping early once nothing new came for $quiet seconds; returns the
# number of complete 409 answers seen so far (closed sockets are dropped).
sub drain {
    my ($socks, $count, $secs, $quiet) = @_;
    my $sel = IO::Select->new(@$socks);
    my %buf;
    my $until = Time::HiRes::time() + $secs;
    my $last = Time::HiRes::time();
    while ($sel->count && Time::HiRes::time() < $until) {
        my @ready = $sel->can_read(0.2);
        if (!@ready) {
            last if Time::HiRes::time() - $last > $quiet && $$count > 0;
            next;
        }
        $last = Time::HiRes::time();
        for my $s (@ready) {
            my $n = sysread($s, my $chunk, 4096);
            $buf{$s} .= $chunk if $n;
            next if $n;
            $$count++ if ($buf{$s} // '') =~ m{^HTTP/1\.1 409 };
            $sel->remove($s);
            close $s;
        }
    }
    @$socks = $sel->handles;
}

worker_connections(4096);
no_shuffle();
run_tests();

__DATA__

=== TEST 1: one scope floods waits, another scope's wait still gets its replay
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
my $first_a = main::send_req('Bearer flood', 'fair-a');
my $first_b = main::send_req('Bearer victim', 'fair-b');
select(undef, undef, undef, 1 * $main::Slow);

# the flood: more duplicates of the running request than a worker lets wait
my @flood;
for (1 .. $::Flood) {
    my $s = main::send_req('Bearer flood', 'fair-a') or last;
    push @flood, $s;
}
Test::More::is(scalar @flood, $::Flood, 'the flood is sent');

# all of it is in: the duplicates beyond the cap have their 409 (poll
# until no more come)
my $conflicts = 0;
main::drain(\@flood, \$conflicts, 20 * $main::Slow, 2 * $main::Slow);
Test::More::cmp_ok($conflicts, '>=', $::Flood - 64,
                   "the flooding scope holds at most 64 waits ($conflicts "
                   . "of $::Flood got 409 at once)");

# another scope's duplicate waits and gets its replay
my $dup = main::send_req('Bearer victim', 'fair-b');
my $resp = main::read_resp($dup, 40 * $main::Slow);
Test::More::like($resp, qr{^HTTP/1\.1 201 }, "the other scope's wait: 201");
Test::More::like($resp, qr/\r\nIdempotent-Replayed: true\r\n/i,
                 "... replayed");
Test::More::like($resp, qr/done for Bearer victim\n\z/, '... its own response');

# the flood's waiters get the first request's replay in the end
main::drain(\@flood, \my $late, 40 * $main::Slow, 40 * $main::Slow);
main::read_resp($_, 1) for $first_a, $first_b;
--- request
GET /ping
--- error_code: 204
--- error_log
64 duplicates of this scope wait already, answering 409 at once
--- grep_error_log: EXEC POST /backend fair-b
--- grep_error_log_out
EXEC POST /backend fair-b
--- timeout: 10
