/*
 * Capture of a claimed request's response as it streams to the client, and
 * settling the claim when the response ends: store, release or keep.
 */

#include "ngx_http_idempotency_module.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_stats.h"


/* the first line of a completed record, with its CRLF */
#define NGX_HTTP_IDEMPOTENCY_HEAD_LEN                                         \
    (NGX_HTTP_IDEMPOTENCY_RECORD_HEAD_MAX(64, NGX_HTTP_IDEMPOTENCY_OWNER_LEN) \
     + sizeof(CRLF) - 1)


static ngx_int_t ngx_http_idempotency_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_idempotency_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_idempotency_snapshot(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_uint_t ngx_http_idempotency_stored_header(
    ngx_http_idempotency_ctx_t *ctx, ngx_table_elt_t *h);
static void ngx_http_idempotency_swallow(ngx_chain_t *in);
static void ngx_http_idempotency_renew_handler(ngx_event_t *ev);
static void ngx_http_idempotency_renew_done(void *data, redisReply *reply,
    ngx_uint_t rc);
static ngx_int_t ngx_http_idempotency_capture(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_buf_t *b);
static void ngx_http_idempotency_settle_handler(void *data, redisReply *reply,
    ngx_uint_t rc);


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

    /* an error_page response stands for a failure, whatever its status */

    if (r->error_page
        || !ngx_http_idempotency_status_storable(ctx->conf, ctx->status))
    {
        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "idempotency: status %ui%s is not stored",
                       ctx->status, r->error_page ? " (error_page)" : "");

        ctx->release = 1;
        ngx_http_idempotency_stat_inc(r->error_page
                                      ? NGX_HTTP_IDEMPOTENCY_STAT_ERROR_PAGE
                                      : NGX_HTTP_IDEMPOTENCY_STAT_NOT_STORABLE);
        return ngx_http_next_header_filter(r);
    }

    if (r->headers_out.content_length_n > 0
        && (size_t) r->headers_out.content_length_n
           > ctx->conf->max_response_size)
    {
        ctx->oversize = 1;
        return ngx_http_next_header_filter(r);
    }

    if (ngx_http_idempotency_snapshot(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->capture = 1;

    /* file buffers (proxy temp files) are read into memory for us */

    r->filter_need_in_memory = 1;

    return ngx_http_next_header_filter(r);
}


/*
 * End-to-end headers as "Name: value\r\n" lines, written where they go in
 * the record, which is allocated here: with the response's length when it
 * is known, the body is then captured without a reallocation.
 */

static ngx_int_t
ngx_http_idempotency_snapshot(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    u_char           *p;
    size_t            len;
    ngx_str_t         ct;
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;
    u_char            lm[sizeof("Mon, 28 Sep 1970 06:00:00 GMT")];

    ct = r->headers_out.content_type;

    if (ct.len && r->headers_out.content_type_len == ct.len
        && r->headers_out.charset.len)
    {
        len = ct.len + sizeof("; charset=") - 1 + r->headers_out.charset.len;

        p = ngx_pnalloc(r->pool, len);
        if (p == NULL) {
            return NGX_ERROR;
        }

        ct.data = p;
        p = ngx_cpymem(p, r->headers_out.content_type.data,
                       r->headers_out.content_type.len);
        p = ngx_cpymem(p, "; charset=", sizeof("; charset=") - 1);
        p = ngx_cpymem(p, r->headers_out.charset.data,
                       r->headers_out.charset.len);
        ct.len = p - ct.data;
    }

    len = 0;

    if (ct.len) {
        len += ngx_http_idempotency_record_header_size(
                                   sizeof("Content-Type") - 1, ct.len);
    }

    /* a static file has its date here, not in the list */

    if (r->headers_out.last_modified == NULL
        && r->headers_out.last_modified_time != -1)
    {
        len += ngx_http_idempotency_record_header_size(
                        sizeof("Last-Modified") - 1, sizeof(lm) - 1);
    }

    part = &r->headers_out.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (ngx_http_idempotency_stored_header(ctx, &h[i])) {
            len += ngx_http_idempotency_record_header_size(h[i].key.len,
                                                           h[i].value.len);
        }
    }

    ctx->headers_len = len;
    ctx->body_off = NGX_HTTP_IDEMPOTENCY_RECORD_HEAD_MAX(
                        sizeof(ctx->fingerprint), sizeof(ctx->owner))
                    + len + sizeof(CRLF) - 1;

    if (r->headers_out.content_length_n > 0) {
        ctx->body_size = r->headers_out.content_length_n;
    }

    ctx->record = ngx_pnalloc(r->pool, ctx->body_off + ctx->body_size);
    if (ctx->record == NULL) {
        return NGX_ERROR;
    }

    p = ctx->record + ctx->body_off - len - (sizeof(CRLF) - 1);

    if (ct.len) {
        p = ngx_http_idempotency_record_write_header(p,
                                   (u_char *) "Content-Type",
                                   sizeof("Content-Type") - 1,
                                   ct.data, ct.len);
    }

    if (r->headers_out.last_modified == NULL
        && r->headers_out.last_modified_time != -1)
    {
        (void) ngx_http_time(lm, r->headers_out.last_modified_time);

        p = ngx_http_idempotency_record_write_header(p,
                                   (u_char *) "Last-Modified",
                                   sizeof("Last-Modified") - 1,
                                   lm, sizeof(lm) - 1);
    }

    part = &r->headers_out.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (ngx_http_idempotency_stored_header(ctx, &h[i])) {
            p = ngx_http_idempotency_record_write_header(p,
                                   h[i].key.data, h[i].key.len,
                                   h[i].value.data, h[i].value.len);
        }
    }

    *p++ = CR;
    *p++ = LF;

    return NGX_OK;
}


