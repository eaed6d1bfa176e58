#!/usr/bin/env bash
# Builds a Redis or Valkey server from SHARED_DIR/redis/<name>.tar.gz into
# build/redis/<name>/ (once: an existing build is kept) and prints the
# directory to put first on PATH, which holds its redis-server.
#
#   scripts/redis-servers.sh NAME...     e.g. 6.0.20, 7.2.6, valkey-8.0.1
#
# A bare version means Redis (redis-6.0.20.tar.gz).  Only the server is
# built (src/redis-server or src/valkey-server, with TLS, libc's malloc:
# no jemalloc); Valkey's gets a redis-server link, since the tests start
# "redis-server" (and "redis-server --sentinel": the same binary).
# redis-cli stays Debian's (redis-tools), which speaks to all of them.
set -eu
. "$(dirname "$0")/lib.sh"

# the checkout's own build/redis/, also when called from the ASan tree's
# mirror (build/asan/scripts is a link here): one build for every run
SERVERS=$(cd -P "$(dirname "$0")/.." && pwd)/build/redis

build_one() {
    local name=$1 dir src tarball bin
    case $name in
        valkey-*|redis-*) ;;
        *) name=redis-$name ;;
    esac
    dir=$SERVERS/$name
    case $name in
        valkey-*) bin=valkey-server ;;
        *) bin=redis-server ;;
    esac
    if [ -x "$dir/bin/redis-server" ]; then
        echo "$dir/bin"
        return 0
    fi
    tarball=$SHARED_DIR/redis/$name.tar.gz
    [ -r "$tarball" ] || die "no $tarball (known: $(cd "$SHARED_DIR/redis" \
        2>/dev/null && ls -- *.tar.gz 2>/dev/null | tr '\n' ' '))"
    src=$dir/src
    rm -rf "$dir"
    mkdir -p "$src" "$dir/bin"
    tar xzf "$tarball" -C "$src" --strip-components=1
    echo "redis-servers: building $name in $src" >&2
    # the server alone: its objects pull in the bundled dependencies
    # (hiredis, lua, hdr_histogram ...) through .make-prerequisites
    # (GIT_CEILING_DIRECTORIES: the version header's git sha must not be
    # this repository's)
    GIT_CEILING_DIRECTORIES=$SERVERS \
    make -C "$src/src" -j"${JOBS:-2}" BUILD_TLS=yes MALLOC=libc "$bin" \
        > "$dir/build.log" 2>&1 \
        || { tail -n 30 "$dir/build.log" >&2; die "$name: build failed" \
             "($dir/build.log)"; }
    cp "$src/src/$bin" "$dir/bin/$bin"
    [ "$bin" = redis-server ] || ln -s "$bin" "$dir/bin/redis-server"
    # the sources are not needed any more
    rm -rf "$src"
    echo "$dir/bin"
}

[ $# -gt 0 ] || die "usage: $0 NAME... (e.g. 6.0.20 6.2.16 7.2.6 valkey-8.0.1)"
for n in "$@"; do
    build_one "$n"
done
