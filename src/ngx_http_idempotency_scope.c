/*
 * Scopes: the keyed or plain hash of idempotency_scope that names a
 * principal's namespace in Redis, the secret file that keys it, and the
 * per-scope share of a worker's waiting duplicates.  HTTP side; uses no
 * Redis layer.
 */

#include "ngx_http_idempotency_scope.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>


/* slots of the per-worker table of waiting scopes: twice the worker cap */
#define NGX_HTTP_IDEMPOTENCY_SCOPE_SLOTS  (2 * NGX_HTTP_IDEMPOTENCY_MAX_WAITERS)

#define SCOPE_BLOCK       NGX_HTTP_IDEMPOTENCY_SCOPE_BLOCK
#define SCOPE_SECRET_MAX  NGX_HTTP_IDEMPOTENCY_SCOPE_SECRET_MAX

/* seconds between two log lines about empty scopes, per worker */
#define NGX_HTTP_IDEMPOTENCY_SCOPE_LOG_INTERVAL  60


typedef struct {
    uint64_t     id;       /* first 64 bits of the scope hash; 0: free */
    ngx_uint_t   count;
} ngx_http_idempotency_scope_waiters_t;


static ngx_int_t ngx_http_idempotency_scope_digest(EVP_MD_CTX *md_ctx,
    u_char *pad, u_char *data, size_t len, u_char *md);
static ngx_int_t ngx_http_idempotency_scope_read(ngx_conf_t *cf,
    ngx_str_t *name, u_char *key, size_t *len);
static uint64_t ngx_http_idempotency_scope_id(u_char *hex);
static ngx_http_idempotency_scope_waiters_t *
    ngx_http_idempotency_scope_slot(uint64_t id, ngx_uint_t add);


/* per worker, as the fingerprint's: see ngx_http_idempotency_body.c */
static const EVP_MD  *ngx_http_idempotency_scope_md;
#if (OPENSSL_VERSION_NUMBER >= 0x30000000L)
static EVP_MD        *ngx_http_idempotency_scope_md_fetched;
#endif
static EVP_MD_CTX    *ngx_http_idempotency_scope_md_ctx;

static ngx_http_idempotency_scope_waiters_t
    ngx_http_idempotency_scope_waiters[NGX_HTTP_IDEMPOTENCY_SCOPE_SLOTS];

static time_t      ngx_http_idempotency_scope_logged;
static ngx_uint_t  ngx_http_idempotency_scope_unlogged;

/*
 * The last scope this worker hashed and its hash: the requests of one
 * principal (a client's retries, a service with one credential, a constant
 * idempotency_scope) hash their scope once, not once per request.  Looked
 * up with a constant-time comparison, as the bytes are a credential.
 */
#define NGX_HTTP_IDEMPOTENCY_SCOPE_MEMO_MAX  256

static struct {
    /* the location's secret it was keyed with, NULL: none */
    ngx_http_idempotency_scope_secret_t  *secret;
    size_t     len;                               /* 0: nothing kept */
    u_char     scope[NGX_HTTP_IDEMPOTENCY_SCOPE_MEMO_MAX];
    u_char     hex[NGX_HTTP_IDEMPOTENCY_SCOPE_HEX_LEN];
} ngx_http_idempotency_scope_memo;


ngx_int_t
ngx_http_idempotency_scope_init_process(ngx_cycle_t *cycle)
{
#if (OPENSSL_VERSION_NUMBER >= 0x30000000L)
    ngx_http_idempotency_scope_md_fetched = EVP_MD_fetch(NULL, "SHA256",
                                                         NULL);
    ngx_http_idempotency_scope_md = ngx_http_idempotency_scope_md_fetched;
#else
    ngx_http_idempotency_scope_md = EVP_sha256();
#endif

    ngx_http_idempotency_scope_md_ctx = EVP_MD_CTX_new();

    if (ngx_http_idempotency_scope_md == NULL
        || ngx_http_idempotency_scope_md_ctx == NULL)
    {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "idempotency: cannot set up SHA-256 in OpenSSL");
        return NGX_ERROR;
    }

    ngx_memzero(ngx_http_idempotency_scope_waiters,
                sizeof(ngx_http_idempotency_scope_waiters));
    ngx_memzero(&ngx_http_idempotency_scope_memo,
                sizeof(ngx_http_idempotency_scope_memo));

    return NGX_OK;
}


