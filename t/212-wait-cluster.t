# wait_replicas=1 on a Redis Cluster: each master's writes are
# acknowledged by a WAIT on that master's own connection.  Three masters
# with a replica each (t/lib/IdemCluster), one nginx: keys spread over the
# shards are MISS, then HIT, and every master got WAITs; with the replica
# of one master killed, the keys of that master's slots are refused (503)
# and never reach the upstream, while the other shards go on.
#
# A plain Test::More file: every process is its own, stopped by its pid.
# Run from the repository root (prove does).

use strict;
use warnings;
use Test::More;
use Digest::SHA ();
use File::Path ();
use File::Spec ();
use File::Temp ();
use POSIX ();
use Time::HiRes ();

use lib 't/lib';
use IdemTest ();
use IdemCluster;
use RedisTopology ();

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};

my $Prefix = 't212:';
my $Nginx = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';

my $cl = IdemCluster->start(3)
    or plan skip_all => "no cluster: $IdemCluster::Error";

my @replica = map { $cl->add_replica($_) } 0 .. 2;
$cl->wait_ok(20) or BAIL_OUT('the cluster with replicas is not ok');

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t212-XXXXXX',
                                                   DIR => $base));
my $port = RedisTopology::free_port();
my $nginx_pid;

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

start_nginx();

ok(wait_for(15, sub { (post('warm'))[0] == 201 }),
   'nginx claims a key on the cluster with wait_replicas=1')
    or diag(tail("$dir/nginx/logs/error.log"));

# keys on every master
my %on;     # master index => [keys]
for my $i (1 .. 300) {
    my $m = $cl->owner(IdemTest::key_slot(rkey("k$i")));
    push @{ $on{$m} }, "k$i" if defined $m && @{ $on{$m} // [] } < 3;
    last if keys %on == 3 && !grep { @{ $on{$_} } < 3 } keys %on;
}
is(scalar(keys %on), 3, 'keys found on the three masters');

my %waits0 = map { $_ => wait_calls($_) } 0 .. 2;

for my $m (sort keys %on) {
    for my $k (@{ $on{$m} }) {
        my ($s1) = post($k);
        my ($s2, $replayed) = post($k);
        ok($s1 == 201 && $s2 == 201 && $replayed,
           "master $m: $k runs, then is replayed");
    }
}

for my $m (0 .. 2) {
    cmp_ok(wait_calls($m) - $waits0{$m}, '>', 0,
           "master $m got WAITs for its own writes");
}

# the replica of master 0 dies: its shard refuses, the others go on

$cl->kill_node($replica[0]);

my (%new, %status);
for my $i (301 .. 2000) {
    my $m = $cl->owner(IdemTest::key_slot(rkey("n$i")));
    next unless defined $m && !$new{$m};
    $new{$m} = "n$i";
    last if keys %new == 3;
}

for my $m (sort keys %new) {
    ($status{$m}) = post($new{$m});
}

is($status{0}, 503, 'the key of the master without its replica is refused');
is($status{1}, 201, 'a key of another master runs');
is($status{2}, 201, 'and of the third');

my %count;
$count{$_}++ for slurp("$dir/nginx/logs/exec.log") =~ /^EXEC (\S+)$/mg;
ok(!$count{ $new{0} }, 'the refused key never reached the upstream');

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


# --- helpers -----------------------------------------------------------------

sub rkey {
    return $Prefix . Digest::SHA::sha256_hex('test:') . ":$_[0]";
}

sub wait_calls {
    my ($m) = @_;
    my ($calls) = $cl->cli($m, 'INFO', 'commandstats')
                  =~ /^cmdstat_wait:calls=(\d+)/m;
    return $calls // 0;
}

sub post {
    my ($key) = @_;
    return IdemCluster::post('/t', $key, $port);
}

sub wait_for {
    my ($seconds, $cond) = @_;
    my $until = Time::HiRes::time() + $seconds;

    while (Time::HiRes::time() < $until) {
        return 1 if $cond->();
        Time::HiRes::sleep(0.1);
    }

    return 0;
}

sub start_nginx {
    my $prefix = "$dir/nginx";
    File::Path::make_path("$prefix/conf", "$prefix/logs");

    my $seeds = $cl->seeds;

    RedisTopology::write_file("$prefix/conf/nginx.conf", <<CONF);
load_module $ENV{TEST_NGINX_LOAD_MODULES};
daemon off;
master_process on;
worker_processes 1;
error_log logs/error.log info;
pid logs/nginx.pid;

events {
    worker_connections 256;
}

http {
    access_log off;
    log_format exec 'EXEC \$http_idempotency_key';
    idempotency_scope "test:\$http_authorization";

    server {
        listen 127.0.0.1:$port;

        location = /t {
            idempotency on;
            idempotency_redis $seeds cluster prefix=$Prefix
                              wait_replicas=1 wait_timeout=300ms;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /backend {
            access_log logs/exec.log exec;
            return 201 "ran \$request_id\\n";
        }
    }
}
CONF

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

sub stop_all {
    if ($nginx_pid) {
        kill 'QUIT', $nginx_pid;

        for (1 .. 100) {
            last if waitpid($nginx_pid, POSIX::WNOHANG()) != 0;
            Time::HiRes::sleep(0.05);
            kill 'KILL', $nginx_pid if $_ == 100;
        }

        waitpid($nginx_pid, 0);
        undef $nginx_pid;
    }

    $cl->stop if $cl;
}

sub slurp {
    my ($path) = @_;
    open my $fh, '<', $path or return '';
    local $/;
    return <$fh>;
}

sub tail {
    my ($path) = @_;
    my @l = split /\n/, slurp($path);
    splice @l, 0, -30 if @l > 30;
    return join("\n", @l) . "\n";
}
