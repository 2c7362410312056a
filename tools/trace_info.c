/*
 * trace_info.c: `sympool info TRACE`: what a PyTorch memory snapshot holds, as `sympool replay`
 * reads it: the format, the devices with data, and per device the events by action, the
 * streams, the private pools, the starting state and PyTorch's reserved bytes; then the
 * allocator settings the snapshot records. Reads the file only; the library is not started.
 */
#include <stdio.h>

#include "tools/cli.h"

static double gib(uint64_t b) {
    return (double)b / (1024.0 * 1024.0 * 1024.0);
}

int cli_trace_info(const char *path) {
    static const char *const names[] = {
        "alloc",       "free_requested", "free_completed", "segment_alloc", "segment_free",
        "segment_map", "segment_unmap",  "snapshot",       "oom",           "other"};
    char err[512];
    tr_trace_t t;
    if (!tr_load_opts(path, false, &t, err, sizeof(err))) {
        fprintf(stderr, "sympool info: %s\n", err);
        tr_free(&t);
        return 1;
    }
    printf("trace: %s\n", path);
    if (t.protocol > 0)
        printf("format: pickle protocol %d, %s\n", t.protocol, t.format);
    else
        printf("format: JSON, %s\n", t.format);
    int with_data = 0;
    for (int d = 0; d < t.ndev; d++)
        with_data += t.dev[d].nev > 0 || t.dev[d].final_reserved > 0;
    printf("devices: %d with data (of %d device traces), %zu segments at the end\n", with_data,
           t.ndev, t.nsegments);
    for (int d = 0; d < t.ndev; d++) {
        const tr_device_t *dv = &t.dev[d];
        if (dv->nev == 0 && dv->final_reserved == 0)
            continue;
        size_t count[TR_OTHER + 1] = {0};
        for (size_t i = 0; i < dv->nev; i++)
            count[dv->ev[i].action]++;
        printf("device %d:\n  events: %zu", d, dv->nev);
        for (int a = 0; a <= TR_OTHER; a++)
            if (count[a] > 0)
                printf(", %s %zu", names[a], count[a]);
        printf("\n  streams: %zu (the default stream included)\n", dv->nstreams);
        printf("  pools: default");
        for (size_t p = 0; p < dv->npools; p++)
            printf(", (%llu, %llu)", (unsigned long long)dv->pools[p].first,
                   (unsigned long long)dv->pools[p].second);
        printf("\n  empty_cache calls: %zu; frees held for other streams: %zu; releases inside "
               "malloc: %zu segment frees\n",
               dv->empty_cache_runs, dv->deferred_frees, dv->internal_frees);
        printf("  starting state: %zu segments (%.3f GiB; PyTorch reserved %.3f GiB before the "
               "first event), %zu live blocks in them, %zu outside (%.3f GiB)\n",
               dv->nstart, gib(dv->start_bytes), gib(dv->start_reserved), dv->nsblocks, dv->nloose,
               gib(dv->loose_bytes));
        printf("  PyTorch reserved: peak %.3f GiB, at the end %.3f GiB (%.3f GiB allocated); "
               "recorded OOMs: %zu\n",
               gib(dv->peak_reserved), gib(dv->final_reserved), gib(dv->final_allocated),
               dv->recorded_ooms);
    }
    if (t.settings.recorded) {
        printf("settings: '%s'%s\n", t.settings.conf[0] ? t.settings.conf : "defaults",
               t.settings.conf[0] ? " (SYMPOOL_ALLOC_CONF terms)" : "");
        if (t.settings.fraction > 0)
            printf("  per_process_memory_fraction %.3f\n", t.settings.fraction);
        if (t.settings.dropped[0])
            printf("  not replayable: %s\n", t.settings.dropped);
    } else {
        printf("settings: not recorded (older torch); a replay uses sympool's defaults\n");
    }
    tr_free(&t);
    return 0;
}
