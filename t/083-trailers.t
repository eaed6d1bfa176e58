# Trailers: a gRPC upstream (grpc_pass) answers with its status in
# trailers (grpc-status, grpc-message), and a gRPC client fails a response
# without them.  The trailers the upstream sent are stored with the record
# and replayed: over HTTP/2, and over HTTP/1.1 as chunked trailers.
#
# The gRPC upstream is an nginx server of this config ("listen ... http2",
# add_trailer with the request's $request_id, so that a replay shows which
# run it comes from).  HTTP/2 clients are seen through a hop: an HTTP/1.1
# location that passes the request on with grpc_pass to the protected
# HTTP/2 server, whose response it turns into a chunked one (sub_filter
# drops the length), trailers and all.  Responses are read raw, from
# "--- init", and asserted there with Test::More: the block's own request
# only checks that nginx runs.  The ports of the extra servers are read back
# from the generated nginx.conf (the real Test::Nginx substitutes
# $TEST_NGINX_RAND_PORT_N in the config but does not export it).

BEGIN {
    my $nginx = $ENV{TEST_NGINX_BINARY} || 'nginx';
    my $nginx_v = `'$nginx' -V 2>&1` // '';
    if ($nginx_v !~ /--with-http_v2_module\b/) {
        require Test::More;
        Test::More::plan(skip_all => 'nginx lacks HTTP/2');
    }
}

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use IO::Socket::INET ();
use Digest::SHA ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t083-$$-" . time() . ":";

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$request_id';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};

    # the gRPC upstream: its status in trailers
    server {
        listen 127.0.0.1:\$TEST_NGINX_RAND_PORT_1 http2;
        server_name grpc-upstream;

        location / {
            access_log logs/error.log exec;
            default_type application/grpc;
            add_trailer grpc-status 0;
            add_trailer grpc-message "ran-\$request_id";
            return 200 "reply-of-one-run";
        }

        # a large reply, stored split: a static file, served for a POST
        # through error_page (which makes it a GET)
        location = /h1/large {
            error_page 405 =200 /large.dat;
            return 405;
        }

        location = /large.dat {
            internal;
            root html;
            access_log logs/error.log exec;
            default_type application/grpc;
            add_trailer grpc-status 0;
            add_trailer grpc-message "ran-\$request_id";
        }
    }

    # the protected location for HTTP/2 clients
    server {
        listen 127.0.0.1:\$TEST_NGINX_RAND_PORT_2 http2;
        server_name protected-h2;

        location / {
            idempotency on;
            grpc_pass grpc://127.0.0.1:\$TEST_NGINX_RAND_PORT_1;
        }
    }
};

our $Config = q{
    # the protected location for HTTP/1.1 clients
    location /h1/ {
        idempotency on;
        idempotency_max_response_size 8m;
        grpc_pass grpc://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
    }

    # an HTTP/2 client of protected-h2, seen over HTTP/1.1 with trailers
    location /h2/ {
        grpc_pass grpc://127.0.0.1:$TEST_NGINX_RAND_PORT_2;
        sub_filter_types *;
        sub_filter no-such-text x;
    }

    location = /ping {
        return 200 "pong\n";
    }
};

# the port of one of the servers above, from the nginx.conf of this block
sub port_of {
    my ($name) = @_;
    my $conf = "$ENV{TEST_NGINX_SERVER_ROOT}/conf/nginx.conf";
    open my $in, '<', $conf or die "$conf: $!\n";
    local $/;
    my $text = <$in>;
    $text =~ /listen\s+127\.0\.0\.1:(\d+)\s+http2\s*;\s*server_name\s+\Q$name\E;/
        or die "no server $name in $conf\n";
    return $1;
}

# one HTTP/1.1 POST, "Connection: close", the response as it came (raw)
sub post_raw {
    my ($path, $key) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
                                  Timeout => 10)
        or die "connect: $!\n";
    print $s "POST $path HTTP/1.1\r\nHost: localhost\r\n"
             . "Content-Type: application/grpc\r\nTE: trailers\r\n"
             . "Idempotency-Key: $key\r\nContent-Length: 5\r\n"
             . "Connection: close\r\n\r\nhello";
    local $/;
    my $raw = <$s> // '';
    close $s;
    return $raw;
}

