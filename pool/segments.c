/*
 * segments.c: the per-device index of segments by address and what pool_internal.h offers the
 * rest of the library on top of it: interior-pointer lookup, the consistent walk snapshots use,
 * running a function under every device lock, and the primitives the symmetric agreement
 * protocol is built on (find/take/grow a block by (segment seq, offset), sync pending frees,
 * list and release whole free segments).
 *
 * The index is a sorted array of segment pointers (binary search; insert and remove shift the
 * array). It is off the hot path: segments are few and change rarely. Every function here either
 * runs with the device lock held (sp__segidx_*) or takes device locks itself, in device order.
 */
#include <stdlib.h>
#include <string.h>

#include "pool/alloc_int.h"

/* ---- the address index ------------------------------------------------------------------- */

/* First index whose segment base is > addr. */
static size_t upper(const sp_devalloc_t *d, uintptr_t addr) {
    size_t lo = 0, hi = d->nsegs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (d->segs[mid]->base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

sp_status_t sp__segidx_insert(sp_devalloc_t *d, sp_segment_t *seg) {
    if (d->nsegs == d->cap_segs) {
        size_t cap = d->cap_segs ? d->cap_segs * 2 : 64;
        sp_segment_t **n = realloc(d->segs, cap * sizeof(*n));
        if (!n)
            return SP_ERR_SYSTEM;
        d->segs = n;
        d->cap_segs = cap;
    }
    size_t i = upper(d, seg->base);
    memmove(&d->segs[i + 1], &d->segs[i], (d->nsegs - i) * sizeof(*d->segs));
    d->segs[i] = seg;
    d->nsegs++;
    return SP_SUCCESS;
}

void sp__segidx_remove(sp_devalloc_t *d, sp_segment_t *seg) {
    size_t i = upper(d, seg->base);
    if (i == 0 || d->segs[i - 1] != seg)
        return;
    i--;
    memmove(&d->segs[i], &d->segs[i + 1], (d->nsegs - i - 1) * sizeof(*d->segs));
    d->nsegs--;
}

sp_segment_t *sp__segidx_find(const sp_devalloc_t *d, uintptr_t addr) {
    size_t i = upper(d, addr);
    if (i == 0)
        return NULL;
    sp_segment_t *s = d->segs[i - 1];
    return addr < s->base + s->size ? s : NULL;
}

static sp_block_t *block_at(sp_segment_t *seg, uintptr_t addr) {
    for (sp_block_t *b = seg->head; b; b = b->next)
        if (addr >= b->addr && addr < b->addr + b->size)
            return b;
    return NULL;
}

/* ---- lookup, walk, locked ---------------------------------------------------------------- */

sp_status_t sp__pool_lookup(const void *ptr, sp_block_info_t *info_p) {
    if (!atomic_load_explicit(&sp__ready, memory_order_acquire) || !ptr || !info_p)
        return sp__error_quiet(SP_ERR_INVALID_USAGE, SP_SUB_POOL, "%p is not in a live block", ptr);
    uintptr_t a = (uintptr_t)ptr;
    for (int i = 0; i < sp__g.ndev; i++) {
        sp_devalloc_t *d = &sp__g.devs[i];
        sp__lock(&d->lock);
        sp_segment_t *seg = sp__segidx_find(d, a);
        sp_block_t *b = seg ? block_at(seg, a) : NULL;
        if (b && b->allocated) {
            info_p->device = i;
            info_p->block_base = (void *)b->addr;
            info_p->block_size = b->size;
            info_p->requested_size = b->requested;
            info_p->segment_base = (void *)seg->base;
            info_p->segment_size = seg->size;
            info_p->segment_seq = seg->seq;
            info_p->pool = seg->bpool->pool;
            info_p->stream = b->stream;
            sp__unlock(&d->lock);
            return SP_SUCCESS;
        }
        sp__unlock(&d->lock);
    }
    return sp__error_quiet(SP_ERR_INVALID_USAGE, SP_SUB_POOL, "%p is not in a live sympool block",
                           ptr);
}

static void lock_all(void) {
    for (int i = 0; i < sp__g.ndev; i++)
        sp__lock(&sp__g.devs[i].lock);
}

static void unlock_all(void) {
    for (int i = sp__g.ndev - 1; i >= 0; i--)
        sp__unlock(&sp__g.devs[i].lock);
}

sp_status_t sp__pool_locked(void (*fn)(void *arg), void *arg) {
    SP_CHECK(sp__alloc_ensure());
    lock_all();
    fn(arg);
    unlock_all();
    return SP_SUCCESS;
}

static sp_status_t visit_segment(sp_devalloc_t *d, sp_segment_t *seg, sp_segment_visit_fn visit,
                                 void *arg, sp_block_view_t **buf, size_t *cap) {
    size_t n = 0;
    for (sp_block_t *b = seg->head; b; b = b->next)
        n++;
    if (n > *cap) {
        sp_block_view_t *nb = realloc(*buf, n * sizeof(*nb));
        if (!nb)
            return sp__error(SP_ERR_SYSTEM, SP_SUB_POOL, "out of host memory for a walk");
        *buf = nb;
        *cap = n;
    }
    sp_mempool_t *pool = seg->bpool->pool;
    sp_segment_view_t v;
    memset(&v, 0, sizeof(v));
    v.device = d->device;
    v.address = seg->base;
    v.total_size = seg->size;
    v.stream = (uintptr_t)seg->stream;
    v.is_small = seg->bpool->is_small;
    v.pool_id = pool->id;
    v.pool_name = pool->name;
    v.segment_seq = seg->seq;
    v.context = seg->context;
    size_t i = 0;
    for (sp_block_t *b = seg->head; b; b = b->next, i++) {
        sp_block_view_t *bv = &(*buf)[i];
        bv->address = b->addr;
        bv->size = b->size;
        bv->requested_size = b->allocated || b->event_count ? b->requested : 0;
        bv->context = b->context;
        if (b->allocated) {
            bv->state = SP_BLOCK_ACTIVE_ALLOCATED;
            v.allocated_size += b->size;
            v.active_size += b->size;
        } else if (b->event_count || b->nuses) {
            bv->state = SP_BLOCK_ACTIVE_PENDING_FREE;
            v.active_size += b->size;
        } else {
            bv->state = SP_BLOCK_INACTIVE;
        }
        v.requested_size += bv->requested_size;
    }
    v.nblocks = n;
    v.blocks = *buf;
    visit(&v, arg);
    return SP_SUCCESS;
}

sp_status_t sp__pool_walk(int device, const sp_mempool_t *pool, sp_segment_visit_fn visit,
                          void *arg) {
    SP_CHECK(sp__alloc_ensure());
    if (device >= sp__g.ndev)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "walk: device %d does not exist",
                         device);
    sp_block_view_t *buf = NULL;
    size_t cap = 0;
    sp_status_t s = SP_SUCCESS;
    lock_all();
    for (int i = 0; i < sp__g.ndev && s == SP_SUCCESS; i++) {
        if (device >= 0 && i != device)
            continue;
        sp_devalloc_t *d = &sp__g.devs[i];
        for (size_t k = 0; k < d->nsegs && s == SP_SUCCESS; k++) {
            sp_segment_t *seg = d->segs[k];
            if (pool && seg->bpool->pool != pool)
                continue;
            s = visit_segment(d, seg, visit, arg, &buf, &cap);
        }
    }
    unlock_all();
    free(buf);
    return s;
}

/* ---- symmetric primitives ---------------------------------------------------------------- */

static sp_segment_t *seg_by_seq(const sp_mempool_t *pool, uint64_t seq) {
    for (sp_segment_t *s = pool->seg_head; s; s = s->pnext)
        if (s->seq == seq)
            return s;
    return NULL;
}

static sp_status_t check_pool(const sp_mempool_t *pool) {
    if (!pool)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "NULL pool");
    return sp__alloc_ensure();
}

