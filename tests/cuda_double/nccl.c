/*
 * nccl.c: the test double of libnccl.so.2 (NCCL 2.28.9's API, as nccl.h at /usr/local/cuda
 * declares it), for the functions sympool calls. A test tool, never installed.
 *
 * Transport: a communicator is a POSIX shared-memory segment named after the unique id's bytes
 * ("/cudadbl-<hex>"), joined by every rank of the communicator's init on this machine; ranks meet
 * in a futex barrier in the segment, and a collective moves data through per-rank slots of it,
 * chunk by chunk, each rank reading device memory through the doubles' own copies (dbl_copy). The
 * collectives run when called (NCCL would enqueue them): every rank must call the same
 * collectives in the same order, which sympool does (it never groups calls). A rank that
 * disagrees (another collective, count, type or op) fails every rank with ncclInvalidUsage; a
 * peer that never comes fails after CUDA_DOUBLE_NCCL_TIMEOUT seconds (default 120) with
 * ncclSystemError; an aborted peer fails the others with ncclRemoteError. Where NCCL would hang
 * or corrupt memory, the double says so and fails.
 *
 * Nodes: a rank's node is NCCL 2.28.9's host hash (src/misc/utils.cc getHostHash: the host name
 * followed by /proc/sys/kernel/random/boot_id, or NCCL_HOSTID alone when set), so ranks in
 * different UTS namespaces (tests/multinode/mn-run.sh) are on different nodes, as NCCL sees them.
 * The duplicate-GPU rule holds per node, and the symmetric kernels are counted by 2.28.9's rule,
 * which has them within one node only. The segment itself is shared memory of this machine
 * however many nodes the ranks are on: the data path stands in for NCCL's network transport.
 *
 * Windows: windows pair by registration order, and each rank keeps its own model of NCCL's big
 * VA space (each allocation with a window placed at the lowest free offset, at the VMM
 * granularity, and freed with its last window), so a symmetric collective whose buffers lie at
 * different places of that space on different ranks fails with ncclInvalidArgument, as 2.30's
 * NCCL_CHECK_MODE=DEBUG_GLOBAL fails it (NVLS's multimem kernels would reach the wrong memory).
 *
 * Nonblocking communicators (ncclConfig_t.blocking = 0): ncclCommInitRankConfig and a split of
 * a nonblocking parent run their set-up on a thread of their own and return ncclInProgress, the
 * outcome coming through ncclCommGetAsyncError; ncclCommAbort stops and joins a set-up under
 * way. Nothing else runs on a nonblocking communicator here (collectives and windows would return
 * ncclInProgress in NCCL): the double refuses them, saying so. A split makes one child of the
 * parent's ranks in their order (sympool's use), on a segment of its own.
 *
 * Every failure returns NCCL's code, says why on stderr and keeps the text for ncclGetLastError.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dbl.h"

#define MAX_RANKS 64
#define SLOT ((size_t)1 << 20) /* bytes per rank per chunk */
#define COMM_MAGIC 0x6e63636c636f6d6dULL
#define WIN_MAGIC 0x6e63636c77696e64ULL
#define CONFIG_MAGIC 0xcafebeefu /* NCCL_CONFIG_INITIALIZER's (NCCL_API_MAGIC, src/nccl.h.in) */

typedef struct shm_hdr {
    _Atomic uint32_t arrive; /* ranks in the current barrier */
    _Atomic uint32_t gen;    /* barrier generation (the futex word) */
    _Atomic uint32_t aborted;
    _Atomic uint32_t joined;
    int nranks;
    int dev[MAX_RANKS];
    uint64_t host[MAX_RANKS];   /* each rank's host hash */
    int64_t arg[MAX_RANKS][10]; /* each rank's arguments of the current call, compared */
    char data[];                /* nranks slots of SLOT bytes */
} shm_hdr_t;

/* NCCL 2.28.9's record of a physical allocation some window of a communicator lies in
 * (struct ncclDevrMemory, src/dev_runtime.cc symMemoryObtain, :360-386): one per allocation
 * (found again by its cuMem handle; here by its base), with a place in the communicator's big VA
 * space carved on this rank alone, and dropped with its last window (symMemoryDropRef). */
typedef struct bigmem {
    uintptr_t base; /* the allocation (cuMemGetAddressRange) */
    int64_t off;    /* its bigOffset */
    int64_t size;   /* its bytes: what the space holds for it */
    int refs;       /* windows on it */
    struct bigmem *next;
} bigmem_t;

typedef struct ncclWindow_vidmem win_t;
struct ncclWindow_vidmem {
    uint64_t magic;
    struct ncclComm *comm;
    uintptr_t buff;
    size_t size;
    int flags;
    int64_t seq;   /* the comm's registrations before it: the same window on every rank (2.28.9
                    * pairs windows by registration order, src/dev_runtime.cc) */
    int64_t big;   /* its bigOffset in the comm's big VA space, -1 without symmetric support */
    bigmem_t *mem; /* the allocation it lies in, NULL without symmetric support (g_mu) */
    win_t *next;
};

struct ncclComm {
    uint64_t magic;
    int rank, nranks, dev;
    shm_hdr_t *shm;
    size_t shm_size;
    int nnodes;             /* distinct host hashes among the ranks */
    bool symmetric_support; /* 2.28.9's comm->symmetricSupport */
    void *own_mem;          /* the communicator's own device memory (CUDA_DOUBLE_NCCL_MEMORY) */
    int64_t wins_made;      /* windows registered so far (win_t.seq) */
    bigmem_t *mems;         /* the allocations its windows lie in (g_mu) */
    ncclUniqueId id;        /* what it was made from: its split children's ids derive from it */
    int children;           /* its ncclCommSplit calls so far (2.28.9's splitCount) */
    int blocking;           /* its config.blocking, fixed at creation (see comm_setup) */
    _Atomic int state;      /* comm->asyncResult: what ncclCommGetAsyncError says */
    _Atomic int abort_flag; /* set by ncclCommAbort: a job still running on it gives up */
    struct ncclComm *pending_child; /* a split under way on it (g_mu) */
    pthread_t job;                  /* the thread of its last nonblocking job */
    bool has_job;                   /* job not joined yet */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_last[512]; /* ncclGetLastError: process-wide, as NCCL's */

static const char *res_name(ncclResult_t r) {
    switch (r) {
    case ncclSuccess:
        return "ncclSuccess";
    case ncclUnhandledCudaError:
        return "ncclUnhandledCudaError";
    case ncclSystemError:
        return "ncclSystemError";
    case ncclInternalError:
        return "ncclInternalError";
    case ncclInvalidArgument:
        return "ncclInvalidArgument";
    case ncclInvalidUsage:
        return "ncclInvalidUsage";
    case ncclRemoteError:
        return "ncclRemoteError";
    case ncclInProgress:
        return "ncclInProgress";
    default:
        return "ncclResult?";
    }
}

static ncclResult_t fail(const char *fn, ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ncclResult_t fail(const char *fn, ncclResult_t r, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_mu);
    snprintf(g_last, sizeof g_last, "%s", msg);
    pthread_mutex_unlock(&g_mu);
    dbl_say(fn, res_name(r), (int)r, "%s", msg);
    return r;
}

static void (*_Atomic g_at_enter)(const char *fn); /* cuda_double_nccl_at_enter */

/* Test hook: `hook` runs at the entry of every NCCL call made after it is set (NULL: none). */
DBL_EXPORT void cuda_double_nccl_at_enter(void (*hook)(const char *fn)) {
    g_at_enter = hook;
}

#define ENTER(fn)                                                                                  \
    do {                                                                                           \
        void (*at_)(const char *) = g_at_enter;                                                    \
        if (at_)                                                                                   \
            at_(fn);                                                                               \
        int inj_ = dbl_inject_take(fn);                                                            \
        if (inj_)                                                                                  \
            return fail(fn, (ncclResult_t)inj_, "injected by the test");                           \
    } while (0)

/* NCCL's texts (src/init.cc, ncclGetErrorString, 2.28). */
const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm; /* NCCL 2.28 keeps one process-wide text */
    return g_last;
}

ncclResult_t ncclGetVersion(int *v) {
    if (!v)
        return fail("ncclGetVersion", ncclInvalidArgument, "version is NULL");
    const char *e = getenv("CUDA_DOUBLE_NCCL_VERSION");
    *v = e && *e ? atoi(e) : NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    ENTER("ncclGetUniqueId");
    if (!id)
        return fail("ncclGetUniqueId", ncclInvalidArgument, "uniqueId is NULL");
    memset(id, 0, sizeof *id);
    if (getrandom(id->internal, 16, 0) != 16)
        return fail("ncclGetUniqueId", ncclSystemError, "getrandom: %s", strerror(errno));
    return ncclSuccess;
}

/* ---- the shared segment ---------------------------------------------------------------------- */

