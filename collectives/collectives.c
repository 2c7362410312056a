/*
 * collectives.c: sp_allreduce, sp_allgather, sp_reduce_scatter and sp_broadcast on the world:
 * argument checks, the agreement that makes every rank return the same status, and the MPI data
 * path on the host backend (NCCL on cuda lives in coll_nccl.c).
 *
 * Invariants:
 *  - Nothing is sent before this rank's arguments are checked, and no data is used before every
 *    rank's are. Checks whose outcome can differ between ranks (buffer ownership, NULL
 *    pointers, one rank passing another count) feed ONE agreement round (world/agree.c: the
 *    same message shape as every collective sympool call, bounded by SYMPOOL_SYM_TIMEOUT) that
 *    precedes the data movement, so a bad argument on one rank makes every rank return an error
 *    instead of leaving the others blocked in MPI:
 *    SP_ERR_INVALID_ARGUMENT on every rank when any rank rejected its own arguments (the bad
 *    rank says why; the others name it), SP_ERR_MISMATCH on every rank when the ranks are in
 *    different collective calls (naming both) or passed different counts, dtypes, ops or
 *    roots, SP_ERR_TIMEOUT (naming the call) on every rank that arrived when one did not.
 *  - The host path's local needs (its scratch, half.c's MPI ops) are met before the agreement
 *    and feed its ok flag too (host_scratch): a rank short of host memory is SP_ERR_SYSTEM there
 *    and SP_ERR_INVALID_ARGUMENT naming it on its peers, never a rank missing from MPI.
 *  - On cuda, whether this rank has the world's NCCL communicator feeds the ok flag too
 *    (ready_for_nccl): one aborted on some ranks only is SP_ERR_NOT_SUPPORTED there (saying why)
 *    and SP_ERR_NCCL naming them on their peers, never a rank missing from NCCL.
 *  - A small allreduce, all-gather or broadcast (fused()) sends its input inside the agreement
 *    round itself, from the ranks whose own checks passed, and each rank reduces or copies the
 *    gathered inputs once the round says every rank agreed: the deadline then covers the whole
 *    call.
 *  - Otherwise the deadline covers the agreement only. Once every rank has agreed the data
 *    moves through MPI (host) or NCCL (cuda) on the world's data communicator; a rank that dies
 *    during that transfer is MPI's business (it aborts the job by default) or NCCL's (its
 *    collectives wait).
 *  - Host stream semantics: the operation has completed when the call returns (the host backend
 *    runs "kernels" synchronously, so no stream synchronization is needed before reading).
 *  - fp16/bf16 SUM/PROD accumulate in float and round once (see half.c).
 *  - AVG has NCCL's semantics (ncclAvg), so the host and cuda paths agree: for floating types
 *    each rank's value is first multiplied by 1/n rounded to the element type (bf16(1/3) is
 *    0.333984375), the product rounded to the type, and the products are then summed as SUM
 *    sums them; for integer types the sum in the element type (wrapping as MPI_SUM does)
 *    followed by C's truncating division. Pre-multiplying cannot overflow where the sum would,
 *    and it is what NCCL computes on the GPU, where sympool has no kernel of its own to scale
 *    a sum afterwards.
 *  - MIN/MAX of float32/float64 with NaN inputs are MPI's (unspecified); for fp16/bf16 NaN
 *    propagates and -0 < +0.
 *
 * No locks: every call works on its arguments and the world's communicator; the world is shared
 * between threads only as far as MPI's thread level allows.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/dtype.h"
#include "core/core.h"
#include "world/world.h"
#include "pool/pool.h"
#include "sympool/pool.h"
#include "sympool/symmetric.h"
#include "symmetric/symmetric.h"

/* Elements per MPI call: MPI-3 counts are int. Half-precision arithmetic goes through a float
 * scratch buffer of at most this many elements (4 MiB), which also bounds its memory. */
#define MAX_MPI_COUNT ((size_t)INT_MAX)
#define HALF_CHUNK ((size_t)1 << 20)

static const char *const kind_names[] = {"sp_allreduce", "sp_allgather", "sp_reduce_scatter",
                                         "sp_broadcast"};

static bool is_half(sp_dtype_t dtype) {
    return dtype == SP_FLOAT16 || dtype == SP_BFLOAT16;
}

/* ---- argument checks -------------------------------------------------------------------- */

/* What one call learns about its world and buffers, once per call: the world's accessors and
 * the block lookups each cost a lock, and a small collective's whole cost is its bookkeeping. */
typedef struct call_ctx {
    int rank, size, device;
    bool cuda;                           /* the cuda backend (NCCL data path) */
    bool host;                           /* the host backend (MPI data path) */
    sp_mempool_t *send_pool, *recv_pool; /* the buffers' pools, NULL where not looked up */
    const char *no_sym;                  /* why not symmetric kernels (NULL: they run) */
    int64_t at[3];                       /* where the buffers lie in their windows (places()) */
    int64_t kernels; /* the symmetric kernels NCCL may pick from on this rank (places()) */
} call_ctx_t;

/* [ptr, ptr+bytes) must lie in one live block of this rank's device (within what the caller
 * asked for, not the rounding slack). */
static bool check_buffer(const call_ctx_t *x, const void *ptr, size_t bytes, const char *what,
                         sp_mempool_t **pool_p, char *why, size_t len) {
    int rank = x->rank, dev = x->device;
    if (ptr == NULL) {
        snprintf(why, len, "%s buffer is NULL", what);
        return false;
    }
    sp_block_info_t info;
    if (sp__pool_lookup(ptr, &info) != SP_SUCCESS || info.device != dev) {
        snprintf(why, len,
                 "%s buffer %p is not sympool device memory of rank %d (device %d): allocate it "
                 "with sp_malloc or sp_symmetric_malloc",
                 what, ptr, rank, dev);
        return false;
    }
    /* Its world's finalize released the segment under it (sp__sym_pool_gone): the range may be
     * unmapped, or mapped again for other memory. */
    if (sp__sym_pool_gone(info.pool)) {
        snprintf(why, len,
                 "%s buffer %p is a block of a symmetric pool whose world was finalized (which "
                 "released the pool's memory, or left it only until the process exits): it is no "
                 "longer memory to use; free it with sp_free",
                 what, ptr);
        return false;
    }
    size_t limit = info.requested_size ? info.requested_size : info.block_size;
    size_t off = (size_t)((const char *)ptr - (const char *)info.block_base);
    if (off > limit || bytes > limit - off) {
        snprintf(why, len,
                 "%s buffer %p (%zu bytes) is not sympool device memory of rank %d: it runs %zu "
                 "bytes past the end of its %zu-byte allocation",
                 what, ptr, bytes, rank, bytes - (off > limit ? 0 : limit - off), limit);
        return false;
    }
    *pool_p = info.pool;
    return true;
}

