/*
 * The topology layer's host names resolved by the workers ("resolve"):
 * the place of a node whose address is a name.  Before every connect the
 * name is asked of nginx's resolver (never getaddrinfo: the worker does
 * not block), and again when the answer's validity ends: an answer that
 * no longer holds the address in use moves the node to the new one.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_redis_resolve.h"


#define NGX_HTTP_IDEMPOTENCY_RESOLVE_REASON_LEN  160


struct ngx_http_idempotency_redis_resolve_s {
    ngx_str_t                            name;     /* NUL-ended */
    in_port_t                            port;
    ngx_resolver_t                      *resolver;
    ngx_msec_t                           timeout;
    ngx_log_t                           *log;
    ngx_http_idempotency_redis_node_t   *node;

    void                               (*failed)(void *data,
                                           ngx_http_idempotency_redis_node_t
                                           *node);
    void                                *data;
    void                               (*ready)(void *data,
                                           ngx_http_idempotency_redis_node_t
                                           *node);
    void                                *ready_data;

    ngx_resolver_ctx_t                  *ctx;      /* a query in flight */
    ngx_event_t                          timer;    /* the answer's validity */
    time_t                               valid;

    /* the address of the last answer: the one in use, or the next one */
    u_char                               addr[NGX_SOCKADDR_STRLEN + 1];
    u_char                               reason[
                                    NGX_HTTP_IDEMPOTENCY_RESOLVE_REASON_LEN];

    unsigned                             fresh:1;   /* for the next connect */
    unsigned                             error:1;   /* it is an error */
    unsigned                             waiting:1; /* a connect waits */
    unsigned                             asking:1;  /* inside address() */
    unsigned                             failing:1; /* error logged */
    unsigned                             exiting:1;
};


static ngx_int_t ngx_http_idempotency_redis_resolve_address(void *data,
    const char **host, in_port_t *port, const char **reason);
static void ngx_http_idempotency_redis_resolve_failed(void *data,
    ngx_http_idempotency_redis_node_t *node);
static void ngx_http_idempotency_redis_resolve_ready_handler(void *data,
    ngx_http_idempotency_redis_node_t *node);
static ngx_int_t ngx_http_idempotency_redis_resolve_start(
    ngx_http_idempotency_redis_resolve_t *res);
static void ngx_http_idempotency_redis_resolve_handler(
    ngx_resolver_ctx_t *ctx);
static ngx_uint_t ngx_http_idempotency_redis_resolve_pick(
    ngx_http_idempotency_redis_resolve_t *res, ngx_resolver_ctx_t *ctx,
    u_char *text);
static void ngx_http_idempotency_redis_resolve_arm(
    ngx_http_idempotency_redis_resolve_t *res);
static void ngx_http_idempotency_redis_resolve_timer(ngx_event_t *ev);


static ngx_http_idempotency_redis_place_t
    ngx_http_idempotency_redis_resolve_place = {
    ngx_http_idempotency_redis_resolve_address,
    ngx_http_idempotency_redis_resolve_failed,
    ngx_http_idempotency_redis_resolve_ready_handler,
    NULL,
    0
};


ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_redis_resolve_node(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *name, in_port_t port,
    void (*failed)(void *data, ngx_http_idempotency_redis_node_t *node),
    void *data, ngx_pool_t *pool, ngx_log_t *log)
{
    u_char                                *p;
    ngx_str_t                              text;
    ngx_http_idempotency_redis_node_t     *node;
    ngx_http_idempotency_redis_resolve_t  *res;

    res = ngx_pcalloc(pool, sizeof(ngx_http_idempotency_redis_resolve_t));
    if (res == NULL) {
        return NULL;
    }

    p = ngx_pnalloc(pool, name->len + sizeof(":65535") - 1);
    if (p == NULL) {
        return NULL;
    }

    text.data = p;
    text.len = ngx_sprintf(p, "%V:%d", name, (int) port) - p;

    node = ngx_http_idempotency_redis_node_create(rcf, name, port, &text,
                                  &ngx_http_idempotency_redis_resolve_place,
                                  res, pool, log);
    if (node == NULL) {
        return NULL;
    }

    res->name = *name;
    res->port = port;
    res->resolver = rcf->clcf->resolver;

    /*
     * in http{} the core module's own conf is never merged: without
     * resolver_timeout there it is unset, and a timer of (ngx_msec_t) -1
     * would end the first query at once; nginx's default then
     */

    res->timeout = (rcf->clcf->resolver_timeout == NGX_CONF_UNSET_MSEC)
                   ? 30000 : rcf->clcf->resolver_timeout;
    res->log = node->log;
    res->node = node;
    res->failed = failed;
    res->data = data;

    res->timer.handler = ngx_http_idempotency_redis_resolve_timer;
    res->timer.data = res;
    res->timer.log = node->log;
    res->timer.cancelable = 1;

    return node;
}


