/*
 * core_lock.c: the slow paths of the futex lock in core_lock.h: spin briefly, then sleep in the
 * kernel until the holder's unlock wakes us or the sleep's bound ends.
 */
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <stdio.h>
#include <stdlib.h>
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

/* ---- the bias (see sp_lock_t) ---------------------------------------------------------- */

atomic_int sp__lock_bias_gone;

static long membarrier(int cmd) {
    return syscall(SYS_membarrier, cmd, 0, 0);
}

static void bias_is_gone(void) {
    atomic_store_explicit(&sp__lock_bias_gone, 1, memory_order_relaxed);
}

bool sp__lock_bias_begin(void) {
    static int registered = -1; /* the kernel's answer, asked once (callers are serialized) */
    if (registered < 0)
        registered = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
    if (!registered || !sp__option_int(SP_OPT_LOCK_BIAS)) {
        bias_is_gone();
        return false;
    }
    return true;
}

void sp__lock_bias_end(void) {
    atomic_store_explicit(&sp__lock_bias_gone, 0, memory_order_relaxed);
}

/* Every thread of the process executes a full barrier before this returns (see sp_lock_t). The
 * registration sp__lock_bias_begin made is the process's and a fork child's; should the call
 * still fail, the global form (every process, slower) is as good, and without either the owner
 * could be inside unseen, which is no state to go on from. */
static void barrier_everywhere(void) {
    if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 || membarrier(MEMBARRIER_CMD_GLOBAL) == 0)
        return;
    fputs("sympool: membarrier failed while revoking a lock's bias; cannot go on safely\n", stderr);
    abort();
}

/* Wait until the owner is out (`in` 0): spin, then sleep in bounded naps (the owner's unlock is
 * a plain store that wakes nobody; a revocation happens once per lock). */
static void wait_owner_out(sp_lock_t *l) {
    for (int spent = 0, wait = 1; spent < SPIN_PAUSES; spent += wait) {
        if (atomic_load_explicit(&l->in, memory_order_acquire) == 0)
            return;
        for (int k = 0; k < wait; k++)
            cpu_relax();
        wait = wait < SPIN_WAIT_MAX ? 2 * wait : wait;
    }
    while (atomic_load_explicit(&l->in, memory_order_acquire) != 0) {
        struct timespec bound = {0, SP_LOCK_SLEEP_NS};
        syscall(SYS_futex, &l->in, FUTEX_WAIT_PRIVATE, 1, &bound, NULL, 0);
    }
}

/* A thread that is not the owner found the word BIASED: take it (1). With no owner yet nobody can
 * be inside, so the taker becomes the owner and enters biased (a thread that waited meanwhile is
 * woken: it will find the word BIASED and revoke). Otherwise it revokes the bias: the barrier,
 * then a wait for the owner to be out. false: the word changed first (another taker, or the
 * owner's own unbias); look again. */
static bool take_biased_from_other(sp_lock_t *l) {
    int c = SP_LOCK_BIASED;
    if (!atomic_compare_exchange_strong_explicit(&l->v, &c, 1, memory_order_acquire,
                                                 memory_order_relaxed))
        return false;
    if (__atomic_load_n(&l->owner, __ATOMIC_RELAXED) == 0) {
        __atomic_store_n(&l->owner, SP_LOCK_ME(), __ATOMIC_RELAXED);
        atomic_store_explicit(&l->in, 1, memory_order_relaxed);
        (void)atomic_exchange_explicit(&l->v, SP_LOCK_BIASED, memory_order_seq_cst);
        if (atomic_load_explicit(&l->sleepers, memory_order_relaxed) != 0)
            sp__unlock_wake(l);
        return true;
    }
    bias_is_gone();
    barrier_everywhere();
    wait_owner_out(l);
    return true;
}

bool sp__lock_unbias(sp_lock_t *l) {
    if (!sp__lock_take_biased(l))
        return false;
    int c = SP_LOCK_BIASED;
    bool got = atomic_compare_exchange_strong_explicit(&l->v, &c, 1, memory_order_acquire,
                                                       memory_order_relaxed);
    /* Held as an ordinary lock now, or a revoker took the word first and waits for `in`. */
    sp__unlock_biased(l);
    return got;
}

/* The word said BIASED in sp__lock_slow: the owner enters (or unbiases); another thread becomes
 * the owner of a lock nobody owns yet, or revokes. */
static bool take_from_bias(sp_lock_t *l) {
    return sp__lock_mine(l) ? sp__lock_owner_take(l) : take_biased_from_other(l);
}

void sp__lock_slow(sp_lock_t *l) {
    for (;;) {
        /* Between looks, a wait that doubles up to SPIN_WAIT_MAX pauses: a waiter that reads
         * the word without pause takes its line from the holder, whose next store must fetch
         * it back (two threads hammering one device: 330-480 ns a pair each with a look every
         * pause, 80-86 with this; bench_alloc_scale's case threads, 2026-11-28). */
        for (int spent = 0, wait = 1; spent < SPIN_PAUSES; spent += wait) {
            int c = atomic_load_explicit(&l->v, memory_order_relaxed);
            if (c == SP_LOCK_BIASED && take_from_bias(l))
                return;
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
        if (!got && c != SP_LOCK_BIASED) /* BIASED: the spin above takes it from the bias */
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
