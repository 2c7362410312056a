/*
 * bench_release: what giving cached segments back costs as their number grows, for the two
 * calls that do it (a long training run can hold thousands of segments: one per tensor of
 * 10 MiB or more; a program may make a stream per task and end it after).
 * - empty_cache: each round makes N segments (N allocations of 12 MiB, each its own segment),
 *   frees them all (they stay cached) and times one sp_empty_cache: ns a segment.
 * - stream_destroy: each round makes N streams with a block of 4 KiB each (a 2 MiB segment of
 *   the stream's own), frees the blocks (cached under their streams) and times the N
 *   sp_stream_destroy calls: ns a stream. Each releases its stream's segment among the others.
 * - pending_frees: each round makes N streams and N blocks, records block i on stream i, and
 *   times the N frees (each queues an event on its stream: N queues pending by the end): ns a
 *   free. The streams are then synchronized and destroyed.
 * The figure is the median of ROUNDS. A cost a segment (a stream) that stays flat as N grows
 * is linear in all; one that grows with N is not. On the host backend with its arena (no
 * system call a segment), so the figure is the allocator's own bookkeeping. One JSON line per
 * case and N.
 *
 * Usage: bench_release [ROUNDS [N...]]   (default 5 rounds; N = 1000 4000 16000 64000)
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include <sympool/sympool.h>

#include "bench_util.h"

#define SEG_BYTES ((size_t)12 << 20)

static int empty_cache_round(size_t n, void **ptrs, sp_stream_t *streams, double *ns_p) {
    (void)streams;
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

/* fn on each of the n handles (blocks or streams: both are void *), 1 at the first failure. */
static int each(const char *what, sp_status_t (*fn)(void *), void **v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (fn(v[i]) != SP_SUCCESS) {
            fprintf(stderr, "%s: %s\n", what, sp_last_error());
            return 1;
        }
    return 0;
}

/* n streams with a 4 KiB block each: allocated on its stream, or on the default stream and
 * recorded on it (`recorded`). */
static int streams_with_blocks(size_t n, void **ptrs, sp_stream_t *streams, bool recorded) {
    for (size_t i = 0; i < n; i++)
        if (sp_stream_create(0, &streams[i]) != SP_SUCCESS ||
            sp_malloc(4096, 0, recorded ? NULL : streams[i], &ptrs[i]) != SP_SUCCESS ||
            (recorded && sp_record_stream(ptrs[i], streams[i]) != SP_SUCCESS)) {
            fprintf(stderr, "stream #%zu: %s\n", i, sp_last_error());
            return 1;
        }
    return 0;
}

static int streams_round(size_t n, void **ptrs, sp_stream_t *streams, double *ns_p) {
    if (streams_with_blocks(n, ptrs, streams, false) || each("sp_free", sp_free, ptrs, n))
        return 1;
    double t0 = bench_now_ns();
    if (each("sp_stream_destroy", sp_stream_destroy, streams, n))
        return 1;
    *ns_p = (bench_now_ns() - t0) / (double)n;
    return 0;
}

static int pending_round(size_t n, void **ptrs, sp_stream_t *streams, double *ns_p) {
    if (streams_with_blocks(n, ptrs, streams, true))
        return 1;
    double t0 = bench_now_ns();
    if (each("sp_free", sp_free, ptrs, n))
        return 1;
    *ns_p = (bench_now_ns() - t0) / (double)n;
    if (each("sp_stream_synchronize", sp_stream_synchronize, streams, n) ||
        each("sp_stream_destroy", sp_stream_destroy, streams, n))
        return 1;
    if (sp_empty_cache() != SP_SUCCESS) {
        fprintf(stderr, "sp_empty_cache: %s\n", sp_last_error());
        return 1;
    }
    return 0;
}

static const struct {
    const char *name, *count, *per; /* the JSON line's case, what N counts, its figure */
    int (*round)(size_t n, void **ptrs, sp_stream_t *streams, double *ns_p);
} cases[3] = {{"empty_cache", "segments", "ns_per_segment", empty_cache_round},
              {"stream_destroy", "streams", "ns_per_stream", streams_round},
              {"pending_frees", "streams", "ns_per_free", pending_round}};

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    size_t def[] = {1000, 4000, 16000, 64000};
    size_t nn = argc > 2 ? (size_t)(argc - 2) : sizeof def / sizeof def[0];
    if (rounds < 1 || rounds > 1000) {
        fprintf(stderr, "usage: bench_release [ROUNDS (1-1000) [N...]]\n");
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
        sp_stream_t *streams = n ? malloc(n * sizeof *streams) : NULL;
        double *ns = malloc((size_t)rounds * sizeof *ns);
        if (!n || !ptrs || !streams || !ns) {
            fprintf(stderr, "bad N or out of memory\n");
            return 1;
        }
        for (int c = 0; c < 3; c++) {
            for (int r = 0; r < rounds; r++)
                if (cases[c].round(n, ptrs, streams, &ns[r]) != 0)
                    return 1;
            printf("{\"bench\":\"release\",\"case\":\"%s\",\"%s\":%zu,\"rounds\":%d,"
                   "\"%s\":%.1f}\n",
                   cases[c].name, cases[c].count, n, rounds, cases[c].per,
                   bench_median(ns, rounds));
        }
        free(streams);
        free(ptrs);
        free(ns);
    }
    return sp_shutdown() == SP_SUCCESS ? 0 : 1;
}
