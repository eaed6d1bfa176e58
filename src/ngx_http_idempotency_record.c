/*
 * Stored-record encoding: the first line and the header lines, written and
 * read back without trusting what Redis returns.  Pure C: uses nothing of
 * nginx or of the module's layers (unit-tested in t/unit).
 */

#include "ngx_http_idempotency_record.h"

#include <string.h>


#define NGX_HTTP_IDEMPOTENCY_RECORD_MAGIC  "idem1 "


typedef struct {
    const char  *name;
    size_t       len;
} ngx_http_idempotency_record_word_t;


static const ngx_http_idempotency_record_word_t
    ngx_http_idempotency_record_states[] = {
    { "inflight", sizeof("inflight") - 1 },
    { "done", sizeof("done") - 1 },
    { "oversize", sizeof("oversize") - 1 },
    { "unknown", sizeof("unknown") - 1 },
    { "split", sizeof("split") - 1 }
};

#define NGX_HTTP_IDEMPOTENCY_RECORD_NSTATES                                   \
    (int) (sizeof(ngx_http_idempotency_record_states)                         \
           / sizeof(ngx_http_idempotency_record_states[0]))


/*
 * Never replayed: the replay sets the framing and the marker itself, and
 * nginx adds Date and Server to every response.
 */
static const ngx_http_idempotency_record_word_t
    ngx_http_idempotency_record_never[] = {
    { "Connection", sizeof("Connection") - 1 },
    { "Keep-Alive", sizeof("Keep-Alive") - 1 },
    { "Proxy-Authenticate", sizeof("Proxy-Authenticate") - 1 },
    { "Proxy-Authorization", sizeof("Proxy-Authorization") - 1 },
    { "Proxy-Connection", sizeof("Proxy-Connection") - 1 },
    { "TE", sizeof("TE") - 1 },
    { "Trailer", sizeof("Trailer") - 1 },
    { "Transfer-Encoding", sizeof("Transfer-Encoding") - 1 },
    { "Upgrade", sizeof("Upgrade") - 1 },
    { "Date", sizeof("Date") - 1 },
    { "Server", sizeof("Server") - 1 },
    { "Content-Length", sizeof("Content-Length") - 1 },
    { "Idempotent-Replayed", sizeof("Idempotent-Replayed") - 1 }
};


static int ngx_http_idempotency_record_read(const unsigned char *p,
    size_t len, ngx_http_idempotency_record_t *rec, int check);
static size_t ngx_http_idempotency_record_field(const unsigned char *p,
    const unsigned char *end, size_t max, int hex, int check);
static int ngx_http_idempotency_record_tchar(unsigned char c);


unsigned char *
ngx_http_idempotency_record_write_head(unsigned char *p, int state,
    const unsigned char *fp, size_t fp_len, const unsigned char *owner,
    size_t owner_len, unsigned long long created, int status)
{
    size_t          n;
    unsigned char   digits[20];
    const ngx_http_idempotency_record_word_t  *w;

    w = &ngx_http_idempotency_record_states[state];

    memcpy(p, NGX_HTTP_IDEMPOTENCY_RECORD_MAGIC,
           sizeof(NGX_HTTP_IDEMPOTENCY_RECORD_MAGIC) - 1);
    p += sizeof(NGX_HTTP_IDEMPOTENCY_RECORD_MAGIC) - 1;
    memcpy(p, w->name, w->len);
    p += w->len;
    *p++ = ' ';
    memcpy(p, fp, fp_len);
    p += fp_len;
    *p++ = ' ';
    memcpy(p, owner, owner_len);
    p += owner_len;
    *p++ = ' ';

    n = 0;

    do {
        digits[n++] = (unsigned char) ('0' + created % 10);
        created /= 10;
    } while (created);

    while (n) {
        *p++ = digits[--n];
    }

    *p++ = ' ';
    *p++ = (unsigned char) ('0' + status / 100 % 10);
    *p++ = (unsigned char) ('0' + status / 10 % 10);
    *p++ = (unsigned char) ('0' + status % 10);
    *p++ = '\r';
    *p++ = '\n';

    return p;
}


/*
 * Every field is checked against the end before it is read, so that a
 * record cut anywhere, or one with a field too long, is refused and never
 * read past.
 */

int
ngx_http_idempotency_record_parse(const unsigned char *p, size_t len,
    ngx_http_idempotency_record_t *rec)
{
    return ngx_http_idempotency_record_read(p, len, rec, 1);
}


int
ngx_http_idempotency_record_parse_known(const unsigned char *p, size_t len,
    ngx_http_idempotency_record_t *rec)
{
    return ngx_http_idempotency_record_read(p, len, rec, 0);
}


