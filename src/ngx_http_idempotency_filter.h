/*
 * The header and body filters of a claimed request's response
 * (ngx_http_idempotency_filter.c).
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_FILTER_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_FILTER_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* puts both filters in the chains (postconfiguration) */
ngx_int_t ngx_http_idempotency_filter_init(ngx_conf_t *cf);


#endif /* _NGX_HTTP_IDEMPOTENCY_FILTER_H_INCLUDED_ */
