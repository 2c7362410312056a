/*
 * summary.c: `sympool summary SNAPSHOT`: the sp_memory_summary table of a snapshot's state, one
 * per device.
 *
 * What a snapshot holds decides what can be shown. The segments give the state at the end
 * exactly: reserved bytes and segments, allocated, active, requested and non-releasable bytes and
 * block counts, split by the segments' pool (large/small). The trace (device_traces) records
 * requested sizes of allocations and frees and the sizes of segment allocations and frees, so for
 * requested bytes, allocations, reserved bytes and segments it also gives the peak and the totals
 * over the recorded window: the walk forward from the state before the first event finds the
 * peak. That state is the trace loader's (trace.c), which `plot` and `replay` start from too:
 * the blocks live before the first event, and the reserved bytes of the end state minus every
 * segment event. The allocated peak comes from a replay where that reproduces the recorded end
 * state (replay_peaks). Figures a snapshot cannot give (retries, device calls) are shown as
 * "-". Allocations and frees are put in the small pool when their size is at most 1 MiB and
 * segments when they are 2 MiB, as PyTorch does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <getopt.h>

#include <sympool/sympool.h>

#include "sympool/experimental.h" /* sp_x_memory_summary_format, sp_x_option_set */
#include "tools/cli.h"

#define SMALL_SIZE (1ull << 20)
#define SMALL_SEGMENT (2ull << 20)

enum { M_REQUESTED, M_ALLOCATION, M_RESERVED, M_SEGMENT, M_TRACED };
static const char *const k_traced[M_TRACED] = {"requested_bytes", "allocation", "reserved_bytes",
                                               "segment"};
static const char *const k_pools[3] = {"all", "large_pool", "small_pool"};

typedef struct fig {
    int64_t end;       /* from the segments */
    int64_t up, down;  /* sums of the trace's increases and decreases */
    int64_t cur, peak; /* during the forward walk */
} fig_t;

typedef struct dev_figs {
    fig_t f[M_TRACED][3];
    int64_t allocated[3], active[3], active_n[3], split[3], split_n[3]; /* end state only */
    int64_t ooms;
    int64_t allocated_peak[3]; /* SP_X_SUMMARY_UNKNOWN where neither the state nor a replay says */
} dev_figs_t;

static void set(sp_stats_t *st, const char *metric, const char *pool, const char *field,
                int64_t v) {
    char key[96];
    snprintf(key, sizeof(key), "%s%s%s%s%s", metric, pool ? "." : "", pool ? pool : "",
             field ? "." : "", field ? field : "");
    for (size_t i = 0; i < sp_stats_count(); i++)
        if (strcmp(sp_stats_key(i), key) == 0)
            st->value[i] = v;
}

static void set4(sp_stats_t *st, const char *metric, int pool, int64_t cur, int64_t peak,
                 int64_t alloc, int64_t freed) {
    set(st, metric, k_pools[pool], "current", cur);
    set(st, metric, k_pools[pool], "peak", peak);
    set(st, metric, k_pools[pool], "allocated", alloc);
    set(st, metric, k_pools[pool], "freed", freed);
}

/* Add v to a metric for the pool p (1 large, 2 small) and for all. */
static void add_end(dev_figs_t *d, int m, int p, int64_t v) {
    d->f[m][0].end += v;
    d->f[m][p].end += v;
}

