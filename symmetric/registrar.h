/*
 * registrar.h: where a symmetric pool's segments come from and how they are registered, behind
 * one small ops table (UCX rcache-ops style), so the agreement protocol (symmetric.c) is the
 * same for NCCL windows on GPUs and MPI shared windows on host memory.
 *
 * Contract, stated once: `alloc` and `release` are COLLECTIVE over the pool's communicators
 * (every rank calls them with the same size, for the same segment, in the same order: the
 * agreement protocol guarantees it, and each pool has communicators of its own, so two pools
 * growing from two threads never interleave). `alloc` agrees with the other ranks through the
 * pool's rounds (sp__sym_round), so every rank learns the outcome within the deadline and no
 * rank keeps a segment the others lack. They return an sp_status_t, having called sp__error
 * themselves, and on failure leave nothing allocated on this rank. `release` does no barrier:
 * the caller agrees once per release batch. `peer_ptr` is local. No op is called with a pool or
 * device lock held, and no op takes one.
 */
#ifndef SP_SYM_REGISTRAR_H
#define SP_SYM_REGISTRAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "symmetric/symmetric.h"
#include "world/world.h"
#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One registered segment on this rank. */
typedef struct sp_sym_seg {
    void *base;        /* local address of the segment (what the pool carves) */
    size_t size;       /* bytes the pool asked for (identical on every rank) */
    size_t alloc_size; /* bytes actually allocated and registered (aligned up) */
    void *window;      /* ncclWindow_t (nccl), NULL for mpi or when NCCL gave none */
    MPI_Win mpi_win;   /* shared window (mpi), MPI_WIN_NULL for nccl */
    uint64_t order;    /* nccl: its registration's place in the world's order (the same ticket
                        * on every rank; UINT64_MAX for a local registration) */
    void *keep;        /* nccl: the record that keeps it should its release be refused, made with
                        * the segment so that a refusal needs no memory; mpi: the node ranks'
                        * part bases, for peer pointers without an MPI call (malloc'd: freed by
                        * `release`, or with the segment's record where it is never released) */
} sp_sym_seg_t;

struct sp_sym_state;

typedef struct sp_registrar_ops {
    const char *name; /* "nccl" or "mpi" */
    /* Collective: allocate and register `size` bytes on every rank for pool `st`. */
    sp_status_t (*alloc)(struct sp_sym_state *st, size_t size, sp_sym_seg_t *seg_p);
    /* Collective: deregister and free a segment (after the caller's agreement). `stream` is the
     * stream the segment's blocks were used on (NULL: the default stream), the only work that
     * must be complete before the memory goes. */
    sp_status_t (*release)(struct sp_sym_state *st, sp_sym_seg_t *seg, void *stream);
    /* Local, optional (NULL: nothing to wait for): wait until no work of this rank can still use
     * the pool's memory, before the agreement that lets segments go; a failure keeps them on
     * every rank. */
    sp_status_t (*quiesce)(struct sp_sym_state *st);
    /* Collective, optional: try again to let go of what earlier releases on the pool's world
     * could not (reg_nccl.c keeps a refused window or memory); called on every rank by an
     * empty_cache or destroy whose agreed batch releases no segment (`release` and `alloc` try it
     * themselves). */
    void (*retry_kept)(struct sp_sym_state *st);
    /* Local: address of the same byte `offset` of this segment on world rank `rank`. */
    sp_status_t (*peer_ptr)(sp_world_t *w, const sp_sym_seg_t *seg, int rank, size_t offset,
                            void **ptr_p);
} sp_registrar_ops_t;

extern const sp_registrar_ops_t sp__registrar_mpi;
#if defined(SP_HAVE_NCCL)
extern const sp_registrar_ops_t sp__registrar_nccl;
#endif
/* Tests only: the nccl registrar on this process treats the table of its node's devices (which
 * it allocates at every growth) as not allocated (on: true), as host malloc refusing it would.
 * A no-op in a build without NCCL. */
void sp__reg_nccl_test_fail_devs(bool on);
/* Tests only: this process's growths on the nccl registrar stop right before the gather of the
 * node's GPU table, as a rank whose round before it timed out does (SP_ERR_TIMEOUT, its pool
 * broken), so its node peers wait for it there. A no-op in a build without NCCL. */
void sp__reg_nccl_test_skip_gather(bool on);
/* Tests only: `hook` (NULL: none) runs on a growing thread right before the round that readies
 * every rank for the window registration, with the pool's name, so that a test can hold that
 * round open on some ranks. A no-op in a build without NCCL. */
void sp__reg_nccl_test_at_ready(void (*hook)(const char *pool));
/* Tests only: `hook` (NULL: none) runs on a releasing thread right before it waits for its turn to
 * deregister a segment's window, with the pool's name, so that a test can hold a deregistration
 * back on some ranks. A no-op in a build without NCCL. */
void sp__reg_nccl_test_at_release(void (*hook)(const char *pool));

/* The registrar SYMPOOL_SYM_REGISTRAR asks for on this world (auto: nccl on cuda, mpi on host).
 * SP_ERR_NOT_SUPPORTED when the choice cannot run here (nccl without NCCL or GPU, mpi on cuda). */
sp_status_t sp__registrar_select(const sp_world_t *w, const sp_registrar_ops_t **ops_p);

#ifdef __cplusplus
}
#endif

#endif /* SP_SYM_REGISTRAR_H */
