/*
 * Redis Cluster key slots and redirect replies.  Pure C with no nginx
 * dependency, so that unit tests can link it alone.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_SLOT_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_SLOT_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


#define NGX_HTTP_IDEMPOTENCY_SLOTS           16384

#define NGX_HTTP_IDEMPOTENCY_SLOT_NONE       0   /* not a redirect */
#define NGX_HTTP_IDEMPOTENCY_SLOT_MOVED      1
#define NGX_HTTP_IDEMPOTENCY_SLOT_ASK        2

/* a hash tag of ours for a slot: 4 characters, '@' to 'O' */
#define NGX_HTTP_IDEMPOTENCY_SLOT_TAG_LEN    4

/* longest host part of a redirect that is kept (an IPv6 literal fits) */
#define NGX_HTTP_IDEMPOTENCY_SLOT_HOST_LEN   64


typedef struct {
    unsigned int    slot;
    unsigned int    port;
    size_t          host_len;   /* 0: the host of the node that replied */
    char            host[NGX_HTTP_IDEMPOTENCY_SLOT_HOST_LEN];
} ngx_http_idempotency_slot_redirect_t;


/* CRC16/XMODEM (poly 0x1021, init 0), the checksum of Redis Cluster */
uint16_t ngx_http_idempotency_crc16(const unsigned char *p, size_t len);

/*
 * The slot of a key as Redis computes it: CRC16 of the key, or only of its
 * hash tag (what is between the first '{' and the first '}' after it, when
 * that is not empty), mod 16384.
 */
unsigned int ngx_http_idempotency_slot(const unsigned char *key, size_t len);

/*
 * Fills the table of hash tags, one per slot (once: later calls return at
 * once).  A bounded search: the 65536 strings of 4 characters '@' to 'O'
 * (each carries 4 bits) cover every slot.  A few milliseconds, so that
 * a tag is a look-up afterwards.
 */
void ngx_http_idempotency_slot_tags_init(void);

/*
 * Writes the hash tag of "slot" (SLOT_TAG_LEN characters, no braces) to
 * tag: a key "...{<tag>}..." is in that slot.  Returns 0, or -1 when the
 * table has no tag for it (not filled yet).
 */
int ngx_http_idempotency_slot_tag(unsigned int slot, unsigned char *tag);

/*
 * Reads an error reply "MOVED <slot> <host>:<port>" or "ASK <slot>
 * <host>:<port>" (the host may be empty).  Returns SLOT_MOVED or SLOT_ASK
 * with *rd filled, or SLOT_NONE for any other or malformed reply.
 */
int ngx_http_idempotency_slot_redirect(const char *str, size_t len,
    ngx_http_idempotency_slot_redirect_t *rd);


#endif /* _NGX_HTTP_IDEMPOTENCY_SLOT_H_INCLUDED_ */
