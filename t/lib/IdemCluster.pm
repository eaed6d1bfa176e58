package IdemCluster;

# A throw-away Redis Cluster on loopback for the t/*.t suites: N masters on
# free ports, created with `redis-cli --cluster create`, stopped by pid on
# every path (normal end, die, Ctrl-C, TERM: an END block and signal
# handlers).  Plus the small HTTP client and the retry storm the cluster
# test drives nginx with.
#
#   my $cl = IdemCluster->start(3) or plan skip_all => $IdemCluster::Error;
#   $cl->seeds;                      "127.0.0.1:P1 127.0.0.1:P2"
#   $cl->cli($i, 'CLUSTER', 'INFO'); redis-cli against master $i
#   $cl->stop;                       also done at exit

use strict;
use warnings;

use File::Temp ();
use IO::Socket::INET ();
use POSIX ();
use Time::HiRes qw(sleep time);

our $Error = '';
my @Live;                   # clusters to stop at exit

# free loopback ports, all different
sub _free_ports {
    my ($n) = @_;
    my (@socks, @ports);
    for (1 .. $n) {
        my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                      LocalPort => 0, Listen => 1)
            or die "bind: $!\n";
        push @socks, $s;
        push @ports, $s->sockport;
    }
    close $_ for @socks;
    return @ports;
}

# ports for $n cluster nodes and their buses: any free ones where the
# server takes --cluster-port (Redis 7.0+), else pairs P, P + 10000 (the
# bus port older servers derive), both free
sub _node_ports {
    my ($n) = @_;
    require IdemTest;
    unless (IdemTest::redis_older(7, 0)) {
        my @p = _free_ports(2 * $n);
        return (@p[0 .. $n - 1], @p[$n .. 2 * $n - 1]);
    }
    my (%taken, @ports);
    while (@ports < $n) {
        my $p = 20000 + int(rand(30000));
        next if $taken{$p} || $taken{$p + 10000};
        next unless _bindable($p) && _bindable($p + 10000);
        $taken{$p} = $taken{$p + 10000} = 1;
        push @ports, $p;
    }
    return (@ports, map { $_ + 10000 } @ports);
}

sub _bindable {
    my ($port) = @_;
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                  LocalPort => $port, Listen => 1,
                                  ReuseAddr => 1)
        or return 0;
    close $s;
    return 1;
}

sub _which {
    my ($name) = @_;
    for my $d (split /:/, $ENV{PATH} // '') {
        return "$d/$name" if -x "$d/$name" && !-d _;
    }
    return undef;
}

sub start {
    my ($class, $n) = @_;

    for my $bin (qw(redis-server redis-cli)) {
        unless (_which($bin)) {
            $Error = "$bin not found";
            return undef;
        }
    }

    my $self = bless {
        dir   => File::Temp::tempdir('idem-cluster-XXXXXX', TMPDIR => 1,
                                     CLEANUP => 1),
        pids  => [],
        ports => [],
        owner => $$,
        masters => $n,
    }, $class;
    push @Live, $self;

    my @ports = _node_ports($n);

    for my $i (0 .. $n - 1) {
        $self->_spawn($ports[$i], $ports[$n + $i]);
    }

    for my $port (@{ $self->{ports} }) {
        unless (_wait_for(10, sub { $self->_cli_port($port, 'PING') eq 'PONG' }))
        {
            $Error = "redis-server on port $port did not start";
            $self->stop;
            return undef;
        }
    }

    my $nodes = join ' ', map { "127.0.0.1:$_" } @{ $self->{ports} };
    my $out = `redis-cli --cluster create $nodes --cluster-replicas 0 --cluster-yes 2>&1`;

    unless ($? == 0 && $self->wait_ok(20)) {
        $Error = "cluster create failed: " . substr($out, -400);
        $self->stop;
        return undef;
    }

    for my $i (0 .. $n - 1) {
        $self->{ids}[$i] = $self->cli($i, 'CLUSTER', 'MYID');
    }

    return $self;
}

# one cluster-enabled redis-server, in the foreground, ours to stop
sub _spawn {
    my ($self, $port, $bus) = @_;
    my $log = "$self->{dir}/redis-$port.log";

    my $pid = fork();
    die "fork: $!" unless defined $pid;

    if ($pid == 0) {
        open STDOUT, '>>', $log or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        { exec 'redis-server', '--bind', '127.0.0.1', '--port', $port,
               '--cluster-enabled', 'yes',
               ($bus == $port + 10000 ? () : ('--cluster-port', $bus)),
               '--cluster-config-file', "$self->{dir}/nodes-$port.conf",
               '--cluster-node-timeout', '2000',
               '--appendonly', 'no', '--save', '', '--dir', $self->{dir},
               '--daemonize', 'no' };
        POSIX::_exit(127);
    }

    push @{ $self->{pids} }, $pid;
    push @{ $self->{ports} }, $port;
    return scalar @{ $self->{ports} } - 1;
}

