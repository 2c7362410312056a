/*
 * trace.c: turns a parsed PyTorch snapshot into per-device event arrays, finds the blocks that
 * were live before recording began, and reconstructs PyTorch's reserved bytes over the run.
 *
 * Seeds (blocks allocated before the trace starts) are found in one forward pass per device:
 * a `free_requested` at an address with no live traced allocation frees a block allocated
 * earlier (seed, with the free's requested size); a block still active in the final segments at
 * an address that no event touched was allocated earlier and never freed (seed, with the block's
 * requested size). Reserved bytes: the final segments' sizes give the reserved total at the end;
 * walking the trace backwards (segment_alloc/map subtract, segment_free/unmap add) gives it before
 * every event, and its maximum is PyTorch's peak reserved over the recorded run.
 * No globals, no lock.
 */
#include "tools/trace.h"

#include "tools/json_read.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- address map ------------------------------------------------------------------------ */

static size_t slot_of(uint64_t key, size_t cap) {
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static bool map_grow(tr_map_t *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *k = calloc(cap, sizeof(*k));
    uintptr_t *v = calloc(cap, sizeof(*v));
    if (k == NULL || v == NULL) {
        free(k);
        free(v);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == 0)
            continue;
        size_t s = slot_of(m->keys[i], cap);
        while (k[s] != 0)
            s = (s + 1) & (cap - 1);
        k[s] = m->keys[i];
        v[s] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = k;
    m->vals = v;
    m->cap = cap;
    return true;
}

bool tr_map_put(tr_map_t *m, uint64_t key, uintptr_t val) {
    if (key == 0)
        return false;
    if ((m->n + 1) * 2 > m->cap && !map_grow(m))
        return false;
    size_t s = slot_of(key, m->cap);
    while (m->keys[s] != 0 && m->keys[s] != key)
        s = (s + 1) & (m->cap - 1);
    if (m->keys[s] == 0)
        m->n++;
    m->keys[s] = key;
    m->vals[s] = val;
    return true;
}

bool tr_map_get(const tr_map_t *m, uint64_t key, uintptr_t *val_p) {
    if (m->cap == 0 || key == 0)
        return false;
    for (size_t s = slot_of(key, m->cap); m->keys[s] != 0; s = (s + 1) & (m->cap - 1)) {
        if (m->keys[s] == key) {
            if (val_p)
                *val_p = m->vals[s];
            return true;
        }
    }
    return false;
}

bool tr_map_del(tr_map_t *m, uint64_t key, uintptr_t *val_p) {
    if (m->cap == 0 || key == 0)
        return false;
    size_t s = slot_of(key, m->cap);
    while (m->keys[s] != key) {
        if (m->keys[s] == 0)
            return false;
        s = (s + 1) & (m->cap - 1);
    }
    if (val_p)
        *val_p = m->vals[s];
    /* Backward-shift deletion keeps probe chains intact without tombstones. */
    size_t hole = s;
    for (size_t j = (s + 1) & (m->cap - 1); m->keys[j] != 0; j = (j + 1) & (m->cap - 1)) {
        size_t home = slot_of(m->keys[j], m->cap);
        bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            m->keys[hole] = m->keys[j];
            m->vals[hole] = m->vals[j];
            hole = j;
        }
    }
    m->keys[hole] = 0;
    m->n--;
    return true;
}

void tr_map_free(tr_map_t *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof(*m));
}

/* ---- loading ---------------------------------------------------------------------------- */

static tr_action_t action_of(const char *s) {
    static const char *const names[] = {"alloc",         "free_requested", "free_completed",
                                        "segment_alloc", "segment_free",   "segment_map",
                                        "segment_unmap", "snapshot",       "oom"};
    for (int i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++)
        if (strcmp(s, names[i]) == 0)
            return (tr_action_t)i;
    return TR_OTHER;
}

