/*
 * The arguments of an "idempotency_redis" directive read into one
 * ngx_http_idempotency_redis_conf_t, and the topology of its mode chosen.
 * Configuration side: names the topologies, uses no Redis layer.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_redis_directive.h"
#include "ngx_http_idempotency_redis_topology.h"
#include "ngx_http_idempotency_redis_tls.h"


static char *ngx_http_idempotency_redis_sentinel_check(ngx_conf_t *cf,
    ngx_command_t *cmd, ngx_http_idempotency_redis_conf_t *rcf);
static char *ngx_http_idempotency_redis_address(ngx_conf_t *cf,
    ngx_command_t *cmd, ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *value, ngx_uint_t named);
static char *ngx_http_idempotency_redis_named(ngx_conf_t *cf,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_url_t *u);
static char *ngx_http_idempotency_redis_host(ngx_conf_t *cf,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_url_t *u);
static char *ngx_http_idempotency_redis_option(ngx_conf_t *cf,
    ngx_command_t *cmd, ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *value);


char *
ngx_http_idempotency_redis_conf_parse(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_str_t *text, ngx_http_idempotency_redis_conf_t **out)
{
    char                               *rv;
    ngx_int_t                           rc;
    ngx_str_t                          *value;
    ngx_uint_t                          i, cluster, named;
    ngx_addr_t                         *addr;
    ngx_http_idempotency_redis_conf_t  *rcf;

    value = cf->args->elts;

    rcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_redis_conf_t));
    if (rcf == NULL) {
        return NGX_CONF_ERROR;
    }

    rcf->text = *text;
    rcf->file = cf->conf_file->file.name.data;
    rcf->line = cf->conf_file->line;
    rcf->mode = NGX_HTTP_IDEMPOTENCY_REDIS_SINGLE;
    rcf->db = -1;
    rcf->connect_timeout = 1000;
    rcf->timeout = 1000;
    ngx_str_set(&rcf->prefix, "idem:");

    if (ngx_array_init(&rcf->addrs, cf->pool, 1, sizeof(ngx_addr_t))
        != NGX_OK
        || ngx_array_init(&rcf->hosts, cf->pool, 1, sizeof(ngx_str_t))
           != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    /* known before the addresses are parsed: sentinels default to 26379 */

    cluster = 0;

    for (i = 1; i < cf->args->nelts; i++) {
        if (ngx_strncmp(value[i].data, "sentinel=", 9) == 0) {
            rcf->mode = NGX_HTTP_IDEMPOTENCY_REDIS_SENTINEL;
        }

        /* ... and whether a host name is resolved here or by the workers */

        if (ngx_strcmp(value[i].data, "resolve") == 0) {
            rcf->resolve = 1;
        }

        if (ngx_strcmp(value[i].data, "cluster") == 0) {
            cluster = 1;
        }
    }

    /* Cluster seeds are resolved here; "resolve" is for announced names */

    named = rcf->resolve && !cluster;

    for (i = 1; i < cf->args->nelts; i++) {

        rc = ngx_http_idempotency_redis_tls_option(cf, cmd, rcf, &value[i]);

        if (rc == NGX_ERROR) {
            return NGX_CONF_ERROR;
        }

        if (rc == NGX_OK) {
            continue;
        }

        if (ngx_strlchr(value[i].data, value[i].data + value[i].len, '=')
            != NULL
            || ngx_strcmp(value[i].data, "cluster") == 0
            || ngx_strcmp(value[i].data, "resolve") == 0)
        {
            rv = ngx_http_idempotency_redis_option(cf, cmd, rcf, &value[i]);

        } else {
            rv = ngx_http_idempotency_redis_address(cf, cmd, rcf, &value[i],
                                                    named);
        }

        if (rv != NGX_CONF_OK) {
            return rv;
        }
    }

    if (rcf->addrs.nelts == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "no address in \"%V\" directive", &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (rcf->mode == NGX_HTTP_IDEMPOTENCY_REDIS_SINGLE
        && rcf->addrs.nelts > 1)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "several addresses in \"%V\" directive need "
                           "\"cluster\" or \"sentinel=\"", &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_idempotency_redis_sentinel_check(cf, cmd, rcf)
        != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (rcf->resolve) {
        if (rcf->mode == NGX_HTTP_IDEMPOTENCY_REDIS_SENTINEL) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\" directive: \"resolve\" is not "
                               "possible with \"sentinel=\" (sentinels are "
                               "resolved when the configuration is read)",
                               &cmd->name);
            return NGX_CONF_ERROR;
        }

        /* its resolver is known once the locations are merged */
        rcf->clcf = ngx_http_conf_get_module_loc_conf(cf,
                                                      ngx_http_core_module);
    }

    if (rcf->mode == NGX_HTTP_IDEMPOTENCY_REDIS_CLUSTER) {
        addr = rcf->addrs.elts;

        for (i = 0; i < rcf->addrs.nelts; i++) {
            if (addr[i].sockaddr->sa_family != AF_INET
                && addr[i].sockaddr->sa_family != AF_INET6)
            {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "\"%V\" directive: Redis Cluster nodes "
                                   "are TCP addresses, not \"%V\"",
                                   &cmd->name, &addr[i].name);
                return NGX_CONF_ERROR;
            }
        }

        if (rcf->db > 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\" directive: Redis Cluster has only "
                               "database 0, \"db=%i\" is not possible",
                               &cmd->name, rcf->db);
            return NGX_CONF_ERROR;
        }

        /* SELECT 0 is allowed by a cluster node but says nothing */
        rcf->db = -1;
    }

    if (rcf->user.len && rcf->password.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive: \"user=\" needs \"password=\"",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_idempotency_redis_tls_check(cf, cmd, rcf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    switch (rcf->mode) {

    case NGX_HTTP_IDEMPOTENCY_REDIS_CLUSTER:
        rcf->topology = &ngx_http_idempotency_redis_cluster;
        break;

    case NGX_HTTP_IDEMPOTENCY_REDIS_SENTINEL:
        rcf->topology = &ngx_http_idempotency_redis_sentinel;
        break;

    default:
        rcf->topology = &ngx_http_idempotency_redis_single;
    }

    *out = rcf;

    return NGX_CONF_OK;
}


/* sentinel= is checked here; its options are refused without it */

static char *
ngx_http_idempotency_redis_sentinel_check(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idempotency_redis_conf_t *rcf)
{
    ngx_uint_t   i;
    ngx_addr_t  *addr;

    if (rcf->mode != NGX_HTTP_IDEMPOTENCY_REDIS_SENTINEL) {

        if (rcf->sentinel_password.len || rcf->sentinel_user.len) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\" directive: \"sentinel_user=\" and "
                               "\"sentinel_password=\" need \"sentinel=\"",
                               &cmd->name);
            return NGX_CONF_ERROR;
        }

        return NGX_CONF_OK;
    }

    addr = rcf->addrs.elts;

    for (i = 0; i < rcf->addrs.nelts; i++) {
#if (NGX_HAVE_UNIX_DOMAIN)
        if (addr[i].sockaddr->sa_family == AF_UNIX) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\" directive: sentinel \"%V\" must be "
                               "a host:port, not a unix socket",
                               &cmd->name, &addr[i].name);
            return NGX_CONF_ERROR;
        }
