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

#include "sympool/experimental.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- address map ------------------------------------------------------------------------ */

/* Fibonacci hashing, keeping the product's top bits: recorded addresses are 512-byte to 2 MiB
 * aligned, so their low bits are zero and only the high bits of the product vary with all of
 * the key's bits. */
static size_t slot_of(uint64_t key, size_t cap) {
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> (64 - __builtin_ctzll((unsigned long long)cap)));
}

/* Rehash into `cap` slots (a power of two, more than twice m->n). */
static bool map_rehash(tr_map_t *m, size_t cap) {
    tr_slot_t *sl = calloc(cap, sizeof(*sl));
    if (sl == NULL)
        return false;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key == 0)
            continue;
        size_t s = slot_of(m->slots[i].key, cap);
        while (sl[s].key != 0)
            s = (s + 1) & (cap - 1);
        sl[s] = m->slots[i];
    }
    free(m->slots);
    m->slots = sl;
    m->cap = cap;
    return true;
}

static bool map_grow(tr_map_t *m) {
    return map_rehash(m, m->cap ? m->cap * 2 : 1024);
}

bool tr_map_reserve(tr_map_t *m, size_t n) {
    size_t cap = m->cap ? m->cap : 1024;
    while ((n + 1) * 2 > cap)
        cap *= 2;
    return cap == m->cap || map_rehash(m, cap);
}

bool tr_map_put(tr_map_t *m, uint64_t key, uintptr_t val) {
    if (key == 0)
        return false;
    if ((m->n + 1) * 2 > m->cap && !map_grow(m))
        return false;
    size_t s = slot_of(key, m->cap);
    while (m->slots[s].key != 0 && m->slots[s].key != key)
        s = (s + 1) & (m->cap - 1);
    if (m->slots[s].key == 0)
        m->n++;
    m->slots[s].key = key;
    m->slots[s].val = val;
    return true;
}

uintptr_t *tr_map_upsert(tr_map_t *m, uint64_t key, bool *added_p) {
    /* grown as tr_map_put grows, before the key is looked for, so that the two leave the map
     * alike */
    if (key == 0 || ((m->n + 1) * 2 > m->cap && !map_grow(m)))
        return NULL;
    size_t s = slot_of(key, m->cap);
    while (m->slots[s].key != 0 && m->slots[s].key != key)
        s = (s + 1) & (m->cap - 1);
    *added_p = m->slots[s].key == 0;
    if (*added_p) {
        m->n++;
        m->slots[s].key = key;
        m->slots[s].val = 0;
    }
    return &m->slots[s].val;
}

bool tr_map_get(const tr_map_t *m, uint64_t key, uintptr_t *val_p) {
    if (m->cap == 0 || key == 0)
        return false;
    for (size_t s = slot_of(key, m->cap); m->slots[s].key != 0; s = (s + 1) & (m->cap - 1)) {
        if (m->slots[s].key == key) {
            if (val_p)
                *val_p = m->slots[s].val;
            return true;
        }
    }
    return false;
}

uintptr_t *tr_map_find(tr_map_t *m, uint64_t key) {
    if (m->cap == 0 || key == 0)
        return NULL;
    for (size_t s = slot_of(key, m->cap); m->slots[s].key != 0; s = (s + 1) & (m->cap - 1))
        if (m->slots[s].key == key)
            return &m->slots[s].val;
    return NULL;
}

bool tr_map_del(tr_map_t *m, uint64_t key, uintptr_t *val_p) {
    if (m->cap == 0 || key == 0)
        return false;
    size_t s = slot_of(key, m->cap);
    while (m->slots[s].key != key) {
        if (m->slots[s].key == 0)
            return false;
        s = (s + 1) & (m->cap - 1);
    }
    if (val_p)
        *val_p = m->slots[s].val;
    /* Backward-shift deletion keeps probe chains intact without tombstones. */
    size_t hole = s;
    for (size_t j = (s + 1) & (m->cap - 1); m->slots[j].key != 0; j = (j + 1) & (m->cap - 1)) {
        size_t home = slot_of(m->slots[j].key, m->cap);
        bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].key = 0;
    m->n--;
    return true;
}

void tr_map_free(tr_map_t *m) {
    free(m->slots);
    memset(m, 0, sizeof(*m));
}

/* ---- loading ---------------------------------------------------------------------------- */

/* PyTorch's names of the actions, by tr_action_t. */
static const char *const action_names[] = {
    "alloc",       "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap",  "snapshot",       "oom",           "user_defined"};
static const size_t action_lens[] = {5, 14, 14, 13, 12, 11, 13, 8, 3, 12};

/* The action named by s (len bytes, NUL-terminated): the one name its first letters can be,
 * then compared whole, length included (a str holding a 0 byte after "alloc" is another str,
 * as for Python), instead of against every name. */
static tr_action_t action_of(const char *s, size_t len) {
    tr_action_t a = TR_OTHER;
    switch (s[0]) {
    case 'a':
        a = TR_ALLOC;
        break;
    case 'o':
        a = TR_OOM;
        break;
    case 'u':
        a = TR_ANNOTATION;
        break;
    case 'f':
        /* "free": a free_requested and its free_completed in one entry, as MemoryViz writes the
         * pairs it elides and reads them back (tools that export its data write them so) */
        if (len == 4)
            return memcmp(s, "free", 4) == 0 ? TR_FREE_REQUESTED : TR_OTHER;
        if (len > 5)
            a = s[5] == 'r' ? TR_FREE_REQUESTED : TR_FREE_COMPLETED;
        break;
    case 's':
        if (s[1] == 'n')
            a = TR_SNAPSHOT;
        else if (len > 8)
            a = s[8] == 'a'   ? TR_SEGMENT_ALLOC
                : s[8] == 'f' ? TR_SEGMENT_FREE
                : s[8] == 'm' ? TR_SEGMENT_MAP
                              : TR_SEGMENT_UNMAP;
        break;
    default:
        break;
    }
    return a != TR_OTHER && len == action_lens[a] && memcmp(s, action_names[a], len) == 0
               ? a
               : TR_OTHER;
}

