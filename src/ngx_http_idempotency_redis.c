/*
 * The records layer: the module's commands in record terms (the claim,
 * the store of a record whole or split into chunks, release, renew,
 * inspect, purge, the fetch of a split body), the Lua scripts and the
 * chunk keys.  Uses the ops layer, the topology (through rcf->topology,
 * at worker start and exit) and the connection layer (its handshake
 * steps).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_redis_topology.h"
#include "ngx_http_idempotency_redis_wait.h"
#include "ngx_http_idempotency_scripts.h"
#include "ngx_http_idempotency_slot.h"
#include "ngx_http_idempotency_stats.h"


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
 * would: the chunks are one batch of ops.
 */
typedef struct {
    ngx_http_idempotency_redis_conf_t   *rcf;
    ngx_http_idempotency_redis_node_t   *node;     /* of the chunks */
    u_char                              *mem;      /* ours, holds body */
    u_char                              *body;
    u_char                             **blocks;   /* ours: chunks 1.. */
    ngx_uint_t                           nblocks;
    size_t                               sent;     /* bytes handed over */
    ngx_uint_t                           chunks;   /* in all */
    ngx_uint_t                           acked;    /* chunks in Redis */
    ngx_uint_t                           inflight; /* chunk ops not done */
    ngx_msec_t                           deadline;
    ngx_str_t                            bkey;     /* room for ":<i>" */
    ngx_str_t                            bttl;     /* the chunks' PX */
    ngx_str_t                            sargs[5]; /* of the head's store */
    ngx_http_idempotency_redis_batch_t   batch;    /* size: the body's */
    ngx_http_idempotency_redis_pt        handler;  /* NULL: called */
    void                                *data;
    unsigned                             failed:1;
} ngx_http_idempotency_redis_upload_t;


static ngx_int_t ngx_http_idempotency_redis_store_split(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *key, ngx_str_t *args,
    ngx_msec_t deadline, ngx_http_idempotency_redis_pt handler, void *data,
    ngx_pool_t *pool, u_char **memp, ngx_array_t *more, size_t more_len);
static ngx_int_t ngx_http_idempotency_redis_take(ngx_pool_t *pool, void *p);
static ngx_int_t ngx_http_idempotency_redis_upload_next(
    ngx_http_idempotency_redis_upload_t *u);
static void ngx_http_idempotency_redis_upload_reply(void *data,
    redisReply *reply, ngx_uint_t rc);
static void ngx_http_idempotency_redis_upload_free(
    ngx_http_idempotency_redis_upload_t *u);
static void ngx_http_idempotency_redis_upload_fail(
    ngx_http_idempotency_redis_upload_t *u, const char *reason);
static void ngx_http_idempotency_redis_fetch_reply(void *data,
    redisReply *reply, ngx_uint_t rc);
static ngx_http_idempotency_redis_op_t *ngx_http_idempotency_redis_send(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_uint_t script, ngx_str_t *key,
    ngx_str_t *args, ngx_uint_t nargs, ngx_uint_t retry, ngx_msec_t deadline,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log);
static const char *ngx_http_idempotency_redis_load_check(
    ngx_http_idempotency_redis_node_t *node, redisReply *reply,
    ngx_http_idempotency_redis_step_t *step);
static const char *ngx_http_idempotency_redis_hello_check(
    ngx_http_idempotency_redis_node_t *node, redisReply *reply,
    ngx_http_idempotency_redis_step_t *step);


/* the bytes in block i of a body's blocks after its first chunk ("more") */
#define NGX_HTTP_IDEMPOTENCY_REDIS_BLOCK_LEN(more_len, i)                     \
    ngx_min((more_len) - (i) * NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK,             \
            NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK)


/*
 * Per process: the shas are computed by each worker in init_process.  The
 * claim is Redis' own "SET key value NX GET PX ms" where the server takes
 * it (Redis 7.0 or newer, Valkey), atomic alone and much cheaper for Redis
 * than a script: no text, no sha.  Older servers (Redis 6.0, 6.2) get the
 * claim script with the same key, args and reply; which one a node's
 * server takes, its handshake's HELLO tells (hello_check).
 */
static ngx_http_idempotency_redis_cmd_t  ngx_http_idempotency_redis_claim = {
    "claim", ngx_http_idempotency_lua_claim,
    sizeof(ngx_http_idempotency_lua_claim) - 1, "", NULL, NULL,
    NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_WRITTEN
};

