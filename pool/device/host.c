/*
 * host.c: the emulated device. A product backend, not a mock: every test, the CLI and every
 * machine without a GPU run the allocator on it, so it keeps the contract of device.h exactly.
 *
 * Memory. Device d has a byte budget `capacity` (SYMPOOL_HOST_CAPACITY); mem_alloc succeeds
 * while live_bytes + size <= capacity and answers SP_ERR_OUT_OF_MEMORY (quiet) otherwise, so
 * OOM tests are exact to the byte. Each allocation is its own anonymous MAP_NORESERVE mapping:
 * a large capacity costs nothing until pages are touched, pointers are page aligned, and there
 * is no fragmentation below the allocator (as with cudaMalloc). Live mappings are kept in a
 * per-device hash (pointer -> size) so that mem_free can refuse a pointer it did not hand out or
 * the wrong size without touching anything. SYMPOOL_HOST_FAIL_AFTER=N makes the Nth mem_alloc
 * call since init fail with OOM, once.
 *
 * Virtual memory (expandable segments). vmm_reserve makes a PROT_NONE, MAP_NORESERVE mapping
 * (address space only); vmm_map makes pages of it read-write and counts them against the budget
 * like mem_alloc (and as one allocation call for FAIL_AFTER); vmm_unmap maps PROT_NONE over them
 * again (MAP_FIXED), which drops their contents and gives the bytes back. Each reservation keeps
 * one byte per page saying whether it is mapped, so a map over a mapped page or an unmap of an
 * unmapped one is refused without changing anything.
 *
 * Arena (SYMPOOL_HOST_ARENA, for replay). Replay never touches device memory, and one mmap plus
 * one munmap per segment was most of its time. With the arena on, each device reserves one large
 * PROT_NONE range at init and mem_alloc/vmm_reserve carve address space out of it: a bump pointer
 * plus, per exact size, a stack of ranges freed earlier. No system call per segment, and the same
 * budget, OOM and fault-injection rules; the memory is not accessible. When the arena is full,
 * allocations fall back to mmap.
 *
 * Placement (sp_x_host_place, for replay). Among free blocks of one size the allocator takes the
 * lowest address, as PyTorch's does, so a replay decides as the recorded run did only if its
 * segments sort as the recorded GPU's did. Replay therefore says, before an event that made a
 * segment in the recorded run, where that segment was (as an offset from the lowest recorded
 * address); the next mem_alloc of exactly that size takes that range of the arena's upper half
 * (the placement region) if no live placed range overlaps it, else the bump pointer as before.
 * From the first placement on, the bump pointer stays in the lower half.
 *
 * Streams and events. Host work is done by the time a call returns, but the allocator must see
 * the same *ordering* it sees on a GPU: an event recorded on stream S is not complete until S
 * has been synchronized after the record. Each stream therefore counts records (`recorded`) and
 * the prefix of them known complete (`completed`); an event remembers its stream and sequence
 * number and is done once completed >= seq. Every handle is registered in a per-device hash,
 * so an unknown handle is rejected without being dereferenced. Events are pooled per device.
 *
 * Stream handles. The free set orders blocks by (stream, size, address) with the stream compared
 * by handle, as PyTorch compares cudaStream_t values. Handles that were heap addresses ordered
 * streams by where malloc put their structs, so that one build or run picked another block than
 * the next (`sympool replay` of a trace with several streams). A handle is therefore
 * a token, never dereferenced: (id << 14) | (device << 4), id the lowest number free on the device
 * (1, 2, ...; a destroyed stream's id is free again, as CUDA may give a destroyed stream's handle
 * to the next one). Streams made while none is destroyed compare in the order they were made,
 * whatever the heap: replay makes its streams in the order of the recorded cudaStream_t values.
 *
 * Lock: one mutex per device guards everything of that device (budget, mapping hash, streams,
 * events). mmap/munmap run outside it. One atomic flag (the arena's place_idle, a copy of what
 * the lock guards) lets a placement clear with nothing to clear return without the lock. `g_host`
 * itself is written only by init/fini, which sp__device_select serializes.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/core.h"
#include "core/gap_array.h"
#include "pool/device/device.h"

/* Placements that may wait at once on a device (one event made at most a few segments). */
#define SP_HOST_PLACE_WAIT 16
/* The placement region starts at this alignment, the recorded segments' largest. */
#define SP_HOST_PLACE_ALIGN ((uintptr_t)2 << 20)

/* ---- a small pointer hash (open addressing, linear probing, backward-shift delete) ------- */

typedef struct phash {
    uintptr_t *keys; /* 0 = empty slot; device lock */
    uint64_t *vals;  /* value per key; device lock */
    size_t cap;      /* slots, a power of two (0 before first insert); device lock */
    size_t count;    /* occupied slots; device lock */
    size_t first;    /* slots of the first table, 0 for 64 (const) */
} phash_t;

static size_t phash_slot(const phash_t *h, uintptr_t key) {
    uint64_t x = (uint64_t)key;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (h->cap - 1);
}

static bool phash_find(const phash_t *h, uintptr_t key, uint64_t *val_p) {
    if (h->cap == 0)
        return false;
    for (size_t i = phash_slot(h, key);; i = (i + 1) & (h->cap - 1)) {
        if (h->keys[i] == 0)
            return false;
        if (h->keys[i] == key) {
            if (val_p)
                *val_p = h->vals[i];
            return true;
        }
    }
}

static void phash_put_raw(phash_t *h, uintptr_t key, uint64_t val) {
    size_t i = phash_slot(h, key);
    while (h->keys[i] != 0 && h->keys[i] != key)
        i = (i + 1) & (h->cap - 1);
    if (h->keys[i] == 0)
        h->count++;
    h->keys[i] = key;
    h->vals[i] = val;
}

/* Insert or overwrite; false only when growing the table fails (nothing changed then). */
static bool phash_put(phash_t *h, uintptr_t key, uint64_t val) {
    if ((h->count + 1) * 2 > h->cap) {
        size_t ncap = h->cap ? h->cap * 2 : h->first ? h->first : 64;
        uintptr_t *nk = calloc(ncap, sizeof(*nk));
        uint64_t *nv = calloc(ncap, sizeof(*nv));
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return false;
        }
        phash_t old = *h;
        h->keys = nk;
        h->vals = nv;
        h->cap = ncap;
        h->count = 0;
        for (size_t i = 0; i < old.cap; i++)
            if (old.keys[i] != 0)
                phash_put_raw(h, old.keys[i], old.vals[i]);
        free(old.keys);
        free(old.vals);
    }
    phash_put_raw(h, key, val);
    return true;
}

