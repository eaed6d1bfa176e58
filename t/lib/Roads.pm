package Roads;

# The roads through nginx for t/150-roads.t (the conformance matrix) and
# t/152-stripe.t (a real client with a timeout): a counting backend that
# speaks HTTP and SCGI (and runs as a CGI script under fcgiwrap, see
# t/lib/roads.cgi), an nginx of our own with one protected location per
# road, and the clients (HTTP/1.0 and HTTP/1.1 over sockets, HTTP/2 h2c
# with t/lib/roads_h2.py) that stay, leave before the header, leave
# mid-body or retry at once after the last byte.
#
# Every server listens on 127.0.0.1 only and is stopped by pid (stop(),
# also from an END block and on INT/TERM).
#
# The backend writes one line "KEY EXECID" to DIR/execs.log per execution
# (a request it did the work for); execs($key) counts them.  A response
# carries its EXECID in the body, so a second execution never replays the
# bytes of the first.  Request headers steer it:
#   X-Roads-Hdr-Delay: S    sleep S seconds before the response header
#   X-Roads-Body-Delay: S   send the header and part of the body, sleep S
#                           seconds, then the rest
# and the query names the response: ?r=ok|chunked|204|gzip|big.

use strict;
use warnings;

use Digest::SHA ();
use Exporter 'import';
use POSIX ();
use Time::HiRes qw(sleep time);

# the rest only where they are used: t/lib/roads.cgi starts for every
# request under fcgiwrap and needs none of them
sub need {
    for my $m (@_) {
        (my $f = "$m.pm") =~ s{::}{/}g;
        require $f;
    }
}

our @EXPORT_OK = qw(free_port);

# under valgrind everything is many times slower: so is our choreography
our $Slow = $ENV{TEST_NGINX_USE_VALGRIND} ? 6 : 1;

# seconds the backend takes to make a charge (POST /v1/charges)
our $ChargeDelay = 2;

my @Pids;           # processes we started, to stop
my $Owner = $$;

END {
    h2_stop();
    stop() if $$ == $Owner;
}

sub free_port {
    require IdemTest;
    return IdemTest::free_port();
}

sub port_open {
    my ($port) = @_;
    need('IO::Socket::INET');
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Timeout => 1);
    return $s ? 1 : 0;
}

sub wait_for {
    my ($secs, $cond) = @_;
    my $end = time + $secs * $Slow;
    while (time < $end) {
        return 1 if $cond->();
        sleep 0.05;
    }
    return $cond->() ? 1 : 0;
}

sub slurp {
    my ($path) = @_;
    open my $fh, '<:raw', $path or return '';
    local $/;
    return scalar <$fh>;
}

sub write_file {
    my ($path, $text) = @_;
    open my $fh, '>:raw', $path or die "$path: $!\n";
    print $fh $text;
    close $fh or die "$path: $!\n";
}

sub which {
    my ($name) = @_;
    need('File::Spec');
    for my $d (File::Spec->path) {
        my $p = File::Spec->catfile($d, $name);
        return $p if -x $p && !-d _;
    }
    return undef;
}

sub spawn {
    my ($code) = @_;
    my $pid = fork();
    die "fork: $!\n" unless defined $pid;
    if ($pid == 0) {
        @Pids = ();
        $SIG{INT} = $SIG{TERM} = 'DEFAULT';
        setpgrp(0, 0);              # a group of its own, stopped as one
        $code->();
        POSIX::_exit(0);
    }
    push @Pids, $pid;
    return $pid;
}

# waits at most $secs for $pid (one of ours) to end; kills it after that
sub wait_pid {
    my ($pid, $secs) = @_;
    my $end = time + $secs;
    while (time < $end) {
        if (waitpid($pid, POSIX::WNOHANG()) != 0) {
            @Pids = grep { $_ != $pid } @Pids;
            return 1;
        }
        sleep 0.1;
    }
    return 0;
}

# stops what we started, newest first, each with the processes it forked
# (its process group): QUIT (nginx), then TERM, then KILL
sub stop {
    while (my $pid = pop @Pids) {
        kill 'QUIT', $pid;
        my $gone = 0;
        for my $i (1 .. 200) {
            if (waitpid($pid, POSIX::WNOHANG()) != 0) {
                $gone = 1;
                last;
            }
            kill 'TERM', $pid if $i == 100;
            sleep 0.05;
        }
        unless ($gone) {
            kill 'KILL', $pid;
            waitpid($pid, 0);
        }
        # what is left of its group (fcgiwrap's children, the backend's)
        kill 'TERM', -$pid;
    }
}


