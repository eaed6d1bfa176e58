# Redis Sentinel: nginx finds the master through three sentinels, follows
# a manual failover (SENTINEL FAILOVER) and a killed master (SIGKILL, with
# a sentinel killed too) without a reload, and no key runs twice unless
# Redis itself lost its record in the failover (the one allowed gap, see
# docs/deployment.md); in the manual failover no key is lost at all.
#
# A plain Test::More file: it starts its own topology (t/lib/RedisTopology:
# a master, a replica, three sentinels) and its own nginx (2 workers), all
# on free 127.0.0.1 ports, and stops every one by pid.  Requests are sent
# while the failovers run; the upstream logs one EXEC line per execution.
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
use DelayProxy;
use RedisTopology;

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
# make test-asan runs it with the instrumented module; under valgrind the
# failover choreography (a ~100 ms window) would not hold
plan skip_all => 'not under valgrind (make test-asan covers it)'
    if $ENV{TEST_NGINX_USE_VALGRIND};
plan skip_all => 'redis-server and redis-cli are needed'
    unless `sh -c 'command -v redis-server && command -v redis-cli'`
           =~ /redis-cli/;

my $Prefix = 't130:';
my $Name = 'mymaster';
my $Nginx = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t130-XXXXXX',
                                                   DIR => $base));

my $topo = RedisTopology->new(dir => $dir, name => $Name,
                              sentinel_password => 'sentinel-secret');
unless ($topo->start) {
    my $why = $topo->error;
    $topo->stop;
    File::Path::remove_tree($dir);
    plan skip_all => "no Sentinel topology: $why";
}

my $nginx_pid;
my $port = RedisTopology::free_port();

my ($first_pid, $proxy_pid);

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };


# --- a worker's first requests, while it asks the sentinels ---------------

# One worker whose only sentinel answers 1 s late (a proxy holds what
# nginx sends it): requests that reach the worker meanwhile wait for the
# master, as they would behind a connection's handshake, rather than get
# a 503 (on every start and reload of nginx).  /none asks the same
# sentinel for a master it does not know: its request waits for the
# answer too, and gets the 503 then, not at its timeout= of a minute.
{
    my $sport;
    ($proxy_pid, $sport) = DelayProxy::start($topo->{sentinel_ports}[0], 1);

    my $fport = RedisTopology::free_port();
    my $none = <<LOC;
        location = /none {
            idempotency on;
            idempotency_redis 127.0.0.1:$sport sentinel=nosuch
                              sentinel_password=sentinel-secret
                              timeout=60s connect_timeout=2s prefix=$Prefix;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$fport/backend;
        }
LOC
    $first_pid = start_nginx("$dir/first", $fport, 1, [$sport],
                             'timeout=3s connect_timeout=2s', $none);

    my $t = Time::HiRes::time();
    my @s = (send_post('first-1', $fport, '/t'),
             send_post('none-1', $fport, '/none'));
    my @r = (answer($s[0], 20), answer($s[1], 20));
    my $took = Time::HiRes::time() - $t;

    is("$r[0]{status} $r[0]{idem}", '201 MISS',
       "a worker's first request, sent while it asks the sentinels, runs")
        or diag(tail("$dir/first/logs/error.log"));
    is("$r[1]{status} $r[1]{idem}", '503 ERROR',
       'one for a master the sentinels do not know gets the 503 once they '
       . 'answered')
        or diag(tail("$dir/first/logs/error.log"));
    note sprintf 'answered after %.2f s (the sentinel answers 1 s late)',
                 $took;

    stop_nginx($first_pid);
    undef $first_pid;
    DelayProxy::stop($proxy_pid);
    undef $proxy_pid;
}

$nginx_pid = start_nginx("$dir/nginx", $port, 2, $topo->{sentinel_ports},
                         'timeout=500ms connect_timeout=300ms');

my $exec_log = "$dir/nginx/logs/exec.log";
my %first;      # key => first 2xx answer { status, body }
my $t0 = Time::HiRes::time();


# --- the master, through the sentinels -----------------------------------

ok(wait_for(15, sub { post("warm-up")->{status} == 201 }),
   'nginx reaches the master named by the sentinels')
    or diag(tail("$dir/nginx/logs/error.log"));