/* The slot holding key, or SIZE_MAX when it is absent. */
static size_t phash_index(const phash_t *h, uintptr_t key) {
    if (h->cap == 0)
        return SIZE_MAX;
    size_t mask = h->cap - 1, i = phash_slot(h, key);
    while (h->keys[i] != key) {
        if (h->keys[i] == 0)
            return SIZE_MAX;
        i = (i + 1) & mask;
    }
    return i;
}

/* Empty the occupied slot i. Backward-shift deletion keeps every probe chain unbroken without
 * tombstones. */
static void phash_del_at(phash_t *h, size_t i) {
    size_t mask = h->cap - 1;
    for (size_t j = (i + 1) & mask; h->keys[j] != 0; j = (j + 1) & mask) {
        size_t home = phash_slot(h, h->keys[j]);
        bool movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            h->keys[i] = h->keys[j];
            h->vals[i] = h->vals[j];
            i = j;
        }
    }
    h->keys[i] = 0;
    h->count--;
}

static bool phash_del(phash_t *h, uintptr_t key) {
    size_t i = phash_index(h, key);
    if (i == SIZE_MAX)
        return false;
    phash_del_at(h, i);
    return true;
}

static void phash_free(phash_t *h) {
    free(h->keys);
    free(h->vals);
    size_t first = h->first;
    memset(h, 0, sizeof(*h));
    h->first = first;
}

/* ---- state -------------------------------------------------------------------------------- */

/* A stream handle: its id above the device (SYMPOOL_HOST_DEVICES <= 1024: 10 bits), and the low
 * four bits clear as in an aligned pointer; never 0, 1 or 2 (NULL and CUDA's pseudo handles). */
#define HOST_STREAM_ID_SHIFT 14
#define HOST_STREAM_DEV_SHIFT 4

typedef struct host_stream {
    int device;         /* owner device; immutable */
    uint64_t recorded;  /* events recorded on this stream so far; device lock */
    uint64_t completed; /* records [1, completed] are complete; device lock */
    size_t events;      /* live events whose last record is on this stream; device lock */
} host_stream_t;

typedef struct host_event {
    host_stream_t *stream;   /* stream of the last record, NULL if never recorded; device lock */
    uint64_t seq;            /* the record's sequence number on `stream`; device lock */
    struct host_event *next; /* free-list link while pooled; device lock */
} host_event_t;

/* A vmm_reserve'd range. */
typedef struct host_resv {
    uintptr_t base;  /* start (page aligned); mu */
    size_t size;     /* bytes, npages * page; mu */
    size_t page;     /* mapping unit in bytes; mu */
    uint8_t *mapped; /* [npages]: 1 when the page is mapped; mu */
} host_resv_t;

/* Address space carved from the device's arena (see the top of the file). */
typedef struct host_arena {
    uintptr_t base;   /* start of the reservation, 0 when there is no arena; mu */
    size_t size;      /* bytes reserved; mu */
    size_t used;      /* bump offset; mu */
    phash_t free_top; /* size -> 1 + index of the top node of its stack of freed ranges; mu */
    uintptr_t *naddr; /* node address, [nnodes]; mu */
    uint32_t *nnext;  /* node link: 1 + index of the next node, 0 = end; mu */
    size_t nnodes;    /* nodes in use or on the spare list; mu */
    size_t cap_nodes; /* capacity of naddr/nnext; mu */
    uint32_t spare;   /* 1 + index of the first spare node, 0 = none; mu */
    size_t bump_max;  /* the bump pointer's limit: size, or size / 2 once placement began; mu */
    /* Placement: what waits for the next mem_alloc of its size, oldest first, and the live
     * placed ranges by address. */
    struct {
        size_t size;
        uint64_t offset;
    } wait[SP_HOST_PLACE_WAIT];
    int nwait; /* mu */
    /* Placement began and nothing waits, so a clear (sp__host_place of size 0) has nothing to
     * do: replay clears after every allocation that made a segment, and that clear was a lock
     * pair each. Written under mu after every change of nwait or bump_max (place_note); read
     * without it. */
    _Atomic bool place_idle;
    /* Live placed ranges: {start, size} by start, kept with their free room where the last
     * change was (core/gap_array.h: a replay's new segments mostly sort beside the last new
     * one); mu */
    sp_gap_array_t placed;
} host_arena_t;

typedef struct host_dev {
    pthread_mutex_t mu;           /* guards every field below */
    host_resv_t *resv;            /* live reservations, unordered; mu */
    size_t nresv;                 /* mu */
    size_t cap_resv;              /* mu */
    host_arena_t arena;           /* mu */
    size_t capacity;              /* byte budget; immutable after init */
    size_t live_bytes;            /* bytes handed out (incl. reservations in flight); mu */
    size_t live_count;            /* live mappings; mu */
    phash_t maps;                 /* live mapping pointer -> size; mu */
    phash_t streams;              /* live stream handle -> its host_stream_t *; mu */
    uint64_t *stream_ids;         /* bit i set: id i + 1 names a live stream; mu */
    size_t stream_id_words;       /* words in stream_ids; mu */
    size_t stream_id_full;        /* words below this one have every bit set; mu */
    phash_t events;               /* live (handed out) host_event_t *; mu */
    host_stream_t default_stream; /* the NULL stream of this device; mu */
    host_event_t *free_events;    /* pooled events; mu */
} host_dev_t;

static struct {
    int count;                /* devices; set by init, 0 when not initialized */
    host_dev_t *devs;         /* [count]; set by init */
    size_t page;              /* page size in bytes */
    long fail_after;          /* SYMPOOL_HOST_FAIL_AFTER; 0 = never */
    _Atomic long alloc_calls; /* mem_alloc calls since init */
    size_t maps_first;        /* the mapping tables' first size at init, from the last
                                 session's (0: 64 slots); init and fini only */
} g_host;

static sp_status_t get_dev(int device, host_dev_t **dev_p) {
    if (SP_UNLIKELY(device < 0 || device >= g_host.count))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "host device %d does not exist (SYMPOOL_HOST_DEVICES=%d)", device,
                         g_host.count);
    *dev_p = &g_host.devs[device];
    return SP_SUCCESS;
}

/* The stream a handle names on `dev` (NULL -> default stream); caller holds dev->mu. */
static host_stream_t *lookup_stream(host_dev_t *dev, sp_dev_stream_t stream) {
    if (stream == NULL)
        return &dev->default_stream;
    uint64_t v = 0;
    return phash_find(&dev->streams, (uintptr_t)stream, &v) ? (host_stream_t *)(uintptr_t)v : NULL;
}

