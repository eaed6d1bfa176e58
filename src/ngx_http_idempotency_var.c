/*
 * $idempotency_status and $idempotency_key; each request's outcome counted
 * in the log phase, from the same value.  HTTP side; uses no Redis layer.
 */

#include "ngx_http_idempotency_var.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_cache.h"
#include "ngx_http_idempotency_stats.h"


static ngx_int_t ngx_http_idempotency_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_idempotency_key_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_idempotency_cache_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_idempotency_outcome_log_handler(
    ngx_http_request_t *r);


static ngx_http_variable_t  ngx_http_idempotency_vars[] = {

    { ngx_string("idempotency_status"), NULL,
      ngx_http_idempotency_status_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("idempotency_key"), NULL,
      ngx_http_idempotency_key_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("idempotency_cache"), NULL,
      ngx_http_idempotency_cache_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


/* indexed by ngx_http_idempotency_outcome_e */

static ngx_str_t  ngx_http_idempotency_outcome_names[] = {
    ngx_null_string,
    ngx_string("BYPASS"),
    ngx_string("MISS"),
    ngx_string("HIT"),
    ngx_string("CONFLICT"),
    ngx_string("MISMATCH"),
    ngx_string("MISSING"),
    ngx_string("INVALID"),
    ngx_string("OVERSIZE"),
    ngx_string("ERROR"),
    ngx_string("UNSCOPED"),
    ngx_string("UNKNOWN")
};


/* why a request got its outcome, for the error log */

static const char  *ngx_http_idempotency_outcome_reasons[] = {
    "none",
    "not a protected request, or no key",
    "claimed, the request runs",
    "replayed from the store",
    "the first request with this key is still running",
    "the key was used for a different request",
    "no key where idempotency_required is on",
    "the key is not valid",
    "the first response was too large to be stored",
    "Redis failed",
    "a key but an empty idempotency_scope",
    "the first request's outcome is unknown, it is not run again"
};


ngx_int_t
ngx_http_idempotency_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_idempotency_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


/*
 * The outcome of a request as $idempotency_status and the counters show
 * it, or NONE where the module does not apply.
 */

ngx_http_idempotency_outcome_e
ngx_http_idempotency_request_outcome(ngx_http_request_t *r)
{
    ngx_http_idempotency_ctx_t       *ctx;
    ngx_http_idempotency_loc_conf_t  *ilcf;

    ctx = ngx_http_idempotency_get_ctx(r->main);

    if (ctx != NULL && ctx->outcome != NGX_HTTP_IDEMPOTENCY_NONE) {
        return ctx->outcome;
    }

    /* a request the module looked at no further than its method */

    ilcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    return ilcf->enable ? NGX_HTTP_IDEMPOTENCY_BYPASS
                        : NGX_HTTP_IDEMPOTENCY_NONE;
}


ngx_str_t *
ngx_http_idempotency_outcome_name(ngx_http_idempotency_outcome_e outcome)
{
    return &ngx_http_idempotency_outcome_names[outcome];
}


const char *
ngx_http_idempotency_outcome_reason(ngx_http_idempotency_outcome_e outcome)
{
    return ngx_http_idempotency_outcome_reasons[outcome];
}


static ngx_int_t
ngx_http_idempotency_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_str_t                       *name;
    ngx_http_idempotency_outcome_e   outcome;

    outcome = ngx_http_idempotency_request_outcome(r);

    if (outcome == NGX_HTTP_IDEMPOTENCY_NONE) {
        v->not_found = 1;
        return NGX_OK;
    }

    name = &ngx_http_idempotency_outcome_names[outcome];

    v->len = name->len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = name->data;

    return NGX_OK;
}


/* where a replay came from: "HIT" this node's cache, "MISS" Redis, "-" */

static ngx_int_t
ngx_http_idempotency_cache_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_idempotency_get_ctx(r->main);

    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    if (ctx == NULL || ctx->cache == NGX_HTTP_IDEMPOTENCY_CACHE_NONE) {
        v->len = 1;
        v->data = (u_char *) "-";

    } else if (ctx->cache == NGX_HTTP_IDEMPOTENCY_CACHE_HIT) {
        v->len = 3;
        v->data = (u_char *) "HIT";

    } else {
        v->len = 4;
        v->data = (u_char *) "MISS";
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_key_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_idempotency_get_ctx(r->main);

    if (ctx == NULL || ctx->key.len == 0) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->len = ctx->key.len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = ctx->key.data;

    return NGX_OK;
}


/* from postconfiguration, when some location has "idempotency on" */

ngx_int_t
ngx_http_idempotency_outcome_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    if (ngx_http_idempotency_stats_zone(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    /*
     * Outcomes are counted once per request at its end, from the same
     * value as $idempotency_status: the counters and the access log agree.
     */

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_LOG_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_idempotency_outcome_log_handler;

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_outcome_log_handler(ngx_http_request_t *r)
{
    ngx_http_idempotency_ctx_t       *ctx;
    ngx_http_idempotency_outcome_e    outcome;
    ngx_http_idempotency_loc_conf_t  *ilcf;

    if (r != r->main) {
        return NGX_OK;
    }

    /*
     * As ngx_http_idempotency_request_outcome(), with the location it
     * counts under: the one that decided, after any redirect
     */

    ctx = ngx_http_idempotency_get_ctx(r);

    if (ctx != NULL && ctx->outcome != NGX_HTTP_IDEMPOTENCY_NONE) {
        outcome = ctx->outcome;
        ilcf = ctx->conf;

    } else {
        ilcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

        if (!ilcf->enable) {
            return NGX_OK;
        }

        outcome = NGX_HTTP_IDEMPOTENCY_BYPASS;
    }

    ngx_http_idempotency_stat_count(ilcf->metrics,
                                    (ngx_http_idempotency_stat_e)
                                    (NGX_HTTP_IDEMPOTENCY_STAT_BYPASS
                                     + outcome - NGX_HTTP_IDEMPOTENCY_BYPASS));

    return NGX_OK;
}
