/*
 * The pre-content state machine: key, fingerprint, claim, then go on to the
 * content handler (MISS), replay (HIT) or answer with a problem.
 */

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "ngx_http_idempotency_module.h"
#include "ngx_http_idempotency_key.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_stats.h"


#define NGX_HTTP_IDEMPOTENCY_WAIT_STEP_MIN  20
#define NGX_HTTP_IDEMPOTENCY_WAIT_STEP_MAX  500


/* duplicates of this worker waiting for a timer now (idempotency_wait) */
static ngx_uint_t  ngx_http_idempotency_waiters;


static ngx_int_t ngx_http_idempotency_start(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *ilcf);
static ngx_int_t ngx_http_idempotency_find_key(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *ilcf, ngx_str_t *value);
static ngx_int_t ngx_http_idempotency_record_key(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_body_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_idempotency_fingerprint(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_claim(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_claim_handler(void *data, redisReply *reply,
    ngx_uint_t rc);
static ngx_int_t ngx_http_idempotency_claim_reply(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, redisReply *reply);
static void ngx_http_idempotency_resume(ngx_http_request_t *r);
static ngx_int_t ngx_http_idempotency_decide(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_conflict(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_wait_handler(ngx_event_t *ev);
static ngx_int_t ngx_http_idempotency_redis_failed(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_replay(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_replay_header(ngx_http_request_t *r,
    ngx_http_idempotency_record_header_t *rh);
static ngx_int_t ngx_http_idempotency_problem(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_http_idempotency_outcome_e outcome);
static void ngx_http_idempotency_cleanup(void *data);


ngx_int_t
ngx_http_idempotency_handler(ngx_http_request_t *r)
{
    ngx_http_idempotency_ctx_t       *ctx;
    ngx_http_idempotency_loc_conf_t  *ilcf;

    if (r != r->main) {
        return NGX_DECLINED;
    }

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx != NULL) {

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "idempotency handler, state: %d", ctx->state);

        switch (ctx->state) {

        case NGX_HTTP_IDEMPOTENCY_STATE_READING_BODY:
        case NGX_HTTP_IDEMPOTENCY_STATE_CLAIMING:
        case NGX_HTTP_IDEMPOTENCY_STATE_WAITING:
            /* a spurious wake-up while Redis or the body is pending */
            return NGX_AGAIN;

        case NGX_HTTP_IDEMPOTENCY_STATE_DECIDED:
            return ngx_http_idempotency_decide(r, ctx);

        default:
            /* claimed, settled or out: e.g. after an internal redirect */
            return NGX_DECLINED;
        }
    }

    ilcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    if (!ilcf->enable || !(r->method & ilcf->methods)) {
        return NGX_DECLINED;
    }

    return ngx_http_idempotency_start(r, ilcf);
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


static ngx_int_t
ngx_http_idempotency_start(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *ilcf)
{
    int                          krc;
    ngx_int_t                    rc;
    ngx_str_t                    value;
    ngx_pool_cleanup_t          *cln;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_idempotency_ctx_t));
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_idempotency_cleanup;
    cln->data = ctx;

    ctx->request = r;
    ctx->conf = ilcf;
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DONE;

    ngx_http_set_ctx(r, ctx, ngx_http_idempotency_module);

    rc = ngx_http_idempotency_find_key(r, ilcf, &value);

    if (rc == NGX_DECLINED) {
        if (ilcf->required) {
            return ngx_http_idempotency_problem(r, ctx,
                                                NGX_HTTP_IDEMPOTENCY_MISSING);
        }

        ctx->outcome = NGX_HTTP_IDEMPOTENCY_BYPASS;
        return NGX_DECLINED;
    }

    if (rc == NGX_BUSY) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: \"%V\" header sent more than once",
                      &ilcf->header);
        return ngx_http_idempotency_problem(r, ctx,
                                            NGX_HTTP_IDEMPOTENCY_INVALID);
    }

    ctx->key.data = ngx_pnalloc(r->pool, value.len);
    if (ctx->key.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    krc = ngx_http_idempotency_key_parse(value.data, value.len, ctx->key.data,
                                         &ctx->key.len, ilcf->key_max_length);

    if (krc != NGX_HTTP_IDEMPOTENCY_KEY_OK) {
        ctx->key.len = 0;

        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: invalid \"%V\" header: %s",
                      &ilcf->header, ngx_http_idempotency_key_error(krc));
        return ngx_http_idempotency_problem(r, ctx,
                                            NGX_HTTP_IDEMPOTENCY_INVALID);
    }

    if (ngx_http_idempotency_record_key(r, ctx) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (RAND_bytes(ctx->owner, 16) != 1) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "idempotency: RAND_bytes() failed");
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_hex_dump(ctx->owner + 16, ctx->owner, 8);
    ngx_hex_dump(ctx->owner, ctx->owner + 8, 8);

    /* the fingerprint needs the whole body, wherever nginx keeps it */

    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_READING_BODY;

    rc = ngx_http_read_client_request_body(r,
                                           ngx_http_idempotency_body_handler);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DONE;
        return rc;
    }

    /* gives back the reference taken by reading the body */

    ngx_http_finalize_request(r, NGX_DONE);

    return NGX_DONE;
}


/* NGX_OK with the value, NGX_DECLINED when absent, NGX_BUSY when repeated */

static ngx_int_t
ngx_http_idempotency_find_key(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *ilcf, ngx_str_t *value)
{
    ngx_uint_t        i, found;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    found = 0;
    part = &r->headers_in.headers.part;
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

        if (h[i].key.len != ilcf->header_lc.len
            || ngx_strncasecmp(h[i].key.data, ilcf->header_lc.data,
                               ilcf->header_lc.len) != 0)
        {
            continue;
        }

        if (found++) {
            return NGX_BUSY;
        }

        *value = h[i].value;
    }

    return found ? NGX_OK : NGX_DECLINED;
}


