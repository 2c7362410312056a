/**
 * @file collectives.h
 * @brief Collectives on (symmetric) device buffers and per-rank statistics in one call.
 *        Every function here is collective over the world.
 */
#ifndef SYMPOOL_COLLECTIVES_H
#define SYMPOOL_COLLECTIVES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sympool/pool.h"
#include "sympool/stats.h"
#include "sympool/status.h"
#include "sympool/world.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    SP_INT8,
    SP_UINT8,
    SP_INT32,
    SP_UINT32,
    SP_INT64,
    SP_UINT64,
    SP_FLOAT16,
    SP_BFLOAT16,
    SP_FLOAT32,
    SP_FLOAT64
} sp_dtype_t;

typedef enum { SP_SUM, SP_PROD, SP_MIN, SP_MAX, SP_AVG } sp_redop_t;

sp_status_t sp_allreduce(sp_world_t *w, const void *send, void *recv, size_t count,
                         sp_dtype_t dtype, sp_redop_t op, sp_stream_t stream);
sp_status_t sp_allgather(sp_world_t *w, const void *send, void *recv, size_t send_count,
                         sp_dtype_t dtype, sp_stream_t stream);
sp_status_t sp_reduce_scatter(sp_world_t *w, const void *send, void *recv, size_t recv_count,
                              sp_dtype_t dtype, sp_redop_t op, sp_stream_t stream);
sp_status_t sp_broadcast(sp_world_t *w, const void *send, void *recv, size_t count,
                         sp_dtype_t dtype, int root, sp_stream_t stream);

/** Per key i, across ranks. */
typedef struct sp_stats_summary {
    int64_t min[SP_STATS_MAX], max[SP_STATS_MAX], sum[SP_STATS_MAX];
    int min_rank[SP_STATS_MAX], max_rank[SP_STATS_MAX];
    int nranks;
} sp_stats_summary_t;

typedef enum { SP_REPORT_TABLE, SP_REPORT_JSON, SP_REPORT_PROMETHEUS } sp_report_format_t;

/** Reduce every stats key across ranks in one collective. */
sp_status_t sp_stats_aggregate(sp_world_t *w, int device, sp_stats_summary_t *summary_p);

/** Aggregate and write the report on rank 0 (other ranks write nothing). */
sp_status_t sp_stats_report(sp_world_t *w, int device, FILE *out, sp_report_format_t format);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_COLLECTIVES_H */
