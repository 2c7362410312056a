/*
 * block_set.c: the free set of a block pool, an intrusive AVL tree of free blocks with parent
 * links.
 *
 * Order: (stream, size, address) for ordinary pools, which makes lower_bound on (stream, size)
 * PyTorch's best fit: the smallest free block of the same stream that is large enough, the lowest
 * address among equals. Symmetric pools order ties by (segment seq, offset) instead, so that
 * every rank holding the same cache picks the same block whatever its virtual addresses.
 * Keys are unique (no two blocks share an address). The caller holds the device allocator lock.
 *
 * Insert and remove are iterative and allocate nothing. Parent links let a removal unlink its
 * block where it is (no search from the root) and let the rebalancing walk up only as far as
 * a subtree's height changes, which is O(1) amortized for the traffic a cache sees. An insert
 * next to the hint (block_set.h) starts there: the block sorts just below the hint and above
 * the hint's predecessor, or just above the hint and below its successor, so it is linked
 * beside them without a root walk; any other insert walks down from the root, O(log n).
 *
 * The cache-hit path avoids a remove + insert pair where it can: a split remainder keeps its
 * node with a smaller key, and a merged block keeps a free neighbour's node with a larger one,
 * when the new key still sorts strictly between the node's in-order neighbours (allocator.c
 * checks that); order and AVL balance are then unchanged.
 */
#include <assert.h>

#include "pool/block_set.h"

/* The tree's links are refs (block.h); the tree code reads and writes them as pointers. */
static inline sp_block_t *L(const sp_block_t *b) {
    return sp__blk0(b->left);
}

static inline sp_block_t *R(const sp_block_t *b) {
    return sp__blk0(b->right);
}

static inline sp_block_t *P(const sp_block_t *b) {
    return sp__blk0(b->parent);
}

static inline void set_left(sp_block_t *b, const sp_block_t *c) {
    b->left = sp__bref0(c);
}

static inline void set_right(sp_block_t *b, const sp_block_t *c) {
    b->right = sp__bref0(c);
}

static inline void set_parent(sp_block_t *b, const sp_block_t *p) {
    b->parent = sp__bref0(p);
}

static int height(const sp_block_t *b) {
    return b ? b->height : 0;
}

static void fix_height(sp_block_t *b) {
    int hl = height(L(b)), hr = height(R(b));
    b->height = (int8_t)((hl > hr ? hl : hr) + 1);
}

/* Make nb (may be NULL) the child of p that old was, or the root when p is NULL. */
static void relink(sp_block_set_t *set, sp_block_t *p, const sp_block_t *old, sp_block_t *nb) {
    if (!p)
        set->root = nb;
    else if (p->left == sp__bref(old))
        set_left(p, nb);
    else
        set_right(p, nb);
    if (nb)
        set_parent(nb, p);
}

static sp_block_t *rot_right(sp_block_set_t *set, sp_block_t *y) {
    sp_block_t *x = L(y);
    sp_block_t *p = P(y);
    y->left = x->right;
    if (y->left)
        set_parent(sp__blk(y->left), y);
    set_right(x, y);
    set_parent(y, x);
    relink(set, p, y, x);
    fix_height(y);
    fix_height(x);
    return x;
}

static sp_block_t *rot_left(sp_block_set_t *set, sp_block_t *x) {
    sp_block_t *y = R(x);
    sp_block_t *p = P(x);
    x->right = y->left;
    if (x->right)
        set_parent(sp__blk(x->right), x);
    set_left(y, x);
    set_parent(x, y);
    relink(set, p, x, y);
    fix_height(x);
    fix_height(y);
    return y;
}

/* Rebalance from n up to the root, stopping where a subtree keeps the height it had: nothing
 * above it can have changed. n's own stored height is still its height before the change. */
static void retrace(sp_block_set_t *set, sp_block_t *n) {
    while (n) {
        int before = n->height;
        /* Each child's height read once: the balanced case (nearly every step) sets n's height
         * from them, or stops without a store when it keeps the height it had. */
        int hl = height(L(n)), hr = height(R(n)), bf = hl - hr;
        if (bf >= -1 && bf <= 1) {
            int h = (hl > hr ? hl : hr) + 1;
            if (h == before)
                return;
            n->height = (int8_t)h;
            n = P(n);
            continue;
        }
        if (bf > 1) {
            if (height(L(L(n))) < height(R(L(n))))
                (void)rot_left(set, L(n));
            n = rot_right(set, n);
        } else if (bf < -1) {
            if (height(R(R(n))) < height(L(R(n))))
                (void)rot_right(set, R(n));
            n = rot_left(set, n);
        }
        if (n->height == before)
            return;
        n = P(n);
    }
}

