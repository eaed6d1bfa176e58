# A primary named by DNS ("resolve"), and failover without Sentinel: the
# workers resolve the name with nginx's resolver (a test DNS server,
# t/lib/TinyDNS.pm, TTL 1 s) on every connect and when the answer's
# validity ends; READONLY, LOADING or MASTERDOWN drops the connection and
# the next one resolves again.  Two redis-servers on 127.0.0.2 and
# 127.0.0.3 (same port) swap roles: service comes back without a reload
# once the name moves, a key stored before the move is replayed (its
# record replicated) and no key runs twice.  Also: a name that does not
# resolve at start, nginx -t without a resolver, READONLY on a plain IP,
# and a Redis Cluster announcing host names (with redis-server 7).
#
# A plain Test::More file with its own redis-servers, DNS server and nginx
# on free ports, all stopped by pid.  Run from the repository root.

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
use TinyDNS;

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'redis-server and redis-cli are needed'
    unless `sh -c 'command -v redis-server && command -v redis-cli'`
           =~ /redis-cli/;

my $Prefix = 't190:';
my $Nginx = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';
my $Slow = $ENV{TEST_NGINX_USE_VALGRIND} ? 6 : 1;
my ($A, $B) = ('127.0.0.2', '127.0.0.3');

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t190-XXXXXX',
                                                   DIR => $base));
chmod 0755, $dir;

my (%redis, $nginx_pid);
my $rport = IdemTest::free_port_on($A, $B);
my $port = IdemTest::free_port();

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

my $dns = TinyDNS->new(dir => $dir, ttl => 1);
$dns->set('redis.test' => $A);

for my $ip ($A, $B) {
    $redis{$ip} = IdemTest::start_redis_on($ip, $rport, $dir) or do {
        stop_all();
        plan skip_all => "redis-server on $ip:$rport did not start";
    };
}

# a Cluster whose nodes announce host names n0.test, n1.test, n2.test
my $cl = cluster_with_names();

# B replicates A: what is stored on A is on B when they swap
is(cli($B, 'REPLICAOF', $A, $rport), 'OK', 'B replicates A');
ok(wait_for(20, sub { cli($B, 'ROLE') =~ /\nconnected\n/ }),
   'B is in sync with A');

write_conf('nginx.conf', "resolver 127.0.0.1:" . $dns->port
                         . " valid=1s ipv6=off;\n"
                         . "    resolver_timeout 2s;");


# --- nginx -t -------------------------------------------------------------

my $out = nginx_t('nginx.conf');
like($out, qr/test is successful/,
     'nginx -t passes with "resolve" and a name that does not resolve yet');

write_conf('noresolver.conf', '');
$out = nginx_t('noresolver.conf');
my $place = qr/ in \Q$dir\E\/nginx\/conf\/noresolver\.conf:\d+$/m;
like($out, qr/"idempotency_redis" directive with "resolve" needs a "resolver".*$place/,
     'nginx -t fails without a resolver, naming idempotency_redis and its '
     . 'place');
unlike($out, qr/test is successful/, 'and the test is not successful');

# nginx 1.30 also writes nginx -t's [emerg] to the error log: start afresh
truncate "$dir/nginx/logs/error.log", 0;

start_nginx();


# --- (a) the name resolves to A --------------------------------------------

ok(wait_for(20, sub { post('/t', 'warm-up')->{status} == 201 }),
   'requests work through the name (A)')
    or diag(tail("$dir/nginx/logs/error.log"));

my $r1 = post('/t', 'before-1');
is($r1->{idem}, 'MISS', 'a new key runs');
ok(record_on($A, 'before-1'), 'its record is on A');
is(post('/t', 'before-1')->{idem}, 'HIT', 'its retry is replayed');


# --- (c) a name that does not resolve at start ------------------------------

my $late = post('/late', 'late-1');
is($late->{status}, 503, 'a name not resolved yet: the store-error answer');

