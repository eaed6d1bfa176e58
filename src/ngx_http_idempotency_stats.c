/*
 * Observability: counters shared by all workers in a shared memory zone,
 * counted with atomics; and the short key hash for the error log.  Used by
 * every layer; uses none of them (the outcome of a request is counted by
 * the log-phase handler of ngx_http_idempotency_var.c).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_stats.h"

#include <time.h>
#include <openssl/sha.h>


static void ngx_http_idempotency_stat_time(ngx_atomic_t *bucket,
    ngx_atomic_t *sum, uint64_t start);
static ngx_int_t ngx_http_idempotency_stats_init_zone(
    ngx_shm_zone_t *shm_zone, void *data);


/*
 * One zone for the whole configuration, created with the module's use
 * (no directive: like the counters of stub_status, they are simply there).
 * The name is the module's own, so that no zone of another module meets
 * it; 8 pages hold the counters with room to spare.
 */
static ngx_str_t  ngx_http_idempotency_stats_zone_name =
    ngx_string("ngx_http_idempotency_stats");

/* this worker's view of the zone: set at process start, from the cycle */
static ngx_http_idempotency_stats_t  *ngx_http_idempotency_stats;


const ngx_uint_t  ngx_http_idempotency_latency_bounds[] = {
    NGX_HTTP_IDEMPOTENCY_LATENCY_BOUNDS
};


ngx_int_t
ngx_http_idempotency_stats_zone(ngx_conf_t *cf)
{
    ngx_shm_zone_t  *shm_zone;

    /* the same name, size and tag: the zone already added, or a new one */

    shm_zone = ngx_shared_memory_add(cf, &ngx_http_idempotency_stats_zone_name,
                                     8 * ngx_pagesize,
                                     &ngx_http_idempotency_stats_zone_name);
    if (shm_zone == NULL) {
        return NGX_ERROR;
    }

    shm_zone->init = ngx_http_idempotency_stats_init_zone;

    return NGX_OK;
}


static ngx_int_t
ngx_http_idempotency_stats_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_slab_pool_t               *shpool;
    ngx_http_idempotency_stats_t  *stats;

    /* after a reload the counters go on: Prometheus counters never reset */

    stats = data;

    if (stats != NULL && stats->size == sizeof(ngx_http_idempotency_stats_t))
    {
        shm_zone->data = stats;
        return NGX_OK;
    }

    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    stats = ngx_slab_calloc(shpool, sizeof(ngx_http_idempotency_stats_t));
    if (stats == NULL) {
        return NGX_ERROR;
    }

    stats->size = sizeof(ngx_http_idempotency_stats_t);

    shpool->data = stats;
    shm_zone->data = stats;

    return NGX_OK;
}


/*
 * Found through the cycle, not kept from the configuration: a worker that
 * the master starts again after a failed reload belongs to the old cycle.
 */

void
ngx_http_idempotency_stats_init_process(ngx_cycle_t *cycle)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_shm_zone_t   *shm_zone;

    ngx_http_idempotency_stats = NULL;

    part = &cycle->shared_memory.part;
    shm_zone = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            shm_zone = part->elts;
            i = 0;
        }

        if (shm_zone[i].tag == &ngx_http_idempotency_stats_zone_name
            && shm_zone[i].shm.name.len
               == ngx_http_idempotency_stats_zone_name.len
            && ngx_strncmp(shm_zone[i].shm.name.data,
                           ngx_http_idempotency_stats_zone_name.data,
                           ngx_http_idempotency_stats_zone_name.len)
               == 0)
        {
            ngx_http_idempotency_stats = shm_zone[i].data;
            return;
        }
    }
}


ngx_http_idempotency_stats_t *
ngx_http_idempotency_stats_get(void)
{
    return ngx_http_idempotency_stats;
}


void
ngx_http_idempotency_stat_inc(ngx_http_idempotency_stat_e which)
{
    if (ngx_http_idempotency_stats && which < NGX_HTTP_IDEMPOTENCY_STAT_N) {
        (void) ngx_atomic_fetch_add(
                           &ngx_http_idempotency_stats->counter[which], 1);
    }
}


/* microseconds, monotonic: nginx's cached time is too coarse for Redis */

static uint64_t
ngx_http_idempotency_stats_now(void)
{
    struct timespec  ts;

    if (clock_gettime(CLOCK_MONOTONIC, &ts) == -1) {
        return 0;
    }

    return (uint64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}


uint64_t
ngx_http_idempotency_stat_command(void)
{
    if (ngx_http_idempotency_stats == NULL) {
        return 0;
    }

    ngx_http_idempotency_stat_inc(NGX_HTTP_IDEMPOTENCY_STAT_REDIS_COMMANDS);

    return ngx_http_idempotency_stats_now();
}


void
ngx_http_idempotency_stat_reply(redisReply *reply, uint64_t start)
{
    ngx_http_idempotency_stats_t  *stats;

    stats = ngx_http_idempotency_stats;

    if (stats == NULL || reply == NULL) {
        return;
    }

    ngx_http_idempotency_stat_inc(NGX_HTTP_IDEMPOTENCY_STAT_REDIS_REPLIES);

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_http_idempotency_stat_inc(
                               NGX_HTTP_IDEMPOTENCY_STAT_REDIS_ERROR_REPLIES);
    }

    if (start == 0) {
        return;
    }

    ngx_http_idempotency_stat_time(stats->latency, &stats->latency_sum,
                                   start);
}


uint64_t
ngx_http_idempotency_stat_wait_start(void)
{
    if (ngx_http_idempotency_stats == NULL) {
        return 0;
    }

    ngx_http_idempotency_stat_inc(NGX_HTTP_IDEMPOTENCY_STAT_REDIS_WAITS);

    return ngx_http_idempotency_stats_now();
}


void
ngx_http_idempotency_stat_wait_done(uint64_t start)
{
    ngx_http_idempotency_stats_t  *stats;

    stats = ngx_http_idempotency_stats;

    if (stats == NULL || start == 0) {
        return;
    }

    ngx_http_idempotency_stat_time(stats->wait, &stats->wait_sum, start);
}


/* one more in the histogram "bucket", by the microseconds since start */

static void
ngx_http_idempotency_stat_time(ngx_atomic_t *bucket, ngx_atomic_t *sum,
    uint64_t start)
{
    uint64_t    now, us;
    ngx_uint_t  i;

    now = ngx_http_idempotency_stats_now();
    us = (now > start) ? now - start : 0;

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_LATENCY_N; i++) {
        if (us <= ngx_http_idempotency_latency_bounds[i]) {
            break;
        }
    }

    (void) ngx_atomic_fetch_add(&bucket[i], 1);
    (void) ngx_atomic_fetch_add(sum, (ngx_atomic_int_t) us);
}


u_char *
ngx_http_idempotency_key_hash(ngx_str_t *rkey)
{
    u_char         md[SHA256_DIGEST_LENGTH];
    static u_char  hex[NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN + 1];

    if (rkey->len == 0) {
        hex[0] = '-';
        hex[1] = '\0';
        return hex;
    }

    SHA256(rkey->data, rkey->len, md);

    *ngx_hex_dump(hex, md, NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN / 2) = '\0';

    return hex;
}
