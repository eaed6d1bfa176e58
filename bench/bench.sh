#!/bin/sh
# make bench: throughput, latency and Redis round trips of the module next
# to nginx's ceiling, plain proxy_pass, srcache+memc and a Lua peer.
# Everything runs on 127.0.0.1 and is stopped again; see bench/README.md.
#
#   bench/bench.sh [--quick] [--duration S] [--connections C] [--only ...]
#   bench/bench.sh --soak 1000000     RSS of the workers over many requests
#   bench/bench.sh --profile          callgrind instructions per request
#   bench/bench.sh --help
set -eu
cd "$(dirname "$0")/.."
command -v python3 > /dev/null || {
    echo "bench: python3 is needed (scripts/setup.sh bench)" >&2
    exit 1
}
exec python3 bench/bench.py "$@"
