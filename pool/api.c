/*
 * api.c: the life cycle of the per-device allocators (lazy init from the environment, shutdown
 * back to nothing so that the next call re-initializes) and the thin public calls of pool.h
 * that are not malloc/free: backend and device queries, streams, memory info, the memory
 * fraction and sp_empty_cache.
 *
 * sp__ready is set (release) only after every device allocator is complete, so a reader that
 * sees it (acquire) sees the whole sp__g. Init and shutdown serialize on sp__g.init_lock and
 * take device locks after it, in device order. Shutdown first closes the gate (below) and waits
 * for the cold calls inside; the allocation path is the caller's to stop (pool.h).
 */
#include <assert.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sympool/experimental.h"

#include "pool/allocator.h"
#include "pool/fork.h"
#include "pool/handles.h"
#include "pool/history.h"
#include "pool/release.h"
#include "pool/mempool.h"
#include "pool/thread_cache.h"
#include "pool/torch.h"

sp_alloc_global_t sp__g = {.init_lock = PTHREAD_MUTEX_INITIALIZER};
atomic_int sp__ready;

/* The shutdown gate (allocator.h). Sequentially consistent: a call counts itself in, then looks
 * at `closing`; shutdown sets `closing`, then looks at the count. Either the call sees closing
 * (and leaves) or shutdown sees the call (and waits for it). */
static atomic_int s_inside;
static atomic_int s_closing;
static pthread_mutex_t s_shutdown_lock = PTHREAD_MUTEX_INITIALIZER; /* one shutdown at a time */
static _Thread_local int tl_inside; /* this thread's share of s_inside (fork: see below) */

sp_gate_t sp__gate_enter(void) {
    if (sp__in_callback())
        return (sp_gate_t){.in = false};
    atomic_fetch_add(&s_inside, 1);
    if (SP_LIKELY(!atomic_load(&s_closing))) {
        tl_inside++;
        return (sp_gate_t){.in = true};
    }
    atomic_fetch_sub(&s_inside, 1);
    return (sp_gate_t){.in = false};
}

void sp__gate_leave(sp_gate_t *g) {
    if (!g->in)
        return;
    tl_inside--;
    if (SP_LIKELY(atomic_load_explicit(&sp__handles_npending, memory_order_relaxed) == 0) ||
        tl_inside > 0) {
        atomic_fetch_sub(&s_inside, 1);
        return;
    }
    /* Released pools wait (handles.c): take them before counting out. Were we the last call
     * inside, every call that could have read one unmarked (it entered before the mark, so
     * before the take) has left, and a call entering from now on sees the mark. */
    void *list = sp__handles_take_pending();
    /* The malloc and free paths are outside the gate: one that dropped a pool under its device
     * lock (a release of its last segment: the OOM retry, SYMPOOL_NO_CACHING's free) reads the
     * struct until it unlocks (the walk's `next`, the segment allocator's free). Taking each
     * such lock once, before counting out, waits for that: later holders cannot reach a
     * dropped pool. No lock is held here (gated calls take none into a nested gate). */
    sp__handles_wait_droppers(list);
    /* Last inside: count out and release. Else put the list back while still counted in: put
     * back after counting out, it could miss the take of an sp_shutdown that saw the count at 0
     * and freed the devices, and wait into the next session with stale `dev` pointers. */
    int last = 1;
    if (atomic_compare_exchange_strong(&s_inside, &last, 0)) {
        sp__handles_release(list);
        return;
    }
    sp__handles_put_back(list);
    atomic_fetch_sub(&s_inside, 1);
}

/* fork(): prepare takes the shutdown lock before init_lock (sp_shutdown's order), so no shutdown
 * is under way across the fork and the gate is open. The calls other threads had counted in do
 * not exist in the child: it keeps only the forking thread's own, or its sp_shutdown would wait
 * for them forever. */
void sp__gate_fork_lock(void) {
    pthread_mutex_lock(&s_shutdown_lock);
}

void sp__gate_fork_unlock(bool in_child) {
    if (in_child)
        atomic_store(&s_inside, tl_inside);
    pthread_mutex_unlock(&s_shutdown_lock);
}

