/**
 * @file stats.h
 * @brief PyTorch's memory_stats, key for key (122 flat keys, sorted as PyTorch sorts them).
 *
 * Statistics are per device; every pool of the device (MemPools included) is counted together,
 * as PyTorch does. All functions are thread-safe.
 */
#ifndef SYMPOOL_STATS_H
#define SYMPOOL_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Room to grow: sp_stats_count() <= SP_STATS_MAX. */
#define SP_STATS_MAX 160

/** A copy of a device's statistics; value[i] belongs to sp_stats_key(i). */
typedef struct sp_stats {
    int64_t value[SP_STATS_MAX];
} sp_stats_t;

/** value[i], or 0 if i >= sp_stats_count(). */
int64_t sp_stats_value(const sp_stats_t *stats, size_t i);

/** Copy @p device's statistics. @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT. */
sp_status_t sp_memory_stats(int device, sp_stats_t *stats_p);

/** Number of keys (122 today). */
size_t sp_stats_count(void);

/** PyTorch's flat key name for index i ("allocated_bytes.all.current"), sorted; NULL if out of
 * range. */
const char *sp_stats_key(size_t i);

/** Look a key up by name. @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (unknown key, NULL argument).
 */
sp_status_t sp_stats_get(const sp_stats_t *stats, const char *key, int64_t *value_p);

/** Set every peak to its current value. */
sp_status_t sp_reset_peak_memory_stats(int device);

/** Zero every allocated/freed counter and the num_* event counters (max_split_size is kept). */
sp_status_t sp_reset_accumulated_memory_stats(int device);

/** allocated_bytes.all.current (0 for an unknown device). */
size_t sp_memory_allocated(int device);
/** allocated_bytes.all.peak. */
size_t sp_max_memory_allocated(int device);
/** reserved_bytes.all.current. */
size_t sp_memory_reserved(int device);
/** reserved_bytes.all.peak. */
size_t sp_max_memory_reserved(int device);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_STATS_H */
