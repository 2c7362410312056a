/*
 * bench/mpi/scale.c: what grows with the rank count, measured in one run: making a world (the
 * node table's allgather included), sp_stats_aggregate and sp_stats_report (JSON) next to a bare
 * MPI_Allreduce of the same bytes, and the host memory a world and a symmetric pool cost a rank.
 * Run it at several rank counts and node counts (tests/multinode/mn-run.sh) and fit docs/scale.md.
 *
 *   mpirun -np N bench_scale [iterations]
 *
 * Every time is the median over iterations of the slowest rank's time for one call (each call
 * starts after a barrier). Prints one JSON line (rank 0):
 *   world_us        sp_world_from_comm + sp_world_finalize
 *   aggregate_us    sp_stats_aggregate
 *   report_us       sp_stats_report(JSON) to /dev/null (three collectives: the job's reduction,
 *                   the per-node reduction and the node records gathered to rank 0)
 *   allreduce_us    MPI_Allreduce(MAX) of aggregate_bytes on the same communicator
 *   aggregate_bytes the reduction's message: one 32-byte record per summary key, symmetric
 *                   counter and the error flag
 *   node_bytes      what rank 0 receives for the per-node aggregates (nodes x aggregate_bytes)
 *   world_rss_kib   resident memory one more live world adds to a rank (median over ranks)
 *   pool_rss_kib    resident memory one empty symmetric pool adds to a rank
 *   json_bytes      size of the JSON report
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include <sympool/collectives.h>
#include <sympool/sympool.h>
#include <sympool/symmetric.h>
#define BENCH_NAME "bench_scale"
#include "mpi_bench.h"

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kib = atol(line + 6);
    if (f)
        fclose(f);
    return kib;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The slowest rank's time for this call, on every rank. */
static double slowest(double t) {
    double m = 0;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

static long median_over_ranks(long v, int rank, int n) {
    long *all = rank == 0 ? malloc(sizeof(long) * (size_t)n) : NULL;
    MPI_Gather(&v, 1, MPI_LONG, all, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    long m = 0;
    if (rank == 0) {
        double *d = malloc(sizeof(double) * (size_t)n);
        for (int i = 0; i < n; i++)
            d[i] = (double)all[i];
        m = (long)median(d, n);
        free(d);
        free(all);
    }
    return m;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, n = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int iters = argc > 1 ? atoi(argv[1]) : 50;
    if (iters < 3)
        iters = 3;
    double *tw = calloc((size_t)iters, sizeof(double)), *ta = calloc((size_t)iters, sizeof(double));
    double *tr = calloc((size_t)iters, sizeof(double)), *tm = calloc((size_t)iters, sizeof(double));
    sp_world_t *w = NULL;
    sp_status_t s;
    if ((s = sp_world_from_comm(MPI_COMM_WORLD, &w)) != SP_SUCCESS)
        die("sp_world_from_comm", s);
    int dev = sp_world_device(w);
    FILE *null = fopen("/dev/null", "w");
    /* Warm up once: the first world and report pay for MPI's own lazy set-up. */
    sp_stats_summary_t *sum = malloc(sizeof *sum);
    if ((s = sp_stats_aggregate(w, dev, sum)) != SP_SUCCESS)
        die("sp_stats_aggregate", s);
    if ((s = sp_stats_report(w, dev, null, SP_REPORT_JSON)) != SP_SUCCESS)
        die("sp_stats_report", s);
    size_t nrec = sp_stats_summary_count() + 8 + 1; /* summary keys, symmetric counters, flag */
    size_t bytes = nrec * 32;
    int64_t *buf = calloc(nrec * 4, sizeof(int64_t)), *out = calloc(nrec * 4, sizeof(int64_t));

    for (int i = 0; i < iters; i++) {
        sp_world_t *w2 = NULL;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if ((s = sp_world_from_comm(MPI_COMM_WORLD, &w2)) != SP_SUCCESS)
            die("sp_world_from_comm", s);
        if ((s = sp_world_finalize(w2)) != SP_SUCCESS)
            die("sp_world_finalize", s);
        tw[i] = slowest(MPI_Wtime() - t0);

        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        if ((s = sp_stats_aggregate(w, dev, sum)) != SP_SUCCESS)
            die("sp_stats_aggregate", s);
        ta[i] = slowest(MPI_Wtime() - t0);

        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        if ((s = sp_stats_report(w, dev, rank == 0 ? null : NULL, SP_REPORT_JSON)) != SP_SUCCESS)
            die("sp_stats_report", s);
        tr[i] = slowest(MPI_Wtime() - t0);

        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        MPI_Allreduce(buf, out, (int)(nrec * 4), MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        tm[i] = slowest(MPI_Wtime() - t0);
    }

    /* Memory: several live worlds and pools, so one page more or less is noise. */
    enum { K = 8 };
    sp_world_t *ws[K];
    long r0 = rss_kib();
    for (int k = 0; k < K; k++)
        if ((s = sp_world_from_comm(MPI_COMM_WORLD, &ws[k])) != SP_SUCCESS)
            die("sp_world_from_comm", s);
    long r1 = rss_kib();
    sp_mempool_t *pools[K];
    for (int k = 0; k < K; k++)
        if ((s = sp_symmetric_mempool_create(w, NULL, &pools[k])) != SP_SUCCESS)
            die("sp_symmetric_mempool_create", s);
    long r2 = rss_kib();
    for (int k = 0; k < K; k++) {
        if ((s = sp_symmetric_mempool_destroy(pools[k])) != SP_SUCCESS)
            die("sp_symmetric_mempool_destroy", s);
        if ((s = sp_world_finalize(ws[k])) != SP_SUCCESS)
            die("sp_world_finalize", s);
    }
    long world_kib = median_over_ranks((r1 - r0) / K, rank, n);
    long pool_kib = median_over_ranks((r2 - r1) / K, rank, n);

    long json_bytes = 0;
    FILE *tmp = rank == 0 ? tmpfile() : NULL;
    if ((s = sp_stats_report(w, dev, tmp, SP_REPORT_JSON)) != SP_SUCCESS)
        die("sp_stats_report", s);
    if (tmp) {
        json_bytes = ftell(tmp);
        fclose(tmp);
    }
    int nodes = sp_world_node_count(w);
    if (rank == 0)
        printf("{\"bench\":\"scale\",\"ranks\":%d,\"nodes\":%d,\"iterations\":%d,"
               "\"world_us\":%.1f,\"aggregate_us\":%.1f,\"report_us\":%.1f,\"allreduce_us\":%.1f,"
               "\"aggregate_bytes\":%zu,\"node_bytes\":%zu,\"world_rss_kib\":%ld,"
               "\"pool_rss_kib\":%ld,\"json_bytes\":%ld}\n",
               n, nodes, iters, median(tw, iters) * 1e6, median(ta, iters) * 1e6,
               median(tr, iters) * 1e6, median(tm, iters) * 1e6, bytes, bytes * (size_t)nodes,
               world_kib, pool_kib, json_bytes);
    fclose(null);
    free(sum);
    free(buf);
    free(out);
    free(tw);
    free(ta);
    free(tr);
    free(tm);
    if ((s = sp_world_finalize(w)) != SP_SUCCESS)
        die("sp_world_finalize", s);
    MPI_Finalize();
    return 0;
}
