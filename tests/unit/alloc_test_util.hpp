// alloc_test_util.hpp: small helpers shared by the test_alloc_*.cc suites (stats snapshots and
// their differences), so each test states only what it checks.
#ifndef ALLOC_TEST_UTIL_HPP
#define ALLOC_TEST_UTIL_HPP

#include "sp_test.hpp"

#include <cstdint>
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

// A walk's segment lines ("seg ADDR rest\n"...) with each address made an offset from `origin`,
// so runs whose segments lie elsewhere (the host maps them where it can) compare equal.
inline std::string rebase_layout(const std::string &layout, uintptr_t origin) {
    std::string fixed;
    size_t at = 0;
    while (at < layout.size()) {
        size_t nl = layout.find('\n', at);
        std::string line = layout.substr(at, nl - at);
        size_t sp1 = line.find(' '), sp2 = line.find(' ', sp1 + 1);
        uintptr_t addr = std::stoull(line.substr(sp1 + 1, sp2 - sp1 - 1));
        fixed += "seg " + std::to_string(addr - origin) + line.substr(sp2) + "\n";
        at = nl + 1;
    }
    return fixed;
}

} // namespace sp

#endif
