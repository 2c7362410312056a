/*
 * expandable.c: PyTorch's expandable segments (expandable_segments:True; the rules of
 * CUDACachingAllocator.cpp's ExpandableSegment and of the allocator code that uses it,
 * reference/pytorch-allocator.md section 1.11).
 *
 * An expandable segment reserves address space for 1.125 x the device's memory (vmm_reserve)
 * and maps physical pages into it as the pool grows: 2 MiB pages for the small pool, the large
 * segment size (20 MiB) for the large pool. There is one per (MemPool, small/large, stream),
 * made on demand; a new one only when no existing one has room. Its blocks tile it as in any
 * segment, but some are *unmapped*: address space without memory, never in a free set, kept in
 * their block pool's `unmapped` list ordered by (stream, address). A block is mapped or not as
 * a whole, and unmapped blocks always start and end on page boundaries.
 *
 *  - Growth (try_allocate_expandable_block): the lowest address, over every expandable segment
 *    of the stream and pool, where a run of free and unmapped blocks holds the request; map just
 *    the pages the request needs there (normally at the end of the segment), merging them with
 *    the free neighbours. Each map: reserved_bytes += bytes, num_device_alloc++, a segment_map
 *    trace entry. The segment count does not change.
 *  - Release (empty_cache, the OOM retry, pool destroy): after synchronizing the device
 *    (PyTorch syncs the segment's stream, which in sympool may already be destroyed), the whole
 * pages inside each free block are unmapped: reserved_bytes -= bytes, num_device_free++, a
 * segment_unmap entry. A segment that is unmapped end to end gives its address space back.
 *  - Stats otherwise as PyTorch: blocks of expandable segments never count in inactive_split,
 *    and any split leaving >= 512 bytes is made (should_split), in both pools.
 *
 * Pools with a pluggable segment allocator and symmetric pools keep fixed segments (a custom
 * allocator cannot map pages, and an NCCL window cannot cover memory mapped after it was
 * registered). Every function runs with the device lock held.
 */
#include <inttypes.h>
#include <stdlib.h>

#include "pool/expandable.h"
#include "pool/release.h"
#include "pool/segment_index.h"

/* ---- the unmapped list of a block pool ------------------------------------------------- */

/* Unmapped blocks are in no free set, so their set links (left, right) chain the list. */
static bool ulist_before(const sp_block_t *a, const sp_block_t *b) {
    if (sp__block_stream(a) != sp__block_stream(b))
        return (uintptr_t)sp__block_stream(a) < (uintptr_t)sp__block_stream(b);
    return a->addr < b->addr;
}

/* b goes between prev and cur (either may be NULL: the list's ends). */
static void ulist_link(sp_bpool_t *bp, sp_block_t *b, sp_block_t *prev, sp_block_t *cur) {
    b->left = sp__bref0(prev);
    b->right = sp__bref0(cur);
    if (cur)
        cur->left = sp__bref(b);
    if (prev)
        prev->right = sp__bref(b);
    else
        bp->unmapped = b;
}

/* The list's place of b, found from its segment's blocks instead of a walk from the list's head
 * (one step per unmapped block of every stream and segment before it). In one segment the
 * nearest unmapped block before b is b's predecessor in the list (every address between them is
 * the segment's, and none is unmapped), and the nearest after it b's successor. Looks at most
 * SP_ULIST_NEAR blocks each way (a segment may hold thousands); false: not found so near. */
#define SP_ULIST_NEAR 16
static bool ulist_near(sp_bpool_t *bp, sp_block_t *b) {
    sp_block_t *x = sp__block_prev(b);
    for (int i = 0; x && i < SP_ULIST_NEAR; i++, x = sp__block_prev(x))
        if (x->unmapped) {
            ulist_link(bp, b, x, sp__blk0(x->right));
            return true;
        }
    x = sp__block_next(b);
    for (int i = 0; x && i < SP_ULIST_NEAR; i++, x = sp__block_next(x))
        if (x->unmapped) {
            ulist_link(bp, b, sp__blk0(x->left), x);
            return true;
        }
    return false;
}

static void ulist_insert(sp_bpool_t *bp, sp_block_t *b) {
    if (ulist_near(bp, b))
        return;
    sp_block_t *prev = NULL, *cur = bp->unmapped;
    while (cur && ulist_before(cur, b)) {
        prev = cur;
        cur = sp__blk0(cur->right);
    }
    ulist_link(bp, b, prev, cur);
}

static void ulist_remove(sp_bpool_t *bp, sp_block_t *b) {
    if (b->left)
        sp__blk(b->left)->right = b->right;
    else
        bp->unmapped = sp__blk0(b->right);
    if (b->right)
        sp__blk(b->right)->left = b->left;
    b->left = b->right = 0;
}

/* ---- small requests in the large pool ---------------------------------------------------- */

/* SYMPOOL_EXPANDABLE_SHARED (ours): while a pool is small, its small requests live in the large
 * pool's expandable segments. Apart, the two pools each leave a partly used last page and holes
 * the other pool's sizes cannot fill; together they pack into about one page less, and while the
 * pool is under a few hundred MiB one 2 MiB page is a large part of it (1% of 256 MiB is 1.3
 * pages). Past the bound new small requests go back to the small pool: in a large pool a page
 * matters little, and small blocks in the large segments would split the large free blocks
 * PyTorch keeps apart for large requests. Blocks already placed stay where they are (a block
 * belongs to its segment's pool). Only where borrowing is allowed (no_split pools never split a
 * large block for a small request), and only while both pools map pages of one size: with
 * coarser large-pool pages (PyTorch's 20 MiB, SYMPOOL_EXPANDABLE_PAGE=0) small blocks would move
 * from 2 MiB pages to 20 MiB ones. */
void sp__exp_share_small(sp_mempool_t *pool) {
    bool share = sp__g.exp_on && sp__exp_pool(pool) && !pool->no_split &&
                 pool->reserved < sp__g.exp_shared &&
                 sp__exp_page(&pool->large) <= sp__exp_page(&pool->small);
    pool->small_max = share ? 0 : SP_SMALL_SIZE;
}

/* ---- segments ---------------------------------------------------------------------------- */

size_t sp__exp_page(const sp_bpool_t *bp) {
    size_t page = bp->is_small ? SP_SMALL_BUFFER : sp__g.conf.large_segment_size;
    /* SYMPOOL_EXPANDABLE_PAGE (ours): a smaller mapping unit for the large pool, down to the
     * device's granularity, leaves less of the last page unused. */
    if (!bp->is_small && sp__g.exp_page)
        page = sp__g.exp_page;
    size_t g = sp__g.caps.vmm_granularity ? sp__g.caps.vmm_granularity : 1;
    return (page + g - 1) / g * g;
}

