/*
 * history.c: memory history, PyTorch's _record_memory_history. Owns the per-device ring buffers of
 * trace entries, the table of interned stack contexts (frames from a binding's hook and/or C
 * frames from backtrace()), and the recording parameters.
 *
 * Invariants:
 *  - A ring of capacity cap (0 = unbounded) holds at most cap entries; when full the oldest is
 *    overwritten and `head` names the oldest slot, so a read from head wraps in time order.
 *  - Every context id stored in a trace entry carries one reference; the allocator owns the
 *    reference sp__history_capture returned. A context is freed when its count drops to zero.
 *  - Identical stacks (same hook frames and program counters) intern to one context.
 *
 * Lock: one mutex (g.lock) guards the rings, the context table and the parameters. The allocator
 * calls sp__history_record and sp__history_context_release under its own lock, so the order is
 * always allocator lock -> g.lock; nothing here calls back into the allocator. Stack capture
 * (backtrace, dladdr, the hook) runs before g.lock is taken, and outside the allocator lock.
 * sp__history_active is read without the lock (relaxed atomic loads, sp__history_on) so
 * recording off costs one load; g_keep_actions likewise lets recording off skip g.lock.
 *
 * enabled=STATE keeps the stacks of live blocks (their contexts) and a ring of exactly one trace
 * entry, whichever event came last: PyTorch's _record_memory_history sets max_entries to 1
 * unless enabled is "all", so a snapshot taken after empty_cache ends in its segment_free.
 */
#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "pool/allocator.h"
#include "pool/fork.h"
#include "pool/history.h"
#include "pool/pyframes.h"
#include "sympool/history.h"

#define MAX_PCS 48 /* C frames captured per stack */
/* Frames a binding's hook may give per stack. PyTorch keeps every frame; 14 of 47 real traces
 * here have Python stacks of 72 to 212 frames, which 64 cut (a replay's snapshot then showed
 * shorter stacks than the trace it replayed). */
#define MAX_HOOK 256
/* A hook that fills all MAX_HOOK may have cut a deeper stack (real traces have Python stacks of
 * 263 and 303 frames): it is asked again with room for 4 x as many, up to this many. */
#define MAX_DEEP 4096
#define INITIAL_BUCKETS 1024
/* Slots of the index from a Python stack's frame keys to its context (a power of two). */
#define KEY_SLOTS 4096

int sp__history_active = 0;

/* sp__history_active's stores (under g.lock), with the fast paths' count of reasons to step
 * aside (core.h) following its changes. */
static void set_active(int on) {
    if (__atomic_load_n(&sp__history_active, __ATOMIC_RELAXED) == on)
        return;
    __atomic_store_n(&sp__history_active, on, __ATOMIC_RELAXED);
    sp__fast_off_add(on ? SP_FAST_REASON : -SP_FAST_REASON);
}
/* 1 while trace entries are kept (enabled=ALL); atomic stores under g.lock, relaxed loads. */
static int g_keep_actions = 0;
/* sp_x_history_stamp's time for new entries, < 0 for the clock: relaxed atomic stores and loads
 * (a replay sets it before each event; the load is under g.lock, so each entry takes one value). */
static int64_t g_stamp = -1;

/* sp_x_history_stamp_next's times, one FIFO per action (g.lock): an entry of that action takes
 * the oldest queued one before g_stamp or the clock. g_queued counts them all, so that recording
 * with none queued (everything but a replay's snapshot) pays one compare. */
#define NACTIONS (SP_TRACE_OOM + 1)
static struct stamp_fifo {
    int64_t *t;       /* times, [head, len) pending */
    size_t head, len; /* next to take / end */
    size_t cap;       /* slots in t */
} g_next[NACTIONS];
static size_t g_queued;

/* One annotation as held (sp__annotation_t's, its time a tick unless stamped). */
typedef struct annot {
    int device;
    bool stamped; /* time is microseconds (sp_x_history_stamp), not a tick */
    uint64_t time;
    char *stage, *name; /* owned */
} annot_t;

typedef struct ring {
    sp__trace_entry_t *buf; /* entries; `len` valid (g.lock) */
    size_t len;             /* entries held (g.lock) */
    size_t alloc;           /* slots allocated in buf (g.lock) */
    size_t head;            /* oldest entry's slot once full; 0 before (g.lock) */
    uint64_t last_ticks;    /* the newest entry's stamp: later ones never get an earlier one */
} ring_t;

typedef struct context {
    uint32_t refs;               /* references: blocks, trace entries, snapshot copies (g.lock) */
    uint32_t next;               /* next id in the same hash bucket, 0 = end (g.lock) */
    uint64_t hash;               /* of the raw stack, for interning (immutable) */
    size_t npcs;                 /* program counters in pcs (immutable) */
    void **pcs;                  /* raw C stack, for interning (immutable) */
    size_t nhook;                /* how many of frames came from the hook (immutable) */
    size_t nframes;              /* frames (immutable) */
    sp__history_frame_t *frames; /* hook frames then C frames; strings owned (immutable) */
    uint64_t *keys; /* the library's Python hook's frame keys (pyframes.h) of the last stack that
                       found this context, nhook of them; NULL: none (g.lock) */
} context_t;

