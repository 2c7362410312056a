/*
 * pool.h: what the caching allocator (pool/) offers the other modules of the library:
 * pointer lookup, a consistent walk over segments and blocks (snapshots), history hooks, and the
 * primitives symmetric/ builds its agreement protocol on. Nothing here is exported.
 *
 * Locking: every function takes the device allocator's lock itself; none may be called with it
 * held, except the history hooks, which the allocator calls under its lock.
 */
#ifndef SP_POOL_POOL_H
#define SP_POOL_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sympool/mempool.h"
#include "sympool/pool.h"
#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- lookup ----------------------------------------------------------------------------- */

/* What sympool knows of a live (allocated) block. */
typedef struct sp_block_info {
    int device;            /* device of the block */
    void *block_base;      /* start of the block (== the pointer sp_malloc returned) */
    size_t block_size;     /* rounded size of the block */
    size_t requested_size; /* what the caller asked for */
    void *segment_base;    /* start of its segment */
    size_t segment_size;   /* bytes of its segment */
    uint64_t segment_seq;  /* the segment's sequence number within its pool (from 0) */
    sp_mempool_t *pool;    /* owning pool */
    sp_stream_t stream;    /* allocation stream */
} sp_block_info_t;

/* Find the live block that contains ptr (anywhere inside it, not only its start).
 * SP_ERR_INVALID_USAGE (quiet) when ptr is in no live block of any device. */
sp_status_t sp__pool_lookup(const void *ptr, sp_block_info_t *info_p);

/* sp_x_free_block_set_requested (sympool/experimental.h): the free block that starts at ptr
 * shows `requested` as its requested size in snapshots. */
sp_status_t sp__pool_free_set_requested(void *ptr, size_t requested);

/* Tests only: put `ops` (a struct sp_device_ops *, e.g. the host backend's with one op wrapped)
 * in place of the initialized backend's table and return the previous one; put that back before
 * sp_shutdown. No other thread may be inside sympool meanwhile. */
const void *sp__pool_swap_device_ops(const void *ops);

/* Tests only: where a device's block structs come from. */
typedef struct sp_block_structs {
    size_t slabs;     /* slabs this allocator hands structs out of */
    size_t kept;      /* slabs earlier allocators of the device left, not yet used again */
    size_t untouched; /* structs of the newest slab never handed out */
    size_t spare;     /* structs back on the spare list */
    size_t seg_spare; /* segment structs back on the segment spare list */
} sp_block_structs_t;
sp_status_t sp__pool_block_structs(int device, sp_block_structs_t *out);

/* ---- walk (snapshots) ------------------------------------------------------------------- */

typedef enum {
    SP_BLOCK_INACTIVE,
    SP_BLOCK_ACTIVE_ALLOCATED,
    SP_BLOCK_ACTIVE_PENDING_FREE
} sp_block_state_t;

typedef struct sp_block_view {
    uintptr_t address;
    size_t size;
    size_t requested_size; /* inactive blocks: PyTorch's kept value (block.h's requested) */
    sp_block_state_t state;
    uint32_t context; /* history context id of the block's allocation, 0 if none */
} sp_block_view_t;

typedef struct sp_segment_view {
    int device;
    uintptr_t address;
    size_t total_size; /* == sum of its blocks' sizes */
    size_t allocated_size;
    size_t active_size;
    size_t requested_size;
    uintptr_t stream; /* (uintptr_t) of the stream handle; 0 = default stream */
    bool is_small;    /* segment_type "small" or "large": from the pool, not the size */
    bool is_expandable;
    sp_mempool_id_t pool_id;
    const char *pool_name; /* NULL if unnamed */
    uint64_t segment_seq;
    uint32_t context; /* history context id of the segment's allocation, 0 if none */
    size_t nblocks;
    const sp_block_view_t *blocks; /* in address order, contiguous */
} sp_segment_view_t;

typedef void (*sp_segment_visit_fn)(const sp_segment_view_t *segment, void *arg);

/* Visit every segment of `device` (or of every device when device < 0) in address order, under
 * the allocator lock(s), so that what the visitor sees is one consistent state. pool != NULL
 * restricts the walk to that pool's segments. The visitor must not call back into sympool. */
