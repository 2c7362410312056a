/*
 * reg_nccl.c: the `nccl` registrar (built with SP_HAVE_NCCL, runs on the cuda backend). A segment
 * is one ncclMemAlloc (CUDA VMM) allocation registered once, for its whole life, as an NCCL
 * window with NCCL_WIN_COLL_SYMMETRIC, so NCCL's symmetric kernels apply to the blocks carved
 * from it (reference/nccl-windows.md §1, §8).
 *
 * Invariants: one window per physical allocation (2.28 registers only the first physical segment
 * of a multi-segment buffer); sizes aligned to NCCL_WIN_REQUIRED_ALIGNMENT and to the VMM
 * recommended granularity; the window handle starts NULL because 2.28's early-return paths
 * leave it unwritten.
 *
 * Growth: ncclMemAlloc on every rank; the ranks agree (pool round) that every rank has its
 * memory. ncclMemAlloc reports an out-of-memory cuMemCreate as ncclUnhandledCudaError, so any
 * failure there is treated as out of memory: every rank that failed releases its device's
 * non-symmetric free cache and retries once, and the ranks agree again; then
 * SP_ERR_OUT_OF_MEMORY naming the ranks, with PyTorch-style figures. ncclCommWindowRegister is
 * collective (every rank, in the same order on the communicator) and blocks inside NCCL where no
 * deadline reaches, so the ranks agree that every rank is ready right before it, and that round
 * also carries the registration's place in the world's order: a ticket world rank 0 hands out
 * once every rank has reached the growth. Every rank then registers in ticket order, holding the
 * world's NCCL lock (NCCL forbids two threads in one communicator) for the NCCL call alone, never
 * across a round: two pools growing at once from two threads, reaching their registrations in
 * different orders on different ranks, both register, and another thread's collective is not
 * held up by a round waiting for a late rank (world/world.h, sp__world_nccl_ticket). The
 * world's NCCL collectives, which can wait inside NCCL for the peers' too, are put in one order
 * with the registration on every rank by the world's gate, closed in the turn and opened once
 * the registration's outcome is known (sp__world_nccl_gate_close). A registration that fails on
 * a rank may leave its peers blocked inside NCCL: every rank then aborts the world's NCCL
 * communicator (ncclCommAbort), so they get an error instead of waiting forever; the abort also
 * ends every wait for a turn.
 *
 * Release: the caller agrees once per batch; this synchronizes the device (the segment's stream
 * may have been destroyed by then), takes the deregistration's turn in the world's order (a round
 * carries rank 0's ticket: NCCL places each window on each rank alone, from what that rank holds
 * at the time, so every change to the windows comes in one order on every rank), deregisters
 * (local in NCCL) under the NCCL lock, frees. A refused deregistration or free is SP_ERR_NCCL
 * naming the call, and what it refused is kept on a per-world list and tried again later, freed at
 * the latest once the world's communicator is gone ("what a refused release keeps" below).
 *
 * Symmetric support: NCCL 2.28 answers a window registration with success even when the world
 * has no symmetric support, and the "window" is then a local buffer registration. It offers no
 * query, so symmetric_support() infers it from NCCL's own rule and the log says which it is.
 * That needs the node's GPUs' bus ids, gathered (node_gather) with SYMPOOL_SYM_TIMEOUT's deadline
 * like a round: a node peer whose previous round timed out never joins, and the ranks waiting
 * for it get SP_ERR_TIMEOUT and a broken pool, not a wait for good.
 * ncclMemAlloc and ncclMemFree use and may change the current device: the caller's is restored.
 * No pool or device lock is held by the callers (symmetric/ owns growth and release).
 */
#if defined(SP_HAVE_NCCL)

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "core/core.h"
#include "pool/pool.h"
#include "symmetric/sym_state.h"
#include "sympool/stats.h"

static sp_status_t nccl_err(ncclResult_t r, ncclComm_t comm, const char *what) {
    const char *last = ncclGetLastError(comm);
    return sp__error(SP_ERR_NCCL, SP_SUB_SYM, "%s failed: %s%s%s", what, ncclGetErrorString(r),
                     last && *last ? ": " : "", last ? last : "");
}

/* Take our own failure out of the runtime's last-error slot and leave anything else there: a
 * caller's pending error is theirs to see, and a sticky error (the context is lost) stays
 * whatever we do. */
static void drop_own_error(cudaError_t e) {
    if (e != cudaSuccess && cudaPeekAtLastError() == e)
        (void)cudaGetLastError();
}

/* For a sequence of calls whose failures are handled on the spot: clear what they left in the
 * last-error slot only if the caller had nothing pending there. */
static void drop_errors_since(cudaError_t pending_before) {
    if (pending_before == cudaSuccess)
        (void)cudaGetLastError();
}

static sp_status_t cuda_err(cudaError_t e, const char *what) {
    drop_own_error(e);
    return sp__error(SP_ERR_DEVICE, SP_SUB_SYM, "%s failed: %s", what, cudaGetErrorString(e));
}

/* The window calls appeared in NCCL 2.27 and ncclMemAlloc in 2.19. The headers we build against
 * have them, but the libnccl.so.2 loaded at run time may be older (PyTorch's wheel, a system
 * copy): weak references resolve to NULL there instead of failing the load or the first call,
 * and registration is refused with a message on every rank (the ready round carries it). */
#pragma weak ncclCommWindowRegister
#pragma weak ncclCommWindowDeregister
#pragma weak ncclMemAlloc
#pragma weak ncclMemFree

static bool window_api_loaded(void) {
    return ncclCommWindowRegister != NULL && ncclCommWindowDeregister != NULL &&
           ncclMemAlloc != NULL && ncclMemFree != NULL;
}

/* The VMM recommended granularity of `device`, read through the runtime's driver entry point so
 * the library never links libcuda.so.1 (absent on GPU-less machines). 2 MiB if unknown. */
