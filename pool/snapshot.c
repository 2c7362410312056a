/*
 * snapshot.c: PyTorch-compatible memory snapshots (torch.cuda.memory._snapshot()) of the whole
 * process (sp_dump_snapshot) or of one pool (sp_mempool_dump_snapshot), written as pickle
 * protocol 4 or JSON (".json" path) through core/core_emit.c, atomically.
 *
 * Consistency: the segments come from sp__pool_walk, which holds every device's allocator lock
 * for the whole walk (pool/segment_index.c); the traces are copied at the walk's start
 * (sp__pool_walk_from, called whether or not a segment follows), so under those same locks.
 * Segments, blocks and traces therefore describe one instant, and the trace replays backwards to
 * the segment state, which is what MemoryViz.js's "Allocator State History" needs. (sp__pool_locked
 * cannot be used around the walk: the locks are not recursive.)
 *
 * Every dump appends a `snapshot` entry (addr 0, size = active bytes) to each device's trace, as
 * PyTorch does (its DeviceCachingAllocator::snapshot records it under the allocator's mutex), at
 * the walk's end under the walk's locks (mark_snapshot): every entry of a state after the
 * snapshot's comes after it. No lock of its own; the collection is local.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "pool/allocator.h"
#include "pool/history.h"
#include "core/core_emit.h"
#include "pool/pool.h"
#include "sympool/experimental.h"
#include "sympool/history.h"
#include "sympool/pool.h"

typedef struct seg_copy {
    sp_segment_view_t view; /* copied view; blocks points into the collection's block array */
    size_t first_block;     /* index of its first block in collect.blocks */
} seg_copy_t;

typedef struct trace_copy {
    bool copied;          /* taken already */
    sp__trace_entry_t *e; /* chronological, with context references */
    size_t n;             /* entries */
    size_t active;        /* active bytes of the device's walked segments */
} trace_copy_t;

typedef struct collect {
    const sp_mempool_t *pool;     /* NULL: whole process */
    sp_mempool_id_t pool_id;      /* when pool != NULL */
    seg_copy_t *segs;             /* segments in walk order */
    size_t nsegs, segs_alloc;     /* segments held / allocated */
    sp_block_view_t *blocks;      /* every segment's blocks, back to back */
    size_t nblocks, blocks_alloc; /* blocks held / allocated */
    trace_copy_t *traces;         /* one per device index */
    int ndev;                     /* entries in traces */
    bool failed;                  /* out of memory in the visitor */
    sp_status_t status;           /* the first failure */
    sp__stream_label_t *labels;   /* streams shown by another value (sp_x_stream_label) */
    size_t nlabels;               /* entries in labels */
    sp__annotation_t *annots;     /* external annotations, oldest first */
    size_t nannots;               /* entries in annots */
} collect_t;

/* The value the snapshot shows for a stream: its label, or its handle. */
static uint64_t stream_shown(const collect_t *c, uint64_t stream) {
    for (size_t i = 0; i < c->nlabels; i++)
        if (c->labels[i].stream == stream)
            return c->labels[i].label;
    return stream;
}

static bool grow(void **p, size_t *alloc, size_t need, size_t elem) {
    if (need <= *alloc)
        return true;
    size_t n = *alloc ? *alloc : 64;
    while (n < need)
        n *= 2;
    void *np = sp__emit_realloc(*p, n * elem);
    if (np == NULL)
        return false;
    *p = np;
    *alloc = n;
    return true;
}

static void copy_trace(collect_t *c, int device) {
    if (device < 0 || device >= c->ndev || c->traces[device].copied)
        return;
    trace_copy_t *t = &c->traces[device];
    sp_status_t s = sp__history_copy(device, &t->e, &t->n);
    if (s != SP_SUCCESS) {
        c->failed = true;
        c->status = s;
        return;
    }
    t->copied = true;
}

/* The walk's start, under every device's allocator lock, which the walk holds for its whole
 * duration: every trace copied in the state the segments show (also when there are none: copied
 * after the walk, a racing allocation's entries would have no block). */
static void copy_traces(void *arg) {
    collect_t *c = arg;
    for (int d = 0; d < c->ndev && !c->failed; d++)
        copy_trace(c, d);
}

/* The walk's end, still under every device's allocator lock: PyTorch appends a `snapshot` entry
 * to every device's history on each snapshot, after it copied the traces (trace() before each
 * device's snapshot()), so the marker is in the ring for later dumps, never in this one, whose
 * last entry is the last action before it. Recorded here, not once the locks are released: an
 * allocation another thread made in between would come before the marker in the ring, though
 * the snapshot does not show it (a later dump's state history then put it before this
 * snapshot). */