# the body of a chunked response
sub body_of {
    my ($raw) = @_;
    my ($body, $rest) = ('', $raw =~ /\r\n\r\n(.*)\z/s ? $1 : '');
    while ($rest =~ s/\A([0-9a-f]+)\r\n//i && hex $1) {
        $body .= substr($rest, 0, hex $1, '');
        $rest =~ s/\A\r\n// or return undef;
    }
    return $body;
}

# the trailer fields after the last chunk, as "name: value" lines
sub trailers_of {
    my ($raw) = @_;
    return $raw =~ /\r\n0\r\n((?:[^\r\n]+\r\n)*)\r\n\z/ ? $1 : undef;
}

sub execs {
    open my $in, '<', "$ENV{TEST_NGINX_SERVER_ROOT}/logs/error.log"
        or return ();
    return map { /^EXEC [A-Z]+ \S+ (\w+)$/ ? $1 : () } <$in>;
}

sub record {
    return IdemTest::redis_cli('GET', $ENV{TEST_NGINX_PREFIX}
                               . Digest::SHA::sha256_hex('test:') . ":$_[0]");
}

# 3 MiB: stored split, its body in chunks of its own
our $Large = join '', map { sprintf "%07d\n", $_ } 1 .. 393216;

no_shuffle();
run_tests();

__DATA__

=== TEST 1: HTTP/2: the first response's trailers are stored, its replay has them
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
my $first = main::post_raw('/h2/svc/Echo', 'h2-trailers');
my $t1 = main::trailers_of($first);
Test::More::like($first, qr{^HTTP/1\.1 200 .*\r\nTransfer-Encoding: chunked\r\n}s,
                 'first: 200, chunked');
Test::More::unlike($first, qr/^Idempotent-Replayed:/mi, 'first: not a replay');
Test::More::like($t1 // '', qr/^grpc-status: 0\r\ngrpc-message: ran-(\w+)\r\n\z/,
                 'first: the trailers of the run') or Test::More::diag($first);