/* The lowest stream id free on dev, marked taken; 0 when its bitmap cannot grow. dev->mu held.
 * A scan from the first word with a free bit: streams are made seldom, and ids stay dense. */
static uint64_t stream_id_take(host_dev_t *dev) {
    size_t w = dev->stream_id_full;
    while (w < dev->stream_id_words && dev->stream_ids[w] == UINT64_MAX)
        w++;
    dev->stream_id_full = w;
    if (w == dev->stream_id_words) {
        size_t nw = w ? w * 2 : 1;
        uint64_t *grown = realloc(dev->stream_ids, nw * sizeof(*grown));
        if (grown == NULL)
            return 0;
        memset(grown + w, 0, (nw - w) * sizeof(*grown));
        dev->stream_ids = grown;
        dev->stream_id_words = nw;
    }
    int bit = __builtin_ctzll(~dev->stream_ids[w]);
    dev->stream_ids[w] |= (uint64_t)1 << bit;
    return (uint64_t)w * 64 + (uint64_t)bit + 1;
}

/* Gives a destroyed stream's id back (the next stream made may get it). dev->mu held. */
static void stream_id_give(host_dev_t *dev, uint64_t id) {
    size_t w = (size_t)((id - 1) / 64);
    dev->stream_ids[w] &= ~((uint64_t)1 << ((id - 1) % 64));
    if (w < dev->stream_id_full)
        dev->stream_id_full = w;
}

/* ---- the arena (SYMPOOL_HOST_ARENA) -------------------------------------------------------- */

static size_t page_up(size_t n) {
    return (n + g_host.page - 1) & ~(g_host.page - 1);
}

static bool arena_owns(const host_arena_t *a, uintptr_t p) {
    return a->base != 0 && p >= a->base && p < a->base + a->size;
}

/* Overwrite the value of a key known to be present (no growth, so it cannot fail). */
static void phash_update(phash_t *h, uintptr_t key, uint64_t val) {
    for (size_t i = phash_slot(h, key);; i = (i + 1) & (h->cap - 1)) {
        if (h->keys[i] == key) {
            h->vals[i] = val;
            return;
        }
    }
}

/* Carve `size` bytes (dev->mu held): the last range of exactly this size freed, else fresh
 * space at the bump pointer. 0 when there is no arena or it is full. */
static uintptr_t arena_take(host_arena_t *a, size_t size) {
    if (a->base == 0)
        return 0;
    uint64_t top = 0;
    if (phash_find(&a->free_top, (uintptr_t)size, &top)) {
        uint32_t i = (uint32_t)top - 1;
        uintptr_t p = a->naddr[i];
        if (a->nnext[i])
            phash_update(&a->free_top, (uintptr_t)size, a->nnext[i]);
        else
            phash_del(&a->free_top, (uintptr_t)size);
        a->nnext[i] = a->spare;
        a->spare = i + 1;
        return p;
    }
    size_t need = page_up(size);
    if (need > a->bump_max - a->used)
        return 0;
    uintptr_t p = a->base + a->used;
    a->used += need;
    return p;
}

/* Return a carved range (dev->mu held). Without host memory for the bookkeeping the range is
 * simply not reused: it is address space only. */
static void arena_give(host_arena_t *a, uintptr_t p, size_t size) {
    uint32_t i;
    if (a->spare) {
        i = a->spare - 1;
        a->spare = a->nnext[i];
    } else {
        if (a->nnodes == a->cap_nodes) {
            size_t ncap = a->cap_nodes ? a->cap_nodes * 2 : 256;
            uintptr_t *na = realloc(a->naddr, ncap * sizeof(*na));
            if (na)
                a->naddr = na;
            uint32_t *nn = na ? realloc(a->nnext, ncap * sizeof(*nn)) : NULL;
            if (nn)
                a->nnext = nn;
            if (!na || !nn)
                return;
            a->cap_nodes = ncap;
        }
        i = (uint32_t)a->nnodes++;
    }
    uint64_t top = 0;
    (void)phash_find(&a->free_top, (uintptr_t)size, &top);
    if (!phash_put(&a->free_top, (uintptr_t)size, (uint64_t)i + 1)) {
        a->nnext[i] = a->spare;
        a->spare = i + 1;
        return;
    }
    a->naddr[i] = p;
    a->nnext[i] = (uint32_t)top;
}

/* Reserve the arena of one device: 16 x capacity of address space, less if the kernel refuses,
 * never less than the capacity itself (then no arena: mmap per allocation, as without it). */
static void arena_init(host_arena_t *a, size_t capacity, int ndev) {
    size_t want = capacity > SIZE_MAX / 16 ? SIZE_MAX : capacity * 16;
    size_t cap_all = ((size_t)64 << 40) / (size_t)ndev; /* 64 TiB for all devices together */
    if (want > cap_all)
        want = cap_all;
    for (size_t sz = page_up(want); sz >= capacity && sz > 0; sz = page_up(sz / 2)) {
        void *p = mmap(NULL, sz, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
            a->base = (uintptr_t)p;
            a->size = sz;
            a->bump_max = sz;
            return;
        }
    }
    SP_INFO(SP_SUB_DEVICE, "host arena: cannot reserve address space; using mmap per allocation");
}

static void arena_fini(host_arena_t *a) {
    if (a->base)
        munmap((void *)a->base, a->size);
    phash_free(&a->free_top);
    free(a->naddr);
    free(a->nnext);
    sp__gap_free(&a->placed);
    memset(a, 0, sizeof(*a));
}

/* ---- placement (see the top of the file) -------------------------------------------------- */

/* Where the placement region starts: the upper half of the arena, aligned. */
static uintptr_t place_base(const host_arena_t *a) {
    return (a->base + a->size / 2 + SP_HOST_PLACE_ALIGN - 1) & ~(SP_HOST_PLACE_ALIGN - 1);
}

static bool place_owns(const host_arena_t *a, uintptr_t p) {
    return a->base != 0 && a->bump_max < a->size && p >= place_base(a) && p < a->base + a->size;
}

/* The index of the first live placed range that starts at or after p. */
static uint32_t placed_lower(const host_arena_t *a, uintptr_t p) {
    return sp__gap_lower(&a->placed, p);
}

/* Keep place_idle in step with nwait and bump_max (dev->mu held). */
static void place_note(host_arena_t *a) {
    atomic_store_explicit(&a->place_idle, a->bump_max < a->size && a->nwait == 0,
                          memory_order_release);
}

/* The oldest placement waiting for `size` bytes, taken off the queue: its address, now a live
 * placed range, if the range lies in the region and overlaps no live one; else 0 (the caller
 * carves as before). dev->mu held. */
