/*
 * alloc.c: the cost of a cached sp_malloc + sp_free pair on the host backend, on 1 and 2
 * threads, for 512 B, 64 KiB and 4 MiB, next to glibc malloc + free of the same sizes measured in
 * the same run. One JSON line per case: {"bench":"alloc","size":...,"threads":...,
 * "ns_per_pair":...,"glibc_ns_per_pair":...,"ratio_to_glibc":...}.
 *
 * Each thread warms its block once (so the segment exists) and then times N pairs; the figure
 * is the mean over all threads' pairs. Usage: bench_alloc [pairs_per_thread [size threads]]
 * (with size and threads, only that case runs: handy under perf; threads 0 runs it in the main
 * thread of a process that has no other, threads m in the main thread while another thread
 * exists and waits, as an mpirun rank's main thread beside the MPI library's threads; 1 in a
 * thread of its own, the only one that allocates: all three hold the device lock's bias, which
 * goes to its first taker, core/core_lock.h; r as 1 after the main thread took the lock once, so
 * that the thread revokes the bias and takes the CAS path, as 2 threads do, until a streak of
 * its CAS takes re-biases the lock to it: the first 512 of its pairs).
 * Phases: bench_alloc PAIRS SIZE p PHASE: two threads take turns, PHASE pairs each (a forward
 * pass on one thread, the backward pass on another, as PyTorch's autograd engine runs it), PAIRS
 * pairs in all, the one waiting asleep (P: spinning, as a polling thread does); one line, ns per
 * pair inside the phases (the handoffs not timed), glibc's the same way.
 */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "sympool/sympool.h"
#include "bench_util.h"

static long g_pairs = 2000000;

typedef struct job {
    size_t size;   /* bytes per allocation */
    int use_glibc; /* 1: malloc/free; 0: sp_malloc/sp_free */
    double ns;     /* out: ns per pair */
    int failed;    /* out: a call failed */
} job_t;

static void *run(void *arg) {
    job_t *j = arg;
    void *p = NULL;
    if (j->use_glibc) {
        free(malloc(j->size));
        double t0 = bench_now_ns();
        for (long i = 0; i < g_pairs; i++) {
            p = malloc(j->size);
            __asm__ volatile("" : : "r"(p) : "memory"); /* keep the pair from being elided */
            free(p);
        }
        j->ns = (bench_now_ns() - t0) / (double)g_pairs;
        return NULL;
    }
    if (sp_malloc(j->size, 0, NULL, &p) != SP_SUCCESS || sp_free(p) != SP_SUCCESS) {
        j->failed = 1;
        return NULL;
    }
    double t0 = bench_now_ns();
    for (long i = 0; i < g_pairs; i++) {
        if (sp_malloc(j->size, 0, NULL, &p) != SP_SUCCESS) {
            j->failed = 1;
            return NULL;
        }
        sp_free(p);
    }
    j->ns = (bench_now_ns() - t0) / (double)g_pairs;
    return NULL;
}

/* The phases case: the thread whose turn it is does a phase of pairs, timing it, then wakes the
 * other and sleeps until its next turn (a thread that waits for the other's phase sleeps, as the
 * main thread does while PyTorch's autograd thread runs the backward pass). The handoffs are not
 * timed: the figure is the pairs' own cost, revocations and re-biases included. */
typedef struct phases {
    size_t size;
    long phase, phases; /* pairs a phase; phases in all */
    int use_glibc;
    sem_t go[2];       /* whose turn it is (spin 0) */
    int spin;          /* the waiting thread spins on turn instead of sleeping */
    _Atomic long turn; /* the phase under way (spin 1) */
    double ns[2];      /* each thread's time inside its phases */
    int failed;
} phases_t;

typedef struct {
    phases_t *ph;
    int id; /* 0 or 1: takes the even or the odd phases */
} phase_arg_t;

static void *phase_worker(void *arg) {
    phase_arg_t *a = arg;
    phases_t *ph = a->ph;
    for (long t = a->id; t < ph->phases; t += 2) {
        if (ph->spin)
            while (ph->turn != t) {
            }
        else
            sem_wait(&ph->go[a->id]);
        double t0 = bench_now_ns();
        for (long i = 0; i < ph->phase; i++) {
            void *p = NULL;
            if (ph->use_glibc) {
                p = malloc(ph->size);
                __asm__ volatile("" : : "r"(p) : "memory");
                free(p);
            } else if (sp_malloc(ph->size, 0, NULL, &p) != SP_SUCCESS || sp_free(p) != SP_SUCCESS) {
                ph->failed = 1;
            }
        }
        ph->ns[a->id] += bench_now_ns() - t0;
        if (ph->spin)
            ph->turn = t + 1;
        else
            sem_post(&ph->go[!a->id]);
    }
    return NULL;
}

