/*
 * The replay cache's purge listener: worker 0 subscribes to
 * "<prefix>purge" of each idempotency_redis (through the records layer)
 * and removes the entries other nodes purge; at a reload the old worker 0
 * hands over to the new one; the zone keeps who listens, so that purges
 * missed while no one did make every entry older than the zone's epoch.
 * HTTP side, beside ngx_http_idempotency_cache.c.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_cache.h"
#include "ngx_http_idempotency_cache_zone.h"
#include "ngx_http_idempotency_redis.h"


static void ngx_http_idempotency_cache_sub_handler(void *data,
    ngx_uint_t event, ngx_str_t *msg);
static void ngx_http_idempotency_cache_handover_handler(ngx_event_t *ev);


/* what the subscription to "<prefix>purge" hears */

static void
ngx_http_idempotency_cache_sub_handler(void *data, ngx_uint_t event,
    ngx_str_t *msg)
{
    switch (event) {

    case NGX_HTTP_IDEMPOTENCY_REDIS_SUB_READY:
        ngx_http_idempotency_cache_listening(1);
        break;

    case NGX_HTTP_IDEMPOTENCY_REDIS_SUB_LOST:
        ngx_http_idempotency_cache_listening(0);
        break;

    default: /* NGX_HTTP_IDEMPOTENCY_REDIS_SUB_MESSAGE */
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                       "idempotency cache: purge of \"%V\" heard", msg);
        ngx_http_idempotency_cache_purge(msg);
        break;
    }
}


/*
 * Worker 0 of a node listens for the purges of each Redis (one connection
 * per node and Redis: every worker shares the zones), when a zone exists.
 */

static ngx_http_idempotency_redis_sub_t  **ngx_http_idempotency_cache_subs;
static ngx_uint_t                          ngx_http_idempotency_cache_nsubs;

/*
 * A reload starts the new worker 0 and stops the old one at once: the old
 * one keeps listening until the new one does (or for HANDOVER ms), so that
 * no purge falls between the two and the entries stay good.  The timer is
 * not cancelable on purpose: an exiting worker waits for it.
 */

static ngx_event_t                         ngx_http_idempotency_cache_handover;
/* the timer's data: the debug log reads a connection's fd from it */
static ngx_connection_t                    ngx_http_idempotency_cache_dummy;
static ngx_msec_t                          ngx_http_idempotency_cache_exiting;


ngx_int_t
ngx_http_idempotency_cache_init_process(ngx_cycle_t *cycle,
    ngx_array_t *redis)
{
    u_char                              *p;
    ngx_str_t                           *channel;
    ngx_uint_t                           i;
    ngx_http_idempotency_redis_conf_t  **rcfp;

    if ((ngx_process != NGX_PROCESS_WORKER
         && ngx_process != NGX_PROCESS_SINGLE)
        || ngx_worker != 0 || redis == NULL || redis->nelts == 0
        || !ngx_http_idempotency_cache_used())
    {
        return NGX_OK;
    }

    ngx_http_idempotency_cache_subs = ngx_pcalloc(cycle->pool,
                             redis->nelts
                             * sizeof(ngx_http_idempotency_redis_sub_t *));
    if (ngx_http_idempotency_cache_subs == NULL) {
        return NGX_ERROR;
    }

    rcfp = redis->elts;

    for (i = 0; i < redis->nelts; i++) {
        channel = ngx_palloc(cycle->pool, sizeof(ngx_str_t));
        p = ngx_pnalloc(cycle->pool, rcfp[i]->prefix.len + sizeof("purge"));

        if (channel == NULL || p == NULL) {
            return NGX_ERROR;
        }

        channel->data = p;
        channel->len = ngx_sprintf(p, "%Vpurge", &rcfp[i]->prefix) - p;

        ngx_http_idempotency_cache_subs[ngx_http_idempotency_cache_nsubs++]
            = ngx_http_idempotency_redis_subscribe(rcfp[i], channel,
                                       ngx_http_idempotency_cache_sub_handler,
                                       rcfp[i], cycle->pool, cycle->log);
    }

    ngx_http_idempotency_cache_handover.handler =
                                   ngx_http_idempotency_cache_handover_handler;
    ngx_http_idempotency_cache_handover.log = cycle->log;
    ngx_http_idempotency_cache_dummy.fd = (ngx_socket_t) -1;
    ngx_http_idempotency_cache_handover.data =
                                           &ngx_http_idempotency_cache_dummy;
    ngx_http_idempotency_cache_exiting = 0;

    ngx_add_timer(&ngx_http_idempotency_cache_handover, 100);

    return NGX_OK;
}


