#!/usr/bin/env bash
# Build the dynamic module against an nginx source tree, the Debian way.
#
#   scripts/build.sh signature|configure|module|check-load|check-src
#   scripts/build.sh check-includes|check-layers [DIR]|check-fuzz
#
# Quiet unless V=1 (make V=1 build): the compiler's command lines go to
# build/make.log and are shown only when the build fails.
#
# NGINX_SRC is Debian's nginx-dev tree (/usr/share/nginx/src, configured with
# the flags in its conf_flags, so the .so matches /usr/sbin/nginx) or a plain
# nginx source tree (configured with --with-compat). Either way configure runs
# in a private mirror of the tree under build/: the tree itself is only read.
#
# NGINX_VERSION=1.30.4 builds nginx itself too: the tarball
# SHARED_DIR/nginx/nginx-1.30.4.tar.gz is extracted into build/src/, configured
# with --with-compat and the modules the test suite uses, and make builds the
# binary (BUILD_DIR/objs/nginx) along with the module.
# HIREDIS=1.4.1 (with HIREDIS_INC and HIREDIS_LIB) builds that hiredis first
# (scripts/hiredis.sh); config then compiles and links the module against it.
set -eu
. "$(dirname "$0")/lib.sh"

if [ -n "${NGINX_VERSION:-}" ]; then
    NGINX_SRC=$ROOT/build/src/nginx-$NGINX_VERSION
    NGINX_BIN=$BUILD/objs/nginx
    if [ ! -f "$NGINX_SRC/src/core/nginx.h" ] && [ "${1:-}" = signature ]; then
        tarball=$SHARED_DIR/nginx/nginx-$NGINX_VERSION.tar.gz
        [ -f "$tarball" ] || die "no $tarball (SHARED_DIR=/path/to/shared)"
        echo "build: extracting $(basename "$tarball") into build/src/"
        rm -rf "$NGINX_SRC.tmp"
        mkdir -p "$NGINX_SRC.tmp"
        tar xzf "$tarball" -C "$NGINX_SRC.tmp"
        mv "$NGINX_SRC.tmp/nginx-$NGINX_VERSION" "$NGINX_SRC"
        rm -rf "$NGINX_SRC.tmp"
    fi
fi
if [ -n "${HIREDIS:-}" ] && [ "${1:-}" = signature ]; then
    "$ROOT/scripts/hiredis.sh" "$HIREDIS"
fi

NGINX_SRC=$(realpath "${NGINX_SRC:-/usr/share/nginx/src}")
NGINX_BIN=${NGINX_BIN:-/usr/sbin/nginx}
name=ngx_http_idempotency_module
tree=$BUILD/nginx-src       # mirror: symlinks into NGINX_SRC
objs=$BUILD/objs            # nginx's --builddir
sig=$BUILD/nginx.sig

[ -f "$NGINX_SRC/src/core/nginx.h" ] \
    || die "no nginx source tree at $NGINX_SRC (install nginx-dev or set NGINX_SRC)"

# Flags: Debian's hardening flags, position-independent, warnings are errors.
cd "$ROOT"      # dpkg-buildflags maps the cwd to '.' in debug info
cc_opt="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS)"
cc_opt="$cc_opt -fPIC -Wall -Wextra -Werror -g ${CC_OPT:-}"
ld_opt="$(dpkg-buildflags --get LDFLAGS) -fPIC ${LD_OPT:-}"
flags=(--with-compat)
if [ -n "${NGINX_VERSION:-}" ]; then
    # what t/*.t and the docs' examples use, nothing more (build time)
    flags+=(--with-debug --with-threads --with-http_ssl_module --with-http_v2_module
            --with-http_auth_request_module --with-http_sub_module
            --with-http_stub_status_module --with-http_realip_module
            --with-http_slice_module)
elif [ -f "$NGINX_SRC/conf_flags" ]; then
    . "$NGINX_SRC/conf_flags"
    flags=("${NGX_CONF_FLAGS[@]}")
fi
version=$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' "$NGINX_SRC/src/core/nginx.h")

# What the configure step depends on besides config and src/lua/*.lua.
signature() {
    mkdir -p "$BUILD"
    printf '%s\n' "nginx $version in $NGINX_SRC" "flags: ${flags[*]}" \
        "cc-opt: $cc_opt" "ld-opt: $ld_opt" \
        "hiredis: ${HIREDIS_INC:-system} ${HIREDIS_LIB:-system}" \
        "$(ls -l "${HIREDIS_LIB:-/nonexistent}"/libhiredis.so* 2>/dev/null)" \
        > "$sig.new"
    if cmp -s "$sig.new" "$sig"; then rm "$sig.new"; else mv "$sig.new" "$sig"; fi
}

