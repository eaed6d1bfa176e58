# What an idempotency_admin DELETE removes: every entry of the key in this
# node's replay cache, whatever the idempotency_redis it was read or
# stored through (an admin location that writes the same server in other
# words, here with an ACL user that may not PUBLISH, so that only the local
# purge acts); a split record's body chunks with its head; and a record
# read from Redis before the purge but answered after it (held by a proxy
# of the test for longer than a purge used to keep such reads out) does
# not enter the zone again.
#
# A plain Test::More file with its own nginx (one worker) in front of the
# Redis of make test.  Run from the repository root (prove does).

use strict;
use warnings;
use Test::More;
use File::Path ();
use File::Spec ();
use File::Temp ();
use Digest::SHA ();
use IO::Select ();
use IO::Socket::INET ();
use POSIX ();

use lib 't/lib';
use IdemTest ();
use Roads ();

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'ACL users need Redis 6.0'
    if IdemTest::redis_older(6, 0);

my $Redis = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $Prefix = "t196-$$-" . time() . ':';
my $User = "t196-$$";
my $Pass = "t196pw$$";
my $Slow = $IdemTest::Slow;

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t196-XXXXXX',
                                                   DIR => $base));
chmod 0755, $dir;

my ($nginx_pid, $proxy_pid);
my $port = IdemTest::free_port();
my $port_plain = IdemTest::free_port();
my $port_slow = IdemTest::free_port();

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

# an ACL user that may do all but PUBLISH: its purges reach no listener
# (it may SUBSCRIBE: channel rights from Redis 6.2 on)
is(rcli('ACL', 'SETUSER', $User, 'reset', 'on', ">$Pass", '~*',
        (IdemTest::redis_older(6, 2) ? () : '&*'), '+@all', '-publish'),
   'OK', 'an ACL user that may not PUBLISH');

# a large response: two chunks of a split record
Roads::write_file("$dir/big.bin", 'b' x 2_000_000);

$proxy_pid = start_hold_proxy($Redis, "$dir/proxy");
my $proxy_port = Roads::slurp("$dir/proxy.port");

$nginx_pid = Roads::start_nginx($dir, $port, http_conf(), 1);


# --- every entry of the key: an admin location with other words --------

is(post('/t', 'k3'), '201 MISS MISS', 'a new key runs');
ok(wait_for(10, sub { post('/t', 'k3') eq '201 HIT HIT' }),
   'its retry is replayed from the zone');
is(admin('/quiet', 'DELETE', 'k3'), 204,
   'removed through an admin location with another idempotency_redis '
   . '(its PUBLISH refused)');
is(post('/t', 'k3'), '201 MISS MISS',
   'the key runs again: the entry went with the record');


# --- a split record's body goes with it ---------------------------------

like(post('/big', 'k4'), qr/^200 MISS /, 'a 2 MB response runs');
ok(wait_for(10, sub { chunks('k4') == 2 }), 'stored as a head and two chunks')
    or diag(join "\n", keys_left('k4'));
is(admin('/admin', 'DELETE', 'k4'), 204, 'removed through idempotency_admin');
is(chunks('k4'), 0, 'no chunk of its body is left');
is(scalar(keys_left('k4')), 0, 'no key of it at all');
like(post('/big', 'k4'), qr/^200 MISS /, 'the key runs again');
ok(wait_for(10, sub { chunks('k4') == 2 }), 'and is stored split again');


# --- a read answered after the purge: not in the zone -------------------

is(post('/t', 'k7', $port_plain), '201 MISS -',
   'a record stored without the zone');
hold_next_read("$dir/proxy");
is(post('/t', 'k7', $port_slow), '201 HIT MISS',
   'replayed from Redis through the proxy');
ok(wait_for(10, sub { -e "$dir/proxy.held" }),
   'the record\'s read for the zone was answered by Redis and is held');
is(admin('/admin', 'DELETE', 'k7'), 204, 'then the record is removed');
# longer than a purge used to keep late reads out (2 s); the read's
# timeout (30 s) is longer still
select(undef, undef, undef, 3 * $Slow);
release_reads("$dir/proxy");
ok(wait_for(10, sub { -e "$dir/proxy.released" }),
   'the held answer reaches nginx');
# one round trip on the only worker: the answer was read before it
like(status(), qr/"cache"/, 'the worker answers');
is(post('/t', 'k7', $port_slow), '201 MISS MISS',
   'the key runs again: the late answer did not refill the zone');


# --- a read answered after purges may have been missed: not in the zone --

is(post('/t', 'k8', $port_plain), '201 MISS -',
   'another record stored without the zone');
