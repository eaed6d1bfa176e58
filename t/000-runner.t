# Self-test of the Test::Nginx::Socket runner with stock nginx only (no
# module): one block per supported section.  Valid for the real Test::Nginx
# as well as for t/runner.
use Test::Nginx::Socket 'no_plan';

no_shuffle();
run_tests();

__DATA__

=== TEST 1: return, add_header and response_headers
--- config
    location = /t {
        add_header X-Got bar;
        return 200 "hello\n";
    }
--- request
GET /t
--- response_headers
Content-Type: text/plain
X-Got: bar
!X-Missing
--- response_body
hello
--- no_error_log
[error]
[alert]



=== TEST 2: Host, Connection and a trimmed Content-Length are sent
--- config
    location = /echo {
        return 200 "$request_method $http_host $http_connection $content_length $http_x_foo\n";
    }
--- request
POST /echo
   hello body   
--- more_headers
X-Foo: bar
--- response_body
POST localhost close 10 bar



=== TEST 3: leading comments and whitespace before the request line
--- config
    location = /echo {
        return 200 "$request_method $request_uri $server_protocol\n";
    }
--- request
    # ignored
    GET /echo?a=1
--- response_body
GET /echo?a=1 HTTP/1.1



=== TEST 4: error_page hands a 404 to a named location
--- config
    location = /ep {
        error_page 404 = @fallback;
        return 404;
    }
    location @fallback {
        return 200 "fallback\n";
    }
--- request
GET /ep
--- error_code: 200
--- response_body
fallback



=== TEST 5: error_code, raw_response_headers_like, response_headers_like
--- config
    location = /forbidden {
        return 403;
    }
--- request
GET /forbidden
--- error_code: 403
--- raw_response_headers_like: ^HTTP/1.1 403 Forbidden\r\n
--- response_headers_like
Server: nginx/[0-9.]+
Content-Type: text/html
--- response_body_like: <title>403 Forbidden</title>



=== TEST 6: response_body_unlike
--- config
    location = /t {
        return 200 "all good\n";
    }
--- request
GET /t
--- response_body_unlike: error



=== TEST 7: pipelined requests share one keep-alive connection
--- config
    location = /cr {
        return 200 "$connection_requests\n";
    }
--- pipelined_requests eval
["GET /cr", "GET /cr"]
--- error_code eval
[200, 200]
--- response_body eval
["1\n", "2\n"]



=== TEST 8: a request array uses one connection per request
--- config
    location = /cr {
        return 200 "$connection_requests $http_x_n\n";
    }
--- request eval
["GET /cr", "GET /cr"]
--- more_headers eval
["X-N: one", "X-N: two"]
--- error_code eval
[200, 200]
--- response_body eval
["1 one\n", "1 two\n"]
--- no_error_log
[error]



=== TEST 9: a block without --- config reuses the running nginx
--- request
GET /cr
--- response_body_like: ^1 \n$



=== TEST 10: error_log finds what nginx logged for this request
--- config
    location /static/ {
    }
--- request
GET /static/missing.txt
--- error_code: 404
--- error_log
[error]
No such file or directory
--- no_error_log
[alert]



=== TEST 11: error_log and grep_error_log with debug-level lines
--- config
    location = /g {
        return 204;
    }
--- request
GET /g
--- error_code: 204
--- error_log eval
[qr/http finalize request: \d+/, "http request line"]
--- grep_error_log eval
qr/http request line: "[^"]+"/
--- grep_error_log_out
http request line: "GET /g HTTP/1.1"



=== TEST 12: --- log_level keeps debug lines out
--- log_level: warn
--- config
    location = /t {
        return 200 "ok\n";
    }
--- request
GET /t
--- response_body
ok
--- no_error_log
[debug]



=== TEST 13: binary bodies with NUL bytes round-trip byte-exactly
--- config
    location /bin/ {
    }
--- user_files eval
">>> bin/data.bin\n" . pack("C*", 0 .. 255) x 4096
--- request
GET /bin/data.bin
--- response_headers
Content-Length: 1048576
--- response_body eval
pack("C*", 0 .. 255) x 4096



=== TEST 14: chunked responses are decoded
--- config
    location /sub/ {
        sub_filter_types *;
        sub_filter_once off;
        sub_filter 'XY' 'Z';
    }
--- user_files eval
">>> sub/a.txt\n" . ("abcXYdef\0\n" x 50000)
--- request
GET /sub/a.txt
--- response_headers
Transfer-Encoding: chunked
!Content-Length
--- response_body eval
"abcZdef\0\n" x 50000



=== TEST 15: must_die: nginx refuses an unknown directive
--- config
    location = /t {
        no_such_directive on;
    }
--- must_die
--- error_log
[emerg]
unknown directive "no_such_directive"



=== TEST 16: must_die with the expected exit code
--- main_config
    no_such_main_directive;
--- config
--- must_die: 1
--- error_log
[emerg]
no_such_main_directive



