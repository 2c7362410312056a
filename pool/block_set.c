/*
 * block_set.c: the free set of a block pool, intrusive AVL trees of free blocks with parent
 * links: one per size class (a one-stream pool set's form, block_set.h) or one for the set.
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
 * beside them without a root walk; any other insert walks down from the root, O(log n). With
 * classes every step is the same within the block's class's tree (the hint is used only when it
 * is of that class), and an emptied or new tree flips its class's bit.
 *
 * The set counts the blocks of its first block's stream (`lead`, block_set.h): while that is all
 * of them and a walk's key has that stream, the walk orders by size and address alone, without
 * each node's segment read for its stream.
 *
 * The cache-hit path avoids a remove + insert pair where it can: a split remainder keeps its
 * node with a smaller key, and a merged block keeps a free neighbour's node with a larger one,
 * when the new key still sorts strictly between the node's in-order neighbours and keeps its
 * size class (allocator.c checks both: sp__bset_same_class); order and AVL balance are then
 * unchanged. When it does not, sp__bset_move
 * unlinks the node and links it where it sorts: the tree a removal and an insert would leave,
 * without their counting (the block keeps its stream) or the insert's look beside the hint.
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

/* A node's balance: the height of its right subtree less that of its left, -1, 0 or +1 between
 * changes (block.h's `bal`). Keeping the balance rather than the height lets the rebalancing
 * walk read only the nodes on its path: with heights, every step read the sibling's too, a
 * node off the path and often out of cache. */
#define BAL(b) ((b)->bal)

/* Make nb (may be NULL) the child of p that old was, or the root when p is NULL. */
static void relink(sp_ref_t *root, sp_block_t *p, const sp_block_t *old, sp_block_t *nb) {
    if (!p)
        *root = sp__bref0(nb);
    else if (p->left == sp__bref(old))
        set_left(p, nb);
    else
        set_right(p, nb);
    if (nb)
        set_parent(nb, p);
}

/* Rotations only relink (x: y's left child, or its right one); the callers set the balances,
 * which the cases they come from decide. */
static void rot_right(sp_ref_t *set, sp_block_t *y, sp_block_t *x) {
    sp_block_t *p = P(y);
    y->left = x->right;
    if (y->left)
        set_parent(sp__blk(y->left), y);
    set_right(x, y);
    set_parent(y, x);
    relink(set, p, y, x);
}

static void rot_left(sp_ref_t *set, sp_block_t *x, sp_block_t *y) {
    sp_block_t *p = P(x);
    x->right = y->left;
    if (x->right)
        set_parent(sp__blk(x->right), x);
    set_left(y, x);
    set_parent(x, y);
    relink(set, p, x, y);
}

/* n leans two to the left (its left child x's subtree is two taller): rotate x, or x's right
 * child, up into n's place. Returns the subtree's new root and in *same_p whether the subtree
 * kept the height it had before the change that unbalanced it (a single rotation about a
 * balanced x, which only a removal can meet). */
static sp_block_t *fix_left(sp_ref_t *set, sp_block_t *n, bool *same_p) {
    sp_block_t *x = L(n);
    if (BAL(x) <= 0) {
        rot_right(set, n, x);
        *same_p = BAL(x) == 0;
        BAL(n) = (int8_t)(BAL(x) == 0 ? -1 : 0);
        BAL(x) = (int8_t)(BAL(x) == 0 ? 1 : 0);
        return x;
    }
    sp_block_t *y = R(x);
    rot_left(set, x, y);
    rot_right(set, n, y);
    BAL(n) = (int8_t)(BAL(y) < 0 ? 1 : 0);
    BAL(x) = (int8_t)(BAL(y) > 0 ? -1 : 0);
    BAL(y) = 0;
    *same_p = false;
    return y;
}

/* The mirror of fix_left: n leans two to the right. */
static sp_block_t *fix_right(sp_ref_t *set, sp_block_t *n, bool *same_p) {
    sp_block_t *x = R(n);
    if (BAL(x) >= 0) {
        rot_left(set, n, x);
        *same_p = BAL(x) == 0;
        BAL(n) = (int8_t)(BAL(x) == 0 ? 1 : 0);
        BAL(x) = (int8_t)(BAL(x) == 0 ? -1 : 0);
        return x;
    }
    sp_block_t *y = L(x);
    rot_right(set, x, y);
    rot_left(set, n, y);
    BAL(n) = (int8_t)(BAL(y) > 0 ? -1 : 0);
    BAL(x) = (int8_t)(BAL(y) < 0 ? 1 : 0);
    BAL(y) = 0;
    *same_p = false;
    return y;
}