# a replica of master $m, as node number n() (not a master: not counted
# by the helpers above that walk the masters 0 .. 2)
sub add_replica {
    my ($self, $m) = @_;
    my ($port, $bus) = _node_ports(1);
    my $i = $self->_spawn($port, $bus);
    _wait_for(10, sub { $self->_cli_port($port, 'PING') eq 'PONG' })
        or die "replica on $port did not start\n";
    my $out = `redis-cli --cluster add-node 127.0.0.1:$port 127.0.0.1:@{[ $self->port($m) ]} --cluster-slave --cluster-master-id @{[ $self->id($m) ]} 2>&1`;
    die "add-node: $out\n" if $?;
    $self->{ids}[$i] = $self->cli($i, 'CLUSTER', 'MYID');
    _wait_for(20, sub {
        $self->cli($i, 'INFO', 'replication') =~ /master_link_status:up/
    }) or die "replica on $port did not sync\n";
    return $i;
}

# a read on replica $i (READONLY first, on the same connection)
sub cli_replica {
    my ($self, $i, @args) = @_;
    my $file = "$self->{dir}/replica-cmd";
    open my $f, '>', $file or die "$file: $!";
    print $f "READONLY\n", join(' ', map { qq{"$_"} } @args), "\n";
    close $f;
    my $port = $self->port($i);
    my $out = `redis-cli -h 127.0.0.1 -p $port < '$file' 2>/dev/null`;
    $out =~ s/\A[^\n]*\n//;
    $out =~ s/\s+\z//;
    return $out;
}

# SIGKILL: a crashed master, no goodbye to anyone
sub kill_node {
    my ($self, $i) = @_;
    my $pid = $self->{pids}[$i];
    kill 'KILL', $pid;
    waitpid($pid, 0);
    $self->{dead}{$i} = 1;
}

sub _wait_for {
    my ($seconds, $cond) = @_;
    my $end = time + $seconds;
    while (time < $end) {
        return 1 if $cond->();
        sleep 0.1;
    }
    return 0;
}

# cluster_state:ok on every node, and every node sees every slot assigned
sub wait_ok {
    my ($self, $seconds) = @_;
    return _wait_for($seconds, sub {
        for my $i (grep { !$self->{dead}{$_} } 0 .. $#{ $self->{ports} }) {
            my $port = $self->{ports}[$i];
            my $info = $self->_cli_port($port, 'CLUSTER', 'INFO');
            return 0 unless $info =~ /cluster_state:ok/
                            && $info =~ /cluster_slots_ok:16384/;
        }
        return 1;
    });
}

sub _cli_port {
    my ($self, $port, @args) = @_;
    my $cmd = join ' ', map { my $a = $_; $a =~ s/'/'\\''/g; "'$a'" } @args;
    my $out = `redis-cli -h 127.0.0.1 -p $port $cmd 2>/dev/null`;
    $out =~ s/\s+\z//;
    return $out;
}

sub n     { $_[0]{masters} }    # masters made by start
sub port  { $_[0]{ports}[$_[1]] }
sub id    { $_[0]{ids}[$_[1]] }
sub seeds { join ' ', map { "127.0.0.1:$_" } @{ $_[0]{ports} }[0, 1] }
sub cli   { my ($self, $i, @args) = @_; $self->_cli_port($self->port($i), @args) }

