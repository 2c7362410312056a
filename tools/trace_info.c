/*
 * trace_info.c: `sympool info TRACE`: what a PyTorch memory snapshot holds, as `sympool replay`
 * reads it: the format, the devices with data, and per device the events by action, the
 * streams, the private pools, the starting state, the requested bytes (live at the start, peak)
 * and PyTorch's reserved bytes; then the allocator settings the snapshot records; with --json
 * the same as one JSON object. Reads the file only; the library is not started.
 */
#include <stdio.h>

#include "tools/cli.h"

static double gib(uint64_t b) {
    return (double)b / (1024.0 * 1024.0 * 1024.0);
}

static const char *const action_names[] = {"alloc",         "free_requested", "free_completed",
                                           "segment_alloc", "segment_free",   "segment_map",
                                           "segment_unmap", "snapshot",       "oom",
                                           "user_defined",  "other"};

static bool has_data(const tr_device_t *dv) {
    return dv->nev > 0 || dv->final_reserved > 0;
}

static void count_actions(const tr_device_t *dv, size_t count[TR_OTHER + 1]) {
    for (int a = 0; a <= TR_OTHER; a++)
        count[a] = 0;
    for (size_t i = 0; i < dv->nev; i++)
        count[dv->ev[i].flags & TR_F_COMPLETION ? TR_FREE_COMPLETED : dv->ev[i].action]++;
}

static void text(const char *path, const tr_trace_t *t) {
    printf("trace: %s\n", path);
    if (t->pickled && t->zip_member[0] != '\0')
        printf("format: pickle protocol %d, %s, the %s of a torch.save zip archive\n", t->protocol,
               t->format, t->zip_member);
    else if (t->pickled && t->legacy_save)
        printf("format: pickle protocol %d, %s, the object of a file in torch.save's old format "
               "(before torch 1.6: pickles one after another, no zip)\n",
               t->protocol, t->format);
    else if (t->pickled)
        printf("format: pickle protocol %d, %s\n", t->protocol, t->format);
    else
        printf("format: JSON, %s\n", t->format);
    int with_data = 0;
    for (int d = 0; d < t->ndev; d++)
        with_data += has_data(&t->dev[d]);
    printf("devices: %d with data (of %d device traces), %zu segments at the end\n", with_data,
           t->ndev, t->nsegments);
    for (int d = 0; d < t->ndev; d++) {
        const tr_device_t *dv = &t->dev[d];
        if (!has_data(dv))
            continue;
        size_t count[TR_OTHER + 1];
        count_actions(dv, count);
        printf("device %d:\n  events: %zu", d, dv->nev);
        for (int a = 0; a <= TR_OTHER; a++)
            if (count[a] > 0)
                printf(", %s %zu", action_names[a], count[a]);
        printf("\n  streams: %zu (the default stream included)\n", dv->nstreams);
        printf("  pools: default");
        for (size_t p = 0; p < dv->npools; p++)
            printf(", (%llu, %llu)", (unsigned long long)dv->pools[p].first,
                   (unsigned long long)dv->pools[p].second);
        printf("\n  empty_cache calls: %zu; frees held for other streams: %zu; releases inside "
               "malloc: %zu segment frees\n",
               dv->empty_cache_runs, dv->deferred_frees, dv->internal_frees);
        if (dv->completion_frees > 0)
            printf("  frees recorded only as free_completed (no free_requested before them): %zu, "
                   "read as the frees\n",
                   dv->completion_frees);
        if (dv->free_entries > 0)
            printf("  of the free_requested, recorded as 'free' (a request and its completion in "
                   "one entry): %zu\n",
                   dv->free_entries);
        printf("  starting state: %zu segments (%.3f GiB; PyTorch reserved %.3f GiB before the "
               "first event), %zu live blocks in them, %zu outside (%.3f GiB)\n",
               dv->nstart, gib(dv->start_bytes), gib(dv->start_reserved), dv->nsblocks, dv->nloose,
               gib(dv->loose_bytes));
        printf("  requested: %.3f GiB live before the first event (%zu blocks), peak %.3f GiB\n",
               gib(dv->seeded_bytes), dv->nseeds, gib(dv->peak_requested));
        printf("  PyTorch reserved: peak %.3f GiB, at the end %.3f GiB (%.3f GiB allocated); "
               "recorded OOMs: %zu\n",
               gib(dv->peak_reserved), gib(dv->final_reserved), gib(dv->final_allocated),
               dv->recorded_ooms);
        if (dv->unrecorded_free > 0)
            printf("  segments of at least %.3f GiB released with no segment_free or "
                   "segment_unmap entry, or missing from the snapshot's segments: the peak "
                   "reserved above is a floor\n",
                   gib(dv->unrecorded_free));
        if (dv->missing_allocs > 0)
            printf(
                "  %zu free%s (%.3f GiB) of blocks no alloc entry made that cannot have been "
                "live before the first entry (freed already, or in a segment the trace "
                "made before): alloc entries are missing (recorded with skip_actions=['alloc']?)\n",
                dv->missing_allocs, dv->missing_allocs == 1 ? "" : "s",
                gib(dv->missing_alloc_bytes));
        if (dv->missing_seg_allocs > 0)
            printf("  %zu segment_free%s (%.3f GiB) of segments freed already, with no "
                   "segment_alloc since: segment_alloc entries are missing (recorded with "
                   "skip_actions=['segment_alloc']?)\n",
                   dv->missing_seg_allocs, dv->missing_seg_allocs == 1 ? "" : "s",
                   gib(dv->missing_seg_bytes));
    }
    if (t->settings.recorded) {
        printf("settings: '%s'%s\n", t->settings.conf[0] ? t->settings.conf : "defaults",
               t->settings.conf[0] ? " (SYMPOOL_ALLOC_CONF terms)" : "");
        if (t->settings.split_bytes != 0)
            printf("  max_split_size %llu bytes (no whole MiB: SYMPOOL_MAX_SPLIT_SIZE)\n",
                   (unsigned long long)t->settings.split_bytes);
        if (t->settings.fraction > 0)
            printf("  per_process_memory_fraction %.3f\n", t->settings.fraction);
        if (t->settings.dropped[0])
            printf("  not replayable: %s\n", t->settings.dropped);
        if (t->settings.invalid[0])
            printf("  not valid: %s (PyTorch refuses them; replay needs --conf)\n",
                   t->settings.invalid);
    } else {
        printf("settings: not recorded (older torch); a replay uses sympool's defaults\n");
    }
}

