/*
 * block_set.c: the free set of a block pool. PROTOTYPE (s26-bset, a measured attempt): a B+-tree
 * of height two over copied keys (block_set.h). Order: (stream, size, address), or for
 * symmetric pools (stream, size, segment seq, offset): lower_bound on (stream, size) is
 * PyTorch's best fit. Keys are unique. The caller holds the device allocator lock.
 *
 * Not production: the top arrays are flat (a leaf's split or emptying moves up to n/8 of their
 * entries), underfull leaves are not merged, and running out of host memory aborts (the set's
 * interface cannot fail).
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool/block_set.h"

static void fill(const sp_block_set_t *set, sp_bset_ent_t *e, sp_block_t *b) {
    e->k.stream = (uintptr_t)sp__block_stream(b);
    e->k.size = b->size;
    assert(!set->by_seq || (b->addr - sp__bseg(b)->base) < ((uint64_t)1 << 40));
    e->k.tie = sp__bset_tie(set, b, b->addr);
    e->b = b;
}

static void *must(void *p) {
    if (!p) {
        fprintf(stderr, "sympool: block_set prototype: out of host memory\n");
        abort();
    }
    return p;
}

/* Make room for leaf j (the leaves from j on move up one). */
static void open_leaf(sp_block_set_t *set, uint32_t j) {
    if (set->nleaf == set->cap) {
        uint32_t cap = set->cap ? set->cap * 2 : 8;
        set->leaf = must(realloc(set->leaf, cap * sizeof(*set->leaf)));
        set->sep = must(realloc(set->sep, cap * sizeof(*set->sep)));
        set->cap = cap;
    }
    uint32_t m = set->nleaf - j;
    memmove(&set->leaf[j + 1], &set->leaf[j], m * sizeof(*set->leaf));
    memmove(&set->sep[j + 1], &set->sep[j], m * sizeof(*set->sep));
    set->leaf[j] = must(malloc(sizeof(sp_bset_leaf_t)));
    set->leaf[j]->n = 0;
    set->nleaf++;
}

static void close_leaf(sp_block_set_t *set, uint32_t j) {
    free(set->leaf[j]);
    uint32_t m = set->nleaf - j - 1;
    memmove(&set->leaf[j], &set->leaf[j + 1], m * sizeof(*set->leaf));
    memmove(&set->sep[j], &set->sep[j + 1], m * sizeof(*set->sep));
    set->nleaf--;
    if (!set->nleaf) {
        /* An empty set holds no memory: a pool whose cache is empty owns nothing here. */
        free(set->leaf);
        free(set->sep);
        set->leaf = NULL;
        set->sep = NULL;
        set->cap = 0;
    }
}

static void fix_min(sp_block_set_t *set) {
    set->min = set->nleaf ? set->leaf[0]->e[0].b : NULL;
}

/* Put entry k at place (j, i). */
static void put_at(sp_block_set_t *set, uint32_t j, uint32_t i, const sp_bset_ent_t *k) {
    if (!set->nleaf) {
        open_leaf(set, 0);
        j = i = 0;
    }
    sp_bset_leaf_t *l = set->leaf[j];
    if (l->n == SP_BSET_LEAF) {
        /* Split: the upper half goes to a new leaf after it. */
        open_leaf(set, j + 1);
        sp_bset_leaf_t *r = set->leaf[j + 1];
        uint32_t h = SP_BSET_LEAF / 2;
        memcpy(r->e, &l->e[h], (SP_BSET_LEAF - h) * sizeof(l->e[0]));
        r->n = SP_BSET_LEAF - h;
        l->n = h;
        set->sep[j + 1] = r->e[0].k;
        if (i > h) {
            j++;
            i -= h;
            l = r;
        }
    }
    memmove(&l->e[i + 1], &l->e[i], (l->n - i) * sizeof(l->e[0]));
    l->e[i] = *k;
    l->n++;
    if (!i)
        set->sep[j] = k->k;
    set->count++;
    set->pj = j;
    set->pi = i;
    fix_min(set);
}

static void take_at(sp_block_set_t *set, uint32_t j, uint32_t i) {
    sp_bset_leaf_t *l = set->leaf[j];
    l->n--;
    memmove(&l->e[i], &l->e[i + 1], (l->n - i) * sizeof(l->e[0]));
    set->count--;
    if (!l->n) {
        close_leaf(set, j);
        i = 0; /* the block after it: leaf j's first now */
    } else {
        if (!i)
            set->sep[j] = l->e[0].k;
        if (i == l->n && j + 1 < set->nleaf) {
            j++;
            i = 0;
        }
    }
    /* The block after the one taken: the next candidate of the query that found it. */
    set->pj = j;
    set->pi = i;
    fix_min(set);
}

void sp__bset_insert(sp_block_set_t *set, sp_block_t *b) {
    sp_bset_ent_t k;
    fill(set, &k, b);
    b->in_set = true;
    uint32_t j = 0, i = set->count ? sp__bset_place(set, &k.k, &j) : 0;
    put_at(set, j, i, &k);
}

