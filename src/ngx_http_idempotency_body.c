/*
 * Bodies: the request's, hashed for the fingerprint as nginx reads it (a
 * request body filter feeds every buffer to SHA-256 on its way to memory or
 * to the temporary file, so the body is never read back), and the stored
 * body of a split record, fetched from Redis chunk by chunk for a replay.
 */

#include "ngx_http_idempotency_module.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_stats.h"

#include <stdlib.h>

#include <openssl/evp.h>
#include <openssl/sha.h>


/* the per-request digest: a pool cleanup frees it */
typedef struct {
    EVP_MD_CTX                          *md_ctx;
    unsigned                             done:1;     /* saw the last buffer */
    unsigned                             partial:1;  /* missed some of it */
} ngx_http_idempotency_body_t;


static void ngx_http_idempotency_body_cleanup(void *data);
static ngx_int_t ngx_http_idempotency_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_idempotency_body_head(ngx_http_request_t *r,
    EVP_MD_CTX *md_ctx);
static ngx_int_t ngx_http_idempotency_body_read_back(ngx_http_request_t *r,
    EVP_MD_CTX *md_ctx);


static void ngx_http_idempotency_body_fetched(
    ngx_http_idempotency_redis_fetch_t *f, ngx_uint_t rc);
static void ngx_http_idempotency_body_free(void *data);


static ngx_http_request_body_filter_pt   ngx_http_next_request_body_filter;

/*
 * SHA-256, fetched once per worker (OpenSSL 3 looks an implicit
 * EVP_sha256() up in its provider tables, under locks, on every
 * EVP_DigestInit_ex())
 */
static const EVP_MD  *ngx_http_idempotency_body_md;
#if (OPENSSL_VERSION_NUMBER >= 0x30000000L)
static EVP_MD        *ngx_http_idempotency_body_md_fetched;
#endif


ngx_int_t
ngx_http_idempotency_body_init(ngx_conf_t *cf)
{
    (void) cf;

    ngx_http_next_request_body_filter = ngx_http_top_request_body_filter;
    ngx_http_top_request_body_filter = ngx_http_idempotency_body_filter;

    return NGX_OK;
}


void
ngx_http_idempotency_body_exit_process(ngx_cycle_t *cycle)
{
    (void) cycle;

#if (OPENSSL_VERSION_NUMBER >= 0x30000000L)
    if (ngx_http_idempotency_body_md_fetched) {
        EVP_MD_free(ngx_http_idempotency_body_md_fetched);
        ngx_http_idempotency_body_md_fetched = NULL;
    }
#endif

    ngx_http_idempotency_body_md = NULL;
}


/*
 * Starts the digest with the method and the request URI (with its
 * arguments); the body follows through the filter.  Called before the
 * body is read.
 */