/*
 * <prefix><hex sha256(scope)>:<key>; the scope has a fixed length once
 * hashed, so a scope and a key can never run into each other.
 */

static ngx_int_t
ngx_http_idempotency_record_key(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    u_char                             *p;
    ngx_str_t                           scope;
    u_char                              md[SHA256_DIGEST_LENGTH];
    ngx_http_idempotency_redis_conf_t  *rcf;

    if (ngx_http_complex_value(r, ctx->conf->scope, &scope) != NGX_OK) {
        return NGX_ERROR;
    }

    SHA256(scope.data, scope.len, md);

    rcf = ctx->conf->redis;

    ctx->rkey.len = rcf->prefix.len + 2 * SHA256_DIGEST_LENGTH + 1
                    + ctx->key.len;
    ctx->rkey.data = ngx_pnalloc(r->pool, ctx->rkey.len);
    if (ctx->rkey.data == NULL) {
        return NGX_ERROR;
    }

    p = ngx_cpymem(ctx->rkey.data, rcf->prefix.data, rcf->prefix.len);
    p = ngx_hex_dump(p, md, SHA256_DIGEST_LENGTH);
    *p++ = ':';
    ngx_memcpy(p, ctx->key.data, ctx->key.len);

    return NGX_OK;
}


static void
ngx_http_idempotency_body_handler(ngx_http_request_t *r)
{
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx == NULL
        || ctx->state != NGX_HTTP_IDEMPOTENCY_STATE_READING_BODY)
    {
        return;
    }

    r->write_event_handler = ngx_http_core_run_phases;

    if (ngx_http_idempotency_fingerprint(r, ctx) != NGX_OK) {
        ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DONE;
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ngx_http_idempotency_claim(r, ctx);
}


/* SHA-256 over method, request URI with arguments, and the body */

static ngx_int_t
ngx_http_idempotency_fingerprint(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    off_t          offset;
    ssize_t        n;
    ngx_int_t      rc;
    ngx_buf_t     *b;
    ngx_chain_t   *cl;
    EVP_MD_CTX    *md_ctx;
    u_char         md[SHA256_DIGEST_LENGTH];
    u_char         buf[4096];

    md_ctx = EVP_MD_CTX_new();
    if (md_ctx == NULL) {
        return NGX_ERROR;
    }

    rc = NGX_ERROR;

    if (EVP_DigestInit_ex(md_ctx, EVP_sha256(), NULL) != 1
        || EVP_DigestUpdate(md_ctx, r->method_name.data, r->method_name.len)
           != 1
        || EVP_DigestUpdate(md_ctx, " ", 1) != 1
        || EVP_DigestUpdate(md_ctx, r->unparsed_uri.data,
                            r->unparsed_uri.len) != 1
        || EVP_DigestUpdate(md_ctx, "\n", 1) != 1)
    {
        goto failed;
    }

    for (cl = r->request_body ? r->request_body->bufs : NULL;
         cl;
         cl = cl->next)
    {
        b = cl->buf;

        if (!b->in_file) {
            if (EVP_DigestUpdate(md_ctx, b->pos, b->last - b->pos) != 1) {
                goto failed;
            }

            continue;
        }

        /* a body spooled to a temporary file */

        for (offset = b->file_pos; offset < b->file_last; offset += n) {
            n = ngx_read_file(b->file, buf,
                              (size_t) ngx_min((off_t) sizeof(buf),
                                               b->file_last - offset),
                              offset);
            if (n <= 0) {
                ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                              "idempotency: cannot read the request body "
                              "from \"%V\"", &b->file->name);
                goto failed;
            }

            if (EVP_DigestUpdate(md_ctx, buf, n) != 1) {
                goto failed;
            }
        }
    }

    if (EVP_DigestFinal_ex(md_ctx, md, NULL) != 1) {
        goto failed;
    }

    ngx_hex_dump(ctx->fingerprint, md, SHA256_DIGEST_LENGTH);

    rc = NGX_OK;

