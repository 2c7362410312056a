// test_expandable.cc: expandable segments (pool/expandable.c) on the host backend, with PyTorch's
// behaviours: growth at the end of one segment per stream and pool kind, pages of 2 MiB (small)
// and 20 MiB (large), unmapping on empty_cache, the OOM retry unmapping another stream's free
// pages, stats (reserved_bytes, num_device_alloc/free, no segment count, no inactive_split) and
// trace entries (segment_map/segment_unmap), one snapshot segment per mapped range, OOM at
// capacity counting mapped pages, fault injection during a map, and the pools that keep fixed
// segments. Also the host backend's vmm_* ops themselves.
#include "alloc_test_util.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include "pool/device/device.h"
#include "pool/history.h"
#include "pool/block.h"
#include "pool/pool.h"
#include "sympool/experimental.h"
#include "tests/unit/expandable_probe.h"
}

using namespace sp;

// The tests that assert PyTorch's own rules (20 MiB large pages, holes kept mapped until a
// release, small requests in the small pool) switch our three defaults off.
// clang-format off
#define PYTORCH_PAGES                                                                              \
    {"SYMPOOL_EXPANDABLE_PAGE", "0"}, {"SYMPOOL_EXPANDABLE_RECYCLE", "0"},                         \
    {"SYMPOOL_EXPANDABLE_BORROW", "0"}
// clang-format on

namespace {

struct Range {
    uintptr_t address;
    size_t total;
    size_t allocated;
    bool expandable;
    size_t nblocks;
};

void visit(const sp_segment_view_t *v, void *arg) {
    auto *out = static_cast<std::vector<Range> *>(arg);
    out->push_back({v->address, v->total_size, v->allocated_size, v->is_expandable, v->nblocks});
}

std::vector<Range> walk(const sp_mempool_t *pool = nullptr) {
    std::vector<Range> r;
    EXPECT_EQ(sp__pool_walk(0, pool, visit, &r), SP_SUCCESS);
    return r;
}

std::vector<sp__trace_entry_t> trace() {
    sp__trace_entry_t *e = nullptr;
    size_t n = 0;
    EXPECT_EQ(sp__history_copy(0, &e, &n), SP_SUCCESS);
    std::vector<sp__trace_entry_t> out(e, e + n);
    sp__history_entries_free(e, n);
    return out;
}

void record_all() {
    sp_history_params_t p;
    sp_history_params_init(&p);
    p.enabled = SP_HISTORY_ALL;
    ASSERT_EQ(sp_record_memory_history(&p), SP_SUCCESS);
}

size_t count(const std::vector<sp__trace_entry_t> &t, sp_trace_action_t a) {
    size_t n = 0;
    for (auto &e : t)
        n += e.action == a;
    return n;
}

} // namespace

class Expandable : public sp::Test {};

TEST_F(Expandable, GrowsAtTheEndInWholePages) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, PYTORCH_PAGES});
    SP_SKIP_UNLESS_HOST();
    void *a, *b, *c;
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &a)); // maps 2 pages of 20 MiB
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(40 * MiB));
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &b)); // 10 MiB free + 1 more page, contiguous
    EXPECT_EQ((uintptr_t)b, (uintptr_t)a + 30 * MiB);
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(60 * MiB));
    EXPECT_EQ(stat("reserved_bytes.large_pool.current"), (int64_t)(60 * MiB));
    EXPECT_EQ(stat("num_device_alloc"), 2);
    EXPECT_EQ(stat("segment.all.current"), 0);     // maps are not segments (PyTorch)
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &c)); // the small pool: its own segment, 2 MiB page
    EXPECT_EQ(stat("reserved_bytes.small_pool.current"), (int64_t)(2 * MiB));
    // Splits keep no slack (512 B rule) and never count as inactive_split.
    EXPECT_EQ(stat("allocated_bytes.all.current"), (int64_t)(60 * MiB + 1024));
    EXPECT_EQ(stat("inactive_split.all.current"), 0);
    EXPECT_EQ(stat("inactive_split_bytes.all.current"), 0);
    auto r = walk();
    ASSERT_EQ(r.size(), 2u);
    for (auto &x : r)
        EXPECT_TRUE(x.expandable);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_free(c));
    EXPECT_EQ(stat("inactive_split_bytes.all.current"), 0);
}

// A page past SYMPOOL_EXPANDABLE_PAGE's ceiling is refused at start-up (the default applies),
// instead of making every expandable allocation run out of memory.
TEST_F(Expandable, HugePageOptionFallsBackToTheDefault) {
    expect_warnings();
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_EXPANDABLE_PAGE", "1TiB"}});
    SP_SKIP_UNLESS_HOST();
    EXPECT_EQ(sp__option_int(SP_OPT_EXPANDABLE_PAGE), (int64_t)(2 * MiB));
    void *a;
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &a)); // two 2 MiB pages
    EXPECT_EQ(stat("reserved_bytes.large_pool.current"), (int64_t)(4 * MiB));
    ASSERT_SP_OK(sp_free(a));
}

TEST_F(Expandable, FreeBlockPlusUnmappedTailIsReusedBeforeMapping) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, PYTORCH_PAGES});
    SP_SKIP_UNLESS_HOST();
    void *a, *b;
    ASSERT_SP_OK(sp_malloc(60 * MiB, 0, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_malloc(70 * MiB, 0, nullptr, &b)); // 60 cached + 1 page at the end
    EXPECT_EQ(b, a);
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(80 * MiB));
    EXPECT_EQ(stat("num_alloc_retries"), 0);
    ASSERT_SP_OK(sp_free(b));
}

TEST_F(Expandable, EmptyCacheUnmapsFreePagesOnly) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, PYTORCH_PAGES});
    SP_SKIP_UNLESS_HOST();
    void *a, *b, *c;
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(50 * MiB, 0, nullptr, &b));
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &c)); // [0,30) [30,80) [80,100): 5 pages
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(100 * MiB));
    record_all();
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_empty_cache()); // pages [40,80) are wholly free; [30,40) keeps a's page
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(60 * MiB));
    EXPECT_EQ(stat("num_device_free"), 1);
    EXPECT_EQ(sp__host_live_bytes(0), 60 * MiB);
    auto t = trace();
    ASSERT_EQ(count(t, SP_TRACE_SEGMENT_UNMAP), 1u);
    for (auto &e : t)
        if (e.action == SP_TRACE_SEGMENT_UNMAP) {
            EXPECT_EQ(e.addr, (uintptr_t)a + 40 * MiB);
            EXPECT_EQ(e.size, 40 * MiB);
        }
    // The snapshot shows the two mapped ranges as two segments, blocks tiling each.
    auto r = walk();
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r[0].address, (uintptr_t)a);
    EXPECT_EQ(r[0].total, 40 * MiB);
    EXPECT_EQ(r[0].nblocks, 2u); // a and the 10 MiB sliver
    EXPECT_EQ(r[1].address, (uintptr_t)c);
    EXPECT_EQ(r[1].total, 20 * MiB);
    // A new request fills the hole at the lowest address (PyTorch's rule), not the end.
    void *d;
    ASSERT_SP_OK(sp_malloc(45 * MiB, 0, nullptr, &d));
    EXPECT_EQ((uintptr_t)d, (uintptr_t)a + 30 * MiB);
    EXPECT_EQ(walk().size(), 1u);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(c));
    ASSERT_SP_OK(sp_free(d));
    ASSERT_SP_OK(sp_empty_cache()); // everything unmapped: the reservation goes too
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
    EXPECT_EQ(sp__host_live_allocations(0), 0u);
    EXPECT_EQ(sp__host_live_bytes(0), 0u);
    EXPECT_TRUE(walk().empty());
    t = trace();
    EXPECT_EQ(count(t, SP_TRACE_SEGMENT_ALLOC), 0u);
    EXPECT_EQ(count(t, SP_TRACE_SEGMENT_FREE), 0u);
    EXPECT_GE(count(t, SP_TRACE_SEGMENT_MAP), 1u);
}

