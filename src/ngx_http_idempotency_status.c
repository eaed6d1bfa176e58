/*
 * The "idempotency_status" location: the shared counters as JSON or in the
 * Prometheus text exposition format 0.0.4.  HTTP side; uses the records
 * layer's view of this worker's connections.
 */

#include "ngx_http_idempotency_status.h"
#include "ngx_http_idempotency_conf.h"
#include "ngx_http_idempotency_problem.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_cache.h"
#include "ngx_http_idempotency_stats.h"
#include "ngx_http_idempotency_version.h"


#define NGX_HTTP_IDEMPOTENCY_PREFIX  "nginx_idempotency_"


typedef enum {
    NGX_HTTP_IDEMPOTENCY_FORMAT_JSON = 0,
    NGX_HTTP_IDEMPOTENCY_FORMAT_PROMETHEUS
} ngx_http_idempotency_format_e;


/*
 * One counter: its Prometheus family (without the prefix) and label, its
 * JSON object and field.  A family's help text is on its first counter;
 * the counters of a family, and of a JSON object, follow each other.
 */
typedef struct {
    ngx_str_t                  family;
    ngx_str_t                  label;
    ngx_str_t                  group;
    ngx_str_t                  field;
    ngx_str_t                  help;
} ngx_http_idempotency_metric_t;


static ngx_int_t ngx_http_idempotency_status_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_idempotency_status_format(ngx_http_request_t *r,
    ngx_http_idempotency_format_e *format);
static ngx_uint_t ngx_http_idempotency_accept_q(ngx_str_t *accept,
    ngx_uint_t *prometheus);
static u_char *ngx_http_idempotency_status_json(u_char *p,
    ngx_http_idempotency_stats_t *stats);
static u_char *ngx_http_idempotency_status_prometheus(u_char *p,
    ngx_http_idempotency_stats_t *stats);
static u_char *ngx_http_idempotency_status_conns_json(u_char *p,
    ngx_http_idempotency_redis_conn_t *conns, ngx_uint_t n);
static u_char *ngx_http_idempotency_status_conns_prometheus(u_char *p,
    ngx_http_idempotency_redis_conn_t *conns, ngx_uint_t n);
static u_char *ngx_http_idempotency_status_conn_series(u_char *p,
    const char *name, ngx_http_idempotency_redis_conn_t *conn);
static u_char *ngx_http_idempotency_status_histogram_json(u_char *p,
    const char *head, ngx_atomic_t *bucket, ngx_atomic_uint_t sum);
static u_char *ngx_http_idempotency_status_histogram_prometheus(u_char *p,
    const char *family, const char *help, ngx_atomic_t *bucket,
    ngx_atomic_uint_t sum);
static u_char *ngx_http_idempotency_decimal(u_char *p, ngx_uint_t value,
    ngx_uint_t scale);
static ngx_atomic_uint_t ngx_http_idempotency_status_value(
    ngx_http_idempotency_stats_t *stats, ngx_uint_t i);
static u_char *ngx_http_idempotency_status_locations_json(u_char *p,
    ngx_http_idempotency_stats_t *stats);
static u_char *ngx_http_idempotency_status_locations_prometheus(u_char *p,
    ngx_http_idempotency_stats_t *stats);


#define ngx_http_idempotency_metric(family, label, group, field, help)        \
    { ngx_string(family), ngx_string(label), ngx_string(group),               \
      ngx_string(field), ngx_string(help) }


/* indexed by ngx_http_idempotency_stat_e */

