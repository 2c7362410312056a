/*
 * thread_cache.h: private to pool/: the opt-in per-thread cache of freed blocks
 * (SYMPOOL_THREAD_CACHE, thread_cache.c; docs/threads.md says what it changes).
 *
 * A block in a thread cache stays allocated from its pool's point of view: in the device's pointer
 * map and in every statistic, with the requested size of the request that took it from the pool.
 * The cache is a layer above the pool, the way a program that keeps its freed buffers is: a
 * sp_malloc it serves and a sp_free it keeps touch only the calling thread's cache (its own lock,
 * its own cache line), never the device lock or the shared statistics.
 *
 * Such a block is "registered": its `bal` (unused while allocated) holds SP_TC_MARK and the
 * storage of its recorded streams (it has none: block.h) its owner cache. Marking, unmarking and
 * the device's count of registered blocks change only under the device lock, so any thread holding
 * it knows whether a block is registered and with whom.
 *
 * Lock order: sp__g.init_lock, device locks (device order), the cache registry, one thread
 * cache's lock. A thread never holds two thread caches' locks at once, and takes no other lock
 * while it holds its own cache's lock.
 */
#ifndef SP_POOL_THREAD_CACHE_H
#define SP_POOL_THREAD_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool/allocator.h"

/* `bal` of a registered block (block.h). */
#define SP_TC_MARK SP_BLOCK_TC_MARK
/* The largest block a thread cache holds: the small pool's requests. */
#define SP_TC_MAX_BLOCK SP_SMALL_SIZE

static inline bool sp__tc_registered(const sp_block_t *b) {
    return b->allocated && b->bal == SP_TC_MARK;
}

/* sp_malloc with the cache on, history off, the default pool and a valid device, size and
 * stream: a block of exactly round_512(size) on (device, stream) from the calling thread's
 * cache, or false (nothing done: the ordinary path runs). Takes no device lock. */
bool sp__tc_malloc(size_t size, int device, sp_stream_t stream, void **ptr_p);

/* sp_free / sp_torch_free with the cache on and history off: a block the calling thread's cache
 * handed out goes back into it. true: done (*req_p and *device_p, when not NULL, get the size
 * the caller requested and the device). false: nothing done (not the calling thread's, or no
 * room): the ordinary path runs, and its hook (sp__tc_on_free) decides. Takes no device lock. */
bool sp__tc_free(uintptr_t addr, size_t *req_p, int *device_p);

/* sp_malloc's and sp_free's signatures: what the two calls below go on to when the cache does not
 * serve the call. */
typedef sp_status_t (*sp_malloc_fn_t)(size_t, int, sp_stream_t, void **);
typedef sp_status_t (*sp_free_fn_t)(void *);

/* sp__tc_malloc for sp_malloc's hit copies (allocator.c): the block from the cache, or else
 * next(size, device, stream, ptr_p) (a tail call: the caller saves no register around the cache's
 * look). */
sp_status_t sp__tc_malloc_or(size_t size, int device, sp_stream_t stream, void **ptr_p,
                             sp_malloc_fn_t next);

/* sp__tc_free for sp_free's hit copies (allocator.c), with ptr not NULL: the block back into the
 * cache, or else next(ptr) (a tail call). It makes the thread's cache as sp__tc_free does; a
 * thread whose cache has no block out (handed out to it and not yet freed: none can come back)
 * goes to next at once, without the cache's lock. */
sp_status_t sp__tc_free_or(void *ptr, sp_free_fn_t next);

typedef enum sp_tc_verdict {
    SP_TC_FREE = 0, /* free the block to its pool as usual (it is unregistered now) */
    SP_TC_KEPT = 1, /* the calling thread's cache keeps it: the free is done */
    SP_TC_TWICE = 2 /* it is idle in a thread cache already: a double free, nothing done */
} sp_tc_verdict_t;

/* The ordinary free's hook, device lock held, for allocated block b found at its start: takes
 * b out of the cache that holds it (its requested size becomes the one its last caller asked
 * for, *req_p), then lets the calling thread's cache keep it if it may (`hist`: history is on,
 * it may not). Free the block only on SP_TC_FREE. */
sp_tc_verdict_t sp__tc_on_free(sp_devalloc_t *d, sp_block_t *b, bool hist, size_t *req_p);

/* Take registered block b out of its cache (device lock held): sp_record_stream before it
 * records a stream on b, whose free must then wait for events. false: b is idle in a cache
 * (freed: no stream may be recorded on it); nothing changed. */
bool sp__tc_unregister(sp_devalloc_t *d, sp_block_t *b);

/* Whether allocated block b is idle in a thread cache (freed by its caller), without taking it
 * out (device lock held). */
bool sp__tc_idle_block(const sp_block_t *b);

/* Give every idle block of device d in every thread cache back to its pool (device lock held).
 * Returns the bytes given back. Before the pool grows, sp_empty_cache, sp_shutdown, a stream's
 * destruction, and a walk (snapshots). */
size_t sp__tc_drain(sp_devalloc_t *d);

/* The blocks of device d idle in every thread cache, and their bytes if bytes_p (the registry
 * and each cache's lock taken here; callers may hold d's lock). sp_shutdown's "still allocated"
 * check discounts them before it drains, so that a refused shutdown leaves the caches alone. */
size_t sp__tc_idle(int device, size_t *bytes_p);

/* fork() (fork.c): hold the registry and every thread cache's lock across it (after the device
 * locks), and release them in parent and child. The child keeps the caches of the threads it did
 * not inherit: their idle blocks go back to the pool at its next drain. */
void sp__tc_fork_lock(void);
/* in_child: the fork child's handler (core_lock.h's sp__lock_fork_child on each lock first). */
void sp__tc_fork_unlock(bool in_child);

#endif /* SP_POOL_THREAD_CACHE_H */
