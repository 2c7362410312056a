/*
 * allocator.c: the malloc and free paths of the per-device caching allocator, with PyTorch's
 * semantics (reference/pytorch-allocator.md sections 1-3): rounding, pool choice, best fit,
 * the split rule, merging on free, segment growth, the use_on_oom fallback, the releases with
 * their one retry, the OOM report, and the stat updates at exactly PyTorch's points.
 *
 * Invariants: a block is allocated (in the pointer map), pending (waiting for events) or free
 * (in its block pool's set); free neighbours without events are always merged, so two adjacent
 * free blocks never both sit in a set. Every function here runs with the device lock held,
 * except the exported entry points, which take it exactly once on the cache-hit path and make
 * no device call there.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pool/allocator.h"
#include "pool/expandable.h"
#include "pool/fork.h"
#include "pool/release.h"
#include "pool/mempool.h"
#include "pool/segment_index.h"
#include "pool/thread_cache.h"

/* ---- sizes ------------------------------------------------------------------------------- */

/* PyTorch's roundup_power2_next_division: the next multiple of floor_pow2(size) / divisions. */
size_t sp__roundup_power2_next_division(size_t size, size_t divisions);
size_t sp__roundup_power2_next_division(size_t size, size_t divisions) {
    if ((size & (size - 1)) == 0)
        return size;
    size_t floor2 = (size_t)1 << (63 - __builtin_clzll((unsigned long long)size));
    size_t step = floor2 >> (63 - __builtin_clzll((unsigned long long)divisions));
    if (step == 0)
        return floor2 << 1;
    size_t down = size & ~(step - 1);
    return down == size ? size : down + step;
}

static size_t divisions_for(size_t size) {
    int idx = (63 - __builtin_clzll((unsigned long long)size)) - 20;
    if (idx < 0)
        idx = 0;
    if (idx > 15)
        idx = 15;
    return sp__g.conf.roundup_divisions[idx];
}

/* The 512 B rounding, all of it without roundup divisions (0 < size < 1 EB: every size below
 * 512 rounds up to 512 by itself, and nothing overflows). */
static inline size_t round_512(size_t size) {
    return (size + SP_MIN_BLOCK_SIZE - 1) & ~(SP_MIN_BLOCK_SIZE - 1);
}

size_t sp__round_size(size_t size) {
    if (size < SP_MIN_BLOCK_SIZE)
        return SP_MIN_BLOCK_SIZE;
    size_t div = divisions_for(size);
    if (div > 1 && size > SP_MIN_BLOCK_SIZE * div)
        return sp__roundup_power2_next_division(size, div);
    return round_512(size);
}

size_t sp__allocation_size(size_t size) {
    if (size <= SP_SMALL_SIZE)
        return SP_SMALL_BUFFER;
    if (size < SP_MIN_LARGE_ALLOC)
        return sp__g.conf.large_segment_size;
    return SP_ROUND_LARGE * ((size + SP_ROUND_LARGE - 1) / SP_ROUND_LARGE);
}

/* PyTorch's format_size (the OOM message's figures). */
void sp__fmt_size(size_t bytes, char *buf, size_t len) {
    sp__size_format((double)bytes, SP_SIZE_PYTORCH, buf, len);
}

/* ---- block structs ----------------------------------------------------------------------- */

/* Block structs come from per-device slabs and go back to a per-device spare list: a split on
 * the cache-hit path costs no host malloc, and a block costs its struct and no allocator header
 * (a million live blocks are a million structs). Slabs are taken from the struct arena (arena.c),
 * where links between structs are 32-bit refs; a segment struct takes SP_SEG_SLOTS structs' room
 * in a slab and gives it back, whole, to a segment spare list when it goes.
 *
 * A slab is handed out front to back, one struct at a time, never threaded whole onto the spare
 * list: a device that needs a few dozen blocks touches a few pages of its slab, not all 14. An
 * allocator is often short-lived (every `sympool replay` repeat is a fresh one, with a slab per
 * device), and there faulting in and writing whole slabs cost more than the blocks' work. */
#define SLAB_BLOCKS 1023

struct sp_block_slab {
    struct sp_block_slab *next;
    sp_block_t blocks[SLAB_BLOCKS];
};

/* The pages of a device's second and later slabs, faulted in by one call as the slab is taken: a
 * device that filled a slab fills the next one too (front to back), and one madvise costs less
 * than the page faults it saves (rebuilding a replay's starting state takes a fresh segment struct
 * per segment: bench/results/2026-11-30-s23-start.jsonl). A device's first slab still faults in
 * page by page, as a short-lived allocator touches a few of its pages only (see above). Only a
 * hint: a kernel without MADV_POPULATE_WRITE (before 5.14) refuses it, and the pages fault in as
 * before. Out of line: slab_take, which slab_new is inlined into, stays small enough to be
 * inlined into its callers (callgrind). */
static __attribute__((noinline, cold)) void slab_populate(const struct sp_block_slab *s) {
#ifdef MADV_POPULATE_WRITE
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)s / page * page;
    (void)madvise((void *)lo, (uintptr_t)s + sizeof(*s) - lo, MADV_POPULATE_WRITE);
#else
    (void)s;
#endif
}

/* A new slab for d: a kept one first (its structs are cleared as they are handed out), else one
 * from the arena. */
static bool slab_new(sp_devalloc_t *d) {
    struct sp_block_slab *s = d->kept;
    if (s)
        d->kept = s->next;
    else if (!(s = sp__arena_take(sizeof(*s))))
        return false;
    if (d->slabs)
        slab_populate(s);
    s->next = d->slabs;
    d->slabs = s;
    d->slab_next = s->blocks;
    d->slab_left = SLAB_BLOCKS;
    return true;
}

/* The next never-used struct (zeroed), from another slab when the newest is used up. */
static sp_block_t *slab_take(sp_devalloc_t *d) {
    if (SP_UNLIKELY(!d->slab_left) && !slab_new(d))
        return NULL;
    sp_block_t *b = d->slab_next++;
    d->slab_left--;
    memset(b, 0, sizeof(*b));
    return b;
}

/* Slabs kept by sp_shutdown for the next allocator of the same device (init_lock). Arena memory
 * is never unmapped, so every slab is kept; the pages of all but the first KEEP_SLABS go back to
 * the kernel (they read as zeros when used again). Freeing every slab's memory let the next
 * allocator fault in again every page it touched, and a fresh allocator per run is common:
 * `sympool replay --repeat` and `--compare` make one per repeat and configuration, tests one
 * per case. A device past KEEP_DEVICES has no entry: its slabs stay unused in the arena, all
 * their pages given back. */
#define KEEP_SLABS 4
#define KEEP_DEVICES 64
static struct sp_block_slab *g_kept[KEEP_DEVICES];

void sp__block_slabs_adopt(sp_devalloc_t *d) {
    if (d->device >= 0 && d->device < KEEP_DEVICES) {
        d->kept = g_kept[d->device];
        g_kept[d->device] = NULL;
    }
}

void sp__block_slabs_free(sp_devalloc_t *d) {
    struct sp_block_slab *keep = NULL;
    bool entry = d->device >= 0 && d->device < KEEP_DEVICES;
    int warm = entry ? KEEP_SLABS : 0;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    struct sp_block_slab *lists[2] = {d->kept, d->slabs};
    for (int i = 0; i < 2; i++) {
        struct sp_block_slab *s = lists[i];
        while (s) {
            struct sp_block_slab *nx = s->next;
            if (warm > 0) {
                warm--;
            } else {
                /* The whole pages after the header: the slab stays usable, as zeros. */
                uintptr_t lo = ((uintptr_t)s + sizeof(s->next) + page - 1) / page * page;
                uintptr_t hi = ((uintptr_t)s + sizeof(*s)) / page * page;
                if (hi > lo)
                    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
            }
            s->next = keep;
            keep = s;
            s = nx;
        }
    }
    if (entry) {
        /* Append what an earlier allocator of the device left (a device that was never
         * initialized again between two shutdowns cannot have any: adopt took it). */
        struct sp_block_slab **tail = &keep;
        while (*tail)
            tail = &(*tail)->next;
        *tail = g_kept[d->device];
        g_kept[d->device] = keep;
    }
    d->kept = NULL;
    d->slabs = NULL;
    d->slab_next = NULL;
    d->slab_left = 0;
    d->spare = 0;
    d->seg_spare = NULL; /* in the slabs just kept, whose structs are cleared as handed out */
}

sp_status_t sp__pool_block_structs(int device, sp_block_structs_t *out) {
    SP_CHECK(sp__alloc_ensure());
    if (device < 0 || device >= sp__g.ndev)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "device %d does not exist", device);
    sp_devalloc_t *d = &sp__g.devs[device];
    memset(out, 0, sizeof(*out));
    sp__lock(&d->lock);
    for (const struct sp_block_slab *s = d->slabs; s; s = s->next)
        out->slabs++;
    for (const struct sp_block_slab *s = d->kept; s; s = s->next)
        out->kept++;
    out->untouched = d->slab_left;
    for (sp_ref_t r = d->spare; r; r = sp__blk(r)->hnext)
        out->spare++;
    for (const sp_segment_t *g = d->seg_spare; g; g = g->pnext)
        out->seg_spare++;
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

sp_block_t *sp__block_new(sp_devalloc_t *d) {
    sp_ref_t r = d->spare;
    if (r) {
        sp_block_t *b = sp__blk(r);
        d->spare = b->hnext;
        memset(b, 0, sizeof(*b));
        return b;
    }
    return slab_take(d);
}

/* The first idle struct, where the caller saw that there is one. */
static inline sp_block_t *spare_pop(sp_devalloc_t *d) {
    sp_block_t *b = sp__blk(d->spare);
    d->spare = b->hnext;
    return b;
}

/* sp__block_new for a struct the caller fills completely: no zeroing. */
static inline sp_block_t *block_take(sp_devalloc_t *d) {
    if (SP_LIKELY(d->spare))
        return spare_pop(d);
    return slab_take(d);
}

/* An idle struct back on the spare list. */
static inline void spare_push(sp_devalloc_t *d, sp_block_t *b) {
    b->seg = 0; /* a stale lookup index entry must not match a struct on the spare list */
    b->hnext = d->spare;
    d->spare = sp__bref(b);
}

void sp__block_recycle(sp_devalloc_t *d, sp_block_t *b) {
    /* Never an allocated block, so no recorded streams to free (hand_out clears them). */
    assert(!b->allocated);
    if (b->context)
        sp__history_context_release(b->context);
    spare_push(d, b);
}

/* A zeroed segment struct: one a released segment left (segment_give_back), else SP_SEG_SLOTS
 * consecutive structs of the newest slab (a slab with fewer left gives those to the spare list
 * first). NULL: out of struct storage. */
static sp_segment_t *segment_take(sp_devalloc_t *d) {
    sp_segment_t *idle = d->seg_spare;
    if (idle) {
        d->seg_spare = idle->pnext;
        memset(idle, 0, SP_SEG_SLOTS * sizeof(sp_block_t));
        return idle;
    }
    if (d->slab_left < SP_SEG_SLOTS) {
        while (d->slab_left) {
            sp_block_t *b = slab_take(d);
            spare_push(d, b);
        }
        if (!slab_new(d))
            return NULL;
    }
    sp_segment_t *seg = (sp_segment_t *)d->slab_next;
    d->slab_next += SP_SEG_SLOTS;
    d->slab_left -= SP_SEG_SLOTS;
    memset(seg, 0, SP_SEG_SLOTS * sizeof(sp_block_t));
    return seg;
}

/* A segment struct's room back to the segment spare list, whole, for the next segment: only
 * segment_take can use SP_SEG_SLOTS consecutive structs, and it takes them from a slab's
 * never-used end otherwise, so room handed to the block spare list was lost to segments for good
 * (and the block spare list grew by it with every segment made and released). Cleared but for
 * the link: nothing reads a released segment (the segment index dropped it, and its blocks' structs
 * were recycled with seg = 0). */
static void segment_give_back(sp_devalloc_t *d, sp_segment_t *seg) {
    memset(seg, 0, SP_SEG_SLOTS * sizeof(sp_block_t));
    seg->pnext = d->seg_spare;
    d->seg_spare = seg;
}

/* ---- finding and handing out blocks ------------------------------------------------------ */

/* get_free_block without the removal: the fitting block and its in-order predecessor, so that
 * a split can put the remainder in the block's place in the tree. */
static inline __attribute__((always_inline)) sp_block_t *
find_fit(sp_devalloc_t *d, sp_bpool_t *bp, size_t size, sp_stream_t stream, sp_block_t **pred_p) {
    if (SP_UNLIKELY(d->gc_enabled))
        bp->gfb_count++;
    sp_block_t *b = sp__bset_find_fit(&bp->free, stream, size, pred_p);
    if (!b || sp__block_stream(b) != stream)
        return NULL;
    if (SP_UNLIKELY(sp__bseg(b)->expandable))
        b = sp__exp_best_fit(bp, b, stream, pred_p);
    size_t mss = sp__g.conf.max_split_size;
    /* Oversize rules: small requests never take oversize blocks, and an oversize request takes
     * an oversize block only if it wastes less than max_non_split_rounding. The waste is
     * b->size - size (b fits: b->size >= size): PyTorch's size + rounding wraps around for a
     * max_non_split_rounding_mb near its bound (2^44 - 1), which then refused every block. */
    if (SP_UNLIKELY(b->size >= mss) &&
        (size < mss || b->size - size >= sp__g.conf.max_non_split_rounding))
        return NULL;
    /* Where in a larger cached block a large request goes (SYMPOOL_EXPANDABLE_SIDE, FIT_END):
     * tested here, after the oversize rule, exact fits first (no test of the size for them).
     * Sizes here are multiples of 512, so the test reads "over 1 MiB"; written as `>` it cost
     * the cached 512 B pair one instruction more (callgrind). A small request cut from a block
     * that holds a page (2 MiB) more than it needs may go to another block
     * (SYMPOOL_EXPANDABLE_PIN); the cached pair's block holds less. Tested in this order, the
     * cached pairs with expandable segments cost 481.0 and 562.0 instructions at 512 B and 4 MiB
     * (480.0 and 560.0 before; 483.0 and 561.0 with the old test `b->size > size` first). */
    if (SP_UNLIKELY(sp__bseg(b)->expandable)) {
        if (size >= SP_SMALL_SIZE + 512) {
            if (b->size > size)
                b = sp__exp_fit_end(d, bp, b, size, pred_p);
        } else if (b->size - size >= SP_SMALL_BUFFER) {
            b = sp__exp_pin_small(bp, b, size, stream, pred_p);
        }
    }
    return b;
}

