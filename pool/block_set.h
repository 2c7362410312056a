/*
 * block_set.h: private to pool/: the free set of a block pool. PROTOTYPE (s26-bset, a measured
 * attempt, not main's design): one sorted array of packed keys instead of main's AVL tree, so
 * that a lookup is a branch-free binary search (a conditional move a step, no mispredicted
 * turn) and an insert or removal is that search and a memmove, with no rebalancing. It is the
 * limit of the wide-node idea (a B+-tree whose one node holds every key): if it does not beat
 * the tree on the replay loop, no shallower wide-node tree will on these traces.
 */
#ifndef SP_POOL_BLOCK_SET_H
#define SP_POOL_BLOCK_SET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "pool/block.h"

/* A key: (stream, size, tie), where `tie` is the address, or for symmetric sets (segment seq
 * << 40 | offset), which sorts as main's (seq, offset) while segments stay under 1 TiB
 * (block_set.c asserts it). An entry: a block's key, copied (a search reads no block), and the
 * block. */
typedef struct sp_bset_key {
    uintptr_t stream;
    uint64_t size;
    uint64_t tie;
} sp_bset_key_t;

typedef struct sp_bset_ent {
    sp_bset_key_t k;
    sp_block_t *b;
} sp_bset_ent_t;

/* A leaf: up to SP_BSET_LEAF entries in order. */
#define SP_BSET_LEAF 16
typedef struct sp_bset_leaf {
    uint32_t n;
    sp_bset_ent_t e[SP_BSET_LEAF];
} sp_bset_leaf_t;

/* The free set: a B+-tree of height two. `leaf` holds the leaves in order, `sep` the first key
 * of each (so `sep` is sorted): a lookup is a branch-free rank in `sep` and one in a leaf, each
 * step a conditional move (no mispredicted turn), and an insert or removal moves at most a
 * leaf's entries (the top arrays move only when a leaf splits or empties). `min` is the first
 * block (NULL when empty); (pj, pi) the place of the block the last lookup found or changed (a
 * guess, checked before use). The arrays are malloc'd and freed whenever the set empties. */
typedef struct sp_block_set {
    sp_bset_leaf_t **leaf; /* (lock) */
    sp_bset_key_t *sep;    /* (lock) */
    sp_block_t *min;       /* (lock) */
    uint32_t nleaf;        /* (lock) */
    uint32_t cap;          /* of leaf and sep (lock) */
    uint32_t count;        /* blocks in the set (lock) */
    uint32_t pj, pi;       /* (lock) */
    bool by_seq;           /* symmetric ordering (const) */
} sp_block_set_t;

void sp__bset_insert(sp_block_set_t *set, sp_block_t *b);
void sp__bset_remove(sp_block_set_t *set, sp_block_t *b);
/* b (in the set) had its key changed in place: put it where it sorts now. */
void sp__bset_move(sp_block_set_t *set, sp_block_t *b);
/* The smallest block with key >= (stream, size, -inf), or NULL. */
sp_block_t *sp__bset_lower_bound(const sp_block_set_t *set, sp_stream_t stream, size_t size);

/* The set's order: <0, 0, >0. Within a segment, offset order equals address order. */
static inline int sp__bset_cmp(bool by_seq, const sp_block_t *a, const sp_block_t *b) {
    uintptr_t sa = (uintptr_t)sp__block_stream(a), sb = (uintptr_t)sp__block_stream(b);
    if (sa != sb)
        return sa < sb ? -1 : 1;
    if (a->size != b->size)
        return a->size < b->size ? -1 : 1;
    if (by_seq && sp__bseg(a)->seq != sp__bseg(b)->seq)
        return sp__bseg(a)->seq < sp__bseg(b)->seq ? -1 : 1;
    if (a->addr != b->addr)
        return a->addr < b->addr ? -1 : 1;
    return 0;
}

static inline bool sp__bset_less(const sp_block_set_t *set, const sp_block_t *a,
                                 const sp_block_t *b) {
    return sp__bset_cmp(set->by_seq, a, b) < 0;
}

