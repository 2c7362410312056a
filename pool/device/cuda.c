/*
 * cuda.c: the CUDA runtime backend. Compiled only when the build found the CUDA toolkit
 * (SP_HAVE_CUDA); without it sp__device_cuda_ops() is NULL and sp__device_cuda_available() false.
 *
 * Devices are set up on first use, never before. init only counts devices and asks the driver
 * for attributes (no context); total memory comes from cuDeviceTotalMem, which needs no context
 * either. A device gets a context when sympool first does something on it (an allocation, a
 * stream, an event), and calls that sweep "every device" (sp_stream_synchronize(NULL), fini)
 * skip a device whose primary context is not active: with 8 ranks on an 8-GPU node each GPU
 * carries one context, and exclusive-process mode works. Driver entry points are obtained
 * through cudaGetDriverEntryPointByVersion: libcuda.so.1 is never linked, so a machine without
 * a driver still loads the library and runs the host backend.
 *
 * Every op that names a device runs under a device guard: it makes `device` current and puts the
 * caller's current device back afterwards, so the allocator never changes the application's
 * device behind its back. CUDA errors are translated here, at the one place each call is made:
 * cudaMalloc's cudaErrorMemoryAllocation becomes SP_ERR_OUT_OF_MEMORY (quiet: the allocator frees
 * its cache and retries), anything else SP_ERR_DEVICE with "cudaErrorX: description". A failed call
 * also leaves its code in the runtime's last-error slot; we take it out (only when the slot holds
 * that same code, so an older pending error of the application stays for it to see) so that it
 * does not resurface in an unrelated later cudaGetLastError. A sticky error (illegal address, a
 * kernel fault) cannot be cleared: every later call in the context fails, and the message says
 * that the process must restart. A successful call never touches the slot.
 *
 * CUDA graphs: calls that are illegal under global stream-capture mode (cudaMalloc, cudaFree,
 * cudaEventQuery, cudaEventSynchronize, event creation) run with this thread's capture mode
 * exchanged for cudaStreamCaptureModeRelaxed and restored after, as PyTorch does around its
 * cudaMalloc; so another thread's capture is not invalidated by an allocator refill. Recording an
 * allocator event or synchronizing a stream that is itself capturing is refused with
 * SP_ERR_NOT_SUPPORTED (it would become a node of the graph, or break the capture); the
 * allocator then defers the event of such a free until the capture ended (release.c). "A capture
 * under way on the device" (no release, no cudaDeviceSynchronize) is the legacy stream counting as
 * capturing or a capture on a stream cuda_stream_create made (cuda_device_capturing). Memory a
 * graph uses must outlive the graph: allocate it from a MemPool kept for the graph's life, as
 * torch.cuda.graph(pool=...) does.
 *
 * Events are created with cudaEventDisableTiming and pooled per device (a free list), so the
 * allocator's record-on-free path does not pay cudaEventCreate. Lock: one mutex per device guards
 * its event pool; CUDA itself is thread-safe. g_cuda is written only by init/fini, which
 * sp__device_select serializes; `used` is atomic.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "pool/device/device.h"

#ifdef SP_HAVE_CUDA

#include <cuda.h>
#include <cuda_runtime.h>

typedef struct cuda_dev {
    atomic_bool used;     /* sympool made this device current once (it has a context now) */
    pthread_mutex_t mu;   /* guards the pool below */
    cudaEvent_t *pool;    /* pooled events, [0, npool); mu */
    size_t npool;         /* pooled events; mu */
    size_t pool_cap;      /* capacity of `pool` in entries; mu */
    cudaStream_t *own;    /* live streams cuda_stream_create made, [0, nown); mu */
    size_t nown, own_cap; /* mu */
} cuda_dev_t;

/* Handles cuda_stream_destroy destroyed that no cuda_stream_create has returned since: asking
 * CUDA about one is undefined behaviour (cuda_stream_destroyed). The last DEAD_KEPT only, in a
 * ring: an application that makes and destroys streams of its own (handles sympool never sees
 * made again) must not grow the list, nor the scan every create and destroy makes of it. */
#define DEAD_KEPT 1024
static struct {
    pthread_mutex_t mu;
    cudaStream_t h[DEAD_KEPT]; /* mu; NULL: free */
    size_t next;               /* mu: the slot the next mark takes */
} g_dead = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Mark (dead) or unmark (!dead) a handle; a mark past DEAD_KEPT forgets the oldest. */
static void dead_mark(cudaStream_t s, bool dead) {
    pthread_mutex_lock(&g_dead.mu);
    size_t i = 0;
    while (i < DEAD_KEPT && g_dead.h[i] != s)
        i++;
    if (!dead && i < DEAD_KEPT)
        g_dead.h[i] = NULL;
    if (dead && i == DEAD_KEPT) {
        g_dead.h[g_dead.next] = s;
        g_dead.next = (g_dead.next + 1) % DEAD_KEPT;
    }
    pthread_mutex_unlock(&g_dead.mu);
}

/* Driver entry points (NULL when the driver did not hand one out). */
typedef CUresult (*cu_device_get_fn)(CUdevice *, int);
typedef CUresult (*cu_device_attr_fn)(int *, CUdevice_attribute, CUdevice);
typedef CUresult (*cu_total_mem_fn)(size_t *, CUdevice);
typedef CUresult (*cu_ctx_state_fn)(CUdevice, unsigned int *, int *);

static struct {
    int count;                  /* devices; 0 when not initialized */
    cuda_dev_t *devs;           /* [count] */
    cu_device_get_fn get_dev;   /* cuDeviceGet */
    cu_device_attr_fn get_attr; /* cuDeviceGetAttribute */
    cu_total_mem_fn total_mem;  /* cuDeviceTotalMem (the _v2 the runtime maps it to) */
    cu_ctx_state_fn ctx_state;  /* cuDevicePrimaryCtxGetState */
} g_cuda;

/* Errors after which the context is unusable: every later call returns them again. The list is
 * every code whose comment in CUDA 13.0's driver_types.h says "This leaves the process in an
 * inconsistent state and any further CUDA work will return the same error" or "the process must
 * be terminated and relaunched" (Contained, TensorMemoryLeak, MpsClientTerminated and
 * ExternalDevice as well as the kernel faults), plus ECCUncorrectable, kept from before although
 * the header does not say whether it is sticky (for a GPU run to settle). */
static bool is_sticky(cudaError_t err) {
    switch (err) {
    case cudaErrorContained:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
        return true;
    default:
        return false;
    }
}

/* Take our own failure out of the runtime's last-error slot, leaving anything else there. */
static void drop_last_error(cudaError_t err) {
    if (cudaPeekAtLastError() == err)
        (void)cudaGetLastError();
}

/* Translate a CUDA failure at the call site. Out of memory too is SP_ERR_DEVICE here: only
 * cudaMalloc's is the allocator's quiet SP_ERR_OUT_OF_MEMORY (cuda_mem_alloc), which it answers by
 * freeing its cache and retrying; a stream, an event or a query refused for memory is not. */
static sp_status_t cuda_fail(cudaError_t err, const char *file, int line, const char *what) {
    drop_last_error(err);
    return sp__error_at(SP_ERR_DEVICE, SP_SUB_DEVICE, file, line, "%s: %s: %s%s", what,
                        cudaGetErrorName(err), cudaGetErrorString(err),
                        is_sticky(err) ? " (a sticky error: this process's CUDA context is "
                                         "unusable from now on; the process must restart)"
                                       : "");
}

