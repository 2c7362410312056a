/*
 * mempool.c: MemPools with PyTorch's semantics (reference/pytorch-allocator.md section 4) and
 * CuPy's pool queries and limits.
 *
 * Ids come from one process-wide atomic counter starting at 1 ({0,n}); {0,0} is each device's
 * default pool, made at init and never destroyed. The use count is 1 at create, +1 per active
 * sp_mempool_begin; destroy drops the creator's use (to 0: the pool becomes "freeable") and
 * releases its whole free segments now; segments that still hold live blocks are released by a
 * later sp_empty_cache (or the OOM retry) once their blocks are freed. A destroyed pool stays in
 * its device's pool list, marked destroyed, while it holds a segment (a late free finds it);
 * when its last segment goes (or at the destroy, if it holds none) it leaves the list and its
 * struct is released (sp__mempool_drop), as PyTorch erases a freeable private pool at emptyCache
 * once its cudaMalloc count is 0. Symmetric pools stay until sp_shutdown: their state
 * (symmetric/) keeps its own lifetime, collective, and reads the pool through it.
 *
 * Handles: every public call checks its pool handle (sp__mempool_check) before reading through
 * it, inside the shutdown gate: a handle sympool never gave out is SP_ERR_INVALID_ARGUMENT, one
 * from before sp_shutdown or of a released pool is SP_ERR_INVALID_USAGE (handles.c: slots are
 * never reused, a released one is freed only once no call is inside the gate; pool structs
 * sp_shutdown retires stay). The queries that cannot return a status answer 0 for a bad handle
 * and leave the reason in sp_last_error(); NULL stays a quiet 0 there.
 *
 * Routing is a per-thread stack of pools; a generation number bumped by sp_shutdown invalidates
 * every thread's stack at once. Pool fields are guarded by the device allocator lock, except
 * use_count (atomic) and the const fields.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "pool/allocator.h"
#include "pool/expandable.h"
#include "pool/fork.h"
#include "pool/handles.h"
#include "pool/mempool.h"
#include "pool/release.h"
#include "pool/thread_cache.h"

#define MAX_ROUTE 32

static atomic_uint_fast64_t g_next_id = 1;
static atomic_uint g_route_gen = 1;

/* Threads with a non-empty routing stack; 0 lets sp_malloc skip the thread-local lookup. */
atomic_int sp__routing_threads;

static _Thread_local sp_mempool_t *tl_route[MAX_ROUTE];
static _Thread_local int tl_depth;
static _Thread_local unsigned tl_gen;

static int route_depth(void) {
    if (tl_depth && tl_gen != atomic_load_explicit(&g_route_gen, memory_order_relaxed))
        tl_depth = 0; /* sp_shutdown freed every pool since this thread began routing */
    return tl_depth;
}

sp_mempool_t *sp__mempool_routed(int device) {
    if (atomic_load_explicit(&sp__routing_threads, memory_order_relaxed) == 0)
        return NULL;
    int n = route_depth();
    for (int i = n - 1; i >= 0; i--)
        if (tl_route[i]->device == device)
            return tl_route[i];
    return NULL;
}

void sp__mempool_routing_reset(void) {
    atomic_fetch_add(&g_route_gen, 1);
    sp__fast_off_add(-SP_FAST_REASON * atomic_exchange(&sp__routing_threads, 0));
    tl_depth = 0;
}

/* A pool's use count in a fork child: the creator's use (none once destroyed) and this
 * thread's routings of it (the other threads' went with them). Symmetric pools are never
 * routed. */
static void fork_recount(sp_mempool_t *p, int depth) {
    if (p->symmetric)
        return;
    int uses = p->destroyed ? 0 : 1;
    for (int i = 0; i < depth; i++)
        uses += tl_route[i] == p;
    atomic_store(&p->use_count, uses);
}

