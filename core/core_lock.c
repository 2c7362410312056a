/*
 * core_lock.c: the slow paths of the futex lock in core_lock.h: spin briefly, then sleep in the
 * kernel until the holder's unlock wakes us or the sleep's bound ends.
 */
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
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

atomic_int sp__lock_bias_state;
static atomic_int bias_on; /* sp__lock_bias_begin said yes, and no sp__lock_bias_end since */

/* The streak (see SP_LOCK_STREAK) and what it follows: the recent revocations' barrier time, a
 * running average (its updates may race: an estimate). pinned: tests fix the streak. */
atomic_int sp__lock_streak_len = SP_LOCK_STREAK;
static atomic_long barrier_ns;
static atomic_int streak_pinned;

void sp__lock_streak_follow(long ns) {
    long avg = atomic_load_explicit(&barrier_ns, memory_order_relaxed);
    avg = avg ? (3 * avg + ns) / 4 : ns;
    atomic_store_explicit(&barrier_ns, avg, memory_order_relaxed);
    if (atomic_load_explicit(&streak_pinned, memory_order_relaxed))
        return;
    long takes = avg * 2 / 5; /* a take saves ~5 ns: the barrier over 2.5 ns */
    takes = takes < SP_LOCK_STREAK ? SP_LOCK_STREAK : takes > INT16_MAX ? INT16_MAX : takes;
    atomic_store_explicit(&sp__lock_streak_len, (int)takes, memory_order_relaxed);
}

void sp__lock_streak_pin(int takes) {
    atomic_store_explicit(&streak_pinned, takes > 0, memory_order_relaxed);
    atomic_store_explicit(&sp__lock_streak_len, takes > 0 ? takes : SP_LOCK_STREAK,
                          memory_order_relaxed);
}

static long membarrier(int cmd) {
    return syscall(SYS_membarrier, cmd, 0, 0);
}

/* A biasable lock leaves its bias (revoked, unbiased) or takes one again (re-biased). */
static void bias_lost(void) {
    atomic_fetch_add_explicit(&sp__lock_bias_state, 1, memory_order_relaxed);
}

static void bias_back(void) {
    atomic_fetch_sub_explicit(&sp__lock_bias_state, 1, memory_order_relaxed);
}

static bool bias_gone(void) {
    return atomic_load_explicit(&sp__lock_bias_state, memory_order_relaxed) & SP_LOCK_GONE;
}

bool sp__lock_bias_begin(void) {
    static int registered = -1; /* the kernel's answer, asked once (callers are serialized) */
    if (registered < 0)
        registered = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
    if (!registered || !sp__option_int(SP_OPT_LOCK_BIAS)) {
        atomic_store_explicit(&sp__lock_bias_state, 1, memory_order_relaxed);
        return false;
    }
    atomic_store_explicit(&bias_on, 1, memory_order_relaxed);
    return true;
}

void sp__lock_bias_end(void) {
    atomic_store_explicit(&bias_on, 0, memory_order_relaxed);
    atomic_store_explicit(&sp__lock_bias_state, 0, memory_order_relaxed);
    atomic_store_explicit(&barrier_ns, 0, memory_order_relaxed);
    if (!atomic_load_explicit(&streak_pinned, memory_order_relaxed))
        atomic_store_explicit(&sp__lock_streak_len, SP_LOCK_STREAK, memory_order_relaxed);
}

/* ---- entry records (see sp_lock_rec_t) --------------------------------------------------- */

/* Enough for every thread that owns a lock at once in any process we know; past them a thread
 * simply takes no re-bias (the CAS, as before). 64 KiB of zeroes until used. */
#define RECS 1024

sp_lock_rec_t sp__lock_no_rec;
static sp_lock_rec_t recs[RECS];
static __thread sp_lock_rec_t *t_rec; /* the calling thread's, once it took one */
static pthread_key_t rec_key;         /* its destructor gives the record back */
static pthread_once_t rec_once = PTHREAD_ONCE_INIT;
static bool rec_key_made;

/* At the end of a thread that took a record: free it for the next (its `in` is 0: the thread
 * holds no lock as it ends). A later destructor of the same thread that calls sympool takes a
 * record again (and so registers this destructor again, for another round). */
static void rec_give_back(void *p) {
    sp_lock_rec_t *r = p;
    t_rec = NULL;
    atomic_store_explicit(&r->thread, 0, memory_order_release);
}

static void rec_make_key(void) {
    rec_key_made = pthread_key_create(&rec_key, rec_give_back) == 0;
}

/* At the library's unload (dlclose; exit() too): a thread that took a record keeps the key's
 * value set for its life, and one that outlives the library would otherwise have glibc call
 * rec_give_back at an address no longer mapped as it exits (a deleted key's destructor is never
 * called). The records go with the library. */
