/*
 * driver.c: the test double of libcuda.so.1 (the CUDA driver), and the machine model the three
 * doubles share. A test tool, never installed; the real GPU check (scripts/gpu-check.sh) stays
 * the truth. Only what sympool and its tests call is here, and every call checks what the CUDA
 * documents say a GPU checks; a failure returns the CUresult a driver returns and says why on
 * stderr ("cuda-double: <call>: <code>: <why>").
 *
 * Machine: CUDA_DOUBLE_GPUS devices (default 1), each of CUDA_DOUBLE_MEMORY bytes (default
 * 80 GiB), per process (ranks on different devices never share a capacity). CUDA_VISIBLE_DEVICES
 * chooses which of them the process sees, and in which order, as the CUDA Programming Guide's
 * "CUDA Environment Variables" says: a comma-separated list of device indices, enumeration
 * stopping at the first index that is not a device; the process's device i is then physical
 * device list[i] (its PCI bus id, and NCCL's duplicate-GPU check, go by the physical one).
 * Every two distinct devices reach each other by CUDA P2P except the pairs of physical devices
 * CUDA_DOUBLE_NO_P2P lists ("0:1,2:3"), as on a machine whose GPUs sit under different PCIe root
 * complexes (cudaDeviceCanAccessPeer answers 0 for them, and NCCL's isAllCudaP2p is false).
 *
 * Device memory is not host memory. Each allocation (cudaMalloc's, or a VMM mapping) is an
 * address range reserved PROT_NONE, so a host dereference faults as it does on a GPU; its bytes
 * live in a separate host "shadow" mapping that only the doubles' own copies, sets and
 * collectives reach (dbl_copy). Regions are kept sorted by address.
 *
 * Lock: g_mu guards the region table, reservations, VMM handles and capacities; the context
 * flags and sticky errors are atomics.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "dbl.h"

#define MAX_DEV 64
#define GRAN ((size_t)2 << 20) /* VMM minimum and recommended granularity (2 MiB on H100) */

/* ---- the machine ---------------------------------------------------------------------------- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_ndev = 1;      /* devices this process sees */
static int g_phys[MAX_DEV]; /* the machine's device behind each of them */
static size_t g_mem = (size_t)80 << 30;
static atomic_bool g_initialized; /* cuInit ran */
static atomic_int g_ctx_made[MAX_DEV];
static atomic_bool g_ctx_active[MAX_DEV];
static atomic_int g_sticky[MAX_DEV];
static size_t g_used[MAX_DEV]; /* g_mu */

static size_t parse_size(const char *s, size_t dflt) {
    if (!s || !*s)
        return dflt;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    switch (end && *end ? *end : 0) {
    case 'K':
    case 'k':
        v <<= 10;
        break;
    case 'M':
    case 'm':
        v <<= 20;
        break;
    case 'G':
    case 'g':
        v <<= 30;
        break;
    case 'T':
    case 't':
        v <<= 40;
        break;
    default:
        break;
    }
    return v ? (size_t)v : dflt;
}

/* CUDA_DOUBLE_NO_P2P's pairs of physical devices, as a symmetric matrix. */
static bool g_no_p2p[MAX_DEV][MAX_DEV];

static void no_p2p_init(void) {
    const char *e = getenv("CUDA_DOUBLE_NO_P2P");
    for (const char *c = e; c && *c;) {
        char *end = NULL;
        long a = strtol(c, &end, 10), b = -1;
        if (end != c && *end == ':') {
            c = end + 1;
            b = strtol(c, &end, 10);
        }
        if (end == c || a < 0 || a >= MAX_DEV || b < 0 || b >= MAX_DEV) {
            fprintf(stderr, "cuda-double: CUDA_DOUBLE_NO_P2P=%s: pairs a:b of devices below %d\n",
                    e, MAX_DEV);
            return;
        }
        g_no_p2p[a][b] = g_no_p2p[b][a] = true;
        c = *end == ',' ? end + 1 : end;
    }
}

static void machine_init(void) {
    const char *n = getenv("CUDA_DOUBLE_GPUS");
    if (n && *n) {
        g_ndev = atoi(n);
        if (g_ndev < 0 || g_ndev > MAX_DEV) {
            fprintf(stderr, "cuda-double: CUDA_DOUBLE_GPUS=%s: between 0 and %d\n", n, MAX_DEV);
            g_ndev = 1;
        }
    }
    g_mem = parse_size(getenv("CUDA_DOUBLE_MEMORY"), g_mem);
    no_p2p_init();
    for (int i = 0; i < MAX_DEV; i++)
        g_phys[i] = i;
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis) {
        int machine = g_ndev, n = 0;
        for (const char *c = vis; *c && n < machine;) {
            char *end = NULL;
            long v = strtol(c, &end, 10);
            if (end == c || (*end != ',' && *end != '\0') || v < 0 || v >= machine)
                break; /* not a device: the devices before it are the visible ones */
            g_phys[n++] = (int)v;
            c = *end == ',' ? end + 1 : end;
        }
        g_ndev = n;
    }
}

static void machine(void) {
    pthread_once(&g_once, machine_init);
}

DBL_EXPORT int dbl_physical(int dev) {
    machine();
    return dev >= 0 && dev < g_ndev ? g_phys[dev] : -1;
}