$dns->set('late.test' => $A);
ok(wait_for(30, sub { post('/late', 'late-2')->{status} == 201 }),
   'once the name resolves, service starts (no reload)')
    or diag(tail("$dir/nginx/logs/error.log"));

like(slurp("$dir/nginx/logs/error.log"),
     qr/"late\.test:$rport": "late\.test" could not be resolved \(Host not found\)/,
     'the failed resolution was logged with the resolver\'s reason');
like(slurp("$dir/nginx/logs/error.log"),
     qr/"late\.test:$rport" connect failed: "late\.test" could not be resolved/,
     'and the connect that could not be made');


# --- (b) the roles swap: A a replica of B ------------------------------------

ok(wait_for(20, sub {
       cli($A, 'WAIT', 1, 1000) eq '1' && record_on($B, 'before-1')
   }), 'the record of before-1 is replicated to B');

is(cli($B, 'REPLICAOF', 'NO', 'ONE'), 'OK', 'B becomes a master');
is(cli($A, 'REPLICAOF', $B, $rport), 'OK', 'A becomes a replica of B');

ok(wait_for(20, sub { post('/t', 'ro-1')->{status} == 503 }),
   'the name still on A: a claim is refused (READONLY)');

ok(log_has(qr/"redis\.test:$rport" command failed: the master became a replica \(READONLY\)/),
   'READONLY is logged with the node name, the connection dropped')
    or diag(tail("$dir/nginx/logs/error.log"));

$dns->set('redis.test' => $B);

ok(wait_for(30, sub { post('/t', 'after-1')->{status} == 201 }),
   'the name moved to B: service comes back without a reload')
    or diag(tail("$dir/nginx/logs/error.log"));
ok(record_on($B, 'after-1'), 'the new key is stored on B');

# two workers, each with its own connection: one may still be on A
# (READONLY to the claim, 503) until its answer's validity ends too
my $r2;
ok(wait_for(30, sub { $r2 = post('/t', 'before-1'); $r2->{status} != 503 }),
   'every worker moved to B');
is($r2->{idem}, 'HIT', 'the key stored before the move is replayed');
is($r2->{body}, $r1->{body}, 'with the same body');
is(execs('before-1'), 1, 'and it ran once');
is(execs('ro-1'), 0, 'the refused claim never ran');

ok(log_has(qr/"redis\.test:$rport": "redis\.test" (?:resolved to|no longer resolves to 127\.0\.0\.2, reconnecting to) 127\.0\.0\.3/),
   'the new address is logged');


# --- validity: the name moves while the connection works --------------------

# A becomes a master again, with its own data: the name moves back to it
is(cli($A, 'REPLICAOF', 'NO', 'ONE'), 'OK', 'A is a master again');
$dns->set('redis.test' => $A);

ok(wait_for(30, sub {
       my $key = 'move-' . int(rand(1e9));
       post('/t', $key)->{status} == 201 && record_on($A, $key)
   }), 'a working connection follows the name when its validity ends')
    or diag(tail("$dir/nginx/logs/error.log"));

ok(log_has(qr/"redis\.test" no longer resolves to 127\.0\.0\.3, reconnecting to 127\.0\.0\.2/),
   'the move is logged (the validity of the answer ended, 1 s)');


# --- (f) a Cluster that announces host names --------------------------------

SKIP: {
    skip 'no Redis Cluster with host names (redis-server 7 is needed): '
         . $IdemCluster::Error, 4 unless $cl;

    ok(wait_for(30, sub { post('/cluster', 'c-warm')->{status} == 201 }),
       'Cluster nodes announced by host name are resolved ("resolve")')
        or diag(tail("$dir/nginx/logs/error.log"));

    my @bad = grep { post('/cluster', "c-$_")->{status} != 201 } 1 .. 12;
    is("@bad", '', 'keys of every master are claimed');

    ok(log_has(qr/"n[0-2]\.test:\d+": "n[0-2]\.test" resolved to 127\.0\.0\.1/),
       'the resolved node names are logged');

    post('/cluster-ip', 'c-ip');
    ok(log_has(qr/node "n[0-2]\.test:\d+" is not an IP address, ignored/),
       'without "resolve" such nodes are ignored, as before');
}


