// test_alloc_events.cc: cross-stream frees. A block used on another stream (sp_record_stream)
// drops allocation/allocated_bytes at free, but stays active and is not reused until that stream
// has passed the free (host: until it is synchronized); the check runs at the next malloc.
// empty_cache and the OOM retry synchronize pending events.
#include "alloc_test_util.hpp"
#include "sympool/experimental.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

extern "C" {
#include "pool/pool.h"
}

using namespace sp;

class AllocEvents : public sp::Test {};

TEST_F(AllocEvents, ReuseWaitsForTheOtherStream) {
    SP_SKIP_ON_GPU("host stream model: on a GPU an idle stream's event completes at once");
    sp_stream_t other;
    ASSERT_SP_OK(sp_stream_create(0, &other));
    void *p, *q, *r;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    ASSERT_SP_OK(sp_record_stream(p, other));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
    EXPECT_EQ(stat("active.all.current"), 1) << "the free is pending";
    EXPECT_EQ(stat("active_bytes.all.current"), 4096);
    EXPECT_EQ(stat("requested_bytes.all.current"), 4096);
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &q));
    EXPECT_NE(q, p) << "the block is reused before the other stream passed the free";
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_stream_synchronize(nullptr)); // the default stream: not the one in use
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &q));
    EXPECT_NE(q, p);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_stream_synchronize(other));
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &r));
    EXPECT_EQ(r, p) << "after the sync the block is free again (and merged back)";
    EXPECT_EQ(stat("active.all.current"), 1);
    EXPECT_EQ(stat("num_sync_all_streams"), 0) << "process_events only queries";
    ASSERT_SP_OK(sp_free(r));
    EXPECT_EQ(stat("inactive_split.all.current"), 0);
    ASSERT_SP_OK(sp_stream_destroy(other));
}

TEST_F(AllocEvents, UseOnTheAllocationStreamIsIgnored) {
    sp_stream_t s;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    void *p, *q;
    ASSERT_SP_OK(sp_malloc(4096, 0, s, &p));
    ASSERT_SP_OK(sp_record_stream(p, s));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("active.all.current"), 0);
    ASSERT_SP_OK(sp_malloc(4096, 0, s, &q));
    EXPECT_EQ(p, q);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_stream_destroy(s));
}

TEST_F(AllocEvents, EmptyCacheSynchronizesPendingFrees) {
    SP_SKIP_ON_GPU("host stream model: on a GPU an idle stream's event completes at once");
    sp_stream_t a, b;
    ASSERT_SP_OK(sp_stream_create(0, &a));
    ASSERT_SP_OK(sp_stream_create(0, &b));
    void *p;
    ASSERT_SP_OK(sp_malloc(MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_record_stream(p, a));
    ASSERT_SP_OK(sp_record_stream(p, b));
    ASSERT_SP_OK(sp_record_stream(p, a)); // recorded once
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("active.all.current"), 1);
    ASSERT_SP_OK(sp_stream_synchronize(a)); // b still holds it
    void *q;
    ASSERT_SP_OK(sp_malloc(MiB, 0, nullptr, &q));
    EXPECT_NE(p, q);
    EXPECT_EQ(stat("active.all.current"), 2);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("active.all.current"), 0);
    EXPECT_EQ(stat("num_sync_all_streams"), 1);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
    ASSERT_SP_OK(sp_stream_destroy(a));
    ASSERT_SP_OK(sp_stream_destroy(b));
}

TEST_F(AllocEvents, RecordStreamMisuse) {
    expect_warnings();
    int local;
    sp_stream_t s;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    EXPECT_SP_STATUS(sp_record_stream(&local, s), SP_ERR_INVALID_USAGE);
    void *p;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
    // Only the host backend can tell a non-stream: CUDA dereferences any handle it is given
    // (undefined behaviour; a GPU crashes), so on cuda the caller guarantees a live stream.
    if (!sp::on_gpu()) {
        EXPECT_SP_STATUS(sp_record_stream(p, (sp_stream_t)&local), SP_ERR_INVALID_ARGUMENT);
    }
    ASSERT_SP_OK(sp_free(p));
    EXPECT_SP_STATUS(sp_record_stream(p, s), SP_ERR_INVALID_USAGE); // freed block
    ASSERT_SP_OK(sp_stream_destroy(s));
    EXPECT_SP_STATUS(sp_stream_destroy(nullptr), SP_ERR_INVALID_ARGUMENT);
}

