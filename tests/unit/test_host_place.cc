// test_host_place.cc: sp_x_host_place, the host backend's placement of segments where a recorded
// run had them (replay uses it so that best fit's ties among free blocks of one size, which go to
// the lowest address, fall as they did on the recorded GPU).
#include "alloc_test_util.hpp"

extern "C" {
#include "sympool/experimental.h"
}

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

using sp::MiB;
using sp::stat;

namespace {

class HostPlace : public sp::Test {};

uintptr_t addr(void *p) {
    return reinterpret_cast<uintptr_t>(p);
}

// Two segments placed in the reverse of their allocation order sort as placed, and the next
// request of their size, with both cached, takes the lower one: the one made second. Carved by
// the bump pointer, the first would be the lower and would be taken.
TEST_F(HostPlace, PlacedSegmentsSortAsRecordedAndDecideTies) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"}});
    SP_SKIP_UNLESS_HOST();
    ASSERT_SP_OK(sp_init());
    ASSERT_SP_OK(sp_x_host_place(0, 20 * MiB, 100 * MiB));
    ASSERT_SP_OK(sp_x_host_place(0, 20 * MiB, 40 * MiB));
    void *first = nullptr, *second = nullptr, *again = nullptr;
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &first));
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &second));
    EXPECT_EQ(addr(first) - addr(second), 60 * MiB);
    ASSERT_SP_OK(sp_free(first));
    ASSERT_SP_OK(sp_free(second));
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &again));
    EXPECT_EQ(again, second);
    ASSERT_SP_OK(sp_free(again));
    EXPECT_EQ(stat("num_device_alloc"), 2);
}

// A placement that would overlap a live placed segment, or that waits for another size, is not
// taken: the segment is carved as without placement (below the placement region). Size 0 drops
// what waits. A freed placed range may be placed again.
TEST_F(HostPlace, OverlapsAndOtherSizesFallBackToCarving) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"}});
    SP_SKIP_UNLESS_HOST();
    ASSERT_SP_OK(sp_init());
    void *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr;
    ASSERT_SP_OK(sp_x_host_place(0, 20 * MiB, 0));
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &a));
    ASSERT_SP_OK(sp_x_host_place(0, 20 * MiB, 10 * MiB)); // overlaps a
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &b));
    EXPECT_LT(addr(b), addr(a)) << "an overlapping placement was taken";
    ASSERT_SP_OK(sp_x_host_place(0, 22 * MiB, 200 * MiB));
    ASSERT_SP_OK(sp_x_host_place(0, 0, 0)); // dropped before anything took it
    ASSERT_SP_OK(sp_malloc(22 * MiB, 0, nullptr, &c));
    EXPECT_NE(addr(c), addr(a) + 200 * MiB);
    EXPECT_LT(addr(c), addr(a));
    ASSERT_SP_OK(sp_x_host_place(0, 24 * MiB, 300 * MiB)); // waits for 24 MiB, not 26
    ASSERT_SP_OK(sp_malloc(26 * MiB, 0, nullptr, &d));
    EXPECT_LT(addr(d), addr(a));
    for (void *p : {a, b, c, d})
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache()); // a's range is free again: placing it again succeeds
    ASSERT_SP_OK(sp_x_host_place(0, 0, 0));
    ASSERT_SP_OK(sp_x_host_place(0, 20 * MiB, 0));
    void *a2 = nullptr;
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &a2));
    EXPECT_EQ(a2, a);
    ASSERT_SP_OK(sp_free(a2));
}

// Replay's pattern: place, allocate (which takes the placement), clear; again and again. A clear
// with nothing waiting changes nothing, and one after a placement that no allocation took drops
// it, however many clears with nothing to clear came before.
TEST_F(HostPlace, ClearsDropOnlyWhatWaits) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"}});
    SP_SKIP_UNLESS_HOST();
    ASSERT_SP_OK(sp_init());
    ASSERT_SP_OK(sp_x_host_place(0, 0, 0));
    std::vector<void *> segs;
    for (size_t i = 0; i < 4; i++) {
        ASSERT_SP_OK(sp_x_host_place(0, 20 * MiB, (400 - 40 * i) * MiB));
        void *p = nullptr;
        ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &p));
        ASSERT_SP_OK(sp_x_host_place(0, 0, 0)); // nothing waits: nothing changes
        ASSERT_SP_OK(sp_x_host_place(0, 0, 0));
        if (i > 0) {
            EXPECT_EQ(addr(segs.back()) - addr(p), 40 * MiB) << "segment " << i << " not placed";
        }
        segs.push_back(p);
    }
    ASSERT_SP_OK(sp_x_host_place(0, 22 * MiB, 500 * MiB)); // no allocation takes it ...
    ASSERT_SP_OK(sp_x_host_place(0, 0, 0));                // ... and the clear drops it
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(22 * MiB, 0, nullptr, &q));
    EXPECT_LT(addr(q), addr(segs.back())) << "a cleared placement was taken";
    segs.push_back(q);
    for (void *p : segs)
        ASSERT_SP_OK(sp_free(p));
}

