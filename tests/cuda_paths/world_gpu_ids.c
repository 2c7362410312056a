/* world_gpu_ids.c: sp_world_init on the cuda backend with NCCL tells ranks on one GPU apart by
 * the GPU's PCI bus id, not by device ordinals (run under the CUDA/NCCL test doubles, each rank
 * given its own CUDA_VISIBLE_DEVICES by visible.sh).
 *   world_gpu_ids apart: every rank sees other GPUs, all as device 0 (one GPU per rank, as
 *     SLURM's --gpus-per-task=1 starts them): the world (and its NCCL communicator) is made, on
 *     device 0; prints "apart ok rank N".
 *   world_gpu_ids shared: the ranks' chosen ordinals differ but name one GPU: sp_world_init fails
 *     on every rank with the "share" message, before NCCL's "Duplicate GPU detected"; prints
 *     "shared ok rank N". */
#include <stdio.h>
#include <string.h>

#include <mpi.h>

#include "sympool/sympool.h"
#include "sympool/world.h"

static int apart(int rank) {
    sp_world_t *w = NULL;
    sp_status_t s = sp_world_init(NULL, NULL, &w);
    if (s != SP_SUCCESS) {
        printf("apart FAIL rank %d: %s: %s\n", rank, sp_status_name(s), sp_last_error());
        return 1;
    }
    /* The world exists only if the NCCL double's communicator init found no two ranks on one
     * GPU of one host. */
    int ok = sp_device_count() == 1 && sp_world_device(w) == 0;
    printf("apart %s rank %d: %s\n", ok ? "ok" : "FAIL", rank, ok ? "" : sp_last_error());
    (void)sp_world_finalize(w);
    return ok ? 0 : 1;
}

static int shared(int rank) {
    sp_world_t *w = NULL;
    sp_status_t s = sp_world_init(NULL, NULL, &w);
    const char *msg = sp_last_error();
    int ok = s == SP_ERR_INVALID_USAGE && w == NULL && strstr(msg, "ranks on one node share 1 GPU");
    printf("shared %s rank %d: %s: %s\n", ok ? "ok" : "FAIL", rank, sp_status_name(s), msg);
    if (w)
        (void)sp_world_finalize(w);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int rc = argc > 1 && strcmp(argv[1], "apart") == 0    ? apart(rank)
             : argc > 1 && strcmp(argv[1], "shared") == 0 ? shared(rank)
                                                          : 2;
    fflush(stdout);
    (void)sp_shutdown();
    MPI_Finalize();
    return rc;
}
