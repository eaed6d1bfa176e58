/*
 * The topology layer's single server and Sentinel (the Cluster's is in
 * ngx_http_idempotency_cluster.c).  Uses the connection layer, and the
 * sentinels' queries (ngx_http_idempotency_sentinel.c).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_redis_topology.h"
#include "ngx_http_idempotency_redis_resolve.h"
#include "ngx_http_idempotency_sentinel.h"


static ngx_int_t ngx_http_idempotency_redis_single_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_conf_t *rcf);
static void ngx_http_idempotency_redis_single_exit(
    ngx_http_idempotency_redis_conf_t *rcf);
static ngx_http_idempotency_redis_node_t *ngx_http_idempotency_redis_first(
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *key);
static ngx_http_idempotency_redis_node_t *
    ngx_http_idempotency_redis_master(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_http_idempotency_redis_node_t *current);
static ngx_http_idempotency_redis_node_t *
    ngx_http_idempotency_redis_node_at(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_uint_t i);

static ngx_int_t ngx_http_idempotency_redis_sentinel_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_conf_t *rcf);
static void ngx_http_idempotency_redis_sentinel_exit(
    ngx_http_idempotency_redis_conf_t *rcf);
static ngx_int_t ngx_http_idempotency_redis_sentinel_address(void *data,
    const char **host, in_port_t *port, const char **reason);
static void ngx_http_idempotency_redis_sentinel_handler(void *data,
    ngx_uint_t event);
static const char *ngx_http_idempotency_redis_role_check(
    ngx_http_idempotency_redis_node_t *node, redisReply *reply,
    ngx_http_idempotency_redis_step_t *step);


const ngx_http_idempotency_redis_topology_t
    ngx_http_idempotency_redis_single = {
    ngx_http_idempotency_redis_single_init,
    ngx_http_idempotency_redis_single_exit,
    ngx_http_idempotency_redis_first,
    NULL,
    NULL,
    ngx_http_idempotency_redis_demoted,
    ngx_http_idempotency_redis_master,
    ngx_http_idempotency_redis_node_at
};


const ngx_http_idempotency_redis_topology_t
    ngx_http_idempotency_redis_sentinel = {
    ngx_http_idempotency_redis_sentinel_init,
    ngx_http_idempotency_redis_sentinel_exit,
    ngx_http_idempotency_redis_first,
    NULL,
    NULL,
    ngx_http_idempotency_redis_demoted,
    ngx_http_idempotency_redis_master,
    ngx_http_idempotency_redis_node_at
};


/* what the sentinels named must be the master now, not a replica */

static ngx_http_idempotency_redis_step_t  ngx_http_idempotency_redis_role = {
    "handshake failed", 1, { "ROLE" }, { sizeof("ROLE") - 1 },
    ngx_http_idempotency_redis_role_check, NULL, NULL
};


static ngx_http_idempotency_redis_place_t
    ngx_http_idempotency_redis_sentinel_place = {
    ngx_http_idempotency_redis_sentinel_address,
    NULL,
    NULL,
    &ngx_http_idempotency_redis_role,
    1
};


/*
 * "resolve": the second connection of a single server goes where the
 * first one is, never where its own answer of the name would send it (a
 * name with several addresses, or a move seen by one connection's answer
 * first, would split a large record's chunks from its head)
 */
typedef struct {
    ngx_http_idempotency_redis_node_t  *first;
    ngx_http_idempotency_redis_node_t  *second;
    unsigned                            waiting:1;
} ngx_http_idempotency_redis_follow_t;


static ngx_int_t ngx_http_idempotency_redis_follow_address(void *data,
    const char **host, in_port_t *port, const char **reason);
static void ngx_http_idempotency_redis_follow_ready(void *data,
    ngx_http_idempotency_redis_node_t *node);


static ngx_http_idempotency_redis_place_t
    ngx_http_idempotency_redis_follow_place = {
    ngx_http_idempotency_redis_follow_address,
    NULL,
    NULL,
    NULL,
    0
};


/* one connection, and a second one for large commands when needed */