DBL_EXPORT bool dbl_p2p(int phys_a, int phys_b) {
    machine();
    return phys_a != phys_b && phys_a >= 0 && phys_a < MAX_DEV && phys_b >= 0 && phys_b < MAX_DEV &&
           !g_no_p2p[phys_a][phys_b];
}

DBL_EXPORT int dbl_device_count(void) {
    machine();
    return g_ndev;
}
DBL_EXPORT size_t dbl_device_memory(void) {
    machine();
    return g_mem;
}
DBL_EXPORT size_t dbl_granularity(void) {
    return GRAN;
}

DBL_EXPORT void dbl_say(const char *fn, const char *code_name, int code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuda-double[%d]: %s: %s (%d): %s\n", (int)getpid(), fn, code_name, code, msg);
}

/* ---- contexts, sticky errors, injected failures --------------------------------------------- */

DBL_EXPORT bool dbl_ctx_active(int dev) {
    return dev >= 0 && dev < MAX_DEV && atomic_load(&g_ctx_active[dev]);
}

DBL_EXPORT void dbl_ctx_make(int dev) {
    bool was = false;
    if (dev >= 0 && dev < MAX_DEV &&
        atomic_compare_exchange_strong(&g_ctx_active[dev], &was, true)) {
        atomic_fetch_add(&g_ctx_made[dev], 1);
        /* CUDA_DOUBLE_TRACE_CONTEXTS=1: who made it (a test that counts contexts failed). */
        const char *t = getenv("CUDA_DOUBLE_TRACE_CONTEXTS");
        if (t && *t == '1') {
            fprintf(stderr, "cuda-double[%d]: primary context made on device %d by:\n",
                    (int)getpid(), dev);
            void *bt[32];
            backtrace_symbols_fd(bt, backtrace(bt, 32), 2);
        }
    }
}

DBL_EXPORT int dbl_sticky(int dev) {
    return dev >= 0 && dev < MAX_DEV ? atomic_load(&g_sticky[dev]) : 0;
}
DBL_EXPORT void dbl_set_sticky(int dev, int err) {
    if (dev >= 0 && dev < MAX_DEV) {
        int none = 0;
        atomic_compare_exchange_strong(&g_sticky[dev], &none, err);
    }
}

DBL_EXPORT int cuda_double_primary_contexts(int dev) {
    return dev >= 0 && dev < MAX_DEV ? atomic_load(&g_ctx_made[dev]) : -1;
}
DBL_EXPORT int cuda_double_contexts_total(void) {
    int t = 0;
    for (int d = 0; d < MAX_DEV; d++)
        t += atomic_load(&g_ctx_made[d]);
    return t;
}
/* A sticky error cannot be caused by host code on a GPU (a kernel fault causes it): only this
 * hook makes one. From then on every call using that context returns it (CUDA Runtime API,
 * "Error Handling": "...the CUDA context is corrupted ... all subsequent calls fail",
 * https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__ERROR.html). */
DBL_EXPORT void cuda_double_make_sticky(int dev, int err) {
    dbl_set_sticky(dev, err);
}

static pthread_mutex_t g_inj_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char fn[64];
    int code, skip;
} g_inj[32];
static atomic_int g_ninj; /* entries with code != 0 may exist */

/* The (skip+1)-th next call of `fn` fails with `code` (a cudaError_t, CUresult or ncclResult_t
 * as the call returns); code 0 removes the entry. */
DBL_EXPORT void cuda_double_inject(const char *fn, int code, int skip) {
    pthread_mutex_lock(&g_inj_mu);
    int free_i = -1;
    for (int i = 0; i < 32; i++) {
        if (g_inj[i].code && strcmp(g_inj[i].fn, fn) == 0) {
            g_inj[i].code = code;
            g_inj[i].skip = skip;
            pthread_mutex_unlock(&g_inj_mu);
            return;
        }
        if (!g_inj[i].code && free_i < 0)
            free_i = i;
    }
    if (code && free_i >= 0) {
        snprintf(g_inj[free_i].fn, sizeof g_inj[free_i].fn, "%s", fn);
        g_inj[free_i].code = code;
        g_inj[free_i].skip = skip;
        atomic_fetch_add(&g_ninj, 1);
    }
    pthread_mutex_unlock(&g_inj_mu);
}

DBL_EXPORT int dbl_inject_take(const char *fn) {
    if (atomic_load_explicit(&g_ninj, memory_order_relaxed) == 0)
        return 0;
    int code = 0;
    pthread_mutex_lock(&g_inj_mu);
    for (int i = 0; i < 32; i++) {
        if (g_inj[i].code && strcmp(g_inj[i].fn, fn) == 0) {
            if (g_inj[i].skip > 0) {
                g_inj[i].skip--;
            } else {
                code = g_inj[i].code;
                g_inj[i].code = 0;
                atomic_fetch_sub(&g_ninj, 1);
            }
            break;
        }
    }
    pthread_mutex_unlock(&g_inj_mu);
    return code;
}

/* ---- device memory -------------------------------------------------------------------------- */

typedef struct vmm_handle {
    uint64_t magic; /* VMM_MAGIC while live */
    size_t size;
    int dev;
    char *shadow; /* the physical bytes */
    int maps;     /* live mappings of it */
    bool released;
} vmm_handle_t;
#define VMM_MAGIC 0x766d6d68616e646cULL

