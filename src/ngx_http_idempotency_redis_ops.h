/*
 * The ops layer: one command's life (create, send, timer, reply, finish),
 * parking and the retry budget, the main and the bulk pipeline.  Uses the
 * topology (where an op goes) and the connection layer below it.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_OPS_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_OPS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_redis_op.h"
#include "ngx_http_idempotency_redis_park.h"


/*
 * One Redis connection of this worker as idempotency_status shows it: the
 * first one of a Redis ("main") or the one for large commands ("bulk").
 */
typedef struct {
    ngx_str_t                           *name;
    ngx_uint_t                           bulk;
    ngx_uint_t                           ready;
    ngx_uint_t                           in_flight;   /* hiredis holds */
    size_t                               in_flight_bytes;
    uint64_t                             commands;    /* handed over */
    ngx_http_idempotency_redis_stats_t   stats;
    ngx_str_t                            policy;  /* maxmemory, or "" */
} ngx_http_idempotency_redis_conn_t;


/* once per worker, before any node is made: the nodes' handlers */
void ngx_http_idempotency_redis_ops_init(void);

/* where a command for this record key goes (the topology's answer) */
ngx_http_idempotency_redis_node_t *ngx_http_idempotency_redis_pick(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *key);

/*
 * A command of "size" bytes goes on the bulk connection of its Redis when
 * it is large, connected now if it is not; with "ready", only if that
 * connection can take it at once (a plain command fails fast without a
 * connection: it uses the first one then).
 */
ngx_http_idempotency_redis_node_t *ngx_http_idempotency_redis_route(
    ngx_http_idempotency_redis_node_t *node, size_t size, ngx_uint_t ready);

/* the bytes of the arguments */
size_t ngx_http_idempotency_redis_args_size(ngx_str_t *args,
    ngx_uint_t nargs);

/*
 * Sends "cmd" with KEYS[1] = key and ARGV = args on node, the handler
 * called once as said above.  NULL (nothing called): no connection there
 * now, or no memory (rcf names the Redis in the log when there is no node).
 */
ngx_http_idempotency_redis_op_t *ngx_http_idempotency_redis_op_run(
    ngx_http_idempotency_redis_conf_t *rcf,
    ngx_http_idempotency_redis_node_t *node,
    const ngx_http_idempotency_redis_cmd_t *cmd, ngx_uint_t script,
    ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log);

/*
 * The same for a command that must not be lost to a passing outage: kept
 * in the worker ("parked") and sent again until "deadline"; see
 * ngx_http_idempotency_redis_script_retry() for the whole contract.  The
 * handler is never called from inside this function.  NULL: no op could
 * be made at all.
 */
ngx_http_idempotency_redis_op_t *ngx_http_idempotency_redis_op_retry(
    ngx_http_idempotency_redis_node_t *node,
    const ngx_http_idempotency_redis_cmd_t *cmd, ngx_uint_t script,
    ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs, ngx_msec_t deadline,
    ngx_http_idempotency_redis_pt handler, void *data,
    ngx_http_idempotency_redis_batch_t *batch, ngx_log_t *log);

/* the handler will not be called for this op; safe on any live op */
void ngx_http_idempotency_redis_cancel(ngx_http_idempotency_redis_op_t *op);

/*
 * For the ops layer's own files (redis_wait.c): an op out of where it is
 * (hiredis' pending ones, or ACKING), NEW; an op finished: its handler
 * told (unless cancelled), the op freed
 */
void ngx_http_idempotency_redis_op_detach(ngx_http_idempotency_redis_op_t *op);
void ngx_http_idempotency_redis_op_finish(ngx_http_idempotency_redis_op_t *op,
    redisReply *reply, ngx_uint_t rc);

/*
 * This worker's connections to the Redis servers of "redis" (an array of
 * ngx_http_idempotency_redis_conf_t *; Redis Cluster nodes are not among
 * them): up to n into out; returns how many there are.
 */
ngx_uint_t ngx_http_idempotency_redis_connections(ngx_array_t *redis,
    ngx_http_idempotency_redis_conn_t *out, ngx_uint_t n);


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_OPS_H_INCLUDED_ */
