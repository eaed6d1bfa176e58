/*
 * The connection layer: one Redis connection on nginx's event loop
 * (connect, the handshake as a list of steps, back-off and reconnect,
 * close; the hiredis <-> nginx event adapter is in redis_adapter.c).
 * Uses no other Redis layer: the layers above are reached through the
 * handlers they registered (ngx_http_idempotency_redis_node.h).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>

#include <hiredis/sds.h>

#include "ngx_http_idempotency_redis_adapter.h"
#include "ngx_http_idempotency_redis_node.h"
#include "ngx_http_idempotency_redis_tls.h"
#include "ngx_http_idempotency_stats.h"


static void ngx_http_idempotency_redis_connect(
    ngx_http_idempotency_redis_node_t *node);
static ngx_int_t ngx_http_idempotency_redis_handshake(
    ngx_http_idempotency_redis_node_t *node);
static ngx_int_t ngx_http_idempotency_redis_send_steps(
    ngx_http_idempotency_redis_node_t *node,
    ngx_http_idempotency_redis_step_t *steps, ngx_uint_t n);
static ngx_int_t ngx_http_idempotency_redis_send_step(
    ngx_http_idempotency_redis_node_t *node,
    ngx_http_idempotency_redis_step_t *step, int argc, const char **argv,
    size_t *argvlen);
static void ngx_http_idempotency_redis_ready(
    ngx_http_idempotency_redis_node_t *node);
static void ngx_http_idempotency_redis_failure(
    ngx_http_idempotency_redis_node_t *node, const char *what,
    const char *reason);
static void ngx_http_idempotency_redis_close(
    ngx_http_idempotency_redis_node_t *node);

static void ngx_http_idempotency_redis_reconnect_handler(ngx_event_t *ev);
static void ngx_http_idempotency_redis_connect_timeout_handler(
    ngx_event_t *ev);

static void ngx_http_idempotency_redis_on_connect(
    const redisAsyncContext *cac, int status);
static void ngx_http_idempotency_redis_on_disconnect(
    const redisAsyncContext *cac, int status);
static void ngx_http_idempotency_redis_step_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static void ngx_http_idempotency_redis_handshake_step(
    ngx_http_idempotency_redis_node_t *node);

static void ngx_http_idempotency_redis_read_handler(ngx_event_t *rev);
static void ngx_http_idempotency_redis_node_write_handler(ngx_event_t *wev);
static ngx_connection_t *ngx_http_idempotency_redis_node_attach(
    ngx_http_idempotency_redis_node_t *node, redisAsyncContext *ac,
    const char *host);


/* the ops layer's handlers and every node's last handshake steps */
static const ngx_http_idempotency_redis_upcalls_t
    *ngx_http_idempotency_redis_upcalls;
static ngx_http_idempotency_redis_step_t  *ngx_http_idempotency_redis_steps;
static ngx_uint_t                          ngx_http_idempotency_redis_nsteps;

/* how AUTH's and SELECT's replies are judged: an error reply is a refusal */
static ngx_http_idempotency_redis_step_t  ngx_http_idempotency_redis_auth = {
    "AUTH failed", 0, { NULL }, { 0 }, NULL, NULL, NULL
};

static ngx_http_idempotency_redis_step_t  ngx_http_idempotency_redis_select = {
    "SELECT failed", 0, { NULL }, { 0 }, NULL, NULL, NULL
};


void
ngx_http_idempotency_redis_node_init(
    const ngx_http_idempotency_redis_upcalls_t *upcalls)
{
    ngx_http_idempotency_redis_upcalls = upcalls;
}


