/*
 * replay.c: `sympool replay TRACE`: replays a PyTorch memory snapshot's trace through sympool on
 * the host backend and compares our peaks with what PyTorch reserved in the recorded run.
 *
 * The replay makes the same requests in the same order: first the seeds (blocks live before
 * recording began, trace.c), then every `alloc` (sp_malloc of the recorded request on a stream
 * mapped from the recorded one) and every `free_requested` (sp_free of the block that the
 * recorded address maps to). free_completed, segment and oom events are PyTorch's own decisions
 * and are only used for the comparison. Addresses are mapped through a hash map; an allocation
 * that fails with OUT_OF_MEMORY (with --capacity) is counted and its later free skipped.
 * No globals, no lock: one replay at a time per process.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sympool/sympool.h>

#include "sympool/experimental.h" /* sp_x_option_set: the CLI's --conf and --capacity */

#include "tools/cli.h"

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* An alloc's or free's slot in dev_state_t.ptrs (NO_SLOT: none), and for an alloc the slot that
 * held the same recorded address before it (NO_SLOT: none). */
#define NO_SLOT UINT32_MAX

/* The event loop's rare branches, laid out off its straight path. */
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
typedef struct slot_ref {
    uint32_t slot, prev;
} slot_ref_t;

/* One step of the event loop: an event that asks something of sympool, with what the loop needs
 * of it resolved before the clock starts (plan_slots). Events that ask nothing (segment and oom
 * events but an empty_cache's first, snapshots, and free_completed when no free was deferred)
 * have none. 32 bytes, where a trace event and its slots took 56. */
typedef enum { OP_ALLOC, OP_FREE, OP_FREE_COMPLETED, OP_EMPTY_CACHE } op_kind_t;
/* op_t.flags beside the event's TR_F_*: the recorded user_metadata changes at this op (the next
 * of dev_state_t.meta is set before it, when the replay writes a snapshot). */
#define OPF_META 0x80u
/* op_t.flags: the recorded run made a segment for this alloc (dev_state_t.place says where). */
#define OPF_SEG 0x40u
_Static_assert(((TR_F_DEFERRED | TR_F_EMPTY_CACHE | TR_F_POOL_ID | TR_F_COMPLETION |
                 TR_F_MAYBE_GC) &
                (OPF_META | OPF_SEG)) == 0,
               "op flags overlap the trace's");
typedef struct op {
    uint64_t size;   /* alloc: the requested bytes */
    slot_ref_t at;   /* alloc and free: its slot and the slot it replaces */
    uint32_t ev;     /* its event's index in the device's events */
    uint32_t stream; /* alloc: index into dev_state_t.scache (0: the default stream) */
    uint16_t pool;   /* alloc: the event's pool */
    uint8_t kind;    /* op_kind_t */
    uint8_t flags;   /* the event's TR_F_* */
} op_t;

typedef struct dev_state {
    tr_map_t blocks;        /* recorded address -> our pointer */
    tr_map_t streams;       /* recorded stream -> sp_stream_t */
    tr_map_t pending;       /* recorded address of a deferred free -> its side stream */
    sp_stream_t *side;      /* side streams not holding a pending free */
    size_t nside, cap_side; /* entries / capacity of side */
    sp_stream_t *all_side;  /* every side stream made (destroyed at the end) */
    size_t nall_side, cap_all_side;
    sp_mempool_t **pools; /* the trace's private pools, by index */
    size_t npools;
    void **holes; /* placeholders of the starting state's free space */
    size_t nholes, cap_holes;
    /* free space of the starting state whose requested size the original shows (the address of
     * its first placeholder, the size), set once the placeholders are given back */
    struct carry {
        void *at;
        uint64_t req;
    } * carry;
    size_t ncarry, cap_carry;
    void **unmapped; /* blocks over the unmapped pages between two mapped ranges of one
                      * expandable segment at the start, unmapped once the state is built */
    size_t nunmapped, cap_unmapped;
    size_t *whole; /* sblocks (index) taken at their recorded size, asked again at the
                    * end of their segment's rebuild (build_segment) */
    size_t nwhole, cap_whole;
    void **kept; /* starting blocks an inconsistent trace gave an address that another one
                  * took after them: held to the end, as the address map held them (put_block) */
    size_t nkept, cap_kept;
    /* The event loop's address map, resolved before the clock starts (plan_slots): every block
     * the replay can hold has a slot, every alloc and free event knows its slot. */
    void **ptrs;         /* slot -> our pointer, NULL when it holds none */
    size_t nptrs;        /* slots */
    op_t *ops;           /* the loop's steps, in event order */
    size_t nops;         /* entries in ops */
    sp_stream_t *scache; /* stream index -> our stream, NULL until the loop first needs it */
    uint64_t *srecorded; /* stream index -> the recorded stream */
    /* The user_metadata texts the loop sets, in op order: one per op flagged OPF_META (NULL:
     * ""). None when every entry's is "" (the usual case). */
    const tr_meta_t **meta;
    size_t nmeta;
    /* Where the recorded run put its segments (sp_x_host_place): `placing` when the host
     * backend places them; offsets from rec_base (the lowest recorded segment address, 2 MiB
     * down). place: for each op flagged OPF_SEG, the segments its event made, in op order. */
    bool placing;
    uint64_t rec_base;
    struct place {
        size_t op;
        uint64_t size, offset;
    } * place;
    size_t nplace, cap_place;
} dev_state_t;

/* The recorded stack handed to the history hook while a snapshot of the replay is recorded,
 * so that our snapshot shows the original frames. */
typedef struct frames_src {
    const pk_value_t *frames; /* list of frame dicts, or NULL */
    char *buf;                /* the C forms of the strings of one call that hold a U+0000 */
    size_t cap;               /* its bytes */
} frames_src_t;

/* The n bytes at s into out (room for 2 * n + 1) as the history takes a string: each U+0000 (a 0
 * byte) as 0xC0 0x80, which the snapshot writer turns back into U+0000; then a terminating 0.
 * Returns where that 0 is. */
static char *escape_nul(char *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\0') {
            *out++ = (char)0xc0;
            *out++ = (char)0x80;
        } else {
            *out++ = s[i];
        }
    }
    *out = '\0';
    return out;
}

/* A frame's string as the history takes it, a C string: a str holding U+0000 (a 0 byte in the
 * document) has it as 0xC0 0x80 there, which the snapshot writer turns back into U+0000. *at
 * walks fs->buf (NULL: only count the bytes needed into *need). */
static const char *frame_str(const pk_value_t *f, const char *key, char **at, size_t *need) {
    const pk_value_t *v = pk_get(f, key);
    const char *s = pk_str(v);
    if (s == NULL)
        return "??";
    size_t n = v->u.str.len;
    if (memchr(s, 0, n) == NULL)
        return s;
    if (*at == NULL) {
        *need += 2 * n + 1;
        return s;
    }
    char *out = *at;
    *at = escape_nul(out, s, n) + 1;
    return out;
}

/* n bytes of a str as the history takes them (escape_nul), in a new C string. NULL: out of
 * memory. */
static char *c_bytes(const char *s, size_t n) {
    char *out = malloc(2 * n + 1);
    if (out != NULL)
        escape_nul(out, s, n);
    return out;
}

/* c_bytes of the str v; NULL: v is no str, or out of memory. */
static char *c_text(const pk_value_t *v) {
    const char *s = pk_str(v);
    return s != NULL ? c_bytes(s, v->u.str.len) : NULL;
}

/* A frame's line as the history takes it. PyTorch's line is an unsigned 64-bit number: a line
 * it could not tell (-1 where it was read) is written as 2^64-1, which no int64 holds and was
 * read as 0; it is the negative int it was (the snapshot writer writes a negative line back in
 * that form). pk_get_int first, its result taken as before (the replay loop with --snapshot
 * reads a line for every frame it records); the second lookup only for a line no int64 holds. */
/* A frame's line as sp_history_frame_t holds it (an int; a negative one is written back in
 * PyTorch's unsigned form). A line no int holds is PyTorch's "could not tell" (2^64-1): cast, 2^31
 * came back as 2^64-2^31 and 2^32 as 0. */
static int frame_line(const pk_value_t *f) {
    int64_t i = 0;
    uint64_t u = 0;
    if (pk_get_int(f, "line", &i))
        return i >= INT_MIN && i <= INT_MAX ? (int)i : -1;
    if (pk_get_uint(f, "line", &u) && u >= (uint64_t)(int64_t)INT_MIN)
        return (int)(int64_t)u;
    return u > INT_MAX ? -1 : 0;
}

static size_t frames_hook(sp_history_frame_t *out, size_t max, void *arg) {
    frames_src_t *fs = arg;
    size_t n = pk_len(fs->frames), k = 0, need = 0;
    char *at = NULL;
    for (size_t i = 0; i < n && i < max; i++) { /* the room the strings with a U+0000 need */
        (void)frame_str(pk_at(fs->frames, i), "name", &at, &need);
        (void)frame_str(pk_at(fs->frames, i), "filename", &at, &need);
    }
    if (need > fs->cap) {
        char *nb = realloc(fs->buf, need);
        if (nb != NULL) {
            fs->buf = nb;
            fs->cap = need;
        }
    }
    at = need > 0 && need <= fs->cap ? fs->buf : NULL; /* else (out of memory) cut at the 0 */
    for (size_t i = 0; i < n && k < max; i++) {
        const pk_value_t *f = pk_at(fs->frames, i);
        const char *name = frame_str(f, "name", &at, &need);
        const char *file = frame_str(f, "filename", &at, &need);
        out[k++] = (sp_history_frame_t){name, file, frame_line(f)};
    }
    return k;
}

static bool push_ptr(void ***arr, size_t *n, size_t *cap, void *p) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        void **na = realloc(*arr, nc * sizeof(*na));
        if (na == NULL)
            return false;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = p;
    return true;
}

static bool stream_for(dev_state_t *ds, int dev, uint64_t recorded, sp_stream_t *s_p, char *err,
                       size_t errlen) {
    uintptr_t v;
    if (recorded == 0) {
        *s_p = NULL;
        return true;
    }
    if (tr_map_get(&ds->streams, recorded, &v)) {
        *s_p = (sp_stream_t)v;
        return true;
    }
    sp_stream_t s;
    sp_status_t st = sp_stream_create(dev, &s);
    if (st != SP_SUCCESS) {
        snprintf(err, errlen, "sp_stream_create: %s: %s", sp_status_name(st), sp_last_error());
        return false;
    }
    if (!tr_map_put(&ds->streams, recorded, (uintptr_t)s)) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
    /* Our snapshot shows the recorded stream, not our handle (which only says in which order
     * the replay made it). */
    st = sp_x_stream_label(s, recorded);
    if (st != SP_SUCCESS) {
        snprintf(err, errlen, "sp_x_stream_label: %s: %s", sp_status_name(st), sp_last_error());
        return false;
    }
    *s_p = s;
    return true;
}

/* One request to the pool the recorded one went to. */
static sp_status_t request(dev_state_t *ds, int dev, uint16_t pool, size_t size, sp_stream_t s,
                           void **p) {
    if (pool > 0 && pool <= ds->npools)
        return sp_mempool_malloc(ds->pools[pool - 1], size, s, p);
    return sp_malloc(size, dev, s, p);
}

/* One allocation's request; OOM is counted (*p_out NULL), anything else is an error. */
static bool alloc_request(dev_state_t *ds, int dev, uint64_t size, uint64_t stream, uint16_t pool,
                          replay_result_t *r, char *err, size_t errlen, void **p_out) {
    sp_stream_t s;
    *p_out = NULL;
    if (!stream_for(ds, dev, stream, &s, err, errlen))
        return false;
    sp_status_t st = request(ds, dev, pool, (size_t)size, s, p_out);
    if (st == SP_ERR_OUT_OF_MEMORY) {
        r->ooms++;
        *p_out = NULL;
        return true;
    }
    if (st != SP_SUCCESS) {
        snprintf(err, errlen, "sp_malloc(%llu): %s: %s", (unsigned long long)size,
                 sp_status_name(st), sp_last_error());
        return false;
    }
    return true;
}

/* p, our block for the recorded address addr, into the address map. A block the map held for
 * addr before (two starting blocks at one address: an inconsistent trace) stays allocated, as
 * the map's overwrite left it, and is given back at the end with the others (free_all). */
static bool put_block(dev_state_t *ds, uint64_t addr, void *p) {
    bool added = false;
    uintptr_t *at = tr_map_upsert(&ds->blocks, addr, &added);
    if (at == NULL || (*at != 0 && !push_ptr(&ds->kept, &ds->nkept, &ds->cap_kept, (void *)*at)))
        return false;
    *at = (uintptr_t)p;
    return true;
}

/* One allocation of the starting state, kept in the address map. */
static bool do_alloc(dev_state_t *ds, int dev, uint64_t addr, uint64_t size, uint64_t stream,
                     uint16_t pool, replay_result_t *r, char *err, size_t errlen) {
    void *p;
    if (!alloc_request(ds, dev, size, stream, pool, r, err, errlen, &p))
        return false;
    if (p == NULL)
        return true; /* OOM or a 0-byte request: nothing to free later */
    if (!put_block(ds, addr, p)) {
        sp_free(p);
        snprintf(err, errlen, "out of memory");
        return false;
    }
    return true;
}

/* One allocation of the event loop, kept in its slot. What the address map did is kept
 * exactly: a block that comes out takes the address's entry (the block it replaces is freed by
 * no event, only at the end), and an OOM or a 0-byte request leaves the address's earlier block
 * where it was, for the next free of that address. The stream is the op's, made at its first use
 * as alloc_request's stream_for made it. */
static inline bool do_alloc_op(dev_state_t *ds, int dev, const op_t *o, replay_result_t *r,
                               char *err, size_t errlen) {
    sp_stream_t s = ds->scache[o->stream];
    if (UNLIKELY(s == NULL) && o->stream != 0) {
        if (!stream_for(ds, dev, ds->srecorded[o->stream], &s, err, errlen))
            return false;
        ds->scache[o->stream] = s;
    }
    void *p = NULL;
    sp_status_t st = request(ds, dev, o->pool, (size_t)o->size, s, &p);
    if (UNLIKELY(st != SP_SUCCESS)) {
        if (st != SP_ERR_OUT_OF_MEMORY) {
            snprintf(err, errlen, "sp_malloc(%llu): %s: %s", (unsigned long long)o->size,
                     sp_status_name(st), sp_last_error());
            return false;
        }
        r->ooms++;
        p = NULL;
    }
    slot_ref_t at = o->at;
    if (UNLIKELY(at.slot == NO_SLOT)) { /* address 0: the address map refused it */
        if (p != NULL) {
            sp_free(p);
            snprintf(err, errlen, "out of memory");
            return false;
        }
        return true;
    }
    void *prev = NULL;
    if (UNLIKELY(p == NULL) && at.prev != NO_SLOT) {
        prev = ds->ptrs[at.prev];
        ds->ptrs[at.prev] = NULL;
    }
    /* A block that comes out leaves the one it replaces in that one's slot, which no later op
     * names (a later event at the address names this alloc's slot): held to the end, as the
     * address map held it, and given back with every other block by free_all. */
    ds->ptrs[at.slot] = p != NULL ? p : prev;
    return true;
}

/* Uses p on a side stream of the device and keeps that stream under the recorded address, so
 * that p's free stays pending until the address's free_completed synchronizes it (or to the
 * end). */
static bool hold_for_side(dev_state_t *ds, int dev, uintptr_t p, uint64_t addr, sp_status_t *st,
                          char *err, size_t errlen) {
    sp_stream_t side = NULL;
    if (ds->nside > 0) {
        side = ds->side[--ds->nside];
    } else {
        *st = sp_stream_create(dev, &side);
        if (*st == SP_SUCCESS &&
            !push_ptr((void ***)&ds->all_side, &ds->nall_side, &ds->cap_all_side, side)) {
            (void)sp_stream_destroy(side);
            snprintf(err, errlen, "out of memory");
            return false;
        }
    }
    if (*st == SP_SUCCESS)
        *st = sp_record_stream((void *)p, side);
    if (*st == SP_SUCCESS && !tr_map_put(&ds->pending, addr, (uintptr_t)side)) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
    return true;
}

/* A free. A deferred one (PyTorch held the block for other streams' work) is used on a side
 * stream first, so that it stays pending until its free_completed synchronizes that stream. */
static inline bool do_free_op(dev_state_t *ds, int dev, const tr_event_t *ev, const op_t *o,
                              replay_result_t *r, char *err, size_t errlen) {
    uint32_t slot = o->at.slot;
    uintptr_t p = slot == NO_SLOT ? 0 : (uintptr_t)ds->ptrs[slot];
    if (UNLIKELY(p == 0)) {
        r->skipped_frees++;
        return true;
    }
    ds->ptrs[slot] = NULL;
    sp_status_t st = SP_SUCCESS;
    if (UNLIKELY(o->flags & TR_F_DEFERRED)) {
        if (!hold_for_side(ds, dev, p, ev[o->ev].addr, &st, err, errlen))
            return false;
        r->deferred_frees++;
    }
    if (LIKELY(st == SP_SUCCESS))
        st = sp_free((void *)p);
    if (UNLIKELY(st != SP_SUCCESS)) {
        snprintf(err, errlen, "sp_free: %s: %s", sp_status_name(st), sp_last_error());
        return false;
    }
    return true;
}

/* PyTorch saw the deferred free's events done: our side stream's work completes too (the block
 * returns to the cache at the next malloc, as PyTorch's process_events does). */
