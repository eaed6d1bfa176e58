/*
 * The claim's end: judged at the response header (recorded, released or
 * held) and settled exactly once (the store, release or hold sent, its
 * reply told to the held response, the waiters and the node's cache); and
 * the release of a claim nothing ran under.  Used by the claim
 * (ngx_http_idempotency_claim.c) and the filters; calls nothing above it.
 */

#include "ngx_http_idempotency_settle.h"
#include "ngx_http_idempotency_cache.h"
#include "ngx_http_idempotency_capture.h"
#include "ngx_http_idempotency_hold.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_stats.h"
#include "ngx_http_idempotency_wait.h"


/* the first line of a completed record, with its CRLF */
#define NGX_HTTP_IDEMPOTENCY_HEAD_LEN                                         \
    (NGX_HTTP_IDEMPOTENCY_RECORD_HEAD_MAX(64, NGX_HTTP_IDEMPOTENCY_OWNER_LEN) \
     + sizeof(CRLF) - 1)


static ngx_uint_t ngx_http_idempotency_upstream_failed(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_settle_handler(void *data, redisReply *reply,
    ngx_uint_t rc);
static void ngx_http_idempotency_store_refused(
    ngx_http_idempotency_redis_info_t *info, long long why);


/*
 * At the response header: a response nginx made after the upstream was
 * sent the request and then failed (reset, timeout, invalid header: 502
 * or 504) leaves the outcome unknown; other responses follow the status
 * policy, and an error_page after the claim releases.
 */

void
ngx_http_idempotency_claim_judge(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_uint_t  redirected;

    if (ngx_http_idempotency_upstream_failed(r, ctx)) {
        ngx_http_idempotency_stat_count(ctx->conf->metrics,
                              NGX_HTTP_IDEMPOTENCY_STAT_UPSTREAM_ERROR);

        if (ctx->conf->on_upstream_error
            == NGX_HTTP_IDEMPOTENCY_UPSTREAM_ERROR_RELEASE)
        {
            ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                          "idempotency: the upstream failed after it got "
                          "the request of key_hash=%s, the claim is "
                          "released (idempotency_on_upstream_error release)",
                          ngx_http_idempotency_key_hash(&ctx->rkey));
            ctx->release = 1;
            return;
        }

        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: the upstream failed after it got the "
                      "request of key_hash=%s, the outcome is unknown and "
                      "held for idempotency_ttl",
                      ngx_http_idempotency_key_hash(&ctx->rkey));
        ctx->hold = 1;
        return;
    }

    if (ctx->status < 200 && ngx_http_idempotency_upstream_reached(r)) {
        /*
         * nginx before 1.29 passes an upstream's 103 Early Hints on as
         * its final answer and drops the real one: the operation ran, but
         * its response is lost
         */
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: the upstream's interim %ui response "
                      "ended the request of key_hash=%s, the outcome is "
                      "unknown and held for idempotency_ttl",
                      ctx->status, ngx_http_idempotency_key_hash(&ctx->rkey));
        ctx->hold = 1;
        return;
    }

    redirected = (r->error_page && !ctx->error_page);

    if (redirected
        || !ngx_http_idempotency_status_storable(ctx->conf, ctx->status))
    {
        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "idempotency: status %ui%s is not stored",
                       ctx->status, redirected ? " (error_page)" : "");

        ctx->release = 1;
        ngx_http_idempotency_stat_count(ctx->conf->metrics, redirected
                                      ? NGX_HTTP_IDEMPOTENCY_STAT_ERROR_PAGE
                                      : NGX_HTTP_IDEMPOTENCY_STAT_NOT_STORABLE);
    }
}


/* some upstream of this request was sent (part of) the request */

ngx_uint_t
ngx_http_idempotency_upstream_reached(ngx_http_request_t *r)
{
    ngx_uint_t                  i;
    ngx_http_upstream_state_t  *state;

    if (r->upstream && r->upstream->request_sent) {
        return 1;
    }

    if (r->upstream_states == NULL) {
        return 0;
    }

    state = r->upstream_states->elts;

    for (i = 0; i < r->upstream_states->nelts; i++) {
        if (state[i].bytes_sent) {
            return 1;
        }
    }

    return 0;
}