/* The text's facts, bytes exact; every action is named, those that never occur with 0. Devices
 * without data are listed too (with_data false), so that "devices"[d] is device d. */
static void json(const char *path, const tr_trace_t *t) {
    cli_json_t j;
    cj_init(&j, stdout);
    cj_object(&j, NULL);
    cj_str(&j, "trace", path);
    cj_object(&j, "format");
    cj_str(&j, "encoding", t->pickled ? "pickle" : "json");
    if (t->pickled)
        cj_int(&j, "pickle_protocol", t->protocol);
    else
        cj_null(&j, "pickle_protocol");
    cj_str(&j, "contents", t->format);
    if (t->zip_member[0] != '\0')
        cj_str(&j, "zip_member", t->zip_member);
    else
        cj_null(&j, "zip_member");
    cj_bool(&j, "legacy_torch_save", t->legacy_save);
    cj_end(&j, '}');
    int with_data = 0;
    for (int d = 0; d < t->ndev; d++)
        with_data += has_data(&t->dev[d]);
    cj_int(&j, "devices_with_data", with_data);
    cj_int(&j, "device_traces", t->ndev);
    cj_uint(&j, "segments_at_end", t->nsegments);
    cj_array(&j, "devices");
    for (int d = 0; d < t->ndev; d++) {
        const tr_device_t *dv = &t->dev[d];
        size_t count[TR_OTHER + 1];
        count_actions(dv, count);
        cj_object(&j, NULL);
        cj_int(&j, "device", d);
        cj_bool(&j, "with_data", has_data(dv));
        cj_uint(&j, "events", dv->nev);
        cj_object(&j, "events_by_action");
        for (int a = 0; a <= TR_OTHER; a++)
            cj_uint(&j, action_names[a], count[a]);
        cj_end(&j, '}');
        cj_uint(&j, "streams", dv->nstreams);
        cj_array(&j, "private_pools"); /* besides the default pool, as PyTorch's MempoolId_t */
        for (size_t p = 0; p < dv->npools; p++) {
            cj_array(&j, NULL);
            cj_uint(&j, NULL, dv->pools[p].first);
            cj_uint(&j, NULL, dv->pools[p].second);
            cj_end(&j, ']');
        }
        cj_end(&j, ']');
        cj_uint(&j, "empty_cache_calls", dv->empty_cache_runs);
        cj_uint(&j, "frees_held_for_other_streams", dv->deferred_frees);
        cj_uint(&j, "segment_frees_inside_malloc", dv->internal_frees);
        cj_uint(&j, "frees_recorded_as_free_completed", dv->completion_frees);
        cj_uint(&j, "frees_recorded_as_free", dv->free_entries);
        cj_object(&j, "starting_state");
        cj_uint(&j, "segments", dv->nstart);
        cj_uint(&j, "segment_bytes", dv->start_bytes);
        cj_uint(&j, "pytorch_reserved_bytes", dv->start_reserved);
        cj_uint(&j, "live_blocks_in_segments", dv->nsblocks);
        cj_uint(&j, "live_blocks_outside", dv->nloose);
        cj_uint(&j, "bytes_outside", dv->loose_bytes);
        cj_end(&j, '}');
        /* What a recording with skip_actions left out, where the trace shows it. */
        cj_object(&j, "missing_entries");
        cj_uint(&j, "allocs", dv->missing_allocs);
        cj_uint(&j, "alloc_bytes", dv->missing_alloc_bytes);
        cj_uint(&j, "segment_allocs", dv->missing_seg_allocs);
        cj_uint(&j, "segment_alloc_bytes", dv->missing_seg_bytes);
        cj_end(&j, '}');
        /* The start and peak that summary, plot and replay count requested bytes from. */
        cj_object(&j, "requested");
        cj_uint(&j, "start_bytes", dv->seeded_bytes);
        cj_uint(&j, "start_blocks", dv->nseeds);
        cj_uint(&j, "peak_bytes", dv->peak_requested);
        cj_end(&j, '}');
        cj_object(&j, "pytorch");
        cj_uint(&j, "peak_reserved_bytes", dv->peak_reserved);
        cj_uint(&j, "end_reserved_bytes", dv->final_reserved);
        cj_uint(&j, "end_allocated_bytes", dv->final_allocated);
        cj_uint(&j, "recorded_ooms", dv->recorded_ooms);
        cj_end(&j, '}');
        cj_end(&j, '}');
    }
    cj_end(&j, ']');
    cj_object(&j, "settings");
    cj_bool(&j, "recorded", t->settings.recorded);
    if (t->settings.recorded)
        cj_str(&j, "alloc_conf", t->settings.conf); /* "" = PyTorch's defaults */
    else
        cj_null(&j, "alloc_conf");
    /* A recorded max_split_size of no whole MiB, which alloc_conf's max_split_size_mb cannot
     * say (null when there is none: then alloc_conf holds the whole setting). */
    if (t->settings.split_bytes != 0)
        cj_uint(&j, "max_split_size_bytes", t->settings.split_bytes);
    else
        cj_null(&j, "max_split_size_bytes");
    if (t->settings.fraction > 0)
        cj_num(&j, "per_process_memory_fraction", t->settings.fraction);
    else
        cj_null(&j, "per_process_memory_fraction");
    cj_str(&j, "not_replayable", t->settings.dropped);
    cj_str(&j, "not_valid", t->settings.invalid); /* "" when PyTorch accepts them */
    cj_end(&j, '}');
    cj_end(&j, '}');
}

int cli_trace_info(const char *path, bool as_json) {
    char err[512];
    tr_trace_t t;
    tr_keep_file_mapped(true); /* one load, and the process exits after it */
    if (!tr_load_opts(path, false, &t, err, sizeof(err))) {
        fprintf(stderr, "sympool info: %s\n", err);
        tr_free(&t);
        return 1;
    }
    if (as_json)
        json(path, &t);
    else
        text(path, &t);
    fflush(stdout);
    tr_free(&t);
    return 0;
}
