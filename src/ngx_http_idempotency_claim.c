/*
 * The claim's life cycle up to its end: claim a key (the owner token, the
 * node's cache, the reply's verdict), run the claimed request (its content
 * handler wrapped) and renew the claim meanwhile; the request's cleanup.
 * Its end, judged and settled once, is ngx_http_idempotency_settle.c.
 * The handler uses it; it calls nothing above it.
 */

#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_body.h"
#include "ngx_http_idempotency_cache.h"
#include "ngx_http_idempotency_hold.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_settle.h"
#include "ngx_http_idempotency_stats.h"
#include "ngx_http_idempotency_wait.h"

#include <stdlib.h>

#include <openssl/rand.h>


/* per worker: the owner token's parts, see ngx_http_idempotency_owner() */
static u_char         ngx_http_idempotency_owner_seed[8];
static uint64_t       ngx_http_idempotency_owner_count;


static void ngx_http_idempotency_owner(ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_claim_handler(void *data, redisReply *reply,
    ngx_uint_t rc);
static ngx_int_t ngx_http_idempotency_claim_reply(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, redisReply *reply);
static ngx_int_t ngx_http_idempotency_claim_record(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, redisReply *reply);
static ngx_int_t ngx_http_idempotency_claim_cached(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_claim_judge_record(
    ngx_http_request_t *r, ngx_http_idempotency_ctx_t *ctx, u_char *p,
    size_t len, ngx_http_idempotency_record_t *rec, ngx_uint_t checked);
static void ngx_http_idempotency_free_reply(void *data);
static void ngx_http_idempotency_resume(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_renew_start(ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_renew_handler(ngx_event_t *ev);
static void ngx_http_idempotency_renew_done(void *data, redisReply *reply,
    ngx_uint_t rc);
static ngx_int_t ngx_http_idempotency_content_handler(ngx_http_request_t *r);
static void ngx_http_idempotency_finish_upstream(ngx_http_request_t *r,
    ngx_http_event_handler_pt read, ngx_http_event_handler_pt write);


ngx_int_t
ngx_http_idempotency_claim_init_process(ngx_cycle_t *cycle)
{
    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    if (RAND_bytes(ngx_http_idempotency_owner_seed,
                   sizeof(ngx_http_idempotency_owner_seed))
        != 1)
    {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "idempotency: RAND_bytes() failed");
        return NGX_ERROR;
    }

    ngx_http_idempotency_owner_count = 0;

    return NGX_OK;
}


void
ngx_http_idempotency_claim_send(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    u_char      *p;
    ngx_str_t    args[5];
    u_char       ttl[NGX_INT64_LEN];

    if (ctx->conf->cache
        && ngx_http_idempotency_claim_cached(r, ctx) == NGX_OK)
    {
        ctx->redis_rc = NGX_HTTP_IDEMPOTENCY_REDIS_OK;
        ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DECIDED;
        ngx_http_idempotency_resume(r, ctx);
        return;
    }

    /*
     * SET <key> <in-flight record> NX GET PX <lock TTL>: atomic alone, it
     * claims the key when there is no record (nil reply: MISS) and returns
     * the record otherwise, changing nothing (HIT, CONFLICT, MISMATCH,
     * OVERSIZE are decided from it here).  The in-flight record is rebuilt
     * for each claim (a waiter claims again): its creation time and token
     * are those of the claim that may win.
     */

    if (ctx->owner[0] == '\0') {
        /* once, for the first claim: a waiter claims again with it */
        ngx_http_idempotency_owner(ctx);
    }

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
        ngx_http_idempotency_resume(r, ctx);
    }
}


/*
 * The owner token only has to differ from that of every other claim of the
 * same record, in any worker of any node, before and after restarts: the
 * store, release and renew steps act only while the record is still the
 * in-flight record with this token.  It is the hex of 8 random bytes drawn
 * once per worker (RAND_bytes at worker start), the worker's pid and a
 * 64-bit counter.  Within a worker the counter never repeats; two workers
 * (on any node, at any time) would need the same 64 random bits, about one
 * chance in 2^64 per pair, and then, on one node at one time, also the same
 * pid, which the kernel does not give to two live processes.  The random
 * bytes are drawn once, not per request: RAND_bytes costs more than the
 * rest of a HIT in the module.  Made by the first claim sent to Redis
 * (a replay from the node's cache needs none).
 */

static void
ngx_http_idempotency_owner(ngx_http_idempotency_ctx_t *ctx)
{
    u_char    *p;
    uint32_t   pid;
    uint64_t   n;
    u_char     raw[8 + 4 + 8];
    ngx_int_t  i;

    pid = (uint32_t) ngx_pid;
    n = ++ngx_http_idempotency_owner_count;

    p = ngx_cpymem(raw, ngx_http_idempotency_owner_seed, 8);

    for (i = 3; i >= 0; i--) {
        p[i] = (u_char) (pid & 0xff);
        pid >>= 8;
    }

    p += 4;

    for (i = 7; i >= 0; i--) {
        p[i] = (u_char) (n & 0xff);
        n >>= 8;
    }

    ngx_hex_dump(ctx->owner, raw, sizeof(raw));
}


static void
ngx_http_idempotency_claim_handler(void *data, redisReply *reply,
    ngx_uint_t rc)
{
    ngx_http_idempotency_ctx_t *ctx = data;

    ngx_int_t            n;
    ngx_http_request_t  *r;

    r = ctx->request;

    ctx->op = NULL;
    ctx->redis_rc = rc;
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DECIDED;

    if (rc == NGX_HTTP_IDEMPOTENCY_REDIS_UNSENT) {
        /* it waited for a connection in vain: Redis never saw it */
        ctx->redis_rc = NGX_HTTP_IDEMPOTENCY_REDIS_ERROR;

    } else if (rc != NGX_HTTP_IDEMPOTENCY_REDIS_OK) {

        /*
         * The SET may have been applied although its reply did not come
         * (timeout, connection lost): nothing runs under this claim, so it
         * is released rather than left to lock the key until the lock TTL.
         */

        ngx_http_idempotency_abandon(ctx);

    } else {
        n = ngx_http_idempotency_claim_reply(r, ctx, reply);

        if (n == NGX_AGAIN) {
            /* a split record: its body is fetched first (body.c) */
            return;
        }

        if (n != NGX_OK) {
            ctx->redis_rc = NGX_HTTP_IDEMPOTENCY_REDIS_ERROR;
        }
    }

    ngx_http_idempotency_resume(r, ctx);
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
    ngx_int_t                       rc;
    ngx_pool_cleanup_t             *cln;
    ngx_http_idempotency_record_t   rec;

    rc = ngx_http_idempotency_claim_judge_record(r, ctx, (u_char *) reply->str,
                                                 reply->len, &rec, 0);

    if (rc != NGX_OK || ctx->reply_kind != NGX_HTTP_IDEMPOTENCY_HIT) {
        return rc;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_idempotency_free_reply;
    cln->data = reply->str;

    reply->str = NULL;
    reply->len = 0;

    if (rec.state == NGX_HTTP_IDEMPOTENCY_RECORD_SPLIT) {
        return ngx_http_idempotency_body_fetch(r, ctx, &rec);
    }

    /* the node's cache gets it too, for as long as Redis keeps it */

    if (ctx->conf->cache) {
        ngx_http_idempotency_cache_fetched(ctx->conf->cache, ctx->conf->redis,
                                           &ctx->rkey, r->connection->log);
    }

    return NGX_OK;
}


/*
 * The replay cache, before Redis: a record found there is judged as one
 * from Redis (a replay or 422); anything else goes to Redis.
 */

static ngx_int_t
ngx_http_idempotency_claim_cached(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_str_t                       v;
    ngx_http_idempotency_record_t   rec;

    ctx->cache = NGX_HTTP_IDEMPOTENCY_CACHE_MISS;

    if (ngx_http_idempotency_cache_get(ctx->conf->cache, ctx->conf->redis,
                                       &ctx->rkey, r->pool, &v)
        != NGX_OK)
    {
        ngx_http_idempotency_stat_label_inc(ctx->conf->metrics,
                                       NGX_HTTP_IDEMPOTENCY_STAT_CACHE_MISS);
        return NGX_DECLINED;
    }

    ngx_http_idempotency_stat_label_inc(ctx->conf->metrics,
                                        NGX_HTTP_IDEMPOTENCY_STAT_CACHE_HIT);

    /* checked when it went in: read back, or written by this node */

    if (ngx_http_idempotency_claim_judge_record(r, ctx, v.data, v.len, &rec,
                                                1)
        != NGX_OK
        || (ctx->reply_kind != NGX_HTTP_IDEMPOTENCY_HIT
            && ctx->reply_kind != NGX_HTTP_IDEMPOTENCY_MISMATCH)
        || rec.state != NGX_HTTP_IDEMPOTENCY_RECORD_DONE)
    {
        return NGX_DECLINED;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency cache hit \"%V\"", &ctx->rkey);

    ctx->cache = NGX_HTTP_IDEMPOTENCY_CACHE_HIT;

    return NGX_OK;
}


/*
 * A record's verdict for this request: the reply's fields point into
 * "p", which must live as long as the request.  "checked": the record
 * was parsed and validated before (the node's cache), only read here.
 */

static ngx_int_t
ngx_http_idempotency_claim_judge_record(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, u_char *p, size_t len,
    ngx_http_idempotency_record_t *rec, ngx_uint_t checked)
{
    int          rc;
    const char  *reason;

    rc = checked ? ngx_http_idempotency_record_parse_known(p, len, rec)
                 : ngx_http_idempotency_record_parse(p, len, rec);

    if (rc != 0) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: the record key_hash=%s is corrupt or "
                      "not of this module (%uz bytes), not used",
                      ngx_http_idempotency_key_hash(&ctx->rkey), len);
        return NGX_ERROR;
    }

    if (rec->fp_len != sizeof(ctx->fingerprint)
        || ngx_memcmp(rec->fp, ctx->fingerprint, rec->fp_len) != 0)
    {
        ctx->reply_kind = NGX_HTTP_IDEMPOTENCY_MISMATCH;
        return NGX_OK;
    }

    switch (rec->state) {

    case NGX_HTTP_IDEMPOTENCY_RECORD_INFLIGHT:
        ctx->reply_kind = NGX_HTTP_IDEMPOTENCY_CONFLICT;
        return NGX_OK;

    case NGX_HTTP_IDEMPOTENCY_RECORD_OVERSIZE:
        ctx->reply_kind = NGX_HTTP_IDEMPOTENCY_OVERSIZE;
        return NGX_OK;

    case NGX_HTTP_IDEMPOTENCY_RECORD_UNKNOWN:
        ctx->reply_kind = NGX_HTTP_IDEMPOTENCY_UNKNOWN;
        return NGX_OK;

    default: /* NGX_HTTP_IDEMPOTENCY_RECORD_DONE or _SPLIT */
        break;
    }

    /*
     * never a response from a record the module could not have written;
     * a split record's head is checked before its body is fetched
     */

    if (!checked && ngx_http_idempotency_record_validate(rec, &reason) != 0) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: the record key_hash=%s is corrupt: %s; "
                      "not replayed",
                      ngx_http_idempotency_key_hash(&ctx->rkey), reason);
        return NGX_ERROR;
    }

    ctx->reply_kind = NGX_HTTP_IDEMPOTENCY_HIT;
    ctx->reply_status = rec->status;
    ctx->reply_headers.data = (u_char *) rec->headers;
    ctx->reply_headers.len = rec->headers_len;
    ctx->reply_body.data = (u_char *) rec->body;
    ctx->reply_body.len = rec->body_len;

    return NGX_OK;
}


