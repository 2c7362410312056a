/*
 * cuda.c: the CUDA runtime backend. Compiled only when the build found the CUDA toolkit
 * (SP_HAVE_CUDA); without it sp__device_cuda_ops() is NULL and sp__device_cuda_available() false.
 *
 * Every op that names a device runs under a device guard: it makes `device` current and puts the
 * caller's current device back afterwards, so the allocator never changes the application's
 * device behind its back. CUDA errors are translated here, at the one place each call is made:
 * cudaErrorMemoryAllocation becomes SP_ERR_OUT_OF_MEMORY (quiet: the allocator frees its cache
 * and retries), anything else SP_ERR_DEVICE with "cudaErrorX: description". The sticky error is
 * cleared with cudaGetLastError() either way so it cannot surface in an unrelated later call.
 *
 * Events are created with cudaEventDisableTiming and pooled per device (a free list), so the
 * allocator's record-on-free path does not pay cudaEventCreate. Lock: one mutex per device guards
 * its event pool; CUDA itself is thread-safe. g_cuda is written only by init/fini, which
 * sp__device_select serializes.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "pool/device/device.h"

#ifdef SP_HAVE_CUDA

#include <cuda.h>
#include <cuda_runtime.h>

typedef struct cuda_dev {
    pthread_mutex_t mu; /* guards the pool below */
    cudaEvent_t *pool;  /* pooled events, [0, npool); mu */
    size_t npool;       /* pooled events; mu */
    size_t pool_cap;    /* capacity of `pool` in entries; mu */
} cuda_dev_t;

static struct {
    int count;        /* devices; 0 when not initialized */
    cuda_dev_t *devs; /* [count] */
} g_cuda;

