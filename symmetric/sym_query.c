/*
 * sym_query.c: the local questions about symmetric buffers: sp_symmetric_window (which window
 * and offset a pointer lies in) and sp_symmetric_peer_ptr (the same byte on another rank). No
 * round: each answer comes from this rank's registry, under the lock of the pool's segment list
 * (recs_lock), never the lock a call on the pool holds while it waits for the other ranks
 * (sym_state.h), so a query answers while such a call waits.
 */
#include "core/core.h"
#include "pool/pool.h"
#include "symmetric/sym_state.h"

/* ---- queries -------------------------------------------------------------------------------- */

/* Let go of what locate holds on success. */
static void unlock_query(sp_sym_state_t *st) {
    pthread_mutex_unlock(&st->recs_lock);
    sp__sym_leave();
}

/* The live block holding ptr, its symmetric state and its registered segment. */
/* `quiet`: sp_symmetric_window is also a question ("is this buffer in a window?", asked by the
 * collectives on every call), so "no" is logged at INFO, not WARN. `not_ours`: the status of a
 * ptr in no live block of a symmetric pool (each function's header names its own). */
static sp_status_t locate(const void *ptr, const char *fn, bool quiet, sp_status_t not_ours,
                          sp_block_info_t *bi, sp_sym_state_t **st_p, sp_sym_rec_t **rec_p) {
    SP_ARG_CHECK(ptr, SP_SUB_SYM, "%s: ptr is NULL", fn);
    if (sp__world_forked())
        return sp__world_fork_error(fn); /* before the registry's and recs_lock */
    if (sp__pool_lookup(ptr, bi) != SP_SUCCESS)
        return quiet ? sp__error_quiet(not_ours, SP_SUB_SYM,
                                       "%s(%p): not inside a live sympool block", fn, ptr)
                     : sp__error(not_ours, SP_SUB_SYM, "%s(%p): not inside a live sympool block",
                                 fn, ptr);
    if (!bi->pool || !sp_mempool_is_symmetric(bi->pool))
        return quiet ? sp__error_quiet(not_ours, SP_SUB_SYM,
                                       "%s(%p): the block is not in a symmetric pool", fn, ptr)
                     : sp__error(not_ours, SP_SUB_SYM,
                                 "%s(%p): the block is not in a symmetric pool", fn, ptr);
    /* Counted until the caller lets go of recs_lock (unlock_query): a destroy in another
     * thread leaves the state's memory to it (sp__sym_retire). */
    sp__sym_enter();
    sp_sym_state_t *st = sp__sym_find(bi->pool);
    if (!st) {
        sp__sym_leave();
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_SYM,
                         "%s(%p): its symmetric pool's world was finalized", fn, ptr);
    }
    pthread_mutex_lock(&st->recs_lock);
    sp_sym_rec_t *rec = st->recs;
    while (rec && rec->seg.base != bi->segment_base)
        rec = rec->next;
    if (!rec) {
        unlock_query(st);
        return sp__error(SP_ERR_INTERNAL, SP_SUB_SYM, "%s(%p): segment %p has no registration", fn,
                         ptr, bi->segment_base);
    }
    *st_p = st;
    *rec_p = rec;
    return SP_SUCCESS; /* with st->recs_lock held and counted: unlock_query */
}

SP_EXPORT sp_status_t sp_symmetric_window(const void *ptr, sp_window_info_t *info_p) {
    SP_ARG_CHECK(info_p, SP_SUB_SYM, "sp_symmetric_window: info_p is NULL");
    sp_block_info_t bi;
    sp_sym_state_t *st = NULL;
    sp_sym_rec_t *rec = NULL;
    SP_CHECK(locate(ptr, "sp_symmetric_window", true, SP_ERR_INVALID_USAGE, &bi, &st, &rec));
    sp_window_info_t info = {
        .window = rec->seg.window,
        .segment_base = bi.segment_base,
        .offset = (size_t)((const char *)ptr - (const char *)bi.segment_base),
        .segment_size = bi.segment_size,
        .segment_seq = bi.segment_seq,
    };
    unlock_query(st);
    *info_p = info;
    return SP_SUCCESS;
}

/* No registrar maps a rank of another node into this process: MPI shared windows span a node,
 * and NCCL maps the peers of its LSA team, which never crosses a node (2.28 src/dev_runtime.cc
 * ncclDevrInitOnce). Checked here, before the registrar, so the answer names the nodes on every
 * backend. */
static sp_status_t other_node(sp_world_t *w, int rank) {
    int me = sp_world_node(w, sp_world_rank(w)), there = sp_world_node(w, rank);
    const char *mine = sp_world_node_name(w, me), *theirs = sp_world_node_name(w, there);
    return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_SYM,
                     "sp_symmetric_peer_ptr: rank %d is on node %d (%s), this rank on node %d "
                     "(%s); peer pointers reach only the ranks of this node; use the collectives "
                     "for ranks on other nodes",
                     rank, there, theirs ? theirs : "?", me, mine ? mine : "?");
}

SP_EXPORT sp_status_t sp_symmetric_peer_ptr(const void *ptr, int rank, void **peer_ptr_p) {
    SP_ARG_CHECK(peer_ptr_p, SP_SUB_SYM, "sp_symmetric_peer_ptr: peer_ptr_p is NULL");
    sp_block_info_t bi;
    sp_sym_state_t *st = NULL;
    sp_sym_rec_t *rec = NULL;
    /* INVALID_ARGUMENT, as its header says (it was INVALID_USAGE): a pointer outside the
     * caller's symmetric buffers is a bad argument here, whatever else it is. */
    SP_CHECK(locate(ptr, "sp_symmetric_peer_ptr", false, SP_ERR_INVALID_ARGUMENT, &bi, &st, &rec));
    sp_status_t s;
    int size = sp_world_size(st->world);
    size_t at = (size_t)((const char *)ptr - (const char *)bi.block_base);
    /* The block's rounding slack (past the requested size, inside the rounded block) is not the
     * caller's: a pointer there is out of range, as anywhere outside the buffer. */
    if (at >= bi.requested_size)
        s = sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_SYM,
                      "sp_symmetric_peer_ptr(%p): %zu bytes into a buffer of %zu requested bytes "
                      "(the rest of its %zu-byte block is rounding, not the buffer's)",
                      ptr, at, bi.requested_size, bi.block_size);
    else if (rank < 0 || rank >= size)
        s = sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_SYM,
                      "sp_symmetric_peer_ptr: rank %d is outside the world (0..%d)", rank,
                      size - 1);
    else if (sp__world_node_rank_of(st->world, rank) < 0)
        s = other_node(st->world, rank);
    else if (rank == sp_world_rank(st->world)) {
        /* This rank's own byte is always load/store reachable: the pointer itself, whatever the
         * registrar can map for the others (NCCL < 2.29 maps none). */
        *peer_ptr_p = (void *)ptr;
        s = SP_SUCCESS;
    } else
        s = st->reg->peer_ptr(st->world, &rec->seg, rank,
                              (size_t)((const char *)ptr - (const char *)bi.segment_base),
                              peer_ptr_p);
    unlock_query(st);
    return s;
}