/* Relaxed stream-capture mode for this thread around one capture-unsafe call. */
static enum cudaStreamCaptureMode relax_enter(void) {
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaError_t err = cudaThreadExchangeStreamCaptureMode(&mode);
    if (err != cudaSuccess) {
        drop_last_error(err);
        return cudaStreamCaptureModeRelaxed; /* nothing to restore */
    }
    return mode;
}

static void relax_exit(enum cudaStreamCaptureMode mode) {
    if (mode == cudaStreamCaptureModeRelaxed)
        return;
    cudaError_t err = cudaThreadExchangeStreamCaptureMode(&mode);
    if (err != cudaSuccess)
        drop_last_error(err);
}

static sp_status_t guard_enter(int device, int *prev_p);
static void guard_exit(int device, int prev);
static bool device_active(int device);

static sp_status_t cuda_stream_capturing(int device, sp_dev_stream_t stream, bool *capturing_p) {
    /* A stream carries its device and needs no guard; the legacy stream (NULL) is the current
     * device's, so for a named device it is asked there. */
    int prev = -1;
    bool guarded = stream == NULL && device >= 0;
    if (guarded && !device_active(device)) {
        /* No context, so no stream of it can capture; asking there would make a context. */
        *capturing_p = false;
        return SP_SUCCESS;
    }
    if (guarded)
        SP_CHECK(guard_enter(device, &prev));
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaError_t err = cudaStreamIsCapturing((cudaStream_t)stream, &st);
    if (guarded)
        guard_exit(device, prev);
    if (err == cudaErrorStreamCaptureImplicit) {
        drop_last_error(err);
        *capturing_p = true; /* the legacy stream while another blocking stream captures */
        return SP_SUCCESS;
    }
    if (err != cudaSuccess)
        return cuda_fail(err, __FILE__, __LINE__, "cudaStreamIsCapturing");
    *capturing_p = st != cudaStreamCaptureStatusNone;
    return SP_SUCCESS;
}

/* Whether a capture is under way on `device`, as far as CUDA lets one ask: the legacy stream counts
 * as capturing (a blocking stream captures), or a stream sympool made captures. sympool's streams
 * are non-blocking, so a capture on one leaves the legacy stream alone, yet cudaDeviceSynchronize
 * during it is invalid and invalidates it ("invalid to ... synchronize a broader handle which
 * encompasses an active stream capture, such as a device", CUDA Programming Guide, "Prohibited and
 * Unhandled Operations"), and releasing memory the graph may use is what PyTorch never does during
 * a capture. A non-blocking stream of the application's own is not seen: CUDA has no per-device
 * query (PyTorch too only knows the captures begun through its graph API). */
static sp_status_t cuda_device_capturing(int device, bool *capturing_p) {
    SP_CHECK(cuda_stream_capturing(device, NULL, capturing_p));
    if (*capturing_p || device < 0 || device >= g_cuda.count)
        return SP_SUCCESS;
    cuda_dev_t *dev = &g_cuda.devs[device];
    sp_status_t res = SP_SUCCESS;
    /* cudaStreamIsCapturing does not wait, so holding mu across it blocks nobody for long. */
    pthread_mutex_lock(&dev->mu);
    for (size_t i = 0; i < dev->nown && !*capturing_p && res == SP_SUCCESS; i++)
        res = cuda_stream_capturing(device, (sp_dev_stream_t)dev->own[i], capturing_p);
    pthread_mutex_unlock(&dev->mu);
    return res;
}

/* SP_ERR_NOT_SUPPORTED when `stream` is capturing a graph (see the file comment); quiet when the
 * allocator handles it (event records: it defers the event), logged otherwise. `device` is the
 * device the caller is about to use the stream on: the legacy stream (NULL) is "the current
 * device's" (CUDA Runtime API, "Stream synchronization behavior"), so asking about NULL before the
 * guard would ask about whatever device the calling thread has current, and a capture on that
 * device would refuse work on another one while a capture on `device` itself went unseen. */
static sp_status_t refuse_if_capturing(int device, sp_dev_stream_t stream, const char *what,
                                       bool quiet) {
    bool capturing = false;
    SP_CHECK(cuda_stream_capturing(device, stream, &capturing));
    if (!capturing)
        return SP_SUCCESS;
    if (quiet)
        return sp__error_quiet(SP_ERR_NOT_SUPPORTED, SP_SUB_DEVICE,
                               "%s on stream %p: the stream is capturing a CUDA graph", what,
                               stream);
    return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_DEVICE,
                     "%s on stream %p: the stream is capturing a CUDA graph; sympool cannot order "
                     "a free against captured work (keep blocks used in a graph allocated until "
                     "the capture ends, e.g. in a MemPool that outlives the graph)",
                     what, stream);
}
#define CU_TRY(call)                                                                               \
    do {                                                                                           \
        cudaError_t cu_e_ = (call);                                                                \
        if (SP_UNLIKELY(cu_e_ != cudaSuccess))                                                     \
            return cuda_fail(cu_e_, __FILE__, __LINE__, #call);                                    \
    } while (0)
/* A result already in hand (the call ran in relaxed capture mode): translate, leave via `out`. */
#define CU_CHECK_OUT(err, what, res)                                                               \
    do {                                                                                           \
        if (SP_UNLIKELY((err) != cudaSuccess)) {                                                   \
            (res) = cuda_fail((err), __FILE__, __LINE__, (what));                                  \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)
/* Inside a guarded region: translate, then leave through `out` so the guard is restored. */
#define CU_TRY_OUT(call, res)                                                                      \
    do {                                                                                           \
        cudaError_t cu_e_ = (call);                                                                \
        if (SP_UNLIKELY(cu_e_ != cudaSuccess)) {                                                   \
            (res) = cuda_fail(cu_e_, __FILE__, __LINE__, #call);                                   \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* Device guard: make `device` current, remembering the previous one in *prev_p. */
static sp_status_t guard_enter(int device, int *prev_p) {
    if (SP_UNLIKELY(device < 0 || device >= g_cuda.count))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "cuda device %d does not exist (%d visible)", device, g_cuda.count);
    int prev = -1;
    CU_TRY(cudaGetDevice(&prev));
    if (prev != device)
        CU_TRY(cudaSetDevice(device)); /* CUDA >= 12: makes the primary context if needed */
    if (SP_UNLIKELY(!atomic_load_explicit(&g_cuda.devs[device].used, memory_order_relaxed)))
        atomic_store_explicit(&g_cuda.devs[device].used, true, memory_order_relaxed);
    *prev_p = prev;
    return SP_SUCCESS;
}

/* Whether `device` has an active primary context, without making one; no driver entry point to
 * ask counts as yes (the old behaviour: switch back). */
static bool has_primary_context(int device) {
    if (!g_cuda.get_dev || !g_cuda.ctx_state)
        return true;
    CUdevice cud;
    unsigned int flags = 0;
    int active = 0;
    if (g_cuda.get_dev(&cud, device) != CUDA_SUCCESS ||
        g_cuda.ctx_state(cud, &flags, &active) != CUDA_SUCCESS)
        return true;
    return active != 0;
}

/* Whether the process has a context on `device` (made by sympool or by the application), asked
 * without making one. Unknown (no driver entry point) counts as yes. */
static bool device_active(int device) {
    if (atomic_load_explicit(&g_cuda.devs[device].used, memory_order_relaxed))
        return true;
    return has_primary_context(device);
}

/* PyTorch's MaybeExchangeDevice: back to the caller's device only when that device has a primary
 * context. A thread that never set a device reads 0 from cudaGetDevice; setting 0 back would make
 * a context on GPU 0 (hundreds of MiB, and a failure under exclusive-process mode). */
static void guard_exit(int device, int prev) {
    if (prev != device && prev >= 0 && prev < g_cuda.count && has_primary_context(prev)) {
        cudaError_t err = cudaSetDevice(prev);
        if (err != cudaSuccess)
            drop_last_error(err);
    }
}

void sp__cuda_restore_device(int device, int prev) {
    guard_exit(device, prev);
}

static void cuda_vmm_caps(int ndev, sp_device_caps_t *caps);

/* ---- init / fini -------------------------------------------------------------------------- */

/* One driver entry point, or NULL (an old driver, or none). */
static void *driver_fn(const char *name) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
    if (err != cudaSuccess) {
        drop_last_error(err);
        return NULL;
    }
    return q == cudaDriverEntryPointSuccess ? fn : NULL;
}

static sp_status_t cuda_init(sp_device_caps_t *caps_p) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n); /* initializes the driver, makes no context */
    if (err != cudaSuccess) {
        drop_last_error(err);
        /* Every later call retries the selection and fails the same way: warn once per
         * process, then say it at INFO (the status and last-error text are the same). */
        static bool warned; /* sp__device_select serializes init */
        sp_status_t (*report)(sp_status_t, unsigned, const char *, int, const char *, ...) =
            warned ? sp__error_quiet_at : sp__error_at;
        warned = true;
        return report(SP_ERR_DEVICE, SP_SUB_DEVICE, __FILE__, __LINE__,
                      "cuda backend unavailable: cudaGetDeviceCount: %s: %s (use "
                      "SYMPOOL_DEVICE=host or auto on a machine without a usable GPU)",
                      cudaGetErrorName(err), cudaGetErrorString(err));
    }
    if (n <= 0)
        return sp__error(SP_ERR_DEVICE, SP_SUB_DEVICE, "cudaGetDeviceCount found no GPU");
    cuda_dev_t *devs = calloc((size_t)n, sizeof(*devs));
    if (!devs)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE, "cannot allocate %d device records", n);
    g_cuda.get_dev = (cu_device_get_fn)driver_fn("cuDeviceGet");
    g_cuda.get_attr = (cu_device_attr_fn)driver_fn("cuDeviceGetAttribute");
    g_cuda.total_mem = (cu_total_mem_fn)driver_fn("cuDeviceTotalMem");
    g_cuda.ctx_state = (cu_ctx_state_fn)driver_fn("cuDevicePrimaryCtxGetState");
    bool vmm = true;
    for (int d = 0; d < n; d++) {
        pthread_mutex_init(&devs[d].mu, NULL);
        atomic_init(&devs[d].used, false);
        /* No runtime attribute for VMM: ask the driver (attributes need no context). */
        int v = 0;
        if (g_cuda.get_attr && g_cuda.get_dev) {
            CUdevice cud;
            if (g_cuda.get_dev(&cud, d) != CUDA_SUCCESS ||
                g_cuda.get_attr(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cud) !=
                    CUDA_SUCCESS)
                v = 0;
        }
        vmm = vmm && v != 0;
    }
    g_cuda.devs = devs;
    g_cuda.count = n;
    sp_device_caps_t caps = {0};
    caps.device_count = n;
    caps.granularity = 512;
    caps.has_vmm = vmm;
    caps.is_emulated = false;
    cuda_vmm_caps(n, &caps);
    *caps_p = caps;
    return SP_SUCCESS;
}