my ($id) = ($t1 // '') =~ /ran-(\w+)/;
Test::More::like(main::record('h2-trailers'),
                 qr/\r\n\@grpc-status: 0\r\n\@grpc-message: ran-\Q$id\E\r\n\r\nreply-of-one-run\z/,
                 'the record holds the trailers after the headers');

my $again = main::post_raw('/h2/svc/Echo', 'h2-trailers');
Test::More::like($again, qr/^Idempotent-Replayed: true\r$/mi, 'retry: a replay');
Test::More::is(main::body_of($again), 'reply-of-one-run', 'retry: the same body');
Test::More::is(main::trailers_of($again),
               "grpc-status: 0\r\ngrpc-message: ran-$id\r\n",
               "retry: the first run's trailers, grpc-status included")
    or Test::More::diag($again);
Test::More::is_deeply([main::execs()], [$id], 'the upstream ran once');
--- request
GET /ping
--- response_body
pong



=== TEST 2: HTTP/1.1: a replay of a record with trailers is chunked and ends with them
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
my $first = main::post_raw('/h1/svc/Echo', 'h1-trailers');
Test::More::like($first, qr{^HTTP/1\.1 200 }, 'first: 200');
my ($id) = main::record('h1-trailers') =~ /\r\n\@grpc-message: ran-(\w+)\r\n/;
Test::More::ok($id, 'the record holds the trailers');

my $again = main::post_raw('/h1/svc/Echo', 'h1-trailers');
Test::More::like($again, qr/^Idempotent-Replayed: true\r$/mi, 'retry: a replay');
Test::More::like($again, qr/^Transfer-Encoding: chunked\r$/mi, 'retry: chunked');
Test::More::unlike($again, qr/^Content-Length:/mi, 'retry: no Content-Length');
Test::More::is(main::body_of($again), 'reply-of-one-run', 'retry: the same body');
Test::More::is(main::trailers_of($again),
               "grpc-status: 0\r\ngrpc-message: ran-$id\r\n",
               'retry: the trailers of the run') or Test::More::diag($again);
Test::More::is(scalar(() = main::execs()), 1, 'the upstream ran once');
--- request
GET /ping
--- response_body
pong



=== TEST 3: a response without trailers is stored and replayed as before (no "@" line, Content-Length)
--- http_config eval: $::HttpConfig
--- config
    location = /plain {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        return 201 "created\n";
    }
--- init
main::post_raw('/plain', 'no-trailers');
Test::More::unlike(main::record('no-trailers'), qr/\r\n\@/,
                   'no trailer line in the record');
--- request
POST /plain
hello
--- more_headers
Idempotency-Key: no-trailers
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
Content-Length: 8
!Transfer-Encoding
--- response_body
created



=== TEST 4: a large reply with trailers is stored split and replayed whole, trailers last
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- user_files eval
">>> large.dat\n" . $::Large
--- init
my $first = main::post_raw('/h1/large', 'large-trailers');
Test::More::like($first, qr{^HTTP/1\.1 200 }, 'first: 200')
    or Test::More::diag(substr($first, 0, 400));
my $rec = main::record('large-trailers');
Test::More::like($rec, qr/^idem1 split /, 'the record is split');
my ($id) = $rec =~ /\r\n\@grpc-message: ran-(\w+)\r\n\r\n\d+\z/;
Test::More::ok($id, 'its head holds the trailers');

my $again = main::post_raw('/h1/large', 'large-trailers');
Test::More::like($again, qr/^Idempotent-Replayed: true\r$/mi, 'retry: a replay');
Test::More::ok(main::body_of($again) eq $::Large, 'retry: the same 3 MiB');
Test::More::is(main::trailers_of($again),
               "grpc-status: 0\r\ngrpc-message: ran-$id\r\n",
               'retry: the trailers of the run, after the body');
Test::More::is(scalar(() = main::execs()), 1, 'the upstream ran once');
--- request
GET /ping
--- response_body
pong



=== TEST 5: proxy_pass_trailers (nginx 1.28 and later): an HTTP/1.1 upstream's trailers are stored and replayed
--- skip_nginx: 2: < 1.28.0
--- http_config eval: $::HttpConfig
--- config
    location = /proxied {
        idempotency on;
        proxy_http_version 1.1;
        proxy_pass_trailers on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/trailing;
    }

    # add_trailer makes the upstream's response chunked, trailers last
    location = /trailing {
        access_log logs/error.log exec;
        add_trailer X-Checksum "sum-$request_id";
        return 201 "made\n";
    }

    location = /ping {
        return 200 "pong\n";
    }
--- init
return if $Test::Nginx::Util::NginxVersion < 1.028;   # skipped (the real Test::Nginx runs init anyway)
my $first = main::post_raw('/proxied', 'proxy-trailers');
my ($id) = (main::trailers_of($first) // '') =~ /^X-Checksum: sum-(\w+)\r\n\z/;
Test::More::ok($id, "first: the upstream's trailer") or Test::More::diag($first);
Test::More::like(main::record('proxy-trailers'),
                 qr/\r\n\@X-Checksum: sum-\Q$id\E\r\n\r\nmade\n\z/,
                 'the record holds it');
my $again = main::post_raw('/proxied', 'proxy-trailers');
Test::More::like($again, qr/^Idempotent-Replayed: true\r$/mi, 'retry: a replay');
Test::More::is(main::body_of($again), "made\n", 'retry: the same body');
Test::More::is(main::trailers_of($again), "X-Checksum: sum-$id\r\n",
               'retry: the trailer of the run');
Test::More::is(scalar(() = main::execs()), 1, 'the upstream ran once');
--- request
GET /ping
--- response_body
pong
