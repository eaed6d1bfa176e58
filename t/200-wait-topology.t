# Waiting duplicates woken by a notification behind a Redis Cluster,
# behind Sentinel, and at a server over TLS whose name the workers resolve
# ("tls resolve"): two nginx nodes share each Redis; the first request of a
# key runs on node 1, its duplicate waits on node 2 with its fallback poll
# a minute away and gets the replay, woken by the notification (node 2's
# counter).  In a Cluster the record (and its mark) live on one master
# while node 2 listens on whichever node its connection is at: PUBLISH
# reaches every node.  Behind Sentinel node 2 listens at the master; over
# TLS its listener speaks TLS to the address the name resolves to.
#
# A plain Test::More file with its own Cluster, Sentinel set-up and two
# nginx, on free loopback ports, stopped by pid; the test is the upstream
# of the first requests (t/lib/WaitNotify.pm).  Run from the repository
# root (prove does).

use strict;
use warnings;
use Test::More;
use Digest::SHA ();
use File::Path ();
use File::Spec ();
use File::Temp ();

use lib 't/lib';
use IdemCluster ();
use IdemTest ();
use RedisTopology;
use Roads ();
use TinyDNS;
use WaitNotify;

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'redis-server and redis-cli are needed'
    unless `sh -c 'command -v redis-server && command -v redis-cli'`
           =~ /redis-cli/;

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t200-XXXXXX',
                                                   DIR => $base));
chmod 0755, $dir;

my ($topo, $cl, $dns, $tls_pid, %tls);
my %prefix = (sentinel => "t200s-$$:", cluster => "t200c-$$:",
              tls => "t200t-$$:");
my @port = (IdemTest::free_port(), IdemTest::free_port());
my $backend = backend();
my $bport = $backend->sockport;

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

$topo = RedisTopology->new(dir => $dir);
unless ($topo->start) {
    my $why = $topo->error;
    stop_all();
    plan skip_all => "no Sentinel topology: $why";
}

$cl = IdemCluster->start(3);
unless ($cl) {
    stop_all();
    plan skip_all => "no Redis Cluster: $IdemCluster::Error";
}

$dns = TinyDNS->new(dir => $dir, ttl => 1);
$dns->set('redis.test' => '127.0.0.1');

# a redis-server over TLS (a plain port too, for redis-cli), certificates
# of a CA of ours for the name redis.test
my @locs = qw(sentinel cluster);
if (tls_redis()) {
    push @locs, 'tls';
} else {
    diag('no TLS case: openssl or a redis-server with TLS is missing');
}

Roads::start_nginx("$dir/n$_", $port[$_], http_conf($_), 1) for 0, 1;

# the data servers of each Redis (plain ports): where a mark or a
# subscription may be
my %servers = (
    sentinel => sub { $topo->{master_port} },
    cluster  => sub { map { $cl->port($_) } 0 .. 2 },
    tls      => sub { $tls{plain} },
);

for my $loc (@locs) {
    for my $n (0, 1) {
        ok(Roads::wait_for(30, sub { warm($n, $loc) }),
           "$loc: node " . ($n + 1) . ' works');
    }
    ok(Roads::wait_for(20, sub { listeners($loc) >= 2 }),
       "$loc: both nodes listen on \"<prefix>done\"");
}

my $notified = 0;

for my $loc (@locs) {
    my $key = "$loc-$$";
    my $first = new_conn($port[0]);
    my $dup = new_conn($port[1]);

    send_post($first, "/$loc", $key);
    my $up = upstream_request($backend);
    ok($up, "$loc: the first request reached the upstream");

    send_post($dup, "/$loc", $key);
    ok(Roads::wait_for(10, sub { marked($loc, $key) }),
       "$loc: its duplicate waits on node 2");

    answer($up);

    my ($status, undef, $body) = read_response($first, 10);
    is("$status $body", "201 done\n", "$loc: the first request is answered");

    # within 10 s: the duplicate's fallback poll is a minute away
    my $head;
    ($status, $head, $body) = read_response($dup, 10);
    is("$status $body", "201 done\n", "$loc: the duplicate gets the response");
    like($head, qr/^Idempotent-Replayed: true\r?$/mi, "$loc: as a replay");

    $notified++;
    is(waits($port[1]), "notified $notified, polled 0",
       "$loc: the duplicate was woken by the notification");
}

for my $n (0, 1) {
    unlike(Roads::slurp("$dir/n$n/nginx/logs/error.log"),
           qr/\[(?:alert|crit|emerg)\]/,
           'node ' . ($n + 1) . ': no alert in the error log');
}

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


# --- helpers -------------------------------------------------------------

sub mark {
    my ($loc, $key) = @_;
    my $p = $prefix{$loc};
    return "$p\{$p" . Digest::SHA::sha256_hex('test') . ":$key}:wait";
}

