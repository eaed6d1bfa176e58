/*
 * libFuzzer target: what the module does with Redis' answer to a claim,
 * "SET key record NX GET PX ms": in src/ngx_http_idempotency_claim.c,
 * ngx_http_idempotency_claim_handler() and claim_reply() check the reply
 * (nil, the record someone else wrote, an error), claim_record() and
 * claim_judge_record() decode and validate the record, keeping the reply's
 * string for a HIT; in src/ngx_http_idempotency_handler.c,
 * ngx_http_idempotency_decide() picks the outcome, and for HIT
 * ngx_http_idempotency_replay() turns the stored status, headers and body
 * into the response, from that string, after hiredis freed the reply
 * object (as it does right after the callback).
 *
 * The input is RESP, the bytes a Redis server (or something pretending to
 * be one) sends: hiredis' own reader turns it into the redisReply the
 * module gets, so every reply shape is reachable - wrong element types,
 * missing or extra elements, nil, nested arrays, empty and binary strings.
 * The claim's and the handler's files are compiled into this one (their
 * functions on this path are static); the nginx and module functions they
 * call on that path are stubs below, the others (and the rest of the
 * module) abort in fuzz_reply_stubs.c.  Pool allocations are separate heap
 * blocks of the exact size, so ASan sees a read one byte past any of them
 * (nginx' own pools would hide it).
 *
 * Checked beyond "no crash, no over-read": the claim's verdict resumes the
 * request exactly once, and the handler answers it exactly once (a problem
 * response, a replay or a pass to the content phase, which alone starts
 * the claim's renewal timer); a split record (its body in other keys) goes
 * to the body's fetch (body.c, not in this target) with its reply string
 * kept, and nothing is answered yet; a replay sends only what the record
 * held - a final status (200 to 599), header names and values that lie
 * inside the stored headers field (so no CR, LF or NUL: no response
 * splitting), names that are tokens, values without control bytes but
 * HTAB, none of the headers the capture never stores (hop-by-hop,
 * Content-Length, Transfer-Encoding, Date, Server, the replay marker:
 * nginx frames the replay itself), the body byte for byte; a record it
 * refuses leaves nothing of itself in the response, whether it answers
 * with a problem (idempotency_on_store_error closed, even input lengths)
 * or passes the request on (open, odd lengths).
 */

#include "../src/ngx_http_idempotency_claim.c"
#include "../src/ngx_http_idempotency_handler.c"

#include <stdio.h>
#include <stdlib.h>


