/*
 * Waiting duplicates (idempotency_wait).  A waiter marks its record in
 * Redis (a small key in the record's slot) and then claims again; the
 * store or release of a marked record publishes the key's hash on
 * "<prefix>done" (src/lua/wake.lua) once, however many wait.  Worker 0 of
 * each node listens there (redis_sub.c) and writes what it hears into a
 * ring in shared memory; every worker that has waiters reads the ring
 * every few milliseconds and wakes the waiters of those keys, which claim
 * again and so find the replay (or the released claim).  A slow poll
 * stays as the fallback for a message lost (a listener reconnecting, a
 * failover); while no listener is up, waiters poll as they always did.
 * HTTP side, below the claim: the claim's settle step tells it of a store
 * or release, and a woken waiter claims again through the function the
 * handler gave it (ngx_http_idempotency_wait_start()), not by name.
 */

#include "ngx_http_idempotency_conf.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_scope.h"
#include "ngx_http_idempotency_stats.h"
#include "ngx_http_idempotency_wait.h"


/* no listener: the steps of the poll, doubling from MIN to MAX */
#define NGX_HTTP_IDEMPOTENCY_WAIT_STEP_MIN  20
#define NGX_HTTP_IDEMPOTENCY_WAIT_STEP_MAX  500

/* how often a worker with waiters reads the ring */
#define NGX_HTTP_IDEMPOTENCY_WAIT_CHECK     3

/* messages kept in the ring; more between two reads: every waiter wakes */
#define NGX_HTTP_IDEMPOTENCY_WAIT_RING      512

/* split stores of a worker whose wake waits for their reply, at most */
#define NGX_HTTP_IDEMPOTENCY_WAIT_PENDING   256

#define NGX_HTTP_IDEMPOTENCY_WAIT_HASH      NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN

/* what woke a waiter */
#define NGX_HTTP_IDEMPOTENCY_WAIT_NOTIFIED  1
#define NGX_HTTP_IDEMPOTENCY_WAIT_POLLED    2


typedef struct {
    ngx_uint_t                 seq;       /* messages written, ever */
    ngx_pid_t                  listener;  /* worker 0 that listens */
    ngx_uint_t                 up;        /* its subscriptions up now */
    ngx_uint_t                 want;      /* and in all */
    u_char                     hash[NGX_HTTP_IDEMPOTENCY_WAIT_RING]
                                   [NGX_HTTP_IDEMPOTENCY_WAIT_HASH];
} ngx_http_idempotency_wait_sh_t;


/*
 * A waiting request, in its pool; in the worker's queue from its first
 * wait until its claim finds something else than the claim in flight
 */
typedef struct ngx_http_idempotency_waiter_s  ngx_http_idempotency_waiter_t;

struct ngx_http_idempotency_waiter_s {
    ngx_queue_t                queue;
    ngx_http_idempotency_ctx_t *ctx;
    ngx_http_idempotency_wait_pt again;  /* claims again when woken */
    ngx_str_t                  mark;     /* its key; empty: none */
    u_char                     hash[NGX_HTTP_IDEMPOTENCY_WAIT_HASH];
    unsigned                   queued:1;
    unsigned                   marked:1;  /* once: then it claims at once */
    unsigned                   slow:1;    /* on the fallback poll */
    unsigned                   woken:2;
    /* its key's message came while its claim was out: claim again */
    unsigned                   missed:1;
};


/* a split store's wake, sent once the store is done (wait_settled) */
typedef struct {
    ngx_queue_t                          queue;
    ngx_http_idempotency_redis_conf_t   *rcf;
    ngx_str_t                            key;      /* follows */
} ngx_http_idempotency_wait_pending_t;


static ngx_int_t ngx_http_idempotency_wait_init_zone(
    ngx_shm_zone_t *shm_zone, void *data);
static ngx_uint_t ngx_http_idempotency_wait_listened(void);
static void ngx_http_idempotency_wait_handler(ngx_event_t *ev);
static void ngx_http_idempotency_wait_mark(ngx_http_idempotency_ctx_t *ctx,
    ngx_http_idempotency_waiter_t *w);
static void ngx_http_idempotency_wait_marked(void *data, redisReply *reply,
    ngx_uint_t rc);
