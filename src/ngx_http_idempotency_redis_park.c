/*
 * The ops layer's parking: retryable ops kept in the worker while Redis
 * cannot take them, the worker's retry buffer, giving up.  Uses the
 * connection layer's node (its queues and counters) and nothing else of
 * the Redis layers.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_redis_park.h"
#include "ngx_http_idempotency_redis_wait.h"
#include "ngx_http_idempotency_stats.h"


/*
 * Retryable ops kept in a worker while Redis cannot be reached ("parked"):
 * at most this many bytes in all (each op counts its whole allocation: the
 * command with the captured response).  Over it, an op is given up at once:
 * an outage must not let a worker grow without bound.  64 MiB holds 64
 * responses at the default idempotency_max_response_size of 1m, thousands of
 * typical API responses.  Documented in docs/behaviour.md, section 8.
 */
#ifndef NGX_HTTP_IDEMPOTENCY_REDIS_PARKED_MAX
#define NGX_HTTP_IDEMPOTENCY_REDIS_PARKED_MAX    (64 * 1024 * 1024)
#endif


static void ngx_http_idempotency_redis_uncount(
    ngx_http_idempotency_redis_op_t *op);
static ngx_http_idempotency_redis_op_t *ngx_http_idempotency_redis_pop(
    ngx_queue_t *queue);


/* error replies after which the same command is worth sending again */
typedef struct {
    ngx_str_t                            code;
    const char                          *text;
} ngx_http_idempotency_redis_transient_t;


/* bytes of all parked ops of this worker, against the PARKED_MAX cap */
static size_t  ngx_http_idempotency_redis_parked_bytes;


static ngx_http_idempotency_redis_transient_t
    ngx_http_idempotency_redis_transients[] = {

    { ngx_string("LOADING"), "Redis is loading its data set" },
    { ngx_string("BUSY"), "Redis is busy running a script" },
    { ngx_string("TRYAGAIN"), "Redis asked to try again" },
    { ngx_string("MASTERDOWN"), "Redis lost its master" },
    { ngx_string("CLUSTERDOWN"), "the Redis cluster is down" },
    { ngx_string("NOREPLICAS"), "Redis has too few replicas to write" },
    /* maxmemory with noeviction: room comes back as records expire */
    { ngx_string("OOM"), "Redis is out of memory (maxmemory)" },
    { ngx_null_string, NULL }
};


void
ngx_http_idempotency_redis_retry_or_give_up(
    ngx_http_idempotency_redis_op_t *op, const char *error, ngx_msec_t retry)
{
    const char  *reason;

    reason = ngx_http_idempotency_redis_park(op, error, retry);

    if (reason) {
        ngx_http_idempotency_redis_give_up(op, reason);
    }
}


/*
 * Keeps a retryable op (not with hiredis) for another try: at the next
 * READY of the connection, or after "retry" ms if that is not 0.  Returns
 * NULL, or why it cannot be kept.
 */

const char *
ngx_http_idempotency_redis_park(ngx_http_idempotency_redis_op_t *op,
    const char *error, ngx_msec_t retry)
{
    size_t                                max, size;
    ngx_str_t                            *key;
    const char                           *name, *reason;
    ngx_msec_int_t                        left;
    ngx_http_idempotency_redis_node_t    *node;
    ngx_http_idempotency_redis_batch_t   *u;

    node = op->node;
    op->info.error = error;

    /*
     * A chunk of a split record's body stands for the record: the whole
     * body waits for Redis, and the lines name the record's store
     */

    u = op->batch;

    if (u) {
        u->info.error = error;
        u->info.attempts = op->info.attempts;
        size = u->charged ? 0 : u->size;
        name = u->name;
        key = &u->info.key;

    } else {
        size = op->size;
        name = op->cmd->name;
        key = &op->info.key;
    }

    left = (ngx_msec_int_t) (op->deadline - ngx_current_msec);
    max = NGX_HTTP_IDEMPOTENCY_REDIS_PARKED_MAX;

    if (node->exiting) {
        reason = "the worker is exiting";

    } else if (left <= 0) {
        reason = "its deadline passed";

    } else if (size
               > max - ngx_min(max, ngx_http_idempotency_redis_parked_bytes))
    {
        ngx_log_error(NGX_LOG_ERR, node->log, 0,
                      "idempotency redis: \"%V\" cannot keep the %s of "
                      "key_hash=%s (%uz bytes) for a retry: commands kept "
                      "for a retry may use at most %uz bytes (%uz MiB) per "
                      "worker, %uz are in use (%ui here)",
                      &node->name, name, ngx_http_idempotency_key_hash(key),
                      size, max, max >> 20,
                      ngx_http_idempotency_redis_parked_bytes,
                      node->stats.parked);

        reason = "the worker's retry buffer is full";

    } else {
        reason = NULL;
    }

    if (reason) {
        if (u) {
            u->why = reason;
        }

        return reason;
    }

    if (u && !u->charged) {
        u->charged = 1;
        u->info.parked++;
        ngx_http_idempotency_redis_parked_bytes += u->size;
    }

    op->info.parked++;

    if (!op->kept) {
        op->kept = 1;
        node->kept++;
    }

    /* once per command, also when a reshard moved it to another node */

    if (!op->counted) {
        op->counted = 1;
        ngx_http_idempotency_stat_inc(NGX_HTTP_IDEMPOTENCY_STAT_REDIS_PARKED);
    }

    if (u ? size != 0 : op->info.parked == 1) {
        ngx_log_error(NGX_LOG_WARN, node->log, 0,
                      "idempotency redis: \"%V\" %s of key_hash=%s failed "
                      "(%s), kept for a retry for up to %M ms",
                      &node->name, name, ngx_http_idempotency_key_hash(key),
                      error, (ngx_msec_t) left);

    } else {
        ngx_log_debug5(NGX_LOG_DEBUG_HTTP, node->log, 0,
                       "idempotency redis: \"%V\" op:%p failed (%s), "
                       "parked again, %M ms left, attempt %ui",
                       &node->name, op, error, (ngx_msec_t) left,
                       op->info.attempts);
    }

    op->state = NGX_HTTP_IDEMPOTENCY_REDIS_OP_PARKED;
    ngx_queue_insert_tail(&node->parked, &op->queue);

    node->stats.parked++;
    node->stats.parked_bytes += op->size;

    if (u == NULL) {
        ngx_http_idempotency_redis_parked_bytes += op->size;
    }

    if (op->timer.timer_set) {
        ngx_del_timer(&op->timer);
    }

    /* a graceful shutdown does not wait for these: see exit_process */

    op->timer.cancelable = 1;
    ngx_add_timer(&op->timer, (retry && retry < (ngx_msec_t) left)
                              ? retry : (ngx_msec_t) left);

    return NULL;
}