static int cmp_seed(const void *a, const void *b) {
    const tr_seed_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static bool add_seed(tr_device_t *d, size_t *cap, uint64_t addr, uint64_t size, uint64_t stream,
                     const pk_value_t *frames) {
    if (d->nseeds == *cap) {
        size_t n = *cap ? *cap * 2 : 64;
        tr_seed_t *ns = realloc(d->seeds, n * sizeof(*ns));
        if (ns == NULL)
            return false;
        d->seeds = ns;
        *cap = n;
    }
    d->seeds[d->nseeds++] = (tr_seed_t){addr, size, stream, frames};
    d->seeded_bytes += size;
    return true;
}

/* Bounds on what a snapshot may hold, so that every sum and difference the commands compute in
 * 64 bits stays exact: a size below 1 EB (PyTorch refuses an allocation of 1 EB or more before
 * its allocator runs, so no recorded size reaches it), bytes live or reserved at once below
 * 4 EiB, and time_us in [0, 2^53] (microseconds since 1970, exact in a double; the year 2255). A
 * snapshot past them is refused naming the field, instead of printing "-2 B" or overflowing. */
#define TR_SIZE_LIMIT ((uint64_t)1 << 60)
#define TR_SUM_LIMIT ((int64_t)1 << 62)
#define TR_TIME_LIMIT ((int64_t)1 << 53)

static bool load_events(const pk_value_t *list, int dev, tr_device_t *d, char *err, size_t errlen) {
    size_t n = pk_len(list);
    if (list != NULL && list->type != PK_LIST) {
        snprintf(err, errlen, "device_traces[%d] is not a list", dev);
        return false;
    }
    d->ev = calloc(n ? n : 1, sizeof(*d->ev));
    if (d->ev == NULL) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const pk_value_t *e = pk_at(list, i);
        tr_event_t *ev = &d->ev[i];
        const char *act = pk_get_str(e, "action");
        uint64_t addr = 0, size = 0, stream = 0;
        int64_t t = 0;
        if (act == NULL) {
            snprintf(err, errlen, "device_traces[%d][%zu]: no 'action' string", dev, i);
            return false;
        }
        ev->action = action_of(act);
        const char *addr_key = ev->action == TR_OOM ? "device_free" : "addr";
        if (ev->action != TR_OTHER && ev->action != TR_SNAPSHOT &&
            (!pk_get_uint(e, addr_key, &addr) || !pk_get_uint(e, "size", &size))) {
            snprintf(err, errlen, "device_traces[%d][%zu] (%s): missing or bad '%s' or 'size'", dev,
                     i, act, addr_key);
            return false;
        }
        (void)pk_get_uint(e, "size", &size);
        if (ev->action != TR_OTHER && size >= TR_SIZE_LIMIT) {
            snprintf(err, errlen,
                     "device_traces[%d][%zu] (%s): size %llu is 1 EB or more, which no PyTorch "
                     "allocation reaches",
                     dev, i, act, (unsigned long long)size);
            return false;
        }
        if (addr == 0 && (ev->action == TR_ALLOC || ev->action == TR_FREE_REQUESTED ||
                          ev->action == TR_FREE_COMPLETED || ev->action == TR_SEGMENT_ALLOC ||
                          ev->action == TR_SEGMENT_FREE)) {
            snprintf(err, errlen, "device_traces[%d][%zu] (%s): addr 0 is not a block address", dev,
                     i, act);
            return false;
        }
        /* Streams are handles: PyTorch pickles them as unsigned, a few as negative ints. */
        int64_t sstream = 0;
        if (!pk_get_uint(e, "stream", &stream) && pk_get_int(e, "stream", &sstream))
            stream = (uint64_t)sstream;
        if (pk_get(e, "time_us") != NULL &&
            (!pk_get_int(e, "time_us", &t) || t < 0 || t > TR_TIME_LIMIT)) {
            snprintf(err, errlen,
                     "device_traces[%d][%zu] (%s): time_us is not a time in [0, 2^53] "
                     "microseconds",
                     dev, i, act);
            return false;
        }
        ev->addr = addr;
        ev->size = size;
        ev->stream = stream;
        ev->time_us = t;
        const pk_value_t *fr = pk_get(e, "frames");
        ev->frames = fr != NULL && fr->type == PK_LIST ? fr : NULL;
        d->nev++;
        if (ev->action == TR_OOM)
            d->recorded_ooms++;
    }
    return true;
}

