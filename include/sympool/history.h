/**
 * @file history.h
 * @brief Memory history (PyTorch's _record_memory_history) and snapshots PyTorch's viewer reads.
 */
#ifndef SYMPOOL_HISTORY_H
#define SYMPOOL_HISTORY_H

#include <stdbool.h>
#include <stddef.h>

#include "sympool/mempool.h"
#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SP_HISTORY_OFF, SP_HISTORY_STATE, SP_HISTORY_ALL } sp_history_enabled_t;
typedef enum {
    SP_CONTEXT_NONE,
    SP_CONTEXT_STATE,
    SP_CONTEXT_ALLOC,
    SP_CONTEXT_ALL
} sp_history_context_t;

typedef struct sp_history_params {
    sp_history_enabled_t enabled; /**< OFF clears the buffer; STATE keeps one entry (PyTorch) */
    sp_history_context_t context; /**< which records carry stack frames */
    size_t max_entries;           /**< ring buffer size; 0 = unbounded */
    bool c_stacks;                /**< record C stack frames */
} sp_history_params_t;

/** Defaults: enabled ALL, context ALL, max_entries 0 (unbounded), c_stacks false. */
void sp_history_params_init(sp_history_params_t *params);

/** Start, change or stop recording on every device. */
sp_status_t sp_record_memory_history(const sp_history_params_t *params);

/** Write the whole process's snapshot: ".json" -> JSON; otherwise pickle protocol 4. Atomic. */
sp_status_t sp_dump_snapshot(const char *path);

/** Write one pool's snapshot (its segments only, with the device traces). */
sp_status_t sp_mempool_dump_snapshot(const sp_mempool_t *pool, const char *path);


/** One stack frame a binding supplies (e.g. a Python frame). Strings are copied by sympool. */
typedef struct sp_history_frame {
    const char *name;     /**< function name */
    const char *filename; /**< source file */
    int line;             /**< line number, 0 if unknown */
} sp_history_frame_t;

/**
 * A binding's frame source: fill at most @p max_frames frames, innermost first, and return how
 * many were written. Called on the allocating (or freeing) thread, before sympool takes its
 * allocator lock, only while recording asks for frames; it must not call into sympool.
 */
typedef size_t (*sp_history_frames_fn)(sp_history_frame_t *frames, size_t max_frames, void *arg);

/**
 * Install (or with NULL remove) the frames hook. Its frames come first in a context, followed
 * by C frames when sp_history_params_t.c_stacks is set. Thread-safe; takes effect for the next
 * capture.
 */
void sp_history_set_frames_hook(sp_history_frames_fn fn, void *arg);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_HISTORY_H */