static ngx_int_t
ngx_http_idempotency_redis_single_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_conf_t *rcf)
{
    ngx_uint_t                            i;
    ngx_addr_t                           *addr;
    ngx_http_idempotency_redis_node_t    *node;
    ngx_http_idempotency_redis_follow_t  *follow;

    addr = rcf->addrs.elts;
    follow = NULL;

    for (i = 0; i < 2; i++) {

        /*
         * "resolve" and a name: the first connection follows the name,
         * the second one the first
         */

        if (rcf->named && i == 0) {
            node = ngx_http_idempotency_redis_resolve_node(rcf, &rcf->host,
                                                           rcf->port, NULL,
                                                           NULL, cycle->pool,
                                                           cycle->log);

        } else if (rcf->named) {
            follow = ngx_pcalloc(cycle->pool,
                                 sizeof(ngx_http_idempotency_redis_follow_t));
            if (follow == NULL) {
                return NGX_ERROR;
            }

            node = ngx_http_idempotency_redis_node_create(rcf, &rcf->host,
                                     rcf->port, &rcf->node->name,
                                     &ngx_http_idempotency_redis_follow_place,
                                     follow, cycle->pool, cycle->log);

            if (node) {
                /* the name is the first connection's, "tls://" already */
                node->name = rcf->node->name;
                follow->first = rcf->node;
                follow->second = node;

                ngx_http_idempotency_redis_resolve_ready(rcf->node,
                                     ngx_http_idempotency_redis_follow_ready,
                                     follow);
            }

        } else {
            node = ngx_http_idempotency_redis_node_create(rcf, &rcf->host,
                                                          rcf->port,
                                                          &addr[0].name,
                                                          NULL, NULL,
                                                          cycle->pool,
                                                          cycle->log);
        }

        if (node == NULL) {
            return NGX_ERROR;
        }

        if (i == 0) {
            rcf->node = node;

        } else {
            node->bulk = 1;
            rcf->bulk = node;
        }
    }

    /*
     * eagerly: the first requests should find the connection up; with
     * wait_replicas= both, as small commands take turns on them
     */

    ngx_http_idempotency_redis_node_connect(rcf->node);

    if (rcf->wait) {
        ngx_http_idempotency_redis_node_connect(rcf->bulk);
    }

    return NGX_OK;
}


static void
ngx_http_idempotency_redis_single_exit(ngx_http_idempotency_redis_conf_t *rcf)
{
    if (rcf->bulk) {
        ngx_http_idempotency_redis_node_exit(rcf->bulk);

        rcf->bulk = NULL;
    }

    if (rcf->node) {
        ngx_http_idempotency_redis_node_exit(rcf->node);

        if (rcf->named) {
            ngx_http_idempotency_redis_resolve_exit(rcf->node);
        }

        rcf->node = NULL;
    }
}


static ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_redis_first(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *key)
{
    return rcf->node;
}


/* a single server's (or the sentinels' master's) connections: two at most */

static ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_redis_node_at(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_uint_t i)
{
    switch (i) {

    case 0:
        return rcf->node;

    case 1:
        return rcf->bulk;

    default:
        return NULL;
    }
}


/* a single server's or the sentinels' master hears what is published */

static ngx_http_idempotency_redis_node_t *
ngx_http_idempotency_redis_master(ngx_http_idempotency_redis_conf_t *rcf,
    ngx_http_idempotency_redis_node_t *current)
{
    return rcf->node;
}


/* where the first connection is when it is ready; else it is waited for */

static ngx_int_t
ngx_http_idempotency_redis_follow_address(void *data, const char **host,
    in_port_t *port, const char **reason)
{
    ngx_http_idempotency_redis_follow_t *follow = data;

    const char  *name;

    if (ngx_http_idempotency_redis_node_peer(follow->first, host, port, &name)
        != NGX_OK)
    {
        follow->waiting = 1;
        return NGX_AGAIN;
    }

    follow->waiting = 0;

    return NGX_OK;
}


/*
 * The first connection is ready: the second one, waiting for it, connects;
 * connected elsewhere (the name moved the first one), it moves too
 */

static void
ngx_http_idempotency_redis_follow_ready(void *data,
    ngx_http_idempotency_redis_node_t *node)
{
    ngx_http_idempotency_redis_follow_t *follow = data;

    ngx_http_idempotency_redis_node_t  *second;

    second = follow->second;

    if (follow->waiting) {
        follow->waiting = 0;
        ngx_http_idempotency_redis_node_reconnect(second, 0);
        return;
    }

    if (second->state == NGX_HTTP_IDEMPOTENCY_REDIS_IDLE
        || (second->peer_port == node->peer_port
            && ngx_strcmp(second->peer, node->peer) == 0))
    {
        return;
    }

    ngx_log_error(NGX_LOG_NOTICE, second->log, 0,
                  "idempotency redis: \"%V\": the second connection moves "
                  "from %s:%d to %s:%d, where the first one is",
                  &second->name, second->peer, (int) second->peer_port,
                  node->peer, (int) node->peer_port);

    ngx_http_idempotency_redis_node_reconnect(second, 1);
}


