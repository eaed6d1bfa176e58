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
use lib 't/lib';
use StormRun qw(python storm_passes);

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'python3 not found' unless python();
plan skip_all => 'bench/storm.py not found (run from the repository root)'
    unless -f 'bench/storm.py';

plan tests => 3;

# storm.py caps itself with --duration-limit; the alarm is the last resort.
local $ENV{TEST_STORM_DURATION_LIMIT} = $ENV{TEST_STORM_DURATION_LIMIT}
                                        || 240;
storm_passes('short storm', '--short');
