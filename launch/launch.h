/*
 * launch.h: the world's internals that symmetric/ and collectives/ use. launch/world.c owns them.
 */
#ifndef SP_LAUNCH_H
#define SP_LAUNCH_H

#include <stdbool.h>

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

#ifdef __cplusplus
}
#endif

#endif /* SP_LAUNCH_H */