static ngx_http_idempotency_metric_t  ngx_http_idempotency_metrics[] = {

    ngx_http_idempotency_metric("requests_total", "outcome=\"BYPASS\"",
        "requests", "BYPASS",
        "Requests in locations with idempotency on, by $idempotency_status."),
    ngx_http_idempotency_metric("requests_total", "outcome=\"MISS\"",
        "requests", "MISS", ""),
    ngx_http_idempotency_metric("requests_total", "outcome=\"HIT\"",
        "requests", "HIT", ""),
    ngx_http_idempotency_metric("requests_total", "outcome=\"CONFLICT\"",
        "requests", "CONFLICT", ""),
    ngx_http_idempotency_metric("requests_total", "outcome=\"MISMATCH\"",
        "requests", "MISMATCH", ""),
    ngx_http_idempotency_metric("requests_total", "outcome=\"MISSING\"",
        "requests", "MISSING", ""),
    ngx_http_idempotency_metric("requests_total", "outcome=\"INVALID\"",
        "requests", "INVALID", ""),
    ngx_http_idempotency_metric("requests_total", "outcome=\"OVERSIZE\"",
        "requests", "OVERSIZE", ""),
    ngx_http_idempotency_metric("requests_total", "outcome=\"ERROR\"",
        "requests", "ERROR", ""),
    ngx_http_idempotency_metric("requests_total", "outcome=\"UNSCOPED\"",
        "requests", "UNSCOPED", ""),
    ngx_http_idempotency_metric("requests_total", "outcome=\"UNKNOWN\"",
        "requests", "UNKNOWN", ""),

    ngx_http_idempotency_metric("responses_total", "result=\"stored\"",
        "responses", "stored",
        "Responses of claimed (MISS) requests, by what was done with them "
        "when they ended."),
    ngx_http_idempotency_metric("responses_total", "result=\"too_large\"",
        "responses", "too_large", ""),
    ngx_http_idempotency_metric("responses_total", "result=\"not_storable\"",
        "responses", "not_storable", ""),
    ngx_http_idempotency_metric("responses_total", "result=\"error_page\"",
        "responses", "error_page", ""),
    ngx_http_idempotency_metric("responses_total", "result=\"incomplete\"",
        "responses", "incomplete", ""),
    ngx_http_idempotency_metric("responses_total", "result=\"not_run\"",
        "responses", "not_run", ""),
    ngx_http_idempotency_metric("responses_total",
        "result=\"upstream_error\"", "responses", "upstream_error", ""),

    ngx_http_idempotency_metric("store_failures_total",
        "reason=\"claim_lost\"", "store_failures", "claim_lost",
        "Stores of a response that Redis did not record, by reason."),
    ngx_http_idempotency_metric("store_failures_total",
        "reason=\"redis_error\"", "store_failures", "redis_error", ""),
    ngx_http_idempotency_metric("store_failures_total",
        "reason=\"given_up\"", "store_failures", "given_up", ""),

    ngx_http_idempotency_metric("release_failures_total",
        "reason=\"redis_error\"", "release_failures", "redis_error",
        "Releases of a claim that Redis did not carry out, by reason."),
    ngx_http_idempotency_metric("release_failures_total",
        "reason=\"given_up\"", "release_failures", "given_up", ""),

    ngx_http_idempotency_metric("claims_lost_total", "", "claims", "lost",
        "Renewals that found their claim gone while its request ran."),

    ngx_http_idempotency_metric("redis_commands_total", "", "redis",
        "commands", "Commands (module scripts) sent to Redis."),
    ngx_http_idempotency_metric("redis_replies_total", "", "redis",
        "replies", "Replies received from Redis."),
    ngx_http_idempotency_metric("redis_error_replies_total", "", "redis",
        "error_replies", "Error replies received from Redis."),
    ngx_http_idempotency_metric("redis_timeouts_total", "", "redis",
        "timeouts", "Commands without a reply within the timeout."),
    ngx_http_idempotency_metric("redis_connection_errors_total", "", "redis",
        "connection_errors",
        "Redis connections that failed or were lost, handshake included."),
    ngx_http_idempotency_metric("redis_reconnects_total", "", "redis",
        "reconnects", "Connection attempts after a failure."),
    ngx_http_idempotency_metric("redis_parked_total", "", "redis",
        "parked", "Stores and releases kept in a worker for a retry."),
    ngx_http_idempotency_metric("redis_given_up_total", "", "redis",
        "given_up", "Stores and releases given up: deadline passed, retry "
        "buffer full, or the worker exiting."),

    ngx_http_idempotency_metric("redis_waits_total", "", "redis", "waits",
        "WAIT (WAITAOF) commands sent, one behind each batch of writes "
        "(wait_replicas=, wait_aof)."),
    ngx_http_idempotency_metric("redis_waited_total", "", "redis", "waited",
        "Claims, stores and renewals that counted once enough replicas "
        "acknowledged them."),
    ngx_http_idempotency_metric("redis_wait_short_total",
        "result=\"claim_refused\"", "redis_wait_short", "claim_refused",
        "Writes that too few replicas acknowledged within wait_timeout: "
        "claims answered as a Redis failure, stores sent again."),
    ngx_http_idempotency_metric("redis_wait_short_total",
        "result=\"store_resent\"", "redis_wait_short", "store_resent", ""),

    ngx_http_idempotency_metric("cache_hits_total", "", "cache", "hits",
        "Replays served from this node's idempotency_cache zones."),
    ngx_http_idempotency_metric("cache_misses_total", "", "cache", "misses",
        "Lookups in idempotency_cache zones that went on to Redis."),
    ngx_http_idempotency_metric("cache_evictions_total", "", "cache",
        "evictions", "Cached records removed to make room (least recently "
        "used first)."),
    ngx_http_idempotency_metric("cache_entries", "", "cache", "entries",
        "Entries in this node's idempotency_cache zones now."),
    ngx_http_idempotency_metric("cache_bytes", "", "cache", "bytes",
        "Bytes of the entries in this node's idempotency_cache zones now."),

    ngx_http_idempotency_metric("waits_woken_total", "by=\"notification\"",
        "waits", "notified",
        "Waiting duplicates (idempotency_wait) that found the first "
        "request's outcome, by what woke them."),
    ngx_http_idempotency_metric("waits_woken_total", "by=\"poll\"",
        "waits", "polled", "")
};