=== TEST 17: abort: an expected client timeout is no failure; wait
--- config
    location = /slow {
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/t;
    }
--- request
POST /slow
--- more_headers
Content-Length: 100
--- timeout: 300ms
--- abort
--- ignore_response
--- wait: 0.1
--- error_log
client prematurely closed connection



=== TEST 18: http_config, user_files, $TEST_NGINX_SERVER_PORT, a random port
--- http_config
    upstream self {
        server 127.0.0.1:$TEST_NGINX_SERVER_PORT;
    }
    server {
        listen 127.0.0.1:$TEST_NGINX_RAND_PORT_1;
        location / {
            return 200 "backend\n";
        }
    }
--- config
    location = /self {
        proxy_pass http://self/hello.txt;
    }
    location = /other {
        proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1/;
    }
--- user_files
>>> hello.txt
hello from html
--- request eval
["GET /self", "GET /other"]
--- error_code eval
[200, 200]
--- response_body_like eval
["^hello from html\n\$", "^backend\n\$"]



=== TEST 19: init runs before the requests
--- config
    location = /t {
        return 200 "t\n";
    }
--- init
open my $out, '>', html_dir() . '/from-init.txt' or die $!;
print $out "written by init\n";
close $out;
--- request
GET /from-init.txt
--- response_body
written by init



=== TEST 20: main_config, post_main_config and $ServerPort
--- main_config
    worker_rlimit_nofile 1024;
--- post_main_config
    pcre_jit off;
--- config
    location = /port {
        return 200 "$server_port\n";
    }
--- request
GET /port
--- response_body
$ServerPort



=== TEST 21: HEAD responses carry no body
--- config
    location = /t {
        return 200 "body\n";
    }
--- request
HEAD /t
--- response_headers
Content-Length: 5
--- response_body



=== TEST 22: Test::Base filters (chomp)
--- config
    location = /t {
        return 200 "no newline";
    }
--- request
GET /t
--- response_body chomp
no newline



=== TEST 23: a request written in two packets
--- config
    location = /echo {
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/len;
    }
    location = /len {
        return 200 "$content_length\n";
    }
--- request eval
[["POST /echo\n", {value => "hello", delay_before => 0.05}]]
--- response_body
5



=== TEST 24: SKIP leaves a block out
--- SKIP
--- config
    location = /t {
        return 500;
    }
--- request
GET /t
--- error_code: 200



=== TEST 25: $TEST_NGINX_RAND_PORT_N is put in nginx.conf, never in %ENV
The real Test::Nginx keeps this block's random ports in
$Test::Nginx::Util::RandPorts; a test reading $ENV{TEST_NGINX_RAND_PORT_1}
would pass under t/runner only.
--- config
    location = /t {
        return 200 "t\n";
    }
    location = /rand {
        proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_7/;
    }
--- init
Test::More::ok(!exists $ENV{TEST_NGINX_RAND_PORT_7},
               'TEST_NGINX_RAND_PORT_7 is not exported to %ENV');
Test::More::like($Test::Nginx::Util::RandPorts->{TEST_NGINX_RAND_PORT_7},
                 qr/^\d+$/, 'the port is in $Test::Nginx::Util::RandPorts');
--- request
GET /t
--- response_body
t



=== TEST 26: init and skip_eval run in package Test::Nginx::Util, not main
So an `our` variable of an init is not $main::x in a later block.
--- skip_eval: 1: do { $main::SkipEvalPackage = __PACKAGE__; 0 }
--- config
    location = /t {
        return 200 "t\n";
    }
--- init
our $RunnerProbe = 'init';
Test::More::is(__PACKAGE__, 'Test::Nginx::Util', 'init runs in Test::Nginx::Util');
Test::More::is($main::SkipEvalPackage, 'Test::Nginx::Util',
               'skip_eval runs in Test::Nginx::Util');
Test::More::ok(!defined $main::RunnerProbe, 'our in init is not $main::');
--- request
GET /t
--- response_body
t



=== TEST 27: a block skipped by skip_eval starts no nginx but still runs init
As the real Test::Nginx does: an init that needs what skip_eval tests for
must check it itself.
--- skip_eval: 1: 1
--- init
$main::SkippedInitRan = 1;
--- config
    location = /t {
        return 418;
    }
--- request
GET /t
--- error_code: 200



=== TEST 28: ... the skipped block's init ran
--- config
    location = /t {
        return 200 "t\n";
    }
--- init
Test::More::ok($main::SkippedInitRan, "the skipped block's init ran");
--- request
GET /t
--- response_body
t



=== TEST 29: skip_nginx: a version test that holds skips the block
--- skip_nginx: 1: >= 0.1.0
--- config
    location = /t {
        return 418;
    }
--- request
GET /t
--- error_code: 200



=== TEST 30: skip_nginx: a version test that does not hold runs it
--- skip_nginx: 1: < 0.1.0
--- config
    location = /t {
        return 200;
    }
--- request
GET /t
--- error_code: 200
