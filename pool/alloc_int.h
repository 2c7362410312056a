/*
 * alloc_int.h: the private structures of the caching allocator (the pool/ C files only): blocks,
 * segments, block pools (free sets), MemPools, per-device allocators and the process-wide allocator
 * state.
 *
 * Ownership and invariants:
 *  - A segment is one device (or pluggable-allocator) allocation; its blocks tile it exactly, in
 *    address order, linked by prev/next. A block is either allocated (in the device's pointer map),
 *    pending (freed, waiting for events; in no set) or free (in its block pool's free set).
 *  - Every block and segment belongs to exactly one MemPool and one of its two block pools
 *    (small or large); a block returns to that pool whoever frees it.
 *  - Everything below a device allocator is guarded by that allocator's `lock`; the lock order is
 *    sp__g.init_lock first, then device locks in device order. The routing stack is thread-local.
 */
#ifndef SP_ALLOC_INT_H
#define SP_ALLOC_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "pool/device/device.h"
#include "pool/history_int.h"
#include "pool/pool_internal.h"
#include "sympool/mempool.h"
#include "sympool/pool.h"

/* PyTorch's constants (reference/pytorch-allocator.md section 1.1). */
#define SP_MIN_BLOCK_SIZE ((size_t)512)
#define SP_SMALL_SIZE ((size_t)1 << 20)
#define SP_SMALL_BUFFER ((size_t)2 << 20)
#define SP_MIN_LARGE_ALLOC ((size_t)10 << 20)
#define SP_ROUND_LARGE ((size_t)2 << 20)

/* ---- the device lock --------------------------------------------------------------------- */

/* A futex lock from C11 atomics (Drepper's "mutex3"): 0 free, 1 held, 2 held with sleepers.
 * Uncontended it costs one CAS and one atomic decrement, about half of a pthread mutex pair,
 * which matters on the cache-hit path; contended it spins briefly, then sleeps in the kernel,
 * because the holder may be inside a device call (cudaMalloc, an MPI collective of a symmetric
 * registrar) for milliseconds. ThreadSanitizer sees its acquire/release atomics. */
typedef struct sp_lock {
    atomic_int v; /* 0, 1 or 2 as above */
} sp_lock_t;

void sp__lock_slow(sp_lock_t *l);
void sp__unlock_wake(sp_lock_t *l);

static inline void sp__lock(sp_lock_t *l) {
    int c = 0;
    if (SP_LIKELY(atomic_compare_exchange_strong_explicit(&l->v, &c, 1, memory_order_acquire,
                                                          memory_order_relaxed)))
        return;
    sp__lock_slow(l);
}

static inline void sp__unlock(sp_lock_t *l) {
    if (SP_UNLIKELY(atomic_fetch_sub_explicit(&l->v, 1, memory_order_release) != 1))
        sp__unlock_wake(l);
}

/* ---- stats (PyTorch's DeviceStats) ------------------------------------------------------- */

/* PyTorch's Stat. `freed` is not kept up to date on the hot path: it is derived as
 * allocated - (current - base), base being `current` at the last accumulated reset, which lets
 * every decrement touch one word. sp__stat_freed reads it; stats.c materializes it in copies. */
typedef struct sp_stat {
    int64_t current;   /* bytes or count now */
    int64_t peak;      /* max of current since the last peak reset */
    int64_t allocated; /* sum of increases since the last accumulated reset */
    int64_t base;      /* current at the last accumulated reset (see above) */
} sp_stat_t;

static inline int64_t sp__stat_freed(const sp_stat_t *s) {
    return s->allocated - (s->current - s->base);
}

enum { SP_STAT_ALL = 0, SP_STAT_SMALL = 1, SP_STAT_LARGE = 2, SP_STAT_NTYPES = 3 };

