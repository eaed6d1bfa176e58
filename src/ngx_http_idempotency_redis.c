/*
 * The hiredis <-> nginx event adapter: per-worker connections, timers, ops.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>

#include <openssl/sha.h>
#include <hiredis/sds.h>

#include "ngx_http_idempotency_module.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_sentinel.h"
#include "ngx_http_idempotency_cluster.h"
#include "ngx_http_idempotency_scripts.h"
#include "ngx_http_idempotency_stats.h"


/* reconnect delay: doubles from MIN on every failure in a row, up to MAX */
#define NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MIN   100
#define NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MAX   2000

/*
 * The Redis fd is registered level-triggered.  hiredis reads at most 16 KiB
 * per redisAsyncHandleRead() call; with edge-triggered epoll the rest of a
 * large reply would raise no new event and stall.  Level-triggered, epoll
 * reports the fd again on the next loop iteration while bytes are pending:
 * no FIONREAD loop, no touching a context that the previous call may have
 * freed, and other connections get their turn between 16 KiB chunks (nginx
 * registers its listening sockets the same way).  hiredis removes write
 * interest as soon as its output buffer is empty, so this never spins.  Read
 * and write use the same flags: on epoll both share one registration.
 */
#define NGX_HTTP_IDEMPOTENCY_REDIS_EVENT_FLAGS   NGX_LEVEL_EVENT

/* room for "*<n>\r\n$<n>\r\nEVALSHA\r\n$<n>\r\n" in front of the sha/text */
#define NGX_HTTP_IDEMPOTENCY_REDIS_PREFIX_LEN                                 \
    (sizeof("*\r\n$\r\nEVALSHA\r\n$\r\n") - 1 + 3 * NGX_INT_T_LEN)

/* redirects (MOVED, ASK) one command follows in a Redis Cluster */
#define NGX_HTTP_IDEMPOTENCY_REDIS_REDIRECTS_MAX  5

/* numkeys, which follows the sha or the script text */
#define NGX_HTTP_IDEMPOTENCY_REDIS_NUMKEYS       "\r\n$1\r\n1\r\n"

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


typedef enum {
    NGX_HTTP_IDEMPOTENCY_REDIS_IDLE = 0,      /* no context, maybe backoff */
    NGX_HTTP_IDEMPOTENCY_REDIS_CONNECTING,    /* connect(2) in progress */
    NGX_HTTP_IDEMPOTENCY_REDIS_HANDSHAKE,     /* AUTH, SELECT, SCRIPT LOAD */
    NGX_HTTP_IDEMPOTENCY_REDIS_READY
} ngx_http_idempotency_redis_state_e;


typedef struct {
    const char                          *name;
    const char                          *text;
    size_t                               len;
    u_char                               sha[SHA_DIGEST_LENGTH * 2];
    const char                          *native;   /* without text */
} ngx_http_idempotency_redis_script_t;


struct ngx_http_idempotency_redis_node_s {
    ngx_http_idempotency_redis_conf_t   *conf;
    ngx_str_t                            name;     /* address, for logs */
    ngx_log_t                           *log;
    ngx_str_t                            host;     /* IP, NUL-ended, or "" */
    in_port_t                            port;

    redisAsyncContext                   *ac;       /* NULL: none */
    ngx_http_idempotency_redis_state_e   state;
    ngx_uint_t                           handshake; /* replies still due */
    ngx_uint_t                           pending;  /* ops hiredis holds */
    size_t                               queued;   /* their bytes */
    ngx_msec_t                           last_read; /* reply bytes came */
    uint64_t                             queued_seq; /* ops handed over */
    uint64_t                             flushed_seq; /* ops written */

    ngx_uint_t                           failures; /* in a row */
    ngx_msec_t                           backoff;

    ngx_event_t                          connect_timer;
    ngx_event_t                          reconnect_timer;

    ngx_http_idempotency_sentinel_t     *sentinel; /* sentinel= only */

    ngx_queue_t                          parked;   /* ops waiting to resend */
    ngx_queue_t                          doomed;   /* given up, handler due */
    ngx_uint_t                           kept;     /* ever parked, not done */
    ngx_http_idempotency_redis_stats_t   stats;

    unsigned                             exiting:1;
    unsigned                             drained:1; /* notice due */
    unsigned                             bulk:1;   /* rcf->bulk */
};


/*
 * An op is in exactly one of these places, so that it can be neither freed
 * twice nor both parked and with hiredis: a reply (or teardown) callback of
 * hiredis is due for it only in SENT, and that callback moves it on.
 */
typedef enum {
    NGX_HTTP_IDEMPOTENCY_REDIS_OP_NEW = 0,    /* ours, not queued anywhere */
    NGX_HTTP_IDEMPOTENCY_REDIS_OP_SENT,       /* hiredis holds it */
    NGX_HTTP_IDEMPOTENCY_REDIS_OP_PARKED,     /* in node->parked */
    NGX_HTTP_IDEMPOTENCY_REDIS_OP_DOOMED      /* in node->doomed */
} ngx_http_idempotency_redis_op_state_e;


struct ngx_http_idempotency_redis_op_s {
    ngx_http_idempotency_redis_node_t   *node;
    ngx_http_idempotency_redis_pt        handler;  /* NULL: done, cancelled */
    void                                *data;

    /*
     * SENT: the command timeout; PARKED: the deadline or the next retry,
     * cancelable; DOOMED: 0 ms, to call the handler outside the caller
     */
    ngx_event_t                          timer;

    ngx_queue_t                          queue;    /* PARKED, DOOMED */
    ngx_http_idempotency_redis_info_t    info;     /* key inside the tail */
    ngx_msec_t                           deadline; /* retryable ops */
    size_t                               size;     /* the whole allocation */
    size_t                               wire;     /* bytes sent, SENT */
    uint64_t                             seq;      /* node->queued_seq */
    uint64_t                             sent;     /* for the latency */

    ngx_uint_t                           nargs;
    ngx_uint_t                           redirects; /* MOVED, ASK followed */
    u_char                              *tail;     /* RESP key and args */
    size_t                               tail_len;

    ngx_http_idempotency_redis_op_state_e  state;

    unsigned                             eval:1;   /* resent as EVAL */
    unsigned                             retry:1;  /* may be parked */
    unsigned                             kept:1;   /* counted in node->kept */
    unsigned                             counted:1; /* in redis.parked */
    unsigned                             timed_out:1;
    unsigned                             asking:1; /* sent after ASKING */
};


/* error replies after which the same command is worth sending again */
typedef struct {
    ngx_str_t                            code;
    const char                          *text;
} ngx_http_idempotency_redis_transient_t;


/*
 * The body of a split record on its way to Redis: "SET <body key>:<i>
 * <chunk> PX <ttl>" for each chunk, at most WRITE_WINDOW of them queued at
 * once (the next one goes when one is answered), each a retryable op:
 * after a lost connection the unanswered ones are resent (a chunk written
 * twice is the same chunk).  Once every chunk is in, the head is stored
 * (the store script checks that every chunk is there).  The body is read
 * from "mem", taken from the request's pool (or a copy of it), freed when
 * the last chunk is done.  While Redis is away (a chunk parked) the whole
 * body counts against the worker's retry buffer, as a record stored whole
 * would; "charged" says so.
 */
typedef struct {
    ngx_http_idempotency_redis_conf_t   *rcf;
    ngx_http_idempotency_redis_node_t   *node;     /* of the chunks */
    u_char                              *mem;      /* ours, holds body */
    u_char                              *body;
    u_char                             **blocks;   /* ours: chunks 1.. */
    ngx_uint_t                           nblocks;
    size_t                               len;
    size_t                               sent;     /* bytes handed over */
    ngx_uint_t                           chunks;   /* in all */
    ngx_uint_t                           acked;    /* chunks in Redis */
    ngx_uint_t                           inflight; /* chunk ops not done */
    ngx_msec_t                           deadline;
    ngx_str_t                            bkey;     /* room for ":<i>" */
    ngx_str_t                            bttl;     /* the chunks' PX */
    ngx_str_t                            sargs[5]; /* of the head's store */
    ngx_http_idempotency_redis_info_t    info;     /* for a failure */
    ngx_http_idempotency_redis_pt        handler;  /* NULL: called */
    void                                *data;
    const char                          *why;      /* a chunk given up */
    unsigned                             failed:1;
    unsigned                             charged:1;
} ngx_http_idempotency_redis_upload_t;


static ngx_int_t ngx_http_idempotency_redis_init_node(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_conf_t *rcf);
static void ngx_http_idempotency_redis_connect(
    ngx_http_idempotency_redis_node_t *node);
static ngx_int_t ngx_http_idempotency_redis_handshake(
    ngx_http_idempotency_redis_node_t *node);
static void ngx_http_idempotency_redis_ready(
    ngx_http_idempotency_redis_node_t *node);
static void ngx_http_idempotency_redis_failure(
    ngx_http_idempotency_redis_node_t *node, const char *what,
    const char *reason);
static void ngx_http_idempotency_redis_lost(
    ngx_http_idempotency_redis_node_t *node, redisAsyncContext *ac,
    const char *what);
static void ngx_http_idempotency_redis_drop(
    ngx_http_idempotency_redis_node_t *node, const char *what,
    const char *reason);
static void ngx_http_idempotency_redis_close(
    ngx_http_idempotency_redis_node_t *node);

static void ngx_http_idempotency_redis_reconnect_handler(ngx_event_t *ev);
static void ngx_http_idempotency_redis_sentinel_handler(void *data,
    ngx_uint_t event);
static void ngx_http_idempotency_redis_connect_timeout_handler(
    ngx_event_t *ev);
static void ngx_http_idempotency_redis_op_timeout_handler(ngx_event_t *ev);

