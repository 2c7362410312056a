/*
 * history_int.h: the hooks the allocator calls to record memory history (history.c owns them).
 * Cheap when recording is off: one relaxed load.
 */
#ifndef SP_HISTORY_INT_H
#define SP_HISTORY_INT_H

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

/* Nonzero while recording (any level). Read without the lock. */
extern int sp__history_active;

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

#ifdef __cplusplus
}
#endif

#endif /* SP_HISTORY_INT_H */
