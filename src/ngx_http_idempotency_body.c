/*
 * Bodies: the request's, hashed for the fingerprint as nginx reads it (a
 * request body filter feeds every buffer to SHA-256 on its way to memory or
 * to the temporary file, so the body is never read back), and the stored
 * body of a split record, fetched from Redis chunk by chunk for a replay.
 */

#include "ngx_http_idempotency_body.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_stats.h"

#include <stdlib.h>

#include <openssl/evp.h>
#include <openssl/sha.h>


/* digests kept for the next requests, per worker */
#define NGX_HTTP_IDEMPOTENCY_BODY_SPARE  32


/* the per-request digest: a pool cleanup gives it back */
typedef struct {
    EVP_MD_CTX                          *md_ctx;
    unsigned                             done:1;     /* saw the last buffer */
    unsigned                             partial:1;  /* missed some of it */
} ngx_http_idempotency_body_t;


static void ngx_http_idempotency_body_cleanup(void *data);
static EVP_MD_CTX *ngx_http_idempotency_body_md_get(void);
static void ngx_http_idempotency_body_md_put(EVP_MD_CTX *md_ctx);
static ngx_int_t ngx_http_idempotency_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_idempotency_body_head(ngx_http_request_t *r,
    EVP_MD_CTX *md_ctx);
static ngx_int_t ngx_http_idempotency_body_read_back(ngx_http_request_t *r,
    EVP_MD_CTX *md_ctx);


/*
 * A split record's body on its way to the client, chunk by chunk: chunk k
 * is fetched into buffer k % 2, while the one before it is being sent; the
 * next fetch starts once its buffer's chunk has left.  At most two chunks
 * per replay are in the worker (plus the reply hiredis is parsing).
 */
typedef struct ngx_http_idempotency_stream_s  ngx_http_idempotency_stream_t;

struct ngx_http_idempotency_stream_s {
    ngx_http_request_t                  *r;
    ngx_http_idempotency_redis_fetch_t   f;
    ngx_http_idempotency_redis_op_t     *op;       /* a fetch after chunk 0 */
    u_char                              *mem[2];   /* ngx_alloc()'d */
    ngx_buf_t                            b[2];     /* as passed on */
    size_t                               len;      /* of the body */
    ngx_uint_t                           chunks;   /* in all */
    ngx_uint_t                           fetched;  /* chunks read */
    ngx_uint_t                           passed;   /* chunks passed on */
    unsigned                             fetching:1;
};


static void ngx_http_idempotency_body_fetched(
    ngx_http_idempotency_redis_fetch_t *f, ngx_uint_t rc);
static void ngx_http_idempotency_stream_cleanup(void *data);
static void ngx_http_idempotency_stream_run(
    ngx_http_idempotency_stream_t *s);
static void ngx_http_idempotency_stream_writer(ngx_http_request_t *r);
static void ngx_http_idempotency_stream_fetched(
    ngx_http_idempotency_redis_fetch_t *f, ngx_uint_t rc);
static void ngx_http_idempotency_stream_cut(ngx_http_idempotency_stream_t *s,
    const char *why);


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

/*
 * Digest contexts of finished requests, reused by the next ones: a new one
 * per request costs more allocations than hashing a small body
 */
static EVP_MD_CTX    *ngx_http_idempotency_body_spare[
                          NGX_HTTP_IDEMPOTENCY_BODY_SPARE];
static ngx_uint_t     ngx_http_idempotency_body_nspare;


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

    while (ngx_http_idempotency_body_nspare) {
        EVP_MD_CTX_free(ngx_http_idempotency_body_spare[
                            --ngx_http_idempotency_body_nspare]);
    }

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

    body->md_ctx = ngx_http_idempotency_body_md_get();
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

    if (body->md_ctx) {
        ngx_http_idempotency_body_md_put(body->md_ctx);
        body->md_ctx = NULL;
    }
}


static EVP_MD_CTX *
ngx_http_idempotency_body_md_get(void)
{
    if (ngx_http_idempotency_body_nspare) {
        return ngx_http_idempotency_body_spare[
                   --ngx_http_idempotency_body_nspare];
    }

    return EVP_MD_CTX_new();
}


/* EVP_DigestInit_ex() starts a reused one afresh */

static void
ngx_http_idempotency_body_md_put(EVP_MD_CTX *md_ctx)
{
    if (ngx_http_idempotency_body_nspare < NGX_HTTP_IDEMPOTENCY_BODY_SPARE) {
        ngx_http_idempotency_body_spare[ngx_http_idempotency_body_nspare++]
            = md_ctx;
        return;
    }

    EVP_MD_CTX_free(md_ctx);
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

    ngx_http_idempotency_body_md_put(body->md_ctx);
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
 * (status, headers), the body's first chunk is read now (a body that is
 * gone is answered as a Redis failure, before anything is sent), then the
 * request goes on as a HIT, and ngx_http_idempotency_body_stream() sends
 * the rest as it comes.  NGX_AGAIN: the fetch runs; NGX_OK: a HEAD, which
 * needs no body; NGX_ERROR: it cannot.
 */