static bool overlaps(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

/* Every check that needs no communication. Returns false with the reason in why. */
static bool check_local(call_ctx_t *x, const sp_coll_call_t *c, char *why, size_t len) {
    int n = x->size, rank = x->rank;
    if ((unsigned)c->dtype >= (unsigned)SP_NUM_DTYPES) {
        snprintf(why, len, "dtype %d is not an sp_dtype_t", (int)c->dtype);
        return false;
    }
    bool reduces = c->kind == SP_COLL_ALLREDUCE || c->kind == SP_COLL_REDUCE_SCATTER;
    if (reduces && (unsigned)c->op >= (unsigned)SP_NUM_REDOPS) {
        snprintf(why, len, "op %d is not an sp_redop_t", (int)c->op);
        return false;
    }
    if (c->kind == SP_COLL_BROADCAST && (c->root < 0 || c->root >= n)) {
        snprintf(why, len, "root %d is out of range [0, %d)", c->root, n);
        return false;
    }
    /* The stream is checked as sp_malloc checks it, even for a no-op, so that a bad handle is
     * refused on every rank (it feeds the agreement) rather than accepted by a backend that
     * never touches it. CUDA's pseudo-streams (legacy, per-thread) name a stream on every device.
     */
    const char *fn = kind_names[c->kind];
    if ((uintptr_t)c->stream > 2u && sp__stream_check(c->stream, x->device, fn) != SP_SUCCESS) {
        const char *m = sp_last_error();
        size_t k = strlen(fn); /* agree() names the call itself */
        snprintf(why, len, "%s", strncmp(m, fn, k) == 0 && m[k] == ':' ? m + k + 2 : m);
        return false;
    }
    size_t size = sp__coll_dtype_size(c->dtype);
    size_t scale = (c->kind == SP_COLL_ALLREDUCE || c->kind == SP_COLL_BROADCAST) ? 1 : (size_t)n;
    if (c->count > SIZE_MAX / size / scale || c->count > (size_t)INT64_MAX / size / scale) {
        snprintf(why, len, "count %zu of %s times %zu rank(s) overflows a byte size", c->count,
                 sp__coll_dtype_name(c->dtype), scale);
        return false;
    }
    if (c->count == 0)
        return true; /* a no-op: buffers are not touched and may be NULL */
    size_t bytes = c->count * size, big = bytes * scale;
    size_t send_bytes = c->kind == SP_COLL_REDUCE_SCATTER ? big : bytes;
    size_t recv_bytes = c->kind == SP_COLL_ALLGATHER ? big : bytes;
    bool uses_send = c->kind != SP_COLL_BROADCAST || rank == c->root;
    if (uses_send && !check_buffer(x, c->send, send_bytes, "send", &x->send_pool, why, len))
        return false;
    if (!check_buffer(x, c->recv, recv_bytes, "recv", &x->recv_pool, why, len))
        return false;
    if (!uses_send)
        return true; /* a broadcast's non-root: send unused */
    const char *s = c->send, *r = c->recv;
    if ((c->kind == SP_COLL_ALLREDUCE || c->kind == SP_COLL_BROADCAST) && s == r)
        return true; /* in place */
    /* An all-gather or reduce-scatter is in place at this rank's slot only: send == recv is
     * that on rank 0 alone. Elsewhere it is an overlap (the all-gather's input lies in rank 0's
     * slot, which MPI and NCCL overwrite while they still read it). */
    if (c->kind == SP_COLL_ALLGATHER && s == r + (size_t)rank * bytes)
        return true; /* in place: this rank's slot of recv */
    if (c->kind == SP_COLL_REDUCE_SCATTER && r == s + (size_t)rank * bytes)
        return true; /* in place: this rank's slot of send */
    if (overlaps(s, send_bytes, r, recv_bytes)) {
        snprintf(why, len,
                 "send %p (%zu bytes) and recv %p (%zu bytes) overlap without being in place "
                 "(in place is %s)",
                 c->send, send_bytes, c->recv, recv_bytes,
                 c->kind == SP_COLL_ALLGATHER        ? "send == recv + rank*count"
                 : c->kind == SP_COLL_REDUCE_SCATTER ? "recv == send + rank*recv_count"
                                                     : "send == recv");
        return false;
    }
    return true;
}

enum { AG_COUNT_HI, AG_COUNT_LO, AG_DTYPE, AG_OP, AG_ROOT, AG_SEND_AT, AG_RECV_AT, AG_SEGS, AG_N };
/* The calls other than broadcast have no root: their AG_ROOT field carries the symmetric kernels
 * NCCL may pick the call from on the rank (x->kernels, 0 off them). Broadcast never runs on them,
 * and the collective is agreed (the round's op) before any field is read, so every rank reads
 * the field the same way. */
#define AG_KERNELS AG_ROOT
/* AG_SEND_AT of a rank that has no NCCL communicator on cuda (ready_for_nccl): a place is >= 0,
 * and a failed rank's fields are never compared, so its peers can tell why it failed. */
#define AG_NO_NCCL (-1)

static const int64_t agree_ops[] = {SP_AGREE_ALLREDUCE, SP_AGREE_ALLGATHER, SP_AGREE_REDUCE_SCATTER,
                                    SP_AGREE_BROADCAST};

static const char *sym_kernel_setting(const char **sep_p);

/* The buffers' places (places()) after a round that found the arguments equal (the call, so
 * which buffers are compared, is the same on every rank). */
static sp_status_t agreed_places(const sp_agree_t *a, const call_ctx_t *x, const sp_coll_call_t *c,
                                 const char *fn) {
    /* A rank that runs the call on NCCL's regular kernels while its peers run symmetric ones
     * waits for them forever: its buffers off the windows, or NCCL_SYM_KERNEL (read by each
     * process itself) leaving it no kernel. */
    if (a->lo[AG_SEGS] == 0 && a->hi[AG_SEGS] != 0)
        return sp__error(SP_ERR_MISMATCH, SP_SUB_COLL,
                         "%s: NCCL would run the call on symmetric kernels on some ranks and not "
                         "on others, which would wait for each other (this rank: %s%s); every "
                         "rank needs its buffers in its windows and the same NCCL_SYM_KERNEL",
                         fn, x->at[2] ? "symmetric kernels" : "not: ",
                         x->at[2]    ? ""
                         : x->no_sym ? x->no_sym
                                     : "its buffers are not in its windows");
    /* NCCL picks the fastest kernel its mask leaves (src/sym_kernels.cc ncclSymkPickKernel): ranks
     * whose masks differ can pick different kernels, which wait for each other too. */
    if (a->lo[AG_KERNELS] != a->hi[AG_KERNELS]) {
        const char *sep, *setting = sym_kernel_setting(&sep);
        return sp__error(SP_ERR_MISMATCH, SP_SUB_COLL,
                         "%s: NCCL would pick the call's kernel from different symmetric kernels "
                         "on different ranks, which would wait for each other (this rank: "
                         "NCCL_SYM_KERNEL%s%s); give every rank the same NCCL_SYM_KERNEL",
                         fn, sep, setting);
    }
    const char *peer_bufs = c->kind == SP_COLL_ALLGATHER        ? "recv buffer is"
                            : c->kind == SP_COLL_REDUCE_SCATTER ? "send buffer is"
                                                                : "buffers are";
    if (a->lo[AG_SEGS] != a->hi[AG_SEGS])
        return sp__error(SP_ERR_MISMATCH, SP_SUB_COLL,
                         "%s: the %s in different symmetric segments on different ranks; "
                         "pass the same sp_symmetric_malloc blocks on every rank",
                         fn, peer_bufs);
    for (int i = AG_SEND_AT; i <= AG_RECV_AT; i++) {
        if (a->lo[i] == a->hi[i])
            continue;
        return sp__error(SP_ERR_MISMATCH, SP_SUB_COLL,
                         "%s: the %s buffer lies at different offsets of its symmetric segment "
                         "across ranks (%lld to %lld bytes); NCCL's symmetric kernels reach it on "
                         "every rank at the calling rank's offset, so every rank must pass the "
                         "same place",
                         fn, i == AG_SEND_AT ? "send" : "recv", (long long)a->lo[i] - 1,
                         (long long)a->hi[i] - 1);
    }
    return SP_SUCCESS;
}

/* A dtype's or op's name for a mismatch message (AG_DTYPE, AG_OP: agreed values of checked
 * arguments, so always in range). */
static const char *value_name(int field, int64_t v) {
    return field == AG_DTYPE ? sp__coll_dtype_name((sp_dtype_t)v) : sp__coll_op_name((sp_redop_t)v);
}

/* The agreement: world/agree.c's round (the call, this rank's checks, count, dtype, op, root),
 * bounded by SYMPOOL_SYM_TIMEOUT, on the world's agreement communicator, before any data
 * moves. A rank in another collective call is SP_ERR_MISMATCH naming both. */
static sp_status_t agree(sp_world_t *w, const call_ctx_t *x, const sp_coll_call_t *c, bool ok,
                         sp_status_t bad, const char *why, void *gathered) {
    const char *fn = kind_names[c->kind];
    bool reduces = c->kind == SP_COLL_ALLREDUCE || c->kind == SP_COLL_REDUCE_SCATTER;
    /* The count is split into two 32-bit halves so it fits int64 whatever size_t holds. */
    sp_agree_t a = {.op = agree_ops[c->kind],
                    .ok = ok,
                    .f = {
                        (int64_t)(c->count >> 32),
                        (int64_t)(c->count & 0xffffffffu),
                        (int64_t)c->dtype,
                        reduces ? (int64_t)c->op : 0,
                        c->kind == SP_COLL_BROADCAST ? (int64_t)c->root : x->kernels,
                        x->at[0],
                        x->at[1],
                        x->at[2],
                    }};
    if (gathered && ok) { /* only a rank whose arguments passed reads its send buffer */
        /* A broadcast's non-root ranks send bytes nobody reads (their send may be NULL), as
         * many as the root: every rank copies the same length out of the round. */
        static const char unread[SP_AGREE_PAYLOAD_MAX];
        bool sends = c->kind != SP_COLL_BROADCAST || x->rank == c->root;
        a.payload = sends ? c->send : unread;
        a.payload_bytes = c->count * sp__coll_dtype_size(c->dtype);
    }
    a.gathered = gathered;
    SP_CHECK(sp__world_agree_live(w, &a, fn));
    if (!ok)
        return sp__error(bad, SP_SUB_COLL, "%s: %s", fn, why);
    char ranks[96];
    if (a.nbad && a.lo[AG_SEND_AT] == AG_NO_NCCL)
        return sp__error(SP_ERR_NCCL, SP_SUB_COLL,
                         "%s: %s has no NCCL communicator (its log says why) or rejected the "
                         "call; no rank entered NCCL",
                         fn, sp__agree_bad_ranks(&a, ranks, sizeof ranks));
    if (a.nbad)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_COLL,
                         "%s: %s rejected its arguments or had no host memory for the call "
                         "(its log says why); no rank moved any data",
                         fn, sp__agree_bad_ranks(&a, ranks, sizeof ranks));
    static const char *const field_names[AG_SEND_AT] = {"count", "count", "dtype", "op", "root"};
    for (int i = 0; i < AG_SEND_AT; i++) {
        int64_t hi = a.hi[i], lo = a.lo[i];
        if (hi == lo || (i == AG_KERNELS && c->kind != SP_COLL_BROADCAST))
            continue; /* the kernels are compared with the places (agreed_places) */
        if (i == AG_COUNT_HI || i == AG_COUNT_LO)
            return sp__error(SP_ERR_MISMATCH, SP_SUB_COLL,
                             "%s: ranks passed different counts (this rank: %zu); every rank "
                             "must pass the same count",
                             fn, c->count);
        if (i == AG_DTYPE || i == AG_OP) /* by name: the enum's numbers mean nothing to a user */
            return sp__error(SP_ERR_MISMATCH, SP_SUB_COLL,
                             "%s: ranks passed different %ss (%s to %s; this rank: %s); every rank "
                             "must pass the same %s",
                             fn, field_names[i], value_name(i, lo), value_name(i, hi),
                             value_name(i, i == AG_DTYPE ? (int64_t)c->dtype : (int64_t)c->op),
                             field_names[i]);
        return sp__error(SP_ERR_MISMATCH, SP_SUB_COLL,
                         "%s: ranks passed different %s values (smallest %lld, largest %lld; this "
                         "rank: %d)",
                         fn, field_names[i], (long long)lo, (long long)hi, c->root);
    }
    return agreed_places(&a, x, c, fn);
}

