/*
 * The module's variables and each request's outcome
 * (ngx_http_idempotency_var.c): its name, the reason logged with it, and
 * its count in the log phase.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_VAR_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_VAR_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_conf.h"


/* $idempotency_status, $idempotency_key, $idempotency_cache (preconfig) */
ngx_int_t ngx_http_idempotency_add_variables(ngx_conf_t *cf);

/* the stats zone, and the outcome counted in the log phase */
ngx_int_t ngx_http_idempotency_outcome_init(ngx_conf_t *cf);

ngx_http_idempotency_outcome_e ngx_http_idempotency_request_outcome(
    ngx_http_request_t *r);
ngx_str_t *ngx_http_idempotency_outcome_name(
    ngx_http_idempotency_outcome_e outcome);
const char *ngx_http_idempotency_outcome_reason(
    ngx_http_idempotency_outcome_e outcome);


#endif /* _NGX_HTTP_IDEMPOTENCY_VAR_H_INCLUDED_ */