void
ngx_http_idempotency_redis_resolve_exit(ngx_http_idempotency_redis_node_t *node)
{
    ngx_http_idempotency_redis_resolve_t  *res;

    res = node->place_data;
    res->exiting = 1;

    if (res->timer.timer_set) {
        ngx_del_timer(&res->timer);
    }

    if (res->ctx) {
        /* the query is cancelled: its handler is not called */
        ngx_resolve_name_done(res->ctx);
        res->ctx = NULL;
    }
}


/*
 * Every connect asks again: a lost connection may be a failover that
 * moved the name.  The resolver's cache answers at once while the last
 * answer is valid (the handler runs inside ngx_resolve_name() then).
 */

static ngx_int_t
ngx_http_idempotency_redis_resolve_address(void *data, const char **host,
    in_port_t *port, const char **reason)
{
    ngx_http_idempotency_redis_resolve_t *res = data;

    ngx_int_t  rc;

    if (!res->fresh) {

        if (res->ctx == NULL) {
            res->asking = 1;
            rc = ngx_http_idempotency_redis_resolve_start(res);
            res->asking = 0;

            if (rc != NGX_OK) {
                *reason = "could not start resolving the host name";
                return NGX_DECLINED;
            }
        }

        if (!res->fresh) {
            res->waiting = 1;
            return NGX_AGAIN;
        }
    }

    res->fresh = 0;

    if (res->error) {
        *reason = (const char *) res->reason;
        return NGX_DECLINED;
    }

    *host = (const char *) res->addr;
    *port = res->port;

    ngx_http_idempotency_redis_resolve_arm(res);

    return NGX_OK;
}


static void
ngx_http_idempotency_redis_resolve_failed(void *data,
    ngx_http_idempotency_redis_node_t *node)
{
    ngx_http_idempotency_redis_resolve_t *res = data;

    if (res->failed) {
        res->failed(res->data, node);
    }
}


void
ngx_http_idempotency_redis_resolve_ready(
    ngx_http_idempotency_redis_node_t *node,
    void (*ready)(void *data, ngx_http_idempotency_redis_node_t *node),
    void *data)
{
    ngx_http_idempotency_redis_resolve_t  *res;

    res = node->place_data;
    res->ready = ready;
    res->ready_data = data;
}


static void
ngx_http_idempotency_redis_resolve_ready_handler(void *data,
    ngx_http_idempotency_redis_node_t *node)
{
    ngx_http_idempotency_redis_resolve_t *res = data;

    if (res->ready) {
        res->ready(res->ready_data, node);
    }
}


