/*
 * Redis Cluster key slots (CRC16 and hash tags) and MOVED/ASK replies.
 * Pure C, used by the topology layer (unit-tested in t/unit).
 */

#include "ngx_http_idempotency_slot.h"

#include <string.h>


/*
 * The hash tag of each slot, as 16 bits: 4 bits per character, written as
 * '@' + those bits; "tagged" marks the slots found.
 */
static uint16_t  ngx_http_idempotency_slot_tags[NGX_HTTP_IDEMPOTENCY_SLOTS];
static uint8_t   ngx_http_idempotency_slot_tagged[NGX_HTTP_IDEMPOTENCY_SLOTS
                                                  / 8];
static int       ngx_http_idempotency_slot_tags_done;


static void ngx_http_idempotency_slot_tag_text(unsigned int v,
    unsigned char *tag);


uint16_t
ngx_http_idempotency_crc16(const unsigned char *p, size_t len)
{
    int       i;
    uint16_t  crc;

    crc = 0;

    while (len--) {
        crc ^= (uint16_t) (*p++ << 8);

        for (i = 0; i < 8; i++) {
            crc = (crc & 0x8000) ? (uint16_t) ((crc << 1) ^ 0x1021)
                                 : (uint16_t) (crc << 1);
        }
    }

    return crc;
}


unsigned int
ngx_http_idempotency_slot(const unsigned char *key, size_t len)
{
    size_t  s, e;

    for (s = 0; s < len && key[s] != '{'; s++) {
        /* void */
    }

    if (s < len) {
        for (e = s + 1; e < len && key[e] != '}'; e++) {
            /* void */
        }

        /* "{}" or no '}': the whole key counts */

        if (e < len && e != s + 1) {
            key += s + 1;
            len = e - s - 1;
        }
    }

    return ngx_http_idempotency_crc16(key, len)
           & (NGX_HTTP_IDEMPOTENCY_SLOTS - 1);
}


void
ngx_http_idempotency_slot_tags_init(void)
{
    unsigned char  tag[NGX_HTTP_IDEMPOTENCY_SLOT_TAG_LEN];
    unsigned int   v, slot, found;

    if (ngx_http_idempotency_slot_tags_done) {
        return;
    }

    found = 0;

    for (v = 0; v < 0x10000 && found < NGX_HTTP_IDEMPOTENCY_SLOTS; v++) {
        ngx_http_idempotency_slot_tag_text(v, tag);
        slot = ngx_http_idempotency_crc16(tag, sizeof(tag))
               & (NGX_HTTP_IDEMPOTENCY_SLOTS - 1);

        if (ngx_http_idempotency_slot_tagged[slot / 8] & (1u << (slot % 8))) {
            continue;
        }

        ngx_http_idempotency_slot_tagged[slot / 8] |= (uint8_t) (1u
                                                             << (slot % 8));
        ngx_http_idempotency_slot_tags[slot] = (uint16_t) v;
        found++;
    }

    ngx_http_idempotency_slot_tags_done = 1;
}


int
ngx_http_idempotency_slot_tag(unsigned int slot, unsigned char *tag)
{
    if (slot >= NGX_HTTP_IDEMPOTENCY_SLOTS
        || !(ngx_http_idempotency_slot_tagged[slot / 8] & (1u << (slot % 8))))
    {
        return -1;
    }

    ngx_http_idempotency_slot_tag_text(ngx_http_idempotency_slot_tags[slot],
                                       tag);

    return 0;
}


/* printable, no brace, no ':': '@' (0x40) plus 4 bits, high bits first */

static void
ngx_http_idempotency_slot_tag_text(unsigned int v, unsigned char *tag)
{
    int  i;

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_SLOT_TAG_LEN; i++) {
        tag[i] = (unsigned char) ('@' | ((v >> (12 - 4 * i)) & 0xf));
    }
}


int
ngx_http_idempotency_slot_redirect(const char *str, size_t len,
    ngx_http_idempotency_slot_redirect_t *rd)
{
    int          kind;
    size_t       i, n, colon;
    const char  *p, *end;
    unsigned     v;

    if (len > 6 && memcmp(str, "MOVED ", 6) == 0) {
        kind = NGX_HTTP_IDEMPOTENCY_SLOT_MOVED;
        p = str + 6;

    } else if (len > 4 && memcmp(str, "ASK ", 4) == 0) {
        kind = NGX_HTTP_IDEMPOTENCY_SLOT_ASK;
        p = str + 4;

    } else {
        return NGX_HTTP_IDEMPOTENCY_SLOT_NONE;
    }

    end = str + len;

    for (v = 0, n = 0; p < end && *p >= '0' && *p <= '9'; p++, n++) {
        v = v * 10 + (*p - '0');

        if (v >= NGX_HTTP_IDEMPOTENCY_SLOTS) {
            return NGX_HTTP_IDEMPOTENCY_SLOT_NONE;
        }
    }

    if (n == 0 || p == end || *p++ != ' ') {
        return NGX_HTTP_IDEMPOTENCY_SLOT_NONE;
    }

    rd->slot = v;

    /* host:port, the port after the last ':' (an IPv6 host has more) */

    colon = (size_t) -1;

    for (n = 0; p + n < end; n++) {
        if (p[n] == ':') {
            colon = n;

        } else if (p[n] == ' ') {
            return NGX_HTTP_IDEMPOTENCY_SLOT_NONE;
        }
    }

    if (colon == (size_t) -1 || colon + 1 == n
        || colon >= NGX_HTTP_IDEMPOTENCY_SLOT_HOST_LEN)
    {
        return NGX_HTTP_IDEMPOTENCY_SLOT_NONE;
    }

    for (v = 0, i = colon + 1; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return NGX_HTTP_IDEMPOTENCY_SLOT_NONE;
        }

        v = v * 10 + (p[i] - '0');

        if (v > 65535) {
            return NGX_HTTP_IDEMPOTENCY_SLOT_NONE;
        }
    }

    if (v == 0) {
        return NGX_HTTP_IDEMPOTENCY_SLOT_NONE;
    }

    rd->port = v;
    rd->host_len = colon;
    memcpy(rd->host, p, colon);
    rd->host[colon] = '\0';

    return kind;
}
