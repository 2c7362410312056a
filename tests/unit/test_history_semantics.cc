// test_history_semantics.cc: the history details PyTorch's own tests look at.
//  - segment_free carries a stack by PyTorch's rule: the stack of the call that released the
//    segment when that call gathered one (empty_cache and pool releases at context "all"; the
//    malloc whose OOM retry released it at any level), else the stack the segment was allocated
//    with; and trace entries keep stacks only from context "alloc" up. So with "all" an
//    empty_cache shows in the snapshot, with "alloc" and "state" it does not (PyTorch's
//    test_memory_plots_free_segment_stack).
//  - enabled = SP_HISTORY_STATE keeps the stacks of live blocks but no action history.
#include "sp_test.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

extern "C" {
#include "pool/history.h"
}

using sp::MiB;

namespace {

// The "Python" frame the binding would report: the name of the operation the test is in.
const char *g_op = "none";

size_t op_frames(sp_history_frame_t *f, size_t max, void *) {
    if (max < 1 || g_op == nullptr) // nullptr: a thread without Python frames
        return 0;
    f[0] = {g_op, "test.py", 1};
    return 1;
}

std::vector<sp__trace_entry_t> trace(int dev = 0) {
    sp__trace_entry_t *e = nullptr;
    size_t n = 0;
    EXPECT_EQ(sp__history_copy(dev, &e, &n), SP_SUCCESS);
    std::vector<sp__trace_entry_t> out(e, e + n);
    sp__history_entries_free(e, n);
    return out;
}

sp_status_t record(sp_history_enabled_t en, sp_history_context_t ctx) {
    sp_history_params_t p;
    sp_history_params_init(&p);
    p.enabled = en;
    p.context = ctx;
    return sp_record_memory_history(&p);
}

// The first frame's name of a context ("" when it has none).
std::string top(uint32_t context) {
    const sp__history_frame_t *f = nullptr;
    size_t n = 0;
    sp__history_context_frames(context, &f, &n);
    return n ? f[0].name : "";
}

// The frame names of every segment_free entry, in order ("" for an entry without frames).
std::vector<std::string> segment_free_tops() {
    std::vector<std::string> out;
    for (auto &e : trace())
        if (e.action == SP_TRACE_SEGMENT_FREE)
            out.push_back(e.context ? top(e.context) : "");
    return out;
}

std::string dump_json() {
    char path[] = "/tmp/sp_hist_sem_XXXXXX.json";
    int fd = mkstemps(path, 5);
    EXPECT_GE(fd, 0);
    close(fd);
    EXPECT_EQ(sp_dump_snapshot(path), SP_SUCCESS) << sp_last_error();
    std::ifstream f(path);
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    unlink(path);
    return s;
}

const char *level_name(sp_history_context_t c) {
    return c == SP_CONTEXT_ALL ? "all" : c == SP_CONTEXT_ALLOC ? "alloc" : "state";
}

} // namespace

class HistorySemantics : public sp::Test {
  protected:
    // segment_free is a fixed segment's event (expandable segments unmap pages instead).
    sp::ScopedEnv fixed_{{"SYMPOOL_ALLOC_CONF", "expandable_segments:False"}};
    void SetUp() override {
        sp::Test::SetUp();
        g_op = "none";
        sp_history_set_frames_hook(op_frames, nullptr);
    }
    void TearDown() override {
        sp_history_set_frames_hook(nullptr, nullptr);
        sp::Test::TearDown();
    }
};