static void ngx_http_idempotency_redis_on_connect(
    const redisAsyncContext *cac, int status);
static void ngx_http_idempotency_redis_on_disconnect(
    const redisAsyncContext *cac, int status);
static void ngx_http_idempotency_redis_setup_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static void ngx_http_idempotency_redis_load_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static void ngx_http_idempotency_redis_role_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static void ngx_http_idempotency_redis_handshake_step(
    ngx_http_idempotency_redis_node_t *node);
static void ngx_http_idempotency_redis_op_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static ngx_http_idempotency_redis_node_t *ngx_http_idempotency_redis_route(
    ngx_http_idempotency_redis_node_t *node, size_t size, ngx_uint_t ready);
static size_t ngx_http_idempotency_redis_args_size(ngx_str_t *args,
    ngx_uint_t nargs);
static ngx_int_t ngx_http_idempotency_redis_store_split(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *key, ngx_str_t *args,
    ngx_msec_t deadline, ngx_http_idempotency_redis_pt handler, void *data,
    ngx_pool_t *pool, u_char **memp, ngx_array_t *more, size_t more_len);
static ngx_int_t ngx_http_idempotency_redis_take(ngx_pool_t *pool, void *p);
static ngx_http_idempotency_redis_op_t *ngx_http_idempotency_redis_retry_on(
    ngx_http_idempotency_redis_node_t *node, ngx_uint_t script,
    ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs, ngx_msec_t deadline,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log);
static ngx_int_t ngx_http_idempotency_redis_upload_next(
    ngx_http_idempotency_redis_upload_t *u);
static void ngx_http_idempotency_redis_upload_reply(void *data,
    redisReply *reply, ngx_uint_t rc);
static void ngx_http_idempotency_redis_upload_free(
    ngx_http_idempotency_redis_upload_t *u);
static ngx_http_idempotency_redis_upload_t *
    ngx_http_idempotency_redis_upload_of(ngx_http_idempotency_redis_op_t *op);
static void ngx_http_idempotency_redis_upload_fail(
    ngx_http_idempotency_redis_upload_t *u, const char *reason);
static void ngx_http_idempotency_redis_fetch_reply(void *data,
    redisReply *reply, ngx_uint_t rc);
static void ngx_http_idempotency_redis_op_timer(
    ngx_http_idempotency_redis_op_t *op, size_t len);
static ngx_http_idempotency_redis_node_t *ngx_http_idempotency_redis_pick(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *key);
static ngx_int_t ngx_http_idempotency_redis_redirect(
    ngx_http_idempotency_redis_op_t *op, redisReply *reply);
static void ngx_http_idempotency_redis_asking_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static void ngx_http_idempotency_redis_op_finish(
    ngx_http_idempotency_redis_op_t *op, redisReply *reply, ngx_uint_t rc);
static ngx_http_idempotency_redis_op_t *ngx_http_idempotency_redis_op_create(
    ngx_http_idempotency_redis_node_t *node, ngx_uint_t script, ngx_str_t *key,
    ngx_str_t *args, ngx_uint_t nargs, ngx_http_idempotency_redis_pt handler,
    void *data, ngx_log_t *log);
static ngx_int_t ngx_http_idempotency_redis_op_send(
    ngx_http_idempotency_redis_op_t *op);
static void ngx_http_idempotency_redis_op_detach(
    ngx_http_idempotency_redis_op_t *op);
static const char *ngx_http_idempotency_redis_park(
    ngx_http_idempotency_redis_op_t *op, const char *error, ngx_msec_t retry);
static void ngx_http_idempotency_redis_unpark(
    ngx_http_idempotency_redis_op_t *op);
static void ngx_http_idempotency_redis_unkeep(
    ngx_http_idempotency_redis_op_t *op);
static void ngx_http_idempotency_redis_drained(
    ngx_http_idempotency_redis_node_t *node);
static void ngx_http_idempotency_redis_retry_or_give_up(
    ngx_http_idempotency_redis_op_t *op, const char *error, ngx_msec_t retry);
static void ngx_http_idempotency_redis_give_up(
    ngx_http_idempotency_redis_op_t *op, const char *reason);
static void ngx_http_idempotency_redis_resend_parked(
    ngx_http_idempotency_redis_node_t *node);
static const char *ngx_http_idempotency_redis_transient(redisReply *reply);
static u_char *ngx_http_idempotency_redis_frame(
    ngx_http_idempotency_redis_op_t *op, ngx_uint_t eval, size_t *len);
static u_char *ngx_http_idempotency_redis_bulk(u_char *p, ngx_str_t *s);

static void ngx_http_idempotency_redis_add_read(void *privdata);
static void ngx_http_idempotency_redis_del_read(void *privdata);
static void ngx_http_idempotency_redis_add_write(void *privdata);
static void ngx_http_idempotency_redis_del_write(void *privdata);
static void ngx_http_idempotency_redis_cleanup(void *privdata);
static void ngx_http_idempotency_redis_read_handler(ngx_event_t *rev);
static void ngx_http_idempotency_redis_write_handler(ngx_event_t *wev);
static void ngx_http_idempotency_redis_node_write_handler(ngx_event_t *wev);


/* the bytes in block i of a body's blocks after its first chunk ("more") */
#define NGX_HTTP_IDEMPOTENCY_REDIS_BLOCK_LEN(more_len, i)                     \
    ngx_min((more_len) - (i) * NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK,             \
            NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK)


/* bytes of all parked ops of this worker, against the PARKED_MAX cap */
static size_t  ngx_http_idempotency_redis_parked_bytes;

/* the connection whose write handler runs: hiredis asking again means EAGAIN */
static ngx_connection_t  *ngx_http_idempotency_redis_writing;


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


/*
 * Per process: the shas are computed by each worker in init_process.  The
 * claim is Redis' own "SET key value NX GET PX ms" (Redis 7.0 or newer),
 * atomic alone and much cheaper for Redis than a script: no text, no sha.
 */
static ngx_http_idempotency_redis_script_t
    ngx_http_idempotency_redis_scripts[NGX_HTTP_IDEMPOTENCY_SCRIPT_N] = {

    { "claim", NULL, 0, "", "SET" },

    { "store", ngx_http_idempotency_lua_store,
      sizeof(ngx_http_idempotency_lua_store) - 1, "", NULL },

    { "release", ngx_http_idempotency_lua_release,
      sizeof(ngx_http_idempotency_lua_release) - 1, "", NULL },

    { "renew", ngx_http_idempotency_lua_renew,
      sizeof(ngx_http_idempotency_lua_renew) - 1, "", NULL },

    { "inspect", ngx_http_idempotency_lua_inspect,
      sizeof(ngx_http_idempotency_lua_inspect) - 1, "", NULL },

    { "purge", ngx_http_idempotency_lua_purge,
      sizeof(ngx_http_idempotency_lua_purge) - 1, "", NULL },

    /* a split record's body: written before its head, read for a replay */
    { "body store", NULL, 0, "", "SET" },
    { "body read", NULL, 0, "", "GET" }
};


