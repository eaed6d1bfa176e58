/*
 * The request context (ngx_http_idempotency_ctx.c): one per request that
 * takes part, in the module's ctx slot, owned by a pool cleanup through
 * which it is found again when an internal redirect cleared that slot.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_CTX_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_CTX_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_conf.h"


/* owner token: hex of a per-worker random seed, the pid and a counter */
#define NGX_HTTP_IDEMPOTENCY_OWNER_LEN           40

/* "idem1 inflight <fp> <owner> <created> 000\r\n\r\n" */
#define NGX_HTTP_IDEMPOTENCY_INFLIGHT_MAX                                     \
    (sizeof("idem1 inflight    000\r\n\r\n") - 1 + 64                       \
     + NGX_HTTP_IDEMPOTENCY_OWNER_LEN + NGX_INT64_LEN)


/* where a request is in the claim/replay/record life cycle */
typedef enum {
    NGX_HTTP_IDEMPOTENCY_STATE_INIT = 0,
    NGX_HTTP_IDEMPOTENCY_STATE_READING_BODY,
    NGX_HTTP_IDEMPOTENCY_STATE_CLAIMING,
    NGX_HTTP_IDEMPOTENCY_STATE_DECIDED,    /* claim reply is in */
    NGX_HTTP_IDEMPOTENCY_STATE_WAITING,    /* duplicate waits to re-claim */
    NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED,    /* ours: goes to the content */
    NGX_HTTP_IDEMPOTENCY_STATE_SETTLED,    /* stored, released or replayed */
    NGX_HTTP_IDEMPOTENCY_STATE_DONE        /* not taking part */
} ngx_http_idempotency_state_e;


typedef struct ngx_http_idempotency_ctx_s  ngx_http_idempotency_ctx_t;

struct ngx_http_idempotency_ctx_s {
    ngx_http_request_t                  *request;
    ngx_http_idempotency_loc_conf_t     *conf;    /* of the claiming location */
    ngx_http_idempotency_state_e         state;
    ngx_http_idempotency_outcome_e       outcome;

    ngx_str_t                            key;      /* as the client sent it */
    ngx_str_t                            rkey;     /* the Redis record key */
    u_char                               fingerprint[64];
    u_char                               owner[NGX_HTTP_IDEMPOTENCY_OWNER_LEN];
    time_t                               created;  /* of the last claim */

    /* the record the last claim wrote: the fence of store, release, renew */
    ngx_str_t                            inflight;
    u_char                               inflight_buf[
                                             NGX_HTTP_IDEMPOTENCY_INFLIGHT_MAX];

    ngx_http_idempotency_redis_op_t     *op;
    ngx_msec_t                           claimed;  /* claim sent, msec */
    ngx_event_t                          renew_timer;
    ngx_event_t                          wait_timer;
    ngx_msec_t                           wait_until;
    ngx_msec_t                           wait_step;
    /* a duplicate that waits (wait.c); NULL: never waited */
    struct ngx_http_idempotency_waiter_s *waiter;

    /* claim result */
    ngx_uint_t                           redis_rc;
    ngx_http_idempotency_outcome_e       reply_kind;
    ngx_int_t                            reply_status;
    ngx_str_t                            reply_headers;
    ngx_str_t                            reply_body;

    /* the fingerprint's digest while the body is read (body.c) */
    void                                *body;

    /*
     * capture, straight into the record to store: room for its first line,
     * the header lines and "\r\n" (body_off bytes), then the body
     */
    ngx_uint_t                           status;
    u_char                              *record;
    size_t                               headers_len;
    size_t                               body_off;
    size_t                               body_len;
    size_t                               body_size; /* room for the body */

    /*
     * a body of unknown length past its first NGX_HTTP_IDEMPOTENCY_REDIS_
     * CHUNK bytes (which fill the record's room): blocks of a chunk each,
     * the last partly filled, more_len bytes in all, so that nothing is
     * copied again as the body grows (a split record's chunks are these)
     */
    ngx_array_t                         *more;
    size_t                               more_len;

    unsigned                             header_seen:1;
    unsigned                             release:1;
    unsigned                             capture:1;
    unsigned                             oversize:1;
    unsigned                             complete:1;
    unsigned                             replaying:1;
    unsigned                             client_gone:1;
    /* the location's content handler was called (see settle) */
    unsigned                             content_called:1;

    /* outcome unknown: the record says so for idempotency_ttl */
    unsigned                             hold:1;
    /* r->error_page was set before the claim: not ours to judge */
    unsigned                             error_page:1;
    /* the last buffer waits for the store's or release's reply */
    unsigned                             waiting:1;

    ngx_http_handler_pt                  content_handler;  /* wrapped */
    ngx_chain_t                         *held;     /* the last buffer */
    ngx_event_t                          held_timer;
    ngx_queue_t                          queue;    /* of waiting requests */

    /* the write event was posted to guard the client's read handler */
    unsigned                             guarded:1;

    /* a header-only response's header waits for Redis too */
    unsigned                             header_held:1;

    /* $idempotency_cache: NGX_HTTP_IDEMPOTENCY_CACHE_* */
    unsigned                             cache:2;

    /* the phase handler's first call is on the stack (handler.c) */
    unsigned                             starting:1;

    /*
     * HTTP/1.x with a Content-Length: the body bytes passed on, and the
     * response's last byte, kept back until the last buffer comes
     */
    off_t                                sent;
    ngx_chain_t                         *tail;

    /* a split record's body, streamed to the client by body.c */
    struct ngx_http_idempotency_stream_s  *stream;

    /* what the pool cleanup calls: the claim's end (claim.c) */
    ngx_pool_cleanup_pt                  end;
};


/*
 * A new context; "end" is called with it when the request's pool goes (the
 * claim's end, ngx_http_idempotency_claim_end()): the context does not
 * know the claim, the claim knows the context.
 */
ngx_http_idempotency_ctx_t *ngx_http_idempotency_ctx_create(
    ngx_http_request_t *r, ngx_http_idempotency_loc_conf_t *ilcf,
    ngx_pool_cleanup_pt end);

/* the request's context, after internal redirects too; NULL: none */
ngx_http_idempotency_ctx_t *ngx_http_idempotency_get_ctx(
    ngx_http_request_t *r);


#endif /* _NGX_HTTP_IDEMPOTENCY_CTX_H_INCLUDED_ */
