/*
 * The claim's life cycle in one place: claim a key, renew the claim while
 * its request runs, and settle it exactly once (store, release or hold).
 * The handler and the filters both use it; they do not call each other.
 */

#include <stdlib.h>

#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_stats.h"


/* the first line of a completed record, with its CRLF */
#define NGX_HTTP_IDEMPOTENCY_HEAD_LEN                                         \
    (NGX_HTTP_IDEMPOTENCY_RECORD_HEAD_MAX(64, NGX_HTTP_IDEMPOTENCY_OWNER_LEN) \
     + sizeof(CRLF) - 1)


/* duplicates of this worker waiting for a timer now (idempotency_wait) */
ngx_uint_t  ngx_http_idempotency_waiters;


static void ngx_http_idempotency_claim_handler(void *data, redisReply *reply,
    ngx_uint_t rc);
static ngx_int_t ngx_http_idempotency_claim_reply(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, redisReply *reply);
static ngx_int_t ngx_http_idempotency_claim_record(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, redisReply *reply);
static void ngx_http_idempotency_free_reply(void *data);
static void ngx_http_idempotency_resume(ngx_http_request_t *r);
static void ngx_http_idempotency_cleanup(void *data);
static void ngx_http_idempotency_settle_handler(void *data, redisReply *reply,
    ngx_uint_t rc);
static void ngx_http_idempotency_renew_start(ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_renew_handler(ngx_event_t *ev);
static void ngx_http_idempotency_renew_done(void *data, redisReply *reply,
    ngx_uint_t rc);


ngx_http_idempotency_ctx_t *
ngx_http_idempotency_ctx_create(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *ilcf)
{
    ngx_pool_cleanup_t          *cln;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_idempotency_ctx_t));
    if (ctx == NULL) {
        return NULL;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    cln->handler = ngx_http_idempotency_cleanup;
    cln->data = ctx;

    ctx->request = r;
    ctx->conf = ilcf;
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DONE;

    ngx_http_set_ctx(r, ctx, ngx_http_idempotency_module);

    return ctx;
}


ngx_http_idempotency_ctx_t *
ngx_http_idempotency_get_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t          *cln;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_idempotency_module);

    if (ctx != NULL || r->uri_changes > NGX_HTTP_MAX_URI_CHANGES) {
        return ctx;
    }

    /*
     * An internal redirect or a named location (error_page,
     * X-Accel-Redirect, try_files) clears module contexts; the claim must
     * survive it, so the context is found again through its pool cleanup.
     * Subrequests share the pool, hence the check of the owner.
     */

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_idempotency_cleanup) {
            ctx = cln->data;

            if (ctx->request == r) {
                ngx_http_set_ctx(r, ctx, ngx_http_idempotency_module);
                return ctx;
            }
        }
    }

    return NULL;
}


void
ngx_http_idempotency_claim_send(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    u_char      *p;
    ngx_str_t    args[5];
    u_char       ttl[NGX_INT64_LEN];

    /*
     * SET <key> <in-flight record> NX GET PX <lock TTL>: atomic alone, it
     * claims the key when there is no record (nil reply: MISS) and returns
     * the record otherwise, changing nothing (HIT, CONFLICT, MISMATCH,
     * OVERSIZE are decided from it here).  The in-flight record is rebuilt
     * for each claim (a waiter claims again): its creation time and token
     * are those of the claim that may win.
     */

    ctx->created = ngx_time();

    p = ngx_http_idempotency_record_write_head(ctx->inflight_buf,
                                     NGX_HTTP_IDEMPOTENCY_RECORD_INFLIGHT,
                                     ctx->fingerprint,
                                     sizeof(ctx->fingerprint),
                                     ctx->owner, sizeof(ctx->owner),
                                     (unsigned long long) ctx->created, 0);
    *p++ = CR;
    *p++ = LF;

    ctx->inflight.data = ctx->inflight_buf;
    ctx->inflight.len = p - ctx->inflight_buf;

    args[0] = ctx->inflight;
    ngx_str_set(&args[1], "NX");
    ngx_str_set(&args[2], "GET");
    ngx_str_set(&args[3], "PX");
    args[4].data = ttl;
    args[4].len = ngx_sprintf(ttl, "%M", ctx->conf->lock_ttl) - ttl;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency claim \"%V\"", &ctx->rkey);

    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_CLAIMING;
    ctx->claimed = ngx_current_msec;   /* the lock TTL runs from about here */

    ctx->op = ngx_http_idempotency_redis_script(ctx->conf->redis,
                                   NGX_HTTP_IDEMPOTENCY_SCRIPT_CLAIM,
                                   &ctx->rkey, args, 5,
                                   ngx_http_idempotency_claim_handler, ctx,
                                   r->connection->log);

    if (ctx->op == NULL) {
        ctx->redis_rc = NGX_HTTP_IDEMPOTENCY_REDIS_ERROR;
        ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DECIDED;
        ngx_http_idempotency_resume(r);
    }
}


static void
ngx_http_idempotency_claim_handler(void *data, redisReply *reply,
    ngx_uint_t rc)
{
    ngx_http_idempotency_ctx_t *ctx = data;

    ngx_http_request_t  *r;

    r = ctx->request;

    ctx->op = NULL;
    ctx->redis_rc = rc;
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DECIDED;

    if (rc == NGX_HTTP_IDEMPOTENCY_REDIS_OK
        && ngx_http_idempotency_claim_reply(r, ctx, reply) != NGX_OK)
    {
        ctx->redis_rc = NGX_HTTP_IDEMPOTENCY_REDIS_ERROR;
    }

    ngx_http_idempotency_resume(r);
}