// PyTorch's test_memory_plots_free_segment_stack, on sympool; and what its release_block falls
// back to below "all" (the segment's allocation stack, held by its first block): a segment never
// split keeps it ("whole": a 20 MiB request fills its segment), a split one lost it at its first
// split ("rand": 48 bytes of a 2 MiB segment; PyTorch's split makes a new block the segment's
// first, without that stack). The large pool's segment goes first (release order).
TEST_F(HistorySemantics, EmptyCacheStackOnlyWithContextAll) {
    for (sp_history_context_t ctx : {SP_CONTEXT_ALLOC, SP_CONTEXT_ALL, SP_CONTEXT_STATE}) {
        SCOPED_TRACE(level_name(ctx));
        ASSERT_SP_OK(sp_empty_cache());
        ASSERT_SP_OK(record(SP_HISTORY_ALL, ctx));
        void *x = nullptr, *w = nullptr;
        g_op = "rand";
        ASSERT_SP_OK(sp_malloc(3 * 4 * 4, 0, nullptr, &x));
        g_op = "whole";
        ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &w));
        g_op = "del";
        ASSERT_SP_OK(sp_free(x));
        ASSERT_SP_OK(sp_free(w));
        g_op = "empty_cache";
        ASSERT_SP_OK(sp_empty_cache());
        g_op = "snapshot";
        auto tops = segment_free_tops();
        ASSERT_EQ(tops.size(), 2u);
        if (ctx == SP_CONTEXT_ALL)
            EXPECT_EQ(tops, (std::vector<std::string>{"empty_cache", "empty_cache"}));
        else if (ctx == SP_CONTEXT_ALLOC)
            EXPECT_EQ(tops, (std::vector<std::string>{"whole", ""}))
                << "the segment's allocation stack while it was never split";
        else
            EXPECT_EQ(tops, (std::vector<std::string>{"", ""}))
                << "no stacks on trace entries below alloc";
        std::string ss = dump_json();
        EXPECT_EQ(ss.find("empty_cache") != std::string::npos, ctx == SP_CONTEXT_ALL);
        ASSERT_SP_OK(record(SP_HISTORY_OFF, SP_CONTEXT_NONE));
    }
}

// A free on a thread without Python frames (the autograd engine's backward frees): at "all"
// PyTorch gathers a context there that is empty, not none, so the free's entries show no frames;
// below "all" it gathers none for frees and they show the allocation's stack (Athrun0109's real
// trace has 3353 frees with no frames, 772 of them of blocks allocated with a stack).
TEST_F(HistorySemantics, FreeWithoutFramesShowsNoneAtAll) {
    for (sp_history_context_t ctx : {SP_CONTEXT_ALL, SP_CONTEXT_ALLOC}) {
        SCOPED_TRACE(level_name(ctx));
        ASSERT_SP_OK(record(SP_HISTORY_ALL, ctx));
        void *x = nullptr;
        g_op = "forward";
        ASSERT_SP_OK(sp_malloc(4 * MiB, 0, nullptr, &x));
        g_op = nullptr;
        ASSERT_SP_OK(sp_free(x));
        g_op = "none";
        std::vector<std::string> frees;
        for (auto &e : trace())
            if (e.action == SP_TRACE_FREE_REQUESTED || e.action == SP_TRACE_FREE_COMPLETED)
                frees.push_back(e.context ? top(e.context) : "");
        std::string want = ctx == SP_CONTEXT_ALL ? "" : "forward";
        EXPECT_EQ(frees, (std::vector<std::string>{want, want}));
        ASSERT_SP_OK(record(SP_HISTORY_OFF, SP_CONTEXT_NONE));
    }
}

// A live segment's frames in a snapshot: a segment never split shows the stack it was allocated
// with, one split once shows none, even after its blocks merged whole again (PyTorch's snapshots:
// 0 of 2,882 split segments in 36 real ones have frames).
TEST_F(HistorySemantics, SegmentFramesOnlyWhileNeverSplit) {
    ASSERT_SP_OK(record(SP_HISTORY_STATE, SP_CONTEXT_ALL)); // no trace entries but the last
    void *w = nullptr, *s = nullptr;
    g_op = "whole_segment";
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &w));
    g_op = "split_segment";
    ASSERT_SP_OK(sp_malloc(30 * MiB + 1, 0, nullptr, &s)); // a 32 MiB segment, split
    g_op = "del";
    ASSERT_SP_OK(sp_free(s)); // merged whole again
    std::string ss = dump_json();
    auto count = [&](const std::string &what) {
        size_t n = 0;
        for (size_t at = ss.find(what); at != std::string::npos; at = ss.find(what, at + 1))
            n++;
        return n;
    };
    EXPECT_EQ(count("whole_segment"), 2u) << "the live block's frames and its segment's";
    EXPECT_EQ(count("split_segment"), 0u) << "a segment split once shows no frames";
    ASSERT_SP_OK(sp_free(w));
}