// empty_cache unmaps an expandable segment's free blocks in PyTorch's release_blocks order: the
// pool's free set's (stream, size, address), as it releases whole segments, not by address.
// Free blocks of 40 MiB at [0,40) and 20 MiB at [60,80): the 20 MiB one is unmapped first.
TEST_F(Expandable, EmptyCacheUnmapsInFreeSetOrder) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, PYTORCH_PAGES});
    SP_SKIP_UNLESS_HOST();
    void *a, *b, *c, *d;
    ASSERT_SP_OK(sp_malloc(40 * MiB, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &b));
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &c));
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &d)); // [0,40) [40,60) [60,80) [80,100)
    ASSERT_EQ((uintptr_t)c, (uintptr_t)a + 60 * MiB);
    record_all();
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(c));
    ASSERT_SP_OK(sp_empty_cache());
    std::vector<std::pair<uintptr_t, size_t>> unmaps;
    for (auto &e : trace())
        if (e.action == SP_TRACE_SEGMENT_UNMAP)
            unmaps.push_back({e.addr - (uintptr_t)a, e.size});
    EXPECT_EQ(unmaps,
              (std::vector<std::pair<uintptr_t, size_t>>{{60 * MiB, 20 * MiB}, {0, 40 * MiB}}));
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(40 * MiB));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_free(d));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST_F(Expandable, OneSegmentPerStreamAndPoolKind) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, PYTORCH_PAGES});
    SP_SKIP_UNLESS_HOST();
    sp_stream_t s1, s2;
    ASSERT_SP_OK(sp_stream_create(0, &s1));
    ASSERT_SP_OK(sp_stream_create(0, &s2));
    void *a, *b, *c, *d;
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, s1, &a));
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, s2, &b));
    ASSERT_SP_OK(sp_malloc(5 * MiB, 0, s1, &c)); // s1's segment again, right after a
    ASSERT_SP_OK(sp_malloc(4096, 0, s1, &d));    // s1's small segment
    EXPECT_EQ((uintptr_t)c, (uintptr_t)a + 30 * MiB);
    EXPECT_EQ(sp__host_live_allocations(0), 3u); // three reservations
    EXPECT_EQ(walk().size(), 3u);
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(40 * MiB + 40 * MiB + 2 * MiB));
    for (void *p : {a, b, c, d})
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp__host_live_allocations(0), 0u);
    ASSERT_SP_OK(sp_stream_destroy(s1));
    ASSERT_SP_OK(sp_stream_destroy(s2));
}

TEST_F(Expandable, OomAtCapacityCountsMappedPages) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       PYTORCH_PAGES,
                       {"SYMPOOL_HOST_CAPACITY", "100MiB"}});
    SP_SKIP_UNLESS_HOST();
    void *a, *b = nullptr;
    ASSERT_SP_OK(sp_malloc(60 * MiB, 0, nullptr, &a));
    size_t fr = 0, tot = 0;
    ASSERT_SP_OK(sp_get_memory_info(0, &fr, &tot));
    EXPECT_EQ(fr, 40 * MiB); // the address space reserved costs nothing
    EXPECT_SP_STATUS(sp_malloc(50 * MiB, 0, nullptr, &b), SP_ERR_OUT_OF_MEMORY); // 3 pages
    EXPECT_EQ(b, nullptr);
    EXPECT_EQ(stat("num_ooms"), 1);
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(60 * MiB));
    ASSERT_SP_OK(sp_malloc(40 * MiB, 0, nullptr, &b)); // exactly at capacity
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(100 * MiB));
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
}

TEST_F(Expandable, OomRetryUnmapsAnotherStreamsFreePages) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       PYTORCH_PAGES,
                       {"SYMPOOL_HOST_CAPACITY", "100MiB"}});
    SP_SKIP_UNLESS_HOST();
    sp_stream_t s1, s2;
    ASSERT_SP_OK(sp_stream_create(0, &s1));
    ASSERT_SP_OK(sp_stream_create(0, &s2));
    void *a, *b;
    ASSERT_SP_OK(sp_malloc(60 * MiB, 0, s1, &a));
    ASSERT_SP_OK(sp_free(a)); // 60 MiB mapped and cached on s1
    ASSERT_SP_OK(sp_malloc(60 * MiB, 0, s2, &b));
    EXPECT_EQ(stat("num_alloc_retries"), 1);
    EXPECT_EQ(stat("num_device_free"), 1); // s1's pages, unmapped by the release
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(60 * MiB));
    EXPECT_EQ(sp__host_live_allocations(0), 1u); // s1's reservation went with its last page
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_stream_destroy(s1));
    ASSERT_SP_OK(sp_stream_destroy(s2));
}

TEST_F(Expandable, FaultInjectionDuringMapTakesTheRetryPath) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       PYTORCH_PAGES,
                       {"SYMPOOL_HOST_FAIL_AFTER", "2"}});
    SP_SKIP_UNLESS_HOST();
    void *a, *b;
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &a)); // map call 1
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &b)); // map call 2 fails, retry maps (call 3)
    EXPECT_EQ(stat("num_alloc_retries"), 1);
    EXPECT_EQ(stat("num_ooms"), 0);
    EXPECT_EQ(stat("num_device_alloc"), 2);
    EXPECT_EQ((uintptr_t)b, (uintptr_t)a + 30 * MiB);
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(60 * MiB));
    EXPECT_EQ(sp__host_live_bytes(0), 60 * MiB);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
}

TEST_F(Expandable, SnapshotFilesCarryMapsAndExpandableSegments) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, PYTORCH_PAGES});
    SP_SKIP_UNLESS_HOST();
    record_all();
    void *a, *b;
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &b));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_empty_cache());
    char path[] = "/tmp/sp_exp_XXXXXX.json";
    int fd = mkstemps(path, 5);
    ASSERT_GE(fd, 0);
    close(fd);
    ASSERT_SP_OK(sp_dump_snapshot(path));
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string j = ss.str();
    std::remove(path);
    EXPECT_NE(j.find("\"is_expandable\":true"), std::string::npos) << j.substr(0, 400);
    EXPECT_NE(j.find("\"segment_map\""), std::string::npos);
    EXPECT_NE(j.find("\"segment_unmap\""), std::string::npos);
    EXPECT_EQ(j.find("\"segment_alloc\""), std::string::npos);
    EXPECT_NE(j.find("\"expandable_segments\":true"), std::string::npos);
    ASSERT_SP_OK(sp_free(a));
}

TEST_F(Expandable, PluggablePoolsKeepFixedSegmentsAndSaySo) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       PYTORCH_PAGES,
                       {"SYMPOOL_DEBUG", "INFO"}});
    SP_SKIP_UNLESS_HOST();
    static size_t live = 0;
    sp_allocator_t al;
    al.alloc = [](size_t size, int, sp_stream_t, void *) -> void * {
        live += size;
        return aligned_alloc(4096, size);
    };
    al.free = [](void *p, size_t size, int, sp_stream_t, void *) {
        live -= size;
        free(p);
    };
    al.ctx = nullptr;
    sp_mempool_params_t pp;
    sp_mempool_params_init(&pp);
    pp.allocator = &al;
    pp.name = "custom";
    sp_mempool_t *custom = nullptr, *plain = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&pp, &custom));
    EXPECT_EQ(log_.count(SP_LOG_INFO, "keeps fixed segments"), 1u);
    sp_mempool_params_init(&pp);
    ASSERT_SP_OK(sp_mempool_create(&pp, &plain));
    void *a, *b;
    ASSERT_SP_OK(sp_mempool_malloc(custom, 30 * MiB, nullptr, &a));
    ASSERT_SP_OK(sp_mempool_malloc(plain, 30 * MiB, nullptr, &b));
    auto rc = walk(custom), rp = walk(plain);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_FALSE(rc[0].expandable);
    EXPECT_EQ(rc[0].total, 30 * MiB); // a fixed segment of PyTorch's size
    EXPECT_EQ(live, 30 * MiB);
    ASSERT_EQ(rp.size(), 1u);
    EXPECT_TRUE(rp[0].expandable);
    EXPECT_EQ(rp[0].total, 40 * MiB);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_mempool_destroy(custom));
    ASSERT_SP_OK(sp_mempool_destroy(plain));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(live, 0u);
    EXPECT_EQ(sp__host_live_allocations(0), 0u);
}

// Recent PyTorch's should_split asks the request's is_expandable_segments_active, which malloc
// makes false for a pool with an allocator of its own (c10/cuda/CUDACachingAllocator.cpp:
// `expandable_segments() && !active_user_pool`; 2.8's asked the option): with or without
// expandable_segments:True a pluggable pool's fixed segments split by the fixed rule, so a
// 19.5 MiB request in a fixed 20 MiB segment takes the whole segment (0.5 MiB left is not more
// than 1 MiB). It split down to 512 bytes under the option before.
static void pluggable_split(bool expandable) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", expandable ? "expandable_segments:True" : ""}, PYTORCH_PAGES});
    SP_SKIP_UNLESS_HOST();
    sp_allocator_t al;
    al.alloc = [](size_t size, int, sp_stream_t, void *) -> void * {
        return aligned_alloc(4096, size);
    };
    al.free = [](void *p, size_t, int, sp_stream_t, void *) { free(p); };
    al.ctx = nullptr;
    sp_mempool_params_t pp;
    sp_mempool_params_init(&pp);
    pp.allocator = &al;
    sp_mempool_t *custom = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&pp, &custom));
    void *a;
    ASSERT_SP_OK(sp_mempool_malloc(custom, 19 * MiB + 512 * KiB, nullptr, &a));
    auto r = walk(custom);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_FALSE(r[0].expandable);
    EXPECT_EQ(r[0].total, 20 * MiB);
    EXPECT_EQ(r[0].allocated, 20 * MiB);
    EXPECT_EQ(r[0].nblocks, 1u);
    EXPECT_EQ(stat("inactive_split.all.current"), 0);
    EXPECT_EQ(stat("inactive_split_bytes.all.current"), 0);
    ASSERT_SP_OK(sp_free(a));
    EXPECT_EQ(stat("inactive_split.all.current"), 0);
    ASSERT_SP_OK(sp_mempool_destroy(custom));
    ASSERT_SP_OK(sp_empty_cache());
}

