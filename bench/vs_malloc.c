/*
 * vs_malloc.c: the per-call cost of sp_malloc + sp_free on the host backend against the system
 * allocators, on the same workloads in the same run: glibc malloc/free (linked), mimalloc
 * (mi_malloc/mi_free) and jemalloc (its malloc/free) loaded with dlopen from libmimalloc.so.2 and
 * libjemalloc.so.2. An allocator that does not load is a `"skipped"` line, so nothing here needs
 * them to build or run. `sympool_tc` is sympool again with SYMPOOL_THREAD_CACHE=64KiB (each
 * thread keeps up to 64 KiB of freed blocks of up to 1 MiB and serves them without the device
 * lock): set with setenv between sp_shutdown and sp_init, as options are read again after a
 * shutdown.
 *
 * Workloads (each allocator runs the same calls through the same function pointers):
 *   pair  SIZE      a cached malloc + free of one size, repeated (512 B, 64 KiB, 2 MiB);
 *   mix             a ring of LIVE blocks: each step frees the oldest block and allocates one of a
 *                   size drawn log-uniform from 512 B to 8 MiB (a seeded sequence, the same for
 *                   every allocator), after a warm-up pass so that every allocator's caches hold;
 *   pair2, mix2     the same from 2 threads at once (each its own block or ring and seed),
 *                   started together at a barrier.
 * The memory is never touched (sympool's memory stands for device memory). Each round runs every
 * allocator once per workload, the order rotating round by round, so that the load of the shared
 * machine hits all alike; a round's ratio is sympool's ns per pair (one malloc + one free) over
 * the baseline's in that round, and every figure reported is the median over the rounds. Threads
 * report wall ns per pair (mean of the threads) and CPU ns (CLOCK_THREAD_CPUTIME_ID), which is
 * what to read when the machine's other load keeps the two threads from running at once.
 * One JSON line per workload:
 *   {"bench":"vs_malloc","workload":"mix","threads":1,"rounds":7,"pairs":..,"sympool_ns":..,
 *    "glibc_ns":..,..,"sympool_over_glibc":..,"sympool_over_mimalloc":..,..}
 * Usage: bench_vs_malloc [rounds [pairs [live]]]        (defaults 7 1000000 256)
 *        bench_vs_malloc one ALLOC WORKLOAD [pairs [live [threads]]]   one warm-up and one timed
 *            run of one allocator (glibc, mimalloc, jemalloc, sympool, sympool_tc), WORKLOAD a
 *            size (pair) or mix, in the main thread (threads 2: two new threads), for callgrind
 *            or perf: the timed loop is timed_loop (--toggle-collect=timed_loop).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sympool/sympool.h"
#include "bench_util.h"

typedef struct allocator {
    const char *name;
    void *(*alloc)(size_t);
    void (*release)(void *);
    int thread_cache; /* sympool_tc: SYMPOOL_THREAD_CACHE on while it runs */
    const char *why;  /* not loaded: why (NULL when usable) */
} allocator_t;

static void *sp_alloc_fn(size_t size) {
    void *p = NULL;
    return sp_malloc(size, 0, NULL, &p) == SP_SUCCESS ? p : NULL;
}

static void sp_release_fn(void *p) {
    sp_free(p);
}

enum { A_SYMPOOL, A_SYMPOOL_TC, A_GLIBC, A_MIMALLOC, A_JEMALLOC, A_COUNT };
static allocator_t g_alloc[A_COUNT] = {
    {"sympool", sp_alloc_fn, sp_release_fn, 0, NULL},
    {"sympool_tc", sp_alloc_fn, sp_release_fn, 1, NULL},
    {"glibc", malloc, free, 0, NULL},
    {"mimalloc", NULL, NULL, 0, "not tried"},
    {"jemalloc", NULL, NULL, 0, "not tried"},
};

