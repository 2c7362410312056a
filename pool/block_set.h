/*
 * block_set.h: private to pool/: the free set of a block pool, AVL trees with parent links: one
 * per size class for a pool's one-stream set, or one for the whole set (block_set.c holds
 * insert, remove and the debug check; the lookups and neighbour steps on the malloc and free
 * paths are inline).
 */
#ifndef SP_POOL_BLOCK_SET_H
#define SP_POOL_BLOCK_SET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "pool/block.h"

/* The free set: ordered by (stream, size, address), or for symmetric pools by (stream, size,
 * segment seq, offset) so that best fit is rank-independent.
 *
 * Two cached positions keep the common case off the root path: `min`, the first block (so the
 * predecessor of the first block is known without walking up the left spine), and `hint`, the
 * block the last lookup or insert ended on. A caching allocator's traffic is mostly the same
 * sizes again: the block just freed is the next best fit, the block after the one just taken
 * is the next candidate. Both are only starting points: a lookup checks the hint against its
 * in-order predecessor before trusting it, so every answer is the one the root walk gives. */
/* Size classes. A set whose blocks all have one stream (nearly every pool's, nearly always) and
 * that is ordered by address (not symmetric) keeps one AVL tree per size class instead of one
 * for all: its order is then the classes' order, each tree's in turn, since the class is a
 * monotone function of the size. A walk decides only among its class's blocks (a few, where
 * the one tree had hundreds: each level a data-dependent turn, a mispredicted branch half the
 * time), and a bitmap over the classes finds the next non-empty one with a ctz or two. Classes
 * are log-linear in size / 512 + 16: exact below 16 units (8 KiB), then 16 a power of two (a
 * class spans 1/16 to 1/8 of its sizes), 832 in all (every size_t).
 * Within a class the tree orders by (size, address) as the one tree does: best fit is exact.
 * A block of a second stream turns the set into one tree (every block linked again, in order)
 * until it is empty again (or down to one block). A set of 2 to SP_BSET_MIN_CLASSES - 1 blocks
 * keeps one tree too (below). A set with classes that holds one block keeps it in no tree: it is
 * min and the hint (with links 0, every class empty), so that its key changes cost nothing (a
 * cached pair on a pool whose one free block is its segment's remainder changes the class of
 * that block on every call, 4 MiB from a 20 MiB block); the second insert puts it in its tree,
 * the removal that leaves one takes the last out. The table (3.4 KB) is the pool's own
 * (sp__bset_init_classes at its creation; without it, one tree: the same order). SP_BSET_SUB_BITS:
 * log2 of the classes a power of two, for measurements (3 to 6). SP_BSET_ONE_TREE: never use the
 * table (none is made; one tree always): the reference build of scripts/replay_diff. */
#ifndef SP_BSET_SUB_BITS
#define SP_BSET_SUB_BITS 4
#endif
/* Every size: size / 512 + 2^k < 2^56 (class_of below). */
#define SP_BSET_CLASSES ((56 - SP_BSET_SUB_BITS) << SP_BSET_SUB_BITS)
/* A set of a few blocks keeps one tree: its walks are short either way, and a block alone in
 * its class (a segment's remainder that a pool's traffic splits and merges back) changes class
 * on most calls, each a move of its node and two bitmap updates where the one tree changed the
 * key in place (kkaitlyn__memory_small_forward, 4 to 7 free blocks a set: a third more
 * instructions an event). From this many blocks the classes' form, and one tree again below half
 * of it (hysteresis: no relinking back and forth at one size). */
#ifndef SP_BSET_MIN_CLASSES
#define SP_BSET_MIN_CLASSES 16
#endif
#define SP_BSET_WORDS ((SP_BSET_CLASSES + 63) / 64)
typedef struct sp_bset_classes {
    uint64_t top;                   /* bit w: bits[w] != 0 (lock) */
    uint64_t bits[SP_BSET_WORDS];   /* bit c: class c's tree is not empty (lock) */
    sp_ref_t root[SP_BSET_CLASSES]; /* each class's tree (lock) */
} sp_bset_classes_t;