static void ngx_http_idempotency_wait_wake_send(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *rkey, ngx_log_t *log);
static void ngx_http_idempotency_wait_sub_handler(void *data,
    ngx_uint_t event, ngx_str_t *msg);
static void ngx_http_idempotency_wait_check_handler(ngx_event_t *ev);
static void ngx_http_idempotency_wait_check(void);
static void ngx_http_idempotency_wait_wake(ngx_http_idempotency_waiter_t *w,
    ngx_uint_t how);


static ngx_str_t  ngx_http_idempotency_wait_zone_name =
    ngx_string("ngx_http_idempotency_wait");

/* this worker's view of the zone (NULL: no location waits) */
static ngx_slab_pool_t                  *ngx_http_idempotency_wait_shpool;
static ngx_http_idempotency_wait_sh_t   *ngx_http_idempotency_wait_sh;

/* duplicates of this worker waiting for a timer now */
static ngx_uint_t                        ngx_http_idempotency_waiters;

/* this worker's waiters, its place in the ring, and the timer reading it */
static ngx_queue_t                       ngx_http_idempotency_wait_queue;
static ngx_uint_t                        ngx_http_idempotency_wait_seen;
static ngx_event_t                       ngx_http_idempotency_wait_timer;
static ngx_connection_t                  ngx_http_idempotency_wait_dummy;

/* this worker's split stores, their wake due when they are done */
static ngx_queue_t                       ngx_http_idempotency_wait_pending;
static ngx_uint_t                        ngx_http_idempotency_wait_npending;

/* worker 0's subscriptions */
static ngx_http_idempotency_redis_sub_t **ngx_http_idempotency_wait_subs;
static ngx_uint_t                        ngx_http_idempotency_wait_nsubs;


char *
ngx_http_idempotency_wait_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_str_t       *value, s;
    ngx_msec_t       ms;
    ngx_shm_zone_t  *shm_zone;

    if (ilcf->wait != NGX_CONF_UNSET_MSEC) {
        return "is duplicate";
    }

    value = cf->args->elts;

    ms = ngx_parse_time(&value[1], 0);

    if (ms == (ngx_msec_t) NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid time \"%V\" in \"%V\" directive, "
                           "0 or a positive time is expected", &value[1],
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    ilcf->wait = ms;

    /* one directive: its poll= is not inherited apart from its time */
    ilcf->wait_poll = NGX_HTTP_IDEMPOTENCY_WAIT_POLL;

    if (cf->args->nelts == 3) {
        if (ngx_strncmp(value[2].data, "poll=", 5) != 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\"", &value[2]);
            return NGX_CONF_ERROR;
        }

        s.data = value[2].data + 5;
        s.len = value[2].len - 5;

        ms = ngx_parse_time(&s, 0);

        if (ms == (ngx_msec_t) NGX_ERROR || ms == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid time \"%V\" in \"%V\" directive, "
                               "a positive time is expected", &s,
                               &cmd->name);
            return NGX_CONF_ERROR;
        }

        ilcf->wait_poll = ms;
    }

    if (ilcf->wait == 0) {
        return NGX_CONF_OK;
    }

    /* someone may wait: the node's ring, and worker 0 listens */

    shm_zone = ngx_shared_memory_add(cf, &ngx_http_idempotency_wait_zone_name,
                                     8 * ngx_pagesize
                                     + sizeof(ngx_http_idempotency_wait_sh_t),
                                     &ngx_http_idempotency_wait_zone_name);
    if (shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    shm_zone->init = ngx_http_idempotency_wait_init_zone;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_idempotency_wait_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_slab_pool_t                 *shpool;
    ngx_http_idempotency_wait_sh_t  *sh;

    if (data) {
        /* a reload: the old workers go on using it meanwhile */
        shm_zone->data = data;
        return NGX_OK;
    }

    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    sh = ngx_slab_calloc(shpool, sizeof(ngx_http_idempotency_wait_sh_t));
    if (sh == NULL) {
        return NGX_ERROR;
    }

    shpool->data = sh;
    shm_zone->data = sh;

    return NGX_OK;
}


