/*
 * A pub/sub subscription on a connection of its own, subscribed again a
 * second after a loss.  It listens where the topology says every PUBLISH
 * is heard (the master, any Cluster node), at the address the module's own
 * connection to that node has now, and follows it there when it moves (a
 * failover, a name that resolves elsewhere).  hiredis 0.14 cannot PING a
 * subscribed connection (the pong reaches the wrong callback), so a dead
 * peer is found by TCP keepalive rather than by a heartbeat of ours.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_redis_adapter.h"
#include "ngx_http_idempotency_redis_sub.h"
#include "ngx_http_idempotency_redis_topology.h"
#include "ngx_http_idempotency_redis_tls.h"


/* a lost subscription is made again after this */
#define NGX_HTTP_IDEMPOTENCY_REDIS_SUB_RETRY  1000

/* no node to listen at yet: the topology is asked again after this */
#define NGX_HTTP_IDEMPOTENCY_REDIS_SUB_WAIT   100

/* while subscribed: is the node still there?  Asked this often */
#define NGX_HTTP_IDEMPOTENCY_REDIS_SUB_FOLLOW 1000


struct ngx_http_idempotency_redis_sub_s {
    ngx_http_idempotency_redis_conf_t   *conf;
    ngx_str_t                           *channel;
    ngx_http_idempotency_redis_sub_pt    handler;
    void                                *data;
    ngx_log_t                           *log;
    redisAsyncContext                   *ac;
    ngx_http_idempotency_redis_node_t   *node;     /* listened at */
    u_char                               host[NGX_SOCKADDR_STRLEN];
    in_port_t                            port;
    /* for logs: host:port or unix:path, never the directive's text */
    u_char                               where[NGX_SOCKADDR_STRLEN + 16];
    ngx_str_t                            peer;       /* where, for SSL */
    ngx_event_t                          timer;
    ngx_uint_t                           failures;   /* in a row */
    unsigned                             subscribed:1;
    unsigned                             exiting:1;
};


static void ngx_http_idempotency_redis_sub_connect(
    ngx_http_idempotency_redis_sub_t *sub);
static void ngx_http_idempotency_redis_sub_retry(
    ngx_http_idempotency_redis_sub_t *sub, const char *reason);
static void ngx_http_idempotency_redis_sub_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static void ngx_http_idempotency_redis_sub_timer(ngx_event_t *ev);
static void ngx_http_idempotency_redis_sub_follow(
    ngx_http_idempotency_redis_sub_t *sub);
static void ngx_http_idempotency_redis_sub_read(ngx_event_t *rev);
#if (NGX_SSL)
static void ngx_http_idempotency_redis_sub_write(ngx_event_t *wev);
#endif
static void ngx_http_idempotency_redis_sub_close(
    ngx_http_idempotency_redis_sub_t *sub);


/* the AUTH reply's privdata */
static ngx_uint_t  ngx_http_idempotency_redis_sub_auth;


ngx_http_idempotency_redis_sub_t *
ngx_http_idempotency_redis_sub_start(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *channel, ngx_http_idempotency_redis_sub_pt handler,
    void *data, ngx_pool_t *pool, ngx_log_t *log)
{
    ngx_http_idempotency_redis_sub_t  *sub;

    sub = ngx_pcalloc(pool, sizeof(ngx_http_idempotency_redis_sub_t));
    if (sub == NULL) {
        return NULL;
    }

    sub->conf = rcf;
    sub->channel = channel;
    sub->handler = handler;
    sub->data = data;
    sub->log = log;

    sub->timer.handler = ngx_http_idempotency_redis_sub_timer;
    sub->timer.data = sub;
    sub->timer.log = log;
    sub->timer.cancelable = 1;

    ngx_http_idempotency_redis_sub_connect(sub);

    return sub;
}


