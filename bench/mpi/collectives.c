/*
 * bench/mpi/collectives.c: sp_allreduce against MPI_Allreduce on the same sympool buffers in the
 * same run (host backend), fp32 sum, 4 KiB to 64 MiB. One JSON line per size on rank 0:
 *   {"bench":"collectives","op":"allreduce","dtype":"float32","ranks":4,"bytes":1048576,
 *    "iters":..,"mpi_us":..,"sympool_us":..,"overhead_pct":..,"agreement_us":..}
 * Times are medians (and minima: *_min_*, the least disturbed by other load) over iterations of
 * rank 0's wall time per call, each call started after a barrier; MPI and sympool calls alternate
 * (and swap order every iteration) so that drift (frequency, other load, cache state) hits both
 * alike. agreement_us is a zero-count sp_allreduce: the argument checks and the one small agreement
 * allreduce every call pays. Usage: mpirun -np 4 bench_collectives [max_bytes]
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include <sympool/collectives.h>
#include <sympool/sympool.h>
#include <sympool/world.h>
#include "../bench_util.h"
#define BENCH_NAME "bench_collectives"
#include "mpi_bench.h"

int main(int argc, char **argv) {
    sp_world_t *w = NULL;
    sp_status_t s = sp_world_init(&argc, &argv, &w);
    if (s != SP_SUCCESS) {
        fprintf(stderr, "sp_world_init: %s: %s\n", sp_status_name(s), sp_last_error());
        return 1;
    }
    int rank = sp_world_rank(w), n = sp_world_size(w), dev = sp_world_device(w);
    if (strcmp(sp_backend_name(), "host") != 0) {
        /* MPI_Allreduce on device memory needs a CUDA-aware MPI: this compares host paths. */
        if (rank == 0)
            printf("{\"bench\":\"collectives\",\"skipped\":\"backend %s; run with "
                   "SYMPOOL_DEVICE=host\"}\n",
                   sp_backend_name());
        sp_world_finalize(w);
        return 0;
    }
    size_t max_bytes = argc > 1 ? (size_t)strtoull(argv[1], NULL, 0) : (size_t)64 << 20;
    void *send = NULL, *recv = NULL;
    if ((s = sp_malloc(max_bytes, dev, NULL, &send)) != SP_SUCCESS)
        die("sp_malloc", s);
    if ((s = sp_malloc(max_bytes, dev, NULL, &recv)) != SP_SUCCESS)
        die("sp_malloc", s);
    for (size_t i = 0; i < max_bytes / sizeof(float); i++)
        ((float *)send)[i] = (float)(rank + 1);

    enum { MAX_ITERS = 400 };
    static double t_mpi[MAX_ITERS], t_sp[MAX_ITERS], t_agree[MAX_ITERS];
    for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
        size_t count = bytes / sizeof(float);
        /* ~0.2 GB of traffic per variant, between 40 and MAX_ITERS calls. */
        size_t want = ((size_t)200 << 20) / bytes;
        int iters = want > MAX_ITERS ? MAX_ITERS : (int)want;
        iters = iters < 40 ? 40 : iters > MAX_ITERS ? MAX_ITERS : iters;
        for (int warm = 0; warm < 3; warm++) {
            MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if ((s = sp_allreduce(w, send, recv, count, SP_FLOAT32, SP_SUM, NULL)) != SP_SUCCESS)
                die("sp_allreduce", s);
        }
        for (int it = 0; it < iters; it++) {
            /* Alternate which variant goes first, so that neither always inherits the other's
             * cache and page state. */
            for (int k = 0; k < 2; k++) {
                bool ours = (k == 0) == (it % 2 == 1);
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                if (ours)
                    s = sp_allreduce(w, send, recv, count, SP_FLOAT32, SP_SUM, NULL);
                else
                    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                double dt = MPI_Wtime() - t0;
                if (ours && s != SP_SUCCESS)
                    die("sp_allreduce", s);
                (ours ? t_sp : t_mpi)[it] = dt;
            }
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            s = sp_allreduce(w, send, recv, 0, SP_FLOAT32, SP_SUM, NULL);
            t_agree[it] = MPI_Wtime() - t0;
        }
        if (((float *)recv)[count - 1] != (float)n * (float)(n + 1) / 2.0f)
            die("wrong result", SP_ERR_INTERNAL);
        double m = bench_median(t_mpi, iters) * 1e6, p = bench_median(t_sp, iters) * 1e6;
        double a = bench_median(t_agree, iters) * 1e6;
        /* bench_median() sorted them: [0] is the fastest call, the least disturbed by other load.
         */
        double m_min = t_mpi[0] * 1e6, p_min = t_sp[0] * 1e6;
        if (rank == 0)
            printf("{\"bench\":\"collectives\",\"op\":\"allreduce\",\"dtype\":\"float32\","
                   "\"ranks\":%d,\"bytes\":%zu,\"iters\":%d,\"mpi_us\":%.2f,\"sympool_us\":%.2f,"
                   "\"overhead_pct\":%.2f,\"mpi_min_us\":%.2f,\"sympool_min_us\":%.2f,"
                   "\"overhead_min_pct\":%.2f,\"agreement_us\":%.2f,\"backend\":\"%s\"}\n",
                   n, bytes, iters, m, p, 100.0 * (p - m) / m, m_min, p_min,
                   100.0 * (p_min - m_min) / m_min, a, sp_backend_name());
        fflush(stdout);
    }
    sp_free(send);
    sp_free(recv);
    s = sp_world_finalize(w);
    return s == SP_SUCCESS ? 0 : 1;
}
