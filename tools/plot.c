/*
 * plot.c: `sympool plot SNAPSHOT... -o OUT.svg [-d DEV]`: one SVG a person reads at a glance.
 *
 * One snapshot: requested bytes of live blocks (what a PyTorch trace records; the summary's
 * "Requested memory" row) and reserved bytes over time, the
 * peaks marked inside the frame, and the largest blocks live at the requested peak listed by
 * where they were allocated (the first telling stack frame; their size when no stack was
 * recorded) and drawn as lifetime bars under the chart.
 * Several snapshots (one per rank: `sympool plot out/rank*.pickle`): every rank's allocated
 * curve on one chart against the time since that rank's first event, the ranks with the highest
 * and the lowest peak drawn bold and labelled, and a table of every rank's peaks.
 *
 * The curves come from the trace (trace.c): allocated starts at the seeds' bytes and follows
 * alloc/free_requested; reserved starts at the value reconstructed backwards from the final
 * segments and follows the segment events. Each pixel column shows the maximum reached inside
 * it, so short peaks stay visible however long the trace. The axis unit follows the largest
 * value (GiB, MiB or KiB), so a small job reads "350 MiB", not "0.35 GiB". No globals, no lock.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sympool/experimental.h" /* sp_x_size_format, sp_x_file_write_atomic */
#include "tools/cli.h"

#define W 1200
#define H 745
#define PX0 90 /* plot area */
#define PX1 860
#define PY0 70
#define PY1 480
#define LANE0 545 /* lifetime lanes */
#define LANE_H 20
#define TOP_N 8
#define COLS (PX1 - PX0)

static const char *const colors[TOP_N] = {"#d62728", "#9467bd", "#8c564b", "#e377c2",
                                          "#2ca02c", "#bcbd22", "#17becf", "#7f7f7f"};

typedef struct live_block {
    uint64_t addr, size;      /* recorded address, requested bytes */
    size_t born, died;        /* event indexes; born = SIZE_MAX for seeds, died = nev if never */
    const pk_value_t *frames; /* where it was allocated, or NULL */
} live_block_t;

static int cmp_size_desc(const void *a, const void *b) {
    const live_block_t *x = a, *y = b;
    return x->size < y->size ? 1 : x->size > y->size ? -1 : 0;
}

/* Frames that say nothing about the caller: the capture machinery, allocator internals and the
 * interpreter loop (PyTorch's viewer hides most of the same). */
static bool boring(const char *name) {
    static const char *const words[] = {
        "unwind::unwind", "CapturedTraceback", "gather_with_cpp", "CachingAllocator",
        "_start",         "__libc_start_main", "PyEval_",         "PyObject_",
        "PyFunction_",    "sp_malloc",         "sp_torch_malloc", "sp_mempool_malloc"};
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        if (strstr(name, words[i]) != NULL)
            return true;
    return false;
}

/* Copy the identifier that ends just before `end` (letters, digits, '_') into out. */
static void word_before(const char *start, const char *end, char *out, size_t cap) {
    const char *b = end;
    while (b > start && (isalnum((unsigned char)b[-1]) || b[-1] == '_'))
        b--;
    snprintf(out, cap, "%.*s", (int)(end - b), b);
}

/* Room for a "where": an op and a node name of up to 95 bytes each with " in " between them, so
 * that no "op in node" is cut (an optimizing build proves that it fits). */
#define WHERE_CAP 200

/* A short "where" for a block: the first frame in the user's own Python code; else, for stacks
 * without Python (autograd's backward thread), the ATen op and the autograd node
 * ("aten::bmm in BmmBackward0"); else the first Python frame; else the first telling frame. */
static void where_of(const pk_value_t *frames, char *out, size_t cap) {
    const pk_value_t *user = NULL, *py = NULL, *first = NULL;
    char op[96] = "", node[96] = "";
    for (size_t i = 0; i < pk_len(frames); i++) {
        const pk_value_t *f = pk_at(frames, i);
        const char *file = pk_get_str(f, "filename"), *name = pk_get_str(f, "name");
        if (file == NULL || name == NULL || boring(name))
            continue;
        if (first == NULL)
            first = f;
        size_t n = strlen(file);
        if (n > 3 && strcmp(file + n - 3, ".py") == 0) {
            if (py == NULL)
                py = f;
            if (strstr(file, "site-packages") == NULL && strstr(file, "/torch/") == NULL) {
                user = f;
                break;
            }
        }
        const char *ops = strstr(name, "at::_ops::");
        if (op[0] == '\0' && ops != NULL) {
            const char *e = strstr(ops + 10, "::");
            if (e != NULL)
                snprintf(op, sizeof(op), "aten::%.*s", (int)(e - ops - 10), ops + 10);
        }
        const char *bw = strstr(name, "Backward");
        if (node[0] == '\0' && bw != NULL) {
            const char *e = bw + 8;
            while (isdigit((unsigned char)*e))
                e++;
            word_before(name, e, node, sizeof(node));
        }
    }
    const pk_value_t *pick = user != NULL ? user : NULL;
    if (pick == NULL && op[0] != '\0') {
        if (node[0] != '\0')
            snprintf(out, cap, "%s in %s", op, node);
        else
            snprintf(out, cap, "%s", op);
        return;
    }
    if (pick == NULL)
        pick = py != NULL ? py : first;
    if (pick == NULL) {
        out[0] = '\0'; /* no stack recorded: the caller names the block by its size */
        return;
    }
    const char *name = pk_get_str(pick, "name"), *file = pk_get_str(pick, "filename");
    const char *base = file ? strrchr(file, '/') : NULL;
    int64_t line = 0;
    /* C++ frames without a known line carry 0 or 2^64-1 (which pk_get_int refuses): no line. */
    if (pk_get_int(pick, "line", &line) && line > 0)
        snprintf(out, cap, "%s %s:%lld", name ? name : "?", base ? base + 1 : (file ? file : "?"),
                 (long long)line);
    else
        snprintf(out, cap, "%s %s", name ? name : "?", base ? base + 1 : (file ? file : "?"));
}