static void load(allocator_t *a, const char *lib, const char *alloc_sym, const char *free_sym) {
    static char why[2][256];
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(why[a == &g_alloc[A_JEMALLOC]], sizeof why[0], "%s", dlerror());
        a->why = why[a == &g_alloc[A_JEMALLOC]];
        return;
    }
    /* dlsym on the handle finds the library's own definitions, not glibc's. */
    *(void **)&a->alloc = dlsym(h, alloc_sym);
    *(void **)&a->release = dlsym(h, free_sym);
    a->why = a->alloc && a->release ? NULL : "symbols not found";
}

/* Switches sympool's thread cache on or off (options are read again after sp_shutdown). */
static int g_tc_on;
static int sympool_mode(int tc) {
    if (tc == g_tc_on)
        return 0;
    sp_shutdown();
    if (tc)
        setenv("SYMPOOL_THREAD_CACHE", "64KiB", 1);
    else
        unsetenv("SYMPOOL_THREAD_CACHE");
    g_tc_on = tc;
    return sp_init() == SP_SUCCESS ? 0 : -1;
}

/* ---- the workloads ---------------------------------------------------------------------- */

enum { NSIZES = 1 << 16 }; /* the mix's size sequence, cycled */
static size_t g_sizes[2][NSIZES];

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Log-uniform from 512 B to 8 MiB: 2^(9 + 14u) bytes, u uniform in [0, 1). */
static void make_sizes(size_t *out, uint64_t seed) {
    for (int i = 0; i < NSIZES; i++) {
        double u = (double)(splitmix(&seed) >> 11) / 9007199254740992.0;
        size_t s = (size_t)(512.0 * __builtin_exp2(14.0 * u));
        out[i] = s < 512 ? 512 : s;
    }
}

typedef struct job {
    const allocator_t *a;
    int mix;           /* 0: pair of `size`; 1: the ring */
    size_t size;       /* pair */
    long pairs;        /* timed pairs */
    long live;         /* ring length */
    const size_t *seq; /* ring: size sequence */
    pthread_barrier_t *start;
    double ns, cpu_ns; /* out: per pair */
    int failed;        /* out */
} job_t;

static double thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The timed loop, out of line so that callgrind can count it alone. */
__attribute__((noinline)) int timed_loop(const allocator_t *a, int mix, size_t size, long pairs,
                                         void **ring, long live, const size_t *seq, long *at) {
    void *(*alloc)(size_t) = a->alloc;
    void (*release)(void *) = a->release;
    if (!mix) {
        for (long i = 0; i < pairs; i++) {
            void *p = alloc(size);
            if (p == NULL)
                return -1;
            __asm__ volatile("" : : "r"(p) : "memory"); /* keep the pair from being elided */
            release(p);
        }
        return 0;
    }
    long k = *at;
    for (long i = 0; i < pairs; i++, k++) {
        long slot = k % live;
        release(ring[slot]);
        if ((ring[slot] = alloc(seq[k & (NSIZES - 1)])) == NULL)
            return -1;
    }
    *at = k;
    return 0;
}

static void *run(void *arg) {
    job_t *j = arg;
    const allocator_t *a = j->a;
    void **ring = NULL;
    long at = 0;
    if (j->mix) {
        ring = calloc((size_t)j->live, sizeof *ring);
        for (long i = 0; i < j->live && ring; i++, at++)
            if ((ring[i] = a->alloc(j->seq[at & (NSIZES - 1)])) == NULL)
                j->failed = 1;
        if (ring == NULL)
            j->failed = 1;
    }
    /* Warm-up: the pair's block once; the ring a whole pass of the size sequence. */
    if (!j->failed &&
        timed_loop(a, j->mix, j->size, j->mix ? NSIZES : 1, ring, j->live, j->seq, &at) != 0)
        j->failed = 1;
    if (j->start)
        pthread_barrier_wait(j->start);
    double t0 = bench_now_ns(), c0 = thread_cpu_ns();
    if (!j->failed && timed_loop(a, j->mix, j->size, j->pairs, ring, j->live, j->seq, &at) != 0)
        j->failed = 1;
    j->cpu_ns = (thread_cpu_ns() - c0) / (double)j->pairs;
    j->ns = (bench_now_ns() - t0) / (double)j->pairs;
    for (long i = 0; ring && i < j->live; i++)
        if (ring[i])
            a->release(ring[i]);
    free(ring);
    return NULL;
}

