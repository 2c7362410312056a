/*
 * summary.c: sp_memory_summary, a readable table of one device's statistics in the manner of
 * torch.cuda.memory_summary(): a heading with the OOM and retry counts, then per metric a row
 * for all pools and one each for the large and small pool, with the current value, the peak,
 * the total allocated and the total freed. Sizes are shown in the unit that keeps them below
 * 1024 (B, KiB, MiB, GiB, TiB), counts as integers.
 *
 * sp_memory_summary adds the device's own view (sp_device_usage): memory in use by anyone, what
 * sympool holds of it, and the rest, which no statistics key shows.
 *
 * The figures are one copy taken by sp_memory_stats under the device lock; formatting happens
 * on that copy without any lock. The writer works like snprintf: it counts what it would write
 * and stores only what fits, so truncation is never an error.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "sympool/pool.h"
#include "sympool/experimental.h"
#include "sympool/summary.h"

#define WIDTH 75 /* characters between the outer bars, as PyTorch's table */

typedef struct out {
    char *buf;  /* destination, always terminated */
    size_t len; /* its size in bytes (> 0) */
    size_t pos; /* characters the whole text has so far, stored or not */
} out_t;

static void put(out_t *o, const char *fmt, ...) SP_PRINTF(2, 3);
static void put(out_t *o, const char *fmt, ...) {
    size_t room = o->pos < o->len ? o->len - o->pos : 0;
    char scratch[1];
    va_list ap;
    va_start(ap, fmt);
    /* Past the end, vsnprintf only measures (a 1-byte scratch keeps the call well defined). */
    int n = room ? vsnprintf(o->buf + o->pos, room, fmt, ap) : vsnprintf(scratch, 0, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->pos += (size_t)n;
}

static void rule(out_t *o, char c) {
    char line[WIDTH + 1];
    memset(line, c, WIDTH);
    line[WIDTH] = '\0';
    put(o, "|%s|\n", line);
}

static int64_t value(const sp_stats_t *st, const char *metric, const char *pool,
                     const char *field) {
    char key[96];
    int64_t v = 0;
    /* "metric.pool.field", "metric.field" (oversize) or "metric" (the scalars) */
    snprintf(key, sizeof(key), "%s%s%s%s%s", metric, pool ? "." : "", pool ? pool : "",
             field ? "." : "", field ? field : "");
    if (sp_stats_get(st, key, &v) != SP_SUCCESS)
        return 0; /* cannot happen for the keys below; a missing figure reads 0 */
    return v;
}

/* A size in a 10-character cell ("-" for a figure the source cannot give). */
static void size_cell(int64_t v, char *cell, size_t cap) {
    if (v == SP_X_SUMMARY_UNKNOWN)
        snprintf(cell, cap, "%6s    ", "-");
    else
        sp__size_format((double)v, SP_SIZE_CELL, cell, cap);
}

static void count_cell(int64_t v, char *cell, size_t cap) {
    if (v == SP_X_SUMMARY_UNKNOWN)
        snprintf(cell, cap, "%10s", "-");
    else
        snprintf(cell, cap, "%10" PRId64, v);
}

/* "label: N" for the heading, "-" for an unknown figure. */
static void labelled(char *out, size_t cap, const char *label, int64_t v) {
    char n[24];
    count_cell(v, n, sizeof(n));
    snprintf(out, cap, "%s: %s", label, n + strspn(n, " "));
}

typedef struct metric {
    const char *key;   /* PyTorch's stat array name */
    const char *label; /* row label */
    int is_size;       /* bytes (1) or a count (0) */
} metric_t;

static const metric_t k_metrics[] = {
    {"allocated_bytes", "Allocated memory", 1},
    {"active_bytes", "Active memory", 1},
    {"requested_bytes", "Requested memory", 1},
    {"reserved_bytes", "Reserved memory", 1},
    {"inactive_split_bytes", "Non-releasable memory", 1},
    {"allocation", "Allocations", 0},
    {"active", "Active allocs", 0},
    {"segment", "Reserved segments", 0},
    {"inactive_split", "Non-releasable allocs", 0},
};

static void row(out_t *o, const sp_stats_t *st, const char *label, const char *metric,
                const char *pool, int is_size) {
    static const char *const fields[4] = {"current", "peak", "allocated", "freed"};
    put(o, "| %-21s |", label);
    for (int f = 0; f < 4; f++) {
        char cell[32];
        int64_t v = value(st, metric, pool, fields[f]);
        if (is_size)
            size_cell(v, cell, sizeof(cell));
        else
            count_cell(v, cell, sizeof(cell));
        put(o, " %10s |", cell);
    }
    put(o, "\n");
}

static void heading(out_t *o, const sp_stats_t *st, const char *title) {
    int tl = (int)strlen(title);
    int left = tl < WIDTH ? (WIDTH - tl) / 2 : 0;
    int right = tl < WIDTH ? WIDTH - tl - left : 0;
    rule(o, '=');
    put(o, "|%*s%s%*s|\n", left, "", title, right, "");
    rule(o, '-');
    char a[40], b[40], c[40];
    labelled(a, sizeof(a), "OOMs", value(st, "num_ooms", NULL, NULL));
    labelled(b, sizeof(b), "alloc retries", value(st, "num_alloc_retries", NULL, NULL));
    labelled(c, sizeof(c), "stream syncs", value(st, "num_sync_all_streams", NULL, NULL));
    put(o, "| %-23s| %-23s| %-24s|\n", a, b, c);
    int64_t split = value(st, "max_split_size", NULL, NULL);
    char d[40], e[40], f[40];
    labelled(d, sizeof(d), "device mallocs", value(st, "num_device_alloc", NULL, NULL));
    labelled(e, sizeof(e), "device frees", value(st, "num_device_free", NULL, NULL));
    if (split < 0 && split != SP_X_SUMMARY_UNKNOWN)
        snprintf(f, sizeof(f), "max split: unlimited");
    else {
        char cell[32];
        size_cell(split, cell, sizeof(cell));
        snprintf(f, sizeof(f), "max split: %s", cell + strspn(cell, " "));
    }
    put(o, "| %-23s| %-23s| %-24s|\n", d, e, f);
    rule(o, '=');
    put(o, "| %-21s | %10s | %10s | %10s | %10s |\n", "Metric", "Cur Usage", "Peak Usage",
        "Tot Alloc", "Tot Freed");
}

SP_EXPORT size_t sp_x_memory_summary_format(const sp_stats_t *st, const char *title, char *buf,
                                            size_t len) {
    /* Bad arguments measure or read as nothing rather than crash: no buffer measures only (as
     * snprintf(NULL, 0) does), no title is an empty one, no statistics are zeros. */
    static const sp_stats_t zeros;
    if (!buf)
        len = 0;
    if (!title)
        title = "";
    if (!st)
        st = &zeros;
    out_t o = {buf, len, 0};
    if (len > 0)
        buf[0] = '\0';
    heading(&o, st, title);
    for (size_t i = 0; i < sizeof(k_metrics) / sizeof(k_metrics[0]); i++) {
        const metric_t *m = &k_metrics[i];
        rule(&o, '-');
        row(&o, st, m->label, m->key, "all", m->is_size);
        row(&o, st, "      from large pool", m->key, "large_pool", m->is_size);
        row(&o, st, "      from small pool", m->key, "small_pool", m->is_size);
    }
    rule(&o, '-');
    row(&o, st, "Oversize allocations", "oversize_allocations", NULL, 0);
    row(&o, st, "Oversize segments", "oversize_segments", NULL, 0);
    rule(&o, '=');
    return o.pos;
}

SP_EXPORT sp_status_t sp_memory_summary(int device, char *buf, size_t len) {
    /* Its own refusal: the one sp_memory_stats gives below would name sp_memory_stats. */
    if (sp__in_callback())
        return sp__callback_refused("sp_memory_summary");
    SP_ARG_CHECK(buf != NULL, SP_SUB_POOL, "sp_memory_summary: buf is NULL");
    SP_ARG_CHECK(len > 0, SP_SUB_POOL, "sp_memory_summary: len is 0 (no room for the terminator)");
    sp_stats_t st;
    SP_CHECK(sp_memory_stats(device, &st)); /* unknown device: buf stays unchanged */
    char title[96];
    snprintf(title, sizeof(title), "sympool memory summary, device %d (%s backend)", device,
             sp_backend_name());
    size_t pos = sp_x_memory_summary_format(&st, title, buf, len);
    /* What the device itself says, next to what sympool holds: memory sympool did not reserve
     * (NCCL's buffers, other libraries and processes) shows nowhere else. */
    sp_device_usage_t u;
    if (sp_device_usage(device, &u) == SP_SUCCESS) {
        out_t o = {buf, len, pos};
        static const char *const labels[3] = {"Device used (anyone)", "  held by sympool",
                                              "  not sympool's"};
        size_t v[3] = {u.used, u.reserved, u.untracked};
        for (int i = 0; i < 3; i++) {
            char cell[32];
            size_cell((int64_t)v[i], cell, sizeof(cell));
            put(&o, "| %-21s | %10s | %10s | %10s | %10s |\n", labels[i], cell, "-", "-", "-");
        }
        rule(&o, '=');
    }
    return SP_SUCCESS;
}
