# TLS to Redis ("tls" and the "tls_*" options of idempotency_redis): a
# record is claimed, stored and replayed over TLS (with a password, with a
# client certificate, large records through the second connection too);
# a certificate from another CA, or for another name, fails like any
# store error (503, closed) with OpenSSL's reason in the error log, never
# falls back to plaintext; tls_verify=off accepts it.
#
# The file makes its own certificates with openssl (a CA, a server
# certificate for DNS:redis.test and IP:127.0.0.1, a client certificate,
# and a second CA) and starts its own TLS-only redis-servers on free
# loopback ports (stopped by pid in END): one with requirepass, one that
# requires a client certificate.  Skipped when openssl is missing or
# redis-server has no TLS.

our ($Dir, %Port, @Pids, $Why, $Main);

BEGIN {
    use File::Spec ();
    use File::Temp ();
    use IO::Socket::INET ();
    use POSIX ();

    $Main = $$;

    my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
    $Dir = File::Spec->rel2abs(File::Temp::tempdir('t190-XXXXXX',
                                                   DIR => $base,
                                                   CLEANUP => 1));
    chmod 0755, $Dir;    # read by nginx workers that may not be root

    my $ssl = sub {
        system("openssl @_ >>'$Dir/openssl.log' 2>&1") == 0
    };
    my $ec = '-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';
    my $ext = "$Dir/san.ext";
    open my $fh, '>', $ext or die "$ext: $!";
    print $fh "subjectAltName=DNS:redis.test,IP:127.0.0.1\n";
    close $fh;

    $Why = 'openssl could not make the certificates'
        unless $ssl->("req -x509 $ec -keyout $Dir/ca.key -out $Dir/ca.crt"
                      . " -days 2 -subj /CN=t190-ca")
        && $ssl->("req -x509 $ec -keyout $Dir/other.key -out $Dir/other.crt"
                  . " -days 2 -subj /CN=t190-other-ca")
        && $ssl->("req $ec -keyout $Dir/server.key -out $Dir/server.csr"
                  . " -subj /CN=redis.test")
        && $ssl->("x509 -req -in $Dir/server.csr -CA $Dir/ca.crt"
                  . " -CAkey $Dir/ca.key -CAcreateserial -days 2"
                  . " -extfile $ext -out $Dir/server.crt")
        && $ssl->("req $ec -keyout $Dir/client.key -out $Dir/client.csr"
                  . " -subj /CN=t190-client")
        && $ssl->("x509 -req -in $Dir/client.csr -CA $Dir/ca.crt"
                  . " -CAkey $Dir/ca.key -CAcreateserial -days 2"
                  . " -out $Dir/client.crt");
    chmod 0644, glob("$Dir/*");

    my $free = sub {
        my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1',
                                      LocalPort => 0, Proto => 'tcp')
            or die "port: $!\n";
        my $p = $s->sockport;
        close $s;
        return $p;
    };

    # a TLS-only redis-server in the foreground, ours to stop
    my $redis = sub {
        my ($name, @args) = @_;
        my $port = $free->();
        my $pid = fork();
        die "fork: $!" unless defined $pid;
        if ($pid == 0) {
            open STDOUT, '>>', "$Dir/$name.log";
            open STDERR, '>&', \*STDOUT;
            exec 'redis-server', '--bind', '127.0.0.1', '--port', '0',
                 '--tls-port', $port, '--save', '', '--appendonly', 'no',
                 '--dir', $Dir, '--tls-cert-file', "$Dir/server.crt",
                 '--tls-key-file', "$Dir/server.key",
                 '--tls-ca-cert-file', "$Dir/ca.crt", @args
                or POSIX::_exit(127);
        }
        push @Pids, $pid;
        for (1 .. 200) {
            return $port
                if IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                         PeerPort => $port);
            return 0 if waitpid($pid, POSIX::WNOHANG()) == $pid;
            select(undef, undef, undef, 0.05);
        }
        return 0;
    };

    $Why //= 'redis-server has no TLS'
        unless ($Port{pw} = $redis->('pw', '--tls-auth-clients', 'no',
                                     '--requirepass', 'tls-secret'))
        && ($Port{mtls} = $redis->('mtls', '--tls-auth-clients', 'yes'));

    if ($Why) {
        require Test::More;
        Test::More::plan(skip_all => $Why);
    }
}