static size_t vmm_granularity(int device) {
    typedef CUresult (*gran_fn)(size_t *, const CUmemAllocationProp *,
                                CUmemAllocationGranularity_flags);
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    size_t gran = 0;
    cudaError_t pending = cudaPeekAtLastError();
    if (cudaGetDriverEntryPointByVersion("cuMemGetAllocationGranularity", &fn, 12000,
                                         cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess && fn) {
        CUmemAllocationProp prop = {0};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        if (((gran_fn)fn)(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS)
            gran = 0;
    }
    drop_errors_since(pending);
    return gran ? gran : (size_t)2 << 20;
}

static size_t align_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

/* ncclMemAlloc/ncclMemFree on `device`, restoring the caller's current device afterwards. */
static sp_status_t mem_alloc(int device, size_t size, void **base_p) {
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return cuda_err(ce, "cudaSetDevice before ncclMemAlloc");
    void *base = NULL;
    ncclResult_t r = ncclMemAlloc(&base, size);
    sp__cuda_restore_device(device, prev);
    if (r != ncclSuccess) {
        /* cuMemCreate out of memory arrives as ncclUnhandledCudaError: treat every failure of
         * the allocation itself as out of memory (the retry and the figures say what to do). */
        const char *last = ncclGetLastError(NULL);
        return sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_SYM,
                               "ncclMemAlloc(%zu bytes) failed: %s%s%s", size,
                               ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
    }
    *base_p = base;
    return SP_SUCCESS;
}

/* ncclMemFree on `device`, restoring the caller's current device and last-error slot. */
static ncclResult_t nccl_mem_free(int device, void *base) {
    cudaError_t pending = cudaPeekAtLastError();
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    (void)cudaSetDevice(device);
    ncclResult_t r = ncclMemFree(base);
    sp__cuda_restore_device(device, prev);
    drop_errors_since(pending);
    return r;
}

/* ---- what a refused release keeps ----------------------------------------------------------
 *
 * A segment whose ncclCommWindowDeregister or ncclMemFree is refused is not forgotten: its
 * window (while still registered) and its memory wait on this process's list, under the world
 * they were made on, and are tried again (local calls, in a turn of the world's order) at the
 * world's next release or growth (of any pool), at an empty_cache or destroy that releases nothing,
 * and at sp_world_finalize right before the communicator goes. The memory is never freed while its
 * window is registered ("always deregister windows before freeing memory or destroying
 * communicators", NCCL 2.28.9 examples/05_symmetric_memory/01_allreduce/README.md). A window that
 * still cannot be deregistered goes with the communicator (ncclCommDestroy/ncclCommAbort: commFree
 * -> ncclDevrFinalize, src/init.cc:237-247; after an abort earlier in the world's life it is gone
 * already; without symmetric support a window is a local registration, which commFree's
 * ncclRegCleanup, :331, cleans up), and its memory is freed right after that
 * (sp__world_on_nccl_end). NCCL 2.28.9's ncclDevrFinalize (src/dev_runtime.cc:110-143) unmaps the
 * windows' peer mappings but never drops the cuMem reference a registration retained
 * (cuMemRetainAllocationHandle, :613; dropped only in symMemoryDropRef, :426-449, at a
 * deregistration), so there the physical memory of such a window stays until the process
 * exits; 2.29.7 destroys the windows left at ncclDevrFinalize. Every step is local (deregistration
 * is local in NCCL), so a refusal on one rank costs the others nothing: the pool's books already
 * let go of the segment on every rank. s_left_lock is a leaf lock held for list steps only, never
 * across an NCCL or CUDA call. */
typedef struct left {
    sp_world_t *world; /* the world whose communicator the window is on */
    void *window;      /* ncclWindow_t still registered, NULL once deregistered */
    uint64_t order;    /* the window's registration ticket (kept_windows), or NO_PLACE */
    void *base;        /* the ncclMemAlloc memory */
    size_t size;       /* its bytes (messages) */
    int device;        /* its device */
    struct left *next; /* s_left_lock */
} left_t;
static pthread_mutex_t s_left_lock = PTHREAD_MUTEX_INITIALIZER;
static left_t *s_left;         /* s_left_lock */
static _Atomic size_t s_nleft; /* entries on s_left (read without the lock: none, no walk) */

static void put_left(left_t *e) {
    pthread_mutex_lock(&s_left_lock);
    e->next = s_left;
    s_left = e;
    atomic_fetch_add(&s_nleft, 1);
    pthread_mutex_unlock(&s_left_lock);
}

/* The world's entries, taken off the list (NULL when none). */
static left_t *take_left(const sp_world_t *w) {
    if (atomic_load(&s_nleft) == 0)
        return NULL;
    left_t *mine = NULL;
    pthread_mutex_lock(&s_left_lock);
    for (left_t **pp = &s_left; *pp;) {
        left_t *e = *pp;
        if (e->world == w) {
            *pp = e->next;
            e->next = mine;
            mine = e;
            atomic_fetch_sub(&s_nleft, 1);
        } else {
            pp = &e->next;
        }
    }
    pthread_mutex_unlock(&s_left_lock);
    return mine;
}

#define NO_PLACE UINT64_MAX /* left_t.order of a local registration: no place in NCCL's space */

/* The windows this rank still holds on world w's communicator after their releases were refused
 * (local registrations, which take no place, left out): their number, and a sum of their
 * registration tickets' hashes. NCCL gives each window's allocation a place in the communicator's
 * big VA space on each rank alone (2.28.9 src/dev_runtime.cc symMemoryObtain -> ncclSpaceAlloc: the
 * lowest free stretch), and that place must be the same on every rank (the multicast binding and
 * the symmetric kernels' multimem addresses use it, :211 and :492; 2.30's
 * NCCL_CHECK_MODE=DEBUG_GLOBAL fails a collective whose windows' places differ). Ranks holding the
 * same registrations have the same space, so they give a new window the same place; a window kept
 * on some ranks only would shift it there. */
static int64_t kept_windows(const sp_world_t *w, int64_t *count_p) {
    uint64_t sum = 0;
    int64_t count = 0;
    pthread_mutex_lock(&s_left_lock);
    for (const left_t *e = s_left; e; e = e->next)
        if (e->world == w && e->window && e->order != NO_PLACE) {
            uint64_t z = e->order + 0x9e3779b97f4a7c15ULL; /* splitmix64's finalizer */
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
            sum += z ^ (z >> 31);
            count++;
        }
    pthread_mutex_unlock(&s_left_lock);
    *count_p = count;
    return (int64_t)sum;
}

/* A refused NCCL call's text: "<call> failed: <NCCL's string>[: <its last error>]". */
static void refusal(char *buf, size_t len, const char *call, void *arg, ncclResult_t r,
                    ncclComm_t comm) {
    const char *last = ncclGetLastError(comm);
    snprintf(buf, len, "%s(%p) failed: %s%s%s", call, arg, ncclGetErrorString(r),
             last && *last ? ": " : "", last ? last : "");
}

/* Deregister `win` under the world's NCCL lock (for the call alone: deregistration is local and
 * waits for no rank). After an abort the window went with the communicator: done. On a refusal
 * `why` says so (read under the lock: once it is let go, another thread may abort and free the
 * communicator that ncclGetLastError reads). */
static bool deregister(sp_world_t *w, void *win, char *why, size_t len) {
    sp__world_nccl_lock(w);
    ncclComm_t nc = (ncclComm_t)sp__world_nccl_comm(w);
    ncclResult_t r = nc ? ncclCommWindowDeregister(nc, (ncclWindow_t)win) : ncclSuccess;
    if (r != ncclSuccess)
        refusal(why, len, "ncclCommWindowDeregister", win, r, nc);
    sp__world_nccl_unlock(w);
    return r == ncclSuccess;
}

static bool free_mem(int device, void *base, char *why, size_t len) {
    ncclResult_t r = nccl_mem_free(device, base);
    if (r != ncclSuccess)
        refusal(why, len, "ncclMemFree", base, r, NULL);
    return r == ncclSuccess;
}

/* Deregister (if `win`) and free a segment's memory; what is refused is kept (put_left) in
 * `keep` (a left_t made with the segment; NULL: one is made now), and SP_ERR_NCCL names the
 * refused call and says so: set as the thread's error when `report`, else only logged (an error
 * path that returns its own failure). `what` names the release; `order` the window's ticket. */
static sp_status_t let_go(sp_world_t *w, int device, void *win, uint64_t order, void *base,
                          size_t size, left_t *keep, bool report, const char *what) {
    char why[320] = "", msg[640];
    if (win && deregister(w, win, why, sizeof why))
        win = NULL;
    if (!win && base && free_mem(device, base, why, sizeof why))
        base = NULL;
    if (!win && !base) {
        free(keep);
        return SP_SUCCESS;
    }
    /* A segment with a window always comes with its record (nccl_alloc), so a window is never
     * lost here: kept_windows must see every one. */
    left_t *e = keep ? keep : malloc(sizeof *e);
    if (e) {
        *e = (left_t){w, win, order, base, size, device, NULL};
        put_left(e);
        snprintf(msg, sizeof msg,
                 "%s: %s; the segment's %s (%zu bytes at %p) %s kept and tried again at the "
                 "world's next release, growth or empty_cache and at sp_world_finalize",
                 what, why, win ? "window and memory" : "memory", size, base, win ? "are" : "is");
    } else {
        snprintf(msg, sizeof msg,
                 "%s: %s; out of host memory to keep the segment for another try: its %zu "
                 "bytes at %p stay allocated until the process exits",
                 what, why, size, base);
    }
    if (report)
        return sp__error(SP_ERR_NCCL, SP_SUB_SYM, "%s", msg);
    SP_WARN(SP_SUB_SYM, "%s", msg);
    return SP_ERR_NCCL;
}

/* Try again what earlier releases on world `w` kept; local. A repeated refusal is logged at
 * INFO only: each was reported when it first happened. */
static void retry_left(sp_world_t *w) {
    for (left_t *e = take_left(w), *next; e; e = next) {
        next = e->next;
        char why[320] = "";
        if (e->window && deregister(w, e->window, why, sizeof why))
            e->window = NULL;
        if (!e->window && free_mem(e->device, e->base, why, sizeof why)) {
            SP_INFO(SP_SUB_SYM, "a kept symmetric segment (%zu bytes at %p) is released now",
                    e->size, e->base);
            free(e);
            continue;
        }
        SP_INFO(SP_SUB_SYM, "a kept symmetric segment (%zu bytes at %p) is still kept: %s", e->size,
                e->base, why);
        put_left(e);
    }
}

/* sp__world_on_nccl_end: before the communicator goes, one more try; after, the memory of what
 * is left (its windows went with the communicator). A refusal then is final: the memory stays
 * allocated until the process exits, and finalize says so (SP_ERR_NCCL). */
static sp_status_t left_at_world_end(sp_world_t *w, bool gone) {
    if (!gone) {
        retry_left(w);
        return SP_SUCCESS;
    }
    sp_status_t first = SP_SUCCESS;
    for (left_t *e = take_left(w), *next; e; e = next) {
        next = e->next;
        if (e->window)
            SP_WARN(SP_SUB_SYM,
                    "the NCCL window of a segment of %zu bytes at %p could not be deregistered "
                    "(ncclCommWindowDeregister refused it); it went with the world's "
                    "communicator (NCCL 2.28 keeps its memory's cuMem reference until the "
                    "process exits)",
                    e->size, e->base);
        char why[320] = "";
        if (!free_mem(e->device, e->base, why, sizeof why)) {
            sp_status_t s = sp__error(SP_ERR_NCCL, SP_SUB_SYM,
                                      "sp_world_finalize: %s; the %zu bytes of a symmetric "
                                      "segment whose earlier release was refused stay "
                                      "allocated until the process exits",
                                      why, e->size);
            if (first == SP_SUCCESS)
                first = s;
        }
        free(e);
    }
    return first;
}

__attribute__((constructor)) static void register_left_hook(void) {
    (void)sp__world_on_nccl_end(left_at_world_end);
}

/* Free memory no window is registered on, on an error path that returns its own failure: a
 * refusal keeps the memory (let_go) with a warning, and the caller's error text stays. */
static void mem_free(sp_world_t *w, int device, void *base, size_t size) {
    (void)let_go(w, device, NULL, 0, base, size, NULL, false, "undoing a failed growth");
}

/* PyTorch-style figures for the out-of-memory message. */
static void oom_figures(int device, char *buf, size_t len) {
    size_t fre = 0, tot = 0;
    cudaError_t pending = cudaPeekAtLastError();
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    if (cudaSetDevice(device) == cudaSuccess && cudaMemGetInfo(&fre, &tot) == cudaSuccess)
        snprintf(buf, len,
                 "GPU %d has a total capacity of %.2f GiB of which %.2f GiB is free; sympool "
                 "holds %.2f GiB reserved on it",
                 device, tot / 1073741824.0, fre / 1073741824.0,
                 sp_memory_reserved(device) / 1073741824.0);
    else
        snprintf(buf, len, "device %d's free memory is unknown", device);
    sp__cuda_restore_device(device, prev);
    drop_errors_since(pending);
}

/* Memory on every rank, or on none: one round, and when a rank failed one cache release and
 * retry on the ranks that failed, then a second round. */
static sp_status_t alloc_everywhere(sp_sym_state_t *st, size_t asize, const char *what,
                                    void **base_p) {
    void *base = NULL;
    sp_status_t s = mem_alloc(st->device, asize, &base);
    sp_agree_t a = {.op = SP_AGREE_SYM_REGISTER, .ok = base != NULL, .f = {(int64_t)asize}};
    sp_status_t as = sp__sym_round(st, &a, what);
    size_t freed = 0;
    if (as == SP_SUCCESS && a.nbad) {
        if (!base) {
            freed = sp__pool_empty_device_cache(st->device);
            s = mem_alloc(st->device, asize, &base);
        }
        a = (sp_agree_t){.op = SP_AGREE_SYM_REGISTER, .ok = base != NULL, .f = {(int64_t)asize}};
        as = sp__sym_round(st, &a, what);
    }
    if (as == SP_SUCCESS && !a.nbad) {
        *base_p = base;
        return SP_SUCCESS;
    }
    if (base)
        mem_free(st->world, st->device, base, asize);
    if (as != SP_SUCCESS)
        return as;
    char ranks[96], fig[200];
    oom_figures(st->device, fig, sizeof fig);
    return sp__error(SP_ERR_OUT_OF_MEMORY, SP_SUB_SYM,
                     "%s: out of memory: ncclMemAlloc of %zu bytes failed on %s even after "
                     "releasing their non-symmetric cache (%zu bytes here); %s. This rank: %s",
                     what, asize, sp__agree_bad_ranks(&a, ranks, sizeof ranks), freed, fig,
                     s == SP_SUCCESS ? "allocated" : sp_last_error());
}

/* An NCCL integer parameter as 2.28.9 reads it (src/misc/param.cc:76-94 ncclLoadParam): unset or
 * empty is the default; anything else is strtoll's value in base 0, so "false" and "0x0" are 0,
 * and only an out-of-range number falls back to the default. */
static long long nccl_param(const char *name, long long dflt) {
    const char *e = getenv(name);
    if (e == NULL || *e == '\0')
        return dflt;
    errno = 0;
    long long v = strtoll(e, NULL, 0);
    return errno ? dflt : v;
}

/* A GPU's identity in the node's table: its PCI bus id ("0000:3b:00.0" and the NUL), the name
 * NCCL 2.28.9 knows a rank's GPU by (its peer info's busId; two ranks with equal host hashes and
 * bus ids are its "Duplicate GPU detected", src/init.cc). An ordinal names nothing outside its
 * process: ranks started with CUDA_VISIBLE_DEVICES=<their GPU> all call theirs device 0. */
#define BUS_ID 16

/* This process's ordinal of the GPU named `id`, -1 when it is hidden here (CUDA_VISIBLE_DEVICES)
 * or its id is unknown. */
static int local_ordinal(const char *id) {
    int d = -1;
    if (!id[0] || cudaDeviceGetByPCIBusId(&d, id) != cudaSuccess)
        return -1;
    return d;
}

/* Whether the GPUs named a and b reach each other by CUDA P2P, as NCCL 2.28.9's p2pCanConnect
 * (src/transport/p2p.cc) decides it past its topology check: one GPU needs no P2P (NCCL refuses
 * two ranks on one GPU when the communicator is made); two GPUs this process sees are asked by
 * cudaDeviceCanAccessPeer on this process's ordinals of them; a GPU hidden here counts as
 * reachable ("CUDA 10.1 and later can use P2P with invisible devices"), NCCL then going by its
 * topology alone, which sympool cannot see. */
static bool p2p_pair(const char *a, const char *b, char *why, size_t len) {
    if (a[0] && strncmp(a, b, BUS_ID) == 0)
        return true;
    int da = local_ordinal(a), db = local_ordinal(b);
    if (da < 0 || db < 0)
        return true;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, da, db) == cudaSuccess && can)
        return true;
    snprintf(why, len, "GPU %s cannot reach GPU %s by CUDA P2P", a, b);
    return false;
}

