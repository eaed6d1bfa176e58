/*
 * The ops layer's acknowledgements (wait_replicas=, wait_aof).  A claim, a
 * store or a renewal counts only once enough replicas hold it.  Redis'
 * WAIT covers every earlier write of its connection, so the writes queued
 * on a node in one pass of the event loop get one WAIT behind them (a
 * posted event queues it after the pass's commands); while a WAIT is on
 * its way, the writes queued meanwhile get the next one when it answers
 * (group commit: the batch is whatever came during one WAIT's round
 * trip).  The pipeline goes on, and a worker with many claims in flight
 * sends one WAIT per batch, not one per claim.  A write's reply is kept
 * (ACKING) until the WAIT behind it answers: enough, the op's handler
 * gets the reply; too few in wait_timeout, a plain op (the claim) fails
 * as if Redis were down, a retryable one (a store) is parked and sent
 * again.  Replies come in order: when a WAIT answers, every ACKING op
 * queued before it (by the node's sequence) has had its reply.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_redis_ops.h"
#include "ngx_http_idempotency_redis_wait.h"
#include "ngx_http_idempotency_stats.h"


/*
 * One WAIT on its way: which node, since when (for the histogram), and
 * the node's last command queued before it: the ops it acknowledges
 */
typedef struct {
    ngx_http_idempotency_redis_node_t   *node;
    uint64_t                             start;
    uint64_t                             seq;
} ngx_http_idempotency_redis_wait_t;


static void ngx_http_idempotency_redis_wait_posted(ngx_event_t *ev);
static void ngx_http_idempotency_redis_wait_send(
    ngx_http_idempotency_redis_node_t *node);
static void ngx_http_idempotency_redis_wait_format(
    ngx_http_idempotency_redis_node_t *node);
static void ngx_http_idempotency_redis_wait_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static ngx_int_t ngx_http_idempotency_redis_wait_count(
    ngx_http_idempotency_redis_node_t *node, redisReply *reply,
    const char **error);
static void ngx_http_idempotency_redis_wait_done(
    ngx_http_idempotency_redis_node_t *node, uint64_t seq, const char *error,
    ngx_uint_t lost);
static const char *ngx_http_idempotency_redis_policy_check(
    ngx_http_idempotency_redis_node_t *node, redisReply *reply,
    ngx_http_idempotency_redis_step_t *step);
static const char *ngx_http_idempotency_redis_aof_check(
    ngx_http_idempotency_redis_node_t *node, redisReply *reply,
    ngx_http_idempotency_redis_step_t *step);
static ngx_uint_t ngx_http_idempotency_redis_aof_wanted(
    ngx_http_idempotency_redis_node_t *node);


ngx_uint_t
ngx_http_idempotency_redis_wait_steps(ngx_http_idempotency_redis_step_t *steps)
{
    /*
     * INFO memory: the eviction policy, readable where CONFIG is not; a
     * refusal (an ACL user without +info) leaves it unknown
     */

    steps[0].what = "INFO memory failed";
    steps[0].argc = 2;
    steps[0].argv[0] = "INFO";
    steps[0].argvlen[0] = sizeof("INFO") - 1;
    steps[0].argv[1] = "memory";
    steps[0].argvlen[1] = sizeof("memory") - 1;
    steps[0].check = ngx_http_idempotency_redis_policy_check;
    steps[0].data = NULL;
    steps[0].wanted = NULL;

    /*
     * wait_aof: "WAITAOF 1 0 100" is an error where there is no WAITAOF
     * (before Redis 7.2) or no AOF (appendonly no): the connection is of
     * no use then, claims are answered as with Redis down
     */

    steps[1].what = "wait_aof cannot be used";
    steps[1].argc = 4;
    steps[1].argv[0] = "WAITAOF";
    steps[1].argvlen[0] = sizeof("WAITAOF") - 1;
    steps[1].argv[1] = "1";
    steps[1].argvlen[1] = 1;
    steps[1].argv[2] = "0";
    steps[1].argvlen[2] = 1;
    steps[1].argv[3] = "100";
    steps[1].argvlen[3] = sizeof("100") - 1;
    steps[1].check = ngx_http_idempotency_redis_aof_check;
    steps[1].data = NULL;
    steps[1].wanted = ngx_http_idempotency_redis_aof_wanted;

    return NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_STEPS;
}