/*
 * The counters kept per idempotency_metrics_label, as families of their
 * own with the label "location" (a sum over a family is then never the
 * node's total twice): the counters first .. last of the table above.
 */
typedef struct {
    char                      *family;
    char                      *type;
    char                      *help;
    ngx_uint_t                 first;
    ngx_uint_t                 last;
} ngx_http_idempotency_location_family_t;


static ngx_http_idempotency_location_family_t
    ngx_http_idempotency_location_families[] = {

    { "location_requests_total", "counter",
      "Requests by location (idempotency_metrics_label) and "
      "$idempotency_status.",
      NGX_HTTP_IDEMPOTENCY_STAT_BYPASS, NGX_HTTP_IDEMPOTENCY_STAT_UNKNOWN },

    { "location_responses_total", "counter",
      "Responses of claimed (MISS) requests by location and result.",
      NGX_HTTP_IDEMPOTENCY_STAT_STORED,
      NGX_HTTP_IDEMPOTENCY_STAT_UPSTREAM_ERROR },

    { "location_cache_hits_total", "counter",
      "Replays served from this node's idempotency_cache zones, by "
      "location.",
      NGX_HTTP_IDEMPOTENCY_STAT_CACHE_HIT,
      NGX_HTTP_IDEMPOTENCY_STAT_CACHE_HIT },

    { "location_cache_misses_total", "counter",
      "Lookups in idempotency_cache zones that went on to Redis, by "
      "location.",
      NGX_HTTP_IDEMPOTENCY_STAT_CACHE_MISS,
      NGX_HTTP_IDEMPOTENCY_STAT_CACHE_MISS }
};


/* values now rather than counts: read from the cache zones */
#define ngx_http_idempotency_metric_gauge(i)                                 \
    ((i) == NGX_HTTP_IDEMPOTENCY_STAT_CACHE_ENTRIES                           \
     || (i) == NGX_HTTP_IDEMPOTENCY_STAT_CACHE_BYTES)


