/*
 * TLS on Redis connections through nginx's SSL layer (part of the
 * connection layer): hiredis stays the command queue and the RESP codec,
 * but never touches the socket of a TLS connection.  nginx connects-tests
 * it, runs the handshake, and moves the bytes: what hiredis queued in its
 * output buffer goes out through c->send_chain, what comes in is fed to
 * hiredis's reader.  This works the same with hiredis 0.14, which has no
 * TLS, and with 1.x.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>

#include <hiredis/sds.h>

#include "ngx_http_idempotency_redis_node.h"
#include "ngx_http_idempotency_redis_tls.h"


#if (NGX_SSL)

/* in every hiredis from 0.14 to 1.4, exported but in no public header */
void redisProcessCallbacks(redisAsyncContext *ac);


/* what a TLS connection keeps, in its pool, reached through its SSL */
typedef struct {
    ngx_event_handler_pt   read;    /* the caller's, put back after */
    ngx_event_handler_pt   write;   /* the handshake */
    ngx_flag_t             verify;
    ngx_uint_t             level;   /* of the log it was given */
    unsigned               up:1;    /* hiredis heard of the connect */
} ngx_http_idempotency_redis_tls_conn_t;


static ngx_int_t ngx_http_idempotency_redis_tls_ctx(ngx_conf_t *cf,
    ngx_http_idempotency_redis_tls_t *tls);
static ngx_uint_t ngx_http_idempotency_redis_tls_ip(u_char *name,
    size_t len);
static ngx_int_t ngx_http_idempotency_redis_tls_name(ngx_connection_t *c,
    ngx_http_idempotency_redis_tls_t *tls, const char *name);
static ngx_http_idempotency_redis_tls_conn_t *
    ngx_http_idempotency_redis_tls_conn(ngx_connection_t *c);
static void ngx_http_idempotency_redis_tls_connected(ngx_connection_t *c);
static void ngx_http_idempotency_redis_tls_handshaked(ngx_connection_t *c);
static void ngx_http_idempotency_redis_tls_fail(ngx_connection_t *c,
    int err, const char *fmt, ...);
static void ngx_http_idempotency_redis_tls_read_handler(ngx_event_t *rev);
static void ngx_http_idempotency_redis_tls_write_handler(ngx_event_t *wev);
static void ngx_http_idempotency_redis_tls_add_write(void *privdata);
static void ngx_http_idempotency_redis_tls_noop(void *privdata);
static void ngx_http_idempotency_redis_tls_cleanup(void *privdata);
static u_char *ngx_http_idempotency_redis_tls_log(ngx_log_t *log,
    u_char *buf, size_t len);


static int  ngx_http_idempotency_redis_tls_index = -1;

#endif


ngx_int_t
ngx_http_idempotency_redis_tls_option(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *value)
{
    ngx_str_t                          *field, v;
    ngx_http_idempotency_redis_tls_t   *tls;

    if (ngx_strcmp(value->data, "tls") != 0
        && ngx_strncmp(value->data, "tls_", 4) != 0)
    {
        return NGX_DECLINED;
    }

    tls = rcf->tls;

    if (tls == NULL) {
        tls = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_redis_tls_t));
        if (tls == NULL) {
            return NGX_ERROR;
        }

        tls->verify = 1;
        rcf->tls = tls;
    }

    if (ngx_strcmp(value->data, "tls") == 0) {
        tls->on = 1;
        return NGX_OK;
    }

    v.data = (u_char *) ngx_strlchr(value->data, value->data + value->len,
                                    '=');
    if (v.data == NULL) {
        goto unknown;
    }

    v.data++;
    v.len = value->data + value->len - v.data;

    if (ngx_strncmp(value->data, "tls_verify=", 11) == 0) {
        if (ngx_strcmp(v.data, "on") == 0) {
            tls->verify = 1;

        } else if (ngx_strcmp(v.data, "off") == 0) {
            tls->verify = 0;

        } else {
            goto invalid;
        }

        return NGX_OK;
    }

    if (ngx_strncmp(value->data, "tls_trusted_certificate=", 24) == 0) {
        field = &tls->trusted_certificate;

    } else if (ngx_strncmp(value->data, "tls_server_name=", 16) == 0) {
        field = &tls->server_name;

    } else if (ngx_strncmp(value->data, "tls_certificate=", 16) == 0) {
        field = &tls->certificate;

    } else if (ngx_strncmp(value->data, "tls_certificate_key=", 20) == 0) {
        field = &tls->certificate_key;

    } else {
        goto unknown;
    }

    if (v.len == 0) {
        goto invalid;
    }

    /* the arguments are NUL-ended: so is v */
    *field = v;

    return NGX_OK;

