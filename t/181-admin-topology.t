# idempotency_admin behind Redis Sentinel and Redis Cluster: GET and DELETE
# go where the module's own commands go, the master the sentinels name and
# the master that owns the key's slot, with no key name built by hand.
#
# A plain Test::More file: it starts a Sentinel topology
# (t/lib/RedisTopology.pm), then a 3-master cluster (t/lib/IdemCluster.pm),
# each with its own nginx (2 workers) on free 127.0.0.1 ports, and stops
# every one by pid.  Each part is skipped when its topology cannot start.
# Run from the repository root (prove does).

use strict;
use warnings;
use Test::More;
use Digest::SHA ();
use File::Path ();
use File::Spec ();
use File::Temp ();
use IO::Socket::INET ();
use POSIX ();
use Time::HiRes ();

use lib 't/lib';
use RedisTopology;
use IdemCluster;

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'redis-server and redis-cli are needed'
    unless `sh -c 'command -v redis-server && command -v redis-cli'`
           =~ /redis-cli/;

my $Prefix = 't181:';
my $Nginx = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';
my $Slow = $ENV{TEST_NGINX_USE_VALGRIND} ? 6 : 1;

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t181-XXXXXX',
                                                   DIR => $base,
                                                   CLEANUP => 1));

my ($nginx_pid, $port, $topo, $cluster);

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };


# --- Sentinel ---------------------------------------------------------------

SKIP: {
    $topo = RedisTopology->new(dir => $dir, name => 'mymaster');

    unless ($topo->start) {
        my $why = $topo->error;
        $topo->stop;
        undef $topo;
        skip "no Sentinel topology: $why", 7;
    }

    my $s = join ' ', map { "127.0.0.1:$_" } @{ $topo->{sentinel_ports} };
    start_nginx('sentinel', "$s sentinel=mymaster");

    ok(wait_for(15, sub { post('s-1', 'Bearer s')->{status} == 201 }),
       'Sentinel: nginx reaches the master')
        or diag(tail("$dir/sentinel/logs/error.log"));

    my $rkey = rkey('s-1', 'Bearer s');
    is($topo->cli($topo->{master_port}, 'EXISTS', $rkey), '1',
       'Sentinel: the record is on the master');

    my $r = admin('GET', 's-1', 'Bearer s');
    is($r->{status}, 200, 'Sentinel: GET finds it');
    like($r->{body}, qr/"state": "done",\n  "status": 201,/,
         '  done, with the stored status');

    $r = admin('DELETE', 's-1', 'Bearer s');
    is($r->{status}, 204, 'Sentinel: DELETE removes it');
    is($topo->cli($topo->{master_port}, 'EXISTS', $rkey), '0',
       '  from the master');
    is(admin('GET', 's-1', 'Bearer s')->{status}, 404,
       'Sentinel: GET then answers 404');

    stop_nginx();
    $topo->stop;
    undef $topo;
}


# --- Cluster ----------------------------------------------------------------

SKIP: {
    skip 'no redis-server 6.0 or newer', 15
        if `redis-server --version 2>/dev/null` !~ /v=(\d+)\./ || $1 < 6;

    $cluster = IdemCluster->start(3);
    skip "no Redis Cluster: $IdemCluster::Error", 15 unless $cluster;

    start_nginx('cluster', $cluster->seeds . ' cluster');

    ok(wait_for(15, sub { post('c-warm', 'Bearer c')->{status} == 201 }),
       'Cluster: nginx reaches the cluster')
        or diag(tail("$dir/cluster/logs/error.log"));

    # keys until every master owns one
    my (%owner, %key_of);
    for my $n (1 .. 200) {
        my $key = "c-$n";
        my $slot = $cluster->cli(0, 'CLUSTER', 'KEYSLOT', rkey($key, 'Bearer c'));
        my $i = $cluster->owner($slot);
        next if !defined $i || exists $key_of{$i};
        $key_of{$i} = $key;
        $owner{$key} = $i;
        last if keys %key_of == $cluster->n;
    }
    is(scalar(keys %key_of), $cluster->n, 'Cluster: a key for each master');

    for my $key (sort keys %owner) {
        post($key, 'Bearer c');
    }

    my $all = 1;
    for my $key (sort keys %owner) {
        my $r = admin('GET', $key, 'Bearer c');
        $all &&= $r->{status} == 200 && $r->{body} =~ /"state": "done"/;
    }
    ok($all, 'Cluster: GET finds the record on every master');

    my $hash = Digest::SHA::sha256_hex('Bearer c');
    my ($key) = sort keys %owner;
    my $r = admin('GET', $key, undef, $hash);
    is($r->{status}, 200, 'Cluster: and by scope_hash');

    for my $key (sort keys %owner) {
        my $i = $owner{$key};
        my $rk = rkey($key, 'Bearer c');
        is($cluster->cli($i, 'EXISTS', $rk), '1',
           "Cluster: $key is on master $i");
        my $d = admin('DELETE', $key, 'Bearer c');
        ok($d->{status} == 204 && $cluster->cli($i, 'EXISTS', $rk) eq '0',
           "  DELETE removes it there");
    }

    is(admin('DELETE', $key, 'Bearer c')->{status}, 404,
       'Cluster: a second DELETE answers 404');

    # a split record: its chunks are in its slot, and go with it
    my $big = (sort keys %owner)[-1];
    my $i = $owner{$big};
    my $chunks = sub {
        scalar grep { /:body:/ } split /\n/,
            $cluster->cli($i, 'KEYS', "$Prefix*:$big*");
    };
    is(request("POST /big HTTP/1.1\r\nHost: localhost\r\n"
               . "Idempotency-Key: $big\r\nAuthorization: Bearer c\r\n"
               . "Content-Length: 1\r\nConnection: close\r\n\r\nx")
           ->{status}, 200, 'Cluster: a 2 MB response runs');
    ok(wait_for(10, sub { $chunks->() == 2 }),
       "  stored split: two chunks on master $i, beside its head");
    is(admin('DELETE', $big, 'Bearer c')->{status}, 204, '  DELETE');
    is($chunks->(), 0, '  no chunk of its body is left');

    stop_nginx();
    $cluster->stop;
    undef $cluster;
}

