package WaitTest;

# Helpers of the acknowledged-writes suites (wait_replicas=, wait_aof:
# t/210-213): what a suite needs to run, the http{} around its locations
# (an upstream that logs its executions), a POST of a key on a socket of
# its own and its answer, the executions the upstream logged (one
# "EXEC <key>" line each), the WAITs a Redis server counted, the end of a
# log for a diagnostic.  nginx itself is started and stopped by
# t/lib/Roads (start_nginx, stop).
#
# The clients' timeouts are scaled under valgrind ($IdemTest::Slow).

use strict;
use warnings;

use File::Path ();
use IO::Socket::INET ();
use Test::More ();

use IdemTest ();
use Roads ();

# skips the suite unless it runs under make test (the module to load) and
# the commands @cmds are on the PATH
sub plan_needs {
    my (@cmds) = @_;

    Test::More::plan(skip_all => 'TEST_NGINX_LOAD_MODULES is not set '
                                 . '(run via make test)')
        unless $ENV{TEST_NGINX_LOAD_MODULES};

    return unless @cmds;
    my $last = pop @cmds;
    my $names = @cmds ? join(', ', @cmds) . " and $last" : $last;
    Test::More::plan(skip_all => "$names are needed")
        if grep { !Roads::which($_) } @cmds, $last;
}

# the http{} content of a suite for Roads::start_nginx: nginx on
# 127.0.0.1:$port with the $locations given, and /backend, the upstream,
# which answers 201 and logs one "EXEC <key>" line per execution to
# logs/exec.log (see exec_counts)
sub http_conf {
    my ($port, $locations) = @_;

    return <<HTTP;
    access_log off;
    log_format exec 'EXEC \$http_idempotency_key';
    idempotency_scope "test:\$http_authorization";

    server {
        listen 127.0.0.1:$port;

$locations
        location = /backend {
            access_log logs/exec.log exec;
            return 201 "ran \$request_id\\n";
        }
    }
HTTP
}

# the request of a key: a one-byte body "x", Connection: close
sub request {
    my ($loc, $key) = @_;
    return "POST $loc HTTP/1.1\r\nHost: localhost\r\n"
           . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
           . "Connection: close\r\n\r\nx";
}

# POSTs $key to $loc on 127.0.0.1:$port and reads the answer to its end:
# { status (0 without an answer), idem (X-Idempotency-Status), replayed
# (Idempotent-Replayed: true), body }
sub post {
    my ($port, $loc, $key) = @_;

    my $resp = IdemTest::exchange($port, request($loc, $key), 10);

    my ($head, $body) = split /\r\n\r\n/, $resp, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.\d (\d+)};
    my ($idem) = ($head // '') =~ /^X-Idempotency-Status: (\S+)/mi;

    return { status => $status // 0, idem => $idem // '',
             replayed => $resp =~ /^Idempotent-Replayed: true/mi ? 1 : 0,
             body => $body // '' };
}

# a connection to 127.0.0.1:$port on which the POST of $key to $loc is
# sent, its answer unread (undef when it could not connect)
sub send_post {
    my ($port, $loc, $key) = @_;

    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Timeout => 10 * $IdemTest::Slow)
        or return undef;
    print $s request($loc, $key);
    return $s;
}

# the answer on $s read to its end, '' when none came within $secs
sub answer {
    my ($s, $secs) = @_;
    return '' unless $s;

    my $resp = '';
    eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm(int($secs * $IdemTest::Slow));
        local $/;
        $resp = readline($s) // '';
        alarm(0);
    };
    alarm(0);

    return $resp;
}

# the status of an answer, 0 without one
sub status_of {
    my ($resp) = @_;
    return $resp =~ m{^HTTP/1\.\d (\d+)} ? $1 : 0;
}

# key => executions, from the upstream's log (nginx's logs/exec.log under
# $dir, the directory given to Roads::start_nginx)
sub exec_counts {
    my ($dir) = @_;
    my %n;
    $n{$_}++ for Roads::slurp("$dir/nginx/logs/exec.log") =~ /^EXEC (\S+)$/mg;
    return \%n;
}

# the WAIT calls in a server's INFO commandstats
sub wait_calls {
    my ($info) = @_;
    my ($calls) = $info =~ /^cmdstat_wait:calls=(\d+)/m;
    return $calls // 0;
}

# the end of a suite, once what it started is stopped: its directory
# removed unless a test failed (then kept to look at), done_testing
sub done {
    my ($dir) = @_;
    File::Path::remove_tree($dir) if Test::More->builder->is_passing;
    Test::More::done_testing();
}

# the last 30 lines of $path
sub tail {
    my ($path) = @_;
    my @l = split /\n/, Roads::slurp($path);
    splice @l, 0, -30 if @l > 30;
    return join("\n", @l) . "\n";
}

1;
