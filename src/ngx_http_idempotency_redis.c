/*
 * The hiredis <-> nginx event adapter: per-worker connections, timers, ops.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>

#include <openssl/sha.h>

#include "ngx_http_idempotency_module.h"
#include "ngx_http_idempotency_scripts.h"


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

/* numkeys, which follows the sha or the script text */
#define NGX_HTTP_IDEMPOTENCY_REDIS_NUMKEYS       "\r\n$1\r\n1\r\n"


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
} ngx_http_idempotency_redis_script_t;


struct ngx_http_idempotency_redis_node_s {
    ngx_http_idempotency_redis_conf_t   *conf;
    ngx_str_t                            name;     /* address, for logs */
    ngx_log_t                           *log;

    redisAsyncContext                   *ac;       /* NULL: none */
    ngx_http_idempotency_redis_state_e   state;
    ngx_uint_t                           handshake; /* replies still due */
    ngx_uint_t                           pending;  /* ops hiredis holds */

    ngx_uint_t                           failures; /* in a row */
    ngx_msec_t                           backoff;

    ngx_event_t                          connect_timer;
    ngx_event_t                          reconnect_timer;

    unsigned                             exiting:1;
};


struct ngx_http_idempotency_redis_op_s {
    ngx_http_idempotency_redis_node_t   *node;
    ngx_http_idempotency_redis_pt        handler;  /* NULL: done, cancelled */
    void                                *data;
    ngx_event_t                          timer;

    ngx_uint_t                           script;
    ngx_uint_t                           nargs;
    u_char                              *tail;     /* RESP key and args */
    size_t                               tail_len;
    ngx_str_t                            key;      /* inside the tail */

    unsigned                             eval:1;   /* resent as EVAL */
};


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
static void ngx_http_idempotency_redis_handshake_step(
    ngx_http_idempotency_redis_node_t *node);
static void ngx_http_idempotency_redis_op_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static void ngx_http_idempotency_redis_op_finish(
    ngx_http_idempotency_redis_op_t *op, redisReply *reply, ngx_uint_t rc);
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


