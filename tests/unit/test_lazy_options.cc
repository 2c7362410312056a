// test_lazy_options.cc: the SYMPOOL_* variables are read at sympool's first use, not before
// main(): a setenv in the program before its first call counts, logging
// included, and sp_shutdown followed by a new first call reads them again. ctest runs each TEST
// in its own process, so nothing in sympool has run when a test body starts; the tests use no
// fixture for that reason (sp::Test's setup would be fine, but keeps nothing to prove).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

extern "C" {
#include "core/core.h"
#include "sympool/sympool.h"
}

namespace {

constexpr size_t GiB = size_t(1) << 30;

struct Lines {
    std::mutex mu;
    std::vector<std::pair<sp_log_level_t, std::string>> v;
    size_t count(sp_log_level_t level, const char *needle) {
        std::lock_guard<std::mutex> g(mu);
        size_t n = 0;
        for (const auto &l : v)
            n += l.first == level && l.second.find(needle) != std::string::npos;
        return n;
    }
};

void capture(sp_log_level_t level, const char *line, void *arg) {
    auto *l = static_cast<Lines *>(arg);
    std::lock_guard<std::mutex> g(l->mu);
    l->v.emplace_back(level, line);
}

size_t total_memory() {
    size_t free_b = 0, total = 0;
    EXPECT_EQ(sp_get_memory_info(0, &free_b, &total), SP_SUCCESS) << sp_last_error();
    return total;
}

bool on_host_only() {
    const char *d = std::getenv("SYMPOOL_TEST_DEVICE");
    return d == nullptr || std::strcmp(d, "host") == 0;
}

} // namespace

TEST(LazyOptions, SetenvBeforeTheFirstCallAndAfterShutdownIsRead) {
    if (!on_host_only())
        GTEST_SKIP() << "needs the host backend (emulated capacity)";
    Lines lines;
    sp__log_set_fn(capture, &lines); // reads no option
    setenv("SYMPOOL_DEVICE", "host", 1);
    setenv("SYMPOOL_HOST_CAPACITY", "3GiB", 1);
    setenv("SYMPOOL_DEBUG", "INFO", 1);
    EXPECT_EQ(total_memory(), 3 * GiB) << "SYMPOOL_HOST_CAPACITY set before the first call";
    EXPECT_GE(lines.count(SP_LOG_INFO, "allocator ready"), 1u)
        << "SYMPOOL_DEBUG=INFO set before the first call did not apply to logging";

    ASSERT_EQ(sp_shutdown(), SP_SUCCESS) << sp_last_error();
    setenv("SYMPOOL_HOST_CAPACITY", "5GiB", 1);
    setenv("SYMPOOL_DEBUG", "WARN", 1);
    size_t info_before = lines.count(SP_LOG_INFO, "allocator ready");
    EXPECT_EQ(total_memory(), 5 * GiB) << "the first call after sp_shutdown kept the old value";
    EXPECT_EQ(lines.count(SP_LOG_INFO, "allocator ready"), info_before)
        << "SYMPOOL_DEBUG=WARN set after sp_shutdown did not apply";

    // Without sp_shutdown the values in force stay (read once per run of the allocator).
    setenv("SYMPOOL_HOST_CAPACITY", "7GiB", 1);
    EXPECT_EQ(total_memory(), 5 * GiB);

    ASSERT_EQ(sp_shutdown(), SP_SUCCESS);
    unsetenv("SYMPOOL_HOST_CAPACITY");
    unsetenv("SYMPOOL_DEBUG");
    sp__log_set_fn(nullptr, nullptr);
}

// A value set from code (the CLI's --capacity) is not an environment variable: it survives
// sp_shutdown (sympool replay --repeat shuts down between runs).
TEST(LazyOptions, ValuesSetFromCodeSurviveShutdown) {
    if (!on_host_only())
        GTEST_SKIP() << "needs the host backend (emulated capacity)";
    setenv("SYMPOOL_DEVICE", "host", 1);
    ASSERT_EQ(sp__option_set(SP_OPT_HOST_CAPACITY, "2GiB"), SP_SUCCESS);
    EXPECT_EQ(total_memory(), 2 * GiB);
    ASSERT_EQ(sp_shutdown(), SP_SUCCESS);
    EXPECT_EQ(total_memory(), 2 * GiB);
    ASSERT_EQ(sp_shutdown(), SP_SUCCESS);
    sp__options_reload(); // tests' reset: the environment is the truth again
    EXPECT_EQ(sp__option_source(SP_OPT_HOST_CAPACITY), SP_OPT_SRC_DEFAULT);
}