/* Reserve a new expandable segment for (bp, stream): one unmapped block covering it. */
static sp_status_t new_segment(sp_devalloc_t *d, sp_bpool_t *bp, sp_stream_t stream, bool whole,
                               sp_block_t **block_p) {
    size_t page = sp__exp_page(bp);
    /* PyTorch reserves 1 1/8 of the device's memory, so that pages unmapped early in the
     * segment can be mapped again at its end. */
    size_t want = d->total_mem + d->total_mem / 8;
    size_t vsize = page * ((want + page - 1) / page);
    void *base = NULL;
    sp_status_t s = sp__g.ops->vmm_reserve(d->device, vsize, page, &base);
    if (s != SP_SUCCESS)
        return s;
    sp_segment_t *seg = NULL;
    s = sp__alloc_segment_new(d, bp, (uintptr_t)base, vsize, stream, &seg);
    if (s != SP_SUCCESS) {
        (void)sp__g.ops->vmm_release(d->device, base, vsize);
        return s;
    }
    seg->expandable = true;
    seg->whole = whole;
    seg->page = page;
    sp_block_t *b = seg->head;
    b->unmapped = true;
    ulist_insert(bp, b);
    SP_TRACE(SP_SUB_POOL,
             "device %d: new expandable %s segment %#" PRIxPTR " (%zu bytes of address space, "
             "pages of %zu)",
             d->device, bp->is_small ? "small" : "large", seg->base, vsize, page);
    *block_p = b;
    return SP_SUCCESS;
}

/* Give an expandable segment that is unmapped end to end back (its one block is unmapped). */
static void release_segment(sp_devalloc_t *d, sp_segment_t *seg) {
    sp_bpool_t *bp = seg->bpool;
    sp_block_t *b = seg->head;
    /* Kept unmaps of its pages go with it (vmm_release unmaps what is still mapped). */
    sp_mempool_t *pool = bp->pool;
    for (int i = 0; i < pool->exp_nstuck;)
        if (pool->exp_stuck[i].addr - seg->base < seg->size)
            pool->exp_stuck[i] = pool->exp_stuck[--pool->exp_nstuck];
        else
            i++;
    ulist_remove(bp, b);
    (void)sp__g.ops->vmm_release(d->device, (void *)seg->base, seg->size); /* logged there */
    sp__alloc_segment_delete(d, seg);
}

/* ---- the device's side of maps and unmaps ------------------------------------------------ */

/* Unmaps that RECYCLE made in the allocator's books for a growth, not yet made on the device.
 * The growth maps its pages right after, often at the same place (find_room takes the lowest
 * address with room, and the holes RECYCLE just unmapped are often it): pages both unmapped
 * and mapped again in one growth stay mapped on the device instead, the same physical page at
 * the same address, and only the rest is unmapped, before the growth maps anything new (so the
 * device never holds more than the books say, which SYMPOOL_HOST_CAPACITY and a GPU's memory
 * need). The books, stats and trace entries are the same as with every call made: the device
 * work is what changes (on a GPU each page is its own cuMemUnmap + cuMemRelease and cuMemCreate +
 * cuMemMap). */
#define SP_EXP_PEND 64
_Static_assert(SP_EXP_STUCK <= SP_EXP_PEND, "a growth's list holds a pool's kept unmaps");
typedef struct exp_pend {
    int n;
    uintptr_t lo, hi;   /* the growth's range: pending pages there wait for its maps */
    sp_mempool_t *pool; /* the growing pool: every range is of its segments */
    struct {
        uintptr_t addr;
        size_t len, page;
    } r[SP_EXP_PEND];
} exp_pend_t;

static sp_status_t dev_unmap(sp_devalloc_t *d, uintptr_t addr, size_t len, size_t page) {
    sp_status_t s = sp__g.ops->vmm_unmap(d->device, (void *)addr, len);
    if (s == SP_SUCCESS) {
        d->exp_pages_unmapped += (int64_t)(len / page);
        d->exp_bytes_unmapped += (int64_t)len;
        d->exp_unmap_calls++;
    }
    return s;
}

/* The device refused to unmap [addr, addr + len) of pool's segments, which the books already
 * count as unmapped (an unmap a growth put off, or the undo of its own maps): the pages are
 * still mapped. The pool remembers them, so that a growth that maps there takes them over and
 * the next growth or release tries the unmap again. Forgotten, they stayed on the device for as
 * long as their segment lived, and every growth there failed (the backend refuses to map a page
 * twice) while the device held more than reserved_bytes. */
static void keep_stuck(sp_mempool_t *pool, uintptr_t addr, size_t len, size_t page) {
    if (pool->exp_nstuck == SP_EXP_STUCK) {
        SP_WARN(SP_SUB_POOL,
                "%zu bytes at %#" PRIxPTR " stay mapped on the device until their segment is "
                "released (more refused unmaps than a pool remembers)",
                len, addr);
        return;
    }
    int i = pool->exp_nstuck++;
    pool->exp_stuck[i].addr = addr;
    pool->exp_stuck[i].len = len;
    pool->exp_stuck[i].page = page;
}

static void unmap_or_keep(sp_devalloc_t *d, sp_mempool_t *pool, uintptr_t addr, size_t len,
                          size_t page) {
    if (dev_unmap(d, addr, len, page) != SP_SUCCESS)
        keep_stuck(pool, addr, len, page);
}

/* A release tries the pool's kept unmaps again (their pages are unused: the books say unmapped
 * since they were synchronized and put off). */
static void retry_stuck(sp_devalloc_t *d, sp_mempool_t *pool) {
    int n = pool->exp_nstuck;
    pool->exp_nstuck = 0;
    for (int i = 0; i < n; i++)
        unmap_or_keep(d, pool, pool->exp_stuck[i].addr, pool->exp_stuck[i].len,
                      pool->exp_stuck[i].page);
}

static sp_status_t dev_map(sp_devalloc_t *d, uintptr_t addr, size_t len, size_t page) {
    sp_status_t s = sp__g.ops->vmm_map(d->device, (void *)addr, len);
    if (s == SP_SUCCESS) {
        d->exp_pages_mapped += (int64_t)(len / page);
        d->exp_bytes_mapped += (int64_t)len;
        d->exp_map_calls++;
    }
    return s;
}

/* Unmap on the device the pending pages outside [lo, hi) (all of them with lo = hi = 0): a
 * range that straddles lo or hi keeps only its part inside, since its parts outside are not
 * mapped again by the growth and, left mapped while the growth maps, would have the device hold
 * more than the books (a device at its capacity then refused the growth's map: an OOM retry).
 * lo and hi are page bounds of the growth's segment (lo an unmapped block's start where a range
 * straddles it). The caller synchronized before putting them there. An unmap the device refuses
 * (a driver failure; the backend logs it) leaves those pages mapped where the books say unmapped:
 * the pool keeps them (keep_stuck) for a later growth to take over or a release to unmap. */
