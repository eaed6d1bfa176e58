/*
 * Redis Sentinel: asks the sentinels where the master is and listens for
 * their +switch-master event, on nginx events (hiredis async).  Part of the
 * topology layer (ngx_http_idempotency_redis_topology.c gives its answer
 * to the node); uses the connection layer's event adapter.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_redis_adapter.h"
#include "ngx_http_idempotency_sentinel.h"
#include "ngx_http_idempotency_redis_tls.h"


/* a lost subscription is made again after this */
#define NGX_HTTP_IDEMPOTENCY_SENTINEL_RESUBSCRIBE  1000

/*
 * From the start of a failover (the replica is about to be promoted) until
 * +switch-master, no command goes to the old master, for at most this long
 */
#define NGX_HTTP_IDEMPOTENCY_SENTINEL_HOLD         5000

#define NGX_HTTP_IDEMPOTENCY_SENTINEL_HOST_LEN     NGX_SOCKADDR_STRLEN


typedef enum {
    NGX_HTTP_IDEMPOTENCY_SENTINEL_NONE = 0,   /* ask when asked */
    NGX_HTTP_IDEMPOTENCY_SENTINEL_ASKING,
    NGX_HTTP_IDEMPOTENCY_SENTINEL_FOUND,      /* an answer not used yet */
    NGX_HTTP_IDEMPOTENCY_SENTINEL_UNKNOWN     /* a round without answer */
} ngx_http_idempotency_sentinel_state_e;


typedef struct {
    ngx_str_t                              name;  /* for logs */
    u_char                                 host[
                                    NGX_HTTP_IDEMPOTENCY_SENTINEL_HOST_LEN + 1];
    in_port_t                              port;
    unsigned                               failing:1; /* did not answer */
} ngx_http_idempotency_sentinel_addr_t;


/* the events of one sentinel: every sentinel is listened to */
typedef struct {
    ngx_http_idempotency_sentinel_t       *sentinel;
    ngx_uint_t                             index;
    redisAsyncContext                     *ac;
    ngx_event_t                            timer;
    ngx_uint_t                             failures; /* in a row */
    unsigned                               subscribed:1;
} ngx_http_idempotency_sentinel_sub_t;


struct ngx_http_idempotency_sentinel_s {
    ngx_http_idempotency_redis_conf_t     *conf;
    ngx_log_t                             *log;
    ngx_http_idempotency_sentinel_pt       handler;
    void                                  *data;

    ngx_http_idempotency_sentinel_addr_t  *addrs;
    ngx_uint_t                             naddrs;

    /* the question: one short connection at a time */
    ngx_http_idempotency_sentinel_state_e  state;
    redisAsyncContext                     *ac;
    ngx_uint_t                             asking;   /* index */
    ngx_uint_t                             asked;    /* in this round */
    ngx_uint_t                             last;     /* answered last */
    ngx_event_t                            timer;

    /* the answer, and what was handed out last */
    u_char                                 host[
                                    NGX_HTTP_IDEMPOTENCY_SENTINEL_HOST_LEN + 1];
    in_port_t                              port;
    u_char                                 used[
                                    NGX_HTTP_IDEMPOTENCY_SENTINEL_HOST_LEN + 1];
    in_port_t                              used_port;

    /* SUBSCRIBE to every sentinel, kept open */
    ngx_http_idempotency_sentinel_sub_t   *subs;
    ngx_msec_t                             hold;     /* a failover started */

    unsigned                               in_call:1;
    unsigned                               listening:1;
    unsigned                               holding:1;
    unsigned                               exiting:1;
};


static void ngx_http_idempotency_sentinel_ask(
    ngx_http_idempotency_sentinel_t *s);
static ngx_int_t ngx_http_idempotency_sentinel_send(
    ngx_http_idempotency_sentinel_t *s);
static void ngx_http_idempotency_sentinel_failed(
    ngx_http_idempotency_sentinel_t *s, const char *reason);
static void ngx_http_idempotency_sentinel_done(
    ngx_http_idempotency_sentinel_t *s,
    ngx_http_idempotency_sentinel_state_e state);
static void ngx_http_idempotency_sentinel_query_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static const char *ngx_http_idempotency_sentinel_answer(
    ngx_http_idempotency_sentinel_t *s, redisReply *reply);
static ngx_int_t ngx_http_idempotency_sentinel_set(
    ngx_http_idempotency_sentinel_t *s, const char *host, size_t host_len,
    const char *port, size_t port_len);
