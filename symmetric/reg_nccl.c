/*
 * reg_nccl.c: the `nccl` registrar (built with SP_HAVE_NCCL, runs on the cuda backend). A segment
 * is one ncclMemAlloc (CUDA VMM) allocation registered once, for its whole life, as an NCCL
 * window with NCCL_WIN_COLL_SYMMETRIC, so NCCL's symmetric kernels apply to the blocks carved
 * from it (reference/nccl-windows.md §1, §8).
 *
 * Invariants: one window per physical allocation (2.28 registers only the first physical segment
 * of a multi-segment buffer); sizes aligned to NCCL_WIN_REQUIRED_ALIGNMENT and to the VMM
 * recommended granularity; the window handle starts NULL because 2.28's early-return paths
 * leave it unwritten; teardown is stream sync, MPI barrier, deregister, free (§8.5).
 * No lock: the agreement protocol serializes calls and keeps them in the same order on all ranks.
 */
#if defined(SP_HAVE_NCCL)

#include <cuda.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "core/core.h"
#include "symmetric/registrar.h"

static sp_status_t nccl_err(ncclResult_t r, ncclComm_t comm, const char *what) {
    const char *last = ncclGetLastError(comm);
    return sp__error(SP_ERR_NCCL, SP_SUB_SYM, "%s failed: %s%s%s", what, ncclGetErrorString(r),
                     last && *last ? ": " : "", last ? last : "");
}

static sp_status_t cuda_err(cudaError_t e, const char *what) {
    (void)cudaGetLastError(); /* clear the sticky error so the next call starts clean */
    return sp__error(SP_ERR_DEVICE, SP_SUB_SYM, "%s failed: %s", what, cudaGetErrorString(e));
}

/* The VMM recommended granularity of `device`, read through the runtime's driver entry point so
 * the library never links libcuda.so.1 (absent on GPU-less machines). 2 MiB if unknown. */
static size_t vmm_granularity(int device) {
    typedef CUresult (*gran_fn)(size_t *, const CUmemAllocationProp *,
                                CUmemAllocationGranularity_flags);
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    size_t gran = 0;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAllocationGranularity", &fn, 12000,
                                         cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess && fn) {
        CUmemAllocationProp prop = {0};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        if (((gran_fn)fn)(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS)
            gran = 0;
    }
    (void)cudaGetLastError();
    return gran ? gran : (size_t)2 << 20;
}

static size_t align_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

static sp_status_t all_ok(MPI_Comm comm, int ok, int *all_p) {
    return sp__world_mpi_status(MPI_Allreduce(&ok, all_p, 1, MPI_INT, MPI_MIN, comm),
                                "MPI_Allreduce in the nccl registrar");
}