static int cmp_seed(const void *a, const void *b) {
    const tr_seed_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static bool add_seed(tr_device_t *d, size_t *cap, uint64_t addr, uint64_t size, uint64_t bsize,
                     uint64_t stream, const pk_value_t *frames, uint16_t pool, bool pending) {
    if (d->nseeds == *cap) {
        size_t n = *cap ? *cap * 2 : 64;
        tr_seed_t *ns = realloc(d->seeds, n * sizeof(*ns));
        if (ns == NULL)
            return false;
        d->seeds = ns;
        *cap = n;
    }
    d->seeds[d->nseeds++] = (tr_seed_t){addr, size, bsize, stream, frames, false, pending, pool};
    d->seeded_bytes += size;
    return true;
}

static int cmp_sseg(const void *a, const void *b) {
    const tr_sseg_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* A growable array of T (grow before writing element n). */
#define GROW(arr, n, cap) ((n) < (cap) ? true : grow_array((void **)&(arr), &(cap), sizeof(*(arr))))

static bool grow_array(void **arr, size_t *cap, size_t elem) {
    size_t n = *cap ? *cap * 2 : 32;
    void *na = realloc(*arr, n * elem);
    if (na == NULL)
        return false;
    *arr = na;
    *cap = n;
    return true;
}

/* Room for n elements of *arr at once (cap: what it has), where growing it by doubling copied
 * it each time: a large trace's starting state, a few thousand segments and blocks, cost ~30
 * instructions an entry of realloc's copies. */
static bool reserve_array(void **arr, size_t *cap, size_t n, size_t elem) {
    if (n <= *cap)
        return true;
    void *na = realloc(*arr, n * elem);
    if (na == NULL)
        return false;
    *arr = na;
    *cap = n;
    return true;
}

/* qsort, but with `skip_sorted` not when base is in order already (a snapshot lists its
 * segments by address, and most seeds come from them): glibc's qsort is a merge sort that keeps
 * equal elements in order, so the result is the same, and the check is a comparison an element
 * where the sort was a buffer and log n passes. */
static void sort_by(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *)) {
    const char *p = base;
    size_t i = 1;
    while (i < n && cmp(p + (i - 1) * size, p + i * size) <= 0)
        i++;
    if (i < n)
        qsort(base, n, size, cmp);
}

/* seeds[0..n) by address, seeds at one address in their order (what sort_by gives): the first na
 * (the events', in event order) and the rest (the final state's, by address in PyTorch's
 * snapshots, which list their segments by address) sorted apart and merged, where one qsort of
 * all cost ~240 instructions a seed (nhf: 1745 seeds, 418k instructions). A merge that takes
 * the first run's seed at equal addresses keeps them in order, as the stable sort of the whole.
 * Without memory for the merge, the whole is sorted in place (the same order). */
static void sort_seeds(tr_seed_t *seeds, size_t n, size_t na) {
    sort_by(seeds, na, sizeof(*seeds), cmp_seed);
    sort_by(seeds + na, n - na, sizeof(*seeds), cmp_seed);
    if (na == 0 || na == n || seeds[na - 1].addr <= seeds[na].addr)
        return;
    tr_seed_t *a = malloc(na * sizeof(*a));
    if (a == NULL) {
        qsort(seeds, n, sizeof(*seeds), cmp_seed);
        return;
    }
    memcpy(a, seeds, na * sizeof(*a));
    size_t i = 0, j = na, k = 0;
    while (i < na && j < n)
        seeds[k++] = a[i].addr <= seeds[j].addr ? a[i++] : seeds[j++];
    while (i < na) /* what is left of the second run is in place */
        seeds[k++] = a[i++];
    free(a);
}

/* A final segment's addresses and its index in the list, to find two that overlap. */
typedef struct span {
    uint64_t addr, end;
    size_t index;
} span_t;

static int cmp_span(const void *a, const void *b) {
    const span_t *x = a, *y = b;
    if (x->addr != y->addr)
        return x->addr < y->addr ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* A private pool's segment, for routing allocations by recorded address. */
typedef struct pool_range {
    uint64_t addr, end;
    uint16_t pool;
} pool_range_t;

static int cmp_range(const void *a, const void *b) {
    const pool_range_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static uint16_t pool_at(const pool_range_t *r, size_t n, uint64_t addr) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && addr < r[lo - 1].end ? r[lo - 1].pool : 0;
}

/* Whether any entry of d's trace names its pool (newer PyTorch's and sympool's "pool_id"). */
static bool names_pools(const tr_device_t *d) {
    for (size_t i = 0; i < d->nev; i++)
        if (d->ev[i].flags & TR_F_POOL_ID)
            return true;
    return false;
}

/* pool_index's key of a pool id in its map (never 0, the map's empty key). */
static uint64_t pool_key(uint64_t first, uint64_t second) {
    uint64_t k = (first * 0x9e3779b97f4a7c15ull) ^
                 ((second + 0x632be59bd9b4e019ull) * 0xff51afd7ed558ccdull);
    return k ? k : 1;
}

/* A device holds at most this many private pools (their index is 16 bits). */
#define TR_MAX_POOLS 65535
/* pool_index's refusal past TR_MAX_POOLS (-1: out of memory). */
#define TR_TOO_MANY_POOLS (-2)

/* 1 + the index of segment_pool_id in d->pools (added when new); 0 for the default pool.
 * known maps pool_key to that index for d->pools, so that an id is found without a scan (a
 * trace may name thousands of pools, each entry one); an id whose key another pool has is
 * looked for by a scan. */
static int pool_index(tr_device_t *d, size_t *cap, tr_map_t *known, const pk_value_t *id) {
    uint64_t f = 0, sec = 0;
    if (pk_len(id) != 2 || !pk_uint(pk_at(id, 0), &f) || !pk_uint(pk_at(id, 1), &sec) ||
        (f == 0 && sec == 0))
        return 0;
    uint64_t key = pool_key(f, sec);
    uintptr_t at = 0;
    if (tr_map_get(known, key, &at)) {
        if (d->pools[at - 1].first == f && d->pools[at - 1].second == sec)
            return (int)at;
        for (size_t i = 0; i < d->npools; i++)
            if (d->pools[i].first == f && d->pools[i].second == sec)
                return (int)i + 1;
    }
    if (d->npools >= TR_MAX_POOLS)
        return TR_TOO_MANY_POOLS;
    if (!GROW(d->pools, d->npools, *cap))
        return -1;
    d->pools[d->npools++] = (tr_pool_id_t){f, sec};
    if (at == 0 && !tr_map_put(known, key, d->npools))
        return -1;
    return (int)d->npools;
}

/* known (empty) as pool_index keeps it, for the pools d has. */
static bool pools_known(const tr_device_t *d, tr_map_t *known) {
    for (size_t i = 0; i < d->npools; i++) {
        uint64_t key = pool_key(d->pools[i].first, d->pools[i].second);
        if (!tr_map_get(known, key, NULL) && !tr_map_put(known, key, i + 1))
            return false;
    }
    return true;
}

/* Mapped ranges of expandable segments, by address, disjoint; adjacent ranges of one segment
 * (same stream, pool and kind) are merged. */
typedef struct xrange {
    uint64_t addr, end, stream;
    uint16_t pool;
    bool small;
} xrange_t;

/* Take [a, b) out of the ranges. */
static bool xr_remove(xrange_t **r, size_t *n, size_t *cap, uint64_t a, uint64_t b) {
    for (size_t i = 0; i < *n; i++) {
        xrange_t *x = &(*r)[i];
        if (x->end <= a || x->addr >= b)
            continue;
        if (x->addr < a && x->end > b) { /* a hole in the middle: split */
            if (!GROW(*r, *n, *cap))
                return false;
            x = &(*r)[i];
            memmove(x + 2, x + 1, (*n - i - 1) * sizeof(*x));
            x[1] = *x;
            x[1].addr = b;
            x->end = a;
            (*n)++;
            return true;
        }
        if (x->addr < a) {
            x->end = a;
        } else if (x->end > b) {
            x->addr = b;
        } else {
            memmove(x, x + 1, (*n - i - 1) * sizeof(*x));
            (*n)--;
            i--;
        }
    }
    return true;
}

static bool xr_same(const xrange_t *x, const xrange_t *y) {
    return x->end == y->addr && x->stream == y->stream && x->pool == y->pool &&
           x->small == y->small;
}

/* Add a range (what it overlaps is replaced). */
static bool xr_add(xrange_t **r, size_t *n, size_t *cap, xrange_t v) {
    if (v.end <= v.addr)
        return true;
    if (!xr_remove(r, n, cap, v.addr, v.end) || !GROW(*r, *n, *cap))
        return false;
    size_t i = 0;
    while (i < *n && (*r)[i].addr < v.addr)
        i++;
    memmove(&(*r)[i + 1], &(*r)[i], (*n - i) * sizeof(v));
    (*r)[i] = v;
    (*n)++;
    if (i + 1 < *n && xr_same(&(*r)[i], &(*r)[i + 1])) {
        (*r)[i].end = (*r)[i + 1].end;
        memmove(&(*r)[i + 1], &(*r)[i + 2], (*n - i - 2) * sizeof(v));
        (*n)--;
    }
    if (i > 0 && xr_same(&(*r)[i - 1], &(*r)[i])) {
        (*r)[i - 1].end = (*r)[i].end;
        memmove(&(*r)[i], &(*r)[i + 1], (*n - i - 1) * sizeof(v));
        (*n)--;
    }
    return true;
}

/* Whether pages the trace unmapped were the small pool's: as the mapped range of that stream
 * next to them, else by their size (PyTorch maps the large pool in 20 MiB pages, the small
 * in 2 MiB ones). */
static bool xr_small(const xrange_t *r, size_t n, uint64_t addr, uint64_t stream, uint64_t size) {
    for (size_t i = 0; i < n; i++)
        if (r[i].stream == stream && (r[i].end == addr || r[i].addr == addr + size))
            return r[i].small;
    return size % (20u << 20) != 0;
}

static uint64_t round512(uint64_t n) {
    return n < 512 ? 512 : (n + 511) & ~(uint64_t)511;
}

/* One event dict in one pass over its keys (a lookup per key would walk it six times). */
/* Bounds on what a snapshot may hold, so that every sum and difference the commands compute in
 * 64 bits stays exact: a size below 1 EB (PyTorch refuses an allocation of 1 EB or more before
 * its allocator runs, so no recorded size reaches it), bytes live or reserved at once below
 * 4 EiB, and time_us in [0, 2^53] (microseconds since 1970, exact in a double; the year 2255). A
 * snapshot past them is refused naming the field, instead of printing "-2 B" or overflowing. */
#define TR_SIZE_LIMIT ((uint64_t)1 << 60)
#define TR_SUM_LIMIT ((int64_t)1 << 62)
#define TR_TIME_LIMIT ((int64_t)1 << 53)

/* A replay without stacks walks the events' array several times and first touches it as it
 * is filled: 32 bytes an event (the time and stack kept apart, tr_event_at_t), not 48. */
_Static_assert(sizeof(tr_event_t) == 32, "tr_event_t grew past 32 bytes");

/* What an entry's event is from the values of its keys (NULL where absent; the last pair with a
 * key wins), its action already known. */
typedef struct entry_vals {
    const pk_value_t *addr, *dfree, *size, *stream, *t, *fr, *pid;
} entry_vals_t;

/* at: where its time and stack go, NULL when they are not kept (the time is checked all the
 * same). */
static inline __attribute__((always_inline)) void
fill_event(const entry_vals_t *x, tr_action_t action, tr_event_t *ev, tr_event_at_t *at,
           bool *have_addr_p, bool *have_size_p, bool *bad_time_p, bool *bad_stream_p) {
    ev->action = action;
    if (at != NULL)
        at->frames = x->fr != NULL && x->fr->type == PK_LIST ? x->fr : NULL;
    const pk_value_t *av = action == TR_OOM ? x->dfree : x->addr;
    if (av != NULL && x->size != NULL && x->stream != NULL && x->t != NULL &&
        ((av->type ^ PK_INT) | (x->size->type ^ PK_INT) | (x->stream->type ^ PK_INT) |
         (x->t->type ^ PK_INT)) == 0) {
        /* Four ints that fit int64_t (an entry as PyTorch writes it): what the general
         * reading below makes of them, without its tests of each value's kind */
        int64_t ai = av->u.i, si = x->size->u.i, ti = x->t->u.i;
        *have_addr_p = ai >= 0;
        ev->addr = ai >= 0 ? (uint64_t)ai : 0;
        *have_size_p = si >= 0;
        ev->size = si >= 0 ? (uint64_t)si : 0;
        ev->stream = (uint64_t)x->stream->u.i; /* a negative handle as its two's complement */
        *bad_stream_p = false;
        if (at != NULL)
            at->time_us = ti;
        *bad_time_p = ti < 0 || ti > TR_TIME_LIMIT;
        return;
    }
    uint64_t u = 0;
    int64_t i = 0;
    *have_addr_p = pk_uint(ev->action == TR_OOM ? x->dfree : x->addr, &u);
    ev->addr = u;
    u = 0;
    *have_size_p = pk_uint(x->size, &u);
    ev->size = u;
    /* Streams are handles: PyTorch pickles them as unsigned, a few as negative ints. Anything
     * else (a string, a float, an int past 64 bits) names no stream: refused, not read as the
     * default stream. */
    *bad_stream_p = false;
    if (pk_uint(x->stream, &u))
        ev->stream = u;
    else if (pk_int(x->stream, &i))
        ev->stream = (uint64_t)i;
    else
        *bad_stream_p = x->stream != NULL;
    if (at != NULL && pk_int(x->t, &i))
        at->time_us = i;
    *bad_time_p = x->t != NULL && (!pk_int(x->t, &i) || i < 0 || i > TR_TIME_LIMIT);
}

/* An entry's user_metadata as replay sets it: its str when one other than "", else NULL (absent,
 * "", or no str: PyTorch writes a str, "" by default). */
static inline const char *meta_text(const pk_value_t *v, size_t *len_p) {
    if (v == NULL || v->type != PK_STR || v->u.str.len == 0)
        return NULL;
    *len_p = v->u.str.len;
    return v->u.str.s;
}

/* What a trace entry's pairs (key0, val0, ...) say: *act_p NULL when it has no action string. */
static void read_pairs(pk_value_t *const *it, size_t n, tr_event_t *ev, tr_event_at_t *at,
                       const char **act_p, bool *have_addr_p, bool *have_size_p, bool *bad_time_p,
                       bool *bad_stream_p, const pk_value_t **pool_id_p, const char **meta_p,
                       size_t *meta_len_p) {
    const char *act = NULL;
    size_t act_len = 0;
    entry_vals_t x = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    const pk_value_t *meta = NULL;
    for (size_t k = 0; k + 1 < n; k += 2) {
        const pk_value_t *key = it[k], *val = it[k + 1];
        if (key->type != PK_STR)
            continue;
        const char *ks = key->u.str.s;
        switch (key->u.str.len) {
        case 4:
            if (memcmp(ks, "addr", 4) == 0)
                x.addr = val;
            else if (memcmp(ks, "size", 4) == 0)
                x.size = val;
            break;
        case 6:
            if (memcmp(ks, "action", 6) == 0) {
                act = pk_str(val);
                act_len = act != NULL ? val->u.str.len : 0;
            } else if (memcmp(ks, "stream", 6) == 0)
                x.stream = val;
            else if (memcmp(ks, "frames", 6) == 0)
                x.fr = val;
            break;
        case 7:
            if (memcmp(ks, "time_us", 7) == 0)
                x.t = val;
            else if (memcmp(ks, "pool_id", 7) == 0)
                x.pid = val;
            break;
        case 11:
            if (memcmp(ks, "device_free", 11) == 0)
                x.dfree = val;
            break;
        case 13:
            if (memcmp(ks, "user_metadata", 13) == 0)
                meta = val;
            break;
        default:
            break;
        }
    }
    *act_p = act;
    *pool_id_p = x.pid;
    *meta_p = meta_text(meta, meta_len_p);
    if (act == NULL)
        return;
    fill_event(&x, action_of(act, act_len), ev, at, have_addr_p, have_size_p, bad_time_p,
               bad_stream_p);
}

/* A trace entry the reader handed over as it parsed it (pk_parse_records): what read_pairs
 * found, without the dict. */
typedef struct rec_side {
    uint64_t id;               /* the entry's index among the handed-over entries */
    const char *act;           /* the action string (the document's) */
    const pk_value_t *pool_id; /* the entry's pool_id, or NULL */
    const char *meta;          /* the entry's user_metadata (meta_text), or NULL */
    size_t meta_len;           /* its bytes */
} rec_side_t;

/* What load_events checks about a handed-over entry, in its event's flags until it has (bits the
 * TR_F_ flags leave free; cleared there, so that no event keeps them). */
#define RF_NO_ADDR 0x80u    /* no usable addr (device_free for an oom) */
#define RF_NO_SIZE 0x40u    /* no usable size */
#define RF_BAD_TIME 0x20u   /* time_us out of bounds */
#define RF_BAD_STREAM 0x10u /* stream not an integer */
#define RF_ALL (RF_NO_ADDR | RF_NO_SIZE | RF_BAD_TIME | RF_BAD_STREAM)
_Static_assert(((TR_F_DEFERRED | TR_F_EMPTY_CACHE | TR_F_POOL_ID | TR_F_COMPLETION) & RF_ALL) == 0,
               "the loader's check bits overlap the TR_F_ flags");

/* The trace entries the reader handed over, in the order it parsed them: a device's entries are
 * one run of them, which becomes that device's event array as it is. An entry's action string
 * is its action's name unless the action is one this version does not know; those entries and
 * the ones naming a pool have a side record (most entries have none: a side record for every
 * entry was a third of the memory the entries take). */
/* A block of the final state the reader handed over (take_block): what analyse reads of it. */
typedef struct rec_block {
    int64_t size, req;        /* pk_int of its size and requested_size (when RB_SIZE / RB_REQ) */
    const pk_value_t *frames; /* its frames when a list, else NULL */
    uint8_t flags;            /* RB_ */
} rec_block_t;

#define RB_SIZE 0x1u      /* size read as an int */
#define RB_REQ 0x2u       /* requested_size read as an int */
#define RB_STATE 0x4u     /* state is a string */
#define RB_ACTIVE 0x8u    /* ... "active_allocated" */
#define RB_INACTIVE 0x10u /* ... "inactive" */
#define RB_PENDING 0x20u  /* ... "active_pending_free" */
/* A handed-over block's record id: apart from the entries' ids by its top bit. */
#define RB_ID ((uint64_t)1 << 63)

/* A segment of the final state the reader handed over (take_segment): what from_doc and
 * analyse read of it. The values it keeps are the document's (a container or a string), never
 * an int the reader made only for the hook. */
typedef struct rec_seg {
    int64_t dev, total;       /* pk_int of device and total_size (when RS_DEV / RS_TOTAL) */
    uint64_t addr, stream;    /* pk_uint of address (when RS_ADDR); the stream as a handle */
    const pk_value_t *pool;   /* segment_pool_id when a container, else NULL */
    const pk_value_t *blocks; /* blocks when a container or a record, else NULL */
    const pk_value_t *type;   /* segment_type when a string, else NULL */
    uint8_t flags;            /* RS_ */
} rec_seg_t;

#define RS_DEV 0x1u
#define RS_TOTAL 0x2u
#define RS_ADDR 0x4u
#define RS_EXPANDABLE 0x8u      /* is_expandable is True */
#define RS_BAD_STREAM 0x10u     /* stream present and not an integer */
#define RS_BAD_BLOCKS 0x20u     /* blocks present and no container */
#define RS_BAD_EXPANDABLE 0x40u /* is_expandable present and no bool */
#define RS_BAD_TYPE 0x80u       /* segment_type present and neither "small" nor "large" */
/* A handed-over segment's record id. */
#define RS_ID ((uint64_t)1 << 62)

/* The keys the hook reads, of a trace entry, a block and a segment (RK_OTHER: none of them). */
enum {
    RK_OTHER,
    RK_ACTION,
    RK_ADDR,
    RK_SIZE,
    RK_STREAM,
    RK_TIME,
    RK_FRAMES,
    RK_POOL_ID,
    RK_DFREE,
    RK_STATE,
    RK_REQ,
    RK_ADDRESS,
    RK_DEVICE,
    RK_BLOCKS,
    RK_TOTAL,
    RK_SEG_TYPE,
    RK_SEG_POOL,
    RK_EXPANDABLE,
    RK_SEG_OTHER, /* a segment's keys that are not read: active_size, allocated_size */
    RK_META,      /* a trace entry's user_metadata */
    RK_COUNT
};
#define RK_BIT(k) (1u << (k))
/* The keys a block's dict may have, and a segment's. */
#define RK_BLOCK_KEYS                                                                              \
    (RK_BIT(RK_STATE) | RK_BIT(RK_SIZE) | RK_BIT(RK_REQ) | RK_BIT(RK_FRAMES) | RK_BIT(RK_ADDRESS))
#define RK_SEG_KEYS                                                                                \
    (RK_BIT(RK_DEVICE) | RK_BIT(RK_STREAM) | RK_BIT(RK_BLOCKS) | RK_BIT(RK_FRAMES) |               \
     RK_BIT(RK_ADDRESS) | RK_BIT(RK_TOTAL) | RK_BIT(RK_SEG_OTHER) | RK_BIT(RK_REQ) |               \
     RK_BIT(RK_SEG_TYPE) | RK_BIT(RK_EXPANDABLE) | RK_BIT(RK_SEG_POOL))
#define RK_CACHE 256 /* slots of recs_t's caches (a power of two) */
/* Slots of its cache of state and type strs (a power of two): a final state has a few. */
#define LIT_CACHE 16
/* Pairs of the longest dict whose keys take_entry keeps as the next one's shape. */
#define REC_SHAPE_MAX 16
/* Shapes take_entry keeps: a final state's segments and their blocks come in turns (a segment's
 * blocks, then the segment), each kind with its own keys; with one shape, each turn read the
 * dict key by key again. */
#define REC_SHAPES 4

/* The keys of the last dict take_entry read key by key, in order, with their ids: a trace's
 * entries (and a final state's blocks) have the same keys in the same order, each the one str
 * the pickler memoized, so the next dict's keys are known by address, one comparison each. */
typedef struct rec_shape {
    const pk_value_t *keys[REC_SHAPE_MAX];
    uint8_t ids[REC_SHAPE_MAX];
    size_t n;             /* pairs (0: no shape known) */
    uint32_t seen, twice; /* take_entry's key bits for that dict */
    /* By key id, the pair that holds its value (the last one with that key, as rs->v has it),
     * REC_ABSENT where none does: a trace entry of this shape is read from its pairs in place
     * (take_entry), without the values going through rs->v. */
    uint8_t at[RK_COUNT];
    /* A trace entry's keys as PyTorch writes them: action, addr, size, stream, time_us and
     * frames, maybe user_metadata, none other that take_entry reads (no pool_id or
     * device_free): its values are read from their pairs at once. */
    bool plain;
} rec_shape_t;
#define REC_ABSENT 0xffu

/* A growable array whose elements never move: chunk c holds REC_BASE << c of them (element i
 * is in chunk msb(i + REC_BASE) - REC_BASE_LOG), each allocated when the first of its elements
 * is added. The final state's blocks and segments were arrays doubled by realloc, whose copies
 * (nhf: 16 reallocs, ~0.38 M instructions, the most of the entry hook but its key reads) grew
 * with the final state; here nothing is copied and the same memory is allocated. */
#define REC_BASE_LOG 5
#define REC_BASE ((size_t)1 << REC_BASE_LOG)
#define REC_CHUNKS (64 - REC_BASE_LOG)

typedef struct rec_chunks {
    void *chunk[REC_CHUNKS];
    size_t n; /* elements */
} rec_chunks_t;

/* Where element i (< c->n) of elem bytes lies. */
static inline void *chunk_at(const rec_chunks_t *c, size_t i, size_t elem) {
    size_t k = i + REC_BASE;
    int top = 63 - __builtin_clzll((unsigned long long)k);
    return (char *)c->chunk[top - REC_BASE_LOG] + (k - ((size_t)1 << top)) * elem;
}

/* Room for element c->n, counted (NULL on OOM, c unchanged): where to write it. */
static void *chunk_push(rec_chunks_t *c, size_t elem) {
    size_t k = c->n + REC_BASE;
    int top = 63 - __builtin_clzll((unsigned long long)k);
    void **ch = &c->chunk[top - REC_BASE_LOG];
    if (*ch == NULL && (*ch = malloc(((size_t)1 << top) * elem)) == NULL)
        return NULL;
    c->n++;
    return chunk_at(c, c->n - 1, elem);
}

/* Once nothing more is pushed: the newest chunk cut to the elements it holds, the rest given
 * back to the heap before the analysis allocates (nhf's 4,158 blocks left 128 KB of a 4,096-block
 * chunk unused through the analysis). chunk_push must not be called on c after this. */
static void chunks_trim(rec_chunks_t *c, size_t elem) {
    if (c->n == 0)
        return;
    size_t k = c->n - 1 + REC_BASE;
    int top = 63 - __builtin_clzll((unsigned long long)k);
    size_t used = k - ((size_t)1 << top) + 1; /* elements of the newest chunk in use */
    void *ch = realloc(c->chunk[top - REC_BASE_LOG], used * elem);
    if (ch != NULL)
        c->chunk[top - REC_BASE_LOG] = ch;
}

static void chunks_free(rec_chunks_t *c) {
    for (size_t j = 0; j < REC_CHUNKS; j++)
        free(c->chunk[j]);
    memset(c, 0, sizeof(*c));
}

typedef struct recs {
    tr_event_t *ev;   /* the entries (what read_pairs found) */
    size_t n, cap;    /* entries / allocated */
    size_t taken;     /* entries before this one belong to a device already */
    rec_side_t *side; /* side records, by id */
    size_t nside, cap_side;
    size_t next_side; /* where the next lookup starts (entries are read in order) */
    rec_chunks_t blk; /* handed-over blocks of the final state (rec_block_t), by id without RB_ID */
    rec_chunks_t seg; /* handed-over segments of the final state (rec_seg_t), by id without RS_ID */
    /* The keys and action strings met lately, by address (a pickler memoizes them: every
     * entry's "addr" is one value), with what they are (key_id, action_id). */
    struct {
        const pk_value_t *s;
        int id;
    } keys[RK_CACHE], acts[RK_CACHE];
    struct {
        const pk_value_t *s;
        unsigned is;   /* LIT_ bits */
    } lits[LIT_CACHE]; /* the strs met as a block's state or a segment's type, as lit_of */
    rec_shape_t shapes[REC_SHAPES]; /* the shapes met lately (n 0: none) */
    size_t shape;                   /* the one whose keys' slots rs->v holds */
    size_t shape_next;              /* the one read_keys replaces next */
    /* The value of each key of the dict take_entry reads, NULL where it has none. Between calls
     * only the slots of the shape's keys hold anything (each call sets them all again, or
     * clears the whole array and reads the dict key by key). */
    const pk_value_t *v[RK_COUNT];
} recs_t;

static bool grow_array(void **arr, size_t *cap, size_t elem);

/* Which of the final state's strings a str is (a block's state, a segment's type): LIT_ bits. */
#define LIT_ACTIVE 0x1u   /* "active_allocated" */
#define LIT_INACTIVE 0x2u /* "inactive" */
#define LIT_PENDING 0x4u  /* "active_pending_free" */
#define LIT_SMALL 0x8u    /* "small" */
#define LIT_LARGE 0x10u   /* "large" */
static inline unsigned lit_of(recs_t *rs, const pk_value_t *s);

/* A dict's value by key id, for take_block and take_segment: from rs->v (v, when sh is NULL), or
 * read in place from pairs of shape sh (the pair of the last one with that key, as rs->v has
 * it). */
typedef struct key_vals {
    const pk_value_t *const *v;
    const rec_shape_t *sh;
    pk_value_t *const *pairs;
} key_vals_t;

static inline __attribute__((always_inline)) const pk_value_t *kv(const key_vals_t *x, int id) {
    if (x->sh == NULL)
        return x->v[id];
    return x->sh->at[id] != REC_ABSENT ? x->pairs[2 * (size_t)x->sh->at[id] + 1] : NULL;
}

/* A final-state block's dict, taken as the entries are (a forward pass's trace has as many
 * blocks as entries, and a dict, its items and its ints each, read again by key, cost more than
 * what analyse reads of them): a dict with a "state" key and no key but a block's. x gives the
 * value of the last pair with each key (as get_keys reads them), seen which keys it has; a dict
 * with two "frames" is left a dict (its skipped pair, left out of a dict, would not hide the
 * other one there). */
static inline __attribute__((always_inline)) int
take_block(recs_t *rs, const key_vals_t *x, uint32_t seen, size_t nframes, uint64_t *id_p) {
    const pk_value_t *state = kv(x, RK_STATE);
    if ((seen & ~(uint32_t)RK_BLOCK_KEYS) != 0 || nframes > 1 || state == NULL)
        return 0;
    rec_block_t b = {0, 0, NULL, 0};
    if (pk_int(kv(x, RK_SIZE), &b.size))
        b.flags |= RB_SIZE;
    if (pk_int(kv(x, RK_REQ), &b.req))
        b.flags |= RB_REQ;
    if (state->type == PK_STR) {
        unsigned is = lit_of(rs, state);
        b.flags |= RB_STATE | ((is & LIT_ACTIVE) ? RB_ACTIVE : 0u) |
                   ((is & LIT_INACTIVE) ? RB_INACTIVE : 0u) |
                   ((is & LIT_PENDING) ? RB_PENDING : 0u);
    }
    /* A skipped stack is the reader's one PK_NONE: it reads as no frames either way. */
    const pk_value_t *fr = kv(x, RK_FRAMES);
    b.frames = fr != NULL && fr->type == PK_LIST ? fr : NULL;
    rec_block_t *at = chunk_push(&rs->blk, sizeof(*at));
    if (at == NULL)
        return -1;
    *at = b;
    *id_p = RB_ID | (rs->blk.n - 1);
    return 1;
}

/* Whether a segment's segment_type is present and not one PyTorch writes ("small" or "large"):
 * read as "large", a small segment's blocks went to the large pool. Absent (older snapshots) is
 * fine: the size tells. */
static bool seg_type_bad(const pk_value_t *type) {
    return type != NULL &&
           (type->type != PK_STR || !(pk_str_is(type, "small") || pk_str_is(type, "large")));
}

/* A final-state segment's dict, taken as the blocks are: a dict with "device" and "blocks"
 * keys and no key but a segment's; x and seen as for take_block (the last pair wins, as
 * get_keys and pk_get read them). */
static inline __attribute__((always_inline)) int take_segment(recs_t *rs, const key_vals_t *x,
                                                              uint32_t seen, uint64_t *id_p) {
    const pk_value_t *dev = kv(x, RK_DEVICE), *blocks = kv(x, RK_BLOCKS);
    if ((seen & ~(uint32_t)RK_SEG_KEYS) != 0 || dev == NULL || blocks == NULL)
        return 0;
    rec_seg_t g;
    memset(&g, 0, sizeof(g));
    if (pk_int(dev, &g.dev))
        g.flags |= RS_DEV;
    if (pk_int(kv(x, RK_TOTAL), &g.total))
        g.flags |= RS_TOTAL;
    if (pk_uint(kv(x, RK_ADDRESS), &g.addr))
        g.flags |= RS_ADDR;
    int64_t stream = 0;
    const pk_value_t *sv = kv(x, RK_STREAM);
    if (!pk_uint(sv, &g.stream)) {
        if (pk_int(sv, &stream))
            g.stream = (uint64_t)stream;
        else if (sv != NULL)
            g.flags |= RS_BAD_STREAM;
    }
    const pk_value_t *type = kv(x, RK_SEG_TYPE);
    g.type = type != NULL && type->type == PK_STR ? type : NULL;
    /* seg_type_bad, its strs known by address */
    if (type != NULL && (type->type != PK_STR || (lit_of(rs, type) & (LIT_SMALL | LIT_LARGE)) == 0))
        g.flags |= RS_BAD_TYPE;
    const pk_value_t *pool = kv(x, RK_SEG_POOL);
    g.pool = pool != NULL && (pool->type == PK_LIST || pool->type == PK_TUPLE ||
                              pool->type == PK_DICT || pool->type == PK_RECORD)
                 ? pool
                 : NULL;
    g.blocks = blocks->type == PK_LIST || blocks->type == PK_TUPLE || blocks->type == PK_DICT ||
                       blocks->type == PK_RECORD
                   ? blocks
                   : NULL;
    if (g.blocks == NULL)
        g.flags |= RS_BAD_BLOCKS;
    const pk_value_t *exp = kv(x, RK_EXPANDABLE);
    if (exp != NULL && exp->type == PK_BOOL && exp->u.b)
        g.flags |= RS_EXPANDABLE;
    if (exp != NULL && exp->type != PK_BOOL)
        g.flags |= RS_BAD_EXPANDABLE;
    rec_seg_t *at = chunk_push(&rs->seg, sizeof(*at));
    if (at == NULL)
        return -1;
    *at = g;
    *id_p = RS_ID | (rs->seg.n - 1);
    return 1;
}

/* The handed-over segment v is, or NULL. */
static const rec_seg_t *seg_of(const recs_t *rs, const pk_value_t *v) {
    if (rs == NULL || v == NULL || v->type != PK_RECORD || (v->u.u & RB_ID) || !(v->u.u & RS_ID) ||
        (v->u.u & ~RS_ID) >= rs->seg.n)
        return NULL;
    return chunk_at(&rs->seg, v->u.u & ~RS_ID, sizeof(rec_seg_t));
}

/* The handed-over block v is, or NULL. */
static const rec_block_t *block_of(const recs_t *rs, const pk_value_t *v) {
    if (rs == NULL || v == NULL || v->type != PK_RECORD || !(v->u.u & RB_ID) ||
        (v->u.u & ~RB_ID) >= rs->blk.n)
        return NULL;
    return chunk_at(&rs->blk, v->u.u & ~RB_ID, sizeof(rec_block_t));
}

/* Whether v is a handed-over block or segment: a dict, to every reader but analyse. */
static bool dict_record(const recs_t *rs, const pk_value_t *v) {
    return block_of(rs, v) != NULL || seg_of(rs, v) != NULL;
}

/* Whether v is a handed-over trace entry: a dict of which only what an event needs was kept. */
static bool entry_record(const recs_t *rs, const pk_value_t *v) {
    return rs != NULL && v != NULL && v->type == PK_RECORD && !(v->u.u & (RB_ID | RS_ID)) &&
           v->u.u < rs->n;
}

/* A handed-over dict met where its other keys are read (a trace entry that is also the top
 * level, the settings, a segment or a block; any one as the settings' roundup divisions): what
 * the record kept cannot say what the dict holds there, so the file is to be read whole
 * (PK_ERR_WHOLE, which tr_load_opts does). No snapshot a pickler wrote shares a dict so. */
static bool whole_needed(const char *what, char *err, size_t errlen) {
    snprintf(err, errlen, PK_ERR_WHOLE "a dict handed over as a trace entry is also %s", what);
    return false;
}

/* Which of the hook's keys key (a str) is, as its bytes say (all of them: a str holding a 0
 * byte after "addr" is another str, as for Python). */
static int key_of(const char *s, size_t len) {
#define RK_IS(lit) (memcmp(s, lit, sizeof(lit) - 1) == 0)
    switch (len) {
    case 4:
        return RK_IS("addr") ? RK_ADDR : RK_IS("size") ? RK_SIZE : RK_OTHER;
    case 5:
        return RK_IS("state") ? RK_STATE : RK_OTHER;
    case 6:
        return RK_IS("action")   ? RK_ACTION
               : RK_IS("stream") ? RK_STREAM
               : RK_IS("frames") ? RK_FRAMES
               : RK_IS("device") ? RK_DEVICE
               : RK_IS("blocks") ? RK_BLOCKS
                                 : RK_OTHER;
    case 7:
        return RK_IS("time_us")   ? RK_TIME
               : RK_IS("pool_id") ? RK_POOL_ID
               : RK_IS("address") ? RK_ADDRESS
                                  : RK_OTHER;
    case 10:
        return RK_IS("total_size") ? RK_TOTAL : RK_OTHER;
    case 11:
        return RK_IS("device_free") ? RK_DFREE : RK_IS("active_size") ? RK_SEG_OTHER : RK_OTHER;
    case 12:
        return RK_IS("segment_type") ? RK_SEG_TYPE : RK_OTHER;
    case 13:
        return RK_IS("is_expandable") ? RK_EXPANDABLE : RK_IS("user_metadata") ? RK_META : RK_OTHER;
    case 14:
        return RK_IS("requested_size") ? RK_REQ : RK_IS("allocated_size") ? RK_SEG_OTHER : RK_OTHER;
    case 15:
        return RK_IS("segment_pool_id") ? RK_SEG_POOL : RK_OTHER;
    default:
        return RK_OTHER;
    }
#undef RK_IS
}

/* The cache slot of value v. */
static inline size_t rk_slot(const pk_value_t *v) {
    /* Values lie in arrays, and a pickler's keys and action strings are made one after the
     * other early on: by index they fall in distinct slots. */
    return ((uintptr_t)v / sizeof(*v)) & (RK_CACHE - 1);
}

/* key_of of a str key, through the cache: values never change once made, so a key met before
 * (the pickler's memoized one, the reader's shared short string) is known by its address. */
static inline int key_id(recs_t *rs, const pk_value_t *key) {
    size_t h = rk_slot(key);
    if (rs->keys[h].s != key) {
        rs->keys[h].s = key;
        rs->keys[h].id = key_of(key->u.str.s, key->u.str.len);
    }
    return rs->keys[h].id;
}

/* Which LIT_ strs the str s is, through a cache as key_id's (a pickler memoizes a state or type
 * str: thousands of blocks share a few). Compared once each, instead of three pk_str_is a block:
 * GCC compiled those (constant lengths) to calls to memcmp in take_entry. */
static inline unsigned lit_of(recs_t *rs, const pk_value_t *s) {
    size_t h = rk_slot(s) & (LIT_CACHE - 1);
    if (rs->lits[h].s != s) {
        rs->lits[h].s = s;
        rs->lits[h].is = (pk_str_is(s, "active_allocated") ? LIT_ACTIVE : 0u) |
                         (pk_str_is(s, "inactive") ? LIT_INACTIVE : 0u) |
                         (pk_str_is(s, "active_pending_free") ? LIT_PENDING : 0u) |
                         (pk_str_is(s, "small") ? LIT_SMALL : 0u) |
                         (pk_str_is(s, "large") ? LIT_LARGE : 0u);
    }
    return rs->lits[h].is;
}

/* action_of of an action str, through a cache as key_id's. */
static inline tr_action_t action_id(recs_t *rs, const pk_value_t *act) {
    size_t h = rk_slot(act);
    if (rs->acts[h].s != act) {
        rs->acts[h].s = act;
        rs->acts[h].id = (int)action_of(act->u.str.s, act->u.str.len);
    }
    return (tr_action_t)rs->acts[h].id;
}

/* Whether the n pairs have the keys of shape sh, in its order: then their values are in rs->v
 * (the shape's slots; the others are NULL) and *seen_p, *twice_p are the shape's. */
static inline bool shape_fits(recs_t *rs, const rec_shape_t *sh, pk_value_t *const *pairs, size_t n,
                              uint32_t *seen_p, uint32_t *twice_p) {
    if (sh->n == 0 || n != 2 * sh->n)
        return false;
    for (size_t k = 0; k < sh->n; k++)
        if (pairs[2 * k] != sh->keys[k])
            return false;
    for (size_t k = 0; k < sh->n; k++)
        rs->v[sh->ids[k]] = pairs[2 * k + 1];
    *seen_p = sh->seen;
    *twice_p = sh->twice;
    return true;
}

/* Whether the n pairs have the keys of one of rs->shapes, in its order (the last one met
 * first): then their values are in rs->v, as shape_fits has them. Between calls only the slots
 * of rs->shape's keys hold anything: another shape's are set once those are cleared. */
static inline bool same_shape(recs_t *rs, pk_value_t *const *pairs, size_t n, uint32_t *seen_p,
                              uint32_t *twice_p) {
    const rec_shape_t *cur = &rs->shapes[rs->shape];
    if (cur->n != 0 && n == 2 * cur->n) {
        /* The last dict's shape (every entry of a trace has it), compared and written in one
         * pass: a slot written before a key differs is one of its own, cleared below. */
        size_t k = 0;
        for (; k < cur->n && pairs[2 * k] == cur->keys[k]; k++)
            rs->v[cur->ids[k]] = pairs[2 * k + 1];
        if (k == cur->n) {
            *seen_p = cur->seen;
            *twice_p = cur->twice;
            return true;
        }
    }
    bool cleared = false;
    for (size_t j = 0; j < REC_SHAPES; j++) {
        const rec_shape_t *sh = &rs->shapes[j];
        if (j == rs->shape || sh->n == 0 || n != 2 * sh->n || pairs[0] != sh->keys[0])
            continue;
        if (!cleared && cur->n == 0) /* the last dict had no shape: rs->v holds its values */
            memset(rs->v, 0, sizeof(rs->v));
        for (size_t k = 0; !cleared && k < cur->n; k++)
            rs->v[cur->ids[k]] = NULL;
        cleared = true; /* shape_fits writes nothing where it fails */
        if (shape_fits(rs, sh, pairs, n, seen_p, twice_p)) {
            rs->shape = j;
            return true;
        }
    }
    return false; /* read_keys clears rs->v */
}

/* The pairs' values into rs->v by key, in one pass, each key known by its address (key_id); the
 * keys met in *seen_p, those met again in *twice_p. They become rs->shape when every key is a
 * str (one that is not has no slot: it would not be compared). false when a key is no str. */
static bool read_keys(recs_t *rs, pk_value_t *const *pairs, size_t n, uint32_t *seen_p,
                      uint32_t *twice_p) {
    /* The new shape replaces the one made longest ago (same_shape found none with its keys). */
    rs->shape = rs->shape_next;
    rec_shape_t *sh = &rs->shapes[rs->shape];
    memset(rs->v, 0, sizeof(rs->v));
    sh->n = 0;
    sh->plain = false;
    memset(sh->at, REC_ABSENT, sizeof(sh->at));
    uint32_t seen = 0, twice = 0;
    bool all_str = true;
    size_t np = 0;
    for (size_t k = 0; k + 1 < n; k += 2) {
        const pk_value_t *key = pairs[k];
        if (key->type != PK_STR) {
            all_str = false; /* no block's or segment's key; an entry ignores it */
            continue;
        }
        int id = key_id(rs, key);
        twice |= seen & RK_BIT(id);
        seen |= RK_BIT(id);
        rs->v[id] = pairs[k + 1];
        if (np < REC_SHAPE_MAX) {
            sh->keys[np] = key;
            sh->ids[np] = (uint8_t)id;
            sh->at[id] = (uint8_t)np;
        }
        np++;
    }
    if (all_str && n % 2 == 0 && np <= REC_SHAPE_MAX) {
        sh->n = np;
        sh->seen = seen;
        sh->twice = twice;
        const uint32_t plain_keys = RK_BIT(RK_ACTION) | RK_BIT(RK_ADDR) | RK_BIT(RK_SIZE) |
                                    RK_BIT(RK_STREAM) | RK_BIT(RK_TIME) | RK_BIT(RK_FRAMES);
        sh->plain = (seen & plain_keys) == plain_keys &&
                    (seen & (RK_BIT(RK_POOL_ID) | RK_BIT(RK_DFREE))) == 0;
        rs->shape_next = (rs->shape_next + 1) % REC_SHAPES;
    }
    *seen_p = seen;
    *twice_p = twice;
    return all_str;
}

/* The trace entry whose action is the str action, its other values in x (pool_id in x->pid)
 * and mv (user_metadata; NULL where absent), as an event of rs: 1, or -1 when out of memory. */
static inline __attribute__((always_inline)) int take_event(recs_t *rs, const pk_value_t *action,
                                                            const entry_vals_t *x,
                                                            const pk_value_t *mv, uint64_t *id_p) {
    if (rs->n == rs->cap) {
        size_t cap = rs->cap ? rs->cap + rs->cap / 2 : 1024; /* by half: see tr_load_opts */
        tr_event_t *ne = realloc(rs->ev, cap * sizeof(*ne));
        if (ne == NULL)
            return -1;
        rs->ev = ne;
        rs->cap = cap;
    }
    const char *act = action->u.str.s;
    const pk_value_t *pool_id = x->pid;
    tr_action_t a = action_id(rs, action);
    /* user_metadata: absent from older PyTorch's entries, "" on newer ones' (almost always) */
    const char *meta = NULL;
    size_t meta_len = 0;
    /* (a "free" entry keeps its name: load_events counts those) */
    if (pool_id != NULL || a == TR_OTHER || (a == TR_FREE_REQUESTED && action->u.str.len == 4) ||
        (mv != NULL && (meta = meta_text(mv, &meta_len)) != NULL)) {
        if (rs->nside == rs->cap_side &&
            !grow_array((void **)&rs->side, &rs->cap_side, sizeof(*rs->side)))
            return -1;
        /* Only a list or tuple can be a pool's (int, int) pair, and only a container is sure to
         * outlive the call (an int may be the reader's scratch): anything else is kept as the
         * one value that names no pool, as pool_index reads it. */
        static const pk_value_t no_pair = {.type = PK_NONE};
        if (pool_id != NULL && pool_id->type != PK_LIST && pool_id->type != PK_TUPLE)
            pool_id = &no_pair;
        rs->side[rs->nside++] = (rec_side_t){rs->n, act, pool_id, meta, meta_len};
    }
    tr_event_t *ev = &rs->ev[rs->n];
    memset(ev, 0, sizeof(*ev));
    bool have_addr = false, have_size = false, bad_time = false, bad_stream = false;
    /* (a load that hands entries over keeps no stacks, so no times either) */
    fill_event(x, a, ev, NULL, &have_addr, &have_size, &bad_time, &bad_stream);
    ev->flags = (uint8_t)((have_addr ? 0u : RF_NO_ADDR) | (have_size ? 0u : RF_NO_SIZE) |
                          (bad_time ? RF_BAD_TIME : 0u) | (bad_stream ? RF_BAD_STREAM : 0u));
    *id_p = rs->n++;
    return 1;
}

/* Whether the n pairs have the keys of shape sh, in its order (compared only). */
static inline bool keys_are(const rec_shape_t *sh, pk_value_t *const *pairs, size_t n) {
    if (sh->n == 0 || n != 2 * sh->n)
        return false;
    for (size_t k = 0; k < sh->n; k++)
        if (pairs[2 * k] != sh->keys[k])
            return false;
    return true;
}

/* The value of key id among pairs of shape sh (keys_are), NULL where it has none. */
static inline const pk_value_t *at_val(const rec_shape_t *sh, pk_value_t *const *pairs, int id) {
    return sh->at[id] != REC_ABSENT ? pairs[2 * (size_t)sh->at[id] + 1] : NULL;
}

/* pk_parse_records' hook: every dict with an action string is a trace entry (the segments'
 * dicts and the settings have none); a final state's block or segment is taken too
 * (take_block, take_segment). A trace entry with the last dict's keys (almost every one) is
 * read from its pairs in place (the shape's `at`), instead of its values copied to rs->v by key
 * and read back from there (with fill_event's four ints read at once: nhf 3629 -> 3605
 * instructions an entry beyond start-up). Any other dict's keys are read in one
 * pass, each known by its address, or all at once when they are a recent dict's (same_shape). */
static int take_entry(void *arg, pk_value_t *const *pairs, size_t n, uint64_t *id_p) {
    recs_t *rs = arg;
    const rec_shape_t *cur = &rs->shapes[rs->shape];
    /* rs->v is left as it is: only the slots of cur's keys hold anything, as between calls */
    if (cur->plain && keys_are(cur, pairs, n)) {
        const pk_value_t *action = pairs[2 * (size_t)cur->at[RK_ACTION] + 1];
        if (action->type == PK_STR) {
            entry_vals_t x = {pairs[2 * (size_t)cur->at[RK_ADDR] + 1],
                              NULL,
                              pairs[2 * (size_t)cur->at[RK_SIZE] + 1],
                              pairs[2 * (size_t)cur->at[RK_STREAM] + 1],
                              pairs[2 * (size_t)cur->at[RK_TIME] + 1],
                              pairs[2 * (size_t)cur->at[RK_FRAMES] + 1],
                              NULL};
            return take_event(rs, action, &x, at_val(cur, pairs, RK_META), id_p);
        }
    }
    /* A final state's block or segment with the keys of one met lately (a shape with no action
     * key): its values read in place, as a plain entry's are. Through same_shape, the turns of
     * blocks and segments (each changing rs->shape) cleared one shape's slots of rs->v and wrote
     * the other's each time. */
    for (size_t j = 0; j < REC_SHAPES; j++) {
        const rec_shape_t *sh = &rs->shapes[j];
        if (sh->n == 0 || (sh->seen & RK_BIT(RK_ACTION)) != 0 || n != 2 * sh->n ||
            pairs[0] != sh->keys[0] || !keys_are(sh, pairs, n))
            continue;
        const key_vals_t x = {NULL, sh, pairs};
        int took = take_block(rs, &x, sh->seen, (sh->twice & RK_BIT(RK_FRAMES)) ? 2 : 1, id_p);
        return took != 0 ? took : take_segment(rs, &x, sh->seen, id_p);
    }
    uint32_t seen = 0, twice = 0; /* the keys met, and those met again */
    bool all_str =
        same_shape(rs, pairs, n, &seen, &twice) || read_keys(rs, pairs, n, &seen, &twice);
    const pk_value_t *const *v = rs->v;
    const pk_value_t *action = v[RK_ACTION];
    if (action == NULL || action->type != PK_STR) {
        if (!all_str)
            return 0;
        const key_vals_t x = {v, NULL, NULL};
        int took = take_block(rs, &x, seen, (twice & RK_BIT(RK_FRAMES)) ? 2 : 1, id_p);
        return took != 0 ? took : take_segment(rs, &x, seen, id_p);
    }
    entry_vals_t x = {v[RK_ADDR], v[RK_DFREE],  v[RK_SIZE],   v[RK_STREAM],
                      v[RK_TIME], v[RK_FRAMES], v[RK_POOL_ID]};
    return take_event(rs, action, &x, v[RK_META], id_p);
}

/* The side record of handed-over entry id, or NULL. */
static const rec_side_t *side_of(recs_t *rs, uint64_t id) {
    size_t k = rs->next_side;
    if (k >= rs->nside || rs->side[k].id != id) {
        size_t lo = 0, hi = rs->nside; /* the first record with id >= the one asked for */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (rs->side[mid].id < id)
                lo = mid + 1;
            else
                hi = mid;
        }
        k = lo;
        if (k >= rs->nside || rs->side[k].id != id)
            return NULL;
    }
    rs->next_side = k + 1;
    return &rs->side[k];
}

static bool read_event(const pk_value_t *e, recs_t *recs, tr_event_t *ev, tr_event_at_t *at,
                       const char **act_p, bool *have_addr_p, bool *have_size_p, bool *bad_time_p,
                       bool *bad_stream_p, const pk_value_t **pool_id_p, const char **meta_p,
                       size_t *meta_len_p) {
    if (e != NULL && e->type == PK_RECORD && recs != NULL && e->u.u < recs->n) {
        if (ev != &recs->ev[e->u.u]) {
            /* A copy (the entry is in another list too): as the hook read it, without what
             * another device's load and analysis may have set in the entry already (its
             * pool, the TR_F_ flags). */
            *ev = recs->ev[e->u.u];
            ev->flags &= (uint8_t)RF_ALL;
            ev->held_end = 0;
            ev->pool = 0;
        }
        const rec_side_t *r = side_of(recs, e->u.u);
        *act_p = r != NULL               ? r->act
                 : ev->action < TR_OTHER ? action_names[ev->action]
                                         : "?"; /* an unknown action always has a record */
        *pool_id_p = r != NULL ? r->pool_id : NULL;
        *meta_p = r != NULL ? r->meta : NULL;
        *meta_len_p = r != NULL ? r->meta_len : 0;
        *have_addr_p = !(ev->flags & RF_NO_ADDR);
        *have_size_p = !(ev->flags & RF_NO_SIZE);
        *bad_time_p = (ev->flags & RF_BAD_TIME) != 0;
        *bad_stream_p = (ev->flags & RF_BAD_STREAM) != 0;
        ev->flags &= (uint8_t)~RF_ALL;
        return true;
    }
    if (e == NULL || e->type != PK_DICT)
        return false;
    read_pairs(e->u.seq.items, e->u.seq.n, ev, at, act_p, have_addr_p, have_size_p, bad_time_p,
               bad_stream_p, pool_id_p, meta_p, meta_len_p);
    return true;
}

/* Whether the list's items are the next run of handed-over entries, in order: then they are
 * the device's event array already. */
static bool is_next_run(const pk_value_t *list, const recs_t *recs, size_t n) {
    if (recs == NULL || n == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        const pk_value_t *e = list->u.seq.items[i];
        if (e->type != PK_RECORD || e->u.u != recs->taken + i)
            return false;
    }
    return recs->taken + n <= recs->n;
}

static int pool_index(tr_device_t *d, size_t *cap, tr_map_t *known, const pk_value_t *id);

/* with_at: keep each event's time and stack (d->at). */
static bool load_events(const pk_value_t *list, recs_t *recs, bool with_at, int dev, tr_device_t *d,
                        char *err, size_t errlen) {
    size_t n = pk_len(list);
    if (list != NULL && list->type != PK_LIST) {
        snprintf(err, errlen, "device_traces[%d] is not a list", dev);
        return false;
    }
    /* A run of handed-over entries in order (their events in place): an entry with no side
     * record (no action string, pool or metadata to read) and no flag to check, of an action with
     * a block or segment address, needs only its address and size checked below, not read_event
     * (nhf: ~70 instructions an entry). side: the first side record at or after the entry. */
    bool borrowed = is_next_run(list, recs, n);
    size_t side = 0;
    uint64_t first_id = borrowed ? recs->taken : 0;
    if (borrowed) {
        size_t hi = recs->nside;
        while (side < hi) {
            size_t mid = side + (hi - side) / 2;
            if (recs->side[mid].id < first_id)
                side = mid + 1;
            else
                hi = mid;
        }
        d->ev = recs->ev + recs->taken;
        d->ev_borrowed = true;
        recs->taken += n;
    } else {
        d->ev = calloc(n ? n : 1, sizeof(*d->ev));
    }
    if (with_at)
        d->at = calloc(n ? n : 1, sizeof(*d->at));
    if (d->ev == NULL || (with_at && d->at == NULL)) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
    size_t cap_pools = 0, cap_meta = 0;
    tr_map_t known = {0}; /* pool_index's map of d->pools */
    for (size_t i = 0; i < n; i++) {
        tr_event_t *ev = &d->ev[i];
        if (borrowed) {
            while (side < recs->nside && recs->side[side].id < first_id + i)
                side++;
            /* what the checks below pass (an addr 0 is refused for most of these actions) */
            if ((side == recs->nside || recs->side[side].id != first_id + i) &&
                (ev->flags & RF_ALL) == 0 && ev->action <= TR_SEGMENT_UNMAP && ev->addr != 0 &&
                ev->size < TR_SIZE_LIMIT && ev->addr + ev->size >= ev->addr) {
                d->nev++;
                continue;
            }
        }
        const char *act = NULL, *meta = NULL;
        size_t meta_len = 0;
        const pk_value_t *pool_id = NULL;
        bool have_addr = false, have_size = false, bad_time = false, bad_stream = false;
        if (!read_event(list->u.seq.items[i], recs, ev, d->at != NULL ? &d->at[i] : NULL, &act,
                        &have_addr, &have_size, &bad_time, &bad_stream, &pool_id, &meta,
                        &meta_len) ||
            act == NULL) {
            snprintf(err, errlen, "device_traces[%d][%zu]: no 'action' string", dev, i);
            goto fail;
        }
        if (ev->action != TR_OTHER && ev->action != TR_SNAPSHOT && (!have_addr || !have_size)) {
            snprintf(err, errlen, "device_traces[%d][%zu] (%s): missing or bad '%s' or 'size'", dev,
                     i, act, ev->action == TR_OOM ? "device_free" : "addr");
            goto fail;
        }
        if (ev->action != TR_OTHER && ev->action != TR_OOM && ev->size >= TR_SIZE_LIMIT) {
            snprintf(err, errlen,
                     "device_traces[%d][%zu] (%s): size %llu is 1 EB or more, which no PyTorch "
                     "allocation reaches",
                     dev, i, act, (unsigned long long)ev->size);
            goto fail;
        }
        /* An oom's addr is device_free, a byte count; an unknown action is ignored. */
        if (ev->action != TR_OTHER && ev->action != TR_OOM && ev->action != TR_SNAPSHOT &&
            ev->addr + ev->size < ev->addr) {
            snprintf(err, errlen,
                     "device_traces[%d][%zu] (%s): addr 0x%llx + size %llu runs past the end of "
                     "the address space",
                     dev, i, act, (unsigned long long)ev->addr, (unsigned long long)ev->size);
            goto fail;
        }
        if (ev->addr == 0 && (ev->action == TR_ALLOC || ev->action == TR_FREE_REQUESTED ||
                              ev->action == TR_FREE_COMPLETED || ev->action == TR_SEGMENT_ALLOC ||
                              ev->action == TR_SEGMENT_FREE)) {
            snprintf(err, errlen, "device_traces[%d][%zu] (%s): addr 0 is not a block address", dev,
                     i, act);
            goto fail;
        }
        if (bad_stream) {
            snprintf(err, errlen,
                     "device_traces[%d][%zu] (%s): 'stream' is not an integer (a stream handle)",
                     dev, i, act);
            goto fail;
        }
        if (bad_time) {
            snprintf(err, errlen,
                     "device_traces[%d][%zu] (%s): time_us is not a time in [0, 2^53] "
                     "microseconds",
                     dev, i, act);
            goto fail;
        }
        /* Newer snapshots name each entry's MemPool: the pool is known even when none of its
         * segments is left in the final state. */
        if (pool_id != NULL) {
            int pool = pool_index(d, &cap_pools, &known, pool_id);
            if (pool == TR_TOO_MANY_POOLS) {
                snprintf(err, errlen,
                         "device_traces[%d][%zu] (%s): more than %d private pools on device %d",
                         dev, i, act, TR_MAX_POOLS, dev);
                goto fail;
            }
            if (pool < 0) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            ev->pool = (uint16_t)pool;
            ev->flags |= TR_F_POOL_ID;
        }
        if (meta != NULL) {
            if (d->nmeta == cap_meta &&
                !grow_array((void **)&d->meta, &cap_meta, sizeof(*d->meta))) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            d->meta[d->nmeta++] = (tr_meta_t){i, meta, meta_len};
        }
        d->nev++;
        if (ev->action == TR_OOM)
            d->recorded_ooms++;
        if (ev->action == TR_FREE_REQUESTED && strcmp(act, "free") == 0)
            d->free_entries++;
    }
    tr_map_free(&known);
    return true;
fail:
    tr_map_free(&known);
    return false;
}

/* Seeds, the starting state, PyTorch's reserved timeline and the requested peak of one device.
 *
 * The starting state: a segment existed before recording began when the trace frees it before
 * (or without) allocating it, or when it is in the final state and no segment event names its
 * address. Its live blocks then are the seeds inside it; everything else in it was cached free.
 * An expandable segment's pages at the start are its final mapped ranges with the trace's
 * maps taken out and its unmaps put back. */
/* What pk_get gives for each of keys[0..n) of dict (the value of the last pair with that key,
 * NULL where none), in one pass over its pairs instead of a scan (and a strlen) per key: the
 * final state's segments and blocks are read key by key, a few thousand dicts. A pickler
 * memoizes its key strings, so the dicts share one value per key: seen[j] (NULL at first, kept
 * by the caller for one document) is the value keys[j] matched last, found again by address. */
static void get_keys(const pk_value_t *dict, const char *const *keys, const size_t *lens, size_t n,
                     const pk_value_t **seen, const pk_value_t **out) {
    size_t left = n;
    for (size_t j = 0; j < n; j++)
        out[j] = NULL;
    if (dict == NULL || dict->type != PK_DICT)
        return;
    for (size_t i = dict->u.seq.n; i >= 2 && left > 0; i -= 2) {
        const pk_value_t *k = dict->u.seq.items[i - 2];
        size_t j = 0;
        while (j < n && k != seen[j])
            j++;
        if (j == n) {
            if (k->type != PK_STR)
                continue;
            for (j = 0; j < n; j++)
                if (k->u.str.len == lens[j] && memcmp(k->u.str.s, keys[j], lens[j]) == 0)
                    break;
            if (j == n)
                continue;
            seen[j] = k;
        }
        if (out[j] == NULL) {
            out[j] = dict->u.seq.items[i - 1];
            left--;
        }
    }
}

/* A starting block that may have kept a remainder (kept_remainders): its place in d->sblocks,
 * its address, and the addresses [lo, hi] where an alloc while it is live shows that it did. */
typedef struct remainder_ask {
    size_t sblock;
    uint64_t addr, lo, hi;
    size_t first;        /* 1 + index of the first alloc in [lo, hi]; 0 while none */
    uint64_t first_addr; /* that alloc's address */
} remainder_ask_t;

/* One of the asks whose [lo, hi] meets a 1 MiB bucket of addresses (a chain per bucket). */
typedef struct ask_node {
    size_t ask, next; /* next: 1 + the chain's next node, 0 at its end */
} ask_node_t;

/* A block live at the start of the trace that the trace frees, its request rounded, with
 * nothing else known of it up to the next live block or its segment's end: was it larger?
 * PyTorch does not split a remainder of 1 MiB or less off a large-pool block, and it allocates at
 * the start of a free block. So an alloc, while the block is still live, at an address A a little
 * past its rounded end lo (lo < A <= lo + 1 MiB, below that end), with no earlier alloc between lo
 * and A, shows that [lo, A) was the block's: nothing free starts there (it would have merged with
 * the free block at A). For each ask: when the first alloc or free at its address is a free and
 * the trace's first alloc in [lo, hi] comes before it at an address past lo, the block's size
 * becomes that address less its own. One pass over the events, where sorting every alloc by
 * address and mapping every address's first event cost ~1.3M instructions on a trace of 9k
 * entries with 1745 starting blocks (nhf); the asks' windows are at most 1 MiB + 1 long, so each
 * meets at most two 1 MiB buckets, and an alloc looks up its own. false when out of memory. */
static bool kept_remainders(tr_device_t *d, remainder_ask_t *asks, size_t nasks) {
    tr_map_t firstev = {0}; /* an ask's address -> 1 + index of its first alloc or free (0: none) */
    tr_map_t buckets = {0}; /* (address >> 20) + 1 -> 1 + the chain's first node */
    ask_node_t *nodes = NULL;
    size_t nnodes = 0, cap_nodes = 0;
    bool ok = false;
    if (!tr_map_reserve(&firstev, nasks) || !tr_map_reserve(&buckets, 2 * nasks))
        goto out;
    for (size_t q = 0; q < nasks; q++) {
        if (!tr_map_put(&firstev, asks[q].addr, 0))
            goto out;
        for (uint64_t b = asks[q].lo >> 20; b <= asks[q].hi >> 20; b++) {
            if (!GROW(nodes, nnodes, cap_nodes))
                goto out;
            uintptr_t *head = tr_map_find(&buckets, b + 1);
            nodes[nnodes] = (ask_node_t){q, head != NULL ? *head : 0};
            nnodes++;
            if (head != NULL)
                *head = nnodes;
            else if (!tr_map_put(&buckets, b + 1, nnodes))
                goto out;
        }
    }
    /* An ask is answered at the first event at its address: an alloc after it changes nothing.
     * The pass ends when every ask is (the asks' addresses are all named by some event), and an
     * event outside every ask's addresses is passed by two comparisons (most traces ask about a
     * few blocks: nhf one, where the maps' look-ups cost ~45 instructions an entry). */
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t q = 0; q < nasks; q++) {
        lo = asks[q].addr < lo ? asks[q].addr : lo;
        hi = asks[q].hi > hi ? asks[q].hi : hi;
    }
    size_t open = firstev.n;
    for (size_t i = 0; i < d->nev && open > 0; i++) {
        const tr_event_t *e = &d->ev[i];
        if ((e->action != TR_ALLOC && e->action != TR_FREE_REQUESTED) || e->addr < lo ||
            e->addr > hi)
            continue;
        uintptr_t *f = tr_map_find(&firstev, e->addr);
        if (f != NULL && *f == 0) {
            *f = i + 1;
            open--;
        }
        uintptr_t n = 0;
        if (e->action != TR_ALLOC || !tr_map_get(&buckets, (e->addr >> 20) + 1, &n))
            continue;
        for (; n != 0; n = nodes[n - 1].next) {
            remainder_ask_t *a = &asks[nodes[n - 1].ask];
            if (a->first == 0 && e->addr >= a->lo && e->addr <= a->hi) {
                a->first = i + 1;
                a->first_addr = e->addr;
            }
        }
    }
    for (size_t q = 0; q < nasks; q++) {
        const remainder_ask_t *a = &asks[q];
        uintptr_t freed = 0;
        if (tr_map_get(&firstev, a->addr, &freed) && freed != 0 &&
            d->ev[freed - 1].action == TR_FREE_REQUESTED && a->first != 0 && a->first < freed &&
            a->first_addr != a->lo)
            d->sblocks[a->sblock].size = a->first_addr - a->addr;
    }
    ok = true;
out:
    tr_map_free(&firstev);
    tr_map_free(&buckets);
    free(nodes);
    return ok;
}

