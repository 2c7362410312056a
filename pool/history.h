/*
 * history.h: the hooks the allocator calls to record memory history (history.c owns them).
 * Cheap when recording is off: one relaxed load.
 */
#ifndef SP_POOL_HISTORY_H
#define SP_POOL_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sympool/mempool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    SP_TRACE_ALLOC,
    SP_TRACE_FREE_REQUESTED,
    SP_TRACE_FREE_COMPLETED,
    SP_TRACE_SEGMENT_ALLOC,
    SP_TRACE_SEGMENT_FREE,
    SP_TRACE_SEGMENT_MAP,
    SP_TRACE_SEGMENT_UNMAP,
    SP_TRACE_SNAPSHOT,
    SP_TRACE_OOM
} sp_trace_action_t;

/* Nonzero while recording (any level). Written with atomic stores by sp_record_memory_history;
 * read only through sp__history_on() (a relaxed atomic load: a plain read would race). */
extern int sp__history_active;

static inline bool sp__history_on(void) {
    return __atomic_load_n(&sp__history_active, __ATOMIC_RELAXED) != 0;
}

/* Whether a call records, read again once it holds the device's lock: `before` is what it read
 * before the lock (to capture a stack outside it). History turned on while the call waited is
 * on for it, as PyTorch reads its switch under the allocator's mutex: else the call would run
 * unrecorded after entries other calls made under that lock, and the trace would not lead to the
 * segments. (Such a call carries no stack: it gathered none.) Turned off meanwhile, the call
 * still records; the history drops entries while it is off. */
static inline bool sp__history_under_lock(bool before) {
    return before || sp__history_on();
}

/* Capture the calling thread's stack for an allocation (or a free, with is_free), if the context
 * level asks for it. Call BEFORE taking the allocator lock. Returns a context id (0 = none) that
 * the caller passes to sp__history_record and keeps on the block; release it with
 * sp__history_context_release when the block no longer needs it. */
uint32_t sp__history_capture(bool is_free);
void sp__history_context_release(uint32_t context);

/* Append one trace entry; called by the allocator under its lock at PyTorch's points:
 *   alloc (size: requested), free_requested / free_completed (size: requested_size),
 *   segment_alloc / segment_free (size: segment size), oom (addr = device free bytes,
 *   size: rounded request). context: from sp__history_capture or 0. */
void sp__history_record(int device, sp_trace_action_t action, uintptr_t addr, size_t size,
                        uintptr_t stream, sp_mempool_id_t pool, uint32_t context);

/* ---- for snapshot.c and tests (history.c owns these too) --------------------------------- */

/* Tests only (snapshot.c): fn runs in every dump right after the segment walk, once its locks are
 * released (NULL: nothing, the default), as a thread allocating then would. */
void sp__snapshot_test_after_walk(void (*fn)(void));

/* Stop recording, drop every ring and the context table (sp_shutdown calls it once no block is
 * live, so that the next initialization starts with no history). */
void sp__history_shutdown(void);

/* The value snapshots show for a stream instead of its handle (sp_x_stream_label: `sympool
 * replay` shows the recorded stream). label 0 removes the stream's label. */
typedef struct sp__stream_label {
    uintptr_t stream; /* the handle (sp_stream_t) */
    uint64_t label;   /* what a snapshot shows */
} sp__stream_label_t;
sp_status_t sp__history_stream_label(uintptr_t stream, uint64_t label);
/* A copy of every label, for one snapshot (free() it; NULL and 0 when there is none). false: out
 * of host memory. */
bool sp__history_stream_labels(sp__stream_label_t **labels_p, size_t *n_p);

/* Take one more reference on a context id (0 is ignored): the snapshot writer holds the contexts
 * of the blocks it copied while it writes them out, after the allocator lock is gone. */
void sp__history_context_retain(uint32_t context);

/* One frame of a context. Strings are owned by the context and never change while a reference
 * on it is held. */