# --- the backend ----------------------------------------------------------

my %Reason = (200 => 'OK', 201 => 'Created', 204 => 'No Content');

sub exec_id {
    my ($s, $us) = Time::HiRes::gettimeofday();
    return sprintf '%d%06d%d', $s % 100000, $us, $$;
}

# 64 KiB of lines unique to $id
sub block64k {
    my ($id) = @_;
    my $b = '';
    my $i = 0;
    $b .= Digest::SHA::sha1_hex("$id $i++") . "\n" while length $b < 65536;
    return substr($b, 0, 65536);
}

# the response of kind $kind for execution $id:
# { status, headers => [name, value, ...], body, chunked }
sub render {
    my ($kind, $id) = @_;

    if ($kind eq 'ok') {
        return { status => 200, headers => ['Content-Type', 'application/json'],
                 body => qq({"id":"ch_$id","object":"charge","amount":100,)
                         . qq("description":") . ('roads ' x 1700) . qq("}\n) };
    }
    if ($kind eq 'chunked') {
        return { status => 201, headers => ['Content-Type', 'text/plain'],
                 chunked => 1,
                 body => join '', map { "line $_ of execution $id\n" }
                                  1 .. 300 };
    }
    if ($kind eq '204') {
        return { status => 204, headers => [], body => '' };
    }
    if ($kind eq 'gzip') {
        return { status => 200, headers => ['Content-Type', 'text/plain'],
                 body => join '', map { Digest::SHA::sha1_hex("$id $_") . "\n" }
                                  1 .. 5000 };
    }
    if ($kind eq 'big') {
        return { status => 200,
                 headers => ['Content-Type', 'application/octet-stream'],
                 body => block64k($id) x 32 };
    }
    if ($kind eq 'charge') {
        return { status => 200, headers => ['Content-Type', 'application/json',
                                            'Request-Id', "req_$id"],
                 body => qq({"id":"ch_$id","object":"charge","amount":100,)
                         . qq("currency":"usd","paid":true,)
                         . qq("status":"succeeded","livemode":false,)
                         . qq("created":) . time() . qq(}\n) };
    }
    return { status => 404, headers => ['Content-Type', 'text/plain'],
             body => "no kind $kind\n" };
}

# the static files of the X-Accel-Redirect-to-a-file road
sub static_files {
    my ($dir) = @_;
    need('File::Path');
    File::Path::make_path("$dir/files");
    write_file("$dir/files/ok.json", render('ok', 'static')->{body});
    write_file("$dir/files/gzip.txt", render('gzip', 'static')->{body});
    write_file("$dir/files/big.bin", render('big', 'static')->{body});
}

sub count_exec {
    my ($dir, $key, $id) = @_;
    open my $fh, '>>', "$dir/execs.log" or die "$dir/execs.log: $!\n";
    syswrite $fh, ($key eq '' ? '-' : $key) . " $id\n";
    close $fh;
}

# one request: { method, path, query, h => { lc name => value } } ->
# the response to send and its body delay
sub dispatch {
    my ($dir, $req) = @_;
    my %q = map { /^([^=]*)=?(.*)$/ ? ($1, $2) : () } split /&/, $req->{query};
    my $h = $req->{h};
    my $kind = $q{r} // 'ok';
    my $key = $h->{'idempotency-key'} // '';
    my $hdr_delay = $h->{'x-roads-hdr-delay'} || 0;
    my $body_delay = $h->{'x-roads-body-delay'} || 0;

    if ($req->{path} =~ m{^/render/(\w+)/(\w+)$}) {
        return (render($1, $2), $body_delay);
    }

    my $id = exec_id();
    count_exec($dir, $key, $id);

    if ($req->{path} =~ m{^/v1/charges}) {
        sleep $ChargeDelay;
        return (render('charge', $id), 0);
    }

    sleep $hdr_delay if $hdr_delay;

    if ($req->{path} =~ m{^/accel-(loc|file)}) {
        my $to = $1 eq 'loc' ? "/_loc/$kind/$id"
               : $kind eq 'ok' ? '/_file/ok.json'
               : $kind eq 'gzip' ? '/_file/gzip.txt'
               : '/_file/big.bin';
        return ({ status => 200, headers => ['X-Accel-Redirect', $to],
                  body => '' }, 0);
    }

    return (render($kind, $id), $body_delay);
}