static double measure_phases(size_t size, long phase, int glibc, int spin, int *failed) {
    phases_t ph = {
        .size = size, .phase = phase, .phases = g_pairs / phase, .use_glibc = glibc, .spin = spin};
    phase_arg_t args[2] = {{&ph, 0}, {&ph, 1}};
    pthread_t th[2];
    void *p = NULL;
    if (!glibc && (sp_malloc(size, 0, NULL, &p) != SP_SUCCESS || sp_free(p) != SP_SUCCESS))
        *failed = 1; /* the segment, made before the clock starts */
    sem_init(&ph.go[0], 0, 1);
    sem_init(&ph.go[1], 0, 0);
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, phase_worker, &args[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    sem_destroy(&ph.go[0]);
    sem_destroy(&ph.go[1]);
    *failed |= ph.failed;
    return (ph.ns[0] + ph.ns[1]) / (double)(ph.phases * phase);
}

/* The waiting thread of the "m" case: it does nothing until the pipe says so. */
static int g_park[2];
static void *parked(void *arg) {
    char c;
    ssize_t got = read(g_park[0], &c, 1);
    (void)arg;
    (void)got;
    return NULL;
}

static double measure(size_t size, int threads, int glibc, int *failed) {
    pthread_t th[2];
    job_t jobs[2] = {{size, glibc, 0, 0}, {size, glibc, 0, 0}};
    if (threads == 0) { /* the main thread, before the process has any other */
        run(&jobs[0]);
        *failed |= jobs[0].failed;
        return jobs[0].ns;
    }
    for (int t = 0; t < threads; t++)
        pthread_create(&th[t], NULL, run, &jobs[t]);
    double sum = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        sum += jobs[t].ns;
        *failed |= jobs[t].failed;
    }
    return sum / threads;
}

int main(int argc, char **argv) {
    if (argc > 1)
        g_pairs = atol(argv[1]);
    if (g_pairs <= 0)
        g_pairs = 1;
    if (sp_init() != SP_SUCCESS) {
        fprintf(stderr, "bench_alloc: sp_init: %s\n", sp_last_error());
        return 1;
    }
    if (argc > 4 && (argv[3][0] == 'p' || argv[3][0] == 'P')) {
        int spin = argv[3][0] == 'P';
        long phase = atol(argv[4]);
        size_t size = (size_t)atol(argv[2]);
        int failed = 0;
        if (phase <= 0 || phase > g_pairs)
            phase = g_pairs;
        double sp = measure_phases(size, phase, 0, spin, &failed);
        double gl = measure_phases(size, phase, 1, spin, &failed);
        printf("{\"bench\":\"alloc\",\"backend\":\"%s\",\"size\":%zu,\"threads\":2,"
               "\"pairs_per_phase\":%ld,\"waiter\":\"%s\",\"pairs\":%ld,\"ns_per_pair\":%.1f,"
               "\"glibc_ns_per_pair\":%.1f,\"ratio_to_glibc\":%.2f}\n",
               sp_backend_name(), size, phase, spin ? "spins" : "sleeps", g_pairs / phase * phase,
               sp, gl, gl > 0 ? sp / gl : 0.0);
        if (failed)
            fprintf(stderr, "bench_alloc: a call failed: %s\n", sp_last_error());
        sp_shutdown();
        return failed ? 1 : 0;
    }
    size_t sizes[] = {512, 64 * 1024, 4 * 1024 * 1024};
    int nsizes = 3, tmin = 1, tmax = 2;
    if (argc > 3) {
        sizes[0] = (size_t)atol(argv[2]);
        nsizes = 1;
        int t = atoi(argv[3]);
        tmin = tmax = t == 2 ? 2 : t == 0 && argv[3][0] != 'r' ? 0 : 1;
        if (argv[3][0] == 'r') { /* the main thread takes the device lock first: its owner */
            void *p = NULL;
            if (sp_malloc(sizes[0], 0, NULL, &p) != SP_SUCCESS || sp_free(p) != SP_SUCCESS)
                return 1;
        }
    }
    pthread_t waiter;
    int main_mt = argc > 3 && argv[3][0] == 'm';
    int revoked = argc > 3 && argv[3][0] == 'r';
    if (main_mt && (pipe(g_park) != 0 || pthread_create(&waiter, NULL, parked, NULL) != 0)) {
        fprintf(stderr, "bench_alloc: cannot start the waiting thread\n");
        return 1;
    }
    int failed = 0;
    for (int threads = tmin; threads <= tmax; threads++) {
        for (int s = 0; s < nsizes; s++) {
            double sp = measure(sizes[s], threads, 0, &failed);
            double gl = measure(sizes[s], threads, 1, &failed);
            printf("{\"bench\":\"alloc\",\"backend\":\"%s\",\"size\":%zu,\"threads\":%d,%s"
                   "\"pairs_per_thread\":%ld,\"ns_per_pair\":%.1f,\"glibc_ns_per_pair\":%.1f,"
                   "\"ratio_to_glibc\":%.2f}\n",
                   sp_backend_name(), sizes[s], threads,
                   main_mt   ? "\"main_of_multi_threaded_process\":true,"
                   : revoked ? "\"after_the_main_threads_call\":true,"
                             : "",
                   g_pairs, sp, gl, gl > 0 ? sp / gl : 0.0);
        }
    }
    if (main_mt && (write(g_park[1], "", 1) != 1 || pthread_join(waiter, NULL) != 0))
        failed = 1;
    if (failed)
        fprintf(stderr, "bench_alloc: a call failed: %s\n", sp_last_error());
    sp_shutdown();
    return failed ? 1 : 0;
}
