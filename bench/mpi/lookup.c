/*
 * bench/mpi/lookup.c: what a collective pays to check its buffer, by the buffer's place in its
 * segment. Every sp_allreduce checks its buffers through the allocator's pointer lookup; it used
 * to walk the segment's blocks one by one, so a buffer at the end of a 4000-block segment cost
 * hundreds of times one at its start. One small-pool segment is cut into 4000 blocks of 512 B;
 * a 1-float sp_allreduce then runs on the first block, on the last one, and on a pointer inside
 * the last one (the interior lookup). One JSON line on rank 0:
 *   {"bench":"lookup","blocks":4000,"ranks":1,"first_ns":..,"last_ns":..,"last_interior_ns":..,
 *    "last_over_first":..}
 * Times are medians over iterations (first/last alternate, so drift hits both alike).
 * Usage: mpirun -np 1 bench_lookup [iters]   (any number of ranks; each builds its own segment)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include <sympool/collectives.h>
#include <sympool/sympool.h>
#include <sympool/world.h>
#include "../bench_util.h"
#define BENCH_NAME "bench_lookup"
#include "mpi_bench.h"

#define NBLOCKS 4000

/* Median wall time of one 1-float allreduce on buf. */
static double time_allreduce(sp_world_t *w, void *buf, double *scratch, int iters) {
    for (int i = 0; i < iters; i++) {
        double t0 = bench_now_ns();
        sp_status_t s = sp_allreduce(w, buf, buf, 1, SP_FLOAT32, SP_SUM, NULL);
        scratch[i] = bench_now_ns() - t0;
        if (s != SP_SUCCESS)
            die("sp_allreduce", s);
    }
    return bench_median(scratch, iters);
}

int main(int argc, char **argv) {
    sp_world_t *w = NULL;
    sp_status_t s = sp_world_init(&argc, &argv, &w);
    if (s != SP_SUCCESS) {
        fprintf(stderr, "sp_world_init: %s: %s\n", sp_status_name(s), sp_last_error());
        return 1;
    }
    int rank = sp_world_rank(w), dev = sp_world_device(w);
    if (strcmp(sp_backend_name(), "host") != 0) {
        if (rank == 0)
            printf("{\"bench\":\"lookup\",\"skipped\":\"backend %s; run with "
                   "SYMPOOL_DEVICE=host\"}\n",
                   sp_backend_name());
        sp_world_finalize(w);
        return 0;
    }
    int iters = argc > 1 ? atoi(argv[1]) : 2001;
    if (iters < 11)
        iters = 11;
    static void *blk[NBLOCKS];
    for (int i = 0; i < NBLOCKS; i++) /* 512 B each: one 2 MiB small-pool segment holds them */
        if ((s = sp_malloc(512, dev, NULL, &blk[i])) != SP_SUCCESS)
            die("sp_malloc", s);
    void *first = blk[0], *last = blk[0];
    for (int i = 1; i < NBLOCKS; i++) {
        if ((char *)blk[i] < (char *)first)
            first = blk[i];
        if ((char *)blk[i] > (char *)last)
            last = blk[i];
    }
    memset(first, 0, 4);
    memset(last, 0, 512);
    double *scratch = malloc((size_t)iters * sizeof(double));
    double f[5], l[5], li[5];
    for (int r = 0; r < 5; r++) { /* alternate, so drift hits both */
        f[r] = time_allreduce(w, first, scratch, iters);
        l[r] = time_allreduce(w, last, scratch, iters);
        li[r] = time_allreduce(w, (char *)last + 256, scratch, iters);
    }
    double fm = bench_median(f, 5), lm = bench_median(l, 5), lim = bench_median(li, 5);
    if (rank == 0)
        printf(
            "{\"bench\":\"lookup\",\"blocks\":%d,\"ranks\":%d,\"first_ns\":%.0f,\"last_ns\":%.0f,"
            "\"last_interior_ns\":%.0f,\"last_over_first\":%.2f,\"interior_over_first\":%.2f}\n",
            NBLOCKS, sp_world_size(w), fm, lm, lim, lm / fm, lim / fm);
    free(scratch);
    for (int i = 0; i < NBLOCKS; i++)
        sp_free(blk[i]);
    sp_world_finalize(w);
    return 0;
}
