/*
 * The HTTP side's shared types, below every phase: the configuration
 * (main and location), the outcomes, the module object, and the store
 * policy's reads of the configuration at request time.  Types and inline
 * reads only: no file's functions, so that whatever includes it depends
 * on nothing above it.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_CONF_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_CONF_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_redis_conf.h"
#include "ngx_http_idempotency_stats.h"


#define NGX_HTTP_IDEMPOTENCY_STORE_ERROR_CLOSED  0
#define NGX_HTTP_IDEMPOTENCY_STORE_ERROR_OPEN    1

#define NGX_HTTP_IDEMPOTENCY_UPSTREAM_ERROR_HOLD     0
#define NGX_HTTP_IDEMPOTENCY_UPSTREAM_ERROR_RELEASE  1

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


extern ngx_module_t  ngx_http_idempotency_module;


/*
 * The location's store policy, asked at request time: pure reads of what
 * the directives set, here so that the request's code (the claim's judge,
 * the capture) does not call into the module's glue, which calls it.
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


#endif /* _NGX_HTTP_IDEMPOTENCY_CONF_H_INCLUDED_ */