/* Log lines other than WARN pass to stderr (see the chart's write). */
static void drop_warning(int level, const char *line, void *arg) {
    (void)arg;
    if (level != SP_X_LOG_WARN)
        cli_log_line(line);
}

static void xml_text(FILE *f, const char *s, size_t max) {
    for (size_t i = 0; s[i] && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '<')
            fputs("&lt;", f);
        else if (c == '>')
            fputs("&gt;", f);
        else if (c == '&')
            fputs("&amp;", f);
        else if (c >= 0x20 && c < 0x7f)
            fputc(c, f);
        else
            fputc('?', f);
    }
}

static double nice_step(double range, int ticks) {
    double raw = range / ticks, p = pow(10.0, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static double gib(double b) {
    return b / 1073741824.0;
}

/* A size for people: "22.23 GiB", "512 B". */
static void human(double v, char *out, size_t cap) {
    sp_x_size_format(v, out, cap);
}

/* The y axis unit: the largest that keeps the top of the axis at 1 or more. */
typedef struct unit {
    const char *name;
    double bytes;
} unit_t;

static unit_t unit_for(double vmax) {
    if (vmax >= 1073741824.0)
        return (unit_t){"GiB", 1073741824.0};
    if (vmax >= 1048576.0)
        return (unit_t){"MiB", 1048576.0};
    if (vmax >= 1024.0)
        return (unit_t){"KiB", 1024.0};
    return (unit_t){"B", 1.0};
}

/* One snapshot's curves on one device. */
typedef struct series {
    const char *path;        /* as given */
    char label[64];          /* "rank 3" for rank3.pickle, else the file name */
    tr_trace_t t;            /* the loaded snapshot */
    int dev;                 /* the device plotted */
    const tr_device_t *d;    /* t.dev[dev] */
    bool use_time;           /* time_us present and increasing */
    double span;             /* time_us (or event index) from the first event to the last */
    double amax[COLS];       /* allocated, the maximum inside each pixel column */
    double rmax[COLS];       /* reserved, the same */
    double apeak, rpeak;     /* the peaks */
    size_t apeak_i, rpeak_i; /* the events where they were reached */
    bool apeak_at_start;     /* the requested peak is the state before the first event */
} series_t;

/* Where event i lies on the x axis, 0..1. With times, all series share one time scale (gspan,
 * microseconds) from their own first event; without, each spans the axis by event index. A
 * time out of order (before the first event's, after the last's: use_time compares only those
 * two) lies at the axis' end nearest to it: it was drawn off the chart, and its column, a
 * double past INT_MAX converted to int, was undefined behaviour. */
static double xfrac(const series_t *s, size_t i, double gspan, bool time_axis) {
    if (s->d->nev == 0)
        return 0;
    if (time_axis) {
        double x = gspan > 0 ? (double)(tr_time_us(s->d, i) - tr_time_us(s->d, 0)) / gspan : 0;
        return x < 0 ? 0 : x > 1 ? 1 : x;
    }
    return s->d->nev > 1 ? (double)i / (double)(s->d->nev - 1) : 0;
}

static void curves(series_t *s, double gspan, bool time_axis) {
    const tr_device_t *d = s->d;
    for (int c = 0; c < COLS; c++)
        s->amax[c] = s->rmax[c] = -1;
    double alloc = (double)d->seeded_bytes, resv = (double)d->start_reserved;
    s->apeak = alloc;
    s->rpeak = resv;
    s->apeak_at_start = true;
    for (size_t i = 0; i < d->nev; i++) {
        const tr_event_t *e = &d->ev[i];
        /* requested bytes as info, summary and replay count them (a held free until its
         * free_completed, as MemoryViz draws it too) */
        alloc += (double)tr_requested_delta(d, i);
        if (e->action == TR_SEGMENT_ALLOC || e->action == TR_SEGMENT_MAP)
            resv += (double)e->size;
        else if (e->action == TR_SEGMENT_FREE || e->action == TR_SEGMENT_UNMAP)
            resv -= (double)e->size;
        int c = (int)(xfrac(s, i, gspan, time_axis) * (COLS - 1) + 0.5);
        c = c < 0 ? 0 : c >= COLS ? COLS - 1 : c;
        s->amax[c] = fmax(s->amax[c], alloc);
        s->rmax[c] = fmax(s->rmax[c], resv);
        if (alloc > s->apeak) {
            s->apeak = alloc;
            s->apeak_i = i;
            s->apeak_at_start = false;
        }
        if (resv > s->rpeak) {
            s->rpeak = resv;
            s->rpeak_i = i;
        }
    }
    /* Columns without events keep the previous level; past a shorter series' end, -1 (none). */
    int last = d->nev ? (int)(xfrac(s, d->nev - 1, gspan, time_axis) * (COLS - 1) + 0.5) : 0;
    double la = (double)d->seeded_bytes, lr = (double)d->start_reserved;
    for (int c = 0; c < COLS; c++) {
        if (c > last && d->nev > 0) {
            s->amax[c] = s->rmax[c] = -1;
            continue;
        }
        if (s->amax[c] < 0)
            s->amax[c] = la;
        if (s->rmax[c] < 0)
            s->rmax[c] = lr;
        la = s->amax[c];
        lr = s->rmax[c];
    }
}

/* Requested above reserved in some column: the segments that held those blocks were made
 * before the recorded window, which a reader must be told rather than left to puzzle over. */
static bool partial_trace(const series_t *s) {
    for (int i = 0; i < COLS; i++)
        if (s->amax[i] > s->rmax[i])
            return true;
    return false;
}

/* Every rank drew the same curve: they overlap into one line, which the subtitle says. */
static bool same_curves(const series_t *s, size_t n) {
    for (size_t k = 1; k < n; k++)
        if (memcmp(s[k].amax, s[0].amax, sizeof s[0].amax) != 0)
            return false;
    return true;
}

/* "rank 3" for ".../rank3.pickle", else the file name without its extension. */
static void label_of(const char *path, char *out, size_t cap) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strncmp(base, "rank", 4) == 0 && isdigit((unsigned char)base[4])) {
        snprintf(out, cap, "rank %ld", strtol(base + 4, NULL, 10));
        return;
    }
    const char *dot = strrchr(base, '.');
    int n = dot && dot > base ? (int)(dot - base) : (int)strlen(base);
    snprintf(out, cap, "%.*s", n > 40 ? 40 : n, base);
}

