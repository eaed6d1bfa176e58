/*
 * Idempotency-Key header syntax: a Structured Field string or a bare token.
 * Pure C with no nginx dependency, so that unit tests can link it alone.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_KEY_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_KEY_H_INCLUDED_


#include <stddef.h>


#define NGX_HTTP_IDEMPOTENCY_KEY_OK        0
#define NGX_HTTP_IDEMPOTENCY_KEY_EMPTY    -1
#define NGX_HTTP_IDEMPOTENCY_KEY_LONG     -2
#define NGX_HTTP_IDEMPOTENCY_KEY_BAD      -3


/*
 * Decodes the header value in[0 .. len - 1] into out (room for len bytes)
 * and sets *out_len.  Accepts "..." with \" and \\ escapes (printable ASCII
 * inside) and the bare form (visible ASCII, not starting with a quote);
 * both give the same key.  Surrounding spaces and tabs are ignored.  A key
 * must be 1 to max_len characters after decoding.
 */
int ngx_http_idempotency_key_parse(const unsigned char *in, size_t len,
    unsigned char *out, size_t *out_len, size_t max_len);

const char *ngx_http_idempotency_key_error(int rc);


#endif /* _NGX_HTTP_IDEMPOTENCY_KEY_H_INCLUDED_ */
