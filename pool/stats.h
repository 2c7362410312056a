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

/* The "all" entry of each StatArray keeps only its peak up to date: every update changes the
 * aggregate and exactly one of small/large by the same delta, and the resets reset all three
 * together, so the aggregate's current, allocated and base always equal the small and large
 * pool's sums. The hot paths then update one type's counters plus the aggregate's peak instead of
 * two full Stats; readers go through sp__stat_all (or sp__stats_settle on a copy). */
typedef struct sp_dev_stats {
    sp_stat_t arr[SP_ST_NARRAYS][SP_STAT_NTYPES]; /* [array][all/small/large]; all: peak only */
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
    return a->current == b->current && a->peak == b->peak && a->allocated == b->allocated &&
           a->base == b->base;
}

/* Arrays x and y equal where they are kept: small and large whole, the aggregate's peak. */
static inline bool sp__stat_arrays_same(const sp_dev_stats_t *st, int x, int y) {
    return sp__stat_same(&st->arr[x][SP_STAT_SMALL], &st->arr[y][SP_STAT_SMALL]) &&
           sp__stat_same(&st->arr[x][SP_STAT_LARGE], &st->arr[y][SP_STAT_LARGE]) &&
           st->arr[x][SP_STAT_ALL].peak == st->arr[y][SP_STAT_ALL].peak;
}

static inline void sp__stats_try_tie(sp_dev_stats_t *st) {
    if (!st->active_tied && sp__stat_arrays_same(st, SP_ST_ACTIVE, SP_ST_ALLOCATION) &&
        sp__stat_arrays_same(st, SP_ST_ACTIVE_BYTES, SP_ST_ALLOCATED_BYTES))
        st->active_tied = true;
}

/* PyTorch's update_stat: current += delta; peak tracks current; delta > 0 counts as allocated,
 * delta < 0 as freed (derived, see sp_stat_t). */
static inline void sp__stat_add(sp_stat_t *s, int64_t delta) {
    s->current += delta;
    if (s->current > s->peak)
        s->peak = s->current;
    if (delta > 0)
        s->allocated += delta;
}

/* The aggregate's current: the small and large pools' sum (see sp_dev_stats_t). */
static inline int64_t sp__stat_all_current(const sp_dev_stats_t *st, int a) {
    return st->arr[a][SP_STAT_SMALL].current + st->arr[a][SP_STAT_LARGE].current;
}

/* The aggregate's peak after an increase of its current. */
static inline void sp__stat_all_rose(sp_dev_stats_t *st, int a) {
    int64_t cur = sp__stat_all_current(st, a);
    if (cur > st->arr[a][SP_STAT_ALL].peak)
        st->arr[a][SP_STAT_ALL].peak = cur;
}

/* The whole aggregate Stat of array a, derived. */
static inline sp_stat_t sp__stat_all(const sp_dev_stats_t *st, int a) {
    const sp_stat_t *sm = &st->arr[a][SP_STAT_SMALL], *lg = &st->arr[a][SP_STAT_LARGE];
    sp_stat_t all = {sm->current + lg->current, st->arr[a][SP_STAT_ALL].peak,
                     sm->allocated + lg->allocated, sm->base + lg->base};
    return all;
}

/* Write the derived aggregates into st (a copy, or the live stats under the lock: harmless, as
 * the hot paths never read the aggregate's current, allocated or base). */
static inline void sp__stats_settle(sp_dev_stats_t *st) {
    for (int a = 0; a < SP_ST_NARRAYS; a++)
        st->arr[a][SP_STAT_ALL] = sp__stat_all(st, a);
}

/* Update array `a` for the aggregate and the small or large type. */
static inline void sp__stat_arr(sp_dev_stats_t *st, int a, bool is_small, int64_t delta) {
    sp__stat_add(&st->arr[a][is_small ? SP_STAT_SMALL : SP_STAT_LARGE], delta);
    if (delta > 0)
        sp__stat_all_rose(st, a);
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
    sp__stat_inc1(&st->arr[a][is_small ? SP_STAT_SMALL : SP_STAT_LARGE], n);
    sp__stat_all_rose(st, a);
}
static inline void sp__stat_dec(sp_dev_stats_t *st, int a, bool is_small, int64_t n) {
    sp__stat_dec1(&st->arr[a][is_small ? SP_STAT_SMALL : SP_STAT_LARGE], n);
}

/* Zeroed stats for a new device allocator (inline beside the struct: the one initializer). */
static inline void sp__stats_init(sp_dev_stats_t *st, size_t max_split_size) {
    memset(st, 0, sizeof(*st));
    st->active_tied = true;
    st->max_split_size = max_split_size == SIZE_MAX ? -1 : (int64_t)max_split_size;
}

#endif /* SP_POOL_STATS_H */
