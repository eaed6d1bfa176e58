/*
 * The pre-content phase handler (ngx_http_idempotency_handler.c): key,
 * fingerprint, claim, then the content (MISS), a replay (HIT) or a problem.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_HANDLER_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_HANDLER_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* in NGX_HTTP_PRECONTENT_PHASE, when some location has "idempotency on" */
ngx_int_t ngx_http_idempotency_handler(ngx_http_request_t *r);


#endif /* _NGX_HTTP_IDEMPOTENCY_HANDLER_H_INCLUDED_ */