static struct {
    pthread_mutex_t lock;         /* guards everything below */
    sp_history_enabled_t enabled; /* OFF/STATE/ALL (g.lock; mirrored in sp__history_active) */
    sp_history_context_t
        context;       /* which records carry frames (g.lock; atomic: capture's fast check) */
    bool c_stacks;     /* capture C frames (g.lock) */
    int want_frames;   /* hook set or c_stacks (g.lock; atomic: capture's fast exit) */
    size_t cap;        /* ring capacity; 0 = unbounded (g.lock) */
    uint32_t skip;     /* bit per sp_trace_action_t never stored (g.lock) */
    ring_t *rings;     /* one per device seen (g.lock) */
    int nrings;        /* entries in rings (g.lock) */
    context_t *ctx;    /* contexts by id - 1 (g.lock) */
    size_t nctx;       /* slots used in ctx (g.lock) */
    size_t ctx_alloc;  /* slots allocated in ctx (g.lock) */
    uint32_t free_ids; /* head of the free-id list (through context.next), 0 = none */
    uint32_t *buckets; /* hash -> first id (g.lock) */
    uint32_t keyed[KEY_SLOTS];    /* hash of a stack's frame keys -> a context id, a hint that
                                     key_lookup_locked checks against the context's keys (g.lock) */
    size_t nbuckets;              /* power of two (g.lock) */
    size_t live_ctx;              /* contexts with refs > 0 (g.lock) */
    sp_history_frames_fn hook;    /* binding's frame source (g.lock) */
    void *hook_arg;               /* its argument (g.lock) */
    sp_tick_anchor_t anchor;      /* the clocks when history was first turned on (g.lock) */
    bool anchored;                /* anchor taken (g.lock) */
    sp__stream_label_t *labels;   /* streams' labels, unordered (g.lock; a replay has a few) */
    size_t nlabels, labels_alloc; /* (g.lock) */
    char **meta_text;             /* user metadata texts by id - 1, never changed while held;
                                     NULL for a free id (g.lock) */
    size_t *meta_refs;            /* by id - 1: the devices' texts in force, the ring entries
                                     and the entries' copies that name it; the text is freed at
                                     0 (g.lock) */
    uint32_t nmeta, meta_alloc;   /* ids handed out (the highest) / room (g.lock) */
    uint32_t *meta_free;          /* freed ids, taken again first (a stack; g.lock) */
    uint32_t nmeta_free;          /* (g.lock) */
    uint32_t nmeta_live;          /* texts held (g.lock) */
    uint32_t *meta_slots;         /* open addressing over the texts: an id, 0 for empty or
                                     META_GONE for a freed one's; nmeta_slots a power of 2, at
                                     most half taken, freed ones included (g.lock) */
    uint32_t nmeta_slots;         /* (g.lock) */
    uint32_t nmeta_gone;          /* META_GONE slots (g.lock) */
    uint32_t *meta_cur;           /* per device: the id new entries get, 0 = "" (g.lock) */
    int nmeta_cur;                /* entries in meta_cur (g.lock) */
    annot_t *annots;              /* external annotations: a ring of capacity cap as the trace
                                     rings, one for all devices as PyTorch's (g.lock) */
    size_t nannots, annots_alloc; /* held / slots allocated (g.lock) */
    size_t annot_head;            /* the oldest's slot once full; 0 before (g.lock) */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void meta_ref_locked(uint32_t id);
static void meta_unref_locked(uint32_t id);
static void annots_clear_locked(void);

static const char *const action_names[] = {"alloc",         "free_requested", "free_completed",
                                           "segment_alloc", "segment_free",   "segment_map",
                                           "segment_unmap", "snapshot",       "oom"};

const char *sp__history_action_name(sp_trace_action_t action) {
    if ((unsigned)action >= sizeof(action_names) / sizeof(action_names[0]))
        return "unknown";
    return action_names[action];
}

/* ---- contexts --------------------------------------------------------------------------- */

static context_t *ctx_get(uint32_t id) {
    if (id == 0 || id > g.nctx || g.ctx[id - 1].refs == 0)
        return NULL;
    return &g.ctx[id - 1];
}

static void ctx_destroy(context_t *c) {
    for (size_t i = 0; i < c->nframes; i++) {
        free((char *)c->frames[i].name);
        free((char *)c->frames[i].filename);
    }
    free(c->frames);
    free(c->pcs);
    free(c->keys);
    memset(c, 0, sizeof(*c));
}

/* Unlink id from its bucket and put it on the free list. g.lock held. */
static void ctx_unref_locked(uint32_t id) {
    context_t *c = ctx_get(id);
    if (c == NULL || --c->refs > 0)
        return;
    uint32_t *link = &g.buckets[c->hash & (g.nbuckets - 1)];
    while (*link != 0 && *link != id)
        link = &g.ctx[*link - 1].next;
    if (*link == id)
        *link = c->next;
    ctx_destroy(c);
    c->next = g.free_ids;
    g.free_ids = id;
    g.live_ctx--;
}

static bool rehash_locked(size_t nbuckets) {
    uint32_t *b = calloc(nbuckets, sizeof(*b));
    if (b == NULL)
        return false;
    for (size_t i = 0; i < g.nctx; i++) {
        context_t *c = &g.ctx[i];
        if (c->refs == 0)
            continue;
        size_t k = c->hash & (nbuckets - 1);
        c->next = b[k];
        b[k] = (uint32_t)(i + 1);
    }
    free(g.buckets);
    g.buckets = b;
    g.nbuckets = nbuckets;
    return true;
}

static inline uint64_t hash_mix(uint64_t h, uint64_t w) {
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

static inline uint64_t load_le(const unsigned char *s, size_t n) {
    uint64_t w = 0;
    memcpy(&w, s, n); /* n is 4 or 8 at every call: one load */
    return w;
}

/* Eight bytes a step, the length mixed in first, the last step an overlapping load of the last
 * eight bytes (or two of four, or three single bytes) instead of a byte loop: every recorded call
 * with stacks on hashes its whole stack, 24 strings for a 12-frame Python stack, and a byte a step
 * (FNV-1a) cost some 1,400 instructions of the capture's 2,000. The bucket takes the low bits,
 * which the shift feeds from the product's high half. A collision only costs a compare. */
static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    h = hash_mix(h, n);
    if (n >= 8) {
        for (size_t i = 0; i + 8 < n; i += 8)
            h = hash_mix(h, load_le(s + i, 8));
        return hash_mix(h, load_le(s + n - 8, 8));
    }
    if (n >= 4)
        return hash_mix(h, load_le(s, 4) | load_le(s + n - 4, 4) << 32);
    if (n > 0)
        return hash_mix(h, (uint64_t)s[0] | (uint64_t)s[n / 2] << 8 | (uint64_t)s[n - 1] << 16);
    return h;
}

static bool same_stack(const context_t *c, void *const *pcs, size_t npcs,
                       const sp_history_frame_t *hook, size_t nhook) {
    if (c->npcs != npcs || c->nhook != nhook)
        return false;
    if (npcs && memcmp(c->pcs, pcs, npcs * sizeof(void *)) != 0)
        return false;
    for (size_t i = 0; i < nhook; i++) {
        const sp__history_frame_t *f = &c->frames[i];
        if (f->line != hook[i].line || strcmp(f->name, hook[i].name ? hook[i].name : "??") != 0 ||
            strcmp(f->filename, hook[i].filename ? hook[i].filename : "??") != 0)
            return false;
    }
    return true;
}

static char *dup_or(const char *s, const char *fallback) {
    return strdup(s != NULL ? s : fallback);
}

/* How a C frame relates to sympool itself, to drop the allocator's own frames from a stack. */
typedef enum { FRAME_USER, FRAME_OURS, FRAME_OURS_ENTRY } frame_kind_t;

/* Whether sympool is a shared object of its own (libsympool.so) rather than linked into the
 * program: then every frame in its object is sympool's own, named or not. (In the program, an
 * unnamed frame of that object may be the caller's static function.) */
static bool g_self_shared;
static pthread_once_t g_self_once = PTHREAD_ONCE_INIT;

static int first_object(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    *(const void **)arg = info->dlpi_phdr;
    return 1; /* dl_iterate_phdr(3): the first object visited is the main program */
}

static void self_shared_init(void) {
    Dl_info self, prog;
    const void *phdr = NULL;
    (void)dl_iterate_phdr(first_object, &phdr);
    g_self_shared = phdr != NULL && dladdr((void *)(uintptr_t)&sp__history_capture, &self) &&
                    dladdr(phdr, &prog) && prog.dli_fbase != self.dli_fbase;
}

/* Symbolize the C frames: dladdr gives the nearest exported symbol and the object file. Source
 * file and line would need DWARF (addr2line); we keep it cheap and report the object path with
 * line 0 and "symbol+0xoff" so a person can run addr2line on it. *kind_p says whether the frame
 * is in sympool's object with an sp_ name (a public entry point) or no name (a hidden helper). */
static bool symbolize(sp__history_frame_t *f, void *pc, frame_kind_t *kind_p) {
    Dl_info info, self;
    char buf[512];
    memset(&info, 0, sizeof(info));
    memset(&self, 0, sizeof(self));
    int found = dladdr(pc, &info);
    *kind_p = FRAME_USER;
    if (found && dladdr((void *)(uintptr_t)&sp__history_capture, &self) &&
        info.dli_fbase == self.dli_fbase) {
        if (info.dli_sname == NULL)
            *kind_p = FRAME_OURS;
        else if (strncmp(info.dli_sname, "sp_", 3) == 0)
            *kind_p = FRAME_OURS_ENTRY;
    }
    if (found != 0 && info.dli_sname != NULL)
        snprintf(buf, sizeof(buf), "%s+0x%lx", info.dli_sname,
                 (unsigned long)((char *)pc - (char *)info.dli_saddr));
    else if (info.dli_fbase != NULL)
        snprintf(buf, sizeof(buf), "0x%lx", (unsigned long)((char *)pc - (char *)info.dli_fbase));
    else
        snprintf(buf, sizeof(buf), "%p", pc);
    f->name = strdup(buf);
    f->filename = dup_or(info.dli_fname, "??");
    f->line = 0;
    return f->name != NULL && f->filename != NULL;
}

/* Build a context outside g.lock (the strings are the slow part). */
static bool ctx_build(context_t *c, void *const *pcs, size_t npcs, const sp_history_frame_t *hook,
                      size_t nhook) {
    memset(c, 0, sizeof(*c));
    c->frames = calloc(npcs + nhook + 1, sizeof(*c->frames));
    c->pcs = malloc((npcs + 1) * sizeof(void *));
    if (c->frames == NULL || c->pcs == NULL)
        goto fail;
    memcpy(c->pcs, pcs, npcs * sizeof(void *));
    c->npcs = npcs;
    c->nhook = nhook;
    for (size_t i = 0; i < nhook; i++) {
        c->nframes = i + 1; /* counted first so that a failure frees what was copied */
        c->frames[i].name = dup_or(hook[i].name, "??");
        c->frames[i].filename = dup_or(hook[i].filename, "??");
        c->frames[i].line = hook[i].line;
        if (c->frames[i].name == NULL || c->frames[i].filename == NULL)
            goto fail;
    }
    /* The leading frames inside sympool (hidden helpers, then the public sp_* entry the caller
     * called) say nothing about the caller: drop them up to the last entry point. The raw pcs
     * stay whole, so interning is unaffected. */
    size_t drop = 0;
    bool leading = true;
    /* An entry point that ends in a tail call (sp_free jumps to its helper) leaves no frame of
     * its own: in a shared sympool, its unnamed helpers are dropped all the same (they showed
     * as the first C frame, "0x18363" in libsympool.so, of every alloc and free). */
    if (npcs > 0)
        (void)pthread_once(&g_self_once, self_shared_init);
    for (size_t i = 0; i < npcs; i++) {
        frame_kind_t kind;
        bool ok = symbolize(&c->frames[c->nframes], pcs[i], &kind);
        c->nframes++;
        if (!ok)
            goto fail;
        if (leading && kind == FRAME_USER)
            leading = false;
        if (leading && (kind == FRAME_OURS_ENTRY || (kind == FRAME_OURS && g_self_shared)))
            drop = i + 1;
    }
    if (drop > 0 && drop < npcs) {
        sp__history_frame_t *first = &c->frames[nhook];
        for (size_t i = 0; i < drop; i++) {
            free((char *)first[i].name);
            free((char *)first[i].filename);
        }
        memmove(first, first + drop, (npcs - drop) * sizeof(*first));
        c->nframes -= drop;
    }
    return true;
fail:
    ctx_destroy(c);
    return false;
}

/* Insert a built context (or find an identical one that appeared meanwhile). g.lock held.
 * Returns its id with one reference for the caller, 0 on out of memory (c is destroyed). */
static uint32_t ctx_insert_locked(context_t *c) {
    if (g.nbuckets == 0 && !rehash_locked(INITIAL_BUCKETS)) {
        ctx_destroy(c);
        return 0;
    }
    uint32_t id = g.free_ids;
    if (id != 0) {
        g.free_ids = g.ctx[id - 1].next;
    } else {
        if (g.nctx == g.ctx_alloc) {
            size_t n = g.ctx_alloc ? g.ctx_alloc * 2 : 256;
            context_t *nc = realloc(g.ctx, n * sizeof(*nc));
            if (nc == NULL || n > UINT32_MAX) {
                if (nc != NULL)
                    g.ctx = nc;
                ctx_destroy(c);
                return 0;
            }
            g.ctx = nc;
            g.ctx_alloc = n;
        }
        id = (uint32_t)++g.nctx;
    }
    context_t *slot = &g.ctx[id - 1];
    *slot = *c;
    slot->refs = 1;
    size_t k = slot->hash & (g.nbuckets - 1);
    slot->next = g.buckets[k];
    g.buckets[k] = id;
    g.live_ctx++;
    if (g.live_ctx > 2 * g.nbuckets)
        (void)rehash_locked(g.nbuckets * 2); /* on failure the chains just get longer */
    return id;
}

static uint32_t ctx_lookup_locked(uint64_t hash, void *const *pcs, size_t npcs,
                                  const sp_history_frame_t *hook, size_t nhook) {
    if (g.nbuckets == 0)
        return 0;
    for (uint32_t id = g.buckets[hash & (g.nbuckets - 1)]; id != 0; id = g.ctx[id - 1].next) {
        context_t *c = &g.ctx[id - 1];
        if (c->hash == hash && same_stack(c, pcs, npcs, hook, nhook)) {
            c->refs++;
            return id;
        }
    }
    return 0;
}

/*
 * The keyed path. With the library's own Python hook, every frame comes with a key that stands
 * for its name, file and line and is never reused (pyframes.h), so a stack of keys equal to the
 * ones a context was last found with has that context's frames: a hash of one word a frame and
 * a compare of the keys, instead of hashing every name and file name and comparing them again
 * (callgrind: some 160 instructions a frame, half of a 33-frame capture). `keyed` only points
 * the way: a miss, or a context freed since, takes the hash of the texts as any stack does.
 */
static bool keys_hash(const uint64_t *keys, size_t n, uint64_t *hash_p) {
    uint64_t h = hash_mix(0x84222325cbf29ce4ull, n);
    for (size_t i = 0; i < n; i++) {
        if (keys[i] == 0)
            return false; /* a frame read without the cache: no key to stand for it */
        h = hash_mix(h, keys[i]);
    }
    *hash_p = h;
    return true;
}

static uint32_t key_lookup_locked(uint64_t khash, const uint64_t *keys, size_t n) {
    uint32_t id = g.keyed[khash & (KEY_SLOTS - 1)];
    context_t *c = ctx_get(id);
    if (c == NULL || c->keys == NULL || c->npcs != 0 || c->nhook != n ||
        memcmp(c->keys, keys, n * sizeof(*keys)) != 0)
        return 0;
    c->refs++;
    return id;
}

/* Remember that these keys found context id (whose frames equal the stack's: same nhook). */
static void key_remember_locked(uint32_t id, uint64_t khash, const uint64_t *keys, size_t n) {
    context_t *c = ctx_get(id);
    if (c == NULL || c->nhook != n || c->npcs != 0)
        return;
    if (c->keys == NULL && (c->keys = malloc(n * sizeof(*keys))) == NULL)
        return; /* out of host memory: this stack keeps taking the longer way */
    memcpy(c->keys, keys, n * sizeof(*keys));
    g.keyed[khash & (KEY_SLOTS - 1)] = id;
}

/* The hook's frames into hf (keys: the library's Python hook's frame keys), at most max. */
static size_t hook_frames(sp_history_frames_fn hook, void *hook_arg, bool keyed,
                          sp_history_frame_t *hf, uint64_t *keys, size_t max) {
    /* Zeroed first: a hook that returns more than it wrote (more than max) leaves the rest
     * NULL, which reads as "??", instead of garbage read as strings. The library's own Python
     * hook writes every frame it counts: it needs no zeroing. */
    if (!keyed)
        memset(hf, 0, max * sizeof(*hf));
    sp__callback_enter();
    size_t n = keyed ? sp__python_frames_keyed(hf, keys, max, hook_arg) : hook(hf, max, hook_arg);
    sp__callback_leave();
    return n > max ? max : n;
}

static uint32_t intern_stack(void *const *stack, size_t npcs, const sp_history_frame_t *hf,
                             const uint64_t *keys, size_t nhook, bool keyed);

uint32_t sp__history_capture(bool is_free) {
    if (__atomic_load_n(&sp__history_active, __ATOMIC_RELAXED) == 0)
        return 0;
    sp_history_context_t level = __atomic_load_n(&g.context, __ATOMIC_RELAXED);
    if (level == SP_CONTEXT_NONE || (is_free && level != SP_CONTEXT_ALL))
        return 0;
    if (!__atomic_load_n(&g.want_frames, __ATOMIC_RELAXED))
        return 0; /* no hook and no C stacks: nothing to capture, no lock taken */
    /* Read the hook and its argument together (a concurrent sp_history_set_frames_hook must not
     * pair one hook with another's argument); the hook itself runs with no lock held. */
    pthread_mutex_lock(&g.lock);
    sp_history_frames_fn hook = g.hook;
    void *hook_arg = g.hook_arg;
    bool c_stacks = g.c_stacks;
    pthread_mutex_unlock(&g.lock);
    if (hook == NULL && !c_stacks)
        return 0;

    sp_history_frame_t hf_room[MAX_HOOK], *hf = hf_room;
    uint64_t keys_room[MAX_HOOK], *keys = keys_room;
    void *deep = NULL; /* hf and keys on the heap, for a stack deeper than MAX_HOOK */
    bool keyed = hook == sp_history_python_frames;
    size_t nhook = 0;
    if (hook != NULL) {
        nhook = hook_frames(hook, hook_arg, keyed, hf, keys, MAX_HOOK);
        for (size_t room = 4 * MAX_HOOK; nhook >= room / 4 && room <= MAX_DEEP; room *= 4) {
            void *more = realloc(deep, room * (sizeof(*hf) + sizeof(*keys)));
            if (more == NULL)
                break; /* out of host memory: the stack stays cut */
            deep = more;
            hf = deep;
            keys = (uint64_t *)(hf + room);
            nhook = hook_frames(hook, hook_arg, keyed, hf, keys, room);
        }
    }
    void *pcs[MAX_PCS + 2];
    size_t npcs = 0, skip = 0;
    if (c_stacks) {
        int n = backtrace(pcs, MAX_PCS + 2);
        npcs = n > 0 ? (size_t)n : 0;
        skip = npcs > 0 ? 1 : 0; /* this function's own frame */
    }
    void **stack = pcs + skip;
    npcs -= skip;
    uint32_t id = intern_stack(stack, npcs, hf, keys, nhook, keyed);
    free(deep);
    return id;
}

/* The context of one stack (C frames, then hook frames; keys: the Python hook's frame keys when
 * keyed), found or made. */
static uint32_t intern_stack(void *const *stack, size_t npcs, const sp_history_frame_t *hf,
                             const uint64_t *keys, size_t nhook, bool keyed) {
    /* No frames (a hook on a thread Python never ran, a replayed entry recorded with none) are
     * a stack all the same, interned as one context of no frames: PyTorch gathers a context
     * that is empty there, not none, so a free shows no frames and does not take its
     * allocation's stack (the fallback is for a level that gathers nothing for frees). */
    uint64_t khash = 0;
    keyed = keyed && npcs == 0 && keys_hash(keys, nhook, &khash);
    if (keyed) {
        pthread_mutex_lock(&g.lock);
        uint32_t id = key_lookup_locked(khash, keys, nhook);
        pthread_mutex_unlock(&g.lock);
        if (id != 0)
            return id;
    }

    uint64_t hash = hash_bytes(0xcbf29ce484222325ull, stack, npcs * sizeof(void *));
    for (size_t i = 0; i < nhook; i++) {
        if (hf[i].name)
            hash = hash_bytes(hash, hf[i].name, strlen(hf[i].name));
        if (hf[i].filename)
            hash = hash_bytes(hash, hf[i].filename, strlen(hf[i].filename));
        hash = hash_mix(hash, (uint32_t)hf[i].line);
    }

    pthread_mutex_lock(&g.lock);
    uint32_t id = ctx_lookup_locked(hash, stack, npcs, hf, nhook);
    if (id != 0 && keyed)
        key_remember_locked(id, khash, keys, nhook);
    pthread_mutex_unlock(&g.lock);
    if (id != 0)
        return id;

    context_t c;
    if (!ctx_build(&c, stack, npcs, hf, nhook))
        return 0; /* out of host memory: record without frames rather than fail the allocation */
    c.hash = hash;
    pthread_mutex_lock(&g.lock);
    id = ctx_lookup_locked(hash, stack, npcs, hf, nhook);
    if (id != 0)
        ctx_destroy(&c); /* another thread interned the same stack meanwhile */
    else
        id = ctx_insert_locked(&c);
    if (id != 0 && keyed)
        key_remember_locked(id, khash, keys, nhook);
    pthread_mutex_unlock(&g.lock);
    return id;
}

void sp__history_context_release(uint32_t context) {
    if (context == 0)
        return;
    pthread_mutex_lock(&g.lock);
    ctx_unref_locked(context);
    pthread_mutex_unlock(&g.lock);
}

void sp__history_context_retain(uint32_t context) {
    if (context == 0)
        return;
    pthread_mutex_lock(&g.lock);
    context_t *c = ctx_get(context);
    if (c != NULL)
        c->refs++;
    pthread_mutex_unlock(&g.lock);
}

void sp__history_context_frames(uint32_t context, const sp__history_frame_t **frames_p,
                                size_t *n_p) {
    pthread_mutex_lock(&g.lock);
    context_t *c = ctx_get(context);
    *frames_p = c ? c->frames : NULL;
    *n_p = c ? c->nframes : 0;
    pthread_mutex_unlock(&g.lock);
}

SP_EXPORT void sp_history_set_frames_hook(sp_history_frames_fn fn, void *arg) {
    pthread_mutex_lock(&g.lock);
    g.hook = fn;
    g.hook_arg = arg;
    __atomic_store_n(&g.want_frames, fn != NULL || g.c_stacks, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g.lock);
}

/* ---- rings ------------------------------------------------------------------------------ */

static void ring_clear_locked(ring_t *r) {
    for (size_t i = 0; i < r->len; i++) {
        ctx_unref_locked(r->buf[i].context);
        meta_unref_locked(r->buf[i].meta);
    }
    free(r->buf);
    memset(r, 0, sizeof(*r));
}

/* Rewrite r in time order keeping the newest `keep` entries (dropping the older ones' refs). */
static bool ring_linearize_locked(ring_t *r, size_t keep) {
    size_t n = r->len < keep ? r->len : keep;
    size_t drop = r->len - n;
    sp__trace_entry_t *nb = NULL;
    if (n > 0) {
        nb = malloc(n * sizeof(*nb));
        if (nb == NULL)
            return false;
    }
    for (size_t i = 0; i < r->len; i++) {
        sp__trace_entry_t *e = &r->buf[(r->head + i) % r->len];
        if (i < drop) {
            ctx_unref_locked(e->context);
            meta_unref_locked(e->meta);
        } else
            nb[i - drop] = *e;
    }
    free(r->buf);
    r->buf = nb;
    r->len = r->alloc = n;
    r->head = 0;
    return true;
}

void sp__history_record(int device, sp_trace_action_t action, uintptr_t addr, size_t size,
                        uintptr_t stream, sp_mempool_id_t pool, uint32_t context) {
    if (__atomic_load_n(&g_keep_actions, __ATOMIC_RELAXED) == 0 || device < 0)
        return;
    uint64_t now = sp__ticks(); /* mapped to microseconds by sp__history_copy */
    pthread_mutex_lock(&g.lock);
    if (g.enabled == SP_HISTORY_OFF || (g.skip & (1u << action)) != 0)
        goto out;
    if (device >= g.nrings) {
        ring_t *nr = realloc(g.rings, (size_t)(device + 1) * sizeof(*nr));
        if (nr == NULL)
            goto out; /* the entry is lost; recording must never fail an allocation */
        memset(nr + g.nrings, 0, (size_t)(device + 1 - g.nrings) * sizeof(*nr));
        g.rings = nr;
        g.nrings = device + 1;
    }
    ring_t *r = &g.rings[device];
    /* Stamped before the lock: a thread that stamped earlier may append later. The ring's times
     * stay in its order, as PyTorch's do (its stamp is taken under its lock). */
    if (now < r->last_ticks)
        now = r->last_ticks;
    r->last_ticks = now;
    uint32_t meta = device < g.nmeta_cur ? g.meta_cur[device] : 0;
    sp__trace_entry_t e = {.action = action,
                           .addr = addr,
                           .size = size,
                           .stream = stream,
                           .pool = pool,
                           .time_us = (int64_t)now,
                           .meta = meta};
    /* A given time is the entry's as it is (a replay's recorded times: its own order): one
     * queued for this action first, else the one for every entry. */
    int64_t stamp = __atomic_load_n(&g_stamp, __ATOMIC_RELAXED);
    if (g_queued > 0 && g_next[action].head < g_next[action].len) {
        stamp = g_next[action].t[g_next[action].head++];
        g_queued--;
    }
    if (stamp >= 0) {
        e.time_us = stamp;
        e.stamped = true;
    }
    /* PyTorch keeps frames on trace entries only from context "alloc" up. */
    if (context != 0 && g.context >= SP_CONTEXT_ALLOC) {
        context_t *c = ctx_get(context);
        if (c != NULL) {
            c->refs++;
            e.context = context;
        }
    }
    if (g.cap != 0 && r->len == g.cap) {
        ctx_unref_locked(r->buf[r->head].context);
        meta_unref_locked(r->buf[r->head].meta);
        meta_ref_locked(meta);
        r->buf[r->head] = e;
        if (++r->head == g.cap) /* a compare, not a division on every recorded call */
            r->head = 0;
        goto out;
    }
    if (r->len == r->alloc) {
        size_t n = r->alloc ? r->alloc * 2 : 1024;
        if (g.cap != 0 && n > g.cap)
            n = g.cap;
        sp__trace_entry_t *nb = realloc(r->buf, n * sizeof(*nb));
        if (nb == NULL) {
            ctx_unref_locked(e.context);
            goto out;
        }
        r->buf = nb;
        r->alloc = n;
    }
    meta_ref_locked(meta);
    r->buf[r->len++] = e;
out:
    pthread_mutex_unlock(&g.lock);
}

int sp__history_device_count(void) {
    pthread_mutex_lock(&g.lock);
    int n = g.nrings;
    pthread_mutex_unlock(&g.lock);
    return n;
}

sp_status_t sp__history_copy(int device, sp__trace_entry_t **entries_p, size_t *n_p) {
    pthread_mutex_lock(&g.lock);
    ring_t *r = (device >= 0 && device < g.nrings) ? &g.rings[device] : NULL;
    size_t n = r ? r->len : 0;
    sp__trace_entry_t *out = malloc((n ? n : 1) * sizeof(*out));
    if (out == NULL) {
        pthread_mutex_unlock(&g.lock);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY,
                         "out of host memory copying %zu trace entries", n);
    }
    /* Oldest first: the slots from head to the end, then those before it (two copies, not a
     * division per entry). */
    if (n > 0) {
        size_t h = r->head % n;
        memcpy(out, r->buf + h, (n - h) * sizeof(*out));
        memcpy(out + (n - h), r->buf, h * sizeof(*out));
    }
    sp_tick_anchor_t now;
    sp_tick_map_t map;
    sp__tick_anchor(&now);
    sp__tick_map(&g.anchor, &now, &map);
    for (size_t i = 0; i < n; i++) {
        context_t *c = ctx_get(out[i].context);
        if (c != NULL)
            c->refs++;
        else
            out[i].context = 0;
        meta_ref_locked(out[i].meta);
        if (!out[i].stamped)
            out[i].time_us = sp__tick_us(&map, (uint64_t)out[i].time_us);
    }
    pthread_mutex_unlock(&g.lock);
    *entries_p = out;
    *n_p = n;
    return SP_SUCCESS;
}