char *
ngx_http_idempotency_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->handler == ngx_http_idempotency_status_handler) {
        return "is duplicate";
    }

    if (ngx_http_idempotency_stats_zone(cf) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    clcf->handler = ngx_http_idempotency_status_handler;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_idempotency_status_handler(ngx_http_request_t *r)
{
    size_t                              size;
    ngx_int_t                           rc;
    ngx_str_t                           type;
    ngx_buf_t                          *b;
    ngx_uint_t                          i;
    ngx_table_elt_t                    *h;
    ngx_uint_t                          nconns, nlabels;
    ngx_array_t                        *redis;
    ngx_http_idempotency_stats_t       *stats;
    ngx_http_idempotency_format_e       format;
    ngx_http_idempotency_redis_conn_t  *conns;
    ngx_http_idempotency_main_conf_t   *imcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->hash = 1;
        ngx_str_set(&h->key, "Allow");
        ngx_str_set(&h->value, "GET, HEAD");

        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    if (ngx_http_idempotency_status_format(r, &format) != NGX_OK) {
        return NGX_HTTP_BAD_REQUEST;
    }

    stats = ngx_http_idempotency_stats_get();

    if (stats == NULL) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "idempotency status: no shared memory zone");
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* room for every line; the help texts are the longest part */

    size = 1024
           + 2 * (NGX_HTTP_IDEMPOTENCY_LATENCY_N + 3)
             * (128 + NGX_ATOMIC_T_LEN);

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_STAT_N; i++) {
        size += 3 * ngx_http_idempotency_metrics[i].family.len
                + ngx_http_idempotency_metrics[i].label.len
                + ngx_http_idempotency_metrics[i].group.len
                + ngx_http_idempotency_metrics[i].field.len
                + ngx_http_idempotency_metrics[i].help.len
                + 128 + NGX_ATOMIC_T_LEN;
    }

    /* the labels' counters: a line per counter and label in either format */

    (void) ngx_http_idempotency_stats_labels(&nlabels);

    size += (nlabels + 1) * NGX_HTTP_IDEMPOTENCY_LABEL_STATS
            * (128 + NGX_HTTP_IDEMPOTENCY_LABEL_LEN + NGX_ATOMIC_T_LEN);

    /* this worker's own Redis connections */

    conns = NULL;
    imcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_idempotency_module);
    redis = imcf ? &imcf->redis : NULL;
    nconns = ngx_http_idempotency_redis_conns(redis, NULL, 0);

    if (nconns) {
        conns = ngx_palloc(r->pool,
                           nconns * sizeof(ngx_http_idempotency_redis_conn_t));
        if (conns == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        nconns = ngx_min(nconns,
                         ngx_http_idempotency_redis_conns(redis, conns,
                                                          nconns));
        size += 2048;

        for (i = 0; i < nconns; i++) {
            size += 8 * (conns[i].name->len + 256 + NGX_OFF_T_LEN);
        }
    }

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (format == NGX_HTTP_IDEMPOTENCY_FORMAT_PROMETHEUS) {
        ngx_str_set(&type, "text/plain; version=0.0.4");
        b->last = ngx_http_idempotency_status_prometheus(b->last, stats);
        b->last = ngx_http_idempotency_status_locations_prometheus(b->last,
                                                                   stats);
        b->last = ngx_http_idempotency_status_conns_prometheus(b->last, conns,
                                                               nconns);

    } else {
        ngx_str_set(&type, "application/json");
        b->last = ngx_http_idempotency_status_json(b->last, stats);

        /* the document's last member, before its closing brace */
        b->last -= sizeof("\n}\n") - 1;
        b->last = ngx_http_idempotency_status_conns_json(b->last, conns,
                                                         nconns);
    }

    return ngx_http_idempotency_send_body(r, NGX_HTTP_OK, &type, b, 0);
}


/*
 * "?format=json|prometheus" first, then Accept: the Prometheus text format
 * for text/plain or application/openmetrics-text, JSON for
 * application/json, whichever has the higher q; JSON when neither is named
 * (curl's "*" "/" "*", a browser).
 */

static ngx_int_t
ngx_http_idempotency_status_format(ngx_http_request_t *r,
    ngx_http_idempotency_format_e *format)
{
    ngx_str_t         value;
    ngx_uint_t        i, q, json, prometheus, prom;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    *format = NGX_HTTP_IDEMPOTENCY_FORMAT_JSON;

    if (ngx_http_arg(r, (u_char *) "format", 6, &value) == NGX_OK) {

        if (value.len == 4 && ngx_strncmp(value.data, "json", 4) == 0) {
            return NGX_OK;
        }

        if (value.len == 10
            && ngx_strncmp(value.data, "prometheus", 10) == 0)
        {
            *format = NGX_HTTP_IDEMPOTENCY_FORMAT_PROMETHEUS;
            return NGX_OK;
        }

        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "idempotency status: unknown format \"%V\", "
                      "\"json\" or \"prometheus\" is expected", &value);
        return NGX_ERROR;
    }

    json = 0;
    prometheus = 0;

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len != sizeof("Accept") - 1
            || ngx_strncasecmp(h[i].key.data, (u_char *) "Accept",
                               sizeof("Accept") - 1) != 0)
        {
            continue;
        }

        q = ngx_http_idempotency_accept_q(&h[i].value, &prom);

        json = ngx_max(json, q);
        prometheus = ngx_max(prometheus, prom);
    }

    if (prometheus > json) {
        *format = NGX_HTTP_IDEMPOTENCY_FORMAT_PROMETHEUS;
    }

    return NGX_OK;
}


/*
 * The highest q (0 .. 1000) of application/json in an Accept value, and in
 * *prometheus that of text/plain and application/openmetrics-text.
 */

