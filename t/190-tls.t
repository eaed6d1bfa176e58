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

our ($Dir, %Port, @Pids, $Why, $Main, $Dns);

# before BEGIN: it stops the servers even when BEGIN dies
END {
    if (defined $Main && $$ == $Main) {
        kill 'TERM', @Pids;
        waitpid($_, 0) for @Pids;
        $Dns->stop if $Dns;

    } elsif ($Dns) {
        # a child of ours: the DNS server is the main process's to stop
        delete $Dns->{pid};
    }
}

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

    # a redis-server in the foreground, ours to stop: TLS on the port it
    # returns, plain TCP on $plain (0: none) for the test's own redis-cli
    my $redis = sub {
        my ($name, $plain, @args) = @_;
        my $port = $free->();
        my $pid = fork();
        die "fork: $!" unless defined $pid;
        if ($pid == 0) {
            open STDOUT, '>>', "$Dir/$name.log";
            open STDERR, '>&', \*STDOUT;
            exec 'redis-server', @args, '--bind', '127.0.0.1',
                 '--port', $plain, '--tls-port', $port, '--save', '',
                 '--appendonly', 'no', '--dir', $Dir,
                 '--tls-cert-file', "$Dir/server.crt",
                 '--tls-key-file', "$Dir/server.key",
                 '--tls-ca-cert-file', "$Dir/ca.crt"
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

    my $wait = sub {
        my ($port, $cmd, $want) = @_;
        for (1 .. 600) {
            return 1 if `redis-cli -p $port $cmd 2>/dev/null` =~ $want;
            select(undef, undef, undef, 0.05);
        }
        return 0;
    };

    $Why //= 'redis-server has no TLS'
        unless ($Port{pw} = $redis->('pw', 0, '--tls-auth-clients', 'no',
                                     '--requirepass', 'tls-secret'))
        && ($Port{mtls} = $redis->('mtls', 0, '--tls-auth-clients', 'yes'));

    # Sentinel over TLS: a master and a sentinel, both on TLS ports (and
    # plain ones for redis-cli); with tls-replication yes the sentinel talks
    # TLS to the master and names its TLS port
    unless ($Why) {
        my $mp = $free->();
        $Port{master} = $redis->('master', $mp, '--tls-auth-clients', 'no',
                                 '--tls-replication', 'yes');
        my $sp = $free->();
        open my $fh, '>', "$Dir/sentinel.conf" or die "sentinel.conf: $!";
        print $fh "sentinel monitor tlsmaster 127.0.0.1 $Port{master} 1\n";
        close $fh;
        $Port{sentinel} = $redis->('sentinel', $sp, "$Dir/sentinel.conf",
                                   '--sentinel', '--tls-auth-clients', 'no',
                                   '--tls-replication', 'yes')
            if $Port{master};
        die "the TLS sentinel did not start or name its master in 30 s\n"
            unless $Port{sentinel}
            && $wait->($sp, 'SENTINEL get-master-addr-by-name tlsmaster',
                       qr/^$Port{master}$/m);
    }

    # Cluster over TLS: one node that owns every slot, tls-cluster yes
    unless ($Why) {
        my $cp = $free->();
        $Port{cluster} = $redis->('cluster', $cp, '--cluster-enabled', 'yes',
                                  '--cluster-port', $free->(),
                                  '--cluster-config-file',
                                  "$Dir/nodes-$cp.conf",
                                  '--tls-cluster', 'yes',
                                  '--tls-auth-clients', 'no');
        die "the TLS Cluster node did not start or take the slots\n"
            unless $Port{cluster}
            && `redis-cli -p $cp CLUSTER ADDSLOTSRANGE 0 16383` =~ /OK/
            && $wait->($cp, 'CLUSTER INFO', qr/cluster_state:ok/);
    }

    # a name for "resolve": redis.test, the server certificate's DNS name
    unless ($Why) {
        require lib;
        lib->import('t/lib');
        require TinyDNS;
        $Dns = TinyDNS->new(dir => $Dir, ttl => 1);
        $Dns->set('redis.test' => '127.0.0.1');
    }

    if ($Why) {
        require Test::More;
        Test::More::plan(skip_all => $Why);
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

sub sentinel {
    my ($options) = @_;
    return qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_scope "test:";
    idempotency_redis 127.0.0.1:$Port{sentinel} sentinel=tlsmaster tls
                      $options connect_timeout=5s timeout=5s
                      prefix=$ENV{TEST_NGINX_PREFIX};
};
}

sub cluster {
    my ($options) = @_;
    return qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_scope "test:";
    idempotency_redis 127.0.0.1:$Port{cluster} cluster tls $options
                      connect_timeout=5s timeout=5s
                      prefix=$ENV{TEST_NGINX_PREFIX};
};
}

# "resolve", the address and "tls" in the order given (a list of words)
sub resolved {
    my ($words) = @_;
    return qq{
    resolver 127.0.0.1:} . $Dns->port . qq{ valid=1s ipv6=off;
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_scope "test:";
    idempotency_redis $words
                      password=tls-secret tls_trusted_certificate=$Dir/ca.crt
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

    location = /ping {
        return 200 "pong\\n";
    }
};

# closes every client connection of a server (over TLS, with redis-cli)
sub kill_clients {
    my ($server) = @_;
    my $out = `redis-cli --tls --cacert '$Dir/ca.crt' -p $Port{$server} \\
               -a tls-secret --no-auth-warning CLIENT KILL TYPE normal 2>&1`;
    die "CLIENT KILL: $out" unless $out =~ /^\d+$/m;
}

# POSTs a warm-up key until it gets 201: the first requests after a start
# may come before a worker has asked the sentinel or the slot map
# the replay cache, whose purge listener then subscribes over TLS
our $Cache = "    idempotency_cache_zone t190:1m;\n    idempotency_cache t190;\n";

# subscribers to the purge channel at the TLS port (polled: worker 0
# subscribes once its own connection is up)
sub listeners {
    my ($port) = @_;
    my $n = 0;
    for (1 .. 200 * $IdemTest::Slow) {
        my $out = `redis-cli --tls --cacert '$Dir/ca.crt' -p $port \\
                   PUBSUB NUMSUB '$ENV{TEST_NGINX_PREFIX}purge' 2>&1`;
        (undef, $n) = split /\n/, $out;
        last if $n;
        select(undef, undef, undef, 0.05);
    }
    return $n // 0;
}

sub warm {
    my ($key) = @_;
    for (1 .. 100 * $IdemTest::Slow) {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                      PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
                                      Timeout => 10)
            or next;
        print $s "POST /t HTTP/1.0\r\nHost: localhost\r\n"
                 . "Idempotency-Key: $key\r\nContent-Length: 0\r\n\r\n";
        local $/;
        my $r = <$s> // '';
        return 1 if $r =~ m{^HTTP/1\.\d 201 };
        select(undef, undef, undef, 0.1);
    }
    return 0;
}

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



=== TEST 4: a TLS session is resumed when the connection is opened again: nginx starts
--- http_config eval: main::redis('pw', $::Pw)
--- config eval: $::Config
--- request
GET /ping
--- error_code: 200



=== TEST 5: ... Redis drops the connection (CLIENT KILL), the reconnect resumes the session
--- init
main::warm('warm-resume-1') or die "Redis is not reached over TLS\n";
main::kill_clients('pw');
main::warm('warm-resume-2') or die "Redis is not reached again over TLS\n";
--- request
GET /ping
--- error_code: 200
--- error_log eval
qr/idempotency redis: tls up, fd:\d+, resumed session/



=== TEST 6: a server certificate from another CA: the store-error answer, the reason logged
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



=== TEST 7: a certificate for another name: the store-error answer, "hostname mismatch" logged
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



=== TEST 8: tls_verify=off accepts the certificate of another CA and name
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



=== TEST 9: a server that wants a client certificate gets it
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



=== TEST 10: without a client certificate that server drops the connection: 503
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



=== TEST 11: a 3 MiB response is stored over TLS (both connections)
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



=== TEST 12: ... and replayed byte for byte
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



=== TEST 13: Sentinel over TLS: nginx starts (a request that needs no Redis)
--- http_config eval
main::sentinel("tls_trusted_certificate=$::Dir/ca.crt") . $::Cache
--- config eval: $::Config
--- request
GET /ping
--- error_code: 200



=== TEST 14: ... the sentinel names the master, over TLS both, verified: a record is claimed and stored
--- init
main::warm('warm-sentinel') or die "the master is not reached over TLS\n";
--- request
POST /t
--- more_headers
Idempotency-Key: tls-sentinel
--- error_code: 201
--- grep_error_log: EXEC POST /backend tls-sentinel
--- grep_error_log_out
EXEC POST /backend tls-sentinel



=== TEST 15: ... and its retry is replayed (the log of this nginx shows one run); the purge listener is at the master, over TLS
--- init
Test::More::is(main::listeners($::Port{master}), 1,
               'worker 0 listens for purges at the master, over TLS');
--- request
POST /t
--- more_headers
Idempotency-Key: tls-sentinel
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- grep_error_log: EXEC POST /backend tls-sentinel
--- grep_error_log_out
EXEC POST /backend tls-sentinel



=== TEST 16: Sentinel over TLS with another CA: the sentinel is not trusted, 503
--- http_config eval: main::sentinel("tls_trusted_certificate=$::Dir/other.crt")
--- config eval: $::Config
--- request
POST /t
--- more_headers
Idempotency-Key: tls-sentinel-2
--- error_code: 503
--- wait: 1
--- error_log
TLS certificate verify failed
--- no_error_log
EXEC



=== TEST 17: Cluster over TLS: nginx starts (a request that needs no Redis)
--- http_config eval
main::cluster("tls_trusted_certificate=$::Dir/ca.crt") . $::Cache
--- config eval: $::Config
--- request
GET /ping
--- error_code: 200



=== TEST 18: ... the slot map names the node's TLS port: a record is claimed and stored there
--- init
main::warm('warm-cluster') or die "the cluster is not reached over TLS\n";
--- request
POST /t
--- more_headers
Idempotency-Key: tls-cluster
--- error_code: 201
--- grep_error_log: EXEC POST /backend tls-cluster
--- grep_error_log_out
EXEC POST /backend tls-cluster



=== TEST 19: ... and its retry is replayed (the log of this nginx shows one run); the purge listener is at the node, over TLS
--- init
Test::More::is(main::listeners($::Port{cluster}), 1,
               'worker 0 listens for purges at the Cluster node, over TLS');
--- request
POST /t
--- more_headers
Idempotency-Key: tls-cluster
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- grep_error_log: EXEC POST /backend tls-cluster
--- grep_error_log_out
EXEC POST /backend tls-cluster



=== TEST 20: tls_* options without tls are refused
--- http_config
    idempotency_redis 127.0.0.1:6379 tls_verify=off;
--- config
--- must_die
--- error_log
"idempotency_redis" directive: "tls_*" options need "tls"



=== TEST 21: tls on a unix socket is refused
--- http_config
    idempotency_redis unix:/tmp/redis.sock tls;
--- config
--- must_die
--- error_log
"idempotency_redis" directive: "tls" needs a host:port, not "unix:/tmp/redis.sock"



=== TEST 22: a key without a certificate is refused
--- http_config eval
"idempotency_redis 127.0.0.1:6379 tls tls_certificate_key=$::Dir/client.key;"
--- config
--- must_die
--- error_log
"idempotency_redis" directive: "tls_certificate_key=" needs "tls_certificate="



=== TEST 23: a certificate without its key is refused
--- http_config eval
"idempotency_redis 127.0.0.1:6379 tls tls_certificate=$::Dir/client.crt;"
--- config
--- must_die
--- error_log
"idempotency_redis" directive: "tls_certificate=" needs "tls_certificate_key="



=== TEST 24: a missing CA file is named, with the directive and its place
--- http_config eval
"idempotency_redis 127.0.0.1:6379 tls tls_trusted_certificate=$::Dir/nothing.crt;"
--- config
--- must_die
--- error_log eval
qr/"idempotency_redis" directive: cannot load "tls_trusted_certificate=\Q$::Dir\E\/nothing\.crt" in \S+nginx\.conf:\d+$/



=== TEST 25: a missing client certificate is named, with the directive and its place
--- http_config eval
"idempotency_redis 127.0.0.1:6379 tls tls_certificate=$::Dir/none.crt tls_certificate_key=$::Dir/client.key;"
--- config
--- must_die
--- error_log eval
qr/"idempotency_redis" directive: cannot load "tls_certificate=\Q$::Dir\E\/none\.crt" with its "tls_certificate_key=" in \S+nginx\.conf:\d+$/



=== TEST 26: tls_verify takes on or off
--- http_config
    idempotency_redis 127.0.0.1:6379 tls tls_verify=maybe;
--- config
--- must_die
--- error_log
invalid option value "tls_verify=maybe" in "idempotency_redis" directive



=== TEST 27: the replay cache's purge listener subscribes over TLS too: nginx starts
--- http_config eval
main::redis('pw', $::Pw) . "    idempotency_cache_zone t190:1m;\n    idempotency_cache t190;\n"
--- config eval: $::Config
--- request
GET /ping
--- error_code: 200



=== TEST 28: ... worker 0 listens on the purge channel of the TLS-only server
--- init
my $n = 0;
for (1 .. 200 * $IdemTest::Slow) {
    my $out = `redis-cli --tls --cacert '$::Dir/ca.crt' -p $::Port{pw} \\
               -a tls-secret --no-auth-warning \\
               PUBSUB NUMSUB '$ENV{TEST_NGINX_PREFIX}purge' 2>&1`;
    (undef, $n) = split /\n/, $out;
    last if $n;
    select(undef, undef, undef, 0.05);
}
Test::More::is($n, 1, 'one subscriber over TLS (the server has no plain port)');
--- request
GET /ping
--- error_code: 200
--- no_error_log
[alert]



=== TEST 29: "resolve" before the address: nginx starts
--- http_config eval: main::resolved("resolve redis.test:$::Port{pw} tls")
--- config eval: $::Config
--- request
GET /ping
--- error_code: 200



=== TEST 30: ... the name sent and checked is the address's host (redis.test), not "resolve": a record is stored
--- init
main::warm('warm-resolve-1') or die "Redis is not reached over TLS by name\n";
--- request
POST /t
--- more_headers
Idempotency-Key: tls-resolve-1
--- error_code: 201
--- grep_error_log: EXEC POST /backend tls-resolve-1
--- grep_error_log_out
EXEC POST /backend tls-resolve-1
--- no_error_log
[error]
hostname mismatch



=== TEST 31: "tls" and "resolve" first, the address last: nginx starts
--- http_config eval: main::resolved("tls resolve redis.test:$::Port{pw}")
--- config eval: $::Config
--- request
GET /ping
--- error_code: 200



=== TEST 32: ... and its record is replayed over TLS by name
--- init
main::warm('warm-resolve-2') or die "Redis is not reached over TLS by name\n";
--- request
POST /t
--- more_headers
Idempotency-Key: tls-resolve-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- no_error_log
[error]
hostname mismatch