void sp__history_entries_free(sp__trace_entry_t *entries, size_t n) {
    if (entries == NULL)
        return;
    pthread_mutex_lock(&g.lock);
    for (size_t i = 0; i < n; i++) {
        ctx_unref_locked(entries[i].context);
        meta_unref_locked(entries[i].meta);
    }
    pthread_mutex_unlock(&g.lock);
    free(entries);
}

bool sp__history_enabled(void) {
    return __atomic_load_n(&sp__history_active, __ATOMIC_RELAXED) != 0;
}

bool sp__history_keeps_actions(void) {
    return __atomic_load_n(&g_keep_actions, __ATOMIC_RELAXED) != 0;
}

/* ---- parameters ------------------------------------------------------------------------- */

SP_EXPORT void sp_history_params_init(sp_history_params_t *params) {
    if (params == NULL)
        return;
    params->enabled = SP_HISTORY_ALL;
    params->context = SP_CONTEXT_ALL;
    params->max_entries = 0;
    params->c_stacks = false;
    params->skip_actions = NULL;
}

/* "free_requested,free_completed" -> their bits; false (why set) for a name not an action. */
static bool parse_skip(const char *text, uint32_t *mask_p, char *why, size_t why_len) {
    uint32_t mask = 0;
    const size_t n = sizeof(action_names) / sizeof(action_names[0]);
    if (text == NULL || *text == '\0') {
        *mask_p = 0;
        return true;
    }
    for (const char *p = text; p != NULL;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        size_t i = 0;
        while (i < n && !(strlen(action_names[i]) == len && strncmp(action_names[i], p, len) == 0))
            i++;
        /* An empty name ("alloc,,free_requested", a trailing comma) is a malformed list, not
         * "nothing": only the whole text may be empty. */
        if (len == 0) {
            snprintf(why, why_len, "an empty action name in '%.64s'", text);
            return false;
        }
        if (i == n) {
            snprintf(why, why_len, "'%.*s' is not an action (alloc, free_requested, ...)",
                     (int)(len > 64 ? 64 : len), p);
            return false;
        }
        mask |= 1u << i;
        p = end ? end + 1 : NULL;
    }
    *mask_p = mask;
    return true;
}

