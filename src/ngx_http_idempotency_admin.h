/*
 * The idempotency_admin location (ngx_http_idempotency_admin.c): shows or
 * removes the record of one key.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_ADMIN_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_ADMIN_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* "idempotency_admin": the location's content handler */
char *ngx_http_idempotency_admin(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


#endif /* _NGX_HTTP_IDEMPOTENCY_ADMIN_H_INCLUDED_ */
