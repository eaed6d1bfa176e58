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


/*
 * The zone's configuration side: the labels this configuration names,
 * and where the zone's counters are once it is set up (shm_zone->data)
 */
typedef struct {
    ngx_http_idempotency_stats_t   *stats;
    ngx_array_t                     labels;   /* of label_t * */
} ngx_http_idempotency_stats_ctx_t;


static ngx_shm_zone_t *ngx_http_idempotency_stats_shm(ngx_conf_t *cf);
static void ngx_http_idempotency_stat_time(ngx_atomic_t *bucket,
    ngx_atomic_t *sum, uint64_t start);
static ngx_int_t ngx_http_idempotency_stats_init_zone(
    ngx_shm_zone_t *shm_zone, void *data);
static void ngx_http_idempotency_stats_place(
    ngx_http_idempotency_stats_ctx_t *ctx);
static ngx_http_idempotency_label_t *ngx_http_idempotency_stats_label(
    ngx_conf_t *cf, ngx_str_t *name);


/*
 * One zone for the whole configuration, created with the module's use
 * (no directive: like the counters of stub_status, they are simply there).
 * The name is the module's own, so that no zone of another module meets
 * it; the counters and 8 pages for the slab pool's own use.
 */
static ngx_str_t  ngx_http_idempotency_stats_zone_name =
    ngx_string("ngx_http_idempotency_stats");

/* this worker's view of the zone: set at process start, from the cycle */
static ngx_http_idempotency_stats_t      *ngx_http_idempotency_stats;
static ngx_http_idempotency_stats_ctx_t  *ngx_http_idempotency_stats_ctx;


const ngx_uint_t  ngx_http_idempotency_latency_bounds[] = {
    NGX_HTTP_IDEMPOTENCY_LATENCY_BOUNDS
};


static ngx_shm_zone_t *
ngx_http_idempotency_stats_shm(ngx_conf_t *cf)
{
    size_t                             size;
    ngx_shm_zone_t                    *shm_zone;
    ngx_http_idempotency_stats_ctx_t  *ctx;

    /* the same name, size and tag: the zone already added, or a new one */

    size = ngx_align(sizeof(ngx_http_idempotency_stats_t), ngx_pagesize)
           + 8 * ngx_pagesize;

    shm_zone = ngx_shared_memory_add(cf, &ngx_http_idempotency_stats_zone_name,
                                     size,
                                     &ngx_http_idempotency_stats_zone_name);
    if (shm_zone == NULL) {
        return NULL;
    }

    if (shm_zone->data != NULL) {
        return shm_zone;
    }

    ctx = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_stats_ctx_t));
    if (ctx == NULL) {
        return NULL;
    }

    if (ngx_array_init(&ctx->labels, cf->pool, 4,
                       sizeof(ngx_http_idempotency_label_t *))
        != NGX_OK)
    {
        return NULL;
    }

    shm_zone->init = ngx_http_idempotency_stats_init_zone;
    shm_zone->data = ctx;

    return shm_zone;
}


ngx_int_t
ngx_http_idempotency_stats_zone(ngx_conf_t *cf)
{
    return ngx_http_idempotency_stats_shm(cf) ? NGX_OK : NGX_ERROR;
}


static ngx_int_t
ngx_http_idempotency_stats_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_slab_pool_t                   *shpool;
    ngx_http_idempotency_stats_t      *stats;
    ngx_http_idempotency_stats_ctx_t  *ctx, *octx;

    /* after a reload the counters go on: Prometheus counters never reset */

    ctx = shm_zone->data;
    octx = data;

    if (octx != NULL && octx->stats != NULL
        && octx->stats->size == sizeof(ngx_http_idempotency_stats_t))
    {
        ctx->stats = octx->stats;
        ngx_http_idempotency_stats_place(ctx);
        return NGX_OK;
    }

    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    stats = ngx_slab_calloc(shpool, sizeof(ngx_http_idempotency_stats_t));
    if (stats == NULL) {
        return NGX_ERROR;
    }

    stats->size = sizeof(ngx_http_idempotency_stats_t);

    shpool->data = stats;
    ctx->stats = stats;

    ngx_http_idempotency_stats_place(ctx);

    return NGX_OK;
}