typedef struct sp_block_set {
    sp_ref_t root;          /* the one tree, when not `classes` (lock) */
    uint32_t lead;          /* blocks in the set with min's stream, or 0: not known (lock) */
    sp_bset_classes_t *cls; /* the class trees' table, or NULL: one tree always (owned) */
    sp_block_t *min;        /* the first block in order, NULL when empty (lock) */
    sp_block_t *hint;       /* a block in the set, or NULL (lock) */
    uint32_t count;         /* blocks in the set (lock) */
    bool by_seq;            /* symmetric ordering (const) */
    bool classes;           /* one tree per class in cls (decided at each insert into an empty
                             * set: not symmetric, cls there; left at the first block of a
                             * second stream) (lock) */
    bool moves;             /* classes and count > 1: a key change that leaves its class moves
                             * its node (one block is in no tree); one test on the cached pair's
                             * path, in the struct's padding (lock) */
    uint8_t min_classes;    /* classes from this many blocks, one tree again below half of it
                             * (SP_BSET_MIN_CLASSES; a test sets 1: classes from the first block,
                             * until empty) (lock) */
} sp_block_set_t;

/* The class of a block size (a multiple of 512), monotone in the size: the exponent and the
 * top k bits of the mantissa of u + 2^k as a double (u = size / 512), which are its bits from
 * bit 52 - k up, less those of 2^k. Exact (u itself) for u < 2^k; a conversion, a move and a
 * shift, where the integer form's two variable shifts and a count of leading zeros were a
 * tenth of the replay loop's instructions. Rounding above 2^53 is monotone too. */
static inline unsigned sp__bset_class(size_t size) {
    const unsigned k = SP_BSET_SUB_BITS;
    double d = (double)(int64_t)((size >> 9) + ((size_t)1 << k)); /* < 2^56: no sign */
    uint64_t bits;
    __builtin_memcpy(&bits, &d, sizeof bits);
    return (unsigned)(bits >> (52 - k)) - ((1023u + k) << k);
}

/* Class c's tree got its first node: its bit (and its word's) set. */
static inline void sp__bset_mark(sp_bset_classes_t *t, unsigned c) {
    t->bits[c >> 6] |= 1ull << (c & 63);
    t->top |= 1ull << (c >> 6);
}

/* Class c's tree emptied: its bit goes (and its word's, when the last). */
static inline void sp__bset_unmark(sp_bset_classes_t *t, unsigned c) {
    uint64_t w = t->bits[c >> 6] &= ~(1ull << (c & 63));
    if (!w)
        t->top &= ~(1ull << (c >> 6));
}

/* The first non-empty class >= c, or -1. */
static inline int sp__bset_next_class(const sp_bset_classes_t *t, unsigned c) {
    if (c >= SP_BSET_CLASSES)
        return -1;
    unsigned w = c >> 6;
    uint64_t m = t->bits[w] & (~0ull << (c & 63));
    if (m)
        return (int)(w * 64 + (unsigned)__builtin_ctzll(m));
    uint64_t up = t->top & (~0ull << (w + 1));
    if (!up)
        return -1;
    w = (unsigned)__builtin_ctzll(up);
    return (int)(w * 64 + (unsigned)__builtin_ctzll(t->bits[w]));
}

/* The last non-empty class < c, or -1. */
static inline int sp__bset_prev_class(const sp_bset_classes_t *t, unsigned c) {
    if (c == 0)
        return -1;
    c--;
    unsigned w = c >> 6;
    uint64_t m = t->bits[w] & (~0ull >> (63 - (c & 63)));
    if (m)
        return (int)(w * 64 + 63 - (unsigned)__builtin_clzll(m));
    uint64_t down = t->top & ((1ull << w) - 1);
    if (!down)
        return -1;
    w = 63 - (unsigned)__builtin_clzll(down);
    return (int)(w * 64 + 63 - (unsigned)__builtin_clzll(t->bits[w]));
}