/* fork() copies only the calling thread: the routings of the parent's other threads stayed in
 * the child's use counts, and no thread exit would ever end them (route_exit runs in the thread
 * that routed), so the child's sp_mempool_destroy refused those pools for good, sp_empty_cache
 * kept their segments, and the routing count kept every allocation off the fast path. Run by
 * the child handler with every device lock held (pools lists), before any other thread exists. */
void sp__mempool_fork_child(void) {
    int depth = route_depth();
    for (int i = 0; i < sp__g.ndev; i++) {
        sp_devalloc_t *d = &sp__g.devs[i];
        fork_recount(d->default_pool, depth);
        for (sp_mempool_t *p = d->pools; p; p = p->next)
            fork_recount(p, depth);
    }
    int had = atomic_exchange(&sp__routing_threads, depth > 0);
    sp__fast_off_add(SP_FAST_REASON * ((depth > 0) - had));
}

static const char *pname(const sp_mempool_t *p) {
    return p->name ? p->name : "";
}

/* A thread that exits inside sp_mempool_begin can never call sp_mempool_end: its routings would
 * keep their pools' use counts up for good (so sp_mempool_destroy refused them forever) and the
 * routing count up (the allocation fast path off for every thread). This key's destructor, run
 * at the thread's exit, ends them for it, innermost first, with a warning: nothing can be routed
 * by a thread that is gone. */
static pthread_key_t g_route_key;
static bool g_route_key_made;
static pthread_once_t g_route_once = PTHREAD_ONCE_INIT;

/* route_exit's body, inside the shutdown gate: the warning reads the pool's name, which a
 * concurrent sp_shutdown frees (the gate makes it wait, or refuses this once it has begun: it
 * resets every routing itself). */
static sp_status_t route_exit_gated(void) {
    SP_GATE("sp_mempool_end (at a thread's exit)");
    for (int n = route_depth(); n > 0; n = route_depth()) {
        sp_mempool_t *pool = tl_route[n - 1];
        SP_WARN(SP_SUB_POOL,
                "a thread exited inside sp_mempool_begin of pool \"%s\" {0,%" PRIu64
                "}: its routing is ended for it (call sp_mempool_end before a thread exits)",
                pname(pool), pool->id.second);
        if (sp_mempool_end(pool) != SP_SUCCESS)
            break; /* sympool is shutting down: that resets every routing itself */
    }
    return SP_SUCCESS;
}

static void route_exit(void *unused) {
    (void)unused;
    if (route_depth() > 0) /* else nothing to end, and no gate to pass (a refusal's message) */
        (void)route_exit_gated();
}

static void make_route_key(void) {
    g_route_key_made = pthread_key_create(&g_route_key, route_exit) == 0;
}

/* At the library's unload (dlclose; exit() too): a thread that routed keeps the key's value set
 * for its life, and one that outlives the library would otherwise have glibc call route_exit at
 * an address no longer mapped as it exits (a deleted key's destructor is never called). Its
 * routings then end with the library, as every pool's do. */
__attribute__((destructor)) static void delete_route_key(void) {
    if (g_route_key_made)
        (void)pthread_key_delete(g_route_key);
    g_route_key_made = false;
}

/* Arm route_exit for this thread, once (its first routing; the key's value stays set until the
 * thread exits, and route_exit does nothing for a thread that routes nothing then): a begin
 * after that pays one thread-local test. Without a key (none left) a thread that exits routing
 * keeps its pools' uses, as before. */
static _Thread_local bool tl_route_armed;

static void arm_route_exit(void) {
    if (SP_LIKELY(tl_route_armed))
        return;
    (void)pthread_once(&g_route_once, make_route_key);
    if (g_route_key_made)
        tl_route_armed = pthread_setspecific(g_route_key, (void *)1) == 0;
}

_Static_assert(sizeof(sp_mempool_t) <= SP_HANDLE_SLOT - sizeof(void *),
               "a pool struct fits its slot, with the slot's link after it (handles.c)");

