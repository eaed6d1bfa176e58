/*
 * The "idempotency_admin" location: looks at (GET) or removes (DELETE) the
 * record of one key, through the location's own Redis, prefix and scope
 * settings, so that Sentinel and Cluster route it like the module does.
 * HTTP side; uses the records layer (inspect and purge scripts).
 */

#include "ngx_http_idempotency_admin.h"
#include "ngx_http_idempotency_conf.h"
#include "ngx_http_idempotency_problem.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_key.h"
#include "ngx_http_idempotency_cache.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_scope.h"
#include "ngx_http_idempotency_stats.h"


/*
 * Bytes of a record read to show it: its first line fits, whatever its
 * fingerprint and owner (NGX_HTTP_IDEMPOTENCY_RECORD_HEAD_MAX() of two
 * NGX_HTTP_IDEMPOTENCY_RECORD_TOKEN_MAX tokens is about 300).
 */
#define NGX_HTTP_IDEMPOTENCY_ADMIN_HEAD  512


typedef struct {
    ngx_http_request_t                  *request;
    ngx_http_idempotency_redis_op_t     *op;
    ngx_str_t                            key;     /* decoded */
    ngx_str_t                            rkey;    /* the Redis record key */
    u_char                               key_hash[
                                             NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN];
    ngx_uint_t                           purge;
    ngx_uint_t                           split;   /* body in a second key */
} ngx_http_idempotency_admin_ctx_t;


static ngx_int_t ngx_http_idempotency_admin_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_idempotency_admin_args(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx, const char **error);
static ngx_int_t ngx_http_idempotency_admin_arg(ngx_http_request_t *r,
    const char *name, ngx_str_t *value);
static void ngx_http_idempotency_admin_reply(void *data, redisReply *reply,
    ngx_uint_t rc);
static ngx_int_t ngx_http_idempotency_admin_inspected(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx, redisReply *reply);
static ngx_int_t ngx_http_idempotency_admin_purged(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx, redisReply *reply);
static ngx_str_t  ngx_http_idempotency_admin_type =
    ngx_string("application/json");


static ngx_int_t ngx_http_idempotency_admin_json(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx, const char *state,
    ngx_http_idempotency_record_t *rec, long long size, long long ttl);
static ngx_int_t ngx_http_idempotency_admin_problem(ngx_http_request_t *r,
    ngx_uint_t status, const char *type, const char *title,
    const char *detail);
static void ngx_http_idempotency_admin_cleanup(void *data);


