/*
 * runtime.c: the test double of libcudart.so.13 (the CUDA runtime). See driver.c for the machine
 * model. Every failure returns the cudaError_t a runtime returns, keeps it as the thread's last
 * error (cudaGetLastError), and says why on stderr.
 *
 * Per thread: the current device (cudaSetDevice; device 0 when never set, with no context made
 * by asking), the last error, the stream-capture interaction mode.
 *
 * Contexts: a call that needs the device makes its primary context (CUDA 12+: cudaSetDevice
 * does, "this function will also immediately initialize the runtime state on the primary
 * context", https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__DEVICE.html), and so
 * does cudaStreamIsCapturing on the legacy stream (measured on an H200, see that function); queries
 * (cudaGetDeviceCount, cudaGetDevice, cudaStreamGetDevice, cudaGetLastError, entry points) make
 * none.
 *
 * Streams and events belong to the device current at their creation. Completion is
 * deterministic, like sympool's host backend: the doubles do a stream's work (copies, sets,
 * collectives) at once, but an event recorded on stream S completes only once S has been
 * synchronized after the record (cudaStreamSynchronize(S), cudaDeviceSynchronize, an
 * cudaEventSynchronize of a later event of S, or a synchronous call on the legacy stream, which
 * waits for every blocking stream of its device: "Legacy default stream" in the CUDA Runtime API
 * "Stream synchronization behavior" page). cudaFree synchronizes the device as on a GPU. A
 * destroyed stream's work stays pending until the device is synchronized ("resources ... will be
 * released automatically once the device has completed all work in stream", cudaStreamDestroy).
 *
 * Capture (https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__STREAM.html,
 * cudaStreamBeginCapture and cudaThreadExchangeStreamCaptureMode; Programming Guide, "CUDA Graphs
 * / Prohibited and Unhandled Operations"): work on a capturing stream is recorded, not run; the
 * "potentially unsafe" calls (cudaMalloc, cudaFree, cudaEventQuery, cudaEventSynchronize,
 * cudaStreamQuery, synchronous cudaMemcpy/cudaMemset) are refused with
 * cudaErrorStreamCaptureUnsupported, and the capture that forbids them invalidated, when this
 * thread's mode is Global and any thread captures in Global mode, or the mode is ThreadLocal or
 * Global and this thread captures in a mode other than Relaxed; synchronizing or querying a
 * capturing stream or a captured event is invalid in every mode; the legacy stream cannot be
 * used while a blocking stream of its device captures (cudaErrorStreamCaptureImplicit).
 *
 * Lock: g_rt guards every stream, event and graph; it is never held across a driver.c call that
 * takes driver.c's lock except dbl_copy/dbl_set, which take only their own.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "dbl.h"

void *dbl_driver_entry(const char *name);

#define MAX_DEV 64
#define STREAM_MAGIC 0x73747265616d3031ULL
#define EVENT_MAGIC 0x6576656e74303031ULL

typedef struct stream {
    uint64_t magic;
    struct stream *next_all; /* every stream ever made, destroyed ones included (g_rt) */
    int dev;
    unsigned flags;
    bool legacy;
    bool destroyed;
    uint64_t recorded;  /* events recorded on it */
    uint64_t completed; /* prefix of those known complete */
    bool pending;       /* work enqueued since the last synchronize */
    bool capturing;
    bool invalidated;
    enum cudaStreamCaptureMode cap_mode;
    pthread_t cap_thread;
} stream_t;

typedef struct event {
    uint64_t magic;
    int dev;
    unsigned flags;
    stream_t *stream; /* last record, NULL if never recorded */
    uint64_t seq;
    bool captured; /* last recorded into a capture */
} event_t;

static pthread_mutex_t g_rt = PTHREAD_MUTEX_INITIALIZER;
static stream_t *g_streams;        /* g_rt */
static stream_t g_legacy[MAX_DEV]; /* g_rt */

/* Live handles, so a foreign or stale one is refused without being trusted (g_rt). */
typedef struct hnode {
    void *p;
    struct hnode *next;
} hnode_t;
#define NBUCKET 4096
static hnode_t *g_live[NBUCKET];

static size_t hslot(void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)(x % NBUCKET);
}
static bool live_has(void *p) {
    for (hnode_t *n = g_live[hslot(p)]; n; n = n->next)
        if (n->p == p)
            return true;
    return false;
}
static void live_add(void *p) {
    hnode_t *n = malloc(sizeof *n);
    if (!n)
        abort();
    n->p = p;
    n->next = g_live[hslot(p)];
    g_live[hslot(p)] = n;
}
static void live_del(void *p) {
    for (hnode_t **pp = &g_live[hslot(p)]; *pp; pp = &(*pp)->next)
        if ((*pp)->p == p) {
            hnode_t *n = *pp;
            *pp = n->next;
            free(n);
            return;
        }
}

/* ---- per thread ------------------------------------------------------------------------------ */

static __thread int t_dev = -1;
static __thread cudaError_t t_last = cudaSuccess;
static __thread enum cudaStreamCaptureMode t_mode = cudaStreamCaptureModeGlobal;

static int cur_dev(void) {
    return t_dev < 0 ? 0 : t_dev;
}

/* ---- errors ---------------------------------------------------------------------------------- */

