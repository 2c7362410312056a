/*
 * core_lock.h: the futex lock every per-device allocator is guarded by (offered upward: pool/
 * and above). The uncontended paths are inline; the slow paths live in core_lock.c.
 */
#ifndef SP_CORE_LOCK_H
#define SP_CORE_LOCK_H

#include <assert.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/core.h"

/* ThreadSanitizer builds (which must see every atomic: no load folded into inline asm). */
#if defined(__SANITIZE_THREAD__)
#define SP_LOCK_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) /* clang says it so, not with __SANITIZE_THREAD__ */
#define SP_LOCK_TSAN 1
#endif
#endif

/* glibc 2.32 and later say whether the process has only ever had one thread
 * (<sys/single_threaded.h>: false from its first pthread_create on). Elsewhere: threads. */
#if defined(__has_include)
#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#define SP_LOCK_KNOWS_THREADS 1
#endif
#endif

/* A futex lock from C11 atomics: the word is 0 free, 1 held, SP_LOCK_ALONE held by the
 * process's only thread (sp__lock_alone), or SP_LOCK_BIASED: reserved for one thread, the owner,
 * which takes it with plain stores (`in`); beside it, the threads that are asleep on it or about
 * to be, and whether a wake is on its way to one of them. Uncontended it costs one CAS to take and
 * a plain release store to give back: on x86 a locked read-modify-write costs about as much as the
 * rest of a cached malloc + free pair (bench/lock_cost.c), and this lock is taken twice a pair. The
 * price of the plain store is a rare late wake: the unlocker reads the sleepers after its store,
 * and the processor may read them before the store is visible (the store-buffer pattern), so a
 * sleeper that counted itself in that window and saw the word still held would miss its wake; every
 * sleep therefore ends after SP_LOCK_SLEEP_NS, when the sleeper looks again. Contended it spins
 * briefly, then sleeps in the kernel, because the holder may be inside a device call (cudaMalloc,
 * an MPI collective of a symmetric registrar) for milliseconds. ThreadSanitizer sees its
 * acquire/release atomics.
 *
 * The bias (SP_LOCK_BIASED): most processes allocate from one thread (an mpirun rank's main
 * thread, beside the MPI library's own threads), and even the CAS is then a third of the pair's
 * time. The allocator makes its device locks biased to nobody yet; the first thread to take one
 * becomes its owner (`owner`, its thread pointer: one load to compare). The owner enters by
 * storing 1 in `in` and checking that the word still says BIASED, and leaves by storing 0, with
 * no locked instruction. (A thread made after the owner ended may get its thread pointer, and the
 * bias with it: one live thread has it.)
 * Another thread that wants the lock revokes the bias for good: it takes the word from BIASED to 1
 * with a CAS, makes every thread of the process execute a full memory barrier (membarrier(2),
 * MEMBARRIER_CMD_PRIVATE_EXPEDITED), then waits until `in` is 0. The barrier is what makes the
 * owner's plain store and load safe (the asymmetric form of Dekker's pattern: the owner's side pays
 * a compiler barrier, the rare side a system call): after it, an owner that stored `in` before the
 * barrier is seen inside, and one that checks the word after it sees the revocation and steps back.
 * That first bias is never given again (a word only its owner writes cannot change hands: an
 * owner stopped between its look at `owner` and its store of `in` would store it late, over the
 * next owner's).
 *
 * Re-biasing (SP_LOCK_REBIASED): a thread that took a biasable lock with the CAS a streak of
 * times in a row (SP_LOCK_STREAK or more), with nobody waiting for it, gives it back biased to
 * itself (sp__lock_rebias): the lock follows the thread that now uses it alone (the forward pass's
 * thread, then the backward pass's), at the price of one revocation each time its user changes, at
 * most once per streak. Such a bias has an entry word of the owner's own, in its entry record
 * (sp_lock_rec_t, `rec_owner`): a former owner stopped anywhere in its entry writes only its own
 * record, and its look at the word (REBIASED) and at `rec_owner` after its store sends it back.
 * The record is found through the lock, not in thread-local storage (whose model in a shared
 * library loaded by Python costs a call per access, or static TLS that may be exhausted), and the
 * entry checks that the record is the calling thread's before it stores. A revocation takes the
 * word from REBIASED to 1, the barrier, then waits until the owner's record no longer names the
 * lock. Once the process has re-biased a lock (SP_LOCK_ERA), a first bias that its owner
 * takes again becomes a re-bias too, so that one set of hit copies serves every lock. */
