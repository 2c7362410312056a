// history_test_util.hpp: what tests that compare runs through their memory history share.
#ifndef HISTORY_TEST_UTIL_HPP
#define HISTORY_TEST_UTIL_HPP

#include <cstddef>
#include <cstdint>

extern "C" {
#include "pool/history.h"
}

namespace sp {

// The lowest address a run's history gave a segment (UINTPTR_MAX when none): runs whose device
// memory lies elsewhere compare as offsets from it.
inline uintptr_t segment_origin(const sp__trace_entry_t *e, size_t n) {
    uintptr_t origin = UINTPTR_MAX;
    for (size_t i = 0; i < n; i++)
        if ((e[i].action == SP_TRACE_SEGMENT_ALLOC || e[i].action == SP_TRACE_SEGMENT_MAP) &&
            (uintptr_t)e[i].addr < origin)
            origin = (uintptr_t)e[i].addr;
    return origin;
}

} // namespace sp

#endif