ngx_int_t
ngx_http_idempotency_wait_init_process(ngx_cycle_t *cycle,
    ngx_array_t *redis)
{
    u_char                              *p;
    ngx_str_t                           *channel;
    ngx_uint_t                           i;
    ngx_list_part_t                     *part;
    ngx_shm_zone_t                      *shm_zone;
    ngx_http_idempotency_redis_conf_t  **rcfp;

    ngx_queue_init(&ngx_http_idempotency_wait_queue);
    ngx_queue_init(&ngx_http_idempotency_wait_pending);
    ngx_http_idempotency_wait_npending = 0;
    ngx_http_idempotency_wait_sh = NULL;
    ngx_http_idempotency_wait_nsubs = 0;

    part = &cycle->shared_memory.part;
    shm_zone = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                return NGX_OK;      /* no location waits */
            }

            part = part->next;
            shm_zone = part->elts;
            i = 0;
        }

        if (shm_zone[i].tag == &ngx_http_idempotency_wait_zone_name) {
            break;
        }
    }

    ngx_http_idempotency_wait_shpool =
                                (ngx_slab_pool_t *) shm_zone[i].shm.addr;
    ngx_http_idempotency_wait_sh = shm_zone[i].data;

    ngx_shmtx_lock(&ngx_http_idempotency_wait_shpool->mutex);
    ngx_http_idempotency_wait_seen = ngx_http_idempotency_wait_sh->seq;
    ngx_shmtx_unlock(&ngx_http_idempotency_wait_shpool->mutex);

    ngx_http_idempotency_wait_timer.handler =
                                   ngx_http_idempotency_wait_check_handler;
    ngx_http_idempotency_wait_timer.log = cycle->log;
    ngx_http_idempotency_wait_timer.cancelable = 1;
    ngx_http_idempotency_wait_dummy.fd = (ngx_socket_t) -1;
    ngx_http_idempotency_wait_timer.data = &ngx_http_idempotency_wait_dummy;

    if ((ngx_process != NGX_PROCESS_WORKER
         && ngx_process != NGX_PROCESS_SINGLE)
        || ngx_worker != 0 || redis == NULL || redis->nelts == 0)
    {
        return NGX_OK;
    }

    ngx_http_idempotency_wait_subs = ngx_pcalloc(cycle->pool,
                             redis->nelts
                             * sizeof(ngx_http_idempotency_redis_sub_t *));
    if (ngx_http_idempotency_wait_subs == NULL) {
        return NGX_ERROR;
    }

    rcfp = redis->elts;

    for (i = 0; i < redis->nelts; i++) {
        channel = ngx_palloc(cycle->pool, sizeof(ngx_str_t));
        p = ngx_pnalloc(cycle->pool, rcfp[i]->prefix.len + sizeof("done"));

        if (channel == NULL || p == NULL) {
            return NGX_ERROR;
        }

        channel->data = p;
        channel->len = ngx_sprintf(p, "%Vdone", &rcfp[i]->prefix) - p;

        ngx_http_idempotency_wait_subs[ngx_http_idempotency_wait_nsubs++]
            = ngx_http_idempotency_redis_subscribe(rcfp[i], channel,
                                       ngx_http_idempotency_wait_sub_handler,
                                       redis, cycle->pool, cycle->log);
    }

    return NGX_OK;
}


void
ngx_http_idempotency_wait_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                            i;
    ngx_queue_t                          *q, *next;
    ngx_http_idempotency_wait_sh_t       *sh;
    ngx_http_idempotency_wait_pending_t  *pw;

    (void) cycle;

    sh = ngx_http_idempotency_wait_sh;

    if (sh == NULL) {
        return;
    }

    /* the split stores' wakes not sent: their waiters' poll is the fallback */

    q = ngx_queue_head(&ngx_http_idempotency_wait_pending);

    while (q != ngx_queue_sentinel(&ngx_http_idempotency_wait_pending)) {
        next = ngx_queue_next(q);
        pw = ngx_queue_data(q, ngx_http_idempotency_wait_pending_t, queue);
        ngx_free(pw);
        q = next;
    }

    ngx_queue_init(&ngx_http_idempotency_wait_pending);
    ngx_http_idempotency_wait_npending = 0;

    if (ngx_http_idempotency_wait_timer.timer_set) {
        ngx_del_timer(&ngx_http_idempotency_wait_timer);
    }

    for (i = 0; i < ngx_http_idempotency_wait_nsubs; i++) {
        ngx_http_idempotency_redis_unsubscribe(
                                          ngx_http_idempotency_wait_subs[i]);
    }

    ngx_http_idempotency_wait_nsubs = 0;

    ngx_shmtx_lock(&ngx_http_idempotency_wait_shpool->mutex);

    if (sh->listener == ngx_pid) {
        sh->listener = 0;
        sh->up = 0;
    }

    ngx_shmtx_unlock(&ngx_http_idempotency_wait_shpool->mutex);
}


