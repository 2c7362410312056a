// test_core.cc: core/ on its own: status names, the thread's last error, the size and bool parsers,
// the SYMPOOL_* option table (each kind, defaults, warn-once, unknown names, sp__option_set),
// PyTorch ALLOC_CONF parsing and precedence, the log line format, level/subsystem filtering, and
// SYMPOOL_DEBUG_FILE. The fixture is sp::Test (unexpected WARN lines fail a test); variables are
// set through sp::ScopedEnv.
#include "sp_test.hpp"
#include "sympool/experimental.h"

extern "C" {
#include "core/core_emit.h"
}

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <climits>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Env = sp::ScopedEnv;

// Puts log lines into the fixture's capture again after a test sent them to a file.
void capture(sp_log_level_t level, const char *line, void *arg) {
    auto *cap = static_cast<sp::LogCapture *>(arg);
    std::lock_guard<std::mutex> g(cap->mu);
    cap->lines.emplace_back(level, line);
}

// sp::Test (fails on unexpected WARN lines) plus helpers over its log capture.
class CoreTest : public sp::Test {
  protected:
    size_t count(sp_log_level_t level, const std::string &needle = "") {
        return log_.count(level, needle);
    }
    size_t n_lines() {
        std::lock_guard<std::mutex> g(log_.mu);
        return log_.lines.size();
    }
    std::string last_line() {
        std::lock_guard<std::mutex> g(log_.mu);
        return log_.lines.empty() ? std::string() : log_.lines.back().second;
    }
};

constexpr int64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

std::string read_file(const std::string &path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

} // namespace

// ---- status and last error -----------------------------------------------------------------

TEST_F(CoreTest, StatusNamesAndStringsCoverEveryCode) {
    const char *names[] = {"SP_SUCCESS",           "SP_ERR_INVALID_ARGUMENT",
                           "SP_ERR_INVALID_USAGE", "SP_ERR_OUT_OF_MEMORY",
                           "SP_ERR_BUSY",          "SP_ERR_DEVICE",
                           "SP_ERR_NCCL",          "SP_ERR_MPI",
                           "SP_ERR_MISMATCH",      "SP_ERR_TIMEOUT",
                           "SP_ERR_NOT_SUPPORTED", "SP_ERR_SYSTEM",
                           "SP_ERR_INTERNAL"};
    ASSERT_EQ(sizeof names / sizeof names[0], (size_t)SP_NUM_STATUS);
    std::set<std::string> texts;
    for (int s = 0; s < SP_NUM_STATUS; s++) {
        EXPECT_STREQ(sp_status_name((sp_status_t)s), names[s]);
        std::string t = sp_status_string((sp_status_t)s);
        EXPECT_FALSE(t.empty());
        EXPECT_TRUE(texts.insert(t).second) << "duplicate text " << t;
    }
    EXPECT_STREQ(sp_status_name((sp_status_t)SP_NUM_STATUS), "SP_ERR_UNKNOWN");
    EXPECT_STREQ(sp_status_name((sp_status_t)-1), "SP_ERR_UNKNOWN");
    EXPECT_STREQ(sp_status_string((sp_status_t)999), "unknown status code");
}

TEST_F(CoreTest, LastErrorIsPerThread) {
    EXPECT_STREQ(sp_last_error(), "");
    EXPECT_EQ(sp__error_quiet(SP_ERR_BUSY, SP_SUB_API, "main %d", 1), SP_ERR_BUSY);
    std::string other;
    std::thread t([&] {
        other = sp_last_error(); // a fresh thread starts empty
        sp__error_quiet(SP_ERR_TIMEOUT, SP_SUB_API, "worker %d", 2);
        other += "|" + std::string(sp_last_error());
    });
    t.join();
    EXPECT_EQ(other, "|worker 2");
    EXPECT_STREQ(sp_last_error(), "main 1");
    sp__error_clear();
    EXPECT_STREQ(sp_last_error(), "");
}

TEST_F(CoreTest, ErrorLogsWarnWithStatusName) {
    expect_warnings();
    EXPECT_EQ(sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "bad size %d", 3),
              SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(count(SP_LOG_WARN, "bad size 3 (SP_ERR_INVALID_ARGUMENT)"), 1u);
    EXPECT_STREQ(sp_last_error(), "bad size 3");
}

// ---- parsers ---------------------------------------------------------------------------------

TEST(CoreParse, SizeTable) {
    struct {
        const char *text;
        uint64_t want;
    } good[] = {
        {"0", 0},
        {"512", 512},
        {"64KiB", 64 * KiB},
        {"64K", 64 * KiB},
        {"64kb", 64 * KiB},
        {"2MB", 2 * MiB},
        {"2m", 2 * MiB},
        {"80GiB", 80 * GiB},
        {"1.5G", 3 * GiB / 2},
        {"0.5KiB", 512},
        {"1T", 1024 * GiB},
        {" 7 MiB ", 7 * MiB},
        {"512B", 512},
        {"17179869183G", 17179869183ull * GiB},
        {"1PiB", 1024ull * 1024 * GiB},
        {"1.5P", 1536ull * 1024 * GiB},
        {"15EiB", 15ull << 60},
        {"0.5E", 1ull << 59},
        {"1.0000000000", 1}, // a whole byte, however many zeros
        {"1.0000000001KiB", 1024},
    };
    for (const auto &g : good) {
        size_t got = 1;
        EXPECT_TRUE(sp__parse_size(g.text, &got)) << g.text;
        EXPECT_EQ(got, g.want) << g.text;
    }
    // "1.0000000001" and "0.0000000001": a fraction of a byte past the 9 digits kept (they read
    // as 1 and 0, SYMPOOL_MAX_SPLIT_SIZE's "unlimited").
    const char *bad[] = {"",
                         "-1",
                         "-1G",
                         "abc",
                         "12x",
                         "1.5",
                         "1.0000000001",
                         "0.0000000001",
                         "1.",
                         ".5K",
                         "1..5K",
                         "1GiBx",
                         "1 G B",
                         "99999999999999999999",
                         "17179869184G",
                         "16777216T",
                         "16E",
                         "16384P",
                         "1iB",
                         "0x10",
                         "1e3",
                         "G",
                         nullptr};
    for (const char *b : bad) {
        size_t got = 12345;
        EXPECT_FALSE(sp__parse_size(b, &got)) << (b ? b : "(null)");
        EXPECT_EQ(got, 12345u) << "output written on failure for " << (b ? b : "(null)");
    }
}

TEST(CoreParse, Bool) {
    for (const char *t : {"1", "on", "ON", "yes", "Yes", "true", "TRUE"}) {
        bool v = false;
        EXPECT_TRUE(sp__parse_bool(t, &v)) << t;
        EXPECT_TRUE(v) << t;
    }
    for (const char *t : {"0", "off", "Off", "no", "NO", "false", "False"}) {
        bool v = true;
        EXPECT_TRUE(sp__parse_bool(t, &v)) << t;
        EXPECT_FALSE(v) << t;
    }
    for (const char *t : {"", "2", "y", "enable", "truee", " 1"}) {
        bool v = true;
        EXPECT_FALSE(sp__parse_bool(t, &v)) << t;
        EXPECT_TRUE(v);
    }
    bool v;
    EXPECT_FALSE(sp__parse_bool(nullptr, &v));
}

// ---- options -------------------------------------------------------------------------------

// Every option unset: the documented defaults, all from "default".
TEST_F(CoreTest, OptionDefaults) {
    Env env({{"SYMPOOL_DEVICE", nullptr},
             {"SYMPOOL_DEBUG", nullptr},
             {"SYMPOOL_DEBUG_SUBSYS", nullptr},
             {"SYMPOOL_DEBUG_FILE", nullptr},
             {"SYMPOOL_INFO", nullptr},
             {"SYMPOOL_ALLOC_CONF", nullptr},
             {"SYMPOOL_NO_CACHING", nullptr},
             {"SYMPOOL_MAX_SPLIT_SIZE", nullptr},
             {"SYMPOOL_MAX_NON_SPLIT_ROUNDING", nullptr},
             {"SYMPOOL_LARGE_SEGMENT_SIZE", nullptr},
             {"SYMPOOL_GC_THRESHOLD", nullptr},
             {"SYMPOOL_ROUNDUP_POWER2_DIVISIONS", nullptr},
             {"SYMPOOL_EXPANDABLE_SEGMENTS", nullptr},
             {"SYMPOOL_HOST_CAPACITY", nullptr},
             {"SYMPOOL_HOST_DEVICES", nullptr},
             {"SYMPOOL_HOST_FAIL_AFTER", nullptr},
             {"SYMPOOL_SYM_TIMEOUT", nullptr},
             {"SYMPOOL_SYM_REGISTRAR", nullptr},
             {"SYMPOOL_REPORT", nullptr}});
    for (int o = 0; o < SP_OPT_COUNT; o++)
        EXPECT_EQ(sp__option_source((sp_option_t)o), SP_OPT_SRC_DEFAULT)
            << sp__option_name((sp_option_t)o);
    EXPECT_STREQ(sp__option_string(SP_OPT_DEVICE), "auto");
    EXPECT_EQ(sp__option_int(SP_OPT_DEVICE), 0);
    EXPECT_EQ(sp__option_int(SP_OPT_DEBUG), SP_LOG_WARN);
    EXPECT_EQ(sp__log_level, SP_LOG_WARN);
    EXPECT_EQ(sp__option_int(SP_OPT_DEBUG_SUBSYS), (int64_t)SP_SUB_ALL);
    EXPECT_STREQ(sp__option_string(SP_OPT_DEBUG_FILE), "");
    EXPECT_EQ(sp__option_int(SP_OPT_INFO), 0);
    EXPECT_STREQ(sp__option_string(SP_OPT_ALLOC_CONF), "");
    EXPECT_EQ(sp__option_int(SP_OPT_NO_CACHING), 0);
    EXPECT_EQ(sp__option_int(SP_OPT_MAX_SPLIT_SIZE), 0);
    EXPECT_EQ(sp__option_int(SP_OPT_MAX_NON_SPLIT_ROUNDING), 20 * MiB);
    EXPECT_EQ(sp__option_int(SP_OPT_LARGE_SEGMENT_SIZE), 20 * MiB);
    EXPECT_EQ(sp__option_double(SP_OPT_GC_THRESHOLD), 0.0);
    EXPECT_STREQ(sp__option_string(SP_OPT_ROUNDUP_POWER2_DIVISIONS), "");
    EXPECT_EQ(sp__option_int(SP_OPT_EXPANDABLE_SEGMENTS), 0);
    EXPECT_EQ(sp__option_int(SP_OPT_HOST_CAPACITY), 80 * GiB);
    EXPECT_EQ(sp__option_int(SP_OPT_HOST_DEVICES), 1);
    EXPECT_EQ(sp__option_int(SP_OPT_HOST_FAIL_AFTER), 0);
    EXPECT_EQ(sp__option_double(SP_OPT_SYM_TIMEOUT), 60.0);
    EXPECT_STREQ(sp__option_string(SP_OPT_SYM_REGISTRAR), "auto");
    EXPECT_STREQ(sp__option_string(SP_OPT_REPORT), "none");

    sp_alloc_conf_t c;
    sp__alloc_conf_get(&c);
    EXPECT_EQ(c.max_split_size, SIZE_MAX);
    EXPECT_EQ(c.max_non_split_rounding, (size_t)(20 * MiB));
    EXPECT_EQ(c.large_segment_size, (size_t)(20 * MiB));
    EXPECT_EQ(c.gc_threshold, 0.0);
    EXPECT_FALSE(c.expandable_segments);
    EXPECT_FALSE(c.no_caching);
    for (uint32_t d : c.roundup_divisions)
        EXPECT_EQ(d, 0u);
    EXPECT_STREQ(c.conf_text, "");
}

