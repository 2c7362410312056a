/*
 * gap_array_probe.c: core/gap_array.h's lookups on an empty array, compiled as C (the library's
 * language): a NULL array plus 0 entries is undefined in C, not in C++, and clang's UBSan
 * (-fsanitize=undefined) stops a C build there. The unit test checks the answers.
 */
#include "tests/unit/gap_array_probe.h"

#include "core/gap_array.h"

void sp_test_gap_probe_empty(uint32_t out[4]) {
    sp_gap_array_t a;
    memset(&a, 0, sizeof a);
    out[0] = sp__gap_upper(&a, 5);
    out[1] = sp__gap_lower(&a, 5);
    out[2] = sp__gap_upper(&a, UINT64_MAX);
    sp__gap_drop_zero_vals(&a);
    out[3] = a.n;
    sp__gap_free(&a);
}