__attribute__((destructor)) static void rec_delete_key(void) {
    if (rec_key_made)
        (void)pthread_key_delete(rec_key);
    rec_key_made = false;
}

/* The calling thread's record, taken now if it has none; NULL when none is free (or the thread
 * cannot register the destructor that gives it back). Off the hot paths. */
static sp_lock_rec_t *rec_get(void) {
    if (t_rec)
        return t_rec;
    pthread_once(&rec_once, rec_make_key);
    if (!rec_key_made)
        return NULL;
    uintptr_t me = SP_LOCK_ME();
    for (int i = 0; i < RECS; i++) {
        uintptr_t free_mark = 0;
        if (atomic_load_explicit(&recs[i].thread, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong_explicit(&recs[i].thread, &free_mark, me,
                                                    memory_order_acquire, memory_order_relaxed)) {
            if (pthread_setspecific(rec_key, &recs[i]) != 0) {
                atomic_store_explicit(&recs[i].thread, 0, memory_order_release);
                return NULL;
            }
            return t_rec = &recs[i];
        }
    }
    return NULL;
}

/* Every thread of the process executes a full barrier before this returns (see sp_lock_t). The
 * registration sp__lock_bias_begin made is the process's and a fork child's; should the call
 * still fail, the global form (every process, slower) is as good, and without either the owner
 * could be inside unseen, which is no state to go on from. */
static void barrier_everywhere(void) {
    uint64_t t0 = sp__now_ns();
    if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 ||
        membarrier(MEMBARRIER_CMD_GLOBAL) == 0) {
        sp__lock_streak_follow((long)(sp__now_ns() - t0));
        return;
    }
    fputs("sympool: membarrier failed while revoking a lock's bias; cannot go on safely\n", stderr);
    abort();
}

/* Is the owner still inside? The first bias's owner says so in the lock's `in`, a re-bias's in
 * its record, by naming the lock. */
static bool owner_inside(sp_lock_t *l, sp_lock_rec_t *r) {
    if (!r)
        return atomic_load_explicit(&l->in, memory_order_acquire) != 0;
    return atomic_load_explicit(&r->in, memory_order_acquire) == (uintptr_t)l;
}

/* Whether *stop (NULL: never) says to give up a wait (sp__lock_unless). */
static bool stopped(const atomic_bool *stop) {
    return stop != NULL && atomic_load_explicit(stop, memory_order_acquire);
}

/* Wait until the owner is out: spin, then sleep in bounded naps (the owner's unlock is a plain
 * store that wakes nobody; a revocation is rare). r: the re-bias owner's record, NULL for the
 * first bias. false: *stop turned nonzero first, the owner still inside. */
static bool wait_owner_out(sp_lock_t *l, sp_lock_rec_t *r, const atomic_bool *stop) {
    for (int spent = 0, wait = 1; spent < SPIN_PAUSES; spent += wait) {
        if (!owner_inside(l, r))
            return true;
        for (int k = 0; k < wait; k++)
            cpu_relax();
        wait = wait < SPIN_WAIT_MAX ? 2 * wait : wait;
    }
    while (owner_inside(l, r)) {
        if (stopped(stop))
            return false;
        struct timespec bound = {0, SP_LOCK_SLEEP_NS};
        nanosleep(&bound, NULL);
    }
    return true;
}

/* A revocation that must not wait any longer undone (the word is 1, this thread's since its
 * CAS, and the owner is still inside): the word back to `biased`, with the same owner, which
 * leaves as it entered (its exit writes only its `in`, or its record's); the process's count of
 * unbiased locks as it was; a thread that went to sleep on the held word woken to look again. */
static void revoke_undo(sp_lock_t *l, int biased) {
    atomic_store_explicit(&l->v, biased, memory_order_release);
    bias_back();
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&l->sleepers, memory_order_relaxed) != 0)
        sp__unlock_wake(l);
}

/* The holder of the word (1) counts its streak from this take on (a revoker's take is its
 * first). */
static void streak_begins(sp_lock_t *l) {
    l->streak_thread = SP_LOCK_STREAK_ME();
    l->countdown = (int16_t)atomic_load_explicit(&sp__lock_streak_len, memory_order_relaxed);
}

/* The holder of the word (1), with r the calling thread's record and nothing in it: the lock
 * re-biased to it, entered (the word REBIASED again, as the owner's entry would find it). */
static void enter_rebiased(sp_lock_t *l, sp_lock_rec_t *r) {
    __atomic_store_n(&l->rec_owner, r, __ATOMIC_RELAXED);
    atomic_store_explicit(&r->in, (uintptr_t)l, memory_order_relaxed);
    (void)atomic_exchange_explicit(&l->v, SP_LOCK_REBIASED, memory_order_seq_cst);
    if (atomic_load_explicit(&l->sleepers, memory_order_relaxed) != 0)
        sp__unlock_wake(l);
}