configure() {
    echo "build: configuring against nginx $version ($NGINX_SRC)"
    rm -rf "$tree" "$objs"
    mkdir -p "$tree"
    # configure writes ./Makefile: give it a directory of our own.
    for f in "$NGINX_SRC"/*; do
        case ${f##*/} in Makefile|objs) continue ;; esac
        cp -rs "$f" "$tree/"
    done
    if ! (cd "$tree" && ./configure "${flags[@]}" \
            --with-cc-opt="$cc_opt" --with-ld-opt="$ld_opt" \
            --add-dynamic-module="$ROOT" --builddir="$objs") \
            > "$BUILD/configure.log" 2>&1; then
        tail -n 25 "$BUILD/configure.log" >&2
        rm -f "$objs/Makefile"
        die "configure failed, see build/configure.log"
    fi
    if [ "${V:-0}" = 1 ]; then
        grep -E 'idempotency|hiredis|libcrypto' "$BUILD/configure.log" || true
    fi
}

module() {
    local targets=(modules) jobs=()
    # nginx itself too when we built it from a tarball
    [ -n "${NGINX_VERSION:-}" ] && [ "${NGINX_BINARY:-yes}" = yes ] \
        && targets=(binary modules)
    # two jobs unless make's jobserver (make -jN) already shares some
    case " ${MAKEFLAGS:-} " in
        *jobserver*|*" -j"*) ;;
        *) jobs=(-j"${BUILD_JOBS:-2}") ;;
    esac
    if [ "${V:-0}" = 1 ]; then
        make --no-print-directory "${jobs[@]}" -f "$objs/Makefile" -C "$tree" \
            "${targets[@]}"
    elif ! make --no-print-directory "${jobs[@]}" -f "$objs/Makefile" \
            -C "$tree" "${targets[@]}" > "$BUILD/make.log" 2>&1; then
        tail -n 40 "$BUILD/make.log" >&2
        die "the module did not build, see build/make.log (V=1 shows it all)"
    fi
    # copy only on change, so that make sees an unchanged .so as up to date;
    # a new file renamed over the old one: an nginx running with the old
    # one (make run) keeps it mapped, where a copy written into it in place
    # would crash its workers as they start
    if ! cmp -s "$objs/$name.so" "$BUILD/$name.so"; then
        cp "$objs/$name.so" "$BUILD/$name.so.new"
        mv -f "$BUILD/$name.so.new" "$BUILD/$name.so"
    fi
}

# The .so loads into the nginx binary we run (same version and signature).
check_load() {
    # logs/: nginx -t writes its pid file there when nginx was built
    # without a --pid-path
    mkdir -p "$BUILD/check/logs"
    printf 'load_module %s;\nevents {}\n' "$BUILD/$name.so" \
        > "$BUILD/check/nginx.conf"
    "$NGINX_BIN" -q -t -e stderr -p "$BUILD/check/" -c "$BUILD/check/nginx.conf" \
        || die "$NGINX_BIN cannot load build/$name.so"
    echo "build: ${BUILD#"$ROOT"/}/$name.so loads into $NGINX_BIN"
}

# nginx's headers first: ngx_config.h defines _GNU_SOURCE and the feature
# macros, which a system header included before it would come too late for
# (nginx >= 1.24 then fails in ngx_event_udp.h). Each src/*.c's first
# #include is ngx_config.h or one of the module's own headers.
check_includes() {
    local f first bad=
    for f in "$ROOT"/src/*.c; do
        first=$(grep -m1 '^[[:space:]]*#[[:space:]]*include' "$f" || true)
        case $first in
            *'<ngx_config.h>'*|*'"ngx_http_idempotency_'*'.h"'*) ;;
            *) bad="$bad"$'\n'"  src/${f##*/}: ${first:-no #include}" ;;
        esac
    done
    [ -z "$bad" ] || die "system header before nginx's in:$bad"
    echo "build: every src/*.c includes nginx's or the module's header first"
}

