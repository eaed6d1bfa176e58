/*
 * libFuzzer target: the stored-record decoder (src/ngx_http_idempotency_record.c).
 * What Redis hands back is input too: a record truncated, edited with
 * redis-cli or written by something else must give an error, never a crash
 * or a read past its end (ASan + UBSan).
 *
 * One input is read four ways:
 *
 *   headers  the input is a record's "headers" field.  Reading it with
 *            ngx_http_idempotency_record_next_header() until 0 or -1:
 *            every header lies inside the input, has a non-empty name
 *            without ':', CR, LF or NUL, a value without CR, LF or NUL, is
 *            "name: value\r\n" exactly, and moves the position forward; -1
 *            leaves the position where it was.  A list read to the end
 *            (0) is canonical: writing its headers back with
 *            ngx_http_idempotency_record_write_header() gives the same
 *            bytes.  Cut anywhere, such a list reads the complete lines
 *            before the cut and then ends (cut at a line end) or fails.
 *
 *   round trip  the first byte is a name length k; name = the next k
 *            bytes, value = the rest, with ':' CR LF NUL in the name and
 *            CR LF NUL in the value replaced (the writer's contract).  Two
 *            such headers written with write_header() read back with
 *            next_header() as the same names and values, then 0.
 *
 *   status   ngx_http_idempotency_record_status() on the input and on its
 *            first three bytes agrees with a reference: exactly three
 *            digits, 100 to 599.
 *
 *   record   ngx_http_idempotency_record_parse() on the input: an error,
 *            or a record whose every field lies inside the input - the
 *            state one of five, fingerprint and owner of 1 to 128
 *            lowercase hex digits, created of 1 to 20 digits, the status
 *            000 exactly while in flight and 200 to 599 otherwise (an
 *            interim 1xx response is never a record), the
 *            header lines (empty, or ending with CR LF) right before the
 *            empty line and the body running to the end.  Its first line
 *            written back with ngx_http_idempotency_record_write_head() is
 *            byte-identical (when created has no leading zero).  Cut inside
 *            the first line, the header lines or the empty line, it is
 *            refused; cut inside the body, it reads the same with a shorter
 *            body.
 *
 * Every buffer handed to the decoder is a heap block of the exact size.
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ngx_http_idempotency_record.h"


#define check(cond)                                                          \
    do { if (!(cond)) { fuzz_fail(#cond, __LINE__); } } while (0)


typedef ngx_http_idempotency_record_header_t  header_t;


static void
fuzz_fail(const char *what, int line)
{
    fprintf(stderr, "fuzz_record.c:%d: property violated: %s\n", line, what);
    abort();
}


static size_t
max_headers(size_t len)
{
    return len / 5 + 1;
}


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
has_byte(const unsigned char *p, size_t len, const char *set, size_t n)
{
    size_t  i;

    for (i = 0; i < len; i++) {
        if (memchr(set, p[i], n) != NULL) {
            return 1;
        }
    }

    return 0;
}


/*
 * Reads buf[0 .. len - 1] to the end or the first error, checking each
 * step; returns the last next_header() result, fills hs[] and *nh.  A
 * header takes 5 bytes at least ("N: \r\n"): hs[] has room for
 * max_headers(len).
 */

static int
read_all(const unsigned char *buf, size_t len, header_t *hs, size_t *nh)
{
    int                   rc;
    size_t                k;
    header_t              h;
    const unsigned char  *pos, *old, *end;

    pos = buf;
    end = buf + len;
    k = 0;

    for ( ;; ) {
        old = pos;
        memset(&h, 0, sizeof(h));

        rc = ngx_http_idempotency_record_next_header(&pos, end, &h);

        check(rc == 1 || rc == 0 || rc == -1);

        if (rc == 0) {
            check(old == end && pos == end);
            break;
        }

        if (rc == -1) {
            check(pos == old && old < end);
            break;
        }

        /* "name: value\r\n", all of it inside [old, end) */

        check(h.name == old);
        check(h.name_len >= 1);
        check(h.value == h.name + h.name_len + 2);
        check(h.value + h.value_len + 2 == pos);
        check(pos > old && pos <= end);
        check(h.name[h.name_len] == ':' && h.name[h.name_len + 1] == ' ');
        check(h.value[h.value_len] == '\r' && h.value[h.value_len + 1] == '\n');
        check(!has_byte(h.name, h.name_len, ":\r\n\0", 4));
        check(!has_byte(h.value, h.value_len, "\r\n\0", 3));

        check(k < max_headers(len));
        hs[k++] = h;
    }

    *nh = k;

    return rc;
}