#endif
    }

    if (rcf->sentinel_user.len && rcf->sentinel_password.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive: \"sentinel_user=\" needs "
                           "\"sentinel_password=\"", &cmd->name);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* "named": a host name is kept for the workers to resolve ("resolve") */

static char *
ngx_http_idempotency_redis_address(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *value,
    ngx_uint_t named)
{
    u_char      *p;
    ngx_url_t    u;
    ngx_addr_t  *addr;

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = *value;
    u.default_port = (rcf->mode == NGX_HTTP_IDEMPOTENCY_REDIS_SENTINEL)
                     ? 26379 : 6379;

    /*
     * A host name is resolved here, never with getaddrinfo in a worker;
     * with "resolve" the workers ask nginx's resolver instead
     */

    u.no_resolve = named;

    if (ngx_parse_url(cf->pool, &u) != NGX_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%s in Redis address \"%V\" of \"%V\" directive",
                           u.err ? u.err : "invalid address", value,
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_idempotency_redis_host(cf, rcf, &u) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    if (named && u.naddrs == 0 && rcf->addrs.nelts == 0) {
        return ngx_http_idempotency_redis_named(cf, rcf, &u);
    }

    if (u.naddrs == 0 || u.addrs == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "no address for Redis \"%V\" of \"%V\" directive",
                           value, &cmd->name);
        return NGX_CONF_ERROR;
    }

    addr = ngx_array_push(&rcf->addrs);
    if (addr == NULL) {
        return NGX_CONF_ERROR;
    }

    /* of several addresses of one name, the first one is used */
    *addr = u.addrs[0];

    if (rcf->addrs.nelts > 1) {
        return NGX_CONF_OK;
    }

#if (NGX_HAVE_UNIX_DOMAIN)
    if (addr->sockaddr->sa_family == AF_UNIX) {
        p = ngx_pnalloc(cf->pool, u.url.len - 5 + 1);
        if (p == NULL) {
            return NGX_CONF_ERROR;
        }

        rcf->unix_path.len = u.url.len - 5;
        rcf->unix_path.data = p;
        ngx_cpystrn(p, u.url.data + 5, u.url.len - 5 + 1);

        return NGX_CONF_OK;
    }
#endif

    p = ngx_pnalloc(cf->pool, NGX_SOCKADDR_STRLEN + 1);
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    rcf->host.len = ngx_sock_ntop(addr->sockaddr, addr->socklen, p,
                                  NGX_SOCKADDR_STRLEN, 0);
    p[rcf->host.len] = '\0';
    rcf->host.data = p;
    rcf->port = ngx_inet_get_port(addr->sockaddr);

    return NGX_CONF_OK;
}