failed:

    EVP_MD_CTX_free(md_ctx);

    return rc;
}


static void
ngx_http_idempotency_claim(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    u_char      *p;
    ngx_str_t    args[4];
    u_char       nums[2 * NGX_INT64_LEN];

    p = nums;

    args[0].data = ctx->fingerprint;
    args[0].len = sizeof(ctx->fingerprint);
    args[1].data = ctx->owner;
    args[1].len = sizeof(ctx->owner);
    args[2].data = p;
    p = ngx_sprintf(p, "%M", ctx->conf->lock_ttl);
    args[2].len = p - args[2].data;
    args[3].data = p;
    p = ngx_sprintf(p, "%T", ngx_time());
    args[3].len = p - args[3].data;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency claim \"%V\"", &ctx->rkey);

    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_CLAIMING;
    ctx->claimed = ngx_current_msec;   /* the lock TTL runs from about here */

    ctx->op = ngx_http_idempotency_redis_script(ctx->conf->redis,
                                   NGX_HTTP_IDEMPOTENCY_SCRIPT_CLAIM,
                                   &ctx->rkey, args, 4,
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


/* copies what the decision needs: hiredis frees the reply after us */

static ngx_int_t
ngx_http_idempotency_claim_reply(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, redisReply *reply)
{
    ngx_int_t     n;
    redisReply  **el;

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: Redis claim failed: %*s, key_hash=%s",
                      (size_t) reply->len, reply->str,
                      ngx_http_idempotency_key_hash(&ctx->rkey));
        return NGX_ERROR;
    }

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements == 0
        || reply->element[0]->type != REDIS_REPLY_STRING)
    {
        goto invalid;
    }

    el = reply->element;

    ctx->reply_kind.len = el[0]->len;
    ctx->reply_kind.data = ngx_pnalloc(r->pool, el[0]->len);
    if (ctx->reply_kind.data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(ctx->reply_kind.data, el[0]->str, el[0]->len);

    /* only a HIT carries more to copy; decide() judges every kind */

    if (el[0]->len != sizeof("HIT") - 1
        || ngx_strncmp(el[0]->str, "HIT", sizeof("HIT") - 1) != 0)
    {
        return NGX_OK;
    }

    if (reply->elements != 4
        || el[1]->type != REDIS_REPLY_STRING
        || el[2]->type != REDIS_REPLY_STRING
        || el[3]->type != REDIS_REPLY_STRING)
    {
        goto invalid;
    }

    n = ngx_http_idempotency_record_status((u_char *) el[1]->str,
                                           el[1]->len);
    if (n == -1) {
        goto invalid;
    }

    ctx->reply_status = n;

    ctx->reply_headers.len = el[2]->len;
    ctx->reply_headers.data = ngx_pnalloc(r->pool, el[2]->len + 1);
    if (ctx->reply_headers.data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(ctx->reply_headers.data, el[2]->str, el[2]->len);

    ctx->reply_body.len = el[3]->len;
    ctx->reply_body.data = ngx_pnalloc(r->pool, el[3]->len + 1);
    if (ctx->reply_body.data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(ctx->reply_body.data, el[3]->str, el[3]->len);

    return NGX_OK;

invalid:

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "idempotency: unexpected reply to the claim of key_hash=%s",
                  ngx_http_idempotency_key_hash(&ctx->rkey));

    return NGX_ERROR;
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


static ngx_int_t
ngx_http_idempotency_decide(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_str_t  *kind;

    if (ctx->redis_rc != NGX_HTTP_IDEMPOTENCY_REDIS_OK) {
        return ngx_http_idempotency_redis_failed(r, ctx);
    }

    kind = &ctx->reply_kind;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency claim of \"%V\": %V", &ctx->rkey, kind);

    if (kind->len == 4 && ngx_strncmp(kind->data, "MISS", 4) == 0) {
        ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED;
        ctx->outcome = NGX_HTTP_IDEMPOTENCY_MISS;
        ngx_http_idempotency_renew_start(ctx);
        return NGX_DECLINED;
    }

    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_SETTLED;

    if (kind->len == 3 && ngx_strncmp(kind->data, "HIT", 3) == 0) {
        ctx->outcome = NGX_HTTP_IDEMPOTENCY_HIT;
        return ngx_http_idempotency_replay(r, ctx);
    }

    if (kind->len == 8 && ngx_strncmp(kind->data, "CONFLICT", 8) == 0) {
        return ngx_http_idempotency_conflict(r, ctx);
    }

    if (kind->len == 8 && ngx_strncmp(kind->data, "MISMATCH", 8) == 0) {
        return ngx_http_idempotency_problem(r, ctx,
                                            NGX_HTTP_IDEMPOTENCY_MISMATCH);
    }

    if (kind->len == 8 && ngx_strncmp(kind->data, "OVERSIZE", 8) == 0) {
        return ngx_http_idempotency_problem(r, ctx,
                                            NGX_HTTP_IDEMPOTENCY_OVERSIZE);
    }

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "idempotency: unexpected claim result \"%V\", key_hash=%s",
                  kind, ngx_http_idempotency_key_hash(&ctx->rkey));

    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DECIDED;

    return ngx_http_idempotency_redis_failed(r, ctx);
}


