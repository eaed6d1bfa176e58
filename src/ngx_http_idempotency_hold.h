/*
 * Read-after-complete: a response's last buffers held until the reply to
 * its claim's settle step.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_HOLD_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_HOLD_H_INCLUDED_


#include "ngx_http_idempotency_module.h"


/* holds the response's last buffers until that reply: NGX_AGAIN */
ngx_int_t ngx_http_idempotency_settle_wait(ngx_http_idempotency_ctx_t *ctx,
    ngx_chain_t *in);

/* the settle step's reply (or its end): its own request goes on */
void ngx_http_idempotency_hold_settled(
    ngx_http_idempotency_redis_info_t *info);

/* the request ends: it waits no more */
void ngx_http_idempotency_hold_leave(ngx_http_idempotency_ctx_t *ctx);


#endif /* _NGX_HTTP_IDEMPOTENCY_HOLD_H_INCLUDED_ */