static bool read_segments(const pk_value_t *segments, int dev, dev_figs_t *d, char *err,
                          size_t errlen) {
    for (size_t s = 0; s < pk_len(segments); s++) {
        const pk_value_t *seg = pk_at(segments, s);
        int64_t sdev = 0, total = 0;
        (void)pk_get_int(seg, "device", &sdev);
        if (sdev != dev)
            continue;
        if (!pk_get_int(seg, "total_size", &total) || total < 0) {
            snprintf(err, errlen, "segments[%zu]: missing or bad 'total_size'", s);
            return false;
        }
        const pk_value_t *type = pk_get(seg, "segment_type");
        int p = pk_str(type) ? (pk_str_is(type, "small") ? 2 : 1)
                             : ((uint64_t)total == SMALL_SEGMENT ? 2 : 1);
        /* An expandable segment's mapped bytes are reserved, but PyTorch counts it in no
         * segment stat (map_block adds reserved bytes only) and none of its free blocks as an
         * inactive split (free_block, alloc_found_block): nor does this table. */
        const pk_value_t *exp = pk_get(seg, "is_expandable");
        bool expandable = exp != NULL && exp->type == PK_BOOL && exp->u.b;
        add_end(d, M_RESERVED, p, total);
        if (!expandable)
            add_end(d, M_SEGMENT, p, 1);
        const pk_value_t *blocks = pk_get(seg, "blocks");
        size_t nb = pk_len(blocks);
        for (size_t b = 0; b < nb; b++) {
            const pk_value_t *blk = pk_at(blocks, b);
            int64_t size = 0, req = 0;
            const char *state = pk_get_str(blk, "state");
            if (!pk_get_int(blk, "size", &size) || size < 0 || state == NULL) {
                snprintf(err, errlen, "segments[%zu].blocks[%zu]: missing or bad 'size' or 'state'",
                         s, b);
                return false;
            }
            if (!pk_get_int(blk, "requested_size", &req) || req < 0)
                req = size;
            const pk_value_t *sv = pk_get(blk, "state");
            bool allocated = pk_str_is(sv, "active_allocated");
            bool pending = pk_str_is(sv, "active_pending_free");
            bool active = allocated || pending;
            int idx[2] = {0, p};
            for (int k = 0; k < 2; k++) {
                int q = idx[k];
                if (allocated)
                    d->allocated[q] += size;
                if (active) {
                    d->active[q] += size;
                    d->active_n[q]++;
                } else if (nb > 1 && !expandable) { /* an inactive piece of a split segment */
                    d->split[q] += size;
                    d->split_n[q]++;
                }
            }
            /* PyTorch counts a block out of its allocations at the free request, out of its
             * requested bytes in free_block, when the free completes: a pending block is still
             * requested bytes, no longer an allocation. */
            if (active)
                add_end(d, M_REQUESTED, p, req);
            if (allocated)
                add_end(d, M_ALLOCATION, p, 1);
        }
    }
    return true;
}

/* The pool of each event (1 large, 2 small) into pool_of[]: by size (a request up to 1 MiB, a
 * segment or map of 2 MiB is the small pool's), except an unmap, which PyTorch makes of a whole
 * free block of an expandable segment: any number of its pages. One that starts at a page an
 * earlier 2 MiB map of the trace made is the small pool's (by size, an unmap of 4 MiB there
 * counted in the large pool). false when out of memory. */
static bool event_pools(const tr_device_t *td, uint8_t *pool_of) {
    tr_map_t small_pages = {0};
    bool ok = true;
    for (size_t i = 0; i < td->nev && ok; i++) {
        const tr_event_t *e = &td->ev[i];
        bool alloc_ev = e->action == TR_ALLOC || e->action == TR_FREE_REQUESTED ||
                        e->action == TR_FREE_COMPLETED;
        bool small = alloc_ev ? e->size <= SMALL_SIZE : e->size == SMALL_SEGMENT;
        if (e->action == TR_SEGMENT_MAP && small)
            ok = tr_map_put(&small_pages, e->addr, 1);
        else if (e->action == TR_SEGMENT_UNMAP && tr_map_get(&small_pages, e->addr, NULL))
            small = true;
        pool_of[i] = small ? 2 : 1;
    }
    tr_map_free(&small_pages);
    return ok;
}

/* The change trace event i (of pool pool_of[i]) makes to a metric of one pool; 0 when none.
 * Requested bytes go down where the free completes (tr_requested_delta), allocations at the free
 * request, as PyTorch counts them (a free held for other streams' work went down at its
 * request). */
static int64_t delta(const tr_device_t *td, const uint8_t *pool_of, size_t i, int m, int p) {
    const tr_event_t *e = &td->ev[i];
    bool seg_ev = e->action == TR_SEGMENT_ALLOC || e->action == TR_SEGMENT_FREE ||
                  e->action == TR_SEGMENT_MAP || e->action == TR_SEGMENT_UNMAP;
    int ep = pool_of[i];
    if (p != 0 && p != ep)
        return 0;
    int sign =
        (e->action == TR_ALLOC || e->action == TR_SEGMENT_ALLOC || e->action == TR_SEGMENT_MAP)
            ? 1
            : -1;
    int64_t size = e->size > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)e->size;
    switch (m) {
    case M_REQUESTED:
        return tr_requested_delta(td, i);
    case M_ALLOCATION:
        return e->action == TR_ALLOC ? 1 : e->action == TR_FREE_REQUESTED ? -1 : 0;
    case M_RESERVED:
        return seg_ev ? sign * size : 0;
    default: /* segments: a map/unmap grows or shrinks one, it does not make one */
        return (e->action == TR_SEGMENT_ALLOC || e->action == TR_SEGMENT_FREE) ? sign : 0;
    }
}