/* The nine StatArrays, in PyTorch's declaration order. */
enum {
    SP_ST_ALLOCATION,
    SP_ST_SEGMENT,
    SP_ST_ACTIVE,
    SP_ST_INACTIVE_SPLIT,
    SP_ST_ALLOCATED_BYTES,
    SP_ST_RESERVED_BYTES,
    SP_ST_ACTIVE_BYTES,
    SP_ST_INACTIVE_SPLIT_BYTES,
    SP_ST_REQUESTED_BYTES,
    SP_ST_NARRAYS
};

typedef struct sp_dev_stats {
    sp_stat_t arr[SP_ST_NARRAYS][SP_STAT_NTYPES]; /* [array][all/small/large] */
    sp_stat_t oversize_allocations;               /* blocks >= max_split_size handed out */
    sp_stat_t oversize_segments;                  /* segments >= max_split_size */
    int64_t num_alloc_retries;                    /* alloc_block calls after release_cached */
    int64_t num_ooms;                             /* OOMs reported to callers */
    int64_t max_split_size;                       /* bytes; -1 when unlimited */
    int64_t num_sync_all_streams;                 /* synchronize_and_free_events calls */
    int64_t num_device_alloc;                     /* successful segment allocations */
    int64_t num_device_free;                      /* segment releases */
} sp_dev_stats_t;

/* PyTorch's update_stat: current += delta; peak tracks current; delta > 0 counts as allocated,
 * delta < 0 as freed (derived, see sp_stat_t). */
static inline void sp__stat_add(sp_stat_t *s, int64_t delta) {
    s->current += delta;
    if (s->current > s->peak)
        s->peak = s->current;
    if (delta > 0)
        s->allocated += delta;
}

/* Update array `a` for the aggregate and the small or large type. */
static inline void sp__stat_arr(sp_dev_stats_t *st, int a, bool is_small, int64_t delta) {
    sp__stat_add(&st->arr[a][SP_STAT_ALL], delta);
    sp__stat_add(&st->arr[a][is_small ? SP_STAT_SMALL : SP_STAT_LARGE], delta);
}

/* The same with a known direction (n >= 0): the hot paths use these to skip the sign tests. */
static inline void sp__stat_inc1(sp_stat_t *s, int64_t n) {
    s->current += n;
    s->allocated += n;
    if (s->current > s->peak)
        s->peak = s->current;
}
static inline void sp__stat_dec1(sp_stat_t *s, int64_t n) {
    s->current -= n; /* freed grows by n through its derivation */
}
static inline void sp__stat_inc(sp_dev_stats_t *st, int a, bool is_small, int64_t n) {
    sp__stat_inc1(&st->arr[a][SP_STAT_ALL], n);
    sp__stat_inc1(&st->arr[a][is_small ? SP_STAT_SMALL : SP_STAT_LARGE], n);
}
static inline void sp__stat_dec(sp_dev_stats_t *st, int a, bool is_small, int64_t n) {
    sp__stat_dec1(&st->arr[a][SP_STAT_ALL], n);
    sp__stat_dec1(&st->arr[a][is_small ? SP_STAT_SMALL : SP_STAT_LARGE], n);
}

/* ---- blocks, segments, block pools ------------------------------------------------------- */

struct sp_segment;
struct sp_bpool;
struct sp_devalloc;

typedef struct sp_block {
    uintptr_t addr;         /* start address (lock) */
    size_t size;            /* bytes, a multiple of 512 (lock) */
    size_t requested;       /* caller's size while allocated or pending, else 0 (lock) */
    sp_stream_t stream;     /* allocation stream == its segment's stream (const) */
    struct sp_segment *seg; /* owning segment (const) */
    struct sp_block *prev;  /* lower neighbour in the segment, NULL at its start (lock) */
    struct sp_block *next;  /* higher neighbour in the segment (lock) */
    struct sp_block *left;  /* free-set tree links, valid while in_set (lock) */
    struct sp_block *right; /* (lock) */
    struct sp_block *hnext; /* pointer-map chain while allocated; spare list otherwise */
    uint64_t gc_count;      /* bpool's get_free_block count when inserted (GC age) */
    sp_stream_t *uses;      /* streams recorded by sp_record_stream (malloc'd) (lock) */
    uint32_t nuses;         /* entries in uses (lock) */
    uint32_t cap_uses;      /* capacity of uses (lock) */
    uint32_t context;       /* history context of the allocation, 0 if none (lock) */
    int32_t event_count;    /* outstanding events of a pending free (lock) */
    int8_t height;          /* AVL height while in_set (lock) */
    bool allocated;         /* handed out and not yet freed (lock) */
    bool in_set;            /* in its bpool's free set (lock) */
    bool unmapped;          /* expandable: address space without memory; in its bpool's
                             * unmapped list (chained by left/right), never in a set (lock) */
} sp_block_t;

