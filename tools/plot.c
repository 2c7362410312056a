/*
 * plot.c: `sympool plot SNAPSHOT -o OUT.svg [-d DEV]`: one SVG a person reads at a glance:
 * allocated (requested bytes of live blocks) and reserved bytes over time for one device, the
 * peaks marked, and the largest blocks live at the allocated peak listed with where they were
 * allocated and drawn as lifetime bars under the chart.
 *
 * The curves come from the trace (trace.c): allocated starts at the seeds' bytes and follows
 * alloc/free_requested; reserved starts at the value reconstructed backwards from the final
 * segments and follows the segment events. Each pixel column shows the maximum reached inside
 * it, so short peaks stay visible however long the trace. No globals, no lock.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        snprintf(out, cap, "(no stack recorded)");
        return;
    }
    const char *name = pk_get_str(pick, "name"), *file = pk_get_str(pick, "filename");
    const char *base = file ? strrchr(file, '/') : NULL;
    int64_t line = 0;
    (void)pk_get_int(pick, "line", &line);
    snprintf(out, cap, "%s %s:%lld", name ? name : "?", base ? base + 1 : (file ? file : "?"),
             (long long)line);
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

static int usage(FILE *out, int rc) {
    fprintf(out, "usage: sympool plot SNAPSHOT -o OUT.svg [-d DEVICE]\n"
                 "  -o, --output=OUT.svg   the chart (SVG)\n"
                 "  -d, --device=N         the device to plot (default 0)\n"
                 "  -h, --help             this text\n");
    return rc;
}

int sp_cli_plot(int argc, char **argv) {
    static const struct option opts[] = {{"output", required_argument, NULL, 'o'},
                                         {"device", required_argument, NULL, 'd'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0, 0, 0, 0}};
    const char *in = NULL, *out = NULL;
    int dev = 0, opt;
    long n;
    while ((opt = cli_getopt(argc, argv, "plot", "o:d:h", opts)) != -1) {
        if (opt == 'h')
            return usage(stdout, 0);
        if (opt == 'o')
            out = optarg;
        else if (opt == 'd' && cli_parse_long(optarg, 0, 4095, &n))
            dev = (int)n;
        else {
            if (opt == 'd')
                fprintf(stderr, "sympool plot: --device takes 0 to 4095, not '%s'\n", optarg);
            return 2;
        }
    }
    if (optind < argc)
        in = argv[optind];
    if (in == NULL || out == NULL) {
        fprintf(stderr, "sympool plot: %s\n",
                in == NULL ? "no snapshot given" : "no -o OUT.svg given");
        return usage(stderr, 2);
    }
    char err[512];
    tr_trace_t t;
    if (!tr_load(in, &t, err, sizeof(err))) {
        fprintf(stderr, "sympool plot: %s\n", err);
        tr_free(&t);
        return 1;
    }
    if (dev < 0 || dev >= t.ndev) {
        fprintf(stderr, "sympool plot: device %d not in the snapshot (%d devices)\n", dev, t.ndev);
        tr_free(&t);
        return 2;
    }
    const tr_device_t *d = &t.dev[dev];
    size_t nev = d->nev;

    /* Time axis: time_us when the trace has it, else the event index. */
    int64_t t0 = 0, t1 = 0;
    bool use_time = nev > 0 && d->ev[0].time_us != 0 && d->ev[nev - 1].time_us > d->ev[0].time_us;
    if (use_time) {
        t0 = d->ev[0].time_us;
        t1 = d->ev[nev - 1].time_us;
    } else {
        t1 = nev > 1 ? (int64_t)nev - 1 : 1;
    }
    double span = (double)(t1 - t0);

    /* Per-column maxima of both curves, and the peaks. */
    double amax[COLS], rmax[COLS];
    for (int c = 0; c < COLS; c++)
        amax[c] = rmax[c] = -1;
    double alloc = (double)d->seeded_bytes, resv = (double)d->start_reserved;
    double apeak = alloc, rpeak = resv;
    size_t apeak_i = 0, rpeak_i = 0;
    for (size_t i = 0; i < nev; i++) {
        const tr_event_t *e = &d->ev[i];
        if (e->action == TR_ALLOC)
            alloc += (double)e->size;
        else if (e->action == TR_FREE_REQUESTED)
            alloc -= (double)e->size;
        else if (e->action == TR_SEGMENT_ALLOC || e->action == TR_SEGMENT_MAP)
            resv += (double)e->size;
        else if (e->action == TR_SEGMENT_FREE || e->action == TR_SEGMENT_UNMAP)
            resv -= (double)e->size;
        double x = (double)((use_time ? e->time_us : (int64_t)i) - t0) / (span > 0 ? span : 1);
        int c = (int)(x * (COLS - 1) + 0.5);
        c = c < 0 ? 0 : c >= COLS ? COLS - 1 : c;
        if (alloc > amax[c])
            amax[c] = alloc;
        if (resv > rmax[c])
            rmax[c] = resv;
        if (alloc > apeak) {
            apeak = alloc;
            apeak_i = i;
        }
        if (resv > rpeak) {
            rpeak = resv;
            rpeak_i = i;
        }
    }
    /* Columns without events keep the previous level. */
    double la = (double)d->seeded_bytes, lr = (double)d->start_reserved;
    for (int c = 0; c < COLS; c++) {
        if (amax[c] < 0)
            amax[c] = la;
        if (rmax[c] < 0)
            rmax[c] = lr;
        la = amax[c];
        lr = rmax[c];
    }

    /* Blocks live at the allocated peak: seeds and traced allocations, replayed to apeak_i. */
    size_t cap = d->nseeds + nev + 1, nlive = 0;
    live_block_t *live = calloc(cap, sizeof(*live));
    tr_map_t where = {0};
    if (live == NULL) {
        fprintf(stderr, "sympool plot: out of memory\n");
        tr_free(&t);
        return 1;
    }
    for (size_t s = 0; s < d->nseeds; s++) {
        live[nlive] =
            (live_block_t){d->seeds[s].addr, d->seeds[s].size, SIZE_MAX, nev, d->seeds[s].frames};
        (void)tr_map_put(&where, d->seeds[s].addr, nlive + 1);
        nlive++;
    }
    for (size_t i = 0; i < nev; i++) {
        const tr_event_t *e = &d->ev[i];
        uintptr_t k;
        if (e->action == TR_ALLOC) {
            live[nlive] = (live_block_t){e->addr, e->size, i, nev, e->frames};
            (void)tr_map_put(&where, e->addr, nlive + 1);
            nlive++;
        } else if (e->action == TR_FREE_REQUESTED && tr_map_del(&where, e->addr, &k)) {
            live[k - 1].died = i;
        }
    }
    tr_map_free(&where);
    /* Keep the traced blocks alive at the peak; the seeds are summed into one line (they are
     * usually the model's weights: many equal blocks that would crowd out everything else). */
    size_t m = 0, nseed_live = 0;
    uint64_t seed_live_bytes = 0;
    for (size_t i = 0; i < nlive; i++) {
        if (live[i].died <= apeak_i)
            continue;
        if (live[i].born == SIZE_MAX) {
            nseed_live++;
            seed_live_bytes += live[i].size;
        } else if (live[i].born <= apeak_i) {
            live[m++] = live[i];
        }
    }
    qsort(live, m, sizeof(*live), cmp_size_desc);
    size_t ntop = m < TOP_N ? m : TOP_N;

    FILE *f = fopen(out, "w");
    if (f == NULL) {
        fprintf(stderr, "sympool plot: cannot write %s\n", out);
        free(live);
        tr_free(&t);
        return 1;
    }
    double vmax = rpeak > apeak ? rpeak : apeak;
    if (vmax <= 0)
        vmax = 1;
    double ystep = nice_step(gib(vmax), 6);
    double ytop = ceil(gib(vmax) / ystep) * ystep;