static void
fuzz_headers(const uint8_t *data, size_t size)
{
    int             rc, rc2;
    size_t          nh, nh2, i, len, cut, cuts[2], lines;
    header_t       *hs, *hs2;
    unsigned char  *buf, *enc, *p;

    hs = malloc(max_headers(size) * sizeof(header_t));
    hs2 = malloc(max_headers(size) * sizeof(header_t));
    check(hs != NULL && hs2 != NULL);

    buf = dup_exact(data, size);

    rc = read_all(buf, size, hs, &nh);

    /* deterministic */

    rc2 = read_all(buf, size, hs2, &nh2);
    check(rc2 == rc && nh2 == nh);
    check(memcmp(hs, hs2, nh * sizeof(header_t)) == 0);

    if (rc != 0) {
        goto done;
    }

    /* a list read to its end is canonical: written back, it is the same */

    len = 0;
    for (i = 0; i < nh; i++) {
        len += ngx_http_idempotency_record_header_size(hs[i].name_len,
                                                       hs[i].value_len);
    }
    check(len == size);

    enc = malloc(len ? len : 1);
    check(enc != NULL);

    p = enc;
    for (i = 0; i < nh; i++) {
        p = ngx_http_idempotency_record_write_header(p, hs[i].name,
                 hs[i].name_len, hs[i].value, hs[i].value_len);
    }
    check((size_t) (p - enc) == len);
    check(len == 0 || memcmp(enc, buf, len) == 0);
    free(enc);

    /* cut short: the complete lines before the cut, then 0 or -1 */

    cuts[0] = size ? size - 1 : 0;
    cuts[1] = size / 2;

    for (i = 0; i < 2; i++) {
        cut = cuts[i];
        if (cut == 0 || cut >= size) {
            continue;
        }

        p = dup_exact(buf, cut);

        /* lines of the full list that end at or before the cut */
        for (lines = 0; lines < nh; lines++) {
            if ((size_t) (hs[lines].value + hs[lines].value_len + 2 - buf)
                > cut)
            {
                break;
            }
        }

        rc2 = read_all(p, cut, hs2, &nh2);

        check(nh2 == lines);

        if (lines > 0
            && (size_t) (hs[lines - 1].value + hs[lines - 1].value_len + 2
                         - buf) == cut)
        {
            check(rc2 == 0);
        } else {
            check(rc2 == -1);
        }

        free(p);
    }

done:

    free(buf);
    free(hs2);
    free(hs);
}


static void
clean(unsigned char *p, size_t len, const char *bad, size_t n)
{
    size_t  i;

    for (i = 0; i < len; i++) {
        if (memchr(bad, p[i], n) != NULL) {
            p[i] ^= 0x40;       /* ':' -> 'z', CR -> 'M', LF -> 'J', NUL -> '@' */
        }
    }
}


