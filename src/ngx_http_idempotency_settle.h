/*
 * The claim's end (ngx_http_idempotency_settle.c): judged at the response
 * header, settled once (store, release or hold).
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_SETTLE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_SETTLE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_ctx.h"


/*
 * At the response header: whether the claim is released (status policy,
 * error_page after the claim) or held (upstream failed after it got the
 * request); sets ctx->release or ctx->hold.
 */
void ngx_http_idempotency_claim_judge(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);

/*
 * Ends the claim once: store, release or hold, from what ctx says.
 * NGX_OK: a Redis step was sent, whose reply settle_wait() can wait for.
 */
ngx_int_t ngx_http_idempotency_settle(ngx_http_idempotency_ctx_t *ctx);

/*
 * Releases a claim that may be in Redis while nothing runs under it (its
 * reply was lost, or its request ended before it went on)
 */
void ngx_http_idempotency_abandon(ngx_http_idempotency_ctx_t *ctx);

/* some upstream of this request was sent (part of) the request */
ngx_uint_t ngx_http_idempotency_upstream_reached(ngx_http_request_t *r);


#endif /* _NGX_HTTP_IDEMPOTENCY_SETTLE_H_INCLUDED_ */
