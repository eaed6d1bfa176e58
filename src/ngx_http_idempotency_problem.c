/*
 * RFC 9457 problem responses for everything the module answers itself, and
 * idempotency_problem_type, the prefix of their type.
 * HTTP side; uses no Redis layer.
 */

#include "ngx_http_idempotency_problem.h"


/* no NGX_HTTP_ constant in nginx */
#define NGX_HTTP_IDEMPOTENCY_UNPROCESSABLE       422


typedef struct {
    ngx_uint_t   status;
    ngx_str_t    type;      /* after the idempotency_problem_type prefix */
    ngx_str_t    title;
    ngx_str_t    detail;
    ngx_uint_t   retry_after;    /* seconds, 0: no header */
} ngx_http_idempotency_problem_t;


/* titles follow the IETF httpapi Idempotency-Key draft where it has one */

static ngx_http_idempotency_problem_t  ngx_http_idempotency_problems[] = {

    { NGX_HTTP_BAD_REQUEST,
      ngx_string("missing-key"),
      ngx_string("Idempotency-Key is missing"),
      ngx_string("This operation is idempotent and it requires correct "
                 "usage of Idempotency Key."),
      0 },

    { NGX_HTTP_BAD_REQUEST,
      ngx_string("invalid-key"),
      ngx_string("Idempotency-Key is invalid"),
      ngx_string("The Idempotency-Key header must be sent once, as "
                 "visible ASCII characters or as a quoted string, and "
                 "not be longer than the server accepts."),
      0 },

    { NGX_HTTP_CONFLICT,
      ngx_string("request-in-progress"),
      ngx_string("A request is outstanding for this Idempotency-Key"),
      ngx_string("The first request with this key is still being "
                 "processed; retry later to get its response."),
      1 },

    { NGX_HTTP_IDEMPOTENCY_UNPROCESSABLE,
      ngx_string("key-reused"),
      ngx_string("Idempotency-Key is already used"),
      ngx_string("This Idempotency-Key was used with a different request; "
                 "a key must not be reused across different payloads."),
      0 },

    { NGX_HTTP_IDEMPOTENCY_UNPROCESSABLE,
      ngx_string("response-not-stored"),
      ngx_string("Response for this Idempotency-Key is not available"),
      ngx_string("The operation for this key has completed, but its "
                 "response was too large to be stored and cannot be "
                 "replayed; it will not run again."),
      0 },

    { NGX_HTTP_SERVICE_UNAVAILABLE,
      ngx_string("store-unavailable"),
      ngx_string("Idempotency store is unavailable"),
      ngx_string("The request was not processed because its "
                 "Idempotency-Key could not be checked; retry later."),
      1 },

    { NGX_HTTP_BAD_REQUEST,
      ngx_string("missing-scope"),
      ngx_string("Idempotency-Key cannot be used without credentials"),
      ngx_string("Keys are kept apart per client here, and this request "
                 "does not say who sent it (e.g. no Authorization header); "
                 "send the credentials, or the server's operator sets "
                 "idempotency_scope to what identifies a client."),
      0 },

    { NGX_HTTP_BAD_GATEWAY,
      ngx_string("outcome-unknown"),
      ngx_string("Outcome for this Idempotency-Key is unknown"),
      ngx_string("The request with this key was passed on, but it did not "
                 "complete (the upstream failed after the request was sent, "
                 "or the response was cut off), so it may have been carried "
                 "out; it will not run again with this key."),
      0 }
};


static ngx_str_t  ngx_http_idempotency_problem_content_type =
    ngx_string("application/problem+json");


static ngx_int_t ngx_http_idempotency_problem_send(ngx_http_request_t *r,
    ngx_http_idempotency_problem_t *pr);


static ngx_http_idempotency_problem_t *
ngx_http_idempotency_problem_of(ngx_http_idempotency_outcome_e outcome)
{
    switch (outcome) {

    case NGX_HTTP_IDEMPOTENCY_MISSING:
        return &ngx_http_idempotency_problems[0];

    case NGX_HTTP_IDEMPOTENCY_INVALID:
        return &ngx_http_idempotency_problems[1];

    case NGX_HTTP_IDEMPOTENCY_CONFLICT:
        return &ngx_http_idempotency_problems[2];

    case NGX_HTTP_IDEMPOTENCY_MISMATCH:
        return &ngx_http_idempotency_problems[3];

    case NGX_HTTP_IDEMPOTENCY_OVERSIZE:
        return &ngx_http_idempotency_problems[4];

    case NGX_HTTP_IDEMPOTENCY_UNSCOPED:
        return &ngx_http_idempotency_problems[6];

    case NGX_HTTP_IDEMPOTENCY_UNKNOWN:
        return &ngx_http_idempotency_problems[7];

    default:
        return &ngx_http_idempotency_problems[5];
    }
}