typedef struct region {
    uintptr_t base;
    size_t size;
    char *shadow; /* host view of the bytes */
    int dev;
    bool vmm;        /* a cuMemMap mapping (else a cudaMalloc allocation) */
    bool access;     /* cuMemSetAccess granted read-write (always for cudaMalloc) */
    vmm_handle_t *h; /* vmm only */
    size_t acct;     /* bytes counted against the device's capacity (cudaMalloc only) */
} region_t;

typedef struct resv {
    uintptr_t base;
    size_t size;
} resv_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static region_t *g_reg; /* sorted by base; g_mu */
static size_t g_nreg, g_capreg;
static resv_t *g_resv; /* g_mu */
static size_t g_nresv, g_capresv;
static int g_live_handles; /* g_mu */

/* Index of the region containing p, or -1 (g_mu). */
static long reg_find(uintptr_t p) {
    size_t lo = 0, hi = g_nreg;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_reg[mid].base + g_reg[mid].size <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < g_nreg && g_reg[lo].base <= p && p < g_reg[lo].base + g_reg[lo].size)
        return (long)lo;
    return -1;
}

static bool reg_insert(region_t r) {
    if (g_nreg == g_capreg) {
        size_t nc = g_capreg ? g_capreg * 2 : 256;
        region_t *n = realloc(g_reg, nc * sizeof *n);
        if (!n)
            return false;
        g_reg = n;
        g_capreg = nc;
    }
    size_t i = 0, lo = 0, hi = g_nreg;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_reg[mid].base < r.base)
            lo = mid + 1;
        else
            hi = mid;
    }
    i = lo;
    memmove(&g_reg[i + 1], &g_reg[i], (g_nreg - i) * sizeof *g_reg);
    g_reg[i] = r;
    g_nreg++;
    return true;
}

static void reg_remove(size_t i) {
    memmove(&g_reg[i], &g_reg[i + 1], (g_nreg - i - 1) * sizeof *g_reg);
    g_nreg--;
}

static long resv_find(uintptr_t p) {
    for (size_t i = 0; i < g_nresv; i++)
        if (g_resv[i].base <= p && p < g_resv[i].base + g_resv[i].size)
            return (long)i;
    return -1;
}

static void *reserve_va(size_t size, size_t align) {
    size_t len = size + (align > (size_t)getpagesize() ? align : 0);
    char *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (len == size)
        return p;
    uintptr_t a = ((uintptr_t)p + align - 1) / align * align;
    if (a > (uintptr_t)p)
        munmap(p, a - (uintptr_t)p);
    uintptr_t end = (uintptr_t)p + len;
    if (end > a + size)
        munmap((void *)(a + size), end - (a + size));
    return (void *)a;
}