static int cmp_sfree(const void *a, const void *b) {
    const tr_sfree_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Keep the start segments' free blocks that no event touches: an alloc or free whose block
 * (its size rounded to 512) lies in one or ends or starts right at one (a split or a merge
 * there changed it, or may have), a segment event whose range meets one. One pass over the
 * events, a binary search each (the blocks do not overlap: their ends are in order too). */
static void untouched_sfree(tr_device_t *d) {
    size_t n = d->nsfree;
    if (n == 0)
        return;
    if (n > 1)
        sort_by(d->sfree, n, sizeof(*d->sfree), cmp_sfree);
    for (size_t i = 0; i < d->nev; i++) {
        const tr_event_t *e = &d->ev[i];
        uint64_t lo = e->addr, len;
        if (e->action == TR_ALLOC || e->action == TR_FREE_REQUESTED ||
            e->action == TR_FREE_COMPLETED)
            len = round512(e->size);
        else if (e->action >= TR_SEGMENT_ALLOC && e->action <= TR_SEGMENT_UNMAP)
            len = e->size;
        else
            continue;
        uint64_t hi = lo + len < lo ? UINT64_MAX : lo + len;
        size_t a = 0, b = n; /* the first block whose end reaches lo */
        while (a < b) {
            size_t m = a + (b - a) / 2;
            if (d->sfree[m].addr + d->sfree[m].size < lo)
                a = m + 1;
            else
                b = m;
        }
        for (; a < n && d->sfree[a].addr <= hi; a++)
            d->sfree[a].size = 0; /* touched */
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (d->sfree[i].size != 0)
            d->sfree[k++] = d->sfree[i];
    d->nsfree = k;
}

const tr_sfree_t *tr_sfree_at(const tr_device_t *d, uint64_t addr) {
    size_t a = 0, b = d->nsfree; /* the first block at or above addr (sfree is by address) */
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (d->sfree[m].addr < addr)
            a = m + 1;
        else
            b = m;
    }
    return a < d->nsfree && d->sfree[a].addr == addr ? &d->sfree[a] : NULL;
}

/* Whether the segment frees ev[i..j) can be releases inside the malloc whose segment allocation
 * ev[j] is (the run is then no empty_cache). release_available_cached_blocks, after a failed
 * cudaMalloc, frees on the request's stream one segment, or else segments of at least
 * max_split_size and under the request, largest first (RIM_SPLIT). Garbage collection frees
 * whole segments of the default pool's large pool (more than 2 MiB: a small-pool segment is 2
 * MiB, a large one 20 MiB or at least 10 MiB), and only under a memory fraction (PyTorch's
 * garbage_collect_cached_blocks runs only when set_fraction; sympool's too): a threshold
 * recorded without a fraction collected nothing, and a run read as its collection was not
 * replayed at all (RIM_GC: whether it was one is told at replay, where the threshold's bytes are
 * known). Neither frees an expandable segment's pages (CUDACachingAllocator.cpp,
 * garbage_collect_cached_blocks, release_available_cached_blocks). The user's empty_cache frees
 * every free segment, and the next malloc often allocates one (RIM_NO). */
typedef enum { RIM_NO, RIM_SPLIT, RIM_GC } rim_t;

/* Whether ev[i..j) are segment_unmaps of the default pool only (recycle unmaps no other's). */
static bool default_unmaps_only(const tr_event_t *ev, size_t i, size_t j) {
    for (size_t k = i; k < j; k++)
        if (ev[k].action != TR_SEGMENT_UNMAP || ev[k].pool != 0)
            return false;
    return true;
}

/* Whether the recording's own rules (sympool's snapshots) had SYMPOOL_EXPANDABLE_RECYCLE on:
 * then a malloc that grows an expandable segment of the default pool first unmaps free pages
 * of its expandable segments (pool/expandable.c, recycle), segment_unmaps right before its
 * segment_map that no empty_cache made. */
static bool rules_recycle(const tr_settings_t *set) {
    const char *p = strstr(set->rules, "SYMPOOL_EXPANDABLE_RECYCLE=");
    if (!set->expandable || p == NULL)
        return false;
    p += strlen("SYMPOOL_EXPANDABLE_RECYCLE=");
    size_t n = strcspn(p, ",");
    return !((n == 3 && strncmp(p, "off", 3) == 0) || (n == 1 && *p == '0') ||
             (n == 5 && strncasecmp(p, "false", 5) == 0) || (n == 2 && strncmp(p, "no", 2) == 0));
}
static rim_t released_in_malloc(const tr_settings_t *set, const tr_event_t *ev, size_t i,
                                size_t j) {
    bool gc = set->gc && set->fraction > 0 && set->fraction < 1, split = set->mss != 0;
    for (size_t k = i; k < j && (gc || split); k++) {
        const tr_event_t *f = &ev[k];
        if (f->action != TR_SEGMENT_FREE)
            return RIM_NO;
        gc = gc && f->size > ((uint64_t)2 << 20) && f->pool == 0;
        split = split && f->size >= set->mss && f->stream == ev[j].stream &&
                (j - i == 1 || (f->size < ev[j].size && (k == i || f->size <= ev[k - 1].size)));
    }
    return split ? RIM_SPLIT : gc ? RIM_GC : RIM_NO;
}

/* The alloc and segment_alloc entries a recording left out (skip_actions=["alloc"] or
 * ["segment_alloc"]), where the trace shows them missing (tr_device_t.missing_*): a block freed
 * again with no alloc since its last free, or freed first while it lies in a segment a
 * segment_alloc of the trace made (it cannot have been live before the first entry); a fixed
 * segment freed again with no segment_alloc since its last segment_free. Both were read as
 * blocks and segments live before the first entry, and a replay said only "an inconsistent
 * trace". An expandable segment's map and unmap entries need not name the same addresses: not
 * counted. false on OOM. */
typedef struct seg_span {
    uint64_t addr, end; /* a segment the trace made, live: [addr, end) */
} seg_span_t;

static size_t span_at(const seg_span_t *s, size_t n, uint64_t addr) {
    size_t a = 0, b = n; /* the first span whose end is past addr */
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (s[m].end <= addr)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

static bool count_missing(tr_device_t *d) {
    enum { LIVE = 1, REQUESTED, FREED };
    tr_map_t blocks = {0}, segs = {0}; /* address -> LIVE, REQUESTED or FREED */
    seg_span_t *made = NULL;           /* the live segments the trace made, by address */
    size_t nmade = 0, cap_made = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < d->nev; i++) {
        const tr_event_t *e = &d->ev[i];
        uintptr_t st = 0;
        if (e->addr == 0)
            continue; /* the map takes no key 0 */
        switch (e->action) {
        case TR_ALLOC:
            ok = tr_map_put(&blocks, e->addr, LIVE);
            break;
        case TR_FREE_REQUESTED:
        case TR_FREE_COMPLETED: {
            bool known = tr_map_get(&blocks, e->addr, &st);
            size_t k = known ? 0 : span_at(made, nmade, e->addr);
            if ((known && (st == FREED || (st == REQUESTED && e->action == TR_FREE_REQUESTED))) ||
                (!known && k < nmade && made[k].addr <= e->addr)) {
                d->missing_allocs++;
                d->missing_alloc_bytes += e->size;
            }
            ok = tr_map_put(&blocks, e->addr,
                            e->action == TR_FREE_REQUESTED && !(e->flags & TR_F_COMPLETION)
                                ? REQUESTED
                                : FREED);
            break;
        }
        case TR_SEGMENT_ALLOC: {
            ok = tr_map_put(&segs, e->addr, LIVE);
            size_t k = span_at(made, nmade, e->addr);
            if (ok && (k == nmade || made[k].addr != e->addr) && e->size > 0 &&
                e->addr + e->size > e->addr) {
                ok = GROW(made, nmade, cap_made);
                if (ok) {
                    memmove(made + k + 1, made + k, (nmade - k) * sizeof(*made));
                    made[k] = (seg_span_t){e->addr, e->addr + e->size};
                    nmade++;
                }
            }
            break;
        }
        case TR_SEGMENT_FREE: {
            if (tr_map_get(&segs, e->addr, &st) && st == FREED) {
                d->missing_seg_allocs++;
                d->missing_seg_bytes += e->size;
            }
            ok = tr_map_put(&segs, e->addr, FREED);
            size_t k = span_at(made, nmade, e->addr);
            if (ok && k < nmade && made[k].addr == e->addr) {
                memmove(made + k, made + k + 1, (nmade - k - 1) * sizeof(*made));
                nmade--;
            }
            break;
        }
        default:
            break;
        }
    }
    tr_map_free(&blocks);
    tr_map_free(&segs);
    free(made);
    return ok;
}

/* One device's analysis. The forward pass keeps one map of the addresses the events name (an
 * address's value: 1 while it is live), and an array already in order is not sorted again. */
static bool analyse(const pk_value_t *segments, const recs_t *recs, const tr_settings_t *set,
                    bool want_sfree, int dev, tr_device_t *d, char *err, size_t errlen) {
    tr_map_t live = {0};     /* the backward pass: addresses whose free completes later */
    tr_map_t touched = {0};  /* addresses any alloc/free event names: 1 while live, else 0 */
    tr_map_t segfirst = {0}; /* segment address -> 1 first allocated, 2 first freed in the trace */
    tr_map_t streams = {0};
    xrange_t *xr = NULL; /* expandable segments' mapped ranges */
    size_t nxr = 0, cap_xr = 0;
    /* d->pools may hold the pools the entries named (their array holds at least npools) */
    size_t cap = 0, cap_start = 0, cap_pools = d->npools, cap_sb = 0, cap_sfree = 0;
    pool_range_t *ranges = NULL;
    size_t nranges = 0, cap_ranges = 0;
    span_t *spans = NULL; /* the device's final segments */
    size_t nspans = 0, cap_spans = 0;
    tr_map_t known = {0};         /* pool_index's map of d->pools */
    tr_map_t held = {0};          /* blocks the trace freed that the end state shows pending */
    remainder_ask_t *asks = NULL; /* the starting blocks kept_remainders asks about */
    size_t nasks = 0, cap_asks = 0;
    bool ok = false;
    if (!tr_map_put(&streams, ~(uint64_t)0, 1) || /* the default stream, as a non-zero key */
        !pools_known(d, &known))
        goto oom;
    /* Backwards: a free_requested whose free_completed comes later in the trace (before the
     * address is allocated again). A trace without free_completed entries (older or hand-made)
     * completes every free at once. */
    for (size_t i = d->nev; i-- > 0;) {
        tr_event_t *e = &d->ev[i];
        if (e->action == TR_FREE_COMPLETED && i > 0 && d->ev[i - 1].action == TR_FREE_REQUESTED &&
            d->ev[i - 1].addr == e->addr) {
            /* A free completed at once (most are): what putting the address and taking it
             * out again leaves, the address taken out (the free_requested is not deferred:
             * the forward pass clears the flag of one its free_completed follows). */
            if (live.n > 0)
                (void)tr_map_del(&live, e->addr, NULL);
            i--;
        } else if (e->action == TR_FREE_COMPLETED) {
            if (!tr_map_put(&live, e->addr, (uintptr_t)i + 1)) /* where its completion is */
                goto oom;
        } else if (e->action == TR_ALLOC) {
            (void)tr_map_del(&live, e->addr, NULL);
        } else if (e->action == TR_FREE_REQUESTED) {
            uintptr_t at = 0;
            if (tr_map_del(&live, e->addr, &at)) {
                e->flags |= TR_F_DEFERRED;
                d->ev[at - 1].held_end = 1;
            }
        }
    }
    tr_map_free(&live);
    /* Whether the trace records requests (PyTorch's do), or allocs and completions only (another
     * tool's, which ends each block at its free_completed). A trace of neither is a few entries
     * PyTorch's ring kept. */
    bool requests = false, allocs = false;
    for (size_t i = 0; i < d->nev && !requests; i++) {
        requests = d->ev[i].action == TR_FREE_REQUESTED;
        allocs = allocs || d->ev[i].action == TR_ALLOC;
    }
    bool completions_only = !requests && allocs;
    uint64_t last_stream = 0; /* the stream the last event put (0: none yet) */
    for (size_t i = 0; i < d->nev; i++) {
        tr_event_t *e = &d->ev[i];
        /* Consecutive events are mostly on one stream: it is in the set already. */
        uint64_t sk = e->stream ? e->stream : ~(uint64_t)0;
        if (sk != last_stream && !tr_map_put(&streams, sk, 1))
            goto oom;
        last_stream = sk;
        switch (e->action) {
        case TR_ALLOC:
            if (!tr_map_put(&touched, e->addr, 1))
                goto oom;
            break;
        case TR_FREE_REQUESTED: {
            uintptr_t *v = tr_map_find(&touched, e->addr);
            if (v == NULL || *v == 0) {
                if (d->seeded_bytes + e->size >= (uint64_t)TR_SUM_LIMIT)
                    goto too_much;
                if (!add_seed(d, &cap, e->addr, e->size, 0, e->stream,
                              d->at != NULL ? d->at[i].frames : NULL, e->pool, false))
                    goto oom;
            }
            if (v != NULL)
                *v = 0; /* no longer live; add_seed moved no slot */
            else if (!tr_map_put(&touched, e->addr, 0))
                goto oom;
            /* PyTorch completes a free at once (the next entry) unless other streams used the
             * block: then events hold it until a later malloc or empty_cache sees them done,
             * and its free_completed comes later (the backward pass below marked those). */
            if (i + 1 < d->nev &&
                !(d->ev[i + 1].action == TR_FREE_COMPLETED && d->ev[i + 1].addr == e->addr) &&
                (e->flags & TR_F_DEFERRED))
                d->deferred_frees++;
            else
                e->flags &= (uint8_t)~TR_F_DEFERRED;
            break;
        }
        case TR_FREE_COMPLETED: {
            /* PyTorch records a free_requested before every free_completed; a trace that records
             * the frees as completions only (written by other tools: MemoryViz's timeline ends a
             * block at its free_completed) ends a block an alloc of the trace made, still live,
             * with one. That is its free, or the block would stay live to the end. A completion
             * of a block no entry before it names was live before recording began: in a trace
             * that records requests, past the first entry, its free was requested before the
             * window and waited on other streams' work until here, so it starts pending and
             * this completes it (as the first entry it is most likely the completion of a free
             * whose request the ring cut off, and is left as it is, as in a trace of neither
             * requests nor allocs); in a trace of completions only, this is its free. */
            uintptr_t *v = tr_map_find(&touched, e->addr);
            if (v == NULL && e->addr != 0 && ((requests && i > 0) || completions_only)) {
                if (d->seeded_bytes + e->size >= (uint64_t)TR_SUM_LIMIT)
                    goto too_much;
                if (!add_seed(d, &cap, e->addr, e->size, 0, e->stream,
                              d->at != NULL ? d->at[i].frames : NULL, e->pool, requests) ||
                    !tr_map_put(&touched, e->addr, requests ? 0 : 1))
                    goto oom;
                if (requests) /* it started pending: this ends its held free */
                    e->held_end = 1;
                v = tr_map_find(&touched, e->addr);
            }
            if (v != NULL && *v == 1) {
                *v = 0;
                e->action = TR_FREE_REQUESTED;
                e->flags = (uint8_t)((e->flags | TR_F_COMPLETION) & ~TR_F_DEFERRED);
                e->held_end = 0;
                d->completion_frees++;
            }
            break;
        }
        case TR_SEGMENT_ALLOC:
        case TR_SEGMENT_FREE:
            if (!tr_map_get(&segfirst, e->addr, NULL) &&
                !tr_map_put(&segfirst, e->addr, e->action == TR_SEGMENT_ALLOC ? 1 : 2))
                goto oom;
            break;
        default:
            break;
        }
    }
    size_t event_seeds = d->nseeds; /* the seeds the events made; the final state's follow */
    /* the segments' list bounds the device's (all devices' segments are in it) */
    if (!reserve_array((void **)&spans, &cap_spans, pk_len(segments), sizeof(*spans)) ||
        !reserve_array((void **)&d->start, &cap_start, pk_len(segments), sizeof(*d->start)))
        goto oom;
    const pk_value_t *seg_seen[9] = {0}, *blk_seen[4] = {0};
    for (size_t s = 0; s < pk_len(segments); s++) {
        const pk_value_t *seg = pk_at(segments, s);
        int64_t sdev = 0, total = 0, stream = 0;
        uint64_t addr = 0, ustream = 0;
        bool have_total, have_addr, expandable, bad_stream, bad_blocks, bad_exp, bad_type;
        const pk_value_t *pool_id, *blocks, *sframes;
        const pk_value_t *stype;
        const rec_seg_t *rg = seg_of(recs, seg);
        if (entry_record(recs, seg)) {
            whole_needed("a segment", err, errlen);
            goto out;
        }
        if (rg != NULL) {
            sdev = rg->dev;
            total = rg->total;
            addr = rg->addr;
            ustream = rg->stream;
            have_total = (rg->flags & RS_TOTAL) != 0;
            have_addr = (rg->flags & RS_ADDR) != 0;
            expandable = (rg->flags & RS_EXPANDABLE) != 0;
            bad_stream = (rg->flags & RS_BAD_STREAM) != 0;
            bad_blocks = (rg->flags & RS_BAD_BLOCKS) != 0;
            bad_exp = (rg->flags & RS_BAD_EXPANDABLE) != 0;
            bad_type = (rg->flags & RS_BAD_TYPE) != 0;
            pool_id = rg->pool;
            blocks = rg->blocks;
            stype = rg->type;
            /* Entries are handed over only while stacks are skipped (tr_load_opts): none. */
            sframes = NULL;
        } else {
            static const char *const skeys[] = {"device",       "total_size",      "address",
                                                "stream",       "segment_pool_id", "is_expandable",
                                                "segment_type", "blocks",          "frames"};
            static const size_t slens[] = {6, 10, 7, 6, 15, 13, 12, 6, 6};
            const pk_value_t *sv[9];
            get_keys(seg, skeys, slens, 9, seg_seen, sv);
            (void)pk_int(sv[0], &sdev);
            have_total = pk_int(sv[1], &total);
            have_addr = pk_uint(sv[2], &addr);
            bad_stream = false;
            if (!pk_uint(sv[3], &ustream)) {
                if (pk_int(sv[3], &stream))
                    ustream = (uint64_t)stream;
                else
                    bad_stream = sv[3] != NULL;
            }
            /* Blocks that are no container (a dict's are refused at its first block) */
            bad_blocks = sv[7] != NULL && sv[7]->type != PK_LIST && sv[7]->type != PK_TUPLE &&
                         sv[7]->type != PK_DICT && sv[7]->type != PK_RECORD;
            expandable = sv[5] != NULL && sv[5]->type == PK_BOOL && sv[5]->u.b;
            bad_exp = sv[5] != NULL && sv[5]->type != PK_BOOL;
            bad_type = seg_type_bad(sv[6]);
            pool_id = sv[4];
            blocks = sv[7];
            stype = sv[6] != NULL && sv[6]->type == PK_STR ? sv[6] : NULL;
            sframes = sv[8] != NULL && sv[8]->type == PK_LIST ? sv[8] : NULL;
        }
        if (sdev != dev)
            continue;
        if (!have_total || total < 0 || !have_addr) {
            snprintf(err, errlen, "segments[%zu]: missing or bad 'address' or 'total_size'", s);
            goto out;
        }
        /* A stream that is no integer names none, and blocks that are no list hold none: read
         * as the default stream and no blocks, they were misread. */
        if (bad_stream || bad_blocks) {
            snprintf(err, errlen, "segments[%zu]: %s", s,
                     bad_stream ? "'stream' is not an integer (a stream handle)"
                                : "'blocks' is not a list");
            goto out;
        }
        /* Neither is ever of another kind in PyTorch's snapshots: a "True" read as false made an
         * expandable segment a fixed one, and a type that is no "small" a large segment. */
        if (bad_exp || bad_type) {
            snprintf(err, errlen, "segments[%zu]: %s", s,
                     bad_exp ? "'is_expandable' is not a bool"
                             : "'segment_type' is neither \"small\" nor \"large\"");
            goto out;
        }
        if (!tr_map_put(&streams, ustream ? ustream : ~(uint64_t)0, 1))
            goto oom;
        if ((uint64_t)total >= TR_SIZE_LIMIT ||
            d->final_reserved + (uint64_t)total >= (uint64_t)TR_SUM_LIMIT) {
            snprintf(err, errlen,
                     "segments[%zu]: total_size %lld is 1 EB or more, or the segments together "
                     "reach 4 EiB",
                     s, (long long)total);
            goto out;
        }
        if (addr + (uint64_t)total < addr) {
            snprintf(err, errlen,
                     "segments[%zu]: address 0x%llx + total_size %lld runs past the end of the "
                     "address space",
                     s, (unsigned long long)addr, (long long)total);
            goto out;
        }
        if (total > 0) {
            if (!GROW(spans, nspans, cap_spans))
                goto oom;
            spans[nspans++] = (span_t){addr, addr + (uint64_t)total, s};
        }
        int pool = pool_index(d, &cap_pools, &known, pool_id);
        if (pool == TR_TOO_MANY_POOLS) {
            snprintf(err, errlen, "segments[%zu]: more than %d private pools on device %d", s,
                     TR_MAX_POOLS, dev);
            goto out;
        }
        if (pool < 0)
            goto oom;
        if (pool > 0) {
            if (!GROW(ranges, nranges, cap_ranges))
                goto oom;
            ranges[nranges++] = (pool_range_t){addr, addr + (uint64_t)total, (uint16_t)pool};
        }
        bool is_small = stype != NULL ? pk_str_is(stype, "small") : total == (2 << 20);
        /* An expandable segment's pages at the start are worked out from the trace below. */
        bool in_start = !expandable && !tr_map_get(&segfirst, addr, NULL);
        if (expandable &&
            !xr_add(&xr, &nxr, &cap_xr,
                    (xrange_t){addr, addr + (uint64_t)total, ustream, (uint16_t)pool, is_small}))
            goto oom;
        if (in_start) {
            if (!GROW(d->start, d->nstart, cap_start))
                goto oom;
            d->start[d->nstart++] = (tr_sseg_t){
                addr, (uint64_t)total, ustream, (uint16_t)pool, is_small, 0, 0, sframes};
        }
        d->final_reserved += (uint64_t)total;
        d->final_segments++;
        /* Block addresses are the segment's plus the sizes before them (MemoryViz does the
         * same; a missing "address" is therefore fine). */
        uint64_t baddr = (uint64_t)addr;
        if (entry_record(recs, blocks)) {
            whole_needed("a segment's blocks", err, errlen);
            goto out;
        }
        if (dict_record(recs, blocks)) {
            /* A block's or a segment's dict where the list belongs: as a dict, its first item
             * is no block. */
            snprintf(err, errlen, "segments[%zu].blocks[0]: missing or bad 'size' or 'state'", s);
            goto out;
        }
        for (size_t b = 0; b < pk_len(blocks); b++) {
            const pk_value_t *blk = pk_at(blocks, b);
            int64_t bsize = 0, req = -1;
            bool have_size, have_req, have_state, active, inactive, pending;
            const pk_value_t *frames;
            const rec_block_t *rb = block_of(recs, blk);
            if (entry_record(recs, blk)) {
                whole_needed("a block", err, errlen);
                goto out;
            }
            if (rb != NULL) {
                bsize = rb->size;
                req = (rb->flags & RB_REQ) ? rb->req : -1;
                have_size = (rb->flags & RB_SIZE) != 0;
                have_req = (rb->flags & RB_REQ) != 0;
                have_state = (rb->flags & RB_STATE) != 0;
                active = (rb->flags & RB_ACTIVE) != 0;
                inactive = (rb->flags & RB_INACTIVE) != 0;
                pending = (rb->flags & RB_PENDING) != 0;
                frames = rb->frames;
            } else {
                static const char *const bkeys[] = {"state", "size", "requested_size", "frames"};
                static const size_t blens[] = {5, 4, 14, 6};
                const pk_value_t *bv[4];
                get_keys(blk, bkeys, blens, 4, blk_seen, bv);
                have_size = pk_int(bv[1], &bsize);
                have_req = pk_int(bv[2], &req);
                have_state = pk_str(bv[0]) != NULL;
                active = pk_str_is(bv[0], "active_allocated");
                inactive = pk_str_is(bv[0], "inactive");
                pending = pk_str_is(bv[0], "active_pending_free");
                frames = bv[3] != NULL && bv[3]->type == PK_LIST ? bv[3] : NULL;
            }
            if (!have_size || bsize < 0 || !have_state) {
                snprintf(err, errlen, "segments[%zu].blocks[%zu]: missing or bad 'size' or 'state'",
                         s, b);
                goto out;
            }
            /* PyTorch writes these three states only (torch/csrc/cuda/memory_snapshot.cpp,
             * _memory_snapshot_pickled; Module.cpp, the Python snapshot); another was taken as
             * live for the replay's starting state and as not allocated for the recorded run's. */
            if (!active && !inactive && !pending) {
                snprintf(err, errlen,
                         "segments[%zu].blocks[%zu]: 'state' is none of active_allocated, "
                         "active_pending_free, inactive",
                         s, b);
                goto out;
            }
            /* The blocks before it end inside the segment (checked for each), so the offset
             * is at most total. */
            if ((uint64_t)bsize > (uint64_t)total - (baddr - addr)) {
                snprintf(err, errlen,
                         "segments[%zu].blocks[%zu]: size %lld at offset %llu runs past its "
                         "segment's total_size %lld",
                         s, b, (long long)bsize, (unsigned long long)(baddr - addr),
                         (long long)total);
                goto out;
            }
            /* A free block of a start segment: kept while no event touches it (below). */
            if (want_sfree && inactive && in_start && have_req && req >= 0 && bsize > 0) {
                if (!GROW(d->sfree, d->nsfree, cap_sfree))
                    goto oom;
                d->sfree[d->nsfree++] = (tr_sfree_t){baddr, (uint64_t)bsize, (uint64_t)req};
            }
            if (!have_req || req <= 0 || req > bsize)
                req = bsize;
            if (active)
                d->final_allocated += (uint64_t)bsize;
            uintptr_t live_now = 1;
            if (pending && tr_map_get(&touched, baddr, &live_now) && live_now == 0 &&
                !tr_map_put(&held, baddr, 1))
                goto oom;
            if (!inactive && !tr_map_get(&touched, baddr, NULL)) {
                if (d->seeded_bytes + (uint64_t)req >= (uint64_t)TR_SUM_LIMIT)
                    goto too_much;
                if (!add_seed(d, &cap, baddr, (uint64_t)req, (uint64_t)bsize, ustream, frames,
                              (uint16_t)pool, pending))
                    goto oom;
            }
            baddr += (uint64_t)bsize;
        }
    }
    /* A block the trace freed and the end state shows "active_pending_free": its free waits for
     * other streams' work at the end, so its last free_requested is held, though no
     * free_completed follows (the trace ended first; replay held it for nothing, freed it at
     * once and let the next request reuse it, a segment too few). */
    for (size_t i = d->nev; held.n > 0 && i-- > 0;) {
        tr_event_t *e = &d->ev[i];
        bool names = e->action == TR_ALLOC || e->action == TR_FREE_REQUESTED ||
                     e->action == TR_FREE_COMPLETED;
        if (!names || !tr_map_del(&held, e->addr, NULL))
            continue; /* only the last entry naming the block tells */
        if (e->action == TR_FREE_REQUESTED && !(e->flags & (TR_F_DEFERRED | TR_F_COMPLETION))) {
            e->flags |= TR_F_DEFERRED;
            d->deferred_frees++;
        }
    }
    /* One device's segments never share an address: two that do would be counted twice and
     * rebuilt at one address. */
    if (nspans > 1)
        sort_by(spans, nspans, sizeof(*spans), cmp_span);
    for (size_t i = 1; i < nspans; i++) {
        if (spans[i].addr < spans[i - 1].end) {
            const span_t *hi = spans[i].index > spans[i - 1].index ? &spans[i] : &spans[i - 1];
            const span_t *lo = hi == &spans[i] ? &spans[i - 1] : &spans[i];
            snprintf(err, errlen, "segments[%zu] (address 0x%llx) overlaps segments[%zu]",
                     hi->index, (unsigned long long)hi->addr, lo->index);
            goto out;
        }
    }
    if (nranges > 1)
        sort_by(ranges, nranges, sizeof(*ranges), cmp_range);
    /* An entry without a pool_id goes to the private pool whose final segment holds its address,
     * unless the trace names pools: sympool's snapshots write "pool_id" on every entry of a
     * private pool and leave it out on the default pool's (pool/snapshot.c), so there an entry
     * without one is the default pool's. By address, a default-pool allocation where a private
     * pool's segment came after an empty_cache was replayed in that pool. */
    size_t nroute = names_pools(d) ? 0 : nranges;
    /* Expandable segments at the start: the final state's mapped ranges, walked back through
     * the trace (a range mapped in it was not mapped before; one unmapped in it was). Each
     * mapped range at the start is rebuilt like any other start segment. */
    for (size_t i = d->nev; i-- > 0;) {
        const tr_event_t *e = &d->ev[i];
        if (e->size == 0)
            continue; /* no range (load_events refused one past the end of the address space) */
        if (e->action == TR_SEGMENT_MAP) {
            if (!xr_remove(&xr, &nxr, &cap_xr, e->addr, e->addr + e->size))
                goto oom;
        } else if (e->action == TR_SEGMENT_UNMAP) {
            uint16_t pool = (e->flags & TR_F_POOL_ID) ? e->pool : pool_at(ranges, nroute, e->addr);
            if (!xr_add(&xr, &nxr, &cap_xr,
                        (xrange_t){e->addr, e->addr + e->size, e->stream, pool,
                                   xr_small(xr, nxr, e->addr, e->stream, e->size)}))
                goto oom;
        }
    }
    for (size_t i = 0; i < nxr; i++) {
        if (!GROW(d->start, d->nstart, cap_start))
            goto oom;
        d->start[d->nstart++] = (tr_sseg_t){
            xr[i].addr, xr[i].end - xr[i].addr, xr[i].stream, xr[i].pool, xr[i].small, 0, 0, NULL};
    }
    /* Segments the trace frees before allocating them existed at the start too. */
    for (size_t i = 0; i < d->nev; i++) {
        const tr_event_t *e = &d->ev[i];
        uintptr_t first = 0;
        if (e->action != TR_SEGMENT_FREE || !tr_map_get(&segfirst, e->addr, &first) || first != 2)
            continue;
        (void)tr_map_put(&segfirst, e->addr, 3); /* only its first free counts */
        if (!GROW(d->start, d->nstart, cap_start))
            goto oom;
        d->start[d->nstart++] =
            (tr_sseg_t){e->addr,
                        e->size,
                        e->stream,
                        (e->flags & TR_F_POOL_ID) ? e->pool : pool_at(ranges, nroute, e->addr),
                        e->size == (2 << 20),
                        0,
                        0,
                        NULL};
    }
    if (d->nstart > 1)
        sort_by(d->start, d->nstart, sizeof(*d->start), cmp_sseg);
    untouched_sfree(d);
    if (d->nseeds > 1)
        sort_seeds(d->seeds, d->nseeds, event_seeds);
    /* Seeds inside a start segment become its blocks too. A large-pool seed that the final
     * state does not show may have kept a remainder (kept_remainder): the first event at its
     * address is its free, when it tells. */
    /* each seed is at most one starting block and one ask */
    if (!reserve_array((void **)&d->sblocks, &cap_sb, d->nseeds, sizeof(*d->sblocks)) ||
        !reserve_array((void **)&asks, &cap_asks, d->nseeds, sizeof(*asks)))
        goto oom;
    for (size_t i = 0, k = 0; i < d->nseeds; i++) {
        tr_seed_t *sd = &d->seeds[i];
        while (k < d->nstart && d->start[k].addr + d->start[k].size <= sd->addr)
            k++;
        if (k < d->nstart && d->start[k].addr <= sd->addr) {
            tr_sseg_t *sg = &d->start[k];
            uint64_t end = sg->addr + sg->size;
            if (i + 1 < d->nseeds && d->seeds[i + 1].addr < end)
                end = d->seeds[i + 1].addr;
            uint64_t bs = sd->bsize ? sd->bsize : round512(sd->size);
            if (bs > end - sd->addr)
                bs = end - sd->addr;
            /* A large-pool block whose rounded request ends 1 MiB or less before the next live
             * block (or its segment's end) kept that piece: every large-pool block, a free one
             * too, is larger than 1 MiB (PyTorch splits off only a larger remainder), so nothing
             * else lies there. */
            if (!sd->bsize && !sg->is_small && !set->expandable && bs > ((uint64_t)1 << 20) &&
                end - (sd->addr + bs) <= ((uint64_t)1 << 20))
                bs = end - sd->addr;
            /* A large-pool block that may have kept more, up to 1 MiB past its rounded end
             * (below end), if an alloc or free names its address (touched holds every address
             * one names, and not 0: the final state's own seeds are not asked about). */
            if (!set->expandable && !sd->bsize && !sg->is_small && bs > ((uint64_t)1 << 20) &&
                sd->addr + bs < end && tr_map_get(&touched, sd->addr, NULL)) {
                if (!GROW(asks, nasks, cap_asks))
                    goto oom;
                uint64_t lo = sd->addr + bs, hi = end - 1;
                if (hi - lo > ((uint64_t)1 << 20))
                    hi = lo + ((uint64_t)1 << 20);
                asks[nasks++] = (remainder_ask_t){d->nsblocks, sd->addr, lo, hi, 0, 0};
            }
            sd->in_start = true;
            if (bs == 0)
                continue;
            if (!GROW(d->sblocks, d->nsblocks, cap_sb))
                goto oom;
            if (sg->n == 0)
                sg->first = d->nsblocks;
            sg->n++;
            d->sblocks[d->nsblocks++] = (tr_sblock_t){sd->addr, bs, sd->size, sd->frames};
        } else {
            d->nloose++;
            d->loose_bytes += sd->size;
        }
    }
    if (nasks > 0 && !kept_remainders(d, asks, nasks))
        goto oom;
    for (size_t i = 0; i < d->nstart; i++)
        d->start_bytes += d->start[i].size;
    /* Runs of segment frees: the user's empty_cache, unless the allocator released inside a
     * malloc (garbage collection, oversize blocks), which then allocates at once. A release
     * for an OOM retry empties the cache too: replaying it as empty_cache is what happened. */
    /* nheld: frees held for other streams' work at this point (deferred requests, and blocks
     * pending before the first entry, whose completions have not come yet). An empty_cache
     * waits for every one of them first (synchronize_and_free_events): a run that some held
     * free outlasts was no empty_cache. */
    int64_t nheld = 0;
    for (size_t k = 0; k < d->nseeds; k++)
        nheld += d->seeds[k].pending;
    bool recycles = rules_recycle(set);
    for (size_t i = 0; i < d->nev;) {
        tr_event_t *e = &d->ev[i];
        if (e->action != TR_SEGMENT_FREE && e->action != TR_SEGMENT_UNMAP) {
            if (e->action == TR_ALLOC && nroute > 0 && !(e->flags & TR_F_POOL_ID))
                e->pool = pool_at(ranges, nroute, e->addr);
            if (e->action == TR_FREE_REQUESTED && (e->flags & TR_F_DEFERRED))
                nheld++;
            else if (e->action == TR_FREE_COMPLETED && e->held_end)
                nheld--;
            i++;
            continue;
        }
        size_t j = i;
        while (j < d->nev &&
               (d->ev[j].action == TR_SEGMENT_FREE || d->ev[j].action == TR_SEGMENT_UNMAP)) {
            if (nroute > 0 && !(d->ev[j].flags & TR_F_POOL_ID))
                d->ev[j].pool = pool_at(ranges, nroute, d->ev[j].addr);
            j++;
        }
        rim_t internal =
            j < d->nev && (d->ev[j].action == TR_SEGMENT_ALLOC || d->ev[j].action == TR_SEGMENT_MAP)
                ? released_in_malloc(set, d->ev, i, j)
                : RIM_NO;
        /* Under sympool's SYMPOOL_EXPANDABLE_RECYCLE, unmaps right before a growth that a held
         * free outlasts are the growing malloc's own (an empty_cache would have waited for that
         * free): read as the user's empty_cache, they completed it there, and the replay
         * unmapped pages the recorded run kept (sympool's own recordings 0.3-1.8% off). Without
         * a held free the two look alike, and the run stays an empty_cache. */
        if (internal == RIM_NO && recycles && nheld > 0 && j < d->nev &&
            d->ev[j].action == TR_SEGMENT_MAP && default_unmaps_only(d->ev, i, j))
            internal = RIM_SPLIT;
        if (internal != RIM_NO) {
            d->internal_frees += j - i;
            if (internal == RIM_GC)
                e->flags |= TR_F_MAYBE_GC;
        } else {
            e->flags |= TR_F_EMPTY_CACHE;
            d->empty_cache_runs++;
        }
        i = j;
    }
    d->nstreams = streams.n;

    /* Reserved before each event, walking back from the end state. */
    int64_t r = (int64_t)d->final_reserved, peak = r, low = 0;
    for (size_t i = d->nev; i-- > 0;) {
        const tr_event_t *e = &d->ev[i];
        if (e->action == TR_SEGMENT_ALLOC || e->action == TR_SEGMENT_MAP)
            r -= (int64_t)e->size;
        else if (e->action == TR_SEGMENT_FREE || e->action == TR_SEGMENT_UNMAP)
            r += (int64_t)e->size;
        if (r > peak)
            peak = r;
        if (r < low)
            low = r;
        if (r >= TR_SUM_LIMIT || r <= -TR_SUM_LIMIT) {
            snprintf(err, errlen,
                     "device_traces[%d][%zu]: the segments reserved at once reach 4 EiB", dev, i);
            goto out;
        }
    }
    d->start_reserved = r > 0 ? (uint64_t)r : 0;
    d->peak_reserved = (uint64_t)peak;
    /* Walked back from the end, the segments a consistent trace reserved never go below 0; where
     * they do, segments were released with no segment_free or segment_unmap entry (skip_actions
     * left them out) or are missing from the snapshot's segments, and PyTorch's reserved bytes
     * before that point, its peak included, are at least those counted. */
    d->unrecorded_free = (uint64_t)-low;
    if (!count_missing(d))
        goto oom;

    int64_t req = (int64_t)d->seeded_bytes, rpeak = req;
    for (size_t i = 0; i < d->nev; i++) {
        req += tr_requested_delta(d, i);
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
    tr_map_free(&segfirst);
    tr_map_free(&streams);
    tr_map_free(&held);
    free(xr);
    free(ranges);
    free(spans);
    tr_map_free(&known);
    free(asks);
    return ok;
}

/* The snapshot's allocator_settings as a SYMPOOL_ALLOC_CONF string. The structured keys are
 * the settings in force; the PYTORCH_CUDA_ALLOC_CONF string adds what they do not show
 * (large_segment_size_mb, max_non_split_rounding_mb, per_process_memory_fraction). */
#define RP_MAX_KEYS 64 /* roundup_power2_divisions keys read (PyTorch writes 16) */

static const char *kind_of(const pk_value_t *v);

/* A setting present with a kind of value PyTorch never records for it (expandable_segments
 * "True", a max_split_size of 41943040.0, PYTORCH_CUDA_ALLOC_CONF 5): what the run used cannot
 * be known, and the setting was left out without a word, so that a replay ran the defaults in
 * its place. The first such key is the snapshot's reason its settings are not valid. */
static void note_kind(char *why, size_t cap, const pk_value_t *as, const char *key, bool ok,
                      const char *want) {
    const pk_value_t *v = pk_get(as, key);
    if (v == NULL || ok || why[0] != '\0')
        return;
    snprintf(why, cap,
             "allocator_settings['%s'] is %s, not the %s PyTorch records: the setting the run "
             "used is unknown",
             key, kind_of(v), want);
}

/* The kinds PyTorch records: max_split_size an int (-1 or SIZE_MAX for none),
 * garbage_collection_threshold a float, expandable_segments a bool, roundup_power2_divisions a
 * dict, PYTORCH_CUDA_ALLOC_CONF a str. */
static void check_kinds(const pk_value_t *as, char *why, size_t cap) {
    const pk_value_t *v = pk_get(as, "max_split_size");
    double num;
    note_kind(why, cap, as, "max_split_size",
              v != NULL && (v->type == PK_INT || v->type == PK_UINT || v->type == PK_BIGINT ||
                            v->type == PK_BOOL),
              "int");
    note_kind(why, cap, as, "garbage_collection_threshold",
              pk_num(pk_get(as, "garbage_collection_threshold"), &num), "float");
    v = pk_get(as, "expandable_segments");
    note_kind(why, cap, as, "expandable_segments", v != NULL && v->type == PK_BOOL, "bool");
    v = pk_get(as, "roundup_power2_divisions");
    note_kind(why, cap, as, "roundup_power2_divisions", v != NULL && v->type == PK_DICT, "dict");
    note_kind(why, cap, as, "PYTORCH_CUDA_ALLOC_CONF",
              pk_get_str(as, "PYTORCH_CUDA_ALLOC_CONF") != NULL, "str");
}

/* PyTorch's largest max_split_size: max_split_size_mb past SIZE_MAX / 1 MiB is clamped there
 * (c10/core/AllocatorConfig.cpp parseMaxSplitSize), and recorded as int64 -2^20, or 2^64 - 2^20
 * where it was written unsigned. A size, not "no limit" (SIZE_MAX, -1). */
#define SPLIT_CLAMPED ((uint64_t)UINT64_MAX >> 20 << 20)
static bool split_clamped(const pk_value_t *v) {
    int64_t i;
    return (v->type == PK_UINT && v->u.u == SPLIT_CLAMPED) ||
           (pk_int(v, &i) && i == -((int64_t)1 << 20));
}

/* A max_split_size of the int kind that PyTorch still cannot have recorded: it writes
 * int64(max_split_size), -1 for none (SIZE_MAX), else the configured bytes, at least 20 MiB
 * (checked later, in conf, as PyTorch checks max_split_size_mb). 0, another negative or an int
 * past 2^64 was read as no limit without a word (the replay ran the defaults in its place). */
static void note_split_value(char *why, size_t cap, const pk_value_t *as) {
    const pk_value_t *v = pk_get(as, "max_split_size");
    int64_t mss = 0;
    char value[48];
    if (v == NULL || why[0] != '\0' || (v->type == PK_UINT && v->u.u == UINT64_MAX) ||
        split_clamped(v))
        return; /* absent, another reason first, SIZE_MAX written unsigned (no limit), or the
                 * clamped largest size */
    if (v->type == PK_BIGINT)
        snprintf(value, sizeof value, "an int outside [-2^63, 2^64)");
    else if (v->type == PK_UINT)
        snprintf(value, sizeof value, "%llu", (unsigned long long)v->u.u);
    else if (pk_int(v, &mss) && mss <= 0 && mss != -1)
        snprintf(value, sizeof value, "%lld", (long long)mss);
    else
        return;
    snprintf(why, cap,
             "allocator_settings['max_split_size'] is %s, not -1 (no limit) or a size PyTorch "
             "records: the setting the run used is unknown",
             value);
}

/* sympool's snapshots with expandable segments record the rules of ours the run used
 * (sympool_expandable_rules, pool/snapshot.c): NAME=VALUE items of SYMPOOL_EXPANDABLE_ options
 * (but _SEGMENTS, which expandable_segments says), each checked as the option would take it. A
 * value that is not such a list is said, not replayed as PyTorch's rules without a word. */
static void read_rules(const pk_value_t *as, tr_settings_t *st, char *why, size_t cap) {
    const pk_value_t *v = pk_get(as, "sympool_expandable_rules");
    if (v == NULL)
        return;
    const char *text = pk_str(v);
    if (text == NULL || v->u.str.len >= sizeof st->rules || strlen(text) != v->u.str.len) {
        snprintf(why, cap,
                 "allocator_settings['sympool_expandable_rules'] is %s, not the list of "
                 "NAME=VALUE items sympool writes",
                 text == NULL ? kind_of(v) : "a str of another form");
        return;
    }
    for (const char *p = text; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char item[256], check[120];
        const char *eq = memchr(p, '=', n);
        if (n >= sizeof item || eq == NULL) {
            snprintf(why, cap,
                     "allocator_settings['sympool_expandable_rules']: '%.*s' is no "
                     "NAME=VALUE item",
                     (int)(n < 64 ? n : 64), p);
            return;
        }
        memcpy(item, p, n);
        item[n] = '\0';
        item[eq - p] = '\0';
        if (strncmp(item, "SYMPOOL_EXPANDABLE_", 19) != 0 ||
            strcmp(item, "SYMPOOL_EXPANDABLE_SEGMENTS") == 0 ||
            !sp_x_option_check(item, item + (eq - p) + 1, check, sizeof check)) {
            snprintf(why, cap, "allocator_settings['sympool_expandable_rules']: %.64s: %s", item,
                     strncmp(item, "SYMPOOL_EXPANDABLE_", 19) != 0 ||
                             strcmp(item, "SYMPOOL_EXPANDABLE_SEGMENTS") == 0
                         ? "not a rule of sympool's expandable segments"
                         : check);
            return;
        }
        p += n + (end ? 1 : 0);
    }
    snprintf(st->rules, sizeof st->rules, "%s", text);
}

static void read_settings(const pk_value_t *as, tr_settings_t *st) {
    memset(st, 0, sizeof(*st));
    if (as == NULL || as->type != PK_DICT)
        return;
    st->recorded = true;
    char kind_bad[200] = ""; /* a setting of a kind PyTorch does not record: why */
    check_kinds(as, kind_bad, sizeof kind_bad);
    note_split_value(kind_bad, sizeof kind_bad, as);
    size_t used = 0, dused = 0;
#define ADD(...)                                                                                   \
    do {                                                                                           \
        if (used < sizeof(st->conf))                                                               \
            used +=                                                                                \
                (size_t)snprintf(st->conf + used, sizeof(st->conf) - used, "%s", used ? "," : ""); \
        if (used < sizeof(st->conf))                                                               \
            used += (size_t)snprintf(st->conf + used, sizeof(st->conf) - used, __VA_ARGS__);       \
    } while (0)
    int64_t mss = -1;
    const pk_value_t *split = pk_get(as, "max_split_size");
    if (split != NULL && split_clamped(split)) {
        ADD("max_split_size_mb:%llu", (unsigned long long)(SPLIT_CLAMPED >> 20));
        st->mss = SPLIT_CLAMPED;
    } else if (pk_get_int(as, "max_split_size", &mss) && mss > 0 && mss != INT64_MAX) {
        /* PyTorch's values are whole MiB; sympool's SYMPOOL_MAX_SPLIT_SIZE may not be, and
         * rounded down into max_split_size_mb it replayed another allocator (20.5 MiB as 20).
         * One under 20 MiB stays in conf, to be refused there as PyTorch would. */
        if (mss % (1 << 20) != 0 && mss >= 20 << 20)
            st->split_bytes = (uint64_t)mss;
        else
            ADD("max_split_size_mb:%lld", (long long)(mss >> 20));
        st->mss = (uint64_t)mss;
    }
    double gc = 0; /* PyTorch records 0 when it is not set; anything else is checked below */
    if (pk_num(pk_get(as, "garbage_collection_threshold"), &gc) && gc != 0) {
        /* "%g" keeps 6 digits (0.123456789 was replayed as 0.123457): the shorter of it and
         * "%.17g" that reads back as the recorded value. */
        char num[32];
        snprintf(num, sizeof num, "%g", gc);
        if (strtod(num, NULL) != gc)
            snprintf(num, sizeof num, "%.17g", gc);
        ADD("garbage_collection_threshold:%s", num);
        st->gc = true;
    }
    const pk_value_t *ex = pk_get(as, "expandable_segments");
    if (ex != NULL && ex->type == PK_BOOL) {
        ADD("expandable_segments:%s", ex->u.b ? "True" : "False");
        st->expandable = ex->u.b;
    }
    const pk_value_t *rp = pk_get(as, "roundup_power2_divisions");
    char rp_bad[160] = ""; /* a key that is no interval: why */
    /* PyTorch writes one key per interval (16); the keys written twice are looked for among
     * the others, so a dict of many more is refused before that (a million keys took minutes). */
    if (rp != NULL && rp->type == PK_DICT && pk_len(rp) > RP_MAX_KEYS)
        snprintf(rp_bad, sizeof rp_bad,
                 "roundup_power2_divisions has %zu keys; PyTorch writes one per interval (16)",
                 pk_len(rp));
    else if (rp != NULL && rp->type == PK_DICT) {
        char list[256];
        size_t lu = 0;
        bool any = false; /* an interval rounds: the list is written only then (else defaults) */
        pk_value_t *const *it = rp->u.seq.items;
        for (size_t k = 0; k + 1 < rp->u.seq.n; k += 2) {
            int64_t v = 0;
            const char *key = pk_str(it[k]);
            if (key == NULL) {
                /* PyTorch's keys are strs: another kind was left out without a word. */
                if (rp_bad[0] == '\0')
                    snprintf(rp_bad, sizeof rp_bad,
                             "roundup_power2_divisions: a key is %s, not a str", kind_of(it[k]));
                continue;
            }
            /* PyTorch's keys are MB boundaries ("1", "2", ... "32768") or ">": anything else
             * would be written into the list as text, where a ',' or a ']' ends it and what
             * follows reads as settings of their own. */
            size_t kl = it[k]->u.str.len;
            if (kl == 0 || kl > 20 || strspn(key, ">0123456789") != kl ||
                (key[0] == '>' && kl != 1) || (kl > 1 && strchr(key, '>') != NULL)) {
                if (rp_bad[0] == '\0')
                    snprintf(rp_bad, sizeof rp_bad,
                             "roundup_power2_divisions: key '%.64s' is no MB boundary", key);
                continue;
            }
            /* A key written twice is one key of the dict pickle.load makes: at its first
             * place, with its last value. */
            bool seen = false;
            size_t last = k;
            for (size_t j = 0; j + 1 < rp->u.seq.n; j += 2) {
                const char *kj = pk_str(it[j]);
                if (j == k || kj == NULL || it[j]->u.str.len != kl || memcmp(kj, key, kl) != 0)
                    continue;
                seen = seen || j < k;
                last = j > last ? j : last;
            }
            /* Its 0s too: the list's first boundary also fills the intervals below it, so a 0
             * left out there ("[>:4]" is {"1": 0, "2": 4, ...}) became the next key's value. */
            /* Its divisions are a count PyTorch records as an int: another kind, or a negative
             * one, was left out without a word (the interval replayed as not rounded). */
            if (!seen && !(pk_int(it[last + 1], &v) && v >= 0) && rp_bad[0] == '\0')
                snprintf(rp_bad, sizeof rp_bad,
                         "roundup_power2_divisions['%.20s'] is %s, not a count of divisions", key,
                         it[last + 1]->type == PK_INT ? "negative" : kind_of(it[last + 1]));
            if (!seen && pk_int(it[last + 1], &v) && v >= 0 && lu < sizeof(list)) {
                lu += (size_t)snprintf(list + lu, sizeof(list) - lu, "%s%s:%lld", lu ? "," : "",
                                       key, (long long)v);
                any = any || v > 0;
            }
        }
        if (any && lu < sizeof(list))
            ADD("roundup_power2_divisions:[%s]", list);
    }
    /* Items of the string the structured keys do not carry. */
    const char *conf = pk_get_str(as, "PYTORCH_CUDA_ALLOC_CONF");
    char fraction_bad[256] = ""; /* why its per_process_memory_fraction is not one */
    for (const char *p = conf; p != NULL && *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char item[128];
        if (n < sizeof(item)) {
            memcpy(item, p, n);
            item[n] = '\0';
            char *colon = strchr(item, ':');
            if (colon != NULL && (strncmp(item, "large_segment_size_mb:", 22) == 0 ||
                                  strncmp(item, "max_non_split_rounding_mb:", 26) == 0)) {
                ADD("%s", item);
            } else if (colon != NULL && strncmp(item, "per_process_memory_fraction:", 28) == 0) {
                /* Checked as the library checks it (a number in [0, 1]): NaN or "0.5abc"
                 * was read as no fraction or as 0.5 without a word. */
                if (sp_x_alloc_conf_check(item, fraction_bad, sizeof fraction_bad))
                    st->fraction = strtod(colon + 1, NULL);
            } else if (colon != NULL && strncmp(item, "backend:", 8) == 0 &&
                       strcmp(colon + 1, "native") != 0 && dused < sizeof(st->dropped)) {
                dused += (size_t)snprintf(st->dropped + dused, sizeof(st->dropped) - dused,
                                          "%s%s (not the caching allocator: no segments to "
                                          "replay)",
                                          dused ? "; " : "", item);
            }
        }
        p += n + (end ? 1 : 0);
    }
#undef ADD
    char rules_bad[320] = ""; /* why sympool_expandable_rules is not what sympool writes */
    read_rules(as, st, rules_bad, sizeof rules_bad);
    /* Settings PyTorch refuses (a max_split_size under 20 MiB, a threshold outside (0, 1)):
     * said once here, so that every command says the same about them. */
    char why[256];
    if (kind_bad[0] != '\0')
        snprintf(st->invalid, sizeof st->invalid, "%s", kind_bad);
    else if (st->conf[0] != '\0' && !sp_x_alloc_conf_check(st->conf, why, sizeof why))
        snprintf(st->invalid, sizeof st->invalid, "%s", why);
    else if (fraction_bad[0] != '\0')
        snprintf(st->invalid, sizeof st->invalid, "%s", fraction_bad);
    else if (rp_bad[0] != '\0')
        snprintf(st->invalid, sizeof st->invalid, "%s", rp_bad);
    else if (rules_bad[0] != '\0')
        snprintf(st->invalid, sizeof st->invalid, "%s", rules_bad);
}

uint64_t tr_settings_split_to_set(const tr_settings_t *st) {
    return getenv("SYMPOOL_MAX_SPLIT_SIZE") != NULL ? 0 : st->split_bytes;
}

bool tr_settings_set_split(const tr_settings_t *st) {
    uint64_t split = tr_settings_split_to_set(st);
    if (split == 0)
        return true;
    char bytes[24];
    snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)split);
    return sp_x_option_set("SYMPOOL_MAX_SPLIT_SIZE", bytes) == SP_SUCCESS;
}