/*
 * Whether a notification would reach this node's waiters now: its worker
 * 0 is alive and subscribed on every Redis.
 */

static ngx_uint_t
ngx_http_idempotency_wait_listened(void)
{
    ngx_pid_t                        pid;
    ngx_uint_t                       up;
    ngx_http_idempotency_wait_sh_t  *sh;

    sh = ngx_http_idempotency_wait_sh;

    if (sh == NULL) {
        return 0;
    }

    ngx_shmtx_lock(&ngx_http_idempotency_wait_shpool->mutex);
    pid = sh->listener;
    up = (sh->want && sh->up >= sh->want);
    ngx_shmtx_unlock(&ngx_http_idempotency_wait_shpool->mutex);

    if (pid == 0 || !up) {
        return 0;
    }

    return (pid == ngx_pid || kill(pid, 0) == 0 || errno != ESRCH);
}


ngx_int_t
ngx_http_idempotency_wait_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_http_idempotency_wait_pt again)
{
    size_t                              len;
    ngx_uint_t                          how;
    ngx_msec_t                          step;
    ngx_event_t                        *ev;
    ngx_http_idempotency_waiter_t      *w;
    ngx_http_idempotency_redis_conf_t  *rcf;

    if (ctx->conf->wait == 0) {
        return NGX_DECLINED;
    }

    if (ctx->wait_until == 0) {
        ctx->wait_until = ngx_current_msec + ctx->conf->wait;
        ctx->wait_step = NGX_HTTP_IDEMPOTENCY_WAIT_STEP_MIN;
    }

    if ((ngx_msec_int_t) (ctx->wait_until - ngx_current_msec) <= 0) {
        return NGX_DECLINED;
    }

    /* the number of waiters is bounded */

    if (ngx_http_idempotency_waiters >= NGX_HTTP_IDEMPOTENCY_MAX_WAITERS) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: %d duplicates wait already, "
                      "answering 409 at once",
                      NGX_HTTP_IDEMPOTENCY_MAX_WAITERS);
        return NGX_DECLINED;
    }

    rcf = ctx->conf->redis;

    /* nor can one scope take the worker's slots from the others */

    if (ngx_http_idempotency_scope_wait_enter(ctx->rkey.data
                                              + rcf->prefix.len)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency: %d duplicates of this scope wait "
                      "already, answering 409 at once, key_hash=%s",
                      NGX_HTTP_IDEMPOTENCY_MAX_SCOPE_WAITERS,
                      ngx_http_idempotency_key_hash(&ctx->rkey));
        return NGX_DECLINED;
    }

    w = ctx->waiter;

    if (w == NULL) {
        w = ngx_pcalloc(r->pool, sizeof(ngx_http_idempotency_waiter_t));
        if (w == NULL) {
            ngx_http_idempotency_scope_wait_leave(ctx->rkey.data
                                                  + rcf->prefix.len);
            return NGX_DECLINED;
        }

        w->ctx = ctx;
        ngx_memcpy(w->hash, ngx_http_idempotency_key_hash(&ctx->rkey),
                   NGX_HTTP_IDEMPOTENCY_WAIT_HASH);

        if (ngx_http_idempotency_wait_sh) {
            len = NGX_HTTP_IDEMPOTENCY_REDIS_BODY_KEY_LEN(rcf, ctx->rkey.len,
                                                          sizeof("wait"));
            w->mark.data = ngx_pnalloc(r->pool, len);

            if (w->mark.data
                && ngx_http_idempotency_redis_slot_key(rcf, &ctx->rkey,
                                                       (u_char *) "wait",
                                                       sizeof("wait") - 1,
                                                       &w->mark)
                   != NGX_OK)
            {
                w->mark.len = 0;
            }
        }

        ctx->waiter = w;
    }

    w->again = again;

    /*
     * A listener up and a mark possible: the first time, mark and claim
     * again at once (behind the mark, so that a store between the first
     * claim and the mark is seen); then sleep until a notification or the
     * slow poll.  Else the doubling poll of old.
     */

    w->slow = 0;
    how = 0;

    if (w->missed) {
        step = 0;
        how = NGX_HTTP_IDEMPOTENCY_WAIT_NOTIFIED;
        w->missed = 0;

    } else if (w->mark.len && ngx_http_idempotency_wait_listened()) {
        if (w->marked) {
            step = ctx->conf->wait_poll;
            w->slow = 1;

        } else {
            step = 0;
        }

    } else {
        step = ctx->wait_step;
        ctx->wait_step = ngx_min(ctx->wait_step * 2,
                                 NGX_HTTP_IDEMPOTENCY_WAIT_STEP_MAX);
    }

    step = ngx_min(step, ctx->wait_until - ngx_current_msec);

    ev = &ctx->wait_timer;
    ev->handler = ngx_http_idempotency_wait_handler;
    ev->data = ctx;
    ev->log = r->connection->log;

    ngx_add_timer(ev, step);
    ngx_http_idempotency_waiters++;

    w->woken = how;

    if (!w->queued) {
        ngx_queue_insert_tail(&ngx_http_idempotency_wait_queue, &w->queue);
        w->queued = 1;
    }

    if (ngx_http_idempotency_wait_sh
        && !ngx_http_idempotency_wait_timer.timer_set)
    {
        ngx_add_timer(&ngx_http_idempotency_wait_timer,
                      NGX_HTTP_IDEMPOTENCY_WAIT_CHECK);
    }

    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_WAITING;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "idempotency waits %M ms for the first request%s", step,
                   w->slow ? " or its notification" : "");

    return NGX_AGAIN;
}


