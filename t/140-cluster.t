# Redis Cluster: "idempotency_redis SEED SEED cluster" against a real
# 3-master cluster on loopback (t/lib/IdemCluster.pm starts it and stops it
# by pid on every path).  Records land on the master of their slot, the
# slot is the one CLUSTER KEYSLOT names, MOVED and ASK are followed while a
# slot migrates, and a resharding under a retry storm runs nothing twice.
#
# Blocks without "--- config" reuse the nginx (and its slot map) of the
# block before; the checks of a block's effects run in the next block's
# init, reading the error log, where the upstream logs one EXEC line per
# execution and the module (debug level) logs the slot of every record
# key and every redirect it follows.

BEGIN {
    use lib 't/lib';
    require IdemCluster;
    require Test::More;

    my $why;
    if (`redis-server --version 2>/dev/null` !~ /v=(\d+)\./ || $1 < 6) {
        $why = 'no redis-server 6.0 or newer';
    } elsif (!($main::Cluster = IdemCluster->start(3))) {
        $why = "no Redis Cluster: $IdemCluster::Error";
    }
    Test::More::plan(skip_all => $why) if $why;
}

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use Cwd ();
use Time::HiRes ();
use POSIX ();
use IO::Socket::INET ();
use Digest::SHA ();

$ENV{TEST_NGINX_PREFIX} ||= "t140-$$-" . time() . ":";
$ENV{TEST_NGINX_CLUSTER_SEEDS} = $main::Cluster->seeds;
$ENV{TEST_NGINX_SLOW_PORT} = (IdemCluster::_free_ports(1))[0];

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis $ENV{TEST_NGINX_CLUSTER_SEEDS} cluster
                      prefix=$ENV{TEST_NGINX_PREFIX} timeout=2s;
};

our $Config = q{
    location = /t {
        idempotency on;
        idempotency_ttl 300s;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /slow {
        idempotency on;
        idempotency_ttl 300s;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SLOW_PORT;
    }

    location = /status {
        idempotency_status;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }
};

our $C = $main::Cluster;
our $LogPos = 0;


sub error_log {
    my $root = $ENV{TEST_NGINX_SERVROOT} || Cwd::cwd() . '/t/servroot';
    open my $in, '<', "$root/logs/error.log" or return '';
    local $/;
    return <$in>;
}

# the part of the error log written since the last call
sub new_log {
    my $log = error_log();
    $LogPos = 0 if $LogPos > length $log;
    my $new = substr $log, $LogPos;
    $LogPos = length $log;
    return $new;
}

sub execs {
    my ($log, $key) = @_;
    my $n = () = $log =~ /^EXEC POST \/backend \Q$key\E$/mg;
    return $n;
}

# the status counter of commands kept for a retry (redis.parked)
sub parked_total {
    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                     PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
                                     Timeout => 10) or return -1;
    print $sock "GET /status HTTP/1.0\r\nHost: localhost\r\n\r\n";
    local $/;
    my $res = <$sock> // '';
    return $res =~ /"redis": \{[^}]*"parked": (\d+)/ ? $1 : -1;
}

# the pids of the processes whose parent is $ppid (the master's workers)
sub children {
    my ($ppid) = @_;
    my @pids;
    for my $stat (glob '/proc/[0-9]*/stat') {
        open my $fh, '<', $stat or next;
        my $line = <$fh> // next;
        # pid (comm) state ppid: comm may hold spaces and parentheses
        push @pids, $1 if $line =~ /^(\d+) \(.*\) \S+ (\d+) / && $2 == $ppid;
    }
    return @pids;
}