typedef struct sp_segment {
    uintptr_t base;           /* start address (const) */
    size_t size;              /* bytes (const) */
    sp_stream_t stream;       /* allocation stream (const) */
    struct sp_bpool *bpool;   /* small or large block pool of its MemPool (const) */
    uint64_t seq;             /* per-pool sequence number in growth order, from 0 (const) */
    uint32_t context;         /* history context of the request that grew it (lock) */
    sp_block_t *head;         /* its lowest block (lock) */
    bool expandable;          /* an expandable segment: size is address space (const) */
    size_t page;              /* expandable: bytes per mapped page (const) */
    size_t mapped;            /* expandable: bytes mapped (lock) */
    struct sp_segment *pprev; /* pool's segment list, in seq order (lock) */
    struct sp_segment *pnext; /* (lock) */
} sp_segment_t;

/* The free set: an AVL tree ordered by (stream, size, address), or for symmetric pools by
 * (stream, size, segment seq, offset) so that best fit is rank-independent. */
typedef struct sp_block_set {
    sp_block_t *root; /* (lock) */
    size_t count;     /* blocks in the set (lock) */
    bool by_seq;      /* symmetric ordering (const) */
} sp_block_set_t;

void sp__bset_insert(sp_block_set_t *set, sp_block_t *b);
void sp__bset_remove(sp_block_set_t *set, sp_block_t *b);
/* The smallest block with key >= (stream, size, -inf), or NULL. */
sp_block_t *sp__bset_lower_bound(const sp_block_set_t *set, sp_stream_t stream, size_t size);
/* The set's order: <0, 0, >0. Within a segment, offset order equals address order. */
static inline int sp__bset_cmp(bool by_seq, const sp_block_t *a, const sp_block_t *b) {
    uintptr_t sa = (uintptr_t)a->stream, sb = (uintptr_t)b->stream;
    if (sa != sb)
        return sa < sb ? -1 : 1;
    if (a->size != b->size)
        return a->size < b->size ? -1 : 1;
    if (by_seq && a->seg->seq != b->seg->seq)
        return a->seg->seq < b->seg->seq ? -1 : 1;
    /* Within a segment, offset order equals address order. */
    if (a->addr != b->addr)
        return a->addr < b->addr ? -1 : 1;
    return 0;
}

/* lower_bound that also gives the link pointing at the result (*slot_p) and the result's in-order
 * predecessor (*pred_p, NULL if none), for sp__bset_replace_at.
 * sp__bset_locate: the link pointing at b (in the set) and b's in-order successor (*succ_p, NULL
 * if none). sp__bset_less: a < b in the set's order. sp__bset_replace_at: put nb (not in the set)
 * where old is (*slot == old); only valid when nb's key sorts strictly between old's in-order
 * neighbours, as then order and balance are unchanged; the count stays. */
static inline bool sp__bset_less(const sp_block_set_t *set, const sp_block_t *a,
                                 const sp_block_t *b) {
    return sp__bset_cmp(set->by_seq, a, b) < 0;
}