static void vmm_fini(void);

static void cuda_fini(void) {
    vmm_fini();
    for (int d = 0; d < g_cuda.count; d++) {
        cuda_dev_t *dev = &g_cuda.devs[d];
        /* Only a device with pooled events or live streams is visited: the others need
         * nothing, and visiting them would make a context there. */
        if (dev->npool > 0 || dev->nown > 0) {
            int prev = -1;
            bool guarded = guard_enter(d, &prev) == SP_SUCCESS;
            for (size_t i = 0; i < dev->npool; i++) {
                cudaError_t err = cudaEventDestroy(dev->pool[i]);
                if (err != cudaSuccess)
                    drop_last_error(err);
            }
            /* The streams cuda_stream_create made and nobody destroyed: forgotten here, they
             * would leak for the process's life (sp_shutdown releases everything; the host
             * backend's streams go too). cudaStreamDestroy does not wait: queued work finishes
             * first. One that captures a graph cannot be destroyed now and stays (logged). */
            size_t kept = 0;
            for (size_t i = 0; i < dev->nown; i++) {
                enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
                cudaError_t err = cudaStreamIsCapturing(dev->own[i], &st);
                if (err == cudaSuccess && st == cudaStreamCaptureStatusNone &&
                    (err = cudaStreamDestroy(dev->own[i])) == cudaSuccess)
                    dead_mark(dev->own[i], true);
                if (err != cudaSuccess)
                    drop_last_error(err);
                kept += err != cudaSuccess || st != cudaStreamCaptureStatusNone;
            }
            if (kept)
                SP_WARN(SP_SUB_DEVICE,
                        "device %d: %zu stream(s) sympool made could not be destroyed at shutdown "
                        "(capturing a CUDA graph, or refused); they stay",
                        d, kept);
            if (guarded)
                guard_exit(d, prev);
        }
        free(dev->pool);
        free(dev->own);
        pthread_mutex_destroy(&dev->mu);
    }
    free(g_cuda.devs);
    g_cuda.devs = NULL;
    g_cuda.count = 0;
}

/* ---- memory ------------------------------------------------------------------------------- */

static sp_status_t cuda_mem_alloc(int device, size_t size, void **ptr_p) {
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    sp_status_t res = SP_SUCCESS;
    void *p = NULL;
    enum cudaStreamCaptureMode mode = relax_enter();
    cudaError_t err = cudaMalloc(&p, size);
    relax_exit(mode);
    if (err == cudaErrorMemoryAllocation) {
        drop_last_error(err);
        res = sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_DEVICE, "cudaMalloc: %s: %s",
                              cudaGetErrorName(err), cudaGetErrorString(err));
        goto out;
    }
    CU_CHECK_OUT(err, "cudaMalloc", res);
    *ptr_p = p;
out:
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_mem_free(int device, void *ptr, size_t size) {
    (void)size;
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    sp_status_t res = SP_SUCCESS;
    enum cudaStreamCaptureMode mode = relax_enter();
    cudaError_t err = cudaFree(ptr);
    relax_exit(mode);
    CU_CHECK_OUT(err, "cudaFree", res);
out:
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_mem_get_info(int device, size_t *free_p, size_t *total_p) {
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    sp_status_t res = SP_SUCCESS;
    size_t f = 0, t = 0;
    CU_TRY_OUT(cudaMemGetInfo(&f, &t), res);
    *free_p = f;
    *total_p = t;
out:
    guard_exit(device, prev);
    return res;
}

/* Total memory without a context (cuDeviceTotalMem); falls back to cudaMemGetInfo, which makes
 * one, only when the driver handed out no entry point. */
static sp_status_t cuda_mem_total(int device, size_t *total_p) {
    if (SP_UNLIKELY(device < 0 || device >= g_cuda.count))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "cuda device %d does not exist (%d visible)", device, g_cuda.count);
    CUdevice cud;
    size_t t = 0;
    if (g_cuda.get_dev && g_cuda.total_mem && g_cuda.get_dev(&cud, device) == CUDA_SUCCESS &&
        g_cuda.total_mem(&t, cud) == CUDA_SUCCESS && t > 0) {
        *total_p = t;
        return SP_SUCCESS;
    }
    size_t f = 0;
    SP_CHECK(cuda_mem_get_info(device, &f, &t));
    *total_p = t;
    return SP_SUCCESS;
}