/* one connection, to the master the sentinels name before each connect */

static ngx_int_t
ngx_http_idempotency_redis_sentinel_init(ngx_cycle_t *cycle,
    ngx_http_idempotency_redis_conf_t *rcf)
{
    ngx_http_idempotency_redis_node_t  *node;

    node = ngx_http_idempotency_redis_node_create(rcf, &rcf->host, rcf->port,
                                  &rcf->sentinel_master,
                                  &ngx_http_idempotency_redis_sentinel_place,
                                  NULL, cycle->pool, cycle->log);
    if (node == NULL) {
        return NGX_ERROR;
    }

    node->place_data = ngx_http_idempotency_sentinel_create(cycle->pool, rcf,
                                 node->log,
                                 ngx_http_idempotency_redis_sentinel_handler,
                                 node);
    if (node->place_data == NULL) {
        return NGX_ERROR;
    }

    rcf->node = node;

    ngx_http_idempotency_redis_node_connect(node);

    return NGX_OK;
}


static void
ngx_http_idempotency_redis_sentinel_exit(
    ngx_http_idempotency_redis_conf_t *rcf)
{
    ngx_http_idempotency_redis_node_t  *node;

    node = rcf->node;

    if (node == NULL) {
        return;
    }

    ngx_http_idempotency_redis_node_exit(node);
    ngx_http_idempotency_sentinel_close(node->place_data);

    rcf->node = NULL;
}


/* every connect asks the sentinels first: any loss may be a move */

static ngx_int_t
ngx_http_idempotency_redis_sentinel_address(void *data, const char **host,
    in_port_t *port, const char **reason)
{
    ngx_int_t  rc;

    rc = ngx_http_idempotency_sentinel_master(data, host, port);

    if (rc != NGX_OK && rc != NGX_AGAIN) {
        *reason = "no master from the sentinels (none answered, "
                  "or a failover is running)";
        return NGX_DECLINED;
    }

    return rc;
}


/*
 * The sentinels answered (the next connect takes the answer), or the
 * master moved or is moving: a connection to the old one is closed.
 */

static void
ngx_http_idempotency_redis_sentinel_handler(void *data, ngx_uint_t event)
{
    ngx_http_idempotency_redis_node_reconnect(data,
                               event == NGX_HTTP_IDEMPOTENCY_SENTINEL_SWITCH);
}


static const char *
ngx_http_idempotency_redis_role_check(ngx_http_idempotency_redis_node_t *node,
    redisReply *reply, ngx_http_idempotency_redis_step_t *step)
{
    return ngx_http_idempotency_sentinel_role(reply);
}


/*
 * Any topology: the server takes no writes now (a failover made it a
 * replica, or it is loading its data).  Only the code word is compared:
 * Valkey says "Valkey is loading" where Redis says "Redis is loading".
 */

const char *
ngx_http_idempotency_redis_demoted(redisReply *reply)
{
    /* the texts outlive the reply: a parked op keeps its last error */

    static struct {
        ngx_str_t    code;
        const char  *text;
    } codes[] = {
        { ngx_string("READONLY"), "the master became a replica (READONLY)" },
        { ngx_string("LOADING"), "the master is loading its data (LOADING)" },
        { ngx_string("MASTERDOWN"),
          "the server is a replica without master (MASTERDOWN)" },
        { ngx_null_string, NULL }
    };

    ngx_uint_t  i;

    if (reply->type != REDIS_REPLY_ERROR || reply->str == NULL) {
        return NULL;
    }

    for (i = 0; codes[i].text; i++) {
        if ((size_t) reply->len >= codes[i].code.len
            && ngx_strncmp(reply->str, codes[i].code.data, codes[i].code.len)
               == 0
            && ((size_t) reply->len == codes[i].code.len
                || reply->str[codes[i].code.len] == ' '))
        {
            return codes[i].text;
        }
    }

    return NULL;
}