static double timeout_s(void) {
    const char *e = getenv("CUDA_DOUBLE_NCCL_TIMEOUT");
    return e && *e ? atof(e) : 120.0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Every rank of the communicator here, or an error on every waiting rank. */
static ncclResult_t barrier(struct ncclComm *c, const char *fn) {
    shm_hdr_t *h = c->shm;
    if (atomic_load(&c->abort_flag)) /* aborted: it arrives nowhere any more */
        return fail(fn, ncclInternalError, "rank %d: aborted by ncclCommAbort", c->rank);
    uint32_t g = atomic_load(&h->gen);
    if (atomic_fetch_add(&h->arrive, 1) == (uint32_t)c->nranks - 1) {
        atomic_store(&h->arrive, 0);
        atomic_fetch_add(&h->gen, 1);
        syscall(SYS_futex, &h->gen, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
        return ncclSuccess;
    }
    double end = now_s() + timeout_s();
    while (atomic_load(&h->gen) == g) {
        /* ncclCommAbort on this rank while a job of it waits (2.28.9 src/init.cc:2513-2519 sets
         * the abort flags, which the job's waits poll, then joins it). */
        if (atomic_load(&c->abort_flag))
            return fail(fn, ncclInternalError, "rank %d: aborted by ncclCommAbort", c->rank);
        if (atomic_load(&h->aborted))
            return fail(fn, ncclRemoteError, "rank %d: a peer aborted the communicator", c->rank);
        if (now_s() > end)
            return fail(fn, ncclSystemError,
                        "rank %d: peers did not arrive within %.0f s (NCCL would hang here)",
                        c->rank, timeout_s());
        struct timespec ts = {0, 50 * 1000 * 1000};
        syscall(SYS_futex, &h->gen, FUTEX_WAIT, g, &ts, NULL, 0);
    }
    return ncclSuccess;
}

static void shm_name(const ncclUniqueId *id, char *buf, size_t len) {
    int n = snprintf(buf, len, "/cudadbl-");
    for (int i = 0; i < 18 && (size_t)n + 2 < len; i++) /* 16 random bytes, 2 of a split's */
        n += snprintf(buf + n, len - (size_t)n, "%02x", (unsigned char)id->internal[i]);
}

/* NCCL 2.28.9's getHostHash (src/misc/utils.cc): DJB2 over the host name followed by the boot
 * id; NCCL_HOSTID, when set, replaces the whole string. */
static uint64_t host_hash(void) {
    char s[1024];
    if (gethostname(s, sizeof s) != 0)
        snprintf(s, sizeof s, "unknown");
    s[sizeof s - 1] = '\0';
    const char *id = getenv("NCCL_HOSTID");
    if (id) {
        snprintf(s, sizeof s, "%s", id);
    } else {
        FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
        char boot[128];
        if (f && fscanf(f, "%127s", boot) == 1) {
            size_t n = strlen(s);
            snprintf(s + n, sizeof s - n, "%s", boot);
        }
        if (f)
            fclose(f);
    }
    uint64_t h = 5381;
    for (const char *p = s; *p; p++)
        h = (h << 5) + h + (uint64_t)(unsigned char)*p;
    return h;
}

/* An NCCL integer parameter as 2.28.9 reads it (src/misc/param.cc:76-94 ncclLoadParam): unset or
 * empty is the default; anything else is strtoll's value in base 0 ("false" is 0), and only an
 * out-of-range number falls back to the default. */
static long long nccl_param(const char *name, long long dflt) {
    const char *e = getenv(name);
    if (!e || !*e)
        return dflt;
    errno = 0;
    long long v = strtoll(e, NULL, 0);
    return errno ? dflt : v;
}

/* The device memory a communicator takes for itself: NCCL allocates its channels' buffers, FIFOs
 * and proxy state on the device at ncclCommInitRank (hundreds of MiB on a real node, growing with
 * the peers), memory no allocator above it reserved. CUDA_DOUBLE_NCCL_MEMORY (bytes, K/M/G
 * suffixes; default 0) models it, taken with the doubles' cudaMalloc and freed with the
 * communicator. */
static size_t comm_memory(void) {
    const char *e = getenv("CUDA_DOUBLE_NCCL_MEMORY");
    if (!e || !*e)
        return 0;
    char *end = NULL;
    unsigned long long v = strtoull(e, &end, 10);
    int shift = 0;
    switch (end && *end ? *end : 0) {
    case 'K':
    case 'k':
        shift = 10;
        break;
    case 'M':
    case 'm':
        shift = 20;
        break;
    case 'G':
    case 'g':
        shift = 30;
        break;
    default:
        break;
    }
    return (size_t)v << shift;
}

static atomic_long g_symk_calls; /* collectives 2.28.9 would run as symmetric kernels */

static void release_own(struct ncclComm *c) {
    int dev = 0;
    if (c->own_mem)
        (void)dbl_mem_free(c->own_mem, &dev);
    c->own_mem = NULL;
}

static bool comm_ok(ncclComm_t c) {
    return c && c->magic == COMM_MAGIC;
}

/* The communicator's set-up on every rank (NCCL's ncclCommInitRankFunc): run by the caller of a
 * blocking init, on a thread of its own for a nonblocking one, and by a split's job. c holds its
 * rank, size, device and id; on failure nothing of the segment stays with it. */
static ncclResult_t init_body(struct ncclComm *c, const char *fn) {
    const int rank = c->rank, nranks = c->nranks, dev = c->dev;
    char name[64];
    shm_name(&c->id, name, sizeof name);
    size_t size = sizeof(shm_hdr_t) + (size_t)nranks * SLOT;
    int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    if (fd < 0)
        return fail(fn, ncclSystemError, "shm_open(%s): %s", name, strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return fail(fn, ncclSystemError, "ftruncate: %s", strerror(errno));
    }
    shm_hdr_t *h = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (h == MAP_FAILED)
        return fail(fn, ncclSystemError, "mmap: %s", strerror(errno));
    c->shm = h;
    c->shm_size = size;
    size_t own = comm_memory();
    bool own_ok = own == 0 || dbl_mem_alloc(dev, own, &c->own_mem) == 0;
    h->dev[rank] =
        dbl_physical(dev); /* the GPU itself: ordinals differ under CUDA_VISIBLE_DEVICES */
    h->host[rank] = host_hash();
    h->arg[rank][0] = own_ok ? nranks : -1; /* -1: this rank could not take its memory */
    atomic_fetch_add(&h->joined, 1);
    ncclResult_t r = barrier(c, fn);
    if (rank == 0)
        shm_unlink(name); /* every rank has it mapped now (or never comes) */
    if (r != ncclSuccess) {
        release_own(c);
        munmap(h, size);
        c->shm = NULL;
        return r;
    }
    for (int i = 0; i < nranks && r == ncclSuccess; i++)
        if (h->arg[i][0] == -1)
            r = fail(fn, i == rank ? ncclUnhandledCudaError : ncclRemoteError,
                     "rank %d could not allocate the communicator's %zu bytes of device memory", i,
                     own);
    for (int i = 0; i < nranks && r == ncclSuccess; i++)
        if (h->arg[i][0] != nranks) {
            r = fail(fn, ncclInvalidUsage, "rank %d says %lld ranks, rank %d says %d", i,
                     (long long)h->arg[i][0], rank, nranks);
            break;
        }
    /* NCCL refuses two ranks of one communicator on one GPU of one host (2.28.9 src/init.cc:
     * equal hostHash and busId, "Duplicate GPU detected : rank %d and rank %d both on CUDA device
     * %lx", ncclInvalidUsage); device 0 of two nodes are two GPUs. */
    for (int i = 0; i < nranks && r == ncclSuccess; i++)
        for (int j = i + 1; j < nranks && r == ncclSuccess; j++)
            if (h->host[i] == h->host[j] && h->dev[i] == h->dev[j])
                r = fail(fn, ncclInvalidUsage,
                         "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", i,
                         j, h->dev[i]);
    /* nNodes counts distinct host hashes. symmetricSupport is isAllCudaP2p (CUDA P2P between
     * every pair of this node's GPUs, by their bus ids, whichever this process sees: 2.28.9
     * src/transport.cc ncclTransportCheckP2pType over the node's ranks, src/transport/p2p.cc
     * p2pCanConnect, which asks cudaDeviceCanAccessPeer for devices visible here and goes by the
     * topology for the others; the double's topology is CUDA_DOUBLE_NO_P2P) && NCCL_WIN_ENABLE &&
     * cuMem (src/init.cc:1376): NCCL_WIN_ENABLE defaults to 1, off at 0 (src/init.cc:58);
     * ncclCuMemEnable is on at a positive NCCL_CUMEM_ENABLE and at -2, the default, auto (cuMem
     * works here), off at 0 and any other negative value (src/misc/cudawrap.cc:15, :45-49). */
    int nnodes = 0;
    for (int i = 0; i < nranks; i++) {
        bool seen = false;
        for (int j = 0; j < i && !seen; j++)
            seen = h->host[j] == h->host[i];
        nnodes += !seen;
    }
    c->nnodes = nnodes;
    bool all_p2p = true;
    for (int i = 0; i < nranks; i++)
        for (int j = i + 1; j < nranks; j++)
            if (h->host[i] == h->host[j] && h->dev[i] != h->dev[j] &&
                !dbl_p2p(h->dev[i], h->dev[j]))
                all_p2p = false;
    long long cumem = nccl_param("NCCL_CUMEM_ENABLE", -2);
    c->symmetric_support =
        all_p2p && nccl_param("NCCL_WIN_ENABLE", 1) != 0 && (cumem > 0 || cumem == -2);
    ncclResult_t r2 = barrier(c, fn); /* nobody reuses arg[] before all checked */
    if (r == ncclSuccess)
        r = r2;
    if (r != ncclSuccess) {
        release_own(c);
        munmap(h, size);
        c->shm = NULL;
    }
    return r;
}

/* A thread's job (NCCL's ncclAsyncJob) on a nonblocking communicator. */
typedef struct {
    struct ncclComm *c;     /* the communicator whose state says the job's outcome */
    struct ncclComm *child; /* a split's new communicator, NULL for an init */
    ncclComm_t *out;        /* a split's newcomm */
    int color, key;
} job_t;

static ncclResult_t split_body(job_t *j);

static void *job_main(void *arg) {
    job_t *j = arg;
    ncclResult_t r = j->child ? split_body(j) : init_body(j->c, "ncclCommInitRankConfig");
    /* The job's result becomes the communicator's state at its end (2.28.9 src/group.cc:608-612
     * and :628-630, ncclCommSetAsyncError; read with acquire by ncclCommGetAsyncError,
     * src/init.cc:2710). */
    atomic_store_explicit(&j->c->state, (int)r, memory_order_release);
    free(j);
    return NULL;
}

/* The previous job on c has ended (its state is no longer ncclInProgress): joined here. */
static void join_job(struct ncclComm *c) {
    if (c->has_job) {
        pthread_join(c->job, NULL);
        c->has_job = false;
    }
}

/* Run j: where the communicator the job is launched on is nonblocking and the call groups its job
 * (in_group), on a thread of its own, with that communicator's state ncclInProgress until the job
 * ends, returning ncclInProgress (2.28.9 src/group.cc:706-738: a nonblocking group sets
 * ncclInProgress on its communicators, starts ncclAsyncJobMain on a thread and returns
 * ncclInProgress); otherwise in the caller (a job launched outside any group runs at once:
 * src/group.cc:37-40). */
static ncclResult_t launch(const char *fn, job_t *j, bool in_group) {
    struct ncclComm *c = j->c;
    if (c->blocking || !in_group) {
        ncclResult_t r = j->child ? split_body(j) : init_body(c, fn);
        free(j);
        return r;
    }
    join_job(c);
    atomic_store(&c->state, (int)ncclInProgress);
    int e = pthread_create(&c->job, NULL, job_main, j);
    if (e != 0) {
        atomic_store(&c->state, (int)ncclSystemError);
        free(j);
        return fail(fn, ncclSystemError, "pthread_create: %s", strerror(e));
    }
    c->has_job = true;
    return ncclInProgress;
}

/* A config's blocking as 2.28.9 reads it (src/init.cc parseCommConfig): a config not made with
 * NCCL_CONFIG_INITIALIZER is ncclInvalidArgument (:1818-1822), blocking other than 0, 1 or
 * unset too (:1853-1857), unset is 1 (:1919); NCCL_COMM_BLOCKING of 0 or 1 overrides it for
 * every communicator, a split's child too (envConfigOverride, :1647-1649, called from :1950
 * and from copyCommConfig, :1800). -1: refused. */
static int config_blocking(const char *fn, const ncclConfig_t *cfg, int dflt) {
    int b = dflt;
    if (cfg) {
        if (cfg->magic != CONFIG_MAGIC) {
            fail(fn, ncclInvalidArgument,
                 "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
            return -1;
        }
        if (cfg->blocking != NCCL_CONFIG_UNDEF_INT && cfg->blocking != 0 && cfg->blocking != 1) {
            fail(fn, ncclInvalidArgument, "Invalid config blocking attribute value %d",
                 cfg->blocking);
            return -1;
        }
        b = cfg->blocking == NCCL_CONFIG_UNDEF_INT ? 1 : cfg->blocking;
    }
    long long env = nccl_param("NCCL_COMM_BLOCKING", NCCL_CONFIG_UNDEF_INT);
    return env == 0 || env == 1 ? (int)env : b;
}

/* ncclCommInitRank and ncclCommInitRankConfig (2.28.9 src/init.cc ncclCommInitRankDev). Only
 * ncclCommInitRankConfig opens a group around it (src/init.cc:2149, :2162): ncclCommInitRank's
 * init runs in the caller whatever its blocking. */
static ncclResult_t comm_init(const char *fn, ncclComm_t *out, int nranks, ncclUniqueId id,
                              int rank, int blocking, bool in_group) {
    if (!out)
        return fail(fn, ncclInvalidArgument, "comm is NULL");
    *out = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return fail(fn, ncclInvalidArgument, "rank %d of %d (the double: at most %d)", rank, nranks,
                    MAX_RANKS);
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) /* the caller's device (src/init.cc:2152) */
        return fail(fn, ncclUnhandledCudaError, "cudaGetDevice failed");
    dbl_ctx_make(dev); /* NCCL works in the current device's primary context */
    struct ncclComm *c = calloc(1, sizeof *c);
    job_t *j = calloc(1, sizeof *j);
    if (!c || !j) {
        free(c);
        free(j);
        return fail(fn, ncclSystemError, "host memory");
    }
    c->magic = COMM_MAGIC;
    c->rank = rank;
    c->nranks = nranks;
    c->dev = dev;
    c->id = id;
    c->blocking = blocking;
    j->c = c;
    ncclResult_t r = launch(fn, j, in_group);
    if (r == ncclSuccess || r == ncclInProgress) {
        /* A nonblocking init hands the communicator out at once, still in progress
         * (src/init.cc:2000-2001, before the job runs). */
        *out = c;
        return r;
    }
    /* Failed with no job left running: it is freed and *newcomm stays NULL (an early failure,
     * src/init.cc:2032-2040, and the double's blocking init). */
    c->magic = 0;
    free(c);
    return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    ENTER("ncclCommInitRank");
    /* The default config (src/init.cc ncclCommInitRank): blocking, unless NCCL_COMM_BLOCKING. */
    int blocking = config_blocking("ncclCommInitRank", NULL, 1);
    return comm_init("ncclCommInitRank", out, nranks, id, rank, blocking, false);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
    ENTER("ncclCommInitRankConfig");
    if (out)
        *out = NULL;
    int blocking = config_blocking("ncclCommInitRankConfig", config, 1); /* NULL: default */
    if (blocking < 0)
        return ncclInvalidArgument;
    return comm_init("ncclCommInitRankConfig", out, nranks, id, rank, blocking, true);
}

/* 2.28.9 src/init.cc:2706-2711: the communicator's asyncResult. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r) {
    if (!comm_ok(c))
        return fail("ncclCommGetAsyncError", ncclInvalidArgument, "not a live communicator");
    if (!r)
        return fail("ncclCommGetAsyncError", ncclInvalidArgument, "asyncError is NULL");
    *r = (ncclResult_t)atomic_load_explicit(&c->state, memory_order_acquire);
    return ncclSuccess;
}

/* A communicator in use by another call is refused (2.28.9 src/init.cc:373-390
 * ncclCommEnsureReady, which collectives (src/enqueue.cc:2637), window registrations
 * (src/dev_runtime.cc:904), ncclCommDestroy (:2381) and ncclCommSplit (:2568) call): a previous
 * nonblocking call still in progress is ncclInvalidArgument, a failed one its error. The double
 * runs nothing on a nonblocking communicator but splits and its own end: NCCL would run every
 * such call on a thread of its own and return ncclInProgress (src/group.cc:706-738; a
 * collective: src/enqueue.cc:2658), which sympool, whose world communicator is blocking,
 * never waits for. */
static ncclResult_t ready(const char *fn, struct ncclComm *c, bool any_mode) {
    ncclResult_t st = (ncclResult_t)atomic_load_explicit(&c->state, memory_order_acquire);
    if (st == ncclInProgress)
        return fail(fn, ncclInvalidArgument,
                    "Attempt to use communicator before the previous operation returned "
                    "ncclSuccess");
    if (st != ncclSuccess)
        return fail(fn, st, "the communicator's last nonblocking operation failed (%s)",
                    res_name(st));
    if (!any_mode && !c->blocking)
        return fail(fn, ncclInvalidUsage,
                    "a nonblocking communicator: NCCL would return ncclInProgress and run the "
                    "call on a thread (the double does not model that)");
    return ncclSuccess;
}

/* One split's work on every rank of the parent (src/init.cc ncclCommInitRankFunc with a parent):
 * the colors and keys meet in the parent's segment, then the child is made as an init is, on a
 * segment named after the parent's id and its split count (the same on every rank: every rank
 * splits the parent in the same order). The double makes one child of the parent's ranks in the
 * parent's order: one color, keys in rank order. */
static ncclResult_t split_body(job_t *j) {
    static const char fn[] = "ncclCommSplit";
    struct ncclComm *p = j->c, *child = j->child;
    shm_hdr_t *h = p->shm;
    h->arg[p->rank][0] = j->color;
    h->arg[p->rank][1] = j->key;
    ncclResult_t r = barrier(p, fn);
    const bool met = r == ncclSuccess; /* a barrier only after a met one: a rank that left the
                                        * first must not count in the second */
    for (int i = 0; i < p->nranks && r == ncclSuccess; i++) {
        if (h->arg[i][0] != j->color)
            r = fail(fn, ncclInvalidUsage,
                     "rank %d gives color %lld, rank %d color %d (the double makes one child)", i,
                     (long long)h->arg[i][0], p->rank, j->color);
        else if (i > 0 && h->arg[i][1] < h->arg[i - 1][1])
            r = fail(fn, ncclInvalidUsage,
                     "keys out of the parent's rank order (the double keeps its order)");
    }
    if (met) { /* every rank checked: nobody reuses arg[] before all did */
        ncclResult_t r2 = barrier(p, fn);
        if (r == ncclSuccess)
            r = r2;
    }
    if (r == ncclSuccess)
        r = init_body(child, fn);
    pthread_mutex_lock(&g_mu);
    p->pending_child = NULL;
    pthread_mutex_unlock(&g_mu);
    if (r == ncclSuccess) {
        /* *newcomm is set once the child is complete (src/init.cc:1612-1614), NULL before
         * (:2571-2572). */
        __atomic_store_n(j->out, child, __ATOMIC_RELEASE);
    } else {
        child->magic = 0;
        free(child);
    }
    return r;
}

ncclResult_t ncclCommSplit(ncclComm_t p, int color, int key, ncclComm_t *out,
                           ncclConfig_t *config) {
    ENTER("ncclCommSplit");
    if (!comm_ok(p))
        return fail("ncclCommSplit", ncclInvalidArgument, "not a live communicator");
    if (!out)
        return fail("ncclCommSplit", ncclInvalidArgument, "newcomm is NULL");
    ncclResult_t r = ready("ncclCommSplit", p, true);
    if (r != ncclSuccess)
        return r;
    *out = NULL;
    if (color == NCCL_SPLIT_NOCOLOR || color < 0)
        return fail("ncclCommSplit", ncclInvalidArgument,
                    "color %d (the double makes one child of every rank)", color);
    /* The child's config: the one given, or the parent's (src/init.cc:2598-2601), with
     * NCCL_COMM_BLOCKING over either. */
    int blocking = config_blocking("ncclCommSplit", config, p->blocking);
    if (blocking < 0)
        return ncclInvalidArgument;
    struct ncclComm *child = calloc(1, sizeof *child);
    job_t *j = calloc(1, sizeof *j);
    if (!child || !j) {
        free(child);
        free(j);
        return fail("ncclCommSplit", ncclSystemError, "host memory");
    }
    dbl_ctx_make(p->dev);
    child->magic = COMM_MAGIC;
    child->rank = p->rank;
    child->nranks = p->nranks;
    child->dev = p->dev; /* the parent's device (src/init.cc:2624) */
    child->blocking = blocking;
    child->id = p->id;
    child->id.internal[16] = (char)(++p->children); /* 2.28.9's splitCount (:2622) */
    child->id.internal[17] = 1;
    pthread_mutex_lock(&g_mu);
    p->pending_child = child;
    pthread_mutex_unlock(&g_mu);
    j->c = p;
    j->child = child;
    j->out = out;
    j->color = color;
    j->key = key;
    /* The job runs on the parent (src/init.cc:2626 launches it with the parent), so the
     * parent's blocking decides whether the call waits (src/group.cc:52-59): a nonblocking
     * parent's split returns ncclInProgress and says its outcome in the parent's state, while
     * the child keeps its own config's blocking. */
    return launch("ncclCommSplit", j, true); /* in a group: src/init.cc:2670, :2678 */
}

static win_t *g_all_wins; /* every live window (g_mu) */

/* The communicator's windows go with it (g_mu taken here). */
static void comm_free(struct ncclComm *c) {
    pthread_mutex_lock(&g_mu);
    for (win_t **pp = &g_all_wins; *pp;) {
        win_t *w = *pp;
        if (w->comm == c) {
            *pp = w->next;
            w->magic = 0;
            free(w);
        } else {
            pp = &w->next;
        }
    }
    for (bigmem_t *m = c->mems, *next; m; m = next) {
        next = m->next;
        free(m);
    }
    c->mems = NULL;
    pthread_mutex_unlock(&g_mu);
    c->magic = 0;
    release_own(c);
    if (c->shm) /* none after a failed init */
        munmap(c->shm, c->shm_size);
    free(c);
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    ENTER("ncclCommDestroy");
    if (!c)
        return ncclSuccess; /* NCCL returns success on a NULL comm */
    if (!comm_ok(c))
        return fail("ncclCommDestroy", ncclInvalidArgument, "not a live communicator");
    /* ncclCommEnsureReady first (src/init.cc:2381): a communicator still in progress, or whose
     * nonblocking init or split failed, is not destroyed (ncclCommAbort frees it). */
    ncclResult_t st = ready("ncclCommDestroy", c, true);
    if (st != ncclSuccess)
        return st;
    join_job(c);
    /* "always deregister windows before freeing memory or destroying communicators" (NCCL
     * 2.28.9 examples/05_symmetric_memory README): said loudly, then destroyed anyway. */
    bool has_wins = false;
    pthread_mutex_lock(&g_mu);
    for (win_t *w = g_all_wins; w; w = w->next)
        has_wins = has_wins || w->comm == c;
    pthread_mutex_unlock(&g_mu);
    if (has_wins)
        dbl_say("ncclCommDestroy", "warning", 0,
                "rank %d destroys a communicator with windows still registered", c->rank);
    comm_free(c);
    return ncclSuccess;
}

/* Local in NCCL; peers blocked in this communicator get ncclRemoteError here (NCCL would leave
 * them to their own abort or timeout). */
ncclResult_t ncclCommAbort(ncclComm_t c) {
    ENTER("ncclCommAbort");
    if (!c)
        return ncclSuccess;
    if (!comm_ok(c))
        return fail("ncclCommAbort", ncclInvalidArgument, "not a live communicator");
    /* A job still running on it (a nonblocking init or split) is stopped and joined first: the
     * abort flags are set, a split's child's too, and ncclCommEnsureReady joins the job, its
     * error ignored (2.28.9 src/init.cc:2513-2519, :2394-2402, :376-377). Its peers are left to
     * their own deadline, as NCCL leaves them in its bootstrap. */
    atomic_store(&c->abort_flag, 1);
    pthread_mutex_lock(&g_mu);
    if (c->pending_child)
        atomic_store(&c->pending_child->abort_flag, 1);
    pthread_mutex_unlock(&g_mu);
    join_job(c);
    if (c->shm) {
        atomic_store(&c->shm->aborted, 1);
        syscall(SYS_futex, &c->shm->gen, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
    }
    comm_free(c);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int *n) {
    if (!comm_ok(c) || !n)
        return fail("ncclCommCount", ncclInvalidArgument, "bad argument");
    *n = c->nranks;
    return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *d) {
    if (!comm_ok(c) || !d)
        return fail("ncclCommCuDevice", ncclInvalidArgument, "bad argument");
    *d = c->dev;
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t c, int *r) {
    if (!comm_ok(c) || !r)
        return fail("ncclCommUserRank", ncclInvalidArgument, "bad argument");
    *r = c->rank;
    return ncclSuccess;
}

/* ---- memory ---------------------------------------------------------------------------------- */

typedef struct nalloc {
    uintptr_t ptr;
    size_t size;
    CUmemGenericAllocationHandle h;
    struct nalloc *next;
} nalloc_t;
static nalloc_t *g_allocs; /* g_mu */

/* As NCCL 2.28.9's src/allocator.cc: cuMemCreate of pinned device memory on the current device
 * with POSIX-FD handles (retried without on NOT_PERMITTED/NOT_SUPPORTED), the size rounded up to
 * the recommended granularity, a reservation aligned to it, mapped, read-write for the device.
 * A failed cuMemCreate (out of memory included) is ncclUnhandledCudaError. */
ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
    ENTER("ncclMemAlloc");
    if (!ptr)
        return fail("ncclMemAlloc", ncclInvalidArgument, "ptr is NULL");
    *ptr = NULL;
    if (size == 0)
        return ncclSuccess;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess)
        return fail("ncclMemAlloc", ncclUnhandledCudaError, "cudaGetDevice failed");
    dbl_ctx_make(dev);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    CUresult cr = cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (cr != CUDA_SUCCESS)
        return fail("ncclMemAlloc", ncclUnhandledCudaError, "cuMemGetAllocationGranularity: %d",
                    (int)cr);
    size_t asize = (size + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h = 0;
    cr = cuMemCreate(&h, asize, &prop, 0);
    if (cr == CUDA_ERROR_NOT_PERMITTED || cr == CUDA_ERROR_NOT_SUPPORTED) {
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
        cr = cuMemCreate(&h, asize, &prop, 0);
    }
    if (cr != CUDA_SUCCESS)
        return fail("ncclMemAlloc", ncclUnhandledCudaError,
                    "Cuda failure %d '%s' (cuMemCreate of %zu bytes)", (int)cr,
                    cr == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "error", asize);
    CUdeviceptr va = 0;
    cr = cuMemAddressReserve(&va, asize, gran, 0, 0);
    if (cr == CUDA_SUCCESS) {
        cr = cuMemMap(va, asize, 0, h, 0);
        if (cr == CUDA_SUCCESS) {
            CUmemAccessDesc d;
            memset(&d, 0, sizeof d);
            d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            d.location.id = dev;
            d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            cr = cuMemSetAccess(va, asize, &d, 1);
            if (cr != CUDA_SUCCESS)
                (void)cuMemUnmap(va, asize);
        }
        if (cr != CUDA_SUCCESS)
            (void)cuMemAddressFree(va, asize);
    }
    nalloc_t *a = cr == CUDA_SUCCESS ? malloc(sizeof *a) : NULL;
    if (!a) {
        if (cr == CUDA_SUCCESS) {
            (void)cuMemUnmap(va, asize);
            (void)cuMemAddressFree(va, asize);
        }
        (void)cuMemRelease(h);
        return fail("ncclMemAlloc", ncclUnhandledCudaError, "reserve/map/access failed: %d",
                    (int)cr);
    }
    *a = (nalloc_t){(uintptr_t)va, asize, h, NULL};
    pthread_mutex_lock(&g_mu);
    a->next = g_allocs;
    g_allocs = a;
    pthread_mutex_unlock(&g_mu);
    *ptr = (void *)(uintptr_t)va;
    return ncclSuccess;
}

ncclResult_t ncclMemFree(void *ptr) {
    ENTER("ncclMemFree");
    if (!ptr)
        return ncclSuccess;
    pthread_mutex_lock(&g_mu);
    nalloc_t **pp = &g_allocs;
    while (*pp && (*pp)->ptr != (uintptr_t)ptr)
        pp = &(*pp)->next;
    nalloc_t *a = *pp;
    bool windowed = false;
    for (win_t *w = g_all_wins; a && w; w = w->next)
        if (w->buff >= a->ptr && w->buff < a->ptr + a->size)
            windowed = true;
    if (a && !windowed)
        *pp = a->next;
    pthread_mutex_unlock(&g_mu);
    if (!a)
        return fail("ncclMemFree", ncclInvalidArgument, "%p is not from ncclMemAlloc", ptr);
    /* "always deregister windows before freeing memory" (2.28.9 symmetric-memory example). */
    if (windowed)
        return fail("ncclMemFree", ncclInvalidUsage,
                    "%p still has a registered window: ncclCommWindowDeregister it first", ptr);
    CUresult r1 = cuMemUnmap(a->ptr, a->size);
    CUresult r2 = cuMemRelease(a->h);
    CUresult r3 = cuMemAddressFree(a->ptr, a->size);
    free(a);
    if (r1 != CUDA_SUCCESS || r2 != CUDA_SUCCESS || r3 != CUDA_SUCCESS)
        return fail("ncclMemFree", ncclUnhandledCudaError, "unmap %d release %d free %d", (int)r1,
                    (int)r2, (int)r3);
    return ncclSuccess;
}

/* ---- windows (NCCL 2.28.9 src/dev_runtime.cc; docs api/comms.html; see
 * /work/shared/reference/nccl-windows.md §1) ------------------------------------------------- */

/* NCCL's place for an allocation of `size` bytes in c's big VA space: the lowest offset, aligned
 * to the VMM granularity (devr->granularity, :87), that overlaps no allocation held there
 * (ncclSpaceAlloc, src/allocator.cc: the first empty stretch that holds it, from the bottom).
 * Each rank carves its own: nothing compares the ranks' places when they are taken (2.28.9), so
 * ranks that hold different allocations there get different places for the same window. */
static int64_t big_first_fit(const struct ncclComm *c, int64_t size) {
    const int64_t align = (int64_t)dbl_granularity();
    /* The candidates: the bottom, and the end of each allocation held there, aligned up. */
    int64_t best = -1;
    const bigmem_t *after = NULL;
    do {
        int64_t lo = after ? after->off + after->size : 0;
        lo = (lo + align - 1) / align * align;
        bool free_here = true;
        for (const bigmem_t *m = c->mems; m && free_here; m = m->next)
            free_here = lo + size <= m->off || m->off + m->size <= lo;
        if (free_here && (best < 0 || lo < best))
            best = lo;
        after = after ? after->next : c->mems;
    } while (after);
    return best;
}

/* The record of the allocation at `base` (`size` bytes) in c's big space, taken for one more
 * window (g_mu held); NULL when out of host memory. */
static bigmem_t *big_take(struct ncclComm *c, uintptr_t base, size_t size) {
    for (bigmem_t *m = c->mems; m; m = m->next)
        if (m->base == base) {
            m->refs++;
            return m;
        }
    bigmem_t *m = malloc(sizeof *m);
    if (m) {
        *m = (bigmem_t){base, big_first_fit(c, (int64_t)size), (int64_t)size, 1, c->mems};
        c->mems = m;
    }
    return m;
}

/* A window on allocation `gone` goes (g_mu held): its record, and its place in the big
 * space, go with the last (symMemoryDropRef -> ncclSpaceFree, :426-449). */
static void big_drop(struct ncclComm *c, bigmem_t *gone) {
    if (!gone || --gone->refs > 0)
        return;
    for (bigmem_t **pp = &c->mems; *pp; pp = &(*pp)->next)
        if (*pp == gone) {
            *pp = gone->next;
            free(gone);
            return;
        }
}

/* Collective; in 2.28 "size by default must be equal" on all ranks; NULL buffer or size 0
 * returns ncclSuccess without writing *win; the memory must be VMM (cuMem/ncclMemAlloc):
 * "any other type of cuda buffers will fail to be registered" (ncclUnhandledCudaError from
 * cuMemRetainAllocationHandle); the offset into the allocation 4096-aligned ("Window address must
 * be suitably aligned.", ncclInvalidArgument); 2.28 maps only the first physical segment, so a
 * window running past it is refused here (2.29 refuses it too). */
ncclResult_t ncclCommWindowRegister(ncclComm_t c, void *buff, size_t size, ncclWindow_t *win,
                                    int flags) {
    ENTER("ncclCommWindowRegister");
    if (!comm_ok(c))
        return fail("ncclCommWindowRegister", ncclInvalidArgument, "not a live communicator");
    ncclResult_t rr = ready("ncclCommWindowRegister", c, false);
    if (rr != ncclSuccess)
        return rr;
    if (!win)
        return fail("ncclCommWindowRegister", ncclInvalidArgument, "win is NULL");
    if (buff == NULL || size == 0)
        return ncclSuccess;
    if (flags & ~(NCCL_WIN_DEFAULT | NCCL_WIN_COLL_SYMMETRIC))
        return fail("ncclCommWindowRegister", ncclInvalidArgument, "flags %#x", flags);
    uintptr_t base = 0;
    size_t seg = 0;
    int dev = -1;
    ncclResult_t r = ncclSuccess;
    if (dbl_vmm_range(buff, &base, &seg, &dev) != 0)
        r = fail("ncclCommWindowRegister", ncclUnhandledCudaError,
                 "%p is not cuMem/ncclMemAlloc memory (cuMemRetainAllocationHandle fails)", buff);
    else if (dev != c->dev)
        r = fail("ncclCommWindowRegister", ncclInvalidArgument,
                 "%p is memory of device %d, the communicator's device is %d", buff, dev, c->dev);
    else if (((uintptr_t)buff - base) % NCCL_WIN_REQUIRED_ALIGNMENT != 0)
        r = fail("ncclCommWindowRegister", ncclInvalidArgument,
                 "Window address must be suitably aligned. (%p is %zu bytes into its allocation)",
                 buff, (size_t)((uintptr_t)buff - base));
    else if ((uintptr_t)buff + size > base + seg)
        r = fail("ncclCommWindowRegister", ncclInvalidArgument,
                 "[%p, +%zu) spans past its physical allocation of %zu bytes at %#lx", buff, size,
                 seg, (unsigned long)base);
    /* Every rank enters (it is collective); then the sizes and flags are compared. */
    shm_hdr_t *h = c->shm;
    h->arg[c->rank][0] = r == ncclSuccess ? (int64_t)size : -1;
    h->arg[c->rank][1] = flags;
    ncclResult_t rb = barrier(c, "ncclCommWindowRegister");
    if (rb != ncclSuccess)
        return rb;
    ncclResult_t all = r;
    for (int i = 0; i < c->nranks && all == ncclSuccess; i++) {
        if (h->arg[i][0] < 0)
            all = fail("ncclCommWindowRegister", ncclRemoteError, "rank %d could not register", i);
        else if (h->arg[i][0] != (int64_t)size || h->arg[i][1] != flags)
            all = fail("ncclCommWindowRegister", ncclInvalidUsage,
                       "rank %d registers %lld bytes (flags %lld), rank %d %zu (flags %d): 2.28 "
                       "needs equal sizes on every rank",
                       i, (long long)h->arg[i][0], (long long)h->arg[i][1], c->rank, size, flags);
    }
    rb = barrier(c, "ncclCommWindowRegister");
    if (all == ncclSuccess)
        all = rb;
    if (all != ncclSuccess)
        return all;
    win_t *w = calloc(1, sizeof *w);
    if (!w)
        return fail("ncclCommWindowRegister", ncclSystemError, "host memory");
    *w = (win_t){WIN_MAGIC, c, (uintptr_t)buff, size, flags, c->wins_made++, -1, NULL, NULL};
    pthread_mutex_lock(&g_mu);
    /* Only where the support is on does 2.28.9 make a symmetric window (:593-597). */
    bigmem_t *m = c->symmetric_support ? big_take(c, base, seg) : NULL;
    if (m) {
        w->mem = m;
        w->big = m->off + (int64_t)((uintptr_t)buff - base); /* symWindowCreate, :477 */
    }
    if (m || !c->symmetric_support) {
        w->next = g_all_wins;
        g_all_wins = w;
    }
    pthread_mutex_unlock(&g_mu);
    if (!m && c->symmetric_support) {
        free(w);
        return fail("ncclCommWindowRegister", ncclSystemError, "host memory");
    }
    *win = w;
    return ncclSuccess;
}

/* "Deregistration is local to the rank" (docs). */
ncclResult_t ncclCommWindowDeregister(ncclComm_t c, ncclWindow_t win) {
    ENTER("ncclCommWindowDeregister");
    if (!comm_ok(c))
        return fail("ncclCommWindowDeregister", ncclInvalidArgument, "not a live communicator");
    ncclResult_t rr = ready("ncclCommWindowDeregister", c, false);
    if (rr != ncclSuccess)
        return rr;
    pthread_mutex_lock(&g_mu);
    win_t **pp = &g_all_wins;
    while (*pp && *pp != win)
        pp = &(*pp)->next;
    win_t *w = *pp;
    bool ok = w && w->comm == c;
    if (ok) {
        *pp = w->next;
        big_drop(c, w->mem);
    }
    pthread_mutex_unlock(&g_mu);
    if (!ok)
        return fail("ncclCommWindowDeregister", ncclInvalidArgument,
                    "%p is not a window of this communicator", (void *)win);
    w->magic = 0;
    free(w);
    return ncclSuccess;
}

/* ---- collectives ----------------------------------------------------------------------------- */

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

static float h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    float f;
    if (e == 0)
        f = ldexpf((float)m, -24);
    else if (e == 31)
        f = m ? NAN : INFINITY;
    else
        f = ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -f : f;
}

static uint16_t f2h(double x) {
    /* Round to nearest even through float's conversion rules, done by hand. */
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    x = fabs(x);
    if (isnan(x))
        return 0x7e00;
    if (x >= 65520.0)
        return sign | 0x7c00;
    if (x < ldexp(1.0, -25))
        return sign;
    int e;
    frexp(x, &e);                                               /* x = f * 2^e, f in [0.5, 1) */
    int ue = e - 1 + 15;                                        /* biased exponent of x */
    double q = ue <= 0 ? ldexp(x, 24) : ldexp(x, 10 - (e - 1)); /* units of the last place */
    double r = nearbyint(q);                                    /* ties to even (default mode) */
    uint32_t v = (uint32_t)r;
    if (ue <= 0)
        return sign | (uint16_t)v; /* subnormal (may round up into the normal range: fine) */
    if (v >= 2048) {
        v >>= 1;
        ue++;
    }
    if (ue >= 31)
        return sign | 0x7c00;
    return sign | (uint16_t)((ue << 10) | (v & 1023));
}

static float b2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f2b(double x) {
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f))
        return 0x7fc0;
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* acc[i] = op(acc[i], x[i]) for k elements; for ncclAvg on floating types each x is first
 * multiplied by `scale` in its own type (NCCL src/enqueue.cc hostToDevRedOp: ncclAvg is
 * ncclDevPreMulSum with 1/nRanks for floating types, ncclDevSumPostDiv for integers). */