/*
 * A nil reply: the key was free and is ours now.  A string: the record
 * someone else wrote, which decides the answer.  Anything else (e.g.
 * WRONGTYPE for a record of an older version of the module, a hash) is a
 * failure of the store.
 */

static ngx_int_t
ngx_http_idempotency_claim_reply(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, redisReply *reply)
{
    if (reply->type == REDIS_REPLY_NIL) {
        ctx->reply_kind = NGX_HTTP_IDEMPOTENCY_MISS;
        return NGX_OK;
    }

    if (reply->type == REDIS_REPLY_STRING) {
        return ngx_http_idempotency_claim_record(r, ctx, reply);
    }

    if (reply->type == REDIS_REPLY_ERROR) {

        if (reply->len >= sizeof("WRONGTYPE") - 1
            && ngx_strncmp(reply->str, "WRONGTYPE", sizeof("WRONGTYPE") - 1)
               == 0)
        {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "idempotency: the record key_hash=%s is not a "
                          "Redis string: written by an earlier version of "
                          "the module (a hash) or by something else; it is "
                          "left alone until it expires",
                          ngx_http_idempotency_key_hash(&ctx->rkey));
            return NGX_ERROR;
        }

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: Redis claim failed: %*s, key_hash=%s",
                      (size_t) reply->len, reply->str,
                      ngx_http_idempotency_key_hash(&ctx->rkey));
        return NGX_ERROR;
    }

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "idempotency: unexpected reply to the claim of key_hash=%s",
                  ngx_http_idempotency_key_hash(&ctx->rkey));

    return NGX_ERROR;
}


/*
 * For a HIT the reply's string becomes the request's: replay points into
 * it (header names, values, the body) without a copy, and a pool cleanup
 * frees it.  hiredis frees the reply object after us and skips a string
 * that is NULL.
 */

static ngx_int_t
ngx_http_idempotency_claim_record(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, redisReply *reply)
{
    ngx_pool_cleanup_t             *cln;
    ngx_http_idempotency_record_t   rec;

    if (ngx_http_idempotency_record_parse((u_char *) reply->str, reply->len,
                                          &rec)
        != 0)
    {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: the record key_hash=%s is corrupt or "
                      "not of this module (%uz bytes), not used",
                      ngx_http_idempotency_key_hash(&ctx->rkey),
                      (size_t) reply->len);
        return NGX_ERROR;
    }

    if (rec.fp_len != sizeof(ctx->fingerprint)
        || ngx_memcmp(rec.fp, ctx->fingerprint, rec.fp_len) != 0)
    {
        ctx->reply_kind = NGX_HTTP_IDEMPOTENCY_MISMATCH;
        return NGX_OK;
    }

    switch (rec.state) {

    case NGX_HTTP_IDEMPOTENCY_RECORD_INFLIGHT:
        ctx->reply_kind = NGX_HTTP_IDEMPOTENCY_CONFLICT;
        return NGX_OK;

    case NGX_HTTP_IDEMPOTENCY_RECORD_OVERSIZE:
        ctx->reply_kind = NGX_HTTP_IDEMPOTENCY_OVERSIZE;
        return NGX_OK;

    default: /* NGX_HTTP_IDEMPOTENCY_RECORD_DONE */
        break;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_idempotency_free_reply;
    cln->data = reply->str;

    reply->str = NULL;
    reply->len = 0;

    ctx->reply_kind = NGX_HTTP_IDEMPOTENCY_HIT;
    ctx->reply_status = rec.status;
    ctx->reply_headers.data = (u_char *) rec.headers;
    ctx->reply_headers.len = rec.headers_len;
    ctx->reply_body.data = (u_char *) rec.body;
    ctx->reply_body.len = rec.body_len;

    return NGX_OK;
}


/* hiredis allocates with malloc() (hiredis 1.x: unless told otherwise) */

static void
ngx_http_idempotency_free_reply(void *data)
{
    free(data);
}


/* runs the phases again from an event that is not the request's own */

static void
ngx_http_idempotency_resume(ngx_http_request_t *r)
{
    ngx_connection_t  *c;

    c = r->connection;

    r->write_event_handler = ngx_http_core_run_phases;

    if (ngx_http_post_request(r, NULL) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ngx_http_run_posted_requests(c);
}


/* the claim reply said MISS: the request goes on to its content */

void
ngx_http_idempotency_claim_won(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED;
    ctx->outcome = NGX_HTTP_IDEMPOTENCY_MISS;
    ngx_http_idempotency_renew_start(ctx);
}


/*
 * While a claimed request runs, its claim is renewed every third of
 * idempotency_lock_ttl: an upstream slower than the lock TTL never lets a
 * retry run the operation a second time, and the lock TTL only bounds how
 * long the claim of a request that died (worker crash) blocks retries.
 */

static void
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


static void
ngx_http_idempotency_cleanup(void *data)
{
    ngx_http_idempotency_ctx_t *ctx = data;

    if (ctx->op) {
        ngx_http_idempotency_redis_cancel(ctx->op);
        ctx->op = NULL;
    }

    if (ctx->wait_timer.timer_set) {
        ngx_del_timer(&ctx->wait_timer);
        ngx_http_idempotency_waiters--;
    }

    ngx_http_idempotency_settle(ctx);
}