#define ERRS(X)                                                                                    \
    X(cudaSuccess, "no error")                                                                     \
    X(cudaErrorInvalidValue, "invalid argument")                                                   \
    X(cudaErrorMemoryAllocation, "out of memory")                                                  \
    X(cudaErrorInitializationError, "initialization error")                                        \
    X(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version") \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                                     \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                                            \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                                   \
    X(cudaErrorIllegalState, "the operation cannot be performed in the present state")             \
    X(cudaErrorNotReady, "device not ready")                                                       \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")                         \
    X(cudaErrorLaunchFailure, "unspecified launch failure")                                        \
    X(cudaErrorHardwareStackError, "hardware stack error")                                         \
    X(cudaErrorIllegalInstruction, "an illegal instruction was encountered")                       \
    X(cudaErrorMisalignedAddress, "misaligned address")                                            \
    X(cudaErrorInvalidAddressSpace, "operation not supported on global/shared address space")      \
    X(cudaErrorInvalidPc, "invalid program counter")                                               \
    X(cudaErrorAssert, "device-side assert triggered")                                             \
    X(cudaErrorLaunchTimeout, "the launch timed out and was terminated")                           \
    X(cudaErrorECCUncorrectable, "uncorrectable ECC error encountered")                            \
    X(cudaErrorContained, "device-side error contained")                                           \
    X(cudaErrorLaunchOutOfResources, "too many resources requested for launch")                    \
    X(cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled")                         \
    X(cudaErrorTensorMemoryLeak, "tensor memory not completely freed")                             \
    X(cudaErrorMpsClientTerminated, "MPS client terminated")                                       \
    X(cudaErrorExternalDevice, "external device error")                                            \
    X(cudaErrorNotPermitted, "operation not permitted")                                            \
    X(cudaErrorNotSupported, "operation not supported")                                            \
    X(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing")       \
    X(cudaErrorStreamCaptureInvalidated,                                                           \
      "operation failed due to a previous error during capture")                                   \
    X(cudaErrorStreamCaptureImplicit,                                                              \
      "operation would make the legacy stream depend on a capturing blocking stream")              \
    X(cudaErrorCapturedEvent,                                                                      \
      "operation not permitted on an event last recorded in a capturing stream")                   \
    X(cudaErrorStreamCaptureWrongThread,                                                           \
      "attempt to terminate a thread-local capture sequence from another thread")                  \
    X(cudaErrorUnknown, "unknown error")

DBL_EXPORT const char *cudaGetErrorName(cudaError_t e) {
#define X(n, s)                                                                                    \
    case n:                                                                                        \
        return #n;
    switch (e) { ERRS(X) default : break; }
#undef X
    return "cudaErrorUnknown";
}

DBL_EXPORT const char *cudaGetErrorString(cudaError_t e) {
#define X(n, s)                                                                                    \
    case n:                                                                                        \
        return s;
    switch (e) { ERRS(X) default : break; }
#undef X
    return "unrecognized error code";
}

