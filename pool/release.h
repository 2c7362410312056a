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
/* sp_stream_destroy: `stream` leaves the uses lists of the device's live blocks (after a
 * synchronize of it), so that their frees never hand its handle, stale by then, to the backend. */
void sp__alloc_forget_stream(sp_devalloc_t *d, sp_stream_t stream);
/* Whether a graph capture is under way on the device (nothing cached is released then). */
bool sp__alloc_capture_underway(sp_devalloc_t *d);
/* The device's event queues freed (dev_fini). */
void sp__alloc_events_fini(sp_devalloc_t *d);
/* Every release below takes `context`, the history context of the call that releases (0 if it
 * gathered none), for the segment_free entries (sp__alloc_release_segment). */
/* Release the fully free segments of one pool (stream filter when filter_stream: found through
 * the pool's free sets, not a walk of every segment, unless sp__release_by_walk). */
size_t sp__alloc_release_pool(sp_devalloc_t *d, sp_mempool_t *pool, bool filter_stream,
                              sp_stream_t stream, uint32_t context);
/* Tests: a stream's release walks every segment too, as it did before (the two must agree). */
extern bool sp__release_by_walk;
/* PyTorch's release_cached_blocks({0,0}): sync events, free default and freeable pools. */
void sp__alloc_release_cached(sp_devalloc_t *d, uint32_t context);

/* A release's device refusals, for the public calls that must report them as PyTorch's
 * emptyCache does (its release_block's C10_CUDA_CHECK(cudaFree) throws), after releasing all
 * the rest: sp__release_watch starts watching this thread's releases, sp__release_refused (at
 * the place a refusal leaves memory on the device: a cudaFree, an unmap, the sync before one)
 * keeps the first refusal's status and text while watched, and sp__release_report ends the watch
 * and returns SP_SUCCESS, or the first refusal as fn's error (SP_ERR_DEVICE for a refusal the
 * backend called out of memory: nothing was asked for). Thread-local: a release runs on its
 * caller's thread, under the device lock. */
void sp__release_watch(void);
void sp__release_refused(sp_status_t status);
sp_status_t sp__release_report(const char *fn);
bool sp__alloc_release_available(sp_devalloc_t *d, sp_bpool_t *bp, size_t size, sp_stream_t stream,
                                 uint32_t context);
void sp__alloc_gc(sp_devalloc_t *d, uint32_t context);

#endif /* SP_POOL_RELEASE_H */
