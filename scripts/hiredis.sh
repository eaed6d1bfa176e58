#!/usr/bin/env bash
# Build hiredis VERSION from SHARED_DIR/hiredis/hiredis-VERSION.tar.gz into
# build/hiredis-VERSION/ (include/hiredis/*.h, lib/libhiredis.so*), once.
# The module is then built against it with HIREDIS_INC and HIREDIS_LIB
# (make build HIREDIS=VERSION does all of it).
#
#   scripts/hiredis.sh VERSION
set -eu
. "$(dirname "$0")/lib.sh"

version=${1:?usage: $0 VERSION}
prefix=$ROOT/build/hiredis-$version
[ -f "$prefix/include/hiredis/async.h" ] && [ -e "$prefix/lib/libhiredis.so" ] \
    && exit 0

tarball=$SHARED_DIR/hiredis/hiredis-$version.tar.gz
[ -f "$tarball" ] || die "no $tarball (SHARED_DIR=/path/to/shared)"
echo "hiredis: building $version into build/hiredis-$version/"
src=$prefix/src
rm -rf "$prefix"
mkdir -p "$src"
tar xzf "$tarball" -C "$src" --strip-components=1
# no TLS (the module does not use hiredis_ssl); LIBRARY_PATH on the command
# line: hiredis's Makefile would take the compiler's variable of that name
# from the environment as its install directory
opts=(PREFIX="$prefix" LIBRARY_PATH=lib USE_SSL=0)
make --no-print-directory -C "$src" -j"${BUILD_JOBS:-2}" "${opts[@]}" \
    > "$prefix/build.log" 2>&1 \
    || { tail -n 20 "$prefix/build.log" >&2; die "hiredis build failed"; }
make --no-print-directory -C "$src" "${opts[@]}" install \
    >> "$prefix/build.log" 2>&1 \
    || { tail -n 20 "$prefix/build.log" >&2; die "hiredis install failed"; }
# the module links the shared library (rpath); not the static one
rm -f "$prefix"/lib/libhiredis.a
[ -e "$prefix/lib/libhiredis.so" ] || die "no $prefix/lib/libhiredis.so"
echo "hiredis: built $(cd "$prefix/lib" && echo libhiredis.so.*)"