/* PyTorch's recordHistory(clear_history=True) empties its trace ring (alloc_buffer.clear()) and
 * its annotations while recording goes on: an OFF and ON in its place stopped recording for a
 * moment, and another thread's allocations in it kept no stack and no trace entry. */
SP_EXPORT sp_status_t sp_x_history_clear(void) {
    SP_GATE("sp_x_history_clear");
    sp__fork_register(); /* before g.lock: see pool/fork.h */
    pthread_mutex_lock(&g.lock);
    for (int d = 0; d < g.nrings; d++)
        ring_clear_locked(&g.rings[d]);
    annots_clear_locked();
    pthread_mutex_unlock(&g.lock);
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_record_memory_history(const sp_history_params_t *params) {
    SP_GATE("sp_record_memory_history");
    sp__fork_register(); /* before g.lock: see pool/fork.h */
    SP_ARG_CHECK(params != NULL, SP_SUB_HISTORY, "sp_record_memory_history: params is NULL");
    SP_ARG_CHECK((unsigned)params->enabled <= SP_HISTORY_ALL, SP_SUB_HISTORY,
                 "sp_record_memory_history: enabled=%d is not OFF, STATE or ALL",
                 (int)params->enabled);
    SP_ARG_CHECK((unsigned)params->context <= SP_CONTEXT_ALL, SP_SUB_HISTORY,
                 "sp_record_memory_history: context=%d is not NONE, STATE, ALLOC or ALL",
                 (int)params->context);
    uint32_t skip = 0;
    char why[128];
    if (params->enabled != SP_HISTORY_OFF &&
        !parse_skip(params->skip_actions, &skip, why, sizeof why))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_HISTORY,
                         "sp_record_memory_history: skip_actions: %s", why);
    pthread_mutex_lock(&g.lock);
    if (params->enabled == SP_HISTORY_OFF) {
        /* PyTorch: enabled=None stops recording and clears the buffer. Contexts still held by
         * live blocks stay until the allocator releases them. */
        set_active(0);
        __atomic_store_n(&g_keep_actions, 0, __ATOMIC_RELAXED);
        for (int d = 0; d < g.nrings; d++)
            ring_clear_locked(&g.rings[d]);
        annots_clear_locked();
        g.enabled = SP_HISTORY_OFF;
        __atomic_store_n(&g.context, SP_CONTEXT_NONE, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&g.lock);
        SP_INFO(SP_SUB_HISTORY, "memory history off");
        return SP_SUCCESS;
    }
    /* "state": a ring of one entry whatever max_entries says (see the top of the file). */
    size_t cap = params->enabled == SP_HISTORY_STATE ? 1 : params->max_entries;
    if (cap != 0) {
        for (int d = 0; d < g.nrings; d++) {
            ring_t *r = &g.rings[d];
            if ((r->len > 0 && r->head != 0) || r->len > cap) {
                if (!ring_linearize_locked(r, cap)) {
                    pthread_mutex_unlock(&g.lock);
                    return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY,
                                     "out of host memory resizing the trace buffer");
                }
            }
        }
    } else {
        for (int d = 0; d < g.nrings; d++) {
            ring_t *r = &g.rings[d];
            if (r->head != 0 && !ring_linearize_locked(r, r->len)) {
                pthread_mutex_unlock(&g.lock);
                return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY,
                                 "out of host memory resizing the trace buffer");
            }
        }
    }
    g.cap = cap;
    /* PyTorch's recordHistory clears its annotations on every call (after setting their
     * bound): on, again with other settings, or for clear_history. */
    annots_clear_locked();
    g.skip = skip;
    g.enabled = params->enabled;
    g.c_stacks = params->c_stacks;
    __atomic_store_n(&g.want_frames, g.hook != NULL || g.c_stacks, __ATOMIC_RELAXED);
    __atomic_store_n(&g.context, params->context, __ATOMIC_RELAXED);
    if (!g.anchored) {
        sp__tick_anchor(&g.anchor);
        g.anchored = true;
    }
    __atomic_store_n(&g_keep_actions, 1, __ATOMIC_RELAXED);
    set_active(1);
    pthread_mutex_unlock(&g.lock);
    SP_INFO(SP_SUB_HISTORY, "memory history %s, context %d, max_entries %zu, c_stacks %d",
            params->enabled == SP_HISTORY_ALL ? "all" : "state", (int)params->context, cap,
            (int)params->c_stacks);
    return SP_SUCCESS;
}