sp_status_t sp__gate_refused(const char *fn) {
    if (sp__in_callback())
        return sp__callback_refused(fn);
    return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                     "%s: called while sp_shutdown runs in another thread; nothing was done", fn);
}

static void dev_fini(sp_devalloc_t *d) {
    sp_mempool_t *p = d->pools;
    while (p) {
        sp_mempool_t *nx = p->next;
        sp__mempool_retire(p);
        p = nx;
    }
    if (d->default_pool)
        sp__mempool_retire(d->default_pool);
    sp__block_slabs_free(d);
    sp__ptr_map_fini(&d->map);
    sp__alloc_events_fini(d);
    sp__gap_free(&d->segs);
}

/* The cap of a fraction in [0, 1] of the device (d->lock, or d not yet shared): one place for
 * start-up (ALLOC_CONF) and sp_set_memory_fraction, so the two cannot set it differently. */
static void set_fraction(sp_devalloc_t *d, double f) {
    d->allowed_max = f < 1.0 ? (size_t)(f * (double)d->total_mem) : SIZE_MAX;
    d->fraction = f;
    d->gc_enabled = d->allowed_max != SIZE_MAX && sp__g.conf.gc_threshold > 0.0;
}

static sp_status_t dev_init(sp_devalloc_t *d, int device) {
    memset(d, 0, sizeof(*d));
    sp__lock_init(&d->lock);
    d->device = device;
    sp__block_slabs_adopt(d);
    sp__stats_init(&d->stats, sp__g.conf.max_split_size);
    size_t total = 0;
    /* Not mem_get_info: on cuda that would make a context on every device at start-up. */
    SP_CHECK(sp__g.ops->mem_total(device, &total));
    d->total_mem = total;
    /* ALLOC_CONF's per_process_memory_fraction (1.0 when unset): as sp_set_memory_fraction at
     * start-up. */
    set_fraction(d, sp__g.conf.memory_fraction);
    SP_CHECK(sp__ptr_map_init(&d->map));
    d->default_pool = sp__mempool_new(d, NULL, true, false);
    if (!d->default_pool)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_POOL, "out of host memory for the default pool");
    return SP_SUCCESS;
}

