/*
 * A subscription to one Redis pub/sub channel on a connection of its own
 * (a subscribed connection takes no other command), made again after a
 * loss.  Ops layer, beside the command pipeline; uses the connection
 * layer's event adapter.  What it hears goes up through the handler the
 * caller gave.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_SUB_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_SUB_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_redis_conf.h"


#define NGX_HTTP_IDEMPOTENCY_REDIS_SUB_READY    0   /* (re)subscribed */
#define NGX_HTTP_IDEMPOTENCY_REDIS_SUB_LOST     1   /* messages may be lost */
#define NGX_HTTP_IDEMPOTENCY_REDIS_SUB_MESSAGE  2   /* msg is set */

typedef void (*ngx_http_idempotency_redis_sub_pt)(void *data,
    ngx_uint_t event, ngx_str_t *msg);

typedef struct ngx_http_idempotency_redis_sub_s
    ngx_http_idempotency_redis_sub_t;


/*
 * Subscribes to "channel" at the Redis of rcf (where its topology says
 * every PUBLISH is heard, once the module's connection there is up) and
 * keeps the subscription, following that connection when it moves, until
 * sub_exit(); handler is called on every event (LOST then READY when the
 * subscription moves).  The channel must live as long as the worker.
 * NULL: out of memory.
 */
ngx_http_idempotency_redis_sub_t *ngx_http_idempotency_redis_sub_start(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *channel,
    ngx_http_idempotency_redis_sub_pt handler, void *data, ngx_pool_t *pool,
    ngx_log_t *log);

/* at worker exit: closed, the handler is called no more */
void ngx_http_idempotency_redis_sub_exit(
    ngx_http_idempotency_redis_sub_t *sub);


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_SUB_H_INCLUDED_ */
