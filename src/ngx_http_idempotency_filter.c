/*
 * The filters of a claimed request's response: it goes into its record
 * (ngx_http_idempotency_capture.c) as it streams to the client, and the
 * claim is settled (ngx_http_idempotency_settle.c) when the response ends.
 * HTTP side; uses no Redis layer itself.
 */

#include "ngx_http_idempotency_filter.h"
#include "ngx_http_idempotency_hold.h"
#include "ngx_http_idempotency_settle.h"
#include "ngx_http_idempotency_capture.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_stats.h"


static ngx_int_t ngx_http_idempotency_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_idempotency_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_uint_t ngx_http_idempotency_header_only(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_release_held(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_chain_t *in);
static ngx_int_t ngx_http_idempotency_keep_tail(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_chain_t **in);
static void ngx_http_idempotency_swallow(ngx_chain_t *in);
static ngx_int_t ngx_http_idempotency_client_gone(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_chain_t *in);
static void ngx_http_idempotency_guard_reading(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_test_reading(ngx_http_request_t *r);


/* its buffers are sunk too when the client went away */
extern ngx_module_t  ngx_http_copy_filter_module;


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


ngx_int_t
ngx_http_idempotency_filter_init(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_idempotency_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_idempotency_body_filter;

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_header_filter(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_http_idempotency_ctx_t  *ctx;

    if (r != r->main) {
        return ngx_http_next_header_filter(r);
    }

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx == NULL || ctx->state != NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED
        || ctx->header_seen)
    {
        return ngx_http_next_header_filter(r);
    }

    ctx->header_seen = 1;
    ctx->status = r->headers_out.status;

    ngx_http_idempotency_claim_judge(r, ctx);

    if (!ctx->release && !ctx->hold) {

        /*
         * The full representation or nothing: no range filter cuts a
         * stored response, and a part the upstream sent (206) is not
         * replayable: it is kept as the not-replayable marker.
         */

        r->allow_ranges = 0;

        if (ctx->status == NGX_HTTP_PARTIAL_CONTENT) {
            ctx->oversize = 1;

        } else if (r->headers_out.content_length_n > 0
                   && (size_t) r->headers_out.content_length_n
                      > ctx->conf->max_response_size)
        {
            ctx->oversize = 1;

        } else {
            if (ngx_http_idempotency_snapshot(r, ctx) != NGX_OK) {
                return NGX_ERROR;
            }

            ctx->capture = 1;

            /* file buffers (proxy temp files) are read into memory for us */

            r->filter_need_in_memory = 1;
        }
    }

    if (ngx_http_idempotency_header_only(r, ctx) && !r->connection->error) {

        /*
         * A response that is its header ends here, and the header is the
         * last the client gets: it waits for the settle step's reply
         * (read-after-complete), in r->buffered; the body filter sends it.
         * The header filter would say header_only; it is said now, so that
         * nginx sends no body after it meanwhile.
         */

        ctx->complete = 1;

        if (ngx_http_idempotency_settle(ctx) == NGX_OK) {
            r->header_only = 1;
            ctx->header_held = 1;

            ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                           "idempotency: header-only response of \"%V\" "
                           "waits for Redis", &ctx->rkey);

            return ngx_http_idempotency_settle_wait(ctx, NULL);
        }

        return ngx_http_next_header_filter(r);
    }

    rc = ngx_http_next_header_filter(r);

    if (rc == NGX_ERROR && r->connection->error
        && ctx->state == NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED
        && !ctx->release && !ctx->hold)
    {
        /* e.g. an HTTP/2 stream reset before the header went out */
        rc = ngx_http_idempotency_client_gone(r, ctx, NULL);
    }

    /*
     * No body follows through the body filters after a header-only
     * response (HEAD, 204, 304, HTTP/2 included): it ends here.
     */

    if (ngx_http_idempotency_header_only(r, ctx)) {
        ctx->complete = 1;
        (void) ngx_http_idempotency_settle(ctx);
    }

    return rc;
}


static ngx_uint_t
ngx_http_idempotency_header_only(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    return ctx->state == NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED
           && (r->header_only || r->method == NGX_HTTP_HEAD
               || ctx->status == NGX_HTTP_NO_CONTENT
               || ctx->status == NGX_HTTP_NOT_MODIFIED);
}


static ngx_int_t
ngx_http_idempotency_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t                    rc;
    ngx_chain_t                 *cl;
    ngx_http_idempotency_ctx_t  *ctx;

    if (r != r->main) {
        return ngx_http_next_body_filter(r, in);
    }

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx == NULL) {
        return ngx_http_next_body_filter(r, in);
    }

    if (ctx->held || ctx->header_held) {
        return ngx_http_idempotency_release_held(r, ctx, in);
    }

    if (in && ctx->state == NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED
        && ctx->header_seen)
    {
        for (cl = in; cl; cl = cl->next) {

            if (ctx->capture
                && ngx_http_idempotency_capture(r, ctx, cl->buf) != NGX_OK)
            {
                return NGX_ERROR;
            }

            if (cl->buf->last_buf) {
                ctx->complete = 1;
            }
        }

        if (!ctx->complete) {
            if (!ctx->client_gone
                && ngx_http_idempotency_keep_tail(r, ctx, &in) != NGX_OK)
            {
                return NGX_ERROR;
            }

        } else {

            /* the last byte kept back goes out with the last buffer */

            if (ctx->tail) {
                ctx->tail->next = in;
                in = ctx->tail;
                ctx->tail = NULL;
            }

            if (ngx_http_idempotency_settle(ctx) == NGX_OK
                && !ctx->client_gone && !r->connection->error)
            {
                return ngx_http_idempotency_settle_wait(ctx, in);
            }
        }
    }

    if (ctx->state == NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED
        && ctx->header_seen && !ctx->complete)
    {
        ngx_http_idempotency_guard_reading(r, ctx);
    }

    if (ctx->client_gone) {
        ngx_http_idempotency_swallow(in);

        if (ctx->complete
            && (r->upstream == NULL || r->upstream->cleanup == NULL))
        {
            /*
             * The record has it all: the request ends, instead of waiting
             * for what HTTP/2 queued for a gone client until send_timeout
             */
            ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                           "idempotency: response read to its end, "
                           "the client is gone");
            return NGX_ERROR;
        }

        return NGX_OK;
    }

    rc = ngx_http_next_body_filter(r, in);

    if (rc == NGX_ERROR && r->connection->error
        && ctx->state == NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED
        && ctx->header_seen && !ctx->release && !ctx->hold)
    {
        return ngx_http_idempotency_client_gone(r, ctx, in);
    }

    return rc;
}


