# A worker that dies while it holds the replay cache's lock does not wedge
# the others: gdb stops the only worker inside the zone's lock (at the
# entry lookup of a replay, the zone marked as being changed) and kills it
# there; nginx frees the lock, and the next worker finds the zone marked,
# logs it, starts it empty and goes on: the key is replayed from Redis,
# then from the zone again, and a new key runs.
#
# A plain Test::More file with its own nginx (one worker) in front of the
# Redis of make test; skipped without gdb and under valgrind (gdb cannot
# attach to a worker there).  Run from the repository root (prove does).

use strict;
use warnings;
use Test::More;
use File::Path ();
use File::Spec ();
use File::Temp ();
use POSIX ();

use lib 't/lib';
use IdemTest ();
use Roads ();

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'not under valgrind (gdb cannot attach to a worker there)'
    if $ENV{TEST_NGINX_USE_VALGRIND};
plan skip_all => 'gdb is needed'
    unless `sh -c 'command -v gdb'` =~ /gdb/;

my $Redis = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
my $Prefix = "t194-$$-" . time() . ':';

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t194-XXXXXX',
                                                   DIR => $base));
chmod 0755, $dir;

my ($nginx_pid, $gdb_pid);
my $port = IdemTest::free_port();

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

$nginx_pid = Roads::start_nginx($dir, $port, http_conf(), 1);

is(post('k1'), '201 MISS MISS', 'a new key runs');
# the entry serves once Redis has acknowledged the store
ok(wait_for(10, sub { post('k1') eq '201 HIT HIT' }),
   'its retry is replayed from the zone');

my $worker = worker();
ok($worker, "the worker runs (pid $worker)");

# gdb stops the worker where a replay has taken the zone's lock and
# marked the zone, then kills it there
my $gdb_out = "$dir/gdb.out";
$gdb_pid = fork();
die "fork: $!\n" unless defined $gdb_pid;

if ($gdb_pid == 0) {
    open STDOUT, '>', $gdb_out or POSIX::_exit(127);
    open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
    exec 'gdb', '-nx', '-batch', '-p', $worker,
         '-ex', 'set pagination off',
         '-ex', 'break ngx_http_idempotency_cache_find',
         '-ex', 'continue',
         '-ex', 'frame function ngx_http_idempotency_cache_get',
         '-ex', 'print sh->dirty',
         '-ex', 'kill'
        or POSIX::_exit(127);
}

# the worker is stopped from the attach until "continue": a request sent
# once the breakpoint is set waits in the listen queue if need be
ok(wait_for(60, sub { slurp($gdb_out) =~ /^Breakpoint 1 at /m }),
   'gdb set a breakpoint in the zone\'s lookup')
    or diag(slurp($gdb_out));

# the replay that stops there: its connection dies with the worker
my $lost = post('k1');
waitpid($gdb_pid, 0);
undef $gdb_pid;

like(slurp($gdb_out), qr/Breakpoint 1, .*ngx_http_idempotency_cache_find/s,
     'the worker stopped inside the zone\'s lock');
like(slurp($gdb_out), qr/^\$1 = 1$/m, 'with the zone marked as being changed')
    or diag(slurp($gdb_out));
ok(!kill(0, $worker), 'and died there');

my $next;
ok(wait_for(20, sub { $next = worker(); $next && $next != $worker }),
   'nginx started another worker');

is(post('k1'), '201 HIT MISS',
   'the key is replayed, from Redis: the zone started empty');
# the replay from Redis enters the zone a round trip later
ok(wait_for(10, sub { post('k1') eq '201 HIT HIT' }),
   'then from the zone again');
is(post('k2'), '201 MISS MISS', 'a new key runs');

my $log = slurp("$dir/nginx/logs/error.log");
like($log, qr/\[warn\] .*idempotency cache: a worker died while changing zone "crash", its entries are dropped/,
     'the dropped entries are logged, naming the zone');
like($log, qr/worker process $worker exited on signal 9/,
     'nginx saw the worker die');

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


# --- helpers -------------------------------------------------------------

# the worker's pid: the master's only child
sub worker {
    my $out = `ps -o pid= --ppid $nginx_pid 2>/dev/null`;
    my @pids = $out =~ /(\d+)/g;
    return @pids == 1 ? $pids[0] : 0;
}

# POST with a key: "status idempotency-status cache"
sub post {
    my ($key) = @_;

    # the replay that gdb stops waits until the worker is killed
    my $resp = IdemTest::exchange($port,
                                  "POST /t HTTP/1.1\r\nHost: localhost\r\n"
                                  . "Idempotency-Key: $key\r\n"
                                  . "Content-Length: 1\r\n"
                                  . "Connection: close\r\n\r\nx", 60);

    my ($status) = $resp =~ m{^HTTP/1\.\d (\d+)};
    my ($idem) = $resp =~ /^X-Idempotency-Status: (\S+)/mi;
    my ($cache) = $resp =~ /^X-Idempotency-Cache: (\S+)/mi;

    return join ' ', $status // 0, $idem // 'none', $cache // 'none';
}

sub wait_for { Roads::wait_for(@_) }

# one protected location with the zone "crash", its upstream in the same
# server
sub http_conf {
    return <<HTTP;
    idempotency_redis 127.0.0.1:$Redis prefix=$Prefix timeout=5s
                      connect_timeout=5s;
    idempotency_scope "test:";
    idempotency_cache_zone crash:1m;

    server {
        listen 127.0.0.1:$port;

        location = /t {
            idempotency on;
            idempotency_cache crash;
            add_header X-Idempotency-Status \$idempotency_status always;
            add_header X-Idempotency-Cache \$idempotency_cache always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /backend {
            return 201 "ran \$request_id\\n";
        }
    }
HTTP
}

sub stop_all {
    if ($gdb_pid) {
        kill 'KILL', $gdb_pid;
        waitpid($gdb_pid, 0);
        undef $gdb_pid;
    }

    Roads::stop();
    undef $nginx_pid;
}

sub slurp { Roads::slurp(@_) }

END {
    my $status = $?;
    stop_all();
    $? = $status;
}