/* per process: the shas are computed by each worker in init_process */
static ngx_http_idempotency_redis_script_t
    ngx_http_idempotency_redis_scripts[NGX_HTTP_IDEMPOTENCY_SCRIPT_N] = {

    { "claim", ngx_http_idempotency_lua_claim,
      sizeof(ngx_http_idempotency_lua_claim) - 1, "" },

    { "store", ngx_http_idempotency_lua_store,
      sizeof(ngx_http_idempotency_lua_store) - 1, "" },

    { "release", ngx_http_idempotency_lua_release,
      sizeof(ngx_http_idempotency_lua_release) - 1, "" }
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

        if (rcfp[i]->node) {
            continue;
        }

        if (ngx_http_idempotency_redis_init_node(cycle, rcfp[i]) != NGX_OK) {
            return NGX_ERROR;
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
    u_char                             *p;
    ngx_addr_t                         *addr;
    ngx_http_idempotency_redis_node_t  *node;

    node = ngx_pcalloc(cycle->pool, sizeof(ngx_http_idempotency_redis_node_t));
    if (node == NULL) {
        return NGX_ERROR;
    }

    node->conf = rcf;
    node->log = cycle->log;
    node->backoff = NGX_HTTP_IDEMPOTENCY_REDIS_BACKOFF_MIN;

    /*
     * rcf->text would be the obvious name for logs, but it holds every
     * argument of the directive, the password included
     */

    if (rcf->addrs.nelts) {
        addr = rcf->addrs.elts;
        node->name = addr[0].name;

    } else {
        p = ngx_pnalloc(cycle->pool, rcf->host.len + rcf->unix_path.len
                                     + sizeof("unix:") + NGX_INT_T_LEN);
        if (p == NULL) {
            return NGX_ERROR;
        }

        node->name.data = p;

        if (rcf->unix_path.len) {
            p = ngx_sprintf(p, "unix:%V", &rcf->unix_path);

        } else {
            p = ngx_sprintf(p, "%V:%d", &rcf->host, (int) rcf->port);
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

    rcf->node = node;

    return NGX_OK;
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
        node = rcfp[i]->node;

        if (node == NULL) {
            continue;
        }

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, node->log, 0,
                       "idempotency redis: \"%V\" closing at exit, "
                       "%ui ops pending", &node->name, node->pending);

        /*
         * Ops still pending here belong to requests the worker abandons
         * (fast shutdown): their handlers are not called, as resuming a
         * request while the process exits would do more harm than good;
         * every op is still freed by its hiredis callback.
         */

        node->exiting = 1;

        if (node->reconnect_timer.timer_set) {
            ngx_del_timer(&node->reconnect_timer);
        }

        ngx_http_idempotency_redis_close(node);

        rcfp[i]->node = NULL;
    }
}


static void
ngx_http_idempotency_redis_connect(ngx_http_idempotency_redis_node_t *node)
{
    ngx_connection_t                   *c;
    redisAsyncContext                  *ac;
    ngx_http_idempotency_redis_conf_t  *rcf;

    rcf = node->conf;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" connecting", &node->name);

    /* host is an IP literal: hiredis never resolves a name here */

    if (rcf->unix_path.len) {
        ac = redisAsyncConnectUnix((const char *) rcf->unix_path.data);

    } else {
        ac = redisAsyncConnect((const char *) rcf->host.data, rcf->port);
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

    c = ngx_get_connection(ac->c.fd, node->log);
    if (c == NULL) {
        ngx_http_idempotency_redis_failure(node, "connect failed",
                                           "no free worker connection");
        redisAsyncFree(ac);
        return;
    }

    c->data = ac;
    c->read->handler = ngx_http_idempotency_redis_read_handler;
    c->write->handler = ngx_http_idempotency_redis_write_handler;
    c->read->log = node->log;
    c->write->log = node->log;
    c->number = ngx_atomic_fetch_add(ngx_connection_counter, 1);

    ac->data = node;

    /* hooks first: setting the connect callback already asks for write */

    ac->ev.data = c;
    ac->ev.addRead = ngx_http_idempotency_redis_add_read;
    ac->ev.delRead = ngx_http_idempotency_redis_del_read;
    ac->ev.addWrite = ngx_http_idempotency_redis_add_write;
    ac->ev.delWrite = ngx_http_idempotency_redis_del_write;
    ac->ev.cleanup = ngx_http_idempotency_redis_cleanup;

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
        argc = 0;

        argv[argc] = "AUTH";
        argvlen[argc++] = sizeof("AUTH") - 1;

        if (rcf->user.len) {
            argv[argc] = (const char *) rcf->user.data;
            argvlen[argc++] = rcf->user.len;
        }

        argv[argc] = (const char *) rcf->password.data;
        argvlen[argc++] = rcf->password.len;

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

    argv[0] = "SCRIPT";
    argvlen[0] = sizeof("SCRIPT") - 1;
    argv[1] = "LOAD";
    argvlen[1] = sizeof("LOAD") - 1;

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_SCRIPT_N; i++) {
        s = &ngx_http_idempotency_redis_scripts[i];

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


static void
ngx_http_idempotency_redis_reconnect_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_redis_node_t  *node = ev->data;

    if (node->exiting || node->ac) {
        return;
    }

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
    }
}


