/*
 * core_lock.c: the slow paths of the futex lock in core_lock.h: spin briefly, then sleep in the
 * kernel until the holder's unlock wakes us or the sleep's bound ends.
 */
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/core_lock.h"

/* ---- the device lock's slow paths (see sp_lock_t) ---------------------------------------- */

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Sleep while the word still holds `held`, for at most SP_LOCK_SLEEP_NS (a wake may be late:
 * see sp_lock_t). The kernel compares the word before it sleeps, so an unlock that came first
 * makes this return at once. */
static void sleep_on(sp_lock_t *l, int held) {
    struct timespec bound = {0, SP_LOCK_SLEEP_NS};
    syscall(SYS_futex, &l->v, FUTEX_WAIT_PRIVATE, held, &bound, NULL, 0);
}

void sp__lock_slow(sp_lock_t *l) {
    for (;;) {
        for (int i = 0; i < 200; i++) {
            int c = atomic_load_explicit(&l->v, memory_order_relaxed);
            if (c == 0 && atomic_compare_exchange_weak_explicit(&l->v, &c, 1, memory_order_acquire,
                                                                memory_order_relaxed))
                return;
            cpu_relax();
        }
        /* Count ourselves in before the last look, so that an unlock after it sees us (or, in
         * the store-buffer window, wakes us late: the bounded sleep). */
        atomic_fetch_add_explicit(&l->sleepers, 1, memory_order_seq_cst);
        int c = 0;
        bool got = atomic_compare_exchange_strong_explicit(&l->v, &c, 1, memory_order_acquire,
                                                           memory_order_relaxed);
        if (!got)
            sleep_on(l, c);
        atomic_fetch_sub_explicit(&l->sleepers, 1, memory_order_relaxed);
        if (got)
            return;
    }
}

/* Taken alone (SP_LOCK_ALONE), given back after this thread made another: that thread may be
 * asleep on the word. Off the hot path, so the fence makes this wake exact. */
void sp__unlock_born(sp_lock_t *l) {
    atomic_store_explicit(&l->v, 0, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&l->sleepers, memory_order_relaxed) != 0)
        sp__unlock_wake(l);
}

/* After the word was given back (0) with sleepers counted: wake one of them. */
void sp__unlock_wake(sp_lock_t *l) {
    syscall(SYS_futex, &l->v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
