/*
 * ptr_map.h: private to pool/: the per-device map from an allocated block's start address to its
 * block, a chained hash table (ptr_map.c holds init, find and growth; insert and remove, which sit
 * on every malloc and free, are inline).
 */
#ifndef SP_POOL_PTR_MAP_H
#define SP_POOL_PTR_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "pool/block.h"

/* ---- pointer map ------------------------------------------------------------------------- */

typedef struct sp_ptr_map {
    sp_ref_t *buckets; /* block refs, chained by hnext, 0 ends a chain (lock) */
    size_t mask;       /* nbuckets - 1, a power of two minus one (lock) */
    size_t count;      /* allocated blocks (lock) */
} sp_ptr_map_t;

sp_status_t sp__ptr_map_init(sp_ptr_map_t *m);
void sp__ptr_map_fini(sp_ptr_map_t *m);
sp_block_t *sp__ptr_map_find(const sp_ptr_map_t *m, uintptr_t addr);
/* Double the bucket count (out of line: rare). */
void sp__ptr_map_grow(sp_ptr_map_t *m);

/* Insert and remove are inline: they sit on every malloc and free. A Fibonacci multiplier mixes
 * the address; the mask picks the bucket from bits 26 and up of the product. Blocks are 512-byte
 * aligned, so those are bits 17 and up of (addr / 512) times the multiplier (below bit 55: every
 * table that fits in memory): the 9 zero bits need no shift of their own. */
static inline size_t sp__ptr_map_hash(uintptr_t addr) {
    uint64_t x = (uint64_t)addr * 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 26);
}

/* Is there room for one more block without growing? */
static inline bool sp__ptr_map_room(const sp_ptr_map_t *m) {
    return m->count <= m->mask;
}

/* Insert b, whose ref is r, where sp__ptr_map_room said there is room. */
static inline void sp__ptr_map_insert_ref(sp_ptr_map_t *m, sp_block_t *b, sp_ref_t r) {
    sp_ref_t *head = &m->buckets[sp__ptr_map_hash(b->addr) & m->mask];
    b->hnext = *head;
    *head = r;
    m->count++;
}

static inline void sp__ptr_map_insert_room(sp_ptr_map_t *m, sp_block_t *b) {
    sp__ptr_map_insert_ref(m, b, sp__bref(b));
}

static inline void sp__ptr_map_insert(sp_ptr_map_t *m, sp_block_t *b) {
    if (SP_UNLIKELY(!sp__ptr_map_room(m)))
        sp__ptr_map_grow(m);
    sp__ptr_map_insert_room(m, b);
}

/* The link that holds the ref of the block starting at addr (for sp__ptr_map_unlink), or NULL,
 * in a map that has its buckets (its device allocator is initialized and not yet shut down). */
static inline sp_ref_t *sp__ptr_map_slot_b(sp_ptr_map_t *m, uintptr_t addr, sp_block_t **b_p) {
    sp_ref_t *pp = &m->buckets[sp__ptr_map_hash(addr) & m->mask];
    sp_ref_t r = *pp;
    if (!r)
        return NULL;
    sp_block_t *b = sp__blk(r);
    /* The first in the chain is the likely one: the map grows at load 1. */
    while (SP_UNLIKELY(b->addr != addr)) {
        pp = &b->hnext;
        r = *pp;
        if (!r)
            return NULL;
        b = sp__blk(r);
    }
    *b_p = b;
    return pp;
}

static inline sp_ref_t *sp__ptr_map_slot(sp_ptr_map_t *m, uintptr_t addr) {
    sp_block_t *b;
    return sp__ptr_map_slot_b(m, addr, &b);
}

/* Unlink b, whose ref *pp holds. */
static inline sp_block_t *sp__ptr_map_unlink_b(sp_ptr_map_t *m, sp_ref_t *pp, sp_block_t *b) {
    *pp = b->hnext;
    b->hnext = 0;
    m->count--;
    return b;
}

/* sp__ptr_map_unlink_b for a block whose struct the caller reuses at once: its hnext is left as
 * it is. */
static inline sp_block_t *sp__ptr_map_unlink_reused(sp_ptr_map_t *m, sp_ref_t *pp, sp_block_t *b) {
    *pp = b->hnext;
    m->count--;
    return b;
}

static inline sp_block_t *sp__ptr_map_unlink(sp_ptr_map_t *m, sp_ref_t *pp) {
    sp_block_t *b = sp__blk(*pp);
    *pp = b->hnext;
    b->hnext = 0;
    m->count--;
    return b;
}

static inline sp_block_t *sp__ptr_map_remove(sp_ptr_map_t *m, uintptr_t addr) {
    if (SP_UNLIKELY(!m->buckets))
        return NULL;
    sp_ref_t *pp = sp__ptr_map_slot(m, addr);
    return pp ? sp__ptr_map_unlink(m, pp) : NULL;
}

#endif /* SP_POOL_PTR_MAP_H */
