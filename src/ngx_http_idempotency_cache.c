/*
 * The replay cache: completed records in a shared memory zone of the node,
 * in front of Redis.  HTTP side; reads a record's remaining TTL through
 * the records layer.  Its purge listener is ngx_http_idempotency_cache_sub.c.
 *
 * An entry is two slab blocks: a node (ngx_http_idempotency_cache_zone.h)
 * of a red-black tree keyed by a hash of the Redis identity and the record
 * key (the full key compared behind it), with its place in the LRU queue
 * and its expiry (ngx_current_msec, CLOCK_MONOTONIC, the same in every
 * worker and across reloads); and the key, the fence of a pending store
 * and the record, in a block of their own.  Every access holds
 * the slab pool's own mutex, which nginx frees when a worker dies holding
 * it; "dirty" is set while the tree is being changed, so that the next
 * locker after such a death starts the zone afresh rather than walk a
 * half-changed tree.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency_conf.h"
#include "ngx_http_idempotency_cache.h"
#include "ngx_http_idempotency_cache_zone.h"
#include "ngx_http_idempotency_record.h"
#include "ngx_http_idempotency_stats.h"


/* the largest record a zone takes by default, when it is 512 KiB or more */
#define NGX_HTTP_IDEMPOTENCY_CACHE_MAX_SIZE  (256 * 1024)

/* entries evicted at most to make room for one */
#define NGX_HTTP_IDEMPOTENCY_CACHE_EVICT_MAX  64


/*
 * The node's layout (ngx_http_idempotency_cache_zone.h) on 64-bit
 * platforms: what a lookup reads fits the first 64 bytes, the LRU links
 * start the second 64, and the node is a 128-byte slab block.  A build
 * where a change breaks this fails here.
 */
typedef char ngx_http_idempotency_cache_node_layout_t[
    sizeof(void *) != 8
    || (offsetof(ngx_http_idempotency_cache_node_t, queue) == 64
        && sizeof(ngx_http_idempotency_cache_node_t) > 64
        && sizeof(ngx_http_idempotency_cache_node_t) <= 128)
    ? 1 : -1];


/*
 * A record's TTL being read from Redis: where it goes then, and the zone's
 * epoch and purge count when the read was sent
 */
typedef struct {
    ngx_shm_zone_t                      *zone;
    ngx_msec_t                           sent;
    uint64_t                             epoch;
    uint64_t                             purged;
    uint32_t                             rid;
    size_t                               key_len;
    u_char                               key[1];
} ngx_http_idempotency_cache_fetch_t;


static ngx_int_t ngx_http_idempotency_cache_init_zone(
    ngx_shm_zone_t *shm_zone, void *data);
static ngx_int_t ngx_http_idempotency_cache_init_sh(ngx_slab_pool_t *shpool);
static void ngx_http_idempotency_cache_rbtree_insert(
    ngx_rbtree_node_t *temp, ngx_rbtree_node_t *node,
    ngx_rbtree_node_t *sentinel);
static ngx_http_idempotency_cache_sh_t *ngx_http_idempotency_cache_lock(
    ngx_http_idempotency_cache_t *cache);
static ngx_http_idempotency_cache_node_t *ngx_http_idempotency_cache_find(
    ngx_http_idempotency_cache_sh_t *sh, ngx_rbtree_key_t hash, uint32_t rid,
    ngx_str_t *rkey);
static ngx_int_t ngx_http_idempotency_cache_cmp(ngx_rbtree_key_t hash,
    uint32_t rid, ngx_str_t *rkey, ngx_http_idempotency_cache_node_t *cn);
static ngx_http_idempotency_cache_node_t *
    ngx_http_idempotency_cache_find_key(ngx_rbtree_node_t *node,
    ngx_rbtree_node_t *sentinel, ngx_rbtree_key_t hash, ngx_str_t *rkey,
    ngx_str_t *fence);
static ngx_http_idempotency_cache_node_t *ngx_http_idempotency_cache_add(
    ngx_http_idempotency_cache_t *cache, ngx_http_idempotency_cache_sh_t *sh,
    ngx_rbtree_key_t hash, uint32_t rid, ngx_str_t *rkey, ngx_str_t *fence,
    ngx_str_t *record, ngx_uint_t state, ngx_msec_t expire);
static void *ngx_http_idempotency_cache_alloc(
    ngx_http_idempotency_cache_t *cache, ngx_http_idempotency_cache_sh_t *sh,
    size_t size);
static void ngx_http_idempotency_cache_delete(
    ngx_http_idempotency_cache_t *cache, ngx_http_idempotency_cache_sh_t *sh,
    ngx_http_idempotency_cache_node_t *cn);