static bool do_free_completed(dev_state_t *ds, uint64_t addr, char *err, size_t errlen) {
    uintptr_t side;
    if (!tr_map_del(&ds->pending, addr, &side))
        return true;
    sp_status_t st = sp_stream_synchronize((sp_stream_t)side);
    if (st != SP_SUCCESS ||
        !push_ptr((void ***)&ds->side, &ds->nside, &ds->cap_side, (void *)side)) {
        snprintf(err, errlen, "sp_stream_synchronize: %s", sp_last_error());
        return false;
    }
    return true;
}

/* Whether the next malloc on dev that allocates a segment collects garbage first: a threshold
 * in force under a fraction below 1, and reserved memory past threshold x the fraction's bytes
 * (sp__alloc_gc's test, PyTorch's garbage_collect_cached_blocks'). A run of segment frees the
 * trace may show either way (TR_F_MAYBE_GC) was that collection only then: a malloc under the
 * threshold collects nothing, so the run was the user's empty_cache before it (the recorded
 * run's own snapshots, 3% of their peaks off when such a run was left to a collection that
 * never came). */
static int64_t stat_of(int dev, const char *key);
static bool collects_next(int dev) {
    sp_x_option_info_t info;
    double f = 1.0;
    size_t free_b = 0, total = 0;
    if (!cli_option("SYMPOOL_GC_THRESHOLD", &info) || !(info.value_double > 0) ||
        sp_get_memory_fraction(dev, &f) != SP_SUCCESS || !(f < 1.0) ||
        sp_get_memory_info(dev, &free_b, &total) != SP_SUCCESS)
        return false;
    size_t allowed = (size_t)(f * (double)total);
    size_t thresh = (size_t)(info.value_double * (double)allowed);
    return (uint64_t)stat_of(dev, "reserved_bytes.all.current") > thresh;
}

/* The user's empty_cache on this device, and the private pools whose segments it freed
 * (PyTorch frees a pool's cache there only once the pool is no longer used). A run that frees
 * only private pools' segments is a pool's own release (its MemPool going away): the default
 * pool's cache stays, as the trace shows it did. */
static bool do_empty_cache(dev_state_t *ds, int dev, const tr_event_t *e, const tr_event_t *end,
                           replay_result_t *r, char *err, size_t errlen) {
    if ((e->flags & TR_F_MAYBE_GC) && collects_next(dev)) {
        r->gc_runs++;
        return true; /* the malloc after it releases them, as the recorded one did */
    }
    r->empty_caches++;
    bool pools_only = true;
    const tr_event_t *run_end = e;
    for (; run_end < end &&
           (run_end->action == TR_SEGMENT_FREE || run_end->action == TR_SEGMENT_UNMAP);
         run_end++)
        if (run_end->pool == 0 || run_end->pool > ds->npools)
            pools_only = false;
    sp_status_t st = pools_only ? SP_SUCCESS : sp_x_empty_cache_device(dev);
    for (; st == SP_SUCCESS && e < run_end; e++)
        if (e->pool > 0 && e->pool <= ds->npools)
            st = sp_mempool_free_all_blocks(ds->pools[e->pool - 1], NULL);
    if (st != SP_SUCCESS) {
        snprintf(err, errlen, "empty_cache: %s", sp_last_error());
        return false;
    }
    return true;
}

/* One segment as it was before recording began: the whole segment is requested once (so that
 * the allocator makes a segment of its size) and given back, then carved in address order:
 * its live blocks (kept, their recorded addresses mapped) and placeholders for the free space
 * between them (given back once every start segment of the device is built, so they merge into
 * the free blocks PyTorch had). While it is being carved every earlier start segment is full,
 * so the carving can only come from this one. */
/* ---- placement: segments where the recorded GPU had them ------------------------------- */

/* The lowest recorded segment address of the device (the starting state's and every
 * segment_alloc's), 2 MiB down, and whether the host backend places segments: then the replay
 * places each one the recorded run made at its recorded offset from there (sp_x_host_place), so
 * that ties among free blocks of one size go to the block the recorded run took. */
static void place_begin(dev_state_t *ds, int d, const tr_device_t *td) {
    uint64_t lo = UINT64_MAX;
    for (size_t i = 0; i < td->nstart; i++)
        lo = td->start[i].addr < lo ? td->start[i].addr : lo;
    for (size_t i = 0; i < td->nev; i++)
        if (td->ev[i].action == TR_SEGMENT_ALLOC && td->ev[i].addr < lo)
            lo = td->ev[i].addr;
    ds->rec_base = lo & ~(((uint64_t)2 << 20) - 1);
    ds->placing = lo != UINT64_MAX && sp_x_host_place(d, 0, 0) == SP_SUCCESS;
}

/* The next device allocation of `size` bytes goes where the recorded segment at `addr` was. */
static void place_one(const dev_state_t *ds, int d, uint64_t addr, uint64_t size) {
    if (ds->placing && addr >= ds->rec_base && (addr - ds->rec_base) % 512 == 0)
        (void)sp_x_host_place(d, (size_t)size, addr - ds->rec_base);
}

/* Remember that op number `op` made a segment at addr in the recorded run. */
static bool place_push(dev_state_t *ds, size_t op, uint64_t addr, uint64_t size) {
    if (!ds->placing || addr < ds->rec_base || (addr - ds->rec_base) % 512 != 0)
        return true; /* a segment no GPU made (unaligned): carved as without placement */
    if (ds->nplace == ds->cap_place) {
        size_t nc = ds->cap_place ? ds->cap_place * 2 : 64;
        struct place *np = realloc(ds->place, nc * sizeof(*np));
        if (np == NULL)
            return false;
        ds->place = np;
        ds->cap_place = nc;
    }
    ds->place[ds->nplace++] = (struct place){op, size, addr - ds->rec_base};
    return true;
}

/* Before the op flagged OPF_SEG numbered `op`: its recorded segments wait for it (*cursor walks
 * ds->place, past the entries of ops that asked nothing of sympool). */
static void place_for_op(const dev_state_t *ds, int d, size_t op, size_t *cursor) {
    size_t c = *cursor;
    while (c < ds->nplace && ds->place[c].op < op)
        c++;
    for (; c < ds->nplace && ds->place[c].op == op; c++)
        (void)sp_x_host_place(d, (size_t)ds->place[c].size, ds->place[c].offset);
    *cursor = c;
}

/* The recorded run's free block [lo, hi) of a start segment, which no event touches, showed a
 * requested size (PyTorch keeps the freed block's on it, which a split's remainder keeps too:
 * it may exceed the block's size): once the placeholders of that free space are given back, the
 * free block they leave at `first` (the first one's address) is to show it (build_start). */
static bool carry_requested(dev_state_t *ds, const tr_device_t *td, uint64_t lo, uint64_t hi,
                            void *first) {
    const tr_sfree_t *f = tr_sfree_at(td, lo);
    if (f == NULL || f->size != hi - lo)
        return true;
    if (ds->ncarry == ds->cap_carry) {
        size_t nc = ds->cap_carry ? ds->cap_carry * 2 : 16;
        struct carry *na = realloc(ds->carry, nc * sizeof(*na));
        if (na == NULL)
            return false;
        ds->carry = na;
        ds->cap_carry = nc;
    }
    ds->carry[ds->ncarry++] = (struct carry){first, f->req};
    return true;
}

static bool build_segment(dev_state_t *ds, int dev, const tr_device_t *td, const tr_sseg_t *sg,
                          frames_src_t *fs, replay_result_t *r, char *err, size_t errlen) {
    const size_t small_max = (size_t)1 << 20;
    sp_stream_t s;
    if (!stream_for(ds, dev, sg->stream, &s, err, errlen))
        return false;
    void *p = NULL;
    sp_status_t st = SP_SUCCESS;
    place_one(ds, dev, sg->addr, sg->size); /* taken by this segment's first request */
    if (!sg->is_small) {
        /* The request that makes the segment gives it its recorded stack (a snapshot of the
         * replay shows it while the segment is never split, as the original's does; its first
         * split drops it). A small segment's never shows one: its first request splits it. */
        fs->frames = sg->frames;
        st = request(ds, dev, sg->pool, (size_t)sg->size, s, &p);
        fs->frames = NULL;
        if (st == SP_SUCCESS)
            st = sp_free(p);
    }
    uint64_t at = sg->addr, end = sg->addr + sg->size;
    for (size_t i = 0; st == SP_SUCCESS && i <= sg->n; i++) {
        const tr_sblock_t *b = i < sg->n ? &td->sblocks[sg->first + i] : NULL;
        uint64_t gap_end = b ? b->addr : end, gap_at = at;
        void *first = NULL; /* the free space's first placeholder */
        /* Free space before the block (or at the segment's end): placeholders the pool of
         * this segment accepts (the small pool takes requests up to 1 MiB). */
        while (st == SP_SUCCESS && at < gap_end) {
            uint64_t n = gap_end - at;
            if (sg->is_small && n > small_max)
                n = small_max;
            if (!sg->is_small && n <= small_max)
                break; /* the block before absorbs it: PyTorch does not split off <= 1 MiB */
            st = request(ds, dev, sg->pool, (size_t)n, s, &p);
            if (st == SP_SUCCESS && p != NULL &&
                !push_ptr(&ds->holes, &ds->nholes, &ds->cap_holes, p)) {
                (void)sp_free(p);
                snprintf(err, errlen, "out of memory");
                return false;
            }
            if (first == NULL && st == SP_SUCCESS)
                first = p;
            at += n;
        }
        if (st == SP_SUCCESS && first != NULL && at == gap_end && td->nsfree > 0 &&
            !carry_requested(ds, td, gap_at, gap_end, first)) {
            snprintf(err, errlen, "out of memory");
            return false;
        }
        if (b == NULL || st != SP_SUCCESS)
            break;
        at = b->addr;
        /* Its recorded request (the stats then match the recorded run's); a block that a
         * request of another pool's size made whole keeps its own size. */
        uint64_t want = b->req;
        if (!sg->is_small && b->size <= small_max) {
            at += b->size;
            continue; /* not a large-pool request: left to the free space */
        }
        if (!sg->is_small && want <= small_max)
            want = b->size;
        if (sg->is_small && want > small_max)
            want = small_max;
        /* A large block 512 bytes or more above its request kept a remainder PyTorch did not
         * split off (1 MiB or less): its request alone would make it smaller here, and every
         * block after it would lie lower than it lay. It is taken at its recorded size first,
         * and asked again once the segment is laid out, in a place it then fills whole. */
        bool whole = !sg->is_small && b->size - want >= 512;
        if (whole) {
            if (ds->nwhole == ds->cap_whole) {
                size_t nc = ds->cap_whole ? 2 * ds->cap_whole : 16;
                size_t *nw = realloc(ds->whole, nc * sizeof(*nw));
                if (nw == NULL) {
                    snprintf(err, errlen, "out of memory");
                    return false;
                }
                ds->whole = nw;
                ds->cap_whole = nc;
            }
            ds->whole[ds->nwhole++] = sg->first + i;
        }
        fs->frames = b->frames;
        p = NULL;
        st = request(ds, dev, sg->pool, (size_t)(whole ? b->size : want), s, &p);
        if (st == SP_SUCCESS && p != NULL && !put_block(ds, b->addr, p)) {
            (void)sp_free(p);
            snprintf(err, errlen, "out of memory");
            return false;
        }
        r->start_blocks++;
        at = b->addr + b->size;
    }
    /* The blocks taken whole, given back and asked again: the only free space around each is
     * its own place (the segment's other blocks and free space are held), which the request
     * fills without a split. */
    for (size_t k = 0; st == SP_SUCCESS && k < ds->nwhole; k++) {
        const tr_sblock_t *b = &td->sblocks[ds->whole[k]];
        uintptr_t v = 0;
        if (!tr_map_get(&ds->blocks, b->addr, &v) || v == 0)
            continue; /* not placed (an OOM) */
        st = sp_free((void *)v);
        /* Given back: the address holds nothing until the request below gives it a block (an
         * OOM there leaves it without one, never with the freed pointer). */
        if (st == SP_SUCCESS)
            (void)tr_map_del(&ds->blocks, b->addr, NULL);
        fs->frames = b->frames;
        void *q = NULL;
        if (st == SP_SUCCESS)
            st = request(ds, dev, sg->pool, (size_t)b->req, s, &q);
        if (st == SP_SUCCESS && q != NULL && !put_block(ds, b->addr, q)) {
            (void)sp_free(q);
            snprintf(err, errlen, "out of memory");
            return false;
        }
    }
    ds->nwhole = 0;
    fs->frames = NULL;
    if (ds->placing) /* not taken (our segment had another size): it must not wait for another */
        (void)sp_x_host_place(dev, 0, 0);
    if (st == SP_ERR_OUT_OF_MEMORY) {
        r->ooms++;
        return true;
    }
    if (st != SP_SUCCESS) {
        snprintf(err, errlen, "starting state: %s: %s", sp_status_name(st), sp_last_error());
        return false;
    }
    return true;
}

/* What one replay made: with `release`, the blocks, streams and pools given back to sympool (a
 * later sp_shutdown needs them back); without, only the replay's own memory is freed, the rest
 * left to the process's exit. */
static void free_all(dev_state_t *ds, bool release) {
    for (size_t i = 0; release && i < ds->blocks.cap; i++)
        if (ds->blocks.slots[i].key != 0)
            (void)sp_free((void *)ds->blocks.slots[i].val);
    for (size_t i = 0; release && i < ds->nptrs; i++)
        if (ds->ptrs[i] != NULL)
            (void)sp_free(ds->ptrs[i]);
    for (size_t i = 0; release && i < ds->nholes; i++)
        (void)sp_free(ds->holes[i]);
    for (size_t i = 0; release && i < ds->nkept; i++)
        (void)sp_free(ds->kept[i]);
    for (size_t i = 0; release && i < ds->nunmapped; i++)
        (void)sp_free(ds->unmapped[i]);
    /* The cached segments in one pass first: destroying a stream releases its own, a walk of
     * every segment still cached, and a trace may have a stream per segment. */
    if (release)
        (void)sp_empty_cache();
    for (size_t i = 0; release && i < ds->nall_side; i++)
        (void)sp_stream_destroy(ds->all_side[i]);
    for (size_t i = 0; release && i < ds->streams.cap; i++)
        if (ds->streams.slots[i].key != 0)
            (void)sp_stream_destroy((sp_stream_t)ds->streams.slots[i].val);
    for (size_t i = 0; release && i < ds->npools; i++)
        if (ds->pools[i] != NULL)
            (void)sp_mempool_destroy(ds->pools[i]);
    tr_map_free(&ds->blocks);
    tr_map_free(&ds->streams);
    tr_map_free(&ds->pending);
    free(ds->side);
    free(ds->all_side);
    free(ds->pools);
    free(ds->holes);
    free(ds->carry);
    free(ds->unmapped);
    free(ds->whole);
    free(ds->kept);
    free(ds->ptrs);
    free(ds->ops);
    free(ds->place);
    free(ds->meta);
    free(ds->scache);
    free(ds->srecorded);
}

static int64_t stat_of(int dev, const char *key) {
    sp_stats_t st;
    int64_t v = 0;
    if (sp_memory_stats(dev, &st) == SP_SUCCESS)
        (void)sp_stats_get(&st, key, &v);
    return v;
}

/* bytes in whole 2 MiB pages: a GPU maps memory in pages of its allocation granularity, 2 MiB
 * on current GPUs, and every segment PyTorch's rules make (and ours) is a multiple of it. */
static int64_t page_round(int64_t bytes) {
    const int64_t page = (int64_t)2 << 20;
    return bytes > 0 ? (bytes + page - 1) / page * page : 0;
}

static bool history(sp_history_enabled_t enabled, char *err, size_t errlen) {
    sp_history_params_t hp;
    sp_history_params_init(&hp);
    hp.enabled = enabled;
    if (sp_record_memory_history(&hp) != SP_SUCCESS) {
        snprintf(err, errlen, "sp_record_memory_history: %s", sp_last_error());
        return false;
    }
    return true;
}

/* The unmapped pages between start segment i and the next one, when both are mapped ranges of
 * one expandable segment (same stream, pool and kind; ranges of one segment are next to each
 * other by address, its address space being one range): the bytes between them, else 0. */
static uint64_t gap_after(const tr_device_t *td, size_t i) {
    const tr_sseg_t *a = &td->start[i], *b = i + 1 < td->nstart ? &td->start[i + 1] : NULL;
    if (b == NULL || b->stream != a->stream || b->pool != a->pool || b->is_small != a->is_small ||
        b->addr <= a->addr + a->size)
        return 0;
    return b->addr - (a->addr + a->size);
}

/* Whether the pages held after start segment k may be unmapped as soon as segment k + 1 is
 * built: PyTorch (and sympool under its rules) grows a segment at the lowest unmapped address
 * that holds the request, so the later growths of the rebuild (the whole-range requests of the
 * segment's later large ranges, the pages held after them) must not fit there. The free space
 * around (at most 1 MiB at either end of a range is left unheld) counts; the small pool's
 * pages, taken 1 MiB at a time, stay held to the end. */
static bool gap_unmaps_early(const tr_device_t *td, size_t k) {
    const uint64_t room = gap_after(td, k) + ((uint64_t)2 << 20);
    if (td->start[k].is_small)
        return false;
    for (size_t j = k + 1; j < td->nstart; j++) {
        uint64_t g = gap_after(td, j);
        if ((j >= k + 2 && td->start[j].size <= room) || (g > 0 && g <= room))
            return false;
        if (g == 0)
            break; /* the segment's last range */
    }
    return true;
}

