/*
 * snapshot.c: what memory history costs on the host backend.
 *  - A snapshot of a 100k-entry history (PyTorch reports 712 ms for its _snapshot() of that
 *    many): sp_dump_snapshot to a pickle and to a JSON file, once in a memory file system
 *    (/dev/shm: serializing, without the disk) and once next to the benchmark (with the sync
 *    and rename the dump does), with contexts off and with stacks on every entry.
 *  - The per-call cost of recording: a cached sp_malloc + sp_free pair with history off, with
 *    history on and contexts off, and with history on and stacks on every call (a frames hook
 *    giving 12 frames, as a Python binding would), measured alternately in the same run.
 * Medians of REPEAT runs. One JSON line per figure. Usage: bench_snapshot [entries [repeat]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sympool/sympool.h"
#include "bench_util.h"

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(*v), bench_cmp_double);
    return v[n / 2];
}

/* A Python-like stack: 12 frames, the innermost varying over 64 call sites. */
static size_t frames_hook(sp_history_frame_t *out, size_t max, void *arg) {
    static const char *const files[] = {"model.py", "module.py", "train.py", "loop.py"};
    static char names[64][16];
    unsigned *site = arg;
    if (names[0][0] == '\0')
        for (int i = 0; i < 64; i++)
            snprintf(names[i], sizeof(names[i]), "layer_%d", i);
    size_t n = max < 12 ? max : 12;
    for (size_t i = 0; i < n; i++)
        out[i] = (sp_history_frame_t){i == 0 ? names[*site % 64] : "forward", files[i % 4],
                                      (int)(10 * i + 1)};
    return n;
}

static int set_history(sp_history_enabled_t en, sp_history_context_t ctx, size_t max_entries) {
    sp_history_params_t hp;
    sp_history_params_init(&hp);
    hp.enabled = en;
    hp.context = ctx;
    hp.max_entries = max_entries;
    return sp_record_memory_history(&hp) == SP_SUCCESS ? 0 : -1;
}

/* Fill the history with `entries` entries: allocations of mixed sizes, freed in FIFO order
 * (each pair records alloc, free_requested and free_completed). */
static int fill(size_t entries, unsigned *site) {
    enum { LIVE = 256 };
    void *live[LIVE] = {0};
    for (size_t i = 0; i * 3 < entries; i++) {
        *site = (unsigned)i;
        size_t k = i % LIVE;
        if (live[k] != NULL && sp_free(live[k]) != SP_SUCCESS)
            return -1;
        if (sp_malloc((size_t)512 << (i % 13), 0, NULL, &live[k]) != SP_SUCCESS)
            return -1;
    }
    for (size_t k = 0; k < LIVE; k++)
        if (live[k] != NULL && sp_free(live[k]) != SP_SUCCESS)
            return -1;
    return 0;
}

/* This thread's CPU time (user and system: the write's copy into the page cache included), in
 * ns: on a shared machine the wall time also counts the waits for a core. */
static double cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double dump_ms(const char *path, double *cpu_ms) {
    double t0 = bench_now_ns(), c0 = cpu_ns();
    if (sp_dump_snapshot(path) != SP_SUCCESS) {
        fprintf(stderr, "bench_snapshot: %s: %s\n", path, sp_last_error());
        exit(1);
    }
    double ms = (bench_now_ns() - t0) / 1e6;
    *cpu_ms = (cpu_ns() - c0) / 1e6;
    unlink(path);
    return ms;
}

static double pairs_ns(long pairs) {
    void *p = NULL;
    double t0 = bench_now_ns();
    for (long i = 0; i < pairs; i++) {
        if (sp_malloc(4096, 0, NULL, &p) != SP_SUCCESS)
            exit(1);
        sp_free(p);
    }
    return (bench_now_ns() - t0) / (double)pairs;
}

int main(int argc, char **argv) {
    size_t entries = argc > 1 ? strtoul(argv[1], NULL, 10) : 100000;
    int repeat = argc > 2 ? atoi(argv[2]) : 7;
    if (repeat < 1 || repeat > 64 || entries < 3) {
        fprintf(stderr, "usage: bench_snapshot [entries [repeat 1-64]]\n");
        return 2;
    }
    setenv("SYMPOOL_DEVICE", "host", 1);
    unsigned site = 0;
    sp_history_set_frames_hook(frames_hook, &site);
    char here[4096];
    snprintf(here, sizeof(here), "bench_snapshot_%d", (int)getpid());
    const char *where[2][2] = {
        {"/dev/shm/sp_bench_snapshot.pickle", "/dev/shm/sp_bench_snapshot.json"}, {NULL, NULL}};
    char disk_p[4200], disk_j[4200];
    snprintf(disk_p, sizeof(disk_p), "%s.pickle", here);
    snprintf(disk_j, sizeof(disk_j), "%s.json", here);
    where[1][0] = disk_p;
    where[1][1] = disk_j;
    bool have_shm = access("/dev/shm", W_OK) == 0;
    for (int stacks = 0; stacks < 2; stacks++) {
        if (set_history(SP_HISTORY_ALL, stacks ? SP_CONTEXT_ALL : SP_CONTEXT_NONE, entries) != 0 ||
            fill(entries, &site) != 0) {
            fprintf(stderr, "bench_snapshot: %s\n", sp_last_error());
            return 1;
        }
        for (int place = have_shm ? 0 : 1; place < 2; place++) {
            for (int fmt = 0; fmt < 2; fmt++) {
                double ms[64], cpu[64];
                for (int r = 0; r < repeat; r++)
                    ms[r] = dump_ms(where[place][fmt], &cpu[r]);
                printf("{\"bench\":\"snapshot_dump\",\"entries\":%zu,\"stacks\":%s,\"format\":"
                       "\"%s\",\"target\":\"%s\",\"repeat\":%d,\"ms\":%.2f,\"cpu_ms\":%.2f}\n",
                       entries, stacks ? "true" : "false", fmt ? "json" : "pickle",
                       place ? "disk" : "tmpfs", repeat, median(ms, repeat), median(cpu, repeat));
            }
        }
        if (set_history(SP_HISTORY_OFF, SP_CONTEXT_NONE, 0) != 0)
            return 1;
    }
    /* Per-call cost, alternating the three settings so that drift hits all alike. */
    const long pairs = 200000;
    double off[64], on[64], stk[64];
    (void)pairs_ns(pairs / 10);
    for (int r = 0; r < repeat; r++) {
        if (set_history(SP_HISTORY_OFF, SP_CONTEXT_NONE, 0) != 0)
            return 1;
        off[r] = pairs_ns(pairs);
        if (set_history(SP_HISTORY_ALL, SP_CONTEXT_NONE, entries) != 0)
            return 1;
        on[r] = pairs_ns(pairs);
        if (set_history(SP_HISTORY_ALL, SP_CONTEXT_ALL, entries) != 0)
            return 1;
        stk[r] = pairs_ns(pairs);
    }
    double o = median(off, repeat), n = median(on, repeat), s = median(stk, repeat);
    printf("{\"bench\":\"history_pair\",\"repeat\":%d,\"ns_off\":%.1f,\"ns_on_no_stacks\":%.1f,"
           "\"ns_on_stacks\":%.1f,\"ratio_no_stacks\":%.2f,\"ratio_stacks\":%.2f}\n",
           repeat, o, n, s, n / o, s / o);
    (void)set_history(SP_HISTORY_OFF, SP_CONTEXT_NONE, 0);
    sp_history_set_frames_hook(NULL, NULL);
    return sp_shutdown() == SP_SUCCESS ? 0 : 1;
}
