/*
 * core_lock.c: the slow paths of the futex lock in core_lock.h: spin briefly, then sleep in the
 * kernel until the holder's unlock wakes us.
 */
#include <linux/futex.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/core_lock.h"

/* ---- the device lock's slow paths (see sp_lock_t) ---------------------------------------- */

void sp__lock_slow(sp_lock_t *l) {
    for (int i = 0; i < 200; i++) {
        int c = atomic_load_explicit(&l->v, memory_order_relaxed);
        if (c == 0 && atomic_compare_exchange_weak_explicit(&l->v, &c, 1, memory_order_acquire,
                                                            memory_order_relaxed))
            return;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    /* Mark the lock contended (2) and sleep until the holder's unlock wakes us. */
    int c = atomic_exchange_explicit(&l->v, 2, memory_order_acquire);
    while (c != 0) {
        syscall(SYS_futex, &l->v, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
        c = atomic_exchange_explicit(&l->v, 2, memory_order_acquire);
    }
}

/* Taken alone (SP_LOCK_ALONE), given back after this thread made another: that thread may have
 * marked the lock contended (2) and gone to sleep. */
void sp__unlock_born(sp_lock_t *l) {
    if (atomic_exchange_explicit(&l->v, 0, memory_order_release) == 2)
        syscall(SYS_futex, &l->v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void sp__unlock_wake(sp_lock_t *l) {
    atomic_store_explicit(&l->v, 0, memory_order_release);
    syscall(SYS_futex, &l->v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