static uintptr_t place_take(host_arena_t *a, size_t size) {
    int i = 0;
    while (i < a->nwait && a->wait[i].size != size)
        i++;
    if (i == a->nwait)
        return 0;
    uint64_t off = a->wait[i].offset;
    memmove(&a->wait[i], &a->wait[i + 1], (size_t)(a->nwait - i - 1) * sizeof(a->wait[0]));
    a->nwait--;
    place_note(a);
    uintptr_t lo = place_base(a), end = a->base + a->size;
    if (off > end - lo || size > end - lo - off)
        return 0;
    uintptr_t p = lo + (uintptr_t)off;
    uint32_t k = placed_lower(a, p);
    const sp_gap_array_t *pl = &a->placed;
    if ((k < pl->n && sp__gap_at(pl, k)->key - p < size) ||
        (k > 0 && sp__gap_at(pl, k - 1)->key + sp__gap_at(pl, k - 1)->val > p))
        return 0;
    if (!sp__gap_insert(&a->placed, k, p, size))
        return 0; /* no room to remember it: carved as before */
    return p;
}

/* A live placed range is freed (dev->mu held). */
static void place_drop(host_arena_t *a, uintptr_t p) {
    uint32_t k = placed_lower(a, p);
    if (k == a->placed.n || sp__gap_at(&a->placed, k)->key != p)
        return;
    sp__gap_remove(&a->placed, k, 1);
}

/* A range the arena handed out comes back (dev->mu held). */
static void arena_return(host_arena_t *a, uintptr_t p, size_t size) {
    if (place_owns(a, p))
        place_drop(a, p);
    else
        arena_give(a, p, size);
}

sp_status_t sp__host_place(int device, size_t size, uint64_t offset) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    /* Device memory starts 512-byte aligned (the allocator's blocks rely on it). */
    if (offset % 512 != 0)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "host device %d: placement offset %llu is not a multiple of 512", device,
                         (unsigned long long)offset);
    host_arena_t *a = &dev->arena;
    /* A clear with nothing to clear answers as the locked path would (an arena, placement
     * begun): success, nothing changed. A placement another thread queues meanwhile is ordered
     * after this clear, as it would be had the clear taken the lock first. */
    if (size == 0 && atomic_load_explicit(&a->place_idle, memory_order_acquire))
        return SP_SUCCESS;
    pthread_mutex_lock(&dev->mu);
    sp_status_t st = SP_SUCCESS;
    if (a->base == 0) {
        st = sp__error_quiet(SP_ERR_NOT_SUPPORTED, SP_SUB_DEVICE,
                             "host device %d has no arena (SYMPOOL_HOST_ARENA) to place memory in",
                             device);
    } else if (a->bump_max == a->size) { /* the first placement: the bump pointer steps aside */
        size_t half = place_base(a) - a->base;
        if (half >= a->size || a->used > half)
            st = sp__error_quiet(SP_ERR_NOT_SUPPORTED, SP_SUB_DEVICE,
                                 "host device %d: its arena is used past its half; no placement",
                                 device);
        else
            a->bump_max = half;
    }
    if (st == SP_SUCCESS && size == 0) {
        a->nwait = 0;
    } else if (st == SP_SUCCESS) {
        if (a->nwait == SP_HOST_PLACE_WAIT) { /* the oldest gives way */
            memmove(&a->wait[0], &a->wait[1], (size_t)(a->nwait - 1) * sizeof(a->wait[0]));
            a->nwait--;
        }
        a->wait[a->nwait].size = size;
        a->wait[a->nwait].offset = offset;
        a->nwait++;
    }
    place_note(a);
    pthread_mutex_unlock(&dev->mu);
    return st;
}

/* ---- init / fini -------------------------------------------------------------------------- */

static sp_status_t host_init(sp_device_caps_t *caps_p) {
    int64_t ndev = sp__option_int(SP_OPT_HOST_DEVICES);
    int64_t cap = sp__option_int(SP_OPT_HOST_CAPACITY);
    int64_t fail_after = sp__option_int(SP_OPT_HOST_FAIL_AFTER);
    if (ndev < 1 || ndev > 1024)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "SYMPOOL_HOST_DEVICES=%lld is out of range (1..1024)", (long long)ndev);
    if (cap <= 0)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "SYMPOOL_HOST_CAPACITY must be > 0 bytes");
    host_dev_t *devs = calloc((size_t)ndev, sizeof(*devs));
    if (!devs)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE, "cannot allocate %lld host devices",
                         (long long)ndev);
    for (int d = 0; d < (int)ndev; d++) {
        pthread_mutex_init(&devs[d].mu, NULL);
        devs[d].capacity = (size_t)cap;
        devs[d].default_stream.device = d;
        /* A replay's device holds hundreds to a few thousand segments (the real traces in
         * bench/: up to ~1,500 at once): a table of 64 slots doubled five or six times, each a
         * rehash, inside every replay's event loop (sp_shutdown ends the backend, so each
         * --repeat grows it again). Where this one starts comes from how far the last session's
         * grew (host_fini): a fixed 4096 slots (64 KiB zeroed at every start) cost a replay of a
         * few dozen events more than its whole loop. */
        devs[d].maps.first = g_host.maps_first;
    }
    long pg = sysconf(_SC_PAGESIZE);
    g_host.page = pg > 0 ? (size_t)pg : 4096;
    g_host.devs = devs;
    g_host.count = (int)ndev;
    g_host.fail_after = fail_after > 0 ? (long)fail_after : 0;
    atomic_store(&g_host.alloc_calls, 0);
    if (sp__option_int(SP_OPT_HOST_ARENA))
        for (int d = 0; d < (int)ndev; d++)
            arena_init(&devs[d].arena, (size_t)cap, (int)ndev);

    sp_device_caps_t caps = {0};
    caps.device_count = g_host.count;
    caps.granularity = g_host.page;
    caps.has_vmm = true;
    caps.vmm_granularity = g_host.page;
    caps.is_emulated = true;
    SP_INFO(SP_SUB_DEVICE, "host backend: %d device(s) of %zu bytes, fail_after=%ld, arena %s",
            g_host.count, (size_t)cap, g_host.fail_after, devs[0].arena.base ? "on" : "off");
    *caps_p = caps;
    return SP_SUCCESS;
}

