/*
 * thread_cache.c: the opt-in per-thread cache of freed blocks (SYMPOOL_THREAD_CACHE=<bytes>;
 * thread_cache.h for the model, docs/threads.md for what it changes).
 *
 * Why a block stays allocated in its pool while cached: then a cache hit and a kept free change
 * nothing the pool owns (no lock, no statistic, no pointer map), which is what lets two threads
 * allocate without writing a shared cache line. The price is PyTorch's best fit: a cached block
 * is out of reach of other threads' requests until it goes back (a drain), so the cache is off
 * by default and every replay and every default run is the pool's exact best fit.
 *
 * Each thread's cache: a table of its entries (blocks it keeps idle, and blocks it handed out
 * from them, so that its own free finds them without the device lock), a hash from address to
 * entry, and a few size classes (device, stream, block size), each a LIFO of idle entries. Its
 * lock is taken by its thread on every hit and free (uncontended: one atomic pair on a line no
 * other thread writes) and by other threads only to drain it or to take back a block it handed
 * out that another thread frees.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "sympool/experimental.h"

#include "pool/thread_cache.h"

/* Size classes per thread: a thread that cycles through more (device, stream, size) keys than
 * this keeps the first ones and frees the rest to the pool. */
#define TC_CLASSES 16
/* Entries per thread, a power of two: the table starts at TC_MIN_ENTRIES and doubles up to
 * limit / 512 within [TC_MIN_ENTRIES, TC_MAX_ENTRIES]. */
#define TC_MIN_ENTRIES 64u
#define TC_MAX_ENTRIES 16384u

enum { E_UNUSED = 0, E_IDLE = 1, E_OUT = 2 };

/* A registered block as its cache sees it: a copy of the fields it needs (constant while the
 * block is allocated), so the owner never reads the block struct without the device lock. */
typedef struct tc_entry {
    uintptr_t addr;
    size_t size;
    sp_stream_t stream;
    sp_block_t *b;
    size_t req; /* while out: the size its caller asked for */
    int32_t device;
    int32_t next;  /* idle: the next idle entry of its class; unused: the next unused entry */
    uint8_t state; /* E_* */
} tc_entry_t;

typedef struct tc_class {
    int device;
    sp_stream_t stream;
    size_t size;
    int32_t head; /* LIFO of idle entries; -1: none (the slot may take another key) */
} tc_class_t;

struct sp_tcache {
    _Alignas(64) sp_lock_t lock; /* the rest, except the registry links */
    size_t idle_bytes;           /* bytes of idle entries, <= sp__g.tc_limit */
    uint32_t nidle;              /* idle entries */
    uint32_t nused;              /* idle and out entries */
    uint32_t nout;               /* out entries; read unlocked by the owner (sp__tc_free_or) */
    uint32_t cap;                /* entries allocated (0 or a power of two) */
    int32_t free_head;           /* unused entries */
    tc_entry_t *ent;             /* [cap] */
    int32_t *hash;               /* [2 * cap]: entry index by address, -1 empty; linear probing */
    uint32_t nclass;             /* class slots in use */
    tc_class_t cls[TC_CLASSES];
    struct sp_tcache *next, *prev; /* the registry (g_reg) */
};
typedef struct sp_tcache sp_tcache_t;

static pthread_mutex_t g_reg = PTHREAD_MUTEX_INITIALIZER;
static sp_tcache_t *g_head; /* every thread's cache (g_reg) */
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_key;
/* Whether g_key was made: pthread_key_create fails once the process holds PTHREAD_KEYS_MAX keys,
 * and g_key is then no key of ours (its zero is the process's first key, another library's),
 * so no thread gets a cache (its allocations take the pool's path). */
static bool g_key_made;
static _Thread_local sp_tcache_t *tl_tc;

/* ---- the table (the cache's lock held) --------------------------------------------------- */

static inline uint32_t hash_of(const sp_tcache_t *t, uintptr_t addr) {
    uint64_t x = (uint64_t)(addr >> 9) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32) & (2 * t->cap - 1);
}

static inline int32_t find(const sp_tcache_t *t, uintptr_t addr) {
    if (!t->cap)
        return -1;
    uint32_t mask = 2 * t->cap - 1;
    for (uint32_t h = hash_of(t, addr);; h = (h + 1) & mask) {
        int32_t i = t->hash[h];
        if (i < 0 || t->ent[i].addr == addr)
            return i;
    }
}

