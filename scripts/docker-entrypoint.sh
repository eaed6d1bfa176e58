#!/bin/sh
# Entrypoint of the Docker image: render the example configuration for this
# container, then run the command (nginx in the foreground by default).
#
#   REDIS_ADDRESS  Redis as host:port or unix:/path   [127.0.0.1:6379]
#   PORT           port nginx listens on              [8080]
#   UPSTREAM_PORT  loopback port of the demo upstream [8081]
#
# Bring your own configuration instead: mount it and pass
# `nginx -c /path/to/it -g 'daemon off;'` as the command.
set -eu
lib=/usr/local/lib/idempotency

MODULE_PATH=/usr/lib/nginx/modules/ngx_http_idempotency_module.so \
LISTEN=${PORT:-8080} UPSTREAM_PORT=${UPSTREAM_PORT:-8081} \
REDIS_ADDRESS=${REDIS_ADDRESS:-127.0.0.1:6379} \
    $lib/render-conf.sh /etc/nginx/idempotency.conf.template \
    > /etc/nginx/idempotency.conf

exec "$@"