static void mark_snapshot(void *arg) {
    collect_t *c = arg;
    if (c->failed || !sp__history_keeps_actions())
        return; /* failed: no snapshot; not recording: no action history, no marker */
    for (int d = 0; d < c->ndev; d++)
        sp__history_record(d, SP_TRACE_SNAPSHOT, 0, c->traces[d].active, 0, c->pool_id, 0);
}

/* Runs under the device's allocator lock: copy, take context references, nothing else. */
static void visit(const sp_segment_view_t *seg, void *arg) {
    collect_t *c = arg;
    if (c->failed)
        return;
    if (!grow((void **)&c->segs, &c->segs_alloc, c->nsegs + 1, sizeof(*c->segs)) ||
        !grow((void **)&c->blocks, &c->blocks_alloc, c->nblocks + seg->nblocks,
              sizeof(*c->blocks))) {
        c->failed = true;
        c->status = SP_ERR_SYSTEM;
        return;
    }
    seg_copy_t *sc = &c->segs[c->nsegs++];
    sc->view = *seg;
    sc->view.blocks = NULL;
    sc->view.pool_name = NULL; /* not exported; its storage belongs to the pool */
    sc->first_block = c->nblocks;
    sp__history_context_retain(seg->context);
    for (size_t i = 0; i < seg->nblocks; i++) {
        c->blocks[c->nblocks++] = seg->blocks[i];
        sp__history_context_retain(seg->blocks[i].context);
    }
    if (seg->device >= 0 && seg->device < c->ndev)
        c->traces[seg->device].active += seg->active_size;
}

static void collect_free(collect_t *c) {
    for (size_t i = 0; i < c->nsegs; i++)
        sp__history_context_release(c->segs[i].view.context);
    for (size_t i = 0; i < c->nblocks; i++)
        sp__history_context_release(c->blocks[i].context);
    for (int d = 0; d < c->ndev; d++)
        sp__history_entries_free(c->traces[d].e, c->traces[d].n);
    free(c->segs);
    free(c->blocks);
    free(c->traces);
    free(c->labels);
    sp__history_annotations_free(c->annots, c->nannots);
}

/* ---- writing ---------------------------------------------------------------------------- */

/* Memo index of each context's frame list once written: a stack shared by many blocks and trace
 * entries is built once (a pickle refers back to it, as PyTorch's own pickles do; JSON copies
 * its bytes). */
typedef struct frame_memo {
    uint32_t *index; /* by context id; UINT32_MAX = not written yet */
    size_t n;        /* entries in index */
} frame_memo_t;

/* The memo of the snapshot this thread is writing (set around emit_snapshot in dump()). */
static _Thread_local frame_memo_t *g_memo;

/* One "key: value" entry of the dict being written; the type says which sp__emit_ writes it. */
/* The kv_ helpers take literal keys only: the writer refers back to a key by its address. */
static void kv_int(sp__emit_t *e, const char *key, int64_t v) {
    sp__emit_kv_int(e, key, v);
}
static void kv_uint(sp__emit_t *e, const char *key, uint64_t v) {
    sp__emit_kv_uint(e, key, v);
}
static void kv_double(sp__emit_t *e, const char *key, double v) {
    sp__emit_key_static(e, key);
    sp__emit_double(e, v);
}
static void kv_str(sp__emit_t *e, const char *key, const char *v) {
    sp__emit_key_static(e, key);
    sp__emit_str(e, v);
}
static void kv_bool(sp__emit_t *e, const char *key, bool v) {
    sp__emit_key_static(e, key);
    sp__emit_bool(e, v);
}

static void emit_frames(sp__emit_t *e, uint32_t context) {
    frame_memo_t *m = g_memo;
    if (m != NULL && context < m->n && m->index[context] != UINT32_MAX) {
        sp__emit_memo_get(e, m->index[context]); /* before the lookup: it takes history's lock */
        return;
    }
    const sp__history_frame_t *f;
    size_t n;
    sp__history_context_frames(context, &f, &n);
    if (n > 0 && m != NULL && context >= m->n) {
        size_t nn = (size_t)context * 2 + 16;
        uint32_t *ni = sp__emit_realloc(m->index, nn * sizeof(*ni));
        if (ni != NULL) {
            for (size_t i = m->n; i < nn; i++)
                ni[i] = UINT32_MAX;
            m->index = ni;
            m->n = nn;
        }
    }
    sp__emit_list_begin(e);
    for (size_t i = 0; i < n; i++) {
        sp__emit_dict_begin(e);
        kv_str(e, "filename", f[i].filename);
        /* PyTorch's line is unsigned 64-bit: a negative one is written in that form, as
         * PyTorch writes the -1 of a line it could not tell (2^64-1). */
        if (f[i].line < 0)
            kv_uint(e, "line", (uint64_t)(int64_t)f[i].line);
        else
            kv_int(e, "line", f[i].line);
        kv_str(e, "name", f[i].name);
        sp__emit_dict_end(e);
    }
    sp__emit_list_end(e);
    if (n > 0 && m != NULL && context < m->n)
        m->index[context] = sp__emit_memoize(e);
}