/* After an insert: n's subtree on the `left` side grew by one. Walks up while a subtree grows;
 * one rotation ends it (an insert's rotation restores the height the subtree had). */
static void grew(sp_ref_t *set, sp_block_t *n, bool left) {
    for (;;) {
        int bal = BAL(n) + (left ? -1 : 1);
        if (bal == 0) {
            BAL(n) = 0;
            return;
        }
        if (bal == -2 || bal == 2) {
            bool same;
            (void)(bal < 0 ? fix_left(set, n, &same) : fix_right(set, n, &same));
            return;
        }
        BAL(n) = (int8_t)bal;
        sp_block_t *p = P(n);
        if (!p)
            return;
        left = p->left == sp__bref(n);
        n = p;
    }
}

/* After a removal: n's subtree on the `left` side shrank by one. Walks up while a subtree
 * shrinks. */
static void shrank(sp_ref_t *set, sp_block_t *n, bool left) {
    for (;;) {
        int bal = BAL(n) + (left ? 1 : -1);
        if (bal == 1 || bal == -1) {
            BAL(n) = (int8_t)bal; /* it was balanced: its height stays */
            return;
        }
        if (bal == 0) {
            BAL(n) = 0;
        } else {
            bool same;
            n = bal < 0 ? fix_left(set, n, &same) : fix_right(set, n, &same);
            if (same)
                return;
        }
        sp_block_t *p = P(n);
        if (!p)
            return;
        left = p->left == sp__bref(n);
        n = p;
    }
}

/* a < b in the set's order, where `one` says that both have the set's one stream and the set is
 * ordered by address (not symmetric): then size and address alone decide. */
static inline bool less_in(const sp_block_set_t *set, bool one, const sp_block_t *a,
                           const sp_block_t *b) {
    /* Without a branch on the sizes (a walk's turns are a coin toss). */
#ifdef __SIZEOF_INT128__
    /* (size, address) as one 128-bit number: a compare and a subtract with borrow, where the
     * two compares and their combination took seven instructions a level of an insert's walk. */
    if (one)
        return ((unsigned __int128)a->size << 64 | a->addr) <
               ((unsigned __int128)b->size << 64 | b->addr);
#else
    if (one)
        return (a->size < b->size) | ((a->size == b->size) & (a->addr < b->addr));
#endif
    return sp__bset_less(set, a, b);
}

#include <stdlib.h>

#ifdef SP_BSET_ONE_TREE
void *sp__bset_one_tree_pad; /* the last table's stand-in: a calloc nothing keeps is dropped */
#endif

bool sp__bset_init_classes(sp_block_set_t *set) {
    set->min_classes = SP_BSET_MIN_CLASSES;
#ifdef SP_BSET_ONE_TREE
    /* scripts/replay_diff's reference build: no table (one tree in every form), but the same
     * heap use as far as the replay sees it (the table is never freed: that build only), so that
     * host stream handles, heap addresses that order the set's streams, order alike. */
    sp__bset_one_tree_pad = calloc(1, sizeof(*set->cls));
    return false;
#else
    set->cls = calloc(1, sizeof(*set->cls));
    return set->cls != NULL;
#endif
}

void sp__bset_free_classes(sp_block_set_t *set) {
    free(set->cls);
    set->cls = NULL;
    set->classes = false;
    set->moves = false;
}

/* The class whose tree holds a block of `size` (0: the one tree), and that tree's root. */
static inline unsigned class_of(const sp_block_set_t *set, size_t size) {
    return set->classes ? sp__bset_class(size) : 0;
}

static inline sp_ref_t *slot(sp_block_set_t *set, unsigned c) {
    return set->classes ? &set->cls->root[c] : &set->root;
}

static void link_node(sp_block_set_t *set, sp_block_t *b, bool one, bool probe);
static void to_one_tree(sp_block_set_t *set);
static void to_classes(sp_block_set_t *set);

/* A set with classes and one block (block_set.h: min and the hint, in no tree) gets a second:
 * the first goes into its class's tree (its links and balance are 0 already). */