void
ngx_http_idempotency_redis_wait_arm(ngx_http_idempotency_redis_node_t *node)
{
    ngx_event_t  *ev;

    ev = &node->wait_event;

    if (node->waits) {
        /* the WAIT on its way does not cover it: the next one will */
        node->wait_due = 1;
        return;
    }

    if (ev->posted || node->exiting) {
        return;
    }

    ev->handler = ngx_http_idempotency_redis_wait_posted;
    ev->data = node;
    ev->log = node->log;

    /*
     * Posted before the command is handed to hiredis, so before the node's
     * own write event: the WAIT leaves in the same write(2) as the batch
     */

    ngx_post_event(ev, &ngx_posted_events);
}


static void
ngx_http_idempotency_redis_wait_posted(ngx_event_t *ev)
{
    ngx_http_idempotency_redis_node_t  *node;

    node = ev->data;

    /* one was sent meanwhile (the one before answered): next time then */

    if (node->waits) {
        if (node->wait_seq < node->queued_seq) {
            node->wait_due = 1;
        }

        return;
    }

    ngx_http_idempotency_redis_wait_send(node);
}


static void
ngx_http_idempotency_redis_wait_send(ngx_http_idempotency_redis_node_t *node)
{
    redisAsyncContext                  *ac;
    ngx_http_idempotency_redis_wait_t  *w;

    ac = node->ac;
    node->wait_due = 0;

    if (ac == NULL || node->exiting
        || (ac->c.flags & (REDIS_DISCONNECTING | REDIS_FREEING)))
    {
        /* the writes of this pass fail with their connection */
        return;
    }

    if (node->wait_cmd_len == 0) {
        ngx_http_idempotency_redis_wait_format(node);
    }

    w = ngx_alloc(sizeof(ngx_http_idempotency_redis_wait_t), node->log);
    if (w == NULL) {
        ngx_http_idempotency_redis_node_drop(node, "WAIT failed",
                                             "no memory");
        return;
    }

    w->node = node;
    w->seq = node->queued_seq;
    node->wait_seq = w->seq;

    if (redisAsyncFormattedCommand(ac, ngx_http_idempotency_redis_wait_reply,
                                   w, (const char *) node->wait_cmd,
                                   node->wait_cmd_len)
        != REDIS_OK)
    {
        ngx_free(w);
        ngx_http_idempotency_redis_node_drop(node, "WAIT failed",
                                             "not queued");
        return;
    }

    w->start = ngx_http_idempotency_stat_wait_start();
    node->waits++;

    /*
     * Redis holds every later command of the connection until the WAIT
     * answers: it leaves at the end of this pass of the event loop, not
     * after the next one
     */

    ngx_http_idempotency_redis_node_flush(node);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" WAIT queued, %ui waiting",
                   &node->name, node->waits);
}


/*
 * The node's WAIT (or WAITAOF 1) in Redis' wire format, written once: it
 * never changes, and hiredis' own formatting of it per batch cost more
 * than the rest of sending it
 */

static void
ngx_http_idempotency_redis_wait_format(ngx_http_idempotency_redis_node_t *node)
{
    u_char  *p, *last, n[NGX_INT_T_LEN], t[NGX_INT_T_LEN];
    size_t   nlen, tlen;

    nlen = ngx_sprintf(n, "%ui", node->conf->wait_replicas) - n;
    tlen = ngx_sprintf(t, "%M", node->conf->wait_timeout) - t;

    p = node->wait_cmd;
    last = p + sizeof(node->wait_cmd);

    if (node->conf->wait_aof) {
        p = ngx_slprintf(p, last, "*4\r\n$7\r\nWAITAOF\r\n$1\r\n1\r\n");

    } else {
        p = ngx_slprintf(p, last, "*3\r\n$4\r\nWAIT\r\n");
    }

    p = ngx_slprintf(p, last, "$%uz\r\n%*s\r\n$%uz\r\n%*s\r\n",
                     nlen, nlen, n, tlen, tlen, t);

    node->wait_cmd_len = p - node->wait_cmd;
}