#define RED_INT(T)                                                                                 \
    do {                                                                                           \
        T *a = (T *)acc;                                                                           \
        const T *b = (const T *)x;                                                                 \
        for (size_t i = 0; i < k; i++)                                                             \
            switch (op) {                                                                          \
            case ncclSum:                                                                          \
            case ncclAvg:                                                                          \
                a[i] = (T)(a[i] + b[i]);                                                           \
                break;                                                                             \
            case ncclProd:                                                                         \
                a[i] = (T)(a[i] * b[i]);                                                           \
                break;                                                                             \
            case ncclMax:                                                                          \
                a[i] = a[i] > b[i] ? a[i] : b[i];                                                  \
                break;                                                                             \
            case ncclMin:                                                                          \
                a[i] = a[i] < b[i] ? a[i] : b[i];                                                  \
                break;                                                                             \
            default:                                                                               \
                break;                                                                             \
            }                                                                                      \
    } while (0)
#define RED_FLT(T)                                                                                 \
    do {                                                                                           \
        T *a = (T *)acc;                                                                           \
        const T *b = (const T *)x;                                                                 \
        for (size_t i = 0; i < k; i++) {                                                           \
            T v = b[i];                                                                            \
            if (op == ncclAvg)                                                                     \
                v = (T)(v * (T)scale);                                                             \
            if (first) {                                                                           \
                a[i] = v;                                                                          \
                continue;                                                                          \
            }                                                                                      \
            switch (op) {                                                                          \
            case ncclSum:                                                                          \
            case ncclAvg:                                                                          \
                a[i] = a[i] + v;                                                                   \
                break;                                                                             \
            case ncclProd:                                                                         \
                a[i] = a[i] * v;                                                                   \
                break;                                                                             \
            case ncclMax:                                                                          \
                a[i] = a[i] > v ? a[i] : v;                                                        \
                break;                                                                             \
            case ncclMin:                                                                          \
                a[i] = a[i] < v ? a[i] : v;                                                        \
                break;                                                                             \
            default:                                                                               \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static void reduce(void *acc, const void *x, size_t k, ncclDataType_t t, ncclRedOp_t op,
                   double scale, bool first) {
    if (first && (t != ncclFloat32 && t != ncclFloat64 && t != ncclFloat16 && t != ncclBfloat16)) {
        memcpy(acc, x, k * type_size(t));
        return;
    }
    switch (t) {
    case ncclInt8:
        RED_INT(int8_t);
        break;
    case ncclUint8:
        RED_INT(uint8_t);
        break;
    case ncclInt32:
        RED_INT(int32_t);
        break;
    case ncclUint32:
        RED_INT(uint32_t);
        break;
    case ncclInt64:
        RED_INT(int64_t);
        break;
    case ncclUint64:
        RED_INT(uint64_t);
        break;
    case ncclFloat32:
        RED_FLT(float);
        break;
    case ncclFloat64:
        RED_FLT(double);
        break;
    case ncclFloat16:
    case ncclBfloat16: {
        uint16_t *a = acc;
        const uint16_t *b = x;
        bool bf = t == ncclBfloat16;
        double sc = bf ? b2f(f2b(scale)) : h2f(f2h(scale)); /* the scalar in the type */
        for (size_t i = 0; i < k; i++) {
            double v = bf ? b2f(b[i]) : h2f(b[i]);
            if (op == ncclAvg)
                v = bf ? b2f(f2b(v * sc)) : h2f(f2h(v * sc));
            double o = bf ? b2f(a[i]) : h2f(a[i]);
            double res = v;
            if (!first)
                switch (op) {
                case ncclSum:
                case ncclAvg:
                    res = o + v;
                    break;
                case ncclProd:
                    res = o * v;
                    break;
                case ncclMax:
                    res = o > v ? o : v;
                    break;
                case ncclMin:
                    res = o < v ? o : v;
                    break;
                default:
                    break;
                }
            a[i] = bf ? f2b(res) : f2h(res);
        }
        break;
    }
    default:
        break;
    }
}

static void post_div(void *acc, size_t k, ncclDataType_t t, int n) {
#define DIV(T)                                                                                     \
    for (size_t i = 0; i < k; i++)                                                                 \
        ((T *)acc)[i] = (T)(((T *)acc)[i] / (T)n);
    switch (t) {
    case ncclInt8:
        DIV(int8_t);
        break;
    case ncclUint8:
        DIV(uint8_t);
        break;
    case ncclInt32:
        DIV(int32_t);
        break;
    case ncclUint32:
        DIV(uint32_t);
        break;
    case ncclInt64:
        DIV(int64_t);
        break;
    case ncclUint64:
        DIV(uint64_t);
        break;
    default:
        break;
    }
#undef DIV
}

enum { K_ALLREDUCE, K_ALLGATHER, K_REDUCESCATTER, K_BROADCAST };
static const char *const k_names[] = {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter",
                                      "ncclBroadcast"};

static ncclResult_t copy_or_fail(const char *fn, void *dst, const void *src, size_t n) {
    int rc = dbl_copy(dst, src, n);
    if (rc)
        return fail(fn, ncclUnhandledCudaError, "Cuda failure %d: copying %zu bytes %p -> %p", rc,
                    n, src, dst);
    return ncclSuccess;
}

/* The flags of c's window holding `p` (ncclDevrFindWindow: by address), -1 when none. */
static int window_flags(struct ncclComm *c, const void *p) {
    int flags = -1;
    pthread_mutex_lock(&g_mu);
    for (win_t *w = g_all_wins; w && flags < 0; w = w->next)
        if (w->comm == c && (uintptr_t)p >= w->buff && (uintptr_t)p < w->buff + w->size)
            flags = w->flags;
    pthread_mutex_unlock(&g_mu);
    return flags;
}

/* Where `p` lies in c's window holding it: the window's registration number times 2^40 plus
 * the offset (windows are far below 2^40 bytes), -1 when none. Two ranks' values are equal
 * exactly when a symmetric kernel's peer pointer from one reaches the other's `p`. */
static int64_t window_place(struct ncclComm *c, const void *p) {
    int64_t at = -1;
    pthread_mutex_lock(&g_mu);
    for (win_t *w = g_all_wins; w && at < 0; w = w->next)
        if (w->comm == c && (uintptr_t)p >= w->buff && (uintptr_t)p < w->buff + w->size)
            at = (w->seq << 40) + (int64_t)((uintptr_t)p - w->buff);
    pthread_mutex_unlock(&g_mu);
    return at;
}

/* Where `p` lies in c's big VA space: its window's bigOffset plus the offset there (a symmetric
 * kernel's multimem address, mcOffset4K = bigOffset >> 12, src/dev_runtime.cc:492), -1 when no
 * window with a place holds it. */
static int64_t window_big(struct ncclComm *c, const void *p) {
    int64_t at = -1;
    pthread_mutex_lock(&g_mu);
    for (win_t *w = g_all_wins; w && at < 0; w = w->next)
        if (w->comm == c && w->big >= 0 && (uintptr_t)p >= w->buff &&
            (uintptr_t)p < w->buff + w->size)
            at = w->big + (int64_t)((uintptr_t)p - w->buff);
    pthread_mutex_unlock(&g_mu);
    return at;
}

/* NCCL 2.28.9's symmetric kernels in its order (src/include/sym_kernels.h:27-44, their names
 * src/sym_kernels.cc:13-27), each with the collective whose mask holds it (kernelMask_coll,
 * :44-56 and :70-77; AllReduce_RSxNet_ARxMC_AGxNet is in none: -1), whether it is an LL kernel
 * (kernelMask_LL, :38-42) and whether a multimem one (kernelMask_STMC, :29-36, which holds the
 * LDMC ones). */
static const struct {
    const char *name;
    int kind;
    bool ll, mc;
} symks[] = {
    {"AllReduce_AGxLL_R", K_ALLREDUCE, true, false},
    {"AllReduce_AGxLLMC_R", K_ALLREDUCE, true, true},
    {"AllReduce_RSxLD_AGxST", K_ALLREDUCE, false, false},
    {"AllReduce_RSxLDMC_AGxSTMC", K_ALLREDUCE, false, true},
    {"AllReduce_RSxNet_ARxMC_AGxNet", -1, false, false},
    {"AllGather_LL", K_ALLGATHER, true, false},
    {"AllGather_LLMC", K_ALLGATHER, true, true},
    {"AllGather_ST", K_ALLGATHER, false, false},
    {"AllGather_STMC", K_ALLGATHER, false, true},
    {"ReduceScatter_LL", K_REDUCESCATTER, true, false},
    {"ReduceScatter_LD", K_REDUCESCATTER, false, false},
    {"ReduceScatter_LDMC", K_REDUCESCATTER, false, true},
};
#define N_SYMK (sizeof symks / sizeof symks[0])

/* NCCL_SYM_KERNEL as kernelMask_user reads it (src/sym_kernels.cc:79-102): once a process, then
 * kept; unset or "^" is every kernel, a kernel's exact name that kernel alone, any other value
 * none. A bit per symks entry. */
static uint32_t user_kernels(void) {
    static _Atomic uint32_t cache = UINT32_MAX;
    uint32_t m = atomic_load(&cache);
    if (m != UINT32_MAX)
        return m;
    const char *e = getenv("NCCL_SYM_KERNEL");
    m = !e || strcmp(e, "^") == 0 ? (1u << N_SYMK) - 1 : 0;
    for (size_t i = 0; e && m == 0 && i < N_SYMK; i++)
        if (strcmp(e, symks[i].name) == 0)
            m = 1u << i;
    atomic_store(&cache, m);
    return m;
}

/* The kernels ncclSymkMask (src/sym_kernels.cc:275-317) leaves a call of this kind and these bus
 * bytes (:306-307), a bit per symks entry (0: none): of its collective (:276), allowed by
 * NCCL_SYM_KERNEL (:277), multimem only with comm->nvlsSupport (:279-304), LL only below 2 GiB of
 * bus bytes (:309), none at all from 64 GiB (:312). The double's GPUs have no NVLS:
 * src/transport/nvls.cc:161-176 takes nvlsSupport from CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED,
 * which the double's driver does not report, and a forced NCCL_NVLS_ENABLE=1 finds no NVLS channels
 * (src/init.cc:1190). */
static uint32_t symk_mask(int kind, size_t bus) {
    uint32_t m = user_kernels(), left = 0;
    if (bus >= (size_t)64 << 30)
        return 0;
    for (size_t i = 0; i < N_SYMK; i++)
        if ((m >> i & 1) && symks[i].kind == kind && !symks[i].mc &&
            !(symks[i].ll && bus >= (size_t)2 << 30))
            left |= 1u << i;
    return left;
}

/* The symmetric kernels NCCL 2.28.9 picks this call's kernel from (0: it runs on its regular
 * ones): the comm has symmetricSupport
 * (src/enqueue.cc:360), more than one rank (one rank is ncclLaunchOneRank's copy, :2569), both
 * buffers in NCCL_WIN_COLL_SYMMETRIC windows (src/scheduler/symmetric_sched.cc:26-30, windows
 * found by the buffer's start, src/dev_runtime.cc:952-963 ncclDevrFindWindow) and
 * ncclSymkAvailable (src/sym_kernels.cc:319-325): the call one the kernels implement
 * (ncclSymkImplemented, :248-273: all-gather of any type; all-reduce and reduce-scatter of sum
 * only (avg on floats is a pre-multiplied sum, not sum) on floating types but fp64) and a kernel
 * left by ncclSymkMask (symk_mask), none when nNodes > 1 (the LSA kernels are masked, :314, and
 * 2.28 has no network ones). */
static uint32_t symmetric_kernels(struct ncclComm *c, int kind, const void *send, const void *recv,
                                  size_t count, ncclDataType_t t, ncclRedOp_t op) {
    if (!c->symmetric_support || c->nranks < 2 || c->nnodes > 1)
        return 0;
    switch (kind) {
    case K_ALLGATHER:
        break;
    case K_ALLREDUCE:
    case K_REDUCESCATTER:
        if (op != ncclSum || (t != ncclFloat32 && t != ncclFloat16 && t != ncclBfloat16))
            return 0;
        break;
    default:
        return 0;
    }
    int fs = window_flags(c, send), fr = window_flags(c, recv);
    if (fs < 0 || fr < 0 || !(fs & fr & NCCL_WIN_COLL_SYMMETRIC))
        return 0;
    return symk_mask(kind, (kind == K_ALLREDUCE ? 1 : (size_t)c->nranks) * count * type_size(t));
}

/* Test hook: whether NCCL 2.28.9 would run this call on symmetric kernels (symmetric_kernels),
 * the rule alone without running the call, for sizes no test can allocate. */
DBL_EXPORT int cuda_double_nccl_symmetric_rule(ncclComm_t c, int kind, const void *send,
                                               const void *recv, size_t count, int type, int op) {
    return comm_ok(c) && count > 0 &&
           symmetric_kernels(c, kind, send, recv, count, (ncclDataType_t)type, (ncclRedOp_t)op) !=
               0;
}

/* Test hook: collectives of this process that NCCL 2.28.9 would have run as symmetric kernels. */
DBL_EXPORT long cuda_double_nccl_symmetric_kernels(void) {
    return atomic_load(&g_symk_calls);
}

static ncclResult_t coll(int kind, const void *send, void *recv, size_t count, ncclDataType_t t,
                         ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t stream) {
    const char *fn = k_names[kind];
    if (!comm_ok(c))
        return fail(fn, ncclInvalidArgument, "not a live communicator");
    ncclResult_t rr = ready(fn, c, false);
    if (rr != ncclSuccess)
        return rr;
    size_t es = type_size(t);
    if (es == 0 || t == ncclFloat8e4m3 || t == ncclFloat8e5m2)
        return fail(fn, ncclInvalidArgument, "datatype %d (not modelled for fp8)", (int)t);
    if ((kind == K_ALLREDUCE || kind == K_REDUCESCATTER) && (op < ncclSum || op > ncclAvg))
        return fail(fn, ncclInvalidArgument, "op %d", (int)op);
    if (kind == K_BROADCAST && (root < 0 || root >= c->nranks))
        return fail(fn, ncclInvalidArgument, "root %d of %d", root, c->nranks);
    /* NCCL 2.28.9 launches a multi-rank call's kernel with the communicator's device current
     * (src/group.cc groupLaunch: cudaSetDevice(comm->cudaDev) before ncclLaunchPrepare and
     * ncclLaunchKernel), so a pseudo-stream (NULL, legacy, per-thread) is that device's stream
     * whatever device the caller has current. One rank's call is ncclLaunchOneRank's copy, issued
     * from taskAppend with the caller's device current (src/enqueue.cc ncclEnqueueCheck sets the
     * comm's device only under NCCL_CHECK_POINTERS=1): the caller's device's stream, which a
     * copy between the comm device's buffers may use (UVA), so it is not refused either. */
    int sdev = -1;
    bool capturing = false;
    if (dbl_rt_stream(stream, c->nranks > 1 ? c->dev : -1, &sdev, &capturing) != 0)
        return fail(fn, ncclInvalidArgument, "stream %p is not a live stream", (void *)stream);
    bool pseudo = stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
    if (sdev != c->dev && !pseudo)
        return fail(fn, ncclInvalidArgument, "stream of device %d, communicator on device %d", sdev,
                    c->dev);
    if (capturing)
        return fail(
            fn, ncclInvalidUsage,
            "a collective on a capturing stream (legal in NCCL; not modelled by the double)");
    int n = c->nranks;
    size_t send_n = kind == K_REDUCESCATTER ? count * (size_t)n : count;
    size_t recv_n = kind == K_ALLGATHER ? count * (size_t)n : count;
    /* NCCL checks that both buffers are device memory of the communicator's device (src/enqueue.cc
     * ArgsCheck / CudaPtrCheck: "invalid argument"). */
    bool send_needed = !(kind == K_BROADCAST && c->rank != root);
    if (count > 0) {
        if (send_needed && dbl_mem_device(send) != c->dev)
            return fail(fn, ncclInvalidArgument, "sendbuff %p is not memory of device %d", send,
                        c->dev);
        if (dbl_mem_device(recv) != c->dev)
            return fail(fn, ncclInvalidArgument, "recvbuff %p is not memory of device %d", recv,
                        c->dev);
        if (send_needed && dbl_mem_device((const char *)send + send_n * es - 1) != c->dev)
            return fail(fn, ncclInvalidArgument, "sendbuff %p + %zu bytes runs past device memory",
                        send, send_n * es);
        if (dbl_mem_device((char *)recv + recv_n * es - 1) != c->dev)
            return fail(fn, ncclInvalidArgument, "recvbuff %p + %zu bytes runs past device memory",
                        recv, recv_n * es);
    }
    shm_hdr_t *h = c->shm;
    int64_t *me = h->arg[c->rank];
    me[0] = kind;
    me[1] = (int64_t)count;
    me[2] = t;
    me[3] = kind == K_ALLREDUCE || kind == K_REDUCESCATTER ? (int64_t)op : -1;
    me[4] = kind == K_BROADCAST ? root : -1;
    /* A symmetric kernel gets each buffer as its window and its offset there on the calling
     * rank (src/sym_kernels.cc ncclSymkMakeDevWork) and reaches a peer's copy at the same window
     * and offset: "users need to guarantee the offset to the buffer head address from all ranks
     * must be equal" (NCCL 2.28 docs, api/flags: NCCL_WIN_COLL_SYMMETRIC). Only the buffers a
     * kernel reaches on peers count (src/device/symmetric/): all-reduce both, all-gather its
     * recv buffer (the send buffer is read through input.localPtr() only, all_gather.cuh),
     * reduce-scatter its send buffer (the result is written through output.localPtr() only,
     * reduce_scatter.cuh). Ranks that would run such a call at different places, or not all on
     * symmetric kernels (NCCL decides per rank, src/scheduler/symmetric_sched.cc), or on kernels
     * picked from different masks (NCCL_SYM_KERNEL differing: ncclSymkPickKernel takes the
     * fastest kernel of its rank's mask), get wrong data or hang on NCCL: the double fails them. */
    uint32_t kernels = count > 0 ? symmetric_kernels(c, kind, send, recv, count, t, op) : 0;
    bool symk = kernels != 0;
    me[5] = !symk ? -2 : kind == K_ALLGATHER ? -1 : window_place(c, send);
    me[6] = !symk ? -2 : kind == K_REDUCESCATTER ? -1 : window_place(c, recv);
    me[7] = kernels;
    me[8] = !symk ? -2 : kind == K_ALLGATHER ? -1 : window_big(c, send);
    me[9] = !symk ? -2 : kind == K_REDUCESCATTER ? -1 : window_big(c, recv);
    ncclResult_t r = barrier(c, fn);
    if (r != ncclSuccess)
        return r;
    for (int i = 0; i < n && r == ncclSuccess; i++)
        if (memcmp(h->arg[i], me, 5 * sizeof(int64_t)) != 0)
            r = fail(
                fn, ncclInvalidUsage,
                "rank %d called %s(count %lld, type %lld, op %lld, root %lld) while rank %d "
                "called %s(count %zu, type %d, op %lld, root %lld): NCCL would hang or corrupt",
                i, h->arg[i][0] >= 0 && h->arg[i][0] < 4 ? k_names[h->arg[i][0]] : "?",
                (long long)h->arg[i][1], (long long)h->arg[i][2], (long long)h->arg[i][3],
                (long long)h->arg[i][4], c->rank, fn, count, (int)t, (long long)me[3],
                (long long)me[4]);
    for (int i = 0; i < n && r == ncclSuccess; i++)
        if (h->arg[i][5] != me[5] || h->arg[i][6] != me[6])
            r = fail(fn, ncclInvalidUsage,
                     "rank %d's buffers at window places %lld/%lld, rank %d's at %lld/%lld "
                     "(window * 2^40 + offset; -1: not reached on peers; -2: not a symmetric "
                     "kernel there): NCCL's symmetric kernels would reach the wrong memory or "
                     "hang",
                     i, (long long)h->arg[i][5], (long long)h->arg[i][6], c->rank, (long long)me[5],
                     (long long)me[6]);
    /* Each rank takes its window's place in the big VA space on its own (ncclSpaceAlloc), so
     * ranks that held different windows there before get different places for the same one;
     * NCCL binds the window's memory into the multicast object at that place on each rank
     * (cuMulticastBindMem at mem->bigOffset, src/dev_runtime.cc:211) and a multimem kernel
     * reaches the same place on every rank; NCCL's own check (2.30.7, NCCL_CHECK_MODE=
     * DEBUG_GLOBAL: src/misc/argcheck.cc registrationCheck) fails such a call with
     * ncclInvalidArgument ("send buffer window ... mismatch with rank 0"). */
    for (int i = 0; i < n && r == ncclSuccess; i++)
        if (h->arg[i][8] != me[8] || h->arg[i][9] != me[9])
            r = fail(fn, ncclInvalidArgument,
                     "rank %d's buffers lie at %lld/%lld in NCCL's big VA space, rank %d's at "
                     "%lld/%lld (bigOffset + offset; -1: not reached on peers; -2: not a "
                     "symmetric kernel there): their windows got different places there, and "
                     "the kernels' multimem addresses would differ",
                     i, (long long)h->arg[i][8], (long long)h->arg[i][9], c->rank, (long long)me[8],
                     (long long)me[9]);
    for (int i = 0; i < n && r == ncclSuccess; i++)
        if (h->arg[i][7] != me[7])
            r = fail(fn, ncclInvalidUsage,
                     "rank %d picks its symmetric kernel from mask %#llx, rank %d from %#llx "
                     "(NCCL_SYM_KERNEL differs): they could run different kernels and hang",
                     i, (long long)h->arg[i][7], c->rank, (long long)me[7]);
    ncclResult_t r2 = barrier(c, fn);
    if (r != ncclSuccess)
        return r;
    if (r2 != ncclSuccess)
        return r2;
    if (count == 0)
        return ncclSuccess;
    if (symk)
        atomic_fetch_add(&g_symk_calls, 1);

    char *mine = h->data + (size_t)c->rank * SLOT;
    size_t per = kind == K_REDUCESCATTER ? SLOT / (es * (size_t)n) : SLOT / es; /* elements */
    char *tmp = malloc(per * es);
    if (!tmp)
        return fail(fn, ncclSystemError, "host memory");
    double scale = 1.0 / n;
    for (size_t off = 0; off < count && r == ncclSuccess; off += per) {
        size_t k = count - off < per ? count - off : per;
        /* 1. each rank puts its part in its slot */
        if (kind == K_REDUCESCATTER) {
            for (int j = 0; j < n && r == ncclSuccess; j++)
                r = copy_or_fail(fn, mine + (size_t)j * k * es,
                                 (const char *)send + ((size_t)j * count + off) * es, k * es);
        } else if (send_needed && !(kind == K_BROADCAST && c->rank != root)) {
            r = copy_or_fail(fn, mine, (const char *)send + off * es, k * es);
        }
        /* A rank whose copy failed still takes part in the barriers, so no peer waits. */
        ncclResult_t rb = barrier(c, fn);
        if (r == ncclSuccess)
            r = rb;
        /* 2. each rank computes its output from every slot */
        if (r == ncclSuccess) {
            switch (kind) {
            case K_ALLREDUCE:
            case K_REDUCESCATTER: {
                size_t at = kind == K_REDUCESCATTER ? (size_t)c->rank * k * es : 0;
                for (int q = 0; q < n; q++)
                    reduce(tmp, h->data + (size_t)q * SLOT + at, k, t, op, scale, q == 0);
                if (op == ncclAvg)
                    post_div(tmp, k, t, n);
                r = copy_or_fail(fn, (char *)recv + off * es, tmp, k * es);
                break;
            }
            case K_ALLGATHER:
                for (int q = 0; q < n && r == ncclSuccess; q++)
                    r = copy_or_fail(fn, (char *)recv + ((size_t)q * count + off) * es,
                                     h->data + (size_t)q * SLOT, k * es);
                break;
            case K_BROADCAST:
                r = copy_or_fail(fn, (char *)recv + off * es, h->data + (size_t)root * SLOT,
                                 k * es);
                break;
            }
        }
        rb = barrier(c, fn);
        if (r == ncclSuccess)
            r = rb;
    }
    free(tmp);
    return r;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
    ENTER("ncclAllReduce");
    return coll(K_ALLREDUCE, send, recv, count, t, op, 0, c, s);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclComm_t c, cudaStream_t s) {
    ENTER("ncclAllGather");
    return coll(K_ALLGATHER, send, recv, count, t, ncclSum, 0, c, s);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
    ENTER("ncclReduceScatter");
    return coll(K_REDUCESCATTER, send, recv, count, t, op, 0, c, s);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t c, cudaStream_t s) {
    ENTER("ncclBroadcast");
    return coll(K_BROADCAST, send, recv, count, t, ncclSum, root, c, s);
}