static ngx_uint_t
ngx_http_idempotency_accept_q(ngx_str_t *accept, ngx_uint_t *prometheus)
{
    u_char      *p, *end, *type, *type_end, *param;
    ngx_uint_t   q, json, digits;

    json = 0;
    *prometheus = 0;

    p = accept->data;
    end = p + accept->len;

    while (p < end) {

        while (p < end && (*p == ' ' || *p == '\t' || *p == ',')) {
            p++;
        }

        type = p;

        while (p < end && *p != ';' && *p != ',' && *p != ' '
               && *p != '\t')
        {
            p++;
        }

        type_end = p;
        q = 1000;

        /* parameters up to the next media range */

        while (p < end && *p != ',') {

            if (*p != ';') {
                p++;
                continue;
            }

            p++;

            while (p < end && (*p == ' ' || *p == '\t')) {
                p++;
            }

            param = p;

            if (end - param < 2
                || (param[0] != 'q' && param[0] != 'Q') || param[1] != '=')
            {
                continue;
            }

            /* qvalue: "0" [ "." 0*3DIGIT ] / "1" [ "." 0*3("0") ] */

            p = param + 2;
            q = 0;

            if (p < end && *p == '1') {
                q = 1000;
            }

            if (p < end && (*p == '0' || *p == '1')) {
                p++;
            }

            if (p < end && *p == '.' && q == 0) {
                p++;

                for (digits = 100; digits && p < end
                                   && *p >= '0' && *p <= '9'; digits /= 10)
                {
                    q += (*p++ - '0') * digits;
                }
            }
        }

        if (type_end - type == sizeof("application/json") - 1
            && ngx_strncasecmp(type, (u_char *) "application/json",
                               type_end - type) == 0)
        {
            json = ngx_max(json, q);

        } else if ((type_end - type == sizeof("text/plain") - 1
                    && ngx_strncasecmp(type, (u_char *) "text/plain",
                                       type_end - type) == 0)
                   || (type_end - type
                          == sizeof("application/openmetrics-text") - 1
                       && ngx_strncasecmp(type,
                                      (u_char *) "application/openmetrics-text",
                                      type_end - type) == 0))
        {
            *prometheus = ngx_max(*prometheus, q);
        }
    }

    return json;
}


static u_char *
ngx_http_idempotency_status_json(u_char *p,
    ngx_http_idempotency_stats_t *stats)
{
    ngx_uint_t                      i;
    ngx_atomic_uint_t               v;
    ngx_http_idempotency_metric_t  *m;

    p = ngx_sprintf(p, "{\n  \"version\": \"%s\"",
                    NGX_HTTP_IDEMPOTENCY_VERSION);

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_STAT_N; i++) {
        m = &ngx_http_idempotency_metrics[i];
        v = ngx_http_idempotency_status_value(stats, i);

        if (i == 0 || m->group.len != m[-1].group.len
            || ngx_strncmp(m->group.data, m[-1].group.data, m->group.len)
               != 0)
        {
            p = ngx_sprintf(p, "%s,\n  \"%V\": {", i ? "}" : "", &m->group);

        } else {
            p = ngx_sprintf(p, ", ");
        }

        p = ngx_sprintf(p, "\"%V\": %uA", &m->field, v);
    }

    p = ngx_sprintf(p, "}");
    p = ngx_http_idempotency_status_histogram_json(p,
                                   ",\n  \"redis_latency_ms\": ",
                                   stats->latency, stats->latency_sum);
    p = ngx_http_idempotency_status_histogram_json(p,
                                   ",\n  \"redis_wait_ms\": ",
                                   stats->wait, stats->wait_sum);

    p = ngx_http_idempotency_status_locations_json(p, stats);

    return ngx_sprintf(p, "\n}\n");
}


/* head, then {"buckets": {...}, "sum": ms, "count": n} */

static u_char *
ngx_http_idempotency_status_histogram_json(u_char *p, const char *head,
    ngx_atomic_t *bucket, ngx_atomic_uint_t sum)
{
    ngx_uint_t  n, count;

    p = ngx_sprintf(p, "%s{\"buckets\": {", head);

    count = 0;

    for (n = 0; n <= NGX_HTTP_IDEMPOTENCY_LATENCY_N; n++) {
        count += bucket[n];

        if (n < NGX_HTTP_IDEMPOTENCY_LATENCY_N) {
            *p++ = '"';
            p = ngx_http_idempotency_decimal(p,
                                    ngx_http_idempotency_latency_bounds[n], 3);
            p = ngx_sprintf(p, "\": %ui, ", count);

        } else {
            p = ngx_sprintf(p, "\"+Inf\": %ui}, ", count);
        }
    }

    return ngx_sprintf(p, "\"sum\": %uA.%03uA, \"count\": %ui}",
                       sum / 1000, sum % 1000, count);
}