// active/active_bytes follow allocation/allocated_bytes field for field until a free waits for
// events, then stay up (current and peak) while the free is pending, and follow again once the
// pairs are equal after a peak reset. Every field of both pairs is checked at each step.
static void expect_pair(const char *arr, const char *other, int64_t cur, int64_t peak,
                        int64_t alloc, int64_t freed, const char *when) {
    const char *types[] = {"all", "small_pool"};
    for (const char *t : types) {
        std::string k = std::string(arr) + "." + t + ".";
        EXPECT_EQ(stat((k + "current").c_str()), cur) << k << when;
        EXPECT_EQ(stat((k + "peak").c_str()), peak) << k << when;
        EXPECT_EQ(stat((k + "allocated").c_str()), alloc) << k << when;
        EXPECT_EQ(stat((k + "freed").c_str()), freed) << k << when;
        EXPECT_EQ(stat((std::string(other) + "." + t + ".allocated").c_str()), alloc) << when;
    }
}

TEST_F(AllocEvents, ActiveFollowsAllocationExceptWhileAFreeWaits) {
    SP_SKIP_ON_GPU("host stream model: on a GPU an idle stream's event completes at once");
    sp_stream_t other;
    ASSERT_SP_OK(sp_stream_create(0, &other));
    void *p, *q, *r, *s;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &q));
    expect_pair("active", "allocation", 2, 2, 2, 0, " (two blocks)");
    expect_pair("allocation", "active", 2, 2, 2, 0, " (two blocks)");
    expect_pair("active_bytes", "allocated_bytes", 8192, 8192, 8192, 0, " (two blocks)");
    ASSERT_SP_OK(sp_record_stream(p, other));
    ASSERT_SP_OK(sp_free(p)); // pending
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &r));
    expect_pair("active", "allocation", 3, 3, 3, 0, " (one pending)");
    expect_pair("allocation", "active", 2, 2, 3, 1, " (one pending)");
    expect_pair("active_bytes", "allocated_bytes", 12288, 12288, 12288, 0, " (one pending)");
    expect_pair("allocated_bytes", "active_bytes", 8192, 8192, 12288, 4096, " (one pending)");
    ASSERT_SP_OK(sp_free(r));
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_stream_synchronize(other));
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &s)); // completes the pending free first
    expect_pair("active", "allocation", 1, 3, 4, 3, " (after the wait)");
    expect_pair("allocation", "active", 1, 2, 4, 3, " (after the wait)");
    ASSERT_SP_OK(sp_free(s));
    ASSERT_SP_OK(sp_reset_peak_memory_stats(0));
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &q));
    ASSERT_SP_OK(sp_free(q));
    expect_pair("active", "allocation", 1, 2, 6, 5, " (after the peak reset)");
    expect_pair("allocation", "active", 1, 2, 6, 5, " (after the peak reset)");
    expect_pair("active_bytes", "allocated_bytes", 4096, 8192, 24576, 20480,
                " (after the peak reset)");
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_reset_accumulated_memory_stats(0));
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    expect_pair("active", "allocation", 1, 2, 1, 0, " (after the accumulated reset)");
    expect_pair("allocation", "active", 1, 2, 1, 0, " (after the accumulated reset)");
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_stream_destroy(other));
}