sp_status_t sp__history_stream_label(uintptr_t stream, uint64_t label) {
    pthread_mutex_lock(&g.lock);
    size_t i = 0;
    while (i < g.nlabels && g.labels[i].stream != stream)
        i++;
    if (label == 0) {
        if (i < g.nlabels)
            g.labels[i] = g.labels[--g.nlabels];
    } else if (i < g.nlabels) {
        g.labels[i].label = label;
    } else {
        if (g.nlabels == g.labels_alloc) {
            size_t n = g.labels_alloc ? 2 * g.labels_alloc : 8;
            sp__stream_label_t *grown = realloc(g.labels, n * sizeof(*grown));
            if (grown == NULL) {
                pthread_mutex_unlock(&g.lock);
                return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY,
                                 "out of host memory for a stream's label");
            }
            g.labels = grown;
            g.labels_alloc = n;
        }
        g.labels[g.nlabels++] = (sp__stream_label_t){stream, label};
    }
    pthread_mutex_unlock(&g.lock);
    return SP_SUCCESS;
}

bool sp__history_stream_labels(sp__stream_label_t **labels_p, size_t *n_p) {
    pthread_mutex_lock(&g.lock);
    size_t n = g.nlabels;
    sp__stream_label_t *copy = n ? malloc(n * sizeof(*copy)) : NULL;
    if (copy != NULL)
        memcpy(copy, g.labels, n * sizeof(*copy));
    pthread_mutex_unlock(&g.lock);
    *labels_p = copy;
    *n_p = copy != NULL ? n : 0;
    return n == 0 || copy != NULL;
}

