/*
 * Unit tests of the stored-record encoding: first line, header lines.
 */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "ngx_http_idempotency_record.h"


static void
test_round_trip(void **state)
{
    unsigned char                          buf[256], *p;
    const unsigned char                   *pos;
    ngx_http_idempotency_record_header_t   h;

    (void) state;

    p = buf;
    p = ngx_http_idempotency_record_write_header(p,
            (const unsigned char *) "Content-Type", 12,
            (const unsigned char *) "application/json", 16);
    p = ngx_http_idempotency_record_write_header(p,
            (const unsigned char *) "X-Empty", 7,
            (const unsigned char *) "", 0);
    p = ngx_http_idempotency_record_write_header(p,
            (const unsigned char *) "Link", 4,
            (const unsigned char *) "<a>; rel=x: y", 13);

    assert_int_equal(p - buf,
                     ngx_http_idempotency_record_header_size(12, 16)
                     + ngx_http_idempotency_record_header_size(7, 0)
                     + ngx_http_idempotency_record_header_size(4, 13));

    pos = buf;

    assert_int_equal(ngx_http_idempotency_record_next_header(&pos, p, &h), 1);
    assert_memory_equal(h.name, "Content-Type", 12);
    assert_int_equal(h.value_len, 16);
    assert_memory_equal(h.value, "application/json", 16);

    assert_int_equal(ngx_http_idempotency_record_next_header(&pos, p, &h), 1);
    assert_int_equal(h.name_len, 7);
    assert_int_equal(h.value_len, 0);

    assert_int_equal(ngx_http_idempotency_record_next_header(&pos, p, &h), 1);
    assert_int_equal(h.name_len, 4);
    assert_memory_equal(h.value, "<a>; rel=x: y", 13);

    assert_int_equal(ngx_http_idempotency_record_next_header(&pos, p, &h), 0);
}


static void
test_corrupt(void **state)
{
    const char                            *bad[] = {
        "NoColon\r\n", ": novalue\r\n", "A: b", "A: b\n", "A:b\r\n",
        "A: b\r", "A: b\0c\r\n"
    };
    size_t                                 i, len;
    const unsigned char                   *pos;
    ngx_http_idempotency_record_header_t   h;

    (void) state;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        len = strlen(bad[i]);
        if (i == 6) {
            len = 9;
        }

        pos = (const unsigned char *) bad[i];
        assert_int_equal(ngx_http_idempotency_record_next_header(&pos,
                                                     pos + len, &h), -1);
    }
}


static void
test_status(void **state)
{
    (void) state;

    assert_int_equal(ngx_http_idempotency_record_status(
                         (const unsigned char *) "201", 3), 201);
    assert_int_equal(ngx_http_idempotency_record_status(
                         (const unsigned char *) "599", 3), 599);
    assert_int_equal(ngx_http_idempotency_record_status(
                         (const unsigned char *) "099", 3), -1);
    assert_int_equal(ngx_http_idempotency_record_status(
                         (const unsigned char *) "20", 2), -1);
    assert_int_equal(ngx_http_idempotency_record_status(
                         (const unsigned char *) "2x0", 3), -1);
    assert_int_equal(ngx_http_idempotency_record_status(
                         (const unsigned char *) "600", 3), -1);
}


#define FP     "0123456789abcdef0123456789abcdef" \
               "0123456789abcdef0123456789abcdef"
#define OWNER  "00112233445566778899aabbccddeeff00000001"


/*
 * A heap block of the exact size, so that ASan sees any over-read; the
 * reader of known records (the node's cache) reads the same block, never
 * past it either, and finds the same fields in every record parse takes
 */

static int
parse_exact(const char *text, size_t len, ngx_http_idempotency_record_t *rec)
{
    int                            rc, known;
    unsigned char                 *p;
    ngx_http_idempotency_record_t  k;

    p = malloc(len ? len : 1);
    assert_non_null(p);
    memcpy(p, text, len);

    /* zeroed first, padding included: every field is compared */
    memset(&k, 0, sizeof(k));
    memset(rec, 0, sizeof(*rec));

    known = ngx_http_idempotency_record_parse_known(p, len, &k);
    rc = ngx_http_idempotency_record_parse(p, len, rec);

    if (rc == 0) {
        assert_int_equal(known, 0);
        assert_memory_equal(&k, rec, sizeof(k));
    }

    if (rc == 0) {
        /* what it points to lies inside the block */
        assert_true(rec->fp >= p && rec->fp + rec->fp_len <= p + len);
        assert_true(rec->owner >= p
                    && rec->owner + rec->owner_len <= p + len);
        assert_true(rec->headers >= p
                    && rec->headers + rec->headers_len <= p + len);
        assert_true(rec->body >= p && rec->body + rec->body_len == p + len);
    }

    free(p);

    return rc;
}


