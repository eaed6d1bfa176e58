# The store step survives a passing Redis outage: when STORE cannot reach
# Redis (no reply in time, connection lost, Redis restarting), the captured
# response is kept in the worker and sent again once Redis is back, until the
# claim's idempotency_lock_ttl ends; only then, over the retry buffer, or at
# worker exit is it given up, with an error line (docs/behaviour.md, §8).
#
# Redis is taken away at a precise moment by a one-shot upstream
# (upstream_once): nginx forwards to it only after the claim succeeded, and
# it pauses, kills or restarts Redis before it answers.  The nginx location
# /backend logs one EXEC line per execution; a block that reuses nginx counts
# the lines of its own key (the error log is not cut between blocks).
#
# Needs `make test`'s Redis control script (TEST_NGINX_REDIS_CTL): skipped
# without it.  The reload block is skipped under valgrind (no master there).

use Test::Nginx::Socket $ENV{TEST_NGINX_REDIS_CTL}
    ? 'no_plan'
    : (skip_all => 'needs TEST_NGINX_REDIS_CTL (run via make test)');
use lib 't/lib';
use IdemTest;
use IO::Socket::INET;
use POSIX ();
use Socket ();
use Time::HiRes ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t090-$$-" . time() . ":";

# a small command timeout, so that a paused Redis is noticed quickly
our $Timeout = 300 * $Slow;

$ENV{TEST_NGINX_LOCK_TTL} = (1500 * $Slow) . 'ms';

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX}
                      timeout=${Timeout}ms connect_timeout=${Timeout}ms;
};