my $r1 = post('before-1');
is($r1->{idem}, 'MISS', 'a new key runs (MISS)');
my $r2 = post('before-1');
is($r2->{idem}, 'HIT', 'its retry is replayed (HIT)');
is($r2->{body}, $r1->{body}, 'with the same body');

my $master = $topo->{master_port};
ok(record_on($master, 'before-1'), 'the record is on the master');

my @odd;
for my $i (2 .. 20) {
    my $r = post("before-$i");
    $first{"before-$i"} = $r if $r->{status} == 201;
    push @odd, "before-$i: $r->{status} $r->{idem}" if $r->{status} != 201;
}
$first{'before-1'} = $r1;

is(scalar(grep { /^before-/ } keys %first), 20, 'twenty keys stored')
    or diag(join("\n", @odd) . "\n" . tail("$dir/nginx/logs/error.log"));
is(replicated($master), 1, 'and replicated (WAIT 1)');


# --- SENTINEL FAILOVER while requests come in ----------------------------

is($topo->sentinel('SENTINEL', 'FAILOVER', $Name), 'OK',
   'SENTINEL FAILOVER accepted');

my $replica = $topo->{replica_port};
# written to the new master itself: not replicated back to the old one
my $seen = storm('fo', sub {
    record_on($replica, $_[0]) && !record_on($master, $_[0])
});

ok($seen, 'new keys are claimed after the failover')
    or diag(tail("$dir/nginx/logs/error.log"));

my $new = $topo->master_port;
is($new, $replica, 'the sentinels name the former replica');
ok(record_on($new, "fo-$seen"), 'a new key is stored on the new master');

# The workers stop writing to the old master when the failover starts,
# 50 to 100 ms before the promotion: none is lost on an idle machine (10 to
# 17 without that event); a worker that a loaded machine keeps from reading
# the event in time may lose one or two.
cmp_ok(check_keys('after the manual failover', $new, qr/^(?:before|fo)-/),
       '<=', 2, 'no key lost (at most 2 on a loaded machine): nothing is '
       . 'written to the old master once the replica is being promoted');

my $log = slurp("$dir/nginx/logs/error.log");
like($log, qr/failover of master "$Name" started .* promoting 127\.0\.0\.1:$replica/,
     'the start of the failover stopped the workers');
like($log, qr/\+switch-master from .* moved to 127\.0\.0\.1:$replica/,
     'the +switch-master event moved them');


unless ($seen) {
    diag 'nginx did not follow the failover: the rest is skipped';
    stop_all();
    done_testing();
    exit;
}


# --- SIGKILL the master --------------------------------------------------

# the old master becomes a replica of the new one (sentinel converts it)
ok(wait_for(30, sub {
       $topo->cli($master, 'ROLE') =~ /^slave\n127\.0\.0\.1\n$new\nconnected/
       && $topo->wait_agreed(0.1)
   }), 'the old master is a healthy replica again');

for my $i (1 .. 10) {
    my $r = post("prekill-$i");
    $first{"prekill-$i"} = $r if $r->{status} == 201;
}

is(replicated($new), 1, 'keys before the kill are replicated (WAIT 1)');

# the sentinel the workers asked and listened to goes away first
my $gone = $topo->{sentinel_ports}[0];
$topo->kill_server($gone);

$topo->kill_server($new);

# the killed master wrote nothing after the kill: any new key is nginx's
$seen = storm('kill', sub { record_on($master, $_[0]) });

ok($seen, 'new keys are claimed after the master was killed')
    or diag(tail("$dir/nginx/logs/error.log"));
is($topo->master_port, $master, 'the sentinels name the old master again');
ok(record_on($master, "kill-$seen"), 'a new key is stored there');

check_keys('after the killed master', $master, qr/^(?:before|prekill|kill)-/);

$log = slurp("$dir/nginx/logs/error.log");
like($log, qr/\+switch-master from 127\.0\.0\.1:(?!$gone:)\d+: .* moved to 127\.0\.0\.1:$master/,
     'with the first sentinel gone, the others asked and told');
unlike($log, qr/\[(?:alert|crit|emerg)\]/, 'no alert in the error log');
ok(kill(0, $nginx_pid), 'the same nginx ran throughout (no reload)');

