/*
 * Observability: counters shared by all workers, and the short key hash
 * that names a record in the error log.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_STATS_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_STATS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <hiredis/hiredis.h>


/*
 * What is counted.  The order is the order of the output; the names and
 * help texts are in ngx_http_idempotency_status.c.  The request outcomes
 * come first, in the order of ngx_http_idempotency_outcome_e.
 */
typedef enum {
    NGX_HTTP_IDEMPOTENCY_STAT_BYPASS = 0,
    NGX_HTTP_IDEMPOTENCY_STAT_MISS,
    NGX_HTTP_IDEMPOTENCY_STAT_HIT,
    NGX_HTTP_IDEMPOTENCY_STAT_CONFLICT,
    NGX_HTTP_IDEMPOTENCY_STAT_MISMATCH,
    NGX_HTTP_IDEMPOTENCY_STAT_MISSING,
    NGX_HTTP_IDEMPOTENCY_STAT_INVALID,
    NGX_HTTP_IDEMPOTENCY_STAT_OVERSIZE,
    NGX_HTTP_IDEMPOTENCY_STAT_ERROR,
    NGX_HTTP_IDEMPOTENCY_STAT_UNSCOPED,
    NGX_HTTP_IDEMPOTENCY_STAT_UNKNOWN,

    /* what happened to the response of a claimed (MISS) request */
    NGX_HTTP_IDEMPOTENCY_STAT_STORED,          /* sent to Redis to record */
    NGX_HTTP_IDEMPOTENCY_STAT_TOO_LARGE,       /* not-replayable marker */
    NGX_HTTP_IDEMPOTENCY_STAT_NOT_STORABLE,    /* idempotency_store_status */
    NGX_HTTP_IDEMPOTENCY_STAT_ERROR_PAGE,      /* replaced by error_page */
    NGX_HTTP_IDEMPOTENCY_STAT_INCOMPLETE,      /* ended early: held, unknown */
    NGX_HTTP_IDEMPOTENCY_STAT_NOT_RUN,         /* ended before it ran */
    NGX_HTTP_IDEMPOTENCY_STAT_UPSTREAM_ERROR,  /* nginx's 502/504, sent */

    /* a store or release that Redis did not carry out */
    NGX_HTTP_IDEMPOTENCY_STAT_STORE_CLAIM_LOST,
    NGX_HTTP_IDEMPOTENCY_STAT_STORE_REDIS_ERROR,
    NGX_HTTP_IDEMPOTENCY_STAT_STORE_GIVEN_UP,
    NGX_HTTP_IDEMPOTENCY_STAT_RELEASE_REDIS_ERROR,
    NGX_HTTP_IDEMPOTENCY_STAT_RELEASE_GIVEN_UP,
    NGX_HTTP_IDEMPOTENCY_STAT_CLAIM_LOST,      /* found gone by a renewal */

    /* the Redis connections of all workers */
    NGX_HTTP_IDEMPOTENCY_STAT_REDIS_COMMANDS,
    NGX_HTTP_IDEMPOTENCY_STAT_REDIS_REPLIES,
    NGX_HTTP_IDEMPOTENCY_STAT_REDIS_ERROR_REPLIES,
    NGX_HTTP_IDEMPOTENCY_STAT_REDIS_TIMEOUTS,
    NGX_HTTP_IDEMPOTENCY_STAT_REDIS_CONNECTION_ERRORS,
    NGX_HTTP_IDEMPOTENCY_STAT_REDIS_RECONNECTS,
    NGX_HTTP_IDEMPOTENCY_STAT_REDIS_PARKED,
    NGX_HTTP_IDEMPOTENCY_STAT_REDIS_GIVEN_UP,

    /* wait_replicas=, wait_aof: WAITs sent, writes they acknowledged,
     * writes short of acknowledgements (claims refused, stores resent) */
    NGX_HTTP_IDEMPOTENCY_STAT_REDIS_WAITS,
    NGX_HTTP_IDEMPOTENCY_STAT_REDIS_WAITED,
    NGX_HTTP_IDEMPOTENCY_STAT_REDIS_WAIT_REFUSED,
    NGX_HTTP_IDEMPOTENCY_STAT_REDIS_WAIT_RESENT,

    /* the replay cache (idempotency_cache) of this node */
    NGX_HTTP_IDEMPOTENCY_STAT_CACHE_HIT,
    NGX_HTTP_IDEMPOTENCY_STAT_CACHE_MISS,
    NGX_HTTP_IDEMPOTENCY_STAT_CACHE_EVICTED,
    NGX_HTTP_IDEMPOTENCY_STAT_CACHE_ENTRIES,   /* gauges, read from zones */
    NGX_HTTP_IDEMPOTENCY_STAT_CACHE_BYTES,
    /* waiting duplicates (idempotency_wait) that found the outcome */
    NGX_HTTP_IDEMPOTENCY_STAT_WAIT_NOTIFIED,   /* woken by a notification */
    NGX_HTTP_IDEMPOTENCY_STAT_WAIT_POLLED,     /* by their fallback poll */

    NGX_HTTP_IDEMPOTENCY_STAT_N
} ngx_http_idempotency_stat_e;


/* upper bounds of the Redis round-trip histogram, in microseconds */
#define NGX_HTTP_IDEMPOTENCY_LATENCY_BOUNDS                                   \
    500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,       \
    1000000

#define NGX_HTTP_IDEMPOTENCY_LATENCY_N     11      /* + one for +Inf */

/* "key_hash=" and this many hex digits of sha256(Redis key) */
#define NGX_HTTP_IDEMPOTENCY_KEY_HASH_LEN  16


/*
 * idempotency_metrics_label: names per configuration (nginx -t refuses
 * more), and slots in the zone, twice as many, so that a reload's new
 * names find room while the old workers still count under the old ones
 */
