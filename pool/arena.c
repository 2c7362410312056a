/*
 * arena.c: the one address range where every block and segment struct lives (block.h).
 *
 * Why one range: a link between structs is then a 32-bit offset from its base (sp_ref_t), half
 * a pointer: making one is taking a pointer's low 32 bits, following one is one add. With five
 * links, a segment reference and the pointer map's buckets in refs, a block costs 56 bytes of
 * struct and about 4 bytes of map instead of 80 + 8. The price: at most 4 GiB of structs a
 * process (76 million block structs); past that a block is handed out unsplit and a pool that
 * needs a new segment gets an out-of-memory error, as when malloc fails.
 *
 * The range is reserved once per process (PROT_NONE, MAP_NORESERVE: address space, no memory)
 * and made usable front to back as structs are needed, so the structs already handed out never
 * move. Nothing is ever unmapped: allocator.c keeps the slabs taken from here for the next
 * allocator, and gives the pages of those it keeps idle back to the kernel. Taking is lock-free
 * (a CAS on the top), so no lock order involves it and fork() needs no handler for it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/core.h"
#include "pool/block.h"
#include "sympool/experimental.h"

_Static_assert(sizeof(sp_block_t) == 56, "a block struct is 56 bytes (block.h)");
_Static_assert(_Alignof(sp_segment_t) <= 8, "segment structs sit in block structs' room");

char *sp__arena_base;

/* A ref names 2^32 bytes: one window of WINDOW bytes, aligned to its size. The whole reservation
 * lies inside one window, so a pointer's ref is its address cut to 32 bits (block.h), and the
 * window's start is the base refs count from. */
#define WINDOW ((uintptr_t)1 << 32)
/* The reservation: a whole window when the address space allows, less under RLIMIT_AS. */
#define ARENA_MAX ((size_t)1 << 32)
#define ARENA_MIN ((size_t)1 << 26)
/* Pages are made usable this many bytes at a time (fewer mprotect calls). */
#define COMMIT_STEP ((size_t)256 << 10)

static char *g_res;               /* the reservation's start (const once set) */
static size_t g_reserved;         /* its bytes (const once set) */
static size_t g_limit;            /* tests: hand out no more than this (0 = all) */
static atomic_size_t g_top;       /* offset of the first byte never handed out */
static atomic_size_t g_committed; /* bytes from g_res made read-write */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Reserve 2n bytes and use n of them inside one window (2n bytes cross at most one window
 * boundary, so one side of it holds n). The rest stays reserved, unused: given back, it would
 * leave a hole of a size that depends on where the kernel put the range, which later mappings
 * (the host backend's device memory) would fill in a different order from run to run, and best
 * fit among equal blocks goes by address. */
static bool reserve_in_window(size_t n) {
    void *p = mmap(NULL, 2 * n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return false;
    uintptr_t lo = (uintptr_t)p, hi = lo + 2 * n;
    uintptr_t cut = (lo + WINDOW - 1) & ~(WINDOW - 1); /* the first boundary at or after lo */
    uintptr_t start = cut >= hi || cut - lo >= n ? lo : cut;
    g_res = (char *)start;
    g_reserved = n;
    sp__arena_base = (char *)(start & ~(WINDOW - 1));
    /* Ref 0 means "none": when the window starts with the reservation, its first bytes are
     * never handed out. */
    atomic_store(&g_top, g_res == sp__arena_base ? 64 : 0);
    return true;
}

static void reserve(void) {
    for (size_t n = ARENA_MAX; n >= ARENA_MIN; n /= 2)
        if (reserve_in_window(n))
            return;
}

bool sp__arena_ready(void) {
    pthread_once(&g_once, reserve);
    return g_res != NULL;
}

/* Make [g_res, g_res + end) read-write. Concurrent callers may change the same pages to the same
 * protection: harmless. */
static bool commit(size_t end) {
    size_t done = atomic_load_explicit(&g_committed, memory_order_acquire);
    if (end <= done)
        return true;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t to = (end + COMMIT_STEP - 1) / COMMIT_STEP * COMMIT_STEP;
    if (to > g_reserved)
        to = (end + page - 1) / page * page;
    size_t from = done / page * page;
    if (mprotect(g_res + from, to - from, PROT_READ | PROT_WRITE) != 0)
        return false;
    while (done < to && !atomic_compare_exchange_weak(&g_committed, &done, to)) {
    }
    return true;
}

void *sp__arena_take(size_t bytes) {
    if (!sp__arena_ready())
        return NULL;
    bytes = (bytes + 63) & ~(size_t)63;
    size_t limit = g_limit ? g_limit : g_reserved;
    size_t top = atomic_load_explicit(&g_top, memory_order_relaxed);
    do {
        if (bytes > limit || top > limit - bytes)
            return NULL;
    } while (!atomic_compare_exchange_weak(&g_top, &top, top + bytes));
    if (!commit(top + bytes))
        return NULL; /* those bytes stay unused: the next take may still succeed */
    return g_res + top;
}

size_t sp__arena_committed(void) {
    return atomic_load_explicit(&g_committed, memory_order_relaxed);
}

size_t sp__arena_set_limit(size_t bytes) {
    size_t old = g_limit;
    g_limit = bytes;
    return old;
}

size_t sp__arena_used(void) {
    return atomic_load_explicit(&g_top, memory_order_relaxed);
}

SP_EXPORT size_t sp_x_struct_bytes(void) {
    return sp__arena_committed();
}
