/*
 * Unit tests of the Idempotency-Key header syntax.
 */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <string.h>
#include <cmocka.h>

#include "ngx_http_idempotency_key.h"


static int
parse(const char *in, char *out, size_t max_len)
{
    int     rc;
    size_t  n;

    n = 0;
    rc = ngx_http_idempotency_key_parse((const unsigned char *) in,
                                        strlen(in), (unsigned char *) out,
                                        &n, max_len);
    out[rc == NGX_HTTP_IDEMPOTENCY_KEY_OK ? n : 0] = '\0';

    return rc;
}


static void
test_bare_token(void **state)
{
    char  out[300];

    (void) state;

    assert_int_equal(parse("order:8812:shipped", out, 255), 0);
    assert_string_equal(out, "order:8812:shipped");

    assert_int_equal(parse("8e03978e-40d5-43e8-bc93-6894a57f9324", out, 255),
                     0);
    assert_string_equal(out, "8e03978e-40d5-43e8-bc93-6894a57f9324");
}


static void
test_sf_string_maps_to_same_key(void **state)
{
    char  out[300];

    (void) state;

    assert_int_equal(parse("\"order:8812:shipped\"", out, 255), 0);
    assert_string_equal(out, "order:8812:shipped");
}


static void
test_sf_string_escapes(void **state)
{
    char  out[300];

    (void) state;

    assert_int_equal(parse("\"a\\\"b\\\\c d\"", out, 255), 0);
    assert_string_equal(out, "a\"b\\c d");
}


static void
test_surrounding_whitespace_ignored(void **state)
{
    char  out[300];

    (void) state;

    assert_int_equal(parse(" \tabc\t ", out, 255), 0);
    assert_string_equal(out, "abc");
}


static void
test_invalid_forms(void **state)
{
    char  out[300];

    (void) state;

    assert_int_equal(parse("", out, 255), NGX_HTTP_IDEMPOTENCY_KEY_EMPTY);
    assert_int_equal(parse("   ", out, 255), NGX_HTTP_IDEMPOTENCY_KEY_EMPTY);
    assert_int_equal(parse("\"\"", out, 255), NGX_HTTP_IDEMPOTENCY_KEY_EMPTY);
    assert_int_equal(parse("\"abc", out, 255), NGX_HTTP_IDEMPOTENCY_KEY_BAD);
    assert_int_equal(parse("\"abc\"x", out, 255),
                     NGX_HTTP_IDEMPOTENCY_KEY_BAD);
    assert_int_equal(parse("\"a\\x\"", out, 255),
                     NGX_HTTP_IDEMPOTENCY_KEY_BAD);
    assert_int_equal(parse("\"a\\\"", out, 255),
                     NGX_HTTP_IDEMPOTENCY_KEY_BAD);
    assert_int_equal(parse("a b", out, 255), NGX_HTTP_IDEMPOTENCY_KEY_BAD);
    assert_int_equal(parse("a\x01" "b", out, 255),
                     NGX_HTTP_IDEMPOTENCY_KEY_BAD);
    assert_int_equal(parse("\"a\tb\"", out, 255),
                     NGX_HTTP_IDEMPOTENCY_KEY_BAD);
    assert_int_equal(parse("caf\xc3\xa9", out, 255),
                     NGX_HTTP_IDEMPOTENCY_KEY_BAD);
}


static void
test_length_limit(void **state)
{
    char  in[300], out[300];

    (void) state;

    memset(in, 'k', 255);
    in[255] = '\0';
    assert_int_equal(parse(in, out, 255), 0);
    assert_int_equal(strlen(out), 255);

    memset(in, 'k', 256);
    in[256] = '\0';
    assert_int_equal(parse(in, out, 255), NGX_HTTP_IDEMPOTENCY_KEY_LONG);

    /* the limit applies to the decoded key, not to the quotes */

    in[0] = '"';
    memset(in + 1, 'k', 255);
    in[256] = '"';
    in[257] = '\0';
    assert_int_equal(parse(in, out, 255), 0);
}


int
main(void)
{
    const struct CMUnitTest  tests[] = {
        cmocka_unit_test(test_bare_token),
        cmocka_unit_test(test_sf_string_maps_to_same_key),
        cmocka_unit_test(test_sf_string_escapes),
        cmocka_unit_test(test_surrounding_whitespace_ignored),
        cmocka_unit_test(test_invalid_forms),
        cmocka_unit_test(test_length_limit),
    };

    return cmocka_run_group_tests_name("key", tests, NULL, NULL);
}