static void host_fini(void) {
    size_t maps_first = 0; /* where the next session's mapping tables start (see below) */
    for (int d = 0; d < g_host.count; d++) {
        host_dev_t *dev = &g_host.devs[d];
        if (dev->live_count > 0)
            SP_INFO(SP_SUB_DEVICE,
                    "host device %d: unmapping %zu leftover allocation(s), %zu bytes", d,
                    dev->live_count, dev->live_bytes);
        for (size_t i = 0; i < dev->maps.cap; i++)
            if (dev->maps.keys[i] != 0 && !arena_owns(&dev->arena, dev->maps.keys[i]))
                munmap((void *)dev->maps.keys[i], (size_t)dev->maps.vals[i]);
        for (size_t i = 0; i < dev->nresv; i++) {
            if (!arena_owns(&dev->arena, dev->resv[i].base))
                munmap((void *)dev->resv[i].base, dev->resv[i].size + g_host.page);
            free(dev->resv[i].mapped);
        }
        free(dev->resv);
        arena_fini(&dev->arena);
        for (size_t i = 0; i < dev->streams.cap; i++)
            if (dev->streams.keys[i] != 0)
                free((void *)(uintptr_t)dev->streams.vals[i]);
        free(dev->stream_ids);
        for (size_t i = 0; i < dev->events.cap; i++)
            if (dev->events.keys[i] != 0)
                free((void *)dev->events.keys[i]);
        while (dev->free_events) {
            host_event_t *e = dev->free_events;
            dev->free_events = e->next;
            free(e);
        }
        /* A table that grew this session: the next starts at twice its size (a quarter full at
         * most, as a fixed 4096 slots kept the large traces' tables; a table started where the
         * last one ended was half full and its probes longer: kk256f and kk512full's loops
         * 2-3% slower); one that did not grow keeps its start. */
        size_t start = dev->maps.first ? dev->maps.first : 64;
        size_t next = dev->maps.cap > start ? dev->maps.cap * 2 : dev->maps.first;
        if (next > maps_first)
            maps_first = next;
        phash_free(&dev->maps);
        phash_free(&dev->streams);
        phash_free(&dev->events);
        pthread_mutex_destroy(&dev->mu);
    }
    free(g_host.devs);
    g_host.devs = NULL;
    g_host.count = 0;
    g_host.maps_first = maps_first;
}

/* ---- memory ------------------------------------------------------------------------------- */

static sp_status_t host_mem_alloc(int device, size_t size, void **ptr_p) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    if (SP_UNLIKELY(size == 0))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE, "mem_alloc of 0 bytes");
    long call = atomic_fetch_add(&g_host.alloc_calls, 1) + 1;
    if (g_host.fail_after > 0 && call == g_host.fail_after)
        return sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_DEVICE,
                               "host device %d: injected failure of mem_alloc call %ld "
                               "(SYMPOOL_HOST_FAIL_AFTER)",
                               device, call);

    /* Reserve the bytes first so that concurrent callers never overshoot the budget. */
    pthread_mutex_lock(&dev->mu);
    if (size > dev->capacity - dev->live_bytes) {
        size_t live = dev->live_bytes;
        pthread_mutex_unlock(&dev->mu);
        return sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_DEVICE,
                               "host device %d: cannot allocate %zu bytes (%zu of %zu in use)",
                               device, size, live, dev->capacity);
    }
    dev->live_bytes += size;
    uintptr_t carved = dev->arena.nwait > 0 ? place_take(&dev->arena, size) : 0;
    if (!carved)
        carved = arena_take(&dev->arena, size);
    if (carved) {
        bool put = phash_put(&dev->maps, carved, (uint64_t)size);
        if (put)
            dev->live_count++;
        else {
            arena_return(&dev->arena, carved, size);
            dev->live_bytes -= size;
        }
        pthread_mutex_unlock(&dev->mu);
        if (!put)
            return sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE,
                             "host device %d: out of host memory for the mapping table", device);
        *ptr_p = (void *)carved;
        return SP_SUCCESS;
    }
    pthread_mutex_unlock(&dev->mu);

    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        pthread_mutex_lock(&dev->mu);
        dev->live_bytes -= size;
        pthread_mutex_unlock(&dev->mu);
        /* The address space or the map count ran out: to the allocator this is an OOM it can
         * answer by freeing its cache. */
        return sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_DEVICE,
                               "host device %d: mmap of %zu bytes failed: %s", device, size,
                               strerror(err));
    }
    pthread_mutex_lock(&dev->mu);
    bool ok = phash_put(&dev->maps, (uintptr_t)p, (uint64_t)size);
    if (ok)
        dev->live_count++;
    else
        dev->live_bytes -= size;
    pthread_mutex_unlock(&dev->mu);
    if (!ok) {
        munmap(p, size);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE,
                         "host device %d: out of host memory for "
                         "the mapping table",
                         device);
    }
    *ptr_p = p;
    return SP_SUCCESS;
}

static sp_status_t host_mem_free(int device, void *ptr, size_t size) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    pthread_mutex_lock(&dev->mu);
    /* One probe finds, checks and deletes the mapping. */
    size_t slot = phash_index(&dev->maps, (uintptr_t)ptr);
    if (slot == SIZE_MAX) {
        pthread_mutex_unlock(&dev->mu);
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_DEVICE,
                         "host device %d: mem_free of %p, which is not a live allocation of this "
                         "device (double free or foreign pointer)",
                         device, ptr);
    }
    uint64_t have = dev->maps.vals[slot];
    if (have != (uint64_t)size) {
        pthread_mutex_unlock(&dev->mu);
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_DEVICE,
                         "host device %d: mem_free of %p with size %zu, but it was allocated with "
                         "%llu bytes",
                         device, ptr, size, (unsigned long long)have);
    }
    phash_del_at(&dev->maps, slot);
    dev->live_count--;
    if (arena_owns(&dev->arena, (uintptr_t)ptr)) {
        arena_return(&dev->arena, (uintptr_t)ptr, size);
        dev->live_bytes -= size;
        pthread_mutex_unlock(&dev->mu);
        return SP_SUCCESS;
    }
    /* Keep the bytes counted until the unmap is done, so a racing alloc cannot exceed the
     * budget in real address space either. */
    pthread_mutex_unlock(&dev->mu);
    if (munmap(ptr, size) != 0)
        SP_WARN(SP_SUB_DEVICE, "host device %d: munmap(%p, %zu) failed: %s", device, ptr, size,
                strerror(errno));
    pthread_mutex_lock(&dev->mu);
    dev->live_bytes -= size;
    pthread_mutex_unlock(&dev->mu);
    return SP_SUCCESS;
}

