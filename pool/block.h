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

/* ---- struct references ------------------------------------------------------------------ */

/* Every block and segment struct lives in one address range (arena.c), so a link between them
 * is a 32-bit offset from its base instead of a pointer: 0 means none (no struct sits at the
 * base), and a ref back to a pointer is one add. */
typedef uint32_t sp_ref_t;

/* The range's base (set once, before the first struct exists). Hidden: read straight, not
 * through the GOT. */
extern __attribute__((visibility("hidden"))) char *sp__arena_base;

/* Reserve the range (once per process; later calls only report). false: no address space. */
bool sp__arena_ready(void);
/* `bytes` of zeroed, never-used struct storage (64-byte aligned), or NULL when the range (or
 * the tests' limit) is used up or its pages cannot be made usable. Never given back. */
void *sp__arena_take(size_t bytes);
/* Bytes of the range made usable so far (what the structs cost in memory, at most). */
size_t sp__arena_committed(void);
/* Bytes handed out so far. */
size_t sp__arena_used(void);
/* Tests only: let takes reach at most `bytes` from the base (0: no limit); returns the old. */
size_t sp__arena_set_limit(size_t bytes);

static inline void *sp__ref_ptr(sp_ref_t r) {
    return sp__arena_base + r;
}

/* The arena lies inside one 2^32-aligned window that starts at sp__arena_base, so the offset
 * from the base is the address cut to 32 bits: no base needed, no instruction. */
static inline sp_ref_t sp__ptr_ref(const void *p) {
    return (sp_ref_t)(uintptr_t)p;
}

/* Block refs: sp__blk / sp__bref for a ref or struct known to exist, the 0 forms for either. */
static inline struct sp_block *sp__blk(sp_ref_t r) {
    return (struct sp_block *)sp__ref_ptr(r);
}

static inline struct sp_block *sp__blk0(sp_ref_t r) {
    return r ? sp__blk(r) : NULL;
}

static inline sp_ref_t sp__bref(const struct sp_block *b) {
    return sp__ptr_ref(b);
}

static inline sp_ref_t sp__bref0(const struct sp_block *b) {
    return b ? sp__bref(b) : 0;
}

/* A block is in one of four states: allocated (in the pointer map), pending (freed, waiting for
 * events), free (in its block pool's set) or unmapped (expandable address space, on its bpool's
 * unmapped list), or idle on the device's spare list. Fields used in disjoint states share
 * storage, which keeps a block at 56 bytes: the pointer-map chain, the tree's parent link and
 * a pending free's event count; the recorded streams (or the
 * owner thread cache: a block in a thread cache has none) and the tree's (or unmapped list's)
 * two child links. The word of the parent link is zero whenever a block is in none of those
 * states (a set removal and a pointer-map removal clear it, new structs are zeroed), so outside
 * the pending state the event count reads 0 (sp__block_pending). Links are refs (above). */
typedef struct sp_block {
    uintptr_t addr; /* start address (lock) */
    size_t size;    /* bytes, a multiple of 512 (lock) */
    /* The caller's size while allocated or pending. Free or unmapped, what PyTorch's Block
     * object keeps there (its snapshot shows it for inactive blocks): the size last requested
     * through this block, which a free keeps on the merged block whichever struct holds it, a
     * split's remainder keeps from the block it was cut from, and a struct made for new space
     * (a new segment, an unmapped rest, the free pieces around an unmap) starts at 0 (lock).
     * The GC clock lives in the segment (gc_clock), so this field is never shared. */
    size_t requested;
    union {
        struct {
            sp_ref_t left;  /* free-set tree links while in_set; the unmapped list's (lock) */
            sp_ref_t right; /* (lock) */
        };
        sp_block_uses_t *uses;      /* while allocated and in no thread cache: its recorded streams,
                                     * or NULL (lock); read through sp__block_has_uses */
        struct sp_tcache *tc_owner; /* while allocated and in a thread cache (thread_cache.h) */
    };
    /* prev and next are not adjacent: the compiler would read both as one 8-byte word (is the
     * block split?), and right after a store of one of them (a split, a merge) such a load
     * cannot take its data from the store buffer and waits for the store to reach the cache. */
    sp_ref_t prev; /* lower neighbour in the segment, 0 at its start (lock) */
    union {
        sp_ref_t parent;     /* free-set tree link while in_set (lock) */
        sp_ref_t hnext;      /* pointer-map chain while allocated; spare list while idle */
        int32_t event_count; /* outstanding events while pending (lock) */
    };
    sp_ref_t next;    /* higher neighbour in the segment (lock) */
    uint32_t context; /* history context of the allocation, 0 if none (lock) */
    sp_ref_t seg;     /* owning segment (const; 0 while idle on the spare list) */
    int8_t bal;       /* AVL balance while in_set (block_set.c); SP_TC_MARK while allocated and
                       * in a thread cache (thread_cache.h), else 0 (lock) */
    bool allocated;   /* handed out and not yet freed (lock) */
    bool in_set;      /* in its bpool's free set (lock) */
    bool unmapped;    /* expandable: address space without memory; in its bpool's
                       * unmapped list (chained by left/right), never in a set (lock) */
} sp_block_t;

