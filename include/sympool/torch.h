/**
 * @file torch.h
 * @brief PyTorch CUDAPluggableAllocator entry points, exported from libsympool.so:
 *   torch.cuda.memory.CUDAPluggableAllocator("libsympool.so", "sp_torch_malloc", "sp_torch_free")
 * with sp_torch_record_stream and sp_torch_empty_cache for its set_record_stream_fn and
 * set_reset_fn. All four refuse to serve anything but the cuda backend.
 */
#ifndef SYMPOOL_TORCH_H
#define SYMPOOL_TORCH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Allocate through sympool (routing included); NULL on failure (the reason in sp_last_error).
 * Refuses (NULL, a WARN and the reason in sp_last_error) unless the backend is cuda: PyTorch
 * would use host memory as device memory. Size 0 is NULL without an error. */
void *sp_torch_malloc(size_t size, int device, void *stream);

/** sp_torch_malloc with its status: SP_SUCCESS (and *ptr_p; NULL for size 0), or the failure
 * (SP_ERR_OUT_OF_MEMORY when the device is exhausted after sympool's own retry). For a caller
 * that must tell an OOM from other failures (sympool.torch's C++ shim, which raises
 * torch.OutOfMemoryError: PyTorch's change_current_allocator path does not check for NULL).
 * ptr_p NULL: SP_ERR_INVALID_ARGUMENT. */
int sp_torch_malloc_status(size_t size, int device, void *stream, void **ptr_p);

/** For CUDAPluggableAllocator.set_memory_fraction_fn: sp_set_memory_fraction (failures logged). */
void sp_torch_set_memory_fraction(double fraction, int device);

/** Non-caching segments for torch.cuda.MemPool(allocator) (sympool.torch.mem_pool()): one device
 * allocation per call, given straight back by sp_torch_segment_free, since PyTorch caches inside
 * them. NULL when out of memory (PyTorch's MemPool path turns that into its OOM handling).
 * sp_torch_segment_free frees only a live segment of sp_torch_segment_malloc, with the size it was
 * made with (a mismatch is logged); any other pointer (a block of sp_torch_malloc, a segment freed
 * already, one made before an sp_shutdown of the host backend, whose end unmapped it) is logged
 * and ignored. */
void *sp_torch_segment_malloc(size_t size, int device, void *stream);
void sp_torch_segment_free(void *ptr, size_t size, int device, void *stream);

/** Free a pointer from sp_torch_malloc. Failures are logged (PyTorch gives no way to report them).
 */
void sp_torch_free(void *ptr, size_t size, int device, void *stream);

/** For CUDAPluggableAllocator.set_record_stream_fn (Tensor.record_stream): the block at ptr is
 * not reused after its free until the work queued on `stream` so far has completed
 * (sp_record_stream). Failures are logged. */
void sp_torch_record_stream(void *ptr, void *stream);

/** For CUDAPluggableAllocator.set_reset_fn (torch.cuda.empty_cache): sp_empty_cache. */
void sp_torch_empty_cache(void);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_TORCH_H */
