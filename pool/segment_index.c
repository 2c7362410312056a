/*
 * segment_index.c: the per-device index of segments by address and what pool/pool.h offers the
 * rest of the library on top of it: interior-pointer lookup, the consistent walk snapshots use,
 * and running a function under every device lock. The primitives the symmetric agreement
 * protocol is built on are in sym_primitives.c.
 *
 * The index is an array of {base, segment} sorted by base (binary search over the bases, no
 * pointer followed), kept with its free room where the last change was (core/gap_array.h: new
 * segments mostly sort beside the last new one, so an insert moves few entries or none). A
 * removal leaves a tombstone (segment 0, its base kept), so that a sp_empty_cache that gives
 * back n segments costs O(n), not O(n^2) shifts of the array; the tombstones are swept out in
 * one pass once they outnumber the segments (amortized O(1) a removal). One invariant makes a
 * tombstone as good as a gap: none lies inside a live segment's range (an insert drops those
 * its new segment covers), so the entry at or below an address, if a tombstone, says that no
 * segment holds the address. Every function here either runs with the device lock held
 * (sp__segidx_*) or takes device locks itself, in device order.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "pool/allocator.h"
#include "pool/ptr_map.h"
#include "pool/segment_index.h"
#include "pool/thread_cache.h"

/* ---- the address index ------------------------------------------------------------------- */

/* Fewer tombstones than this are never swept (a sweep is a pass over the array). */
#define SEGIDX_MIN_SWEEP 64

/* Entry i's segment, NULL for a tombstone. */
static inline sp_segment_t *seg_at(const sp_devalloc_t *d, uint32_t i) {
    return (sp_segment_t *)(uintptr_t)sp__gap_at(&d->segs, i)->val;
}

/* First index whose base is > addr (branch-free in each run: sp_empty_cache's removals look up
 * a first live entry that moves along the tombstones, where a compare and branch guessed wrong at
 * about every level). */
static uint32_t upper(const sp_devalloc_t *d, uintptr_t addr) {
    return sp__gap_upper(&d->segs, addr);
}

/* First index whose base is >= addr. */
static uint32_t lower(const sp_devalloc_t *d, uintptr_t addr) {
    uint32_t n = d->segs.n;
    if (n == 0 || sp__gap_at(&d->segs, n - 1)->key < addr)
        return n; /* segments often come in address order: the end, without the search */
    return sp__gap_lower(&d->segs, addr);
}

static void sweep(sp_devalloc_t *d) {
    sp__gap_drop_zero_vals(&d->segs);
}

sp_status_t sp__segidx_insert(sp_devalloc_t *d, sp_segment_t *seg) {
    uint32_t i = lower(d, seg->base), covered = 0;
    /* Entries from i on with a base inside the new range can only be tombstones (segments do
     * not overlap): the first is overwritten, the rest dropped. */
    while (i + covered < d->segs.n &&
           sp__gap_at(&d->segs, i + covered)->key - seg->base < seg->size) {
        assert(seg_at(d, i + covered) == NULL);
        covered++;
    }
    if (covered == 0) {
        if (d->segs.n == d->segs.cap && d->segs.zeros) {
            sweep(d); /* room without growing; i moves with the sweep */
            i = lower(d, seg->base);
        }
        if (!sp__gap_insert(&d->segs, i, seg->base, (uintptr_t)seg))
            return SP_ERR_SYSTEM;
        return SP_SUCCESS;
    }
    if (covered > 1)
        sp__gap_remove(&d->segs, i + 1, covered - 1);
    d->segs.zeros -= covered;
    sp_gap_ent_t *e = sp__gap_at(&d->segs, i);
    e->key = seg->base;
    e->val = (uintptr_t)seg;
    return SP_SUCCESS;
}

void sp__segidx_remove(sp_devalloc_t *d, sp_segment_t *seg) {
    uint32_t i = upper(d, seg->base);
    if (i == 0 || seg_at(d, i - 1) != seg)
        return;
    sp__gap_at(&d->segs, i - 1)->val = 0;
    d->segs.zeros++;
    if (d->segs.zeros >= SEGIDX_MIN_SWEEP && d->segs.zeros > d->segs.n - d->segs.zeros)
        sweep(d);
}

