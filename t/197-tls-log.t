# What a TLS connection that keeps failing writes to the error log: once
# per streak, however often it reconnects.  One worker connects (and keeps
# reconnecting, with back-off) to four servers that never let it in:
#
#   a redis-server that requires a client certificate the module lacks
#   (nginx's own "SSL_read() failed ... certificate required" line, which
#   nginx writes at [crit] whatever the connection's log_error says);
#   a server that answers every ClientHello with bytes that are no TLS and
#   closes ("SSL_do_handshake() failed ... wrong version number"), and a
#   sentinel that does the same (asked before every connect of its master);
#   the plain (non-TLS) port of a redis-server, where the handshake gets no
#   answer at all: the line says so, not only "timed out".
#
# After at least six attempts at each, counted by the servers, the log
# holds at most one of nginx's SSL lines per connection (the first
# failure's), each naming its Redis, and one module line per streak.
#
# A plain Test::More file with its own certificates (openssl), servers and
# nginx on free loopback ports, all stopped by pid.  Run from the
# repository root (prove does).

use strict;
use warnings;
use Test::More;
use File::Spec ();
use File::Temp ();
use IO::Socket::INET ();
use POSIX ();

use lib 't/lib';
use IdemTest ();
use Roads ();

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'redis-server, redis-cli and openssl are needed'
    unless `sh -c 'command -v redis-server && command -v redis-cli \\
                   && command -v openssl'` =~ /openssl/;

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t197-XXXXXX',
                                                   DIR => $base));
chmod 0755, $dir;

my @pids;

use File::Path ();

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

# a CA and a server certificate for 127.0.0.1
my $ssl = sub { system("openssl @_ >>'$dir/openssl.log' 2>&1") == 0 };
my $ec = '-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';
Roads::write_file("$dir/san.ext", "subjectAltName=IP:127.0.0.1\n");
$ssl->("req -x509 $ec -keyout $dir/ca.key -out $dir/ca.crt -days 2"
       . " -subj /CN=t197-ca")
    && $ssl->("req $ec -keyout $dir/server.key -out $dir/server.csr"
              . " -subj /CN=t197-server")
    && $ssl->("x509 -req -in $dir/server.csr -CA $dir/ca.crt"
              . " -CAkey $dir/ca.key -CAcreateserial -days 2"
              . " -extfile $dir/san.ext -out $dir/server.crt")
    or plan skip_all => 'openssl could not make the certificates';
chmod 0644, glob("$dir/*");

# a redis-server whose TLS port wants a client certificate (its plain
# port for our redis-cli only), and a plain one for "tls" pointed at it
my ($tport, $cport) = (IdemTest::free_port(), IdemTest::free_port());
my $rpid = fork();
die "fork: $!\n" unless defined $rpid;
if ($rpid == 0) {
    open STDOUT, '>>', "$dir/redis.log";
    open STDERR, '>&', \*STDOUT;
    exec 'redis-server', '--bind', '127.0.0.1', '--port', $cport,
         '--tls-port', $tport, '--save', '', '--appendonly', 'no',
         '--dir', $dir, '--tls-cert-file', "$dir/server.crt",
         '--tls-key-file', "$dir/server.key",
         '--tls-ca-cert-file', "$dir/ca.crt", '--tls-auth-clients', 'yes'
        or POSIX::_exit(127);
}
push @pids, $rpid;
Roads::wait_for(20, sub { cli($cport, 'PING') eq 'PONG' })
    or do { stop_all(); plan skip_all => 'redis-server has no TLS' };

my $pport = IdemTest::free_port();
my $ppid = IdemTest::start_redis_on('127.0.0.1', $pport, $dir)
    or do { stop_all(); plan skip_all => 'redis-server did not start' };
push @pids, $ppid;

# connections each server accepted before nginx: those are not the module's
my %calls;
my %before = ($pport => received($pport));

# breakers: each answers every connection with a Redis error line, which
# is no TLS record, and closes it, counting them in a file; one stands for
# a Redis, one for a sentinel
my $bport = breaker('breaker');
my $sport = breaker('sentinel');

my $port = IdemTest::free_port();
my $ca = "$dir/ca.crt";

Roads::start_nginx($dir, $port, <<HTTP, 1);
    idempotency_scope "test:";

    server {
        listen 127.0.0.1:$port;

        location = /mtls {
            idempotency on;
            idempotency_redis 127.0.0.1:$tport tls tls_trusted_certificate=$ca
                              prefix=t197: connect_timeout=2s;
            return 201;
        }

        location = /broken {
            idempotency on;
            idempotency_redis 127.0.0.1:$bport tls tls_trusted_certificate=$ca
                              prefix=t197: connect_timeout=2s;
            return 201;
        }

        location = /status {
            idempotency_status;
        }

        location = /plain {
            idempotency on;
            idempotency_redis 127.0.0.1:$pport tls tls_trusted_certificate=$ca
                              prefix=t197: connect_timeout=300ms;
            return 201;
        }

        location = /sentinel {
            idempotency on;
            idempotency_redis 127.0.0.1:$sport sentinel=mymaster tls
                              tls_trusted_certificate=$ca prefix=t197:
                              connect_timeout=2s;
            return 201;
        }

        location = /plain-no-tls {
            idempotency on;
            idempotency_redis 127.0.0.1:$pport prefix=t197:;
            return 201;
        }
    }
