/*
 * trace.h: a PyTorch memory snapshot (as `sympool replay` and `sympool plot` need it): each
 * device's trace events in order, the blocks that were live before recording began (seeds), and
 * what PyTorch itself reserved over the recorded run. Plus the address map both tools use.
 */
#ifndef SP_TOOLS_TRACE_H
#define SP_TOOLS_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tools/pickle_read.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PyTorch's trace actions (same order as its TraceEntry::Action). */
typedef enum {
    TR_ALLOC,
    TR_FREE_REQUESTED,
    TR_FREE_COMPLETED,
    TR_SEGMENT_ALLOC,
    TR_SEGMENT_FREE,
    TR_SEGMENT_MAP,
    TR_SEGMENT_UNMAP,
    TR_SNAPSHOT,
    TR_OOM,
    /* "user_defined": an annotation (a record_function scope's name as its frames) that some
     * PyTorch versions wrote among the allocator's entries, before they moved to the snapshot's
     * external_annotations; it allocates nothing: ignored, but not an unknown action */
    TR_ANNOTATION,
    TR_OTHER /* an action this version does not know: kept, ignored */
} tr_action_t;

/* tr_event_t.flags */
#define TR_F_DEFERRED 1u    /* free_requested whose free_completed comes later (stream uses) */
#define TR_F_EMPTY_CACHE 2u /* first of a run of segment frees the user's empty_cache made */
/* first of a run of segment frees read as garbage collection inside the malloc after it (a
 * threshold and a fraction recorded), which may as well be the user's empty_cache before that
 * malloc: the replay empties the cache there unless its own allocator collects at that malloc
 * (reserved past the threshold's bytes, known only there: the device's size is not recorded).
 * Set by the analysis, after the loader's own check bits (trace.c's RF_*, which share this
 * one) are cleared. */
#define TR_F_MAYBE_GC 16u
#define TR_F_POOL_ID 4u /* the entry names its pool (newer PyTorch's "pool_id"): pool is it */
#define TR_F_COMPLETION                                                                            \
    8u /* recorded as a free_completed that no free_requested preceded, of a                       \
        * block an alloc of the trace made: read as its free (the action is                        \
        * TR_FREE_REQUESTED) */

typedef struct tr_event {
    tr_action_t action; /* what happened */
    uint8_t flags;      /* TR_F_* */
    /* 1: a free_completed that ends a held free (a TR_F_DEFERRED free_requested's, or a block's
     * pending before the first entry): requested bytes go down there (tr_requested_delta). Not
     * one of the flags: the loader keeps its own checks in their free bits meanwhile (RF_*). */
    uint8_t held_end;
    uint16_t pool;   /* 1 + index into the device's pools, 0 = default pool (alloc,
                      * segment frees) */
    uint64_t addr;   /* block/segment address; device free bytes for oom */
    uint64_t size;   /* bytes (alloc: requested; free_*: requested_size; segment_*) */
    uint64_t stream; /* recorded stream handle, 0 = default */
} tr_event_t;

/* When and where an event happened: what only the commands that keep stacks read (a replay's
 * own snapshot, plot, summary), kept apart from tr_event_t so that a replay without them walks
 * and first touches 32 bytes an event instead of 48 (tr_device_t.at). */
typedef struct tr_event_at {
    int64_t time_us;          /* 0 when absent */
    const pk_value_t *frames; /* list of frame dicts, or NULL */
} tr_event_at_t;

typedef struct tr_seed {
    uint64_t addr;            /* address of the block in the recorded run */
    uint64_t size;            /* requested size */
    uint64_t bsize;           /* block size when the final state shows it, else 0 */
    uint64_t stream;          /* recorded stream */
    const pk_value_t *frames; /* frames of the block, or NULL */
    bool in_start;            /* inside a start segment (rebuilt with it, not requested) */
    bool pending;             /* freed before recording began, its free still waiting for other
                               * streams' work at the end ("active_pending_free") */
    uint16_t pool;            /* 1 + index into the device's pools, 0 = default pool */
} tr_seed_t;

/* A block of a segment that existed before recording began, as it was then. */
typedef struct tr_sblock {
    uint64_t addr;            /* recorded address */
    uint64_t size;            /* block bytes */
    uint64_t req;             /* requested bytes */
    const pk_value_t *frames; /* its stack, or NULL */
} tr_sblock_t;

