/*
 * release.h: private to pool/: release.c's entry points: events of cross-stream frees, releasing
 * cached segments, garbage collection (all with the device lock held).
 */
#ifndef SP_POOL_RELEASE_H
#define SP_POOL_RELEASE_H

#include <stdbool.h>
#include <stddef.h>

#include "pool/allocator.h"

void sp__alloc_process_events(sp_devalloc_t *d);
/* Synchronize the events of every pending block (pool != NULL: only that pool's). */
void sp__alloc_sync_events(sp_devalloc_t *d, const sp_mempool_t *pool);
sp_status_t sp__alloc_insert_events(sp_devalloc_t *d, sp_block_t *b);
/* Release the fully free segments of one pool (stream filter when filter_stream). */
size_t sp__alloc_release_pool(sp_devalloc_t *d, sp_mempool_t *pool, bool filter_stream,
                              sp_stream_t stream);
/* PyTorch's release_cached_blocks({0,0}): sync events, free default and freeable pools. */
void sp__alloc_release_cached(sp_devalloc_t *d);
bool sp__alloc_release_available(sp_devalloc_t *d, sp_bpool_t *bp, size_t size, sp_stream_t stream);
void sp__alloc_gc(sp_devalloc_t *d);

#endif /* SP_POOL_RELEASE_H */