static sp_status_t nccl_alloc(sp_world_t *w, MPI_Comm comm, int device, size_t size,
                              sp_sym_seg_t *seg_p) {
    ncclComm_t nc = (ncclComm_t)sp__world_nccl_comm(w);
    size_t gran = vmm_granularity(device);
    size_t align =
        gran % NCCL_WIN_REQUIRED_ALIGNMENT == 0 ? gran : gran * NCCL_WIN_REQUIRED_ALIGNMENT;
    size_t asize = align_up(size, align);
    void *base = NULL;
    sp_status_t st = SP_SUCCESS;
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        st = cuda_err(ce, "cudaSetDevice");
    if (st == SP_SUCCESS) {
        ncclResult_t r = ncclMemAlloc(&base, asize);
        if (r != ncclSuccess) {
            base = NULL;
            st = nccl_err(r, nc, "ncclMemAlloc");
        }
    }
    /* ncclMemAlloc is local and can fail on one rank only; the registration that follows is
     * collective, so every rank first learns that every rank has its memory. */
    int all = 0;
    sp_status_t ms = all_ok(comm, st == SP_SUCCESS, &all);
    if (ms != SP_SUCCESS || !all) {
        if (base)
            ncclMemFree(base);
        if (st != SP_SUCCESS)
            return st;
        return ms != SP_SUCCESS ? ms
                                : sp__error(SP_ERR_OUT_OF_MEMORY, SP_SUB_SYM,
                                            "another rank could not ncclMemAlloc %zu bytes", asize);
    }
    ncclWindow_t win = NULL; /* 2.28 may return success without writing it */
    ncclResult_t r = ncclCommWindowRegister(nc, base, asize, &win, NCCL_WIN_COLL_SYMMETRIC);
    st = r == ncclSuccess ? SP_SUCCESS : nccl_err(r, nc, "ncclCommWindowRegister");
    ms = all_ok(comm, st == SP_SUCCESS, &all);
    if (ms != SP_SUCCESS || !all) {
        if (st == SP_SUCCESS && win)
            ncclCommWindowDeregister(nc, win); /* local in NCCL */
        ncclMemFree(base);
        if (st != SP_SUCCESS)
            return st;
        return ms != SP_SUCCESS ? ms
                                : sp__error(SP_ERR_NCCL, SP_SUB_SYM,
                                            "ncclCommWindowRegister failed on another rank");
    }
    if (!win)
        SP_INFO(SP_SUB_SYM,
                "NCCL gave no window for %zu bytes at %p (symmetric support off?): "
                "collectives on it take NCCL's regular path",
                asize, base);
    seg_p->base = base;
    seg_p->size = size;
    seg_p->alloc_size = asize;
    seg_p->window = win;
    seg_p->mpi_win = MPI_WIN_NULL;
    SP_INFO(SP_SUB_SYM, "nccl registrar: window %p on %zu bytes at %p (granularity %zu)",
            (void *)win, asize, base, gran);
    return SP_SUCCESS;
}

static sp_status_t nccl_release(sp_world_t *w, MPI_Comm comm, int device, sp_sym_seg_t *seg) {
    ncclComm_t nc = (ncclComm_t)sp__world_nccl_comm(w);
    sp_status_t st = SP_SUCCESS;
    cudaError_t ce = cudaSetDevice(device);
    if (ce == cudaSuccess)
        ce = cudaDeviceSynchronize(); /* no kernel of ours may still touch the segment */
    if (ce != cudaSuccess)
        st = cuda_err(ce, "cudaDeviceSynchronize before deregistering a window");
    /* Deregistration is local in NCCL: the barrier makes sure no peer still reads this segment
     * through its mapping when it goes away. */
    sp_status_t bs = sp__world_mpi_status(MPI_Barrier(comm), "MPI_Barrier before deregistering");
    if (st == SP_SUCCESS)
        st = bs;
    if (seg->window) {
        ncclResult_t r = ncclCommWindowDeregister(nc, (ncclWindow_t)seg->window);
        if (r != ncclSuccess && st == SP_SUCCESS)
            st = nccl_err(r, nc, "ncclCommWindowDeregister");
        seg->window = NULL;
    }
    if (seg->base) {
        ncclResult_t r = ncclMemFree(seg->base);
        if (r != ncclSuccess && st == SP_SUCCESS)
            st = nccl_err(r, nc, "ncclMemFree");
        seg->base = NULL;
    }
    return st;
}

static sp_status_t nccl_peer_ptr(sp_world_t *w, const sp_sym_seg_t *seg, int rank, size_t offset,
                                 void **ptr_p) {
    (void)w;
    (void)seg;
    (void)offset;
    (void)ptr_p;
    return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_SYM,
                     "sp_symmetric_peer_ptr(rank %d): host-side peer pointers need NCCL 2.29 "
                     "(this build has NCCL %d); use NCCL's device API on the window instead",
                     rank, NCCL_VERSION_CODE);
}

const sp_registrar_ops_t sp__registrar_nccl = {
    .name = "nccl",
    .alloc = nccl_alloc,
    .release = nccl_release,
    .peer_ptr = nccl_peer_ptr,
};

#else
/* Without NCCL this file compiles to nothing; ISO C wants a declaration in every unit. */
typedef int sp_reg_nccl_unused_t;
#endif