#define check(cond)                                                          \
    do { if (!(cond)) { fuzz_fail(#cond, __LINE__); } } while (0)


static void
fuzz_fail(const char *what, int line)
{
    fprintf(stderr, "fuzz_reply.c:%d: property violated: %s\n", line, what);
    abort();
}


/* ---------------------------------------------------------------- stubs */

ngx_module_t          ngx_http_idempotency_module;
ngx_pid_t             ngx_pid;
ngx_uint_t            ngx_process;
volatile ngx_msec_t   ngx_current_msec;
volatile ngx_time_t  *ngx_cached_time;
ngx_rbtree_t          ngx_event_timer_rbtree;
volatile ngx_cycle_t *ngx_cycle;


/* each pool allocation is a heap block of its own, freed after the input */

#define MAX_BLOCKS  4096

static void        *blocks[MAX_BLOCKS];
static ngx_uint_t   nblocks;


static void *
fuzz_alloc(size_t size, int zero)
{
    void  *p;

    check(nblocks < MAX_BLOCKS);

    p = malloc(size ? size : 1);
    check(p != NULL);

    if (zero) {
        memset(p, 0, size);
    }

    blocks[nblocks++] = p;

    return p;
}


/* pool cleanups, run after the input as when the request's pool goes */

#define MAX_CLEANUPS  16

static ngx_pool_cleanup_t   cleanups[MAX_CLEANUPS];
static ngx_uint_t           ncleanups;


ngx_pool_cleanup_t *
ngx_pool_cleanup_add(ngx_pool_t *p, size_t size)
{
    (void) p;

    check(size == 0 && ncleanups < MAX_CLEANUPS);

    memset(&cleanups[ncleanups], 0, sizeof(ngx_pool_cleanup_t));

    return &cleanups[ncleanups++];
}


static void
fuzz_free_all(void)
{
    while (ncleanups) {
        ncleanups--;
        check(cleanups[ncleanups].handler != NULL);
        cleanups[ncleanups].handler(cleanups[ncleanups].data);
    }

    while (nblocks) {
        free(blocks[--nblocks]);
    }
}


void *
ngx_pnalloc(ngx_pool_t *pool, size_t size)
{
    (void) pool;
    return fuzz_alloc(size, 0);
}


void *
ngx_pcalloc(ngx_pool_t *pool, size_t size)
{
    (void) pool;
    return fuzz_alloc(size, 1);
}


void *
ngx_list_push(ngx_list_t *l)
{
    ngx_list_part_t  *last;

    last = l->last;

    if (last->nelts == l->nalloc) {
        last = fuzz_alloc(sizeof(ngx_list_part_t), 1);
        last->elts = fuzz_alloc(l->nalloc * l->size, 1);
        l->last->next = last;
        l->last = last;
    }

    return (char *) last->elts + l->size * last->nelts++;
}


void
ngx_log_error_core(ngx_uint_t level, ngx_log_t *log, ngx_err_t err,
    const char *fmt, ...)
{
    (void) level;
    (void) log;
    (void) err;
    (void) fmt;
}


ngx_int_t
ngx_strncasecmp(u_char *s1, u_char *s2, size_t n)
{
    ngx_uint_t  c1, c2;

    while (n) {
        c1 = (ngx_uint_t) *s1++;
        c2 = (ngx_uint_t) *s2++;

        c1 = (c1 >= 'A' && c1 <= 'Z') ? (c1 | 0x20) : c1;
        c2 = (c2 >= 'A' && c2 <= 'Z') ? (c2 | 0x20) : c2;

        if (c1 == c2) {
            if (c1) {
                n--;
                continue;
            }

            return 0;
        }

        return c1 - c2;
    }

    return 0;
}


/* the names the handler's log lines use (ngx_log_error_core drops them) */

u_char *
ngx_http_idempotency_key_hash(ngx_str_t *rkey)
{
    (void) rkey;
    return (u_char *) "0000000000000000";
}


ngx_str_t *
ngx_http_idempotency_outcome_name(ngx_http_idempotency_outcome_e outcome)
{
    static ngx_str_t  name = ngx_string("OUTCOME");

    (void) outcome;
    return &name;
}


const char *
ngx_http_idempotency_outcome_reason(ngx_http_idempotency_outcome_e outcome)
{
    (void) outcome;
    return "reason";
}


/* what the claim and the handler did with the request */

static ngx_int_t   sent_header, sent_body, finalized, problem, renewals,
                   resumed, fetching;
static ngx_http_idempotency_ctx_t  *cur;


/*
 * A claim that goes on to the content phase starts its renewal timer
 * (claim.c: ngx_add_timer(), which inserts the event into nginx' timer
 * tree): the only timer on this path.
 */

void
ngx_rbtree_insert(ngx_rbtree_t *tree, ngx_rbtree_node_t *node)
{
    check(tree == &ngx_event_timer_rbtree);
    check(node == &cur->renew_timer.timer);
    check(cur->state == NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED);
    renewals++;
}


/* the waiter of a woken duplicate: none here (conf.wait is 0) */

void
ngx_http_idempotency_wait_decided(ngx_http_idempotency_ctx_t *ctx)
{
    check(ctx == cur && ctx->waiter == NULL);
}


ngx_int_t
ngx_http_idempotency_wait_start(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_http_idempotency_wait_pt again)
{
    check(r == cur->request && ctx == cur);
    check(again == ngx_http_idempotency_claim_send);
    check(ctx->reply_kind == NGX_HTTP_IDEMPOTENCY_CONFLICT);

    return NGX_DECLINED;    /* idempotency_wait off: 409 at once */
}


/* as problem.c's */

void
ngx_http_idempotency_status_line(ngx_http_request_t *r)
{
    if (r->headers_out.status == 422) {
        ngx_str_set(&r->headers_out.status_line, "422 Unprocessable Entity");
    }
}


/*
 * A split record with our fingerprint: its head was decoded and validated,
 * its body (in other keys) is fetched next by body.c, which answers the
 * request later; the reply's string is the request's by now.
 */

ngx_int_t
ngx_http_idempotency_body_fetch(ngx_http_request_t *r,
    ngx_http_idempotency_ctx_t *ctx, ngx_http_idempotency_record_t *rec)
{
    check(r == cur->request && ctx == cur);
    check(rec->state == NGX_HTTP_IDEMPOTENCY_RECORD_SPLIT);
    check(ctx->reply_kind == NGX_HTTP_IDEMPOTENCY_HIT);
    check(ncleanups == 1);

    fetching = 1;
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_CLAIMING;   /* as body.c does */

    return NGX_AGAIN;
}


static void
check_str(ngx_str_t *s, ngx_str_t *field)
{
    size_t  i;

    /* inside the copy of the stored headers field: no CR, LF or NUL */

    check(s->data >= field->data);
    check(s->data + s->len <= field->data + field->len);

    for (i = 0; i < s->len; i++) {
        check(s->data[i] != '\r' && s->data[i] != '\n' && s->data[i] != '\0');
    }
}


/* a replayed header: a token for a name, no control byte but HTAB */

static void
check_token_value(ngx_table_elt_t *h)
{
    u_char      c;
    ngx_uint_t  i;

    for (i = 0; i < h->key.len; i++) {
        c = h->key.data[i];
        check((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')
              || (c >= 'A' && c <= 'Z')
              || (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL));
    }

    for (i = 0; i < h->value.len; i++) {
        c = h->value.data[i];
        check((c >= 0x20 && c != 0x7f) || c == '\t');
    }
}


/*
 * The replayed headers (or trailers, the stored "@Name: value" lines):
 * each from the stored header lines, but for the one replay marker the
 * handler adds to the headers; returns how many markers.
 */

static ngx_uint_t
check_replayed(ngx_list_t *list)
{
    ngx_uint_t        i, marker;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    marker = 0;
    part = &list->part;
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

        if (h[i].key.len == sizeof("Idempotent-Replayed") - 1
            && memcmp(h[i].key.data, "Idempotent-Replayed",
                      h[i].key.len) == 0
            && (h[i].key.data < cur->reply_headers.data
                || h[i].key.data >= cur->reply_headers.data
                                    + cur->reply_headers.len))
        {
            marker++;
            continue;
        }

        check(h[i].key.len > 0);
        check_str(&h[i].key, &cur->reply_headers);
        check_str(&h[i].value, &cur->reply_headers);

        /* never a header the capture leaves out (framing, hop-by-hop) */
        check(ngx_http_idempotency_record_header_replayable(h[i].key.data,
                                                            h[i].key.len));
        check_token_value(&h[i]);
    }

    return marker;
}


ngx_int_t
ngx_http_send_header(ngx_http_request_t *r)
{
    check(!sent_header);
    sent_header = 1;

    if (problem) {
        return NGX_OK;
    }

    /* a final status only: an interim or unknown one is a corrupt record */
    check(r->headers_out.status >= 200 && r->headers_out.status <= 599);
    check(r->headers_out.content_length_n == (off_t) cur->reply_body.len);

    if (r->headers_out.content_type.len) {
        check_str(&r->headers_out.content_type, &cur->reply_headers);
    }

    check(check_replayed(&r->headers_out.headers) == 1);
    check(check_replayed(&r->headers_out.trailers) == 0);

    /* stored trailers go out after the body, as nginx sends trailers */
    check(r->expect_trailers == (r->headers_out.trailers.part.nelts > 0));

    return NGX_OK;
}


ngx_int_t
ngx_http_output_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    size_t      n;
    ngx_buf_t  *b;

    (void) r;

    check(sent_header && !sent_body && !problem);
    sent_body = 1;

    check(in != NULL && in->next == NULL);
    b = in->buf;
    n = b->last - b->pos;

    check(b->last_buf);
    check(n == cur->reply_body.len);
    check(memcmp(b->pos, cur->reply_body.data, n) == 0);

    return NGX_OK;
}


ngx_int_t
ngx_http_send_special(ngx_http_request_t *r, ngx_uint_t flags)
{
    (void) r;

    check(sent_header && !sent_body && flags == NGX_HTTP_LAST);
    check(cur->reply_body.len == 0);
    sent_body = 1;

    return NGX_OK;
}


void
ngx_http_finalize_request(ngx_http_request_t *r, ngx_int_t rc)
{
    (void) r;
    (void) rc;

    check(!finalized);
    finalized = 1;
}


ngx_int_t
ngx_http_idempotency_send_problem(ngx_http_request_t *r,
    ngx_http_idempotency_outcome_e outcome)
{
    check(!sent_header);
    check(outcome != NGX_HTTP_IDEMPOTENCY_HIT
          && outcome != NGX_HTTP_IDEMPOTENCY_MISS);

    /* nothing of a record it refused goes out with the problem (its
       Content-Type is overwritten by the problem's own) */
    check(r->headers_out.headers.part.nelts == 0);
    check(r->headers_out.headers.part.next == NULL);
    check(r->headers_out.trailers.part.nelts == 0);
    check(!r->expect_trailers);
    check(r->headers_out.content_encoding == NULL);
    check(r->headers_out.etag == NULL);

    problem = 1;
    sent_header = 1;

    return NGX_OK;
}


/* the claim's verdict runs the request's phases again, once */

ngx_int_t
ngx_http_post_request(ngx_http_request_t *r, ngx_http_posted_request_t *pr)
{
    check(r == cur->request && pr == NULL);
    check(r->write_event_handler == ngx_http_core_run_phases);
    check(cur->state == NGX_HTTP_IDEMPOTENCY_STATE_DECIDED);
    check(!resumed && !fetching);
    resumed = 1;
    return NGX_OK;
}


void
ngx_http_run_posted_requests(ngx_connection_t *c)
{
    (void) c;
}


/* ---------------------------------------------------------------- target */


static int
huge_array(const uint8_t *data, size_t size)
{
    size_t  i, n;

    for (i = 0; i < size; i++) {
        if (data[i] != '*' || (i > 0 && data[i - 1] != '\n')) {
            continue;
        }

        for (n = 0, i++; i < size && data[i] >= '0' && data[i] <= '9'; i++) {
            n = n * 10 + (data[i] - '0');
            if (n > 64) {
                return 1;
            }
        }
    }

    return 0;
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    void                             *reply;
    ngx_int_t                         rc;
    ngx_log_t                         log;
    redisReader                      *reader;
    ngx_connection_t                  c;
    ngx_http_request_t               *r;
    ngx_http_idempotency_ctx_t       *ctx;
    ngx_http_idempotency_loc_conf_t   conf;

    /*
     * hiredis 0.14 allocates the element array of "*N" at once: a hostile
     * "*477777777" is a 3.8 GB calloc() inside hiredis, before the module
     * sees anything.  Not what this target is about: such inputs are
     * skipped (a claim reply is no array).
     */

    if (huge_array(data, size)) {
        return 0;
    }

    reader = redisReaderCreate();
    check(reader != NULL);

    reply = NULL;

    if (redisReaderFeed(reader, (const char *) data, size) != REDIS_OK
        || redisReaderGetReply(reader, &reply) != REDIS_OK
        || reply == NULL)
    {
        /* not one whole reply: hiredis' business, not the module's */
        if (reply) {
            freeReplyObject(reply);
        }
        redisReaderFree(reader);
        return 0;
    }

    memset(&log, 0, sizeof(log));
    memset(&c, 0, sizeof(c));
    c.log = &log;

    memset(&conf, 0, sizeof(conf));
    conf.wait = 0;      /* waiting needs nginx' timers: not here */

    /* idempotency_on_store_error: closed for even lengths, open for odd */
    conf.on_store_error = (size & 1) ? NGX_HTTP_IDEMPOTENCY_STORE_ERROR_OPEN
                                     : NGX_HTTP_IDEMPOTENCY_STORE_ERROR_CLOSED;

    r = fuzz_alloc(sizeof(ngx_http_request_t), 1);
    r->connection = &c;
    r->main = r;
    r->headers_out.headers.part.elts =
                                  fuzz_alloc(2 * sizeof(ngx_table_elt_t), 1);
    r->headers_out.headers.last = &r->headers_out.headers.part;
    r->headers_out.headers.size = sizeof(ngx_table_elt_t);
    r->headers_out.headers.nalloc = 2;
    r->headers_out.trailers.part.elts =
                                  fuzz_alloc(2 * sizeof(ngx_table_elt_t), 1);
    r->headers_out.trailers.last = &r->headers_out.trailers.part;
    r->headers_out.trailers.size = sizeof(ngx_table_elt_t);
    r->headers_out.trailers.nalloc = 2;
    r->headers_out.content_length_n = -1;

    ctx = fuzz_alloc(sizeof(ngx_http_idempotency_ctx_t), 1);
    ctx->request = r;
    ctx->conf = &conf;
    ctx->state = NGX_HTTP_IDEMPOTENCY_STATE_CLAIMING;
    ngx_str_set(&ctx->rkey, "idem:fuzz:key");

    /* the fingerprint of the seeds in corpus/reply: the others mismatch */
    memcpy(ctx->fingerprint, "0123456789abcdef0123456789abcdef"
                             "0123456789abcdef0123456789abcdef", 64);

    cur = ctx;
    sent_header = sent_body = finalized = problem = renewals = 0;
    resumed = fetching = 0;

    ngx_http_idempotency_claim_handler(ctx, reply,
                                       NGX_HTTP_IDEMPOTENCY_REDIS_OK);

    /* hiredis frees the reply right after the callback */
    freeReplyObject(reply);
    redisReaderFree(reader);

    check(ctx->op == NULL);

    if (fetching) {
        /* a split record: body.c answers once the body is there */
        check(!resumed && !sent_header && !finalized && renewals == 0);
        check(ctx->state == NGX_HTTP_IDEMPOTENCY_STATE_CLAIMING);
        fuzz_free_all();
        return 0;
    }

    check(resumed);
    check(ctx->state == NGX_HTTP_IDEMPOTENCY_STATE_DECIDED);

    rc = ngx_http_idempotency_decide(r, ctx);

    check(ctx->outcome == NGX_HTTP_IDEMPOTENCY_MISS || renewals == 0);

    switch (ctx->outcome) {

    case NGX_HTTP_IDEMPOTENCY_MISS:
        /* on to the content handler: nothing sent */
        check(rc == NGX_DECLINED && !sent_header && !finalized);
        check(ctx->state == NGX_HTTP_IDEMPOTENCY_STATE_CLAIMED);
        check(renewals == 1);
        break;

    case NGX_HTTP_IDEMPOTENCY_HIT:
        /* replayed, or refused as corrupt with a problem */
        check(rc == NGX_DONE && sent_header && finalized);
        check(problem || sent_body);
        break;

    case NGX_HTTP_IDEMPOTENCY_ERROR:
        if (conf.on_store_error == NGX_HTTP_IDEMPOTENCY_STORE_ERROR_OPEN) {
            /* passed on unprotected: nothing of the record goes along */
            check(rc == NGX_DECLINED && !sent_header && !finalized);
            check(r->headers_out.headers.part.nelts == 0);
            check(r->headers_out.trailers.part.nelts == 0);
            check(r->headers_out.content_encoding == NULL);
            check(r->headers_out.etag == NULL);
            check(r->headers_out.content_type.len == 0);
            break;
        }

        check(rc == NGX_DONE && problem && finalized);
        break;

    default:
        check(rc == NGX_DONE && problem && finalized);
        break;
    }

    fuzz_free_all();

    return 0;
}