/* ---- the host (MPI) data path ----------------------------------------------------------- */

/* The op that reduces dtype's MPI representation directly (half MIN/MAX: half.c's ops). */
static MPI_Op direct_op(sp_dtype_t dtype, sp_redop_t op) {
    if (is_half(dtype))
        return sp__half_minmax_op(dtype == SP_BFLOAT16, op == SP_MAX);
    return sp__coll_mpi_op(op);
}

/* 1/n rounded to the element type, as ncclAvg's pre-multiplier (in float for the half types,
 * whose rounding half.c does). */
static double avg_scale(sp_dtype_t dtype, int nranks) {
    double s = 1.0 / (double)nranks;
    if (dtype == SP_FLOAT32)
        return (float)s;
    if (dtype == SP_FLOAT16)
        return sp__half_to_float(sp__float_to_half((float)s));
    if (dtype == SP_BFLOAT16)
        return sp__bf16_to_float(sp__float_to_bf16((float)s));
    return s;
}

/* dst[i] = src[i] * scale, rounded to the type (float32, float64); dst may equal src. */
static void premultiply(void *dst, const void *src, size_t n, sp_dtype_t dtype, double scale) {
    if (dtype == SP_FLOAT32) {
        const float *s = src;
        float *d = dst, k = (float)scale;
        for (size_t i = 0; i < n; i++)
            d[i] = s[i] * k;
    } else {
        const double *s = src;
        double *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = s[i] * scale;
    }
}

/* Half values already loaded as floats: x * scale rounded to the half type, back in float. */
static void premultiply_half(float *v, size_t n, bool is_bf16, float scale) {
    for (size_t i = 0; i < n; i++)
        v[i] = is_bf16 ? sp__bf16_to_float(sp__float_to_bf16(v[i] * scale))
                       : sp__half_to_float(sp__float_to_half(v[i] * scale));
}

