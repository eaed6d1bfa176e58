/*
 * The topology layer's host names resolved by the workers ("resolve"):
 * a node's place whose address is the name's answer from nginx's
 * resolver, asked before every connect and again when the answer's
 * validity ends.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_RESOLVE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_RESOLVE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency_redis_node.h"


typedef struct ngx_http_idempotency_redis_resolve_s
    ngx_http_idempotency_redis_resolve_t;


/*
 * A node for host name "name" (NUL-ended, living as long as the worker)
 * and port, connecting to what rcf's resolver answers for it; "failed"
 * (may be NULL) hears of every failed connection, with "data".  The node
 * is not connected yet.
 */
ngx_http_idempotency_redis_node_t *ngx_http_idempotency_redis_resolve_node(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *name, in_port_t port,
    void (*failed)(void *data, ngx_http_idempotency_redis_node_t *node),
    void *data, ngx_pool_t *pool, ngx_log_t *log);

/*
 * "ready" (with "data") hears that the node made by resolve_node() is
 * ready for commands, at every connect (see the place's ready)
 */
void ngx_http_idempotency_redis_resolve_ready(
    ngx_http_idempotency_redis_node_t *node,
    void (*ready)(void *data, ngx_http_idempotency_redis_node_t *node),
    void *data);

/* at worker exit, after node_exit(): the name's query and timer stopped */
void ngx_http_idempotency_redis_resolve_exit(
    ngx_http_idempotency_redis_node_t *node);


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_RESOLVE_H_INCLUDED_ */
