/*
 * handles.c: where MemPool structs live, so that a handle (the struct's address) can be checked
 * before it is read, and a destroyed pool's struct can go without its handle ever naming another
 * pool.
 *
 * Every pool struct takes one SLOT-byte slot of one address range, reserved once per process
 * (PROT_NONE, MAP_NORESERVE: address space, no memory), made usable front to back and handed out
 * in order, never twice. So "was this address given out as a handle" is a range and alignment
 * test, without a lock and without reading the address; and a handle never aliases a newer pool,
 * since no slot is reused. Each struct records the generation it was made in; sp_shutdown starts
 * a new one (a handle of an older generation is stale: SP_ERR_INVALID_USAGE). Generation 0 is a
 * released slot: a destroyed pool whose last segment went (mempool.c) is marked so under its
 * device lock, and the checks refuse it from then on.
 *
 * Releasing a slot (freeing the name it owns, giving its page back to the kernel) waits until no
 * call can still be reading it: a public call that takes a pool checks the handle inside the
 * shutdown gate (api.c) and reads the struct only while there. Marked slots wait on a pending
 * list; the gate's last call to leave takes the list before it counts itself out, and releases
 * it if nobody else was inside then (every call that could have seen the slot unmarked entered
 * before the mark, hence before the take, and has left). The malloc and free paths run outside
 * the gate, and one of them may drop a pool itself (the OOM retry's release, a free under
 * SYMPOOL_NO_CACHING) and read it until it lets go of the device lock: the leaving call takes
 * each dropped pool's device lock once before it counts out. A page is given back (MADV_DONTNEED)
 * once all its slots are released: it reads as zeros from then on, generation 0, "released",
 * and costs no memory. A process holds the structs of its live pools, of destroyed pools still
 * holding segments, and of the pools sp_shutdown retired (handles of an ended session stay
 * recognizably stale); the rest cost a page-table entry at most.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/core.h"
#include "pool/handles.h"

/* AddressSanitizer builds: LeakSanitizer scans the heap, globals, stacks and TLS, not an mmap'd
 * range, so a pool's name, reachable only from its struct in a slot here, was reported leaked at
 * exit (example 01_train_step: its symmetric pool's name). The reservation is registered as a
 * root region; LeakSanitizer scans only its readable (committed) pages. */
#if defined(__SANITIZE_ADDRESS__)
#define SP_HANDLES_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) /* clang says it so */
#define SP_HANDLES_LSAN 1
#endif
#endif
#ifdef SP_HANDLES_LSAN
#include <sanitizer/lsan_interface.h>
#endif
#include "sympool/experimental.h"

/* The reservation: 16 million slots where the address space allows, less under RLIMIT_AS. */
#define RESERVE_MAX ((size_t)1 << 33)
#define RESERVE_MIN ((size_t)1 << 22)
/* Pages are made usable this many bytes at a time (fewer mprotect calls). */
#define COMMIT_STEP ((size_t)64 << 10)
/* Where a slot waiting for release keeps its link: its last word, past any pool struct. */
#define LINK_AT (SP_HANDLE_SLOT - sizeof(void *))

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static char *g_res;              /* the reservation's start (const once set) */
static size_t g_reserved;        /* its bytes (const once set) */
static size_t g_page;            /* the page size (const once set) */
static atomic_size_t g_top;      /* bytes handed out from g_res (grows under g_lock) */
static size_t g_committed;       /* bytes from g_res made read-write (g_lock) */
static uint16_t *g_released;     /* per page: its slots released (g_lock) */
static size_t g_released_cap;    /* entries of g_released (g_lock) */
static atomic_size_t g_held;     /* slots handed out and not released */
static void *g_pending;          /* marked slots waiting for release, by LINK_AT (g_lock) */
atomic_int sp__handles_npending; /* entries of g_pending: the gate's cheap test */
static atomic_uint_fast64_t g_generation = 1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void reserve(void) {
    g_page = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t n = RESERVE_MAX; n >= RESERVE_MIN; n /= 2) {
        void *p = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
            /* Its first page stays PROT_NONE, below the slots: the kernel places later mappings
             * (the host backend's segments) just under the lowest one, and one next to usable
             * slots would merge with them into one area that each munmap must split (0.9 us more
             * an sp_empty_cache's release, bench_pool_gc at 0 cycles). */
            g_res = (char *)p + g_page;
            g_reserved = n - g_page;
#ifdef SP_HANDLES_LSAN
            __lsan_register_root_region(g_res, g_reserved);
#endif
            return;
        }
    }
}

static void **link_of(void *slot) {
    return (void **)((char *)slot + LINK_AT);
}