/* ---- streams ------------------------------------------------------------------------------ */

static sp_status_t cuda_stream_create(int device, sp_dev_stream_t *stream_p) {
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    sp_status_t res = SP_SUCCESS;
    cudaStream_t s = NULL;
    CU_TRY_OUT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), res);
    /* Remembered for cuda_device_capturing. */
    cuda_dev_t *dev = &g_cuda.devs[device];
    pthread_mutex_lock(&dev->mu);
    if (dev->nown == dev->own_cap) {
        size_t ncap = dev->own_cap ? dev->own_cap * 2 : 16;
        cudaStream_t *no = realloc(dev->own, ncap * sizeof(*no));
        if (no) {
            dev->own = no;
            dev->own_cap = ncap;
        }
    }
    bool kept = dev->nown < dev->own_cap;
    if (kept)
        dev->own[dev->nown++] = s;
    pthread_mutex_unlock(&dev->mu);
    if (!kept) {
        (void)cudaStreamDestroy(s); /* a fresh stream: nothing queued */
        res = sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE, "cannot record a new stream");
        goto out;
    }
    dead_mark(s, false); /* a handle destroyed before, made again */
    *stream_p = (sp_dev_stream_t)s;
out:
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_stream_destroy(int device, sp_dev_stream_t stream) {
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    sp_status_t res = SP_SUCCESS;
    /* cudaStreamDestroy returns while queued work still runs, and a stream created next may get
     * the same handle, which is the allocator's cache key: blocks freed on the old stream would
     * then be handed to the new one unordered with that work. Wait for it first. */
    CU_TRY_OUT(cudaStreamSynchronize((cudaStream_t)stream), res);
    /* Out of the registry before the handle dies: cuda_device_capturing asks every stream in it,
     * and asking a destroyed stream is undefined. */
    cuda_dev_t *dev = &g_cuda.devs[device];
    pthread_mutex_lock(&dev->mu);
    for (size_t i = 0; i < dev->nown; i++)
        if (dev->own[i] == (cudaStream_t)stream) {
            dev->own[i] = dev->own[--dev->nown];
            break;
        }
    pthread_mutex_unlock(&dev->mu);
    /* Marked before the destroy: once it returns, another thread's stream_create may get the
     * handle and unmark it, which a mark made after would undo. */
    dead_mark((cudaStream_t)stream, true);
    cudaError_t err = cudaStreamDestroy((cudaStream_t)stream);
    if (err != cudaSuccess) {
        dead_mark((cudaStream_t)stream, false); /* still live */
        res = cuda_fail(err, __FILE__, __LINE__, "cudaStreamDestroy");
    }
out:
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_stream_sync(int device, sp_dev_stream_t stream) {
    if (SP_UNLIKELY(device < 0 || device >= g_cuda.count))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "cuda device %d does not exist (%d visible)", device, g_cuda.count);
    /* The default stream of a device this process never used has nothing queued; making a
     * context there to learn that would be the harm item of "every device". */
    if (stream == NULL && !device_active(device))
        return SP_SUCCESS;
    SP_CHECK(refuse_if_capturing(device, stream, "stream synchronize", false));
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    sp_status_t res = SP_SUCCESS;
    CU_TRY_OUT(cudaStreamSynchronize((cudaStream_t)stream), res);
out:
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_stream_device(sp_dev_stream_t stream, int *device_p) {
    int d = -1;
    cudaError_t err = cudaStreamGetDevice((cudaStream_t)stream, &d);
    if (err != cudaSuccess) {
        drop_last_error(err);
        /* The refusals of the handle itself: cudaErrorInvalidValue (cudaStreamGetDevice's
         * documented return), an invalid handle (a destroyed stream) and a stream whose context
         * is gone. Anything else (out of memory, a sticky error of an earlier launch, the
         * runtime unable to start) is the device's failure, not the argument's: a caller told
         * "not a stream" would look for a bug in its own code. */
        if (err == cudaErrorInvalidValue || err == cudaErrorInvalidResourceHandle ||
            err == cudaErrorContextIsDestroyed)
            return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                             "%p is not a valid CUDA stream: cudaStreamGetDevice: %s: %s", stream,
                             cudaGetErrorName(err), cudaGetErrorString(err));
        return sp__error(SP_ERR_DEVICE, SP_SUB_DEVICE, "cudaStreamGetDevice(%p): %s: %s%s", stream,
                         cudaGetErrorName(err), cudaGetErrorString(err),
                         is_sticky(err) ? " (a sticky error: this process's CUDA context is "
                                          "unusable from now on; the process must restart)"
                                        : "");
    }
    *device_p = d;
    return SP_SUCCESS;
}

static bool cuda_stream_destroyed(sp_dev_stream_t stream) {
    if (stream == NULL) /* the legacy stream, never destroyed (and a free slot's mark) */
        return false;
    pthread_mutex_lock(&g_dead.mu);
    size_t i = 0;
    while (i < DEAD_KEPT && g_dead.h[i] != (cudaStream_t)stream)
        i++;
    bool dead = i < DEAD_KEPT;
    pthread_mutex_unlock(&g_dead.mu);
    return dead;
}

/* ---- events ------------------------------------------------------------------------------- */

static sp_status_t cuda_event_create(int device, sp_dev_event_t *event_p) {
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    cuda_dev_t *dev = &g_cuda.devs[device];
    sp_status_t res = SP_SUCCESS;
    cudaEvent_t e = NULL;
    pthread_mutex_lock(&dev->mu);
    if (dev->npool > 0)
        e = dev->pool[--dev->npool];
    pthread_mutex_unlock(&dev->mu);
    if (!e) {
        enum cudaStreamCaptureMode mode = relax_enter();
        cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
        relax_exit(mode);
        CU_CHECK_OUT(err, "cudaEventCreateWithFlags", res);
    }
    *event_p = (sp_dev_event_t)e;
out:
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_event_destroy(int device, sp_dev_event_t event) {
    if (SP_UNLIKELY(device < 0 || device >= g_cuda.count))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE, "cuda device %d does not exist",
                         device);
    cuda_dev_t *dev = &g_cuda.devs[device];
    pthread_mutex_lock(&dev->mu);
    if (dev->npool == dev->pool_cap) {
        size_t ncap = dev->pool_cap ? dev->pool_cap * 2 : 64;
        cudaEvent_t *np = realloc(dev->pool, ncap * sizeof(*np));
        if (np) {
            dev->pool = np;
            dev->pool_cap = ncap;
        }
    }
    bool pooled = dev->npool < dev->pool_cap;
    if (pooled)
        dev->pool[dev->npool++] = (cudaEvent_t)event;
    pthread_mutex_unlock(&dev->mu);
    if (pooled)
        return SP_SUCCESS;
    /* No room to pool it: really destroy it. */
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    sp_status_t res = SP_SUCCESS;
    enum cudaStreamCaptureMode mode = relax_enter();
    cudaError_t err = cudaEventDestroy((cudaEvent_t)event);
    relax_exit(mode);
    CU_CHECK_OUT(err, "cudaEventDestroy", res);
out:
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_event_record(int device, sp_dev_event_t event, sp_dev_stream_t stream) {
    SP_CHECK(refuse_if_capturing(device, stream, "recording the allocator's event", true));
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    sp_status_t res = SP_SUCCESS;
    CU_TRY_OUT(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream), res);
out:
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_event_query(int device, sp_dev_event_t event, bool *done_p) {
    (void)device; /* events carry their device; querying needs no guard */
    /* Our events are never recorded on a capturing stream (cuda_event_record refuses), so a
     * query is legal during another thread's capture once this thread is in relaxed mode. */
    enum cudaStreamCaptureMode mode = relax_enter();
    cudaError_t err = cudaEventQuery((cudaEvent_t)event);
    relax_exit(mode);
    if (err == cudaSuccess) {
        *done_p = true;
        return SP_SUCCESS;
    }
    if (err == cudaErrorNotReady) {
        /* Not an error. Taken out of the last-error slot in case the runtime keeps it there, as
         * PyTorch's allocator does after its own event queries (pytorch#18584, #61554): left
         * there, it is what the application's next cudaGetLastError reads (PyTorch checks that
         * after every kernel launch). Only a NotReady is taken: an error the application has
         * yet to read stays. */
        drop_last_error(err);
        *done_p = false;
        return SP_SUCCESS;
    }
    return cuda_fail(err, __FILE__, __LINE__, "cudaEventQuery");
}

static sp_status_t cuda_event_sync(int device, sp_dev_event_t event) {
    (void)device;
    enum cudaStreamCaptureMode mode = relax_enter();
    cudaError_t err = cudaEventSynchronize((cudaEvent_t)event);
    relax_exit(mode);
    if (err != cudaSuccess)
        return cuda_fail(err, __FILE__, __LINE__, "cudaEventSynchronize");
    return SP_SUCCESS;
}

static sp_status_t cuda_memcpy_async(int device, void *dst, const void *src, size_t bytes,
                                     sp_dev_stream_t stream) {
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    sp_status_t res = SP_SUCCESS;
    CU_TRY_OUT(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream), res);
out:
    guard_exit(device, prev);
    return res;
}