// One thread places and clears while another makes and releases segments of the size it places
// (so that allocations take placements as the clears drop them): every call succeeds, and
// ThreadSanitizer sees the clear's lock-free test of "nothing waits" race with neither.
TEST_F(HostPlace, PlacingAndClearingRaceAllocation) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"}});
    SP_SKIP_UNLESS_HOST();
    ASSERT_SP_OK(sp_init());
    ASSERT_SP_OK(sp_x_host_place(0, 0, 0));
    std::atomic<bool> failed{false};
    std::thread placer([&] {
        for (uint64_t i = 0; i < 2000; i++)
            if (sp_x_host_place(0, 20 * MiB, (i % 8) * 64 * MiB) != SP_SUCCESS ||
                sp_x_host_place(0, 0, 0) != SP_SUCCESS)
                failed = true;
    });
    for (int i = 0; i < 200; i++) {
        void *p = nullptr;
        ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &p));
        ASSERT_SP_OK(sp_free(p));
        ASSERT_SP_OK(sp_empty_cache()); // the next malloc makes a segment again
    }
    placer.join();
    EXPECT_FALSE(failed.load());
    EXPECT_EQ(stat("num_device_alloc"), 200);
    EXPECT_EQ(stat("num_device_free"), 200);
}

// At most 16 placements wait: a 17th pushes out the oldest, so of 17 placed one after another
// (offsets 0, 32, ..., 512 MiB) the first request takes the second, and the 17th request finds
// none left and is carved below them all.
TEST_F(HostPlace, SixteenWaitAtMost) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"}});
    SP_SKIP_UNLESS_HOST();
    ASSERT_SP_OK(sp_init());
    for (size_t k = 0; k <= 16; k++)
        ASSERT_SP_OK(sp_x_host_place(0, 20 * MiB, k * 32 * MiB));
    std::vector<void *> got(17);
    for (auto &p : got)
        ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &p));
    for (size_t k = 1; k < 16; k++)
        EXPECT_EQ(addr(got[k]) - addr(got[0]), k * 32 * MiB);
    EXPECT_LT(addr(got[16]), addr(got[0]));
    for (void *p : got)
        ASSERT_SP_OK(sp_free(p));
}

// An offset that is not a multiple of 512 would start device memory unaligned: refused, and
// nothing waits (the next segment of that size is carved as without placement).
TEST_F(HostPlace, UnalignedOffsetIsRefusedAndChangesNothing) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"}});
    SP_SKIP_UNLESS_HOST();
    ASSERT_SP_OK(sp_init());
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_x_host_place(0, 20 * MiB, 0));
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &a));
    EXPECT_SP_STATUS(sp_x_host_place(0, 20 * MiB, 100 * MiB + 100), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("not a multiple of 512"), std::string::npos)
        << sp_last_error();
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &b));
    EXPECT_LT(addr(b), addr(a)) << "the refused placement was taken";
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
}

// Without the arena (or on another backend) there is nothing to place in: refused, and the
// segment is made as before; an unknown device is an argument error.
TEST_F(HostPlace, RefusedWithoutTheArena) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "0"}});
    ASSERT_SP_OK(sp_init());
    EXPECT_SP_STATUS(sp_x_host_place(0, 20 * MiB, 0), SP_ERR_NOT_SUPPORTED);
    if (sp::on_gpu()) {
        EXPECT_NE(std::string(sp_last_error()).find("the host backend's"), std::string::npos)
            << sp_last_error();
        return;
    }
    EXPECT_NE(std::string(sp_last_error()).find("SYMPOOL_HOST_ARENA"), std::string::npos)
        << sp_last_error();
    EXPECT_SP_STATUS(sp_x_host_place(sp_device_count(), 0, 0), SP_ERR_INVALID_ARGUMENT);
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
}

} // namespace