static void hash_put(sp_tcache_t *t, int32_t idx) {
    uint32_t mask = 2 * t->cap - 1;
    uint32_t h = hash_of(t, t->ent[idx].addr);
    while (t->hash[h] >= 0)
        h = (h + 1) & mask;
    t->hash[h] = idx;
}

/* nout += n (the cache's lock held). An atomic store, so that the owner may read it without the
 * lock; only writers under the lock read it plainly. */
static inline void out_add(sp_tcache_t *t, int n) {
    __atomic_store_n(&t->nout, t->nout + (uint32_t)n, __ATOMIC_RELAXED);
}

/* Drop entry idx (not in a class list any more) from the hash and make it unused. Linear
 * probing's backward shift: the entries after the hole that hash at or before it move up. */
static void drop(sp_tcache_t *t, int32_t idx) {
    uint32_t mask = 2 * t->cap - 1;
    uint32_t h = hash_of(t, t->ent[idx].addr);
    while (t->hash[h] != idx)
        h = (h + 1) & mask;
    uint32_t hole = h;
    for (uint32_t j = (hole + 1) & mask; t->hash[j] >= 0; j = (j + 1) & mask) {
        uint32_t home = hash_of(t, t->ent[t->hash[j]].addr);
        /* May the entry at j move to the hole, i.e. is its home not in (hole, j]? */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            t->hash[hole] = t->hash[j];
            hole = j;
        }
    }
    t->hash[hole] = -1;
    tc_entry_t *e = &t->ent[idx];
    if (e->state == E_IDLE) {
        t->nidle--;
        t->idle_bytes -= e->size;
    }
    if (e->state == E_OUT)
        out_add(t, -1);
    e->state = E_UNUSED;
    e->b = NULL;
    e->next = t->free_head;
    t->free_head = idx;
    t->nused--;
}

static uint32_t max_entries(void) {
    size_t want = sp__g.tc_limit / SP_MIN_BLOCK_SIZE;
    uint32_t n = TC_MIN_ENTRIES;
    while (n < want && n < TC_MAX_ENTRIES)
        n *= 2;
    return n;
}

/* Twice the entries (host memory; entry indices stay). false: at the bound, or no memory. */
static bool grow(sp_tcache_t *t) {
    uint32_t ncap = t->cap ? 2 * t->cap : TC_MIN_ENTRIES;
    if (ncap > max_entries())
        return false;
    tc_entry_t *ne = realloc(t->ent, ncap * sizeof(*ne));
    if (!ne)
        return false;
    t->ent = ne;
    int32_t *nh = malloc(2 * (size_t)ncap * sizeof(*nh));
    if (!nh)
        return false; /* ent is larger, which is harmless; cap stays */
    free(t->hash);
    t->hash = nh;
    memset(&ne[t->cap], 0, (ncap - t->cap) * sizeof(*ne));
    for (uint32_t i = ncap; i-- > t->cap;) {
        ne[i].next = t->free_head;
        t->free_head = (int32_t)i;
    }
    uint32_t old = t->cap;
    t->cap = ncap;
    memset(nh, 0xff, 2 * (size_t)ncap * sizeof(*nh));
    for (uint32_t i = 0; i < old; i++)
        if (ne[i].state != E_UNUSED)
            hash_put(t, (int32_t)i);
    return true;
}

static inline int class_find(const sp_tcache_t *t, int device, sp_stream_t stream, size_t size) {
    for (uint32_t c = 0; c < t->nclass; c++) {
        const tc_class_t *k = &t->cls[c];
        if (k->size == size && k->stream == stream && k->device == device)
            return (int)c;
    }
    return -1;
}

/* The class of the key, a new one in an empty slot, or -1 when every slot holds idle blocks of
 * other keys. */
static int class_get(sp_tcache_t *t, int device, sp_stream_t stream, size_t size) {
    int c = class_find(t, device, stream, size);
    if (c >= 0)
        return c;
    for (uint32_t k = 0; k < TC_CLASSES; k++) {
        if (k < t->nclass && t->cls[k].head >= 0)
            continue;
        t->cls[k] = (tc_class_t){.device = device, .stream = stream, .size = size, .head = -1};
        if (k >= t->nclass)
            t->nclass = k + 1;
        return (int)k;
    }
    return -1;
}

static inline void push_idle(sp_tcache_t *t, int c, int32_t idx) {
    tc_entry_t *e = &t->ent[idx];
    e->state = E_IDLE;
    e->next = t->cls[c].head;
    t->cls[c].head = idx;
    t->nidle++;
    t->idle_bytes += e->size;
}

/* ---- the calling thread's cache ---------------------------------------------------------- */

static void tc_exit(void *arg);