/* ---- user metadata (PyTorch's setUserMetadata) ------------------------------------------ */

const char *sp__history_metadata(uint32_t meta) {
    /* A text is not changed or freed while something names it, and the caller's copy of the
     * entry does (sp__history_copy): read the slot under the lock, use the text after. */
    const char *t = "";
    if (meta == 0)
        return t;
    pthread_mutex_lock(&g.lock);
    if (meta <= g.nmeta && g.meta_text[meta - 1] != NULL)
        t = g.meta_text[meta - 1];
    pthread_mutex_unlock(&g.lock);
    return t;
}

/* The longest user metadata text: PyTorch sets no bound; this one only keeps a runaway caller
 * from holding the host's memory. 4096 bytes made replay --snapshot refuse a trace whose entries
 * carried a longer one. */
#define META_MAX (1u << 20)

/* A slot whose text was freed: the probe goes on past it (a text placed after it may follow). */
#define META_GONE UINT32_MAX

/* Where `text` (hashed to h) is in meta_slots, or the empty slot it would take. */
static uint32_t *meta_slot_locked(const char *text, uint64_t h) {
    uint32_t mask = g.nmeta_slots - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        uint32_t id = g.meta_slots[i];
        if (id == 0 || (id != META_GONE && strcmp(g.meta_text[id - 1], text) == 0))
            return &g.meta_slots[i];
    }
}

/* Every held text placed again in n slots (n a power of 2 over twice their count): the freed
 * ones' marks are gone. */
static bool meta_rehash_locked(uint32_t n) {
    uint32_t *slots = calloc(n, sizeof(*slots));
    if (slots == NULL)
        return false;
    free(g.meta_slots);
    g.meta_slots = slots;
    g.nmeta_slots = n;
    g.nmeta_gone = 0;
    for (uint32_t id = 1; id <= g.nmeta; id++) {
        const char *t = g.meta_text[id - 1];
        if (t != NULL)
            *meta_slot_locked(t, hash_bytes(0, t, strlen(t))) = id;
    }
    return true;
}

/* Room for one more id in the arrays kept by id. */
static bool meta_room_locked(void) {
    if (g.nmeta < g.meta_alloc)
        return true;
    uint32_t n = g.meta_alloc ? g.meta_alloc * 2 : 8;
    char **nt = realloc(g.meta_text, n * sizeof(*nt));
    if (nt == NULL)
        return false;
    g.meta_text = nt;
    size_t *nr = realloc(g.meta_refs, n * sizeof(*nr));
    if (nr == NULL)
        return false;
    g.meta_refs = nr;
    uint32_t *nf = realloc(g.meta_free, n * sizeof(*nf));
    if (nf == NULL)
        return false;
    g.meta_free = nf;
    g.meta_alloc = n;
    return true;
}

/* The id of `text`, added if new (with no reference yet: the caller takes one). 0 for "" and
 * when out of host memory. Hashed: a program may set a new text every step, and a replay sets
 * each text a trace's entries carry (a search of every text was quadratic in their number). */