static void
test_record_round_trip(void **state)
{
    unsigned char                  buf[512], *p;
    ngx_http_idempotency_record_t  rec;

    (void) state;

    p = ngx_http_idempotency_record_write_head(buf,
            NGX_HTTP_IDEMPOTENCY_RECORD_DONE,
            (const unsigned char *) FP, 64,
            (const unsigned char *) OWNER, 40, 1764500000ULL, 201);

    assert_true((size_t) (p - buf)
                <= NGX_HTTP_IDEMPOTENCY_RECORD_HEAD_MAX(64, 40));
    assert_memory_equal(buf, "idem1 done " FP " " OWNER " 1764500000 201\r\n",
                        p - buf);

    p = ngx_http_idempotency_record_write_header(p,
            (const unsigned char *) "Content-Type", 12,
            (const unsigned char *) "application/json", 16);
    memcpy(p, "\r\n{\"id\":1}\r\n\r\n", 14);
    p += 14;

    assert_int_equal(ngx_http_idempotency_record_parse(buf, p - buf, &rec),
                     0);
    assert_int_equal(rec.state, NGX_HTTP_IDEMPOTENCY_RECORD_DONE);
    assert_int_equal(rec.status, 201);
    assert_int_equal(rec.fp_len, 64);
    assert_memory_equal(rec.fp, FP, 64);
    assert_int_equal(rec.owner_len, 40);
    assert_memory_equal(rec.owner, OWNER, 40);
    assert_int_equal(rec.created_len, 10);
    assert_memory_equal(rec.created, "1764500000", 10);
    assert_int_equal(rec.headers_len, 32);
    assert_memory_equal(rec.headers, "Content-Type: application/json\r\n",
                        32);

    /* a body may hold anything, an empty line included */
    assert_int_equal(rec.body_len, 12);
    assert_memory_equal(rec.body, "{\"id\":1}\r\n\r\n", 12);

    /* in flight: status 000, no headers, no body */

    p = ngx_http_idempotency_record_write_head(buf,
            NGX_HTTP_IDEMPOTENCY_RECORD_INFLIGHT,
            (const unsigned char *) FP, 64,
            (const unsigned char *) OWNER, 40, 0, 0);
    *p++ = '\r';
    *p++ = '\n';

    assert_memory_equal(buf, "idem1 inflight " FP " " OWNER " 0 000\r\n\r\n",
                        p - buf);
    assert_int_equal(ngx_http_idempotency_record_parse(buf, p - buf, &rec),
                     0);
    assert_int_equal(rec.state, NGX_HTTP_IDEMPOTENCY_RECORD_INFLIGHT);
    assert_int_equal(rec.status, 0);
    assert_int_equal(rec.headers_len, 0);
    assert_int_equal(rec.body_len, 0);

    p = ngx_http_idempotency_record_write_head(buf,
            NGX_HTTP_IDEMPOTENCY_RECORD_OVERSIZE,
            (const unsigned char *) FP, 64,
            (const unsigned char *) OWNER, 40, 18446744073709551615ULL, 200);
    *p++ = '\r';
    *p++ = '\n';

    assert_true((size_t) (p - buf)
                <= NGX_HTTP_IDEMPOTENCY_RECORD_HEAD_MAX(64, 40) + 2);
    assert_int_equal(ngx_http_idempotency_record_parse(buf, p - buf, &rec),
                     0);
    assert_int_equal(rec.state, NGX_HTTP_IDEMPOTENCY_RECORD_OVERSIZE);
    assert_int_equal(rec.status, 200);
    assert_int_equal(rec.created_len, 20);

    /* unknown and split: states of their own, read back as written */

    assert_int_not_equal(NGX_HTTP_IDEMPOTENCY_RECORD_UNKNOWN,
                         NGX_HTTP_IDEMPOTENCY_RECORD_SPLIT);

    p = ngx_http_idempotency_record_write_head(buf,
            NGX_HTTP_IDEMPOTENCY_RECORD_UNKNOWN,
            (const unsigned char *) FP, 64,
            (const unsigned char *) OWNER, 40, 1, 502);
    *p++ = '\r';
    *p++ = '\n';

    assert_int_equal(ngx_http_idempotency_record_parse(buf, p - buf, &rec),
                     0);
    assert_int_equal(rec.state, NGX_HTTP_IDEMPOTENCY_RECORD_UNKNOWN);
    assert_int_equal(rec.status, 502);

    p = ngx_http_idempotency_record_write_head(buf,
            NGX_HTTP_IDEMPOTENCY_RECORD_SPLIT,
            (const unsigned char *) FP, 64,
            (const unsigned char *) OWNER, 40, 1, 200);
    memcpy(p, "\r\n20000", 7);
    p += 7;

    assert_int_equal(ngx_http_idempotency_record_parse(buf, p - buf, &rec),
                     0);
    assert_int_equal(rec.state, NGX_HTTP_IDEMPOTENCY_RECORD_SPLIT);
    assert_int_equal(rec.status, 200);
    assert_int_equal(rec.body_len, 5);
    assert_memory_equal(rec.body, "20000", 5);
}