/* woken (by its timer, a notification or a poll): it claims again */

static void
ngx_http_idempotency_wait_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_ctx_t     *ctx;
    ngx_http_idempotency_waiter_t  *w;

    ctx = ev->data;
    w = ctx->waiter;

    ngx_http_idempotency_waiters--;
    ngx_http_idempotency_scope_wait_leave(ctx->rkey.data
                                          + ctx->conf->redis->prefix.len);

    if (ctx->state != NGX_HTTP_IDEMPOTENCY_STATE_WAITING) {
        return;
    }

    if (w->woken == 0) {
        w->woken = NGX_HTTP_IDEMPOTENCY_WAIT_POLLED;
    }

    /*
     * The mark goes first, on the same connection: a store after it
     * notifies, one before it is seen by the claim.  A notification took
     * the mark away: it is made again only if the claim is still in
     * flight (a release, and another request claimed it).
     */

    if (w->woken == NGX_HTTP_IDEMPOTENCY_WAIT_NOTIFIED) {
        w->marked = 0;

    } else if (w->mark.len && ngx_http_idempotency_wait_sh) {
        ngx_http_idempotency_wait_mark(ctx, w);
    }

    w->again(ctx->request, ctx);
}


static void
ngx_http_idempotency_wait_mark(ngx_http_idempotency_ctx_t *ctx,
    ngx_http_idempotency_waiter_t *w)
{
    ngx_str_t  args[3];
    u_char     ttl[NGX_INT64_LEN];

    /*
     * It holds the record key's hash (what the logs name the record by)
     * and lives as long as this one may wait; a later waiter renews it.
     */

    args[0].data = w->hash;
    args[0].len = NGX_HTTP_IDEMPOTENCY_WAIT_HASH;
    ngx_str_set(&args[1], "PX");
    args[2].data = ttl;
    args[2].len = ngx_sprintf(ttl, "%M", ctx->conf->wait) - ttl;

    if (ngx_http_idempotency_redis_script(ctx->conf->redis,
                                          NGX_HTTP_IDEMPOTENCY_SCRIPT_WAIT_MARK,
                                          &w->mark, args, 3,
                                          ngx_http_idempotency_wait_marked,
                                          NULL, ctx->request->connection->log)
        != NULL)
    {
        w->marked = 1;
    }
}


