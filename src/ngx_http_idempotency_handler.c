/*
 * The pre-content state machine: key, fingerprint, claim, then go on to the
 * content handler (MISS), replay (HIT) or answer with a problem.  HTTP
 * side; uses the claim (claim.c), the bodies (body.c) and, through them,
 * the records layer.
 */

#include "ngx_http_idempotency_handler.h"
#include "ngx_http_idempotency_conf.h"
#include "ngx_http_idempotency_body.h"
#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_key.h"
#include "ngx_http_idempotency_problem.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_scope.h"
#include "ngx_http_idempotency_stats.h"
#include "ngx_http_idempotency_var.h"
#include "ngx_http_idempotency_wait.h"


static ngx_int_t ngx_http_idempotency_start(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *ilcf);
static ngx_int_t ngx_http_idempotency_find_key(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *ilcf, ngx_str_t *value);
static ngx_int_t ngx_http_idempotency_record_key(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static void ngx_http_idempotency_body_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_idempotency_decide(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_conflict(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_redis_failed(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_replay(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_replay_header(ngx_http_request_t *r,
    ngx_http_idempotency_record_header_t *rh);
static ngx_int_t ngx_http_idempotency_problem(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_http_idempotency_outcome_e outcome);


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

        case NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED:
            /* after an internal redirect: the new location's content */
            ngx_http_idempotency_claim_redirected(r, ctx);
            return NGX_DECLINED;

        default:
            /* settled or out */
            return NGX_DECLINED;
        }
    }

    ilcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    if (!ilcf->enable || !(r->method & ilcf->methods)) {
        return NGX_DECLINED;
    }

    return ngx_http_idempotency_start(r, ilcf);
}


static ngx_int_t
ngx_http_idempotency_start(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *ilcf)
{
    int                          krc;
    ngx_int_t                    rc;
    ngx_str_t                    value;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_idempotency_ctx_create(r, ilcf,
                                          ngx_http_idempotency_claim_end);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

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

    rc = ngx_http_idempotency_record_key(r, ctx);

    if (rc == NGX_DECLINED) {
        ngx_http_idempotency_scope_empty_log(r);
        return ngx_http_idempotency_problem(r, ctx,
                                            NGX_HTTP_IDEMPOTENCY_UNSCOPED);
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* the fingerprint needs the whole body: hashed as it is read (body.c) */

    if (ngx_http_idempotency_body_start(r, ctx) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_READING_BODY;
    ctx->starting = 1;

    rc = ngx_http_read_client_request_body(r,
                                           ngx_http_idempotency_body_handler);

    ctx->starting = 0;

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DONE;
        return rc;
    }

    /* gives back the reference taken by reading the body */

    ngx_http_finalize_request(r, NGX_DONE);

    if (ctx->state == NGX_HTTP_IDEMPOTENCY_STATE_DECIDED) {
        /*
         * the body was all there and the verdict needed no wait (the
         * node's cache answered, or Redis failed at once): taken up now,
         * not by a second pass of the phases (claim.c, resume)
         */
        return ngx_http_idempotency_decide(r, ctx);
    }

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
 * <prefix><hex hash of the scope>:<key>; the scope has a fixed length once
 * hashed, so a scope and a key can never run into each other.  An empty
 * scope is NGX_DECLINED: it would be one namespace shared by every client
 * the scope does not tell apart.
 */

static ngx_int_t
ngx_http_idempotency_record_key(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    u_char                             *p;
    ngx_str_t                           scope;
    ngx_http_idempotency_redis_conf_t  *rcf;

    if (ngx_http_complex_value(r, ctx->conf->scope, &scope) != NGX_OK) {
        return NGX_ERROR;
    }

    if (scope.len == 0) {
        return NGX_DECLINED;
    }

    rcf = ctx->conf->redis;

    ctx->rkey.len = rcf->prefix.len + NGX_HTTP_IDEMPOTENCY_SCOPE_HEX_LEN + 1
                    + ctx->key.len;
    ctx->rkey.data = ngx_pnalloc(r->pool, ctx->rkey.len);
    if (ctx->rkey.data == NULL) {
        return NGX_ERROR;
    }

    p = ngx_cpymem(ctx->rkey.data, rcf->prefix.data, rcf->prefix.len);

    if (ngx_http_idempotency_scope_hash(ctx->conf, &scope, p,
                                        r->connection->log)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    p += NGX_HTTP_IDEMPOTENCY_SCOPE_HEX_LEN;
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

    if (ngx_http_idempotency_body_fingerprint(r, ctx) != NGX_OK) {
        ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DONE;
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ngx_http_idempotency_claim_send(r, ctx);
}


static ngx_int_t
ngx_http_idempotency_decide(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    if (ctx->redis_rc != NGX_HTTP_IDEMPOTENCY_REDIS_OK) {
        return ngx_http_idempotency_redis_failed(r, ctx);
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency claim of \"%V\": %d", &ctx->rkey,
                   ctx->reply_kind);

    ngx_http_idempotency_wait_decided(ctx);

    switch (ctx->reply_kind) {

    case NGX_HTTP_IDEMPOTENCY_MISS:
        ngx_http_idempotency_claim_won(r, ctx);
        return NGX_DECLINED;

    case NGX_HTTP_IDEMPOTENCY_HIT:
        ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_SETTLED;
        ctx->outcome = NGX_HTTP_IDEMPOTENCY_HIT;
        return ngx_http_idempotency_replay(r, ctx);

    case NGX_HTTP_IDEMPOTENCY_CONFLICT:
        ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_SETTLED;
        return ngx_http_idempotency_conflict(r, ctx);

    case NGX_HTTP_IDEMPOTENCY_MISMATCH:
    case NGX_HTTP_IDEMPOTENCY_OVERSIZE:
    case NGX_HTTP_IDEMPOTENCY_UNKNOWN:
        ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_SETTLED;
        return ngx_http_idempotency_problem(r, ctx, ctx->reply_kind);

    default:
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "idempotency: unexpected claim result %d",
                      ctx->reply_kind);

        ctx->redis_rc = NGX_HTTP_IDEMPOTENCY_REDIS_ERROR;

        return ngx_http_idempotency_redis_failed(r, ctx);
    }
}


static ngx_int_t
ngx_http_idempotency_conflict(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    /* with idempotency_wait, wait for the first one's outcome (wait.c) */

    if (ngx_http_idempotency_wait_start(r, ctx,
                                        ngx_http_idempotency_claim_send)
        == NGX_AGAIN)
    {
        return NGX_AGAIN;
    }

    return ngx_http_idempotency_problem(r, ctx,
                                        NGX_HTTP_IDEMPOTENCY_CONFLICT);
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
    ngx_int_t                              n;
    ngx_uint_t                             dropped, trailer;
    ngx_buf_t                             *b;
    ngx_chain_t                            out;
    ngx_table_elt_t                       *h;
    const u_char                          *p, *end;
    ngx_http_idempotency_record_header_t   rh;

    /*
     * The whole headers field was checked before the verdict (claim.c: the
     * record's validation, or the node's cache, which keeps only records
     * that passed it): nothing here is refused half-way through.
     */

    p = ctx->reply_headers.data;
    end = p + ctx->reply_headers.len;

    ctx->replaying = 1;

    /* what was stored is sent, as for a proxied response: no 304 from it */
    r->disable_not_modified = 1;

    r->headers_out.status = ctx->reply_status;
    ngx_http_idempotency_status_line(r);

    dropped = 0;

    while (ngx_http_idempotency_record_next_header(&p, end, &rh) == 1) {

        trailer = (rh.name[0] == NGX_HTTP_IDEMPOTENCY_RECORD_TRAILER);

        if (trailer) {
            rh.name++;
            rh.name_len--;
        }

        /* whatever the record says: nginx frames the replay itself */

        if (rh.name_len == 0
            || !ngx_http_idempotency_record_header_replayable(rh.name,
                                                              rh.name_len))
        {
            dropped++;
            continue;
        }

        if (trailer) {
            h = ngx_list_push(&r->headers_out.trailers);
            if (h == NULL) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }

            h->hash = 1;
            h->key.len = rh.name_len;
            h->key.data = (u_char *) rh.name;
            h->value.len = rh.value_len;
            h->value.data = (u_char *) rh.value;

            /* sent after the body: chunked over HTTP/1.1, as nginx does */
            r->expect_trailers = 1;
            continue;
        }

        if (ngx_http_idempotency_replay_header(r, &rh) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    if (dropped) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: the record key_hash=%s holds %ui "
                      "header(s) the module never stores (hop-by-hop, "
                      "framing, Date, Server or the replay marker): "
                      "left out of the replay",
                      ngx_http_idempotency_key_hash(&ctx->rkey), dropped);
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

    if (ctx->stream) {
        /* a split record: its body follows chunk by chunk (body.c) */
        return ngx_http_idempotency_body_stream(r, ctx);
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
        && outcome != NGX_HTTP_IDEMPOTENCY_ERROR
        && outcome != NGX_HTTP_IDEMPOTENCY_UNSCOPED)
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