/* Translate a CUDA failure at the call site; clears the sticky error. */
static sp_status_t cuda_fail(cudaError_t err, const char *file, int line, const char *what) {
    (void)cudaGetLastError();
    if (err == cudaErrorMemoryAllocation)
        return sp__error_quiet_at(SP_ERR_OUT_OF_MEMORY, SP_SUB_DEVICE, file, line, "%s: %s: %s",
                                  what, cudaGetErrorName(err), cudaGetErrorString(err));
    return sp__error_at(SP_ERR_DEVICE, SP_SUB_DEVICE, file, line, "%s: %s: %s", what,
                        cudaGetErrorName(err), cudaGetErrorString(err));
}
#define CU_TRY(call)                                                                               \
    do {                                                                                           \
        cudaError_t cu_e_ = (call);                                                                \
        if (SP_UNLIKELY(cu_e_ != cudaSuccess))                                                     \
            return cuda_fail(cu_e_, __FILE__, __LINE__, #call);                                    \
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
        CU_TRY(cudaSetDevice(device));
    *prev_p = prev;
    return SP_SUCCESS;
}

static void guard_exit(int device, int prev) {
    if (prev != device && prev >= 0 && cudaSetDevice(prev) != cudaSuccess)
        (void)cudaGetLastError();
}

/* ---- init / fini -------------------------------------------------------------------------- */

static sp_status_t cuda_init(sp_device_caps_t *caps_p) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
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
    bool vmm = true;
    CUresult (*get_dev)(CUdevice *, int) = NULL;
    CUresult (*get_attr)(int *, CUdevice_attribute, CUdevice) = NULL;
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &fn, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        get_dev = (CUresult(*)(CUdevice *, int))fn;
    if (cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute", &fn, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        get_attr = (CUresult(*)(int *, CUdevice_attribute, CUdevice))fn;
    (void)cudaGetLastError();
    for (int d = 0; d < n; d++) {
        pthread_mutex_init(&devs[d].mu, NULL);
        /* No runtime attribute for VMM: ask the driver, through an entry point the runtime
         * hands out, so that sympool does not link libcuda.so.1 (absent on GPU-less machines,
         * where the library must still load and run on the host backend). */
        int v = 0;
        if (get_attr && get_dev) {
            CUdevice cud;
            if (get_dev(&cud, d) != CUDA_SUCCESS ||
                get_attr(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cud) !=
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
    *caps_p = caps;
    return SP_SUCCESS;
}

static void cuda_fini(void) {
    for (int d = 0; d < g_cuda.count; d++) {
        cuda_dev_t *dev = &g_cuda.devs[d];
        int prev = -1;
        bool guarded = guard_enter(d, &prev) == SP_SUCCESS;
        for (size_t i = 0; i < dev->npool; i++)
            if (cudaEventDestroy(dev->pool[i]) != cudaSuccess)
                (void)cudaGetLastError();
        if (guarded)
            guard_exit(d, prev);
        free(dev->pool);
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
    CU_TRY_OUT(cudaMalloc(&p, size), res);
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
    CU_TRY_OUT(cudaFree(ptr), res);
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

/* ---- streams ------------------------------------------------------------------------------ */

static sp_status_t cuda_stream_create(int device, sp_dev_stream_t *stream_p) {
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    sp_status_t res = SP_SUCCESS;
    cudaStream_t s = NULL;
    CU_TRY_OUT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), res);
    *stream_p = (sp_dev_stream_t)s;
out:
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_stream_destroy(int device, sp_dev_stream_t stream) {
    int prev = -1;
    SP_CHECK(guard_enter(device, &prev));
    sp_status_t res = SP_SUCCESS;
    CU_TRY_OUT(cudaStreamDestroy((cudaStream_t)stream), res);
out:
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_stream_sync(int device, sp_dev_stream_t stream) {
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
        (void)cudaGetLastError();
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE, "%p is not a CUDA stream: %s: %s",
                         stream, cudaGetErrorName(err), cudaGetErrorString(err));
    }
    *device_p = d;
    return SP_SUCCESS;
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
    if (!e)
        CU_TRY_OUT(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), res);
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
    CU_TRY_OUT(cudaEventDestroy((cudaEvent_t)event), res);
out:
    guard_exit(device, prev);
    return res;
}

static sp_status_t cuda_event_record(int device, sp_dev_event_t event, sp_dev_stream_t stream) {
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
    cudaError_t err = cudaEventQuery((cudaEvent_t)event);
    if (err == cudaSuccess) {
        *done_p = true;
        return SP_SUCCESS;
    }
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* not an error, but keep the sticky slot clean */
        *done_p = false;
        return SP_SUCCESS;
    }
    return cuda_fail(err, __FILE__, __LINE__, "cudaEventQuery");
}

static sp_status_t cuda_event_sync(int device, sp_dev_event_t event) {
    (void)device;
    CU_TRY(cudaEventSynchronize((cudaEvent_t)event));
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

static const sp_device_ops_t cuda_ops = {
    .name = "cuda",
    .init = cuda_init,
    .fini = cuda_fini,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .mem_get_info = cuda_mem_get_info,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .stream_device = cuda_stream_device,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .memcpy_async = cuda_memcpy_async,
};

static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;
static bool g_probe_ok; /* written once under g_probe_once */

/* Whether a GPU answers. "CUDA driver version is insufficient" is the normal answer on a
 * machine without a GPU, so the failure is logged at INFO, and the thread's last error is left
 * alone (a probe is not a failure of the caller's operation). */
static void probe(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        SP_INFO(SP_SUB_DEVICE, "no usable GPU: cudaGetDeviceCount: %s: %s", cudaGetErrorName(err),
                cudaGetErrorString(err));
        g_probe_ok = false;
        return;
    }
    if (n <= 0)
        SP_INFO(SP_SUB_DEVICE, "no usable GPU: cudaGetDeviceCount found 0 devices");
    g_probe_ok = n > 0;
}

const sp_device_ops_t *sp__device_cuda_ops(void) {
    return &cuda_ops;
}

bool sp__device_cuda_available(void) {
    pthread_once(&g_probe_once, probe);
    return g_probe_ok;
}

#else /* !SP_HAVE_CUDA */

const sp_device_ops_t *sp__device_cuda_ops(void) {
    return NULL;
}

bool sp__device_cuda_available(void) {
    return false;
}

#endif /* SP_HAVE_CUDA */