/* The tie-break word of a block's key at address addr. */
static inline uint64_t sp__bset_tie(const sp_block_set_t *set, const sp_block_t *b,
                                    uintptr_t addr) {
    if (SP_UNLIKELY(set->by_seq)) {
        const sp_segment_t *g = sp__bseg(b);
        return g->seq << 40 | (uint64_t)(addr - g->base);
    }
    return addr;
}

/* Is key e below q? Without a branch: a search's turns are a coin toss. */
static inline bool sp__bset_key_below(const sp_bset_key_t *e, const sp_bset_key_t *q) {
#ifdef __SIZEOF_INT128__
    unsigned __int128 a = (unsigned __int128)e->size << 64 | e->tie;
    unsigned __int128 c = (unsigned __int128)q->size << 64 | q->tie;
    return (e->stream < q->stream) | ((e->stream == q->stream) & (a < c));
#else
    return (e->stream < q->stream) |
           ((e->stream == q->stream) &
            ((e->size < q->size) | ((e->size == q->size) & (e->tie < q->tie))));
#endif
}

/* The number of keys below q among n keys `stride` bytes apart from `base`: a binary search
 * whose step is a conditional move (its loop count depends on n alone, so that branch
 * predicts). */
static inline __attribute__((always_inline)) uint32_t
sp__bset_rank(const void *base, uint32_t n, size_t stride, const sp_bset_key_t *q) {
    if (!n)
        return 0;
    uintptr_t at = (uintptr_t)base;
    while (n > 1) {
        uint32_t half = n / 2;
        bool below = sp__bset_key_below((const sp_bset_key_t *)(at + (half - 1) * stride), q);
        at += ((uintptr_t)0 - (uintptr_t)below) & ((uintptr_t)half * stride);
        n -= half;
    }
    return (uint32_t)((at - (uintptr_t)base) / stride) +
           (uint32_t)sp__bset_key_below((const sp_bset_key_t *)at, q);
}

/* The place of the lower bound of q: leaf *j_p, index in it (== its n only in the last leaf:
 * past the end). The set is not empty. */
static inline __attribute__((always_inline)) uint32_t
sp__bset_place(const sp_block_set_t *set, const sp_bset_key_t *q, uint32_t *j_p) {
    uint32_t r = sp__bset_rank(set->sep, set->nleaf, sizeof(sp_bset_key_t), q);
    uint32_t j = r ? r - 1 : 0; /* the last leaf whose first key is below q, or the first */
    const sp_bset_leaf_t *l = set->leaf[j];
    uint32_t i = sp__bset_rank(l->e, l->n, sizeof(sp_bset_ent_t), q);
    if (i == l->n && j + 1 < set->nleaf) {
        j++;
        i = 0;
    }
    *j_p = j;
    return i;
}

/* b's place (b in the set, its entry's key b's own). */
void sp__bset_locate_slow(sp_block_set_t *set, const sp_block_t *b);
static inline void sp__bset_locate(const sp_block_set_t *set, const sp_block_t *b) {
    uint32_t j = set->pj, i = set->pi;
    if (SP_LIKELY(j < set->nleaf && i < set->leaf[j]->n && set->leaf[j]->e[i].b == b))
        return;
    sp__bset_locate_slow((sp_block_set_t *)set, b);
}

/* b's neighbours in the set's order (b in the set), NULL at either end. */
static inline sp_block_t *sp__bset_pred(const sp_block_set_t *set, const sp_block_t *b) {
    sp__bset_locate(set, b);
    uint32_t j = set->pj, i = set->pi;
    if (i)
        return set->leaf[j]->e[i - 1].b;
    return j ? set->leaf[j - 1]->e[set->leaf[j - 1]->n - 1].b : NULL;
}

static inline sp_block_t *sp__bset_succ(const sp_block_set_t *set, const sp_block_t *b) {
    sp__bset_locate(set, b);
    uint32_t j = set->pj, i = set->pi;
    if (i + 1 < set->leaf[j]->n)
        return set->leaf[j]->e[i + 1].b;
    return j + 1 < set->nleaf ? set->leaf[j + 1]->e[0].b : NULL;
}

