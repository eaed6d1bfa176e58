/*
 * The replay cache's zone as its two files see it: the entries, the
 * zone's header, and the walk that locks each zone in turn.  Private to
 * ngx_http_idempotency_cache.c and ngx_http_idempotency_cache_sub.c.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_CACHE_ZONE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_CACHE_ZONE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>


/* an entry that is not a record: not served, removed when it expires */
#define NGX_HTTP_IDEMPOTENCY_CACHE_READY    0
#define NGX_HTTP_IDEMPOTENCY_CACHE_PENDING  1   /* store not acknowledged */

/* workers that listen for purges at once: worker 0 of old and new cycles */
#define NGX_HTTP_IDEMPOTENCY_CACHE_LISTENERS  8

/*
 * idempotency_cache_zone directives an http{} may have: a worker walks
 * them all (a purge, a store's commit, a subscription's epoch), and a zone
 * past this many would be left out of those walks
 */
#define NGX_HTTP_IDEMPOTENCY_CACHE_ZONES  16


/*
 * A lookup reads only the first 64 bytes of the nodes it walks, and a hit
 * writes only the second 64 (the LRU links), so that one worker's hits do
 * not take the walked lines from the other worker's cache.  Key, fence
 * and record are an allocation of their own: 128-byte nodes, 32 a page.
 */

typedef struct {
    ngx_rbtree_node_t                    node;
    uint32_t                             rid;       /* the Redis */
    uint16_t                             key_len;
    uint16_t                             fence_len;
    u_char                               state;
    u_char                              *data;      /* key, fence, record */

    ngx_queue_t                          queue;
    ngx_msec_t                           expire;
    uint64_t                             epoch;
    size_t                               len;       /* of the record */
} ngx_http_idempotency_cache_node_t;


typedef struct {
    ngx_rbtree_t                         rbtree;
    ngx_rbtree_node_t                    sentinel;
    ngx_uint_t                           dirty;
    uint64_t                             epoch;
    /* purges so far: a read sent before one does not enter after it */
    uint64_t                             purged;
    ngx_uint_t                           entries;
    size_t                               bytes;

    /* the last reload that kept the zone (ngx_current_msec), or 0 */
    ngx_msec_t                           reloaded;

    /* the workers listening for purges now, and whether any ever did */
    ngx_pid_t                 listeners[NGX_HTTP_IDEMPOTENCY_CACHE_LISTENERS];
    ngx_uint_t                           listened;

    /* last: every hit writes it, a lookup reads the lines above */
    ngx_queue_t                          lru;
} ngx_http_idempotency_cache_sh_t;


typedef struct {
    ngx_slab_pool_t                     *shpool;
    size_t                               max_size;
    ngx_str_t                            name;
} ngx_http_idempotency_cache_t;


void ngx_http_idempotency_cache_unlock(ngx_http_idempotency_cache_t *cache,
    ngx_http_idempotency_cache_sh_t *sh);

/* each zone in turn, locked: see ngx_http_idempotency_cache.c */
ngx_http_idempotency_cache_sh_t *ngx_http_idempotency_cache_next(
    ngx_uint_t *i, ngx_http_idempotency_cache_t **cache);


#endif /* _NGX_HTTP_IDEMPOTENCY_CACHE_ZONE_H_INCLUDED_ */