sp_block_t *sp__alloc_get_free_block(sp_devalloc_t *d, sp_bpool_t *bp, size_t size,
                                     sp_stream_t stream) {
    sp_block_t *pred = NULL;
    sp_block_t *b = find_fit(d, bp, size, stream, &pred);
    if (b)
        sp__bset_remove(&bp->free, b);
    return b;
}

static inline bool should_split(const sp_bpool_t *bp, const sp_block_t *b, size_t size) {
    if (bp->pool->no_split)
        return false;
    size_t remaining = b->size - size;
    /* With expandable segments PyTorch splits large blocks down to 512 bytes too: the rest of
     * a page can always be unmapped, so slack is not kept in the block. Its should_split asks
     * the request's is_expandable_segments_active (malloc: the option and no pool with an
     * allocator of its own; try_mempool_fallback: false), so a pool that keeps fixed segments
     * (a pluggable allocator's, a symmetric one) splits by the fixed rule, as does a block lent
     * on OOM (mempool_fallback lends only such blocks). */
    if (bp->is_small || sp__exp_pool(bp->pool))
        return remaining >= SP_MIN_BLOCK_SIZE;
    return size < sp__g.conf.max_split_size && remaining > SP_SMALL_SIZE;
}

/* found_block. in_set: b is still in its free set with in-order predecessor pred (from
 * find_fit), and leaves it here (the cache-hit path); otherwise b is in no set. Returns the
 * allocated block: b itself, or on the cache-hit path with a split a new struct for b's low
 * addresses while b stays in the set as the remainder (PyTorch's alloc_found_block does the
 * same: the remaining block keeps the node, a new block is the allocation). The remainder's key
 * only shrinks (same stream, smaller size, higher address), so it keeps its tree node unless it
 * now sorts below its predecessor: no remove + insert on the common path.
 *
 * Hot/cold pair: hand_out is the HOT form, forced inline into alloc_malloc's cache-hit path
 * with `hist` read once by the caller and the predecessor from find_fit, so a hit costs no call
 * and no second tree walk. sp__alloc_found_block below is its COLD twin: one out-of-line copy
 * for the miss path and for sym_primitives.c (a fresh segment's block or a block already taken
 * from its set), so the inline body is not copied into every rare caller. Same body, so the
 * two cannot drift apart. `form` (a constant at every call): HIT_ANY is the whole body; the
 * other two are sp_malloc's malloc_hit (hist false, in_set true), whose caller checked that
 * nothing they leave out applies, so the branches that call out (a new slab, a tree re-insert,
 * pointer-map growth) and those that cannot apply (expandable, oversize) are left out at compile
 * time: HIT_SPLIT (hit_is_plain) splits b, HIT_WHOLE (hit_is_whole) hands b out whole, HIT_MOVE
 * (hit_splits) splits b as HIT_SPLIT does and then moves the remainder where it sorts when it
 * fell below its predecessor (the whole body's test and move, without the rest of it). */
enum { HIT_ANY, HIT_SPLIT, HIT_WHOLE, HIT_MOVE };
static inline __attribute__((always_inline)) sp_block_t *
hand_out(sp_devalloc_t *d, sp_block_t *b, bool in_set, sp_block_t *pred, size_t size, size_t orig,
         uint32_t context, bool hist, int form) {
    bool fast = form != HIT_ANY, split = form == HIT_SPLIT || form == HIT_MOVE;
    sp_segment_t *seg = sp__bseg(b);
    sp_bpool_t *bp = seg->bpool;
    sp_dev_stats_t *st = &d->stats;
    sp_stat_t *row = bp->tstat;
    /* One OR of the two links, not `||`: GCC kept the short circuit's branch and a setne
     * (three instructions more on the cached pair, callgrind). */
    bool already_split = (b->prev | b->next) != 0;
    /* b's address and size, read before any store: the stores to the new struct below may
     * alias b's fields for the compiler (same type), which would read them again. */
    uintptr_t b_addr = b->addr;
    size_t b_size = b->size;
    /* The struct a split needs; without one (out of host memory) the block goes out whole. */
    sp_ref_t nr = split ? d->spare : 0; /* the new struct's ref, where the fast form knows it */
    sp_block_t *nb = split                       ? spare_pop(d)
                     : fast                      ? NULL
                     : should_split(bp, b, size) ? block_take(d)
                                                 : NULL;
    if (split) {
        /* The split forms (fast: no expandable segment) update inactive_split first, while b's
         * figures are in registers: the statistics' stores may alias the block's fields for
         * the compiler, which after the struct stores below kept them on the stack. */
        if (already_split) {
            sp__stat_t_dec(st, row, SP_ST_INACTIVE_SPLIT_BYTES, (int64_t)size); /* b's size */
        } else {
            sp__stat_t_inc(st, row, SP_ST_INACTIVE_SPLIT_BYTES, (int64_t)(b_size - size));
            sp__stat_t_inc(st, row, SP_ST_INACTIVE_SPLIT, 1);
        }
    }
    if (split || nb) {
        sp_block_t *rem;
        if (in_set) {
            /* Every field of the new struct is set here (links and balance only matter in a set,
             * hnext is set by the pointer map below). */
            sp_block_t *a = nb;
            a->addr = b_addr;
            a->size = size;
            a->seg = b->seg;
            a->in_set = false;
            a->unmapped = false; /* a recycled struct may have been an unmapped block */
            if (split)
                sp__block_link_before_ref(a, nr, b, seg);
            else
                sp__block_link_before(a, b);
            b->addr = b_addr + size;
            b->size = b_size - size;
            /* The remainder is b's struct, as PyTorch's is the found block's object: it keeps
             * b's requested size. It is split: the segment's GC clock is not its (block.h). */
            /* A remainder that left its size class moves in every form (hit_is_plain lets it
             * through: the move is O(1) when b is alone in its class, block_set.h); one that
             * kept it moves only when it fell below its predecessor. Each class once. */
            unsigned c = 0;
            if (bp->free.moves) { /* classes, more than one block (block_set.h) */
                c = sp__bset_class(b_size);
                unsigned nc = sp__bset_class(b->size);
                if (nc != c) {
                    if (form == HIT_SPLIT)
                        sp__bset_reclass(&bp->free, b, c, nc);
                    else
                        sp__bset_reclass_inl(&bp->free, b, c, nc);
                    pred = NULL; /* moved: no second move below */
                }
            }
            if ((!fast || form == HIT_MOVE) && pred && !sp__bset_less(&bp->free, pred, b))
                sp__bset_move_from(&bp->free, b, c);
            rem = b;
            b = a;
        } else {
            /* The allocation keeps the low addresses; the remainder moves up and stays cached.
             * Every field is set here or by the set (links, balance, in_set) below. The
             * remainder is PyTorch's found object, so it keeps b's requested size (0 for a new
             * segment's block), read before b's is set below. */
            rem = nb;
            rem->addr = b_addr + size;
            rem->size = b_size - size;
            rem->seg = b->seg;
            rem->hnext = 0;
            rem->requested = b->requested; /* split: no GC clock (block.h) */
            rem->context = 0;
            rem->allocated = false;
            rem->unmapped = false;
            sp__bset_insert(&bp->free, rem);
            sp__block_link_after(rem, b);
            b->size = size;
        }
        sp__bset_check(&bp->free);
        /* inactive_split leaves expandable segments out (their free pages can be unmapped). */
        if (split || (!fast && SP_UNLIKELY(seg->expandable))) {
            /* the split forms' figures went up above */
        } else if (already_split) {
            sp__stat_t_dec(st, row, SP_ST_INACTIVE_SPLIT_BYTES, (int64_t)size); /* b's size */
        } else {
            sp__stat_t_inc(st, row, SP_ST_INACTIVE_SPLIT_BYTES, (int64_t)(b_size - size));
            sp__stat_t_inc(st, row, SP_ST_INACTIVE_SPLIT, 1);
            /* The segment's first split: PyTorch's makes a new block the allocation at the
             * segment's start, and the stack the segment was allocated with stays on the
             * remainder, which never heads the segment again (a merge into the block before it
             * takes that one's, none): its snapshots show the segment without frames from here
             * on, and its segment_free entry without them (11,953 whole segments and 2,882
             * split ones in 36 real snapshots: no split one has frames). Not in the fast forms:
             * they run only while history is off (a split then keeps a stack recorded before,
             * which costs the plain hit nothing). */
            if (!fast && SP_UNLIKELY(seg->context != 0)) {
                sp__history_context_release(seg->context);
                seg->context = 0;
            }
        }
    } else {
        if (in_set)
            sp__bset_remove(&bp->free, b);
        if (already_split && (fast || !seg->expandable)) {
            sp__stat_t_dec(st, row, SP_ST_INACTIVE_SPLIT_BYTES, (int64_t)b_size);
            sp__stat_t_dec(st, row, SP_ST_INACTIVE_SPLIT, 1);
        }
    }
    b->allocated = true;
    b->uses = NULL; /* out of every list now: the storage was the left link */
    b->requested = orig;
    b->context = context;
    if (split && in_set)
        sp__ptr_map_insert_ref(&d->map, b, nr); /* b is the new struct */
    else if (fast)
        sp__ptr_map_insert_room(&d->map, b);
    else
        sp__ptr_map_insert(&d->map, b);
    /* What b holds now: `size` after a split (no load), else the whole block. */
    size_t got = split || nb ? size : b_size;
    bp->pool->used += got;
    sp__stat_t_inc(st, row, SP_ST_ALLOCATION, 1);
    sp__stat_t_inc(st, row, SP_ST_ALLOCATED_BYTES, (int64_t)got);
    if (SP_UNLIKELY(!st->active_tied)) {
        sp__stat_t_inc(st, row, SP_ST_ACTIVE, 1);
        sp__stat_t_inc(st, row, SP_ST_ACTIVE_BYTES, (int64_t)got);
    }
    sp__stat_t_inc(st, row, SP_ST_REQUESTED_BYTES, (int64_t)orig);
    if (!fast && got >= sp__g.conf.max_split_size)
        sp__stat_add(&st->oversize_allocations, 1);
    if (SP_UNLIKELY(hist))
        sp__history_record(d->device, SP_TRACE_ALLOC, b->addr, orig, (uintptr_t)sp__block_stream(b),
                           bp->pool->id, context);
    return b;
}

/* COLD twin of hand_out (see there): b is in no free set, and is the block handed out. */
void sp__alloc_found_block(sp_devalloc_t *d, sp_block_t *b, size_t size, size_t orig,
                           uint32_t context) {
    assert(!b->in_set);
    (void)hand_out(d, b, false, NULL, size, orig, context, sp__history_on(), HIT_ANY);
}

/* ---- segments ---------------------------------------------------------------------------- */

sp_grow_refusal_t sp__alloc_segment_room(const sp_devalloc_t *d, const sp_mempool_t *pool,
                                         size_t alloc_size) {
    if (!sp__alloc_fraction_room(d, alloc_size))
        return SP_GROW_FRACTION;
    if (pool->limit && pool->reserved + alloc_size > pool->limit)
        return SP_GROW_POOL_LIMIT;
    return SP_GROW_DEVICE;
}

/* A pool's segment allocator runs: user code, under d's lock, which the fork handler then leaves
 * to this thread (sp_devalloc_t.in_user_cb). */
static void user_cb_enter(sp_devalloc_t *d) {
    sp__callback_enter();
    atomic_store_explicit(&d->in_user_cb, true, memory_order_release);
}

static void user_cb_leave(sp_devalloc_t *d) {
    atomic_store_explicit(&d->in_user_cb, false, memory_order_release);
    sp__callback_leave();
}

/* A MemPool's own allocator is user code: memory it hands out twice (overlapping a segment
 * sympool already has) or at the very top of the address space would corrupt the segment index
 * or make blocks that no free can find. Refused, and given back to it. */
static sp_status_t check_user_segment(sp_devalloc_t *d, sp_mempool_t *pool, void *ptr, size_t size,
                                      sp_stream_t stream) {
    uintptr_t a = (uintptr_t)ptr;
    const char *why = a > UINTPTR_MAX - size            ? "runs past the end of the address space"
                      : sp__segidx_overlaps(d, a, size) ? "overlaps a segment sympool already holds"
                                                        : NULL;
    if (!why)
        return SP_SUCCESS;
    user_cb_enter(d);
    pool->allocator.free(ptr, size, d->device, stream, pool->allocator.ctx);
    user_cb_leave(d);
    return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                     "the allocator of pool {%" PRIu64 ",%" PRIu64 "} returned %p for %zu bytes, "
                     "which %s; it was given back",
                     pool->id.first, pool->id.second, ptr, size, why);
}