ngx_int_t
ngx_http_idempotency_body_fetch(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_http_idempotency_record_t *rec)
{
    off_t                           len;
    ngx_pool_cleanup_t             *cln;
    ngx_http_idempotency_stream_t  *s;

    len = ngx_atoof((u_char *) rec->body, rec->body_len);

    /*
     * The module splits bodies of SPLIT_MIN bytes or more, and captures
     * none over idempotency_max_response_size: a head announcing another
     * length was not written by it, and its Content-Length would reach the
     * client before the chunks (which cannot all exist) are found missing.
     */

    if (len < NGX_HTTP_IDEMPOTENCY_REDIS_SPLIT_MIN
        || len > (off_t) ctx->conf->max_response_size)
    {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: the record key_hash=%s is corrupt "
                      "(body length), not used",
                      ngx_http_idempotency_key_hash(&ctx->rkey));
        return NGX_ERROR;
    }

    ctx->reply_body.data = NULL;
    ctx->reply_body.len = (size_t) len;

    if (r->method == NGX_HTTP_HEAD) {
        return NGX_OK;
    }

    s = ngx_pcalloc(r->pool, sizeof(ngx_http_idempotency_stream_t));
    if (s == NULL) {
        return NGX_ERROR;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_idempotency_stream_cleanup;
    cln->data = s;

    s->r = r;
    s->len = (size_t) len;
    s->chunks = (s->len + NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK - 1)
                / NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK;

    s->f.rcf = ctx->conf->redis;
    s->f.rkey = ctx->rkey;

    /* room for the chunks' ":<i>" after it */
    s->f.key.data = ngx_pnalloc(r->pool,
                                NGX_HTTP_IDEMPOTENCY_REDIS_BODY_KEY_LEN(
                                    s->f.rcf, ctx->rkey.len, rec->owner_len)
                                + 1 + NGX_SIZE_T_LEN);
    if (s->f.key.data == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_idempotency_redis_body_key(s->f.rcf, &ctx->rkey, rec->owner,
                                            rec->owner_len, &s->f.key)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    s->f.len = ngx_min(s->len, NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK);

    s->mem[0] = ngx_alloc(s->f.len, r->connection->log);
    if (s->mem[0] == NULL) {
        return NGX_ERROR;
    }

    s->f.buf = s->mem[0];
    s->f.opp = &ctx->op;
    s->f.handler = ngx_http_idempotency_body_fetched;
    s->f.data = ctx;
    s->f.log = r->connection->log;

    if (ngx_http_idempotency_redis_fetch(&s->f) != NGX_OK) {
        return NGX_ERROR;
    }

    s->fetching = 1;
    ctx->stream = s;
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_CLAIMING;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency fetches the body of \"%V\", %uz bytes in "
                   "%ui chunks", &ctx->rkey, s->len, s->chunks);

    return NGX_AGAIN;
}


static void
ngx_http_idempotency_stream_cleanup(void *data)
{
    ngx_http_idempotency_stream_t *s = data;

    /* a reply still due finds no handler */
    ngx_http_idempotency_redis_forget(s->op);
    s->op = NULL;

    if (s->mem[0]) {
        ngx_free(s->mem[0]);
    }

    if (s->mem[1]) {
        ngx_free(s->mem[1]);
    }
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

    ctx->stream->fetching = 0;

    if (rc == NGX_HTTP_IDEMPOTENCY_REDIS_OK) {
        ctx->stream->fetched = 1;
    }

    /* as the claim's reply does: the phases run again */

    r->write_event_handler = ngx_http_core_run_phases;

    if (ngx_http_post_request(r, NULL) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ngx_http_run_posted_requests(c);
}


/*
 * The replay's header is sent: the body follows, driven by the client's
 * write events and by Redis' replies; the request is finalized here when
 * the last chunk is passed on, or cut.  Returns NGX_DONE.
 */

ngx_int_t
ngx_http_idempotency_body_stream(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx)
{
    ngx_http_idempotency_stream_run(ctx->stream);

    return NGX_DONE;
}


static void
ngx_http_idempotency_stream_run(ngx_http_idempotency_stream_t *s)
{
    size_t                     n;
    ngx_int_t                  rc;
    ngx_buf_t                 *b;
    ngx_uint_t                 i;
    ngx_chain_t                out;
    ngx_event_t               *wev;
    ngx_connection_t          *c;
    ngx_http_request_t        *r;
    ngx_http_core_loc_conf_t  *clcf;

    r = s->r;
    c = r->connection;

    /* what has come, to the client */

    while (s->passed < s->fetched) {
        i = s->passed % 2;
        n = ngx_min(s->len - s->passed * NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK,
                    NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK);

        b = &s->b[i];
        ngx_memzero(b, sizeof(ngx_buf_t));

        b->start = s->mem[i];
        b->pos = b->start;
        b->last = b->pos + n;
        b->end = b->last;
        b->memory = 1;

        s->passed++;

        if (s->passed == s->chunks) {
            b->last_buf = (r == r->main) ? 1 : 0;
            b->last_in_chain = 1;

        } else {
            b->flush = 1;
        }

        out.buf = b;
        out.next = NULL;

        rc = ngx_http_output_filter(r, &out);

        if (s->passed == s->chunks) {
            /* the rest is nginx's writer's */
            ngx_http_finalize_request(r, rc);
            return;
        }

        if (rc == NGX_ERROR) {
            ngx_http_finalize_request(r, NGX_ERROR);
            return;
        }
    }

    /* the next chunk, into the buffer whose chunk has left */

    i = s->fetched % 2;

    if (!s->fetching
        && s->fetched < s->chunks
        && (s->fetched < 2 || s->b[i].pos == s->b[i].last))
    {
        if (s->mem[i] == NULL) {
            s->mem[i] = ngx_alloc(NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK, c->log);
            if (s->mem[i] == NULL) {
                ngx_http_idempotency_stream_cut(s, "no memory");
                return;
            }
        }

        s->f.buf = s->mem[i];
        s->f.base = s->fetched * NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK;
        s->f.done = s->f.base;
        s->f.len = ngx_min(s->len,
                           s->f.base + NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK);
        s->f.opp = &s->op;
        s->f.handler = ngx_http_idempotency_stream_fetched;
        s->f.data = s;

        if (ngx_http_idempotency_redis_fetch(&s->f) != NGX_OK) {
            ngx_http_idempotency_stream_cut(s, "Redis is not reachable");
            return;
        }

        s->fetching = 1;
    }

    /* wait: for the client to take what is buffered, or for Redis */

    r->write_event_handler = ngx_http_idempotency_stream_writer;

    wev = c->write;
    clcf = ngx_http_get_module_loc_conf(r->main, ngx_http_core_module);

    if (r->buffered || r->postponed || (r == r->main && c->buffered)) {

        if (!wev->delayed) {
            ngx_add_timer(wev, clcf->send_timeout);
        }

        if (ngx_handle_write_event(wev, clcf->send_lowat) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_ERROR);
        }

        return;
    }

    /* all sent: Redis' reply moves it on (its own timeout applies) */

    if (wev->timer_set && !wev->delayed) {
        ngx_del_timer(wev);
    }
}


