/*
 * The module's top (ngx_http_idempotency_module.c): the directive table,
 * configuration create and merge, registration.  Only that file includes
 * this header: the types the other files share are in
 * ngx_http_idempotency_conf.h, each file's functions in its own header.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_


#include "ngx_http_idempotency_conf.h"


/* idempotency_key_max_length: its default, and the most it takes */
#define NGX_HTTP_IDEMPOTENCY_KEY_MAX_LEN         255
#define NGX_HTTP_IDEMPOTENCY_KEY_LIMIT           8192


#endif /* _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_ */