/* Requested bytes (m == M_REQUESTED) or allocations at the start in pool p: the blocks live
 * before the first event as the trace loader found them (its seeds: blocks the trace frees
 * without allocating them, and live blocks of the end state it never touches), the start that
 * `sympool plot` and `sympool replay` count from too. The end state minus the trace's changes
 * is the same for a whole trace, but not for a partial one whose end state does not hold the
 * trace's own blocks. Pools by size, as the events are. */
static int64_t seeded_start(const tr_device_t *td, int m, int p) {
    int64_t v = 0;
    for (size_t i = 0; i < td->nseeds; i++) {
        uint64_t size = td->seeds[i].size;
        if (p != 0 && p != (size <= SMALL_SIZE ? 2 : 1))
            continue;
        if (m == M_ALLOCATION && td->seeds[i].pending)
            continue; /* its free was requested: no longer an allocation, still requested bytes */
        v += m == M_REQUESTED ? (size > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)size) : 1;
    }
    return v;
}

static bool walk_trace(const tr_device_t *td, dev_figs_t *d) {
    uint8_t *pool_of = malloc(td->nev ? td->nev : 1);
    if (pool_of == NULL || !event_pools(td, pool_of)) {
        free(pool_of);
        return false;
    }
    d->ooms = (int64_t)td->recorded_ooms;
    for (int m = 0; m < M_TRACED; m++)
        for (int p = 0; p < 3; p++) {
            fig_t *f = &d->f[m][p];
            for (size_t i = 0; i < td->nev; i++) {
                int64_t v = delta(td, pool_of, i, m, p);
                if (v > 0)
                    f->up += v;
                else
                    f->down -= v;
            }
            /* The state before the first event, then forward to find the peak. Reserved bytes
             * and segments: the end state minus the trace's changes, as the loader's
             * start_reserved. */
            if (m == M_REQUESTED || m == M_ALLOCATION)
                f->cur = seeded_start(td, m, p);
            else
                f->cur = f->end - f->up + f->down;
            f->peak = f->cur;
            int64_t start = f->cur;
            for (size_t i = 0; i < td->nev; i++) {
                f->cur += delta(td, pool_of, i, m, p);
                if (f->cur > f->peak)
                    f->peak = f->cur;
            }
            f->up += start; /* what was live at the start was allocated before it */
        }
    free(pool_of);
    return true;
}

/* The allocated peak: a trace records requested sizes only, and the block a request got (rounded,
 * perhaps not split) decides allocated bytes. A snapshot without events: the end state is the
 * whole window, so the peak is the current value. With events: the trace is replayed through
 * sympool (PyTorch's rules, the snapshot's own settings, the emulated device) and its peaks are
 * taken when the replay ends with exactly the allocated bytes of the recorded end state and no
 * OOM; otherwise (a partial trace, a trace our rules do not follow to the byte) they stay "-". */
static void quiet(int level, const char *line, void *arg) {
    (void)level, (void)line, (void)arg;
}

/* The allocator's own variables set in the environment (SYMPOOL_ROUNDUP_POWER2_DIVISIONS,
 * SYMPOOL_THREAD_CACHE, SYMPOOL_HOST_CAPACITY, ...) back to their defaults for the summary's
 * replay: its peaks are the recorded run's, under the snapshot's settings alone, as the
 * environment's SYMPOOL_ALLOC_CONF is left out (a 5 MiB block peaked at 6 MiB under
 * SYMPOOL_ROUNDUP_POWER2_DIVISIONS=2, and a capacity or a thread cache made the peak "-"). */
static bool reset_allocator_options(void) {
    static const char *const keep[] = {
        "SYMPOOL_DEVICE", "SYMPOOL_DEBUG",      "SYMPOOL_DEBUG_SUBSYS", "SYMPOOL_DEBUG_FILE",
        "SYMPOOL_INFO",   "SYMPOOL_ALLOC_CONF", "SYMPOOL_HOST_DEVICES", "SYMPOOL_HOST_ARENA"};
    sp_x_option_info_t oi;
    for (int k = 0; sp_x_option_info(k, &oi); k++) {
        bool kept = strcmp(oi.source, "env") != 0 || strncmp(oi.name, "SYMPOOL_SYM_", 12) == 0 ||
                    strncmp(oi.name, "SYMPOOL_REPORT", 14) == 0;
        for (size_t i = 0; !kept && i < sizeof keep / sizeof keep[0]; i++)
            kept = strcmp(oi.name, keep[i]) == 0;
        if (!kept && sp_x_option_set(oi.name, NULL) != SP_SUCCESS)
            return false;
    }
    return true;
}