static char *shadow_new(size_t size) {
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static size_t page_up(size_t n) {
    size_t pg = (size_t)getpagesize();
    return (n + pg - 1) / pg * pg;
}

DBL_EXPORT int dbl_mem_alloc(int dev, size_t size, void **p) {
    machine();
    /* cudaMalloc hands out at least 256-byte aligned memory; account in 512-byte units. */
    size_t acct = (size + 511) / 512 * 512;
    size_t len = page_up(size);
    pthread_mutex_lock(&g_mu);
    if (g_used[dev] + acct > g_mem || acct < size) {
        size_t used = g_used[dev];
        pthread_mutex_unlock(&g_mu);
        dbl_say("cudaMalloc", "cudaErrorMemoryAllocation", cudaErrorMemoryAllocation,
                "device %d: %zu bytes asked, %zu of %zu in use", dev, size, used, g_mem);
        return cudaErrorMemoryAllocation;
    }
    g_used[dev] += acct;
    pthread_mutex_unlock(&g_mu);
    void *va = reserve_va(len, 0);
    char *sh = va ? shadow_new(len) : NULL;
    pthread_mutex_lock(&g_mu);
    bool ok = sh && reg_insert((region_t){(uintptr_t)va, len, sh, dev, false, true, NULL, acct});
    if (!ok)
        g_used[dev] -= acct;
    pthread_mutex_unlock(&g_mu);
    if (!ok) {
        if (va)
            munmap(va, len);
        if (sh)
            munmap(sh, len);
        dbl_say("cudaMalloc", "cudaErrorMemoryAllocation", cudaErrorMemoryAllocation,
                "the host could not map %zu bytes (%s)", size, strerror(errno));
        return cudaErrorMemoryAllocation;
    }
    *p = va;
    return 0;
}

DBL_EXPORT int dbl_mem_free(void *p, int *dev_p) {
    pthread_mutex_lock(&g_mu);
    long i = reg_find((uintptr_t)p);
    if (i < 0 || g_reg[i].vmm || g_reg[i].base != (uintptr_t)p) {
        pthread_mutex_unlock(&g_mu);
        return -1;
    }
    region_t r = g_reg[i];
    reg_remove((size_t)i);
    g_used[r.dev] -= r.acct;
    pthread_mutex_unlock(&g_mu);
    munmap((void *)r.base, r.size);
    munmap(r.shadow, r.size);
    *dev_p = r.dev;
    return 0;
}

DBL_EXPORT size_t dbl_mem_used(int dev) {
    pthread_mutex_lock(&g_mu);
    size_t u = dev >= 0 && dev < MAX_DEV ? g_used[dev] : 0;
    pthread_mutex_unlock(&g_mu);
    return u;
}
DBL_EXPORT size_t cuda_double_memory_used(int dev) {
    return dbl_mem_used(dev);
}

DBL_EXPORT int dbl_mem_device(const void *p) {
    pthread_mutex_lock(&g_mu);
    long i = reg_find((uintptr_t)p);
    int d = i < 0 ? -1 : g_reg[i].dev;
    pthread_mutex_unlock(&g_mu);
    return d;
}

/* A host view of p and how many bytes from p it covers, or NULL with *err set (g_mu). Host
 * memory (not a region and not reserved VA) is itself. */
static char *resolve(uintptr_t p, size_t *avail, int *err) {
    long i = reg_find(p);
    if (i >= 0) {
        region_t *r = &g_reg[i];
        if (!r->access) {
            *err = cudaErrorIllegalAddress;
            return NULL;
        }
        *avail = r->base + r->size - p;
        return r->shadow + (p - r->base);
    }
    if (resv_find(p) >= 0) { /* reserved but unmapped VA: a GPU faults there */
        *err = cudaErrorIllegalAddress;
        return NULL;
    }
    *avail = SIZE_MAX;
    return (char *)p;
}

DBL_EXPORT int dbl_copy(void *dst, const void *src, size_t n) {
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    int err = 0;
    pthread_mutex_lock(&g_mu);
    while (n > 0) {
        size_t ad = 0, as = 0;
        char *hd = resolve(d, &ad, &err);
        char *hs = hd ? resolve(s, &as, &err) : NULL;
        if (!hd || !hs)
            break;
        size_t k = n < ad ? n : ad;
        k = k < as ? k : as;
        memmove(hd, hs, k);
        d += k;
        s += k;
        n -= k;
    }
    pthread_mutex_unlock(&g_mu);
    return err;
}

DBL_EXPORT int dbl_set(void *dst, int value, size_t n) {
    uintptr_t d = (uintptr_t)dst;
    int err = 0;
    pthread_mutex_lock(&g_mu);
    while (n > 0) {
        size_t ad = 0;
        char *hd = resolve(d, &ad, &err);
        if (!hd)
            break;
        size_t k = n < ad ? n : ad;
        memset(hd, value, k);
        d += k;
        n -= k;
    }
    pthread_mutex_unlock(&g_mu);
    return err;
}

DBL_EXPORT void *dbl_view(const void *p, size_t n) {
    pthread_mutex_lock(&g_mu);
    long i = reg_find((uintptr_t)p);
    void *v = NULL;
    if (i >= 0 && g_reg[i].access && (uintptr_t)p + n <= g_reg[i].base + g_reg[i].size)
        v = g_reg[i].shadow + ((uintptr_t)p - g_reg[i].base);
    pthread_mutex_unlock(&g_mu);
    return v;
}

DBL_EXPORT int dbl_vmm_range(const void *p, uintptr_t *base_p, size_t *size_p, int *dev_p) {
    pthread_mutex_lock(&g_mu);
    long i = reg_find((uintptr_t)p);
    int rc = -1;
    if (i >= 0 && g_reg[i].vmm) {
        *base_p = g_reg[i].base;
        *size_p = g_reg[i].size;
        *dev_p = g_reg[i].dev;
        rc = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

DBL_EXPORT int cuda_double_device_of(const void *p) {
    return dbl_mem_device(p);
}

DBL_EXPORT int cuda_double_live_vmm_handles(void) {
    pthread_mutex_lock(&g_mu);
    int n = g_live_handles;
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* ---- the driver API ------------------------------------------------------------------------- */

static const char *cu_name(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS:
        return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE:
        return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY:
        return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED:
        return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_INVALID_DEVICE:
        return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_NO_DEVICE:
        return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT:
        return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_INVALID_HANDLE:
        return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_ILLEGAL_ADDRESS:
        return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_NOT_PERMITTED:
        return "CUDA_ERROR_NOT_PERMITTED";
    case CUDA_ERROR_NOT_SUPPORTED:
        return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_UNKNOWN:
        return "CUDA_ERROR_UNKNOWN";
    default:
        return NULL;
    }
}

static CUresult cu_fail(const char *fn, CUresult r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static CUresult cu_fail(const char *fn, CUresult r, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *n = cu_name(r);
    dbl_say(fn, n ? n : "CUresult", (int)r, "%s", msg);
    return r;
}

/* Every driver call but cuInit and the error/version queries needs cuInit first
 * (https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__INITIALIZE.html: "cuInit() must be
 * called before any other function from the driver API"); the runtime calls it for us. An
 * injected failure comes before anything else. */
#define CU_ENTER(fn)                                                                               \
    do {                                                                                           \
        machine();                                                                                 \
        int inj_ = dbl_inject_take(fn);                                                            \
        if (inj_)                                                                                  \
            return cu_fail(fn, (CUresult)inj_, "injected by the test");                            \
        if (!atomic_load(&g_initialized))                                                          \
            return cu_fail(fn, CUDA_ERROR_NOT_INITIALIZED, "cuInit was not called");               \
    } while (0)

static CUresult check_dev(const char *fn, int dev) {
    if (dev < 0 || dev >= g_ndev)
        return cu_fail(fn, CUDA_ERROR_INVALID_DEVICE, "device %d of %d", dev, g_ndev);
    return CUDA_SUCCESS;
}

DBL_EXPORT CUresult cuInit(unsigned int flags) {
    machine();
    /* "Flags: Initialization flag for CUDA. Currently must be 0." (cuInit docs) */
    if (flags != 0)
        return cu_fail("cuInit", CUDA_ERROR_INVALID_VALUE, "flags %u must be 0", flags);
    if (g_ndev == 0)
        return cu_fail("cuInit", CUDA_ERROR_NO_DEVICE, "CUDA_DOUBLE_GPUS=0");
    atomic_store(&g_initialized, true);
    return CUDA_SUCCESS;
}

DBL_EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v)
        return cu_fail("cuDriverGetVersion", CUDA_ERROR_INVALID_VALUE, "NULL");
    *v = 13000;
    return CUDA_SUCCESS;
}

DBL_EXPORT CUresult cuGetErrorName(CUresult r, const char **s) {
    const char *n = cu_name(r);
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    *s = n;
    /* "CUDA_ERROR_INVALID_VALUE if error is not a valid error code" (cuGetErrorName docs) */
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

DBL_EXPORT CUresult cuGetErrorString(CUresult r, const char **s) {
    return cuGetErrorName(r, s);
}

DBL_EXPORT CUresult cuDeviceGetCount(int *n) {
    CU_ENTER("cuDeviceGetCount");
    *n = g_ndev;
    return CUDA_SUCCESS;
}

DBL_EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    CU_ENTER("cuDeviceGet");
    CUresult r = check_dev("cuDeviceGet", ordinal);
    if (r == CUDA_SUCCESS)
        *d = ordinal;
    return r;
}

/* Attributes need no context (cuDeviceGetAttribute docs list no context requirement). */
DBL_EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    CU_ENTER("cuDeviceGetAttribute");
    CUresult r = check_dev("cuDeviceGetAttribute", d);
    if (r != CUDA_SUCCESS)
        return r;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        *v = 1;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
        *v = getenv("CUDA_DOUBLE_RDMA") ? atoi(getenv("CUDA_DOUBLE_RDMA")) : 0;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
        *v = 0;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *v = 9;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *v = 0;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *v = 132;
        return CUDA_SUCCESS;
    default:
        return cu_fail("cuDeviceGetAttribute", CUDA_ERROR_INVALID_VALUE,
                       "attribute %d is not modelled by the double", (int)a);
    }
}