TEST_F(Expandable, PluggablePoolsSplitByTheFixedRuleUnderTheOption) {
    pluggable_split(true);
}

TEST_F(Expandable, PluggablePoolsWithoutTheOptionKeepTheSlack) {
    pluggable_split(false);
}

TEST_F(Expandable, HostVmmOpsValidateAndCount) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "8MiB"}});
    SP_SKIP_UNLESS_HOST();
    ASSERT_SP_OK(sp_init());
    const sp_device_ops_t *ops = nullptr;
    sp_device_caps_t caps;
    ASSERT_SP_OK(sp__device_select(&ops, &caps));
    ASSERT_TRUE(caps.has_vmm);
    const size_t pg = 2 * MiB;
    void *base = nullptr;
    ASSERT_SP_OK(ops->vmm_reserve(0, 64 * MiB, pg, &base)); // address space beyond capacity
    char *p = static_cast<char *>(base);
    EXPECT_EQ(sp__host_live_bytes(0), 0u);
    ASSERT_SP_OK(ops->vmm_map(0, p + pg, 2 * pg));
    p[pg] = 1; // mapped pages are memory
    p[3 * pg - 1] = 2;
    EXPECT_EQ(sp__host_live_bytes(0), 2 * pg);
    EXPECT_SP_STATUS(ops->vmm_map(0, p + 2 * pg, pg), SP_ERR_INVALID_USAGE);     // mapped
    EXPECT_SP_STATUS(ops->vmm_map(0, p + 1, pg), SP_ERR_INVALID_ARGUMENT);       // unaligned
    EXPECT_SP_STATUS(ops->vmm_unmap(0, p, pg), SP_ERR_INVALID_USAGE);            // not mapped
    EXPECT_SP_STATUS(ops->vmm_map(0, p + 3 * pg, 3 * pg), SP_ERR_OUT_OF_MEMORY); // 10 > 8 MiB
    EXPECT_EQ(sp__host_live_bytes(0), 2 * pg);
    ASSERT_SP_OK(ops->vmm_unmap(0, p + pg, pg));
    EXPECT_EQ(sp__host_live_bytes(0), pg);
    ASSERT_SP_OK(ops->vmm_map(0, p + pg, pg));
    EXPECT_EQ(p[pg], 0); // an unmapped page comes back empty
    EXPECT_SP_STATUS(ops->vmm_release(0, p + pg, 64 * MiB - pg), SP_ERR_INVALID_USAGE);
    ASSERT_SP_OK(ops->vmm_release(0, base, 64 * MiB)); // mapped pages go with it
    EXPECT_EQ(sp__host_live_bytes(0), 0u);
    EXPECT_EQ(sp__host_live_allocations(0), 0u);
}

TEST_F(Expandable, ReplayArenaKeepsTheBudget) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"},
                       {"SYMPOOL_HOST_CAPACITY", "100MiB"},
                       {"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    void *a, *b;
    ASSERT_SP_OK(sp_malloc(60 * MiB, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(40 * MiB, 0, nullptr, &b));
    EXPECT_EQ(sp__host_live_bytes(0), 100 * MiB);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp__host_live_bytes(0), 0u);
    EXPECT_EQ(sp__host_live_allocations(0), 0u);
}

// A random mix of sizes, two streams, frees and empty_cache calls, with PyTorch's rules and with
// our options: after every step the snapshot ranges tile what is mapped (their sum is
// reserved_bytes, the allocated blocks sum to allocated_bytes) and the device holds exactly the
// mapped bytes.
class ExpandableModel : public sp::Test, public ::testing::WithParamInterface<int> {};

TEST_P(ExpandableModel, WalkAgreesWithStatsAndDevice) {
    expect_warnings(); // OOMs at capacity are part of the mix
    const char *page = GetParam() >= 1 ? "2MiB" : "0";
    const char *recycle = GetParam() >= 2 ? "1" : "0";
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       {"SYMPOOL_HOST_CAPACITY", "1GiB"},
                       {"SYMPOOL_EXPANDABLE_PAGE", page},
                       {"SYMPOOL_EXPANDABLE_RECYCLE", recycle}});
    SP_SKIP_UNLESS_HOST();
    sp_stream_t st[2];
    ASSERT_SP_OK(sp_stream_create(0, &st[0]));
    ASSERT_SP_OK(sp_stream_create(0, &st[1]));
    std::vector<void *> live;
    uint64_t x = 0x9E3779B97F4A7C15ull + (uint64_t)GetParam();
    auto rnd = [&x]() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        return x;
    };
    for (int step = 0; step < 3000; step++) {
        uint64_t r = rnd();
        if (r % 100 < 55 || live.empty()) {
            size_t kind = rnd() % 3;
            size_t size = kind == 0   ? 1 + rnd() % (1 * MiB)
                          : kind == 1 ? 1 * MiB + rnd() % (9 * MiB)
                                      : 10 * MiB + rnd() % (50 * MiB);
            void *p = nullptr;
            sp_status_t s = sp_malloc(size, 0, st[rnd() % 2], &p);
            ASSERT_TRUE(s == SP_SUCCESS || s == SP_ERR_OUT_OF_MEMORY) << describe(s);
            if (s == SP_SUCCESS)
                live.push_back(p);
        } else if (r % 100 < 98) {
            size_t i = rnd() % live.size();
            ASSERT_SP_OK(sp_free(live[i]));
            live[i] = live.back();
            live.pop_back();
        } else {
            ASSERT_SP_OK(sp_empty_cache());
        }
        auto w = walk();
        size_t total = 0, alloc = 0;
        for (size_t i = 0; i < w.size(); i++) {
            total += w[i].total;
            alloc += w[i].allocated;
            if (i > 0) {
                ASSERT_GE(w[i].address, w[i - 1].address + w[i - 1].total) << "step " << step;
            }
        }
        ASSERT_EQ((int64_t)total, stat("reserved_bytes.all.current")) << "step " << step;
        ASSERT_EQ((int64_t)alloc, stat("allocated_bytes.all.current")) << "step " << step;
        ASSERT_EQ(total, sp__host_live_bytes(0)) << "step " << step;
    }
    EXPECT_GT(stat("num_device_alloc"), 100); // the mix maps and unmaps a lot
    EXPECT_GT(stat("num_device_free"), 50);
    EXPECT_GT(stat("allocation.all.allocated"), 1000);
    for (void *p : live)
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
    EXPECT_EQ(sp__host_live_allocations(0), 0u);
    ASSERT_SP_OK(sp_stream_destroy(st[0]));
    ASSERT_SP_OK(sp_stream_destroy(st[1]));
}

INSTANTIATE_TEST_SUITE_P(Options, ExpandableModel, ::testing::Values(0, 1, 2));

// find_room grows at the first block of the unmapped list, in (stream, address) order, that has
// room: the list's order is the lowest-address rule. A random mix on three streams (RECYCLE's
// unmaps leave holes all over the segments, maps cut unmapped blocks, empty_cache merges them)
// keeps each block pool's list exactly its unmapped blocks, in order, after every step; with
// 2 MiB large pages and with PyTorch's 20 MiB ones (fewer, larger holes).
class ExpandableUnmappedList : public sp::Test, public ::testing::WithParamInterface<int> {};