static void pend_flush(sp_devalloc_t *d, exp_pend_t *pd, uintptr_t lo, uintptr_t hi) {
    int k = 0;
    for (int i = 0; i < pd->n; i++) {
        uintptr_t a = pd->r[i].addr, e = a + pd->r[i].len;
        size_t page = pd->r[i].page;
        if (a >= hi || e <= lo) {
            unmap_or_keep(d, pd->pool, a, e - a, page);
            continue;
        }
        if (a < lo) {
            unmap_or_keep(d, pd->pool, a, lo - a, page);
            a = lo;
        }
        if (e > hi) {
            unmap_or_keep(d, pd->pool, hi, e - hi, page);
            e = hi;
        }
        pd->r[k] = pd->r[i];
        pd->r[k].addr = a;
        pd->r[k++].len = e - a;
    }
    pd->n = k;
}

/* Take the pending pages inside [addr, end) off the list (they stay mapped: a range may lose its
 * middle, which splits it, or is unmapped now when the list has no room for the second part). */
static void pend_take(sp_devalloc_t *d, exp_pend_t *pd, uintptr_t addr, uintptr_t end) {
    for (int i = 0; i < pd->n; i++) {
        uintptr_t a = pd->r[i].addr, e = a + pd->r[i].len;
        if (a >= end || e <= addr)
            continue;
        if (a < addr && e > end) {
            if (pd->n < SP_EXP_PEND) {
                pd->r[pd->n] = pd->r[i];
                pd->r[pd->n].addr = end;
                pd->r[pd->n].len = e - end;
                pd->n++;
            } else {
                unmap_or_keep(d, pd->pool, end, e - end, pd->r[i].page);
            }
            pd->r[i].len = addr - a;
        } else if (a < addr) {
            pd->r[i].len = addr - a;
        } else if (e > end) {
            pd->r[i].addr = end;
            pd->r[i].len = e - end;
        } else {
            pd->r[i--] = pd->r[--pd->n];
        }
    }
}

/* Map [addr, addr + len) on the device, taking over the pending pages inside it (still mapped
 * there): only the gaps between them are mapped. All or nothing, as vmm_map. */
static sp_status_t pend_map(sp_devalloc_t *d, exp_pend_t *pd, uintptr_t addr, size_t len,
                            size_t page) {
    if (!pd || pd->n == 0)
        return dev_map(d, addr, len, page);
    pend_flush(d, pd, pd->lo, pd->hi);
    uintptr_t end = addr + len, gap[SP_EXP_PEND + 1][2];
    int ng = 0;
    for (uintptr_t at = addr; at < end;) {
        /* The pending range holding `at`, else the first one after it. */
        uintptr_t next = end, skip = 0;
        for (int i = 0; i < pd->n; i++) {
            uintptr_t a = pd->r[i].addr, e = a + pd->r[i].len;
            if (a <= at && e > at)
                skip = e < end ? e : end;
            else if (a > at && a < next)
                next = a;
        }
        if (skip) {
            at = skip;
            continue;
        }
        sp_status_t s = dev_map(d, at, next - at, page);
        if (s != SP_SUCCESS) {
            for (int g = 0; g < ng; g++) /* nothing mapped after all */
                unmap_or_keep(d, pd->pool, gap[g][0], gap[g][1] - gap[g][0], page);
            return s;
        }
        gap[ng][0] = at;
        gap[ng++][1] = next;
        at = next;
    }
    pend_take(d, pd, addr, end);
    return SP_SUCCESS;
}

static size_t unmap_block(sp_devalloc_t *d, sp_block_t *b, uint32_t context, exp_pend_t *pd);

/* ---- map --------------------------------------------------------------------------------- */

/* A block that can become part of a new allocation: not allocated, no pending events. */
static bool allocatable(const sp_block_t *b) {
    return b && !b->allocated && !sp__block_pending(b);
}

static bool free_mapped(const sp_block_t *b) {
    return b && b->in_set && allocatable(b);
}

/* b absorbs its neighbour n (n is before or after b), which leaves its set or list. */
static void absorb(sp_devalloc_t *d, sp_block_t *b, sp_block_t *n) {
    if (sp__bref(n) == b->prev) {
        b->addr = n->addr;
        b->prev = n->prev;
        if (b->prev)
            sp__blk(b->prev)->next = sp__bref(b);
        else
            sp__bseg(b)->head = b;
    } else {
        b->next = n->next;
        if (b->next)
            sp__blk(b->next)->prev = sp__bref(b);
    }
    b->size += n->size;
    sp__block_recycle(d, n);
}

/* Map the pages under the first `size` bytes of unmapped block m (whole pages; the rest of m
 * stays unmapped after it), then merge m with its free neighbours and put it in the free set:
 * m is the block holding the new memory. *why_p = SP_GROW_POOL_LIMIT when the pool's limit
 * refused it. */
static sp_status_t map_block(sp_devalloc_t *d, sp_block_t *m, size_t size, uint32_t ctx,
                             exp_pend_t *pd, sp_grow_refusal_t *why_p) {
    sp_segment_t *seg = sp__bseg(m);
    sp_bpool_t *bp = seg->bpool;
    sp_mempool_t *pool = bp->pool;
    size_t len = (size + seg->page - 1) / seg->page * seg->page;
    if (len > m->size)
        len = m->size;
    if (pool->limit && pool->reserved + len > pool->limit) {
        *why_p = SP_GROW_POOL_LIMIT;
        return SP_ERR_OUT_OF_MEMORY; /* the caller reports the pool limit */
    }
    sp_status_t s = pend_map(d, pd, m->addr, len, seg->page);
    if (s != SP_SUCCESS)
        return s;
    uintptr_t at = m->addr;
    /* m's neighbours in the list: the unmapped rest (same stream, inside m) goes between them */
    sp_block_t *ml = sp__blk0(m->left), *mr = sp__blk0(m->right);
    ulist_remove(bp, m);
    m->unmapped = false;
    if (len < m->size) {
        sp_block_t *rem = sp__block_new(d);
        if (rem) {
            rem->addr = m->addr + len;
            rem->size = m->size - len;
            rem->seg = sp__ptr_ref(seg);
            rem->unmapped = true;
            sp__block_link_after(rem, m);
            m->size = len;
            ulist_link(bp, rem, ml, mr);
        } else {
            /* No struct for the remainder (structs come from the arena alone, never from the
             * heap): give the pages back rather than corrupt the tiling. */
            unmap_or_keep(d, pool, m->addr, len, seg->page);
            m->unmapped = true;
            ulist_insert(bp, m);
            return sp__error(SP_ERR_SYSTEM, SP_SUB_POOL,
                             "out of block structs for the unmapped rest of a segment (a process "
                             "may have 4 GiB of them)");
        }
    }
    sp_block_t *p = sp__block_prev(m), *n = sp__block_next(m);
    if (free_mapped(p)) {
        sp__bset_remove(&bp->free, p);
        absorb(d, m, p);
    }
    if (free_mapped(n)) {
        sp__bset_remove(&bp->free, n);
        absorb(d, m, n);
    }
    seg->gc_clock = bp->gfb_count;
    sp__bset_insert(&bp->free, m); /* m keeps its requested size (PyTorch's map_block) */
    d->total_reserved += len;
    pool->reserved += len;
    sp__exp_share_small(pool);
    seg->mapped += len;
    sp_dev_stats_t *st = &d->stats;
    sp__stat_inc(st, SP_ST_RESERVED_BYTES, bp->is_small, (int64_t)len);
    st->num_device_alloc++;
    if (SP_UNLIKELY(sp__history_on()))
        sp__history_record(d->device, SP_TRACE_SEGMENT_MAP, at, len, (uintptr_t)sp__block_stream(m),
                           pool->id, ctx);
    if (!m->prev && !seg->context && ctx) {
        seg->context = ctx; /* the stack of the request that first mapped the segment's start */
        sp__history_context_retain(ctx);
    }
    return SP_SUCCESS;
}