void sp__bset_insert(sp_block_set_t *set, sp_block_t *b) {
    b->left = b->right = 0;
    b->height = 1;
    b->in_set = true;
    set->count++;
    sp_block_t *parent = NULL;
    bool left = false;
    sp_block_t *h = set->hint;
    if (h && sp__bset_less(set, b, h)) {
        /* Between the hint's predecessor and the hint: the hint's left link is free when the
         * predecessor is an ancestor, else the predecessor (rightmost below the hint's left
         * child) has a free right link. */
        sp_block_t *p = sp__bset_pred(set, h);
        if (!p || sp__bset_less(set, p, b)) {
            if (!h->left) {
                parent = h;
                left = true;
            } else {
                parent = p;
            }
        }
    } else if (h) {
        /* Between the hint and its successor, the mirror case: frees of equal-sized blocks in
         * rising address order (a layer's tensors freed in the order they were made) each sort
         * just above the block inserted before, which is the hint. The hint's right link is
         * free when the successor is an ancestor, else the successor (leftmost below the hint's
         * right child) has a free left link. Either way it is the leaf the root walk reaches:
         * a new key has one place among the leaves. */
        sp_block_t *sc = sp__bset_succ(set, h);
        if (!sc || sp__bset_less(set, b, sc)) {
            if (!h->right) {
                parent = h;
            } else {
                parent = sc;
                left = true;
            }
        }
    }
    if (!parent) {
        sp_block_t *n = set->root;
        if (!n) {
            b->parent = 0;
            set->root = set->min = set->hint = b;
            return;
        }
        for (;;) {
            left = sp__bset_less(set, b, n);
            sp_block_t *next = left ? L(n) : R(n);
            if (!next)
                break;
            n = next;
        }
        parent = n;
    }
    set_parent(b, parent);
    if (left) {
        set_left(parent, b);
        if (parent == set->min)
            set->min = b;
    } else {
        set_right(parent, b);
    }
    set->hint = b;
    retrace(set, parent);
}

void sp__bset_remove(sp_block_set_t *set, sp_block_t *b) {
    if (!b->in_set)
        return;
    if (set->hint == b || set->min == b) {
        /* The block after b is the next candidate for the query that found b. */
        sp_block_t *s = sp__bset_succ(set, b);
        if (set->hint == b)
            set->hint = s;
        if (set->min == b)
            set->min = s;
    }
    sp_block_t *l = L(b), *r = R(b), *p = P(b), *start;
    if (!l || !r) {
        relink(set, p, b, l ? l : r);
        start = p;
    } else {
        /* Two children: b's successor m (leftmost of r) takes b's place. */
        sp_block_t *m = r;
        while (m->left)
            m = sp__blk(m->left);
        if (m == r) {
            start = m;
        } else {
            start = P(m);
            start->left = m->right;
            if (m->right)
                set_parent(sp__blk(m->right), start);
            set_right(m, r);
            set_parent(r, m);
        }
        set_left(m, l);
        set_parent(l, m);
        m->height = b->height; /* the height of the subtree at b's place before the removal */
        relink(set, p, b, m);
    }
    retrace(set, start);
    b->in_set = false;
    b->left = b->right = b->parent = 0;
    set->count--;
}

sp_block_t *sp__bset_lower_bound(const sp_block_set_t *set, sp_stream_t stream, size_t size) {
    uintptr_t s = (uintptr_t)stream;
    sp_block_t *n = set->root, *best = NULL;
    while (n) {
        if (sp__bset_below(n, s, size)) {
            n = R(n);
        } else {
            best = n;
            n = L(n);
        }
    }
    return best;
}

#ifndef NDEBUG
/* Walk subtree n: in-order keys strictly increasing after *last, parent links and AVL heights
 * right and balanced, every node marked in_set; *hint_seen when the hint is among them. Returns
 * the subtree height; counts nodes into *count. */
static int check(const sp_block_set_t *set, const sp_block_t *n, const sp_block_t *parent,
                 const sp_block_t **last, size_t *count, bool *hint_seen) {
    if (!n)
        return 0;
    assert(n->parent == sp__bref0(parent));
    int hl = check(set, L(n), n, last, count, hint_seen);
    assert(n->in_set);
    assert(!*last || sp__bset_cmp(set->by_seq, *last, n) < 0);
    if (!*last)
        assert(set->min == n);
    *last = n;
    (*count)++;
    if (n == set->hint)
        *hint_seen = true;
    int hr = check(set, R(n), n, last, count, hint_seen);
    assert(hl - hr <= 1 && hr - hl <= 1);
    assert(n->height == (hl > hr ? hl : hr) + 1);
    return n->height;
}

void sp__bset_check(const sp_block_set_t *set) {
    if (set->count > 1024)
        return; /* debug builds only, and O(n): keep big caches usable */
    const sp_block_t *last = NULL;
    size_t count = 0;
    bool hint_seen = false;
    (void)check(set, set->root, NULL, &last, &count, &hint_seen);
    assert(count == set->count);
    assert(set->root || !set->min);
    assert(!set->hint || hint_seen);
}
#endif