/* Sizes the device cannot hold are refused before any rounding can overflow. */
static sp_status_t check_size(const sp_mempool_t *pool, size_t size) {
    if (size == 0 || size > pool->dev->total_mem)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "pool \"%s\": %zu bytes is not a valid request on device %d (%zu bytes)",
                         pool->name ? pool->name : "", size, pool->device, pool->dev->total_mem);
    return SP_SUCCESS;
}

sp_status_t sp__pool_sym_find(sp_mempool_t *pool, size_t size, sp_stream_t stream, bool *found_p,
                              uint64_t *segment_seq_p, size_t *offset_p) {
    SP_CHECK(check_pool(pool));
    sp_devalloc_t *d = pool->dev;
    if (size == 0 || size > d->total_mem) {
        *found_p = false;
        return SP_SUCCESS;
    }
    size_t rs = sp__round_size(size);
    sp__lock(&d->lock);
    if (d->pending_events)
        sp__alloc_process_events(d);
    sp_bpool_t *bp = rs <= SP_SMALL_SIZE ? &pool->small : &pool->large;
    sp_block_t *b = sp__alloc_get_free_block(d, bp, rs, stream);
    if (b) {
        *segment_seq_p = b->seg->seq;
        *offset_p = b->addr - b->seg->base;
        sp__bset_insert(&bp->free, b); /* only a probe: put it back */
    }
    *found_p = b != NULL;
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

sp_status_t sp__pool_sym_take(sp_mempool_t *pool, size_t size, sp_stream_t stream,
                              uint64_t segment_seq, size_t offset, void **ptr_p) {
    SP_CHECK(check_pool(pool));
    SP_CHECK(check_size(pool, size));
    sp_devalloc_t *d = pool->dev;
    size_t rs = sp__round_size(size);
    uint32_t ctx = sp__history_active ? sp__history_capture(false) : 0;
    sp__lock(&d->lock);
    sp_segment_t *seg = seg_by_seq(pool, segment_seq);
    sp_block_t *b = seg && offset < seg->size ? block_at(seg, seg->base + offset) : NULL;
    if (!b || b->addr != seg->base + offset || !b->in_set || b->size < rs || b->stream != stream ||
        (rs <= SP_SMALL_SIZE) != seg->bpool->is_small) {
        sp__unlock(&d->lock);
        if (ctx)
            sp__history_context_release(ctx);
        return sp__error_quiet(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                               "no free block of %zu bytes at segment %llu offset %zu", rs,
                               (unsigned long long)segment_seq, offset);
    }
    sp__bset_remove(&seg->bpool->free, b);
    sp__alloc_found_block(d, b, rs, size, ctx);
    *ptr_p = (void *)b->addr;
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

sp_status_t sp__pool_sym_grow(sp_mempool_t *pool, size_t size, sp_stream_t stream, void **ptr_p) {
    SP_CHECK(check_pool(pool));
    SP_CHECK(check_size(pool, size));
    sp_devalloc_t *d = pool->dev;
    size_t rs = sp__round_size(size);
    uint32_t ctx = sp__history_active ? sp__history_capture(false) : 0;
    sp__lock(&d->lock);
    sp_bpool_t *bp = rs <= SP_SMALL_SIZE ? &pool->small : &pool->large;
    sp_block_t *b = NULL;
    int why = 0;
    sp_status_t s = sp__alloc_segment(d, bp, sp__allocation_size(rs), stream, ctx, &b, &why);
    if (s != SP_SUCCESS) {
        sp__unlock(&d->lock);
        if (ctx)
            sp__history_context_release(ctx);
        if (s != SP_ERR_OUT_OF_MEMORY)
            return s;
        return sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_POOL,
                               "symmetric pool \"%s\": cannot grow a segment for %zu bytes (%s)",
                               pool->name ? pool->name : "", size,
                               why == 2   ? "pool limit"
                               : why == 1 ? "memory fraction"
                                          : "registrar out of memory");
    }
    if (ctx)
        sp__history_context_retain(ctx);
    sp__alloc_found_block(d, b, rs, size, ctx);
    *ptr_p = (void *)b->addr;
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

size_t sp__pool_empty_device_cache(int device) {
    if (sp__alloc_ensure() != SP_SUCCESS || device < 0 || device >= sp__g.ndev)
        return 0;
    sp_devalloc_t *d = &sp__g.devs[device];
    sp__lock(&d->lock);
    size_t before = d->total_reserved;
    sp__alloc_release_cached(d);
    size_t freed = before - d->total_reserved;
    sp__unlock(&d->lock);
    return freed;
}

sp_status_t sp__pool_check_stream(const sp_mempool_t *pool, sp_stream_t stream, const char *fn) {
    SP_CHECK(check_pool(pool));
    if (!stream)
        return SP_SUCCESS;
    int sdev = -1;
    if (sp__g.ops->stream_device(stream, &sdev) != SP_SUCCESS)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "%s: %p is not a stream (%s)", fn,
                         stream, sp_last_error());
    if (sdev != pool->device)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "%s: stream %p belongs to device %d, not to the pool's device %d", fn,
                         stream, sdev, pool->device);
    return SP_SUCCESS;
}