void
ngx_http_idempotency_redis_sub_exit(ngx_http_idempotency_redis_sub_t *sub)
{
    if (sub == NULL) {
        return;
    }

    sub->exiting = 1;
    ngx_http_idempotency_redis_sub_close(sub);
}


static void
ngx_http_idempotency_redis_sub_connect(ngx_http_idempotency_redis_sub_t *sub)
{
    int                                 argc;
    size_t                              argvlen[3];
    in_port_t                           port;
    const char                         *argv[3], *host, *name;
    ngx_connection_t                   *c;
    redisAsyncContext                  *ac;
    ngx_http_idempotency_redis_node_t  *node;
    ngx_http_idempotency_redis_conf_t  *rcf;

    rcf = sub->conf;

    if (sub->ac || sub->exiting) {
        return;
    }

    name = NULL;

    if (rcf->unix_path.len) {
        ngx_snprintf(sub->where, sizeof(sub->where) - 1, "unix:%V%Z",
                     &rcf->unix_path);
        ac = redisAsyncConnectUnix((const char *) rcf->unix_path.data);

    } else {
        /* where the module's own connection is: an address that works */

        node = rcf->topology->listener(rcf, sub->node);

        if (node == NULL
            || ngx_http_idempotency_redis_node_peer(node, &host, &port,
                                                    &name)
               != NGX_OK)
        {
            if (sub->timer.timer_set) {
                ngx_del_timer(&sub->timer);
            }

            ngx_add_timer(&sub->timer, NGX_HTTP_IDEMPOTENCY_REDIS_SUB_WAIT);
            return;
        }

        sub->node = node;
        ngx_cpystrn(sub->host, (u_char *) host, NGX_SOCKADDR_STRLEN);
        sub->port = port;
        ngx_snprintf(sub->where, sizeof(sub->where) - 1, "%s%s:%d%Z",
                     rcf->tls ? "tls://" : "", sub->host, (int) port);

        ac = redisAsyncConnect((const char *) sub->host, port);
    }

    if (ac == NULL || ac->err) {
        if (ac) {
            redisAsyncFree(ac);
        }

        ngx_http_idempotency_redis_sub_retry(sub, "cannot connect");
        return;
    }

    if (rcf->unix_path.len == 0) {
        /* a dead peer is noticed without a PING (see above) */
        (void) redisEnableKeepAlive(&ac->c);
    }

    /* over TLS as the module's other connections are, never in plain */

#if (NGX_SSL)
    if (rcf->tls) {
        sub->peer.data = sub->where;
        sub->peer.len = ngx_strlen(sub->where);

        c = ngx_http_idempotency_redis_tls_attach(ac, rcf->tls, name, NULL,
                                                  NULL, &sub->peer,
                                                  sub->failures > 0,
                                                  sub->log);
        if (c) {
            c->write->handler = ngx_http_idempotency_redis_sub_write;
        }

    } else
#endif
    {
        c = ngx_http_idempotency_redis_attach(ac, sub->log);
    }

    if (c == NULL) {
        redisAsyncFree(ac);
        ngx_http_idempotency_redis_sub_retry(sub,
                                             "no free worker connection");
        return;
    }

    c->read->handler = ngx_http_idempotency_redis_sub_read;
    ac->data = sub;

    if (rcf->password.len) {
        argc = ngx_http_idempotency_redis_auth_args(&rcf->user,
                                                    &rcf->password,
                                                    argv, argvlen);

        if (redisAsyncCommandArgv(ac, ngx_http_idempotency_redis_sub_reply,
                                  &ngx_http_idempotency_redis_sub_auth,
                                  argc, argv, argvlen)
            != REDIS_OK)
        {
            redisAsyncFree(ac);
            ngx_http_idempotency_redis_sub_retry(sub, "AUTH refused");
            return;
        }
    }

    argv[0] = "SUBSCRIBE";
    argvlen[0] = sizeof("SUBSCRIBE") - 1;
    argv[1] = (const char *) sub->channel->data;
    argvlen[1] = sub->channel->len;

    if (redisAsyncCommandArgv(ac, ngx_http_idempotency_redis_sub_reply, NULL,
                              2, argv, argvlen)
        != REDIS_OK)
    {
        redisAsyncFree(ac);
        ngx_http_idempotency_redis_sub_retry(sub, "SUBSCRIBE refused");
        return;
    }

    sub->ac = ac;
    sub->subscribed = 0;

    if (sub->timer.timer_set) {
        ngx_del_timer(&sub->timer);
    }

    ngx_add_timer(&sub->timer, rcf->connect_timeout + rcf->timeout);
}