ngx_int_t
ngx_http_idempotency_redis_init_process(ngx_cycle_t *cycle)
{
    u_char                               md[SHA_DIGEST_LENGTH];
    ngx_uint_t                           i;
    ngx_http_idempotency_redis_conf_t  **rcfp;
    ngx_http_idempotency_redis_script_t *s;
    ngx_http_idempotency_main_conf_t    *imcf;

    /* cache managers and loaders run init_process too but serve nothing */

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    imcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_idempotency_module);

    if (imcf == NULL || !imcf->used || imcf->redis.nelts == 0) {
        return NGX_OK;
    }

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_SCRIPT_N; i++) {
        s = &ngx_http_idempotency_redis_scripts[i];

        if (s->text == NULL) {
            continue;
        }

        SHA1((const u_char *) s->text, s->len, md);
        ngx_hex_dump(s->sha, md, SHA_DIGEST_LENGTH);
    }

    /*
     * The cached time dates from before the configuration was parsed,
     * seconds ago with a large one: a connect timer armed from it would
     * expire at once.
     */

    ngx_time_update();

    rcfp = imcf->redis.elts;

    for (i = 0; i < imcf->redis.nelts; i++) {

        if (rcfp[i]->node || rcfp[i]->cluster) {
            continue;
        }

        if (rcfp[i]->mode == NGX_HTTP_IDEMPOTENCY_REDIS_CLUSTER) {
            if (ngx_http_idempotency_cluster_init(cycle, rcfp[i]) != NGX_OK) {
                return NGX_ERROR;
            }

            continue;
        }

        if (ngx_http_idempotency_redis_init_node(cycle, rcfp[i]) != NGX_OK) {
            return NGX_ERROR;
        }

        if (rcfp[i]->mode == NGX_HTTP_IDEMPOTENCY_REDIS_SINGLE) {
            rcfp[i]->bulk = ngx_http_idempotency_redis_node_create(rcfp[i],
                                             &rcfp[i]->host, rcfp[i]->port,
                                             cycle->pool, cycle->log);
            if (rcfp[i]->bulk == NULL) {
                return NGX_ERROR;
            }

            rcfp[i]->bulk->bulk = 1;
        }

        /* eagerly: the first requests should find the connection up */

        ngx_http_idempotency_redis_connect(rcfp[i]->node);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_redis_init_node(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_conf_t *rcf)
{
    rcf->node = ngx_http_idempotency_redis_node_create(rcf, &rcf->host,
                                                       rcf->port, cycle->pool,
                                                       cycle->log);

    return rcf->node ? NGX_OK : NGX_ERROR;
}


ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_redis_node_create(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *host, in_port_t port, ngx_pool_t *pool, ngx_log_t *log)
{
    u_char                             *p;
    ngx_addr_t                         *addr;
    ngx_http_idempotency_redis_node_t  *node;

    node = ngx_pcalloc(pool, sizeof(ngx_http_idempotency_redis_node_t));
    if (node == NULL) {
        return NULL;
    }

    node->conf = rcf;
    node->log = log;
    node->backoff = NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MIN;
    node->host = *host;
    node->port = port;

    /*
     * rcf->text would be the obvious name for logs, but it holds every
     * argument of the directive, the password included
     */

    if (rcf->mode == NGX_HTTP_IDEMPOTENCY_REDIS_SENTINEL) {
        node->name = rcf->sentinel_master;

        node->sentinel = ngx_http_idempotency_sentinel_create(pool, rcf,
                                 node->log,
                                 ngx_http_idempotency_redis_sentinel_handler,
                                 node);
        if (node->sentinel == NULL) {
            return NULL;
        }

    } else if (rcf->addrs.nelts
               && rcf->mode != NGX_HTTP_IDEMPOTENCY_REDIS_CLUSTER)
    {
        addr = rcf->addrs.elts;
        node->name = addr[0].name;

    } else {
        p = ngx_pnalloc(pool, host->len + rcf->unix_path.len
                              + sizeof("unix:") + NGX_INT_T_LEN);
        if (p == NULL) {
            return NULL;
        }

        node->name.data = p;

        if (rcf->unix_path.len) {
            p = ngx_sprintf(p, "unix:%V", &rcf->unix_path);

        } else {
            p = ngx_sprintf(p, "%V:%d", host, (int) port);
        }

        node->name.len = p - node->name.data;
    }

    node->connect_timer.handler =
                         ngx_http_idempotency_redis_connect_timeout_handler;
    node->connect_timer.data = node;
    node->connect_timer.log = node->log;
    node->connect_timer.cancelable = 1;

    node->reconnect_timer.handler =
                         ngx_http_idempotency_redis_reconnect_handler;
    node->reconnect_timer.data = node;
    node->reconnect_timer.log = node->log;
    node->reconnect_timer.cancelable = 1;

    ngx_queue_init(&node->parked);
    ngx_queue_init(&node->doomed);

    return node;
}


void
ngx_http_idempotency_redis_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                           i;
    ngx_http_idempotency_redis_conf_t  **rcfp;
    ngx_http_idempotency_redis_node_t   *node;
    ngx_http_idempotency_main_conf_t    *imcf;

    imcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_idempotency_module);

    if (imcf == NULL) {
        return;
    }

    rcfp = imcf->redis.elts;

    for (i = 0; i < imcf->redis.nelts; i++) {
        if (rcfp[i]->cluster) {
            ngx_http_idempotency_cluster_exit(rcfp[i]->cluster);
            rcfp[i]->cluster = NULL;
            continue;
        }

        if (rcfp[i]->bulk) {
            ngx_http_idempotency_redis_node_exit(rcfp[i]->bulk);
            rcfp[i]->bulk = NULL;
        }

        node = rcfp[i]->node;

        if (node == NULL) {
            continue;
        }

        ngx_http_idempotency_redis_node_exit(node);

        rcfp[i]->node = NULL;
    }
}


void
ngx_http_idempotency_redis_node_exit(ngx_http_idempotency_redis_node_t *node)
{
    ngx_queue_t                      *q;
    ngx_http_idempotency_redis_op_t  *op;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" closing at exit, "
                   "%ui ops pending, %ui parked", &node->name,
                   node->pending, node->stats.parked);

    /*
     * Plain ops still pending here belong to requests the worker
     * abandons (fast shutdown): their handlers are not called, as
     * resuming a request while the process exits would do more harm
     * than good; every op is still freed by its hiredis callback.
     *
     * Retryable ops, pending or parked, are given up, each with its
     * handler called (one error line per op from the settle step).
     * Their deadline timers are cancelable, so a graceful shutdown
     * does not wait for a Redis that is away: it ends as soon as the
     * requests are done, and what is still parked then is given up
     * here.  Ops already sent keep their (non-cancelable) command
     * timers, so a shutdown still waits for replies that are due.
     */

    node->exiting = 1;

    if (node->reconnect_timer.timer_set) {
        ngx_del_timer(&node->reconnect_timer);
    }

    ngx_http_idempotency_redis_close(node);

    if (node->sentinel) {
        ngx_http_idempotency_sentinel_close(node->sentinel);
    }

    while (!ngx_queue_empty(&node->parked)) {
        q = ngx_queue_head(&node->parked);
        op = ngx_queue_data(q, ngx_http_idempotency_redis_op_t, queue);
        ngx_http_idempotency_redis_give_up(op, "the worker is exiting");
    }

    while (!ngx_queue_empty(&node->doomed)) {
        q = ngx_queue_head(&node->doomed);
        op = ngx_queue_data(q, ngx_http_idempotency_redis_op_t, queue);
        ngx_http_idempotency_redis_give_up(op, op->info.reason);
    }
}


static void
ngx_http_idempotency_redis_connect(ngx_http_idempotency_redis_node_t *node)
{
    in_port_t                           port;
    ngx_int_t                           rc;
    const char                         *host;
    ngx_connection_t                   *c;
    redisAsyncContext                  *ac;
    ngx_http_idempotency_redis_conf_t  *rcf;

    rcf = node->conf;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" connecting", &node->name);

    /* host is an IP literal: hiredis never resolves a name here */

    if (node->sentinel) {
        /* every connect asks the sentinels first: any loss may be a move */

        rc = ngx_http_idempotency_sentinel_master(node->sentinel, &host,
                                                  &port);
        if (rc == NGX_AGAIN) {
            return;
        }

        if (rc != NGX_OK) {
            ngx_http_idempotency_redis_failure(node, "connect failed",
                           "no master from the sentinels (none answered, "
                           "or a failover is running)");
            return;
        }

        ac = redisAsyncConnect(host, port);

    } else if (rcf->unix_path.len) {
        ac = redisAsyncConnectUnix((const char *) rcf->unix_path.data);

    } else {
        ac = redisAsyncConnect((const char *) node->host.data, node->port);
    }

    if (ac == NULL) {
        ngx_http_idempotency_redis_failure(node, "connect failed",
                                           "out of memory");
        return;
    }

    if (ac->err) {
        ngx_http_idempotency_redis_failure(node, "connect failed",
                                           ac->errstr);
        /* no hooks yet: hiredis closes the fd itself */
        redisAsyncFree(ac);
        return;
    }

    c = ngx_http_idempotency_redis_attach(ac, node->log);
    if (c == NULL) {
        ngx_http_idempotency_redis_failure(node, "connect failed",
                                           "no free worker connection");
        redisAsyncFree(ac);
        return;
    }

    ac->data = node;
    c->write->handler = ngx_http_idempotency_redis_node_write_handler;

    node->ac = ac;
    node->state = NGX_HTTP_IDEMPOTENCY_REDIS_CONNECTING;

    redisAsyncSetConnectCallback(ac, ngx_http_idempotency_redis_on_connect);
    redisAsyncSetDisconnectCallback(ac,
                                    ngx_http_idempotency_redis_on_disconnect);

    ngx_add_timer(&node->connect_timer, rcf->connect_timeout);

    /*
     * Queued now, before the connect completes (hiredis 0.14 must not be
     * given commands from the connect callback); FIFO order puts them
     * ahead of any command of a request.
     */

    if (ngx_http_idempotency_redis_handshake(node) != NGX_OK) {
        ngx_http_idempotency_redis_drop(node, "connect failed",
                                        "could not queue the handshake");
        return;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" connect in progress, fd:%d",
                   &node->name, c->fd);
}


/*
 * "AUTH [user] password" (the ACL form with a user, the requirepass form
 * without) into argv and argvlen, which have room for 3; returns argc.
 */

int
ngx_http_idempotency_redis_auth_args(ngx_str_t *user, ngx_str_t *password,
    const char **argv, size_t *argvlen)
{
    int  argc;

    argc = 0;

    argv[argc] = "AUTH";
    argvlen[argc++] = sizeof("AUTH") - 1;

    if (user->len) {
        argv[argc] = (const char *) user->data;
        argvlen[argc++] = user->len;
    }

    argv[argc] = (const char *) password->data;
    argvlen[argc++] = password->len;

    return argc;
}


static ngx_int_t
ngx_http_idempotency_redis_handshake(ngx_http_idempotency_redis_node_t *node)
{
    int                                  argc;
    u_char                               db[NGX_INT_T_LEN];
    size_t                               argvlen[3];
    ngx_uint_t                           i;
    const char                          *argv[3];
    redisAsyncContext                   *ac;
    ngx_http_idempotency_redis_conf_t   *rcf;
    ngx_http_idempotency_redis_script_t *s;

    ac = node->ac;
    rcf = node->conf;

    node->handshake = 0;

    if (rcf->password.len) {
        argc = ngx_http_idempotency_redis_auth_args(&rcf->user,
                                                    &rcf->password, argv,
                                                    argvlen);

        if (redisAsyncCommandArgv(ac, ngx_http_idempotency_redis_setup_reply,
                                  "AUTH failed", argc, argv, argvlen)
            != REDIS_OK)
        {
            return NGX_ERROR;
        }

        node->handshake++;
    }

    if (rcf->db >= 0) {
        argv[0] = "SELECT";
        argvlen[0] = sizeof("SELECT") - 1;
        argv[1] = (const char *) db;
        argvlen[1] = ngx_sprintf(db, "%i", rcf->db) - db;

        if (redisAsyncCommandArgv(ac, ngx_http_idempotency_redis_setup_reply,
                                  "SELECT failed", 2, argv, argvlen)
            != REDIS_OK)
        {
            return NGX_ERROR;
        }

        node->handshake++;
    }

    /* what the sentinels named must be the master now, not a replica */

    if (node->sentinel) {
        argv[0] = "ROLE";
        argvlen[0] = sizeof("ROLE") - 1;

        if (redisAsyncCommandArgv(ac, ngx_http_idempotency_redis_role_reply,
                                  NULL, 1, argv, argvlen)
            != REDIS_OK)
        {
            return NGX_ERROR;
        }

        node->handshake++;
    }

    argv[0] = "SCRIPT";
    argvlen[0] = sizeof("SCRIPT") - 1;
    argv[1] = "LOAD";
    argvlen[1] = sizeof("LOAD") - 1;

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_SCRIPT_N; i++) {
        s = &ngx_http_idempotency_redis_scripts[i];

        if (s->text == NULL) {
            continue;
        }

        argv[2] = s->text;
        argvlen[2] = s->len;

        if (redisAsyncCommandArgv(ac, ngx_http_idempotency_redis_load_reply,
                                  s, 3, argv, argvlen)
            != REDIS_OK)
        {
            return NGX_ERROR;
        }

        node->handshake++;
    }

    return NGX_OK;
}