# --- (e) READONLY on a plain IP (no "resolve") -----------------------------

ok(wait_for(20, sub { post('/plain', 'plain-1')->{status} == 201 }),
   'the plain address (B) works');

is(cli($B, 'REPLICAOF', $A, $rport), 'OK', 'B becomes a replica');
ok(wait_for(20, sub { post('/plain', 'plain-ro')->{status} == 503 }),
   'claims on B are refused');

is(cli($B, 'REPLICAOF', 'NO', 'ONE'), 'OK', 'B is a master again');
ok(wait_for(30, sub { post('/plain', 'plain-2')->{status} == 201 }),
   'the same address recovers once it takes writes again')
    or diag(tail("$dir/nginx/logs/error.log"));
is(execs('plain-2'), 1, 'the key ran once');

ok(log_has(qr/"$B:$rport" command failed: the master became a replica \(READONLY\)/),
   'READONLY on the plain address is logged');
my $log = slurp("$dir/nginx/logs/error.log");
unlike($log, qr/\[(?:alert|crit|emerg)\]/, 'no alert in the error log');
ok(kill(0, $nginx_pid), 'the same nginx ran throughout (no reload)');

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


# --- helpers -------------------------------------------------------------

sub cli {
    my ($ip, @args) = @_;
    my $out = `redis-cli -h $ip -p $rport @args 2>/dev/null`;
    chomp $out;
    return $out;
}

sub record_on {
    my ($ip, $key) = @_;
    return cli($ip, '--scan', '--pattern', "'$Prefix*:$key'") ne '';
}

sub execs {
    my ($key) = @_;
    my $n = () = slurp("$dir/nginx/logs/exec.log") =~ /^EXEC \Q$key\E$/mg;
    return $n;
}