ngx_http_idempotency_redis_op_t *
ngx_http_idempotency_redis_script(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_uint_t script, ngx_str_t *key, ngx_str_t *args, ngx_uint_t nargs,
    ngx_http_idempotency_redis_pt handler, void *data, ngx_log_t *log)
{
    u_char                               *p, *start;
    size_t                                len, reserve, size;
    ngx_uint_t                            i;
    redisAsyncContext                    *ac;
    ngx_http_idempotency_redis_op_t      *op;
    ngx_http_idempotency_redis_node_t    *node;
    ngx_http_idempotency_redis_script_t  *s;

    node = rcf->node;

    if (script >= NGX_HTTP_IDEMPOTENCY_SCRIPT_N) {
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "idempotency redis: unknown script %ui", script);
        return NULL;
    }

    /* fail fast while there is no connection and none in progress */

    if (node == NULL || node->ac == NULL || node->exiting) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, log, 0,
                       "idempotency redis: \"%V\" not connected",
                       node ? &node->name : &rcf->host);
        return NULL;
    }

    ac = node->ac;

    /* hiredis refuses commands then; e.g. from an op failed by its EOF */

    if (ac->c.flags & (REDIS_DISCONNECTING | REDIS_FREEING)) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, log, 0,
                       "idempotency redis: \"%V\" is disconnecting",
                       &node->name);
        return NULL;
    }

    s = &ngx_http_idempotency_redis_scripts[script];

    /*
     * One allocation: the op, room for the longest header (EVAL with the
     * script text), then key and args RESP-encoded once.  The tail stays
     * until the reply so that a NOSCRIPT can be resent as EVAL.
     */

    reserve = NGX_HTTP_IDEMPOTENCY_REDIS_PREFIX_LEN + s->len
              + sizeof(NGX_HTTP_IDEMPOTENCY_REDIS_NUMKEYS) - 1;

    size = sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN + key->len;

    for (i = 0; i < nargs; i++) {
        size += sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN + args[i].len;
    }

    op = ngx_alloc(sizeof(ngx_http_idempotency_redis_op_t) + reserve + size,
                   log);
    if (op == NULL) {
        return NULL;
    }

    ngx_memzero(op, sizeof(ngx_http_idempotency_redis_op_t));

    op->node = node;
    op->handler = handler;
    op->data = data;
    op->script = script;
    op->nargs = nargs;
    op->tail = (u_char *) &op[1] + reserve;

    p = ngx_http_idempotency_redis_bulk(op->tail, key);

    op->key.len = key->len;
    op->key.data = p - (sizeof("\r\n") - 1) - key->len;

    if (data == NULL) {
        op->data = &op->key;
    }

    for (i = 0; i < nargs; i++) {
        p = ngx_http_idempotency_redis_bulk(p, &args[i]);
    }

    op->tail_len = p - op->tail;

    start = ngx_http_idempotency_redis_frame(op, 0, &len);

    /* on REDIS_ERR hiredis keeps no callback: the op is ours to free */

    if (redisAsyncFormattedCommand(ac, ngx_http_idempotency_redis_op_reply,
                                   op, (const char *) start, len)
        != REDIS_OK)
    {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, log, 0,
                       "idempotency redis: \"%V\" refused a command",
                       &node->name);
        ngx_free(op);
        return NULL;
    }

    node->pending++;

    op->timer.handler = ngx_http_idempotency_redis_op_timeout_handler;
    op->timer.data = op;
    op->timer.log = node->log;

    ngx_add_timer(&op->timer, rcf->timeout);

    ngx_log_debug5(NGX_LOG_DEBUG_HTTP, log, 0,
                   "idempotency redis: \"%V\" EVALSHA %s queued, "
                   "op:%p, %uz bytes, %ui pending",
                   &node->name, s->name, op, len, node->pending);

    return op;
}


void
ngx_http_idempotency_redis_cancel(ngx_http_idempotency_redis_op_t *op)
{
    if (op == NULL) {
        return;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, op->node->log, 0,
                   "idempotency redis: \"%V\" op:%p cancelled",
                   &op->node->name, op);

    /* hiredis still holds it: freed when its reply or teardown comes */

    op->handler = NULL;
    op->data = NULL;

    if (op->timer.timer_set) {
        ngx_del_timer(&op->timer);
    }
}


/*
 * No reply in time.  Replies come in order, so every command behind this
 * one is late too: the connection counts as broken and is replaced.  While
 * it is still being set up, the connect timer judges it instead, and only
 * this op gives up.
 */