ngx_int_t
ngx_http_idempotency_body_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_pool_cleanup_t           *cln;
    ngx_http_idempotency_body_t  *body;

    if (ngx_http_idempotency_body_md == NULL) {
#if (OPENSSL_VERSION_NUMBER >= 0x30000000L)
        ngx_http_idempotency_body_md_fetched = EVP_MD_fetch(NULL, "SHA256",
                                                            NULL);
        ngx_http_idempotency_body_md = ngx_http_idempotency_body_md_fetched;
#else
        ngx_http_idempotency_body_md = EVP_sha256();
#endif
        if (ngx_http_idempotency_body_md == NULL) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "idempotency: cannot set up SHA-256 in OpenSSL");
            return NGX_ERROR;
        }
    }

    body = ngx_pcalloc(r->pool, sizeof(ngx_http_idempotency_body_t));
    if (body == NULL) {
        return NGX_ERROR;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    body->md_ctx = EVP_MD_CTX_new();
    if (body->md_ctx == NULL) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "idempotency: EVP_MD_CTX_new() failed");
        return NGX_ERROR;
    }

    cln->handler = ngx_http_idempotency_body_cleanup;
    cln->data = body;

    if (ngx_http_idempotency_body_head(r, body->md_ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->body = body;

    return NGX_OK;
}


static void
ngx_http_idempotency_body_cleanup(void *data)
{
    ngx_http_idempotency_body_t *body = data;

    EVP_MD_CTX_free(body->md_ctx);
    body->md_ctx = NULL;
}


static ngx_int_t
ngx_http_idempotency_body_head(ngx_http_request_t *r, EVP_MD_CTX *md_ctx)
{
    if (EVP_DigestInit_ex(md_ctx, ngx_http_idempotency_body_md, NULL) != 1
        || EVP_DigestUpdate(md_ctx, r->method_name.data, r->method_name.len)
           != 1
        || EVP_DigestUpdate(md_ctx, " ", 1) != 1
        || EVP_DigestUpdate(md_ctx, r->unparsed_uri.data,
                            r->unparsed_uri.len) != 1
        || EVP_DigestUpdate(md_ctx, "\n", 1) != 1)
    {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "idempotency: SHA-256 of the request failed");
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * Sees each buffer right after it is received (Content-Length and chunked
 * bodies, HTTP/2 DATA frames), before the save filter keeps it in memory
 * or writes it to the temporary file; the buffers are reused, so they are
 * hashed now.  "in" may be NULL (a flush).
 */

static ngx_int_t
ngx_http_idempotency_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_buf_t                    *b;
    ngx_chain_t                  *cl;
    ngx_http_idempotency_ctx_t   *ctx;
    ngx_http_idempotency_body_t  *body;

    ctx = ngx_http_get_module_ctx(r, ngx_http_idempotency_module);

    if (ctx == NULL
        || ctx->body == NULL
        || ctx->state != NGX_HTTP_IDEMPOTENCY_STATE_READING_BODY)
    {
        return ngx_http_next_request_body_filter(r, in);
    }

    body = ctx->body;

    for (cl = in; cl && !body->done && !body->partial; cl = cl->next) {
        b = cl->buf;

        if (ngx_buf_in_memory(b)) {
            if (b->last > b->pos
                && EVP_DigestUpdate(body->md_ctx, b->pos, b->last - b->pos)
                   != 1)
            {
                ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                              "idempotency: SHA-256 of the body failed");
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }

        } else if (ngx_buf_size(b) != 0) {
            /* not seen here: the fingerprint reads the body back */
            body->partial = 1;
            break;
        }

        if (b->last_buf) {
            body->done = 1;
        }
    }

    return ngx_http_next_request_body_filter(r, in);
}


/*
 * SHA-256 over method, request URI with arguments, and the body, as hex
 * in ctx->fingerprint.  Normally the filter has hashed the body already;
 * a body read before the module's handler ran (by another module), or one
 * whose buffers the filter could not see, is hashed from r->request_body
 * here instead, reading a temporary file back if there is one.
 */

ngx_int_t
ngx_http_idempotency_body_fingerprint(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_http_idempotency_body_t  *body;
    u_char                        md[SHA256_DIGEST_LENGTH];

    body = ctx->body;

    if (body == NULL || body->md_ctx == NULL) {
        return NGX_ERROR;
    }

    if (!body->done || body->partial) {
        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "idempotency fingerprint from the stored body");

        if (ngx_http_idempotency_body_head(r, body->md_ctx) != NGX_OK
            || ngx_http_idempotency_body_read_back(r, body->md_ctx) != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    if (EVP_DigestFinal_ex(body->md_ctx, md, NULL) != 1) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "idempotency: SHA-256 of the body failed");
        return NGX_ERROR;
    }

    ngx_hex_dump(ctx->fingerprint, md, SHA256_DIGEST_LENGTH);

    /* the digest is not needed any more */

    EVP_MD_CTX_free(body->md_ctx);
    body->md_ctx = NULL;
    ctx->body = NULL;

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_body_read_back(ngx_http_request_t *r,
    EVP_MD_CTX *md_ctx)
{
    off_t         offset;
    ssize_t       n;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;
    ngx_uint_t    read;
    u_char        buf[4096];

    read = 0;

    for (cl = r->request_body ? r->request_body->bufs : NULL;
         cl;
         cl = cl->next)
    {
        b = cl->buf;

        if (!b->in_file) {
            if (EVP_DigestUpdate(md_ctx, b->pos, b->last - b->pos) != 1) {
                return NGX_ERROR;
            }

            continue;
        }

        read = 1;

        for (offset = b->file_pos; offset < b->file_last; offset += n) {
            n = ngx_read_file(b->file, buf,
                              (size_t) ngx_min((off_t) sizeof(buf),
                                               b->file_last - offset),
                              offset);
            if (n <= 0) {
                ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                              "idempotency: cannot read the request body "
                              "from \"%V\"", &b->file->name);
                return NGX_ERROR;
            }

            if (EVP_DigestUpdate(md_ctx, buf, n) != 1) {
                return NGX_ERROR;
            }
        }
    }

    if (read) {
        /* the claim's timers must not start from a time before the read */
        ngx_time_update();
    }

    return NGX_OK;
}


