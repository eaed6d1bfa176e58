/*
 * Per-worker Redis connections driven by nginx's event loop (hiredis async).
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>


#define NGX_HTTP_IDEMPOTENCY_REDIS_SINGLE    0
#define NGX_HTTP_IDEMPOTENCY_REDIS_CLUSTER   1
#define NGX_HTTP_IDEMPOTENCY_REDIS_SENTINEL  2

/* outcome passed to an op's handler */
#define NGX_HTTP_IDEMPOTENCY_REDIS_OK        0   /* reply is set */
#define NGX_HTTP_IDEMPOTENCY_REDIS_ERROR     1   /* no connection, lost */
#define NGX_HTTP_IDEMPOTENCY_REDIS_TIMEOUT   2   /* no reply in time */


typedef enum {
    NGX_HTTP_IDEMPOTENCY_SCRIPT_CLAIM = 0,
    NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE,
    NGX_HTTP_IDEMPOTENCY_SCRIPT_RELEASE,
    NGX_HTTP_IDEMPOTENCY_SCRIPT_RENEW,
    NGX_HTTP_IDEMPOTENCY_SCRIPT_INSPECT,
    NGX_HTTP_IDEMPOTENCY_SCRIPT_PURGE,
    NGX_HTTP_IDEMPOTENCY_SCRIPT_BODY_SET,   /* SET <chunk key> <chunk> PX */
    NGX_HTTP_IDEMPOTENCY_SCRIPT_BODY_GET,   /* GET <chunk key> */
    NGX_HTTP_IDEMPOTENCY_SCRIPT_N
} ngx_http_idempotency_script_e;


/*
 * A stored body of at least this many bytes lives apart from its record
 * (the record is then "split"): a claim that finds the record gets its
 * head only.  The body is kept in chunks of CHUNK bytes (the last one
 * shorter), each a string of its own, "<body key>:0", "<body key>:1" ...:
 * written and read one command per chunk, so that neither the worker nor
 * Redis ever handles all of a large body in one piece (a string grown to
 * 60 MB in place would have Redis copy or zero-fill it at once, serving
 * no one meanwhile).  Part of the stored format.
 */
#define NGX_HTTP_IDEMPOTENCY_REDIS_SPLIT_MIN  (16 * 1024)
#define NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK      (1024 * 1024)

/* chunks a store has queued in hiredis at once: the next when one is in */
#define NGX_HTTP_IDEMPOTENCY_REDIS_WRITE_WINDOW  2


typedef struct ngx_http_idempotency_redis_node_s
    ngx_http_idempotency_redis_node_t;
typedef struct ngx_http_idempotency_redis_op_s
    ngx_http_idempotency_redis_op_t;
typedef struct ngx_http_idempotency_cluster_s
    ngx_http_idempotency_cluster_t;


/* one "idempotency_redis" directive; identical directives share one */
typedef struct {
    ngx_str_t                            text;     /* all arguments, for logs */
    ngx_uint_t                           mode;
    ngx_array_t                          addrs;    /* of ngx_addr_t */
    ngx_str_t                            host;     /* IP literal, NUL-ended */
    in_port_t                            port;
    ngx_str_t                            unix_path; /* NUL-ended, or empty */
    ngx_str_t                            sentinel_master;
    ngx_str_t                            sentinel_user;
    ngx_str_t                            sentinel_password;
    ngx_int_t                            db;       /* -1: no SELECT */
    ngx_str_t                            user;
    ngx_str_t                            password;
    ngx_msec_t                           connect_timeout;
    ngx_msec_t                           timeout;
    ngx_str_t                            prefix;

    /* per-worker state, set up in init_process (memory is per process) */
    ngx_http_idempotency_redis_node_t   *node;
    ngx_http_idempotency_redis_node_t   *bulk;     /* large commands */
    ngx_http_idempotency_cluster_t      *cluster;  /* "cluster" only */
} ngx_http_idempotency_redis_conf_t;


/*
 * What an op knows about itself.  A handler whose op was created with
 * data == NULL gets a pointer to this as its data (the key is the first
 * member, so it may be read as an ngx_str_t * as well).
 */
typedef struct {
    ngx_str_t                            key;      /* KEYS[1], the op's copy */
    ngx_uint_t                           script;
    ngx_uint_t                           attempts; /* times sent to Redis */
    ngx_uint_t                           parked;   /* times kept for a retry */
    const char                          *error;    /* last failure, or NULL */
    const char                          *reason;   /* why it was given up */
} ngx_http_idempotency_redis_info_t;