/*
 * The host of an address as written (a name, not what it resolved to):
 * the name a TLS connection there sends and checks by default
 */

static char *
ngx_http_idempotency_redis_host(ngx_conf_t *cf,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_url_t *u)
{
    ngx_str_t  *host, h;

    h = u->host;

    if (h.len > 1 && h.data[0] == '[') {
        h.data++;
        h.len -= 2;
    }

    host = ngx_array_push(&rcf->hosts);
    if (host == NULL) {
        return NGX_CONF_ERROR;
    }

    host->data = ngx_pnalloc(cf->pool, h.len + 1);
    if (host->data == NULL) {
        return NGX_CONF_ERROR;
    }

    host->len = h.len;
    ngx_cpystrn(host->data, h.data, h.len + 1);

    return NGX_CONF_OK;
}


/* "resolve" and a host name: kept for the workers, not resolved here */

static char *
ngx_http_idempotency_redis_named(ngx_conf_t *cf,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_url_t *u)
{
    ngx_addr_t  *addr;

    addr = ngx_array_push(&rcf->addrs);
    if (addr == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(addr, sizeof(ngx_addr_t));
    addr->name = u->url;

    rcf->host.data = ngx_pnalloc(cf->pool, u->host.len + 1);
    if (rcf->host.data == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memcpy(rcf->host.data, u->host.data, u->host.len);
    rcf->host.data[u->host.len] = '\0';
    rcf->host.len = u->host.len;
    rcf->port = u->port;
    rcf->named = 1;

    return NGX_CONF_OK;
}


/*
 * After the locations are merged: "resolve" needs a resolver where the
 * directive is (without one nginx puts a resolver with no name server),
 * whether or not a location uses it; the error names the directive's place
 */

ngx_int_t
ngx_http_idempotency_redis_conf_check(ngx_conf_t *cf,
    ngx_http_idempotency_redis_conf_t *rcf)
{
    ngx_addr_t  *addr;

    if (!rcf->resolve) {
        return NGX_OK;
    }

    if (rcf->clcf->resolver == NULL
        || rcf->clcf->resolver->connections.nelts == 0)
    {
        /* not rcf->text: it holds the password */
        addr = rcf->addrs.elts;

        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "\"idempotency_redis\" directive with \"resolve\" "
                      "needs a \"resolver\" where it is (\"%V\") in %s:%ui",
                      &addr[0].name, rcf->file, rcf->line);
        return NGX_ERROR;
    }

    return NGX_OK;
}


static char *
ngx_http_idempotency_redis_option(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *value)
{
    ngx_int_t   n;
    ngx_str_t   v;
    ngx_msec_t  ms;

    if (ngx_strcmp(value->data, "resolve") == 0) {
        /* seen before the addresses were parsed */
        return NGX_CONF_OK;
    }

    if (ngx_strcmp(value->data, "cluster") == 0) {

        if (rcf->mode == NGX_HTTP_IDEMPOTENCY_REDIS_SENTINEL) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"cluster\" and \"sentinel=\" cannot be "
                               "combined in \"%V\" directive", &cmd->name);
            return NGX_CONF_ERROR;
        }

        rcf->mode = NGX_HTTP_IDEMPOTENCY_REDIS_CLUSTER;
        return NGX_CONF_OK;
    }

    if (ngx_strncmp(value->data, "db=", 3) == 0) {
        v.data = value->data + 3;
        v.len = value->len - 3;

        n = ngx_atoi(v.data, v.len);
        if (n == NGX_ERROR) {
            goto invalid;
        }

        rcf->db = n;
        return NGX_CONF_OK;
    }

    if (ngx_strncmp(value->data, "user=", 5) == 0) {
        rcf->user.data = value->data + 5;
        rcf->user.len = value->len - 5;

        if (rcf->user.len == 0) {
            goto invalid;
        }

        return NGX_CONF_OK;
    }

    if (ngx_strncmp(value->data, "password=", 9) == 0) {
        rcf->password.data = value->data + 9;
        rcf->password.len = value->len - 9;

        if (rcf->password.len == 0) {
            goto invalid;
        }

        return NGX_CONF_OK;
    }

    if (ngx_strncmp(value->data, "prefix=", 7) == 0) {
        rcf->prefix.data = value->data + 7;
        rcf->prefix.len = value->len - 7;
        return NGX_CONF_OK;
    }

    if (ngx_strncmp(value->data, "sentinel=", 9) == 0) {
        rcf->sentinel_master.data = value->data + 9;
        rcf->sentinel_master.len = value->len - 9;

        if (rcf->sentinel_master.len == 0) {
            goto invalid;
        }

        rcf->mode = NGX_HTTP_IDEMPOTENCY_REDIS_SENTINEL;
        return NGX_CONF_OK;
    }

    if (ngx_strncmp(value->data, "sentinel_user=", 14) == 0) {
        rcf->sentinel_user.data = value->data + 14;
        rcf->sentinel_user.len = value->len - 14;

        if (rcf->sentinel_user.len == 0) {
            goto invalid;
        }

        return NGX_CONF_OK;
    }

    if (ngx_strncmp(value->data, "sentinel_password=", 18) == 0) {
        rcf->sentinel_password.data = value->data + 18;
        rcf->sentinel_password.len = value->len - 18;

        if (rcf->sentinel_password.len == 0) {
            goto invalid;
        }

        return NGX_CONF_OK;
    }

    if (ngx_strncmp(value->data, "connect_timeout=", 16) == 0) {
        v.data = value->data + 16;
        v.len = value->len - 16;

        ms = ngx_parse_time(&v, 0);
        if (ms == (ngx_msec_t) NGX_ERROR || ms == 0) {
            goto invalid;
        }

        rcf->connect_timeout = ms;
        return NGX_CONF_OK;
    }

    if (ngx_strncmp(value->data, "timeout=", 8) == 0) {
        v.data = value->data + 8;
        v.len = value->len - 8;

        ms = ngx_parse_time(&v, 0);
        if (ms == (ngx_msec_t) NGX_ERROR || ms == 0) {
            goto invalid;
        }

        rcf->timeout = ms;
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "unknown option \"%V\" in \"%V\" directive",
                       value, &cmd->name);
    return NGX_CONF_ERROR;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid option value \"%V\" in \"%V\" directive",
                       value, &cmd->name);
    return NGX_CONF_ERROR;
}
