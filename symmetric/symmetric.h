/*
 * symmetric.h: what symmetric/ offers the modules above it (collectives/: window lookup for
 * NCCL's symmetric kernels and the counters in the stats report).
 */
#ifndef SP_SYMMETRIC_SYMMETRIC_H
#define SP_SYMMETRIC_SYMMETRIC_H

#include <stdint.h>

#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Totals over this process's symmetric pools on `device` (device < 0: all devices):
 * segments registered (windows or shared windows created) and deregistered, and agreement
 * rounds (MPI_Allreduce calls made by sp_symmetric_malloc), live symmetric pools. */
typedef struct sp_sym_counters {
    int64_t registrations;    /* segments registered since process start */
    int64_t deregistrations;  /* segments deregistered */
    int64_t agreement_rounds; /* allreduce rounds of sp_symmetric_malloc */
    int64_t mallocs;          /* sp_symmetric_malloc calls that succeeded */
    int64_t growths;          /* collective segment growths */
    int64_t pools;            /* live symmetric pools */
} sp_sym_counters_t;

void sp__symmetric_counters(int device, sp_sym_counters_t *counters_p);

/* Test hook: the calling thread sleeps `seconds` at the start of each of its growths, before
 * the growth's first agreement round (0: none), so a test can make one rank late inside a
 * growth. Thread-local; never set by the library itself. */
void sp__sym_test_set_grow_delay(double seconds);

#ifdef __cplusplus
}
#endif

#endif /* SP_SYMMETRIC_SYMMETRIC_H */
