/*
 * Shared types of ngx_http_idempotency_module: configuration and outcomes
 * (the per-request context is in ngx_http_idempotency_ctx.h), and the
 * store policy's reads of the configuration at request time.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_stats.h"


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


typedef struct ngx_http_idempotency_scope_secret_s
    ngx_http_idempotency_scope_secret_t;

/* the request context, in ngx_http_idempotency_ctx.h */
typedef struct ngx_http_idempotency_ctx_s  ngx_http_idempotency_ctx_t;


typedef struct {
    ngx_array_t                          redis;    /* of redis_conf_t * */
    ngx_flag_t                           used;
    ngx_uint_t                           cache_zones; /* declared */
    ngx_array_t                         *cache_uses;  /* idempotency_cache */
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
    ngx_msec_t                           wait_poll;  /* fallback poll */
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
    ngx_shm_zone_t                      *cache;   /* idempotency_cache */
    ngx_http_idempotency_label_t        *metrics; /* NULL: not counted */

    /* where "idempotency on" or idempotency_admin is, for nginx -t */
    u_char                              *file;
    ngx_uint_t                           line;
} ngx_http_idempotency_loc_conf_t;


ngx_int_t ngx_http_idempotency_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idempotency_handler_init_process(ngx_cycle_t *cycle);
void ngx_http_idempotency_handler_exit_process(ngx_cycle_t *cycle);
ngx_int_t ngx_http_idempotency_filter_init(ngx_conf_t *cf);
ngx_int_t ngx_http_idempotency_add_variables(ngx_conf_t *cf);
/* the stats zone, and the outcome counted in the log phase */
ngx_int_t ngx_http_idempotency_outcome_init(ngx_conf_t *cf);
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
char *ngx_http_idempotency_problem_type(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


extern ngx_module_t  ngx_http_idempotency_module;


/*
 * The location's store policy, asked at request time: pure reads of what
 * the directives set, here so that the request's code does not call back
 * into the module's glue, which calls it.
 */

/* idempotency_store_status: whether a response of this status is stored */

static ngx_inline ngx_uint_t
ngx_http_idempotency_status_storable(ngx_http_idempotency_loc_conf_t *ilcf,
    ngx_uint_t status)
{
    /* a 1xx is never a final answer to replay, whatever the list says */

    if (status < NGX_HTTP_OK || status >= NGX_HTTP_IDEMPOTENCY_STATUS_MAX) {
        return 0;
    }

    return (ilcf->store_status[status / 8] >> (status % 8)) & 1;
}


/* idempotency_hide_header, _pass_header: whether a header line is stored */

static ngx_inline ngx_uint_t
ngx_http_idempotency_header_stored(ngx_http_idempotency_loc_conf_t *ilcf,
    ngx_str_t *name)
{
    ngx_str_t   *s;
    ngx_uint_t   i;

    s = ilcf->skip_headers->elts;

    for (i = 0; i < ilcf->skip_headers->nelts; i++) {
        if (s[i].len == name->len
            && ngx_strncasecmp(s[i].data, name->data, name->len) == 0)
        {
            return 0;
        }
    }

    return 1;
}


#endif /* _NGX_HTTP_IDEMPOTENCY_MODULE_H_INCLUDED_ */
