/*
 * The ops layer: one command's life (create, send, timer, reply, finish),
 * the main and the bulk pipeline, and the resends of what was kept.  Uses
 * the topology (rcf->topology: where an op goes, redirects), the parking
 * of ngx_http_idempotency_redis_park.c and the connection layer.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>

#include <sys/ioctl.h>

#include "ngx_http_idempotency_redis_ops.h"
#include "ngx_http_idempotency_redis_topology.h"
#include "ngx_http_idempotency_redis_wait.h"
#include "ngx_http_idempotency_stats.h"


/* room for "*<n>\r\n$<n>\r\nEVALSHA\r\n$<n>\r\n" in front of the sha/text */
#define NGX_HTTP_IDEMPOTENCY_REDIS_PREFIX_LEN                                 \
    (sizeof("*\r\n$\r\nEVALSHA\r\n$\r\n") - 1 + 3 * NGX_INT_T_LEN)

/* redirects (MOVED, ASK) one command follows in a Redis Cluster */
#define NGX_HTTP_IDEMPOTENCY_REDIS_REDIRECTS_MAX  5

/* numkeys, which follows the sha or the script text */
#define NGX_HTTP_IDEMPOTENCY_REDIS_NUMKEYS       "\r\n$1\r\n1\r\n"



/*
 * Commands of at least this many bytes (the store of a large response) go
 * on a second connection of the worker to the same Redis, made when one is
 * first needed ("bulk"): writing them, and Redis reading them, must not
 * hold up the claims of other requests, whose replies would queue behind
 * them on a shared pipeline.  Redis Cluster and Sentinel keep one
 * connection per node.
 */
#ifndef NGX_HTTP_IDEMPOTENCY_REDIS_BULK_MIN
#define NGX_HTTP_IDEMPOTENCY_REDIS_BULK_MIN      (256 * 1024)
#endif

/*
 * A command's reply is due within timeout= plus the time to move every
 * byte queued on its connection up to and including it at this rate: a
 * 60 MB store is not judged by the 1 s meant for a claim.
 */
#define NGX_HTTP_IDEMPOTENCY_REDIS_BULK_RATE     (8 * 1024 * 1024)


static void ngx_http_idempotency_redis_op_timeout_handler(ngx_event_t *ev);
static void ngx_http_idempotency_redis_op_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static void ngx_http_idempotency_redis_op_timer(
    ngx_http_idempotency_redis_op_t *op, size_t len);
static ngx_int_t ngx_http_idempotency_redis_redirect(
    ngx_http_idempotency_redis_op_t *op, redisReply *reply);
static void ngx_http_idempotency_redis_asking_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static ngx_http_idempotency_redis_op_t *ngx_http_idempotency_redis_op_create(
    ngx_http_idempotency_redis_node_t *node,
    const ngx_http_idempotency_redis_cmd_t *cmd, ngx_uint_t script,
    ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log);
static ngx_int_t ngx_http_idempotency_redis_op_send(
    ngx_http_idempotency_redis_op_t *op);
static void ngx_http_idempotency_redis_resend_parked(
    ngx_http_idempotency_redis_node_t *node);
static void ngx_http_idempotency_redis_reroute(
    ngx_http_idempotency_redis_node_t *node);
static u_char *ngx_http_idempotency_redis_frame(
    ngx_http_idempotency_redis_op_t *op, ngx_uint_t eval, size_t *len);
static u_char *ngx_http_idempotency_redis_bulk(u_char *p, ngx_str_t *s);


/* what the connection layer tells this layer of every node */

static const ngx_http_idempotency_redis_upcalls_t
    ngx_http_idempotency_redis_upcalls = {
    ngx_http_idempotency_redis_resend_parked,
    ngx_http_idempotency_redis_park_exit,
    ngx_http_idempotency_redis_reroute,
    ngx_http_idempotency_redis_unhold
};


void
ngx_http_idempotency_redis_ops_init(void)
{
    ngx_http_idempotency_redis_node_init(&ngx_http_idempotency_redis_upcalls);
}