sp_status_t sp__alloc_init_slow(void) {
    sp__fork_register(); /* before init_lock: see pool/fork.h */
    if (SP_UNLIKELY(sp__fork_child_off()))
        return sp__fork_error("sympool");
    pthread_mutex_lock(&sp__g.init_lock);
    if (atomic_load_explicit(&sp__ready, memory_order_acquire)) {
        pthread_mutex_unlock(&sp__g.init_lock);
        return SP_SUCCESS;
    }
    /* The struct arena's address space first (once per process), before any device memory: a
     * range reserved between two device mappings would change where the host backend's next
     * mappings land, and so the address order best fit breaks ties by. */
    if (!sp__arena_ready()) {
        pthread_mutex_unlock(&sp__g.init_lock);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_POOL,
                         "cannot reserve address space for block structs (%d MiB at least)", 64);
    }
    sp_status_t s = sp__device_select(&sp__g.ops, &sp__g.caps);
    if (s != SP_SUCCESS) {
        pthread_mutex_unlock(&sp__g.init_lock);
        return s;
    }
    sp__alloc_conf_get(&sp__g.conf);
    sp__g.round_plain = true;
    for (int i = 0; i < 16; i++)
        if (sp__g.conf.roundup_divisions[i] > 1)
            sp__g.round_plain = false;
    sp__g.hit_plain = sp__g.round_plain && !sp__g.conf.no_caching;
    sp__g.exp_on = sp__g.conf.expandable_segments && !sp__g.conf.no_caching && sp__g.caps.has_vmm &&
                   sp__g.ops->vmm_reserve && sp__g.ops->vmm_map && sp__g.ops->vmm_unmap &&
                   sp__g.ops->vmm_release;
    sp__g.hit_fast = sp__g.hit_plain && !sp__g.exp_on;
    /* The thread cache serves 512-byte-rounded sizes from fixed segments only; with it on,
     * sp_malloc's plain call-free hit (which takes the device lock) gives way to it: a copy of
     * the hit with the cache in front runs instead (allocator.c's only_tc_off). */
    size_t tc = (size_t)sp__option_int(SP_OPT_THREAD_CACHE);
    sp__g.tc_limit = sp__g.hit_fast ? tc : 0;
    if (tc && !sp__g.tc_limit)
        SP_INFO(SP_SUB_INIT, "SYMPOOL_THREAD_CACHE is ignored: %s",
                sp__g.conf.no_caching ? "SYMPOOL_NO_CACHING is on"
                : !sp__g.round_plain  ? "roundup_power2_divisions is set"
                                      : "expandable segments are on");
    if (sp__g.tc_limit)
        sp__g.hit_fast = false;
    sp__g.exp_recycle = sp__option_int(SP_OPT_EXPANDABLE_RECYCLE) != 0;
    sp__g.exp_borrow = sp__option_int(SP_OPT_EXPANDABLE_BORROW) != 0;
    sp__g.exp_shared = sp__g.exp_borrow ? (size_t)sp__option_int(SP_OPT_EXPANDABLE_SHARED) : 0;
    sp__g.exp_align = sp__g.exp_recycle && sp__option_int(SP_OPT_EXPANDABLE_ALIGN) != 0;
    sp__g.exp_align_small = sp__g.exp_align && sp__option_int(SP_OPT_EXPANDABLE_ALIGN_SMALL) != 0;
    sp__g.exp_fit_end = sp__g.exp_align && sp__option_int(SP_OPT_EXPANDABLE_FIT_END) != 0;
    sp__g.exp_whole = sp__g.exp_align && sp__option_int(SP_OPT_EXPANDABLE_WHOLE) != 0;
    sp__g.exp_align_skip = sp__option_double(SP_OPT_EXPANDABLE_ALIGN_SKIP);
    sp__g.exp_side = sp__g.exp_recycle && sp__option_int(SP_OPT_EXPANDABLE_SIDE) != 0;
    sp__g.exp_pin = sp__g.exp_recycle && sp__option_int(SP_OPT_EXPANDABLE_PIN) != 0;
    sp__g.exp_page = (size_t)sp__option_int(SP_OPT_EXPANDABLE_PAGE);
    if (sp__g.exp_page && sp__g.caps.vmm_granularity)
        sp__g.exp_page = (sp__g.exp_page + sp__g.caps.vmm_granularity - 1) /
                         sp__g.caps.vmm_granularity * sp__g.caps.vmm_granularity;
    if (sp__g.conf.expandable_segments && !sp__g.exp_on)
        SP_WARN(SP_SUB_INIT, "expandable_segments:True is ignored: %s; segments are fixed-size",
                sp__g.conf.no_caching ? "SYMPOOL_NO_CACHING is on"
                                      : "this backend or device has no virtual memory support");
    int n = sp__g.caps.device_count;
    sp__g.devs = calloc(n > 0 ? (size_t)n : 1, sizeof(*sp__g.devs));
    if (!sp__g.devs) {
        pthread_mutex_unlock(&sp__g.init_lock);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_POOL, "out of host memory at init");
    }
    int ok = 0;
    for (; ok < n; ok++) {
        s = dev_init(&sp__g.devs[ok], ok);
        if (s != SP_SUCCESS) {
            dev_fini(&sp__g.devs[ok]);
            break;
        }
    }
    /* The device locks are biased, each to the first thread that takes it (core_lock.h),
     * unless biasing is off here. */
    if (s == SP_SUCCESS && sp__lock_bias_begin())
        for (int i = 0; i < n; i++)
            sp__lock_bias(&sp__g.devs[i].lock);
    if (s == SP_SUCCESS)
        sp__alloc_hits_choose();
    if (s != SP_SUCCESS) {
        for (int i = 0; i < ok; i++)
            dev_fini(&sp__g.devs[i]);
        free(sp__g.devs);
        sp__g.devs = NULL;
        sp__device_reset();
        pthread_mutex_unlock(&sp__g.init_lock);
        return s;
    }
    sp__g.ndev = n;
    char mss[32] = "unlimited"; /* SIZE_MAX means no limit, not 16 EiB */
    if (sp__g.conf.max_split_size != SIZE_MAX)
        snprintf(mss, sizeof(mss), "%zu", sp__g.conf.max_split_size);
    SP_INFO(SP_SUB_INIT,
            "allocator ready: backend %s, %d device(s), max_split_size %s, "
            "no_caching %d, expandable_segments %d, thread_cache %zu",
            sp__g.ops->name, n, mss, (int)sp__g.conf.no_caching, (int)sp__g.exp_on, sp__g.tc_limit);
    atomic_store_explicit(&sp__ready, 1, memory_order_release);
    /* The thread cache's frees look in the thread's own table first, so with it on sp_free's
     * plain call-free form steps aside as for caching off (its copy with the cache in front runs
     * instead: SP_FAST_TC_REST). */
    sp__g.fast_rest = (sp__g.hit_fast ? 0 : SP_FAST_NO_HIT) +
                      ((sp__g.conf.no_caching || sp__g.tc_limit) ? SP_FAST_REASON : 0);
    assert(!sp__g.tc_limit || sp__g.fast_rest == SP_FAST_TC_REST); /* sp_malloc's test */
    sp__fast_off_add(sp__g.fast_rest - SP_FAST_NOT_READY);
    pthread_mutex_unlock(&sp__g.init_lock);
    return SP_SUCCESS;
}