TEST_F(CoreTest, OptionNamesFollowTheEnum) {
    EXPECT_STREQ(sp__option_name(SP_OPT_DEVICE), "SYMPOOL_DEVICE");
    EXPECT_STREQ(sp__option_name(SP_OPT_HOST_CAPACITY), "SYMPOOL_HOST_CAPACITY");
    EXPECT_STREQ(sp__option_name(SP_OPT_ROUNDUP_POWER2_DIVISIONS),
                 "SYMPOOL_ROUNDUP_POWER2_DIVISIONS");
    EXPECT_STREQ(sp__option_name(SP_OPT_REPORT), "SYMPOOL_REPORT");
    EXPECT_STREQ(sp__option_name(SP_OPT_COUNT), "SYMPOOL_?");
}

TEST_F(CoreTest, EachKindFromTheEnvironment) {
    Env env({{"SYMPOOL_DEVICE", "HOST"},        // enum, any case
             {"SYMPOOL_NO_CACHING", "yes"},     // bool
             {"SYMPOOL_HOST_DEVICES", "4"},     // long
             {"SYMPOOL_SYM_TIMEOUT", "2.5"},    // double
             {"SYMPOOL_HOST_CAPACITY", "1.5G"}, // size
             {"SYMPOOL_DEBUG_FILE", ""},        // string
             {"SYMPOOL_REPORT", "json"},
             {"SYMPOOL_SYM_REGISTRAR", "mpi"},
             {"SYMPOOL_DEBUG_SUBSYS", "init,pool"}});
    EXPECT_EQ(sp__option_int(SP_OPT_DEVICE), 2);
    EXPECT_STREQ(sp__option_string(SP_OPT_DEVICE), "host");
    EXPECT_EQ(sp__option_source(SP_OPT_DEVICE), SP_OPT_SRC_ENV);
    EXPECT_EQ(sp__option_int(SP_OPT_NO_CACHING), 1);
    EXPECT_EQ(sp__option_int(SP_OPT_HOST_DEVICES), 4);
    EXPECT_DOUBLE_EQ(sp__option_double(SP_OPT_SYM_TIMEOUT), 2.5);
    EXPECT_EQ(sp__option_int(SP_OPT_HOST_CAPACITY), 3 * GiB / 2);
    EXPECT_EQ(sp__option_int(SP_OPT_REPORT), 2);
    EXPECT_STREQ(sp__option_string(SP_OPT_SYM_REGISTRAR), "mpi");
    EXPECT_EQ(sp__option_int(SP_OPT_DEBUG_SUBSYS), (int64_t)(SP_SUB_INIT | SP_SUB_POOL));
    EXPECT_EQ(sp__log_mask, (unsigned)(SP_SUB_INIT | SP_SUB_POOL));
    sp_alloc_conf_t c;
    sp__alloc_conf_get(&c);
    EXPECT_TRUE(c.no_caching);
}

TEST_F(CoreTest, MalformedValueWarnsOnceAndKeepsDefault) {
    expect_warnings();
    {
        Env env({{"SYMPOOL_HOST_CAPACITY", "-5GiB"}});
        EXPECT_EQ(count(SP_LOG_WARN, "SYMPOOL_HOST_CAPACITY='-5GiB'"), 1u);
        EXPECT_EQ(sp__option_int(SP_OPT_HOST_CAPACITY), 80 * GiB);
        EXPECT_EQ(sp__option_source(SP_OPT_HOST_CAPACITY), SP_OPT_SRC_DEFAULT);
        sp__options_reload();
        sp__options_reload();
        EXPECT_EQ(count(SP_LOG_WARN, "SYMPOOL_HOST_CAPACITY"), 1u) << "warned more than once";
    }
    // Each kind's range and syntax checks, one at a time.
    const std::pair<const char *, const char *> bad[] = {
        {"SYMPOOL_DEVICE", "gpu"},
        {"SYMPOOL_NO_CACHING", "maybe"},
        {"SYMPOOL_HOST_DEVICES", "0"},
        {"SYMPOOL_HOST_DEVICES", "65"},
        {"SYMPOOL_HOST_DEVICES", "3x"},
        {"SYMPOOL_HOST_FAIL_AFTER", "-1"},
        {"SYMPOOL_SYM_TIMEOUT", "1e11"}, // past one year: "no timeout" is 0 or inf
        {"SYMPOOL_SYM_TIMEOUT", "1e99"},
        {"SYMPOOL_SYM_TIMEOUT", "1e999"},  // overflows a double
        {"SYMPOOL_SYM_TIMEOUT", "1e-320"}, // underflows: a number, below 1 ns
        {"SYMPOOL_SYM_TIMEOUT", "-1"},
        {"SYMPOOL_SYM_TIMEOUT", "-inf"},
        {"SYMPOOL_SYM_TIMEOUT", "nan"},
        {"SYMPOOL_SYM_TIMEOUT", "0x10"}, // strtod reads hex; whole numbers and sizes do not
        {"SYMPOOL_GC_THRESHOLD", "1"},
        {"SYMPOOL_GC_THRESHOLD", "-0.1"},
        {"SYMPOOL_MAX_SPLIT_SIZE", "19MiB"},
        {"SYMPOOL_MAX_NON_SPLIT_ROUNDING", "1MiB"},
        {"SYMPOOL_DEBUG_SUBSYS", "POOL,FOO"},
        {"SYMPOOL_ROUNDUP_POWER2_DIVISIONS", "3"},
        {"SYMPOOL_ALLOC_CONF", "bogus_key:1"},
        {"SYMPOOL_DEBUG", "LOUD"},
    };
    for (const auto &b : bad) {
        size_t before = count(SP_LOG_WARN, b.first);
        Env env({{b.first, b.second}});
        EXPECT_EQ(count(SP_LOG_WARN, b.first), before + 1) << b.first << "=" << b.second;
        EXPECT_GE(
            count(SP_LOG_WARN, std::string(b.first) + "='" + b.second + "' is malformed") +
                count(SP_LOG_WARN, std::string(b.first) + "='" + b.second + "' is out of range"),
            1u)
            << "the warning does not name the variable and its value";
    }
    // After the bad value left, the same bad value warns again (tests reuse values).
    Env again({{"SYMPOOL_HOST_CAPACITY", "-5GiB"}});
    EXPECT_EQ(count(SP_LOG_WARN, "SYMPOOL_HOST_CAPACITY='-5GiB'"), 2u);
}

// SYMPOOL_GC_THRESHOLD and ALLOC_CONF's garbage_collection_threshold are one setting: the
// variable refused the hexadecimal forms that the key takes as PyTorch's std::stod does
// (0x0.8), and took an underflowing 1e-320 that the key refuses (std::stod throws on it). Every
// value reads the same both ways: both refuse it, or both take it as the same number.
TEST_F(CoreTest, GcThresholdVariableReadsAsItsAllocConfKey) {
    expect_warnings();
    const char *values[] = {"0.6",  "0x0.8",  "0x1p-1", "0X.4",   " 0.25 ", "6e-1",
                            "+0.5", "1e-320", "0.5abc", "0x",     "inf",    "nan",
                            "0",    "1",      "-0.5",   "0x1p+0", ".5",     "0x0.8p"};
    for (const char *v : values) {
        std::string conf = std::string("garbage_collection_threshold:") + v;
        char why[256];
        bool key_ok = sp_x_alloc_conf_check(conf.c_str(), why, sizeof why);
        double key_value = 0.0;
        if (key_ok) {
            sp_alloc_conf_t c;
            sp__alloc_conf_defaults(&c);
            ASSERT_SP_OK(sp__alloc_conf_parse(conf.c_str(), &c));
            key_value = c.gc_threshold;
        }
        Env env({{"SYMPOOL_GC_THRESHOLD", v}});
        // 0 is the variable's "off", which the key cannot say (PyTorch wants (0, 1)).
        bool var_ok = sp__option_source(SP_OPT_GC_THRESHOLD) != SP_OPT_SRC_DEFAULT;
        if (strcmp(v, "0") == 0) {
            EXPECT_TRUE(var_ok && !key_ok) << v;
            continue;
        }
        EXPECT_EQ(var_ok, key_ok) << "'" << v << "': the key says " << (key_ok ? "yes" : why);
        if (var_ok && key_ok) {
            EXPECT_EQ(sp__option_double(SP_OPT_GC_THRESHOLD), key_value) << v;
        }
    }
}

// The option table (sympool info, SYMPOOL_INFO=1, sp_x_option_info) wrote a double option with
// "%g", six significant digits: SYMPOOL_GC_THRESHOLD=0.9999999 showed as "1", a value the option
// refuses, and SYMPOOL_EXPANDABLE_ALIGN_SKIP=0.4999999 as "0.5". The text now reads back as the
// value in force, from the variable and from the ALLOC_CONF key alike.
TEST_F(CoreTest, OptionTableWritesADoubleThatReadsBackAsItsValue) {
    auto shown = [](const char *name, sp_x_option_info_t *info) {
        for (int i = 0; sp_x_option_info(i, info); i++)
            if (strcmp(info->name, name) == 0)
                return true;
        return false;
    };
    struct Case {
        const char *var, *value, *option;
    } cases[] = {
        {"SYMPOOL_GC_THRESHOLD", "0.9999999", "SYMPOOL_GC_THRESHOLD"},
        {"SYMPOOL_ALLOC_CONF", "garbage_collection_threshold:0.9999999", "SYMPOOL_GC_THRESHOLD"},
        {"SYMPOOL_EXPANDABLE_ALIGN_SKIP", "0.4999999", "SYMPOOL_EXPANDABLE_ALIGN_SKIP"},
        {"SYMPOOL_GC_THRESHOLD", "0.1", "SYMPOOL_GC_THRESHOLD"},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(std::string(c.var) + "=" + c.value);
        Env env({{c.var, c.value}});
        sp_x_option_info_t info;
        ASSERT_TRUE(shown(c.option, &info));
        EXPECT_STRNE(info.source, "default");
        EXPECT_EQ(std::strtod(info.value, nullptr), info.value_double) << info.value;
        if (strcmp(c.value, "0.1") == 0) {
            EXPECT_STREQ(info.value, "0.1") << "no more digits than it takes";
        }
    }
}