ngx_http_idempotency_redis_op_t *
ngx_http_idempotency_redis_op_run(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_http_idempotency_redis_node_t *node,
    const ngx_http_idempotency_redis_cmd_t *cmd, ngx_uint_t script,
    ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log)
{
    ngx_http_idempotency_redis_op_t  *op;

    /*
     * While the node's address is being asked (a worker's first connect
     * behind Sentinel or with "resolve", after a reload too) the op waits
     * for the connection, as it would behind a handshake
     */

    if (node && node->ac == NULL && node->placing && !node->exiting) {
        op = ngx_http_idempotency_redis_op_create(node, cmd, script, key,
                                                  args, nargs, handler, data,
                                                  log);
        if (op) {
            ngx_http_idempotency_redis_hold(op);
        }

        return op;
    }

    /* fail fast while there is no connection and none in progress */

    if (node == NULL || node->ac == NULL || node->exiting) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, log, 0,
                       "idempotency redis: \"%V\" not connected",
                       node ? &node->name : &rcf->host);
        return NULL;
    }

    /* hiredis refuses commands then; e.g. from an op failed by its EOF */

    if (node->ac->c.flags & (REDIS_DISCONNECTING | REDIS_FREEING)) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, log, 0,
                       "idempotency redis: \"%V\" is disconnecting",
                       &node->name);
        return NULL;
    }

    op = ngx_http_idempotency_redis_op_create(node, cmd, script, key, args,
                                              nargs, handler, data, log);
    if (op == NULL) {
        return NULL;
    }

    if (ngx_http_idempotency_redis_op_send(op) != NGX_OK) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, log, 0,
                       "idempotency redis: \"%V\" refused a command",
                       &node->name);
        ngx_free(op);
        return NULL;
    }

    return op;
}


ngx_http_idempotency_redis_op_t *
ngx_http_idempotency_redis_op_retry(ngx_http_idempotency_redis_node_t *node,
    const ngx_http_idempotency_redis_cmd_t *cmd, ngx_uint_t script,
    ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs, ngx_msec_t deadline,
    ngx_http_idempotency_redis_pt handler, void *data,
    ngx_http_idempotency_redis_batch_t *batch, ngx_log_t *log)
{
    const char                       *reason;
    ngx_http_idempotency_redis_op_t  *op;

    if (node == NULL || node->exiting) {
        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, log, 0,
                       "idempotency redis: not available");
        return NULL;
    }

    op = ngx_http_idempotency_redis_op_create(node, cmd, script, key, args,
                                              nargs, handler, data, log);
    if (op == NULL) {
        return NULL;
    }

    op->retry = 1;
    op->deadline = deadline;
    op->batch = batch;

    /*
     * With a connection, even one still being set up, the command is
     * queued behind the handshake; past the deadline too: Redis judges
     * the claim then (the owner check).  Without one it is parked now.
     */

    if (ngx_http_idempotency_redis_op_send(op) == NGX_OK) {
        return op;
    }

    reason = ngx_http_idempotency_redis_park(op, "not connected", 0);

    if (reason) {
        /* the handler is never called from inside this function */
        ngx_http_idempotency_redis_doom(op, reason);
    }

    return op;
}


static ngx_http_idempotency_redis_op_t *
ngx_http_idempotency_redis_op_create(ngx_http_idempotency_redis_node_t *node,
    const ngx_http_idempotency_redis_cmd_t *cmd, ngx_uint_t script,
    ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log)
{
    u_char                           *p;
    size_t                            reserve, size;
    ngx_uint_t                        i;
    ngx_http_idempotency_redis_op_t  *op;

    /*
     * One allocation: the op, room for the longest header (EVAL with the
     * script text), then key and args RESP-encoded once.  The tail stays
     * until the op is done, so that a NOSCRIPT can be resent as EVAL and a
     * retryable op can be resent after a reconnect, without copying.
     */

    reserve = NGX_HTTP_IDEMPOTENCY_REDIS_PREFIX_LEN
              + (cmd->script ? cmd->script->len : cmd->len)
              + sizeof(NGX_HTTP_IDEMPOTENCY_REDIS_NUMKEYS) - 1;

    size = sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN + key->len;

    for (i = 0; i < nargs; i++) {
        size += sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN + args[i].len;
    }

    size += sizeof(ngx_http_idempotency_redis_op_t) + reserve;

    op = ngx_alloc(size, log);
    if (op == NULL) {
        return NULL;
    }

    ngx_memzero(op, sizeof(ngx_http_idempotency_redis_op_t));

    op->node = node;
    op->handler = handler;
    op->data = data;
    op->cmd = cmd;
    op->size = size;
    op->info.script = script;
    op->nargs = nargs;
    op->tail = (u_char *) &op[1] + reserve;

    p = ngx_http_idempotency_redis_bulk(op->tail, key);

    op->info.key.len = key->len;
    op->info.key.data = p - (sizeof("\r\n") - 1) - key->len;

    if (data == NULL) {
        op->data = &op->info;
    }

    for (i = 0; i < nargs; i++) {
        p = ngx_http_idempotency_redis_bulk(p, &args[i]);

        if (i == 0) {
            op->info.arg.len = args[0].len;
            op->info.arg.data = p - (sizeof("\r\n") - 1) - args[0].len;
        }
    }

    op->tail_len = p - op->tail;

    op->timer.handler = ngx_http_idempotency_redis_op_timeout_handler;
    op->timer.data = op;
    op->timer.log = node->log;

    return op;
}


