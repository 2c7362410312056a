/*
 * symmetric.h: what symmetric/ offers the modules above it (collectives/: window lookup for
 * NCCL's symmetric kernels and the counters in the stats report).
 */
#ifndef SP_SYMMETRIC_SYMMETRIC_H
#define SP_SYMMETRIC_SYMMETRIC_H

#include <stdbool.h>
#include <stdint.h>

#include "sympool/mempool.h"
#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The counters of symmetric/, one list: X(ENUM, field, help). Totals over this process's
 * symmetric pools; every update is a relaxed atomic add (sp__symc_add). The stats report, the
 * experimental header's copy and the struct below are all generated from it. */
#define SP_SYMC_LIST(X)                                                                            \
    X(REGISTRATIONS, registrations,                                                                \
      "segments registered by symmetric pools (NCCL windows or MPI shared windows)")               \
    X(DEREGISTRATIONS, deregistrations, "segments deregistered by symmetric pools")                \
    X(ROUNDS, agreement_rounds,                                                                    \
      "agreement rounds (MPI_Allreduce calls) made by sp_symmetric_malloc")                        \
    X(MALLOCS, mallocs, "sp_symmetric_malloc calls that succeeded")                                \
    X(GROWTHS, growths, "collective segment growths of symmetric pools")                           \
    X(POOLS, pools, "live symmetric pools")

typedef enum {
#define X(e, field, help) SP_SYMC_##e,
    SP_SYMC_LIST(X)
#undef X
        SP_SYMC_COUNT
} sp_symc_t;

/* Totals on `device` (device < 0: all devices), one field per SP_SYMC_LIST entry. */
typedef struct sp_sym_counters {
#define X(e, field, help) int64_t field;
    SP_SYMC_LIST(X)
#undef X
} sp_sym_counters_t;

void sp__symmetric_counters(int device, sp_sym_counters_t *counters_p);
void sp__symc_add(int device, sp_symc_t which, int64_t delta);

/* Whether `pool` is a symmetric pool whose state is gone: its world was finalized, which
 * released the pool's segments (or, for a pool a timeout broke, left them to process exit). A
 * block still live in it is sympool's to free, but no longer memory a call may read or write:
 * the collectives refuse it. False for NULL, an ordinary pool and a live symmetric pool.
 * Thread-safe. */
bool sp__sym_pool_gone(const sp_mempool_t *pool);

/* Test hook: the calling thread sleeps `seconds` at the start of each of its growths, before
 * the growth's first agreement round (0: none), so a test can make one rank late inside a
 * growth. Thread-local; never set by the library itself. */
void sp__sym_test_set_grow_delay(double seconds);
/* Tests only: while on, the calling thread's sp_symmetric_mempool_create finds no host memory
 * for the pool's state, and its sp_symmetric_empty_cache and sp_symmetric_mempool_destroy none
 * for their free-segment bitmap (as host malloc refusing them would). */
void sp__sym_test_fail_host(bool on);
/* Tests only: this process's sp_symmetric_mempool_create waits this long (seconds; 0: not at
 * all, the default) after its round and before duplicating the world's communicator, as a rank
 * stopped there would. */
void sp__sym_test_pause_before_comms(double seconds);

#ifdef __cplusplus
}
#endif

#endif /* SP_SYMMETRIC_SYMMETRIC_H */