// A number outside its option's range is called that, not "malformed": 1e-320 (which strtod
// reports as an underflow) is a well-formed number below the deadline's 1 ns resolution.
TEST_F(CoreTest, OutOfRangeIsNotMalformed) {
    expect_warnings();
    {
        Env env({{"SYMPOOL_SYM_TIMEOUT", "1e-320"}});
        EXPECT_EQ(count(SP_LOG_WARN, "SYMPOOL_SYM_TIMEOUT='1e-320' is out of range (want 0 or inf"),
                  1u);
        EXPECT_EQ(count(SP_LOG_WARN, "malformed"), 0u);
        EXPECT_EQ(sp__option_double(SP_OPT_SYM_TIMEOUT), 60.0);
    }
    {
        Env env({{"SYMPOOL_SYM_TIMEOUT", "1e-9"}});
        EXPECT_EQ(sp__option_double(SP_OPT_SYM_TIMEOUT), 1e-9);
    }
    {
        Env env({{"SYMPOOL_SYM_TIMEOUT", "soon"}});
        EXPECT_EQ(count(SP_LOG_WARN, "SYMPOOL_SYM_TIMEOUT='soon' is malformed (want a number)"),
                  1u);
    }
}

// SYMPOOL_EXPANDABLE_PAGE takes any size up to 1 GiB (rounded up to the device's granularity
// where it is used); past that it is out of range and the default applies.
TEST_F(CoreTest, ExpandablePageHasACeiling) {
    expect_warnings();
    for (const char *ok : {"0", "4096", "2MiB", "3MiB", "20MiB", "1GiB"}) {
        size_t want = 0;
        ASSERT_TRUE(sp__parse_size(ok, &want));
        Env env({{"SYMPOOL_EXPANDABLE_PAGE", ok}});
        EXPECT_EQ(sp__option_int(SP_OPT_EXPANDABLE_PAGE), (int64_t)want) << ok;
        EXPECT_EQ(count(SP_LOG_WARN, "SYMPOOL_EXPANDABLE_PAGE"), 0u) << ok;
    }
    for (const char *bad : {"1073741825", "2GiB", "1TiB"}) {
        Env env({{"SYMPOOL_EXPANDABLE_PAGE", bad}});
        EXPECT_EQ(count(SP_LOG_WARN, std::string("SYMPOOL_EXPANDABLE_PAGE='") + bad +
                                         "' is out of range (want 0 (PyTorch's 20 MiB) or at "
                                         "most 1GiB)"),
                  1u)
            << bad;
        EXPECT_EQ(sp__option_int(SP_OPT_EXPANDABLE_PAGE), (int64_t)(2 * MiB)) << bad;
    }
}

// SYMPOOL_ROUNDUP_POWER2_DIVISIONS holds one roundup_power2_divisions value. It was read as the
// ALLOC_CONF "roundup_power2_divisions:TEXT", so a comma in it began other keys: "4,max_split_
// size_mb:64" set the roundup to 4 without a word while its max_split_size_mb was dropped (and
// "4," or "[64:8],bogus_key:1" passed too, the latter only because the key is unknown).
TEST_F(CoreTest, RoundupVariableTakesOneValueOnly) {
    expect_warnings();
    for (const char *bad : {"4,max_split_size_mb:64", "[64:8],expandable_segments:True", "4,",
                            "4,backend:native", "[64:8,>:2],"}) {
        Env env({{"SYMPOOL_ROUNDUP_POWER2_DIVISIONS", bad},
                 {"SYMPOOL_MAX_SPLIT_SIZE", nullptr},
                 {"SYMPOOL_EXPANDABLE_SEGMENTS", nullptr},
                 {"SYMPOOL_ALLOC_CONF", nullptr},
                 {"PYTORCH_ALLOC_CONF", nullptr},
                 {"PYTORCH_CUDA_ALLOC_CONF", nullptr}});
        EXPECT_EQ(count(SP_LOG_WARN,
                        std::string("SYMPOOL_ROUNDUP_POWER2_DIVISIONS='") + bad + "' is malformed"),
                  1u)
            << bad;
        EXPECT_EQ(sp__option_source(SP_OPT_ROUNDUP_POWER2_DIVISIONS), SP_OPT_SRC_DEFAULT) << bad;
        sp_alloc_conf_t g;
        sp__alloc_conf_get(&g);
        for (uint32_t d : g.roundup_divisions)
            EXPECT_EQ(d, 0u) << bad << ": the roundup was taken";
        EXPECT_EQ(g.max_split_size, SIZE_MAX) << bad;
        EXPECT_FALSE(g.expandable_segments) << bad;
        char why[256] = "";
        EXPECT_FALSE(sp_x_option_check("SYMPOOL_ROUNDUP_POWER2_DIVISIONS", bad, why, sizeof why))
            << bad;
        EXPECT_SP_STATUS(sp__option_set(SP_OPT_ROUNDUP_POWER2_DIVISIONS, bad),
                         SP_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(sp__option_source(SP_OPT_ROUNDUP_POWER2_DIVISIONS), SP_OPT_SRC_DEFAULT) << bad;
    }
    // One value, blanks around it included, still reads as the key does.
    {
        Env env({{"SYMPOOL_ROUNDUP_POWER2_DIVISIONS", " [64:8, >:2] "}});
        sp_alloc_conf_t g;
        sp__alloc_conf_get(&g);
        EXPECT_EQ(g.roundup_divisions[0], 8u);
        EXPECT_EQ(g.roundup_divisions[6], 8u);
        EXPECT_EQ(g.roundup_divisions[7], 2u);
        EXPECT_EQ(g.roundup_divisions[15], 2u);
    }
    {
        Env env({{"SYMPOOL_ROUNDUP_POWER2_DIVISIONS", " 4 "}});
        sp_alloc_conf_t g;
        sp__alloc_conf_get(&g);
        for (uint32_t d : g.roundup_divisions)
            EXPECT_EQ(d, 4u);
    }
}

// A whole number too large for its variable is out of range too, whether it overflows 64 bits
// or only the option's type; the same digits followed by junk stay malformed.
// A host name of 64 characters (Linux's longest): gethostname() into 64 bytes refused it, and the
// host was "unknown" on every such node (log prefixes, %h, the world's node names), though the
// short name of a long FQDN fits. Read in a child in a UTS namespace of its own (it goes with the
// child; root only, skipped elsewhere): the short name, and a long name without a dot cut to the
// 63 characters kept. No allocation in the child (it is a fork of a process with threads).
TEST_F(CoreTest, TheLongestHostNamesAreReadNotUnknown) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        if (unshare(CLONE_NEWUTS) != 0)
            _exit(77);
        static char name[65], out[64], want[64];
        memcpy(name, "gpu01.", 6);
        memset(name + 6, 'x', 58); // 64 characters
        if (sethostname(name, 64) != 0)
            _exit(77);
        sp__process_host_read(out, sizeof out);
        if (strcmp(out, "gpu01") != 0)
            _exit(1);
        memset(name, 'a', 64);
        memset(want, 'a', 63);
        if (sethostname(name, 64) != 0)
            _exit(77);
        sp__process_host_read(out, sizeof out);
        if (strcmp(out, want) != 0)
            _exit(2);
        // 62 x and an e-acute (2 bytes): the cut at 63 bytes keeps the whole character or none
        // of it (a lone lead byte made the reports' JSON and Prometheus text invalid UTF-8).
        memset(name, 'x', 62);
        memcpy(name + 62, "\xc3\xa9", 2);
        memset(want, 0, sizeof want);
        memset(want, 'x', 62);
        if (sethostname(name, 64) != 0)
            _exit(77);
        sp__process_host_read(out, sizeof out);
        _exit(strcmp(out, want) == 0 ? 0 : 3);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77)
        GTEST_SKIP() << "no UTS namespace of its own here (not root?)";
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << "1: not the short name of a long FQDN; 2: not cut; 3: cut inside a character";
}

TEST_F(CoreTest, TooLargeNumberIsOutOfRangeNotMalformed) {
    expect_warnings();
    const struct {
        sp_option_t opt;
        const char *name, *value;
    } big[] = {
        {SP_OPT_HOST_CAPACITY, "SYMPOOL_HOST_CAPACITY", "18446744073709551615"}, // past int64
        {SP_OPT_HOST_CAPACITY, "SYMPOOL_HOST_CAPACITY", "18446744073709551616"}, // past 64 bits
        {SP_OPT_HOST_CAPACITY, "SYMPOOL_HOST_CAPACITY", "999999999999999999999GiB"},
        {SP_OPT_HOST_CAPACITY, "SYMPOOL_HOST_CAPACITY", "16777216TiB"}, // 2^64 bytes
        {SP_OPT_HOST_CAPACITY, "SYMPOOL_HOST_CAPACITY", "8EiB"},  // past int64: "less than 8EiB"
        {SP_OPT_HOST_CAPACITY, "SYMPOOL_HOST_CAPACITY", "16EiB"}, // 2^64 bytes
        {SP_OPT_HOST_FAIL_AFTER, "SYMPOOL_HOST_FAIL_AFTER", "99999999999999999999"},
    };
    for (const auto &b : big) {
        Env env({{b.name, b.value}});
        std::string head = std::string(b.name) + "='" + b.value + "' is ";
        EXPECT_EQ(count(SP_LOG_WARN, head + "out of range"), 1u) << b.name << "=" << b.value;
        EXPECT_EQ(count(SP_LOG_WARN, head + "malformed"), 0u) << b.name << "=" << b.value;
        EXPECT_EQ(sp__option_source(b.opt), SP_OPT_SRC_DEFAULT) << b.name << "=" << b.value;
    }
    {
        Env env({{"SYMPOOL_HOST_CAPACITY", "18446744073709551616x"}});
        EXPECT_EQ(count(SP_LOG_WARN, "SYMPOOL_HOST_CAPACITY='18446744073709551616x' is malformed"),
                  1u);
    }
    {
        Env env({{"SYMPOOL_HOST_FAIL_AFTER", "99999999999999999999x"}});
        EXPECT_EQ(
            count(SP_LOG_WARN, "SYMPOOL_HOST_FAIL_AFTER='99999999999999999999x' is malformed"), 1u);
    }
    // Past 2^64 - 1 (PyTorch's stoull refuses it), or a key PyTorch does not clamp; the split
    // sizes up to 2^64 - 1 are clamped as PyTorch clamps them (AllocConf below).
    sp_alloc_conf_t c;
    for (const char *text : {"max_split_size_mb:99999999999999999999999",
                             "max_non_split_rounding_mb:18446744073709551616",
                             "large_segment_size_mb:17592186044416"}) {
        sp__error_clear();
        EXPECT_SP_STATUS(sp__alloc_conf_parse(text, &c), SP_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(sp_last_error()).find("is out of range"), std::string::npos)
            << text << " -> " << sp_last_error();
        EXPECT_EQ(std::string(sp_last_error()).find("not a whole number"), std::string::npos)
            << text << " -> " << sp_last_error();
    }
}