// The segment walk (snapshots) names each block's state: a free that waits for another stream is
// "pending" with its requested size while its neighbours are inactive, and inactive once the
// wait is over; blocks that were free before and after read inactive, with PyTorch's requested
// size for them (the freed block's, kept by the block it merged into).
namespace {
struct BlockSeen {
    uintptr_t address;
    size_t requested;
    sp_block_state_t state;
};
void collect(const sp_segment_view_t *s, void *arg) {
    auto *out = static_cast<std::vector<BlockSeen> *>(arg);
    for (size_t i = 0; i < s->nblocks; i++)
        out->push_back({s->blocks[i].address, s->blocks[i].requested_size, s->blocks[i].state});
}
std::vector<BlockSeen> walk() {
    std::vector<BlockSeen> v;
    EXPECT_EQ(sp__pool_walk(0, nullptr, collect, &v), SP_SUCCESS);
    return v;
}
} // namespace

TEST_F(AllocEvents, WalkShowsAPendingFreeAndItsEnd) {
    SP_SKIP_ON_GPU("host stream model: on a GPU an idle stream's event completes at once");
    sp_stream_t other;
    ASSERT_SP_OK(sp_stream_create(0, &other));
    void *p, *q, *r;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &p));
    ASSERT_SP_OK(sp_malloc(3000, 0, nullptr, &q));
    ASSERT_SP_OK(sp_malloc(5000, 0, nullptr, &r));
    ASSERT_SP_OK(sp_free(p)); // free before: inactive
    ASSERT_SP_OK(sp_record_stream(q, other));
    ASSERT_SP_OK(sp_free(q)); // pending
    auto v = walk();
    ASSERT_EQ(v.size(), 4u); // p, q, r, the rest of the segment
    EXPECT_EQ(v[0].state, SP_BLOCK_INACTIVE);
    EXPECT_EQ(v[0].requested, 1000u);
    EXPECT_EQ(v[1].address, (uintptr_t)q);
    EXPECT_EQ(v[1].state, SP_BLOCK_ACTIVE_PENDING_FREE);
    EXPECT_EQ(v[1].requested, 3000u);
    EXPECT_EQ(v[2].state, SP_BLOCK_ACTIVE_ALLOCATED);
    EXPECT_EQ(v[2].requested, 5000u);
    EXPECT_EQ(v[3].state, SP_BLOCK_INACTIVE);
    ASSERT_SP_OK(sp_stream_synchronize(other));
    void *s;
    ASSERT_SP_OK(sp_malloc(100 << 10, 0, nullptr, &s)); // completes the pending free first
    ASSERT_SP_OK(sp_free(s));
    v = walk();
    ASSERT_EQ(v.size(), 3u) << "p and q merged once q's free completed";
    EXPECT_EQ(v[0].state, SP_BLOCK_INACTIVE);
    EXPECT_EQ(v[0].requested, 3000u) << "q's free merged into p's block";
    EXPECT_EQ(v[1].address, (uintptr_t)r);
    EXPECT_EQ(v[1].state, SP_BLOCK_ACTIVE_ALLOCATED);
    EXPECT_EQ(v[2].state, SP_BLOCK_INACTIVE);
    EXPECT_EQ(v[2].requested, 100u << 10) << "s's free merged into the rest";
    ASSERT_SP_OK(sp_free(r));
    ASSERT_SP_OK(sp_stream_destroy(other));
}

