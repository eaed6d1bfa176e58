/*
 * RFC 9457 problem responses (ngx_http_idempotency_problem.c), the plain
 * bodies the module answers with, and idempotency_problem_type.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_PROBLEM_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_PROBLEM_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_conf.h"


/* the problem of an outcome, typed with the location's prefix */
ngx_int_t ngx_http_idempotency_send_problem(ngx_http_request_t *r,
    ngx_http_idempotency_outcome_e outcome);

/* a problem of the caller's own (idempotency_admin) */
ngx_int_t ngx_http_idempotency_send_problem_text(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *type, ngx_str_t *title, ngx_str_t *detail);

/* the status line of a status nginx has no reason phrase for (422) */
void ngx_http_idempotency_status_line(ngx_http_request_t *r);

/*
 * a body the module answers with itself (problems, idempotency_admin,
 * idempotency_status): never cached, Retry-After unless retry_after is 0
 */
ngx_int_t ngx_http_idempotency_send_body(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *type, ngx_buf_t *b,
    ngx_uint_t retry_after);

/* "idempotency_problem_type" */
char *ngx_http_idempotency_problem_type(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


#endif /* _NGX_HTTP_IDEMPOTENCY_PROBLEM_H_INCLUDED_ */
