/*
 * stats.h: private to pool/: PyTorch's DeviceStats as the allocator keeps them (stats.c reads
 * and resets them; the inline updates below sit on the malloc and free paths).
 */
#ifndef SP_POOL_STATS_H
#define SP_POOL_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"

/* ---- stats (PyTorch's DeviceStats) ------------------------------------------------------- */

/* PyTorch's Stat, kept in a form whose hot updates are one or two instructions each. `current`
 * is derived as peak - slack (slack = how far current is below its peak, never negative): an
 * increase lowers slack and only a negative slack, a new peak, needs more (peak takes the excess,
 * slack goes back to 0), a decrease raises slack; neither reads current. `freed` is derived as
 * allocated - (current - base), base being `current` at the last accumulated reset, so that a
 * decrease touches one word. sp__stat_current / sp__stat_freed read them; stats.c materializes
 * both in copies. */
typedef struct sp_stat {
    int64_t slack;     /* peak - current, >= 0 (see above) */
    int64_t peak;      /* max of current since the last peak reset */
    int64_t allocated; /* sum of increases since the last accumulated reset */
    int64_t base;      /* current at the last accumulated reset (see above) */
} sp_stat_t;

static inline int64_t sp__stat_current(const sp_stat_t *s) {
    return s->peak - s->slack;
}

