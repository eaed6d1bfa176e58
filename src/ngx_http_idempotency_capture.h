/*
 * The record a claimed response makes (ngx_http_idempotency_capture.c):
 * its header lines at the response's header, its body as it streams, its
 * trailers when the claim is settled.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_CAPTURE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_CAPTURE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_ctx.h"


/* allocates ctx->record and writes the header lines into it */
ngx_int_t ngx_http_idempotency_snapshot(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);

/* copies a buffer of the body in, or marks the response oversize */
ngx_int_t ngx_http_idempotency_capture(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_buf_t *b);

/* the trailers after the header lines of the record to store, if any */
ngx_int_t ngx_http_idempotency_trailers(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_str_t *record);


#endif /* _NGX_HTTP_IDEMPOTENCY_CAPTURE_H_INCLUDED_ */
