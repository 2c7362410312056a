/*
 * block_set.h: private to pool/: the free set of a block pool, an AVL tree (block_set.c holds
 * insert, remove and the debug check; the lookups on the malloc and free paths are inline).
 */
#ifndef SP_POOL_BLOCK_SET_H
#define SP_POOL_BLOCK_SET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "pool/block.h"

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

#endif /* SP_POOL_BLOCK_SET_H */