END {
    if (defined $Main && $$ == $Main) {
        kill 'TERM', @Pids;
        waitpid($_, 0) for @Pids;
    }
}

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;

$ENV{TEST_NGINX_PREFIX} ||= "t190-$$-" . time() . ":";

# 3 MiB, not a multiple of 16 KiB: several record chunks and TLS records
our $Big = join '', map { chr(($_ * 7 + 3) % 256) } 0 .. 3 * 1024 * 1024 + 99;
{
    open my $fh, '>:raw', "$Dir/big.bin" or die "$Dir/big.bin: $!";
    print $fh $Big;
    close $fh;
}

sub redis {
    my ($server, $options) = @_;
    return qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_scope "test:";
    idempotency_redis 127.0.0.1:$Port{$server} tls $options
                      connect_timeout=5s timeout=5s
                      prefix=$ENV{TEST_NGINX_PREFIX};
};
}

our $Pw = "password=tls-secret tls_trusted_certificate=$Dir/ca.crt";
our $Mtls = "tls_trusted_certificate=$Dir/ca.crt"
            . " tls_certificate=$Dir/client.crt"
            . " tls_certificate_key=$Dir/client.key";

our $Config = qq{
    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /big {
        idempotency on;
        idempotency_max_response_size 10m;
        proxy_buffering off;
        proxy_method GET;
        proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/files/big.bin;
    }

    location /files/ {
        access_log logs/error.log exec;
        sendfile off;
        alias $Dir/;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\\n";
    }
};

master_on();
no_shuffle();
run_tests();

__DATA__

=== TEST 1: over TLS with a password, verified against the CA and 127.0.0.1
--- http_config eval: main::redis('pw', $::Pw)
--- config eval: $::Config
--- request
POST /t
--- more_headers
Idempotency-Key: tls-1
--- error_code: 201
--- response_body
created
--- grep_error_log: EXEC POST /backend tls-1
--- grep_error_log_out
EXEC POST /backend tls-1
--- no_error_log
[error]



=== TEST 2: its retry is replayed from the record stored over TLS
--- http_config eval: main::redis('pw', $::Pw)
--- config eval: $::Config
--- request
POST /t
--- more_headers
Idempotency-Key: tls-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
created
--- no_error_log
EXEC
[error]



=== TEST 3: tls_server_name=redis.test is sent and checked (DNS name in the certificate)
--- http_config eval: main::redis('pw', "$::Pw tls_server_name=redis.test")
--- config eval: $::Config
--- request
POST /t
--- more_headers
Idempotency-Key: tls-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- no_error_log
[error]



=== TEST 4: a server certificate from another CA: the store-error answer, the reason logged
--- http_config eval: main::redis('pw', "password=tls-secret tls_trusted_certificate=$::Dir/other.crt")
--- config eval: $::Config
--- request
POST /t
--- more_headers
Idempotency-Key: tls-4
--- error_code: 503
--- error_log eval
qr/connect failed: TLS certificate verify failed: \((19|20|21)\) [a-z]/
--- no_error_log
EXEC



=== TEST 5: a certificate for another name: the store-error answer, "hostname mismatch" logged
--- http_config eval: main::redis('pw', "$::Pw tls_server_name=other.test")
--- config eval: $::Config
--- request
POST /t
--- more_headers
Idempotency-Key: tls-5
--- error_code: 503
--- error_log eval
qr/connect failed: TLS certificate verify failed: \(62\) hostname mismatch/
--- no_error_log
EXEC