/* One run of workload on a, with `threads` (1: the main thread; 2: two new ones). */
static int measure(const allocator_t *a, int mix, size_t size, int threads, long pairs, long live,
                   double *ns_p, double *cpu_p) {
    if (sympool_mode(a->thread_cache) != 0)
        return -1;
    job_t jobs[2];
    for (int t = 0; t < 2; t++)
        jobs[t] = (job_t){
            .a = a, .mix = mix, .size = size, .pairs = pairs, .live = live, .seq = g_sizes[t]};
    if (threads == 1) {
        run(&jobs[0]);
    } else {
        pthread_barrier_t start;
        pthread_t th[2];
        pthread_barrier_init(&start, NULL, 2);
        for (int t = 0; t < 2; t++) {
            jobs[t].start = &start;
            pthread_create(&th[t], NULL, run, &jobs[t]);
        }
        for (int t = 0; t < 2; t++)
            pthread_join(th[t], NULL);
        pthread_barrier_destroy(&start);
    }
    double ns = 0, cpu = 0;
    for (int t = 0; t < threads; t++) {
        if (jobs[t].failed)
            return -1;
        ns += jobs[t].ns / threads;
        cpu += jobs[t].cpu_ns / threads;
    }
    *ns_p = ns;
    *cpu_p = cpu;
    return 0;
}

/* ---- the report ------------------------------------------------------------------------- */

enum { MAX_ROUNDS = 64 };

typedef struct workload {
    const char *name;
    int mix;
    size_t size;
    int threads;
} workload_t;

static const workload_t g_work[] = {
    {"pair", 0, 512, 1}, {"pair", 0, 64 << 10, 1}, {"pair", 0, 2 << 20, 1},
    {"mix", 1, 0, 1},    {"pair", 0, 512, 2},      {"mix", 1, 0, 2},
};

static int run_workload(const workload_t *w, int rounds, long pairs, long live) {
    static double ns[A_COUNT][MAX_ROUNDS], cpu[A_COUNT][MAX_ROUNDS], ratio[A_COUNT][MAX_ROUNDS];
    static double tc_ratio[A_COUNT][MAX_ROUNDS];
    long n = w->mix ? pairs / 4 : pairs; /* a mix pair costs several times a cached one */
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < A_COUNT; k++) {
            int i = (k + r) % A_COUNT;
            if (g_alloc[i].why)
                continue;
            if (measure(&g_alloc[i], w->mix, w->size, w->threads, n, live, &ns[i][r], &cpu[i][r]) !=
                0) {
                fprintf(stderr, "bench_vs_malloc: %s failed on %s: %s\n", g_alloc[i].name, w->name,
                        sp_last_error());
                return -1;
            }
        }
        for (int i = A_GLIBC; i < A_COUNT; i++) {
            ratio[i][r] = g_alloc[i].why ? 0 : ns[A_SYMPOOL][r] / ns[i][r];
            tc_ratio[i][r] = g_alloc[i].why ? 0 : ns[A_SYMPOOL_TC][r] / ns[i][r];
        }
    }
    printf("{\"bench\":\"vs_malloc\",\"backend\":\"%s\",\"workload\":\"%s\",", sp_backend_name(),
           w->mix ? "mix" : "pair");
    if (w->mix)
        printf("\"live\":%ld,\"sizes\":\"log-uniform 512B..8MiB\",", live);
    else
        printf("\"size\":%zu,", w->size);
    printf("\"threads\":%d,\"rounds\":%d,\"pairs\":%ld", w->threads, rounds, n);
    for (int i = 0; i < A_COUNT; i++) {
        if (g_alloc[i].why)
            continue;
        printf(",\"%s_ns\":%.1f", g_alloc[i].name, bench_median(ns[i], rounds));
        if (w->threads > 1)
            printf(",\"%s_cpu_ns\":%.1f", g_alloc[i].name, bench_median(cpu[i], rounds));
    }
    for (int i = A_GLIBC; i < A_COUNT; i++)
        if (!g_alloc[i].why)
            printf(",\"sympool_over_%s\":%.2f", g_alloc[i].name, bench_median(ratio[i], rounds));
    for (int i = A_GLIBC; i < A_COUNT; i++)
        if (!g_alloc[i].why)
            printf(",\"sympool_tc_over_%s\":%.2f", g_alloc[i].name,
                   bench_median(tc_ratio[i], rounds));
    printf("}\n");
    fflush(stdout);
    return 0;
}

