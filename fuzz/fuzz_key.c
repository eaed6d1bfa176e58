/*
 * libFuzzer target: the Idempotency-Key header parser,
 * ngx_http_idempotency_key_parse() (src/ngx_http_idempotency_key.c).
 *
 * The input is a header value as nginx hands it over (any bytes).  Beyond
 * "no crash, no over-read" (ASan + UBSan) it checks:
 *
 *   1. the result is one of OK, EMPTY, LONG, BAD, and parsing is
 *      deterministic (a second parse gives the same result and bytes);
 *   2. OK: 1 <= decoded length <= input length and <= max_len; every byte
 *      is printable ASCII 0x20..0x7e; when the value (less surrounding
 *      spaces and tabs) does not start with '"' it is the bare form, whose
 *      key never holds a space and equals the trimmed input;
 *   3. max_len is exact: a key of n bytes is OK with max_len n and LONG
 *      with max_len n - 1;
 *   4. surrounding spaces and tabs change nothing;
 *   5. the key K decoded from anything re-encodes as an sf-string
 *      ("..." with \" and \\) that decodes to K again; and when K is also
 *      a valid bare token, the bare form decodes to K too - the quoted and
 *      bare forms of one key are the same key;
 *   6. an input that is itself a valid bare token (visible ASCII, not
 *      starting with '"', 1..255 bytes) is accepted as exactly itself.
 *
 * Every buffer is a heap block of the exact size, so ASan sees a read or
 * write one byte past it.
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ngx_http_idempotency_key.h"


#define MAX_LEN  255

#define check(cond)                                                          \
    do { if (!(cond)) { fuzz_fail(#cond, __LINE__); } } while (0)


static void
fuzz_fail(const char *what, int line)
{
    /* libFuzzer reports the abort and saves the input that caused it */
    fprintf(stderr, "fuzz_key.c:%d: property violated: %s\n", line, what);
    abort();
}


/* parses in[0 .. len - 1]; out gets a fresh block of exactly len bytes */

static int
parse(const unsigned char *in, size_t len, unsigned char **out,
    size_t *out_len, size_t max_len)
{
    int  rc;

    *out = malloc(len ? len : 1);
    check(*out != NULL);

    *out_len = (size_t) -1;

    rc = ngx_http_idempotency_key_parse(in, len, *out, out_len, max_len);

    check(rc == NGX_HTTP_IDEMPOTENCY_KEY_OK
          || rc == NGX_HTTP_IDEMPOTENCY_KEY_EMPTY
          || rc == NGX_HTTP_IDEMPOTENCY_KEY_LONG
          || rc == NGX_HTTP_IDEMPOTENCY_KEY_BAD);

    check(ngx_http_idempotency_key_error(rc) != NULL);

    if (rc == NGX_HTTP_IDEMPOTENCY_KEY_OK) {
        check(*out_len >= 1);
        check(*out_len <= len);
        check(*out_len <= max_len);
    }

    return rc;
}


/* a heap copy of exactly len bytes (malloc(0) has no byte to read) */

static unsigned char *
dup_exact(const unsigned char *p, size_t len)
{
    unsigned char  *d;

    d = malloc(len ? len : 1);
    check(d != NULL);

    if (len) {
        memcpy(d, p, len);
    }

    return d;
}


static int
is_bare_token(const unsigned char *p, size_t len)
{
    size_t  i;

    if (len == 0 || p[0] == '"') {
        return 0;
    }

    for (i = 0; i < len; i++) {
        if (p[i] <= 0x20 || p[i] >= 0x7f) {
            return 0;
        }
    }

    return 1;
}


/* "K" with \" and \\ escapes */

