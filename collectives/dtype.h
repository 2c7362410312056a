/*
 * dtype.h: private to collectives/: dtype facts (dtype.c), the IEEE half-precision helpers the host
 * backend reduces fp16/bf16 with, and the NCCL path's entry points. Nothing here is exported.
 *
 * Half types travel through MPI as 16-bit integers; their SUM/PROD are computed by converting
 * to float, reducing floats with MPI and rounding once (round-to-nearest-even) back, so the
 * result equals the float reference rounded. AVG first rounds each value times bf16/fp16(1/n)
 * to the type (ncclAvg's pre-multiplication), then sums as SUM does. MIN/MAX are exact and use a
 * user-defined MPI_Op on MPI_UINT16_T that propagates NaN.
 */
#ifndef SP_COLLECTIVES_DTYPE_H
#define SP_COLLECTIVES_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "sympool/collectives.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SP_NUM_DTYPES ((int)SP_FLOAT64 + 1)
#define SP_NUM_REDOPS ((int)SP_AVG + 1)

/* Size in bytes of one element; 0 for a value outside the enum. */
size_t sp__coll_dtype_size(sp_dtype_t dtype);
/* "bfloat16", "int32", ...; "?" outside the enum. */
const char *sp__coll_dtype_name(sp_dtype_t dtype);
/* "sum", "prod", "min", "max", "avg"; "?" outside the enum. */
const char *sp__coll_op_name(sp_redop_t op);
/* How MPI carries dtype (half types as MPI_UINT16_T bits); MPI_DATATYPE_NULL outside the enum. */
MPI_Datatype sp__coll_mpi_type(sp_dtype_t dtype);
/* MPI's built-in op for op (SP_AVG: MPI_SUM, scaled by the caller); MPI_OP_NULL outside it. */
MPI_Op sp__coll_mpi_op(sp_redop_t op);
/* Divide n elements of dtype in place by the rank count (SP_AVG after the SUM, as NCCL's
 * ncclAvg: integers truncate toward zero); fp16/bf16 are left as they are (divided in float
 * before their rounding). */
void sp__coll_avg_divide(void *buf, size_t n, sp_dtype_t dtype, int nranks);
#ifdef SP_HAVE_NCCL
/* ncclDataType_t / ncclRedOp_t values, as int so that nccl.h stays out of this header;
 * -1 outside the enums (dtype.c). */
int sp__coll_nccl_type(sp_dtype_t dtype);
int sp__coll_nccl_op(sp_redop_t op);
#endif

/* ---- half precision (half.c) ------------------------------------------------------------ */

/* Exact: every fp16/bf16 value (subnormals, inf, NaN with its payload) is a float. */
float sp__half_to_float(uint16_t h);
float sp__bf16_to_float(uint16_t b);
/* Round-to-nearest-even; overflow rounds to inf as IEEE says; NaN stays NaN (quiet, sign kept). */
uint16_t sp__float_to_half(float f);
uint16_t sp__float_to_bf16(float f);

/* Convert n half (is_bf16 false) or bfloat16 values to float, and back with rounding. */
void sp__half_load(const uint16_t *src, float *dst, size_t n, bool is_bf16);
void sp__half_store(const float *src, uint16_t *dst, size_t n, bool is_bf16);

/* The user-defined MPI_Ops for MIN/MAX of fp16/bf16 on MPI_UINT16_T, created on first use.
 * is_max selects MAX; NaN propagates; -0 < +0. Returns MPI_OP_NULL if MPI_Op_create failed. */
MPI_Op sp__half_minmax_op(bool is_bf16, bool is_max);

/* ---- NCCL (coll_nccl.c; cuda backend only) ---------------------------------------------- */

typedef enum {
    SP_COLL_ALLREDUCE,
    SP_COLL_ALLGATHER,
    SP_COLL_REDUCE_SCATTER,
    SP_COLL_BROADCAST
} sp_coll_kind_t;

/* One validated collective call. Counts are per the public API's meaning. */
typedef struct sp_coll_call {
    sp_coll_kind_t kind; /* which collective */
    const void *send;    /* send buffer (may be NULL on non-root broadcast ranks) */
    void *recv;          /* receive buffer */
    size_t count;        /* count / send_count / recv_count as the API names it (elements) */
    sp_dtype_t dtype;    /* element type */
    sp_redop_t op;       /* reduction (allreduce, reduce_scatter) */
    int root;            /* broadcast root */
    sp_stream_t stream;  /* the caller's stream */
} sp_coll_call_t;

/* Run a validated call on the world's NCCL communicator. SP_ERR_NOT_SUPPORTED in builds without
 * NCCL. Logs (INFO, COLL) why the call cannot use NCCL's symmetric kernels when it cannot. */
sp_status_t sp__coll_nccl(sp_world_t *w, const sp_coll_call_t *call);
/* Whether this build has NCCL (SP_HAVE_NCCL). */
bool sp__coll_nccl_built(void);
/* Tests only: this process's host-path collectives treat the scratch they need as not
 * allocated (on: true), as host malloc refusing it would. */
void sp__coll_test_fail_scratch(bool on);
/* Tests: a hook run before a collective enters NCCL (coll_nccl.c). */
void sp__coll_test_at_nccl(void (*hook)(void));
/* Why NCCL would not run call c on symmetric kernels in world w, or NULL when it would: the rule
 * every call applies (collectives.c), on its own, without checking or running the call; for tests
 * of sizes no test can allocate. The buffers need not hold count elements. */
const char *sp__coll_no_symmetric_reason(sp_world_t *w, const sp_coll_call_t *c);
/* Tests only: this process's statistics collectives (stats_report.c) fail their preparation:
 * SP_STATS_TEST_FAIL_OP as MPI_Op_create refusing the reduction's op, SP_STATS_TEST_FAIL_TABLES
 * (rank 0 of a report) as host malloc refusing rank 0's tables; 0: nothing fails (the default). */
enum { SP_STATS_TEST_FAIL_OP = 1, SP_STATS_TEST_FAIL_TABLES = 2 };
void sp__stats_test_fail_prep(int which);

#ifdef __cplusplus
}
#endif

#endif /* SP_COLLECTIVES_DTYPE_H */
