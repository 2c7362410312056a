/*
 * fuzz_replay.c: the libFuzzer target that drives a whole replay (tools/replay.c) of every input
 * the trace loader accepts, as `sympool replay` does: the host backend with its arena, one device
 * per recorded device, the snapshot's own allocator settings, the starting state rebuilt and the
 * segments placed where the recorded run had them (sp_x_host_place). Some inputs also run under
 * a small capacity (OOMs and their skipped frees), under a user's configuration, or write the
 * replay's snapshot. Every replay
 * ends with sp_shutdown, so a block, stream or pool the replay leaves behind is a leak report.
 * tests/fuzz/run.sh builds it (fuzz_replay) beside the readers' targets.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <sympool/sympool.h>

#include "sympool/experimental.h"
#include "tools/cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *snapshot_path(void) {
    static char path[256];
    if (path[0] == '\0') {
        const char *dir = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/sp_fuzz_replay_%d.pickle",
                 dir != NULL && dir[0] != '\0' ? dir : "/tmp", (int)getpid());
    }
    return path;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    if (fd < 0)
        fd = memfd_create("sp_fuzz_replay", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, 0) != 0 || (size > 0 && pwrite(fd, data, size, 0) != (ssize_t)size))
        return 0;
    char path[64], err[512];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    /* A snapshot is written for some inputs (then the loader keeps the stacks, as replay's). */
    bool snap = size % 5 == 0;
    tr_trace_t t;
    if (!tr_load_opts(path, snap, &t, err, sizeof err)) {
        tr_free(&t);
        return 0;
    }
    if (t.ndev > 8 || (t.settings.recorded && t.settings.invalid[0] != '\0')) {
        tr_free(&t); /* the CLI refuses invalid settings; 8 devices keep an input fast */
        return 0;
    }
    char ndev[16];
    snprintf(ndev, sizeof ndev, "%d", t.ndev > 1 ? t.ndev : 1);
    /* Most inputs replay with their own settings; some with a user's --conf instead (a segment
     * kind other than the recording's: the starting blocks requested, no segments rebuilt), one
     * with a garbage-collection threshold under a memory fraction, as --capacity sets it. */
    const char *conf = t.settings.recorded ? t.settings.conf : "";
    bool user = size % 7 == 0, gc = size % 11 == 0;
    if (user)
        conf = t.settings.expandable ? "expandable_segments:False" : "expandable_segments:True";
    else if (gc)
        conf = "garbage_collection_threshold:0.5,max_split_size_mb:20";
    if (sp_x_option_set("SYMPOOL_DEVICE", "host") != SP_SUCCESS ||
        sp_x_option_set("SYMPOOL_HOST_DEVICES", ndev) != SP_SUCCESS ||
        sp_x_option_set("SYMPOOL_HOST_ARENA", "1") != SP_SUCCESS ||
        sp_x_option_set("SYMPOOL_HOST_CAPACITY", size % 3 == 0 ? "64MiB" : "80GiB") != SP_SUCCESS ||
        sp_x_option_set("SYMPOOL_ALLOC_CONF", conf) != SP_SUCCESS) {
        tr_free(&t); /* settings the CLI would refuse too */
        (void)sp_x_option_set("SYMPOOL_ALLOC_CONF", "");
        return 0;
    }
    replay_set_user_conf(user);
    if (sp_init() != SP_SUCCESS) {
        fprintf(stderr, "fuzz_replay: sp_init: %s\n", sp_last_error());
        abort();
    }
    for (int d = 0; gc && d < (t.ndev > 1 ? t.ndev : 1); d++)
        if (sp_set_memory_fraction(0.999, d) != SP_SUCCESS) {
            fprintf(stderr, "fuzz_replay: sp_set_memory_fraction: %s\n", sp_last_error());
            abort();
        }
    replay_result_t r;
    bool ok = replay_trace(&t, snap ? snapshot_path() : NULL, &r, err, sizeof err);
    /* A replay of a loaded trace refuses nothing the allocator can do: a failure other than an
     * OOM (which replay counts) is a defect, as a crash is. */
    if (!ok) {
        fprintf(stderr, "fuzz_replay: the replay failed: %s\n", err);
        abort();
    }
    sp_status_t st = sp_shutdown();
    if (st != SP_SUCCESS) {
        fprintf(stderr, "fuzz_replay: sp_shutdown after the replay: %s: %s\n", sp_status_name(st),
                sp_last_error());
        abort();
    }
    tr_free(&t);
    if (snap)
        (void)unlink(snapshot_path());
    return 0;
}
