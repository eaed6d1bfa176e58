# Helpers shared by scripts/*.sh. Sourced, never run; POSIX sh.
# shellcheck shell=sh disable=SC2034

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# build/, or the per-version directory the Makefile chose (BUILD_DIR)
BUILD=${BUILD_DIR:-$ROOT/build}
# tarballs of nginx, hiredis and Test::Nginx for the version matrix (CI)
SHARED_DIR=${SHARED_DIR:-$ROOT/../shared}

die() {
    echo "$(basename "$0"): $*" >&2
    exit 1
}

# port_free PORT: succeeds when 127.0.0.1:PORT can be bound (nothing listens).
port_free() {
    perl -MIO::Socket::INET -e '
        exit(IO::Socket::INET->new(LocalAddr => "127.0.0.1",
            LocalPort => $ARGV[0], Listen => 1, ReuseAddr => 1) ? 0 : 1)' "$1"
}

# free_port: prints a loopback port that nothing listens on right now.
free_port() {
    perl -MIO::Socket::INET -e '
        my $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1",
            LocalPort => 0, Listen => 1) or die "bind: $!\n";
        print $s->sockport, "\n"'
}

# need_port PORT WHAT: fail with a clear message when PORT is taken.
need_port() {
    port_free "$1" || die "port $1 ($2) is already in use on 127.0.0.1;" \
        "pick another one, e.g. make run $3=<port>"
}

# wait_port PORT SECONDS [PID]: wait until something accepts on 127.0.0.1:PORT;
# gives up early when PID (the process expected to listen) has exited.
wait_port() {
    _n=$(($2 * 20))
    while [ "$_n" -gt 0 ]; do
        if bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; then
            return 0
        fi
        if [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null; then
            return 1
        fi
        sleep 0.05
        _n=$((_n - 1))
    done
    return 1
}

# pid_of PIDFILE NAME: prints the pid in PIDFILE if that process is alive
# and its command line mentions NAME (so a recycled pid is never signalled).
pid_of() {
    [ -r "$1" ] || return 1
    _pid=$(cat "$1" 2>/dev/null) || return 1
    case $_pid in ''|*[!0-9]*) return 1 ;; esac
    tr '\0' ' ' 2>/dev/null < "/proc/$_pid/cmdline" | grep -q -- "$2" \
        || return 1
    echo "$_pid"
}

# stop_pid PID [SIGNAL [SECONDS]]: signal PID and wait until it is gone;
# SIGKILL when it outlives the grace period.
stop_pid() {
    kill -"${2:-TERM}" "$1" 2>/dev/null || return 0
    _n=$((${3:-10} * 20))
    while kill -0 "$1" 2>/dev/null; do
        # a zombie has exited already: its parent reaps it
        grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null && return 0
        _n=$((_n - 1))
        if [ "$_n" -le 0 ]; then
            echo "$(basename "$0"): pid $1 ignored SIG${2:-TERM}, killing it" >&2
            kill -KILL "$1" 2>/dev/null || true
            _n=20
        fi
        sleep 0.05
    done
}

# pids_named NAME...: pids of processes whose command name is one of NAMEs
# (reads /proc: procps is not installed on slim images).
pids_named() {
    for _d in /proc/[0-9]*; do
        read -r _comm < "$_d/comm" 2>/dev/null || continue
        for _name in "$@"; do
            [ "$_comm" = "$_name" ] && echo "${_d#/proc/}"
        done
    done
    return 0
}