sp_status_t sp__pool_sync_pending(sp_mempool_t *pool) {
    SP_CHECK(check_pool(pool));
    sp_devalloc_t *d = pool->dev;
    sp__lock(&d->lock);
    sp__alloc_sync_events(d, pool);
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

sp_status_t sp__pool_free_segments(sp_mempool_t *pool, uint64_t *seqs, size_t max,
                                   size_t *count_p) {
    SP_CHECK(check_pool(pool));
    sp_devalloc_t *d = pool->dev;
    size_t n = 0;
    sp__lock(&d->lock);
    for (sp_segment_t *s = pool->seg_head; s; s = s->pnext) {
        if (!sp__block_releasable(s->head))
            continue;
        if (n < max && seqs)
            seqs[n] = s->seq;
        n++;
    }
    sp__unlock(&d->lock);
    *count_p = n;
    return SP_SUCCESS;
}

size_t sp__pool_segment_count(const sp_mempool_t *pool) {
    if (!pool)
        return 0;
    sp__lock(&pool->dev->lock);
    size_t n = pool->nsegments;
    sp__unlock(&pool->dev->lock);
    return n;
}

uint64_t sp__pool_next_segment_seq(const sp_mempool_t *pool) {
    if (!pool)
        return 0;
    sp__lock(&pool->dev->lock);
    uint64_t n = pool->next_seq;
    sp__unlock(&pool->dev->lock);
    return n;
}

sp_status_t sp__pool_release_segment(sp_mempool_t *pool, uint64_t segment_seq) {
    SP_CHECK(check_pool(pool));
    sp_devalloc_t *d = pool->dev;
    sp__lock(&d->lock);
    sp_segment_t *s = seg_by_seq(pool, segment_seq);
    if (!s || !sp__block_releasable(s->head)) {
        sp__unlock(&d->lock);
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL, "pool \"%s\": segment %llu %s",
                         pool->name ? pool->name : "", (unsigned long long)segment_seq,
                         s ? "holds an allocated or pending block" : "does not exist");
    }
    sp__alloc_release_segment(d, s);
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

sp_status_t sp__pool_segment_info(const sp_mempool_t *pool, uint64_t segment_seq, void **base_p,
                                  size_t *size_p) {
    SP_CHECK(check_pool(pool));
    sp__lock(&pool->dev->lock);
    sp_segment_t *s = seg_by_seq(pool, segment_seq);
    if (s) {
        *base_p = (void *)s->base;
        *size_p = s->size;
    }
    sp__unlock(&pool->dev->lock);
    if (!s)
        return sp__error_quiet(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "segment %llu not found",
                               (unsigned long long)segment_seq);
    return SP_SUCCESS;
}