void
ngx_http_idempotency_scope_exit_process(ngx_cycle_t *cycle)
{
    (void) cycle;

    if (ngx_http_idempotency_scope_md_ctx) {
        EVP_MD_CTX_free(ngx_http_idempotency_scope_md_ctx);
        ngx_http_idempotency_scope_md_ctx = NULL;
    }

#if (OPENSSL_VERSION_NUMBER >= 0x30000000L)
    if (ngx_http_idempotency_scope_md_fetched) {
        EVP_MD_free(ngx_http_idempotency_scope_md_fetched);
        ngx_http_idempotency_scope_md_fetched = NULL;
    }
#endif

    ngx_http_idempotency_scope_md = NULL;
}


/*
 * HMAC (RFC 2104) over the digest the worker holds already:
 * SHA-256(opad || SHA-256(ipad || scope)), with both pads made once at
 * configuration time from the secret.
 */

ngx_int_t
ngx_http_idempotency_scope_hash(ngx_http_idempotency_loc_conf_t *ilcf,
    ngx_str_t *scope, u_char *hex, ngx_log_t *log)
{
    EVP_MD_CTX                           *md_ctx;
    u_char                                md[SHA256_DIGEST_LENGTH];
    ngx_http_idempotency_scope_secret_t  *secret;

    md_ctx = ngx_http_idempotency_scope_md_ctx;

    if (md_ctx == NULL) {
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "idempotency: SHA-256 is not set up in this process");
        return NGX_ERROR;
    }

    secret = ilcf->scope_secret;

    if (secret == NGX_CONF_UNSET_PTR) {
        secret = NULL;
    }

    if (scope->len != 0
        && ngx_http_idempotency_scope_memo.len == scope->len
        && ngx_http_idempotency_scope_memo.secret == secret
        && CRYPTO_memcmp(ngx_http_idempotency_scope_memo.scope, scope->data,
                         scope->len)
           == 0)
    {
        ngx_memcpy(hex, ngx_http_idempotency_scope_memo.hex,
                   NGX_HTTP_IDEMPOTENCY_SCOPE_HEX_LEN);
        return NGX_OK;
    }

    if (secret == NULL) {
        if (ngx_http_idempotency_scope_digest(md_ctx, NULL, scope->data,
                                              scope->len, md)
            != NGX_OK)
        {
            goto failed;
        }

    } else if (ngx_http_idempotency_scope_digest(md_ctx, secret->ipad,
                                                 scope->data, scope->len, md)
               != NGX_OK
               || ngx_http_idempotency_scope_digest(md_ctx, secret->opad,
                                                    md, sizeof(md), md)
                  != NGX_OK)
    {
        goto failed;
    }

    ngx_hex_dump(hex, md, SHA256_DIGEST_LENGTH);

    if (scope->len <= NGX_HTTP_IDEMPOTENCY_SCOPE_MEMO_MAX) {
        ngx_http_idempotency_scope_memo.secret = secret;
        ngx_http_idempotency_scope_memo.len = scope->len;
        ngx_memcpy(ngx_http_idempotency_scope_memo.scope, scope->data,
                   scope->len);
        ngx_memcpy(ngx_http_idempotency_scope_memo.hex, hex,
                   NGX_HTTP_IDEMPOTENCY_SCOPE_HEX_LEN);
    }

    return NGX_OK;

failed:

    ngx_log_error(NGX_LOG_ALERT, log, 0,
                  "idempotency: SHA-256 of the scope failed");
    return NGX_ERROR;
}


/* SHA-256 of pad (one block, when not NULL) and data; md may be data */

