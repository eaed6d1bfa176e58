# Secrets stay out of the error log: an nginx whose idempotency_redis
# carries user= and password= goes through every connection the module
# opens to Redis (the pipelined one, the second one of a large record, the
# purge listener, the admin location's), each of them dropped by Redis
# (CLIENT KILL) and made again, plus a location whose password Redis
# refuses; then no line of the error log, at debug where the binary has
# it, holds either password, and the lines that name those connections
# name them by their address.
#
# A plain Test::More file with its own redis-server and nginx on free
# loopback ports, stopped by pid.  Run from the repository root (prove
# does).

use strict;
use warnings;
use Test::More;
use File::Spec ();
use File::Temp ();

use lib 't/lib';
use IdemTest ();
use Roads ();

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'redis-server and redis-cli are needed'
    unless `sh -c 'command -v redis-server && command -v redis-cli'`
           =~ /redis-cli/;

my $Pass = 'S3cretPW-t195';
my $Wrong = 'Wr0ngPW-t195';
my $User = 'idemu';

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t195-XXXXXX',
                                                   DIR => $base));
chmod 0755, $dir;

my $rport = IdemTest::free_port();
my $port = IdemTest::free_port();
my $redis;

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

$redis = IdemTest::start_redis_on('127.0.0.1', $rport, $dir) or do {
    plan skip_all => "redis-server on 127.0.0.1:$rport did not start";
};

# the default user keeps no password: redis-cli below is the operator
is(rcli('ACL', 'SETUSER', $User, 'on', ">$Pass", '~*', '&*', '+@all'), 'OK',
   'an ACL user with a password');

# a body over the 256 KiB that a large record's second connection takes
mkdir "$dir/html";
Roads::write_file("$dir/html/big", 'b' x (600 * 1024));

# with debug where the binary was built with it: its lines too
my $level = `$ENV{TEST_NGINX_BINARY} -V 2>&1` =~ /--with-debug/
            ? 'debug' : 'info';

Roads::start_nginx($dir, $port, <<HTTP);
    error_log $dir/nginx/logs/all.log $level;

    idempotency_scope "test:\$http_authorization";
    idempotency_cache_zone zone:1m;
    idempotency_redis 127.0.0.1:$rport user=$User password=$Pass
                      prefix=t195: timeout=1s connect_timeout=500ms;

    server {
        listen 127.0.0.1:$port;

        location = /small {
            idempotency on;
            idempotency_cache zone;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /big {
            idempotency on;
            proxy_method GET;
            proxy_pass http://127.0.0.1:$port/files/big;
        }

        location = /refused {
            idempotency on;
            idempotency_redis 127.0.0.1:$rport user=$User password=$Wrong
                              prefix=t195r: timeout=1s;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /admin {
            idempotency_admin;
        }

        location /files/ {
            alias $dir/html/;
        }

        location = /backend {
            return 201 "ran \$request_id\\n";
        }
    }
HTTP

# every connection at work once
ok(wait_for(30, sub { post('/small', 'k1') =~ /^201 / }), 'a small record');
like(post('/small', 'k1'), qr/^201 .*Idempotent-Replayed: true/s,
     'replayed');
ok(wait_for(20, sub { numsub() >= 1 }), 'the purge listener subscribed');

my $big = post('/big', 'big-1');
like($big, qr/^200 /, 'a large record (the second connection)');
like(post('/big', 'big-1'), qr/^200 .*Idempotent-Replayed: true/s,
     'a large record replayed');

like(admin('DELETE', 'k1'), qr/^204 /, 'an admin DELETE (publishes)');
like(post('/refused', 'r1'), qr/^503 /, 'a refused password gets 503');

# Redis drops each of them: each logs its loss and its return
like(rcli('CLIENT', 'KILL', 'TYPE', 'pubsub'), qr/^[1-9]/,
     'the purge listener killed');
ok(log_has(qr/subscription to "t195:purge" at 127\.0\.0\.1:$rport stopped/),
   'its loss is logged with the address');
ok(log_has(qr/subscribed to "t195:purge" at 127\.0\.0\.1:$rport again/),
   'and its return');

like(rcli('CLIENT', 'KILL', 'USER', $User), qr/^[1-9]/,
     'every connection of the user killed');
ok(wait_for(30, sub { post('/small', 'k2') =~ /^201 / }),
   'the pipelined connection is back');
ok(wait_for(30, sub { post('/big', 'big-2') =~ /^200 / }),
   'the second connection is back');
like(admin('GET', 'k2'), qr/^200 /, 'the admin location is back');
ok(wait_for(20, sub { numsub() >= 1 }), 'the purge listener is back');

# a password that stops being valid: AUTH refused on every connection
is(rcli('ACL', 'SETUSER', $User, 'resetpass', ">$Wrong"), 'OK',
   'the password changed under the module');
rcli('CLIENT', 'KILL', 'USER', $User);
ok(wait_for(30, sub { post('/small', 'k3') =~ /^503 / }), 'refused: 503');

is(rcli('ACL', 'SETUSER', $User, 'resetpass', ">$Pass"), 'OK',
   'the password back');
ok(wait_for(30, sub { post('/small', 'k4') =~ /^201 / }), 'working again');

Roads::stop();

# the whole run's log: no password, in any form
my $log = Roads::slurp("$dir/nginx/logs/all.log")
          . Roads::slurp("$dir/nginx/logs/error.log");
ok(length $log > 0, 'the error log has lines');
for my $secret ($Pass, $Wrong) {
    my @lines = grep { index($_, $secret) >= 0 } split /\n/, $log;
    is(scalar @lines, 0, "no log line holds the password $secret")
        or diag(join "\n", @lines[0 .. ($#lines > 4 ? 4 : $#lines)]);
}
unlike($log, qr/password=/, 'no log line holds "password="');

stop_all();
done_testing();


sub stop_all {
    Roads::stop();
    if ($redis) {
        kill 'TERM', $redis;
        waitpid($redis, 0);
        $redis = undef;
    }
}

END { stop_all() }

sub rcli {
    my @args = @_;
    # a list, not a shell line: the ACL words hold * and &
    open my $fh, '-|', 'redis-cli', '-h', '127.0.0.1', '-p', $rport, @args
        or return '';
    local $/;
    my $out = <$fh> // '';
    close $fh;
    $out =~ s/\s+\z//;
    return $out;
}

sub numsub {
    my (undef, $n) = split /\n/, rcli('PUBSUB', 'NUMSUB', 't195:purge');
    return $n // 0;
}

# "status headers" of one POST
sub post {
    my ($loc, $key) = @_;
    my $resp = IdemTest::exchange($port,
        "POST $loc HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: $key\r\n"
        . "Content-Length: 1\r\nConnection: close\r\n\r\nx");
    my ($status) = $resp =~ m{^HTTP/1\.\d (\d+)};
    my ($head) = split /\r\n\r\n/, $resp, 2;
    return ($status // 0) . ' ' . ($head // '');
}

sub admin {
    my ($method, $key) = @_;
    my $resp = IdemTest::exchange($port,
        "$method /admin?key=$key&scope=test: HTTP/1.1\r\nHost: localhost\r\n"
        . "Connection: close\r\n\r\n");
    my ($status) = $resp =~ m{^HTTP/1\.\d (\d+)};
    return ($status // 0) . ' ';
}

sub log_has {
    my ($re) = @_;
    return wait_for(20, sub {
        Roads::slurp("$dir/nginx/logs/error.log") =~ $re
    });
}

sub wait_for { Roads::wait_for(@_) }