static inline sp_block_t *sp__bset_tree_min(sp_ref_t r) {
    sp_block_t *n = sp__blk0(r);
    if (n)
        while (n->left)
            n = sp__blk(n->left);
    return n;
}

static inline sp_block_t *sp__bset_tree_max(sp_ref_t r) {
    sp_block_t *n = sp__blk0(r);
    if (n)
        while (n->right)
            n = sp__blk(n->right);
    return n;
}

/* Give a set its class table (a new pool); false: out of memory (the set keeps one tree). */
bool sp__bset_init_classes(sp_block_set_t *set);
void sp__bset_free_classes(sp_block_set_t *set);

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
 * stream) and without the insert's look beside the hint (a moved key has left it). old_size:
 * b's size while it sorted where it is (its class's tree holds it). */
void sp__bset_move(sp_block_set_t *set, sp_block_t *b, size_t old_size);
/* The same, from the class c whose tree holds b (0 without classes). */
void sp__bset_move_from(sp_block_set_t *set, sp_block_t *b, unsigned c);

/* sp__bset_move_from(set, b, c) for a set with classes and more than one block (`moves`), b's
 * new size of class nc (c itself when b grew past its successor in c's tree): the same trees,
 * the work a class move needs only (block_set.c). sp__bset_reclass's general case (b not alone
 * in c's tree, or nc's tree not empty). */
void sp__bset_reclass_move(sp_block_set_t *set, sp_block_t *b, unsigned c, unsigned nc);

/* b (in a set with classes, class c's tree) changed its size in place to one of class nc != c:
 * the move to nc's tree, as sp__bset_move. A cached pair of one size on a pool with one free
 * block (its segment's remainder) makes this move on each call when the remainder's class is
 * not the whole block's (a 4 MiB request from a 20 MiB block, and back): there b is alone in
 * its tree and nc's is empty, and the move is the two roots and their bits, without a walk or
 * a rotation. The first block changes only when b was it and goes up, or goes down past it. */
static inline __attribute__((always_inline)) void
sp__bset_reclass_inl(sp_block_set_t *set, sp_block_t *b, unsigned c, unsigned nc) {
    sp_bset_classes_t *t = set->cls;
    if (set->count == 1) {
        set->hint = b; /* the one block, in no tree (below) */
        return;
    }
    if (SP_LIKELY(!(b->left | b->right | b->parent) && !t->root[nc])) {
        t->root[nc] = t->root[c]; /* b's ref: b is c's root */
        t->root[c] = 0;
        sp__bset_unmark(t, c);
        sp__bset_mark(t, nc);
        if (set->count > 1 && (set->min == b ? nc > c : nc < c))
            set->min = sp__bset_tree_min(t->root[sp__bset_next_class(t, 0)]);
        set->hint = b;
        return;
    }
    sp__bset_reclass_move(set, b, c, nc);
}

/* The same out of line (block_set.c): the cached pair's paths (malloc_fast's split, free_fast's
 * merge), whose registers the inlined form crowds (+6 instructions a 512 B pair, callgrind);
 * the other callers take sp__bset_reclass_inl and save the call. */
void sp__bset_reclass(sp_block_set_t *set, sp_block_t *b, unsigned c, unsigned nc);
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

/* b's in-order neighbours in its tree, NULL at either end. Expected O(1): most nodes sit near
 * the leaves. */
