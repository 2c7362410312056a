/*
 * expandable.h: private to pool/: expandable segments (expandable.c), what the malloc, release
 * and walk paths call. Every function runs with the device lock held.
 */
#ifndef SP_POOL_EXPANDABLE_H
#define SP_POOL_EXPANDABLE_H

#include "pool/allocator.h"

/* Does this pool grow expandable segments? Pools with a pluggable segment allocator and
 * symmetric pools keep fixed segments. */
static inline bool sp__exp_pool(const sp_mempool_t *pool) {
    return sp__g.exp_on && !pool->has_allocator && !pool->symmetric;
}
/* Bytes per mapped page of bp's expandable segments. */
size_t sp__exp_page(const sp_bpool_t *bp);
/* PyTorch's try_allocate_expandable_block: a free mapped block of >= size bytes, taken out of
 * the set, mapping pages (and reserving a segment) as needed. On SP_ERR_OUT_OF_MEMORY *why_p
 * is SP_GROW_POOL_LIMIT when the pool's limit refused. */
sp_status_t sp__exp_alloc(sp_devalloc_t *d, sp_bpool_t *bp, size_t size, sp_stream_t stream,
                          uint32_t ctx, sp_block_t **block_p, sp_grow_refusal_t *why_p);
/* SYMPOOL_EXPANDABLE_PIN: where a small request goes instead of best fit's b (expandable.c). */
sp_block_t *sp__exp_pin_small(sp_bpool_t *bp, sp_block_t *b, size_t size, sp_stream_t stream,
                              sp_block_t **pred_p);
/* SYMPOOL_EXPANDABLE_SIDE, FIT_END, ALIGN_SMALL: where in best fit's b a large request goes. */
sp_block_t *sp__exp_fit_end(sp_devalloc_t *d, sp_bpool_t *bp, sp_block_t *b, size_t size,
                            sp_block_t **pred_p);
/* Best fit among expandable blocks: from set block b on, the block that can expand least;
 * when it is not b, *pred_p becomes its in-order predecessor. */
sp_block_t *sp__exp_best_fit(sp_bpool_t *bp, sp_block_t *b, sp_stream_t stream,
                             sp_block_t **pred_p);
/* SYMPOOL_EXPANDABLE_SHARED: route pool's small requests to its large pool while the pool
 * reserves less than the option says (sets pool->small_max); called whenever pool->reserved
 * changes. */
void sp__exp_share_small(sp_mempool_t *pool);
/* Unmap the free pages of an expandable segment (after syncing its stream); releases the
 * segment when nothing is mapped any more. Returns the bytes unmapped. context: the releasing
 * call's stack for the segment_unmap entries (0: none gathered). */
size_t sp__exp_release(sp_devalloc_t *d, sp_segment_t *seg, uint32_t context);
/* Release seg if nothing of it is mapped (a growth's RECYCLE may unmap one end to end); 0. */
size_t sp__exp_release_unmapped(sp_devalloc_t *d, sp_segment_t *seg);
/* PyTorch's release_blocks for expandable blocks: unmap the free pages of each of v[0..n) (free
 * mapped blocks of expandable segments, gathered before any unmap) in that order, after one
 * device sync, releasing each segment once nothing of it is mapped. Returns the bytes unmapped
 * (0, nothing done, when the device cannot be synchronized). */
size_t sp__exp_release_blocks(sp_devalloc_t *d, sp_block_t *const *v, size_t n, uint32_t context);

#endif /* SP_POOL_EXPANDABLE_H */
