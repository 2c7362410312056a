/*
 * arena.c: the one address range where every block and segment struct lives (block.h).
 *
 * Why one range: a link between structs is then a 32-bit offset from its base in 8-byte units
 * (sp_ref_t), half a pointer, and turning one back into a pointer is one lea. With five links, a
 * segment reference and the pointer map's buckets in refs, a block costs 56 bytes of struct and
 * about 4 bytes of map instead of 80 + 8.
 *
 * The range is reserved once per process (PROT_NONE, MAP_NORESERVE: address space, no memory)
 * and made usable front to back as structs are needed, so the structs already handed out never
 * move. Nothing is ever unmapped: block.c keeps the slabs taken from here for the next
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

/* 2^32 refs of 8 bytes: every offset a ref can name. */
#define ARENA_MAX ((size_t)1 << 35)
/* Smaller reservations are tried when the address space is limited (RLIMIT_AS). */
#define ARENA_MIN ((size_t)1 << 26)
/* The first bytes stay unused: ref 0 means "none". */
#define ARENA_START 64
/* Pages are made usable this many bytes at a time (fewer mprotect calls). */
#define COMMIT_STEP ((size_t)256 << 10)

static size_t g_reserved;           /* bytes of address space reserved (const once set) */
static size_t g_limit;              /* tests: take no more than this (0 = all) */
static atomic_size_t g_top;         /* first byte never handed out */
static atomic_size_t g_committed;   /* bytes from the base made read-write */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void reserve(void) {
    for (size_t n = ARENA_MAX; n >= ARENA_MIN; n /= 2) {
        void *p = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
            sp__arena_base = p;
            g_reserved = n;
            atomic_store(&g_top, ARENA_START);
            return;
        }
    }
}

bool sp__arena_ready(void) {
    pthread_once(&g_once, reserve);
    return sp__arena_base != NULL;
}

/* Make [0, end) read-write. Concurrent callers may change the same pages to the same
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
    if (mprotect(sp__arena_base + from, to - from, PROT_READ | PROT_WRITE) != 0)
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
    return sp__arena_base + top;
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