void
ngx_http_idempotency_redis_hold(ngx_http_idempotency_redis_op_t *op)
{
    ngx_http_idempotency_redis_node_t  *node;

    node = op->node;

    op->held = 1;
    op->deadline = ngx_current_msec + node->conf->timeout;
    op->state = NGX_HTTP_IDEMPOTENCY_REDIS_OP_PARKED;
    ngx_queue_insert_tail(&node->parked, &op->queue);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" op:%p waits for the address",
                   &node->name, op);

    /* a new op, no timer yet; a graceful shutdown does not wait for it */

    op->timer.cancelable = 1;
    ngx_add_timer(&op->timer, node->conf->timeout);
}


void
ngx_http_idempotency_redis_unhold(ngx_http_idempotency_redis_node_t *node,
    const char *reason)
{
    ngx_queue_t                      *q, *next;
    ngx_http_idempotency_redis_op_t  *op;

    for (q = ngx_queue_head(&node->parked);
         q != ngx_queue_sentinel(&node->parked);
         q = next)
    {
        next = ngx_queue_next(q);
        op = ngx_queue_data(q, ngx_http_idempotency_redis_op_t, queue);

        if (!op->held) {
            continue;
        }

        ngx_queue_remove(&op->queue);

        if (op->timer.timer_set) {
            ngx_del_timer(&op->timer);
        }

        op->info.error = reason;
        ngx_http_idempotency_redis_doom(op,
                                        "the connection it waited for failed");
    }
}


void
ngx_http_idempotency_redis_doom(ngx_http_idempotency_redis_op_t *op,
    const char *reason)
{
    op->info.reason = reason;
    op->state = NGX_HTTP_IDEMPOTENCY_REDIS_OP_DOOMED;
    ngx_queue_insert_tail(&op->node->doomed, &op->queue);

    op->timer.cancelable = 0;
    ngx_add_timer(&op->timer, 0);
}


/* takes a PARKED op out of the queue and the counters; its state is kept */

void
ngx_http_idempotency_redis_unpark(ngx_http_idempotency_redis_op_t *op)
{
    ngx_queue_remove(&op->queue);
    ngx_http_idempotency_redis_uncount(op);
}


/* a parked op leaves the counters */

static void
ngx_http_idempotency_redis_uncount(ngx_http_idempotency_redis_op_t *op)
{
    ngx_http_idempotency_redis_node_t  *node;

    if (op->held) {
        return;
    }

    node = op->node;

    node->stats.parked--;
    node->stats.parked_bytes -= op->size;

    if (op->batch == NULL) {
        ngx_http_idempotency_redis_parked_bytes -= op->size;
    }
}


/* an op that was parked is done (replied, given up or cancelled) */

void
ngx_http_idempotency_redis_unkeep(ngx_http_idempotency_redis_op_t *op)
{
    if (!op->kept) {
        return;
    }

    op->kept = 0;

    if (--op->node->kept == 0) {
        op->node->drained = 1;
    }
}


/*
 * Once every op that had to be kept for a retry is done (called after the
 * handler, so its line comes first): the counters, at notice level.
 */