static void ngx_http_idempotency_sentinel_timeout_handler(ngx_event_t *ev);
static void ngx_http_idempotency_sentinel_close_query(
    ngx_http_idempotency_sentinel_t *s);

static void ngx_http_idempotency_sentinel_subscribe(
    ngx_http_idempotency_sentinel_sub_t *sub);
static void ngx_http_idempotency_sentinel_resubscribe(
    ngx_http_idempotency_sentinel_sub_t *sub, const char *reason);
static void ngx_http_idempotency_sentinel_sub_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static ngx_uint_t ngx_http_idempotency_sentinel_split(redisReply *msg,
    char **word, size_t *len, ngx_uint_t n);
static void ngx_http_idempotency_sentinel_switch(
    ngx_http_idempotency_sentinel_sub_t *sub, redisReply *msg);
static void ngx_http_idempotency_sentinel_promoting(
    ngx_http_idempotency_sentinel_sub_t *sub, redisReply *msg);
static void ngx_http_idempotency_sentinel_sub_handler(ngx_event_t *ev);
static void ngx_http_idempotency_sentinel_close_sub(
    ngx_http_idempotency_sentinel_sub_t *sub);

static redisAsyncContext *ngx_http_idempotency_sentinel_connect(
    ngx_http_idempotency_sentinel_t *s,
    ngx_http_idempotency_sentinel_addr_t *addr, redisCallbackFn *fn,
    void *data, ngx_event_handler_pt read, ngx_uint_t quiet);
static void ngx_http_idempotency_sentinel_query_read(ngx_event_t *rev);
static void ngx_http_idempotency_sentinel_sub_read(ngx_event_t *rev);


/* privdata of the AUTH reply, to tell it from the answer */
static char  ngx_http_idempotency_sentinel_auth;


ngx_http_idempotency_sentinel_t *
ngx_http_idempotency_sentinel_create(ngx_pool_t *pool,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_log_t *log,
    ngx_http_idempotency_sentinel_pt handler, void *data)
{
    size_t                                 len;
    ngx_uint_t                             i;
    ngx_addr_t                            *addr;
    ngx_http_idempotency_sentinel_t       *s;
    ngx_http_idempotency_sentinel_addr_t  *sa;

    s = ngx_pcalloc(pool, sizeof(ngx_http_idempotency_sentinel_t));
    if (s == NULL) {
        return NULL;
    }

    s->addrs = ngx_pcalloc(pool,
                   rcf->addrs.nelts
                   * sizeof(ngx_http_idempotency_sentinel_addr_t));
    if (s->addrs == NULL) {
        return NULL;
    }

    s->subs = ngx_pcalloc(pool, rcf->addrs.nelts
                                * sizeof(ngx_http_idempotency_sentinel_sub_t));
    if (s->subs == NULL) {
        return NULL;
    }

    s->conf = rcf;
    s->log = log;
    s->handler = handler;
    s->data = data;
    s->naddrs = rcf->addrs.nelts;

    /* IP literals only (checked at nginx -t): hiredis never resolves */

    addr = rcf->addrs.elts;

    for (i = 0; i < s->naddrs; i++) {
        sa = &s->addrs[i];

        if (ngx_http_idempotency_redis_tls_conn_name(pool, rcf, &addr[i].name,
                                                     &sa->name)
            != NGX_OK)
        {
            return NULL;
        }
        len = ngx_sock_ntop(addr[i].sockaddr, addr[i].socklen, sa->host,
                            NGX_HTTP_IDEMPOTENCY_SENTINEL_HOST_LEN, 0);
        sa->host[len] = '\0';
        sa->port = ngx_inet_get_port(addr[i].sockaddr);

        s->subs[i].sentinel = s;
        s->subs[i].index = i;
        s->subs[i].timer.handler = ngx_http_idempotency_sentinel_sub_handler;
        s->subs[i].timer.data = &s->subs[i];
        s->subs[i].timer.log = log;
        s->subs[i].timer.cancelable = 1;
    }

    s->timer.handler = ngx_http_idempotency_sentinel_timeout_handler;
    s->timer.data = s;
    s->timer.log = log;
    s->timer.cancelable = 1;

    return s;
}