/*
 * "locations": an object per label, in the order the configuration names
 * them, with the groups and members of the node-wide counters it keeps
 */

static u_char *
ngx_http_idempotency_status_locations_json(u_char *p,
    ngx_http_idempotency_stats_t *stats)
{
    ngx_uint_t                               i, f, k, n;
    ngx_http_idempotency_metric_t           *m;
    ngx_http_idempotency_label_t           **labels;
    ngx_http_idempotency_location_family_t  *lf;

    labels = ngx_http_idempotency_stats_labels(&n);

    p = ngx_sprintf(p, ",\n  \"locations\": {");

    for (i = 0; i < n; i++) {
        p = ngx_sprintf(p, "%s\n    \"%V\": {", i ? "," : "",
                        &labels[i]->name);

        for (f = 0; f < sizeof(ngx_http_idempotency_location_families)
                        / sizeof(ngx_http_idempotency_location_family_t);
             f++)
        {
            lf = &ngx_http_idempotency_location_families[f];

            for (k = lf->first; k <= lf->last; k++) {
                m = &ngx_http_idempotency_metrics[k];

                if (k == lf->first
                    && (f == 0
                        || m->group.len != m[-1].group.len
                        || ngx_strncmp(m->group.data, m[-1].group.data,
                                       m->group.len) != 0))
                {
                    p = ngx_sprintf(p, "%s\"%V\": {", f ? "}, " : "",
                                    &m->group);

                } else {
                    p = ngx_sprintf(p, ", ");
                }

                p = ngx_sprintf(p, "\"%V\": %uA", &m->field,
                    stats->label[labels[i]->slot]
                        .counter[ngx_http_idempotency_label_index(k)]);
            }
        }

        p = ngx_sprintf(p, "}}");
    }

    return ngx_sprintf(p, "%s}", n ? "\n  " : "");
}


static u_char *
ngx_http_idempotency_status_locations_prometheus(u_char *p,
    ngx_http_idempotency_stats_t *stats)
{
    ngx_uint_t                               i, f, k, n;
    ngx_atomic_uint_t                        v;
    ngx_http_idempotency_metric_t           *m;
    ngx_http_idempotency_label_t           **labels;
    ngx_http_idempotency_location_family_t  *lf;

    labels = ngx_http_idempotency_stats_labels(&n);

    if (n == 0) {
        return p;
    }

    for (f = 0; f < sizeof(ngx_http_idempotency_location_families)
                    / sizeof(ngx_http_idempotency_location_family_t); f++)
    {
        lf = &ngx_http_idempotency_location_families[f];

        p = ngx_sprintf(p,
                "# HELP " NGX_HTTP_IDEMPOTENCY_PREFIX "%s %s\n"
                "# TYPE " NGX_HTTP_IDEMPOTENCY_PREFIX "%s %s\n",
                lf->family, lf->help, lf->family, lf->type);

        for (i = 0; i < n; i++) {
            for (k = lf->first; k <= lf->last; k++) {
                m = &ngx_http_idempotency_metrics[k];
                v = stats->label[labels[i]->slot]
                        .counter[ngx_http_idempotency_label_index(k)];

                p = ngx_sprintf(p, NGX_HTTP_IDEMPOTENCY_PREFIX "%s{location="
                                "\"%V\"%s%V} %uA\n",
                                lf->family, &labels[i]->name,
                                m->label.len ? "," : "", &m->label, v);
            }
        }
    }

    return p;
}


