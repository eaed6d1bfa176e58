/*
 * The stored record: how it is written into one Redis string and read
 * back.  Pure C with no nginx dependency, so that unit tests and fuzzers
 * can link it alone.
 *
 * A record is text up to its body, readable with "redis-cli GET":
 *
 *   idem1 <state> <fp> <owner> <created> <status>\r\n
 *   Name: value\r\n            (the stored headers, none while in flight)
 *   ...
 *   @Name: value\r\n           (the stored trailers, after the headers)
 *   ...
 *   \r\n
 *   <body bytes>
 *
 * state: inflight, done, oversize, unknown (the request was passed on
 * but its outcome is not known: held, never run again) or split; fp: the
 * request fingerprint (hex); owner: the token of the request that claimed
 * the key (hex); created: the claim's Unix time; status: three digits, 000
 * while in flight.
 *
 * A "split" record is a done record whose body is too large to travel with
 * every claim: its body part holds the body's length in decimal, and the
 * body itself is a second string (see ngx_http_idempotency_redis_body_key),
 * read only to replay it.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_RECORD_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_RECORD_H_INCLUDED_


#include <stddef.h>


#define NGX_HTTP_IDEMPOTENCY_RECORD_INFLIGHT  0
#define NGX_HTTP_IDEMPOTENCY_RECORD_DONE      1
#define NGX_HTTP_IDEMPOTENCY_RECORD_OVERSIZE  2
#define NGX_HTTP_IDEMPOTENCY_RECORD_UNKNOWN   3
#define NGX_HTTP_IDEMPOTENCY_RECORD_SPLIT     4

/* the first character of a trailer's name in the record (not a tchar) */
#define NGX_HTTP_IDEMPOTENCY_RECORD_TRAILER  '@'

/* fingerprint and owner token: 1 .. this many hex digits */
#define NGX_HTTP_IDEMPOTENCY_RECORD_TOKEN_MAX  128

/* the first line with the longest state and a 20-digit created time */
#define NGX_HTTP_IDEMPOTENCY_RECORD_HEAD_MAX(fp_len, owner_len)               \
    (sizeof("idem1 oversize    000\r\n") - 1 + (fp_len) + (owner_len) + 20)


typedef struct {
    const unsigned char  *name;
    size_t                name_len;
    const unsigned char  *value;
    size_t                value_len;
} ngx_http_idempotency_record_header_t;


/* a record as read: every pointer lies inside the bytes it was read from */
typedef struct ngx_http_idempotency_record_s {
    int                   state;
    int                   status;      /* 200 .. 599, 0 while in flight */
    const unsigned char  *fp;
    size_t                fp_len;
    const unsigned char  *owner;
    size_t                owner_len;
    const unsigned char  *created;     /* decimal digits */
    size_t                created_len;
    const unsigned char  *headers;     /* "Name: value\r\n" lines */
    size_t                headers_len;
    const unsigned char  *body;
    size_t                body_len;
} ngx_http_idempotency_record_t;


/*
 * Writes the first line, "\r\n" included, and returns the end; p must have
 * room for NGX_HTTP_IDEMPOTENCY_RECORD_HEAD_MAX(fp_len, owner_len) bytes.
 * status is written as three digits (0 gives "000").  A record is this
 * line, the header lines, "\r\n" and the body, in that order.
 */
unsigned char *ngx_http_idempotency_record_write_head(unsigned char *p,
    int state, const unsigned char *fp, size_t fp_len,
    const unsigned char *owner, size_t owner_len,
    unsigned long long created, int status);

/*
 * Reads a whole record: 0 and rec filled, or -1 when the bytes are not a
 * record of this format (truncated, edited, written by something else).
 * A record that is not in flight has a final status, 200 .. 599: an
 * interim (1xx) response is never stored.  The header lines are only
 * delimited here; next_header() reads them, validate() checks them.
 */
int ngx_http_idempotency_record_parse(const unsigned char *p, size_t len,
    ngx_http_idempotency_record_t *rec);

/*
 * The same for a record parsed and validated before (a copy of one the
 * node's cache took in): the fields are found, their digits not checked
 * again.  Never read past len either.
 */
int ngx_http_idempotency_record_parse_known(const unsigned char *p,
    size_t len, ngx_http_idempotency_record_t *rec);

size_t ngx_http_idempotency_record_header_size(size_t name_len,
    size_t value_len);
unsigned char *ngx_http_idempotency_record_write_header(unsigned char *p,
    const unsigned char *name, size_t name_len, const unsigned char *value,
    size_t value_len);

/*
 * Reads the next header line at *pos: returns 1 and fills h, 0 at the end,
 * -1 when the text is not a well-formed header list.
 */
int ngx_http_idempotency_record_next_header(const unsigned char **pos,
    const unsigned char *end, ngx_http_idempotency_record_header_t *h);

/* "100" .. "599" -> the number, anything else -> -1 */
int ngx_http_idempotency_record_status(const unsigned char *p, size_t len);

/*
 * Whether a completed record read by parse() is fit to be replayed: a
 * final status (200 .. 599) and header lines that are all well formed,
 * with a token for a name and a value without control characters but
 * HTAB.  0, or -1 with *reason saying what is wrong.  Anything else in a
 * record (a header the capture never stores among them) is not trusted
 * either: see header_replayable().
 */
int ngx_http_idempotency_record_validate(
    const ngx_http_idempotency_record_t *rec, const char **reason);

/*
 * 0 for a header the capture never stores, whatever a record says:
 * hop-by-hop headers, the framing (Content-Length, Transfer-Encoding),
 * those nginx makes for every response (Date, Server) and the replay
 * marker; 1 otherwise.  Names compare without regard to case.
 */
int ngx_http_idempotency_record_header_replayable(const unsigned char *name,
    size_t len);


#endif /* _NGX_HTTP_IDEMPOTENCY_RECORD_H_INCLUDED_ */
