/* The request context: made, found again after redirects; uses nginx only. */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_ctx.h"


static void ngx_http_idempotency_ctx_cleanup(void *data);


ngx_http_idempotency_ctx_t *
ngx_http_idempotency_ctx_create(ngx_http_request_t *r,
    ngx_http_idempotency_loc_conf_t *ilcf, ngx_pool_cleanup_pt end)
{
    ngx_pool_cleanup_t          *cln;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_idempotency_ctx_t));
    if (ctx == NULL) {
        return NULL;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    cln->handler = ngx_http_idempotency_ctx_cleanup;
    cln->data = ctx;

    ctx->end = end;
    ctx->request = r;
    ctx->conf = ilcf;
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_DONE;

    ngx_http_set_ctx(r, ctx, ngx_http_idempotency_module);

    return ctx;
}


ngx_http_idempotency_ctx_t *
ngx_http_idempotency_get_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t          *cln;
    ngx_http_idempotency_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_idempotency_module);

    if (ctx != NULL || r->uri_changes > NGX_HTTP_MAX_URI_CHANGES) {
        return ctx;
    }

    /*
     * An internal redirect or a named location (error_page,
     * X-Accel-Redirect, try_files) clears module contexts; the claim must
     * survive it, so the context is found again through its pool cleanup.
     * Subrequests share the pool, hence the check of the owner.
     */

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_idempotency_ctx_cleanup) {
            ctx = cln->data;

            if (ctx->request == r) {
                ngx_http_set_ctx(r, ctx, ngx_http_idempotency_module);
                return ctx;
            }
        }
    }

    return NULL;
}


static void
ngx_http_idempotency_ctx_cleanup(void *data)
{
    ngx_http_idempotency_ctx_t *ctx = data;

    ctx->end(ctx);
}