sp_status_t sp__alloc_segment(sp_devalloc_t *d, sp_bpool_t *bp, size_t alloc_size,
                              sp_stream_t stream, uint32_t context, sp_block_t **block_p,
                              sp_grow_refusal_t *why_p) {
    sp_mempool_t *pool = bp->pool;
    *why_p = sp__alloc_segment_room(d, pool, alloc_size);
    if (*why_p != SP_GROW_DEVICE)
        return SP_ERR_OUT_OF_MEMORY;
    void *ptr = NULL;
    if (pool->has_allocator) {
        user_cb_enter(d);
        ptr = pool->allocator.alloc(alloc_size, d->device, stream, pool->allocator.ctx);
        user_cb_leave(d);
        if (!ptr)
            return SP_ERR_OUT_OF_MEMORY;
        SP_CHECK(check_user_segment(d, pool, ptr, alloc_size, stream));
    } else {
        sp_status_t s = sp__g.ops->mem_alloc(d->device, alloc_size, &ptr);
        if (s != SP_SUCCESS)
            return s; /* OOM is quiet; any other error was reported by the backend */
    }
    sp_status_t s = sp__alloc_install_segment(d, bp, ptr, alloc_size, stream, context, block_p);
    if (s != SP_SUCCESS) {
        if (pool->has_allocator) {
            user_cb_enter(d);
            pool->allocator.free(ptr, alloc_size, d->device, stream, pool->allocator.ctx);
            user_cb_leave(d);
        } else
            (void)sp__g.ops->mem_free(d->device, ptr, alloc_size);
    }
    return s;
}

/* The mirror of sp__alloc_segment_new: out of the segment index and the pool's list, its head
 * block recycled, its metadata freed. The memory itself and the byte/stat accounting are the
 * caller's.
 * Under the device lock. */
atomic_uint sp__orphan_segs;

/* One fast-path reason while any orphan exists (the 0 <-> 1 steps of the count). */
static void orphans_add(int n) {
    unsigned old = atomic_fetch_add(&sp__orphan_segs, (unsigned)n);
    if (old == 0 && n > 0)
        sp__fast_off_add(SP_FAST_REASON);
    else if (old == (unsigned)-n && n < 0)
        sp__fast_off_add(-SP_FAST_REASON);
}

void sp__alloc_orphan_stream(sp_devalloc_t *d, sp_stream_t stream) {
    int n = 0;
    for (sp_mempool_t *p = d->default_pool; p; p = p == d->default_pool ? d->pools : p->next)
        for (sp_segment_t *seg = p->seg_head; seg; seg = seg->pnext)
            if (seg->stream == stream && !seg->orphan) {
                seg->orphan = true;
                n++;
            }
    if (n)
        orphans_add(n);
}

void sp__alloc_orphans_reset(void) {
    if (atomic_exchange(&sp__orphan_segs, 0) != 0)
        sp__fast_off_add(-SP_FAST_REASON);
}

void sp__alloc_segment_delete(sp_devalloc_t *d, sp_segment_t *seg) {
    sp_mempool_t *pool = seg->bpool->pool;
    if (SP_UNLIKELY(seg->orphan))
        orphans_add(-1);
    sp__segidx_remove(d, seg);
    if (seg->pprev)
        seg->pprev->pnext = seg->pnext;
    else
        pool->seg_head = seg->pnext;
    if (seg->pnext)
        seg->pnext->pprev = seg->pprev;
    else
        pool->seg_tail = seg->pprev;
    pool->nsegments--;
    if (seg->context)
        sp__history_context_release(seg->context);
    sp__block_recycle(d, seg->head);
    free(seg->bidx_addr);
    free(seg->bidx_blk);
    segment_give_back(d, seg);
    if (SP_UNLIKELY(pool->destroyed) && pool->nsegments == 0)
        sp__mempool_drop(d, pool); /* a destroyed pool's last segment: the pool goes too */
}

/* A new segment [base, base + size) of bp's pool: its metadata, one block covering it (not yet in
 * any free set), its place in the segment index, the pool's segment list and the device's
 * address range. Accounting (reserved bytes, stats) is the caller's: fixed and expandable
 * segments count differently. Under the device lock. */
sp_status_t sp__alloc_segment_new(sp_devalloc_t *d, sp_bpool_t *bp, uintptr_t base, size_t size,
                                  sp_stream_t stream, sp_segment_t **seg_p) {
    sp_mempool_t *pool = bp->pool;
    sp_segment_t *seg = segment_take(d);
    sp_block_t *b = seg ? sp__block_new(d) : NULL;
    if (seg) {
        seg->base = base;
        seg->size = size;
        seg->stream = stream;
        seg->bpool = bp;
        seg->head = b;
    }
    if (!b || sp__segidx_insert(d, seg) != SP_SUCCESS) {
        if (seg)
            segment_give_back(d, seg);
        if (b)
            sp__block_recycle(d, b);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_POOL,
                         "out of host memory for segment metadata (or of the 4 GiB of block "
                         "structs a process may have)");
    }
    seg->seq = pool->next_seq++;
    seg->pprev = pool->seg_tail;
    if (pool->seg_tail)
        pool->seg_tail->pnext = seg;
    else
        pool->seg_head = seg;
    pool->seg_tail = seg;
    pool->nsegments++;
    b->addr = base;
    b->size = size;
    b->seg = sp__ptr_ref(seg);
    uintptr_t lo = atomic_load_explicit(&d->lo, memory_order_relaxed);
    uintptr_t hi = atomic_load_explicit(&d->hi, memory_order_relaxed);
    if (lo == 0 || base < lo)
        atomic_store_explicit(&d->lo, base, memory_order_relaxed);
    if (base + size > hi)
        atomic_store_explicit(&d->hi, base + size, memory_order_relaxed);
    *seg_p = seg;
    return SP_SUCCESS;
}

sp_status_t sp__alloc_install_segment(sp_devalloc_t *d, sp_bpool_t *bp, void *ptr,
                                      size_t alloc_size, sp_stream_t stream, uint32_t context,
                                      sp_block_t **block_p) {
    sp_mempool_t *pool = bp->pool;
    sp_segment_t *seg = NULL;
    SP_CHECK(sp__alloc_segment_new(d, bp, (uintptr_t)ptr, alloc_size, stream, &seg));
    sp_block_t *b = seg->head;
    seg->context = context;
    pool->reserved += alloc_size;
    d->total_reserved += alloc_size;
    sp_dev_stats_t *st = &d->stats;
    sp__stat_inc(st, SP_ST_SEGMENT, bp->is_small, 1);
    sp__stat_inc(st, SP_ST_RESERVED_BYTES, bp->is_small, (int64_t)alloc_size);
    if (alloc_size >= sp__g.conf.max_split_size)
        sp__stat_add(&st->oversize_segments, 1);
    st->num_device_alloc++;
    if (SP_UNLIKELY(sp__history_on()))
        sp__history_record(d->device, SP_TRACE_SEGMENT_ALLOC, seg->base, alloc_size,
                           (uintptr_t)stream, pool->id, context);
    SP_TRACE(SP_SUB_POOL,
             "device %d: new %s segment %#" PRIxPTR " of %zu bytes (pool {%" PRIu64 ",%" PRIu64
             "} seq %" PRIu64 ")",
             d->device, bp->is_small ? "small" : "large", seg->base, alloc_size, pool->id.first,
             pool->id.second, seg->seq);
    *block_p = b;
    return SP_SUCCESS;
}

static void detach_segment(sp_devalloc_t *d, sp_segment_t *seg, uint32_t context);

bool sp__alloc_release_segment(sp_devalloc_t *d, sp_segment_t *seg, uint32_t context) {
    sp_mempool_t *pool = seg->bpool->pool;
    void *base = (void *)seg->base;
    size_t size = seg->size;
    sp_stream_t stream = seg->stream;
    if (!pool->has_allocator) {
        /* Freed before it leaves the books: memory the device refused to free (logged there) is
         * still there, so the segment stays cached and a later release tries again. */
        sp_status_t s = sp__g.ops->mem_free(d->device, base, size);
        if (s != SP_SUCCESS) {
            sp__release_refused(s);
            return false;
        }
        detach_segment(d, seg, context);
        return true;
    }
    detach_segment(d, seg, context);
    user_cb_enter(d);
    pool->allocator.free(base, size, d->device, stream, pool->allocator.ctx);
    user_cb_leave(d);
    return true;
}

void sp__alloc_detach_segment(sp_devalloc_t *d, sp_segment_t *seg) {
    detach_segment(d, seg, 0);
}

static void detach_segment(sp_devalloc_t *d, sp_segment_t *seg, uint32_t context) {
    sp_bpool_t *bp = seg->bpool;
    sp_mempool_t *pool = bp->pool;
    sp_block_t *b = seg->head;
    sp__bset_remove(&bp->free, b);
    sp_dev_stats_t *st = &d->stats;
    st->num_device_free++;
    d->total_reserved -= seg->size;
    pool->reserved -= seg->size;
    sp__stat_dec(st, SP_ST_SEGMENT, bp->is_small, 1);
    sp__stat_dec(st, SP_ST_RESERVED_BYTES, bp->is_small, (int64_t)seg->size);
    if (seg->size >= sp__g.conf.max_split_size)
        sp__stat_add(&st->oversize_segments, -1);
    /* PyTorch's release_block: the stack of the call that released the segment when it gathered
     * one, else the stack the segment was allocated with (recorded only from context "alloc"
     * up, which sp__history_record decides). */
    if (SP_UNLIKELY(sp__history_on()))
        sp__history_record(d->device, SP_TRACE_SEGMENT_FREE, seg->base, seg->size,
                           (uintptr_t)seg->stream, pool->id, context ? context : seg->context);
    sp__alloc_segment_delete(d, seg);
}

/* ---- free -------------------------------------------------------------------------------- */

/* A block in the set is free with no events and no recorded streams: a block leaves the set
 * before it is handed out, and a freed block enters it only once its events are done and its
 * uses are consumed. */
static inline bool mergeable(sp_ref_t r) {
    assert(!r || !sp__blk(r)->in_set || !sp__blk(r)->allocated);
    return r && sp__blk(r)->in_set;
}

/* Hot/cold pair: free_block is the HOT form, forced inline into free_locked (sp_free's path)
 * with `hist` read once per sp_free call. sp__alloc_free_block below is its COLD twin, the one
 * out-of-line copy release.c calls when an event completes a pending free later.
 *
 * A freed block that merges keeps a neighbour's struct: the lower free neighbour p when there is
 * one, else the higher n. That struct is already in the set, and its key only grows (same
 * stream, larger size; n's address drops but within its own segment and still above every block
 * it passes), so it keeps its tree node unless it now sorts above its successor: no remove +
 * insert on the common path. The freed block's own struct is recycled. `form` (a constant at
 * every call): FREE_ANY is the whole body; the other two are sp_free's free_hit (hist false, no
 * context, caching on), whose caller checked that nothing they leave out applies, so the
 * branches that call out (tree remove, context release, SYMPOOL_NO_CACHING's release) are left
 * out at compile time: FREE_ONE (free_is_plain) merges with exactly one free neighbour, the lower
 * one when `low`, which keeps its tree node; FREE_ALONE (free_is_alone) has no free neighbour,
 * so b itself enters the set (the one call left, which the whole path makes too); FREE_MERGE
 * (free_merges) merges with one free neighbour or both, with the whole body's tree work (the
 * higher neighbour's removal, the kept block's move) and without the rest of it. */
