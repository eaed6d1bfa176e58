#!/usr/bin/env bash
# make test: unit tests (t/unit/*.c, cmocka), then prove over t/*.t against
# build/ngx_http_idempotency_module.so and a private Redis.
#
#   scripts/test.sh [--valgrind]      TESTS="t/a.t t/b.t" runs a subset
#
# What a .t file can rely on (exported here):
#   TEST_NGINX_REDIS_PORT    port of the private Redis on 127.0.0.1
#   TEST_NGINX_REDIS_CTL     scripts/redis-ctl.sh (start|stop|kill|restart|cli)
#   TEST_NGINX_REDIS_CONF    its configuration; TEST_NGINX_REDIS_PIDFILE its pid
#   TEST_NGINX_LOAD_MODULES, TEST_NGINX_BINARY, TEST_NGINX_SERVROOT
# REDIS=6.0.20 (make test REDIS=...): that server (scripts/redis-servers.sh
# builds it once) comes first on PATH, for every redis-server the tests
# start; redis-cli stays Debian's.
set -eu
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

valgrind=
[ "${1:-}" = --valgrind ] && valgrind=yes
out=$BUILD/test
mkdir -p "$out"

# Two runs in one checkout would share servroot and Redis: take turns.
exec 9> "$out/lock"
if ! flock -n 9; then
    echo "test: waiting for another make test in this checkout"
    flock 9
fi

# -I flags of the module build (nginx headers, src/, generated headers),
# made absolute: nginx's Makefile names them relative to its tree.
module_incs() {
    make -s --no-print-directory -C "$BUILD/nginx-src" -f "$BUILD/objs/Makefile" \
        --eval 'print-incs: ; @echo $(ALL_INCS)' print-incs \
        | sed "s|-I \([^/]\)|-I $BUILD/nginx-src/\1|g"
}

# Each t/unit/NAME.c is linked with the module's pure sources into
# build/unit/NAME and run. UNIT_SANITIZE= turns the sanitizers off.
unit_tests() {
    local t bin srcs=() incs
    for t in src/ngx_http_idempotency_key.c src/ngx_http_idempotency_record.c \
             src/ngx_http_idempotency_slot.c; do
        [ -f "$t" ] && srcs+=("$t")
    done
    incs=$(module_incs)
    mkdir -p "$BUILD/unit"
    for t in t/unit/*.c; do
        bin=$BUILD/unit/$(basename "$t" .c)
        # shellcheck disable=SC2086
        if ! gcc -g -O1 -Wall -Wextra -Werror \
                ${UNIT_SANITIZE--fsanitize=address,undefined -fno-sanitize-recover=all} \
                $incs -o "$bin" "$t" "${srcs[@]}" -lcmocka; then
            unit_failed="$unit_failed $t (build)"
        elif ! "$bin"; then
            unit_failed="$unit_failed $t"
        fi
    done
}

redis_conf() {
    local port=${TEST_NGINX_REDIS_PORT:-$(free_port)}
    port_free "$port" || die "port $port (TEST_NGINX_REDIS_PORT) is in use"
    mkdir -p "$out/redis"
    cat > "$out/redis.conf" <<CONF
bind 127.0.0.1
port $port
daemonize yes
pidfile $out/redis.pid
logfile $out/redis.log
dir $out/redis
save ""
appendonly no
CONF
    export TEST_NGINX_REDIS_PORT=$port
}

# Whatever happens (failure, Ctrl-C): no Redis and no test nginx left behind.
cleanup() {
    local pid
    if pid=$(pid_of "$out/servroot/logs/nginx.pid" "$out/servroot/"); then
        stop_pid "$pid"
    fi
    "$ROOT/scripts/redis-ctl.sh" stop
}

# Which Test::Nginx runs the .t files: TEST_NGINX_LIB=DIR (a lib/ holding
# Test/Nginx/Socket.pm), TEST_NGINX_LIB=shared (the copy in
# SHARED_DIR/test-nginx/, extracted into build/test-nginx/), else the one
# Perl finds, else the bundled stand-in t/runner.
test_nginx_lib() {
    local dir=${TEST_NGINX_LIB:-} tarball
    if [ "$dir" = shared ]; then
        dir=$ROOT/build/test-nginx/lib
        if [ ! -f "$dir/Test/Nginx/Socket.pm" ]; then
            tarball=$(ls "$SHARED_DIR"/test-nginx/test-nginx-*.tar.gz 2>/dev/null \
                      | tail -n 1)
            [ -n "$tarball" ] || die "no $SHARED_DIR/test-nginx/test-nginx-*.tar.gz"
            rm -rf "$ROOT/build/test-nginx"
            mkdir -p "$ROOT/build/test-nginx"
            tar xzf "$tarball" -C "$ROOT/build/test-nginx" --strip-components=1
        fi
    fi
    if [ -n "$dir" ]; then
        perl -I"$dir" -MTest::Nginx::Socket -e1 \
            || die "cannot load Test::Nginx from $dir (scripts/setup.sh test" \
                   "installs the Perl modules it needs)"
        inc+=(-I"$dir")
        echo "test: Test::Nginx from $dir"
    elif perl -MTest::Nginx::Socket -e1 2> /dev/null; then
        echo "test: Test::Nginx $(perl -MTest::Nginx::Socket \
            -e 'print $Test::Nginx::Socket::VERSION // ""') from Perl's @INC"
    else
        inc+=(-It/runner)
        echo "test: the bundled runner t/runner (Test::Nginx is not installed)"
    fi
    echo "test: $("$TEST_NGINX_BINARY" -v 2>&1), module $TEST_NGINX_LOAD_MODULES"
    echo "test: the module loads $(ldd "$TEST_NGINX_LOAD_MODULES" 2>/dev/null \
        | sed -n 's/^[[:space:]]*\(libhiredis[^ ]*\) => \([^ ]*\).*/\1 (\2)/p')"
}

