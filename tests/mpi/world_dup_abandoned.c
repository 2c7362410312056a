/*
 * world_dup_abandoned.c: world creation whose deadline (SYMPOOL_SYM_TIMEOUT, set tiny by the
 * ctest registration) passes while its MPI_Comm_idup is still in flight on every rank. Creation
 * fails on every rank with the same status, and the abandoned duplicate must not break the
 * user's MPI_Finalize: MPI-3.1 makes finalizing with a pending request erroneous, and Open MPI 4
 * crashed in it (mca_pml_ob1_del_comm) once the duplicate completed meanwhile. sympool tests its
 * abandoned requests as MPI_Finalize starts (world/agree.c sp__agree_drain).
 *
 * Every rank prints "world-dup-abandoned: ok rank R" only after MPI_Finalize returned, or
 * "world-dup-abandoned: FAIL ..."; the ctest registration (tests/cmake/symmetric.cmake) matches
 * those lines, so a crash in MPI_Finalize leaves the ok line out.
 */
#include <mpi.h>
#include <stdio.h>

#include <sympool/sympool.h>
#include <sympool/world.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    sp_world_t *w = NULL;
    sp_status_t st = sp_world_from_comm(MPI_COMM_WORLD, &w);
    int failures = 0;
    if (st == SP_SUCCESS) /* every duplicate completed within the first polls: nothing abandoned */
        failures += sp_world_finalize(w) != SP_SUCCESS;
    else if (st != SP_ERR_TIMEOUT) {
        printf("world-dup-abandoned: FAIL rank %d: creation -> %s (%s), want SP_ERR_TIMEOUT\n",
               rank, sp_status_name(st), sp_last_error());
        failures++;
    }
    int mine[2] = {(int)st, -(int)st}, all[2];
    MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all[0] != -all[1]) {
        printf("world-dup-abandoned: FAIL rank %d: ranks returned different statuses\n", rank);
        failures++;
    }
    MPI_Finalize();
    if (failures == 0)
        printf("world-dup-abandoned: ok rank %d\n", rank);
    fflush(stdout);
    return failures != 0;
}
