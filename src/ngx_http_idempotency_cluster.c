/*
 * The topology layer's Redis Cluster: per-worker slot map learnt with
 * CLUSTER SLOTS, one connection per master, MOVED and ASK redirects.  Uses
 * the connection layer (and the pure slot code); the ops layer hears of a
 * new map through ngx_http_idempotency_redis_node_moved().
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_redis_topology.h"
#include "ngx_http_idempotency_redis_resolve.h"
#include "ngx_http_idempotency_slot.h"


/* nodes one worker keeps a connection to, at most (a cluster has ~1000) */
#define NGX_HTTP_IDEMPOTENCY_CLUSTER_NODES_MAX   1024

/*
 * Between two CLUSTER SLOTS: a resharding answers MOVED for every key of a
 * moved slot, and each MOVED asks for a new map; they are coalesced into
 * at most one refresh per this many ms.
 */
#define NGX_HTTP_IDEMPOTENCY_CLUSTER_REFRESH_MIN  100

/* no node has a connection: ask again after this many ms */
#define NGX_HTTP_IDEMPOTENCY_CLUSTER_RETRY        500


typedef struct {
    ngx_str_t                            host;     /* IP or name, NUL-ended */
    in_port_t                            port;
    ngx_http_idempotency_redis_node_t   *node;
    unsigned                             named:1;  /* resolved: "resolve" */
} ngx_http_idempotency_cluster_node_t;


struct ngx_http_idempotency_cluster_s {
    ngx_http_idempotency_redis_conf_t   *conf;
    ngx_pool_t                          *pool;
    ngx_log_t                           *log;

    ngx_array_t                          nodes;    /* seeds first */
    ngx_uint_t                           next;     /* to ask for the map */
    ngx_uint_t                           listen;   /* the listener's turn */

    /* slot -> master; NULL: not known */
    ngx_http_idempotency_redis_node_t  **slots;
    ngx_uint_t                           maps;     /* CLUSTER SLOTS taken */

    /* the CLUSTER SLOTS in flight, or the delay before the next */
    ngx_event_t                          timer;
    redisAsyncContext                   *asked;
    ngx_http_idempotency_redis_node_t   *asked_node;

    unsigned                             refreshing:1;
    unsigned                             wanted:1;
    unsigned                             exiting:1;
    unsigned                             refused:1; /* error to CLUSTER SLOTS */
};


static ngx_int_t ngx_http_idempotency_cluster_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_conf_t *rcf);
static void ngx_http_idempotency_cluster_exit(
    ngx_http_idempotency_redis_conf_t *rcf);
static ngx_http_idempotency_redis_node_t *ngx_http_idempotency_cluster_node(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *key);
static ngx_http_idempotency_redis_node_t *ngx_http_idempotency_cluster_owner(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *key);
static ngx_http_idempotency_redis_node_t *
    ngx_http_idempotency_cluster_redirect(
    ngx_http_idempotency_redis_node_t *from, redisReply *reply,
    ngx_uint_t *asking);
static void ngx_http_idempotency_cluster_node_failed(void *data,
    ngx_http_idempotency_redis_node_t *node);
static ngx_http_idempotency_cluster_node_t *ngx_http_idempotency_cluster_add(
    ngx_http_idempotency_cluster_t *cl, u_char *host, size_t len,
    in_port_t port);
static void ngx_http_idempotency_cluster_refresh(
    ngx_http_idempotency_cluster_t *cl);
static void ngx_http_idempotency_cluster_ask(
    ngx_http_idempotency_cluster_t *cl);
static void ngx_http_idempotency_cluster_timer_handler(ngx_event_t *ev);
static void ngx_http_idempotency_cluster_slots_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static ngx_int_t ngx_http_idempotency_cluster_map(
    ngx_http_idempotency_cluster_t *cl, redisReply *reply,
    ngx_http_idempotency_redis_node_t *from, ngx_str_t *from_host);
static ngx_http_idempotency_cluster_node_t *
    ngx_http_idempotency_cluster_find(ngx_http_idempotency_cluster_t *cl,
    ngx_http_idempotency_redis_node_t *node);
static ngx_http_idempotency_redis_node_t *
    ngx_http_idempotency_cluster_listener(
    ngx_http_idempotency_redis_conf_t *rcf,
    ngx_http_idempotency_redis_node_t *current);