/* The node's GPU table: every rank of the node's PCI bus id, gathered over the pool's own node
 * communicator (two pools growing at once on two threads must not interleave collectives on one
 * communicator: MPI matches them in call order) into devs + BUS_ID, node rank order (devs:
 * node_devs' buffer; this rank's id goes in its first BUS_ID bytes). Bounded by
 * SYMPOOL_SYM_TIMEOUT like a round: the rounds before it can end differently on a rank that hit
 * its deadline, which then never joins, and its node peers must get an error, not wait for good.
 * On failure devs is gone (freed, or kept with the abandoned request) and the pool is broken on
 * a timeout. */
static sp_status_t node_gather(sp_sym_state_t *st, char *devs, const char *what) {
    cudaError_t pending = cudaPeekAtLastError();
    memset(devs, 0, BUS_ID);
    if (cudaDeviceGetPCIBusId(devs, BUS_ID, st->device) != cudaSuccess)
        devs[0] = '\0'; /* unknown: counted as hidden (p2p_pair) */
    drop_errors_since(pending);
    char gwhat[192];
    snprintf(gwhat, sizeof gwhat, "%s: the node's GPU table (every node rank's PCI bus id)", what);
    return sp__sym_node_gather(st, devs, BUS_ID, gwhat);
}

/* Whether NCCL gave this world symmetric support, which 2.28 does not let one query: it is on when
 * NCCL_WIN_ENABLE and cuMem are on and every pair of this node's GPUs reaches each other by CUDA
 * P2P (reference/nccl-windows.md 1.3). Without it, 2.28 still returns success and a window that
 * is only a local buffer registration, on which the symmetric kernels never run. ids: the node's
 * GPU table (node_gather), NULL on a node of one rank. On "no", *why names the reason. */