/*
 * Each label of the configuration gets its slot, in the master: a name
 * the zone knows keeps its slot and its counts (a reload); a new one
 * takes a slot never used, else one whose name this configuration no
 * longer has, its counts set to 0.  There is always one: a configuration
 * names at most half as many as there are slots.  (A worker of the
 * previous configuration still running may count a few requests into a
 * slot so taken: that needs more than NGX_HTTP_IDEMPOTENCY_LABELS_MAX new
 * names since nginx started.)
 */

static void
ngx_http_idempotency_stats_place(ngx_http_idempotency_stats_ctx_t *ctx)
{
    ngx_uint_t                          i, s, free;
    ngx_http_idempotency_label_t      **labels, *l;
    ngx_http_idempotency_stats_t       *stats;
    ngx_http_idempotency_label_name_t  *name;
    u_char                              used[
                                         NGX_HTTP_IDEMPOTENCY_LABEL_SLOTS];

    stats = ctx->stats;
    labels = ctx->labels.elts;

    ngx_memzero(used, sizeof(used));

    for (i = 0; i < ctx->labels.nelts; i++) {
        l = labels[i];
        l->slot = NGX_HTTP_IDEMPOTENCY_LABEL_SLOTS;

        for (s = 0; s < NGX_HTTP_IDEMPOTENCY_LABEL_SLOTS; s++) {
            name = &stats->label_name[s];

            if (name->len == l->name.len
                && ngx_memcmp(name->data, l->name.data, l->name.len) == 0)
            {
                l->slot = s;
                used[s] = 1;
                break;
            }
        }
    }

    for (i = 0; i < ctx->labels.nelts; i++) {
        l = labels[i];

        if (l->slot < NGX_HTTP_IDEMPOTENCY_LABEL_SLOTS) {
            continue;
        }

        free = NGX_HTTP_IDEMPOTENCY_LABEL_SLOTS;

        for (s = 0; s < NGX_HTTP_IDEMPOTENCY_LABEL_SLOTS; s++) {
            if (used[s]) {
                continue;
            }

            if (stats->label_name[s].len == 0) {
                free = s;
                break;
            }

            if (free == NGX_HTTP_IDEMPOTENCY_LABEL_SLOTS) {
                free = s;
            }
        }

        /* free < SLOTS: nelts <= LABELS_MAX, half of them */

        used[free] = 1;
        l->slot = free;

        ngx_memzero(&stats->label[free],
                    sizeof(ngx_http_idempotency_label_stats_t));
        stats->label_name[free].len = l->name.len;
        ngx_memcpy(stats->label_name[free].data, l->name.data, l->name.len);
    }
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
    ngx_http_idempotency_stats_ctx = NULL;

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
            ngx_http_idempotency_stats_ctx = shm_zone[i].data;
            ngx_http_idempotency_stats = ngx_http_idempotency_stats_ctx->stats;
            return;
        }
    }
}


ngx_http_idempotency_stats_t *
ngx_http_idempotency_stats_get(void)
{
    return ngx_http_idempotency_stats;
}


ngx_http_idempotency_label_t **
ngx_http_idempotency_stats_labels(ngx_uint_t *n)
{
    if (ngx_http_idempotency_stats_ctx == NULL) {
        *n = 0;
        return NULL;
    }

    *n = ngx_http_idempotency_stats_ctx->labels.nelts;

    return ngx_http_idempotency_stats_ctx->labels.elts;
}


/*
 * A label's name is a Prometheus label value and a JSON member as it is:
 * letters, digits and "_-.:/", so that it needs no escaping anywhere
 */

char *
ngx_http_idempotency_stats_label_slot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    char  *p = conf;

    u_char                         c;
    ngx_str_t                     *value;
    ngx_uint_t                     i;
    ngx_http_idempotency_label_t  **field;

    field = (ngx_http_idempotency_label_t **) (p + cmd->offset);

    if (*field != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 0 || value[1].len > NGX_HTTP_IDEMPOTENCY_LABEL_LEN) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must be 1 to %d characters long",
                           &cmd->name, NGX_HTTP_IDEMPOTENCY_LABEL_LEN);
        return NGX_CONF_ERROR;
    }

    for (i = 0; i < value[1].len; i++) {
        c = value[1].data[i];

        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
            || (c >= '0' && c <= '9')
            || c == '_' || c == '-' || c == '.' || c == ':' || c == '/')
        {
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid \"%V\" name \"%V\": only letters, "
                           "digits and \"_-.:/\" are allowed",
                           &cmd->name, &value[1]);
        return NGX_CONF_ERROR;
    }

    *field = ngx_http_idempotency_stats_label(cf, &value[1]);

    return (*field != NULL) ? NGX_CONF_OK : NGX_CONF_ERROR;
}


