/* bench/lock_cost.c: what this machine charges for the locked read-modify-writes that sympool's
 * device lock makes on every sp_malloc and sp_free (a CAS to take it, a locked decrement to give
 * it back), next to a plain store, so that the cached pair's ratio to glibc can be read against
 * the machine it was measured on: glibc's tcache pair makes none of them. One JSON line.
 * Usage: bench_lock_cost [iterations] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000000;
    if (n <= 0) {
        fprintf(stderr, "usage: bench_lock_cost [iterations > 0]\n");
        return 2;
    }
    int word = 0;
    double t0 = now_ns();
    for (long i = 0; i < n; i++) { /* take and give back, as sp__lock/sp__unlock do uncontended */
        int expected = 0;
        __atomic_compare_exchange_n(&word, &expected, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&word, 1, __ATOMIC_RELEASE);
    }
    double t1 = now_ns();
    for (long i = 0; i < n; i++) { /* the same pair of states with a plain release store */
        int expected = 0;
        __atomic_compare_exchange_n(&word, &expected, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
        __atomic_store_n(&word, 0, __ATOMIC_RELEASE);
    }
    double t2 = now_ns();
    for (long i = 0; i < n; i++) /* one locked add alone */
        __atomic_fetch_add(&word, 1, __ATOMIC_SEQ_CST);
    double t3 = now_ns();
    printf("{\"bench\":\"lock_cost\",\"iterations\":%ld,\"cas_and_locked_dec_ns\":%.2f,"
           "\"cas_and_store_ns\":%.2f,\"locked_add_ns\":%.2f}\n",
           n, (t1 - t0) / (double)n, (t2 - t1) / (double)n, (t3 - t2) / (double)n);
    return word == (int)n ? 0 : 1;
}