/* The device to plot: the one asked for, else the first whose trace has events, else (a
 * snapshot of state only, such as the legacy segment list) the first holding segments. */
static bool pick_device(series_t *s, int asked, char *err, size_t errlen) {
    if (asked >= 0) {
        if (asked >= s->t.ndev) {
            snprintf(err, errlen, "%s: device %d not in the snapshot (%d device%s)", s->path, asked,
                     s->t.ndev, s->t.ndev == 1 ? "" : "s");
            return false;
        }
        s->dev = asked;
    } else {
        s->dev = -1;
        for (int d = 0; d < s->t.ndev && s->dev < 0; d++)
            if (s->t.dev[d].nev > 0)
                s->dev = d;
        /* Device 0 was chosen when no trace had events: an empty chart of a snapshot whose
         * segments are all on device 1. */
        for (int d = 0; d < s->t.ndev && s->dev < 0; d++)
            if (s->t.dev[d].final_reserved > 0)
                s->dev = d;
        if (s->dev < 0)
            s->dev = 0;
        if (s->t.ndev == 0) {
            snprintf(err, errlen, "%s: the snapshot has no device", s->path);
            return false;
        }
    }
    s->d = &s->t.dev[s->dev];
    const tr_device_t *d = s->d;
    s->use_time =
        d->nev > 0 && tr_time_us(d, 0) != 0 && tr_time_us(d, d->nev - 1) > tr_time_us(d, 0);
    s->span = s->use_time ? (double)(tr_time_us(d, d->nev - 1) - tr_time_us(d, 0))
                          : (double)(d->nev > 1 ? d->nev - 1 : 1);
    return true;
}

/* ---- drawing ---------------------------------------------------------------------------- */

typedef struct frame {
    double ytop; /* top of the y axis, in unit */
    unit_t unit; /* the y axis unit */
} frame_t;

static double ypix(const frame_t *fr, double bytes) {
    return PY1 - (bytes / fr->unit.bytes / fr->ytop) * (PY1 - PY0);
}

static void svg_open(FILE *f, int h) {
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"Helvetica,Arial,sans-serif\" font-size=\"13\">\n",
            W, h);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, h);
}

/* Grid, y labels in the frame's unit, x ticks and the frame itself. */
static frame_t axes(FILE *f, double vmax, double xrange, const char *xlabel) {
    frame_t fr;
    fr.unit = unit_for(vmax > 0 ? vmax : 1);
    double top = (vmax > 0 ? vmax : 1) / fr.unit.bytes;
    double ystep = nice_step(top, 6);
    fr.ytop = ceil(top / ystep - 1e-9) * ystep;
    for (int k = 0; k * ystep <= fr.ytop + 1e-9; k++) {
        double v = k * ystep, y = PY1 - v / fr.ytop * (PY1 - PY0);
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", PX0,
                PX1, y, y);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g %s</text>\n", PX0 - 8, y + 4,
                v, fr.unit.name);
    }
    double xstep = nice_step(xrange > 0 ? xrange : 1, 8);
    for (int k = 0; k * xstep <= xrange + 1e-9; k++) {
        double v = k * xstep, x = PX0 + (xrange > 0 ? v / xrange : 0) * (COLS - 1);
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#999\"/>\n", x, x,
                PY1, PY1 + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", x, PY1 + 19, v);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#444\">%s</text>\n",
            (PX0 + PX1) / 2, PY1 + 36, xlabel);
    return fr;
}

