# wait_replicas=, wait_aof, wait_timeout= (idempotency_redis): a claim and
# a stored record count only once a replica acknowledged them.  A master,
# a replica and three sentinels (t/lib/RedisTopology), one nginx with two
# workers and four locations: behind Sentinel, a single server (the
# master's address), the same by a name the workers resolve (resolve,
# t/lib/TinyDNS) and wait_aof.  Claims with the replica up are MISS,
# HIT (a replay sends no WAIT), and one WAIT acknowledges many of them
# (group commit); a store the replica does not acknowledge (SIGSTOP) is
# sent again until it does; with the replica stopped a claim is refused
# (503) and never reaches the upstream;
# wait_aof with the AOF off (and, on Redis 7.2 or newer, on); the eviction
# policy warned about and shown.  nginx -t refuses bad option values.
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
use IdemTest ();
use RedisTopology;
use DelayProxy ();
use TinyDNS;

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'redis-server and redis-cli are needed'
    unless `sh -c 'command -v redis-server && command -v redis-cli'`
           =~ /redis-cli/;

my $Prefix = 't210:';
my $Name = 'mymaster';
my $Nginx = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t210-XXXXXX',
                                                   DIR => $base));

my $nginx_pid;
my $topo;
my $port = RedisTopology::free_port();
my $exec_log = "$dir/nginx/logs/exec.log";

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };


# --- nginx -t: the options' values -----------------------------------------

for my $case (['wait_replicas=0', qr/invalid option value "wait_replicas=0"/],
              ['wait_replicas=x', qr/invalid option value "wait_replicas=x"/],
              ['wait_replicas=17',
               qr/invalid option value "wait_replicas=17"/],
              ['wait_replicas=1 wait_timeout=0',
               qr/invalid option value "wait_timeout=0"/],
              ['wait_timeout=1s',
               qr/"wait_timeout=" needs "wait_replicas=" or "wait_aof"/])
{
    my ($opts, $re) = @$case;
    my $out = nginx_t("idempotency_redis 127.0.0.1:6379 $opts;");
    like($out, $re, "nginx -t refuses $opts");
}

like(nginx_t('idempotency_redis 127.0.0.1:6379 wait_replicas=2 wait_aof '
             . 'wait_timeout=250ms;'),
     qr/test is successful/, 'nginx -t takes wait_replicas=2 wait_aof '
     . 'wait_timeout=250ms');


# --- the topology ------------------------------------------------------------

$topo = RedisTopology->new(dir => $dir, name => $Name);
unless ($topo->start) {
    my $why = $topo->error;
    $topo->stop;
    File::Path::remove_tree($dir);
    done_testing();
    exit 0 if $why =~ /Sentinel/;
    BAIL_OUT("no topology: $why");
}

my $master = $topo->{master_port};
my $replica = $topo->{replica_port};

# the master by a name the workers resolve (resolve)
my $dns = TinyDNS->new(dir => $dir, ttl => 1);
$dns->set('redis.test' => '127.0.0.1');

# the upstream 1 s away (/slow)
my ($slow_pid, $slow) = DelayProxy::start($port, 1);

# a policy that may evict keys with a TTL (maxmemory 0: none is evicted)
$topo->cli($master, 'CONFIG', 'SET', 'maxmemory-policy', 'volatile-lru');

start_nginx();

ok(wait_for(15, sub { post('/s', 'warm-s')->{status} == 201 }),
   'behind Sentinel with wait_replicas=1: a claim runs')
    or diag(tail("$dir/nginx/logs/error.log"));
ok(wait_for(10, sub { post('/d', 'warm-d')->{status} == 201 }),
   'a single server with wait_replicas=1: a claim runs')
    or diag(tail("$dir/nginx/logs/error.log"));
ok(wait_for(10, sub { post('/r', 'warm-r')->{status} == 201 }),
   'a name resolved by the workers (resolve) with wait_replicas=1: a '
   . 'claim runs')
    or diag(tail("$dir/nginx/logs/error.log"));


# --- the replica up: MISS, HIT, WAIT sent ---------------------------------

for my $loc ('/s', '/d', '/r') {
    my $r1 = post($loc, "k$loc");
    is($r1->{idem}, 'MISS', "$loc: a new key runs (MISS)");
    my $r2 = post($loc, "k$loc");
    is($r2->{idem}, 'HIT', "$loc: its retry is replayed (HIT)");
    is($r2->{body}, $r1->{body}, "$loc: with the same body");
    ok(record_on($replica, "k$loc"), "$loc: the record is on the replica");
}

my $waits0 = wait_calls();
cmp_ok($waits0, '>', 0, 'WAIT was sent to the master');