static const char *state_name(sp_block_state_t s) {
    switch (s) {
    case SP_BLOCK_ACTIVE_ALLOCATED:
        return "active_allocated";
    case SP_BLOCK_ACTIVE_PENDING_FREE:
        return "active_pending_free";
    default:
        return "inactive";
    }
}

static void emit_segment(sp__emit_t *e, const collect_t *c, const seg_copy_t *sc) {
    const sp_segment_view_t *v = &sc->view;
    sp__emit_dict_begin(e);
    kv_int(e, "device", v->device);
    kv_uint(e, "address", v->address);
    kv_uint(e, "total_size", v->total_size);
    kv_uint(e, "allocated_size", v->allocated_size);
    kv_uint(e, "active_size", v->active_size);
    kv_uint(e, "requested_size", v->requested_size);
    kv_uint(e, "stream", stream_shown(c, v->stream));
    kv_str(e, "segment_type", v->is_small ? "small" : "large");
    sp__emit_key_static(e, "segment_pool_id");
    sp__emit_tuple2(e, (int64_t)v->pool_id.first, (int64_t)v->pool_id.second);
    kv_bool(e, "is_expandable", v->is_expandable);
    sp__emit_key_static(e, "frames");
    emit_frames(e, v->context);
    sp__emit_key_static(e, "blocks");
    sp__emit_list_begin(e);
    uintptr_t addr = v->address;
    for (size_t i = 0; i < v->nblocks; i++) {
        const sp_block_view_t *b = &c->blocks[sc->first_block + i];
        sp__emit_dict_begin(e);
        kv_uint(e, "address", addr); /* PyTorch: segment address + earlier sizes (== b->address) */
        kv_uint(e, "size", b->size);
        kv_uint(e, "requested_size", b->requested_size);
        sp__emit_kv_str_static(e, "state", state_name(b->state));
        sp__emit_key_static(e, "frames");
        emit_frames(e, b->context);
        sp__emit_dict_end(e);
        addr += b->size;
    }
    sp__emit_list_end(e);
    sp__emit_dict_end(e);
}

static void emit_trace_entry(sp__emit_t *e, const collect_t *c, const sp__trace_entry_t *t) {
    sp__emit_dict_begin(e);
    sp__emit_kv_str_static(e, "action", sp__history_action_name(t->action));
    kv_uint(e, t->action == SP_TRACE_OOM ? "device_free" : "addr", t->addr);
    kv_uint(e, "size", t->size);
    kv_uint(e, "stream", stream_shown(c, t->stream));
    kv_int(e, "time_us", t->time_us);
    sp__emit_kv_str_static(e, "compile_context", "N/A");
    kv_str(e, "user_metadata", sp__history_metadata(t->meta)); /* "" when none, as PyTorch's */
    /* The entry's MemPool, as newer PyTorch writes it (only for private pools here: the default
     * pool's (0, 0) would add a tuple to every entry), so that a replay routes the pool's
     * allocations even after all its segments are gone. */
    if (t->pool.first != 0 || t->pool.second != 0) {
        sp__emit_key_static(e, "pool_id");
        sp__emit_tuple2(e, (int64_t)t->pool.first, (int64_t)t->pool.second);
    }
    if (t->context != 0) {
        sp__emit_key_static(e, "frames");
        emit_frames(e, t->context);
    }
    sp__emit_dict_end(e);
}