/* A thread that is not the owner found the word BIASED: take it (1). With no owner yet nobody can
 * be inside, so the taker becomes the owner and enters biased (a thread that waited meanwhile is
 * woken: it will find the word BIASED and revoke). Otherwise it revokes the bias: the barrier,
 * then a wait for the owner to be out. 1: taken; 0: the word changed first (another taker, or
 * the owner's own unbias), look again; -1: *stop (NULL: never) turned nonzero while the owner
 * was inside, the revocation undone, nothing held. */
static int take_biased_from_other(sp_lock_t *l, const atomic_bool *stop) {
    int c = SP_LOCK_BIASED;
    if (!atomic_compare_exchange_strong_explicit(&l->v, &c, 1, memory_order_acquire,
                                                 memory_order_relaxed))
        return 0;
    if (__atomic_load_n(&l->owner, __ATOMIC_RELAXED) == 0) {
        __atomic_store_n(&l->owner, SP_LOCK_ME(), __ATOMIC_RELAXED);
        atomic_store_explicit(&l->in, 1, memory_order_relaxed);
        (void)atomic_exchange_explicit(&l->v, SP_LOCK_BIASED, memory_order_seq_cst);
        if (atomic_load_explicit(&l->sleepers, memory_order_relaxed) != 0)
            sp__unlock_wake(l);
        return 1;
    }
    bias_lost();
    barrier_everywhere();
    if (!wait_owner_out(l, NULL, stop)) {
        revoke_undo(l, SP_LOCK_BIASED);
        return -1;
    }
    streak_begins(l);
    return 1;
}

/* The owner of a first bias, not inside (the lock's `in` is 0): the word from BIASED to 1 with
 * the CAS, no barrier (only the owner enters biased). false: a revoker's CAS came first. */
