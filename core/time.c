/*
 * time.c: the two clocks every module uses. sp__now_ns() is CLOCK_MONOTONIC (durations, deadlines,
 * history timestamps that must never go backwards); sp__epoch_us() is CLOCK_REALTIME (wall-clock
 * stamps in snapshots and reports, comparable across ranks and with PyTorch's traces).
 * No state, no lock.
 */
#include <time.h>

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