static cudaError_t rt_fail(const char *fn, cudaError_t e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static cudaError_t rt_fail(const char *fn, cudaError_t e, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    t_last = e;
    dbl_say(fn, cudaGetErrorName(e), (int)e, "%s", msg);
    return e;
}

static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;
static CUresult g_init_res;
static void rt_init(void) {
    g_init_res = cuInit(0);
    for (int d = 0; d < MAX_DEV; d++) {
        g_legacy[d].magic = STREAM_MAGIC;
        g_legacy[d].dev = d;
        g_legacy[d].legacy = true;
    }
}

/* The codes after which a context is unusable, exactly those whose comment in CUDA 13.0's
 * driver_types.h says "This leaves the process in an inconsistent state and any further CUDA work
 * will return the same error" or "the process must be terminated and relaunched": 226
 * cudaErrorContained, 700 IllegalAddress, 702 LaunchTimeout, 710 Assert, 714 HardwareStackError,
 * 715 IllegalInstruction, 716 MisalignedAddress, 717 InvalidAddressSpace, 718 InvalidPc, 719
 * LaunchFailure, 721 TensorMemoryLeak, 810 MpsClientTerminated, 911 ExternalDevice. The others
 * in 700..720 (701 LaunchOutOfResources, 704 PeerAccessAlreadyEnabled, 720
 * CooperativeLaunchTooLarge, ...) are ordinary errors that reading them resets. */
static bool sticky_code(int e) {
    switch (e) {
    case cudaErrorContained:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice:
        return true;
    default:
        return false;
    }
}

/* Start of every runtime call: the driver is initialized (implicitly, as the runtime does), and
 * an injected failure comes first (a sticky code makes the current device's context sticky). */
#define RT_ENTER(fn)                                                                               \
    do {                                                                                           \
        pthread_once(&g_init_once, rt_init);                                                       \
        int inj_ = dbl_inject_take(fn);                                                            \
        if (inj_) {                                                                                \
            if (sticky_code(inj_))                                                                 \
                dbl_set_sticky(cur_dev(), inj_);                                                   \
            return rt_fail(fn, (cudaError_t)inj_, "injected by the test");                         \
        }                                                                                          \
        if (g_init_res != CUDA_SUCCESS)                                                            \
            return rt_fail(fn, cudaErrorNoDevice, "no device (CUDA_DOUBLE_GPUS=0)");               \
    } while (0)

/* The current device's primary context, made if needed; its sticky error if it has one. */
static cudaError_t use_ctx(const char *fn, int dev) {
    dbl_ctx_make(dev);
    int s = dbl_sticky(dev);
    if (s)
        return rt_fail(fn, (cudaError_t)s, "device %d's context has a sticky error", dev);
    return cudaSuccess;
}
/* After a call that itself succeeded: the device's sticky error, if it has one, still fails it. */
static cudaError_t sticky_after(const char *fn, int dev) {
    int st = dbl_sticky(dev);
    return st ? rt_fail(fn, (cudaError_t)st, "sticky") : cudaSuccess;
}
#define CTX(fn, dev)                                                                               \
    do {                                                                                           \
        cudaError_t c_ = use_ctx(fn, dev);                                                         \
        if (c_ != cudaSuccess)                                                                     \
            return c_;                                                                             \
    } while (0)

DBL_EXPORT cudaError_t cudaGetLastError(void) {
    int s = dbl_sticky(cur_dev());
    if (s)
        return (cudaError_t)s; /* sticky: never reset */
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

DBL_EXPORT cudaError_t cudaPeekAtLastError(void) {
    int s = dbl_sticky(cur_dev());
    return s ? (cudaError_t)s : t_last;
}

/* ---- capture rules ----------------------------------------------------------------------------
 */

/* Whether this thread may make a potentially unsafe call now (g_rt held); invalidates the
 * captures that forbid it. */
static bool unsafe_allowed(void) {
    bool ok = true;
    pthread_t me = pthread_self();
    for (stream_t *s = g_streams; s; s = s->next_all) {
        if (!s->capturing)
            continue;
        bool mine = pthread_equal(s->cap_thread, me);
        bool forbids = false;
        if (t_mode == cudaStreamCaptureModeRelaxed)
            forbids = false;
        else if (mine && s->cap_mode != cudaStreamCaptureModeRelaxed)
            forbids = true;
        else if (!mine && t_mode == cudaStreamCaptureModeGlobal &&
                 s->cap_mode == cudaStreamCaptureModeGlobal)
            forbids = true;
        if (forbids) {
            s->invalidated = true;
            ok = false;
        }
    }
    return ok;
}

static cudaError_t check_unsafe(const char *fn) {
    pthread_mutex_lock(&g_rt);
    bool ok = unsafe_allowed();
    pthread_mutex_unlock(&g_rt);
    if (!ok)
        return rt_fail(fn, cudaErrorStreamCaptureUnsupported,
                       "a potentially unsafe call while a capture forbids it (this thread's "
                       "capture mode is %d); the capture is invalidated",
                       (int)t_mode);
    return cudaSuccess;
}
#define UNSAFE(fn)                                                                                 \
    do {                                                                                           \
        cudaError_t u_ = check_unsafe(fn);                                                         \
        if (u_ != cudaSuccess)                                                                     \
            return u_;                                                                             \
    } while (0)

/* Whether a blocking stream of `dev` captures (g_rt held). */
static bool blocking_capture_on(int dev) {
    for (stream_t *s = g_streams; s; s = s->next_all)
        if (s->capturing && s->dev == dev && !(s->flags & cudaStreamNonBlocking))
            return true;
    return false;
}

/* A stream handle to its record (g_rt held): NULL and cudaStreamLegacy are the current
 * device's legacy stream; cudaStreamPerThread is modelled as the same (it is never used by
 * sympool's device code, which refuses it). NULL when the handle is not a live stream. */
/* A handle that is not a live stream of this process (never created, or destroyed) is undefined
 * behaviour in CUDA, not an error code ("Use of the handle after this call is undefined
 * behavior", cudaStreamDestroy, CUDA Runtime API): the runtime dereferences it. On an H100 (driver
 * 580.159) cudaStreamGetDevice on the address of an int crashed the process (SIGSEGV), so the
 * double stops the process too, loudly, rather than answer cudaErrorInvalidResourceHandle and let a
 * caller rely on a check that the real thing does not make. */
static stream_t *stream_of(cudaStream_t h) {
    if (h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread)
        return &g_legacy[cur_dev()];
    stream_t *s = (stream_t *)h;
    if (!live_has(s)) {
        fprintf(stderr,
                "cuda-double: %p is not a CUDA stream of this process: undefined "
                "behaviour (a GPU may crash here); aborting\n",
                (void *)h);
        abort();
    }
    if (s->magic != STREAM_MAGIC || s->destroyed)
        return NULL;
    return s;
}

static void complete(stream_t *s) {
    s->completed = s->recorded;
    s->pending = false;
}

/* Everything queued on the legacy stream of dev, and (it waits for them) on its blocking
 * streams, is complete (g_rt held). */
static void legacy_sync(int dev) {
    complete(&g_legacy[dev]);
    for (stream_t *s = g_streams; s; s = s->next_all)
        if (s->dev == dev && !(s->flags & cudaStreamNonBlocking))
            complete(s);
}

static void device_sync(int dev) {
    complete(&g_legacy[dev]);
    for (stream_t *s = g_streams; s; s = s->next_all)
        if (s->dev == dev)
            complete(s);
}

/* For the NCCL double: validate a stream and say where it is. A pseudo-stream (NULL, legacy,
 * per-thread) is the one of device `dev` when dev >= 0 (NCCL made it current), else of the
 * current device. */
DBL_EXPORT int dbl_rt_stream(void *h, int dev, int *dev_p, bool *capturing_p) {
    pthread_once(&g_init_once, rt_init);
    pthread_mutex_lock(&g_rt);
    bool pseudo = h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread;
    stream_t *s = pseudo && dev >= 0 && dev < dbl_device_count() ? &g_legacy[dev]
                                                                 : stream_of((cudaStream_t)h);
    int rc = cudaErrorInvalidResourceHandle;
    if (s) {
        *dev_p = s->dev;
        *capturing_p = s->capturing || (s->legacy && blocking_capture_on(s->dev));
        s->pending = true;
        rc = 0;
    }
    pthread_mutex_unlock(&g_rt);
    return rc;
}

/* Test hook: streams of device `dev` that cudaStreamCreate* made and cudaStreamDestroy has not
 * destroyed (the legacy streams are not counted). Exported from libcudart.so.13. */
DBL_EXPORT int cuda_double_live_streams(int dev) {
    pthread_once(&g_init_once, rt_init);
    int n = 0;
    pthread_mutex_lock(&g_rt);
    for (stream_t *s = g_streams; s; s = s->next_all)
        n += !s->legacy && !s->destroyed && s->dev == dev;
    pthread_mutex_unlock(&g_rt);
    return n;
}

/* ---- devices ----------------------------------------------------------------------------------
 */

DBL_EXPORT cudaError_t cudaGetDeviceCount(int *n) {
    RT_ENTER("cudaGetDeviceCount");
    if (!n)
        return rt_fail("cudaGetDeviceCount", cudaErrorInvalidValue, "NULL");
    *n = dbl_device_count();
    return cudaSuccess;
}

/* cuda_runtime_api.h: "[domain]:[bus]:[device].[function] where domain, bus, device, and function
 * are all hexadecimal values", at most len characters with the NUL (13 hold it all); no context is
 * made (a device's attribute). The bus number names the machine's device behind this process's
 * `device` (CUDA_VISIBLE_DEVICES), so two processes that see one GPU under different ordinals get
 * one id, as NCCL's duplicate-GPU check compares them. */
DBL_EXPORT cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
    RT_ENTER("cudaDeviceGetPCIBusId");
    if (!pciBusId || len <= 0)
        return rt_fail("cudaDeviceGetPCIBusId", cudaErrorInvalidValue, "buffer %p of %d bytes",
                       (void *)pciBusId, len);
    if (device < 0 || device >= dbl_device_count())
        return rt_fail("cudaDeviceGetPCIBusId", cudaErrorInvalidDevice, "device %d of %d", device,
                       dbl_device_count());
    snprintf(pciBusId, (size_t)len, "0000:%02X:00.0", 0x10 + dbl_physical(device));
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaGetDevice(int *d) {
    RT_ENTER("cudaGetDevice");
    if (!d)
        return rt_fail("cudaGetDevice", cudaErrorInvalidValue, "NULL");
    *d = cur_dev();
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaSetDevice(int d) {
    RT_ENTER("cudaSetDevice");
    if (d < 0 || d >= dbl_device_count())
        return rt_fail("cudaSetDevice", cudaErrorInvalidDevice, "device %d of %d", d,
                       dbl_device_count());
    t_dev = d;
    CTX("cudaSetDevice", d);
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaDeviceSynchronize(void) {
    RT_ENTER("cudaDeviceSynchronize");
    int dev = cur_dev();
    CTX("cudaDeviceSynchronize", dev);
    pthread_mutex_lock(&g_rt);
    bool cap = false;
    for (stream_t *s = g_streams; s; s = s->next_all)
        if (s->capturing && s->dev == dev) {
            s->invalidated = true;
            cap = true;
        }
    if (!cap)
        device_sync(dev);
    pthread_mutex_unlock(&g_rt);
    if (cap) /* "invalid to ... synchronize a broader handle which encompasses an active stream
              * capture, such as a device" (Programming Guide, Prohibited Operations) */
        return rt_fail("cudaDeviceSynchronize", cudaErrorStreamCaptureUnsupported,
                       "device %d has a stream capturing a graph", dev);
    return cudaSuccess;
}

/* cuda_runtime_api.h: "Returns in *canAccessPeer a value of 1 if device device is capable of
 * directly accessing memory from peerDevice and 0 otherwise"; both are this process's ordinals
 * (cudaErrorInvalidDevice otherwise). The answer goes by the physical devices behind them. */
DBL_EXPORT cudaError_t cudaDeviceCanAccessPeer(int *can, int dev, int peer) {
    RT_ENTER("cudaDeviceCanAccessPeer");
    int n = dbl_device_count();
    if (!can || dev < 0 || dev >= n || peer < 0 || peer >= n)
        return rt_fail("cudaDeviceCanAccessPeer", cudaErrorInvalidDevice, "devices %d, %d of %d",
                       dev, peer, n);
    *can = dev != peer && dbl_p2p(dbl_physical(dev), dbl_physical(peer));
    return cudaSuccess;
}

/* cuda_runtime_api.h: "Returns in *device a device ordinal given a PCI bus ID string", in the
 * forms [domain]:[bus]:[device].[function], [domain]:[bus]:[device] or [bus]:[device].[function]
 * (hexadecimal); a bus id no visible device has is cudaErrorInvalidDevice (a device hidden by
 * CUDA_VISIBLE_DEVICES has no ordinal here). The doubles' devices are domain 0, device 0,
 * function 0, on bus 0x10 + the physical device (cudaDeviceGetPCIBusId). */
DBL_EXPORT cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *pciBusId) {
    RT_ENTER("cudaDeviceGetByPCIBusId");
    if (!device || !pciBusId)
        return rt_fail("cudaDeviceGetByPCIBusId", cudaErrorInvalidValue, "NULL");
    unsigned dom = 0, bus = 0, dv = 0, fn = 0;
    char tail = 0;
    int k = sscanf(pciBusId, "%x:%x:%x.%x%c", &dom, &bus, &dv, &fn, &tail);
    if (k != 3 && k != 4) { /* else [domain]:[bus]:[device] or with .[function] */
        dom = fn = 0;
        tail = 0;
        if (sscanf(pciBusId, "%x:%x.%x%c", &bus, &dv, &fn, &tail) != 3)
            return rt_fail("cudaDeviceGetByPCIBusId", cudaErrorInvalidValue, "\"%s\"", pciBusId);
    }
    for (int d = 0; d < dbl_device_count(); d++)
        if (dom == 0 && dv == 0 && fn == 0 && bus == 0x10u + (unsigned)dbl_physical(d)) {
            *device = d;
            return cudaSuccess;
        }
    return rt_fail("cudaDeviceGetByPCIBusId", cudaErrorInvalidDevice, "no visible device at %s",
                   pciBusId);
}

DBL_EXPORT cudaError_t cudaRuntimeGetVersion(int *v) {
    if (!v)
        return rt_fail("cudaRuntimeGetVersion", cudaErrorInvalidValue, "NULL");
    *v = 13000;
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaDriverGetVersion(int *v) {
    if (!v)
        return rt_fail("cudaDriverGetVersion", cudaErrorInvalidValue, "NULL");
    *v = 13000;
    return cudaSuccess;
}

/* "cudaDriverEntryPointSymbolNotFound: Search for symbol found no match" with cudaSuccess
 * (cudaGetDriverEntryPointByVersion docs); only the double's own driver functions are handed out,
 * so a process under the doubles never reaches a real libcuda. */
DBL_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
                                                        unsigned int version,
                                                        unsigned long long flags,
                                                        enum cudaDriverEntryPointQueryResult *st) {
    RT_ENTER("cudaGetDriverEntryPointByVersion");
    if (!symbol || !fn)
        return rt_fail("cudaGetDriverEntryPointByVersion", cudaErrorInvalidValue, "NULL");
    if (flags > (cudaEnableLegacyStream | cudaEnablePerThreadDefaultStream))
        return rt_fail("cudaGetDriverEntryPointByVersion", cudaErrorInvalidValue, "flags %llu",
                       flags);
    if (version < 12000) /* the entry points modelled here are the CUDA 12 ABI */
        return rt_fail("cudaGetDriverEntryPointByVersion", cudaErrorInvalidValue,
                       "version %u: the double models the CUDA 12+ ABI", version);
    *fn = dbl_driver_entry(symbol);
    if (st)
        *st = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn,
                                               unsigned long long flags,
                                               enum cudaDriverEntryPointQueryResult *st) {
    return cudaGetDriverEntryPointByVersion(symbol, fn, 13000, flags, st);
}

/* ---- memory ---------------------------------------------------------------------------------- */

DBL_EXPORT cudaError_t cudaMalloc(void **p, size_t size) {
    RT_ENTER("cudaMalloc");
    if (!p)
        return rt_fail("cudaMalloc", cudaErrorInvalidValue, "NULL");
    UNSAFE("cudaMalloc");
    int dev = cur_dev();
    CTX("cudaMalloc", dev);
    if (size == 0) {
        *p = NULL;
        return cudaSuccess;
    }
    int rc = dbl_mem_alloc(dev, size, p);
    if (rc) {
        t_last = (cudaError_t)rc;
        return (cudaError_t)rc;
    }
    return cudaSuccess;
}

/* cudaFree synchronizes the device (Runtime API, "API synchronization behavior": "cudaFree ...
 * implicit synchronization"), so every stream of the freed memory's device completes. */
DBL_EXPORT cudaError_t cudaFree(void *p) {
    RT_ENTER("cudaFree");
    UNSAFE("cudaFree");
    int dev = cur_dev();
    CTX("cudaFree", dev);
    if (!p)
        return cudaSuccess;
    int mdev = -1;
    if (dbl_mem_free(p, &mdev) != 0)
        return rt_fail("cudaFree", cudaErrorInvalidValue,
                       "%p is not the start of a live cudaMalloc allocation", p);
    pthread_mutex_lock(&g_rt);
    device_sync(mdev);
    pthread_mutex_unlock(&g_rt);
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t stream) {
    RT_ENTER("cudaMallocAsync");
    if (!p)
        return rt_fail("cudaMallocAsync", cudaErrorInvalidValue, "NULL");
    int dev = cur_dev();
    CTX("cudaMallocAsync", dev);
    pthread_mutex_lock(&g_rt);
    stream_t *s = stream_of(stream);
    if (s)
        dev = s->dev;
    pthread_mutex_unlock(&g_rt);
    if (!s)
        return rt_fail("cudaMallocAsync", cudaErrorInvalidResourceHandle, "stream %p", stream);
    int rc = dbl_mem_alloc(dev, size ? size : 1, p);
    if (rc) {
        t_last = (cudaError_t)rc;
        return (cudaError_t)rc;
    }
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t stream) {
    RT_ENTER("cudaFreeAsync");
    int mdev = -1;
    if (p && dbl_mem_free(p, &mdev) != 0)
        return rt_fail("cudaFreeAsync", cudaErrorInvalidValue,
                       "%p is not the start of a live allocation", p);
    (void)stream;
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int dev) {
    RT_ENTER("cudaDeviceGetDefaultMemPool");
    if (!pool || dev < 0 || dev >= dbl_device_count())
        return rt_fail("cudaDeviceGetDefaultMemPool", cudaErrorInvalidDevice, "device %d", dev);
    static char pools[MAX_DEV];
    *pool = (cudaMemPool_t)(void *)&pools[dev];
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr a,
                                               void *v) {
    RT_ENTER("cudaMemPoolSetAttribute");
    (void)a;
    if (!pool || !v)
        return rt_fail("cudaMemPoolSetAttribute", cudaErrorInvalidValue, "NULL");
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) {
    RT_ENTER("cudaMemGetInfo");
    int dev = cur_dev();
    CTX("cudaMemGetInfo", dev);
    if (!fr || !tot)
        return rt_fail("cudaMemGetInfo", cudaErrorInvalidValue, "NULL");
    *tot = dbl_device_memory();
    size_t used = dbl_mem_used(dev);
    *fr = used < *tot ? *tot - used : 0;
    return cudaSuccess;
}

/* The direction a cudaMemcpyKind promises, checked against what the pointers are (with unified
 * addressing the runtime knows; "cudaMemcpyDefault ... inferred from the pointer values"). */
static cudaError_t check_kind(const char *fn, void *dst, const void *src, enum cudaMemcpyKind k) {
    bool dd = dbl_mem_device(dst) >= 0, sd = dbl_mem_device(src) >= 0;
    bool ok = true;
    switch (k) {
    case cudaMemcpyHostToHost:
        ok = !dd && !sd;
        break;
    case cudaMemcpyHostToDevice:
        ok = dd && !sd;
        break;
    case cudaMemcpyDeviceToHost:
        ok = !dd && sd;
        break;
    case cudaMemcpyDeviceToDevice:
        ok = dd && sd;
        break;
    case cudaMemcpyDefault:
        break;
    default:
        return rt_fail(fn, cudaErrorInvalidValue, "kind %d", (int)k);
    }
    if (!ok)
        return rt_fail(fn, cudaErrorInvalidValue,
                       "kind %d but dst %p is %s memory and src %p is %s memory", (int)k, dst,
                       dd ? "device" : "host", src, sd ? "device" : "host");
    return cudaSuccess;
}

static cudaError_t do_copy(const char *fn, int dev, void *dst, const void *src, size_t n, int value,
                           bool set) {
    int rc = set ? dbl_set(dst, value, n) : dbl_copy(dst, src, n);
    if (rc == cudaErrorIllegalAddress) {
        dbl_set_sticky(dev, rc); /* a fault on a GPU is sticky */
        return rt_fail(fn, cudaErrorIllegalAddress,
                       "%p..+%zu touches device memory that is unmapped or has no access", dst, n);
    }
    return cudaSuccess;
}

/* A copy or set on `stream`: recorded into a capture, or done now. */
static cudaError_t enqueue_copy(const char *fn, void *dst, const void *src, size_t n, int value,
                                bool set, cudaStream_t stream, bool sync) {
    if (sync)
        UNSAFE(fn);
    int dev = cur_dev();
    CTX(fn, dev);
    pthread_mutex_lock(&g_rt);
    stream_t *s = stream_of(stream);
    cudaError_t e = cudaSuccess;
    bool run = true;
    if (!s) {
        e = cudaErrorInvalidResourceHandle;
    } else if (s->legacy && blocking_capture_on(s->dev)) {
        for (stream_t *c = g_streams; c; c = c->next_all)
            if (c->capturing && c->dev == s->dev && !(c->flags & cudaStreamNonBlocking))
                c->invalidated = true;
        e = cudaErrorStreamCaptureImplicit;
    } else if (s->capturing) {
        if (sync) {
            s->invalidated = true;
            e = cudaErrorStreamCaptureUnsupported;
        }
        run = false; /* a node of the graph */
    }
    int sdev = s ? s->dev : dev;
    pthread_mutex_unlock(&g_rt);
    if (e != cudaSuccess)
        return rt_fail(fn, e, "stream %p", stream);
    if (n == 0 || !run)
        return cudaSuccess;
    e = do_copy(fn, sdev, dst, src, n, value, set);
    if (e != cudaSuccess)
        return e;
    pthread_mutex_lock(&g_rt);
    if (sync)
        legacy_sync(sdev);
    else
        s->pending = true;
    pthread_mutex_unlock(&g_rt);
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
    RT_ENTER("cudaMemcpy");
    cudaError_t e = check_kind("cudaMemcpy", dst, src, k);
    return e != cudaSuccess ? e : enqueue_copy("cudaMemcpy", dst, src, n, 0, false, NULL, true);
}

DBL_EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                                       cudaStream_t stream) {
    RT_ENTER("cudaMemcpyAsync");
    cudaError_t e = check_kind("cudaMemcpyAsync", dst, src, k);
    return e != cudaSuccess ? e
                            : enqueue_copy("cudaMemcpyAsync", dst, src, n, 0, false, stream, false);
}

DBL_EXPORT cudaError_t cudaMemset(void *dst, int v, size_t n) {
    RT_ENTER("cudaMemset");
    if (n && dbl_mem_device(dst) < 0)
        return rt_fail("cudaMemset", cudaErrorInvalidValue, "%p is not device memory", dst);
    return enqueue_copy("cudaMemset", dst, NULL, n, v, true, NULL, true);
}

DBL_EXPORT cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t stream) {
    RT_ENTER("cudaMemsetAsync");
    if (n && dbl_mem_device(dst) < 0)
        return rt_fail("cudaMemsetAsync", cudaErrorInvalidValue, "%p is not device memory", dst);
    return enqueue_copy("cudaMemsetAsync", dst, NULL, n, v, true, stream, false);
}

/* ---- streams --------------------------------------------------------------------------------- */

DBL_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
    RT_ENTER("cudaStreamCreateWithFlags");
    if (!out || (flags & ~cudaStreamNonBlocking))
        return rt_fail("cudaStreamCreateWithFlags", cudaErrorInvalidValue, "flags %u", flags);
    int dev = cur_dev();
    CTX("cudaStreamCreateWithFlags", dev);
    stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return rt_fail("cudaStreamCreateWithFlags", cudaErrorMemoryAllocation, "host memory");
    s->magic = STREAM_MAGIC;
    s->dev = dev;
    s->flags = flags;
    pthread_mutex_lock(&g_rt);
    s->next_all = g_streams;
    g_streams = s;
    live_add(s);
    pthread_mutex_unlock(&g_rt);
    *out = (cudaStream_t)s;
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *out) {
    return cudaStreamCreateWithFlags(out, cudaStreamDefault);
}

