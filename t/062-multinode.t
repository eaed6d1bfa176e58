# Many nginx nodes (issue #8 item 1): bench/storm.py --nodes N starts N
# nginx instances (own configurations, ports and prefixes) in front of one
# Redis and one counting upstream; client j of a key sends its attempt n to
# node (j + n) mod N, so the clients and the retries of every key cross
# nodes.  No key may run twice, all its clients must get the same answer.
#
# A plain Test::More file like t/060-storm.t; run from the repository root.

use strict;
use warnings;
use Test::More;
use lib 't/lib';
use StormRun qw(python storm_passes summary);

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'python3 not found' unless python();
plan skip_all => 'bench/storm.py not found (run from the repository root)'
    unless -f 'bench/storm.py';

delete $ENV{TEST_NGINX_REDIS_PORT};
my $run;

$run = storm_passes('3 nodes', '--keys', 150, '--nodes', 3);
like(summary($run, 'nodes per key'), qr/^150 keys on 3 nodes$/,
     '3 nodes: every key was sent to all three nodes');
my %nodes = map { /^(n\d+):/ ? ($1 => 1) : () }
            split /,\s*/, summary($run, 'executions by worker');
is(scalar(keys %nodes), 3, '3 nodes: each node ran some of the keys');

# the same across reloads of both nodes
$run = storm_passes('2 nodes, reloads', '--keys', 120, '--nodes', 2,
                    '--chaos', 'reload', '--chaos-events', 4,
                    '--chaos-start', '0.5s', '--chaos-interval', '0.5s');
like(summary($run, 'chaos'), qr/\breload 4\b/,
     '2 nodes, reloads: four reloads, two of each node');

done_testing();
