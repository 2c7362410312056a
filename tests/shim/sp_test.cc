// sp_test.cc: the shim's fixture, environment guard and log capture (see sp_test.hpp).
#include "sp_test.hpp"

#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
#include "pool/device/device.h"
#include "pool/pool.h"
}

namespace sp {

// SYMPOOL_HOST_* variables describe the host backend's emulated device: a test that sets them
// checks host semantics (capacities, fault injection, device counts), so on a cuda run
// (SYMPOOL_TEST_DEVICE=cuda) it gets the host backend for its scope instead of failing on a GPU.
static bool wants_host(std::initializer_list<std::pair<const char *, const char *>> vars) {
    bool host_vars = false, names_device = false;
    for (const auto &v : vars) {
        host_vars |= std::strncmp(v.first, "SYMPOOL_HOST_", 13) == 0 && v.second != nullptr;
        names_device |= std::strcmp(v.first, "SYMPOOL_DEVICE") == 0;
    }
    return host_vars && !names_device;
}

ScopedEnv::ScopedEnv(std::initializer_list<std::pair<const char *, const char *>> vars) {
    if (wants_host(vars)) {
        const char *old = std::getenv("SYMPOOL_DEVICE");
        saved_.push_back({"SYMPOOL_DEVICE", {old != nullptr, old ? old : ""}});
        setenv("SYMPOOL_DEVICE", "host", 1);
    }
    for (const auto &v : vars) {
        const char *old = std::getenv(v.first);
        saved_.push_back({v.first, {old != nullptr, old ? old : ""}});
        if (v.second)
            setenv(v.first, v.second, 1);
        else
            unsetenv(v.first);
    }
    sp__options_reload();
}

ScopedEnv::~ScopedEnv() {
    // Restore in reverse, so a variable saved twice ends with its oldest value.
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
        const auto &s = *it;
        if (s.second.first)
            setenv(s.first.c_str(), s.second.second.c_str(), 1);
        else
            unsetenv(s.first.c_str());
    }
    sp__options_reload();
}

CommaLocale::CommaLocale() {
    char tmpl[] = "/tmp/sp_locale_XXXXXX";
    if (!mkdtemp(tmpl))
        return;
    dir_ = tmpl;
    std::string cmd = "localedef -i de_DE -f UTF-8 " + dir_ + "/de_DE.UTF-8 >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0)
        return;
    setenv("LOCPATH", dir_.c_str(), 1);
    char probe[16];
    active_ = setlocale(LC_ALL, "de_DE.UTF-8") != nullptr &&
              (snprintf(probe, sizeof probe, "%.1f", 1.5), std::strcmp(probe, "1,5") == 0);
}

CommaLocale::~CommaLocale() {
    setlocale(LC_ALL, "C");
    unsetenv("LOCPATH");
    if (!dir_.empty())
        (void)std::system(("rm -rf " + dir_).c_str());
}

size_t LogCapture::count(sp_log_level_t level, const std::string &needle) {
    std::lock_guard<std::mutex> g(mu);
    size_t n = 0;
    for (const auto &l : lines)
        if (l.first == level && (needle.empty() || l.second.find(needle) != std::string::npos))
            n++;
    return n;
}

static void capture(sp_log_level_t level, const char *line, void *arg) {
    auto *cap = static_cast<LogCapture *>(arg);
    std::lock_guard<std::mutex> g(cap->mu);
    cap->lines.emplace_back(level, line);
}

void Test::SetUp() {
    sp__error_clear();
    sp__log_set_fn(capture, &log_);
}

void Test::TearDown() {
    if (leak_check_) {
        for (int d = 0; d < sp_device_count(); d++) {
            sp_stats_t st;
            if (sp_memory_stats(d, &st) != SP_SUCCESS)
                continue;
            int64_t live = -1;
            sp_stats_get(&st, "allocation.all.current", &live);
            EXPECT_EQ(live, 0) << "blocks still allocated on device " << d << " at test end";
        }
    }
    sp_status_t s = sp_shutdown();
    if (leak_check_) {
        EXPECT_EQ(s, SP_SUCCESS) << "sp_shutdown: " << describe(s);
    }
    sp__log_set_fn(nullptr, nullptr);
    if (!warnings_expected_) {
        std::lock_guard<std::mutex> g(log_.mu);
        for (const auto &l : log_.lines)
            if (l.first == SP_LOG_WARN)
                ADD_FAILURE() << "unexpected warning: " << l.second;
    }
}

std::string read_file(const std::string &path) {
    FILE *f = fopen(path.c_str(), "rb");
    if (!f)
        return "<missing>";
    std::string s;
    char b[4096];
    size_t n;
    while ((n = fread(b, 1, sizeof b, f)) > 0)
        s.append(b, n);
    fclose(f);
    return s;
}

std::string list_dir(const std::string &dir) {
    std::string cmd = "ls -A " + dir;
    FILE *p = popen(cmd.c_str(), "r");
    std::string s;
    char b[512];
    while (p && fgets(b, sizeof b, p))
        s += b;
    if (p)
        pclose(p);
    return s;
}

bool on_gpu() {
    return std::strcmp(sp_backend_name(), "cuda") == 0;
}

// dst or src lies in a sympool block; the backend copies, ordered on the default stream, and
// the stream is synchronized so the host side is ready when this returns.
static void backend_copy(void *dst, const void *src, size_t n, const void *ours) {
    const sp_device_ops_t *ops = nullptr;
    sp_status_t s = sp__device_select(&ops, nullptr);
    ASSERT_EQ(s, SP_SUCCESS) << describe(s);
    sp_block_info_t info;
    s = sp__pool_lookup(ours, &info);
    ASSERT_EQ(s, SP_SUCCESS) << "not sympool memory: " << describe(s);
    ASSERT_NE(ops->memcpy_async, nullptr);
    s = ops->memcpy_async(info.device, dst, src, n, nullptr);
    ASSERT_EQ(s, SP_SUCCESS) << describe(s);
    s = ops->stream_sync(info.device, nullptr);
    ASSERT_EQ(s, SP_SUCCESS) << describe(s);
}

void copy_in(void *sympool_dst, const void *host_src, size_t n) {
    if (n)
        backend_copy(sympool_dst, host_src, n, sympool_dst);
}

void copy_out(void *host_dst, const void *sympool_src, size_t n) {
    if (n)
        backend_copy(host_dst, sympool_src, n, sympool_src);
}

void touch(void *p, size_t n) {
    if (!on_gpu()) {
        std::memset(p, 0x5a, n);
        return;
    }
    std::vector<unsigned char> pattern(n, 0x5a);
    copy_in(p, pattern.data(), n);
}

int64_t stat(const char *key, int device) {
    sp_stats_t st;
    sp_status_t s = sp_memory_stats(device, &st);
    EXPECT_EQ(s, SP_SUCCESS) << describe(s);
    int64_t v = -1;
    s = sp_stats_get(&st, key, &v);
    EXPECT_EQ(s, SP_SUCCESS) << key << ": " << describe(s);
    return v;
}

} // namespace sp