/* Is b a pending free (freed, waiting for events)? */
static inline bool sp__block_pending(const sp_block_t *b) {
    return !b->allocated && !b->in_set && !b->unmapped && b->event_count != 0;
}

/* `bal` of a block in a thread cache (thread_cache.h). A free set's removal leaves 0 there, so
 * an allocated block holds the mark only when a thread cache set it. */
#define SP_BLOCK_TC_MARK ((int8_t)-1)

/* Does b have recorded streams that its free must wait for? Only an allocated block can (a free
 * consumes them before the block becomes pending, free or unmapped, whose `left` shares the
 * storage), and one in a thread cache has none (its storage holds the owner). */
static inline bool sp__block_has_uses(const sp_block_t *b) {
    return b->allocated && b->bal != SP_BLOCK_TC_MARK && b->uses != NULL;
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
    bool orphan;                /* its stream was destroyed while it held live blocks (lock) */
    size_t page;                /* expandable: bytes per mapped page (const) */
    size_t mapped;              /* expandable: bytes mapped (lock) */
    uintptr_t *bidx_addr;       /* lookup index: block starts when last built, sorted (lock) */
    struct sp_block **bidx_blk; /* the blocks at those starts; validated on use (lock) */
    size_t bidx_n;              /* entries (lock) */
    size_t bidx_cap;            /* capacity of both arrays (lock) */
    struct sp_segment *pprev;   /* pool's segment list, in seq order (lock) */
    struct sp_segment *pnext;   /* (lock) */
    /* The GC clock (PyTorch's gc_count_base, kept on its block): its bpool's get_free_block
     * count when the segment last became one whole free block. GC reads it only for a whole
     * free segment, which becomes one only as a block covering it all enters the free set (a
     * free, merging or not; an expandable map), which sets it: the value PyTorch's block then
     * holds. A split's free remainder needs none (never whole). Kept here, a free block's
     * struct has room for its requested size (lock). */
    uint64_t gc_clock;
} sp_segment_t;

/* A segment struct takes this many block structs' room in a slab (allocator.c). */
#define SP_SEG_SLOTS ((sizeof(sp_segment_t) + sizeof(sp_block_t) - 1) / sizeof(sp_block_t))

static inline sp_segment_t *sp__seg(sp_ref_t r) {
    return (sp_segment_t *)sp__ref_ptr(r);
}

/* b's segment (b not idle). */
static inline sp_segment_t *sp__bseg(const sp_block_t *b) {
    return sp__seg(b->seg);
}

/* A block's allocation stream: its segment's (every block of a segment has the segment's
 * stream, so the block keeps none of its own). */
static inline sp_stream_t sp__block_stream(const sp_block_t *b) {
    return sp__bseg(b)->stream;
}

/* b's neighbours in its segment, NULL at either end. */
static inline sp_block_t *sp__block_prev(const sp_block_t *b) {
    return sp__blk0(b->prev);
}

static inline sp_block_t *sp__block_next(const sp_block_t *b) {
    return sp__blk0(b->next);
}

/* Put a (ref ra) into b's segment list right before b (seg: b's segment; a takes b's place as
 * the head if b was it). */
static inline void sp__block_link_before_ref(sp_block_t *a, sp_ref_t ra, sp_block_t *b,
                                             sp_segment_t *seg) {
    a->prev = b->prev;
    a->next = sp__bref(b);
    if (a->prev)
        sp__blk(a->prev)->next = ra;
    else
        seg->head = a;
    b->prev = ra;
}

static inline void sp__block_link_before(sp_block_t *a, sp_block_t *b) {
    sp__block_link_before_ref(a, sp__bref(a), b, sp__bseg(b));
}

/* Put a into b's segment list right after b. */
static inline void sp__block_link_after(sp_block_t *a, sp_block_t *b) {
    sp_ref_t ra = sp__bref(a);
    a->prev = sp__bref(b);
    a->next = b->next;
    if (b->next)
        sp__blk(b->next)->prev = ra;
    b->next = ra;
}

#endif /* SP_POOL_BLOCK_H */
