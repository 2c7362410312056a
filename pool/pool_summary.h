/*
 * pool_summary.h: the table behind sp_memory_summary, for any set of statistics: the library
 * formats a device's live figures, the CLI (`sympool summary`) those it rebuilds from a snapshot.
 */
#ifndef SP_POOL_POOL_SUMMARY_H
#define SP_POOL_POOL_SUMMARY_H

#include <stddef.h>
#include <stdint.h>

#include "sympool/stats.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SP_SUMMARY_UNKNOWN INT64_MIN

/* Format the summary table of st under the heading title into buf (len bytes, len > 0) as
 * snprintf does: truncated to len-1 bytes, always terminated. Returns the length of the whole
 * text, so a result >= len means it was truncated. A value of SP_SUMMARY_UNKNOWN is shown as "-"
 * (a figure the source cannot give, such as a peak a snapshot does not record). */
size_t sp__summary_format(const sp_stats_t *st, const char *title, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* SP_POOL_POOL_SUMMARY_H */