// A message that quotes the previous one (sp_last_error() as its own argument) comes out whole:
// it used to be formatted into the buffer it was read from.
TEST_F(CoreTest, ErrorQuotingThePreviousErrorIsWhole) {
    expect_warnings();
    (void)sp__error(SP_ERR_DEVICE, SP_SUB_POOL, "the first reason, %d bytes", 4096);
    (void)sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "stream %p is not a stream (%s)",
                    (void *)0x10, sp_last_error());
    EXPECT_STREQ(sp_last_error(), "stream 0x10 is not a stream (the first reason, 4096 bytes)");
}

TEST_F(CoreTest, UnknownSympoolVariableWarns) {
    expect_warnings();
    {
        Env env({{"SYMPOOL_HOST_CAPACTIY", "1G"}, {"SYMPOOL_TEST_DEVICE", "host"}});
        EXPECT_EQ(count(SP_LOG_WARN,
                        "unknown variable SYMPOOL_HOST_CAPACTIY: ignored; known: SYMPOOL_DEVICE"),
                  1u);
        sp__options_reload();
        EXPECT_EQ(count(SP_LOG_WARN, "SYMPOOL_HOST_CAPACTIY"), 1u) << "warned twice";
        EXPECT_EQ(count(SP_LOG_WARN, "SYMPOOL_TEST_DEVICE"), 0u) << "the allow-listed name warned";
        EXPECT_EQ(sp__option_int(SP_OPT_HOST_CAPACITY), 80 * GiB);
    }
    EXPECT_EQ(count(SP_LOG_WARN, "unknown variable"), 1u);
}

// The variables the Python package and the scripts read (sympool.torch's SYMPOOL_CACHE_DIR,
// gpu-check's SYMPOOL_GPU_CHECK_*) reach every process those parts start: no warning for them,
// or every test run by scripts/gpu-check.sh fails on an unexpected warning.
TEST_F(CoreTest, VariablesOfThePackageAndScriptsDoNotWarn) {
    Env env({{"SYMPOOL_CACHE_DIR", "/tmp/x"},
             {"SYMPOOL_GPU_CHECK_CMAKE_ARGS", "-DX=1"},
             {"SYMPOOL_CMAKE_BUILD_DIR", "build"},
             {"SYMPOOL_TEST_NP", "1"}});
    sp__options_reload();
    EXPECT_EQ(count(SP_LOG_WARN, "unknown variable"), 0u);
}

TEST_F(CoreTest, OptionSet) {
    Env env({{"SYMPOOL_HOST_CAPACITY", nullptr},
             {"SYMPOOL_ALLOC_CONF", nullptr},
             {"SYMPOOL_MAX_SPLIT_SIZE", nullptr}});
    ASSERT_SP_OK(sp__option_set(SP_OPT_HOST_CAPACITY, "2GiB"));
    EXPECT_EQ(sp__option_int(SP_OPT_HOST_CAPACITY), 2 * GiB);
    EXPECT_EQ(sp__option_source(SP_OPT_HOST_CAPACITY), SP_OPT_SRC_API);
    {
        expect_warnings();
        EXPECT_SP_STATUS(sp__option_set(SP_OPT_HOST_CAPACITY, "lots"), SP_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(sp_last_error()).find("SYMPOOL_HOST_CAPACITY='lots'"),
                  std::string::npos)
            << sp_last_error();
        EXPECT_EQ(sp__option_int(SP_OPT_HOST_CAPACITY), 2 * GiB)
            << "a failed set changed the value";
        EXPECT_EQ(sp__option_source(SP_OPT_HOST_CAPACITY), SP_OPT_SRC_API);
        EXPECT_SP_STATUS(sp__option_set(SP_OPT_COUNT, "1"), SP_ERR_INVALID_ARGUMENT);
    }
    // ALLOC_CONF set from code reaches the separate options that were not set.
    ASSERT_SP_OK(
        sp__option_set(SP_OPT_ALLOC_CONF, "max_split_size_mb:64,expandable_segments:True"));
    EXPECT_EQ(sp__option_int(SP_OPT_MAX_SPLIT_SIZE), 64 * MiB);
    EXPECT_EQ(sp__option_source(SP_OPT_MAX_SPLIT_SIZE), SP_OPT_SRC_CONF);
    EXPECT_EQ(sp__option_int(SP_OPT_EXPANDABLE_SEGMENTS), 1);
    ASSERT_SP_OK(sp__option_set(SP_OPT_ALLOC_CONF, nullptr)); // back to the default
    EXPECT_EQ(sp__option_int(SP_OPT_MAX_SPLIT_SIZE), 0);
    EXPECT_EQ(sp__option_source(SP_OPT_MAX_SPLIT_SIZE), SP_OPT_SRC_DEFAULT);
    ASSERT_SP_OK(sp__option_set(SP_OPT_HOST_CAPACITY, nullptr));
    EXPECT_EQ(sp__option_int(SP_OPT_HOST_CAPACITY), 80 * GiB);
    // sp__options_reload() forgets API settings: the environment is the truth again.
    ASSERT_SP_OK(sp__option_set(SP_OPT_HOST_DEVICES, "3"));
    sp__options_reload();
    EXPECT_EQ(sp__option_source(SP_OPT_HOST_DEVICES),
              getenv("SYMPOOL_HOST_DEVICES") ? SP_OPT_SRC_ENV : SP_OPT_SRC_DEFAULT);
}

TEST_F(CoreTest, PytorchAllocConfAppliesOnlyWhenOursIsUnset) {
    {
        Env env({{"SYMPOOL_ALLOC_CONF", nullptr},
                 {"SYMPOOL_MAX_SPLIT_SIZE", nullptr},
                 {"PYTORCH_ALLOC_CONF", nullptr},
                 {"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"}});
        EXPECT_EQ(sp__option_int(SP_OPT_MAX_SPLIT_SIZE), 64 * MiB);
        EXPECT_EQ(sp__option_source(SP_OPT_ALLOC_CONF), SP_OPT_SRC_PYTORCH);
        EXPECT_EQ(sp__option_source(SP_OPT_MAX_SPLIT_SIZE), SP_OPT_SRC_CONF);
        char *buf = nullptr;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        ASSERT_NE(f, nullptr);
        sp__options_print(f);
        fclose(f);
        std::string out(buf, len);
        free(buf);
        size_t at = out.find("SYMPOOL_ALLOC_CONF");
        ASSERT_NE(at, std::string::npos) << out;
        std::string line = out.substr(at, out.find('\n', at) - at);
        EXPECT_NE(line.find("[PYTORCH_CUDA_ALLOC_CONF]"), std::string::npos) << line;
    }
    {
        Env env({{"SYMPOOL_ALLOC_CONF", "max_split_size_mb:32"},
                 {"SYMPOOL_MAX_SPLIT_SIZE", nullptr},
                 {"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"}});
        EXPECT_EQ(sp__option_int(SP_OPT_MAX_SPLIT_SIZE), 32 * MiB) << "ours must win";
        EXPECT_EQ(sp__option_source(SP_OPT_ALLOC_CONF), SP_OPT_SRC_ENV);
    }
}

// PyTorch reads PYTORCH_ALLOC_CONF first and PYTORCH_CUDA_ALLOC_CONF only when it is unset (the
// older name, kept for compatibility); a job that states its settings in the new name gets them in
// sympool too, and the printed source names the variable they came from.
TEST_F(CoreTest, PytorchAllocConfIsReadBeforeTheCudaName) {
    auto source_line = [] {
        char *buf = nullptr;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (f == nullptr)
            return std::string();
        sp__options_print(f);
        fclose(f);
        std::string out(buf, len);
        free(buf);
        size_t at = out.find("SYMPOOL_ALLOC_CONF");
        return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
    };
    {
        Env env({{"SYMPOOL_ALLOC_CONF", nullptr},
                 {"SYMPOOL_MAX_SPLIT_SIZE", nullptr},
                 {"PYTORCH_CUDA_ALLOC_CONF", nullptr},
                 {"PYTORCH_ALLOC_CONF", "max_split_size_mb:96"}});
        EXPECT_EQ(sp__option_int(SP_OPT_MAX_SPLIT_SIZE), 96 * MiB) << "PYTORCH_ALLOC_CONF ignored";
        EXPECT_EQ(sp__option_source(SP_OPT_MAX_SPLIT_SIZE), SP_OPT_SRC_CONF);
        EXPECT_NE(source_line().find("[PYTORCH_ALLOC_CONF]"), std::string::npos) << source_line();
    }
    {
        Env env({{"SYMPOOL_ALLOC_CONF", nullptr},
                 {"SYMPOOL_MAX_SPLIT_SIZE", nullptr},
                 {"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"},
                 {"PYTORCH_ALLOC_CONF", "max_split_size_mb:96"}});
        EXPECT_EQ(sp__option_int(SP_OPT_MAX_SPLIT_SIZE), 96 * MiB) << "the older name won";
    }
    {
        Env env({{"SYMPOOL_ALLOC_CONF", "max_split_size_mb:32"},
                 {"SYMPOOL_MAX_SPLIT_SIZE", nullptr},
                 {"PYTORCH_ALLOC_CONF", "max_split_size_mb:96"}});
        EXPECT_EQ(sp__option_int(SP_OPT_MAX_SPLIT_SIZE), 32 * MiB) << "ours must win";
    }
    {
        // A malformed value is reported under the name it was read from.
        expect_warnings();
        Env env({{"SYMPOOL_ALLOC_CONF", nullptr},
                 {"SYMPOOL_MAX_SPLIT_SIZE", nullptr},
                 {"PYTORCH_CUDA_ALLOC_CONF", nullptr},
                 {"PYTORCH_ALLOC_CONF", "max_split_size_mb:5"}});
        EXPECT_EQ(count(SP_LOG_WARN, "PYTORCH_ALLOC_CONF='max_split_size_mb:5'"), 1u);
        EXPECT_EQ(count(SP_LOG_WARN, "PYTORCH_CUDA_ALLOC_CONF"), 0u);
    }
}

