/*
 * dtype.c: the one list of sympool's element types and reduction ops, and what each is called
 * in MPI and in NCCL. The host path (collectives.c) and the NCCL path (coll_nccl.c) both read
 * their type and op from here, so a type added to the public enum is added in one place.
 *
 * Half types travel through MPI as 16-bit integers (half.c reduces them); SP_AVG is a sum in
 * MPI (collectives.c scales it as ncclAvg does) and ncclAvg in NCCL.
 */
#include "collectives/dtype.h"

#ifdef SP_HAVE_NCCL
/* nccl.h declares a few functions with () instead of (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#endif

/* X(enum, name, bytes, MPI type, NCCL type): in the order of sp_dtype_t. */
#define SP_DTYPE_LIST(X)                                                                           \
    X(SP_INT8, "int8", 1, MPI_INT8_T, ncclInt8)                                                    \
    X(SP_UINT8, "uint8", 1, MPI_UINT8_T, ncclUint8)                                                \
    X(SP_INT32, "int32", 4, MPI_INT32_T, ncclInt32)                                                \
    X(SP_UINT32, "uint32", 4, MPI_UINT32_T, ncclUint32)                                            \
    X(SP_INT64, "int64", 8, MPI_INT64_T, ncclInt64)                                                \
    X(SP_UINT64, "uint64", 8, MPI_UINT64_T, ncclUint64)                                            \
    X(SP_FLOAT16, "float16", 2, MPI_UINT16_T, ncclFloat16)                                         \
    X(SP_BFLOAT16, "bfloat16", 2, MPI_UINT16_T, ncclBfloat16)                                      \
    X(SP_FLOAT32, "float32", 4, MPI_FLOAT, ncclFloat32)                                            \
    X(SP_FLOAT64, "float64", 8, MPI_DOUBLE, ncclFloat64)

/* X(enum, name, MPI op, NCCL op): in the order of sp_redop_t. */
#define SP_REDOP_LIST(X)                                                                           \
    X(SP_SUM, "sum", MPI_SUM, ncclSum)                                                             \
    X(SP_PROD, "prod", MPI_PROD, ncclProd)                                                         \
    X(SP_MIN, "min", MPI_MIN, ncclMin)                                                             \
    X(SP_MAX, "max", MPI_MAX, ncclMax)                                                             \
    X(SP_AVG, "avg", MPI_SUM, ncclAvg)

static bool dtype_ok(sp_dtype_t dtype) {
    return (unsigned)dtype < (unsigned)SP_NUM_DTYPES;
}

static bool op_ok(sp_redop_t op) {
    return (unsigned)op < (unsigned)SP_NUM_REDOPS;
}

size_t sp__coll_dtype_size(sp_dtype_t dtype) {
#define X(e, name, bytes, mpi, nccl) [e] = bytes,
    static const size_t sizes[SP_NUM_DTYPES] = {SP_DTYPE_LIST(X)};
#undef X
    return dtype_ok(dtype) ? sizes[dtype] : 0;
}

const char *sp__coll_dtype_name(sp_dtype_t dtype) {
#define X(e, name, bytes, mpi, nccl) [e] = name,
    static const char *const names[SP_NUM_DTYPES] = {SP_DTYPE_LIST(X)};
#undef X
    return dtype_ok(dtype) ? names[dtype] : "?";
}

const char *sp__coll_op_name(sp_redop_t op) {
#define X(e, name, mpi, nccl) [e] = name,
    static const char *const names[SP_NUM_REDOPS] = {SP_REDOP_LIST(X)};
#undef X
    return op_ok(op) ? names[op] : "?";
}

/* MPI's handles are not constants in every MPI (Open MPI's are addresses), so these are
 * switches rather than static tables. */
MPI_Datatype sp__coll_mpi_type(sp_dtype_t dtype) {
    switch (dtype) {
#define X(e, name, bytes, mpi, nccl)                                                               \
    case e:                                                                                        \
        return mpi;
        SP_DTYPE_LIST(X)
#undef X
    }
    return MPI_DATATYPE_NULL;
}

MPI_Op sp__coll_mpi_op(sp_redop_t op) {
    switch (op) {
#define X(e, name, mpi, nccl)                                                                      \
    case e:                                                                                        \
        return mpi;
        SP_REDOP_LIST(X)
#undef X
    }
    return MPI_OP_NULL;
}

#ifdef SP_HAVE_NCCL
int sp__coll_nccl_type(sp_dtype_t dtype) {
    switch (dtype) {
#define X(e, name, bytes, mpi, nccl)                                                               \
    case e:                                                                                        \
        return (int)nccl;
        SP_DTYPE_LIST(X)
#undef X
    }
    return -1;
}

int sp__coll_nccl_op(sp_redop_t op) {
    switch (op) {
#define X(e, name, mpi, nccl)                                                                      \
    case e:                                                                                        \
        return (int)nccl;
        SP_REDOP_LIST(X)
#undef X
    }
    return -1;
}
#endif

/* The integers are divided by the rank count itself, in a type that holds it, truncating as
 * NCCL's FuncSumPostDiv does (the quotient of the element's absolute value, negated back): the
 * count cast to the element type first was 0 at 256 ranks for an 8-bit type (a division by
 * zero, SIGFPE) and negative from 128 ranks for int8. */
void sp__coll_avg_divide(void *buf, size_t n, sp_dtype_t dtype, int nranks) {
#define SP_DIV(T, W)                                                                               \
    do {                                                                                           \
        T *p = buf;                                                                                \
        for (size_t i = 0; i < n; i++)                                                             \
            p[i] = (T)((W)p[i] / (W)nranks);                                                       \
    } while (0)
    switch (dtype) {
    case SP_INT8:
        SP_DIV(int8_t, int64_t);
        break;
    case SP_UINT8:
        SP_DIV(uint8_t, uint64_t);
        break;
    case SP_INT32:
        SP_DIV(int32_t, int64_t);
        break;
    case SP_UINT32:
        SP_DIV(uint32_t, uint64_t);
        break;
    case SP_INT64:
        SP_DIV(int64_t, int64_t);
        break;
    case SP_UINT64:
        SP_DIV(uint64_t, uint64_t);
        break;
    case SP_FLOAT32:
        SP_DIV(float, float);
        break;
    case SP_FLOAT64:
        SP_DIV(double, double);
        break;
    case SP_FLOAT16:
    case SP_BFLOAT16:
        break; /* divided in float before rounding */
    }
#undef SP_DIV
}