static bool symmetric_support(const sp_sym_state_t *st, const char *ids, char *why, size_t len) {
    /* src/init.cc:58 and :1376: NCCL_WIN_ENABLE, default 1, off at 0. */
    if (nccl_param("NCCL_WIN_ENABLE", 1) == 0) {
        snprintf(why, len, "NCCL_WIN_ENABLE=%s", getenv("NCCL_WIN_ENABLE"));
        return false;
    }
    /* src/misc/cudawrap.cc:15 and :45-49: NCCL_CUMEM_ENABLE, default -2 (auto: on where cuMem
     * works, as it does where this registrar allocates), on at any positive value, off at 0 and
     * at any other negative one. */
    long long cumem = nccl_param("NCCL_CUMEM_ENABLE", -2);
    if (cumem <= 0 && cumem != -2) {
        snprintf(why, len, "NCCL_CUMEM_ENABLE=%s", getenv("NCCL_CUMEM_ENABLE"));
        return false;
    }
    if (!ids)
        return true; /* one rank on the node: trivially all P2P */
    /* Every pair of the node's GPUs, not only this rank's: NCCL's isAllCudaP2p is one answer
     * for the node's ranks (src/transport.cc:78-111), and nccl_alloc refuses ranks that differ.
     * By bus id, never by the ranks' ordinals, which name other GPUs (or none) here. */
    int n = sp__world_local_size(st->world);
    cudaError_t pending = cudaPeekAtLastError();
    bool ok = true;
    for (int i = 0; i < n && ok; i++)
        for (int j = i + 1; j < n && ok; j++)
            ok = p2p_pair(ids + (size_t)i * BUS_ID, ids + (size_t)j * BUS_ID, why, len);
    drop_errors_since(pending);
    return ok;
}

