/*
 * allocator.h: private to pool/: the caching allocator's structures (block pools, MemPools,
 * per-device allocators, the process-wide allocator state; blocks and segments are in block.h,
 * free sets in block_set.h, the pointer map in ptr_map.h, stats in stats.h) and allocator.c's
 * entry points.
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
#ifndef SP_POOL_ALLOCATOR_H
#define SP_POOL_ALLOCATOR_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "core/core_lock.h"
#include "core/gap_array.h"
#include "pool/block.h"
#include "pool/block_set.h"
#include "pool/device/device.h"
#include "pool/history.h"
#include "pool/pool.h"
#include "pool/ptr_map.h"
#include "pool/stats.h"
#include "sympool/mempool.h"
#include "sympool/pool.h"

/* PyTorch's constants (reference/pytorch-allocator.md section 1.1). */
#define SP_MIN_BLOCK_SIZE ((size_t)512)
#define SP_SMALL_SIZE ((size_t)1 << 20)
#define SP_SMALL_BUFFER ((size_t)2 << 20)
#define SP_MIN_LARGE_ALLOC ((size_t)10 << 20)
#define SP_ROUND_LARGE ((size_t)2 << 20)
/* PyTorch's cap: a request of 1 EB (2^60 bytes) or more is an OOM before the allocator runs. */
#define SP_ONE_EB ((size_t)1 << 60)

typedef struct sp_bpool {
    sp_block_set_t free;     /* cached free blocks (lock) */
    bool is_small;           /* small (<= 1 MiB requests) or large pool (const) */
    sp_stat_t *tstat;        /* its type's Stats in its device's stats (sp__stat_t_inc) (const) */
    struct sp_mempool *pool; /* owning MemPool (const) */
    uint64_t gfb_count;      /* get_free_block calls while GC is on: the GC clock (lock) */
    sp_block_t *unmapped;    /* expandable: unmapped blocks by (stream, address) (lock) */
} sp_bpool_t;

/* ---- MemPools ---------------------------------------------------------------------------- */

