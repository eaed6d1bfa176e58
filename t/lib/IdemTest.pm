package IdemTest;

# Helpers shared by the t/*.t suites (not by the runner): a client that
# sends the first request of a key in the background, and the Redis control
# script of `make test`.  Loaded with `use lib 't/lib'; use IdemTest;` from
# the repository root, under our runner and under the real Test::Nginx.

use strict;
use warnings;

use Digest::SHA ();
use Exporter 'import';
use File::Temp ();
use IO::Socket::INET ();
use POSIX ();

our @EXPORT = qw($Slow first_request free_port key_hash key_slot redis_cli
                 redis_ctl redis_older redis_pause_all redis_busy_after
                 free_port_on start_redis_on exchange nginx_t_http
                 conf_line held_upstream);

# under valgrind everything is many times slower: so is our choreography
our $Slow = $ENV{TEST_NGINX_USE_VALGRIND} ? 6 : 1;

# Sends "POST $uri" with a one-byte body "x" from a detached process and
# returns once it is on its way (double fork: nothing is left for the runner
# to reap).  With $hangup the client closes the connection after that many
# seconds without reading the response.  $settle: seconds to wait before
# returning (default 0.5).  Both are scaled under valgrind.
sub first_request {
    my ($uri, $key, $hangup, $settle) = @_;

    my $pid = fork();
    die "fork: $!" unless defined $pid;

    if ($pid == 0) {
        POSIX::_exit(0) if fork();

        my $sock = IO::Socket::INET->new(
            PeerAddr => '127.0.0.1',
            PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
            Timeout  => 10,
        ) or POSIX::_exit(1);

        print $sock "POST $uri HTTP/1.1\r\nHost: localhost\r\n"
                    . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
                    . "Connection: close\r\n\r\nx";

        if ($hangup) {
            select(undef, undef, undef, $hangup * $Slow);
            close $sock;
            POSIX::_exit(0);
        }

        local $/;
        my $resp = <$sock>;
        POSIX::_exit(0);
    }

    waitpid($pid, 0);
    select(undef, undef, undef, ($settle // 0.5) * $Slow);
}

# `nginx -t` of a configuration of the test's own, whose http block is
# $http (the module loaded as the suites load it, nothing else around it):
# returns what nginx -t printed and the file's path, for the
# "in FILE:LINE" of its errors.
sub nginx_t_http {
    my ($http) = @_;

    my $dir = File::Temp::tempdir(CLEANUP => 1);
    mkdir "$dir/logs" or die "$dir/logs: $!\n";

    my $conf = "$dir/nginx.conf";
    open my $fh, '>', $conf or die "$conf: $!\n";
    print $fh map({ "load_module $_;\n" }
                  split ' ', $ENV{TEST_NGINX_LOAD_MODULES} // ''),
              "error_log stderr;\nevents {}\n\nhttp {\n$http\n}\n";
    close $fh;

    my $nginx = $ENV{TEST_NGINX_BINARY} || 'nginx';
    my $out = `'$nginx' -t -p '$dir/' -c '$conf' 2>&1`;

    return ($out, $conf);
}

# The line of $file on which the text $text ends: where nginx says a
# directive is (the line of its ";")
sub conf_line {
    my ($file, $text) = @_;

    open my $fh, '<', $file or die "$file: $!\n";
    local $/;
    my $c = <$fh>;

    my $at = index $c, $text;
    return 0 if $at < 0;
    return 1 + (substr($c, 0, $at + length $text) =~ tr/\n//);
}

# A one-shot upstream of the test's own on 127.0.0.1:$o{port}, listening
# when this returns: it reads one request's head, adds a line to the file
# $o{runs} if given, and answers 201 with $o{body} (a string, or a function
# of the request's head; default "created\n") once the file $o{go} exists
# (a file, not a pipe: the clients a test forks later would hold a pipe
# open); it lives at most 60 s (scaled under valgrind).  Returns its pid.
sub held_upstream {
    my (%o) = @_;

    my $srv = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                    LocalPort => $o{port}, Listen => 5,
                                    ReuseAddr => 1)
        or die "held upstream on port $o{port}: $!\n";

    my $pid = fork();
    die "fork: $!\n" unless defined $pid;

    if ($pid) {
        close $srv;
        return $pid;
    }

    alarm(int(60 * $Slow));

    my $c = $srv->accept or POSIX::_exit(1);
    my $req = '';
    while ($req !~ /\r\n\r\n/) {
        sysread($c, $req, 4096, length $req) or last;
    }

    if ($o{runs} && open my $runs, '>>', $o{runs}) {
        print $runs "run\n";
        close $runs;
    }

    select(undef, undef, undef, 0.02) until -e $o{go};

    my $body = ref $o{body} eq 'CODE' ? $o{body}->($req)
                                      : $o{body} // "created\n";
    print $c "HTTP/1.1 201 Created\r\nContent-Length: " . length($body)
             . "\r\nConnection: close\r\n\r\n$body";
    close $c;
    POSIX::_exit(0);
}

# redis-cli against make test's Redis, output without the last newline
sub redis_cli {
    my $cmd = join ' ', map { "'$_'" } @_;
    my $out = `"$ENV{TEST_NGINX_REDIS_CTL}" cli $cmd 2>/dev/null`;
    chomp $out;
    return $out;
}

# How the error log names the record of $key under $scope (default: "test:",
# the suites' scope "test:$http_authorization" for a client that sends no
# Authorization header): key_hash= and 16 hex digits of
# sha256 of the Redis key, which is TEST_NGINX_PREFIX, hex sha256 of the
# scope, ':' and the key.
sub key_hash {
    my ($key, $scope) = @_;
    my $rkey = ($ENV{TEST_NGINX_PREFIX} // 'idem:')
               . Digest::SHA::sha256_hex($scope // 'test:') . ":$key";
    return substr(Digest::SHA::sha256_hex($rkey), 0, 16);
}

# A loopback TCP port that nothing listens on now (for a server of the
# test's own configuration).
sub free_port {
    my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1',
                                  LocalPort => 0, Proto => 'tcp')
        or die "port: $!\n";
    my $p = $s->sockport;
    close $s;
    return $p;
}

# Sends the raw $request to 127.0.0.1:$port and reads the answer to its
# end (the request should ask for Connection: close): the answer, '' when
# none came within $secs seconds (default 10; scaled under valgrind).
sub exchange {
    my ($port, $request, $secs) = @_;
    my $limit = ($secs // 10) * $Slow;

    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Timeout => $limit)
        or return '';

    print $s $request;

    my $resp = '';
    eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm($limit);
        local $/;
        $resp = <$s> // '';
        alarm(0);
    };
    alarm(0);

    return $resp;
}

# A TCP port free on every one of the loopback addresses @ips (for
# servers that must share a port, as a name's addresses do).
sub free_port_on {
    my @ips = @_;

    for (1 .. 50) {
        my $p = free_port();
        my @s = map {
            IO::Socket::INET->new(Listen => 1, LocalAddr => $_,
                                  LocalPort => $p, Proto => 'tcp')
        } @ips;
        return $p unless grep { !defined } @s;
    }

    die "no free port on @ips\n";
}

# A redis-server of the test's own on $ip:$port (no persistence, files in
# $dir), in the foreground as a child: its pid once it answers PING, or
# undef (the caller stops it by that pid).
sub start_redis_on {
    my ($ip, $port, $dir) = @_;

    my $pid = fork();
    die "fork: $!\n" unless defined $pid;

    if ($pid == 0) {
        open STDOUT, '>>', "$dir/redis-$ip.out" or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        exec 'redis-server', '--bind', $ip, '--port', $port,
             '--save', '', '--appendonly', 'no', '--dir', $dir,
             '--dbfilename', "dump-$ip.rdb"
            or POSIX::_exit(127);
    }

    for (1 .. 100) {
        return $pid if `redis-cli -h $ip -p $port PING 2>/dev/null` =~ /PONG/;
        select(undef, undef, undef, 0.1);
    }

    kill 'TERM', $pid;
    waitpid($pid, 0);
    return undef;
}

# the Redis Cluster slot of a key (CRC16/XMODEM of its hash tag or of it)
sub key_slot {
    my ($key) = @_;
    $key = $1 if $key =~ /\{([^}]+)\}/ && index($key, '{') == $-[0];
    my $crc = 0;
    for my $c (unpack 'C*', $key) {
        $crc ^= $c << 8;
        $crc = $crc & 0x8000 ? (($crc << 1) ^ 0x1021) & 0xffff
                             : ($crc << 1) & 0xffff for 1 .. 8;
    }
    return $crc % 16384;
}

# The version of the redis-server on PATH, which make test and the test
# topologies start (make test REDIS=6.0.20 puts another one there):
# (major, minor), Valkey's own for Valkey; (0, 0) without one.
my @Version;

sub redis_version {
    @Version = `redis-server --version 2>/dev/null` =~ /v=(\d+)\.(\d+)/
        or @Version = (0, 0)
        unless @Version;
    return @Version;
}

# true when that server is older than $major.$minor: the tests of what it
# lacks skip with a reason (skip_eval, or skip in a Test::More block)
sub redis_older {
    my ($major, $minor) = @_;
    my ($ma, $mi) = redis_version();
    return $ma < $major || ($ma == $major && $mi < ($minor // 0));
}

# CLIENT PAUSE of every client for $ms: "ALL" is 6.2's word; 6.0 pauses
# every client without it (and knows no "WRITE")
sub redis_pause_all {
    my ($ms) = @_;
    return redis_cli('CLIENT', 'PAUSE', $ms, redis_older(6, 2) ? () : 'ALL');
}

# after how many ms a running script makes Redis answer BUSY: the setting
# is busy-reply-threshold since Redis 7.0, lua-time-limit before
sub redis_busy_after {
    my ($ms) = @_;
    return redis_cli('CONFIG', 'SET', redis_older(7, 0) ? 'lua-time-limit'
                                                         : 'busy-reply-threshold',
                     $ms);
}

sub redis_ctl {
    system("'$ENV{TEST_NGINX_REDIS_CTL}' @_ > /dev/null") == 0
        or die "redis-ctl @_ failed\n";
}

1;