// A segment released by a malloc's OOM retry carries that malloc's stack (PyTorch passes the
// malloc's context, gathered at level "state", down to release_block).
TEST_F(HistorySemantics, OomRetryReleaseCarriesTheMallocStack) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "100MiB"}});
    for (sp_history_context_t ctx : {SP_CONTEXT_ALLOC, SP_CONTEXT_ALL, SP_CONTEXT_STATE}) {
        SCOPED_TRACE(level_name(ctx));
        ASSERT_SP_OK(record(SP_HISTORY_ALL, ctx));
        void *a = nullptr, *b = nullptr;
        g_op = "first";
        ASSERT_SP_OK(sp_malloc(40 * MiB, 0, nullptr, &a));
        ASSERT_SP_OK(sp_free(a));
        g_op = "second";
        ASSERT_SP_OK(sp_malloc(70 * MiB, 0, nullptr, &b)); // releases the cached 40 MiB
        auto tops = segment_free_tops();
        ASSERT_EQ(tops.size(), 1u);
        EXPECT_EQ(tops[0], ctx == SP_CONTEXT_STATE ? "" : "second");
        ASSERT_SP_OK(sp_free(b));
        ASSERT_SP_OK(sp_empty_cache());
        ASSERT_SP_OK(record(SP_HISTORY_OFF, SP_CONTEXT_NONE));
    }
}

// Pool releases gather the releasing call's stack at context "all" too.
TEST_F(HistorySemantics, PoolReleasesCarryTheirCallersStackAtAll) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL, SP_CONTEXT_ALL));
    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&params, &pool));
    void *a = nullptr, *b = nullptr;
    g_op = "alloc_a";
    ASSERT_SP_OK(sp_mempool_malloc(pool, 4096, nullptr, &a));
    g_op = "alloc_b";
    ASSERT_SP_OK(sp_mempool_malloc(pool, 4 * MiB, nullptr, &b));
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    g_op = "free_all_blocks";
    ASSERT_SP_OK(sp_mempool_free_all_blocks(pool, nullptr));
    auto tops = segment_free_tops();
    ASSERT_EQ(tops.size(), 2u);
    EXPECT_EQ(tops[0], "free_all_blocks");
    EXPECT_EQ(tops[1], "free_all_blocks");
    g_op = "alloc_c";
    ASSERT_SP_OK(sp_mempool_malloc(pool, 4096, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    g_op = "destroy";
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    tops = segment_free_tops();
    ASSERT_EQ(tops.size(), 3u);
    EXPECT_EQ(tops[2], "destroy");
    ASSERT_SP_OK(record(SP_HISTORY_OFF, SP_CONTEXT_NONE));
}

// enabled="state": live blocks keep their stacks, and the ring keeps exactly one trace entry
// (PyTorch's _record_memory_history sets max_entries to 1 unless enabled is "all"): after
// empty_cache the last entry is its segment_free; a dump shows it, then its own snapshot marker
// replaces it in the ring.
TEST_F(HistorySemantics, EnabledStateKeepsLiveStacksAndOneTraceEntry) {
    ASSERT_SP_OK(record(SP_HISTORY_STATE, SP_CONTEXT_ALL));
    void *a = nullptr, *b = nullptr;
    g_op = "keep_me";
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &b));
    g_op = "gone";
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &a)); // its own segment, released below
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_empty_cache());
    auto t = trace();
    ASSERT_EQ(t.size(), 1u) << "a ring of one entry with enabled=state";
    EXPECT_EQ(t[0].action, SP_TRACE_SEGMENT_FREE);
    std::string ss = dump_json();
    EXPECT_NE(ss.find("keep_me"), std::string::npos) << "the live block's stack is kept";
    EXPECT_NE(ss.find("\"segment_free\""), std::string::npos) << ss.substr(0, 2000);
    EXPECT_EQ(ss.find("\"snapshot\""), std::string::npos) << "the marker is not in this dump";
    t = trace();
    ASSERT_EQ(t.size(), 1u);
    EXPECT_EQ(t[0].action, SP_TRACE_SNAPSHOT) << "the marker replaced it in the ring";
    ASSERT_SP_OK(sp_free(b));
    // Switching to "all" starts recording actions from there.
    ASSERT_SP_OK(record(SP_HISTORY_ALL, SP_CONTEXT_ALL));
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    EXPECT_GE(trace().size(), 3u);
    ASSERT_SP_OK(record(SP_HISTORY_OFF, SP_CONTEXT_NONE));
}

// empty_cache gives its segments back in PyTorch's release_blocks order, which its trace shows:
// the large pool's whole free segments by (stream, size, address), then the small pool's (on 33
// runs of segment frees in 11 real snapshots, all in that order). Made here in another order:
// a small segment first, then large ones of 40, 20 and 22 MiB.
TEST_F(HistorySemantics, EmptyCacheReleasesLargeBySizeThenSmall) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL, SP_CONTEXT_STATE));
    void *p[4] = {};
    const size_t sizes[4] = {1000, 40 * MiB, 20 * MiB, 22 * MiB};
    for (int i = 0; i < 4; i++)
        ASSERT_SP_OK(sp_malloc(sizes[i], 0, nullptr, &p[i]));
    for (int i = 0; i < 4; i++)
        ASSERT_SP_OK(sp_free(p[i]));
    ASSERT_SP_OK(sp_empty_cache());
    std::vector<size_t> freed;
    for (auto &e : trace())
        if (e.action == SP_TRACE_SEGMENT_FREE)
            freed.push_back(e.size);
    EXPECT_EQ(freed, (std::vector<size_t>{20 * MiB, 22 * MiB, 40 * MiB, 2 * MiB}));
}