// Frees recorded on many streams (more than the queues' index starts with, so it grows, and
// is rebuilt as streams' queues empty and go): each block's free completes exactly when the
// last of its streams is synchronized, not earlier and not later (an event filed under another
// stream's queue would wait behind that stream's), and queues made after others were dropped
// are found again.
TEST_F(AllocEvents, FreesRecordedOnManyStreamsCompleteWithTheirOwnStreams) {
    SP_SKIP_ON_GPU("host stream model: on a GPU an idle stream's event completes at once");
    const int n = 100;
    std::vector<sp_stream_t> s(n);
    for (auto &x : s)
        ASSERT_SP_OK(sp_stream_create(0, &x));
    // `all` is used on every stream, block i on stream i alone.
    void *all = nullptr;
    std::vector<void *> one(n);
    ASSERT_SP_OK(sp_malloc(8192, 0, nullptr, &all));
    for (auto &p : one)
        ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    for (int i = 0; i < n; i++) {
        ASSERT_SP_OK(sp_record_stream(all, s[i]));
        ASSERT_SP_OK(sp_record_stream(one[i], s[i]));
    }
    ASSERT_SP_OK(sp_free(all));
    for (auto p : one)
        ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("active.all.current"), n + 1);
    auto settle = [] { // a malloc completes the frees whose events are done
        void *x = nullptr;
        ASSERT_SP_OK(sp_malloc(1 << 16, 0, nullptr, &x));
        ASSERT_SP_OK(sp_free(x));
    };
    // Synchronize the streams in a scrambled order (37 is prime to 100).
    for (int k = 0; k < n; k++) {
        int i = (k * 37 + 11) % n;
        ASSERT_SP_OK(sp_stream_synchronize(s[i]));
        settle();
        EXPECT_EQ(stat("active.all.current"), k + 1 < n ? n - k : 0)
            << "after stream " << i << ", the " << k + 1 << "th synchronized";
        // Half way, new frees on streams whose queues have emptied and gone.
        if (k == n / 2) {
            void *again = nullptr;
            ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &again));
            ASSERT_SP_OK(sp_record_stream(again, s[i]));
            ASSERT_SP_OK(sp_free(again));
            settle();
            EXPECT_EQ(stat("active.all.current"), n - k + 1) << "a new free on stream " << i;
            ASSERT_SP_OK(sp_stream_synchronize(s[i]));
            settle();
            EXPECT_EQ(stat("active.all.current"), n - k);
        }
    }
    for (auto x : s)
        ASSERT_SP_OK(sp_stream_destroy(x));
}

// sp_x_free_block_set_requested is for a free cached block's start only: every other address
// (NULL, one outside every segment, inside a free block, an allocated block, a free that still
// waits for another stream, the unmapped rest of an expandable segment) gets
// SP_ERR_INVALID_USAGE with a message naming the call, and no block's requested size changes.
namespace {
void expect_refused(void *p) {
    EXPECT_SP_STATUS(sp_x_free_block_set_requested(p, 77), SP_ERR_INVALID_USAGE);
    std::string msg = sp_last_error();
    EXPECT_EQ(msg.rfind("sp_x_free_block_set_requested(", 0), 0u) << msg;
    EXPECT_NE(msg.find("no free cached block starts there"), std::string::npos) << msg;
}
bool same_blocks(const std::vector<BlockSeen> &a, const std::vector<BlockSeen> &b) {
    if (a.size() != b.size())
        return false;
    for (size_t i = 0; i < a.size(); i++)
        if (a[i].address != b[i].address || a[i].requested != b[i].requested ||
            a[i].state != b[i].state)
            return false;
    return true;
}
} // namespace

TEST_F(AllocEvents, FreeBlockSetRequestedRefusesAllButAFreeCachedBlocksStart) {
    SP_SKIP_ON_GPU("host stream model: on a GPU an idle stream's event completes at once");
    sp_stream_t other;
    ASSERT_SP_OK(sp_stream_create(0, &other));
    void *a, *q;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &a)); // [0, 1024)
    ASSERT_SP_OK(sp_malloc(3000, 0, nullptr, &q)); // [1024, 4096), the rest free after it
    ASSERT_SP_OK(sp_record_stream(q, other));
    ASSERT_SP_OK(sp_free(q)); // pending until `other` is synchronized
    char *rest = (char *)q + 3072;
    auto before = walk();
    ASSERT_EQ(before.size(), 3u);
    ASSERT_EQ(before[1].state, SP_BLOCK_ACTIVE_PENDING_FREE);
    int x = 0;
    expect_refused(nullptr);
    expect_refused(&x);
    expect_refused(rest + 512);
    expect_refused(a);
    expect_refused(q);
    EXPECT_TRUE(same_blocks(before, walk())) << "a refused call changed a block";
    ASSERT_SP_OK(sp_x_free_block_set_requested(rest, 77)); // the free block's start: taken
    auto after = walk();
    ASSERT_EQ(after.size(), 3u);
    EXPECT_EQ(after[2].requested, 77u);
    ASSERT_SP_OK(sp_stream_synchronize(other));
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_stream_destroy(other));
}