static void unsingle(sp_block_set_t *set) {
    sp_block_t *m = set->min;
    unsigned c = sp__bset_class(m->size);
    set->cls->root[c] = sp__bref(m);
    sp__bset_mark(set->cls, c);
}

/* A set with classes is down to one block, alone in its class's tree: out of it. The class from
 * the bitmap, not the size: a merge may have grown the block before the removal that leaves it
 * alone (free_block). */
static void single(sp_block_set_t *set) {
    sp_block_t *m = set->min;
    unsigned c = (unsigned)sp__bset_next_class(set->cls, 0);
    assert(set->cls->root[c] == sp__bref(m) && !m->left && !m->right && !m->parent);
    set->cls->root[c] = 0;
    sp__bset_unmark(set->cls, c);
    BAL(m) = 0;
    set->hint = m;
}

void sp__bset_insert(sp_block_set_t *set, sp_block_t *b) {
    b->in_set = true;
    uintptr_t bs = (uintptr_t)sp__block_stream(b);
    uintptr_t ms = set->min ? (uintptr_t)sp__block_stream(set->min) : 0;
    if (!set->min) {
        /* An empty set picks its form again: classes unless symmetric or without a table (its
         * one block in no tree), one tree from the second block until min_classes (below). */
        set->classes = !set->by_seq && set->cls;
    } else if (set->classes && set->count == 1 && set->min_classes > 2) {
        set->classes = false; /* the one block is the one tree's root (its links are 0) */
        set->root = sp__bref(set->min);
    } else if (set->classes) {
        if (set->count == 1)
            unsingle(set);
        if (bs != ms)
            to_one_tree(set); /* a second stream: the classes' order is not the set's */
    }
    if (!set->min || bs < ms)
        set->lead = 1; /* b's stream is the smallest now, b its one block */
    else if (bs == ms && set->lead)
        set->lead++;
    set->count++;
    /* One stream, ordered by address, a table and min_classes blocks: the classes' form (the
     * blocks already in the one tree relinked, b then linked in its class's tree). */
    if (!set->classes && set->cls && !set->by_seq && set->lead == set->count &&
        set->count >= set->min_classes)
        to_classes(set);
    set->moves = set->classes && set->count > 1;
    if (set->classes && set->count == 1) {
        /* The one block of a set with classes is in no tree (block_set.h). */
        b->left = b->right = b->parent = 0;
        BAL(b) = 0;
        set->min = set->hint = b;
        return;
    }
    link_node(set, b, !set->by_seq && set->lead == set->count, true);
}

/* Link b (in no tree, in_set set, counted) where its key sorts, and make it the hint. `one`: b's
 * stream is every block's (less_in). `probe`: try the places beside the hint before the root
 * walk (with classes: a hint of b's class). */
