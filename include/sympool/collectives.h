/**
 * @file collectives.h
 * @brief Collectives on (symmetric) device buffers and per-rank statistics in one call.
 *        Every function here is collective over the world.
 *
 * Every call starts with one agreement round over the world (the same for every collective
 * sympool call: which call, its number, every rank's argument checks), bounded by
 * SYMPOOL_SYM_TIMEOUT (world.h). A rank that does not arrive makes every rank that did return
 * SP_ERR_TIMEOUT naming the call; a rank in another collective call makes every rank return
 * SP_ERR_MISMATCH naming both; a bad argument on one rank makes every rank return
 * SP_ERR_INVALID_ARGUMENT (the others naming it). No data moves unless every rank agreed. The
 * deadline covers that round only: once the data moves (MPI on host memory, NCCL on GPUs) a
 * peer that dies mid-transfer is MPI's business (it aborts the job by default) or NCCL's (its
 * kernels wait); sympool cannot bound that wait.
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

/** Element types. fp16/bf16 are reduced in float and rounded once (round-to-nearest-even). */
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

/**
 * Reductions; every one is accepted for every dtype. SP_AVG has NCCL's ncclAvg semantics on
 * both backends: for floating types each rank's value is multiplied by 1/n rounded to the
 * element type (bf16(1/3) = 0.333984375, so three ranks' bf16 100.0 average to 100.5), the
 * product rounded to the type, and the products summed as SP_SUM sums them; for integers the sum
 * in the element type (wrapping as MPI_SUM/ncclSum do) followed by C's truncating division. For
 * an exact mean of floats, sum with SP_SUM and scale once yourself. MIN/MAX of fp16/bf16 propagate
 * NaN and order -0 < +0; for float32/float64 NaN handling is MPI's or NCCL's.
 */
typedef enum { SP_SUM, SP_PROD, SP_MIN, SP_MAX, SP_AVG } sp_redop_t;

/*
 * The four collectives below share these rules:
 *  - Collective over the world: every rank calls with the same count, dtype, op and root.
 *  - Buffers are sympool memory of this rank's device (sp_malloc, sp_mempool_malloc or
 *    sp_symmetric_malloc), large enough for the call. Symmetric buffers on the cuda backend get
 *    NCCL's symmetric kernels when NCCL supports the call (SYMPOOL_DEBUG=INFO, subsystem COLL,
 *    says why one cannot). In place: for allreduce and broadcast send == recv; for allgather
 *    send == recv + rank*count elements; for reduce_scatter recv == send + rank*recv_count
 *    elements (so send == recv is in place there on rank 0 only). Any other overlap is refused.
 *  - Every argument is checked before any data moves, and the ranks agree on the outcome in one
 *    small MPI_Allreduce, so every rank returns the same status: SP_ERR_INVALID_ARGUMENT on
 *    every rank when any rank's arguments are bad (NULL world or buffer, dtype/op/root out of
 *    range, count * element size overflowing, a buffer that is not sympool device memory of
 *    this rank or is too small, a block of a symmetric pool whose world was finalized (that
 *    released the pool's memory), a forbidden overlap; the bad rank's message says which, the
 *    others name that rank), SP_ERR_MISMATCH on every rank when ranks pass different counts,
 *    dtypes, ops, roots or collectives, or, for a call NCCL runs on symmetric kernels, buffers
 *    the kernels reach on peers (all-reduce both, all-gather recv, reduce-scatter send) at
 *    different places (another offset or segment), or off the windows on some ranks only, or
 *    NCCL running it on symmetric kernels on some ranks only or picking its kernel from
 *    different kernels on different ranks (NCCL_SYM_KERNEL, which each process reads for
 *    itself, set differently). Nothing is sent then.
 *  - count 0 is a no-op (after the agreement); buffers may then be NULL.
 *  - Completion: on the cuda backend the operation is enqueued on @p stream (NCCL semantics);
 *    on the host backend it has completed when the call returns.
 *  - Other statuses: SP_ERR_MPI, SP_ERR_NCCL (also on every rank whose peers have no NCCL
 *    communicator left, naming them), SP_ERR_NOT_SUPPORTED (cuda without NCCL, or with the
 *    world's communicator aborted after a failure; on host, allgather/reduce_scatter of more than
 *    INT_MAX elements per rank), SP_ERR_SYSTEM (on host, on a rank that could not get the
 *    call's scratch: fp16/bf16 arithmetic, an in-place or float-avg reduce_scatter, or half
 *    min/max's MPI op; found before any data moves, so its peers return
 *    SP_ERR_INVALID_ARGUMENT naming it).
 *  - Thread-safety: calls on one world must not run concurrently from several threads (MPI and
 *    NCCL order collectives per communicator). On cuda, a symmetric pool's growth registers an
 *    NCCL window on the world's communicator too: a collective that overlaps another thread's
 *    sp_symmetric_malloc must come before or after it in the same order on every rank
 *    (docs/multinode.md).
 */