TEST_F(AllocEvents, FreeBlockSetRequestedRefusesAnUnmappedRange) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       {"SYMPOOL_EXPANDABLE_PAGE", "0"},
                       {"SYMPOOL_EXPANDABLE_RECYCLE", "0"},
                       {"SYMPOOL_EXPANDABLE_BORROW", "0"}});
    SP_SKIP_UNLESS_HOST();
    const size_t MiB = (size_t)1 << 20;
    void *a;
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &a)); // maps 2 pages of 20 MiB, the rest not
    auto before = walk();
    expect_refused((char *)a + 40 * MiB); // the start of the unmapped rest
    EXPECT_TRUE(same_blocks(before, walk()));
    ASSERT_SP_OK(sp_x_free_block_set_requested((char *)a + 30 * MiB, 5)); // the mapped free end
    ASSERT_SP_OK(sp_free(a));
}

// Before the first call and after sp_shutdown the call initializes as every call does, and
// refuses an address it has no block for with the same status and message.
TEST_F(AllocEvents, FreeBlockSetRequestedBeforeInitAndAfterShutdown) {
    ASSERT_SP_OK(sp_shutdown());
    int x = 0;
    expect_refused(&x);
    void *p;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_shutdown());
    expect_refused(p); // its segment went with the shutdown
}

// Devices' address ranges may interleave (the host backend without an arena maps each segment
// where mmap puts it; CUDA's virtual address reservations too): a free block of device 1 whose
// address lies inside device 0's range is found as sp_lookup finds it, not refused.
TEST_F(AllocEvents, FreeBlockSetRequestedFindsABlockInsideAnotherDevicesRange) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "2"}, {"SYMPOOL_HOST_ARENA", "0"}});
    SP_SKIP_UNLESS_HOST();
    // Full 2 MiB segments (two 1 MiB blocks each) on devices 0, 1, 0, 1, ...: mmap places
    // them next to each other, so one of device 1's lies between two of device 0's.
    std::vector<void *> d0, d1;
    size_t inside = SIZE_MAX;
    for (int i = 0; i < 8 && inside == SIZE_MAX; i++) {
        void *p;
        for (int k = 0; k < 2; k++) {
            ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
            d0.push_back(p);
        }
        for (int k = 0; k < 2; k++) {
            ASSERT_SP_OK(sp_malloc(1 << 20, 1, nullptr, &p));
            d1.push_back(p);
        }
        uintptr_t lo = UINTPTR_MAX, hi = 0;
        for (void *b : d0) {
            lo = std::min(lo, (uintptr_t)b);
            hi = std::max(hi, (uintptr_t)b);
        }
        for (size_t j = 0; j < d1.size(); j++)
            if ((uintptr_t)d1[j] > lo && (uintptr_t)d1[j] < hi)
                inside = j;
    }
    ASSERT_NE(inside, SIZE_MAX) << "no segment of device 1 between two of device 0's";
    char *rest = (char *)d1[inside];
    ASSERT_SP_OK(sp_free(rest)); // a free block of device 1, with an allocated neighbour
    d1.erase(d1.begin() + (ptrdiff_t)inside);
    EXPECT_EQ(sp_x_free_block_set_requested(rest, 77), SP_SUCCESS) << sp_last_error();
    std::vector<BlockSeen> v;
    ASSERT_SP_OK(sp__pool_walk(1, nullptr, collect, &v));
    bool seen = false;
    for (auto &b : v)
        if (b.address == (uintptr_t)rest) {
            seen = true;
            EXPECT_EQ(b.requested, 77u);
        }
    EXPECT_TRUE(seen);
    for (void *b : d0)
        ASSERT_SP_OK(sp_free(b));
    for (void *b : d1)
        ASSERT_SP_OK(sp_free(b));
}