/* Seeds, PyTorch's reserved timeline and the requested peak of one device. */
static bool analyse(const pk_value_t *segments, int dev, tr_device_t *d, char *err, size_t errlen) {
    tr_map_t live = {0};    /* addresses allocated in the trace and not yet freed */
    tr_map_t touched = {0}; /* addresses any alloc/free event names */
    size_t cap = 0;
    bool ok = false;
    for (size_t i = 0; i < d->nev; i++) {
        const tr_event_t *e = &d->ev[i];
        if (e->action == TR_ALLOC) {
            if (!tr_map_put(&live, e->addr, 1) || !tr_map_put(&touched, e->addr, 1))
                goto oom;
        } else if (e->action == TR_FREE_REQUESTED) {
            if (!tr_map_del(&live, e->addr, NULL)) {
                if (d->seeded_bytes + e->size >= (uint64_t)TR_SUM_LIMIT)
                    goto too_much;
                if (!add_seed(d, &cap, e->addr, e->size, e->stream, e->frames))
                    goto oom;
            }
            if (!tr_map_put(&touched, e->addr, 1))
                goto oom;
        }
    }
    for (size_t s = 0; s < pk_len(segments); s++) {
        const pk_value_t *seg = pk_at(segments, s);
        int64_t sdev = 0, total = 0, stream = 0;
        uint64_t addr = 0;
        (void)pk_get_int(seg, "device", &sdev);
        if (sdev != dev)
            continue;
        if (!pk_get_int(seg, "total_size", &total) || total < 0 ||
            !pk_get_uint(seg, "address", &addr)) {
            snprintf(err, errlen, "segments[%zu]: missing 'address' or 'total_size'", s);
            goto out;
        }
        if ((uint64_t)total >= TR_SIZE_LIMIT ||
            d->final_reserved + (uint64_t)total >= (uint64_t)TR_SUM_LIMIT) {
            snprintf(err, errlen,
                     "segments[%zu]: total_size %lld is 1 EB or more, or the segments together "
                     "reach 4 EiB",
                     s, (long long)total);
            goto out;
        }
        (void)pk_get_int(seg, "stream", &stream);
        d->final_reserved += (uint64_t)total;
        const pk_value_t *blocks = pk_get(seg, "blocks");
        /* Block addresses are the segment's plus the sizes before them (MemoryViz does the
         * same; a missing "address" is therefore fine). */
        uint64_t baddr = (uint64_t)addr;
        for (size_t b = 0; b < pk_len(blocks); b++) {
            const pk_value_t *blk = pk_at(blocks, b);
            int64_t bsize = 0, req = -1;
            const char *state = pk_get_str(blk, "state");
            if (!pk_get_int(blk, "size", &bsize) || bsize < 0 || state == NULL) {
                snprintf(err, errlen, "segments[%zu].blocks[%zu]: missing 'size' or 'state'", s, b);
                goto out;
            }
            if ((uint64_t)bsize > (uint64_t)total) {
                snprintf(err, errlen,
                         "segments[%zu].blocks[%zu]: size %lld is more than its segment's "
                         "total_size %lld",
                         s, b, (long long)bsize, (long long)total);
                goto out;
            }
            if (!pk_get_int(blk, "requested_size", &req) || req <= 0 || req > bsize)
                req = bsize;
            if (strcmp(state, "active_allocated") == 0)
                d->final_allocated += (uint64_t)bsize;
            if (strcmp(state, "inactive") != 0 && !tr_map_get(&touched, baddr, NULL)) {
                const pk_value_t *fr = pk_get(blk, "frames");
                if (d->seeded_bytes + (uint64_t)req >= (uint64_t)TR_SUM_LIMIT)
                    goto too_much;
                if (!add_seed(d, &cap, baddr, (uint64_t)req, (uint64_t)stream,
                              fr != NULL && fr->type == PK_LIST ? fr : NULL))
                    goto oom;
            }
            baddr += (uint64_t)bsize;
        }
    }
    if (d->nseeds > 1)
        qsort(d->seeds, d->nseeds, sizeof(*d->seeds), cmp_seed);

    /* Reserved before each event, walking back from the end state. */
    int64_t r = (int64_t)d->final_reserved, peak = r;
    for (size_t i = d->nev; i-- > 0;) {
        const tr_event_t *e = &d->ev[i];
        if (e->action == TR_SEGMENT_ALLOC || e->action == TR_SEGMENT_MAP)
            r -= (int64_t)e->size;
        else if (e->action == TR_SEGMENT_FREE || e->action == TR_SEGMENT_UNMAP)
            r += (int64_t)e->size;
        if (r > peak)
            peak = r;
        if (r >= TR_SUM_LIMIT || r <= -TR_SUM_LIMIT) {
            snprintf(err, errlen,
                     "device_traces[%d][%zu]: the segments reserved at once reach 4 EiB", dev, i);
            goto out;
        }
    }
    d->start_reserved = r > 0 ? (uint64_t)r : 0;
    d->peak_reserved = (uint64_t)peak;

    int64_t req = (int64_t)d->seeded_bytes, rpeak = req;
    for (size_t i = 0; i < d->nev; i++) {
        if (d->ev[i].action == TR_ALLOC)
            req += (int64_t)d->ev[i].size;
        else if (d->ev[i].action == TR_FREE_REQUESTED)
            req -= (int64_t)d->ev[i].size;
        if (req > rpeak)
            rpeak = req;
        if (req >= TR_SUM_LIMIT || req <= -TR_SUM_LIMIT) {
            snprintf(err, errlen, "device_traces[%d][%zu]: the bytes requested at once reach 4 EiB",
                     dev, i);
            goto out;
        }
    }
    d->peak_requested = (uint64_t)rpeak;
    ok = true;
    goto out;
too_much:
    snprintf(err, errlen, "device %d: the blocks live before the trace reach 4 EiB", dev);
    goto out;
oom:
    snprintf(err, errlen, "out of memory");
out:
    tr_map_free(&live);
    tr_map_free(&touched);
    return ok;
}