/* ---- virtual memory (expandable segments) --------------------------------------------------
 * cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemSetAccess, as PyTorch's ExpandableSegment
 * uses them: each page of a reservation is its own physical allocation (pinned, on the device,
 * exportable as a POSIX file descriptor, GPUDirect RDMA capable where the device supports it),
 * mapped and made read-write for the device; unmapping releases the page's handle. The driver
 * functions come from cudaGetDriverEntryPointByVersion, like cuda_init's, so libcuda is never
 * linked. One mutex guards the table of reservations and their page handles; it is held across
 * the driver calls of one op, which keeps an op all or nothing. */

typedef CUresult (*pfn_reserve_t)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*pfn_addr_free_t)(CUdeviceptr, size_t);
typedef CUresult (*pfn_create_t)(CUmemGenericAllocationHandle *, size_t,
                                 const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*pfn_release_t)(CUmemGenericAllocationHandle);
typedef CUresult (*pfn_map_t)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                              unsigned long long);
typedef CUresult (*pfn_unmap_t)(CUdeviceptr, size_t);
typedef CUresult (*pfn_set_access_t)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*pfn_granularity_t)(size_t *, const CUmemAllocationProp *,
                                      CUmemAllocationGranularity_flags);
typedef CUresult (*pfn_err_t)(CUresult, const char **);
typedef CUresult (*pfn_dev_get_t)(CUdevice *, int);
typedef CUresult (*pfn_attr_t)(int *, CUdevice_attribute, CUdevice);

typedef struct cuda_resv {
    int device;                      /* owning device */
    CUdeviceptr base;                /* start of the reservation */
    size_t size;                     /* bytes */
    size_t page;                     /* bytes per physical allocation */
    CUmemGenericAllocationHandle *h; /* [size / page], 0 = not mapped */
    bool *stray;  /* [size / page]: mapped (h[i] set) although the allocator counts the page
                   * unmapped: a failed vmm_map's undo whose cuMemUnmap the driver refused. The
                   * next vmm call tries the unmap again (vmm_retry_stale), and a vmm_map over it
                   * takes it over as it is; vmm_range counts it unmapped */
    bool dropped; /* vmm_release was called, but the driver refused to unmap a page of it (still
                   * mapped, its handle held) or to free the range: kept only to finish the
                   * release at the next vmm call and at fini, never found by vmm_find */
} cuda_resv_t;

static struct {
    pthread_mutex_t mu;      /* guards every field below but the function pointers */
    bool loaded;             /* entry points looked up (under mu) */
    pfn_reserve_t reserve;   /* cuMemAddressReserve */
    pfn_addr_free_t afree;   /* cuMemAddressFree */
    pfn_create_t create;     /* cuMemCreate */
    pfn_release_t release;   /* cuMemRelease */
    pfn_map_t map;           /* cuMemMap */
    pfn_unmap_t unmap;       /* cuMemUnmap */
    pfn_set_access_t access; /* cuMemSetAccess */
    pfn_granularity_t gran;  /* cuMemGetAllocationGranularity */
    pfn_err_t err_name;      /* cuGetErrorName */
    pfn_dev_get_t dev_get;   /* cuDeviceGet */
    pfn_attr_t attr;         /* cuDeviceGetAttribute */
    bool no_fd;              /* POSIX-FD handles refused once: request none from then on */
    cuda_resv_t *resv;       /* live reservations; mu */
    size_t nresv, cap_resv;  /* mu */
    /* Handles of unmapped pages whose cuMemRelease the driver refused: they still hold the
     * pages' memory, so they are released again at the next vmm call and at fini; mu. */
    CUmemGenericAllocationHandle *stale;
    size_t nstale, cap_stale;
    size_t nstray; /* stray pages over the live reservations (cuda_resv_t.stray); mu */
} g_vmm = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Look the entry points up once (g_vmm.mu held); false if any is missing. */
static bool vmm_load(void) {
    if (!g_vmm.loaded) {
        g_vmm.reserve = (pfn_reserve_t)driver_fn("cuMemAddressReserve");
        g_vmm.afree = (pfn_addr_free_t)driver_fn("cuMemAddressFree");
        g_vmm.create = (pfn_create_t)driver_fn("cuMemCreate");
        g_vmm.release = (pfn_release_t)driver_fn("cuMemRelease");
        g_vmm.map = (pfn_map_t)driver_fn("cuMemMap");
        g_vmm.unmap = (pfn_unmap_t)driver_fn("cuMemUnmap");
        g_vmm.access = (pfn_set_access_t)driver_fn("cuMemSetAccess");
        g_vmm.gran = (pfn_granularity_t)driver_fn("cuMemGetAllocationGranularity");
        g_vmm.err_name = (pfn_err_t)driver_fn("cuGetErrorName");
        g_vmm.dev_get = (pfn_dev_get_t)driver_fn("cuDeviceGet");
        g_vmm.attr = (pfn_attr_t)driver_fn("cuDeviceGetAttribute");
        g_vmm.loaded = true;
    }
    return g_vmm.reserve && g_vmm.afree && g_vmm.create && g_vmm.release && g_vmm.map &&
           g_vmm.unmap && g_vmm.access && g_vmm.gran && g_vmm.dev_get && g_vmm.attr;
}

/* Translate a driver failure: out of memory is quiet (the allocator frees its cache and
 * retries), anything else SP_ERR_DEVICE with the driver's name for the code. */