# 60 claims at once: one WAIT covers a batch of them
my $n = 60;
my %res = %{ concurrent('/s', 'many', $n) };
is(scalar(grep { $_ == 201 } values %res), $n, "$n concurrent claims run");
my $waits = wait_calls() - $waits0;
my $c = exec_counts();
is(scalar(grep { /^many-/ && $c->{$_} == 1 } keys %$c), $n,
   'each once at the upstream');
# each request writes twice (claim, store): one WAIT per write would be
# 2 * $n; one per batch, sent while the one before is on its way, is far
# fewer (13 on an idle machine), and fewer still under load
cmp_ok($waits, '<', $n,
       "fewer WAITs ($waits) than the $n claims alone, with their $n stores "
       . '(group commit)');

# a replay wrote nothing: no WAIT for it
my $before = wait_calls();
my $hits = grep { post('/s', "many-$_")->{idem} eq 'HIT' } 1 .. 20;
is($hits, 20, 'the keys are replayed (HIT)');
is(wait_calls() - $before, 0, 'and the replays sent no WAIT');

my $st = status();
like($st, qr/"waits": [1-9]/, 'status: waits counted');
like($st, qr/"waited": [1-9]/, 'status: writes that waited counted');
like($st, qr/"redis_wait_ms": \{"buckets": .*"count": [1-9]/,
     'status: the wait-time histogram');
like($st, qr/"maxmemory_policy": "volatile-lru"/,
     'status: the eviction policy of the connection');
like(slurp("$dir/nginx/logs/error.log"),
     qr/has maxmemory-policy volatile-lru: under memory pressure it may evict/,
     'the eviction policy is warned about at the handshake');


# --- a store the replica does not acknowledge is sent again -----------------

# the upstream answers 1 s late (a delaying proxy in front of it): the
# claim is acknowledged, then the replica stops before the store
my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                 Timeout => 10);
print $sock "POST /slow HTTP/1.1\r\nHost: localhost\r\n"
    . "Idempotency-Key: resend-1\r\nContent-Length: 1\r\n"
    . "Connection: close\r\n\r\nx";
ok(wait_for(5, sub { record_on($replica, 'resend-1') }),
   'a slow request\'s claim reaches the replica');
kill 'STOP', $topo->{pids}{$replica};
ok(wait_for(10, sub { status() =~ /"store_resent": [1-9]/ }),
   'its store, not acknowledged, is sent again (store_resent)');
kill 'CONT', $topo->{pids}{$replica};
my $resp = '';
{
    local $/;
    local $SIG{ALRM} = sub { die "timeout\n" };
    alarm(15);
    $resp = eval { readline($sock) } // '';
    alarm(0);
}
like($resp, qr{^HTTP/1\.1 201}, 'the client got its answer');
ok(wait_for(10, sub { post('/slow', 'resend-1')->{idem} eq 'HIT' }),
   'once the replica is back the record is stored: a retry is replayed');
ok(wait_for(5, sub {
       $topo->cli($replica, 'GET', record_key('resend-1')) =~ /^idem1 done /
   }), 'and the replica has it complete');
is(exec_counts()->{'resend-1'}, 1, 'the operation ran once');


# --- the replica down: claims refused, nothing runs -------------------------

$topo->kill_server($replica);

for my $loc ('/s', '/d', '/r') {
    my $r = post($loc, "down$loc");
    is($r->{status}, 503, "$loc: with the replica down a claim is refused "
       . '(503)');
}

$c = exec_counts();
ok(!$c->{'down/s'} && !$c->{'down/d'} && !$c->{'down/r'},
   'and the refused claims never reached the upstream');

$st = status();
like($st, qr/"claim_refused": [1-9]/, 'status: claims refused counted');
like(slurp("$dir/nginx/logs/error.log"),
     qr/WAIT: 0 of 1 replicas acknowledged the writes within wait_timeout/,
     'the short acknowledgement is logged');
ok(wait_for(5, sub { !record_on($master, 'down/s') }),
   'the refused claim is released on the master');

my $r = post('/open', 'down-open');
is($r->{status}, 201, 'idempotency_on_store_error open: passed through');


# --- wait_aof ------------------------------------------------------------------

like(post('/aof', 'aof-off')->{status}, qr/^503$/,
     'wait_aof without AOF (or WAITAOF): refused (503)');
ok(!exec_counts()->{'aof-off'}, 'and not run');
like(slurp("$dir/nginx/logs/error.log"),
     qr/wait_aof cannot be used.*(?:no WAITAOF|AOF is off)/,
     'a clear error-log line at the handshake');

SKIP: {
    skip 'WAITAOF needs Redis 7.2 or newer', 2
        if IdemTest::redis_older(7, 2);

    $topo->cli($master, 'CONFIG', 'SET', 'appendonly', 'yes');
    ok(wait_for(15, sub { post('/aof', 'aof-on')->{status} == 201 }),
       'wait_aof with appendonly yes: a claim runs')
        or diag(tail("$dir/nginx/logs/error.log"));
    is(exec_counts()->{'aof-on'}, 1, 'once');
}

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