enum { FREE_ANY, FREE_ONE, FREE_ALONE, FREE_MERGE };
static inline __attribute__((always_inline)) void
free_block(sp_devalloc_t *d, sp_block_t *b, bool low, uint32_t free_ctx, bool hist, int form) {
    bool fast = form != FREE_ANY;
    sp_segment_t *seg = sp__bseg(b);
    sp_bpool_t *bp = seg->bpool;
    sp_dev_stats_t *st = &d->stats;
    sp_stat_t *row = bp->tstat;
    size_t orig_size = b->size, req = b->requested;
    uintptr_t orig_addr = b->addr;
    uint32_t ctx = b->context;
    int64_t net_n = 0, net_bytes = 0;
    sp_block_set_t *set = &bp->free;
    sp_ref_t pr = b->prev, nr = b->next;
    bool mp = form == FREE_ONE ? low : form == FREE_ALONE ? false : mergeable(pr);
    bool mn = form == FREE_ONE ? !low : form == FREE_ALONE ? false : mergeable(nr);
    sp_block_t *p = mp ? sp__blk(pr) : sp__blk0(pr), *n = mn ? sp__blk(nr) : sp__blk0(nr);
    sp_block_t *keep = b; /* the free block that results */
    size_t keep_old = 0;  /* keep's size before the merge, when it is a neighbour (in the set) */
    /* Is keep split? From the links in hand, not read back right after their stores. */
    bool keep_split = pr || nr;
    if (mp) {
        keep = p;
        keep_old = p->size;
        net_n--;
        net_bytes -= (int64_t)p->size;
        p->size += orig_size;
        sp_ref_t after = nr;
        if ((!fast || form == FREE_MERGE) && mn) {
            sp__bset_remove(set, n);
            net_n--;
            net_bytes -= (int64_t)n->size;
            p->size += n->size;
            after = n->next;
        }
        p->next = after;
        if (after)
            sp__blk(after)->prev = pr;
        keep_split = p->prev || after;
    } else if (form == FREE_ONE || mn) {
        keep = n;
        keep_old = n->size;
        net_n--;
        net_bytes -= (int64_t)n->size;
        n->addr = orig_addr;
        n->size += orig_size;
        n->prev = pr;
        if (pr)
            p->next = nr;
        else
            seg->head = n;
        keep_split = pr || n->next;
    }
    if (keep_split) {
        net_n++;
        net_bytes += (int64_t)keep->size;
    } else {
        seg->gc_clock = bp->gfb_count; /* a whole free segment: its GC age starts (block.h) */
    }
    if (SP_UNLIKELY(seg->expandable)) {
        net_n = net_bytes = 0; /* PyTorch leaves expandable segments out of inactive_split */
    } else if (form == FREE_ONE) {
        /* One merge, so the signs are known: a keep still split nets b's bytes (count 0), else
         * keep left the figures whole (the same updates as below, without the sums' tests). */
        if (keep_split) {
            sp__stat_t_inc(st, row, SP_ST_INACTIVE_SPLIT_BYTES, (int64_t)orig_size);
        } else {
            sp__stat_t_dec(st, row, SP_ST_INACTIVE_SPLIT, 1);
            sp__stat_t_dec(st, row, SP_ST_INACTIVE_SPLIT_BYTES, (int64_t)keep_old);
        }
        net_n = net_bytes = 0;
    }
    /* A merge lowers both (a decrease touches only current); a split block freed alone raises
     * them. */
    if (net_n < 0)
        sp__stat_t_dec(st, row, SP_ST_INACTIVE_SPLIT, -net_n);
    else if (net_n > 0)
        sp__stat_t_inc(st, row, SP_ST_INACTIVE_SPLIT, net_n);
    if (net_bytes < 0)
        sp__stat_t_dec(st, row, SP_ST_INACTIVE_SPLIT_BYTES, -net_bytes);
    else if (net_bytes > 0)
        sp__stat_t_inc(st, row, SP_ST_INACTIVE_SPLIT_BYTES, net_bytes);
    if (SP_UNLIKELY(!st->active_tied)) {
        sp__stat_t_dec(st, row, SP_ST_ACTIVE, 1);
        sp__stat_t_dec(st, row, SP_ST_ACTIVE_BYTES, (int64_t)orig_size);
    }
    sp__stat_t_dec(st, row, SP_ST_REQUESTED_BYTES, (int64_t)req);
    /* PyTorch's merge keeps the freed block's object, and with it its requested size; the struct
     * kept here may be a neighbour's (b's own holds it already). */
    if (form != FREE_ALONE)
        keep->requested = req;
    if (form == FREE_ALONE) {
        sp__bset_insert(set, b); /* b holds no context (free_is_alone) */
    } else if (!fast && keep == b) {
        b->context = 0; /* a free block holds no context; ctx is released below */
        sp__bset_insert(set, b);
    } else if (set->moves) {
        /* keep grew in place (every form: free_is_plain lets a set with classes through). Out
         * of its class the node moves whatever its successor (which the class of its old size
         * would not find); within it, when it passed its successor in its tree (one in a later
         * class is larger than any size of this one). One stream: size and address decide. */
        unsigned c = sp__bset_class(keep_old), nc = sp__bset_class(keep->size);
        sp_block_t *succ;
        if (nc != c && form == FREE_ONE)
            sp__bset_reclass(set, keep, c, nc);
        else if (nc != c)
            sp__bset_reclass_inl(set, keep, c, nc);
        else if ((succ = sp__bset_tsucc(keep)) &&
                 (succ->size < keep->size || (succ->size == keep->size && succ->addr < keep->addr)))
            sp__bset_reclass_move(set, keep, c, c);
    } else if ((!fast || form == FREE_MERGE) && !set->classes) {
        /* One tree (the one block of a set with classes is in none: block_set.h). */
        sp_block_t *succ = sp__bset_succ(set, keep);
        if (succ && !sp__bset_less(set, keep, succ))
            sp__bset_move_from(set, keep, 0);
    }
    sp__bset_check(set);
    if (SP_UNLIKELY(hist))
        sp__history_record(d->device, SP_TRACE_FREE_COMPLETED, orig_addr, req,
                           (uintptr_t)sp__block_stream(b), bp->pool->id, free_ctx ? free_ctx : ctx);
    if (form == FREE_MERGE && mp && mn)
        spare_push(d, n); /* the whole path's recycle order: n, then b */
    if (form == FREE_ONE || form == FREE_MERGE)
        spare_push(d, b); /* no context (free_is_plain, free_merges) */
    if (fast)
        return;
    if (mp && mn)
        sp__block_recycle(d, n);
    if (keep != b)
        sp__block_recycle(d, b); /* releases ctx with the struct */
    else if (ctx)
        sp__history_context_release(ctx);
    /* SYMPOOL_NO_CACHING: the block is its own segment; give it back at once. */
    if (SP_UNLIKELY(sp__g.conf.no_caching) && !keep->prev && !keep->next && !bp->pool->symmetric)
        (void)sp__alloc_release_segment(d, seg, free_ctx);
}

/* COLD twin of free_block (see there): completes a free whose events have finished. */
void sp__alloc_free_block(sp_devalloc_t *d, sp_block_t *b, uint32_t free_ctx) {
    free_block(d, b, false, free_ctx, sp__history_on(), FREE_ANY);
}

/* The allocation's own figures of a free of `size` bytes in bp: the pool's used bytes,
 * allocation, allocated_bytes and oversize_allocations. */
static inline __attribute__((always_inline)) void allocation_down(sp_dev_stats_t *st,
                                                                  sp_bpool_t *bp, size_t size) {
    sp_stat_t *row = bp->tstat;
    bp->pool->used -= size;
    sp__stat_t_dec(st, row, SP_ST_ALLOCATION, 1);
    sp__stat_t_dec(st, row, SP_ST_ALLOCATED_BYTES, (int64_t)size);
    if (size >= sp__g.conf.max_split_size)
        sp__stat_add(&st->oversize_allocations, -1);
}

static inline __attribute__((always_inline)) void
free_locked(sp_devalloc_t *d, sp_block_t *b, bool low, uint32_t context, bool hist, int form) {
    bool fast = form != FREE_ANY;
    sp_bpool_t *bp = sp__bseg(b)->bpool;
    sp_dev_stats_t *st = &d->stats;
    size_t size = b->size; /* one load: the stats' stores may alias it for the compiler */
    if (fast) {
        b->allocated = false;
        /* The fast forms (history off, no events) free the block first: free_block then reads
         * b's fields before any store to a statistic, which the compiler would otherwise
         * take for a possible store to them and read them again. The two touch different
         * figures, so the order changes nothing seen after the lock. */
        free_block(d, b, low, context, hist, form);
        allocation_down(st, bp, size);
        return;
    }
    bool uses = sp__block_has_uses(b); /* before allocated drops */
    b->allocated = false;
    if (SP_UNLIKELY(uses))
        sp__stats_untie(st); /* the free may wait for events: active stays up meanwhile */
    allocation_down(st, bp, size);
    if (SP_UNLIKELY(hist))
        sp__history_record(d->device, SP_TRACE_FREE_REQUESTED, b->addr, b->requested,
                           (uintptr_t)sp__block_stream(b), bp->pool->id,
                           context ? context : b->context);
    if (SP_LIKELY(!uses) || sp__alloc_insert_events(d, b) != SP_SUCCESS || b->event_count == 0)
        free_block(d, b, low, context, hist, form);
}

void sp__alloc_free_held(sp_devalloc_t *d, sp_block_t *b) {
    (void)sp__ptr_map_remove(&d->map, b->addr);
    free_locked(d, b, false, 0, sp__history_on(), FREE_ANY);
}

/* ---- malloc ------------------------------------------------------------------------------ */

/* use_on_oom: lend a free cached block of a fallback pool (creation order; never a new
 * segment there). The block stays its pool's and returns there when freed. Never a symmetric
 * pool's (its create refuses use_on_oom): a loan on one rank between an agreement and the take
 * would make the ranks' caches diverge. */
static sp_block_t *mempool_fallback(sp_devalloc_t *d, size_t size, sp_stream_t stream) {
    for (sp_mempool_t *p = d->pools; p; p = p->next) {
        /* PyTorch's try_mempool_fallback searches with expandable segments inactive, and its
         * get_free_block then passes over expandable blocks: a pool made of them lends none. */
        if (!p->use_on_oom || p->destroyed || p->symmetric || sp__exp_pool(p))
            continue;
        sp_bpool_t *bp = size <= p->small_max ? &p->small : &p->large;
        sp_block_t *b = sp__alloc_get_free_block(d, bp, size, stream);
        if (b) {
            SP_INFO(SP_SUB_POOL,
                    "device %d: lending a %zu-byte block of pool \"%s\" {%" PRIu64 ",%" PRIu64
                    "} to a request of %zu bytes that hit OOM",
                    d->device, b->size, p->name ? p->name : "", p->id.first, p->id.second, size);
            return b;
        }
    }
    return NULL;
}

/* Whether the pool's limit refuses this growth whatever the pool releases: the bytes it must
 * reserve for the block alone are past the limit (a fixed segment of alloc_size; the pages under
 * an expandable block of size, at least that size in whole pages). CuPy's _try_block_total_bytes
 * raises at once when the size alone is past the limit, before free_all_blocks. */
static bool past_limit_alone(const sp_mempool_t *pool, const sp_bpool_t *bp, size_t size,
                             size_t alloc_size) {
    if (!pool->limit)
        return false;
    if (!sp__exp_pool(bp->pool))
        return alloc_size > pool->limit;
    size_t page = sp__exp_page(bp);
    return size / page + (size % page != 0) > pool->limit / page;
}

/* The bytes of the free blocks of every MemPool of the device (not the default pool): PyTorch's
 * allocated_in_private_pools, which its OOM text counts as allocated (the sum over graph_pools
 * of their free sets, blocks waiting for events and unmapped address space not included). */
static size_t private_pools_free_bytes(const sp_devalloc_t *d) {
    size_t n = 0;
    for (const sp_mempool_t *p = d->pools; p; p = p->next)
        for (const sp_segment_t *seg = p->seg_head; seg; seg = seg->pnext)
            for (const sp_block_t *b = seg->head; b; b = sp__block_next(b))
                n += b->in_set ? b->size : 0;
    return n;
}

/* alloc_size: what the device was asked for, which PyTorch's text names ("Tried to allocate
 * 20.00 MiB" for a 3 MiB request: its malloc reports get_allocation_size of the rounded size). */
static sp_status_t report_oom(sp_devalloc_t *d, sp_mempool_t *pool, const sp_bpool_t *bp,
                              size_t alloc_size, size_t size, sp_stream_t stream, bool limit_hit,
                              bool fraction_hit, uint32_t context) {
    size_t dfree = 0, dtotal = d->total_mem;
    (void)sp__g.ops->mem_get_info(d->device, &dfree, &dtotal);
    d->stats.num_ooms++;
    if (SP_UNLIKELY(sp__history_on()))
        sp__history_record(d->device, SP_TRACE_OOM, (uintptr_t)dfree, size, (uintptr_t)stream,
                           pool->id, context);
    char req[32], tot[32], fre[32], alc[32], unal[32], lim[32], res[32], cap[32], priv[32];
    int64_t allocated = sp__stat_all_current(&d->stats, SP_ST_ALLOCATED_BYTES);
    int64_t reserved = sp__stat_all_current(&d->stats, SP_ST_RESERVED_BYTES);
    int64_t in_private = (int64_t)private_pools_free_bytes(d);
    sp__fmt_size(alloc_size, req, sizeof(req));
    sp__fmt_size(dtotal, tot, sizeof(tot));
    sp__fmt_size(dfree, fre, sizeof(fre));
    sp__fmt_size((size_t)(allocated + in_private), alc, sizeof(alc));
    sp__fmt_size((size_t)(reserved - allocated - in_private), unal, sizeof(unal));
    sp__fmt_size((size_t)in_private, priv, sizeof(priv));
    /* PyTorch's private_pool_msg, said only when some private pool holds free blocks. */
    char private_msg[96] = "";
    if (in_private > 0)
        snprintf(private_msg, sizeof(private_msg),
                 "with %s allocated in private pools (e.g., CUDA Graphs), ", priv);
    sp__fmt_size(pool->limit, lim, sizeof(lim));
    sp__fmt_size(pool->reserved, res, sizeof(res));
    sp__fmt_size(d->allowed_max == SIZE_MAX ? 0 : d->allowed_max, cap, sizeof(cap));
    /* PyTorch's allowed_info: said whenever a fraction is set, before the allocator's figures. */
    char allowed[48] = "";
    if (d->allowed_max != SIZE_MAX)
        snprintf(allowed, sizeof(allowed), "%s allowed; ", cap);
    char extra[256] = "";
    if (limit_hit && past_limit_alone(pool, bp, size, alloc_size))
        snprintf(extra, sizeof(extra),
                 "; pool \"%s\" {%" PRIu64 ",%" PRIu64 "} has a limit of %s, which this request "
                 "alone is past (%s reserved); raise it with sp_mempool_set_limit",
                 pool->name ? pool->name : "", pool->id.first, pool->id.second, lim, res);
    else if (limit_hit)
        snprintf(extra, sizeof(extra),
                 "; pool \"%s\" {%" PRIu64 ",%" PRIu64 "} is at its limit "
                 "of %s (%s reserved); raise it with sp_mempool_set_limit",
                 pool->name ? pool->name : "", pool->id.first, pool->id.second, lim, res);
    else if (fraction_hit)
        snprintf(extra, sizeof(extra),
                 "; the memory fraction caps this process at %s "
                 "(sp_set_memory_fraction)",
                 cap);
    else if (!pool->is_default)
        snprintf(extra, sizeof(extra),
                 "; the request went to pool \"%s\" {%" PRIu64 ",%" PRIu64
                 "} (%s reserved), which never borrows from use_on_oom pools",
                 pool->name ? pool->name : "", pool->id.first, pool->id.second, res);
    /* PyTorch's sentences ("Tried to allocate <size>. GPU <n> has a total capacity of <total>
     * of which <free> is free. [<allowed> allowed; ]Of the allocated memory ..."): programs, log
     * scrapers and PyTorch's own tests (test_out_of_memory) match on them. */
    return sp__error(SP_ERR_OUT_OF_MEMORY, SP_SUB_POOL,
                     "out of memory on device %d. Tried to allocate %s. GPU %d has a total "
                     "capacity of %s of which %s is free. %sOf the allocated memory %s is "
                     "allocated by sympool, %sand %s is reserved by sympool but unallocated%s. "
                     "If reserved but unallocated memory is large, try SYMPOOL_ALLOC_CONF=%s to "
                     "reduce fragmentation",
                     d->device, req, d->device, tot, fre, allowed, alc, private_msg, unal, extra,
                     sp__g.exp_on ? "max_split_size_mb:N" : "expandable_segments:True");
}