sp_status_t sp__alloc_device(const char *fn, int device, sp_devalloc_t **d_p) {
    SP_CHECK(sp__alloc_ensure());
    if (SP_UNLIKELY(device < 0 || device >= sp__g.ndev))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "%s: device %d does not exist (the %s backend has %d device(s))", fn,
                         device, sp__g.ops->name, sp__g.ndev);
    *d_p = &sp__g.devs[device];
    return SP_SUCCESS;
}

const void *sp__pool_swap_device_ops(const void *ops) {
    const void *old = sp__g.ops;
    sp__g.ops = (const sp_device_ops_t *)ops;
    return old;
}

SP_EXPORT sp_status_t sp_init(void) {
    if (sp__in_callback())
        return sp__callback_refused("sp_init");
    return sp__alloc_ensure();
}

/* Release every segment of a pool whatever its state (shutdown: nothing is allocated). */
static void release_all(sp_devalloc_t *d, sp_mempool_t *p) {
    sp__alloc_release_pool(d, p, false, NULL, 0);
    if (p->nsegments)
        SP_WARN(SP_SUB_POOL, "pool \"%s\": %zu segment(s) could not be released at shutdown",
                p->name ? p->name : "", p->nsegments);
}

static sp_status_t shutdown_locked(void);

SP_EXPORT sp_status_t sp_shutdown(void) {
    if (sp__in_callback())
        return sp__callback_refused("sp_shutdown");
    pthread_mutex_lock(&s_shutdown_lock);
    /* Close the gate, then wait for the calls already inside: they hold no lock shutdown needs
     * first (init_lock is taken only after they left), so the wait ends. */
    atomic_store(&s_closing, 1);
    while (atomic_load(&s_inside) > 0)
        sched_yield();
    sp_status_t s = shutdown_locked();
    atomic_store(&s_closing, 0);
    pthread_mutex_unlock(&s_shutdown_lock);
    return s;
}