/* Whether the pages between the start's mapped ranges can be held while the state is built
 * (hold_unmapped): on the emulated device only (a GPU's own memory is not known here), and not
 * when, with the ranges, they would not fit there (its SYMPOOL_HOST_CAPACITY, under the recorded
 * memory fraction), where PyTorch had them unmapped: then none are held (a range could not be
 * rebuilt) and the ranges lie next to each other. */
static bool unmapped_fit(const tr_device_t *td, double fraction) {
    uint64_t now = 0, peak = 0, held_before = 0;
    bool any = false;
    for (size_t i = 0; i < td->nstart; i++) {
        now += td->start[i].size;
        peak = now > peak ? now : peak;
        if (held_before > 0 && gap_unmaps_early(td, i - 1))
            now -= held_before;
        held_before = gap_after(td, i);
        any = any || held_before > 0;
        now += held_before;
        peak = now > peak ? now : peak;
    }
    if (!any || strcmp(sp_backend_name(), "host") != 0)
        return false;
    sp_x_option_info_t oi;
    return cli_option("SYMPOOL_HOST_CAPACITY", &oi) &&
           (double)peak <= (double)oi.value_int * (fraction > 0 ? fraction : 1.0);
}

/* After start segment i of an expandable recording: when the next one is a mapped range of the
 * same expandable segment further up (gap_after), the pages between them were unmapped (the
 * trace's window began after they were). Mapped ranges are rebuilt one after the other, so
 * without these pages the next range would be mapped right after this one: its blocks would lie
 * lower than they lay, and the free space at this range's end would reach the next range's
 * blocks instead of unmapped pages, which a growth maps again (PyTorch grows at the lowest
 * unmapped address that holds the request). The pages are taken by requests here (the small
 * pool's of 1 MiB each), from ds->unmapped[*first] on, and unmapped once the next range is
 * built (gap_unmaps_early) or once every start segment is. When the device cannot map them
 * after all (unmapped_fit counted them), none are held. */
static bool hold_unmapped(dev_state_t *ds, int dev, const tr_device_t *td, size_t i, size_t *first,
                          char *err, size_t errlen) {
    const size_t small_max = (size_t)1 << 20;
    const tr_sseg_t *a = &td->start[i];
    *first = ds->nunmapped;
    sp_stream_t s;
    if (gap_after(td, i) > 0 && !stream_for(ds, dev, a->stream, &s, err, errlen))
        return false;
    for (uint64_t left = gap_after(td, i); left > 0;) {
        uint64_t n = a->is_small && left > small_max ? small_max : left;
        void *p = NULL;
        sp_status_t st = request(ds, dev, a->pool, (size_t)n, s, &p);
        if (st == SP_ERR_OUT_OF_MEMORY) { /* none held here: the next range lies next to it */
            for (size_t k = *first; k < ds->nunmapped; k++)
                (void)sp_free(ds->unmapped[k]);
            ds->nunmapped = *first;
            return true;
        }
        if (st != SP_SUCCESS) {
            snprintf(err, errlen, "starting state: %s: %s", sp_status_name(st), sp_last_error());
            return false;
        }
        if (!push_ptr(&ds->unmapped, &ds->nunmapped, &ds->cap_unmapped, p)) {
            (void)sp_free(p);
            snprintf(err, errlen, "out of memory");
            return false;
        }
        left -= n;
    }
    return true;
}

/* The pages hold_unmapped took from ds->unmapped[first] on, given back and unmapped: every
 * other start segment built so far is held whole (blocks and placeholders), so the release
 * unmaps these pages only. */
static bool unmap_from(dev_state_t *ds, int dev, size_t first, char *err, size_t errlen) {
    if (first >= ds->nunmapped)
        return true;
    sp_status_t st = SP_SUCCESS;
    for (size_t i = first; st == SP_SUCCESS && i < ds->nunmapped; i++)
        st = sp_free(ds->unmapped[i]);
    ds->nunmapped = first;
    if (st == SP_SUCCESS)
        st = sp_x_empty_cache_device(dev);
    if (st != SP_SUCCESS) {
        snprintf(err, errlen, "starting state: %s: %s", sp_status_name(st), sp_last_error());
        return false;
    }
    return true;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* One recorded stream into `seen` and `vals` (once each); false on OOM. */
static bool note_stream(tr_map_t *seen, uint64_t **vals, size_t *n, size_t *cap, uint64_t stream) {
    bool added = false;
    if (stream == 0)
        return true;
    if (tr_map_upsert(seen, stream, &added) == NULL)
        return false;
    if (!added)
        return true;
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        uint64_t *grown = realloc(*vals, nc * sizeof(*grown));
        if (grown == NULL)
            return false;
        *vals = grown;
        *cap = nc;
    }
    (*vals)[(*n)++] = stream;
    return true;
}

/* Every stream the replay of device d uses, made before anything else, in ascending order of
 * the recorded cudaStream_t values. The free set orders blocks by (stream, size, address) with
 * the stream compared by handle, as PyTorch's compared those values; the host backend's handles
 * compare in the order they were made, so ours sort as the recording's did (which decides the
 * order empty_cache and garbage collection release segments in, and so where later segments
 * land). Made where each was first needed, they sorted in the order of first use instead. */
static bool make_streams(dev_state_t *ds, int d, const tr_device_t *td, char *err, size_t errlen) {
    tr_map_t seen = {0};
    uint64_t *vals = NULL;
    size_t n = 0, cap = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < td->nstart; i++)
        ok = note_stream(&seen, &vals, &n, &cap, td->start[i].stream);
    for (size_t i = 0; ok && i < td->nseeds; i++)
        ok = note_stream(&seen, &vals, &n, &cap, td->seeds[i].stream);
    for (size_t i = 0; ok && i < td->nev; i++)
        if (td->ev[i].action == TR_ALLOC)
            ok = note_stream(&seen, &vals, &n, &cap, td->ev[i].stream);
    if (!ok)
        snprintf(err, errlen, "out of memory");
    if (ok && n > 1)
        qsort(vals, n, sizeof(*vals), cmp_u64);
    sp_stream_t s;
    for (size_t i = 0; ok && i < n; i++)
        ok = stream_for(ds, d, vals[i], &s, err, errlen);
    tr_map_free(&seen);
    free(vals);
    return ok;
}

/* The starting state of one device: its private pools, the segments that existed before
 * recording began (as they were), then the live blocks outside them as requests. With
 * `requested` (the replay's segment kind is not the recorded run's, so that layout cannot exist
 * under it) every live block is requested instead, in address order: the replayed allocator
 * lays them out as it would have, and none of the recorded run's cached free space is kept. */
static bool build_start(dev_state_t *ds, int d, const tr_device_t *td, bool requested,
                        bool expandable, double fraction, frames_src_t *fs, replay_result_t *r,
                        char *err, size_t errlen) {
    if (!make_streams(ds, d, td, err, errlen))
        return false;
    place_begin(ds, d, td);
    ds->pools = calloc(td->npools ? td->npools : 1, sizeof(*ds->pools));
    /* The address map sized once for the blocks put below (each starting block, each seed
     * requested on its own), instead of growing to it: on nhf's 1,745 starting blocks it was
     * allocated, zeroed and rehashed three times. Where fewer keys end up in it (an OOM, an
     * address put twice) it may be larger than growing made it: plan_slots then numbers the
     * slots in another order, which changes no request (the ops name slots by event). */
    size_t nput = requested ? td->nseeds : td->nsblocks + td->nloose;
    if (ds->pools == NULL || (nput > 0 && !tr_map_reserve(&ds->blocks, nput))) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
    ds->npools = td->npools;
    for (size_t i = 0; i < td->npools; i++) {
        sp_mempool_params_t mp;
        sp_mempool_params_init(&mp);
        mp.device = d;
        if (sp_mempool_create(&mp, &ds->pools[i]) != SP_SUCCESS) {
            snprintf(err, errlen, "sp_mempool_create: %s", sp_last_error());
            return false;
        }
    }
    bool ok = true;
    /* Held pages are unmapped early only while they are the last ones held (unmap_from gives
     * back everything from an index on): otherwise at the end, with the rest. */
    expandable = expandable && !requested && unmapped_fit(td, fraction);
    size_t held_from = 0;
    for (size_t i = 0; ok && !requested && i < td->nstart; i++) {
        ok = build_segment(ds, d, td, &td->start[i], fs, r, err, errlen);
        if (ok && expandable && i > 0 && gap_after(td, i - 1) > 0 && gap_unmaps_early(td, i - 1))
            ok = unmap_from(ds, d, held_from, err, errlen);
        if (ok && expandable)
            ok = hold_unmapped(ds, d, td, i, &held_from, err, errlen);
    }
    if (ok)
        ok = unmap_from(ds, d, 0, err, errlen);
    for (size_t i = 0; ok && i < ds->nholes; i++)
        if (sp_free(ds->holes[i]) != SP_SUCCESS) {
            snprintf(err, errlen, "sp_free: %s", sp_last_error());
            ok = false;
        }
    ds->nholes = 0;
    /* The free blocks the placeholders left show the original's requested sizes (an inactive
     * block's own value, which only snapshots show: nothing else reads it). */
    for (size_t i = 0; ok && i < ds->ncarry; i++)
        (void)sp_x_free_block_set_requested(ds->carry[i].at, (size_t)ds->carry[i].req);
    ds->ncarry = 0;
    for (size_t i = 0; ok && i < td->nseeds; i++) {
        if (td->seeds[i].in_start && !requested)
            continue;
        fs->frames = td->seeds[i].frames;
        ok = do_alloc(ds, d, td->seeds[i].addr, td->seeds[i].size, td->seeds[i].stream,
                      td->seeds[i].pool, r, err, errlen);
    }
    fs->frames = NULL;
    /* The blocks the recorded run's user had freed while other streams still used them: freed
     * here too, pending until the trace says their events completed (or to the end). */
    for (size_t i = 0; ok && i < td->nseeds; i++) {
        uintptr_t p = 0;
        if (!td->seeds[i].pending || !tr_map_get(&ds->blocks, td->seeds[i].addr, &p) || p == 0)
            continue;
        sp_status_t st = SP_SUCCESS;
        ok = hold_for_side(ds, d, p, td->seeds[i].addr, &st, err, errlen);
        if (ok && st == SP_SUCCESS)
            st = sp_free((void *)p);
        /* Out of the address map once freed: a block not freed stays there, given back at the
         * end with the rest. */
        if (ok && st == SP_SUCCESS)
            (void)tr_map_del(&ds->blocks, td->seeds[i].addr, NULL);
        if (ok && st != SP_SUCCESS) {
            snprintf(err, errlen, "starting state: sp_free: %s: %s", sp_status_name(st),
                     sp_last_error());
            ok = false;
        }
        r->start_pending++;
    }
    /* What the starting state reserves is a floor for the peak (nothing is released before the
     * first event): the replay says so when that alone is past 1% of the peak allocated. */
    if (ok)
        r->start_reserved += stat_of(d, "reserved_bytes.all.current");
    /* The starting state is where the recorded run stood, not something the trace did: the
     * peaks and counts start from it (PyTorch's trace shows none of it either). */
    if (ok && (sp_reset_peak_memory_stats(d) != SP_SUCCESS ||
               sp_reset_accumulated_memory_stats(d) != SP_SUCCESS)) {
        snprintf(err, errlen, "sp_reset_peak_memory_stats: %s", sp_last_error());
        ok = false;
    }
    return ok;
}

/* The user_metadata of each of the first nops ops' entries, where it differs from the previous
 * op's (the first op's: from ""): flagged OPF_META, its text next in ds->meta. The text is in
 * force when sympool records the entries the op makes (an alloc's segment_alloc is recorded
 * before it, as in the trace, under the same text). Apart from plan_slots' pass, which a trace
 * without metadata (almost every one) then does not pay for. */
static bool plan_meta(dev_state_t *ds, const tr_device_t *td, size_t nops) {
    size_t k = 0, cap = 0;
    const tr_meta_t *cur = NULL;
    for (size_t j = 0; j < nops; j++) {
        op_t *o = &ds->ops[j];
        while (k < td->nmeta && td->meta[k].ev < o->ev)
            k++;
        const tr_meta_t *meta = k < td->nmeta && td->meta[k].ev == o->ev ? &td->meta[k] : NULL;
        /* (the whole str: one holding a U+0000 is not the str before it) */
        if (meta == cur || (meta != NULL && cur != NULL && meta->len == cur->len &&
                            memcmp(meta->text, cur->text, meta->len) == 0))
            continue;
        if (ds->nmeta == cap) {
            size_t nc = cap ? cap * 2 : 8;
            const tr_meta_t **nm = realloc(ds->meta, nc * sizeof(*nm));
            if (nm == NULL)
                return false;
            ds->meta = nm;
            cap = nc;
        }
        ds->meta[ds->nmeta++] = meta;
        o->flags |= OPF_META;
        cur = meta;
    }
    return true;
}

/* The event loop's steps, before the clock starts: the address map's work (a hash of the
 * recorded address at every alloc and free) done once per event here, so that the loop only
 * indexes an array. The blocks of the starting state move from ds->blocks into the first slots;
 * each alloc event gets a new slot, and the free of a recorded address the slot of the last
 * alloc of it not yet freed (none: the free is skipped, as a miss in the map was). Whether a
 * slot holds a block is decided in the loop (an OOM holds none). The map of recorded addresses
 * is made as large as it will get at once (as far as the events tell), instead of growing to it.
 * Each recorded stream of an alloc gets an index (its first alloc's order), so that the loop
 * finds our stream in an array; the stream itself is still made where the loop first needs it. */
static bool plan_slots(dev_state_t *ds, const tr_device_t *td) {
    /* nalloc: the alloc events; most: about as many addresses as the map below holds at once
     * (the blocks of the starting state and the allocs not yet freed; a free the map misses
     * counts too, so it may be low, and the map then grows past it as it always could). Sized
     * by nalloc instead, a long trace's map would be mostly empty and missed in cache.
     * deferred: a free is deferred (or a starting block pending), so free_completed events
     * have work. */
    size_t nalloc = 0, live = ds->blocks.n, most = live;
    bool deferred = ds->pending.n > 0; /* blocks of the starting state pending their free */
    /* nother: the ops that are neither allocs nor completions (frees, empty_cache runs);
     * ncompleted: free_completed events, ops where a free is deferred. The ops' array is
     * allocated as large as it gets: sized by the events, a third of it or more was never
     * written, and malloc's header after it then touched a page past the heap's used end
     * (nhfull: into a third huge page, 2 MB zeroed for it). */
    size_t nother = 0, ncompleted = 0;
    for (size_t i = 0; i < td->nev; i++) {
        const tr_event_t *e = &td->ev[i];
        if (e->action == TR_ALLOC) {
            nalloc++;
            most = ++live > most ? live : most;
        } else if (e->action == TR_FREE_REQUESTED) {
            nother++;
            live -= live > 0;
            deferred = deferred || (e->flags & TR_F_DEFERRED);
        } else if (e->action == TR_FREE_COMPLETED) {
            ncompleted++;
        } else if (e->action == TR_SEGMENT_FREE || e->action == TR_SEGMENT_UNMAP) {
            nother += (e->flags & (TR_F_EMPTY_CACHE | TR_F_MAYBE_GC)) != 0;
        }
    }
    size_t n = ds->blocks.n + nalloc, nmost = nalloc + nother + (deferred ? ncompleted : 0);
    if (n >= NO_SLOT || td->nev >= UINT32_MAX)
        return false;
    ds->ptrs = calloc(n ? n : 1, sizeof(*ds->ptrs));
    ds->ops = malloc((nmost ? nmost : 1) * sizeof(*ds->ops));
    tr_map_t last = {0};    /* recorded address -> 1 + its slot */
    tr_map_t streams = {0}; /* recorded stream -> its index */
    size_t nstreams = 1, cap_streams = 8;
    ds->scache = calloc(cap_streams, sizeof(*ds->scache));
    ds->srecorded = calloc(cap_streams, sizeof(*ds->srecorded));
    bool ok = ds->ptrs != NULL && ds->ops != NULL && ds->scache != NULL && ds->srecorded != NULL &&
              tr_map_reserve(&last, most);
    size_t k = 0, nops = 0;
    for (size_t i = 0; ok && i < ds->blocks.cap; i++) {
        if (ds->blocks.slots[i].key == 0)
            continue;
        ds->ptrs[k] = (void *)ds->blocks.slots[i].val;
        ok = tr_map_put(&last, ds->blocks.slots[i].key, k + 1);
        k++;
    }
    for (size_t i = 0; ok && i < td->nev; i++) {
        const tr_event_t *e = &td->ev[i];
        op_t o = {0, {NO_SLOT, NO_SLOT}, (uint32_t)i, 0, e->pool, 0, e->flags};
        uintptr_t v = 0;
        if (e->action == TR_ALLOC) {
            o.kind = OP_ALLOC;
            o.size = e->size;
            if (e->addr != 0) {
                /* the address's last slot replaced, in one probe of the map */
                bool added = false;
                uintptr_t *at = tr_map_upsert(&last, e->addr, &added);
                ok = at != NULL;
                if (ok && !added)
                    o.at.prev = (uint32_t)(*at - 1);
                o.at.slot = (uint32_t)k;
                if (ok)
                    *at = ++k;
            } else {
                k++; /* address 0: its slot stays unused (the map refused the key) */
            }
            if (ok && e->stream != 0 && !tr_map_get(&streams, e->stream, &v)) {
                if (nstreams == cap_streams) {
                    size_t nc = cap_streams * 2;
                    sp_stream_t *sc = realloc(ds->scache, nc * sizeof(*sc));
                    if (sc != NULL)
                        ds->scache = sc;
                    uint64_t *sr = realloc(ds->srecorded, nc * sizeof(*sr));
                    if (sr != NULL)
                        ds->srecorded = sr;
                    ok = sc != NULL && sr != NULL;
                    cap_streams = ok ? nc : cap_streams;
                }
                if (ok) {
                    ds->scache[nstreams] = NULL;
                    ds->srecorded[nstreams] = e->stream;
                    v = nstreams++;
                    ok = nstreams < UINT32_MAX && tr_map_put(&streams, e->stream, v);
                }
            }
            o.stream = e->stream != 0 ? (uint32_t)v : 0;
            if (ds->nplace > 0 && ds->place[ds->nplace - 1].op == nops)
                o.flags |= OPF_SEG;
        } else if (e->action == TR_FREE_REQUESTED) {
            o.kind = OP_FREE;
            if (tr_map_del(&last, e->addr, &v))
                o.at.slot = (uint32_t)(v - 1);
        } else if (e->action == TR_FREE_COMPLETED && deferred) {
            o.kind = OP_FREE_COMPLETED;
        } else if ((e->action == TR_SEGMENT_FREE || e->action == TR_SEGMENT_UNMAP) &&
                   (e->flags & (TR_F_EMPTY_CACHE | TR_F_MAYBE_GC))) {
            o.kind = OP_EMPTY_CACHE;
        } else if (e->action == TR_SEGMENT_ALLOC) {
            /* Recorded before the alloc it served: that alloc is the next op. */
            ok = place_push(ds, nops, e->addr, e->size);
            continue;
        } else {
            continue; /* nothing asked of sympool */
        }
        if (nops == nmost) { /* counted above by the same rules: never (kept memory-safe) */
            ok = false;
            break;
        }
        ds->ops[nops++] = o;
    }
    tr_map_free(&last);
    tr_map_free(&streams);
    if (!ok || (td->nmeta > 0 && !plan_meta(ds, td, nops)))
        return false;
    ds->nptrs = n;
    ds->nops = nops;
    tr_map_free(&ds->blocks); /* every block it held is in a slot now */
    memset(&ds->blocks, 0, sizeof(ds->blocks));
    return true;
}