/* want_sfree: keep the start segments' untouched free blocks (tr_device_t.sfree), which only a
 * replay's own snapshot reads (their requested sizes); finding them costs a pass over the events,
 * ~150 instructions an entry, so only a load with frames asks for them. */
static bool from_doc(pk_doc_t *doc, recs_t *recs, size_t len, bool want_sfree, tr_trace_t *t,
                     char *err, size_t errlen);

/* What a value is, in Python's words, for a reason. */
static const char *kind_of(const pk_value_t *v) {
    switch (v != NULL ? v->type : PK_NONE) {
    case PK_NONE:
        return "None";
    case PK_BOOL:
        return "a bool";
    case PK_INT:
    case PK_UINT:
    case PK_BIGINT:
        return "an int";
    case PK_FLOAT:
        return "a float";
    case PK_STR:
        return "a str";
    case PK_BYTES:
        return "bytes";
    case PK_LIST:
        return "a list";
    case PK_TUPLE:
        return "a tuple";
    case PK_SET:
        return "a set";
    default:
        return "another kind of value";
    }
}

bool tr_from_doc(pk_doc_t *doc, tr_trace_t *t, char *err, size_t errlen) {
    return from_doc(doc, NULL, 0, false, t, err, errlen);
}

/* One object of a pickle can stand for many (its memo): a trace entry, a block or a whole list
 * referenced a million times reads as a million, each taking an event, a block record and the
 * analysis's time, so a few MB of pickle could ask for hundreds of GB (or, with thousands of
 * device traces, each pass over the segments repeated for every device). PyTorch writes 90-340
 * bytes per trace entry and no fewer than about 35 per block or segment (stacks removed), so
 * an input of len bytes holds at most len / 8 of them written out; more, or more passes over
 * the segments than 64 times that, is refused before anything is allocated for them. len 0:
 * unknown (a document parsed by the caller), no bound. */