static ngx_http_idempotency_redis_node_t *
    ngx_http_idempotency_cluster_node_at(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_uint_t i);


const ngx_http_idempotency_redis_topology_t
    ngx_http_idempotency_redis_cluster = {
    ngx_http_idempotency_cluster_init,
    ngx_http_idempotency_cluster_exit,
    ngx_http_idempotency_cluster_node,
    ngx_http_idempotency_cluster_owner,
    ngx_http_idempotency_cluster_redirect,
    ngx_http_idempotency_redis_demoted,
    ngx_http_idempotency_cluster_listener,
    ngx_http_idempotency_cluster_node_at
};


/* a node's connection failed: the map may be stale */

static ngx_http_idempotency_redis_place_t
    ngx_http_idempotency_cluster_place = {
    NULL,
    ngx_http_idempotency_cluster_node_failed,
    NULL,
    NULL,
    0
};


static ngx_int_t
ngx_http_idempotency_cluster_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_conf_t *rcf)
{
    u_char                           text[NGX_SOCKADDR_STRLEN];
    size_t                           len;
    ngx_uint_t                       i;
    ngx_addr_t                      *addr;
    ngx_http_idempotency_cluster_t  *cl;

    cl = ngx_pcalloc(cycle->pool, sizeof(ngx_http_idempotency_cluster_t));
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->slots = ngx_pcalloc(cycle->pool, NGX_HTTP_IDEMPOTENCY_SLOTS
                            * sizeof(ngx_http_idempotency_redis_node_t *));
    if (cl->slots == NULL) {
        return NGX_ERROR;
    }

    if (ngx_array_init(&cl->nodes, cycle->pool, rcf->addrs.nelts + 8,
                       sizeof(ngx_http_idempotency_cluster_node_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    cl->conf = rcf;
    cl->pool = cycle->pool;
    cl->log = cycle->log;

    cl->timer.handler = ngx_http_idempotency_cluster_timer_handler;
    cl->timer.data = cl;
    cl->timer.log = cycle->log;
    cl->timer.cancelable = 1;

    rcf->cluster = cl;

    /* the seeds; a host name was resolved when the configuration was read */

    addr = rcf->addrs.elts;

    for (i = 0; i < rcf->addrs.nelts; i++) {
        len = ngx_sock_ntop(addr[i].sockaddr, addr[i].socklen, text,
                            NGX_SOCKADDR_STRLEN, 0);

        if (ngx_http_idempotency_cluster_add(cl, text, len,
                                            ngx_inet_get_port(addr[i].sockaddr))
            == NULL)
        {
            return NGX_ERROR;
        }
    }

    ngx_http_idempotency_cluster_refresh(cl);

    return NGX_OK;
}


static void
ngx_http_idempotency_cluster_exit(ngx_http_idempotency_redis_conf_t *rcf)
{
    ngx_uint_t                            i;
    ngx_http_idempotency_cluster_t       *cl;
    ngx_http_idempotency_cluster_node_t  *cn;

    cl = rcf->cluster;

    if (cl == NULL) {
        return;
    }

    rcf->cluster = NULL;

    /* CLUSTER SLOTS callbacks run while the contexts go: they see this */

    cl->exiting = 1;

    if (cl->timer.timer_set) {
        ngx_del_timer(&cl->timer);
    }

    cn = cl->nodes.elts;

    for (i = 0; i < cl->nodes.nelts; i++) {
        ngx_http_idempotency_redis_node_exit(cn[i].node);

        if (cn[i].named) {
            ngx_http_idempotency_redis_resolve_exit(cn[i].node);
        }
    }
}


static ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_cluster_node(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *key)
{
    ngx_uint_t                            i, n, slot;
    ngx_http_idempotency_cluster_t       *cl;
    ngx_http_idempotency_cluster_node_t  *cn;
    ngx_http_idempotency_redis_node_t    *node;

    cl = rcf->cluster;

    if (cl == NULL) {
        return NULL;
    }

    slot = ngx_http_idempotency_slot(key->data, key->len);
    node = cl->slots[slot];

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, cl->log, 0,
                   "idempotency redis cluster: \"%V\" is in slot %ui",
                   key, slot);

    if (node) {
        return node;
    }

    /*
     * A node that refuses CLUSTER SLOTS (e.g. not in cluster mode) would
     * run the command itself: records would not be where a cluster keeps
     * them.  Fail instead, until a map arrives.
     */

    if (cl->refused) {
        return NULL;
    }

    /* any node answers, with MOVED if the slot is not its own */

    cn = cl->nodes.elts;
    n = cl->nodes.nelts;

    for (i = 0; i < n; i++) {
        if (ngx_http_idempotency_redis_node_context(cn[i].node)) {
            ngx_log_debug2(NGX_LOG_DEBUG_HTTP, cl->log, 0,
                           "idempotency redis cluster: slot %ui not mapped, "
                           "trying \"%V\"", slot,
                           ngx_http_idempotency_redis_node_name(cn[i].node));
            return cn[i].node;
        }
    }

    return cn[0].node;
}


static ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_cluster_owner(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *key)
{
    if (rcf->cluster == NULL) {
        return NULL;
    }

    return rcf->cluster->slots[ngx_http_idempotency_slot(key->data,
                                                         key->len)];
}


/*
 * Every node hears every PUBLISH (the Cluster bus carries it): the
 * subscription stays where it is while it can, else takes the nodes in
 * turn, so that one that fails is not the only one tried.
 */

static ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_cluster_listener(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_http_idempotency_redis_node_t *current)
{
    in_port_t                              port;
    ngx_uint_t                             i, n;
    const char                            *h, *name;
    ngx_http_idempotency_cluster_t        *cl;
    ngx_http_idempotency_cluster_node_t   *cn;

    cl = rcf->cluster;

    if (cl == NULL) {
        return NULL;
    }

    if (current
        && ngx_http_idempotency_redis_node_peer(current, &h, &port, &name)
           == NGX_OK)
    {
        return current;
    }

    cn = cl->nodes.elts;
    n = cl->nodes.nelts;

    for (i = 0; i < n; i++) {
        cl->listen = (cl->listen + 1) % n;

        if (ngx_http_idempotency_redis_node_peer(cn[cl->listen].node, &h,
                                                 &port, &name)
            == NGX_OK)
        {
            return cn[cl->listen].node;
        }
    }

    return NULL;
}


static ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_cluster_redirect(ngx_http_idempotency_redis_node_t *from,
    redisReply *reply, ngx_uint_t *asking)
{
    int                                    kind;
    size_t                                 len;
    const char                            *str;
    ngx_http_idempotency_cluster_t        *cl;
    ngx_http_idempotency_cluster_node_t   *cn, *src;
    ngx_http_idempotency_slot_redirect_t   rd;

    cl = from->conf->cluster;

    if (cl == NULL) {
        return NULL;
    }

    str = reply->str;
    len = reply->len;

    kind = ngx_http_idempotency_slot_redirect(str, len, &rd);

    if (kind == NGX_HTTP_IDEMPOTENCY_SLOT_NONE) {
        return NULL;
    }

    if (rd.host_len) {
        cn = ngx_http_idempotency_cluster_add(cl, (u_char *) rd.host,
                                              rd.host_len,
                                              (in_port_t) rd.port);

    } else {
        /* the endpoint is not known to the cluster: the same host */

        src = ngx_http_idempotency_cluster_find(cl, from);
        cn = src ? ngx_http_idempotency_cluster_add(cl, src->host.data,
                                                    src->host.len,
                                                    (in_port_t) rd.port)
                 : NULL;
    }

    if (cn == NULL) {
        return NULL;
    }

    if (kind == NGX_HTTP_IDEMPOTENCY_SLOT_ASK) {
        *asking = 1;
        return cn->node;
    }

    *asking = 0;

    /* the next command of this slot goes there at once; the rest later */

    cl->slots[rd.slot] = cn->node;

    ngx_http_idempotency_cluster_refresh(cl);

    return cn->node;
}


static void
ngx_http_idempotency_cluster_node_failed(void *data,
    ngx_http_idempotency_redis_node_t *node)
{
    ngx_http_idempotency_cluster_t *cl = data;

    if (cl->exiting) {
        return;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, cl->log, 0,
                   "idempotency redis cluster: \"%V\" failed, "
                   "slot map refresh",
                   ngx_http_idempotency_redis_node_name(node));

    ngx_http_idempotency_cluster_refresh(cl);
}


/*
 * The node of host:port, made (and connecting) if it is new.  A host name
 * only with "resolve" (nginx's resolver): hiredis would resolve it,
 * blocking the worker.
 */

static ngx_http_idempotency_cluster_node_t *
ngx_http_idempotency_cluster_add(ngx_http_idempotency_cluster_t *cl,
    u_char *host, size_t len, in_port_t port)
{
    u_char                                *p;
    ngx_uint_t                             i, named;
    ngx_http_idempotency_cluster_node_t   *cn;
#if (NGX_HAVE_INET6)
    u_char                                 in6[16];
#endif

    cn = cl->nodes.elts;

    for (i = 0; i < cl->nodes.nelts; i++) {
        if (cn[i].port == port && cn[i].host.len == len
            && ngx_strncmp(cn[i].host.data, host, len) == 0)
        {
            return &cn[i];
        }
    }

    named = (ngx_inet_addr(host, len) == INADDR_NONE
#if (NGX_HAVE_INET6)
             && ngx_inet6_addr(host, len, in6) != NGX_OK
#endif
            );

    if (named && !cl->conf->resolve) {
        ngx_log_error(NGX_LOG_ERR, cl->log, 0,
                      "idempotency redis cluster: node \"%*s:%d\" is not "
                      "an IP address, ignored (the cluster must announce "
                      "IP addresses, or give \"resolve\")", len, host,
                      (int) port);
        return NULL;
    }

    if (cl->nodes.nelts == NGX_HTTP_IDEMPOTENCY_CLUSTER_NODES_MAX) {
        ngx_log_error(NGX_LOG_ERR, cl->log, 0,
                      "idempotency redis cluster: node \"%*s:%d\" ignored, "
                      "a worker keeps at most %d nodes", len, host,
                      (int) port, NGX_HTTP_IDEMPOTENCY_CLUSTER_NODES_MAX);
        return NULL;
    }

    p = ngx_pnalloc(cl->pool, len + 1);
    if (p == NULL) {
        return NULL;
    }

    ngx_memcpy(p, host, len);
    p[len] = '\0';

    cn = ngx_array_push(&cl->nodes);
    if (cn == NULL) {
        return NULL;
    }

    cn->host.data = p;
    cn->host.len = len;
    cn->port = port;
    cn->named = named;

    if (named) {
        cn->node = ngx_http_idempotency_redis_resolve_node(cl->conf,
                                   &cn->host, port,
                                   ngx_http_idempotency_cluster_node_failed,
                                   cl, cl->pool, cl->log);

    } else {
        cn->node = ngx_http_idempotency_redis_node_create(cl->conf,
                                        &cn->host, port, NULL,
                                        &ngx_http_idempotency_cluster_place,
                                        cl, cl->pool, cl->log);
    }

    if (cn->node == NULL) {
        cl->nodes.nelts--;
        return NULL;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, cl->log, 0,
                   "idempotency redis cluster: new node \"%V\"",
                   ngx_http_idempotency_redis_node_name(cn->node));

    ngx_http_idempotency_redis_node_connect(cn->node);

    return cn;
}


static ngx_http_idempotency_cluster_node_t *
ngx_http_idempotency_cluster_find(ngx_http_idempotency_cluster_t *cl,
    ngx_http_idempotency_redis_node_t *node)
{
    ngx_uint_t                            i;
    ngx_http_idempotency_cluster_node_t  *cn;

    cn = cl->nodes.elts;

    for (i = 0; i < cl->nodes.nelts; i++) {
        if (cn[i].node == node) {
            return &cn[i];
        }
    }

    return NULL;
}


/* asks for a new slot map, unless one is on its way or due soon */

static void
ngx_http_idempotency_cluster_refresh(ngx_http_idempotency_cluster_t *cl)
{
    if (cl->exiting) {
        return;
    }

    if (cl->refreshing || cl->timer.timer_set) {
        cl->wanted = 1;
        return;
    }

    ngx_http_idempotency_cluster_ask(cl);
}


/* CLUSTER SLOTS to the next node in turn that has a connection */

static void
ngx_http_idempotency_cluster_ask(ngx_http_idempotency_cluster_t *cl)
{
    ngx_uint_t                            i, n;
    redisAsyncContext                    *ac;
    ngx_http_idempotency_cluster_node_t  *cn;

    n = cl->nodes.nelts;

    cl->wanted = 0;

    for (i = 0; i < n; i++) {
        cn = (ngx_http_idempotency_cluster_node_t *) cl->nodes.elts
             + (cl->next + i) % n;

        ac = ngx_http_idempotency_redis_node_context(cn->node);

        if (ac == NULL) {
            continue;
        }

        /* queued behind the handshake of a connection being set up */

        if (redisAsyncCommand(ac, ngx_http_idempotency_cluster_slots_reply,
                              cl, "CLUSTER SLOTS")
            != REDIS_OK)
        {
            continue;
        }

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, cl->log, 0,
                       "idempotency redis cluster: CLUSTER SLOTS to \"%V\"",
                       ngx_http_idempotency_redis_node_name(cn->node));

        cl->next = (cl->next + i + 1) % n;
        cl->refreshing = 1;
        cl->asked = ac;
        cl->asked_node = cn->node;

        ngx_add_timer(&cl->timer,
                      cl->conf->connect_timeout + cl->conf->timeout);
        return;
    }

    /* every node is down or reconnecting by itself: ask again later */

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, cl->log, 0,
                   "idempotency redis cluster: no node to ask for the "
                   "slot map");

    ngx_add_timer(&cl->timer, NGX_HTTP_IDEMPOTENCY_CLUSTER_RETRY);
}