/* Refused deferred unmaps a pool remembers (sp_mempool.exp_stuck). */
#define SP_EXP_STUCK 4

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
    size_t small_max;         /* requests up to this size go to `small`: SP_SMALL_SIZE, or 0
                                 while they share the large pool's expandable segments (lock) */
    bool exp_unmapped;        /* an expandable page of it was ever unmapped (lock) */
    sp_bpool_t small;         /* requests <= small_max (lock) */
    sp_bpool_t large;         /* the rest (lock) */
    size_t limit;             /* max reserved bytes, 0 = none (lock) */
    size_t reserved;          /* bytes of its segments (lock) */
    size_t used;              /* bytes of its allocated blocks (lock) */
    size_t nsegments;         /* segments it holds (lock) */
    uint64_t next_seq;        /* next segment sequence number (lock) */
    sp_segment_t *seg_head;   /* segments in seq order (lock) */
    sp_segment_t *seg_tail;   /* (lock) */
    struct sp_mempool *next;  /* the device's pool list in creation order (lock) */
    struct sp_mempool *prev;  /* (lock) */
    struct sp_devalloc *dev;  /* its device allocator (const; freed at sp_shutdown) */
    /* sp__handles_generation() when made; older = stale, 0 = released (handles.c): set at
     * create, to 0 once (device lock), read before the lock by the handle checks. */
    _Atomic uint64_t generation;
    /* Pages of its expandable segments the device still maps although the books say unmapped:
     * a growth's deferred unmap the device refused (expandable.c, keep_stuck). A growth that
     * maps there takes them over; every growth and release tries the others again (lock). */
    struct {
        uintptr_t addr; /* start (page aligned) */
        size_t len;     /* bytes, whole pages */
        size_t page;    /* its segment's page */
    } exp_stuck[SP_EXP_STUCK];
    int exp_nstuck; /* entries in exp_stuck (lock) */
};

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
    sp_lock_t lock; /* guards everything below and every pool of this device */
    int device;     /* (const) */
    /* Idle block structs, chained by hnext (lock). Beside `device` so that the two fill the
     * 8 bytes after the lock: the struct's size is in every &sp__g.devs[i]. */
    sp_ref_t spare;
    size_t total_mem;      /* device total bytes, read at init (const) */
    size_t allowed_max;    /* memory-fraction cap, SIZE_MAX = none (lock) */
    double fraction;       /* the fraction as set, 1.0 = none; read back exactly (lock) */
    size_t total_reserved; /* bytes of all segments of the device (lock) */
    bool gc_enabled;       /* fraction set and gc threshold > 0 (lock) */
    /* True while the lock's holder runs a pool's segment allocator (user code, which may wait
     * for what a forking thread holds, as a Python one waits for the GIL): the fork handler
     * then leaves the lock to it (sp__lock_unless). Written by the holder only. In the padding
     * after gc_enabled, as the two below. */
    atomic_bool in_user_cb;
    bool fork_left; /* the fork handler left this lock to its holder (sp__g.init_lock) */
    /* Blocks registered in thread caches (thread_cache.h; at most 16384 a thread) (lock). In
     * the padding after gc_enabled: the struct's size is in every &sp__g.devs[i]. */
    uint32_t tc_blocks;
    sp_dev_stats_t stats;       /* (lock) */
    sp_mempool_t *default_pool; /* {0,0} (const) */
    sp_mempool_t *pools;        /* user and symmetric pools in creation order (lock) */
    sp_mempool_t *pools_tail;   /* (lock) */
    sp_ptr_map_t map;           /* allocated blocks by start address (lock) */
    /* {base, segment} by base, and tombstones (segs.zeros of them) (segment_index.c) (lock) */
    sp_gap_array_t segs;
    uint32_t use_blocks; /* allocated blocks with a uses list (lock) */
    /* Never-used structs from slab_next on (at most a slab's 1023) (lock). A 32-bit count here,
     * in the word after use_blocks: the gap array's count of tombstones took the segment
     * index's, and a word more would grow the struct, which every &sp__g.devs[i] multiplies by
     * (its size, 1208, is one imul; 1216 took three instructions on every sp_malloc). */
    uint32_t slab_left;
    struct sp_evq_set *evqs;     /* per-stream event FIFOs, and their index (release.c) (lock) */
    size_t pending_events;       /* entries in all evqs (lock) */
    struct sp_block_slab *slabs; /* where every block and segment struct lives (lock) */
    struct sp_block_slab *kept;  /* unused slabs earlier allocators of this device left (lock) */
    sp_block_t *slab_next;       /* the newest slab's first never-used struct (lock) */
    atomic_uintptr_t lo;         /* lowest segment address ever (free's device guess) */
    atomic_uintptr_t hi;         /* highest segment end ever */
    /* Expandable segments' device work since the last sp_reset_accumulated_memory_stats
     * (sp_x_vmm_counters; lock). Pages, not calls: the cuda backend creates and maps (and
     * unmaps and releases) each page on its own, so its time follows the pages. */
    int64_t exp_pages_mapped, exp_pages_unmapped;
    int64_t exp_bytes_mapped, exp_bytes_unmapped;
    int64_t exp_map_calls, exp_unmap_calls;
    int64_t exp_recycle_syncs; /* stream and device synchronizations RECYCLE asked for */
    /* Idle segment structs, chained by pnext (lock). A segment's room (SP_SEG_SLOTS consecutive
     * structs) stays a segment's: given to the block spare list, it could never be a segment
     * again, so every segment made and released took fresh slab room for good (168 bytes a
     * segment, unbounded: bench/results/2026-11-30-s26-leak.jsonl). Last, as the cold paths
     * (segment create and release) are its only users. */
    struct sp_segment *seg_spare;
} sp_devalloc_t;