sp_status_t sp__pool_walk(int device, const sp_mempool_t *pool, sp_segment_visit_fn visit,
                          void *arg);
/* sp__pool_walk that first calls start(arg) under the same locks, before any segment and whether
 * or not one follows (a snapshot copies its traces there, in the state the segments show), and
 * end(arg) after the last one, still under them, when the walk succeeded (a snapshot's marker
 * entry goes there: no entry of a later state can come before it). start or end may be NULL. */
sp_status_t sp__pool_walk_from(int device, const sp_mempool_t *pool, void (*start)(void *),
                               sp_segment_visit_fn visit, void (*end)(void *), void *arg);

/* Run fn(arg) while holding every device allocator's lock: the history module uses it to copy
 * the trace buffers in the same consistent state as a walk. */
sp_status_t sp__pool_locked(void (*fn)(void *arg), void *arg);

/* ---- pool metadata ---------------------------------------------------------------------- */

/* Check a pool handle before reading through it: SP_ERR_INVALID_ARGUMENT (NULL, or not a handle
 * sympool gave out), SP_ERR_INVALID_USAGE (a handle from before sp_shutdown), with the message
 * set. `what` names the public call in the message. */
sp_status_t sp__mempool_check(const sp_mempool_t *pool, const char *what);

/* These answer NULL / -1 for a bad handle (quietly). */
const char *sp__mempool_name(const sp_mempool_t *pool); /* NULL if unnamed */
int sp__mempool_device(const sp_mempool_t *pool);

/* ---- symmetric support ------------------------------------------------------------------ */

/*
 * A symmetric pool is a MemPool whose segments come from a registrar (the allocator callbacks in
 * its params) and whose growth and release are collective, so the allocator itself never grows
 * it (sp_malloc routing and sp_mempool_malloc are refused) and never releases its segments
 * (sp_empty_cache, the OOM retry and GC skip it). Its free blocks are ordered by
 * (stream, size, segment_seq, offset) instead of by address, so that best fit picks the same
 * block on every rank that holds the same cache. Its blocks may still be lent to OOM'ed
 * requests if params->use_on_oom.
 */
sp_status_t sp__mempool_create_symmetric(const sp_mempool_params_t *params, void *sym_state,
                                         sp_mempool_t **pool_p);
void *sp__mempool_sym_state(const sp_mempool_t *pool); /* NULL for ordinary pools */
/* sp_mempool_destroy without its refusal of symmetric pools: for symmetric/'s collective
 * destroy (and the undo of a failed create). */
sp_status_t sp__mempool_destroy_internal(sp_mempool_t *pool);

/* The one size check and rounding of a symmetric allocation: *rounded_p = 0 for size 0;
 * SP_ERR_INVALID_ARGUMENT for a size the device cannot hold. The functions below take the
 * rounded size it gives. */
sp_status_t sp__pool_sym_size(const sp_mempool_t *pool, size_t size, size_t *rounded_p);

/* This rank's best-fit candidate for `rounded` bytes on `stream`, without taking it.
 * *found_p = false when no cached block fits. */
sp_status_t sp__pool_sym_find(sp_mempool_t *pool, size_t rounded, sp_stream_t stream, bool *found_p,
                              uint64_t *segment_seq_p, size_t *offset_p);

/* Take the free block that starts at (segment_seq, offset) for `rounded` bytes (`size` asked),
 * splitting it by the pool's rules. SP_ERR_INVALID_USAGE (quiet) if that block is not free and
 * large enough. */
sp_status_t sp__pool_sym_take(sp_mempool_t *pool, size_t rounded, size_t size, sp_stream_t stream,
                              uint64_t segment_seq, size_t offset, void **ptr_p);

/* Growth, owned by symmetric/: plan (PyTorch's segment size for `rounded`, checked against the
 * memory fraction and the pool's limit; SP_ERR_OUT_OF_MEMORY, quiet, when there is no room),
 * then the registrar allocates with no pool lock held, then adopt: ONE locked call makes
 * [base, base+alloc_size) a segment of the pool and hands out its block at offset 0
 * (SP_ERR_SYSTEM on host memory, leaving base to the caller). */
