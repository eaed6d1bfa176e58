#!/bin/sh
# Install the Debian 12 packages needed to build, run and test the module.
#
#   scripts/setup.sh [SET]         SET: build run test valgrind asan fuzz
#                                       lint deb docs bench image [all]
#   scripts/setup.sh --list SET    print the packages of SET, install nothing
#
# A quick no-op when everything is installed. Otherwise, as root, runs
# apt-get update + install non-interactively and makes sure the services
# that nginx's and redis-server's packages would start are not left running.
set -eu
. "$(dirname "$0")/lib.sh"

build="gcc make libc6-dev dpkg-dev nginx nginx-dev libhiredis-dev libssl-dev
       libpcre2-dev zlib1g-dev"
run="redis-server redis-tools curl"
# t/150-roads.t: fcgiwrap (the fastcgi_pass road), python3-h2 (its HTTP/2
# client); t/152-stripe.t: python3-stripe (a real client with a timeout);
# t/156-subrequest.t: the Lua module (an operation run in a subrequest);
# t/194-cache-crash.t: gdb (a worker killed inside the cache's lock);
# t/201-prometheus.t: prometheus (with promtool: the status output, the
# alert rules and the dashboard's queries checked by the real tools)
test="perl libtest-base-perl libcmocka-dev python3 openssl fcgiwrap
      python3-h2 python3-stripe libnginx-mod-http-ndk libnginx-mod-http-lua
      gdb prometheus"
# what the real Test::Nginx needs besides Test::Base (make test
# TEST_NGINX_LIB=...: the suite under openresty's runner)
test="$test libtext-diff-perl libtest-longstring-perl liblist-moreutils-perl
      liburi-perl libhttp-message-perl"
valgrind="valgrind"
# make bench: load generator, the peers it compares with (srcache + memc
# with memcached, lua-nginx-module with lua-resty-redis), the profilers
bench="wrk memcached libnginx-mod-http-ndk libnginx-mod-http-srcache-filter
       libnginx-mod-http-memc libnginx-mod-http-lua lua-nginx-redis valgrind
       linux-perf"
asan="libasan8"                    # gcc 12's ASan runtime: make test-asan
fuzz="clang libclang-rt-14-dev"    # clang 14 and its libFuzzer: make fuzz
image="nginx libhiredis0.14 curl"   # the Docker image's runtime
lint="cppcheck clang-tidy"         # make lint
# make deb: debhelper with nginx-dev's dh_nginx (in the build set)
deb="debhelper dpkg-dev fakeroot"
docs="graphviz"                    # make docs: docs/diagrams/*.dot -> .svg

list=
if [ "${1:-}" = --list ]; then
    list=yes
    shift
fi

case ${1:-all} in
    build)        want=$build ;;
    run)          want="$build $run" ;;
    test)         want="$build $run $test" ;;
    valgrind)     want="$build $run $test $valgrind" ;;
    asan)         want="$build $run $test $asan" ;;
    fuzz)         want=$fuzz ;;
    lint)         want="$build $lint $fuzz" ;;   # check-src builds the fuzz targets
    deb)          want="$build $deb" ;;
    docs)         want=$docs ;;
    all)          want="$build $run $test $valgrind $asan $fuzz $lint $deb $docs" ;;
    bench)        want="$build $run python3 $bench" ;;
    image)        want=$image ;;
    *)            die "usage: $0 [build|run|test|valgrind|asan|fuzz|lint|deb|docs|bench|image|all]" ;;
esac

if [ -n "$list" ]; then
    # shellcheck disable=SC2086 # one word per package
    printf '%s\n' $want
    exit 0
fi

# missing_of PACKAGE...: prints those not installed (one dpkg-query call).
missing_of() {
    _ok=" $(dpkg-query -W -f='${Package}=${Status}\n' "$@" 2>/dev/null \
        | sed -n 's/=install ok installed$//p' | tr '\n' ' ') "
    for _p in "$@"; do
        case $_ok in *" $_p "*) ;; *) printf ' %s' "$_p" ;; esac
    done
}

missing=$(missing_of $want)
[ -n "$missing" ] || exit 0

apt="apt-get install -y --no-install-recommends$missing"
if [ "$(id -u)" != 0 ]; then
    die "missing packages:$missing
Install them as root (or run 'sudo $0 ${1:-all}'):
    apt-get update && $apt"
fi

echo "setup: installing$missing"
export DEBIAN_FRONTEND=noninteractive

# Package scripts start nginx (port 80), redis-server (port 6379),
# memcached (port 11211), fcgiwrap and prometheus (port 9090) unless
# policy-rc.d says no. Docker
# images ship one; add ours when there is none.
policy=/usr/sbin/policy-rc.d
if [ ! -e $policy ]; then
    printf '#!/bin/sh\n# added by scripts/setup.sh for its apt-get run\nexit 101\n' \
        > $policy
    chmod 755 $policy
    trap 'rm -f $policy' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
fi
before=" $(pids_named nginx redis-server memcached fcgiwrap prometheus | tr '\n' ' ') "

apt-get update
apt-get install -y --no-install-recommends $missing

# Whatever a package script still managed to start goes away again.
new=
for pid in $(pids_named nginx redis-server memcached fcgiwrap prometheus); do
    case $before in *" $pid "*) ;; *) new="$new $pid" ;; esac
done
if [ -n "$new" ] && [ -d /run/systemd/system ]; then
    systemctl stop nginx.service redis-server.service memcached.service \
        fcgiwrap.service fcgiwrap.socket prometheus.service \
        || true
fi
for pid in $new; do
    kill -0 "$pid" 2>/dev/null || continue
    echo "setup: stopping $(cat /proc/$pid/comm) (pid $pid)," \
        "started by a package script"
    stop_pid "$pid"
done

left=$(missing_of $want)
[ -z "$left" ] || die "these packages did not install:$left"
echo "setup: done"