char *
ngx_http_idempotency_admin(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_http_core_loc_conf_t          *clcf;
    ngx_http_idempotency_main_conf_t  *imcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (ilcf->admin) {
        return "is duplicate";
    }

    ilcf->admin = 1;
    ilcf->file = cf->conf_file->file.name.data;
    ilcf->line = cf->conf_file->line;
    clcf->handler = ngx_http_idempotency_admin_handler;

    /* the workers connect to the Redis of this location too */

    imcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);
    imcf->used = 1;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_idempotency_admin_handler(ngx_http_request_t *r)
{
    ngx_int_t                          rc;
    ngx_str_t                          args[1];
    ngx_table_elt_t                   *h;
    const char                        *error;
    ngx_pool_cleanup_t                *cln;
    ngx_http_idempotency_admin_ctx_t  *ctx;
    ngx_http_idempotency_loc_conf_t   *ilcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD|NGX_HTTP_DELETE))) {
        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->hash = 1;
        ngx_str_set(&h->key, "Allow");
        ngx_str_set(&h->value, "GET, HEAD, DELETE");

        return ngx_http_idempotency_admin_problem(r, NGX_HTTP_NOT_ALLOWED,
                   "method-not-allowed", "Method not allowed",
                   "GET shows the record of a key, DELETE removes it.");
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_idempotency_admin_ctx_t));
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->request = r;
    ctx->purge = (r->method == NGX_HTTP_DELETE);

    rc = ngx_http_idempotency_admin_args(r, ctx, &error);

    if (rc == NGX_ERROR) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (rc == NGX_DECLINED) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency admin: bad request: %s", error);

        return ngx_http_idempotency_admin_problem(r, NGX_HTTP_BAD_REQUEST,
                   "admin-bad-request", "Bad arguments", error);
    }

    ngx_memcpy(ctx->key_hash, ngx_http_idempotency_key_hash(&ctx->rkey),
               NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN);

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_idempotency_admin_cleanup;
    cln->data = ctx;

    ilcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    if (ctx->purge) {
        /* this node's cache at once, whatever Redis answers */
        ngx_http_idempotency_cache_purge(&ctx->rkey);

        /* the other nodes' caches hear it on "<prefix>purge" */
        ctx->op = ngx_http_idempotency_redis_purge(ilcf->redis, &ctx->rkey,
                                   r->pool, ngx_http_idempotency_admin_reply,
                                   ctx, r->connection->log);

    } else {
        ngx_str_set(&args[0], ngx_value(NGX_HTTP_IDEMPOTENCY_ADMIN_HEAD));

        ctx->op = ngx_http_idempotency_redis_script(ilcf->redis,
                                   NGX_HTTP_IDEMPOTENCY_SCRIPT_INSPECT,
                                   &ctx->rkey, args, 1,
                                   ngx_http_idempotency_admin_reply, ctx,
                                   r->connection->log);
    }

    if (ctx->op == NULL) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency admin: Redis is not available, "
                      "key_hash=%*s",
                      (size_t) NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN,
                      ctx->key_hash);

        return ngx_http_idempotency_admin_problem(r,
                   NGX_HTTP_SERVICE_UNAVAILABLE, "store-unavailable",
                   "Idempotency store is unavailable",
                   "Redis cannot be reached now; retry later.");
    }

    r->main->count++;

    return NGX_DONE;
}


/*
 * ?key=K and either scope=S (the scope value as the protected location
 * computes it) or scope_hash=H (its 64 hex digits, as in the Redis key).
 * Arguments are decoded as from a form ('+' is a space).  NGX_DECLINED
 * with *error set (a constant, without a double quote: it goes into
 * JSON as it is) for a bad request.
 */

static ngx_int_t
ngx_http_idempotency_admin_args(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx, const char **error)
{
    int                                 krc;
    u_char                             *p;
    ngx_int_t                           rc, has_scope, has_hash;
    ngx_str_t                           key, scope, hash;
    ngx_uint_t                          i;
    ngx_http_idempotency_loc_conf_t    *ilcf;
    ngx_http_idempotency_redis_conf_t  *rcf;
    u_char                              hex[
                                         NGX_HTTP_IDEMPOTENCY_SCOPE_HEX_LEN];

    ilcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);
    rcf = ilcf->redis;

    rc = ngx_http_idempotency_admin_arg(r, "key", &key);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (rc == NGX_DECLINED) {
        *error = "The key argument is missing.";
        return NGX_DECLINED;
    }

    ctx->key.data = ngx_pnalloc(r->pool, key.len + 1);
    if (ctx->key.data == NULL) {
        return NGX_ERROR;
    }

    /* the same syntax as the header: a bare token or a quoted string */

    krc = ngx_http_idempotency_key_parse(key.data, key.len, ctx->key.data,
                                         &ctx->key.len, ilcf->key_max_length);

    if (krc != NGX_HTTP_IDEMPOTENCY_KEY_OK) {
        *error = ngx_http_idempotency_key_error(krc);
        return NGX_DECLINED;
    }

    has_scope = ngx_http_idempotency_admin_arg(r, "scope", &scope);
    has_hash = ngx_http_idempotency_admin_arg(r, "scope_hash", &hash);

    if (has_scope == NGX_ERROR || has_hash == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (has_scope == NGX_OK && has_hash == NGX_OK) {
        *error = "Give either scope or scope_hash, not both.";
        return NGX_DECLINED;
    }

    if (has_scope == NGX_OK) {
        if (scope.len == 0) {
            /* the protected locations refuse an empty scope: no record */
            *error = "The scope is empty: a key sent with an empty scope "
                     "is refused (400 UNSCOPED) and never stored.";
            return NGX_DECLINED;
        }

        rc = ngx_http_idempotency_scope_hash(ilcf, &scope, hex,
                                             r->connection->log);

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }

        if (rc != NGX_OK) {
            *error = "This scope value is refused by the location's "
                     "settings.";
            return NGX_DECLINED;
        }

    } else if (has_hash == NGX_OK) {

        if (hash.len != NGX_HTTP_IDEMPOTENCY_SCOPE_HEX_LEN) {
            *error = "scope_hash must be 64 hexadecimal digits.";
            return NGX_DECLINED;
        }

        for (i = 0; i < hash.len; i++) {
            hex[i] = ngx_tolower(hash.data[i]);

            if (!((hex[i] >= '0' && hex[i] <= '9')
                  || (hex[i] >= 'a' && hex[i] <= 'f')))
            {
                *error = "scope_hash must be 64 hexadecimal digits.";
                return NGX_DECLINED;
            }
        }

    } else {
        *error = "The scope (or scope_hash) argument is missing: "
                 "the scope value the protected location computes, e.g. "
                 "the Authorization header's value.";
        return NGX_DECLINED;
    }

    /* <prefix><scope hash>:<key>, as the protected location builds it */

    ctx->rkey.len = rcf->prefix.len + NGX_HTTP_IDEMPOTENCY_SCOPE_HEX_LEN + 1
                    + ctx->key.len;
    ctx->rkey.data = ngx_pnalloc(r->pool, ctx->rkey.len);
    if (ctx->rkey.data == NULL) {
        return NGX_ERROR;
    }

    p = ngx_cpymem(ctx->rkey.data, rcf->prefix.data, rcf->prefix.len);
    p = ngx_cpymem(p, hex, NGX_HTTP_IDEMPOTENCY_SCOPE_HEX_LEN);
    *p++ = ':';
    ngx_memcpy(p, ctx->key.data, ctx->key.len);

    return NGX_OK;
}