static inline sp_block_t *sp__bset_find_fit(sp_block_set_t *set, sp_stream_t stream, size_t size,
                                            sp_block_t ***slot_p, sp_block_t **pred_p) {
    uintptr_t s = (uintptr_t)stream;
    sp_block_t **link = &set->root, **best_link = NULL, *best = NULL, *pred = NULL;
    sp_block_t *n = set->root;
    while (n) {
        uintptr_t ns = (uintptr_t)n->stream;
        bool less = ns < s || (ns == s && n->size < size);
        if (less) {
            pred = n; /* the last node we pass on the right is the largest key below the query */
            link = &n->right;
        } else {
            best = n;
            best_link = link;
            link = &n->left;
        }
        n = *link;
    }
    *slot_p = best_link;
    *pred_p = pred;
    return best;
}

static inline sp_block_t **sp__bset_locate(sp_block_set_t *set, const sp_block_t *b,
                                           sp_block_t **succ_p) {
    sp_block_t **link = &set->root, *succ = NULL;
    for (sp_block_t *n = set->root; n; n = *link) {
        int c = sp__bset_cmp(set->by_seq, b, n);
        if (c == 0) {
            if (n->right) {
                succ = n->right;
                while (succ->left)
                    succ = succ->left;
            }
            *succ_p = succ;
            return link;
        }
        if (c < 0) {
            succ = n; /* the last node we pass on the left is the smallest key above b */
            link = &n->left;
        } else {
            link = &n->right;
        }
    }
    *succ_p = NULL;
    return NULL; /* not in the set: unreachable while the caller checks in_set */
}

static inline void sp__bset_replace_at(sp_block_t **slot, sp_block_t *old, sp_block_t *nb) {
    nb->left = old->left;
    nb->right = old->right;
    nb->height = old->height;
    nb->in_set = true;
    *slot = nb;
    old->in_set = false;
    old->left = old->right = NULL;
}

/* Debug builds: assert the set's order, AVL balance and count (the in-place replacements above
 * rely on the caller's neighbour check). Release builds: nothing. */
#ifndef NDEBUG
void sp__bset_check(const sp_block_set_t *set);
#else
static inline void sp__bset_check(const sp_block_set_t *set) {
    (void)set;
}
#endif

typedef struct sp_bpool {
    sp_block_set_t free;     /* cached free blocks (lock) */
    bool is_small;           /* small (<= 1 MiB requests) or large pool (const) */
    struct sp_mempool *pool; /* owning MemPool (const) */
    uint64_t gfb_count;      /* get_free_block calls while GC is on: the GC clock (lock) */
    sp_block_t *unmapped;    /* expandable: unmapped blocks by (stream, address) (lock) */
} sp_bpool_t;

/* ---- MemPools ---------------------------------------------------------------------------- */

struct sp_mempool {
    sp_mempool_id_t id;       /* {0,0} default; {0,n} user (const) */
    int device;               /* (const) */
    char *name;               /* copied at create, may be NULL (const) */
    sp_allocator_t allocator; /* pluggable segment allocator if has_allocator (const) */
    bool has_allocator;       /* (const) */
    bool is_default;          /* the device's default pool (const) */
    bool symmetric;           /* made by sp__mempool_create_symmetric (const) */
    bool no_split;            /* never split (const) */
    bool use_on_oom;          /* lend free blocks to OOM'ed default requests (lock) */
    bool destroyed;           /* sp_mempool_destroy was called (lock) */
    void *sym_state;          /* symmetric module's state (const) */
    atomic_int use_count;     /* PyTorch's use count; 0 = freeable */
    sp_bpool_t small;         /* requests <= 1 MiB (lock) */
    sp_bpool_t large;         /* the rest (lock) */
    size_t limit;             /* max reserved bytes, 0 = none (lock) */
    size_t reserved;          /* bytes of its segments (lock) */
    size_t used;              /* bytes of its allocated blocks (lock) */
    size_t nsegments;         /* segments it holds (lock) */
    uint64_t next_seq;        /* next segment sequence number (lock) */
    sp_segment_t *seg_head;   /* segments in seq order (lock) */
    sp_segment_t *seg_tail;   /* (lock) */
    struct sp_mempool *next;  /* the device's pool list in creation order (lock) */
    struct sp_devalloc *dev;  /* its device allocator (const) */
};