static bool replay_peaks(const tr_trace_t *t, int64_t (*peak)[3]) {
    char ndev[16], err[512];
    snprintf(ndev, sizeof ndev, "%d", t->ndev > 1 ? t->ndev : 1);
    if (sp_x_option_set("SYMPOOL_DEVICE", "host") != SP_SUCCESS ||
        sp_x_option_set("SYMPOOL_HOST_DEVICES", ndev) != SP_SUCCESS ||
        sp_x_option_set("SYMPOOL_HOST_ARENA", "1") != SP_SUCCESS ||
        sp_x_option_set("SYMPOOL_ALLOC_CONF", t->settings.recorded ? t->settings.conf : "") !=
            SP_SUCCESS ||
        !reset_allocator_options() || !replay_fit_capacity(t) ||
        !tr_settings_set_split(&t->settings))
        return false;
    /* A recording made with expandable segments was made under PyTorch's rules (replay re-enacts
     * it so too): with ours (pages of 2 MiB, recycling, borrowing) small requests went to the
     * large pool's segment, and the pools' peaks were not the recorded run's. */
    if (t->settings.recorded && t->settings.expandable && !replay_recorded_rules(t))
        return false;
    sp_x_log_set_fn(quiet, NULL);
    replay_result_t r;
    bool ok = sp_init() == SP_SUCCESS && replay_trace(t, NULL, &r, err, sizeof err) &&
              r.ooms == 0 && r.skipped_frees == 0 &&
              (uint64_t)r.end_allocated == r.pytorch_end_allocated;
    for (int d = 0; ok && d < t->ndev; d++) {
        sp_stats_t st;
        ok = sp_memory_stats(d, &st) == SP_SUCCESS;
        for (int p = 0; ok && p < 3; p++) {
            char key[64];
            snprintf(key, sizeof key, "allocated_bytes.%s.peak", k_pools[p]);
            ok = sp_stats_get(&st, key, &peak[d][p]) == SP_SUCCESS;
        }
    }
    (void)sp_shutdown();
    sp_x_log_set_fn(NULL, NULL);
    return ok;
}

static void to_stats(const dev_figs_t *d, sp_stats_t *st) {
    for (size_t i = 0; i < SP_STATS_MAX; i++)
        st->value[i] = SP_X_SUMMARY_UNKNOWN;
    for (int m = 0; m < M_TRACED; m++)
        for (int p = 0; p < 3; p++) {
            const fig_t *f = &d->f[m][p];
            set4(st, k_traced[m], p, f->end, f->peak, f->up, f->down);
        }
    for (int p = 0; p < 3; p++) {
        set(st, "allocated_bytes", k_pools[p], "current", d->allocated[p]);
        set(st, "active_bytes", k_pools[p], "current", d->active[p]);
        set(st, "active", k_pools[p], "current", d->active_n[p]);
        set(st, "inactive_split_bytes", k_pools[p], "current", d->split[p]);
        set(st, "inactive_split", k_pools[p], "current", d->split_n[p]);
    }
    set(st, "num_ooms", NULL, NULL, d->ooms);
    for (int p = 0; p < 3; p++)
        set(st, "allocated_bytes", k_pools[p], "peak", d->allocated_peak[p]);
}

static int usage(FILE *out, int rc) {
    fprintf(out,
            "usage: sympool summary SNAPSHOT [-d DEVICE]\n"
            "  The sp_memory_summary table of a PyTorch or sympool memory snapshot (.pickle or\n"
            "  .json): the state at the end from its segments; peaks and totals over the\n"
            "  recorded trace where the trace gives them (\"-\" where it cannot). The\n"
            "  allocated peak (a trace records requested sizes only) is a replay's, shown\n"
            "  when the replay ends with the snapshot's allocated bytes exactly.\n"
            "  -d, --device=N   only device N (default: every device)\n"
            "  -h, --help       this text\n");
    return rc;
}