# The layers hold (docs/architecture.md, "Who calls whom"), as
# scripts/callgraph.sh sees them: no HTTP-side file (any but redis*,
# cluster, sentinel, slot, record, key) is in a cycle over calls or
# includes; none calls a function of the ops, topology or connection
# layers, or includes one of their headers itself or through an HTTP-side
# header (the records header, ngx_http_idempotency_redis.h, is the way
# down: it brings their types); and no src/*.c is over 1,250 lines
# (DESIGN.md: about 1,200).  DIR is src/ by default.
check_layers() {
    local dir=${1:-$ROOT/src} graph bad
    graph=$("$ROOT/scripts/callgraph.sh" "$dir") \
        || die "scripts/callgraph.sh failed"
    bad=$(perl -e '
        use strict;
        use warnings;
        my ($dir, $graph) = @ARGV;
        my $lower = qr/^(?:redis_(?:ops|op|park|wait|sub|topology|resolve
                                    |node|tls)|cluster|sentinel)$/x;
        my $http = sub { $_[0] !~ /^(?:redis.*|cluster|sentinel|slot
                                       |record|key)$/x };
        my @bad;
        my $cycles = 0;
        for (split /\n/, $graph) {
            $cycles = 1 if /^cycles over calls and includes:/;
            if (!$cycles && /^(\S+) -> (\S+)  .*\bcalls (.*)$/) {
                my ($from, $to, $what) = ($1, $2, $3);
                push @bad, "$from calls $to: $what"
                    if $http->($from) && $to =~ $lower;
            }
            if ($cycles && /^  among (.*): /) {
                my @in = grep { $http->($_) } split " ", $1;
                push @bad, "a cycle among $1" if @in;
            }
        }
        for my $f (sort glob("$dir/*.[ch]")) {
            (my $base = $f) =~ s{^.*/}{};
            (my $n = $base) =~ s{^ngx_http_idempotency_(\w+)\.[ch]$}{$1};
            open my $in, "<", $f or die "$f: $!\n";
            while (<$in>) {
                next if !/^\s*#\s*include\s*"ngx_http_idempotency_(\w+)\.h"/;
                my $h = $1;
                push @bad, "$base includes ngx_http_idempotency_$h.h"
                    if $http->($n) && $h =~ $lower;
            }
            push @bad, "$base has $. lines, over 1,250"
                if $base =~ /\.c$/ && $. > 1250;
            close $in;
        }
        print map { "  $_\n" } @bad;
    ' "$dir" "$graph")
    [ -z "$bad" ] || die "the layers do not hold (scripts/callgraph.sh):"$'\n'"$bad"
    echo "build: no cycle on the HTTP side, nothing below the records layer" \
         "called or included from it, no src/*.c over 1,250 lines"
}

# The fuzz targets (fuzz/, make fuzz) still build against src/: they call
# functions of src/*.c by name and compile some of those files into
# themselves, so a function moved, renamed or made static breaks them, and
# nothing else builds them.  Built as make fuzz builds them (clang,
# -Werror, linked with libFuzzer), not run: a few seconds.  Skipped, saying
# so, without clang and its libFuzzer (scripts/setup.sh fuzz); fuzz_reply
# also needs the configured module build (make build) for nginx's headers.
check_fuzz() {
    local cc=${FUZZ_CC:-clang} rt targets=(key record)
    rt=$("$cc" -print-runtime-dir 2>/dev/null || true)
    if [ -z "$rt" ] || ! ls "$rt"/libclang_rt.fuzzer-*.a > /dev/null 2>&1
    then
        echo "build: fuzz targets NOT built: no $cc with libFuzzer" \
             "(scripts/setup.sh fuzz installs them)" >&2
        return 0
    fi
    if [ -f "$BUILD/objs/Makefile" ]; then
        targets+=(reply)
    else
        echo "build: fuzz_reply NOT built: it needs the configured module" \
             "build (make build)" >&2
    fi
    "$ROOT/scripts/fuzz.sh" --build-only "${targets[@]}" > /dev/null \
        || die "the fuzz targets do not build (scripts/fuzz.sh" \
               "--build-only ${targets[*]})"
    echo "build: the fuzz targets build (${targets[*]}; make fuzz runs them)"
}

# The packaged tree is byte-for-byte what dpkg installed, with nothing added.
check_src() {
    check_includes
    check_layers
    check_fuzz
    pkg=$(dpkg-query -S "$NGINX_SRC/configure" 2>/dev/null | cut -d: -f1) \
        || die "$NGINX_SRC is not from a Debian package; nothing to compare with"
    changed=$(dpkg --verify "$pkg" | grep " $NGINX_SRC/" || true)
    added=$(comm -13 <(dpkg-query -L "$pkg" | sort) \
                     <(find "$NGINX_SRC" | sort))
    [ -z "$changed$added" ] \
        || die "$NGINX_SRC was modified:"$'\n'"$changed$added"
    echo "build: $NGINX_SRC is unchanged (dpkg --verify $pkg, no files added)"
}

case ${1:-} in
    signature)  signature ;;
    configure)  configure ;;
    module)     module ;;
    check-load) check_load ;;
    check-src)  check_src ;;
    check-includes) check_includes ;;
    check-layers) check_layers "${2:-}" ;;
    check-fuzz) check_fuzz ;;
    *)          die "usage: $0 signature|configure|module|check-load|check-src|check-includes|check-layers [DIR]|check-fuzz" ;;
esac
