package StormRun;

# Runs bench/storm.py from a plain Test::More file (t/060-storm.t,
# t/061-chaos.t, t/062-multinode.t) and checks its verdict.  storm.py
# starts its own nginx, upstream and Redis on 127.0.0.1 and stops them
# again, also on SIGTERM, which is what this sends when a run overstays its
# alarm.

use strict;
use warnings;
use Exporter 'import';
use File::Spec;
use POSIX ();
use Test::More;

our @EXPORT_OK = qw(python storm storm_passes summary);

sub python {
    my ($python) = grep { -x $_ && !-d _ }
                   map { File::Spec->catfile($_, 'python3') }
                   File::Spec->path;
    return $python;
}

# storm(@args): runs storm.py with @args (and a --duration-limit), every
# output line noted; returns { code, lines, timed_out }.
sub storm {
    my (@args) = @_;
    my $limit = $ENV{TEST_STORM_DURATION_LIMIT} || 120;
    my @cmd = (python(), 'bench/storm.py', @args,
               '--duration-limit', "${limit}s");
    note "running: @cmd";

    my $pid = open(my $out, '-|');
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        exec @cmd or POSIX::_exit(127);
    }

    my @lines;
    my $timed_out = 0;
    eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm($limit + 60);
        while (my $line = <$out>) {
            push @lines, $line;
            note $line =~ s/\n\z//r;
        }
        alarm(0);
        1;
    } or do {
        alarm(0);
        $timed_out = 1;
        kill 'TERM', $pid;
    };
    close $out;
    my $status = $?;
    my $code = $status & 127 ? 128 + ($status & 127) : $status >> 8;
    return { code => $code, lines => \@lines, timed_out => $timed_out };
}

# storm_passes($name, @args): three tests: in time, exit 0, "N passed, 0
# failed" as the last line.  Returns the run.
sub storm_passes {
    my ($name, @args) = @_;
    my $run = storm(@args);
    my @lines = @{ $run->{lines} };

    ok(!$run->{timed_out}, "$name: storm.py finished in time");
    is($run->{code}, 0, "$name: storm.py exited with 0")
        or diag join '', @lines[-($#lines < 40 ? @lines : 40) .. -1];
    my $last = @lines ? $lines[-1] : '';
    $last =~ s/\s+\z//;
    like($last, qr/^\d+ passed, 0 failed$/, "$name: no key failed")
        or diag "last line: '$last'";
    return $run;
}

# summary($run, 'retries'): the text after "retries:" in the summary
sub summary {
    my ($run, $label) = @_;
    for my $line (@{ $run->{lines} }) {
        return $1 if $line =~ /^\Q$label\E:\s*(.*?)\s*$/;
    }
    return '';
}

1;