/* Make m's text ("" for NULL) the user_metadata device d's later trace entries carry: a C string
 * as the history takes it, a U+0000 in it as 0xC0 0x80 (as frame_str writes it; it was cut there).
 */
static bool set_meta(int d, const tr_meta_t *m, char *err, size_t errlen) {
    char *c = NULL;
    if (m != NULL && memchr(m->text, 0, m->len) != NULL) {
        c = c_bytes(m->text, m->len);
        if (c == NULL) {
            snprintf(err, errlen, "a trace entry's user_metadata: out of memory");
            return false;
        }
    }
    sp_status_t s = sp_history_set_user_metadata(d, c ? c : m ? m->text : NULL);
    free(c);
    if (s == SP_SUCCESS)
        return true;
    snprintf(err, errlen, "a trace entry's user_metadata: %s", sp_last_error());
    return false;
}

/* The trace's external annotations into the replay's history, each with its recorded device and
 * time (sp_x_history_stamp), so that our snapshot lists what the original does. One that is not
 * PyTorch's {"stage": str, "name": str, "device": int, "time_us": int} on a device of the replay
 * is left out (said once on stderr): the replay itself never depends on them. */
static bool record_annotations(const tr_trace_t *t, char *err, size_t errlen) {
    size_t n = pk_len(t->annotations), skipped = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        const pk_value_t *a = pk_at(t->annotations, i);
        const pk_value_t *sv = pk_get(a, "stage"), *nv = pk_get(a, "name");
        int64_t dev = -1, us = -1;
        if (pk_str(sv) == NULL || pk_str(nv) == NULL || !pk_get_int(a, "device", &dev) || dev < 0 ||
            dev >= t->ndev || !pk_get_int(a, "time_us", &us) || us < 0) {
            skipped++;
            continue;
        }
        /* As the history takes them, C strings: a U+0000 as 0xC0 0x80 (frame_str's form), or
         * the text stopped at it. */
        char *stage = c_text(sv), *name = c_text(nv);
        sp_x_history_stamp(us);
        if (stage == NULL || name == NULL) {
            snprintf(err, errlen, "external_annotations[%zu]: out of memory", i);
            ok = false;
        } else if (sp_history_record_annotation((int)dev, stage, name) != SP_SUCCESS) {
            snprintf(err, errlen, "external_annotations[%zu]: %s", i, sp_last_error());
            ok = false;
        }
        free(stage);
        free(name);
    }
    sp_x_history_stamp(-1);
    if (skipped > 0)
        fprintf(stderr,
                "sympool replay: %zu of %zu external_annotations are not PyTorch's {stage, name, "
                "device, time_us} on a device of the trace: left out of the snapshot\n",
                skipped, n);
    return ok;
}

/* Whether event j is the completion PyTorch recorded right after its free_requested (a free no
 * other stream's work held): the free's own, recorded at the free's op. */
static bool immediate_completion(const tr_event_t *ev, size_t j) {
    return j > 0 && ev[j].action == TR_FREE_COMPLETED && ev[j - 1].action == TR_FREE_REQUESTED &&
           ev[j - 1].addr == ev[j].addr;
}

/* The recorded run's own snapshot (its `snapshot` entry, where the user took one while
 * recording): our history gets the entry a snapshot would append, with our active bytes then
 * (the trace's size is PyTorch's), at its time (queued by the caller). */
static sp_status_t snapshot_marker(int d) {
    return sp_x_history_record_snapshot(d, (size_t)stat_of(d, "active_bytes.all.current"));
}

/* Our snapshot's times for what the allocator does around op o (its event i): every event of
 * the trace that asks nothing of sympool is the allocator's own doing, recorded by PyTorch with
 * its own time, and belongs to an op: an immediate free_completed to the free before it (it comes
 * right after i), an empty_cache's run of segment frees to its first (right after i), anything
 * else (a segment_alloc or segment_map, the segment frees of a release inside malloc, a deferred
 * free's free_completed, which our allocator too records at the next malloc) to the op after it
 * (*cursor: the first event not handed out). Each one's time is queued for the next entry of its
 * action (sp_x_history_stamp_next): our entries take the recorded times in the recorded order,
 * and an entry the recorded run did not make takes the op's own (sp_x_history_stamp). */
static bool stamp_around(int d, const tr_device_t *td, const op_t *o, size_t *cursor, char *err,
                         size_t errlen) {
    const tr_event_t *ev = td->ev;
    size_t nev = td->nev;
    size_t i = o->ev, j = *cursor;
    if (o->kind == OP_FREE_COMPLETED)
        return true; /* no entry of ours: an immediate one was the free's, a deferred one waits */
    if (o->kind == OP_EMPTY_CACHE && (o->flags & TR_F_MAYBE_GC) && collects_next(d))
        return true; /* a collection: its segment frees are the malloc's after it */
    sp_status_t st = sp_x_history_stamp_next(-1, -1); /* what the op before did not take */
    /* A free makes no completion but its own: one recorded before it (of a request the ring cut
     * off, or a deferred one no malloc saw done) is not its. */
    bool completes = o->kind != OP_FREE;
    for (; st == SP_SUCCESS && j <= i; j++) { /* the op's own event last: an empty_cache's first */
        bool mine = j == i || (ev[j].action != TR_FREE_COMPLETED ||
                               (completes && !immediate_completion(ev, j)));
        if (mine && tr_time_us(td, j) > 0 && ev[j].action <= TR_OOM)
            st = sp_x_history_stamp_next((int)ev[j].action, tr_time_us(td, j));
        if (ev[j].action == TR_SNAPSHOT && st == SP_SUCCESS)
            st = snapshot_marker(d);
    }
    j = i + 1;
    bool run = o->kind == OP_EMPTY_CACHE;
    for (; st == SP_SUCCESS && j < nev &&
           (immediate_completion(ev, j) ||
            (run && (ev[j].action == TR_SEGMENT_FREE || ev[j].action == TR_SEGMENT_UNMAP)));
         j++)
        if (tr_time_us(td, j) > 0)
            st = sp_x_history_stamp_next((int)ev[j].action, tr_time_us(td, j));
    *cursor = j;
    if (st != SP_SUCCESS) {
        snprintf(err, errlen, "sp_x_history_stamp_next: %s", sp_last_error());
        return false;
    }
    sp_x_history_stamp(tr_time_us(td, i) > 0 ? tr_time_us(td, i) : -1);
    return true;
}

/* The recorded run's snapshots after device d's last replayed event (stamp_around recorded
 * those before it). Outside the timed loop: its code stays as it was without --snapshot. */
static bool snapshots_after(int d, const dev_state_t *ds, const tr_device_t *td, char *err,
                            size_t errlen) {
    const tr_event_t *ev = td->ev;
    size_t nev = td->nev, k = ds->nops;
    while (k > 0 && ds->ops[k - 1].kind == OP_FREE_COMPLETED)
        k--; /* stamp_around left their windows to the op after them: there is none */
    size_t cursor = k > 0 ? ds->ops[k - 1].ev + 1 : 0;
    sp_status_t st = sp_x_history_stamp_next(-1, -1);
    for (size_t j = cursor; st == SP_SUCCESS && j < nev; j++)
        if (ev[j].action == TR_SNAPSHOT) {
            sp_x_history_stamp(tr_time_us(td, j) > 0 ? tr_time_us(td, j) : -1);
            st = snapshot_marker(d);
        }
    if (st != SP_SUCCESS)
        snprintf(err, errlen, "a snapshot entry: %s", sp_last_error());
    return st == SP_SUCCESS;
}

/* Every step of one device in order. Out of line (and, under GCC, kept whole: no clone under
 * another name) so that the timed loop is a function of its own for profilers:
 * `valgrind --tool=callgrind --toggle-collect=replay_device` counts it alone.
 * The counts are kept in locals and added once (the calls in between could change *r for all
 * the compiler knows, so it would load and store them around every call). */
#if defined(__GNUC__) && !defined(__clang__)
#define LOOP_FN __attribute__((noinline, noipa))
#else
#define LOOP_FN __attribute__((noinline))
#endif
static LOOP_FN bool replay_device(dev_state_t *ds, int d, const tr_device_t *td, frames_src_t *fs,
                                  bool with_frames, replay_result_t *r, char *err, size_t errlen) {
    bool ok = true;
    size_t allocs = 0, frees = 0;
    const tr_meta_t *const *meta = ds->meta;
    size_t placed = 0, stamped = 0; /* ds->place's cursor; stamp_around's */
    const tr_event_t *ev = td->ev, *end = td->ev + td->nev;
    for (const op_t *o = ds->ops, *oend = ds->ops + ds->nops; ok && o < oend; o++) {
        if (UNLIKELY(with_frames)) {
            fs->frames = tr_frames(td, o->ev);
            /* our entries carry the recorded times (0: the trace has none, history's clock) */
            if (!stamp_around(d, td, o, &stamped, err, errlen)) {
                ok = false;
                break;
            }
            if (UNLIKELY(o->flags & OPF_META) && !set_meta(d, *meta++, err, errlen)) {
                ok = false;
                break;
            }
        }
        switch (o->kind) {
        case OP_ALLOC:
            allocs++;
            if (UNLIKELY(o->flags & OPF_SEG)) {
                place_for_op(ds, d, (size_t)(o - ds->ops), &placed);
                ok = do_alloc_op(ds, d, o, r, err, errlen);
                (void)sp_x_host_place(d, 0, 0); /* what this alloc did not take */
                break;
            }
            ok = do_alloc_op(ds, d, o, r, err, errlen);
            break;
        case OP_FREE:
            frees++;
            ok = do_free_op(ds, d, ev, o, r, err, errlen);
            break;
        case OP_FREE_COMPLETED:
            if (ds->pending.n > 0)
                ok = do_free_completed(ds, ev[o->ev].addr, err, errlen);
            break;
        default: /* OP_EMPTY_CACHE */
            ok = do_empty_cache(ds, d, &ev[o->ev], end, r, err, errlen);
            break;
        }
    }
    r->allocs += allocs;
    r->frees += frees;
    return ok;
}

/* PyTorch's garbage_collection_threshold acts only under a memory fraction (a fraction of 1
 * clears it). With --capacity and a threshold in force, replay caps the process at the
 * capacity with the largest fraction below 1 (a byte under the emulated device), so the
 * threshold has the limit to act on that it has on a GPU; without one the fraction stays unset
 * and nothing else changes. The threshold in force, not the words that might set one: the
 * environment's SYMPOOL_GC_THRESHOLD=0 (off) or a SYMPOOL_ALLOC_CONF with a threshold that the
 * snapshot's own settings replace set the fraction, and changed the replay's peaks and OOMs. */
static bool gc_in_force(void) {
    sp_x_option_info_t info;
    return cli_option("SYMPOOL_GC_THRESHOLD", &info) && info.value_double > 0;
}

static bool init_capped(int ndev, const char *capacity, char *err, size_t errlen) {
    if (sp_init() != SP_SUCCESS) {
        snprintf(err, errlen, "sp_init: %s", sp_last_error());
        return false;
    }
    if (capacity == NULL || !gc_in_force())
        return true;
    for (int d = 0; d < ndev; d++) {
        /* A fraction the configuration set (per_process_memory_fraction) already caps the
         * process, lower: it stays (it was replaced by this one, and its OOMs went with it). */
        double set = 1.0;
        if (sp_get_memory_fraction(d, &set) == SP_SUCCESS && set < 1.0)
            continue;
        if (sp_set_memory_fraction(nextafter(1.0, 0.0), d) != SP_SUCCESS) {
            snprintf(err, errlen, "sp_set_memory_fraction: %s", sp_last_error());
            return false;
        }
    }
    return true;
}

/* A fresh allocator for the next replay of --repeat: the last one's shut down (it gave back
 * everything it held, so a refusal is named, not left as an empty reason), a new one made. */
static bool restart(int ndev, const char *capacity, char *err, size_t errlen) {
    sp_status_t st = sp_shutdown();
    if (st != SP_SUCCESS) {
        snprintf(err, errlen, "sp_shutdown before the next replay: %s: %s", sp_status_name(st),
                 sp_last_error());
        return false;
    }
    return init_capped(ndev, capacity, err, errlen);
}

/* An integer option's value in force; 0 for a name there is none of. */
static int64_t option_int(const char *name) {
    sp_x_option_info_t info;
    return cli_option(name, &info) ? info.value_int : 0;
}

/* Whether the configuration in force uses expandable segments. */
static bool effective_expandable(void) {
    return option_int("SYMPOOL_EXPANDABLE_SEGMENTS") != 0;
}

/* Expandable segments with a rule of ours on (PAGE, RECYCLE and BORROW at 0 are PyTorch's). */
static bool expandable_rules_ours(void) {
    return option_int("SYMPOOL_EXPANDABLE_PAGE") != 0 ||
           option_int("SYMPOOL_EXPANDABLE_RECYCLE") != 0 ||
           option_int("SYMPOOL_EXPANDABLE_BORROW") != 0;
}

static bool g_user_conf;
static bool g_hold_warnings; /* while the snapshot is written: its failure is our error line */

void replay_set_user_conf(bool given) {
    g_user_conf = given;
}

/* One replay (see replay_trace); `last`: the process exits after it without sp_shutdown, so
 * what sympool holds for the replay is not given back one block at a time (a trace with a
 * large final state leaves thousands of live blocks, each an sp_free with its merges). */
