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
 * Device memory only: PyTorch treats whatever alloc returns as memory of a CUDA device, so every
 * entry point refuses (NULL + WARN, or a WARN) unless sympool's backend is cuda. Without that, a
 * failed CUDA probe under SYMPOOL_DEVICE=auto would hand PyTorch mmap'd host memory, and the
 * first kernel writing to it would fault far from the cause.
 *
 * record_stream and empty_cache complete the pluggable allocator (set_record_stream_fn,
 * set_reset_fn): without the first, a tensor used on a side stream could be reused by the
 * allocating stream while the side stream still reads it.
 *
 * One lock of its own, g_seg_lock, for the registry of sp_torch_segment_malloc's live segments
 * (the allocator's locks cover everything else); g_allow_host is a test switch.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "pool/allocator.h"
#include "pool/fork.h"
#include "pool/pool.h"
#include "sympool/pool.h"
#include "pool/torch.h"
#include "sympool/torch.h"

static atomic_bool g_allow_host; /* tests only (sp__torch_allow_host) */

/* The live segments of sp_torch_segment_malloc, as it made them. sp_torch_segment_free gives
 * the device back only what is here, with the size and device recorded here: any other pointer
 * (a block of sp_torch_malloc, which lies in a segment sympool still holds; one freed already;
 * another allocator's) would free memory that is not PyTorch's to free, and a size other than
 * the recorded one would free part of a segment (the host backend's munmap). A short array:
 * each entry is a device allocation of PyTorch's MemPool (2 MiB and up). */
typedef struct {
    void *ptr;
    size_t size;
    int device;
} torch_seg_t;
static pthread_mutex_t g_seg_lock = PTHREAD_MUTEX_INITIALIZER;
static torch_seg_t *g_segs; /* [g_nsegs] of g_segcap (g_seg_lock) */
static size_t g_nsegs, g_segcap;

static bool seg_add(void *ptr, size_t size, int device) {
    bool ok = true;
    pthread_mutex_lock(&g_seg_lock);
    if (g_nsegs == g_segcap) {
        size_t cap = g_segcap ? g_segcap * 2 : 16;
        torch_seg_t *n = realloc(g_segs, cap * sizeof(*n));
        ok = n != NULL;
        if (ok) {
            g_segs = n;
            g_segcap = cap;
        }
    }
    if (ok)
        g_segs[g_nsegs++] = (torch_seg_t){ptr, size, device};
    pthread_mutex_unlock(&g_seg_lock);
    return ok;
}

/* Take ptr's entry out into *seg_p; false when ptr is no live segment. */
static bool seg_take(void *ptr, torch_seg_t *seg_p) {
    bool found = false;
    pthread_mutex_lock(&g_seg_lock);
    for (size_t i = 0; i < g_nsegs && !found; i++)
        if (g_segs[i].ptr == ptr) {
            *seg_p = g_segs[i];
            g_segs[i] = g_segs[--g_nsegs];
            found = true;
        }
    pthread_mutex_unlock(&g_seg_lock);
    return found;
}

void sp__torch_allow_host(bool allow) {
    atomic_store(&g_allow_host, allow);
}

/* SP_SUCCESS when the backend hands out device memory PyTorch can use; otherwise the reason is
 * logged at WARN and kept in sp_last_error. */
static sp_status_t check_backend(const char *fn) {
    const char *name = sp_backend_name(); /* initializes on first use */
    if (SP_LIKELY(strcmp(name, "cuda") == 0) || atomic_load(&g_allow_host))
        return SP_SUCCESS;
    if (strcmp(name, "none") == 0 && sp__fork_child_off())
        return sp__fork_error(fn); /* the reason itself, not "could not start a backend" */
    if (strcmp(name, "none") == 0)
        return sp__error(SP_ERR_DEVICE, SP_SUB_API,
                         "%s: sympool could not start a device backend; PyTorch gets nothing "
                         "(set SYMPOOL_DEBUG=INFO to see why)",
                         fn);
    return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_API,
                     "%s: sympool runs its %s backend, whose memory is host memory that PyTorch "
                     "would use as device memory; refused. Set SYMPOOL_DEVICE=cuda on a machine "
                     "with a usable GPU (SYMPOOL_DEBUG=INFO says why cuda was not chosen)",
                     fn, name);
}