static void ngx_http_idempotency_cache_expire(
    ngx_http_idempotency_cache_t *cache, ngx_http_idempotency_cache_sh_t *sh,
    ngx_uint_t force);
static void ngx_http_idempotency_cache_ttl_handler(void *data,
    redisReply *reply, ngx_uint_t rc);
static ngx_uint_t ngx_http_idempotency_cache_takes(u_char *p, size_t len);
static ngx_rbtree_key_t ngx_http_idempotency_cache_hash(ngx_str_t *rkey);
static uint32_t ngx_http_idempotency_cache_rid(
    ngx_http_idempotency_redis_conf_t *rcf);
static ngx_uint_t ngx_http_idempotency_cache_zones(ngx_shm_zone_t **out,
    ngx_uint_t n);


/* the zones' tag: the address of this, in the module loaded now */
static ngx_uint_t  ngx_http_idempotency_cache_tag;


/* where "idempotency_cache NAME" names a zone, for nginx -t's errors */
typedef struct {
    ngx_shm_zone_t                    *zone;
    u_char                            *file;
    ngx_uint_t                         line;
} ngx_http_idempotency_cache_use_t;


/* idempotency_cache_zone NAME:SIZE [max_size=SIZE] */

char *
ngx_http_idempotency_cache_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    u_char                            *p;
    size_t                             size, max_size;
    ssize_t                            n;
    ngx_str_t                         *value, name, s;
    ngx_uint_t                         i;
    ngx_shm_zone_t                    *shm_zone;
    ngx_http_idempotency_cache_t      *cache;
    ngx_http_idempotency_main_conf_t  *imcf = conf;

    if (imcf->cache_zones++ == NGX_HTTP_IDEMPOTENCY_CACHE_ZONES) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "at most %d \"idempotency_cache_zone\" zones",
                           NGX_HTTP_IDEMPOTENCY_CACHE_ZONES);
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;

    p = (u_char *) ngx_strchr(value[1].data, ':');

    if (p == NULL || p == value[1].data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive: invalid zone \"%V\", "
                           "NAME:SIZE is expected", &cmd->name, &value[1]);
        return NGX_CONF_ERROR;
    }

    name.data = value[1].data;
    name.len = p - value[1].data;

    s.data = p + 1;
    s.len = value[1].data + value[1].len - s.data;

    n = ngx_parse_size(&s);

    if (n == NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive: invalid size of zone "
                           "\"%V\"", &cmd->name, &value[1]);
        return NGX_CONF_ERROR;
    }

    size = (size_t) n;

    if (size < (size_t) (8 * ngx_pagesize)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive: zone \"%V\" is too small: "
                           "%uz bytes, at least %uz", &cmd->name, &name,
                           size, (size_t) (8 * ngx_pagesize));
        return NGX_CONF_ERROR;
    }

    max_size = NGX_CONF_UNSET_SIZE;

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "max_size=", 9) == 0) {
            s.data = value[i].data + 9;
            s.len = value[i].len - 9;

            n = ngx_parse_size(&s);

            if (n == NGX_ERROR || n == 0) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "\"%V\" directive: invalid max_size "
                                   "\"%V\"", &cmd->name, &value[i]);
                return NGX_CONF_ERROR;
            }

            max_size = (size_t) n;
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive: invalid parameter \"%V\"",
                           &cmd->name, &value[i]);
        return NGX_CONF_ERROR;
    }

    /* by default half the zone when that is less: a small zone is valid */

    if (max_size == NGX_CONF_UNSET_SIZE) {
        max_size = ngx_min(NGX_HTTP_IDEMPOTENCY_CACHE_MAX_SIZE, size / 2);

    } else if (max_size > size / 2) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive: max_size of zone \"%V\" "
                           "must be at most half its size: max_size=%uz or "
                           "less for %uz bytes", &cmd->name, &name,
                           size / 2, size);
        return NGX_CONF_ERROR;
    }

    shm_zone = ngx_shared_memory_add(cf, &name, size,
                                     &ngx_http_idempotency_cache_tag);
    if (shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    if (shm_zone->data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive: duplicate zone \"%V\"",
                           &cmd->name, &name);
        return NGX_CONF_ERROR;
    }

    cache = ngx_pcalloc(cf->pool, sizeof(ngx_http_idempotency_cache_t));
    if (cache == NULL) {
        return NGX_CONF_ERROR;
    }

    cache->max_size = max_size;
    cache->name = name;

    shm_zone->init = ngx_http_idempotency_cache_init_zone;
    shm_zone->data = cache;

    return NGX_CONF_OK;
}


