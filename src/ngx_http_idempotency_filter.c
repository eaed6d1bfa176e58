/*
 * Capture of a claimed request's response as it streams to the client; the
 * claim is settled (ngx_http_idempotency_claim.c) when the response ends.
 */

#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_stats.h"


static ngx_int_t ngx_http_idempotency_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_idempotency_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_uint_t ngx_http_idempotency_header_only(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_snapshot(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);
static ngx_int_t ngx_http_idempotency_release_held(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_chain_t *in);
static ngx_int_t ngx_http_idempotency_keep_tail(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_chain_t **in);
static ngx_uint_t ngx_http_idempotency_stored_header(
    ngx_http_idempotency_ctx_t *ctx, ngx_table_elt_t *h);
static void ngx_http_idempotency_swallow(ngx_chain_t *in);
static ngx_int_t ngx_http_idempotency_client_gone(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_chain_t *in);
static ngx_int_t ngx_http_idempotency_capture(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_buf_t *b);
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


/*
 * The body goes into the record's room, which grows by doubling (a body of
 * unknown length) up to one chunk of a split record; a body that goes on
 * past that fills blocks of a chunk each (ctx->more), so that no more than
 * a chunk is ever copied again.  Room made for a Content-Length (or grown
 * past a chunk before) simply doubles.
 */

static ngx_int_t
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