/* PyTorch never calls alloc with size 0 through the pluggable layer today, but its own
 * raw_alloc(0) returns nullptr without touching the allocator, so size 0 does the same here and
 * is not a failure (no WARN, sp_last_error untouched). */
SP_EXPORT int sp_torch_malloc_status(size_t size, int device, void *stream, void **ptr_p) {
    SP_ARG_CHECK(ptr_p != NULL, SP_SUB_API, "sp_torch_malloc_status: ptr_p is NULL");
    *ptr_p = NULL;
    if (size == 0)
        return SP_SUCCESS;
    sp_status_t s = check_backend("sp_torch_malloc");
    if (SP_UNLIKELY(s != SP_SUCCESS))
        return s;
    s = sp_malloc(size, device, (sp_stream_t)stream, ptr_p);
    if (s != SP_SUCCESS) {
        /* The allocator has already set sp_last_error and logged the reason at WARN (OOM,
         * unknown device, ...). Add which entry point failed at INFO, so a user reading a
         * PyTorch "CUDA out of memory" can tie it to this call without a second WARN line. */
        SP_INFO(SP_SUB_API, "sp_torch_malloc(size=%zu, device=%d, stream=%p) -> %s", size, device,
                stream, sp_status_name(s));
    }
    return s;
}

/* PyTorch's change_current_allocator path keeps whatever this returns, NULL included, and hands
 * it to the tensor: a NULL here becomes an illegal-address fault in the first kernel, not an
 * OutOfMemoryError. sympool.torch.enable() therefore goes through a small C++ shim that calls
 * sp_torch_malloc_status and throws PyTorch's own OutOfMemoryError; this plain C form is for
 * torch.cuda.MemPool, whose caller checks for NULL. */
SP_EXPORT void *sp_torch_malloc(size_t size, int device, void *stream) {
    void *ptr = NULL;
    (void)sp_torch_malloc_status(size, device, stream, &ptr);
    return ptr;
}

/* torch.cuda.set_per_process_memory_fraction under change_current_allocator
 * (set_memory_fraction_fn): sympool's own cap. PyTorch offers no way to report a failure (a
 * fraction outside [0, 1] is refused by torch before it gets here), so it is logged. */
SP_EXPORT void sp_torch_set_memory_fraction(double fraction, int device) {
    sp_status_t s = sp_set_memory_fraction(fraction, device);
    if (s != SP_SUCCESS) {
        char text[32];
        SP_WARN(SP_SUB_API, "sp_torch_set_memory_fraction(%s, device=%d) -> %s: %s",
                sp__double_format(fraction, text, sizeof text), device, sp_status_name(s),
                sp_last_error());
    }
}

/* Segments for torch.cuda.MemPool(allocator): PyTorch splits and caches inside what these return,
 * so sympool must not cache as well: a second cache would round PyTorch's 2 MiB segment up to one
 * of sympool's 20 MiB ones, keep what PyTorch frees out of reach of torch.cuda.empty_cache(), and
 * keep a destroyed pool's memory reserved. Each call is one device allocation and each free gives
 * it straight back to the device. */
