#!/usr/bin/env bash
# make deb: build libnginx-mod-http-idempotency_<version>_<arch>.deb with
# debhelper and nginx-dev's dh_nginx (debian/), into build/deb/.
#
# The version is the one in src/ngx_http_idempotency_version.h; the top
# entry of debian/changelog must carry the same (checked here). The build
# runs in a copy of this checkout (build/deb/<source>-<version>/, without
# build/ and .git), so dpkg-buildpackage's clean step and its output in the
# parent directory stay inside build/deb/. debian/rules builds the module
# with `make build` in that copy: nothing is written to /usr/share/nginx/src.
set -eu
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

header=src/ngx_http_idempotency_version.h
version=$(sed -n 's/^#define NGX_HTTP_IDEMPOTENCY_VERSION *"\(.*\)"/\1/p' \
          "$header")
[ -n "$version" ] || die "no NGX_HTTP_IDEMPOTENCY_VERSION in $header"
source=$(dpkg-parsechangelog -S Source)
changelog=$(dpkg-parsechangelog -S Version)
[ "$changelog" = "$version" ] \
    || die "debian/changelog is at $changelog, $header at $version;" \
           "add a debian/changelog entry (dch -v $version)"

out=$BUILD/deb
tree=$out/$source-$version
rm -rf "$out"
mkdir -p "$tree"
tar -C "$ROOT" --exclude=./build --exclude=./.git --exclude='./t/servroot*' \
    -cf - . | tar -C "$tree" -xf -

echo "deb: building $source $version in build/deb/ (log: build/deb/build.log)"
if ! (cd "$tree" && dpkg-buildpackage -b -us -uc) > "$out/build.log" 2>&1; then
    tail -n 30 "$out/build.log" >&2
    die "dpkg-buildpackage failed, see build/deb/build.log"
fi

deb=$out/${source}_${version}_$(dpkg-architecture -qDEB_HOST_ARCH).deb
[ -f "$deb" ] || die "dpkg-buildpackage did not produce $deb"
dpkg-deb -f "$deb" Package Version Depends
dpkg-deb -c "$deb" | awk '{print $NF}' | grep -E '\.so$|\.conf$'
echo "deb: ${deb#"$ROOT"/}"