/* cuDeviceTotalMem is the _v2 entry point (cuda.h maps the name). No context needed. */
DBL_EXPORT CUresult cuDeviceTotalMem(size_t *bytes, CUdevice d) {
    CU_ENTER("cuDeviceTotalMem");
    CUresult r = check_dev("cuDeviceTotalMem", d);
    if (r == CUDA_SUCCESS)
        *bytes = g_mem;
    return r;
}

/* Asks, never makes: "Get the state of the primary context" (cuDevicePrimaryCtxGetState docs). */
DBL_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active) {
    CU_ENTER("cuDevicePrimaryCtxGetState");
    CUresult r = check_dev("cuDevicePrimaryCtxGetState", d);
    if (r != CUDA_SUCCESS)
        return r;
    if (!flags || !active)
        return cu_fail("cuDevicePrimaryCtxGetState", CUDA_ERROR_INVALID_VALUE, "NULL output");
    *flags = 0;
    *active = dbl_ctx_active(d);
    return CUDA_SUCCESS;
}

/* ---- VMM (https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html and the CUDA C++
 * Programming Guide, "Virtual Memory Management") ------------------------------------------- */

static CUresult check_prop(const char *fn, const CUmemAllocationProp *prop) {
    if (!prop)
        return cu_fail(fn, CUDA_ERROR_INVALID_VALUE, "prop is NULL");
    /* Pinned device memory is what these calls make on a GPU (CUmemAllocationProp docs). */
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return cu_fail(fn, CUDA_ERROR_INVALID_VALUE, "prop.type %d is not PINNED", (int)prop->type);
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return cu_fail(fn, CUDA_ERROR_INVALID_VALUE, "prop.location.type %d is not DEVICE",
                       (int)prop->location.type);
    if (prop->location.id < 0 || prop->location.id >= g_ndev)
        return cu_fail(fn, CUDA_ERROR_INVALID_DEVICE, "prop.location.id %d of %d devices",
                       prop->location.id, g_ndev);
    return CUDA_SUCCESS;
}

DBL_EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags option) {
    CU_ENTER("cuMemGetAllocationGranularity");
    CUresult r = check_prop("cuMemGetAllocationGranularity", prop);
    if (r != CUDA_SUCCESS)
        return r;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
        option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return cu_fail("cuMemGetAllocationGranularity", CUDA_ERROR_INVALID_VALUE, "option %d",
                       (int)option);
    *g = GRAN;
    return CUDA_SUCCESS;
}

/* "size must be aligned to the granularity ... CU_MEM_ALLOC_GRANULARITY_MINIMUM"; "flags: must
 * be 0" (cuMemCreate docs). Shareable POSIX-FD handles can be refused (containers without the
 * capability: CUDA_DOUBLE_NO_POSIX_FD=1 answers CUDA_ERROR_NOT_PERMITTED, as NCCL's allocator
 * expects in src/allocator.cc); fabric handles need a fabric manager (NOT_SUPPORTED here). */