/* Free and unmapped blocks from b on hold `size` bytes of address space. */
static bool has_room(const sp_block_t *b, size_t size) {
    size_t bytes = 0;
    for (; bytes < size && allocatable(b); b = sp__block_next(b))
        bytes += b->size;
    return bytes >= size;
}

/* PyTorch's find_expandable_block: the lowest address (per stream, over the pool's segments)
 * where free and unmapped space together hold size bytes; else a new segment. */
static sp_status_t find_room(sp_devalloc_t *d, sp_bpool_t *bp, size_t size, sp_stream_t stream,
                             sp_block_t **c_p) {
    /* SYMPOOL_EXPANDABLE_WHOLE (ours, with ALIGN). While a pool only grows, ALIGN waits (a
     * skipped piece costs and saves nothing yet) and every block is packed right after the one
     * before, so blocks of whole pages that follow odd-sized ones start inside a page. That is
     * how a cache fills at the start of a run: its first pass lays out what stays live for the
     * rest of it (weights, optimizer state) and what the loop then frees and reuses, and the
     * offsets stay with every block later cut from those ranges. So until the pool's first unmap,
     * past SHARED's bound, requests of whole pages grow a segment of their own, where they pack
     * on page boundaries, and other requests one without them. After it, any segment of the
     * stream (PyTorch's rule): ALIGN and FIT_END place blocks from then on. Only the default
     * pool: RECYCLE unmaps only there, so a MemPool's first unmap may never come, and keeping
     * the two kinds apart for good costs more than it saves (measured: ftcourse 1.0071 ->
     * 1.0114). */
    const sp_mempool_t *pool = bp->pool;
    bool apart = sp__g.exp_whole && pool->is_default && !bp->is_small && !pool->exp_unmapped &&
                 pool->reserved >= sp__g.exp_shared;
    bool whole = apart && size % sp__exp_page(bp) == 0;
    for (sp_block_t *u = bp->unmapped; u; u = sp__blk0(u->right)) {
        if (sp__block_stream(u) != stream || (apart && sp__bseg(u)->whole != whole))
            continue;
        sp_block_t *c = free_mapped(sp__block_prev(u)) ? sp__block_prev(u) : u;
        if (has_room(c, size)) {
            *c_p = c;
            return SP_SUCCESS;
        }
    }
    return new_segment(d, bp, stream, whole, c_p);
}

/* SYMPOOL_EXPANDABLE_RECYCLE (ours): before the default pool maps, unmap up to `need` bytes of
 * whole free pages anywhere in its expandable segments (its small and large pools, every stream,
 * any hole, not only the growing segment's), so the physical pages move to where the segment
 * grows instead of adding to it. PyTorch does this only on OOM (the release before its
 * retry), so freed holes stay mapped until then and count in reserved memory. */
static bool has_whole_page(const sp_block_t *b) {
    const sp_segment_t *seg = sp__bseg(b);
    uintptr_t off = b->addr - seg->base;
    return (off + seg->page - 1) / seg->page < (off + b->size) / seg->page;
}

typedef struct recycler {
    sp_devalloc_t *d;
    sp_stream_t stream; /* the growing stream */
    size_t need, got;
    bool synced_own, synced_all;
    exp_pend_t *pd; /* the unmaps, made on the device once the growth has mapped */
} recycler_t;

/* Unmap whole free pages of stream s's blocks in bp, smallest blocks first (large free blocks are
 * the likeliest to serve a later request whole). false when the device refused an unmap. */
static bool recycle_stream(recycler_t *r, sp_bpool_t *bp, sp_stream_t s) {
    size_t page = sp__exp_page(bp);
    while (r->got < r->need) {
        /* Only free blocks of at least a page can hold a whole one: walk the stream's part of
         * the free set from there (no mutation while walking), then unmap what was found. */
        sp_block_t *cand[32];
        int n = 0;
        size_t acc = 0;
        for (sp_block_t *b = sp__bset_lower_bound(&bp->free, s, page);
             b && sp__block_stream(b) == s && n < 32 && r->got + acc < r->need;) {
            if (sp__bseg(b)->expandable && free_mapped(b) && has_whole_page(b)) {
                cand[n++] = b;
                acc += b->size;
            }
            b = sp__bset_succ(&bp->free, b);
        }
        if (n == 0)
            return true;
        /* cuMemUnmap does not wait for the GPU: the work queued on the blocks' stream must be
         * done. The growing stream is alive (it is in use); another stream may have been
         * destroyed since its blocks were freed, so those wait for the whole device, once.
         * When the wait fails (an error, or the cuda backend's refusal while a graph capture is
         * under way) nothing is unmapped, as in sp__exp_release: the GPU may still use the
         * pages. */
        sp_status_t st = SP_SUCCESS;
        if (s == r->stream && !r->synced_own && !r->synced_all) {
            st = sp__g.ops->stream_sync(r->d->device, s);
            r->synced_own = st == SP_SUCCESS;
            r->d->exp_recycle_syncs++;
        } else if (s != r->stream && !r->synced_all) {
            st = sp__g.ops->device_sync(r->d->device);
            r->synced_all = st == SP_SUCCESS;
            r->d->exp_recycle_syncs++;
        }
        if (st != SP_SUCCESS)
            return false;
        size_t round = 0;
        for (int k = 0; k < n; k++)
            round += unmap_block(r->d, cand[k], 0, r->pd);
        if (round == 0)
            return false;
        r->got += round;
    }
    return true;
}

