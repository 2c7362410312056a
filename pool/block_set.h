/*
 * block_set.h: private to pool/: the free set of a block pool, an AVL tree with parent links
 * (block_set.c holds insert, remove and the debug check; the lookups and neighbour steps on the
 * malloc and free paths are inline).
 */
#ifndef SP_POOL_BLOCK_SET_H
#define SP_POOL_BLOCK_SET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "pool/block.h"

/* The free set: an AVL tree ordered by (stream, size, address), or for symmetric pools by
 * (stream, size, segment seq, offset) so that best fit is rank-independent.
 *
 * Two cached positions keep the common case off the root path: `min`, the first block (so the
 * predecessor of the first block is known without walking up the left spine), and `hint`, the
 * block the last lookup or insert ended on. A caching allocator's traffic is mostly the same
 * sizes again: the block just freed is the next best fit, the block after the one just taken
 * is the next candidate. Both are only starting points: a lookup checks the hint against its
 * in-order predecessor before trusting it, so every answer is the one the root walk gives. */
typedef struct sp_block_set {
    sp_block_t *root; /* (lock) */
    sp_block_t *min;  /* the first block in order, NULL when empty (lock) */
    sp_block_t *hint; /* a block in the set, or NULL (lock) */
    uint32_t count;   /* blocks in the set (at most the struct arena's 76 million) (lock) */
    uint32_t lead;    /* blocks in the set with min's stream, or 0: not known (lock) */
    bool by_seq;      /* symmetric ordering (const) */
} sp_block_set_t;

/* A set whose blocks all have one stream (nearly every pool: one stream does the work) orders
 * them by (size, address), or (size, seq, offset), alone. Walks that know it compare without
 * reading each node's segment for its stream: one dependent load a level fewer, on the path
 * whose mispredicted branches wait for it. `lead` counts the blocks of the first block's stream
 * (the smallest in the set) while that is known: from the insert into an empty set, or of a
 * block of a smaller stream than all, until the last block of that stream leaves a set that
 * still holds others (then 0 until one of those two happens again). The two counts fit the
 * word `count` had alone, which keeps a MemPool's struct, and so the heap of a replay, the
 * size it was. */
static inline bool sp__bset_one_stream(const sp_block_set_t *set, uintptr_t stream) {
    return set->lead == set->count && set->min && (uintptr_t)sp__block_stream(set->min) == stream;
}

void sp__bset_insert(sp_block_set_t *set, sp_block_t *b);
void sp__bset_remove(sp_block_set_t *set, sp_block_t *b);
/* b (in the set) had its key changed in place (the same stream, another size or address) and no
 * longer sorts between its neighbours: put it where it sorts now. The set ends as a removal and
 * an insert of b leave it (b the hint), without their bookkeeping (the counts stay: b keeps its
 * stream) and without the insert's look beside the hint (a moved key has left it). */
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
    /* Within a segment, offset order equals address order. */
    if (a->addr != b->addr)
        return a->addr < b->addr ? -1 : 1;
    return 0;
}

/* sp__bset_less: a < b in the set's order. */
static inline bool sp__bset_less(const sp_block_set_t *set, const sp_block_t *a,
                                 const sp_block_t *b) {
    return sp__bset_cmp(set->by_seq, a, b) < 0;
}

/* b's in-order neighbours in the set (b in the set), NULL at either end. Expected O(1): most
 * nodes sit near the leaves, and the first block, whose predecessor would need the whole left
 * spine, is known. */
static inline sp_block_t *sp__bset_pred(const sp_block_set_t *set, const sp_block_t *b) {
    if (b == set->min)
        return NULL;
    if (b->left) {
        sp_block_t *n = sp__blk(b->left);
        while (n->right)
            n = sp__blk(n->right);
        return n;
    }
    sp_ref_t up = b->parent;
    if (!up)
        return NULL;
    sp_ref_t r = sp__bref(b);
    for (;;) {
        sp_block_t *p = sp__blk(up);
        if (p->left != r)
            return p;
        r = up;
        up = p->parent;
        if (!up)
            return NULL;
    }
}

static inline sp_block_t *sp__bset_succ(const sp_block_set_t *set, const sp_block_t *b) {
    (void)set;
    if (b->right) {
        sp_block_t *n = sp__blk(b->right);
        while (n->left)
            n = sp__blk(n->left);
        return n;
    }
    /* Up while b is its parent's right child; b's ref only once there is a parent. */
    sp_ref_t up = b->parent;
    if (!up)
        return NULL;
    sp_ref_t r = sp__bref(b);
    for (;;) {
        sp_block_t *p = sp__blk(up);
        if (p->right != r)
            return p;
        r = up;
        up = p->parent;
        if (!up)
            return NULL;
    }
}

/* Is block n's key below the query (stream, size, -inf)? */
static inline bool sp__bset_below(const sp_block_t *n, uintptr_t s, size_t size) {
    uintptr_t ns = (uintptr_t)sp__block_stream(n);
    return ns < s || (ns == s && n->size < size);
}

/* lower_bound (stream, size) for the malloc path, with the result's in-order predecessor in
 * *pred_p (NULL if none), which the split checks its remainder against. The hint answers when it is
 * at least the query and its predecessor is below it; otherwise the root walk does, and becomes the
 * hint. */
static inline __attribute__((always_inline)) sp_block_t *
sp__bset_find_fit(sp_block_set_t *set, sp_stream_t stream, size_t size, sp_block_t **pred_p) {
    uintptr_t s = (uintptr_t)stream;
    sp_block_t *h = set->hint;
    if (SP_LIKELY(h) && !sp__bset_below(h, s, size)) {
        sp_block_t *p = sp__bset_pred(set, h);
        if (!p || sp__bset_below(p, s, size)) {
            *pred_p = p;
            return h;
        }
    }
    sp_block_t *best = NULL, *pred = NULL;
    if (sp__bset_one_stream(set, s)) {
        /* Every block has the query's stream: below it means smaller (the same walk). */
        for (sp_block_t *n = set->root; n;) {
            if (n->size < size) {
                pred = n;
                n = sp__blk0(n->right);
            } else {
                best = n;
                n = sp__blk0(n->left);
            }
        }
    } else {
        for (sp_block_t *n = set->root; n;) {
            if (sp__bset_below(n, s, size)) {
                pred = n; /* the last node we pass on the right is the largest key below */
                n = sp__blk0(n->right);
            } else {
                best = n;
                n = sp__blk0(n->left);
            }
        }
    }
    if (best)
        set->hint = best;
    *pred_p = pred;
    return best;
}

/* Debug builds: assert the set's order, parent links, AVL balance, count, min and hint (the
 * allocator's in-place key changes rely on its neighbour checks). Release builds: nothing. */
#ifndef NDEBUG
void sp__bset_check(const sp_block_set_t *set);
#else
static inline void sp__bset_check(const sp_block_set_t *set) {
    (void)set;
}
#endif

#endif /* SP_POOL_BLOCK_SET_H */