static void
ngx_http_idempotency_cache_handover_handler(ngx_event_t *ev)
{
    if (!ngx_exiting) {
        ngx_add_timer(ev, 100);
        return;
    }

    if (ngx_http_idempotency_cache_exiting == 0) {
        ngx_http_idempotency_cache_exiting = ngx_current_msec;
    }

    if (ngx_current_msec - ngx_http_idempotency_cache_exiting
        < NGX_HTTP_IDEMPOTENCY_CACHE_HANDOVER
        && !ngx_http_idempotency_cache_others_listen())
    {
        ngx_add_timer(ev, 20);
    }
}


void
ngx_http_idempotency_cache_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t  i;

    if (ngx_http_idempotency_cache_nsubs == 0) {
        return;
    }

    if (ngx_http_idempotency_cache_handover.timer_set) {
        ngx_del_timer(&ngx_http_idempotency_cache_handover);
    }

    for (i = 0; i < ngx_http_idempotency_cache_nsubs; i++) {
        ngx_http_idempotency_redis_unsubscribe(
                                         ngx_http_idempotency_cache_subs[i]);
    }

    ngx_http_idempotency_cache_nsubs = 0;
    ngx_http_idempotency_cache_listening(0);
}


/*
 * This worker's subscription to purges is up ("on") or lost.  Purges may
 * have been missed since the last time some worker listened: when none
 * listens now but one did before, every entry of the zone is older than
 * the new epoch, a miss.  A reload's new worker subscribes while the old
 * one still listens: the entries stay.  A worker that died is no
 * listener (its pid is gone).
 */

void
ngx_http_idempotency_cache_listening(ngx_uint_t on)
{
    ngx_uint_t                        i, k, live;
    ngx_http_idempotency_cache_t     *cache;
    ngx_http_idempotency_cache_sh_t  *sh;

    i = 0;

    while ((sh = ngx_http_idempotency_cache_next(&i, &cache)) != NULL) {
        live = 0;

        for (k = 0; k < NGX_HTTP_IDEMPOTENCY_CACHE_LISTENERS; k++) {

            if (sh->listeners[k] == ngx_pid
                || (sh->listeners[k]
                    && kill(sh->listeners[k], 0) == -1 && errno == ESRCH))
            {
                sh->listeners[k] = 0;
            }

            if (sh->listeners[k]) {
                live = 1;
            }
        }

        if (on) {
            if (!live && sh->listened) {
                sh->epoch++;
            }

            sh->listened = 1;

            for (k = 0; k < NGX_HTTP_IDEMPOTENCY_CACHE_LISTENERS; k++) {
                if (sh->listeners[k] == 0) {
                    sh->listeners[k] = ngx_pid;
                    break;
                }
            }
        }

        ngx_http_idempotency_cache_unlock(cache, sh);
    }
}


/*
 * Whether this worker may stop listening: another live process listens
 * now, or no reload is under way (a plain stop: no one comes after).
 */

ngx_uint_t
ngx_http_idempotency_cache_others_listen(void)
{
    ngx_pid_t                         pid;
    ngx_uint_t                        i, k, found;
    ngx_http_idempotency_cache_t     *cache;
    ngx_http_idempotency_cache_sh_t  *sh;

    found = 0;

    i = 0;

    while ((sh = ngx_http_idempotency_cache_next(&i, &cache)) != NULL) {
        if (sh->reloaded == 0
            || ngx_current_msec - sh->reloaded
               > 2 * NGX_HTTP_IDEMPOTENCY_CACHE_HANDOVER)
        {
            found = 1;
        }

        for (k = 0; !found && k < NGX_HTTP_IDEMPOTENCY_CACHE_LISTENERS; k++) {
            pid = sh->listeners[k];

            if (pid && pid != ngx_pid
                && !(kill(pid, 0) == -1 && errno == ESRCH))
            {
                found = 1;
                break;
            }
        }

        ngx_http_idempotency_cache_unlock(cache, sh);

        if (found) {
            break;
        }
    }

    return found;
}