sub post {
    my ($uri, $key) = @_;

    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Timeout => 5 * $Slow)
        or return { status => 0, idem => '', body => '' };

    print $s "POST $uri HTTP/1.1\r\nHost: localhost\r\n"
             . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
             . "Connection: close\r\n\r\nx";

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
    my ($idem) = ($head // '') =~ /^X-Idempotency-Status: (\S+)/mi;

    return { status => $status // 0, idem => $idem // '', body => $body // '' };
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

# IdemCluster's 3 masters, each announcing n<i>.test (served by our DNS)
sub cluster_with_names {
    return undef unless `redis-server --version` =~ /v=([0-9]+)/ && $1 >= 7;

    require IdemCluster;
    my $c = IdemCluster->start(3) or return undef;

    for my $i (0 .. 2) {
        $dns->set("n$i.test" => '127.0.0.1');
        $c->cli($i, 'CONFIG', 'SET', 'cluster-announce-hostname',
                "n$i.test");
        $c->cli($i, 'CONFIG', 'SET', 'cluster-preferred-endpoint-type',
                'hostname');
    }

    # the names spread by gossip: every node's map names all three
    my $named = wait_for(30, sub {
        !grep {
            my $slots = $c->cli($_, 'CLUSTER', 'SLOTS');
            grep { $slots !~ /\bn$_\.test\b/ } 0 .. 2
        } 0 .. 2
    });

    unless ($named) {
        $IdemCluster::Error = 'the nodes did not announce their names';
        $c->stop;
        return undef;
    }

    return $c;
}

# the error log has a line matching $re (polled: another worker may be later)
sub log_has {
    my ($re) = @_;
    return wait_for(20, sub { slurp("$dir/nginx/logs/error.log") =~ $re });
}

sub write_conf {
    my ($file, $resolver) = @_;
    my $prefix = "$dir/nginx";
    File::Path::make_path("$prefix/conf", "$prefix/logs");

    my $cluster_locations = !$cl ? '' : <<LOC;
        location = /cluster {
            idempotency on;
            idempotency_redis 127.0.0.1:@{[ $cl->port(0) ]} cluster resolve
                              timeout=500ms connect_timeout=300ms
                              prefix=t190c:;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /cluster-ip {
            idempotency on;
            idempotency_redis 127.0.0.1:@{[ $cl->port(0) ]} cluster
                              timeout=500ms connect_timeout=300ms
                              prefix=t190d:;
            proxy_pass http://127.0.0.1:$port/backend;
        }

LOC

    open my $fh, '>', "$prefix/conf/$file" or die "$file: $!\n";
    print $fh <<CONF;
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
    log_format exec 'EXEC \$http_idempotency_key';
    $resolver

    idempotency_scope "test:\$http_authorization";

    server {
        listen 127.0.0.1:$port;

        location = /t {
            idempotency on;
            idempotency_redis redis.test:$rport resolve timeout=500ms
                              connect_timeout=300ms prefix=$Prefix;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /late {
            idempotency on;
            idempotency_redis late.test:$rport resolve timeout=500ms
                              connect_timeout=300ms prefix=$Prefix;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /plain {
            idempotency on;
            idempotency_redis $B:$rport timeout=500ms
                              connect_timeout=300ms prefix=$Prefix;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$port/backend;
        }

$cluster_locations
        location = /backend {
            access_log logs/exec.log exec;
            return 201 "ran \$request_id\\n";
        }
    }
}
CONF
    close $fh;
}

sub nginx_t {
    my ($file) = @_;
    my $prefix = "$dir/nginx";
    return `$Nginx -t -p $prefix/ -c conf/$file 2>&1`;
}

sub start_nginx {
    my $prefix = "$dir/nginx";

    my @cmd = ($Nginx, '-p', "$prefix/", '-c', 'conf/nginx.conf');
    if ($ENV{TEST_NGINX_USE_VALGRIND}) {
        my @vg = ('valgrind', '-q', '--tool=memcheck', '--leak-check=full',
                  '--keep-debuginfo=yes', '--show-possibly-lost=no',
                  '--gen-suppressions=all', '--num-callers=100',
                  '--trace-children=no');
        push @vg, '--suppressions=valgrind.suppress' if -f 'valgrind.suppress';
        @cmd = (@vg, @cmd);
    }

    # valgrind reports to stderr: into make test-valgrind's log, after a
    # line that names the run (as the runner writes)
    my $stderr = $ENV{TEST_NGINX_USE_VALGRIND} && $ENV{TEST_NGINX_VALGRIND_LOG}
                 || "$prefix/logs/stderr.log";

    if ($ENV{TEST_NGINX_USE_VALGRIND} && $ENV{TEST_NGINX_VALGRIND_LOG}) {
        open my $out, '>>', $stderr or die "$stderr: $!\n";
        print $out "=== $0 nginx\n";
        close $out;
    }

    $nginx_pid = fork();
    die "fork: $!" unless defined $nginx_pid;

    if ($nginx_pid == 0) {
        open STDERR, '>>', $stderr;
        exec @cmd or POSIX::_exit(127);
    }

    wait_for(20, sub {
        IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                              Timeout => 1)
    }) or BAIL_OUT('nginx did not start: ' . tail($stderr)
                   . tail("$prefix/logs/error.log"));
}

sub stop_all {
    if ($nginx_pid) {
        kill 'QUIT', $nginx_pid;

        for (1 .. 200) {
            last if waitpid($nginx_pid, POSIX::WNOHANG()) != 0;
            Time::HiRes::sleep(0.05 * $Slow);
            kill 'KILL', $nginx_pid if $_ == 200;
        }

        waitpid($nginx_pid, 0);
        undef $nginx_pid;
    }

    for my $ip (keys %redis) {
        my $pid = delete $redis{$ip};
        kill 'TERM', $pid;
        waitpid($pid, 0);
    }

    $dns->stop if $dns;
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
