/*
 * core_lock.h: the futex lock every per-device allocator is guarded by (offered upward: pool/
 * and above). The uncontended paths are inline; the slow paths live in core_lock.c.
 */
#ifndef SP_CORE_LOCK_H
#define SP_CORE_LOCK_H

#include <stdatomic.h>
#include <stdbool.h>

#include "core/core.h"

/* A futex lock from C11 atomics (Drepper's "mutex3"): 0 free, 1 held, 2 held with sleepers.
 * Uncontended it costs one CAS and one atomic decrement, about half of a pthread mutex pair,
 * which matters on the cache-hit path; contended it spins briefly, then sleeps in the kernel,
 * because the holder may be inside a device call (cudaMalloc, an MPI collective of a symmetric
 * registrar) for milliseconds. ThreadSanitizer sees its acquire/release atomics. */
typedef struct sp_lock {
    atomic_int v; /* 0, 1 or 2 as above */
} sp_lock_t;

void sp__lock_slow(sp_lock_t *l);
void sp__unlock_wake(sp_lock_t *l);

/* Take the lock if it is free; never waits. */
static inline bool sp__lock_try(sp_lock_t *l) {
    int c = 0;
    return atomic_compare_exchange_strong_explicit(&l->v, &c, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

static inline void sp__lock(sp_lock_t *l) {
    if (SP_LIKELY(sp__lock_try(l)))
        return;
    sp__lock_slow(l);
}

static inline void sp__unlock(sp_lock_t *l) {
    if (SP_UNLIKELY(atomic_fetch_sub_explicit(&l->v, 1, memory_order_release) != 1))
        sp__unlock_wake(l);
}

#endif /* SP_CORE_LOCK_H */
