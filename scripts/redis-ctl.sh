#!/bin/sh
# Control the private Redis of `make test`, so that tests can take it away
# and bring it back between requests.
#
#   scripts/redis-ctl.sh start|stop|kill|restart|status|port|cli [ARGS...]
#
#   start    start it (daemonized) and wait until it accepts connections
#   stop     SIGTERM and wait until it is gone (no RDB is written)
#   kill     SIGKILL: the crash case; connections drop without a goodbye
#   restart  stop, then start (same port, empty data set)
#   status   exit 0 when it runs
#   port     print its port
#   cli      redis-cli against it, e.g. `cli flushall`, `cli --scan`
#
# It reads the configuration written by scripts/test.sh, TEST_NGINX_REDIS_CONF
# (default build/test/redis.conf): port and pidfile come from there.
set -eu
. "$(dirname "$0")/lib.sh"

conf=${TEST_NGINX_REDIS_CONF:-$BUILD/test/redis.conf}
[ -r "$conf" ] || die "no $conf: scripts/test.sh writes it"
port=$(sed -n 's/^port  *//p' "$conf")
pidfile=$(sed -n 's/^pidfile  *//p' "$conf")

running() {
    pid_of "$pidfile" redis-server
}

start() {
    running > /dev/null && return 0
    redis-server "$conf" > /dev/null
    wait_port "$port" 10 || die "redis-server did not start on port $port"
    # the pidfile comes a moment after the port: wait for it too
    n=100
    until running > /dev/null; do
        n=$((n - 1))
        [ "$n" -gt 0 ] || die "redis-server wrote no $pidfile"
        sleep 0.02
    done
}

stop() {
    if pid=$(running); then
        stop_pid "$pid" "$1"
    fi
    rm -f "$pidfile"
}

case ${1:-} in
    start)   start ;;
    stop)    stop TERM ;;
    kill)    stop KILL ;;
    restart) stop TERM; start ;;
    status)  running > /dev/null ;;
    port)    echo "$port" ;;
    cli)     shift; exec redis-cli -h 127.0.0.1 -p "$port" "$@" ;;
    *)       die "usage: $0 start|stop|kill|restart|status|port|cli [ARGS...]" ;;
esac