=== TEST 6: tls_verify=off accepts the certificate of another CA and name
--- http_config eval: main::redis('pw', "password=tls-secret tls_trusted_certificate=$::Dir/other.crt tls_server_name=other.test tls_verify=off")
--- config eval: $::Config
--- request
POST /t
--- more_headers
Idempotency-Key: tls-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- no_error_log
[error]



=== TEST 7: a server that wants a client certificate gets it
--- http_config eval: main::redis('mtls', $::Mtls)
--- config eval: $::Config
--- request
POST /t
--- more_headers
Idempotency-Key: tls-7
--- error_code: 201
--- grep_error_log: EXEC POST /backend tls-7
--- grep_error_log_out
EXEC POST /backend tls-7
--- no_error_log
[error]



=== TEST 8: without a client certificate that server drops the connection: 503
--- http_config eval: main::redis('mtls', "tls_trusted_certificate=$::Dir/ca.crt")
--- config eval: $::Config
--- request
POST /t
--- more_headers
Idempotency-Key: tls-8
--- error_code: 503
--- error_log eval
qr/connection lost: (TLS read failed|TLS write failed|Server closed the connection)/
--- no_error_log
EXEC



=== TEST 9: a 3 MiB response is stored over TLS (both connections)
--- http_config eval: main::redis('mtls', $::Mtls)
--- config eval: $::Config
--- request
POST /big
--- more_headers
Idempotency-Key: tls-big
--- error_code: 200
--- response_body eval: $::Big
--- grep_error_log: EXEC GET /files/big.bin
--- grep_error_log_out
EXEC GET /files/big.bin
--- no_error_log
[error]



=== TEST 10: ... and replayed byte for byte
--- http_config eval: main::redis('mtls', $::Mtls)
--- config eval: $::Config
--- request
POST /big
--- more_headers
Idempotency-Key: tls-big
--- error_code: 200
--- response_headers
Idempotent-Replayed: true
--- response_body eval: $::Big
--- no_error_log
EXEC
[error]



=== TEST 11: tls_* options without tls are refused
--- http_config
    idempotency_redis 127.0.0.1:6379 tls_verify=off;
--- config
--- must_die
--- error_log
"idempotency_redis" directive: "tls_*" options need "tls"



=== TEST 12: tls on a unix socket is refused
--- http_config
    idempotency_redis unix:/tmp/redis.sock tls;
--- config
--- must_die
--- error_log
"idempotency_redis" directive: "tls" needs a host:port, not "unix:/tmp/redis.sock"



=== TEST 13: a key without a certificate is refused
--- http_config eval
"idempotency_redis 127.0.0.1:6379 tls tls_certificate_key=$::Dir/client.key;"
--- config
--- must_die
--- error_log
"idempotency_redis" directive: "tls_certificate_key=" needs "tls_certificate="



=== TEST 14: a certificate without its key is refused
--- http_config eval
"idempotency_redis 127.0.0.1:6379 tls tls_certificate=$::Dir/client.crt;"
--- config
--- must_die
--- error_log
"idempotency_redis" directive: "tls_certificate=" needs "tls_certificate_key="



=== TEST 15: a missing CA file is named
--- http_config eval
"idempotency_redis 127.0.0.1:6379 tls tls_trusted_certificate=$::Dir/nothing.crt;"
--- config
--- must_die
--- error_log eval
qr/\Q$::Dir\E\/nothing\.crt/



=== TEST 16: a missing client certificate is named
--- http_config eval
"idempotency_redis 127.0.0.1:6379 tls tls_certificate=$::Dir/none.crt tls_certificate_key=$::Dir/client.key;"
--- config
--- must_die
--- error_log eval
qr/\Q$::Dir\E\/none\.crt/



=== TEST 17: tls_verify takes on or off
--- http_config
    idempotency_redis 127.0.0.1:6379 tls tls_verify=maybe;
--- config
--- must_die
--- error_log
invalid option value "tls_verify=maybe" in "idempotency_redis" directive