typedef struct sp__history_frame {
    const char *name;     /* function (or "0x..." when unknown); never NULL */
    const char *filename; /* source file or object path; never NULL ("??" when unknown) */
    int line;             /* source line, 0 when unknown */
} sp__history_frame_t;

/* The frames of a context the caller holds a reference on (*n_p = 0 for context 0 or unknown). */
void sp__history_context_frames(uint32_t context, const sp__history_frame_t **frames_p,
                                size_t *n_p);

/* One trace entry as stored (PyTorch's TraceEntry). */
typedef struct sp__trace_entry {
    sp_trace_action_t action; /* what happened */
    bool stamped;             /* time_us was given (sp_x_history_stamp): microseconds already,
                                 not a tick for sp__history_copy to map */
    uintptr_t addr;           /* block/segment address; device free bytes for SP_TRACE_OOM */
    size_t size;              /* bytes, per the table above sp__history_record */
    uintptr_t stream;         /* the stream handle as an integer; 0 = default stream */
    sp_mempool_id_t pool;     /* pool of the block or segment */
    int64_t time_us;          /* microseconds since the Unix epoch (in the ring: sp__ticks(),
                                 which sp__history_copy maps) */
    uint32_t context;         /* frames (a reference held by the entry), 0 if none */
    uint32_t meta;            /* user metadata in force when recorded (sp__history_metadata),
                                 0 = "" */
} sp__trace_entry_t;

/* The text of a trace entry's meta id: never NULL, "" for 0 or an unknown id. A text lives as
 * long as something names it (a device's text in force, a ring entry, a copy's entry), so a
 * snapshot may write its copy's texts after dropping every lock, until it frees the copy. */
const char *sp__history_metadata(uint32_t meta);
/* Texts held now (tests: a text nothing names any more is freed). */
size_t sp__history_meta_held(void);

/* PyTorch's action names ("alloc", "free_requested", ..., "oom"); "unknown" when out of range. */
const char *sp__history_action_name(sp_trace_action_t action);

/* Number of per-device trace buffers that exist (one more than the highest device recorded). */
int sp__history_device_count(void);

/* Copy device's entries in chronological order into a new array (free with
 * sp__history_entries_free, which drops the context references the copy took). Safe to call
 * under the allocator lock (snapshots take it through sp__pool_locked so that the copy and the
 * segment walk see one state). SP_ERR_SYSTEM when out of host memory. */
sp_status_t sp__history_copy(int device, sp__trace_entry_t **entries_p, size_t *n_p);
void sp__history_entries_free(sp__trace_entry_t *entries, size_t n);

/* One external annotation (PyTorch's AnnotationEntry: a record_function scope's start or end),
 * as a snapshot shows it. Its strings belong to the copy. */
typedef struct sp__annotation {
    int device;      /* the device it was recorded for */
    int64_t time_us; /* microseconds since the Unix epoch */
    char *stage;     /* "START", "END", ... */
    char *name;      /* the scope's name */
} sp__annotation_t;

/* Copy the annotations recorded so far, oldest first, times mapped to microseconds (free with
 * sp__history_annotations_free). SP_ERR_SYSTEM when out of host memory (nothing to free). */
sp_status_t sp__history_annotations(sp__annotation_t **annots_p, size_t *n_p);
void sp__history_annotations_free(sp__annotation_t *annots, size_t n);
/* Annotations held now (tests: bounded by max_entries, cleared by sp_record_memory_history). */
size_t sp__history_annotations_held(void);

/* fork() (pool/fork.c): hold history's lock across fork(); release it in the parent and child. */
void sp__history_fork_lock(void);
void sp__history_fork_unlock(void);

/* Whether recording is on, and at which levels (for snapshot's allocator settings and tests). */
bool sp__history_enabled(void);
/* Whether trace entries are kept (recording on). With SP_HISTORY_STATE the ring holds one. */
bool sp__history_keeps_actions(void);

#ifdef __cplusplus
}
#endif

#endif /* SP_POOL_HISTORY_H */
