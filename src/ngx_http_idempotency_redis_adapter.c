/*
 * The connection layer's hiredis <-> nginx event adapter: a hiredis async
 * context's socket wrapped in an nginx connection, hiredis' event hooks
 * (add and delete read and write interest, cleanup) on nginx's events,
 * and the read and write handlers that drive hiredis.  Every Redis
 * connection of the module goes through it: the nodes' (which set their
 * own read and write handlers on top), the subscriptions' and the
 * sentinels'.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_redis_adapter.h"
#include "ngx_http_idempotency_redis_tls.h"


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


static void ngx_http_idempotency_redis_add_read(void *privdata);
static void ngx_http_idempotency_redis_del_read(void *privdata);
static void ngx_http_idempotency_redis_add_write(void *privdata);
static void ngx_http_idempotency_redis_del_write(void *privdata);
static void ngx_http_idempotency_redis_cleanup(void *privdata);
static void ngx_http_idempotency_redis_read_handler(ngx_event_t *rev);
static void ngx_http_idempotency_redis_write_handler(ngx_event_t *wev);


/* the connection whose write handler runs: hiredis asking again means EAGAIN */
static ngx_connection_t  *ngx_http_idempotency_redis_writing;


ngx_connection_t *
ngx_http_idempotency_redis_attach(redisAsyncContext *ac, ngx_log_t *log)
{
    ngx_connection_t  *c;

    c = ngx_get_connection(ac->c.fd, log);
    if (c == NULL) {
        return NULL;
    }

    c->data = ac;
    c->read->handler = ngx_http_idempotency_redis_read_handler;
    c->write->handler = ngx_http_idempotency_redis_write_handler;
    c->read->log = log;
    c->write->log = log;
    c->number = ngx_atomic_fetch_add(ngx_connection_counter, 1);

    /* hooks first: setting the connect callback already asks for write */

    ac->ev.data = c;
    ac->ev.addRead = ngx_http_idempotency_redis_add_read;
    ac->ev.delRead = ngx_http_idempotency_redis_del_read;
    ac->ev.addWrite = ngx_http_idempotency_redis_add_write;
    ac->ev.delWrite = ngx_http_idempotency_redis_del_write;
    ac->ev.cleanup = ngx_http_idempotency_redis_cleanup;

    return c;
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


/*
 * hiredis asks for a write with every command it queues.  On a connected
 * socket the write is posted to the next pass of the event loop (whose
 * epoll_wait() does not wait when something is posted there): one write(2)
 * then carries every command queued by the events of this pass and of the
 * next one, and no epoll_ctl(2) is needed to learn that the socket can be
 * written to.  The socket's write event is asked for only while connecting,
 * or when what is queued did not fit in the socket: hiredis asks again
 * from within the write handler.
 */

static void
ngx_http_idempotency_redis_add_write(void *privdata)
{
    ngx_connection_t   *c = privdata;
    redisAsyncContext  *ac;

    if (c == NULL || c->write->active || c->write->posted) {
        return;
    }

    ac = c->data;

    if (c != ngx_http_idempotency_redis_writing
        && (ac->c.flags & REDIS_CONNECTED))
    {
        ngx_post_event(c->write, &ngx_posted_next_events);
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

    if (c == NULL) {
        return;
    }

    if (c->write->posted) {
        ngx_delete_posted_event(c->write);
    }

    if (!c->write->active) {
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

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "idempotency redis: close fd:%d", c->fd);

    ngx_close_connection(c);

    ac->c.fd = -1;
    ac->ev.data = NULL;
}


static void
ngx_http_idempotency_redis_read_handler(ngx_event_t *rev)
{
    ngx_http_idempotency_redis_handle_read(rev->data);
}


/* a read event of a connection whose read handler is someone else's */

void
ngx_http_idempotency_redis_handle_read(ngx_connection_t *c)
{
#if (NGX_SSL)
    if (c->ssl) {
        ngx_http_idempotency_redis_tls_read(c);
        return;
    }
#endif

    /* one chunk of at most 16 KiB; see EVENT_FLAGS for the rest */

    redisAsyncHandleRead(c->data);
}


static void
ngx_http_idempotency_redis_write_handler(ngx_event_t *wev)
{
    ngx_http_idempotency_redis_write(wev->data);
}


/* hiredis writes what it has queued on c (the write handlers' part) */

void
ngx_http_idempotency_redis_write(ngx_connection_t *c)
{
    ngx_http_idempotency_redis_writing = c;
    redisAsyncHandleWrite(c->data);
    ngx_http_idempotency_redis_writing = NULL;
}