/* ---- pointer map ------------------------------------------------------------------------- */

typedef struct sp_ptr_map {
    sp_block_t **buckets; /* chained by hnext (lock) */
    size_t mask;          /* nbuckets - 1, a power of two minus one (lock) */
    size_t count;         /* allocated blocks (lock) */
} sp_ptr_map_t;

sp_status_t sp__ptr_map_init(sp_ptr_map_t *m);
void sp__ptr_map_fini(sp_ptr_map_t *m);
sp_block_t *sp__ptr_map_find(const sp_ptr_map_t *m, uintptr_t addr);
/* Double the bucket count (out of line: rare). */
void sp__ptr_map_grow(sp_ptr_map_t *m);

/* Insert and remove are inline: they sit on every malloc and free. Blocks are 512-byte
 * aligned: drop those bits and mix with a Fibonacci multiplier; the mask picks the bucket. */
static inline size_t sp__ptr_map_hash(uintptr_t addr) {
    uint64_t x = (uint64_t)(addr >> 9);
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 17);
}

static inline void sp__ptr_map_insert(sp_ptr_map_t *m, sp_block_t *b) {
    if (SP_UNLIKELY(m->count > m->mask))
        sp__ptr_map_grow(m);
    sp_block_t **head = &m->buckets[sp__ptr_map_hash(b->addr) & m->mask];
    b->hnext = *head;
    *head = b;
    m->count++;
}

static inline sp_block_t *sp__ptr_map_remove(sp_ptr_map_t *m, uintptr_t addr) {
    if (SP_UNLIKELY(!m->buckets))
        return NULL;
    sp_block_t **pp = &m->buckets[sp__ptr_map_hash(addr) & m->mask];
    for (sp_block_t *b = *pp; b; pp = &b->hnext, b = b->hnext) {
        if (b->addr == addr) {
            *pp = b->hnext;
            b->hnext = NULL;
            m->count--;
            return b;
        }
    }
    return NULL;
}

/* ---- events ------------------------------------------------------------------------------ */

typedef struct sp_evq_entry {
    sp_dev_event_t event;      /* recorded on the queue's stream */
    sp_block_t *block;         /* the pending block it holds back */
    struct sp_evq_entry *next; /* FIFO order */
} sp_evq_entry_t;

typedef struct sp_evq {
    sp_stream_t stream;          /* the used stream the events were recorded on */
    sp_evq_entry_t *head, *tail; /* FIFO (lock) */
    struct sp_evq *next;         /* the device's queues (lock) */
} sp_evq_t;

/* ---- per-device allocator ---------------------------------------------------------------- */

typedef struct sp_devalloc {
    sp_lock_t lock;             /* guards everything below and every pool of this device */
    int device;                 /* (const) */
    size_t total_mem;           /* device total bytes, read at init (const) */
    size_t allowed_max;         /* memory-fraction cap, SIZE_MAX = none (lock) */
    size_t total_reserved;      /* bytes of all segments of the device (lock) */
    bool gc_enabled;            /* fraction set and gc threshold > 0 (lock) */
    sp_dev_stats_t stats;       /* (lock) */
    sp_mempool_t *default_pool; /* {0,0} (const) */
    sp_mempool_t *pools;        /* user and symmetric pools in creation order (lock) */
    sp_mempool_t *pools_tail;   /* (lock) */
    sp_ptr_map_t map;           /* allocated blocks by start address (lock) */
    sp_segment_t **segs;        /* all segments sorted by base address (lock) */
    size_t nsegs;               /* (lock) */
    size_t cap_segs;            /* (lock) */
    sp_evq_t *evqs;             /* per-stream event FIFOs (lock) */
    size_t pending_events;      /* entries in all evqs (lock) */
    sp_block_t *spare;          /* recycled block structs (lock) */
    atomic_uintptr_t lo;        /* lowest segment address ever (free's device guess) */
    atomic_uintptr_t hi;        /* highest segment end ever */
} sp_devalloc_t;