/* The struct's generation: 0 once released. Sequentially consistent, as the gate's count
 * (handles.c's reason a slot may be released: a call that counted itself in after the mark
 * reads 0 here). */
static uint64_t gen_of(const sp_mempool_t *pool) {
    return atomic_load(&((sp_mempool_t *)pool)->generation);
}

/* A handle of this session: a slot handed out and of the current generation. Reads the struct
 * only once handles.c says it is one. */
static bool handle_live(const sp_mempool_t *pool) {
    return pool && sp__handles_known(pool) && gen_of(pool) == sp__handles_generation() &&
           atomic_load_explicit(&sp__ready, memory_order_acquire);
}

sp_status_t sp__mempool_check(const sp_mempool_t *pool, const char *what) {
    if (sp__in_callback())
        return sp__callback_refused(what);
    if (SP_UNLIKELY(!pool))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "%s: NULL pool", what);
    if (SP_UNLIKELY(!sp__handles_known(pool)))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "%s: %p is not a pool handle sympool gave out (sp_mempool_create, "
                         "sp_default_mempool)",
                         what, (const void *)pool);
    uint64_t gen = gen_of(pool);
    if (SP_UNLIKELY(gen == 0))
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "%s: pool handle %p names a pool that was destroyed and released (its "
                         "last segment went); a handle is never reused",
                         what, (const void *)pool);
    if (SP_UNLIKELY(gen != sp__handles_generation() ||
                    !atomic_load_explicit(&sp__ready, memory_order_acquire))) {
        /* A fork child of a cuda parent has sympool turned off (fork.c): no sp_shutdown
         * released the pool, the fork did; every other call there says so. */
        if (sp__fork_child_off())
            return sp__fork_error(what);
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "%s: pool handle %p is stale: its pool {%" PRIu64 ",%" PRIu64
                         "} was released by sp_shutdown, and handles do not outlive it; create "
                         "the pool again",
                         what, (const void *)pool, pool->id.first, pool->id.second);
    }
    return SP_SUCCESS;
}

SP_EXPORT int sp_x_mempool_released(const sp_mempool_t *pool) {
    if (!pool || !sp__handles_known(pool))
        return -1;
    /* gen_of's sequentially consistent load: a 0 read here follows sp__mempool_drop's store,
     * made under the device lock after the pool's last segment was handed back. */
    uint64_t gen = gen_of(pool);
    return gen == 0 ? 1 : gen == sp__handles_generation() ? 0 : -1;
}

/* For the queries without a status: NULL is a quiet "no", a bad handle says why. */
static bool query_ok(const sp_mempool_t *pool, const char *what) {
    return pool && sp__mempool_check(pool, what) == SP_SUCCESS;
}

sp_mempool_t *sp__mempool_new(sp_devalloc_t *d, const sp_mempool_params_t *params, bool is_default,
                              bool symmetric) {
    char *name = NULL;
    if (params && params->name) {
        name = strdup(params->name);
        if (!name)
            return NULL;
    }
    sp_mempool_t *p = sp__handles_new(); /* zeroed */
    if (!p) {
        free(name);
        return NULL;
    }
    p->name = name;
    p->device = d->device;
    p->dev = d;
    p->is_default = is_default;
    p->symmetric = symmetric;
    if (!is_default)
        p->id.second = atomic_fetch_add(&g_next_id, 1);
    if (params) {
        p->use_on_oom = params->use_on_oom;
        p->no_split = params->no_split;
        if (params->allocator) {
            p->allocator = *params->allocator;
            p->has_allocator = true;
        }
    }
    atomic_init(&p->use_count, 1);
    p->small.is_small = true;
    p->small.tstat = sp__stat_type_row(&d->stats, true);
    p->small.pool = p;
    p->small.free.by_seq = symmetric;
    p->large.is_small = false;
    p->large.tstat = sp__stat_type_row(&d->stats, false);
    p->large.pool = p;
    p->large.free.by_seq = symmetric;
    /* Without the class tables (out of memory) the sets keep one tree each: the same order. */
    if (!symmetric) {
        (void)sp__bset_init_classes(&p->small.free);
        (void)sp__bset_init_classes(&p->large.free);
    }
    p->small_max = SP_SMALL_SIZE;
    sp__exp_share_small(p); /* nothing reserved yet */
    if (sp__g.exp_on && !sp__exp_pool(p))
        SP_INFO(SP_SUB_POOL,
                "pool \"%s\" {0,%" PRIu64 "} keeps fixed segments although expandable_segments is "
                "on: %s",
                p->name ? p->name : "", p->id.second,
                symmetric ? "an NCCL window cannot cover memory mapped after it is registered, so "
                            "a symmetric pool grows one window-registered segment at a time"
                          : "its pluggable segment allocator cannot map pages (as in PyTorch)");
    atomic_store(&p->generation, sp__handles_generation());
    return p;
}

