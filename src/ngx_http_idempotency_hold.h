/*
 * Read-after-complete: a response's last buffers held until the reply to
 * its claim's settle step.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_HOLD_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_HOLD_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_redis.h"


/* r->buffered while the last buffer waits for Redis (read-after-complete) */
#define NGX_HTTP_IDEMPOTENCY_BUFFERED            0x08


/* holds the response's last buffers until that reply: NGX_AGAIN */
ngx_int_t ngx_http_idempotency_settle_wait(ngx_http_idempotency_ctx_t *ctx,
    ngx_chain_t *in);

/* the settle step's reply (or its end): its own request goes on */
void ngx_http_idempotency_hold_settled(
    ngx_http_idempotency_redis_info_t *info);

/* the request ends: it waits no more */
void ngx_http_idempotency_hold_leave(ngx_http_idempotency_ctx_t *ctx);


#endif /* _NGX_HTTP_IDEMPOTENCY_HOLD_H_INCLUDED_ */