static ngx_int_t
ngx_http_idempotency_conflict(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_msec_t   step;
    ngx_event_t  *ev;

    if (ctx->conf->wait == 0) {
        return ngx_http_idempotency_problem(r, ctx,
                                            NGX_HTTP_IDEMPOTENCY_CONFLICT);
    }

    if (ctx->wait_until == 0) {
        ctx->wait_until = ngx_current_msec + ctx->conf->wait;
        ctx->wait_step = NGX_HTTP_IDEMPOTENCY_WAIT_STEP_MIN;
    }

    if ((ngx_msec_int_t) (ctx->wait_until - ngx_current_msec) <= 0) {
        return ngx_http_idempotency_problem(r, ctx,
                                            NGX_HTTP_IDEMPOTENCY_CONFLICT);
    }

    /* each waiter polls at most twice a second; their number is bounded */

    if (ngx_http_idempotency_waiters >= NGX_HTTP_IDEMPOTENCY_MAX_WAITERS) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: %d duplicates wait already, "
                      "answering 409 at once",
                      NGX_HTTP_IDEMPOTENCY_MAX_WAITERS);
        return ngx_http_idempotency_problem(r, ctx,
                                            NGX_HTTP_IDEMPOTENCY_CONFLICT);
    }

    /* poll the record with a growing step until it completes */

    step = ngx_min(ctx->wait_step, ctx->wait_until - ngx_current_msec);
    ctx->wait_step = ngx_min(ctx->wait_step * 2,
                             NGX_HTTP_IDEMPOTENCY_WAIT_STEP_MAX);

    ev = &ctx->wait_timer;
    ev->handler = ngx_http_idempotency_wait_handler;
    ev->data = r;
    ev->log = r->connection->log;

    ngx_add_timer(ev, step);
    ngx_http_idempotency_waiters++;

    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_WAITING;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency waits %M ms for the first request", step);

    return NGX_AGAIN;
}


static void
ngx_http_idempotency_wait_handler(ngx_event_t *ev)
{
    ngx_http_request_t          *r;
    ngx_http_idempotency_ctx_t  *ctx;

    r = ev->data;

    ngx_http_idempotency_waiters--;

    ctx = ngx_http_idempotency_get_ctx(r);
    if (ctx == NULL || ctx->state != NGX_HTTP_IDEMPOTENCY_STATE_WAITING) {
        return;
    }

    ngx_http_idempotency_claim(r, ctx);
}


static ngx_int_t
ngx_http_idempotency_redis_failed(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DONE;

    if (ctx->conf->on_store_error == NGX_HTTP_IDEMPOTENCY_STORE_ERROR_OPEN) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: Redis %s, request passed through "
                      "unprotected (idempotency_on_store_error open), "
                      "key_hash=%s",
                      ctx->redis_rc == NGX_HTTP_IDEMPOTENCY_REDIS_TIMEOUT
                      ? "timed out" : "failed",
                      ngx_http_idempotency_key_hash(&ctx->rkey));

        ctx->outcome = NGX_HTTP_IDEMPOTENCY_ERROR;
        return NGX_DECLINED;
    }

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "idempotency: Redis %s, request refused with 503, "
                  "key_hash=%s",
                  ctx->redis_rc == NGX_HTTP_IDEMPOTENCY_REDIS_TIMEOUT
                  ? "timed out" : "failed",
                  ngx_http_idempotency_key_hash(&ctx->rkey));

    return ngx_http_idempotency_problem(r, ctx, NGX_HTTP_IDEMPOTENCY_ERROR);
}