void sp__mempool_slot_free(void *slot) {
    sp_mempool_t *p = slot;
    free(p->name);
    p->name = NULL;
    sp__bset_free_classes(&p->small.free);
    sp__bset_free_classes(&p->large.free);
}

void sp__mempool_slot_wait(void *slot) {
    sp_devalloc_t *d = ((sp_mempool_t *)slot)->dev; /* not released yet: readable */
    sp__lock(&d->lock);
    sp__unlock(&d->lock);
}

void sp__mempool_drop(sp_devalloc_t *d, sp_mempool_t *pool) {
    if (!pool->destroyed || pool->symmetric || pool->nsegments || gen_of(pool) == 0)
        return;
    /* Out of the list; its own `next` stays, so that a walk standing on it (a release loop
     * whose release emptied it) goes on. */
    if (pool->prev)
        pool->prev->next = pool->next;
    else
        d->pools = pool->next;
    if (pool->next)
        pool->next->prev = pool->prev;
    else
        d->pools_tail = pool->prev;
    atomic_store(&pool->generation, 0); /* every check refuses it from here on */
    sp__handles_release_later(pool);
}

void sp__mempool_retire(sp_mempool_t *pool) {
    /* The struct stays (see handles.c): only what it owns goes, and nothing may follow `dev`. */
    free(pool->name);
    pool->name = NULL;
    sp__bset_free_classes(&pool->small.free); /* its blocks go with the slabs (dev_fini) */
    sp__bset_free_classes(&pool->large.free);
    pool->next = pool->prev = NULL;
    pool->seg_head = pool->seg_tail = NULL;
    pool->sym_state = NULL;
    pool->destroyed = true;
}

static sp_status_t create(const sp_mempool_params_t *params, bool symmetric, void *sym_state,
                          sp_mempool_t **pool_p) {
    if (!pool_p)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "sp_mempool_create: pool_p is NULL");
    sp_mempool_params_t defaults;
    if (!params) {
        sp_mempool_params_init(&defaults);
        params = &defaults;
    }
    if (params->allocator && (!params->allocator->alloc || !params->allocator->free))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "sp_mempool_create: the allocator needs both alloc and free callbacks");
    /* Refused before the library starts: a negative device other than -1 (device 0) is no
     * device whatever the count. */
    if (params->device < -1)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "sp_mempool_create: device %d does not exist", params->device);
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_mempool_create", params->device < 0 ? 0 : params->device, &d));
    sp_mempool_t *p = sp__mempool_new(d, params, false, symmetric);
    if (!p)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_POOL, "sp_mempool_create: out of host memory");
    p->sym_state = sym_state;
    sp__lock(&d->lock);
    p->prev = d->pools_tail;
    if (d->pools_tail)
        d->pools_tail->next = p;
    else
        d->pools = p;
    d->pools_tail = p;
    sp__unlock(&d->lock);
    SP_INFO(SP_SUB_POOL, "device %d: created %spool \"%s\" {0,%" PRIu64 "}%s%s%s", d->device,
            symmetric ? "symmetric " : "", pname(p), p->id.second,
            p->has_allocator ? " with its own allocator" : "", p->use_on_oom ? " use_on_oom" : "",
            p->no_split ? " no_split" : "");
    *pool_p = p;
    return SP_SUCCESS;
}