DBL_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                                const CUmemAllocationProp *prop, unsigned long long flags) {
    CU_ENTER("cuMemCreate");
    CUresult r = check_prop("cuMemCreate", prop);
    if (r != CUDA_SUCCESS)
        return r;
    if (flags != 0)
        return cu_fail("cuMemCreate", CUDA_ERROR_INVALID_VALUE, "flags %llu must be 0", flags);
    if (size == 0 || size % GRAN != 0)
        return cu_fail("cuMemCreate", CUDA_ERROR_INVALID_VALUE,
                       "size %zu is not a multiple of the minimum granularity %zu", size, GRAN);
    if (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC)
        return cu_fail("cuMemCreate", CUDA_ERROR_NOT_SUPPORTED, "no fabric handles here");
    if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) &&
        getenv("CUDA_DOUBLE_NO_POSIX_FD") && atoi(getenv("CUDA_DOUBLE_NO_POSIX_FD")))
        return cu_fail("cuMemCreate", CUDA_ERROR_NOT_PERMITTED,
                       "POSIX file-descriptor handles are not permitted (CUDA_DOUBLE_NO_POSIX_FD)");
    if (prop->allocFlags.gpuDirectRDMACapable) {
        int rdma = getenv("CUDA_DOUBLE_RDMA") ? atoi(getenv("CUDA_DOUBLE_RDMA")) : 0;
        if (!rdma)
            return cu_fail("cuMemCreate", CUDA_ERROR_NOT_SUPPORTED,
                           "gpuDirectRDMACapable on a device whose "
                           "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED is 0");
    }
    int dev = prop->location.id;
    pthread_mutex_lock(&g_mu);
    if (g_used[dev] + size > g_mem) {
        size_t used = g_used[dev];
        pthread_mutex_unlock(&g_mu);
        return cu_fail("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY,
                       "device %d: %zu bytes asked, %zu of %zu in use", dev, size, used, g_mem);
    }
    g_used[dev] += size;
    pthread_mutex_unlock(&g_mu);
    vmm_handle_t *vh = calloc(1, sizeof *vh);
    char *sh = vh ? shadow_new(size) : NULL;
    if (!sh) {
        free(vh);
        pthread_mutex_lock(&g_mu);
        g_used[dev] -= size;
        pthread_mutex_unlock(&g_mu);
        return cu_fail("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, "host mmap failed");
    }
    *vh = (vmm_handle_t){VMM_MAGIC, size, dev, sh, 0, false};
    pthread_mutex_lock(&g_mu);
    g_live_handles++;
    pthread_mutex_unlock(&g_mu);
    *h = (CUmemGenericAllocationHandle)(uintptr_t)vh;
    return CUDA_SUCCESS;
}

/* Frees the physical memory once it is released and no longer mapped (g_mu): "Any backing
 * memory allocations will be freed if there are no existing mappings and there are no
 * unreleased memory handles" (cuMemUnmap docs). */
static void handle_maybe_free(vmm_handle_t *vh) {
    if (!vh->released || vh->maps > 0)
        return;
    g_used[vh->dev] -= vh->size;
    munmap(vh->shadow, vh->size);
    vh->magic = 0;
    g_live_handles--;
    free(vh);
}

static vmm_handle_t *handle_of(CUmemGenericAllocationHandle h) {
    vmm_handle_t *vh = (vmm_handle_t *)(uintptr_t)h;
    /* Handles are only ever ours; a stale one has its magic cleared before it is freed, and we
     * never unmap the struct's memory, so reading the magic of a stale handle is a best effort
     * (a double cannot know every foreign pointer). */
    return vh && vh->magic == VMM_MAGIC && !vh->released ? vh : NULL;
}

DBL_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    CU_ENTER("cuMemRelease");
    pthread_mutex_lock(&g_mu);
    vmm_handle_t *vh = handle_of(h);
    if (!vh) {
        pthread_mutex_unlock(&g_mu);
        return cu_fail("cuMemRelease", CUDA_ERROR_INVALID_VALUE,
                       "%#llx is not a live allocation handle (released twice?)",
                       (unsigned long long)h);
    }
    vh->released = true;
    handle_maybe_free(vh);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* "size: Size of the reserved virtual address range requested"; "alignment: Alignment of the
 * reserved virtual address range requested" (power of two or 0); "flags: currently unused, must
 * be zero"; the Programming Guide: the size is a multiple of the granularity. */
DBL_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                        CUdeviceptr addr, unsigned long long flags) {
    CU_ENTER("cuMemAddressReserve");
    (void)addr; /* a hint */
    if (flags != 0)
        return cu_fail("cuMemAddressReserve", CUDA_ERROR_INVALID_VALUE, "flags %llu", flags);
    if (size == 0 || size % GRAN != 0)
        return cu_fail("cuMemAddressReserve", CUDA_ERROR_INVALID_VALUE,
                       "size %zu is not a multiple of the granularity %zu", size, GRAN);
    if (alignment & (alignment - 1))
        return cu_fail("cuMemAddressReserve", CUDA_ERROR_INVALID_VALUE,
                       "alignment %zu is not a power of two", alignment);
    void *va = reserve_va(size, alignment > GRAN ? alignment : GRAN);
    if (!va)
        return cu_fail("cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY, "no address space: %s",
                       strerror(errno));
    pthread_mutex_lock(&g_mu);
    if (g_nresv == g_capresv) {
        size_t nc = g_capresv ? g_capresv * 2 : 64;
        resv_t *n = realloc(g_resv, nc * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&g_mu);
            munmap(va, size);
            return cu_fail("cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY, "host memory");
        }
        g_resv = n;
        g_capresv = nc;
    }
    g_resv[g_nresv++] = (resv_t){(uintptr_t)va, size};
    pthread_mutex_unlock(&g_mu);
    *ptr = (CUdeviceptr)(uintptr_t)va;
    return CUDA_SUCCESS;
}

