/*
 * Bodies (ngx_http_idempotency_body.c): the request's, hashed for the
 * fingerprint as nginx reads it, and a split record's, fetched from Redis
 * and streamed to the client for a replay.  Of these, the module's glue
 * calls the init and exit entry points only.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_BODY_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_BODY_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_record.h"


/* puts the request body filter in the chain (postconfiguration) */
ngx_int_t ngx_http_idempotency_body_init(ngx_conf_t *cf);

/* frees the worker's SHA-256 */
void ngx_http_idempotency_body_exit_process(ngx_cycle_t *cycle);

/* starts the fingerprint with the method and URI, before the body is read */
ngx_int_t ngx_http_idempotency_body_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);

/* the body read: the fingerprint, as hex in ctx->fingerprint */
ngx_int_t ngx_http_idempotency_body_fingerprint(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);

/*
 * A claim found a split record: its body's first chunk is fetched.
 * NGX_AGAIN: the fetch runs; NGX_OK: a HEAD, no body; NGX_ERROR.
 */
ngx_int_t ngx_http_idempotency_body_fetch(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_http_idempotency_record_t *rec);

/* the replay's header is sent: the body follows; NGX_DONE */
ngx_int_t ngx_http_idempotency_body_stream(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);


#endif /* _NGX_HTTP_IDEMPOTENCY_BODY_H_INCLUDED_ */