unknown:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "unknown option \"%V\" in \"%V\" directive",
                       value, &cmd->name);
    return NGX_ERROR;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid option value \"%V\" in \"%V\" directive",
                       value, &cmd->name);
    return NGX_ERROR;
}


char *
ngx_http_idempotency_redis_tls_check(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idempotency_redis_conf_t *rcf)
{
    ngx_http_idempotency_redis_tls_t  *tls;

    tls = rcf->tls;

    if (tls == NULL) {
        return NGX_CONF_OK;
    }

    if (!tls->on) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive: \"tls_*\" options need "
                           "\"tls\"", &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (rcf->unix_path.len) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive: \"tls\" needs a host:port, "
                           "not \"unix:%V\"", &cmd->name, &rcf->unix_path);
        return NGX_CONF_ERROR;
    }

    if (tls->certificate_key.len && tls->certificate.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive: \"tls_certificate_key=\" "
                           "needs \"tls_certificate=\"", &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (tls->certificate.len && tls->certificate_key.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive: \"tls_certificate=\" "
                           "needs \"tls_certificate_key=\"", &cmd->name);
        return NGX_CONF_ERROR;
    }

#if (NGX_SSL)

    /* each address's host as the address parser read it */
    tls->names = rcf->hosts;

    if (ngx_http_idempotency_redis_tls_ctx(cf, tls) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;

#else

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"%V\" directive: \"tls\" needs an nginx built "
                       "with OpenSSL (e.g. --with-http_ssl_module)",
                       &cmd->name);
    return NGX_CONF_ERROR;

#endif
}


/*
 * A TLS connection's name in logs and in the status is its address after
 * "tls://": a TLS and a plain connection to one address tell apart
 */