static bool cas_from(sp_lock_t *l, int biased) {
    int c = biased;
    return atomic_compare_exchange_strong_explicit(&l->v, &c, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

bool sp__lock_owner_take_slow(sp_lock_t *l) {
    if (bias_gone()) {
        if (!cas_from(l, SP_LOCK_BIASED))
            return false;
        bias_lost(); /* an ordinary lock now, so that the owner's hits may take the CAS */
        streak_begins(l);
        return true;
    }
    /* The re-bias era: the first bias becomes a re-bias (one set of hits serves every lock),
     * unless the thread holds a re-biased lock already (its record has room for one). */
    sp_lock_rec_t *r = rec_get();
    if (r && atomic_load_explicit(&r->in, memory_order_relaxed) != 0)
        return sp__lock_take_biased(l);
    if (!cas_from(l, SP_LOCK_BIASED))
        return false;
    if (r) {
        enter_rebiased(l, r);
        return true;
    }
    bias_lost(); /* no record left: an ordinary lock */
    streak_begins(l);
    return true;
}

/* The word said BIASED in sp__lock_slow: the owner enters (or unbiases); another thread becomes
 * the owner of a lock nobody owns yet, or revokes. */
static int take_from_bias(sp_lock_t *l, const atomic_bool *stop) {
    return sp__lock_mine(l) ? sp__lock_owner_take(l) : take_biased_from_other(l, stop);
}

/* The word said REBIASED in sp__lock_slow. The owner enters, unless the process's bias is gone
 * (it unbiases: an ordinary lock from now on) or it holds another re-biased lock (it takes this
 * one as 1 and gives it back REBIASED at the unlock: shutdown and the fork handler take every
 * device lock). Another thread revokes: the word to 1, the barrier, a wait for the owner's record
 * to let go of the lock. As take_biased_from_other: 1, 0 or -1 (stopped, only while revoking). */
static int take_from_rebias(sp_lock_t *l, const atomic_bool *stop) {
    sp_lock_rec_t *r = sp__lock_rec_mine(l);
    if (r && !bias_gone() && atomic_load_explicit(&r->in, memory_order_relaxed) == 0)
        return sp__lock_take_rebiased(l);
    if (!cas_from(l, SP_LOCK_REBIASED))
        return 0;
    if (r) { /* the owner, not inside: no barrier */
        if (bias_gone()) {
            bias_lost();
            streak_begins(l);
        } else {
            l->restore = true;
            l->streak_thread = SP_LOCK_STREAK_ME();
            l->countdown = 1; /* this take's unlock ends the streak: sp__lock_rebias restores */
        }
        return 1;
    }
    bias_lost();
    barrier_everywhere();
    if (!wait_owner_out(l, __atomic_load_n(&l->rec_owner, __ATOMIC_RELAXED), stop)) {
        revoke_undo(l, SP_LOCK_REBIASED);
        return -1;
    }
    streak_begins(l);
    return 1;
}

bool sp__lock_rebias(sp_lock_t *l) {
    l->countdown = (int16_t)atomic_load_explicit(&sp__lock_streak_len, memory_order_relaxed);
    if (l->restore) { /* the owner's nested take ends: REBIASED again, to the same owner */
        l->restore = false;
    } else {
        sp_lock_rec_t *r;
        if (!atomic_load_explicit(&bias_on, memory_order_relaxed) ||
            atomic_load_explicit(&l->waiting, memory_order_relaxed) != 0 ||
            atomic_load_explicit(&l->sleepers, memory_order_relaxed) != 0 || !(r = rec_get()))
            return false;
        __atomic_store_n(&l->rec_owner, r, __ATOMIC_RELAXED);
        atomic_fetch_or_explicit(&sp__lock_bias_state, SP_LOCK_ERA, memory_order_relaxed);
        bias_back();
    }
    atomic_store_explicit(&l->v, SP_LOCK_REBIASED, memory_order_release);
    atomic_signal_fence(memory_order_seq_cst); /* as sp__unlock_shared: the store, then the look */
    if (sp__lock_sleepers_seen(l))
        sp__unlock_wake(l);
    return true;
}

bool sp__lock_take_over_alone(sp_lock_t *l) {
    sp_lock_rec_t *r = rec_get();
    atomic_store_explicit(&l->v, 1, memory_order_relaxed);
    if (r && atomic_load_explicit(&r->in, memory_order_relaxed) == 0) {
        enter_rebiased(l, r);
        return true;
    }
    bias_lost(); /* held as 1; an ordinary lock from now on */
    streak_begins(l);
    return true;
}

static void lock_slow(sp_lock_t *l);

/* Counted in `waiting` while here: a re-bias would only make this thread revoke it. */
void sp__lock_slow(sp_lock_t *l) {
    atomic_fetch_add_explicit(&l->waiting, 1, memory_order_relaxed);
    lock_slow(l);
    atomic_fetch_sub_explicit(&l->waiting, 1, memory_order_relaxed);
}

static void lock_slow(sp_lock_t *l) {
    for (;;) {
        /* Between looks, a wait that doubles up to SPIN_WAIT_MAX pauses: a waiter that reads
         * the word without pause takes its line from the holder, whose next store must fetch
         * it back (two threads hammering one device: 330-480 ns a pair each with a look every
         * pause, 80-86 with this; bench_alloc_scale's case threads, 2026-11-28). */
        for (int spent = 0, wait = 1; spent < SPIN_PAUSES; spent += wait) {
            int c = atomic_load_explicit(&l->v, memory_order_relaxed);
            if (c == SP_LOCK_BIASED && take_from_bias(l, NULL) > 0)
                return;
            if (c == SP_LOCK_REBIASED && take_from_rebias(l, NULL) > 0)
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
        /* BIASED, REBIASED: the spin above takes it from the bias */
        if (!got && c != SP_LOCK_BIASED && c != SP_LOCK_REBIASED)
            sleep_on(l, c);
        count(l, -SP_LOCK_SLEEPER);
        if (got)
            return;
    }
}

/* ---- a take that gives up (sp__lock_unless) ----------------------------------------------- */

static bool lock_unless(sp_lock_t *l, const atomic_bool *stop);

/* Counted in `waiting` while here, as sp__lock_slow. */
bool sp__lock_unless(sp_lock_t *l, const atomic_bool *stop) {
    atomic_fetch_add_explicit(&l->waiting, 1, memory_order_relaxed);
    bool got = lock_unless(l, stop);
    atomic_fetch_sub_explicit(&l->waiting, 1, memory_order_relaxed);
    return got;
}

static bool lock_unless(sp_lock_t *l, const atomic_bool *stop) {
    for (long nap = 1000;; nap = nap < SP_LOCK_SLEEP_NS / 2 ? 2 * nap : SP_LOCK_SLEEP_NS) {
        if (sp__lock_try(l))
            return true;
        int c = atomic_load_explicit(&l->v, memory_order_relaxed), got = 0;
        /* Biased: the owner enters (its entries never wait for another thread); another thread
         * revokes, unless stopped while the owner is inside. */
        if (c == SP_LOCK_BIASED)
            got = take_from_bias(l, stop);
        else if (c == SP_LOCK_REBIASED)
            got = take_from_rebias(l, stop);
        if (got != 0)
            return got > 0;
        if (c == SP_LOCK_BIASED || c == SP_LOCK_REBIASED)
            continue; /* the word changed first: look again */
        /* Held as 1 by another thread: look again after a nap (the holder's unlock wakes only
         * the sleepers it counts; this thread is not one, so the nap bounds its wait). */
        if (stopped(stop))
            return false;
        struct timespec bound = {0, nap};
        nanosleep(&bound, NULL);
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