int sp_cli_summary(int argc, char **argv) {
    static const struct option opts[] = {
        {"device", required_argument, NULL, 'd'}, {"help", no_argument, NULL, 'h'}, {0, 0, 0, 0}};
    long only = -1;
    const char *dev_given = NULL;
    int c;
    while ((c = cli_getopt(argc, argv, "summary", "d:h", opts)) != -1) {
        if (c == 'h')
            return usage(stdout, 0);
        if (c == 'd') {
            if (!cli_once("summary", "--device", &dev_given, optarg))
                return 2;
            if (!cli_parse_long(optarg, 0, 4095, &only)) {
                fprintf(stderr, "sympool summary: --device takes 0 to 4095, not '%s'\n", optarg);
                return 2;
            }
            continue;
        }
        return 2;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "sympool summary: %s\n",
                optind == argc ? "no snapshot given" : "give exactly one snapshot");
        return usage(stderr, 2);
    }
    const char *path = cli_input(argv[optind]);
    char err[512];
    tr_trace_t t;
    if (!tr_load(path, &t, err, sizeof(err))) {
        fprintf(stderr, "sympool summary: %s\n", err);
        tr_free(&t);
        return 1;
    }
    /* No device at all (no segments, no device traces): there is no table to print; it exited
     * 0 having printed nothing (plot says the same). */
    if (t.ndev == 0) {
        fprintf(stderr, "sympool summary: %s: the snapshot has no device\n", path);
        tr_free(&t);
        return 1;
    }
    if (only >= t.ndev) {
        fprintf(stderr, "sympool summary: %s has %d device%s; no device %ld\n", path, t.ndev,
                t.ndev == 1 ? "" : "s", only);
        tr_free(&t);
        return 1;
    }
    const pk_value_t *segments = t.root->type == PK_LIST ? t.root : pk_get(t.root, "segments");
    bool any_events = false;
    for (int dev = 0; dev < t.ndev; dev++)
        any_events = any_events || t.dev[dev].nev > 0;
    int64_t(*peaks)[3] = calloc(t.ndev > 0 ? (size_t)t.ndev : 1, sizeof *peaks);
    /* Settings PyTorch refuses cannot be replayed (replay refuses them): said, as info says it,
     * and the allocated peaks stay unknown. */
    if (any_events && t.settings.recorded && t.settings.invalid[0])
        fprintf(stderr,
                "sympool summary: note: %s: allocator_settings read as SYMPOOL_ALLOC_CONF='%s' "
                "are not valid: %s (PyTorch refuses them): the allocated peaks are not replayed\n",
                path, t.settings.conf, t.settings.invalid);
    /* Nor does a snapshot of more devices than a replay emulates (replay refuses it): the
     * option's refusal was logged, and the peaks left unknown without a word. */
    bool too_many = t.ndev > REPLAY_MAX_DEVICES;
    if (any_events && too_many && !t.settings.invalid[0])
        fprintf(stderr,
                "sympool summary: note: %s: the snapshot has %d devices and a replay emulates at "
                "most %d: the allocated peaks are not replayed\n",
                path, t.ndev, REPLAY_MAX_DEVICES);
    bool replayed = peaks != NULL && any_events && !t.settings.invalid[0] && !too_many &&
                    replay_peaks(&t, peaks);
    int rc = 0;
    for (int dev = 0; dev < t.ndev && rc == 0; dev++) {
        if (only >= 0 && dev != only)
            continue;
        dev_figs_t d;
        memset(&d, 0, sizeof(d));
        if (!read_segments(segments, dev, &d, err, sizeof(err))) {
            fprintf(stderr, "sympool summary: %s: %s\n", path, err);
            rc = 1;
            break;
        }
        if (!walk_trace(&t.dev[dev], &d)) {
            fprintf(stderr, "sympool summary: %s: out of memory\n", path);
            rc = 1;
            break;
        }
        for (int p = 0; p < 3; p++)
            d.allocated_peak[p] = t.dev[dev].nev == 0 ? d.allocated[p]
                                  : replayed          ? peaks[dev][p]
                                                      : SP_X_SUMMARY_UNKNOWN;
        sp_stats_t st;
        to_stats(&d, &st);
        char title[160], text[SP_MEMORY_SUMMARY_MAX];
        const char *base = strrchr(path, '/');
        snprintf(title, sizeof(title), "snapshot %.100s, device %d", base ? base + 1 : path, dev);
        sp_x_memory_summary_format(&st, title, text, sizeof(text));
        fputs(text, stdout);
    }
    free(peaks);
    tr_free(&t);
    return rc;
}