ngx_int_t
ngx_http_idempotency_redis_tls_conn_name(ngx_pool_t *pool,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *name,
    ngx_str_t *out)
{
    u_char  *p;

    if (rcf->tls == NULL) {
        *out = *name;
        return NGX_OK;
    }

    p = ngx_pnalloc(pool, sizeof("tls://") - 1 + name->len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    out->data = p;
    out->len = ngx_sprintf(p, "tls://%V", name) - p;

    return NGX_OK;
}


/*
 * TCP connected, TLS not up: a server that does not speak TLS there
 * (Redis's plain port waits for a line that a ClientHello never ends)
 * answers nothing, and the operator should hear what that likely means
 */

const char *
ngx_http_idempotency_redis_tls_timed_out(redisAsyncContext *ac)
{
    if (ac->c.flags & REDIS_CONNECTED) {
        return "timed out in the TLS handshake, the server never "
               "answered it (a port without TLS, such as Redis's plain "
               "port?)";
    }

    return "timed out";
}


#if (NGX_SSL)

/*
 * The client context: the files are read now, by the master (workers may
 * not be able to), and workers inherit the context.
 */

static ngx_int_t
ngx_http_idempotency_redis_tls_ctx(ngx_conf_t *cf,
    ngx_http_idempotency_redis_tls_t *tls)
{
    ngx_pool_cleanup_t  *cln;

    tls->ssl = ngx_pcalloc(cf->pool, sizeof(ngx_ssl_t));
    if (tls->ssl == NULL) {
        return NGX_ERROR;
    }

    tls->ssl->log = cf->log;

    if (ngx_ssl_create(tls->ssl, NGX_SSL_TLSv1_2|NGX_SSL_TLSv1_3, NULL)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        ngx_ssl_cleanup_ctx(tls->ssl);
        return NGX_ERROR;
    }

    cln->handler = ngx_ssl_cleanup_ctx;
    cln->data = tls->ssl;

    /* OpenSSL's errors name neither the directive nor its place */

    if (tls->certificate.len
        && ngx_ssl_certificate(cf, tls->ssl, &tls->certificate,
                               &tls->certificate_key, NULL)
           != NGX_OK)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_redis\" directive: cannot load "
                           "\"tls_certificate=%V\" with its "
                           "\"tls_certificate_key=\"", &tls->certificate);
        return NGX_ERROR;
    }

    if (tls->trusted_certificate.len) {
        if (ngx_ssl_trusted_certificate(cf, tls->ssl,
                                        &tls->trusted_certificate, 9)
            != NGX_OK)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_redis\" directive: cannot "
                               "load \"tls_trusted_certificate=%V\"",
                               &tls->trusted_certificate);
            return NGX_ERROR;
        }

    } else if (SSL_CTX_set_default_verify_paths(tls->ssl->ctx) != 1) {
        ngx_ssl_error(NGX_LOG_EMERG, cf->log, 0,
                      "SSL_CTX_set_default_verify_paths() failed");
        return NGX_ERROR;
    }

    if (ngx_ssl_client_session_cache(cf, tls->ssl, 1) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_idempotency_redis_tls_index == -1) {
        ngx_http_idempotency_redis_tls_index = SSL_get_ex_new_index(0, NULL,
                                                            NULL, NULL, NULL);
        if (ngx_http_idempotency_redis_tls_index == -1) {
            ngx_ssl_error(NGX_LOG_EMERG, cf->log, 0,
                          "SSL_get_ex_new_index() failed");
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


ngx_connection_t *
ngx_http_idempotency_redis_tls_attach(redisAsyncContext *ac,
    ngx_http_idempotency_redis_tls_t *tls, const char *name,
    ngx_ssl_session_t *session, ngx_connection_handler_pt save,
    ngx_str_t *peer, ngx_uint_t quiet, ngx_log_t *log)
{
    ngx_int_t                               event;
    ngx_log_t                              *clog;
    ngx_connection_t                       *c;
    ngx_http_idempotency_redis_tls_conn_t  *tc;

    c = ngx_get_connection(ac->c.fd, log);
    if (c == NULL) {
        return NULL;
    }

    c->pool = ngx_create_pool(1024, log);
    if (c->pool == NULL) {
        ngx_close_connection(c);
        return NULL;
    }

    /*
     * The connection's own log, as nginx gives each client connection
     * one: nginx's SSL layer writes its lines there (SSL_do_handshake(),
     * SSL_read() failed), named after the peer.  As for nginx's upstream
     * connections, the reasons nginx counts as the peer's go at "error";
     * in a streak of failures whose first was logged nothing is written:
     * the caller logs each streak once, and a server that breaks every
     * handshake must not get a line per reconnect.  nginx writes some
     * reasons at "crit" whatever c->log_error says (a client certificate
     * the server requires, with TLSv1.3): hence a level, not only
     * log_error.  With debug logging everything stays.
     */

    clog = ngx_palloc(c->pool, sizeof(ngx_log_t));
    if (clog == NULL) {
        ngx_destroy_pool(c->pool);
        c->fd = (ngx_socket_t) -1;
        ngx_free_connection(c);
        return NULL;
    }

    *clog = *log;
    clog->handler = ngx_http_idempotency_redis_tls_log;
    clog->data = peer;
    clog->action = "TLS handshaking";

    c->log = clog;
    c->pool->log = clog;

    c->data = ac;
    c->read->handler = ngx_http_idempotency_redis_tls_read_handler;
    c->write->handler = ngx_http_idempotency_redis_tls_write_handler;
    c->read->log = clog;
    c->write->log = clog;
    c->number = ngx_atomic_fetch_add(ngx_connection_counter, 1);

    c->recv = ngx_recv;
    c->send = ngx_send;
    c->recv_chain = ngx_recv_chain;
    c->send_chain = ngx_send_chain;

    tc = ngx_pcalloc(c->pool, sizeof(ngx_http_idempotency_redis_tls_conn_t));
    if (tc == NULL) {
        goto failed;
    }

    tc->verify = tls->verify;
    tc->level = log->log_level;

    if (ngx_ssl_create_connection(tls->ssl, c,
                                  NGX_SSL_BUFFER|NGX_SSL_CLIENT)
        != NGX_OK)
    {
        goto failed;
    }

    if (SSL_set_ex_data(c->ssl->connection,
                        ngx_http_idempotency_redis_tls_index, tc)
        == 0)
    {
        ngx_ssl_error(NGX_LOG_ALERT, log, 0, "SSL_set_ex_data() failed");
        goto failed;
    }

    ngx_http_idempotency_redis_tls_quiet(c, quiet);

    if (ngx_http_idempotency_redis_tls_name(c, tls, name) != NGX_OK) {
        goto failed;
    }

    if (session && ngx_ssl_set_session(c, session) != NGX_OK) {
        goto failed;
    }

    c->ssl->save_session = save;

    /* the hooks hiredis calls: it asks to write, nginx does the rest */

    ac->ev.data = c;
    ac->ev.addRead = ngx_http_idempotency_redis_tls_noop;
    ac->ev.delRead = ngx_http_idempotency_redis_tls_noop;
    ac->ev.addWrite = ngx_http_idempotency_redis_tls_add_write;
    ac->ev.delWrite = ngx_http_idempotency_redis_tls_noop;
    ac->ev.cleanup = ngx_http_idempotency_redis_tls_cleanup;

    /* as ngx_event_connect_peer(): edge-triggered where there is such */

    if (ngx_add_conn && (ngx_event_flags & NGX_USE_IOCP_EVENT) == 0) {
        if (ngx_add_conn(c) == NGX_ERROR) {
            goto unhook;
        }

    } else {
        event = (ngx_event_flags & NGX_USE_CLEAR_EVENT) ? NGX_CLEAR_EVENT
                                                        : NGX_LEVEL_EVENT;

        if (ngx_add_event(c->read, NGX_READ_EVENT, event) != NGX_OK
            || ngx_add_event(c->write, NGX_WRITE_EVENT, event) != NGX_OK)
        {
            goto unhook;
        }
    }

    return c;

unhook:

    ac->ev.data = NULL;
    ac->ev.cleanup = NULL;

failed:

    /* the fd stays hiredis's, which closes it when the context is freed */

    if (c->ssl) {
        c->ssl->no_wait_shutdown = 1;
        c->ssl->no_send_shutdown = 1;
        (void) ngx_ssl_shutdown(c);
    }

    ngx_destroy_pool(c->pool);
    c->fd = (ngx_socket_t) -1;
    ngx_free_connection(c);

    return NULL;
}


/*
 * SNI (never for an IP address) and the name the certificate must have:
 * OpenSSL checks it with the chain (as X509_check_host() or
 * X509_check_ip_asc() would), SSL_get_verify_result() tells.
 */

static ngx_int_t
ngx_http_idempotency_redis_tls_name(ngx_connection_t *c,
    ngx_http_idempotency_redis_tls_t *tls, const char *name)
{
    size_t              len;
    ngx_str_t          *names;
    X509_VERIFY_PARAM  *param;

    if (tls->server_name.len) {
        name = (const char *) tls->server_name.data;

    } else if (name == NULL) {
        names = tls->names.elts;
        name = (tls->names.nelts) ? (const char *) names[0].data : "";
    }

    len = ngx_strlen(name);

    if (len == 0) {
        return NGX_OK;
    }

    if (ngx_http_idempotency_redis_tls_ip((u_char *) name, len)) {

        if (!tls->verify) {
            return NGX_OK;
        }

        param = SSL_get0_param(c->ssl->connection);

        if (X509_VERIFY_PARAM_set1_ip_asc(param, name) != 1) {
            ngx_ssl_error(NGX_LOG_ERR, c->log, 0,
                          "X509_VERIFY_PARAM_set1_ip_asc(\"%s\") failed",
                          name);
            return NGX_ERROR;
        }

        return NGX_OK;
    }

    if (SSL_set_tlsext_host_name(c->ssl->connection, (char *) name) != 1) {
        ngx_ssl_error(NGX_LOG_ERR, c->log, 0,
                      "SSL_set_tlsext_host_name(\"%s\") failed", name);
        return NGX_ERROR;
    }

    if (tls->verify && SSL_set1_host(c->ssl->connection, name) != 1) {
        ngx_ssl_error(NGX_LOG_ERR, c->log, 0,
                      "SSL_set1_host(\"%s\") failed", name);
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_uint_t
ngx_http_idempotency_redis_tls_ip(u_char *name, size_t len)
{
#if (NGX_HAVE_INET6)
    u_char  addr6[16];

    if (ngx_inet6_addr(name, len, addr6) == NGX_OK) {
        return 1;
    }
#endif

    return ngx_inet_addr(name, len) != INADDR_NONE;
}


static ngx_http_idempotency_redis_tls_conn_t *
ngx_http_idempotency_redis_tls_conn(ngx_connection_t *c)
{
    return SSL_get_ex_data(c->ssl->connection,
                           ngx_http_idempotency_redis_tls_index);
}


/*
 * Read what came, feed it to hiredis, run the callbacks of the replies
 * that are whole.  One buffer a call: when more is ready the event is
 * posted to the next pass of the event loop (other connections get their
 * turn; a connection closed by a callback takes its posted event along).
 */

void
ngx_http_idempotency_redis_tls_read(ngx_connection_t *c)
{
    ssize_t             n;
    redisAsyncContext  *ac;

    static u_char       buf[16384];

    ac = c->data;

    if (!(ac->c.flags & REDIS_CONNECTED)) {
        ngx_http_idempotency_redis_tls_connected(c);
        return;
    }

    n = c->recv(c, buf, sizeof(buf));

    if (n == NGX_AGAIN) {
        if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
            ngx_http_idempotency_redis_tls_fail(c, REDIS_ERR_IO,
                                                "adding read event failed");
        }

        return;
    }

    if (n == 0) {
        ngx_http_idempotency_redis_tls_fail(c, REDIS_ERR_EOF,
                                            "Server closed the connection");
        return;
    }

    if (n < 0) {
        ngx_http_idempotency_redis_tls_fail(c, REDIS_ERR_IO,
                                            "TLS read failed");
        return;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "idempotency redis: tls read %z bytes, fd:%d", n, c->fd);

    if (c->read->ready && !c->read->posted) {
        ngx_post_event(c->read, &ngx_posted_next_events);
    }

    if (redisReaderFeed(ac->c.reader, (const char *) buf, n) != REDIS_OK) {
        ngx_http_idempotency_redis_tls_fail(c, REDIS_ERR_OOM,
                                            "out of memory");
        return;
    }

    /* may free the context, and close c */
    redisProcessCallbacks(ac);
}


/*
 * Hands what hiredis queued to nginx's SSL layer, which keeps what the
 * socket did not take in its own buffer (a retried SSL_write() needs the
 * same bytes): hiredis's buffer may grow and move meanwhile.
 */

void
ngx_http_idempotency_redis_tls_write(ngx_connection_t *c)
{
    size_t                                  len, sent;
    ngx_buf_t                               b;
    ngx_chain_t                             cl, *rc;
    redisAsyncContext                      *ac;
    ngx_http_idempotency_redis_tls_conn_t  *tc;

    ac = c->data;

    if (!(ac->c.flags & REDIS_CONNECTED)) {
        ngx_http_idempotency_redis_tls_connected(c);
        return;
    }

    tc = ngx_http_idempotency_redis_tls_conn(c);

    if (!tc->up || ac->c.obuf == NULL) {
        return;
    }

    len = sdslen(ac->c.obuf);

    if (len == 0 && ngx_http_idempotency_redis_tls_flushed(c)) {
        return;
    }

    ngx_memzero(&b, sizeof(ngx_buf_t));
    b.pos = (u_char *) ac->c.obuf;
    b.last = b.pos + len;
    b.memory = 1;
    b.flush = 1;

    cl.buf = &b;
    cl.next = NULL;

    rc = c->send_chain(c, len ? &cl : NULL, 0);

    if (rc == NGX_CHAIN_ERROR) {
        ngx_http_idempotency_redis_tls_fail(c, REDIS_ERR_IO,
                                            "TLS write failed");
        return;
    }

    sent = b.pos - (u_char *) ac->c.obuf;

    if (sent) {
        sdsrange(ac->c.obuf, sent, -1);
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "idempotency redis: tls took %uz of %uz bytes, fd:%d",
                   sent, len, c->fd);

    if (ngx_handle_write_event(c->write, 0) != NGX_OK) {
        ngx_http_idempotency_redis_tls_fail(c, REDIS_ERR_IO,
                                            "adding write event failed");
    }
}


/* the TCP connect ended: the TLS handshake starts */

static void
ngx_http_idempotency_redis_tls_connected(ngx_connection_t *c)
{
    int                                     err;
    ngx_int_t                               rc;
    socklen_t                               len;
    redisAsyncContext                      *ac;
    ngx_http_idempotency_redis_tls_conn_t  *tc;

    ac = c->data;

    err = 0;
    len = sizeof(int);

    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, (void *) &err, &len) == -1) {
        err = ngx_socket_errno;
    }

    if (err) {
        ngx_http_idempotency_redis_tls_fail(c, REDIS_ERR_IO, "%s",
                                            strerror(err));
        return;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "idempotency redis: tls handshake, fd:%d", c->fd);

    /* hiredis would: it must see a connected context from now on */
    ac->c.flags |= REDIS_CONNECTED;

    tc = ngx_http_idempotency_redis_tls_conn(c);
    tc->read = c->read->handler;
    tc->write = c->write->handler;

    rc = ngx_ssl_handshake(c);

    if (rc == NGX_AGAIN) {
        c->ssl->handler = ngx_http_idempotency_redis_tls_handshaked;
        return;
    }

    ngx_http_idempotency_redis_tls_handshaked(c);
}


/* the node's connect timer covers the handshake: no timer of its own */

static void
ngx_http_idempotency_redis_tls_handshaked(ngx_connection_t *c)
{
    long                                    rc;
    X509                                   *cert;
    redisAsyncContext                      *ac;
    ngx_http_idempotency_redis_tls_conn_t  *tc;

    ac = c->data;
    tc = ngx_http_idempotency_redis_tls_conn(c);

    c->read->handler = tc->read;
    c->write->handler = tc->write;

    if (!c->ssl->handshaked) {
        /* nginx logged OpenSSL's reason */
        ngx_http_idempotency_redis_tls_fail(c, REDIS_ERR_IO,
                                            "TLS handshake failed");
        return;
    }

    if (tc->verify) {
        cert = SSL_get_peer_certificate(c->ssl->connection);

        if (cert == NULL) {
            ngx_http_idempotency_redis_tls_fail(c, REDIS_ERR_IO,
                                        "TLS server sent no certificate");
            return;
        }

        X509_free(cert);

        rc = SSL_get_verify_result(c->ssl->connection);

        if (rc != X509_V_OK) {
            ngx_http_idempotency_redis_tls_fail(c, REDIS_ERR_IO,
                                  "TLS certificate verify failed: (%l) %s",
                                  rc, X509_verify_cert_error_string(rc));
            return;
        }
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "idempotency redis: tls up, fd:%d, %s session",
                   c->fd, SSL_session_reused(c->ssl->connection)
                          ? "resumed" : "new");

    tc->up = 1;
    c->log->action = NULL;

    if (ac->onConnect) {
        ac->onConnect(ac, REDIS_OK);
    }

    /* what was queued meanwhile, and what may have come already */

    ngx_post_event(c->write, &ngx_posted_events);

    if (!c->read->posted) {
        ngx_post_event(c->read, &ngx_posted_events);
    }
}


/*
 * hiredis gives up on the connection, with the reason in the context as
 * its own I/O would have left it; the context is freed, c with it.  Never
 * called inside a hiredis callback.
 */

static void
ngx_http_idempotency_redis_tls_fail(ngx_connection_t *c, int err,
    const char *fmt, ...)
{
    u_char                                 *p;
    va_list                                 args;
    redisAsyncContext                      *ac;
    redisDisconnectCallback                *fn;
    ngx_http_idempotency_redis_tls_conn_t  *tc;

    ac = c->data;
    tc = ngx_http_idempotency_redis_tls_conn(c);

    va_start(args, fmt);
    p = ngx_vslprintf((u_char *) ac->c.errstr,
                      (u_char *) ac->c.errstr + sizeof(ac->c.errstr) - 1,
                      fmt, args);
    va_end(args);

    *p = '\0';

    ac->c.err = err;
    ac->err = err;
    ac->errstr = ac->c.errstr;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "idempotency redis: tls failed, fd:%d: %s",
                   c->fd, ac->c.errstr);

    if (!tc->up) {
        /* as a failed connect: no disconnect callback */
        ac->c.flags &= ~REDIS_CONNECTED;

        if (ac->onConnect) {
            ac->onConnect(ac, REDIS_ERR);
        }

    } else if (ac->onDisconnect) {
        fn = ac->onDisconnect;
        ac->onDisconnect = NULL;
        fn(ac, REDIS_ERR);
    }

    redisAsyncFree(ac);
}


