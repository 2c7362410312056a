/*
 * coll_nccl.c: the cuda backend's data path: NCCL collectives on the world's communicator and
 * the caller's stream, for calls that collectives.c has already checked and agreed on.
 *
 * NCCL picks its symmetric kernels by itself when both buffers lie in windows registered with
 * NCCL_WIN_COLL_SYMMETRIC (our symmetric pools' segments) at identical offsets, the op is a sum of
 * fp32/fp16/bf16 (allreduce, reduce-scatter) or any allgather, there is more than one rank,
 * the ranks share a node, the call has under 64 GiB of bus bytes and NCCL_SYM_KERNEL leaves it
 * a kernel (reference/nccl-windows.md 1.5; collectives.c no_kernel_reason). We do not force
 * anything; collectives.c counts every call as eligible or not (symmetric.collectives_eligible/
 * _fallback in the stats report) and says why not at SYMPOOL_DEBUG=INFO (subsystem COLL), so a
 * user who expected the fast path learns what to change.
 *
 * SP_AVG is ncclAvg, whose semantics collectives.h documents and the host path reproduces:
 * floating types pre-multiply each rank's value by 1/n rounded to the type (PreMulSum), integer
 * types divide the sum (SumPostDiv).
 *
 * The NCCL found at run time (libnccl.so.2 can be another than the one built against, e.g.
 * PyTorch's) is logged once at INFO on the first collective, and at WARN when it is older than
 * the headers: the calls made here exist in every NCCL since 2.10.
 *
 * Completion follows NCCL: the call is enqueued on the stream and returns; the stream orders it.
 * Locking: the world's NCCL lock is held across the enqueue (NCCL forbids using one communicator
 * from two threads at once, and window (de)registration from another thread uses the same
 * communicator). The enqueue can wait for the peers' (NCCL 2.28 makes a communicator's
 * connections at the first call that uses an algorithm: src/enqueue.cc:453, src/group.cc:149),
 * and so does a window registration, so a call first passes the world's gate, which puts it in
 * one order with registrations on every rank (world/world.h, sp__world_nccl_coll_enter).
 */
#include "collectives/dtype.h"
#include "core/core.h"
#include "world/world.h"

static void (*_Atomic s_test_at_nccl)(void); /* sp__coll_test_at_nccl */

/* Tests: `hook` runs on a thread whose collective is about to enter NCCL, before it asks for the
 * world's NCCL lock (NULL: none). */
void sp__coll_test_at_nccl(void (*hook)(void)) {
    s_test_at_nccl = hook;
}

#ifdef SP_HAVE_NCCL

#include <cuda_runtime.h>
/* nccl.h declares a few functions with () instead of (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include <pthread.h>

#include "pool/pool.h"
#include "sympool/symmetric.h"

bool sp__coll_nccl_built(void) {
    return true;
}

static pthread_once_t g_version_once = PTHREAD_ONCE_INIT;

/* ncclGetVersion: 2.28.9 is 22809 (major*10000 + minor*100 + patch since 2.9). */
static void log_version(void) {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) {
        SP_WARN(SP_SUB_COLL, "ncclGetVersion failed; the NCCL library loaded is unknown");
        return;
    }
    int built = NCCL_VERSION_CODE;
    SP_INFO(SP_SUB_COLL, "NCCL %d.%d.%d at run time (built against %d.%d.%d)", v / 10000,
            v / 100 % 100, v % 100, built / 10000, built / 100 % 100, built % 100);
    if (v / 100 < built / 100)
        SP_WARN(SP_SUB_COLL,
                "the NCCL loaded at run time (%d.%d.%d) is older than the headers sympool was "
                "built with (%d.%d.%d); point LD_LIBRARY_PATH at the newer libnccl.so.2",
                v / 10000, v / 100 % 100, v % 100, built / 10000, built / 100 % 100, built % 100);
}

sp_status_t sp__coll_nccl(sp_world_t *w, const sp_coll_call_t *c) {
    static const char *const fns[] = {"sp_allreduce", "sp_allgather", "sp_reduce_scatter",
                                      "sp_broadcast"};
    pthread_once(&g_version_once, log_version);
    ncclComm_t comm = (ncclComm_t)sp__world_nccl_comm(w);
    cudaStream_t stream = (cudaStream_t)c->stream;
    ncclDataType_t t = (ncclDataType_t)sp__coll_nccl_type(c->dtype);
    ncclResult_t r = ncclSuccess;
    void (*at)(void) = s_test_at_nccl;
    if (at)
        at();
    sp__world_nccl_coll_enter(w); /* in one order with registrations (world/world.h) */
    sp__world_nccl_lock(w);
    comm = (ncclComm_t)sp__world_nccl_comm(w); /* re-read: an abort may have happened */
    if (!comm) {
        sp__world_nccl_unlock(w);
        sp__world_nccl_coll_leave(w);
        return sp__error(SP_ERR_NCCL, SP_SUB_COLL, "%s: %s", fns[c->kind], sp__world_nccl_why(w));
    }
    switch (c->kind) {
    case SP_COLL_ALLREDUCE:
        r = ncclAllReduce(c->send, c->recv, c->count, t, (ncclRedOp_t)sp__coll_nccl_op(c->op), comm,
                          stream);
        break;
    case SP_COLL_ALLGATHER:
        r = ncclAllGather(c->send, c->recv, c->count, t, comm, stream);
        break;
    case SP_COLL_REDUCE_SCATTER:
        r = ncclReduceScatter(c->send, c->recv, c->count, t, (ncclRedOp_t)sp__coll_nccl_op(c->op),
                              comm, stream);
        break;
    case SP_COLL_BROADCAST:
        r = ncclBroadcast(c->send, c->recv, c->count, t, c->root, comm, stream);
        break;
    }
    /* NCCL's text is read under the lock: once it is released, another thread may abort (and
     * free) the communicator that ncclGetLastError reads. */
    char last[256] = "";
    if (r != ncclSuccess) {
        const char *l = ncclGetLastError(comm);
        snprintf(last, sizeof last, "%s", l ? l : "");
    }
    sp__world_nccl_unlock(w);
    sp__world_nccl_coll_leave(w);
    if (r != ncclSuccess)
        return sp__error(SP_ERR_NCCL, SP_SUB_COLL, "%s: NCCL failed: %s (%s)", fns[c->kind],
                         ncclGetErrorString(r), last);
    return SP_SUCCESS;
}

#else /* !SP_HAVE_NCCL */

bool sp__coll_nccl_built(void) {
    return false;
}

sp_status_t sp__coll_nccl(sp_world_t *w, const sp_coll_call_t *c) {
    (void)w;
    return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_COLL,
                     "collective %d: this build of sympool has no NCCL (rebuild with NCCL for the "
                     "cuda backend)",
                     (int)c->kind);
}

#endif
