/*
 * time.c: the two clocks every module uses. sp__now_ns() is CLOCK_MONOTONIC (durations, deadlines,
 * history timestamps that must never go backwards); sp__epoch_us() is CLOCK_REALTIME (wall-clock
 * stamps in snapshots and reports, comparable across ranks and with PyTorch's traces).
 * sp__ticks() is the cheap stamp of a recorded event, mapped to wall-clock microseconds when the
 * events are read (sp__tick_map): PyTorch stamps its trace entries the same way (an approximate
 * clock converted at snapshot time). State: only whether the TSC can be used, found once.
 */
#include <math.h>
#include <time.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

#include "core/core.h"

uint64_t sp__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t sp__epoch_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + (int64_t)(ts.tv_nsec / 1000);
}

/* 0 = not looked at yet, 1 = the TSC, 2 = CLOCK_MONOTONIC. Found once; a race finds the same. */
static int g_tick_source = 0;

static int tick_source(void) {
#if defined(__x86_64__)
    /* The invariant TSC (CPUID 0x80000007, EDX bit 8: Intel SDM vol. 3, 18.17.1; AMD APM vol. 3,
     * CPUID Fn8000_0007 EDX[8]) runs at a constant rate in every power state and, on the parts
     * that have it, is synchronized across cores. Without it (some VMs hide it) the TSC may stop
     * or change rate, so the monotonic clock serves. */
    unsigned a, b, c, d;
    if (__get_cpuid(0x80000007u, &a, &b, &c, &d) && (d & (1u << 8)) != 0)
        return 1;
#endif
    return 2;
}

uint64_t sp__ticks(void) {
    int source = __atomic_load_n(&g_tick_source, __ATOMIC_RELAXED);
    if (SP_UNLIKELY(source == 0)) {
        source = tick_source();
        __atomic_store_n(&g_tick_source, source, __ATOMIC_RELAXED);
    }
#if defined(__x86_64__)
    if (source == 1)
        return __rdtsc(); /* some 20 cycles; clock_gettime through the vDSO cost ~19 ns here */
#endif
    return sp__now_ns();
}

/* The clocks are read between two tick readings, and the ticks of the anchor are their midpoint;
 * of three tries the one with the two readings closest together. The first reading of a clock
 * in a process can cost tens of microseconds (kvm-clock: ~59 us on the development VM), which
 * then lay between the anchor's ticks and its times: every stamp of the history came out ~45 us
 * late, and by another amount in each process. */
void sp__tick_anchor(sp_tick_anchor_t *a) {
    (void)sp__now_ns(); /* warm both clocks (and the tick source) up first */
    (void)sp__epoch_us();
    uint64_t best = UINT64_MAX;
    for (int k = 0; k < 3; k++) {
        uint64_t t0 = sp__ticks();
        uint64_t mono = sp__now_ns();
        int64_t epoch = sp__epoch_us();
        uint64_t t1 = sp__ticks();
        if (t1 >= t0 && t1 - t0 < best) {
            best = t1 - t0;
            a->ticks = t0 + (t1 - t0) / 2;
            a->mono_ns = mono;
            a->epoch_us = epoch;
        }
    }
    if (best == UINT64_MAX) { /* ticks went back every time (cannot, on one CPU's counter) */
        a->ticks = sp__ticks();
        a->mono_ns = sp__now_ns();
        a->epoch_us = sp__epoch_us();
    }
}

/* The rate comes from the monotonic clock (never from the wall clock, which NTP may step back
 * between the anchors); the wall clock only places the first anchor. Between two anchors the
 * error is their reading jitter (well under a microsecond), however close they are. */
void sp__tick_map(const sp_tick_anchor_t *from, const sp_tick_anchor_t *to, sp_tick_map_t *m) {
    m->ticks0 = from->ticks;
    m->epoch_us0 = from->epoch_us;
    m->us_per_tick = 1e-3; /* ticks are nanoseconds where the TSC is not used */
    if (to->ticks > from->ticks && to->mono_ns >= from->mono_ns &&
        __atomic_load_n(&g_tick_source, __ATOMIC_RELAXED) == 1)
        m->us_per_tick =
            (double)(to->mono_ns - from->mono_ns) * 1e-3 / (double)(to->ticks - from->ticks);
}

int64_t sp__tick_us(const sp_tick_map_t *m, uint64_t ticks) {
    /* Signed: a stamp taken before the first anchor (another enable's) lies before it. */
    double off = (double)(int64_t)(ticks - m->ticks0) * m->us_per_tick;
    return m->epoch_us0 + (int64_t)floor(off);
}
