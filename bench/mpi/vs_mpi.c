/*
 * bench/mpi/vs_mpi.c: sp_allreduce and sp_allgather (host backend) against MPI_Allreduce and
 * MPI_Allgather of the same sympool buffers in the same run, 8 B to 1 MiB per rank: what
 * sympool's argument checks and agreement round cost over the bare MPI call, as a ratio.
 * Allreduce is float32 sum of BYTES; allgather sends BYTES of float32 from each rank into
 * ranks x BYTES. MPI's calls run on a duplicate of MPI_COMM_WORLD (sympool uses its own).
 *
 * For each op and size the two are timed in alternating blocks of calls (the order swaps every
 * block); a block's figure is the slowest rank's mean per call, each block starting after a
 * barrier, and every figure is the median over the blocks (the ratio is the median of the
 * per-block ratios, so noise that hits a block hits both); *_min_us are the least disturbed
 * blocks. One JSON line per op and size on rank 0:
 *   {"bench":"vs_mpi","op":"allreduce","ranks":4,"bytes":8,"blocks":..,"per_block":..,
 *    "mpi_us":..,"sympool_us":..,"sympool_over_mpi":..}
 * Usage: mpirun -np N bench_vs_mpi [blocks [max_bytes]]   (defaults 15, 1 MiB)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include <sympool/collectives.h>
#include <sympool/sympool.h>
#include <sympool/world.h>
#include "../bench_util.h"
#define BENCH_NAME "bench_vs_mpi"
#include "mpi_bench.h"

enum { OP_ALLREDUCE, OP_ALLGATHER };
enum { MAX_BLOCKS = 64 };

typedef struct call {
    int op;
    size_t count; /* float32 elements per rank */
    sp_world_t *w;
    MPI_Comm comm;
    float *send, *recv;
} call_t;

static void once(const call_t *c, int ours) {
    if (c->op == OP_ALLREDUCE) {
        if (ours)
            OK(sp_allreduce(c->w, c->send, c->recv, c->count, SP_FLOAT32, SP_SUM, NULL));
        else
            MPI_Allreduce(c->send, c->recv, (int)c->count, MPI_FLOAT, MPI_SUM, c->comm);
    } else {
        if (ours)
            OK(sp_allgather(c->w, c->send, c->recv, c->count, SP_FLOAT32, NULL));
        else
            MPI_Allgather(c->send, (int)c->count, MPI_FLOAT, c->recv, (int)c->count, MPI_FLOAT,
                          c->comm);
    }
}

/* A block: per calls after a barrier; the slowest rank's mean us per call. */
static double block(const call_t *c, int ours, int per) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < per; i++)
        once(c, ours);
    return worst((MPI_Wtime() - t0) / per * 1e6);
}

int main(int argc, char **argv) {
    sp_world_t *w = NULL;
    OK(sp_world_init(&argc, &argv, &w));
    int rank = sp_world_rank(w), n = sp_world_size(w);
    if (strcmp(sp_backend_name(), "host") != 0) {
        /* MPI on device memory needs a CUDA-aware MPI: this compares host paths. */
        if (rank == 0)
            printf("{\"bench\":\"vs_mpi\",\"skipped\":\"backend %s; run with "
                   "SYMPOOL_DEVICE=host\"}\n",
                   sp_backend_name());
        OK(sp_world_finalize(w));
        return 0;
    }
    int blocks = argc > 1 ? atoi(argv[1]) : 15;
    size_t max_bytes = argc > 2 ? (size_t)strtoull(argv[2], NULL, 0) : (size_t)1 << 20;
    blocks = blocks < 1 ? 1 : blocks > MAX_BLOCKS ? MAX_BLOCKS : blocks;
    max_bytes = max_bytes < 8 ? 8 : max_bytes;
    call_t c = {.w = w};
    MPI_Comm_dup(MPI_COMM_WORLD, &c.comm);
    OK(sp_malloc(max_bytes, sp_world_device(w), NULL, (void **)&c.send));
    OK(sp_malloc(max_bytes * (size_t)n, sp_world_device(w), NULL, (void **)&c.recv));
    for (size_t i = 0; i < max_bytes / sizeof(float); i++)
        c.send[i] = (float)(rank + 1);
    static const char *names[] = {"allreduce", "allgather"};
    for (int op = OP_ALLREDUCE; op <= OP_ALLGATHER; op++) {
        static const size_t sizes[] = {8, 64, 512, 4096, 32768, 262144, 1048576};
        for (size_t z = 0; z < sizeof sizes / sizeof sizes[0] && sizes[z] <= max_bytes; z++) {
            size_t bytes = sizes[z];
            c.op = op;
            c.count = bytes / sizeof(float);
            /* 1000 calls a block up to 4 KiB, then 16 MiB a rank and block (at least 16
             * calls). */
            int per = bytes <= 4096 ? 1000 : (int)(((size_t)16 << 20) / bytes);
            per = per < 16 ? 16 : per;
            for (int k = 0; k < 2; k++) /* warm: MPI's and sympool's first-call costs */
                (void)block(&c, k, per / 10 + 1);
            double t_mpi[MAX_BLOCKS], t_sp[MAX_BLOCKS], ratio[MAX_BLOCKS];
            for (int b = 0; b < blocks; b++) {
                int first = b % 2;
                double t0 = block(&c, first, per), t1 = block(&c, !first, per);
                t_sp[b] = first ? t0 : t1;
                t_mpi[b] = first ? t1 : t0;
                ratio[b] = t_sp[b] / t_mpi[b];
            }
            float want = op == OP_ALLREDUCE ? (float)n * (float)(n + 1) / 2.0f : (float)n;
            if (c.recv[(op == OP_ALLREDUCE ? c.count : c.count * (size_t)n) - 1] != want)
                die("wrong result", SP_ERR_INTERNAL);
            double m = bench_median(t_mpi, blocks), p = bench_median(t_sp, blocks);
            /* bench_median sorted them: [0] is the least disturbed block. */
            if (rank == 0)
                printf("{\"bench\":\"vs_mpi\",\"backend\":\"%s\",\"op\":\"%s\",\"dtype\":"
                       "\"float32\",\"ranks\":%d,\"bytes\":%zu,\"blocks\":%d,\"per_block\":%d,"
                       "\"mpi_us\":%.3f,\"sympool_us\":%.3f,\"sympool_over_mpi\":%.3f,"
                       "\"mpi_min_us\":%.3f,\"sympool_min_us\":%.3f}\n",
                       sp_backend_name(), names[op], n, bytes, blocks, per, m, p,
                       bench_median(ratio, blocks), t_mpi[0], t_sp[0]);
            fflush(stdout);
        }
    }
    OK(sp_free(c.send));
    OK(sp_free(c.recv));
    MPI_Comm_free(&c.comm);
    OK(sp_world_finalize(w));
    return 0;
}