static ngx_int_t
ngx_http_idempotency_redis_resolve_start(
    ngx_http_idempotency_redis_resolve_t *res)
{
    ngx_resolver_ctx_t  *ctx;

    ctx = ngx_resolve_start(res->resolver, NULL);

    if (ctx == NULL || ctx == NGX_NO_RESOLVER) {
        /* NGX_NO_RESOLVER: the configuration check makes it impossible */
        ngx_log_error(NGX_LOG_ERR, res->log, 0,
                      "idempotency redis: \"%V\": could not start "
                      "resolving \"%V\"", &res->node->name, &res->name);
        return NGX_ERROR;
    }

    ctx->name = res->name;
    ctx->handler = ngx_http_idempotency_redis_resolve_handler;
    ctx->data = res;
    ctx->timeout = res->timeout;
    ctx->cancelable = 1;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, res->log, 0,
                   "idempotency redis: \"%V\": resolving \"%V\"",
                   &res->node->name, &res->name);

    /* the handler may run before this returns, and clears res->ctx */

    res->ctx = ctx;

    if (ngx_resolve_name(ctx) != NGX_OK) {
        /* ctx is freed already */
        res->ctx = NULL;

        ngx_log_error(NGX_LOG_ERR, res->log, 0,
                      "idempotency redis: \"%V\": could not start "
                      "resolving \"%V\"", &res->node->name, &res->name);
        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_http_idempotency_redis_resolve_handler(ngx_resolver_ctx_t *ctx)
{
    ngx_http_idempotency_redis_resolve_t *res = ctx->data;

    u_char                              text[NGX_SOCKADDR_STRLEN + 1];
    ngx_uint_t                          ok, kept;
    ngx_http_idempotency_redis_node_t  *node;

    node = res->node;
    res->ctx = NULL;
    res->valid = ctx->valid;

    ok = 0;
    kept = 0;

    if (ctx->state) {
        ngx_snprintf(res->reason, NGX_HTTP_IDEMPOTENCY_RESOLVE_REASON_LEN - 1,
                     "\"%V\" could not be resolved (%s)%Z", &res->name,
                     ngx_resolver_strerror(ctx->state));
        res->reason[NGX_HTTP_IDEMPOTENCY_RESOLVE_REASON_LEN - 1] = '\0';

        /* once per streak: a name that is gone for an hour is one line */

        if (!res->failing) {
            ngx_log_error(NGX_LOG_ERR, res->log, 0,
                          "idempotency redis: \"%V\": \"%V\" could not be "
                          "resolved (%s)", &node->name, &res->name,
                          ngx_resolver_strerror(ctx->state));
            res->failing = 1;
        }

    } else if (ctx->naddrs == 0) {
        ngx_snprintf(res->reason, NGX_HTTP_IDEMPOTENCY_RESOLVE_REASON_LEN - 1,
                     "\"%V\" has no address%Z", &res->name);
        res->reason[NGX_HTTP_IDEMPOTENCY_RESOLVE_REASON_LEN - 1] = '\0';

        if (!res->failing) {
            ngx_log_error(NGX_LOG_ERR, res->log, 0,
                          "idempotency redis: \"%V\": \"%V\" has no address",
                          &node->name, &res->name);
            res->failing = 1;
        }

    } else {
        ok = 1;
        kept = ngx_http_idempotency_redis_resolve_pick(res, ctx, text);
        res->failing = 0;
    }

    ngx_resolve_name_done(ctx);

    if (res->exiting) {
        return;
    }

    /* a connect asked: it takes the answer */

    if (res->asking || res->waiting) {
        res->fresh = 1;
        res->error = !ok;

        if (ok && !kept) {
            ngx_log_error(NGX_LOG_NOTICE, res->log, 0,
                          "idempotency redis: \"%V\": \"%V\" resolved to %s",
                          &node->name, &res->name, text);
            ngx_cpystrn(res->addr, text, sizeof(res->addr));
        }

        if (res->waiting && !res->asking) {
            res->waiting = 0;
            ngx_http_idempotency_redis_node_reconnect(node, 0);
        }

        return;
    }

    /*
     * The validity of the answer in use ended: an error keeps the
     * connection (it works; the name may come back), as does an answer
     * that still holds its address
     */

    if (!ok || kept) {
        ngx_http_idempotency_redis_resolve_arm(res);
        return;
    }

    ngx_log_error(NGX_LOG_NOTICE, res->log, 0,
                  "idempotency redis: \"%V\": \"%V\" no longer resolves to "
                  "%s, reconnecting to %s", &node->name, &res->name,
                  res->addr, text);

    ngx_cpystrn(res->addr, text, sizeof(res->addr));
    res->fresh = 1;
    res->error = 0;

    ngx_http_idempotency_redis_node_reconnect(node, 1);
}


/*
 * The address in use if the answer still holds it (1), else the first
 * one (0), as text in "text"
 */

static ngx_uint_t
ngx_http_idempotency_redis_resolve_pick(
    ngx_http_idempotency_redis_resolve_t *res, ngx_resolver_ctx_t *ctx,
    u_char *text)
{
    size_t      len;
    ngx_uint_t  i;

    for (i = 0; i < ctx->naddrs; i++) {
        len = ngx_sock_ntop(ctx->addrs[i].sockaddr, ctx->addrs[i].socklen,
                            text, NGX_SOCKADDR_STRLEN, 0);
        text[len] = '\0';

        if (res->addr[0] && ngx_strcmp(text, res->addr) == 0) {
            return 1;
        }
    }

    len = ngx_sock_ntop(ctx->addrs[0].sockaddr, ctx->addrs[0].socklen,
                        text, NGX_SOCKADDR_STRLEN, 0);
    text[len] = '\0';

    return 0;
}


/* asks again when the answer in use is no longer valid */

static void
ngx_http_idempotency_redis_resolve_arm(
    ngx_http_idempotency_redis_resolve_t *res)
{
    time_t  left;

    if (res->exiting) {
        return;
    }

    /* the resolver's cache keeps the answer through its "valid" second */

    left = res->valid - ngx_time() + 1;

    if (left < 1) {
        left = 1;
    }

    ngx_add_timer(&res->timer, (ngx_msec_t) left * 1000);
}


static void
ngx_http_idempotency_redis_resolve_timer(ngx_event_t *ev)
{
    ngx_http_idempotency_redis_resolve_t *res = ev->data;

    /* without a connection the next connect asks anyway */

    if (res->exiting || res->ctx || res->node->ac == NULL) {
        return;
    }

    if (ngx_http_idempotency_redis_resolve_start(res) != NGX_OK) {
        res->valid = ngx_time() + 1;
        ngx_http_idempotency_redis_resolve_arm(res);
    }
}