static ngx_uint_t
ngx_http_idempotency_stored_header(ngx_http_idempotency_ctx_t *ctx,
    ngx_table_elt_t *h)
{
    if (h->hash == 0) {
        return 0;
    }

    return ngx_http_idempotency_header_stored(ctx->conf, &h->key);
}


static ngx_int_t
ngx_http_idempotency_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t                    rc;
    ngx_chain_t                 *cl;
    ngx_http_idempotency_ctx_t  *ctx;

    if (in == NULL || r != r->main) {
        return ngx_http_next_body_filter(r, in);
    }

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx == NULL || ctx->state != NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED
        || !ctx->header_seen)
    {
        return ngx_http_next_body_filter(r, in);
    }

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

    /* the client is never held back: the store goes out as we pass on */

    if (ctx->complete) {
        ngx_http_idempotency_settle(ctx);
    }

    if (ctx->client_gone) {
        ngx_http_idempotency_swallow(in);
        return NGX_OK;
    }

    rc = ngx_http_next_body_filter(r, in);

    /*
     * With proxy_ignore_client_abort the operation goes on upstream after
     * the client went away; a failed write to the client would still make
     * nginx close the upstream, and the response would never be recorded.
     * So the rest of it is taken in here, to be stored, and not sent.
     */

    if (rc == NGX_ERROR
        && r->connection->error
        && !ctx->complete
        && !ctx->release
        && r->upstream
        && r->upstream->conf->ignore_client_abort)
    {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: client of key_hash=%s went away, the "
                      "rest of the response is read for the record only",
                      ngx_http_idempotency_key_hash(&ctx->rkey));

        ctx->client_gone = 1;
        ngx_http_idempotency_swallow(in);
        return NGX_OK;
    }

    return rc;
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


