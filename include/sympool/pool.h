/**
 * @file pool.h
 * @brief The per-device caching allocator: one per device per process, with PyTorch's semantics.
 *
 * All functions are thread-safe. Devices are numbered from 0 to sp_device_count() - 1.
 * The backend is chosen once, lazily, from SYMPOOL_DEVICE (auto|cuda|host).
 */
#ifndef SYMPOOL_POOL_H
#define SYMPOOL_POOL_H

#include <stddef.h>

#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** cudaStream_t on cuda; a host stream on host; NULL is the device's default stream. */
typedef void *sp_stream_t;

/**
 * Initialize sympool from the environment. Optional: every call initializes lazily.
 * A malformed SYMPOOL_DEVICE (an unknown backend name) warns and selects "auto", as every
 * malformed SYMPOOL_* value keeps its default.
 * @return SP_SUCCESS, SP_ERR_DEVICE (backend failed to start), SP_ERR_NOT_SUPPORTED
 *         (SYMPOOL_DEVICE=cuda in a build without CUDA), SP_ERR_SYSTEM (no host memory or
 *         address space at initialization).
 */
sp_status_t sp_init(void);

/**
 * Release every cached segment, pool and stream; the next call initializes again.
 * Other threads' calls: shutdown waits for the calls already inside sympool, and a call that
 * arrives while it runs returns SP_ERR_INVALID_USAGE (a query that returns a number returns 0,
 * sp_backend_name "none"); calls after it returned initialize again. The caller guarantees that
 * no thread is inside sp_malloc, sp_free, sp_record_stream, sp_mempool_malloc or the sp_torch_*
 * calls while it runs (the allocation path takes no gate, to stay cheap; every block must be
 * freed before shutdown anyway), and that no symmetric pool or world call runs concurrently.
 * All device memory is given back; up to four slabs of block records per device (about 100 KiB
 * of host memory each) are kept for the next initialization, so a process that initializes
 * and shuts down in a loop (replay's --repeat and --compare) does not fault its heap in again.
 * @return SP_SUCCESS; SP_ERR_BUSY if blocks are still allocated, or a CUDA graph capture is under
 *         way on a device holding segments (then nothing is released).
 */
sp_status_t sp_shutdown(void);

/** "cuda" or "host" (initializes lazily; "none" if initialization failed). */
const char *sp_backend_name(void);

/** Number of devices of the backend (0 if initialization failed). */
int sp_device_count(void);

/**
 * Allocate @p size bytes on @p device, ordered on @p stream. A size of 0 gives *ptr_p = NULL.
 * The calling thread's innermost sp_mempool_begin() pool on that device receives the request.
 * A size the device cannot hold is an out-of-memory like any other, after the releases and the
 * one retry (counted in num_alloc_retries and num_ooms; the message says "Tried to allocate
 * <size>", as PyTorch's does; while a CUDA graph capture is under way on the device, PyTorch's
 * final release and retry are skipped, and no retry is counted); 1 EB or more is PyTorch's "Tried
 * to allocate more than 1EB memory", refused before the allocator runs (not counted).
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (NULL ptr_p, unknown device, a stream of another
 *         device, on host a stream sympool did not make (on cuda see sp_stream_synchronize)),
 *         SP_ERR_OUT_OF_MEMORY (after freeing the cache and one retry), SP_ERR_DEVICE.
 */
sp_status_t sp_malloc(size_t size, int device, sp_stream_t stream, void **ptr_p);

/**
 * Return a block to the pool it came from. NULL is a no-op. If the block was used on other
 * streams (sp_record_stream), it is reused only once those streams have passed this point.
 * @return SP_SUCCESS, SP_ERR_INVALID_USAGE (a pointer sympool did not return, or a double free).
 */
sp_status_t sp_free(void *ptr);

/**
 * Mark the block holding @p ptr as used on @p stream, so that freeing it waits for that stream.
 * A use on the block's own allocation stream is ignored. NULL (an empty tensor's storage) is a
 * no-op, as in PyTorch's recordStream.
 * @return SP_SUCCESS, SP_ERR_INVALID_USAGE (not a live sympool block), SP_ERR_INVALID_ARGUMENT
 *         (a stream sp_stream_create did not make, or one of another device), SP_ERR_DEVICE.
 */
sp_status_t sp_record_stream(void *ptr, sp_stream_t stream);

