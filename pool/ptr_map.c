/*
 * ptr_map.c: the per-device map from a block's start address to its allocated block.
 *
 * A chained hash table (chains through sp_block_t.hnext) with a power-of-two bucket count that
 * doubles when the load passes 1, so lookups are O(1) on average. It holds exactly the allocated
 * blocks of one device: sp_malloc inserts, the free request removes. The caller holds the device
 * allocator lock. Growth is the only allocation; if it fails the table keeps working, only
 * with longer chains.
 */
#include <stdlib.h>

#include "pool/alloc_int.h"

#define INITIAL_BUCKETS 1024

/* Blocks are 512-byte aligned: drop those bits and mix with a Fibonacci multiplier. */
static size_t hash(uintptr_t addr) {
    uint64_t x = (uint64_t)(addr >> 9);
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 17);
}

sp_status_t sp__ptr_map_init(sp_ptr_map_t *m) {
    m->buckets = calloc(INITIAL_BUCKETS, sizeof(*m->buckets));
    if (!m->buckets)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_POOL, "out of host memory for the pointer map");
    m->mask = INITIAL_BUCKETS - 1;
    m->count = 0;
    return SP_SUCCESS;
}

void sp__ptr_map_fini(sp_ptr_map_t *m) {
    free(m->buckets);
    m->buckets = NULL;
    m->mask = 0;
    m->count = 0;
}

static void grow(sp_ptr_map_t *m) {
    size_t n = (m->mask + 1) * 2;
    sp_block_t **nb = calloc(n, sizeof(*nb));
    if (!nb)
        return; /* keep the old table: correct, just slower */
    for (size_t i = 0; i <= m->mask; i++) {
        sp_block_t *b = m->buckets[i];
        while (b) {
            sp_block_t *nx = b->hnext;
            size_t h = hash(b->addr) & (n - 1);
            b->hnext = nb[h];
            nb[h] = b;
            b = nx;
        }
    }
    free(m->buckets);
    m->buckets = nb;
    m->mask = n - 1;
}

void sp__ptr_map_insert(sp_ptr_map_t *m, sp_block_t *b) {
    if (m->count > m->mask)
        grow(m);
    size_t h = hash(b->addr) & m->mask;
    b->hnext = m->buckets[h];
    m->buckets[h] = b;
    m->count++;
}

sp_block_t *sp__ptr_map_find(const sp_ptr_map_t *m, uintptr_t addr) {
    if (!m->buckets)
        return NULL;
    for (sp_block_t *b = m->buckets[hash(addr) & m->mask]; b; b = b->hnext)
        if (b->addr == addr)
            return b;
    return NULL;
}

sp_block_t *sp__ptr_map_remove(sp_ptr_map_t *m, uintptr_t addr) {
    if (!m->buckets)
        return NULL;
    sp_block_t **pp = &m->buckets[hash(addr) & m->mask];
    for (sp_block_t *b = *pp; b; pp = &b->hnext, b = b->hnext) {
        if (b->addr == addr) {
            *pp = b->hnext;
            b->hnext = NULL;
            m->count--;
            return b;
        }
    }
    return NULL;
}
