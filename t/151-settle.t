# Every claim ends in exactly one of: recorded, released (nothing ran, or
# the status policy says retry), or held for idempotency_ttl as "outcome
# unknown".  One block per road of issue 12, each a case that used to end
# otherwise (kept until the lock TTL and then run again, or run twice):
#
#   1 header-only responses (204, HEAD, X-Accel-Redirect to "return 204",
#     HTTP/2)                        5 a claim whose reply came too late
#   2 error_page to a named location 6 an upstream that failed after it got
#   3 HTTP/2 + ignore_client_abort     the request; never reached; policy
#   4 client aborts, default config  7 ranges and 1xx
#
# Read-after-complete (issue case 5) is t/153-read-after-complete.t: it
# needs two workers.
#
# Each block does its choreography in "--- init" with raw HTTP/1.x sockets
# (and curl for HTTP/2, from a second server "listen ... http2" with the
# same locations, as t/080-http2.t does), counts the executions from the
# backend's access log lines ("EXEC <method> <uri> <key>" in error.log),
# and asserts with Test::More; the block's own request is a cheap check.

BEGIN {
    my $nginx = $ENV{TEST_NGINX_BINARY} || 'nginx';
    my $curl_v = `curl -V 2>/dev/null` // '';
    my $nginx_v = `'$nginx' -V 2>&1` // '';
    our $NoH2 = $curl_v eq ''                          ? 'curl is not installed'
              : $curl_v !~ /^Features:.*\bHTTP2\b/m    ? 'curl lacks HTTP/2'
              : $nginx_v !~ /--with-http_v2_module\b/   ? 'nginx lacks HTTP/2'
              : '';
}

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use IO::Socket::INET;
use POSIX ();
use Time::HiRes ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t151-$$-" . time() . ":";
$ENV{TEST_NGINX_RATE} = int(80 / $Slow);
$ENV{TEST_NGINX_RATE_BIG} = int(10000 / $Slow);

our $Locations = q{
        # --- 1: header-only
        location = /s204 {
            idempotency on;
            idempotency_scope "t";
            idempotency_methods POST HEAD;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/204;
        }

        location = /accel204 {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/accel;
        }

        location = /in/204 {
            internal;
            add_header X-Idempotency-Status $idempotency_status always;
            return 204;
        }

        # --- 2: proxy_intercept_errors: an error_page after the claim
        location = /intercept {
            idempotency on;
            idempotency_scope "t";
            proxy_intercept_errors on;
            error_page 503 = @fallback;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/503;
        }

        location @fallback {
            add_header X-Idempotency-Status $idempotency_status always;
            return 200 "fallback\n";
        }

        # --- 2: error_page to a named location before the claim
        location = /ep {
            error_page 418 = @app;
            return 418;
        }

        location @app {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status $idempotency_status always;
            # no URI part in a named location, but one from a variable
            set $backend /b/201;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT$backend;
        }

        # --- 3, 4: client aborts
        location = /slow-ignore {
            idempotency on;
            idempotency_scope "t";
            proxy_ignore_client_abort on;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/slow;
        }

        location = /slow {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/slow;
        }

        location = /accel-slow {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/accel-slow;
        }

        location = /in/slow {
            internal;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/slow;
        }

        location = /slow-big {
            idempotency on;
            idempotency_scope "t";
            proxy_method GET;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/big/body.txt;
        }

        # --- 5: read-after-complete
        location = /big {
            idempotency on;
            idempotency_scope "t";
            proxy_method GET;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/file/big.bin;
        }

        location = /r429 {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/429;
        }

        # --- 7: upstream failures
        location = /reset {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/444;
        }

        location = /reset-release {
            idempotency on;
            idempotency_scope "t";
            idempotency_on_upstream_error release;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/444;
        }

        location = /timeout {
            idempotency on;
            idempotency_scope "t";
            proxy_read_timeout 500ms;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/slow;
        }

        location = /refused {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:1/;
        }

        location = /upstream503 {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/503;
        }

        # --- 8: ranges and 1xx
        location = /ranged {
            idempotency on;
            idempotency_scope "t";
            proxy_force_ranges on;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/digits;
        }

        location = /accel-file {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/accel-file;
        }

        location /in/files/ {
            internal;
            alias html/;
        }

        location = /hint {
            idempotency on;
            idempotency_scope "t";
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/103;
        }
};

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};

    server {
        listen 127.0.0.1:\$TEST_NGINX_RAND_PORT_1 http2;
        server_name h2;
$Locations
    }
};