DBL_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t h) {
    RT_ENTER("cudaStreamDestroy");
    pthread_mutex_lock(&g_rt);
    stream_t *s = stream_of(h);
    cudaError_t e = cudaSuccess;
    if (!s || s->legacy)
        e = cudaErrorInvalidResourceHandle;
    else if (s->capturing)
        e = cudaErrorStreamCaptureUnsupported;
    else {
        s->destroyed = true; /* its pending work completes with the device (file comment) */
        live_del(s);
    }
    int dev = s ? s->dev : cur_dev();
    pthread_mutex_unlock(&g_rt);
    if (e != cudaSuccess)
        return rt_fail("cudaStreamDestroy", e, "stream %p", h);
    return sticky_after("cudaStreamDestroy", dev);
}

DBL_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t h) {
    RT_ENTER("cudaStreamSynchronize");
    pthread_mutex_lock(&g_rt);
    stream_t *s = stream_of(h);
    cudaError_t e = cudaSuccess;
    if (!s)
        e = cudaErrorInvalidResourceHandle;
    else if (s->capturing) {
        s->invalidated = true;
        e = cudaErrorStreamCaptureUnsupported;
    } else if (s->legacy && blocking_capture_on(s->dev)) {
        e = cudaErrorStreamCaptureImplicit;
    }
    int dev = s ? s->dev : cur_dev();
    pthread_mutex_unlock(&g_rt);
    if (e != cudaSuccess)
        return rt_fail("cudaStreamSynchronize", e, "stream %p", h);
    CTX("cudaStreamSynchronize", dev);
    pthread_mutex_lock(&g_rt);
    if (s->legacy)
        legacy_sync(dev);
    else
        complete(s);
    pthread_mutex_unlock(&g_rt);
    return cudaSuccess;
}

