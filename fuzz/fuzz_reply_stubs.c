/*
 * For fuzz_reply.c: what the handler's file refers to but the path from a
 * claim reply to the answer never calls.  Each aborts, so a path that does
 * reach one shows up as a crash with this name on top.  Kept apart from
 * fuzz_reply.c, without prototypes, so that a changed signature in the
 * module's headers does not break this build; weak, so that a definition
 * that moves into the handler's file wins.
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

STUB(ngx_http_core_run_phases)
STUB(ngx_http_read_client_request_body)
STUB(ngx_http_complex_value)
STUB(ngx_read_file)
STUB(ngx_hex_dump)
STUB(ngx_sprintf)
STUB(ngx_rbtree_insert)
STUB(ngx_rbtree_delete)
STUB(ngx_http_idempotency_get_ctx)
STUB(ngx_http_idempotency_settle)
STUB(ngx_http_idempotency_redis_script)
STUB(ngx_http_idempotency_redis_script_retry)
STUB(ngx_http_idempotency_redis_cancel)
STUB(ngx_http_idempotency_redis_stats)
STUB(ngx_http_idempotency_status_storable)
STUB(ngx_http_idempotency_header_stored)
STUB(ngx_http_idempotency_scope_hash)
STUB(ngx_http_idempotency_scope_empty_log)
STUB(ngx_http_idempotency_scope_wait_enter)
STUB(ngx_http_idempotency_scope_wait_leave)