typedef struct sp_alloc_global {
    pthread_mutex_t init_lock;  /* serializes init and shutdown */
    const sp_device_ops_t *ops; /* backend (init_lock, then const until shutdown) */
    sp_device_caps_t caps;      /* backend capabilities */
    sp_alloc_conf_t conf;       /* resolved allocator options at init */
    bool round_plain;           /* no roundup_power2_divisions: round to 512 B only (const) */
    bool exp_on;                /* expandable segments in use (conf, backend VMM) (const) */
    int ndev;                   /* devices */
    sp_devalloc_t *devs;        /* [ndev] */
} sp_alloc_global_t;

extern sp_alloc_global_t sp__g;
extern atomic_int sp__ready; /* 1 once sp__g is initialized */

sp_status_t sp__alloc_init_slow(void);
static inline sp_status_t sp__alloc_ensure(void) {
    if (SP_LIKELY(atomic_load_explicit(&sp__ready, memory_order_acquire)))
        return SP_SUCCESS;
    return sp__alloc_init_slow();
}
/* Ensure init and validate a device number (SP_ERR_INVALID_ARGUMENT with a message). */
sp_status_t sp__alloc_device(int device, sp_devalloc_t **d_p);
/* The hot-path form: the device allocator when initialized and the number valid, else NULL
 * (then sp__alloc_device initializes or explains). */
static inline sp_devalloc_t *sp__alloc_device_fast(int device) {
    if (SP_LIKELY(atomic_load_explicit(&sp__ready, memory_order_acquire)) &&
        SP_LIKELY((unsigned)device < (unsigned)sp__g.ndev))
        return &sp__g.devs[device];
    return NULL;
}

/* ---- allocator.c ------------------------------------------------------------------------- */

size_t sp__round_size(size_t size);
size_t sp__allocation_size(size_t size);
void sp__fmt_size(size_t bytes, char *buf, size_t len);

/* The whole malloc path for `pool` (the default pool or a private one). `routed_private` says
 * the request belongs to a private pool, which turns off the use_on_oom fallback. */
sp_status_t sp__alloc_malloc(sp_devalloc_t *d, sp_mempool_t *pool, size_t size, sp_stream_t stream,
                             void **ptr_p);
/* Free a block (lock held): the free request, then events or free_block. */
void sp__alloc_free_locked(sp_devalloc_t *d, sp_block_t *b, uint32_t context);
/* Complete a free: merge, return to the free set, stats (lock held). free_ctx: history context
 * of the sp_free call when it completes at once (0 when events completed it later). */
void sp__alloc_free_block(sp_devalloc_t *d, sp_block_t *b, uint32_t free_ctx);
/* Hand out free block b (removed from its set, or fresh) for a rounded size (lock held). */
void sp__alloc_found_block(sp_devalloc_t *d, sp_block_t *b, size_t size, size_t orig,
                           uint32_t context);
/* get_free_block on one block pool (lock held); NULL if none fits. */
sp_block_t *sp__alloc_get_free_block(sp_devalloc_t *d, sp_bpool_t *bp, size_t size,
                                     sp_stream_t stream);
/* Allocate a new segment of alloc_size for bp (lock held). *why_p gets the failure kind:
 * 0 device OOM, 1 memory fraction, 2 pool limit; other statuses are device errors. */
sp_status_t sp__alloc_segment(sp_devalloc_t *d, sp_bpool_t *bp, size_t alloc_size,
                              sp_stream_t stream, uint32_t context, sp_block_t **block_p,
                              int *why_p);