SP_EXPORT void *sp_torch_segment_malloc(size_t size, int device, void *stream) {
    if (size == 0 || check_backend("sp_torch_segment_malloc") != SP_SUCCESS)
        return NULL;
    if (sp__alloc_ensure() != SP_SUCCESS)
        return NULL;
    if (device < 0 || device >= sp__g.ndev) {
        (void)sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_API,
                        "sp_torch_segment_malloc: device %d is not one of the %d devices", device,
                        sp__g.ndev);
        return NULL;
    }
    void *ptr = NULL;
    sp_status_t s = sp__g.ops->mem_alloc(device, size, &ptr);
    if (s == SP_ERR_OUT_OF_MEMORY) {
        /* Quiet: PyTorch frees its own cache and retries, then raises OutOfMemoryError itself. */
        (void)sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_API,
                              "sp_torch_segment_malloc: %zu bytes do not fit on device %d", size,
                              device);
        return NULL;
    }
    if (s != SP_SUCCESS)
        return NULL; /* the backend reported it */
    if (!seg_add(ptr, size, device)) {
        (void)sp__g.ops->mem_free(device, ptr, size);
        (void)sp__error(SP_ERR_SYSTEM, SP_SUB_API,
                        "sp_torch_segment_malloc: no host memory to record the segment");
        return NULL;
    }
    return ptr;
}

SP_EXPORT void sp_torch_segment_free(void *ptr, size_t size, int device, void *stream) {
    if (ptr == NULL)
        return;
    if (sp__fork_child_off()) { /* the segment is the parent's, and live there (fork.c) */
        (void)sp__fork_error("sp_torch_segment_free");
        return;
    }
    torch_seg_t seg;
    if (!atomic_load_explicit(&sp__ready, memory_order_acquire) || !seg_take(ptr, &seg)) {
        SP_WARN(SP_SUB_API,
                "sp_torch_segment_free(%p, size=%zu, device=%d): not a live segment of "
                "sp_torch_segment_malloc (a block of sp_torch_malloc, one freed already, or "
                "another allocator's); ignored",
                ptr, size, device);
        return;
    }
    if (seg.size != size || seg.device != device)
        SP_WARN(SP_SUB_API,
                "sp_torch_segment_free(%p): PyTorch says size %zu on device %d, but the segment "
                "was made with size %zu on device %d; freed as it was made",
                ptr, size, device, seg.size, seg.device);
    /* PyTorch synchronized the pool's streams (its release_cached_blocks) before handing the
     * segment back, as it does before cudaFree. */
    (void)sp__g.ops->mem_free(seg.device, ptr, seg.size); /* logged there */
}

void sp__torch_session_end(bool memory_released) {
    if (!memory_released)
        return; /* still allocated: a later sp_torch_segment_free gives it back */
    pthread_mutex_lock(&g_seg_lock);
    g_nsegs = 0; /* their addresses are the next session's to hand out again */
    pthread_mutex_unlock(&g_seg_lock);
}

void sp__torch_fork_lock(void) {
    pthread_mutex_lock(&g_seg_lock);
}

void sp__torch_fork_unlock(void) {
    pthread_mutex_unlock(&g_seg_lock);
}

long sp__torch_live_segments(void) {
    pthread_mutex_lock(&g_seg_lock);
    long n = (long)g_nsegs;
    pthread_mutex_unlock(&g_seg_lock);
    return n;
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

SP_EXPORT void sp_torch_record_stream(void *ptr, void *stream) {
    if (ptr == NULL || check_backend("sp_torch_record_stream") != SP_SUCCESS)
        return;
    /* PyTorch calls this for tensors its pluggable layer allocated: a failure means the pointer
     * is not ours (sp_record_stream logged why at WARN) and nothing can be delayed. */
    sp_status_t s = sp_record_stream(ptr, (sp_stream_t)stream);
    if (s != SP_SUCCESS)
        SP_INFO(SP_SUB_API, "sp_torch_record_stream(%p, stream=%p) -> %s", ptr, stream,
                sp_status_name(s));
}

SP_EXPORT void sp_torch_empty_cache(void) {
    /* torch.cuda.empty_cache() on the pluggable allocator: release every cached segment (blocks
     * still waiting for a stream stay until their events complete). */
    sp_status_t s = sp_empty_cache();
    if (s != SP_SUCCESS)
        SP_INFO(SP_SUB_API, "sp_torch_empty_cache -> %s", sp_status_name(s));
}