static void frame_box(FILE *f) {
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n",
            PX0, PY0, COLS, PY1 - PY0);
}

/* A marker and its label, kept inside the frame: left of the point in the right half, below it
 * near the top; *taken is the y of a label already there, to step around it. */
static void peak_label(FILE *f, double px, double py, const char *color, const char *text,
                       double *taken) {
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>\n", px, py, color);
    bool left = px > (PX0 + PX1) / 2.0;
    double x = left ? px - 8 : px + 8, y = py - 8;
    if (y < PY0 + 16)
        y = py + 18;
    if (*taken > 0 && fabs(y - *taken) < 16)
        y = *taken + 16 < PY1 - 4 ? *taken + 16 : *taken - 16;
    *taken = y;
    x = fmin(fmax(x, PX0 + 4), PX1 - 4);
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\" font-weight=\"bold\" text-anchor=\"%s\" "
            "stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\">",
            x, y, color, left ? "end" : "start");
    xml_text(f, text, 120);
    fprintf(f, "</text>\n");
}

static void area(FILE *f, const double *v, const char *fill, const char *stroke,
                 const frame_t *fr) {
    fprintf(f,
            "<path fill=\"%s\" fill-opacity=\"0.8\" stroke=\"%s\" stroke-width=\"1.2\" d=\"M%d %d",
            fill, stroke, PX0, PY1);
    int c = 0;
    for (; c < COLS && v[c] >= 0; c++)
        fprintf(f, " L%d %.1f", PX0 + c, ypix(fr, v[c]));
    fprintf(f, " L%d %d Z\"/>\n", PX0 + (c > 0 ? c - 1 : 0), PY1);
}

static void polyline(FILE *f, const double *v, const char *color, double width, const frame_t *fr) {
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" points=\"", color,
            width);
    for (int c = 0; c < COLS && v[c] >= 0; c++)
        fprintf(f, "%d,%.1f ", PX0 + c, ypix(fr, v[c]));
    fprintf(f, "\"/>\n");
}

/* ---- one snapshot --------------------------------------------------------------------------- */

typedef struct live_group {
    uint64_t size;         /* requested bytes of each block */
    char where[WHERE_CAP]; /* where they were allocated ("" = no stack recorded) */
    size_t n;              /* blocks */
} live_group_t;

/* Blocks live at the allocated peak that were allocated in the trace, largest first; the seeds
 * (usually the weights: many equal blocks) are only counted. Returns the list (caller frees). */
static live_block_t *live_at_peak(const series_t *s, size_t *m_p, size_t *nseed_p,
                                  uint64_t *seed_bytes_p) {
    const tr_device_t *d = s->d;
    size_t nev = d->nev, nlive = 0;
    live_block_t *live = calloc(d->nseeds + nev + 1, sizeof(*live));
    tr_map_t where = {0};
    if (live == NULL)
        return NULL;
    for (size_t k = 0; k < d->nseeds; k++) {
        live[nlive] =
            (live_block_t){d->seeds[k].addr, d->seeds[k].size, SIZE_MAX, nev, d->seeds[k].frames};
        (void)tr_map_put(&where, d->seeds[k].addr, nlive + 1);
        nlive++;
    }
    for (size_t i = 0; i < nev; i++) {
        const tr_event_t *e = &d->ev[i];
        uintptr_t k;
        if (e->action == TR_ALLOC) {
            live[nlive] = (live_block_t){e->addr, e->size, i, nev, tr_frames(d, i)};
            (void)tr_map_put(&where, e->addr, nlive + 1);
            nlive++;
        } else if (tr_requested_delta(d, i) < 0 && tr_map_del(&where, e->addr, &k)) {
            live[k - 1].died = i; /* its requested bytes go (a held free: at its completion) */
        }
    }
    tr_map_free(&where);
    size_t m = 0, nseed = 0;
    uint64_t seed_bytes = 0;
    for (size_t i = 0; i < nlive; i++) {
        /* At a peak before the first event only the blocks live then were (apeak_i is 0 there,
         * which read as "after event 0": a block that event freed was left out of the peak). */
        if (s->apeak_at_start ? live[i].born != SIZE_MAX : live[i].died <= s->apeak_i)
            continue;
        if (live[i].born == SIZE_MAX) {
            nseed++;
            seed_bytes += live[i].size;
        } else if (live[i].born <= s->apeak_i) {
            live[m++] = live[i];
        }
    }
    qsort(live, m, sizeof(*live), cmp_size_desc);
    *m_p = m;
    *nseed_p = nseed;
    *seed_bytes_p = seed_bytes;
    return live;
}

#define MAX_GROUPS 64

/* Blocks of one size from one place make one line ("96 blocks of 50.0 MiB"). The blocks come
 * largest first, so the groups do too; group_of[i] is block i's group, or -1 past MAX_GROUPS. */
