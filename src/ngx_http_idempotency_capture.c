/* A claimed response's record as it streams; uses record, stats, conf. */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_capture.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_stats.h"


static ngx_uint_t ngx_http_idempotency_stored_header(
    ngx_http_idempotency_ctx_t *ctx, ngx_table_elt_t *h);


/*
 * End-to-end headers as "Name: value\r\n" lines, written where they go in
 * the record, which is allocated here: with the response's length when it
 * is known, the body is then captured without a reallocation.
 */

ngx_int_t
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


/*
 * The trailers the upstream sent (gRPC's grpc-status and grpc-message, for
 * one) are in the response's list when its last buffer comes here, before
 * add_trailer adds its own further down the chain.  They are stored as
 * header lines whose name starts with "@", after the header lines.  The
 * record was laid out before they were known: with trailers, the record
 * (its first line up to the body's first part) is copied once more, and
 * the copy becomes ctx->record, which a large body's store may take.
 */

ngx_int_t
ngx_http_idempotency_trailers(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_str_t *record)
{
    u_char           *p, *q, *end;
    size_t            len, lines;
    ngx_uint_t        i, pass;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    len = 0;
    lines = 0;
    p = NULL;
    q = NULL;

    for (pass = 0; pass < 2; pass++) {

        part = &r->headers_out.trailers.part;
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

            if (!ngx_http_idempotency_stored_header(ctx, &h[i])) {
                continue;
            }

            if (pass == 0) {
                len += ngx_http_idempotency_record_header_size(
                                      1 + h[i].key.len, h[i].value.len);
                continue;
            }

            *q = NGX_HTTP_IDEMPOTENCY_RECORD_TRAILER;
            q = ngx_http_idempotency_record_write_header(q + 1,
                                                     h[i].key.data,
                                                     h[i].key.len,
                                                     h[i].value.data,
                                                     h[i].value.len);
        }

        if (len == 0) {
            return NGX_OK;
        }

        if (pass == 0) {

            /* the empty line before the body ends the header lines */

            end = ctx->record + ctx->body_off - (sizeof(CRLF) - 1);
            lines = end - record->data;

            p = ngx_pnalloc(r->pool, record->len + len);
            if (p == NULL) {
                return NGX_ERROR;
            }

            q = ngx_cpymem(p, record->data, lines);
        }
    }

    q = ngx_cpymem(q, record->data + lines, record->len - lines);

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency: %uz bytes of trailers stored", len);

    if (ctx->record) {
        ngx_pfree(r->pool, ctx->record);
    }

    ctx->record = p;
    ctx->headers_len += len;
    ctx->body_off = lines + len + sizeof(CRLF) - 1;

    record->data = p;
    record->len = q - p;

    return NGX_OK;
}


/*
 * The body goes into the record's room, which grows by doubling (a body of
 * unknown length) up to one chunk of a split record; a body that goes on
 * past that fills blocks of a chunk each (ctx->more), so that no more than
 * a chunk is ever copied again.  Room made for a Content-Length (or grown
 * past a chunk before) simply doubles.
 */

ngx_int_t
ngx_http_idempotency_capture(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_buf_t *b)
{
    u_char   *p, *pos, **block;
    size_t    len, size, n, off;

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

    if (ctx->more == NULL && ctx->body_len + len > ctx->body_size
        && ctx->body_size != NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK)
    {
        size = ngx_max(ctx->body_size * 2, ctx->body_len + len);
        size = ngx_max(size, 4096);

        if (ctx->body_size < NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK) {
            size = ngx_min(size, NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK);
        }

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

    pos = b->pos;

    if (ctx->more == NULL) {
        n = ngx_min(len, ctx->body_size - ctx->body_len);

        ngx_memcpy(ctx->record + ctx->body_off + ctx->body_len, pos, n);
        ctx->body_len += n;

        if (n == len) {
            return NGX_OK;
        }

        /* the room is one chunk, full: the rest goes in blocks */

        pos += n;
        len -= n;

        ctx->more = ngx_array_create(r->pool, 4, sizeof(u_char *));
        if (ctx->more == NULL) {
            return NGX_ERROR;
        }
    }

    while (len) {
        off = ctx->more_len % NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK;

        if (off == 0) {
            block = ngx_array_push(ctx->more);
            if (block == NULL) {
                return NGX_ERROR;
            }

            *block = ngx_palloc(r->pool, NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK);
            if (*block == NULL) {
                return NGX_ERROR;
            }
        }

        block = ctx->more->elts;
        n = ngx_min(len, NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK - off);

        ngx_memcpy(block[ctx->more->nelts - 1] + off, pos, n);

        pos += n;
        len -= n;
        ctx->more_len += n;
        ctx->body_len += n;
    }

    return NGX_OK;
}