ngx_int_t
ngx_http_idempotency_sentinel_master(ngx_http_idempotency_sentinel_t *s,
    const char **host, in_port_t *port)
{
    ngx_uint_t  i;

    /* the first connect of the worker starts listening to every sentinel */

    if (!s->listening && !s->exiting) {
        s->listening = 1;

        for (i = 0; i < s->naddrs; i++) {
            ngx_http_idempotency_sentinel_subscribe(&s->subs[i]);
        }
    }

    if (s->holding && s->state != NGX_HTTP_IDEMPOTENCY_SENTINEL_FOUND) {

        if ((ngx_msec_int_t) (s->hold - ngx_current_msec) > 0) {
            return NGX_DECLINED;
        }

        s->holding = 0;

        ngx_log_error(NGX_LOG_WARN, s->log, 0,
                      "idempotency sentinel: no +switch-master for master "
                      "\"%V\" %d ms after its failover started, asking the "
                      "sentinels again", &s->conf->sentinel_master,
                      NGX_HTTP_IDEMPOTENCY_SENTINEL_HOLD);
    }

    switch (s->state) {

    case NGX_HTTP_IDEMPOTENCY_SENTINEL_ASKING:
        return NGX_AGAIN;

    case NGX_HTTP_IDEMPOTENCY_SENTINEL_FOUND:
        s->state = NGX_HTTP_IDEMPOTENCY_SENTINEL_NONE;
        s->holding = 0;

        if (s->port != s->used_port
            || ngx_strcmp(s->host, s->used) != 0)
        {
            ngx_log_error(NGX_LOG_NOTICE, s->log, 0,
                          "idempotency sentinel: master \"%V\" is at %s:%d",
                          &s->conf->sentinel_master, s->host, (int) s->port);

            ngx_cpystrn(s->used, s->host, sizeof(s->used));
            s->used_port = s->port;
        }

        *host = (const char *) s->host;
        *port = s->port;

        return NGX_OK;

    case NGX_HTTP_IDEMPOTENCY_SENTINEL_UNKNOWN:
        s->state = NGX_HTTP_IDEMPOTENCY_SENTINEL_NONE;
        return NGX_DECLINED;

    default:
        break;
    }

    if (s->exiting) {
        return NGX_DECLINED;
    }

    /* a round that fails at once (every connect refused) is told here */

    s->in_call = 1;
    ngx_http_idempotency_sentinel_ask(s);
    s->in_call = 0;

    if (s->state == NGX_HTTP_IDEMPOTENCY_SENTINEL_ASKING) {
        return NGX_AGAIN;
    }

    return ngx_http_idempotency_sentinel_master(s, host, port);
}


/* a round: the sentinel that answered last first, then the others in turn */

static void
ngx_http_idempotency_sentinel_ask(ngx_http_idempotency_sentinel_t *s)
{
    s->state = NGX_HTTP_IDEMPOTENCY_SENTINEL_ASKING;
    s->asked = 0;
    s->asking = s->last;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, s->log, 0,
                   "idempotency sentinel: asking for master \"%V\"",
                   &s->conf->sentinel_master);

    if (ngx_http_idempotency_sentinel_send(s) != NGX_OK) {
        ngx_http_idempotency_sentinel_failed(s, NULL);
    }
}


/* the sentinel being asked did not answer: the next one, or the end */

static void
ngx_http_idempotency_sentinel_failed(ngx_http_idempotency_sentinel_t *s,
    const char *reason)
{
    for ( ;; ) {

        /* not an error yet: the connection logs one if the round fails */

        if (reason) {
            ngx_log_error(NGX_LOG_INFO, s->log, 0,
                          "idempotency sentinel: %V did not name master "
                          "\"%V\": %s", &s->addrs[s->asking].name,
                          &s->conf->sentinel_master, reason);
        }

        /* nginx's SSL lines of its next queries are not written */
        s->addrs[s->asking].failing = 1;

        if (s->exiting || ++s->asked >= s->naddrs) {
            ngx_http_idempotency_sentinel_done(s,
                                      NGX_HTTP_IDEMPOTENCY_SENTINEL_UNKNOWN);
            return;
        }

        s->asking = (s->asking + 1) % s->naddrs;

        if (ngx_http_idempotency_sentinel_send(s) == NGX_OK) {
            return;
        }

        reason = NULL;   /* send() logged it */
    }
}


static void
ngx_http_idempotency_sentinel_done(ngx_http_idempotency_sentinel_t *s,
    ngx_http_idempotency_sentinel_state_e state)
{
    s->state = state;

    if (!s->in_call && !s->exiting) {
        s->handler(s->data, NGX_HTTP_IDEMPOTENCY_SENTINEL_ANSWER);
    }
}