/*
 * Hands the command to hiredis (EVALSHA, or the native command).
 * NGX_DECLINED: no connection to send it on; NGX_ERROR: hiredis refused it.
 * Either way the op is where it was.  On REDIS_ERR hiredis keeps no
 * callback.
 */

static ngx_int_t
ngx_http_idempotency_redis_op_send(ngx_http_idempotency_redis_op_t *op)
{
    u_char                             *start;
    size_t                              len;
    redisAsyncContext                  *ac;
    ngx_http_idempotency_redis_node_t  *node;

    node = op->node;
    ac = node->ac;

    if (ac == NULL || node->exiting
        || (ac->c.flags & (REDIS_DISCONNECTING | REDIS_FREEING)))
    {
        return NGX_DECLINED;
    }

    start = ngx_http_idempotency_redis_frame(op, 0, &len);

    if (op->cmd->wait == NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_ALWAYS
        && node->conf->wait)
    {
        ngx_http_idempotency_redis_wait_arm(node);
    }

    if (redisAsyncFormattedCommand(ac, ngx_http_idempotency_redis_op_reply,
                                   op, (const char *) start, len)
        != REDIS_OK)
    {
        return NGX_ERROR;
    }

    op->state = NGX_HTTP_IDEMPOTENCY_REDIS_OP_SENT;
    op->sent = ngx_http_idempotency_stat_command();
    op->eval = 0;
    op->asking = 0;
    op->timed_out = 0;
    op->info.attempts++;

    node->pending++;

    if (op->timer.timer_set) {
        ngx_del_timer(&op->timer);
    }

    op->timer.cancelable = 0;
    ngx_http_idempotency_redis_op_timer(op, len);

    ngx_log_debug6(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" %s queued, "
                   "op:%p, %uz bytes, attempt %ui, %ui pending",
                   &node->name,
                   op->cmd->name,
                   op, len, op->info.attempts, node->pending);

    return NGX_OK;
}


void
ngx_http_idempotency_redis_cancel(ngx_http_idempotency_redis_op_t *op)
{
    ngx_http_idempotency_redis_node_t  *node;

    if (op == NULL) {
        return;
    }

    node = op->node;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, op->node->log, 0,
                   "idempotency redis: \"%V\" op:%p cancelled, state:%d",
                   &op->node->name, op, (int) op->state);

    op->handler = NULL;
    op->data = NULL;

    if (op->timer.timer_set) {
        ngx_del_timer(&op->timer);
    }

    ngx_http_idempotency_redis_unkeep(op);

    switch (op->state) {

    case NGX_HTTP_IDEMPOTENCY_REDIS_OP_PARKED:
        ngx_http_idempotency_redis_unpark(op);
        ngx_free(op);
        break;

    case NGX_HTTP_IDEMPOTENCY_REDIS_OP_DOOMED:
    case NGX_HTTP_IDEMPOTENCY_REDIS_OP_ACKING:
        ngx_queue_remove(&op->queue);
        ngx_free(op);
        break;

    default:
        /* hiredis still holds it: freed when its reply or teardown comes */
        break;
    }

    ngx_http_idempotency_redis_drained(node);
}


ngx_uint_t
ngx_http_idempotency_redis_connections(ngx_array_t *redis,
    ngx_http_idempotency_redis_conn_t *out, ngx_uint_t n)
{
    ngx_uint_t                           i, j, count;
    ngx_http_idempotency_redis_conf_t  **rcfp;
    ngx_http_idempotency_redis_node_t   *node;

    if (redis == NULL || redis->nelts == 0) {
        return 0;
    }

    rcfp = redis->elts;
    count = 0;

    for (i = 0; i < redis->nelts; i++) {

        /* every topology lists its nodes, a NULL after the last */

        for (j = 0;
             (node = rcfp[i]->topology->node_at(rcfp[i], j)) != NULL;
             j++)
        {
            if (count < n) {
                out[count].name = &node->name;
                out[count].bulk = node->bulk;
                out[count].ready =
                          (node->state == NGX_HTTP_IDEMPOTENCY_REDIS_READY);
                out[count].in_flight = node->pending;
                out[count].in_flight_bytes = node->queued;
                out[count].commands = node->queued_seq;
                out[count].stats = node->stats;
                out[count].policy.data = node->policy;
                out[count].policy.len = node->policy_len;
            }

            count++;
        }
    }

    return count;
}


