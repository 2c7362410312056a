/*
 * sym_primitives.c: what pool/pool.h offers symmetric/ to build its agreement protocol on:
 * check and round a size once, find/take a block by (segment seq, offset), plan a growth,
 * adopt a segment the registrar made and hand out its block, sync pending frees, list whole
 * free segments and detach one. Each function takes the device lock itself, briefly: none
 * allocates device memory or waits for another rank (symmetric/ does that with no pool lock
 * held, between these calls).
 */
#include <stdlib.h>
#include <string.h>

#include "pool/allocator.h"
#include "pool/mempool.h"
#include "pool/release.h"
#include "pool/segment_index.h"

/* ---- symmetric primitives ---------------------------------------------------------------- */

static sp_segment_t *seg_by_seq(const sp_mempool_t *pool, uint64_t seq) {
    for (sp_segment_t *s = pool->seg_head; s; s = s->pnext)
        if (s->seq == seq)
            return s;
    return NULL;
}

static sp_status_t check_pool(const sp_mempool_t *pool) {
    return sp__mempool_check(pool, "symmetric pool");
}

sp_status_t sp__pool_sym_size(const sp_mempool_t *pool, size_t size, size_t *rounded_p) {
    SP_CHECK(check_pool(pool));
    if (size == 0) {
        *rounded_p = 0;
        return SP_SUCCESS;
    }
    /* Sizes the device cannot hold are refused before the rounding can overflow. */
    if (size > pool->dev->total_mem)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "pool \"%s\": %zu bytes is more than device %d holds (%zu bytes)",
                         pool->name ? pool->name : "", size, pool->device, pool->dev->total_mem);
    *rounded_p = sp__round_size(size);
    return SP_SUCCESS;
}

static sp_bpool_t *bpool_for(sp_mempool_t *pool, size_t rounded) {
    return rounded <= SP_SMALL_SIZE ? &pool->small : &pool->large;
}

sp_status_t sp__pool_sym_find(sp_mempool_t *pool, size_t rounded, sp_stream_t stream, bool *found_p,
                              uint64_t *segment_seq_p, size_t *offset_p) {
    sp_devalloc_t *d = pool->dev;
    sp__lock(&d->lock);
    if (d->pending_events)
        sp__alloc_process_events(d);
    sp_bpool_t *bp = bpool_for(pool, rounded);
    sp_block_t *b = sp__alloc_get_free_block(d, bp, rounded, stream);
    if (b) {
        *segment_seq_p = sp__bseg(b)->seq;
        *offset_p = b->addr - sp__bseg(b)->base;
        sp__bset_insert(&bp->free, b); /* only a probe: put it back */
    }
    *found_p = b != NULL;
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

sp_status_t sp__pool_sym_take(sp_mempool_t *pool, size_t rounded, size_t size, sp_stream_t stream,
                              uint64_t segment_seq, size_t offset, void **ptr_p) {
    sp_devalloc_t *d = pool->dev;
    uint32_t ctx = sp__history_on() ? sp__history_capture(false) : 0;
    sp__lock(&d->lock);
    sp_segment_t *seg = seg_by_seq(pool, segment_seq);
    sp_block_t *b =
        seg && offset < seg->size ? sp__segment_block_at(seg, seg->base + offset) : NULL;
    if (!b || b->addr != seg->base + offset || !b->in_set || b->size < rounded ||
        sp__block_stream(b) != stream || (rounded <= SP_SMALL_SIZE) != seg->bpool->is_small) {
        sp__unlock(&d->lock);
        if (ctx)
            sp__history_context_release(ctx);
        return sp__error_quiet(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                               "no free block of %zu bytes at segment %llu offset %zu", rounded,
                               (unsigned long long)segment_seq, offset);
    }
    sp__bset_remove(&seg->bpool->free, b);
    sp__alloc_found_block(d, b, rounded, size, ctx);
    *ptr_p = (void *)b->addr;
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

sp_status_t sp__pool_sym_plan(sp_mempool_t *pool, size_t rounded, sp_stream_t stream,
                              size_t *alloc_size_p) {
    sp_devalloc_t *d = pool->dev;
    /* Growing allocates (ncclMemAlloc) and registers an NCCL window: neither may happen inside
     * a CUDA graph capture. Refusing here, before the registrar is asked, makes every rank fail
     * together (symmetric/ answers the others "this rank cannot grow"). */
    bool capturing = false;
    if (stream && sp__g.ops->stream_capturing(d->device, stream, &capturing) == SP_SUCCESS &&
        capturing)
        return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_POOL,
                         "symmetric pool \"%s\": cannot grow by a segment for %zu bytes while "
                         "stream %p is capturing a CUDA graph (growing allocates and registers "
                         "an NCCL window); make the pool large enough before capturing",
                         pool->name ? pool->name : "", rounded, stream);
    size_t alloc_size = sp__allocation_size(rounded);
    sp__lock(&d->lock);
    sp_grow_refusal_t why = sp__alloc_segment_room(d, pool, alloc_size);
    size_t reserved = d->total_reserved;
    sp__unlock(&d->lock);
    /* On the host backend a symmetric segment is an MPI shared window, not the backend's memory,
     * so the backend's budget (SYMPOOL_HOST_CAPACITY) never sees it: hold growth to it here, as
     * the device itself does on cuda. Every rank learns which rank could not grow. */
    if (why == SP_GROW_DEVICE && sp__g.caps.is_emulated &&
        (alloc_size > d->total_mem || reserved > d->total_mem - alloc_size)) {
        char cap[32], res[32];
        sp__fmt_size(d->total_mem, cap, sizeof cap);
        sp__fmt_size(reserved, res, sizeof res);
        return sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_POOL,
                               "symmetric pool \"%s\": rank %d cannot grow by a %zu-byte segment: "
                               "device %d holds %s of its %s (SYMPOOL_HOST_CAPACITY)",
                               pool->name ? pool->name : "", sp__process_rank(), alloc_size,
                               d->device, res, cap);
    }
    if (why != SP_GROW_DEVICE)
        return sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_POOL,
                               "symmetric pool \"%s\": no room for a %zu-byte segment (%s)",
                               pool->name ? pool->name : "", alloc_size,
                               why == SP_GROW_POOL_LIMIT
                                   ? "pool limit, sp_mempool_set_limit"
                                   : "memory fraction, sp_set_memory_fraction");
    *alloc_size_p = alloc_size;
    return SP_SUCCESS;
}

