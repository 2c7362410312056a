// test_lookup.cc: sp__pool_lookup (interior pointers through the per-segment block index, block
// starts through the pointer map) stays right while blocks split and merge under it, and
// sp_torch_free's single locked lookup frees only block starts; the segment index answers
// right across segments given back (its tombstones) and segments made over their place.
#include "sp_test.hpp"

#include <sys/mman.h>

#include <vector>

#include <sympool/mempool.h>

extern "C" {
#include "pool/pool.h"
}

using namespace sp;

class Lookup : public sp::Test {};

TEST_F(Lookup, InteriorPointersFollowSplitsAndMerges) {
    std::vector<void *> b(4000);
    for (auto &p : b)
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p)); // one 2 MiB segment, 4000 blocks
    auto check = [&](const char *when) {
        for (size_t i = 0; i < b.size(); i++) {
            if (!b[i])
                continue;
            sp_block_info_t info;
            ASSERT_EQ(sp__pool_lookup((char *)b[i] + 100, &info), SP_SUCCESS)
                << when << " block " << i;
            ASSERT_EQ(info.block_base, b[i]) << when << " block " << i;
            ASSERT_SP_OK(sp__pool_lookup(b[i], &info));
            ASSERT_EQ(info.block_base, b[i]);
        }
    };
    check("first");
    // Free every other block, then merge runs of them, then split them again with other sizes:
    // the index built above goes stale, and every answer must still be right.
    for (size_t i = 0; i < b.size(); i += 2) {
        void *p = b[i];
        b[i] = nullptr;
        ASSERT_SP_OK(sp_free(p));
        sp_block_info_t info;
        EXPECT_SP_STATUS(sp__pool_lookup((char *)p + 8, &info), SP_ERR_INVALID_USAGE);
    }
    check("after frees");
    for (size_t i = 1; i < 2000; i += 2) {
        ASSERT_SP_OK(sp_free(b[i]));
        b[i] = nullptr;
    }
    check("after merges");
    for (size_t i = 0; i < 1000; i++)
        ASSERT_SP_OK(sp_malloc(1024, 0, nullptr, &b[2 * i]));
    check("after new splits");
    for (auto p : b)
        if (p)
            ASSERT_SP_OK(sp_free(p));
}

TEST_F(Lookup, TorchFreeChecksInOneLookupAndFreesOnlyStarts) {
    expect_warnings();
    // sp_malloc: sp_torch_malloc refuses the host backend (its memory is not device memory).
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    sp_torch_free((char *)p + 512, 4096, 0, nullptr); // interior: explained, nothing freed
    EXPECT_EQ(stat("allocation.all.current"), 1);
    EXPECT_GE(warnings("inside"), 1u);
    size_t w = warnings();
    sp_torch_free(p, 4096, 0, nullptr);
    EXPECT_EQ(warnings(), w) << "a matching free does not warn";
    EXPECT_EQ(stat("allocation.all.current"), 0);
}

TEST_F(Lookup, TorchFreeWithWrongDeviceStillFrees) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "2"}});
    SP_SKIP_UNLESS_HOST();
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 1, nullptr, &p)); // sp_torch_malloc refuses the host backend
    sp_torch_free(p, 4096, 0, nullptr);
    EXPECT_GE(warnings("on device 1"), 1u);
    EXPECT_EQ(stat("allocation.all.current", 1), 0);
}

namespace {
// A pool allocator that hands out the offsets it is told, inside an address range of its own
// that nothing touches (sympool never touches a segment's memory on the host).
struct Scripted {
    char *base = nullptr;
    std::vector<size_t> next; // offsets to hand out, first at the back
    size_t freed = 0;
    static void *alloc(size_t, int, sp_stream_t, void *ctx) {
        auto *s = static_cast<Scripted *>(ctx);
        if (s->next.empty())
            return nullptr;
        size_t off = s->next.back();
        s->next.pop_back();
        return s->base + off;
    }
    static void free(void *, size_t, int, sp_stream_t, void *ctx) {
        static_cast<Scripted *>(ctx)->freed++;
    }
};

bool found_at(const void *p, const void *base) {
    sp_block_info_t info;
    return sp__pool_lookup(p, &info) == SP_SUCCESS && info.block_base == base;
}
} // namespace

