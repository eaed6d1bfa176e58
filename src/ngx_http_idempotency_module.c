/*
 * ngx_http_idempotency_module: directives, configuration and module glue.
 * Configuration side: calls each part's entry points (init, init_process,
 * exit_process), and the records layer's with the list of Redis confs.
 */

#include "ngx_http_idempotency_module.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_redis_directive.h"
#include "ngx_http_idempotency_admin.h"
#include "ngx_http_idempotency_body.h"
#include "ngx_http_idempotency_cache.h"
#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_filter.h"
#include "ngx_http_idempotency_handler.h"
#include "ngx_http_idempotency_problem.h"
#include "ngx_http_idempotency_scope.h"
#include "ngx_http_idempotency_stats.h"
#include "ngx_http_idempotency_status.h"
#include "ngx_http_idempotency_var.h"
#include "ngx_http_idempotency_wait.h"


static ngx_int_t ngx_http_idempotency_init(ngx_conf_t *cf);
static void *ngx_http_idempotency_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_idempotency_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_idempotency_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static ngx_int_t ngx_http_idempotency_init_process(ngx_cycle_t *cycle);
static void ngx_http_idempotency_exit_process(ngx_cycle_t *cycle);

static char *ngx_http_idempotency_enable(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idempotency_redis(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idempotency_time(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idempotency_methods(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idempotency_header(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idempotency_size(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_idempotency_on_store_error(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_idempotency_store_status(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_idempotency_key_max_length(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_idempotency_header_list(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_idempotency_merge_headers(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *conf,
    ngx_http_idempotency_loc_conf_t *prev);
static char *ngx_http_idempotency_store_status_parse(ngx_conf_t *cf,
    ngx_command_t *cmd, ngx_http_idempotency_loc_conf_t *ilcf,
    ngx_str_t *value);


#define NGX_HTTP_IDEMPOTENCY_STATUS_BYTES  (NGX_HTTP_IDEMPOTENCY_STATUS_MAX / 8)


static ngx_conf_bitmask_t  ngx_http_idempotency_methods_mask[] = {
    { ngx_string("GET"), NGX_HTTP_GET },
    { ngx_string("HEAD"), NGX_HTTP_HEAD },
    { ngx_string("POST"), NGX_HTTP_POST },
    { ngx_string("PUT"), NGX_HTTP_PUT },
    { ngx_string("DELETE"), NGX_HTTP_DELETE },
    { ngx_string("PATCH"), NGX_HTTP_PATCH },
    { ngx_string("OPTIONS"), NGX_HTTP_OPTIONS },
    { ngx_null_string, 0 }
};


static ngx_conf_enum_t  ngx_http_idempotency_on_store_error_enum[] = {
    { ngx_string("closed"), NGX_HTTP_IDEMPOTENCY_STORE_ERROR_CLOSED },
    { ngx_string("open"), NGX_HTTP_IDEMPOTENCY_STORE_ERROR_OPEN },
    { ngx_null_string, 0 }
};


static ngx_conf_enum_t  ngx_http_idempotency_on_upstream_error_enum[] = {
    { ngx_string("hold"), NGX_HTTP_IDEMPOTENCY_UPSTREAM_ERROR_HOLD },
    { ngx_string("release"), NGX_HTTP_IDEMPOTENCY_UPSTREAM_ERROR_RELEASE },
    { ngx_null_string, 0 }
};


static ngx_command_t  ngx_http_idempotency_commands[] = {

    { ngx_string("idempotency"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_http_idempotency_enable,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, enable),
      NULL },

    { ngx_string("idempotency_redis"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_idempotency_redis,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_ttl"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_time,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, ttl),
      NULL },

    { ngx_string("idempotency_lock_ttl"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_time,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, lock_ttl),
      NULL },

    { ngx_string("idempotency_methods"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_idempotency_methods,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, methods),
      NULL },

    { ngx_string("idempotency_required"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, required),
      NULL },

    { ngx_string("idempotency_scope"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, scope),
      NULL },

    { ngx_string("idempotency_scope_secret"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_scope_secret,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_header"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_header,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_wait"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_idempotency_wait_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, wait),
      NULL },

    { ngx_string("idempotency_max_response_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_size,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, max_response_size),
      NULL },

    { ngx_string("idempotency_on_store_error"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_on_store_error,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, on_store_error),
      &ngx_http_idempotency_on_store_error_enum },

    { ngx_string("idempotency_on_upstream_error"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, on_upstream_error),
      &ngx_http_idempotency_on_upstream_error_enum },

    { ngx_string("idempotency_key_max_length"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_key_max_length,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, key_max_length),
      NULL },

    { ngx_string("idempotency_problem_type"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_problem_type,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, problem_type),
      NULL },

    { ngx_string("idempotency_hide_header"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_header_list,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, hide_headers),
      NULL },

    { ngx_string("idempotency_pass_header"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_header_list,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, pass_headers),
      NULL },

    { ngx_string("idempotency_store_status"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_idempotency_store_status,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_status"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_idempotency_status,
      0,
      0,
      NULL },

    { ngx_string("idempotency_metrics_label"),
      NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_stats_label_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_idempotency_loc_conf_t, metrics),
      NULL },

    { ngx_string("idempotency_admin"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_idempotency_admin,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("idempotency_cache_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE12,
      ngx_http_idempotency_cache_zone,
      0,
      0,
      NULL },

    { ngx_string("idempotency_cache"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_idempotency_cache,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_idempotency_module_ctx = {
    ngx_http_idempotency_add_variables,    /* preconfiguration */
    ngx_http_idempotency_init,             /* postconfiguration */

    ngx_http_idempotency_create_main_conf, /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_idempotency_create_loc_conf,  /* create location configuration */
    ngx_http_idempotency_merge_loc_conf    /* merge location configuration */
};


ngx_module_t  ngx_http_idempotency_module = {
    NGX_MODULE_V1,
    &ngx_http_idempotency_module_ctx,      /* module context */
    ngx_http_idempotency_commands,         /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_idempotency_init_process,     /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_idempotency_exit_process,     /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


/* every status but 5xx and 408, 409, 425, 429 */
static ngx_str_t  ngx_http_idempotency_default_store_status[] = {
    ngx_string("2xx"), ngx_string("3xx"),
    ngx_string("4xx"), ngx_string("!408"), ngx_string("!409"),
    ngx_string("!425"), ngx_string("!429")
};


/*
 * Response headers never stored: hop-by-hop ones, those nginx regenerates
 * or computes on replay, and the replay marker itself.
 */
static ngx_str_t  ngx_http_idempotency_never_headers[] = {
    ngx_string("Connection"),
    ngx_string("Keep-Alive"),
    ngx_string("Proxy-Authenticate"),
    ngx_string("Proxy-Authorization"),
    ngx_string("Proxy-Connection"),
    ngx_string("TE"),
    ngx_string("Trailer"),
    ngx_string("Transfer-Encoding"),
    ngx_string("Upgrade"),
    ngx_string("Date"),
    ngx_string("Server"),
    ngx_string("Content-Length"),
    ngx_string("Content-Type"),
    ngx_string("Idempotent-Replayed"),
    ngx_null_string
};


/* not stored unless idempotency_pass_header names them */
static ngx_str_t  ngx_http_idempotency_hidden_headers[] = {
    ngx_string("Set-Cookie"),
    ngx_null_string
};


static ngx_int_t
ngx_http_idempotency_init(ngx_conf_t *cf)
{
    ngx_uint_t                          i;
    ngx_http_handler_pt                *h;
    ngx_http_core_main_conf_t          *cmcf;
    ngx_http_idempotency_main_conf_t   *imcf;
    ngx_http_idempotency_redis_conf_t **rcfp;

    imcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    /* every directive is checked, whether or not a location uses it */

    rcfp = imcf->redis.elts;

    for (i = 0; i < imcf->redis.nelts; i++) {
        if (ngx_http_idempotency_redis_conf_check(cf, rcfp[i]) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    if (ngx_http_idempotency_cache_check(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    if (!imcf->used) {
        return NGX_OK;
    }

    /*
     * The pre-content phase runs after the whole access phase, so a stored
     * response is never served to a request that allow/deny, auth_basic,
     * auth_request or satisfy would refuse, and our handler can never count
     * as an access grant under "satisfy any".
     */

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PRECONTENT_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_idempotency_handler;

    if (ngx_http_idempotency_outcome_init(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_idempotency_body_init(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_idempotency_filter_init(cf);
}


static void *
ngx_http_idempotency_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_idempotency_main_conf_t  *imcf;

    imcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_main_conf_t));
    if (imcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&imcf->redis, cf->pool, 1,
                       sizeof(ngx_http_idempotency_redis_conf_t *))
        != NGX_OK)
    {
        return NULL;
    }

    return imcf;
}


static void *
ngx_http_idempotency_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_idempotency_loc_conf_t  *ilcf;

    ilcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_loc_conf_t));
    if (ilcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     ilcf->methods = 0;
     *     ilcf->header = { 0, NULL };
     *     ilcf->store_status = NULL;
     *     ilcf->admin = 0;
     */

    ilcf->enable = NGX_CONF_UNSET;
    ilcf->redis = NGX_CONF_UNSET_PTR;
    ilcf->ttl = NGX_CONF_UNSET_MSEC;
    ilcf->lock_ttl = NGX_CONF_UNSET_MSEC;
    ilcf->required = NGX_CONF_UNSET;
    ilcf->scope = NGX_CONF_UNSET_PTR;
    ilcf->wait = NGX_CONF_UNSET_MSEC;
    ilcf->wait_poll = NGX_CONF_UNSET_MSEC;
    ilcf->max_response_size = NGX_CONF_UNSET_SIZE;
    ilcf->on_store_error = NGX_CONF_UNSET_UINT;
    ilcf->on_upstream_error = NGX_CONF_UNSET_UINT;
    ilcf->key_max_length = NGX_CONF_UNSET_UINT;
    ilcf->hide_headers = NGX_CONF_UNSET_PTR;
    ilcf->pass_headers = NGX_CONF_UNSET_PTR;
    ilcf->scope_secret = NGX_CONF_UNSET_PTR;
    ilcf->cache = NGX_CONF_UNSET_PTR;
    ilcf->metrics = NGX_CONF_UNSET_PTR;

    return ilcf;
}


static char *
ngx_http_idempotency_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_idempotency_loc_conf_t *prev = parent;
    ngx_http_idempotency_loc_conf_t *conf = child;

    ngx_str_t                          header = ngx_string("Idempotency-Key");
    ngx_uint_t                         i, n;
    ngx_command_t                      cmd;
    ngx_http_compile_complex_value_t   ccv;

    if (conf->enable == NGX_CONF_UNSET && conf->file == NULL) {
        conf->file = prev->file;
        conf->line = prev->line;
    }

    ngx_conf_merge_value(conf->enable, prev->enable, 0);
    ngx_conf_merge_ptr_value(conf->redis, prev->redis, NULL);
    ngx_conf_merge_msec_value(conf->ttl, prev->ttl, 86400000);
    ngx_conf_merge_msec_value(conf->lock_ttl, prev->lock_ttl, 60000);
    ngx_conf_merge_bitmask_value(conf->methods, prev->methods,
                                 (NGX_CONF_BITMASK_SET
                                  |NGX_HTTP_POST|NGX_HTTP_PATCH));
    ngx_conf_merge_value(conf->required, prev->required, 0);
    ngx_conf_merge_ptr_value(conf->scope_secret, prev->scope_secret, NULL);
    ngx_conf_merge_ptr_value(conf->cache, prev->cache, NULL);
    ngx_conf_merge_msec_value(conf->wait, prev->wait, 0);
    ngx_conf_merge_msec_value(conf->wait_poll, prev->wait_poll,
                              NGX_HTTP_IDEMPOTENCY_WAIT_POLL);
    ngx_conf_merge_size_value(conf->max_response_size,
                              prev->max_response_size, 1024 * 1024);
    ngx_conf_merge_uint_value(conf->on_store_error, prev->on_store_error,
                              NGX_HTTP_IDEMPOTENCY_STORE_ERROR_CLOSED);
    ngx_conf_merge_uint_value(conf->on_upstream_error,
                              prev->on_upstream_error,
                              NGX_HTTP_IDEMPOTENCY_UPSTREAM_ERROR_HOLD);
    ngx_conf_merge_uint_value(conf->key_max_length, prev->key_max_length,
                              NGX_HTTP_IDEMPOTENCY_KEY_MAX_LEN);
    ngx_conf_merge_str_value(conf->problem_type, prev->problem_type,
                             "urn:ngx-idempotency:");

    if (ngx_http_idempotency_merge_headers(cf, conf, prev) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    if (conf->header.data == NULL) {
        if (prev->header.data == NULL) {
            prev->header = header;
            prev->header_lc.len = header.len;
            prev->header_lc.data = ngx_pnalloc(cf->pool, header.len);
            if (prev->header_lc.data == NULL) {
                return NGX_CONF_ERROR;
            }

            prev->header_hash = ngx_hash_strlow(prev->header_lc.data,
                                                header.data, header.len);
        }

        conf->header = prev->header;
        conf->header_lc = prev->header_lc;
        conf->header_hash = prev->header_hash;
    }

    if (conf->scope == NGX_CONF_UNSET_PTR) {
        if (prev->scope == NGX_CONF_UNSET_PTR) {
            prev->scope = ngx_palloc(cf->pool,
                                     sizeof(ngx_http_complex_value_t));
            if (prev->scope == NULL) {
                return NGX_CONF_ERROR;
            }

            ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

            ngx_str_set(&header, "$http_authorization");
            ccv.cf = cf;
            ccv.value = &header;
            ccv.complex_value = prev->scope;

            if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
                return NGX_CONF_ERROR;
            }
        }

        conf->scope = prev->scope;
    }

    if (conf->store_status == NULL) {
        if (prev->store_status == NULL) {
            n = sizeof(ngx_http_idempotency_default_store_status)
                / sizeof(ngx_str_t);

            ngx_memzero(&cmd, sizeof(ngx_command_t));
            ngx_str_set(&cmd.name, "idempotency_store_status");

            for (i = 0; i < n; i++) {
                if (ngx_http_idempotency_store_status_parse(cf, &cmd, prev,
                         &ngx_http_idempotency_default_store_status[i])
                    != NGX_CONF_OK)
                {
                    return NGX_CONF_ERROR;
                }
            }
        }

        conf->store_status = prev->store_status;
    }

    if (conf->admin) {

        if (conf->redis == NULL) {
            ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                          "\"idempotency_admin\" needs an "
                          "\"idempotency_redis\" for its location in %s:%ui",
                          conf->file, conf->line);
            return NGX_CONF_ERROR;
        }

        /* the endpoint itself is never protected by the module */
        conf->enable = 0;
    }

    if (ngx_http_idempotency_stats_label_merge(cf, &conf->metrics,
                                               prev->metrics, conf->enable)
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (conf->enable && conf->redis == NULL) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "\"idempotency\" is on but no \"idempotency_redis\" "
                      "is defined for it in %s:%ui", conf->file, conf->line);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_idempotency_init_process(ngx_cycle_t *cycle)
{
    ngx_http_idempotency_main_conf_t  *imcf;

    ngx_http_idempotency_stats_init_process(cycle);
    if (ngx_http_idempotency_claim_init_process(cycle) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_idempotency_scope_init_process(cycle) != NGX_OK) {
        return NGX_ERROR;
    }

    imcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_idempotency_module);

    if (ngx_http_idempotency_redis_init_process(cycle,
                                        (imcf && imcf->used) ? &imcf->redis
                                                             : NULL)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ngx_http_idempotency_wait_init_process(cycle,
                                        (imcf && imcf->used) ? &imcf->redis
                                                             : NULL)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_idempotency_cache_init_process(cycle,
                                        (imcf && imcf->used) ? &imcf->redis
                                                             : NULL);
}


static void
ngx_http_idempotency_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_idempotency_main_conf_t  *imcf;

    imcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_idempotency_module);

    ngx_http_idempotency_cache_exit_process(cycle);
    ngx_http_idempotency_wait_exit_process(cycle);
    ngx_http_idempotency_redis_exit_process(cycle,
                                            imcf ? &imcf->redis : NULL);
    ngx_http_idempotency_scope_exit_process(cycle);
    ngx_http_idempotency_body_exit_process(cycle);
}


static char *
ngx_http_idempotency_enable(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    char                              *rv;
    ngx_http_idempotency_main_conf_t  *imcf;

    rv = ngx_conf_set_flag_slot(cf, cmd, conf);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    if (ilcf->enable) {
        imcf = ngx_http_conf_get_module_main_conf(cf,
                                                  ngx_http_idempotency_module);
        imcf->used = 1;

        /* for nginx -t's errors; idempotency_admin's place comes first */
        if (ilcf->file == NULL) {
            ilcf->file = cf->conf_file->file.name.data;
            ilcf->line = cf->conf_file->line;
        }
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_idempotency_redis(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    char                               *rv;
    u_char                             *p;
    size_t                              len;
    ngx_str_t                          *value, text;
    ngx_uint_t                          i;
    ngx_http_idempotency_redis_conf_t  *rcf, **rcfp;
    ngx_http_idempotency_main_conf_t   *imcf;

    if (ilcf->redis != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    len = 0;
    for (i = 1; i < cf->args->nelts; i++) {
        len += value[i].len + 1;
    }

    p = ngx_pnalloc(cf->pool, len);
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    len = 0;
    for (i = 1; i < cf->args->nelts; i++) {
        if (i > 1) {
            p[len++] = ' ';
        }

        len = ngx_cpymem(p + len, value[i].data, value[i].len) - p;
    }

    /* identical directives share one per-worker connection */

    imcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    rcfp = imcf->redis.elts;
    for (i = 0; i < imcf->redis.nelts; i++) {
        if (rcfp[i]->text.len == len
            && ngx_strncmp(rcfp[i]->text.data, p, len) == 0)
        {
            ilcf->redis = rcfp[i];
            return NGX_CONF_OK;
        }
    }

    text.data = p;
    text.len = len;

    rv = ngx_http_idempotency_redis_conf_parse(cf, cmd, &text, &rcf);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    rcfp = ngx_array_push(&imcf->redis);
    if (rcfp == NULL) {
        return NGX_CONF_ERROR;
    }

    *rcfp = rcf;
    ilcf->redis = rcf;

    return NGX_CONF_OK;
}


static char *
ngx_http_idempotency_time(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    ngx_str_t   *value;
    ngx_msec_t  *msp, ms;

    msp = (ngx_msec_t *) (p + cmd->offset);

    if (*msp != NGX_CONF_UNSET_MSEC) {
        return "is duplicate";
    }

    value = cf->args->elts;

    ms = ngx_parse_time(&value[1], 0);

    /* "idempotency_wait", which may be 0, has its own: wait.c */

    if (ms == (ngx_msec_t) NGX_ERROR || ms == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid time \"%V\" in \"%V\" directive, "
                           "a positive time is expected", &value[1],
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    *msp = ms;

    return NGX_CONF_OK;
}


static char *
ngx_http_idempotency_methods(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_str_t           *value;
    ngx_uint_t           i;
    ngx_conf_bitmask_t  *m;

    if (ilcf->methods) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {

        for (m = ngx_http_idempotency_methods_mask; m->name.len; m++) {
            if (m->name.len == value[i].len
                && ngx_strcasecmp(m->name.data, value[i].data) == 0)
            {
                break;
            }
        }

        if (m->name.len == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "unknown method \"%V\" in \"%V\" directive",
                               &value[i], &cmd->name);
            return NGX_CONF_ERROR;
        }

        ilcf->methods |= m->mask;
    }

    ilcf->methods |= NGX_CONF_BITMASK_SET;

    return NGX_CONF_OK;
}


static char *
ngx_http_idempotency_header(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_str_t   *value;
    ngx_uint_t   i;

    if (ilcf->header.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 0) {
        goto invalid;
    }

    /* an RFC 9110 token */

    for (i = 0; i < value[1].len; i++) {
        if (value[1].data[i] <= ' ' || value[1].data[i] >= 0x7f
            || ngx_strchr("\"(),/:;<=>?@[\\]{}", value[1].data[i]))
        {
            goto invalid;
        }
    }

    ilcf->header = value[1];
    ilcf->header_lc.len = value[1].len;
    ilcf->header_lc.data = ngx_pnalloc(cf->pool, value[1].len);
    if (ilcf->header_lc.data == NULL) {
        return NGX_CONF_ERROR;
    }

    ilcf->header_hash = ngx_hash_strlow(ilcf->header_lc.data, value[1].data,
                                        value[1].len);

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid header name \"%V\" in \"%V\" directive",
                       &value[1], &cmd->name);
    return NGX_CONF_ERROR;
}


static char *
ngx_http_idempotency_size(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    size_t     *sp;
    ssize_t     size;
    ngx_str_t  *value;

    sp = (size_t *) (p + cmd->offset);

    if (*sp != NGX_CONF_UNSET_SIZE) {
        return "is duplicate";
    }

    value = cf->args->elts;

    size = ngx_parse_size(&value[1]);

    /*
     * The body travels to Redis as one bulk string, at most 512 MiB.  0
     * would store no response at all: every retry would get 422 OVERSIZE,
     * which is never what is meant (switch "idempotency" off instead).
     */

    if (size == NGX_ERROR || size == 0 || size > 512 * 1024 * 1024) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid size \"%V\" in \"%V\" directive, "
                           "1 to 512m is expected", &value[1], &cmd->name);
        return NGX_CONF_ERROR;
    }

    *sp = size;

    return NGX_CONF_OK;
}


static char *
ngx_http_idempotency_on_store_error(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_str_t        *value;
    ngx_conf_enum_t  *e;

    if (ilcf->on_store_error != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (e = cmd->post; e->name.len; e++) {
        if (e->name.len == value[1].len
            && ngx_strcmp(e->name.data, value[1].data) == 0)
        {
            ilcf->on_store_error = e->value;
            return NGX_CONF_OK;
        }
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid value \"%V\" in \"%V\" directive, "
                       "it must be \"closed\" or \"open\"",
                       &value[1], &cmd->name);
    return NGX_CONF_ERROR;
}


static char *
ngx_http_idempotency_key_max_length(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_int_t   n;
    ngx_str_t  *value;

    if (ilcf->key_max_length != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    n = ngx_atoi(value[1].data, value[1].len);

    if (n == NGX_ERROR || n < 1 || n > NGX_HTTP_IDEMPOTENCY_KEY_LIMIT) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid length \"%V\" in \"%V\" directive, "
                           "1 to %d is expected", &value[1], &cmd->name,
                           NGX_HTTP_IDEMPOTENCY_KEY_LIMIT);
        return NGX_CONF_ERROR;
    }

    ilcf->key_max_length = n;

    return NGX_CONF_OK;
}


static ngx_uint_t
ngx_http_idempotency_header_in(ngx_str_t *list, ngx_str_t *name)
{
    for ( /* void */ ; list->len; list++) {
        if (list->len == name->len
            && ngx_strncasecmp(list->data, name->data, name->len) == 0)
        {
            return 1;
        }
    }

    return 0;
}


/* idempotency_hide_header and idempotency_pass_header */

static char *
ngx_http_idempotency_header_list(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    char  *p = conf;

    ngx_str_t     *value, *h;
    ngx_array_t  **a;

    a = (ngx_array_t **) (p + cmd->offset);

    value = cf->args->elts;

    if (cmd->offset
        == offsetof(ngx_http_idempotency_loc_conf_t, pass_headers)
        && !ngx_http_idempotency_header_in(ngx_http_idempotency_hidden_headers,
                                           &value[1]))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" in \"%V\" directive: only a header "
                           "hidden by default (Set-Cookie) can be passed; "
                           "%s", &value[1], &cmd->name,
                           ngx_http_idempotency_header_in(
                               ngx_http_idempotency_never_headers, &value[1])
                           ? "this one is never replayed"
                           : "this one is replayed anyway");
        return NGX_CONF_ERROR;
    }

    if (*a == NGX_CONF_UNSET_PTR) {
        *a = ngx_array_create(cf->pool, 4, sizeof(ngx_str_t));
        if (*a == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    h = ngx_array_push(*a);
    if (h == NULL) {
        return NGX_CONF_ERROR;
    }

    *h = value[1];

    return NGX_CONF_OK;
}


/*
 * The list of response headers a location never stores: the fixed list,
 * the hidden ones that are not passed, and the ones it hides itself.
 * hide/pass lists inherit as a whole, like proxy_hide_header.
 */

static char *
ngx_http_idempotency_merge_headers(ngx_conf_t *cf,
    ngx_http_idempotency_loc_conf_t *conf,
    ngx_http_idempotency_loc_conf_t *prev)
{
    ngx_str_t   *h, *s;
    ngx_uint_t   i;

    ngx_conf_merge_ptr_value(conf->hide_headers, prev->hide_headers, NULL);
    ngx_conf_merge_ptr_value(conf->pass_headers, prev->pass_headers, NULL);

    if (prev->skip_headers
        && conf->hide_headers == prev->hide_headers
        && conf->pass_headers == prev->pass_headers)
    {
        conf->skip_headers = prev->skip_headers;
        return NGX_CONF_OK;
    }

    conf->skip_headers = ngx_array_create(cf->pool, 20, sizeof(ngx_str_t));
    if (conf->skip_headers == NULL) {
        return NGX_CONF_ERROR;
    }

    for (h = ngx_http_idempotency_never_headers; h->len; h++) {
        s = ngx_array_push(conf->skip_headers);
        if (s == NULL) {
            return NGX_CONF_ERROR;
        }

        *s = *h;
    }

    for (h = ngx_http_idempotency_hidden_headers; h->len; h++) {
        if (conf->pass_headers) {
            s = conf->pass_headers->elts;

            for (i = 0; i < conf->pass_headers->nelts; i++) {
                if (s[i].len == h->len
                    && ngx_strncasecmp(s[i].data, h->data, h->len) == 0)
                {
                    break;
                }
            }

            if (i < conf->pass_headers->nelts) {
                continue;
            }
        }

        s = ngx_array_push(conf->skip_headers);
        if (s == NULL) {
            return NGX_CONF_ERROR;
        }

        *s = *h;
    }

    if (conf->hide_headers) {
        h = conf->hide_headers->elts;

        for (i = 0; i < conf->hide_headers->nelts; i++) {
            s = ngx_array_push(conf->skip_headers);
            if (s == NULL) {
                return NGX_CONF_ERROR;
            }

            *s = h[i];
        }
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_idempotency_store_status(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    char        *rv;
    ngx_str_t   *value;
    ngx_uint_t   i;

    if (ilcf->store_status) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {
        rv = ngx_http_idempotency_store_status_parse(cf, cmd, ilcf, &value[i]);
        if (rv != NGX_CONF_OK) {
            return rv;
        }
    }

    return NGX_CONF_OK;
}


/* one of "NNN", "Nxx", "!NNN", "!Nxx", applied left to right */

static char *
ngx_http_idempotency_store_status_parse(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_idempotency_loc_conf_t *ilcf, ngx_str_t *value)
{
    u_char      *p;
    ngx_int_t    n, from, to;
    ngx_uint_t   clear;

    if (ilcf->store_status == NULL) {
        ilcf->store_status = ngx_pcalloc(cf->pool,
                                         NGX_HTTP_IDEMPOTENCY_STATUS_BYTES);
        if (ilcf->store_status == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    p = value->data;
    clear = 0;

    if (value->len == 4 && p[0] == '!') {
        clear = 1;
        p++;

    } else if (value->len != 3) {
        goto invalid;
    }

    if (p[0] < '1' || p[0] > '5') {
        goto invalid;
    }

    if (p[1] == 'x' && p[2] == 'x') {
        from = (p[0] - '0') * 100;
        to = from + 99;

    } else {
        n = ngx_atoi(p, 3);
        if (n == NGX_ERROR) {
            goto invalid;
        }

        from = n;
        to = n;
    }

    for (n = from; n <= to; n++) {
        if (clear) {
            ilcf->store_status[n / 8] &= ~(1 << (n % 8));

        } else {
            ilcf->store_status[n / 8] |= 1 << (n % 8);
        }
    }

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid status \"%V\" in \"%V\" directive, "
                       "\"200\", \"2xx\", \"!409\" or \"!5xx\" is expected",
                       value, &cmd->name);
    return NGX_CONF_ERROR;
}
