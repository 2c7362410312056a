/*
 * bench/pool_gc.c: what destroyed MemPools cost the rest of the process. Runs `cycles`
 * sp_mempool_create/sp_mempool_destroy pairs (with ALLOC 1 each pool takes one 4 KiB block
 * first, so it has a cached segment that its destroy releases), and at each checkpoint prints the
 * process's resident memory and the median time of one sp_empty_cache, each releasing one cached
 * 2 MiB segment of the default pool. When destroyed pools stay, both grow with the cycles; when
 * they go, neither does.
 *
 *   bench_pool_gc [CYCLES [CHECKPOINTS [CALLS [ALLOC]]]]   (defaults 80000 4 201 0)
 *
 * Public API only, so one binary runs against two builds of libsympool.so (LD_LIBRARY_PATH) for
 * a same-run comparison (bench/results/README.md, 2026-11-30-s26-pool-gc). One JSON line per
 * checkpoint: {"bench":"pool_gc","cycles":N,"rss_kib":R,"rss_growth_kib":G,
 * "empty_cache_median_ns":T,"calls":C,"alloc":A}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench_util.h"
#include "sympool/sympool.h"

static long rss_kib(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
        resident = -1;
    fclose(f);
    return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static void must(sp_status_t s, const char *what) {
    if (s != SP_SUCCESS) {
        fprintf(stderr, "bench_pool_gc: %s: %s\n", what, sp_last_error());
        exit(1);
    }
}

/* One create/destroy cycle; with `alloc`, a block allocated and freed in between. */
static void cycle(int alloc) {
    sp_mempool_t *pool = NULL;
    must(sp_mempool_create(NULL, &pool), "sp_mempool_create");
    if (alloc) {
        void *p = NULL;
        must(sp_mempool_malloc(pool, 4096, NULL, &p), "sp_mempool_malloc");
        must(sp_free(p), "sp_free");
    }
    must(sp_mempool_destroy(pool), "sp_mempool_destroy");
}

/* Median ns of one sp_empty_cache, each releasing a freshly cached 2 MiB segment. */
static double empty_cache_ns(int calls) {
    double *t = malloc((size_t)calls * sizeof(*t));
    if (!t)
        exit(1);
    for (int i = 0; i < calls; i++) {
        void *p = NULL;
        must(sp_malloc(4096, 0, NULL, &p), "sp_malloc");
        must(sp_free(p), "sp_free");
        double t0 = bench_now_ns();
        must(sp_empty_cache(), "sp_empty_cache");
        t[i] = bench_now_ns() - t0;
    }
    double m = bench_median(t, calls);
    free(t);
    return m;
}

int main(int argc, char **argv) {
    long cycles = argc > 1 ? atol(argv[1]) : 80000;
    int checkpoints = argc > 2 ? atoi(argv[2]) : 4;
    int calls = argc > 3 ? atoi(argv[3]) : 201;
    int alloc = argc > 4 ? atoi(argv[4]) : 0;
    if (cycles < 0 || checkpoints < 1 || calls < 1) {
        fprintf(stderr, "usage: bench_pool_gc [CYCLES [CHECKPOINTS [CALLS [ALLOC]]]]\n");
        return 2;
    }
    must(sp_init(), "sp_init");
    (void)empty_cache_ns(5); /* warm: first-use costs out of the baseline */
    long rss0 = rss_kib(), done = 0;
    for (int c = 0; c <= checkpoints; c++) {
        long target = cycles * c / checkpoints;
        for (; done < target; done++)
            cycle(alloc);
        double ns = empty_cache_ns(calls);
        long rss = rss_kib();
        printf("{\"bench\":\"pool_gc\",\"cycles\":%ld,\"rss_kib\":%ld,\"rss_growth_kib\":%ld,"
               "\"empty_cache_median_ns\":%.0f,\"calls\":%d,\"alloc\":%d}\n",
               done, rss, rss - rss0, ns, calls, alloc);
        fflush(stdout);
    }
    return 0;
}