static ngx_int_t
ngx_http_idempotency_scope_digest(EVP_MD_CTX *md_ctx, u_char *pad,
    u_char *data, size_t len, u_char *md)
{
    if (EVP_DigestInit_ex(md_ctx, ngx_http_idempotency_scope_md, NULL) != 1
        || (pad && EVP_DigestUpdate(md_ctx, pad,
                                    NGX_HTTP_IDEMPOTENCY_SCOPE_BLOCK)
                   != 1)
        || EVP_DigestUpdate(md_ctx, data, len) != 1
        || EVP_DigestFinal_ex(md_ctx, md, NULL) != 1)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * idempotency_scope_secret FILE | off.  The file is read here, at
 * configuration time (so "nginx -t" checks it and a reload reads it
 * again); what the workers keep is the two HMAC pads, never the file.
 */

char *
ngx_http_idempotency_scope_secret(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    size_t                                len, i;
    ngx_str_t                            *value, name;
    ngx_http_idempotency_scope_secret_t  *secret;
    u_char                                key[SCOPE_BLOCK];
    u_char                                raw[SCOPE_SECRET_MAX + 1];

    if (ilcf->scope_secret != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {
        ilcf->scope_secret = NULL;
        return NGX_CONF_OK;
    }

    name = value[1];

    if (ngx_conf_full_name(cf->cycle, &name, 1) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    secret = ngx_pcalloc(cf->pool,
                         sizeof(ngx_http_idempotency_scope_secret_t));
    if (secret == NULL) {
        return NGX_CONF_ERROR;
    }

    secret->file = name;

    /*
     * a reload without workers of its own (master_process off) may put
     * another secret where an old one was: the hash kept for that one goes
     */
    ngx_memzero(&ngx_http_idempotency_scope_memo,
                sizeof(ngx_http_idempotency_scope_memo));

    if (ngx_http_idempotency_scope_read(cf, &name, raw, &len) != NGX_OK) {
        OPENSSL_cleanse(raw, sizeof(raw));
        return NGX_CONF_ERROR;
    }

    /* "echo $secret > file" and editors add a line end: not the secret */

    while (len && (raw[len - 1] == LF || raw[len - 1] == CR)) {
        len--;
    }

    if (len == 0) {
        OPENSSL_cleanse(raw, sizeof(raw));
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" named by \"%V\" is empty",
                           &name, &cmd->name);
        return NGX_CONF_ERROR;
    }

    /* RFC 2104: a key longer than a block is hashed first */

    ngx_memzero(key, sizeof(key));

    if (len > NGX_HTTP_IDEMPOTENCY_SCOPE_BLOCK) {
        if (EVP_Digest(raw, len, key, NULL, EVP_sha256(), NULL) != 1) {
            OPENSSL_cleanse(raw, sizeof(raw));
            return NGX_CONF_ERROR;
        }

    } else {
        ngx_memcpy(key, raw, len);
    }

    OPENSSL_cleanse(raw, sizeof(raw));

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_SCOPE_BLOCK; i++) {
        secret->ipad[i] = key[i] ^ 0x36;
        secret->opad[i] = key[i] ^ 0x5c;
    }

    OPENSSL_cleanse(key, sizeof(key));

    ilcf->scope_secret = secret;

    return NGX_CONF_OK;
}


/* the whole file into key (SECRET_MAX + 1 bytes of room), *len its size */

static ngx_int_t
ngx_http_idempotency_scope_read(ngx_conf_t *cf, ngx_str_t *name, u_char *key,
    size_t *len)
{
    ssize_t          n;
    ngx_int_t        rc;
    ngx_file_t       file;
    ngx_file_info_t  fi;

    ngx_memzero(&file, sizeof(ngx_file_t));

    file.name = *name;
    file.log = cf->log;

    file.fd = ngx_open_file(name->data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);

    if (file.fd == NGX_INVALID_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_open_file_n " \"%V\" named by "
                           "\"idempotency_scope_secret\" failed", name);
        return NGX_ERROR;
    }

    rc = NGX_ERROR;

    if (ngx_fd_info(file.fd, &fi) == NGX_FILE_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_fd_info_n " \"%V\" named by "
                           "\"idempotency_scope_secret\" failed", name);
        goto done;
    }

    if (!ngx_is_file(&fi)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" named by \"idempotency_scope_secret\" "
                           "is not a file", name);
        goto done;
    }

    /* one read more than the limit tells a file that is too large */

    n = ngx_read_file(&file, key, NGX_HTTP_IDEMPOTENCY_SCOPE_SECRET_MAX + 1,
                      0);

    if (n == NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "cannot read \"%V\" named by "
                           "\"idempotency_scope_secret\"", name);
        goto done;
    }

    if (n > NGX_HTTP_IDEMPOTENCY_SCOPE_SECRET_MAX) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" named by \"idempotency_scope_secret\" "
                           "is larger than %d bytes", name,
                           NGX_HTTP_IDEMPOTENCY_SCOPE_SECRET_MAX);
        goto done;
    }

    *len = n;
    rc = NGX_OK;