static sp_status_t shutdown_locked(void) {
    pthread_mutex_lock(&sp__g.init_lock);
    if (!atomic_load_explicit(&sp__ready, memory_order_acquire)) {
        pthread_mutex_unlock(&sp__g.init_lock);
        return SP_SUCCESS;
    }
    for (int i = 0; i < sp__g.ndev; i++)
        sp__lock(&sp__g.devs[i].lock);
    /* Idle thread-cached blocks are allocated in their pools: only blocks a caller holds count
     * as live. They go back only once nothing is live, so that a refused shutdown changes
     * nothing (no statistic, no cache). */
    for (int i = 0; i < sp__g.ndev; i++) {
        int64_t live = sp__stat_all_current(&sp__g.devs[i].stats, SP_ST_ALLOCATION);
        if (live && sp__g.devs[i].tc_blocks)
            live -= (int64_t)sp__tc_idle(i, NULL);
        /* Releasing waits and frees, which breaks a graph capture under way on the device (and
         * the graph may use the memory). Asked only where there is memory to release: asking a
         * device sympool never used would make it a CUDA context. */
        bool capturing = !live && sp__stat_all_current(&sp__g.devs[i].stats, SP_ST_SEGMENT) > 0 &&
                         sp__alloc_capture_underway(&sp__g.devs[i]);
        if (live || capturing) {
            for (int k = sp__g.ndev - 1; k >= 0; k--)
                sp__unlock(&sp__g.devs[k].lock);
            pthread_mutex_unlock(&sp__g.init_lock);
            if (capturing)
                return sp__error(SP_ERR_BUSY, SP_SUB_POOL,
                                 "sp_shutdown: a CUDA graph capture is under way on device %d; "
                                 "end it first (nothing was released)",
                                 i);
            return sp__error(SP_ERR_BUSY, SP_SUB_POOL,
                             "sp_shutdown: %" PRId64 " block(s) are still allocated on device "
                             "%d; free them first (nothing was released)",
                             live, i);
        }
    }
    for (int i = 0; i < sp__g.ndev; i++)
        (void)sp__tc_drain(&sp__g.devs[i]);
    for (int i = 0; i < sp__g.ndev; i++) {
        sp_devalloc_t *d = &sp__g.devs[i];
        sp__alloc_sync_events(d, NULL);
        release_all(d, d->default_pool);
        for (sp_mempool_t *p = d->pools; p; p = p->next)
            release_all(d, p);
    }
    for (int i = sp__g.ndev - 1; i >= 0; i--)
        sp__unlock(&sp__g.devs[i].lock);
    for (int i = 0; i < sp__g.ndev; i++)
        dev_fini(&sp__g.devs[i]);
    free(sp__g.devs);
    sp__g.devs = NULL;
    sp__g.ndev = 0;
    atomic_store_explicit(&sp__ready, 0, memory_order_release);
    sp__fast_off_add(SP_FAST_NOT_READY - sp__g.fast_rest);
    sp__lock_bias_end();
    sp__mempool_routing_reset();
    sp__alloc_orphans_reset();
    sp__handles_next_generation(); /* every pool handle of this session is stale from here */
    /* No call is inside the gate (closed, waited for): released pools go now. */
    sp__handles_release(sp__handles_take_pending());
    sp__history_shutdown();
    sp__torch_session_end(sp__g.caps.is_emulated); /* the host backend's fini unmaps its segments */
    sp__device_reset();
    sp__g.ops = NULL;
    /* A new first call reads the SYMPOOL_* variables again, as the first one did. */
    sp__options_forget();
    pthread_mutex_unlock(&sp__g.init_lock);
    return SP_SUCCESS;
}

SP_EXPORT const char *sp_backend_name(void) {
    SP_GATE_OR("none");
    if (sp__alloc_ensure() != SP_SUCCESS)
        return "none";
    return sp__g.ops->name;
}

SP_EXPORT sp_status_t sp_x_host_place(int device, size_t size, uint64_t offset) {
    SP_GATE("sp_x_host_place");
    SP_CHECK(sp__alloc_ensure());
    if (sp__g.ops != &sp__device_host_ops)
        return sp__error_quiet(SP_ERR_NOT_SUPPORTED, SP_SUB_DEVICE,
                               "sp_x_host_place: the backend is %s; placement is the host "
                               "backend's",
                               sp__g.ops->name);
    return sp__host_place(device, size, offset);
}

SP_EXPORT sp_status_t sp_x_free_block_set_requested(void *ptr, size_t requested) {
    SP_GATE("sp_x_free_block_set_requested");
    SP_CHECK(sp__alloc_ensure());
    return sp__pool_free_set_requested(ptr, requested);
}

SP_EXPORT int sp_device_count(void) {
    SP_GATE_OR(0);
    if (sp__alloc_ensure() != SP_SUCCESS)
        return 0;
    return sp__g.ndev;
}

