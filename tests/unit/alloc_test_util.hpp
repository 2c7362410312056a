// alloc_test_util.hpp: small helpers shared by the test_alloc_*.cc suites (stats snapshots and
// their differences), so each test states only what it checks.
#ifndef ALLOC_TEST_UTIL_HPP
#define ALLOC_TEST_UTIL_HPP

#include "sp_test.hpp"

#include <string>

namespace sp {

// KiB, MiB, GiB and stat(key, dev) come from the shim (sp_test.hpp).

inline sp_stats_t snap(int dev = 0) {
    sp_stats_t st;
    EXPECT_EQ(sp_memory_stats(dev, &st), SP_SUCCESS);
    return st;
}

// Names of keys whose value differs between two snapshots ("" when none).
inline std::string diff(const sp_stats_t &a, const sp_stats_t &b) {
    std::string out;
    for (size_t i = 0; i < sp_stats_count(); i++)
        if (a.value[i] != b.value[i])
            out += std::string(sp_stats_key(i)) + " ";
    return out;
}

} // namespace sp

#endif