TEST_P(ExpandableUnmappedList, StaysInStreamAndAddressOrder) {
    expect_warnings(); // OOMs at capacity are part of the mix
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       {"SYMPOOL_HOST_CAPACITY", "2GiB"},
                       {"SYMPOOL_EXPANDABLE_PAGE", GetParam() ? "2MiB" : "0"}});
    SP_SKIP_UNLESS_HOST();
    sp_stream_t st[3];
    for (auto &s : st)
        ASSERT_SP_OK(sp_stream_create(0, &s));
    std::vector<void *> live;
    uint64_t x = 0x2545F4914F6CDD1Dull + (uint64_t)GetParam();
    auto rnd = [&x]() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        return x;
    };
    char msg[256] = "";
    long most = 0;
    for (int step = 0; step < 4000; step++) {
        uint64_t r = rnd() % 1000;
        if (r < 520 || live.empty()) {
            size_t kind = rnd() % 4;
            size_t size = kind == 0   ? 1 + rnd() % (1 * MiB)
                          : kind == 1 ? 1 * MiB + rnd() % (7 * MiB)
                          : kind == 2 ? (1 + rnd() % 6) * 2 * MiB
                                      : 8 * MiB + rnd() % (40 * MiB);
            void *p = nullptr;
            sp_status_t s = sp_malloc(size, 0, st[rnd() % 3], &p);
            ASSERT_TRUE(s == SP_SUCCESS || s == SP_ERR_OUT_OF_MEMORY) << describe(s);
            if (s == SP_SUCCESS)
                live.push_back(p);
        } else if (r < 997) {
            size_t i = rnd() % live.size();
            ASSERT_SP_OK(sp_free(live[i]));
            live[i] = live.back();
            live.pop_back();
        } else {
            ASSERT_SP_OK(sp_empty_cache());
        }
        long n = sp_test_exp_check_unmapped(0, msg, sizeof msg);
        ASSERT_GE(n, 0) << "step " << step << ": " << msg;
        most = n > most ? n : most;
    }
    EXPECT_GT(most, 20); // the holes the mix is about
    for (void *p : live)
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp_test_exp_check_unmapped(0, msg, sizeof msg), 0) << msg;
    for (auto &s : st)
        ASSERT_SP_OK(sp_stream_destroy(s));
}

INSTANTIATE_TEST_SUITE_P(Pages, ExpandableUnmappedList, ::testing::Values(0, 1));

TEST_F(Expandable, PoolLimitCountsMappedPages) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, PYTORCH_PAGES});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_params_t pp;
    sp_mempool_params_init(&pp);
    pp.name = "capped";
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&pp, &pool));
    ASSERT_SP_OK(sp_mempool_set_limit(pool, 50 * MiB));
    void *a, *b = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 30 * MiB, nullptr, &a)); // maps 40 MiB
    EXPECT_EQ(sp_mempool_total_bytes(pool), 40 * MiB);
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, 30 * MiB, nullptr, &b), SP_ERR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(sp_last_error()).find("limit"), std::string::npos) << sp_last_error();
    ASSERT_SP_OK(sp_mempool_malloc(pool, 10 * MiB, nullptr, &b)); // fits the mapped 40 MiB
    EXPECT_EQ(sp_mempool_total_bytes(pool), 40 * MiB);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp__host_live_allocations(0), 0u);
}

// Our defaults (2 MiB large pages, recycling): before the large pool grows, the whole free pages
// of the small pool and of another stream's segment are unmapped, so the physical memory moves
// instead of adding up; PyTorch's rules keep them mapped until a release.
static void free_pages_elsewhere_then_grow(bool pytorch) {
    sp_stream_t s1;
    ASSERT_SP_OK(sp_stream_create(0, &s1));
    std::vector<void *> small;
    for (int i = 0; i < 8; i++) { // 8 x 1 MiB: 4 small pages
        void *p;
        ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &p));
        small.push_back(p);
    }
    void *other;
    ASSERT_SP_OK(sp_malloc(6 * MiB, 0, s1, &other)); // another stream's large segment
    for (void *p : small)
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_free(other));
    int64_t before = stat("reserved_bytes.all.current");
    void *big;
    ASSERT_SP_OK(sp_malloc(10 * MiB, 0, nullptr, &big));
    if (pytorch) {
        EXPECT_EQ(before, 28 * (int64_t)MiB); // 4 small pages + one 20 MiB page
        EXPECT_EQ(stat("reserved_bytes.small_pool.current"), 8 * (int64_t)MiB);
        EXPECT_EQ(stat("num_device_free"), 0);
        EXPECT_EQ(stat("reserved_bytes.all.current"), before + 20 * (int64_t)MiB);
    } else {
        EXPECT_EQ(before, 14 * (int64_t)MiB); // 4 small pages + three 2 MiB pages
        EXPECT_EQ(stat("reserved_bytes.small_pool.current"), 0);
        EXPECT_GE(stat("num_device_free"), 2);
        EXPECT_EQ(stat("reserved_bytes.all.current"), 10 * (int64_t)MiB); // moved, not added
    }
    ASSERT_SP_OK(sp_free(big));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
    ASSERT_SP_OK(sp_stream_destroy(s1));
}

TEST_F(Expandable, DefaultsRecycleSmallPoolAndOtherStreamPages) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    free_pages_elsewhere_then_grow(false);
}

TEST_F(Expandable, PyTorchRulesKeepFreePagesMappedUntilARelease) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, PYTORCH_PAGES});
    SP_SKIP_UNLESS_HOST();
    free_pages_elsewhere_then_grow(true);
}

// Two requests in this order, one of them small (<= 1 MiB), the other needing two 2 MiB pages
// with a free piece left: `packed`, the small block lies in the large pool's pages right after or
// before the large one (two pages in all, counted in large_pool); else it maps a 2 MiB small-pool
// page of its own (three pages).
static void small_and_large(size_t first, size_t second, bool packed) {
    const size_t small = first <= 1 * MiB ? first : second, large = first + second - small;
    void *a, *b;
    ASSERT_SP_OK(sp_malloc(first, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(second, 0, nullptr, &b));
    EXPECT_EQ(stat("reserved_bytes.all.current"), (packed ? 4 : 6) * (int64_t)MiB);
    EXPECT_EQ(stat("reserved_bytes.small_pool.current"), packed ? 0 : 2 * (int64_t)MiB);
    EXPECT_EQ(stat("allocated_bytes.large_pool.current"), (int64_t)(large + (packed ? small : 0)));
    EXPECT_EQ((uintptr_t)b == (uintptr_t)a + first, packed);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

// SYMPOOL_EXPANDABLE_BORROW (default): a small request with no free small block takes the free
// end of the large pool's last page instead of mapping a 2 MiB small-pool page; the block stays
// the large pool's. With the option off a small page is mapped, as in PyTorch.
// 3 MiB (two pages, 1 MiB free at the end), then 64 KiB.
static void small_request_after_large(bool borrow) {
    small_and_large(3 * MiB, 64 * KiB, borrow);
}

TEST_F(Expandable, SmallRequestBorrowsTheLargePoolsFreePiece) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    small_request_after_large(true);
}

TEST_F(Expandable, WithoutBorrowASmallRequestMapsASmallPage) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_EXPANDABLE_BORROW", "0"}});
    SP_SKIP_UNLESS_HOST();
    small_request_after_large(false);
}

// SYMPOOL_EXPANDABLE_SHARED (default 256MiB, with BORROW): while the pool is small, small
// requests live in the large pool's expandable segments even when no large block is free yet, so a
// 1 MiB block and a 2.5 MiB one share the pages under them (3.5 MiB: two pages) instead of a small
// page of their own beside the large pool's two (three pages, one half used and one a quarter
// used). Off (or BORROW off, PyTorch's rules) the small request maps a small-pool page.
static void small_then_large(bool shared) {
    small_and_large(1 * MiB, 5 * MiB / 2, shared);
}

TEST_F(Expandable, SmallAndLargeRequestsShareTheLargePoolsPages) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    small_then_large(true);
}

TEST_F(Expandable, WithoutSharedASmallRequestMapsASmallPage) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_EXPANDABLE_SHARED", "0"}});
    SP_SKIP_UNLESS_HOST();
    small_then_large(false);
}

TEST_F(Expandable, SharedNeedsBorrow) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_EXPANDABLE_BORROW", "0"}});
    SP_SKIP_UNLESS_HOST();
    small_then_large(false);
}

// Sharing lasts while the pool reserves less than SYMPOOL_EXPANDABLE_SHARED: at the bound new
// small requests map small-pool pages again (in a large pool small blocks would split the large
// free blocks PyTorch keeps for large requests); below it again, they share again.
TEST_F(Expandable, SmallRequestsShareOnlyWhileThePoolIsUnderTheBound) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       {"SYMPOOL_EXPANDABLE_SHARED", "4MiB"}});
    SP_SKIP_UNLESS_HOST();
    void *small, *big, *late, *later;
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &small));
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &big)); // 4 MiB reserved, all used: the bound
    EXPECT_EQ(stat("reserved_bytes.small_pool.current"), 0);
    // No free large piece to borrow either (BORROW's own rule still holds past the bound).
    ASSERT_SP_OK(sp_malloc(64 * KiB, 0, nullptr, &late));
    EXPECT_EQ(stat("reserved_bytes.small_pool.current"), 2 * (int64_t)MiB);
    EXPECT_EQ(stat("reserved_bytes.large_pool.current"), 4 * (int64_t)MiB);
    ASSERT_SP_OK(sp_free(big));
    ASSERT_SP_OK(sp_free(small));
    ASSERT_SP_OK(sp_empty_cache()); // the large pool's pages go: 2 MiB reserved, under the bound
    EXPECT_EQ(stat("reserved_bytes.all.current"), 2 * (int64_t)MiB);
    ASSERT_SP_OK(sp_malloc(64 * KiB, 0, nullptr, &later));
    EXPECT_EQ(stat("allocated_bytes.large_pool.current"), 64 * (int64_t)KiB);
    ASSERT_SP_OK(sp_free(later));
    ASSERT_SP_OK(sp_free(late));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