/*
 * Counters of one Redis address in this worker, for logs and metrics.
 * "Parked" ops are retryable commands kept in the worker while Redis cannot
 * be reached, waiting to be sent again.
 */
typedef struct {
    ngx_uint_t                           parked;       /* now */
    size_t                               parked_bytes; /* now */
    ngx_uint_t                           retried;      /* resends, in total */
    ngx_uint_t                           given_up;     /* in total */
} ngx_http_idempotency_redis_stats_t;


/*
 * Called exactly once per op, unless the op was cancelled before or the
 * worker exits with a plain (not retryable) op pending: with
 * rc == NGX_HTTP_IDEMPOTENCY_REDIS_OK and the reply (which hiredis frees
 * right after the call: copy what you keep, or take a string reply's str,
 * setting it to NULL, and free() it yourself: the claim does so for a HIT),
 * or with another rc and reply == NULL.  The handler may issue new
 * commands.
 */
typedef void (*ngx_http_idempotency_redis_pt)(void *data, redisReply *reply,
    ngx_uint_t rc);


int ngx_http_idempotency_redis_auth_args(ngx_str_t *user,
    ngx_str_t *password, const char **argv, size_t *argvlen);
ngx_int_t ngx_http_idempotency_redis_init_process(ngx_cycle_t *cycle);
void ngx_http_idempotency_redis_exit_process(ngx_cycle_t *cycle);

/*
 * Runs one of the module's commands with KEYS[1] = key and ARGV = args[0 ..
 * nargs - 1], each sent as a separate binary-safe argument: the claim is the
 * native "SET key args..." (SET NX GET PX), the others are embedded scripts
 * (EVALSHA, falling back to EVAL on NOSCRIPT).  The arguments are copied
 * before the call returns.  Returns NULL (and calls nothing) when the
 * command cannot be queued now, e.g. while Redis is unreachable; the caller
 * applies its failure policy at once.  With data NULL the handler gets the
 * op's own ngx_http_idempotency_redis_info_t (key first) as its data, for
 * fire-and-forget commands that outlive their request and only need the key
 * to log.
 */
ngx_http_idempotency_redis_op_t *ngx_http_idempotency_redis_script(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_uint_t script, ngx_str_t *key,
    ngx_str_t *args, ngx_uint_t nargs, ngx_http_idempotency_redis_pt handler,
    void *data, ngx_log_t *log);

/*
 * The same for a command that must not be lost to a passing Redis outage
 * (the settle step's STORE and RELEASE, which the scripts make safe to run
 * twice).  When the connection is lost or a reply does not come in time, or
 * when there is no connection at the call, the op is kept in the worker
 * ("parked") and sent again, in order, once the connection is ready again;
 * a transient error reply (LOADING, BUSY, TRYAGAIN, MASTERDOWN, CLUSTERDOWN,
 * NOREPLICAS) sends it again after a back-off; behind sentinels, READONLY,
 * LOADING and MASTERDOWN keep it for the next master instead.  It is given
 * up, with its handler called with NGX_HTTP_IDEMPOTENCY_REDIS_ERROR and
 * info->reason set, when "deadline" (an ngx_current_msec value) passes
 * while it is parked, when keeping it would exceed the worker's retry
 * buffer, or when the worker exits.  Other error replies and every reply
 * go to the handler as usual.
 * The handler is never called from inside this function, and is called at
 * worker exit too: it must not rely on a request (use data == NULL).
 * Returns NULL (and calls nothing) only when no op can be made at all: no
 * memory, no Redis for this configuration, or the worker is exiting.
 */
ngx_http_idempotency_redis_op_t *ngx_http_idempotency_redis_script_retry(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_uint_t script, ngx_str_t *key,
    ngx_str_t *args, ngx_uint_t nargs, ngx_msec_t deadline,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log);

/*
 * The settle step's STORE (args and the rest as for script_retry with
 * NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE).  args[1], the complete record, lies
 * in *memp, a block of "pool" from ngx_pnalloc(): when the record is split
 * (a large body), its body is written from that block, in chunks, and the
 * block is taken out of the pool instead of copied (*memp is then set to
 * NULL; the adapter frees the block when the store is done).  The head is
 * stored once every chunk is in Redis.  "more", when not NULL, holds the
 * rest of the body (more_len bytes) in blocks of "pool" of
 * NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK bytes each (u_char *), the body in
 * args[1] then being one chunk exactly: they are its next chunks, taken
 * out of the pool as well.  NGX_ERROR: nothing was sent or kept (as NULL
 * from script_retry); the handler is then never called.
 */
