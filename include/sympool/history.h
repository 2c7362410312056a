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

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_HISTORY_H */