/*
 * The op timer.  SENT: no reply in time.  Replies come in order, so every
 * command behind this one is late too: the connection counts as broken and
 * is replaced.  While it is still being set up, the connect timer judges it
 * instead, and only this op gives up (a retryable one waits on).  PARKED:
 * the deadline, or the time for another try after a transient error.
 * DOOMED: the handler of an op given up when it was made.
 */

static void
ngx_http_idempotency_redis_op_timeout_handler(ngx_event_t *ev)
{
    int                                 unread;
    void                               *data;
    ngx_msec_int_t                      left;
    ngx_http_idempotency_redis_op_t    *op;
    ngx_http_idempotency_redis_node_t  *node;
    ngx_http_idempotency_redis_pt       handler;

    op = ev->data;
    node = op->node;

    if (op->state == NGX_HTTP_IDEMPOTENCY_REDIS_OP_DOOMED) {
        ngx_http_idempotency_redis_give_up(op, op->info.reason);
        return;
    }

    if (op->state == NGX_HTTP_IDEMPOTENCY_REDIS_OP_ACKING) {
        ngx_http_idempotency_redis_wait_expired(op);
        return;
    }

    if (op->state == NGX_HTTP_IDEMPOTENCY_REDIS_OP_PARKED) {
        left = (ngx_msec_int_t) (op->deadline - ngx_current_msec);

        if (left <= 0) {
            ngx_http_idempotency_redis_give_up(op, "its deadline passed");
            return;
        }

        if (node->state == NGX_HTTP_IDEMPOTENCY_REDIS_READY
            && ngx_http_idempotency_redis_op_send(op) == NGX_OK)
        {
            node->stats.retried += !op->held;
            ngx_http_idempotency_redis_unpark(op);
            return;
        }

        /* not connected: sent when it is, or given up at the deadline */

        ngx_add_timer(&op->timer, (ngx_msec_t) left);
        return;
    }

    /*
     * A command's time runs from when it is written: one still in the
     * output buffer (the worker was busy, e.g. copying a large record)
     * waits on.  Replies come in order: while those ahead of this one (a
     * large record, say) are still arriving, or replies wait unread in the
     * socket, the connection is alive and this one is only queued behind
     * them.
     */

    if (node->state == NGX_HTTP_IDEMPOTENCY_REDIS_READY
        && node->ac
        && (op->seq > node->flushed_seq
            || (ngx_msec_t) (ngx_current_msec - node->last_read)
               < node->conf->timeout
            || (ioctl(node->ac->c.fd, FIONREAD, &unread) == 0
                && unread > 0)))
    {
        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, node->log, 0,
                       "idempotency redis: \"%V\" op:%p waits behind "
                       "replies still arriving", &node->name, op);

        ngx_add_timer(&op->timer, node->conf->timeout);
        return;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" op:%p timed out, state:%d",
                   &node->name, op, (int) node->state);

    ngx_http_idempotency_stat_inc(NGX_HTTP_IDEMPOTENCY_STAT_REDIS_TIMEOUTS);

    if (op->retry && op->handler) {

        if (node->state == NGX_HTTP_IDEMPOTENCY_REDIS_READY) {
            op->timed_out = 1;

            /*
             * hiredis calls back every pending op at once, this one too:
             * it is parked there (or given up, and freed)
             */

            ngx_http_idempotency_redis_node_drop(node, "command failed",
                                            "no reply in time");
            return;
        }

        ngx_add_timer(&op->timer, node->conf->timeout);
        return;
    }

    handler = op->handler;
    data = op->data;

    /* the op stays with hiredis; a late reply finds no handler */

    op->handler = NULL;
    op->data = NULL;

    if (node->state == NGX_HTTP_IDEMPOTENCY_REDIS_READY) {

        /* may free op: it is not touched below */

        ngx_http_idempotency_redis_node_drop(node, "command failed",
                                        "no reply in time");
    }

    if (handler) {
        handler(data, NULL, NGX_HTTP_IDEMPOTENCY_REDIS_TIMEOUT);
    }
}


/* hiredis calls this exactly once per queued command */