static bool replay_once(const tr_trace_t *t, const char *snapshot_out, bool last,
                        replay_result_t *r, char *err, size_t errlen) {
    memset(r, 0, sizeof(*r));
    int ndev = sp_device_count();
    if (t->ndev > ndev) {
        snprintf(err, errlen,
                 "the trace has %d devices but sympool has %d (set SYMPOOL_HOST_DEVICES)", t->ndev,
                 ndev);
        return false;
    }
    r->devices = t->ndev;
    dev_state_t *ds = calloc(t->ndev > 0 ? (size_t)t->ndev : 1, sizeof(*ds));
    if (ds == NULL) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
    frames_src_t fs = {NULL, NULL, 0};
    bool ok = true;
    /* The recorded segments are fixed ones (expandable segments are never rebuilt): under the
     * other segment kind they cannot exist, and rebuilding them would hand the replay the
     * recorded run's cached free space, which that kind would not have kept. */
    r->start_requested = t->settings.expandable != effective_expandable();
    /* The same when --conf asks about expandable segments under our rules and the recording's
     * are PyTorch's: its mapped pages (20 MiB units, freed ones kept until an OOM or
     * empty_cache) are what those rules kept; ours would have mapped and unmapped others. The
     * snapshot's own settings (no --conf) re-enact the recorded run from them. */
    r->start_rules_differ =
        g_user_conf && !r->start_requested && t->settings.expandable && expandable_rules_ours();
    r->start_requested = r->start_requested || r->start_rules_differ;
    /* The recorded run's memory fraction, against the emulated device's capacity. */
    for (int d = 0; ok && t->settings.fraction > 0 && d < t->ndev; d++)
        if (sp_set_memory_fraction(t->settings.fraction, d) != SP_SUCCESS) {
            snprintf(err, errlen, "sp_set_memory_fraction: %s", sp_last_error());
            ok = false;
        }
    /* Our snapshot: the starting state as live blocks with their recorded stacks (recording
     * "state": no trace entries for it), then every event in the trace. */
    if (ok && snapshot_out != NULL) {
        sp_history_set_frames_hook(frames_hook, &fs);
        ok = history(SP_HISTORY_STATE, err, errlen);
    }
    for (int d = 0; ok && d < t->ndev; d++) {
        const tr_device_t *td = &t->dev[d];
        r->trace_entries += td->nev;
        r->seeded_blocks += r->start_requested ? td->nseeds : td->nloose;
        r->seeded_bytes += r->start_requested ? td->seeded_bytes : td->loose_bytes;
        r->start_segments += r->start_requested ? 0 : td->nstart;
        r->start_bytes += r->start_requested ? 0 : td->start_bytes;
        r->recorded_ooms += td->recorded_ooms;
        r->pytorch_peak_reserved += td->peak_reserved;
        r->pytorch_final_reserved += td->final_reserved;
        r->pytorch_start_reserved += td->start_reserved;
        r->trace_peak_requested += td->peak_requested;
        r->pytorch_end_allocated += td->final_allocated;
        ok = build_start(&ds[d], d, td, r->start_requested, t->settings.expandable,
                         t->settings.fraction, &fs, r, err, errlen);
    }
    /* "state" keeps one trace entry (the last of the starting state, as PyTorch's ring of one
     * does); it is not part of the recorded run, so the buffer is cleared (OFF keeps the live
     * blocks' stacks) before the trace is recorded. */
    if (ok && snapshot_out != NULL)
        ok = history(SP_HISTORY_OFF, err, errlen) && history(SP_HISTORY_ALL, err, errlen) &&
             record_annotations(t, err, errlen);
    /* The address map's work is done before the clock starts (plan_slots): it is setup, not
     * the cost of an event. */
    for (int d = 0; ok && d < t->ndev; d++)
        if (!plan_slots(&ds[d], &t->dev[d])) {
            snprintf(err, errlen, "out of memory");
            ok = false;
        }
    uint64_t t0 = now_ns();
    for (int d = 0; ok && d < t->ndev; d++)
        ok = replay_device(&ds[d], d, &t->dev[d], &fs, snapshot_out != NULL, r, err, errlen);
    uint64_t t1 = now_ns();
    for (int d = 0; ok && snapshot_out != NULL && d < t->ndev; d++)
        ok = snapshots_after(d, &ds[d], &t->dev[d], err, errlen);
    fs.frames = NULL;
    if (snapshot_out != NULL) {
        /* the snapshot's own entry, and what comes next, take the clock */
        sp_x_history_stamp(-1);
        (void)sp_x_history_stamp_next(-1, -1);
    }
    r->events = r->allocs + r->frees;
    r->ns_per_event = r->events ? (double)(t1 - t0) / (double)r->events : 0.0;
    for (int d = 0; d < t->ndev; d++) {
        r->peak_requested += stat_of(d, "requested_bytes.all.peak");
        r->peak_allocated += stat_of(d, "allocated_bytes.all.peak");
        int64_t active = stat_of(d, "active_bytes.all.peak");
        r->peak_active += active;
        r->page_floor += page_round(active);
        r->peak_reserved += stat_of(d, "reserved_bytes.all.peak");
        r->end_reserved += stat_of(d, "reserved_bytes.all.current");
        r->end_allocated += stat_of(d, "allocated_bytes.all.current");
        r->end_inactive_split += stat_of(d, "inactive_split_bytes.all.current");
        r->device_allocs += stat_of(d, "num_device_alloc");
        r->device_frees += stat_of(d, "num_device_free");
        sp_x_vmm_counters_t v;
        if (sp_x_vmm_counters(d, &v) == SP_SUCCESS) {
            r->vmm.pages_mapped += v.pages_mapped;
            r->vmm.pages_unmapped += v.pages_unmapped;
            r->vmm.bytes_mapped += v.bytes_mapped;
            r->vmm.bytes_unmapped += v.bytes_unmapped;
            r->vmm.map_calls += v.map_calls;
            r->vmm.unmap_calls += v.unmap_calls;
            r->vmm.recycle_syncs += v.recycle_syncs;
        }
    }
    if (ok && snapshot_out != NULL) {
        /* A snapshot that cannot be written (a read-only or full file system) is said once, in
         * the command's error line: sympool's WARN line of the same failure is held back. */
        g_hold_warnings = true;
        sp_status_t st = sp_dump_snapshot(snapshot_out);
        g_hold_warnings = false;
        if (st != SP_SUCCESS) {
            snprintf(err, errlen, "sp_dump_snapshot(%s): %s", snapshot_out, sp_last_error());
            ok = false;
        }
    }
    if (snapshot_out != NULL)
        sp_history_set_frames_hook(NULL, NULL);
    /* The trace's last text is not left for what the process does next (another replay). */
    for (int d = 0; d < t->ndev; d++)
        if (ds[d].nmeta > 0)
            (void)sp_history_set_user_metadata(d, "");
    free(fs.buf);
    for (int d = 0; d < t->ndev; d++)
        free_all(&ds[d], !last || !ok);
    free(ds);
    if (snapshot_out != NULL) {
        sp_history_params_t off;
        sp_history_params_init(&off);
        off.enabled = SP_HISTORY_OFF;
        (void)sp_record_memory_history(&off);
    }
    return ok;
}

bool replay_trace(const tr_trace_t *t, const char *snapshot_out, replay_result_t *r, char *err,
                  size_t errlen) {
    return replay_once(t, snapshot_out, false, r, err, errlen);
}

/* ---- the command ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* OOMs are an expected outcome of a replay with --capacity: show the first OOM warning (it
 * explains the state of the device), count the rest, pass every other line through. */
static void log_filter(int level, const char *line, void *arg) {
    size_t *oom_lines = arg;
    if (level == SP_X_LOG_WARN && g_hold_warnings)
        return;
    if (level == SP_X_LOG_WARN && strstr(line, "out of memory") != NULL && (*oom_lines)++ > 0)
        return;
    cli_log_line(line);
}

/* While the options are set before a replay: an option sympool refuses is logged at WARN as
 * well, and the command says it once, in its own error line (other lines, such as the INFO
 * notes on a configuration, pass). quiet_options_begin reads the option table first, so that
 * the environment's variables still warn (they do at that read). */
static void drop_warning(int level, const char *line, void *arg) {
    (void)arg;
    if (level != SP_X_LOG_WARN)
        cli_log_line(line);
}

static void quiet_options_begin(void) {
    sp_x_option_info_t info;
    (void)sp_x_option_info(0, &info);
    cli_log_open();
    sp_x_log_set_fn(drop_warning, NULL);
}

static void quiet_options_end(void) {
    sp_x_log_set_fn(NULL, NULL);
}

static double gib(double b);
static double pct(double ours, double theirs);

/* Appends a formatted piece to buf (its length in *n), cut at cap. */
static void add_why(char *buf, size_t cap, size_t *n, const char *fmt, ...) {
    if (*n + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *n, cap - *n, fmt, ap);
    va_end(ap);
    if (k > 0)
        *n = *n + (size_t)k < cap ? *n + (size_t)k : cap - 1;
}

/* Whether the replay's peak reserved differs from the recorded run's by more than 2% (or the
 * recorded run reserved nothing and the replay something); if so, why it may, into buf: the
 * reasons, each after a space and ending in ';', then what remains. The text output and
 * --json give the same reasons. */
static bool differs_because(const tr_trace_t *t, const replay_result_t *r, const char *user_conf,
                            char *buf, size_t cap) {
    double dev = pct((double)r->peak_reserved, (double)r->pytorch_peak_reserved);
    bool none_recorded = r->pytorch_peak_reserved == 0 && r->peak_reserved > 0;
    size_t n = 0;
    buf[0] = '\0';
    if (!(dev > 2.0 || dev < -2.0 || none_recorded))
        return false;
    if (user_conf != NULL)
        add_why(buf, cap, &n, " --conf replaces the recorded settings;");
    if (!t->settings.recorded)
        add_why(buf, cap, &n, " the snapshot records no allocator settings;");
    if (r->recorded_ooms > 0)
        add_why(buf, cap, &n,
                " the recorded run hit OOM (its device's free memory is not in the trace);");
    /* The replay's own OOMs are the emulated capacity's (--capacity, SYMPOOL_HOST_CAPACITY):
     * blaming them on the recorded run named one that had none. */
    if (r->ooms > r->recorded_ooms)
        add_why(buf, cap, &n,
                " the replay hit %zu OOM%s at the emulated device's capacity, where the recorded "
                "run hit %zu (the requests it refused are not in its peaks);",
                r->ooms, r->ooms == 1 ? "" : "s", r->recorded_ooms);
    size_t miss_allocs = 0, miss_segs = 0;
    uint64_t miss_alloc_bytes = 0, miss_seg_bytes = 0;
    for (int d = 0; d < t->ndev; d++) {
        miss_allocs += t->dev[d].missing_allocs;
        miss_alloc_bytes += t->dev[d].missing_alloc_bytes;
        miss_segs += t->dev[d].missing_seg_allocs;
        miss_seg_bytes += t->dev[d].missing_seg_bytes;
    }
    /* Before the reasons they explain (a starting state the trace does not imply, requests past
     * the recorded reserved bytes): what a recording with skip_actions left out. */
    if (miss_segs > 0)
        add_why(buf, cap, &n,
                " %zu segment_free%s (%.3f GiB) of segments freed already, with no "
                "segment_alloc since: segment_alloc entries are missing (recorded with "
                "skip_actions=['segment_alloc']?), and PyTorch's reserved bytes walked back from "
                "the end (its peak as given) count each such segment once more;",
                miss_segs, miss_segs == 1 ? "" : "s", gib((double)miss_seg_bytes));
    if (miss_allocs > 0)
        add_why(buf, cap, &n,
                " %zu free%s (%.3f GiB) of blocks no alloc entry made cannot have been live "
                "before the first entry (freed already, or in a segment the trace made before): "
                "alloc entries are missing (recorded with skip_actions=['alloc']?), and the "
                "replay reads them as blocks live before it or as frees of nothing;",
                miss_allocs, miss_allocs == 1 ? "" : "s", gib((double)miss_alloc_bytes));
    if (r->start_requested)
        add_why(buf, cap, &n, " the starting state was requested, not rebuilt (above);");
    else if (r->pytorch_start_reserved != r->start_bytes)
        add_why(buf, cap, &n,
                " the starting state found (%.3f GiB) is not what the trace implies (%.3f GiB: "
                "an inconsistent trace);",
                gib((double)r->start_bytes), gib((double)r->pytorch_start_reserved));
    if (t->settings.dropped[0] || t->settings.fraction > 0)
        add_why(buf, cap, &n, " settings that do not replay exactly (above);");
    /* Where the trace cannot tell them apart, and what the replay chose (docs/API.md). */
    if (r->gc_runs > 0)
        add_why(buf, cap, &n,
                " %zu run%s of segment frees right before a malloc %s read as that malloc's "
                "garbage collection (reserved was past the threshold there): the user's "
                "empty_cache right before it looks the same in the trace, and releases every free "
                "segment where the collection releases the oldest;",
                r->gc_runs, r->gc_runs == 1 ? "" : "s", r->gc_runs == 1 ? "was" : "were");
    if (t->settings.expandable && t->settings.rules[0] && !r->start_requested)
        add_why(buf, cap, &n,
                " sympool's own rules for expandable segments, re-enacted from the snapshot: "
                "unmaps right before a growth that no held free outlasts may be "
                "SYMPOOL_EXPANDABLE_RECYCLE's, and were replayed as the user's empty_cache, which "
                "unmaps every free page (docs/API.md);");
    uint64_t unrecorded = 0;
    for (int d = 0; d < t->ndev; d++)
        unrecorded += t->dev[d].unrecorded_free;
    if (unrecorded > 0)
        add_why(buf, cap, &n,
                " segments of at least %.3f GiB were released with no segment_free or "
                "segment_unmap entry (recorded with skip_actions) or are missing from the "
                "snapshot's segments: the replay keeps them, and the recorded run's peak "
                "reserved is at least the one given;",
                gib((double)unrecorded));
    size_t unknown = 0;
    for (int d = 0; d < t->ndev; d++)
        for (size_t i = 0; i < t->dev[d].nev; i++)
            unknown += t->dev[d].ev[i].action == TR_OTHER;
    if (unknown > 0)
        add_why(buf, cap, &n,
                " %zu trace entr%s of actions sympool does not know %s ignored (sympool info "
                "counts them as 'other');",
                unknown, unknown == 1 ? "y" : "ies", unknown == 1 ? "was" : "were");
    /* Requested bytes live in allocated blocks, allocated ones in reserved segments: a trace
     * whose requests outgrow what PyTorch reserved is no record of one run. */
    if (r->trace_peak_requested > r->pytorch_peak_reserved)
        add_why(buf, cap, &n,
                " the trace requests more at its peak (%.3f GiB) than the recorded run ever "
                "reserved (%.3f GiB): an inconsistent trace (blocks outside the recorded segments "
                "with no segment_alloc for them, or frees in no form sympool reads) that no "
                "allocator can match;",
                gib((double)r->trace_peak_requested), gib((double)r->pytorch_peak_reserved));
    add_why(buf, cap, &n,
            " %sthe allocators chose differently (once a choice differs, the segments made after "
            "it are not where the recorded run had its own, and ties among free blocks of one "
            "size, which go to the lowest address, may fall the other way)",
            n > 0 ? "otherwise " : "");
    return true;
}

/* The configuration a replay ran, as --json names it: conf (SYMPOOL_ALLOC_CONF's items), then,
 * where a recorded max_split_size of no whole MiB was set to the byte (split; 0: none), that
 * variable as an item of the form --compare takes. conf, whole MiB only, cannot hold it, and
 * without it said another allocator than the one that ran (the text gives it a line of its
 * own). out: cap bytes, used only when split is not 0. */
static const char *conf_ran(const char *conf, uint64_t split, char *out, size_t cap) {
    if (split == 0)
        return conf;
    snprintf(out, cap, "%s%sSYMPOOL_MAX_SPLIT_SIZE=%llu", conf ? conf : "",
             conf && conf[0] ? "," : "", (unsigned long long)split);
    return out;
}

static void print_json(const char *trace, const replay_result_t *r, const char *conf,
                       const char *settings, const char *capacity, const char *why) {
    printf("{\"trace\":");
    cj_write_string(stdout, trace);
    printf(",\"backend\":\"%s\",\"devices\":%d,\"trace_entries\":%zu,\"events\":%zu,"
           "\"allocs\":%zu,\"frees\":%zu,\"seeded_blocks\":%zu,\"seeded_bytes\":%llu,"
           "\"peak_requested_bytes\":%lld,\"peak_allocated_bytes\":%lld,"
           "\"peak_reserved_bytes\":%lld,\"pytorch_peak_reserved_bytes\":%llu,"
           "\"pytorch_final_reserved_bytes\":%llu,\"trace_peak_requested_bytes\":%llu,"
           "\"end_reserved_bytes\":%lld,\"end_allocated_bytes\":%lld,"
           "\"end_inactive_split_bytes\":%lld,\"pytorch_end_allocated_bytes\":%llu,"
           "\"ooms\":%zu,\"recorded_ooms\":%zu,\"skipped_frees\":%zu,\"ns_per_event\":%.1f,"
           "\"num_device_alloc\":%lld,\"num_device_free\":%lld,"
           "\"start_segments\":%zu,\"start_bytes\":%llu,\"pytorch_start_reserved_bytes\":%llu,"
           "\"empty_caches\":%zu,\"deferred_frees\":%zu,\"conf\":",
           sp_backend_name(), r->devices, r->trace_entries, r->events, r->allocs, r->frees,
           r->seeded_blocks, (unsigned long long)r->seeded_bytes, (long long)r->peak_requested,
           (long long)r->peak_allocated, (long long)r->peak_reserved,
           (unsigned long long)r->pytorch_peak_reserved,
           (unsigned long long)r->pytorch_final_reserved,
           (unsigned long long)r->trace_peak_requested, (long long)r->end_reserved,
           (long long)r->end_allocated, (long long)r->end_inactive_split,
           (unsigned long long)r->pytorch_end_allocated, r->ooms, r->recorded_ooms,
           r->skipped_frees, r->ns_per_event, (long long)r->device_allocs,
           (long long)r->device_frees, r->start_segments, (unsigned long long)r->start_bytes,
           (unsigned long long)r->pytorch_start_reserved, r->empty_caches, r->deferred_frees);
    cj_write_string(stdout, conf);
    printf(",\"settings\":");
    cj_write_string(stdout, settings);
    printf(",\"capacity\":");
    cj_write_string(stdout, capacity);
    printf(",\"starting_state\":\"%s\"", r->start_requested ? "requested" : "recorded_segments");
    /* Only where the peak reserved differs by more than 2%: why it may (the text's reasons). */
    if (why != NULL) {
        printf(",\"differs_because\":");
        cj_write_string(stdout, why + (why[0] == ' '));
    }
    /* Added last (older readers and the tests' patterns see the keys before as they were): the
     * expandable pages' device work, what a GPU's time in the driver follows (one cuMemCreate +
     * cuMemMap per page mapped, one cuMemUnmap + cuMemRelease per page unmapped). */
    printf(",\"vmm_pages_mapped\":%lld,\"vmm_pages_unmapped\":%lld,\"vmm_bytes_mapped\":%lld,"
           "\"vmm_bytes_unmapped\":%lld,\"vmm_recycle_syncs\":%lld,\"vmm_map_calls\":%lld,"
           "\"vmm_unmap_calls\":%lld",
           (long long)r->vmm.pages_mapped, (long long)r->vmm.pages_unmapped,
           (long long)r->vmm.bytes_mapped, (long long)r->vmm.bytes_unmapped,
           (long long)r->vmm.recycle_syncs, (long long)r->vmm.map_calls,
           (long long)r->vmm.unmap_calls);
    /* Added last, for the same reason: blocks freed while other streams still use them are held
     * (active) but no longer allocated, as PyTorch counts them, so the peak reserved cannot be
     * under this peak even where it is past 1.01 x the peak allocated. */
    printf(",\"peak_active_bytes\":%lld", (long long)r->peak_active);
    /* Added last, for the same reason: that peak in whole pages, the floor of any allocator. */
    printf(",\"page_floor_bytes\":%lld", (long long)r->page_floor);
    printf("}\n");
}

