# Where nginx's behaviour differs between the supported versions (1.22.1 to
# 1.31.4), each block says which versions it expects what of, with
# --- skip_nginx (both runners know it):
#
# - the "http2" directive exists from 1.25.1 on (before, HTTP/2 is turned on
#   with "listen ... http2", as t/080-http2.t does on every version);
# - from 1.29.0 on, nginx takes an upstream's "103 Early Hints" as an
#   interim response (and passes it on only where "early_hints" says so):
#   the final 201 is what the module records and replays.  Before 1.29.0 the
#   103 is the response nginx answers with (the 201 after it becomes its
#   body), and the module records what the client got, as the default
#   idempotency_store_status (1xx 2xx ...) says.
#
# The upstream of the early hints blocks is a small server started from
# --- init on the port of the block's $TEST_NGINX_RAND_PORT_1, read back from
# the generated nginx.conf (the real Test::Nginx does not export it).

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use IO::Socket::INET ();
use POSIX ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t141-$$-" . time() . ":";

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri';
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
    idempotency_scope "test:\$http_authorization";
};

our $HintsConfig = q{
    location = /hints {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
    }
};

# the port of this block's upstream, from its nginx.conf
sub upstream_port {
    my $conf = "$ENV{TEST_NGINX_SERVER_ROOT}/conf/nginx.conf";
    open my $in, '<', $conf or die "$conf: $!\n";
    local $/;
    my $text = <$in>;
    $text =~ m{proxy_pass\s+http://127\.0\.0\.1:(\d+)\s*;}
        or die "no proxy_pass to the upstream in $conf\n";
    return $1;
}

# An upstream that answers each of $n connections with a 103 Early Hints
# (a Link header) and then a 201 whose X-Run header counts the runs; a
# detached process (double fork), listening when this returns, its life
# bounded by an alarm.
sub hints_upstream {
    my ($n) = @_;
    my $srv = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                    LocalPort => upstream_port(),
                                    Listen => 5, ReuseAddr => 1)
        or die "upstream: cannot listen: $!\n";
    my $pid = fork();
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        POSIX::_exit(0) if fork();
        open STDOUT, '>', '/dev/null';
        open STDERR, '>', '/dev/null';
        eval {
            local $SIG{ALRM} = sub { die "alarm\n" };
            alarm(int(30 * $main::Slow));
            for my $run (1 .. $n) {
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
                my $resp = "HTTP/1.1 103 Early Hints\r\n"
                    . "Link: </style.css>; rel=preload\r\n\r\n"
                    . "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\n"
                    . "Content-Length: 8\r\nX-Run: $run\r\n"
                    . "Connection: close\r\n\r\ncreated\n";
                while (length $resp) {
                    my $w = syswrite($c, $resp) or last;
                    substr($resp, 0, $w, '');
                }
                close $c;
            }
            alarm(0);
        };
        POSIX::_exit(0);
    }
    close $srv;
    waitpid($pid, 0);
}

no_shuffle();
run_tests();

__DATA__

=== TEST 1: nginx >= 1.25.1: the http2 directive, a request recorded on such a server
--- skip_nginx: 3: < 1.25.1
--- http_config eval: $::HttpConfig
--- config
    http2 on;
    location = /t {
        idempotency on;
        add_header X-Idempotency-Status $idempotency_status always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }
--- request
POST /t
x
--- more_headers
Idempotency-Key: h2-directive-1
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
--- no_error_log
[alert]



=== TEST 2: nginx < 1.25.1 has no http2 directive (listen ... http2 instead)
--- skip_nginx: 1: >= 1.25.1
--- http_config eval: $::HttpConfig
--- config
    http2 on;
--- must_die



=== TEST 3: nginx >= 1.29.0: an upstream's 103 Early Hints is interim: the 201 is recorded
--- skip_nginx: 4: < 1.29.0
--- http_config eval: $::HttpConfig
--- config eval: $::HintsConfig
--- init
return if $Test::Nginx::Util::NginxVersion < 1.029000;    # skipped
main::hints_upstream(1);
--- request
POST /hints
x
--- more_headers
Idempotency-Key: hints-1
--- error_code: 201
--- response_headers
X-Idempotency-Status: MISS
X-Run: 1
--- response_body
created



=== TEST 4: nginx >= 1.29.0: ... and replayed without the hints' headers
--- skip_nginx: 5: < 1.29.0
--- request
POST /hints
x
--- more_headers
Idempotency-Key: hints-1
--- error_code: 201
--- response_headers
X-Idempotency-Status: HIT
Idempotent-Replayed: true
X-Run: 1
!Link
--- response_body
created



=== TEST 5: nginx < 1.29.0 answers with the 103 itself and drops the 201: the upstream ran, so the key is held as outcome unknown (a 1xx is never stored)
--- skip_nginx: 4: >= 1.29.0
--- http_config eval: $::HttpConfig
--- config eval: $::HintsConfig
--- init
return if $Test::Nginx::Util::NginxVersion >= 1.029000;   # skipped
main::hints_upstream(1);
--- request eval
["POST /hints\nx", "POST /hints\nx"]
--- more_headers
Idempotency-Key: hints-old-1
--- error_code eval
[103, 502]
--- response_headers eval
["X-Idempotency-Status: MISS", "X-Idempotency-Status: UNKNOWN"]
--- timeout: 10