SP_EXPORT void sp_mempool_params_init(sp_mempool_params_t *params) {
    if (!params)
        return;
    memset(params, 0, sizeof(*params));
    params->device = -1;
}

SP_EXPORT sp_status_t sp_mempool_create(const sp_mempool_params_t *params, sp_mempool_t **pool_p) {
    SP_GATE("sp_mempool_create");
    return create(params, false, NULL, pool_p);
}

sp_status_t sp__mempool_create_symmetric(const sp_mempool_params_t *params, void *sym_state,
                                         sp_mempool_t **pool_p) {
    return create(params, true, sym_state, pool_p);
}

void *sp__mempool_sym_state(const sp_mempool_t *pool) {
    return handle_live(pool) ? pool->sym_state : NULL;
}
const char *sp__mempool_name(const sp_mempool_t *pool) {
    return handle_live(pool) ? pool->name : NULL;
}
int sp__mempool_device(const sp_mempool_t *pool) {
    return handle_live(pool) ? pool->device : -1;
}

SP_EXPORT sp_status_t sp_mempool_destroy(sp_mempool_t *pool) {
    SP_GATE("sp_mempool_destroy");
    SP_CHECK(sp__mempool_check(pool, "sp_mempool_destroy"));
    /* Destroying a symmetric pool is collective (its segments are registered on every rank):
     * a local destroy would leave this rank serving nothing while the others still agree. */
    if (pool->symmetric)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_mempool_destroy: pool \"%s\" is symmetric; destroy it on every rank "
                         "with sp_symmetric_mempool_destroy (collective)",
                         pname(pool));
    return sp__mempool_destroy_internal(pool);
}

sp_status_t sp__mempool_destroy_internal(sp_mempool_t *pool) {
    if (pool->is_default)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_mempool_destroy: the default pool of device %d cannot be destroyed",
                         pool->device);
    sp_devalloc_t *d = pool->dev;
    /* PyTorch's MemPool destructor releases through emptyCache(id), which gathers its caller's
     * stack at context "all" (before the lock) for the segment_free entries. */
    uint32_t ctx = sp__history_capture(true);
    sp__lock(&d->lock);
    if (pool->destroyed) {
        sp__unlock(&d->lock);
        sp__history_context_release(ctx);
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_mempool_destroy: pool \"%s\" {0,%" PRIu64 "} was already destroyed",
                         pname(pool), pool->id.second);
    }
    if (atomic_load(&pool->use_count) > 1) {
        sp__unlock(&d->lock);
        sp__history_context_release(ctx);
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_mempool_destroy: pool \"%s\" {0,%" PRIu64 "} is still routed by "
                         "sp_mempool_begin (use count %d); call sp_mempool_end first",
                         pname(pool), pool->id.second, atomic_load(&pool->use_count));
    }
    pool->destroyed = true;
    pool->use_on_oom = false;
    atomic_fetch_sub(&pool->use_count, 1);
    /* PyTorch's emptyCache(id) on a freeable pool: finish its pending frees, then release every
     * whole free segment through the pool's allocator (for a symmetric pool, its registrar,
     * which defers what must be collective). Not while a graph capture is under way on the
     * device: waiting and freeing would break it, and the graph may use the memory; the segments
     * go with a later sp_empty_cache, as a destroyed pool's may (sp__alloc_release_cached). */
    if (!sp__alloc_capture_underway(d)) {
        sp__alloc_sync_events(d, pool);
        sp__alloc_release_pool(d, pool, false, NULL, ctx);
    } else {
        SP_INFO(SP_SUB_POOL,
                "device %d: a CUDA graph capture is under way; pool \"%s\"'s cached segments go "
                "with a later sp_empty_cache",
                d->device, pname(pool));
    }
    SP_INFO(SP_SUB_POOL,
            "device %d: destroyed pool \"%s\" {0,%" PRIu64 "} (%zu segments, %zu "
            "bytes still held by live blocks)",
            d->device, pname(pool), pool->id.second, pool->nsegments, pool->reserved);
    sp__mempool_drop(d, pool); /* holding no segment, it goes now (released when calls left) */
    sp__unlock(&d->lock);
    sp__history_context_release(ctx);
    return SP_SUCCESS;
}