/**
 * Release every fully free cached segment of every device back to the device, after waiting
 * for pending stream uses. Pools whose use count is 0 are released too. Symmetric pools are
 * not touched (see sp_symmetric_empty_cache, which is collective). A segment (or expandable
 * pages) the device refuses to free stays cached, counted in the statistics, and a later call
 * tries it again; everything else is released first. Not while a CUDA graph capture is under
 * way on a device: that device's cache is kept, and that is no error.
 * @return SP_SUCCESS, SP_ERR_DEVICE (the device refused to free cached memory: cudaFree, an
 *         unmap or the synchronize before it; sp_last_error() names the call),
 *         SP_ERR_INVALID_USAGE (from inside a callback, or while sp_shutdown runs), or an
 *         initialization error of the first call.
 */
sp_status_t sp_empty_cache(void);

/**
 * Cap this process's reserved memory on @p device at fraction x total device memory.
 * @param fraction in [0, 1]; 1 removes the cap.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (fraction outside [0,1], unknown device).
 */
sp_status_t sp_set_memory_fraction(double fraction, int device);

/**
 * (sympool addition) The fraction last set on @p device by sp_set_memory_fraction, exactly as
 * given; 1.0 when none was set (torch.cuda.get_per_process_memory_fraction).
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (NULL @p fraction_p, unknown device).
 */
sp_status_t sp_get_memory_fraction(int device, double *fraction_p);

/** Free and total bytes of the device as the backend reports them (cudaMemGetInfo). */
sp_status_t sp_get_memory_info(int device, size_t *free_p, size_t *total_p);

/** Device memory as the device sees it, against what this process's sympool holds. */
typedef struct sp_device_usage {
    size_t total;     /**< the device's memory (sp_get_memory_info's total) */
    size_t used;      /**< total - free: in use by anyone (every process and library) */
    size_t reserved;  /**< of it, segments this process's sympool holds on the device */
    size_t untracked; /**< used - reserved (at least 0): memory sympool did not reserve, e.g.
                           NCCL's own buffers, other libraries, other processes */
} sp_device_usage_t;

/**
 * Device memory in use that sympool did not reserve: total - free from the backend's memory
 * info, less the bytes of this process's segments that are device memory. On cuda that is every
 * segment (pluggable and symmetric segments included: ncclMemAlloc is device memory), and other
 * processes on the same GPU count as untracked. On the host backend the emulated device counts
 * what was taken from it by anyone in this process (sympool's own segments and any other
 * mem_alloc of the device); segments from a MemPool's own allocator or from MPI shared windows
 * (symmetric pools there) are host memory, not the emulated device's, and are not subtracted.
 * Local, thread-safe; the two figures are read one after the other, so a concurrent allocation
 * may show in one of them only (untracked is clamped at 0).
 * `device.used_bytes` and `device.untracked_bytes` in sp_stats_aggregate, every report and
 * sp_memory_summary are these figures.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (NULL, unknown device), SP_ERR_DEVICE.
 */
sp_status_t sp_device_usage(int device, sp_device_usage_t *usage_p);

/**
 * Create a stream on @p device (cuda: non-blocking). "A CUDA graph capture under way on the
 * device", which stops releases and device-wide waits, is a capture on a stream made here or on a
 * blocking stream of the device (the legacy stream then captures too); a capture on a
 * non-blocking stream the application made itself cannot be seen (CUDA has no per-device query),
 * so keep sp_empty_cache and the other releases out of it.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT, SP_ERR_DEVICE.
 */
sp_status_t sp_stream_create(int device, sp_stream_t *stream_p);

/** Destroy a stream made by sp_stream_create. The default stream (NULL, or cudaStreamLegacy) and
 * cudaStreamPerThread are rejected (SP_ERR_INVALID_ARGUMENT, nothing done). Waits for
 * the stream's queued work first: a stream created later may get the same handle, which is the
 * cache's key for the blocks freed on this one. Its free cached segments are released; one that
 * still holds a live block stays (its blocks go back to it when freed) until the cache is emptied,
 * and meanwhile every malloc checks its stream, so the destroyed handle is refused (host).
 * SP_ERR_BUSY while a CUDA graph capture is under way on the stream's device (releasing the blocks
 * cached under it would break the capture): nothing is destroyed. */
sp_status_t sp_stream_destroy(sp_stream_t stream);

/** Wait until all work queued on @p stream has completed (on host: completes its events).
 * NULL: the default stream of every device this process uses (a device it never used is not
 * touched). Streams: on cuda any valid CUDA stream (PyTorch's too); cudaStreamLegacy is the
 * default stream (NULL); cudaStreamPerThread is refused by sp_malloc and sp_record_stream, as it
 * names a different stream on every thread. On cuda a handle that is not a live CUDA stream
 * (never created, or destroyed) is undefined behaviour, as it is in CUDA, which dereferences it:
 * sympool passes it to the runtime and cannot check it first. The host backend checks every
 * handle (SP_ERR_INVALID_ARGUMENT). */
sp_status_t sp_stream_synchronize(sp_stream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_POOL_H */