static ngx_int_t
ngx_http_idempotency_capture(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_buf_t *b)
{
    u_char  *p;
    size_t   len, size;

    if (ngx_buf_special(b)) {
        return NGX_OK;
    }

    if (!ngx_buf_in_memory(b)) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: response of key_hash=%s is not in "
                      "memory, stored as not replayable",
                      ngx_http_idempotency_key_hash(&ctx->rkey));
        ctx->capture = 0;
        ctx->oversize = 1;
        return NGX_OK;
    }

    len = b->last - b->pos;

    if (len == 0) {
        return NGX_OK;
    }

    if (ctx->body_len + len > ctx->conf->max_response_size) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: response of key_hash=%s is larger than "
                      "idempotency_max_response_size %uz, "
                      "stored as not replayable",
                      ngx_http_idempotency_key_hash(&ctx->rkey),
                      ctx->conf->max_response_size);
        ctx->capture = 0;
        ctx->oversize = 1;
        return NGX_OK;
    }

    if (ctx->body_len + len > ctx->body_size) {
        size = ngx_max(ctx->body_size * 2, ctx->body_len + len);
        size = ngx_max(size, 4096);
        size = ngx_min(size, ctx->conf->max_response_size);

        p = ngx_pnalloc(r->pool, ctx->body_off + size);
        if (p == NULL) {
            return NGX_ERROR;
        }

        /* the header lines and what came of the body */
        ngx_memcpy(p, ctx->record, ctx->body_off + ctx->body_len);

        ngx_pfree(r->pool, ctx->record);

        ctx->record = p;
        ctx->body_size = size;
    }

    ngx_memcpy(ctx->record + ctx->body_off + ctx->body_len, b->pos, len);
    ctx->body_len += len;

    return NGX_OK;
}


/*
 * Called when the response has gone through, and from the request's
 * cleanup; it acts once.  A response that is not stored releases the claim
 * so that a retry runs; one that ended before it was complete (client gone,
 * upstream cut off) keeps the claim until the lock TTL, because the
 * operation may have run.
 *
 * STORE and RELEASE are retryable ops: if Redis cannot be reached, the
 * adapter keeps the command (with its copy of the response) and sends it
 * again once Redis is back, until the claim's lock TTL ends.  After that a
 * store would be refused by the owner check anyway (the claim is gone or
 * someone else's), so that is the op's deadline.  Running either script
 * twice is harmless: a second STORE with the same owner writes the same
 * record, a second RELEASE finds no claim of ours.
 */

void
ngx_http_idempotency_settle(ngx_http_idempotency_ctx_t *ctx)
{
    u_char                             *p;
    ngx_str_t                           args[3];
    ngx_uint_t                          script, nargs;
    ngx_http_request_t                 *r;
    ngx_http_idempotency_redis_op_t    *op;
    ngx_http_idempotency_loc_conf_t    *ilcf;
    u_char                              ttl[NGX_INT_T_LEN];
    u_char                              head[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];

    if (ctx->renew_timer.timer_set) {
        ngx_del_timer(&ctx->renew_timer);
    }

    if (ctx->state != NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED) {
        return;
    }

    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_SETTLED;

    r = ctx->request;
    ilcf = ctx->conf;

    if (!ctx->release && !ctx->complete) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: response of key_hash=%s did not "
                      "complete, the claim is kept until "
                      "idempotency_lock_ttl ends",
                      ngx_http_idempotency_key_hash(&ctx->rkey));
        ngx_http_idempotency_stat_inc(NGX_HTTP_IDEMPOTENCY_STAT_INCOMPLETE);
        return;
    }

    /* the fence: the in-flight record this request's claim wrote */

    args[0] = ctx->inflight;

    if (ctx->release) {
        script = NGX_HTTP_IDEMPOTENCY_SCRIPT_RELEASE;
        nargs = 1;

    } else {
        script = NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE;
        nargs = 3;
        ngx_http_idempotency_stat_inc(ctx->oversize
                                      ? NGX_HTTP_IDEMPOTENCY_STAT_TOO_LARGE
                                      : NGX_HTTP_IDEMPOTENCY_STAT_STORED);

        p = ngx_http_idempotency_record_write_head(head,
                                 ctx->oversize
                                 ? NGX_HTTP_IDEMPOTENCY_RECORD_OVERSIZE
                                 : NGX_HTTP_IDEMPOTENCY_RECORD_DONE,
                                 ctx->fingerprint, sizeof(ctx->fingerprint),
                                 ctx->owner, sizeof(ctx->owner),
                                 (unsigned long long) ctx->created,
                                 ctx->status);
        args[1].len = p - head;

        if (ctx->oversize) {
            *p++ = CR;
            *p++ = LF;

            args[1].data = head;
            args[1].len += sizeof(CRLF) - 1;

        } else {

            /* the first line goes right in front of the header lines */

            args[1].data = ctx->record + ctx->body_off - ctx->headers_len
                           - (sizeof(CRLF) - 1) - args[1].len;
            ngx_memcpy(args[1].data, head, args[1].len);

            args[1].len += ctx->headers_len + sizeof(CRLF) - 1
                           + ctx->body_len;
        }

        args[2].data = ttl;
        args[2].len = ngx_sprintf(ttl, "%M", ilcf->ttl) - ttl;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency %s \"%V\"",
                   script == NGX_HTTP_IDEMPOTENCY_SCRIPT_RELEASE
                   ? "release" : "store", &ctx->rkey);

    op = ngx_http_idempotency_redis_script_retry(ilcf->redis, script,
                                           &ctx->rkey, args, nargs,
                                           ctx->claimed + ilcf->lock_ttl,
                                           ngx_http_idempotency_settle_handler,
                                           NULL, r->connection->log);
    if (op == NULL) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: cannot send or keep the %s of "
                      "key_hash=%s (no memory, or the worker is exiting), "
                      "the claim stays until idempotency_lock_ttl ends",
                      script == NGX_HTTP_IDEMPOTENCY_SCRIPT_RELEASE
                      ? "release" : "store",
                      ngx_http_idempotency_key_hash(&ctx->rkey));
        ngx_http_idempotency_stat_inc(ctx->release
                                ? NGX_HTTP_IDEMPOTENCY_STAT_RELEASE_GIVEN_UP
                                : NGX_HTTP_IDEMPOTENCY_STAT_STORE_GIVEN_UP);
    }
}