/* NGX_OK with the decoded value, NGX_DECLINED when absent */

static ngx_int_t
ngx_http_idempotency_admin_arg(ngx_http_request_t *r, const char *name,
    ngx_str_t *value)
{
    u_char     *src, *dst, *p;
    ngx_str_t   raw;
    ngx_uint_t  i;

    if (ngx_http_arg(r, (u_char *) name, ngx_strlen(name), &raw) != NGX_OK) {
        return NGX_DECLINED;
    }

    p = ngx_pnalloc(r->pool, 2 * raw.len + 1);
    if (p == NULL) {
        return NGX_ERROR;
    }

    /* '+' before %XX: an encoded "%2B" stays a plus sign */

    for (i = 0; i < raw.len; i++) {
        p[i] = (raw.data[i] == '+') ? ' ' : raw.data[i];
    }

    src = p;
    dst = p + raw.len;
    value->data = dst;

    ngx_unescape_uri(&dst, &src, raw.len, 0);

    value->len = dst - value->data;

    return NGX_OK;
}


static void
ngx_http_idempotency_admin_reply(void *data, redisReply *reply,
    ngx_uint_t rc)
{
    ngx_http_idempotency_admin_ctx_t *ctx = data;

    ngx_int_t            n;
    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = ctx->request;
    c = r->connection;

    ctx->op = NULL;

    /*
     * Out of this node's cache again, whatever the answer (a removal that
     * timed out may have happened): a replay read from Redis between the
     * first purge and the removal may have filled it
     */

    if (ctx->purge) {
        ngx_http_idempotency_cache_purge(&ctx->rkey);
    }

    if (rc != NGX_HTTP_IDEMPOTENCY_REDIS_OK) {
        ngx_log_error(NGX_LOG_ERR, c->log, 0,
                      "idempotency admin: Redis %s, key_hash=%*s",
                      rc == NGX_HTTP_IDEMPOTENCY_REDIS_TIMEOUT
                      ? "timed out" : "failed",
                      (size_t) NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN,
                      ctx->key_hash);

        n = ngx_http_idempotency_admin_problem(r,
                   NGX_HTTP_SERVICE_UNAVAILABLE, "store-unavailable",
                   "Idempotency store is unavailable",
                   "Redis did not answer in time or the connection was "
                   "lost; retry later.");

    } else if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, c->log, 0,
                      "idempotency admin: Redis error: %*s, key_hash=%*s",
                      (size_t) reply->len, reply->str,
                      (size_t) NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN,
                      ctx->key_hash);

        n = ngx_http_idempotency_admin_problem(r, NGX_HTTP_BAD_GATEWAY,
                   "store-error", "Redis answered with an error",
                   "See the error log: for instance the key holds a value "
                   "that is not a string.");

    } else if (ctx->purge) {
        n = ngx_http_idempotency_admin_purged(r, ctx, reply);

    } else {
        n = ngx_http_idempotency_admin_inspected(r, ctx, reply);
    }

    ngx_http_finalize_request(r, n);
    ngx_http_run_posted_requests(c);
}