# After a HUP to $master, whose workers were @old: true once every old
# worker has exited (the master's notice; an old worker's alerts, such as
# "open socket ... left in connection", come before it) and every new
# worker has learnt the whole slot map (its first map is logged at info),
# false after $secs
sub reloaded {
    my ($master, $secs, @old) = @_;
    my %old = map { $_ => 1 } @old;
    my $end = Time::HiRes::time() + $secs;

    while (Time::HiRes::time() < $end) {
        my $log = error_log();
        my @new = grep { !$old{$_} } children($master);
        return 1
            if !grep({ $log !~ /worker process $_ exited with code/ } @old)
               && @new
               && !grep({ $log !~ /\[info\] $_#\d+: idempotency redis cluster: slot map from .* 16384 of 16384 slots covered/ } @new);
        Time::HiRes::sleep(0.1);
    }
    return 0;
}

sub keyslot {
    return $C->cli(0, 'CLUSTER', 'KEYSLOT', $_[0]);
}

sub post {
    return IdemCluster::post('/t', $_[0]);
}

# keys of this run on master $i
sub keys_on {
    my ($i) = @_;
    my @k = grep { length } split /\n/,
            $C->cli($i, '--scan', '--pattern', "$ENV{TEST_NGINX_PREFIX}*");
    return scalar @k;
}

# An upstream for one request on $TEST_NGINX_SLOW_PORT that answers 201
# only once the file "$go" exists, and writes a line to "$go.runs" per
# request it got (IdemTest::held_upstream)
sub slow_upstream {
    my ($go) = @_;
    return held_upstream(port => $ENV{TEST_NGINX_SLOW_PORT}, go => $go,
                         runs => "$go.runs");
}

sub record_key {
    return $ENV{TEST_NGINX_PREFIX} . Digest::SHA::sha256_hex('test:') . ":$_[0]";
}

# the state word of a record (the second word of its first line), or the
# reply itself when it is not a record
sub rec_state {
    my ($v) = @_;
    return defined $v && $v =~ /^idem1 (\S+) / ? $1 : $v;
}

master_on();
no_shuffle();
run_tests();

__DATA__

=== TEST 1: a request is claimed and recorded through the cluster
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
x
--- more_headers
Idempotency-Key: first-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- grep_error_log: EXEC POST /backend first-1
--- grep_error_log_out
EXEC POST /backend first-1



=== TEST 2: 60 keys land on all three masters, each runs once, replays are HITs, no redirect
--- init
main::new_log();
my ($miss, $hit) = (0, 0);
for my $i (1 .. 60) {
    my ($st, $rep) = main::post("spread-$i");
    $miss++ if $st == 201 && !$rep;
    ($st, $rep) = main::post("spread-$i");
    $hit++ if $st == 201 && $rep;
}
Test::More::is($miss, 60, "60 first requests ran");
Test::More::is($hit, 60, "60 retries were replayed");
my $log = main::new_log();
my @once = grep { main::execs($log, "spread-$_") == 1 } 1 .. 60;
Test::More::is(scalar @once, 60, "every key ran exactly once upstream");
for my $i (0 .. 2) {
    my $n = main::keys_on($i);
    Test::More::cmp_ok($n, '>', 5, "master $i holds records of this run ($n)");
}
Test::More::is(main::keys_on(0) + main::keys_on(1) + main::keys_on(2), 61,
               "61 records in all");
Test::More::unlike($log, qr/"(MOVED|ASK) /,
                   "every command went straight to its master");
--- request
POST /t
x
--- more_headers
Idempotency-Key: spread-7
--- error_code: 201
--- response_headers
Idempotent-Replayed: true



=== TEST 3: the slot of a record key is the one CLUSTER KEYSLOT gives, hash tags included
--- init
main::new_log();
@main::Tagged = ('tag-{a}', '{x}y', 'a{}b', '{}', '{{z}}', 'q{w}{e}', '}{r}',
               'plain', 'n{', 'u:9f2e:{user-17}:charge');
main::post($_) for @main::Tagged;
--- request
POST /t
x
--- more_headers
Idempotency-Key: plain
--- error_code: 201
--- response_headers
Idempotent-Replayed: true



=== TEST 4: ... checked against the cluster (a client's {tag} picks the slot, never the record)
--- init
my $log = main::new_log();
my %slot;
while ($log =~ /idempotency redis cluster: "([^"]+)" is in slot (\d+)/g) {
    $slot{$1} = $2;
}
for my $k (@main::Tagged) {
    my ($rkey) = grep { /:\Q$k\E$/ && index($_, $ENV{TEST_NGINX_PREFIX}) == 0 }
                 keys %slot;
    Test::More::ok(defined $rkey, "slot of the record of '$k' logged")
        or next;
    Test::More::is($slot{$rkey}, main::keyslot($rkey),
                   "'$k': CLUSTER KEYSLOT agrees");
}
my ($tagged) = grep { /:tag-\{a\}$/ } keys %slot;
Test::More::is($slot{$tagged // ''}, main::keyslot('a'),
               "a client's {a} makes the slot that of 'a'");
Test::More::is(main::execs($log, $_), 1, "'$_' ran once") for @main::Tagged;
--- request
POST /t
x
--- more_headers
Idempotency-Key: tag-{a}
--- error_code: 201
--- response_headers
Idempotent-Replayed: true



=== TEST 5: MOVED: a recorded key's slot moves to another master, its replay follows
--- init
$main::MvSlot = main::keyslot('mv');
$main::MvFrom = $main::C->owner($main::MvSlot);
$main::MvTo = ($main::MvFrom + 1) % 3;
# keys of earlier blocks (their prefix is random) may share the slot
$main::MvBase = $main::C->cli($main::MvFrom, 'CLUSTER', 'COUNTKEYSINSLOT',
                              $main::MvSlot);
my ($st) = main::post('mv-{mv}-1');
Test::More::is($st, 201, "recorded before the move");
main::new_log();
$main::C->migrate_start($main::MvSlot, $main::MvFrom, $main::MvTo);
Test::More::is($main::C->migrate_keys($main::MvSlot, $main::MvFrom, $main::MvTo),
               $main::MvBase + 1, "the record migrated");
$main::C->migrate_finish($main::MvSlot, $main::MvTo);
Test::More::is($main::C->owner($main::MvSlot, $main::MvTo), $main::MvTo, "slot $main::MvSlot moved");
--- request
POST /t
x
--- more_headers
Idempotency-Key: mv-{mv}-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true



=== TEST 6: MOVED: a new key of the moved slot runs once, on the new master
--- init
my $log = main::new_log();
Test::More::like($log, qr/"MOVED $main::MvSlot 127\.0\.0\.1:\d+"/,
                 "the replay followed a MOVED");
--- request
POST /t
x
--- more_headers
Idempotency-Key: mv-{mv}-2
--- error_code: 201
--- response_headers
!Idempotent-Replayed



=== TEST 7: ... and is recorded there, straight away (the map was updated)
--- init
my $log = main::new_log();
Test::More::is(main::execs($log, 'mv-{mv}-2'), 1, "ran once");
Test::More::unlike($log, qr/"MOVED /, "no MOVED for the new key");
Test::More::is($main::C->cli($main::MvTo, 'CLUSTER', 'COUNTKEYSINSLOT',
                             $main::MvSlot), $main::MvBase + 2,
               "both records on the new master");
Test::More::is($main::C->cli($main::MvFrom, 'CLUSTER', 'COUNTKEYSINSLOT',
                             $main::MvSlot), 0, "none left on the old one");
--- request
POST /t
x
--- more_headers
Idempotency-Key: mv-{mv}-2
--- error_code: 201
--- response_headers
Idempotent-Replayed: true



=== TEST 7a: nginx reloaded: the new workers learn the map again, the old ones close every node connection
# waits for the events, not for a time: the old workers' exit (after
# which any line about a socket they left open is in the log) and the new
# workers' slot map
--- skip_eval: 5: $ENV{TEST_NGINX_USE_VALGRIND}
--- init
return if $ENV{TEST_NGINX_USE_VALGRIND};    # skipped (the real Test::Nginx runs init anyway)
my $pidfile = "$ENV{TEST_NGINX_SERVER_ROOT}/logs/nginx.pid";
open my $fh, '<', $pidfile or die "no $pidfile: $!";
my $pid = <$fh>;
chomp $pid;
my @old = main::children($pid);
kill 'HUP', $pid or die "cannot HUP $pid";
Test::More::ok(main::reloaded($pid, 30 * $main::Slow, @old),
               'the old workers exited, the new ones have the slot map');
main::new_log();
--- request
POST /t
x
--- more_headers
Idempotency-Key: mv-{mv}-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- no_error_log
[alert]
[emerg]
open socket



=== TEST 8: ASK: a slot half-way through a migration; a new key is claimed on the importing master
--- init
$main::AkSlot = main::keyslot('ak');
$main::AkFrom = $main::C->owner($main::AkSlot);
$main::AkTo = ($main::AkFrom + 1) % 3;
my ($st) = main::post('ak-{ak}-old');
Test::More::is($st, 201, "recorded before the migration");
$main::C->migrate_start($main::AkSlot, $main::AkFrom, $main::AkTo);
# the importing master forgot the scripts: EVALSHA, NOSCRIPT, EVAL, each
# behind its own ASKING
Test::More::is($main::C->cli($main::AkTo, 'SCRIPT', 'FLUSH'), 'OK', "scripts flushed");
main::new_log();
--- request
POST /t
x
--- more_headers
Idempotency-Key: ak-{ak}-new
--- error_code: 201
--- response_headers
!Idempotent-Replayed



=== TEST 9: ASK: the new record is on the importing master, the map unchanged; its retry is a HIT
--- init
my $log = main::new_log();
Test::More::like($log, qr/"ASK $main::AkSlot 127\.0\.0\.1:\d+"/,
                 "the claim followed an ASK");
Test::More::like($log, qr/NOSCRIPT, resent as EVAL/,
                 "... and was resent as EVAL there");
Test::More::is(main::execs($log, 'ak-{ak}-new'), 1, "ran once");
Test::More::is($main::C->cli($main::AkTo, 'CLUSTER', 'COUNTKEYSINSLOT',
                             $main::AkSlot), 1, "new record on the importing master");
Test::More::is($main::C->cli($main::AkFrom, 'CLUSTER', 'COUNTKEYSINSLOT',
                             $main::AkSlot), 1, "old record still on the migrating one");
--- request
POST /t
x
--- more_headers
Idempotency-Key: ak-{ak}-new
--- error_code: 201
--- response_headers
Idempotent-Replayed: true



=== TEST 10: ASK: the record not yet migrated is replayed from the old master, without a redirect
--- init
main::new_log();
--- request
POST /t
x
--- more_headers
Idempotency-Key: ak-{ak}-old
--- error_code: 201
--- response_headers
Idempotent-Replayed: true



=== TEST 11: the migration ends: both records are replayed from the new master
--- init
my $log = main::new_log();
Test::More::unlike($log, qr/"(ASK|MOVED) /, "no redirect for the old record");
Test::More::is($main::C->migrate_keys($main::AkSlot, $main::AkFrom,
                                      $main::AkTo), 1, "the old record migrated");
$main::C->migrate_finish($main::AkSlot, $main::AkTo);
my ($st, $rep) = main::post('ak-{ak}-new');
Test::More::ok($st == 201 && $rep, "new record replayed");
--- request
POST /t
x
--- more_headers
Idempotency-Key: ak-{ak}-old
--- error_code: 201
--- response_headers
Idempotent-Replayed: true



=== TEST 12: a resharding under a retry storm: every key runs exactly once, every client gets its 201
--- init
main::new_log();
my $out = "$main::C->{dir}/reshard.out";
my $pid = fork();
die "fork: $!" unless defined $pid;
if ($pid == 0) {
    open STDOUT, '>', $out or POSIX::_exit(127);
    open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
    { exec 'redis-cli', '--cluster', 'reshard',
         '127.0.0.1:' . $main::C->port(0),
         '--cluster-from', $main::C->id(0), '--cluster-to', $main::C->id(1),
         '--cluster-slots', 2000, '--cluster-yes' };
    POSIX::_exit(127);
}
my ($done, $status, $done_at);
my $t0 = Time::HiRes::time();
my ($res, $retries) = IdemCluster::storm(
    uri => '/t', keys => [map { "rs-$_" } 1 .. 20000], clients => 3,
    seconds => 40 * $main::Slow,
    stop => sub {
        if (!$done && waitpid($pid, POSIX::WNOHANG()) == $pid) {
            ($done, $status, $done_at) = (1, $?, Time::HiRes::time());
        }
        return $done && Time::HiRes::time() > $done_at + 0.5;
    });
if (!$done) {
    waitpid($pid, 0);
    ($done, $status) = (1, $?);
}
Test::More::is($status, 0, "redis-cli --cluster reshard succeeded")
    or Test::More::diag(`tail -5 $out`);
Test::More::ok($main::C->wait_ok(10), "the cluster is ok again");
my $log = main::new_log();
my @keys = sort keys %$res;
my (@twice, @never, @bad);
for my $k (@keys) {
    my $n = main::execs($log, $k);
    push @twice, $k if $n > 1;
    push @never, $k if $n == 0;
    push @bad, "$k: @{ $res->{$k} }" if grep { $_ != 201 } @{ $res->{$k} };
}
my $moved = () = $log =~ /"MOVED /g;
my $ask = () = $log =~ /"ASK /g;
Test::More::note(sprintf "%d keys, %d answers, %d 409 retries, %d MOVED, "
                 . "%d ASK followed, %.1f s", scalar @keys,
                 (eval { my $n = 0; $n += @$_ for values %$res; $n }),
                 $retries, $moved, $ask, Time::HiRes::time() - $t0);
Test::More::cmp_ok(scalar @keys, '>', 100 / $main::Slow,
                   "the storm ran (" . @keys . " keys)");
Test::More::is("@twice", '', "no key ran twice");
Test::More::is("@never", '', "every answered key ran");
Test::More::is(scalar @bad, 0, "every client got 201")
    or Test::More::diag(join "\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)]);
Test::More::cmp_ok($moved, '>', 0, "MOVED redirects were followed");
--- request
POST /t
x
--- more_headers
Idempotency-Key: rs-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true



=== TEST 13: failover: a master with a replica is killed while a request is upstream; meanwhile its slots answer 503
--- init
# {fo3} is in slot 13551, created on master 2 and moved by no block above
$main::FoSlot = main::keyslot('fo3');
Test::More::is($main::C->owner($main::FoSlot), 2, "slot $main::FoSlot is on master 2");
$main::FoReplica = $main::C->add_replica(2);
$main::FoGo = "$main::C->{dir}/slow-go";
$main::FoPid = main::slow_upstream($main::FoGo);
main::first_request('/slow', 'fo-{fo3}-1', undef, 0.5);
my $rkey = main::record_key('fo-{fo3}-1');
my $state = '';
my $end = Time::HiRes::time() + 30 * $main::Slow;
until (($state = main::rec_state($main::C->cli_replica($main::FoReplica, 'GET',
                                                       $rkey))) eq 'inflight'
       || Time::HiRes::time() > $end)
{
    Time::HiRes::sleep(0.1);
}
Test::More::is($state, 'inflight', "the claim reached the replica");
# the replica takes over only once the next block has seen the STORE kept
# for a retry (were it promoted first, nginx could learn the new map before
# the STORE and send it there at once); meanwhile the slots are down
Test::More::is($main::C->cli_replica($main::FoReplica, 'CONFIG', 'SET',
                                     'cluster-replica-no-failover', 'yes'),
               'OK', 'the replica waits');
$main::C->kill_node(2);
$main::FoKilled = Time::HiRes::time();
Time::HiRes::sleep(0.3);
--- request
POST /t
x
--- more_headers
Idempotency-Key: fo-{fo3}-2
--- error_code: 503



=== TEST 14: ... the replica takes over; the kept STORE follows the slot there and the retry is a replay
--- init
# the upstream answers while the slot's master is down: the STORE is kept
open my $go, '>', $main::FoGo;
close $go;
waitpid($main::FoPid, 0);
my $hash = main::key_hash('fo-{fo3}-1');
my $end = Time::HiRes::time() + 30 * $main::Slow;
Time::HiRes::sleep(0.1)
    until main::error_log() =~ /store of key_hash=$hash failed .*kept for a retry/
          || Time::HiRes::time() > $end;
Test::More::like(main::error_log(),
                 qr/store of key_hash=$hash failed .*kept for a retry/,
                 "the STORE is kept for a retry while the slot is down");
# now the replica may take over
Test::More::is($main::C->cli_replica($main::FoReplica, 'CONFIG', 'SET',
                                     'cluster-replica-no-failover', 'no'),
               'OK', 'the replica may take over');
$end = Time::HiRes::time() + 30 * $main::Slow;
Time::HiRes::sleep(0.2)
    while ($main::C->owner($main::FoSlot, 0) // -1) != $main::FoReplica
          && Time::HiRes::time() < $end;
Test::More::is($main::C->owner($main::FoSlot, 0), $main::FoReplica,
               "the replica is the master of slot $main::FoSlot");
my $promoted = Time::HiRes::time();
my $rkey = main::record_key('fo-{fo3}-1');
my $state = '';
$end = Time::HiRes::time() + 30 * $main::Slow;
until (($state = main::rec_state($main::C->cli($main::FoReplica, 'GET',
                                               $rkey))) eq 'done'
       || Time::HiRes::time() > $end)
{
    Time::HiRes::sleep(0.1);
}
Test::More::is($state, 'done', "the record was completed on the new master");
Test::More::note(sprintf "failover: replica promoted %.1f s after the kill, "
                 . "the kept STORE done %.1f s after that", $promoted
                 - $main::FoKilled, Time::HiRes::time() - $promoted);
open my $runs, '<', "$main::FoGo.runs";
my @runs = <$runs>;
Test::More::is(scalar @runs, 1, "the upstream ran once");
# redis.parked counts each kept command once, wherever the slot took it:
# its warning (not the notice "every command kept for a retry is settled")
my @kept = main::error_log() =~ /failed \([^)]*\), kept for a retry for up to/g;
Test::More::cmp_ok(scalar @kept, '>=', 1, "the STORE was kept for a retry");
Test::More::is(main::parked_total(), scalar @kept,
               "redis.parked counts it once");
--- request
POST /slow
x
--- more_headers
Idempotency-Key: fo-{fo3}-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true



=== TEST 15: ... and new keys of those slots run on the new master
--- init
# for the next block: the ACL user that docs/deployment.md gives
for my $i (0, 1, $main::FoReplica) {
    my $r = $main::C->cli($i, 'ACL', 'SETUSER', 'idem', 'on', '>s3cret',
                          "~$ENV{TEST_NGINX_PREFIX}*", '+evalsha', '+eval',
                          '+script|load', '+set', '+get', '+pexpire', '+del',
                          '+cluster|slots',
                          '+asking');
    die "ACL SETUSER on $i: $r\n" unless $r eq 'OK';
}
--- request
POST /t
x
--- more_headers
Idempotency-Key: fo-{fo3}-3
--- error_code: 201
--- response_headers
!Idempotent-Replayed



=== TEST 16: with the documented ACL user: the slot map, and a claim through ASK on a half-migrated slot
--- http_config eval
$::HttpConfig =~ s/ cluster/ cluster user=idem password=s3cret/r
--- config eval: $::Config
--- init
$main::AcSlot = main::keyslot('ac');
$main::AcFrom = $main::C->owner($main::AcSlot);
($main::AcTo) = grep { $_ != $main::AcFrom } 0, 1, $main::FoReplica;
$main::C->migrate_start($main::AcSlot, $main::AcFrom, $main::AcTo);
--- request
POST /t
x
--- more_headers
Idempotency-Key: acl-{ac}-1
--- error_code: 201
--- response_headers
!Idempotent-Replayed
--- error_log eval
[qr/"ASK \d+ 127\.0\.0\.1:\d+"/,
 qr/slot map from "[^"]+", \d+ ranges, 16384 of 16384 slots covered/]
--- no_error_log
refused CLUSTER SLOTS
AUTH failed
NOPERM



=== TEST 17: ... and its retry is a replay
--- request
POST /t
x
--- more_headers
Idempotency-Key: acl-{ac}-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true



=== TEST 18: "cluster" pointed at a Redis that is not a cluster: 503, nothing written there
--- skip_eval: 4: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval
qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT} cluster
                      prefix=$ENV{TEST_NGINX_PREFIX}standalone:;
}
--- config eval: $::Config
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
# the worker has asked for the slot map and been refused
my $end = Time::HiRes::time() + 10 * $main::Slow;
Time::HiRes::sleep(0.1)
    until main::error_log() =~ /refused CLUSTER SLOTS/
          || Time::HiRes::time() > $end;
--- request
POST /t
x
--- more_headers
Idempotency-Key: not-a-cluster
--- error_code: 503
--- error_log
refused CLUSTER SLOTS: ERR This instance has cluster support disabled



=== TEST 19: ... and no record in that Redis (a GET is not protected: it passes)
--- skip_eval: 2: !$ENV{TEST_NGINX_REDIS_CTL}
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
Test::More::is(main::redis_cli('--scan', '--pattern',
                               "$ENV{TEST_NGINX_PREFIX}standalone:*"), '',
               "nothing written to the standalone Redis");
--- request
GET /t
--- error_code: 201
