// sp_test.hpp: the thin C++ shim the GoogleTest suites use to call sympool's C API.
//  - ASSERT_SP_OK / EXPECT_SP_OK print the status name and sp_last_error() on failure.
//  - EXPECT_SP_STATUS(expr, SP_ERR_...) checks a specific failure.
//  - sp::ScopedEnv sets SYMPOOL_* variables for one test and re-reads the option table.
//  - sp::Watchdog fails a hung test (aborts) instead of leaving it to ctest's timeout; sp::Lcg is
//    a tiny seeded generator for threads that each want their own sequence.
//  - sp::Test is the base fixture: it captures log lines, fails the test on any WARN it did not
//    expect (sp::Test::expect_warnings()), and at the end checks nothing is left allocated and
//    shuts sympool down so that every test starts from a fresh allocator.
#ifndef SP_TEST_HPP
#define SP_TEST_HPP

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern "C" {
#include "core/core.h"
#include <sympool/sympool.h>
}

namespace sp {

inline std::string describe(sp_status_t s) {
    return std::string(sp_status_name(s)) + ": " + sp_last_error();
}

// The whole of the file at path, or "<missing>" when it cannot be opened.
std::string read_file(const std::string &path);
// The names in dir (`ls -A`), one a line.
std::string list_dir(const std::string &dir);

// A MemPool named `name` with the default parameters; a refused create is a test failure and
// gives nullptr.
inline sp_mempool_t *make_named_pool(const char *name) {
    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    params.name = name;
    sp_mempool_t *pool = nullptr;
    sp_status_t s = sp_mempool_create(&params, &pool);
    EXPECT_EQ(s, SP_SUCCESS) << describe(s);
    return pool;
}

} // namespace sp

#define ASSERT_SP_OK(expr)                                                                         \
    do {                                                                                           \
        sp_status_t sp_t_s_ = (expr);                                                              \
        ASSERT_EQ(sp_t_s_, SP_SUCCESS) << #expr << " -> " << sp::describe(sp_t_s_);                \
    } while (0)
#define EXPECT_SP_OK(expr)                                                                         \
    do {                                                                                           \
        sp_status_t sp_t_s_ = (expr);                                                              \
        EXPECT_EQ(sp_t_s_, SP_SUCCESS) << #expr << " -> " << sp::describe(sp_t_s_);                \
    } while (0)
#define EXPECT_SP_STATUS(expr, want)                                                               \
    do {                                                                                           \
        sp_status_t sp_t_s_ = (expr);                                                              \
        EXPECT_EQ(sp_t_s_, (want)) << #expr << " -> " << sp::describe(sp_t_s_);                    \
    } while (0)

namespace sp {

// Sets environment variables for its lifetime and re-reads sympool's options on entry and exit.
class ScopedEnv {
  public:
    ScopedEnv(std::initializer_list<std::pair<const char *, const char *>> vars);
    ~ScopedEnv();
    ScopedEnv(const ScopedEnv &) = delete;
    ScopedEnv &operator=(const ScopedEnv &) = delete;

  private:
    std::vector<std::pair<std::string, std::pair<bool, std::string>>> saved_;
};

// The process's locale set to one with a decimal comma (de_DE.UTF-8, compiled by localedef into
// a temporary folder named by LOCPATH) while the object lives, the C locale again after.
// active() is false where the machine cannot make it (no localedef or no locale sources): the
// caller skips then.
class CommaLocale {
  public:
    CommaLocale();
    ~CommaLocale();
    CommaLocale(const CommaLocale &) = delete;
    CommaLocale &operator=(const CommaLocale &) = delete;
    bool active() const { return active_; }

  private:
    std::string dir_;
    bool active_ = false;
};

// Captured log lines (all levels) since the fixture started.
struct LogCapture {
    std::mutex mu;
    std::vector<std::pair<sp_log_level_t, std::string>> lines;
    size_t count(sp_log_level_t level, const std::string &needle = "");
};

class Test : public ::testing::Test {
  protected:
    void SetUp() override;
    void TearDown() override;
    // Allow WARN lines in this test (misuse and OOM tests produce them on purpose).
    void expect_warnings() { warnings_expected_ = true; }
    // Skip the end-of-test leak check (tests that deliberately leave blocks, e.g. for BUSY).
    void skip_leak_check() { leak_check_ = false; }
    size_t warnings(const std::string &needle = "") { return log_.count(SP_LOG_WARN, needle); }
    LogCapture log_;

  private:
    bool warnings_expected_ = false;
    bool leak_check_ = true;
};

// Aborts the process, naming the running test, unless destroyed within 60 s: a deadlock fails
// the test instead of stalling it until ctest's timeout. A thread, not alarm(2): a signal would
// interrupt the system calls of the code under test, and one process has one alarm.
class Watchdog {
  public:
    Watchdog() : th_([this] { loop(); }) {}
    ~Watchdog() {
        {
            std::lock_guard<std::mutex> g(mu_);
            done_ = true;
        }
        cv_.notify_all();
        th_.join();
    }
    Watchdog(const Watchdog &) = delete;
    Watchdog &operator=(const Watchdog &) = delete;

  private:
    void loop() {
        const ::testing::TestInfo *t = ::testing::UnitTest::GetInstance()->current_test_info();
        std::string what = t ? std::string(t->test_suite_name()) + "." + t->name() : "a test";
        std::unique_lock<std::mutex> g(mu_);
        if (!cv_.wait_for(g, std::chrono::seconds(60), [this] { return done_; })) {
            fprintf(stderr, "watchdog: %s hangs\n", what.c_str());
            abort();
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread th_; // last: started once the fields above exist
};

// A linear congruential generator (the C standard's example constants), 24 bits a draw.
struct Lcg {
    unsigned x;
    unsigned next() { return x = x * 1103515245u + 12345u, x >> 8; }
};

// True when the cuda backend is in use (GPU tests call GTEST_SKIP() otherwise).
bool on_gpu();

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;

// Write to a block to show it is usable (on a GPU run through a host-to-device copy).
void touch(void *p, size_t n);

// Copy between host memory and sympool memory of any backend (cudaMemcpy through the backend's
// memcpy_async and a synchronize on cuda; a plain copy on host). The sympool side must be a
// live block. Test failures are reported through gtest.
void copy_in(void *sympool_dst, const void *host_src, size_t n);
void copy_out(void *host_dst, const void *sympool_src, size_t n);

constexpr size_t GiB = 1024 * MiB;

// One memory_stats key of a device; an unknown key is a test failure (and returns -1).
int64_t stat(const char *key, int device = 0);

} // namespace sp

// Tests that need the host backend's emulated capacity or device count skip on a GPU run
// (SYMPOOL_TEST_DEVICE=cuda); use it after any ScopedEnv, which must precede initialization.
#define SP_SKIP_UNLESS_HOST()                                                                      \
    do {                                                                                           \
        if (sp::on_gpu())                                                                          \
            GTEST_SKIP() << "needs the host backend (emulated capacity and devices)";              \
    } while (0)

// Tests of the host backend's deterministic stream model (an event completes only when its
// stream is synchronized) skip on a GPU, where an idle stream's event completes at once.
#define SP_SKIP_ON_GPU(why)                                                                        \
    do {                                                                                           \
        if (sp::on_gpu())                                                                          \
            GTEST_SKIP() << (why);                                                                 \
    } while (0)

#endif // SP_TEST_HPP