static ngx_int_t
ngx_http_idempotency_replay(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    int                                    rc;
    ngx_int_t                              n;
    ngx_buf_t                             *b;
    ngx_chain_t                            out;
    ngx_table_elt_t                       *h;
    const u_char                          *p, *end;
    ngx_http_idempotency_record_header_t   rh;

    p = ctx->reply_headers.data;
    end = p + ctx->reply_headers.len;

    /*
     * The whole headers field is checked before any of it goes into the
     * response: a corrupt record is refused with a problem (or passed on,
     * with idempotency_on_store_error open) that carries none of it.
     */

    do {
        rc = ngx_http_idempotency_record_next_header(&p, end, &rh);
    } while (rc == 1);

    if (rc == -1) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: stored headers of key_hash=%s are "
                      "corrupt, not replayed",
                      ngx_http_idempotency_key_hash(&ctx->rkey));
        ctx->redis_rc = NGX_HTTP_IDEMPOTENCY_REDIS_ERROR;
        return ngx_http_idempotency_redis_failed(r, ctx);
    }

    ctx->replaying = 1;

    /* what was stored is sent, as for a proxied response: no 304 from it */
    r->disable_not_modified = 1;

    r->headers_out.status = ctx->reply_status;

    p = ctx->reply_headers.data;

    while (ngx_http_idempotency_record_next_header(&p, end, &rh) == 1) {
        if (ngx_http_idempotency_replay_header(r, &rh) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "Idempotent-Replayed");
    ngx_str_set(&h->value, "true");

    r->headers_out.content_length_n = ctx->reply_body.len;

    n = ngx_http_send_header(r);

    if (n == NGX_ERROR || n > NGX_OK || r->header_only) {
        ngx_http_finalize_request(r, n);
        return NGX_DONE;
    }

    if (ctx->reply_body.len == 0) {
        n = ngx_http_send_special(r, NGX_HTTP_LAST);
        ngx_http_finalize_request(r, n);
        return NGX_DONE;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        ngx_http_finalize_request(r, NGX_ERROR);
        return NGX_DONE;
    }

    b->pos = ctx->reply_body.data;
    b->last = b->pos + ctx->reply_body.len;
    b->memory = 1;
    b->last_buf = 1;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    n = ngx_http_output_filter(r, &out);

    ngx_http_finalize_request(r, n);

    return NGX_DONE;
}


static ngx_int_t
ngx_http_idempotency_replay_header(ngx_http_request_t *r,
    ngx_http_idempotency_record_header_t *rh)
{
    ngx_table_elt_t  *h;

    if (rh->name_len == sizeof("Content-Type") - 1
        && ngx_strncasecmp((u_char *) rh->name, (u_char *) "Content-Type",
                           rh->name_len) == 0)
    {
        r->headers_out.content_type.len = rh->value_len;
        r->headers_out.content_type.data = (u_char *) rh->value;
        r->headers_out.content_type_len = rh->value_len;
        r->headers_out.content_type_lowcase = NULL;
        return NGX_OK;
    }

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key.len = rh->name_len;
    h->key.data = (u_char *) rh->name;
    h->value.len = rh->value_len;
    h->value.data = (u_char *) rh->value;

    /* filters that look at these must see them, e.g. gzip */

    if (rh->name_len == sizeof("Content-Encoding") - 1
        && ngx_strncasecmp(h->key.data, (u_char *) "Content-Encoding",
                           rh->name_len) == 0)
    {
        r->headers_out.content_encoding = h;

    } else if (rh->name_len == sizeof("ETag") - 1
               && ngx_strncasecmp(h->key.data, (u_char *) "ETag",
                                  rh->name_len) == 0)
    {
        r->headers_out.etag = h;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_problem(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_http_idempotency_outcome_e outcome)
{
    ngx_int_t  rc;

    ctx->outcome = outcome;
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DONE;

    /* a client's error, at info; INVALID and ERROR have their own lines */

    if (outcome != NGX_HTTP_IDEMPOTENCY_INVALID
        && outcome != NGX_HTTP_IDEMPOTENCY_ERROR)
    {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: %V (%s), key_hash=%s",
                      ngx_http_idempotency_outcome_name(outcome),
                      ngx_http_idempotency_outcome_reason(outcome),
                      ngx_http_idempotency_key_hash(&ctx->rkey));
    }

    rc = ngx_http_idempotency_send_problem(r, outcome);

    ngx_http_finalize_request(r, rc);

    return NGX_DONE;
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
