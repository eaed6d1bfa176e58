/*
 * The ops layer's types: a command of the module, an op and what its
 * handler hears.  Types only: ngx_http_idempotency_redis_ops.h and
 * ngx_http_idempotency_redis_park.h declare the functions.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_OP_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_OP_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include <openssl/sha.h>

#include "ngx_http_idempotency_redis_node.h"


/* outcome passed to an op's handler */
#define NGX_HTTP_IDEMPOTENCY_REDIS_OK        0   /* reply is set */
#define NGX_HTTP_IDEMPOTENCY_REDIS_ERROR     1   /* no connection, lost */
#define NGX_HTTP_IDEMPOTENCY_REDIS_TIMEOUT   2   /* no reply in time */
/* it waited for a connection that never came: Redis never saw it */
#define NGX_HTTP_IDEMPOTENCY_REDIS_UNSENT    3


/*
 * A command of the module: a native one ("SET", "GET"), or a script sent
 * as EVALSHA <sha> and again as EVAL <text> after a NOSCRIPT.  A native
 * command with a script is "SET ... NX GET", which only Redis 7.0 and
 * newer take: to a node whose server lacks it (node->set_nx_get unset),
 * or not known yet (a command queued behind the handshake), the script
 * goes instead, with the same key and args.
 */
typedef struct ngx_http_idempotency_redis_cmd_s
    ngx_http_idempotency_redis_cmd_t;

struct ngx_http_idempotency_redis_cmd_s {
    const char                          *name;     /* for logs */
    const char                          *text;     /* NULL: native */
    size_t                               len;
    u_char                               sha[SHA_DIGEST_LENGTH * 2];
    const char                          *native;
    ngx_http_idempotency_redis_cmd_t    *script;   /* of a native one */
    ngx_uint_t                           wait;     /* WAIT_* below */
};


/*
 * With wait_replicas=: a write that always writes has a WAIT queued
 * behind it at once; a claim only once its reply says it wrote (nil), so
 * that a replay (HIT) sends no WAIT
 */
#define NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_NONE     0
#define NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_ALWAYS   1
#define NGX_HTTP_IDEMPOTENCY_REDIS_WAIT_WRITTEN  2


/*
 * What an op knows about itself.  A handler whose op was created with
 * data == NULL gets a pointer to this as its data (the key is the first
 * member, so it may be read as an ngx_str_t * as well).  arg, the first
 * argument (empty when none, and in a batch's info), is what tells one
 * request's settle step from another's on the same key: its fence, the
 * in-flight record with the owner token.
 */
typedef struct {
    ngx_str_t                            key;      /* KEYS[1], the op's copy */
    ngx_str_t                            arg;      /* ARGV[1], the op's copy */
    ngx_uint_t                           script;
    ngx_uint_t                           attempts; /* times sent to Redis */
    ngx_uint_t                           parked;   /* times kept for a retry */
    const char                          *error;    /* last failure, or NULL */
    const char                          *reason;   /* why it was given up */
} ngx_http_idempotency_redis_info_t;


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


/*
 * Retryable ops that stand for one thing together (the chunks of a split
 * record's body): while one of them is kept for a retry, "size" bytes are
 * counted against the worker's retry buffer once, and the log lines name
 * the batch's "name" and info.key.  The last failure and why it was given
 * up are told in info and "why".
 */
typedef struct {
    ngx_http_idempotency_redis_info_t    info;
    const char                          *name;
    size_t                               size;
    const char                          *why;
    unsigned                             charged:1;
} ngx_http_idempotency_redis_batch_t;


typedef enum {
    NGX_HTTP_IDEMPOTENCY_REDIS_OP_NEW = 0,    /* ours, not queued anywhere */
    NGX_HTTP_IDEMPOTENCY_REDIS_OP_SENT,       /* hiredis holds it */
    NGX_HTTP_IDEMPOTENCY_REDIS_OP_PARKED,     /* in node->parked (or held) */
    NGX_HTTP_IDEMPOTENCY_REDIS_OP_DOOMED,     /* in node->doomed */
    NGX_HTTP_IDEMPOTENCY_REDIS_OP_ACKING      /* in node->acking */
} ngx_http_idempotency_redis_op_state_e;


/*
 * An op is in exactly one of these places, so that it can be neither freed
 * twice nor both parked and with hiredis: a reply (or teardown) callback of
 * hiredis is due for it only in SENT, and that callback moves it on.
 */
struct ngx_http_idempotency_redis_op_s {
    ngx_http_idempotency_redis_node_t   *node;
    ngx_http_idempotency_redis_pt        handler;  /* NULL: done, cancelled */
    void                                *data;
    const ngx_http_idempotency_redis_cmd_t  *cmd;
    ngx_http_idempotency_redis_batch_t  *batch;    /* or NULL */

    /*
     * SENT: the command timeout; PARKED: the deadline or the next retry,
     * cancelable; DOOMED: 0 ms, to call the handler outside the caller;
     * ACKING: the WAIT's reply is late
     */
    ngx_event_t                          timer;

    ngx_queue_t                          queue;    /* PARKED, DOOMED,
                                                      ACKING */
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

    /* ACKING: the reply, told to the handler once a WAIT acknowledged it */
    int                                  ack_type;
    long long                            ack_integer;
    size_t                               ack_len;
    u_char                               ack_str[8];

    unsigned                             eval:1;   /* resent as EVAL */
    unsigned                             retry:1;  /* may be parked */
    unsigned                             kept:1;   /* counted in node->kept */
    unsigned                             counted:1; /* in redis.parked */
    unsigned                             timed_out:1;
    unsigned                             asking:1; /* sent after ASKING */
    unsigned                             held:1;   /* waited for an address */
};


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_OP_H_INCLUDED_ */