static size_t group_blocks(const live_block_t *live, size_t m, live_group_t *g, int *group_of) {
    size_t ng = 0;
    for (size_t i = 0; i < m; i++) {
        char w[WHERE_CAP];
        where_of(live[i].frames, w, sizeof(w));
        group_of[i] = -1;
        for (size_t k = 0; k < ng && group_of[i] < 0; k++)
            if (g[k].size == live[i].size && strcmp(g[k].where, w) == 0)
                group_of[i] = (int)k;
        if (group_of[i] < 0 && ng < MAX_GROUPS) {
            g[ng].size = live[i].size;
            snprintf(g[ng].where, sizeof(g[ng].where), "%s", w);
            g[ng].n = 0;
            group_of[i] = (int)ng++;
        }
        if (group_of[i] >= 0)
            g[group_of[i]].n++;
    }
    return ng;
}

static int render_single(FILE *f, series_t *s) {
    const tr_device_t *d = s->d;
    size_t nev = d->nev, m = 0, nseed = 0;
    uint64_t seed_bytes = 0;
    live_block_t *live = live_at_peak(s, &m, &nseed, &seed_bytes);
    if (live == NULL)
        return -1;
    /* The blocks' stacks are what the chart reads (group_blocks): one the pickle's memo repeats
     * past what the file could hold (a 173 KB file took 20 s here) is refused (1: said). */
    const pk_value_t **stacks = calloc(m ? m : 1, sizeof(*stacks));
    char why[512];
    if (stacks == NULL) {
        free(live);
        return -1;
    }
    for (size_t i = 0; i < m; i++)
        stacks[i] = live[i].frames;
    bool fit = tr_stacks_fit(&s->t, stacks, m, s->path, why, sizeof why);
    free(stacks);
    if (!fit) {
        fprintf(stderr, "sympool plot: %s\n", why);
        free(live);
        return 1;
    }
    live_group_t groups[MAX_GROUPS];
    int *group_of = calloc(m ? m : 1, sizeof(*group_of));
    if (group_of == NULL) {
        free(live);
        return -1;
    }
    size_t ng = group_blocks(live, m, groups, group_of);
    if (ng > TOP_N)
        ng = TOP_N;
    char a[32], r[32];
    human(s->apeak, a, sizeof a);
    human(s->rpeak, r, sizeof r);

    svg_open(f, H);
    fprintf(f,
            "<text x=\"%d\" y=\"30\" font-size=\"18\" font-weight=\"bold\">Memory timeline: ", PX0);
    const char *base = strrchr(s->path, '/');
    xml_text(f, base ? base + 1 : s->path, 120);
    fprintf(f, " (device %d)</text>\n", s->dev);
    fprintf(f,
            "<text x=\"%d\" y=\"52\" fill=\"#444\">%zu events, %zu segments at the end; "
            "peak requested %s, peak reserved %s</text>\n",
            PX0, nev, s->d->final_segments, a, r);
    if (partial_trace(s))
        fprintf(f,
                "<text x=\"%d\" y=\"66\" font-size=\"12\" fill=\"#b00\">a partial trace: requested "
                "rises above reserved, so the trace lacks segment events from before its "
                "window (recording began late, or the ring buffer dropped them)</text>\n",
                PX0);
    frame_t fr = axes(f, fmax(s->apeak, s->rpeak), s->use_time ? s->span / 1e6 : s->span,
                      s->use_time ? "time since the first event (s)" : "event");
    const char *fills[2] = {"#fdd0a2", "#9ecae1"}, *strokes[2] = {"#e6550d", "#3182bd"};
    area(f, s->rmax, fills[0], strokes[0], &fr);
    area(f, s->amax, fills[1], strokes[1], &fr);
    frame_box(f);
    /* the allocated peak, through the chart and the lanes */
    double xp = PX0 + xfrac(s, s->apeak_i, s->span, s->use_time) * (COLS - 1);
    if (nev > 0)
        fprintf(f,
                "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#3182bd\" "
                "stroke-dasharray=\"4 3\"/>\n",
                xp, xp, PY0, LANE0 + 20 + TOP_N * LANE_H);
    double taken = 0;
    char text[96];
    snprintf(text, sizeof text, "peak reserved %s", r);
    peak_label(f, PX0 + xfrac(s, s->rpeak_i, s->span, s->use_time) * (COLS - 1),
               ypix(&fr, s->rpeak), strokes[0], text, &taken);
    snprintf(text, sizeof text, "peak requested %s", a);
    peak_label(f, xp, ypix(&fr, s->apeak), strokes[1], text, &taken);

    /* legend and the largest blocks, named by where they were allocated */
    int lx = PX1 + 25, ly = PY0 + 5;
    for (int k = 0; k < 2; k++) {
        fprintf(f,
                "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\" stroke=\"%s\"/>\n",
                lx, ly + k * 22, fills[k], strokes[k]);
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", lx + 22, ly + 12 + k * 22,
                k == 0 ? "reserved (segments)" : "requested (live allocations)");
    }
    ly += 64;
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">Live at the requested peak</text>\n",
            lx, ly);
    human((double)seed_bytes, a, sizeof a);
    fprintf(f, "<text x=\"%d\" y=\"%d\">%s in %zu blocks from before the trace</text>\n", lx,
            ly + 22, a, nseed);
    human(s->apeak - (double)seed_bytes, a, sizeof a);
    fprintf(f, "<text x=\"%d\" y=\"%d\">%s in %zu blocks allocated in the trace;</text>\n", lx,
            ly + 40, a, m);
    fprintf(f, "<text x=\"%d\" y=\"%d\">the largest:</text>\n", lx, ly + 56);
    ly += 56;
    for (size_t b = 0; b < ng; b++) {
        int y = ly + 22 + (int)b * 36;
        human((double)groups[b].size, a, sizeof a);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>\n", lx, y - 9,
                colors[b]);
        if (groups[b].n > 1)
            fprintf(f, "<text x=\"%d\" y=\"%d\">%zu blocks of %s</text>\n", lx + 16, y, groups[b].n,
                    a);
        else
            fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", lx + 16, y, a);
        fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#555\" font-size=\"11\">", lx + 16, y + 14);
        xml_text(f, groups[b].where[0] ? groups[b].where : "(no stack recorded)", 50);
        fprintf(f, "</text>\n");
    }
    /* lifetime lanes: one per group, every block of the group in it */
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">Lifetimes of the largest blocks live at "
            "the requested peak (dashed)</text>\n",
            PX0, LANE0 + 10);
    for (size_t b = 0; b < ng; b++) {
        int y = LANE0 + 20 + (int)b * LANE_H;
        for (size_t k = 0; k < m; k++) {
            if (group_of[k] != (int)b)
                continue;
            double xa = xfrac(s, live[k].born, s->span, s->use_time);
            double xb = live[k].died >= nev ? 1 : xfrac(s, live[k].died, s->span, s->use_time);
            fprintf(f,
                    "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" "
                    "fill-opacity=\"%.2f\"/>\n",
                    PX0 + xa * (COLS - 1), y, fmax(2.0, (xb - xa) * (COLS - 1)), LANE_H - 6,
                    colors[b], groups[b].n > 1 ? 0.45 : 1.0);
        }
        /* The size left of the lane, the count right of it: "12.50 MiB x128" in one label
         * would run past the left edge of the picture. */
        human((double)groups[b].size, a, sizeof a);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"11\">%s</text>\n",
                PX0 - 8, y + 11, a);
        if (groups[b].n > 1)
            fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\">x%zu</text>\n", PX1 + 6, y + 11,
                    groups[b].n);
    }
    fprintf(f, "</svg>\n");
    free(group_of);
    free(live);
    return 0;
}