typedef struct sp_lock_rec sp_lock_rec_t;
typedef struct sp_lock {
    atomic_int v;           /* 0, 1, SP_LOCK_BIASED, SP_LOCK_ALONE or SP_LOCK_REBIASED as above */
    atomic_int sleepers;    /* SP_LOCK_SLEEPER per thread in sp__lock_slow's sleep or about to
                               enter it, plus SP_LOCK_WAKING while a wake is on its way */
    atomic_int in;          /* 1 while the first bias's owner holds the lock that way (only it
                               stores) */
    uint32_t streak_thread; /* the thread whose CAS takes countdown counts (SP_LOCK_STREAK_ME:
                               two threads alike there are counted as one, which only re-biases
                               sooner; the holder's) */
    int16_t countdown;      /* CAS takes by streak_thread left before it re-biases (the holder's) */
    bool biasable;          /* sp__lock_bias made it so (const after) */
    bool restore;           /* give it back REBIASED at the unlock (the holder's) */
    atomic_ushort waiting;  /* threads in sp__lock_slow: no re-bias while one waits (it would
                               revoke at once) */
    uintptr_t owner;        /* the first bias's owner's thread pointer (SP_LOCK_ME), 0 for none yet;
                               set once, by the first thread to take the lock, while it holds the
                               word */
    sp_lock_rec_t *rec_owner; /* a re-bias's owner (its entry record; sp__lock_no_rec for none):
                                 written only while the word is held as 1 */
} sp_lock_t;

/* A thread's entry record for re-biased locks: the thread (its SP_LOCK_ME, 0 while free) and the
 * lock it holds re-biased (its address, 0 for none). Only its thread stores `in`; a revoker reads
 * it. Records are never freed (a revoker may read the record of a thread that has just ended); a
 * thread's goes back to the pool when the thread ends, for the next thread that becomes an owner,
 * with whatever biases the old one held (nobody can be inside them). One cache line each: every
 * re-biased entry and exit stores into it. */
struct sp_lock_rec {
    _Alignas(64) atomic_uintptr_t thread;
    atomic_uintptr_t in;
};

/* The record no thread has: `rec_owner` of a lock never re-biased. */
extern sp_lock_rec_t sp__lock_no_rec;

/* CAS takes in a row by one thread after which it takes the bias (see sp_lock_t): at least
 * SP_LOCK_STREAK, and more where revocations cost more. A revocation's barrier interrupts every
 * processor that runs one of the process's threads: on the 2026-11-29 machine (a virtual machine
 * with two processors) 1-5 us on average in bench_alloc's phases with the waiting thread asleep,
 * 23-34 us with it spinning on the other processor. A biased take saves about 5 ns over the CAS
 * (bench_alloc: 19 against 29 ns a pair), so the streak is the revocations' recent cost over
 * 2.5 ns: a lock re-biased at the end of
 * a streak and revoked at once has cost its thread at most about half again what the streak's CAS
 * takes cost, and a longer run pays the barrier back (sp__lock_streak_len; at most INT16_MAX). */
#define SP_LOCK_STREAK 1024
extern atomic_int sp__lock_streak_len;
/* A revocation's barrier took ns: the streak follows the running average. */
void sp__lock_streak_follow(long ns);
/* Tests: fix the streak at takes (0: follow the barrier again, from SP_LOCK_STREAK). */
void sp__lock_streak_pin(int takes);

#define SP_LOCK_BIASED 2
#define SP_LOCK_ALONE 3
#define SP_LOCK_REBIASED 4
/* An unlock that sees sleepers wakes one unless a wake is already on its way (WAKING): the
 * woken thread needs a while to run, and the holder may unlock many times meanwhile. Any sleeper
 * that counts itself in or out clears the flag (a wake that found nobody must not keep the next
 * sleeper waiting for its bound). */