static bool is_float(sp_dtype_t dtype) {
    return dtype == SP_FLOAT32 || dtype == SP_FLOAT64;
}

static bool half_arith(const sp_coll_call_t *c) {
    return is_half(c->dtype) && (c->op == SP_SUM || c->op == SP_PROD || c->op == SP_AVG);
}

/* The host data path's scratch: allocated before the agreement, whose ok flag carries the
 * outcome, because a rank that found itself short of memory after it would return while its
 * peers wait in an MPI collective with no deadline. NULL where the call needs none. */
typedef struct {
    void *a; /* half allreduce: its floats [chunk]; half reduce-scatter: `in` [chunk x ranks];
              * other reduce-scatter: the in-place result [count] */
    void *b; /* half reduce-scatter: `out` [chunk]; float AVG reduce-scatter: send scaled by
              * 1/n [count x ranks] */
} scratch_t;

static _Atomic bool s_test_fail_scratch; /* sp__coll_test_fail_scratch */

void sp__coll_test_fail_scratch(bool on) {
    s_test_fail_scratch = on;
}

/* Sizes of the scratch host_allreduce and host_reduce_scatter use for c (0: none). */
static void scratch_sizes(const call_ctx_t *x, const sp_coll_call_t *c, size_t *a_p, size_t *b_p) {
    size_t size = sp__coll_dtype_size(c->dtype), n = (size_t)x->size;
    size_t chunk = c->count < HALF_CHUNK ? c->count : HALF_CHUNK;
    *a_p = *b_p = 0;
    if (c->kind == SP_COLL_ALLREDUCE && half_arith(c))
        *a_p = chunk * sizeof(float);
    if (c->kind != SP_COLL_REDUCE_SCATTER || c->count > MAX_MPI_COUNT)
        return; /* run() refuses a reduce-scatter past MPI's int count before it moves data */
    if (half_arith(c)) {
        *a_p = chunk * n * sizeof(float);
        *b_p = chunk * sizeof(float);
        return;
    }
    /* In place (recv inside send) needs a separate result buffer: MPI_IN_PLACE would put the
     * result at the start of send, not at this rank's slot. */
    if (overlaps(c->send, c->count * size * n, c->recv, c->count * size))
        *a_p = c->count * size;
    if (c->op == SP_AVG && is_float(c->dtype))
        *b_p = c->count * size * n;
}

/* The host path's local needs, met before the agreement: its scratch and, for half MIN/MAX,
 * half.c's MPI op. False, with *why, when this rank cannot run the call. */
static bool host_scratch(const call_ctx_t *x, const sp_coll_call_t *c, scratch_t *sc, char *why,
                         size_t len) {
    size_t a, b;
    scratch_sizes(x, c, &a, &b);
    sc->a = a ? malloc(a) : NULL;
    sc->b = b ? malloc(b) : NULL;
    if ((a && !sc->a) || (b && !sc->b) || ((a || b) && s_test_fail_scratch)) {
        snprintf(why, len, "out of host memory for %zu bytes of scratch", a + b);
        return false;
    }
    bool needs_op =
        (c->kind == SP_COLL_ALLREDUCE || c->kind == SP_COLL_REDUCE_SCATTER) && !half_arith(c);
    if (needs_op && direct_op(c->dtype, c->op) == MPI_OP_NULL) {
        snprintf(why, len, "MPI_Op_create for %s of %s failed", sp__coll_op_name(c->op),
                 sp__coll_dtype_name(c->dtype));
        return false;
    }
    return true;
}

static sp_status_t host_allreduce(sp_world_t *w, const sp_coll_call_t *c, const scratch_t *sc) {
    MPI_Comm comm = sp__world_comm(w);
    int n = sp__world_size(w);
    size_t size = sp__coll_dtype_size(c->dtype);
    if (half_arith(c)) {
        bool bf = c->dtype == SP_BFLOAT16;
        size_t chunk = c->count < HALF_CHUNK ? c->count : HALF_CHUNK;
        float *tmp = sc->a;
        MPI_Op op = c->op == SP_PROD ? MPI_PROD : MPI_SUM;
        for (size_t at = 0; at < c->count; at += chunk) {
            size_t k = c->count - at < chunk ? c->count - at : chunk;
            sp__half_load((const uint16_t *)c->send + at, tmp, k, bf);
            if (c->op == SP_AVG)
                premultiply_half(tmp, k, bf, (float)avg_scale(c->dtype, n));
            int rc = MPI_Allreduce(MPI_IN_PLACE, tmp, (int)k, MPI_FLOAT, op, comm);
            if (rc != MPI_SUCCESS)
                return sp__mpi_status(rc, SP_SUB_COLL, "sp_allreduce", "MPI_Allreduce");
            sp__half_store(tmp, (uint16_t *)c->recv + at, k, bf);
        }
        return SP_SUCCESS;
    }
    MPI_Op op = direct_op(c->dtype, c->op); /* host_scratch checked it */
    /* Floating AVG: pre-multiply into recv (checked: send and recv are equal or disjoint), then
     * sum it in place. */
    bool premul = c->op == SP_AVG && is_float(c->dtype);
    if (premul)
        premultiply(c->recv, c->send, c->count, c->dtype, avg_scale(c->dtype, n));
    for (size_t at = 0; at < c->count; at += MAX_MPI_COUNT) {
        size_t k = c->count - at < MAX_MPI_COUNT ? c->count - at : MAX_MPI_COUNT;
        const void *s =
            c->send == c->recv || premul ? MPI_IN_PLACE : (const char *)c->send + at * size;
        int rc = MPI_Allreduce(s, (char *)c->recv + at * size, (int)k, sp__coll_mpi_type(c->dtype),
                               op, comm);
        if (rc != MPI_SUCCESS)
            return sp__mpi_status(rc, SP_SUB_COLL, "sp_allreduce", "MPI_Allreduce");
    }
    if (c->op == SP_AVG && !premul)
        sp__coll_avg_divide(c->recv, c->count, c->dtype, n);
    return SP_SUCCESS;
}

static sp_status_t host_allgather(sp_world_t *w, const sp_coll_call_t *c) {
    int rank = sp__world_rank(w);
    size_t bytes = c->count * sp__coll_dtype_size(c->dtype);
    const char *slot = (const char *)c->recv + (size_t)rank * bytes;
    const void *s = (const char *)c->send == slot ? MPI_IN_PLACE : c->send;
    MPI_Datatype t = sp__coll_mpi_type(c->dtype);
    int rc = MPI_Allgather(s, (int)c->count, t, c->recv, (int)c->count, t, sp__world_comm(w));
    return sp__mpi_status(rc, SP_SUB_COLL, "sp_allgather", "MPI_Allgather");
}