/* "The size must match what was given to memAddressReserve"; the Programming Guide's order is
 * unmap, release, then free the address range: a range with live mappings is refused. */
DBL_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    CU_ENTER("cuMemAddressFree");
    pthread_mutex_lock(&g_mu);
    long i = resv_find((uintptr_t)ptr);
    if (i < 0 || g_resv[i].base != (uintptr_t)ptr || g_resv[i].size != size) {
        pthread_mutex_unlock(&g_mu);
        return cu_fail("cuMemAddressFree", CUDA_ERROR_INVALID_VALUE,
                       "(%#llx, %zu) is not a reservation as cuMemAddressReserve made it",
                       (unsigned long long)ptr, size);
    }
    for (size_t k = 0; k < g_nreg; k++)
        if (g_reg[k].vmm && g_reg[k].base >= (uintptr_t)ptr &&
            g_reg[k].base < (uintptr_t)ptr + size) {
            pthread_mutex_unlock(&g_mu);
            return cu_fail("cuMemAddressFree", CUDA_ERROR_INVALID_VALUE,
                           "(%#llx, %zu) still has a mapping at %#lx: cuMemUnmap it first",
                           (unsigned long long)ptr, size, (unsigned long)g_reg[k].base);
        }
    g_resv[i] = g_resv[--g_nresv];
    pthread_mutex_unlock(&g_mu);
    munmap((void *)(uintptr_t)ptr, size);
    return CUDA_SUCCESS;
}

/* "offset: ... Currently must be zero"; "flags: ... must be zero"; ptr and size aligned to the
 * granularity; the range inside one reservation and not mapped already (cuMemMap docs). */
