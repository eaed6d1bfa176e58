/*
 * The stored response: how status and headers are written into a record and
 * read back.  Pure C with no nginx dependency, so that unit tests can link
 * it alone.
 *
 * A record is one Redis hash: state, fp, owner, created, status (decimal),
 * headers ("Name: value\r\n" lines, readable with redis-cli) and body.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_RECORD_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_RECORD_H_INCLUDED_


#include <stddef.h>


typedef struct {
    const unsigned char  *name;
    size_t                name_len;
    const unsigned char  *value;
    size_t                value_len;
} ngx_http_idempotency_record_header_t;


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


#endif /* _NGX_HTTP_IDEMPOTENCY_RECORD_H_INCLUDED_ */
