/*
 * One "idempotency_redis" directive: what every Redis layer reads.
 * Data only; it names the layers' types without using any of them.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_CONF_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_CONF_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>


#define NGX_HTTP_IDEMPOTENCY_REDIS_SINGLE    0
#define NGX_HTTP_IDEMPOTENCY_REDIS_CLUSTER   1
#define NGX_HTTP_IDEMPOTENCY_REDIS_SENTINEL  2


typedef struct ngx_http_idempotency_redis_node_s
    ngx_http_idempotency_redis_node_t;
typedef struct ngx_http_idempotency_redis_op_s
    ngx_http_idempotency_redis_op_t;
typedef struct ngx_http_idempotency_cluster_s
    ngx_http_idempotency_cluster_t;
typedef struct ngx_http_idempotency_redis_topology_s
    ngx_http_idempotency_redis_topology_t;
typedef struct ngx_http_idempotency_redis_tls_s
    ngx_http_idempotency_redis_tls_t;


/* one "idempotency_redis" directive; identical directives share one */
typedef struct {
    ngx_str_t                            text;     /* all arguments, for logs */
    u_char                              *file;     /* where the directive is, */
    ngx_uint_t                           line;     /* for errors found later */
    ngx_uint_t                           mode;
    ngx_array_t                          addrs;    /* of ngx_addr_t */
    ngx_array_t                          hosts;    /* of ngx_str_t, below */
    ngx_str_t                            host;     /* IP or name, NUL-ended */
    in_port_t                            port;
    ngx_str_t                            unix_path; /* NUL-ended, or empty */
    ngx_str_t                            sentinel_master;
    ngx_str_t                            sentinel_user;
    ngx_str_t                            sentinel_password;
    ngx_int_t                            db;       /* -1: no SELECT */
    ngx_str_t                            user;
    ngx_str_t                            password;
    ngx_msec_t                           connect_timeout;
    ngx_msec_t                           timeout;
    ngx_str_t                            prefix;
    ngx_http_idempotency_redis_tls_t    *tls;      /* NULL: plain */

    /*
     * hosts: the host of each address in addrs as written (a name or an
     * IP, without brackets; "" for unix:), NUL-ended: what TLS checks
     *
     * "resolve": the workers resolve host names with the resolver of
     * clcf (where the directive first is); "named": the address is a
     * host name, in host (its ngx_addr_t has no sockaddr)
     */
    ngx_http_core_loc_conf_t            *clcf;
    unsigned                             resolve:1;
    unsigned                             named:1;

    /* single, Sentinel or Cluster: set with the mode, when it is parsed */
    const ngx_http_idempotency_redis_topology_t  *topology;

    /* per-worker state, set up in init_process (memory is per process) */
    ngx_http_idempotency_redis_node_t   *node;
    ngx_http_idempotency_redis_node_t   *bulk;     /* large commands */
    ngx_http_idempotency_cluster_t      *cluster;  /* "cluster" only */
} ngx_http_idempotency_redis_conf_t;


/*
 * Counters of one Redis address in this worker, for logs and metrics.
 * "Parked" ops are retryable commands kept in the worker while Redis cannot
 * be reached, waiting to be sent again.
 */
typedef struct {
    ngx_uint_t                           parked;       /* now */
    size_t                               parked_bytes; /* now */
    ngx_uint_t                           retried;      /* resends, in total */
    ngx_uint_t                           given_up;     /* in total */
} ngx_http_idempotency_redis_stats_t;



#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_CONF_H_INCLUDED_ */
