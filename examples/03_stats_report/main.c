/*
 * 03_stats_report: every memory_stats key across ranks in one call, in the three report formats.
 *
 *   mpirun -np 2 build/examples/03_stats_report [table|json|prometheus|all]   (default: all)
 *
 * Each rank makes its allocator look different on purpose: rank r keeps r+1 live blocks of
 * (r+1) * 8 MiB and frees a few small ones, so min, max, mean, the worst rank and the imbalance
 * column all say something. Then:
 *  - sp_stats_aggregate: min / max / sum and the ranks holding them, for a couple of keys;
 *  - sp_stats_report in the chosen format(s), written by rank 0.
 * The same report is printed at sp_world_finalize with SYMPOOL_REPORT=table|json|prometheus,
 * without any code.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <mpi.h>

#include <sympool/collectives.h>
#include <sympool/sympool.h>
#include <sympool/world.h>

#include "../common/example_util.h"

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "all";
    if (strcmp(which, "table") && strcmp(which, "table_all") && strcmp(which, "json") &&
        strcmp(which, "prometheus") && strcmp(which, "all")) {
        fprintf(stderr, "usage: %s [table|table_all|json|prometheus|all]\n", argv[0]);
        return 2;
    }
    sp_world_t *w = example_world_init(&argc, &argv);
    if (!w)
        return 1;
    int dev = sp_world_device(w);

    /* Skewed usage: rank r holds r+1 blocks of (r+1)*8 MiB; 16 small blocks come and go. */
    void *big[64];
    int nbig = g_rank + 1 < 64 ? g_rank + 1 : 64;
    for (int i = 0; i < nbig; i++)
        CHECK(sp_malloc((size_t)(g_rank + 1) << 23, dev, NULL, &big[i]));
    for (int i = 0; i < 16; i++) {
        void *p = NULL;
        CHECK(sp_malloc(4096 + (size_t)i * 512, dev, NULL, &p));
        CHECK(sp_free(p));
    }

    /* With one format chosen, stdout carries the report alone, so that `... prometheus |
     * promtool check metrics` and `... json | jq` read it as is; the rest goes to stderr. */
    FILE *talk = strcmp(which, "all") == 0 ? stdout : stderr;
    sp_stats_summary_t sum;
    CHECK(sp_stats_aggregate(w, dev, &sum));
    if (g_rank == 0) {
        fprintf(talk, "sp_stats_aggregate over %d ranks (one collective):\n", sum.nranks);
        const char *keys[] = {"allocated_bytes.all.current", "allocation.all.current",
                              "segment.all.current"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            for (size_t i = 0; i < sp_stats_count(); i++)
                if (strcmp(sp_stats_key(i), keys[k]) == 0)
                    fprintf(talk, "  %-28s min %lld (rank %d)  max %lld (rank %d)  sum %lld\n",
                            keys[k], (long long)sum.min[i], sum.min_rank[i],
                            (long long)sum.max[i], sum.max_rank[i], (long long)sum.sum[i]);
        fprintf(talk, "\n");
        fflush(talk);
    }

    const struct {
        const char *name, *enumerator;
        sp_report_format_t format;
        bool in_all; /* table_all repeats table with every key: asked for by name only */
    } formats[] = {{"table", "TABLE", SP_REPORT_TABLE, true},
                   {"table_all", "TABLE_ALL", SP_REPORT_TABLE_ALL, false},
                   {"json", "JSON", SP_REPORT_JSON, true},
                   {"prometheus", "PROMETHEUS", SP_REPORT_PROMETHEUS, true}};
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        bool all = strcmp(which, "all") == 0;
        if (strcmp(which, formats[f].name) != 0 && !(all && formats[f].in_all))
            continue;
        if (g_rank == 0)
            fprintf(talk, "==== sp_stats_report(..., SP_REPORT_%s) ====\n", formats[f].enumerator);
        fflush(talk);
        CHECK(sp_stats_report(w, dev, stdout, formats[f].format));
        if (g_rank == 0 && talk == stdout)
            printf("\n");
    }

    for (int i = 0; i < nbig; i++)
        CHECK(sp_free(big[i]));
    CHECK(sp_world_finalize(w));
    return 0;
}