static void recycle(sp_devalloc_t *d, sp_bpool_t *bp, sp_stream_t stream, size_t need,
                    exp_pend_t *pd) {
    /* Only the default pool: PyTorch never unmaps a live MemPool's free memory behind its back
     * (a CUDA graph's pool keeps the memory its replays use), and synchronizing a capturing
     * stream would break the capture. */
    if (!bp->pool->is_default)
        return;
    bool capturing = false;
    if (stream &&
        (sp__g.ops->stream_capturing(d->device, stream, &capturing) != SP_SUCCESS || capturing))
        return;
    recycler_t r = {.d = d, .stream = stream, .need = need, .pd = pd};
    sp_mempool_t *pool = bp->pool;
    sp_bpool_t *order[2] = {bp, bp == &pool->small ? &pool->large : &pool->small};
    /* The growing stream's own pages first (no device-wide wait), then every other stream's. */
    for (int k = 0; k < 2 && r.got < need; k++)
        if (!recycle_stream(&r, order[k], stream))
            return;
    for (int k = 0; k < 2 && r.got < need; k++) {
        sp_bpool_t *p = order[k];
        /* The set is ordered by stream first: visit each stream's part in turn. */
        for (sp_block_t *b = sp__bset_lower_bound(&p->free, NULL, 0); b && r.got < need;) {
            sp_stream_t s = sp__block_stream(b);
            if (s != stream && !recycle_stream(&r, p, s))
                return;
            if ((uintptr_t)s == UINTPTR_MAX)
                break;
            b = sp__bset_lower_bound(&p->free, (sp_stream_t)((uintptr_t)s + 1), 0);
        }
    }
}

/* SYMPOOL_EXPANDABLE_BORROW (ours): a small request that finds no free small block would map a
 * new 2 MiB small-pool page. Instead it takes the smallest free block of the pool's large
 * expandable segments that holds it (same stream), if any: mapped memory that a 2 MiB unit
 * often cannot give back (pieces under a page at the ends of holes and of the last page), where
 * a new small page would add to the reservation. The block stays the large pool's (its stats,
 * its merges when freed). PyTorch keeps the pools apart to protect large segments from small
 * blocks; with pages unmapped as they free up, a small block pins at most the pages under it,
 * as a small-pool page would. */
static sp_block_t *borrow_large(sp_bpool_t *bp, size_t size, sp_stream_t stream) {
    sp_bpool_t *lp = &bp->pool->large;
    if (!bp->is_small || bp->pool->no_split)
        return NULL;
    sp_block_t *b = sp__bset_lower_bound(&lp->free, stream, size);
    if (!b || sp__block_stream(b) != stream || !sp__bseg(b)->expandable || !allocatable(b) ||
        b->size >= sp__g.conf.max_split_size)
        return NULL; /* small requests never take oversize blocks */
    sp__bset_remove(&lp->free, b);
    return b;
}

/* SYMPOOL_EXPANDABLE_ALIGN (ours). A large block packed right after an odd-sized one starts
 * inside a page. As long as its neighbours live, that page is shared and costs nothing; once
 * they are freed and their pages unmapped (RECYCLE, empty_cache) it pins the page alone, one
 * page more than its size needs, and every block packed after it inherits the offset. In a
 * training loop most freed ranges are surrounded by such blocks, so each hole left at the peak
 * costs about a page of slivers (one piece at each of its ends). So when a growth for at least a
 * page maps no more pages with the block starting at the next page boundary, and the piece
 * skipped is at most ALIGN_SKIP of a page (below), the block starts there: the piece stays free,
 * in a page its live neighbour keeps mapped anyway, and the block will give back all the pages
 * under it when its neighbours go. The piece is the price while they live (at most half of
 * what it saves), which is why a pool that only grows keeps packing (it has no holes to gain
 * from; the rule waits for its first unmap), and why pools under SHARED's bound keep packing
 * (there one page is most of the 1% budget, and small and large blocks pack together) except
 * for requests of whole pages (SYMPOOL_EXPANDABLE_ALIGN_SMALL): packed after a small block such
 * a block ends inside a page too, so it pins one page more than its size for as long as it
 * lives, and the piece skipped (any size: small requests fill it, they grow the same segments
 * under the bound) is the only cost. Measured on 199 replayable traces: one better (sungdk0822
 * attn dmodel64 seqlen1024, 1.0162 -> 1.0073), none worse.
 *
 * SYMPOOL_EXPANDABLE_ALIGN_SKIP (ours, default a quarter of a page, 512 KiB of a 2 MiB one; half
 * a page before it) bounds the piece. The bet loses where the neighbour lives through the peak:
 * a forward pass keeps its activations until the backward one, and a row of odd-sized
 * activations (5.127 MiB each, 0.873 MiB skipped before each) then pays every piece at the peak
 * and saves nothing (issue 25's NiuHuangxiaozi forward runs). Measured on 81 real traces against
 * half a page: 22 better, 11 worse, the worst 1.0429 -> 1.0407, none newly over 1.01
 * (docs/expandable.md). A fraction, so that it scales with SYMPOOL_EXPANDABLE_PAGE. */
static bool want_align(const sp_bpool_t *bp, const sp_block_t *c, size_t size) {
    const sp_mempool_t *pool = bp->pool;
    return sp__g.exp_align && pool->exp_unmapped && size >= sp__bseg(c)->page &&
           (pool->reserved >= sp__g.exp_shared ||
            (sp__g.exp_align_small && size % sp__bseg(c)->page == 0));
}

/* c: a free mapped block holding size bytes (in the set). When the page boundary inside it is
 * at most ALIGN_SKIP of a page away and still leaves room for them, the block starts there and
 * the piece before stays free. */
static sp_block_t *align_start(sp_devalloc_t *d, sp_bpool_t *bp, sp_block_t *c, size_t size) {
    sp_segment_t *seg = sp__bseg(c);
    size_t page = seg->page, off = c->addr - seg->base;
    size_t head = (page - off % page) % page;
    /* Under SHARED's bound (ALIGN_SMALL, requests of whole pages only: want_align) any skip. */
    double most =
        bp->pool->reserved < sp__g.exp_shared ? (double)page : (double)page * sp__g.exp_align_skip;
    if (head == 0 || (double)head > most || c->size - size < head)
        return c;
    sp_block_t *h = sp__block_new(d);
    if (!h)
        return c;
    sp__bset_remove(&bp->free, c);
    h->addr = c->addr;
    h->size = head;
    h->seg = sp__ptr_ref(seg);
    sp__block_link_before(h, c);
    /* h is new (requested size 0); the segment's GC clock stays (a split, no insert of note). */
    c->addr += head;
    c->size -= head;
    sp__bset_insert(&bp->free, h);
    sp__bset_insert(&bp->free, c);
    return c;
}

