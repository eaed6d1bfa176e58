/*
 * The ops layer's acknowledgements (wait_replicas=, wait_aof): a write
 * counts once a WAIT (WAITAOF) queued behind it on its connection says
 * enough replicas have it; one WAIT per batch of writes.  And what the
 * handshake learns for it: the eviction policy, whether WAITAOF works.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_redis_op.h"


/* the handshake steps of every node: INFO memory, the WAITAOF check */
#define NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_STEPS  2

/* fills steps, returns how many */
ngx_uint_t ngx_http_idempotency_redis_wait_steps(
    ngx_http_idempotency_redis_step_t *steps);

/* a write is being queued on node: a WAIT goes behind this pass's writes */
void ngx_http_idempotency_redis_wait_arm(
    ngx_http_idempotency_redis_node_t *node);

/*
 * The reply to a write that waits: NGX_OK, the op is kept (ACKING) until
 * the WAIT behind it answers; NGX_DECLINED, it is finished now (an error,
 * or a reply that says nothing was written, such as a claim's record).
 */
ngx_int_t ngx_http_idempotency_redis_wait_hold(
    ngx_http_idempotency_redis_op_t *op, redisReply *reply);

/* the op timer of an ACKING op: its WAIT did not answer in time */
void ngx_http_idempotency_redis_wait_expired(
    ngx_http_idempotency_redis_op_t *op);

/* at worker exit */
void ngx_http_idempotency_redis_wait_exit(
    ngx_http_idempotency_redis_node_t *node);


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_H_INCLUDED_ */
