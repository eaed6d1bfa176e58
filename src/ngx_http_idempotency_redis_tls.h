/*
 * TLS on Redis connections, through nginx's own SSL layer: the "tls" and
 * "tls_*" options of "idempotency_redis", and a hiredis context whose
 * bytes go through nginx's SSL connection (part of the connection layer).
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_REDIS_TLS_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_REDIS_TLS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_redis_conf.h"


struct ngx_http_idempotency_redis_tls_s {
    ngx_flag_t                  verify;
    ngx_str_t                   server_name;   /* NUL-ended, or empty */
    ngx_str_t                   trusted_certificate;
    ngx_str_t                   certificate;
    ngx_str_t                   certificate_key;
    ngx_array_t                 names;  /* of ngx_str_t, as rcf->addrs */
#if (NGX_SSL)
    ngx_ssl_t                  *ssl;
#endif
    unsigned                    on:1;   /* "tls" */
};


/*
 * A "tls" or "tls_*" option into rcf->tls: NGX_OK, NGX_ERROR (logged), or
 * NGX_DECLINED: not a TLS option.
 */
ngx_int_t ngx_http_idempotency_redis_tls_option(ngx_conf_t *cf,
    ngx_command_t *cmd, ngx_http_idempotency_redis_conf_t *rcf,
    ngx_str_t *value);

/* after every option: the rules, the files read, the SSL context made */
char *ngx_http_idempotency_redis_tls_check(ngx_conf_t *cf,
    ngx_command_t *cmd, ngx_http_idempotency_redis_conf_t *rcf);

/*
 * The name of a connection of rcf in logs and in the status: "name", or
 * "tls://name" for a TLS connection (allocated in pool)
 */
ngx_int_t ngx_http_idempotency_redis_tls_conn_name(ngx_pool_t *pool,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *name, ngx_str_t *out);

/* why a TLS connection's connect timed out, for the log */
const char *ngx_http_idempotency_redis_tls_timed_out(redisAsyncContext *ac);


#if (NGX_SSL)

/*
 * Like ngx_http_idempotency_redis_attach(), for a TLS connection: the TLS
 * handshake starts when the TCP connect is done; hiredis hears of the
 * connect (its connect callback) once the server's certificate passed.
 * name: the name to send and check, unless tls_server_name is set (NULL:
 * the first configured address's host).  session: to resume, or NULL;
 * save: called with every new session of the connection, or NULL.  The
 * caller sets the event handlers, which call the two below.
 * peer: the connection's name in nginx's own SSL lines (never the
 * directive's text), living as long as the connection; quiet: those lines
 * are not written (a later failure of a streak whose first one was
 * logged), else as nginx's upstream connections write them.
 */
ngx_connection_t *ngx_http_idempotency_redis_tls_attach(
    redisAsyncContext *ac, ngx_http_idempotency_redis_tls_t *tls,
    const char *name, ngx_ssl_session_t *session,
    ngx_connection_handler_pt save, ngx_str_t *peer, ngx_uint_t quiet,
    ngx_log_t *log);

/*
 * From now on nginx's SSL lines of the connection c (made by tls_attach())
 * are written as by tls_attach() with "quiet" (0: a streak ended)
 */
void ngx_http_idempotency_redis_tls_quiet(ngx_connection_t *c,
    ngx_uint_t quiet);

/* save_session of a node's connection: the node resumes it next time */
void ngx_http_idempotency_redis_tls_save_session(ngx_connection_t *c);

/* the connection's read and write events; the context may be freed */
void ngx_http_idempotency_redis_tls_read(ngx_connection_t *c);
void ngx_http_idempotency_redis_tls_write(ngx_connection_t *c);

/* nothing of what hiredis handed over is still in nginx's SSL buffer */
#define ngx_http_idempotency_redis_tls_flushed(c)                            \
    (((c)->buffered & NGX_SSL_BUFFERED) == 0)

#endif


#endif /* _NGX_HTTP_IDEMPOTENCY_REDIS_TLS_H_INCLUDED_ */
