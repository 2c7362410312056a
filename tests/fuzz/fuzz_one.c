/*
 * fuzz_one.c: one fuzz input through the snapshot readers (tools/pickle_read.c,
 * core/json_read.c) and the trace loader every CLI command starts with (tools/trace.c), a
 * pickle through its loader without stacks too (the reader's record hook), which must read it
 * as the loader with stacks does (`info` and `replay` as `plot` and `summary`): the same
 * refusal, or the same events, seeds and figures. A disagreement aborts, as a crash does.
 * The limits are smaller than the CLI's so that one input stays fast; the code paths are the
 * same.
 */
#include "tests/fuzz/fuzz_one.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sympool/experimental.h"
#include "tools/pickle_read.h"
#include "tools/trace.h"

/* The loader without stacks (`sympool info`, `sympool replay`), whose reader hands the trace
 * entries and the final state's blocks and segments over to trace.c as it parses them: it reads
 * a file, so the input goes to an in-memory one (one per process, rewritten per input). */
/* Where two loads of one file differ (NULL: nowhere that a command reads). */
static const char *differs(const tr_trace_t *a, const tr_trace_t *b) {
    if (a->ndev != b->ndev || a->nsegments != b->nsegments || strcmp(a->format, b->format) != 0)
        return "devices, segments or format";
    if (strcmp(a->settings.conf, b->settings.conf) != 0 ||
        a->settings.recorded != b->settings.recorded ||
        a->settings.expandable != b->settings.expandable)
        return "settings";
    for (int d = 0; d < a->ndev; d++) {
        const tr_device_t *x = &a->dev[d], *y = &b->dev[d];
        if (x->nev != y->nev || x->nseeds != y->nseeds || x->nstart != y->nstart ||
            x->nsblocks != y->nsblocks || x->npools != y->npools || x->nstreams != y->nstreams ||
            x->seeded_bytes != y->seeded_bytes || x->final_reserved != y->final_reserved ||
            x->final_allocated != y->final_allocated || x->peak_reserved != y->peak_reserved ||
            x->peak_requested != y->peak_requested || x->start_bytes != y->start_bytes ||
            x->deferred_frees != y->deferred_frees || x->empty_cache_runs != y->empty_cache_runs)
            return "a device's counts";
        for (size_t i = 0; i < x->nev; i++) {
            const tr_event_t *e = &x->ev[i], *f = &y->ev[i];
            if (e->action != f->action || e->flags != f->flags || e->pool != f->pool ||
                e->addr != f->addr || e->size != f->size || e->stream != f->stream)
                return "an event";
        }
        for (size_t i = 0; i < x->nseeds; i++) {
            const tr_seed_t *e = &x->seeds[i], *f = &y->seeds[i];
            if (e->addr != f->addr || e->size != f->size || e->bsize != f->bsize ||
                e->stream != f->stream || e->pool != f->pool || e->in_start != f->in_start)
                return "a seed";
        }
    }
    return NULL;
}

static void load_records(const void *buf, size_t size) {
    static int fd = -1;
    if (fd < 0)
        fd = memfd_create("sp_fuzz", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, 0) != 0 || (size > 0 && pwrite(fd, buf, size, 0) != (ssize_t)size))
        return;
    char path[64], err[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    char err2[256];
    tr_trace_t t, whole;
    bool ok = tr_load_opts(path, false, &t, err, sizeof err);
    bool ok2 = tr_load_opts(path, true, &whole, err2, sizeof err2);
    const char *what = ok != ok2                       ? "the outcome"
                       : !ok && strcmp(err, err2) != 0 ? "the refusal"
                       : ok                            ? differs(&t, &whole)
                                                       : NULL;
    if (what != NULL) {
        fprintf(stderr, "fuzz_one: the loaders without and with stacks differ in %s: %s / %s\n",
                what, ok ? "loaded" : err, ok2 ? "loaded" : err2);
        abort();
    }
    tr_free(&t);
    tr_free(&whole);
}

int sp_fuzz_one(const uint8_t *data, size_t size, int json) {
    char err[256];
    char *pickle = NULL;
    size_t plen = 0;
    const void *buf = data;
    if (json) {
        /* The translation without stacks (replay's) must refuse what the whole one refuses, with
         * the same message: it reads the skipped values as strictly. */
        char err2[256];
        char *skipped = NULL;
        size_t slen = 0;
        bool ok = sp_x_json_to_pickle((const char *)data, size, &pickle, &plen, err, sizeof err);
        bool ok2 = sp_x_json_to_pickle_skip((const char *)data, size, "frames", &skipped, &slen,
                                            err2, sizeof err2);
        free(skipped);
        if (ok != ok2 || (!ok && strcmp(err, err2) != 0)) {
            fprintf(stderr,
                    "fuzz_one: the JSON translations without and with stacks differ: %s / %s\n",
                    ok ? "translated" : err, ok2 ? "translated" : err2);
            abort();
        }
        if (!ok)
            return 0;
        buf = pickle;
        size = plen;
    }
    pk_limits_t lim;
    pk_limits_default(&lim);
    lim.max_memo = 1 << 16;
    lim.max_values = 1 << 18;
    lim.max_str = 1 << 20;
    pk_doc_t *doc = NULL;
    int loaded = 0;
    if (pk_parse(buf, size, &lim, &doc, err, sizeof err)) {
        tr_trace_t t;
        memset(&t, 0, sizeof t);
        loaded = tr_from_doc(doc, &t, err, sizeof err); /* owns doc from here */
        tr_free(&t);
    }
    if (!json)
        load_records(data, size);
    free(pickle);
    return loaded;
}