/* A query's cudaErrorNotReady: an answer, not kept as the last error, unless
 * CUDA_DOUBLE_NOT_READY_KEPT=1, which keeps it there as the runtime PyTorch's allocator guards
 * against does (it clears the slot after every NotReady query: pytorch#18584, #61554), for the
 * tests that check sympool leaves the application's slot clean either way. */
static cudaError_t not_ready_answer(void) {
    const char *kept = getenv("CUDA_DOUBLE_NOT_READY_KEPT");
    if (kept && strcmp(kept, "1") == 0)
        t_last = cudaErrorNotReady;
    return cudaErrorNotReady;
}

DBL_EXPORT cudaError_t cudaStreamQuery(cudaStream_t h) {
    RT_ENTER("cudaStreamQuery");
    UNSAFE("cudaStreamQuery");
    pthread_mutex_lock(&g_rt);
    stream_t *s = stream_of(h);
    cudaError_t e = !s                                         ? cudaErrorInvalidResourceHandle
                    : s->capturing                             ? cudaErrorStreamCaptureUnsupported
                    : s->pending || s->completed < s->recorded ? cudaErrorNotReady
                                                               : cudaSuccess;
    if (s && s->capturing)
        s->invalidated = true;
    pthread_mutex_unlock(&g_rt);
    if (e == cudaErrorNotReady)
        return not_ready_answer();
    return e == cudaSuccess ? e : rt_fail("cudaStreamQuery", e, "stream %p", h);
}