done_testing();


sub rkey {
    my ($key, $scope) = @_;
    return $Prefix . Digest::SHA::sha256_hex($scope) . ":$key";
}

sub request {
    my ($req) = @_;

    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Timeout => 5)
        or return { status => 0, head => '', body => '' };

    print $s $req;

    my $resp = '';
    eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm(10 * $Slow);
        local $/;
        $resp = <$s> // '';
        alarm(0);
    };
    alarm(0);

    my ($head, $body) = split /\r\n\r\n/, $resp, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.\d (\d+)};

    return { status => $status // 0, head => $head // '',
             body => $body // '' };
}

sub post {
    my ($key, $auth) = @_;

    return request("POST /t HTTP/1.1\r\nHost: localhost\r\n"
                   . "Idempotency-Key: $key\r\nAuthorization: $auth\r\n"
                   . "Content-Length: 1\r\nConnection: close\r\n\r\nx");
}

sub admin {
    my ($method, $key, $scope, $hash) = @_;

    my $args = "key=$key&"
               . (defined $hash ? "scope_hash=$hash"
                                : 'scope=' . ($scope =~ s/ /%20/gr));

    return request("$method /admin?$args HTTP/1.1\r\nHost: localhost\r\n"
                   . "Connection: close\r\n\r\n");
}

sub wait_for {
    my ($seconds, $cond) = @_;
    my $until = Time::HiRes::time() + $seconds * $Slow;

    while (Time::HiRes::time() < $until) {
        return 1 if $cond->();
        Time::HiRes::sleep(0.1);
    }

    return 0;
}

sub start_nginx {
    my ($name, $redis) = @_;

    my $prefix = "$dir/$name";
    File::Path::make_path("$prefix/conf", "$prefix/logs");
    $port = RedisTopology::free_port();

    RedisTopology::write_file("$prefix/conf/nginx.conf", <<CONF);
load_module $ENV{TEST_NGINX_LOAD_MODULES};
daemon off;
master_process on;
worker_processes 2;
error_log logs/error.log info;
pid logs/nginx.pid;

events {
    worker_connections 256;
}

http {
    access_log off;

    idempotency_redis $redis timeout=2s prefix=$Prefix;

    server {
        listen 127.0.0.1:$port;

        location = /admin {
            idempotency_admin;
            allow 127.0.0.1;
            deny all;
        }

        location = /t {
            idempotency on;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /backend {
            return 201 "ran\\n";
        }

        # a 2 MB response: a split record, its body in two chunks
        location = /big {
            idempotency on;
            idempotency_max_response_size 4m;
            proxy_method GET;
            proxy_pass http://127.0.0.1:$port/big.bin;
        }

        location = /big.bin {
            root $prefix;
        }
    }
}
CONF
    RedisTopology::write_file("$prefix/big.bin", 'b' x 2_000_000);
    # the workers (nobody, under root) read it
    chmod 0755, $dir, $prefix;
    chmod 0644, "$prefix/big.bin";

    $nginx_pid = fork();
    die "fork: $!" unless defined $nginx_pid;

    if ($nginx_pid == 0) {
        open STDERR, '>>', "$prefix/logs/stderr.log";
        exec $Nginx, '-p', "$prefix/", '-c', 'conf/nginx.conf'
            or POSIX::_exit(127);
    }

    wait_for(10, sub { RedisTopology::port_open($port) })
        or BAIL_OUT('nginx did not start: ' . tail("$prefix/logs/stderr.log")
                    . tail("$prefix/logs/error.log"));
}

sub stop_nginx {
    return unless $nginx_pid;

    kill 'QUIT', $nginx_pid;

    for (1 .. 100) {
        last if waitpid($nginx_pid, POSIX::WNOHANG()) != 0;
        Time::HiRes::sleep(0.05);
        kill 'KILL', $nginx_pid if $_ == 100;
    }

    waitpid($nginx_pid, 0);
    undef $nginx_pid;
}

sub stop_all {
    stop_nginx();
    $topo->stop if $topo;
    $cluster->stop if $cluster;
}

sub slurp {
    my ($path) = @_;
    open my $fh, '<', $path or return '';
    local $/;
    return <$fh>;
}

sub tail {
    my @l = split /\n/, slurp($_[0]);
    return join("\n", @l[($#l > 30 ? $#l - 30 : 0) .. $#l]) . "\n";
}

END {
    my $status = $?;
    stop_all();
    $? = $status;
}
