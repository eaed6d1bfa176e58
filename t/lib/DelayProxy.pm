package DelayProxy;

# A TCP proxy in a child process that holds what its clients send for a
# while before it passes it on (replies go back at once): with it between
# nginx and Redis, a command nginx sends reaches Redis late.
#
#   my ($pid, $port) = DelayProxy::start($target_port, $seconds);
#   # or what the target sends is held instead (a replica that lags: the
#   # master's stream reaches it late, its acknowledgements go at once)
#   my ($pid, $port) = DelayProxy::start($master_port, $seconds, 'replies');
#   ...
#   DelayProxy::mute($pid);     # from now on what clients send is dropped
#   DelayProxy::stop($pid);
#
# Muted, it still accepts and connects: nginx's commands go unanswered, as
# with a Redis that hangs.

use strict;
use warnings;
use IO::Socket::INET;
use IO::Select;
use POSIX ();
use Time::HiRes qw(time);

sub start {
    my ($target, $delay, $which) = @_;
    my $replies = ($which // '') eq 'replies';

    my $l = IO::Socket::INET->new(Listen => 16, LocalAddr => '127.0.0.1',
                                  LocalPort => 0, Proto => 'tcp',
                                  ReuseAddr => 1)
        or die "delay proxy: listen: $!\n";
    my $port = $l->sockport;
    my $parent = $$;

    my $pid = fork;
    die "delay proxy: fork: $!\n" unless defined $pid;

    if ($pid) {
        close $l;
        return ($pid, $port);
    }

    # the test's own handlers (its cleanup on TERM, say) are not ours
    $SIG{$_} = 'DEFAULT' for qw(INT TERM HUP);

    my $sel = IO::Select->new($l);
    my (%peer, %delayed, @queue);
    my $mute = 0;

    local $SIG{USR1} = sub { $mute = 1 };

    my $drop = sub {
        my ($fh) = @_;
        my @pair = ($fh);
        push @pair, $peer{$fh} if $peer{$fh};
        for my $h (@pair) {
            $sel->remove($h);
            delete $peer{$h};
            delete $delayed{$h};
            close $h;
        }
    };

    while (getppid() == $parent) {
        my $wait = @queue ? $queue[0][0] - time : 0.5;
        $wait = 0 if $wait < 0;

        for my $fh ($sel->can_read($wait)) {
            if ($fh == $l) {
                my $c = $l->accept or next;
                my $u = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                              PeerPort => $target,
                                              Proto => 'tcp');
                if (!$u) {
                    close $c;
                    next;
                }
                $peer{$c} = $u;
                $peer{$u} = $c;
                $delayed{$replies ? $u : $c} = 1;
                $sel->add($c, $u);
                next;
            }

            next unless $peer{$fh};

            my $n = sysread($fh, my $buf, 1 << 20);
            if (!$n) {
                $drop->($fh);
                next;
            }

            if ($delayed{$fh} && $mute) {
                next;
            }

            if ($delayed{$fh}) {
                push @queue, [time + $delay, $peer{$fh}, $buf];
            } else {
                put($peer{$fh}, $buf);
            }
        }

        while (@queue && $queue[0][0] <= time) {
            my $q = shift @queue;
            put($q->[1], $q->[2]) if $peer{$q->[1]};
        }
    }

    POSIX::_exit(0);
}

sub put {
    my ($fh, $buf) = @_;
    while (length $buf) {
        my $n = syswrite($fh, $buf);
        return unless $n;
        substr($buf, 0, $n) = '';
    }
}

sub mute {
    my ($pid) = @_;
    # taken before the proxy reads again (safe signals: at its next op)
    kill 'USR1', $pid;
}

sub stop {
    my ($pid) = @_;
    local $?;
    return unless $pid;
    kill 'TERM', $pid;
    waitpid $pid, 0;
}

1;