#define MAX_COMPARE 32
#define MAX_COMPARE_ROWS MAX_COMPARE

static double gib(double b) {
    return b / (1024.0 * 1024.0 * 1024.0);
}

static double pct(double ours, double theirs) {
    return theirs > 0 ? 100.0 * (ours - theirs) / theirs : 0.0;
}

/* The ALLOC_CONF text the environment put in force (SYMPOOL_ALLOC_CONF, else PyTorch's variable):
 * a replay with neither --conf nor recorded settings runs with it (env_conf_drop leaves it), and
 * says so, where it said "defaults" and --json "conf":"" of a run under expandable segments.
 * The variable's name, or NULL (out "") when none is set or it holds nothing. After init. */
static const char *env_conf_in_force(char *out, size_t cap) {
    sp_x_option_info_t info;
    out[0] = '\0';
    for (int i = 0; sp_x_option_info(i, &info); i++) {
        if (strcmp(info.name, "SYMPOOL_ALLOC_CONF") != 0)
            continue;
        if (strcmp(info.source, "default") == 0 || info.value[0] == '\0')
            return NULL;
        snprintf(out, cap, "%s", info.value);
        return strcmp(info.source, "env") == 0 ? "SYMPOOL_ALLOC_CONF" : info.source;
    }
    return NULL;
}

/* The allocator's own variables the environment sets (SYMPOOL_EXPANDABLE_SEGMENTS=1, ...): each
 * wins over the same key in SYMPOOL_ALLOC_CONF (the snapshot's, --conf's, the environment's), so
 * a replay runs with it, and a report of only the ALLOC_CONF text said "defaults" of a run under
 * expandable segments. As NAME=VALUE items (the form --compare takes), after a comma when `after`
 * holds any, "" when none. After init (the option table read). */
static void env_items(const char *after, char *out, size_t cap) {
    static const char *const keys[] = {
        "SYMPOOL_EXPANDABLE_SEGMENTS",    "SYMPOOL_MAX_SPLIT_SIZE",
        "SYMPOOL_MAX_NON_SPLIT_ROUNDING", "SYMPOOL_LARGE_SEGMENT_SIZE",
        "SYMPOOL_GC_THRESHOLD",           "SYMPOOL_ROUNDUP_POWER2_DIVISIONS"};
    size_t n = 0;
    out[0] = '\0';
    sp_x_option_info_t info;
    for (int i = 0; sp_x_option_info(i, &info) && n < cap; i++) {
        bool alloc = strncmp(info.name, "SYMPOOL_EXPANDABLE_", 19) == 0; /* our rules too */
        for (size_t k = 0; k < sizeof keys / sizeof keys[0] && !alloc; k++)
            alloc = strcmp(info.name, keys[k]) == 0;
        if (!alloc || strcmp(info.source, "env") != 0)
            continue;
        int w = snprintf(out + n, cap - n, "%s%s=%s",
                         n > 0 || (after != NULL && after[0] != '\0') ? "," : "", info.name,
                         info.value);
        n = w < 0 ? cap : n + (size_t)w;
    }
}

static bool reenacts_pytorch_rules(const tr_trace_t *t, const char *user_conf, const char *conf);
static void print_text(const char *trace, const tr_trace_t *t, const replay_result_t *r,
                       const char *user_conf, const char *conf, const char *env_var) {
    printf("replay of %s on %s (%d device%s)\n", trace, sp_backend_name(), r->devices,
           r->devices == 1 ? "" : "s");
    if (user_conf != NULL)
        printf("  settings             --conf '%s'\n", user_conf);
    else if (t->settings.recorded && t->settings.expandable && t->settings.rules[0] &&
             reenacts_pytorch_rules(t, NULL, ""))
        printf("  settings             the snapshot's: '%s', by the recorded run's rules of "
               "sympool (%s)\n",
               conf && *conf ? conf : "defaults", t->settings.rules);
    else if (t->settings.recorded && t->settings.expandable && !expandable_rules_ours())
        printf("  settings             the snapshot's: '%s', by PyTorch's rules "
               "(SYMPOOL_EXPANDABLE_PAGE, _RECYCLE and _BORROW at 0)\n",
               conf && *conf ? conf : "defaults");
    else if (t->settings.recorded)
        printf("  settings             the snapshot's: '%s'\n", conf && *conf ? conf : "defaults");
    else if (env_var != NULL)
        printf("  settings             the environment's %s='%s' (the snapshot records none)\n",
               env_var, conf);
    else
        printf("  settings             defaults (the snapshot records none)\n");
    char items[1024];
    env_items(NULL, items, sizeof items);
    if (items[0] != '\0')
        printf("  environment          %s (each wins over its key in the settings)\n", items);
    if (user_conf == NULL && t->settings.split_bytes != 0) {
        /* The environment's SYMPOOL_MAX_SPLIT_SIZE wins over the recorded bytes
         * (tr_settings_split_to_set): the line says which of the two ran. */
        if (tr_settings_split_to_set(&t->settings) != 0)
            printf("  max_split_size       %llu bytes, as recorded (no whole MiB: "
                   "SYMPOOL_MAX_SPLIT_SIZE)\n",
                   (unsigned long long)t->settings.split_bytes);
        else
            printf("  max_split_size       SYMPOOL_MAX_SPLIT_SIZE=%s from the environment, in "
                   "place of the recorded %llu bytes\n",
                   getenv("SYMPOOL_MAX_SPLIT_SIZE"), (unsigned long long)t->settings.split_bytes);
    }
    if (t->settings.fraction > 0)
        printf("  memory fraction      %.3f of the emulated device (set --capacity to the "
               "recorded GPU's)\n",
               t->settings.fraction);
    if (t->settings.dropped[0])
        printf("  not replayed         %s\n", t->settings.dropped);
    printf("  trace entries        %zu (%zu allocs, %zu frees replayed; %zu empty_cache, %zu "
           "frees held for other streams)\n",
           r->trace_entries, r->allocs, r->frees, r->empty_caches, r->deferred_frees);
    if (r->start_requested)
        printf("  starting state       its live blocks requested under this configuration (the "
               "recorded segment layout is %s): %zu blocks, %.3f GiB (recorded run: "
               "%.3f GiB reserved)\n",
               r->start_rules_differ    ? "expandable segments by PyTorch's rules, replayed by ours"
               : t->settings.expandable ? "expandable segments"
                                        : "fixed segments",
               r->seeded_blocks, gib((double)r->seeded_bytes),
               gib((double)r->pytorch_start_reserved));
    else
        printf("  starting state       the recorded segments: %zu segments, %.3f GiB (recorded "
               "run: %.3f GiB reserved); %zu live blocks in them, %zu more (%.3f GiB) outside\n",
               r->start_segments, gib((double)r->start_bytes),
               gib((double)r->pytorch_start_reserved), r->start_blocks, r->seeded_blocks,
               gib((double)r->seeded_bytes));
    if (r->start_pending > 0)
        printf("  pending at the start %zu blocks freed before recording began while other streams "
               "used them, held until the trace completes their free (or to the end)\n",
               r->start_pending);
    printf("  peak requested       %.3f GiB (trace: %.3f GiB)\n", gib((double)r->peak_requested),
           gib((double)r->trace_peak_requested));
    printf("  peak allocated       %.3f GiB\n", gib((double)r->peak_allocated));
    /* Only where frees pending on other streams hold blocks at the peak: the floor they set. */
    if (r->peak_allocated > 0 && r->peak_active > r->peak_allocated)
        printf("  peak active          %.3f GiB (%.4f x the peak allocated): blocks freed while "
               "other streams used them are held until their work completes, so the peak "
               "reserved cannot be under this\n",
               gib((double)r->peak_active), (double)r->peak_active / (double)r->peak_allocated);
    /* Only where whole pages alone put the ratio past 1.01 (a small peak, or one held by pending
     * frees): no allocator can reach it there, ours included. */
    if (r->peak_allocated > 0 && (double)r->page_floor > 1.01 * (double)r->peak_allocated)
        printf("  page floor           %.3f GiB (%.4f x the peak allocated): the peak active in "
               "whole 2 MiB pages, the granularity of a GPU's memory, so no allocator reserves "
               "less at its peak\n",
               gib((double)r->page_floor), (double)r->page_floor / (double)r->peak_allocated);
    double dev = pct((double)r->peak_reserved, (double)r->pytorch_peak_reserved);
    /* A recorded run that reserved nothing has no percentage to differ by: a replay that
     * reserves something differs from it all the same. */
    bool none_recorded = r->pytorch_peak_reserved == 0 && r->peak_reserved > 0;
    if (none_recorded)
        printf("  peak reserved        %.3f GiB   recorded run: 0 bytes\n",
               gib((double)r->peak_reserved));
    else
        printf("  peak reserved        %.3f GiB   recorded run: %.3f GiB (%+.2f%%)\n",
               gib((double)r->peak_reserved), gib((double)r->pytorch_peak_reserved), dev);
    if (r->peak_allocated > 0 && (double)r->start_reserved > 1.01 * (double)r->peak_allocated)
        printf(
            "  lower bound          %.3f GiB reserved (%.4f x the peak allocated) before the first "
            "event: the starting state's %s\n",
            gib((double)r->start_reserved), (double)r->start_reserved / (double)r->peak_allocated,
            r->start_requested ? "blocks as this configuration placed them"
                               : "recorded segments, kept as they were (their free pages too)");
    printf("  at the end           %.3f GiB reserved, %.3f GiB allocated (recorded run: %.3f GiB "
           "allocated), %.3f GiB free in split segments\n",
           gib((double)r->end_reserved), gib((double)r->end_allocated),
           gib((double)r->pytorch_end_allocated), gib((double)r->end_inactive_split));
    printf("  OOMs                 %zu (recorded run: %zu)\n", r->ooms, r->recorded_ooms);
    printf("  time per event       %.1f ns\n", r->ns_per_event);
    char why[1536];
    if (differs_because(t, r, user_conf, why, sizeof why))
        printf("  differs by more than 2%%:%s\n", why);
}

/* ---- --compare ------------------------------------------------------------------------ */

/* Whether a configuration's item SYMPOOL_NAME=VALUE may be set. Not the options the replay sets
 * itself, which would override the item without a word (SYMPOOL_ALLOC_CONF: the configuration's
 * KEY:VALUE items; SYMPOOL_HOST_CAPACITY with --capacity) or take the replay off the emulated
 * device (SYMPOOL_DEVICE, SYMPOOL_HOST_DEVICES: one host device per recorded device); and not a
 * SYMPOOL_DEBUG_FILE naming the trace, which would have the replay's log lines appended to it
 * (main.c refuses the variable so). */
static bool item_allowed(const char *trace, const char *capacity, const char *name,
                         const char *value, char *err, size_t errlen) {
    if (strcmp(name, "SYMPOOL_ALLOC_CONF") == 0) {
        snprintf(err, errlen,
                 "SYMPOOL_ALLOC_CONF is what the configuration's KEY:VALUE items set: write them "
                 "as items of the configuration (e.g. max_split_size_mb:64)");
        return false;
    }
    if (strcmp(name, "SYMPOOL_DEVICE") == 0 || strcmp(name, "SYMPOOL_HOST_DEVICES") == 0) {
        snprintf(err, errlen,
                 "the replay sets %s itself (the emulated host device, one per recorded device)",
                 name);
        return false;
    }
    if (capacity != NULL && strcmp(name, "SYMPOOL_HOST_CAPACITY") == 0) {
        snprintf(err, errlen,
                 "--capacity sets SYMPOOL_HOST_CAPACITY for every configuration: give the "
                 "capacity one way");
        return false;
    }
    char path[4096];
    if (strcmp(name, "SYMPOOL_DEBUG_FILE") == 0 && value[0] != '\0' &&
        sp_x_path_expand(value, path, sizeof path) && cli_same_file(trace, path)) {
        snprintf(err, errlen,
                 "SYMPOOL_DEBUG_FILE=%s names the trace being replayed (%s): its log lines would "
                 "be appended to it; log elsewhere",
                 value, trace);
        return false;
    }
    return true;
}

/* The options of ours that a configuration's items set, each once, with what was in force before
 * the first of them: the environment's value, or what the replay set through the option API
 * (SYMPOOL_HOST_ARENA). Put back before the next configuration, so that none leaks into it. */
typedef struct item_opt {
    char name[64];   /* SYMPOOL_NAME */
    char value[520]; /* the value to put back, when not to_default */
    bool to_default; /* the option was at its default */
} item_opt_t;
#define MAX_ITEM_OPTS 64 /* more than there are options */
static item_opt_t g_item_opts[MAX_ITEM_OPTS];
static int g_nitem_opts;

static void items_put_back(void) {
    for (int k = 0; k < g_nitem_opts; k++) {
        const item_opt_t *o = &g_item_opts[k];
        if (o->to_default || sp_x_option_set(o->name, o->value) != SP_SUCCESS)
            (void)sp_x_option_set(o->name, NULL);
    }
    g_nitem_opts = 0;
}

/* s without the blanks (spaces, tabs) at its ends: the end is cut in place. */
static char *blanks_cut(char *s) {
    s += strspn(s, " \t");
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    return s;
}

/* Whether the part of a configuration at p (up to end, NULL: to its end) is a SYMPOOL_NAME=VALUE
 * item. */
static bool sympool_item(const char *p, const char *end) {
    p += strspn(p, " \t");
    const char *eq = strchr(p, '=');
    return strncmp(p, "SYMPOOL_", 8) == 0 && eq != NULL && (end == NULL || eq < end);
}

/* Whether the part at p (up to the next comma) continues the list value of the item before it:
 * neither blank nor an item of its own (no ':' of KEY:VALUE, no '=' of NAME=VALUE). */
static bool list_tail(const char *p) {
    size_t n = strcspn(p, ",");
    return strspn(p, " \t") < n && memchr(p, ':', n) == NULL && memchr(p, '=', n) == NULL;
}

/* Whether [p, end) opens more '[' than it closes. */
static bool bracket_open(const char *p, const char *end) {
    int depth = 0;
    for (; p < end; p++)
        depth += *p == '[' ? 1 : *p == ']' ? -1 : 0;
    return depth > 0;
}

/* Before an item first sets name: remember what to put back. False (err) only when there is no
 * room, which the option count rules out; a name that is no option is left to sp_x_option_set. */
static bool item_remember(const char *name, char *err, size_t errlen) {
    for (int k = 0; k < g_nitem_opts; k++)
        if (strcmp(g_item_opts[k].name, name) == 0)
            return true;
    sp_x_option_info_t info;
    for (int i = 0; sp_x_option_info(i, &info); i++) {
        if (strcmp(info.name, name) != 0)
            continue;
        if (g_nitem_opts == MAX_ITEM_OPTS || strlen(name) >= sizeof(g_item_opts[0].name)) {
            snprintf(err, errlen, "too many SYMPOOL_ options in one configuration");
            return false;
        }
        item_opt_t *o = &g_item_opts[g_nitem_opts++];
        snprintf(o->name, sizeof(o->name), "%s", name);
        const char *env = getenv(name);
        o->to_default = false;
        if (strcmp(info.source, "env") == 0 && env != NULL)
            snprintf(o->value, sizeof(o->value), "%s", env);
        else if (strcmp(info.source, "api") == 0)
            snprintf(o->value, sizeof(o->value), "%s", info.value);
        else
            o->to_default = true;
        return true;
    }
    return true;
}

/* A recording made with expandable segments was made under PyTorch's rules: replayed with its
 * own settings alone (no --conf, nothing added), the rules of ours that go past them are off,
 * unless the environment sets them. */
static bool reenacts_pytorch_rules(const tr_trace_t *t, const char *user_conf, const char *conf) {
    return user_conf == NULL && conf[0] == '\0' && t->settings.recorded && t->settings.expandable &&
           getenv("SYMPOOL_EXPANDABLE_PAGE") == NULL &&
           getenv("SYMPOOL_EXPANDABLE_RECYCLE") == NULL &&
           getenv("SYMPOOL_EXPANDABLE_BORROW") == NULL;
}

static const char *const g_our_rules[] = {"SYMPOOL_EXPANDABLE_PAGE", "SYMPOOL_EXPANDABLE_RECYCLE",
                                          "SYMPOOL_EXPANDABLE_BORROW"};

bool replay_fit_capacity(const tr_trace_t *t) {
    sp_x_option_info_t oi;
    if (!cli_option("SYMPOOL_HOST_CAPACITY", &oi) || strcmp(oi.source, "default") != 0)
        return true; /* the user's (the environment's, or set by name) */
    uint64_t most = 0;
    for (int d = 0; d < t->ndev; d++) /* reserved: a trace that requests more is inconsistent */
        most = t->dev[d].peak_reserved > most ? t->dev[d].peak_reserved : most;
    const uint64_t gib = (uint64_t)1 << 30, cap = (uint64_t)64 << 40;
    uint64_t need = most > cap / 2 ? cap : (2 * most + gib - 1) / gib * gib;
    if (need <= (uint64_t)oi.value_int)
        return true;
    char v[32];
    snprintf(v, sizeof v, "%llu", (unsigned long long)need);
    return sp_x_option_set("SYMPOOL_HOST_CAPACITY", v) == SP_SUCCESS;
}

