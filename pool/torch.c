/*
 * torch.c: PyTorch's CUDAPluggableAllocator entry points. PyTorch loads libsympool.so with
 * ctypes, resolves these two symbols and casts them to
 *     void *alloc(size_t size, int device, cudaStream_t stream)
 *     void  free(void *ptr, size_t size, int device, cudaStream_t stream)
 * (reference/pytorch-allocator.md section 4.7), so their signatures must stay exactly these.
 *
 * Both are thin: sp_torch_malloc is sp_malloc (so sp_mempool_begin routing applies, and
 * torch.cuda.MemPool(allocator) backed by these functions ends up in sympool's caching allocator
 * as well), and sp_torch_free is sp_free with PyTorch's size and device checked in the same
 * locked lookup. PyTorch offers no way to report a failure from either
 * call except a NULL from alloc, so every failure is logged at WARN (sp__error does that) and its
 * text stays in sp_last_error() for whoever asks.
 *
 * No state, no lock of its own: the allocator's locks cover everything.
 */
#include <stddef.h>

#include "core/core.h"
#include "pool/allocator.h"
#include "pool/pool.h"
#include "sympool/pool.h"
#include "sympool/torch.h"

/* PyTorch never calls alloc with size 0 through the pluggable layer today, but its own
 * raw_alloc(0) returns nullptr without touching the allocator, so size 0 does the same here and
 * is not a failure (no WARN, sp_last_error untouched). */
SP_EXPORT void *sp_torch_malloc(size_t size, int device, void *stream) {
    if (size == 0)
        return NULL;
    void *ptr = NULL;
    sp_status_t s = sp_malloc(size, device, (sp_stream_t)stream, &ptr);
    if (s != SP_SUCCESS) {
        /* The allocator has already set sp_last_error and logged the reason at WARN (OOM,
         * unknown device, ...). Add which entry point failed at INFO, so a user reading a
         * PyTorch "CUDA out of memory" can tie it to this call without a second WARN line. */
        SP_INFO(SP_SUB_API, "sp_torch_malloc(size=%zu, device=%d, stream=%p) -> %s", size, device,
                stream, sp_status_name(s));
        return NULL;
    }
    return ptr;
}

SP_EXPORT void sp_torch_free(void *ptr, size_t size, int device, void *stream) {
    if (ptr == NULL)
        return;
    /* PyTorch's pluggable layer hands back the size, device and stream it recorded at alloc. A
     * mismatch means the pointer did not come from sp_torch_malloc as PyTorch believes (another
     * allocator's pointer, or memory corruption in the caller's bookkeeping): worth a WARN, but
     * the block is still freed, because the pointer is what identifies it. One locked lookup
     * finds, checks and frees it; a pointer that is no live block start is left alone (the
     * allocator explains it at WARN). */
    size_t have_size = 0;
    int have_device = -1;
    sp_status_t s = sp__alloc_free_sized(ptr, device, &have_size, &have_device);
    if (s != SP_SUCCESS) {
        SP_INFO(SP_SUB_API, "sp_torch_free(%p, size=%zu, device=%d, stream=%p) -> %s; ignored", ptr,
                size, device, stream, sp_status_name(s));
        return;
    }
    if (have_size != size || have_device != device)
        SP_WARN(SP_SUB_API,
                "sp_torch_free(%p): PyTorch says size %zu on device %d, but the block was "
                "allocated with size %zu on device %d; freed it anyway",
                ptr, size, device, have_size, have_device);
}
