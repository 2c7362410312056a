/*
 * ptr_map.c: the per-device map from a block's start address to its allocated block.
 *
 * A chained hash table (chains through sp_block_t.hnext; insert and remove are inline in
 * ptr_map.h, block refs in the buckets) with a power-of-two bucket count that
 * doubles when the load passes 1, so lookups are O(1) on average. It holds exactly the allocated
 * blocks of one device: sp_malloc inserts, the free request removes. The caller holds the device
 * allocator lock. Growth is the only allocation; if it fails the table keeps working, only
 * with longer chains.
 */
#include <stdlib.h>

#include "pool/ptr_map.h"

/* 8192 buckets (32 KiB): a training process holds thousands of live blocks (the real traces
 * replayed in bench/: 2,000 to 8,000), so a table that started at 1024 was rehashed two or three
 * times as the allocations grew, each doubling a pass over every live block at random addresses;
 * on a 3,000 to 13,000-event replay that was 2-4% of its event loop's time
 * (bench/results/2026-11-30-s27-loopcut.jsonl). A smaller table was slower there, and a process
 * with few blocks pays 28 KiB more. */
#define INITIAL_BUCKETS 8192

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

void sp__ptr_map_grow(sp_ptr_map_t *m) {
    size_t n = (m->mask + 1) * 2;
    sp_ref_t *nb = calloc(n, sizeof(*nb));
    if (!nb)
        return; /* keep the old table: correct, just slower */
    for (size_t i = 0; i <= m->mask; i++) {
        sp_ref_t r = m->buckets[i];
        while (r) {
            sp_block_t *b = sp__blk(r);
            sp_ref_t nx = b->hnext;
            size_t h = sp__ptr_map_hash(b->addr) & (n - 1);
            b->hnext = nb[h];
            nb[h] = r;
            r = nx;
        }
    }
    free(m->buckets);
    m->buckets = nb;
    m->mask = n - 1;
}

sp_block_t *sp__ptr_map_find(const sp_ptr_map_t *m, uintptr_t addr) {
    if (!m->buckets)
        return NULL;
    for (sp_ref_t r = m->buckets[sp__ptr_map_hash(addr) & m->mask]; r;) {
        sp_block_t *b = sp__blk(r);
        if (b->addr == addr)
            return b;
        r = b->hnext;
    }
    return NULL;
}
