/*
 * The idempotency_status location (ngx_http_idempotency_status.c): the
 * counters as JSON or Prometheus text.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_STATUS_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_STATUS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* "idempotency_status": the location's content handler */
char *ngx_http_idempotency_status(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


#endif /* _NGX_HTTP_IDEMPOTENCY_STATUS_H_INCLUDED_ */