# writes $res to $fh: HTTP/1.1 ($style 'http') or CGI/SCGI ('cgi')
sub emit {
    my ($fh, $style, $res, $delay) = @_;
    my $st = $res->{status};
    my $head = $style eq 'http' ? "HTTP/1.1 $st $Reason{$st}\r\n"
                                : "Status: $st $Reason{$st}\r\n";
    my @h = @{ $res->{headers} };
    while (my ($n, $v) = splice @h, 0, 2) {
        $head .= "$n: $v\r\n";
    }
    my $body = $res->{body};
    my $chunked = $res->{chunked} && $style eq 'http';
    if ($st != 204) {
        if ($chunked) {
            $head .= "Transfer-Encoding: chunked\r\n";
        } elsif (!$res->{chunked}) {
            $head .= 'Content-Length: ' . length($body) . "\r\n";
        }
    }
    $head .= "Connection: close\r\n" if $style eq 'http';
    $head .= "\r\n";

    my $wire = $body;
    if ($chunked) {
        $wire = '';
        for (my $o = 0; $o < length $body; $o += 1024) {
            my $c = substr $body, $o, 1024;
            $wire .= sprintf("%x\r\n", length $c) . "$c\r\n";
        }
        $wire .= "0\r\n\r\n";
    }

    my $first = length $wire > 131072 ? 65536 : int(length($wire) / 2);
    $first = length $wire unless $delay;
    local $SIG{PIPE} = 'IGNORE';
    write_all($fh, $head . substr($wire, 0, $first)) or return;
    if ($delay) {
        sleep $delay;
        write_all($fh, substr($wire, $first));
    }
}

sub write_all {
    my ($fh, $data) = @_;
    my $off = 0;
    while ($off < length $data) {
        my $n = syswrite $fh, $data, 65536, $off;
        return 0 unless $n;
        $off += $n;
    }
    return 1;
}

sub read_http_request {
    my ($sock) = @_;
    my $buf = '';
    while ($buf !~ /\r\n\r\n/) {
        my $n = sysread $sock, $buf, 65536, length $buf;
        return undef unless $n;
    }
    my ($head, $rest) = split /\r\n\r\n/, $buf, 2;
    my ($line, @lines) = split /\r\n/, $head;
    my ($method, $uri) = split / /, $line;
    my %h;
    for (@lines) {
        $h{lc $1} = $2 if /^([^:]+):\s*(.*?)\s*$/;
    }
    my $len = $h{'content-length'} || 0;
    while (length $rest < $len) {
        my $n = sysread $sock, $rest, 65536, length $rest;
        last unless $n;
    }
    my ($path, $query) = split /\?/, $uri, 2;
    return { method => $method, path => $path, query => $query // '',
             h => \%h };
}

# CGI-style variables (SCGI headers, CGI environment) -> request
sub request_of_env {
    my ($env) = @_;
    my %h;
    for my $k (keys %$env) {
        next unless $k =~ /^HTTP_(.+)$/;
        (my $n = lc $1) =~ tr/_/-/;
        $h{$n} = $env->{$k};
    }
    my ($path) = split /\?/, $env->{REQUEST_URI} // '/', 2;
    return { method => $env->{REQUEST_METHOD} // 'GET', path => $path,
             query => $env->{QUERY_STRING} // '', h => \%h };
}

sub read_scgi_request {
    my ($sock) = @_;
    my $buf = '';
    while ($buf !~ /^(\d+):/ || length $buf < length($1) + 2 + $1) {
        my $n = sysread $sock, $buf, 65536, length $buf;
        return undef unless $n;
    }
    $buf =~ /^(\d+):/;
    my $hlen = $1;
    my $hdrs = substr $buf, length($hlen) + 1, $hlen;
    my $rest = substr $buf, length($hlen) + 1 + $hlen + 1;
    my %env = split /\0/, $hdrs;
    my $len = $env{CONTENT_LENGTH} || 0;
    while (length $rest < $len) {
        my $n = sysread $sock, $rest, 65536, length $rest;
        last unless $n;
    }
    return request_of_env(\%env);
}

# the backend: HTTP on $http_port, SCGI on $scgi_port, a process per
# connection; returns its pid
sub start_backend {
    my ($dir, $http_port, $scgi_port) = @_;
    need(qw(IO::Select IO::Socket::INET));
    my @l;
    for my $port ($http_port, $scgi_port) {
        next unless $port;
        push @l, IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                       LocalPort => $port, Listen => 128,
                                       ReuseAddr => 1)
            or die "backend: listen on $port: $!\n";
    }
    my $pid = spawn(sub {
        $SIG{CHLD} = 'IGNORE';
        my $sel = IO::Select->new(@l);
        while (1) {
            for my $l ($sel->can_read) {
                my $c = $l->accept or next;
                my $scgi = $scgi_port && $l->sockport == $scgi_port;
                my $child = fork();
                if (defined $child && $child == 0) {
                    close $_ for @l;
                    my $req = $scgi ? read_scgi_request($c)
                                    : read_http_request($c);
                    if ($req) {
                        my ($res, $delay) = dispatch($dir, $req);
                        emit($c, $scgi ? 'cgi' : 'http', $res, $delay);
                    }
                    close $c;
                    POSIX::_exit(0);
                }
                close $c;
            }
        }
    });
    close $_ for @l;
    for my $port ($http_port, $scgi_port) {
        next unless $port;
        wait_for(10, sub { port_open($port) })
            or die "backend did not listen on $port\n";
    }
    return $pid;
}