static sp_status_t cu_fail(CUresult r, const char *what, int device) {
    const char *name = NULL;
    if (!g_vmm.err_name || g_vmm.err_name(r, &name) != CUDA_SUCCESS || !name)
        name = "CUDA_ERROR_?";
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_DEVICE, "device %d: %s: %s (%d)",
                               device, what, name, (int)r);
    return sp__error(SP_ERR_DEVICE, SP_SUB_DEVICE, "device %d: %s: %s (%d)", device, what, name,
                     (int)r);
}

/* The allocation properties PyTorch's expandable segments use (g_vmm.mu held). */
static CUmemAllocationProp page_prop(int device) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes =
        g_vmm.no_fd ? CU_MEM_HANDLE_TYPE_NONE : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUdevice cud;
    int rdma = 0;
    if (g_vmm.dev_get(&cud, device) == CUDA_SUCCESS &&
        g_vmm.attr(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, cud) ==
            CUDA_SUCCESS &&
        rdma)
        prop.allocFlags.gpuDirectRDMACapable = 1;
    return prop;
}

/* Fill caps.vmm_granularity (the largest minimum granularity over the devices); turns has_vmm
 * off when the entry points are missing. Called by cuda_init. */
static void cuda_vmm_caps(int ndev, sp_device_caps_t *caps) {
    pthread_mutex_lock(&g_vmm.mu);
    bool ok = caps->has_vmm && vmm_load();
    size_t g = 0;
    for (int d = 0; ok && d < ndev; d++) {
        CUmemAllocationProp prop = page_prop(d);
        size_t gd = 0;
        if (g_vmm.gran(&gd, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || gd == 0)
            ok = false;
        else if (gd > g)
            g = gd;
    }
    pthread_mutex_unlock(&g_vmm.mu);
    caps->has_vmm = ok;
    caps->vmm_granularity = ok ? g : 0;
}

static void vmm_retry_stale(void);

static cuda_resv_t *vmm_find(int device, CUdeviceptr addr) {
    for (size_t i = 0; i < g_vmm.nresv; i++) {
        cuda_resv_t *r = &g_vmm.resv[i];
        if (!r->dropped && r->device == device && addr >= r->base && addr < r->base + r->size)
            return r;
    }
    return NULL;
}

static sp_status_t cuda_vmm_reserve(int device, size_t size, size_t page, void **base_p) {
    if (page == 0 || size == 0 || size % page != 0)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "vmm_reserve of %zu bytes in pages of %zu", size, page);
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    CUmemGenericAllocationHandle *h = calloc(size / page, sizeof(*h));
    bool *stray = calloc(size / page, sizeof(*stray));
    if (!stray) {
        free(h);
        h = NULL;
    }
    sp_status_t res = SP_SUCCESS;
    pthread_mutex_lock(&g_vmm.mu);
    CUdeviceptr base = 0;
    CUresult r = CUDA_SUCCESS;
    if (h && vmm_load())
        vmm_retry_stale();
    if (!h || !vmm_load())
        res = sp__error(h ? SP_ERR_NOT_SUPPORTED : SP_ERR_SYSTEM, SP_SUB_DEVICE,
                        h ? "the CUDA driver lacks the virtual memory entry points"
                          : "cannot allocate a page table");
    else if ((r = g_vmm.reserve(&base, size, 0, 0, 0)) != CUDA_SUCCESS)
        res = cu_fail(r, "cuMemAddressReserve", device);
    if (res == SP_SUCCESS && g_vmm.nresv == g_vmm.cap_resv) {
        size_t ncap = g_vmm.cap_resv ? g_vmm.cap_resv * 2 : 8;
        cuda_resv_t *nr = realloc(g_vmm.resv, ncap * sizeof(*nr));
        if (nr) {
            g_vmm.resv = nr;
            g_vmm.cap_resv = ncap;
        } else {
            (void)g_vmm.afree(base, size);
            res = sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE, "cannot record a reservation");
        }
    }
    if (res == SP_SUCCESS)
        g_vmm.resv[g_vmm.nresv++] = (cuda_resv_t){device, base, size, page, h, stray, false};
    pthread_mutex_unlock(&g_vmm.mu);
    guard_exit(device, prev);
    if (res != SP_SUCCESS) {
        free(h);
        free(stray);
        return res;
    }
    *base_p = (void *)(uintptr_t)base;
    return SP_SUCCESS;
}

/* Validate a page-aligned range of one reservation, every page in state `mapped`. */
static sp_status_t vmm_range(int device, CUdeviceptr a, size_t size, bool mapped, const char *op,
                             cuda_resv_t **r_p) {
    cuda_resv_t *r = vmm_find(device, a);
    if (!r || size == 0 || (a - r->base) % r->page != 0 || size % r->page != 0 ||
        size > r->base + r->size - a)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "device %d: %s(%#llx, %zu) is not a range of whole pages of one "
                         "reservation",
                         device, op, (unsigned long long)a, size);
    for (size_t i = (a - r->base) / r->page; i < (a - r->base + size) / r->page; i++)
        if ((r->h[i] != 0 && !r->stray[i]) != mapped)
            return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_DEVICE, "device %d: %s: page %zu is %s",
                             device, op, i, mapped ? "not mapped" : "already mapped");
    *r_p = r;
    return SP_SUCCESS;
}

/* Release the handle of an unmapped page (g_vmm.mu held): one the driver refuses is kept in
 * g_vmm.stale (its memory is still held) and released again later; logged. */
static void vmm_release_handle(int device, CUmemGenericAllocationHandle h) {
    CUresult e = g_vmm.release(h);
    if (e == CUDA_SUCCESS)
        return;
    const char *name = NULL;
    if (!g_vmm.err_name || g_vmm.err_name(e, &name) != CUDA_SUCCESS || !name)
        name = "CUDA_ERROR_?";
    if (g_vmm.nstale == g_vmm.cap_stale) {
        size_t ncap = g_vmm.cap_stale ? g_vmm.cap_stale * 2 : 8;
        CUmemGenericAllocationHandle *n = realloc(g_vmm.stale, ncap * sizeof(*n));
        if (!n) {
            SP_WARN(SP_SUB_DEVICE,
                    "device %d: cuMemRelease: %s (%d); no host memory to try it again: the "
                    "page's memory stays held",
                    device, name, (int)e);
            return;
        }
        g_vmm.stale = n;
        g_vmm.cap_stale = ncap;
    }
    g_vmm.stale[g_vmm.nstale++] = h;
    SP_WARN(SP_SUB_DEVICE, "device %d: cuMemRelease: %s (%d); it is tried again later", device,
            name, (int)e);
}

/* Unmap what is left of a released reservation and free its range (g_vmm.mu held); false when
 * the driver refused again (it stays kept). Quiet: vmm_release logged the first refusal. */
static bool vmm_finish_dropped(cuda_resv_t *r) {
    size_t left = 0;
    for (size_t i = 0; i < r->size / r->page; i++) {
        if (!r->h[i])
            continue;
        if (g_vmm.unmap(r->base + i * r->page, r->page) != CUDA_SUCCESS) {
            left++;
            continue;
        }
        vmm_release_handle(r->device, r->h[i]);
        r->h[i] = 0;
    }
    return left == 0 && g_vmm.afree(r->base, r->size) == CUDA_SUCCESS;
}

/* Release the handles kept by vmm_release_handle again, and finish the releases of kept
 * reservations (g_vmm.mu held); those still refused stay. */