/* the first loss of a streak is logged; then quietly every second */

static void
ngx_http_idempotency_redis_sub_retry(ngx_http_idempotency_redis_sub_t *sub,
    const char *reason)
{
    if (sub->exiting) {
        return;
    }

    if (sub->failures++ == 0) {
        ngx_log_error(NGX_LOG_WARN, sub->log, 0,
                      "idempotency: the subscription to \"%V\" at %s "
                      "stopped (%s), subscribing again every %d ms",
                      sub->channel, sub->where, reason,
                      NGX_HTTP_IDEMPOTENCY_REDIS_SUB_RETRY);
    }

    if (sub->subscribed) {
        sub->subscribed = 0;
        sub->handler(sub->data, NGX_HTTP_IDEMPOTENCY_REDIS_SUB_LOST, NULL);
    }

    if (sub->timer.timer_set) {
        ngx_del_timer(&sub->timer);
    }

    ngx_add_timer(&sub->timer, NGX_HTTP_IDEMPOTENCY_REDIS_SUB_RETRY);
}


/* the confirmation, every message, and NULL when the context goes away */

static void
ngx_http_idempotency_redis_sub_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    redisReply                        *reply = r;
    redisReply                       **el;
    ngx_str_t                          msg;
    ngx_http_idempotency_redis_sub_t  *sub;

    sub = ac->data;

    if (sub == NULL || sub->ac != ac) {
        return;
    }

    if (reply == NULL) {
        sub->ac = NULL;
        ngx_http_idempotency_redis_sub_retry(sub, ac->err ? ac->errstr
                                                  : "connection closed");
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, sub->log, 0,
                      "idempotency: %s of \"%V\" at %s failed: %*s",
                      privdata ? "AUTH" : "SUBSCRIBE", sub->channel,
                      sub->where, (size_t) reply->len, reply->str);

        ngx_http_idempotency_redis_sub_close(sub);
        ngx_http_idempotency_redis_sub_retry(sub, "refused");
        return;
    }

    if (privdata == &ngx_http_idempotency_redis_sub_auth) {
        return;
    }

    el = reply->element;

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 3
        || el[0]->type != REDIS_REPLY_STRING)
    {
        return;
    }

    if (el[0]->len == sizeof("subscribe") - 1
        && ngx_strncmp(el[0]->str, "subscribe", el[0]->len) == 0)
    {
        if (sub->timer.timer_set) {
            ngx_del_timer(&sub->timer);
        }

        if (sub->failures) {
            ngx_log_error(NGX_LOG_NOTICE, sub->log, 0,
                          "idempotency: subscribed to \"%V\" at %s again",
                          sub->channel, sub->where);

#if (NGX_SSL)
            /* the streak ended: nginx's SSL lines are written again */
            if (sub->conf->tls && ac->ev.data) {
                ngx_http_idempotency_redis_tls_quiet(ac->ev.data, 0);
            }
#endif
        }

        sub->subscribed = 1;
        sub->failures = 0;

        ngx_add_timer(&sub->timer, NGX_HTTP_IDEMPOTENCY_REDIS_SUB_FOLLOW);

        sub->handler(sub->data, NGX_HTTP_IDEMPOTENCY_REDIS_SUB_READY, NULL);
        return;
    }

    if (el[0]->len == sizeof("message") - 1
        && ngx_strncmp(el[0]->str, "message", el[0]->len) == 0
        && el[2]->type == REDIS_REPLY_STRING)
    {
        msg.data = (u_char *) el[2]->str;
        msg.len = el[2]->len;

        sub->handler(sub->data, NGX_HTTP_IDEMPOTENCY_REDIS_SUB_MESSAGE, &msg);
    }
}


