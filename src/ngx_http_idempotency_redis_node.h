/*
 * The connection layer: one Redis connection of a worker on nginx's event
 * loop (a "node").  It knows nothing of records, of ops' queues or of where
 * a command should go; what the layers above must hear, they hear through
 * the handlers they registered here.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_NODE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_NODE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_redis_conf.h"


/* reconnect delay: doubles from MIN on every failure in a row, up to MAX */
#define NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MIN   100
#define NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MAX   2000


typedef enum {
    NGX_HTTP_IDEMPOTENCY_REDIS_IDLE = 0,      /* no context, maybe backoff */
    NGX_HTTP_IDEMPOTENCY_REDIS_CONNECTING,    /* connect(2) in progress */
    NGX_HTTP_IDEMPOTENCY_REDIS_HANDSHAKE,     /* AUTH, SELECT, SCRIPT LOAD */
    NGX_HTTP_IDEMPOTENCY_REDIS_READY
} ngx_http_idempotency_redis_state_e;


/*
 * One step of the handshake after AUTH and SELECT: a command, and the
 * judge of its reply (NULL: the reply is fine; else why the connection is
 * of no use, logged after "what").  Without a judge an error reply is a
 * refusal.  The step must live as long as the worker.
 */
typedef struct ngx_http_idempotency_redis_step_s
    ngx_http_idempotency_redis_step_t;

typedef const char *(*ngx_http_idempotency_redis_check_pt)(
    ngx_http_idempotency_redis_node_t *node, redisReply *reply,
    ngx_http_idempotency_redis_step_t *step);

struct ngx_http_idempotency_redis_step_s {
    const char                          *what;
    int                                  argc;
    const char                          *argv[4];
    size_t                               argvlen[4];
    ngx_http_idempotency_redis_check_pt  check;
    void                                *data;

    /* NULL, or whether this node sends the step (e.g. its conf asks) */
    ngx_uint_t                         (*wanted)(
                                           ngx_http_idempotency_redis_node_t
                                           *node);
};


/*
 * What the topology that made a node tells it (all may be NULL).
 * address: where to connect now: NGX_OK with host (an IP literal,
 * NUL-ended) and port set; NGX_AGAIN: not known yet, the topology calls
 * ngx_http_idempotency_redis_node_reconnect() when it is; NGX_DECLINED
 * with *reason set: none.  Without it the node's own host and port.
 * failed: the connection failed (the node may have moved).
 * ready: the connection is ready for commands (from a reply callback of
 * it, after the ops layer heard; may reconnect another node).
 * steps: handshake steps of this node, before those of every node.
 */
typedef struct {
    ngx_int_t                          (*address)(void *data,
                                           const char **host, in_port_t *port,
                                           const char **reason);
    void                               (*failed)(void *data,
                                           ngx_http_idempotency_redis_node_t
                                           *node);
    void                               (*ready)(void *data,
                                           ngx_http_idempotency_redis_node_t
                                           *node);
    ngx_http_idempotency_redis_step_t   *steps;
    ngx_uint_t                           nsteps;
} ngx_http_idempotency_redis_place_t;


/*
 * What the ops layer hears of every node, registered once per worker:
 * ready: the connection takes commands (from a reply callback: commands
 * may be sent); exit: the worker exits, the node is closed: what waits
 * for it must be given up; moved: the topology moved keys away from the
 * node (a Cluster's slot map changed): what waits for it may go elsewhere;
 * failed: a connect (or the connection) failed, a reconnect is due: what
 * waited only for this one gives up (never calls back from here).
 */
typedef struct {
    void  (*ready)(ngx_http_idempotency_redis_node_t *node);
    void  (*exit)(ngx_http_idempotency_redis_node_t *node);
    void  (*moved)(ngx_http_idempotency_redis_node_t *node);
    void  (*failed)(ngx_http_idempotency_redis_node_t *node,
                    const char *reason);
} ngx_http_idempotency_redis_upcalls_t;


struct ngx_http_idempotency_redis_node_s {
    /* the connection layer's (ngx_http_idempotency_redis_node.c) */
    ngx_http_idempotency_redis_conf_t   *conf;
    ngx_str_t                            name;     /* address, for logs */
    ngx_log_t                           *log;
    ngx_str_t                            host;     /* IP, NUL-ended, or "" */
    in_port_t                            port;
    u_char                               peer[NGX_SOCKADDR_STRLEN];
    in_port_t                            peer_port; /* where ac connects */

    redisAsyncContext                   *ac;       /* NULL: none */
    ngx_http_idempotency_redis_state_e   state;
    ngx_uint_t                           handshake; /* replies still due */
    ngx_msec_t                           last_read; /* reply bytes came */
    uint64_t                             queued_seq; /* commands handed over */
    uint64_t                             flushed_seq; /* commands written */

    ngx_uint_t                           failures; /* in a row */
    ngx_msec_t                           backoff;
    unsigned                             placing:1; /* address asked */

    ngx_event_t                          connect_timer;
    ngx_event_t                          reconnect_timer;
#if (NGX_SSL)
    ngx_ssl_session_t                   *tls_session; /* to resume */
#endif

    const ngx_http_idempotency_redis_place_t  *place;
    void                                *place_data;