static void
ngx_http_idempotency_redis_op_timeout_handler(ngx_event_t *ev)
{
    void                               *data;
    ngx_http_idempotency_redis_op_t    *op;
    ngx_http_idempotency_redis_node_t  *node;
    ngx_http_idempotency_redis_pt       handler;

    op = ev->data;
    node = op->node;

    handler = op->handler;
    data = op->data;

    /* the op stays with hiredis; a late reply finds no handler */

    op->handler = NULL;
    op->data = NULL;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" op:%p timed out, state:%d",
                   &node->name, op, (int) node->state);

    if (node->state == NGX_HTTP_IDEMPOTENCY_REDIS_READY) {

        /* may free op: it is not touched below */

        ngx_http_idempotency_redis_drop(node, "command failed",
                                        "no reply in time");
    }

    if (handler) {
        handler(data, NULL, NGX_HTTP_IDEMPOTENCY_REDIS_TIMEOUT);
    }
}


/* hiredis calls this exactly once per queued command; the op dies here */

static void
ngx_http_idempotency_redis_op_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    redisReply                       *reply = r;
    u_char                           *start;
    size_t                            len;
    ngx_http_idempotency_redis_op_t  *op = privdata;

    if (reply == NULL) {
        /* the context goes away: connection lost, dropped or exiting */
        ngx_http_idempotency_redis_lost(op->node, ac, "connection lost");
        ngx_http_idempotency_redis_op_finish(op, NULL,
                                            NGX_HTTP_IDEMPOTENCY_REDIS_ERROR);
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

        if (redisAsyncFormattedCommand(ac, ngx_http_idempotency_redis_op_reply,
                                       op, (const char *) start, len)
            == REDIS_OK)
        {
            op->eval = 1;

            /* a new command at the end of the pipeline: a new deadline */
            ngx_add_timer(&op->timer, op->node->conf->timeout);

            ngx_log_debug3(NGX_LOG_DEBUG_HTTP, op->node->log, 0,
                           "idempotency redis: \"%V\" op:%p NOSCRIPT, "
                           "resent as EVAL, %uz bytes",
                           &op->node->name, op, len);
            return;
        }

        ngx_http_idempotency_redis_op_finish(op, NULL,
                                            NGX_HTTP_IDEMPOTENCY_REDIS_ERROR);
        return;
    }

    ngx_http_idempotency_redis_op_finish(op, reply,
                                         NGX_HTTP_IDEMPOTENCY_REDIS_OK);
}


static void
ngx_http_idempotency_redis_op_finish(ngx_http_idempotency_redis_op_t *op,
    redisReply *reply, ngx_uint_t rc)
{
    ngx_http_idempotency_redis_pt       handler;
    ngx_http_idempotency_redis_node_t  *node;

    node = op->node;

    if (op->timer.timer_set) {
        ngx_del_timer(&op->timer);
    }

    node->pending--;

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

    ngx_free(op);
}


/*
 * Puts "*N EVALSHA <sha> 1" or "*N EVAL <text> 1" right in front of the
 * encoded key and args, so the whole command is one contiguous buffer.
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

    s = &ngx_http_idempotency_redis_scripts[op->script];

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


static u_char *
ngx_http_idempotency_redis_bulk(u_char *p, ngx_str_t *s)
{
    p = ngx_sprintf(p, "$%uz\r\n", s->len);

    if (s->len) {
        p = ngx_cpymem(p, s->data, s->len);
    }

    *p++ = CR;
    *p++ = LF;

    return p;
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


static void
ngx_http_idempotency_redis_add_write(void *privdata)
{
    ngx_connection_t  *c = privdata;

    if (c == NULL || c->write->active) {
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

    if (c == NULL || !c->write->active) {
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

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "idempotency redis: \"%V\" close fd:%d",
                   &((ngx_http_idempotency_redis_node_t *) ac->data)->name,
                   c->fd);

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

    /* one chunk of at most 16 KiB; see EVENT_FLAGS for the rest */

    redisAsyncHandleRead(ac);
}


static void
ngx_http_idempotency_redis_write_handler(ngx_event_t *wev)
{
    ngx_connection_t  *c;

    c = wev->data;

    redisAsyncHandleWrite(c->data);
}
