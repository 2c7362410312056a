/*
 * world_fork.c: fork() while another thread is inside a symmetric pool call (host backend, one
 * rank). That thread holds the pool's lock, which a call keeps across its rounds with the other
 * ranks, so no fork handler may wait for it; it was inherited held, and the child's next call on
 * the pool waited for it forever. MPI and NCCL communicators do not survive fork() either, so
 * the child of a process that used a world refuses every world, symmetric and collective call
 * with SP_ERR_INVALID_USAGE saying so, before it takes any of their locks; its plain allocator
 * still works.
 *
 * The thread is held inside sp_symmetric_malloc deterministically: the history frames hook,
 * which runs on the allocating thread under the pool's lock (before the allocator's), waits there
 * until the fork is done. Each child step runs under alarm(): a child that hangs dies of SIGALRM
 * and the test fails instead of hanging.
 *
 * Prints "world-fork: ok" or "world-fork: FAIL ..."; the ctest registration
 * (tests/cmake/symmetric.cmake) matches those lines.
 */
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sympool/collectives.h>
#include <sympool/history.h>
#include <sympool/sympool.h>
#include <sympool/symmetric.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static pthread_t holder;
static int inside;  /* mu: the holder is inside the frames hook */
static int forked;  /* mu: the fork is done, the hook may return */
static int holding; /* mu: the hook holds only the holder's first call */

static size_t hold_hook(sp_history_frame_t *frames, size_t max_frames, void *arg) {
    (void)frames, (void)max_frames, (void)arg;
    pthread_mutex_lock(&mu);
    if (holding && pthread_equal(pthread_self(), holder)) {
        holding = 0;
        inside = 1;
        pthread_cond_broadcast(&cv);
        while (!forked)
            pthread_cond_wait(&cv, &mu);
    }
    pthread_mutex_unlock(&mu);
    return 0;
}

static sp_mempool_t *pool;
static void *blk; /* a live block of the pool */
static sp_status_t holder_status;

static void *hold(void *arg) {
    void *p = NULL;
    (void)arg;
    holder_status = sp_symmetric_malloc(pool, 1 << 20, NULL, &p);
    if (holder_status == SP_SUCCESS)
        holder_status = sp_free(p);
    return NULL;
}

/* The child's steps; its exit code says which one failed. */
static int expect_refused(sp_status_t got) {
    return got == SP_ERR_INVALID_USAGE && strstr(sp_last_error(), "fork") != NULL;
}

static int child(sp_world_t *w) {
    void *p = NULL, *peer = NULL;
    int x = 1;
    alarm(20);
    if (!expect_refused(sp_symmetric_malloc(pool, 4096, NULL, &p)))
        return 10;
    if (!expect_refused(sp_symmetric_empty_cache(pool)))
        return 11;
    if (!expect_refused(sp_symmetric_peer_ptr(blk, 0, &peer)))
        return 17;
    if (!expect_refused(sp_allreduce(w, &x, &x, 1, SP_INT32, SP_SUM, NULL)))
        return 12;
    sp_mempool_t *q = NULL;
    if (!expect_refused(sp_symmetric_mempool_create(w, NULL, &q)))
        return 13;
    if (!expect_refused(sp_symmetric_mempool_destroy(pool)))
        return 14;
    if (!expect_refused(sp_world_finalize(w)))
        return 15;
    /* The plain allocator is the child's own (host backend). */
    if (sp_malloc(4096, 0, NULL, &p) != SP_SUCCESS || sp_free(p) != SP_SUCCESS)
        return 16;
    return 0;
}

int main(int argc, char **argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    sp_world_t *w = NULL;
    sp_history_params_t hp;
    sp_history_params_init(&hp);
    if (sp_world_from_comm(MPI_COMM_WORLD, &w) != SP_SUCCESS ||
        sp_symmetric_mempool_create(w, NULL, &pool) != SP_SUCCESS ||
        sp_symmetric_malloc(pool, 4096, NULL, &blk) != SP_SUCCESS ||
        sp_record_memory_history(&hp) != SP_SUCCESS) {
        printf("world-fork: FAIL set-up (%s)\n", sp_last_error());
        return 1;
    }
    sp_history_set_frames_hook(hold_hook, NULL);
    pthread_mutex_lock(&mu);
    holding = 1;
    pthread_create(&holder, NULL, hold, NULL);
    while (!inside)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);

    pid_t pid = fork();
    if (pid == 0)
        _exit(child(w));
    pthread_mutex_lock(&mu);
    forked = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(holder, NULL);
    sp_history_set_frames_hook(NULL, NULL);

    int failures = 0, status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
        printf("world-fork: FAIL fork or waitpid\n");
        failures++;
    } else if (WIFSIGNALED(status)) {
        printf("world-fork: FAIL the child hung (killed by signal %d)\n", WTERMSIG(status));
        failures++;
    } else if (WEXITSTATUS(status) != 0) {
        printf("world-fork: FAIL the child's step %d\n", WEXITSTATUS(status));
        failures++;
    }
    if (holder_status != SP_SUCCESS) {
        printf("world-fork: FAIL the parent's held call: %s\n", sp_status_name(holder_status));
        failures++;
    }
    hp.enabled = SP_HISTORY_OFF;
    if (sp_record_memory_history(&hp) != SP_SUCCESS || sp_free(blk) != SP_SUCCESS ||
        sp_symmetric_mempool_destroy(pool) != SP_SUCCESS || sp_world_finalize(w) != SP_SUCCESS) {
        printf("world-fork: FAIL tear-down (%s)\n", sp_last_error());
        failures++;
    }
    if (!failures)
        printf("world-fork: ok\n");
    fflush(stdout);
    MPI_Finalize();
    return failures ? 1 : 0;
}
