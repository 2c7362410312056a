/*
 * world_mixed_backend.c: ranks on different backends (rank 0 on the one its environment names,
 * the cuda backend under the CUDA/NCCL test doubles; every other rank sets SYMPOOL_DEVICE=host
 * before its first sympool call, as a rank with no GPU visible would fall back under auto).
 * World creation must fail on every rank with SP_ERR_DEVICE: before, the host ranks returned
 * SP_SUCCESS while rank 0 waited in the NCCL set-up's MPI_Bcast for them, for good.
 *
 * A rank that sees anything else prints "world-mixed-backend: FAIL ..." and exits 1; the ctest
 * registration (tests/cmake/cuda_double.cmake) takes mpirun's status and the FAIL lines.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include <sympool/sympool.h>
#include <sympool/world.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0)
        setenv("SYMPOOL_DEVICE", "host", 1); /* options are read at the first sympool call */
    sp_world_t *w = NULL;
    sp_status_t st = sp_world_from_comm(MPI_COMM_WORLD, &w);
    int failures = 0;
    if (st != SP_ERR_DEVICE) {
        printf("world-mixed-backend: FAIL rank %d (backend %s): creation -> %s (%s), want "
               "SP_ERR_DEVICE\n",
               rank, sp_backend_name(), sp_status_name(st), sp_last_error());
        failures++;
    }
    if (st == SP_SUCCESS)
        (void)sp_world_finalize(w);
    MPI_Finalize();
    if (failures == 0)
        printf("world-mixed-backend: ok rank %d\n", rank);
    fflush(stdout);
    return failures != 0;
}
