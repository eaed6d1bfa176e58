/*
 * The replay cache: completed records kept in a shared memory zone of the
 * node (idempotency_cache_zone), looked up before Redis, filled when this
 * node stores a record or reads one from Redis, emptied of a record when
 * it is purged.  HTTP side; calls the records layer only to read a
 * record's remaining TTL.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_CACHE_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_CACHE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_redis.h"


/* $idempotency_cache */
#define NGX_HTTP_IDEMPOTENCY_CACHE_NONE  0   /* "-": not looked up */
#define NGX_HTTP_IDEMPOTENCY_CACHE_MISS  1
#define NGX_HTTP_IDEMPOTENCY_CACHE_HIT   2


/* the directives */
char *ngx_http_idempotency_cache_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idempotency_cache(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* after the http block: every zone named by idempotency_cache is declared */
ngx_int_t ngx_http_idempotency_cache_check(ngx_conf_t *cf);

/*
 * The record of "rkey" (of the Redis "rcf") when the zone holds it,
 * completed and not expired: NGX_OK and a copy in "pool" in *out;
 * NGX_DECLINED otherwise (counted as a miss).
 */
ngx_int_t ngx_http_idempotency_cache_get(ngx_shm_zone_t *zone,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *rkey,
    ngx_pool_t *pool, ngx_str_t *out);

/*
 * A completed record read from Redis by this request's claim: its
 * remaining TTL is read from Redis (a second command, off the request's
 * path), and the record then enters the zone for that long.
 */
void ngx_http_idempotency_cache_fetched(ngx_shm_zone_t *zone,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *rkey, ngx_log_t *log);

/*
 * A completed record this node sends to Redis with a TTL of "ttl" ms
 * under the fence "fence" (the in-flight record of its claim): kept in
 * the zone but not used until commit() with the same key and fence says
 * that Redis stored it; drop() when it did not.
 */
void ngx_http_idempotency_cache_pending(ngx_shm_zone_t *zone,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *rkey,
    ngx_str_t *fence, ngx_str_t *record, ngx_msec_t ttl);
void ngx_http_idempotency_cache_commit(ngx_str_t *rkey, ngx_str_t *fence,
    ngx_uint_t stored);

/*
 * The record "rkey" was purged: out of every zone of this node at once,
 * whatever the idempotency_redis that read or stored it, and records read
 * from Redis before now do not enter for a while.
 */
void ngx_http_idempotency_cache_purge(ngx_str_t *rkey);

/*
 * Worker 0 listens for purges published by the other nodes (purge.lua
 * publishes the record key on "<prefix>purge"), one subscription per
 * idempotency_redis ("redis": an array of ngx_http_idempotency_redis_conf_t
 * *, or NULL), when the node has a cache zone.
 */
ngx_int_t ngx_http_idempotency_cache_init_process(ngx_cycle_t *cycle,
    ngx_array_t *redis);
void ngx_http_idempotency_cache_exit_process(ngx_cycle_t *cycle);

/* how long an old worker 0 waits for the new one to listen at a reload */
#define NGX_HTTP_IDEMPOTENCY_CACHE_HANDOVER  3000

/*
 * For the purge listener (ngx_http_idempotency_cache_sub.c): whether the
 * node has a cache zone; this worker listens for purges now ("on") or no
 * longer (entries older than a gap become misses); whether it may stop
 * listening at exit (another process listens, or no reload is under way).
 */
ngx_uint_t ngx_http_idempotency_cache_used(void);
void ngx_http_idempotency_cache_listening(ngx_uint_t on);
ngx_uint_t ngx_http_idempotency_cache_others_listen(void);

/* entries and bytes of all zones, for idempotency_status */
void ngx_http_idempotency_cache_totals(ngx_uint_t *entries, size_t *bytes);


#endif /* _NGX_HTTP_IDEMPOTENCY_CACHE_H_INCLUDED_ */