static void
ngx_http_idempotency_cluster_timer_handler(ngx_event_t *ev)
{
    ngx_http_idempotency_cluster_t  *cl = ev->data;

    if (cl->exiting) {
        return;
    }

    if (cl->refreshing) {
        ngx_log_error(NGX_LOG_WARN, cl->log, 0,
                      "idempotency redis cluster: \"%V\" did not answer "
                      "CLUSTER SLOTS in time, asking another node",
                      ngx_http_idempotency_redis_node_name(cl->asked_node));

        /* a late answer finds refreshing off or another context asked */

        cl->refreshing = 0;
        cl->asked = NULL;
    }

    ngx_http_idempotency_cluster_ask(cl);
}


static void
ngx_http_idempotency_cluster_slots_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    ngx_str_t                             host;
    ngx_uint_t                            i, n, level;
    redisReply                           *reply = r;
    ngx_http_idempotency_cluster_t       *cl = privdata;
    ngx_http_idempotency_cluster_node_t  *from, *cn;

    if (cl->exiting || !cl->refreshing || ac != cl->asked) {
        return;
    }

    cl->refreshing = 0;
    cl->asked = NULL;

    if (cl->timer.timer_set) {
        ngx_del_timer(&cl->timer);
    }

    from = ngx_http_idempotency_cluster_find(cl, cl->asked_node);

    if (reply == NULL || from == NULL) {
        /* the connection went away; its node reconnects by itself */
        ngx_add_timer(&cl->timer, NGX_HTTP_IDEMPOTENCY_CLUSTER_REFRESH_MIN);
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        /* once per streak: this repeats every RETRY ms */

        level = cl->refused ? NGX_LOG_DEBUG : NGX_LOG_ERR;

        ngx_log_error(level, cl->log, 0,
                      "idempotency redis cluster: \"%V\" refused "
                      "CLUSTER SLOTS: %*s",
                      ngx_http_idempotency_redis_node_name(from->node),
                      (size_t) reply->len, reply->str);

        cl->refused = 1;

        ngx_add_timer(&cl->timer, NGX_HTTP_IDEMPOTENCY_CLUSTER_RETRY);
        return;
    }

    /* the array of nodes may move while the map adds nodes: copy */

    host = from->host;

    if (ngx_http_idempotency_cluster_map(cl, reply, from->node, &host)
        != NGX_OK)
    {
        ngx_add_timer(&cl->timer, NGX_HTTP_IDEMPOTENCY_CLUSTER_RETRY);
        return;
    }

    cl->refused = 0;

    if (cl->wanted) {
        ngx_add_timer(&cl->timer, NGX_HTTP_IDEMPOTENCY_CLUSTER_REFRESH_MIN);
    }

    /* commands kept for a retry follow their slots (a failover) */

    n = cl->nodes.nelts;

    for (i = 0; i < n; i++) {
        cn = (ngx_http_idempotency_cluster_node_t *) cl->nodes.elts + i;
        ngx_http_idempotency_redis_node_moved(cn->node);
    }
}