static void
ngx_http_idempotency_redis_op_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    redisReply                       *reply = r;
    u_char                           *start;
    size_t                            len;
    const char                       *error;
    ngx_http_idempotency_redis_op_t  *op = privdata;

    if (reply == NULL) {
        /* the context goes away: connection lost, dropped or exiting */
        ngx_http_idempotency_redis_node_lost(op->node, ac, "connection lost");

        if (op->retry && op->handler) {
            error = op->timed_out ? "no reply in time" : "connection lost";
            ngx_http_idempotency_redis_op_detach(op);
            ngx_http_idempotency_redis_retry_or_give_up(op, error, 0);
            return;
        }

        ngx_http_idempotency_redis_op_finish(op, NULL,
                                            NGX_HTTP_IDEMPOTENCY_REDIS_ERROR);
        return;
    }

    ngx_http_idempotency_stat_reply(reply, op->sent);

    if (op->handler
        && reply->type == REDIS_REPLY_ERROR
        && op->node->conf->topology->redirect
        && ngx_http_idempotency_redis_redirect(op, reply) == NGX_OK)
    {
        return;
    }

    if (op->handler
        && !op->eval
        && reply->type == REDIS_REPLY_ERROR
        && reply->len >= sizeof("NOSCRIPT") - 1
        && ngx_strncmp(reply->str, "NOSCRIPT", sizeof("NOSCRIPT") - 1) == 0)
    {
        /* the script cache was flushed: send the text, same key and args */

        start = ngx_http_idempotency_redis_frame(op, 1, &len);

        /* ASKING lets only the one command after it in */

        if (op->asking) {
            (void) redisAsyncCommand(ac,
                                     ngx_http_idempotency_redis_asking_reply,
                                     NULL, "ASKING");
        }

        if (redisAsyncFormattedCommand(ac, ngx_http_idempotency_redis_op_reply,
                                       op, (const char *) start, len)
            == REDIS_OK)
        {
            op->eval = 1;
            op->sent = ngx_http_idempotency_stat_command();

            /* a new command at the end of the pipeline: a new deadline */
            op->node->queued -= op->wire;
            ngx_http_idempotency_redis_op_timer(op, len);

            ngx_log_debug3(NGX_LOG_DEBUG_HTTP, op->node->log, 0,
                           "idempotency redis: \"%V\" op:%p NOSCRIPT, "
                           "resent as EVAL, %uz bytes",
                           &op->node->name, op, len);
            return;
        }

        /* only refused while the connection goes away */

        if (op->retry) {
            ngx_http_idempotency_redis_op_detach(op);
            ngx_http_idempotency_redis_retry_or_give_up(op, "connection lost",
                                                        0);
            return;
        }

        ngx_http_idempotency_redis_op_finish(op, NULL,
                                            NGX_HTTP_IDEMPOTENCY_REDIS_ERROR);
        return;
    }

    /*
     * A server that stopped being the master (a failover): the connection
     * is dropped (the next one asks the sentinels, or resolves the name
     * again, or finds the same server a master again), and a retryable op
     * waits for it; another op gets the error, as when a connection breaks
     */

    if (op->node->conf->topology->demoted
        && reply->type == REDIS_REPLY_ERROR)
    {
        error = op->node->conf->topology->demoted(reply);

        if (error) {
            ngx_http_idempotency_redis_node_drop(op->node, "command failed",
                                            error);

            if (op->retry && op->handler) {
                ngx_http_idempotency_redis_op_detach(op);
                ngx_http_idempotency_redis_retry_or_give_up(op, error, 0);
                return;
            }
        }
    }

    if (op->retry && op->handler && reply->type == REDIS_REPLY_ERROR) {
        error = ngx_http_idempotency_redis_transient(reply);

        if (error) {
            /* the connection is fine: try again after a back-off */

            ngx_http_idempotency_redis_op_detach(op);
            ngx_http_idempotency_redis_retry_or_give_up(op, error,
                             ngx_min(NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MIN
                                     << ngx_min(op->info.parked, 5),
                                     NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MAX));
            return;
        }
    }

    /* a write that counts once replicas have it (wait_replicas=) */

    if (op->handler
        && op->cmd->wait
        && op->node->conf->wait
        && ngx_http_idempotency_redis_wait_hold(op, reply) == NGX_OK)
    {
        return;
    }

    ngx_http_idempotency_redis_op_finish(op, reply,
                                         NGX_HTTP_IDEMPOTENCY_REDIS_OK);
}


/*
 * A large command goes on the bulk connection of its Redis, connected now
 * if it is not; with "ready", only if that connection can take it at once
 * (a plain command fails fast without a connection: it uses the first one
 * then).  With wait_replicas= a small one goes there too while a WAIT
 * holds the first connection and none the bulk one: Redis reads nothing
 * more of a connection whose WAIT waits, so the two take turns and a
 * command (a replay among them) need not wait behind another pass's
 * acknowledgement.
 */