/* a node keeps the session of its last handshake for its next connect */

void
ngx_http_idempotency_redis_tls_save_session(ngx_connection_t *c)
{
    redisAsyncContext                  *ac;
    ngx_ssl_session_t                  *session;
    ngx_http_idempotency_redis_node_t  *node;

    ac = c->data;
    node = ac->data;

    session = ngx_ssl_get_session(c);
    if (session == NULL) {
        return;
    }

    if (node->tls_session) {
        ngx_ssl_free_session(node->tls_session);
    }

    node->tls_session = session;
}


static void
ngx_http_idempotency_redis_tls_read_handler(ngx_event_t *rev)
{
    ngx_http_idempotency_redis_tls_read(rev->data);
}


static void
ngx_http_idempotency_redis_tls_write_handler(ngx_event_t *wev)
{
    ngx_http_idempotency_redis_tls_write(wev->data);
}


/* as for plain connections: one send for all queued in this pass */

static void
ngx_http_idempotency_redis_tls_add_write(void *privdata)
{
    ngx_connection_t                       *c = privdata;
    ngx_http_idempotency_redis_tls_conn_t  *tc;

    if (c == NULL || c->write->posted) {
        return;
    }

    tc = ngx_http_idempotency_redis_tls_conn(c);

    if (tc->up) {
        ngx_post_event(c->write, &ngx_posted_next_events);
    }
}