/*
 * The last field: the writes whose lost copy could let an operation run
 * twice wait for replicas (wait_replicas=, wait_aof): the claim, the
 * store (a record, a "held" or over-size marker), the renewal of a lock
 * and a split record's chunks (the claim once its reply says it wrote:
 * a replay sends no WAIT).  A release does not (a lost one leaves a
 * claim that makes a retry wait, never run twice), nor do the admin's
 * purge or the reads.
 */
static ngx_http_idempotency_redis_cmd_t
    ngx_http_idempotency_redis_scripts[NGX_HTTP_IDEMPOTENCY_SCRIPT_N] = {

    { "claim", NULL, 0, "", "SET", &ngx_http_idempotency_redis_claim,
      NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_WRITTEN },

    { "store", ngx_http_idempotency_lua_store,
      sizeof(ngx_http_idempotency_lua_store) - 1, "", NULL, NULL,
      NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_ALWAYS },

    { "release", ngx_http_idempotency_lua_release,
      sizeof(ngx_http_idempotency_lua_release) - 1, "", NULL, NULL, 0 },

    { "renew", ngx_http_idempotency_lua_renew,
      sizeof(ngx_http_idempotency_lua_renew) - 1, "", NULL, NULL,
      NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_ALWAYS },

    { "inspect", ngx_http_idempotency_lua_inspect,
      sizeof(ngx_http_idempotency_lua_inspect) - 1, "", NULL, NULL, 0 },

    { "purge", ngx_http_idempotency_lua_purge,
      sizeof(ngx_http_idempotency_lua_purge) - 1, "", NULL, NULL, 0 },

    /* a split record's body: written before its head, read for a replay */
    { "body store", NULL, 0, "", "SET", NULL,
      NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_ALWAYS },
    { "body read", NULL, 0, "", "GET", NULL, 0 },

    /* a record and its remaining TTL, for the replay cache */
    { "cache fetch", ngx_http_idempotency_lua_cache,
      sizeof(ngx_http_idempotency_lua_cache) - 1, "", NULL, NULL, 0 },

    /* a waiting duplicate's mark, and the settle step's notification */
    { "wait mark", NULL, 0, "", "SET", NULL, 0 },
    { "wait wake", ngx_http_idempotency_lua_wake,
      sizeof(ngx_http_idempotency_lua_wake) - 1, "", NULL, NULL, 0 }
};


/*
 * The last steps of every handshake: "HELLO 2" (what the server takes,
 * see hello_check; 2: hiredis 0.14 reads RESP2 only), then SCRIPT LOAD of
 * each script, the claim's too
 */
static ngx_http_idempotency_redis_step_t
    ngx_http_idempotency_redis_loads[1 + NGX_HTTP_IDEMPOTENCY_SCRIPT_N + 1
                                     + NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_STEPS];