size_t
ngx_http_idempotency_redis_args_size(ngx_str_t *args, ngx_uint_t nargs)
{
    size_t      size;
    ngx_uint_t  i;

    size = 0;

    for (i = 0; i < nargs; i++) {
        size += args[i].len;
    }

    return size;
}


ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_redis_route(ngx_http_idempotency_redis_node_t *node,
    size_t size, ngx_uint_t ready)
{
    ngx_http_idempotency_redis_node_t  *bulk;

    if (node == NULL || node->conf->bulk == NULL
        || node != node->conf->node)
    {
        return node;
    }

    bulk = node->conf->bulk;

    if (size < NGX_HTTP_IDEMPOTENCY_REDIS_BULK_MIN) {

        if (node->waits
            && bulk->waits == 0
            && bulk->queued < NGX_HTTP_IDEMPOTENCY_REDIS_BULK_MIN
            && !bulk->exiting
            && bulk->state == NGX_HTTP_IDEMPOTENCY_REDIS_READY
            && bulk->ac)
        {
            return bulk;
        }

        return node;
    }

    if (bulk->exiting) {
        return node;
    }

    ngx_http_idempotency_redis_node_connect(bulk);

    if (ready
        && (bulk->state != NGX_HTTP_IDEMPOTENCY_REDIS_READY
            || bulk->ac == NULL))
    {
        return node;
    }

    return bulk;
}


/* arms the command timer of an op just queued with "len" bytes */

static void
ngx_http_idempotency_redis_op_timer(ngx_http_idempotency_redis_op_t *op,
    size_t len)
{
    ngx_msec_t                          extra;
    ngx_http_idempotency_redis_node_t  *node;

    node = op->node;

    op->wire = len;
    op->seq = ++node->queued_seq;
    node->queued += len;

    if (len >= NGX_HTTP_IDEMPOTENCY_REDIS_BULK_MIN) {
        /* copying a large command took a while: time it from now */
        ngx_time_update();
    }

    extra = (ngx_msec_t) (node->queued
                          / (NGX_HTTP_IDEMPOTENCY_REDIS_BULK_RATE / 1000));

    /* with wait_replicas=, a command may queue behind a WAIT that waits */

    ngx_add_timer(&op->timer, node->conf->timeout + extra
                              + (node->conf->wait ? node->conf->wait_timeout
                                                  : 0));

    ngx_http_idempotency_redis_node_extend(node, extra);
}


/* where a command for this record key goes */

ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_redis_pick(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *key)
{
    return rcf->topology->pick(rcf, key);
}


/*
 * A Redis Cluster node answered MOVED or ASK: the op goes to the node named
 * there, at the end of its pipeline, with a new command timeout (after
 * ASKING for an ASK).  NGX_DECLINED: not a redirect, or one too many; the
 * reply then goes to the handler as any error reply.
 */

static ngx_int_t
ngx_http_idempotency_redis_redirect(ngx_http_idempotency_redis_op_t *op,
    redisReply *reply)
{
    ngx_uint_t                          asking;
    redisAsyncContext                  *ac;
    ngx_http_idempotency_redis_node_t  *node;

    node = op->node->conf->topology->redirect(op->node, reply, &asking);
    if (node == NULL) {
        return NGX_DECLINED;
    }

    if (op->redirects == NGX_HTTP_IDEMPOTENCY_REDIS_REDIRECTS_MAX) {
        ngx_log_error(NGX_LOG_ERR, op->node->log, 0,
                      "idempotency redis: \"%V\" %s of key_hash=%s not "
                      "redirected again after %ui redirects: \"%*s\"",
                      &op->node->name,
                      op->cmd->name,
                      ngx_http_idempotency_key_hash(&op->info.key),
                      op->redirects, (size_t) reply->len, reply->str);
        return NGX_DECLINED;
    }

    op->redirects++;

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, op->node->log, 0,
                   "idempotency redis: \"%V\" op:%p \"%*s\"",
                   &op->node->name, op, (size_t) reply->len, reply->str);

    ngx_http_idempotency_redis_op_detach(op);

    /* counted where it was parked first; it is not kept there any more */
    ngx_http_idempotency_redis_unkeep(op);

    op->node = node;
    op->timer.log = node->log;

    ac = ngx_http_idempotency_redis_node_context(node);

    if (asking && ac) {
        (void) redisAsyncCommand(ac, ngx_http_idempotency_redis_asking_reply,
                                 NULL, "ASKING");
    }

    if (ngx_http_idempotency_redis_op_send(op) == NGX_OK) {
        op->asking = asking ? 1 : 0;
        return NGX_OK;
    }

    if (op->retry) {
        ngx_http_idempotency_redis_retry_or_give_up(op, "not connected", 0);
        return NGX_OK;
    }

    /* op_send left it NEW: finish counts it out of the new node */

    node->pending++;
    ngx_http_idempotency_redis_op_finish(op, NULL,
                                         NGX_HTTP_IDEMPOTENCY_REDIS_ERROR);
    return NGX_OK;
}


