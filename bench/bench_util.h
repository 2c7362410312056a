/*
 * bench_util.h: what every benchmark program measures with: a monotonic clock in nanoseconds
 * and the median of a set of runs (the figure the project reports, against a baseline measured
 * in the same run). Header-only so each program stays one file to read.
 */
#ifndef SP_BENCH_UTIL_H
#define SP_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

static inline double bench_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v in place. */
static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif /* SP_BENCH_UTIL_H */