#define Y(v) (PY1 - (gib(v) / ytop) * (PY1 - PY0))
    const char *base = strrchr(in, '/');
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"Helvetica,Arial,sans-serif\" font-size=\"13\">\n",
            W, H);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    fprintf(f,
            "<text x=\"%d\" y=\"30\" font-size=\"18\" font-weight=\"bold\">Memory timeline: ", PX0);
    xml_text(f, base ? base + 1 : in, 120);
    fprintf(f, " (device %d)</text>\n", dev);
    fprintf(f,
            "<text x=\"%d\" y=\"52\" fill=\"#444\">%zu events, %zu segments at the end; "
            "peak allocated %.2f GiB, peak reserved %.2f GiB</text>\n",
            PX0, nev, t.nsegments, gib(apeak), gib(rpeak));
    /* grid and y axis */
    for (double v = 0; v <= ytop + 1e-9; v += ystep) {
        double y = PY1 - v / ytop * (PY1 - PY0);
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", PX0,
                PX1, y, y);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g GiB</text>\n", PX0 - 8, y + 4,
                v);
    }
    /* x axis */
    double xr = use_time ? span / 1e6 : span;
    double xstep = nice_step(xr > 0 ? xr : 1, 8);
    for (double v = 0; v <= xr + 1e-9; v += xstep) {
        double x = PX0 + (xr > 0 ? v / xr : 0) * (COLS - 1);
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#999\"/>\n", x, x,
                PY1, PY1 + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", x, PY1 + 19, v);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#444\">%s</text>\n",
            (PX0 + PX1) / 2, PY1 + 36, use_time ? "time since the first event (s)" : "event");
    /* areas: reserved behind allocated */
    const char *fills[2] = {"#fdd0a2", "#9ecae1"}, *strokes[2] = {"#e6550d", "#3182bd"};
    for (int k = 0; k < 2; k++) {
        const double *v = k == 0 ? rmax : amax;
        fprintf(
            f,
            "<path fill=\"%s\" fill-opacity=\"0.8\" stroke=\"%s\" stroke-width=\"1.2\" d=\"M%d %d",
            fills[k], strokes[k], PX0, PY1);
        for (int c = 0; c < COLS; c++)
            fprintf(f, " L%d %.1f", PX0 + c, Y(v[c]));
        fprintf(f, " L%d %d Z\"/>\n", PX1 - 1, PY1);
    }
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n",
            PX0, PY0, COLS, PY1 - PY0);
    /* peak markers */
    size_t pk_i[2] = {rpeak_i, apeak_i};
    double pk_v[2] = {rpeak, apeak};
    for (int k = 0; k < 2; k++) {
        double x = nev ? (double)((use_time ? d->ev[pk_i[k]].time_us : (int64_t)pk_i[k]) - t0) /
                             (span > 0 ? span : 1)
                       : 0;
        double px = PX0 + x * (COLS - 1), py = Y(pk_v[k]);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>\n", px, py, strokes[k]);
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\" font-weight=\"bold\" text-anchor=\"%s\">"
                "peak %s %.2f GiB</text>\n",
                px + (px > PX1 - 150 ? -8 : 8), py - 8 + (k == 1 ? 22 : 0), strokes[k],
                px > PX1 - 150 ? "end" : "start", k == 0 ? "reserved" : "allocated", gib(pk_v[k]));
    }
    /* legend and the largest blocks */
    int lx = PX1 + 25, ly = PY0 + 5;
    for (int k = 0; k < 2; k++) {
        fprintf(f,
                "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\" stroke=\"%s\"/>\n",
                lx, ly + k * 22, fills[k], strokes[k]);
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", lx + 22, ly + 12 + k * 22,
                k == 0 ? "reserved (segments)" : "allocated (requested bytes)");
    }
    ly += 64;
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">Live at the allocated peak</text>\n",
            lx, ly);
    ly += 22;
    fprintf(f, "<text x=\"%d\" y=\"%d\">%.3f GiB in %zu blocks from before the trace</text>\n", lx,
            ly, gib((double)seed_live_bytes), nseed_live);
    ly += 18;
    fprintf(f, "<text x=\"%d\" y=\"%d\">%.3f GiB in %zu blocks allocated in the trace;</text>\n",
            lx, ly, gib(apeak - (double)seed_live_bytes), m);
    ly += 16;
    fprintf(f, "<text x=\"%d\" y=\"%d\">the largest:</text>\n", lx, ly);
    for (size_t b = 0; b < ntop; b++) {
        char w[160];
        where_of(live[b].frames, w, sizeof(w));
        int y = ly + 22 + (int)b * 36;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>\n", lx, y - 9,
                colors[b]);
        fprintf(f, "<text x=\"%d\" y=\"%d\">%.1f MiB, from event %zu</text>\n", lx + 16, y,
                (double)live[b].size / 1048576.0, live[b].born);
        fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#555\" font-size=\"11\">", lx + 16, y + 14);
        xml_text(f, w, 44);
        fprintf(f, "</text>\n");
    }
    /* the allocated peak, through the chart and the lanes */
    if (nev > 0) {
        double x = (double)((use_time ? d->ev[apeak_i].time_us : (int64_t)apeak_i) - t0) /
                   (span > 0 ? span : 1);
        fprintf(f,
                "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#3182bd\" "
                "stroke-dasharray=\"4 3\"/>\n",
                PX0 + x * (COLS - 1), PX0 + x * (COLS - 1), PY0, LANE0 + 20 + TOP_N * LANE_H);
    }
    /* lifetime lanes */
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">Lifetimes of the largest blocks live at "
            "the allocated peak (dashed)</text>\n",
            PX0, LANE0 + 10);
    for (size_t b = 0; b < ntop; b++) {
        double xa =
            (double)((use_time ? d->ev[live[b].born].time_us : (int64_t)live[b].born) - t0) /
            (span > 0 ? span : 1);
        double xb =
            live[b].died >= nev
                ? 1
                : (double)((use_time ? d->ev[live[b].died].time_us : (int64_t)live[b].died) - t0) /
                      (span > 0 ? span : 1);
        int y = LANE0 + 20 + (int)b * LANE_H;
        fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>\n",
                PX0 + xa * (COLS - 1), y, fmax(2.0, (xb - xa) * (COLS - 1)), LANE_H - 6, colors[b]);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"11\">%.0f MiB</text>\n",
                PX0 - 8, y + 11, (double)live[b].size / 1048576.0);
    }
    fprintf(f, "</svg>\n");
#undef Y
    int rc = fclose(f) == 0 ? 0 : 1;
    if (rc == 0)
        printf(
            "wrote %s (device %d: %zu events, peak allocated %.3f GiB, peak reserved %.3f GiB)\n",
            out, dev, nev, gib(apeak), gib(rpeak));
    free(live);
    tr_free(&t);
    return rc;
}