static void
test_record_truncated(void **state)
{
    size_t                          len, cut;
    const char                     *text;
    ngx_http_idempotency_record_t   rec;

    (void) state;

    text = "idem1 done " FP " " OWNER " 1764500000 200\r\n"
           "A: b\r\nC: d\r\n\r\n";
    len = strlen(text);

    assert_int_equal(parse_exact(text, len, &rec), 0);
    assert_int_equal(rec.body_len, 0);

    /* cut anywhere before the empty line: refused */

    for (cut = 0; cut < len; cut++) {
        assert_int_equal(parse_exact(text, cut, &rec), -1);
    }
}


static void
test_record_hostile(void **state)
{
    size_t                          i;
    ngx_http_idempotency_record_t   rec;
    const char                     *bad[] = {
        "",
        "idem1",
        "idem2 done " FP " " OWNER " 1 200\r\n\r\n",
        "IDEM1 done " FP " " OWNER " 1 200\r\n\r\n",
        "idem1 gone " FP " " OWNER " 1 200\r\n\r\n",
        "idem1 donee " FP " " OWNER " 1 200\r\n\r\n",
        "idem1 done  " FP " " OWNER " 1 200\r\n\r\n",
        "idem1 done " FP "  " OWNER " 1 200\r\n\r\n",
        "idem1 done " FP " " OWNER "  1 200\r\n\r\n",
        "idem1 done " FP " " OWNER " 1  200\r\n\r\n",
        "idem1 done " "0123456789ABCDEF" " " OWNER " 1 200\r\n\r\n",
        "idem1 done " FP " " OWNER " -1 200\r\n\r\n",
        "idem1 done " FP " " OWNER " 123456789012345678901 200\r\n\r\n",
        "idem1 done " FP " " OWNER " 1 099\r\n\r\n",
        "idem1 done " FP " " OWNER " 1 600\r\n\r\n",
        "idem1 done " FP " " OWNER " 1 700\r\n\r\n",
        "idem1 done " FP " " OWNER " 1 100\r\n\r\n",
        "idem1 done " FP " " OWNER " 1 101\r\n\r\n",
        "idem1 done " FP " " OWNER " 1 199\r\n\r\n",
        "idem1 oversize " FP " " OWNER " 1 103\r\n\r\n",
        "idem1 done " FP " " OWNER " 1 000\r\n\r\n",
        "idem1 done " FP " " OWNER " 1 20\r\n\r\n",
        "idem1 done " FP " " OWNER " 1 2000\r\n\r\n",
        "idem1 done " FP " " OWNER " 1 200\n\r\n",
        "idem1 done " FP " " OWNER " 1 200\r\n\n",
        "idem1 done " FP " " OWNER " 1 200\r\nA: b\r\n",
        "idem1 done " FP " " OWNER " 1 200\r\nA: b\r\n\r",
        "idem1 inflight " FP " " OWNER " 1 200\r\n\r\n",
        "idem1 inflight " FP " " OWNER " 1 000",
        "idem1 inflight " FP " " OWNER,
    };

    (void) state;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(parse_exact(bad[i], strlen(bad[i]), &rec), -1);
    }

    /* a field of 128 hex digits is read, one of 129 is not */

    {
        char  text[400];

        memset(text, 0, sizeof(text));
        strcpy(text, "idem1 inflight ");
        memset(text + strlen(text), 'a', 128);
        strcat(text, " b 1 000\r\n\r\n");

        assert_int_equal(parse_exact(text, strlen(text), &rec), 0);
        assert_int_equal(rec.fp_len, 128);

        memset(text, 0, sizeof(text));
        strcpy(text, "idem1 inflight ");
        memset(text + strlen(text), 'a', 129);
        strcat(text, " b 1 000\r\n\r\n");

        assert_int_equal(parse_exact(text, strlen(text), &rec), -1);
    }

    /* a NUL inside the first line */

    assert_int_equal(parse_exact("idem1 done a\0 b 1 200\r\n\r\n", 25, &rec),
                     -1);
}


