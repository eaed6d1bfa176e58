/*
 * For fuzz_reply.c: what the claim's and the handler's files refer to but
 * the path from a claim reply to the answer never calls.  Each aborts, so
 * a path that does reach one shows up as a crash with this name on top.
 * Kept apart from fuzz_reply.c, without prototypes, so that a changed
 * signature in the module's headers does not break this build; weak, so
 * that a definition that moves into one of those files (or into
 * fuzz_reply.c) wins.
 */

#include <stdio.h>
#include <stdlib.h>


#define STUB(name)                                                           \
    __attribute__((weak)) void name(void);                                   \
    __attribute__((weak)) void name(void)                                    \
    {                                                                        \
        fprintf(stderr, "fuzz_reply: %s() called, not expected\n", #name);  \
        abort();                                                             \
    }

/* nginx */
STUB(ngx_http_core_run_phases)
STUB(ngx_http_read_client_request_body)
STUB(ngx_http_complex_value)
STUB(ngx_palloc)
STUB(ngx_hex_dump)
STUB(ngx_sprintf)
STUB(ngx_rbtree_delete)

/* the module, outside claim.c and handler.c */
STUB(ngx_http_idempotency_ctx_create)
STUB(ngx_http_idempotency_get_ctx)
STUB(ngx_http_idempotency_settle)
STUB(ngx_http_idempotency_abandon)
STUB(ngx_http_idempotency_upstream_reached)
STUB(ngx_http_idempotency_body_start)
STUB(ngx_http_idempotency_body_fingerprint)
STUB(ngx_http_idempotency_body_stream)
STUB(ngx_http_idempotency_cache_get)
STUB(ngx_http_idempotency_cache_fetched)
STUB(ngx_http_idempotency_hold_leave)
STUB(ngx_http_idempotency_wait_end)
STUB(ngx_http_idempotency_redis_script)
STUB(ngx_http_idempotency_redis_forget)
STUB(ngx_http_idempotency_scope_hash)
STUB(ngx_http_idempotency_scope_empty_log)
STUB(ngx_http_idempotency_stat_inc)
STUB(ngx_http_idempotency_stat_count)
STUB(ngx_http_idempotency_stat_label_inc)