/* no confirmation in time, the time to subscribe again, or to follow */

static void
ngx_http_idempotency_redis_sub_timer(ngx_event_t *ev)
{
    ngx_http_idempotency_redis_sub_t  *sub = ev->data;

    if (sub->ac == NULL) {
        ngx_http_idempotency_redis_sub_connect(sub);
        return;
    }

    if (!sub->subscribed) {
        ngx_http_idempotency_redis_sub_close(sub);
        ngx_http_idempotency_redis_sub_retry(sub, "timed out");
        return;
    }

    ngx_http_idempotency_redis_sub_follow(sub);
}


/*
 * The node to listen at moved (the sentinels named another master, the
 * name resolves elsewhere, the Cluster node is gone) and the module's
 * connection is up there: the subscription moves after it.  A server that
 * is no longer the master may hear no more of what is published.
 */

static void
ngx_http_idempotency_redis_sub_follow(ngx_http_idempotency_redis_sub_t *sub)
{
    in_port_t                           port;
    const char                         *host, *name;
    ngx_http_idempotency_redis_node_t  *node;
    ngx_http_idempotency_redis_conf_t  *rcf;

    rcf = sub->conf;

    if (rcf->unix_path.len == 0) {
        node = rcf->topology->listener(rcf, sub->node);

        if (node
            && ngx_http_idempotency_redis_node_peer(node, &host, &port, &name)
               == NGX_OK
            && (node != sub->node || port != sub->port
                || ngx_strcmp(host, sub->host) != 0))
        {
            ngx_log_error(NGX_LOG_NOTICE, sub->log, 0,
                          "idempotency: the subscription to \"%V\" "
                          "moves from %s:%d to %s:%d", sub->channel,
                          sub->host, (int) sub->port, host, (int) port);

            ngx_http_idempotency_redis_sub_close(sub);
            ngx_http_idempotency_redis_sub_connect(sub);
            return;
        }
    }

    ngx_add_timer(&sub->timer, NGX_HTTP_IDEMPOTENCY_REDIS_SUB_FOLLOW);
}


/* on worker_shutdown_timeout nginx closes what is left: c->close */

static void
ngx_http_idempotency_redis_sub_read(ngx_event_t *rev)
{
    ngx_connection_t                  *c;
    redisAsyncContext                 *ac;
    ngx_http_idempotency_redis_sub_t  *sub;

    c = rev->data;
    ac = c->data;
    sub = ac->data;

    if (c->close) {
        sub->exiting = 1;

        if (sub->ac == ac) {
            ngx_http_idempotency_redis_sub_close(sub);

        } else {
            redisAsyncFree(ac);
        }

        return;
    }

    ngx_http_idempotency_redis_handle_read(c);
}


#if (NGX_SSL)

static void
ngx_http_idempotency_redis_sub_write(ngx_event_t *wev)
{
    ngx_http_idempotency_redis_tls_write(wev->data);
}

#endif


static void
ngx_http_idempotency_redis_sub_close(ngx_http_idempotency_redis_sub_t *sub)
{
    redisAsyncContext  *ac;

    ac = sub->ac;
    sub->ac = NULL;

    if (sub->timer.timer_set) {
        ngx_del_timer(&sub->timer);
    }

    if (sub->subscribed) {
        sub->subscribed = 0;

        if (!sub->exiting) {
            sub->handler(sub->data, NGX_HTTP_IDEMPOTENCY_REDIS_SUB_LOST,
                         NULL);
        }
    }

    if (ac) {
        ac->onDisconnect = NULL;
        redisAsyncFree(ac);
    }
}
