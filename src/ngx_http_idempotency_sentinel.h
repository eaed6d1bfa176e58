/*
 * Redis Sentinel: where the master is, asked of the sentinels (hiredis
 * async, on nginx events), and told by their +switch-master event.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_SENTINEL_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_SENTINEL_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_redis_node.h"


/* what the handler of a sentinel hears */
#define NGX_HTTP_IDEMPOTENCY_SENTINEL_ANSWER  0   /* a round of asking ended */
#define NGX_HTTP_IDEMPOTENCY_SENTINEL_SWITCH  1   /* the master moved */


typedef struct ngx_http_idempotency_sentinel_s
    ngx_http_idempotency_sentinel_t;

/*
 * Called from a hiredis callback or a timer of the sentinel side, never
 * from inside ngx_http_idempotency_sentinel_master(): the connection should
 * call ngx_http_idempotency_sentinel_master() again, from a timer.  With
 * SWITCH, a connection to the old master should be closed first.
 */
typedef void (*ngx_http_idempotency_sentinel_pt)(void *data,
    ngx_uint_t event);


ngx_http_idempotency_sentinel_t *ngx_http_idempotency_sentinel_create(
    ngx_pool_t *pool, ngx_http_idempotency_redis_conf_t *rcf,
    ngx_log_t *log, ngx_http_idempotency_sentinel_pt handler, void *data);

/*
 * Where to connect.  NGX_OK: host (an IP literal, NUL-ended) and port are
 * set, and the answer is used up: the next call asks the sentinels again.
 * NGX_AGAIN: the sentinels are being asked, the handler hears ANSWER when
 * they are done.  NGX_DECLINED: no sentinel named the master in the last
 * round (also used up).
 */
ngx_int_t ngx_http_idempotency_sentinel_master(
    ngx_http_idempotency_sentinel_t *s, const char **host, in_port_t *port);

/* the reply of ROLE: NULL for a master, or why the server is none */
const char *ngx_http_idempotency_sentinel_role(redisReply *reply);

/* at worker exit: closes both connections, stops the timers */
void ngx_http_idempotency_sentinel_close(ngx_http_idempotency_sentinel_t *s);


#endif /* _NGX_HTTP_IDEMPOTENCY_SENTINEL_H_INCLUDED_ */