static void vmm_retry_stale(void) {
    size_t k = 0;
    for (size_t i = 0; i < g_vmm.nstale; i++)
        if (g_vmm.release(g_vmm.stale[i]) != CUDA_SUCCESS)
            g_vmm.stale[k++] = g_vmm.stale[i];
    g_vmm.nstale = k;
    for (size_t i = 0; i < g_vmm.nresv && g_vmm.nstray; i++) {
        cuda_resv_t *r = &g_vmm.resv[i];
        for (size_t p = 0; p < r->size / r->page && !r->dropped; p++) {
            if (!r->stray[p] || g_vmm.unmap(r->base + p * r->page, r->page) != CUDA_SUCCESS)
                continue;
            vmm_release_handle(r->device, r->h[p]);
            r->h[p] = 0;
            r->stray[p] = false;
            g_vmm.nstray--;
        }
    }
    for (size_t i = 0; i < g_vmm.nresv;) {
        cuda_resv_t *r = &g_vmm.resv[i];
        if (!r->dropped || !vmm_finish_dropped(r)) {
            i++;
            continue;
        }
        free(r->h);
        free(r->stray);
        *r = g_vmm.resv[--g_vmm.nresv];
    }
}

/* At fini: the kept handles released again (those still refused stay for the next session). */
static void vmm_fini(void) {
    pthread_mutex_lock(&g_vmm.mu);
    vmm_retry_stale();
    if (g_vmm.nstale)
        SP_WARN(SP_SUB_DEVICE, "%zu page handle(s) the driver refused to release stay held",
                g_vmm.nstale);
    for (size_t i = 0; i < g_vmm.nresv; i++)
        if (g_vmm.resv[i].dropped)
            SP_WARN(SP_SUB_DEVICE,
                    "device %d: the reservation at %#llx could not be given back (the driver "
                    "refused an unmap or cuMemAddressFree): it stays held",
                    g_vmm.resv[i].device, (unsigned long long)g_vmm.resv[i].base);
    pthread_mutex_unlock(&g_vmm.mu);
}

/* Unmap and release pages [i0, i1) of r that hold a handle (g_vmm.mu held); the first error. A
 * page whose unmap the driver refuses stays mapped with its handle: released now, its memory
 * would stay held by the mapping ("freed when all outstanding mappings to the memory are
 * unmapped", cuMemRelease), and with the handle gone nothing would ever unmap it. */
static sp_status_t vmm_drop(cuda_resv_t *r, size_t i0, size_t i1, bool mapped) {
    sp_status_t res = SP_SUCCESS;
    for (size_t i = i0; i < i1; i++) {
        if (!r->h[i] || r->stray[i]) /* not this call's page: see cuda_resv_t.stray */
            continue;
        CUresult e = mapped ? g_vmm.unmap(r->base + i * r->page, r->page) : CUDA_SUCCESS;
        if (e != CUDA_SUCCESS) {
            if (res == SP_SUCCESS)
                res = cu_fail(e, "cuMemUnmap", r->device);
            continue;
        }
        vmm_release_handle(r->device, r->h[i]);
        r->h[i] = 0;
    }
    return res;
}

/* Unmap the mapped pages [i0, i1) of r one by one and release the handles of those unmapped
 * (g_vmm.mu held); a page the driver refuses stays mapped with its handle. Returns how many
 * were refused. */
static size_t vmm_unmap_each(cuda_resv_t *r, size_t i0, size_t i1) {
    size_t refused = 0;
    for (size_t k = i0; k < i1; k++) {
        if (g_vmm.unmap(r->base + k * r->page, r->page) != CUDA_SUCCESS) {
            refused++;
            continue;
        }
        vmm_release_handle(r->device, r->h[k]);
        r->h[k] = 0;
    }
    return refused;
}

/* Create the physical pages [i0, i1) (g_vmm.mu held), stray pages but (they have theirs); all
 * or nothing. */
static sp_status_t vmm_create(cuda_resv_t *r, size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; i++) {
        if (r->stray[i])
            continue;
        CUmemAllocationProp prop = page_prop(r->device);
        CUmemGenericAllocationHandle h = 0;
        CUresult e = g_vmm.create(&h, r->page, &prop, 0);
        if ((e == CUDA_ERROR_NOT_SUPPORTED || e == CUDA_ERROR_INVALID_VALUE ||
             e == CUDA_ERROR_NOT_PERMITTED) &&
            !g_vmm.no_fd) {
            /* No shareable handles here (containers without the capability, where the driver
             * answers NOT_SUPPORTED, INVALID_VALUE or NOT_PERMITTED): plain pages. */
            g_vmm.no_fd = true;
            prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
            e = g_vmm.create(&h, r->page, &prop, 0);
        }
        if (e != CUDA_SUCCESS) {
            sp_status_t res = cu_fail(e, "cuMemCreate", r->device);
            (void)vmm_drop(r, i0, i, false);
            return res;
        }
        r->h[i] = h;
    }
    return SP_SUCCESS;
}

/* Read and write access for `device` to [a, a + size) (g_vmm.mu held). */
static CUresult vmm_access(int device, CUdeviceptr a, size_t size) {
    CUmemAccessDesc desc;
    memset(&desc, 0, sizeof(desc));
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return g_vmm.access(a, size, &desc, 1);
}