ngx_int_t
ngx_http_idempotency_send_problem(ngx_http_request_t *r,
    ngx_http_idempotency_outcome_e outcome)
{
    return ngx_http_idempotency_problem_send(r,
                                     ngx_http_idempotency_problem_of(outcome));
}


ngx_int_t
ngx_http_idempotency_send_problem_text(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *type, ngx_str_t *title, ngx_str_t *detail)
{
    ngx_http_idempotency_problem_t  pr;

    pr.status = status;
    pr.type = *type;
    pr.title = *title;
    pr.detail = *detail;
    pr.retry_after = 0;

    return ngx_http_idempotency_problem_send(r, &pr);
}


static ngx_int_t
ngx_http_idempotency_problem_send(ngx_http_request_t *r,
    ngx_http_idempotency_problem_t *pr)
{
    size_t                            len;
    ngx_buf_t                        *b;
    ngx_http_idempotency_loc_conf_t  *ilcf;

    ilcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    /* keeps a keep-alive connection in step when the body was not read */

    if (ngx_http_discard_request_body(r) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* the texts are constants: nothing from the request is echoed */

    len = sizeof("{\"type\":\"\",\"title\":\"\",\"status\":,\"detail\":\"\"}\n")
          - 1 + ilcf->problem_type.len + pr->type.len + pr->title.len
          + NGX_INT_T_LEN + pr->detail.len;

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_sprintf(b->last,
                          "{\"type\":\"%V%V\",\"title\":\"%V\","
                          "\"status\":%ui,\"detail\":\"%V\"}\n",
                          &ilcf->problem_type, &pr->type, &pr->title,
                          pr->status, &pr->detail);
    return ngx_http_idempotency_send_body(r, pr->status,
                                 &ngx_http_idempotency_problem_content_type,
                                 b, pr->retry_after);
}


/* idempotency_problem_type URI */

char *
ngx_http_idempotency_problem_type(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_str_t   *value;
    ngx_uint_t   i;

    if (ilcf->problem_type.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    /* it goes into a JSON string as it is */

    for (i = 0; i < value[1].len; i++) {
        if (value[1].data[i] <= ' ' || value[1].data[i] >= 0x7f
            || value[1].data[i] == '"' || value[1].data[i] == '\\')
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid URI \"%V\" in \"%V\" directive",
                               &value[1], &cmd->name);
            return NGX_CONF_ERROR;
        }
    }

    ilcf->problem_type = value[1];

    return NGX_CONF_OK;
}


/*
 * A body the module answers with itself (problems, the admin endpoint):
 * never cached, Retry-After when retry_after is not 0.
 */

ngx_int_t
ngx_http_idempotency_send_body(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *type, ngx_buf_t *b, ngx_uint_t retry_after)
{
    ngx_int_t         rc;
    ngx_chain_t       out;
    ngx_table_elt_t  *h;

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    r->headers_out.status = status;
    ngx_http_idempotency_status_line(r);
    r->headers_out.content_length_n = b->last - b->pos;
    r->headers_out.content_type = *type;
    r->headers_out.content_type_len = type->len;
    r->headers_out.content_type_lowcase = NULL;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "Cache-Control");
    ngx_str_set(&h->value, "no-store");

    if (retry_after) {
        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->value.data = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
        if (h->value.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->hash = 1;
        ngx_str_set(&h->key, "Retry-After");
        h->value.len = ngx_sprintf(h->value.data, "%ui", retry_after)
                       - h->value.data;
    }

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


/*
 * nginx has no reason phrase for 422 (an empty slot in its table, up to
 * 1.31 at least): without one the status line would be "HTTP/1.1 422 ".
 * HTTP/2 and HTTP/3 send no status line and ignore it.
 */

void
ngx_http_idempotency_status_line(ngx_http_request_t *r)
{
    if (r->headers_out.status == NGX_HTTP_IDEMPOTENCY_UNPROCESSABLE) {
        ngx_str_set(&r->headers_out.status_line, "422 Unprocessable Entity");
    }
}