static sp_status_t host_reduce_scatter(sp_world_t *w, const sp_coll_call_t *c,
                                       const scratch_t *sc) {
    MPI_Comm comm = sp__world_comm(w);
    int n = sp__world_size(w);
    size_t size = sp__coll_dtype_size(c->dtype);
    if (half_arith(c)) {
        /* Chunk j of the result needs chunk j of every rank's slot of send: gather those into
         * one float buffer laid out rank by rank, reduce-scatter floats, round once. */
        bool bf = c->dtype == SP_BFLOAT16;
        size_t chunk = c->count < HALF_CHUNK ? c->count : HALF_CHUNK;
        float *in = sc->a, *out = sc->b;
        MPI_Op op = c->op == SP_PROD ? MPI_PROD : MPI_SUM;
        sp_status_t st = SP_SUCCESS;
        for (size_t at = 0; at < c->count; at += chunk) {
            size_t k = c->count - at < chunk ? c->count - at : chunk;
            for (int i = 0; i < n; i++)
                sp__half_load((const uint16_t *)c->send + (size_t)i * c->count + at,
                              in + (size_t)i * k, k, bf);
            if (c->op == SP_AVG)
                premultiply_half(in, k * (size_t)n, bf, (float)avg_scale(c->dtype, n));
            int rc = MPI_Reduce_scatter_block(in, out, (int)k, MPI_FLOAT, op, comm);
            if (rc != MPI_SUCCESS) {
                st = sp__mpi_status(rc, SP_SUB_COLL, "sp_reduce_scatter",
                                    "MPI_Reduce_scatter_block");
                break;
            }
            sp__half_store(out, (uint16_t *)c->recv + at, k, bf);
        }
        return st;
    }
    MPI_Op op = direct_op(c->dtype, c->op); /* host_scratch checked it */
    /* In place (recv inside send): the result goes to scratch first (host_scratch). */
    bool in_place = sc->a != NULL;
    void *dst = in_place ? sc->a : c->recv;
    /* Floating AVG: the pre-multiplied copy of send is scratch (send itself is the caller's). */
    const void *src = c->send;
    bool premul = sc->b != NULL;
    if (premul) {
        premultiply(sc->b, c->send, c->count * (size_t)n, c->dtype, avg_scale(c->dtype, n));
        src = sc->b;
    }
    int rc =
        MPI_Reduce_scatter_block(src, dst, (int)c->count, sp__coll_mpi_type(c->dtype), op, comm);
    if (rc == MPI_SUCCESS && in_place)
        memcpy(c->recv, dst, c->count * size);
    if (rc != MPI_SUCCESS)
        return sp__mpi_status(rc, SP_SUB_COLL, "sp_reduce_scatter", "MPI_Reduce_scatter_block");
    if (c->op == SP_AVG && !premul)
        sp__coll_avg_divide(c->recv, c->count, c->dtype, n);
    return SP_SUCCESS;
}

static sp_status_t host_broadcast(sp_world_t *w, const sp_coll_call_t *c) {
    size_t bytes = c->count * sp__coll_dtype_size(c->dtype);
    if (sp__world_rank(w) == c->root && c->send != c->recv)
        memcpy(c->recv, c->send, bytes); /* checked: they do not overlap */
    const size_t step = (size_t)1 << 30;
    for (size_t at = 0; at < bytes; at += step) {
        size_t k = bytes - at < step ? bytes - at : step;
        int rc = MPI_Bcast((char *)c->recv + at, (int)k, MPI_BYTE, c->root, sp__world_comm(w));
        if (rc != MPI_SUCCESS)
            return sp__mpi_status(rc, SP_SUB_COLL, "sp_broadcast", "MPI_Bcast");
    }
    return SP_SUCCESS;
}

/* ---- symmetric kernels: eligible or not --------------------------------------------------- */

/* True when ptr lies in a registered segment of a symmetric pool on this rank: on cuda an NCCL
 * window, on host an MPI shared window (the mpi registrar has no NCCL window handle). `pool` is
 * ptr's pool as check_buffer looked it up, NULL where it did not (a broadcast's unused send):
 * then it is looked up here. The pool handle is checked again (another thread may have
 * destroyed it since), so a stale one reads as "not symmetric". */
static bool in_symmetric_segment(const void *ptr, sp_mempool_t *pool, bool cuda) {
    sp_block_info_t info;
    if (ptr != NULL && pool == NULL && sp__pool_lookup(ptr, &info) == SP_SUCCESS)
        pool = info.pool;
    if (ptr == NULL || pool == NULL || sp__mempool_sym_state(pool) == NULL)
        return false;
    sp_window_info_t win;
    return sp_symmetric_window(ptr, &win) == SP_SUCCESS && (!cuda || win.window != NULL);
}

/* NCCL 2.28.9's symmetric kernels in its order (src/include/sym_kernels.h:27-44 ncclSymkKernelId,
 * their names src/sym_kernels.cc:13-27), each with the collective whose mask holds it
 * (kernelMask_coll, :44-56 and :70-77; AllReduce_RSxNet_ARxMC_AGxNet is in none: -1) and whether
 * it is an LL kernel (kernelMask_LL, :38-42). The multimem ("MC") kernels also need NVLS
 * (comm->nvlsSupport, :279-304), which NCCL derives from the hardware and its topology search and
 * 2.28 does not report: sympool takes them as available, so a call NCCL might run on them still
 * has its places agreed (the safe side), at the cost of counting it eligible on a node without
 * NVLS where NCCL_SYM_KERNEL names one. */
static const struct {
    const char *name;
    int kind; /* sp_coll_kind_t; -1: no collective's */
    bool ll;  /* an LL kernel: 32-bit element counts */
} symks[] = {
    {"AllReduce_AGxLL_R", SP_COLL_ALLREDUCE, true},
    {"AllReduce_AGxLLMC_R", SP_COLL_ALLREDUCE, true},
    {"AllReduce_RSxLD_AGxST", SP_COLL_ALLREDUCE, false},
    {"AllReduce_RSxLDMC_AGxSTMC", SP_COLL_ALLREDUCE, false},
    {"AllReduce_RSxNet_ARxMC_AGxNet", -1, false},
    {"AllGather_LL", SP_COLL_ALLGATHER, true},
    {"AllGather_LLMC", SP_COLL_ALLGATHER, true},
    {"AllGather_ST", SP_COLL_ALLGATHER, false},
    {"AllGather_STMC", SP_COLL_ALLGATHER, false},
    {"ReduceScatter_LL", SP_COLL_REDUCE_SCATTER, true},
    {"ReduceScatter_LD", SP_COLL_REDUCE_SCATTER, false},
    {"ReduceScatter_LDMC", SP_COLL_REDUCE_SCATTER, false},
};

enum { SYMK_UNREAD = -3, SYMK_NONE = -2, SYMK_ALL = -1 };

/* The kernel NCCL_SYM_KERNEL leaves NCCL: its index in symks, SYMK_ALL when the variable is unset
 * or "^", SYMK_NONE for any other value (src/sym_kernels.cc:79-102 kernelMask_user: an exact
 * name). NCCL reads it once a process and keeps it, so sympool does too; a race between two
 * first readers is harmless (both read the same environment). */