static sp_status_t host_mem_get_info(int device, size_t *free_p, size_t *total_p) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    pthread_mutex_lock(&dev->mu);
    size_t free_bytes = dev->capacity - dev->live_bytes;
    pthread_mutex_unlock(&dev->mu);
    *free_p = free_bytes;
    *total_p = dev->capacity;
    return SP_SUCCESS;
}

static sp_status_t host_mem_total(int device, size_t *total_p) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    *total_p = dev->capacity; /* fixed at init */
    return SP_SUCCESS;
}

/* ---- streams ------------------------------------------------------------------------------ */

static sp_status_t host_stream_create(int device, sp_dev_stream_t *stream_p) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    host_stream_t *s = calloc(1, sizeof(*s));
    if (!s)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE, "cannot allocate a host stream");
    s->device = device;
    pthread_mutex_lock(&dev->mu);
    uint64_t id = stream_id_take(dev);
    uintptr_t handle =
        (uintptr_t)(id << HOST_STREAM_ID_SHIFT) | ((uintptr_t)device << HOST_STREAM_DEV_SHIFT);
    bool ok = id != 0 && phash_put(&dev->streams, handle, (uint64_t)(uintptr_t)s);
    if (!ok && id != 0)
        stream_id_give(dev, id);
    pthread_mutex_unlock(&dev->mu);
    if (!ok) {
        free(s);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE, "cannot register a host stream");
    }
    *stream_p = (sp_dev_stream_t)handle;
    return SP_SUCCESS;
}

static sp_status_t host_stream_destroy(int device, sp_dev_stream_t stream) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    pthread_mutex_lock(&dev->mu);
    host_stream_t *s = stream != NULL ? lookup_stream(dev, stream) : NULL;
    if (s == NULL) {
        pthread_mutex_unlock(&dev->mu);
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "host device %d: stream_destroy of unknown stream %p", device, stream);
    }
    (void)phash_del(&dev->streams, (uintptr_t)stream);
    stream_id_give(dev, (uint64_t)(uintptr_t)stream >> HOST_STREAM_ID_SHIFT);
    /* Destroying a stream lets its queued work finish (as cudaStreamDestroy does): events still
     * pointing at it become complete and forget it, so nothing dangles. Only live events can
     * (a destroyed one forgets its stream), and the stream counts them: most destroys have none
     * and walk nothing (a walk of every event a destroy was quadratic in streams). */
    for (size_t i = 0; s->events && i < dev->events.cap; i++) {
        host_event_t *e = (host_event_t *)dev->events.keys[i];
        if (e && e->stream == s) {
            e->stream = NULL;
            s->events--;
        }
    }
    pthread_mutex_unlock(&dev->mu);
    free(s);
    return SP_SUCCESS;
}

/* The emulated device has no graphs: nothing ever captures. */
static sp_status_t host_stream_capturing(int device, sp_dev_stream_t stream, bool *capturing_p) {
    (void)device;
    (void)stream;
    *capturing_p = false;
    return SP_SUCCESS;
}

static sp_status_t host_stream_sync(int device, sp_dev_stream_t stream) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    pthread_mutex_lock(&dev->mu);
    host_stream_t *s = lookup_stream(dev, stream);
    if (s)
        s->completed = s->recorded;
    pthread_mutex_unlock(&dev->mu);
    if (!s)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "host device %d: stream_sync of unknown stream %p", device, stream);
    return SP_SUCCESS;
}

static sp_status_t host_device_sync(int device) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    pthread_mutex_lock(&dev->mu);
    dev->default_stream.completed = dev->default_stream.recorded;
    for (size_t i = 0; i < dev->streams.cap; i++) {
        host_stream_t *st = (host_stream_t *)(uintptr_t)dev->streams.vals[i];
        if (dev->streams.keys[i] != 0)
            st->completed = st->recorded;
    }
    pthread_mutex_unlock(&dev->mu);
    return SP_SUCCESS;
}

static sp_status_t host_stream_device(sp_dev_stream_t stream, int *device_p) {
    for (int d = 0; d < g_host.count; d++) {
        host_dev_t *dev = &g_host.devs[d];
        pthread_mutex_lock(&dev->mu);
        bool found = stream != NULL && phash_find(&dev->streams, (uintptr_t)stream, NULL);
        pthread_mutex_unlock(&dev->mu);
        if (found) {
            *device_p = d;
            return SP_SUCCESS;
        }
    }
    return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                     "%p is not a stream of the host backend", stream);
}

/* ---- events ------------------------------------------------------------------------------- */

static sp_status_t host_event_create(int device, sp_dev_event_t *event_p) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    pthread_mutex_lock(&dev->mu);
    host_event_t *e = dev->free_events;
    if (e)
        dev->free_events = e->next;
    pthread_mutex_unlock(&dev->mu);
    if (!e && !(e = malloc(sizeof(*e))))
        return sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE, "cannot allocate a host event");
    e->stream = NULL; /* a never-recorded event is complete, as in CUDA */
    e->seq = 0;
    e->next = NULL;
    pthread_mutex_lock(&dev->mu);
    bool ok = phash_put(&dev->events, (uintptr_t)e, 1);
    if (!ok) {
        e->next = dev->free_events;
        dev->free_events = e;
    }
    pthread_mutex_unlock(&dev->mu);
    if (!ok)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE, "cannot register a host event");
    *event_p = e;
    return SP_SUCCESS;
}

static sp_status_t host_event_destroy(int device, sp_dev_event_t event) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    pthread_mutex_lock(&dev->mu);
    bool ok = phash_del(&dev->events, (uintptr_t)event);
    if (ok) {
        host_event_t *e = event;
        if (e->stream)
            e->stream->events--;
        e->stream = NULL;
        e->next = dev->free_events;
        dev->free_events = e;
    }
    pthread_mutex_unlock(&dev->mu);
    if (!ok)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "host device %d: event_destroy of unknown event %p", device, event);
    return SP_SUCCESS;
}

static sp_status_t host_event_record(int device, sp_dev_event_t event, sp_dev_stream_t stream) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    pthread_mutex_lock(&dev->mu);
    host_stream_t *s = lookup_stream(dev, stream);
    bool known = phash_find(&dev->events, (uintptr_t)event, NULL);
    if (s && known) {
        host_event_t *e = event;
        if (e->stream)
            e->stream->events--;
        e->stream = s;
        s->events++;
        e->seq = ++s->recorded;
    }
    pthread_mutex_unlock(&dev->mu);
    if (!known)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "host device %d: event_record of unknown event %p", device, event);
    if (!s)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "host device %d: event_record on unknown stream %p", device, stream);
    return SP_SUCCESS;
}