ngx_int_t
ngx_http_idempotency_stats_label_merge(ngx_conf_t *cf,
    ngx_http_idempotency_label_t **label, ngx_http_idempotency_label_t *prev,
    ngx_flag_t enable)
{
    ngx_str_t  name = ngx_string(NGX_HTTP_IDEMPOTENCY_LABEL_DEFAULT);

    if (*label == NGX_CONF_UNSET_PTR) {
        *label = (prev == NGX_CONF_UNSET_PTR) ? NULL : prev;
    }

    /* the default name is known only where a location counts under it */

    if (*label == NULL && enable) {
        *label = ngx_http_idempotency_stats_label(cf, &name);

        if (*label == NULL) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* the configuration's label of that name, added when it is new */

static ngx_http_idempotency_label_t *
ngx_http_idempotency_stats_label(ngx_conf_t *cf, ngx_str_t *name)
{
    ngx_uint_t                          i;
    ngx_shm_zone_t                     *shm_zone;
    ngx_http_idempotency_label_t      **labels, *l, **lp;
    ngx_http_idempotency_stats_ctx_t   *ctx;

    shm_zone = ngx_http_idempotency_stats_shm(cf);
    if (shm_zone == NULL) {
        return NULL;
    }

    ctx = shm_zone->data;
    labels = ctx->labels.elts;

    for (i = 0; i < ctx->labels.nelts; i++) {
        if (labels[i]->name.len == name->len
            && ngx_strncmp(labels[i]->name.data, name->data, name->len) == 0)
        {
            return labels[i];
        }
    }

    if (ctx->labels.nelts == NGX_HTTP_IDEMPOTENCY_LABELS_MAX) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "too many idempotency_metrics_label names: at "
                           "most %d in one configuration, \"default\" "
                           "included where a location names none",
                           NGX_HTTP_IDEMPOTENCY_LABELS_MAX);
        return NULL;
    }

    l = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_label_t));
    lp = ngx_array_push(&ctx->labels);

    if (l == NULL || lp == NULL) {
        return NULL;
    }

    l->name = *name;
    *lp = l;

    return l;
}


void
ngx_http_idempotency_stat_inc(ngx_http_idempotency_stat_e which)
{
    if (ngx_http_idempotency_stats && which < NGX_HTTP_IDEMPOTENCY_STAT_N) {
        (void) ngx_atomic_fetch_add(
                           &ngx_http_idempotency_stats->counter[which], 1);
    }
}


/*
 * The slot was found when the configuration was read: here one atomic add
 * more than the node-wide count, no lookup (a cached HIT passes twice).
 */

void
ngx_http_idempotency_stat_count(ngx_http_idempotency_label_t *label,
    ngx_http_idempotency_stat_e which)
{
    ngx_int_t                      k;
    ngx_http_idempotency_stats_t  *stats;

    stats = ngx_http_idempotency_stats;

    if (stats == NULL) {
        return;
    }

    (void) ngx_atomic_fetch_add(&stats->counter[which], 1);

    k = ngx_http_idempotency_label_index(which);

    if (label != NULL && k >= 0) {
        (void) ngx_atomic_fetch_add(&stats->label[label->slot].counter[k], 1);
    }
}


void
ngx_http_idempotency_stat_label_inc(ngx_http_idempotency_label_t *label,
    ngx_http_idempotency_stat_e which)
{
    ngx_int_t                      k;
    ngx_http_idempotency_stats_t  *stats;

    stats = ngx_http_idempotency_stats;
    k = ngx_http_idempotency_label_index(which);

    if (stats != NULL && label != NULL && k >= 0) {
        (void) ngx_atomic_fetch_add(&stats->label[label->slot].counter[k], 1);
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