/* PyTorch's alloc_block: a new fixed segment, or pages mapped into an expandable segment.
 * The memory fraction is checked against the fixed segment size either way, as PyTorch does. */
static sp_status_t grow(sp_devalloc_t *d, sp_bpool_t *bp, size_t size, size_t alloc_size,
                        sp_stream_t stream, uint32_t ctx, sp_block_t **b_p,
                        sp_grow_refusal_t *why_p) {
    if (!sp__exp_pool(bp->pool))
        return sp__alloc_segment(d, bp, alloc_size, stream, ctx, b_p, why_p);
    if (!sp__alloc_fraction_room(d, alloc_size)) {
        *why_p = SP_GROW_FRACTION;
        return SP_ERR_OUT_OF_MEMORY;
    }
    return sp__exp_alloc(d, bp, size, stream, ctx, b_p, why_p);
}

/* One step of the growth ladder: grow, and remember in *refused (a bit per sp_grow_refusal_t)
 * who refused it, so that the OOM report can name the pool limit or the fraction met on any
 * step. */
static sp_status_t grow_step(sp_devalloc_t *d, sp_bpool_t *bp, size_t size, size_t alloc_size,
                             sp_stream_t stream, uint32_t ctx, sp_block_t **b_p,
                             sp_grow_refusal_t *why_p, unsigned *refused) {
    sp_status_t s = grow(d, bp, size, alloc_size, stream, ctx, b_p, why_p);
    if (s == SP_ERR_OUT_OF_MEMORY)
        *refused |= 1u << *why_p;
    return s;
}

/* A stream is checked on the miss path only: a cache hit implies an earlier miss on the same
 * stream (blocks are keyed by stream), so the hit path stays free of backend calls. The one
 * exception, a segment left under a destroyed stream's handle, makes the malloc entry points
 * check first while it lasts (sp__alloc_orphan_check). */
sp_status_t sp__stream_check(sp_stream_t stream, int device, const char *fn) {
    if (!stream)
        return SP_SUCCESS;
    int sdev = -1;
    sp_status_t s = sp__g.ops->stream_device(stream, &sdev);
    if (s == SP_ERR_INVALID_ARGUMENT)
        return sp__error(s, SP_SUB_POOL, "%s: %p is not a stream (%s)", fn, stream,
                         sp_last_error());
    if (s != SP_SUCCESS) /* the device's failure stays one (device.h) */
        return sp__error(s, SP_SUB_POOL, "%s: cannot tell which device stream %p belongs to: %s",
                         fn, stream, sp_last_error());
    if (SP_UNLIKELY(sdev != device))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "%s: stream %p belongs to device %d, not to device %d", fn, stream, sdev,
                         device);
    return SP_SUCCESS;
}

/* fn: the public call, for the message (sp_malloc, or sp_mempool_malloc through the twin). */
static sp_status_t check_stream(const sp_devalloc_t *d, sp_stream_t stream, const char *fn) {
    return sp__stream_check(stream, d->device, fn);
}

/* Hot/cold pair: alloc_malloc is the HOT form, forced inline into sp_malloc so the cache-hit
 * path is one function with no call between the public entry and hand_out. sp__alloc_malloc
 * below is its out-of-line twin for sp_mempool_malloc (mempool.c), which is not worth a second
 * inlined copy of the whole path. */
static inline __attribute__((always_inline)) sp_status_t
alloc_locked(sp_devalloc_t *d, sp_mempool_t *pool, size_t orig, sp_stream_t stream, void **ptr_p,
             uint32_t ctx, bool hist, const char *fn) {
    if (SP_UNLIKELY(pool->destroyed)) {
        sp__unlock(&d->lock);
        if (ctx)
            sp__history_context_release(ctx);
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "malloc in pool \"%s\" {%" PRIu64 ",%" PRIu64 "}: the pool was destroyed",
                         pool->name ? pool->name : "", pool->id.first, pool->id.second);
    }
    if (SP_UNLIKELY(d->pending_events))
        sp__alloc_process_events(d);
    bool plain = sp__g.hit_plain; /* sp__round_size rounds as round_512 without divisions */
    size_t size = SP_LIKELY(plain) ? round_512(orig) : sp__round_size(orig);
    sp_bpool_t *bp = size <= pool->small_max ? &pool->small : &pool->large;
    bool nocache = !plain && sp__g.conf.no_caching;
    sp_block_t *pred = NULL;
    sp_block_t *b = nocache ? NULL : find_fit(d, bp, size, stream, &pred);
    /* Before the pool grows (or reports OOM), the blocks idle in thread caches go back to it and
     * best fit looks again. */
    if (SP_UNLIKELY(!b && d->tc_blocks) && sp__tc_drain(d))
        b = find_fit(d, bp, size, stream, &pred);
    if (SP_LIKELY(b)) {
        /* hand_out's block starts where b does (b itself, or the split's low part). */
        *ptr_p = (void *)b->addr;
        (void)hand_out(d, b, true, pred, size, orig, ctx, hist, HIT_ANY);
        sp__unlock(&d->lock);
        return SP_SUCCESS;
    }
    {
        size_t alloc_size = nocache ? size : sp__allocation_size(size);
        unsigned refused = 0; /* bits 1 << sp_grow_refusal_t met on the way */
        sp_grow_refusal_t why = SP_GROW_DEVICE;
        sp_status_t s = check_stream(d, stream, fn);
        if (SP_UNLIKELY(s != SP_SUCCESS)) {
            sp__unlock(&d->lock);
            if (ctx)
                sp__history_context_release(ctx);
            return s;
        }
        if (d->gc_enabled)
            sp__alloc_gc(d, ctx);
        s = grow_step(d, bp, size, alloc_size, stream, ctx, &b, &why, &refused);
        if (s == SP_ERR_OUT_OF_MEMORY && pool->is_default)
            b = mempool_fallback(d, size, stream);
        if (!b && s == SP_ERR_OUT_OF_MEMORY &&
            sp__alloc_release_available(d, bp, size, stream, ctx))
            s = grow_step(d, bp, size, alloc_size, stream, ctx, &b, &why, &refused);
        /* The releases below and their retry are skipped while a graph capture is under way,
         * as PyTorch's malloc skips release_cached_blocks and its retry (num_alloc_retries)
         * unless captures_underway is empty (c10/cuda/CUDACachingAllocator.cpp, malloc):
         * waiting and freeing would break the capture, and the graph may use the memory. */
        bool capturing = !b && s == SP_ERR_OUT_OF_MEMORY && sp__alloc_capture_underway(d);
        if (!b && s == SP_ERR_OUT_OF_MEMORY && why == SP_GROW_POOL_LIMIT && !capturing &&
            !past_limit_alone(pool, bp, size, alloc_size)) {
            /* The pool's own limit, not the device, refused: CuPy's rule is to free the pool's
             * own cached blocks (every stream) and retry once. Other pools' caches cannot help
             * a limit, so they are left alone; the retry counts as PyTorch's does. */
            sp__alloc_release_pool(d, pool, false, NULL, ctx);
            d->stats.num_alloc_retries++;
            s = grow_step(d, bp, size, alloc_size, stream, ctx, &b, &why, &refused);
        }
        if (!b && s == SP_ERR_OUT_OF_MEMORY && why != SP_GROW_POOL_LIMIT && !capturing) {
            sp__alloc_release_cached(d, ctx);
            d->stats.num_alloc_retries++;
            s = grow_step(d, bp, size, alloc_size, stream, ctx, &b, &why, &refused);
        }
        if (!b) {
            /* The limit is named only when it refused the last step: a limit met first, whose
             * release made room the device then refused, is not what raising it would fix. */
            if (s == SP_ERR_OUT_OF_MEMORY)
                s = report_oom(d, pool, bp, alloc_size, size, stream, why == SP_GROW_POOL_LIMIT,
                               refused & (1u << SP_GROW_FRACTION), ctx);
            sp__unlock(&d->lock);
            if (ctx)
                sp__history_context_release(ctx);
            return s;
        }
        if (ctx && s == SP_SUCCESS && !sp__bseg(b)->expandable)
            sp__history_context_retain(ctx); /* the new segment and the block each hold one */
    }
    sp__alloc_found_block(d, b, size, orig, ctx);
    *ptr_p = (void *)b->addr;
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

static inline __attribute__((always_inline)) sp_status_t
alloc_malloc(sp_devalloc_t *d, sp_mempool_t *pool, size_t orig, sp_stream_t stream, void **ptr_p,
             const char *fn) {
    /* The stack is captured before the lock; whether the call is recorded is read again under
     * it (sp__history_under_lock), and that one value is what its hooks see. */
    bool hist = SP_UNLIKELY(sp__history_on());
    uint32_t ctx = hist ? sp__history_capture(false) : 0;
    sp__lock(&d->lock);
    return alloc_locked(d, pool, orig, stream, ptr_p, ctx, sp__history_under_lock(hist), fn);
}

/* Out-of-line twin of alloc_malloc (see there), for sp_mempool_malloc. */
sp_status_t sp__alloc_malloc(sp_devalloc_t *d, sp_mempool_t *pool, size_t orig, sp_stream_t stream,
                             void **ptr_p) {
    return alloc_malloc(d, pool, orig, stream, ptr_p, "sp_mempool_malloc");
}

/* ---- public entry points ----------------------------------------------------------------- */

/* PyTorch refuses requests of 1 EB and more in allocate(), before its allocator: an OOM, with
 * no retry and no num_ooms, up to SIZE_MAX (its check is the first thing allocate() does, so no
 * size is rounded before it: SIZE_MAX is the same OOM there). A request above the device but
 * below 1 EB goes the whole malloc path (releases, one retry, num_ooms) like any other OOM. */
sp_status_t sp__alloc_check_size(const char *what, int device, size_t size) {
    if (size < SP_ONE_EB)
        return SP_SUCCESS;
    return sp__error(SP_ERR_OUT_OF_MEMORY, SP_SUB_POOL,
                     "out of memory on device %d. Tried to allocate more than 1EB memory "
                     "(%s of %zu bytes)",
                     device, what, size);
}

/* CUDA's pseudo handles: cudaStreamLegacy (1) is the legacy default stream, the same stream as
 * NULL here (sympool is not built with per-thread default streams), so it maps to NULL and shares
 * NULL's cached blocks. cudaStreamPerThread (2) names a different stream on every thread, yet
 * would be one cache key for all of them, letting one thread take another's block unordered: it
 * is refused. Neither value can be a real handle (host or CUDA), so the check is backend-free. */
static inline bool is_pseudo_stream(sp_stream_t stream) {
    return (uintptr_t)stream - 1u < 2u;
}

static sp_status_t map_pseudo_stream(const char *what, sp_stream_t *stream_p) {
    if (*stream_p == (sp_stream_t)(uintptr_t)1) {
        *stream_p = NULL;
        return SP_SUCCESS;
    }
    return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                     "%s: cudaStreamPerThread is a different stream on every thread and cannot "
                     "key the cache; pass the thread's real stream (or NULL for the default "
                     "stream)",
                     what);
}

sp_status_t sp__alloc_map_stream(const char *what, sp_stream_t *stream_p) {
    return is_pseudo_stream(*stream_p) ? map_pseudo_stream(what, stream_p) : SP_SUCCESS;
}

/* Can the cache hit on b (found for `size` with in-order predecessor pred) take hand_out's fast
 * form? That form is the commonest hit: an ordinary (not expandable, not oversize) block that
 * splits, with an idle struct for the allocated part, room in the pointer map, and a remainder
 * that keeps b's tree node (a predecessor of the same stream sorts by size first, so one smaller
 * than the remainder stays below it) or leaves b's size class (block_set.h), which its one call,
 * the move to the remainder's class, handles whatever the predecessor. Everything else it skips
 * needs a call or cannot apply then.
 * has_struct: leave the idle struct out of the question (a constant at each call). */
static inline bool hit_is_plain(const sp_devalloc_t *d, const sp_bpool_t *bp, const sp_block_t *b,
                                const sp_block_t *pred, size_t size, bool has_struct) {
    /* should_split for the default pool without expandable segments (sp__g.hit_fast): it never
     * has no_split, and size < max_split_size follows from b's size. */
    assert(!bp->pool->no_split && !sp__bseg(b)->expandable && !sp__exp_pool(bp->pool));
    size_t rest = b->size - size;
    /* A small block lies in a segment of SP_SMALL_BUFFER bytes, below every max_split_size
     * (20 MiB at least, as PyTorch's): never oversize. */
    assert(!bp->is_small || b->size < sp__g.conf.max_split_size);
    return (bp->is_small ? rest >= SP_MIN_BLOCK_SIZE
                         : b->size < sp__g.conf.max_split_size && rest > SP_SMALL_SIZE) &&
           (has_struct || d->spare) && sp__ptr_map_room(&d->map) &&
           (SP_LIKELY(!pred) || sp__block_stream(pred) != sp__block_stream(b) ||
            pred->size < rest ||
            (bp->free.moves && sp__bset_class(b->size) != sp__bset_class(rest)));
}

/* Can a cache hit on b that is neither plain nor whole take hand_out's HIT_MOVE form? Those are
 * hit_is_plain's conditions but the remainder's place and the idle struct: an ordinary block
 * that splits, with room in the pointer map. A miss path's hits are mostly these: a large block
 * cut for a request well below it leaves a remainder smaller than the blocks below it. */
