/**
 * @file symmetric.h
 * @brief Symmetric MemPools: collective allocations at identical offsets of identically sized,
 *        registered segments on every rank (NCCL windows on cuda, MPI shared windows on host).
 */
#ifndef SYMPOOL_SYMMETRIC_H
#define SYMPOOL_SYMMETRIC_H

#include <stddef.h>
#include <stdint.h>

#include "sympool/mempool.h"
#include "sympool/status.h"
#include "sympool/world.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sp_window_info {
    void *window;         /**< ncclWindow_t on cuda, NULL elsewhere */
    void *segment_base;   /**< start of the registered segment on this rank */
    size_t offset;        /**< identical on every rank */
    size_t segment_size;  /**< identical on every rank */
    uint64_t segment_seq; /**< identical on every rank */
} sp_window_info_t;

/**
 * Collective: create a symmetric pool on the world's device (params->device is ignored). Every
 * rank checks its own arguments and creates its local pool, then the ranks agree (one round,
 * bounded by SYMPOOL_SYM_TIMEOUT): any failure or difference (flags, params->name, creation
 * order) is an error on every rank and no rank keeps a pool. A timeout (a rank late or absent)
 * leaves the world usable (world.h). params->use_on_oom must be false: a symmetric pool's blocks
 * are never lent to other allocations (a loan on one rank would make the ranks' caches differ).
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (NULL pool_p, params->allocator set,
 *         params->use_on_oom set),
 *         SP_ERR_INVALID_USAGE (not a live world, or another rank failed), SP_ERR_MISMATCH,
 *         SP_ERR_TIMEOUT, SP_ERR_NOT_SUPPORTED (no registrar here), SP_ERR_MPI.
 */
sp_status_t sp_symmetric_mempool_create(sp_world_t *w, const sp_mempool_params_t *params,
                                        sp_mempool_t **pool_p);

/**
 * Collective: every rank passes the same size in the same call order and receives a block at
 * the same segment and offset. Mismatch (sizes, or a rank in another call on this pool such as
 * sp_symmetric_empty_cache) -> SP_ERR_MISMATCH on every rank naming both, nothing allocated. A
 * bad argument on one rank (NULL ptr_p, a size the device cannot hold, a handle that is not a
 * stream of the pool's device, cudaStreamPerThread) -> SP_ERR_INVALID_ARGUMENT on every rank
 * (cudaStreamLegacy is the default stream, as in sp_malloc). A rank that does not
 * arrive within SYMPOOL_SYM_TIMEOUT -> SP_ERR_TIMEOUT (naming the call); the pool is then broken
 * on the ranks that timed out, and on a late rank when it arrives (it fails at once): its live
 * blocks stay valid and may be freed, further collective calls on it return
 * SP_ERR_INVALID_USAGE with the reason, and its segments stay registered until the process
 * exits (releasing them is collective and the missing rank may be gone). A
 * rank that cannot grow -> SP_ERR_OUT_OF_MEMORY everywhere, naming the ranks that could not.
 * On cuda, ranks whose NCCL symmetric support differs (NCCL_WIN_ENABLE or NCCL_CUMEM_ENABLE set
 * differently, on which NCCL's window registration would wait for good) -> SP_ERR_MISMATCH on
 * every rank at every growth (NCCL's support is fixed when its communicator is made), nothing
 * registered. On cuda, a rank short of host memory for the table of its node's devices ->
 * SP_ERR_SYSTEM on every rank, naming it, nothing registered. Growth holds no lock of the allocator
 * while ranks wait for each other: other threads' sp_malloc/sp_free, and other symmetric pools, go
 * on meanwhile. Calls on one pool are serialized on this rank; calls on different pools may run
 * from different threads at once (MPI_THREAD_MULTIPLE), in any order across ranks.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT, SP_ERR_INVALID_USAGE, SP_ERR_MISMATCH,
 *         SP_ERR_OUT_OF_MEMORY, SP_ERR_TIMEOUT, SP_ERR_MPI, SP_ERR_NCCL, SP_ERR_SYSTEM.
 */
sp_status_t sp_symmetric_malloc(sp_mempool_t *pool, size_t size, sp_stream_t stream, void **ptr_p);