# the mark of $key is on one of the Redis' data servers
sub marked {
    my ($loc, $key) = @_;
    for my $p ($servers{$loc}->()) {
        return 1 if RedisTopology::run_cli($p, undef, 'EXISTS',
                                           mark($loc, $key)) eq '1';
    }
    return 0;
}

# subscribers to "<prefix>done" on the Redis' data servers
sub listeners {
    my ($loc) = @_;
    my $n = 0;
    for my $p ($servers{$loc}->()) {
        my (undef, $c) = split /\n/, RedisTopology::run_cli($p, undef,
                                     'PUBSUB', 'NUMSUB', "$prefix{$loc}done");
        $n += $c // 0;
    }
    return $n;
}

# a request through node $n's /warm-$loc (its upstream answers at once)
sub warm {
    my ($n, $loc) = @_;
    my $s = new_conn($port[$n]);
    send_post($s, "/warm-$loc", 'warm-' . int(rand(1e9)));
    my ($status) = read_response($s, 5);
    return $status == 201;
}

sub tls_redis {
    my $ssl = sub { system("openssl @_ >>'$dir/openssl.log' 2>&1") == 0 };
    my $ec = '-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';
    Roads::write_file("$dir/san.ext",
                      "subjectAltName=DNS:redis.test,IP:127.0.0.1\n");
    return 0 unless $ssl->("req -x509 $ec -keyout $dir/ca.key"
                           . " -out $dir/ca.crt -days 2 -subj /CN=t200-ca")
        && $ssl->("req $ec -keyout $dir/server.key -out $dir/server.csr"
                  . " -subj /CN=redis.test")
        && $ssl->("x509 -req -in $dir/server.csr -CA $dir/ca.crt"
                  . " -CAkey $dir/ca.key -CAcreateserial -days 2"
                  . " -extfile $dir/san.ext -out $dir/server.crt");
    chmod 0644, glob("$dir/*.crt"), glob("$dir/*.key");

    $tls{plain} = IdemTest::free_port();
    $tls{port} = IdemTest::free_port();
    $tls_pid = Roads::spawn(sub {
        open STDOUT, '>>', "$dir/tls-redis.log";
        open STDERR, '>&', \*STDOUT;
        exec 'redis-server', '--bind', '127.0.0.1', '--port', $tls{plain},
             '--tls-port', $tls{port}, '--save', '', '--appendonly', 'no',
             '--dir', $dir, '--tls-cert-file', "$dir/server.crt",
             '--tls-key-file', "$dir/server.key",
             '--tls-ca-cert-file', "$dir/ca.crt", '--tls-auth-clients', 'no';
    });
    return Roads::wait_for(10, sub { Roads::port_open($tls{port}) });
}

sub http_conf {
    my ($n) = @_;

    my %redis = (
        sentinel => join(' ', map { "127.0.0.1:$_" }
                              @{ $topo->{sentinel_ports} })
                    . ' sentinel=mymaster',
        cluster  => "127.0.0.1:@{[ $cl->port(0) ]} cluster",
    );
    $redis{tls} = "redis.test:$tls{port} tls resolve"
                  . " tls_trusted_certificate=$dir/ca.crt" if $tls{port};

    my $locations = '';

    for my $loc (sort keys %redis) {
        my $redis = "idempotency_redis $redis{$loc} prefix=$prefix{$loc} "
                    . 'timeout=500ms connect_timeout=300ms;';
        $locations .= <<LOC;
        location = /$loc {
            idempotency on;
            $redis
            idempotency_wait 120s poll=60s;
            proxy_read_timeout 120s;
            proxy_pass http://127.0.0.1:$bport;
        }

        location = /warm-$loc {
            idempotency on;
            $redis
            idempotency_wait 120s poll=60s;
            proxy_pass http://127.0.0.1:$port[$n]/backend;
        }

LOC
    }

    return <<HTTP;
    resolver 127.0.0.1:@{[ $dns->port ]} valid=1s ipv6=off;
    resolver_timeout 2s;
    idempotency_scope test;

    server {
        listen 127.0.0.1:$port[$n];

        location = /status {
            idempotency_status;
        }

$locations
        location = /backend {
            return 201 "warm\\n";
        }
    }
HTTP
}

sub stop_all {
    if ($tls_pid) {
        kill 'TERM', $tls_pid;
        Roads::wait_pid($tls_pid, 10);
        undef $tls_pid;
    }
    Roads::stop();
    $topo->stop if $topo;
    $cl->stop if $cl;
    $dns->stop if $dns;
    undef $topo;
    undef $cl;
    undef $dns;
}

END {
    my $status = $?;
    stop_all();
    $? = $status;
}
