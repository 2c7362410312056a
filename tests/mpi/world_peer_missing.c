/*
 * world_peer_missing.c: sympool initialized MPI (sp_world_init with MPI not initialized) and a
 * peer never makes the call: the waiting rank must get SP_ERR_TIMEOUT at its deadline, not wait
 * for the peer to end its job. MPI_Finalize is collective over the job: Open MPI 4.1's ends in a
 * PMIx fence that every process must reach (ompi/runtime/ompi_mpi_finalize.c, "Wait for everyone
 * to reach this point"), so sympool must not finalize MPI after a failure that may mean a peer
 * never comes.
 *
 *   world_peer_missing init      rank 0: sp_world_init; rank 1 initializes MPI itself and never
 *                                calls sympool
 *   world_peer_missing finalize  both: sp_world_init; rank 0: sp_world_finalize, rank 1 never
 *
 * Rank 0 checks it got SP_ERR_TIMEOUT and that MPI is still initialized, then tells rank 1 so
 * (MPI_Send on MPI_COMM_WORLD) and finalizes MPI itself. Rank 1 waits for that message (bounded
 * by WAIT_S, a safety net: the verdict is whether it arrives, not when). Before the fix rank 0
 * sat in MPI_Finalize inside the sympool call until rank 1 gave up and finalized. Every rank
 * prints "world-peer-missing: ok rank R" or "world-peer-missing: FAIL ..."; the ctest
 * registration (tests/cmake/symmetric.cmake) runs it with SYMPOOL_SYM_TIMEOUT=1.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sympool/sympool.h>
#include <sympool/world.h>

#define TAG 7311
#define WAIT_S 60.0

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The launcher's rank, before MPI is initialized (rank 0 must leave MPI_Init to sympool). */
static int launcher_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return atoi(v);
    }
    return -1;
}

/* Rank 0, after its sympool call returned `st`. */
static int waiter(const char *call, sp_status_t st) {
    int failures = 0, inited = 0, finalized = 1;
    if (st != SP_ERR_TIMEOUT) {
        printf("world-peer-missing: FAIL rank 0: %s -> %s (%s), want SP_ERR_TIMEOUT\n", call,
               sp_status_name(st), sp_last_error());
        failures++;
    }
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized) {
        printf("world-peer-missing: FAIL rank 0: %s finalized MPI after its failure (it can "
               "return only once every rank finalizes)\n",
               call);
        fflush(stdout);
        return 1; /* MPI is gone: nothing to tell rank 1 with, which gives up on its own */
    }
    int one = 1;
    MPI_Send(&one, 1, MPI_INT, 1, TAG, MPI_COMM_WORLD);
    MPI_Finalize();
    if (!failures)
        printf("world-peer-missing: ok rank 0\n");
    fflush(stdout);
    return failures != 0;
}

/* Rank 1: MPI is initialized; wait for rank 0's word, then finalize. */
static int absentee(void) {
    int got = 0, done = 0;
    MPI_Request req;
    MPI_Irecv(&got, 1, MPI_INT, 0, TAG, MPI_COMM_WORLD, &req);
    double give_up = now_s() + WAIT_S;
    while (!done && now_s() < give_up) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        struct timespec tick = {0, 10000000};
        nanosleep(&tick, NULL);
    }
    if (!done) {
        printf("world-peer-missing: FAIL rank 1: rank 0 did not return from its sympool call "
               "within %.0f s\n",
               WAIT_S);
        fflush(stdout);
        MPI_Cancel(&req);
        MPI_Request_free(&req);
    }
    MPI_Finalize(); /* releases a rank 0 that waits for it in MPI_Finalize */
    if (done)
        printf("world-peer-missing: ok rank 1\n");
    fflush(stdout);
    return !done;
}

int main(int argc, char **argv) {
    int rank = launcher_rank();
    bool init_mode = argc > 1 && strcmp(argv[1], "init") == 0;
    if (rank < 0 || argc < 2 || (!init_mode && strcmp(argv[1], "finalize") != 0)) {
        printf("world-peer-missing: FAIL: usage: world_peer_missing init|finalize under mpirun "
               "-np 2\n");
        return 2;
    }
    if (init_mode) {
        if (rank != 0) {
            MPI_Init(&argc, &argv);
            return absentee();
        }
        sp_world_t *w = NULL;
        return waiter("sp_world_init", sp_world_init(&argc, &argv, &w));
    }
    sp_world_t *w = NULL;
    sp_status_t st = sp_world_init(&argc, &argv, &w);
    if (st != SP_SUCCESS) {
        printf("world-peer-missing: FAIL rank %d: sp_world_init -> %s (%s)\n", rank,
               sp_status_name(st), sp_last_error());
        return 1;
    }
    if (rank != 0)
        return absentee(); /* its world stays live: MPI_Finalize first is the user's choice */
    return waiter("sp_world_finalize", sp_world_finalize(w));
}