/*
 * The reply of a mark or of the wake script: nothing waits for it (the
 * claim behind a mark decides; a waiter's poll is the fallback).  The
 * first argument of both is the record key's hash.
 */

static void
ngx_http_idempotency_wait_marked(void *data, redisReply *reply,
    ngx_uint_t rc)
{
    ngx_http_idempotency_redis_info_t *info = data;

    if (rc != NGX_HTTP_IDEMPOTENCY_REDIS_OK
        || reply->type != REDIS_REPLY_ERROR)
    {
        return;
    }

    if (info->script == NGX_HTTP_IDEMPOTENCY_SCRIPT_WAIT_MARK) {
        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "idempotency: a waiter's mark was refused (%*s), "
                      "key_hash=%V: it learns the outcome by its poll",
                      (size_t) reply->len, reply->str, &info->arg);

    } else {
        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "idempotency: the wake script failed (%*s), "
                      "key_hash=%V: waiters learn the outcome by their poll",
                      (size_t) reply->len, reply->str, &info->arg);
    }
}


void
ngx_http_idempotency_wait_decided(ngx_http_idempotency_ctx_t *ctx)
{
    ngx_http_idempotency_waiter_t  *w;

    w = ctx->waiter;

    if (w == NULL
        || (ctx->redis_rc == NGX_HTTP_IDEMPOTENCY_REDIS_OK
            && ctx->reply_kind == NGX_HTTP_IDEMPOTENCY_CONFLICT))
    {
        return;     /* it waits on (wait_start) */
    }

    if (ctx->redis_rc == NGX_HTTP_IDEMPOTENCY_REDIS_OK && w->woken) {
        ngx_http_idempotency_stat_inc(
                               w->woken == NGX_HTTP_IDEMPOTENCY_WAIT_NOTIFIED
                               ? NGX_HTTP_IDEMPOTENCY_STAT_WAIT_NOTIFIED
                               : NGX_HTTP_IDEMPOTENCY_STAT_WAIT_POLLED);
    }

    w->woken = 0;

    if (w->queued) {
        ngx_queue_remove(&w->queue);
        w->queued = 0;
    }
}


void
ngx_http_idempotency_wait_end(ngx_http_idempotency_ctx_t *ctx)
{
    ngx_http_idempotency_waiter_t  *w;

    w = ctx->waiter;

    if (w && w->queued) {
        ngx_queue_remove(&w->queue);
        w->queued = 0;
    }

    if (ctx->wait_timer.timer_set) {
        ngx_del_timer(&ctx->wait_timer);
        ngx_http_idempotency_waiters--;
        ngx_http_idempotency_scope_wait_leave(
            ctx->rkey.data + ctx->conf->redis->prefix.len);
    }
}


void
ngx_http_idempotency_wait_notify(ngx_http_idempotency_loc_conf_t *ilcf,
    ngx_str_t *rkey, ngx_uint_t script, ngx_str_t *args, ngx_array_t *more,
    ngx_log_t *log)
{
    ngx_http_idempotency_wait_pending_t  *pw;

    if (ilcf->wait == 0 || ngx_http_idempotency_wait_sh == NULL) {
        return;
    }

    /* a store that may be split (args[1], the record, is large) waits */

    if (more == NULL
        && (script != NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE
            || args[1].len < NGX_HTTP_IDEMPOTENCY_REDIS_SPLIT_MIN))
    {
        ngx_http_idempotency_wait_wake_send(ilcf->redis, rkey, log);
        return;
    }

    /* beyond the bound, the waiters' poll is the fallback */

    if (ngx_http_idempotency_wait_npending
        >= NGX_HTTP_IDEMPOTENCY_WAIT_PENDING)
    {
        return;
    }

    pw = ngx_alloc(sizeof(ngx_http_idempotency_wait_pending_t) + rkey->len,
                   log);
    if (pw == NULL) {
        return;
    }

    pw->rcf = ilcf->redis;
    pw->key.data = (u_char *) (pw + 1);
    pw->key.len = rkey->len;
    ngx_memcpy(pw->key.data, rkey->data, rkey->len);

    ngx_queue_insert_tail(&ngx_http_idempotency_wait_pending, &pw->queue);
    ngx_http_idempotency_wait_npending++;
}


