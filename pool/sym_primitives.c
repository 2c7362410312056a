/*
 * sym_primitives.c: what pool/pool.h offers symmetric/ to build its agreement protocol on:
 * find/take/grow a block by (segment seq, offset), sync pending frees, list and release whole
 * free segments of a symmetric pool. Each function takes the device lock itself.
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
    sp_block_t *b =
        seg && offset < seg->size ? sp__segment_block_at(seg, seg->base + offset) : NULL;
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
