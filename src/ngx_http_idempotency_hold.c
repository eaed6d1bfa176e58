/*
 * Read-after-complete: a response's last buffers held until the reply to
 * its claim's settle step (store or release).  HTTP side; uses no Redis
 * layer (it hears the reply from ngx_http_idempotency_settle.c).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_hold.h"
#include "ngx_http_idempotency_stats.h"


static void ngx_http_idempotency_held_handler(ngx_event_t *ev);
static void ngx_http_idempotency_wake(ngx_http_idempotency_ctx_t *ctx);


/* requests whose last buffer waits for their store or release reply */
static ngx_queue_t  ngx_http_idempotency_waiting;


/*
 * Read-after-complete: the last buffer of the response (the whole chain it
 * came in) waits for the reply to the settle step, so that a client holding
 * the complete response and retrying at once gets the replay (or, after a
 * release, a fresh run), never a 409.  A bit in r->buffered keeps nginx
 * from finishing the request meanwhile; the wait is bounded by the Redis
 * timeout and by send_timeout, after which the buffer goes anyway and the
 * store goes on as a retryable op.  send_timeout runs on the write event
 * meanwhile (nginx arms it while r->buffered is set), and where it fires
 * first the request ends one buffer short of a complete response.
 */

ngx_int_t
ngx_http_idempotency_settle_wait(ngx_http_idempotency_ctx_t *ctx,
    ngx_chain_t *in)
{
    ngx_msec_t                 timeout;
    ngx_http_request_t        *r;
    ngx_http_core_loc_conf_t  *clcf;

    r = ctx->request;
    ctx->held = NULL;

    if (ngx_chain_add_copy(r->pool, &ctx->held, in) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_idempotency_waiting.next == NULL) {
        ngx_queue_init(&ngx_http_idempotency_waiting);
    }

    ngx_queue_insert_tail(&ngx_http_idempotency_waiting, &ctx->queue);
    ctx->waiting = 1;

    timeout = ctx->conf->redis->timeout ? ctx->conf->redis->timeout : 1000;

    /* a store that waits for replicas (wait_replicas=) may take that long */

    if (ctx->conf->redis->wait) {
        timeout += ctx->conf->redis->wait_timeout;
    }

    /*
     * armed before nginx arms send_timeout for the same moment or later:
     * this timer goes first (and wake() takes the other one off)
     */

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
    timeout = ngx_min(timeout, clcf->send_timeout);

    ctx->held_timer.handler = ngx_http_idempotency_held_handler;
    ctx->held_timer.data = ctx;
    ctx->held_timer.log = r->connection->log;
    ngx_add_timer(&ctx->held_timer, timeout);

    r->buffered |= NGX_HTTP_IDEMPOTENCY_BUFFERED;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency: last buffer of \"%V\" waits for Redis",
                   &ctx->rkey);

    return NGX_AGAIN;
}


static void
ngx_http_idempotency_held_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ev->data;

    ngx_log_error(NGX_LOG_INFO, ev->log, 0,
                  "idempotency: no reply from Redis for the settle step of "
                  "key_hash=%s in time, the response ends anyway",
                  ngx_http_idempotency_key_hash(&ctx->rkey));

    ngx_http_idempotency_wake(ctx);
}


/* the held buffer goes on: the request's writer passes it down */

static void
ngx_http_idempotency_wake(ngx_http_idempotency_ctx_t *ctx)
{
    ngx_event_t         *wev;
    ngx_http_request_t  *r;

    if (!ctx->waiting) {
        return;
    }

    ngx_http_idempotency_hold_leave(ctx);

    r = ctx->request;
    r->buffered &= ~NGX_HTTP_IDEMPOTENCY_BUFFERED;

    wev = r->connection->write;

    /*
     * Its send_timeout, due with the hold's end, would expire in the same
     * round of timers, before the posted event, and end the request: the
     * writer arms it again if anything is left to send.  A delayed event's
     * timer is limit_rate's, left alone.
     */

    if (wev->timer_set && !wev->delayed) {
        ngx_del_timer(wev);
    }

    ngx_post_event(wev, &ngx_posted_events);
}


/*
 * The request of this worker whose settle step this is, if it waits: the
 * op's key and fence (the in-flight record its claim wrote, with its owner
 * token) are its own.  Not any request waiting on the key: the release of
 * a duplicate whose claim went unanswered, or the store of a claim that
 * expired and was taken again, must not let another request's last buffer
 * go before its own store is acknowledged (a split store given up before
 * its head was sent tells the fence of its head's store).
 */

void
ngx_http_idempotency_hold_settled(ngx_http_idempotency_redis_info_t *info)
{
    ngx_queue_t                 *q;
    ngx_http_idempotency_ctx_t  *ctx;

    if (ngx_http_idempotency_waiting.next == NULL) {
        return;
    }

    for (q = ngx_queue_head(&ngx_http_idempotency_waiting);
         q != ngx_queue_sentinel(&ngx_http_idempotency_waiting);
         q = ngx_queue_next(q))
    {
        ctx = ngx_queue_data(q, ngx_http_idempotency_ctx_t, queue);

        if (ctx->inflight.len == info->arg.len
            && ctx->rkey.len == info->key.len
            && ngx_memcmp(ctx->inflight.data, info->arg.data, info->arg.len)
               == 0
            && ngx_memcmp(ctx->rkey.data, info->key.data, info->key.len) == 0)
        {
            ngx_http_idempotency_wake(ctx);
            return;
        }
    }
}


void
ngx_http_idempotency_hold_leave(ngx_http_idempotency_ctx_t *ctx)
{
    if (ctx->waiting) {
        ctx->waiting = 0;
        ngx_queue_remove(&ctx->queue);
    }

    if (ctx->held_timer.timer_set) {
        ngx_del_timer(&ctx->held_timer);
    }
}