/* The rules of a recording with expandable segments, each as fn takes it (name, value): a
 * sympool snapshot's own (tr_settings_t.rules; those the environment sets stay its), else
 * PyTorch's (ours at 0). */
static bool each_recorded_rule(const tr_trace_t *t, bool (*fn)(const char *, const char *, void *),
                               void *arg) {
    if (t->settings.rules[0] == '\0') {
        for (size_t k = 0; k < sizeof(g_our_rules) / sizeof(g_our_rules[0]); k++)
            if (!fn(g_our_rules[k], "0", arg))
                return false;
        return true;
    }
    for (const char *p = t->settings.rules; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char item[256];
        const char *eq = memchr(p, '=', n);
        if (n >= sizeof item || eq == NULL)
            return false; /* never: read_rules checked every item */
        memcpy(item, p, n);
        item[n] = '\0';
        item[eq - p] = '\0';
        if (getenv(item) == NULL && !fn(item, item + (eq - p) + 1, arg))
            return false;
        p += n + (end ? 1 : 0);
    }
    return true;
}

static bool set_rule(const char *name, const char *value, void *arg) {
    (void)arg;
    return sp_x_option_set(name, value) == SP_SUCCESS;
}

bool replay_recorded_rules(const tr_trace_t *t) {
    return each_recorded_rule(t, set_rule, NULL);
}

/* set_rule for a configuration of --compare: remembered, to be put back before the next. */
typedef struct rule_err {
    char *err;     /* the configuration's error text */
    size_t errlen; /* its room */
} rule_err_t;
static bool set_rule_item(const char *name, const char *value, void *arg) {
    rule_err_t *e = arg;
    if (!item_remember(name, e->err, e->errlen))
        return false;
    if (sp_x_option_set(name, value) != SP_SUCCESS) {
        snprintf(e->err, e->errlen, "%s", sp_last_error());
        return false;
    }
    return true;
}

/* Configure the library for one configuration: PyTorch's KEY:VALUE items go to
 * SYMPOOL_ALLOC_CONF after the base settings (the snapshot's, or --conf: a later key wins), so a
 * configuration changes what the recorded run used rather than starting from our defaults;
 * SYMPOOL_NAME=VALUE items set that option of ours. Every option starts from the environment
 * again, so one configuration never leaks into the next. The SYMPOOL_ALLOC_CONF it set goes to
 * alloc (len bytes), the recorded max_split_size it set to the byte to *split_p (0: none). */
static bool apply_conf(const char *trace, const char *base, const tr_trace_t *t,
                       const tr_settings_t *recorded, const char *conf, const char *capacity,
                       bool recorded_rules, char *alloc, size_t len, uint64_t *split_p, char *err,
                       size_t errlen) {
    *split_p = 0;
    items_put_back(); /* what the previous configuration's items set */
    rule_err_t rule_err = {err, errlen};
    if (recorded_rules && !each_recorded_rule(t, set_rule_item, &rule_err)) {
        if (!err[0])
            snprintf(err, errlen, "%s", sp_last_error());
        return false;
    }
    size_t used = (size_t)snprintf(alloc, len, "%s", base);
    if (used >= len) {
        snprintf(err, errlen, "configuration too long: '%.64s...'", base);
        return false;
    }
    const char *p = conf;
    bool sets_split = false; /* the configuration's own max_split_size replaces the recorded one */
    while (*p) {
        const char *end = strchr(p, ',');
        /* A SYMPOOL_ item's value may be a comma list (SYMPOOL_DEBUG_SUBSYS=INIT,POOL): the
         * parts after it that are no item (no KEY:VALUE, no NAME=VALUE, not blank) are its own,
         * and so is all up to the ']' that closes a '[' in it (SYMPOOL_ROUNDUP_POWER2_DIVISIONS=
         * [64:8,>:1]). They were sent to ALLOC_CONF, which refused "POOL" as "expected
         * key:value". */
        if (sympool_item(p, end))
            while (end != NULL && (list_tail(end + 1) || bracket_open(p, end)))
                end = strchr(end + 1, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char item[256];
        if (n >= sizeof(item)) {
            snprintf(err, errlen, "configuration item too long in '%s'", conf);
            return false;
        }
        memcpy(item, p, n);
        item[n] = '\0';
        char *key = item + strspn(item, " \t");
        sets_split = sets_split || strncmp(key, "max_split_size_mb", 17) == 0 ||
                     strncmp(key, "SYMPOOL_MAX_SPLIT_SIZE", 22) == 0;
        char *eq = strchr(key, '=');
        /* Blanks around an item, its name and its value are the writer's layout, as they are
         * around ALLOC_CONF's keys and values ("max_split_size_mb:64, SYMPOOL_THREAD_CACHE=1MiB"
         * sent the SYMPOOL_ item to ALLOC_CONF, which refused it as "expected key:value"). */
        if (strncmp(key, "SYMPOOL_", 8) == 0 && eq != NULL) {
            *eq = '\0';
            const char *name = blanks_cut(key), *value = blanks_cut(eq + 1);
            if (!item_allowed(trace, capacity, name, value, err, errlen))
                return false;
            if (!item_remember(name, err, errlen))
                return false;
            if (sp_x_option_set(name, value) != SP_SUCCESS) {
                snprintf(err, errlen, "%s", sp_last_error());
                return false;
            }
        } else if (n > 0) {
            if (used + n + 2 >= len) {
                snprintf(err, errlen, "configuration too long: '%s'", conf);
                return false;
            }
            used += (size_t)snprintf(alloc + used, len - used, "%s%s", used ? "," : "", item);
        }
        p += n + (end ? 1 : 0);
    }
    /* A recorded max_split_size of no whole MiB is no item of base (tr_settings_t.split_bytes):
     * set as its option, remembered to be put back as the items are. */
    if (recorded != NULL && recorded->split_bytes != 0 && !sets_split &&
        (!item_remember("SYMPOOL_MAX_SPLIT_SIZE", err, errlen) ||
         !tr_settings_set_split(recorded))) {
        if (!err[0])
            snprintf(err, errlen, "%s", sp_last_error());
        return false;
    }
    if (recorded != NULL && !sets_split)
        *split_p = tr_settings_split_to_set(recorded);
    if (sp_x_option_set("SYMPOOL_ALLOC_CONF", alloc) != SP_SUCCESS ||
        (capacity != NULL && sp_x_option_set("SYMPOOL_HOST_CAPACITY", capacity) != SP_SUCCESS)) {
        snprintf(err, errlen, "%s", sp_last_error());
        return false;
    }
    return true;
}

/* One replay per repeat on a fresh allocator each; the median time per event. */
static bool replay_median(const tr_trace_t *t, const char *snapshot, int repeat, const char *conf,
                          const char *capacity, replay_result_t *r, char *err, size_t errlen) {
    double ns[64];
    int nrep = repeat < 64 ? repeat : 64;
    bool ok =
        init_capped(t->ndev, capacity, err, errlen) && replay_trace(t, snapshot, r, err, errlen);
    ns[0] = r->ns_per_event;
    for (int k = 1; ok && k < nrep; k++) {
        replay_result_t again;
        memset(&again, 0, sizeof(again));
        ok = restart(t->ndev, capacity, err, errlen) && replay_trace(t, NULL, &again, err, errlen);
        ns[k] = again.ns_per_event;
    }
    if (ok && nrep > 1) {
        qsort(ns, (size_t)nrep, sizeof(ns[0]), cmp_double);
        r->ns_per_event = ns[nrep / 2];
    }
    if (!ok && err[0] == '\0')
        snprintf(err, errlen, "sp_init: %s", sp_last_error());
    return ok;
}

/* The summary line answers "which configuration fits in N GiB, at what peak": with --capacity
 * the configurations that ran without OOM, least peak reserved first, each with its peak, then
 * those that did not fit with their OOM counts, fewest first; without it, what each needs (its
 * peak). */
static void print_answer(const char *const *confs, const char *empty, const replay_result_t *rs,
                         int n, const char *capacity) {
    int order[MAX_COMPARE_ROWS], fits = 0;
    for (int i = 0; i < n; i++)
        order[i] = i;
    /* insertion sort: fitting first by peak reserved, then the others by OOMs */
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0; k--) {
            const replay_result_t *a = &rs[order[k - 1]], *b = &rs[order[k]];
            bool swap = (a->ooms > 0) != (b->ooms > 0) ? a->ooms > 0
                        : a->ooms != b->ooms           ? b->ooms < a->ooms
                                                       : b->peak_reserved < a->peak_reserved;
            if (!swap)
                break;
            int tmp = order[k];
            order[k] = order[k - 1];
            order[k - 1] = tmp;
        }
    /* Without --capacity a configuration can still run out of memory (SYMPOOL_HOST_CAPACITY in
     * the environment or as an item): its peak is then no need, and it is named by its OOMs. */
    for (int i = 0; i < n; i++)
        fits += rs[i].ooms == 0;
    bool any_oom = fits < n, limited = capacity != NULL || any_oom;
    if (capacity && fits == 0)
        printf("  does not fit in %s with any of the %d configurations:", capacity, n);
    else if (capacity)
        printf("  fits in %s with %d of %d configurations:", capacity, fits, n);
    else if (fits == 0)
        printf("  runs out of memory with each of the %d configurations (a capacity in force):", n);
    else if (any_oom)
        printf("  runs without OOM with %d of %d configurations (a capacity in force), least peak "
               "reserved first:",
               fits, n);
    else
        printf("  peak reserved (the memory the job needs), least first:");
    for (int j = 0; j < n; j++) {
        int i = order[j];
        const char *name = confs[i][0] ? confs[i] : empty;
        if (limited && rs[i].ooms > 0)
            printf("%s '%s' (%zu OOMs)",
                   j == 0      ? ""
                   : j == fits ? "; not with"
                               : ",",
                   name, rs[i].ooms);
        else
            printf("%s '%s' at %.3f GiB peak", j == 0 ? "" : ",", name,
                   gib((double)rs[i].peak_reserved));
    }
    printf("\n");
}

/* --compare's text: the recorded max_split_size of no whole MiB, which the settings line (whole
 * MiB terms) cannot show, with the configurations it ran in (split[i] not 0: those that set no
 * max_split_size of their own; empty names the "" configuration as the table does). */
static void print_compare_split(const tr_trace_t *t, const char *const *confs, const char *empty,
                                const uint64_t *split, int n) {
    int ran = 0;
    for (int i = 0; i < n; i++)
        ran += split[i] != 0;
    if (ran == 0)
        return;
    printf("  max_split_size: %llu bytes, as recorded (no whole MiB: SYMPOOL_MAX_SPLIT_SIZE), in ",
           (unsigned long long)t->settings.split_bytes);
    if (ran == n) {
        printf("every configuration\n");
        return;
    }
    const char *sep = "";
    for (int i = 0; i < n; i++) {
        if (split[i] != 0) {
            if (confs[i][0])
                printf("%s'%s'", sep, confs[i]);
            else
                printf("%s%s", sep, empty);
            sep = ", ";
        }
    }
    printf("\n");
}

/* Whether the recorded bytes replay_once adds up over t's devices stay within 64 bits: else
 * false with what in err. Each device's are below 4 EiB (the loader's bound, tools/trace.c),
 * which keeps its own sums exact, but 64 devices hold up to 256 EiB: five devices of 3.5 EiB
 * reported PyTorch's peak reserved as 1.5 EiB (35 x 2^59 wrapped at 2^64). */
static bool device_sums_fit(const tr_trace_t *t, char *err, size_t errlen) {
    enum { N = 7 };
    static const char *const names[N] = {"peak reserved",
                                         "reserved at the end",
                                         "reserved at the start",
                                         "peak requested",
                                         "allocated at the end",
                                         "start segments",
                                         "live blocks before the trace"};
    uint64_t sum[N] = {0};
    for (int d = 0; d < t->ndev; d++) {
        const tr_device_t *td = &t->dev[d];
        /* loose_bytes, the live blocks outside the start segments, are a part of seeded_bytes. */
        const uint64_t v[N] = {td->peak_reserved,  td->final_reserved,  td->start_reserved,
                               td->peak_requested, td->final_allocated, td->start_bytes,
                               td->seeded_bytes};
        for (int k = 0; k < N; k++) {
            if (sum[k] + v[k] < sum[k]) {
                snprintf(err, errlen,
                         "the recorded %s of devices 0 to %d together reach 16 EiB, past what "
                         "the replay's sums over devices hold (each device's is below 4 EiB)",
                         names[k], d);
                return false;
            }
            sum[k] += v[k];
        }
    }
    return true;
}

/* `replay TRACE --compare CONF...`: every configuration on a fresh allocator, one table (or one
 * JSON object per configuration), and with --capacity the answer: does the job fit, and with
 * which configuration. */
static int replay_compare(const char *trace, const tr_trace_t *t, const char *user_conf,
                          const char *const *confs, int n, const char *capacity, bool json,
                          int repeat) {
    /* Every configuration starts from what the recorded run used (or --conf). */
    const char *base = user_conf ? user_conf : t->settings.recorded ? t->settings.conf : "";
    const char *empty =
        !base[0]    ? "(defaults)"
        : user_conf ? "(--conf)"
        : reenacts_pytorch_rules(t, NULL, "")
            ? (t->settings.rules[0] ? "(recorded, its rules)" : "(recorded, PyTorch's rules)")
            : "(recorded)";
    replay_result_t *rs = calloc((size_t)n, sizeof(*rs));
    char(*eff)[1024] = calloc((size_t)n, sizeof(*eff));  /* each one's SYMPOOL_ALLOC_CONF */
    char(*envs)[512] = calloc((size_t)n, sizeof(*envs)); /* the environment's items it ran with */
    uint64_t split[MAX_COMPARE]; /* each one's recorded max_split_size set to the byte (0: none) */
    if (rs == NULL || eff == NULL || envs == NULL) {
        free(rs);
        free(eff);
        free(envs);
        fprintf(stderr, "sympool replay: out of memory\n");
        return 1;
    }
    char err[512] = "";
    size_t oom_lines = 0;
    int rc = 0;
    /* Every configuration is checked before the first replay: a bad one is refused before
     * anything runs, not after the ones before it have replayed. */
    quiet_options_begin();
    for (int i = 0; i < n && rc == 0; i++) {
        if (!apply_conf(trace, base, t, user_conf ? NULL : &t->settings, confs[i], capacity,
                        reenacts_pytorch_rules(t, user_conf, confs[i]), eff[i], sizeof(eff[i]),
                        &split[i], err, sizeof(err))) {
            fprintf(stderr, "sympool replay: configuration '%s': %s\n", confs[i], err);
            rc = confs[i][0] ? 2 : 1;
        }
    }
    items_put_back();
    quiet_options_end();
    if (rc != 0) {
        free(rs);
        free(eff);
        free(envs);
        return rc;
    }
    cli_log_open();
    sp_x_log_set_fn(log_filter, &oom_lines);
    for (int i = 0; i < n && rc == 0; i++) {
        err[0] = '\0';
        bool applied = sp_shutdown() == SP_SUCCESS &&
                       apply_conf(trace, base, t, user_conf ? NULL : &t->settings, confs[i],
                                  capacity, reenacts_pytorch_rules(t, user_conf, confs[i]), eff[i],
                                  sizeof(eff[i]), &split[i], err, sizeof(err));
        /* A configuration's SYMPOOL_DEBUG_FILE item is where its lines go, as the library's. */
        if (applied)
            cli_log_open();
        /* One that adds items asks what sympool would do, as --conf does, starting state
         * included (replay_once: a recording's expandable pages are PyTorch's rules', not what
         * ours would hold); it started from the recorded pages, and the same configuration gave
         * two answers (1.0140 here against 1.0001 with --conf on a recording made so). */
        replay_set_user_conf(user_conf != NULL || confs[i][0] != '\0');
        if (applied)
            env_items(eff[i], envs[i], sizeof envs[i]);
        /* Every configuration was accepted above: one that fails now failed to run (a
         * reservation the address space cannot hold, sympool's own error), exit 1 as with
         * --conf, not 2, which says the command line was refused before anything ran. */
        if (!applied ||
            !replay_median(t, NULL, repeat, eff[i], capacity, &rs[i], err, sizeof(err))) {
            fprintf(stderr, "sympool replay: configuration '%s': %s\n", confs[i], err);
            rc = 1;
        }
    }
    sp_x_log_set_fn(NULL, NULL);
    if (rc == 0 && json) {
        char ran[sizeof(*eff) + 48], all[sizeof ran + sizeof(*envs)];
        for (int i = 0; i < n; i++) {
            snprintf(all, sizeof all, "%s%s", conf_ran(eff[i], split[i], ran, sizeof ran), envs[i]);
            print_json(trace, &rs[i], confs[i], all, capacity, NULL);
        }
    } else if (rc == 0) {
        printf("replay of %s: %d configuration%s%s%s\n", trace, n, n == 1 ? "" : "s",
               capacity ? " at capacity " : "", capacity ? capacity : "");
        if (user_conf != NULL)
            printf("  settings: --conf '%s', each configuration's items added\n", user_conf);
        else if (t->settings.recorded)
            printf("  settings: the snapshot's '%s', each configuration's items added\n",
                   base[0] ? base : "defaults");
        else
            printf("  settings: defaults (the snapshot records none), each configuration's items "
                   "added\n");
        if (envs[0][0] != '\0')
            printf("  environment: %s (each wins over its key in the settings, unless a "
                   "configuration sets its own)\n",
                   envs[0][0] == ',' ? envs[0] + 1 : envs[0]);
        print_compare_split(t, confs, empty, split, n);
        printf("  %-44s %12s %9s %10s %6s %9s\n", "configuration", "peak GiB", "/alloc",
               "/recorded", "OOMs", "ns/event");
        for (int i = 0; i < n; i++) {
            const replay_result_t *r = &rs[i];
            printf("  %-44s %12.3f %9.4f %+9.2f%% %6zu %9.1f\n", confs[i][0] ? confs[i] : empty,
                   gib((double)r->peak_reserved),
                   r->peak_allocated ? (double)r->peak_reserved / (double)r->peak_allocated : 0.0,
                   r->pytorch_peak_reserved
                       ? 100.0 * ((double)r->peak_reserved - (double)r->pytorch_peak_reserved) /
                             (double)r->pytorch_peak_reserved
                       : 0.0,
                   r->ooms, r->ns_per_event);
        }
        printf("  recorded run: PyTorch reserved %.3f GiB at its peak\n",
               gib((double)rs[0].pytorch_peak_reserved));
        print_answer(confs, empty, rs, n, capacity);
    }
    if (oom_lines > 1)
        fprintf(stderr, "sympool replay: %zu more out-of-memory warnings not shown\n",
                oom_lines - 1);
    (void)sp_shutdown();
    free(rs);
    free(eff);
    free(envs);
    return rc;
}