/*
 * CLUSTER SLOTS: [[start, end, [ip, port, id, ...], replicas ...], ...].
 * Read in full first, so that a malformed answer leaves the map as it was.
 */

static ngx_int_t
ngx_http_idempotency_cluster_map(ngx_http_idempotency_cluster_t *cl,
    redisReply *reply, ngx_http_idempotency_redis_node_t *from,
    ngx_str_t *from_host)
{
    u_char                               *host;
    size_t                                len;
    ngx_uint_t                            i, s, covered, pass, level;
    long long                             start, end, port;
    redisReply                           *range, *master;
    ngx_http_idempotency_cluster_node_t  *cn;

    if (reply->type != REDIS_REPLY_ARRAY) {
        goto invalid;
    }

    covered = 0;

    for (pass = 0; pass < 2; pass++) {

        if (pass == 1) {
            ngx_memzero(cl->slots, NGX_HTTP_IDEMPOTENCY_SLOTS
                        * sizeof(ngx_http_idempotency_redis_node_t *));
        }

        for (i = 0; i < reply->elements; i++) {
            range = reply->element[i];

            if (range->type != REDIS_REPLY_ARRAY || range->elements < 3
                || range->element[0]->type != REDIS_REPLY_INTEGER
                || range->element[1]->type != REDIS_REPLY_INTEGER
                || range->element[2]->type != REDIS_REPLY_ARRAY)
            {
                goto invalid;
            }

            start = range->element[0]->integer;
            end = range->element[1]->integer;
            master = range->element[2];

            if (start < 0 || end < start
                || end >= NGX_HTTP_IDEMPOTENCY_SLOTS
                || master->elements < 2
                || master->element[0]->type != REDIS_REPLY_STRING
                || master->element[1]->type != REDIS_REPLY_INTEGER)
            {
                goto invalid;
            }

            port = master->element[1]->integer;

            if (port <= 0 || port > 65535) {
                goto invalid;
            }

            if (pass == 0) {
                continue;
            }

            host = (u_char *) master->element[0]->str;
            len = master->element[0]->len;

            /* "" or "?": the endpoint is not known, use the one we asked */

            if (len == 0 || (len == 1 && host[0] == '?')) {
                host = from_host->data;
                len = from_host->len;
            }

            cn = ngx_http_idempotency_cluster_add(cl, host, len,
                                                  (in_port_t) port);
            if (cn == NULL) {
                continue;
            }

            for (s = (ngx_uint_t) start; s <= (ngx_uint_t) end; s++) {
                cl->slots[s] = cn->node;
            }

            covered += (ngx_uint_t) (end - start + 1);
        }
    }

    if (cl->maps++ == 0 || covered != NGX_HTTP_IDEMPOTENCY_SLOTS) {
        level = (covered == NGX_HTTP_IDEMPOTENCY_SLOTS) ? NGX_LOG_INFO
                                                         : NGX_LOG_WARN;

        ngx_log_error(level, cl->log, 0,
                      "idempotency redis cluster: slot map from \"%V\", "
                      "%ui ranges, %ui of %d slots covered",
                      ngx_http_idempotency_redis_node_name(from),
                      (ngx_uint_t) reply->elements, covered,
                      NGX_HTTP_IDEMPOTENCY_SLOTS);

    } else {
        ngx_log_debug3(NGX_LOG_DEBUG_HTTP, cl->log, 0,
                       "idempotency redis cluster: slot map from \"%V\", "
                       "%ui ranges, map %ui",
                       ngx_http_idempotency_redis_node_name(from),
                       (ngx_uint_t) reply->elements, cl->maps);
    }

    return NGX_OK;

invalid:

    ngx_log_error(NGX_LOG_ERR, cl->log, 0,
                  "idempotency redis cluster: \"%V\" sent an unexpected "
                  "CLUSTER SLOTS reply",
                  ngx_http_idempotency_redis_node_name(from));

    return NGX_ERROR;
}


/* every node the worker keeps a connection to: the seeds, then the map's */

static ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_cluster_node_at(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_uint_t i)
{
    ngx_http_idempotency_cluster_t       *cl;
    ngx_http_idempotency_cluster_node_t  *cn;

    cl = rcf->cluster;

    if (cl == NULL || i >= cl->nodes.nelts) {
        return NULL;
    }

    cn = cl->nodes.elts;

    return cn[i].node;
}
