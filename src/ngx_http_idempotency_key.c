/*
 * Idempotency-Key header syntax (IETF httpapi draft: an sf-string; the bare
 * form is what most clients send in practice).  Pure C (unit-tested in
 * t/unit).
 */

#include "ngx_http_idempotency_key.h"


int
ngx_http_idempotency_key_parse(const unsigned char *in, size_t len,
    unsigned char *out, size_t *out_len, size_t max_len)
{
    size_t                n;
    const unsigned char  *p, *end;

    p = in;
    end = in + len;

    while (p < end && (*p == ' ' || *p == '\t')) {
        p++;
    }

    while (end > p && (end[-1] == ' ' || end[-1] == '\t')) {
        end--;
    }

    if (p == end) {
        return NGX_HTTP_IDEMPOTENCY_KEY_EMPTY;
    }

    n = 0;

    if (*p != '"') {

        for ( /* void */ ; p < end; p++) {
            if (*p <= 0x20 || *p >= 0x7f) {
                return NGX_HTTP_IDEMPOTENCY_KEY_BAD;
            }

            out[n++] = *p;
        }

        goto done;
    }

    for (p++; p < end; p++) {

        if (*p == '"') {
            break;
        }

        if (*p < 0x20 || *p >= 0x7f) {
            return NGX_HTTP_IDEMPOTENCY_KEY_BAD;
        }

        if (*p == '\\') {
            p++;

            if (p == end || (*p != '"' && *p != '\\')) {
                return NGX_HTTP_IDEMPOTENCY_KEY_BAD;
            }
        }

        out[n++] = *p;
    }

    /* unterminated, or something after the closing quote */

    if (p == end || p + 1 != end) {
        return NGX_HTTP_IDEMPOTENCY_KEY_BAD;
    }

done:

    if (n == 0) {
        return NGX_HTTP_IDEMPOTENCY_KEY_EMPTY;
    }

    if (n > max_len) {
        return NGX_HTTP_IDEMPOTENCY_KEY_LONG;
    }

    *out_len = n;

    return NGX_HTTP_IDEMPOTENCY_KEY_OK;
}


const char *
ngx_http_idempotency_key_error(int rc)
{
    switch (rc) {

    case NGX_HTTP_IDEMPOTENCY_KEY_EMPTY:
        return "the key is empty";

    case NGX_HTTP_IDEMPOTENCY_KEY_LONG:
        return "the key is too long";

    case NGX_HTTP_IDEMPOTENCY_KEY_BAD:
        return "the key is not a quoted string or a run of visible "
               "ASCII characters";

    default:
        return "the key is valid";
    }
}
