/*
 * sym_experimental.c: sympool/experimental.h's symmetric counters (bench/mpi/symmetric.c reads
 * them), a copy of what symmetric/symmetric.h offers collectives/. Unstable by contract.
 */
#include <string.h>

#include "core/core.h"
#include "symmetric/symmetric.h"
#include "sympool/experimental.h"

SP_EXPORT void sp_x_symmetric_counters(int device, sp_x_symmetric_counters_t *counters_p) {
    if (counters_p == NULL)
        return;
    sp_sym_counters_t c;
    sp__symmetric_counters(device, &c);
    /* The public struct names its fields as SP_SYMC_LIST does (header_check compiles both). */
#define X(e, field, help) counters_p->field = c.field;
    SP_SYMC_LIST(X)
#undef X
}