/* ---- several snapshots ---------------------------------------------------------------------- */

#define MH 600 /* height of the several-ranks chart */

static int render_multi(FILE *f, series_t *s, size_t n, size_t hi, size_t lo, bool time_axis,
                        double gspan) {
    double vmax = 0;
    for (size_t k = 0; k < n; k++)
        vmax = fmax(vmax, s[k].apeak);
    char a[32], b[32];
    human(s[hi].apeak, a, sizeof a);
    human(s[lo].apeak, b, sizeof b);
    bool same = s[hi].apeak == s[lo].apeak; /* no max or min rank to mark */
    svg_open(f, MH);
    fprintf(f,
            "<text x=\"%d\" y=\"30\" font-size=\"18\" font-weight=\"bold\">Memory timeline: %zu "
            "ranks</text>\n",
            PX0, n);
    fprintf(f, "<text x=\"%d\" y=\"52\" fill=\"#444\">requested bytes of every rank; ", PX0);
    if (same && same_curves(s, n)) {
        fprintf(f,
                "every rank peaks at %s, and every rank's curve is the same: one line for %zu "
                "ranks</text>\n",
                a, n);
    } else if (same) {
        fprintf(f, "every rank peaks at %s</text>\n", a);
    } else {
        fprintf(f, "highest peak: ");
        xml_text(f, s[hi].label, 40);
        fprintf(f, " %s, lowest peak: ", a);
        xml_text(f, s[lo].label, 40);
        fprintf(f, " %s</text>\n", b);
    }
    frame_t fr = axes(f, vmax, time_axis ? gspan / 1e6 : 100,
                      time_axis ? "time since each rank's first event (s)"
                                : "progress through each rank's trace (%)");
    for (size_t k = 0; k < n; k++)
        if (k != hi && k != lo)
            polyline(f, s[k].amax, "#b0b0b0", 1.0, &fr);
    polyline(f, s[lo].amax, "#1f77b4", 2.5, &fr);
    polyline(f, s[hi].amax, "#d62728", 2.5, &fr);
    frame_box(f);
    double taken = 0;
    char text[128];
    if (same)
        snprintf(text, sizeof text, "every rank: peak %s", a);
    else
        snprintf(text, sizeof text, "%s: peak %s (max)", s[hi].label, a);
    peak_label(f, PX0 + xfrac(&s[hi], s[hi].apeak_i, gspan, time_axis) * (COLS - 1),
               ypix(&fr, s[hi].apeak), "#d62728", text, &taken);
    if (!same) {
        snprintf(text, sizeof text, "%s: peak %s (min)", s[lo].label, b);
        peak_label(f, PX0 + xfrac(&s[lo], s[lo].apeak_i, gspan, time_axis) * (COLS - 1),
                   ypix(&fr, s[lo].apeak), "#1f77b4", text, &taken);
    }
    /* the ranks by peak, highest first */
    size_t order[64], shown = 0;
    bool used[4096] = {false};
    size_t want = n < 16 ? n : 15;
    while (shown < want) {
        size_t best = SIZE_MAX;
        for (size_t k = 0; k < n && k < 4096; k++)
            if (!used[k] && (best == SIZE_MAX || s[k].apeak > s[best].apeak))
                best = k;
        if (best == SIZE_MAX)
            break;
        used[best] = true;
        order[shown++] = best;
    }
    int lx = PX1 + 25, ly = PY0 + 12;
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">Peak requested / reserved</text>\n",
            lx, ly);
    for (size_t j = 0; j < shown; j++) {
        const series_t *r = &s[order[j]];
        human(r->apeak, a, sizeof a);
        human(r->rpeak, b, sizeof b);
        bool is_hi = !same && order[j] == hi, is_lo = !same && order[j] == lo;
        const char *color = is_hi ? "#d62728" : is_lo ? "#1f77b4" : "#333";
        /* 12 px: a GiB row with (max) at the default size runs past the picture's right edge. */
        fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"%s\" font-size=\"12\">", lx,
                ly + 22 + (int)j * 18, color);
        xml_text(f, r->label, 18);
        fprintf(f, ": %s / %s%s</text>\n", a, b, is_hi ? " (max)" : is_lo ? " (min)" : "");
    }
    if (shown < n) {
        human(s[lo].apeak, a, sizeof a);
        human(s[lo].rpeak, b, sizeof b);
        fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#444\">... %zu more; lowest: </text>\n", lx,
                ly + 22 + (int)shown * 18, n - shown);
        fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#1f77b4\" font-size=\"12\">", lx,
                ly + 40 + (int)shown * 18);
        xml_text(f, s[lo].label, 18);
        fprintf(f, ": %s / %s (min)</text>\n", a, b);
    }
    fprintf(f, "</svg>\n");
    return 0;
}