static unsigned char *
sf_quote(const unsigned char *k, size_t len, size_t *qlen)
{
    size_t          i, n;
    unsigned char  *q, *p;

    n = 2;
    for (i = 0; i < len; i++) {
        n += (k[i] == '"' || k[i] == '\\') ? 2 : 1;
    }

    q = malloc(n);
    check(q != NULL);

    p = q;
    *p++ = '"';
    for (i = 0; i < len; i++) {
        if (k[i] == '"' || k[i] == '\\') {
            *p++ = '\\';
        }
        *p++ = k[i];
    }
    *p++ = '"';

    *qlen = n;

    return q;
}


/* parse(in) must be OK and give exactly key[0 .. klen - 1] */

static void
expect_key(const unsigned char *in, size_t len, const unsigned char *key,
    size_t klen)
{
    int             rc;
    size_t          n;
    unsigned char  *c, *out;

    c = dup_exact(in, len);
    rc = parse(c, len, &out, &n, MAX_LEN);

    check(rc == NGX_HTTP_IDEMPOTENCY_KEY_OK);
    check(n == klen);
    check(memcmp(out, key, klen) == 0);

    free(out);
    free(c);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int                   rc, rc2;
    size_t                n, n2, i, qlen, plen;
    unsigned char        *out, *out2, *q, *padded;
    const unsigned char  *p, *end;

    rc = parse(data, size, &out, &n, MAX_LEN);

    /* 1. deterministic */

    rc2 = parse(data, size, &out2, &n2, MAX_LEN);
    check(rc2 == rc);
    if (rc == NGX_HTTP_IDEMPOTENCY_KEY_OK) {
        check(n2 == n);
        check(memcmp(out, out2, n) == 0);
    }
    free(out2);

    /* 4. surrounding spaces and tabs change nothing */

    plen = size + 4;
    padded = malloc(plen);
    check(padded != NULL);
    padded[0] = ' ';
    padded[1] = '\t';
    if (size) {
        memcpy(padded + 2, data, size);
    }
    padded[size + 2] = '\t';
    padded[size + 3] = ' ';

    rc2 = parse(padded, plen, &out2, &n2, MAX_LEN);
    check(rc2 == rc);
    if (rc == NGX_HTTP_IDEMPOTENCY_KEY_OK) {
        check(n2 == n);
        check(memcmp(out, out2, n) == 0);
    }
    free(out2);
    free(padded);

    /* 6. a valid bare token is itself */

    if (size <= MAX_LEN && is_bare_token(data, size)) {
        check(rc == NGX_HTTP_IDEMPOTENCY_KEY_OK);
        check(n == size);
        check(memcmp(out, data, size) == 0);
    }

    if (rc != NGX_HTTP_IDEMPOTENCY_KEY_OK) {
        free(out);
        return 0;
    }

    /* 2. printable ASCII; the bare form is the trimmed input, no space */

    for (i = 0; i < n; i++) {
        check(out[i] >= 0x20 && out[i] <= 0x7e);
    }

    p = data;
    end = data + size;
    while (p < end && (*p == ' ' || *p == '\t')) {
        p++;
    }
    while (end > p && (end[-1] == ' ' || end[-1] == '\t')) {
        end--;
    }
    check(p < end);

    if (*p != '"') {
        check((size_t) (end - p) == n);
        check(memcmp(out, p, n) == 0);
        for (i = 0; i < n; i++) {
            check(out[i] != ' ');
        }
    }

    /* 3. max_len is exact */

    rc2 = parse(data, size, &out2, &n2, n);
    check(rc2 == NGX_HTTP_IDEMPOTENCY_KEY_OK && n2 == n);
    free(out2);

    rc2 = parse(data, size, &out2, &n2, n - 1);
    check(rc2 == NGX_HTTP_IDEMPOTENCY_KEY_LONG);
    free(out2);

    /* 5. quoted and bare forms of the key are the same key */

    q = sf_quote(out, n, &qlen);
    expect_key(q, qlen, out, n);
    free(q);

    if (is_bare_token(out, n)) {
        expect_key(out, n, out, n);
    }

    free(out);

    return 0;
}