/** Reduce @p count elements of every rank's @p send into every rank's @p recv. */
sp_status_t sp_allreduce(sp_world_t *w, const void *send, void *recv, size_t count,
                         sp_dtype_t dtype, sp_redop_t op, sp_stream_t stream);
/** Concatenate every rank's @p send_count elements into @p recv, in rank order. */
sp_status_t sp_allgather(sp_world_t *w, const void *send, void *recv, size_t send_count,
                         sp_dtype_t dtype, sp_stream_t stream);
/** Reduce @p send (nranks * recv_count elements); rank r receives block r in @p recv. */
sp_status_t sp_reduce_scatter(sp_world_t *w, const void *send, void *recv, size_t recv_count,
                              sp_dtype_t dtype, sp_redop_t op, sp_stream_t stream);
/** Copy @p root's @p send into every rank's @p recv. @p send is read on the root only (it may
 *  be NULL elsewhere). */
sp_status_t sp_broadcast(sp_world_t *w, const void *send, void *recv, size_t count,
                         sp_dtype_t dtype, int root, sp_stream_t stream);

/** Per summary key i (sp_stats_summary_key), across ranks. */
typedef struct sp_stats_summary {
    int64_t min[SP_STATS_MAX], max[SP_STATS_MAX], sum[SP_STATS_MAX];
    int min_rank[SP_STATS_MAX], max_rank[SP_STATS_MAX];
    int nranks;
} sp_stats_summary_t;

/** Report formats. SP_REPORT_TABLE is short: the key figures and the imbalanced keys;
 * SP_REPORT_TABLE_ALL (a sympool addition) adds every other key. */
typedef enum {
    SP_REPORT_TABLE,
    SP_REPORT_JSON,
    SP_REPORT_PROMETHEUS,
    SP_REPORT_TABLE_ALL
} sp_report_format_t;

/** Keys of a summary: every memory_stats key (sp_stats_key(i) for i < sp_stats_count()), then
 * "device.used_bytes" and "device.untracked_bytes" (sp_device_usage: device memory in use by
 * anyone, and the part of it sympool did not reserve). <= SP_STATS_MAX. Local. */
size_t sp_stats_summary_count(void);
/** The name of summary key @p i; NULL if i >= sp_stats_summary_count(). Local. */
const char *sp_stats_summary_key(size_t i);

/**
 * Collective: reduce every summary key of @p device (sp_stats_summary_key) across ranks in ONE
 * MPI_Allreduce: min, max, sum, and the lowest rank holding the min and the max
 * (sp_world_node(w, rank) names its node). A rank whose arguments or device are bad
 * still joins, so every rank returns SP_ERR_INVALID_ARGUMENT instead of hanging.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT, SP_ERR_MPI, SP_ERR_SYSTEM.
 */
sp_status_t sp_stats_aggregate(sp_world_t *w, int device, sp_stats_summary_t *summary_p);

/**
 * Collective: aggregate (as sp_stats_aggregate, plus the symmetric pools' registration and
 * agreement counters and the world's symmetric.collectives_eligible/_fallback counts) and write
 * the report on rank 0; other ranks write nothing and may pass out == NULL. Every rank is named
 * with its node ("3@node7"; a node whose short host name another node of the world shares, as
 * gpu01.rack1 and gpu01.rack2 do, is "node7#k" in every format, k its index as in JSON's
 * "nodes"), and the job's figures come with per-node aggregates (two more
 * collectives: a reduction within each node and an MPI_Gatherv of one record set per node to
 * rank 0). TABLE is for people (a per-node section when the job spans nodes: the 16 nodes
 * with most reserved memory), JSON is one object (keys are stat names; min_node/max_node with
 * every record; "nodes": every node's name, ranks and reduced keys), PROMETHEUS is text
 * exposition with a sample per rank (rank and node labels, so `sum by (node)` aggregates per
 * node; one more collective, an MPI_Gather).
 * Each rank reports its own @p device (on cuda, sp_world_device: its local rank's): the table's
 * header names that device when every rank passed the same one, else "devices LO to HI (each
 * rank its own)"; JSON has "device" (rank 0's), "device_min" and "device_max".
 * SYMPOOL_REPORT=table|json|prometheus prints the same at sp_world_finalize, to stdout.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (on every rank: bad format, out NULL on rank 0,
 *         bad device), SP_ERR_MISMATCH (on every rank: ranks passed different formats),
 *         SP_ERR_MPI (on every rank when MPI refused one rank the reduction's datatype or op,
 *         naming it), SP_ERR_SYSTEM (writing failed, on rank 0; on every rank when rank 0 had no
 *         host memory for its tables, naming it).
 */
sp_status_t sp_stats_report(sp_world_t *w, int device, FILE *out, sp_report_format_t format);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_COLLECTIVES_H */