static void
fuzz_round_trip(const uint8_t *data, size_t size)
{
    size_t          k, vlen, len, nh;
    header_t       *hs;
    unsigned char  *name, *value, *buf, *p;

    if (size < 2) {
        return;
    }

    k = data[0];
    if (k == 0 || k > size - 1) {
        k = size - 1;
    }

    name = dup_exact(data + 1, k);
    vlen = size - 1 - k;
    value = dup_exact(data + 1 + k, vlen);

    clean(name, k, ":\r\n\0", 4);
    clean(value, vlen, "\r\n\0", 3);

    len = ngx_http_idempotency_record_header_size(k, vlen);
    check(len == k + vlen + 4);

    buf = malloc(2 * len);
    check(buf != NULL);

    p = ngx_http_idempotency_record_write_header(buf, name, k, value, vlen);
    check((size_t) (p - buf) == len);

    /* the value first, as a name, when it can be one */

    if (vlen > 0 && memchr(value, ':', vlen) == NULL) {
        p = ngx_http_idempotency_record_write_header(p, value, vlen, name, k);
    } else {
        p = ngx_http_idempotency_record_write_header(p, name, k, value, vlen);
    }
    check((size_t) (p - buf) == 2 * len);

    hs = malloc(max_headers(2 * len) * sizeof(header_t));
    check(hs != NULL);

    check(read_all(buf, 2 * len, hs, &nh) == 0);
    check(nh == 2);

    check(hs[0].name_len == k && memcmp(hs[0].name, name, k) == 0);
    check(hs[0].value_len == vlen
          && (vlen == 0 || memcmp(hs[0].value, value, vlen) == 0));

    if (vlen > 0 && memchr(value, ':', vlen) == NULL) {
        check(hs[1].name_len == vlen && memcmp(hs[1].name, value, vlen) == 0);
        check(hs[1].value_len == k && memcmp(hs[1].value, name, k) == 0);
    } else {
        check(hs[1].name_len == k && memcmp(hs[1].name, name, k) == 0);
        check(hs[1].value_len == vlen
              && (vlen == 0 || memcmp(hs[1].value, value, vlen) == 0));
    }

    free(hs);
    free(buf);
    free(value);
    free(name);
}


static int
status_ref(const unsigned char *p, size_t len)
{
    if (len != 3) {
        return -1;
    }

    if (p[0] < '0' || p[0] > '9' || p[1] < '0' || p[1] > '9'
        || p[2] < '0' || p[2] > '9')
    {
        return -1;
    }

    len = (p[0] - '0') * 100 + (p[1] - '0') * 10 + (p[2] - '0');

    return (len >= 100 && len <= 599) ? (int) len : -1;
}


static void
fuzz_status(const uint8_t *data, size_t size)
{
    size_t          n;
    unsigned char  *p;

    p = dup_exact(data, size);
    check(ngx_http_idempotency_record_status(p, size) == status_ref(p, size));
    free(p);

    n = size < 3 ? size : 3;
    p = dup_exact(data, n);
    check(ngx_http_idempotency_record_status(p, n) == status_ref(p, n));
    free(p);
}


static int
all_of(const unsigned char *p, size_t len, int hex)
{
    size_t  i;

    for (i = 0; i < len; i++) {
        if (!((p[i] >= '0' && p[i] <= '9')
              || (hex && p[i] >= 'a' && p[i] <= 'f')))
        {
            return 0;
        }
    }

    return 1;
}


/*
 * a reference for ngx_http_idempotency_record_validate(): a name is a
 * token, or "@" and a token (a trailer, sent after the body)
 */

static int
validate_ref(const ngx_http_idempotency_record_t *rec)
{
    int                   rc;
    size_t                i;
    header_t              h;
    const unsigned char  *p, *end;

    if (rec->status < 200 || rec->status > 599) {
        return -1;
    }

    p = rec->headers;
    end = p + rec->headers_len;

    while ((rc = ngx_http_idempotency_record_next_header(&p, end, &h)) == 1) {
        i = (h.name_len > 0 && h.name[0] == '@');

        if (i == h.name_len) {
            return -1;
        }

        for ( /* void */ ; i < h.name_len; i++) {
            if (!((h.name[i] >= '0' && h.name[i] <= '9')
                  || (h.name[i] >= 'a' && h.name[i] <= 'z')
                  || (h.name[i] >= 'A' && h.name[i] <= 'Z')
                  || memchr("!#$%&'*+-.^_`|~", h.name[i], 15) != NULL))
            {
                return -1;
            }
        }

        for (i = 0; i < h.value_len; i++) {
            if ((h.value[i] < 0x20 && h.value[i] != '\t')
                || h.value[i] == 0x7f)
            {
                return -1;
            }
        }
    }

    return rc == 0 ? 0 : -1;
}