static void
ngx_http_idempotency_redis_ready(ngx_http_idempotency_redis_node_t *node)
{
    node->state = NGX_HTTP_IDEMPOTENCY_REDIS_READY;

    if (node->connect_timer.timer_set) {
        ngx_del_timer(&node->connect_timer);
    }

    if (node->failures) {
        ngx_log_error(NGX_LOG_NOTICE, node->log, 0,
                      "idempotency redis: \"%V\" is reachable again "
                      "after %ui failed attempts",
                      &node->name, node->failures);

    } else {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, node->log, 0,
                       "idempotency redis: \"%V\" ready", &node->name);
    }

    node->failures = 0;
    node->backoff = NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MIN;
}


/*
 * Counts a failure and schedules the next attempt.  Only the first failure
 * of a streak is an error in the log: a Redis that is down for an hour
 * must not write two lines a second per worker.
 */

static void
ngx_http_idempotency_redis_failure(ngx_http_idempotency_redis_node_t *node,
    const char *what, const char *reason)
{
    ngx_http_idempotency_stat_inc(
                           NGX_HTTP_IDEMPOTENCY_STAT_REDIS_CONNECTION_ERRORS);

    if (node->failures++ == 0) {
        ngx_log_error(NGX_LOG_ERR, node->log, 0,
                      "idempotency redis: \"%V\" %s: %s, "
                      "reconnecting in %M ms",
                      &node->name, what, reason, node->backoff);

    } else {
        ngx_log_debug5(NGX_LOG_DEBUG_HTTP, node->log, 0,
                       "idempotency redis: \"%V\" %s: %s, "
                       "attempt %ui failed, reconnecting in %M ms",
                       &node->name, what, reason, node->failures,
                       node->backoff);
    }

    if (node->exiting) {
        return;
    }

    if (node->conf->cluster) {
        /* the node may have failed over or left: ask for the slot map */
        ngx_http_idempotency_cluster_node_failed(node->conf->cluster, node);
    }

    /*
     * Always from a timer, never from inside a hiredis callback: the old
     * context is still being freed there, and a new socket could get the
     * number of the fd that hiredis is about to forget.
     */

    ngx_add_timer(&node->reconnect_timer, node->backoff);

    node->backoff *= 2;

    if (node->backoff > NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MAX) {
        node->backoff = NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MAX;
    }
}


/*
 * hiredis is tearing the context down by itself (connect error, EOF, read
 * or write error): forget it.  It frees the context once the current
 * callback returns, so it must not be freed here.  Every hiredis callback
 * of that teardown gets here; only the first one counts.
 */

static void
ngx_http_idempotency_redis_lost(ngx_http_idempotency_redis_node_t *node,
    redisAsyncContext *ac, const char *what)
{
    const char  *reason;

    if (node->ac != ac) {
        return;
    }

    node->ac = NULL;
    node->state = NGX_HTTP_IDEMPOTENCY_REDIS_IDLE;

    if (node->connect_timer.timer_set) {
        ngx_del_timer(&node->connect_timer);
    }

    /* the connect error is in ac->c until hiredis copies it to ac */

    if (ac->err) {
        reason = ac->errstr;

    } else if (ac->c.err) {
        reason = ac->c.errstr;

    } else {
        reason = "connection closed";
    }

    ngx_http_idempotency_redis_failure(node, what, reason);
}


/* we give up on the connection: log, schedule a reconnect, free it */

static void
ngx_http_idempotency_redis_drop(ngx_http_idempotency_redis_node_t *node,
    const char *what, const char *reason)
{
    if (node->ac == NULL) {
        return;
    }

    ngx_http_idempotency_redis_failure(node, what, reason);
    ngx_http_idempotency_redis_close(node);
}


/*
 * Frees the context.  Outside a hiredis callback this is synchronous: every
 * pending op's callback runs with a NULL reply (the op handlers see ERROR,
 * and find no connection to send anything new on, as node->ac is already
 * NULL), then the cleanup hook closes the nginx connection.  Inside a
 * callback hiredis defers it until that callback returns.
 */

static void
ngx_http_idempotency_redis_close(ngx_http_idempotency_redis_node_t *node)
{
    redisAsyncContext  *ac;

    ac = node->ac;

    if (node->connect_timer.timer_set) {
        ngx_del_timer(&node->connect_timer);
    }

    if (ac == NULL) {
        return;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" disconnecting", &node->name);

    node->ac = NULL;
    node->state = NGX_HTTP_IDEMPOTENCY_REDIS_IDLE;

    /* we know already; and it must not run with a half-freed context */
    ac->onDisconnect = NULL;

    redisAsyncFree(ac);
}


/*
 * The sentinels answered (the next connect() takes the answer), or the
 * master moved or is moving: a connection to the old one is closed, without
 * counting a failure (this runs in a callback of a sentinel connection,
 * never of this one).  The connect itself always comes from the reconnect
 * timer.
 */

static void
ngx_http_idempotency_redis_sentinel_handler(void *data, ngx_uint_t event)
{
    ngx_http_idempotency_redis_node_t  *node = data;

    if (node->exiting) {
        return;
    }

    if (event == NGX_HTTP_IDEMPOTENCY_SENTINEL_SWITCH && node->ac) {
        ngx_http_idempotency_redis_close(node);
    }

    if (node->ac) {
        return;
    }

    if (node->reconnect_timer.timer_set) {
        ngx_del_timer(&node->reconnect_timer);
    }

    ngx_add_timer(&node->reconnect_timer, 0);
}


static void
ngx_http_idempotency_redis_reconnect_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_redis_node_t  *node = ev->data;

    if (node->exiting || node->ac) {
        return;
    }

    ngx_http_idempotency_stat_inc(NGX_HTTP_IDEMPOTENCY_STAT_REDIS_RECONNECTS);
    ngx_http_idempotency_redis_connect(node);
}


static void
ngx_http_idempotency_redis_connect_timeout_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_redis_node_t  *node = ev->data;

    ngx_http_idempotency_redis_drop(node,
                          node->state == NGX_HTTP_IDEMPOTENCY_REDIS_CONNECTING
                          ? "connect failed" : "handshake failed",
                          "timed out");
}


static void
ngx_http_idempotency_redis_on_connect(const redisAsyncContext *cac,
    int status)
{
    redisAsyncContext                  *ac;
    ngx_http_idempotency_redis_node_t  *node;

    ac = (redisAsyncContext *) cac;
    node = ac->data;

    /* hiredis frees the context itself after a failed connect */

    if (status != REDIS_OK) {
        ngx_http_idempotency_redis_lost(node, ac, "connect failed");
        return;
    }

    if (node->ac != ac) {
        return;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" connected, handshake",
                   &node->name);

    /* sending or disconnecting from here is unsafe in hiredis 0.14 */

    node->state = NGX_HTTP_IDEMPOTENCY_REDIS_HANDSHAKE;

    if (node->handshake == 0) {
        ngx_http_idempotency_redis_ready(node);
    }
}


static void
ngx_http_idempotency_redis_on_disconnect(const redisAsyncContext *cac,
    int status)
{
    redisAsyncContext                  *ac;
    ngx_http_idempotency_redis_node_t  *node;

    ac = (redisAsyncContext *) cac;
    node = ac->data;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" disconnected, status:%d",
                   &node->name, status);

    ngx_http_idempotency_redis_lost(node, ac, status == REDIS_OK
                                              ? "connection closed"
                                              : "connection lost");
}


/* AUTH and SELECT: a refusal makes the connection useless */

static void
ngx_http_idempotency_redis_setup_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    redisReply                         *reply = r;
    const char                         *what = privdata;
    ngx_http_idempotency_redis_node_t  *node;

    node = ac->data;

    if (reply == NULL) {
        ngx_http_idempotency_redis_lost(node, ac, "connection lost");
        return;
    }

    if (node->ac != ac) {
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        /* inside a callback: hiredis frees the context when we return */
        ngx_http_idempotency_redis_drop(node, what, reply->str);
        return;
    }

    ngx_http_idempotency_redis_handshake_step(node);
}


/* SCRIPT LOAD: a failure is logged; EVAL still works if EVALSHA does not */

static void
ngx_http_idempotency_redis_load_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    redisReply                           *reply = r;
    ngx_http_idempotency_redis_node_t    *node;
    ngx_http_idempotency_redis_script_t  *s = privdata;

    node = ac->data;

    if (reply == NULL) {
        ngx_http_idempotency_redis_lost(node, ac, "connection lost");
        return;
    }

    if (node->ac != ac) {
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, node->log, 0,
                      "idempotency redis: \"%V\" SCRIPT LOAD of the %s "
                      "script failed: %s", &node->name, s->name, reply->str);

    } else if (reply->type != REDIS_REPLY_STRING
               || reply->len != sizeof(s->sha)
               || ngx_strncasecmp((u_char *) reply->str, s->sha,
                                  sizeof(s->sha))
                  != 0)
    {
        ngx_log_error(NGX_LOG_ERR, node->log, 0,
                      "idempotency redis: \"%V\" SCRIPT LOAD of the %s "
                      "script returned an unexpected sha, not %*s",
                      &node->name, s->name, sizeof(s->sha), s->sha);

    } else {
        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, node->log, 0,
                       "idempotency redis: \"%V\" %s script loaded",
                       &node->name, s->name);
    }

    ngx_http_idempotency_redis_handshake_step(node);
}


