/*
 * Shared types of ngx_http_idempotency_module: configuration and the
 * per-request context.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_redis.h"


#define NGX_HTTP_IDEMPOTENCY_STORE_ERROR_CLOSED  0
#define NGX_HTTP_IDEMPOTENCY_STORE_ERROR_OPEN    1

#define NGX_HTTP_IDEMPOTENCY_UPSTREAM_ERROR_HOLD     0
#define NGX_HTTP_IDEMPOTENCY_UPSTREAM_ERROR_RELEASE  1

/* r->buffered while the last buffer waits for Redis (read-after-complete) */
#define NGX_HTTP_IDEMPOTENCY_BUFFERED            0x08

#define NGX_HTTP_IDEMPOTENCY_KEY_MAX_LEN         255
#define NGX_HTTP_IDEMPOTENCY_KEY_LIMIT           8192

/* duplicates waiting at once in one worker (idempotency_wait) */
#define NGX_HTTP_IDEMPOTENCY_MAX_WAITERS         1024

/* owner token: hex of a per-worker random seed, the pid and a counter */
#define NGX_HTTP_IDEMPOTENCY_OWNER_LEN           40

/* "idem1 inflight <fp> <owner> <created> 000\r\n\r\n" */
#define NGX_HTTP_IDEMPOTENCY_INFLIGHT_MAX                                     \
    (sizeof("idem1 inflight    000\r\n\r\n") - 1 + 64                       \
     + NGX_HTTP_IDEMPOTENCY_OWNER_LEN + NGX_INT64_LEN)

/* no NGX_HTTP_ constant in nginx */
#define NGX_HTTP_IDEMPOTENCY_UNPROCESSABLE       422

/* statuses 0 .. 599 as a bitmap */
#define NGX_HTTP_IDEMPOTENCY_STATUS_MAX          600


/* what happened to a request, as $idempotency_status shows it */
typedef enum {
    NGX_HTTP_IDEMPOTENCY_NONE = 0,
    NGX_HTTP_IDEMPOTENCY_BYPASS,
    NGX_HTTP_IDEMPOTENCY_MISS,
    NGX_HTTP_IDEMPOTENCY_HIT,
    NGX_HTTP_IDEMPOTENCY_CONFLICT,
    NGX_HTTP_IDEMPOTENCY_MISMATCH,
    NGX_HTTP_IDEMPOTENCY_MISSING,
    NGX_HTTP_IDEMPOTENCY_INVALID,
    NGX_HTTP_IDEMPOTENCY_OVERSIZE,
    NGX_HTTP_IDEMPOTENCY_ERROR,      /* Redis failed: refused, or passed */
    NGX_HTTP_IDEMPOTENCY_UNSCOPED,   /* a key but an empty scope: refused */
    NGX_HTTP_IDEMPOTENCY_UNKNOWN     /* the first request's outcome is not
                                        known: held, never run again */
} ngx_http_idempotency_outcome_e;


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


typedef struct ngx_http_idempotency_scope_secret_s
    ngx_http_idempotency_scope_secret_t;


typedef struct {
    ngx_array_t                          redis;    /* of redis_conf_t * */
    ngx_flag_t                           used;
} ngx_http_idempotency_main_conf_t;


typedef struct {
    ngx_flag_t                           enable;
    ngx_http_idempotency_redis_conf_t   *redis;
    ngx_msec_t                           ttl;
    ngx_msec_t                           lock_ttl;
    ngx_uint_t                           methods;
    ngx_flag_t                           required;
    ngx_http_complex_value_t            *scope;
    ngx_str_t                            header;
    ngx_str_t                            header_lc;
    ngx_uint_t                           header_hash;
    ngx_msec_t                           wait;
    size_t                               max_response_size;
    ngx_uint_t                           on_store_error;
    uint8_t                             *store_status;  /* bitmap */
    ngx_uint_t                           key_max_length;
    ngx_str_t                            problem_type;
    ngx_array_t                         *hide_headers;  /* of ngx_str_t */
    ngx_array_t                         *pass_headers;  /* of ngx_str_t */
    ngx_array_t                         *skip_headers;  /* merged result */
    ngx_http_idempotency_scope_secret_t *scope_secret;  /* NULL: none */
    ngx_flag_t                           admin;   /* idempotency_admin here */
    ngx_uint_t                           on_upstream_error;
} ngx_http_idempotency_loc_conf_t;


typedef struct {
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

    /*
     * HTTP/1.x with a Content-Length: the body bytes passed on, and the
     * response's last byte, kept back until the last buffer comes
     */
    off_t                                sent;
    ngx_chain_t                         *tail;

    /* a split record's body, streamed to the client by body.c */
    struct ngx_http_idempotency_stream_s  *stream;
} ngx_http_idempotency_ctx_t;


ngx_http_idempotency_ctx_t *ngx_http_idempotency_get_ctx(
    ngx_http_request_t *r);

ngx_int_t ngx_http_idempotency_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idempotency_handler_init_process(ngx_cycle_t *cycle);
void ngx_http_idempotency_handler_exit_process(ngx_cycle_t *cycle);
ngx_int_t ngx_http_idempotency_filter_init(ngx_conf_t *cf);
ngx_int_t ngx_http_idempotency_add_variables(ngx_conf_t *cf);
ngx_http_idempotency_outcome_e ngx_http_idempotency_request_outcome(
    ngx_http_request_t *r);
ngx_str_t *ngx_http_idempotency_outcome_name(
    ngx_http_idempotency_outcome_e outcome);
const char *ngx_http_idempotency_outcome_reason(
    ngx_http_idempotency_outcome_e outcome);
char *ngx_http_idempotency_status(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

ngx_int_t ngx_http_idempotency_send_problem(ngx_http_request_t *r,
    ngx_http_idempotency_outcome_e outcome);
ngx_int_t ngx_http_idempotency_send_problem_text(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *type, ngx_str_t *title, ngx_str_t *detail);
void ngx_http_idempotency_status_line(ngx_http_request_t *r);
ngx_int_t ngx_http_idempotency_send_body(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *type, ngx_buf_t *b,
    ngx_uint_t retry_after);
char *ngx_http_idempotency_admin(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

ngx_uint_t ngx_http_idempotency_status_storable(
    ngx_http_idempotency_loc_conf_t *ilcf, ngx_uint_t status);
ngx_uint_t ngx_http_idempotency_header_stored(
    ngx_http_idempotency_loc_conf_t *ilcf, ngx_str_t *name);


extern ngx_module_t  ngx_http_idempotency_module;


#endif /* _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_ */