SP_EXPORT sp_status_t sp_get_memory_info(int device, size_t *free_p, size_t *total_p) {
    SP_GATE("sp_get_memory_info");
    if (!free_p || !total_p)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "sp_get_memory_info: NULL output pointer");
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_get_memory_info", device, &d));
    size_t f = 0, t = 0;
    SP_CHECK(sp__g.ops->mem_get_info(device, &f, &t));
    *free_p = f;
    *total_p = t;
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_device_usage(int device, sp_device_usage_t *usage_p) {
    SP_GATE("sp_device_usage");
    SP_ARG_CHECK(usage_p, SP_SUB_POOL, "sp_device_usage: usage_p is NULL");
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_device_usage", device, &d));
    size_t f = 0, t = 0;
    SP_CHECK(sp__g.ops->mem_get_info(device, &f, &t));
    sp__lock(&d->lock);
    size_t reserved = d->total_reserved;
    /* On the emulated device a pool's own allocator (symmetric pools: MPI shared windows) gives
     * host memory the device never counted; on a GPU every segment is device memory. */
    if (sp__g.caps.is_emulated)
        for (sp_mempool_t *p = d->pools; p; p = p->next)
            if ((p->has_allocator || p->symmetric) && p->reserved <= reserved)
                reserved -= p->reserved;
    sp__unlock(&d->lock);
    size_t used = t >= f ? t - f : 0;
    *usage_p = (sp_device_usage_t){.total = t,
                                   .used = used,
                                   .reserved = reserved,
                                   .untracked = used > reserved ? used - reserved : 0};
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_set_memory_fraction(double fraction, int device) {
    SP_GATE("sp_set_memory_fraction");
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_set_memory_fraction", device, &d));
    if (!(fraction >= 0.0 && fraction <= 1.0)) {
        char text[32];
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "sp_set_memory_fraction: %s is outside [0, 1]",
                         sp__double_format(fraction, text, sizeof text));
    }
    sp__lock(&d->lock);
    set_fraction(d, fraction);
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_get_memory_fraction(int device, double *fraction_p) {
    SP_GATE("sp_get_memory_fraction");
    if (fraction_p == NULL)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "sp_get_memory_fraction: fraction_p is NULL");
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_get_memory_fraction", device, &d));
    /* The value as set, not allowed_max / total: a caller that sets f reads f back. */
    sp__lock(&d->lock);
    *fraction_p = d->fraction;
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_empty_cache(void) {
    SP_GATE("sp_empty_cache");
    SP_CHECK(sp__alloc_ensure());
    /* PyTorch's emptyCache gathers its caller's stack only at context "all" (and before taking
     * the lock), for the segment_free entries of what it releases. */
    uint32_t ctx = sp__history_capture(true);
    /* A segment the device refused to free stays cached (sp__alloc_release_segment) and the
     * rest is released, every device's; then the refusal is the call's error, as PyTorch's
     * emptyCache throws one (its release_block checks cudaFree). */
    sp__release_watch();
    for (int i = 0; i < sp__g.ndev; i++) {
        sp_devalloc_t *d = &sp__g.devs[i];
        sp__lock(&d->lock);
        (void)sp__tc_drain(d); /* every thread's idle blocks, then the pool's release */
        sp__alloc_release_cached(d, ctx);
        sp__unlock(&d->lock);
    }
    sp__history_context_release(ctx);
    return sp__release_report("sp_empty_cache");
}

SP_EXPORT sp_status_t sp_x_empty_cache_device(int device) {
    SP_GATE("sp_x_empty_cache_device");
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_x_empty_cache_device", device, &d));
    uint32_t ctx = sp__history_capture(true);
    sp__release_watch(); /* as sp_empty_cache */
    sp__lock(&d->lock);
    (void)sp__tc_drain(d);
    sp__alloc_release_cached(d, ctx);
    sp__unlock(&d->lock);
    sp__history_context_release(ctx);
    return sp__release_report("sp_x_empty_cache_device");
}

/* ---- streams ----------------------------------------------------------------------------- */

/* Streams sp_stream_create made less those sp_stream_destroy destroyed (sp_x_stream_count).
 * Signed: on cuda sp_stream_destroy takes any CUDA stream, one made elsewhere too. */
static atomic_long s_streams;

SP_EXPORT size_t sp_x_stream_count(void) {
    long n = atomic_load_explicit(&s_streams, memory_order_relaxed);
    return n > 0 ? (size_t)n : 0;
}

SP_EXPORT sp_status_t sp_stream_create(int device, sp_stream_t *stream_p) {
    SP_GATE("sp_stream_create");
    if (!stream_p)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "sp_stream_create: NULL stream_p");
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_stream_create", device, &d));
    sp_dev_stream_t s = NULL;
    SP_CHECK(sp__g.ops->stream_create(device, &s));
    atomic_fetch_add_explicit(&s_streams, 1, memory_order_relaxed);
    *stream_p = s;
    return SP_SUCCESS;
}