static void emit_settings(sp__emit_t *e) {
    sp_alloc_conf_t conf;
    sp__alloc_conf_get(&conf);
    sp__emit_dict_begin(e);
    kv_str(e, "PYTORCH_CUDA_ALLOC_CONF", conf.conf_text);
    kv_int(e, "max_split_size",
           conf.max_split_size == SIZE_MAX ? -1 : (int64_t)conf.max_split_size);
    kv_double(e, "garbage_collection_threshold", conf.gc_threshold);
    kv_bool(e, "expandable_segments", conf.expandable_segments);
    kv_int(e, "pinned_num_register_threads", conf.pinned_num_register_threads);
    kv_bool(e, "release_lock_on_cudamalloc", conf.release_lock_on_cudamalloc);
    kv_bool(e, "pinned_use_cuda_host_register", conf.pinned_use_cuda_host_register);
    kv_bool(e, "graph_capture_record_stream_reuse", conf.graph_capture_record_stream_reuse);
    sp__emit_key_static(e, "roundup_power2_divisions");
    sp__emit_dict_begin(e);
    for (int i = 0; i < 16; i++) {
        char key[16];
        snprintf(key, sizeof(key), "%d", 1 << i);
        sp__emit_key(e, key); /* a buffer of ours, not a fixed string */
        sp__emit_int(e, conf.roundup_divisions[i]);
    }
    sp__emit_dict_end(e);
    /* (sympool addition) With expandable segments, the rules of ours in force (SYMPOOL_
     * EXPANDABLE_PAGE, _RECYCLE, ... as NAME=VALUE items): PyTorch's keys cannot say them, and a
     * replay of the snapshot took PyTorch's rules in their place (sympool's own recordings came
     * back 10-31% above their peak reserved). */
    if (conf.expandable_segments) {
        char rules[1024];
        size_t used = 0;
        sp_x_option_info_t info;
        for (int i = 0; sp_x_option_info(i, &info) && used < sizeof rules; i++)
            if (strncmp(info.name, "SYMPOOL_EXPANDABLE_", 19) == 0 &&
                strcmp(info.name, "SYMPOOL_EXPANDABLE_SEGMENTS") != 0)
                used += (size_t)snprintf(rules + used, sizeof rules - used, "%s%s=%s",
                                         used ? "," : "", info.name, info.value);
        if (used < sizeof rules)
            kv_str(e, "sympool_expandable_rules", rules);
    }
    sp__emit_dict_end(e);
}

static bool same_pool(sp_mempool_id_t a, sp_mempool_id_t b) {
    return a.first == b.first && a.second == b.second;
}

static void emit_snapshot(sp__emit_t *e, const collect_t *c) {
    sp__emit_dict_begin(e);
    sp__emit_key_static(e, "segments");
    sp__emit_list_begin(e);
    for (size_t i = 0; i < c->nsegs; i++) {
        emit_segment(e, c, &c->segs[i]);
        sp__emit_flush_point(e);
    }
    sp__emit_list_end(e);
    sp__emit_key_static(e, "device_traces");
    sp__emit_list_begin(e);
    for (int d = 0; d < c->ndev; d++) {
        const trace_copy_t *t = &c->traces[d];
        sp__emit_list_begin(e);
        for (size_t i = 0; i < t->n; i++) {
            /* A pool's snapshot keeps only that pool's events (and the snapshot marks), so that
             * replaying them backwards meets only the pool's segments. */
            if (c->pool != NULL && t->e[i].action != SP_TRACE_SNAPSHOT &&
                !same_pool(t->e[i].pool, c->pool_id))
                continue;
            emit_trace_entry(e, c, &t->e[i]);
            sp__emit_flush_point(e);
        }
        sp__emit_list_end(e);
    }
    sp__emit_list_end(e);
    sp__emit_key_static(e, "allocator_settings");
    emit_settings(e);
    sp__emit_key_static(e, "external_annotations");
    sp__emit_list_begin(e);
    /* PyTorch writes an annotation's metadata (stage and name, in the order its snapshots show)
     * and then its device and time. A pool's snapshot has them all, as PyTorch's does. */
    for (size_t i = 0; i < c->nannots; i++) {
        const sp__annotation_t *a = &c->annots[i];
        sp__emit_dict_begin(e);
        kv_str(e, "stage", a->stage);
        kv_str(e, "name", a->name);
        kv_int(e, "device", a->device);
        kv_int(e, "time_us", a->time_us);
        sp__emit_dict_end(e);
    }
    sp__emit_list_end(e);
    sp__emit_dict_end(e);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Expand %r, %p, %h and %% in a snapshot path with the same function and rank as the log file
 * pattern (DESIGN.md: sp_dump_snapshot("rank%r.pickle")); a process outside any launcher and
 * before sp_world_init is rank 0. */
static sp_status_t expand_path(const char *pattern, char *out, size_t cap) {
    if (sp__path_expand(pattern, 0, out, cap) != SP_EXPAND_OK)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_HISTORY, "snapshot path too long: %s",
                         pattern);
    return SP_SUCCESS;
}

