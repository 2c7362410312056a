/* lock_probe.c: the device lock (core/core_lock.h, C11 atomics a C++ test cannot include) offered
 * to test_lock.cc through plain functions. */
#define _GNU_SOURCE /* syscall */
#include <linux/futex.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/core_lock.h"
#include "lock_probe.h"

int sp_probe_alone(void) {
    return sp__lock_alone();
}

void *sp_probe_lock_new(void) {
    sp_lock_t *l = malloc(sizeof(*l));
    if (l)
        sp__lock_init(l);
    return l;
}

void sp_probe_lock(void *l) {
    sp__lock(l);
}

void sp_probe_unlock(void *l) {
    sp__unlock(l);
}

int sp_probe_lock_word(void *l) {
    return atomic_load_explicit(&((sp_lock_t *)l)->v, memory_order_acquire);
}

int sp_probe_lock_sleepers(void *l) {
    return atomic_load_explicit(&((sp_lock_t *)l)->sleepers, memory_order_acquire) /
           SP_LOCK_SLEEPER;
}

int sp_probe_lock_sleepers_word(void *l) {
    return atomic_load_explicit(&((sp_lock_t *)l)->sleepers, memory_order_acquire);
}

void sp_probe_wake(void *l) {
    atomic_store_explicit(&((sp_lock_t *)l)->v, 0, memory_order_release);
    syscall(SYS_futex, &((sp_lock_t *)l)->v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void sp_probe_release_silently(void *l) {
    atomic_store_explicit(&((sp_lock_t *)l)->v, 0, memory_order_release);
}

void sp_probe_fork_child(void *l) {
    sp__lock_fork_child(l);
}

int sp_probe_bias_begin(void) {
    sp__lock_streak_pin(SP_LOCK_STREAK); /* the tests count takes */
    sp__lock_bias_end();
    return sp__lock_bias_begin();
}

void sp_probe_bias_nobody(void *l) {
    sp__lock_bias(l);
}

void sp_probe_bias(void *l) {
    sp__lock_bias(l);
    sp__lock(l); /* the first taker owns it */
    sp__unlock(l);
}

int sp_probe_lock_in(void *l) {
    return atomic_load_explicit(&((sp_lock_t *)l)->in, memory_order_acquire);
}

int sp_probe_bias_gone(void) {
    return atomic_load_explicit(&sp__lock_bias_state, memory_order_acquire) & SP_LOCK_GONE;
}

int sp_probe_lock_rebiased_in(void *l) {
    sp_lock_rec_t *r = __atomic_load_n(&((sp_lock_t *)l)->rec_owner, __ATOMIC_RELAXED);
    return atomic_load_explicit(&r->in, memory_order_acquire) == (uintptr_t)l;
}

int sp_probe_rebias_era(void) {
    return (atomic_load_explicit(&sp__lock_bias_state, memory_order_acquire) & SP_LOCK_ERA) != 0;
}

int sp_probe_lock_streak(void) {
    return atomic_load_explicit(&sp__lock_streak_len, memory_order_relaxed);
}

int sp_probe_streak_after_barrier(long ns) {
    sp__lock_streak_follow(ns);
    return sp_probe_lock_streak();
}

void sp_probe_streak_pin(int takes) {
    sp__lock_streak_pin(takes);
}

void *sp_probe_lock_rec_owner(void *l) {
    return __atomic_load_n(&((sp_lock_t *)l)->rec_owner, __ATOMIC_RELAXED);
}

int sp_probe_enter_rebiased_as(void *l, void *rec) {
    return sp__lock_enter_rebiased_as(l, rec);
}

int sp_probe_lock_waiting(void *l) {
    return atomic_load_explicit(&((sp_lock_t *)l)->waiting, memory_order_acquire);
}

static atomic_bool unless_stop;

void sp_probe_unless_stop(int on) {
    atomic_store_explicit(&unless_stop, on != 0, memory_order_release);
}

int sp_probe_lock_unless(void *l) {
    return sp__lock_unless(l, &unless_stop);
}