hold_next_read("$dir/proxy");
is(post('/t', 'k8', $port_slow), '201 HIT MISS',
   'replayed from Redis through the proxy');
ok(wait_for(10, sub { -e "$dir/proxy.held" && !-e "$dir/proxy.released" }),
   'its read for the zone is held');
my $subs = numsub();
cmp_ok($subs, '>=', 2, "the worker listens for purges ($subs subscriptions)");
# removed while no one listens: as a purge the node did not hear
rcli('CLIENT', 'KILL', 'TYPE', 'pubsub');
is(rcli('DEL', "${Prefix}" . Digest::SHA::sha256_hex('test:') . ':k8'), 1,
   'the record is removed while the subscriptions are down');
ok(wait_for(20, sub { again() >= $subs && numsub() == $subs }),
   'the worker listens again: entries older than that are misses');
release_reads("$dir/proxy");
ok(wait_for(10, sub { -e "$dir/proxy.released" }),
   'the held answer reaches nginx');
like(status(), qr/"cache"/, 'the worker answers');
is(post('/t', 'k8', $port_slow), '201 MISS MISS',
   'the key runs again: the answer to a read sent before did not '
   . 'enter the zone');

my $log = Roads::slurp("$dir/nginx/logs/error.log");
unlike($log, qr/\[(?:alert|crit|emerg)\]/, 'no alert in the error log');

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


# --- helpers -------------------------------------------------------------

sub rcli {
    my $out = '';
    open my $h, '-|', 'redis-cli', '-h', '127.0.0.1', '-p', $Redis, @_
        or return '';
    local $/;
    $out = <$h> // '';
    close $h;
    $out =~ s/\s+\z//;
    return $out;
}

# the keys of $key left in Redis (record and body), and its body's chunks
sub keys_left {
    my ($key) = @_;
    return grep { length } split /\n/, rcli('KEYS', "$Prefix*:$key*");
}
sub chunks { scalar grep { /:body:/ } keys_left(@_) }

# POST with a key: "status idempotency-status cache"; $to: another port
sub post {
    my ($uri, $key, $to) = @_;
    my $resp = IdemTest::exchange($to // $port,
                                  "POST $uri HTTP/1.1\r\nHost: localhost\r\n"
                                  . "Idempotency-Key: $key\r\n"
                                  . "Content-Length: 1\r\n"
                                  . "Connection: close\r\n\r\nx", 30);

    my ($status) = $resp =~ m{^HTTP/1\.\d (\d+)};
    my ($idem) = $resp =~ /^X-Idempotency-Status: (\S+)/mi;
    my ($cache) = $resp =~ /^X-Idempotency-Cache: (\S+)/mi;

    return join ' ', $status // 0, $idem // 'none', $cache // 'none';
}

sub admin {
    my ($uri, $method, $key) = @_;
    my $resp = IdemTest::exchange($port,
        "$method $uri?key=$key&scope=test: HTTP/1.1\r\nHost: localhost\r\n"
        . "Connection: close\r\n\r\n");
    my ($status) = $resp =~ m{^HTTP/1\.\d (\d+)};
    return $status // 0;
}

sub status {
    return IdemTest::exchange($port,
        "GET /status?format=json HTTP/1.1\r\nHost: localhost\r\n"
        . "Connection: close\r\n\r\n");
}

sub wait_for { Roads::wait_for(@_) }

# the subscriptions to the purge channel (worker 0's, one per Redis)
sub numsub {
    my (undef, $n) = split /\n/, rcli('PUBSUB', 'NUMSUB', "${Prefix}purge");
    return $n // 0;
}

# how many times a subscription came back
sub again {
    my @l = Roads::slurp("$dir/nginx/logs/error.log")
            =~ /subscribed to "\Q${Prefix}\Epurge" at \S+ again/g;
    return scalar @l;
}

