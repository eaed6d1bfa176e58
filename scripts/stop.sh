#!/bin/sh
# make stop: stop what `make run` started, by the pids it left in build/run/.
#   scripts/stop.sh [--quiet]
set -eu
. "$(dirname "$0")/lib.sh"

run=$BUILD/run
say() {
    [ "${1:-}" = --quiet ] || echo "stop: $2"
}

stopped=
# run.sh stops its nginx and redis itself when it gets SIGTERM ...
if pid=$(pid_of "$run/run.pid" run.sh); then
    stop_pid "$pid" TERM 20
    stopped=yes
fi
# ... and whatever it left behind (run.sh killed with -9) goes too.
if pid=$(pid_of "$run/nginx.pid" "$run/"); then
    stop_pid "$pid"
    stopped=yes
fi
if pid=$(pid_of "$run/redis.pid" redis-server); then
    stop_pid "$pid"
    stopped=yes
fi
rm -f "$run/run.pid" "$run/redis.pid"

if [ -n "$stopped" ]; then
    say "${1:-}" "make run stopped"
else
    say "${1:-}" "nothing from make run is running"
fi