/* the events stay armed (edge-triggered): nothing to add or delete */

static void
ngx_http_idempotency_redis_tls_noop(void *privdata)
{
}


/* as ngx_http_idempotency_redis_cleanup(), the TLS session ended first */

static void
ngx_http_idempotency_redis_tls_cleanup(void *privdata)
{
    ngx_pool_t         *pool;
    ngx_connection_t   *c = privdata;
    redisAsyncContext  *ac;

    if (c == NULL) {
        return;
    }

    ac = c->data;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "idempotency redis: close tls fd:%d", c->fd);

    if (c->ssl) {
        c->ssl->no_wait_shutdown = 1;
        c->ssl->no_send_shutdown = 1;
        (void) ngx_ssl_shutdown(c);
    }

    pool = c->pool;

    ngx_close_connection(c);
    ngx_destroy_pool(pool);

    ac->c.fd = -1;
    ac->ev.data = NULL;
}



/*
 * nginx's SSL lines of the connection written (as for nginx's upstream
 * connections) or not (quiet), from now on; see tls_attach()
 */

void
ngx_http_idempotency_redis_tls_quiet(ngx_connection_t *c, ngx_uint_t quiet)
{
    ngx_http_idempotency_redis_tls_conn_t  *tc;

    tc = ngx_http_idempotency_redis_tls_conn(c);

    c->log->log_level = tc->level;
    c->log_error = quiet ? NGX_ERROR_INFO : NGX_ERROR_ERR;

    if (quiet && (tc->level & NGX_LOG_DEBUG_ALL) == 0) {
        c->log->log_level = ngx_min(tc->level, NGX_LOG_ALERT);
    }
}


/* the lines nginx's SSL layer writes name the Redis connection */

static u_char *
ngx_http_idempotency_redis_tls_log(ngx_log_t *log, u_char *buf, size_t len)
{
    u_char     *p;
    ngx_str_t  *peer;

    p = buf;

    if (log->action) {
        p = ngx_snprintf(p, len, " while %s", log->action);
        len -= p - buf;
    }

    peer = log->data;

    if (peer) {
        p = ngx_snprintf(p, len, ", redis: \"%V\"", peer);
    }

    return p;
}

#endif