static _Atomic bool s_test_fail_devs;                       /* sp__reg_nccl_test_fail_devs */
static _Atomic bool s_test_skip_gather;                     /* sp__reg_nccl_test_skip_gather */
static void (*_Atomic s_test_at_ready)(const char *pool);   /* sp__reg_nccl_test_at_ready */
static void (*_Atomic s_test_at_release)(const char *pool); /* sp__reg_nccl_test_at_release */

/* Tests: `hook` runs on the growing thread right before the round that readies every rank for
 * the registration (NULL: none), with the pool's name, so a test can hold that round open. */
void sp__reg_nccl_test_at_ready(void (*hook)(const char *pool)) {
    s_test_at_ready = hook;
}

/* Tests: `hook` runs on a releasing thread right before it waits for its turn to deregister the
 * segment's window (NULL: none), with the pool's name. */
void sp__reg_nccl_test_at_release(void (*hook)(const char *pool)) {
    s_test_at_release = hook;
}

void sp__reg_nccl_test_fail_devs(bool on) {
    s_test_fail_devs = on;
}

/* Tests: this rank's next growths stop right before the gather of the node's GPU table, as a
 * rank whose round before it timed out (its outcome differs between ranks only near the
 * deadline) does: SP_ERR_TIMEOUT and the pool broken here, the gather never joined. */
void sp__reg_nccl_test_skip_gather(bool on) {
    s_test_skip_gather = on;
}

/* sp__reg_nccl_test_skip_gather's stop: what a rank whose last round timed out does. */
static sp_status_t skipped_gather(sp_sym_state_t *st, void *base, size_t asize, char *devs,
                                  const char *what) {
    mem_free(st->world, st->device, base, asize);
    free(devs);
    st->broken = true;
    snprintf(st->broken_why, sizeof st->broken_why, "%s timed out (test: the gather skipped)",
             what);
    return sp__error(SP_ERR_TIMEOUT, SP_SUB_SYM, "%s: timed out (test: the gather skipped)", what);
}

/* node_gather's buffer (this rank's bus id, then the node's table), allocated before
 * nccl_alloc's first round, whose ok flag carries the outcome: a rank that could not have it
 * after the round would skip the gather, and its node peers would wait there until their
 * deadline. True with *devs_p (NULL on a node of one rank, which gathers nothing); false when
 * host malloc refused it. */
static bool node_devs(const sp_sym_state_t *st, char **devs_p) {
    int n = sp__world_local_size(st->world);
    *devs_p = n > 1 ? malloc((size_t)BUS_ID * ((size_t)n + 1)) : NULL;
    if (n > 1 && s_test_fail_devs) {
        free(*devs_p);
        *devs_p = NULL;
    }
    return n <= 1 || *devs_p != NULL;
}

/* The first ready round's outcome: every rank's libnccl.so.2 has the window calls and every rank
 * has node_devs' table and the segment's release record (f[1]: 1 on a rank without them), or
 * none registers. */
static sp_status_t ready_status(const sp_agree_t *api, bool have_devs, const char *what) {
    char ranks[96];
    if (!have_devs)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_SYM,
                         "%s: out of host memory for the table of this node's devices or for "
                         "the segment's release record",
                         what);
    if (api->nbad && api->hi[1] != 0)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_SYM,
                         "%s: %s had no host memory for the table of its node's devices or a "
                         "release record, or lacks NCCL's window calls (its log says which); no "
                         "rank registers",
                         what, sp__agree_bad_ranks(api, ranks, sizeof ranks));
    if (api->nbad) {
        int v = 0;
        (void)ncclGetVersion(&v);
        return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_SYM,
                         "%s: the libnccl.so.2 loaded on %s lacks ncclMemAlloc or the window "
                         "calls (NCCL >= 2.27 needed; loaded here: %d); put a newer NCCL first "
                         "on LD_LIBRARY_PATH",
                         what, sp__agree_bad_ranks(api, ranks, sizeof ranks), v);
    }
    return SP_SUCCESS;
}

/* Ranks that differ in NCCL's symmetric support (NCCL_WIN_ENABLE, NCCL_CUMEM_ENABLE, P2P between
 * the node's GPUs): NCCL 2.28.9's window registration is a local buffer registration where the
 * support is off (src/dev_runtime.cc:593-597) and ends in a bootstrap barrier over every rank
 * where it is on (:628-629), so the ranks with support would wait there for good. */
static sp_status_t support_mismatch(const sp_world_t *w, bool symmetric, const char *what) {
    const char *mine = symmetric ? "on" : sp__world_nccl_no_symmetric(w);
    return sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                     "%s: NCCL's symmetric support differs across ranks (this rank: %s); NCCL "
                     "would make a symmetric window on some ranks and a local registration on "
                     "the others and wait inside ncclCommWindowRegister: give every rank the "
                     "same NCCL_WIN_ENABLE and NCCL_CUMEM_ENABLE; nothing was registered",
                     what, mine ? mine : "off");
}

/* Whether the world still has its NCCL communicator. Not under the world's NCCL lock: a
 * collective of this rank may hold it inside NCCL, waiting for a peer's collective that waits at
 * the peer's gate for this growth (world/world.h). */
static bool world_has_nccl(sp_world_t *w) {
    return sp__world_nccl_comm(w) != NULL;
}

/* Every change to the set of windows on a world's communicator (a registration, a deregistration,
 * a retry of what a refusal kept) is made in a turn of the world's order (world.h), on every rank
 * in the same order: NCCL gives a new window's allocation the lowest free place in its big VA
 * space on each rank alone (2.28.9 src/dev_runtime.cc symMemoryObtain -> ncclSpaceAlloc), so a
 * deregistration that came before a registration on one rank and after it on another, from
 * two threads working on two pools, would give the new window different places on the two. */

/* This rank's wait for turn `ticket`; SP_SUCCESS when it holds the turn (end it with
 * sp__world_nccl_end_turn). A wait that timed out breaks the order: an earlier turn never
 * ended, and neither will the ones after it. */
