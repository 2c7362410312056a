/*
 * bench/mpi/small_calls.c: the two collective calls whose cost is all agreement, next to a bare
 * 8-byte MPI_Allreduce measured in the same run (host backend):
 *   - sp_allreduce of 8 bytes (two float32, sum) over MPI_Allreduce of the same 8 bytes;
 *   - a cached sp_symmetric_malloc (one agreement round, no growth) over the same MPI_Allreduce.
 * The three are timed in interleaved blocks (the order rotates every block); a block's figure is
 * the slowest rank's mean per call, and every reported figure is the bench_median over the blocks
 * (the ratios are medians of per-block ratios, so noise that hits a block hits both sides). One
 * JSON line on rank 0:
 *   {"bench":"small_calls","ranks":2,"blocks":..,"per_block":..,"mpi_allreduce_8b_us":..,
 *    "sp_allreduce_8b_us":..,"sym_hit_us":..,"allreduce_ratio":..,"sym_hit_ratio":..}
 * Usage: mpirun -np 2 bench_small_calls [calls_per_block [blocks]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <mpi.h>

#include <sympool/collectives.h>
#include <sympool/symmetric.h>
#include <sympool/sympool.h>
#include <sympool/world.h>
#include "../bench_util.h"
#define BENCH_NAME "bench_small_calls"
#include "mpi_bench.h"

enum { K_MPI, K_SP_ALLREDUCE, K_SYM_HIT, K_COUNT };

static double run(int kind, int per, sp_world_t *w, MPI_Comm dup, sp_mempool_t *pool,
                  const float *send, float *recv) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t = 0;
    for (int i = 0; i < per; i++) {
        void *p = NULL;
        double t0 = MPI_Wtime();
        if (kind == K_MPI)
            MPI_Allreduce(send, recv, 2, MPI_FLOAT, MPI_SUM, dup);
        else if (kind == K_SP_ALLREDUCE)
            OK(sp_allreduce(w, send, recv, 2, SP_FLOAT32, SP_SUM, NULL));
        else
            OK(sp_symmetric_malloc(pool, 512, NULL, &p));
        t += MPI_Wtime() - t0;
        if (p)
            OK(sp_free(p));
    }
    return worst(t / per * 1e6);
}

int main(int argc, char **argv) {
    sp_world_t *w = NULL;
    OK(sp_world_init(&argc, &argv, &w));
    int per = argc > 1 ? atoi(argv[1]) : 2000, blocks = argc > 2 ? atoi(argv[2]) : 15;
    if (per < 10)
        per = 10;
    if (blocks < 1 || blocks > 64)
        blocks = 15;
    sp_mempool_t *pool = NULL;
    OK(sp_symmetric_mempool_create(w, NULL, &pool));
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    /* sp_allreduce needs sympool buffers. */
    float *send = NULL, *recv = NULL;
    OK(sp_malloc(512, sp_world_device(w), NULL, (void **)&send));
    OK(sp_malloc(512, sp_world_device(w), NULL, (void **)&recv));
    send[0] = 1.0f;
    send[1] = 2.0f;
    void *warm = NULL;
    OK(sp_symmetric_malloc(pool, 512, NULL, &warm)); /* the segment exists: later calls hit */
    OK(sp_free(warm));
    for (int k = 0; k < K_COUNT; k++)
        (void)run(k, 20, w, dup, pool, send, recv);

    double t[K_COUNT][64], r_ar[64], r_sym[64];
    for (int b = 0; b < blocks; b++) {
        for (int j = 0; j < K_COUNT; j++) {
            int k = (j + b) % K_COUNT;
            t[k][b] = run(k, per, w, dup, pool, send, recv);
        }
        r_ar[b] = t[K_SP_ALLREDUCE][b] / t[K_MPI][b];
        r_sym[b] = t[K_SYM_HIT][b] / t[K_MPI][b];
    }
    int size = sp_world_size(w);
    if (sp_world_rank(w) == 0)
        printf("{\"bench\":\"small_calls\",\"backend\":\"%s\",\"ranks\":%d,\"blocks\":%d,"
               "\"per_block\":%d,\"mpi_allreduce_8b_us\":%.3f,\"sp_allreduce_8b_us\":%.3f,"
               "\"sym_hit_us\":%.3f,\"allreduce_ratio\":%.2f,\"sym_hit_ratio\":%.2f}\n",
               sp_backend_name(), size, blocks, per, bench_median(t[K_MPI], blocks),
               bench_median(t[K_SP_ALLREDUCE], blocks), bench_median(t[K_SYM_HIT], blocks),
               bench_median(r_ar, blocks), bench_median(r_sym, blocks));
    OK(sp_free(send));
    OK(sp_free(recv));
    MPI_Comm_free(&dup);
    OK(sp_symmetric_mempool_destroy(pool));
    OK(sp_world_finalize(w));
    return 0;
}
