/*
 * The "idempotency_redis" directive's arguments (configuration side).
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_DIRECTIVE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_DIRECTIVE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency_redis_conf.h"


/*
 * The arguments of an "idempotency_redis" directive (all of them in
 * "text", for logs and to find identical directives): *out is a new conf,
 * or an error for nginx -t is returned.
 */
char *ngx_http_idempotency_redis_conf_parse(ngx_conf_t *cf,
    ngx_command_t *cmd, ngx_str_t *text,
    ngx_http_idempotency_redis_conf_t **out);

/*
 * The checks that need the merged configuration (postconfiguration): an
 * error for nginx -t is logged and NGX_ERROR returned.
 */
ngx_int_t ngx_http_idempotency_redis_conf_check(ngx_conf_t *cf,
    ngx_http_idempotency_redis_conf_t *rcf);


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_DIRECTIVE_H_INCLUDED_ */