/*
 * Read-after-complete: the last buffer (or the header of a header-only
 * response) waits for Redis; once the reply came (or the wait ended),
 * the header and what was held go on, in order.
 */

static ngx_int_t
ngx_http_idempotency_release_held(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_chain_t *in)
{
    ngx_int_t                  rc;
    ngx_chain_t               *cl;
    ngx_http_core_loc_conf_t  *clcf;

    /* what comes meanwhile goes behind what is held, in its own links */

    if (ngx_chain_add_copy(r->pool, &ctx->held, in) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ctx->waiting) {
        return NGX_AGAIN;
    }

    cl = ctx->held;
    ctx->held = NULL;

    /*
     * What was held is small (the last byte, the last chunk) and follows
     * what went out a moment ago: it goes at once, not after the client's
     * acknowledgement of that (Nagle), as nginx does for unbuffered
     * responses.  HTTP/2 connections have it set already.
     */

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (clcf->tcp_nodelay && r->http_version < NGX_HTTP_VERSION_20
        && ngx_tcp_nodelay(r->connection) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ctx->header_held) {
        ctx->header_held = 0;

        rc = ngx_http_next_header_filter(r);

        if (rc == NGX_ERROR || rc > NGX_OK) {
            return NGX_ERROR;
        }

        if (cl == NULL) {
            return rc;
        }
    }

    if (ctx->client_gone) {
        ngx_http_idempotency_swallow(cl);
        return NGX_OK;
    }

    return ngx_http_next_body_filter(r, cl);
}


/*
 * HTTP/1.x with a Content-Length: a client has the whole response with its
 * last byte, before the (empty) last buffer comes.  That byte is kept back,
 * in a buffer of its own, and goes out with the last buffer, which waits
 * for Redis.  The buffer it came in goes on one byte shorter, so that its
 * owner (the event pipe, the upstream) gets it back and ends the response.
 */