/* hiredis allocates with malloc() (hiredis 1.x: unless told otherwise) */

static void
ngx_http_idempotency_free_reply(void *data)
{
    free(data);
}


/*
 * Runs the phases again from an event that is not the request's own; a
 * verdict reached while the phase handler's first call is still on the
 * stack (the whole body was there and the node's cache answered, or Redis
 * failed at once) is taken up by that call as it returns (handler.c).
 */

static void
ngx_http_idempotency_resume(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_connection_t  *c;

    if (ctx->starting) {
        return;
    }

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

    /* an error_page before the claim is the road here, not a failure */
    ctx->error_page = r->error_page;

    ngx_http_idempotency_claim_redirected(r, ctx);
    ngx_http_idempotency_renew_start(ctx);
}


/*
 * The content handler of the location the claimed request is in now (the
 * claiming one, or one an internal redirect, X-Accel-Redirect or a named
 * location led to) is wrapped: see below.
 */

void
ngx_http_idempotency_claim_redirected(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    if (r->content_handler
        && r->content_handler != ngx_http_idempotency_content_handler)
    {
        ctx->content_handler = r->content_handler;
        r->content_handler = ngx_http_idempotency_content_handler;
    }
}


/*
 * The location's content handler (proxy_pass, fastcgi_pass, ...), run so
 * that a client that goes away does not end the upstream exchange of a
 * claimed request: the operation then completes and is recorded, and the
 * client's retry gets it.  nginx stops an upstream on a broken client
 * connection only through the event handlers ngx_http_upstream_init()
 * installs unless ignore_client_abort is set, and again after the request
 * body went out; so the request gets its own copy of the upstream
 * configuration with ignore_client_abort on (nothing else differs, and
 * nginx never compares the pointer), and the handlers are put back.
 * Failed writes to the client are absorbed by the filters (client_gone).
 */