our $Config = $Locations . q{
        # --- 6: a claim whose reply comes too late
        location = /late {
            idempotency on;
            idempotency_scope "t";
            idempotency_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT
                              prefix=$TEST_NGINX_PREFIX timeout=300ms;
            add_header X-Idempotency-Status $idempotency_status always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/b/201;
        }

        # the backends; each logs one EXEC line per execution
        location /b/ {
            access_log logs/error.log exec;

            location = /b/204 { return 204; }
            location = /b/201 { return 201 "created\n"; }
            location = /b/429 { return 429 "slow down\n"; }
            location = /b/503 { return 503 "later\n"; }
            location = /b/444 { return 444; }
            location = /b/digits { return 200 "0123456789"; }
            location = /b/103 { return 103 "early\n"; }

            location = /b/accel {
                add_header X-Accel-Redirect /in/204;
                return 200 "replaced\n";
            }

            location = /b/accel-slow {
                add_header X-Accel-Redirect /in/slow;
                return 200 "replaced\n";
            }

            location = /b/accel-file {
                add_header X-Accel-Redirect /in/files/digits.txt;
                return 200 "replaced\n";
            }

            # about 2 s for the response (limit_rate counts the header too)
            location = /b/slow {
                limit_rate $TEST_NGINX_RATE;
                return 201 "slow done\n";
            }

            location /b/big/ {
                alias html/;
                limit_rate $TEST_NGINX_RATE_BIG;
            }

            location /b/file/ {
                alias html/;
            }
        }

        location = /ok {
            return 200 "ok\n";
        }
};

our $Big = join '', map { sprintf "line %06d %s\n", $_, '.' x 50 } 1 .. 10000;
our $Body30k = join '', map { sprintf "line %04d %s\n", $_, '.' x 29 } 1 .. 750;
our $Files = [["big.bin", $Big], ["body.txt", $Body30k],
              ["digits.txt", "0123456789"]];

# --------------------------------------------------------------- helpers

sub error_log {
    my $file = "$ENV{TEST_NGINX_SERVER_ROOT}/logs/error.log";
    open my $in, '<', $file or return '';
    local $/;
    return <$in> // '';
}

# executions of $key at the backends so far
sub execs {
    my ($key) = @_;
    my @n = error_log() =~ /EXEC \S+ \S+ \Q$key\E$/mg;
    return scalar @n;
}

# polls $cond every 50 ms for up to $secs (scaled); returns its last value
sub wait_for {
    my ($cond, $secs) = @_;
    my $end = Time::HiRes::time() + $secs * $Slow;
    my $v;
    until (($v = $cond->()) || Time::HiRes::time() > $end) {
        Time::HiRes::sleep(0.05);
    }
    return $v;
}

