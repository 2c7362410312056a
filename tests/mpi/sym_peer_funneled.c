/*
 * sym_peer_funneled.c: sp_symmetric_peer_ptr, "local, thread-safe" (symmetric.h), from a thread
 * other than MPI's main thread, with MPI initialized at MPI_THREAD_FUNNELED as a user may do
 * (mpi4py's rc.thread_level, a C program's MPI_Init_thread). At that level only the main thread
 * may call MPI (MPI-3.1 12.4.3), so the call must not enter MPI: the mpi registrar asked
 * MPI_Win_shared_query for the peer's part at every call. This program interposes that MPI call
 * (MPI's profiling interface: PMPI_Win_shared_query does the work) and counts calls made off the
 * main thread.
 *
 * Every rank prints "sym-peer-funneled: ok rank R" or "sym-peer-funneled: FAIL ..."; the ctest
 * registration (tests/cmake/symmetric.cmake) matches those lines.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <sympool/sympool.h>
#include <sympool/symmetric.h>

static pthread_t g_main;
static int g_off_main; /* MPI_Win_shared_query calls from another thread (read after join) */

int MPI_Win_shared_query(MPI_Win win, int rank, MPI_Aint *size, int *disp_unit, void *baseptr) {
    if (!pthread_equal(pthread_self(), g_main))
        __atomic_fetch_add(&g_off_main, 1, __ATOMIC_RELAXED);
    return PMPI_Win_shared_query(win, rank, size, disp_unit, baseptr);
}

typedef struct {
    void *mine;      /* this rank's symmetric buffer */
    int peer;        /* the rank whose part is asked for */
    sp_status_t st;  /* sp_symmetric_peer_ptr's */
    void *peer_ptr;  /* its answer */
    char error[256]; /* sp_last_error() on failure (per thread) */
} job_t;

static void *worker(void *arg) {
    job_t *j = arg;
    j->st = sp_symmetric_peer_ptr(j->mine, j->peer, &j->peer_ptr);
    if (j->st != SP_SUCCESS)
        snprintf(j->error, sizeof j->error, "%s", sp_last_error());
    return NULL;
}

int main(int argc, char **argv) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    g_main = pthread_self();
    int rank = 0, n = 0, failures = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    sp_world_t *w = NULL;
    sp_mempool_t *pool = NULL;
    int *buf = NULL;
    if (sp_world_from_comm(MPI_COMM_WORLD, &w) != SP_SUCCESS ||
        sp_symmetric_mempool_create(w, NULL, &pool) != SP_SUCCESS ||
        sp_symmetric_malloc(pool, 4096, NULL, (void **)&buf) != SP_SUCCESS) {
        printf("sym-peer-funneled: FAIL rank %d: set-up (%s)\n", rank, sp_last_error());
        return 1;
    }
    buf[0] = 1000 + rank;
    MPI_Barrier(MPI_COMM_WORLD); /* every rank's value is written */
    job_t job = {.mine = buf, .peer = (rank + 1) % n};
    pthread_t t;
    if (pthread_create(&t, NULL, worker, &job) != 0 || pthread_join(t, NULL) != 0) {
        printf("sym-peer-funneled: FAIL rank %d: pthread_create\n", rank);
        return 1;
    }
    if (job.st != SP_SUCCESS) {
        printf("sym-peer-funneled: FAIL rank %d: sp_symmetric_peer_ptr -> %s (%s)\n", rank,
               sp_status_name(job.st), job.error);
        failures++;
    } else if (*(int *)job.peer_ptr != 1000 + job.peer) {
        printf("sym-peer-funneled: FAIL rank %d: rank %d's value reads %d\n", rank, job.peer,
               *(int *)job.peer_ptr);
        failures++;
    }
    int off = __atomic_load_n(&g_off_main, __ATOMIC_RELAXED);
    if (off) {
        printf("sym-peer-funneled: FAIL rank %d: %d MPI call(s) from a thread other than the "
               "main one under MPI_THREAD_FUNNELED (provided %d)\n",
               rank, off, provided);
        failures++;
    }
    MPI_Barrier(MPI_COMM_WORLD); /* no rank reads a peer's part after it is released */
    if (sp_free(buf) != SP_SUCCESS || sp_symmetric_mempool_destroy(pool) != SP_SUCCESS ||
        sp_world_finalize(w) != SP_SUCCESS) {
        printf("sym-peer-funneled: FAIL rank %d: tear-down (%s)\n", rank, sp_last_error());
        failures++;
    }
    MPI_Finalize();
    if (!failures)
        printf("sym-peer-funneled: ok rank %d\n", rank);
    fflush(stdout);
    return failures != 0;
}
