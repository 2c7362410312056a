/*
 * launch.h: the world's internals that symmetric/ and collectives/ use. launch/world.c owns them.
 */
#ifndef SP_LAUNCH_H
#define SP_LAUNCH_H

#include <stdbool.h>
#include <stdint.h>

#include <mpi.h>

#include "sympool/world.h"

#ifdef __cplusplus
extern "C" {
#endif

MPI_Comm sp__world_comm(const sp_world_t *w);      /* duplicate of the user's communicator */
MPI_Comm sp__world_node_comm(const sp_world_t *w); /* ranks sharing this node (shared memory) */
int sp__world_local_size(const sp_world_t *w);
/* The NCCL communicator (ncclComm_t) on the cuda backend, NULL elsewhere. */
void *sp__world_nccl_comm(const sp_world_t *w);
bool sp__world_is_cuda(const sp_world_t *w);

/* Modules above launch/ (collectives: the SYMPOOL_REPORT table) register work to run at the
 * start of sp_world_finalize, while the communicator still works. At most 8 hooks; returns
 * SP_ERR_INTERNAL past that. Registered from a library constructor, so it is thread-safe by
 * construction. */
typedef void (*sp_world_finalize_hook_t)(sp_world_t *w);
sp_status_t sp__world_on_finalize(sp_world_finalize_hook_t hook);

/* Rank of world rank `world_rank` in the node communicator, -1 if it is on another node (or out
 * of range). Local: the table is computed once at world creation. */
int sp__world_node_rank_of(const sp_world_t *w, int world_rank);

/* A per-world counter of symmetric pool creations (symmetric/ checks that every rank calls
 * sp_symmetric_mempool_create the same number of times). Returns the new value (from 1). */
uint64_t sp__world_next_pool_serial(sp_world_t *w);

/* Translate an MPI return code: SP_SUCCESS for MPI_SUCCESS, else sp__error(SP_ERR_MPI) naming
 * `what` and MPI_Error_string's text. The one place MPI errors become sympool errors. */
sp_status_t sp__world_mpi_status(int rc, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* SP_LAUNCH_H */