/* AUTH if configured, then SENTINEL get-master-addr-by-name */

static ngx_int_t
ngx_http_idempotency_sentinel_send(ngx_http_idempotency_sentinel_t *s)
{
    size_t                                 argvlen[3];
    const char                            *argv[3];
    redisAsyncContext                     *ac;
    ngx_http_idempotency_sentinel_addr_t  *addr;

    addr = &s->addrs[s->asking];

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, s->log, 0,
                   "idempotency sentinel: asking %V", &addr->name);

    ac = ngx_http_idempotency_sentinel_connect(s, addr,
                                 ngx_http_idempotency_sentinel_query_reply, s,
                                 ngx_http_idempotency_sentinel_query_read,
                                 addr->failing);
    if (ac == NULL) {
        return NGX_ERROR;
    }

    argv[0] = "SENTINEL";
    argvlen[0] = sizeof("SENTINEL") - 1;
    argv[1] = "get-master-addr-by-name";
    argvlen[1] = sizeof("get-master-addr-by-name") - 1;
    argv[2] = (const char *) s->conf->sentinel_master.data;
    argvlen[2] = s->conf->sentinel_master.len;

    if (redisAsyncCommandArgv(ac, ngx_http_idempotency_sentinel_query_reply,
                              NULL, 3, argv, argvlen)
        != REDIS_OK)
    {
        ngx_log_error(NGX_LOG_INFO, s->log, 0,
                      "idempotency sentinel: %V refused a command",
                      &addr->name);
        redisAsyncFree(ac);
        return NGX_ERROR;
    }

    s->ac = ac;

    ngx_add_timer(&s->timer, s->conf->connect_timeout + s->conf->timeout);

    return NGX_OK;
}


static void
ngx_http_idempotency_sentinel_query_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    redisReply                       *reply = r;
    const char                       *reason;
    ngx_http_idempotency_sentinel_t  *s;

    s = ac->data;

    if (s->ac != ac) {
        /* closed by us: timed out, answered, or exiting */
        return;
    }

    if (reply == NULL) {
        s->ac = NULL;

        if (s->timer.timer_set) {
            ngx_del_timer(&s->timer);
        }

        /* hiredis frees the context after this callback */

        ngx_http_idempotency_sentinel_failed(s, ac->err ? ac->errstr
                                                : "connection closed");
        return;
    }

    if (privdata == &ngx_http_idempotency_sentinel_auth) {

        if (reply->type == REDIS_REPLY_ERROR) {
            ngx_log_error(NGX_LOG_ERR, s->log, 0,
                          "idempotency sentinel: AUTH at %V failed: %s",
                          &s->addrs[s->asking].name, reply->str);

            ngx_http_idempotency_sentinel_close_query(s);
            ngx_http_idempotency_sentinel_failed(s, "AUTH failed");
        }

        return;
    }

    reason = ngx_http_idempotency_sentinel_answer(s, reply);

    /* inside the callback: hiredis frees the context when it returns */

    ngx_http_idempotency_sentinel_close_query(s);

    if (reason) {
        ngx_http_idempotency_sentinel_failed(s, reason);
        return;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, s->log, 0,
                   "idempotency sentinel: %V named %s:%d",
                   &s->addrs[s->asking].name, s->host, (int) s->port);

    s->last = s->asking;
    s->addrs[s->asking].failing = 0;

    ngx_http_idempotency_sentinel_done(s, NGX_HTTP_IDEMPOTENCY_SENTINEL_FOUND);
}


/* the reply of get-master-addr-by-name: NULL when host and port are set */

static const char *
ngx_http_idempotency_sentinel_answer(ngx_http_idempotency_sentinel_t *s,
    redisReply *reply)
{
    redisReply  **el;

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_INFO, s->log, 0,
                      "idempotency sentinel: %V answered: %s",
                      &s->addrs[s->asking].name, reply->str);
        return "an error";
    }

    if (reply->type == REDIS_REPLY_NIL) {
        return "it does not monitor that master";
    }

    el = reply->element;

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2
        || el[0]->type != REDIS_REPLY_STRING
        || el[1]->type != REDIS_REPLY_STRING)
    {
        return "an unexpected reply";
    }

    if (ngx_http_idempotency_sentinel_set(s, el[0]->str, el[0]->len,
                                          el[1]->str, el[1]->len)
        != NGX_OK)
    {
        return "not an IP address and port (sentinel names need "
               "\"announce-hostnames no\")";
    }

    return NULL;
}


