/*
 * alloc_scale.c: how the cached malloc + free pair scales, on the host backend, one JSON line per
 * case, every figure a bench_median over interleaved rounds of the same run:
 *
 *   {"bench":"alloc_scale","case":"pair_single_threaded_process",...}  the same in the main
 *                                                  thread of a process with no other thread yet
 *   {"bench":"alloc_scale","case":"pair_main_thread",...}  the same in the main thread while
 *                                                  another thread exists and waits: an mpirun
 *                                                  rank's main thread beside the MPI library's
 *                                                  threads (sp_init's thread, which the device
 *                                                  locks are biased to: core/core_lock.h)
 *   {"bench":"alloc_scale","case":"pair",...}      one thread, 512 B: ns per pair next to glibc's
 *                                                  (a second thread of the process: the process
 *                                                  is multi-threaded, as a training job is, and
 *                                                  the thread is not sp_init's, so the lock's
 *                                                  bias is revoked and it takes the CAS until
 *                                                  a streak re-biases the lock to it)
 *   {"bench":"alloc_scale","case":"threads",...}   two threads on one device: per-thread ns per
 *                                                  pair over one thread's (the rounds alternate)
 *   {"bench":"alloc_scale","case":"thread_cache",...}  the same per-thread figures for 1 and 2
 *                                                  threads with SYMPOOL_THREAD_CACHE off and on
 *                                                  (a fresh allocator each; the rounds alternate
 *                                                  which goes first), wall-clock and the
 *                                                  threads' CPU time (cpu_*: not inflated when
 *                                                  the two threads take turns on a loaded core)
 *   {"bench":"alloc_scale","case":"free_set",...}  the same pair with N free blocks in the set
 *                                                  over the pair with only the warm block's
 *                                                  segment (the rounds alternate: fill, measure,
 *                                                  empty, measure)
 *   {"bench":"alloc_scale","case":"metadata",...}  host bytes per live 512-byte block: malloc's
 *                                                  (mallinfo2: in-use heap and mmapped chunks,
 *                                                  the pointer map among them) plus the struct
 *                                                  arena's usable bytes (sp_x_struct_bytes:
 *                                                  block and segment structs live outside
 *                                                  malloc), both as deltas over the allocation
 *                                                  of the blocks; also each part alone
 *
 * Usage: bench_alloc_scale [rounds [free_blocks [pairs]]] (defaults 7, 1000000, 1000000);
 * free_blocks 1 skips most of the metadata and free_set work (the thread figures alone).
 * SYMPOOL_HOST_CAPACITY must allow free_blocks * 1.5 KiB (the default host capacity does).
 */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "sympool/experimental.h"
#include "sympool/sympool.h"
#include "bench_util.h"

static long g_pairs = 1000000;

static void die(const char *what) {
    fprintf(stderr, "bench_alloc_scale: %s: %s\n", what, sp_last_error());
    exit(1);
}

typedef struct job {
    int glibc;
    double ns;  /* wall-clock ns per pair */
    double cpu; /* the thread's CPU ns per pair */
} job_t;

/* The calling thread's CPU time: on a loaded machine two threads that take turns on a core cost
 * each other wall-clock time but no CPU time, while two that contend for a cache line stall on
 * the CPU and pay in both. */
static double thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double g_last_cpu; /* run_pairs' CPU ns per pair per thread */

static void *pairs(void *arg) {
    job_t *j = arg;
    void *p = NULL;
    if (j->glibc) {
        free(malloc(512));
        double t0 = bench_now_ns();
        for (long i = 0; i < g_pairs; i++) {
            p = malloc(512);
            __asm__ volatile("" : : "r"(p) : "memory");
            free(p);
        }
        j->ns = (bench_now_ns() - t0) / (double)g_pairs;
        return NULL;
    }
    if (sp_malloc(512, 0, NULL, &p) != SP_SUCCESS || sp_free(p) != SP_SUCCESS)
        die("sp_malloc");
    double c0 = thread_cpu_ns();
    double t0 = bench_now_ns();
    for (long i = 0; i < g_pairs; i++) {
        if (sp_malloc(512, 0, NULL, &p) != SP_SUCCESS)
            die("sp_malloc");
        sp_free(p);
    }
    j->ns = (bench_now_ns() - t0) / (double)g_pairs;
    j->cpu = (thread_cpu_ns() - c0) / (double)g_pairs;
    return NULL;
}