bool tr_from_doc(pk_doc_t *doc, tr_trace_t *t, char *err, size_t errlen) {
    memset(t, 0, sizeof(*t));
    t->doc = doc;
    t->root = pk_root(doc);
    const pk_value_t *segments = NULL, *traces = NULL;
    if (t->root != NULL && t->root->type == PK_LIST) {
        segments = t->root; /* an old-style snapshot: just the segment list */
    } else if (t->root != NULL && t->root->type == PK_DICT) {
        segments = pk_get(t->root, "segments");
        traces = pk_get(t->root, "device_traces");
    } else {
        snprintf(err, errlen, "not a memory snapshot (top level is not a dict)");
        return false;
    }
    if (segments == NULL || segments->type != PK_LIST) {
        snprintf(err, errlen, "not a memory snapshot (no 'segments' list)");
        return false;
    }
    if (traces != NULL && traces->type != PK_LIST) {
        snprintf(err, errlen, "'device_traces' is not a list");
        return false;
    }
    t->nsegments = pk_len(segments);
    int ndev = (int)pk_len(traces);
    for (size_t s = 0; s < t->nsegments; s++) {
        int64_t dev = 0;
        if (!pk_get_int(pk_at(segments, s), "device", &dev) || dev < 0 || dev > 4096) {
            snprintf(err, errlen, "segments[%zu]: missing or bad 'device'", s);
            return false;
        }
        if (dev + 1 > ndev)
            ndev = (int)dev + 1;
    }
    if (ndev > 4096) {
        snprintf(err, errlen, "more than 4096 device traces");
        return false;
    }
    t->ndev = ndev;
    t->dev = calloc(ndev > 0 ? (size_t)ndev : 1, sizeof(*t->dev));
    if (t->dev == NULL) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
    for (int d = 0; d < ndev; d++) {
        if (!load_events(pk_at(traces, (size_t)d), d, &t->dev[d], err, errlen) ||
            !analyse(segments, d, &t->dev[d], err, errlen))
            return false;
    }
    return true;
}

bool tr_load(const char *path, tr_trace_t *t, char *err, size_t errlen) {
    memset(t, 0, sizeof(*t));
    unsigned char *buf = NULL;
    size_t len = 0;
    char why[256];
    if (!pk_read_file(path, (size_t)4 << 30, &buf, &len, why, sizeof(why))) {
        snprintf(err, errlen, "%s", why);
        return false;
    }
    /* A JSON snapshot (ours, or one a viewer saved) starts with '{' or '[': translate it. */
    size_t i = 0;
    while (i < len && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t'))
        i++;
    if (i < len && buf[i] != 0x80 && buf[i] != '{' && buf[i] != '[') {
        snprintf(err, errlen,
                 "%s: not a pickle (nor a JSON snapshot): it starts with byte 0x%02x, a pickle "
                 "with 0x80",
                 path, buf[i]);
        free(buf);
        return false;
    }
    if (i < len && (buf[i] == '{' || buf[i] == '[')) {
        char *pickle = NULL;
        size_t plen = 0;
        bool ok = json_to_pickle((const char *)buf, len, &pickle, &plen, why, sizeof(why));
        free(buf);
        if (!ok) {
            snprintf(err, errlen, "%s: %s", path, why);
            return false;
        }
        buf = (unsigned char *)pickle;
        len = plen;
    }
    pk_doc_t *doc = NULL;
    bool ok = pk_parse(buf, len, NULL, &doc, why, sizeof(why));
    free(buf);
    if (!ok) {
        snprintf(err, errlen, "%s: %s", path, why);
        return false;
    }
    if (!tr_from_doc(doc, t, why, sizeof(why))) {
        snprintf(err, errlen, "%s: %s", path, why);
        return false;
    }
    return true;
}

void tr_free(tr_trace_t *t) {
    if (t->dev != NULL) {
        for (int d = 0; d < t->ndev; d++) {
            free(t->dev[d].ev);
            free(t->dev[d].seeds);
        }
        free(t->dev);
    }
    pk_free(t->doc);
    memset(t, 0, sizeof(*t));
}