/* ASKING answers OK; the command after it tells the rest */

static void
ngx_http_idempotency_redis_asking_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    redisReply                         *reply = r;
    ngx_http_idempotency_redis_node_t  *node;

    node = ac->data;

    if (reply && reply->type == REDIS_REPLY_ERROR) {
        /* e.g. NOPERM: the ACL user lacks "+asking" */
        ngx_log_error(NGX_LOG_ERR, node->log, 0,
                      "idempotency redis: \"%V\" ASKING failed: %*s",
                      &node->name, (size_t) reply->len, reply->str);
    }
}


/*
 * Redis Cluster: the slot map changed.  Parked ops whose record now lives
 * on another master (after a failover, the old one may never come back)
 * move there: sent now if it has a connection, else parked there.
 */

static void
ngx_http_idempotency_redis_reroute(ngx_http_idempotency_redis_node_t *node)
{
    const char                         *reason;
    ngx_queue_t                        *q, *next;
    ngx_http_idempotency_redis_op_t    *op;
    ngx_http_idempotency_redis_node_t  *target;

    for (q = ngx_queue_head(&node->parked);
         q != ngx_queue_sentinel(&node->parked);
         q = next)
    {
        next = ngx_queue_next(q);
        op = ngx_queue_data(q, ngx_http_idempotency_redis_op_t, queue);

        target = node->conf->topology->owner(node->conf, &op->info.key);

        if (target == NULL || target == node || target->exiting) {
            continue;
        }

        ngx_log_debug3(NGX_LOG_DEBUG_HTTP, node->log, 0,
                       "idempotency redis: \"%V\" op:%p moves to \"%V\"",
                       &node->name, op, &target->name);

        ngx_http_idempotency_redis_unpark(op);
        ngx_http_idempotency_redis_unkeep(op);

        if (op->timer.timer_set) {
            ngx_del_timer(&op->timer);
        }

        op->state = NGX_HTTP_IDEMPOTENCY_REDIS_OP_NEW;
        op->node = target;
        op->timer.log = target->log;

        if (ngx_http_idempotency_redis_op_send(op) == NGX_OK) {
            target->stats.retried += !op->held;
            continue;
        }

        /* the handler may park new ops here: "next" is still in the queue */

        reason = op->held ? "not connected"
                          : ngx_http_idempotency_redis_park(op, op->info.error
                                                       ? op->info.error
                                                       : "not connected", 0);
        if (reason) {
            ngx_http_idempotency_redis_give_up(op, reason);
        }
    }
}


/* the op's hiredis callback has come: hiredis holds it no more */

void
ngx_http_idempotency_redis_op_detach(ngx_http_idempotency_redis_op_t *op)
{
    if (op->timer.timer_set) {
        ngx_del_timer(&op->timer);
    }

    if (op->state == NGX_HTTP_IDEMPOTENCY_REDIS_OP_ACKING) {
        /* hiredis is done with it: taken out of pending before */
        ngx_queue_remove(&op->queue);
        op->state = NGX_HTTP_IDEMPOTENCY_REDIS_OP_NEW;
        return;
    }

    op->node->pending--;
    op->node->queued -= op->wire;
    op->wire = 0;
    op->state = NGX_HTTP_IDEMPOTENCY_REDIS_OP_NEW;
}