/* takes an answer that is an IP literal and a port, nothing else */

static ngx_int_t
ngx_http_idempotency_sentinel_set(ngx_http_idempotency_sentinel_t *s,
    const char *host, size_t host_len, const char *port, size_t port_len)
{
    ngx_int_t  n;
#if (NGX_HAVE_INET6)
    u_char     inaddr6[16];
#endif

    if (host_len == 0 || host_len > NGX_HTTP_IDEMPOTENCY_SENTINEL_HOST_LEN) {
        return NGX_ERROR;
    }

    if (ngx_inet_addr((u_char *) host, host_len) == INADDR_NONE
#if (NGX_HAVE_INET6)
        && ngx_inet6_addr((u_char *) host, host_len, inaddr6) != NGX_OK
#endif
        )
    {
        return NGX_ERROR;
    }

    n = ngx_atoi((u_char *) port, port_len);

    if (n < 1 || n > 65535) {
        return NGX_ERROR;
    }

    ngx_memcpy(s->host, host, host_len);
    s->host[host_len] = '\0';
    s->port = (in_port_t) n;

    return NGX_OK;
}


static void
ngx_http_idempotency_sentinel_timeout_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_sentinel_t  *s = ev->data;

    if (s->ac == NULL) {
        return;
    }

    ngx_http_idempotency_sentinel_close_query(s);
    ngx_http_idempotency_sentinel_failed(s, "timed out");
}


/*
 * Outside a hiredis callback the context is freed at once (its callbacks
 * run and find s->ac changed); inside one, when that callback returns.
 */

static void
ngx_http_idempotency_sentinel_close_query(ngx_http_idempotency_sentinel_t *s)
{
    redisAsyncContext  *ac;

    ac = s->ac;
    s->ac = NULL;

    if (s->timer.timer_set) {
        ngx_del_timer(&s->timer);
    }

    if (ac) {
        ac->onDisconnect = NULL;
        redisAsyncFree(ac);
    }
}


/*
 * The events: a connection per sentinel, kept open, subscribed to
 * +switch-master (every sentinel publishes it once it knows) and to
 * +failover-state-send-slaveof-noone (only the sentinel that runs the
 * failover does, just before it promotes the replica).
 */

static void
ngx_http_idempotency_sentinel_subscribe(
    ngx_http_idempotency_sentinel_sub_t *sub)
{
    size_t                                 argvlen[3];
    const char                            *argv[3];
    redisAsyncContext                     *ac;
    ngx_http_idempotency_sentinel_t       *s;
    ngx_http_idempotency_sentinel_addr_t  *addr;

    s = sub->sentinel;

    if (sub->ac || s->exiting) {
        return;
    }

    addr = &s->addrs[sub->index];

    ac = ngx_http_idempotency_sentinel_connect(s, addr,
                                       ngx_http_idempotency_sentinel_sub_reply,
                                       sub,
                                       ngx_http_idempotency_sentinel_sub_read,
                                       sub->failures > 0);
    if (ac == NULL) {
        ngx_http_idempotency_sentinel_resubscribe(sub, "cannot connect");
        return;
    }

    argv[0] = "SUBSCRIBE";
    argvlen[0] = sizeof("SUBSCRIBE") - 1;
    argv[1] = "+switch-master";
    argvlen[1] = sizeof("+switch-master") - 1;
    argv[2] = "+failover-state-send-slaveof-noone";
    argvlen[2] = sizeof("+failover-state-send-slaveof-noone") - 1;

    if (redisAsyncCommandArgv(ac, ngx_http_idempotency_sentinel_sub_reply,
                              NULL, 3, argv, argvlen)
        != REDIS_OK)
    {
        redisAsyncFree(ac);
        ngx_http_idempotency_sentinel_resubscribe(sub, "SUBSCRIBE refused");
        return;
    }

    sub->ac = ac;
    sub->subscribed = 0;

    if (sub->timer.timer_set) {
        ngx_del_timer(&sub->timer);
    }

    ngx_add_timer(&sub->timer, s->conf->connect_timeout + s->conf->timeout);
}


/*
 * The first loss of a streak is logged; a sentinel that is down is tried
 * again every second, quietly
 */