static int user_kernel(void) {
    static int cached = SYMK_UNREAD;
    int k = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
    if (k != SYMK_UNREAD)
        return k;
    const char *e = getenv("NCCL_SYM_KERNEL");
    k = e == NULL || strcmp(e, "^") == 0 ? SYMK_ALL : SYMK_NONE;
    for (size_t i = 0; k == SYMK_NONE && i < sizeof symks / sizeof symks[0]; i++)
        if (strcmp(e, symks[i].name) == 0)
            k = (int)i;
    __atomic_store_n(&cached, k, __ATOMIC_RELEASE);
    return k;
}

/* This process's NCCL_SYM_KERNEL as sympool read it (user_kernel), for messages: *sep_p and the
 * result follow "NCCL_SYM_KERNEL": "=" and a kernel's name, or " " and "unset (every kernel)",
 * "^ (every kernel)" or "naming no kernel". */
static const char *sym_kernel_setting(const char **sep_p) {
    int k = user_kernel();
    *sep_p = k >= 0 ? "=" : " ";
    if (k == SYMK_ALL)
        return getenv("NCCL_SYM_KERNEL") ? "^ (every kernel)" : "unset (every kernel)";
    return k == SYMK_NONE ? "naming no kernel" : symks[k].name;
}

/* The kernels ncclSymkMask (src/sym_kernels.cc:275-317) leaves a call of this kind and these bus
 * bytes (:306-307: the message's bytes for all-reduce, nRanks times them otherwise), a bit per
 * symks entry, multimem ones taken as available (above); 0: none. NCCL picks the call's kernel
 * among them by its cost model (ncclSymkPickKernel), the same way on every rank of a
 * communicator, so ranks with the same mask pick the same kernel. The caller has checked what
 * ncclSymkImplemented and the node rule (:314) ask. */
static int64_t kernel_mask(sp_coll_kind_t kind, size_t bus) {
    /* Any kernel may count its chunks in 32 bits (:310-312). */
    if (bus >= (size_t)64 << 30)
        return 0;
    int k = user_kernel();
    int64_t mask = 0;
    for (int i = 0; i < (int)(sizeof symks / sizeof symks[0]); i++) {
        bool user = k == SYMK_ALL || k == i;
        /* LL kernels count elements in 32 bits (:308-309). */
        bool fits = !symks[i].ll || bus < (size_t)2 << 30;
        if (user && fits && symks[i].kind == (int)kind)
            mask |= (int64_t)1 << i;
    }
    return mask;
}

/* Why kernel_mask leaves a call no kernel, NULL when it leaves one. */
static const char *no_kernel_reason(sp_coll_kind_t kind, size_t bus) {
    if (kernel_mask(kind, bus) != 0)
        return NULL;
    if (bus >= (size_t)64 << 30)
        return "64 GiB or more of bus bytes: NCCL 2.28 has no symmetric kernel that large";
    int k = user_kernel(); /* each collective has a kernel neither LL nor multimem otherwise */
    if (k < 0)
        return "NCCL_SYM_KERNEL names no symmetric kernel of NCCL 2.28";
    if (symks[k].kind != (int)kind)
        return "NCCL_SYM_KERNEL names a kernel of another collective";
    return "NCCL_SYM_KERNEL names an LL kernel, which NCCL 2.28 drops at 2 GiB or more of bus "
           "bytes";
}

/* The call's bus bytes as ncclSymkMask counts them (:306-307). check_local has checked that the
 * product fits. */
static size_t bus_bytes(const call_ctx_t *x, const sp_coll_call_t *c) {
    size_t scale = c->kind == SP_COLL_ALLREDUCE ? 1 : (size_t)x->size;
    return c->count * sp__coll_dtype_size(c->dtype) * scale;
}

/* Why this call cannot use symmetric kernels, or NULL when it can. The buffers decide on every
 * backend; on cuda the call must also be one NCCL's symmetric kernels take (NCCL 2.28). */
static const char *no_symmetric_reason(const sp_world_t *w, const call_ctx_t *x,
                                       const sp_coll_call_t *c) {
    bool cuda = x->cuda;
    if (x->size < 2)
        return "a single rank runs a local copy";
    if (cuda) {
        if (sp__world_local_size(w) != x->size)
            return "ranks span several nodes (NCCL 2.28 has symmetric kernels within one node "
                   "only)";
        const char *no_sym = sp__world_nccl_no_symmetric(w);
        if (no_sym)
            return no_sym;
        if (c->kind == SP_COLL_BROADCAST)
            return "broadcast has no symmetric kernels";
        if (c->kind != SP_COLL_ALLGATHER) {
            if (c->op != SP_SUM)
                return c->op == SP_AVG
                           ? "op avg: symmetric kernels reduce sum only (use sum and scale)"
                           : "op is not sum: symmetric kernels reduce sum only";
            if (c->dtype != SP_FLOAT32 && c->dtype != SP_FLOAT16 && c->dtype != SP_BFLOAT16)
                return "dtype: symmetric kernels reduce float32, float16 and bfloat16 only";
        }
        const char *no_kernel = no_kernel_reason(c->kind, bus_bytes(x, c));
        if (no_kernel)
            return no_kernel;
    }
    if (!in_symmetric_segment(c->send, x->send_pool, cuda))
        return "send buffer is not in a registered symmetric segment (allocate it with "
               "sp_symmetric_malloc)";
    if (!in_symmetric_segment(c->recv, x->recv_pool, cuda))
        return "recv buffer is not in a registered symmetric segment (allocate it with "
               "sp_symmetric_malloc)";
    return NULL;
}

/* The call's world and backend, as every path of a call reads them. */
static call_ctx_t call_ctx(sp_world_t *w) {
    const char *backend = sp_backend_name();
    return (call_ctx_t){.rank = sp__world_rank(w),
                        .size = sp__world_size(w),
                        .device = sp__world_device(w),
                        .cuda = strcmp(backend, "cuda") == 0,
                        .host = strcmp(backend, "host") == 0};
}

const char *sp__coll_no_symmetric_reason(sp_world_t *w, const sp_coll_call_t *c) {
    call_ctx_t x = call_ctx(w);
    const char *why = no_symmetric_reason(w, &x, c);
    sp__error_clear(); /* the window probes may have left a last-error text */
    return why;
}

/* Count the call as eligible or not (symmetric.collectives_eligible/_fallback in the report)
 * and say why not at INFO, so a silent fallback is visible. */
static void count_symmetric(sp_world_t *w, const call_ctx_t *x, const sp_coll_call_t *c) {
    /* On cuda, places() found the reason before the agreement (a call reaching here passed its
     * checks with a count); the host backend asks now. */
    const char *why = x->cuda ? x->no_sym : no_symmetric_reason(w, x, c);
    sp__error_clear(); /* the window probes may have left a last-error text */
    sp__world_count_collective(w, why == NULL);
    if (why != NULL)
        SP_INFO(SP_SUB_COLL, "%s(%zu x %s, %s): not symmetric kernels: %s", kind_names[c->kind],
                c->count, sp__coll_dtype_name(c->dtype), sp__coll_op_name(c->op), why);
}

