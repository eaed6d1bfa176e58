/*
 * The claim's life cycle (ngx_http_idempotency_claim.c): claim, run and
 * renew; its end is ngx_http_idempotency_settle.h.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_CLAIM_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_CLAIM_H_INCLUDED_


#include "ngx_http_idempotency_ctx.h"


/* at worker start: the random part of this worker's owner tokens */
ngx_int_t ngx_http_idempotency_claim_init_process(ngx_cycle_t *cycle);

/*
 * The request's pool goes (the context's cleanup): a pending Redis op is
 * detached, the timers stopped, and the claim settled if it was not.
 */
void ngx_http_idempotency_claim_end(void *data);

/*
 * Sends the claim (SET NX GET PX); the reply puts the context in
 * STATE_DECIDED and runs the request's phases again.
 */
void ngx_http_idempotency_claim_send(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);

/* the claim is ours: the request runs, and its claim is renewed */
void ngx_http_idempotency_claim_won(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);

/* a claimed request in a new location (internal redirect) */
void ngx_http_idempotency_claim_redirected(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);


#endif /* _NGX_HTTP_IDEMPOTENCY_CLAIM_H_INCLUDED_ */
