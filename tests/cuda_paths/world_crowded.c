/* world_crowded.c: more ranks on a node than GPUs, on the cuda backend with NCCL (run under the
 * CUDA/NCCL test doubles with fewer double GPUs than ranks): sp_world_init must fail on every
 * rank, before NCCL's "Duplicate GPU detected", saying what to pass to mpirun. Prints
 * "crowded ok rank N" on each rank that got that answer. */
#include <stdio.h>
#include <string.h>

#include <mpi.h>

#include "sympool/sympool.h"
#include "sympool/world.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    sp_world_t *w = NULL;
    sp_status_t s = sp_world_init(NULL, NULL, &w);
    const char *msg = sp_last_error();
    int ok = s == SP_ERR_INVALID_USAGE && w == NULL && strstr(msg, "ranks on one node share") &&
             strstr(msg, "mpirun") && strstr(msg, "SYMPOOL_DEVICE=host");
    printf("crowded %s rank %d: %s: %s\n", ok ? "ok" : "FAIL", rank, sp_status_name(s), msg);
    fflush(stdout);
    if (w)
        (void)sp_world_finalize(w);
    (void)sp_shutdown();
    MPI_Finalize();
    return ok ? 0 : 1;
}
