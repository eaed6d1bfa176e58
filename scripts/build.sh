#!/usr/bin/env bash
# Build the dynamic module against an nginx source tree, the Debian way.
#
#   scripts/build.sh signature|configure|module|check-load|check-src
#
# Quiet unless V=1 (make V=1 build): the compiler's command lines go to
# build/make.log and are shown only when the build fails.
#
# NGINX_SRC is Debian's nginx-dev tree (/usr/share/nginx/src, configured with
# the flags in its conf_flags, so the .so matches /usr/sbin/nginx) or a plain
# nginx source tree (configured with --with-compat). Either way configure runs
# in a private mirror of the tree under build/: the tree itself is only read.
set -eu
. "$(dirname "$0")/lib.sh"

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
if [ -f "$NGINX_SRC/conf_flags" ]; then
    . "$NGINX_SRC/conf_flags"
    flags=("${NGX_CONF_FLAGS[@]}")
fi
version=$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' "$NGINX_SRC/src/core/nginx.h")

# What the configure step depends on besides config and src/lua/*.lua.
signature() {
    mkdir -p "$BUILD"
    printf '%s\n' "nginx $version in $NGINX_SRC" "flags: ${flags[*]}" \
        "cc-opt: $cc_opt" "ld-opt: $ld_opt" > "$sig.new"
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
    if [ "${V:-0}" = 1 ]; then
        make --no-print-directory -f "$objs/Makefile" -C "$tree" modules
    elif ! make --no-print-directory -f "$objs/Makefile" -C "$tree" modules \
            > "$BUILD/make.log" 2>&1; then
        tail -n 40 "$BUILD/make.log" >&2
        die "the module did not build, see build/make.log (V=1 shows it all)"
    fi
    # copy only on change, so that make sees an unchanged .so as up to date
    cmp -s "$objs/$name.so" "$BUILD/$name.so" \
        || cp "$objs/$name.so" "$BUILD/$name.so"
}

# The .so loads into the nginx binary we run (same version and signature).
check_load() {
    mkdir -p "$BUILD/check"
    printf 'load_module %s;\nevents {}\n' "$BUILD/$name.so" \
        > "$BUILD/check/nginx.conf"
    "$NGINX_BIN" -q -t -e stderr -p "$BUILD/check/" -c "$BUILD/check/nginx.conf" \
        || die "$NGINX_BIN cannot load build/$name.so"
    echo "build: build/$name.so loads into $NGINX_BIN"
}

# The packaged tree is byte-for-byte what dpkg installed, with nothing added.
check_src() {
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
    *)          die "usage: $0 signature|configure|module|check-load|check-src" ;;
esac
