/*
 * block.h: private to pool/: blocks and segments, the allocator's two basic structures (see
 * allocator.h for their ownership and invariants).
 */
#ifndef SP_POOL_BLOCK_H
#define SP_POOL_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sympool/pool.h"

/* ---- blocks, segments, block pools ------------------------------------------------------- */

struct sp_segment;
struct sp_bpool;
struct sp_devalloc;
struct sp_tcache;

/* Streams recorded on an allocated block by sp_record_stream (rare: kept out of the block). */
typedef struct sp_block_uses {
    uint32_t n;     /* entries in s (lock) */
    uint32_t cap;   /* capacity of s (lock) */
    sp_stream_t *s; /* (malloc'd) (lock) */
} sp_block_uses_t;

/* A block is in one of four states: allocated (in the pointer map), pending (freed, waiting for
 * events), free (in its block pool's set) or unmapped (expandable address space, on its bpool's
 * unmapped list), or idle on the device's spare list. Fields used in disjoint states share
 * storage, which keeps a block at 80 bytes: the pointer-map chain, the tree's parent link and
 * a pending free's event count; the caller's size and the GC age; the recorded streams and the
 * tree's (or unmapped list's) left link. The word of the parent link is zero whenever a block is
 * in none of those states (a set removal and a pointer-map removal clear it, new structs are
 * zeroed), so outside the pending state the event count reads 0 (sp__block_pending). */
typedef struct sp_block {
    uintptr_t addr; /* start address (lock) */
    size_t size;    /* bytes, a multiple of 512 (lock) */
    union {
        size_t requested;  /* caller's size while allocated or pending (lock) */
        uint64_t gc_count; /* while in_set: bpool's get_free_block count when inserted (GC age) */
    };
    struct sp_segment *seg; /* owning segment (const) */
    struct sp_block *prev;  /* lower neighbour in the segment, NULL at its start (lock) */
    struct sp_block *next;  /* higher neighbour in the segment (lock) */
    union {
        struct sp_block *left; /* free-set tree link while in_set; the unmapped list's (lock) */
        sp_block_uses_t *uses; /* while allocated: its recorded streams, or NULL (lock); read
                                * through sp__block_has_uses outside the allocated state */
    };
    union {
        struct sp_block *right; /* free-set tree link while in_set; the unmapped list's (lock) */
        struct sp_tcache *tc_owner; /* while allocated and in a thread cache (thread_cache.h) */
    };
    union {
        struct sp_block *parent; /* free-set tree link while in_set (lock) */
        struct sp_block *hnext;  /* pointer-map chain while allocated; spare list while idle */
        int32_t event_count;     /* outstanding events while pending (lock) */
    };
    uint32_t context; /* history context of the allocation, 0 if none (lock) */
    int8_t height;    /* AVL height while in_set; SP_TC_MARK while allocated and in a thread
                       * cache (thread_cache.h), else 0 or stale (lock) */
    bool allocated;   /* handed out and not yet freed (lock) */
    bool in_set;      /* in its bpool's free set (lock) */
    bool unmapped;    /* expandable: address space without memory; in its bpool's
                       * unmapped list (chained by left/right), never in a set (lock) */
} sp_block_t;

/* Is b a pending free (freed, waiting for events)? */
static inline bool sp__block_pending(const sp_block_t *b) {
    return !b->allocated && !b->in_set && !b->unmapped && b->event_count != 0;
}

/* Does b have recorded streams that its free must wait for? Only an allocated block can (a free
 * consumes them before the block becomes pending, free or unmapped, whose `left` shares the
 * storage). */
static inline bool sp__block_has_uses(const sp_block_t *b) {
    return b->allocated && b->uses != NULL;
}

typedef struct sp_segment {
    uintptr_t base;             /* start address (const) */
    size_t size;                /* bytes (const) */
    sp_stream_t stream;         /* allocation stream (const) */
    struct sp_bpool *bpool;     /* small or large block pool of its MemPool (const) */
    uint64_t seq;               /* per-pool sequence number in growth order, from 0 (const) */
    uint32_t context;           /* history context of the request that grew it (lock) */
    sp_block_t *head;           /* its lowest block (lock) */
    bool expandable;            /* an expandable segment: size is address space (const) */
    bool whole;                 /* expandable: grows for requests of whole pages only (const) */
    size_t page;                /* expandable: bytes per mapped page (const) */
    size_t mapped;              /* expandable: bytes mapped (lock) */
    uintptr_t *bidx_addr;       /* lookup index: block starts when last built, sorted (lock) */
    struct sp_block **bidx_blk; /* the blocks at those starts; validated on use (lock) */
    size_t bidx_n;              /* entries (lock) */
    size_t bidx_cap;            /* capacity of both arrays (lock) */
    struct sp_segment *pprev;   /* pool's segment list, in seq order (lock) */
    struct sp_segment *pnext;   /* (lock) */
} sp_segment_t;

/* A block's allocation stream: its segment's (every block of a segment has the segment's
 * stream, so the block keeps none of its own). */
static inline sp_stream_t sp__block_stream(const sp_block_t *b) {
    return b->seg->stream;
}

/* Put a into b's segment list right before b (a takes b's place as the head if b was it). */
static inline void sp__block_link_before(sp_block_t *a, sp_block_t *b) {
    a->prev = b->prev;
    a->next = b;
    if (a->prev)
        a->prev->next = a;
    else
        b->seg->head = a;
    b->prev = a;
}

/* Put a into b's segment list right after b. */
static inline void sp__block_link_after(sp_block_t *a, sp_block_t *b) {
    a->prev = b;
    a->next = b->next;
    if (b->next)
        b->next->prev = a;
    b->next = a;
}

#endif /* SP_POOL_BLOCK_H */
