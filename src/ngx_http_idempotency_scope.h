/*
 * Scopes: the hash that names a principal's namespace in Redis
 * (idempotency_scope, idempotency_scope_secret) and the per-scope share of
 * a worker's waiting duplicates (idempotency_wait).
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_SCOPE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_SCOPE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_conf.h"


/* hex digits of a scope hash */
#define NGX_HTTP_IDEMPOTENCY_SCOPE_HEX_LEN      64

/* the HMAC key of idempotency_scope_secret, padded as HMAC wants it */
#define NGX_HTTP_IDEMPOTENCY_SCOPE_BLOCK        64

/* the largest secret file read */
#define NGX_HTTP_IDEMPOTENCY_SCOPE_SECRET_MAX   4096

/* duplicates waiting at once in one worker (idempotency_wait) */
#define NGX_HTTP_IDEMPOTENCY_MAX_WAITERS         1024

/* duplicates of one scope waiting at once in one worker */
#define NGX_HTTP_IDEMPOTENCY_MAX_SCOPE_WAITERS  64


struct ngx_http_idempotency_scope_secret_s {
    ngx_str_t    file;                /* full name, for messages */
    u_char       ipad[NGX_HTTP_IDEMPOTENCY_SCOPE_BLOCK];
    u_char       opad[NGX_HTTP_IDEMPOTENCY_SCOPE_BLOCK];
};


/*
 * Writes 64 lowercase hex digits (no NUL) of the scope's hash to hex:
 * HMAC-SHA-256 keyed by the location's idempotency_scope_secret when it
 * has one, plain SHA-256 otherwise.  NGX_OK or NGX_ERROR (logged).
 */
ngx_int_t ngx_http_idempotency_scope_hash(
    ngx_http_idempotency_loc_conf_t *ilcf, ngx_str_t *scope, u_char *hex,
    ngx_log_t *log);

ngx_int_t ngx_http_idempotency_scope_init_process(ngx_cycle_t *cycle);
void ngx_http_idempotency_scope_exit_process(ngx_cycle_t *cycle);

char *ngx_http_idempotency_scope_secret(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/*
 * Logs, at most once a minute per worker, that requests with a key were
 * refused because their scope was empty.
 */
void ngx_http_idempotency_scope_empty_log(ngx_http_request_t *r);

/*
 * Takes one waiting slot of the scope whose hash is hex (64 digits):
 * NGX_OK, or NGX_DECLINED when the scope holds its share already.  Every
 * NGX_OK is matched by one wait_leave() with the same hash.
 */
ngx_int_t ngx_http_idempotency_scope_wait_enter(u_char *hex);
void ngx_http_idempotency_scope_wait_leave(u_char *hex);


#endif /* _NGX_HTTP_IDEMPOTENCY_SCOPE_H_INCLUDED_ */