/*
 * No request here: it may be long gone (and this runs at worker exit too);
 * data is the op's own info, with its copy of the key.
 */

static void
ngx_http_idempotency_settle_handler(void *data, redisReply *reply,
    ngx_uint_t rc)
{
    ngx_http_idempotency_redis_info_t *info = data;

    ngx_uint_t   release;
    const char  *what;

    release = (info->script == NGX_HTTP_IDEMPOTENCY_SCRIPT_RELEASE);
    what = release ? "releasing the claim on" : "storing the response for";

    if (rc != NGX_HTTP_IDEMPOTENCY_REDIS_OK) {

        /* given up by the adapter: retried until the lock TTL, or not */

        ngx_http_idempotency_stat_inc(release
                                ? NGX_HTTP_IDEMPOTENCY_STAT_RELEASE_GIVEN_UP
                                : NGX_HTTP_IDEMPOTENCY_STAT_STORE_GIVEN_UP);

        if (release) {
            ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                          "idempotency: gave up %s key_hash=%s (%s; "
                          "attempts: %ui, last error: %s): a retry gets 409 "
                          "until idempotency_lock_ttl ends, then runs",
                          what, ngx_http_idempotency_key_hash(&info->key),
                          info->reason ? info->reason : "failed",
                          info->attempts, info->error ? info->error : "none");

        } else {
            ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                          "idempotency: gave up %s key_hash=%s (%s; "
                          "attempts: %ui, last error: %s): the response is "
                          "lost; once idempotency_lock_ttl ends, a retry "
                          "runs the operation again",
                          what, ngx_http_idempotency_key_hash(&info->key),
                          info->reason ? info->reason : "failed",
                          info->attempts, info->error ? info->error : "none");
        }

    } else if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "idempotency: Redis error while settling key_hash=%s: "
                      "%*s", ngx_http_idempotency_key_hash(&info->key),
                      (size_t) reply->len, reply->str);
        ngx_http_idempotency_stat_inc(release
                               ? NGX_HTTP_IDEMPOTENCY_STAT_RELEASE_REDIS_ERROR
                               : NGX_HTTP_IDEMPOTENCY_STAT_STORE_REDIS_ERROR);

    } else if (reply->type == REDIS_REPLY_INTEGER && reply->integer == 0) {

        if (release) {
            /* e.g. a resent RELEASE whose first copy did run */
            ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                          "idempotency: the claim on key_hash=%s was gone "
                          "when it was released",
                          ngx_http_idempotency_key_hash(&info->key));

        } else {
            ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                          "idempotency: the claim on key_hash=%s was lost "
                          "(%s), the response was not stored",
                          ngx_http_idempotency_key_hash(&info->key),
                          info->parked
                          ? "Redis was away: it restarted without "
                            "persistence, or idempotency_lock_ttl ended"
                          : "its idempotency_lock_ttl ended before the "
                            "response");
            ngx_http_idempotency_stat_inc(
                                NGX_HTTP_IDEMPOTENCY_STAT_STORE_CLAIM_LOST);
        }

    } else if (info->parked) {
        ngx_log_error(NGX_LOG_NOTICE, ngx_cycle->log, 0,
                      "idempotency: %s key_hash=%s succeeded after a retry "
                      "(attempts: %ui)", what,
                      ngx_http_idempotency_key_hash(&info->key),
                      info->attempts);
    }
}