static void (*_Atomic s_test_after_walk)(void); /* sp__snapshot_test_after_walk */

void sp__snapshot_test_after_walk(void (*fn)(void)) {
    s_test_after_walk = fn;
}

/* dump's collection and writing into the opened file, which it commits; aborting it on failure is
 * the caller's. */
static sp_status_t dump_to(const sp_mempool_t *pool, const char *path, sp__atomic_file_t *file) {
    collect_t c;
    memset(&c, 0, sizeof(c));
    c.pool = pool;
    if (pool != NULL)
        c.pool_id = sp_mempool_id(pool);
    int ndev = sp_device_count();
    int nhist = sp__history_device_count();
    c.ndev = ndev > nhist ? ndev : nhist;
    if (c.ndev < 1)
        c.ndev = 1;
    c.traces = sp__emit_realloc(NULL, (size_t)c.ndev * sizeof(*c.traces));
    if (c.traces != NULL)
        memset(c.traces, 0, (size_t)c.ndev * sizeof(*c.traces));
    if (c.traces == NULL)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY, "out of host memory for a snapshot");

    sp_status_t s = sp__pool_walk_from(pool != NULL ? sp__mempool_device(pool) : -1, pool,
                                       copy_traces, visit, mark_snapshot, &c);
    void (*after_walk)(void) = s_test_after_walk;
    if (after_walk)
        after_walk();
    if (s == SP_SUCCESS && c.failed)
        s = c.status == SP_ERR_SYSTEM
                ? sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY, "out of host memory for a snapshot")
                : c.status;
    if (s != SP_SUCCESS) {
        collect_free(&c);
        return s;
    }
    if (!c.failed && !sp__history_stream_labels(&c.labels, &c.nlabels)) {
        c.failed = true;
        c.status = sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY, "out of host memory for a snapshot");
    }
    if (!c.failed && sp__history_annotations(&c.annots, &c.nannots) != SP_SUCCESS) {
        c.failed = true;
        c.status = sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY, "out of host memory for a snapshot");
    }
    if (c.failed) {
        s = c.status;
        collect_free(&c);
        return s;
    }
    sp__emit_t e;
    bool json = ends_with(path, ".json");
    sp__emit_init(&e, json);
    /* Written to its file as it goes: a document of tens of megabytes whole in a fresh buffer
     * would cost more in page faults than building it. */
    sp__emit_to_file(&e, file);
    frame_memo_t memo = {NULL, 0};
    g_memo = &memo;
    emit_snapshot(&e, &c);
    g_memo = NULL;
    free(memo.index);
    collect_free(&c);
    char *buf = NULL;
    size_t len = 0;
    s = sp__emit_finish(&e, &buf, &len);
    if (s == SP_SUCCESS)
        s = sp__file_atomic_commit(file);
    free(buf);
    if (s == SP_SUCCESS)
        SP_INFO(SP_SUB_HISTORY, "wrote snapshot %s (%zu bytes)", path, len);
    return s;
}

/* The whole dump: collect (under the allocator locks), write, release. */
static sp_status_t dump(const sp_mempool_t *pool, const char *pattern) {
    SP_ARG_CHECK(pattern != NULL && pattern[0] != '\0', SP_SUB_HISTORY,
                 "snapshot path is NULL or empty");
    char path[PATH_MAX];
    SP_CHECK(expand_path(pattern, path, sizeof(path)));
    /* The file first: a path that cannot be written is refused before the walk gives the thread
     * caches back to the pool or the history gets a snapshot marker (PyTorch opens the file
     * after taking the snapshot; a refused call here changes nothing). */
    sp__atomic_file_t file;
    SP_CHECK(sp__file_atomic_open(&file, path));
    sp_status_t s = dump_to(pool, path, &file);
    if (s != SP_SUCCESS)
        sp__file_atomic_abort(&file);
    return s;
}

SP_EXPORT sp_status_t sp_dump_snapshot(const char *path) {
    SP_GATE("sp_dump_snapshot");
    return dump(NULL, path);
}

SP_EXPORT sp_status_t sp_mempool_dump_snapshot(const sp_mempool_t *pool, const char *path) {
    SP_GATE("sp_mempool_dump_snapshot");
    SP_CHECK(sp__mempool_check(pool, "sp_mempool_dump_snapshot"));
    return dump(pool, path);
}