SP_EXPORT sp_mempool_t *sp_default_mempool(int device) {
    /* sp__g.devs goes with a concurrent sp_shutdown */
    SP_GATE_OR(((void)sp__gate_refused("sp_default_mempool"), (sp_mempool_t *)NULL));
    if (sp__alloc_ensure() != SP_SUCCESS || device < 0 || device >= sp__g.ndev)
        return NULL;
    return sp__g.devs[device].default_pool;
}

/* The three queries below and sp_mempool_malloc pass the gate as every other call that takes
 * a pool: a released pool's struct is freed only once no call is inside it (handles.c). */
SP_EXPORT sp_mempool_id_t sp_mempool_id(const sp_mempool_t *pool) {
    sp_mempool_id_t none = {0, 0};
    SP_GATE_OR(((void)sp__gate_refused("sp_mempool_id"), none));
    return query_ok(pool, "sp_mempool_id") ? pool->id : none;
}

SP_EXPORT int sp_mempool_use_count(const sp_mempool_t *pool) {
    SP_GATE_OR(((void)sp__gate_refused("sp_mempool_use_count"), 0));
    return query_ok(pool, "sp_mempool_use_count") ? atomic_load(&((sp_mempool_t *)pool)->use_count)
                                                  : 0;
}

SP_EXPORT bool sp_mempool_is_symmetric(const sp_mempool_t *pool) {
    SP_GATE_OR(((void)sp__gate_refused("sp_mempool_is_symmetric"), false));
    return query_ok(pool, "sp_mempool_is_symmetric") && pool->symmetric;
}