/*
 * A 502 or 504 that nginx made (r->err_status, or an error_page after the
 * claim) for an upstream that was sent the request: its state says 502 or
 * 504, and the upstream's own status line, if any, says something else.
 */

static ngx_uint_t
ngx_http_idempotency_upstream_failed(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_uint_t                  i, n;
    ngx_http_upstream_state_t  *state;

    if (r->err_status == 0 && !(r->error_page && !ctx->error_page)) {
        return 0;
    }

    if (r->upstream_states == NULL) {
        return 0;
    }

    state = r->upstream_states->elts;
    n = r->upstream_states->nelts;

    for (i = 0; i < n; i++) {

        if (state[i].status != NGX_HTTP_BAD_GATEWAY
            && state[i].status != NGX_HTTP_GATEWAY_TIME_OUT)
        {
            continue;
        }

        if (state[i].bytes_sent == 0
            && !(i == n - 1 && r->upstream && r->upstream->request_sent))
        {
            continue;
        }

        if (i == n - 1 && r->upstream
            && r->upstream->headers_in.status_n == state[i].status)
        {
            /* the upstream's own 502/504, e.g. proxy_intercept_errors */
            continue;
        }

        return 1;
    }

    return 0;
}


/*
 * Called when the response has gone through, and from the request's
 * cleanup; it acts once, and every claim ends in exactly one of:
 *
 *   recorded   the complete response (or the over-size marker) is stored;
 *   released   nothing ran, or the status policy says a retry runs again;
 *   held       the outcome is unknown (the upstream failed after it got the
 *              request, or the response ended before its end): an
 *              "unknown" record, kept for idempotency_ttl, answers retries
 *              with a problem and the operation never runs twice.
 *
 * Returns NGX_OK when a STORE or RELEASE was sent, whose reply the last
 * buffer may wait for, NGX_DECLINED otherwise.
 *
 * STORE and RELEASE are retryable ops: if Redis cannot be reached, the
 * adapter keeps the command (with the response: a copy, or for a large
 * body the captured buffer itself, which it then takes from ctx->record)
 * and sends it again once Redis is back, until the claim's lock TTL ends.
 * After that a store would be refused by the owner check anyway (the
 * claim is gone or someone else's), so that is the op's deadline.  Running
 * either script twice is harmless: a second STORE with the same owner
 * writes the same record, a second RELEASE finds no claim of ours.
 */