void
ngx_http_idempotency_redis_node_steps(ngx_http_idempotency_redis_step_t *steps,
    ngx_uint_t nsteps)
{
    ngx_http_idempotency_redis_steps = steps;
    ngx_http_idempotency_redis_nsteps = nsteps;
}


ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_redis_node_create(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *host, in_port_t port, ngx_str_t *name,
    const ngx_http_idempotency_redis_place_t *place, void *place_data,
    ngx_pool_t *pool, ngx_log_t *log)
{
    u_char                             *p;
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
    node->place = place;
    node->place_data = place_data;

    /*
     * rcf->text would be the obvious name for logs, but it holds every
     * argument of the directive, the password included
     */

    if (name) {
        if (ngx_http_idempotency_redis_tls_conn_name(pool, rcf, name,
                                                     &node->name)
            != NGX_OK)
        {
            return NULL;
        }

    } else {
        p = ngx_pnalloc(pool, host->len + rcf->unix_path.len
                              + sizeof("tls://unix:") + NGX_INT_T_LEN);
        if (p == NULL) {
            return NULL;
        }

        node->name.data = p;

        if (rcf->unix_path.len) {
            p = ngx_sprintf(p, "unix:%V", &rcf->unix_path);

        } else {
            p = ngx_sprintf(p, "%s%V:%d", rcf->tls ? "tls://" : "", host,
                            (int) port);
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
    ngx_queue_init(&node->acking);

    return node;
}


void
ngx_http_idempotency_redis_node_exit(ngx_http_idempotency_redis_node_t *node)
{
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

#if (NGX_SSL)
    if (node->tls_session) {
        ngx_ssl_free_session(node->tls_session);
        node->tls_session = NULL;
    }
#endif

    if (ngx_http_idempotency_redis_upcalls) {
        ngx_http_idempotency_redis_upcalls->exit(node);
    }
}


/* plain or TLS, with the node's handlers */

static ngx_connection_t *
ngx_http_idempotency_redis_node_attach(ngx_http_idempotency_redis_node_t *node,
    redisAsyncContext *ac, const char *host)
{
    ngx_connection_t                   *c;
    ngx_http_idempotency_redis_conf_t  *rcf;

    rcf = node->conf;

#if (NGX_SSL)
    if (rcf->tls) {
        /*
         * a single server is checked against its name as configured;
         * nginx's SSL lines follow the streak: the first failure's only
         */

        c = ngx_http_idempotency_redis_tls_attach(ac, rcf->tls,
                           rcf->mode == NGX_HTTP_IDEMPOTENCY_REDIS_SINGLE
                           ? NULL : host,
                           node->tls_session,
                           ngx_http_idempotency_redis_tls_save_session,
                           &node->name, node->failures > 0, node->log);
    } else
#endif
    {
        (void) rcf;
        (void) host;
        c = ngx_http_idempotency_redis_attach(ac, node->log);
    }

    if (c) {
        c->read->handler = ngx_http_idempotency_redis_read_handler;
        c->write->handler = ngx_http_idempotency_redis_node_write_handler;
    }

    return c;
}




static void
ngx_http_idempotency_redis_connect(ngx_http_idempotency_redis_node_t *node)
{
    in_port_t                           port;
    ngx_int_t                           rc;
    const char                         *host, *reason;
    ngx_connection_t                   *c;
    redisAsyncContext                  *ac;
    ngx_http_idempotency_redis_conf_t  *rcf;

    rcf = node->conf;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, node->log, 0,
                   "idempotency redis: \"%V\" connecting", &node->name);

    /* host is an IP literal: hiredis never resolves a name here */

    if (node->place && node->place->address) {
        /* e.g. the sentinels, asked before every connect */

        reason = NULL;

        rc = node->place->address(node->place_data, &host, &port, &reason);

        /* the topology calls node_reconnect() once it knows */

        node->placing = (rc == NGX_AGAIN);

        if (rc == NGX_AGAIN) {
            return;
        }

        if (rc != NGX_OK) {
            ngx_http_idempotency_redis_failure(node, "connect failed",
                                               reason ? reason : "no address");
            return;
        }

    } else {
        host = (const char *) node->host.data;
        port = node->port;
    }

    if (rcf->unix_path.len) {
        ac = redisAsyncConnectUnix((const char *) rcf->unix_path.data);

    } else {
        ac = redisAsyncConnect(host, port);
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

    /* host may live in the topology's buffer: the peer keeps a copy */

    ngx_cpystrn(node->peer, (u_char *) host, NGX_SOCKADDR_STRLEN);
    node->peer_port = port;

    c = ngx_http_idempotency_redis_node_attach(node, ac, host);
    if (c == NULL) {
        ngx_http_idempotency_redis_failure(node, "connect failed",
                                           "no free worker connection");
        redisAsyncFree(ac);
        return;
    }

    ac->data = node;

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
        ngx_http_idempotency_redis_node_drop(node, "connect failed",
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


/*
 * The handshake: AUTH, SELECT, the node's own steps (a sentinel's master
 * is asked for its ROLE), then every node's (the scripts are loaded).
 */

static ngx_int_t
ngx_http_idempotency_redis_handshake(ngx_http_idempotency_redis_node_t *node)
{
    int                                  argc;
    u_char                               db[NGX_INT_T_LEN];
    size_t                               argvlen[3];
    const char                          *argv[3];
    ngx_http_idempotency_redis_conf_t   *rcf;

    rcf = node->conf;

    node->handshake = 0;

    if (rcf->password.len) {
        argc = ngx_http_idempotency_redis_auth_args(&rcf->user,
                                                    &rcf->password, argv,
                                                    argvlen);

        if (ngx_http_idempotency_redis_send_step(node,
                                     &ngx_http_idempotency_redis_auth,
                                     argc, argv, argvlen)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    if (rcf->db >= 0) {
        argv[0] = "SELECT";
        argvlen[0] = sizeof("SELECT") - 1;
        argv[1] = (const char *) db;
        argvlen[1] = ngx_sprintf(db, "%i", rcf->db) - db;

        if (ngx_http_idempotency_redis_send_step(node,
                                     &ngx_http_idempotency_redis_select,
                                     2, argv, argvlen)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    if (node->place
        && ngx_http_idempotency_redis_send_steps(node, node->place->steps,
                                                 node->place->nsteps)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_idempotency_redis_send_steps(node,
                                            ngx_http_idempotency_redis_steps,
                                            ngx_http_idempotency_redis_nsteps);
}


static ngx_int_t
ngx_http_idempotency_redis_send_steps(ngx_http_idempotency_redis_node_t *node,
    ngx_http_idempotency_redis_step_t *steps, ngx_uint_t n)
{
    ngx_uint_t  i;

    for (i = 0; i < n; i++) {
        if (steps[i].wanted && !steps[i].wanted(node)) {
            continue;
        }

        if (ngx_http_idempotency_redis_send_step(node, &steps[i],
                                                 steps[i].argc, steps[i].argv,
                                                 steps[i].argvlen)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_redis_send_step(ngx_http_idempotency_redis_node_t *node,
    ngx_http_idempotency_redis_step_t *step, int argc, const char **argv,
    size_t *argvlen)
{
    if (redisAsyncCommandArgv(node->ac, ngx_http_idempotency_redis_step_reply,
                              step, argc, argv, argvlen)
        != REDIS_OK)
    {
        return NGX_ERROR;
    }

    node->handshake++;

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

#if (NGX_SSL)
        /* the streak ended: this connection's next failure starts one */
        if (node->conf->tls && node->ac && node->ac->ev.data) {
            ngx_http_idempotency_redis_tls_quiet(node->ac->ev.data, 0);
        }
#endif

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

    if (ngx_http_idempotency_redis_upcalls
        && ngx_http_idempotency_redis_upcalls->failed)
    {
        ngx_http_idempotency_redis_upcalls->failed(node, reason);
    }

    if (node->place && node->place->failed) {
        /* e.g. a Cluster node may have failed over or left */
        node->place->failed(node->place_data, node);
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

void
ngx_http_idempotency_redis_node_lost(ngx_http_idempotency_redis_node_t *node,
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

void
ngx_http_idempotency_redis_node_drop(ngx_http_idempotency_redis_node_t *node,
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
 * E.g. the sentinels answered (the next connect() takes the answer), or
 * the master moved or is moving: a connection to the old one is closed,
 * without counting a failure (this runs in a callback of another
 * connection, never of this one).  The connect itself always comes from
 * the reconnect timer.
 */

void
ngx_http_idempotency_redis_node_reconnect(
    ngx_http_idempotency_redis_node_t *node, ngx_uint_t close)
{
    if (node->exiting) {
        return;
    }

    if (close && node->ac) {
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

    const char  *reason;

    reason = "timed out";

    if (node->state == NGX_HTTP_IDEMPOTENCY_REDIS_CONNECTING
        && node->conf->tls && node->ac)
    {
        reason = ngx_http_idempotency_redis_tls_timed_out(node->ac);
    }

    ngx_http_idempotency_redis_node_drop(node,
                          node->state == NGX_HTTP_IDEMPOTENCY_REDIS_CONNECTING
                          ? "connect failed" : "handshake failed",
                          reason);
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
        ngx_http_idempotency_redis_node_lost(node, ac, "connect failed");
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

    ngx_http_idempotency_redis_node_lost(node, ac, status == REDIS_OK
                                              ? "connection closed"
                                              : "connection lost");
}


/* a step's reply: a refusal makes the connection useless */

static void
ngx_http_idempotency_redis_step_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    redisReply                         *reply = r;
    const char                         *error;
    ngx_http_idempotency_redis_node_t  *node;
    ngx_http_idempotency_redis_step_t  *step = privdata;

    node = ac->data;

    if (reply == NULL) {
        ngx_http_idempotency_redis_node_lost(node, ac, "connection lost");
        return;
    }

    if (node->ac != ac) {
        return;
    }

    if (step->check) {
        error = step->check(node, reply, step);

    } else {
        error = (reply->type == REDIS_REPLY_ERROR) ? reply->str : NULL;
    }

    if (error) {
        /* inside a callback: hiredis frees the context when we return */
        ngx_http_idempotency_redis_node_drop(node, step->what, error);
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

        if (ngx_http_idempotency_redis_upcalls) {
            ngx_http_idempotency_redis_upcalls->ready(node);
        }

        if (node->place && node->place->ready && node->ac) {
            node->place->ready(node->place_data, node);
        }
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

ngx_int_t
ngx_http_idempotency_redis_node_peer(ngx_http_idempotency_redis_node_t *node,
    const char **host, in_port_t *port, const char **name)
{
    if (node->state != NGX_HTTP_IDEMPOTENCY_REDIS_READY) {
        return NGX_DECLINED;
    }

    *host = (const char *) node->peer;
    *port = node->peer_port;

    /* as ngx_http_idempotency_redis_node_attach() checks it */
    *name = node->conf->mode == NGX_HTTP_IDEMPOTENCY_REDIS_SINGLE
            ? NULL : *host;

    return NGX_OK;
}


void
ngx_http_idempotency_redis_node_extend(ngx_http_idempotency_redis_node_t *node,
    ngx_msec_t extra)
{
    /* the handshake's replies come first, but its writes are shared */

    if (node->state != NGX_HTTP_IDEMPOTENCY_REDIS_READY
        && node->connect_timer.timer_set)
    {
        ngx_add_timer(&node->connect_timer,
                      node->conf->connect_timeout + extra);
    }
}


void
ngx_http_idempotency_redis_node_flush(ngx_http_idempotency_redis_node_t *node)
{
    ngx_connection_t  *c;

    if (node->ac == NULL || node->state != NGX_HTTP_IDEMPOTENCY_REDIS_READY) {
        return;
    }

    c = node->ac->ev.data;

    /*
     * Only a write posted for the next pass (a full socket waits for its
     * event): moved to this pass's posted events, so it is written once
     * the handlers running now (hiredis' callbacks among them) are done
     */

    if (c == NULL || !c->write->posted) {
        return;
    }

    ngx_delete_posted_event(c->write);
    ngx_post_event(c->write, &ngx_posted_events);
}


void
ngx_http_idempotency_redis_node_moved(ngx_http_idempotency_redis_node_t *node)
{
    if (ngx_http_idempotency_redis_upcalls
        && ngx_http_idempotency_redis_upcalls->moved)
    {
        ngx_http_idempotency_redis_upcalls->moved(node);
    }
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

    ngx_http_idempotency_redis_handle_read(c);
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

#if (NGX_SSL)
    if (c->ssl) {
        ngx_http_idempotency_redis_tls_write(c);

        if (node->ac == ac && !ngx_http_idempotency_redis_tls_flushed(c)) {
            return;
        }

    } else
#endif
    {
        ngx_http_idempotency_redis_write(c);
    }

    /* every command handed to hiredis so far is on its way to Redis */

    if (node->ac == ac && ac->c.obuf && sdslen(ac->c.obuf) == 0) {
        node->flushed_seq = node->queued_seq;
    }
}