prove_tests() {
    local tests inc=(-It/lib)
    # shellcheck disable=SC2206 # TESTS: several names or globs
    tests=(${TESTS:-t/*.t})
    [ -e "${tests[0]}" ] || { echo "test: no tests in ${TESTS:-t/*.t}"; return 1; }

    if [ -n "${REDIS:-}" ]; then
        PATH=$("$ROOT/scripts/redis-servers.sh" "$REDIS"):$PATH
        export PATH
    fi
    echo "test: $(command -v redis-server): $(redis-server --version)"
    redis_conf
    export TEST_NGINX_REDIS_CONF=$out/redis.conf
    export TEST_NGINX_REDIS_PIDFILE=$out/redis.pid
    export TEST_NGINX_REDIS_CTL=$ROOT/scripts/redis-ctl.sh
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    "$TEST_NGINX_REDIS_CTL" start 9>&- || return 1

    export TEST_NGINX_BINARY=${NGINX_BIN:-/usr/sbin/nginx}
    export TEST_NGINX_LOAD_MODULES=$BUILD/ngx_http_idempotency_module.so
    export TEST_NGINX_SERVROOT=$out/servroot
    export TEST_NGINX_NO_SHUFFLE=1
    # a free port rather than Test::Nginx's fixed 1984: another checkout's
    # run (or anything else on 1984) must not meet ours
    export TEST_NGINX_SERVER_PORT=${TEST_NGINX_SERVER_PORT:-$(free_port)}
    if [ -n "$valgrind" ]; then
        export TEST_NGINX_USE_VALGRIND=1
        export TEST_NGINX_VALGRIND_LOG=$out/valgrind.log
        export TEST_NGINX_TIMEOUT=${TEST_NGINX_TIMEOUT:-20}
        export TEST_NGINX_SLEEP=${TEST_NGINX_SLEEP:-0.2}
        : > "$TEST_NGINX_VALGRIND_LOG"
    fi
    test_nginx_lib

    # shellcheck disable=SC2086
    prove "${inc[@]}" ${PROVE_FLAGS:-} "${tests[@]}" 9>&-
}

status=0
unit_failed=
if compgen -G 't/unit/*.c' > /dev/null; then
    unit_tests
fi
prove_tests || status=1
if [ -n "$unit_failed" ]; then
    echo "test: unit tests failed:$unit_failed" >&2
    status=1
fi
if [ -n "$valgrind" ]; then
    scripts/valgrind-check.sh "$out/valgrind.log" || status=1
fi
exit $status