# the CGI script's main (t/lib/roads.cgi under fcgiwrap)
sub cgi_main {
    my $dir = $ENV{ROADS_DIR} or die "ROADS_DIR not set\n";
    my $len = $ENV{CONTENT_LENGTH} || 0;
    my $body = '';
    while (length $body < $len) {
        my $n = sysread STDIN, $body, $len - length $body, length $body;
        last unless $n;
    }
    my ($res, $delay) = dispatch($dir, request_of_env(\%ENV));
    emit(\*STDOUT, 'cgi', $res, $delay);
}

# fcgiwrap on $port; returns its pid or undef when it is not installed
sub start_fcgiwrap {
    my ($port) = @_;
    my $bin = which('fcgiwrap') // (-x '/usr/sbin/fcgiwrap'
                                    ? '/usr/sbin/fcgiwrap' : undef);
    return undef unless $bin;
    my $pid = spawn(sub {
        exec $bin, '-c', '8', '-s', "tcp:127.0.0.1:$port";
    });
    wait_for(10, sub { port_open($port) })
        or die "fcgiwrap did not listen on $port\n";
    return $pid;
}


# --- nginx -----------------------------------------------------------------

# starts nginx with prefix $dir/nginx and $conf as the http{} block's
# content; returns its pid (dies when it does not listen on $port)
# an nginx of ours with $http in its http{} (listening on $port), its
# prefix DIR/nginx, error log at info, $workers workers (default 2), under
# valgrind when the run is; its pid, stopped with the rest by stop()
sub start_nginx {
    my ($dir, $port, $http, $workers) = @_;
    $workers //= 2;
    my $prefix = "$dir/nginx";
    need('File::Path');
    File::Path::make_path("$prefix/conf", "$prefix/logs");
    my $nginx = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';

    write_file("$prefix/conf/nginx.conf", <<CONF);
load_module $ENV{TEST_NGINX_LOAD_MODULES};
daemon off;
master_process on;
worker_processes $workers;
error_log logs/error.log info;
pid logs/nginx.pid;

events {
    worker_connections 1024;
}

http {
    access_log off;
    default_type text/plain;
    client_body_temp_path $prefix/client_body_temp;
    proxy_temp_path $prefix/proxy_temp;
    fastcgi_temp_path $prefix/fastcgi_temp;
    scgi_temp_path $prefix/scgi_temp;
    uwsgi_temp_path $prefix/uwsgi_temp;
$http
}
CONF

    my @cmd = ($nginx, '-p', "$prefix/", '-c', 'conf/nginx.conf');
    if ($ENV{TEST_NGINX_USE_VALGRIND}) {
        my @vg = ('valgrind', '-q', '--tool=memcheck', '--leak-check=full',
                  '--keep-debuginfo=yes', '--show-possibly-lost=no',
                  '--gen-suppressions=all', '--num-callers=100',
                  '--trace-children=no');
        push @vg, '--suppressions=valgrind.suppress' if -f 'valgrind.suppress';
        @cmd = (@vg, @cmd);
    }
    # valgrind reports to stderr: into make test-valgrind's log, which
    # scripts/valgrind-check.sh reads, as the runner does
    my $vglog = $ENV{TEST_NGINX_USE_VALGRIND} && $ENV{TEST_NGINX_VALGRIND_LOG};
    my $stderr = $vglog || "$prefix/logs/stderr.log";
    # the suite's name before valgrind's lines, as the runner writes its
    # "=== t/x.t TEST n" (scripts/valgrind-check.sh counts them)
    if ($vglog && open my $vl, '>>', $vglog) {
        print $vl "=== $0 nginx on port $port\n";
        close $vl;
    }
    my $pid = spawn(sub {
        open STDERR, '>>', $stderr;
        exec @cmd;
    });
    my $gone = 0;
    wait_for(20, sub {
        $gone = waitpid($pid, POSIX::WNOHANG()) != 0;
        return $gone || port_open($port);
    });
    die "nginx did not start:\n" . slurp($stderr)
        . slurp("$prefix/logs/error.log") if $gone || !port_open($port);
    return $pid;
}