#define SP_LOCK_WAKING 1
#define SP_LOCK_SLEEPER 2

/* The longest a waiter sleeps before it looks at the word again: the bound on a missed wake. */
#define SP_LOCK_SLEEP_NS 1000000

static inline void sp__lock_init(sp_lock_t *l) {
    atomic_init(&l->v, 0);
    atomic_init(&l->sleepers, 0);
    atomic_init(&l->in, 0);
    l->countdown = SP_LOCK_STREAK;
    l->owner = 0;
    l->rec_owner = &sp__lock_no_rec;
    l->streak_thread = 0;
    l->biasable = false;
    l->restore = false;
    atomic_init(&l->waiting, 0);
}

/* The calling thread, as `owner` names it: its thread pointer (one instruction where the
 * compiler offers it; a live thread's is its own). */
#if defined(__x86_64__) || defined(__aarch64__)
#define SP_LOCK_ME() ((uintptr_t)__builtin_thread_pointer())
#else
#include <pthread.h>
#define SP_LOCK_ME() ((uintptr_t)pthread_self())
#endif

/* The process's biases in one word, so that a whole path asks with one load whether the hits
 * are the right ones: under SP_LOCK_GONE, how many biasable locks are not biased now (revoked or
 * unbiased, and not re-biased since), plus one while biasing is off: while that is not 0 the
 * process's hits take the lock with the CAS (the allocator looks at it on its whole paths), and an
 * owner turns its biased locks into ordinary ones at their next take, so that its hits may take
 * the CAS too; SP_LOCK_ERA once a lock was re-biased, until sp__lock_bias_end (see sp_lock_t). */
extern atomic_int sp__lock_bias_state;
#define SP_LOCK_ERA (1 << 30)
#define SP_LOCK_GONE (SP_LOCK_ERA - 1)

/* At allocator init (serialized by its caller): may the locks made now be biased? Yes when the
 * kernel offers the barrier revocation needs; else sp__lock_bias_state says so. sp__lock_bias_end,
 * at shutdown, clears it. */
bool sp__lock_bias_begin(void);
void sp__lock_bias_end(void);

/* Make a lock nobody holds or waits on biased, to nobody yet (after sp__lock_bias_begin said
 * yes; before another thread can see the lock): its first taker becomes the owner. */
static inline void sp__lock_bias(sp_lock_t *l) {
    l->biasable = true;
    __atomic_store_n(&l->owner, 0, __ATOMIC_RELAXED);
    atomic_store_explicit(&l->v, SP_LOCK_BIASED, memory_order_release);
}

/* Is the calling thread the lock's owner? The word may be written by a first taker meanwhile
 * (once); only this thread ever writes this thread's value there, so any value read answers
 * right. A plain read outside ThreadSanitizer builds (an aligned word: one load on the targets
 * with SP_LOCK_ME's one-instruction form): the relaxed atomic load made GCC 12 save one more
 * register in free_fast (5 instructions a cached pair). */
static inline bool sp__lock_mine(const sp_lock_t *l) {
#ifdef SP_LOCK_TSAN
    return __atomic_load_n(&l->owner, __ATOMIC_RELAXED) == SP_LOCK_ME();
#else
    return l->owner == SP_LOCK_ME();
#endif
}

/* The owner's exit: `in` back to 0, a release store (a revoker waiting for it reads it with an
 * acquire load). */
static inline void sp__unlock_biased(sp_lock_t *l) {
#if defined(__x86_64__) && !defined(SP_LOCK_TSAN)
    /* A release store is a plain one on x86; written so, the compiler addresses `in` off the lock
     * it holds in a register already instead of keeping a pointer to it across the hold (a
     * register more to save in free_fast: 6 instructions a pair). */
    __asm__ volatile("movl $0, %0" : "=m"(l->in) : : "memory");
#else
    atomic_store_explicit(&l->in, 0, memory_order_release);
#endif
}