/*
 * While a claimed request runs, its claim is renewed every third of
 * idempotency_lock_ttl: an upstream slower than the lock TTL never lets a
 * retry run the operation a second time, and the lock TTL only bounds how
 * long the claim of a request that died (worker crash) blocks retries.
 */

void
ngx_http_idempotency_renew_start(ngx_http_idempotency_ctx_t *ctx)
{
    ngx_event_t  *ev;

    ev = &ctx->renew_timer;
    ev->handler = ngx_http_idempotency_renew_handler;
    ev->data = ctx;
    ev->log = ctx->request->connection->log;

    ngx_add_timer(ev, ngx_max(ctx->conf->lock_ttl / 3, 1));
}


static void
ngx_http_idempotency_renew_handler(ngx_event_t *ev)
{
    ngx_str_t                    args[2];
    u_char                       ttl[NGX_INT_T_LEN];
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ev->data;

    if (ctx->state != NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED) {
        return;
    }

    args[0] = ctx->inflight;
    args[1].data = ttl;
    args[1].len = ngx_sprintf(ttl, "%M", ctx->conf->lock_ttl) - ttl;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, ev->log, 0,
                   "idempotency renew \"%V\"", &ctx->rkey);

    /* the store step's deadline moves with the claim's expiry */

    if (ngx_http_idempotency_redis_script(ctx->conf->redis,
                                          NGX_HTTP_IDEMPOTENCY_SCRIPT_RENEW,
                                          &ctx->rkey, args, 2,
                                          ngx_http_idempotency_renew_done,
                                          NULL, ev->log)
        != NULL)
    {
        ctx->claimed = ngx_current_msec;
    }

    ngx_add_timer(ev, ngx_max(ctx->conf->lock_ttl / 3, 1));
}


/* no request here; data is the op's copy of the key */

static void
ngx_http_idempotency_renew_done(void *data, redisReply *reply, ngx_uint_t rc)
{
    ngx_str_t *key = data;

    /*
     * An error reply (NOPERM, OOM, ...) leaves the claim to expire at its
     * old time; a connection failure is logged by the connection itself.
     * The next renewal tries again either way.
     */

    if (rc == NGX_HTTP_IDEMPOTENCY_REDIS_OK
        && reply->type == REDIS_REPLY_ERROR)
    {
        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "idempotency: renewing the claim on key_hash=%s "
                      "failed: %*s; if its request outlasts "
                      "idempotency_lock_ttl, a retry may run the operation "
                      "again", ngx_http_idempotency_key_hash(key),
                      (size_t) reply->len, reply->str);
        return;
    }

    if (rc == NGX_HTTP_IDEMPOTENCY_REDIS_OK
        && reply->type == REDIS_REPLY_INTEGER && reply->integer == 0)
    {
        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "idempotency: the claim on key_hash=%s was lost while "
                      "its request was running (expired or removed in "
                      "Redis); a retry may run the operation again",
                      ngx_http_idempotency_key_hash(key));
        ngx_http_idempotency_stat_inc(NGX_HTTP_IDEMPOTENCY_STAT_CLAIM_LOST);
    }
}