sp_status_t sp__pool_sym_plan(sp_mempool_t *pool, size_t rounded, sp_stream_t stream,
                              size_t *alloc_size_p);
sp_status_t sp__pool_sym_adopt(sp_mempool_t *pool, void *base, size_t alloc_size, size_t rounded,
                               size_t size, sp_stream_t stream, void **ptr_p,
                               uint64_t *segment_seq_p);

/* Release, the mirror: detach the entirely free segment `segment_seq` from the pool under the
 * lock (it leaves the pool, the address index and the statistics) and return its memory and
 * the stream its blocks were used on; the caller deregisters and frees it with no lock held.
 * SP_ERR_INVALID_USAGE if it holds an allocated or pending block. */
sp_status_t sp__pool_sym_detach(sp_mempool_t *pool, uint64_t segment_seq, void **base_p,
                                size_t *size_p, sp_stream_t *stream_p);

/* Release the free cached segments of `device`'s ordinary pools (sp_empty_cache for one
 * device; symmetric pools are never touched): the nccl registrar's retry when ncclMemAlloc
 * finds the device full of sympool's own cache. Returns the bytes released. */
size_t sp__pool_empty_device_cache(int device);

/* SP_ERR_INVALID_ARGUMENT (naming fn) unless stream is NULL or a stream of `device` that the
 * backend knows: sp_malloc's rule, the one every call taking a stream applies. */
sp_status_t sp__stream_check(sp_stream_t stream, int device, const char *fn);

/* CUDA's pseudo stream handles as sp_malloc takes them, for the other calls that key the cache by
 * stream (sp_mempool_malloc, sp_mempool_free_all_blocks, sp_symmetric_malloc): cudaStreamLegacy
 * becomes NULL (the default stream, whose blocks it shares), cudaStreamPerThread is
 * SP_ERR_INVALID_ARGUMENT (one handle for a different stream on every thread cannot key the
 * cache); any other handle is left as it is, for the caller's own check. `what` names the public
 * call in the message. */
sp_status_t sp__alloc_map_stream(const char *what, sp_stream_t *stream_p);

/* sp__stream_check on the pool's device, for callers that must check before agreeing. */
sp_status_t sp__pool_check_stream(const sp_mempool_t *pool, sp_stream_t stream, const char *fn);

/* Synchronize the events of this pool's blocks whose frees are pending, completing those frees. */
sp_status_t sp__pool_sync_pending(sp_mempool_t *pool);

/* The sequence numbers of the pool's segments that are entirely free, ascending. Writes at most
 * max of them and the total count to *count_p. */
sp_status_t sp__pool_free_segments(sp_mempool_t *pool, uint64_t *seqs, size_t max, size_t *count_p);

/* Whether a CUDA graph capture is under way on the pool's device: PyTorch releases nothing
 * cached then (a release's synchronize would break the capture), nor may a symmetric pool. */
bool sp__pool_capture_underway(const sp_mempool_t *pool);
/* The same question about a device, for a caller that may no longer hold a live pool handle (the
 * world finalize hook: sp_shutdown may have released its pools). False while sympool is not
 * initialized: it is not started again only to ask. */
bool sp__pool_device_capturing(int device);

/* Number of segments the pool holds, and the next sequence number it will give. */
size_t sp__pool_segment_count(const sp_mempool_t *pool);
uint64_t sp__pool_next_segment_seq(const sp_mempool_t *pool);

/* Find a segment of the pool by sequence number: base and size. */
sp_status_t sp__pool_segment_info(const sp_mempool_t *pool, uint64_t segment_seq, void **base_p,
                                  size_t *size_p);

/* After CUDA work on `device` outside the device backend (symmetric/, collectives/): make `prev`
 * (the caller's device from cudaGetDevice before the switch; -1: unknown) current again, but only
 * when it has a primary context, as PyTorch's MaybeExchangeDevice does. A thread that never chose
 * a device reads 0 from cudaGetDevice, and setting it back would make a context on GPU 0 that the
 * process never asked for. Errors are dropped (the switch back is best effort). Built with CUDA
 * only (pool/device/cuda.c). */
void sp__cuda_restore_device(int device, int prev);

#ifdef __cplusplus
}
#endif

#endif /* SP_POOL_POOL_H */
