# Retry storm: bench/storm.py --short (200 keys x 8 concurrent, retrying
# clients against nginx with 2 workers) must see every key run exactly once
# upstream and every client of a key end with the same 2xx answer.
#
# A plain Test::More file, not a Test::Nginx one: storm.py starts its own
# nginx, upstream and (unless TEST_NGINX_REDIS_PORT is set) Redis, all on
# 127.0.0.1, and stops them again.  Run from the repository root (prove does).

use strict;
use warnings;
use Test::More;
use File::Spec;
use POSIX ();

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};

my ($python) = grep { -x $_ && !-d _ }
               map { File::Spec->catfile($_, 'python3') }
               File::Spec->path;
plan skip_all => 'python3 not found' unless $python;
plan skip_all => 'bench/storm.py not found (run from the repository root)'
    unless -f 'bench/storm.py';

plan tests => 3;

# storm.py caps itself with --duration-limit; the alarm is the last resort.
my $limit = $ENV{TEST_STORM_DURATION_LIMIT} || 240;
my @cmd = ($python, 'bench/storm.py', '--short',
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
    kill 'TERM', $pid;              # storm.py stops its servers on TERM
};
close $out;                         # waits for storm.py
my $status = $?;
my $code = $status & 127 ? 128 + ($status & 127) : $status >> 8;

ok(!$timed_out, 'storm.py finished in time');
is($code, 0, 'storm.py exited with 0')
    or diag join '', @lines[-($#lines < 40 ? @lines : 40) .. -1];

my $last = @lines ? $lines[-1] : '';
$last =~ s/\s+\z//;
like($last, qr/^\d+ passed, 0 failed$/, 'last line reports 0 failed')
    or diag "last line: '$last'";