/* A free block of a segment that existed before recording began, as the final state shows it,
 * that no event of the trace touches (names an address in it or next to it): so it was there,
 * as it is, before recording began, with the requested size it shows (PyTorch keeps the last
 * one on a free block: docs/API.md). */
typedef struct tr_sfree {
    uint64_t addr, size, req; /* recorded address, bytes (> 0), requested_size */
} tr_sfree_t;

/* A segment that existed before recording began: the starting state, rebuilt as it was. */
typedef struct tr_sseg {
    uint64_t addr, size, stream; /* recorded address, bytes, stream */
    uint16_t pool;               /* 1 + index into the device's pools, 0 = default pool */
    bool is_small;               /* small pool (segment_type "small") */
    size_t first, n;             /* its live blocks: sblocks[first .. first+n), by address */
    /* The stack it was allocated with, as the final state shows it (its dict's "frames" list;
     * PyTorch shows one only on a segment never split), else NULL: NULL too when loaded without
     * stacks, and for segments the final state does not show (expandable ranges, segments the
     * trace frees first). */
    const pk_value_t *frames;
} tr_sseg_t;

/* An event whose entry carries a user_metadata text other than "" (PyTorch's
 * _set_memory_metadata); every other event's is "". */
typedef struct tr_meta {
    size_t ev;        /* index into the device's events */
    const char *text; /* the text (the document's), never "" */
    size_t len;       /* its bytes (a 0 byte among them is the str's U+0000) */
} tr_meta_t;

typedef struct tr_pool_id {
    uint64_t first, second; /* PyTorch's MempoolId_t */
} tr_pool_id_t;

typedef struct tr_device {
    tr_event_t *ev;           /* events in order */
    size_t nev;               /* entries in ev */
    bool ev_borrowed;         /* ev lies in the trace's ev_block (not freed on its own) */
    tr_event_at_t *at;        /* by event: its time and stack; NULL when loaded without stacks
                               * (tr_load_opts' frames false), where no command reads them */
    tr_sseg_t *start;         /* segments before recording began (not expandable), by address */
    size_t nstart;            /* entries in start */
    tr_sblock_t *sblocks;     /* their live blocks */
    size_t nsblocks;          /* entries in sblocks */
    tr_sfree_t *sfree;        /* their free blocks untouched by the trace, by address (kept
                               * by a load with frames only: tr_load_opts) */
    size_t nsfree;            /* entries in sfree */
    uint64_t start_bytes;     /* bytes of the start segments */
    tr_pool_id_t *pools;      /* private pools (segment_pool_id other than (0,0)) */
    size_t npools;            /* entries in pools */
    size_t nstreams;          /* distinct streams in events and segments (0 included) */
    size_t empty_cache_runs;  /* TR_F_EMPTY_CACHE events */
    size_t internal_frees;    /* segment frees the allocator made inside a malloc */
    size_t deferred_frees;    /* TR_F_DEFERRED events */
    size_t completion_frees;  /* TR_F_COMPLETION events */
    size_t free_entries;      /* TR_FREE_REQUESTED events recorded as "free" (a request and its
                               * completion in one entry) */
    tr_seed_t *seeds;         /* blocks live before recording began, by address; those not
                               * in_start are requested before the first event */
    size_t nseeds;            /* entries in seeds */
    uint64_t seeded_bytes;    /* sum of the seeds' sizes */
    size_t nloose;            /* seeds outside the start segments */
    uint64_t loose_bytes;     /* their sizes */
    uint64_t final_reserved;  /* sum of the final segments' total_size */
    size_t final_segments;    /* the final segments (the snapshot's segments of this device) */
    uint64_t final_allocated; /* sum of the final active_allocated blocks' sizes */
    uint64_t start_reserved;  /* reserved before the first event (walking back from the end) */
    uint64_t peak_reserved;   /* PyTorch's peak reserved over the trace (a floor when
                               * unrecorded_free is not 0) */
    uint64_t unrecorded_free; /* how far the reserved bytes walked back from the end go below
                               * 0: at least these bytes of segments were released with no
                               * entry for it (0 in a consistent trace) */
    /* Entries a recording made with skip_actions left out, as far as the trace shows them:
     * frees of blocks no alloc entry made that cannot have been live before the first entry
     * (freed already, with no alloc between; or in a segment a segment_alloc of the trace made),
     * and segment_frees of fixed segments already freed, with no segment_alloc between. */
    size_t missing_allocs;        /* such frees */
    uint64_t missing_alloc_bytes; /* their blocks' sizes */
    size_t missing_seg_allocs;    /* such segment_frees */
    uint64_t missing_seg_bytes;   /* their segments' sizes */
    uint64_t peak_requested;      /* peak of seeds + allocs - free_requested sizes */
    size_t recorded_ooms;         /* oom events in the trace */
    tr_meta_t *meta;              /* events with a user_metadata other than "", in event order (NULL
                                   * when none: the usual case) */
    size_t nmeta;                 /* entries in meta */
} tr_device_t;

