/*
 * Unit tests of the stored-response header encoding.
 */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
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


int
main(void)
{
    const struct CMUnitTest  tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_status),
    };

    return cmocka_run_group_tests_name("record", tests, NULL, NULL);
}
