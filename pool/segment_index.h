/*
 * segment_index.h: private to pool/: the per-device index of segments by address
 * (segment_index.c), with the device lock held.
 */
#ifndef SP_POOL_SEGMENT_INDEX_H
#define SP_POOL_SEGMENT_INDEX_H

#include <stdint.h>

#include "pool/allocator.h"

sp_status_t sp__segidx_insert(sp_devalloc_t *d, sp_segment_t *seg);
void sp__segidx_remove(sp_devalloc_t *d, sp_segment_t *seg);
sp_segment_t *sp__segidx_find(const sp_devalloc_t *d, uintptr_t addr);
/* Whether [base, base + size) meets a segment of d (size > 0, base + size not wrapping). */
bool sp__segidx_overlaps(const sp_devalloc_t *d, uintptr_t base, size_t size);
/* The block of seg that contains addr, or NULL. */
sp_block_t *sp__segment_block_at(sp_segment_t *seg, uintptr_t addr);
/* The one lookup of a pointer anywhere inside a block (its start or its middle): the block of
 * device d that contains addr, allocated or not (its segment is b->seg), or NULL. */
sp_block_t *sp__segidx_block(const sp_devalloc_t *d, uintptr_t addr);

#endif /* SP_POOL_SEGMENT_INDEX_H */