static u_char *
ngx_http_idempotency_status_prometheus(u_char *p,
    ngx_http_idempotency_stats_t *stats)
{
    ngx_uint_t                      i;
    ngx_atomic_uint_t               v;
    ngx_http_idempotency_metric_t  *m;

    p = ngx_sprintf(p,
            "# HELP " NGX_HTTP_IDEMPOTENCY_PREFIX "info "
            "Version of ngx_http_idempotency_module.\n"
            "# TYPE " NGX_HTTP_IDEMPOTENCY_PREFIX "info gauge\n"
            NGX_HTTP_IDEMPOTENCY_PREFIX "info{version=\"%s\"} 1\n",
            NGX_HTTP_IDEMPOTENCY_VERSION);

    for (i = 0; i < NGX_HTTP_IDEMPOTENCY_STAT_N; i++) {
        m = &ngx_http_idempotency_metrics[i];
        v = ngx_http_idempotency_status_value(stats, i);

        if (m->help.len) {
            p = ngx_sprintf(p,
                    "# HELP " NGX_HTTP_IDEMPOTENCY_PREFIX "%V %V\n"
                    "# TYPE " NGX_HTTP_IDEMPOTENCY_PREFIX "%V %s\n",
                    &m->family, &m->help, &m->family,
                    ngx_http_idempotency_metric_gauge(i)
                    ? "gauge" : "counter");
        }

        p = ngx_sprintf(p, NGX_HTTP_IDEMPOTENCY_PREFIX "%V", &m->family);

        if (m->label.len) {
            p = ngx_sprintf(p, "{%V}", &m->label);
        }

        p = ngx_sprintf(p, " %uA\n", v);
    }

    p = ngx_http_idempotency_status_histogram_prometheus(p,
            "redis_latency_seconds",
            "Round trips of commands to Redis, from sending to the reply.",
            stats->latency, stats->latency_sum);

    return ngx_http_idempotency_status_histogram_prometheus(p,
            "redis_wait_seconds",
            "Time a WAIT (WAITAOF) took, from sending to the reply "
            "(wait_replicas=, wait_aof).",
            stats->wait, stats->wait_sum);
}


static u_char *
ngx_http_idempotency_status_histogram_prometheus(u_char *p,
    const char *family, const char *help, ngx_atomic_t *bucket,
    ngx_atomic_uint_t sum)
{
    ngx_uint_t  n, count;

    p = ngx_sprintf(p,
            "# HELP " NGX_HTTP_IDEMPOTENCY_PREFIX "%s %s\n"
            "# TYPE " NGX_HTTP_IDEMPOTENCY_PREFIX "%s histogram\n",
            family, help, family);

    count = 0;

    for (n = 0; n <= NGX_HTTP_IDEMPOTENCY_LATENCY_N; n++) {
        count += bucket[n];

        p = ngx_sprintf(p, NGX_HTTP_IDEMPOTENCY_PREFIX "%s_bucket{le=\"",
                        family);

        if (n < NGX_HTTP_IDEMPOTENCY_LATENCY_N) {
            p = ngx_http_idempotency_decimal(p,
                                    ngx_http_idempotency_latency_bounds[n], 6);

        } else {
            p = ngx_sprintf(p, "+Inf");
        }

        p = ngx_sprintf(p, "\"} %ui\n", count);
    }

    return ngx_sprintf(p,
            NGX_HTTP_IDEMPOTENCY_PREFIX "%s_sum %uA.%06uA\n"
            NGX_HTTP_IDEMPOTENCY_PREFIX "%s_count %ui\n",
            family, sum / 1000000, sum % 1000000, family, count);
}


static ngx_atomic_uint_t
ngx_http_idempotency_status_value(ngx_http_idempotency_stats_t *stats,
    ngx_uint_t i)
{
    size_t      bytes;
    ngx_uint_t  entries;

    if (!ngx_http_idempotency_metric_gauge(i)) {
        return stats->counter[i];
    }

    ngx_http_idempotency_cache_totals(&entries, &bytes);

    return (i == NGX_HTTP_IDEMPOTENCY_STAT_CACHE_ENTRIES) ? entries : bytes;
}


/*
 * The Redis connections of the worker that answers (a gauge is a value
 * now; each worker has its own connections): "redis_connections", an
 * array, the JSON document's last member, which closes it.
 */

static u_char *
ngx_http_idempotency_status_conns_json(u_char *p,
    ngx_http_idempotency_redis_conn_t *conns, ngx_uint_t n)
{
    ngx_uint_t  i;

    p = ngx_sprintf(p, ",\n  \"redis_connections\": [");

    for (i = 0; i < n; i++) {
        p = ngx_sprintf(p, "%s\n    {\"pid\": %P, \"redis\": \"",
                        i ? "," : "", ngx_pid);
        p = (u_char *) ngx_escape_json(p, conns[i].name->data,
                                       conns[i].name->len);
        p = ngx_sprintf(p, "\", \"connection\": \"%s\", \"ready\": %s, "
                        "\"in_flight\": %ui, \"in_flight_bytes\": %uz, "
                        "\"commands\": %uL, \"parked\": %ui, "
                        "\"parked_bytes\": %uz, \"retried\": %ui, "
                        "\"given_up\": %ui, \"maxmemory_policy\": \"%V\"}",
                        conns[i].bulk ? "bulk" : "main",
                        conns[i].ready ? "true" : "false",
                        conns[i].in_flight, conns[i].in_flight_bytes,
                        conns[i].commands, conns[i].stats.parked,
                        conns[i].stats.parked_bytes, conns[i].stats.retried,
                        conns[i].stats.given_up, &conns[i].policy);
    }

    return ngx_sprintf(p, "%s]\n}\n", n ? "\n  " : "");
}


