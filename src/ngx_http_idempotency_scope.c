/*
 * The scope hash: hex SHA-256 of the scope value.
 */

#include "ngx_http_idempotency_scope.h"

#include <openssl/evp.h>
#include <openssl/sha.h>


/*
 * Per process, set up at the first use: SHA-256 fetched once (OpenSSL 3
 * looks an implicit EVP_sha256() up in its provider tables, under locks, on
 * every EVP_DigestInit_ex()) and one digest context reset for each use;
 * both freed with the cycle's pool (the worker exits, or a reload in a
 * single process ends the old cycle), before nginx unloads the module.
 */
#if (OPENSSL_VERSION_NUMBER >= 0x30000000L)
static EVP_MD        *ngx_http_idempotency_scope_md;
#else
static const EVP_MD  *ngx_http_idempotency_scope_md;
#endif
static EVP_MD_CTX    *ngx_http_idempotency_scope_md_ctx;


static ngx_int_t ngx_http_idempotency_scope_init(ngx_log_t *log);
static void ngx_http_idempotency_scope_cleanup(void *data);


ngx_int_t
ngx_http_idempotency_scope_hash(ngx_http_idempotency_loc_conf_t *ilcf,
    ngx_str_t *scope, u_char *hex, ngx_log_t *log)
{
    EVP_MD_CTX  *md_ctx;
    u_char       md[SHA256_DIGEST_LENGTH];

    (void) ilcf;

    if (ngx_http_idempotency_scope_md_ctx == NULL
        && ngx_http_idempotency_scope_init(log) != NGX_OK)
    {
        return NGX_ERROR;
    }

    md_ctx = ngx_http_idempotency_scope_md_ctx;

    if (EVP_DigestInit_ex(md_ctx, ngx_http_idempotency_scope_md, NULL)
           != 1
        || EVP_DigestUpdate(md_ctx, scope->data, scope->len) != 1
        || EVP_DigestFinal_ex(md_ctx, md, NULL) != 1)
    {
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "idempotency: SHA-256 of the scope failed");
        return NGX_ERROR;
    }

    ngx_hex_dump(hex, md, SHA256_DIGEST_LENGTH);

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_scope_init(ngx_log_t *log)
{
    ngx_pool_cleanup_t  *cln;

    cln = ngx_pool_cleanup_add(ngx_cycle->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_idempotency_scope_cleanup;
    cln->data = NULL;

#if (OPENSSL_VERSION_NUMBER >= 0x30000000L)
    ngx_http_idempotency_scope_md = EVP_MD_fetch(NULL, "SHA256", NULL);
#else
    ngx_http_idempotency_scope_md = EVP_sha256();
#endif

    ngx_http_idempotency_scope_md_ctx = EVP_MD_CTX_new();

    if (ngx_http_idempotency_scope_md == NULL
        || ngx_http_idempotency_scope_md_ctx == NULL)
    {
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "idempotency: cannot set up SHA-256 in OpenSSL");
        ngx_http_idempotency_scope_cleanup(NULL);
        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_http_idempotency_scope_cleanup(void *data)
{
    (void) data;

    if (ngx_http_idempotency_scope_md_ctx) {
        EVP_MD_CTX_free(ngx_http_idempotency_scope_md_ctx);
        ngx_http_idempotency_scope_md_ctx = NULL;
    }

#if (OPENSSL_VERSION_NUMBER >= 0x30000000L)
    if (ngx_http_idempotency_scope_md) {
        EVP_MD_free(ngx_http_idempotency_scope_md);
    }
#endif

    ngx_http_idempotency_scope_md = NULL;
}