// Segments given back leave their place in the index empty: no lookup finds them, and a
// segment made later over the place of several of them (its range covering their starts) is
// found everywhere inside it, while a range next to a live segment still counts as taken.
TEST_F(Lookup, SegmentsGivenBackAreNotFoundAndThoseMadeOverThemAre) {
    expect_warnings();
    SP_SKIP_UNLESS_HOST();                      // the pools' segments are host addresses
    const size_t MiB = 1 << 20, seg = 10 * MiB; // 10 MiB requests get segments of their own
    Scripted sc;
    void *region =
        mmap(nullptr, 128 * MiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(region, MAP_FAILED);
    sc.base = static_cast<char *>(region);
    sp_allocator_t a = {Scripted::alloc, Scripted::free, &sc};
    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    params.allocator = &a;
    // A private pool's free segments go back when it is destroyed (as in PyTorch, empty_cache
    // keeps those of a pool in use): `gone` makes four side by side at 0, 10, 20 and 30 MiB and
    // is destroyed; `kept` holds one at 80 MiB throughout.
    sp_mempool_t *gone = nullptr, *kept = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&params, &gone));
    ASSERT_SP_OK(sp_mempool_create(&params, &kept));
    sc.next = {80 * MiB};
    void *live = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(kept, seg, nullptr, &live));
    sc.next = {30 * MiB, 20 * MiB, 10 * MiB, 0};
    void *p[4];
    for (int i = 0; i < 4; i++) {
        ASSERT_SP_OK(sp_mempool_malloc(gone, seg, nullptr, &p[i]));
        ASSERT_EQ(p[i], sc.base + i * seg);
        EXPECT_TRUE(found_at(sc.base + i * seg + MiB, p[i]));
    }
    for (auto q : p)
        ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_mempool_destroy(gone));
    ASSERT_EQ(sc.freed, 4u);
    for (int i = 0; i < 4; i++)
        EXPECT_FALSE(found_at(sc.base + i * seg + MiB, p[i])) << "segment " << i << " went back";
    EXPECT_TRUE(found_at(sc.base + 85 * MiB, live));
    // One segment of 40 MiB over the four places.
    sc.next = {0};
    void *big = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(kept, 4 * seg, nullptr, &big));
    ASSERT_EQ(big, sc.base);
    for (size_t off : {(size_t)0, 5 * MiB, 10 * MiB, 25 * MiB, 40 * MiB - 1})
        EXPECT_TRUE(found_at(sc.base + off, big)) << "offset " << off;
    EXPECT_FALSE(found_at(sc.base + 40 * MiB, big));
    EXPECT_TRUE(found_at(sc.base + 80 * MiB, live));
    // A segment overlapping the live one at 80 MiB is refused (and given back); one over the
    // start of the 40 MiB segment's place (a place given back by then: its pool is destroyed
    // below with it free) is taken.
    sc.next = {75 * MiB};
    void *q = nullptr;
    EXPECT_SP_STATUS(sp_mempool_malloc(kept, 2 * seg, nullptr, &q), SP_ERR_INVALID_USAGE);
    EXPECT_EQ(sc.freed, 5u);
    ASSERT_SP_OK(sp_free(big));
    ASSERT_SP_OK(sp_free(live));
    ASSERT_SP_OK(sp_mempool_destroy(kept));
    EXPECT_EQ(sc.freed, 7u);
    sp_mempool_t *again = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&params, &again));
    sc.next = {5 * MiB};
    ASSERT_SP_OK(sp_mempool_malloc(again, seg, nullptr, &q));
    EXPECT_EQ(q, sc.base + 5 * MiB);
    EXPECT_TRUE(found_at(sc.base + 14 * MiB, q));
    EXPECT_FALSE(found_at(sc.base + 4 * MiB, q));
    EXPECT_FALSE(found_at(sc.base + 85 * MiB, live));
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_mempool_destroy(again));
    munmap(region, 128 * MiB);
}

namespace {
void count_segment(const sp_segment_view_t *, void *arg) {
    ++*static_cast<size_t *>(arg);
}
} // namespace

// Many segments given back at once (sp_empty_cache), most of them but not all, then new ones
// made in their place: every live block is found, none given back is, and a walk sees exactly
// the live segments, through the index's sweeps of what was given back.
TEST_F(Lookup, AnEmptyCacheOfManySegmentsKeepsTheIndexRight) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"}, {"SYMPOOL_HOST_CAPACITY", "64GiB"}});
    const size_t seg = 12 << 20;
    std::vector<void *> b(400);
    for (auto &p : b)
        ASSERT_SP_OK(sp_malloc(seg, 0, nullptr, &p));
    for (int round = 0; round < 3; round++) {
        std::vector<void *> gone;
        for (size_t i = 0; i < b.size(); i++)
            if (i % 5 != (size_t)round) { // four of five given back
                gone.push_back(b[i]);
                ASSERT_SP_OK(sp_free(b[i]));
                b[i] = nullptr;
            }
        ASSERT_SP_OK(sp_empty_cache());
        size_t segs = 0;
        ASSERT_SP_OK(sp__pool_walk(0, sp_default_mempool(0), count_segment, &segs));
        EXPECT_EQ(segs, b.size() / 5) << "round " << round;
        for (void *p : b) {
            if (!p)
                continue;
            ASSERT_TRUE(found_at((char *)p + seg / 2, p)) << "round " << round;
        }
        for (void *g : gone) {
            sp_block_info_t info;
            ASSERT_EQ(sp__pool_lookup((char *)g + seg / 2, &info), SP_ERR_INVALID_USAGE);
        }
        // New segments, the arena's freed ranges taken again: where given-back ones were.
        for (auto &p : b) {
            if (p)
                continue;
            ASSERT_SP_OK(sp_malloc(seg, 0, nullptr, &p));
        }
        segs = 0;
        ASSERT_SP_OK(sp__pool_walk(0, sp_default_mempool(0), count_segment, &segs));
        EXPECT_EQ(segs, b.size());
        for (auto p : b)
            ASSERT_TRUE(found_at((char *)p + seg - 1, p));
    }
    for (auto p : b)
        ASSERT_SP_OK(sp_free(p));
}
