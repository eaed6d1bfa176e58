# The held last byte (read-after-complete) is its own request's: it goes
# out when that request's store is acknowledged, and it never costs the
# client its response.
#
# TEST 1: a reply to another request's settle step on the same key (a
# duplicate whose claim went unanswered, so that its release is given up)
# does not let the first request's last byte go while its store waits for
# Redis (CLIENT PAUSE WRITE).  The duplicate comes through a second server
# whose Redis is behind a proxy that is muted once it is connected.
#
# TEST 2: with send_timeout shorter than the Redis timeout=, a store that
# waits for Redis longer than send_timeout does not cut the client off one
# byte short: the hold ends first.
#
# The upstream is this script itself (a listening socket), so that each
# step waits for the one before it, not for a clock.  Needs make test's
# Redis control script (CLIENT PAUSE); skipped without it, and on Redis
# 6.0 (make test REDIS=6.0.20), which has no CLIENT PAUSE WRITE (6.2+).

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use DelayProxy;
use Cwd ();
use Digest::SHA ();
use IO::Select;
use IO::Socket::INET;
use Time::HiRes ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t155-$$-" . time() . ":";

our ($ProxyPid, $ProxyPort) =
    DelayProxy::start($ENV{TEST_NGINX_REDIS_PORT}, 0);

END { DelayProxy::stop($ProxyPid) if $ProxyPid && $$ != $ProxyPid; }

# the upstream: this script accepts and answers
our $Up = IO::Socket::INET->new(Listen => 8, LocalAddr => '127.0.0.1',
                                LocalPort => 0, Proto => 'tcp',
                                ReuseAddr => 1)
    or die "upstream: $!\n";
our $UpPort = $Up->sockport;

# the second server, whose Redis is behind the proxy
our $OtherPort = free_port();

our $HttpConfig = qq~
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX} timeout=30s;

    server {
        listen 127.0.0.1:$OtherPort;
        idempotency_redis 127.0.0.1:$ProxyPort
                          prefix=$ENV{TEST_NGINX_PREFIX} timeout=300ms;

        location = /op {
            idempotency on;
            idempotency_scope "t";
            idempotency_lock_ttl 1s;
            proxy_pass http://127.0.0.1:$UpPort;
        }

        location = /warm {
            idempotency on;
            idempotency_scope "t";
            proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/b/ok;
        }
    }
~;

our $Config = qq~
        location = /op {
            idempotency on;
            idempotency_scope "t";
            proxy_pass http://127.0.0.1:$UpPort;
        }

        location = /send-timeout {
            idempotency on;
            idempotency_scope "t";
            send_timeout 1s;
            proxy_pass http://127.0.0.1:$UpPort;
        }

        location = /b/ok {
            return 200 "ok\\n";
        }
~;

our $Body = join '', map { sprintf "line %04d %s\n", $_, '.' x 40 } 1 .. 100;

sub post {
    my ($port, $uri, $key) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Timeout => 10 * $Slow)
        or die "connect: $!\n";
    print $s "POST $uri HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
             . "Idempotency-Key: $key\r\nContent-Length: 1\r\n\r\nx";
    return $s;
}

# Reads from $s into $$raw until $done->($$raw), the peer closes or
# $secs pass; returns whether $done said so.
sub read_until {
    my ($s, $raw, $done, $secs) = @_;
    my $sel = IO::Select->new($s);
    my $end = Time::HiRes::time() + $secs;
    until ($done->($$raw)) {
        my $left = $end - Time::HiRes::time();
        return 0 if $left <= 0 || !$sel->can_read($left);
        my $n = sysread($s, my $buf, 65536);
        return 0 unless $n;
        $$raw .= $buf;
    }
    return 1;
}