static sp_status_t cuda_vmm_map(int device, void *addr, size_t size) {
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)addr;
    cuda_resv_t *r = NULL;
    pthread_mutex_lock(&g_vmm.mu);
    vmm_retry_stale();
    sp_status_t res = vmm_range(device, a, size, false, "vmm_map", &r);
    size_t i0 = r ? (a - r->base) / r->page : 0, i1 = r ? i0 + size / r->page : 0, done = i0;
    if (res == SP_SUCCESS)
        res = vmm_create(r, i0, i1);
    bool created = res == SP_SUCCESS;
    while (res == SP_SUCCESS && done < i1) {
        /* A stray page is still mapped with its handle: taken over as it is (access below). */
        CUresult e = r->stray[done]
                         ? CUDA_SUCCESS
                         : g_vmm.map(r->base + done * r->page, r->page, 0, r->h[done], 0);
        if (e != CUDA_SUCCESS)
            res = cu_fail(e, "cuMemMap", device); /* page `done` stays unmapped */
        else
            done++;
    }
    if (res == SP_SUCCESS) {
        CUresult e = vmm_access(device, a, size);
        if (e != CUDA_SUCCESS)
            res = cu_fail(e, "cuMemSetAccess", device);
    }
    if (res != SP_SUCCESS && created) {
        /* Undo: pages [i0, done) were mapped (all of them when only the access failed); the
         * rest only created. A page whose unmap the driver refuses stays mapped with its
         * handle: a stray page from now on (as those taken over stay), so that the allocator,
         * which counts the range unmapped, can grow into it again. */
        (void)vmm_drop(r, i0, done, true);
        (void)vmm_drop(r, done, i1, false);
        for (size_t i = i0; i < i1; i++)
            if (r->h[i] && !r->stray[i]) {
                r->stray[i] = true;
                g_vmm.nstray++;
            }
    } else if (res == SP_SUCCESS) {
        for (size_t i = i0; i < i1; i++)
            if (r->stray[i]) {
                r->stray[i] = false;
                g_vmm.nstray--;
            }
    }
    pthread_mutex_unlock(&g_vmm.mu);
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_vmm_unmap(int device, void *addr, size_t size) {
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)addr;
    cuda_resv_t *r = NULL;
    pthread_mutex_lock(&g_vmm.mu);
    vmm_retry_stale();
    sp_status_t res = vmm_range(device, a, size, true, "vmm_unmap", &r);
    if (res == SP_SUCCESS) {
        /* All or nothing, as vmm_map (the allocator keeps the range mapped and cached when this
         * fails): every page is unmapped before any handle is released, and a refused unmap maps
         * the pages already unmapped again with the handles still held. */
        size_t i0 = (a - r->base) / r->page, i1 = (a - r->base + size) / r->page, i = i0;
        CUresult e = CUDA_SUCCESS;
        while (i < i1 && (e = g_vmm.unmap(r->base + i * r->page, r->page)) == CUDA_SUCCESS)
            i++;
        if (i == i1) {
            (void)vmm_drop(r, i0, i1, false); /* unmapped: a refused release is kept */
        } else {
            res = cu_fail(e, "cuMemUnmap", device);
            size_t j = i0;
            while (j < i &&
                   g_vmm.map(r->base + j * r->page, r->page, 0, r->h[j], 0) == CUDA_SUCCESS)
                j++;
            if (j < i || (i > i0 && vmm_access(device, a, (i - i0) * r->page) != CUDA_SUCCESS)) {
                /* The driver refused that too: pages [j, i) are off the device for good (and
                 * [i0, j) mapped again without access when only the access failed). Reported
                 * as "nothing changed", the allocator kept counting them as mapped and cached,
                 * and handed out memory that is not there. So the unmap is finished instead,
                 * as asked: the pages mapped again and those from the refused one on; when
                 * every page is off the device, the range is what the caller asked for and
                 * the books agree (success, logged). */
                (void)vmm_drop(r, j, i, false);
                size_t left = vmm_unmap_each(r, i0, j) + vmm_unmap_each(r, i, i1);
                if (left == 0) {
                    SP_WARN(SP_SUB_DEVICE,
                            "device %d: a refused vmm_unmap of %#llx could not be undone (the "
                            "pages could not be mapped again); the range was unmapped whole "
                            "instead",
                            device, (unsigned long long)a);
                    res = SP_SUCCESS;
                } else {
                    res = sp__error(SP_ERR_DEVICE, SP_SUB_DEVICE,
                                    "device %d: vmm_unmap of %#llx (%zu bytes): cuMemUnmap was "
                                    "refused, the pages it had unmapped could not be mapped "
                                    "again, and %zu page(s) could not be unmapped either: part "
                                    "of the range is lost (not mapped, though the allocator "
                                    "counts it)",
                                    device, (unsigned long long)a, size, left);
                }
            }
        }
    }
    pthread_mutex_unlock(&g_vmm.mu);
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_vmm_release(int device, void *base, size_t size) {
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)base;
    pthread_mutex_lock(&g_vmm.mu);
    vmm_retry_stale();
    cuda_resv_t *r = vmm_find(device, a);
    sp_status_t res = SP_SUCCESS;
    if (!r || r->base != a || r->size != size) {
        res = sp__error(SP_ERR_INVALID_USAGE, SP_SUB_DEVICE,
                        "device %d: vmm_release(%p, %zu) is not a live reservation", device, base,
                        size);
    } else {
        for (size_t i = 0; i < size / r->page; i++)
            if (r->stray[i]) { /* it goes with the rest */
                r->stray[i] = false;
                g_vmm.nstray--;
            }
        res = vmm_drop(r, 0, size / r->page, true); /* pages still mapped go with it */
        CUresult e = res == SP_SUCCESS ? g_vmm.afree(a, size) : CUDA_SUCCESS;
        if (e != CUDA_SUCCESS)
            res = cu_fail(e, "cuMemAddressFree", device);
        if (res == SP_SUCCESS) {
            free(r->h);
            free(r->stray);
            *r = g_vmm.resv[--g_vmm.nresv];
        } else {
            /* A page the driver refused to unmap is still mapped (its handle kept), or the range
             * is still reserved: kept, the release is finished by the next vmm call or at fini
             * (vmm_retry_stale) instead of leaking the page's memory and the range. */
            r->dropped = true;
            SP_WARN(SP_SUB_DEVICE,
                    "device %d: vmm_release of %p was refused by the driver; it is tried again "
                    "later",
                    device, base);
        }
    }
    pthread_mutex_unlock(&g_vmm.mu);
    guard_exit(device, prev);
    return res;
}

/* Refused (SP_ERR_NOT_SUPPORTED, quiet) while the device's legacy stream counts as capturing,
 * i.e. a blocking stream of this device captures a graph: cudaDeviceSynchronize would invalidate
 * that capture. The allocator then keeps its cache (as PyTorch releases nothing while a capture
 * is under way). */
static sp_status_t cuda_device_sync(int device) {
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    bool capturing = false;
    sp_status_t res = cuda_device_capturing(device, &capturing);
    if (res == SP_SUCCESS && capturing)
        res = sp__error_quiet(SP_ERR_NOT_SUPPORTED, SP_SUB_DEVICE,
                              "cudaDeviceSynchronize on device %d: a stream of it is capturing a "
                              "CUDA graph",
                              device);
    if (res != SP_SUCCESS)
        goto out;
    CU_TRY_OUT(cudaDeviceSynchronize(), res);
out:
    guard_exit(device, prev);
    return res;
}

static const sp_device_ops_t cuda_ops = {
    .name = "cuda",
    .init = cuda_init,
    .fini = cuda_fini,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .mem_get_info = cuda_mem_get_info,
    .mem_total = cuda_mem_total,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .stream_capturing = cuda_stream_capturing,
    .stream_device = cuda_stream_device,
    .stream_destroyed = cuda_stream_destroyed,
    .device_capturing = cuda_device_capturing,
    .device_sync = cuda_device_sync,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .memcpy_async = cuda_memcpy_async,
    .vmm_reserve = cuda_vmm_reserve,
    .vmm_map = cuda_vmm_map,
    .vmm_unmap = cuda_vmm_unmap,
    .vmm_release = cuda_vmm_release,
};

static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;
static bool g_probe_ok;         /* written once under g_probe_once */
static char g_probe_error[256]; /* why the probe failed; written once under g_probe_once */

/* Whether a GPU answers. "CUDA driver version is insufficient" is the normal answer on a
 * machine without a GPU, so the failure is logged at INFO, and the thread's last error is left
 * alone (a probe is not a failure of the caller's operation). */
static void probe(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        drop_last_error(err);
        snprintf(g_probe_error, sizeof g_probe_error, "cudaGetDeviceCount: %s: %s",
                 cudaGetErrorName(err), cudaGetErrorString(err));
        SP_INFO(SP_SUB_DEVICE, "no usable GPU: %s", g_probe_error);
        g_probe_ok = false;
        return;
    }
    if (n <= 0) {
        snprintf(g_probe_error, sizeof g_probe_error, "cudaGetDeviceCount found 0 devices");
        SP_INFO(SP_SUB_DEVICE, "no usable GPU: %s", g_probe_error);
    }
    g_probe_ok = n > 0;
}

const sp_device_ops_t *sp__device_cuda_ops(void) {
    return &cuda_ops;
}

bool sp__device_cuda_available(void) {
    pthread_once(&g_probe_once, probe);
    return g_probe_ok;
}

const char *sp__device_cuda_probe_error(void) {
    pthread_once(&g_probe_once, probe);
    return g_probe_error;
}

#else /* !SP_HAVE_CUDA */

const sp_device_ops_t *sp__device_cuda_ops(void) {
    return NULL;
}

bool sp__device_cuda_available(void) {
    return false;
}

const char *sp__device_cuda_probe_error(void) {
    return "this sympool was built without CUDA";
}

#endif /* SP_HAVE_CUDA */