static sp_status_t take_turn(sp_world_t *w, uint64_t ticket, const char *what) {
    sp_status_t t = sp__world_nccl_wait_turn(w, ticket, what);
    if (t == SP_ERR_TIMEOUT)
        sp__world_nccl_order_break(w,
                                   "a window change waited out SYMPOOL_SYM_TIMEOUT for its turn");
    return t;
}

/* The ticket of a deregistration or retry (collective: every rank calls it for the same change,
 * in the same order): rank 0's, carried to every rank by a round on the pool's communicator.
 * SP_SUCCESS with *ticket_p; otherwise no rank can be sure of the ticket, so the world's order is
 * broken (its later registrations are refused, with the reason) and the change is made out of
 * turn, where no later registration can meet it. */
static sp_status_t change_ticket(sp_sym_state_t *st, const char *what, uint64_t *ticket_p) {
    sp_world_t *w = st->world;
    int64_t mine = st->rank == 0 ? (int64_t)sp__world_nccl_ticket(w) : -1;
    sp_agree_t a = {.op = SP_AGREE_SYM_RELEASE, .ok = true, .f = {mine}};
    sp_status_t s = st->broken
                        ? sp__error(SP_ERR_TIMEOUT, SP_SUB_SYM, "%s: %s", what, st->broken_why)
                        : sp__sym_round(st, &a, what);
    if (s == SP_SUCCESS && a.hi[0] < 0)
        s = sp__error(SP_ERR_INTERNAL, SP_SUB_SYM, "%s: no ticket from rank 0", what);
    if (s != SP_SUCCESS) {
        char why[200];
        snprintf(why, sizeof why, "the round that orders a deregistration failed (%s)",
                 sp_status_name(s));
        sp__world_nccl_order_break(w, why);
        return s;
    }
    *ticket_p = (uint64_t)a.hi[0];
    return SP_SUCCESS;
}

/* After the ready round `a` succeeded: the registration in its agreed turn (a->hi[2], rank 0's
 * ticket), under the world's NCCL lock for the NCCL call alone. NCCL needs its collective calls
 * on one communicator in the same order on every rank and no two threads in it at once; taking
 * turns in the order agreed in the round gives both without holding a lock while ranks wait
 * for each other's rounds (reference/nccl-windows.md 1.4; a turn waits only for registrations
 * that every rank has already reached). The world's NCCL collectives are put in one order with
 * it on every rank by the world's gate (world/world.h): closed in the turn (*gated: the caller
 * opens it once the registration's outcome is known), the ranks agree how many collectives go
 * first, and each rank waits until those are out of NCCL. A turn agreed away (a rank without a
 * communicator, symmetric support differing: *mismatch) is taken and passed on without the NCCL
 * call. */
static sp_status_t register_in_turn(sp_sym_state_t *st, const sp_agree_t *a, void *base,
                                    size_t asize, bool *mismatch, bool *declined, bool *gated,
                                    ncclWindow_t *win, bool *registered, const char *what) {
    sp_world_t *w = st->world;
    uint64_t ticket = (uint64_t)a->hi[2];
    sp_status_t t = take_turn(w, ticket, what);
    bool turn = t == SP_SUCCESS;
    /* Every rank holds the turn, so every rank is done with the turns before it: no rank closes
     * its gate while a peer's earlier change to the windows may still wait for that peer's NCCL
     * lock, held by a collective that waits for the closing rank's. */
    sp_agree_t g = {.op = SP_AGREE_NCCL_READY, .ok = turn};
    sp_status_t s = sp__sym_round(st, &g, what);
    /* Then the gate: this rank's collectives past it so far, and the ranks' largest count. */
    uint64_t first = 0;
    if (s == SP_SUCCESS && !g.nbad) {
        sp_agree_t n = {.op = SP_AGREE_NCCL_READY, .ok = true};
        n.f[0] = (int64_t)sp__world_nccl_gate_close(w);
        *gated = true;
        s = sp__sym_round(st, &n, what);
        first = (uint64_t)n.hi[0];
    }
    if (s != SP_SUCCESS) { /* the outcome is unknown: grow's last round says what follows */
        if (turn)
            sp__world_nccl_end_turn(w, ticket);
        return s;
    }
    sp_status_t d = SP_SUCCESS;
    char drain_why[320] = "";
    if (!g.nbad && (d = sp__world_nccl_gate_drain(w, first, what)) != SP_SUCCESS)
        snprintf(drain_why, sizeof drain_why, "%s", sp_last_error());
    bool ready = turn && d == SP_SUCCESS;
    /* In the turn, with no collective of this rank in NCCL: what earlier refused releases kept is
     * tried again, and the ranks compare what is still kept before any enters NCCL
     * (kept_windows); a rank that could not wait for its collectives says so there, and no rank
     * registers. */
    int64_t kept = 0, kept_sum = 0;
    if (ready) {
        retry_left(w);
        kept_sum = kept_windows(w, &kept);
    }
    sp_agree_t k = {.op = SP_AGREE_NCCL_READY, .ok = ready, .f = {kept_sum, kept}};
    s = sp__sym_round(st, &k, what);
    if (s != SP_SUCCESS) {
        if (turn)
            sp__world_nccl_end_turn(w, ticket);
        return s;
    }
    char ranks[96];
    if (a->nbad) {
        /* The ranks the round names; on such a rank the wait for the turn said why (an abort
         * there broke the order), and here that rank's own reason would be an empty one. */
        s = turn ? sp__error(SP_ERR_NCCL, SP_SUB_SYM,
                             "%s: %s has no NCCL communicator (aborted there: its log says "
                             "why); nothing was registered",
                             what, sp__agree_bad_ranks(a, ranks, sizeof ranks))
                 : t;
    } else if (g.nbad) {
        *declined = true; /* agreed by every rank before any enters NCCL */
        s = turn ? sp__error(SP_ERR_NCCL, SP_SUB_SYM,
                             "%s: %s could not take its turn to register (its log says why); "
                             "no rank registers",
                             what, sp__agree_bad_ranks(&g, ranks, sizeof ranks))
                 : t;
    } else if (k.nbad) {
        *declined = true; /* likewise */
        s = d != SP_SUCCESS ? sp__error(d, SP_SUB_SYM, "%s; no rank registers", drain_why)
                            : sp__error(SP_ERR_TIMEOUT, SP_SUB_SYM,
                                        "%s: %s could not wait for its collectives already in "
                                        "NCCL (its log says why); no rank registers",
                                        what, sp__agree_bad_ranks(&k, ranks, sizeof ranks));
    } else if (k.lo[0] != k.hi[0] || k.lo[1] != k.hi[1]) {
        *declined = true;
        s = sp__error(
            SP_ERR_NCCL, SP_SUB_SYM,
            "%s: the ranks hold different NCCL windows whose deregistration NCCL refused "
            "(between %lld and %lld such windows a rank; this rank %lld): NCCL would place a new "
            "window at different offsets of its symmetric address space on different ranks, "
            "which its symmetric kernels cannot use, so no rank registers until every rank has "
            "let go of them (each growth, release and sp_symmetric_empty_cache tries again)",
            what, (long long)k.lo[1], (long long)k.hi[1], (long long)kept);
    } else if (a->lo[1] != a->hi[1])
        *mismatch = true;
    else {
        sp__world_nccl_lock(w);
        ncclComm_t nc = (ncclComm_t)sp__world_nccl_comm(w);
        ncclResult_t r = nc ? ncclCommWindowRegister(nc, base, asize, win, NCCL_WIN_COLL_SYMMETRIC)
                            : ncclInvalidUsage;
        *registered = r == ncclSuccess;
        /* The error text under the lock: an abort may free the communicator once it is let go. */
        if (!nc)
            s = sp__error(SP_ERR_NCCL, SP_SUB_SYM, "%s: %s", what, sp__world_nccl_why(w));
        else if (!*registered)
            s = nccl_err(r, nc, "ncclCommWindowRegister");
        sp__world_nccl_unlock(w);
    }
    if (turn)
        sp__world_nccl_end_turn(w, ticket);
    return s;
}