SP_EXPORT sp_status_t sp_mempool_begin(sp_mempool_t *pool) {
    /* It takes the pool's device lock, which lives in sp__g.devs: a concurrent sp_shutdown
     * frees that, so the call counts itself in first (pool.h's shutdown rule). */
    SP_GATE("sp_mempool_begin");
    SP_CHECK(sp__mempool_check(pool, "sp_mempool_begin"));
    if (pool->symmetric)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_mempool_begin: pool \"%s\" is symmetric; allocate in it with "
                         "sp_symmetric_malloc (collective)",
                         pname(pool));
    int n = route_depth();
    for (int i = 0; i < n; i++)
        if (tl_route[i] == pool)
            return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                             "sp_mempool_begin: pool \"%s\" {0,%" PRIu64 "} is already routed on "
                             "this thread",
                             pname(pool), pool->id.second);
    if (n == MAX_ROUTE)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_mempool_begin: more than %d nested pools on this thread", MAX_ROUTE);
    sp__lock(&pool->dev->lock);
    bool destroyed = pool->destroyed;
    if (!destroyed)
        atomic_fetch_add(&pool->use_count, 1);
    sp__unlock(&pool->dev->lock);
    if (destroyed)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_mempool_begin: pool \"%s\" {0,%" PRIu64 "} was destroyed", pname(pool),
                         pool->id.second);
    tl_gen = atomic_load_explicit(&g_route_gen, memory_order_relaxed);
    if (n == 0) {
        atomic_fetch_add(&sp__routing_threads, 1);
        sp__fast_off_add(SP_FAST_REASON);
        arm_route_exit();
    }
    tl_route[n] = pool;
    tl_depth = n + 1;
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_mempool_end(sp_mempool_t *pool) {
    /* As sp_mempool_begin: sp_shutdown resets the routing counts (sp__routing_threads), and an
     * end that read this thread's depth before that reset must not decrement after it. */
    SP_GATE("sp_mempool_end");
    SP_CHECK(sp__mempool_check(pool, "sp_mempool_end"));
    int n = route_depth();
    if (n == 0 || tl_route[n - 1] != pool)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_mempool_end: pool \"%s\" is not this thread's innermost routed pool%s",
                         pname(pool), n == 0 ? " (no sp_mempool_begin is active)" : "");
    tl_depth = n - 1;
    if (n == 1) {
        atomic_fetch_sub(&sp__routing_threads, 1);
        sp__fast_off_add(-SP_FAST_REASON);
    }
    atomic_fetch_sub(&pool->use_count, 1);
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_mempool_malloc(sp_mempool_t *pool, size_t size, sp_stream_t stream,
                                        void **ptr_p) {
    SP_GATE("sp_mempool_malloc");
    SP_CHECK(sp__mempool_check(pool, "sp_mempool_malloc"));
    if (!ptr_p)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "sp_mempool_malloc: NULL ptr_p");
    if (pool->symmetric)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_mempool_malloc: pool \"%s\" is symmetric; use sp_symmetric_malloc",
                         pname(pool));
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_mempool_malloc", pool->device, &d));
    if (size == 0) {
        *ptr_p = NULL;
        return SP_SUCCESS;
    }
    /* sp_malloc's order: size 0, the stream, the size rule. The pseudo handles go through
     * sp_malloc's mapping, or cudaStreamPerThread would key blocks that every thread's stream
     * then shares unordered, and cudaStreamLegacy's would be kept apart from NULL's. */
    SP_CHECK(sp__alloc_map_stream("sp_mempool_malloc", &stream));
    SP_CHECK(sp__alloc_orphan_check(d, stream, "sp_mempool_malloc"));
    SP_CHECK(sp__alloc_check_size("sp_mempool_malloc", d->device, size));
    return sp__alloc_malloc(d, pool, size, stream, ptr_p);
}

/* ---- CuPy's queries ---------------------------------------------------------------------- */

typedef enum { Q_USED, Q_TOTAL, Q_NFREE, Q_LIMIT } query_t;

static size_t query(const sp_mempool_t *pool, query_t q) {
    static const char *const names[] = {"sp_mempool_used_bytes", "sp_mempool_total_bytes",
                                        "sp_mempool_n_free_blocks", "sp_mempool_get_limit"};
    /* The device lock below goes with a concurrent sp_shutdown; refused, it says why (as a bad
     * handle does). */
    SP_GATE_OR(((void)sp__gate_refused(names[q]), (size_t)0));
    if (!query_ok(pool, names[q]))
        return 0;
    sp__lock(&pool->dev->lock);
    size_t v = q == Q_USED    ? pool->used
               : q == Q_TOTAL ? pool->reserved
               : q == Q_NFREE ? pool->small.free.count + pool->large.free.count
                              : pool->limit;
    sp__unlock(&pool->dev->lock);
    return v;
}

SP_EXPORT size_t sp_mempool_used_bytes(const sp_mempool_t *pool) {
    return query(pool, Q_USED);
}
SP_EXPORT size_t sp_mempool_total_bytes(const sp_mempool_t *pool) {
    return query(pool, Q_TOTAL);
}
SP_EXPORT size_t sp_mempool_n_free_blocks(const sp_mempool_t *pool) {
    return query(pool, Q_NFREE);
}
SP_EXPORT size_t sp_mempool_get_limit(const sp_mempool_t *pool) {
    return query(pool, Q_LIMIT);
}

SP_EXPORT size_t sp_mempool_free_bytes(const sp_mempool_t *pool) {
    SP_GATE_OR(((void)sp__gate_refused("sp_mempool_free_bytes"), (size_t)0)); /* as query() */
    if (!query_ok(pool, "sp_mempool_free_bytes"))
        return 0;
    sp__lock(&pool->dev->lock);
    size_t v = pool->reserved - pool->used;
    sp__unlock(&pool->dev->lock);
    return v;
}