ngx_int_t
ngx_http_idempotency_settle(ngx_http_idempotency_ctx_t *ctx)
{
    u_char                             *p;
    ngx_int_t                           rc;
    ngx_str_t                           args[3];
    ngx_uint_t                          script, nargs;
    ngx_array_t                        *more;
    ngx_http_request_t                 *r;
    ngx_http_idempotency_redis_op_t    *op;
    ngx_http_idempotency_loc_conf_t    *ilcf;
    u_char                              ttl[NGX_INT_T_LEN];
    u_char                              head[NGX_HTTP_IDEMPOTENCY_HEAD_LEN];

    if (ctx->renew_timer.timer_set) {
        ngx_del_timer(&ctx->renew_timer);
    }

    if (ctx->state != NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED) {
        return NGX_DECLINED;
    }

    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_SETTLED;

    r = ctx->request;
    ilcf = ctx->conf;

    if (!ctx->release && !ctx->hold && !ctx->complete) {

        /*
         * A content handler that set up no upstream of this request (a
         * Lua capture, an njs subrequest, ...) may have run the operation
         * where this request cannot see it: held, never released
         */

        if (!ctx->header_seen
            && !(ctx->content_called && r->upstream == NULL)
            && !ngx_http_idempotency_upstream_reached(r))
        {
            ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                           "idempotency: nothing ran for \"%V\", released",
                           &ctx->rkey);
            ngx_http_idempotency_stat_count(ilcf->metrics,
                                        NGX_HTTP_IDEMPOTENCY_STAT_NOT_RUN);
            ctx->release = 1;

        } else {
            ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                          "idempotency: response of key_hash=%s did not "
                          "complete, the outcome is unknown and held for "
                          "idempotency_ttl",
                          ngx_http_idempotency_key_hash(&ctx->rkey));
            ngx_http_idempotency_stat_count(ilcf->metrics,
                                   NGX_HTTP_IDEMPOTENCY_STAT_INCOMPLETE);
            ctx->hold = 1;
        }
    }

    /* the fence: the in-flight record this request's claim wrote */

    args[0] = ctx->inflight;
    more = NULL;

    if (ctx->release) {
        script = NGX_HTTP_IDEMPOTENCY_SCRIPT_RELEASE;
        nargs = 1;

    } else if (ctx->hold) {
        script = NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE;
        nargs = 3;

        p = ngx_http_idempotency_record_write_head(head,
                                 NGX_HTTP_IDEMPOTENCY_RECORD_UNKNOWN,
                                 ctx->fingerprint, sizeof(ctx->fingerprint),
                                 ctx->owner, sizeof(ctx->owner),
                                 (unsigned long long) ctx->created,
                                 (ctx->status >= 200 && ctx->status < 600)
                                 ? (int) ctx->status : NGX_HTTP_BAD_GATEWAY);
        *p++ = CR;
        *p++ = LF;

        args[1].data = head;
        args[1].len = p - head;
        args[2].data = ttl;
        args[2].len = ngx_sprintf(ttl, "%M", ilcf->ttl) - ttl;

    } else {
        script = NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE;
        nargs = 3;
        ngx_http_idempotency_stat_count(ilcf->metrics, ctx->oversize
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

            /* the body's first part: the rest is in ctx->more */
            args[1].len += ctx->headers_len + sizeof(CRLF) - 1
                           + ctx->body_len - ctx->more_len;
            more = ctx->more;

            if (ngx_http_idempotency_trailers(r, ctx, &args[1]) != NGX_OK) {
                goto failed;
            }
        }

        args[2].data = ttl;
        args[2].len = ngx_sprintf(ttl, "%M", ilcf->ttl) - ttl;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency %s \"%V\"",
                   script == NGX_HTTP_IDEMPOTENCY_SCRIPT_RELEASE
                   ? "release" : "store", &ctx->rkey);

    if (script == NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE && ilcf->cache
        && !ctx->hold && !ctx->oversize && more == NULL)
    {
        /* used once Redis has stored it: see the settle handler */
        ngx_http_idempotency_cache_pending(ilcf->cache, ilcf->redis,
                                           &ctx->rkey, &args[0], &args[1],
                                           ilcf->ttl);
    }

    if (script == NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE) {
        /* a large body is written from ctx->record, which it may take */
        rc = ngx_http_idempotency_redis_store(ilcf->redis, &ctx->rkey, args,
                                           ctx->claimed + ilcf->lock_ttl,
                                           ngx_http_idempotency_settle_handler,
                                           NULL, r->connection->log,
                                           r->pool, &ctx->record,
                                           more, ctx->more_len);

    } else {
        op = ngx_http_idempotency_redis_script_retry(ilcf->redis, script,
                                           &ctx->rkey, args, nargs,
                                           ctx->claimed + ilcf->lock_ttl,
                                           ngx_http_idempotency_settle_handler,
                                           NULL, r->connection->log);
        rc = op ? NGX_OK : NGX_ERROR;
    }

    if (rc == NGX_OK) {
        ngx_http_idempotency_wait_notify(ilcf, &ctx->rkey, script, args,
                                         more, r->connection->log);
        return NGX_OK;
    }