/* The growth itself (sp__exp_alloc): RECYCLE's unmaps go to *pd, which the caller flushes. */
static sp_status_t grow(sp_devalloc_t *d, sp_bpool_t *bp, size_t size, sp_stream_t stream,
                        uint32_t ctx, exp_pend_t *pd, sp_block_t **block_p,
                        sp_grow_refusal_t *why_p) {
    if (sp__g.exp_recycle)
        recycle(d, bp, stream, size, pd);
    sp_block_t *c = NULL;
    SP_CHECK(find_room(d, bp, size, stream, &c));
    /* The pages this growth maps are the unmapped ones under [c, c + size): pending unmaps
     * there wait for its maps (all of them are mapped again), the others are made first. */
    const sp_segment_t *seg = sp__bseg(c);
    pd->lo = c->addr;
    pd->hi = seg->base + (c->addr + size - seg->base + seg->page - 1) / seg->page * seg->page;
    /* c is an unmapped block, or a free mapped block followed by an unmapped one. */
    if (c->unmapped)
        SP_CHECK(map_block(d, c, c->size < size ? c->size : size, ctx, pd, why_p));
    while (c->size < size) {
        /* Invariant: c is free and mapped, and its next block is unmapped: map what is still
         * missing there, which merges into c's successor-to-be. */
        sp_block_t *nc = sp__block_next(c);
        size_t missing = size - c->size;
        SP_CHECK(map_block(d, nc, missing < nc->size ? missing : nc->size, ctx, pd, why_p));
        c = nc;
    }
    if (want_align(bp, c, size))
        c = align_start(d, bp, c, size);
    sp__bset_remove(&bp->free, c);
    *block_p = c;
    return SP_SUCCESS;
}

sp_status_t sp__exp_alloc(sp_devalloc_t *d, sp_bpool_t *bp, size_t size, sp_stream_t stream,
                          uint32_t ctx, sp_block_t **block_p, sp_grow_refusal_t *why_p) {
    *why_p = SP_GROW_DEVICE;
    if (sp__g.exp_borrow && (*block_p = borrow_large(bp, size, stream)) != NULL)
        return SP_SUCCESS;
    exp_pend_t pd;
    pd.n = 0;
    pd.lo = pd.hi = 0;
    pd.pool = bp->pool;
    /* Pages whose unmap the device refused before (keep_stuck) are pending unmaps too: the
     * growth takes over those it maps, and its flushes try the others again. */
    for (int i = 0; i < bp->pool->exp_nstuck; i++) {
        pd.r[pd.n].addr = bp->pool->exp_stuck[i].addr;
        pd.r[pd.n].len = bp->pool->exp_stuck[i].len;
        pd.r[pd.n++].page = bp->pool->exp_stuck[i].page;
    }
    bp->pool->exp_nstuck = 0;
    sp_status_t s = grow(d, bp, size, stream, ctx, &pd, block_p, why_p);
    pend_flush(d, &pd, 0, 0); /* what the growth did not map again, and on failure all */
    return s;
}

/* ---- best fit ----------------------------------------------------------------------------- */

/* What a free block can grow to: itself plus the unmapped space right after it. */
static size_t exp_size(const sp_block_t *b) {
    return b->size + (b->next && sp__blk(b->next)->unmapped ? sp__blk(b->next)->size : 0);
}

sp_block_t *sp__exp_best_fit(sp_bpool_t *bp, sp_block_t *b, sp_stream_t stream,
                             sp_block_t **pred_p) {
    /* PyTorch's get_free_block: for the purposes of best fit a block of an expandable segment
     * counts as the size it can expand to, so walk on (in set order) while the next block of
     * the stream can expand to less. */
    sp_block_t *cur = b;
    while (sp__bseg(cur)->expandable) {
        sp_block_t *succ = sp__bset_succ(&bp->free, cur);
        if (!succ || sp__block_stream(succ) != stream || exp_size(succ) >= exp_size(cur))
            break;
        cur = succ;
    }
    if (cur != b)
        *pred_p = sp__bset_pred(&bp->free, cur);
    return cur;
}

/* SYMPOOL_EXPANDABLE_SIDE (ours, with RECYCLE): the pages a block of `size` bytes at the start
 * (or the end) of free block b would need that no live block holds already. b is a whole free
 * range, so its neighbours are live blocks (or unmapped space, or the segment's ends); a
 * neighbour that ends or starts inside a page keeps that page mapped anyway. */
static size_t new_pages(const sp_block_t *b, size_t size, bool at_end) {
    const sp_segment_t *seg = sp__bseg(b);
    size_t page = seg->page, a = b->addr - seg->base, e = a + b->size;
    const sp_block_t *pv = sp__block_prev(b), *nx = sp__block_next(b);
    bool left = pv && pv->allocated && a % page, right = nx && nx->allocated && e % page;
    size_t lo = (at_end ? e - size : a) / page, hi = ((at_end ? e : a + size) - 1) / page;
    size_t n = hi - lo + 1;
    if (left && lo == a / page)
        n--;
    if (right && hi == (e - 1) / page && !(left && hi == a / page))
        n--; /* (one page holding both neighbours counts once) */
    return n;
}

/* Where in a larger cached free block b (in the set, chosen by best fit) a request of more than
 * 1 MiB goes; returns the block to hand out (in the set), *pred_p its in-order predecessor.
 *
 * SYMPOOL_EXPANDABLE_SIDE (ours, with RECYCLE). PyTorch cuts from the block's start. Between
 * two live blocks, the free piece left over is what stays mapped at the peak when it is under a
 * page (RECYCLE gives back the whole pages of free blocks, not the pages a live neighbour shares):
 * a training step's best-fit cuts of odd sizes leave dozens of them. When the block's end sits
 * inside a page its live right neighbour keeps mapped, the request placed against that end can
 * need a page fewer than at the start, and the piece left over then lies against the left
 * neighbour's page instead. So the end is taken when it needs fewer pages no live block holds;
 * on a tie, the start (PyTorch's). Only the default pool (RECYCLE gives back only its pages; a
 * MemPool's free pages stay mapped, so which pages a block covers does not change what it maps).
 *
 * SYMPOOL_EXPANDABLE_FIT_END (ours, with ALIGN). ALIGN places blocks that grow the segment;
 * most large blocks of a training loop are instead cut by best fit from ranges freed earlier,
 * and PyTorch cuts them from the range's start. A range that starts inside a page (after an
 * odd-sized block, or after a block that itself started inside one) hands that offset on to
 * every block cut from it, and each of them later pins a page of slivers when its neighbours
 * go. When the request is a whole number of pages and the range ends on a page boundary, taking
 * its end instead puts the block on whole pages, and leaves the offset with the free piece in
 * front (which merges back with the block before it). Requests of whole pages only: an odd size
 * at the end would move the offset to its start, which is no gain. Same gates as ALIGN (a pool
 * that only grew has no freed ranges to cut from; under SHARED's bound pages are few and small
 * and large blocks pack together). */