static int usage(FILE *out, int rc) {
    fprintf(
        out,
        "usage: sympool replay TRACE [options]\n"
        "  Replay a PyTorch memory snapshot's trace (.pickle or .json) through sympool on the\n"
        "  emulated host device and compare the peaks with what PyTorch reserved.\n"
        "  -c, --conf=KEY:VALUE,...   allocator options (PYTORCH_CUDA_ALLOC_CONF syntax)\n"
        "      --capacity=SIZE        emulated device size (e.g. 80GiB); OOMs are counted;\n"
        "                             without it SYMPOOL_HOST_CAPACITY, else 80 GiB or twice\n"
        "                             the recorded peak of the largest device if more\n"
        "  -s, --snapshot=OUT         write our snapshot of the replay (OUT.pickle or "
        "OUT.json;\n"
        "                             %%h, %%p, %%r in OUT: host, pid, rank, 0 outside a "
        "launcher)\n"
        "  -j, --json                 one JSON object on stdout (one line per configuration)\n"
        "      --compare CONF [CONF...]  replay once per configuration on a fresh allocator, one\n"
        "                             table; each starts from the snapshot's settings (or\n"
        "                             --conf; \"\" = those alone), its KEY:VALUE items added\n"
        "                             to SYMPOOL_ALLOC_CONF, SYMPOOL_NAME=VALUE items set that\n"
        "                             option (not SYMPOOL_ALLOC_CONF, _DEVICE, _HOST_DEVICES,\n"
        "                             which the replay sets); with --capacity it says which\n"
        "                             configurations fit. The CONFs are the words after it\n"
        "                             (TRACE first; --compare=CONF gives the first one)\n"
        "  -r, --repeat=N             replay N times (1-64), report the median time per "
        "event\n"
        "  -h, --help                 this text\n");
    return rc;
}

typedef struct replay_args {
    const char *trace, *conf, *capacity, *snapshot;
    const char *compare[MAX_COMPARE]; /* --compare configurations */
    int ncompare;                     /* 0: no --compare */
    bool json;
    int repeat;
} replay_args_t;

/* A word of the command line that is no option: the trace, then (after --compare)
 * configurations. False (said) when there is no room for it. */
static bool take_word(replay_args_t *a, bool compare, const char *word) {
    if (compare) {
        if (a->ncompare == MAX_COMPARE) {
            fprintf(stderr, "sympool replay: at most %d configurations\n", MAX_COMPARE);
            return false;
        }
        a->compare[a->ncompare++] = word;
    } else if (a->trace == NULL) {
        a->trace = cli_input(word);
    } else {
        fprintf(stderr, "sympool replay: more than one trace given ('%s')\n", word);
        return false;
    }
    return true;
}

/* Parse the command line; returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, replay_args_t *a) {
    static const struct option opts[] = {
        {"conf", required_argument, NULL, 'c'},     {"capacity", required_argument, NULL, 'C'},
        {"snapshot", required_argument, NULL, 's'}, {"json", no_argument, NULL, 'j'},
        {"compare", optional_argument, NULL, 'K'},  {"repeat", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},           {0, 0, 0, 0}};
    memset(a, 0, sizeof(*a));
    a->repeat = 1;
    bool compare = false;
    const char *repeat_given = NULL;
    int c;
    long n;
    /* '-': words that are not options come back in order as 1, so the CONFs after --compare
     * stay with it. */
    while ((c = cli_getopt(argc, argv, "replay", "-c:s:jr:h", opts)) != -1) {
        switch (c) {
        case 'h':
            return usage(stdout, 0);
        case 'c':
            if (!cli_once("replay", "--conf", &a->conf, optarg))
                return 2;
            break;
        case 'C':
            if (!cli_once("replay", "--capacity", &a->capacity, optarg))
                return 2;
            break;
        case 's':
            if (!cli_once("replay", "--snapshot", &a->snapshot, optarg))
                return 2;
            if (!cli_has_suffix(optarg, ".pickle") && !cli_has_suffix(optarg, ".json")) {
                fprintf(stderr,
                        "sympool replay: --snapshot writes OUT.pickle or OUT.json, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'j':
            a->json = true;
            break;
        case 'K':
            compare = true;
            /* --compare=CONF: the first configuration, as every option takes --opt=value
             * (it was refused as "takes no value"); the others follow as words. */
            if (optarg != NULL && !take_word(a, compare, optarg))
                return 2;
            break;
        case 'r':
            if (!cli_once("replay", "--repeat", &repeat_given, optarg))
                return 2;
            if (!cli_parse_long(optarg, 1, 64, &n)) {
                fprintf(stderr, "sympool replay: --repeat takes 1 to 64, not '%s'\n", optarg);
                return 2;
            }
            a->repeat = (int)n;
            break;
        case 1: /* a word: the trace, then (after --compare) configurations */
            if (!take_word(a, compare, optarg))
                return 2;
            break;
        default:
            return 2;
        }
    }
    /* The words after "--" (getopt stops there): a trace named like an option, "-t.pickle", and
     * then configurations. They were dropped, and the trace was "not given". */
    for (int k = optind; k < argc; k++)
        if (!take_word(a, compare, argv[k]))
            return 2;
    if (a->trace == NULL) {
        fprintf(stderr, "sympool replay: no trace given\n");
        return usage(stderr, 2);
    }
    if (compare && a->ncompare == 0) {
        fprintf(stderr, "sympool replay: --compare needs at least one configuration\n");
        return 2;
    }
    if (compare && a->snapshot) {
        fprintf(stderr, "sympool replay: --compare does not go with --snapshot\n");
        return 2;
    }
    return -1;
}

/* Takes the allocator configuration's variables out of the environment before the option table
 * is read, where the replay sets SYMPOOL_ALLOC_CONF itself: a malformed one was warned about
 * ("that entry is ignored") though the replay never used it. Where the replay runs with the
 * environment's (no --conf, no --compare, a snapshot without settings) they stay, and warn. */
static void env_conf_drop(void) {
    static const char *const names[] = {"SYMPOOL_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                                        "PYTORCH_CUDA_ALLOC_CONF"};
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++)
        unsetenv(names[k]);
}

int sp_cli_replay(int argc, char **argv) {
    replay_args_t a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    char snap_file[4096] = "";
    if (a.snapshot != NULL && !cli_output_path(a.snapshot, snap_file, sizeof snap_file)) {
        /* The checks below would look at another file than the one sp_dump_snapshot writes. */
        fprintf(stderr, "sympool replay: --snapshot %s: %s (it expands to more than %zu bytes)\n",
                a.snapshot, strerror(ENAMETOOLONG), sizeof snap_file - 1);
        return 1;
    }
    if (a.snapshot != NULL && cli_same_file(a.trace, snap_file)) {
        /* The recorded trace would be replaced by the replay's snapshot: refused before
         * anything is read or written. */
        fprintf(stderr,
                "sympool replay: --snapshot %s is the trace being replayed (%s); it would be "
                "replaced: write the snapshot elsewhere\n",
                a.snapshot, a.trace);
        return 2;
    }
    if (a.snapshot != NULL && !cli_output_not_log("replay", "--snapshot", snap_file))
        return 2;
    if (a.snapshot != NULL && !cli_output_ok("replay", "--snapshot", snap_file))
        return 1;
    /* --conf and --capacity are checked before the trace is read where they can be (a large one
     * takes a while): a bad value is a usage error, refused before anything is done. */
    char why[512];
    if (a.conf != NULL && !sp_x_alloc_conf_check(a.conf, why, sizeof why)) {
        fprintf(stderr, "sympool replay: --conf '%s' is not valid: %s\n", a.conf, why);
        return 2;
    }
    /* Checked without reading the option table: that read waits for the trace (below). */
    if (a.capacity != NULL &&
        !sp_x_option_check("SYMPOOL_HOST_CAPACITY", a.capacity, why, sizeof why)) {
        fprintf(stderr, "sympool replay: --capacity: %s\n", why);
        return 2;
    }
    char err[512];
    tr_trace_t t;
    cli_heap_prepare(a.trace);
    tr_keep_file_mapped(true); /* one load, and the process exits after the replay */
    /* With --snapshot, the stacks are written out whole: a file whose memo repeats them past
     * what it could hold is refused before the replay (tr_stacks_within_input). */
    if (!tr_load_opts(a.trace, a.snapshot != NULL, &t, err, sizeof(err)) ||
        (a.snapshot != NULL && !tr_stacks_within_input(&t, a.trace, err, sizeof(err)))) {
        fprintf(stderr, "sympool replay: %s\n", err);
        tr_free(&t);
        return 1;
    }
    /* A replay always runs on the emulated device, with one device per recorded device.
     * Loading the trace may already have read the option table (logging does), so the choices
     * go through the option API, which wins over the variables and takes effect at init.
     * Replay never touches the memory: it carves address space from one reservation instead of
     * a mmap/munmap pair per segment (same budget and OOMs), unless SYMPOOL_HOST_ARENA says
     * otherwise (=0 measures the old way). */
    /* One emulated device per recorded one, and SYMPOOL_HOST_DEVICES allows 64 (core/options.c,
     * check_devices): a snapshot naming device 64 or above is refused here, saying so, not with
     * the option's warning and an error that blames a SYMPOOL_HOST_DEVICES nobody set. */
    if (t.ndev > REPLAY_MAX_DEVICES) {
        fprintf(stderr,
                "sympool replay: %s: the snapshot has %d devices (segments or device_traces up to "
                "device %d); the replay emulates at most %d\n",
                a.trace, t.ndev, t.ndev - 1, REPLAY_MAX_DEVICES);
        tr_free(&t);
        return 1;
    }
    if (!device_sums_fit(&t, err, sizeof err)) {
        fprintf(stderr, "sympool replay: %s: %s\n", a.trace, err);
        tr_free(&t);
        return 1;
    }
    /* --conf, --compare and the snapshot's settings set SYMPOOL_ALLOC_CONF (below): the
     * environment's is then unused, and goes before the option table is read. */
    if (a.conf != NULL || a.ncompare > 0 || t.settings.recorded)
        env_conf_drop();
    char ndev[16];
    snprintf(ndev, sizeof(ndev), "%d", t.ndev > 1 ? t.ndev : 1);
    setenv("SYMPOOL_DEVICE", "host", 1);
    quiet_options_begin();
    bool set = sp_x_option_set("SYMPOOL_DEVICE", "host") == SP_SUCCESS &&
               (t.ndev <= 1 || sp_x_option_set("SYMPOOL_HOST_DEVICES", ndev) == SP_SUCCESS) &&
               (getenv("SYMPOOL_HOST_ARENA") != NULL ||
                sp_x_option_set("SYMPOOL_HOST_ARENA", "1") == SP_SUCCESS) &&
               (a.capacity != NULL || replay_fit_capacity(&t));
    quiet_options_end();
    if (!set) {
        fprintf(stderr, "sympool replay: %s\n", sp_last_error());
        tr_free(&t);
        return 1;
    }
    /* Settings PyTorch cannot have: the snapshot is invalid, not the command line (info and
     * summary say so too; the loader found it). --compare starts from them as well. */
    if (a.conf == NULL && t.settings.recorded && t.settings.invalid[0] != '\0') {
        fprintf(stderr,
                "sympool replay: %s: allocator_settings read as SYMPOOL_ALLOC_CONF='%s' are not "
                "valid: %s (PyTorch refuses them; --conf replaces them)\n",
                a.trace, t.settings.conf, t.settings.invalid);
        tr_free(&t);
        return 1;
    }
    replay_set_user_conf(a.conf != NULL);
    if (a.ncompare > 0) {
        rc = replay_compare(a.trace, &t, a.conf, a.compare, a.ncompare, a.capacity, a.json,
                            a.repeat);
        tr_free(&t);
        return rc;
    }
    /* Without --conf the replay runs with the settings the snapshot records.
     * sp_x_option_set validates the values (a bad variable would only warn and keep the
     * default, which would silently replay something else than asked). */
    const char *conf = a.conf;
    if (conf == NULL && t.settings.recorded)
        conf = t.settings.conf;
    quiet_options_begin(); /* ended before init_capped: its warnings show */
    if (conf != NULL && a.conf == NULL &&
        sp_x_option_set("SYMPOOL_ALLOC_CONF", conf) != SP_SUCCESS) {
        /* Settings PyTorch cannot have: the snapshot is invalid, not the command line. */
        fprintf(stderr,
                "sympool replay: %s: allocator_settings read as SYMPOOL_ALLOC_CONF='%s' are not "
                "valid: %s\n",
                a.trace, conf, sp_last_error());
        tr_free(&t);
        return 1;
    }
    /* A recording made with expandable segments re-enacted by PyTorch's rules (--conf asks what
     * sympool would do, and keeps ours). */
    if (reenacts_pytorch_rules(&t, a.conf, "") && !replay_recorded_rules(&t)) {
        fprintf(stderr, "sympool replay: %s\n", sp_last_error());
        tr_free(&t);
        return 1;
    }
    if ((conf != NULL && sp_x_option_set("SYMPOOL_ALLOC_CONF", conf) != SP_SUCCESS) ||
        (a.conf == NULL && !tr_settings_set_split(&t.settings)) ||
        (a.capacity != NULL &&
         sp_x_option_set("SYMPOOL_HOST_CAPACITY", a.capacity) != SP_SUCCESS)) {
        fprintf(stderr, "sympool replay: %s\n", sp_last_error());
        tr_free(&t);
        return 2;
    }
    quiet_options_end();
    if (!init_capped(t.ndev, a.capacity, err, sizeof(err))) {
        fprintf(stderr, "sympool replay: %s\n", err);
        tr_free(&t);
        return 1;
    }
    char env_conf[sizeof(((sp_x_option_info_t *)0)->value)];
    const char *env_var = conf == NULL ? env_conf_in_force(env_conf, sizeof env_conf) : NULL;
    if (env_var != NULL)
        conf = env_conf;
    replay_result_t r;
    size_t oom_lines = 0;
    cli_log_open();
    sp_x_log_set_fn(log_filter, &oom_lines);
    /* --repeat: replay again on a fresh allocator each time and report the median time per event
     * (the peaks are the same every time: the replay is deterministic). A single replay is the
     * process's last use of sympool: what it holds is left to the exit. */
    double ns[64];
    int nrep = a.repeat < 64 ? a.repeat : 64;
    bool ok = replay_once(&t, a.snapshot, nrep <= 1, &r, err, sizeof(err));
    ns[0] = r.ns_per_event;
    for (int k = 1; ok && k < nrep; k++) {
        replay_result_t again;
        memset(&again, 0, sizeof(again));
        ok = restart(t.ndev, a.capacity, err, sizeof(err)) &&
             replay_trace(&t, NULL, &again, err, sizeof(err));
        ns[k] = again.ns_per_event;
    }
    if (ok && nrep > 1) {
        qsort(ns, (size_t)nrep, sizeof(ns[0]), cmp_double);
        r.ns_per_event = ns[nrep / 2];
    }
    sp_x_log_set_fn(NULL, NULL);
    if (oom_lines > 1)
        fprintf(stderr, "sympool replay: %zu more out-of-memory warnings not shown\n",
                oom_lines - 1);
    if (!ok) {
        fprintf(stderr, "sympool replay: %s\n", err);
        tr_free(&t);
        (void)sp_shutdown();
        return 1;
    }
    if (a.json) {
        char because[1536], ran[sizeof(t.settings.conf) + 48], items[1024];
        char all[sizeof ran + sizeof items];
        const char *shown = conf_ran(
            conf, a.conf == NULL ? tr_settings_split_to_set(&t.settings) : 0, ran, sizeof ran);
        env_items(shown, items, sizeof items);
        if (items[0] != '\0') { /* the environment's own variables, after what they win over */
            snprintf(all, sizeof all, "%s%s", shown ? shown : "", items);
            shown = all;
        }
        print_json(a.trace, &r, shown, shown, a.capacity,
                   differs_because(&t, &r, a.conf, because, sizeof because) ? because : NULL);
    } else {
        print_text(a.trace, &t, &r, a.conf, conf, env_var);
    }
    tr_free(&t);
    if (nrep > 1)
        (void)sp_shutdown();
    return 0;
}
