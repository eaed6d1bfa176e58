/*
 * The records layer: the module's commands in record terms (claim, store
 * whole or split, release, renew, inspect, purge, fetch a split body), the
 * Lua scripts and the chunk keys.  What the HTTP side calls, and the only
 * Redis header it includes (its types are the ops layer's, from the
 * headers included here); built on the ops layer and the layers below it.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_redis_ops.h"
#include "ngx_http_idempotency_redis_sub.h"


typedef enum {
    NGX_HTTP_IDEMPOTENCY_SCRIPT_CLAIM = 0,
    NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE,
    NGX_HTTP_IDEMPOTENCY_SCRIPT_RELEASE,
    NGX_HTTP_IDEMPOTENCY_SCRIPT_RENEW,
    NGX_HTTP_IDEMPOTENCY_SCRIPT_INSPECT,
    NGX_HTTP_IDEMPOTENCY_SCRIPT_PURGE,
    NGX_HTTP_IDEMPOTENCY_SCRIPT_BODY_SET,   /* SET <chunk key> <chunk> PX */
    NGX_HTTP_IDEMPOTENCY_SCRIPT_BODY_GET,   /* GET <chunk key> */
    NGX_HTTP_IDEMPOTENCY_SCRIPT_CACHE_FETCH, /* record and PTTL (cache) */
    NGX_HTTP_IDEMPOTENCY_SCRIPT_WAIT_MARK,  /* SET <wait mark> <hash> PX */
    NGX_HTTP_IDEMPOTENCY_SCRIPT_WAIT_WAKE,  /* the mark's waiters: PUBLISH */
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

/*
 * The store script's replies (src/lua/store.lua): stored, or why not.  A
 * refused split store has removed its chunks.
 */
#define NGX_HTTP_IDEMPOTENCY_STORE_GONE      0   /* no record at the key */
#define NGX_HTTP_IDEMPOTENCY_STORE_DONE      1
#define NGX_HTTP_IDEMPOTENCY_STORE_TAKEN     2   /* another request's */
#define NGX_HTTP_IDEMPOTENCY_STORE_NO_BODY   3   /* a chunk is missing */

/* chunks a store has queued in hiredis at once: the next when one is in */
#define NGX_HTTP_IDEMPOTENCY_REDIS_WRITE_WINDOW  2


/*
 * At worker start and exit: the connections to the Redis servers of
 * "redis", an array of ngx_http_idempotency_redis_conf_t * (NULL: none).
 */
ngx_int_t ngx_http_idempotency_redis_init_process(ngx_cycle_t *cycle,
    ngx_array_t *redis);
void ngx_http_idempotency_redis_exit_process(ngx_cycle_t *cycle,
    ngx_array_t *redis);

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
 * a transient error reply (BUSY, TRYAGAIN, CLUSTERDOWN, NOREPLICAS) sends
 * it again after a back-off; READONLY, LOADING and MASTERDOWN (a failover)
 * drop the connection and keep it for the next one instead.  It is given
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
 * The reply to a command of these functions (script, script_retry, purge,
 * the fetch's op in *f->opp) is not wanted any more: its request goes.
 * Its handler is not called; a command already sent still runs in Redis,
 * which the fences make harmless.  Only while the handler has not been
 * called.
 */
void ngx_http_idempotency_redis_forget(ngx_http_idempotency_redis_op_t *op);

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
 * NGX_SIZE_T_LEN + 1 more bytes (the chunk's number); rkey is the record's
 * key, which the log names (as the other lines of the same replay do).
 * *opp is always the op in progress, for ngx_http_idempotency_redis_forget;
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
    ngx_str_t                            rkey;     /* the record's, to log */
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
 * The removal of the record "key" and, when it is split, of its body
 * (src/lua/purge.lua), told on "<prefix>purge" to the nodes' replay
 * caches; args in "pool".  As ngx_http_idempotency_redis_script().
 */
ngx_http_idempotency_redis_op_t *ngx_http_idempotency_redis_purge(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *key, ngx_pool_t *pool,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log);

/*
 * The key of a split record's body (the name its chunks start with, see
 * NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK): "<key>:body:<owner>" when the key has
 * a hash tag, "<prefix>{<key>}:body:<owner>" when it has no brace at all,
 * "<prefix>{<tag>}:body:<owner>" for any other key, <tag> a tag of ours in
 * the key's slot (ngx_http_idempotency_slot_tag): it is in the key's Redis
 * Cluster slot in every case and starts with the prefix (ACL key
 * patterns).  NGX_DECLINED only for a key with braces but no hash tag
 * under a prefix with a '{' (its record is never split).  out->data needs
 * NGX_HTTP_IDEMPOTENCY_REDIS_BODY_KEY_LEN bytes.
 */
#define NGX_HTTP_IDEMPOTENCY_REDIS_BODY_KEY_LEN(rcf, key_len, owner_len)     \
    ((rcf)->prefix.len + (key_len) + (owner_len) + 12)

ngx_int_t ngx_http_idempotency_redis_body_key(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *key,
    const u_char *owner, size_t owner_len, ngx_str_t *out);

/*
 * The same for any other key of the record's slot: "<...>:<name>" where
 * the body key has "<...>:body:<owner>" (the wait mark, wait.c).
 */
ngx_int_t ngx_http_idempotency_redis_slot_key(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *key,
    const u_char *name, size_t name_len, ngx_str_t *out);

/*
 * What the scripts publish, heard for as long as the worker lives:
 * "<prefix>done" (wake.lua: a marked record was stored or released) and
 * "<prefix>purge" (purge.lua: a record was removed), each on a connection
 * of its own (ngx_http_idempotency_redis_sub.h: the handler hears every
 * message, and when the subscription is lost and made again).  NULL: out
 * of memory.  unsubscribe() at worker exit.
 */
ngx_http_idempotency_redis_sub_t *ngx_http_idempotency_redis_subscribe(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *channel,
    ngx_http_idempotency_redis_sub_pt handler, void *data, ngx_pool_t *pool,
    ngx_log_t *log);
void ngx_http_idempotency_redis_unsubscribe(
    ngx_http_idempotency_redis_sub_t *sub);

/*
 * For idempotency_status: this worker's connections to the Redis servers
 * of "redis" (an array of ngx_http_idempotency_redis_conf_t *; Redis
 * Cluster nodes are not among them), up to n into out; returns how many
 * there are.
 */
ngx_uint_t ngx_http_idempotency_redis_conns(ngx_array_t *redis,
    ngx_http_idempotency_redis_conn_t *out, ngx_uint_t n);


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_H_INCLUDED_ */