static sp_status_t stream_dev(const char *what, sp_stream_t stream, int *device_p) {
    SP_CHECK(sp__alloc_ensure());
    int dev = -1;
    sp_status_t s = sp__g.ops->stream_device(stream, &dev);
    if (s == SP_ERR_INVALID_ARGUMENT)
        return sp__error(s, SP_SUB_POOL,
                         "%s: %p is not a valid stream of the %s backend (cuda: any CUDA "
                         "stream; host: one from sp_stream_create): %s",
                         what, stream, sp__g.ops->name, sp_last_error());
    if (s != SP_SUCCESS) /* the device's failure stays one (device.h) */
        return sp__error(s, SP_SUB_POOL, "%s: cannot tell which device stream %p belongs to: %s",
                         what, stream, sp_last_error());
    *device_p = dev;
    return SP_SUCCESS;
}

/* NULL and CUDA's pseudo handles, which no sp_stream_create makes: cudaStreamLegacy (1) is the
 * default stream (sp_malloc keys its blocks as NULL's), cudaStreamPerThread (2) a different
 * stream on every thread. CUDA answers for both, so the backend's stream check passes them; the
 * calls that act on one stream (destroy, label) refuse them first, before they change anything.
 * SP_SUCCESS for any other handle (the backend's check follows). */
static sp_status_t refuse_default_or_pseudo(const char *what, sp_stream_t stream) {
    if ((uintptr_t)stream > 2u)
        return SP_SUCCESS;
    if (stream == (sp_stream_t)(uintptr_t)2)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "%s: cudaStreamPerThread is a different stream on every thread, not a "
                         "stream sp_stream_create made",
                         what);
    return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                     "%s: the default stream (%s) is not a stream sp_stream_create made", what,
                     stream ? "cudaStreamLegacy" : "NULL");
}