note sprintf 'run time %.1f s', Time::HiRes::time() - $t0;

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


# --- helpers -------------------------------------------------------------

# Sends new keys PREFIX-1, PREFIX-2 ... (every 20 ms) until 5 keys in a row
# ran and $done finds their records on the new master; then the last one's
# number.  At most 25 s.
sub storm {
    my ($prefix, $done) = @_;

    my $start = Time::HiRes::time();
    my $until = $start + 25;
    my ($i, $row, $errors, $first_error, $last_error) = (0, 0, 0);

    while (Time::HiRes::time() < $until) {
        my $key = "$prefix-" . ++$i;
        my $r = post($key);

        if ($r->{status} != 201) {
            $errors++;
            $first_error //= Time::HiRes::time() - $start;
            $last_error = Time::HiRes::time() - $start;
        }

        $first{$key} = $r if $r->{status} == 201;
        $first{$key} //= { status => $r->{status}, pending => 1 };

        # the event (or a lost connection) moves nginx: count from there

        if ($r->{idem} eq 'MISS' && $done->($key)) {
            next unless ++$row >= 5;

            note sprintf '%s: %d requests in %.1f s, %d not 201%s', $prefix,
                 $i, Time::HiRes::time() - $start, $errors,
                 $errors ? sprintf(' (from %.1f s to %.1f s)', $first_error,
                                   $last_error)
                         : '';
            return $i;
        } else {
            $row = 0;
        }

        Time::HiRes::sleep(0.02);
    }

    return 0;
}