void *sp__handles_new(void) {
    _Static_assert(SP_HANDLE_SLOT % 64 == 0 && 4096 % SP_HANDLE_SLOT == 0,
                   "slots fill pages exactly");
    pthread_once(&g_once, reserve);
    if (!g_res)
        return NULL;
    pthread_mutex_lock(&g_lock);
    size_t top = atomic_load_explicit(&g_top, memory_order_relaxed);
    size_t pages = (top + SP_HANDLE_SLOT) / g_page + 1;
    if (top + SP_HANDLE_SLOT > g_reserved) {
        pthread_mutex_unlock(&g_lock);
        return NULL; /* sp_mempool_create says: out of host memory */
    }
    if (top + SP_HANDLE_SLOT > g_committed) {
        size_t to = g_committed + COMMIT_STEP;
        if (to > g_reserved)
            to = g_reserved;
        if (mprotect(g_res + g_committed, to - g_committed, PROT_READ | PROT_WRITE) != 0) {
            pthread_mutex_unlock(&g_lock);
            return NULL;
        }
        g_committed = to;
    }
    if (pages > g_released_cap) { /* one counter per page ever used: 2 bytes a page of slots */
        size_t cap = g_released_cap ? g_released_cap * 2 : 64;
        while (cap < pages)
            cap *= 2;
        uint16_t *r = realloc(g_released, cap * sizeof(*r));
        if (!r) {
            pthread_mutex_unlock(&g_lock);
            return NULL;
        }
        for (size_t i = g_released_cap; i < cap; i++)
            r[i] = 0;
        g_released = r;
        g_released_cap = cap;
    }
    void *slot = g_res + top; /* never used before: zeros */
    /* Release: a lock-free sp__handles_known that sees the new top sees a handed-out slot. */
    atomic_store_explicit(&g_top, top + SP_HANDLE_SLOT, memory_order_release);
    atomic_fetch_add_explicit(&g_held, 1, memory_order_relaxed);
    pthread_mutex_unlock(&g_lock);
    return slot;
}

bool sp__handles_known(const void *pool) {
    uintptr_t a = (uintptr_t)pool, base = (uintptr_t)g_res;
    size_t top = atomic_load_explicit(&g_top, memory_order_acquire);
    /* g_res is set before the first slot is handed out (top > 0 implies it is). */
    return top && a >= base && a - base < top && (a - base) % SP_HANDLE_SLOT == 0;
}

void sp__handles_release_later(void *slot) {
    pthread_mutex_lock(&g_lock);
    *link_of(slot) = g_pending;
    g_pending = slot;
    atomic_fetch_add_explicit(&sp__handles_npending, 1, memory_order_relaxed);
    pthread_mutex_unlock(&g_lock);
}

void *sp__handles_take_pending(void) {
    pthread_mutex_lock(&g_lock);
    void *list = g_pending;
    g_pending = NULL;
    atomic_store_explicit(&sp__handles_npending, 0, memory_order_relaxed);
    pthread_mutex_unlock(&g_lock);
    return list;
}

void sp__handles_wait_droppers(void *list) {
    /* Without g_lock: a dropper takes g_lock under its device lock (sp__handles_release_later),
     * and the taken list is this caller's own. */
    for (void *s = list; s; s = *link_of(s))
        sp__mempool_slot_wait(s);
}

void sp__handles_put_back(void *list) {
    if (!list)
        return;
    pthread_mutex_lock(&g_lock);
    int n = 0;
    void *last = list;
    for (void *s = list; s; s = *link_of(s)) {
        last = s;
        n++;
    }
    *link_of(last) = g_pending;
    g_pending = list;
    atomic_fetch_add_explicit(&sp__handles_npending, n, memory_order_relaxed);
    pthread_mutex_unlock(&g_lock);
}

void sp__handles_release(void *list) {
    if (!list)
        return;
    pthread_mutex_lock(&g_lock);
    while (list) {
        void *slot = list;
        list = *link_of(slot);
        sp__mempool_slot_free(slot); /* what the struct owns (its name) */
        size_t page = (size_t)((char *)slot - g_res) / g_page;
        atomic_fetch_sub_explicit(&g_held, 1, memory_order_relaxed);
        if (++g_released[page] == g_page / SP_HANDLE_SLOT) /* every slot of it released */
            (void)madvise(g_res + page * g_page, g_page, MADV_DONTNEED);
    }
    pthread_mutex_unlock(&g_lock);
}

uint64_t sp__handles_generation(void) {
    return atomic_load_explicit(&g_generation, memory_order_acquire);
}

void sp__handles_next_generation(void) {
    atomic_fetch_add_explicit(&g_generation, 1, memory_order_acq_rel);
}

void sp__handles_fork_lock(void) {
    pthread_mutex_lock(&g_lock);
}

void sp__handles_fork_unlock(void) {
    pthread_mutex_unlock(&g_lock);
}

SP_EXPORT size_t sp_x_mempool_structs(void) {
    return atomic_load_explicit(&g_held, memory_order_relaxed);
}

SP_EXPORT uint64_t sp_x_session(void) {
    return sp__handles_generation();
}