/* SYMPOOL_EXPANDABLE_ALIGN_SMALL on a cache hit: under SHARED's bound, once the pool has
 * unmapped, a request of whole pages cut from a larger cached block that starts inside a page
 * starts at the block's first page boundary when the block holds it from there (the piece in
 * front stays free, the rest after it is split off as usual). Why: the growth path's rule alone
 * moved blocks that cached ranges then handed to odd offsets (sungdk0822 attn dmodel128
 * seqlen1024: 1.0150 -> 1.0231 without this, 1.0150 with it). Under the bound FIT_END's case
 * (a block that ends on a page) is one of these: the first boundary is taken, not the end. */
static bool small_page_start(const sp_mempool_t *pool, size_t size, size_t page, size_t off,
                             size_t lead) {
    return sp__g.exp_align_small && pool->exp_unmapped && pool->reserved < sp__g.exp_shared &&
           size % page == 0 && off % page != 0 && lead >= page - off % page;
}

sp_block_t *sp__exp_fit_end(sp_devalloc_t *d, sp_bpool_t *bp, sp_block_t *b, size_t size,
                            sp_block_t **pred_p) {
    const sp_mempool_t *pool = bp->pool;
    sp_segment_t *seg = sp__bseg(b);
    size_t page = seg->page, off = b->addr - seg->base;
    bool side =
        sp__g.exp_side && pool->is_default && new_pages(b, size, true) < new_pages(b, size, false);
    size_t lead = b->size - size;
    if (small_page_start(pool, size, page, off, lead))
        lead = page - off % page; /* ALIGN_SMALL: the first page boundary, the rest after b */
    else if (!side &&
             (!sp__g.exp_fit_end || !pool->exp_unmapped || pool->reserved < sp__g.exp_shared ||
              size % page != 0 || off % page == 0 || (off + b->size) % page != 0))
        return b;
    sp_block_t *h = sp__block_new(d);
    if (!h)
        return b; /* out of host memory: PyTorch's placement */
    sp__bset_remove(&bp->free, b);
    h->addr = b->addr;
    h->size = lead;
    h->seg = b->seg;
    sp__block_link_before(h, b);
    /* h is new (requested size 0); the segment's GC clock stays. */
    b->addr += lead;
    b->size -= lead; /* size, or more with ALIGN_SMALL (the caller splits the rest off) */
    sp__bset_insert(&bp->free, h);
    sp__bset_insert(&bp->free, b);
    *pred_p = sp__bset_pred(&bp->free, b);
    return b;
}

/* SYMPOOL_EXPANDABLE_PIN (ours, with RECYCLE). Best fit cuts a small request from the start of
 * the smallest cached block that holds it. When that start lies on a page no live block holds
 * (the block starts on a page boundary, or after a free or unmapped piece), the request pins a
 * page that RECYCLE could otherwise give back, while a slightly larger cached block may start
 * inside a page its live left neighbour keeps mapped anyway, with room for the request there:
 * placed there it needs no page of its own. Under SHARED's bound small requests are cut from
 * the large pool's holes, and a training step's small tensors (1 MiB activations beside 32 MiB
 * ones, sungdk0822's attention runs) each pinned a page of a different hole at the peak, one
 * page over the page floor. So when best fit's block b needs a new page, the next larger cached
 * blocks of the stream (set order, at most PIN_LOOK of them: a bounded walk) are tried for one
 * whose start shares a live neighbour's page and holds the request there; the first found is
 * taken, else b. Only blocks holding a page more than the request reach here (allocator.c's
 * find_fit): taking another block can only free b's first page when b holds it whole, and the
 * test keeps the walk off the cached 512 B pair. Only the default pool (RECYCLE unmaps only
 * there, so elsewhere which pages a block touches changes nothing). */
enum { PIN_LOOK = 8 };

/* Does a request of `size` bytes at the start of free block b lie in a page that b's live left
 * neighbour holds (so it maps nothing of its own)? */
static bool start_pinned(const sp_block_t *b, size_t size) {
    const sp_segment_t *seg = sp__bseg(b);
    size_t page = seg->page, off = (b->addr - seg->base) % page;
    const sp_block_t *pv = sp__block_prev(b);
    return off != 0 && pv && pv->allocated && page - off >= size;
}

sp_block_t *sp__exp_pin_small(sp_bpool_t *bp, sp_block_t *b, size_t size, sp_stream_t stream,
                              sp_block_t **pred_p) {
    if (!sp__g.exp_pin || !bp->pool->is_default || b->size - size < sp__bseg(b)->page ||
        start_pinned(b, size))
        return b;
    sp_block_t *c = b;
    for (int k = 0; k < PIN_LOOK; k++) {
        c = sp__bset_succ(&bp->free, c);
        if (!c || sp__block_stream(c) != stream || c->size >= sp__g.conf.max_split_size)
            return b; /* (small requests never take oversize blocks; larger ones follow) */
        if (sp__bseg(c)->expandable && start_pinned(c, size)) {
            *pred_p = sp__bset_pred(&bp->free, c);
            return c;
        }
    }
    return b;
}

/* ---- unmap ------------------------------------------------------------------------------- */

/* Unmap the whole pages inside free mapped block b; the block that stays at b is the unmapped
 * part (merged with unmapped neighbours), free slivers before and after stay in the set.
 * Returns the bytes unmapped. The trace entry carries context (the releasing call's stack), else,
 * as PyTorch's unmap_block falls back to block->context_when_segment_allocated, which only the
 * segment's first block holds, the segment's mapping stack when b starts the segment. */