static void
fuzz_record(const uint8_t *data, size_t size)
{
    int                             rc;
    const char                     *reason;
    size_t                          i, hlen, cut, cuts[3];
    unsigned char                  *buf, *p, *head;
    unsigned long long              created;
    ngx_http_idempotency_record_t   rec, rec2;

    buf = dup_exact(data, size);

    memset(&rec, 0, sizeof(rec));
    rc = ngx_http_idempotency_record_parse(buf, size, &rec);

    check(rc == 0 || rc == -1);

    if (rc == -1) {
        free(buf);
        return;
    }

    check(rec.state == NGX_HTTP_IDEMPOTENCY_RECORD_INFLIGHT
          || rec.state == NGX_HTTP_IDEMPOTENCY_RECORD_DONE
          || rec.state == NGX_HTTP_IDEMPOTENCY_RECORD_OVERSIZE
          || rec.state == NGX_HTTP_IDEMPOTENCY_RECORD_UNKNOWN
          || rec.state == NGX_HTTP_IDEMPOTENCY_RECORD_SPLIT);

    check(rec.fp > buf && rec.fp_len >= 1
          && rec.fp_len <= NGX_HTTP_IDEMPOTENCY_RECORD_TOKEN_MAX);
    check(all_of(rec.fp, rec.fp_len, 1));
    check(rec.owner == rec.fp + rec.fp_len + 1 && rec.owner_len >= 1
          && rec.owner_len <= NGX_HTTP_IDEMPOTENCY_RECORD_TOKEN_MAX);
    check(all_of(rec.owner, rec.owner_len, 1));
    check(rec.created == rec.owner + rec.owner_len + 1
          && rec.created_len >= 1 && rec.created_len <= 20);
    check(all_of(rec.created, rec.created_len, 0));

    if (rec.state == NGX_HTTP_IDEMPOTENCY_RECORD_INFLIGHT) {
        check(rec.status == 0);
    } else {
        check(rec.status >= 200 && rec.status <= 599);
    }

    /*
     * validate(): 0 exactly when the header lines read to their end with
     * token names (or "@" and a token: a trailer) and values without
     * control bytes but HTAB
     */

    check(ngx_http_idempotency_record_validate(&rec, &reason)
          == validate_ref(&rec));

    check(rec.headers == rec.created + rec.created_len + 6);
    check(rec.headers_len == 0
          || (rec.headers_len >= 2
              && rec.headers[rec.headers_len - 2] == '\r'
              && rec.headers[rec.headers_len - 1] == '\n'));
    check(rec.body == rec.headers + rec.headers_len + 2);
    check(rec.body[-2] == '\r' && rec.body[-1] == '\n');
    check(rec.body + rec.body_len == buf + size);

    /* the first line, written back */

    hlen = rec.headers - buf;

    if (rec.created_len <= 19
        && (rec.created_len == 1 || rec.created[0] != '0'))
    {
        created = 0;
        for (i = 0; i < rec.created_len; i++) {
            created = created * 10 + (rec.created[i] - '0');
        }

        head = malloc(NGX_HTTP_IDEMPOTENCY_RECORD_HEAD_MAX(rec.fp_len,
                                                           rec.owner_len));
        check(head != NULL);

        p = ngx_http_idempotency_record_write_head(head, rec.state, rec.fp,
                                                   rec.fp_len, rec.owner,
                                                   rec.owner_len, created,
                                                   rec.status);
        check((size_t) (p - head) == hlen);
        check(hlen <= NGX_HTTP_IDEMPOTENCY_RECORD_HEAD_MAX(rec.fp_len,
                                                           rec.owner_len));
        check(memcmp(head, buf, hlen) == 0);
        free(head);
    }

    /* cut short */

    cuts[0] = (size_t) (rec.body - buf) - 1;  /* inside the empty line */
    cuts[1] = size / 2;
    cuts[2] = hlen - 1;                        /* inside the first line */

    for (i = 0; i < 3; i++) {
        cut = cuts[i];

        p = dup_exact(buf, cut);
        memset(&rec2, 0, sizeof(rec2));
        rc = ngx_http_idempotency_record_parse(p, cut, &rec2);

        if (cut < (size_t) (rec.body - buf)) {
            check(rc == -1);

        } else {
            check(rc == 0);
            check(rec2.state == rec.state && rec2.status == rec.status);
            check(rec2.headers_len == rec.headers_len);
            check(rec2.body - p == rec.body - buf);
            check(rec2.body_len == cut - (size_t) (rec.body - buf));
        }

        free(p);
    }

    free(buf);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_headers(data, size);
    fuzz_round_trip(data, size);
    fuzz_status(data, size);
    fuzz_record(data, size);

    return 0;
}
