/**
 * @file summary.h
 * @brief A readable text summary of a device's memory statistics, like
 * torch.cuda.memory_summary(): one table with the current, peak, total allocated and total
 * freed figures of every statistic, split by large and small pool.
 */
#ifndef SYMPOOL_SUMMARY_H
#define SYMPOOL_SUMMARY_H

#include <stddef.h>

#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A buffer of this many bytes always holds the whole summary (sympool addition to API.md). */
#define SP_MEMORY_SUMMARY_MAX 8192

/**
 * Write @p device's memory summary into @p buf as a NUL-terminated multi-line text. A summary
 * longer than len-1 bytes is truncated to len-1 bytes; @p buf is always terminated.
 * Thread-safe; the figures are one consistent copy (sp_memory_stats). Three closing rows give
 * the device's own view (sp_device_usage): device memory in use by anyone, the part sympool
 * holds, and the part it does not (device.used_bytes, device.untracked_bytes).
 * @return SP_SUCCESS (also when truncated), SP_ERR_INVALID_ARGUMENT (buf NULL, len 0, unknown
 *         device: buf is then left unchanged).
 */
sp_status_t sp_memory_summary(int device, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_SUMMARY_H */