void
ngx_http_idempotency_redis_op_finish(ngx_http_idempotency_redis_op_t *op,
    redisReply *reply, ngx_uint_t rc)
{
    ngx_http_idempotency_redis_pt       handler;
    ngx_http_idempotency_redis_node_t  *node;

    node = op->node;

    ngx_http_idempotency_redis_op_detach(op);

    handler = op->handler;
    op->handler = NULL;

    if (handler && !node->exiting) {
        ngx_log_debug5(NGX_LOG_DEBUG_HTTP, node->log, 0,
                       "idempotency redis: \"%V\" op:%p rc:%ui, "
                       "reply type:%d, %ui pending",
                       &node->name, op, rc, reply ? reply->type : -1,
                       node->pending);

        /* may send new commands and cancel other ops; not this one */
        handler(op->data, reply, rc);

    } else {
        ngx_log_debug3(NGX_LOG_DEBUG_HTTP, node->log, 0,
                       "idempotency redis: \"%V\" op:%p %s, dropped",
                       &node->name, op,
                       reply ? "late reply" : "no reply");
    }

    ngx_http_idempotency_redis_unkeep(op);
    ngx_free(op);

    ngx_http_idempotency_redis_drained(node);
}


static void
ngx_http_idempotency_redis_resend_parked(
    ngx_http_idempotency_redis_node_t *node)
{
    ngx_queue_t                      *q;
    ngx_http_idempotency_redis_op_t  *op;

    while (!ngx_queue_empty(&node->parked)) {
        q = ngx_queue_head(&node->parked);
        op = ngx_queue_data(q, ngx_http_idempotency_redis_op_t, queue);

        /* not sent: stays parked until the next READY or its deadline */

        if (ngx_http_idempotency_redis_op_send(op) != NGX_OK) {
            break;
        }

        node->stats.retried += !op->held;
        ngx_http_idempotency_redis_unpark(op);
    }
}


/*
 * Puts "*N EVALSHA <sha> 1", "*N EVAL <text> 1" or, for the claim, "*N SET"
 * right in front of the encoded key and args, so the whole command is one
 * contiguous buffer.  The claim is its script on a node whose server has
 * no "SET ... NX GET", and on one still in its handshake (queued behind
 * it, before its HELLO is answered: the script works on every server):
 * decided at each send, since the node's server may have changed (a
 * failover, a reconnect) since the op was made.
 */

static u_char *
ngx_http_idempotency_redis_frame(ngx_http_idempotency_redis_op_t *op,
    ngx_uint_t eval, size_t *len)
{
    u_char                                  *p, *start;
    size_t                                   n, blen;
    const char                              *cmd;
    const u_char                            *body;
    const ngx_http_idempotency_redis_cmd_t  *s;
    u_char             pre[NGX_HTTP_IDEMPOTENCY_REDIS_PREFIX_LEN];

    s = op->cmd;

    if (s->script
        && !(op->node->state == NGX_HTTP_IDEMPOTENCY_REDIS_READY
             && op->node->set_nx_get))
    {
        s = s->script;
    }

    if (s->text == NULL) {
        p = ngx_sprintf(pre, "*%ui\r\n$%uz\r\n%s\r\n", op->nargs + 2,
                        ngx_strlen(s->native), s->native);
        n = p - pre;
        start = op->tail - n;
        ngx_memcpy(start, pre, n);
        *len = n + op->tail_len;
        return start;
    }

    if (eval) {
        cmd = "EVAL";
        body = (const u_char *) s->text;
        blen = s->len;

    } else {
        cmd = "EVALSHA";
        body = s->sha;
        blen = sizeof(s->sha);
    }

    p = ngx_sprintf(pre, "*%ui\r\n$%uz\r\n%s\r\n$%uz\r\n",
                    op->nargs + 4, ngx_strlen(cmd), cmd, blen);

    n = (p - pre) + blen + sizeof(NGX_HTTP_IDEMPOTENCY_REDIS_NUMKEYS) - 1;

    start = op->tail - n;

    p = ngx_cpymem(start, pre, p - pre);
    p = ngx_cpymem(p, body, blen);
    ngx_memcpy(p, NGX_HTTP_IDEMPOTENCY_REDIS_NUMKEYS,
               sizeof(NGX_HTTP_IDEMPOTENCY_REDIS_NUMKEYS) - 1);

    *len = n + op->tail_len;

    return start;
}


/* "$<len>\r\n<bytes>\r\n"; the length written by hand: on every command */

static u_char *
ngx_http_idempotency_redis_bulk(u_char *p, ngx_str_t *s)
{
    size_t  n, len;
    u_char  digits[NGX_SIZE_T_LEN];

    len = s->len;
    n = 0;

    do {
        digits[n++] = (u_char) ('0' + len % 10);
        len /= 10;
    } while (len);

    *p++ = '$';

    while (n) {
        *p++ = digits[--n];
    }

    *p++ = CR;
    *p++ = LF;

    if (s->len) {
        p = ngx_cpymem(p, s->data, s->len);
    }

    *p++ = CR;
    *p++ = LF;

    return p;
}