static void
ngx_http_idempotency_sentinel_resubscribe(
    ngx_http_idempotency_sentinel_sub_t *sub, const char *reason)
{
    ngx_http_idempotency_sentinel_t  *s;

    s = sub->sentinel;

    if (s->exiting) {
        return;
    }

    if (sub->failures++ == 0) {
        ngx_log_error(NGX_LOG_INFO, s->log, 0,
                      "idempotency sentinel: events from %V stopped (%s), "
                      "subscribing again every %d ms",
                      &s->addrs[sub->index].name, reason,
                      NGX_HTTP_IDEMPOTENCY_SENTINEL_RESUBSCRIBE);
    }

    if (sub->timer.timer_set) {
        ngx_del_timer(&sub->timer);
    }

    ngx_add_timer(&sub->timer, NGX_HTTP_IDEMPOTENCY_SENTINEL_RESUBSCRIBE);
}


/* the confirmations, every message, and NULL when the context goes away */

static void
ngx_http_idempotency_sentinel_sub_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    redisReply                           *reply = r;
    redisReply                          **el;
    ngx_http_idempotency_sentinel_t      *s;
    ngx_http_idempotency_sentinel_sub_t  *sub;

    sub = ac->data;
    s = sub->sentinel;

    if (sub->ac != ac) {
        return;
    }

    if (reply == NULL) {
        sub->ac = NULL;
        sub->subscribed = 0;
        ngx_http_idempotency_sentinel_resubscribe(sub, ac->err ? ac->errstr
                                                  : "connection closed");
        return;
    }

    if (privdata == &ngx_http_idempotency_sentinel_auth) {

        if (reply->type == REDIS_REPLY_ERROR) {
            ngx_log_error(NGX_LOG_ERR, s->log, 0,
                          "idempotency sentinel: AUTH at %V failed: %s",
                          &s->addrs[sub->index].name, reply->str);

            ngx_http_idempotency_sentinel_close_sub(sub);
            ngx_http_idempotency_sentinel_resubscribe(sub, "AUTH failed");
        }

        return;
    }

    el = reply->element;

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 3
        || el[0]->type != REDIS_REPLY_STRING
        || el[1]->type != REDIS_REPLY_STRING)
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
            ngx_log_error(NGX_LOG_INFO, s->log, 0,
                          "idempotency sentinel: events from %V again",
                          &s->addrs[sub->index].name);

#if (NGX_SSL)
            /* the streak ended: nginx's SSL lines are written again */
            if (s->conf->tls && ac->ev.data) {
                ngx_http_idempotency_redis_tls_quiet(ac->ev.data, 0);
            }
#endif
        }

        sub->subscribed = 1;
        sub->failures = 0;

        return;
    }

    if (el[0]->len != sizeof("message") - 1
        || ngx_strncmp(el[0]->str, "message", el[0]->len) != 0
        || el[2]->type != REDIS_REPLY_STRING)
    {
        return;
    }

    if (el[1]->len == sizeof("+switch-master") - 1
        && ngx_strncmp(el[1]->str, "+switch-master", el[1]->len) == 0)
    {
        ngx_http_idempotency_sentinel_switch(sub, el[2]);

    } else {
        ngx_http_idempotency_sentinel_promoting(sub, el[2]);
    }
}


/* the first n words of a message; how many there were, at most n */

static ngx_uint_t
ngx_http_idempotency_sentinel_split(redisReply *msg, char **word,
    size_t *len, ngx_uint_t n)
{
    char        *p, *last;
    ngx_uint_t   i;

    p = msg->str;
    last = msg->str + msg->len;

    for (i = 0; i < n && p < last; i++) {
        word[i] = p;

        while (p < last && *p != ' ') {
            p++;
        }

        len[i] = p - word[i];

        if (p < last) {
            p++;
        }
    }

    return i;
}


/* +switch-master "<name> <old ip> <old port> <new ip> <new port>" */

