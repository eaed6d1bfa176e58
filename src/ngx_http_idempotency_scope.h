/*
 * The scope of a record: the hash that keeps the keys of different clients
 * apart in the Redis key name.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_SCOPE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_SCOPE_H_INCLUDED_


#include "ngx_http_idempotency_module.h"


/* hex digits of a scope hash (SHA-256) */
#define NGX_HTTP_IDEMPOTENCY_SCOPE_HASH_LEN  64


/*
 * Writes NGX_HTTP_IDEMPOTENCY_SCOPE_HASH_LEN lowercase hex digits of the
 * hash of the scope value, as ilcf's location computes it, to hex.
 * NGX_OK, NGX_DECLINED when the location refuses this scope value, or
 * NGX_ERROR (logged) when hashing failed.
 */
ngx_int_t ngx_http_idempotency_scope_hash(
    ngx_http_idempotency_loc_conf_t *ilcf, ngx_str_t *scope, u_char *hex,
    ngx_log_t *log);


#endif /* _NGX_HTTP_IDEMPOTENCY_SCOPE_H_INCLUDED_ */
