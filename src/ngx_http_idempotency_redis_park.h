/*
 * The ops layer's parking: retryable ops kept in the worker while Redis
 * cannot take them, the worker's retry buffer, giving up.  Used by
 * ngx_http_idempotency_redis_ops.c (and the records' batches); uses
 * nothing above it.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_PARK_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_PARK_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency_redis_op.h"


/*
 * Keeps a retryable op (not with hiredis) for another try: at the next
 * READY of the connection, or after "retry" ms if that is not 0.  Returns
 * NULL, or why it cannot be kept.
 */
const char *ngx_http_idempotency_redis_park(
    ngx_http_idempotency_redis_op_t *op, const char *error, ngx_msec_t retry);

/*
 * A plain op made while its node's address is being asked (the sentinels,
 * the resolver): it waits in node->parked, counted nowhere, for the
 * connection to be ready (sent then) or for the command timeout (given up)
 */
void ngx_http_idempotency_redis_hold(ngx_http_idempotency_redis_op_t *op);

/*
 * The connect the held ops of the node waited for failed: each gives up,
 * its handler called from a timer that runs at once
 */
void ngx_http_idempotency_redis_unhold(ngx_http_idempotency_redis_node_t *node,
    const char *reason);

/*
 * An op in no queue and with no timer is given up with "reason": its
 * handler is called from a timer that runs at once, never from the caller
 */
void ngx_http_idempotency_redis_doom(ngx_http_idempotency_redis_op_t *op,
    const char *reason);

/* park, or give up at once when the op cannot be kept */
void ngx_http_idempotency_redis_retry_or_give_up(
    ngx_http_idempotency_redis_op_t *op, const char *error, ngx_msec_t retry);

/* takes a PARKED op out of the queue and the counters; its state is kept */
void ngx_http_idempotency_redis_unpark(ngx_http_idempotency_redis_op_t *op);

/* an op that was parked is done (replied, given up or cancelled) */
void ngx_http_idempotency_redis_unkeep(ngx_http_idempotency_redis_op_t *op);

/* the notice once every op kept for a retry is done */
void ngx_http_idempotency_redis_drained(
    ngx_http_idempotency_redis_node_t *node);

/* a retryable op that is not with hiredis: its handler gets ERROR, freed */
void ngx_http_idempotency_redis_give_up(ngx_http_idempotency_redis_op_t *op,
    const char *reason);

/* the text of an error reply worth sending the command again for, or NULL */
const char *ngx_http_idempotency_redis_transient(redisReply *reply);

/* the batch waits for Redis no more: its bytes leave the retry buffer */
void ngx_http_idempotency_redis_batch_uncharge(
    ngx_http_idempotency_redis_batch_t *batch);

/* worker exit: every op parked or doomed on the node is given up */
void ngx_http_idempotency_redis_park_exit(
    ngx_http_idempotency_redis_node_t *node);


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_PARK_H_INCLUDED_ */