ngx_int_t
ngx_http_idempotency_redis_wait_hold(ngx_http_idempotency_redis_op_t *op,
    redisReply *reply)
{
    ngx_http_idempotency_redis_node_t  *node;

    node = op->node;

    /*
     * What a write of the module answers: nil (a claim made), an integer
     * (a store, a renewal), OK (a chunk).  A string (the record a claim
     * found: nothing was written) and an error are told at once.
     */

    switch (reply->type) {

    case REDIS_REPLY_NIL:
    case REDIS_REPLY_INTEGER:
        break;

    case REDIS_REPLY_STATUS:
        if (reply->len > sizeof(op->ack_str)) {
            return NGX_DECLINED;
        }

        ngx_memcpy(op->ack_str, reply->str, reply->len);
        break;

    default:
        return NGX_DECLINED;
    }

    op->ack_type = reply->type;
    op->ack_integer = reply->integer;
    op->ack_len = (reply->type == REDIS_REPLY_STATUS) ? reply->len : 0;

    /* no longer with hiredis: out of pending, into acking */

    node->pending--;
    node->queued -= op->wire;
    op->wire = 0;
    op->state = NGX_HTTP_IDEMPOTENCY_REDIS_OP_ACKING;
    ngx_queue_insert_tail(&node->acking, &op->queue);

    if (op->timer.timer_set) {
        ngx_del_timer(&op->timer);
    }

    op->timer.cancelable = 0;
    ngx_add_timer(&op->timer, node->conf->wait_timeout + node->conf->timeout);

    /*
     * No WAIT queued behind it yet (a claim, or a resend as EVAL): one
     * goes at the end of this pass, or when the one on its way answers
     */

    if (op->seq > node->wait_seq) {
        ngx_http_idempotency_redis_wait_arm(node);
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" op:%p waits for replicas",
                   &node->name, op);

    return NGX_OK;
}


static void
ngx_http_idempotency_redis_wait_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    redisReply                         *reply = r;
    const char                         *error;
    uint64_t                            seq;
    ngx_http_idempotency_redis_wait_t  *w = privdata;
    ngx_http_idempotency_redis_node_t  *node;

    node = w->node;
    seq = w->seq;

    if (node->waits) {
        node->waits--;
    }

    if (reply == NULL) {
        ngx_free(w);
        ngx_http_idempotency_redis_node_lost(node, ac, "connection lost");
        ngx_http_idempotency_redis_wait_done(node, (uint64_t) -1,
                                             "connection lost", 1);
        return;
    }

    ngx_http_idempotency_stat_wait_done(w->start);
    ngx_free(w);

    error = NULL;
    (void) ngx_http_idempotency_redis_wait_count(node, reply, &error);

    ngx_http_idempotency_redis_wait_done(node, seq, error, 0);

    /* the writes queued while this one was on its way: the next batch */

    if (node->waits == 0
        && (node->wait_due || !ngx_queue_empty(&node->acking))
        && node->ac == ac)
    {
        ngx_http_idempotency_redis_wait_send(node);
    }
}


/* NGX_OK: enough acknowledgements; else *error says what is short */