    /* the ops layer's (ngx_http_idempotency_redis_ops.c, _park.c) */
    ngx_uint_t                           pending;  /* ops hiredis holds */
    size_t                               queued;   /* their bytes */
    ngx_queue_t                          parked;   /* ops waiting to resend */
    ngx_queue_t                          doomed;   /* given up, handler due */
    ngx_uint_t                           kept;     /* ever parked, not done */
    ngx_http_idempotency_redis_stats_t   stats;

    /*
     * ... and its redis_wait.c's: ops answered, waiting for the reply of
     * the WAIT queued behind them (wait_replicas=, wait_aof); the event
     * that queues a WAIT behind this pass's writes; the server's
     * maxmemory-policy ("" until known)
     */
    ngx_queue_t                          acking;
    ngx_event_t                          wait_event;
    ngx_uint_t                           waits;    /* WAITs not answered */
    uint64_t                             wait_seq; /* the last one's place */
    unsigned                             wait_due:1; /* writes since */
    u_char                               wait_cmd[64]; /* the WAIT, formatted */
    size_t                               wait_cmd_len;
    u_char                               policy[24];
    size_t                               policy_len;

    unsigned                             drained:1; /* notice due */

    /* the records layer's (ngx_http_idempotency_redis.c), each handshake */
    unsigned                             set_nx_get:1; /* Redis 7.0+ */

    unsigned                             exiting:1;
    unsigned                             bulk:1;   /* rcf->bulk */
};


/* once per worker, before any node is made: the ops layer's handlers */
void ngx_http_idempotency_redis_node_init(
    const ngx_http_idempotency_redis_upcalls_t *upcalls);

/* once per worker, before any node is made: every node's last steps */
void ngx_http_idempotency_redis_node_steps(
    ngx_http_idempotency_redis_step_t *steps, ngx_uint_t nsteps);

/*
 * A node that connects (and reconnects) by itself once asked to, closed
 * by node_exit() at worker exit.  host is an IP literal, NUL-ended, that
 * must live as long as the node; name (NULL: "host:port", or "unix:path"
 * with the conf's unix_path) is the node's name in logs.
 */
ngx_http_idempotency_redis_node_t *ngx_http_idempotency_redis_node_create(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *host, in_port_t port,
    ngx_str_t *name, const ngx_http_idempotency_redis_place_t *place,
    void *place_data, ngx_pool_t *pool, ngx_log_t *log);

/* connects now unless connected, connecting or waiting to reconnect */
void ngx_http_idempotency_redis_node_connect(
    ngx_http_idempotency_redis_node_t *node);

/*
 * Connects again from a timer that runs at once (never from inside the
 * caller), first closing the connection there is when "close" is set,
 * without counting a failure.
 */
void ngx_http_idempotency_redis_node_reconnect(
    ngx_http_idempotency_redis_node_t *node, ngx_uint_t close);

/* the node's context if commands can be queued on it now, or NULL */
redisAsyncContext *ngx_http_idempotency_redis_node_context(
    ngx_http_idempotency_redis_node_t *node);
ngx_str_t *ngx_http_idempotency_redis_node_name(
    ngx_http_idempotency_redis_node_t *node);

/*
 * Where the node's connection is, while it is ready (NGX_OK; else
 * NGX_DECLINED): host (an IP literal, NUL-ended, valid until the node
 * connects again) and port, and the name a TLS connection there checks
 * (NULL: the configured one), for another connection to the same server.
 */
ngx_int_t ngx_http_idempotency_redis_node_peer(
    ngx_http_idempotency_redis_node_t *node, const char **host,
    in_port_t *port, const char **name);

/*
 * We give up on the connection: log, schedule a reconnect, free it.
 * Inside a hiredis callback of the node the context is freed when that
 * callback returns.
 */
void ngx_http_idempotency_redis_node_drop(
    ngx_http_idempotency_redis_node_t *node, const char *what,
    const char *reason);

/*
 * hiredis is tearing "ac" down (a NULL reply): the node forgets it and
 * counts a failure, once per teardown.
 */
void ngx_http_idempotency_redis_node_lost(
    ngx_http_idempotency_redis_node_t *node, redisAsyncContext *ac,
    const char *what);

/*
 * A command of "extra" ms of transfer was queued while the connection is
 * still being set up: its connect timer waits that much longer.
 */
void ngx_http_idempotency_redis_node_extend(
    ngx_http_idempotency_redis_node_t *node, ngx_msec_t extra);

/*
 * What is queued goes out at the end of this pass of the event loop
 * rather than after the next one (a command whose latency matters more
 * than sharing a write)
 */
void ngx_http_idempotency_redis_node_flush(
    ngx_http_idempotency_redis_node_t *node);

/* the topology moved keys away from the node: the ops layer hears it */
void ngx_http_idempotency_redis_node_moved(
    ngx_http_idempotency_redis_node_t *node);

/* at worker exit: closed, what waits given up (through upcalls) */
void ngx_http_idempotency_redis_node_exit(
    ngx_http_idempotency_redis_node_t *node);

/*
 * "AUTH [user] password" (the ACL form with a user, the requirepass form
 * without) into argv and argvlen, which have room for 3; returns argc.
 */
int ngx_http_idempotency_redis_auth_args(ngx_str_t *user,
    ngx_str_t *password, const char **argv, size_t *argvlen);

#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_NODE_H_INCLUDED_ */