SP_EXPORT sp_status_t sp_mempool_free_all_blocks(sp_mempool_t *pool, sp_stream_t stream) {
    SP_GATE("sp_mempool_free_all_blocks");
    SP_CHECK(sp__mempool_check(pool, "sp_mempool_free_all_blocks"));
    if (pool->symmetric)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_mempool_free_all_blocks: pool \"%s\" is symmetric; releasing its "
                         "segments is collective: use sp_symmetric_empty_cache",
                         pname(pool));
    sp_devalloc_t *d = pool->dev;
    /* A stream argument means "only that stream's segments"; the legacy stream's blocks are
     * cached as the default stream's (sp_malloc maps it to NULL), so it releases those. */
    bool by_stream = stream != NULL;
    SP_CHECK(sp__alloc_map_stream("sp_mempool_free_all_blocks", &stream));
    if (stream) {
        /* As every other call: a stream sympool did not make, or one of another device, is a
         * bad argument (it could never match a cached block, so "success" would hide a bug). */
        int sdev = -1;
        sp_status_t s = sp__g.ops->stream_device(stream, &sdev);
        if (s == SP_ERR_INVALID_ARGUMENT)
            return sp__error(s, SP_SUB_POOL,
                             "sp_mempool_free_all_blocks: %p is not a stream made by "
                             "sp_stream_create (%s)",
                             stream, sp_last_error());
        if (s != SP_SUCCESS) /* the device's failure stays one (device.h) */
            return sp__error(s, SP_SUB_POOL,
                             "sp_mempool_free_all_blocks: cannot tell which device stream %p "
                             "belongs to: %s",
                             stream, sp_last_error());
        if (sdev != pool->device)
            return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                             "sp_mempool_free_all_blocks: stream %p belongs to device %d, pool "
                             "\"%s\" to device %d",
                             stream, sdev, pname(pool), pool->device);
    }
    uint32_t ctx = sp__history_capture(true); /* as sp_empty_cache: level "all" only */
    sp__release_watch();                      /* a device refusal is the error, as there */
    sp__lock(&d->lock);
    /* Blocks idle in thread caches (default pools only) are cached blocks to the caller, but
     * allocated to the pool: without this their segments stayed reserved, where sp_empty_cache
     * and sp_stream_destroy give them back. */
    if (pool->is_default)
        (void)sp__tc_drain(d);
    /* As sp_empty_cache: no release while a graph capture is under way on the device (waiting
     * and freeing would break it, and the graph may use the memory). */
    if (sp__alloc_capture_underway(d)) {
        SP_INFO(SP_SUB_POOL,
                "device %d: a CUDA graph capture is under way; pool \"%s\"'s cached segments are "
                "not released",
                d->device, pname(pool));
    } else {
        if (d->pending_events)
            sp__alloc_process_events(d);
        sp__alloc_release_pool(d, pool, by_stream, stream, ctx);
    }
    sp__unlock(&d->lock);
    sp__history_context_release(ctx);
    return sp__release_report("sp_mempool_free_all_blocks");
}

SP_EXPORT sp_status_t sp_mempool_set_limit(sp_mempool_t *pool, size_t bytes) {
    SP_GATE("sp_mempool_set_limit");
    SP_CHECK(sp__mempool_check(pool, "sp_mempool_set_limit"));
    sp__lock(&pool->dev->lock);
    bool destroyed = pool->destroyed;
    if (!destroyed)
        pool->limit = bytes;
    sp__unlock(&pool->dev->lock);
    /* As sp_mempool_malloc and sp_mempool_begin: a limit on a pool that takes no allocation any
     * more is a caller's bug, not a setting. */
    if (destroyed)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_mempool_set_limit: pool \"%s\" {0,%" PRIu64 "} was destroyed",
                         pname(pool), pool->id.second);
    return SP_SUCCESS;
}