static inline int64_t sp__stat_freed(const sp_stat_t *s) {
    return s->allocated - (sp__stat_current(s) - s->base);
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

/* The "all" entry of each StatArray keeps only its slack up to date (its peak follows as the
 * aggregate's current plus that slack): every update changes the aggregate and exactly one of
 * small/large by the same delta, and the resets reset all three together, so the aggregate's
 * current, allocated and base always equal the small and large pool's sums. The hot paths then
 * update one type's counters plus the aggregate's slack instead of two full Stats; readers go
 * through sp__stat_all (or sp__stats_settle on a copy). */
typedef struct sp_dev_stats {
    sp_stat_t arr[SP_ST_NARRAYS][SP_STAT_NTYPES]; /* [array][all/small/large]; all: slack only */
    sp_stat_t oversize_allocations;               /* blocks >= max_split_size handed out */
    sp_stat_t oversize_segments;                  /* segments >= max_split_size */
    int64_t num_alloc_retries;                    /* alloc_block calls after release_cached */
    int64_t num_ooms;                             /* OOMs reported to callers */
    int64_t max_split_size;                       /* bytes; -1 when unlimited */
    int64_t num_sync_all_streams;                 /* synchronize_and_free_events calls */
    int64_t num_device_alloc;                     /* successful segment allocations */
    int64_t num_device_free;                      /* segment releases */
    bool active_tied; /* active and active_bytes are allocation and allocated_bytes (below) */
} sp_dev_stats_t;

/* PyTorch counts a block as active from its allocation until its free completes, and as an
 * allocation until sp_free: the two differ only while a freed block waits for events of streams
 * recorded on it. Until then both pairs (active/allocation, active_bytes/allocated_bytes) see
 * the same updates, so every field is equal; while `active_tied` the hot paths update only
 * allocation and allocated_bytes, and readers copy them (sp__stats_untie on a copy). A free that
 * may wait unties the live stats first; the pairs are tied again wherever they are found equal
 * in every field (sp__stats_try_tie: after the last pending free completes, after the resets). */
static inline void sp__stats_untie(sp_dev_stats_t *st) {
    if (!st->active_tied)
        return;
    memcpy(st->arr[SP_ST_ACTIVE], st->arr[SP_ST_ALLOCATION], sizeof(st->arr[0]));
    memcpy(st->arr[SP_ST_ACTIVE_BYTES], st->arr[SP_ST_ALLOCATED_BYTES], sizeof(st->arr[0]));
    st->active_tied = false;
}

static inline bool sp__stat_same(const sp_stat_t *a, const sp_stat_t *b) {
    return a->slack == b->slack && a->peak == b->peak && a->allocated == b->allocated &&
           a->base == b->base;
}

/* Arrays x and y equal where they are kept: small and large whole, the aggregate's slack (with
 * equal small and large pools, equal slacks are equal aggregate peaks). */
static inline bool sp__stat_arrays_same(const sp_dev_stats_t *st, int x, int y) {
    return sp__stat_same(&st->arr[x][SP_STAT_SMALL], &st->arr[y][SP_STAT_SMALL]) &&
           sp__stat_same(&st->arr[x][SP_STAT_LARGE], &st->arr[y][SP_STAT_LARGE]) &&
           st->arr[x][SP_STAT_ALL].slack == st->arr[y][SP_STAT_ALL].slack;
}

static inline void sp__stats_try_tie(sp_dev_stats_t *st) {
    if (!st->active_tied && sp__stat_arrays_same(st, SP_ST_ACTIVE, SP_ST_ALLOCATION) &&
        sp__stat_arrays_same(st, SP_ST_ACTIVE_BYTES, SP_ST_ALLOCATED_BYTES))
        st->active_tied = true;
}

/* The hot updates with a known direction (n >= 0). An increase: allocated grows, slack shrinks
 * and a negative slack is a new peak (PyTorch's update_stat raises peak to current there). A
 * decrease: slack grows (freed grows through its derivation).
 *
 * On x86-64 with GCC or clang the words are updated by single read-modify-write instructions
 * whose sign flag is the new-peak test (sp__add_mem, sp__sub_mem_neg): written in C, the compiler
 * keeps each slack in a register for the rare branch (load, subtract, store, test) or turns that
 * branch into a conditional move, about twice the instructions on the cache-hit path. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
static inline void sp__add_mem(int64_t *p, int64_t n) {
    __asm__("addq %1, %0" : "+m"(*p) : "er"(n) : "cc");
}
/* *p -= n; is the result negative? */
static inline bool sp__sub_mem_neg(int64_t *p, int64_t n) {
    bool neg;
    __asm__("subq %2, %0" : "+m"(*p), "=@ccs"(neg) : "er"(n));
    return neg;
}
#else
static inline void sp__add_mem(int64_t *p, int64_t n) {
    *p += n;
}
static inline bool sp__sub_mem_neg(int64_t *p, int64_t n) {
    return (*p -= n) < 0;
}
#endif

static inline void sp__stat_inc1(sp_stat_t *s, int64_t n) {
    sp__add_mem(&s->allocated, n);
    if (SP_UNLIKELY(sp__sub_mem_neg(&s->slack, n))) {
        s->peak -= s->slack;
        s->slack = 0;
    }
}
static inline void sp__stat_dec1(sp_stat_t *s, int64_t n) {
    sp__add_mem(&s->slack, n);
}

/* PyTorch's update_stat with either sign: current += delta, peak tracks current, delta > 0 counts
 * as allocated, delta < 0 as freed (derived, see sp_stat_t). */
static inline void sp__stat_add(sp_stat_t *s, int64_t delta) {
    if (delta > 0)
        sp__stat_inc1(s, delta);
    else
        sp__stat_dec1(s, -delta);
}

/* The aggregate's current: the small and large pools' sum (see sp_dev_stats_t). */
static inline int64_t sp__stat_all_current(const sp_dev_stats_t *st, int a) {
    return sp__stat_current(&st->arr[a][SP_STAT_SMALL]) +
           sp__stat_current(&st->arr[a][SP_STAT_LARGE]);
}

/* The aggregate's peak. */
static inline int64_t sp__stat_all_peak(const sp_dev_stats_t *st, int a) {
    return sp__stat_all_current(st, a) + st->arr[a][SP_STAT_ALL].slack;
}

/* The whole aggregate Stat of array a, derived. */
static inline sp_stat_t sp__stat_all(const sp_dev_stats_t *st, int a) {
    const sp_stat_t *sm = &st->arr[a][SP_STAT_SMALL], *lg = &st->arr[a][SP_STAT_LARGE];
    sp_stat_t all = {.slack = st->arr[a][SP_STAT_ALL].slack,
                     .peak = sp__stat_all_peak(st, a),
                     .allocated = sm->allocated + lg->allocated,
                     .base = sm->base + lg->base};
    return all;
}

/* Write the derived aggregates into st (a copy, or the live stats under the lock: harmless, as
 * the hot paths read only the aggregate's slack, which this keeps). */
static inline void sp__stats_settle(sp_dev_stats_t *st) {
    for (int a = 0; a < SP_ST_NARRAYS; a++)
        st->arr[a][SP_STAT_ALL] = sp__stat_all(st, a);
}

/* Update array `a` for the small or large type and the aggregate (its slack alone, see
 * sp_dev_stats_t: a negative one is a new aggregate peak, which then equals its current). The
 * hot paths pass their block pool's row of its type's Stats (sp__stat_type_row): the Stat of
 * array `a` is a constant distance into it, so they compute no index from the type. */
static inline sp_stat_t *sp__stat_type_row(sp_dev_stats_t *st, bool is_small) {
    return &st->arr[0][is_small ? SP_STAT_SMALL : SP_STAT_LARGE];
}
static inline void sp__stat_t_inc(sp_dev_stats_t *st, sp_stat_t *row, int a, int64_t n) {
    sp__stat_inc1(&row[a * SP_STAT_NTYPES], n);
    if (SP_UNLIKELY(sp__sub_mem_neg(&st->arr[a][SP_STAT_ALL].slack, n)))
        st->arr[a][SP_STAT_ALL].slack = 0; /* a new aggregate peak: its current */
}
static inline void sp__stat_t_dec(sp_dev_stats_t *st, sp_stat_t *row, int a, int64_t n) {
    sp__stat_dec1(&row[a * SP_STAT_NTYPES], n);
    sp__add_mem(&st->arr[a][SP_STAT_ALL].slack, n);
}
static inline void sp__stat_inc(sp_dev_stats_t *st, int a, bool is_small, int64_t n) {
    sp__stat_t_inc(st, sp__stat_type_row(st, is_small), a, n);
}
static inline void sp__stat_dec(sp_dev_stats_t *st, int a, bool is_small, int64_t n) {
    sp__stat_t_dec(st, sp__stat_type_row(st, is_small), a, n);
}

/* Zeroed stats for a new device allocator (inline beside the struct: the one initializer). */
static inline void sp__stats_init(sp_dev_stats_t *st, size_t max_split_size) {
    memset(st, 0, sizeof(*st));
    st->active_tied = true;
    st->max_split_size = max_split_size == SIZE_MAX ? -1 : (int64_t)max_split_size;
}

#endif /* SP_POOL_STATS_H */