static void
ngx_http_idempotency_sentinel_switch(ngx_http_idempotency_sentinel_sub_t *sub,
    redisReply *msg)
{
    char                             *word[5];
    size_t                            len[5];
    ngx_str_t                        *name;
    ngx_http_idempotency_sentinel_t  *s;

    s = sub->sentinel;
    name = &s->conf->sentinel_master;

    if (ngx_http_idempotency_sentinel_split(msg, word, len, 5) != 5
        || len[0] != name->len
        || ngx_strncmp(word[0], name->data, name->len) != 0)
    {
        return;
    }

    if (ngx_http_idempotency_sentinel_set(s, word[3], len[3], word[4], len[4])
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_WARN, s->log, 0,
                      "idempotency sentinel: ignored +switch-master "
                      "\"%*s\": not an IP address and port",
                      msg->len, msg->str);
        return;
    }

    /* every sentinel tells it: the first one counts */

    if (s->port == s->used_port && ngx_strcmp(s->host, s->used) == 0) {
        return;
    }

    ngx_log_error(NGX_LOG_NOTICE, s->log, 0,
                  "idempotency sentinel: +switch-master from %V: master "
                  "\"%V\" moved to %s:%d",
                  &s->addrs[sub->index].name, name, s->host, (int) s->port);

    /* the event is the answer: a question still out is not needed */

    ngx_http_idempotency_sentinel_close_query(s);

    s->state = NGX_HTTP_IDEMPOTENCY_SENTINEL_FOUND;

    s->handler(s->data, NGX_HTTP_IDEMPOTENCY_SENTINEL_SWITCH);
}


/*
 * +failover-state-send-slaveof-noone "slave <ip:port> <ip> <port> @ <name>
 * <master ip> <master port>": the replica is being promoted.  From now on
 * the old master's writes would be lost with it: commands stop (and get
 * idempotency_on_store_error) until +switch-master names the new master, or
 * for at most HOLD if it never comes (a failover that was aborted).
 */

static void
ngx_http_idempotency_sentinel_promoting(
    ngx_http_idempotency_sentinel_sub_t *sub, redisReply *msg)
{
    char                             *word[8];
    size_t                            len[8];
    ngx_int_t                         port;
    ngx_str_t                        *name;
    ngx_http_idempotency_sentinel_t  *s;

    s = sub->sentinel;
    name = &s->conf->sentinel_master;

    if (ngx_http_idempotency_sentinel_split(msg, word, len, 8) != 8
        || len[5] != name->len
        || ngx_strncmp(word[5], name->data, name->len) != 0)
    {
        return;
    }

    /* only a failover away from the master this worker uses */

    port = ngx_atoi((u_char *) word[7], len[7]);

    if (port != (ngx_int_t) s->used_port
        || len[6] != ngx_strlen(s->used)
        || ngx_strncmp(word[6], s->used, len[6]) != 0)
    {
        return;
    }

    ngx_log_error(NGX_LOG_NOTICE, s->log, 0,
                  "idempotency sentinel: failover of master \"%V\" started "
                  "at %V, promoting %*s: no commands until it ends",
                  name, &s->addrs[sub->index].name, len[1], word[1]);

    s->holding = 1;
    s->hold = ngx_current_msec + NGX_HTTP_IDEMPOTENCY_SENTINEL_HOLD;

    /* an answer or a question from before is about the old master */

    ngx_http_idempotency_sentinel_close_query(s);
    s->state = NGX_HTTP_IDEMPOTENCY_SENTINEL_NONE;

    s->handler(s->data, NGX_HTTP_IDEMPOTENCY_SENTINEL_SWITCH);
}


/* no confirmation in time, or the time to subscribe again */

static void
ngx_http_idempotency_sentinel_sub_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_sentinel_sub_t  *sub = ev->data;

    if (sub->ac == NULL) {
        ngx_http_idempotency_sentinel_subscribe(sub);
        return;
    }

    if (!sub->subscribed) {
        ngx_http_idempotency_sentinel_close_sub(sub);
        ngx_http_idempotency_sentinel_resubscribe(sub, "timed out");
    }
}


static void
ngx_http_idempotency_sentinel_close_sub(
    ngx_http_idempotency_sentinel_sub_t *sub)
{
    redisAsyncContext  *ac;

    ac = sub->ac;
    sub->ac = NULL;
    sub->subscribed = 0;

    if (sub->timer.timer_set) {
        ngx_del_timer(&sub->timer);
    }

    if (ac) {
        ac->onDisconnect = NULL;
        redisAsyncFree(ac);
    }
}


/* a context on nginx events, with AUTH queued if the sentinels want it */

/* quiet: nginx's own SSL lines are not written (ngx_..._redis_tls.h) */