sub tempdir {
    my ($name, $keep) = @_;
    need(qw(File::Spec File::Temp));
    my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
    my $dir = File::Spec->rel2abs(
        File::Temp::tempdir("$name-XXXXXX", DIR => $base, CLEANUP => !$keep));
    # nginx's workers (user nobody when started as root) write temporary
    # files under it and read the static files
    chmod 0755, $dir;
    return $dir;
}

# executions of $key so far
sub execs {
    my ($dir, $key) = @_;
    my $n = () = slurp("$dir/execs.log") =~ /^\Q$key\E /mg;
    return $n;
}


# --- clients ---------------------------------------------------------------

# HTTP/1.x response parser: { status, headers => { lc => [values] },
# body (de-chunked), complete } from the bytes so far; $eof: the
# connection ended
sub parse_h1 {
    my ($raw, $eof, $head_only) = @_;
    my %r = (raw => $raw, headers => {}, complete => 0, have_header => 0);
    my $i = index $raw, "\r\n\r\n";
    return \%r if $i < 0;
    $r{have_header} = 1;
    my $head = substr $raw, 0, $i;
    my $rest = substr $raw, $i + 4;
    my ($line, @lines) = split /\r\n/, $head;
    ($r{proto}, $r{status}) = $line =~ m{^(HTTP/\S+) (\d+)};
    $r{status} //= 0;
    for (@lines) {
        push @{ $r{headers}{lc $1} }, $2 if /^([^:]+):\s*(.*?)\s*$/;
    }
    my $te = join ',', @{ $r{headers}{'transfer-encoding'} || [] };
    my $cl = $r{headers}{'content-length'};
    if ($head_only || $r{status} == 204 || $r{status} == 304) {
        $r{body} = '';
        $r{complete} = 1;
    } elsif ($te =~ /chunked/i) {
        my ($body, $off) = ('', 0);
        while (1) {
            my $e = index $rest, "\r\n", $off;
            last if $e < 0;
            my $len = hex substr($rest, $off, $e - $off);
            if ($len == 0) {
                $r{complete} = 1 if index($rest, "\r\n\r\n", $e) == $e;
                last;
            }
            last if length $rest < $e + 2 + $len + 2;
            $body .= substr $rest, $e + 2, $len;
            $off = $e + 2 + $len + 2;
        }
        $r{body} = $body;
    } elsif ($cl) {
        $r{body} = $rest;
        $r{complete} = length $rest >= $cl->[0];
    } else {
        $r{body} = $rest;
        $r{complete} = $eof;
    }
    return \%r;
}