# the status and how many body bytes $raw has (-1: no header yet)
sub parse {
    my ($raw) = @_;
    return (0, -1) unless $raw =~ /\r\n\r\n/;
    my ($head, $body) = split /\r\n\r\n/, $raw, 2;
    my ($status) = $head =~ m{^HTTP/\S+ (\d+)};
    return ($status // 0, length $body);
}

sub has_body {
    my ($n) = @_;
    return sub { (parse($_[0]))[1] >= $n };
}

# takes the proxied request and answers it with $Body, calling $before
# first (the claim is in Redis by then)
sub upstream {
    my ($before) = @_;
    IO::Select->new($::Up)->can_read(20 * $Slow)
        or die "the upstream was never asked\n";
    my $c = $::Up->accept or die "accept: $!\n";
    my $req = '';
    read_until($c, \$req, sub { $_[0] =~ /\r\n\r\n/ }, 10 * $Slow);
    $before->();
    print $c "HTTP/1.1 200 OK\r\nContent-Length: " . length($::Body)
             . "\r\nConnection: close\r\n\r\n$::Body";
    close $c;
}

sub state_of {
    my ($key) = @_;
    my $rec = main::redis_cli('GET', $ENV{TEST_NGINX_PREFIX}
                                     . Digest::SHA::sha256_hex('t') . ":$key");
    return ($rec =~ /^idem1 (\S+)/)[0] // 'none';
}

sub log_has {
    my ($re) = @_;
    my $root = $ENV{TEST_NGINX_SERVROOT} || Cwd::cwd() . '/t/servroot';
    open(my $fh, '<', "$root/logs/error.log") or return 0;
    while (<$fh>) {
        return 1 if /$re/;
    }
    return 0;
}


no_shuffle();
run_tests();

__DATA__

=== TEST 1: another request's settle reply on the same key does not release a held last byte before its own store is acknowledged
--- skip_eval: 6: !$ENV{TEST_NGINX_REDIS_CTL} || main::redis_older(6, 2)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL} || main::redis_older(6, 2);
my $n = length $::Body;

# the second server's Redis connection is up (a 503 until it is)
my $warm = '';
for my $i (1 .. 100) {
    my $w = main::post($::OtherPort, '/warm', "warm-$i");
    my $raw = '';
    main::read_until($w, \$raw, sub { 0 }, 10 * $::Slow);
    last if ($warm = (main::parse($raw))[0]) == 200;
    select(undef, undef, undef, 0.1);
}
Test::More::is($warm, 200, 'the second server reaches Redis');

# the first request: its store waits for Redis, its last byte is held
my $first = main::post($ENV{TEST_NGINX_SERVER_PORT}, '/op', 'k1');
main::upstream(sub {
    main::redis_cli('CLIENT', 'PAUSE', 60000 * $::Slow, 'WRITE');
});
my $raw = '';
Test::More::ok(main::read_until($first, \$raw, main::has_body($n - 1),
                                20 * $::Slow),
               'the first response is there but for its last byte');

# a duplicate on the other server: its claim goes unanswered, its release
# is given up after idempotency_lock_ttl
DelayProxy::mute($::ProxyPid);
my $dup = main::post($::OtherPort, '/op', 'k1');
my $hash = substr(Digest::SHA::sha256_hex($ENV{TEST_NGINX_PREFIX}
                  . Digest::SHA::sha256_hex('t') . ':k1'), 0, 16);
my $end = Time::HiRes::time() + 30 * $::Slow;
until (main::log_has(qr/gave up releasing the claim on key_hash=$hash/)
       || Time::HiRes::time() > $end)
{
    select(undef, undef, undef, 0.05);
}
Test::More::ok(main::log_has(qr/gave up releasing the claim on key_hash=$hash/),
               "the duplicate's release was given up");

# today's code let the last byte go right then, with the record in flight
my $early = main::read_until($first, \$raw, main::has_body($n), 2 * $::Slow);
my $state = main::state_of('k1');
main::redis_cli('CLIENT', 'UNPAUSE');

Test::More::ok(!$early || $state eq 'done',
               "the last byte did not go before the store was "
               . "acknowledged (record $state)");
main::read_until($first, \$raw, main::has_body($n), 20 * $::Slow);
Test::More::is(join(' ', main::parse($raw)), "200 $n",
               'the whole response, once stored');
Test::More::is(main::state_of('k1'), 'done', 'stored');
close $first;
close $dup;
--- request
GET /b/ok
--- error_code: 200



=== TEST 2: a store waiting longer than send_timeout (1s) but within timeout= (30s): the client gets the whole response, not all but its last byte
--- skip_eval: 3: !$ENV{TEST_NGINX_REDIS_CTL} || main::redis_older(6, 2)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL} || main::redis_older(6, 2);
my $n = length $::Body;
my $first = main::post($ENV{TEST_NGINX_SERVER_PORT}, '/send-timeout', 'k2');
main::upstream(sub {
    main::redis_cli('CLIENT', 'PAUSE', 60000 * $::Slow, 'WRITE');
});
my $raw = '';
main::read_until($first, \$raw, main::has_body($n), 20 * $::Slow);
main::redis_cli('CLIENT', 'UNPAUSE');
Test::More::is(join(' ', main::parse($raw)), "200 $n",
               'the whole response');
my $end = Time::HiRes::time() + 20 * $::Slow;
while (main::state_of('k2') ne 'done' && Time::HiRes::time() < $end) {
    select(undef, undef, undef, 0.05);
}
Test::More::is(main::state_of('k2'), 'done', 'stored once Redis is back');
close $first;
--- request
GET /b/ok
--- error_code: 200
--- no_error_log
client timed out