static ngx_int_t
ngx_http_idempotency_keep_tail(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_chain_t **in)
{
    off_t         size;
    ssize_t       n;
    ngx_buf_t    *b, *last;
    ngx_chain_t  *cl, *out, **ll;

    if (ctx->tail || ctx->sent < 0 || r->http_version >= NGX_HTTP_VERSION_20
        || r->headers_out.content_length_n <= 0)
    {
        return NGX_OK;
    }

    last = NULL;

    for (cl = *in; cl; cl = cl->next) {
        if (ngx_buf_special(cl->buf)) {
            continue;
        }

        size = ngx_buf_size(cl->buf);

        if (size > 0) {
            ctx->sent += size;
            last = cl->buf;
        }
    }

    if (last == NULL || ctx->sent < r->headers_out.content_length_n) {
        return NGX_OK;
    }

    b = ngx_create_temp_buf(r->pool, 1);
    if (b == NULL) {
        return NGX_ERROR;
    }

    if (ngx_buf_in_memory(last)) {
        *b->last++ = *(last->last - 1);
        last->last--;

        if (last->in_file) {
            last->file_last--;
        }

    } else {

        /*
         * a file buffer sent as it is: its last byte is read (a file
         * opened for direct I/O cannot be read a byte at a time; that
         * response goes without the wait, as it did before)
         */

        n = last->file->directio
            ? NGX_ERROR
            : ngx_read_file(last->file, b->last, 1, last->file_last - 1);

        if (n != 1) {
            ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                          "idempotency: the last byte of key_hash=%s is not "
                          "kept back (cannot read it from \"%V\"), a retry "
                          "at once may get a 409",
                          ngx_http_idempotency_key_hash(&ctx->rkey),
                          &last->file->name);
            ctx->sent = -1;
            return NGX_OK;
        }

        b->last++;
        last->file_last--;
    }

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = b;
    cl->next = NULL;
    ctx->tail = cl;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency: last byte of \"%V\" kept for the last "
                   "buffer", &ctx->rkey);

    if (ngx_buf_size(last) > 0) {
        return NGX_OK;
    }

    /*
     * the buffer was that byte: it is taken as sent and left out of what
     * goes on (no filter takes an empty buffer), in links of our own
     */

    out = NULL;

    if (ngx_chain_add_copy(r->pool, &out, *in) != NGX_OK) {
        return NGX_ERROR;
    }

    for (ll = &out; *ll; ll = &(*ll)->next) {
        if ((*ll)->buf == last) {
            *ll = (*ll)->next;
            break;
        }
    }

    *in = out;

    return NGX_OK;
}


/*
 * The client of a claimed request went away: the response is read to its
 * end for the record only.  The buffers are taken in here as if they were
 * sent, so that the upstream module (its event pipe, or the unbuffered
 * path) goes on reading the upstream to its end instead of closing it, and
 * sends the last buffer that completes the record.
 */

static ngx_int_t
ngx_http_idempotency_client_gone(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_chain_t *in)
{
    ngx_output_chain_ctx_t  *occ;

    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "idempotency: client of key_hash=%s went away, the rest "
                  "of the response is read for the record only",
                  ngx_http_idempotency_key_hash(&ctx->rkey));

    ctx->client_gone = 1;

    ngx_http_idempotency_swallow(in);

    /* what the write filter kept of earlier calls is not sent either */
    ngx_http_idempotency_swallow(r->out);

    /*
     * nor what HTTP/2 keeps queued in its frames: the copy filter (a file
     * read into memory) gets its buffers back and reads on to the end
     */

    occ = ngx_http_get_module_ctx(r, ngx_http_copy_filter_module);

    if (occ) {
        ngx_http_idempotency_swallow(occ->busy);
    }

    return NGX_OK;
}


/*
 * A response that nginx finishes writing without an upstream (a static
 * file after X-Accel-Redirect, or the rest of a buffered one): nginx's
 * read handler for a writing request ends it when the client goes away,
 * and the record would be left incomplete.  Until the response's last
 * buffer passed, a read event only makes the writer write on: a client
 * that left is seen there, and the filter sinks the rest (client_gone).
 * The handler is set when the request goes to writing, after the first
 * call of the filter: the write event is posted once to come back then.
 */

static void
ngx_http_idempotency_guard_reading(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    if (r->read_event_handler == ngx_http_test_reading) {
        r->read_event_handler = ngx_http_idempotency_test_reading;
        return;
    }

    if (!ctx->guarded
        && r->read_event_handler != ngx_http_idempotency_test_reading
        && (r->upstream == NULL || r->upstream->cleanup == NULL))
    {
        ctx->guarded = 1;
        ngx_post_event(r->connection->write, &ngx_posted_events);
    }
}


static void
ngx_http_idempotency_test_reading(ngx_http_request_t *r)
{
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx == NULL || ctx->state != NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED
        || ctx->complete)
    {
        r->read_event_handler = ngx_http_test_reading;
        ngx_http_test_reading(r);
        return;
    }

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency: read event, the response goes on");

    r->write_event_handler(r);
}


/* marks buffers as sent: their owner may reuse them */

static void
ngx_http_idempotency_swallow(ngx_chain_t *in)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;

        if (ngx_buf_in_memory(b)) {
            b->pos = b->last;
        }

        if (b->in_file) {
            b->file_pos = b->file_last;
        }
    }
}