static size_t unmap_block(sp_devalloc_t *d, sp_block_t *b, uint32_t context, exp_pend_t *pd) {
    sp_segment_t *seg = sp__bseg(b);
    sp_bpool_t *bp = seg->bpool;
    uint32_t ctx = context ? context : b->prev ? 0 : seg->context;
    uintptr_t begin = seg->base + (b->addr - seg->base + seg->page - 1) / seg->page * seg->page;
    uintptr_t end = seg->base + (b->addr + b->size - seg->base) / seg->page * seg->page;
    if (begin >= end)
        return 0;
    sp_status_t us = SP_SUCCESS;
    sp_block_t *before = begin > b->addr ? sp__block_new(d) : NULL;
    sp_block_t *after = end < b->addr + b->size ? sp__block_new(d) : NULL;
    if ((begin > b->addr && !before) || (end < b->addr + b->size && !after)) {
        if (before)
            sp__block_recycle(d, before);
        if (after)
            sp__block_recycle(d, after);
        return 0; /* out of host memory: keep the pages */
    }
    if (pd && pd->n < SP_EXP_PEND) {
        /* Deferred: the growth that asked may map these pages again (pend_map). */
        pd->r[pd->n].addr = begin;
        pd->r[pd->n].len = end - begin;
        pd->r[pd->n].page = seg->page;
        pd->n++;
    } else if ((us = dev_unmap(d, begin, end - begin, seg->page)) != SP_SUCCESS) {
        sp__release_refused(us);
        if (before)
            sp__block_recycle(d, before);
        if (after)
            sp__block_recycle(d, after);
        return 0; /* logged by the backend; the pages stay mapped and cached */
    }
    sp__bset_remove(&bp->free, b);
    if (before) {
        before->addr = b->addr;
        before->size = begin - b->addr;
        before->seg = sp__ptr_ref(seg);
        sp__block_link_before(before, b);
        sp__bset_insert(&bp->free, before); /* new: requested 0; split: no GC clock */
    }
    if (after) {
        after->addr = end;
        after->size = b->addr + b->size - end;
        after->seg = sp__ptr_ref(seg);
        sp__block_link_after(after, b);
        sp__bset_insert(&bp->free, after); /* new: requested 0; split: no GC clock */
    }
    b->addr = begin;
    b->size = end - begin;
    b->unmapped = true;
    /* An unmapped neighbour b absorbs leaves its place in the list to b (the same stream, and
     * nothing of the list between them): b goes between its list neighbours. */
    sp_block_t *pl = NULL, *pr = NULL;
    bool placed = false;
    if (b->prev && sp__blk(b->prev)->unmapped) {
        sp_block_t *p = sp__blk(b->prev);
        pl = sp__blk0(p->left);
        pr = sp__blk0(p->right);
        placed = true;
        ulist_remove(bp, p);
        absorb(d, b, p);
    }
    if (b->next && sp__blk(b->next)->unmapped) {
        sp_block_t *n = sp__blk(b->next);
        if (!placed)
            pl = sp__blk0(n->left);
        pr = sp__blk0(n->right); /* n was the previous one's right neighbour, if there was one */
        placed = true;
        ulist_remove(bp, n);
        absorb(d, b, n);
    }
    if (placed)
        ulist_link(bp, b, pl, pr);
    else
        ulist_insert(bp, b);
    size_t len = end - begin;
    sp_mempool_t *pool = bp->pool;
    d->total_reserved -= len;
    pool->reserved -= len;
    pool->exp_unmapped = true;
    sp__exp_share_small(pool);
    seg->mapped -= len;
    sp_dev_stats_t *st = &d->stats;
    sp__stat_dec(st, SP_ST_RESERVED_BYTES, bp->is_small, (int64_t)len);
    st->num_device_free++;
    if (SP_UNLIKELY(sp__history_on()))
        sp__history_record(d->device, SP_TRACE_SEGMENT_UNMAP, begin, len,
                           (uintptr_t)sp__block_stream(b), pool->id, ctx);
    return len;
}

/* Does seg hold a free block with a whole page inside? */
static bool has_free_page(const sp_segment_t *seg) {
    for (const sp_block_t *b = seg->head; b; b = sp__block_next(b)) {
        uintptr_t off = b->addr - seg->base;
        if (free_mapped(b) && (off + seg->page - 1) / seg->page < (off + b->size) / seg->page)
            return true;
    }
    return false;
}

/* Does free block b hold a whole page? */
static bool holds_page(const sp_block_t *b) {
    const sp_segment_t *seg = sp__bseg(b);
    uintptr_t off = b->addr - seg->base;
    return (off + seg->page - 1) / seg->page < (off + b->size) / seg->page;
}

size_t sp__exp_release_blocks(sp_devalloc_t *d, sp_block_t *const *v, size_t n, uint32_t context) {
    bool any = false;
    for (size_t i = 0; i < n && !any; i++)
        any = holds_page(v[i]);
    /* One sync for them all, before the first unmap (sp__exp_release's reason); none when
     * nothing would be unmapped, and nothing unmapped when the device cannot be synchronized. */
    if (!any)
        return 0;
    sp_status_t s = sp__g.ops->device_sync(d->device);
    if (s != SP_SUCCESS) {
        sp__release_refused(s);
        return 0;
    }
    size_t freed = 0;
    for (size_t i = 0; i < n; i++) {
        /* v[i] is still a free mapped block: an unmap makes new blocks of the slivers around
         * its pages and absorbs unmapped neighbours only, and a segment goes only once it is
         * one unmapped block, which holds none of the blocks still to come. */
        sp_segment_t *seg = sp__bseg(v[i]);
        freed += unmap_block(d, v[i], context, NULL);
        if (seg->head->unmapped && !seg->head->next)
            release_segment(d, seg);
    }
    return freed;
}

size_t sp__exp_release_unmapped(sp_devalloc_t *d, sp_segment_t *seg) {
    retry_stuck(d, seg->bpool->pool);
    if (!seg->head->unmapped || seg->head->next)
        return 0;
    release_segment(d, seg);
    return 0; /* its pages were counted as they were unmapped */
}

size_t sp__exp_release(sp_devalloc_t *d, sp_segment_t *seg, uint32_t context) {
    size_t freed = 0;
    retry_stuck(d, seg->bpool->pool);
    /* cuMemUnmap does not wait for the GPU, so the work that used the pages must be done first.
     * PyTorch syncs the segment's stream; sympool lets users destroy streams, so it syncs the
     * device (once per segment, and only when there is something to unmap). */
    /* If the device cannot be synchronized (an error, logged there, or a graph capture under
     * way), nothing is unmapped: pages still in use by the GPU must stay mapped, so they stay
     * cached for a later release. */
    if (has_free_page(seg)) {
        sp_status_t s = sp__g.ops->device_sync(d->device);
        if (s != SP_SUCCESS) {
            sp__release_refused(s);
            return 0;
        }
    }
    /* unmap_block keeps b as the unmapped survivor and only absorbs unmapped neighbours, so
     * the walk can go on from b's next block. */
    for (sp_block_t *b = seg->head; b; b = sp__block_next(b))
        if (free_mapped(b))
            freed += unmap_block(d, b, context, NULL);
    if (seg->head->unmapped && !seg->head->next)
        release_segment(d, seg);
    return freed;
}
