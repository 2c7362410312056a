// test_summary.cc: sp_memory_summary: the table's rows and figures follow the statistics, every
// line has the same width, truncation keeps a terminated prefix, bad arguments change nothing.
#include "sp_test.hpp"

#include <climits>
#include <thread>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include "sympool/experimental.h"
}

using namespace sp;

class Summary : public sp::Test {};

static std::string summary(int device = 0) {
    std::vector<char> buf(SP_MEMORY_SUMMARY_MAX);
    EXPECT_EQ(sp_memory_summary(device, buf.data(), buf.size()), SP_SUCCESS) << sp_last_error();
    return buf.data();
}

// The table with the value cells of its device rows ("Device used (anyone)", "held by sympool",
// "not sympool's") blanked, position for position: on a GPU they are cudaMemGetInfo's live
// figures, which move between two calls with every other process on the device.
static std::string without_device_rows(std::string text) {
    size_t at = 0;
    while (at < text.size()) {
        size_t end = text.find('\n', at);
        if (end == std::string::npos)
            end = text.size();
        for (const char *label :
             {"| Device used (anyone) ", "|   held by sympool ", "|   not sympool's "})
            if (text.compare(at, std::strlen(label), label) == 0)
                for (size_t i = at + std::strlen(label); i < end; i++)
                    text[i] = '#';
        at = end + 1;
    }
    return text;
}

// The line whose label (text after "| ") starts with label, or "" if none.
static std::string line_of(const std::string &text, const std::string &label) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("| " + label, 0) == 0)
            return line;
    return "";
}

// The four cells of a row, trimmed.
static std::vector<std::string> cells(const std::string &line) {
    std::vector<std::string> out;
    std::istringstream in(line);
    std::string cell;
    std::getline(in, cell, '|'); // before the first bar
    std::getline(in, cell, '|'); // the label
    while (std::getline(in, cell, '|')) {
        size_t a = cell.find_first_not_of(' '), b = cell.find_last_not_of(' ');
        if (a != std::string::npos)
            out.push_back(cell.substr(a, b - a + 1));
    }
    return out;
}

TEST_F(Summary, RowsFollowTheStatistics) {
    void *small, *large;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &small));
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &large));
    ASSERT_SP_OK(sp_free(small));
    std::string s = summary();
    EXPECT_NE(s.find("memory summary, device 0"), std::string::npos) << s;
    EXPECT_NE(s.find("OOMs: 0"), std::string::npos) << s;
    EXPECT_NE(s.find("max split: unlimited"), std::string::npos) << s;
    // Allocated: current 3 MiB (large), peak 3 MiB + 1 KiB, 2 allocations, the small one freed.
    EXPECT_EQ(cells(line_of(s, "Allocated memory")),
              (std::vector<std::string>{"3.0 MiB", "3.0 MiB", "3.0 MiB", "1.0 KiB"}))
        << s;
    EXPECT_EQ(cells(line_of(s, "      from small pool")),
              (std::vector<std::string>{"0 B", "1.0 KiB", "1.0 KiB", "1.0 KiB"}))
        << s;
    EXPECT_EQ(cells(line_of(s, "Allocations")), (std::vector<std::string>{"1", "2", "2", "1"}))
        << s;
    EXPECT_EQ(cells(line_of(s, "Requested memory"))[3], "1000 B") << s;
    std::string reserved = cells(line_of(s, "Reserved memory"))[0];
    EXPECT_EQ(reserved, "22.0 MiB") << "2 MiB small + 20 MiB large segment\n" << s;
    // Every line is one table row of the same width.
    std::istringstream in(s);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        EXPECT_EQ(line.size(), 77u) << line;
        EXPECT_EQ(line.front(), '|');
        EXPECT_EQ(line.back(), '|');
        n++;
    }
    EXPECT_GT(n, 40);
    ASSERT_SP_OK(sp_free(large));
}

TEST_F(Summary, TruncatesToLenMinusOneAndTerminates) {
    std::string full = summary();
    for (size_t len : {size_t(1), size_t(2), size_t(80), full.size(), full.size() + 1}) {
        std::vector<char> buf(len + 8, 'x');
        ASSERT_SP_OK(sp_memory_summary(0, buf.data(), len));
        size_t want = std::min(len - 1, full.size());
        EXPECT_EQ(std::strlen(buf.data()), want) << len;
        EXPECT_EQ(without_device_rows(buf.data()), without_device_rows(full.substr(0, want)))
            << len;
        EXPECT_EQ(buf[len], 'x') << "wrote past len " << len;
    }
}

TEST_F(Summary, BadArgumentsChangeNothing) {
    char buf[16] = "untouched";
    EXPECT_SP_STATUS(sp_memory_summary(0, nullptr, 100), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_memory_summary(0, buf, 0), SP_ERR_INVALID_ARGUMENT);
    EXPECT_STREQ(buf, "untouched");
    EXPECT_SP_STATUS(sp_memory_summary(999, buf, sizeof(buf)), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_memory_summary(-1, buf, sizeof(buf)), SP_ERR_INVALID_ARGUMENT);
    EXPECT_STREQ(buf, "untouched");
    EXPECT_NE(std::string(sp_last_error()).size(), 0u);
    expect_warnings();
}

TEST_F(Summary, ExtremeFiguresFitTheMaximumBuffer) {
    sp_stats_t st;
    for (size_t i = 0; i < SP_STATS_MAX; i++)
        st.value[i] = (i % 2) ? INT64_MAX : INT64_MIN + 1;
    std::vector<char> buf(SP_MEMORY_SUMMARY_MAX);
    size_t n = sp_x_memory_summary_format(&st, "extreme", buf.data(), buf.size());
    EXPECT_LT(n, buf.size()) << "SP_MEMORY_SUMMARY_MAX is too small";
    EXPECT_EQ(std::strlen(buf.data()), n);
    EXPECT_NE(std::string(buf.data()).find("PiB"), std::string::npos) << buf.data();
}

// The formatter of `sympool summary` on NULL arguments: a NULL title or NULL statistics was
// dereferenced (strlen(NULL), a crash), a NULL buffer written to. Now: no buffer measures only,
// like snprintf(NULL, 0); no title is an empty one; no statistics read as zeros.
TEST_F(Summary, FormatterTakesNullArguments) {
    sp_stats_t zeros;
    std::memset(&zeros, 0, sizeof zeros);
    std::vector<char> want(SP_MEMORY_SUMMARY_MAX), got(SP_MEMORY_SUMMARY_MAX);
    size_t n = sp_x_memory_summary_format(&zeros, "", want.data(), want.size());
    EXPECT_EQ(sp_x_memory_summary_format(nullptr, nullptr, got.data(), got.size()), n);
    EXPECT_STREQ(got.data(), want.data());
    EXPECT_EQ(sp_x_memory_summary_format(&zeros, "", nullptr, 0), n);
    EXPECT_EQ(sp_x_memory_summary_format(&zeros, "", nullptr, 100), n);
    char one = 'x';
    EXPECT_EQ(sp_x_memory_summary_format(&zeros, "", &one, 0), n);
    EXPECT_EQ(one, 'x') << "len 0 writes nothing";
}

TEST_F(Summary, ThreadsEachGetAWholeTable) {
    std::string a = summary();
    std::vector<std::thread> ts;
    std::vector<std::string> got(4);
    for (int i = 0; i < 4; i++)
        ts.emplace_back([&got, i] { got[i] = summary(); });
    for (auto &t : ts)
        t.join();
    for (auto &g : got)
        EXPECT_EQ(without_device_rows(g), without_device_rows(a));
}