DBL_EXPORT cudaError_t cudaStreamGetDevice(cudaStream_t h, int *dev) {
    RT_ENTER("cudaStreamGetDevice");
    pthread_mutex_lock(&g_rt);
    stream_t *s = stream_of(h);
    if (s && dev)
        *dev = s->dev;
    pthread_mutex_unlock(&g_rt);
    if (!s || !dev)
        return rt_fail("cudaStreamGetDevice", cudaErrorInvalidResourceHandle, "stream %p", h);
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t h, enum cudaStreamCaptureStatus *st) {
    RT_ENTER("cudaStreamIsCapturing");
    if (!st)
        return rt_fail("cudaStreamIsCapturing", cudaErrorInvalidValue, "NULL");
    /* Asking about the legacy stream makes the current device's primary context: on an H200
     * (driver 580.159.04, CUDA 13.0) cuDevicePrimaryCtxGetState said inactive before
     * cudaStreamIsCapturing(NULL) and active after it, in a fresh process (bench/gpu/probe.py,
     * bench/results/2026-11-29-s21-gpu-probe.json, "context"). cudaStreamPerThread is taken to
     * behave alike (it too is the current device's, in its primary context); only NULL was
     * measured. A named stream already has one. */
    if (h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread)
        CTX("cudaStreamIsCapturing", cur_dev());
    pthread_mutex_lock(&g_rt);
    stream_t *s = stream_of(h);
    cudaError_t e = cudaSuccess;
    if (!s)
        e = cudaErrorInvalidResourceHandle;
    else if (s->legacy && blocking_capture_on(s->dev))
        e = cudaErrorStreamCaptureImplicit; /* cudaStreamIsCapturing docs */
    else
        *st = !s->capturing    ? cudaStreamCaptureStatusNone
              : s->invalidated ? cudaStreamCaptureStatusInvalidated
                               : cudaStreamCaptureStatusActive;
    pthread_mutex_unlock(&g_rt);
    return e == cudaSuccess ? e : rt_fail("cudaStreamIsCapturing", e, "stream %p", h);
}

