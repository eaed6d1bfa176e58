# wait_replicas=1 across a master's death: no key runs twice.  A master, a
# replica that lags 200 ms behind it (its replication link goes through a
# t/lib/DelayProxy that holds the master's stream) and three sentinels
# (down-after 500 ms).  Lanes of clients claim new keys, three clients
# per key that retry until each has its answer, on two locations behind
# the same sentinels: /w with wait_replicas=1, /p without.  The master is
# SIGKILLed while they run; once the replica is promoted, the old master
# comes back empty and the sentinels make it the new master's replica, so
# that /w can be acknowledged again and its keys finish.  The upstream
# logs one EXEC line per execution: /w has no key twice, /p has some (the
# writes the replica had not received died with the master: the gap that
# wait_replicas= closes; without the kill neither location has any).
#
# A plain Test::More file: every process is its own, stopped by its pid.
# Run from the repository root (prove does).

use strict;
use warnings;
use Test::More;
use File::Path ();
use File::Spec ();
use File::Temp ();
use IO::Socket::INET ();
use POSIX ();
use Time::HiRes ();

use lib 't/lib';
use RedisTopology;

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'not under valgrind (the failover choreography)'
    if $ENV{TEST_NGINX_USE_VALGRIND};
plan skip_all => 'redis-server and redis-cli are needed'
    unless `sh -c 'command -v redis-server && command -v redis-cli'`
           =~ /redis-cli/;

my $Prefix = 't211:';
my $Name = 'mymaster';
my $Nginx = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';
# lanes per location, each one key after another (a /w key takes two
# acknowledgements, 2 x 200 ms: more lanes keep as many keys in flight)
my %Lanes = (w => 8, p => 4);
my $Lag = 0.2;          # seconds the replica lags behind

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t211-XXXXXX',
                                                   DIR => $base));

my $topo = RedisTopology->new(dir => $dir, name => $Name, down_after => 500,
                              replica_delay => $Lag);
unless ($topo->start) {
    my $why = $topo->error;
    $topo->stop;
    File::Path::remove_tree($dir);
    plan skip_all => "no Sentinel topology: $why";
}

my $nginx_pid;
my @lanes;
my $port = RedisTopology::free_port();
my $exec_log = "$dir/nginx/logs/exec.log";

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

start_nginx();

ok(wait_for(15, sub { post('/w', 'warm-w') == 201
                      && post('/p', 'warm-p') == 201 }),
   'both locations run claims through the sentinels')
    or diag(tail("$dir/nginx/logs/error.log"));

my $master = $topo->{master_port};
my $replica = $topo->{replica_port};

# lanes of retrying clients on both locations, new keys until $stop_new

my $t0 = Time::HiRes::time();
my $stop_new = "$dir/stop-new";

for my $loc ('w', 'p') {
    for my $lane (1 .. $Lanes{$loc}) {
        push @lanes, lane($loc, $lane);
    }
}

Time::HiRes::sleep(2.5);

$topo->kill_server($master);
my $killed = Time::HiRes::time() - $t0;

# keys claimed in the last moments before the kill are what counts
Time::HiRes::sleep(0.5);
RedisTopology::write_file($stop_new, '');