HTTP

my $log = "$dir/nginx/logs/error.log";

# attempts, as the servers count them: the TLS port logs each handshake
# it refused; the breaker counts; the plain server counts every connection
# it accepted, less those of our redis-cli (each counted before it is
# answered)
ok(Roads::wait_for(90, sub { refused() >= 6 }),
   'the module tried the server that wants a client certificate 6 times')
    or diag(Roads::slurp($log));
ok(Roads::wait_for(90, sub { (Roads::slurp("$dir/breaker.count") || 0) >= 6 }),
   'and the server that breaks handshakes 6 times');
ok(Roads::wait_for(90, sub { (Roads::slurp("$dir/sentinel.count") || 0) >= 6 }),
   'and a sentinel that breaks them 6 times');
# (the plain server also has the connection of /plain-no-tls, one)
ok(Roads::wait_for(90, sub { module_tries($pport) >= 7 }),
   'and the plain port 6 times');

my $text = Roads::slurp($log);
my @ssl = grep { /SSL_\w+\(\) failed|peer closed connection in SSL/ }
          split /\n/, $text;

cmp_ok(scalar @ssl, '<=', 4,
       "nginx's SSL lines: at most one per failing connection, not one per "
       . 'reconnect')
    or diag(join "\n", @ssl[0 .. ($#ssl > 7 ? 7 : $#ssl)]);
# the server's alert may come before or after the module's first write
is(scalar(grep { /redis: "tls:\/\/127\.0\.0\.1:$tport"/ } @ssl), 1,
   'the missing client certificate is logged once, naming its Redis');
is(scalar(grep { /redis: "tls:\/\/127\.0\.0\.1:$bport"/ } @ssl), 1,
   'the broken handshake is logged once, naming its Redis');
# two connections to a sentinel (its queries, its events): one line each
cmp_ok(scalar(grep { /redis: "tls:\/\/127\.0\.0\.1:$sport"/ } @ssl), '<=', 2,
       'and the sentinel\'s once per connection, naming it');

my $mod = () = $text =~ /idempotency redis: "tls:\/\/127\.0\.0\.1:$tport" /g;
is($mod, 1, 'and the module logs that streak once, naming it with "tls://"');

like($text, qr/"tls:\/\/127\.0\.0\.1:$pport" connect failed: timed out in the TLS handshake, the server never answered it \(a port without TLS/,
     'TLS to a plain port: the line says the handshake got no answer');
my $plain = () = $text =~ /"tls:\/\/127\.0\.0\.1:$pport" connect failed/g;
is($plain, 1, 'once per streak');

# a TLS and a plain connection to one address: told apart in the status
my $status = '';
Roads::wait_for(20, sub {
    $status = IdemTest::exchange($port, "GET /status?format=json HTTP/1.0\r\n"
                                        . "Host: localhost\r\n\r\n");
    $status =~ /"redis": "127\.0\.0\.1:$pport", "connection": "main", "ready": true/;
});
like($status, qr/"redis": "tls:\/\/127\.0\.0\.1:$pport", "connection": "main", "ready": false/,
     'the status names the TLS connection with "tls://"');
like($status, qr/"redis": "127\.0\.0\.1:$pport", "connection": "main", "ready": true/,
     'and the plain one to the same address without');
unlike($text, qr/"127\.0\.0\.1:(?:$tport|$bport|$pport)" (?:connect failed|connection lost)/,
       'no TLS connection is named without its scheme');

unlike($text, qr/\[(?:alert|emerg)\]/, 'no alert');

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


sub breaker {
    my ($name) = @_;
    my $listen = IO::Socket::INET->new(Listen => 16,
                                       LocalAddr => '127.0.0.1',
                                       LocalPort => 0, Proto => 'tcp')
        or die "$name: $!\n";
    my $pid = fork();
    die "fork: $!\n" unless defined $pid;
    if ($pid == 0) {
        my $n = 0;
        while (my $c = $listen->accept) {
            my $hello = '';
            sysread($c, $hello, 4096);
            syswrite($c, "-ERR unknown command\r\n");
            close $c;
            Roads::write_file("$dir/$name.count", ++$n);
        }
        POSIX::_exit(0);
    }
    my $p = $listen->sockport;
    close $listen;
    push @pids, $pid;
    return $p;
}

sub cli {
    my ($p, @args) = @_;
    my $out = `redis-cli -p $p @args 2>/dev/null`;
    $calls{$p}++;
    chomp $out;
    return $out;
}

sub received {
    my ($p) = @_;
    my ($n) = cli($p, 'INFO', 'stats') =~ /total_connections_received:(\d+)/;
    $calls{$p} = 0;
    return $n // 0;
}

sub refused {
    my $n = () = Roads::slurp("$dir/redis.log")
                 =~ /Error accepting a client connection/g;
    return $n;
}

# the module's connections to a plain server: all it accepted since
# nginx started, less our redis-cli's
sub module_tries {
    my ($p) = @_;
    my ($n) = cli($p, 'INFO', 'stats') =~ /total_connections_received:(\d+)/;
    return ($n // 0) - $before{$p} - $calls{$p};
}

sub stop_all {
    Roads::stop();
    for my $pid (@pids) {
        kill 'TERM', $pid;
        waitpid($pid, 0);
    }
    @pids = ();
}

END { stop_all() }