# Every key sent so far (matching $re): a key whose record is on the
# current master ran once, and its retry gets the same answer (or 409 while
# a claim whose response Redis lost is still held); a key whose record is
# not there was lost by Redis in the failover: its retry may run again.
sub check_keys {
    my ($when, $mport, $re) = @_;

    my %on = map { s/^\Q$Prefix\E[0-9a-f]{64}://r => 1 }
             split /\n/, $topo->cli($mport, '--scan', '--pattern',
                                    "$Prefix*");

    my (@bad, @lost, $held, $again);
    my $ran = exec_counts();

    for my $key (sort grep { /$re/ } keys %first) {
        my $f = $first{$key};
        my $r;

        wait_for(10, sub { $r = post($key); $r->{status} != 503 });

        my $runs = exec_counts()->{$key} // 0;

        if ($f->{pending}) {
            # never answered 2xx: it ran now, is held (409), or had run
            push @bad, "$key: ran $runs times" if $runs > 1;
            next;
        }

        if (!$on{$key}) {
            push @lost, $key;
            $again++ if $runs == 2;
            push @bad, "$key: ran $runs times" if $runs > 2;
            next;
        }

        if ($r->{status} == 409) {
            $held++;
        } elsif ($r->{idem} ne 'HIT' || $r->{body} ne $f->{body}) {
            push @bad, "$key: retry got $r->{status} $r->{idem}";
        }

        push @bad, "$key: ran $runs times" if $runs != 1;
    }

    is_deeply(\@bad, [], "$when: every stored key ran once, retries replay");

    # the gap: writes the new master never got (asynchronous replication)
    my $n = grep { /$re/ } keys %first;
    note "$when: $n keys, " . scalar(@lost) . ' lost by Redis in the '
         . 'failover' . (@lost ? ' (' . join(' ', (sort @lost)[0 .. ($#lost > 9
                                                         ? 9 : $#lost)])
                                 . ($#lost > 9 ? ' ...' : '') . ')'
                               : '') . ', '
         . ($again // 0) . ' of them ran again, ' . ($held // 0)
         . ' held in flight';
    cmp_ok(scalar(@lost), '<=', $n / 2, "$when: most keys survived");

    ok(!grep({ /^before-/ && !$on{$_} } keys %first),
       "$when: every key stored before the failover is on the new master");

    return scalar @lost;
}

sub exec_counts {
    my %n;
    $n{$_}++ for slurp($exec_log) =~ /^EXEC (\S+)$/mg;
    return \%n;
}

sub record_on {
    my ($mport, $key) = @_;
    return $topo->cli($mport, '--scan', '--pattern', "$Prefix*:$key") ne '';
}

# SET + WAIT 1 on one connection: 1 once the replica has every write
sub replicated {
    my ($mport) = @_;

    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $mport, Timeout => 3)
        or return -1;

    print $s "*3\r\n\$3\r\nSET\r\n\$10\r\nt130:probe\r\n\$1\r\n1\r\n"
             . "*3\r\n\$4\r\nWAIT\r\n\$1\r\n1\r\n\$4\r\n3000\r\n";

    my $ok = <$s> // '';
    my $n = <$s> // '';
    return $ok =~ /^\+OK/ && $n =~ /^:(\d+)/ ? $1 : -1;
}

# post(KEY [, PORT]): a POST to /t, its answer { status, idem, body }
sub post {
    my ($key, $to) = @_;
    return answer(send_post($key, $to, '/t'), 5);
}

# the request sent, its socket (or undef)
sub send_post {
    my ($key, $to, $path) = @_;

    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $to // $port, Timeout => 5)
        or return undef;

    print $s "POST $path HTTP/1.1\r\nHost: localhost\r\n"
             . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
             . "Connection: close\r\n\r\nx";

    return $s;
}

# answer(SOCKET, SECONDS): what came back within that time
sub answer {
    my ($s, $seconds) = @_;

    return { status => 0, idem => '', body => '' } unless $s;

    my $resp = '';
    eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm($seconds);
        local $/;
        $resp = <$s> // '';
        alarm(0);
    };
    alarm(0);
    close $s;

    my ($head, $body) = split /\r\n\r\n/, $resp, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.\d (\d+)};
    my ($idem) = ($head // '') =~ /^X-Idempotency-Status: (\S+)/mi;

    return { status => $status // 0, idem => $idem // '', body => $body // '' };
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

# start_nginx(PREFIX, PORT, WORKERS, [SENTINEL PORTS], TIMEOUTS[, MORE]):
# its pid; MORE: locations added to the server
sub start_nginx {
    my ($prefix, $listen, $workers, $sentinels, $timeouts, $more) = @_;
    my $pid;

    File::Path::make_path("$prefix/conf", "$prefix/logs");

    my $s = join ' ', map { "127.0.0.1:$_" } @$sentinels;

    RedisTopology::write_file("$prefix/conf/nginx.conf", <<CONF);
load_module $ENV{TEST_NGINX_LOAD_MODULES};
daemon off;
master_process on;
worker_processes $workers;
error_log logs/error.log info;
pid logs/nginx.pid;

events {
    worker_connections 256;
}

http {
    access_log off;
    log_format exec 'EXEC \$http_idempotency_key';

    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis $s sentinel=$Name sentinel_password=sentinel-secret
                      $timeouts prefix=$Prefix;

    server {
        listen 127.0.0.1:$listen;

        location = /t {
            idempotency on;
            add_header X-Idempotency-Status \$idempotency_status always;
            proxy_pass http://127.0.0.1:$listen/backend;
        }

@{[ $more // '' ]}
        location = /backend {
            access_log logs/exec.log exec;
            return 201 "ran \$request_id\\n";
        }
    }
}
CONF

    $pid = fork();
    die "fork: $!" unless defined $pid;

    if ($pid == 0) {
        open STDERR, '>>', "$prefix/logs/stderr.log";
        exec $Nginx, '-p', "$prefix/", '-c', 'conf/nginx.conf'
            or POSIX::_exit(127);
    }

    wait_for(10, sub { RedisTopology::port_open($listen) })
        or BAIL_OUT('nginx did not start: ' . tail("$prefix/logs/stderr.log")
                    . tail("$prefix/logs/error.log"));

    return $pid;
}

sub stop_nginx {
    my ($pid) = @_;

    kill 'QUIT', $pid;

    for (1 .. 100) {
        last if waitpid($pid, POSIX::WNOHANG()) != 0;
        Time::HiRes::sleep(0.05);
        kill 'KILL', $pid if $_ == 100;
    }

    waitpid($pid, 0);
}

sub stop_all {
    for my $pid ($nginx_pid, $first_pid) {
        stop_nginx($pid) if $pid;
    }

    undef $nginx_pid;
    undef $first_pid;
    DelayProxy::stop($proxy_pid) if $proxy_pid;
    undef $proxy_pid;

    $topo->stop if $topo;
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