static int one(const char *name, const char *work, long pairs, long live, int threads) {
    const allocator_t *a = NULL;
    for (int i = 0; i < A_COUNT; i++)
        if (strcmp(g_alloc[i].name, name) == 0)
            a = &g_alloc[i];
    if (a == NULL || a->why) {
        fprintf(stderr, "bench_vs_malloc: %s: %s\n", name, a ? a->why : "unknown allocator");
        return 1;
    }
    int mix = strcmp(work, "mix") == 0;
    size_t size = mix ? 0 : (size_t)strtoull(work, NULL, 0);
    double ns, cpu;
    if (measure(a, mix, size, threads, pairs, live, &ns, &cpu) != 0)
        return 1;
    printf("{\"bench\":\"vs_malloc_one\",\"allocator\":\"%s\",\"workload\":\"%s\",\"threads\":%d,"
           "\"pairs\":%ld,\"ns\":%.1f,\"cpu_ns\":%.1f}\n",
           name, mix ? "mix" : "pair", threads, pairs, ns, cpu);
    return 0;
}

int main(int argc, char **argv) {
    load(&g_alloc[A_MIMALLOC], "libmimalloc.so.2", "mi_malloc", "mi_free");
    load(&g_alloc[A_JEMALLOC], "libjemalloc.so.2", "malloc", "free");
    make_sizes(g_sizes[0], 1);
    make_sizes(g_sizes[1], 2);
    if (sp_init() != SP_SUCCESS) {
        fprintf(stderr, "bench_vs_malloc: sp_init: %s\n", sp_last_error());
        return 1;
    }
    int rc = 0;
    if (argc > 3 && strcmp(argv[1], "one") == 0) {
        rc = one(argv[2], argv[3], argc > 4 ? atol(argv[4]) : 1000000,
                 argc > 5 ? atol(argv[5]) : 256, argc > 6 && atoi(argv[6]) == 2 ? 2 : 1);
    } else {
        int rounds = argc > 1 ? atoi(argv[1]) : 7;
        long pairs = argc > 2 ? atol(argv[2]) : 1000000, live = argc > 3 ? atol(argv[3]) : 256;
        rounds = rounds < 1 ? 1 : rounds > MAX_ROUNDS ? MAX_ROUNDS : rounds;
        pairs = pairs < 4 ? 4 : pairs;
        live = live < 1 ? 1 : live;
        for (int i = 0; i < A_COUNT; i++)
            if (g_alloc[i].why)
                printf("{\"bench\":\"vs_malloc\",\"allocator\":\"%s\",\"skipped\":\"%s\"}\n",
                       g_alloc[i].name, g_alloc[i].why);
        for (size_t w = 0; w < sizeof g_work / sizeof g_work[0] && rc == 0; w++)
            rc = run_workload(&g_work[w], rounds, pairs, live);
    }
    sympool_mode(0);
    sp_shutdown();
    return rc;
}