/* Where a call NCCL runs on symmetric kernels finds the buffers its kernels reach on peers, for
 * the agreement. NCCL 2.28.9 passes each buffer to the kernel as its window and its offset in the
 * window on the calling rank (src/sym_kernels.cc ncclSymkMakeDevWork: inputOff/outputOff), and a
 * peer's address is that window's flat base for the peer plus the same offset (ncclSymPtr::lsaPtr,
 * peerPtr, multimemPtr). Which buffers go through peers depends on the collective
 * (src/device/symmetric/):
 *  - all-reduce: both (all_reduce.cuh RSxLD_AGxST reads inpPacks.peerPtr and writes
 *    outPacks.peerPtr; RSxLDMC_AGxSTMC uses both multimem pointers);
 *  - all-gather: the recv buffer only (all_gather.cuh: every kernel reads its send buffer through
 *    input.localPtr() and writes output.lsaPtr(r) or output.multimemPtr at output + rank * count);
 *    the send buffer may lie anywhere in a symmetric window, in place or not;
 *  - reduce-scatter: the send buffer only (reduce_scatter.cuh: inpPacks.peerPtr(world, r) at
 *    input + rank * count, or input.multimemPtr; the result goes to output.localPtr()).
 * A rank passing another window or offset for a buffer reached on peers makes its peers read or
 * write the wrong memory, with no error. at[0], at[1]: the send and recv offsets + 1 where they
 * are reached on peers, 0 where not; at[2]: those buffers' segments' sequence numbers (send in
 * the high half, recv in the low, 0 for one not reached) + 1, 0 when the call does not run on
 * symmetric kernels on this rank (NCCL decides that per rank, src/scheduler/symmetric_sched.cc,
 * from this rank's windows and its own NCCL_SYM_KERNEL); x->kernels: the kernels NCCL may pick
 * the call from there (kernel_mask), 0 off them.
 * Every value is the same on every rank of a correct call. */
static void places(sp_world_t *w, call_ctx_t *x, const sp_coll_call_t *c) {
    x->no_sym = no_symmetric_reason(w, x, c);
    x->at[0] = x->at[1] = x->at[2] = 0;
    x->kernels = 0;
    sp_window_info_t s, r;
    if (x->no_sym != NULL || sp_symmetric_window(c->send, &s) != SP_SUCCESS ||
        sp_symmetric_window(c->recv, &r) != SP_SUCCESS) {
        sp__error_clear();
        return;
    }
    bool send_on_peers = c->kind != SP_COLL_ALLGATHER;
    bool recv_on_peers = c->kind != SP_COLL_REDUCE_SCATTER;
    uint64_t send_seq = send_on_peers ? s.segment_seq & 0x3fffffffu : 0;
    uint64_t recv_seq = recv_on_peers ? r.segment_seq & 0xffffffffu : 0;
    x->at[0] = send_on_peers ? (int64_t)s.offset + 1 : 0;
    x->at[1] = recv_on_peers ? (int64_t)r.offset + 1 : 0;
    x->at[2] = (int64_t)((send_seq << 32) | recv_seq) + 1;
    x->kernels = kernel_mask(c->kind, bus_bytes(x, c));
}

/* ---- dispatch --------------------------------------------------------------------------- */

/* A small call on the host backend whose data can travel inside the agreement round: each
 * rank's send (a broadcast: the root's) reaches every rank with the round, so an all-gather or a
 * broadcast is copied out of it and an allreduce reduced from it, by every rank itself in one
 * fixed order, instead of a second exchange. The same decision on every rank once count, dtype,
 * op and root agree (the round checks that before the data is used). Reductions of half types
 * and AVG keep the MPI path, which owns their rounding rules. */
static bool fused(sp_world_t *w, const call_ctx_t *x, const sp_coll_call_t *c) {
    if (!x->host || c->count == 0 || c->count > SP_AGREE_PAYLOAD_MAX ||
        c->count * sp__coll_dtype_size(c->dtype) > SP_AGREE_PAYLOAD_MAX ||
        !sp__world_agree_payload(w))
        return false;
    if (c->kind == SP_COLL_ALLGATHER || c->kind == SP_COLL_BROADCAST)
        return true;
    return c->kind == SP_COLL_ALLREDUCE && !is_half(c->dtype) && c->op != SP_AVG;
}

/* acc[i] = in[i] op acc[i] over n elements, the expression MPI_Reduce_local evaluates for the
 * built-in ops (integers wrap, as MPI's do, computed unsigned so C has no overflow), without a
 * call into MPI per rank: the fused path exists because a small allreduce is all overhead.
 * Elements are copied in and out (the buffers are bytes, of any alignment). */
static void fold(const void *in, void *acc, size_t n, sp_dtype_t dtype, sp_redop_t op) {
#define FOLD_LOOP(T, EXPR)                                                                         \
    do {                                                                                           \
        const char *s_ = in;                                                                       \
        char *d_ = acc;                                                                            \
        for (size_t i = 0; i < n; i++) {                                                           \
            T a, b;                                                                                \
            memcpy(&a, s_ + i * sizeof(T), sizeof(T));                                             \
            memcpy(&b, d_ + i * sizeof(T), sizeof(T));                                             \
            b = (T)(EXPR);                                                                         \
            memcpy(d_ + i * sizeof(T), &b, sizeof(T));                                             \
        }                                                                                          \
    } while (0)
#define FOLD(T, U)                                                                                 \
    do {                                                                                           \
        if (op == SP_SUM)                                                                          \
            FOLD_LOOP(T, (U)a + (U)b);                                                             \
        else if (op == SP_PROD)                                                                    \
            FOLD_LOOP(T, (U)a *(U)b);                                                              \
        else if (op == SP_MIN)                                                                     \
            FOLD_LOOP(T, a < b ? a : b);                                                           \
        else                                                                                       \
            FOLD_LOOP(T, a > b ? a : b);                                                           \
    } while (0)
    switch (dtype) {
    case SP_INT8:
        FOLD(int8_t, unsigned);
        break;
    case SP_UINT8:
        FOLD(uint8_t, unsigned);
        break;
    case SP_INT32:
        FOLD(int32_t, uint32_t);
        break;
    case SP_UINT32:
        FOLD(uint32_t, uint32_t);
        break;
    case SP_INT64:
        FOLD(int64_t, uint64_t);
        break;
    case SP_UINT64:
        FOLD(uint64_t, uint64_t);
        break;
    case SP_FLOAT32:
        FOLD(float, float);
        break;
    case SP_FLOAT64:
        FOLD(double, double);
        break;
    case SP_FLOAT16:
    case SP_BFLOAT16:
        break; /* never fused (fused()) */
    }
#undef FOLD
#undef FOLD_LOOP
}

/* recv = x_0 op (x_1 op (... op x_{n-1})) over the gathered inputs: the same order, so the same
 * bits, on every rank. */