static inline sp_block_t *sp__bset_tpred(const sp_block_t *b) {
    if (b->left)
        return sp__bset_tree_max(b->left);
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

static inline sp_block_t *sp__bset_tsucc(const sp_block_t *b) {
    if (b->right)
        return sp__bset_tree_min(b->right);
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

/* b's in-order neighbours in the set (b in the set, its size its class's), NULL at either
 * end: in its tree, else the last (first) block of the class before (after) b's. The first
 * block, whose predecessor would need the whole left spine, is known. */
static inline sp_block_t *sp__bset_pred(const sp_block_set_t *set, const sp_block_t *b) {
    if (b == set->min)
        return NULL;
    sp_block_t *p = sp__bset_tpred(b);
    if (p || !set->classes)
        return p;
    int c = sp__bset_prev_class(set->cls, sp__bset_class(b->size));
    return c < 0 ? NULL : sp__bset_tree_max(set->cls->root[c]);
}

/* The successor of b, whose tree is class c's (b's size may have left c: a move's). */
static inline sp_block_t *sp__bset_succ_in(const sp_block_set_t *set, const sp_block_t *b,
                                           unsigned c) {
    sp_block_t *s = sp__bset_tsucc(b);
    if (s || !set->classes)
        return s;
    int n = sp__bset_next_class(set->cls, c + 1);
    return n < 0 ? NULL : sp__bset_tree_min(set->cls->root[n]);
}

static inline sp_block_t *sp__bset_succ(const sp_block_set_t *set, const sp_block_t *b) {
    return sp__bset_succ_in(set, b, set->classes ? sp__bset_class(b->size) : 0);
}

/* Is block n's key below the query (stream, size, -inf)? */
static inline bool sp__bset_below(const sp_block_t *n, uintptr_t s, size_t size) {
    uintptr_t ns = (uintptr_t)sp__block_stream(n);
    return ns < s || (ns == s && n->size < size);
}

/* lower_bound (stream, size) for the malloc path, with the result's in-order predecessor in
 * *pred_p, which the split checks its remainder against: NULL if none, or (classes) when it lies
 * in a class below the result's (a remainder that keeps the result's class sorts above it). The
 * hint answers when it is at least the query and its predecessor is below it; otherwise the walk
 * does (the root's, or the query's class's tree and then the next non-empty class), and
 * becomes the hint. */
static inline __attribute__((always_inline)) sp_block_t *
sp__bset_find_fit(sp_block_set_t *set, sp_stream_t stream, size_t size, sp_block_t **pred_p) {
    uintptr_t s = (uintptr_t)stream;
    sp_block_t *h = set->hint;
    if (h == set->min && SP_LIKELY(h) && !sp__bset_below(h, s, size)) {
        /* The hint is the first block and answers (a pool whose one free block is its
         * segment's remainder: the cached pair's case): in either form, no predecessor. */
        *pred_p = NULL;
        return h;
    }
    if (set->classes) {
        /* Every block has min's stream: another stream's query is answered at the ends. */
        if (SP_UNLIKELY(!h || (uintptr_t)sp__block_stream(h) != s)) {
            *pred_p = NULL;
            if (!set->min)
                return NULL;
            uintptr_t ms = (uintptr_t)sp__block_stream(set->min);
            if (ms != s)
                return s < ms ? set->min : NULL;
        }
        if (SP_LIKELY(h) && h->size >= size) {
            /* The first block (a pool's one free block, often) has no predecessor: no walk. */
            sp_block_t *p = h == set->min ? NULL : sp__bset_tpred(h);
            if (p ? p->size < size
                  : (h == set->min || sp__bset_class(h->size) == sp__bset_class(size))) {
                *pred_p = p;
                return h;
            }
        }
        unsigned c = sp__bset_class(size);
        sp_block_t *best = NULL, *pred = NULL;
        for (sp_block_t *n = sp__blk0(set->cls->root[c]); n;) {
            if (n->size < size) {
                pred = n;
                n = sp__blk0(n->right);
            } else {
                best = n;
                n = sp__blk0(n->left);
            }
        }
        if (!best) {
            int nc = sp__bset_next_class(set->cls, c + 1);
            if (nc >= 0)
                best = sp__bset_tree_min(set->cls->root[nc]);
        }
        if (best)
            set->hint = best;
        *pred_p = pred;
        return best;
    }
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
        for (sp_block_t *n = sp__blk0(set->root); n;) {
            if (n->size < size) {
                pred = n;
                n = sp__blk0(n->right);
            } else {
                best = n;
                n = sp__blk0(n->left);
            }
        }
    } else {
        for (sp_block_t *n = sp__blk0(set->root); n;) {
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
