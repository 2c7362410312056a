/*
 * python_calls.c: the C side of bench/python_binding.py. Times the two calls the Python binding
 * is measured on, in C: sp_memory_stats(0, &st) and a cached sp_malloc(4096) + sp_free pair, on
 * the default stream. Each figure is the median over R repeats of N calls (ns per call or pair).
 * Prints one JSON line: {"bench":"python_calls_c","memory_stats_ns":...,"malloc_free_ns":...}.
 * Usage: bench_python_calls [N [R]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sympool/sympool.h"
#include "bench_util.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ns per sp_memory_stats call over n calls; a negative value on failure. */
static double time_stats(long n) {
    sp_stats_t st;
    double t0 = bench_now_ns();
    for (long i = 0; i < n; i++)
        if (sp_memory_stats(0, &st) != SP_SUCCESS)
            return -1;
    return (bench_now_ns() - t0) / (double)n;
}

/* ns per cached sp_malloc + sp_free pair of 4096 bytes over n pairs. */
static double time_pairs(long n) {
    void *p = NULL;
    double t0 = bench_now_ns();
    for (long i = 0; i < n; i++) {
        if (sp_malloc(4096, 0, NULL, &p) != SP_SUCCESS || sp_free(p) != SP_SUCCESS)
            return -1;
    }
    return (bench_now_ns() - t0) / (double)n;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000;
    int r = argc > 2 ? atoi(argv[2]) : 15;
    if (n <= 0 || r <= 0 || r > 1000) {
        fprintf(stderr, "usage: bench_python_calls [N>0 [R in 1..1000]]\n");
        return 2;
    }
    double *stats = calloc((size_t)r, sizeof *stats), *pairs = calloc((size_t)r, sizeof *pairs);
    if (stats == NULL || pairs == NULL)
        return 1;
    (void)time_pairs(1); /* the segment exists before timing: every timed pair is a cache hit */
    for (int i = 0; i < r; i++) {
        stats[i] = time_stats(n);
        pairs[i] = time_pairs(n);
        if (stats[i] < 0 || pairs[i] < 0) {
            fprintf(stderr, "bench_python_calls: %s\n", sp_last_error());
            return 1;
        }
    }
    printf("{\"bench\":\"python_calls_c\",\"calls\":%ld,\"repeats\":%d,\"backend\":\"%s\","
           "\"memory_stats_ns\":%.1f,\"malloc_free_ns\":%.1f}\n",
           n, r, sp_backend_name(), median(stats, r), median(pairs, r));
    free(stats);
    free(pairs);
    return 0;
}