/* Does the word still say BIASED? On x86-64 (but under ThreadSanitizer) the compare's own memory
 * operand, as sp__lock_sleepers_seen. The loads of what the lock guards cannot pass it on x86
 * (loads are not reordered with older loads), nor, for the compiler, the fence before it. */
static inline bool sp__lock_still_biased(sp_lock_t *l) {
#if defined(__x86_64__) && defined(__GCC_ASM_FLAG_OUTPUTS__) && !defined(SP_LOCK_TSAN)
    bool biased;
    __asm__ volatile("cmpl %2, %1" : "=@cce"(biased) : "m"(l->v), "i"(SP_LOCK_BIASED));
    return biased;
#else
    return atomic_load_explicit(&l->v, memory_order_acquire) == SP_LOCK_BIASED;
#endif
}

/* The owner's entry: `in` first, then the word; if the word no longer says BIASED a revoker
 * has it (and waits for `in` to be 0 again), so step back. The compiler barrier keeps the two
 * in this order; the processor may still let the load pass the store, which is what the
 * revoker's membarrier rules out (see sp_lock_t). */
static inline bool sp__lock_take_biased(sp_lock_t *l) {
    atomic_store_explicit(&l->in, 1, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    if (SP_LIKELY(sp__lock_still_biased(l)))
        return true;
    sp__unlock_biased(l);
    return false;
}

/* The owner, once the process's bias is gone (sp__lock_bias_state), on a lock still biased:
 * turns it into an ordinary held lock (1), so that its hits take the CAS path with the rest; in
 * the re-bias era, turns it into a re-biased one (or an ordinary one, with no record left). */
bool sp__lock_owner_take_slow(sp_lock_t *l);

/* sp__lock's first step in the owner: the biased entry if the lock is biased. */
static inline bool sp__lock_owner_take(sp_lock_t *l) {
    if (atomic_load_explicit(&l->v, memory_order_relaxed) != SP_LOCK_BIASED)
        return false;
    if (SP_UNLIKELY(atomic_load_explicit(&sp__lock_bias_state, memory_order_relaxed)))
        return sp__lock_owner_take_slow(l);
    return sp__lock_take_biased(l);
}

/* ---- re-biased locks (SP_LOCK_REBIASED; see sp_lock_t) ------------------------------------- */

/* Is r the calling thread's record? */
static inline bool sp__lock_rec_is_mine(sp_lock_rec_t *r) {
    return atomic_load_explicit(&r->thread, memory_order_relaxed) == SP_LOCK_ME();
}

/* The calling thread's record if it is l's re-bias owner's, else NULL. */
static inline sp_lock_rec_t *sp__lock_rec_mine(const sp_lock_t *l) {
    sp_lock_rec_t *r = __atomic_load_n(&l->rec_owner, __ATOMIC_RELAXED);
    return sp__lock_rec_is_mine(r) ? r : NULL;
}

/* Does the word say REBIASED, and is r still the owner's record? The word first: a re-biaser
 * writes the record before the word (release), so a REBIASED read here comes with its owner and
 * a former owner never pairs its own record with the next owner's bias. On x86-64 (but under
 * ThreadSanitizer) each is a compare with its own memory operand, in volatile asm that keeps the
 * two loads in this order for the compiler (the processor does not reorder loads there). */
static inline bool sp__lock_still_rebiased(sp_lock_t *l, sp_lock_rec_t *r) {
#if defined(__x86_64__) && defined(__GCC_ASM_FLAG_OUTPUTS__) && !defined(SP_LOCK_TSAN)
    bool biased, owner;
    __asm__ volatile("cmpl %2, %1" : "=@cce"(biased) : "m"(l->v), "i"(SP_LOCK_REBIASED));
    if (!biased)
        return false;
    __asm__ volatile("cmpq %2, %1" : "=@cce"(owner) : "m"(l->rec_owner), "r"(r));
    return owner;
#else
    return atomic_load_explicit(&l->v, memory_order_acquire) == SP_LOCK_REBIASED &&
           __atomic_load_n(&l->rec_owner, __ATOMIC_RELAXED) == r;
#endif
}

/* The re-bias owner's entry: only if the owner's record is the calling thread's, its `in` names
 * l, then the word and the owner are checked again; a revoker has the word (and waits for the
 * record to change) or another thread owns it now: step back. The compiler barrier keeps the
 * store first; the processor may let the loads pass it, which the revoker's membarrier rules out
 * as for the first bias. A thread holding another re-biased lock (its record has room for one)
 * does not come here: sp__lock_slow takes it otherwise. */
static inline bool sp__lock_enter_rebiased_as(sp_lock_t *l, sp_lock_rec_t *r) {
    atomic_store_explicit(&r->in, (uintptr_t)l, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    if (SP_LIKELY(sp__lock_still_rebiased(l, r)))
        return true;
    atomic_store_explicit(&r->in, 0, memory_order_release);
    return false;
}

static inline bool sp__lock_take_rebiased(sp_lock_t *l) {
    sp_lock_rec_t *r = __atomic_load_n(&l->rec_owner, __ATOMIC_RELAXED); /* never NULL */
    if (!sp__lock_rec_is_mine(r))
        return false;
    /* A thread stopped here while the lock changes owner enters as r: the checks after its store
     * send it back (sp__lock_enter_rebiased_as is that step alone, for the tests). */
    return sp__lock_enter_rebiased_as(l, r);
}

/* The re-bias owner's exit (the owner cannot change while it is inside: a revoker waits). */
static inline void sp__unlock_rebiased(sp_lock_t *l) {
    sp_lock_rec_t *r = __atomic_load_n(&l->rec_owner, __ATOMIC_RELAXED);
    atomic_store_explicit(&r->in, 0, memory_order_release);
}

/* Does the calling thread hold l re-biased? */
static inline bool sp__lock_held_rebiased(const sp_lock_t *l) {
    sp_lock_rec_t *r = sp__lock_rec_mine(l);
    return r && atomic_load_explicit(&r->in, memory_order_relaxed) == (uintptr_t)l;
}

/* At the end of a streak (sp__lock_streak_ends), by the holder of the word (1), as its unlock:
 * gives the lock back re-biased to the calling thread (or as it was, `restore`). false: not done
 * (the lock is not biasable, biasing is off, a thread waits for it, or no record is left); the
 * caller unlocks as usual. */
bool sp__lock_rebias(sp_lock_t *l);

/* The calling thread as the streak counts it: 32 bits of its thread pointer (the lock's size is in
 * every address of a device's allocator: 40 bytes). */
#define SP_LOCK_STREAK_ME() ((uint32_t)(SP_LOCK_ME() >> 4))

/* The holder of the word (1), at its unlock: is this the calling thread's streak-th CAS
 * take in a row (or a take that must give the bias back, `restore`)? The fields are the
 * holder's. */
static inline bool sp__lock_streak_ends(sp_lock_t *l) {
    uint32_t me = SP_LOCK_STREAK_ME();
    if (SP_UNLIKELY(l->streak_thread != me)) {
        l->streak_thread = me;
        /* this take is the streak's first */
        l->countdown =
            (int16_t)(atomic_load_explicit(&sp__lock_streak_len, memory_order_relaxed) - 1);
        return false;
    }
    return SP_UNLIKELY(--l->countdown == 0);
}

/* In a fork child, before its handler gives back a lock the forking thread took in prepare: the
 * child has that thread alone, so nobody sleeps on the lock or waits for it; the counts of the
 * parent's sleepers and waiters copied with it are forgotten (kept, every unlock in the child
 * would go to sp__unlock_wake for good, and no streak would re-bias the lock, as no such thread
 * is left to count itself out). A lock the forking thread entered biased (its own) whose word is
 * 1 was being revoked: another thread of the parent took the word and waits for the forking
 * thread to leave. The child has no such thread, so the forking thread takes the word over and
 * leaves its biased entry: its unlock then gives the word back, an ordinary lock as the
 * revocation counted it (given back biased only, the word stayed held and the child's next take
 * of the lock waited forever; LockBias.AForkChildFreesALockWhoseRevokerItDoesNotHave). */
static inline void sp__lock_fork_child(sp_lock_t *l) {
    atomic_store_explicit(&l->sleepers, 0, memory_order_relaxed);
    atomic_store_explicit(&l->waiting, 0, memory_order_relaxed);
    if (atomic_load_explicit(&l->v, memory_order_relaxed) != 1)
        return;
    if (sp__lock_mine(l) && atomic_load_explicit(&l->in, memory_order_relaxed))
        sp__unlock_biased(l);
    else if (sp__lock_held_rebiased(l))
        sp__unlock_rebiased(l);
}

void sp__lock_slow(sp_lock_t *l);
/* sp__lock for the fork handler: takes l, unless *stop turns nonzero while another thread holds
 * it; then false, nothing held (a revocation of its bias under way is undone). *stop is written
 * by l's holder alone (a device's "inside a user callback" flag), so a holder that waits for the
 * caller, which sp__lock would wait for in turn, is left alone. Polls in naps of up to
 * SP_LOCK_SLEEP_NS: a slow path, once per fork. */
bool sp__lock_unless(sp_lock_t *l, const atomic_bool *stop);
void sp__unlock_wake(sp_lock_t *l);
void sp__unlock_born(sp_lock_t *l);
/* Alone, on a re-biased lock (a fork child's): the only thread enters it as its owner. */
bool sp__lock_take_over_alone(sp_lock_t *l);

/* True while the process has one thread: then no other thread can hold the lock, wait on it or
 * read what it guards, and the lock word needs no locked instruction. This is glibc's own rule
 * for its arena locks (SINGLE_THREAD_P in malloc.c). Its value can only turn false while the
 * lock is held if the holder itself creates a thread, and pthread_create orders the holder's
 * plain stores before the new thread's first step, so a thread that then contends sees the lock
 * held, and the holder's unlock, no longer alone, wakes it (sp__unlock_born). Alone, the CAS
 * that takes the lock is saved too (bench/lock_cost.c prices a CAS on the machine at hand,
 * against a plain store); the replay CLI and single-threaded programs take the lock twice per
 * malloc + free pair. A thread made without pthread_create (a raw clone) would be invisible
 * here: such threads may not call sympool, as they may not call glibc's stdio or malloc
 * (docs/threads.md). */
static inline bool sp__lock_alone(void) {
#ifdef SP_LOCK_KNOWS_THREADS
    return __libc_single_threaded != 0;
#else
    return false;
#endif
}

/* For a hot path that knows the process is not single-threaded (or that takes the CAS path
 * anyway): the CAS alone, and the unlock of a lock so taken (1 in the word, never
 * SP_LOCK_ALONE), with no question at either. */
static inline bool sp__lock_try_shared(sp_lock_t *l) {
    int c = 0;
    return atomic_compare_exchange_strong_explicit(&l->v, &c, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

/* Does the sleepers' word say anything (sleepers, or a wake on its way)? A relaxed load. On
 * x86-64 (but under ThreadSanitizer, which must see the atomic) the load is the compare's own
 * memory operand: compilers do not fold an atomic load into a compare, and this is one
 * instruction of the cached pair's two unlocks. An aligned 4-byte load is atomic there. */
static inline bool sp__lock_sleepers_seen(sp_lock_t *l) {
#if defined(__x86_64__) && defined(__GCC_ASM_FLAG_OUTPUTS__) && !defined(SP_LOCK_TSAN)
    bool seen;
    __asm__ volatile("cmpl $0, %1" : "=@ccne"(seen) : "m"(l->sleepers));
    return seen;
#else
    return atomic_load_explicit(&l->sleepers, memory_order_relaxed) != 0;
#endif
}

/* The unlock of a lock held as 1 that is not biasable (or whose streak goes on). */
static inline void sp__unlock_plain(sp_lock_t *l) {
    atomic_store_explicit(&l->v, 0, memory_order_release);
    /* The compiler may not read the sleepers before the store (the processor still may: that is
     * the late wake SP_LOCK_SLEEP_NS bounds). */
    atomic_signal_fence(memory_order_seq_cst);
    if (SP_UNLIKELY(sp__lock_sleepers_seen(l)))
        sp__unlock_wake(l);
}

/* A biasable lock held as 1: the streak counts this take, and its end re-biases. */
static inline void sp__unlock_counted(sp_lock_t *l) {
    if (SP_UNLIKELY(sp__lock_streak_ends(l)) && sp__lock_rebias(l))
        return;
    sp__unlock_plain(l);
}

static inline void sp__unlock_shared(sp_lock_t *l) {
    if (SP_UNLIKELY(l->biasable))
        sp__unlock_counted(l);
    else
        sp__unlock_plain(l);
}

/* For a path that asked sp__lock_alone and was told yes: alone, the lock is free (its holder
 * would be another thread; this thread taking it again is a bug that deadlocks on the atomic
 * path too), so a plain store takes it, with no load. Its unlock asks again: the holder may have
 * made a thread meanwhile. */
static inline void sp__lock_take_alone(sp_lock_t *l) {
    assert(atomic_load_explicit(&l->v, memory_order_relaxed) == 0);
    atomic_store_explicit(&l->v, SP_LOCK_ALONE, memory_order_relaxed);
}

/* Alone, a biased lock is not this thread's only when nobody owns it yet or its owner ended
 * (sp__lock asks sp__lock_mine first): the only thread takes it over and enters biased. */
static inline bool sp__lock_try_alone(sp_lock_t *l) {
    int c = atomic_load_explicit(&l->v, memory_order_relaxed);
    if (c == SP_LOCK_BIASED) {
        __atomic_store_n(&l->owner, SP_LOCK_ME(), __ATOMIC_RELAXED);
        atomic_store_explicit(&l->in, 1, memory_order_relaxed);
        return true;
    }
    if (SP_UNLIKELY(c == SP_LOCK_REBIASED)) /* a fork child of a process that re-biased it */
        return sp__lock_take_over_alone(l);
    sp__lock_take_alone(l);
    return true;
}

static inline void sp__unlock_alone(sp_lock_t *l) {
    if (SP_LIKELY(sp__lock_alone()))
        atomic_store_explicit(&l->v, 0, memory_order_release);
    else
        sp__unlock_born(l); /* this thread made another while it held the lock */
}

/* The unlock of a lock taken alone by a holder that made no thread while it held it (a hit path
 * that calls nothing that could): the process is still single-threaded, so a plain store. */
static inline void sp__unlock_alone_held_briefly(sp_lock_t *l) {
    assert(sp__lock_alone());
    atomic_store_explicit(&l->v, 0, memory_order_release);
}

/* Take the lock if it is free; never waits. */
static inline bool sp__lock_try(sp_lock_t *l) {
    if (sp__lock_alone())
        return sp__lock_try_alone(l);
    return sp__lock_try_shared(l);
}

static inline void sp__lock(sp_lock_t *l) {
    if (SP_UNLIKELY(sp__lock_mine(l)) && sp__lock_owner_take(l))
        return;
    if (SP_LIKELY(sp__lock_try(l)))
        return;
    sp__lock_slow(l);
}

/* The lock word says how the lock was taken, so that a multi-threaded unlock pays one compare
 * for the single-threaded path, not a second look at sp__lock_alone. The owner of the bias looks
 * at `in` first: a revoker may have changed the word while the owner was inside. */
static inline void sp__unlock(sp_lock_t *l) {
    if (!l->biasable) { /* never biased: a thread cache's lock, or biasing off */
        if (atomic_load_explicit(&l->v, memory_order_relaxed) == SP_LOCK_ALONE)
            sp__unlock_alone(l);
        else
            sp__unlock_plain(l);
        return;
    }
    if (SP_UNLIKELY(sp__lock_mine(l)) && atomic_load_explicit(&l->in, memory_order_relaxed))
        sp__unlock_biased(l);
    else if (atomic_load_explicit(&l->v, memory_order_relaxed) == SP_LOCK_ALONE)
        sp__unlock_alone(l);
    else if (sp__lock_held_rebiased(l))
        sp__unlock_rebiased(l);
    else
        sp__unlock_counted(l);
}

#endif /* SP_CORE_LOCK_H */