// SYMPOOL_EXPANDABLE_ALIGN (default, with RECYCLE, once the pool has unmapped pages and past
// SHARED's bound): `first` (3.5 MiB: two pages, 0.5 MiB free at the end), then `second` (4 or
// 3.5 MiB), which maps two more pages either way. Aligned, the second block starts at the page
// boundary (the piece before it stays free), so once the first block is freed its pages go
// whole: 4 MiB reserved. Packed right after it (PyTorch's placement), it starts inside the
// second page, which it then pins alone: 6 MiB reserved.
static void large_after_odd_block(size_t first, size_t second, bool unmapped_before, bool aligned) {
    void *u, *p, *q;
    if (unmapped_before) {
        ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &u));
        ASSERT_SP_OK(sp_free(u));
        ASSERT_SP_OK(sp_empty_cache());
    }
    ASSERT_SP_OK(sp_malloc(first, 0, nullptr, &p));
    ASSERT_SP_OK(sp_malloc(second, 0, nullptr, &q));
    EXPECT_EQ(stat("reserved_bytes.all.current"), 8 * (int64_t)MiB);
    EXPECT_EQ((uintptr_t)q - (uintptr_t)p, aligned ? 4 * MiB : first);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), (aligned ? 4 : 6) * (int64_t)MiB);
    EXPECT_EQ(stat("allocated_bytes.all.current"), (int64_t)second);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

#define NO_SHARED                                                                                  \
    { "SYMPOOL_EXPANDABLE_SHARED", "0" }

TEST_F(Expandable, LargeRequestsStartOnAPageOnceThePoolHasUnmapped) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, NO_SHARED});
    SP_SKIP_UNLESS_HOST();
    large_after_odd_block(7 * MiB / 2, 4 * MiB, true, true);
    large_after_odd_block(7 * MiB / 2, 7 * MiB / 2, true, true);
}

// SYMPOOL_EXPANDABLE_ALIGN_SKIP (default 0.25 of a page): 3 MiB first, so the page boundary is
// 1 MiB away, half a page, more than the skip allows: the block is packed (where the neighbour
// lives through the peak, the piece is only a cost). With 0.5 (the rule before the option) it
// starts on the page; a fraction over 0.5 is refused (the default applies).
TEST_F(Expandable, ALargeRequestSkipsAtMostAlignSkip) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, NO_SHARED});
    SP_SKIP_UNLESS_HOST();
    large_after_odd_block(3 * MiB, 4 * MiB, true, false);
}

TEST_F(Expandable, AlignSkipOfHalfAPageAlignsAfterAThreeMiBBlock) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       NO_SHARED,
                       {"SYMPOOL_EXPANDABLE_ALIGN_SKIP", "0.5"}});
    SP_SKIP_UNLESS_HOST();
    large_after_odd_block(3 * MiB, 4 * MiB, true, true);
}

TEST_F(Expandable, AlignSkipOverHalfAPageFallsBackToTheDefault) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       NO_SHARED,
                       {"SYMPOOL_EXPANDABLE_ALIGN_SKIP", "0.75"}});
    SP_SKIP_UNLESS_HOST();
    EXPECT_EQ(sp__option_double(SP_OPT_EXPANDABLE_ALIGN_SKIP), 0.25);
    large_after_odd_block(3 * MiB, 4 * MiB, true, false);
}

// 2.5 MiB first: the page boundary is 1.5 MiB away, more than half a page, so the block is
// packed (the piece would cost more than half the page it may save).
TEST_F(Expandable, ALargeRequestSkipsAtMostHalfAPage) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, NO_SHARED});
    SP_SKIP_UNLESS_HOST();
    large_after_odd_block(5 * MiB / 2, 4 * MiB, true, false);
}

// SYMPOOL_EXPANDABLE_ALIGN_SMALL (default): under SHARED's bound (here 8 MiB reserved, the
// default 256 MiB bound), once the pool has unmapped, a growth for whole pages starts on a page
// boundary too, however far it is: 2.5 MiB first, 4 MiB after it starts at 4 MiB (1.5 MiB
// skipped, more than ALIGN_SKIP allows past the bound), and once the first block is freed its
// pages go whole: 4 MiB reserved, not 6 (main before this option packed it). Odd sizes still
// pack (3.5 MiB after 3.5 MiB); with the option at 0 whole pages pack too.
TEST_F(Expandable, UnderTheSharedBoundWholePagesStartOnAPage) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    large_after_odd_block(5 * MiB / 2, 4 * MiB, true, true);
    large_after_odd_block(3 * MiB, 4 * MiB, true, true);
    large_after_odd_block(7 * MiB / 2, 7 * MiB / 2, true, false);
}

TEST_F(Expandable, AlignSmallOffPacksWholePagesUnderTheSharedBound) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       {"SYMPOOL_EXPANDABLE_ALIGN_SMALL", "0"}});
    SP_SKIP_UNLESS_HOST();
    large_after_odd_block(5 * MiB / 2, 4 * MiB, true, false);
}

// ALIGN_SMALL on a cache hit: a cached 8 MiB range at 2.5 MiB (behind a live 2.5 MiB block)
// serves a 4 MiB request from its first page boundary, 4 MiB, not from its start; once the
// 2.5 MiB block and the rest are freed and unmapped, the 4 MiB block holds two pages, not three.
static void whole_pages_cut_from_a_cached_range(bool aligned) {
    void *u, *p, *r, *q;
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &u));
    ASSERT_SP_OK(sp_free(u));
    ASSERT_SP_OK(sp_empty_cache()); // the pool has unmapped
    ASSERT_SP_OK(sp_malloc(5 * MiB / 2, 0, nullptr, &p));
    ASSERT_SP_OK(sp_malloc(15 * MiB / 2, 0, nullptr, &r)); // packed at 2.5 MiB (odd size)
    EXPECT_EQ((uintptr_t)r - (uintptr_t)p, 5 * MiB / 2);
    ASSERT_SP_OK(sp_free(r)); // cached: [2.5, 10) MiB, mapped
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &q));
    EXPECT_EQ((uintptr_t)q - (uintptr_t)p, aligned ? 4 * MiB : 5 * MiB / 2);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), (aligned ? 4 : 6) * (int64_t)MiB);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST_F(Expandable, UnderTheSharedBoundAHitForWholePagesStartsOnAPage) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    whole_pages_cut_from_a_cached_range(true);
}

TEST_F(Expandable, AlignSmallOffCutsAHitFromTheRangesStart) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       {"SYMPOOL_EXPANDABLE_ALIGN_SMALL", "0"}});
    SP_SKIP_UNLESS_HOST();
    whole_pages_cut_from_a_cached_range(false);
}

// ALIGN's own gate: without WHOLE (below), a pool that only grew packs large requests.
TEST_F(Expandable, APoolThatOnlyGrewPacksLargeRequests) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       NO_SHARED,
                       {"SYMPOOL_EXPANDABLE_WHOLE", "0"}});
    SP_SKIP_UNLESS_HOST();
    large_after_odd_block(3 * MiB, 4 * MiB, false, false);
}

// SYMPOOL_EXPANDABLE_WHOLE (default): until the pool first unmaps, a request of whole pages grows
// a segment of its own, so the 4 MiB block after a 3 MiB one starts on a page there, and once
// the 3 MiB block is freed its pages go whole (4 MiB reserved, not 6). A 3 MiB request after it
// still packs after the first one (odd sizes keep their segment).
static void whole_pages_apart(bool apart) {
    void *p, *q, *r;
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &q));
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &r));
    EXPECT_EQ((uintptr_t)q - (uintptr_t)p == 3 * MiB, !apart);
    EXPECT_EQ((uintptr_t)r - (uintptr_t)p, apart ? 3 * MiB : 7 * MiB);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 10 * (int64_t)MiB);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_free(r));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), (apart ? 4 : 6) * (int64_t)MiB);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST_F(Expandable, WholePagesOfAPoolThatOnlyGrewGrowASegmentOfTheirOwn) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, NO_SHARED});
    SP_SKIP_UNLESS_HOST();
    whole_pages_apart(true);
}