/* The waiting thread of the pair_main_thread case: it does nothing until its pipe says so. */
static void *parked(void *arg) {
    char c;
    ssize_t got = read(*(int *)arg, &c, 1);
    (void)got;
    return NULL;
}

/* ns per pair per thread, averaged over `threads` threads running at once (the CPU ns the same
 * way in g_last_cpu). */
static double run_pairs(int threads, int glibc) {
    pthread_t th[2];
    job_t jobs[2] = {{glibc, 0, 0}, {glibc, 0, 0}};
    for (int t = 0; t < threads; t++)
        pthread_create(&th[t], NULL, pairs, &jobs[t]);
    double sum = 0, cpu = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        sum += jobs[t].ns;
        cpu += jobs[t].cpu;
    }
    g_last_cpu = cpu / threads;
    return sum / threads;
}

/* One line of a pair case: the medians of sympool's and glibc's ns per pair and of their ratio. */
static void print_pair(const char *name, const char *be, int rounds, double *sp, double *gl,
                       double *ratio) {
    printf("{\"bench\":\"alloc_scale\",\"case\":\"%s\",\"backend\":\"%s\",\"size\":512,"
           "\"rounds\":%d,\"pairs\":%ld,\"ns_per_pair\":%.2f,\"glibc_ns_per_pair\":%.2f,"
           "\"ratio_to_glibc\":%.2f}\n",
           name, be, rounds, g_pairs, bench_median(sp, rounds), bench_median(gl, rounds),
           bench_median(ratio, rounds));
}

/* A pair case in the calling (main) thread: rounds alternating which of sympool and glibc goes
 * first, then its line. */
static void main_thread_pair(const char *name, const char *be, int rounds) {
    double sp_ns[64], gl_ns[64], ratio[64];
    for (int r = 0; r < rounds; r++) {
        job_t sp = {0, 0, 0}, gl = {1, 0, 0};
        if (r % 2) {
            pairs(&gl);
            pairs(&sp);
        } else {
            pairs(&sp);
            pairs(&gl);
        }
        sp_ns[r] = sp.ns;
        gl_ns[r] = gl.ns;
        ratio[r] = sp.ns / gl.ns;
    }
    print_pair(name, be, rounds, sp_ns, gl_ns, ratio);
    fflush(stdout);
}

/* The idle bytes per thread the thread_cache case turns the cache on with. */
#define CACHE_LIMIT "64KiB"

/* A fresh allocator with SYMPOOL_THREAD_CACHE at `limit` (NULL: the default, off). */
static void cache_config(const char *limit) {
    if (sp_shutdown() != SP_SUCCESS)
        die("sp_shutdown");
    if (sp_x_option_set("SYMPOOL_THREAD_CACHE", limit) != SP_SUCCESS)
        die("sp_x_option_set");
    if (sp_init() != SP_SUCCESS)
        die("sp_init");
}

/* n free blocks of 1 KiB, each between two live 512-byte blocks (so none merges), in the
 * default pool's small free set; *keep_p and *drop_p get the live blocks to free afterwards. */
static void fill(long n, void ***keep_p) {
    void **keep = malloc((size_t)n * sizeof *keep), **drop = malloc((size_t)n * sizeof *drop);
    if (!keep || !drop)
        die("out of host memory");
    for (long i = 0; i < n; i++)
        if (sp_malloc(1024, 0, NULL, &drop[i]) != SP_SUCCESS ||
            sp_malloc(512, 0, NULL, &keep[i]) != SP_SUCCESS)
            die("fill");
    for (long i = 0; i < n; i++)
        sp_free(drop[i]);
    free(drop);
    *keep_p = keep;
}