/*
 * A claim found a split record with our fingerprint: its head is in ctx
 * (status, headers), the body is read now, then the request goes on as a
 * HIT.  NGX_AGAIN: the fetch runs; NGX_ERROR: it cannot.
 */

ngx_int_t
ngx_http_idempotency_body_fetch(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_http_idempotency_record_t *rec)
{
    off_t                                len;
    ngx_pool_cleanup_t                  *cln;
    ngx_http_idempotency_redis_fetch_t  *f;

    len = ngx_atoof((u_char *) rec->body, rec->body_len);

    if (len <= 0 || (size_t) len > NGX_MAX_SIZE_T_VALUE / 2) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: the record key_hash=%s is corrupt "
                      "(body length), not used",
                      ngx_http_idempotency_key_hash(&ctx->rkey));
        return NGX_ERROR;
    }

    f = ngx_pcalloc(r->pool, sizeof(ngx_http_idempotency_redis_fetch_t));
    if (f == NULL) {
        return NGX_ERROR;
    }

    f->rcf = ctx->conf->redis;

    /* room for the chunks' ":<i>" after it */
    f->key.data = ngx_pnalloc(r->pool, f->rcf->prefix.len + ctx->rkey.len
                                       + rec->owner_len + 8
                                       + 1 + NGX_SIZE_T_LEN);
    if (f->key.data == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_idempotency_redis_body_key(f->rcf, &ctx->rkey, rec->owner,
                                            rec->owner_len, &f->key)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    f->buf = ngx_alloc((size_t) len, r->connection->log);
    if (f->buf == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_idempotency_body_free;
    cln->data = f->buf;

    f->len = (size_t) len;
    f->opp = &ctx->op;
    f->handler = ngx_http_idempotency_body_fetched;
    f->data = ctx;
    f->log = r->connection->log;

    if (ngx_http_idempotency_redis_fetch(f) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->reply_body.data = f->buf;
    ctx->reply_body.len = f->len;
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_CLAIMING;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency fetches the body of \"%V\", %uz bytes",
                   &ctx->rkey, f->len);

    return NGX_AGAIN;
}


static void
ngx_http_idempotency_body_free(void *data)
{
    ngx_free(data);
}


static void
ngx_http_idempotency_body_fetched(ngx_http_idempotency_redis_fetch_t *f,
    ngx_uint_t rc)
{
    ngx_connection_t            *c;
    ngx_http_request_t          *r;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = f->data;
    r = ctx->request;
    c = r->connection;

    ctx->op = NULL;
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DECIDED;
    ctx->redis_rc = rc;
    ctx->reply_kind = NGX_HTTP_IDEMPOTENCY_HIT;

    /* as the claim's reply does: the phases run again */

    r->write_event_handler = ngx_http_core_run_phases;

    if (ngx_http_post_request(r, NULL) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ngx_http_run_posted_requests(c);
}