static uint32_t meta_intern_locked(const char *text) {
    if (*text == '\0')
        return 0;
    if (2 * (g.nmeta_live + g.nmeta_gone + 1) > g.nmeta_slots) {
        uint32_t n = g.nmeta_slots ? g.nmeta_slots : 16;
        while (2 * (g.nmeta_live + 1) > n / 2) /* at most a quarter full after */
            n *= 2;
        if (!meta_rehash_locked(n))
            return 0;
    }
    uint64_t h = hash_bytes(0, text, strlen(text));
    uint32_t *slot = meta_slot_locked(text, h);
    if (*slot != 0)
        return *slot;
    if (g.nmeta_free == 0 && !meta_room_locked())
        return 0;
    char *copy = strdup(text);
    if (copy == NULL)
        return 0;
    uint32_t id = g.nmeta_free > 0 ? g.meta_free[--g.nmeta_free] : ++g.nmeta;
    g.meta_text[id - 1] = copy;
    g.meta_refs[id - 1] = 0;
    g.nmeta_live++;
    *slot = id;
    return id;
}

static void meta_ref_locked(uint32_t id) {
    if (id != 0)
        g.meta_refs[id - 1]++;
}

/* One name of the text fewer; the last frees it and its id. */
static void meta_unref_locked(uint32_t id) {
    if (id == 0 || --g.meta_refs[id - 1] != 0)
        return;
    char *t = g.meta_text[id - 1];
    uint32_t *slot = meta_slot_locked(t, hash_bytes(0, t, strlen(t)));
    *slot = META_GONE;
    g.nmeta_gone++;
    free(t);
    g.meta_text[id - 1] = NULL;
    g.meta_free[g.nmeta_free++] = id;
    g.nmeta_live--;
}

size_t sp__history_meta_held(void) {
    pthread_mutex_lock(&g.lock);
    size_t n = g.nmeta_live;
    pthread_mutex_unlock(&g.lock);
    return n;
}

SP_EXPORT sp_status_t sp_history_set_user_metadata(int device, const char *metadata) {
    SP_GATE("sp_history_set_user_metadata");
    sp__fork_register(); /* before g.lock: see pool/fork.h */
    /* A library that cannot start says why, not "device 0 does not exist (0 device(s))". */
    SP_CHECK(sp__alloc_ensure());
    SP_ARG_CHECK(device >= 0 && device < sp_device_count(), SP_SUB_HISTORY,
                 "sp_history_set_user_metadata: device %d does not exist (%d device(s))", device,
                 sp_device_count());
    const char *text = metadata ? metadata : "";
    SP_ARG_CHECK(strlen(text) <= META_MAX, SP_SUB_HISTORY,
                 "sp_history_set_user_metadata: %zu bytes of metadata (at most %u)", strlen(text),
                 META_MAX);
    pthread_mutex_lock(&g.lock);
    if (device >= g.nmeta_cur) {
        uint32_t *nc = realloc(g.meta_cur, (size_t)(device + 1) * sizeof(*nc));
        if (nc == NULL) {
            pthread_mutex_unlock(&g.lock);
            return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY,
                             "out of host memory setting the user metadata");
        }
        memset(nc + g.nmeta_cur, 0, (size_t)(device + 1 - g.nmeta_cur) * sizeof(*nc));
        g.meta_cur = nc;
        g.nmeta_cur = device + 1;
    }
    uint32_t id = meta_intern_locked(text);
    if (id == 0 && *text != '\0') {
        pthread_mutex_unlock(&g.lock);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY,
                         "out of host memory setting the user metadata");
    }
    meta_ref_locked(id); /* first: the text in force may be this one */
    meta_unref_locked(g.meta_cur[device]);
    g.meta_cur[device] = id;
    pthread_mutex_unlock(&g.lock);
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_history_get_user_metadata(int device, char *buf, size_t len,
                                                   size_t *len_p) {
    SP_GATE("sp_history_get_user_metadata");
    /* A library that cannot start says why, not "device 0 does not exist (0 device(s))". */
    SP_CHECK(sp__alloc_ensure());
    SP_ARG_CHECK(device >= 0 && device < sp_device_count(), SP_SUB_HISTORY,
                 "sp_history_get_user_metadata: device %d does not exist (%d device(s))", device,
                 sp_device_count());
    SP_ARG_CHECK(buf != NULL || len == 0, SP_SUB_HISTORY,
                 "sp_history_get_user_metadata: buf is NULL with len %zu", len);
    pthread_mutex_lock(&g.lock);
    uint32_t id = device < g.nmeta_cur ? g.meta_cur[device] : 0;
    const char *t = id != 0 && id <= g.nmeta && g.meta_text[id - 1] ? g.meta_text[id - 1] : "";
    size_t n = strlen(t);
    if (len > 0) {
        size_t k = n < len - 1 ? n : len - 1;
        memcpy(buf, t, k);
        buf[k] = '\0';
    }
    pthread_mutex_unlock(&g.lock);
    if (len_p != NULL)
        *len_p = n;
    return SP_SUCCESS;
}

/* ---- external annotations (PyTorch's recordAnnotation) ---------------------------------- */

/* Drop every annotation (PyTorch's recordHistory clears its annotation buffer on each call). */
static void annots_clear_locked(void) {
    for (size_t i = 0; i < g.nannots; i++) {
        free(g.annots[i].stage);
        free(g.annots[i].name);
    }
    free(g.annots);
    g.annots = NULL;
    g.nannots = g.annots_alloc = g.annot_head = 0;
}

/* Room for one more annotation while the buffer is not full (g.cap 0: unbounded). */
static bool annots_room_locked(void) {
    if (g.nannots < g.annots_alloc)
        return true;
    size_t n = g.annots_alloc ? 2 * g.annots_alloc : 64;
    if (g.cap != 0 && n > g.cap)
        n = g.cap;
    annot_t *na = realloc(g.annots, n * sizeof(*na));
    if (na == NULL)
        return false;
    g.annots = na;
    g.annots_alloc = n;
    return true;
}

/* Keep a (its strings taken over): appended, or over the oldest once cap are held. */
static bool annots_put_locked(annot_t a) {
    if (g.cap != 0 && g.nannots == g.cap) {
        annot_t *old = &g.annots[g.annot_head];
        free(old->stage);
        free(old->name);
        *old = a;
        if (++g.annot_head == g.cap)
            g.annot_head = 0;
        return true;
    }
    if (!annots_room_locked())
        return false;
    g.annots[g.nannots++] = a;
    return true;
}

SP_EXPORT sp_status_t sp_history_record_annotation(int device, const char *stage,
                                                   const char *name) {
    SP_GATE("sp_history_record_annotation");
    sp__fork_register(); /* before g.lock: see pool/fork.h */
    /* A library that cannot start says why, not "device 0 does not exist (0 device(s))". */
    SP_CHECK(sp__alloc_ensure());
    SP_ARG_CHECK(device >= 0 && device < sp_device_count(), SP_SUB_HISTORY,
                 "sp_history_record_annotation: device %d does not exist (%d device(s))", device,
                 sp_device_count());
    SP_ARG_CHECK(stage != NULL && name != NULL, SP_SUB_HISTORY,
                 "sp_history_record_annotation: stage or name is NULL");
    SP_ARG_CHECK(strlen(stage) <= META_MAX && strlen(name) <= META_MAX, SP_SUB_HISTORY,
                 "sp_history_record_annotation: a text over %u bytes", META_MAX);
    /* PyTorch records annotations only while history is recorded; off, the call is silent. */
    if (!sp__history_on())
        return SP_SUCCESS;
    uint64_t now = sp__ticks(); /* mapped to microseconds by sp__history_annotations */
    annot_t a = {.device = device, .time = now};
    int64_t stamp = __atomic_load_n(&g_stamp, __ATOMIC_RELAXED);
    if (stamp >= 0) {
        a.time = (uint64_t)stamp;
        a.stamped = true;
    }
    /* Copied before the lock: nothing the allocator waits on is held while allocating. */
    a.stage = strdup(stage);
    a.name = strdup(name);
    bool ok = a.stage != NULL && a.name != NULL;
    if (ok) {
        pthread_mutex_lock(&g.lock);
        /* Recording may have stopped meanwhile: then, as PyTorch, nothing is kept. */
        ok = g.enabled == SP_HISTORY_OFF || annots_put_locked(a);
        if (g.enabled == SP_HISTORY_OFF) {
            free(a.stage);
            free(a.name);
        }
        pthread_mutex_unlock(&g.lock);
        if (ok)
            return SP_SUCCESS;
    }
    free(a.stage);
    free(a.name);
    return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY, "out of host memory recording an annotation");
}