# one request over HTTP/1.0 or HTTP/1.1 on a new connection.
#   h1(port => P, proto => '1.1', path => '/x?r=ok', key => K,
#      headers => [...], mode => 'stay'|'leave_hdr'|'leave_body')
sub h1 {
    my (%o) = @_;
    need(qw(IO::Select IO::Socket::INET));
    my $mode = $o{mode} // 'stay';
    my $body = $o{body} // 'amount=100';
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $o{port}, Timeout => 5)
        or return { status => 0, error => "connect: $!", headers => {} };
    my $req = "POST $o{path} HTTP/$o{proto}\r\nHost: localhost\r\n"
              . "Idempotency-Key: $o{key}\r\n"
              . join('', map { "$_\r\n" } @{ $o{headers} || [] })
              . "Content-Type: application/x-www-form-urlencoded\r\n"
              . 'Content-Length: ' . length($body) . "\r\n"
              . "Connection: close\r\n\r\n$body";
    write_all($s, $req);

    my $raw = '';
    my $sel = IO::Select->new($s);
    my $start = time;
    my $deadline = $start + ($mode eq 'leave_hdr' ? 0.15 : 20 * $Slow);
    my ($hdr_at, $eof, $r) = (undef, 0);
    while (1) {
        $r = parse_h1($raw, $eof);
        last if $r->{complete} || $eof;
        if ($mode eq 'leave_body' && $r->{have_header}) {
            $hdr_at //= time;
            last if length $r->{body} || time > $hdr_at + 0.3;
        }
        my $left = $deadline - time;
        last if $left <= 0;
        my $wait = $mode eq 'leave_body' && $hdr_at ? 0.05 : $left;
        next unless $sel->can_read($wait < $left ? $wait : $left);
        my $n = sysread $s, $raw, 65536, length $raw;
        $eof = 1 unless $n;
    }
    close $s;
    $r->{mode} = $mode;
    return $r;
}

# the HTTP/2 client: t/lib/roads_h2.py (python3-h2), one process for all
# the requests of this process, started on first use
my ($H2pid, $H2to, $H2from, $H2owner);

# a python3 that has the h2 package (Debian's python3-h2 is for
# /usr/bin/python3, which need not be the first python3 on PATH)
sub h2_python {
    need('File::Spec');
    for my $py ('/usr/bin/python3', which('python3')) {
        next unless $py && -x $py;
        return $py
            if system("'$py' -c 'import h2.connection' 2>/dev/null") == 0;
    }
    return undef;
}

sub h2_stop {
    return unless $H2pid && $H2owner == $$;
    close $H2to;
    close $H2from;
    waitpid $H2pid, 0;
    undef $H2pid;
}

sub h2 {
    my (%o) = @_;
    need(qw(File::Spec IO::Handle IPC::Open2 JSON::PP));
    unless ($H2pid && $H2owner == $$) {
        my $py = h2_python() or die "no python3 with the h2 package\n";
        my $script = File::Spec->catfile((File::Spec->splitpath(
                         File::Spec->rel2abs(__FILE__)))[0, 1], 'roads_h2.py');
        $H2pid = IPC::Open2::open2($H2from, $H2to, $py, $script);
        binmode $H2from;
        $H2owner = $$;
    }
    my $req = { port => $o{port}, path => $o{path},
                headers => [ map { [split /:\s*/, $_, 2] }
                             'Idempotency-Key: ' . $o{key},
                             @{ $o{headers} || [] } ],
                body => $o{body} // 'amount=100', mode => $o{mode} // 'stay',
                leave_after => 0.15, timeout => 20 * $Slow };
    print {$H2to} JSON::PP->new->canonical->encode($req), "\n";
    $H2to->flush;
    my $line = readline $H2from;
    die "roads_h2.py ended\n" unless defined $line;
    my $r = JSON::PP->new->decode($line);
    my $body = '';
    while (length $body < $r->{body_length}) {
        my $n = read $H2from, $body, $r->{body_length} - length $body,
                     length $body;
        die "roads_h2.py ended\n" unless $n;
    }
    $r->{body} = $body;
    $r->{mode} = $o{mode} // 'stay';
    return $r;
}

sub request {
    my (%o) = @_;
    return $o{proto} eq '2' ? h2(%o) : h1(%o);
}

# what a replay must repeat byte for byte
sub signature {
    my ($r) = @_;
    my $h = $r->{headers};
    return join "\n", $r->{status} // 0,
        map({ "$_: " . join(', ', @{ $h->{$_} || [] }) }
            qw(content-type content-encoding)),
        Digest::SHA::sha256_hex($r->{body} // '') . ' '
        . length($r->{body} // '');
}

sub replayed {
    my ($r) = @_;
    return (join ',', @{ $r->{headers}{'idempotent-replayed'} || [] })
           eq 'true';
}

sub describe {
    my ($r) = @_;
    return 'none' unless $r;
    my $s = $r->{status} || 'no status';
    $s .= ' (incomplete)' unless $r->{complete};
    $s .= ' replayed' if replayed($r);
    $s .= ' ' . length($r->{body} // '') . ' bytes';
    return $s;
}

1;