bool sp__segidx_overlaps(const sp_devalloc_t *d, uintptr_t base, size_t size) {
    uint32_t i = upper(d, base); /* entry i is the first starting after base */
    if (i > 0) {
        const sp_segment_t *s = seg_at(d, i - 1);
        if (s && base - s->base < s->size)
            return true;
    }
    for (; i < d->segs.n && sp__gap_at(&d->segs, i)->key - base < size; i++)
        if (seg_at(d, i))
            return true;
    return false;
}

sp_segment_t *sp__segidx_find(const sp_devalloc_t *d, uintptr_t addr) {
    uint32_t i = upper(d, addr);
    if (i == 0)
        return NULL;
    sp_segment_t *s = seg_at(d, i - 1);
    return s && addr - s->base < s->size ? s : NULL;
}

/* Interior-pointer lookup in O(log n): each segment keeps a sorted array of its block starts,
 * built on first use. Splits and merges do not maintain it (that would cost the hot path);
 * instead a hit is validated: the struct found must still belong to this segment and contain
 * the address. Blocks tile their segment, so a struct that passes is the right block (recycled
 * structs have seg == NULL). A miss rebuilds the array once, in O(n). */
static bool bidx_build(sp_segment_t *seg) {
    size_t n = 0;
    for (sp_block_t *b = seg->head; b; b = sp__block_next(b))
        n++;
    if (n > seg->bidx_cap) {
        uintptr_t *na = realloc(seg->bidx_addr, n * sizeof(*na));
        if (na)
            seg->bidx_addr = na;
        sp_block_t **nb = na ? realloc(seg->bidx_blk, n * sizeof(*nb)) : NULL;
        if (nb)
            seg->bidx_blk = nb;
        if (!na || !nb) {
            seg->bidx_n = 0;
            return false;
        }
        seg->bidx_cap = n;
    }
    size_t i = 0;
    for (sp_block_t *b = seg->head; b; b = sp__block_next(b), i++) {
        seg->bidx_addr[i] = b->addr;
        seg->bidx_blk[i] = b;
    }
    seg->bidx_n = n;
    return true;
}