/* nil, or [the record's start, its size, its PTTL] */

static ngx_int_t
ngx_http_idempotency_admin_inspected(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx, redisReply *reply)
{
    u_char                         *p, *last, *line;
    redisReply                     *head;
    const char                     *state;
    ngx_http_idempotency_record_t   rec;

    if (reply->type == REDIS_REPLY_NIL) {
        return ngx_http_idempotency_admin_problem(r, NGX_HTTP_NOT_FOUND,
                   "no-record", "No record for this key",
                   "There is no record of this key in this scope: it was "
                   "never used, has expired or was removed.");
    }

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 3
        || reply->element[0]->type != REDIS_REPLY_STRING
        || reply->element[1]->type != REDIS_REPLY_INTEGER
        || reply->element[2]->type != REDIS_REPLY_INTEGER)
    {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency admin: unexpected reply from Redis, "
                      "key_hash=%*s",
                      (size_t) NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN,
                      ctx->key_hash);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    head = reply->element[0];

    /* the first line alone, as a record without headers or body */

    state = "unreadable";
    ngx_memzero(&rec, sizeof(ngx_http_idempotency_record_t));
    rec.fp = (const unsigned char *) "";

    p = (u_char *) head->str;
    last = p + head->len;

    for ( /* void */ ; p + 1 < last; p++) {
        if (p[0] == CR && p[1] == LF) {
            break;
        }
    }

    if (p + 1 < last) {
        line = ngx_pnalloc(r->pool, (p - (u_char *) head->str) + 4);
        if (line == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        last = ngx_cpymem(line, head->str, p - (u_char *) head->str);
        last = ngx_cpymem(last, "\r\n\r\n", 4);

        if (ngx_http_idempotency_record_parse(line, last - line, &rec) == 0) {
            switch (rec.state) {

            case NGX_HTTP_IDEMPOTENCY_RECORD_INFLIGHT:
                state = "inflight";
                break;

            case NGX_HTTP_IDEMPOTENCY_RECORD_OVERSIZE:
                state = "oversize";
                break;

            case NGX_HTTP_IDEMPOTENCY_RECORD_UNKNOWN:
                state = "unknown";
                break;

            case NGX_HTTP_IDEMPOTENCY_RECORD_SPLIT:
                /* a done record whose body is kept in a second key */
                state = "done";
                ctx->split = 1;
                break;

            default:
                state = "done";
                break;
            }

        } else {
            ngx_memzero(&rec, sizeof(ngx_http_idempotency_record_t));
            rec.fp = (const unsigned char *) "";
        }
    }

    return ngx_http_idempotency_admin_json(r, ctx, state, &rec,
                                           reply->element[1]->integer,
                                           reply->element[2]->integer);
}


static ngx_int_t
ngx_http_idempotency_admin_purged(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx, redisReply *reply)
{
    if (reply->type != REDIS_REPLY_INTEGER) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency admin: unexpected reply from Redis, "
                      "key_hash=%*s",
                      (size_t) NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN,
                      ctx->key_hash);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (reply->integer == 0) {
        return ngx_http_idempotency_admin_problem(r, NGX_HTTP_NOT_FOUND,
                   "no-record", "No record for this key",
                   "There is no record of this key in this scope: it was "
                   "never used, has expired or was removed.");
    }

    ngx_log_error(NGX_LOG_NOTICE, r->connection->log, 0,
                  "idempotency admin: record key_hash=%*s removed",
                  (size_t) NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN, ctx->key_hash);

    /* nginx sends a 204 as a header alone */

    r->headers_out.status = NGX_HTTP_NO_CONTENT;
    r->header_only = 1;

    return ngx_http_send_header(r);
}