static sp_status_t grow(sp_sym_state_t *st, size_t size, bool have_keep, sp_sym_seg_t *seg_p) {
    sp_world_t *w = st->world;
    size_t gran = vmm_granularity(st->device);
    size_t align =
        gran % NCCL_WIN_REQUIRED_ALIGNMENT == 0 ? gran : gran * NCCL_WIN_REQUIRED_ALIGNMENT;
    size_t asize = align_up(size, align);
    char what[128];
    snprintf(what, sizeof what, "NCCL window of %zu bytes for symmetric pool \"%s\"", asize,
             st->name);
    char *devs = NULL;
    bool have_devs = node_devs(st, &devs);
    if (!have_keep) {
        free(devs);
        devs = NULL;
        have_devs = false;
    }
    sp_agree_t api = {.op = SP_AGREE_NCCL_READY,
                      .ok = window_api_loaded() && have_devs,
                      .f = {(int64_t)asize, !have_devs}};
    sp_status_t rs = sp__sym_round(st, &api, what);
    if (rs == SP_SUCCESS)
        rs = ready_status(&api, have_devs, what);
    void *base = NULL;
    if (rs == SP_SUCCESS)
        rs = alloc_everywhere(st, asize, what, &base);
    if (rs != SP_SUCCESS) {
        free(devs);
        return rs;
    }
    if (s_test_skip_gather)
        return skipped_gather(st, base, asize, devs, what);
    /* The gather before any rank looks at its own NCCL settings: every rank of the node is in
     * it whatever they say, or a rank whose NCCL_WIN_ENABLE differs would leave its node peers
     * waiting there until their deadline. */
    if (devs && (rs = node_gather(st, devs, what)) != SP_SUCCESS) {
        /* No rank has registered or taken a ticket yet: this growth's memory is all to undo. */
        mem_free(st->world, st->device, base, asize);
        return rs;
    }
    char no_sym[96] = "";
    bool sym = symmetric_support(st, devs ? devs + BUS_ID : NULL, no_sym, sizeof no_sym);
    sp__world_set_nccl_symmetric(w, sym, no_sym);
    free(devs);
    bool symmetric = sp__world_nccl_no_symmetric(w) == NULL;

    /* Every rank ready, and the registration's place in the world's order (rank 0's ticket,
     * handed out now that every rank has reached this growth); no lock held across the round. */
    void (*at_ready)(const char *) = s_test_at_ready;
    if (at_ready)
        at_ready(st->name);
    int64_t ticket = st->rank == 0 ? (int64_t)sp__world_nccl_ticket(w) : -1;
    sp_agree_t a = {.op = SP_AGREE_NCCL_READY,
                    .ok = world_has_nccl(w),
                    .f = {(int64_t)asize, symmetric, ticket}};
    sp_status_t s = sp__sym_round(st, &a, what);
    if (s != SP_SUCCESS) {
        /* Rank 0 handed out this registration's ticket, and no rank will take its turn (a rank
         * that timed out or was in another call may not even know it): every later ticket would
         * wait for it until SYMPOOL_SYM_TIMEOUT. The world's registrations stop here, each
         * later one refused with the reason at once, on every rank the round failed on. */
        char why[160];
        snprintf(why, sizeof why, "the ready round of an earlier registration failed (%s)",
                 sp_status_name(s));
        sp__world_nccl_order_break(w, why);
    }
    bool mismatch = false, declined = false, gated = false;
    ncclWindow_t win = NULL; /* 2.28 may return success without writing it */
    bool registered = false;
    if (s == SP_SUCCESS)
        s = register_in_turn(st, &a, base, asize, &mismatch, &declined, &gated, &win, &registered,
                             what);
    if (mismatch || declined) {
        /* Agreed on every rank before any enters NCCL, so none needs an abort (declined: in the
         * turn, register_in_turn's rounds). */
        if (gated)
            sp__world_nccl_gate_open(w);
        mem_free(st->world, st->device, base, asize);
        return mismatch ? support_mismatch(w, symmetric, what) : s;
    }
    sp_agree_t c = {.op = SP_AGREE_SYM_REGISTER, .ok = registered, .f = {(int64_t)asize}};
    sp_status_t cs = st->broken ? SP_ERR_TIMEOUT : sp__sym_round(st, &c, what);
    if (cs == SP_SUCCESS && !c.nbad) {
        if (gated) /* the registration's outcome is known: later collectives go on */
            sp__world_nccl_gate_open(w);
        static atomic_bool warned;
        if (!win)
            SP_INFO(SP_SUB_SYM,
                    "NCCL gave no window for %zu bytes at %p (symmetric support off?): "
                    "collectives on it take NCCL's regular path",
                    asize, base);
        else if (!symmetric && !atomic_exchange(&warned, true))
            SP_WARN(SP_SUB_SYM,
                    "%s, and collectives on symmetric pools take NCCL's regular kernels",
                    sp__world_nccl_no_symmetric(w));
        memset(seg_p, 0, sizeof *seg_p);
        seg_p->base = base;
        seg_p->size = size;
        seg_p->alloc_size = asize;
        seg_p->window = win;
        seg_p->mpi_win = MPI_WIN_NULL;
        /* Without symmetric support NCCL makes a local registration (:593-597): no place. */
        seg_p->order = symmetric ? (uint64_t)a.hi[2] : NO_PLACE;
        SP_INFO(SP_SUB_SYM, "nccl registrar: %s %p on %zu bytes at %p (granularity %zu)",
                !win        ? "no window"
                : symmetric ? "symmetric window"
                            : "local registration (no symmetric support)",
                (void *)win, asize, base, gran);
        return SP_SUCCESS;
    }
    /* A rank's registration failed (or the outcome is unknown): peers may be blocked inside
     * NCCL's part of that registration, which only an abort releases. */
    if (registered && win) {
        sp__world_nccl_lock(w);
        if (sp__world_nccl_comm(w))
            (void)ncclCommWindowDeregister((ncclComm_t)sp__world_nccl_comm(w), win);
        sp__world_nccl_unlock(w);
    }
    sp__world_nccl_abort(w, what);
    /* Only now: a collective let into NCCL before the abort could wait there for peers held up
     * inside the failed registration, holding the lock the abort needs. */
    if (gated)
        sp__world_nccl_gate_open(w);
    mem_free(st->world, st->device, base, asize);
    if (s != SP_SUCCESS)
        return s;
    if (cs != SP_SUCCESS)
        return cs;
    char ranks[96];
    return sp__error(SP_ERR_NCCL, SP_SUB_SYM,
                     "%s: ncclCommWindowRegister failed on %s; the world's NCCL "
                     "communicator was aborted so that no rank waits inside NCCL",
                     what, sp__agree_bad_ranks(&c, ranks, sizeof ranks));
}