# A TCP proxy to Redis in a child process that passes everything, except
# that once armed (hold_next_read) it keeps the next answer Redis gives to
# the replay cache's read of a record (a two-element array: the record and
# its PTTL) until release_reads; "$state.held" and "$state.released" say
# when.  The port in "$state.port"; returns the child's pid.
sub start_hold_proxy {
    my ($target, $state) = @_;

    my $l = IO::Socket::INET->new(Listen => 16, LocalAddr => '127.0.0.1',
                                  LocalPort => 0, Proto => 'tcp',
                                  ReuseAddr => 1)
        or die "hold proxy: listen: $!\n";
    Roads::write_file("$state.port", $l->sockport);
    my $parent = $$;

    my $pid = fork;
    die "hold proxy: fork: $!\n" unless defined $pid;

    if ($pid) {
        close $l;
        return $pid;
    }

    my $sel = IO::Select->new($l);
    my (%peer, %upstream, @held);
    my ($armed, $release) = (0, 0);

    local $SIG{USR1} = sub { $armed = 1 };
    local $SIG{USR2} = sub { $release = 1 };
    local $SIG{PIPE} = 'IGNORE';
    # never the parent's handlers nor its END blocks
    local $SIG{INT} = 'DEFAULT';
    local $SIG{TERM} = 'DEFAULT';
    local $SIG{__DIE__} = sub { POSIX::_exit(1) };

    # (the ready handles held in an array: one closed on the way is not
    # freed under the loop)
    while (getppid() == $parent) {
        my @ready = $sel->can_read(0.1);
        for my $fh (@ready) {
            if ($fh == $l) {
                my $c = $l->accept or next;
                my $u = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                              PeerPort => $target,
                                              Proto => 'tcp');
                if (!$u) {
                    close $c;
                    next;
                }
                $peer{$c} = $u;
                $peer{$u} = $c;
                $upstream{$u} = 1;
                $sel->add($c, $u);
                next;
            }

            next unless $peer{$fh};

            my $n = sysread($fh, my $buf, 1 << 20);
            if (!$n) {
                my @pair = ($fh, $peer{$fh});    # copies: freed below
                for my $h (@pair) {
                    $sel->remove($h);
                    delete $peer{$h};
                    delete $upstream{$h};
                    close $h;
                }
                next;
            }

            if ($armed && $upstream{$fh} && $buf =~ /^\*2\r\n/) {
                $armed = 0;
                push @held, [$peer{$fh}, $buf];
                Roads::write_file("$state.held", '');
                next;
            }

            put($peer{$fh}, $buf);
        }

        if ($release) {
            $release = 0;
            put($_->[0], $_->[1]) for @held;
            @held = ();
            Roads::write_file("$state.released", '');
        }
    }

    POSIX::_exit(0);
}

sub put {
    my ($fh, $buf) = @_;
    while (length $buf) {
        my $n = syswrite($fh, $buf);
        return unless $n;
        substr($buf, 0, $n) = '';
    }
}

sub hold_next_read {
    unlink "$_[0].held", "$_[0].released";
    kill 'USR1', $proxy_pid;
}
sub release_reads { kill 'USR2', $proxy_pid }

# the protected locations, each in a server of its own at the same URI
# (the fingerprint holds it)
sub protected {
    my ($more) = @_;
    return <<LOC;
        location = /t {
            idempotency on;
            add_header X-Idempotency-Status \$idempotency_status always;
            add_header X-Idempotency-Cache \$idempotency_cache always;
            $more
            proxy_pass http://127.0.0.1:$port/backend;
        }
LOC
}

sub http_conf {
    my $t = protected('idempotency_cache purge;');
    my $plain = protected('');
    # through the proxy, whose reads may come back late
    my $slow = protected("idempotency_cache purge;
            idempotency_redis 127.0.0.1:$proxy_port prefix=$Prefix
                              timeout=30s connect_timeout=5s;");

    return <<HTTP;
    idempotency_redis 127.0.0.1:$Redis prefix=$Prefix timeout=5s
                      connect_timeout=5s;
    idempotency_scope "test:";
    idempotency_cache_zone purge:4m;

    server {
        listen 127.0.0.1:$port;

$t
        location = /big {
            idempotency on;
            idempotency_max_response_size 4m;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_method GET;
            proxy_pass http://127.0.0.1:$port/big.bin;
        }

        location = /big.bin {
            root $dir;
        }

        location = /admin {
            idempotency_admin;
        }

        # the same server in other words, as a user that may not PUBLISH
        location = /quiet {
            idempotency_admin;
            idempotency_redis 127.0.0.1:$Redis prefix=$Prefix
                              user=$User password=$Pass timeout=2s;
        }

        location = /status {
            idempotency_status;
        }

        location = /backend {
            return 201 "ran \$request_id\\n";
        }
    }

    server {
        listen 127.0.0.1:$port_plain;
$plain
    }

    server {
        listen 127.0.0.1:$port_slow;
$slow
    }
HTTP
}

sub stop_all {
    Roads::stop();
    undef $nginx_pid;

    if ($proxy_pid) {
        kill 'TERM', $proxy_pid;
        waitpid($proxy_pid, 0);
        undef $proxy_pid;
    }
}

END {
    my $status = $?;
    stop_all();
    rcli('ACL', 'DELUSER', $User) if $User;
    $? = $status;
}