void
ngx_http_idempotency_redis_drained(ngx_http_idempotency_redis_node_t *node)
{
    if (!node->drained || node->kept) {
        return;
    }

    node->drained = 0;

    ngx_log_error(NGX_LOG_NOTICE, node->log, 0,
                  "idempotency redis: \"%V\" every command kept for a "
                  "retry is settled: %ui parked, %uz bytes; %ui resent, "
                  "%ui given up since the worker started",
                  &node->name, node->stats.parked,
                  node->stats.parked_bytes, node->stats.retried,
                  node->stats.given_up);
}


/* a retryable op that is not with hiredis: its handler gets ERROR */

void
ngx_http_idempotency_redis_give_up(ngx_http_idempotency_redis_op_t *op,
    const char *reason)
{
    ngx_http_idempotency_redis_pt         handler;
    ngx_http_idempotency_redis_node_t    *node;
    ngx_http_idempotency_redis_batch_t   *u;

    node = op->node;

    /* a held op was never kept for a retry: its handler tells the rest */

    if (!op->held) {
        node->stats.given_up++;
        ngx_http_idempotency_stat_inc(
                                  NGX_HTTP_IDEMPOTENCY_STAT_REDIS_GIVEN_UP);
    }

    if (op->state == NGX_HTTP_IDEMPOTENCY_REDIS_OP_PARKED) {
        ngx_http_idempotency_redis_unpark(op);

    } else if (op->state == NGX_HTTP_IDEMPOTENCY_REDIS_OP_DOOMED) {
        ngx_queue_remove(&op->queue);
    }

    op->state = NGX_HTTP_IDEMPOTENCY_REDIS_OP_NEW;

    if (op->timer.timer_set) {
        ngx_del_timer(&op->timer);
    }

    op->info.reason = reason;

    u = op->batch;

    if (u) {
        u->why = reason;
        u->info.attempts = op->info.attempts;
    }

    ngx_log_debug5(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" op:%p given up: %s (%s), "
                   "after %ui attempts",
                   &node->name, op, reason,
                   op->info.error ? op->info.error : "-",
                   op->info.attempts);

    handler = op->handler;
    op->handler = NULL;

    if (handler) {
        handler(op->data, NULL,
                (op->held && op->info.attempts == 0)
                ? NGX_HTTP_IDEMPOTENCY_REDIS_UNSENT
                : NGX_HTTP_IDEMPOTENCY_REDIS_ERROR);
    }

    ngx_http_idempotency_redis_unkeep(op);
    ngx_free(op);

    ngx_http_idempotency_redis_drained(node);
}


/* the connection is ready again: parked ops go first, in order */

const char *
ngx_http_idempotency_redis_transient(redisReply *reply)
{
    size_t                                   len;
    ngx_http_idempotency_redis_transient_t  *t;

    /* the error code is the first word of the reply */

    for (len = 0; len < reply->len && reply->str[len] != ' '; len++) {
        /* void */
    }

    for (t = ngx_http_idempotency_redis_transients; t->text; t++) {
        if (len == t->code.len
            && ngx_strncmp(reply->str, t->code.data, len) == 0)
        {
            return t->text;
        }
    }

    return NULL;
}



void
ngx_http_idempotency_redis_batch_uncharge(
    ngx_http_idempotency_redis_batch_t *batch)
{
    if (batch->charged) {
        batch->charged = 0;
        ngx_http_idempotency_redis_parked_bytes -= batch->size;
    }
}


void
ngx_http_idempotency_redis_park_exit(ngx_http_idempotency_redis_node_t *node)
{
    ngx_http_idempotency_redis_op_t  *op;

    /* written, waiting for replicas: a store is given up below */

    ngx_http_idempotency_redis_wait_exit(node);

    /* each is taken out of its queue first: give_up() frees it */

    while ((op = ngx_http_idempotency_redis_pop(&node->parked))) {
        ngx_http_idempotency_redis_uncount(op);
        ngx_http_idempotency_redis_give_up(op, "the worker is exiting");
    }

    while ((op = ngx_http_idempotency_redis_pop(&node->doomed))) {
        ngx_http_idempotency_redis_give_up(op, op->info.reason);
    }
}


/*
 * The first op of a queue, taken out of it and NEW, or NULL.  The sentinel
 * is moved on by hand, as ngx_queue_remove() would: clang's analyzer then
 * sees that the next round gets another op.
 */

static ngx_http_idempotency_redis_op_t *
ngx_http_idempotency_redis_pop(ngx_queue_t *queue)
{
    ngx_queue_t                      *q;
    ngx_http_idempotency_redis_op_t  *op;

    if (ngx_queue_empty(queue)) {
        return NULL;
    }

    q = ngx_queue_head(queue);

    queue->next = q->next;
    q->next->prev = queue;

    op = ngx_queue_data(q, ngx_http_idempotency_redis_op_t, queue);
    op->state = NGX_HTTP_IDEMPOTENCY_REDIS_OP_NEW;

    return op;
}