static void make_key(void) {
    g_key_made = pthread_key_create(&g_key, tc_exit) == 0;
}

/* At the library's unload (dlclose; exit() too): a thread that ever had a cache keeps the key's
 * value set for its life, and one that outlives the library would otherwise have glibc call
 * tc_exit at an address no longer mapped as it exits (a deleted key's destructor is never
 * called). Its cache then goes with the library, as every pool does. */
__attribute__((destructor)) static void delete_key(void) {
    if (g_key_made)
        (void)pthread_key_delete(g_key);
    g_key_made = false;
}

static sp_tcache_t *tc_mine(void) {
    sp_tcache_t *t = tl_tc;
    if (SP_LIKELY(t))
        return t;
    (void)pthread_once(&g_key_once, make_key);
    if (!g_key_made)
        return NULL;
    t = aligned_alloc(64, (sizeof(*t) + 63) / 64 * 64);
    if (!t)
        return NULL;
    memset(t, 0, sizeof(*t));
    sp__lock_init(&t->lock);
    t->free_head = -1;
    if (pthread_setspecific(g_key, t) != 0) {
        free(t);
        return NULL;
    }
    pthread_mutex_lock(&g_reg);
    t->next = g_head;
    if (g_head)
        g_head->prev = t;
    g_head = t;
    pthread_mutex_unlock(&g_reg);
    tl_tc = t;
    return t;
}

bool sp__tc_malloc(size_t size, int device, sp_stream_t stream, void **ptr_p) {
    sp_tcache_t *t = tl_tc;
    size_t rounded = (size + SP_MIN_BLOCK_SIZE - 1) & ~(SP_MIN_BLOCK_SIZE - 1);
    if (!t || rounded > SP_TC_MAX_BLOCK)
        return false;
    sp__lock(&t->lock);
    int c = class_find(t, device, stream, rounded);
    int32_t i = c >= 0 ? t->cls[c].head : -1;
    if (i < 0) {
        sp__unlock(&t->lock);
        return false;
    }
    tc_entry_t *e = &t->ent[i];
    t->cls[c].head = e->next;
    e->state = E_OUT;
    out_add(t, 1);
    e->req = size;
    t->nidle--;
    t->idle_bytes -= e->size;
    *ptr_p = (void *)e->addr;
    sp__unlock(&t->lock);
    return true;
}

/* sp__tc_free in cache t. */
static inline __attribute__((always_inline)) bool tc_free_in(sp_tcache_t *t, uintptr_t addr,
                                                             size_t *req_p, int *device_p) {
    sp__lock(&t->lock);
    int32_t i = find(t, addr);
    tc_entry_t *e = i >= 0 ? &t->ent[i] : NULL;
    /* An idle entry freed again is a double free: the ordinary path's hook reports it. */
    if (!e || e->state != E_OUT || t->idle_bytes + e->size > sp__g.tc_limit) {
        sp__unlock(&t->lock);
        return false;
    }
    int c = class_get(t, e->device, e->stream, e->size);
    if (c < 0) {
        sp__unlock(&t->lock);
        return false;
    }
    if (req_p) {
        *req_p = e->req;
        *device_p = e->device;
    }
    out_add(t, -1);
    push_idle(t, c, i);
    sp__unlock(&t->lock);
    return true;
}

bool sp__tc_free(uintptr_t addr, size_t *req_p, int *device_p) {
    sp_tcache_t *t = tc_mine();
    return t && tc_free_in(t, addr, req_p, device_p);
}

/* sp__tc_free_or's look in t, out of line: inlined there, it made that function save registers
 * before its first test, where most of its calls end; a copy of its own keeps the constant NULLs
 * folded (a shared out-of-line tc_free_in cost the cached 512 B pair 16 instructions). */
static __attribute__((noinline)) sp_status_t tc_free_mine_or(sp_tcache_t *t, void *ptr,
                                                             sp_free_fn_t next) {
    if (tc_free_in(t, (uintptr_t)ptr, NULL, NULL))
        return SP_SUCCESS;
    return next(ptr);
}

sp_status_t sp__tc_free_or(void *ptr, sp_free_fn_t next) {
    sp_tcache_t *t = tl_tc;
    /* A thread's first free makes its cache, as sp__tc_free does: the hook after it keeps blocks
     * only in a cache that exists. */
    if (SP_UNLIKELY(!t) && !(t = tc_mine()))
        return next(ptr);
    /* Only this thread hands its cache's entries out, so none out now stays none during the call:
     * sp__tc_free could only say no. */
    if (!__atomic_load_n(&t->nout, __ATOMIC_RELAXED))
        return next(ptr);
    return tc_free_mine_or(t, ptr, next);
}