/* Find b's place by the key k its entry holds; false when it is not there. */
static bool find_by(sp_block_set_t *set, const sp_block_t *b, const sp_bset_key_t *k) {
    uint32_t j, i = sp__bset_place(set, k, &j);
    if (i < set->leaf[j]->n && set->leaf[j]->e[i].b == b) {
        set->pj = j;
        set->pi = i;
        return true;
    }
    return false;
}

void sp__bset_locate_slow(sp_block_set_t *set, const sp_block_t *b) {
    sp_bset_key_t k = {(uintptr_t)sp__block_stream(b), b->size, sp__bset_tie(set, b, b->addr)};
    if (find_by(set, b, &k))
        return;
    /* Its entry's key is not its own (a key changed in place, told to sp__bset_move only):
     * look for it. */
    for (uint32_t j = 0; j < set->nleaf; j++)
        for (uint32_t i = 0; i < set->leaf[j]->n; i++)
            if (set->leaf[j]->e[i].b == b) {
                set->pj = j;
                set->pi = i;
                return;
            }
    assert(!"block not in its set");
}

void sp__bset_remove(sp_block_set_t *set, sp_block_t *b) {
    if (!b->in_set)
        return;
    sp__bset_locate(set, b);
    take_at(set, set->pj, set->pi);
    b->in_set = false;
}

/* The entry at (pj, pi), whose block's key is now k: store it in place, or move it where it
 * sorts. */
static void settle(sp_block_set_t *set, const sp_bset_ent_t *k) {
    uint32_t j = set->pj, i = set->pi;
    bool after_pred = true, before_succ = true;
    if (i)
        after_pred = sp__bset_key_below(&set->leaf[j]->e[i - 1].k, &k->k);
    else if (j)
        after_pred = sp__bset_key_below(&set->leaf[j - 1]->e[set->leaf[j - 1]->n - 1].k, &k->k);
    if (i + 1 < set->leaf[j]->n)
        before_succ = sp__bset_key_below(&k->k, &set->leaf[j]->e[i + 1].k);
    else if (j + 1 < set->nleaf)
        before_succ = sp__bset_key_below(&k->k, &set->leaf[j + 1]->e[0].k);
    if (after_pred && before_succ) {
        set->leaf[j]->e[i] = *k;
        if (!i)
            set->sep[j] = k->k;
        return;
    }
    take_at(set, j, i);
    uint32_t nj = 0, ni = set->count ? sp__bset_place(set, &k->k, &nj) : 0;
    put_at(set, nj, ni, k);
}

void sp__bset_rekey_slow(sp_block_set_t *set, sp_block_t *b, size_t old_size, uintptr_t old_addr) {
    uint32_t j = set->pj, i = set->pi;
    if (!(j < set->nleaf && i < set->leaf[j]->n && set->leaf[j]->e[i].b == b)) {
        /* Its entry still holds the old key: found by it. */
        sp_bset_key_t k = {(uintptr_t)sp__block_stream(b), old_size,
                           sp__bset_tie(set, b, old_addr)};
        bool found = find_by(set, b, &k);
        assert(found);
        (void)found;
    }
    sp_bset_ent_t k;
    fill(set, &k, b);
    settle(set, &k);
}

void sp__bset_move(sp_block_set_t *set, sp_block_t *b) {
    assert(b->in_set);
    sp__bset_locate(set, b);
    sp_bset_ent_t k;
    fill(set, &k, b);
    settle(set, &k);
}

sp_block_t *sp__bset_lower_bound(const sp_block_set_t *set, sp_stream_t stream, size_t size) {
    if (!set->count)
        return NULL;
    sp_bset_key_t q = {(uintptr_t)stream, size, 0};
    uint32_t j, i = sp__bset_place(set, &q, &j);
    return i < set->leaf[j]->n ? set->leaf[j]->e[i].b : NULL;
}

#ifndef NDEBUG
void sp__bset_check(const sp_block_set_t *set) {
    if (set->count > 1024)
        return; /* debug builds only, and O(n): keep big caches usable */
    const sp_bset_ent_t *last = NULL;
    uint32_t count = 0;
    for (uint32_t j = 0; j < set->nleaf; j++) {
        const sp_bset_leaf_t *l = set->leaf[j];
        assert(l->n > 0 && l->n <= SP_BSET_LEAF);
        assert(!memcmp(&set->sep[j], &l->e[0].k, sizeof(sp_bset_key_t)));
        for (uint32_t i = 0; i < l->n; i++, count++) {
            const sp_bset_ent_t *e = &l->e[i];
            assert(e->b->in_set);
            assert(e->k.stream == (uintptr_t)sp__block_stream(e->b) && e->k.size == e->b->size &&
                   e->k.tie == sp__bset_tie(set, e->b, e->b->addr));
            assert(!last || sp__bset_cmp(set->by_seq, last->b, e->b) < 0);
            last = e;
        }
    }
    assert(count == set->count);
    assert(set->min == (set->count ? set->leaf[0]->e[0].b : NULL));
}
#endif