/* idempotency_cache NAME | off */

char *
ngx_http_idempotency_cache(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idempotency_loc_conf_t *ilcf = conf;

    ngx_str_t                         *value;
    ngx_http_idempotency_cache_use_t  *use;
    ngx_http_idempotency_main_conf_t  *imcf;

    if (ilcf->cache != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        ilcf->cache = NULL;
        return NGX_CONF_OK;
    }

    /* sized by idempotency_cache_zone, here or later in the file */

    ilcf->cache = ngx_shared_memory_add(cf, &value[1], 0,
                                        &ngx_http_idempotency_cache_tag);
    if (ilcf->cache == NULL) {
        return NGX_CONF_ERROR;
    }

    imcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    if (imcf->cache_uses == NULL) {
        imcf->cache_uses = ngx_array_create(cf->pool, 4,
                                   sizeof(ngx_http_idempotency_cache_use_t));
        if (imcf->cache_uses == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    use = ngx_array_push(imcf->cache_uses);
    if (use == NULL) {
        return NGX_CONF_ERROR;
    }

    use->zone = ilcf->cache;
    use->file = cf->conf_file->file.name.data;
    use->line = cf->conf_file->line;

    return NGX_CONF_OK;
}


/*
 * Once the http block is read, a zone that no idempotency_cache_zone
 * declared would be nginx's "zero size shared memory zone", which names
 * neither the directive nor its place: this error names both.
 */

ngx_int_t
ngx_http_idempotency_cache_check(ngx_conf_t *cf)
{
    ngx_uint_t                         i;
    ngx_http_idempotency_cache_use_t  *use;
    ngx_http_idempotency_main_conf_t  *imcf;

    imcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    if (imcf->cache_uses == NULL) {
        return NGX_OK;
    }

    use = imcf->cache_uses->elts;

    for (i = 0; i < imcf->cache_uses->nelts; i++) {
        if (use[i].zone->data == NULL) {
            ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                          "\"idempotency_cache\" directive: zone \"%V\" is "
                          "not declared by \"idempotency_cache_zone\" in "
                          "the http block in %s:%ui",
                          &use[i].zone->shm.name, use[i].file, use[i].line);
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/*
 * Kept across a reload with its entries when name, size and tag are the
 * same (nginx then hands the old data over); a new size, or a new build
 * of the module, starts empty.
 */

static ngx_int_t
ngx_http_idempotency_cache_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_idempotency_cache_t  *ocache = data;

    ngx_http_idempotency_cache_t     *cache;
    ngx_http_idempotency_cache_sh_t  *sh;

    cache = shm_zone->data;
    cache->shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (ocache) {
        /* the master, at a reload: the old worker 0 waits for the new */

        sh = ngx_http_idempotency_cache_lock(cache);
        if (sh != NULL) {
            sh->reloaded = ngx_current_msec;
            ngx_http_idempotency_cache_unlock(cache, sh);
        }

        return NGX_OK;
    }

    if (shm_zone->shm.exists) {
        return NGX_OK;
    }

    return ngx_http_idempotency_cache_init_sh(cache->shpool);
}


static ngx_int_t
ngx_http_idempotency_cache_init_sh(ngx_slab_pool_t *shpool)
{
    ngx_http_idempotency_cache_sh_t  *sh;

    sh = ngx_slab_alloc_locked(shpool,
                               sizeof(ngx_http_idempotency_cache_sh_t));
    if (sh == NULL) {
        return NGX_ERROR;
    }

    ngx_rbtree_init(&sh->rbtree, &sh->sentinel,
                    ngx_http_idempotency_cache_rbtree_insert);
    ngx_queue_init(&sh->lru);

    sh->dirty = 0;
    sh->epoch = 1;

    /*
     * A zone started afresh after a worker died in it counts on from far
     * past what it may have counted before: a read sent before then never
     * finds its count again
     */
    sh->purged = (uint64_t) ngx_current_msec << 20;
    sh->entries = 0;
    sh->bytes = 0;
    sh->listened = 0;
    sh->reloaded = 0;
    ngx_memzero(sh->listeners, sizeof(sh->listeners));

    shpool->data = sh;

    /* a full zone evicts: no "no memory" line for each time */
    shpool->log_nomem = 0;

    return NGX_OK;
}


static void
ngx_http_idempotency_cache_rbtree_insert(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel)
{
    ngx_str_t                           key;
    ngx_rbtree_node_t                 **p;
    ngx_http_idempotency_cache_node_t  *cn;

    cn = (ngx_http_idempotency_cache_node_t *) node;
    key.data = cn->data;
    key.len = cn->key_len;

    for ( ;; ) {
        p = (ngx_http_idempotency_cache_cmp(node->key, cn->rid, &key,
                                (ngx_http_idempotency_cache_node_t *) temp)
             < 0)
            ? &temp->left : &temp->right;

        if (*p == sentinel) {
            break;
        }

        temp = *p;
    }

    *p = node;
    node->parent = temp;
    node->left = sentinel;
    node->right = sentinel;
    ngx_rbt_red(node);
}


/*
 * The slab mutex: nginx frees it when its holder dies.  The tree it
 * guards may then be half changed ("dirty"): the zone starts afresh.
 */

static ngx_http_idempotency_cache_sh_t *
ngx_http_idempotency_cache_lock(ngx_http_idempotency_cache_t *cache)
{
    ngx_http_idempotency_cache_sh_t  *sh;

    ngx_shmtx_lock(&cache->shpool->mutex);

    sh = cache->shpool->data;

    if (sh == NULL || sh->dirty) {
        if (sh) {
            ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                          "idempotency cache: a worker died while changing "
                          "zone \"%V\", its entries are dropped",
                          &cache->name);
        }

        ngx_slab_init(cache->shpool);

        if (ngx_http_idempotency_cache_init_sh(cache->shpool) != NGX_OK) {
            ngx_shmtx_unlock(&cache->shpool->mutex);
            return NULL;
        }

        sh = cache->shpool->data;
    }

    sh->dirty = 1;

    return sh;
}


void
ngx_http_idempotency_cache_unlock(ngx_http_idempotency_cache_t *cache,
    ngx_http_idempotency_cache_sh_t *sh)
{
    sh->dirty = 0;
    ngx_shmtx_unlock(&cache->shpool->mutex);
}


ngx_int_t
ngx_http_idempotency_cache_get(ngx_shm_zone_t *zone,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *rkey,
    ngx_pool_t *pool, ngx_str_t *out)
{
    u_char                             *p;
    uint32_t                            rid;
    ngx_rbtree_key_t                    hash;
    ngx_http_idempotency_cache_t       *cache;
    ngx_http_idempotency_cache_sh_t    *sh;
    ngx_http_idempotency_cache_node_t  *cn;

    cache = zone->data;
    rid = ngx_http_idempotency_cache_rid(rcf);
    hash = ngx_http_idempotency_cache_hash(rkey);
    p = NULL;

    sh = ngx_http_idempotency_cache_lock(cache);
    if (sh == NULL) {
        return NGX_DECLINED;
    }

    cn = ngx_http_idempotency_cache_find(sh, hash, rid, rkey);

    if (cn != NULL
        && ((ngx_msec_int_t) (cn->expire - ngx_current_msec) <= 0
            || cn->epoch != sh->epoch))
    {
        ngx_http_idempotency_cache_delete(cache, sh, cn);
        cn = NULL;
    }

    if (cn != NULL && cn->state == NGX_HTTP_IDEMPOTENCY_CACHE_READY) {

        /* a copy: the entry may go as soon as the lock is released */

        p = ngx_pnalloc(pool, cn->len);

        if (p != NULL) {
            ngx_memcpy(p, cn->data + cn->key_len + cn->fence_len, cn->len);
            out->data = p;
            out->len = cn->len;

            if (ngx_queue_head(&sh->lru) != &cn->queue) {
                ngx_queue_remove(&cn->queue);
                ngx_queue_insert_head(&sh->lru, &cn->queue);
            }
        }
    }

    ngx_http_idempotency_cache_unlock(cache, sh);

    if (p == NULL) {
        ngx_http_idempotency_stat_inc(NGX_HTTP_IDEMPOTENCY_STAT_CACHE_MISS);
        return NGX_DECLINED;
    }

    ngx_http_idempotency_stat_inc(NGX_HTTP_IDEMPOTENCY_STAT_CACHE_HIT);

    return NGX_OK;
}


static ngx_http_idempotency_cache_node_t *
ngx_http_idempotency_cache_find(ngx_http_idempotency_cache_sh_t *sh,
    ngx_rbtree_key_t hash, uint32_t rid, ngx_str_t *rkey)
{
    ngx_int_t                           rc;
    ngx_rbtree_node_t                  *node, *sentinel;
    ngx_http_idempotency_cache_node_t  *cn;

    node = sh->rbtree.root;
    sentinel = sh->rbtree.sentinel;

    while (node != sentinel) {
        cn = (ngx_http_idempotency_cache_node_t *) node;

        rc = ngx_http_idempotency_cache_cmp(hash, rid, rkey, cn);

        if (rc == 0) {
            return cn;
        }

        node = (rc < 0) ? node->left : node->right;
    }

    return NULL;
}


/* the order of the tree: hash, then Redis, then the key itself */

static ngx_int_t
ngx_http_idempotency_cache_cmp(ngx_rbtree_key_t hash, uint32_t rid,
    ngx_str_t *rkey, ngx_http_idempotency_cache_node_t *cn)
{
    if (hash != cn->node.key) {
        return (hash < cn->node.key) ? -1 : 1;
    }

    if (rid != cn->rid) {
        return (rid < cn->rid) ? -1 : 1;
    }

    return ngx_memn2cmp(rkey->data, cn->data, rkey->len, cn->key_len);
}


/*
 * An entry of "rkey" whatever its Redis: with a "fence", only the pending
 * entry under it; without, any entry of the key.  The entries of one hash
 * are searched on both sides (they are few).
 */

static ngx_http_idempotency_cache_node_t *
ngx_http_idempotency_cache_find_key(ngx_rbtree_node_t *node,
    ngx_rbtree_node_t *sentinel, ngx_rbtree_key_t hash, ngx_str_t *rkey,
    ngx_str_t *fence)
{
    ngx_http_idempotency_cache_node_t  *cn;

    while (node != sentinel) {

        if (hash != node->key) {
            node = (hash < node->key) ? node->left : node->right;
            continue;
        }

        cn = (ngx_http_idempotency_cache_node_t *) node;

        if (cn->key_len == rkey->len
            && ngx_memcmp(cn->data, rkey->data, rkey->len) == 0
            && (fence == NULL
                || (cn->state == NGX_HTTP_IDEMPOTENCY_CACHE_PENDING
                    && cn->fence_len == fence->len
                    && ngx_memcmp(cn->data + cn->key_len, fence->data,
                                  fence->len)
                       == 0)))
        {
            return cn;
        }

        cn = ngx_http_idempotency_cache_find_key(node->left, sentinel,
                                                 hash, rkey, fence);
        if (cn != NULL) {
            return cn;
        }

        node = node->right;
    }

    return NULL;
}


/* room is made by expiry first, then by evicting the least recent */

static ngx_http_idempotency_cache_node_t *
ngx_http_idempotency_cache_add(ngx_http_idempotency_cache_t *cache,
    ngx_http_idempotency_cache_sh_t *sh, ngx_rbtree_key_t hash, uint32_t rid,
    ngx_str_t *rkey, ngx_str_t *fence, ngx_str_t *record, ngx_uint_t state,
    ngx_msec_t expire)
{
    u_char                             *p;
    size_t                              size;
    ngx_http_idempotency_cache_node_t  *cn;

    size = rkey->len + fence->len + record->len;

    ngx_http_idempotency_cache_expire(cache, sh, 0);

    p = ngx_http_idempotency_cache_alloc(cache, sh, size);

    if (p == NULL) {
        return NULL;
    }

    cn = ngx_http_idempotency_cache_alloc(cache, sh,
                                   sizeof(ngx_http_idempotency_cache_node_t));

    if (cn == NULL) {
        ngx_slab_free_locked(cache->shpool, p);
        return NULL;
    }

    cn->data = p;
    cn->node.key = hash;
    cn->expire = expire;
    cn->epoch = sh->epoch;
    cn->len = record->len;
    cn->rid = rid;
    cn->key_len = (uint16_t) rkey->len;
    cn->fence_len = (uint16_t) fence->len;
    cn->state = (u_char) state;

    p = ngx_cpymem(cn->data, rkey->data, rkey->len);

    /* a record read from Redis has no fence */

    if (fence->len) {
        p = ngx_cpymem(p, fence->data, fence->len);
    }

    ngx_memcpy(p, record->data, record->len);

    ngx_rbtree_insert(&sh->rbtree, &cn->node);
    ngx_queue_insert_head(&sh->lru, &cn->queue);

    sh->entries++;
    sh->bytes += sizeof(ngx_http_idempotency_cache_node_t) + size;

    return cn;
}


static void
ngx_http_idempotency_cache_delete(ngx_http_idempotency_cache_t *cache,
    ngx_http_idempotency_cache_sh_t *sh,
    ngx_http_idempotency_cache_node_t *cn)
{
    ngx_queue_remove(&cn->queue);
    ngx_rbtree_delete(&sh->rbtree, &cn->node);

    sh->entries--;
    sh->bytes -= sizeof(ngx_http_idempotency_cache_node_t)
                 + cn->key_len + cn->fence_len + cn->len;

    ngx_slab_free_locked(cache->shpool, cn->data);
    ngx_slab_free_locked(cache->shpool, cn);
}


/* an allocation in the zone, evicting from the LRU tail until it fits */

static void *
ngx_http_idempotency_cache_alloc(ngx_http_idempotency_cache_t *cache,
    ngx_http_idempotency_cache_sh_t *sh, size_t size)
{
    void        *p;
    ngx_uint_t   i;

    p = ngx_slab_alloc_locked(cache->shpool, size);

    for (i = 0; p == NULL && i < NGX_HTTP_IDEMPOTENCY_CACHE_EVICT_MAX; i++) {

        if (ngx_queue_empty(&sh->lru)) {
            break;
        }

        ngx_http_idempotency_cache_expire(cache, sh, 1);
        p = ngx_slab_alloc_locked(cache->shpool, size);
    }

    return p;
}


/*
 * Up to two expired entries at the LRU tail go; with "force", the tail
 * goes whatever its expiry (an eviction, counted).
 */

static void
ngx_http_idempotency_cache_expire(ngx_http_idempotency_cache_t *cache,
    ngx_http_idempotency_cache_sh_t *sh, ngx_uint_t force)
{
    ngx_uint_t                          n;
    ngx_queue_t                        *q;
    ngx_http_idempotency_cache_node_t  *cn;

    for (n = 0; n < 2 && !ngx_queue_empty(&sh->lru); n++) {
        q = ngx_queue_last(&sh->lru);
        cn = ngx_queue_data(q, ngx_http_idempotency_cache_node_t, queue);

        if ((ngx_msec_int_t) (cn->expire - ngx_current_msec) > 0
            && cn->epoch == sh->epoch)
        {
            if (!force) {
                return;
            }

            force = 0;

            if (cn->state == NGX_HTTP_IDEMPOTENCY_CACHE_READY) {
                ngx_http_idempotency_stat_inc(
                                    NGX_HTTP_IDEMPOTENCY_STAT_CACHE_EVICTED);
            }
        }

        ngx_http_idempotency_cache_delete(cache, sh, cn);
    }
}


/*
 * One more round trip, after the reply: the record again with its
 * remaining TTL, read together (a GET and a PTTL in one script), so that
 * the entry lives no longer than the record in Redis.
 */

void
ngx_http_idempotency_cache_fetched(ngx_shm_zone_t *zone,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *rkey, ngx_log_t *log)
{
    ngx_str_t                            arg;
    ngx_http_idempotency_cache_t        *cache;
    ngx_http_idempotency_cache_sh_t     *sh;
    ngx_http_idempotency_cache_fetch_t  *f;

    f = ngx_alloc(offsetof(ngx_http_idempotency_cache_fetch_t, key)
                  + rkey->len, log);
    if (f == NULL) {
        return;
    }

    cache = zone->data;

    sh = ngx_http_idempotency_cache_lock(cache);
    if (sh == NULL) {
        ngx_free(f);
        return;
    }

    f->epoch = sh->epoch;
    f->purged = sh->purged;

    ngx_http_idempotency_cache_unlock(cache, sh);

    f->zone = zone;
    f->sent = ngx_current_msec;
    f->rid = ngx_http_idempotency_cache_rid(rcf);
    f->key_len = rkey->len;
    ngx_memcpy(f->key, rkey->data, rkey->len);

    ngx_str_null(&arg);

    if (ngx_http_idempotency_redis_script(rcf,
                                   NGX_HTTP_IDEMPOTENCY_SCRIPT_CACHE_FETCH,
                                   rkey, &arg, 0,
                                   ngx_http_idempotency_cache_ttl_handler, f,
                                   log)
        == NULL)
    {
        ngx_free(f);
    }
}


static void
ngx_http_idempotency_cache_ttl_handler(void *data, redisReply *reply,
    ngx_uint_t rc)
{
    ngx_http_idempotency_cache_fetch_t *f = data;

    ngx_str_t                           key, record, none;
    ngx_rbtree_key_t                    hash;
    redisReply                         *v, *ttl;
    ngx_http_idempotency_cache_t       *cache;
    ngx_http_idempotency_cache_sh_t    *sh;
    ngx_http_idempotency_cache_node_t  *cn;

    cache = f->zone->data;

    if (rc != NGX_HTTP_IDEMPOTENCY_REDIS_OK
        || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2)
    {
        goto done;
    }

    v = reply->element[0];
    ttl = reply->element[1];

    if (v->type != REDIS_REPLY_STRING || ttl->type != REDIS_REPLY_INTEGER
        || ttl->integer <= 0 || (size_t) v->len > cache->max_size
        || !ngx_http_idempotency_cache_takes((u_char *) v->str, v->len))
    {
        goto done;
    }

    key.data = f->key;
    key.len = f->key_len;
    record.data = (u_char *) v->str;
    record.len = v->len;
    ngx_str_null(&none);
    hash = ngx_http_idempotency_cache_hash(&key);

    sh = ngx_http_idempotency_cache_lock(cache);
    if (sh == NULL) {
        goto done;
    }

    /*
     * Not when a purge came, or purges may have been missed, since the
     * read was sent: what it read may be a record purged since, its answer
     * late by up to the Redis' timeout=.  A purge of any key counts (they
     * are rare); the next replay from Redis reads the record again.
     */

    if (sh->epoch == f->epoch && sh->purged == f->purged) {
        cn = ngx_http_idempotency_cache_find(sh, hash, f->rid, &key);

        if (cn != NULL && cn->state != NGX_HTTP_IDEMPOTENCY_CACHE_PENDING) {
            ngx_http_idempotency_cache_delete(cache, sh, cn);
            cn = NULL;
        }

        if (cn == NULL) {
            (void) ngx_http_idempotency_cache_add(cache, sh, hash, f->rid,
                                      &key, &none, &record,
                                      NGX_HTTP_IDEMPOTENCY_CACHE_READY,
                                      f->sent + (ngx_msec_t) ttl->integer);
        }
    }

    ngx_http_idempotency_cache_unlock(cache, sh);

done:

    ngx_free(f);
}


void
ngx_http_idempotency_cache_pending(ngx_shm_zone_t *zone,
    ngx_http_idempotency_redis_conf_t *rcf, ngx_str_t *rkey,
    ngx_str_t *fence, ngx_str_t *record, ngx_msec_t ttl)
{
    uint32_t                            rid;
    ngx_rbtree_key_t                    hash;
    ngx_http_idempotency_cache_t       *cache;
    ngx_http_idempotency_cache_sh_t    *sh;
    ngx_http_idempotency_cache_node_t  *cn;

    cache = zone->data;

    if (record->len > cache->max_size || fence->len > 0xffff
        || rkey->len > 0xffff
        || !ngx_http_idempotency_cache_takes(record->data, record->len))
    {
        return;
    }

    rid = ngx_http_idempotency_cache_rid(rcf);
    hash = ngx_http_idempotency_cache_hash(rkey);

    sh = ngx_http_idempotency_cache_lock(cache);
    if (sh == NULL) {
        return;
    }

    cn = ngx_http_idempotency_cache_find(sh, hash, rid, rkey);

    if (cn != NULL) {
        ngx_http_idempotency_cache_delete(cache, sh, cn);
    }

    /* the TTL runs from before the store: never later than Redis' */

    (void) ngx_http_idempotency_cache_add(cache, sh, hash, rid, rkey, fence,
                                          record,
                                          NGX_HTTP_IDEMPOTENCY_CACHE_PENDING,
                                          ngx_current_msec + ttl);

    ngx_http_idempotency_cache_unlock(cache, sh);
}


/* the store of "rkey" under "fence" was acknowledged, or not */

void
ngx_http_idempotency_cache_commit(ngx_str_t *rkey, ngx_str_t *fence,
    ngx_uint_t stored)
{
    ngx_uint_t                          i;
    ngx_http_idempotency_cache_t       *cache;
    ngx_http_idempotency_cache_sh_t    *sh;
    ngx_http_idempotency_cache_node_t  *cn;

    i = 0;

    while ((sh = ngx_http_idempotency_cache_next(&i, &cache)) != NULL) {
        cn = ngx_http_idempotency_cache_find_key(sh->rbtree.root,
                                  sh->rbtree.sentinel,
                                  ngx_http_idempotency_cache_hash(rkey),
                                  rkey, fence);

        if (cn != NULL) {
            if (stored) {
                cn->state = NGX_HTTP_IDEMPOTENCY_CACHE_READY;

            } else {
                ngx_http_idempotency_cache_delete(cache, sh, cn);
            }
        }

        ngx_http_idempotency_cache_unlock(cache, sh);
    }
}


/*
 * Every entry of the key goes, whatever the idempotency_redis it was
 * read or stored through: the key names the record (prefix, scope hash,
 * key), and a location may write the same server in other words than the
 * one that purges.  The zone counts the purge: a read of a record sent
 * before it may come back after it, and must not bring the record back
 * (ttl_handler).
 */

void
ngx_http_idempotency_cache_purge(ngx_str_t *rkey)
{
    ngx_uint_t                          i;
    ngx_rbtree_key_t                    hash;
    ngx_http_idempotency_cache_t       *cache;
    ngx_http_idempotency_cache_sh_t    *sh;
    ngx_http_idempotency_cache_node_t  *cn;

    hash = ngx_http_idempotency_cache_hash(rkey);

    i = 0;

    while ((sh = ngx_http_idempotency_cache_next(&i, &cache)) != NULL) {
        sh->purged++;

        while ((cn = ngx_http_idempotency_cache_find_key(sh->rbtree.root,
                                             sh->rbtree.sentinel, hash,
                                             rkey, NULL))
               != NULL)
        {
            ngx_http_idempotency_cache_delete(cache, sh, cn);
        }

        ngx_http_idempotency_cache_unlock(cache, sh);
    }
}


ngx_uint_t
ngx_http_idempotency_cache_used(void)
{
    ngx_shm_zone_t  *zone;

    return ngx_http_idempotency_cache_zones(&zone, 1);
}


void
ngx_http_idempotency_cache_totals(ngx_uint_t *entries, size_t *bytes)
{
    ngx_uint_t                        i;
    ngx_http_idempotency_cache_t     *cache;
    ngx_http_idempotency_cache_sh_t  *sh;

    *entries = 0;
    *bytes = 0;

    i = 0;

    while ((sh = ngx_http_idempotency_cache_next(&i, &cache)) != NULL) {
        *entries += sh->entries;
        *bytes += sh->bytes;

        ngx_http_idempotency_cache_unlock(cache, sh);
    }
}


/*
 * Whether a record may enter: complete (a split one's body is not in it)
 * and valid as one read from Redis must be.  Checked once, here: a hit
 * only reads it again (ngx_http_idempotency_record_parse_known()).
 */

static ngx_uint_t
ngx_http_idempotency_cache_takes(u_char *p, size_t len)
{
    const char                     *reason;
    ngx_http_idempotency_record_t   rec;

    return ngx_http_idempotency_record_parse(p, len, &rec) == 0
           && rec.state == NGX_HTTP_IDEMPOTENCY_RECORD_DONE
           && ngx_http_idempotency_record_validate(&rec, &reason) == 0;
}


/*
 * Of the key alone: a store's commit finds its entry without the Redis.
 * MurmurHash2 reads four bytes a step (CRC32's table one).
 */

static ngx_rbtree_key_t
ngx_http_idempotency_cache_hash(ngx_str_t *rkey)
{
    return (ngx_rbtree_key_t) ngx_murmur_hash2(rkey->data, rkey->len);
}


/*
 * The Redis a record comes from: two idempotency_redis with the same
 * prefix but another server keep their entries apart (a purge removes
 * the entries of every one).
 */

static uint32_t
ngx_http_idempotency_cache_rid(ngx_http_idempotency_redis_conf_t *rcf)
{
    return ngx_murmur_hash2(rcf->text.data, rcf->text.len);
}


/*
 * The next of this node's zones from *i on, locked (the caller unlocks
 * it), or NULL after the last: a walk over every zone is
 * "i = 0; while ((sh = ..._next(&i, &cache)) != NULL) { ... unlock }".
 */

ngx_http_idempotency_cache_sh_t *
ngx_http_idempotency_cache_next(ngx_uint_t *i,
    ngx_http_idempotency_cache_t **cache)
{
    ngx_uint_t                        n;
    ngx_shm_zone_t                   *zones[NGX_HTTP_IDEMPOTENCY_CACHE_ZONES];
    ngx_http_idempotency_cache_sh_t  *sh;

    n = ngx_http_idempotency_cache_zones(zones,
                                      NGX_HTTP_IDEMPOTENCY_CACHE_ZONES);

    while (*i < n) {
        *cache = zones[(*i)++]->data;

        sh = ngx_http_idempotency_cache_lock(*cache);
        if (sh != NULL) {
            return sh;
        }
    }

    return NULL;
}


/* this node's cache zones, found through the cycle as the stats zone is */

static ngx_uint_t
ngx_http_idempotency_cache_zones(ngx_shm_zone_t **out, ngx_uint_t n)
{
    ngx_uint_t        i, k;
    ngx_list_part_t  *part;
    ngx_shm_zone_t   *shm_zone;

    k = 0;
    part = &((ngx_cycle_t *) ngx_cycle)->shared_memory.part;
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

        if (shm_zone[i].tag == &ngx_http_idempotency_cache_tag
            && shm_zone[i].shm.addr != NULL && k < n)
        {
            out[k++] = &shm_zone[i];
        }
    }

    return k;
}