static sp_block_t *bidx_find(const sp_segment_t *seg, uintptr_t addr) {
    size_t lo = 0, hi = seg->bidx_n; /* first start > addr */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (seg->bidx_addr[mid] <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    sp_block_t *b = seg->bidx_blk[lo - 1];
    return b->seg == sp__ptr_ref(seg) && addr >= b->addr && addr < b->addr + b->size ? b : NULL;
}

sp_block_t *sp__segment_block_at(sp_segment_t *seg, uintptr_t addr) {
    sp_block_t *b = bidx_find(seg, addr);
    if (b || addr < seg->base || addr >= seg->base + seg->size)
        return b;
    if (bidx_build(seg))
        return bidx_find(seg, addr);
    for (b = seg->head; b; b = sp__block_next(b)) /* out of host memory for the index: walk */
        if (addr >= b->addr && addr < b->addr + b->size)
            return b;
    return NULL;
}

sp_block_t *sp__segidx_block(const sp_devalloc_t *d, uintptr_t addr) {
    sp_segment_t *seg = sp__segidx_find(d, addr);
    return seg ? sp__segment_block_at(seg, addr) : NULL;
}

/* ---- lookup, walk, locked ---------------------------------------------------------------- */

sp_status_t sp__pool_lookup(const void *ptr, sp_block_info_t *info_p) {
    if (!atomic_load_explicit(&sp__ready, memory_order_acquire) || !ptr || !info_p)
        return sp__error_quiet(SP_ERR_INVALID_USAGE, SP_SUB_POOL, "%p is not in a live block", ptr);
    uintptr_t a = (uintptr_t)ptr;
    for (int i = 0; i < sp__g.ndev; i++) {
        sp_devalloc_t *d = &sp__g.devs[i];
        if (a < atomic_load_explicit(&d->lo, memory_order_relaxed) ||
            a >= atomic_load_explicit(&d->hi, memory_order_relaxed))
            continue; /* never in this device's address range */
        sp__lock(&d->lock);
        /* A block start (what sp_malloc returned) is one hash probe; an interior pointer a
         * binary search in its segment's block index. */
        sp_block_t *b = sp__ptr_map_find(&d->map, a);
        if (!b)
            b = sp__segidx_block(d, a);
        /* A block idle in a thread cache is still marked allocated, but its caller freed it:
         * not live (a collective wrote into one, which the next sp_malloc handed out). */
        if (b && b->allocated && !(sp__g.tc_limit && sp__tc_idle_block(b))) {
            sp_segment_t *seg = sp__bseg(b);
            info_p->device = i;
            info_p->block_base = (void *)b->addr;
            info_p->block_size = b->size;
            info_p->requested_size = b->requested;
            info_p->segment_base = (void *)seg->base;
            info_p->segment_size = seg->size;
            info_p->segment_seq = seg->seq;
            info_p->pool = seg->bpool->pool;
            info_p->stream = sp__block_stream(b);
            sp__unlock(&d->lock);
            return SP_SUCCESS;
        }
        sp__unlock(&d->lock);
    }
    return sp__error_quiet(SP_ERR_INVALID_USAGE, SP_SUB_POOL, "%p is not in a live sympool block",
                           ptr);
}

sp_status_t sp__pool_free_set_requested(void *ptr, size_t requested) {
    uintptr_t a = (uintptr_t)ptr;
    for (int i = 0; ptr && i < sp__g.ndev; i++) {
        sp_devalloc_t *d = &sp__g.devs[i];
        if (a < atomic_load_explicit(&d->lo, memory_order_relaxed) ||
            a >= atomic_load_explicit(&d->hi, memory_order_relaxed))
            continue;
        sp__lock(&d->lock);
        /* A walk of the segment's blocks, not its lookup index: that index is built on demand
         * and kept, and a call made once per block of a replay's starting state needs none. */
        sp_segment_t *seg = sp__segidx_find(d, a);
        sp_block_t *b = seg ? seg->head : NULL;
        while (b && b->addr + b->size <= a)
            b = sp__block_next(b);
        /* Free and cached (in its free set): no statistic counts an inactive block's requested
         * size, so nothing else changes. */
        bool ok = b && b->addr == a && b->in_set;
        if (ok)
            b->requested = requested;
        sp__unlock(&d->lock);
        if (ok)
            return SP_SUCCESS;
        /* Devices' address ranges may interleave (segments go where the backend maps them):
         * the next device's range may hold it, as sp__pool_lookup looks. */
    }
    /* quiet, as sp__pool_lookup: asking is how a caller finds out */
    return sp__error_quiet(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                           "sp_x_free_block_set_requested(%p): no free cached block starts there",
                           ptr);
}

static void lock_all(void) {
    for (int i = 0; i < sp__g.ndev; i++)
        sp__lock(&sp__g.devs[i].lock);
}

static void unlock_all(void) {
    for (int i = sp__g.ndev - 1; i >= 0; i--)
        sp__unlock(&sp__g.devs[i].lock);
}

sp_status_t sp__pool_locked(void (*fn)(void *arg), void *arg) {
    SP_CHECK(sp__alloc_ensure());
    lock_all();
    fn(arg);
    unlock_all();
    return SP_SUCCESS;
}

/* Visit the run of mapped blocks that starts at `first` as one segment: a fixed segment is one
 * run; an expandable segment gives one per contiguous mapped range, as PyTorch's snapshot. */
static sp_status_t visit_run(sp_devalloc_t *d, sp_segment_t *seg, sp_block_t *first,
                             sp_segment_visit_fn visit, void *arg, sp_block_view_t **buf,
                             size_t *cap) {
    size_t n = 0;
    for (sp_block_t *b = first; b && !b->unmapped; b = sp__block_next(b))
        n++;
    if (n > *cap) {
        sp_block_view_t *nb = realloc(*buf, n * sizeof(*nb));
        if (!nb)
            return sp__error(SP_ERR_SYSTEM, SP_SUB_POOL, "out of host memory for a walk");
        *buf = nb;
        *cap = n;
    }
    sp_mempool_t *pool = seg->bpool->pool;
    sp_segment_view_t v;
    memset(&v, 0, sizeof(v));
    v.device = d->device;
    v.address = first->addr;
    v.stream = (uintptr_t)seg->stream;
    v.is_small = seg->bpool->is_small;
    v.is_expandable = seg->expandable;
    v.pool_id = pool->id;
    v.pool_name = pool->name;
    v.segment_seq = seg->seq;
    v.context = first == seg->head || !seg->expandable ? seg->context : 0;
    size_t i = 0;
    for (sp_block_t *b = first; b && !b->unmapped; b = sp__block_next(b), i++) {
        sp_block_view_t *bv = &(*buf)[i];
        bv->address = b->addr;
        bv->size = b->size;
        /* An inactive block shows what PyTorch's snapshot shows: the requested size its struct
         * keeps (block.h); the segment's sum counts active blocks only, as PyTorch's does. */
        bv->requested_size = b->requested;
        bv->context = b->context;
        v.total_size += b->size;
        if (b->allocated) {
            bv->state = SP_BLOCK_ACTIVE_ALLOCATED;
            v.allocated_size += b->size;
            v.active_size += b->size;
            v.requested_size += b->requested;
        } else if (sp__block_pending(b)) {
            bv->state = SP_BLOCK_ACTIVE_PENDING_FREE;
            v.active_size += b->size;
            v.requested_size += b->requested;
        } else {
            bv->state = SP_BLOCK_INACTIVE;
        }
    }
    v.nblocks = n;
    v.blocks = *buf;
    visit(&v, arg);
    return SP_SUCCESS;
}

static sp_status_t visit_segment(sp_devalloc_t *d, sp_segment_t *seg, sp_segment_visit_fn visit,
                                 void *arg, sp_block_view_t **buf, size_t *cap) {
    if (!seg->expandable)
        return visit_run(d, seg, seg->head, visit, arg, buf, cap);
    for (sp_block_t *b = seg->head; b; b = sp__block_next(b))
        if (!b->unmapped && (!b->prev || sp__blk(b->prev)->unmapped))
            SP_CHECK(visit_run(d, seg, b, visit, arg, buf, cap));
    return SP_SUCCESS;
}

sp_status_t sp__pool_walk(int device, const sp_mempool_t *pool, sp_segment_visit_fn visit,
                          void *arg) {
    return sp__pool_walk_from(device, pool, NULL, visit, NULL, arg);
}

sp_status_t sp__pool_walk_from(int device, const sp_mempool_t *pool, void (*start)(void *),
                               sp_segment_visit_fn visit, void (*end)(void *), void *arg) {
    SP_CHECK(sp__alloc_ensure());
    if (device >= sp__g.ndev)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "walk: device %d does not exist",
                         device);
    sp_block_view_t *buf = NULL;
    size_t cap = 0;
    sp_status_t s = SP_SUCCESS;
    lock_all();
    /* Blocks idle in thread caches (default pools only) go back first: the walk shows them as
     * the pool would hold them without the caches (free), not as allocated. */
    for (int i = 0; i < sp__g.ndev; i++)
        if ((device < 0 || i == device) && (!pool || pool->is_default))
            (void)sp__tc_drain(&sp__g.devs[i]);
    if (start)
        start(arg);
    for (int i = 0; i < sp__g.ndev && s == SP_SUCCESS; i++) {
        if (device >= 0 && i != device)
            continue;
        sp_devalloc_t *d = &sp__g.devs[i];
        for (uint32_t k = 0; k < d->segs.n && s == SP_SUCCESS; k++) {
            sp_segment_t *seg = seg_at(d, k);
            if (!seg || (pool && seg->bpool->pool != pool))
                continue;
            s = visit_segment(d, seg, visit, arg, &buf, &cap);
        }
    }
    if (end && s == SP_SUCCESS)
        end(arg);
    unlock_all();
    free(buf);
    return s;
}
