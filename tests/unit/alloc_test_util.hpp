// alloc_test_util.hpp: small helpers shared by the test_alloc_*.cc suites (reading one stats key,
// the byte constants), so each test states only what it checks.
#ifndef ALLOC_TEST_UTIL_HPP
#define ALLOC_TEST_UTIL_HPP

#include "sp_test.hpp"

#include <string>

namespace sp {

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * 1024;
constexpr size_t GiB = 1024 * MiB;

// One stats key of device 0 (or dev); fails the test on an unknown key.
inline int64_t stat(const char *key, int dev = 0) {
    sp_stats_t st;
    EXPECT_EQ(sp_memory_stats(dev, &st), SP_SUCCESS);
    int64_t v = -12345;
    EXPECT_EQ(sp_stats_get(&st, key, &v), SP_SUCCESS) << key;
    return v;
}

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
