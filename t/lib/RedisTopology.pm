package RedisTopology;

# A Redis Sentinel topology on loopback for the tests: a master, a replica
# and three sentinels (redis-server --sentinel), each on a free 127.0.0.1
# port, in the foreground as children of the test, so that every one is
# stopped by its pid on every path (stop(), DESTROY, END, or a signal).
#
#   my $t = RedisTopology->new(dir => $dir, sentinel_password => 'pw');
#   $t->start or plan skip_all => $t->error;
#   $t->cli($t->{master_port}, 'SET', 'k', 'v');
#   $t->sentinel('FAILOVER', 'mymaster');
#   $t->kill_server($port);
#   $t->stop;

use strict;
use warnings;

use IO::Socket::INET ();
use POSIX ();
use Time::HiRes ();

my %Live;    # pid => 1, for END

sub new {
    my ($class, %opt) = @_;

    my $self = bless {
        dir               => $opt{dir},
        name              => $opt{name} // 'mymaster',
        quorum            => $opt{quorum} // 2,
        down_after        => $opt{down_after} // 1000,
        failover_timeout  => $opt{failover_timeout} // 2000,
        sentinel_password => $opt{sentinel_password},
        # seconds the master's stream takes to reach the replica (a
        # DelayProxy between them): a replica that lags
        replica_delay     => $opt{replica_delay},
        pids              => {},    # port => pid
        error             => undef,
    }, $class;

    return $self;
}

sub error { $_[0]{error} }

sub free_port {
    require IdemTest;
    return IdemTest::free_port();
}

sub port_open {
    my ($port) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Timeout => 1);
    return $s ? 1 : 0;
}

sub write_file {
    my ($path, $text) = @_;
    open my $fh, '>', $path or die "$path: $!\n";
    print $fh $text;
    close $fh;
}

# starts redis-server with a config file (and extra args), in the foreground
sub spawn {
    my ($self, $port, @args) = @_;

    my $log = "$self->{dir}/$port.out";
    my $pid = fork();
    die "fork: $!\n" unless defined $pid;

    if ($pid == 0) {
        open STDOUT, '>>', $log or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        exec 'redis-server', @args or POSIX::_exit(127);
    }

    $self->{pids}{$port} = $pid;
    $Live{$pid} = 1;

    for (1 .. 200) {
        return 1 if port_open($port);
        return 0 if waitpid($pid, POSIX::WNOHANG()) == $pid;
        Time::HiRes::sleep(0.05);
    }

    return 0;
}

sub start {
    my ($self) = @_;
    my $dir = $self->{dir};

    my $m = $self->{master_port} = free_port();
    my $r = $self->{replica_port} = free_port();
    my @s = map { free_port() } 1 .. 3;
    $self->{sentinel_ports} = \@s;

    my $upstream = $m;

    if ($self->{replica_delay}) {
        require DelayProxy;
        ($self->{proxy_pid}, $upstream) =
            DelayProxy::start($m, $self->{replica_delay}, 'replies');
    }

    for my $port ($m, $r) {
        mkdir "$dir/$port";
        write_file("$dir/$port.conf", <<CONF
bind 127.0.0.1
port $port
dir $dir/$port
save ""
appendonly no
logfile $dir/$port.log
CONF
            . ($port == $r ? "replicaof 127.0.0.1 $upstream\n" : ''));
    }

    my $pw = $self->{sentinel_password};
    # a sentinel's password for the other sentinels: sentinel-pass since
    # Redis 6.2; 6.0's sentinels send their own requirepass to each other
    require IdemTest;
    my $auth = !$pw ? ''
             : IdemTest::redis_older(6, 2) ? "requirepass $pw\n"
             : "requirepass $pw\nsentinel sentinel-pass $pw\n";

    for my $port (@s) {
        write_file("$dir/$port.conf", <<CONF);
bind 127.0.0.1
port $port
dir $dir
logfile $dir/$port.log
${auth}sentinel monitor $self->{name} 127.0.0.1 $m $self->{quorum}
sentinel down-after-milliseconds $self->{name} $self->{down_after}
sentinel failover-timeout $self->{name} $self->{failover_timeout}
sentinel parallel-syncs $self->{name} 1
CONF
    }

    for my $port ($m, $r) {
        $self->spawn($port, "$dir/$port.conf")
            or return $self->fail("redis-server on $port did not start");
    }

    for my $port (@s) {
        $self->spawn($port, "$dir/$port.conf", '--sentinel')
            or return $self->fail("redis-server --sentinel did not start "
                                  . "(no Sentinel support?)");
    }

    return $self->wait_agreed(30)
        || $self->fail('the sentinels did not agree in 30 s');
}