static sp_status_t host_event_query(int device, sp_dev_event_t event, bool *done_p) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    pthread_mutex_lock(&dev->mu);
    bool known = phash_find(&dev->events, (uintptr_t)event, NULL);
    bool done = false;
    if (known) {
        host_event_t *e = event;
        done = e->stream == NULL || e->stream->completed >= e->seq;
    }
    pthread_mutex_unlock(&dev->mu);
    if (!known)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "host device %d: event_query of unknown event %p", device, event);
    *done_p = done;
    return SP_SUCCESS;
}

static sp_status_t host_event_sync(int device, sp_dev_event_t event) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    pthread_mutex_lock(&dev->mu);
    bool known = phash_find(&dev->events, (uintptr_t)event, NULL);
    if (known) {
        /* Waiting for the event completes its stream up to the record point (host work is
         * already done); later records on that stream stay pending. */
        host_event_t *e = event;
        if (e->stream && e->stream->completed < e->seq)
            e->stream->completed = e->seq;
    }
    pthread_mutex_unlock(&dev->mu);
    if (!known)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "host device %d: event_sync of unknown event %p", device, event);
    return SP_SUCCESS;
}

static sp_status_t host_memcpy_async(int device, void *dst, const void *src, size_t bytes,
                                     sp_dev_stream_t stream) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    if (stream != NULL) {
        pthread_mutex_lock(&dev->mu);
        bool known = phash_find(&dev->streams, (uintptr_t)stream, NULL);
        pthread_mutex_unlock(&dev->mu);
        if (!known)
            return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                             "host device %d: memcpy_async on unknown stream %p", device, stream);
    }
    if (bytes > 0)
        memmove(dst, src, bytes);
    return SP_SUCCESS;
}

/* ---- virtual memory ------------------------------------------------------------------------ */

/* The reservation containing addr (dev->mu held), or NULL. */
static host_resv_t *find_resv(host_dev_t *dev, uintptr_t addr) {
    for (size_t i = 0; i < dev->nresv; i++)
        if (addr >= dev->resv[i].base && addr < dev->resv[i].base + dev->resv[i].size)
            return &dev->resv[i];
    return NULL;
}

static sp_status_t host_vmm_reserve(int device, size_t size, size_t page, void **base_p) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    if (page == 0 || page % g_host.page != 0 || size == 0 || size % page != 0)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "host device %d: vmm_reserve of %zu bytes in pages of %zu: the page must "
                         "be a multiple of %zu and the size a multiple of the page",
                         device, size, page, g_host.page);
    /* One guard page after each reservation: two reservations are never adjacent, so a
     * viewer that merges touching ranges of a stream never joins two segments. */
    size_t span = size + g_host.page;
    pthread_mutex_lock(&dev->mu);
    uintptr_t carved = arena_take(&dev->arena, span);
    pthread_mutex_unlock(&dev->mu);
    void *p = carved
                  ? (void *)carved
                  : mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        /* Not the emulated device's memory running out (a reservation costs none of it): this
         * process's address space (128 TiB on x86-64) cannot hold the reservations of a huge
         * emulated capacity. Said as such: counted as an out-of-memory, a replay with
         * `--capacity 64TiB` and expandable segments reported OOMs on a device with all of its
         * 64 TiB free. */
        int err = errno;
        return sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE,
                         "host device %d: cannot reserve %zu bytes of address space: %s; an "
                         "expandable segment reserves 1.125 x the emulated capacity "
                         "(SYMPOOL_HOST_CAPACITY, --capacity), more than this process's address "
                         "space holds: use a smaller one",
                         device, size, strerror(err));
    }
    /* The page table (a byte per page) only once the address space is granted: a reservation
     * no address space holds (an emulated capacity of exabytes) is refused by mmap above. Asked
     * of the heap first, its table took terabytes for `--capacity 7EiB` (AddressSanitizer
     * aborts on such a request; under overcommit it may be granted). What mmap grants, at most
     * this process's address space (128 TiB on x86-64), needs at most 64 MiB in 2 MiB pages. */
    uint8_t *bits = calloc(size / page, 1);
    if (!bits) {
        if (carved) {
            pthread_mutex_lock(&dev->mu);
            arena_give(&dev->arena, carved, span);
            pthread_mutex_unlock(&dev->mu);
        } else {
            munmap(p, span);
        }
        return sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE,
                         "host device %d: cannot allocate the page table of a reservation of %zu "
                         "bytes (%zu pages): %s; an expandable segment reserves 1.125 x the "
                         "emulated capacity (SYMPOOL_HOST_CAPACITY, --capacity): use a smaller one",
                         device, size, size / page, strerror(ENOMEM));
    }
    pthread_mutex_lock(&dev->mu);
    bool ok = true;
    if (dev->nresv == dev->cap_resv) {
        size_t ncap = dev->cap_resv ? dev->cap_resv * 2 : 8;
        host_resv_t *nr = realloc(dev->resv, ncap * sizeof(*nr));
        ok = nr != NULL;
        if (ok) {
            dev->resv = nr;
            dev->cap_resv = ncap;
        }
    }
    if (ok) {
        dev->resv[dev->nresv++] = (host_resv_t){(uintptr_t)p, size, page, bits};
        dev->live_count++;
    } else if (carved) {
        arena_give(&dev->arena, carved, span);
    }
    pthread_mutex_unlock(&dev->mu);
    if (!ok) {
        free(bits);
        if (!carved)
            munmap(p, span);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_DEVICE, "cannot record a reservation");
    }
    *base_p = p;
    return SP_SUCCESS;
}

/* Validate [addr, addr+size) as whole pages of one reservation, all in state `mapped`
 * (dev->mu held). */
static sp_status_t check_range(host_dev_t *dev, int device, uintptr_t addr, size_t size,
                               bool mapped, const char *op, host_resv_t **r_p) {
    host_resv_t *r = find_resv(dev, addr);
    if (!r || size == 0 || (addr - r->base) % r->page != 0 || size % r->page != 0 ||
        size > r->base + r->size - addr)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_DEVICE,
                         "host device %d: %s(%#lx, %zu) is not a range of whole pages of one "
                         "reservation",
                         device, op, (unsigned long)addr, size);
    size_t i0 = (addr - r->base) / r->page, n = size / r->page;
    for (size_t i = i0; i < i0 + n; i++)
        if ((r->mapped[i] != 0) != mapped)
            return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_DEVICE,
                             "host device %d: %s: page %zu of the reservation at %#lx is %s",
                             device, op, i, (unsigned long)r->base,
                             mapped ? "not mapped" : "already mapped");
    *r_p = r;
    return SP_SUCCESS;
}

