/**
 * @file torch.h
 * @brief PyTorch CUDAPluggableAllocator entry points, exported from libsympool.so:
 *   torch.cuda.memory.CUDAPluggableAllocator("libsympool.so", "sp_torch_malloc", "sp_torch_free")
 */
#ifndef SYMPOOL_TORCH_H
#define SYMPOOL_TORCH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Allocate through sympool (routing included); NULL on failure (the reason in sp_last_error). */
void *sp_torch_malloc(size_t size, int device, void *stream);

/** Free a pointer from sp_torch_malloc. Failures are logged (PyTorch gives no way to report them).
 */
void sp_torch_free(void *ptr, size_t size, int device, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_TORCH_H */