/** Collective: release the segments that are free on every rank, in the same order (one
 * agreement round for the whole batch; on the nccl registrar also one for each released segment,
 * or one when none is, to put each deregistration, or the retry of what refused ones kept, in the
 * world's order of window changes). While a CUDA graph capture is under way on any rank's
 * device it releases nothing, on every rank (as PyTorch's empty_cache then), and succeeds.
 * On cuda each rank first waits for its device; if that fails on any rank, no rank releases a
 * segment (SP_ERR_DEVICE, or the failed wait's status on that rank). A segment whose release
 * fails on a rank (SP_ERR_NCCL, on that rank, naming the refused ncclCommWindowDeregister or
 * ncclMemFree) does not stop the others; the pool lets go of it on every rank, and that rank
 * keeps what NCCL refused and tries again at the world's next release, growth or
 * sp_symmetric_empty_cache (of any pool) and at sp_world_finalize, which frees the memory once the
 * communicator (and the window with it) is gone. While the ranks hold different such windows
 * (a deregistration refused again on some of them), no growth on the world's nccl pools
 * registers a window: sp_symmetric_malloc fails with SP_ERR_NCCL on every rank, saying so,
 * because NCCL would place the new window at different offsets of its symmetric address space
 * there. SP_ERR_MISMATCH, SP_ERR_TIMEOUT as sp_symmetric_malloc. */
sp_status_t sp_symmetric_empty_cache(sp_mempool_t *pool);

/**
 * Collective: destroy a symmetric pool. sp_mempool_destroy is not collective, so it cannot
 * deregister segments; use this instead. Every rank's pending frees are completed first.
 * Nothing is released while a CUDA graph capture is under way on any rank's device (releasing
 * synchronizes the device, which breaks a capture, and the graph may use the memory): destroy
 * the pool after the capture ends.
 * @return SP_SUCCESS; SP_ERR_BUSY on every rank if any rank still has a live block in the pool
 *         or is capturing a CUDA graph on its device (nothing is destroyed and the pool stays
 *         usable; the message names those ranks); SP_ERR_MISMATCH (a rank in
 *         another call on the pool); SP_ERR_INVALID_ARGUMENT (NULL); SP_ERR_INVALID_USAGE (not a
 *         live symmetric pool, or a pool broken by a timeout); SP_ERR_TIMEOUT; SP_ERR_NCCL on a
 *         rank where a segment's release was refused (as sp_symmetric_empty_cache): the pool is
 *         destroyed all the same, on every rank.
 * A call on the pool that another thread of this rank makes meanwhile waits for the destroy (calls
 * on one pool are serialized) and, if the pool was destroyed, is refused with
 * SP_ERR_INVALID_USAGE. A destroyed pool's few hundred bytes of state are kept only while such a
 * call may still hold a pointer to it (at the latest until its world is finalized, unless such a
 * call is still in flight then: then until a later destroy finds none).
 */
sp_status_t sp_symmetric_mempool_destroy(sp_mempool_t *pool);

/** Where @p ptr lives: window, segment base, offset, size and sequence number. */
sp_status_t sp_symmetric_window(const void *ptr, sp_window_info_t *info_p);

/**
 * A load/store pointer to the same offset on @p rank. Local (not collective), thread-safe, and
 * never waits for a collective call on the pool in another thread (nor does sp_symmetric_window).
 * Peer pointers exist within a node only: with the `mpi` registrar a segment is an MPI shared
 * window on the pool's own node communicator, so every rank of sp_world_node(w, rank) == this
 * rank's node is reachable and no other is. NCCL windows are registered on the whole job's
 * communicator (collectives across nodes use them), but this call gives no host pointer into
 * them.
 * @return SP_SUCCESS; SP_ERR_NOT_SUPPORTED when @p rank is on another node (the message names
 *         both nodes by index and host name) or the registrar has no host peer pointers (nccl);
 *         SP_ERR_INVALID_ARGUMENT (NULL, a rank outside the world, @p ptr not in a symmetric
 *         pool, @p ptr past the requested size of its buffer: the block's rounding slack is not
 *         the buffer's); SP_ERR_INVALID_USAGE (the `mpi` registrar after the user's MPI_Finalize).
 */
sp_status_t sp_symmetric_peer_ptr(const void *ptr, int rank, void **peer_ptr_p);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_SYMMETRIC_H */
