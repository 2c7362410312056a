/*
 * gap_array.h: private to the library: a sorted array of {key, val} pairs kept with a gap, for
 * the address indexes whose inserts and removals land near each other (the pool's segment index,
 * the host backend's placed ranges).
 *
 * A plain sorted array shifts every entry after an insert or a removal: with a thousand segments
 * that is kilobytes moved per new segment, most of a replay step that makes one (perf: memmove
 * was a sixth of `sympool replay`'s event loop on traces that grow segments). The addresses that
 * come next are mostly beside the last ones (in the recorded PyTorch runs measured, successive new
 * segments sort at about the same place, below most of those held: the sorted array shifted nine
 * tenths of itself per insert), so the free room is kept where the last change was, as one run
 * inside the array (a gap buffer): a change there moves nothing, a change k entries away moves k
 * entries (the plain array moved every entry after the change). Lookups search the two runs on
 * either side of the gap, each a contiguous sorted run, so they cost what the plain array's did
 * plus one compare.
 *
 * Layout: cap entries at e; logical entries [0, gap) at e[0, gap), then cap - n free entries,
 * then logical [gap, n) at e[gap + cap - n, cap). Keys are ascending in logical order (equal keys
 * are the caller's business: the indexes here keep them unique). Not thread-safe: the owner's
 * lock guards it. C and C++ (the unit tests include it).
 */
#ifndef SP_CORE_GAP_ARRAY_H
#define SP_CORE_GAP_ARRAY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct sp_gap_ent {
    uint64_t key;
    uint64_t val;
} sp_gap_ent_t;

typedef struct sp_gap_array {
    sp_gap_ent_t *e; /* cap entries, NULL until the first insert */
    uint32_t n;      /* entries */
    uint32_t cap;    /* room at e */
    uint32_t gap;    /* the logical index the free room sits before (0..n) */
    /* Entries whose val is 0 (an owner's tombstones), as the owner counts them; 0 after
     * sp__gap_drop_zero_vals. Here rather than beside the array in the owner's struct: this
     * struct's padding would take the word anyway (a device allocator's struct keeps its size,
     * which every &sp__g.devs[i] multiplies by). */
    uint32_t zeros;
} sp_gap_array_t;

/* Logical entry i (i < n). */
static inline sp_gap_ent_t *sp__gap_at(const sp_gap_array_t *a, uint32_t i) {
    return &a->e[i < a->gap ? i : i + (a->cap - a->n)];
}

/* In the sorted run r[0, n): the first index whose key is > k. Branch-free: the range halves by
 * a conditional move (a compare guessed wrong at about every level costs more than the walk). */
static inline uint32_t sp__gap_run_upper(const sp_gap_ent_t *r, uint32_t n, uint64_t k) {
    if (n == 0)
        return 0;
    const sp_gap_ent_t *b = r; /* the answer is in [b, b + n] */
    while (n > 1) {
        uint32_t half = n / 2;
        b = b[half].key <= k ? b + half : b;
        n -= half;
    }
    return (uint32_t)(b - r) + (b->key <= k);
}

/* The first logical index whose key is > k (n when none). */
static inline uint32_t sp__gap_upper(const sp_gap_array_t *a, uint64_t k) {
    if (a->gap > 0 && a->e[a->gap - 1].key > k)
        return sp__gap_run_upper(a->e, a->gap, k);
    /* No run after the gap (always so while e is NULL: C has no NULL + 0, clang's UBSan says). */
    if (a->gap == a->n)
        return a->gap;
    return a->gap + sp__gap_run_upper(a->e + a->gap + (a->cap - a->n), a->n - a->gap, k);
}

/* The first logical index whose key is >= k (n when none). */
static inline uint32_t sp__gap_lower(const sp_gap_array_t *a, uint64_t k) {
    return k == 0 ? 0 : sp__gap_upper(a, k - 1);
}

/* Put the free room before logical index i (i <= n): the entries between its old place and the
 * new one move across it, nothing else. */
static inline void sp__gap_move(sp_gap_array_t *a, uint32_t i) {
    uint32_t room = a->cap - a->n;
    if (room > 0 && i < a->gap)
        memmove(&a->e[i + room], &a->e[i], (size_t)(a->gap - i) * sizeof(a->e[0]));
    else if (room > 0 && i > a->gap)
        memmove(&a->e[a->gap], &a->e[a->gap + room], (size_t)(i - a->gap) * sizeof(a->e[0]));
    a->gap = i;
}

/* Room for one more entry: the array doubles (64 entries at first), the entries after the gap
 * moved to the new end. false: out of host memory (or of 32-bit counts); nothing changed. */
static inline bool sp__gap_reserve(sp_gap_array_t *a) {
    if (a->n < a->cap)
        return true;
    if (a->cap > UINT32_MAX / 2)
        return false;
    uint32_t cap = a->cap ? a->cap * 2 : 64;
    sp_gap_ent_t *e = (sp_gap_ent_t *)realloc(a->e, (size_t)cap * sizeof(*e));
    if (!e)
        return false;
    /* The array was full (no room): the entries after the gap are e[gap, n). */
    memmove(&e[cap - (a->n - a->gap)], &e[a->gap], (size_t)(a->n - a->gap) * sizeof(*e));
    a->e = e;
    a->cap = cap;
    return true;
}

/* Insert {key, val} as logical entry i (the caller keeps the order: i from sp__gap_lower or
 * sp__gap_upper of key). false: out of host memory; nothing changed. */
static inline bool sp__gap_insert(sp_gap_array_t *a, uint32_t i, uint64_t key, uint64_t val) {
    if (!sp__gap_reserve(a))
        return false;
    sp__gap_move(a, i);
    a->e[i].key = key;
    a->e[i].val = val;
    a->gap = i + 1;
    a->n++;
    return true;
}

/* Remove the count logical entries from i on (i + count <= n). */
static inline void sp__gap_remove(sp_gap_array_t *a, uint32_t i, uint32_t count) {
    sp__gap_move(a, i + count);
    a->gap = i;
    a->n -= count;
}

/* Keep only the entries whose val is not 0, in order (one pass; the gap ends at the end). */
static inline void sp__gap_drop_zero_vals(sp_gap_array_t *a) {
    sp__gap_move(a, a->n);
    uint32_t k = 0;
    for (uint32_t i = 0; i < a->n; i++)
        if (a->e[i].val != 0)
            a->e[k++] = a->e[i];
    a->n = k;
    a->gap = k;
    a->zeros = 0;
}

static inline void sp__gap_free(sp_gap_array_t *a) {
    free(a->e);
    memset(a, 0, sizeof(*a));
}

#endif /* SP_CORE_GAP_ARRAY_H */