# One HTTP/1.x request on its own connection ("Connection: close").
#   raw(uri => '/t', key => 'k', method => 'POST', body => 'x',
#       proto => '1.1', headers => [...], hangup => secs, read => bytes)
# hangup: close that many seconds after sending, reading nothing; read:
# close after that many bytes of the response.  Returns
# { status, headers => { lc name => value }, body, raw }.
sub raw {
    my (%o) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
                                  Timeout => 10 * $Slow)
        or die "connect: $!\n";
    my $method = $o{method} // 'POST';
    my $body = $o{body} // ($method eq 'POST' ? 'x' : '');
    my $req = "$method $o{uri} HTTP/" . ($o{proto} // '1.1') . "\r\n"
              . "Host: localhost\r\nConnection: close\r\n";
    $req .= "Idempotency-Key: $o{key}\r\n" if defined $o{key};
    $req .= "$_\r\n" for @{ $o{headers} || [] };
    $req .= "Content-Length: " . length($body) . "\r\n" if length $body;
    print $s "$req\r\n$body";

    if ($o{hangup}) {
        Time::HiRes::sleep($o{hangup} * $Slow);
        close $s;
        return {};
    }

    my $raw = '';
    while (1) {
        my $n = sysread($s, my $buf, 65536);
        last unless $n;
        $raw .= $buf;
        last if $o{read} && length $raw >= $o{read};
    }
    close $s;
    return {} if $o{read};

    my ($head, $rbody) = split /\r\n\r\n/, $raw, 2;
    my ($line, @lines) = split /\r\n/, $head // '';
    my %res = (raw => $raw, body => $rbody // '', headers => {});
    ($res{status}) = ($line // '') =~ m{^HTTP/\S+ (\d+)};
    $res{status} //= 0;
    for (@lines) {
        $res{headers}{lc $1} = $2 if /^([^:]+):\s*(.*?)\s*$/;
    }
    return \%res;
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

# One HTTP/2 request with curl (prior knowledge).  max_time: curl gives up
# (and closes the connection) after that many seconds.  Returns the status
# (0 when curl gave up) and the headers.
sub h2 {
    my (%o) = @_;
    my @cmd = ('curl', '-sS', '--http2-prior-knowledge', '-i', '-o', '-',
               '--max-time', ($o{max_time} // 15) * $Slow,
               '-X', $o{method} // 'POST');
    push @cmd, '-H', "Idempotency-Key: $o{key}" if defined $o{key};
    push @cmd, '--data-binary', $o{body} // 'x'
        if ($o{method} // 'POST') eq 'POST';
    push @cmd, 'http://127.0.0.1:' . h2_port() . $o{uri};

    my $pid = open(my $from, '-|');
    die "fork: $!\n" unless defined $pid;
    if ($pid == 0) {
        open STDERR, '>', '/dev/null';
        exec { $cmd[0] } @cmd or POSIX::_exit(127);
    }
    binmode $from;
    my $raw = do { local $/; <$from> } // '';
    close $from;

    my %res = (raw => $raw, headers => {});
    my ($head, $body) = split /\r\n\r\n/, $raw, 2;
    my ($line, @lines) = split /\r\n/, $head // '';
    ($res{status}) = ($line // '') =~ m{^HTTP/2 (\d+)};
    $res{status} //= 0;
    for (@lines) {
        $res{headers}{lc $1} = $2 if /^([^:]+):\s*(.*?)\s*$/;
    }
    $res{body} = $body // '';
    return \%res;
}

sub h2_skip { return $main::NoH2 }

# the outcome of a request: $idempotency_status
sub st { return $_[0]{headers}{'x-idempotency-status'} // '' }


no_shuffle();
run_tests();

__DATA__

=== TEST 1: header-only responses settle: a 204 over HTTP/1.1, HTTP/1.0 and HTTP/2, a HEAD, and X-Accel-Redirect to "return 204" are replayed, run once
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
for my $p ('1.1', '1.0') {
    my $k = "h204-$p";
    my $r = main::raw(uri => '/s204', key => $k, proto => $p);
    Test::More::is("$r->{status} " . main::st($r), '204 MISS', "$p: first");
    $r = main::raw(uri => '/s204', key => $k, proto => $p);
    Test::More::is("$r->{status} " . main::st($r), '204 HIT',
                   "$p: the retry at once is a replay");
    Test::More::is(main::execs($k), 1, "$p: ran once");
}

my $r = main::raw(uri => '/s204', key => 'head-1', method => 'HEAD');
Test::More::is("$r->{status} " . main::st($r), '204 MISS', 'HEAD: first');
$r = main::raw(uri => '/s204', key => 'head-1', method => 'HEAD');
Test::More::is("$r->{status} " . main::st($r), '204 HIT', 'HEAD: replayed');
Test::More::is(main::execs('head-1'), 1, 'HEAD: ran once');

$r = main::raw(uri => '/accel204', key => 'accel-1');
Test::More::is("$r->{status} " . main::st($r), '204 MISS', 'accel: first');
$r = main::raw(uri => '/accel204', key => 'accel-1');
Test::More::is("$r->{status} " . main::st($r), '204 HIT', 'accel: replayed');
Test::More::is(main::execs('accel-1'), 1, 'accel: ran once');

SKIP: {
    Test::More::skip(main::h2_skip(), 3) if main::h2_skip();
    $r = main::h2(uri => '/s204', key => 'h2-204');
    Test::More::is("$r->{status} " . main::st($r), '204 MISS', 'h2: first');
    $r = main::h2(uri => '/s204', key => 'h2-204');
    Test::More::is("$r->{status} " . main::st($r), '204 HIT', 'h2: replayed');
    Test::More::is(main::execs('h2-204'), 1, 'h2: ran once');
}
--- request
GET /ok
--- error_code: 200
--- no_error_log
did not complete



=== TEST 2: a protected named location reached through error_page (set before the claim) is protected: one execution, the retry is a replay; an error_page after the claim (proxy_intercept_errors) releases
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
my $r = main::raw(uri => '/ep', key => 'ep-1');
Test::More::is("$r->{status} " . main::st($r), '201 MISS', 'first');
$r = main::raw(uri => '/ep', key => 'ep-1');
Test::More::is("$r->{status} " . main::st($r), '201 HIT', 'retry: replayed');
Test::More::is($r->{body}, "created\n", 'retry: the body');
Test::More::is(main::execs('ep-1'), 1, 'ran once');

# an error_page after the claim (proxy_intercept_errors) releases: the
# upstream's own 503 says retry, and the retry runs again
$r = main::raw(uri => '/intercept', key => 'ie-1');
Test::More::is("$r->{status} $r->{body}", "200 fallback\n",
               'intercepted: the fallback answers');
$r = main::raw(uri => '/intercept', key => 'ie-1');
Test::More::is("$r->{status} $r->{body}", "200 fallback\n",
               'intercepted, retry: runs again (not 409, not a replay)');
Test::More::is(main::execs('ie-1'), 2, 'intercepted: ran twice, released');
--- request
GET /ok
--- error_code: 200



=== TEST 3: HTTP/2 with proxy_ignore_client_abort: a client that leaves before the response header gets the replay on its retry
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
SKIP: {
    Test::More::skip(main::h2_skip(), 3) if main::h2_skip();
    my $r = main::h2(uri => '/slow-ignore', key => 'h2-ign', max_time => 0.5);
    Test::More::is($r->{status}, 0, 'the client gave up before the header');
    main::wait_for(sub { main::execs('h2-ign') }, 5);
    # the upstream takes about 2 s; then the store
    my $got = main::wait_for(sub {
        my $x = main::h2(uri => '/slow-ignore', key => 'h2-ign');
        main::st($x) eq 'HIT' ? $x : undef
    }, 8);
    Test::More::ok($got && $got->{status} == 201
                   && $got->{body} eq "slow done\n", 'the retry is a replay')
        or Test::More::diag($got ? $got->{raw} : 'no HIT');
    Test::More::is(main::execs('h2-ign'), 1, 'ran once');
}
--- request
GET /ok
--- error_code: 200
--- no_error_log
did not complete



=== TEST 4: client aborts under the default configuration (no proxy_ignore_client_abort): before the header over HTTP/1.1 and HTTP/2, mid-body over HTTP/1.1: one execution, the retry gets the replay
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- user_files eval
$::Files
--- init
main::raw(uri => '/slow', key => 'ab-h1', hangup => 0.3);
main::raw(uri => '/slow-big', key => 'ab-mid', read => 4000);
SKIP: {
    Test::More::skip(main::h2_skip(), 1) if main::h2_skip();
    my $r = main::h2(uri => '/slow', key => 'ab-h2', max_time => 0.5);
    Test::More::is($r->{status}, 0, 'h2: the client gave up');
}

for my $k ('ab-h1', 'ab-mid') {
    my $uri = $k eq 'ab-mid' ? '/slow-big' : '/slow';
    my $got = main::wait_for(sub {
        my $x = main::raw(uri => $uri, key => $k);
        main::st($x) eq 'HIT' ? $x : undef
    }, 10);
    Test::More::ok($got, "$k: the retry after the upstream finished is a "
                         . "replay");
    Test::More::is($got && $got->{body},
                   $k eq 'ab-mid' ? $::Body30k : "slow done\n",
                   "$k: the whole response");
    Test::More::is(main::execs($k), 1, "$k: ran once");
}

SKIP: {
    Test::More::skip(main::h2_skip(), 2) if main::h2_skip();
    my $got = main::wait_for(sub {
        my $x = main::h2(uri => '/slow', key => 'ab-h2');
        main::st($x) eq 'HIT' ? $x : undef
    }, 8);
    Test::More::ok($got, 'ab-h2: the retry is a replay');
    Test::More::is(main::execs('ab-h2'), 1, 'ab-h2: ran once');
}
--- request
GET /ok
--- error_code: 200
--- no_error_log
did not complete



=== TEST 5: a claim whose reply comes after the Redis timeout is released: the request gets 503, its retry runs (not 409)
--- skip_eval: 1: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
# Redis busy for 1.5 s with a script: the claim (SET NX) waits in its
# input, the module gives up after 300 ms, and Redis applies it afterwards;
# first the location's Redis connection is set up
SKIP: {
Test::More::skip('no Redis control', 3) unless $ENV{TEST_NGINX_REDIS_CTL};
main::raw(uri => '/late', key => "late-warm-$_") for 1 .. 3;
my $pid = fork();
die "fork: $!" unless defined $pid;
if ($pid == 0) {
    main::redis_cli('EVAL', 'local t = redis.call("TIME") '
        . 'local e = t[1] * 1000000 + t[2] + 1500000 '
        . 'repeat t = redis.call("TIME") until t[1] * 1000000 + t[2] >= e '
        . 'return 1', '0');
    POSIX::_exit(0);
}
Time::HiRes::sleep(0.5);
my $r = main::raw(uri => '/late', key => 'late-1');
Test::More::is($r->{status}, 503, 'the claim timed out: 503');
waitpid($pid, 0);
my $got = main::wait_for(sub {
    my $x = main::raw(uri => '/late', key => 'late-1');
    main::st($x) eq 'MISS' ? $x : undef
}, 5);
Test::More::ok($got && $got->{status} == 201, 'the retry runs');
Test::More::is(main::execs('late-1'), 1, 'ran once');
}
--- request
GET /ok
--- error_code: 200



=== TEST 6: an upstream that got the request and failed (reset: 502, timeout: 504) is held as outcome unknown, not run again; never reached or its own 503 releases; "idempotency_on_upstream_error release" releases
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
for my $c (['/reset', 'u-reset', 502], ['/timeout', 'u-timeout', 504]) {
    my ($uri, $k, $code) = @$c;
    my $r = main::raw(uri => $uri, key => $k);
    Test::More::is($r->{status}, $code, "$k: nginx answers $code");
    $r = main::raw(uri => $uri, key => $k);
    Test::More::is("$r->{status} " . main::st($r), '502 UNKNOWN',
                   "$k: the retry gets the outcome-unknown problem");
    Test::More::like($r->{body}, qr/"type":"[^"]*outcome-unknown"/,
                     "$k: problem type");
    Test::More::is(main::execs($k), 1, "$k: ran once");
}
Test::More::is(main::raw(uri => '/refused', key => 'u-ref')->{status}, 502,
               'never reached: 502');
my $r = main::raw(uri => '/refused', key => 'u-ref');
Test::More::is("$r->{status} " . main::st($r), '502 MISS',
               'never reached: released, the retry runs');
for my $c (['/upstream503', 'u-503', 503], ['/reset-release', 'u-rel', 502]) {
    my ($uri, $k, $code) = @$c;
    main::raw(uri => $uri, key => $k);
    $r = main::raw(uri => $uri, key => $k);
    Test::More::is("$r->{status} " . main::st($r), "$code MISS",
                   "$k: released, the retry runs");
    Test::More::is(main::execs($k), 2, "$k: ran twice");
}
--- request
GET /ok
--- error_code: 200



=== TEST 7: ranges and 1xx: a Range request (proxy_force_ranges, X-Accel-Redirect to a file) gets and stores the full 200; a 1xx is never stored (as a final answer the key is held)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- user_files eval
$::Files
--- init
for my $uri ('/ranged', '/accel-file') {
    my $k = "range$uri";
    my $r = main::raw(uri => $uri, key => $k, headers => ['Range: bytes=0-3']);
    Test::More::is("$r->{status} $r->{body}", '200 0123456789',
                   "$uri: the first attempt gets the full 200");
    $r = main::raw(uri => $uri, key => $k);
    Test::More::is("$r->{status} " . main::st($r) . " $r->{body}",
                   '200 HIT 0123456789', "$uri: the replay is the full 200");
    Test::More::is(main::execs($k), 1, "$uri: ran once");
}
# nginx 1.29.0 and newer take an upstream's 103 as interim and wait for
# the final answer (t/141 covers that): the 103-as-answer case is older
# nginx's only
if ($Test::Nginx::Util::NginxVersion < 1.029000) {
    my $r = main::raw(uri => '/hint', key => 'hint-1');
    Test::More::is($r->{status}, 103, '1xx: answered');
    $r = main::raw(uri => '/hint', key => 'hint-1');
    Test::More::is("$r->{status} " . main::st($r), '502 UNKNOWN',
                   '1xx: never stored; the upstream ran, so the key is held');
}
--- request
GET /ok
--- error_code: 200



=== TEST 8: a client that leaves while the location an X-Accel-Redirect led to is proxying (default configuration): that upstream finishes, the retry gets the replay
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::raw(uri => '/accel-slow', key => 'ab-accel', hangup => 0.5);
my $got = main::wait_for(sub {
    my $x = main::raw(uri => '/accel-slow', key => 'ab-accel');
    main::st($x) eq 'HIT' ? $x : undef
}, 10);
Test::More::ok($got && $got->{status} == 201
               && $got->{body} eq "slow done\n", 'the retry is a replay');
my @n = main::error_log() =~ m{EXEC \S+ /b/slow ab-accel$}mg;
Test::More::is(scalar @n, 1, 'the redirect target ran once');
--- request
GET /ok
--- error_code: 200
--- no_error_log
did not complete