/* Release a segment whose only block is free (lock held). */
void sp__alloc_release_segment(sp_devalloc_t *d, sp_segment_t *seg);
sp_block_t *sp__block_new(sp_devalloc_t *d);
void sp__block_recycle(sp_devalloc_t *d, sp_block_t *b);
/* Is this block a whole free segment that may be released? */
static inline bool sp__block_releasable(const sp_block_t *b) {
    return !b->prev && !b->next && !b->allocated && b->event_count == 0 && b->in_set;
}

/* ---- release.c --------------------------------------------------------------------------- */

void sp__alloc_process_events(sp_devalloc_t *d);
/* Synchronize the events of every pending block (pool != NULL: only that pool's). */
void sp__alloc_sync_events(sp_devalloc_t *d, const sp_mempool_t *pool);
sp_status_t sp__alloc_insert_events(sp_devalloc_t *d, sp_block_t *b);
/* Release the fully free segments of one pool (stream filter when filter_stream). */
size_t sp__alloc_release_pool(sp_devalloc_t *d, sp_mempool_t *pool, bool filter_stream,
                              sp_stream_t stream);
/* PyTorch's release_cached_blocks({0,0}): sync events, free default and freeable pools. */
void sp__alloc_release_cached(sp_devalloc_t *d);
bool sp__alloc_release_available(sp_devalloc_t *d, sp_bpool_t *bp, size_t size, sp_stream_t stream);
void sp__alloc_gc(sp_devalloc_t *d);

/* ---- segments.c -------------------------------------------------------------------------- */

sp_status_t sp__segidx_insert(sp_devalloc_t *d, sp_segment_t *seg);
void sp__segidx_remove(sp_devalloc_t *d, sp_segment_t *seg);
sp_segment_t *sp__segidx_find(const sp_devalloc_t *d, uintptr_t addr);

/* ---- expandable.c ----------------------------------------------------------------------- */

/* Does this pool grow expandable segments? Pools with a pluggable segment allocator and
 * symmetric pools keep fixed segments. */
static inline bool sp__exp_pool(const sp_mempool_t *pool) {
    return sp__g.exp_on && !pool->has_allocator && !pool->symmetric;
}
/* Bytes per mapped page of bp's expandable segments. */
size_t sp__exp_page(const sp_bpool_t *bp);
/* PyTorch's try_allocate_expandable_block: a free mapped block of >= size bytes, taken out of
 * the set, mapping pages (and reserving a segment) as needed. *why_p = 2: pool limit. */
sp_status_t sp__exp_alloc(sp_devalloc_t *d, sp_bpool_t *bp, size_t size, sp_stream_t stream,
                          uint32_t ctx, sp_block_t **block_p, int *why_p);
/* Best fit among expandable blocks: from set block b on, the block that can expand least;
 * when it is not b, *slot_p and *pred_p are updated for it. */
sp_block_t *sp__exp_best_fit(sp_bpool_t *bp, sp_block_t *b, sp_stream_t stream,
                             sp_block_t ***slot_p, sp_block_t **pred_p);
/* Unmap the free pages of an expandable segment (after syncing its stream); releases the
 * segment when nothing is mapped any more. Returns the bytes unmapped. */
size_t sp__exp_release(sp_devalloc_t *d, sp_segment_t *seg);

/* ---- mempool.c --------------------------------------------------------------------------- */

sp_mempool_t *sp__mempool_new(sp_devalloc_t *d, const sp_mempool_params_t *params, bool is_default,
                              bool symmetric);
void sp__mempool_free_struct(sp_mempool_t *pool);
/* Threads with a non-empty routing stack (mempool.c): sp_malloc calls sp__mempool_routed
 * only when it is not 0. */
extern atomic_int sp__routing_threads;
/* The calling thread's innermost routed pool on `device`, or NULL. */
sp_mempool_t *sp__mempool_routed(int device);
/* Forget the calling thread's routing (sp_shutdown). */
void sp__mempool_routing_reset(void);

/* ---- stats.c ----------------------------------------------------------------------------- */

void sp__stats_init(sp_dev_stats_t *st, size_t max_split_size);

#endif /* SP_ALLOC_INT_H */