static redisAsyncContext *
ngx_http_idempotency_sentinel_connect(ngx_http_idempotency_sentinel_t *s,
    ngx_http_idempotency_sentinel_addr_t *addr, redisCallbackFn *fn,
    void *data, ngx_event_handler_pt read, ngx_uint_t quiet)
{
    int                                 argc;
    size_t                              argvlen[3];
    const char                         *argv[3];
    ngx_connection_t                   *c;
    redisAsyncContext                  *ac;
    ngx_http_idempotency_redis_conf_t  *rcf;
#if (NGX_SSL)
    ngx_str_t                          *names;
#endif

    rcf = s->conf;

    ac = redisAsyncConnect((const char *) addr->host, addr->port);

    if (ac == NULL) {
        ngx_log_error(NGX_LOG_INFO, s->log, 0,
                      "idempotency sentinel: %V: out of memory",
                      &addr->name);
        return NULL;
    }

    if (ac->err) {
        ngx_log_error(NGX_LOG_INFO, s->log, 0,
                      "idempotency sentinel: connect to %V failed: %s",
                      &addr->name, ac->errstr);
        redisAsyncFree(ac);
        return NULL;
    }

#if (NGX_SSL)
    if (rcf->tls) {
        /* a sentinel is checked against its name as configured */

        names = rcf->tls->names.elts;

        c = ngx_http_idempotency_redis_tls_attach(ac, rcf->tls,
                                  (const char *) names[addr - s->addrs].data,
                                  NULL, NULL, &addr->name, quiet, s->log);

    } else
#endif
    {
        (void) quiet;
        c = ngx_http_idempotency_redis_attach(ac, s->log);
    }

    if (c == NULL) {
        ngx_log_error(NGX_LOG_ERR, s->log, 0,
                      "idempotency sentinel: %V: no free worker connection",
                      &addr->name);
        redisAsyncFree(ac);
        return NULL;
    }

    c->read->handler = read;
    ac->data = data;

    if (rcf->sentinel_password.len == 0) {
        return ac;
    }

    argc = ngx_http_idempotency_redis_auth_args(&rcf->sentinel_user,
                                                &rcf->sentinel_password,
                                                argv, argvlen);

    if (redisAsyncCommandArgv(ac, fn, &ngx_http_idempotency_sentinel_auth,
                              argc, argv, argvlen)
        != REDIS_OK)
    {
        redisAsyncFree(ac);
        return NULL;
    }

    return ac;
}


/* on worker_shutdown_timeout nginx closes what is left: c->close */

static void
ngx_http_idempotency_sentinel_query_read(ngx_event_t *rev)
{
    ngx_connection_t                 *c;
    redisAsyncContext                *ac;
    ngx_http_idempotency_sentinel_t  *s;

    c = rev->data;
    ac = c->data;
    s = ac->data;

    if (c->close) {
        s->exiting = 1;

        if (s->ac == ac) {
            ngx_http_idempotency_sentinel_close_query(s);

        } else {
            redisAsyncFree(ac);
        }

        return;
    }

    ngx_http_idempotency_redis_handle_read(c);
}


static void
ngx_http_idempotency_sentinel_sub_read(ngx_event_t *rev)
{
    ngx_connection_t                     *c;
    redisAsyncContext                    *ac;
    ngx_http_idempotency_sentinel_sub_t  *sub;

    c = rev->data;
    ac = c->data;
    sub = ac->data;

    if (c->close) {
        sub->sentinel->exiting = 1;

        if (sub->ac == ac) {
            ngx_http_idempotency_sentinel_close_sub(sub);

        } else {
            redisAsyncFree(ac);
        }

        return;
    }

    ngx_http_idempotency_redis_handle_read(c);
}


const char *
ngx_http_idempotency_sentinel_role(redisReply *reply)
{
    redisReply  *role;

    if (reply->type == REDIS_REPLY_ERROR) {
        return reply->str;
    }

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements == 0) {
        return "ROLE gave an unexpected reply";
    }

    role = reply->element[0];

    if (role->type == REDIS_REPLY_STRING
        && role->len == sizeof("master") - 1
        && ngx_strncmp(role->str, "master", role->len) == 0)
    {
        return NULL;
    }

    return "the server the sentinels named is not a master (yet)";
}


void
ngx_http_idempotency_sentinel_close(ngx_http_idempotency_sentinel_t *s)
{
    ngx_uint_t  i;

    s->exiting = 1;

    ngx_http_idempotency_sentinel_close_query(s);

    for (i = 0; i < s->naddrs; i++) {
        ngx_http_idempotency_sentinel_close_sub(&s->subs[i]);
    }
}