static inline bool hit_splits(const sp_devalloc_t *d, const sp_bpool_t *bp, const sp_block_t *b,
                              size_t size) {
    assert(!bp->pool->no_split && !sp__bseg(b)->expandable && !sp__exp_pool(bp->pool));
    size_t rest = b->size - size;
    return (bp->is_small ? rest >= SP_MIN_BLOCK_SIZE
                         : b->size < sp__g.conf.max_split_size && rest > SP_SMALL_SIZE) &&
           sp__ptr_map_room(&d->map);
}

/* Can a cache hit on b that is not plain take hand_out's HIT_WHOLE form? That form is the
 * commonest hit after the plain one: an ordinary block (not oversize: hit_is_plain's reasoning)
 * too close to the size to split, so should_split says no and b leaves the set whole, with room
 * in the pointer map. Its only call is the tree removal, which the whole path makes too. */
static inline bool hit_is_whole(const sp_devalloc_t *d, const sp_bpool_t *bp, const sp_block_t *b,
                                size_t size) {
    /* Only behind malloc_hit's gate, as hit_is_plain: no no_split pool, no expandable segment. */
    assert(!bp->pool->no_split && !sp__bseg(b)->expandable && !sp__exp_pool(bp->pool));
    size_t rest = b->size - size;
    /* should_split's "no" for the default pool without expandable segments: a small block's
     * rest below 512 B, a large (not oversize, so size < max_split_size too) block's at most
     * SP_SMALL_SIZE. */
    return (bp->is_small ? rest < SP_MIN_BLOCK_SIZE
                         : b->size < sp__g.conf.max_split_size && rest <= SP_SMALL_SIZE) &&
           sp__ptr_map_room(&d->map);
}

/* alloc_malloc's path from the lock on, for malloc_hit's cases that are not its own: the lock is
 * held, no context was captured (history was off when sp_malloc looked; on since, malloc_hit did
 * not look for a block and the call is recorded without a stack, as alloc_malloc's call that
 * waited for the lock), and nothing has changed since it was taken. The next
 * commonest hit (hit_is_whole) takes its form here first, out of line: tried inline in
 * malloc_hit beside the plain hit, it made the compiler share code between the two and cost
 * the plain 512 B hit instructions; this path calls the tree removal anyway. b: the block
 * malloc_hit found (with its predecessor pred), or NULL when it did not look or found none. */
static __attribute__((noinline)) sp_status_t malloc_rest(sp_devalloc_t *d, sp_mempool_t *pool,
                                                         size_t orig, sp_stream_t stream,
                                                         void **ptr_p, sp_block_t *b,
                                                         sp_block_t *pred) {
    if (b) {
        size_t size = round_512(orig); /* malloc_hit's conditions (sp__fast_malloc_on) hold */
        sp_bpool_t *bp = size <= pool->small_max ? &pool->small : &pool->large;
        if (sp__block_stream(b) == stream && hit_is_whole(d, bp, b, size)) {
            b = hand_out(d, b, true, pred, size, orig, 0, false, HIT_WHOLE);
            *ptr_p = (void *)b->addr;
            sp__unlock(&d->lock);
            return SP_SUCCESS;
        }
        /* A split that is not plain: its remainder sorts below its predecessor (the whole
         * path's move, without that path's second lookup of b), or there is no idle struct.
         * Then the whole path's block_take would take the slab's next one (a fresh allocator
         * has none idle, so this is every split until frees give some back). Taken here onto the
         * idle list, it is the one HIT_MOVE pops. */
        if (sp__block_stream(b) == stream && (d->spare || d->slab_left) &&
            hit_splits(d, bp, b, size)) {
            if (!d->spare)
                spare_push(d, slab_take(d));
            b = hand_out(d, b, true, pred, size, orig, 0, false, HIT_MOVE);
            *ptr_p = (void *)b->addr;
            sp__unlock(&d->lock);
            return SP_SUCCESS;
        }
    }
    return alloc_locked(d, pool, orig, stream, ptr_p, 0, sp__history_on(), "sp_malloc");
}

/* The hit paths' lock, in three copies each (mode is a constant at every call). The copies in
 * malloc_fast and free_fast are the first bias owner's (core_lock.h), those in malloc_rebiased and
 * free_rebiased a re-bias owner's: while the locks are biased, their owner enters with plain
 * stores, and any other thread is sent to the whole path, whose lock takes an unowned lock or
 * revokes the bias. The CAS copies are in malloc_shared and free_shared: sp_malloc and sp_free go
 * to the copies g_hits names (sp__alloc_hits_choose). Out-of-line continuations (malloc_rest,
 * free_rest) give the lock back with sp__unlock, which knows every form. */
typedef enum { HIT_CAS, HIT_BIASED, HIT_REBIASED } hit_mode_t;

static inline __attribute__((always_inline)) bool hit_lock(sp_lock_t *l, hit_mode_t mode,
                                                           sp_lock_rec_t **rec_p) {
    if (mode == HIT_BIASED)
        return SP_LIKELY(sp__lock_mine(l)) && SP_LIKELY(sp__lock_take_biased(l));
    if (mode == HIT_REBIASED) {
        sp_lock_rec_t *r = __atomic_load_n(&l->rec_owner, __ATOMIC_RELAXED);
        *rec_p = r;
        return SP_LIKELY(sp__lock_rec_is_mine(r)) && SP_LIKELY(sp__lock_enter_rebiased_as(l, r));
    }
    return SP_LIKELY(sp__lock_try_shared(l));
}

/* rec: what hit_lock gave (the re-bias owner's record, the caller's). */
static inline __attribute__((always_inline)) void hit_unlock(sp_lock_t *l, hit_mode_t mode,
                                                             sp_lock_rec_t *rec) {
    if (mode == HIT_BIASED)
        sp__unlock_biased(l);
    else if (mode == HIT_REBIASED)
        atomic_store_explicit(&rec->in, 0, memory_order_release);
    else
        sp__unlock_shared(l);
}

/* sp_malloc in the default pool with history off, the lock taken without waiting and no call
 * on the way of the commonest hit (hit_is_plain). Anything else under the lock (pending
 * events, the GC clock, no plain hit) goes on in malloc_rest, which starts the
 * locked path from its beginning: only the free set's hint may have moved, which is a starting
 * point, not a result. The caller saw sp__fast_malloc_on (so sizes are not rounded by
 * divisions, caching is on and segments are not expandable). false: the lock was busy; nothing
 * was done and malloc_full takes the whole path. */
static inline __attribute__((always_inline)) bool malloc_hit(sp_devalloc_t *d, size_t orig,
                                                             sp_stream_t stream, void **ptr_p,
                                                             sp_status_t *s_p, hit_mode_t mode) {
    sp_lock_rec_t *rec = NULL;
    if (!hit_lock(&d->lock, mode, &rec))
        return false;
    sp_mempool_t *pool = d->default_pool;
    size_t size = round_512(orig);
    sp_bpool_t *bp = size <= pool->small_max ? &pool->small : &pool->large;
    sp_block_t *pred = NULL, *b = NULL;
    assert(!pool->destroyed); /* a default pool never is */
    /* History on since sp_malloc looked: no hit, the rest (malloc_rest) records. */
    if (SP_LIKELY(!d->pending_events && !d->gc_enabled && !sp__history_on()))
        b = sp__bset_find_fit(&bp->free, stream, size, &pred);
    if (SP_LIKELY(b && sp__block_stream(b) == stream &&
                  hit_is_plain(d, bp, b, pred, size, false))) {
        /* The split's block starts where b did: its address written without reading it back. */
        *ptr_p = (void *)b->addr;
        (void)hand_out(d, b, true, pred, size, orig, 0, false, HIT_SPLIT);
        hit_unlock(&d->lock, mode, rec);
        *s_p = SP_SUCCESS;
        return true;
    }
    *s_p = malloc_rest(d, pool, orig, stream, ptr_p, b, pred);
    return true;
}

/* The hit copies sp_malloc and sp_free call (the biased, re-biased or CAS ones). One indirect
 * jump instead of a second test of sp__fast_off: either way the call is one instruction, and the
 * copies not chosen cost nothing. Any copy is right in any state (a biased copy sends a thread
 * that does not own the lock that way to the whole path; a CAS fails on a biased word), so a call
 * that read the old choice while it changes is only slower. The tc_ pair is the same three
 * copies with the thread cache in front (sp_malloc/sp_free call them when the cache's setting is
 * the only reason against the hits: see there). */
typedef struct {
    sp_status_t (*malloc_hit)(size_t, int, sp_stream_t, void **);
    sp_status_t (*free_hit)(void *);
    sp_status_t (*tc_malloc_hit)(size_t, int, sp_stream_t, void **);
    sp_status_t (*tc_free_hit)(void *);
} hits_t;
static sp_status_t malloc_fast(size_t, int, sp_stream_t, void **);
static sp_status_t malloc_rebiased(size_t, int, sp_stream_t, void **);
static sp_status_t malloc_shared(size_t, int, sp_stream_t, void **);
static sp_status_t free_fast(void *);
static sp_status_t free_rebiased(void *);
static sp_status_t free_shared(void *);
static sp_status_t tc_malloc_fast(size_t, int, sp_stream_t, void **);
static sp_status_t tc_malloc_rebiased(size_t, int, sp_stream_t, void **);
static sp_status_t tc_malloc_shared(size_t, int, sp_stream_t, void **);
static sp_status_t tc_free_fast(void *);
static sp_status_t tc_free_rebiased(void *);
static sp_status_t tc_free_shared(void *);
static hits_t g_hits = {malloc_shared, free_shared, tc_malloc_shared, tc_free_shared};

/* A plain read outside ThreadSanitizer builds: the pointers are whole aligned words written
 * while other threads may call; a relaxed atomic load would cost the call an instruction (the
 * pointer into a register before the jump). */
static inline sp_status_t (*malloc_hit_fn(void))(size_t, int, sp_stream_t, void **) {
#ifdef SP_LOCK_TSAN
    return __atomic_load_n(&g_hits.malloc_hit, __ATOMIC_RELAXED);
#else
    return g_hits.malloc_hit;
#endif
}

static inline sp_status_t (*free_hit_fn(void))(void *) {
#ifdef SP_LOCK_TSAN
    return __atomic_load_n(&g_hits.free_hit, __ATOMIC_RELAXED);
#else
    return g_hits.free_hit;
#endif
}

static inline sp_status_t (*tc_malloc_hit_fn(void))(size_t, int, sp_stream_t, void **) {
#ifdef SP_LOCK_TSAN
    return __atomic_load_n(&g_hits.tc_malloc_hit, __ATOMIC_RELAXED);
#else
    return g_hits.tc_malloc_hit;
#endif
}

static inline sp_status_t (*tc_free_hit_fn(void))(void *) {
#ifdef SP_LOCK_TSAN
    return __atomic_load_n(&g_hits.tc_free_hit, __ATOMIC_RELAXED);
#else
    return g_hits.tc_free_hit;
#endif
}

/* The state of the locks the hits were last chosen for (sp__lock_bias_state's word). */
static int g_hits_state = -1;

/* The hits the locks' state asks for: CAS while any biasable lock is not biased (or biasing is
 * off), the re-bias owner's once a lock was re-biased, else the first owner's. */
static void hits_choose(int state) {
    bool shared = state & SP_LOCK_GONE, era = state & SP_LOCK_ERA;
    __atomic_store_n(&g_hits.malloc_hit,
                     shared ? malloc_shared
                     : era  ? malloc_rebiased
                            : malloc_fast,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&g_hits.free_hit,
                     shared ? free_shared
                     : era  ? free_rebiased
                            : free_fast,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&g_hits.tc_malloc_hit,
                     shared ? tc_malloc_shared
                     : era  ? tc_malloc_rebiased
                            : tc_malloc_fast,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&g_hits.tc_free_hit,
                     shared ? tc_free_shared
                     : era  ? tc_free_rebiased
                            : tc_free_fast,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&g_hits_state, state, __ATOMIC_RELAXED);
}

void sp__alloc_hits_choose(void) {
    hits_choose(atomic_load_explicit(&sp__lock_bias_state, memory_order_relaxed));
}

bool sp__alloc_hits_biased(void) {
    return __atomic_load_n(&g_hits.free_hit, __ATOMIC_RELAXED) != free_shared;
}

/* On a whole path: the hits follow the locks (a revocation turns them to the CAS copies, a
 * re-bias back to a biased pair). One load and a compare while nothing changed. (Two whole paths
 * that choose at once may leave the older state chosen: the next whole path chooses again, and
 * every copy is right in every state.) */
static inline void hits_follow_bias(void) {
    int state = atomic_load_explicit(&sp__lock_bias_state, memory_order_relaxed);
    if (SP_UNLIKELY(state != __atomic_load_n(&g_hits_state, __ATOMIC_RELAXED)))
        hits_choose(state);
}