/* The change event i of d makes to the bytes PyTorch counts as requested (requested_bytes): up
 * at its alloc, down where the block is freed, which is free_block (CUDACachingAllocator.cpp):
 * at the free_requested that completes at once, else at the held free's free_completed. A free
 * whose completion never comes (pending at the end) stays counted. */
static inline int64_t tr_requested_delta(const tr_device_t *d, size_t i) {
    const tr_event_t *e = &d->ev[i];
    int64_t size = e->size > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)e->size;
    if (e->action == TR_ALLOC)
        return size;
    if (e->action == TR_FREE_REQUESTED && !(e->flags & TR_F_DEFERRED))
        return -size;
    if (e->action == TR_FREE_COMPLETED && e->held_end)
        return -size;
    return 0;
}

/* Event i's time (0: absent, or loaded without stacks) and stack (NULL: none, or loaded without
 * stacks). */
static inline int64_t tr_time_us(const tr_device_t *d, size_t i) {
    return d->at != NULL ? d->at[i].time_us : 0;
}
static inline const pk_value_t *tr_frames(const tr_device_t *d, size_t i) {
    return d->at != NULL ? d->at[i].frames : NULL;
}

/* The allocator settings a snapshot records, translated. */
typedef struct tr_settings {
    bool recorded;     /* the snapshot has allocator_settings */
    char conf[512];    /* SYMPOOL_ALLOC_CONF equivalent ("" = defaults) */
    double fraction;   /* per_process_memory_fraction from the conf string, 0 = none */
    char dropped[256]; /* settings that do not apply to a replay, for the output */
    char invalid[320]; /* why conf is no configuration PyTorch accepts ("" when it is one): every
                        * command loads the snapshot (as PyTorch's viewer does) and says so;
                        * replay cannot replay it (--conf replaces it) */
    bool gc;           /* a gc threshold is set: garbage collection may release inside malloc */
    uint64_t mss;      /* max_split_size when set, else 0: a malloc whose cudaMalloc failed may
                        * release free segments of at least this size on its stream */
    bool expandable;   /* the recorded run used expandable segments (unrecorded: off) */
    /* The recorded max_split_size when it is no whole MiB (sympool's SYMPOOL_MAX_SPLIT_SIZE
     * takes bytes; PyTorch's max_split_size_mb, and so conf, only MiB), 0 otherwise: set as
     * that option beside conf (tr_settings_set_split), not rounded into conf. */
    uint64_t split_bytes;
    /* sympool's own rules for expandable segments in the recorded run (its snapshots'
     * sympool_expandable_rules: "SYMPOOL_EXPANDABLE_PAGE=2MiB,..."), each checked as that
     * option; "" for a snapshot without them (PyTorch's: its rules) */
    char rules[1024];
} tr_settings_t;

typedef struct tr_trace {
    pk_doc_t *doc;          /* the parsed snapshot (frames point into it) */
    const char *format;     /* what the top level is (dict with or without settings, list) */
    int protocol;           /* pickle protocol (0-5; pk_protocol's); 0 for a JSON snapshot */
    bool pickled;           /* read from a pickle (false: a JSON snapshot) */
    char zip_member[256];   /* the pickle's member of a torch.save zip archive; "" for none */
    bool legacy_save;       /* the object of a file in torch.save's old format (before 1.6) */
    tr_settings_t settings; /* what the snapshot records */
    const pk_value_t *root; /* its top-level dict (or segment list) */
    int ndev;               /* device_traces entries (at least every segment's device + 1) */
    tr_device_t *dev;       /* per device */
    size_t nsegments;       /* segments in the snapshot */
    tr_event_t *ev_block;   /* the entries the reader handed over (devices' ev point into it) */
    /* The snapshot's external_annotations list (record_function scopes' starts and ends, each a
     * dict {"stage", "name", "device", "time_us"}) as the document holds it, unchecked: only a
     * replay's own snapshot copies it (a load without stacks may hand its dicts over as
     * records). NULL when absent or not a list. */
    const pk_value_t *annotations;
    size_t input_bytes; /* the pickle read (a JSON snapshot's translation); 0: tr_from_doc's */
} tr_trace_t;