SP_EXPORT sp_status_t sp_stream_destroy(sp_stream_t stream) {
    SP_GATE("sp_stream_destroy");
    SP_CHECK(refuse_default_or_pseudo("sp_stream_destroy", stream));
    int dev = -1;
    SP_CHECK(stream_dev("sp_stream_destroy", stream, &dev));
    /* Cached blocks are keyed by their stream, and a cache hit never asks the backend whether
     * the stream still exists: a free segment kept under this stream would let a later
     * sp_malloc on the destroyed stream succeed. Release those segments now (a segment with a
     * live block on it stays until the block is freed and the cache emptied). */
    sp_devalloc_t *d = &sp__g.devs[dev];
    /* Releasing the stream's segments waits and frees, which breaks a global-mode capture (and
     * the graph may use the memory); keeping them would let a later stream with this handle
     * reuse them unordered. So the destroy waits for the capture to end. The device-wide check
     * does not see a non-blocking stream of the application's (cuda.c, cuda_device_capturing),
     * so the stream itself is asked too: destroying it means synchronizing it, which would
     * invalidate its own capture. */
    bool self = false;
    if (sp__alloc_capture_underway(d) ||
        (sp__g.ops->stream_capturing(dev, stream, &self) == SP_SUCCESS && self))
        return sp__error(SP_ERR_BUSY, SP_SUB_POOL,
                         "sp_stream_destroy: a CUDA graph capture is under way on %s %d; "
                         "destroy the stream after the capture ends (nothing was destroyed)",
                         self ? "this stream, of device" : "device", dev);
    sp__lock(&d->lock);
    (void)sp__tc_drain(d); /* thread caches key blocks by stream too */
    sp__alloc_sync_events(d, NULL);
    /* Live blocks recorded on the stream would record an event on its handle at their free,
     * after the destroy: a stale handle (undefined on CUDA; on the host backend two warnings,
     * or a wait on an unrelated stream that got the handle since). */
    sp__alloc_forget_stream(d, stream);
    sp__alloc_release_pool(d, d->default_pool, true, stream, 0);
    for (sp_mempool_t *p = d->pools; p; p = p->next)
        if (!p->symmetric)
            sp__alloc_release_pool(d, p, true, stream, 0);
    /* A segment with a live block stays, and its free blocks stay cached under this handle:
     * from here on a malloc on the dead handle (or on a stream of another device that gets the
     * handle) would hit them without the miss path's stream check. */
    sp__alloc_orphan_stream(d, stream);
    sp__unlock(&d->lock);
    SP_CHECK(sp__g.ops->stream_destroy(dev, stream));
    atomic_fetch_sub_explicit(&s_streams, 1, memory_order_relaxed);
    return sp__history_stream_label((uintptr_t)stream, 0); /* a later stream may get its handle */
}

SP_EXPORT int sp_x_stream_live(sp_stream_t stream) {
    SP_GATE_OR(-1); /* inside a callback, or during sp_shutdown: cannot tell now */
    /* Not initialized: no stream of this session exists yet (and asking would initialize). */
    if ((uintptr_t)stream <= 2u || !atomic_load_explicit(&sp__ready, memory_order_acquire))
        return 0;
    /* The backend's check reports an unknown handle as an error: here that is the answer. */
    int dev = -1;
    sp__errors_quiet(true);
    /* A handle the backend destroyed must not reach its check (cuda: undefined behaviour). */
    if (sp__g.ops->stream_destroyed && sp__g.ops->stream_destroyed(stream)) {
        (void)sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                        "sp_x_stream_live: %p was destroyed by sp_stream_destroy (or sp_shutdown) "
                        "and no stream has been made at it since",
                        stream);
        sp__errors_quiet(false);
        return 0;
    }
    sp_status_t st = sp__g.ops->stream_device(stream, &dev);
    sp__errors_quiet(false);
    if (st != SP_SUCCESS && st != SP_ERR_INVALID_ARGUMENT)
        return -1; /* the device could not answer (device.h): cannot tell now */
    return st == SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_x_stream_label(sp_stream_t stream, uint64_t label) {
    SP_GATE("sp_x_stream_label");
    if (!stream)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "sp_x_stream_label: the default stream (NULL) is shown as 0 and takes "
                         "no label");
    SP_CHECK(refuse_default_or_pseudo("sp_x_stream_label", stream));
    int dev = -1;
    SP_CHECK(stream_dev("sp_x_stream_label", stream, &dev));
    return sp__history_stream_label((uintptr_t)stream, label);
}

SP_EXPORT sp_status_t sp_stream_synchronize(sp_stream_t stream) {
    SP_GATE("sp_stream_synchronize");
    SP_CHECK(sp__alloc_ensure());
    /* cudaStreamLegacy is the default stream (sp_malloc and sp_record_stream take it as NULL).
     * CUDA answers for the handle itself (the current device's legacy stream); the host backend
     * has no such handle and refused it, so there it is NULL: every device's default stream. */
    if (stream == (sp_stream_t)(uintptr_t)1 && sp__g.caps.is_emulated)
        stream = NULL;
    if (!stream) {
        /* The default stream of every device. */
        for (int i = 0; i < sp__g.ndev; i++)
            SP_CHECK(sp__g.ops->stream_sync(i, NULL));
        return SP_SUCCESS;
    }
    int dev = -1;
    SP_CHECK(stream_dev("sp_stream_synchronize", stream, &dev));
    return sp__g.ops->stream_sync(dev, stream);
}