sp_status_t sp__tc_malloc_or(size_t size, int device, sp_stream_t stream, void **ptr_p,
                             sp_malloc_fn_t next) {
    if (sp__tc_malloc(size, device, stream, ptr_p))
        return SP_SUCCESS;
    return next(size, device, stream, ptr_p);
}

/* ---- under the device lock --------------------------------------------------------------- */

/* Block b leaves its cache's books (device lock held): unmarked, and its requested size (and the
 * requested_bytes statistic) become req, the size its last caller asked for. */
static void unmark(sp_devalloc_t *d, sp_block_t *b, size_t req) {
    b->bal = 0;
    b->tc_owner = NULL;
    d->tc_blocks--;
    if (req != b->requested) {
        bool small = sp__bseg(b)->bpool->is_small;
        if (req > b->requested)
            sp__stat_inc(&d->stats, SP_ST_REQUESTED_BYTES, small, (int64_t)(req - b->requested));
        else
            sp__stat_dec(&d->stats, SP_ST_REQUESTED_BYTES, small, (int64_t)(b->requested - req));
        b->requested = req;
    }
}

/* Take out-entry b from its owner's table (device lock held, the owner's lock not). false: the
 * entry is idle (the caller frees it twice). */
static bool take_back(sp_devalloc_t *d, sp_block_t *b) {
    sp_tcache_t *o = b->tc_owner;
    sp__lock(&o->lock);
    int32_t i = find(o, b->addr);
    if (i >= 0 && o->ent[i].state == E_IDLE) {
        sp__unlock(&o->lock);
        return false;
    }
    /* A registered block is always in its owner's table (marking and the table change together
     * under the device lock); were it not, it would just leave the books. */
    size_t req = i >= 0 ? o->ent[i].req : b->requested;
    if (i >= 0)
        drop(o, i);
    sp__unlock(&o->lock);
    unmark(d, b, req);
    return true;
}

bool sp__tc_idle_block(const sp_block_t *b) {
    if (!sp__tc_registered(b))
        return false;
    sp_tcache_t *o = b->tc_owner;
    sp__lock(&o->lock);
    int32_t i = find(o, b->addr);
    bool idle = i >= 0 && o->ent[i].state == E_IDLE;
    sp__unlock(&o->lock);
    return idle;
}

bool sp__tc_unregister(sp_devalloc_t *d, sp_block_t *b) {
    return !sp__tc_registered(b) || take_back(d, b);
}

sp_tc_verdict_t sp__tc_on_free(sp_devalloc_t *d, sp_block_t *b, bool hist, size_t *req_p) {
    if (sp__tc_registered(b) && !take_back(d, b))
        return SP_TC_TWICE;
    *req_p = b->requested;
    /* Only a plain block of the default pool: no stream to wait for, no history to record, a
     * size the cache serves. */
    if (hist || sp__block_has_uses(b) || !sp__bseg(b)->bpool->pool->is_default ||
        b->size > SP_TC_MAX_BLOCK || b->size > sp__g.tc_limit)
        return SP_TC_FREE;
    sp_tcache_t *t = tl_tc;
    if (!t)
        return SP_TC_FREE;
    sp__lock(&t->lock);
    bool kept = false;
    if (t->idle_bytes + b->size <= sp__g.tc_limit && (t->free_head >= 0 || grow(t))) {
        int c = class_get(t, d->device, sp__block_stream(b), b->size);
        if (c >= 0) {
            int32_t i = t->free_head;
            tc_entry_t *e = &t->ent[i];
            t->free_head = e->next;
            *e = (tc_entry_t){.addr = b->addr,
                              .size = b->size,
                              .stream = sp__block_stream(b),
                              .b = b,
                              .device = d->device};
            t->nused++;
            hash_put(t, i);
            push_idle(t, c, i);
            kept = true;
        }
    }
    sp__unlock(&t->lock);
    if (!kept)
        return SP_TC_FREE;
    b->bal = SP_TC_MARK;
    b->tc_owner = t;
    d->tc_blocks++;
    return SP_TC_KEPT;
}

