#!/usr/bin/env bash
# make run: a private Redis and nginx with examples/nginx.conf, on loopback,
# in the foreground until Ctrl-C or `make stop`. State lives in build/run/.
#
#   scripts/run.sh           run (PORT, UPSTREAM_PORT, REDIS_PORT choose ports)
#   scripts/run.sh --check   only render the example and `nginx -t` it
set -eu
. "$(dirname "$0")/lib.sh"

NGINX_BIN=${NGINX_BIN:-/usr/sbin/nginx}
port=${PORT:-8080}
upstream_port=${UPSTREAM_PORT:-8081}
redis_port=${REDIS_PORT:-6390}
run=$BUILD/run

# render DIR: examples/nginx.conf with our ports, as DIR/nginx.conf
render() {
    mkdir -p "$1"
    MODULE_PATH=$BUILD/ngx_http_idempotency_module.so \
    LISTEN=127.0.0.1:$port UPSTREAM_PORT=$upstream_port \
    REDIS_ADDRESS=127.0.0.1:$redis_port \
        "$ROOT/scripts/render-conf.sh" "$ROOT/examples/nginx.conf" \
        > "$1/nginx.conf"
    "$NGINX_BIN" -q -t -e stderr -p "$1/" -c "$1/nginx.conf" \
        || die "nginx rejects examples/nginx.conf (rendered as $1/nginx.conf)"
}

if [ "${1:-}" = --check ]; then
    render "$BUILD/check/example"
    echo "run: examples/nginx.conf passes nginx -t"
    exit 0
fi

if pid=$(pid_of "$run/run.pid" run.sh); then
    die "already running (pid $pid); stop it with: make stop"
fi
if [ "$port" = "$upstream_port" ] || [ "$port" = "$redis_port" ] \
        || [ "$upstream_port" = "$redis_port" ]; then
    die "PORT, UPSTREAM_PORT and REDIS_PORT must differ"
fi
need_port "$port" nginx PORT
need_port "$upstream_port" "demo upstream" UPSTREAM_PORT
need_port "$redis_port" redis REDIS_PORT

rm -rf "$run"
render "$run"
mkdir -p "$run/redis"
echo $$ > "$run/run.pid"

redis_pid=
nginx_pid=
stop_all() {
    trap - INT TERM
    if [ -n "$nginx_pid" ]; then stop_pid "$nginx_pid"; fi
    if [ -n "$redis_pid" ]; then stop_pid "$redis_pid"; fi
    wait 2>/dev/null || true
    rm -f "$run/run.pid" "$run/redis.pid"
    echo "run: stopped"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 0' TERM      # make stop

redis-server --bind 127.0.0.1 --port "$redis_port" --save '' \
    --appendonly no --daemonize no --dir "$run/redis" \
    --logfile "$run/redis/redis.log" &
redis_pid=$!
echo "$redis_pid" > "$run/redis.pid"
wait_port "$redis_port" 10 "$redis_pid" \
    || die "redis-server did not start, see build/run/redis/redis.log"

"$NGINX_BIN" -e stderr -p "$run/" -c "$run/nginx.conf" -g 'daemon off;' &
nginx_pid=$!
wait_port "$port" 10 "$nginx_pid" || die "nginx did not start"

base=http://127.0.0.1:$port
url=$base/orders
auth="-H 'Authorization: Bearer alice'"
cat <<MSG

Idempotency demo running (configuration: build/run/nginx.conf, rendered
from examples/nginx.conf):
  nginx + module   $url
  demo upstream    http://127.0.0.1:$upstream_port/orders (new order_id each run)
  redis            127.0.0.1:$redis_port

The scope (idempotency_scope) is the Authorization header: the commands
send 'Bearer alice'; the same key with another one is another request.

Try from another shell:
  # keys are per client (idempotency_scope \$http_authorization): alice
  # a new key: the upstream runs, the response is stored (MISS)
  curl -i $url $auth -H 'Idempotency-Key: order-1' -d '{"sku":"A1","qty":2}'
  # the same again: replayed from Redis, same order_id, Idempotent-Replayed: true (HIT)
  curl -i $url $auth -H 'Idempotency-Key: order-1' -d '{"sku":"A1","qty":2}'
  # the same key with another body: 422, the key belongs to another request (MISMATCH)
  curl -i $url $auth -H 'Idempotency-Key: order-1' -d '{"sku":"B2","qty":1}'
  # a different key, or another client: a new order (MISS)
  curl -i $url $auth -H 'Idempotency-Key: order-2' -d '{"sku":"A1","qty":2}'
  curl -i $url -H 'Authorization: Bearer bob' -H 'Idempotency-Key: order-1' -d '{"sku":"A1","qty":2}'
  # a key but no credentials: 400 (UNSCOPED), no shared namespace
  curl -i $url -H 'Idempotency-Key: order-1' -d '{"sku":"A1","qty":2}'
  # GET is not protected: it passes through every time (BYPASS)
  curl -i $url

  # a slow upstream (about 5 s): run this, and again from a second shell
  # while the first waits: the second gets 409 Conflict, Retry-After: 1 (CONFLICT)
  curl -i $base/slow-orders $auth -H 'Idempotency-Key: slow-1' -d '{"sku":"C3"}'
  # with idempotency_wait 10s the duplicate waits and gets the first's answer (HIT)
  curl -i $base/slow-orders-wait $auth -H 'Idempotency-Key: slow-2' -d '{"sku":"C3"}'

  # idempotency_required on: without a key, 400 (MISSING); with one, it runs
  curl -i $base/payments $auth -d '{"amount":100}'
  curl -i $base/payments $auth -H 'Idempotency-Key: pay-1' -d '{"amount":100}'

  # what is stored for a key (state, status, TTL), and removing it so that it runs again
  curl -sG $base/idempotency_admin --data-urlencode key=order-1 --data-urlencode 'scope=Bearer alice'
  curl -sG -X DELETE $base/idempotency_admin --data-urlencode key=order-1 --data-urlencode 'scope=Bearer alice'
  # the counters of every outcome
  curl -s $base/idempotency_status

Access log follows. Ctrl-C (or \`make stop\` from another shell) stops it all.

MSG

# Returns when nginx or redis exits, or when a signal arrives (see traps).
wait -n "$redis_pid" "$nginx_pid" || true
die "$( kill -0 "$nginx_pid" 2>/dev/null && echo redis-server || echo nginx) exited unexpectedly"
