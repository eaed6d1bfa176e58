# nginx (Debian 12) with ngx_http_idempotency_module and the demo
# configuration of examples/nginx.conf.
#
#   docker build -t nginx-idempotency .
#   docker run --rm -p 8080:8080 -e REDIS_ADDRESS=redis.example:6379 nginx-idempotency
#
# The build stage takes the steps of `make build` on a Debian 12 host:
# scripts/setup.sh installs the build packages, make builds and load-checks
# the module against the nginx-dev tree. t/121-dockerfile.t checks that the
# packages, paths and targets named here are the Makefile's.

FROM debian:bookworm-slim AS build
WORKDIR /src
COPY scripts/setup.sh scripts/lib.sh scripts/
RUN scripts/setup.sh build && rm -rf /var/lib/apt/lists/*
COPY . .
RUN make build

FROM debian:bookworm-slim
COPY scripts/setup.sh scripts/lib.sh /usr/local/lib/idempotency/
RUN /usr/local/lib/idempotency/setup.sh image && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/ngx_http_idempotency_module.so /usr/lib/nginx/modules/
COPY scripts/render-conf.sh scripts/docker-entrypoint.sh /usr/local/lib/idempotency/
COPY examples/nginx.conf /etc/nginx/idempotency.conf.template
# Prometheus alert rules and a Grafana dashboard (docs/observability.md)
COPY contrib /usr/share/doc/nginx-idempotency/contrib

# Read by the entrypoint when it renders /etc/nginx/idempotency.conf.
ENV REDIS_ADDRESS=127.0.0.1:6379 PORT=8080 UPSTREAM_PORT=8081
# The image is checked when it is built: the rendered configuration loads
# the module and passes nginx -t.
RUN /usr/local/lib/idempotency/docker-entrypoint.sh \
        nginx -q -t -p /var/lib/nginx/ -c /etc/nginx/idempotency.conf
EXPOSE 8080
# GET is not protected: this checks nginx and the proxy path, not Redis.
HEALTHCHECK --interval=30s --timeout=3s \
    CMD curl -fsS -o /dev/null "http://127.0.0.1:${PORT}/orders" || exit 1
# As the official nginx images: nginx in the foreground as PID 1 (the
# entrypoint execs it), logs on stdout/stderr, SIGQUIT for a graceful stop.
STOPSIGNAL SIGQUIT
ENTRYPOINT ["/usr/local/lib/idempotency/docker-entrypoint.sh"]
CMD ["nginx", "-p", "/var/lib/nginx/", "-c", "/etc/nginx/idempotency.conf", "-g", "daemon off;"]