ngx_int_t ngx_http_idempotency_redis_store(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *key, ngx_str_t *args,
    ngx_msec_t deadline, ngx_http_idempotency_redis_pt handler, void *data,
    ngx_log_t *log, ngx_pool_t *pool, u_char **memp, ngx_array_t *more,
    size_t more_len);

/*
 * Reads bytes "done" to "len" of the split body "key" (from its chunks)
 * into "buf", whose first byte is byte "base" of the body, one GET per
 * chunk, one command at a time (Redis serves everyone else between two),
 * on the bulk connection when it is up.  key.data has room for
 * NGX_SIZE_T_LEN + 1 more bytes (the chunk's number).
 * *opp is always the op in progress, for ngx_http_idempotency_redis_cancel;
 * the handler is called once, unless cancelled, with
 * NGX_HTTP_IDEMPOTENCY_REDIS_OK when all of it is in buf.  NGX_ERROR: no
 * command could be sent, nothing will be called.
 */
typedef struct ngx_http_idempotency_redis_fetch_s
    ngx_http_idempotency_redis_fetch_t;

typedef void (*ngx_http_idempotency_redis_fetch_pt)(
    ngx_http_idempotency_redis_fetch_t *f, ngx_uint_t rc);

struct ngx_http_idempotency_redis_fetch_s {
    ngx_http_idempotency_redis_conf_t   *rcf;
    ngx_str_t                            key;
    u_char                              *buf;      /* byte "base" goes first */
    size_t                               base;     /* a multiple of CHUNK */
    size_t                               len;      /* up to this byte */
    size_t                               done;     /* from this byte */
    ngx_http_idempotency_redis_op_t    **opp;
    ngx_http_idempotency_redis_fetch_pt  handler;
    void                                *data;
    ngx_log_t                           *log;
};

ngx_int_t ngx_http_idempotency_redis_fetch(
    ngx_http_idempotency_redis_fetch_t *f);

/*
 * The key of a split record's body (the name its chunks start with, see
 * NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK): "<key>:body:<owner>" when the key has
 * a hash tag, "<prefix>{<key>}:body:<owner>" when it has no brace at all,
 * so that it is in the key's Redis Cluster slot either way and starts with
 * the prefix (ACL key patterns).  NGX_DECLINED for a key with braces but
 * no hash tag (its record is never split).  out->data needs prefix, key
 * and owner lengths plus 8 bytes.
 */
ngx_int_t ngx_http_idempotency_redis_body_key(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *key,
    const u_char *owner, size_t owner_len, ngx_str_t *out);

/* the handler will not be called for this op; safe on any live op */
void ngx_http_idempotency_redis_cancel(ngx_http_idempotency_redis_op_t *op);

/*
 * Wraps the socket of a new hiredis context in an nginx connection and
 * hooks hiredis to its events (level-triggered); the caller sets ac->data
 * and may replace the read handler.  NULL: no free worker connection.
 */
ngx_connection_t *ngx_http_idempotency_redis_attach(redisAsyncContext *ac,
    ngx_log_t *log);

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
} ngx_http_idempotency_redis_conn_t;

/*
 * This worker's connections (Redis Cluster nodes are not among them): up
 * to n into out; returns how many there are.
 */
ngx_uint_t ngx_http_idempotency_redis_connections(
    ngx_http_idempotency_redis_conn_t *out, ngx_uint_t n);

/* this worker's counters for that Redis, or NULL without a connection */
ngx_http_idempotency_redis_stats_t *ngx_http_idempotency_redis_stats(
    ngx_http_idempotency_redis_conf_t *rcf);


/*
 * Connections to one Redis node each, for ngx_http_idempotency_cluster.c:
 * a node made with the first function connects (and reconnects) by itself
 * and is closed by the last one at worker exit.  host is an IP literal,
 * NUL-ended, that must live as long as the node.
 */
ngx_http_idempotency_redis_node_t *ngx_http_idempotency_redis_node_create(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *host, in_port_t port,
    ngx_pool_t *pool, ngx_log_t *log);
void ngx_http_idempotency_redis_node_connect(
    ngx_http_idempotency_redis_node_t *node);
/* the node's context if commands can be queued on it now, or NULL */
redisAsyncContext *ngx_http_idempotency_redis_node_context(
    ngx_http_idempotency_redis_node_t *node);
ngx_str_t *ngx_http_idempotency_redis_node_name(
    ngx_http_idempotency_redis_node_t *node);
void ngx_http_idempotency_redis_node_exit(
    ngx_http_idempotency_redis_node_t *node);
/* parked ops whose key's slot is now another node's go there */
void ngx_http_idempotency_redis_node_reroute(
    ngx_http_idempotency_redis_node_t *node);


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_H_INCLUDED_ */