static void link_node(sp_block_set_t *set, sp_block_t *b, bool one, bool probe) {
    b->left = b->right = 0;
    BAL(b) = 0;
    sp_block_t *parent = NULL;
    bool left = false;
    unsigned c = class_of(set, b->size);
    sp_ref_t *root = slot(set, c);
    sp_block_t *h = probe ? set->hint : NULL;
    if (h && set->classes && sp__bset_class(h->size) != c)
        h = NULL;
    if (h && less_in(set, one, b, h)) {
        /* Between the hint's predecessor and the hint: the hint's left link is free when the
         * predecessor is an ancestor, else the predecessor (rightmost below the hint's left
         * child) has a free right link. */
        sp_block_t *p = sp__bset_tpred(h);
        if (!p || less_in(set, one, p, b)) {
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
        sp_block_t *sc = sp__bset_tsucc(h);
        if (!sc || less_in(set, one, b, sc)) {
            if (!h->right) {
                parent = h;
            } else {
                parent = sc;
                left = true;
            }
        }
    }
    if (!parent) {
        sp_block_t *n = sp__blk0(*root);
        if (!n) {
            b->parent = 0;
            *root = sp__bref(b);
            set->hint = b;
            if (set->classes) {
                sp__bset_mark(set->cls, c);
                if (!set->min || less_in(set, one, b, set->min))
                    set->min = b;
            } else {
                set->min = b;
            }
            return;
        }
        for (;;) {
            left = less_in(set, one, b, n);
            sp_ref_t next = left ? n->left : n->right;
            if (!next)
                break;
            n = sp__blk(next);
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
    grew(root, parent, left);
}

/* In-order, each node read before it is relinked: the one tree gets them in rising order, each
 * beside the last (the hint). Depth: a class tree's height. */
static void relink_all(sp_block_set_t *set, sp_block_t *n) {
    if (!n)
        return;
    sp_block_t *l = L(n), *r = R(n);
    relink_all(set, l);
    link_node(set, n, !set->by_seq, true);
    relink_all(set, r);
}

/* Classes to one tree (every block has one stream so far). */
static void to_one_tree(sp_block_set_t *set) {
    sp_block_t *hint = set->hint;
    sp_bset_classes_t *t = set->cls;
    set->classes = false;
    set->moves = false;
    set->root = 0;
    set->hint = NULL;
    for (int c = sp__bset_next_class(t, 0); c >= 0; c = sp__bset_next_class(t, (unsigned)c + 1)) {
        sp_block_t *r = sp__blk0(t->root[c]);
        relink_all(set, r);
    }
    for (int c = sp__bset_next_class(t, 0); c >= 0; c = sp__bset_next_class(t, (unsigned)c + 1))
        t->root[c] = 0;
    t->top = 0;
    for (unsigned w = 0; w < SP_BSET_WORDS; w++)
        t->bits[w] = 0;
    set->hint = hint;
}

/* One tree to classes (every block has one stream; count already counts a block not linked
 * yet, which the caller links next). */
static void to_classes(sp_block_set_t *set) {
    sp_block_t *hint = set->hint, *r = sp__blk0(set->root);
    set->classes = true;
    set->root = 0;
    set->hint = NULL;
    relink_all(set, r);
    set->hint = hint;
}

/* One tree down to one block (a leaf root): the classes' form, that block in no tree. */
static void to_single(sp_block_set_t *set) {
    sp_block_t *m = set->min;
    assert(set->root == sp__bref(m) && !m->left && !m->right && !m->parent && BAL(m) == 0);
    set->root = 0;
    set->classes = true;
    set->hint = m;
}

static void unlink_node(sp_ref_t *root, sp_block_t *b);

void sp__bset_remove(sp_block_set_t *set, sp_block_t *b) {
    if (!b->in_set)
        return;
    /* With classes every block has min's stream (lead is 0 or count): no stream to read. */
    if (set->lead &&
        (set->classes || (uintptr_t)sp__block_stream(b) == (uintptr_t)sp__block_stream(set->min)))
        set->lead--; /* 0 with blocks left: min's stream is another one, its count not known */
    if (set->classes && set->count == 1) {
        set->min = set->hint = NULL; /* the one block, in no tree */
    } else {
        unsigned c = class_of(set, b->size);
        if (set->hint == b || set->min == b) {
            /* The block after b is the next candidate for the query that found b. */
            sp_block_t *s = sp__bset_succ_in(set, b, c);
            if (set->hint == b)
                set->hint = s;
            if (set->min == b)
                set->min = s;
        }
        sp_ref_t *root = slot(set, c);
        unlink_node(root, b);
        if (set->classes && !*root)
            sp__bset_unmark(set->cls, c);
        if (set->classes && set->count == 2)
            single(set);
    }
    b->in_set = false;
    b->left = b->right = b->parent = 0;
    BAL(b) = 0; /* a balance of -1 would read as a thread cache's mark once b is handed out */
    set->count--;
    /* Below half of min_classes blocks: one tree again (sp_block_set_t's min_classes). */
    if (set->classes && set->count > 1 && set->count < set->min_classes / 2u)
        to_one_tree(set);
    else if (!set->classes && set->count == 1 && set->cls && !set->by_seq)
        to_single(set);
    set->moves = set->classes && set->count > 1;
}

/* Take b out of its tree (its neighbours, min and the hint already seen to) and rebalance. */
static void unlink_node(sp_ref_t *set, sp_block_t *b) {
    sp_block_t *l = L(b), *r = R(b), *p = P(b), *start;
    bool left; /* the side of start whose subtree shrank */
    if (!l || !r) {
        left = p && p->left == sp__bref(b);
        relink(set, p, b, l ? l : r);
        start = p;
    } else {
        /* Two children: b's successor m (leftmost of r) takes b's place. */
        sp_block_t *m = r;
        while (m->left)
            m = sp__blk(m->left);
        if (m == r) {
            start = m; /* its right subtree is r's less r */
            left = false;
        } else {
            start = P(m); /* its left subtree was m's, now m's right one */
            left = true;
            start->left = m->right;
            if (m->right)
                set_parent(sp__blk(m->right), start);
            set_right(m, r);
            set_parent(r, m);
        }
        set_left(m, l);
        set_parent(l, m);
        BAL(m) = BAL(b); /* the balance at b's place before the removal */
        relink(set, p, b, m);
    }
    if (start)
        shrank(set, start, left);
}

void sp__bset_move(sp_block_set_t *set, sp_block_t *b, size_t old_size) {
    sp__bset_move_from(set, b, class_of(set, old_size));
}

void sp__bset_move_from(sp_block_set_t *set, sp_block_t *b, unsigned c) {
    assert(b->in_set);
    if (set->classes && set->count == 1) {
        set->hint = b; /* the one block, in no tree: its order is every order */
        return;
    }
    /* b keeps its stream, so the counts stay; the hint would be b after the insert, and the
     * place beside the old hint is not where a key that left its neighbours goes. */
    if (set->min == b)
        set->min = sp__bset_succ_in(set, b, c);
    sp_ref_t *root = slot(set, c);
    unlink_node(root, b);
    if (set->classes && !*root)
        sp__bset_unmark(set->cls, c);
    link_node(set, b, !set->by_seq && set->lead == set->count, false);
}

/* The leaf under which b's key goes in the class tree whose root is n (not NULL). A function of
 * its own, called once per walk: its turns (coin tosses) are then selects, as in link_node's
 * walk; inlined into sp__bset_reclass_move, GCC threaded the side its caller uses after the
 * loop into two copies of it that branch on the turn at each step. */
static __attribute__((noinline)) sp_block_t *class_leaf(const sp_block_set_t *set, sp_block_t *n,
                                                        const sp_block_t *b) {
    for (;;) {
        sp_ref_t next = less_in(set, true, b, n) ? n->left : n->right;
        if (!next)
            return n;
        n = sp__blk(next);
    }
}

/* Out of class c's tree and into nc's (c's again when b grew past its successor there): the
 * same unlink and root walk as sp__bset_move_from's, so the same trees, without what that
 * general form asks on the way: the set's form and its one block (the caller's `moves` says
 * classes and more than one), the class of b's size (known), link_node's hint probe (none on a
 * move), a stream test (one stream), the successor step for min (min from the bitmap, as in
 * sp__bset_reclass's O(1) form), and a walk whose turns GCC made branches (class_leaf). A split's
 * remainder that leaves its class and a merged block that leaves its class or passes its
 * successor: nhf's 2,589 moves, ~237 instructions and 4.6 modelled mispredicts each before. */
void sp__bset_reclass_move(sp_block_set_t *set, sp_block_t *b, unsigned c, unsigned nc) {
    assert(b->in_set && set->classes && set->count > 1);
    sp_bset_classes_t *t = set->cls;
    bool was_min = set->min == b;
    if (!(b->left | b->right | b->parent)) {
        t->root[c] = 0; /* b alone in its class */
        sp__bset_unmark(t, c);
    } else {
        unlink_node(&t->root[c], b); /* another node stays: c's tree keeps its bit */
    }
    b->left = b->right = 0;
    BAL(b) = 0;
    sp_ref_t *root = &t->root[nc];
    sp_block_t *n = sp__blk0(*root);
    if (!n) {
        b->parent = 0;
        *root = sp__bref(b);
        sp__bset_mark(t, nc);
    } else {
        n = class_leaf(set, n, b);
        bool left = less_in(set, true, b, n);
        set_parent(b, n);
        if (left)
            set_left(n, b);
        else
            set_right(n, b);
        grew(root, n, left);
    }
    set->hint = b;
    /* The first block changes only when b was it and went up (the first non-empty class's
     * first block: in c's tree, b went up as it grew), or went below it. Not a test of the move's
     * direction: a split's remainder goes down and a merged block up, in turns that no predictor
     * follows. */
    if (was_min) {
        if (nc >= c)
            set->min = sp__bset_tree_min(t->root[sp__bset_next_class(t, 0)]);
    } else if (less_in(set, true, b, set->min)) {
        set->min = b;
    }
}

void sp__bset_reclass(sp_block_set_t *set, sp_block_t *b, unsigned c, unsigned nc) {
    sp__bset_reclass_inl(set, b, c, nc);
}

sp_block_t *sp__bset_lower_bound(const sp_block_set_t *set, sp_stream_t stream, size_t size) {
    uintptr_t s = (uintptr_t)stream;
    if (set->classes) {
        if (!set->min)
            return NULL;
        uintptr_t ms = (uintptr_t)sp__block_stream(set->min);
        if (ms != s)
            return s < ms ? set->min : NULL;
        if (set->count == 1)
            return set->min->size >= size ? set->min : NULL; /* in no tree */
        unsigned c = sp__bset_class(size);
        sp_block_t *n = sp__blk0(set->cls->root[c]), *best = NULL;
        while (n) {
            if (n->size < size) {
                n = R(n);
            } else {
                best = n;
                n = L(n);
            }
        }
        if (!best) {
            int nc = sp__bset_next_class(set->cls, c + 1);
            if (nc >= 0)
                best = sp__bset_tree_min(set->cls->root[nc]);
        }
        return best;
    }
    sp_block_t *n = sp__blk0(set->root), *best = NULL;
    bool one = sp__bset_one_stream(set, s); /* then below the query means smaller */
    while (n) {
        if (one ? n->size < size : sp__bset_below(n, s, size)) {
            n = R(n);
        } else {
            best = n;
            n = L(n);
        }
    }
    return best;
}

#ifndef NDEBUG
/* Walk subtree n: in-order keys strictly increasing after *last, parent links and AVL balances
 * right, every node marked in_set and (classes) of class c; *hint_seen when the hint is among
 * them. Returns the subtree height; counts nodes into *count. */
static int check(const sp_block_set_t *set, const sp_block_t *n, const sp_block_t *parent, int c,
                 const sp_block_t **last, size_t *count, size_t *lead, bool *hint_seen) {
    if (!n)
        return 0;
    if (sp__block_stream(n) == sp__block_stream(set->min))
        (*lead)++;
    assert(n->parent == sp__bref0(parent));
    assert(c < 0 || sp__bset_class(n->size) == (unsigned)c);
    int hl = check(set, L(n), n, c, last, count, lead, hint_seen);
    assert(n->in_set);
    assert(!*last || sp__bset_cmp(set->by_seq, *last, n) < 0);
    if (!*last)
        assert(set->min == n);
    *last = n;
    (*count)++;
    if (n == set->hint)
        *hint_seen = true;
    int hr = check(set, R(n), n, c, last, count, lead, hint_seen);
    assert(hl - hr <= 1 && hr - hl <= 1);
    assert(BAL(n) == hr - hl);
    return (hl > hr ? hl : hr) + 1;
}

void sp__bset_check(const sp_block_set_t *set) {
    if (set->count > 1024)
        return; /* debug builds only, and O(n): keep big caches usable */
    const sp_block_t *last = NULL;
    size_t count = 0, lead = 0;
    bool hint_seen = false;
    assert(set->moves == (set->classes && set->count > 1));
    if (set->classes && set->count == 1) {
        /* The one block: min and the hint, in no tree, every class empty. */
        const sp_block_t *m = set->min;
        assert(!set->root && m && m->in_set && set->hint == m);
        assert(!m->left && !m->right && !m->parent && BAL(m) == 0 && !set->cls->top);
        assert(set->lead == 0 || set->lead == 1);
        (void)m;
        return;
    }
    if (set->classes) {
        assert(!set->root);
        for (unsigned c = 0; c < SP_BSET_CLASSES; c++) {
            bool bit = (set->cls->bits[c >> 6] >> (c & 63)) & 1;
            assert(bit == (set->cls->root[c] != 0));
            (void)bit;
            (void)check(set, sp__blk0(set->cls->root[c]), NULL, (int)c, &last, &count, &lead,
                        &hint_seen);
        }
        for (unsigned w = 0; w < SP_BSET_WORDS; w++)
            assert(((set->cls->top >> w) & 1) == (set->cls->bits[w] != 0));
        assert(lead == count); /* one stream */
    } else {
        (void)check(set, sp__blk0(set->root), NULL, -1, &last, &count, &lead, &hint_seen);
        assert(set->root || !set->min);
    }
    assert(count == set->count);
    assert(set->lead == 0 || set->lead == lead);
    assert(!set->hint || hint_seen);
}
#endif