sub fail {
    my ($self, $why) = @_;
    $self->{error} = $why;
    return 0;
}

# every sentinel sees the other two, the master and a healthy replica
sub wait_agreed {
    my ($self, $seconds) = @_;

    my $until = Time::HiRes::time() + $seconds;

    while (Time::HiRes::time() < $until) {
        my $ok = 1;

        for my $port (@{ $self->{sentinel_ports} }) {
            my %m = $self->fields($port, 'SENTINEL', 'master', $self->{name});
            my $replicas = $self->sentinel_cli($port, 'SENTINEL', 'replicas',
                                               $self->{name});

            $ok = 0 unless ($m{'num-other-sentinels'} // 0) == 2
                           && ($m{flags} // '') eq 'master'
                           && $replicas =~ /master-link-status\nok/
                           && $replicas !~ /s_down|disconnected/;
        }

        return 1 if $ok;
        Time::HiRes::sleep(0.2);
    }

    return 0;
}

# redis-cli against a data server, output without the last newline
sub cli {
    my ($self, $port, @args) = @_;
    return run_cli($port, undef, @args);
}

sub sentinel_cli {
    my ($self, $port, @args) = @_;
    return run_cli($port, $self->{sentinel_password}, @args);
}

# the command to the first sentinel that runs
sub sentinel {
    my ($self, @args) = @_;

    for my $port (@{ $self->{sentinel_ports} }) {
        next unless $self->{pids}{$port};
        return $self->sentinel_cli($port, @args);
    }

    return '';
}

sub run_cli {
    my ($port, $pw, @args) = @_;

    my @cmd = ('redis-cli', '-h', '127.0.0.1', '-p', $port);
    push @cmd, '-a', $pw, '--no-auth-warning' if $pw;

    my $pid = open(my $fh, '-|');
    die "fork: $!\n" unless defined $pid;

    if ($pid == 0) {
        open STDERR, '>', '/dev/null';
        exec @cmd, @args or POSIX::_exit(127);
    }

    local $/;
    my $out = <$fh> // '';
    close $fh;
    $out =~ s/\s+\z//;
    return $out;
}

# "key\nvalue\n..." replies as a hash
sub fields {
    my ($self, $port, @args) = @_;
    my @l = split /\n/, $self->sentinel_cli($port, @args);
    return @l % 2 ? () : @l;
}

# where the sentinels say the master is (the first sentinel that answers)
sub master_port {
    my ($self) = @_;
    my $out = $self->sentinel('SENTINEL', 'get-master-addr-by-name',
                              $self->{name});
    my (undef, $port) = split /\n/, $out;
    return $port;
}

# SIGKILL (default) or another signal to the server on that port
sub kill_server {
    my ($self, $port, $sig) = @_;
    my $pid = delete $self->{pids}{$port} or return;

    kill $sig // 'KILL', $pid;

    # TERM: a few seconds to exit, then KILL
    for (1 .. 60) {
        last if waitpid($pid, POSIX::WNOHANG()) != 0;
        Time::HiRes::sleep(0.05);
        kill 'KILL', $pid if $_ == 60;
    }

    waitpid($pid, 0);
    delete $Live{$pid};
}

sub stop {
    my ($self) = @_;

    for my $port (keys %{ $self->{pids} }) {
        $self->kill_server($port, 'TERM');
    }

    if ($self->{proxy_pid}) {
        DelayProxy::stop(delete $self->{proxy_pid});
    }
}

sub DESTROY { $_[0]->stop }

# the last resort: whatever is left when the test exits
END {
    my $status = $?;
    for my $pid (keys %Live) {
        kill 'KILL', $pid;
        waitpid($pid, 0);
    }
    $? = $status;
}

1;
