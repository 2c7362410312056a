/*
 * reg_mpi.c: the `mpi` registrar. A segment is an MPI shared-memory window on the node
 * communicator: every rank of the node allocates its own part of the same size with
 * MPI_Win_allocate_shared, so MPI_Win_shared_query gives a real load/store pointer to any
 * node-local peer's segment (sp_symmetric_peer_ptr). It is what runs in CI on the host backend.
 * Those pointers are asked for once, by the collective call that makes the segment, and kept in
 * a table (the segment's `keep`): sp_symmetric_peer_ptr is local and thread-safe, so it may run
 * on any thread, while under MPI_THREAD_FUNNELED only the main thread, and under SERIALIZED only
 * one thread at a time, may call MPI (MPI-3.1 12.4.3).
 *
 * Invariants: one window per segment, created and freed collectively in the order the agreement
 * protocol dictates. If the world spans several nodes, each node's ranks share one window object
 * per segment and peer pointers exist only within a node. No lock: the caller serializes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "symmetric/sym_state.h"
#include "sympool/pool.h"

/* Segments start on a page boundary, as device segments do. MPI does not promise it (Open MPI's
 * osc/sm puts a header before a rank's part), so each part is over-allocated by ALIGN and every
 * rank aligns its own and its peers' bases the same way: offsets stay identical. */
#define ALIGN 4096

static void *align_base(void *p) {
    return (void *)(((uintptr_t)p + ALIGN - 1) / ALIGN * ALIGN);
}

static sp_status_t mpi_alloc(sp_sym_state_t *st, size_t size, sp_sym_seg_t *seg_p) {
    /* The peer table, made before the collective steps: a rank without it still joins them and
     * says so in the round, so that no rank keeps a segment the others lack. */
    int nnode = 0;
    MPI_Comm_size(st->node_comm, &nnode);
    void **peers = calloc(nnode > 0 ? (size_t)nnode : 1, sizeof *peers);
    MPI_Info info;
    MPI_Info_create(&info);
    /* Each rank's part starts on its own page instead of right after its neighbour's. */
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    void *base = NULL;
    MPI_Win win = MPI_WIN_NULL;
    int rc = MPI_Win_allocate_shared((MPI_Aint)(size + ALIGN), 1, info, st->node_comm, &base, &win);
    MPI_Info_free(&info);
    sp_status_t s = sp__world_mpi_status(rc, "MPI_Win_allocate_shared");
    if (s == SP_SUCCESS)
        MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN);
    if (s == SP_SUCCESS && !peers)
        s = sp__error(SP_ERR_SYSTEM, SP_SUB_SYM,
                      "symmetric pool \"%s\": out of host memory for the table of %d peer "
                      "pointers of a shared segment; this rank's part is kept until MPI is "
                      "finalized",
                      st->name, nnode);
    /* Every rank learns whether all got their part, so none keeps a segment the others lack.
     * A partial failure cannot be undone collectively (MPI_Win_free would need every rank), so
     * the ranks that succeeded keep their window until the world is finalized. */
    char what[128], ranks[96];
    snprintf(what, sizeof what, "%zu-byte shared segment of symmetric pool \"%s\"", size, st->name);
    sp_agree_t a = {.op = SP_AGREE_SYM_REGISTER, .ok = s == SP_SUCCESS, .f = {(int64_t)size}};
    sp_status_t as = sp__sym_round(st, &a, what);
    if (as != SP_SUCCESS || a.nbad)
        free(peers);
    if (as != SP_SUCCESS)
        return as;
    if (a.nbad) {
        if (s == SP_SUCCESS) {
            SP_WARN(SP_SUB_SYM,
                    "%s: %s could not allocate its part; this rank's part is "
                    "kept until MPI is finalized",
                    what, sp__agree_bad_ranks(&a, ranks, sizeof ranks));
            return sp__error(SP_ERR_OUT_OF_MEMORY, SP_SUB_SYM, "%s: %s could not allocate its part",
                             what, ranks);
        }
        return s;
    }
    /* Local queries, on the thread of the collective call. A part that cannot be had stays
     * NULL, and sp_symmetric_peer_ptr says so for that rank. */
    for (int r = 0; r < nnode; r++) {
        MPI_Aint part = 0;
        int disp = 0;
        void *at = NULL;
        if (MPI_Win_shared_query(win, r, &part, &disp, &at) == MPI_SUCCESS &&
            (size_t)part >= size + ALIGN)
            peers[r] = align_base(at);
    }
    memset(seg_p, 0, sizeof *seg_p);
    seg_p->keep = peers;
    seg_p->base = align_base(base);
    seg_p->size = size;
    seg_p->alloc_size = size + ALIGN;
    seg_p->window = NULL;
    seg_p->mpi_win = win;
    SP_TRACE(SP_SUB_SYM, "mpi registrar: shared segment %p, %zu bytes", base, size);
    return SP_SUCCESS;
}

static sp_status_t mpi_release(sp_sym_state_t *st, sp_sym_seg_t *seg, void *stream) {
    (void)st;
    (void)stream;    /* host memory: the host backend's work is complete when its calls return */
    free(seg->keep); /* the record goes whatever the release's outcome (sym_release.c) */
    seg->keep = NULL;
    if (seg->mpi_win == MPI_WIN_NULL)
        return SP_SUCCESS;
    /* MPI_Win_free is collective over the node and synchronizes it: no peer can still be
     * reading this segment through a peer pointer once it returns. */
    SP_CHECK(sp__world_mpi_status(MPI_Win_free(&seg->mpi_win), "MPI_Win_free"));
    seg->mpi_win = MPI_WIN_NULL;
    seg->base = NULL;
    return SP_SUCCESS;
}

static sp_status_t mpi_peer_ptr(sp_world_t *w, const sp_sym_seg_t *seg, int rank, size_t offset,
                                void **ptr_p) {
    /* No MPI call here (the table was filled when the segment was made), but after the user's
     * MPI_Finalize the shared memory is MPI's no more. */
    if (sp__world_mpi_gone())
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_SYM,
                         "sp_symmetric_peer_ptr: MPI was finalized, and the mpi registrar's "
                         "segments are MPI shared memory; call sp_world_finalize before "
                         "MPI_Finalize");
    /* sp_symmetric_peer_ptr answered ranks of other nodes already. The pool's node communicator
     * is split from a duplicate of the world's as the world's own, so node ranks are the same. */
    int node_rank = sp__world_node_rank_of(w, rank);
    if (node_rank < 0 || node_rank >= sp__world_local_size(w))
        return sp__error(SP_ERR_INTERNAL, SP_SUB_SYM, "rank %d is not on this node", rank);
    void *const *peers = seg->keep;
    if (!peers || !peers[node_rank] || offset >= seg->size)
        return sp__error(SP_ERR_INTERNAL, SP_SUB_SYM,
                         "rank %d's part of the shared segment (%zu bytes, offset %zu) could not "
                         "be had from MPI_Win_shared_query when the segment was made",
                         rank, seg->size, offset);
    *ptr_p = (char *)peers[node_rank] + offset;
    return SP_SUCCESS;
}

const sp_registrar_ops_t sp__registrar_mpi = {
    .name = "mpi",
    .alloc = mpi_alloc,
    .release = mpi_release,
    .peer_ptr = mpi_peer_ptr,
};