// sp_x_option_check says what sp_x_option_set would, in its words, and sets nothing (replay
// checks --capacity with it before the trace is read, without reading the option table).
TEST_F(CoreTest, OptionCheckSaysWhatSetWouldAndSetsNothing) {
    Env env({{"SYMPOOL_HOST_CAPACITY", nullptr}});
    char why[256] = "";
    EXPECT_TRUE(sp_x_option_check("SYMPOOL_HOST_CAPACITY", "2GiB", why, sizeof why));
    EXPECT_EQ(sp__option_source(SP_OPT_HOST_CAPACITY), SP_OPT_SRC_DEFAULT);
    EXPECT_FALSE(sp_x_option_check("SYMPOOL_HOST_CAPACITY", "12parsecs", why, sizeof why));
    std::string checked = why;
    {
        expect_warnings();
        EXPECT_SP_STATUS(sp_x_option_set("SYMPOOL_HOST_CAPACITY", "12parsecs"),
                         SP_ERR_INVALID_ARGUMENT);
    }
    EXPECT_EQ(checked, sp_last_error());
    EXPECT_FALSE(sp_x_option_check("SYMPOOL_NO_SUCH", "1", why, sizeof why));
    EXPECT_NE(std::string(why).find("SYMPOOL_NO_SUCH is not a SYMPOOL_* option"), std::string::npos)
        << why;
    EXPECT_FALSE(sp_x_option_check(nullptr, "1", nullptr, 0));
    EXPECT_FALSE(sp_x_option_check("SYMPOOL_HOST_CAPACITY", nullptr, why, sizeof why));
    EXPECT_EQ(sp__option_source(SP_OPT_HOST_CAPACITY), SP_OPT_SRC_DEFAULT);
}

TEST_F(CoreTest, OptionsPrintShowsValueDefaultAndSource) {
    Env env({{"SYMPOOL_HOST_DEVICES", "3"},
             {"SYMPOOL_ALLOC_CONF", "garbage_collection_threshold:0.5"},
             {"SYMPOOL_GC_THRESHOLD", nullptr}});
    char *buf = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ASSERT_NE(f, nullptr);
    sp__options_print(f);
    fclose(f);
    std::string out(buf, len);
    free(buf);
    for (int o = 0; o < SP_OPT_COUNT; o++)
        EXPECT_NE(out.find(sp__option_name((sp_option_t)o)), std::string::npos)
            << sp__option_name((sp_option_t)o);
    EXPECT_NE(out.find("SYMPOOL_HOST_CAPACITY              80GiB"), std::string::npos) << out;
    size_t dev = out.find("SYMPOOL_HOST_DEVICES");
    ASSERT_NE(dev, std::string::npos);
    std::string dev_line = out.substr(dev, out.find('\n', dev) - dev);
    EXPECT_NE(dev_line.find(" 3 "), std::string::npos) << dev_line;
    EXPECT_NE(dev_line.find("default 1 "), std::string::npos) << dev_line;
    EXPECT_NE(dev_line.find("[env]"), std::string::npos) << dev_line;
    size_t gc = out.find("SYMPOOL_GC_THRESHOLD");
    std::string gc_line = out.substr(gc, out.find('\n', gc) - gc);
    EXPECT_NE(gc_line.find("0.5"), std::string::npos) << gc_line;
    EXPECT_NE(gc_line.find("[ALLOC_CONF]"), std::string::npos) << gc_line;
}

// ---- ALLOC_CONF ----------------------------------------------------------------------------

class AllocConf : public CoreTest {
  protected:
    void SetUp() override {
        CoreTest::SetUp();
        sp__alloc_conf_defaults(&c);
    }
    sp_alloc_conf_t c;
};

TEST_F(AllocConf, EachKey) {
    ASSERT_SP_OK(sp__alloc_conf_parse("max_split_size_mb:128, max_non_split_rounding_mb:40,"
                                      "large_segment_size_mb:64,garbage_collection_threshold:0.6,"
                                      "expandable_segments:True",
                                      &c));
    EXPECT_EQ(c.max_split_size, (size_t)(128 * MiB));
    EXPECT_EQ(c.max_non_split_rounding, (size_t)(40 * MiB));
    EXPECT_EQ(c.large_segment_size, (size_t)(64 * MiB));
    EXPECT_DOUBLE_EQ(c.gc_threshold, 0.6);
    EXPECT_TRUE(c.expandable_segments);
    EXPECT_STREQ(c.conf_text,
                 "max_split_size_mb:128, max_non_split_rounding_mb:40,large_segment_size_mb:64,"
                 "garbage_collection_threshold:0.6,expandable_segments:True");
    ASSERT_SP_OK(sp__alloc_conf_parse("expandable_segments:False", &c));
    EXPECT_FALSE(c.expandable_segments);
    EXPECT_EQ(c.max_split_size, (size_t)(128 * MiB)) << "keys not named keep their earlier values";
    ASSERT_SP_OK(sp__alloc_conf_parse("", &c));
}