static ngx_int_t
ngx_http_idempotency_redis_wait_count(ngx_http_idempotency_redis_node_t *node,
    redisReply *reply, const char **error)
{
    long long  local, replicas;

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, node->log, 0,
                      "idempotency redis: \"%V\" %s failed: %*s",
                      &node->name,
                      node->conf->wait_aof ? "WAITAOF" : "WAIT",
                      (size_t) reply->len, reply->str);
        *error = "WAIT failed";
        return NGX_ERROR;
    }

    local = 1;

    if (reply->type == REDIS_REPLY_INTEGER) {
        replicas = reply->integer;

    } else if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2
               && reply->element[0]->type == REDIS_REPLY_INTEGER
               && reply->element[1]->type == REDIS_REPLY_INTEGER)
    {
        local = reply->element[0]->integer;
        replicas = reply->element[1]->integer;

    } else {
        *error = "unexpected reply to WAIT";
        return NGX_ERROR;
    }

    if (local >= 1
        && replicas >= (long long) node->conf->wait_replicas)
    {
        return NGX_OK;
    }

    ngx_log_error(NGX_LOG_WARN, node->log, 0,
                  "idempotency redis: \"%V\" %s: %L of %ui replicas%s "
                  "acknowledged the writes within wait_timeout=%M",
                  &node->name,
                  node->conf->wait_aof ? "WAITAOF" : "WAIT",
                  replicas, node->conf->wait_replicas,
                  local >= 1 ? "" : " (and not the master's AOF)",
                  node->conf->wait_timeout);

    *error = "too few replicas acknowledged";
    return NGX_DECLINED;
}


/*
 * Every ACKING op of the node queued up to "seq" is told: its reply when
 * error is NULL, else
 * a claim fails as on a lost connection and a store is kept for a retry
 * (at the next connection when "lost", else after a back-off).
 */

static void
ngx_http_idempotency_redis_wait_done(ngx_http_idempotency_redis_node_t *node,
    uint64_t seq, const char *error, ngx_uint_t lost)
{
    ngx_msec_t                        retry;
    ngx_queue_t                       done, *q, *next;
    redisReply                        reply;
    ngx_http_idempotency_redis_op_t  *op;

    /*
     * The ops it answers go to a queue of their own first: a handler may
     * cancel another of them (taken out of whichever queue it is in)
     */

    ngx_queue_init(&done);

    for (q = ngx_queue_head(&node->acking);
         q != ngx_queue_sentinel(&node->acking);
         q = next)
    {
        next = ngx_queue_next(q);
        op = ngx_queue_data(q, ngx_http_idempotency_redis_op_t, queue);

        if (op->seq <= seq) {
            ngx_queue_remove(q);
            ngx_queue_insert_tail(&done, q);
        }
    }

    while (!ngx_queue_empty(&done)) {
        q = ngx_queue_head(&done);
        op = ngx_queue_data(q, ngx_http_idempotency_redis_op_t, queue);

        if (error == NULL) {
            ngx_memzero(&reply, sizeof(redisReply));
            reply.type = op->ack_type;
            reply.integer = op->ack_integer;
            reply.len = op->ack_len;
            reply.str = (char *) op->ack_str;

            ngx_http_idempotency_stat_inc(
                                   NGX_HTTP_IDEMPOTENCY_STAT_REDIS_WAITED);

            /* out of acking, handler called, freed */
            ngx_http_idempotency_redis_op_finish(op, &reply,
                                            NGX_HTTP_IDEMPOTENCY_REDIS_OK);
            continue;
        }

        if (op->retry && op->handler) {
            ngx_http_idempotency_stat_inc(
                             NGX_HTTP_IDEMPOTENCY_STAT_REDIS_WAIT_RESENT);

            /* after a lost connection at the next one, else backing off */

            retry = lost ? 0
                    : ngx_min(NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MIN
                              << ngx_min(op->info.parked, 5),
                              NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MAX);

            ngx_http_idempotency_redis_op_detach(op);
            ngx_http_idempotency_redis_retry_or_give_up(op, error, retry);
            continue;
        }

        if (op->handler) {
            ngx_http_idempotency_stat_inc(
                             NGX_HTTP_IDEMPOTENCY_STAT_REDIS_WAIT_REFUSED);
        }

        ngx_http_idempotency_redis_op_finish(op, NULL,
                                            NGX_HTTP_IDEMPOTENCY_REDIS_ERROR);
    }
}


