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