/* validate() on a done record with these header lines */
static int
validate_headers(const char *headers, const char **reason)
{
    int                             rc;
    char                            text[512];
    ngx_http_idempotency_record_t   rec;

    snprintf(text, sizeof(text),
             "idem1 done " FP " " OWNER " 1 200\r\n%s\r\nbody", headers);

    assert_int_equal(ngx_http_idempotency_record_parse(
                         (const unsigned char *) text, strlen(text), &rec),
                     0);

    rc = ngx_http_idempotency_record_validate(&rec, reason);

    return rc;
}


static void
test_validate(void **state)
{
    size_t                          i;
    const char                     *reason;
    ngx_http_idempotency_record_t   rec;
    const char                     *good[] = {
        "",
        "Content-Type: application/json\r\n",
        "X-Empty: \r\nLink: <a>; rel=x: y\r\n",
        "X-Tab: a\tb\r\n",
        "X-Utf8: caf\xc3\xa9\r\n",
        "!#$%&'*+-.^_`|~09azAZ: v\r\n",
        "Content-Type: application/grpc\r\n@grpc-status: 0\r\n",
        "@grpc-message: \r\n",
    };
    const char                     *bad[] = {
        "Bad Name: v\r\n",
        "Bad\"Name: v\r\n",
        "(x): v\r\n",
        "X-Bell: a\x07" "b\r\n",
        "X-Del: a\x7f\r\n",
        "X-Esc: \x1b[31m\r\n",
        "X-Ok: v\r\nX\x01: v\r\n",
        "@: v\r\n",
        "@@x: v\r\n",
        "@Bad Name: v\r\n",
        "x@y: v\r\n",
    };

    (void) state;

    for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        reason = NULL;
        assert_int_equal(validate_headers(good[i], &reason), 0);
    }

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        reason = NULL;
        assert_int_equal(validate_headers(bad[i], &reason), -1);
        assert_non_null(reason);
    }

    /* a status out of the final range, whatever parse() let through */

    memset(&rec, 0, sizeof(rec));

    rec.status = 101;
    assert_int_equal(ngx_http_idempotency_record_validate(&rec, &reason), -1);
    rec.status = 700;
    assert_int_equal(ngx_http_idempotency_record_validate(&rec, &reason), -1);
    rec.status = 0;
    assert_int_equal(ngx_http_idempotency_record_validate(&rec, &reason), -1);
    rec.status = 200;
    assert_int_equal(ngx_http_idempotency_record_validate(&rec, &reason), 0);
    rec.status = 599;
    assert_int_equal(ngx_http_idempotency_record_validate(&rec, &reason), 0);
}


static void
test_replayable(void **state)
{
    size_t        i;
    const char   *never[] = {
        "Connection", "connection", "KEEP-ALIVE", "Proxy-Authenticate",
        "Proxy-Authorization", "Proxy-Connection", "TE", "te", "Trailer",
        "Transfer-Encoding", "transfer-encoding", "Upgrade", "Date",
        "Server", "Content-Length", "content-length",
        "Idempotent-Replayed", "idempotent-replayed"
    };
    const char   *ok[] = {
        "Content-Type", "Location", "ETag", "Set-Cookie", "X-Order",
        "Dates", "Serve", "Content-Length2", "T", "TEA", ""
    };

    (void) state;

    for (i = 0; i < sizeof(never) / sizeof(never[0]); i++) {
        assert_int_equal(ngx_http_idempotency_record_header_replayable(
                             (const unsigned char *) never[i],
                             strlen(never[i])),
                         0);
    }

    for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        assert_int_equal(ngx_http_idempotency_record_header_replayable(
                             (const unsigned char *) ok[i], strlen(ok[i])),
                         1);
    }
}


int
main(void)
{
    const struct CMUnitTest  tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_status),
        cmocka_unit_test(test_record_round_trip),
        cmocka_unit_test(test_record_truncated),
        cmocka_unit_test(test_record_hostile),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_replayable),
    };

    return cmocka_run_group_tests_name("record", tests, NULL, NULL);
}
