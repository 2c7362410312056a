/**
 * @file world.h
 * @brief The MPI world: bootstrap, local rank -> device, NCCL communicator on the cuda backend.
 */
#ifndef SYMPOOL_WORLD_H
#define SYMPOOL_WORLD_H

#include <mpi.h>

#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sp_world sp_world_t;

/**
 * Collective over MPI_COMM_WORLD. Initializes MPI if nobody did (then finalize will finalize it),
 * duplicates the communicator, finds the local rank, picks the device by local rank and on cuda
 * creates the NCCL communicator from an id rank 0 makes and broadcasts.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT, SP_ERR_MPI, SP_ERR_NCCL, SP_ERR_DEVICE.
 */
sp_status_t sp_world_init(int *argc, char ***argv, sp_world_t **world_p);

/** As sp_world_init on a communicator the caller owns (MPI must be initialized). Collective over
 * comm. */
sp_status_t sp_world_from_comm(MPI_Comm comm, sp_world_t **world_p);

/** Collective: frees the world; finalizes MPI only if sp_world_init initialized it. */
sp_status_t sp_world_finalize(sp_world_t *world);

int sp_world_rank(const sp_world_t *w);       /**< rank in the world's communicator, -1 for NULL */
int sp_world_size(const sp_world_t *w);       /**< number of ranks, 0 for NULL */
int sp_world_local_rank(const sp_world_t *w); /**< rank among the ranks of this node, -1 for NULL */
int sp_world_device(const sp_world_t *w);     /**< the device this rank uses, -1 for NULL */

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_WORLD_H */