void sp__history_annotations_free(sp__annotation_t *annots, size_t n) {
    if (annots == NULL)
        return;
    for (size_t i = 0; i < n; i++) {
        free(annots[i].stage);
        free(annots[i].name);
    }
    free(annots);
}

sp_status_t sp__history_annotations(sp__annotation_t **annots_p, size_t *n_p) {
    pthread_mutex_lock(&g.lock);
    size_t n = g.nannots;
    sp__annotation_t *out = calloc(n ? n : 1, sizeof(*out));
    bool ok = out != NULL;
    sp_tick_anchor_t now;
    sp_tick_map_t map;
    sp__tick_anchor(&now);
    sp__tick_map(&g.anchor, &now, &map);
    /* Oldest first: from the head once the ring is full, else from slot 0 (head is 0). */
    for (size_t i = 0; ok && i < n; i++) {
        const annot_t *a = &g.annots[(g.annot_head + i) % n];
        out[i].device = a->device;
        out[i].time_us = a->stamped ? (int64_t)a->time : sp__tick_us(&map, a->time);
        out[i].stage = strdup(a->stage);
        out[i].name = strdup(a->name);
        ok = out[i].stage != NULL && out[i].name != NULL;
    }
    pthread_mutex_unlock(&g.lock);
    if (!ok) {
        sp__history_annotations_free(out, n);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY,
                         "out of host memory copying %zu annotations", n);
    }
    *annots_p = out;
    *n_p = n;
    return SP_SUCCESS;
}

size_t sp__history_annotations_held(void) {
    pthread_mutex_lock(&g.lock);
    size_t n = g.nannots;
    pthread_mutex_unlock(&g.lock);
    return n;
}

SP_EXPORT void sp_x_history_stamp(int64_t time_us) {
    __atomic_store_n(&g_stamp, time_us < 0 ? -1 : time_us, __ATOMIC_RELAXED);
}

/* Every queued time of sp_x_history_stamp_next dropped (g.lock); keep: their room stays for the
 * next ones (a replay queues a few per event), else it is freed. */
static void stamp_next_clear_locked(bool keep) {
    for (int a = 0; a < NACTIONS; a++) {
        g_next[a].head = g_next[a].len = 0;
        if (!keep) {
            free(g_next[a].t);
            g_next[a].t = NULL;
            g_next[a].cap = 0;
        }
    }
    g_queued = 0;
}

SP_EXPORT sp_status_t sp_x_history_stamp_next(int action, int64_t time_us) {
    /* The action first, whatever the time: a bad one changes nothing (it used to drop every
     * queued time when the time was negative). -1 names every action, for the drop only. */
    if (action < (time_us < 0 ? -1 : 0) || action >= NACTIONS)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_HISTORY,
                         "sp_x_history_stamp_next: action %d is none of PyTorch's trace actions "
                         "(0 alloc .. 8 oom; -1: all of them, with a negative time only)",
                         action);
    if (time_us < 0) {
        pthread_mutex_lock(&g.lock);
        stamp_next_clear_locked(true);
        pthread_mutex_unlock(&g.lock);
        return SP_SUCCESS;
    }
    pthread_mutex_lock(&g.lock);
    struct stamp_fifo *q = &g_next[action];
    if (q->head == q->len) /* all taken: start over at the front (no growth on a long replay) */
        q->head = q->len = 0;
    if (q->len == q->cap) {
        size_t nc = q->cap ? 2 * q->cap : 16;
        int64_t *nt = realloc(q->t, nc * sizeof(*nt));
        if (nt == NULL) {
            pthread_mutex_unlock(&g.lock);
            return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY,
                             "out of host memory queueing a trace entry's time");
        }
        q->t = nt;
        q->cap = nc;
    }
    q->t[q->len++] = time_us;
    g_queued++;
    pthread_mutex_unlock(&g.lock);
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_x_history_record_snapshot(int device, size_t active_bytes) {
    SP_GATE("sp_x_history_record_snapshot");
    /* A library that cannot start says why (sp_device_count's 0 read as "no device 0"). */
    SP_CHECK(sp__alloc_ensure());
    SP_ARG_CHECK(device >= 0 && device < sp_device_count(), SP_SUB_HISTORY,
                 "sp_x_history_record_snapshot: device %d does not exist (%d device(s))", device,
                 sp_device_count());
    /* The marker a dump appends (snapshot.c), for the default pool as PyTorch's; nothing
     * while actions are not recorded (sp__history_record's own check). */
    sp__history_record(device, SP_TRACE_SNAPSHOT, 0, active_bytes, 0, (sp_mempool_id_t){0, 0}, 0);
    return SP_SUCCESS;
}

void sp__history_shutdown(void) {
    pthread_mutex_lock(&g.lock);
    stamp_next_clear_locked(false);
    /* The rings first: clearing them drops their entries' references to metadata texts, which
     * needs the metadata tables (freed below; a ring entry with a text used to write through
     * their NULL). */
    for (int d = 0; d < g.nrings; d++)
        ring_clear_locked(&g.rings[d]);
    annots_clear_locked();
    __atomic_store_n(&g_stamp, -1, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < g.nmeta; i++)
        free(g.meta_text[i]);
    free(g.meta_text);
    free(g.meta_refs);
    free(g.meta_free);
    free(g.meta_slots);
    g.meta_slots = NULL;
    g.nmeta_slots = g.nmeta_gone = 0;
    free(g.meta_cur);
    g.meta_text = NULL;
    g.meta_refs = NULL;
    g.meta_free = NULL;
    g.meta_cur = NULL;
    g.nmeta = g.meta_alloc = g.nmeta_free = g.nmeta_live = 0;
    g.nmeta_cur = 0;
    free(g.labels);
    g.labels = NULL;
    g.nlabels = g.labels_alloc = 0;
    set_active(0);
    __atomic_store_n(&g_keep_actions, 0, __ATOMIC_RELAXED);
    free(g.rings);
    g.rings = NULL;
    g.nrings = 0;
    g.enabled = SP_HISTORY_OFF;
    __atomic_store_n(&g.context, SP_CONTEXT_NONE, __ATOMIC_RELAXED);
    g.c_stacks = false;
    __atomic_store_n(&g.want_frames, g.hook != NULL, __ATOMIC_RELAXED);
    g.cap = 0;
    /* Contexts still referenced here are leaked references of blocks that outlived shutdown;
     * free them all so a new session starts clean. */
    for (size_t i = 0; i < g.nctx; i++)
        if (g.ctx[i].refs > 0)
            ctx_destroy(&g.ctx[i]);
    free(g.ctx);
    free(g.buckets);
    g.ctx = NULL;
    g.buckets = NULL;
    memset(g.keyed, 0, sizeof(g.keyed));
    g.nctx = g.ctx_alloc = g.nbuckets = g.live_ctx = 0;
    g.free_ids = 0;
    pthread_mutex_unlock(&g.lock);
}

void sp__history_fork_lock(void) {
    pthread_mutex_lock(&g.lock);
}

void sp__history_fork_unlock(void) {
    pthread_mutex_unlock(&g.lock);
}