static bool within_input(size_t len, size_t items, size_t ndev, size_t nsegments, char *err,
                         size_t errlen) {
    size_t budget = len / 8;
    if (len == 0 || (items <= budget && (nsegments == 0 || ndev <= 64 * budget / nsegments)))
        return true;
    snprintf(err, errlen,
             "the snapshot names %zu trace entries, segments and blocks (over %zu device%s) in "
             "%zu bytes: more than its bytes can hold written out, so one object stands for many "
             "(a pickle's memo repeats it); refused",
             items, ndev, ndev == 1 ? "" : "s", len);
    return false;
}

/* The snapshot's external_annotations, kept as the document has them for a replay's snapshot
 * (read nowhere else: whatever they hold, the trace loads as before). */
static void read_annotations(const pk_value_t *root, tr_trace_t *t) {
    const pk_value_t *a = pk_get(root, "external_annotations");
    t->annotations = a != NULL && a->type == PK_LIST ? a : NULL;
}

static bool from_doc(pk_doc_t *doc, recs_t *recs, size_t len, bool want_sfree, tr_trace_t *t,
                     char *err, size_t errlen) {
    memset(t, 0, sizeof(*t));
    t->doc = doc;
    t->root = pk_root(doc);
    const pk_value_t *segments = NULL, *traces = NULL;
    if (t->root != NULL && t->root->type == PK_LIST) {
        segments = t->root; /* an old-style snapshot: just the segment list */
        t->format = "segment list (legacy, state only)";
    } else if (entry_record(recs, t->root)) {
        return whole_needed("the top level", err, errlen);
    } else if (t->root != NULL && (t->root->type == PK_DICT || dict_record(recs, t->root))) {
        /* A handed-over block or segment reads as the dict it was: none of these keys is
         * theirs. */
        segments = pk_get(t->root, "segments");
        traces = pk_get(t->root, "device_traces");
        const pk_value_t *as = pk_get(t->root, "allocator_settings");
        if (entry_record(recs, as))
            return whole_needed("the allocator settings", err, errlen);
        const pk_value_t *rp = pk_get(as, "roundup_power2_divisions");
        if (rp != NULL && rp->type == PK_RECORD && recs != NULL) {
            snprintf(err, errlen,
                     PK_ERR_WHOLE "a dict handed over as a trace entry, block or segment is also "
                                  "the settings' roundup_power2_divisions");
            return false;
        }
        read_settings(as, &t->settings);
        read_annotations(t->root, t);
        if (dict_record(recs, as))
            t->settings.recorded = true;
        t->format = t->settings.recorded ? "snapshot with allocator_settings"
                                         : "snapshot without allocator_settings (older torch)";
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
    size_t items = t->nsegments; /* within_input's count: segments, blocks, trace entries */
    for (size_t s = 0; s < t->nsegments; s++) {
        int64_t dev = 0;
        const pk_value_t *seg = pk_at(segments, s);
        const rec_seg_t *rg = seg_of(recs, seg);
        if (entry_record(recs, seg))
            return whole_needed("a segment", err, errlen);
        /* A bare list is a snapshot when it holds segment dicts (the legacy format); one of
         * something else (a pickled list of tuples, numbers, ...) is no damaged snapshot. */
        if (segments == t->root && rg == NULL && !dict_record(recs, seg) &&
            (seg == NULL || seg->type != PK_DICT)) {
            snprintf(err, errlen,
                     "not a memory snapshot (a list whose item %zu is %s, not a segment dict)", s,
                     kind_of(seg));
            return false;
        }
        bool have_dev = rg != NULL ? (dev = rg->dev, (rg->flags & RS_DEV) != 0)
                                   : pk_get_int(seg, "device", &dev);
        if (!have_dev || dev < 0 || dev > 4096) {
            snprintf(err, errlen, "segments[%zu]: missing or bad 'device'", s);
            return false;
        }
        if (dev + 1 > ndev)
            ndev = (int)dev + 1;
        items += pk_len(rg != NULL ? rg->blocks : pk_get(seg, "blocks"));
    }
    if (ndev > 4096) {
        snprintf(err, errlen, "more than 4096 device traces");
        return false;
    }
    for (int d = 0; d < ndev; d++)
        items += pk_len(pk_at(traces, (size_t)d));
    if (!within_input(len, items, (size_t)ndev, t->nsegments, err, errlen))
        return false;
    t->ndev = ndev;
    t->dev = calloc(ndev > 0 ? (size_t)ndev : 1, sizeof(*t->dev));
    if (t->dev == NULL) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
    for (int d = 0; d < ndev; d++) {
        /* times and stacks: a load with stacks keeps them (want_sfree), as does a document
         * parsed by the caller (no recs) */
        if (!load_events(pk_at(traces, (size_t)d), recs, recs == NULL || want_sfree, d, &t->dev[d],
                         err, errlen) ||
            !analyse(segments, recs, &t->settings, want_sfree, d, &t->dev[d], err, errlen))
            return false;
    }
    return true;
}

/* Stacks, like entries, can stand for many through the pickle's memo: one list of frames (or one
 * long file name) shared by every entry of a 173 KB file read as 40 GB of frame text, and
 * `replay --snapshot OUT.json` (which writes each stack out whole) grew to 16 GB before it was
 * killed, leaving its temporary; plot took 20 s. PyTorch's snapshots hold 20-40 bytes of frame
 * text (file and function names, 32 more per frame for the rest of it) per byte of file (a
 * stack is shared by an allocation's few entries, a name by its frames); more than
 * TR_STACK_RATIO times the input is refused, counted until the budget is spent (so in time
 * bounded by the input's size, whatever the memo repeats). The commands that use the stacks ask
 * (tr_stacks_within_input, or tr_stacks_fit for the stacks they use: plot's blocks at the peak);
 * the load itself reads a file with and without stacks alike. */
#define TR_STACK_RATIO 1024

static size_t str_bytes(const pk_value_t *v) {
    return v != NULL && v->type == PK_STR ? v->u.str.len : 0;
}

/* One stack's text, counted up to cap (past it: cap + 1, so that a long one costs no more than
 * the budget left). */
static uint64_t stack_text(const pk_value_t *frames, uint64_t cap) {
    uint64_t sum = 0;
    for (size_t i = 0; i < pk_len(frames) && sum <= cap; i++) {
        const pk_value_t *f = pk_at(frames, i);
        sum += 32 + (uint64_t)str_bytes(pk_get(f, "filename")) +
               (uint64_t)str_bytes(pk_get(f, "name"));
    }
    return sum <= cap ? sum : cap + 1;
}

/* Take one stack's text from *left; false when it does not fit. A stack shared by several
 * entries (an allocation's alloc, free_requested and free_completed, and its block at the end)
 * is counted once and then taken from seen (a map from the list to its text). */
static bool stack_fits(const pk_value_t *frames, tr_map_t *seen, uint64_t *left) {
    if (frames == NULL || pk_len(frames) == 0)
        return true;
    uintptr_t cost;
    if (!tr_map_get(seen, (uint64_t)(uintptr_t)frames, &cost)) {
        cost = (uintptr_t)stack_text(frames, *left);
        (void)tr_map_put(seen, (uint64_t)(uintptr_t)frames, cost); /* out of memory: recounted */
    }
    if (cost > *left)
        return false;
    *left -= cost;
    return true;
}

bool tr_stacks_fit(const tr_trace_t *t, const pk_value_t *const *stacks, size_t n, const char *path,
                   char *err, size_t errlen) {
    size_t len = t->input_bytes;
    uint64_t left = (uint64_t)len * TR_STACK_RATIO;
    if (len == 0)
        return true; /* a document parsed by the caller: no bound */
    tr_map_t seen = {0};
    bool ok = true;
    for (size_t i = 0; ok && stacks != NULL && i < n; i++)
        ok = stack_fits(stacks[i], &seen, &left);
    for (int d = 0; ok && stacks == NULL && d < t->ndev; d++) {
        const tr_device_t *dv = &t->dev[d];
        for (size_t i = 0; ok && i < dv->nev; i++)
            ok = stack_fits(dv->at != NULL ? dv->at[i].frames : NULL, &seen, &left);
        for (size_t i = 0; ok && i < dv->nseeds; i++)
            ok = stack_fits(dv->seeds[i].frames, &seen, &left);
        for (size_t i = 0; ok && i < dv->nsblocks; i++)
            ok = stack_fits(dv->sblocks[i].frames, &seen, &left);
        for (size_t i = 0; ok && i < dv->nstart; i++)
            ok = stack_fits(dv->start[i].frames, &seen, &left);
    }
    tr_map_free(&seen);
    if (!ok)
        snprintf(err, errlen,
                 "%s: its stacks repeat to more than %d x its %zu bytes in frame text through "
                 "the pickle's memo, which no PyTorch snapshot does (replay without --snapshot "
                 "reads no stacks)",
                 path, TR_STACK_RATIO, len);
    return ok;
}

bool tr_stacks_within_input(const tr_trace_t *t, const char *path, char *err, size_t errlen) {
    return tr_stacks_fit(t, NULL, 0, path, err, errlen);
}

bool tr_load(const char *path, tr_trace_t *t, char *err, size_t errlen) {
    return tr_load_opts(path, true, t, err, errlen);
}

/* A file read through its mapping that another process truncates meanwhile (PyTorch's
 * _dump_snapshot rewrites its file in place: open(path, "wb") empties it first) faults on the
 * pages past its new end: the command died of SIGBUS. While a file is mapped, that fault ends
 * the command with one line naming the file instead (write and _exit: async-signal-safe). */
static char g_mapped_path[512];
static struct sigaction g_old_sigbus;

static void on_sigbus(int sig) {
    (void)sig;
    static const char head[] = "sympool: ",
                      tail[] = ": the file shrank while it was read (another process rewrote "
                               "it?); read it again once it is whole\n";
    ssize_t w = write(2, head, sizeof head - 1);
    w = write(2, g_mapped_path, strlen(g_mapped_path));
    w = write(2, tail, sizeof tail - 1);
    (void)w;
    _exit(1);
}

static void guard_mapping(const char *path) {
    snprintf(g_mapped_path, sizeof g_mapped_path, "%s", path);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigbus;
    sigemptyset(&sa.sa_mask);
    (void)sigaction(SIGBUS, &sa, &g_old_sigbus);
}

/* The file's bytes: a regular file is mapped (read-only, its pages populated in one call: no
 * copy, no fault per page), anything else read. */
static bool read_whole(const char *path, unsigned char **buf_p, size_t *len_p, bool *mapped_p,
                       char *err, size_t errlen) {
    *mapped_p = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0 &&
        (uint64_t)sb.st_size <= ((uint64_t)4 << 30)) {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (p != MAP_FAILED) {
            close(fd);
            guard_mapping(path);
            *buf_p = p;
            *len_p = (size_t)sb.st_size;
            *mapped_p = true;
            return true;
        }
    }
    if (fd >= 0)
        close(fd);
    return pk_read_file(path, (size_t)4 << 30, buf_p, len_p, err, errlen);
}