TEST_F(Expandable, WithoutWholeAPoolThatOnlyGrewPacksEverything) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       NO_SHARED,
                       {"SYMPOOL_EXPANDABLE_WHOLE", "0"}});
    SP_SKIP_UNLESS_HOST();
    whole_pages_apart(false);
}

TEST_F(Expandable, WholeNeedsAlign) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       NO_SHARED,
                       {"SYMPOOL_EXPANDABLE_ALIGN", "0"}});
    SP_SKIP_UNLESS_HOST();
    whole_pages_apart(false);
}

// A MemPool is never recycled, so its first unmap may never come: it packs as PyTorch does.
TEST_F(Expandable, MemPoolsPackWholePagesWithTheRest) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, NO_SHARED});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_params_t pp;
    sp_mempool_params_init(&pp);
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&pp, &pool));
    void *p, *q;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 3 * MiB, nullptr, &p));
    ASSERT_SP_OK(sp_mempool_malloc(pool, 4 * MiB, nullptr, &q));
    EXPECT_EQ((uintptr_t)q - (uintptr_t)p, 3 * MiB);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

// Under SHARED's bound (256 MiB by default) everything packs in one segment.
TEST_F(Expandable, UnderTheSharedBoundWholePagesPackWithTheRest) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    whole_pages_apart(false);
}

TEST_F(Expandable, WithoutAlignLargeRequestsArePacked) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       NO_SHARED,
                       {"SYMPOOL_EXPANDABLE_ALIGN", "0"}});
    SP_SKIP_UNLESS_HOST();
    large_after_odd_block(3 * MiB, 4 * MiB, true, false);
}

TEST_F(Expandable, AlignNeedsRecycle) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       NO_SHARED,
                       {"SYMPOOL_EXPANDABLE_RECYCLE", "0"}});
    SP_SKIP_UNLESS_HOST();
    large_after_odd_block(3 * MiB, 4 * MiB, true, false);
}

// Under SHARED's bound (default 256MiB) blocks stay packed: there a page is most of the 1% budget
// (requests of whole pages too, with ALIGN_SMALL off; with it on they start on a page: below).
TEST_F(Expandable, UnderTheSharedBoundLargeRequestsArePacked) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       {"SYMPOOL_EXPANDABLE_ALIGN_SMALL", "0"}});
    SP_SKIP_UNLESS_HOST();
    large_after_odd_block(3 * MiB, 4 * MiB, true, false);
}

// SYMPOOL_EXPANDABLE_FIT_END (default, under ALIGN's conditions): 3 MiB at 0, 5 MiB packed
// after it at 3 MiB (too little room to align), 2 MiB at 8 MiB. Freeing the 5 MiB block leaves
// a cached range [3, 8) MiB that starts inside a page and ends on one; `size` is then cut from
// it. A whole number of pages takes the range's end (4 MiB: [4, 8)), so once the 3 MiB block goes
// its pages go whole: size + 2 MiB reserved. Cut from the start (PyTorch's), [3, 7) keeps the
// second page and the free piece [7, 8) keeps the fourth: a page more.
static void whole_pages_from_a_cached_range(size_t size, bool unmapped_before, bool at_end) {
    void *u, *p, *f, *q, *r;
    if (unmapped_before) {
        ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &u));
        ASSERT_SP_OK(sp_free(u));
        ASSERT_SP_OK(sp_empty_cache());
    }
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_malloc(5 * MiB, 0, nullptr, &f));
    ASSERT_SP_OK(sp_malloc(2 * MiB, 0, nullptr, &q));
    EXPECT_EQ((uintptr_t)f - (uintptr_t)p, 3 * MiB);
    EXPECT_EQ((uintptr_t)q - (uintptr_t)p, 8 * MiB);
    ASSERT_SP_OK(sp_free(f));
    ASSERT_SP_OK(sp_malloc(size, 0, nullptr, &r));
    EXPECT_EQ(stat("reserved_bytes.all.current"), 10 * (int64_t)MiB); /* a cache hit */
    EXPECT_EQ((uintptr_t)r - (uintptr_t)p, at_end ? 8 * MiB - size : 3 * MiB);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), (int64_t)(size + (at_end ? 2 : 4) * MiB));
    ASSERT_SP_OK(sp_free(r));
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST_F(Expandable, WholePagesCutFromACachedRangeTakeItsPageAlignedEnd) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, NO_SHARED});
    SP_SKIP_UNLESS_HOST();
    whole_pages_from_a_cached_range(4 * MiB, true, true);
    whole_pages_from_a_cached_range(2 * MiB, true, true);
}

// An odd size at the range's end would only move the offset to its own start.
TEST_F(Expandable, AnOddSizeIsCutFromTheRangesStart) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, NO_SHARED});
    SP_SKIP_UNLESS_HOST();
    void *u, *p, *f, *q, *r;
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &u));
    ASSERT_SP_OK(sp_free(u));
    ASSERT_SP_OK(sp_empty_cache());
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_malloc(5 * MiB, 0, nullptr, &f));
    ASSERT_SP_OK(sp_malloc(2 * MiB, 0, nullptr, &q));
    ASSERT_SP_OK(sp_free(f));
    ASSERT_SP_OK(sp_malloc(7 * MiB / 2, 0, nullptr, &r));
    EXPECT_EQ((uintptr_t)r - (uintptr_t)p, 3 * MiB);
    ASSERT_SP_OK(sp_free(r));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache());
}

TEST_F(Expandable, APoolThatOnlyGrewCutsFromTheStart) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       NO_SHARED,
                       {"SYMPOOL_EXPANDABLE_WHOLE", "0"}});
    SP_SKIP_UNLESS_HOST();
    whole_pages_from_a_cached_range(4 * MiB, false, false);
}

TEST_F(Expandable, WithoutFitEndCachedRangesAreCutFromTheStart) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       NO_SHARED,
                       {"SYMPOOL_EXPANDABLE_FIT_END", "0"}});
    SP_SKIP_UNLESS_HOST();
    whole_pages_from_a_cached_range(4 * MiB, true, false);
}

TEST_F(Expandable, FitEndNeedsAlign) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       NO_SHARED,
                       {"SYMPOOL_EXPANDABLE_ALIGN", "0"}});
    SP_SKIP_UNLESS_HOST();
    whole_pages_from_a_cached_range(4 * MiB, true, false);
}

// Under SHARED's bound FIT_END stays out: with ALIGN_SMALL off, PyTorch's cut from the start;
// with it on (the default) the range's first page boundary, here its end too.
TEST_F(Expandable, UnderTheSharedBoundCachedRangesAreCutFromTheStart) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"},
                       {"SYMPOOL_EXPANDABLE_ALIGN_SMALL", "0"}});
    SP_SKIP_UNLESS_HOST();
    whole_pages_from_a_cached_range(4 * MiB, true, false);
}

TEST_F(Expandable, UnderTheSharedBoundWholePagesAreCutFromAPageBoundary) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    whole_pages_from_a_cached_range(4 * MiB, true, true);
}

// SYMPOOL_EXPANDABLE_SIDE (default, with RECYCLE): 3 MiB at 0, 4.5 MiB packed after it at
// 3 MiB, 2 MiB at 7.5 MiB (pages [0, 10) MiB mapped; a pool under SHARED's bound, so ALIGN,
// FIT_END and WHOLE stay out). Freeing the 4.5 MiB block leaves [3, 7.5) MiB between two live
// blocks, and `size` is cut from it. 1.25 MiB at the range's end, [6.25, 7.5), lies in the page
// the 2 MiB block keeps mapped: no page more, and the free piece [3, 6.25) holds the whole page
// [4, 6) that empty_cache gives back (8 MiB reserved). At the start, [3, 4.25), it needs page
// [4, 6) and the piece [4.25, 7.5) holds no whole page (10 MiB). 2.5 MiB needs one page more at
// either end: a tie keeps PyTorch's start.
static void cut_between_live_blocks(size_t size, bool at_end, int64_t reserved_after,
                                    sp_mempool_t *pool = nullptr) {
    void *p, *f, *q, *r;
    auto alloc = [&](size_t n, void **out) {
        if (pool)
            ASSERT_SP_OK(sp_mempool_malloc(pool, n, nullptr, out));
        else
            ASSERT_SP_OK(sp_malloc(n, 0, nullptr, out));
    };
    alloc(3 * MiB, &p);
    alloc(9 * MiB / 2, &f);
    alloc(2 * MiB, &q);
    EXPECT_EQ((uintptr_t)f - (uintptr_t)p, 3 * MiB);
    EXPECT_EQ((uintptr_t)q - (uintptr_t)p, 15 * MiB / 2);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 10 * (int64_t)MiB);
    ASSERT_SP_OK(sp_free(f));
    alloc(size, &r);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 10 * (int64_t)MiB); /* a cache hit */
    EXPECT_EQ((uintptr_t)r - (uintptr_t)p, at_end ? 15 * MiB / 2 - size : 3 * MiB);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), reserved_after);
    ASSERT_SP_OK(sp_free(r));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache());
}

