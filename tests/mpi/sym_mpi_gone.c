/*
 * sym_mpi_gone.c: the user finalizes MPI while a world and a symmetric pool are still live.
 * Every later collective sympool call on them (and sp_symmetric_peer_ptr, whose peer's segment
 * is MPI shared memory) must return SP_ERR_INVALID_USAGE saying so, never enter MPI (Open MPI
 * aborts the process for a call after MPI_Finalize), and sp_world_finalize must still free what is
 * sympool's.
 *
 * The pool's state and cached segment are left behind on purpose (nothing can release a
 * registration once MPI is gone), so LeakSanitizer lists them in sanitizer builds.
 *
 * Every rank prints "sym-mpi-gone: ok rank R" or "sym-mpi-gone: FAIL ..."; the ctest
 * registration (tests/cmake/symmetric.cmake) matches those lines.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include <sympool/collectives.h>
#include <sympool/sympool.h>
#include <sympool/symmetric.h>

static int failures;

static void expect(int rank, const char *what, sp_status_t got) {
    const char *msg = sp_last_error();
    if (got != SP_ERR_INVALID_USAGE || strstr(msg, "MPI_Finalize") == NULL) {
        printf("sym-mpi-gone: FAIL rank %d: %s -> %s (%s)\n", rank, what, sp_status_name(got), msg);
        failures++;
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, n = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    sp_world_t *w = NULL;
    sp_mempool_t *pool = NULL;
    void *blk = NULL, *held = NULL, *peer = NULL;
    int *buf = NULL;
    if (sp_world_from_comm(MPI_COMM_WORLD, &w) != SP_SUCCESS ||
        sp_symmetric_mempool_create(w, NULL, &pool) != SP_SUCCESS ||
        sp_symmetric_malloc(pool, 4096, NULL, &blk) != SP_SUCCESS || sp_free(blk) != SP_SUCCESS ||
        sp_symmetric_malloc(pool, 4096, NULL, &held) != SP_SUCCESS ||
        sp_malloc(64, sp_world_device(w), NULL, (void **)&buf) != SP_SUCCESS) {
        printf("sym-mpi-gone: FAIL rank %d: set-up (%s)\n", rank, sp_last_error());
        return 1;
    }
    buf[0] = 1;
    MPI_Finalize(); /* the user's mistake: sympool's world and pool are still live */

    sp_stats_summary_t sum;
    expect(rank, "sp_allreduce", sp_allreduce(w, buf, buf, 1, SP_INT32, SP_SUM, NULL));
    expect(rank, "sp_broadcast", sp_broadcast(w, buf, buf, 1, SP_INT32, 0, NULL));
    expect(rank, "sp_stats_aggregate", sp_stats_aggregate(w, sp_world_device(w), &sum));
    sp_mempool_t *q = NULL;
    expect(rank, "sp_symmetric_mempool_create", sp_symmetric_mempool_create(w, NULL, &q));
    expect(rank, "sp_symmetric_malloc", sp_symmetric_malloc(pool, 4096, NULL, &blk));
    expect(rank, "sp_symmetric_empty_cache", sp_symmetric_empty_cache(pool));
    /* Local, but the mpi registrar's peer segments are MPI shared memory, gone with MPI. */
    expect(rank, "sp_symmetric_peer_ptr", sp_symmetric_peer_ptr(held, (rank + 1) % n, &peer));
    expect(rank, "sp_symmetric_mempool_destroy", sp_symmetric_mempool_destroy(pool));
    expect(rank, "sp_world_finalize", sp_world_finalize(w));
    if (sp_free(buf) != SP_SUCCESS || sp_free(held) != SP_SUCCESS) {
        printf("sym-mpi-gone: FAIL rank %d: sp_free (%s)\n", rank, sp_last_error());
        failures++;
    }
    if (!failures)
        printf("sym-mpi-gone: ok rank %d\n", rank);
    fflush(stdout);
    return failures ? 1 : 0;
}