static bool g_keep_mapped; /* tr_keep_file_mapped */

void tr_keep_file_mapped(bool keep) {
    g_keep_mapped = keep;
}

static void release(unsigned char *buf, size_t len, bool mapped) {
    if (mapped) {
        /* Left to the process's exit where the command says it ends soon (the mapping is not
         * malloc's, so LeakSanitizer does not count it; nothing reads it again). */
        if (!g_keep_mapped)
            munmap(buf, len);
        (void)sigaction(SIGBUS, &g_old_sigbus, NULL);
    } else {
        free(buf);
    }
}

/* torch.save(obj, path) writes a zip archive (PyTorch's caffe2/serialize/inline_container.cc:
 * miniz with MZ_ZIP_FLAG_WRITE_ZIP64, so ZIP64 records; members stored, not compressed) whose
 * NAME/data.pkl is obj pickled (protocol 2 by default) with its tensors as persistent ids. A
 * memory snapshot holds no tensor, so that member is the snapshot's whole pickle: read in place.
 * The layout is PKWARE's APPNOTE.TXT (4.3: the end of central directory record, its ZIP64 form
 * and locator, central directory headers, local file headers; 4.5.3: the ZIP64 extra field). */
static uint64_t le_at(const unsigned char *b, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

/* The end of central directory record: 22 bytes, then a comment of at most 65535. Its offset,
 * or SIZE_MAX. */
static size_t zip_end_record(const unsigned char *b, size_t n) {
    if (n < 22)
        return SIZE_MAX;
    size_t lo = n - 22 > 65535 ? n - 22 - 65535 : 0;
    for (size_t i = n - 22 + 1; i-- > lo;)
        if (memcmp(b + i, "PK\5\6", 4) == 0 && le_at(b + i + 20, 2) <= n - 22 - i)
            return i;
    return SIZE_MAX;
}

/* A field the 32-bit header marks 0xFFFFFFFF is in the entry's ZIP64 extra field (id 1), the
 * marked ones in order: original size, compressed size, local header offset. */
static bool zip64_fields(const unsigned char *x, size_t xlen, uint64_t *usize, uint64_t *csize,
                         uint64_t *local) {
    uint64_t *field[3] = {usize, csize, local};
    while (xlen >= 4) {
        size_t id = le_at(x, 2), len = le_at(x + 2, 2);
        if (len > xlen - 4)
            return false;
        if (id == 1) {
            const unsigned char *q = x + 4;
            for (int f = 0; f < 3; f++)
                if (*field[f] == 0xFFFFFFFFu) {
                    if (q + 8 > x + 4 + len)
                        return false;
                    *field[f] = le_at(q, 8);
                    q += 8;
                }
            return true;
        }
        x += 4 + len;
        xlen -= 4 + len;
    }
    return *usize != 0xFFFFFFFFu && *csize != 0xFFFFFFFFu && *local != 0xFFFFFFFFu;
}

/* The bytes of the archive's one NAME/data.pkl member: true with their offset and length (and
 * the member's name); false with why not. */
static bool zip_snapshot(const unsigned char *b, size_t n, size_t *off_p, size_t *len_p,
                         char *member, size_t member_cap, char *why, size_t whylen) {
    size_t end = zip_end_record(b, n);
    if (end == SIZE_MAX) {
        snprintf(why, whylen, "it has no end of central directory record (a truncated archive?)");
        return false;
    }
    uint64_t count = le_at(b + end + 10, 2), cd_size = le_at(b + end + 12, 4),
             cd_off = le_at(b + end + 16, 4);
    if (end >= 20 && memcmp(b + end - 20, "PK\6\7", 4) == 0) {
        uint64_t z = le_at(b + end - 20 + 8, 8);
        if (n < 56 || z > n - 56 || memcmp(b + z, "PK\6\6", 4) != 0) {
            snprintf(why, whylen, "its ZIP64 end of central directory record is missing");
            return false;
        }
        count = le_at(b + z + 32, 8);
        cd_size = le_at(b + z + 40, 8);
        cd_off = le_at(b + z + 48, 8);
    }
    if (cd_off > n || cd_size > n - cd_off) {
        snprintf(why, whylen, "its central directory lies outside the file (a truncated archive?)");
        return false;
    }
    size_t p = (size_t)cd_off, cd_end = (size_t)(cd_off + cd_size), found = 0;
    uint64_t method = 0, csize = 0, usize = 0, local = 0;
    for (uint64_t k = 0; k < count; k++) {
        if (cd_end - p < 46 || memcmp(b + p, "PK\1\2", 4) != 0) {
            snprintf(why, whylen, "its central directory entry %llu is malformed",
                     (unsigned long long)k);
            return false;
        }
        size_t nl = le_at(b + p + 28, 2), xl = le_at(b + p + 30, 2), cl = le_at(b + p + 32, 2);
        if (46 + nl + xl + cl > cd_end - p) {
            snprintf(why, whylen, "its central directory entry %llu is malformed",
                     (unsigned long long)k);
            return false;
        }
        const unsigned char *name = b + p + 46;
        /* NAME/data.pkl: one folder, as torch.save names it (another data.pkl deeper is some
         * other archive's). */
        if (nl > 9 && memcmp(name + nl - 9, "/data.pkl", 9) == 0 &&
            memchr(name, '/', nl - 9) == NULL) {
            found++;
            method = le_at(b + p + 10, 2);
            csize = le_at(b + p + 20, 4);
            usize = le_at(b + p + 24, 4);
            local = le_at(b + p + 42, 4);
            if (!zip64_fields(name + nl, xl, &usize, &csize, &local)) {
                snprintf(why, whylen, "the ZIP64 fields of its %.*s are malformed", (int)nl, name);
                return false;
            }
            snprintf(member, member_cap, "%.*s", (int)nl, name);
        }
        p += 46 + nl + xl + cl;
    }
    if (found != 1) {
        snprintf(why, whylen,
                 found == 0 ? "it has no NAME/data.pkl member, so it is no torch.save archive"
                            : "it has %zu NAME/data.pkl members",
                 found);
        return false;
    }
    if (method != 0 || csize != usize) {
        snprintf(why, whylen,
                 "its %s is compressed (zip method %llu), which torch.save never does: extract "
                 "it (unzip -p FILE %s > snapshot.pickle)",
                 member, (unsigned long long)method, member);
        return false;
    }
    if (local > n || n - local < 30 || memcmp(b + local, "PK\3\4", 4) != 0) {
        snprintf(why, whylen, "the local header of its %s is missing", member);
        return false;
    }
    uint64_t data = local + 30 + le_at(b + local + 26, 2) + le_at(b + local + 28, 2);
    if (data > n || csize > n - data) {
        snprintf(why, whylen, "its %s runs past the end of the file", member);
        return false;
    }
    *off_p = (size_t)data;
    *len_p = (size_t)csize;
    return true;
}

/* A snapshot a user compressed is no pickle (one saved with torch.save is read: zip_snapshot):
 * read as one, a zip began with PERSID ("opcode PERSID at offset 0 not allowed"), bzip2's "BZh"
 * with a BINBYTES of 825 MB ("truncated string") and zstd's magic with MARK ("unknown opcode
 * 0xb5"). No snapshot starts with these bytes (each has a byte no pickle opcode is, or an opcode
 * the reader refuses, where a snapshot has its first ones). What the file is, and what to do; NULL
 * for anything else. */
static const char *packed_as(const unsigned char *b, size_t n) {
    static const struct {
        const char *magic;
        size_t len;
        const char *say;
    } kinds[] = {
        {"\x1f\x8b", 2, "a gzip-compressed file, not a snapshot: decompress it first (gunzip -k)"},
        {"BZh", 3, "a bzip2-compressed file, not a snapshot: decompress it first (bunzip2 -k)"},
        {"\xfd"
         "7zXZ\0",
         6, "an xz-compressed file, not a snapshot: decompress it first (unxz -k)"},
        {"\x28\xb5\x2f\xfd", 4,
         "a zstd-compressed file, not a snapshot: decompress it first (unzstd)"},
        {"\x04\x22\x4d\x18", 4,
         "an lz4-compressed file, not a snapshot: decompress it first (unlz4)"},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        if (n >= kinds[k].len && memcmp(b, kinds[k].magic, kinds[k].len) == 0)
            return kinds[k].say;
    return NULL;
}

/* Every torch.save before torch 1.6, and torch.save(obj, f, _use_new_zipfile_serialization=False)
 * since, writes no zip archive but pickles one after another (torch/serialization.py's
 * _legacy_save and _legacy_load): the format's magic number 0x1950a86a20f9469cfc6c, its version
 * 1001, a dict of the writer's sizes and byte order (sys_info), the object saved, and the list of
 * the storages whose bytes follow (none for a snapshot, which holds no tensor). Each is written
 * with the protocol torch.save was given (2 by default). Whether buf starts with the first of
 * them: the number alone, after an optional PROTO and (protocols 4-5) FRAME, as LONG1 or, for
 * protocols 0 and 1, as a LONG line. */
static bool legacy_magic(const unsigned char *b, size_t n) {
    static const unsigned char bin[12] = {0x8a, 10,   0x6c, 0xfc, 0x9c, 0x46,
                                          0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
    static const char text[] = "L119547037146038801333356L\n"; /* the same number in decimal */
    size_t i = n >= 2 && b[0] == 0x80 ? 2 : 0;
    if (n - i >= 9 && b[i] == 0x95)
        i += 9;
    if (n - i >= sizeof bin && memcmp(b + i, bin, sizeof bin) == 0)
        i += sizeof bin;
    else if (n - i >= sizeof text - 1 && memcmp(b + i, text, sizeof text - 1) == 0)
        i += sizeof text - 1;
    else
        return false;
    return i < n && b[i] == '.';
}

/* Where the saved object's pickle starts in a file of torch.save's old format (legacy_magic):
 * 1 with *off_p set; 0 for any other file; -1 with why set for one whose header, after the magic
 * number, is not the format's (torch.load refuses it too: "Invalid protocol version"). */
static int legacy_object(const unsigned char *b, size_t n, size_t *off_p, char *why,
                         size_t whylen) {
    if (!legacy_magic(b, n))
        return 0;
    static const char *const names[2] = {"format version", "sys_info"};
    size_t at = pk_pickle_end(b, n);
    for (int k = 0; k < 2; k++) {
        size_t end = pk_pickle_end(b + at, n - at);
        pk_doc_t *doc = NULL;
        char perr[200] = "";
        if (end == 0 || !pk_parse(b + at, end, NULL, &doc, perr, sizeof perr)) {
            snprintf(why, whylen, "its %s (pickle %d, at offset %zu) %s%s", names[k], k + 2, at,
                     end == 0 ? "has no STOP: the file is cut short or is no such file"
                              : "does not read: ",
                     end == 0 ? "" : perr);
            return -1;
        }
        const pk_value_t *v = pk_root(doc);
        int64_t version = 0;
        bool ok = k == 0 ? pk_int(v, &version) && version == 1001 : v->type == PK_DICT;
        pk_free(doc);
        if (!ok) {
            snprintf(why, whylen, "its %s (pickle %d, at offset %zu) is %s", names[k], k + 2, at,
                     k == 0 ? "not 1001, the only version torch.save writes and torch.load reads"
                            : "not a dict");
            return -1;
        }
        at += end;
    }
    if (at == n) {
        snprintf(why, whylen, "it ends after its header (at offset %zu): no object follows", at);
        return -1;
    }
    *off_p = at;
    return 1;
}

/* Gives buf back where this load owns it (own): the caller's bytes of a stream are kept for a
 * second read. */
static void drop(unsigned char *buf, size_t len, bool mapped, bool own) {
    if (own)
        release(buf, len, mapped);
}

/* tr_load_opts on path's bytes buf[0..len) (mapped: a mapping of the file). own: the load gives
 * them back; else the caller does, and a document that the analysis must read whole is not
 * read again here but said in *again_p (a stream, whose bytes cannot be read twice). */
static bool load_bytes(const char *path, unsigned char *buf, size_t len, bool mapped, bool own,
                       bool frames, tr_trace_t *t, bool *again_p, char *err, size_t errlen) {
    memset(t, 0, sizeof(*t));
    /* The reasons name an archive member (member[], up to 255 bytes) twice, or quote a pickle
     * reader's 200-byte error: room for all of it. */
    char why[640];
    unsigned char *held = buf; /* what drop() gives back; buf is the document in it */
    size_t held_len = len;
    char member[256] = "";
    bool legacy = false; /* torch.save's old format (legacy_object) */
    if (len >= 4 && memcmp(buf, "PK\3\4", 4) == 0) {
        size_t off = 0, n = 0;
        if (!zip_snapshot(buf, len, &off, &n, member, sizeof member, why, sizeof why)) {
            snprintf(err, errlen, "%s: a zip archive (what torch.save writes), but %s", path, why);
            drop(held, held_len, mapped, own);
            return false;
        }
        buf += off;
        len = n;
    } else {
        size_t off = 0;
        int old = legacy_object(buf, len, &off, why, sizeof why);
        if (old < 0) {
            snprintf(err, errlen, "%s: torch.save's old format (before torch 1.6), but %s", path,
                     why);
            drop(held, held_len, mapped, own);
            return false;
        }
        if (old > 0) {
            buf += off;
            len -= off;
            legacy = true;
        }
    }
    /* The messages below name what was read: the file, or the pickle torch.save wrote in it. */
    char src[4400];
    if (member[0] != '\0' || legacy)
        snprintf(src, sizeof src, "%s: the pickle torch.save wrote (%s)", path,
                 legacy ? "its old format, before torch 1.6" : member);
    else
        snprintf(src, sizeof src, "%s", path);
    const char *packed = packed_as(buf, len);
    if (packed != NULL) {
        snprintf(err, errlen, "%s: %s", src, packed);
        drop(held, held_len, mapped, own);
        return false;
    }
    /* A JSON snapshot (ours, or one a viewer saved) starts with '{' or '[': translate it. A
     * UTF-8 byte order mark before it (what some editors save; the memory viewer's browser drops
     * it) is skipped: the file was refused as "not a pickle (nor a JSON snapshot)". */
    bool json = false;
    size_t bom = len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
    size_t i = bom;
    while (i < len && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t'))
        i++;
    /* A pickle starts with an opcode (PROTO, 0x80, from protocol 2 on; any other for 0 and 1). */
    bool opcode = len > 0 && pk_opcode_name(buf[0]) != NULL;
    if (bom && (i == len || (buf[i] != '{' && buf[i] != '['))) {
        /* Said as such: the byte after the mark may be a pickle's 0x80, which the message below
         * would call "no pickle opcode". */
        snprintf(err, errlen,
                 "%s: not a pickle (nor a JSON snapshot): it starts with a UTF-8 byte order mark "
                 "(ef bb bf), which no pickle has, and no JSON document follows it",
                 src);
        drop(held, held_len, mapped, own);
        return false;
    }
    if (i > 0 && i < len && !opcode && buf[i] != '{' && buf[i] != '[') {
        /* White space, then no JSON document: said as such, as the mark is above (the byte after
         * it may be a pickle's 0x80, which the message below called "no pickle opcode"). */
        snprintf(err, errlen,
                 "%s: not a pickle (nor a JSON snapshot): it starts with white space, which no "
                 "pickle does, and then byte 0x%02x (at offset %zu), which starts no JSON document",
                 src, buf[i], i);
        drop(held, held_len, mapped, own);
        return false;
    }
    if (i < len && !opcode && buf[i] != '{' && buf[i] != '[') {
        snprintf(err, errlen,
                 "%s: not a pickle (nor a JSON snapshot): it starts with byte 0x%02x, which is no "
                 "pickle opcode (a pickle of protocol 2-5 starts with 0x80)",
                 src, buf[i]);
        drop(held, held_len, mapped, own);
        return false;
    }
    if (!opcode && i < len && (buf[i] == '{' || buf[i] == '[')) {
        char *pickle = NULL;
        size_t plen = 0;
        /* Without stacks, the stacks are checked and left out of the translation (the pickle
         * reader would skip them anyway: reading them twice was most of a JSON trace's load). */
        bool ok =
            sp_x_json_to_pickle_skip((const char *)buf + bom, len - bom, frames ? NULL : "frames",
                                     &pickle, &plen, why, sizeof(why));
        drop(held, held_len, mapped, own);
        if (!ok) {
            snprintf(err, errlen, "%s: %s", src, why);
            return false;
        }
        buf = held = (unsigned char *)pickle;
        len = held_len = plen;
        mapped = false; /* the translation is ours, from malloc */
        own = true;
        json = true;
    }
    int protocol = json ? 0 : pk_protocol(buf, len);
    pk_doc_t *doc = NULL;
    /* Without stacks, the reader hands each trace entry over as it parses it: no dict, no
     * values for its numbers (most of the memory of loading a trace). */
    recs_t recs;
    memset(&recs, 0, sizeof(recs));
    /* Room for the entries up front: PyTorch writes 90-340 bytes per trace entry (the final
     * state included; most traces 160-220), so a 160th of the file holds most traces' entries
     * and grows once or twice (by half) on the densest. More is worse: what the array leaves
     * unused while the rest of the file is read spreads the heap over more huge pages, each
     * zeroed whole on its first touch (a 64th left 0.5-1 MB unused on forward-pass traces, and
     * took them into a second one); growing by doubling left as much unused on the others.
     * Which trace crosses a 2 MB boundary is a matter of a few KB: over 32 large real traces
     * a 160th grown by half touched 53 huge pages against 55 for a 256th doubled (3 traces
     * one fewer, 2 one more), as many as a 256th grown by half, fewer than a 192nd (57) or a
     * 224th (54). */
    if (!frames && len / 160 > 1024) {
        recs.ev = malloc(len / 160 * sizeof(*recs.ev));
        recs.cap = recs.ev != NULL ? len / 160 : 0;
    }
    bool ok = frames ? pk_parse_skip(buf, len, NULL, NULL, &doc, why, sizeof(why))
                     : pk_parse_records(buf, len, NULL, "frames", take_entry, &recs, &doc, why,
                                        sizeof(why));
    if (!ok && !frames && pk_err_whole(why)) {
        /* What skipping stacks and handing entries over cannot read as the whole document
         * reads (a skipped value used again elsewhere, items added to an entry after it was
         * handed over): read whole, as the commands that keep stacks do, so that every command
         * reads the file alike. Valid snapshots never come here. */
        free(recs.ev);
        free(recs.side);
        chunks_free(&recs.blk);
        chunks_free(&recs.seg);
        memset(&recs, 0, sizeof(recs));
        ok = pk_parse_skip(buf, len, NULL, NULL, &doc, why, sizeof(why));
    }
    drop(held, held_len, mapped, own);
    if (!ok) {
        free(recs.ev);
        free(recs.side);
        chunks_free(&recs.blk);
        chunks_free(&recs.seg);
        snprintf(err, errlen, "%s: %s", src, why);
        return false;
    }
    /* What the entries' array and the newest chunks of blocks and segments did not use goes
     * back before the analysis and the replay allocate theirs, so that they take it instead of
     * more of the heap (in place: the entries do not move). */
    chunks_trim(&recs.blk, sizeof(rec_block_t));
    chunks_trim(&recs.seg, sizeof(rec_seg_t));
    if (recs.cap > recs.n + 1024) {
        tr_event_t *ne = realloc(recs.ev, (recs.n ? recs.n : 1) * sizeof(*recs.ev));
        if (ne != NULL) {
            recs.ev = ne;
            recs.cap = recs.n ? recs.n : 1;
        }
    }
    /* A load with frames is a replay's that writes a snapshot (or another command's). */
    ok = from_doc(doc, &recs, len, frames, t, why, sizeof(why));
    t->input_bytes = len;
    t->ev_block = recs.ev; /* the devices' event arrays (tr_free frees it) */
    free(recs.side);
    chunks_free(&recs.blk);
    chunks_free(&recs.seg);
    if (!ok && !frames && pk_err_whole(why)) {
        /* A handed-over entry is also a dict read elsewhere (from_doc's whole_needed): read
         * again whole, as the commands with stacks read it. A file's bytes are given back by
         * now (most of the memory of a load): the file is read again; a stream's were kept by
         * the caller (again_p), which reads them again. */
        tr_free(t);
        if (again_p != NULL) {
            *again_p = true; /* the caller kept the bytes */
            return false;
        }
        return tr_load_opts(path, true, t, err, errlen);
    }
    if (!ok) {
        snprintf(err, errlen, "%s: %s", src, why);
        return false;
    }
    t->protocol = protocol;
    snprintf(t->zip_member, sizeof t->zip_member, "%s", member);
    t->legacy_save = legacy;
    t->pickled = !json;
    return true;
}

bool tr_load_opts(const char *path, bool frames, tr_trace_t *t, char *err, size_t errlen) {
    memset(t, 0, sizeof(*t));
    unsigned char *buf = NULL;
    size_t len = 0;
    bool mapped = false;
    char why[256];
    if (!read_whole(path, &buf, &len, &mapped, why, sizeof(why))) {
        snprintf(err, errlen, "%s", why);
        return false;
    }
    struct stat sb;
    if (frames || mapped || (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)))
        return load_bytes(path, buf, len, mapped, true, frames, t, NULL, err, errlen);
    /* A stream (a pipe, "-") is read once: its bytes are kept through the load, for the rare
     * document the analysis must read whole (load_bytes), which a file is read again for. */
    bool again = false;
    bool ok = load_bytes(path, buf, len, false, false, false, t, &again, err, errlen);
    if (again)
        ok = load_bytes(path, buf, len, false, false, true, t, NULL, err, errlen);
    free(buf);
    return ok;
}

void tr_free(tr_trace_t *t) {
    if (t->dev != NULL) {
        for (int d = 0; d < t->ndev; d++) {
            if (!t->dev[d].ev_borrowed)
                free(t->dev[d].ev);
            free(t->dev[d].at);
            free(t->dev[d].seeds);
            free(t->dev[d].start);
            free(t->dev[d].sblocks);
            free(t->dev[d].sfree);
            free(t->dev[d].pools);
            free(t->dev[d].meta);
        }
        free(t->dev);
    }
    free(t->ev_block);
    pk_free(t->doc);
    memset(t, 0, sizeof(*t));
}