void
ngx_http_idempotency_redis_wait_expired(ngx_http_idempotency_redis_op_t *op)
{
    ngx_http_idempotency_redis_node_t  *node;

    node = op->node;

    ngx_http_idempotency_stat_inc(NGX_HTTP_IDEMPOTENCY_STAT_REDIS_TIMEOUTS);

    /*
     * The WAIT is overdue by timeout=: the connection counts as broken,
     * as for any late reply; its WAIT's teardown tells the ACKING ops
     */

    if (node->ac) {
        ngx_http_idempotency_redis_node_drop(node, "WAIT failed",
                                             "no reply in time");
    }

    ngx_http_idempotency_redis_wait_done(node, (uint64_t) -1,
                                         "no reply in time", 1);
}


void
ngx_http_idempotency_redis_wait_exit(ngx_http_idempotency_redis_node_t *node)
{
    if (node->wait_event.posted) {
        ngx_delete_posted_event(&node->wait_event);
    }

    node->wait_due = 0;

    ngx_http_idempotency_redis_wait_done(node, (uint64_t) -1,
                                         "the worker is exiting", 1);
}


static ngx_uint_t
ngx_http_idempotency_redis_aof_wanted(ngx_http_idempotency_redis_node_t *node)
{
    return node->conf->wait_aof;
}


static const char *
ngx_http_idempotency_redis_aof_check(ngx_http_idempotency_redis_node_t *node,
    redisReply *reply, ngx_http_idempotency_redis_step_t *step)
{
    if (reply->type != REDIS_REPLY_ERROR) {
        return NULL;
    }

    if (ngx_strlcasestrn((u_char *) reply->str,
                         (u_char *) reply->str + reply->len,
                         (u_char *) "unknown command",
                         sizeof("unknown command") - 2)
        != NULL)
    {
        return "the server has no WAITAOF (Redis 7.2 or newer, Valkey 8); "
               "claims are refused until it has";
    }

    if (ngx_strlcasestrn((u_char *) reply->str,
                         (u_char *) reply->str + reply->len,
                         (u_char *) "appendonly",
                         sizeof("appendonly") - 2)
        != NULL)
    {
        return "the server's AOF is off (appendonly no); claims are "
               "refused until it is on";
    }

    return reply->str;
}


/*
 * "maxmemory_policy:<policy>" of INFO memory.  A policy that may evict a
 * key with a TTL (volatile-*, allkeys-*) may drop an in-flight claim or a
 * record under memory pressure, and the operation then runs again: said
 * once per worker and node each time the policy is seen to change.
 */

static const char *
ngx_http_idempotency_redis_policy_check(ngx_http_idempotency_redis_node_t *node,
    redisReply *reply, ngx_http_idempotency_redis_step_t *step)
{
    u_char  *p, *last, *end;
    size_t   len;

    if (reply->type != REDIS_REPLY_STRING) {
        /* refused (an ACL without +info): unknown, no reason to drop */
        node->policy_len = 0;
        return NULL;
    }

    p = (u_char *) reply->str;
    end = p + reply->len;

    p = ngx_strlcasestrn(p, end, (u_char *) "maxmemory_policy:",
                         sizeof("maxmemory_policy:") - 2);
    if (p == NULL) {
        node->policy_len = 0;
        return NULL;
    }

    p += sizeof("maxmemory_policy:") - 1;

    for (last = p; last < end && *last != CR && *last != LF; last++) {
        /* void */
    }

    len = ngx_min((size_t) (last - p), sizeof(node->policy));

    if (len == node->policy_len && ngx_strncmp(p, node->policy, len) == 0) {
        return NULL;
    }

    ngx_memcpy(node->policy, p, len);
    node->policy_len = len;

    if (ngx_strncmp(p, "volatile-", sizeof("volatile-") - 1) == 0
        || ngx_strncmp(p, "allkeys-", sizeof("allkeys-") - 1) == 0)
    {
        ngx_log_error(NGX_LOG_WARN, node->log, 0,
                      "idempotency redis: \"%V\" has maxmemory-policy %*s: "
                      "under memory pressure it may evict an in-flight "
                      "claim or a stored record, and a retry then runs the "
                      "operation again; \"noeviction\" keeps them",
                      &node->name, len, p);
    }

    return NULL;
}