typedef struct sp_alloc_global {
    pthread_mutex_t init_lock;  /* serializes init and shutdown */
    const sp_device_ops_t *ops; /* backend (init_lock, then const until shutdown) */
    sp_device_caps_t caps;      /* backend capabilities */
    sp_alloc_conf_t conf;       /* resolved allocator options at init */
    bool round_plain;           /* no roundup_power2_divisions: round to 512 B only (const) */
    bool hit_plain;             /* round_plain and caching on: the cache hit's one test (const) */
    bool hit_fast;              /* hit_plain, no expandable segments: malloc_hit applies (const) */
    int fast_rest;              /* sp__fast_off's share of these settings while ready (const) */
    bool exp_on;                /* expandable segments in use (conf, backend VMM) (const) */
    bool exp_recycle;           /* SYMPOOL_EXPANDABLE_RECYCLE (const) */
    bool exp_borrow;            /* SYMPOOL_EXPANDABLE_BORROW (const) */
    size_t exp_shared;          /* SYMPOOL_EXPANDABLE_SHARED with BORROW on, else 0 (const) */
    bool exp_align;             /* SYMPOOL_EXPANDABLE_ALIGN with RECYCLE on (const) */
    bool exp_align_small;       /* SYMPOOL_EXPANDABLE_ALIGN_SMALL with ALIGN on (const) */
    bool exp_fit_end;           /* SYMPOOL_EXPANDABLE_FIT_END with ALIGN on (const) */
    bool exp_whole;             /* SYMPOOL_EXPANDABLE_WHOLE with ALIGN on (const) */
    double exp_align_skip;      /* SYMPOOL_EXPANDABLE_ALIGN_SKIP: pages ALIGN may skip (const) */
    bool exp_side;              /* SYMPOOL_EXPANDABLE_SIDE with RECYCLE on (const) */
    bool exp_pin;               /* SYMPOOL_EXPANDABLE_PIN with RECYCLE on (const) */
    size_t exp_page;            /* SYMPOOL_EXPANDABLE_PAGE for the large pool, 0 = PyTorch's */
    size_t tc_limit;            /* SYMPOOL_THREAD_CACHE: idle bytes per thread, 0 = off (const) */
    int ndev;                   /* devices */
    sp_devalloc_t *devs;        /* [ndev] */
} sp_alloc_global_t;

/* sp__fast_off's share of the settings while ready with the thread cache on (sp__g.fast_rest):
 * the plain hit gives way to the cache (SP_FAST_NO_HIT) and so does the plain free
 * (SP_FAST_REASON); sp_malloc and sp_free then call the hits' copies with the cache in front. */
enum { SP_FAST_TC_REST = SP_FAST_NO_HIT + SP_FAST_REASON };

/* Hidden, so that the fast paths read it straight (no indirection through the GOT of the shared
 * library); it is defined with the library's default hidden visibility anyway. */
extern __attribute__((visibility("hidden"))) sp_alloc_global_t sp__g;
extern atomic_int sp__ready; /* 1 once sp__g is initialized */

sp_status_t sp__alloc_init_slow(void);

/* Point sp_malloc's and sp_free's hits at the bias owner's copies or at the CAS ones, as
 * core_lock.h's sp__lock_bias_state says (init; whole paths once it changed). */
void sp__alloc_hits_choose(void);
bool sp__alloc_hits_biased(void); /* the owner's copies are chosen (tests) */
/* The shutdown gate. The cold public calls (statistics, summaries, snapshots, empty_cache,
 * streams, MemPool management) pass it for their whole length; sp_shutdown closes it and waits
 * for the calls inside, so it never frees what one of them reads, and a call arriving while it
 * runs is refused with SP_ERR_INVALID_USAGE. The allocation fast path (sp_malloc, sp_free,
 * sp_record_stream) takes no gate: a shared atomic on every allocation would cost more than the
 * cache hit itself; pool.h says what the caller guarantees instead. */
typedef struct sp_gate {
    bool in;
} sp_gate_t;
sp_gate_t sp__gate_enter(void);
void sp__gate_leave(sp_gate_t *g);
sp_status_t sp__gate_refused(const char *fn);
/* fork() (fork.c): hold the shutdown lock across it; the child keeps only its own thread's
 * calls counted in. */