TEST_F(Expandable, ACutTakesTheEndThatNeedsAPageLess) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    cut_between_live_blocks(5 * MiB / 4, true, 8 * (int64_t)MiB);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST_F(Expandable, ACutThatNeedsAsManyPagesAtEitherEndTakesTheStart) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    cut_between_live_blocks(5 * MiB / 2, false, 10 * (int64_t)MiB);
}

TEST_F(Expandable, WithoutSideCachedRangesAreCutFromTheStart) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_EXPANDABLE_SIDE", "0"}});
    SP_SKIP_UNLESS_HOST();
    cut_between_live_blocks(5 * MiB / 4, false, 10 * (int64_t)MiB);
}

// Without RECYCLE free pages stay mapped: which ones a block covers changes nothing it maps.
TEST_F(Expandable, SideNeedsRecycle) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_EXPANDABLE_RECYCLE", "0"}});
    SP_SKIP_UNLESS_HOST();
    cut_between_live_blocks(5 * MiB / 4, false, 10 * (int64_t)MiB);
}

// SYMPOOL_EXPANDABLE_PIN (default, with RECYCLE), in a pool under SHARED's bound (small requests
// cut from the large pool's blocks): 4 MiB at 0, 4 MiB at 4, 1 MiB at 8, 6 MiB at 9, 1 MiB at 15
// (pages [0, 16) MiB mapped). Freeing the two middle blocks leaves [4, 8) and [9, 15) cached
// between live blocks; best fit cuts 1 MiB from the smaller, at 4, on page [4, 6) that no live
// block holds. [9, 15) starts in page [8, 10), which the 1 MiB block at 8 keeps mapped, with
// room for 1 MiB: placed at 9 the request needs no page of its own, and empty_cache gives back
// [4, 8) and [10, 14) (8 MiB stay mapped) instead of [6, 8) and [10, 14) (10 MiB).
static void small_cut_beside_a_live_page(bool pinned) {
    void *a, *h, *s1, *t, *z, *r;
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &h));
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &s1));
    ASSERT_SP_OK(sp_malloc(6 * MiB, 0, nullptr, &t));
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &z));
    uintptr_t base = (uintptr_t)a;
    EXPECT_EQ((uintptr_t)s1 - base, 8 * MiB);
    EXPECT_EQ((uintptr_t)t - base, 9 * MiB);
    EXPECT_EQ((uintptr_t)z - base, 15 * MiB);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 16 * (int64_t)MiB);
    ASSERT_SP_OK(sp_free(h));
    ASSERT_SP_OK(sp_free(t));
    ASSERT_SP_OK(sp_malloc(1 * MiB, 0, nullptr, &r));
    EXPECT_EQ(stat("reserved_bytes.all.current"), 16 * (int64_t)MiB); /* a cache hit */
    EXPECT_EQ((uintptr_t)r - base, pinned ? 9 * MiB : 4 * MiB);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), (pinned ? 8 : 10) * (int64_t)MiB);
    for (void *p : {a, s1, z, r})
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST_F(Expandable, ASmallCutTakesABlockThatStartsInALivePage) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    small_cut_beside_a_live_page(true);
}

TEST_F(Expandable, WithoutPinSmallCutsKeepBestFit) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_EXPANDABLE_PIN", "0"}});
    SP_SKIP_UNLESS_HOST();
    small_cut_beside_a_live_page(false);
}

TEST_F(Expandable, PinNeedsRecycle) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_EXPANDABLE_RECYCLE", "0"}});
    SP_SKIP_UNLESS_HOST();
    small_cut_beside_a_live_page(false);
}

// A MemPool's free pages are not recycled: it cuts from the start, as PyTorch does.
TEST_F(Expandable, MemPoolsCutFromTheStart) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_params_t pp;
    sp_mempool_params_init(&pp);
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&pp, &pool));
    cut_between_live_blocks(5 * MiB / 4, false, 10 * (int64_t)MiB, pool);
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

// With PyTorch's 20 MiB large pages (SYMPOOL_EXPANDABLE_PAGE=0) small blocks keep their 2 MiB
// pages: sharing would put them under 20 MiB ones.
TEST_F(Expandable, SmallRequestsDoNotShareCoarserLargePages) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_EXPANDABLE_PAGE", "0"}});
    SP_SKIP_UNLESS_HOST();
    void *small;
    ASSERT_SP_OK(sp_malloc(64 * KiB, 0, nullptr, &small));
    EXPECT_EQ(stat("reserved_bytes.small_pool.current"), 2 * (int64_t)MiB);
    EXPECT_EQ(stat("reserved_bytes.large_pool.current"), 0);
    ASSERT_SP_OK(sp_free(small));
    ASSERT_SP_OK(sp_empty_cache());
}

// A MemPool that never splits keeps PyTorch's small pool (borrowing splits a large block).
TEST_F(Expandable, NoSplitMemPoolsKeepTheirSmallPool) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_params_t pp;
    sp_mempool_params_init(&pp);
    pp.no_split = true;
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&pp, &pool));
    void *a;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 64 * KiB, nullptr, &a));
    EXPECT_EQ(stat("reserved_bytes.small_pool.current"), 2 * (int64_t)MiB);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_empty_cache());
}

// Recycling is the default pool's: a live MemPool keeps its free pages mapped when it grows, as
// in PyTorch (a graph's pool must keep the memory its replays use).
TEST_F(Expandable, MemPoolsKeepTheirFreePagesWhenTheyGrow) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    sp_mempool_params_t pp;
    sp_mempool_params_init(&pp);
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&pp, &pool));
    sp_stream_t s1;
    ASSERT_SP_OK(sp_stream_create(0, &s1));
    void *a, *b;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 6 * MiB, s1, &a));
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_mempool_malloc(pool, 10 * MiB, nullptr, &b)); // another stream: no fit
    EXPECT_EQ(stat("num_device_free"), 0);
    EXPECT_EQ(sp_mempool_total_bytes(pool), 16 * MiB);
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_empty_cache());
    ASSERT_SP_OK(sp_stream_destroy(s1));
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

// Out of block structs (the arena's 4 GiB, here a limit at what is in use) when pages mapped into
// an expandable segment leave a remainder that needs a struct of its own: the request fails with
// a message that names the block structs (they come from the arena, never from the host heap),
// the pages are given back, and once there is room again it succeeds.
TEST_F(Expandable, NoStructForTheRemainderOfAGrowthFailsAndSaysWhy) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    expect_warnings();
    void *first = nullptr, *grown = nullptr;
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &first));
    std::vector<void *> ps;
    for (;;) {
        sp_block_structs_t st;
        ASSERT_SP_OK(sp__pool_block_structs(0, &st));
        if (st.spare == 0 && st.kept == 0 && st.untouched == 0)
            break;
        void *p = nullptr;
        ASSERT_SP_OK(sp_malloc(512 + ps.size() % 7 * 4096, 0, nullptr, &p));
        ps.push_back(p);
        ASSERT_LT(ps.size(), 100000u);
    }
    const size_t reserved = sp_memory_reserved(0);
    const size_t old = sp__arena_set_limit(sp__arena_used());
    sp_status_t s = sp_malloc(2 * MiB, 0, nullptr, &grown);
    std::string why = sp_last_error();
    (void)sp__arena_set_limit(old);
    EXPECT_NE(s, SP_SUCCESS);
    EXPECT_NE(why.find("block structs"), std::string::npos) << why;
    EXPECT_EQ(why.find("host memory"), std::string::npos) << why;
    EXPECT_EQ(sp_memory_reserved(0), reserved) << "the mapped pages were given back";
    ASSERT_SP_OK(sp_malloc(2 * MiB, 0, nullptr, &grown));
    ASSERT_SP_OK(sp_free(grown));
    for (void *p : ps)
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_free(first));
}

