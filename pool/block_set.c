/*
 * block_set.c: the free set of a block pool, an intrusive AVL tree of free blocks.
 *
 * Order: (stream, size, address) for ordinary pools, which makes lower_bound on (stream, size)
 * PyTorch's best fit: the smallest free block of the same stream that is large enough, the lowest
 * address among equals. Symmetric pools order ties by (segment seq, offset) instead, so that
 * every rank holding the same cache picks the same block whatever its virtual addresses.
 * Keys are unique (no two blocks share an address). Insert, remove and lower_bound are O(log n)
 * and allocate nothing. The caller holds the device allocator lock.
 *
 * The cache-hit path avoids a remove + insert pair where it can: a split remainder or a merged
 * block whose key still sorts strictly between the old node's in-order neighbours takes that
 * node's place in the tree (same links, same height), which keeps both the order and the AVL
 * balance. sp__bset_find_fit and sp__bset_locate (inline in block_set.h, for the hot path)
 * report the link and the neighbour to check.
 */
#include <assert.h>

#include "pool/block_set.h"

static int height(const sp_block_t *b) {
    return b ? b->height : 0;
}

static void fix_height(sp_block_t *b) {
    int hl = height(b->left), hr = height(b->right);
    b->height = (int8_t)((hl > hr ? hl : hr) + 1);
}

static sp_block_t *rot_right(sp_block_t *y) {
    sp_block_t *x = y->left;
    y->left = x->right;
    x->right = y;
    fix_height(y);
    fix_height(x);
    return x;
}

static sp_block_t *rot_left(sp_block_t *x) {
    sp_block_t *y = x->right;
    x->right = y->left;
    y->left = x;
    fix_height(x);
    fix_height(y);
    return y;
}

static sp_block_t *balance(sp_block_t *n) {
    fix_height(n);
    int bf = height(n->left) - height(n->right);
    if (bf > 1) {
        if (height(n->left->left) < height(n->left->right))
            n->left = rot_left(n->left);
        return rot_right(n);
    }
    if (bf < -1) {
        if (height(n->right->right) < height(n->right->left))
            n->right = rot_right(n->right);
        return rot_left(n);
    }
    return n;
}

static sp_block_t *insert(bool by_seq, sp_block_t *n, sp_block_t *b) {
    if (!n)
        return b;
    if (sp__bset_cmp(by_seq, b, n) < 0)
        n->left = insert(by_seq, n->left, b);
    else
        n->right = insert(by_seq, n->right, b);
    return balance(n);
}

/* Detach the minimum of subtree n into *min_p; returns the new subtree root. */
static sp_block_t *remove_min(sp_block_t *n, sp_block_t **min_p) {
    if (!n->left) {
        *min_p = n;
        return n->right;
    }
    n->left = remove_min(n->left, min_p);
    return balance(n);
}

static sp_block_t *remove_node(bool by_seq, sp_block_t *n, const sp_block_t *b) {
    if (!n)
        return NULL; /* not found: the caller's in_set flag makes this unreachable */
    int c = sp__bset_cmp(by_seq, b, n);
    if (c < 0) {
        n->left = remove_node(by_seq, n->left, b);
    } else if (c > 0) {
        n->right = remove_node(by_seq, n->right, b);
    } else {
        sp_block_t *l = n->left, *r = n->right;
        if (!r)
            return l;
        sp_block_t *m = NULL;
        r = remove_min(r, &m);
        m->left = l;
        m->right = r;
        return balance(m);
    }
    return balance(n);
}

void sp__bset_insert(sp_block_set_t *set, sp_block_t *b) {
    b->left = b->right = NULL;
    b->height = 1;
    b->in_set = true;
    set->root = insert(set->by_seq, set->root, b);
    set->count++;
}

void sp__bset_remove(sp_block_set_t *set, sp_block_t *b) {
    if (!b->in_set)
        return;
    set->root = remove_node(set->by_seq, set->root, b);
    b->in_set = false;
    b->left = b->right = NULL;
    set->count--;
}

sp_block_t *sp__bset_lower_bound(const sp_block_set_t *set, sp_stream_t stream, size_t size) {
    uintptr_t s = (uintptr_t)stream;
    sp_block_t *n = set->root, *best = NULL;
    while (n) {
        uintptr_t ns = (uintptr_t)n->stream;
        bool less = ns < s || (ns == s && n->size < size);
        if (less) {
            n = n->right;
        } else {
            best = n;
            n = n->left;
        }
    }
    return best;
}

#ifndef NDEBUG
/* Walk subtree n: in-order keys strictly increasing after *last, AVL heights right and balanced,
 * every node marked in_set. Returns the subtree height; counts nodes into *count. */
static int check(bool by_seq, const sp_block_t *n, const sp_block_t **last, size_t *count) {
    if (!n)
        return 0;
    int hl = check(by_seq, n->left, last, count);
    assert(n->in_set);
    assert(!*last || sp__bset_cmp(by_seq, *last, n) < 0);
    *last = n;
    (*count)++;
    int hr = check(by_seq, n->right, last, count);
    assert(hl - hr <= 1 && hr - hl <= 1);
    assert(n->height == (hl > hr ? hl : hr) + 1);
    return n->height;
}

void sp__bset_check(const sp_block_set_t *set) {
    if (set->count > 1024)
        return; /* debug builds only, and O(n): keep big caches usable */
    const sp_block_t *last = NULL;
    size_t count = 0;
    (void)check(set->by_seq, set->root, &last, &count);
    assert(count == set->count);
}
#endif