void
ngx_http_idempotency_wait_settled(ngx_str_t *rkey)
{
    ngx_queue_t                          *q;
    ngx_http_idempotency_wait_pending_t  *pw;

    if (ngx_http_idempotency_wait_npending == 0) {
        return;
    }

    for (q = ngx_queue_head(&ngx_http_idempotency_wait_pending);
         q != ngx_queue_sentinel(&ngx_http_idempotency_wait_pending);
         q = ngx_queue_next(q))
    {
        pw = ngx_queue_data(q, ngx_http_idempotency_wait_pending_t, queue);

        if (pw->key.len == rkey->len
            && ngx_memcmp(pw->key.data, rkey->data, rkey->len) == 0)
        {
            ngx_queue_remove(q);
            ngx_http_idempotency_wait_npending--;

            ngx_http_idempotency_wait_wake_send(pw->rcf, &pw->key,
                                                ngx_cycle->log);
            ngx_free(pw);
            return;
        }
    }
}


/* the wake script: the mark away and, if there was one, the PUBLISH */

static void
ngx_http_idempotency_wait_wake_send(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *rkey, ngx_log_t *log)
{
    u_char     *p;
    size_t      len;
    ngx_str_t   mark, args[2];

    /* the mark's key, the channel and the message, in one block */

    len = NGX_HTTP_IDEMPOTENCY_REDIS_BODY_KEY_LEN(rcf, rkey->len,
                                                  sizeof("wait"))
          + rcf->prefix.len + sizeof("done");

    p = ngx_alloc(len, log);
    if (p == NULL) {
        return;
    }

    mark.data = p;

    if (ngx_http_idempotency_redis_slot_key(rcf, rkey, (u_char *) "wait",
                                            sizeof("wait") - 1, &mark)
        == NGX_OK)
    {
        args[0].data = ngx_http_idempotency_key_hash(rkey);
        args[0].len = NGX_HTTP_IDEMPOTENCY_WAIT_HASH;
        args[1].data = mark.data + mark.len;
        args[1].len = ngx_sprintf(args[1].data, "%Vdone", &rcf->prefix)
                      - args[1].data;

        /* lost with the connection: the waiters' poll is the fallback */

        (void) ngx_http_idempotency_redis_script(rcf,
                                        NGX_HTTP_IDEMPOTENCY_SCRIPT_WAIT_WAKE,
                                        &mark, args, 2,
                                        ngx_http_idempotency_wait_marked,
                                        NULL, log);
    }

    ngx_free(p);
}


/* worker 0: what the subscription to "<prefix>done" hears */

static void
ngx_http_idempotency_wait_sub_handler(void *data, ngx_uint_t event,
    ngx_str_t *msg)
{
    ngx_array_t                     *redis = data;
    ngx_http_idempotency_wait_sh_t  *sh;

    sh = ngx_http_idempotency_wait_sh;

    if (event == NGX_HTTP_IDEMPOTENCY_REDIS_SUB_MESSAGE
        && msg->len != NGX_HTTP_IDEMPOTENCY_WAIT_HASH)
    {
        return;
    }

    ngx_shmtx_lock(&ngx_http_idempotency_wait_shpool->mutex);

    switch (event) {

    case NGX_HTTP_IDEMPOTENCY_REDIS_SUB_READY:
        if (sh->listener != ngx_pid) {
            sh->listener = ngx_pid;
            sh->up = 0;
        }

        sh->want = redis->nelts;
        sh->up++;
        break;

    case NGX_HTTP_IDEMPOTENCY_REDIS_SUB_LOST:
        if (sh->listener == ngx_pid && sh->up) {
            sh->up--;
        }

        break;

    default: /* NGX_HTTP_IDEMPOTENCY_REDIS_SUB_MESSAGE */
        ngx_memcpy(sh->hash[sh->seq % NGX_HTTP_IDEMPOTENCY_WAIT_RING],
                   msg->data, NGX_HTTP_IDEMPOTENCY_WAIT_HASH);
        sh->seq++;
        break;
    }

    ngx_shmtx_unlock(&ngx_http_idempotency_wait_shpool->mutex);

    /* this worker's own waiters at once; the others' at their next read */

    ngx_http_idempotency_wait_check();
}