/* ROLE, sentinel= only: a replica is left, the sentinels asked again */

static void
ngx_http_idempotency_redis_role_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    redisReply                         *reply = r;
    const char                         *error;
    ngx_http_idempotency_redis_node_t  *node;

    node = ac->data;

    if (reply == NULL) {
        ngx_http_idempotency_redis_lost(node, ac, "connection lost");
        return;
    }

    if (node->ac != ac) {
        return;
    }

    error = ngx_http_idempotency_sentinel_role(reply);

    if (error) {
        ngx_http_idempotency_redis_drop(node, "handshake failed", error);
        return;
    }

    ngx_http_idempotency_redis_handshake_step(node);
}


static void
ngx_http_idempotency_redis_handshake_step(
    ngx_http_idempotency_redis_node_t *node)
{
    if (node->handshake) {
        node->handshake--;
    }

    if (node->handshake == 0
        && node->state == NGX_HTTP_IDEMPOTENCY_REDIS_HANDSHAKE)
    {
        ngx_http_idempotency_redis_ready(node);

        /*
         * From a reply callback, where commands may be sent (not from the
         * connect callback: the handshake always has the SCRIPT LOADs, so
         * the connection never gets ready there)
         */

        ngx_http_idempotency_redis_resend_parked(node);
    }
}


ngx_http_idempotency_redis_op_t *
ngx_http_idempotency_redis_script(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_uint_t script, ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log)
{
    ngx_http_idempotency_redis_op_t    *op;
    ngx_http_idempotency_redis_node_t  *node;

    node = ngx_http_idempotency_redis_pick(rcf, key);
    node = ngx_http_idempotency_redis_route(node,
                             script == NGX_HTTP_IDEMPOTENCY_SCRIPT_BODY_GET
                             ? NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK
                             : ngx_http_idempotency_redis_args_size(args,
                                                                    nargs),
                             1);

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

    op = ngx_http_idempotency_redis_op_create(node, script, key, args, nargs,
                                              handler, data, log);
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
ngx_http_idempotency_redis_script_retry(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_uint_t script, ngx_str_t *key,
    ngx_str_t *args, ngx_uint_t nargs, ngx_msec_t deadline,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log)
{
    ngx_http_idempotency_redis_node_t  *node;

    node = ngx_http_idempotency_redis_pick(rcf, key);
    node = ngx_http_idempotency_redis_route(node,
                             ngx_http_idempotency_redis_args_size(args, nargs),
                             0);

    return ngx_http_idempotency_redis_retry_on(node, script, key, args, nargs,
                                               deadline, handler, data, log);
}


static ngx_http_idempotency_redis_op_t *
ngx_http_idempotency_redis_retry_on(ngx_http_idempotency_redis_node_t *node,
    ngx_uint_t script, ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs,
    ngx_msec_t deadline, ngx_http_idempotency_redis_pt handler, void *data,
    ngx_log_t *log)
{
    const char                       *reason;
    ngx_http_idempotency_redis_op_t  *op;

    if (node == NULL || node->exiting) {
        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, log, 0,
                       "idempotency redis: not available");
        return NULL;
    }

    op = ngx_http_idempotency_redis_op_create(node, script, key, args, nargs,
                                              handler, data, log);
    if (op == NULL) {
        return NULL;
    }

    op->retry = 1;
    op->deadline = deadline;

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

        op->info.reason = reason;
        op->state = NGX_HTTP_IDEMPOTENCY_REDIS_OP_DOOMED;
        ngx_queue_insert_tail(&node->doomed, &op->queue);

        op->timer.cancelable = 0;
        ngx_add_timer(&op->timer, 0);
    }

    return op;
}


ngx_int_t
ngx_http_idempotency_redis_store(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *key, ngx_str_t *args, ngx_msec_t deadline,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log,
    ngx_pool_t *pool, u_char **memp, ngx_array_t *more, size_t more_len)
{
    u_char     *p, **block;
    ngx_int_t   rc;
    ngx_str_t   flat[3];
    ngx_uint_t  i;

    rc = ngx_http_idempotency_redis_store_split(rcf, key, args, deadline,
                                                handler, data, pool, memp,
                                                more, more_len);
    if (rc != NGX_DECLINED) {
        return rc;
    }

    if (more && more_len) {

        /* stored whole after all (no node for it now): one copy */

        p = ngx_pnalloc(pool, args[1].len + more_len);
        if (p == NULL) {
            return NGX_ERROR;
        }

        flat[0] = args[0];
        flat[1].data = p;
        flat[2] = args[2];

        p = ngx_cpymem(p, args[1].data, args[1].len);
        block = more->elts;

        for (i = 0; i < more->nelts; i++) {
            p = ngx_cpymem(p, block[i],
                           NGX_HTTP_IDEMPOTENCY_REDIS_BLOCK_LEN(more_len, i));
        }

        flat[1].len = p - flat[1].data;
        args = flat;
    }

    return ngx_http_idempotency_redis_script_retry(rcf,
                                           NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE,
                                           key, args, 3, deadline, handler,
                                           data, log)
           ? NGX_OK : NGX_ERROR;
}


/*
 * The store of a done record with a large body: the body in chunks of its
 * own (plain SETs: Redis keeps the values it read, where a script taking
 * them would copy them again), see upload_t, then the record's head
 * through the store script, which checks that every chunk is there.  The
 * chunks outlive their head by a minute, so that a replay never finds a
 * head without its body.  NGX_DECLINED: not such a record, stored as it
 * is; NGX_ERROR: nothing could be sent.
 */

static ngx_int_t
ngx_http_idempotency_redis_store_split(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *key, ngx_str_t *args, ngx_msec_t deadline,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_pool_t *pool,
    u_char **memp, ngx_array_t *more, size_t more_len)
{
    u_char                               *p, **block;
    size_t                                size, body_len;
    ngx_uint_t                            i, nblocks;
    ngx_int_t                             ttl;
    ngx_str_t                             bkey;
    ngx_http_idempotency_record_t         rec;
    ngx_http_idempotency_redis_node_t    *node;
    ngx_http_idempotency_redis_upload_t  *u;

    node = ngx_http_idempotency_redis_pick(rcf, key);

    /*
     * Without Redis now the chunks are parked as they are made, the body
     * counted against the retry buffer (or given up at once when it is too
     * large to keep), and sent once Redis is back
     */

    if (node == NULL
        || args[1].len < NGX_HTTP_IDEMPOTENCY_REDIS_SPLIT_MIN
        || ngx_http_idempotency_record_parse(args[1].data, args[1].len, &rec)
           != 0
        || rec.state != NGX_HTTP_IDEMPOTENCY_RECORD_DONE
        || rec.body_len < NGX_HTTP_IDEMPOTENCY_REDIS_SPLIT_MIN)
    {
        return NGX_DECLINED;
    }

    nblocks = (more && more_len) ? more->nelts : 0;
    body_len = rec.body_len + (nblocks ? more_len : 0);

    if (nblocks && rec.body_len != NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK) {
        return NGX_DECLINED;
    }

    ttl = ngx_atoi(args[2].data, args[2].len);
    if (ttl == NGX_ERROR) {
        return NGX_DECLINED;
    }

    /*
     * One allocation: the upload, the record key, our in-flight record,
     * the head ("idem1 done " becomes "idem1 split ", the body its
     * length), the TTL, the body key, the body's length and PX
     */

    size = sizeof(ngx_http_idempotency_redis_upload_t)
           + nblocks * sizeof(u_char *)
           + key->len + args[0].len
           + (rec.body - args[1].data) + 1 + NGX_SIZE_T_LEN
           + args[2].len
           + rcf->prefix.len + key->len + rec.owner_len + 8
           + 1 + NGX_SIZE_T_LEN          /* ":<i>" */
           + NGX_SIZE_T_LEN + NGX_INT_T_LEN;

    u = ngx_alloc(size, ngx_cycle->log);
    if (u == NULL) {
        return NGX_DECLINED;
    }

    ngx_memzero(u, sizeof(ngx_http_idempotency_redis_upload_t));

    u->blocks = (u_char **) &u[1];
    p = (u_char *) &u->blocks[nblocks];

    u->info.key.data = p;
    u->info.key.len = key->len;
    p = ngx_cpymem(p, key->data, key->len);

    u->sargs[0].data = p;
    u->sargs[0].len = args[0].len;
    p = ngx_cpymem(p, args[0].data, args[0].len);

    u->sargs[1].data = p;
    p = ngx_cpymem(p, "idem1 split ", sizeof("idem1 split ") - 1);
    p = ngx_cpymem(p, args[1].data + sizeof("idem1 done ") - 1,
                   rec.body - args[1].data - (sizeof("idem1 done ") - 1));
    p = ngx_sprintf(p, "%uz", body_len);
    u->sargs[1].len = p - u->sargs[1].data;

    u->sargs[2].data = p;
    u->sargs[2].len = args[2].len;
    p = ngx_cpymem(p, args[2].data, args[2].len);

    bkey.data = p;

    if (ngx_http_idempotency_redis_body_key(rcf, key, rec.owner,
                                            rec.owner_len, &bkey)
        != NGX_OK)
    {
        ngx_free(u);
        return NGX_DECLINED;
    }

    p += bkey.len + 1 + NGX_SIZE_T_LEN;
    u->bkey = bkey;
    u->sargs[3] = bkey;

    u->chunks = (body_len + NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK - 1)
                / NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK;

    u->sargs[4].data = p;
    p = ngx_sprintf(p, "%ui", u->chunks);
    u->sargs[4].len = p - u->sargs[4].data;

    u->bttl.data = p;
    p = ngx_sprintf(p, "%i", ttl + 60000);
    u->bttl.len = p - u->bttl.data;

    /* the body: taken out of the request's pool, else copied */

    if (pool && memp && *memp
        && ngx_http_idempotency_redis_take(pool, *memp) == NGX_OK)
    {
        u->mem = *memp;
        u->body = (u_char *) rec.body;
        *memp = NULL;

    } else {
        u->mem = ngx_alloc(rec.body_len, ngx_cycle->log);
        if (u->mem == NULL) {
            ngx_free(u);
            return NGX_DECLINED;
        }

        ngx_memcpy(u->mem, rec.body, rec.body_len);
        u->body = u->mem;
    }

    /* the next chunks, in blocks of their own: taken as well, or copied */

    block = nblocks ? more->elts : NULL;

    for (i = 0; i < nblocks; i++) {
        if (ngx_http_idempotency_redis_take(pool, block[i]) == NGX_OK) {
            u->blocks[i] = block[i];

        } else {
            u->blocks[i] = ngx_alloc(NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK,
                                     ngx_cycle->log);
            if (u->blocks[i] == NULL) {
                ngx_http_idempotency_redis_upload_free(u);
                return NGX_ERROR;
            }

            ngx_memcpy(u->blocks[i], block[i],
                       NGX_HTTP_IDEMPOTENCY_REDIS_BLOCK_LEN(more_len, i));
        }

        u->nblocks++;
    }

    if (nblocks) {
        /* the pool has let go of the blocks: the request no longer has them */
        more->nelts = 0;
    }

    u->rcf = rcf;
    u->len = body_len;
    u->deadline = deadline;
    u->handler = handler;
    u->data = data;
    u->info.script = NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE;

    u->node = ngx_http_idempotency_redis_route(node,
                                     NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK,
                                     0);

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                   "idempotency redis: \"%V\" upload:%p of %uz bytes, "
                   "%ui chunks", &u->node->name, u, u->len, u->chunks);

    if (ngx_http_idempotency_redis_upload_next(u) != NGX_OK
        && u->inflight == 0)
    {
        ngx_http_idempotency_redis_upload_free(u);
        return NGX_ERROR;
    }

    /* a chunk that could not be made after the first: tried on a reply */

    return NGX_OK;
}


