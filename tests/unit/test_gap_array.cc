// test_gap_array.cc: the sorted array with a gap (core/gap_array.h) against a sorted reference:
// after every insert, removal and sweep its logical entries are the reference's in order, and
// every lower and upper bound is the reference's, wherever the gap sits and whether or not the
// array had to grow with the gap inside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

extern "C" {
#include "core/gap_array.h"
#include "tests/unit/gap_array_probe.h"
}

namespace {

using Ref = std::vector<std::pair<uint64_t, uint64_t>>;

// The array's logical entries, in order.
Ref entries(const sp_gap_array_t &a) {
    Ref out;
    for (uint32_t i = 0; i < a.n; i++)
        out.emplace_back(sp__gap_at(&a, i)->key, sp__gap_at(&a, i)->val);
    return out;
}

uint32_t ref_lower(const Ref &r, uint64_t k) {
    return (uint32_t)(std::lower_bound(r.begin(), r.end(), std::make_pair(k, uint64_t{0})) -
                      r.begin());
}

uint32_t ref_upper(const Ref &r, uint64_t k) {
    return (uint32_t)(std::upper_bound(r.begin(), r.end(), k,
                                       [](uint64_t x, const std::pair<uint64_t, uint64_t> &e) {
                                           return x < e.first;
                                       }) -
                      r.begin());
}

// Contents and every bound around every key (and between keys) agree with the reference.
void expect_same(const sp_gap_array_t &a, const Ref &r) {
    ASSERT_EQ(entries(a), r);
    ASSERT_LE(a.gap, a.n);
    ASSERT_LE(a.n, a.cap);
    std::vector<uint64_t> probes = {0, 1, UINT64_MAX};
    for (const auto &e : r) {
        probes.push_back(e.first - 1);
        probes.push_back(e.first);
        probes.push_back(e.first + 1);
    }
    for (uint64_t k : probes) {
        ASSERT_EQ(sp__gap_lower(&a, k), ref_lower(r, k)) << "lower " << k;
        ASSERT_EQ(sp__gap_upper(&a, k), ref_upper(r, k)) << "upper " << k;
    }
}

TEST(GapArray, FallingInsertsKeepOrderAcrossGrowth) {
    // A new segment below the last one each time, the pattern the indexes meet: every insert
    // lands where the gap is, and growth (64, 128, ...) happens with the gap in the middle.
    sp_gap_array_t a = {};
    Ref r;
    for (uint64_t i = 0; i < 40; i++) { // high ones first, in order
        uint64_t key = (1000 + i) << 21;
        ASSERT_TRUE(sp__gap_insert(&a, sp__gap_lower(&a, key), key, i + 1));
        r.emplace_back(key, i + 1);
    }
    for (uint64_t i = 0; i < 300; i++) { // then falling, below them
        uint64_t key = (999 - i) << 21;
        uint32_t at = sp__gap_lower(&a, key);
        ASSERT_EQ(at, 0u);
        ASSERT_TRUE(sp__gap_insert(&a, at, key, 100 + i));
        r.insert(r.begin(), std::make_pair(key, 100 + i));
        expect_same(a, r);
    }
    EXPECT_GE(a.cap, 340u);
    sp__gap_free(&a);
    EXPECT_EQ(a.e, nullptr);
    EXPECT_EQ(a.n, 0u);
}

TEST(GapArray, RandomChangesMatchASortedVector) {
    std::mt19937_64 rng(24);
    sp_gap_array_t a = {};
    Ref r;
    for (int step = 0; step < 4000; step++) {
        unsigned what = (unsigned)(rng() % 10);
        if (what < 5 || r.empty()) { // insert a key not present, near the last change or anywhere
            uint64_t key = (rng() % 5000) * 512 + 512;
            uint32_t at = ref_lower(r, key);
            if (at < r.size() && r[at].first == key)
                continue;
            ASSERT_EQ(sp__gap_lower(&a, key), at);
            uint64_t val = rng() % 3; // some zeros, for the sweep
            ASSERT_TRUE(sp__gap_insert(&a, at, key, val));
            r.insert(r.begin() + at, std::make_pair(key, val));
        } else if (what < 8) { // remove a run of one to three entries
            uint32_t at = (uint32_t)(rng() % r.size());
            uint32_t count = std::min<uint32_t>((uint32_t)(1 + rng() % 3), (uint32_t)r.size() - at);
            sp__gap_remove(&a, at, count);
            r.erase(r.begin() + at, r.begin() + at + count);
        } else if (what == 8) { // change a value in place
            uint32_t at = (uint32_t)(rng() % r.size());
            sp__gap_at(&a, at)->val = 7;
            r[at].second = 7;
        } else { // sweep the zero values out
            sp__gap_drop_zero_vals(&a);
            r.erase(std::remove_if(r.begin(), r.end(), [](const auto &e) { return e.second == 0; }),
                    r.end());
            EXPECT_EQ(a.gap, a.n);
        }
        expect_same(a, r);
        if (::testing::Test::HasFatalFailure())
            return;
    }
    sp__gap_free(&a);
}

} // namespace

// An empty array (e NULL, nothing allocated yet: a device's segment index before its first
// segment, looked up by sp_free of a foreign pointer) answers 0 everywhere, compiled as C, where
// the run after the gap at NULL + 0 is undefined (clang -fsanitize=undefined stopped there).
TEST(GapArray, EmptyArrayLookupsFromC) {
    uint32_t out[4] = {9, 9, 9, 9};
    sp_test_gap_probe_empty(out);
    EXPECT_EQ(out[0], 0u);
    EXPECT_EQ(out[1], 0u);
    EXPECT_EQ(out[2], 0u);
    EXPECT_EQ(out[3], 0u);
}
