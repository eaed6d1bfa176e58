#!/bin/sh
# Fill in the @PLACEHOLDERS@ of examples/nginx.conf from the environment:
#
#   MODULE_PATH=/abs/ngx_http_idempotency_module.so LISTEN=127.0.0.1:8080 \
#   UPSTREAM_PORT=8081 REDIS_ADDRESS=127.0.0.1:6390 \
#       scripts/render-conf.sh examples/nginx.conf > nginx.conf
#
# Standalone (no lib.sh): the Docker image runs it at container start.
set -eu

: "${MODULE_PATH:?}" "${LISTEN:?}" "${UPSTREAM_PORT:?}" "${REDIS_ADDRESS:?}"

unknown=$(grep -o '@[A-Z_]*@' "$1" | sort -u \
    | grep -vx -e @MODULE_PATH@ -e @LISTEN@ -e @UPSTREAM_PORT@ \
               -e @REDIS_ADDRESS@ || true)
if [ -n "$unknown" ]; then
    echo "$0: $1 has placeholders nobody fills in:" $unknown >&2
    exit 1
fi

# escape what sed's replacement text would interpret
esc() {
    printf '%s' "$1" | sed 's/[\\|&]/\\&/g'
}

sed -e "s|@MODULE_PATH@|$(esc "$MODULE_PATH")|g" \
    -e "s|@LISTEN@|$(esc "$LISTEN")|g" \
    -e "s|@UPSTREAM_PORT@|$(esc "$UPSTREAM_PORT")|g" \
    -e "s|@REDIS_ADDRESS@|$(esc "$REDIS_ADDRESS")|g" \
    "$1"
