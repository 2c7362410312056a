/*
 * bench/mpi/symmetric.c: the cost of sp_symmetric_malloc's agreement next to a bare MPI_Allreduce
 * of the same bytes, measured in the same run, and the registrations a steady loop makes.
 *
 *   mpirun -np N bench_symmetric [iterations]
 *
 * The machine may be shared and oversubscribed, so the cache-hit and allreduce timings are taken
 * in interleaved blocks (allreduce, iallreduce, hit, repeated) and every figure is the median
 * over the blocks of the slowest rank's mean; the ratios are medians of per-block ratios, so
 * noise that hits a block hits both sides of its ratio.
 * Prints one JSON line (rank 0) with, in microseconds per call:
 *   hit_us          sp_symmetric_malloc served from the cache (one agreement round)
 *   growth_us       sp_symmetric_malloc that grows and registers a new segment (the cache is
 *                   emptied collectively between iterations, outside this timing)
 *   release_us      that sp_symmetric_empty_cache, which deregisters and frees the segment
 *   allreduce_us    MPI_Allreduce(MIN) of the agreement vector's 80 bytes on a duplicate of
 *                   the same communicator
 *   iallreduce_us   the same as MPI_Iallreduce + MPI_Test polling (what the deadline needs)
 *   hit_ratio       hit over allreduce (median of per-block ratios)
 *   hit_over_iallreduce  hit over iallreduce (the part the agreement adds beyond MPI)
 *   growth_ratio    growth_us over allreduce_us
 *   registrations_per_1000  segment registrations per 1000 mallocs in a steady mixed loop
 *                   (target 0)
 * It reads the counters through sympool/experimental.h (unstable; the same numbers the stats
 * report prints), so it includes no private header.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include <sympool/symmetric.h>
#include <sympool/sympool.h>
#include <sympool/experimental.h>
#include <sympool/world.h>
#include "../bench_util.h"
#define BENCH_NAME "bench_symmetric"
#include "mpi_bench.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static double median(const double *v, int n) {
    double tmp[64];
    for (int i = 0; i < n; i++)
        tmp[i] = v[i];
    qsort(tmp, (size_t)n, sizeof tmp[0], bench_cmp_double);
    return n % 2 ? tmp[n / 2] : (tmp[n / 2 - 1] + tmp[n / 2]) / 2;
}

static double bench_allreduce(MPI_Comm comm, int iters, int nonblocking) {
    long long in[10] = {4096, -4096, 7, -7, 1, -1, 0, 0, 512, -512}, out[10];
    MPI_Barrier(comm);
    double t0 = now_us();
    for (int i = 0; i < iters; i++) {
        if (!nonblocking) {
            MPI_Allreduce(in, out, 10, MPI_LONG_LONG, MPI_MIN, comm);
        } else {
            MPI_Request r;
            int done = 0;
            MPI_Iallreduce(in, out, 10, MPI_LONG_LONG, MPI_MIN, comm, &r);
            while (!done)
                MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        }
    }
    return worst((now_us() - t0) / iters);
}

static double bench_hit(sp_mempool_t *pool, int iters) {
    void *p;
    OK(sp_symmetric_malloc(pool, 1 << 20, NULL, &p)); /* warm: the segment exists */
    OK(sp_free(p));
    MPI_Barrier(MPI_COMM_WORLD);
    double t = 0;
    for (int i = 0; i < iters; i++) {
        double t0 = now_us();
        OK(sp_symmetric_malloc(pool, 1 << 20, NULL, &p));
        t += now_us() - t0;
        OK(sp_free(p));
    }
    return worst(t / iters);
}

/* The mean growth, and in *release_us_p the mean release of what it grew (slowest rank's). */
static double bench_growth(sp_mempool_t *pool, int iters, double *release_us_p) {
    double t = 0, r = 0;
    void *p;
    OK(sp_symmetric_empty_cache(pool));
    for (int i = 0; i < iters; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_us();
        OK(sp_symmetric_malloc(pool, 12 << 20, NULL, &p));
        t += now_us() - t0;
        OK(sp_free(p));
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now_us();
        OK(sp_symmetric_empty_cache(pool));
        r += now_us() - t0;
    }
    *release_us_p = worst(r / iters);
    return worst(t / iters);
}

static double registrations_per_1000(sp_mempool_t *pool, int device) {
    const size_t sizes[] = {512, 4096, 100000, 1 << 20, 3 << 20, 9 << 20, 25 << 20, 2048};
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *p[N];
    for (int i = 0; i < N; i++) /* warm-up: grows what the loop needs */
        OK(sp_symmetric_malloc(pool, sizes[i], NULL, &p[i]));
    for (int i = 0; i < N; i++)
        OK(sp_free(p[i]));
    sp_x_symmetric_counters_t a, b;
    sp_x_symmetric_counters(device, &a);
    int mallocs = 0;
    while (mallocs < 1000) {
        for (int i = 0; i < N; i++, mallocs++)
            OK(sp_symmetric_malloc(pool, sizes[i], NULL, &p[i]));
        for (int i = N - 1; i >= 0; i--)
            OK(sp_free(p[i]));
    }
    sp_x_symmetric_counters(device, &b);
    return worst(1000.0 * (double)(b.registrations - a.registrations) / mallocs);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    if (iters < 10)
        iters = 10;
    sp_world_t *w;
    OK(sp_world_init(&argc, &argv, &w));
    sp_mempool_t *pool;
    OK(sp_symmetric_mempool_create(w, NULL, &pool));
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);

    enum { BLOCKS = 15 };
    int per = iters / BLOCKS > 10 ? iters / BLOCKS : 10;
    double ar_b[BLOCKS], iar_b[BLOCKS], hit_b[BLOCKS], ratio_b[BLOCKS], iratio_b[BLOCKS];
    for (int b = 0; b < BLOCKS; b++) {
        ar_b[b] = bench_allreduce(dup, per, 0);
        iar_b[b] = bench_allreduce(dup, per, 1);
        hit_b[b] = bench_hit(pool, per);
        ratio_b[b] = hit_b[b] / ar_b[b];
        iratio_b[b] = hit_b[b] / iar_b[b];
    }
    double ar = median(ar_b, BLOCKS), iar = median(iar_b, BLOCKS), hit = median(hit_b, BLOCKS);
    double hit_ratio = median(ratio_b, BLOCKS), hit_iratio = median(iratio_b, BLOCKS);
    double release = 0;
    double grow = bench_growth(pool, iters / 40 > 5 ? iters / 40 : 5, &release);
    double regs = registrations_per_1000(pool, sp_world_device(w));

    int size = sp_world_size(w), cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (sp_world_rank(w) == 0)
        printf(
            "{\"bench\":\"symmetric\",\"ranks\":%d,\"cores\":%d,\"oversubscribed\":%s,"
            "\"backend\":\"%s\",\"iterations\":%d,\"hit_us\":%.2f,\"growth_us\":%.1f,"
            "\"release_us\":%.1f,\"allreduce_us\":%.2f,\"iallreduce_us\":%.2f,\"hit_ratio\":%.2f,"
            "\"hit_over_iallreduce\":%.2f,\"growth_ratio\":%.1f,"
            "\"registrations_per_1000\":%.2f}\n",
            size, cores, size > cores ? "true" : "false", sp_backend_name(), iters, hit, grow,
            release, ar, iar, hit_ratio, hit_iratio, grow / ar, regs);
    MPI_Comm_free(&dup);
    OK(sp_symmetric_mempool_destroy(pool));
    OK(sp_world_finalize(w));
    return 0;
}