/* lower_bound (stream, size) for the malloc path, with the result's in-order predecessor in
 * *pred_p (NULL if none). The answer's place becomes (pj, pi): the split that follows rekeys
 * it there. */
static inline __attribute__((always_inline)) sp_block_t *
sp__bset_find_fit(sp_block_set_t *set, sp_stream_t stream, size_t size, sp_block_t **pred_p) {
    *pred_p = NULL;
    if (!set->count)
        return NULL;
    sp_bset_key_t q = {(uintptr_t)stream, size, 0};
    uint32_t j = set->pj, i = set->pi;
    /* The last place first (main's hint): the answer when its entry is at least q and the
     * entry before it below q; a caching allocator asks for the same sizes again. */
    if (SP_LIKELY(j < set->nleaf && i < set->leaf[j]->n)) {
        const sp_bset_ent_t *e = &set->leaf[j]->e[i];
        if (!sp__bset_key_below(&e->k, &q)) {
            const sp_bset_ent_t *p = i   ? e - 1
                                     : j ? &set->leaf[j - 1]->e[set->leaf[j - 1]->n - 1]
                                         : NULL;
            if (!p || sp__bset_key_below(&p->k, &q)) {
                *pred_p = p ? p->b : NULL;
                return e->b;
            }
        }
    }
    i = sp__bset_place(set, &q, &j);
    const sp_bset_leaf_t *l = set->leaf[j];
    if (i)
        *pred_p = l->e[i - 1].b;
    else if (j)
        *pred_p = set->leaf[j - 1]->e[set->leaf[j - 1]->n - 1].b;
    if (i == l->n)
        return NULL;
    set->pj = j;
    set->pi = i;
    return l->e[i].b;
}

/* b (in the set) had its key changed in place from (old_size, old_addr), the same stream and
 * segment: update its entry, and move it when it left its neighbours. The set holds copies of
 * the keys, so every in-place change is told here (main's tree needed no call while the order
 * held). The common case inline: b is the block the last lookup found (a split remainder) or
 * stepped from (a merge's kept block), inside its leaf, and still between its neighbours. */
void sp__bset_rekey_slow(sp_block_set_t *set, sp_block_t *b, size_t old_size, uintptr_t old_addr);
static inline void sp__bset_rekey(sp_block_set_t *set, sp_block_t *b, size_t old_size,
                                  uintptr_t old_addr) {
    uint32_t j = set->pj, i = set->pi, nl = set->nleaf;
    if (SP_LIKELY(!set->by_seq && j < nl && i < set->leaf[j]->n && set->leaf[j]->e[i].b == b)) {
        const sp_bset_leaf_t *l = set->leaf[j];
        sp_bset_ent_t *e = &set->leaf[j]->e[i];
        sp_bset_key_t q = {e->k.stream, b->size, b->addr};
        /* Its neighbours, in its leaf or the next one over. */
        const sp_bset_ent_t *p = i   ? e - 1
                                 : j ? &set->leaf[j - 1]->e[set->leaf[j - 1]->n - 1]
                                     : NULL;
        const sp_bset_ent_t *s = i + 1 < l->n ? e + 1 : j + 1 < nl ? &set->leaf[j + 1]->e[0] : NULL;
        if (SP_LIKELY((!p || sp__bset_key_below(&p->k, &q)) &&
                      (!s || sp__bset_key_below(&q, &s->k)))) {
            e->k = q;
            if (!i)
                set->sep[j] = q;
            return;
        }
    }
    sp__bset_rekey_slow(set, b, old_size, old_addr);
}

#ifndef NDEBUG
void sp__bset_check(const sp_block_set_t *set);
#else
static inline void sp__bset_check(const sp_block_set_t *set) {
    (void)set;
}
#endif

#endif /* SP_POOL_BLOCK_SET_H */