static void mark_pages(host_resv_t *r, uintptr_t addr, size_t size, uint8_t v) {
    memset(r->mapped + (addr - r->base) / r->page, v, size / r->page);
}

static sp_status_t host_vmm_map(int device, void *addr, size_t size) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    uintptr_t a = (uintptr_t)addr;
    host_resv_t *r = NULL;
    pthread_mutex_lock(&dev->mu);
    sp_status_t s = check_range(dev, device, a, size, false, "vmm_map", &r);
    if (s != SP_SUCCESS) {
        pthread_mutex_unlock(&dev->mu);
        return s;
    }
    long call = atomic_fetch_add(&g_host.alloc_calls, 1) + 1;
    if (g_host.fail_after > 0 && call == g_host.fail_after) {
        pthread_mutex_unlock(&dev->mu);
        return sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_DEVICE,
                               "host device %d: injected failure of allocation call %ld "
                               "(vmm_map, SYMPOOL_HOST_FAIL_AFTER)",
                               device, call);
    }
    if (size > dev->capacity - dev->live_bytes) {
        size_t live = dev->live_bytes;
        pthread_mutex_unlock(&dev->mu);
        return sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_DEVICE,
                               "host device %d: cannot map %zu bytes (%zu of %zu in use)", device,
                               size, live, dev->capacity);
    }
    /* Count the bytes and claim the pages first, so concurrent maps cannot overshoot the
     * budget or map the same page twice; undone if the kernel refuses. */
    dev->live_bytes += size;
    mark_pages(r, a, size, 1);
    bool in_arena = arena_owns(&dev->arena, a);
    pthread_mutex_unlock(&dev->mu);
    if (in_arena || mprotect(addr, size, PROT_READ | PROT_WRITE) == 0)
        return SP_SUCCESS;
    int err = errno;
    pthread_mutex_lock(&dev->mu);
    r = find_resv(dev, a);
    if (r)
        mark_pages(r, a, size, 0);
    dev->live_bytes -= size;
    pthread_mutex_unlock(&dev->mu);
    return sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_DEVICE,
                           "host device %d: cannot map %zu bytes at %p: %s", device, size, addr,
                           strerror(err));
}

/* Drop the pages' contents and access: a fresh PROT_NONE mapping over them. */
static void drop_pages(int device, void *addr, size_t size) {
    if (mmap(addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
             0) == MAP_FAILED)
        SP_WARN(SP_SUB_DEVICE, "host device %d: cannot unmap %zu bytes at %p: %s", device, size,
                addr, strerror(errno));
}

static sp_status_t host_vmm_unmap(int device, void *addr, size_t size) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    uintptr_t a = (uintptr_t)addr;
    host_resv_t *r = NULL;
    pthread_mutex_lock(&dev->mu);
    sp_status_t s = check_range(dev, device, a, size, true, "vmm_unmap", &r);
    if (s != SP_SUCCESS) {
        pthread_mutex_unlock(&dev->mu);
        return s;
    }
    mark_pages(r, a, size, 0);
    bool in_arena = arena_owns(&dev->arena, a);
    /* The bytes stay counted until the pages are really gone (as in mem_free). */
    pthread_mutex_unlock(&dev->mu);
    if (!in_arena)
        drop_pages(device, addr, size);
    pthread_mutex_lock(&dev->mu);
    dev->live_bytes -= size;
    pthread_mutex_unlock(&dev->mu);
    return SP_SUCCESS;
}

static sp_status_t host_vmm_release(int device, void *base, size_t size) {
    host_dev_t *dev = NULL;
    SP_CHECK(get_dev(device, &dev));
    uintptr_t a = (uintptr_t)base;
    pthread_mutex_lock(&dev->mu);
    host_resv_t *r = find_resv(dev, a);
    if (!r || r->base != a || r->size != size) {
        pthread_mutex_unlock(&dev->mu);
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_DEVICE,
                         "host device %d: vmm_release(%p, %zu) is not a live reservation", device,
                         base, size);
    }
    size_t mapped = 0;
    for (size_t i = 0; i < size / r->page; i++)
        mapped += r->mapped[i] ? r->page : 0;
    uint8_t *bits = r->mapped;
    *r = dev->resv[--dev->nresv];
    dev->live_count--;
    dev->live_bytes -= mapped; /* pages still mapped go with the reservation */
    bool in_arena = arena_owns(&dev->arena, a);
    if (in_arena)
        arena_give(&dev->arena, a, size + g_host.page);
    pthread_mutex_unlock(&dev->mu);
    free(bits);
    if (!in_arena && munmap(base, size + g_host.page) != 0)
        SP_WARN(SP_SUB_DEVICE, "host device %d: munmap(%p, %zu) failed: %s", device, base, size,
                strerror(errno));
    return SP_SUCCESS;
}

/* ---- inspection --------------------------------------------------------------------------- */

size_t sp__host_live_allocations(int device) {
    if (device < 0 || device >= g_host.count)
        return 0;
    host_dev_t *dev = &g_host.devs[device];
    pthread_mutex_lock(&dev->mu);
    size_t n = dev->live_count;
    pthread_mutex_unlock(&dev->mu);
    return n;
}

size_t sp__host_live_bytes(int device) {
    if (device < 0 || device >= g_host.count)
        return 0;
    host_dev_t *dev = &g_host.devs[device];
    pthread_mutex_lock(&dev->mu);
    size_t n = dev->live_bytes;
    pthread_mutex_unlock(&dev->mu);
    return n;
}

/* fork(): every device's mutex, in device order (no path holds two of them at once). */
static void host_fork_lock(void) {
    for (int d = 0; d < g_host.count; d++)
        pthread_mutex_lock(&g_host.devs[d].mu);
}

static void host_fork_unlock(void) {
    for (int d = g_host.count - 1; d >= 0; d--)
        pthread_mutex_unlock(&g_host.devs[d].mu);
}

const sp_device_ops_t sp__device_host_ops = {
    .name = "host",
    .init = host_init,
    .fini = host_fini,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .mem_get_info = host_mem_get_info,
    .mem_total = host_mem_total,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .stream_sync = host_stream_sync,
    .stream_capturing = host_stream_capturing,
    .stream_device = host_stream_device,
    .device_sync = host_device_sync,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .event_query = host_event_query,
    .event_sync = host_event_sync,
    .memcpy_async = host_memcpy_async,
    .fork_lock = host_fork_lock,
    .fork_unlock = host_fork_unlock,
    .vmm_reserve = host_vmm_reserve,
    .vmm_map = host_vmm_map,
    .vmm_unmap = host_vmm_unmap,
    .vmm_release = host_vmm_release,
};