/* Every idle block of device d in cache t back to the pool (d's lock and t's held). */
static size_t drain_one(sp_devalloc_t *d, sp_tcache_t *t) {
    size_t bytes = 0;
    for (uint32_t c = 0; c < t->nclass; c++) {
        tc_class_t *k = &t->cls[c];
        if (k->device != d->device)
            continue;
        while (k->head >= 0) {
            int32_t i = k->head;
            sp_block_t *b = t->ent[i].b;
            k->head = t->ent[i].next;
            bytes += t->ent[i].size;
            drop(t, i);
            unmark(d, b, b->requested);
            sp__alloc_free_held(d, b);
        }
    }
    return bytes;
}

size_t sp__tc_drain(sp_devalloc_t *d) {
    if (!d->tc_blocks)
        return 0;
    size_t bytes = 0;
    pthread_mutex_lock(&g_reg);
    for (sp_tcache_t *t = g_head; t; t = t->next) {
        sp__lock(&t->lock);
        bytes += drain_one(d, t);
        sp__unlock(&t->lock);
    }
    pthread_mutex_unlock(&g_reg);
    return bytes;
}

/* Thread exit: idle blocks go back to their pools, blocks handed out become ordinary allocated
 * blocks (their free takes the ordinary path), then the cache leaves the registry. init_lock
 * keeps sp_shutdown from freeing the devices meanwhile. */
static void tc_exit(void *arg) {
    sp_tcache_t *t = arg;
    /* Only this thread adds entries, and it is exiting: none once none is seen. But a cache
     * that ever held a block (cap) goes through every device lock even when it is empty now:
     * another thread's take_back may have emptied it and still be inside its unlock of our lock
     * (which reads the lock's sleepers after the store that frees it); it holds that device's
     * lock until it is out, and the registry lock covers the drains. */
    sp__lock(&t->lock);
    bool any = t->cap != 0;
    sp__unlock(&t->lock);
    pthread_mutex_lock(&sp__g.init_lock);
    if (any && atomic_load_explicit(&sp__ready, memory_order_acquire)) {
        for (int dev = 0; dev < sp__g.ndev; dev++) {
            sp_devalloc_t *d = &sp__g.devs[dev];
            sp__lock(&d->lock);
            sp__lock(&t->lock);
            (void)drain_one(d, t);
            for (uint32_t i = 0; i < t->cap; i++) {
                tc_entry_t *e = &t->ent[i];
                if (e->state != E_OUT || e->device != dev)
                    continue;
                sp_block_t *b = e->b;
                size_t req = e->req;
                drop(t, (int32_t)i);
                unmark(d, b, req);
            }
            sp__unlock(&t->lock);
            sp__unlock(&d->lock);
        }
    }
    pthread_mutex_unlock(&sp__g.init_lock);
    pthread_mutex_lock(&g_reg);
    if (t->prev)
        t->prev->next = t->next;
    else
        g_head = t->next;
    if (t->next)
        t->next->prev = t->prev;
    pthread_mutex_unlock(&g_reg);
    if (tl_tc == t)
        tl_tc = NULL;
    free(t->ent);
    free(t->hash);
    free(t);
}

/* ---- fork and figures -------------------------------------------------------------------- */

void sp__tc_fork_lock(void) {
    pthread_mutex_lock(&g_reg);
    for (sp_tcache_t *t = g_head; t; t = t->next)
        sp__lock(&t->lock);
}

void sp__tc_fork_unlock(bool in_child) {
    for (sp_tcache_t *t = g_head; t; t = t->next) {
        if (in_child)
            sp__lock_fork_child(&t->lock);
        sp__unlock(&t->lock);
    }
    pthread_mutex_unlock(&g_reg);
}

size_t sp__tc_idle(int device, size_t *bytes_p) {
    size_t bytes = 0, blocks = 0;
    pthread_mutex_lock(&g_reg);
    for (sp_tcache_t *t = g_head; t; t = t->next) {
        sp__lock(&t->lock);
        for (uint32_t c = 0; c < t->nclass; c++) {
            if (t->cls[c].device != device)
                continue;
            for (int32_t i = t->cls[c].head; i >= 0; i = t->ent[i].next) {
                bytes += t->ent[i].size;
                blocks++;
            }
        }
        sp__unlock(&t->lock);
    }
    pthread_mutex_unlock(&g_reg);
    if (bytes_p)
        *bytes_p = bytes;
    return blocks;
}

SP_EXPORT sp_status_t sp_x_thread_cache_idle(int device, size_t *bytes_p, size_t *blocks_p) {
    SP_GATE("sp_x_thread_cache_idle");
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_x_thread_cache_idle", device, &d));
    if (!bytes_p || !blocks_p)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "sp_x_thread_cache_idle: NULL output pointer");
    *blocks_p = sp__tc_idle(device, bytes_p);
    return SP_SUCCESS;
}