void sp__gate_fork_lock(void);
void sp__gate_fork_unlock(bool in_child);
#define SP_GATE_OR(fail_value)                                                                     \
    __attribute__((cleanup(sp__gate_leave))) sp_gate_t sp_gate_ = sp__gate_enter();                \
    if (SP_UNLIKELY(!sp_gate_.in))                                                                 \
    return (fail_value)
#define SP_GATE(fn) SP_GATE_OR(sp__gate_refused(fn))

static inline sp_status_t sp__alloc_ensure(void) {
    if (SP_LIKELY(atomic_load_explicit(&sp__ready, memory_order_acquire)))
        return SP_SUCCESS;
    return sp__alloc_init_slow();
}
/* Ensure init and validate a device number (SP_ERR_INVALID_ARGUMENT with a message that names
 * fn, the public call refusing it, as every other refusal does). */
sp_status_t sp__alloc_device(const char *fn, int device, sp_devalloc_t **d_p);
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

/* The whole malloc path for `pool` (the default pool or a private one): the out-of-line twin
 * of allocator.c's inline alloc_malloc, which sp_malloc uses. Only the default pool
 * falls back to use_on_oom pools. */
sp_status_t sp__alloc_malloc(sp_devalloc_t *d, sp_mempool_t *pool, size_t size, sp_stream_t stream,
                             void **ptr_p);
/* The size rule of every malloc entry point, for sizes of 1 EB and more, SIZE_MAX included:
 * SP_ERR_OUT_OF_MEMORY ("Tried to allocate more than 1EB memory", not counted, as PyTorch's
 * allocate()). SP_SUCCESS below 1 EB, which every rounding holds without overflow. */
sp_status_t sp__alloc_check_size(const char *what, int device, size_t size);
/* Segments whose stream sp_stream_destroy destroyed while they still held allocated blocks, on
 * every device (atomic; changed under the segment's device lock). Their free blocks stay cached
 * under the dead handle until the segment goes, so a hit no longer implies an earlier checked
 * miss on a live stream (sp__stream_check's premise): while any exists, the malloc entry points
 * check every stream first (the fast paths give way: one SP_FAST_REASON while it is not 0). */
extern atomic_uint sp__orphan_segs;
/* sp_stream_destroy, after its releases (d->lock): every segment of any pool on `stream` that
 * is left becomes an orphan. */
void sp__alloc_orphan_stream(sp_devalloc_t *d, sp_stream_t stream);
/* sp_shutdown, once every segment is gone: no orphan is left (and no fast-path reason). */
void sp__alloc_orphans_reset(void);
/* The malloc entry points' check while orphans exist: `stream` (mapped, not a pseudo handle)
 * must be a live stream of d's device, as sp__stream_check says. SP_SUCCESS while none. */
static inline sp_status_t sp__alloc_orphan_check(const sp_devalloc_t *d, sp_stream_t stream,
                                                 const char *fn) {
    if (SP_LIKELY(!atomic_load_explicit(&sp__orphan_segs, memory_order_relaxed)))
        return SP_SUCCESS;
    return sp__stream_check(stream, d->device, fn);
}
/* sp_torch_free's free: the block that starts at ptr, looked for on `device` first, freed under
 * one lock. *size_p and *device_p get the block's requested size and device (for the caller's
 * check of what PyTorch passed). SP_ERR_INVALID_USAGE (explained, WARN) for a pointer that is
 * not a live block start: nothing is freed then. Takes the device lock itself. */
sp_status_t sp__alloc_free_sized(void *ptr, int device, size_t *size_p, int *device_p);
/* Complete a free: merge, return to the free set, stats (lock held). free_ctx: history context
 * of the sp_free call when it completes at once (0 when events completed it later). */
void sp__alloc_free_block(sp_devalloc_t *d, sp_block_t *b, uint32_t free_ctx);
/* Free allocated block b (in the pointer map, no recorded streams) to its pool, as sp_free would
 * with no history context (lock held): a thread cache giving a block back. */
void sp__alloc_free_held(sp_devalloc_t *d, sp_block_t *b);
/* Hand out free block b (removed from its set, or fresh) for a rounded size (lock held). */
void sp__alloc_found_block(sp_devalloc_t *d, sp_block_t *b, size_t size, size_t orig,
                           uint32_t context);