/* sp_malloc's whole path: every check in its order, any pool, history, misses. */
static sp_status_t malloc_whole(size_t size, int device, sp_stream_t stream, void **ptr_p) {
    if (SP_UNLIKELY(!ptr_p))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "sp_malloc: ptr_p is NULL");
    if (sp__in_callback())
        return sp__callback_refused("sp_malloc");
    sp_devalloc_t *d = sp__alloc_device_fast(device);
    if (SP_UNLIKELY(!d))
        SP_CHECK(sp__alloc_device("sp_malloc", device, &d));
    /* One test for both rare sizes: 0 (wraps around) and 1 EB or more; the checks keep their
     * order (size 0, the stream, the size rule). */
    if (SP_UNLIKELY(size - 1 >= SP_ONE_EB - 1)) {
        if (size == 0) {
            *ptr_p = NULL;
            return SP_SUCCESS;
        }
        if (is_pseudo_stream(stream))
            SP_CHECK(map_pseudo_stream("sp_malloc", &stream));
        return sp__alloc_check_size("sp_malloc", device, size);
    }
    if (SP_UNLIKELY(is_pseudo_stream(stream)))
        SP_CHECK(map_pseudo_stream("sp_malloc", &stream));
    SP_CHECK(sp__alloc_orphan_check(d, stream, "sp_malloc"));
    sp_mempool_t *pool =
        SP_UNLIKELY(atomic_load_explicit(&sp__routing_threads, memory_order_relaxed))
            ? sp__mempool_routed(device)
            : NULL;
    if (sp__g.tc_limit && !pool && !sp__history_on() && sp__tc_malloc(size, device, stream, ptr_p))
        return SP_SUCCESS;
    return alloc_malloc(d, pool ? pool : d->default_pool, size, stream, ptr_p, "sp_malloc");
}

/* The whole path, then a look at the bias: a call that revoked one (or found it revoked) turns
 * the hits to the CAS copies at once. */
static __attribute__((noinline)) sp_status_t malloc_full(size_t size, int device,
                                                         sp_stream_t stream, void **ptr_p) {
    sp_status_t s = malloc_whole(size, device, stream, ptr_p);
    hits_follow_bias();
    return s;
}

/* sp_malloc once sp__fast_malloc_on said yes: the checks the hit needs, then the hit with the
 * lock taken as mode says (any thread the mode does not fit goes on to malloc_full). The copies
 * below are functions of their own so that sp_malloc saves no register before it knows which way
 * it goes. */
static inline __attribute__((always_inline)) sp_status_t
malloc_hit_or_full(size_t size, int device, sp_stream_t stream, void **ptr_p, hit_mode_t mode) {
    sp_status_t s;
    if (SP_LIKELY((unsigned)device < (unsigned)sp__g.ndev && ptr_p && size - 1 < SP_ONE_EB - 1 &&
                  !is_pseudo_stream(stream)) &&
        malloc_hit(&sp__g.devs[device], size, stream, ptr_p, &s, mode))
        return s;
    return malloc_full(size, device, stream, ptr_p);
}

/* The hit of a process whose locks are not biased: the lock taken with a CAS. */
static __attribute__((noinline)) sp_status_t malloc_shared(size_t size, int device,
                                                           sp_stream_t stream, void **ptr_p) {
    return malloc_hit_or_full(size, device, stream, ptr_p, HIT_CAS);
}

/* The first bias owner's hit. */
static __attribute__((noinline)) sp_status_t malloc_fast(size_t size, int device,
                                                         sp_stream_t stream, void **ptr_p) {
    return malloc_hit_or_full(size, device, stream, ptr_p, HIT_BIASED);
}

/* A re-bias owner's hit. */
static __attribute__((noinline)) sp_status_t malloc_rebiased(size_t size, int device,
                                                             sp_stream_t stream, void **ptr_p) {
    return malloc_hit_or_full(size, device, stream, ptr_p, HIT_REBIASED);
}

/* sp_malloc with the thread cache on, when its setting was the only reason against the hit
 * (sp_malloc): what the whole path would do next is the cache's sp__tc_malloc, then the ordinary
 * malloc, which the hit copy `hit` does. A request the cache may serve (1 B to 1 MiB, with
 * arguments the whole path would not refuse first) asks it; any other (a larger one: the cache
 * never holds it, sp__tc_malloc would say no without looking) goes to the hit at once. Every way
 * on is a tail call, so the copies below save no register. */
static inline __attribute__((always_inline)) sp_status_t
tc_malloc_then(size_t size, int device, sp_stream_t stream, void **ptr_p, sp_malloc_fn_t hit) {
    if (size - 1 < SP_TC_MAX_BLOCK && ptr_p && (unsigned)device < (unsigned)sp__g.ndev &&
        !is_pseudo_stream(stream))
        return sp__tc_malloc_or(size, device, stream, ptr_p, hit);
    return hit(size, device, stream, ptr_p);
}

static __attribute__((noinline)) sp_status_t tc_malloc_shared(size_t size, int device,
                                                              sp_stream_t stream, void **ptr_p) {
    return tc_malloc_then(size, device, stream, ptr_p, malloc_shared);
}

static __attribute__((noinline)) sp_status_t tc_malloc_fast(size_t size, int device,
                                                            sp_stream_t stream, void **ptr_p) {
    return tc_malloc_then(size, device, stream, ptr_p, malloc_fast);
}

static __attribute__((noinline)) sp_status_t tc_malloc_rebiased(size_t size, int device,
                                                                sp_stream_t stream, void **ptr_p) {
    return tc_malloc_then(size, device, stream, ptr_p, malloc_rebiased);
}

/* Is the thread cache's setting the only reason against the hits, off being sp__fast_off? Its
 * share is SP_FAST_TC_REST (api.c's fast_rest with the cache on), and off equals that share alone
 * only while sympool is ready with no other reason in force: a reason's share is SP_FAST_REASON,
 * and while not ready off is SP_FAST_NOT_READY plus such shares, never that odd share. Other
 * settings may make the same share with a reason in force (SP_FAST_NO_HIT and history), hence
 * tc_limit too, which is read only once off says ready: the init wrote it before it released
 * off's share. */
static inline bool only_tc_off(int off) {
    return off == SP_FAST_TC_REST && sp__g.tc_limit;
}

SP_EXPORT sp_status_t sp_malloc(size_t size, int device, sp_stream_t stream, void **ptr_p) {
    /* The commonest call (sympool ready, no callback running, no pool routing, no history, the
     * plain hit's settings: sp__fast_malloc_on; a valid device and size, a real stream) tries the
     * call-free hit first; anything else, or a hit that is not plain, goes through malloc_full
     * from its first check, as if the hit was never tried. */
    int off = __atomic_load_n(&sp__fast_off, __ATOMIC_ACQUIRE);
    if (SP_LIKELY(off == 0))
        return malloc_hit_fn()(size, device, stream, ptr_p);
    /* With the thread cache on, the same call goes through the cache and then the hit (the
     * whole path's order, without its checks the gate has made). */
    if (only_tc_off(off))
        return tc_malloc_hit_fn()(size, device, stream, ptr_p);
    return malloc_full(size, device, stream, ptr_p);
}

/* Explain why ptr is not a live block (slow path of a failed free / record_stream). */
static sp_status_t explain_bad_pointer(const char *what, const void *ptr) {
    uintptr_t a = (uintptr_t)ptr;
    for (int i = 0; i < sp__g.ndev; i++) {
        sp_devalloc_t *d = &sp__g.devs[i];
        sp__lock(&d->lock);
        sp_block_t *b = sp__segidx_block(d, a);
        if (b) {
            bool start = b->addr == a, live = b->allocated;
            /* A block idle in a thread cache is allocated to its pool but was freed by its
             * caller: "inside the allocated block" would tell the caller it is still theirs. */
            bool idle = live && sp__g.tc_limit && sp__tc_idle_block(b);
            uintptr_t base = b->addr;
            sp__unlock(&d->lock);
            /* "double free?" is a free's likely mistake; a stream recorded on the block is a use
             * after its free. */
            if (start && !live)
                return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                                 "%s(%p): the block is not allocated (%s)", what, ptr,
                                 strcmp(what, "sp_record_stream") == 0 ? "used after its free?"
                                                                       : "double free?");
            return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                             "%s(%p): points %zu bytes inside the %s block at %#" PRIxPTR
                             ", not at its start",
                             what, ptr, (size_t)(a - base),
                             idle   ? "freed (idle in a thread cache)"
                             : live ? "allocated"
                                    : "free",
                             base);
        }
        sp__unlock(&d->lock);
    }
    return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                     "%s(%p): not a pointer sympool returned (another allocator's, or already "
                     "released)",
                     what, ptr);
}

/* Can the free of allocated block b take free_block's fast form? That form is the commonest
 * free: no recorded streams, no history context (caching is on: sp__fast_free_on), and exactly
 * one free neighbour,
 * whose struct keeps its tree node (its key grows; a successor of the same stream sorts by size
 * first, so one larger than the merged block stays above it), or lies in a set with size classes
 * (block_set.h: then FREE_ONE moves it where it sorts, O(1) when it is alone in its class, and
 * its old and new classes are computed there once). Everything else it skips needs a call or
 * cannot apply then. */
static inline bool free_is_plain(const sp_block_t *b, bool *low_p) {
    sp_ref_t pr = b->prev, nr = b->next;
    bool mp = mergeable(pr), mn = mergeable(nr);
    /* One OR of the two words, not `||`: one test instead of two (callgrind: -3 a pair). */
    if (((uintptr_t)b->uses | b->context) != 0 || mp == mn)
        return false;
    *low_p = mp;
    const sp_block_t *keep = sp__blk(mp ? pr : nr);
    /* keep's set through b's segment, which is keep's (neighbours share one): free_block reads
     * the same segment and pool again without a load. */
    const sp_block_set_t *set = &sp__bseg(b)->bpool->free;
    if (set->classes)
        return true; /* FREE_ONE moves keep where it sorts (free_block) */
    const sp_block_t *succ = sp__bset_succ(set, keep);
    return !succ || sp__block_stream(succ) != sp__block_stream(keep) ||
           succ->size > keep->size + b->size;
}

/* Can the free of allocated block b, which free_is_plain refused, take free_block's FREE_ALONE
 * form? That form is the commonest free after the plain one: no recorded streams, no history
 * context, and no free neighbour, so b itself enters the set. */
static inline bool free_is_alone(const sp_block_t *b) {
    return !b->uses && !b->context && !mergeable(b->prev) && !mergeable(b->next);
}

/* Can the free of allocated block b, which free_is_plain and free_is_alone refused, take
 * free_block's FREE_MERGE form? No recorded streams and no history context: what is left is a
 * merge with both neighbours, or with one when the merged block no longer sorts below its
 * successor (a move). */
static inline bool free_merges(const sp_block_t *b) {
    return !b->uses && !b->context;
}

/* free_locked for free_hit's blocks that are not plain: the lock is held and history is off.
 * The next commonest free (free_is_alone) takes its form here, out of line: tried inline in
 * free_hit beside the plain free, a second call there made the compiler save more registers
 * and cost the plain 512 B free instructions; this path calls the tree insertion anyway. */
static __attribute__((noinline)) void free_rest(sp_devalloc_t *d, sp_block_t *b) {
    if (free_is_alone(b)) {
        b->hnext = 0; /* out of the pointer map (free_hit), into the set */
        free_locked(d, b, false, 0, false, FREE_ALONE);
    } else if (free_merges(b)) { /* b's struct goes to the idle list, which sets its hnext */
        free_locked(d, b, false, 0, false, FREE_MERGE);
    } else {
        b->hnext = 0;
        free_locked(d, b, false, 0, false, FREE_ANY);
    }
    sp__unlock(&d->lock);
}

/* Does d's address range hold a? (Never a = 0: a range starts at a segment's base.) */
static inline bool in_range(const sp_devalloc_t *d, uintptr_t a) {
    return a >= atomic_load_explicit(&d->lo, memory_order_relaxed) &&
           a < atomic_load_explicit(&d->hi, memory_order_relaxed);
}

/* The first device after device 0 whose address range holds a, or NULL. */
static __attribute__((noinline)) sp_devalloc_t *later_device(uintptr_t a) {
    for (int i = 1; i < sp__g.ndev; i++)
        if (in_range(&sp__g.devs[i], a))
            return &sp__g.devs[i];
    return NULL;
}

/* sp_free with history off: the block is in the first device whose address range holds ptr (the
 * whole path's first match too) and the lock was free; the commonest free (free_is_plain) has no
 * call on its way, any other free of a block found goes on in free_rest. false: the lock was
 * busy or the pointer is not there; nothing was done and free_full takes the whole path.
 * tc (a constant): the thread cache is on and the calling thread's table was asked first
 * (tc_free_rest): a block the cache may hold or keep (no larger than SP_TC_MAX_BLOCK) meets the
 * whole path's hook here, under the lock already held; a larger one the cache never holds
 * (sp__tc_on_free would only read its requested size) goes straight on. */
static inline __attribute__((always_inline)) bool free_hit(uintptr_t a, hit_mode_t mode, bool tc) {
    /* devs[0] exists even with no device (zeroed: its empty range holds nothing), so the
     * commonest case, device 0, costs no device count or index. */
    sp_devalloc_t *d = sp__g.devs;
    if (SP_UNLIKELY(!in_range(d, a)) && !(d = later_device(a)))
        return false;
    sp_lock_rec_t *rec = NULL;
    if (SP_UNLIKELY(!hit_lock(&d->lock, mode, &rec)))
        return false;
    if (SP_UNLIKELY(sp__history_on())) { /* on since sp_free looked: the whole path records */
        hit_unlock(&d->lock, mode, rec);
        return false;
    }
    sp_block_t *b = NULL;
    sp_ref_t *pp = sp__ptr_map_slot_b(&d->map, a, &b);
    if (SP_UNLIKELY(!pp)) {
        hit_unlock(&d->lock, mode, rec);
        return false;
    }
    if (tc && b->size <= SP_TC_MAX_BLOCK) {
        size_t req_unused;
        sp_tc_verdict_t v = sp__tc_on_free(d, b, false, &req_unused);
        if (v != SP_TC_FREE) {
            /* Kept by this thread's cache: done. Idle in a cache already: a double free, which
             * the whole path finds again and reports. */
            hit_unlock(&d->lock, mode, rec);
            return v == SP_TC_KEPT;
        }
    }
    /* b leaves the pointer map before the tests of its form read it: the map's stores may alias
     * b's fields for the compiler, which then read again what the tests had read. Its hnext is
     * set where its struct goes (the idle list, or cleared in free_rest). */
    sp__ptr_map_unlink_reused(&d->map, pp, b);
    bool low = false;
    if (SP_LIKELY(free_is_plain(b, &low))) {
        free_locked(d, b, low, 0, false, FREE_ONE);
        hit_unlock(&d->lock, mode, rec);
    } else {
        free_rest(d, b);
    }
    return true;
}