done:

    if (ngx_close_file(file.fd) == NGX_FILE_ERROR) {
        ngx_log_error(NGX_LOG_ALERT, cf->log, ngx_errno,
                      ngx_close_file_n " \"%V\" failed", name);
    }

    return rc;
}


void
ngx_http_idempotency_scope_empty_log(ngx_http_request_t *r)
{
    if (ngx_time() - ngx_http_idempotency_scope_logged
        < NGX_HTTP_IDEMPOTENCY_SCOPE_LOG_INTERVAL)
    {
        ngx_http_idempotency_scope_unlogged++;
        return;
    }

    ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                  "idempotency: a request with a key has an empty "
                  "idempotency_scope, refused with 400 (UNSCOPED); "
                  "%ui more since the last such message; set "
                  "idempotency_scope to what identifies the client, or "
                  "to a constant for a deliberately shared namespace",
                  ngx_http_idempotency_scope_unlogged);

    ngx_http_idempotency_scope_logged = ngx_time();
    ngx_http_idempotency_scope_unlogged = 0;
}


/*
 * The waiting scopes of a worker: open addressing with linear probing on
 * the first 64 bits of the scope hash (uniform already), and backward-shift
 * deletion so that no tombstones pile up.  At most MAX_WAITERS entries are
 * in use at once (the handler checks the worker's cap first), so the table
 * is never more than half full.  Two scopes sharing 64 bits would only
 * share a cap.
 */

ngx_int_t
ngx_http_idempotency_scope_wait_enter(u_char *hex)
{
    ngx_http_idempotency_scope_waiters_t  *w;

    w = ngx_http_idempotency_scope_slot(ngx_http_idempotency_scope_id(hex),
                                        1);

    if (w == NULL || w->count >= NGX_HTTP_IDEMPOTENCY_MAX_SCOPE_WAITERS) {
        return NGX_DECLINED;
    }

    w->count++;

    return NGX_OK;
}


void
ngx_http_idempotency_scope_wait_leave(u_char *hex)
{
    ngx_uint_t                             i, j, k, mask;
    ngx_http_idempotency_scope_waiters_t  *w, *t;

    w = ngx_http_idempotency_scope_slot(ngx_http_idempotency_scope_id(hex),
                                        0);

    if (w == NULL || w->count == 0) {
        return;
    }

    if (--w->count) {
        return;
    }

    t = ngx_http_idempotency_scope_waiters;
    mask = NGX_HTTP_IDEMPOTENCY_SCOPE_SLOTS - 1;

    i = w - t;
    j = i;

    for ( ;; ) {
        j = (j + 1) & mask;

        if (t[j].id == 0) {
            break;
        }

        k = (ngx_uint_t) (t[j].id & mask);    /* where t[j] would be */

        /* t[j] moves up to i unless its home lies cyclically in (i, j] */

        if ((i <= j) ? (i < k && k <= j) : (i < k || k <= j)) {
            continue;
        }

        t[i] = t[j];
        i = j;
    }

    t[i].id = 0;
    t[i].count = 0;
}


static uint64_t
ngx_http_idempotency_scope_id(u_char *hex)
{
    uint64_t    id;
    ngx_uint_t  i;
    u_char      c;

    id = 0;

    for (i = 0; i < 16; i++) {
        c = hex[i];
        id = (id << 4)
             | (uint64_t) ((c >= 'a') ? c - 'a' + 10 : c - '0');
    }

    return id ? id : 1;
}


static ngx_http_idempotency_scope_waiters_t *
ngx_http_idempotency_scope_slot(uint64_t id, ngx_uint_t add)
{
    ngx_uint_t                             i, n, mask;
    ngx_http_idempotency_scope_waiters_t  *t;

    t = ngx_http_idempotency_scope_waiters;
    mask = NGX_HTTP_IDEMPOTENCY_SCOPE_SLOTS - 1;

    for (n = 0, i = (ngx_uint_t) (id & mask);
         n < NGX_HTTP_IDEMPOTENCY_SCOPE_SLOTS;
         n++, i = (i + 1) & mask)
    {
        if (t[i].id == id) {
            return &t[i];
        }

        if (t[i].id == 0) {
            if (!add) {
                return NULL;
            }

            t[i].id = id;
            t[i].count = 0;
            return &t[i];
        }
    }

    return NULL;
}