static void reduce_gathered(const call_ctx_t *x, const sp_coll_call_t *c, const char *gathered) {
    int n = x->size;
    size_t bytes = c->count * sp__coll_dtype_size(c->dtype);
    char acc[SP_AGREE_PAYLOAD_MAX];
    memcpy(acc, gathered + (size_t)(n - 1) * SP_AGREE_PAYLOAD_MAX, bytes);
    for (int p = n - 2; p >= 0; p--)
        fold(gathered + (size_t)p * SP_AGREE_PAYLOAD_MAX, acc, c->count, c->dtype, c->op);
    memcpy(c->recv, acc, bytes);
}

/* A fused call's result, from every rank's send as the round gathered it (a slot of
 * SP_AGREE_PAYLOAD_MAX bytes per rank, rank order). The slots are a copy: recv may hold this
 * rank's send (in place) without overlap here. */
static void from_gathered(const call_ctx_t *x, const sp_coll_call_t *c, const char *gathered) {
    size_t bytes = c->count * sp__coll_dtype_size(c->dtype);
    switch (c->kind) {
    case SP_COLL_ALLGATHER:
        for (int p = 0; p < x->size; p++)
            memcpy((char *)c->recv + (size_t)p * bytes, gathered + (size_t)p * SP_AGREE_PAYLOAD_MAX,
                   bytes);
        return;
    case SP_COLL_BROADCAST:
        memcpy(c->recv, gathered + (size_t)c->root * SP_AGREE_PAYLOAD_MAX, bytes);
        return;
    default: /* SP_COLL_ALLREDUCE (fused()) */
        reduce_gathered(x, c, gathered);
        return;
    }
}

/* Whether this rank can enter NCCL on cuda. Checked before the agreement, whose ok flag
 * carries it (and AG_SEND_AT says why to the peers), because the communicator can be gone on
 * some ranks only (sp__world_nccl_abort after a failure there): a rank that found that out
 * after the round would return while its peers wait inside NCCL, which has no deadline. */
static bool ready_for_nccl(sp_world_t *w, call_ctx_t *x, char *why, size_t len) {
    if (sp__world_nccl_comm(w) != NULL)
        return true;
    snprintf(why, len,
             "the cuda backend runs collectives with NCCL, and %s%s%s; rebuild with NCCL >= 2.27 "
             "(found also as libnccl.so.2, e.g. from PyTorch's nvidia-nccl wheel) or use "
             "SYMPOOL_DEVICE=host",
             sp__coll_nccl_built() ? "this world has no NCCL communicator ("
                                   : "this sympool was built without NCCL",
             sp__coll_nccl_built() ? sp__world_nccl_why(w) : "", sp__coll_nccl_built() ? ")" : "");
    x->at[0] = AG_NO_NCCL;
    return false;
}

/* The data movement of a call every rank agreed on (count > 0). */
static sp_status_t move(sp_world_t *w, const call_ctx_t *x, const sp_coll_call_t *c,
                        const char *gathered, const scratch_t *sc) {
    const char *fn = kind_names[c->kind];
    count_symmetric(w, x, c);
    if (gathered) {
        from_gathered(x, c, gathered);
        return SP_SUCCESS;
    }
    /* The path follows the backend, not whether NCCL came up: on cuda the buffers are device
     * memory, which the MPI path would read with the CPU (a segfault). */
    if (x->cuda) /* every rank has a communicator: ready_for_nccl fed the agreement */
        return sp__coll_nccl(w, c);
    /* MPI-3 counts are int: allgather and reduce_scatter cannot be split into independent
     * chunks as simply as the element-wise calls, so they refuse what does not fit (the same
     * decision on every rank: the count is agreed). */
    if ((c->kind == SP_COLL_ALLGATHER || c->kind == SP_COLL_REDUCE_SCATTER) &&
        c->count > MAX_MPI_COUNT)
        return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_COLL,
                         "%s: %zu elements per rank exceed MPI's int count on the host backend", fn,
                         c->count);
    switch (c->kind) {
    case SP_COLL_ALLREDUCE:
        return host_allreduce(w, c, sc);
    case SP_COLL_ALLGATHER:
        return host_allgather(w, c);
    case SP_COLL_REDUCE_SCATTER:
        return host_reduce_scatter(w, c, sc);
    case SP_COLL_BROADCAST:
        return host_broadcast(w, c);
    }
    return sp__error(SP_ERR_INTERNAL, SP_SUB_COLL, "unknown collective %d", (int)c->kind);
}

static sp_status_t run(sp_world_t *w, const sp_coll_call_t *c) {
    const char *fn = kind_names[c->kind];
    SP_CHECK(sp__world_check(w, fn));
    call_ctx_t x = call_ctx(w);
    bool cuda = x.cuda;
    char why[512];
    bool ok = check_local(&x, c, why, sizeof why);
    sp_status_t bad = SP_ERR_INVALID_ARGUMENT;
    char gathered[SP_AGREE_P2P_MAX_RANKS * SP_AGREE_PAYLOAD_MAX];
    bool fuse = fused(w, &x, c);
    if (cuda && ok && c->count > 0)
        places(w, &x, c);
    if (cuda && ok && c->count > 0 && !ready_for_nccl(w, &x, why, sizeof why)) {
        ok = false;
        bad = SP_ERR_NOT_SUPPORTED;
    }
    scratch_t sc = {NULL, NULL};
    if (!cuda && !fuse && ok && c->count > 0 && !host_scratch(&x, c, &sc, why, sizeof why)) {
        ok = false;
        bad = SP_ERR_SYSTEM;
    }
    sp_status_t st = agree(w, &x, c, ok, bad, why, fuse ? gathered : NULL);
    if (st == SP_SUCCESS && c->count > 0)
        st = move(w, &x, c, fuse ? gathered : NULL, &sc);
    free(sc.a);
    free(sc.b);
    return st;
}

SP_EXPORT sp_status_t sp_allreduce(sp_world_t *w, const void *send, void *recv, size_t count,
                                   sp_dtype_t dtype, sp_redop_t op, sp_stream_t stream) {
    sp_coll_call_t c = {SP_COLL_ALLREDUCE, send, recv, count, dtype, op, 0, stream};
    return run(w, &c);
}

SP_EXPORT sp_status_t sp_allgather(sp_world_t *w, const void *send, void *recv, size_t send_count,
                                   sp_dtype_t dtype, sp_stream_t stream) {
    sp_coll_call_t c = {SP_COLL_ALLGATHER, send, recv, send_count, dtype, SP_SUM, 0, stream};
    return run(w, &c);
}

SP_EXPORT sp_status_t sp_reduce_scatter(sp_world_t *w, const void *send, void *recv,
                                        size_t recv_count, sp_dtype_t dtype, sp_redop_t op,
                                        sp_stream_t stream) {
    sp_coll_call_t c = {SP_COLL_REDUCE_SCATTER, send, recv, recv_count, dtype, op, 0, stream};
    return run(w, &c);
}

SP_EXPORT sp_status_t sp_broadcast(sp_world_t *w, const void *send, void *recv, size_t count,
                                   sp_dtype_t dtype, int root, sp_stream_t stream) {
    sp_coll_call_t c = {SP_COLL_BROADCAST, send, recv, count, dtype, SP_SUM, root, stream};
    return run(w, &c);
}
