/*
 * Redis Cluster: the slot map of a worker and the node of each record key.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_CLUSTER_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_CLUSTER_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency_redis.h"


/* connects to the seeds and asks one of them for the slot map */
ngx_int_t ngx_http_idempotency_cluster_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_conf_t *rcf);
void ngx_http_idempotency_cluster_exit(ngx_http_idempotency_cluster_t *cl);

/*
 * The master that owns the key's slot; before the map is known (or for a
 * slot without an owner) any node with a connection, whose MOVED reply
 * then says where the key lives.
 */
ngx_http_idempotency_redis_node_t *ngx_http_idempotency_cluster_node(
    ngx_http_idempotency_cluster_t *cl, ngx_str_t *key);

/* the master of the key's slot in the map, or NULL if not known */
ngx_http_idempotency_redis_node_t *ngx_http_idempotency_cluster_owner(
    ngx_http_idempotency_cluster_t *cl, ngx_str_t *key);

/*
 * For an error reply of "from": the node named by a MOVED (which updates
 * the map and asks for a new one) or an ASK (*asking set; the map is
 * kept), or NULL if the reply is neither or names no usable node.
 */
ngx_http_idempotency_redis_node_t *ngx_http_idempotency_cluster_redirect(
    ngx_http_idempotency_cluster_t *cl,
    ngx_http_idempotency_redis_node_t *from, const char *str, size_t len,
    ngx_uint_t *asking);

/* a node's connection failed: the map may be stale */
void ngx_http_idempotency_cluster_node_failed(
    ngx_http_idempotency_cluster_t *cl,
    ngx_http_idempotency_redis_node_t *node);


#endif /* _NGX_HTTP_IDEMPOTENCY_CLUSTER_H_INCLUDED_ */