/* ---- the command ------------------------------------------------------------------------ */

#define MAX_SNAPSHOTS 1024

/* Whether inputs in[0..n) name one pipe, FIFO or other stream twice ("- -", "- /dev/stdin", a
 * FIFO given twice): else false after saying which. Such a stream is read once: the second
 * read of a pipe found it empty ("pickle: empty input"), and the second open of a FIFO whose
 * writer had finished waited for another writer forever. stat opens nothing, so a FIFO is not
 * waited on here. */
static bool streams_once(char *const *in, size_t n) {
    for (size_t i = 1; i < n; i++) {
        struct stat a, b;
        if (stat(in[i], &a) != 0 || S_ISREG(a.st_mode) || S_ISDIR(a.st_mode))
            continue;
        for (size_t k = 0; k < i; k++)
            if (stat(in[k], &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
                fprintf(stderr,
                        "sympool plot: %s (snapshot %zu) and %s (snapshot %zu) are one %s, which "
                        "is read once: give it once\n",
                        in[k], k + 1, in[i], i + 1,
                        S_ISFIFO(a.st_mode) ? "pipe or FIFO" : "stream");
                return false;
            }
    }
    return true;
}

static int usage(FILE *out, int rc) {
    fprintf(
        out,
        "usage: sympool plot SNAPSHOT... -o OUT.svg [-d DEVICE]\n"
        "  The memory timeline of a snapshot (.pickle or .json) as an SVG. With several\n"
        "  snapshots (one per rank, e.g. out/rank*.pickle), every rank's requested curve on\n"
        "  one chart, the ranks with the highest and lowest peak marked.\n"
        "  -o, --output=OUT.svg   the chart (SVG; for PNG: rsvg-convert -o OUT.png OUT.svg);\n"
        "                         %%h, %%p, %%r in OUT are the host, pid and rank (0 outside a\n"
        "                         launcher), %%%% a %%, as replay --snapshot and the library\n"
        "                         expand them\n"
        "  -d, --device=N         the device to plot (default: the first with events, else\n"
        "                         the first with segments)\n"
        "  -h, --help             this text\n");
    return rc;
}

int sp_cli_plot(int argc, char **argv) {
    static const struct option opts[] = {{"output", required_argument, NULL, 'o'},
                                         {"device", required_argument, NULL, 'd'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0, 0, 0, 0}};
    const char *out = NULL, *dev_given = NULL;
    int dev = -1, opt;
    long n;
    while ((opt = cli_getopt(argc, argv, "plot", "o:d:h", opts)) != -1) {
        if (opt == 'h')
            return usage(stdout, 0);
        if (opt == 'o') {
            if (!cli_once("plot", "--output", &out, optarg))
                return 2;
        } else if (opt == 'd') {
            if (!cli_once("plot", "--device", &dev_given, optarg))
                return 2;
            if (!cli_parse_long(optarg, 0, 4095, &n)) {
                fprintf(stderr, "sympool plot: --device takes 0 to 4095, not '%s'\n", optarg);
                return 2;
            }
            dev = (int)n;
        } else {
            return 2;
        }
    }
    size_t nin = (size_t)(argc - optind);
    if (nin == 0 || out == NULL) {
        fprintf(stderr, "sympool plot: %s\n",
                nin == 0 ? "no snapshot given" : "no -o OUT.svg given");
        return usage(stderr, 2);
    }
    if (!cli_has_suffix(out, ".svg")) {
        fprintf(stderr,
                "sympool plot: writes SVG only, not '%s'; use -o OUT.svg (and for a PNG: "
                "rsvg-convert -o OUT.png OUT.svg)\n",
                out);
        return 2;
    }
    /* The file OUT names, %h, %p, %r expanded as replay --snapshot expands its OUT: from here on,
     * out is that file (checked, compared with the inputs, written, reported). */
    char out_file[4096];
    if (!cli_output_path(out, out_file, sizeof out_file)) {
        fprintf(stderr, "sympool plot: -o %s: %s (it expands to more than %zu bytes)\n", out,
                strerror(ENAMETOOLONG), sizeof out_file - 1);
        return 1;
    }
    out = out_file;
    if (!cli_output_not_log("plot", "-o", out))
        return 2;
    if (!cli_output_ok("plot", "-o", out))
        return 1;
    for (int i = optind; i < argc; i++)
        argv[i] = (char *)cli_input(argv[i]); /* the readers never write through it */
    for (int i = optind; i < argc; i++)
        if (cli_same_file(argv[i], out)) {
            fprintf(stderr,
                    "sympool plot: -o %s is the snapshot %s; it would be replaced: write the "
                    "chart elsewhere\n",
                    out, argv[i]);
            return 2;
        }
    if (nin > MAX_SNAPSHOTS) {
        fprintf(stderr, "sympool plot: at most %d snapshots\n", MAX_SNAPSHOTS);
        return 2;
    }
    if (!streams_once(argv + optind, nin))
        return 2;
    series_t *s = calloc(nin, sizeof(*s));
    if (s == NULL) {
        fprintf(stderr, "sympool plot: out of memory\n");
        return 1;
    }
    int rc = 0;
    char err[512];
    size_t loaded = 0;
    for (; loaded < nin && rc == 0; loaded++) {
        series_t *x = &s[loaded];
        x->path = argv[optind + (int)loaded];
        label_of(x->path, x->label, sizeof x->label);
        if (!tr_load(x->path, &x->t, err, sizeof(err)) || !pick_device(x, dev, err, sizeof(err))) {
            fprintf(stderr, "sympool plot: %s\n", err);
            rc = 1;
        }
    }
    /* One time scale when every snapshot has times; else each spans the axis. */
    bool time_axis = true;
    double gspan = 0;
    for (size_t k = 0; rc == 0 && k < nin; k++) {
        time_axis &= s[k].use_time;
        gspan = fmax(gspan, s[k].span);
    }
    size_t hi = 0, lo = 0;
    for (size_t k = 0; rc == 0 && k < nin; k++) {
        curves(&s[k], nin == 1 ? s[k].span : gspan, nin == 1 ? s[k].use_time : time_axis);
        if (s[k].apeak > s[hi].apeak)
            hi = k;
        if (s[k].apeak < s[lo].apeak)
            lo = k;
    }
    /* Rendered in memory, then written next to OUT and renamed over it: a full disk leaves the
     * previous chart whole, and a FIFO or directory at OUT is refused instead of blocking. */
    char *svg = NULL;
    size_t svg_len = 0;
    FILE *f = rc == 0 ? open_memstream(&svg, &svg_len) : NULL;
    if (rc == 0 && f == NULL) {
        fprintf(stderr, "sympool plot: cannot render %s: %s\n", out, strerror(errno));
        rc = 1;
    }
    if (f != NULL) {
        int r =
            nin == 1 ? render_single(f, &s[0]) : render_multi(f, s, nin, hi, lo, time_axis, gspan);
        bool closed = fclose(f) == 0;
        if (r > 0) {
            rc = 1; /* said (render_single) */
        } else if (!closed || r != 0) {
            fprintf(stderr, "sympool plot: rendering %s failed (out of memory)\n", out);
            rc = 1;
        } else {
            /* A chart that cannot be written is said once, in our error line: sympool's WARN
             * line of the same failure is held back. */
            cli_log_open();
            sp_x_log_set_fn(drop_warning, NULL);
            sp_status_t st = sp_x_file_write_atomic(out, svg, svg_len);
            sp_x_log_set_fn(NULL, NULL);
            if (st != SP_SUCCESS) {
                fprintf(stderr, "sympool plot: %s (%s is unchanged)\n", sp_last_error(), out);
                rc = 1;
            }
        }
    }
    free(svg);
    if (rc == 0 && nin == 1 && partial_trace(&s[0]))
        printf("note: a partial trace: requested rises above reserved (segment events from "
               "before the recorded window are missing)\n");
    if (rc == 0 && nin == 1)
        printf("wrote %s (device %d: %zu events, peak requested %.3f GiB, peak reserved %.3f "
               "GiB)\n",
               out, s[0].dev, s[0].d->nev, gib(s[0].apeak), gib(s[0].rpeak));
    else if (rc == 0 && s[hi].apeak == s[lo].apeak)
        printf("wrote %s (%zu snapshots; every one peaks at %.3f GiB requested)\n", out, nin,
               gib(s[hi].apeak));
    else if (rc == 0)
        printf("wrote %s (%zu snapshots; highest peak requested: %s %.3f GiB, lowest: %s %.3f "
               "GiB)\n",
               out, nin, s[hi].label, gib(s[hi].apeak), s[lo].label, gib(s[lo].apeak));
    for (size_t k = 0; k < loaded; k++)
        tr_free(&s[k].t);
    free(s);
    return rc;
}