/* Set the library's SYMPOOL_MAX_SPLIT_SIZE to st's split_bytes, when it has one and the
 * environment does not set the variable (which wins over a recorded max_split_size_mb too).
 * False with sp_last_error() when the option refuses it. */
bool tr_settings_set_split(const tr_settings_t *st);

/* The bytes tr_settings_set_split sets SYMPOOL_MAX_SPLIT_SIZE to: st's split_bytes, 0 when it has
 * none or the environment sets the variable. */
uint64_t tr_settings_split_to_set(const tr_settings_t *st);

/* Load a snapshot file (pickle). Fills t; on failure writes a one-line reason and returns
 * false. Call tr_free(t) in both cases. */
bool tr_load(const char *path, tr_trace_t *t, char *err, size_t errlen);
/* tr_load; frames false skips every stack while loading (the frames pointers are NULL, and the
 * devices' at, the events' times and stacks, too): what a
 * replay without a snapshot of its own needs, at a fraction of the cost. A file that skipping
 * cannot read as tr_load reads it (PK_ERR_WHOLE: no pickler writes one) is read as tr_load
 * does, so that both read every file alike. */
bool tr_load_opts(const char *path, bool frames, tr_trace_t *t, char *err, size_t errlen);
/* keep true: a trace file that tr_load/tr_load_opts map is left mapped after it was read
 * (never touched again), for a command whose process exits right after its one load: the exit
 * tears the mapping down for less than a munmap of its own costs (nhf's 2.3 MB: ~0.2 ms of a 7
 * ms replay process). Nothing else changes; the default (false) unmaps as soon as the file is
 * read, as a long-lived or repeated caller needs. */
void tr_keep_file_mapped(bool keep);
/* Whether t's stacks (loaded by tr_load) stay within what its file can hold written out: one
 * stack referenced by every entry through the pickle's memo reads as far more frame text than
 * the file has. False (a reason naming path in err) past 1024 x the file's bytes, which no
 * PyTorch snapshot comes near; the commands that use the stacks ask before they do. */
bool tr_stacks_within_input(const tr_trace_t *t, const char *path, char *err, size_t errlen);
/* The same for n of t's stacks only (stacks NULL: all of them). */
bool tr_stacks_fit(const tr_trace_t *t, const pk_value_t *const *stacks, size_t n, const char *path,
                   char *err, size_t errlen);
/* d's untouched start free block at addr (tr_device_t.sfree), or NULL. */
const tr_sfree_t *tr_sfree_at(const tr_device_t *d, uint64_t addr);
/* Same from a parsed document (t takes ownership of doc, even on failure; call tr_free). */
bool tr_from_doc(pk_doc_t *doc, tr_trace_t *t, char *err, size_t errlen);
void tr_free(tr_trace_t *t);

/* One slot of a tr_map: a key beside its value, so that a lookup touches one cache line. */
typedef struct tr_slot {
    uint64_t key; /* 0 = empty */
    uintptr_t val;
} tr_slot_t;

/* An open-addressing map from recorded addresses (non-zero) to a pointer-sized value. */
typedef struct tr_map {
    tr_slot_t *slots; /* cap slots */
    size_t cap;       /* power of two */
    size_t n;         /* keys held */
} tr_map_t;

bool tr_map_put(tr_map_t *m, uint64_t key, uintptr_t val); /* insert or replace; false on OOM */
bool tr_map_get(const tr_map_t *m, uint64_t key, uintptr_t *val_p);
bool tr_map_del(tr_map_t *m, uint64_t key, uintptr_t *val_p); /* false when absent */
/* Where key's value is held (changed in place), or NULL when key is absent; valid until the next
 * put or del. */
uintptr_t *tr_map_find(tr_map_t *m, uint64_t key);
/* Where key's value is held, the key put first (its value 0, *added_p true) when absent: a put
 * that needs the value it replaces, in one probe instead of a lookup and a put. NULL for key 0
 * and on OOM (m unchanged). Valid until the next put or del. */
uintptr_t *tr_map_upsert(tr_map_t *m, uint64_t key, bool *added_p);
/* Room for n keys: no put grows the map until it holds more. false on OOM (m unchanged). */
bool tr_map_reserve(tr_map_t *m, size_t n);
void tr_map_free(tr_map_t *m);

#ifdef __cplusplus
}
#endif

#endif /* SP_TOOLS_TRACE_H */