our $Config = q{
    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /ttl {
        idempotency on;
        idempotency_lock_ttl $TEST_NGINX_LOCK_TTL;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /big {
        idempotency on;
        idempotency_max_response_size 100m;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    # straight to the one-shot upstream: a reset it sends is seen here
    location = /bigcut {
        idempotency on;
        idempotency_max_response_size 100m;
        proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
    }
};

our $Port;      # the one-shot upstream's port of the last config



# Where Redis writes dump.rdb (make test's Redis has no persistence: a test
# that SAVEs removes the file again so that no later restart loads it).
sub redis_dir {
    my $conf = $ENV{TEST_NGINX_REDIS_CONF} // '';
    open my $fh, '<', $conf or return;
    while (<$fh>) {
        return $1 if /^dir\s+(\S+)/;
    }
    return;
}

# state of the record of $key (the second word of its first line), ''
# without one (or without Redis)
sub record_state {
    my ($key) = @_;
    my ($rkey) = split /\n/, redis_cli('--scan', '--pattern',
                                       "$ENV{TEST_NGINX_PREFIX}*:$key");
    return '' unless $rkey;
    my ($state) = redis_cli('GETRANGE', $rkey, 0, 30) =~ /^idem1 (\w+) /;
    return $state // '?';
}

# bounded polls: true once the condition holds, false after $secs
sub wait_state {
    my ($key, $want, $secs) = @_;
    my $end = Time::HiRes::time() + $secs;
    while (Time::HiRes::time() < $end) {
        return 1 if record_state($key) eq $want;
        Time::HiRes::sleep(0.1);
    }
    warn "record of $key did not become '$want' in $secs s\n";
    return 0;
}

# (the log is read on from where the last look ended: at debug level a
# 62 MiB response writes tens of MB of it)
sub wait_log {
    my ($re, $secs) = @_;
    my $file = "$ENV{TEST_NGINX_SERVER_ROOT}/logs/error.log";
    my $end = Time::HiRes::time() + $secs;
    my $pos = 0;
    while (Time::HiRes::time() < $end) {
        if (open my $fh, '<', $file) {
            seek $fh, $pos, 0;
            while (my $line = <$fh>) {
                last if substr($line, -1) ne "\n";    # written half: later
                return 1 if $line =~ $re;
                $pos = tell $fh;
            }
        }
        Time::HiRes::sleep(0.1);
    }
    warn "no line like $re in $secs s\n";
    return 0;
}

# Redis connections of the worker still away: each streak of failures
# begins with an error line ("reconnecting in") and ends with a notice; a
# worker has more than one connection (large bodies go on their own)
sub away_streaks {
    my $file = "$ENV{TEST_NGINX_SERVER_ROOT}/logs/error.log";
    open my $fh, '<', $file or return -1;
    my $n = 0;
    while (<$fh>) {
        $n++ if /\[error\] .*idempotency redis: .*reconnecting in \d+ ms/;
        $n-- if /is reachable again after \d+ failed attempts/;
    }
    return $n;
}

# Redis started again, and back in use: returns once every connection of
# the worker is back (its back-off is up to 2 s), false after $secs
sub redis_back {
    my ($secs) = @_;
    redis_ctl('start');
    return redis_connected($secs);
}

# returns once no connection of the worker is away (after a stop or a
# pause that broke some), false after $secs
sub redis_connected {
    my ($secs) = @_;
    my $end = Time::HiRes::time() + $secs;
    while (Time::HiRes::time() < $end) {
        return 1 if away_streaks() == 0;
        Time::HiRes::sleep(0.1);
    }
    warn "the worker did not reconnect to Redis in $secs s\n";
    return 0;
}

# this block's $TEST_NGINX_RAND_PORT_1, read back from the generated
# nginx.conf: Test::Nginx substitutes it there but does not export it
sub backend_port {
    my $conf = "$ENV{TEST_NGINX_SERVER_ROOT}/conf/nginx.conf";
    open my $in, '<', $conf or die "$conf: $!\n";
    local $/;
    my $text = <$in>;
    $text =~ m{proxy_pass\s+http://127\.0\.0\.1:(\d+)\s*;}
        or die "no proxy_pass to the one-shot upstream in $conf\n";
    return $1;
}

# A one-shot upstream on 127.0.0.1:$o{port} (default: this block's
# $TEST_NGINX_RAND_PORT_1), listening when this returns.  A detached process
# (double fork, nothing left to reap) accepts one request, runs $o{before},
# answers 201 with $o{body}, then runs $o{after}; an alarm bounds its life.
# With $o{reset}, the answer has no Content-Length and the connection is
# reset after the body: a response cut off, whose length was never known.
sub upstream_once {
    my (%o) = @_;
    my $port = $o{port} // backend_port();
    $Port = $port;

    # the one-shot upstream of the block before may still be on its way
    # out (it starts Redis last): its port is free once it has exited
    my ($srv, $end) = (undef, Time::HiRes::time() + 10 * $main::Slow);
    until ($srv = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                        LocalPort => $port, Listen => 5,
                                        ReuseAddr => 1))
    {
        die "upstream: cannot listen on $port: $!\n"
            if !$!{EADDRINUSE} || Time::HiRes::time() > $end;
        Time::HiRes::sleep(0.05);
    }

    my $pid = fork();
    die "fork: $!" unless defined $pid;

    if ($pid == 0) {
        POSIX::_exit(0) if fork();
        open STDOUT, '>', '/dev/null';
        open STDERR, '>', '/dev/null';

        eval {
            local $SIG{ALRM} = sub { die "alarm\n" };
            alarm(int(60 * $main::Slow));

            my $c = $srv->accept or die "accept: $!\n";
            my $buf = '';
            while ($buf !~ /\r\n\r\n/) {
                sysread($c, $buf, 65536, length $buf) or last;
            }
            my ($len) = $buf =~ /^Content-Length:\s*(\d+)/mi;
            my $want = index($buf, "\r\n\r\n") + 4 + ($len // 0);
            while (length $buf < $want) {
                sysread($c, $buf, 65536, length $buf) or last;
            }

            $o{before}->() if $o{before};

            my $body = $o{body} // "created\n";
            my $resp = "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\n"
                       . ($o{reset} ? ''
                          : "Content-Length: " . length($body) . "\r\n")
                       . "Connection: close\r\n\r\n" . $body;
            while (length $resp) {
                my $n = syswrite($c, $resp) or last;
                substr($resp, 0, $n, '');
            }
            if ($o{reset}) {
                Time::HiRes::sleep(0.5 * $main::Slow);
                setsockopt($c, Socket::SOL_SOCKET(), Socket::SO_LINGER(),
                           pack('ii', 1, 0));
            }
            close $c;

            $o{after}->() if $o{after};
            alarm(0);
        };
        POSIX::_exit(0);
    }

    close $srv;
    waitpid($pid, 0);
}

# Redis killed (after a SAVE with $o{save}) before the one-shot upstream
# answers, and started again once the store of $o{key} has been kept for a
# retry (its line in the log): a fixed pause let a slow client (62 MiB
# through a loaded machine) end the response after Redis was back, and the
# store then never failed; the rest as upstream_once
sub away_then_back {
    my (%o) = @_;
    my $hash = key_hash($o{key} // die "away_then_back: no key\n");
    upstream_once(%o,
        before => sub { redis_cli('SAVE') if $o{save}; redis_ctl('kill') },
        after => sub {
            wait_log(qr/store of key_hash=$hash failed .*kept for a retry/,
                     30 * $main::Slow);
            redis_ctl('start');
        });
}

# SIGSTOP or SIGCONT to make test's Redis: stopped, it takes connections
# and commands (the kernel queues them) but answers nothing until it goes
# on, however long that takes (CLIENT PAUSE ends after a fixed time, and
# Redis 6.0 has no CLIENT UNPAUSE)
sub redis_signal {
    my ($sig) = @_;
    open my $fh, '<', $ENV{TEST_NGINX_REDIS_PIDFILE} // '' or return 0;
    my $pid = <$fh> // '';
    chomp $pid;
    return $pid =~ /^\d+$/ && kill($sig, $pid);
}

# whatever happened above, later test files find Redis running, and no
# dump.rdb of ours is loaded by a later restart
END {
    if ($ENV{TEST_NGINX_REDIS_CTL}) {
        redis_signal('CONT');
        system("'$ENV{TEST_NGINX_REDIS_CTL}' start > /dev/null 2>&1");
        my $dir = redis_dir();
        unlink "$dir/dump.rdb" if $dir;
    }
}

master_on();
no_shuffle();
run_tests();

__DATA__

=== TEST 1: Redis paused as the response completes: the client gets the response, the store is kept for a retry
# Redis is stopped until the store's "kept for a retry" line is in the log
# (TEST 2 checks it: the client may get its answer before the line is
# written, both follow the same timeout)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
my $hash = main::key_hash('pause-1');
main::upstream_once(
    before => sub { main::redis_signal('STOP') },
    after => sub {
        main::wait_log(qr/store of key_hash=$hash failed \(no reply in time\), kept for a retry/,
                       30 * $main::Slow);
        main::redis_signal('CONT');
    });
--- request
POST /t
x
--- more_headers
Idempotency-Key: pause-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- response_body
created
--- no_error_log
gave up



=== TEST 2: once Redis is back, a retry gets the replay and the operation ran once
--- init
Test::More::ok(main::wait_log(qr/"127\.0\.0\.1:\d+" store of key_hash=${\ main::key_hash('pause-1')} failed \(no reply in time\), kept for a retry/,
                              30 * $main::Slow),
               'the store found Redis paused and was kept for a retry');
Test::More::ok(main::wait_state('pause-1', 'done', 30 * $main::Slow),
               'it was stored once Redis went on');
# every connection the pause broke is back (the retry would get 503 from
# a worker still in its back-off)
Test::More::ok(main::redis_connected(30 * $main::Slow),
               'every connection of the worker is back');
--- request
POST /t
x
--- more_headers
Idempotency-Key: pause-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
created
--- grep_error_log: EXEC POST /backend pause-1
--- grep_error_log_out
EXEC POST /backend pause-1
--- error_log eval
[qr/storing the response for key_hash=${\ main::key_hash('pause-1')} succeeded after a retry \(attempts: 2\)/,
 qr/every command kept for a retry is settled: 0 parked, 0 bytes; [1-9]\d* resent, 0 given up/]
--- no_error_log
gave up



=== TEST 3: Redis busy (a long script) as the response completes: the store is retried after a back-off
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::upstream_once(before => sub {
    main::redis_busy_after(50);
    my $secs = 1.5 * $main::Slow;
    system("'$ENV{TEST_NGINX_REDIS_CTL}' cli EVAL "
           . "\"local t = redis.call('TIME') "
           . "local stop = t[1] * 1000000 + t[2] + $secs * 1000000 "
           . "repeat t = redis.call('TIME') "
           . "until t[1] * 1000000 + t[2] >= stop\" 0 > /dev/null 2>&1 &");
    # answer once Redis is busy with the script: a fixed pause was too
    # short on a loaded machine (redis-cli itself can take that long)
    my $end = Time::HiRes::time() + 5 * $main::Slow;
    Time::HiRes::sleep(0.02)
        until main::redis_cli('PING') =~ /BUSY/
              || Time::HiRes::time() > $end;
});
--- request
POST /t
x
--- more_headers
Idempotency-Key: busy-1
--- error_code: 201
--- wait eval: 0.3 * $::Slow
--- error_log eval
qr/store of key_hash=${\ main::key_hash('busy-1')} failed \(Redis is busy running a script\), kept for a retry/



=== TEST 4: ... and succeeds once the script is over, on the same connection
--- init
main::wait_state('busy-1', 'done', 10 * $main::Slow);
main::redis_busy_after(5000);
--- request
POST /t
x
--- more_headers
Idempotency-Key: busy-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- grep_error_log: EXEC POST /backend busy-1
--- grep_error_log_out
EXEC POST /backend busy-1
--- error_log eval
[qr/storing the response for key_hash=${\ main::key_hash('busy-1')} succeeded after a retry/,
 qr/every command kept for a retry is settled: 0 parked, 0 bytes; [1-9]\d* resent, 0 given up/]
--- no_error_log
reconnecting



=== TEST 5: Redis killed after the claim and restarted with its data: the store waits for it
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::away_then_back(key => 'kill-1', save => 1);
--- request
POST /t
x
--- more_headers
Idempotency-Key: kill-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- wait eval: 0.3 * $::Slow
--- error_log eval
qr/store of key_hash=${\ main::key_hash('kill-1')} failed \((?:not connected|connection lost)\), kept for a retry/



=== TEST 6: the record survived the restart: the late store completed it, a retry is replayed
--- init
main::wait_state('kill-1', 'done', 10 * $main::Slow);
my $dir = main::redis_dir();
unlink "$dir/dump.rdb" if $dir;
--- request
POST /t
x
--- more_headers
Idempotency-Key: kill-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
created
--- grep_error_log: EXEC POST /backend kill-1
--- grep_error_log_out
EXEC POST /backend kill-1
--- error_log eval
[qr/storing the response for key_hash=${\ main::key_hash('kill-1')} succeeded after a retry/,
 qr/every command kept for a retry is settled: 0 parked, 0 bytes/]
--- no_error_log
gave up



=== TEST 7: Redis restarted without its data: the claim is gone and the late store is refused
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::away_then_back(key => 'lost-1');
--- request
POST /t
x
--- more_headers
Idempotency-Key: lost-1
--- error_code: 201



=== TEST 8: ... so a retry runs the operation again (persistence is what keeps claims)
--- init
main::wait_log(qr/the claim on key_hash=${\ main::key_hash('lost-1')} was lost \(Redis was away/,
               10 * $main::Slow);
main::upstream_once(port => $main::Port);
--- request
POST /t
x
--- more_headers
Idempotency-Key: lost-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- grep_error_log: EXEC POST /backend lost-1
--- grep_error_log_out
EXEC POST /backend lost-1
EXEC POST /backend lost-1
--- no_error_log
gave up



=== TEST 9: Redis away past the lock TTL: the store is given up with an error line
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::upstream_once(before => sub { main::redis_ctl('kill') });
--- request
POST /ttl
x
--- more_headers
Idempotency-Key: ttl-1
--- error_code: 201
--- wait eval: 2 * $::Slow
--- error_log eval
qr/\[error\] .*gave up storing the response for key_hash=${\ main::key_hash('ttl-1')} \(its deadline passed; attempts: \d+, last error: (?:not connected|connection lost)\): the response is lost; once idempotency_lock_ttl ends, a retry runs the operation again/



=== TEST 10: ... the claim expired with it: a retry after Redis is back runs again
--- init
Test::More::ok(main::redis_back(10 * $main::Slow),
               'the worker is back on Redis');
main::upstream_once(port => $main::Port);
--- request
POST /ttl
x
--- more_headers
Idempotency-Key: ttl-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- grep_error_log: EXEC POST /backend ttl-1
--- grep_error_log_out
EXEC POST /backend ttl-1
EXEC POST /backend ttl-1
--- error_log eval
qr/every command kept for a retry is settled: 0 parked, 0 bytes; \d+ resent, 1 given up/



=== TEST 11: a response larger than the retry buffer (64 MiB) is given up at once
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::upstream_once(before => sub { main::redis_ctl('kill') },
                    body => 'x' x (65 * 1024 * 1024));
--- request
POST /big
x
--- more_headers
Idempotency-Key: big-1
--- timeout eval: 30 * $::Slow
--- error_code: 201
--- wait eval: 0.5 * $::Slow
--- error_log eval
[qr/\[error\] .*cannot keep the store of key_hash=${\ main::key_hash('big-1')} \(\d+ bytes\) for a retry: commands kept for a retry may use at most 67108864 bytes \(64 MiB\) per worker, 0 are in use/,
 qr/\[error\] .*gave up storing the response for key_hash=${\ main::key_hash('big-1')} \(the worker's retry buffer is full; attempts: \d+/]
--- no_error_log
kept for a retry for up to



=== TEST 12: Redis back: the same workers store again
--- init
Test::More::ok(main::redis_back(10 * $main::Slow),
               'the worker is back on Redis');
main::upstream_once(port => $main::Port);
--- request
POST /big
x
--- more_headers
Idempotency-Key: big-2
--- error_code: 201
--- wait eval: 0.5 * $::Slow
--- no_error_log eval
qr/gave up storing the response for key_hash=${\ main::key_hash('big-2')}/



=== TEST 13: graceful shutdown (reload) with a store kept for a retry
--- skip_eval: 2: $ENV{TEST_NGINX_USE_VALGRIND}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if $ENV{TEST_NGINX_USE_VALGRIND};    # skipped (the real Test::Nginx runs init anyway)
Time::HiRes::sleep(0.5);
main::upstream_once(before => sub { main::redis_ctl('kill') });
--- request
POST /t
x
--- more_headers
Idempotency-Key: exit-1
--- error_code: 201
--- wait eval: 0.3
--- error_log eval
qr/store of key_hash=${\ main::key_hash('exit-1')} failed .*kept for a retry for up to \d+ ms/



=== TEST 14: ... the old worker does not wait for Redis or the 60 s lock TTL: it gives the store up
--- skip_eval: 3: $ENV{TEST_NGINX_USE_VALGRIND}
--- init
return if $ENV{TEST_NGINX_USE_VALGRIND};    # skipped (the real Test::Nginx runs init anyway)
my $pidfile = "$ENV{TEST_NGINX_SERVER_ROOT}/logs/nginx.pid";
open my $fh, '<', $pidfile or die "no $pidfile: $!";
my $pid = <$fh>;
chomp $pid;
kill 'HUP', $pid or die "cannot HUP $pid";
main::wait_log(qr/gave up storing the response for key_hash=${\ main::key_hash('exit-1')}/, 5);
main::redis_ctl('start');
--- request
GET /
--- error_code: 200
--- error_log eval
[qr/\[error\] .*gave up storing the response for key_hash=${\ main::key_hash('exit-1')} \(the worker is exiting; attempts: \d+, last error: (?:not connected|connection lost)\)/,
 qr/every command kept for a retry is settled: 0 parked, 0 bytes; 0 resent, 1 given up/]



=== TEST 15: a split record (3 MiB) as Redis is killed after the claim: its body waits in chunks for Redis
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::away_then_back(key => 'split-1', save => 1,
                     body => 'y' x (3 * 1024 * 1024 + 5));
--- request
POST /big
x
--- more_headers
Idempotency-Key: split-1
--- timeout eval: 10 * $::Slow
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- wait eval: 0.3 * $::Slow
--- error_log eval
qr/store of key_hash=${\ main::key_hash('split-1')} failed \((?:not connected|connection lost)\), kept for a retry/
--- no_error_log
cannot keep



=== TEST 16: Redis back: the record is stored in chunks, a retry gets the whole body
--- init
Test::More::ok(main::wait_state('split-1', 'split', 10 * $main::Slow),
               'the body went in chunks once Redis was back: the record is split');
my $dir = main::redis_dir();
unlink "$dir/dump.rdb" if $dir;
--- request
POST /big
x
--- more_headers
Idempotency-Key: split-1
--- timeout eval: 10 * $::Slow
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body eval: 'y' x (3 * 1024 * 1024 + 5)
--- grep_error_log: EXEC POST /backend split-1
--- grep_error_log_out
EXEC POST /backend split-1
--- error_log eval
[qr/storing the response for key_hash=${\ main::key_hash('split-1')} succeeded after a retry/,
 qr/every command kept for a retry is settled: 0 parked, 0 bytes/]
--- no_error_log
gave up



=== TEST 17: that body no longer counts against the retry buffer: 62 MiB more can wait for Redis
--- skip_eval: 3: $ENV{TEST_NGINX_USE_VALGRIND}
--- init
return if $ENV{TEST_NGINX_USE_VALGRIND};    # skipped: 62 MiB is slow there
main::away_then_back(key => 'split-2', port => $main::Port,
                     body => 'z' x (62 * 1024 * 1024));
--- request
POST /big
x
--- more_headers
Idempotency-Key: split-2
--- timeout eval: 30 * $::Slow
--- error_code: 201
--- wait eval: 0.5 * $::Slow
--- error_log eval
qr/store of key_hash=${\ main::key_hash('split-2')} failed \((?:not connected|connection lost)\), kept for a retry/
--- no_error_log
cannot keep



=== TEST 18: a response of unknown length cut off after 2 MiB is held as outcome unknown: its record is a head, no body
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::upstream_once(reset => 1, body => 'c' x (2 * 1024 * 1024 + 7));
my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                 PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
                                 Timeout => 10 * $main::Slow)
    or die "connect: $!";
print $sock "POST /bigcut HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: cut-1\r\n"
            . "Content-Length: 1\r\nConnection: close\r\n\r\nx";
1 while sysread($sock, my $buf, 65536);
close $sock;
main::wait_state('cut-1', 'unknown', 10 * $main::Slow);
my ($rkey) = split /\n/, main::redis_cli('--scan', '--pattern',
                                         "$ENV{TEST_NGINX_PREFIX}*:cut-1");
Test::More::like(main::redis_cli('GET', $rkey), qr/^idem1 unknown [^\n]*\r\n\r\n\z/,
                 'the unknown record is a head alone, no part of the body');
--- request
POST /bigcut
x
--- more_headers
Idempotency-Key: cut-1
--- error_code: 502
--- response_body_like: outcome-unknown