sp_status_t sp__pool_sym_adopt(sp_mempool_t *pool, void *base, size_t alloc_size, size_t rounded,
                               size_t size, sp_stream_t stream, void **ptr_p,
                               uint64_t *segment_seq_p) {
    sp_devalloc_t *d = pool->dev;
    uint32_t ctx = sp__history_on() ? sp__history_capture(false) : 0;
    sp_block_t *b = NULL;
    sp__lock(&d->lock);
    sp_status_t s =
        sp__alloc_install_segment(d, bpool_for(pool, rounded), base, alloc_size, stream, ctx, &b);
    if (s == SP_SUCCESS) {
        if (ctx)
            sp__history_context_retain(ctx); /* one reference for the segment, one the block */
        sp__alloc_found_block(d, b, rounded, size, ctx);
        *ptr_p = (void *)b->addr;
        *segment_seq_p = sp__bseg(b)->seq;
    }
    sp__unlock(&d->lock);
    if (s != SP_SUCCESS && ctx)
        sp__history_context_release(ctx);
    return s;
}

sp_status_t sp__pool_sym_detach(sp_mempool_t *pool, uint64_t segment_seq, void **base_p,
                                size_t *size_p, sp_stream_t *stream_p) {
    sp_devalloc_t *d = pool->dev;
    sp__lock(&d->lock);
    sp_segment_t *s = seg_by_seq(pool, segment_seq);
    if (!s || !sp__block_releasable(s->head)) {
        sp__unlock(&d->lock);
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL, "pool \"%s\": segment %llu %s",
                         pool->name ? pool->name : "", (unsigned long long)segment_seq,
                         s ? "holds an allocated or pending block" : "does not exist");
    }
    *base_p = (void *)s->base;
    *size_p = s->size;
    *stream_p = s->stream;
    sp__alloc_detach_segment(d, s);
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

size_t sp__pool_empty_device_cache(int device) {
    if (sp__alloc_ensure() != SP_SUCCESS || device < 0 || device >= sp__g.ndev)
        return 0;
    sp_devalloc_t *d = &sp__g.devs[device];
    sp__lock(&d->lock);
    size_t before = d->total_reserved;
    sp__alloc_release_cached(d, 0);
    size_t freed = before - d->total_reserved;
    sp__unlock(&d->lock);
    return freed;
}

sp_status_t sp__pool_check_stream(const sp_mempool_t *pool, sp_stream_t stream, const char *fn) {
    SP_CHECK(check_pool(pool));
    return sp__stream_check(stream, pool->device, fn);
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

bool sp__pool_capture_underway(const sp_mempool_t *pool) {
    return check_pool(pool) == SP_SUCCESS && sp__alloc_capture_underway(pool->dev);
}

bool sp__pool_device_capturing(int device) {
    if (!atomic_load_explicit(&sp__ready, memory_order_acquire) || device < 0 ||
        device >= sp__g.ndev)
        return false;
    return sp__alloc_capture_underway(&sp__g.devs[device]);
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
