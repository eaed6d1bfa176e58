/*
 * Unit tests of the Redis Cluster key slot (CRC16, hash tags) and of the
 * MOVED/ASK reply parser.
 */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <string.h>
#include <cmocka.h>

#include "ngx_http_idempotency_slot.h"


static unsigned int
slot(const char *key)
{
    return ngx_http_idempotency_slot((const unsigned char *) key,
                                     strlen(key));
}


static int
redirect(const char *s, ngx_http_idempotency_slot_redirect_t *rd)
{
    return ngx_http_idempotency_slot_redirect(s, strlen(s), rd);
}


static void
test_crc16_check_value(void **state)
{
    (void) state;

    /* the CRC-16/XMODEM check value, also in the Redis Cluster spec */
    assert_int_equal(ngx_http_idempotency_crc16(
                         (const unsigned char *) "123456789", 9), 0x31C3);
    assert_int_equal(ngx_http_idempotency_crc16(
                         (const unsigned char *) "", 0), 0);
}


static void
test_slot_of_known_keys(void **state)
{
    (void) state;

    /* answers of CLUSTER KEYSLOT on Redis 7.0 */
    assert_int_equal(slot("foo"), 12182);
    assert_int_equal(slot("bar"), 5061);
    assert_int_equal(slot("123456789"), 0x31C3);
    assert_int_equal(slot(""), 0);
}


static void
test_hash_tag(void **state)
{
    (void) state;

    assert_int_equal(slot("{user1000}.following"), slot("user1000"));
    assert_int_equal(slot("x{user1000}y"), slot("user1000"));

    /* only the first '{' and the first '}' after it count */
    assert_int_equal(slot("foo{}{bar}"), slot("foo{}{bar}"));
    assert_int_equal(slot("foo{{bar}}zap"), slot("{bar"));
    assert_int_equal(slot("foo{bar}{zap}"), slot("bar"));

    /* "{}" or no '}': the whole key */
    assert_int_equal(slot("foo{}{bar}"),
                     ngx_http_idempotency_crc16(
                         (const unsigned char *) "foo{}{bar}", 10) & 16383);
    assert_int_equal(slot("foo{bar"),
                     ngx_http_idempotency_crc16(
                         (const unsigned char *) "foo{bar", 7) & 16383);

    /* a prefix ending in "{}" keeps a client's tag from choosing the slot */
    assert_int_not_equal(slot("idem:{}abc:{t}"), slot("t"));
}


static void
test_redirects(void **state)
{
    ngx_http_idempotency_slot_redirect_t  rd;

    (void) state;

    assert_int_equal(redirect("MOVED 3999 127.0.0.1:6381", &rd),
                     NGX_HTTP_IDEMPOTENCY_SLOT_MOVED);
    assert_int_equal(rd.slot, 3999);
    assert_int_equal(rd.port, 6381);
    assert_string_equal(rd.host, "127.0.0.1");
    assert_int_equal(rd.host_len, 9);

    assert_int_equal(redirect("ASK 16383 10.0.0.2:7002", &rd),
                     NGX_HTTP_IDEMPOTENCY_SLOT_ASK);
    assert_int_equal(rd.slot, 16383);
    assert_int_equal(rd.port, 7002);
    assert_string_equal(rd.host, "10.0.0.2");

    /* an unknown endpoint: the host of the node that replied */
    assert_int_equal(redirect("MOVED 0 :7000", &rd),
                     NGX_HTTP_IDEMPOTENCY_SLOT_MOVED);
    assert_int_equal(rd.host_len, 0);
    assert_int_equal(rd.port, 7000);

    /* IPv6: the port follows the last ':' */
    assert_int_equal(redirect("MOVED 12 ::1:7001", &rd),
                     NGX_HTTP_IDEMPOTENCY_SLOT_MOVED);
    assert_string_equal(rd.host, "::1");
    assert_int_equal(rd.port, 7001);
}


static void
test_not_redirects(void **state)
{
    ngx_http_idempotency_slot_redirect_t  rd;

    (void) state;

    assert_int_equal(redirect("NOSCRIPT No matching script", &rd), 0);
    assert_int_equal(redirect("MOVED", &rd), 0);
    assert_int_equal(redirect("MOVED 16384 127.0.0.1:1", &rd), 0);
    assert_int_equal(redirect("MOVED x 127.0.0.1:1", &rd), 0);
    assert_int_equal(redirect("MOVED 1 127.0.0.1", &rd), 0);
    assert_int_equal(redirect("MOVED 1 127.0.0.1:", &rd), 0);
    assert_int_equal(redirect("MOVED 1 127.0.0.1:0", &rd), 0);
    assert_int_equal(redirect("MOVED 1 127.0.0.1:65536", &rd), 0);
    assert_int_equal(redirect("MOVED 1 127.0.0.1:7x", &rd), 0);
    assert_int_equal(redirect("MOVED 1 a b:1", &rd), 0);
    assert_int_equal(redirect("ASKING", &rd), 0);
    assert_int_equal(redirect("MOVED 1 "
                              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                              "aaaaaaaaaaaaaaaaaaaaaaaaa:1", &rd), 0);
}


/* every slot has a tag of its own, printable, brace-free, in that slot */
static void
test_slot_tags(void **state)
{
    char          key[NGX_HTTP_IDEMPOTENCY_SLOT_TAG_LEN + 16];
    unsigned int  s, i;
    unsigned char tag[NGX_HTTP_IDEMPOTENCY_SLOT_TAG_LEN];

    (void) state;

    assert_int_equal(ngx_http_idempotency_slot_tag(0, tag), -1);

    ngx_http_idempotency_slot_tags_init();
    ngx_http_idempotency_slot_tags_init();

    for (s = 0; s < NGX_HTTP_IDEMPOTENCY_SLOTS; s++) {
        assert_int_equal(ngx_http_idempotency_slot_tag(s, tag), 0);

        for (i = 0; i < sizeof(tag); i++) {
            assert_true(tag[i] >= '@' && tag[i] <= 'O');
        }

        memcpy(key, "p:{", 3);
        memcpy(key + 3, tag, sizeof(tag));
        memcpy(key + 3 + sizeof(tag), "}:body:0", sizeof("}:body:0"));
        assert_int_equal(slot(key), s);
    }

    assert_int_equal(ngx_http_idempotency_slot_tag(
                         NGX_HTTP_IDEMPOTENCY_SLOTS, tag), -1);
}


int
main(void)
{
    const struct CMUnitTest  tests[] = {
        cmocka_unit_test(test_crc16_check_value),
        cmocka_unit_test(test_slot_of_known_keys),
        cmocka_unit_test(test_hash_tag),
        cmocka_unit_test(test_redirects),
        cmocka_unit_test(test_not_redirects),
        cmocka_unit_test(test_slot_tags),
    };

    return cmocka_run_group_tests_name("slot", tests, NULL, NULL);
}