/*
 * Takes a large block of the pool (from ngx_palloc() and friends) out of
 * it: the pool forgets it, as ngx_pfree() would, without freeing it; it is
 * the caller's to ngx_free() then.  NGX_DECLINED: not a large block of it.
 */

static ngx_int_t
ngx_http_idempotency_redis_take(ngx_pool_t *pool, void *p)
{
    ngx_pool_large_t  *l;

    for (l = pool->large; l; l = l->next) {
        if (l->alloc == p) {
            l->alloc = NULL;
            return NGX_OK;
        }
    }

    return NGX_DECLINED;
}


/* hands chunks to hiredis up to the window; NGX_ERROR: one was not made */

static ngx_int_t
ngx_http_idempotency_redis_upload_next(ngx_http_idempotency_redis_upload_t *u)
{
    size_t                            n;
    ngx_str_t                         ckey, args[3];
    ngx_uint_t                        i;
    ngx_http_idempotency_redis_op_t  *op;

    while (!u->failed
           && u->inflight < NGX_HTTP_IDEMPOTENCY_REDIS_WRITE_WINDOW
           && u->sent < u->len)
    {
        n = ngx_min(u->len - u->sent, NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK);
        i = u->sent / NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK;

        /* "<body key>:<i>", right after the body key (the op copies it) */

        ckey.data = u->bkey.data;
        ckey.len = ngx_sprintf(u->bkey.data + u->bkey.len, ":%uz",
                               u->sent / NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK)
                   - ckey.data;

        args[0].data = (i && u->nblocks) ? u->blocks[i - 1]
                                         : u->body + u->sent;
        args[0].len = n;
        ngx_str_set(&args[1], "PX");
        args[2] = u->bttl;

        op = ngx_http_idempotency_redis_retry_on(u->node,
                                   NGX_HTTP_IDEMPOTENCY_SCRIPT_BODY_SET,
                                   &ckey, args, 3, u->deadline,
                                   ngx_http_idempotency_redis_upload_reply,
                                   u, ngx_cycle->log);
        if (op == NULL) {
            return NGX_ERROR;
        }

        u->inflight++;
        u->sent += n;
    }

    return NGX_OK;
}


static void
ngx_http_idempotency_redis_upload_reply(void *data, redisReply *reply,
    ngx_uint_t rc)
{
    ngx_http_idempotency_redis_upload_t *u = data;

    ngx_http_idempotency_redis_op_t    *op;
    ngx_http_idempotency_redis_node_t  *node;

    u->inflight--;

    if (u->failed) {
        goto done;
    }

    if (rc != NGX_HTTP_IDEMPOTENCY_REDIS_OK) {
        ngx_http_idempotency_redis_upload_fail(u, u->why ? u->why
                                   : "a chunk of its body was given up");
        goto done;
    }

    if (u->charged && reply->type != REDIS_REPLY_ERROR) {
        /* Redis is back: the body no longer waits for it */
        u->charged = 0;
        ngx_http_idempotency_redis_parked_bytes -= u->len;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "idempotency redis: Redis error while storing the "
                      "body of key_hash=%s: %*s",
                      ngx_http_idempotency_key_hash(&u->info.key),
                      (size_t) reply->len, reply->str);
        ngx_http_idempotency_redis_upload_fail(u,
                                   "Redis refused a chunk of its body");
        goto done;
    }

    u->acked++;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                   "idempotency redis: upload:%p chunk %ui of %ui in",
                   u, u->acked, u->chunks);

    if (u->acked < u->chunks) {
        if (ngx_http_idempotency_redis_upload_next(u) != NGX_OK) {
            ngx_http_idempotency_redis_upload_fail(u,
                                   "no memory for a chunk of its body");
        }

        goto done;
    }

    /* the whole body is in: the head, on the key's own connection */

    node = ngx_http_idempotency_redis_pick(u->rcf, &u->info.key);

    op = ngx_http_idempotency_redis_retry_on(node,
                                   NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE,
                                   &u->info.key, u->sargs, 5, u->deadline,
                                   u->handler, u->data, ngx_cycle->log);
    if (op == NULL) {
        ngx_http_idempotency_redis_upload_fail(u,
                                   "its head could not be sent or kept");
        goto done;
    }

    /* its handler hears that the record waited for Redis */
    op->info.parked += u->info.parked;

    /* that op calls the handler now */
    u->handler = NULL;
    u->failed = 1;

done:

    if (u->failed && u->inflight == 0) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                       "idempotency redis: upload:%p done", u);
        ngx_http_idempotency_redis_upload_free(u);
    }
}


static void
ngx_http_idempotency_redis_upload_free(ngx_http_idempotency_redis_upload_t *u)
{
    ngx_uint_t  i;

    if (u->charged) {
        ngx_http_idempotency_redis_parked_bytes -= u->len;
    }

    for (i = 0; i < u->nblocks; i++) {
        ngx_free(u->blocks[i]);
    }

    ngx_free(u->mem);
    ngx_free(u);
}


/* the record is not stored: its handler hears it once */

static void
ngx_http_idempotency_redis_upload_fail(ngx_http_idempotency_redis_upload_t *u,
    const char *reason)
{
    ngx_http_idempotency_redis_pt  handler;

    u->failed = 1;
    u->info.reason = reason;

    if (u->info.error == NULL) {
        u->info.error = reason;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                   "idempotency redis: upload:%p failed: %s", u, reason);

    handler = u->handler;
    u->handler = NULL;

    if (handler) {
        handler(u->data ? u->data : &u->info, NULL,
                NGX_HTTP_IDEMPOTENCY_REDIS_ERROR);
    }
}


ngx_int_t
ngx_http_idempotency_redis_body_key(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *key, const u_char *owner, size_t owner_len, ngx_str_t *out)
{
    u_char  *p, *open, *close;

    open = ngx_strlchr(key->data, key->data + key->len, '{');
    close = open ? ngx_strlchr(open + 1, key->data + key->len, '}') : NULL;

    p = out->data;

    if (open == NULL
        && ngx_strlchr(key->data, key->data + key->len, '}') == NULL)
    {
        p = ngx_cpymem(p, rcf->prefix.data, rcf->prefix.len);
        *p++ = '{';
        p = ngx_cpymem(p, key->data, key->len);
        *p++ = '}';

    } else if (close && close > open + 1) {
        p = ngx_cpymem(p, key->data, key->len);

    } else {
        return NGX_DECLINED;
    }

    p = ngx_cpymem(p, ":body:", sizeof(":body:") - 1);
    p = ngx_cpymem(p, owner, owner_len);

    out->len = p - out->data;

    return NGX_OK;
}


ngx_int_t
ngx_http_idempotency_redis_fetch(ngx_http_idempotency_redis_fetch_t *f)
{
    ngx_str_t  ckey;

    /* "<body key>:<i>", in the room after the body key (the op copies it) */

    ckey.data = f->key.data;
    ckey.len = ngx_sprintf(f->key.data + f->key.len, ":%uz",
                           f->done / NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK)
               - ckey.data;

    *f->opp = ngx_http_idempotency_redis_script(f->rcf,
                                  NGX_HTTP_IDEMPOTENCY_SCRIPT_BODY_GET,
                                  &ckey, NULL, 0,
                                  ngx_http_idempotency_redis_fetch_reply, f,
                                  f->log);

    return *f->opp ? NGX_OK : NGX_ERROR;
}


