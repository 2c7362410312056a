/*
 * expandable_probe.c: the unmapped lists of pool/expandable.c, read as the library lays them out.
 * pool/allocator.h is C11 (atomics), which C++ cannot include: the unit test calls this.
 */
#include "tests/unit/expandable_probe.h"

#include <inttypes.h>
#include <stdio.h>

#include "pool/allocator.h"

/* One block pool: -1 with msg, else the list's length. */
static long check_bpool(const sp_bpool_t *bp, char *msg, size_t cap) {
    long n = 0;
    const sp_block_t *prev = NULL;
    for (const sp_block_t *b = bp->unmapped; b; prev = b, b = sp__blk0(b->right), n++) {
        if (!b->unmapped || sp__bseg(b)->bpool != bp) {
            snprintf(msg, cap, "entry %ld (%#" PRIxPTR ") is not an unmapped block of this pool", n,
                     b->addr);
            return -1;
        }
        if (sp__blk0(b->left) != prev) {
            snprintf(msg, cap, "entry %ld (%#" PRIxPTR "): its left link is not entry %ld", n,
                     b->addr, n - 1);
            return -1;
        }
        if (prev && !((uintptr_t)sp__block_stream(prev) < (uintptr_t)sp__block_stream(b) ||
                      (sp__block_stream(prev) == sp__block_stream(b) && prev->addr < b->addr))) {
            snprintf(msg, cap,
                     "entry %ld (%#" PRIxPTR ") is not after entry %ld (%#" PRIxPTR
                     ") in (stream, address) order",
                     n, b->addr, n - 1, prev->addr);
            return -1;
        }
    }
    return n;
}

/* The unmapped blocks of pool's segments that belong to bp. */
static long count_unmapped(const sp_mempool_t *pool, const sp_bpool_t *bp) {
    long n = 0;
    for (const sp_segment_t *s = pool->seg_head; s; s = s->pnext)
        if (s->bpool == bp)
            for (const sp_block_t *b = s->head; b; b = sp__block_next(b))
                n += b->unmapped;
    return n;
}

static long check_pool(const sp_mempool_t *pool, char *msg, size_t cap) {
    long total = 0;
    const sp_bpool_t *bps[2] = {&pool->small, &pool->large};
    for (int i = 0; i < 2; i++) {
        long n = check_bpool(bps[i], msg, cap);
        if (n < 0)
            return -1;
        long want = count_unmapped(pool, bps[i]);
        if (n != want) {
            snprintf(msg, cap, "the %s pool's list holds %ld blocks, its segments %ld unmapped",
                     i ? "large" : "small", n, want);
            return -1;
        }
        total += n;
    }
    return total;
}

long sp_test_exp_check_unmapped(int device, char *msg, size_t cap) {
    sp_devalloc_t *d = NULL;
    if (sp__alloc_device("expandable_probe", device, &d) != SP_SUCCESS) {
        snprintf(msg, cap, "no device %d", device);
        return -1;
    }
    long total = check_pool(d->default_pool, msg, cap);
    for (const sp_mempool_t *p = d->pools; p && total >= 0; p = p->next) {
        long n = check_pool(p, msg, cap);
        total = n < 0 ? -1 : total + n;
    }
    return total;
}
