/*
 * Stored-response encoding: header lines in, header lines out.
 */

#include <string.h>

#include "ngx_http_idempotency_record.h"


size_t
ngx_http_idempotency_record_header_size(size_t name_len, size_t value_len)
{
    return name_len + sizeof(": ") - 1 + value_len + sizeof("\r\n") - 1;
}


unsigned char *
ngx_http_idempotency_record_write_header(unsigned char *p,
    const unsigned char *name, size_t name_len, const unsigned char *value,
    size_t value_len)
{
    memcpy(p, name, name_len);
    p += name_len;
    *p++ = ':';
    *p++ = ' ';
    memcpy(p, value, value_len);
    p += value_len;
    *p++ = '\r';
    *p++ = '\n';

    return p;
}


int
ngx_http_idempotency_record_next_header(const unsigned char **pos,
    const unsigned char *end, ngx_http_idempotency_record_header_t *h)
{
    const unsigned char  *p, *colon, *eol;

    p = *pos;

    if (p == end) {
        return 0;
    }

    colon = NULL;

    for (eol = p; eol < end; eol++) {
        if (*eol == ':' && colon == NULL) {
            colon = eol;
        }

        if (*eol == '\r' || *eol == '\n' || *eol == '\0') {
            break;
        }
    }

    if (eol + 1 >= end || eol[0] != '\r' || eol[1] != '\n'
        || colon == NULL || colon == p
        || colon + 1 == eol || colon[1] != ' ')
    {
        return -1;
    }

    h->name = p;
    h->name_len = colon - p;
    h->value = colon + 2;
    h->value_len = eol - (colon + 2);

    *pos = eol + 2;

    return 1;
}


int
ngx_http_idempotency_record_status(const unsigned char *p, size_t len)
{
    int  n;

    if (len != 3 || p[0] < '1' || p[0] > '5'
        || p[1] < '0' || p[1] > '9' || p[2] < '0' || p[2] > '9')
    {
        return -1;
    }

    n = (p[0] - '0') * 100 + (p[1] - '0') * 10 + (p[2] - '0');

    return n;
}