static void
ngx_http_idempotency_redis_fetch_reply(void *data, redisReply *reply,
    ngx_uint_t rc)
{
    ngx_http_idempotency_redis_fetch_t *f = data;

    size_t  n;

    *f->opp = NULL;

    if (rc != NGX_HTTP_IDEMPOTENCY_REDIS_OK) {
        f->handler(f, rc);
        return;
    }

    n = ngx_min(f->len - f->done, NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK);

    if (reply->type != REDIS_REPLY_STRING || (size_t) reply->len != n) {
        ngx_log_error(NGX_LOG_ERR, f->log, 0,
                      "idempotency redis: the body of the record "
                      "key_hash=%s is missing or short (%uz of %uz bytes "
                      "at %uz), not replayed",
                      ngx_http_idempotency_key_hash(&f->key),
                      reply->type == REDIS_REPLY_STRING
                      ? (size_t) reply->len : 0, n, f->done);
        f->handler(f, NGX_HTTP_IDEMPOTENCY_REDIS_ERROR);
        return;
    }

    ngx_memcpy(f->buf + (f->done - f->base), reply->str, n);
    f->done += n;

    if (f->done == f->len) {
        f->handler(f, NGX_HTTP_IDEMPOTENCY_REDIS_OK);
        return;
    }

    if (ngx_http_idempotency_redis_fetch(f) != NGX_OK) {
        f->handler(f, NGX_HTTP_IDEMPOTENCY_REDIS_ERROR);
    }
}


static ngx_http_idempotency_redis_op_t *
ngx_http_idempotency_redis_op_create(ngx_http_idempotency_redis_node_t *node,
    ngx_uint_t script, ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log)
{
    u_char                               *p;
    size_t                                reserve, size;
    ngx_uint_t                            i;
    ngx_http_idempotency_redis_op_t      *op;
    ngx_http_idempotency_redis_script_t  *s;

    if (script >= NGX_HTTP_IDEMPOTENCY_SCRIPT_N) {
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "idempotency redis: unknown script %ui", script);
        return NULL;
    }

    s = &ngx_http_idempotency_redis_scripts[script];

    /*
     * One allocation: the op, room for the longest header (EVAL with the
     * script text), then key and args RESP-encoded once.  The tail stays
     * until the op is done, so that a NOSCRIPT can be resent as EVAL and a
     * retryable op can be resent after a reconnect, without copying.
     */

    reserve = NGX_HTTP_IDEMPOTENCY_REDIS_PREFIX_LEN + s->len
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
                   ngx_http_idempotency_redis_scripts[op->info.script].name,
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
ngx_http_idempotency_redis_connections(ngx_http_idempotency_redis_conn_t *out,
    ngx_uint_t n)
{
    ngx_uint_t                           i, j, count;
    ngx_http_idempotency_redis_conf_t  **rcfp;
    ngx_http_idempotency_redis_node_t   *node;
    ngx_http_idempotency_main_conf_t    *imcf;

    imcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_idempotency_module);

    if (imcf == NULL || imcf->redis.nelts == 0) {
        return 0;
    }

    rcfp = imcf->redis.elts;
    count = 0;

    for (i = 0; i < imcf->redis.nelts; i++) {

        for (j = 0; j < 2; j++) {
            node = j ? rcfp[i]->bulk : rcfp[i]->node;

            if (node == NULL) {
                continue;
            }

            if (count < n) {
                out[count].name = &node->name;
                out[count].bulk = node->bulk;
                out[count].ready =
                          (node->state == NGX_HTTP_IDEMPOTENCY_REDIS_READY);
                out[count].in_flight = node->pending;
                out[count].in_flight_bytes = node->queued;
                out[count].commands = node->queued_seq;
                out[count].stats = node->stats;
            }

            count++;
        }
    }

    return count;
}