static u_char *
ngx_http_idempotency_status_conns_prometheus(u_char *p,
    ngx_http_idempotency_redis_conn_t *conns, ngx_uint_t n)
{
    ngx_uint_t                i, k;
    uint64_t                  v;
    static const char * const  family[] = {
        "redis_in_flight", "gauge",
        "Commands of this worker's Redis connection awaiting their reply.",
        "redis_in_flight_bytes", "gauge",
        "Bytes of those commands.",
        "redis_parked", "gauge",
        "Stores and releases this worker keeps for a retry on it.",
        "redis_parked_bytes", "gauge",
        "Bytes of those commands.",
        "redis_connection_commands_total", "counter",
        "Commands this worker handed to the connection since it started."
    };

    if (n == 0) {
        return p;
    }

    for (k = 0; k < 5; k++) {
        p = ngx_sprintf(p,
                "# HELP " NGX_HTTP_IDEMPOTENCY_PREFIX "%s %s\n"
                "# TYPE " NGX_HTTP_IDEMPOTENCY_PREFIX "%s %s\n",
                family[3 * k], family[3 * k + 2], family[3 * k],
                family[3 * k + 1]);

        for (i = 0; i < n; i++) {
            switch (k) {
            case 0:
                v = conns[i].in_flight;
                break;
            case 1:
                v = conns[i].in_flight_bytes;
                break;
            case 2:
                v = conns[i].stats.parked;
                break;
            case 3:
                v = conns[i].stats.parked_bytes;
                break;
            default:
                v = conns[i].commands;
                break;
            }

            p = ngx_http_idempotency_status_conn_series(p, family[3 * k],
                                                        &conns[i]);
            p = ngx_sprintf(p, "} %uL\n", v);
        }
    }

    /* an info family: the policy is a label, 1 the value; unknown: none */

    p = ngx_sprintf(p,
            "# HELP " NGX_HTTP_IDEMPOTENCY_PREFIX "redis_maxmemory_policy "
            "The eviction policy of the connection's server, read at its "
            "handshake (volatile-* and allkeys-* may evict claims and "
            "records).\n"
            "# TYPE " NGX_HTTP_IDEMPOTENCY_PREFIX "redis_maxmemory_policy "
            "gauge\n");

    for (i = 0; i < n; i++) {
        if (conns[i].policy.len == 0) {
            continue;
        }

        p = ngx_http_idempotency_status_conn_series(p,
                                                    "redis_maxmemory_policy",
                                                    &conns[i]);
        p = ngx_sprintf(p, ",policy=\"");
        p = (u_char *) ngx_escape_json(p, conns[i].policy.data,
                                       conns[i].policy.len);
        p = ngx_sprintf(p, "\"} 1\n");
    }

    return p;
}


/* a connection's series up to its labels' end: 'name{pid=..,connection=..' */

static u_char *
ngx_http_idempotency_status_conn_series(u_char *p, const char *name,
    ngx_http_idempotency_redis_conn_t *conn)
{
    p = ngx_sprintf(p, NGX_HTTP_IDEMPOTENCY_PREFIX "%s{pid=\"%P\",redis=\"",
                    name, ngx_pid);
    p = (u_char *) ngx_escape_json(p, conn->name->data, conn->name->len);

    return ngx_sprintf(p, "\",connection=\"%s\"",
                       conn->bulk ? "bulk" : "main");
}


/* value / 10^scale, without trailing zeros: 2500, 3 -> "2.5" */

static u_char *
ngx_http_idempotency_decimal(u_char *p, ngx_uint_t value, ngx_uint_t scale)
{
    ngx_uint_t  div, frac, i;

    for (div = 1, i = 0; i < scale; i++) {
        div *= 10;
    }

    p = ngx_sprintf(p, "%ui", value / div);

    frac = value % div;

    if (frac == 0) {
        return p;
    }

    *p++ = '.';

    while (frac) {
        div /= 10;
        *p++ = (u_char) ('0' + frac / div);
        frac %= div;
    }

    return p;
}