ngx_int_t
ngx_http_idempotency_redis_init_process(ngx_cycle_t *cycle,
    ngx_array_t *redis)
{
    u_char                               md[SHA_DIGEST_LENGTH];
    ngx_uint_t                           i, n;
    ngx_http_idempotency_redis_cmd_t    *s;
    ngx_http_idempotency_redis_step_t   *step;
    ngx_http_idempotency_redis_conf_t  **rcfp;

    /* cache managers and loaders run init_process too but serve nothing */

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    if (redis == NULL || redis->nelts == 0) {
        return NGX_OK;
    }

    step = &ngx_http_idempotency_redis_loads[0];

    step->what = "HELLO failed";
    step->argc = 2;
    step->argv[0] = "HELLO";
    step->argvlen[0] = sizeof("HELLO") - 1;
    step->argv[1] = "2";
    step->argvlen[1] = sizeof("2") - 1;
    step->check = ngx_http_idempotency_redis_hello_check;
    step->data = NULL;

    n = 1;

    for (i = 0; i <= NGX_HTTP_IDEMPOTENCY_SCRIPT_N; i++) {
        s = (i == NGX_HTTP_IDEMPOTENCY_SCRIPT_N)
            ? &ngx_http_idempotency_redis_claim
            : &ngx_http_idempotency_redis_scripts[i];

        if (s->text == NULL) {
            continue;
        }

        SHA1((const u_char *) s->text, s->len, md);
        ngx_hex_dump(s->sha, md, SHA_DIGEST_LENGTH);

        step = &ngx_http_idempotency_redis_loads[n++];

        step->what = "SCRIPT LOAD failed";
        step->argc = 3;
        step->argv[0] = "SCRIPT";
        step->argvlen[0] = sizeof("SCRIPT") - 1;
        step->argv[1] = "LOAD";
        step->argvlen[1] = sizeof("LOAD") - 1;
        step->argv[2] = s->text;
        step->argvlen[2] = s->len;
        step->check = ngx_http_idempotency_redis_load_check;
        step->data = s;
    }

    /* the eviction policy, and whether wait_aof can work */

    n += ngx_http_idempotency_redis_wait_steps(
                                      &ngx_http_idempotency_redis_loads[n]);

    ngx_http_idempotency_redis_ops_init();
    ngx_http_idempotency_slot_tags_init();
    ngx_http_idempotency_redis_node_steps(ngx_http_idempotency_redis_loads, n);

    /*
     * The cached time dates from before the configuration was parsed,
     * seconds ago with a large one: a connect timer armed from it would
     * expire at once.
     */

    ngx_time_update();

    rcfp = redis->elts;

    for (i = 0; i < redis->nelts; i++) {

        if (rcfp[i]->node || rcfp[i]->cluster) {
            continue;
        }

        if (rcfp[i]->topology->init(cycle, rcfp[i]) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


void
ngx_http_idempotency_redis_exit_process(ngx_cycle_t *cycle,
    ngx_array_t *redis)
{
    ngx_uint_t                           i;
    ngx_http_idempotency_redis_conf_t  **rcfp;

    if (redis == NULL) {
        return;
    }

    rcfp = redis->elts;

    for (i = 0; i < redis->nelts; i++) {
        rcfp[i]->topology->exit(rcfp[i]);
    }
}


/*
 * HELLO 2: its "version" says whether the server takes "SET ... NX GET":
 * Redis 7.0 and newer do, and so does every Valkey (8.0 says "8.0.1", or
 * "7.2.4" in its Redis compatibility mode: both at least 7.0).  Anything
 * else gets the claim script, which every server takes: a reply without
 * a version, an error (HELLO is unknown before Redis 6.0, and 6.0 checks
 * it against the ACL user's commands, where 6.2 and newer let it pass).
 * Learnt again at every handshake: a failover may bring another server.
 */

static const char *
ngx_http_idempotency_redis_hello_check(ngx_http_idempotency_redis_node_t *node,
    redisReply *reply, ngx_http_idempotency_redis_step_t *step)
{
    u_char       *p, *last;
    size_t        i;
    ngx_int_t     major;
    redisReply   *name, *value;

    node->set_nx_get = 0;
    major = NGX_ERROR;

    if (reply->type == REDIS_REPLY_ARRAY) {

        for (i = 0; i + 1 < reply->elements; i += 2) {
            name = reply->element[i];
            value = reply->element[i + 1];

            if (name->type != REDIS_REPLY_STRING
                || value->type != REDIS_REPLY_STRING
                || name->len != sizeof("version") - 1
                || ngx_strncmp(name->str, "version", name->len) != 0)
            {
                continue;
            }

            p = (u_char *) value->str;
            last = ngx_strlchr(p, p + value->len, '.');

            if (last) {
                major = ngx_atoi(p, last - p);
            }

            break;
        }
    }

    if (major >= 7) {
        node->set_nx_get = 1;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" major version %i, "
                   "claims through %s", &node->name, major,
                   node->set_nx_get ? "SET NX GET" : "the claim script");

    return NULL;
}


/* SCRIPT LOAD: a failure is logged; EVAL still works if EVALSHA does not */

static const char *
ngx_http_idempotency_redis_load_check(ngx_http_idempotency_redis_node_t *node,
    redisReply *reply, ngx_http_idempotency_redis_step_t *step)
{
    ngx_http_idempotency_redis_cmd_t  *s = step->data;

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

    return NULL;
}


ngx_http_idempotency_redis_op_t *
ngx_http_idempotency_redis_script(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_uint_t script, ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log)
{
    return ngx_http_idempotency_redis_send(rcf, script, key, args, nargs, 0,
                                           0, handler, data, log);
}


ngx_http_idempotency_redis_op_t *
ngx_http_idempotency_redis_script_retry(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_uint_t script, ngx_str_t *key,
    ngx_str_t *args, ngx_uint_t nargs, ngx_msec_t deadline,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log)
{
    return ngx_http_idempotency_redis_send(rcf, script, key, args, nargs, 1,
                                           deadline, handler, data, log);
}


/*
 * A command on the node of its key: a plain one on the bulk connection only
 * if that is ready now, a retryable one there in any case when it is large
 */

static ngx_http_idempotency_redis_op_t *
ngx_http_idempotency_redis_send(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_uint_t script, ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs,
    ngx_uint_t retry, ngx_msec_t deadline,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log)
{
    size_t                                   size;
    ngx_http_idempotency_redis_node_t       *node;
    const ngx_http_idempotency_redis_cmd_t  *cmd;

    if (script >= NGX_HTTP_IDEMPOTENCY_SCRIPT_N) {
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "idempotency redis: unknown script %ui", script);
        return NULL;
    }

    cmd = &ngx_http_idempotency_redis_scripts[script];

    size = (script == NGX_HTTP_IDEMPOTENCY_SCRIPT_BODY_GET && !retry)
           ? NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK
           : ngx_http_idempotency_redis_args_size(args, nargs);

    node = ngx_http_idempotency_redis_pick(rcf, key);
    node = ngx_http_idempotency_redis_route(node, size, !retry);

    if (!retry) {
        return ngx_http_idempotency_redis_op_run(rcf, node, cmd, script, key,
                                                 args, nargs, handler, data,
                                                 log);
    }

    return ngx_http_idempotency_redis_op_retry(node, cmd, script, key, args,
                                               nargs, deadline, handler, data,
                                               NULL, log);
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
           + NGX_HTTP_IDEMPOTENCY_REDIS_BODY_KEY_LEN(rcf, key->len,
                                                     rec.owner_len)
           + 1 + NGX_SIZE_T_LEN          /* ":<i>" */
           + NGX_SIZE_T_LEN + NGX_INT_T_LEN;

    u = ngx_alloc(size, ngx_cycle->log);
    if (u == NULL) {
        return NGX_DECLINED;
    }

    ngx_memzero(u, sizeof(ngx_http_idempotency_redis_upload_t));

    u->blocks = (u_char **) &u[1];
    p = (u_char *) &u->blocks[nblocks];

    u->batch.info.key.data = p;
    u->batch.info.key.len = key->len;
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
    u->deadline = deadline;
    u->handler = handler;
    u->data = data;
    u->batch.info.script = NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE;
    /* its request's fence, should the store be given up before the head */
    u->batch.info.arg = u->sargs[0];
    u->batch.name = ngx_http_idempotency_redis_scripts[
                                     NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE].name;
    u->batch.size = body_len;

    u->node = ngx_http_idempotency_redis_route(node,
                                     NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK,
                                     0);

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                   "idempotency redis: \"%V\" upload:%p of %uz bytes, "
                   "%ui chunks", &u->node->name, u, u->batch.size, u->chunks);

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
           && u->sent < u->batch.size)
    {
        n = ngx_min(u->batch.size - u->sent,
                    NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK);
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

        op = ngx_http_idempotency_redis_op_retry(u->node,
                   &ngx_http_idempotency_redis_scripts[
                                     NGX_HTTP_IDEMPOTENCY_SCRIPT_BODY_SET],
                   NGX_HTTP_IDEMPOTENCY_SCRIPT_BODY_SET, &ckey, args, 3,
                   u->deadline, ngx_http_idempotency_redis_upload_reply, u,
                   &u->batch, ngx_cycle->log);
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
        ngx_http_idempotency_redis_upload_fail(u, u->batch.why ? u->batch.why
                                   : "a chunk of its body was given up");
        goto done;
    }

    if (reply->type != REDIS_REPLY_ERROR) {
        /* Redis is back: the body no longer waits for it */
        ngx_http_idempotency_redis_batch_uncharge(&u->batch);
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "idempotency redis: Redis error while storing the "
                      "body of key_hash=%s: %*s",
                      ngx_http_idempotency_key_hash(&u->batch.info.key),
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

    node = ngx_http_idempotency_redis_pick(u->rcf, &u->batch.info.key);

    op = ngx_http_idempotency_redis_op_retry(node,
                   &ngx_http_idempotency_redis_scripts[
                                     NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE],
                   NGX_HTTP_IDEMPOTENCY_SCRIPT_STORE, &u->batch.info.key,
                   u->sargs, 5, u->deadline, u->handler, u->data, NULL,
                   ngx_cycle->log);
    if (op == NULL) {
        ngx_http_idempotency_redis_upload_fail(u,
                                   "its head could not be sent or kept");
        goto done;
    }

    /* its handler hears that the record waited for Redis */
    op->info.parked += u->batch.info.parked;

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

    ngx_http_idempotency_redis_batch_uncharge(&u->batch);

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
    u->batch.info.reason = reason;

    if (u->batch.info.error == NULL) {
        u->batch.info.error = reason;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                   "idempotency redis: upload:%p failed: %s", u, reason);

    handler = u->handler;
    u->handler = NULL;

    if (handler) {
        handler(u->data ? u->data : &u->batch.info, NULL,
                NGX_HTTP_IDEMPOTENCY_REDIS_ERROR);
    }
}


ngx_int_t
ngx_http_idempotency_redis_body_key(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *key, const u_char *owner, size_t owner_len, ngx_str_t *out)
{
    if (ngx_http_idempotency_redis_slot_key(rcf, key, (u_char *) "body:",
                                            sizeof("body:") - 1, out)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    out->len = ngx_cpymem(out->data + out->len, owner, owner_len)
               - out->data;

    return NGX_OK;
}


ngx_int_t
ngx_http_idempotency_redis_slot_key(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *key, const u_char *name, size_t name_len, ngx_str_t *out)
{
    u_char  *p, *open, *close;
    u_char   tag[NGX_HTTP_IDEMPOTENCY_SLOT_TAG_LEN];

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

        /*
         * Braces but no hash tag ("a{b", "a}b", "a{}b"): the whole key
         * gives the slot, and no tag taken from it would; a tag of ours in
         * that slot.  A prefix with a '{' of its own would be the tag's
         * start: such a record stays whole.
         */

        if (ngx_strlchr(rcf->prefix.data, rcf->prefix.data + rcf->prefix.len,
                        '{')
            || ngx_http_idempotency_slot_tag(
                   ngx_http_idempotency_slot(key->data, key->len), tag)
               != 0)
        {
            return NGX_DECLINED;
        }

        p = ngx_cpymem(p, rcf->prefix.data, rcf->prefix.len);
        *p++ = '{';
        p = ngx_cpymem(p, tag, sizeof(tag));
        *p++ = '}';
    }

    *p++ = ':';
    p = ngx_cpymem(p, name, name_len);

    out->len = p - out->data;

    return NGX_OK;
}


/*
 * The removal of a record (idempotency_admin DELETE), a split record's
 * body with it: the script reads the head, which holds the owner token
 * and the body's length, and removes "<body key>:0" ... (in the record's
 * hash slot); it tells the nodes' replay caches on "<prefix>purge".
 */

ngx_http_idempotency_redis_op_t *
ngx_http_idempotency_redis_purge(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *key, ngx_pool_t *pool, ngx_http_idempotency_redis_pt handler,
    void *data, ngx_log_t *log)
{
    u_char      *p;
    ngx_str_t    args[3];
    ngx_uint_t   nargs;

    p = ngx_pnalloc(pool, rcf->prefix.len + sizeof("purge") - 1
                          + NGX_HTTP_IDEMPOTENCY_REDIS_BODY_KEY_LEN(rcf,
                                                             key->len, 0)
                          + NGX_SIZE_T_LEN);
    if (p == NULL) {
        return NULL;
    }

    args[0].data = p;
    p = ngx_sprintf(p, "%Vpurge", &rcf->prefix);
    args[0].len = p - args[0].data;

    nargs = 1;

    /* the body key without its owner token, which the script appends */

    args[1].data = p;

    if (ngx_http_idempotency_redis_body_key(rcf, key, (u_char *) "", 0,
                                            &args[1])
        == NGX_OK)
    {
        p += args[1].len;
        args[2].data = p;
        args[2].len = ngx_sprintf(p, "%uz",
                                  (size_t) NGX_HTTP_IDEMPOTENCY_REDIS_CHUNK)
                      - p;
        nargs = 3;
    }

    return ngx_http_idempotency_redis_script(rcf,
                                   NGX_HTTP_IDEMPOTENCY_SCRIPT_PURGE, key,
                                   args, nargs, handler, data, log);
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
                      ngx_http_idempotency_key_hash(&f->rkey),
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


/*
 * The ops layer's cancel, subscriptions and connection list, for the HTTP
 * side, which calls and includes nothing below this layer.
 */

void
ngx_http_idempotency_redis_forget(ngx_http_idempotency_redis_op_t *op)
{
    ngx_http_idempotency_redis_cancel(op);
}


ngx_http_idempotency_redis_sub_t *
ngx_http_idempotency_redis_subscribe(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *channel, ngx_http_idempotency_redis_sub_pt handler, void *data,
    ngx_pool_t *pool, ngx_log_t *log)
{
    return ngx_http_idempotency_redis_sub_start(rcf, channel, handler, data,
                                                pool, log);
}


void
ngx_http_idempotency_redis_unsubscribe(ngx_http_idempotency_redis_sub_t *sub)
{
    ngx_http_idempotency_redis_sub_exit(sub);
}


ngx_uint_t
ngx_http_idempotency_redis_conns(ngx_array_t *redis,
    ngx_http_idempotency_redis_conn_t *out, ngx_uint_t n)
{
    return ngx_http_idempotency_redis_connections(redis, out, n);
}