ngx_http_idempotency_redis_stats_t *
ngx_http_idempotency_redis_stats(ngx_http_idempotency_redis_conf_t *rcf)
{
    return rcf->node ? &rcf->node->stats : NULL;
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

    if (op->state == NGX_HTTP_IDEMPOTENCY_REDIS_OP_PARKED) {
        left = (ngx_msec_int_t) (op->deadline - ngx_current_msec);

        if (left <= 0) {
            ngx_http_idempotency_redis_give_up(op, "its deadline passed");
            return;
        }

        if (node->state == NGX_HTTP_IDEMPOTENCY_REDIS_READY
            && ngx_http_idempotency_redis_op_send(op) == NGX_OK)
        {
            node->stats.retried++;
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

            ngx_http_idempotency_redis_drop(node, "command failed",
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

        ngx_http_idempotency_redis_drop(node, "command failed",
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
        ngx_http_idempotency_redis_lost(op->node, ac, "connection lost");

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
        && op->node->conf->cluster
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
     * Behind sentinels, a server that stopped being the master: the
     * connection is dropped (the next one asks the sentinels), and a
     * retryable op waits for it
     */

    if (op->node->sentinel && reply->type == REDIS_REPLY_ERROR) {
        error = ngx_http_idempotency_sentinel_demoted(reply);

        if (error) {
            ngx_http_idempotency_redis_drop(op->node, "command failed",
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

    ngx_http_idempotency_redis_op_finish(op, reply,
                                         NGX_HTTP_IDEMPOTENCY_REDIS_OK);
}


/*
 * A large command goes on the bulk connection of its Redis, connected now
 * if it is not; with "ready", only if that connection can take it at once
 * (a plain command fails fast without a connection: it uses the first one
 * then).
 */

static size_t
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


static ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_redis_route(ngx_http_idempotency_redis_node_t *node,
    size_t size, ngx_uint_t ready)
{
    ngx_http_idempotency_redis_node_t  *bulk;

    if (node == NULL || node->conf->bulk == NULL
        || node != node->conf->node)
    {
        return node;
    }

    if (size < NGX_HTTP_IDEMPOTENCY_REDIS_BULK_MIN) {
        return node;
    }

    bulk = node->conf->bulk;

    if (bulk->exiting) {
        return node;
    }

    if (bulk->ac == NULL && !bulk->reconnect_timer.timer_set) {
        ngx_http_idempotency_redis_connect(bulk);
    }

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

    ngx_add_timer(&op->timer, node->conf->timeout + extra);

    /* the handshake's replies come first, but its writes are shared */

    if (node->state != NGX_HTTP_IDEMPOTENCY_REDIS_READY
        && node->connect_timer.timer_set)
    {
        ngx_add_timer(&node->connect_timer,
                      node->conf->connect_timeout + extra);
    }
}


/* where a command for this record key goes */

static ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_redis_pick(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *key)
{
    if (rcf->cluster) {
        return ngx_http_idempotency_cluster_node(rcf->cluster, key);
    }

    return rcf->node;
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

    node = ngx_http_idempotency_cluster_redirect(op->node->conf->cluster,
                                                 op->node, reply->str,
                                                 reply->len, &asking);
    if (node == NULL) {
        return NGX_DECLINED;
    }

    if (op->redirects == NGX_HTTP_IDEMPOTENCY_REDIS_REDIRECTS_MAX) {
        ngx_log_error(NGX_LOG_ERR, op->node->log, 0,
                      "idempotency redis: \"%V\" %s of key_hash=%s not "
                      "redirected again after %ui redirects: \"%*s\"",
                      &op->node->name,
                      ngx_http_idempotency_redis_scripts[op->info.script].name,
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


void
ngx_http_idempotency_redis_node_connect(ngx_http_idempotency_redis_node_t *node)
{
    if (node->exiting || node->ac || node->reconnect_timer.timer_set) {
        return;
    }

    ngx_http_idempotency_redis_connect(node);
}


redisAsyncContext *
ngx_http_idempotency_redis_node_context(ngx_http_idempotency_redis_node_t *node)
{
    if (node->exiting || node->ac == NULL
        || (node->ac->c.flags & (REDIS_DISCONNECTING | REDIS_FREEING)))
    {
        return NULL;
    }

    return node->ac;
}


ngx_str_t *
ngx_http_idempotency_redis_node_name(ngx_http_idempotency_redis_node_t *node)
{
    return &node->name;
}


/*
 * Redis Cluster: the slot map changed.  Parked ops whose record now lives
 * on another master (after a failover, the old one may never come back)
 * move there: sent now if it has a connection, else parked there.
 */

void
ngx_http_idempotency_redis_node_reroute(
    ngx_http_idempotency_redis_node_t *node)
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

        target = ngx_http_idempotency_cluster_owner(node->conf->cluster,
                                                    &op->info.key);

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
            target->stats.retried++;
            continue;
        }

        /* the handler may park new ops here: "next" is still in the queue */

        reason = ngx_http_idempotency_redis_park(op, op->info.error
                                                     ? op->info.error
                                                     : "not connected", 0);
        if (reason) {
            ngx_http_idempotency_redis_give_up(op, reason);
        }
    }
}


/* the op's hiredis callback has come: hiredis holds it no more */

static void
ngx_http_idempotency_redis_op_detach(ngx_http_idempotency_redis_op_t *op)
{
    if (op->timer.timer_set) {
        ngx_del_timer(&op->timer);
    }

    op->node->pending--;
    op->node->queued -= op->wire;
    op->wire = 0;
    op->state = NGX_HTTP_IDEMPOTENCY_REDIS_OP_NEW;
}


static void
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

static const char *
ngx_http_idempotency_redis_park(ngx_http_idempotency_redis_op_t *op,
    const char *error, ngx_msec_t retry)
{
    size_t                                max, size;
    ngx_str_t                            *key;
    const char                           *name, *reason;
    ngx_msec_int_t                        left;
    ngx_http_idempotency_redis_node_t    *node;
    ngx_http_idempotency_redis_upload_t  *u;

    node = op->node;
    op->info.error = error;

    /*
     * A chunk of a split record's body stands for the record: the whole
     * body waits for Redis, and the lines name the record's store
     */

    u = ngx_http_idempotency_redis_upload_of(op);

    if (u) {
        u->info.error = error;
        u->info.attempts = op->info.attempts;
        size = u->charged ? 0 : u->len;
        name = "store";
        key = &u->info.key;

    } else {
        size = op->size;
        name = ngx_http_idempotency_redis_scripts[op->info.script].name;
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
        ngx_http_idempotency_redis_parked_bytes += u->len;
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


/* takes a PARKED op out of the queue and the counters; its state is kept */

static void
ngx_http_idempotency_redis_unpark(ngx_http_idempotency_redis_op_t *op)
{
    ngx_http_idempotency_redis_node_t  *node;

    node = op->node;

    ngx_queue_remove(&op->queue);

    node->stats.parked--;
    node->stats.parked_bytes -= op->size;

    if (ngx_http_idempotency_redis_upload_of(op) == NULL) {
        ngx_http_idempotency_redis_parked_bytes -= op->size;
    }
}


/* the upload whose chunk the op is, or NULL */

static ngx_http_idempotency_redis_upload_t *
ngx_http_idempotency_redis_upload_of(ngx_http_idempotency_redis_op_t *op)
{
    return (op->info.script == NGX_HTTP_IDEMPOTENCY_SCRIPT_BODY_SET
            && op->data != NULL)
           ? op->data : NULL;
}


/* an op that was parked is done (replied, given up or cancelled) */

static void
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

static void
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

static void
ngx_http_idempotency_redis_give_up(ngx_http_idempotency_redis_op_t *op,
    const char *reason)
{
    ngx_http_idempotency_redis_pt         handler;
    ngx_http_idempotency_redis_node_t    *node;
    ngx_http_idempotency_redis_upload_t  *u;

    node = op->node;

    node->stats.given_up++;
    ngx_http_idempotency_stat_inc(NGX_HTTP_IDEMPOTENCY_STAT_REDIS_GIVEN_UP);

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

    u = ngx_http_idempotency_redis_upload_of(op);

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
        handler(op->data, NULL, NGX_HTTP_IDEMPOTENCY_REDIS_ERROR);
    }

    ngx_http_idempotency_redis_unkeep(op);
    ngx_free(op);

    ngx_http_idempotency_redis_drained(node);
}


/* the connection is ready again: parked ops go first, in order */

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

        node->stats.retried++;
        ngx_http_idempotency_redis_unpark(op);
    }
}


static const char *
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


/*
 * Puts "*N EVALSHA <sha> 1", "*N EVAL <text> 1" or, for the claim, "*N SET"
 * right in front of the encoded key and args, so the whole command is one
 * contiguous buffer.
 */

static u_char *
ngx_http_idempotency_redis_frame(ngx_http_idempotency_redis_op_t *op,
    ngx_uint_t eval, size_t *len)
{
    u_char                               *p, *start;
    size_t                                n, blen;
    const char                           *cmd;
    const u_char                         *body;
    ngx_http_idempotency_redis_script_t  *s;
    u_char             pre[NGX_HTTP_IDEMPOTENCY_REDIS_PREFIX_LEN];

    s = &ngx_http_idempotency_redis_scripts[op->info.script];

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


ngx_connection_t *
ngx_http_idempotency_redis_attach(redisAsyncContext *ac, ngx_log_t *log)
{
    ngx_connection_t  *c;

    c = ngx_get_connection(ac->c.fd, log);
    if (c == NULL) {
        return NULL;
    }

    c->data = ac;
    c->read->handler = ngx_http_idempotency_redis_read_handler;
    c->write->handler = ngx_http_idempotency_redis_write_handler;
    c->read->log = log;
    c->write->log = log;
    c->number = ngx_atomic_fetch_add(ngx_connection_counter, 1);

    /* hooks first: setting the connect callback already asks for write */

    ac->ev.data = c;
    ac->ev.addRead = ngx_http_idempotency_redis_add_read;
    ac->ev.delRead = ngx_http_idempotency_redis_del_read;
    ac->ev.addWrite = ngx_http_idempotency_redis_add_write;
    ac->ev.delWrite = ngx_http_idempotency_redis_del_write;
    ac->ev.cleanup = ngx_http_idempotency_redis_cleanup;

    return c;
}


/* hiredis event hooks: privdata is ac->ev.data, the nginx connection */

static void
ngx_http_idempotency_redis_add_read(void *privdata)
{
    ngx_connection_t  *c = privdata;

    if (c == NULL || c->read->active) {
        return;
    }

    if (ngx_add_event(c->read, NGX_READ_EVENT,
                      NGX_HTTP_IDEMPOTENCY_REDIS_EVENT_FLAGS)
        != NGX_OK)
    {
        /* nothing to return to hiredis; the op timers notice the stall */
        ngx_log_error(NGX_LOG_ALERT, c->log, 0,
                      "idempotency redis: adding read event failed");
    }
}


static void
ngx_http_idempotency_redis_del_read(void *privdata)
{
    ngx_connection_t  *c = privdata;

    if (c == NULL || !c->read->active) {
        return;
    }

    if (ngx_del_event(c->read, NGX_READ_EVENT,
                      NGX_HTTP_IDEMPOTENCY_REDIS_EVENT_FLAGS)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, c->log, 0,
                      "idempotency redis: deleting read event failed");
    }
}


/*
 * hiredis asks for a write with every command it queues.  On a connected
 * socket the write is posted to the next pass of the event loop (whose
 * epoll_wait() does not wait when something is posted there): one write(2)
 * then carries every command queued by the events of this pass and of the
 * next one, and no epoll_ctl(2) is needed to learn that the socket can be
 * written to.  The socket's write event is asked for only while connecting,
 * or when what is queued did not fit in the socket: hiredis asks again
 * from within the write handler.
 */

static void
ngx_http_idempotency_redis_add_write(void *privdata)
{
    ngx_connection_t   *c = privdata;
    redisAsyncContext  *ac;

    if (c == NULL || c->write->active || c->write->posted) {
        return;
    }

    ac = c->data;

    if (c != ngx_http_idempotency_redis_writing
        && (ac->c.flags & REDIS_CONNECTED))
    {
        ngx_post_event(c->write, &ngx_posted_next_events);
        return;
    }

    if (ngx_add_event(c->write, NGX_WRITE_EVENT,
                      NGX_HTTP_IDEMPOTENCY_REDIS_EVENT_FLAGS)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, c->log, 0,
                      "idempotency redis: adding write event failed");
    }
}


static void
ngx_http_idempotency_redis_del_write(void *privdata)
{
    ngx_connection_t  *c = privdata;

    if (c == NULL) {
        return;
    }

    if (c->write->posted) {
        ngx_delete_posted_event(c->write);
    }

    if (!c->write->active) {
        return;
    }

    if (ngx_del_event(c->write, NGX_WRITE_EVENT,
                      NGX_HTTP_IDEMPOTENCY_REDIS_EVENT_FLAGS)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, c->log, 0,
                      "idempotency redis: deleting write event failed");
    }
}


/*
 * Called by hiredis while it frees the context, before redisFree().  The
 * fd is closed here, once, through nginx; hiredis is told it has none left
 * so that it does not close it again (by then the number may belong to
 * another socket).  Safe to call twice, as hiredis 1.x may.
 */

static void
ngx_http_idempotency_redis_cleanup(void *privdata)
{
    ngx_connection_t   *c = privdata;
    redisAsyncContext  *ac;

    if (c == NULL) {
        return;
    }

    ac = c->data;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "idempotency redis: close fd:%d", c->fd);

    ngx_close_connection(c);

    ac->c.fd = -1;
    ac->ev.data = NULL;
}


static void
ngx_http_idempotency_redis_read_handler(ngx_event_t *rev)
{
    ngx_connection_t                   *c;
    redisAsyncContext                  *ac;
    ngx_http_idempotency_redis_node_t  *node;

    c = rev->data;
    ac = c->data;
    node = ac->data;

    if (c->close) {
        /* worker_shutdown_timeout expired: nginx closes what is left */

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, node->log, 0,
                       "idempotency redis: \"%V\" closed by shutdown",
                       &node->name);

        if (node->ac == ac) {
            ngx_http_idempotency_redis_close(node);

        } else {
            redisAsyncFree(ac);
        }

        return;
    }

    if (node->ac == ac) {
        node->last_read = ngx_current_msec;
    }

    /* one chunk of at most 16 KiB; see EVENT_FLAGS for the rest */

    redisAsyncHandleRead(ac);
}


static void
ngx_http_idempotency_redis_write_handler(ngx_event_t *wev)
{
    ngx_connection_t  *c;

    c = wev->data;

    ngx_http_idempotency_redis_writing = c;
    redisAsyncHandleWrite(c->data);
    ngx_http_idempotency_redis_writing = NULL;
}


/* the same for a node's data connection, which also counts what is out */

static void
ngx_http_idempotency_redis_node_write_handler(ngx_event_t *wev)
{
    ngx_connection_t                   *c;
    redisAsyncContext                  *ac;
    ngx_http_idempotency_redis_node_t  *node;

    c = wev->data;
    ac = c->data;
    node = ac->data;

    ngx_http_idempotency_redis_writing = c;
    redisAsyncHandleWrite(ac);
    ngx_http_idempotency_redis_writing = NULL;

    /* every command handed to hiredis so far is on its way to Redis */

    if (node->ac == ac && ac->c.obuf && sdslen(ac->c.obuf) == 0) {
        node->flushed_seq = node->queued_seq;
    }
}