/* get_free_block on one block pool (lock held); NULL if none fits. */
sp_block_t *sp__alloc_get_free_block(sp_devalloc_t *d, sp_bpool_t *bp, size_t size,
                                     sp_stream_t stream);
/* Why growing by a segment (or by pages of an expandable one) was refused; the OOM report
 * names the pool limit or the memory fraction when one of them was the reason. */
typedef enum sp_grow_refusal {
    SP_GROW_DEVICE = 0,     /* the device (or the pluggable allocator) had no memory */
    SP_GROW_FRACTION = 1,   /* sp_set_memory_fraction's cap */
    SP_GROW_POOL_LIMIT = 2, /* the MemPool's sp_mempool_set_limit */
} sp_grow_refusal_t;

/* Allocate a new segment of alloc_size for bp (lock held). On SP_ERR_OUT_OF_MEMORY *why_p says
 * who refused; other statuses are device errors. */
sp_status_t sp__alloc_segment(sp_devalloc_t *d, sp_bpool_t *bp, size_t alloc_size,
                              sp_stream_t stream, uint32_t context, sp_block_t **block_p,
                              sp_grow_refusal_t *why_p);
/* Does the memory fraction leave room for alloc_size more bytes on d (lock held)? */
static inline bool sp__alloc_fraction_room(const sp_devalloc_t *d, size_t alloc_size) {
    size_t total = d->total_reserved + alloc_size;
    return total >= d->total_reserved && total <= d->allowed_max;
}
/* Is there room for alloc_size more bytes on d for pool (lock held)? SP_GROW_DEVICE (0) when
 * there is, else the fraction or the pool limit that refuses. */
sp_grow_refusal_t sp__alloc_segment_room(const sp_devalloc_t *d, const sp_mempool_t *pool,
                                         size_t alloc_size);
/* Make memory at ptr (allocated by the caller) a segment of bp with one free block, returned in
 * *block_p (lock held). SP_ERR_SYSTEM (host memory) leaves ptr to the caller. */
void sp__alloc_segment_delete(sp_devalloc_t *d, sp_segment_t *seg);
sp_status_t sp__alloc_segment_new(sp_devalloc_t *d, sp_bpool_t *bp, uintptr_t base, size_t size,
                                  sp_stream_t stream, sp_segment_t **seg_p);
sp_status_t sp__alloc_install_segment(sp_devalloc_t *d, sp_bpool_t *bp, void *ptr,
                                      size_t alloc_size, sp_stream_t stream, uint32_t context,
                                      sp_block_t **block_p);
/* Release a segment whose only block is free (lock held). */
/* context: the history context of the call that releases it (0: none; the segment_free entry
 * then carries the segment's own allocation stack, as PyTorch's release_block does). False when
 * the device refused to free it (logged there): the segment stays, cached, as it was. */
bool sp__alloc_release_segment(sp_devalloc_t *d, sp_segment_t *seg, uint32_t context);
/* sp__alloc_release_segment without freeing the memory: the segment leaves the pool, the index
 * and the statistics; the caller (symmetric/, outside the lock) frees its memory. */
void sp__alloc_detach_segment(sp_devalloc_t *d, sp_segment_t *seg);
sp_block_t *sp__block_new(sp_devalloc_t *d);
/* Block slabs across sp_shutdown/sp_init (both under sp__g.init_lock): adopt takes what the
 * last allocators of d->device kept, free keeps all of d's slabs (arena memory is never unmapped)
 * for the next one, the pages of all but a few given back to the kernel. */
void sp__block_slabs_adopt(sp_devalloc_t *d);
void sp__block_slabs_free(sp_devalloc_t *d);
void sp__block_recycle(sp_devalloc_t *d, sp_block_t *b);
/* Is this block a whole free segment that may be released? */
static inline bool sp__block_releasable(const sp_block_t *b) {
    return b->in_set && !b->prev && !b->next; /* in the set: free, no events */
}

#endif /* SP_POOL_ALLOCATOR_H */