# --- helpers -----------------------------------------------------------------

sub nginx_t {
    my ($directive) = @_;
    my $p = "$dir/t-" . int(rand(1e9));
    File::Path::make_path("$p/conf", "$p/logs");
    RedisTopology::write_file("$p/conf/nginx.conf", <<CONF);
load_module $ENV{TEST_NGINX_LOAD_MODULES};
error_log logs/error.log;
pid logs/nginx.pid;
events {}
http {
    $directive
    server {
        listen 127.0.0.1:$port;
        location / { idempotency on; return 200; }
    }
}
CONF
    return scalar `$Nginx -t -p $p/ -c conf/nginx.conf 2>&1`;
}

sub wait_calls {
    my $info = $topo->cli($topo->master_port, 'INFO', 'commandstats');
    my ($calls) = $info =~ /^cmdstat_wait:calls=(\d+)/m;
    return $calls // 0;
}

sub exec_counts {
    my %n;
    $n{$_}++ for slurp($exec_log) =~ /^EXEC (\S+)$/mg;
    return \%n;
}

sub record_key {
    my ($key) = @_;
    return $topo->cli($master, '--scan', '--pattern', "$Prefix*:$key");
}

sub record_on {
    my ($mport, $key) = @_;
    return $topo->cli($mport, '--scan', '--pattern', "$Prefix*:$key") ne '';
}

sub status {
    return IdemTest::exchange($port, "GET /status HTTP/1.0\r\n\r\n");
}

sub post {
    my ($loc, $key) = @_;

    my $resp = IdemTest::exchange($port,
                 "POST $loc HTTP/1.1\r\nHost: localhost\r\n"
                 . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
                 . "Connection: close\r\n\r\nx", 10);

    my ($head, $body) = split /\r\n\r\n/, $resp, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.\d (\d+)};
    my ($idem) = ($head // '') =~ /^X-Idempotency-Status: (\S+)/mi;

    return { status => $status // 0, idem => $idem // '', body => $body // '' };
}

# $n requests with keys "$prefix-1" ... sent at once: key => status
sub concurrent {
    my ($loc, $prefix, $count) = @_;
    my (%sock, %out);

    for my $i (1 .. $count) {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                      PeerPort => $port, Timeout => 10)
            or next;
        $sock{"$prefix-$i"} = $s;
    }

    for my $k (keys %sock) {
        print { $sock{$k} } "POST $loc HTTP/1.1\r\nHost: localhost\r\n"
            . "Idempotency-Key: $k\r\nContent-Length: 1\r\n"
            . "Connection: close\r\n\r\nx";
    }

    for my $k (keys %sock) {
        my $resp = '';
        eval {
            local $SIG{ALRM} = sub { die "timeout\n" };
            alarm(10);
            local $/;
            $resp = readline($sock{$k}) // '';
            alarm(0);
        };
        alarm(0);
        ($out{$k}) = $resp =~ m{^HTTP/1\.\d (\d+)};
        $out{$k} //= 0;
    }

    return \%out;
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

        location = /s {
            idempotency on;
            idempotency_redis $s sentinel=$Name prefix=$Prefix
                              timeout=1s connect_timeout=300ms
                              wait_replicas=1 wait_timeout=300ms;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /d {
            idempotency on;
            idempotency_redis 127.0.0.1:$master prefix=$Prefix
                              wait_replicas=1 wait_timeout=300ms;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /r {
            idempotency on;
            resolver 127.0.0.1:@{[ $dns->port ]} valid=1s;
            idempotency_redis redis.test:$master resolve prefix=$Prefix
                              wait_replicas=1 wait_timeout=300ms;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /open {
            idempotency on;
            idempotency_on_store_error open;
            idempotency_redis 127.0.0.1:$master prefix=$Prefix
                              wait_replicas=1 wait_timeout=300ms;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /aof {
            idempotency on;
            idempotency_redis 127.0.0.1:$master prefix=$Prefix wait_aof;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /slow {
            idempotency on;
            idempotency_redis $s sentinel=$Name prefix=$Prefix
                              timeout=1s connect_timeout=300ms
                              wait_replicas=1 wait_timeout=300ms;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$slow/backend;
        }

        location = /backend {
            access_log logs/exec.log exec;
            return 201 "ran \$request_id\\n";
        }

        location = /status {
            idempotency_status;
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

    $topo->stop if $topo;
    $dns->stop if $dns;
    DelayProxy::stop($slow_pid) if $slow_pid;
    undef $slow_pid;
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