static void unfill(long n, void **keep) {
    for (long i = 0; i < n; i++)
        sp_free(keep[i]);
    free(keep);
    if (sp_empty_cache() != SP_SUCCESS)
        die("sp_empty_cache");
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    long nfree = argc > 2 ? atol(argv[2]) : 1000000;
    if (argc > 3)
        g_pairs = atol(argv[3]);
    if (rounds < 1 || rounds > 64)
        rounds = 7;
    if (nfree < 1)
        nfree = 1;
    if (g_pairs < 1)
        g_pairs = 1;
    if (sp_init() != SP_SUCCESS)
        die("sp_init");
    const char *be = sp_backend_name();

    /* Host heap per live block, first, while no block struct is recycled: the array of pointers
     * is allocated before the first reading. */
    long nlive = nfree;
    void **live = malloc((size_t)nlive * sizeof *live);
    if (!live)
        die("out of host memory");
    struct mallinfo2 m0 = mallinfo2();
    size_t s0 = sp_x_struct_bytes();
    for (long i = 0; i < nlive; i++)
        if (sp_malloc(512, 0, NULL, &live[i]) != SP_SUCCESS)
            die("sp_malloc");
    struct mallinfo2 m1 = mallinfo2();
    size_t s1 = sp_x_struct_bytes();
    double heap =
        ((double)(m1.uordblks + m1.hblkhd) - (double)(m0.uordblks + m0.hblkhd)) / (double)nlive;
    double structs = ((double)s1 - (double)s0) / (double)nlive;
    printf("{\"bench\":\"alloc_scale\",\"case\":\"metadata\",\"backend\":\"%s\",\"size\":512,"
           "\"live_blocks\":%ld,\"host_bytes_per_block\":%.1f,\"malloc_bytes_per_block\":%.1f,"
           "\"struct_bytes_per_block\":%.1f}\n",
           be, nlive, heap + structs, heap, structs);
    for (long i = 0; i < nlive; i++)
        sp_free(live[i]);
    free(live);
    if (sp_empty_cache() != SP_SUCCESS)
        die("sp_empty_cache");

    /* The pair in the main thread while the process has no other thread (before the first
     * pthread_create below, for glibc as for us): a single-threaded program's or the replay
     * CLI's case, where the device lock makes no locked instruction (core/core_lock.h). */
    main_thread_pair("pair_single_threaded_process", be, rounds);

    /* The same in the main thread while another thread waits on a pipe (the process is
     * multi-threaded; the locks stay biased to this thread, which took them first). */
    int park[2];
    pthread_t waiter;
    if (pipe(park) != 0 || pthread_create(&waiter, NULL, parked, &park[0]) != 0)
        die("the waiting thread");
    main_thread_pair("pair_main_thread", be, rounds);
    if (write(park[1], "", 1) != 1 || pthread_join(waiter, NULL) != 0)
        die("the waiting thread's end");

    double sp1[64], gl1[64], sp2[64], r_gl[64], r_thr[64], empty[64], full[64], r_set[64];
    for (int r = 0; r < rounds; r++) {
        /* Alternate the order so that neither side always runs first. */
        if (r % 2) {
            gl1[r] = run_pairs(1, 1);
            sp1[r] = run_pairs(1, 0);
            sp2[r] = run_pairs(2, 0);
        } else {
            sp2[r] = run_pairs(2, 0);
            sp1[r] = run_pairs(1, 0);
            gl1[r] = run_pairs(1, 1);
        }
        r_gl[r] = sp1[r] / gl1[r];
        r_thr[r] = sp2[r] / sp1[r];
    }
    print_pair("pair", be, rounds, sp1, gl1, r_gl);
    printf("{\"bench\":\"alloc_scale\",\"case\":\"threads\",\"backend\":\"%s\",\"size\":512,"
           "\"rounds\":%d,\"pairs\":%ld,\"ns_1_thread\":%.2f,\"ns_per_thread_2_threads\":%.2f,"
           "\"ratio\":%.2f}\n",
           be, rounds, g_pairs, bench_median(sp1, rounds), bench_median(sp2, rounds),
           bench_median(r_thr, rounds));
    fflush(stdout);

    /* [0] wall-clock, [1] CPU time; per thread, ns per pair. */
    double off1[2][64], off2[2][64], on1[2][64], on2[2][64], r_off[2][64], r_on[2][64];
    double r_on_off[64];
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 2; k++) {
            int on = k ^ (r % 2);
            cache_config(on ? CACHE_LIMIT : NULL);
            double(*one)[64] = on ? on1 : off1, (*two)[64] = on ? on2 : off2;
            for (int step = 0; step < 2; step++) {
                if ((step == 0) == (r % 2 == 1)) {
                    one[0][r] = run_pairs(1, 0);
                    one[1][r] = g_last_cpu;
                } else {
                    two[0][r] = run_pairs(2, 0);
                    two[1][r] = g_last_cpu;
                }
            }
        }
        for (int c = 0; c < 2; c++) {
            r_off[c][r] = off2[c][r] / off1[c][r];
            r_on[c][r] = on2[c][r] / on1[c][r];
        }
        r_on_off[r] = on1[0][r] / off1[0][r];
    }
    cache_config(NULL);
    printf("{\"bench\":\"alloc_scale\",\"case\":\"thread_cache\",\"backend\":\"%s\","
           "\"size\":512,\"rounds\":%d,\"pairs\":%ld,\"limit\":\"%s\","
           "\"ns_1_thread_off\":%.2f,\"ns_per_thread_2_threads_off\":%.2f,\"ratio_off\":%.2f,"
           "\"ns_1_thread_on\":%.2f,\"ns_per_thread_2_threads_on\":%.2f,\"ratio_on\":%.2f,"
           "\"on_over_off_1_thread\":%.2f,\"cpu_ns_1_thread_off\":%.2f,"
           "\"cpu_ns_per_thread_2_threads_off\":%.2f,\"cpu_ratio_off\":%.2f,"
           "\"cpu_ns_1_thread_on\":%.2f,\"cpu_ns_per_thread_2_threads_on\":%.2f,"
           "\"cpu_ratio_on\":%.2f}\n",
           be, rounds, g_pairs, CACHE_LIMIT, bench_median(off1[0], rounds),
           bench_median(off2[0], rounds), bench_median(r_off[0], rounds),
           bench_median(on1[0], rounds), bench_median(on2[0], rounds),
           bench_median(r_on[0], rounds), bench_median(r_on_off, rounds),
           bench_median(off1[1], rounds), bench_median(off2[1], rounds),
           bench_median(r_off[1], rounds), bench_median(on1[1], rounds),
           bench_median(on2[1], rounds), bench_median(r_on[1], rounds));
    fflush(stdout);

    for (int r = 0; r < rounds; r++) {
        empty[r] = run_pairs(1, 0);
        void **keep = NULL;
        fill(nfree, &keep);
        full[r] = run_pairs(1, 0);
        unfill(nfree, keep);
        r_set[r] = full[r] / empty[r];
    }
    printf("{\"bench\":\"alloc_scale\",\"case\":\"free_set\",\"backend\":\"%s\",\"size\":512,"
           "\"rounds\":%d,\"pairs\":%ld,\"free_blocks\":%ld,\"ns_empty_set\":%.2f,"
           "\"ns_full_set\":%.2f,\"ratio\":%.2f}\n",
           be, rounds, g_pairs, nfree, bench_median(empty, rounds), bench_median(full, rounds),
           bench_median(r_set, rounds));
    fflush(stdout);

    sp_shutdown();
    return 0;
}