// PyTorch takes any size_t for max_split_size_mb and max_non_split_rounding_mb and clamps it to
// SIZE_MAX / 1 MiB (c10/core/AllocatorConfig.cpp); both were refused past that ("out of range"),
// so a setting torch runs with was dropped here. Past 2^64 - 1 its stoull refuses it, as we do.
TEST_F(AllocConf, SplitSizesPastSizeMaxAreClampedAsPyTorchClampsThem) {
    expect_warnings(); // the refused ones below warn
    const size_t most = SIZE_MAX / MiB * MiB;
    for (const char *mb : {"17592186044416", "18446744073709551615", "0018446744073709551615"}) {
        ASSERT_SP_OK(sp__alloc_conf_parse(
            (std::string("max_split_size_mb:") + mb + ",max_non_split_rounding_mb:" + mb).c_str(),
            &c));
        EXPECT_EQ(c.max_split_size, most) << mb;
        EXPECT_EQ(c.max_non_split_rounding, most) << mb;
    }
    ASSERT_SP_OK(sp__alloc_conf_parse("max_split_size_mb:17592186044415", &c));
    EXPECT_EQ(c.max_split_size, most);
    const sp_alloc_conf_t before = c;
    for (const char *bad : {"max_split_size_mb:18446744073709551616",
                            "max_non_split_rounding_mb:99999999999999999999",
                            "large_segment_size_mb:17592186044416"}) {
        EXPECT_SP_STATUS(sp__alloc_conf_parse(bad, &c), SP_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(0, std::memcmp(&c, &before, sizeof c)) << bad << " changed the conf";
    }
}

// PyTorch's tokenizer drops every ' ', inside keys and values too: "max_split_size_mb:20 0" is
// 200 MiB there. The entry was refused here (a warning, and the setting not applied).
TEST_F(AllocConf, SpacesAnywhereAreDroppedAsPyTorchDropsThem) {
    ASSERT_SP_OK(sp__alloc_conf_parse("max_split_size_mb:20 0, expandable_segments:Tr ue,"
                                      "garbage_collection_threshold: 0. 5,roundup_power2_"
                                      "divisions:[ 2 56:4 ,>: 1]",
                                      &c));
    EXPECT_EQ(c.max_split_size, (size_t)(200 * MiB));
    EXPECT_TRUE(c.expandable_segments);
    EXPECT_DOUBLE_EQ(c.gc_threshold, 0.5);
    EXPECT_EQ(c.roundup_divisions[8], 4u); // the 256 MB interval
    EXPECT_EQ(c.roundup_divisions[15], 1u);
    EXPECT_STREQ(c.conf_text, "max_split_size_mb:20 0, expandable_segments:Tr ue,"
                              "garbage_collection_threshold: 0. 5,roundup_power2_"
                              "divisions:[ 2 56:4 ,>: 1]")
        << "the text is kept as given";
}

TEST_F(AllocConf, RoundupSingleNumberFillsEveryInterval) {
    ASSERT_SP_OK(sp__alloc_conf_parse("roundup_power2_divisions:4", &c));
    for (uint32_t d : c.roundup_divisions)
        EXPECT_EQ(d, 4u);
}

TEST_F(AllocConf, RoundupListFollowsPyTorch) {
    ASSERT_SP_OK(sp__alloc_conf_parse(
        "max_split_size_mb:256,roundup_power2_divisions:[64:8,256:4,1024:4,>:1]", &c));
    // First entry fills indices 0..6 (below and at 64 MB); 128 MB (index 7) and 512 MB (index 9)
    // are not named and stay 0; ">" fills everything after the last boundary (1024 MB = index 10).
    const uint32_t want[16] = {8, 8, 8, 8, 8, 8, 8, 0, 4, 0, 4, 1, 1, 1, 1, 1};
    for (int i = 0; i < 16; i++)
        EXPECT_EQ(c.roundup_divisions[i], want[i]) << "index " << i;
    EXPECT_EQ(c.max_split_size, (size_t)(256 * MiB)) << "the comma inside [...] split the keys";

    ASSERT_SP_OK(sp__alloc_conf_parse("roundup_power2_divisions:[1:2,>:0]", &c));
    const uint32_t want2[16] = {2};
    for (int i = 0; i < 16; i++)
        EXPECT_EQ(c.roundup_divisions[i], want2[i]) << "index " << i;
}

// c10/test/core/AllocatorConfig_test.cpp's tables, read through the 16 intervals ([1 MiB, 2 MiB)
// is index 0, [32 GiB, inf) index 15): a boundary not named keeps 0 (no rounding).
TEST_F(AllocConf, RoundupTablesOfPyTorchsConfigTest) {
    ASSERT_SP_OK(
        sp__alloc_conf_parse("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]", &c));
    const uint32_t want1[16] = {8, 8, 8, 8, 8, 8, 8, 2, 4, 2, 4, 1, 1, 1, 1, 1};
    for (int i = 0; i < 16; i++)
        EXPECT_EQ(c.roundup_divisions[i], want1[i]) << "index " << i;
    ASSERT_SP_OK(
        sp__alloc_conf_parse("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]", &c));
    const uint32_t want2[16] = {8, 8, 8, 8, 8, 8, 8, 8, 16, 1, 0, 8, 2, 2, 2, 2};
    for (int i = 0; i < 16; i++)
        EXPECT_EQ(c.roundup_divisions[i], want2[i]) << "index " << i;
}

// PyTorch's list parser (AcceleratorAllocatorConfig::parseRoundUpPower2Divisions) takes the
// entries in any order: each boundary sets its own interval (a later one wins), only the first
// boundary also fills the intervals below it, and ">" fills from just after the boundary read
// before it (index 1 when it comes first, so interval 0 keeps 0). An empty list is all zeros.
// A string written for PyTorch must give the same table here, not a warning and the defaults.
TEST_F(AllocConf, RoundupListInAnyOrderLikePyTorch) {
    const struct {
        const char *text;
        uint32_t want[16];
    } cases[] = {
        {"roundup_power2_divisions:[256:4,64:8]", {4, 4, 4, 4, 4, 4, 8, 4, 4}},
        {"roundup_power2_divisions:[64:8,64:2]", {8, 8, 8, 8, 8, 8, 2}},
        {"roundup_power2_divisions:[>:1,64:2]", {2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
        {"roundup_power2_divisions:[>:4]", {0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}},
        {"roundup_power2_divisions:[1024:4,>:1,64:8]",
         {4, 4, 4, 4, 4, 4, 8, 4, 4, 4, 4, 1, 1, 1, 1, 1}},
        {"roundup_power2_divisions:[]", {0}},
    };
    for (const auto &k : cases) {
        sp__alloc_conf_defaults(&c);
        ASSERT_SP_OK(sp__alloc_conf_parse("roundup_power2_divisions:2", &c));
        SCOPED_TRACE(k.text);
        ASSERT_SP_OK(sp__alloc_conf_parse(k.text, &c));
        for (int i = 0; i < 16; i++)
            EXPECT_EQ(c.roundup_divisions[i], k.want[i]) << "index " << i;
    }
}

TEST_F(AllocConf, RejectsBadValuesAndLeavesConfUnchanged) {
    expect_warnings();
    ASSERT_SP_OK(sp__alloc_conf_parse("max_split_size_mb:100,roundup_power2_divisions:2", &c));
    const sp_alloc_conf_t before = c;
    const struct {
        const char *text;
        const char *needle; // must appear in sp_last_error()
    } bad[] = {
        {"max_split_size_mb:19", "max_split_size_mb"},
        {"max_non_split_rounding_mb:10", "max_non_split_rounding_mb"},
        {"max_split_size_mb:abc", "max_split_size_mb"},
        {"max_split_size_mb:-20", "max_split_size_mb"},
        {"garbage_collection_threshold:1.0", "garbage_collection_threshold"},
        {"garbage_collection_threshold:0", "garbage_collection_threshold"},
        {"roundup_power2_divisions:3", "roundup_power2_divisions"},
        // PyTorch: the single number must be a power of 2 (0 only inside the list form).
        {"roundup_power2_divisions:0", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[64:3]", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[96:4]", "roundup_power2_divisions"},
        {"roundup_power2_divisions:[64:8", "roundup_power2_divisions"},
        {"expandable_segments:yes", "expandable_segments"},
        // PyTorch's ConfigTokenizer::toBool takes True and False only.
        {"expandable_segments:true", "is not True or False"},
        {"expandable_segments:false", "is not True or False"},
        {"release_lock_on_cudamalloc:true", "release_lock_on_cudamalloc"},
        {"max_split_size_mb:64,no_such_key:1", "no_such_key"},
        {"justakey", "justakey"},
        {"backend:magic", "backend"},
        {"pinned_num_register_threads:x", "pinned_num_register_threads"},
    };
    for (const auto &b : bad) {
        sp__error_clear();
        EXPECT_SP_STATUS(sp__alloc_conf_parse(b.text, &c), SP_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(sp_last_error()).find(b.needle), std::string::npos)
            << b.text << " -> " << sp_last_error();
        EXPECT_EQ(0, std::memcmp(&c, &before, sizeof c)) << b.text << " changed the conf";
    }
    EXPECT_SP_STATUS(sp__alloc_conf_parse("backend:cudaMallocAsync", &c), SP_ERR_NOT_SUPPORTED);
    EXPECT_NE(std::string(sp_last_error()).find("not supported"), std::string::npos);
}

// Each refused roundup_power2_divisions value is called what it is: 2^32 (past the 32-bit
// table) and a boundary of 2^64 MB were said to be "not a power of 2", and "4,max_split_size_mb:64"
// (SYMPOOL_ROUNDUP_POWER2_DIVISIONS' text) "not a power of 2" where it is no number at all.
TEST_F(AllocConf, RoundupMessagesSayWhatIsWrong) {
    const struct {
        const char *text, *says;
    } cases[] = {
        {"roundup_power2_divisions:4294967296",
         "'4294967296' is out of range (at most 2147483648)"},
        {"roundup_power2_divisions:[64:4294967296]",
         "value '4294967296' is out of range (at most 2147483648)"},
        {"roundup_power2_divisions:[18446744073709551616:4]",
         "boundary '18446744073709551616' is out of range"},
        {"roundup_power2_divisions:3", "'3' is not a power of 2"},
        {"roundup_power2_divisions:[64:3]", "value '3' is not a power of 2 or 0"},
        {"roundup_power2_divisions:[96:4]", "boundary '96' is not a power-of-2 MB size"},
    };
    for (const auto &k : cases) {
        char why[256] = "";
        EXPECT_FALSE(sp_x_alloc_conf_check(k.text, why, sizeof why)) << k.text;
        EXPECT_NE(std::string(why).find(k.says), std::string::npos) << k.text << " -> " << why;
    }
    char why[256] = "";
    EXPECT_FALSE(sp_x_option_check("SYMPOOL_ROUNDUP_POWER2_DIVISIONS", "4,max_split_size_mb:64",
                                   why, sizeof why));
    EXPECT_NE(std::string(why).find("is neither N (a power of 2) nor [MB:N,...,>:N]"),
              std::string::npos)
        << why;
    EXPECT_EQ(std::string(why).find("not a power of 2"), std::string::npos) << why;
}

TEST_F(AllocConf, CudaOnlyKeysAreAcceptedAndIgnored) {
    Env env({{"SYMPOOL_DEBUG", "INFO"}});
    ASSERT_SP_OK(sp__alloc_conf_parse(
        "backend:native,release_lock_on_cudamalloc:True,"
        "pinned_use_cuda_host_register:False,pinned_num_register_threads:8,"
        "pinned_use_background_threads:True,graph_capture_record_stream_reuse:False",
        &c));
    EXPECT_EQ(c.max_split_size, SIZE_MAX);
    EXPECT_EQ(count(SP_LOG_INFO, "has no effect in sympool: ignored"), 6u);
    EXPECT_EQ(count(SP_LOG_INFO, "ALLOC_CONF key pinned_num_register_threads:8 has no effect"), 1u);
}

// The rest of what PyTorch's CUDA build accepts: the pinned reserve segment (a whole number of MB
// above 0) and the ROCm spellings it takes on CUDA too, "to ease the burden on ROCm users".
TEST_F(AllocConf, PinnedReserveAndHipSpellingsAreAcceptedAndIgnored) {
    Env env({{"SYMPOOL_DEBUG", "INFO"}});
    ASSERT_SP_OK(sp__alloc_conf_parse("max_split_size_mb:64,pinned_reserve_segment_size_mb:256,"
                                      "release_lock_on_hipmalloc:False,"
                                      "pinned_use_hip_host_register:True",
                                      &c));
    EXPECT_EQ(c.max_split_size, (size_t)(64 * MiB));
    EXPECT_EQ(count(SP_LOG_INFO, "has no effect in sympool: ignored"), 3u);
    expect_warnings();
    const sp_alloc_conf_t before = c;
    for (const char *bad : {"pinned_reserve_segment_size_mb:0", "pinned_reserve_segment_size_mb:x",
                            "release_lock_on_hipmalloc:1"}) {
        EXPECT_SP_STATUS(sp__alloc_conf_parse(bad, &c), SP_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(0, std::memcmp(&c, &before, sizeof c)) << bad << " changed the conf";
    }
}

TEST_F(AllocConf, SeparateVariableBeatsAllocConf) {
    {
        Env env(
            {{"SYMPOOL_ALLOC_CONF", "max_split_size_mb:128,roundup_power2_divisions:[64:8,>:2]"},
             {"SYMPOOL_MAX_SPLIT_SIZE", nullptr},
             {"SYMPOOL_ROUNDUP_POWER2_DIVISIONS", nullptr}});
        sp_alloc_conf_t g;
        sp__alloc_conf_get(&g);
        EXPECT_EQ(g.max_split_size, (size_t)(128 * MiB));
        EXPECT_EQ(sp__option_source(SP_OPT_MAX_SPLIT_SIZE), SP_OPT_SRC_CONF);
        EXPECT_EQ(g.roundup_divisions[6], 8u);
        EXPECT_EQ(g.roundup_divisions[7], 2u);
        EXPECT_STREQ(g.conf_text, "max_split_size_mb:128,roundup_power2_divisions:[64:8,>:2]");
    }
    {
        Env env(
            {{"SYMPOOL_ALLOC_CONF", "max_split_size_mb:128,roundup_power2_divisions:[64:8,>:2]"},
             {"SYMPOOL_MAX_SPLIT_SIZE", "256MiB"},
             {"SYMPOOL_ROUNDUP_POWER2_DIVISIONS", "4"},
             {"SYMPOOL_NO_CACHING", "1"}});
        sp_alloc_conf_t g;
        sp__alloc_conf_get(&g);
        EXPECT_EQ(g.max_split_size, (size_t)(256 * MiB));
        EXPECT_EQ(sp__option_source(SP_OPT_MAX_SPLIT_SIZE), SP_OPT_SRC_ENV);
        for (uint32_t d : g.roundup_divisions)
            EXPECT_EQ(d, 4u);
        EXPECT_TRUE(g.no_caching);
    }
}

// One bad key no longer throws the whole string away (PyTorch rejects only what
// it cannot parse); each bad entry warns once, and not again while the text stays the same.
TEST_F(AllocConf, BadEntryKeepsTheValidKeysAndWarnsOncePerBadKey) {
    expect_warnings();
    {
        Env env({{"SYMPOOL_ALLOC_CONF", "max_split_size_mb:128,max_non_split_rounding_mb:5"},
                 {"SYMPOOL_MAX_SPLIT_SIZE", nullptr}});
        EXPECT_EQ(count(SP_LOG_WARN, "SYMPOOL_ALLOC_CONF"), 1u);
        EXPECT_EQ(count(SP_LOG_WARN, "max_non_split_rounding_mb"), 1u);
        sp_alloc_conf_t g;
        sp__alloc_conf_get(&g);
        EXPECT_EQ(g.max_split_size, (size_t)(128 * MiB)) << "the valid key was thrown away";
        EXPECT_EQ(g.max_non_split_rounding, (size_t)(20 * MiB)) << "the bad key was applied";
        EXPECT_EQ(sp__option_source(SP_OPT_MAX_SPLIT_SIZE), SP_OPT_SRC_CONF);
        EXPECT_STREQ(g.conf_text, "max_split_size_mb:128,max_non_split_rounding_mb:5");
    }
    const char *text = "max_split_size_mb:64,backend:cudaMallocAsync,garbage_collection_threshold:"
                       "0.5,bogus:1,bogus:2";
    size_t before = count(SP_LOG_WARN, "SYMPOOL_ALLOC_CONF");
    {
        Env env({{"SYMPOOL_ALLOC_CONF", text},
                 {"SYMPOOL_MAX_SPLIT_SIZE", nullptr},
                 {"SYMPOOL_GC_THRESHOLD", nullptr}});
        EXPECT_EQ(count(SP_LOG_WARN, "SYMPOOL_ALLOC_CONF"), before + 2) << "one per bad key";
        EXPECT_EQ(count(SP_LOG_WARN, "backend: cudaMallocAsync is not supported"), 1u);
        EXPECT_EQ(count(SP_LOG_WARN, "unknown key 'bogus'"), 1u);
        sp__options_reload();
        sp__options_reload();
        EXPECT_EQ(count(SP_LOG_WARN, "SYMPOOL_ALLOC_CONF"), before + 2) << "warned again";
        sp_alloc_conf_t g;
        sp__alloc_conf_get(&g);
        EXPECT_EQ(g.max_split_size, (size_t)(64 * MiB));
        EXPECT_DOUBLE_EQ(g.gc_threshold, 0.5);
    }
    // From code (the CLI's --conf) the string stays all or nothing: a clear error, no change.
    EXPECT_SP_STATUS(sp__option_set(SP_OPT_ALLOC_CONF, "max_split_size_mb:64,bogus:1"),
                     SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(sp__option_source(SP_OPT_MAX_SPLIT_SIZE), SP_OPT_SRC_DEFAULT);
}

// ---- logging -------------------------------------------------------------------------------

TEST_F(CoreTest, LogLineFormat) {
    expect_warnings();
    char host[64] = "";
    gethostname(host, sizeof host);
    if (char *dot = std::strchr(host, '.'))
        *dot = '\0';
    std::string prefix = std::string(host) + ":" + std::to_string(getpid()) + ":";

    SP_WARN(SP_SUB_POOL, "hello %d", 7);
    int line = __LINE__ - 1;
    std::string l = last_line();
    EXPECT_EQ(l.rfind(prefix, 0), 0u) << l;
    EXPECT_NE(l.find(" [r- d-] SYMPOOL WARN test_core.cc:" + std::to_string(line) + " hello 7"),
              std::string::npos)
        << l;
    EXPECT_EQ(l.find('\n'), std::string::npos);

    sp__log_set_rank(3);
    SP_WARN(SP_SUB_POOL, "ranked");
    EXPECT_NE(last_line().find(" [r3 d-] SYMPOOL WARN test_core.cc:"), std::string::npos)
        << last_line();
    sp__log_set_device(1);
    SP_WARN(SP_SUB_POOL, "ranked");
    EXPECT_NE(last_line().find(" [r3 d1] "), std::string::npos) << last_line();
    std::string other;
    std::thread([&] { // the device is per thread
        SP_WARN(SP_SUB_POOL, "other thread");
        other = last_line();
    })
        .join();
    EXPECT_NE(other.find(" [r3 d-] "), std::string::npos) << other;
    sp__log_set_device(-1);
    sp__log_set_rank(-1);

    std::string big(5000, 'x'); // a long message is cut, not split over lines
    SP_WARN(SP_SUB_POOL, "%s\n", big.c_str());
    EXPECT_LT(last_line().size(), 2100u);
    EXPECT_EQ(last_line().substr(last_line().size() - 3), "...");
}

TEST_F(CoreTest, LevelsAndSubsystemMasks) {
    unsigned m = 0;
    EXPECT_TRUE(sp__log_parse_mask("INIT,POOL", &m));
    EXPECT_EQ(m, (unsigned)(SP_SUB_INIT | SP_SUB_POOL));
    EXPECT_TRUE(sp__log_parse_mask("^coll,history", &m));
    EXPECT_EQ(m, (unsigned)(SP_SUB_ALL & ~(SP_SUB_COLL | SP_SUB_HISTORY)));
    EXPECT_TRUE(sp__log_parse_mask("ALL", &m));
    EXPECT_EQ(m, (unsigned)SP_SUB_ALL);
    m = 77;
    for (const char *b : {"", "^", "POOL,", "POOL,,INIT", "POOLS", "ALL^"})
        EXPECT_FALSE(sp__log_parse_mask(b, &m)) << b;
    EXPECT_EQ(m, 77u);

    {
        Env env({{"SYMPOOL_DEBUG", "info"}, {"SYMPOOL_DEBUG_SUBSYS", "^POOL"}});
        size_t before = n_lines();
        SP_INFO(SP_SUB_POOL, "pool info");
        SP_INFO(SP_SUB_INIT, "init info");
        SP_TRACE(SP_SUB_INIT, "init trace");
        EXPECT_EQ(n_lines(), before + 1);
        EXPECT_EQ(count(SP_LOG_INFO, "init info"), 1u);
        EXPECT_EQ(count(SP_LOG_INFO, "pool info"), 0u);
    }
    {
        Env env({{"SYMPOOL_DEBUG", "NONE"}});
        size_t before = n_lines();
        SP_WARN(SP_SUB_ALL, "silent");
        EXPECT_EQ(n_lines(), before);
    }
    {
        Env env({{"SYMPOOL_DEBUG", "TRACE"}, {"SYMPOOL_DEBUG_SUBSYS", "ENV"}});
        SP_TRACE(SP_SUB_ENV, "env trace");
        SP_TRACE(SP_SUB_API, "api trace");
        EXPECT_EQ(count(SP_LOG_TRACE, "env trace"), 1u);
        EXPECT_EQ(count(SP_LOG_TRACE, "api trace"), 0u);
        EXPECT_NE(last_line().find("SYMPOOL TRACE test_core.cc:"), std::string::npos);
    }
    EXPECT_EQ(sp__log_level, SP_LOG_WARN);
    EXPECT_EQ(sp__log_mask, (unsigned)SP_SUB_ALL);
}

// sp_shutdown ends with sp__options_forget, which marks the level unread (SP_LOG_UNREAD, above
// every level) so that the next line reads SYMPOOL_DEBUG again. A line on another thread that had
// read the options just before took that mark for the level and was logged whatever the settings
// said: WARNs with SYMPOOL_DEBUG=NONE (seen under ThreadSanitizer, calls refused while another
// thread looped sp_shutdown and sp_init). The mark, as such a thread sees it after its reading,
// is set here by hand: the line keeps the level in force until the options are read again.
TEST_F(CoreTest, ALineRacingAShutdownKeepsTheLevelInForce) {
    Env env({{"SYMPOOL_DEBUG", "NONE"}, {"SYMPOOL_DEBUG_SUBSYS", "^POOL"}});
    ASSERT_EQ(sp__option_int(SP_OPT_DEBUG), SP_LOG_NONE); // the options read, as the racing line
    size_t before = n_lines();
    __atomic_store_n(&sp__log_level, SP_LOG_UNREAD, __ATOMIC_RELAXED); // a concurrent forget's
    EXPECT_FALSE(sp__log_wanted(SP_LOG_WARN, SP_SUB_INIT));
    SP_WARN(SP_SUB_INIT, "silent");
    EXPECT_EQ(n_lines(), before);
    {
        Env info({{"SYMPOOL_DEBUG", "INFO"}}); // the mask ^POOL stays
        __atomic_store_n(&sp__log_level, SP_LOG_UNREAD, __ATOMIC_RELAXED);
        EXPECT_TRUE(sp__log_wanted(SP_LOG_INFO, SP_SUB_INIT));
        EXPECT_FALSE(sp__log_wanted(SP_LOG_INFO, SP_SUB_POOL));
        EXPECT_FALSE(sp__log_wanted(SP_LOG_TRACE, SP_SUB_INIT));
    }
}

// The log file is made as fopen(path, "a") makes one, 0666 less the umask (it was 0644, which
// dropped the group's write bit a umask of 002 grants).
TEST_F(CoreTest, DebugFileFollowsTheUmask) {
    expect_warnings();
    char dir[] = "/tmp/sp_core_logXXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string path = std::string(dir) + "/log.txt";
    mode_t old = umask(002);
    {
        Env env({{"SYMPOOL_DEBUG_FILE", path.c_str()}});
        sp__log_set_fn(nullptr, nullptr); // to the file, not the capture
        SP_WARN(SP_SUB_POOL, "a line for the file");
        sp__log_set_fn(capture, &log_);
    }
    umask(old);
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0) << "no log file was made";
    EXPECT_EQ(st.st_mode & 07777, 0664u);
    unlink(path.c_str());
    rmdir(dir);
}

TEST_F(CoreTest, DebugFileWithPidAndRank) {
    expect_warnings();
    char dir[] = "/tmp/sp_core_logXXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string pattern = std::string(dir) + "/log.%h.%p.txt";
    char host[64] = "";
    gethostname(host, sizeof host);
    if (char *dot = std::strchr(host, '.'))
        *dot = '\0';
    std::string path = std::string(dir) + "/log." + host + "." + std::to_string(getpid()) + ".txt";
    {
        Env env({{"SYMPOOL_DEBUG_FILE", pattern.c_str()}});
        sp__log_set_fn(nullptr, nullptr); // to the file, not the capture
        std::vector<std::thread> ts;
        for (int t = 0; t < 4; t++)
            ts.emplace_back([t] {
                for (int i = 0; i < 50; i++)
                    SP_WARN(SP_SUB_POOL, "to the file t%d i%d", t, i);
            });
        for (auto &t : ts)
            t.join();
        sp__log_set_fn(capture, &log_);
    }
    std::string text = read_file(path);
    std::istringstream in(text);
    std::string l;
    int n = 0;
    while (std::getline(in, l)) {
        EXPECT_NE(l.find(" SYMPOOL WARN test_core.cc:"), std::string::npos) << l;
        EXPECT_NE(l.find("to the file t"), std::string::npos) << l;
        n++;
    }
    EXPECT_EQ(n, 200) << "lines were lost or interleaved";
    unlink(path.c_str());

    // %r: lines before the rank is known go to stderr; once it is set they go to the rank's file.
    std::string rpattern = std::string(dir) + "/rank%r.log";
    std::string rpath = std::string(dir) + "/rank5.log";
    {
        Env env({{"SYMPOOL_DEBUG_FILE", rpattern.c_str()}});
        sp__log_set_fn(nullptr, nullptr);
        SP_WARN(SP_SUB_POOL, "before the rank (expected on stderr)");
        EXPECT_NE(access(rpath.c_str(), F_OK), 0);
        sp__log_set_rank(5);
        SP_WARN(SP_SUB_POOL, "after the rank");
        sp__log_set_rank(-1);
        sp__log_set_fn(capture, &log_);
    }
    std::string rtext = read_file(rpath);
    EXPECT_NE(rtext.find("[r5 d-] SYMPOOL WARN test_core.cc:"), std::string::npos) << rtext;
    EXPECT_EQ(rtext.find("before the rank"), std::string::npos);
    unlink(rpath.c_str());
    rmdir(dir);
}

// A FIFO (or any non-regular file) as SYMPOOL_DEBUG_FILE is refused with a message, and the lines
// go to stderr: opening a FIFO for writing used to wait, with the log lock held, for a reader
// that never comes.
TEST_F(CoreTest, DebugFileThatIsAFifoIsRefused) {
    expect_warnings();
    char dir[] = "/tmp/sp_core_fifoXXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string fifo = std::string(dir) + "/log.fifo";
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    std::string err;
    {
        Env env({{"SYMPOOL_DEBUG_FILE", fifo.c_str()}});
        sp__log_set_fn(nullptr, nullptr);
        testing::internal::CaptureStderr();
        std::atomic<bool> done{false};
        std::thread t([&] {
            SP_WARN(SP_SUB_POOL, "a line for the fifo");
            done = true;
        });
        for (int i = 0; i < 1000 && !done; i++)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        bool returned = done;
        if (!returned) { // a reader lets the blocked open return, so the test ends
            int fd = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
            t.join();
            close(fd);
        } else {
            t.join();
        }
        err = testing::internal::GetCapturedStderr();
        sp__log_set_fn(capture, &log_);
        EXPECT_TRUE(returned) << "logging blocked on a FIFO";
    }
    EXPECT_NE(err.find("cannot open SYMPOOL_DEBUG_FILE"), std::string::npos) << err;
    EXPECT_NE(err.find("FIFO"), std::string::npos) << err;
    EXPECT_NE(err.find("a line for the fifo"), std::string::npos) << err;
    unlink(fifo.c_str());
    rmdir(dir);
}

// A program that writes the lines it routes (sp_x_log_set_fn) to SYMPOOL_DEBUG_FILE's file itself,
// as sympool's CLI does, fails on the same file as the log: it was said twice, by each. One
// notice per file, whoever failed on it first; a file said since is news again.
TEST_F(CoreTest, DebugFileNotOpenedIsSaidOnceWhoeverFailsFirst) {
    expect_warnings();
    char dir[] = "/tmp/sp_core_nologXXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string a = std::string(dir) + "/none/a.log", b = std::string(dir) + "/none/b.log";
    auto count = [](const std::string &text, const std::string &path) {
        std::string said = "cannot open SYMPOOL_DEBUG_FILE '" + path + "': ";
        size_t n = 0;
        for (size_t at = text.find(said); at != std::string::npos; at = text.find(said, at + 1))
            n++;
        return n;
    };
    std::string err;
    bool first, again, other, back;
    {
        Env env({{"SYMPOOL_DEBUG_FILE", a.c_str()}});
        sp__log_set_fn(nullptr, nullptr);
        testing::internal::CaptureStderr();
        first = sp_x_log_cannot_open(a.c_str(), "the program's reason"); // the program first
        SP_WARN(SP_SUB_POOL, "a line of the log");                       // then the log
        again = sp_x_log_cannot_open(a.c_str(), "the program's reason");
        other = sp_x_log_cannot_open(b.c_str(), "the program's reason");
        back = sp_x_log_cannot_open(a.c_str(), "the program's reason");
        err = testing::internal::GetCapturedStderr();
        sp__log_set_fn(capture, &log_);
    }
    EXPECT_TRUE(first);
    EXPECT_FALSE(again);
    EXPECT_TRUE(other);
    EXPECT_TRUE(back) << "a file said before another is news again";
    EXPECT_EQ(count(err, a), 2u) << err;
    EXPECT_EQ(count(err, b), 1u) << err;
    EXPECT_NE(err.find("'" + a + "': the program's reason; logging to stderr"), std::string::npos)
        << err;
    EXPECT_NE(err.find("a line of the log"), std::string::npos) << err;
    // The log first, then the program: said once.
    std::string c = std::string(dir) + "/none/c.log";
    {
        Env env({{"SYMPOOL_DEBUG_FILE", c.c_str()}});
        sp__log_set_fn(nullptr, nullptr);
        testing::internal::CaptureStderr();
        SP_WARN(SP_SUB_POOL, "a line of the log");
        again = sp_x_log_cannot_open(c.c_str(), "the program's reason");
        err = testing::internal::GetCapturedStderr();
        sp__log_set_fn(capture, &log_);
    }
    EXPECT_FALSE(again);
    EXPECT_EQ(count(err, c), 1u) << err;
    EXPECT_NE(err.find("'" + c + "': No such file or directory; logging to stderr"),
              std::string::npos)
        << err;
    rmdir(dir);
}

// ---- time ----------------------------------------------------------------------------------

TEST(CoreTime, ClocksMoveForward) {
    uint64_t a = sp__now_ns();
    uint64_t b = sp__now_ns();
    EXPECT_LE(a, b);
    EXPECT_GT(sp__epoch_us(), 1600000000ll * 1000000ll); // after Sep 2020
}

// A tick stamp maps to the wall clock between wall-clock readings taken around it (to within a
// millisecond: the map's error is the anchors' reading jitter, and NTP slews the wall clock by
// at most 0.05%), stamps in order map in order, and a stamp before the first anchor maps before
// it. Correctness of the conversion, not speed: preemption only widens the brackets.
TEST(CoreTime, TicksMapToTheWallClock) {
    sp_tick_anchor_t first, last;
    sp__tick_anchor(&first);
    std::vector<std::array<int64_t, 2>> brackets;
    std::vector<uint64_t> stamps;
    for (int i = 0; i < 20; i++) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        int64_t before = sp__epoch_us();
        stamps.push_back(sp__ticks());
        brackets.push_back({before, sp__epoch_us()});
    }
    sp__tick_anchor(&last);
    sp_tick_map_t map;
    sp__tick_map(&first, &last, &map);
    EXPECT_GT(map.us_per_tick, 0.0);
    int64_t prev = INT64_MIN;
    for (size_t i = 0; i < stamps.size(); i++) {
        int64_t us = sp__tick_us(&map, stamps[i]);
        EXPECT_GE(us, brackets[i][0] - 1000) << "stamp " << i;
        EXPECT_LE(us, brackets[i][1] + 1000) << "stamp " << i;
        EXPECT_GE(us, prev) << "stamp " << i;
        prev = us;
    }
    EXPECT_LT(sp__tick_us(&map, first.ticks - 1000000), first.epoch_us);
}

// Bad input is refused before anything is touched, with a message naming the public call (not
// only the internal writer's words, which its other callers share).
TEST(CoreFileWrite, BadInputIsRefusedByName) {
    EXPECT_SP_STATUS(sp_x_file_write_atomic(nullptr, "x", 1), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(sp_last_error(), "sp_x_file_write_atomic"), nullptr) << sp_last_error();
    EXPECT_SP_STATUS(sp_x_file_write_atomic("", "x", 1), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(sp_last_error(), "sp_x_file_write_atomic"), nullptr) << sp_last_error();
    EXPECT_SP_STATUS(sp_x_file_write_atomic("unused-name", nullptr, 1), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(access("unused-name", F_OK), 0);
    // A path past PATH_MAX, or a name past NAME_MAX, is an argument too long, as it is for
    // sp_dump_snapshot (it was SP_ERR_SYSTEM here, "cannot inspect ...").
    for (const std::string &p : {std::string(PATH_MAX + 10, 'x'), std::string(NAME_MAX + 1, 'y')}) {
        EXPECT_SP_STATUS(sp_x_file_write_atomic(p.c_str(), "x", 1), SP_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::strstr(sp_last_error(), "too long"), nullptr) << sp_last_error();
    }
}

// The report's and the CLI's sizes (SP_SIZE_HUMAN) are in the largest unit that keeps the number
// below 1024 (size_format.c): a figure that rounds up to 1024 of a unit is 1 of the next, as the
// summary cells' is. 1 MiB - 1 byte was "1024.00 KiB", and a mean of 1023.75 bytes "1024 B".
TEST(CoreSizeFormat, HumanSizesStayBelow1024OfTheirUnit) {
    char buf[64];
    EXPECT_STREQ(sp__size_format(1048575, SP_SIZE_HUMAN, buf, sizeof buf), "1.00 MiB");
    EXPECT_STREQ(sp__size_format(1023.75, SP_SIZE_HUMAN, buf, sizeof buf), "1.00 KiB");
    EXPECT_STREQ(sp__size_format(-1048575, SP_SIZE_HUMAN, buf, sizeof buf), "-1.00 MiB");
    EXPECT_STREQ(sp__size_format(1023, SP_SIZE_HUMAN, buf, sizeof buf), "1023 B");
    EXPECT_STREQ(sp__size_format(1048063, SP_SIZE_HUMAN, buf, sizeof buf), "1023.50 KiB");
    EXPECT_STREQ(sp__size_format(1024.0 * 1024 * 1024 - 1, SP_SIZE_HUMAN, buf, sizeof buf),
                 "1.00 GiB");
    EXPECT_STREQ(sp__size_format(1048575, SP_SIZE_CELL, buf, sizeof buf), "   1.0 MiB");
}

// A program that calls setlocale (a decimal comma: de_DE) changed what sympool read and wrote:
// strtod stopped at the '.' of "garbage_collection_threshold:0.6" (refused), "%.2f" wrote OOM
// sizes as "1,50 MiB", and a JSON float as 0,5 (no JSON reader takes it). Numbers are read and
// written in the C locale whatever the program's.
TEST(CoreLocale, NumbersKeepTheirDecimalPointUnderACommaLocale) {
    sp::CommaLocale comma;
    if (!comma.active())
        GTEST_SKIP() << "no de_DE locale can be made here (localedef, the locales package)";
    char buf[64], why[256];
    EXPECT_STREQ(sp__size_format(1.5 * 1048576, SP_SIZE_PYTORCH, buf, sizeof buf), "1.50 MiB");
    EXPECT_STREQ(sp__size_format(1.5 * 1048576, SP_SIZE_HUMAN, buf, sizeof buf), "1.50 MiB");
    EXPECT_STREQ(sp__size_format(1.5 * 1048576, SP_SIZE_CELL, buf, sizeof buf), "   1.5 MiB");
    EXPECT_STREQ(sp__double_format(0.6, buf, sizeof buf), "0.6");
    EXPECT_STREQ(sp__double_format(1.0000001, buf, sizeof buf), "1.0000001");
    char *end = nullptr;
    const char *text = "0.6,x";
    EXPECT_EQ(sp__strtod_c(text, &end), 0.6);
    EXPECT_EQ(end, text + 3);
    EXPECT_TRUE(sp_x_alloc_conf_check("garbage_collection_threshold:0.6", why, sizeof why)) << why;
    EXPECT_TRUE(sp_x_option_check("SYMPOOL_SYM_TIMEOUT", "2.5", why, sizeof why)) << why;
    sp__emit_t e;
    sp__emit_init(&e, true);
    sp__emit_list_begin(&e);
    sp__emit_double(&e, 0.5);
    sp__emit_double(&e, 1e-5);
    sp__emit_list_end(&e);
    char *json = nullptr;
    size_t len = 0;
    ASSERT_EQ(sp__emit_finish(&e, &json, &len), SP_SUCCESS);
    EXPECT_EQ(std::string(json, len), "[0.5,1e-05]\n");
    free(json);
    // The program's own formatting is left as it set it.
    snprintf(buf, sizeof buf, "%.1f", 2.5);
    EXPECT_STREQ(buf, "2,5");
}