/* With the thread cache on, before the ordinary free of the block at a (d's lock held): the
 * cache's verdict (thread_cache.h); SP_TC_FREE also when no block starts at a. */
static sp_tc_verdict_t tc_hook(sp_devalloc_t *d, uintptr_t a, bool hist, size_t *req_p) {
    sp_block_t *b = sp__ptr_map_find(&d->map, a);
    return b ? sp__tc_on_free(d, b, hist, req_p) : SP_TC_FREE;
}

static sp_status_t tc_verdict_status(sp_tc_verdict_t v, const char *what, const void *ptr) {
    if (v == SP_TC_KEPT)
        return SP_SUCCESS;
    return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                     "%s(%p): the block is not allocated (double free? it is idle in a thread "
                     "cache)",
                     what, ptr);
}

/* sp_free's whole path: every check in its order, history, events, every device. */
static sp_status_t free_whole(void *ptr) {
    if (!ptr)
        return SP_SUCCESS;
    if (sp__in_callback())
        return sp__callback_refused("sp_free");
    if (SP_UNLIKELY(!atomic_load_explicit(&sp__ready, memory_order_acquire))) {
        if (sp__fork_child_off())
            return sp__fork_error("sp_free");
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_free(%p): sympool is not initialized, so this is not its pointer",
                         ptr);
    }
    uintptr_t a = (uintptr_t)ptr;
    bool hist = SP_UNLIKELY(sp__history_on());
    if (sp__g.tc_limit && !hist && sp__tc_free(a, NULL, NULL))
        return SP_SUCCESS;
    uint32_t ctx = hist ? sp__history_capture(true) : 0;
    for (int i = 0; i < sp__g.ndev; i++) {
        sp_devalloc_t *d = &sp__g.devs[i];
        if (a < atomic_load_explicit(&d->lo, memory_order_relaxed) ||
            a >= atomic_load_explicit(&d->hi, memory_order_relaxed))
            continue;
        sp__lock(&d->lock);
        hist = sp__history_under_lock(hist);
        size_t req = 0;
        sp_tc_verdict_t v = SP_UNLIKELY(sp__g.tc_limit) ? tc_hook(d, a, hist, &req) : SP_TC_FREE;
        if (SP_UNLIKELY(v != SP_TC_FREE)) {
            sp__unlock(&d->lock);
            if (ctx)
                sp__history_context_release(ctx);
            return tc_verdict_status(v, "sp_free", ptr);
        }
        sp_block_t *b = sp__ptr_map_remove(&d->map, a);
        if (SP_LIKELY(b)) {
            free_locked(d, b, false, ctx, hist, FREE_ANY);
            sp__unlock(&d->lock);
            if (ctx)
                sp__history_context_release(ctx);
            return SP_SUCCESS;
        }
        sp__unlock(&d->lock);
    }
    if (ctx)
        sp__history_context_release(ctx);
    return explain_bad_pointer("sp_free", ptr);
}

/* The whole path, then a look at the bias (see malloc_full). */
static __attribute__((noinline)) sp_status_t free_full(void *ptr) {
    sp_status_t s = free_whole(ptr);
    hits_follow_bias();
    return s;
}

/* sp_free's hit with the CAS, as malloc_shared's. */
static __attribute__((noinline)) sp_status_t free_shared(void *ptr) {
    if (free_hit((uintptr_t)ptr, HIT_CAS, false))
        return SP_SUCCESS;
    return free_full(ptr);
}

/* sp_free once sp__fast_free_on said yes, in the bias owner (see malloc_fast). */
static __attribute__((noinline)) sp_status_t free_fast(void *ptr) {
    if (free_hit((uintptr_t)ptr, HIT_BIASED, false))
        return SP_SUCCESS;
    return free_full(ptr);
}

/* sp_free's hit in a re-bias owner (see malloc_rebiased). */
static __attribute__((noinline)) sp_status_t free_rebiased(void *ptr) {
    if (free_hit((uintptr_t)ptr, HIT_REBIASED, false))
        return SP_SUCCESS;
    return free_full(ptr);
}

/* sp_free with the thread cache on, when its setting was the only reason against the hit
 * (sp_free): the whole path's next steps are the cache's sp__tc_free (here sp__tc_free_or: the
 * same answer, and none at once for a thread with no block out), then the ordinary free with its
 * hook, which the tc_free_rest_ copies do with free_hit's tc form. NULL is the whole path's (it
 * asks no cache). The ways on are tail calls, as in tc_malloc_then. */
static inline __attribute__((always_inline)) sp_status_t tc_free_rest(void *ptr, hit_mode_t mode) {
    if (free_hit((uintptr_t)ptr, mode, true))
        return SP_SUCCESS;
    return free_full(ptr);
}

static __attribute__((noinline)) sp_status_t tc_free_rest_shared(void *ptr) {
    return tc_free_rest(ptr, HIT_CAS);
}

static __attribute__((noinline)) sp_status_t tc_free_rest_fast(void *ptr) {
    return tc_free_rest(ptr, HIT_BIASED);
}

static __attribute__((noinline)) sp_status_t tc_free_rest_rebiased(void *ptr) {
    return tc_free_rest(ptr, HIT_REBIASED);
}

static __attribute__((noinline)) sp_status_t tc_free_shared(void *ptr) {
    return ptr ? sp__tc_free_or(ptr, tc_free_rest_shared) : free_full(ptr);
}

static __attribute__((noinline)) sp_status_t tc_free_fast(void *ptr) {
    return ptr ? sp__tc_free_or(ptr, tc_free_rest_fast) : free_full(ptr);
}

static __attribute__((noinline)) sp_status_t tc_free_rebiased(void *ptr) {
    return ptr ? sp__tc_free_or(ptr, tc_free_rest_rebiased) : free_full(ptr);
}

SP_EXPORT sp_status_t sp_free(void *ptr) {
    /* The commonest call (sympool ready, no callback running, no history, no thread cache:
     * sp__fast_free_on) tries the call-free free first; anything else goes through free_full
     * from its first check. NULL is in no device's range, so free_full answers it. */
    int off = __atomic_load_n(&sp__fast_off, __ATOMIC_ACQUIRE);
    if (SP_LIKELY(off < SP_FAST_REASON))
        return free_hit_fn()(ptr);
    if (only_tc_off(off)) /* see sp_malloc */
        return tc_free_hit_fn()(ptr);
    return free_full(ptr);
}

/* COLD twin of sp_free for sp_torch_free: the same locked probe-and-free, but the device PyTorch
 * names is probed first and the block's requested size and device come back for its checks.
 * Kept apart on purpose: folding both into one inline function with a `first` device and out
 * parameters cost sp_free 1.0-1.5 ns per cached malloc+free pair (~3%, bench_alloc, one thread,
 * 5 interleaved runs each, same session). */
sp_status_t sp__alloc_free_sized(void *ptr, int device, size_t *size_p, int *device_p) {
    if (SP_UNLIKELY(!atomic_load_explicit(&sp__ready, memory_order_acquire))) {
        if (sp__fork_child_off()) /* as free_whole: the pointer is the parent's, and live */
            return sp__fork_error("sp_torch_free");
        return sp__error(
            SP_ERR_INVALID_USAGE, SP_SUB_POOL,
            "sp_torch_free(%p): sympool is not initialized, so this is not its pointer", ptr);
    }
    uintptr_t a = (uintptr_t)ptr;
    bool hist = SP_UNLIKELY(sp__history_on());
    if (sp__g.tc_limit && !hist && sp__tc_free(a, size_p, device_p))
        return SP_SUCCESS;
    uint32_t ctx = hist ? sp__history_capture(true) : 0;
    /* The device PyTorch names first, then (a mismatch) the others: one locked probe of the
     * pointer map finds, checks and frees the block. */
    for (int k = -1; k < sp__g.ndev; k++) {
        int i = k < 0 ? device : k;
        if (i < 0 || i >= sp__g.ndev || (k >= 0 && i == device))
            continue;
        sp_devalloc_t *d = &sp__g.devs[i];
        if (a < atomic_load_explicit(&d->lo, memory_order_relaxed) ||
            a >= atomic_load_explicit(&d->hi, memory_order_relaxed))
            continue;
        sp__lock(&d->lock);
        size_t kreq = 0;
        sp_tc_verdict_t v = SP_UNLIKELY(sp__g.tc_limit) ? tc_hook(d, a, hist, &kreq) : SP_TC_FREE;
        if (SP_UNLIKELY(v != SP_TC_FREE)) {
            *size_p = kreq;
            *device_p = i;
            sp__unlock(&d->lock);
            if (ctx)
                sp__history_context_release(ctx);
            return tc_verdict_status(v, "sp_torch_free", ptr);
        }
        sp_block_t *b = sp__ptr_map_remove(&d->map, a);
        if (SP_LIKELY(b)) {
            size_t req = b->requested;
            free_locked(d, b, false, ctx, hist, FREE_ANY);
            sp__unlock(&d->lock);
            if (ctx)
                sp__history_context_release(ctx);
            *size_p = req;
            *device_p = i;
            return SP_SUCCESS;
        }
        sp__unlock(&d->lock);
    }
    if (ctx)
        sp__history_context_release(ctx);
    return explain_bad_pointer("sp_torch_free", ptr);
}

SP_EXPORT sp_status_t sp_record_stream(void *ptr, sp_stream_t stream) {
    if (sp__in_callback())
        return sp__callback_refused("sp_record_stream");
    /* NULL is an empty tensor's storage, as sp_free(NULL) is: PyTorch's recordStream returns
     * for a null pointer before it looks at anything (no block, nothing to wait for). */
    if (ptr == NULL)
        return SP_SUCCESS;
    if (SP_UNLIKELY(!atomic_load_explicit(&sp__ready, memory_order_acquire))) {
        if (sp__fork_child_off()) /* as sp_free: the fork turned sympool off (fork.c) */
            return sp__fork_error("sp_record_stream");
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                         "sp_record_stream(%p): not a live sympool block", ptr);
    }
    if (SP_UNLIKELY(is_pseudo_stream(stream)))
        SP_CHECK(map_pseudo_stream("sp_record_stream", &stream));
    int sdev = -1;
    sp_status_t s = stream ? sp__g.ops->stream_device(stream, &sdev) : SP_SUCCESS;
    if (SP_UNLIKELY(s != SP_SUCCESS)) /* the backend's text does not say which call refused */
        return sp__error(s, SP_SUB_POOL,
                         s == SP_ERR_INVALID_ARGUMENT
                             ? "sp_record_stream(%p): %p is not a stream (%s)"
                             : "sp_record_stream(%p): cannot tell which device stream %p belongs "
                               "to: %s",
                         ptr, stream, sp_last_error());
    uintptr_t a = (uintptr_t)ptr;
    for (int i = 0; i < sp__g.ndev; i++) {
        sp_devalloc_t *d = &sp__g.devs[i];
        sp__lock(&d->lock);
        sp_block_t *b = sp__ptr_map_find(&d->map, a);
        if (!b) {
            b = sp__segidx_block(d, a);
            if (b && !b->allocated)
                b = NULL;
        }
        if (!b) {
            sp__unlock(&d->lock);
            continue;
        }
        if (sdev >= 0 && sdev != i) {
            sp__unlock(&d->lock);
            return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                             "sp_record_stream(%p): the stream belongs to device %d, the block "
                             "to device %d",
                             ptr, sdev, i);
        }
        /* A block idle in a thread cache was freed: not a live block, on any stream. */
        if (SP_UNLIKELY(sp__g.tc_limit) && sp__tc_idle_block(b)) {
            sp__unlock(&d->lock);
            return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                             "sp_record_stream(%p): the block was freed (it is idle in a thread "
                             "cache)",
                             ptr);
        }
        if (stream == sp__block_stream(b)) {
            sp__unlock(&d->lock);
            return SP_SUCCESS; /* a use on the allocation stream needs no event */
        }
        /* A use on another stream: the block's free must wait for it, which a thread cache's
         * free would not, so it leaves the cache that handed it out. */
        if (SP_UNLIKELY(sp__g.tc_limit) && !sp__tc_unregister(d, b)) {
            sp__unlock(&d->lock);
            return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                             "sp_record_stream(%p): the block was freed (it is idle in a thread "
                             "cache)",
                             ptr);
        }
        sp_block_uses_t *us = b->uses;
        for (uint32_t k = 0; us && k < us->n; k++) {
            if (us->s[k] == stream) {
                sp__unlock(&d->lock);
                return SP_SUCCESS;
            }
        }
        if (!us) {
            us = calloc(1, sizeof(*us));
            if (!us) {
                sp__unlock(&d->lock);
                return sp__error(SP_ERR_SYSTEM, SP_SUB_POOL, "out of host memory");
            }
            b->uses = us;
            d->use_blocks++; /* sp__alloc_forget_stream's reason to look */
        }
        if (us->n == us->cap) {
            uint32_t cap = us->cap ? us->cap * 2 : 4;
            sp_stream_t *u = realloc(us->s, cap * sizeof(*u));
            if (!u) {
                sp__unlock(&d->lock);
                return sp__error(SP_ERR_SYSTEM, SP_SUB_POOL, "out of host memory");
            }
            us->s = u;
            us->cap = cap;
        }
        us->s[us->n++] = stream;
        sp__unlock(&d->lock);
        return SP_SUCCESS;
    }
    return explain_bad_pointer("sp_record_stream", ptr);
}