// The whole free segments a release gave back (its segment_free entries after `from` trace
// entries), and whether they came in PyTorch's release_blocks order: one block pool's then the
// other's (the large one's first when large_first), each by (stream, size, address). A small
// pool's segment is 2 MiB, a large one's never is.
struct Released {
    std::vector<std::tuple<bool, uintptr_t, size_t, uintptr_t>> order;
    bool in_release_order(bool large_first) const {
        auto sorted = order;
        for (auto &k : sorted)
            std::get<0>(k) = std::get<0>(k) == large_first; // the first pool's key 0
        auto keyed = sorted;
        std::sort(sorted.begin(), sorted.end());
        return keyed == sorted;
    }
};
Released released_since(size_t from, size_t *made_p) {
    Released r;
    auto t = trace();
    *made_p = 0;
    for (size_t i = from; i < t.size(); i++)
        if (t[i].action == SP_TRACE_SEGMENT_FREE)
            r.order.emplace_back(t[i].size == 2 * MiB, t[i].stream, t[i].size, t[i].addr);
        else if (t[i].action == SP_TRACE_SEGMENT_ALLOC)
            ++*made_p;
    return r;
}

// The release order on a pool whose free sets hold more than whole segments: two streams, equal
// sizes (address order decides), small and large segments, and free blocks of a segment with a
// live block between them in the sets' order (a walk of the sets must pass them by and still
// find every whole segment), made in an order that is none of the release's. Default pool:
// large first; a private pool's release (sp_mempool_destroy): small first.
TEST_F(HistorySemantics, ReleasesFollowTheFreeSetsOrderPastSplitBlocks) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL, SP_CONTEXT_STATE));
    sp_stream_t other = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &other));
    const size_t sizes[] = {22 * MiB, 1000, 12 * MiB, 22 * MiB, 4 * MiB, 40 * MiB, 12 * MiB, 3000};
    for (int round = 0; round < 2; round++) {
        sp_mempool_t *pool = nullptr;
        if (round == 1) {
            sp_mempool_params_t mp;
            sp_mempool_params_init(&mp);
            ASSERT_SP_OK(sp_mempool_create(&mp, &pool));
            ASSERT_SP_OK(sp_mempool_begin(pool));
        }
        size_t from = trace().size();
        std::vector<void *> ps;
        for (sp_stream_t s : {(sp_stream_t) nullptr, other})
            for (size_t size : sizes) {
                void *p = nullptr;
                ASSERT_SP_OK(sp_malloc(size, 0, s, &p));
                ps.push_back(p);
            }
        // Split segments: 6 MiB of a 20 MiB segment stays live (its 14 MiB rest is free, between
        // the 12 and 22 MiB segments), a 500 KiB block of a small one (its rest among them).
        void *live_large = nullptr, *live_small = nullptr, *gone = nullptr;
        ASSERT_SP_OK(sp_malloc(6 * MiB, 0, other, &live_large));
        ASSERT_SP_OK(sp_malloc(500 * 1024, 0, nullptr, &live_small));
        ASSERT_SP_OK(sp_malloc(300 * 1024, 0, nullptr, &gone));
        ASSERT_SP_OK(sp_free(gone));
        for (size_t i = ps.size(); i-- > 0;)
            ASSERT_SP_OK(sp_free(ps[i]));
        if (round == 0) {
            ASSERT_SP_OK(sp_empty_cache());
        } else {
            ASSERT_SP_OK(sp_mempool_end(pool));
            ASSERT_SP_OK(sp_mempool_destroy(pool));
        }
        size_t made = 0;
        Released r = released_since(from, &made);
        // every segment the round made went but the two that hold the live blocks
        EXPECT_EQ(made - r.order.size(), 2u);
        EXPECT_GE(r.order.size(), 10u);
        EXPECT_TRUE(r.in_release_order(round == 0));
        ASSERT_SP_OK(sp_free(live_large));
        ASSERT_SP_OK(sp_free(live_small));
    }
    ASSERT_SP_OK(sp_stream_destroy(other));
}