DBL_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                             CUmemGenericAllocationHandle h, unsigned long long flags) {
    CU_ENTER("cuMemMap");
    if (offset != 0 || flags != 0)
        return cu_fail("cuMemMap", CUDA_ERROR_INVALID_VALUE, "offset %zu and flags %llu must be 0",
                       offset, flags);
    uintptr_t a = (uintptr_t)ptr;
    if (size == 0 || a % GRAN != 0 || size % GRAN != 0)
        return cu_fail("cuMemMap", CUDA_ERROR_INVALID_VALUE,
                       "(%#lx, %zu) is not aligned to the granularity %zu", (unsigned long)a, size,
                       GRAN);
    pthread_mutex_lock(&g_mu);
    vmm_handle_t *vh = handle_of(h);
    CUresult r = CUDA_SUCCESS;
    long ri = resv_find(a);
    if (!vh)
        r = cu_fail("cuMemMap", CUDA_ERROR_INVALID_HANDLE, "%#llx is not a live allocation handle",
                    (unsigned long long)h);
    else if (size > vh->size)
        r = cu_fail("cuMemMap", CUDA_ERROR_INVALID_VALUE, "size %zu exceeds the allocation's %zu",
                    size, vh->size);
    else if (ri < 0 || a + size > g_resv[ri].base + g_resv[ri].size)
        r = cu_fail("cuMemMap", CUDA_ERROR_INVALID_VALUE,
                    "(%#lx, %zu) is not inside one cuMemAddressReserve range", (unsigned long)a,
                    size);
    else {
        for (size_t k = 0; k < g_nreg && r == CUDA_SUCCESS; k++)
            if (g_reg[k].base < a + size && a < g_reg[k].base + g_reg[k].size)
                r = cu_fail("cuMemMap", CUDA_ERROR_INVALID_VALUE,
                            "(%#lx, %zu) overlaps a live mapping at %#lx", (unsigned long)a, size,
                            (unsigned long)g_reg[k].base);
    }
    if (r == CUDA_SUCCESS) {
        if (!reg_insert((region_t){a, size, vh->shadow, vh->dev, true, false, vh, 0}))
            r = cu_fail("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY, "host memory");
        else
            vh->maps++;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* "The range must be the entire contiguous address range that was mapped to. In other words,
 * cuMemUnmap cannot unmap a sub-range of an address range mapped by cuMemCreate / cuMemMap"
 * (cuMemUnmap docs). Whole adjacent mappings may go in one call. */
DBL_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CU_ENTER("cuMemUnmap");
    uintptr_t a = (uintptr_t)ptr, end = a + size;
    pthread_mutex_lock(&g_mu);
    long i = reg_find(a);
    CUresult r = CUDA_SUCCESS;
    size_t first = (size_t)i, n = 0;
    if (i < 0 || !g_reg[i].vmm || g_reg[i].base != a || size == 0) {
        r = cu_fail("cuMemUnmap", CUDA_ERROR_INVALID_VALUE, "(%#lx, %zu) does not start a mapping",
                    (unsigned long)a, size);
    } else {
        uintptr_t at = a;
        for (size_t k = first; k < g_nreg && at < end; k++, n++) {
            if (g_reg[k].base != at || !g_reg[k].vmm || g_reg[k].base + g_reg[k].size > end) {
                r = cu_fail("cuMemUnmap", CUDA_ERROR_INVALID_VALUE,
                            "(%#lx, %zu) is not a union of whole mappings (sub-range at %#lx)",
                            (unsigned long)a, size, (unsigned long)at);
                break;
            }
            at += g_reg[k].size;
        }
        if (r == CUDA_SUCCESS && at != end)
            r = cu_fail("cuMemUnmap", CUDA_ERROR_INVALID_VALUE,
                        "(%#lx, %zu) runs past the mapped range", (unsigned long)a, size);
    }
    if (r == CUDA_SUCCESS) {
        for (size_t k = 0; k < n; k++) {
            vmm_handle_t *vh = g_reg[first].h;
            reg_remove(first);
            vh->maps--;
            handle_maybe_free(vh);
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* "Set the access flags for each location specified in desc for the given virtual address range.
 * Any new mapping to this virtual address will need to have access granted through
 * cuMemSetAccess, as all mappings start with no accessibility setup" (cuMemSetAccess docs); the
 * range must be mapped. */
DBL_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                   size_t count) {
    CU_ENTER("cuMemSetAccess");
    if (!desc || count == 0)
        return cu_fail("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE, "no descriptors");
    bool rw = false;
    for (size_t k = 0; k < count; k++) {
        if (desc[k].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[k].location.id < 0 ||
            desc[k].location.id >= g_ndev)
            return cu_fail("cuMemSetAccess", CUDA_ERROR_INVALID_DEVICE,
                           "descriptor %zu names location type %d id %d", k,
                           (int)desc[k].location.type, desc[k].location.id);
        if (desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            rw = true;
    }
    uintptr_t a = (uintptr_t)ptr, end = a + size;
    pthread_mutex_lock(&g_mu);
    long i = reg_find(a);
    CUresult r = CUDA_SUCCESS;
    if (i < 0 || !g_reg[i].vmm || size == 0) {
        r = cu_fail("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE, "(%#lx, %zu) is not mapped",
                    (unsigned long)a, size);
    } else {
        uintptr_t at = a;
        for (size_t k = (size_t)i; k < g_nreg && at < end; k++) {
            if (g_reg[k].base > at || !g_reg[k].vmm) {
                r = cu_fail("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE,
                            "(%#lx, %zu): %#lx is not mapped", (unsigned long)a, size,
                            (unsigned long)at);
                break;
            }
            if (g_reg[k].base < a || g_reg[k].base + g_reg[k].size > end) {
                r = cu_fail("cuMemSetAccess", CUDA_ERROR_NOT_SUPPORTED,
                            "(%#lx, %zu) covers part of a mapping (not modelled by the double)",
                            (unsigned long)a, size);
                break;
            }
            at = g_reg[k].base + g_reg[k].size;
        }
        if (r == CUDA_SUCCESS && at < end)
            r = cu_fail("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE,
                        "(%#lx, %zu): %#lx is not mapped", (unsigned long)a, size,
                        (unsigned long)at);
        for (size_t k = (size_t)i; r == CUDA_SUCCESS && k < g_nreg && g_reg[k].base < end; k++)
            g_reg[k].access = rw;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* cuMemGetAddressRange: the mapping (physical allocation) containing ptr, as NCCL's window
 * registration asks it. */
DBL_EXPORT CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
    CU_ENTER("cuMemGetAddressRange");
    pthread_mutex_lock(&g_mu);
    long i = reg_find((uintptr_t)ptr);
    if (i >= 0) {
        if (base)
            *base = g_reg[i].base;
        if (size)
            *size = g_reg[i].size;
    }
    pthread_mutex_unlock(&g_mu);
    if (i < 0)
        return cu_fail("cuMemGetAddressRange", CUDA_ERROR_NOT_FOUND, "%#llx is not device memory",
                       (unsigned long long)ptr);
    return CUDA_SUCCESS;
}

/* The entry points cudaGetDriverEntryPointByVersion hands out (runtime.c). */
DBL_EXPORT void *dbl_driver_entry(const char *name) {
    static const struct {
        const char *name;
        void *fn;
    } tab[] = {
        {"cuInit", (void *)cuInit},
        {"cuDriverGetVersion", (void *)cuDriverGetVersion},
        {"cuGetErrorName", (void *)cuGetErrorName},
        {"cuGetErrorString", (void *)cuGetErrorString},
        {"cuDeviceGetCount", (void *)cuDeviceGetCount},
        {"cuDeviceGet", (void *)cuDeviceGet},
        {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
        {"cuDeviceTotalMem", (void *)cuDeviceTotalMem},
        {"cuDevicePrimaryCtxGetState", (void *)cuDevicePrimaryCtxGetState},
        {"cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity},
        {"cuMemCreate", (void *)cuMemCreate},
        {"cuMemRelease", (void *)cuMemRelease},
        {"cuMemAddressReserve", (void *)cuMemAddressReserve},
        {"cuMemAddressFree", (void *)cuMemAddressFree},
        {"cuMemMap", (void *)cuMemMap},
        {"cuMemUnmap", (void *)cuMemUnmap},
        {"cuMemSetAccess", (void *)cuMemSetAccess},
        {"cuMemGetAddressRange", (void *)cuMemGetAddressRange},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcmp(tab[i].name, name) == 0)
            return tab[i].fn;
    return NULL;
}
