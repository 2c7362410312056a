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

/* How long a waiter spins before it sleeps, in pause instructions (9.96 ns each on the
 * 2026-11-28 machine, so about 40 us; a pause costs more on some processors: longer than a
 * cache hit's hold by far, shorter than a device call's), and the longest wait between two
 * looks. */
#define SPIN_PAUSES 4096
#define SPIN_WAIT_MAX 64

/* Sleep while the word still holds `held`, for at most SP_LOCK_SLEEP_NS (a wake may be late:
 * see sp_lock_t). The kernel compares the word before it sleeps, so an unlock that came first
 * makes this return at once. */
static void sleep_on(sp_lock_t *l, int held) {
    struct timespec bound = {0, SP_LOCK_SLEEP_NS};
    syscall(SYS_futex, &l->v, FUTEX_WAIT_PRIVATE, held, &bound, NULL, 0);
}

/* Count a sleeper in (+SP_LOCK_SLEEPER) or out (-), clearing SP_LOCK_WAKING: a wake on its way
 * went to this thread or to one that has run since (or to nobody); either way the next unlock
 * may send another. */
static void count(sp_lock_t *l, int delta) {
    int s = atomic_load_explicit(&l->sleepers, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&l->sleepers, &s, (s + delta) & ~SP_LOCK_WAKING,
                                                  memory_order_seq_cst, memory_order_relaxed))
        ;
}

void sp__lock_slow(sp_lock_t *l) {
    for (;;) {
        /* Between looks, a wait that doubles up to SPIN_WAIT_MAX pauses: a waiter that reads
         * the word without pause takes its line from the holder, whose next store must fetch
         * it back (two threads hammering one device: 330-480 ns a pair each with a look every
         * pause, 80-86 with this; bench_alloc_scale's case threads, 2026-11-28). */
        for (int spent = 0, wait = 1; spent < SPIN_PAUSES; spent += wait) {
            int c = atomic_load_explicit(&l->v, memory_order_relaxed);
            if (c == 0 && atomic_compare_exchange_weak_explicit(&l->v, &c, 1, memory_order_acquire,
                                                                memory_order_relaxed))
                return;
            for (int k = 0; k < wait; k++)
                cpu_relax();
            wait = wait < SPIN_WAIT_MAX ? 2 * wait : wait;
        }
        /* Count ourselves in before the last look, so that an unlock after it sees us (or, in
         * the store-buffer window, wakes us late: the bounded sleep). */
        count(l, SP_LOCK_SLEEPER);
        int c = 0;
        bool got = atomic_compare_exchange_strong_explicit(&l->v, &c, 1, memory_order_acquire,
                                                           memory_order_relaxed);
        if (!got)
            sleep_on(l, c);
        count(l, -SP_LOCK_SLEEPER);
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

/* After the word was given back (0) and the sleepers' word was not 0: wake one sleeper, unless a
 * wake is on its way already; a flag left with no sleeper is cleared, so that unlocks stop
 * coming here. */
void sp__unlock_wake(sp_lock_t *l) {
    int s = atomic_load_explicit(&l->sleepers, memory_order_relaxed);
    while (!(s & SP_LOCK_WAKING) && s >= SP_LOCK_SLEEPER) {
        if (atomic_compare_exchange_weak_explicit(&l->sleepers, &s, s | SP_LOCK_WAKING,
                                                  memory_order_relaxed, memory_order_relaxed)) {
            syscall(SYS_futex, &l->v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
            return;
        }
    }
    if (s == SP_LOCK_WAKING)
        (void)atomic_compare_exchange_strong_explicit(&l->sleepers, &s, 0, memory_order_relaxed,
                                                      memory_order_relaxed);
}
