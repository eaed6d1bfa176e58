/*
 * Redis Cluster key slots (CRC16 and hash tags) and MOVED/ASK replies.
 * Pure C, used by the topology layer (unit-tested in t/unit).
 */

#include "ngx_http_idempotency_slot.h"

#include <string.h>


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