/* a write event of the client's connection while the body streams */

static void
ngx_http_idempotency_stream_writer(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_event_t                 *wev;
    ngx_connection_t            *c;
    ngx_http_core_loc_conf_t    *clcf;
    ngx_http_idempotency_ctx_t  *ctx;

    c = r->connection;
    wev = c->write;

    if (wev->timedout) {
        ngx_log_error(NGX_LOG_INFO, c->log, NGX_ETIMEDOUT,
                      "client timed out");
        c->timedout = 1;
        ngx_http_finalize_request(r, NGX_HTTP_REQUEST_TIME_OUT);
        return;
    }

    if (wev->delayed || r->aio) {
        clcf = ngx_http_get_module_loc_conf(r->main, ngx_http_core_module);

        if (!wev->delayed) {
            ngx_add_timer(wev, clcf->send_timeout);
        }

        if (ngx_handle_write_event(wev, clcf->send_lowat) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_ERROR);
        }

        return;
    }

    rc = ngx_http_output_filter(r, NULL);

    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx == NULL || ctx->stream == NULL) {
        ngx_http_finalize_request(r, NGX_ERROR);
        return;
    }

    ngx_http_idempotency_stream_run(ctx->stream);
}


static void
ngx_http_idempotency_stream_fetched(ngx_http_idempotency_redis_fetch_t *f,
    ngx_uint_t rc)
{
    ngx_connection_t               *c;
    ngx_http_idempotency_stream_t  *s;

    s = f->data;
    c = s->r->connection;

    s->op = NULL;
    s->fetching = 0;

    if (rc != NGX_HTTP_IDEMPOTENCY_REDIS_OK) {
        ngx_http_idempotency_stream_cut(s,
                                  rc == NGX_HTTP_IDEMPOTENCY_REDIS_TIMEOUT
                                  ? "Redis timed out"
                                  : "the body is missing or short, "
                                    "or Redis failed");

    } else {
        s->fetched++;
        ngx_http_idempotency_stream_run(s);
    }

    ngx_http_run_posted_requests(c);
}


/*
 * The header (and some of the body) is out: the response cannot become a
 * problem any more, and must not end as if it were complete.  The
 * connection is closed (HTTP/2: the stream is reset), short of its
 * Content-Length.
 */

static void
ngx_http_idempotency_stream_cut(ngx_http_idempotency_stream_t *s,
    const char *why)
{
    ngx_http_request_t          *r;
    ngx_http_idempotency_ctx_t  *ctx;

    r = s->r;
    ctx = ngx_http_idempotency_get_ctx(r);

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "idempotency: the replay of key_hash=%s is cut after "
                  "%uz of %uz bytes (%s)",
                  ctx ? (char *) ngx_http_idempotency_key_hash(&ctx->rkey)
                      : "-",
                  ngx_min(s->passed * NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK,
                          s->len),
                  s->len, why);

    r->connection->error = 1;
    ngx_http_finalize_request(r, NGX_ERROR);
}