static ngx_int_t
ngx_http_idempotency_admin_json(ngx_http_request_t *r,
    ngx_http_idempotency_admin_ctx_t *ctx, const char *state,
    ngx_http_idempotency_record_t *rec, long long size, long long ttl)
{
    size_t      len;
    ngx_buf_t  *b;

    len = sizeof("{\n  \"key\": \"\",\n  \"redis_key\": \"\",\n"
                 "  \"key_hash\": \"\",\n  \"state\": \"\",\n"
                 "  \"status\": ,\n  \"ttl_ms\": ,\n  \"size\": ,\n"
                 "  \"created\": ,\n  \"fingerprint\": \"\"\n}\n")
          + NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN + sizeof("unreadable")
          + 3 * NGX_INT64_LEN + NGX_INT_T_LEN + 4
          + ctx->key.len
          + ngx_escape_json(NULL, ctx->key.data, ctx->key.len)
          + ctx->rkey.len
          + ngx_escape_json(NULL, ctx->rkey.data, ctx->rkey.len)
          + rec->created_len + rec->fp_len
          + sizeof("  \"split\": true,\n");

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_cpymem(b->last, "{\n  \"key\": \"",
                         sizeof("{\n  \"key\": \"") - 1);
    b->last = (u_char *) ngx_escape_json(b->last, ctx->key.data,
                                         ctx->key.len);
    b->last = ngx_cpymem(b->last, "\",\n  \"redis_key\": \"",
                         sizeof("\",\n  \"redis_key\": \"") - 1);
    b->last = (u_char *) ngx_escape_json(b->last, ctx->rkey.data,
                                         ctx->rkey.len);

    b->last = ngx_sprintf(b->last,
                          "\",\n  \"key_hash\": \"%*s\",\n"
                          "  \"state\": \"%s\",\n",
                          (size_t) NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN,
                          ctx->key_hash, state);

    if (ctx->split) {
        b->last = ngx_cpymem(b->last, "  \"split\": true,\n",
                             sizeof("  \"split\": true,\n") - 1);
    }

    if (rec->status) {
        b->last = ngx_sprintf(b->last, "  \"status\": %d,\n", rec->status);

    } else {
        b->last = ngx_sprintf(b->last, "  \"status\": null,\n");
    }

    b->last = ngx_sprintf(b->last, "  \"ttl_ms\": %L,\n  \"size\": %L,\n",
                          (int64_t) ttl, (int64_t) size);

    if (rec->created_len) {
        b->last = ngx_sprintf(b->last, "  \"created\": %*s,\n",
                              rec->created_len, rec->created);

    } else {
        b->last = ngx_sprintf(b->last, "  \"created\": null,\n");
    }

    b->last = ngx_sprintf(b->last, "  \"fingerprint\": \"%*s\"\n}\n",
                          rec->fp_len, rec->fp);

    return ngx_http_idempotency_send_body(r, NGX_HTTP_OK,
                                          &ngx_http_idempotency_admin_type,
                                          b, 0);
}


static ngx_int_t
ngx_http_idempotency_admin_problem(ngx_http_request_t *r, ngx_uint_t status,
    const char *type, const char *title, const char *detail)
{
    ngx_str_t  t, ti, d;

    t.data = (u_char *) type;
    t.len = ngx_strlen(type);
    ti.data = (u_char *) title;
    ti.len = ngx_strlen(title);
    d.data = (u_char *) detail;
    d.len = ngx_strlen(detail);

    return ngx_http_idempotency_send_problem_text(r, status, &t, &ti, &d);
}


/* the request ended first (e.g. the worker is exiting): drop the reply */

static void
ngx_http_idempotency_admin_cleanup(void *data)
{
    ngx_http_idempotency_admin_ctx_t *ctx = data;

    if (ctx->op) {
        ngx_http_idempotency_redis_forget(ctx->op);
        ctx->op = NULL;
    }
}
