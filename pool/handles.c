/*
 * handles.c: the registry of every MemPool handle sympool has given out, for the checks at the
 * top of every public call that takes a pool.
 *
 * A handle is the address of its pool struct. Pool structs are never freed, only retired (at
 * sp_shutdown), so an address in the registry always points at a readable struct, and a stale
 * handle can never alias a newer pool. Each struct records the generation it was made in;
 * sp_shutdown starts a new generation, so "known but of an older generation" is a stale handle
 * (SP_ERR_INVALID_USAGE) and "not known" a garbage one (SP_ERR_INVALID_ARGUMENT), told apart
 * without reading through the handle. The cost is one retired struct (a few hundred bytes) per
 * pool a process ever makes.
 *
 * The registry is an open-addressing hash set of addresses that only grows. Lookups take no lock:
 * they load the current table (acquire) and probe it; slots are written once (release). Growth
 * builds a larger table under g_lock and publishes it; older tables are kept (never freed), so a
 * lookup still probing one stays valid. They total less than the newest table. A lookup for a
 * pool made before the caller got its handle always finds it, because the handle reached the
 * caller after the insert and the publish that preceded it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/core.h"
#include "pool/handles.h"
#include "sympool/experimental.h"

typedef struct table {
    size_t mask;               /* slots - 1 (a power of two minus one) */
    _Atomic(uintptr_t) *slots; /* 0 = empty; each written once (g_lock), read without it */
    struct table *older;       /* the table this one replaced; kept for readers */
} table_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(table_t *) g_table; /* newest table (writes under g_lock) */
static size_t g_count;             /* addresses recorded (g_lock) */
static atomic_uint_fast64_t g_generation = 1;

static size_t hash(uintptr_t a) {
    uint64_t x = (uint64_t)a >> 4;
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 20);
}

static void put(table_t *t, uintptr_t a) {
    size_t i = hash(a) & t->mask;
    while (atomic_load_explicit(&t->slots[i], memory_order_relaxed) != 0)
        i = (i + 1) & t->mask;
    atomic_store_explicit(&t->slots[i], a, memory_order_release);
}

/* A table of `slots` slots holding everything in `old`. g_lock held. */
static table_t *grow(table_t *old, size_t slots) {
    table_t *t = calloc(1, sizeof(*t));
    _Atomic(uintptr_t) *s = t ? calloc(slots, sizeof(*s)) : NULL;
    if (!s) {
        free(t);
        return NULL;
    }
    t->mask = slots - 1;
    t->slots = s;
    t->older = old;
    if (old)
        for (size_t i = 0; i <= old->mask; i++) {
            uintptr_t a = atomic_load_explicit(&old->slots[i], memory_order_relaxed);
            if (a)
                put(t, a);
        }
    return t;
}

bool sp__handles_add(const void *pool) {
    pthread_mutex_lock(&g_lock);
    table_t *t = atomic_load_explicit(&g_table, memory_order_relaxed);
    if (!t || (g_count + 1) * 2 > t->mask + 1) {
        table_t *nt = grow(t, t ? (t->mask + 1) * 2 : 64);
        if (!nt) {
            pthread_mutex_unlock(&g_lock);
            return false;
        }
        atomic_store_explicit(&g_table, nt, memory_order_release);
        t = nt;
    }
    put(t, (uintptr_t)pool);
    g_count++;
    pthread_mutex_unlock(&g_lock);
    return true;
}

bool sp__handles_known(const void *pool) {
    uintptr_t a = (uintptr_t)pool;
    table_t *t = atomic_load_explicit(&g_table, memory_order_acquire);
    if (!t || a == 0)
        return false;
    /* At most half full, so the probe ends at an empty slot. */
    for (size_t i = hash(a) & t->mask;; i = (i + 1) & t->mask) {
        uintptr_t s = atomic_load_explicit(&t->slots[i], memory_order_acquire);
        if (s == a)
            return true;
        if (s == 0)
            return false;
    }
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
    pthread_mutex_lock(&g_lock);
    size_t n = g_count;
    pthread_mutex_unlock(&g_lock);
    return n;
}

SP_EXPORT uint64_t sp_x_session(void) {
    return sp__handles_generation();
}