static int
ngx_http_idempotency_record_read(const unsigned char *p, size_t len,
    ngx_http_idempotency_record_t *rec, int check)
{
    int                   i, n;
    size_t                k;
    const unsigned char  *end, *q;

    end = p + len;

    k = sizeof(NGX_HTTP_IDEMPOTENCY_RECORD_MAGIC) - 1;

    if (len < k || memcmp(p, NGX_HTTP_IDEMPOTENCY_RECORD_MAGIC, k) != 0) {
        return -1;
    }

    p += k;

    rec->state = -1;

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_RECORD_NSTATES; i++) {
        k = ngx_http_idempotency_record_states[i].len;

        if ((size_t) (end - p) > k && p[k] == ' '
            && memcmp(p, ngx_http_idempotency_record_states[i].name, k) == 0)
        {
            rec->state = i;
            p += k + 1;
            break;
        }
    }

    if (rec->state == -1) {
        return -1;
    }

    /* fingerprint, owner, created: each ends with a space */

    k = ngx_http_idempotency_record_field(p, end,
                                NGX_HTTP_IDEMPOTENCY_RECORD_TOKEN_MAX, 1,
                                check);
    if (k == 0) {
        return -1;
    }

    rec->fp = p;
    rec->fp_len = k;
    p += k + 1;

    k = ngx_http_idempotency_record_field(p, end,
                                NGX_HTTP_IDEMPOTENCY_RECORD_TOKEN_MAX, 1,
                                check);
    if (k == 0) {
        return -1;
    }

    rec->owner = p;
    rec->owner_len = k;
    p += k + 1;

    k = ngx_http_idempotency_record_field(p, end, 20, 0, check);
    if (k == 0) {
        return -1;
    }

    rec->created = p;
    rec->created_len = k;
    p += k + 1;

    /* status and the end of the line */

    if (end - p < 5 || p[3] != '\r' || p[4] != '\n') {
        return -1;
    }

    if (rec->state == NGX_HTTP_IDEMPOTENCY_RECORD_INFLIGHT) {
        if (p[0] != '0' || p[1] != '0' || p[2] != '0') {
            return -1;
        }

        n = 0;

    } else {
        n = ngx_http_idempotency_record_status(p, 3);

        /* an interim response is not an outcome: never stored */

        if (n < 200) {
            return -1;
        }
    }

    rec->status = n;
    p += 5;

    /* header lines up to an empty line; no line holds CR or LF */

    rec->headers = p;

    for (q = p; ; q++) {
        q = memchr(q, '\r', end - q);

        if (q == NULL || end - q < 2) {
            return -1;
        }

        if (q[1] == '\n' && (q == p || (q[-2] == '\r' && q[-1] == '\n'))) {
            break;
        }
    }

    rec->headers_len = q - p;
    rec->body = q + 2;
    rec->body_len = end - (q + 2);

    return 0;
}


/*
 * The length of a field that ends with a space before end, or 0; its
 * bytes are digits (hex: and a-f), checked unless a known record's
 */

static size_t
ngx_http_idempotency_record_field(const unsigned char *p,
    const unsigned char *end, size_t max, int hex, int check)
{
    size_t                k, n;
    unsigned char         c;
    const unsigned char  *q;

    n = (size_t) (end - p);

    if (n > max + 1) {
        n = max + 1;
    }

    if (!check) {
        q = memchr(p, ' ', n);
        return q ? (size_t) (q - p) : 0;
    }

    for (k = 0; k < n; k++) {
        c = p[k];

        if ((unsigned char) (c - '0') <= 9) {
            continue;
        }

        if (c == ' ') {
            return k;
        }

        if (!hex || (unsigned char) (c - 'a') > 5) {
            return 0;
        }
    }

    return 0;
}


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


int
ngx_http_idempotency_record_validate(const ngx_http_idempotency_record_t *rec,
    const char **reason)
{
    int                                    rc;
    size_t                                 i;
    const unsigned char                   *p, *end;
    ngx_http_idempotency_record_header_t   h;

    if (rec->status < 200 || rec->status > 599) {
        *reason = "the status is not a final one (200 .. 599)";
        return -1;
    }

    p = rec->headers;
    end = p + rec->headers_len;

    while ((rc = ngx_http_idempotency_record_next_header(&p, end, &h)) == 1) {

        /* "@name": a trailer */

        i = (h.name[0] == NGX_HTTP_IDEMPOTENCY_RECORD_TRAILER);

        if (i == h.name_len) {
            *reason = "a header name is not a token";
            return -1;
        }

        for ( /* void */ ; i < h.name_len; i++) {
            if (!ngx_http_idempotency_record_tchar(h.name[i])) {
                *reason = "a header name is not a token";
                return -1;
            }
        }

        for (i = 0; i < h.value_len; i++) {
            if ((h.value[i] < 0x20 && h.value[i] != '\t')
                || h.value[i] == 0x7f)
            {
                *reason = "a header value holds a control character";
                return -1;
            }
        }
    }

    if (rc == -1) {
        *reason = "the header lines are not well formed";
        return -1;
    }

    return 0;
}


int
ngx_http_idempotency_record_header_replayable(const unsigned char *name,
    size_t len)
{
    size_t                                     i, k, n;
    unsigned char                              a, b;
    const ngx_http_idempotency_record_word_t  *w;

    n = sizeof(ngx_http_idempotency_record_never)
        / sizeof(ngx_http_idempotency_record_never[0]);

    for (i = 0; i < n; i++) {
        w = &ngx_http_idempotency_record_never[i];

        if (w->len != len) {
            continue;
        }

        for (k = 0; k < len; k++) {
            a = name[k];
            b = (unsigned char) w->name[k];

            if (a >= 'A' && a <= 'Z') {
                a = (unsigned char) (a | 0x20);
            }

            if (b >= 'A' && b <= 'Z') {
                b = (unsigned char) (b | 0x20);
            }

            if (a != b) {
                break;
            }
        }

        if (k == len) {
            return 0;
        }
    }

    return 1;
}


/* RFC 9110 tchar */

static int
ngx_http_idempotency_record_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')
        || (c >= 'A' && c <= 'Z'))
    {
        return 1;
    }

    return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}
