/**
 * @file mempool.h
 * @brief MemPools with PyTorch's semantics (ids, use count, routing, pluggable allocator,
 *        use_on_oom, no_split) and CuPy's pool queries and limits.
 *
 * Thread-safe unless noted. A block always returns to the pool it came from, whoever frees it.
 */
#ifndef SYMPOOL_MEMPOOL_H
#define SYMPOOL_MEMPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sympool/pool.h"
#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sp_mempool sp_mempool_t;

/** {0,0} is the default pool; user pools are {0,n} with n from one process-wide counter. */
typedef struct sp_mempool_id {
    uint64_t first, second;
} sp_mempool_id_t;

/** A segment allocator; mirrors CUDAPluggableAllocator. The callbacks run under the device's
 * allocator lock (as PyTorch calls a MemPool allocator's raw_alloc under its allocator mutex): a
 * sympool call from inside one returns SP_ERR_INVALID_USAGE (it would deadlock). A fork() while
 * another thread is inside one does not wait for it (it may wait for what the forking thread
 * holds, as a Python callback waits for the GIL that os.fork() keeps): the child's allocator is
 * off instead, every call failing with SP_ERR_DEVICE (docs/API.md, Python).
 */
typedef struct sp_allocator {
    /** Allocate a segment of @p size bytes; NULL means out of memory. */
    void *(*alloc)(size_t size, int device, sp_stream_t stream, void *ctx);
    /** Free a segment with the size and stream it was allocated with. */
    void (*free)(void *ptr, size_t size, int device, sp_stream_t stream, void *ctx);
    void *ctx; /**< passed to both callbacks */
} sp_allocator_t;

typedef struct sp_mempool_params {
    const sp_allocator_t *allocator; /**< NULL: the device backend; copied at create */
    bool use_on_oom;                 /**< lend free cached blocks to allocations that hit OOM */
    bool no_split;                   /**< never split blocks of this pool */
    int device;                      /**< -1: device 0 */
    const char *name; /**< shown in logs, reports and snapshots; may be NULL; copied */
} sp_mempool_params_t;

/** Fill @p params with the defaults (no allocator, no flags, device -1, no name). */
void sp_mempool_params_init(sp_mempool_params_t *params);

/*
 * Handles: every call below checks its pool handle before reading through it. NULL, or a pointer
 * sympool never gave out, is SP_ERR_INVALID_ARGUMENT; a handle from before sp_shutdown (every
 * pool, the default pools included, ends there) is SP_ERR_INVALID_USAGE. The queries that return
 * a value answer 0 ({0,0}, false) for a bad handle and leave the reason in sp_last_error().
 */

/**
 * Create a pool with id {0,n} and use count 1.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (NULL pool_p, unknown device, allocator without
 *         both callbacks), SP_ERR_SYSTEM.
 */
sp_status_t sp_mempool_create(const sp_mempool_params_t *params, sp_mempool_t **pool_p);

/**
 * Drop the creator's use and release the pool's free cached segments now. Segments still holding
 * live blocks are released when those blocks are freed and the cache is emptied. While a CUDA
 * graph capture is under way on the pool's device nothing is released now (that would break
 * the capture): the free segments go with a later sp_empty_cache too.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (NULL, not a pool handle), SP_ERR_INVALID_USAGE
 *         (the default pool, a pool already destroyed, a pool still routed by sp_mempool_begin,
 *         a handle from before sp_shutdown, a symmetric pool: destroying one is collective, use
 *         sp_symmetric_mempool_destroy).
 */
sp_status_t sp_mempool_destroy(sp_mempool_t *pool);

/** The device's default pool, or NULL for an unknown device. Never destroyed. */
sp_mempool_t *sp_default_mempool(int device);

/** The pool's id ({0,0} for the default pool and for NULL). */
sp_mempool_id_t sp_mempool_id(const sp_mempool_t *pool);

/** PyTorch's use count: 1 after create, +1 per active sp_mempool_begin. 0 for NULL. */
int sp_mempool_use_count(const sp_mempool_t *pool);

/** Whether the pool was made by sp_symmetric_mempool_create. */
bool sp_mempool_is_symmetric(const sp_mempool_t *pool);

/**
 * Route this thread's sp_malloc on the pool's device into @p pool until sp_mempool_end.
 * Nested begin/end on different pools works as a stack. Increments the use count. A thread that
 * exits with routings active has them ended at its exit (with a warning), so their pools' use
 * counts drop and the pools can be destroyed.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (NULL), SP_ERR_INVALID_USAGE (pool already
 *         routed on this thread, destroyed, or symmetric).
 */
sp_status_t sp_mempool_begin(sp_mempool_t *pool);

/** End the innermost routing of this thread. @return SP_ERR_INVALID_USAGE if @p pool is not it. */
sp_status_t sp_mempool_end(sp_mempool_t *pool);

/** Allocate in @p pool directly. @return as sp_malloc; SP_ERR_INVALID_USAGE for a symmetric pool.
 */
sp_status_t sp_mempool_malloc(sp_mempool_t *pool, size_t size, sp_stream_t stream, void **ptr_p);

/** Bytes of the pool's segments handed out (allocated blocks). */
size_t sp_mempool_used_bytes(const sp_mempool_t *pool);
/** Bytes of all the pool's segments. */
size_t sp_mempool_total_bytes(const sp_mempool_t *pool);
/** total - used. */
size_t sp_mempool_free_bytes(const sp_mempool_t *pool);
/** Number of free cached blocks. */
size_t sp_mempool_n_free_blocks(const sp_mempool_t *pool);

/** Release the pool's fully free segments; NULL stream: all streams, else only that stream's
 * (cudaStreamLegacy: the default stream's, as sp_malloc caches its blocks; cudaStreamPerThread is
 * SP_ERR_INVALID_ARGUMENT, as in sp_malloc). While a CUDA graph capture is under way on the pool's
 * device nothing is released (as sp_empty_cache). A segment the device refuses to free stays
 * cached and the rest is released first (as sp_empty_cache).
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (bad handle, a stream sympool did not make or of
 *         another device), SP_ERR_INVALID_USAGE (stale handle, symmetric pool), SP_ERR_DEVICE
 *         (the device refused to free cached memory; sp_last_error() names the call). */
sp_status_t sp_mempool_free_all_blocks(sp_mempool_t *pool, sp_stream_t stream);

/** Cap the pool's total bytes; 0 = no limit. A request that would pass it first releases the
 * pool's own free cached segments (every stream) and retries once (CuPy's rule; counted in
 * num_alloc_retries); if it would still pass the limit it fails with OOM. While a CUDA graph
 * capture is under way on the device there is no release and no retry (PyTorch's rule).
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (bad handle), SP_ERR_INVALID_USAGE (stale handle, a
 *         pool already destroyed: nothing is changed). */
sp_status_t sp_mempool_set_limit(sp_mempool_t *pool, size_t bytes);
/** The pool's cap, 0 if none. */
size_t sp_mempool_get_limit(const sp_mempool_t *pool);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_MEMPOOL_H */