// RECYCLE's unmaps and the growth that asked for them (issue 25's churn): pages unmapped in the
// books and mapped again by the same growth stay mapped on the device (the same physical page
// at the same address), so a GPU makes no cuMemUnmap + cuMemRelease + cuMemCreate + cuMemMap for
// them. 4 MiB at 0 and 4 MiB at 4 MiB, the second freed: 6 MiB does not fit it, RECYCLE unmaps its
// two pages, and the growth maps [4, 10) MiB, those two pages and one more. The books (reserved,
// num_device_alloc/free) are as if every call were made; the device maps one page, unmaps none,
// and the bytes the freed block held are still there (the host backend drops an unmapped page's
// contents). Under a capacity that holds exactly the books' 10 MiB.
TEST_F(Expandable, PagesRecycledAndMappedAgainInOneGrowthStayMapped) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_HOST_CAPACITY", "10MiB"}});
    SP_SKIP_UNLESS_HOST();
    void *a, *b, *c;
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &b));
    ASSERT_EQ((uintptr_t)b, (uintptr_t)a + 4 * MiB);
    memset(b, 0x5a, 4 * MiB);
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_malloc(6 * MiB, 0, nullptr, &c));
    ASSERT_EQ((uintptr_t)c, (uintptr_t)a + 4 * MiB);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 10 * (int64_t)MiB);
    EXPECT_EQ(stat("num_device_alloc"), 3); // the books: b's pages unmapped, three mapped
    EXPECT_EQ(stat("num_device_free"), 1);
    EXPECT_EQ(sp__host_live_bytes(0), 10 * MiB);
    const unsigned char *p = static_cast<const unsigned char *>(c);
    size_t kept = 0;
    for (size_t i = 0; i < 4 * MiB; i += 4096)
        kept += p[i] == 0x5a;
    EXPECT_EQ(kept, 4 * MiB / 4096) << "b's pages were unmapped and mapped again";
    sp_x_vmm_counters_t v;
    ASSERT_SP_OK(sp_x_vmm_counters(0, &v));
    EXPECT_EQ(v.pages_mapped, 2 + 2 + 1);
    EXPECT_EQ(v.pages_unmapped, 0);
    EXPECT_EQ(v.bytes_mapped, 10 * (int64_t)MiB);
    EXPECT_EQ(v.map_calls, 3);
    EXPECT_EQ(v.unmap_calls, 0);
    EXPECT_EQ(v.recycle_syncs, 1);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(c));
    ASSERT_SP_OK(sp_empty_cache());
    ASSERT_SP_OK(sp_x_vmm_counters(0, &v));
    EXPECT_EQ(v.pages_unmapped, 5); // empty_cache unmaps on the device at once
    EXPECT_EQ(sp__host_live_bytes(0), 0u);
    ASSERT_SP_OK(sp_reset_accumulated_memory_stats(0));
    ASSERT_SP_OK(sp_x_vmm_counters(0, &v));
    EXPECT_EQ(v.pages_mapped + v.pages_unmapped + v.map_calls + v.recycle_syncs, 0);
    expect_warnings();
    EXPECT_SP_STATUS(sp_x_vmm_counters(0, nullptr), SP_ERR_INVALID_ARGUMENT);
}

// Pages RECYCLE unmaps where the growth does not map are unmapped on the device before the growth
// maps, so the device never holds more than the books say: 4 MiB blocks at 0, 4 and 8 MiB, the
// middle one freed; 6 MiB does not fit the 4 MiB hole and grows elsewhere (in a second segment:
// the first reserves 1.125 x the 14 MiB device, 16 MiB), after the hole's two pages are unmapped.
// 14 MiB of capacity holds it only in that order.
TEST_F(Expandable, PagesRecycledElsewhereAreUnmappedBeforeTheGrowthMaps) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_HOST_CAPACITY", "14MiB"}});
    SP_SKIP_UNLESS_HOST();
    void *a, *h, *b, *c;
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &h));
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &b));
    ASSERT_SP_OK(sp_free(h));
    ASSERT_SP_OK(sp_malloc(6 * MiB, 0, nullptr, &c));
    EXPECT_NE((uintptr_t)c, (uintptr_t)a + 4 * MiB);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 14 * (int64_t)MiB);
    EXPECT_EQ(stat("num_alloc_retries"), 0);
    EXPECT_EQ(sp__host_live_bytes(0), 14 * MiB);
    sp_x_vmm_counters_t v;
    ASSERT_SP_OK(sp_x_vmm_counters(0, &v));
    EXPECT_EQ(v.pages_mapped, 2 + 2 + 2 + 3);
    EXPECT_EQ(v.pages_unmapped, 2);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_free(c));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp__host_live_bytes(0), 0u);
}

// More unmaps in one growth than the held-back list holds (64 ranges): the rest are made on the
// device at once. 80 blocks of 4 MiB + 4 KiB (not whole pages: they pack with the rest), each
// after a live 64 KiB one, so each holds a whole page or more; all freed, then 256 MiB: RECYCLE
// unmaps the pages of all 80, and the device ends with exactly the books' bytes: what the books
// unmapped and the device did not is what the growth mapped again (kept), no more.
TEST_F(Expandable, MoreRecycledRangesThanTheListHoldsAreAllUnmapped) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    SP_SKIP_UNLESS_HOST();
    std::vector<void *> keep, gone;
    for (int i = 0; i < 80; i++) {
        void *k, *g;
        ASSERT_SP_OK(sp_malloc(64 * 1024, 0, nullptr, &k));
        ASSERT_SP_OK(sp_malloc(4 * MiB + 4096, 0, nullptr, &g));
        keep.push_back(k);
        gone.push_back(g);
    }
    for (void *g : gone)
        ASSERT_SP_OK(sp_free(g));
    ASSERT_SP_OK(sp_reset_accumulated_memory_stats(0));
    void *big;
    ASSERT_SP_OK(sp_malloc(256 * MiB, 0, nullptr, &big));
    sp_x_vmm_counters_t v;
    ASSERT_SP_OK(sp_x_vmm_counters(0, &v));
    EXPECT_GT(v.unmap_calls, 64);
    const int64_t kept = stat("reserved_bytes.all.freed") - v.bytes_unmapped;
    EXPECT_GE(kept, 0);
    EXPECT_EQ(stat("reserved_bytes.all.allocated") - v.bytes_mapped, kept);
    EXPECT_EQ(sp__host_live_bytes(0), (size_t)stat("reserved_bytes.all.current"));
    ASSERT_SP_OK(sp_free(big));
    for (void *k : keep)
        ASSERT_SP_OK(sp_free(k));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp__host_live_bytes(0), 0u);
}

// A recycled range the growth maps only part of: its other part must be unmapped on the device
// before the growth maps new pages, or the device holds more than the books say. 10 MiB device:
// x [0,6) and d [6,10) of a 12 MiB segment, x freed and unmapped (empty_cache), then z, 1 MiB in
// the small pool (a 2 MiB page), and d freed. 8 MiB fits no free block (d grows to 6 MiB at most):
// RECYCLE unmaps d, and the growth maps [0,8): [0,6) new, [6,8) kept. The books end at z's 2 +
// 8 = 10 MiB, the capacity; with [8,10) still mapped while [0,6) is, the device would need 12, its
// map fail, and the malloc go through an OOM retry (num_alloc_retries) that every unmap made first
// never needs.
TEST_F(Expandable, PartOfARecycledRangeOutsideTheGrowthIsUnmappedBeforeItMaps) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_HOST_CAPACITY", "10MiB"}});
    SP_SKIP_UNLESS_HOST();
    void *x, *d, *z, *c;
    ASSERT_SP_OK(sp_malloc(6 * MiB, 0, nullptr, &x));
    ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &d));
    ASSERT_EQ((uintptr_t)d, (uintptr_t)x + 6 * MiB);
    ASSERT_SP_OK(sp_free(x));
    ASSERT_SP_OK(sp_empty_cache()); // [0,6) unmapped
    sp_stream_t s1;
    ASSERT_SP_OK(sp_stream_create(0, &s1));
    ASSERT_SP_OK(sp_malloc(2 * MiB, 0, s1, &z));
    ASSERT_SP_OK(sp_free(d));
    ASSERT_EQ(sp__host_live_bytes(0), 6 * MiB);
    ASSERT_SP_OK(sp_reset_accumulated_memory_stats(0));
    ASSERT_SP_OK(sp_malloc(8 * MiB, 0, nullptr, &c));
    EXPECT_EQ((uintptr_t)c, (uintptr_t)x);
    EXPECT_EQ(stat("num_alloc_retries"), 0);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 10 * (int64_t)MiB);
    EXPECT_EQ(sp__host_live_bytes(0), 10 * MiB);
    sp_x_vmm_counters_t v;
    ASSERT_SP_OK(sp_x_vmm_counters(0, &v));
    EXPECT_EQ(v.pages_mapped, 3);   // [0,6)
    EXPECT_EQ(v.pages_unmapped, 1); // [8,10)
    ASSERT_SP_OK(sp_free(c));
    ASSERT_SP_OK(sp_free(z));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp__host_live_bytes(0), 0u);
    ASSERT_SP_OK(sp_stream_destroy(s1));
}