DBL_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t h, enum cudaStreamCaptureMode mode) {
    RT_ENTER("cudaStreamBeginCapture");
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return rt_fail("cudaStreamBeginCapture", cudaErrorInvalidValue, "mode %d", (int)mode);
    pthread_mutex_lock(&g_rt);
    stream_t *s = stream_of(h);
    cudaError_t e = cudaSuccess;
    if (!s)
        e = cudaErrorInvalidResourceHandle;
    else if (s->legacy) /* "Capture may not be initiated if stream is cudaStreamLegacy" */
        e = cudaErrorStreamCaptureUnsupported;
    else if (s->capturing)
        e = cudaErrorIllegalState;
    else {
        s->capturing = true;
        s->invalidated = false;
        s->cap_mode = mode;
        s->cap_thread = pthread_self();
    }
    pthread_mutex_unlock(&g_rt);
    return e == cudaSuccess ? e : rt_fail("cudaStreamBeginCapture", e, "stream %p", h);
}

DBL_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t h, cudaGraph_t *graph) {
    RT_ENTER("cudaStreamEndCapture");
    if (!graph)
        return rt_fail("cudaStreamEndCapture", cudaErrorInvalidValue, "NULL");
    pthread_mutex_lock(&g_rt);
    stream_t *s = stream_of(h);
    cudaError_t e = cudaSuccess;
    if (!s || !s->capturing)
        e = s ? cudaErrorIllegalState : cudaErrorInvalidResourceHandle;
    else if (s->cap_mode != cudaStreamCaptureModeRelaxed &&
             !pthread_equal(s->cap_thread, pthread_self()))
        e = cudaErrorStreamCaptureWrongThread; /* cudaStreamEndCapture docs */
    else {
        s->capturing = false;
        if (s->invalidated)
            e = cudaErrorStreamCaptureInvalidated;
        s->invalidated = false;
    }
    pthread_mutex_unlock(&g_rt);
    *graph = NULL;
    if (e != cudaSuccess)
        return rt_fail("cudaStreamEndCapture", e, "stream %p", h);
    *graph = (cudaGraph_t)malloc(16);
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    RT_ENTER("cudaGraphDestroy");
    free(g);
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
    RT_ENTER("cudaThreadExchangeStreamCaptureMode");
    if (!mode ||
        (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
         *mode != cudaStreamCaptureModeRelaxed))
        return rt_fail("cudaThreadExchangeStreamCaptureMode", cudaErrorInvalidValue, "mode %d",
                       mode ? (int)*mode : -1);
    enum cudaStreamCaptureMode old = t_mode;
    t_mode = *mode;
    *mode = old;
    return cudaSuccess;
}