#define NGX_HTTP_IDEMPOTENCY_LABELS_MAX     64
#define NGX_HTTP_IDEMPOTENCY_LABEL_SLOTS  (2 * NGX_HTTP_IDEMPOTENCY_LABELS_MAX)
#define NGX_HTTP_IDEMPOTENCY_LABEL_LEN      64
#define NGX_HTTP_IDEMPOTENCY_LABEL_DEFAULT  "default"

/*
 * What a label counts: the cache lookups, the request outcomes and the
 * responses' results (ngx_http_idempotency_label_index() maps them); a
 * slot is 24 counters, three cache lines, the cache hit and the HIT
 * outcome on its first
 */
#define NGX_HTTP_IDEMPOTENCY_LABEL_STATS                                      \
    (2 + NGX_HTTP_IDEMPOTENCY_STAT_UPSTREAM_ERROR + 1)
#define NGX_HTTP_IDEMPOTENCY_LABEL_STRIDE   24


/* one label's counters in the zone */
typedef struct {
    ngx_atomic_t               counter[NGX_HTTP_IDEMPOTENCY_LABEL_STRIDE];
} ngx_http_idempotency_label_stats_t;


/* the name a slot belongs to: only the master reads it, at (re)load */
typedef struct {
    size_t                     len;
    u_char                     data[NGX_HTTP_IDEMPOTENCY_LABEL_LEN];
} ngx_http_idempotency_label_name_t;


/* one name of this configuration, and its slot in the zone */
typedef struct {
    ngx_str_t                  name;
    ngx_uint_t                 slot;
} ngx_http_idempotency_label_t;


/*
 * The counters in shared memory, read by the status handler.  The labels'
 * slots first: the struct takes whole pages of the slab pool, so each slot
 * starts on a cache line.
 */
typedef struct {
    ngx_http_idempotency_label_stats_t  label[
                                        NGX_HTTP_IDEMPOTENCY_LABEL_SLOTS];
    ngx_http_idempotency_label_name_t   label_name[
                                        NGX_HTTP_IDEMPOTENCY_LABEL_SLOTS];
    size_t                     size;    /* of this struct, for reuse */
    ngx_atomic_t               counter[NGX_HTTP_IDEMPOTENCY_STAT_N];
    ngx_atomic_t               latency[NGX_HTTP_IDEMPOTENCY_LATENCY_N + 1];
    ngx_atomic_t               latency_sum;   /* microseconds */
    ngx_atomic_t               wait[NGX_HTTP_IDEMPOTENCY_LATENCY_N + 1];
    ngx_atomic_t               wait_sum;      /* microseconds */
} ngx_http_idempotency_stats_t;


ngx_int_t ngx_http_idempotency_stats_zone(ngx_conf_t *cf);
void ngx_http_idempotency_stats_init_process(ngx_cycle_t *cycle);

/* NULL where no zone was configured */
ngx_http_idempotency_stats_t *ngx_http_idempotency_stats_get(void);
extern const ngx_uint_t  ngx_http_idempotency_latency_bounds[];

/* this worker's configuration's labels, in the order they were named */
ngx_http_idempotency_label_t **ngx_http_idempotency_stats_labels(
    ngx_uint_t *n);

/*
 * idempotency_metrics_label NAME: a slot setter (the label at
 * cmd->offset of the conf); and the label a location counts under when it
 * names none, for the merge
 */
char *ngx_http_idempotency_stats_label_slot(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
ngx_int_t ngx_http_idempotency_stats_label_merge(ngx_conf_t *cf,
    ngx_http_idempotency_label_t **label, ngx_http_idempotency_label_t *prev,
    ngx_flag_t enable);

/* a stat_e's counter in a label's slot, or -1: not counted per label */
static ngx_inline ngx_int_t
ngx_http_idempotency_label_index(ngx_uint_t which)
{
    if (which <= NGX_HTTP_IDEMPOTENCY_STAT_UPSTREAM_ERROR) {
        return which + 2;
    }

    if (which == NGX_HTTP_IDEMPOTENCY_STAT_CACHE_HIT
        || which == NGX_HTTP_IDEMPOTENCY_STAT_CACHE_MISS)
    {
        return which - NGX_HTTP_IDEMPOTENCY_STAT_CACHE_HIT;
    }

    return -1;
}

void ngx_http_idempotency_stat_inc(ngx_http_idempotency_stat_e which);

/* counts "which" node-wide and under the label (NULL: node-wide only) */
void ngx_http_idempotency_stat_count(ngx_http_idempotency_label_t *label,
    ngx_http_idempotency_stat_e which);

/* under the label only: what another layer counts node-wide */
void ngx_http_idempotency_stat_label_inc(ngx_http_idempotency_label_t *label,
    ngx_http_idempotency_stat_e which);

/* counts a command sent to Redis; returns its start for stat_reply() */
uint64_t ngx_http_idempotency_stat_command(void);

/* counts a reply (and an error reply) and its round trip since start */
void ngx_http_idempotency_stat_reply(redisReply *reply, uint64_t start);

/* counts a WAIT sent, returns its start; its reply: the time it took */
uint64_t ngx_http_idempotency_stat_wait_start(void);
void ngx_http_idempotency_stat_wait_done(uint64_t start);

/*
 * sha256 of the Redis key, 16 hex digits, NUL-terminated, in a static
 * buffer (overwritten by the next call): names a record in the error log
 * without the client's key, which may carry secrets
 */
u_char *ngx_http_idempotency_key_hash(ngx_str_t *rkey);


#endif /* _NGX_HTTP_IDEMPOTENCY_STATS_H_INCLUDED_ */