static ngx_int_t
ngx_http_idempotency_content_handler(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_http_event_handler_pt    read, write;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx == NULL || ctx->content_handler == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ctx->state == NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED
        && r->connection->error
        && !ngx_http_idempotency_upstream_reached(r))
    {
        /* gone before anything ran: released by the cleanup */
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: client of key_hash=%s went away before "
                      "the request ran, the claim is released",
                      ngx_http_idempotency_key_hash(&ctx->rkey));
        ctx->release = 1;
        ngx_http_idempotency_stat_count(ctx->conf->metrics,
                                        NGX_HTTP_IDEMPOTENCY_STAT_NOT_RUN);
        return NGX_HTTP_CLIENT_CLOSED_REQUEST;
    }

    read = r->read_event_handler;
    write = r->write_event_handler;

    ctx->content_called = 1;

    rc = ctx->content_handler(r);

    if (ctx->state == NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED) {
        ngx_http_idempotency_finish_upstream(r, read, write);
    }

    return rc;
}


static void
ngx_http_idempotency_finish_upstream(ngx_http_request_t *r,
    ngx_http_event_handler_pt read, ngx_http_event_handler_pt write)
{
    ngx_http_upstream_t       *u;
    ngx_http_upstream_conf_t  *conf;

    u = r->upstream;

    /* u->cleanup: the upstream was set up and is not finalized yet */

    if (u == NULL || u->cleanup == NULL || u->conf->ignore_client_abort) {
        return;
    }

    conf = ngx_palloc(r->pool, sizeof(ngx_http_upstream_conf_t));
    if (conf == NULL) {
        return;
    }

    ngx_memcpy(conf, u->conf, sizeof(ngx_http_upstream_conf_t));
    conf->ignore_client_abort = 1;
    u->conf = conf;

    if (!u->store && !r->post_action) {
        r->read_event_handler = read;
        r->write_event_handler = write;
    }
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


void
ngx_http_idempotency_claim_end(void *data)
{
    ngx_http_idempotency_ctx_t *ctx = data;

    if (ctx->op) {
        ngx_http_idempotency_redis_forget(ctx->op);
        ctx->op = NULL;

        /*
         * the claim was sent: it may be applied although nothing ran; a
         * HIT whose split body was being fetched claimed nothing
         */

        if (ctx->reply_kind != NGX_HTTP_IDEMPOTENCY_HIT) {
            ngx_http_idempotency_abandon(ctx);
        }

    } else if (ctx->state == NGX_HTTP_IDEMPOTENCY_STATE_DECIDED
               && ctx->redis_rc == NGX_HTTP_IDEMPOTENCY_REDIS_OK
               && ctx->reply_kind == NGX_HTTP_IDEMPOTENCY_MISS)
    {
        /* won, but the request ended before it went on */
        ngx_http_idempotency_abandon(ctx);
    }

    ngx_http_idempotency_wait_end(ctx);

    ngx_http_idempotency_hold_leave(ctx);

    (void) ngx_http_idempotency_settle(ctx);
}