failed:

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
    return NGX_DECLINED;
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

    ngx_http_idempotency_hold_settled(info);
    ngx_http_idempotency_wait_settled(&info->key);

    if (!release) {
        ngx_http_idempotency_cache_commit(&info->key, &info->arg,
                               rc == NGX_HTTP_IDEMPOTENCY_REDIS_OK
                               && reply->type == REDIS_REPLY_INTEGER
                               && reply->integer
                                  == NGX_HTTP_IDEMPOTENCY_STORE_DONE);
    }

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

    } else if (release
               && reply->type == REDIS_REPLY_INTEGER && reply->integer == 0)
    {
        /* e.g. a resent RELEASE whose first copy did run */
        ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                      "idempotency: the claim on key_hash=%s was gone "
                      "when it was released",
                      ngx_http_idempotency_key_hash(&info->key));

    } else if (!release && reply->type == REDIS_REPLY_INTEGER
               && reply->integer != NGX_HTTP_IDEMPOTENCY_STORE_DONE)
    {
        ngx_http_idempotency_store_refused(info, reply->integer);
        ngx_http_idempotency_stat_inc(
                                NGX_HTTP_IDEMPOTENCY_STAT_STORE_CLAIM_LOST);

    } else if (info->parked) {
        ngx_log_error(NGX_LOG_NOTICE, ngx_cycle->log, 0,
                      "idempotency: %s key_hash=%s succeeded after a retry "
                      "(attempts: %ui)", what,
                      ngx_http_idempotency_key_hash(&info->key),
                      info->attempts);
    }
}


/*
 * The store script's fence refused the store (its chunks, for a split
 * record, are removed): the log says why, as the script found it
 */

static void
ngx_http_idempotency_store_refused(ngx_http_idempotency_redis_info_t *info,
    long long why)
{
    const char  *reason;

    if (why == NGX_HTTP_IDEMPOTENCY_STORE_NO_BODY) {
        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "idempotency: a chunk of the body of key_hash=%s was "
                      "missing when its head was stored (expired, evicted, "
                      "or lost in a failover), the response was not stored",
                      ngx_http_idempotency_key_hash(&info->key));
        return;
    }

    if (why == NGX_HTTP_IDEMPOTENCY_STORE_TAKEN) {
        reason = "the key holds another request's claim or record: ours "
                 "was removed or its idempotency_lock_ttl ended, and a "
                 "retry claimed the key";

    } else if (info->parked) {
        reason = "Redis was away: it restarted without persistence, or "
                 "idempotency_lock_ttl ended, or the claim was removed; "
                 "the key was gone";

    } else {
        reason = "the key was gone: the claim was removed "
                 "(idempotency_admin, by hand, evicted) or its "
                 "idempotency_lock_ttl ended before the response";
    }

    ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                  "idempotency: the claim on key_hash=%s was lost (%s), "
                  "the response was not stored",
                  ngx_http_idempotency_key_hash(&info->key), reason);
}


/*
 * Releases a claim that may exist in Redis while nothing runs under it:
 * a claim whose reply was lost, or a request that ended before its content
 * ran.  The fence (our in-flight record, owner token included) makes it a
 * no-op when the SET was not applied.
 */

void
ngx_http_idempotency_abandon(ngx_http_idempotency_ctx_t *ctx)
{
    ngx_http_request_t  *r;

    r = ctx->request;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency abandon \"%V\"", &ctx->rkey);

    if (ngx_http_idempotency_redis_script_retry(ctx->conf->redis,
                                   NGX_HTTP_IDEMPOTENCY_SCRIPT_RELEASE,
                                   &ctx->rkey, &ctx->inflight, 1,
                                   ctx->claimed + ctx->conf->lock_ttl,
                                   ngx_http_idempotency_settle_handler,
                                   NULL, r->connection->log)
        == NULL)
    {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: cannot release the unanswered claim of "
                      "key_hash=%s, a retry gets 409 until "
                      "idempotency_lock_ttl ends",
                      ngx_http_idempotency_key_hash(&ctx->rkey));
    }
}
