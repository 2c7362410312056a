/*
 * bench_empty_cache: what sp_empty_cache costs per segment it gives back, as the number of
 * segments grows (a long training run can hold thousands: one per tensor of 10 MiB or more).
 * Each round makes N segments (N allocations of 12 MiB, each its own segment), frees them all
 * (they stay cached) and times one sp_empty_cache; the figure is the median of ROUNDS, in ns a
 * segment. A cost a segment that stays flat as N grows is linear; one that grows with N is not.
 * On the host backend with its arena (no system call a segment), so the figure is the
 * allocator's own bookkeeping. One JSON line per N.
 *
 * Usage: bench_empty_cache [ROUNDS [N...]]   (default 5 rounds; N = 1000 4000 16000 64000)
 */
#include <stdio.h>
#include <stdlib.h>

#include <sympool/sympool.h>

#include "bench_util.h"

#define SEG_BYTES ((size_t)12 << 20)

static int one_round(size_t n, void **ptrs, double *ns_p) {
    for (size_t i = 0; i < n; i++)
        if (sp_malloc(SEG_BYTES, 0, NULL, &ptrs[i]) != SP_SUCCESS) {
            fprintf(stderr, "sp_malloc #%zu: %s\n", i, sp_last_error());
            return 1;
        }
    for (size_t i = 0; i < n; i++)
        if (sp_free(ptrs[i]) != SP_SUCCESS) {
            fprintf(stderr, "sp_free: %s\n", sp_last_error());
            return 1;
        }
    double t0 = bench_now_ns();
    sp_status_t s = sp_empty_cache();
    double t1 = bench_now_ns();
    if (s != SP_SUCCESS) {
        fprintf(stderr, "sp_empty_cache: %s\n", sp_last_error());
        return 1;
    }
    *ns_p = (t1 - t0) / (double)n;
    return 0;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    size_t def[] = {1000, 4000, 16000, 64000};
    size_t nn = argc > 2 ? (size_t)(argc - 2) : sizeof def / sizeof def[0];
    if (rounds < 1 || rounds > 1000) {
        fprintf(stderr, "usage: bench_empty_cache [ROUNDS (1-1000) [N...]]\n");
        return 2;
    }
    /* Address space only: 64000 segments of 12 MiB are 750 GiB of it, never touched. */
    setenv("SYMPOOL_HOST_ARENA", "1", 0);
    setenv("SYMPOOL_HOST_CAPACITY", "4TiB", 0);
    if (sp_init() != SP_SUCCESS) {
        fprintf(stderr, "sp_init: %s\n", sp_last_error());
        return 1;
    }
    for (size_t k = 0; k < nn; k++) {
        size_t n = argc > 2 ? strtoull(argv[2 + k], NULL, 10) : def[k];
        void **ptrs = n ? malloc(n * sizeof *ptrs) : NULL;
        double *ns = malloc((size_t)rounds * sizeof *ns);
        if (!n || !ptrs || !ns) {
            fprintf(stderr, "bad N or out of memory\n");
            return 1;
        }
        for (int r = 0; r < rounds; r++)
            if (one_round(n, ptrs, &ns[r]) != 0)
                return 1;
        printf("{\"bench\":\"empty_cache\",\"segments\":%zu,\"rounds\":%d,"
               "\"ns_per_segment\":%.1f}\n",
               n, rounds, bench_median(ns, rounds));
        free(ptrs);
        free(ns);
    }
    return sp_shutdown() == SP_SUCCESS ? 0 : 1;
}