# index of the master that owns the slot, as master $via sees it
sub owner {
    my ($self, $slot, $via) = @_;
    my $nodes = $self->cli($via // 0, 'CLUSTER', 'NODES');
    for my $line (split /\n/, $nodes) {
        my @f = split / /, $line;
        next unless $f[2] =~ /master/;
        for my $r (@f[8 .. $#f]) {
            next if $r =~ /^\[/;
            my ($a, $b) = split /-/, $r;
            $b //= $a;
            if ($slot >= $a && $slot <= $b) {
                for my $i (0 .. $#{ $self->{ids} }) {
                    return $i if $self->id($i) eq $f[0];
                }
            }
        }
    }
    return undef;
}

# moves one slot and its keys from master $from to master $to, by hand;
# with $keys_too false it stops half-way: MIGRATING/IMPORTING, keys stay
sub migrate_start {
    my ($self, $slot, $from, $to) = @_;
    $self->cli($to, 'CLUSTER', 'SETSLOT', $slot, 'IMPORTING', $self->id($from));
    $self->cli($from, 'CLUSTER', 'SETSLOT', $slot, 'MIGRATING', $self->id($to));
}

sub migrate_keys {
    my ($self, $slot, $from, $to) = @_;
    my @keys = split /\n/, $self->cli($from, 'CLUSTER', 'GETKEYSINSLOT',
                                      $slot, 1000);
    return 0 unless @keys;
    my $r = $self->cli($from, 'MIGRATE', '127.0.0.1', $self->port($to), '',
                       0, 5000, 'KEYS', @keys);
    die "MIGRATE: $r\n" unless $r eq 'OK';
    return scalar @keys;
}

sub migrate_finish {
    my ($self, $slot, $to) = @_;
    # the new owner first, then the others (the order redis-cli uses)
    $self->cli($to, 'CLUSTER', 'SETSLOT', $slot, 'NODE', $self->id($to));
    for my $i (grep { $_ != $to } 0 .. $self->n - 1) {
        $self->cli($i, 'CLUSTER', 'SETSLOT', $slot, 'NODE', $self->id($to));
    }
}

sub stop {
    my ($self) = @_;
    return if $self->{owner} != $$;     # a forked child never stops it
    my @pids = map { $self->{pids}[$_] }
               grep { !$self->{dead}{$_} } 0 .. $#{ $self->{pids} };
    kill 'TERM', @pids;
    for my $pid (@pids) {
        my $end = time + 10;
        while (waitpid($pid, POSIX::WNOHANG()) == 0) {
            if (time > $end) {
                kill 'KILL', $pid;
                waitpid($pid, 0);
                last;
            }
            sleep 0.05;
        }
    }
    $self->{pids} = [];
}

END {
    my $status = $?;
    $_->stop for @Live;
    $? = $status;
}

$SIG{INT} = sub { exit 130 };
$SIG{TERM} = sub { exit 143 };

# prove stops reading at a "Bail out!": a write to it must not kill us by
# SIGPIPE before the END block above has stopped the servers
$SIG{PIPE} = 'IGNORE';


# ----------------------------------------------------------- HTTP client

# POST $uri with an Idempotency-Key to nginx; returns (status, replayed, body)
sub post {
    my ($uri, $key, $port) = @_;
    my $sock = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1',
        PeerPort => $port // $ENV{TEST_NGINX_SERVER_PORT},
        Timeout  => 10,
    ) or return (0, 0, "connect: $!");

    print $sock "POST $uri HTTP/1.1\r\nHost: localhost\r\n"
                . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
                . "Connection: close\r\n\r\nx";
    local $/;
    my $resp = <$sock> // '';
    close $sock;

    my ($status) = $resp =~ m{^HTTP/1\.[01] (\d+)};
    my $replayed = $resp =~ /^Idempotent-Replayed: true\r?$/mi ? 1 : 0;
    my ($body) = $resp =~ /\r\n\r\n(.*)\z/s;
    return ($status // 0, $replayed, $body // '');
}

# $clients processes each send every key of @$keys in the same order (so
# that the attempts of one key overlap), retrying a 409 until it gets
# another answer, until $stop->() is true or $seconds pass.  Returns
# { key => [final status of each client] } and the number of 409 retries.
sub storm {
    my (%o) = @_;
    my $dir = File::Temp::tempdir('idem-storm-XXXXXX', TMPDIR => 1,
                                  CLEANUP => 1);
    my @pids;

    for my $c (1 .. $o{clients}) {
        my $pid = fork();
        die "fork: $!" unless defined $pid;
        if ($pid == 0) {
            my $end = time + $o{seconds};
            open my $out, '>', "$dir/$c" or POSIX::_exit(1);
            my $fh = select $out; $| = 1; select $fh;
            for my $key (@{ $o{keys} }) {
                last if time > $end || -e "$dir/stop";
                my ($st, $rep) = (409, 0);
                for my $try (1 .. 100) {
                    ($st, $rep) = post($o{uri}, $key);
                    last unless $st == 409;
                    print $out "RETRY\n";
                    sleep 0.02;
                }
                print $out "$key $st $rep\n";
            }
            close $out;
            POSIX::_exit(0);
        }
        push @pids, $pid;
    }

    my $end = time + $o{seconds} + 30;
    while (@pids) {
        if ($o{stop} && !-e "$dir/stop" && $o{stop}->()) {
            open my $f, '>', "$dir/stop";
            close $f;
        }
        kill 'KILL', @pids if time > $end;
        sleep 0.05;
        @pids = grep { waitpid($_, POSIX::WNOHANG()) == 0 } @pids;
    }

    my (%res, $retries);
    for my $c (1 .. $o{clients}) {
        open my $in, '<', "$dir/$c" or next;
        while (<$in>) {
            if (/^RETRY$/) { $retries++; next }
            my ($key, $st, $rep) = split;
            push @{ $res{$key} }, $st;
        }
    }
    return (\%res, $retries // 0);
}

1;