static void
ngx_http_idempotency_wait_check_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_wait_check();

    if (!ngx_queue_empty(&ngx_http_idempotency_wait_queue)
        && !ev->timer_set)
    {
        ngx_add_timer(ev, NGX_HTTP_IDEMPOTENCY_WAIT_CHECK);
    }
}


/*
 * Reads the messages written since the last read, and wakes the waiters
 * of their keys.  When more came than the ring holds, or the listener is
 * gone, every waiter on the slow poll wakes: it claims again, and then
 * waits as it should now.
 */

static void
ngx_http_idempotency_wait_check(void)
{
    ngx_uint_t                       seq, n, i, k, all, listened;
    ngx_queue_t                     *q, *next;
    ngx_http_idempotency_waiter_t   *w;
    ngx_http_idempotency_wait_sh_t  *sh;

    static u_char  hash[NGX_HTTP_IDEMPOTENCY_WAIT_RING]
                       [NGX_HTTP_IDEMPOTENCY_WAIT_HASH];

    sh = ngx_http_idempotency_wait_sh;

    if (sh == NULL) {
        return;
    }

    ngx_shmtx_lock(&ngx_http_idempotency_wait_shpool->mutex);

    seq = sh->seq;
    n = seq - ngx_http_idempotency_wait_seen;
    all = (n > NGX_HTTP_IDEMPOTENCY_WAIT_RING);

    for (i = 0; !all && i < n; i++) {
        k = (ngx_http_idempotency_wait_seen + i)
            % NGX_HTTP_IDEMPOTENCY_WAIT_RING;
        ngx_memcpy(hash[i], sh->hash[k], NGX_HTTP_IDEMPOTENCY_WAIT_HASH);
    }

    ngx_shmtx_unlock(&ngx_http_idempotency_wait_shpool->mutex);

    ngx_http_idempotency_wait_seen = seq;

    if (ngx_queue_empty(&ngx_http_idempotency_wait_queue)) {
        return;
    }

    listened = ngx_http_idempotency_wait_listened();

    /* waking only moves a timer: the queue stays as it is meanwhile */

    for (q = ngx_queue_head(&ngx_http_idempotency_wait_queue);
         q != ngx_queue_sentinel(&ngx_http_idempotency_wait_queue);
         q = next)
    {
        next = ngx_queue_next(q);
        w = ngx_queue_data(q, ngx_http_idempotency_waiter_t, queue);

        if (all || (!listened && w->slow)) {
            ngx_http_idempotency_wait_wake(w,
                                           all
                                           ? NGX_HTTP_IDEMPOTENCY_WAIT_NOTIFIED
                                           : NGX_HTTP_IDEMPOTENCY_WAIT_POLLED);
            continue;
        }

        for (i = 0; i < n; i++) {
            if (ngx_memcmp(w->hash, hash[i], NGX_HTTP_IDEMPOTENCY_WAIT_HASH)
                == 0)
            {
                ngx_http_idempotency_wait_wake(w,
                                          NGX_HTTP_IDEMPOTENCY_WAIT_NOTIFIED);
                break;
            }
        }
    }
}


static void
ngx_http_idempotency_wait_wake(ngx_http_idempotency_waiter_t *w,
    ngx_uint_t how)
{
    ngx_event_t  *ev;

    ev = &w->ctx->wait_timer;

    if (!ev->timer_set) {
        /* its claim is out: should it find the claim in flight still */
        w->missed = (how == NGX_HTTP_IDEMPOTENCY_WAIT_NOTIFIED);
        return;
    }

    if (w->woken) {
        return;
    }

    w->woken = how;

    /* its timer, now: the claim goes from the timer, not from this walk */

    ngx_del_timer(ev);
    ngx_add_timer(ev, 0);
}