ok(wait_for(20, sub { ($topo->master_port // '') eq $replica }),
   'the sentinels promote the replica')
    or diag($topo->sentinel('SENTINEL', 'master', $Name));

# the old master comes back empty: the sentinels make it a replica
$topo->spawn($master, "$dir/$master.conf")
    or BAIL_OUT('the old master did not start again');

ok(wait_for(20, sub {
       $topo->cli($master, 'INFO', 'replication')
           =~ /role:slave.*master_link_status:up/s }),
   'the old master is the new master\'s replica');

# every lane ends: each key's three clients got their answer (or 30 s)
for my $pid (@lanes) {
    waitpid($pid, 0);
}
@lanes = ();

my %count;
$count{$_}++ for slurp($exec_log) =~ /^EXEC (\S+)$/mg;

for my $loc ('w', 'p') {
    my @keys = map { /^(\S+) (\d) (\d+)$/ ? [$1, $2, $3] : () }
               map { split /\n/, slurp("$dir/lane-$loc-$_") }
               1 .. $Lanes{$loc};
    my @twice = grep { ($count{$_->[0]} // 0) > 1 } @keys;
    my @open = grep { !$_->[1] } @keys;
    my $refused = 0;
    $refused += $_->[2] for @keys;

    diag(sprintf('/%s: %d keys, %d ran twice, %d not answered, %d answers '
                 . '503; master killed after %.1f s', $loc, scalar @keys,
                 scalar @twice, scalar @open, $refused, $killed));

    cmp_ok(scalar @keys, '>=', 10, "/$loc: keys were claimed");

    if ($loc eq 'w') {
        is(scalar @twice, 0, '/w (wait_replicas=1): no key ran twice')
            or diag(join ' ', map { $_->[0] } @twice);
        is(scalar @open, 0, '/w: every client got its answer');
        ok(!grep({ !$count{$_->[0]} } @keys), '/w: every key ran');

    } else {
        cmp_ok(scalar @twice, '>', 0, '/p (no wait_replicas): some keys '
               . 'ran twice, lost with the master (the test can fail)');
    }
}

like(slurp("$dir/nginx/logs/error.log"),
     qr/WAIT: 0 of 1 replicas acknowledged/,
     'while the new master had no replica, /w refused its claims');

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


# --- helpers -----------------------------------------------------------------

# A lane: new keys "<loc>-<lane>-<i>" one after another until $stop_new
# exists, each sent by three clients at once, each client sending again
# (50 ms apart) until it has a 2xx answer; "<key> <1: all answered> <503s>"
# in lane-<loc>-<lane>.
sub lane {
    my ($loc, $lane) = @_;

    my $pid = fork();
    die "fork: $!" unless defined $pid;
    return $pid if $pid;

    open my $out, '>', "$dir/lane-$loc-$lane" or POSIX::_exit(1);
    $out->autoflush(1);

    for (my $i = 1; !-e $stop_new; $i++) {
        my $key = "$loc-$lane-$i";
        my $until = Time::HiRes::time() + 30;
        my @todo = (1, 2, 3);
        my $refused = 0;

        while (@todo && Time::HiRes::time() < $until) {
            my %s;
            for my $c (@todo) {
                $s{$c} = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                               PeerPort => $port,
                                               Timeout => 5);
                next unless $s{$c};
                print { $s{$c} } "POST /$loc HTTP/1.1\r\nHost: localhost\r\n"
                    . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
                    . "Connection: close\r\n\r\nx";
            }

            my @status = map { [$_, answered($s{$_})] } @todo;
            $refused += grep { $_->[1] == 503 } @status;
            @todo = map { $_->[0] } grep { $_->[1] !~ /^2/ } @status;
            Time::HiRes::sleep(0.05) if @todo;
        }

        print $out "$key " . (@todo ? 0 : 1) . " $refused\n";
    }

    close $out;
    POSIX::_exit(0);
}

# the status of the answer, 0 without one
sub answered {
    my ($s) = @_;
    return 0 unless $s;

    my $resp = '';
    eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm(10);
        local $/;
        $resp = readline($s) // '';
        alarm(0);
    };
    alarm(0);

    return $resp =~ m{^HTTP/1\.\d (\d+)} ? $1 : 0;
}

sub post {
    my ($loc, $key) = @_;

    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Timeout => 5)
        or return 0;
    print $s "POST $loc HTTP/1.1\r\nHost: localhost\r\n"
             . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
             . "Connection: close\r\n\r\nx";
    local $/;
    my $resp = readline($s) // '';
    my ($status) = $resp =~ m{^HTTP/1\.\d (\d+)};
    return $status // 0;
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

    my $s = join ' ', map { "127.0.0.1:$_" } @{ $topo->{sentinel_ports} };

    RedisTopology::write_file("$prefix/conf/nginx.conf", <<CONF);
load_module $ENV{TEST_NGINX_LOAD_MODULES};
daemon off;
master_process on;
worker_processes 2;
error_log logs/error.log info;
pid logs/nginx.pid;

events {
    worker_connections 512;
}

http {
    access_log off;
    log_format exec 'EXEC \$http_idempotency_key';
    idempotency_scope "test:\$http_authorization";

    server {
        listen 127.0.0.1:$port;

        location = /w {
            idempotency on;
            idempotency_redis $s sentinel=$Name prefix=$Prefix
                              timeout=500ms connect_timeout=300ms
                              wait_replicas=1 wait_timeout=2s;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /p {
            idempotency on;
            idempotency_redis $s sentinel=$Name prefix=$Prefix
                              timeout=500ms connect_timeout=300ms;
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
    kill 'TERM', $_ for @lanes;
    waitpid($_, 0) for @lanes;
    @lanes = ();

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

    $topo->stop if $topo;
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
