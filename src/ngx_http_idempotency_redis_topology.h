/*
 * The topology layer: where an op goes (a single server, the master the
 * sentinels name, the Cluster node of the key's slot), redirects and
 * failover.  One interface for the ops layer, chosen with the directive's
 * mode when it is parsed; uses the connection layer below it.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_TOPOLOGY_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_TOPOLOGY_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency_redis_node.h"


struct ngx_http_idempotency_redis_topology_s {
    /* this worker's nodes: made, and connected or connecting */
    ngx_int_t                          (*init)(ngx_cycle_t *cycle,
                                           ngx_http_idempotency_redis_conf_t
                                           *rcf);
    /* at worker exit: every node closed (node_exit) */
    void                               (*exit)(
                                           ngx_http_idempotency_redis_conf_t
                                           *rcf);

    /*
     * The node of a record key; before a Cluster's map is known any node
     * with a connection, whose redirect then says where the key lives.
     */
    ngx_http_idempotency_redis_node_t *(*pick)(
                                           ngx_http_idempotency_redis_conf_t
                                           *rcf, ngx_str_t *key);

    /* the node that owns the key now, or NULL if not known (Cluster) */
    ngx_http_idempotency_redis_node_t *(*owner)(
                                           ngx_http_idempotency_redis_conf_t
                                           *rcf, ngx_str_t *key);

    /*
     * An error reply of "from": the node it sends the command to (MOVED;
     * ASK with *asking set), or NULL.  NULL function: no redirects.
     */
    ngx_http_idempotency_redis_node_t *(*redirect)(
                                           ngx_http_idempotency_redis_node_t
                                           *from, redisReply *reply,
                                           ngx_uint_t *asking);

    /*
     * An error reply that says the server takes no writes as the master
     * any more (the connection is then dropped, the next one asks the
     * sentinels or the resolver again, and a retryable command waits for
     * it): the text for the log, or NULL.
     */
    const char                        *(*demoted)(redisReply *reply);

    /*
     * A node whose server hears every PUBLISH made to this Redis, for a
     * subscription to listen at: the master (a replica of it would hear
     * them as well, so a demoted master goes on hearing them); in a
     * Cluster, which sends every PUBLISH to every node, "current" while
     * its connection is ready, else any node whose connection is.  NULL:
     * none now.
     */
    ngx_http_idempotency_redis_node_t *(*listener)(
                                           ngx_http_idempotency_redis_conf_t
                                           *rcf,
                                           ngx_http_idempotency_redis_node_t
                                           *current);

    /*
     * This worker's nodes one by one, for the status: the one at "i" (0
     * up), NULL past the last
     */
    ngx_http_idempotency_redis_node_t *(*node_at)(
                                           ngx_http_idempotency_redis_conf_t
                                           *rcf, ngx_uint_t i);
};


/*
 * The "demoted" of every topology: READONLY, LOADING or MASTERDOWN (the
 * code word only), the text for the log, or NULL.
 */
const char *ngx_http_idempotency_redis_demoted(redisReply *reply);


extern const ngx_http_idempotency_redis_topology_t
    ngx_http_idempotency_redis_single;
extern const ngx_http_idempotency_redis_topology_t
    ngx_http_idempotency_redis_sentinel;
extern const ngx_http_idempotency_redis_topology_t
    ngx_http_idempotency_redis_cluster;


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_TOPOLOGY_H_INCLUDED_ */
