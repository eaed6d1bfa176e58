#!/bin/sh
# Entrypoint of the Docker image: render the example configuration for this
# container, then run the command (nginx in the foreground by default).
#
#   REDIS_ADDRESS  Redis as host:port or unix:/path   [127.0.0.1:6379]
#   PORT           port nginx listens on              [8080]
#   UPSTREAM_PORT  loopback port of the demo upstream [8081]
#
# Where things are in the image (t/121-dockerfile.t runs this script
# outside the image by pointing these at the checkout):
#   IDEMPOTENCY_LIB       render-conf.sh     [/usr/local/lib/idempotency]
#   IDEMPOTENCY_TEMPLATE  examples/nginx.conf [/etc/nginx/idempotency.conf.template]
#   IDEMPOTENCY_CONF      the rendered file  [/etc/nginx/idempotency.conf]
#   MODULE_PATH           the module [/usr/lib/nginx/modules/ngx_http_idempotency_module.so]
#
# Bring your own configuration instead: mount it and pass
# `nginx -c /path/to/it -g 'daemon off;'` as the command.
set -eu
lib=${IDEMPOTENCY_LIB:-/usr/local/lib/idempotency}
template=${IDEMPOTENCY_TEMPLATE:-/etc/nginx/idempotency.conf.template}
conf=${IDEMPOTENCY_CONF:-/etc/nginx/idempotency.conf}

MODULE_PATH=${MODULE_PATH:-/usr/lib/nginx/modules/ngx_http_idempotency_module.so} \
LISTEN=${PORT:-8080} UPSTREAM_PORT=${UPSTREAM_PORT:-8081} \
REDIS_ADDRESS=${REDIS_ADDRESS:-127.0.0.1:6379} \
    "$lib/render-conf.sh" "$template" > "$conf"

exec "$@"