/* A growth, with the record that keeps its segment should its release be refused made first:
 * a refusal then needs no memory, so no refused window goes unrecorded (kept_windows). */
static sp_status_t nccl_alloc(sp_sym_state_t *st, size_t size, sp_sym_seg_t *seg_p) {
    left_t *keep = malloc(sizeof *keep);
    sp_status_t s = grow(st, size, keep != NULL, seg_p);
    if (s == SP_SUCCESS)
        seg_p->keep = keep;
    else
        free(keep);
    return s;
}

/* The whole device, not the segments' streams: sympool lets a user destroy a stream while
 * blocks allocated on it are cached, and synchronizing a destroyed stream is undefined. A release
 * is rare (empty_cache, pool destruction), so the wider wait costs little. */
static sp_status_t device_sync(const sp_sym_state_t *st, const char *why) {
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    cudaError_t ce = cudaSetDevice(st->device);
    if (ce == cudaSuccess)
        ce = cudaDeviceSynchronize();
    sp__cuda_restore_device(st->device, prev);
    return ce == cudaSuccess ? SP_SUCCESS : cuda_err(ce, why);
}

static void nccl_retry_kept(sp_sym_state_t *st) {
    char what[160];
    snprintf(what, sizeof what, "retrying what refused releases kept, symmetric pool \"%s\"",
             st->name);
    uint64_t ticket = 0;
    if (change_ticket(st, what, &ticket) != SP_SUCCESS ||
        take_turn(st->world, ticket, what) != SP_SUCCESS)
        return; /* tried again at the world's next change, and at sp_world_finalize */
    retry_left(st->world);
    sp__world_nccl_end_turn(st->world, ticket);
}

static sp_status_t nccl_quiesce(sp_sym_state_t *st) {
    return device_sync(st, "cudaDeviceSynchronize before releasing symmetric segments");
}

static sp_status_t nccl_release(sp_sym_state_t *st, sp_sym_seg_t *seg, void *stream) {
    sp_world_t *w = st->world;
    (void)stream; /* see device_sync */
    sp_status_t s = device_sync(st, "cudaDeviceSynchronize before deregistering a window");
    char sync_msg[512];
    snprintf(sync_msg, sizeof sync_msg, "%s", s == SP_SUCCESS ? "" : sp_last_error());
    char what[160];
    snprintf(what, sizeof what, "releasing a segment of symmetric pool \"%s\"", st->name);
    /* The deregistration in its turn (above take_turn), with what earlier releases on the world
     * kept tried again first: local calls, no rank waits for another inside the turn. */
    uint64_t ticket = 0;
    sp_status_t o = change_ticket(st, what, &ticket);
    void (*at_release)(const char *) = s_test_at_release;
    if (at_release)
        at_release(st->name);
    /* A turn that cannot come (the order broken, by an abort or a timeout) refuses every later
     * registration on this rank: the change is made out of turn then, and it is not the
     * release's error. */
    bool turn = o == SP_SUCCESS && take_turn(w, ticket, what) == SP_SUCCESS;
    if (turn)
        retry_left(w);
    /* What is refused is kept for another try (let_go), not forgotten: the segment is off the
     * pool's books on every rank either way, so the ranks stay in step. */
    sp_status_t r = let_go(w, st->device, seg->window, seg->order, seg->base, seg->alloc_size,
                           seg->keep, s == SP_SUCCESS, what);
    if (turn)
        sp__world_nccl_end_turn(w, ticket);
    seg->window = NULL;
    seg->base = NULL;
    seg->keep = NULL;
    if (s != SP_SUCCESS)
        return sp__error_quiet(s, SP_SUB_SYM, "%s", sync_msg);
    if (r != SP_SUCCESS)
        return r;
    return o; /* a failed order round's own status and message */
}

static sp_status_t nccl_peer_ptr(sp_world_t *w, const sp_sym_seg_t *seg, int rank, size_t offset,
                                 void **ptr_p) {
    (void)w;
    (void)seg;
    (void)offset;
    (void)ptr_p;
    return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_SYM,
                     "sp_symmetric_peer_ptr(rank %d): host-side peer pointers need NCCL 2.29 "
                     "(this build has NCCL %d); use NCCL's device API on the window instead",
                     rank, NCCL_VERSION_CODE);
}

const sp_registrar_ops_t sp__registrar_nccl = {
    .name = "nccl",
    .alloc = nccl_alloc,
    .release = nccl_release,
    .quiesce = nccl_quiesce,
    .retry_kept = nccl_retry_kept,
    .peer_ptr = nccl_peer_ptr,
};

#else
#include "symmetric/registrar.h"

/* Without NCCL there is no table to fail, no gather to skip and no registration to hold. */
void sp__reg_nccl_test_fail_devs(bool on) {
    (void)on;
}
void sp__reg_nccl_test_skip_gather(bool on) {
    (void)on;
}
void sp__reg_nccl_test_at_ready(void (*hook)(const char *pool)) {
    (void)hook;
}
void sp__reg_nccl_test_at_release(void (*hook)(const char *pool)) {
    (void)hook;
}
#endif
