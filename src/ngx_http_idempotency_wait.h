/*
 * Waiting duplicates (idempotency_wait): how a request that found its key
 * in flight waits for the first one's outcome, woken by a notification
 * from the node's listener, or by its slow poll as the fallback.  HTTP
 * side, below the claim (ngx_http_idempotency_claim.c and _settle.c),
 * which tells it of every store and release.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_WAIT_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_WAIT_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_ctx.h"


/* the fallback poll of a waiter that a notification would wake, default */
#define NGX_HTTP_IDEMPOTENCY_WAIT_POLL  1000


/* what a woken waiter does: claim again (ngx_http_idempotency_claim_send) */
typedef void (*ngx_http_idempotency_wait_pt)(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx);


/* "idempotency_wait TIME [poll=TIME]" */
char *ngx_http_idempotency_wait_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* worker 0 listens on "<prefix>done" of each Redis, when any location waits */
ngx_int_t ngx_http_idempotency_wait_init_process(ngx_cycle_t *cycle,
    ngx_array_t *redis);
void ngx_http_idempotency_wait_exit_process(ngx_cycle_t *cycle);

/*
 * The claim found the record in flight: NGX_AGAIN, the request waits
 * ("again" is called when it is woken); NGX_DECLINED, it gets 409 now (no
 * idempotency_wait, its time is over, or too many wait already).
 */
ngx_int_t ngx_http_idempotency_wait_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_http_idempotency_wait_pt again);

/* a claim's reply is in: counts what woke a waiter that found the outcome */
void ngx_http_idempotency_wait_decided(ngx_http_idempotency_ctx_t *ctx);

/* the request goes (its context's cleanup): it waits no more */
void ngx_http_idempotency_wait_end(ngx_http_idempotency_ctx_t *ctx);

/*
 * A store or release of rkey was sent (script, args and more as given to
 * it): the waiters that marked it, on every node, are told once it is
 * done: behind it on the same connection, or, for a store that may be
 * split (its head is written after its body), once its reply is in
 * (wait_settled)
 */
void ngx_http_idempotency_wait_notify(ngx_http_idempotency_loc_conf_t *ilcf,
    ngx_str_t *rkey, ngx_uint_t script, ngx_str_t *args, ngx_array_t *more,
    ngx_log_t *log);

/* the settle step's reply for rkey is in (or it was given up) */
void ngx_http_idempotency_wait_settled(ngx_str_t *rkey);


#endif /* _NGX_HTTP_IDEMPOTENCY_WAIT_H_INCLUDED_ */