/* ---- events ---------------------------------------------------------------------------------- */

DBL_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags) {
    RT_ENTER("cudaEventCreateWithFlags");
    unsigned all = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
    if (!out || (flags & ~all))
        return rt_fail("cudaEventCreateWithFlags", cudaErrorInvalidValue, "flags %u", flags);
    /* "cudaEventInterprocess ... must be used with cudaEventDisableTiming" (docs) */
    if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
        return rt_fail("cudaEventCreateWithFlags", cudaErrorInvalidValue,
                       "cudaEventInterprocess without cudaEventDisableTiming");
    int dev = cur_dev();
    CTX("cudaEventCreateWithFlags", dev);
    event_t *ev = calloc(1, sizeof *ev);
    if (!ev)
        return rt_fail("cudaEventCreateWithFlags", cudaErrorMemoryAllocation, "host memory");
    ev->magic = EVENT_MAGIC;
    ev->dev = dev;
    ev->flags = flags;
    pthread_mutex_lock(&g_rt);
    live_add(ev);
    pthread_mutex_unlock(&g_rt);
    *out = (cudaEvent_t)ev;
    return cudaSuccess;
}

DBL_EXPORT cudaError_t cudaEventCreate(cudaEvent_t *out) {
    return cudaEventCreateWithFlags(out, cudaEventDefault);
}

static event_t *event_of(cudaEvent_t h) {
    event_t *e = (event_t *)h;
    return e && live_has(e) && e->magic == EVENT_MAGIC ? e : NULL;
}

DBL_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t h) {
    RT_ENTER("cudaEventDestroy");
    pthread_mutex_lock(&g_rt);
    event_t *e = event_of(h);
    if (e) {
        live_del(e);
        e->magic = 0;
    }
    pthread_mutex_unlock(&g_rt);
    if (!e)
        return rt_fail("cudaEventDestroy", cudaErrorInvalidResourceHandle, "event %p", h);
    free(e);
    return cudaSuccess;
}

/* "cudaEventRecord ... stream and event must be on the same device" (cudaEventRecord docs:
 * cudaErrorInvalidResourceHandle otherwise). */
DBL_EXPORT cudaError_t cudaEventRecord(cudaEvent_t h, cudaStream_t stream) {
    RT_ENTER("cudaEventRecord");
    pthread_mutex_lock(&g_rt);
    event_t *e = event_of(h);
    stream_t *s = stream_of(stream);
    cudaError_t err = cudaSuccess;
    const char *why = "";
    if (!e || !s) {
        err = cudaErrorInvalidResourceHandle;
        why = !e ? "not a live event" : "not a live stream";
    } else if (e->dev != s->dev) {
        err = cudaErrorInvalidResourceHandle;
        why = "event and stream are on different devices";
    } else if (s->legacy && blocking_capture_on(s->dev)) {
        err = cudaErrorStreamCaptureImplicit;
        why = "the legacy stream while a blocking stream captures";
    } else if (s->capturing) {
        e->captured = true; /* a node of the graph */
        e->stream = NULL;
    } else {
        e->captured = false;
        e->stream = s;
        e->seq = ++s->recorded;
    }
    int dev = s ? s->dev : cur_dev();
    pthread_mutex_unlock(&g_rt);
    if (err != cudaSuccess)
        return rt_fail("cudaEventRecord", err, "event %p on stream %p: %s", h, stream, why);
    return sticky_after("cudaEventRecord", dev);
}

/* cudaErrorNotReady is an answer, not a failure: not kept as the last error (PyTorch's
 * allocator clears it anyway, pytorch#18584, which came from HIP; not_ready_answer). */
DBL_EXPORT cudaError_t cudaEventQuery(cudaEvent_t h) {
    RT_ENTER("cudaEventQuery");
    UNSAFE("cudaEventQuery");
    pthread_mutex_lock(&g_rt);
    event_t *e = event_of(h);
    cudaError_t err = !e            ? cudaErrorInvalidResourceHandle
                      : e->captured ? cudaErrorCapturedEvent
                      : !e->stream || e->stream->completed >= e->seq ? cudaSuccess
                                                                     : cudaErrorNotReady;
    int dev = e ? e->dev : cur_dev();
    pthread_mutex_unlock(&g_rt);
    if (err == cudaErrorNotReady)
        return not_ready_answer();
    if (err != cudaSuccess)
        return rt_fail("cudaEventQuery", err, "event %p", h);
    return sticky_after("cudaEventQuery", dev);
}

DBL_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t h) {
    RT_ENTER("cudaEventSynchronize");
    UNSAFE("cudaEventSynchronize");
    pthread_mutex_lock(&g_rt);
    event_t *e = event_of(h);
    cudaError_t err = !e            ? cudaErrorInvalidResourceHandle
                      : e->captured ? cudaErrorCapturedEvent
                                    : cudaSuccess;
    if (err == cudaSuccess && e->stream && e->stream->completed < e->seq)
        e->stream->completed = e->seq;
    int dev = e ? e->dev : cur_dev();
    pthread_mutex_unlock(&g_rt);
    if (err != cudaSuccess)
        return rt_fail("cudaEventSynchronize", err, "event %p", h);
    return sticky_after("cudaEventSynchronize", dev);
}
