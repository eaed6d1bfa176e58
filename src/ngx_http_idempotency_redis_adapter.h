/*
 * The connection layer's hiredis <-> nginx event adapter: a hiredis
 * context's socket as an nginx connection, driven by nginx's events.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_ADAPTER_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_ADAPTER_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>


/*
 * Wraps the socket of a new hiredis context in an nginx connection and
 * hooks hiredis to its events (level-triggered); the caller sets ac->data
 * and may replace the read handler.  NULL: no free worker connection.
 */
ngx_connection_t *ngx_http_idempotency_redis_attach(redisAsyncContext *ac,
    ngx_log_t *log);

/* for such a connection's own read handler: hiredis reads (plain or TLS) */
void ngx_http_idempotency_redis_handle_read(ngx_connection_t *c);
/* hiredis writes what it queued on c (a write handler of c's owner) */
void ngx_http_idempotency_redis_write(ngx_connection_t *c);


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_ADAPTER_H_INCLUDED_ */
