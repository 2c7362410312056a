// test_alloc_internal.cc: what pool/pool.h offers other modules, checked directly: interior
// pointer lookup, the segment walk, and the symmetric primitives (ordering by segment sequence
// number, find/take/grow, free segment lists and release); plus several emulated devices.
#include "alloc_test_util.hpp"

#include <sys/mman.h>
#include <sys/single_threaded.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

extern "C" {
#include "core/core.h"
#include "pool/pool.h"
#include "pool/block.h"
#include "sympool/experimental.h"
// pool/allocator.h (C11 atomics: a C++ test cannot include it)
bool sp__alloc_hits_biased(void);
void sp__lock_streak_pin(int takes);
}

using namespace sp;

class AllocInternal : public sp::Test {};

TEST_F(AllocInternal, LookupFindsInteriorPointers) {
    void *p;
    ASSERT_SP_OK(sp_malloc(5000, 0, nullptr, &p));
    sp_block_info_t info;
    ASSERT_SP_OK(sp__pool_lookup((char *)p + 4999, &info));
    EXPECT_EQ(info.block_base, p);
    EXPECT_EQ(info.block_size, 5120u);
    EXPECT_EQ(info.requested_size, 5000u);
    EXPECT_EQ(info.segment_size, 2 * MiB);
    EXPECT_EQ(info.segment_seq, 0u);
    EXPECT_EQ(info.pool, sp_default_mempool(0));
    EXPECT_EQ(sp__pool_lookup((char *)p + 5120, &info), SP_ERR_INVALID_USAGE) << "free tail";
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(sp__pool_lookup(p, &info), SP_ERR_INVALID_USAGE);
}

struct WalkOut {
    size_t segments = 0, blocks = 0, allocated = 0, total = 0;
};

static void visit(const sp_segment_view_t *s, void *arg) {
    auto *w = static_cast<WalkOut *>(arg);
    w->segments++;
    w->blocks += s->nblocks;
    w->allocated += s->allocated_size;
    w->total += s->total_size;
    size_t sum = 0;
    for (size_t i = 0; i < s->nblocks; i++)
        sum += s->blocks[i].size;
    EXPECT_EQ(sum, s->total_size);
}

TEST_F(AllocInternal, WalkSeesOneConsistentState) {
    void *a, *b;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &b));
    WalkOut w;
    ASSERT_SP_OK(sp__pool_walk(-1, nullptr, visit, &w));
    EXPECT_EQ(w.segments, 2u);
    EXPECT_EQ(w.blocks, 4u);
    EXPECT_EQ(w.allocated, 512 + 3 * MiB);
    EXPECT_EQ(w.total, 22 * MiB);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
}

static void *plain_alloc(size_t size, int, sp_stream_t, void *ctx) {
    ++*static_cast<int *>(ctx);
    return aligned_alloc(4096, size);
}
static void plain_free(void *p, size_t, int, sp_stream_t, void *ctx) {
    --*static_cast<int *>(ctx);
    free(p);
}

// The primitives symmetric/ builds growth and release on: plan and adopt (the memory comes from
// the caller, as the registrar's does, allocated with no pool lock held), detach (the memory
// goes back to the caller). The pool's allocator callbacks only hear of segments pool/ lets go
// of on its own (destroy), never of adopted or detached ones.
TEST_F(AllocInternal, SymmetricPrimitives) {
    int live_segments = 0;
    sp_allocator_t al = {plain_alloc, plain_free, &live_segments};
    sp_mempool_params_t prm;
    sp_mempool_params_init(&prm);
    prm.allocator = &al;
    prm.name = "sym";
    sp_mempool_t *pool;
    int state = 7;
    ASSERT_SP_OK(sp__mempool_create_symmetric(&prm, &state, &pool));
    EXPECT_TRUE(sp_mempool_is_symmetric(pool));
    EXPECT_EQ(sp__mempool_sym_state(pool), &state);
    size_t rounded = 0;
    ASSERT_SP_OK(sp__pool_sym_size(pool, 4 * MiB - 3, &rounded));
    EXPECT_EQ(rounded, 4 * MiB);
    ASSERT_SP_OK(sp__pool_sym_size(pool, 0, &rounded));
    EXPECT_EQ(rounded, 0u);
    expect_warnings();
    EXPECT_SP_STATUS(sp__pool_sym_size(pool, SIZE_MAX, &rounded), SP_ERR_INVALID_ARGUMENT);
    bool found = true;
    uint64_t seq = 99;
    size_t off = 99;
    ASSERT_SP_OK(sp__pool_sym_find(pool, 4 * MiB, nullptr, &found, &seq, &off));
    EXPECT_FALSE(found);
    void *g[2], *t;
    void *mem[2];
    for (int i = 0; i < 2; i++) {
        size_t asize = 0;
        ASSERT_SP_OK(sp__pool_sym_plan(pool, 4 * MiB, nullptr, &asize));
        EXPECT_EQ(asize, 20 * MiB);
        mem[i] = aligned_alloc(4096, asize);
        ASSERT_SP_OK(
            sp__pool_sym_adopt(pool, mem[i], asize, 4 * MiB, 4 * MiB, nullptr, &g[i], &seq));
        EXPECT_EQ(seq, (uint64_t)i);
        EXPECT_EQ(g[i], mem[i]);
    }
    EXPECT_EQ(sp__pool_segment_count(pool), 2u);
    EXPECT_EQ(sp__pool_next_segment_seq(pool), 2u);
    EXPECT_EQ(live_segments, 0) << "adopted memory is not the allocator callbacks'";
    // Both segments have a 16 MiB free tail; ties go to the lower sequence number.
    ASSERT_SP_OK(sp__pool_sym_find(pool, 8 * MiB, nullptr, &found, &seq, &off));
    EXPECT_TRUE(found);
    EXPECT_EQ(seq, 0u);
    EXPECT_EQ(off, 4 * MiB);
    EXPECT_EQ(sp__pool_sym_take(pool, 8 * MiB, 8 * MiB, nullptr, 1, 0, &t), SP_ERR_INVALID_USAGE)
        << "offset 0 of segment 1 is allocated";
    ASSERT_SP_OK(sp__pool_sym_take(pool, 8 * MiB, 8 * MiB, nullptr, 1, 4 * MiB, &t));
    EXPECT_EQ((char *)t, (char *)g[1] + 4 * MiB);
    void *base;
    size_t size;
    ASSERT_SP_OK(sp__pool_segment_info(pool, 1, &base, &size));
    EXPECT_EQ(base, g[1]);
    EXPECT_EQ(size, 20 * MiB);
    // A pool limit leaves no room for another segment.
    ASSERT_SP_OK(sp_mempool_set_limit(pool, 50 * MiB));
    size_t asize = 0;
    EXPECT_EQ(sp__pool_sym_plan(pool, 4 * MiB, nullptr, &asize), SP_ERR_OUT_OF_MEMORY);
    ASSERT_SP_OK(sp_mempool_set_limit(pool, 0));
    // Misuse of the public entry points on a symmetric pool.
    void *p;
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, 512, nullptr, &p), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(sp_mempool_begin(pool), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(sp_mempool_free_all_blocks(pool, nullptr), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(sp_mempool_destroy(pool), SP_ERR_INVALID_USAGE);
    // The allocator never releases it on its own.
    ASSERT_SP_OK(sp_free(g[0]));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp__pool_segment_count(pool), 2u);
    uint64_t seqs[4];
    size_t n = 0;
    ASSERT_SP_OK(sp__pool_free_segments(pool, seqs, 4, &n));
    ASSERT_EQ(n, 1u);
    EXPECT_EQ(seqs[0], 0u);
    sp_stream_t st = (sp_stream_t)1;
    EXPECT_EQ(sp__pool_sym_detach(pool, 1, &base, &size, &st), SP_ERR_INVALID_USAGE);
    ASSERT_SP_OK(sp__pool_sym_detach(pool, 0, &base, &size, &st));
    EXPECT_EQ(base, mem[0]);
    EXPECT_EQ(size, 20 * MiB);
    EXPECT_EQ(st, nullptr);
    free(base);
    EXPECT_EQ(sp__pool_segment_count(pool), 1u);
    ASSERT_SP_OK(sp_free(g[1]));
    ASSERT_SP_OK(sp_free(t));
    ASSERT_SP_OK(sp__mempool_destroy_internal(pool));
    // Destroy hands the segment pool/ still holds to the callbacks (plain_free frees mem[1]).
    EXPECT_EQ(live_segments, -1);
}

TEST_F(AllocInternal, SeveralDevicesKeepSeparateStats) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "2"}});
    ASSERT_EQ(sp_device_count(), 2);
    void *a, *b;
    ASSERT_SP_OK(sp_malloc(4096, 1, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &b));
    EXPECT_EQ(stat("allocation.all.current", 1), 1);
    sp_mempool_params_t prm;
    sp_mempool_params_init(&prm);
    prm.device = 1;
    sp_mempool_t *pool;
    ASSERT_SP_OK(sp_mempool_create(&prm, &pool));
    ASSERT_SP_OK(sp_mempool_begin(pool));
    void *c, *d;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &c)); // device 0: not routed
    ASSERT_SP_OK(sp_malloc(4096, 1, nullptr, &d)); // device 1: routed
    ASSERT_SP_OK(sp_mempool_end(pool));
    EXPECT_EQ(sp_mempool_used_bytes(pool), 4096u);
    EXPECT_EQ(sp_mempool_used_bytes(sp_default_mempool(0)), 8192u);
    ASSERT_SP_OK(sp_free(a)); // found on device 1 without naming it
    EXPECT_EQ(stat("allocation.all.current", 1), 1);
    EXPECT_EQ(stat("allocation.all.current", 0), 2);
    for (void *p : {b, c, d})
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}

// A new slab is not threaded whole onto the spare list (that wrote, and faulted in, every
// struct of it for a device's first block): structs are taken from it one at a time.
TEST_F(AllocInternal, BlockStructsComeFromTheSlabOneAtATime) {
    void *p;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
    sp_block_structs_t st;
    ASSERT_SP_OK(sp__pool_block_structs(0, &st));
    EXPECT_EQ(st.slabs, 1u);
    EXPECT_EQ(st.spare, 0u);
    EXPECT_GE(st.untouched, 1000u) << "the block and its remainder only";
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp__pool_block_structs(0, &st));
    EXPECT_EQ(st.spare, 1u) << "the merged remainder's struct";
    expect_warnings();
    EXPECT_EQ(sp__pool_block_structs(1, &st), SP_ERR_INVALID_ARGUMENT);
}

// A device's second slab is faulted in whole when it is taken (one madvise instead of a fault per
// page as its structs are handed out); its last pages are then resident before any struct there
// is used. The first slab is not (BlockStructsComeFromTheSlabOneAtATime).
TEST_F(AllocInternal, ASecondSlabIsFaultedInWhenTaken) {
#ifndef MADV_POPULATE_WRITE
    GTEST_SKIP() << "built without MADV_POPULATE_WRITE (glibc before 2.35)";
#else
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *probe = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(probe, MAP_FAILED);
    const bool can = madvise(probe, page, MADV_POPULATE_WRITE) == 0;
    munmap(probe, page);
    if (!can)
        GTEST_SKIP() << "the kernel has no MADV_POPULATE_WRITE (before 5.14)";
    std::vector<void *> ps;
    sp_block_structs_t st;
    ASSERT_SP_OK(sp__pool_block_structs(0, &st));
    const size_t slabs = st.slabs;
    while (ps.size() < 5000 && st.slabs < slabs + 2) {
        void *p;
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
        ps.push_back(p);
        ASSERT_SP_OK(sp__pool_block_structs(0, &st));
    }
    ASSERT_EQ(st.slabs, slabs + 2) << "a second slab was taken";
    EXPECT_GE(st.untouched, 1000u) << "few of its structs handed out";
    // The newest slab ends at the arena's top (nothing else takes struct storage here): the page
    // below the one holding its end lies inside it, among structs not yet handed out.
    const uintptr_t top = (uintptr_t)sp__arena_take(0);
    ASSERT_NE(top, 0u);
    const uintptr_t last = (top - 1) / page * page - page;
    unsigned char in = 0;
    ASSERT_EQ(mincore((void *)last, page, &in), 0);
    EXPECT_TRUE(in & 1) << "the slab's pages were faulted in when it was taken";
    for (void *p : ps)
        ASSERT_SP_OK(sp_free(p));
#endif
}

// sp_shutdown keeps every slab for the next allocator of the device (struct arena memory is never
// unmapped; freeing slabs to malloc let glibc return the heap's top to the kernel, and the next
// allocator faulted it all in again); the next allocator uses them before it takes new ones.
TEST_F(AllocInternal, ShutdownKeepsItsSlabsForTheNextAllocator) {
    std::vector<void *> ps(6000);
    for (auto &p : ps)
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
    sp_block_structs_t st;
    ASSERT_SP_OK(sp__pool_block_structs(0, &st));
    const size_t slabs = st.slabs + st.kept;
    EXPECT_GE(slabs, 6u);
    for (void *p : ps)
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_shutdown());
    const size_t used = sp__arena_used();
    ASSERT_SP_OK(sp_init());
    ASSERT_SP_OK(sp__pool_block_structs(0, &st));
    EXPECT_EQ(st.slabs, 0u);
    EXPECT_EQ(st.kept, slabs) << "every slab outlives sp_shutdown";
    void *p;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
    ASSERT_SP_OK(sp__pool_block_structs(0, &st));
    EXPECT_EQ(st.slabs, 1u);
    EXPECT_EQ(st.kept, slabs - 1) << "a kept slab is used before a new one is taken";
    EXPECT_EQ(sp__arena_used(), used) << "no new struct storage";
    ASSERT_SP_OK(sp_free(p));
}

// A segment's struct room, when the segment is released, waits whole for the next segment: a
// segment needs SP_SEG_SLOTS consecutive structs, so room given to the block spare list could not
// be one again, and every segment made and released took 168 bytes of fresh struct storage for
// good (sp_malloc, sp_free, sp_empty_cache in a loop grew the struct arena, and RSS, without
// bound). After the first round, rounds take no never-used struct and commit no struct memory.
TEST_F(AllocInternal, ReleasedSegmentStructsAreReusedBySegments) {
    auto round = [] {
        void *p;
        ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
        ASSERT_SP_OK(sp_free(p));
        ASSERT_SP_OK(sp_empty_cache());
    };
    round();
    sp_block_structs_t st0, st;
    ASSERT_SP_OK(sp__pool_block_structs(0, &st0));
    EXPECT_EQ(st0.seg_spare, 1u) << "the released segment's struct waits for the next";
    const size_t bytes = sp_x_struct_bytes();
    const int rounds = 6000; // past a slab (1023 structs) and a 256 KiB commit step at 168 B each
    for (int i = 0; i < rounds; i++) {
        round();
        if (HasFatalFailure())
            return;
    }
    ASSERT_SP_OK(sp__pool_block_structs(0, &st));
    EXPECT_EQ(st.slabs, st0.slabs) << "no new slab";
    EXPECT_EQ(st.untouched, st0.untouched) << "no never-used struct taken";
    EXPECT_EQ(st.spare, st0.spare) << "the block spare list does not grow";
    EXPECT_EQ(st.seg_spare, 1u);
    EXPECT_EQ(sp_x_struct_bytes(), bytes) << "no struct memory committed";
    // Several segments released at once wait together and are all taken again (12 MiB: a
    // segment each).
    std::vector<void *> ps(5);
    for (auto &p : ps)
        ASSERT_SP_OK(sp_malloc(12 * MiB, 0, nullptr, &p));
    for (void *p : ps)
        ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_empty_cache());
    ASSERT_SP_OK(sp__pool_block_structs(0, &st));
    EXPECT_EQ(st.seg_spare, 5u);
    for (auto &p : ps)
        ASSERT_SP_OK(sp_malloc(12 * MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp__pool_block_structs(0, &st));
    EXPECT_EQ(st.seg_spare, 0u);
    for (void *p : ps)
        ASSERT_SP_OK(sp_free(p));
}

// A live block costs its 56-byte struct in the struct arena (segments' structs and the arena's
// commit steps add little over many blocks), which sp_x_struct_bytes reports for the metadata
// benchmark; the structs live outside malloc, so malloc's statistics no longer count them.
TEST_F(AllocInternal, ABlockCostsItsStructInTheArena) {
    const size_t n = 100000;
    std::vector<void *> ps(n);
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &ps[0])); // the arena's first steps
    const size_t before = sp_x_struct_bytes();
    for (size_t i = 1; i < n; i++)
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &ps[i]));
    const double per = (double)(sp_x_struct_bytes() - before) / (double)(n - 1);
    EXPECT_GE(per, 50.0); // usable bytes go ahead of use by up to one commit step
    EXPECT_LE(per, 60.0);
    for (void *p : ps)
        ASSERT_SP_OK(sp_free(p));
}

// Out of struct storage for a block struct (no spare one, no slab left, the arena refuses the
// next slab): a cache hit that would split hands out the whole free block instead, as PyTorch's
// allocator never needs a struct it cannot get.
// How many 512-byte mallocs may use up every block struct device 0 can hand out: each takes at
// least one until none is left, and slabs that earlier tests' allocators left (kept across
// sp_shutdown) add theirs, so the bound grows with them when the whole binary runs in one
// process. 2048 per kept slab is above a slab's structs (allocator.c's SLAB_BLOCKS).
static size_t struct_exhaustion_cap() {
    sp_block_structs_t st;
    EXPECT_EQ(sp__pool_block_structs(0, &st), SP_SUCCESS);
    return 100000 + st.kept * 2048;
}

TEST_F(AllocInternal, SplitWithoutAStructHandsOutTheWholeBlock) {
    std::vector<void *> ps;
    sp_block_structs_t st;
    const size_t cap = struct_exhaustion_cap();
    // Use up every struct (spare, kept and the current slab) while the segment keeps room for
    // one more split hit of 512 bytes.
    for (;;) {
        ASSERT_SP_OK(sp__pool_block_structs(0, &st));
        size_t cached = sp_memory_reserved(0) - sp_memory_allocated(0);
        if (st.spare == 0 && st.kept == 0 && st.untouched == 0 && cached >= 1024)
            break;
        void *p;
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
        ps.push_back(p);
        ASSERT_LT(ps.size(), cap);
    }
    size_t cached = sp_memory_reserved(0) - sp_memory_allocated(0);
    void *p = nullptr;
    const size_t old = sp__arena_set_limit(sp__arena_used());
    sp_status_t s = sp_malloc(512, 0, nullptr, &p);
    (void)sp__arena_set_limit(old);
    ASSERT_SP_OK(s);
    sp_block_info_t info;
    ASSERT_SP_OK(sp__pool_lookup(p, &info));
    EXPECT_EQ(info.block_size, cached) << "the free block whole, not split";
    EXPECT_EQ(info.requested_size, 512u);
    EXPECT_EQ(sp_memory_reserved(0), sp_memory_allocated(0));
    ASSERT_SP_OK(sp_free(p));
    for (void *q : ps)
        ASSERT_SP_OK(sp_free(q));
}

// Out of struct storage for a new segment's structs: the request fails with a message that says
// so, the device memory taken for it is given back, and once there is room again it succeeds.
TEST_F(AllocInternal, NoStructStorageForANewSegmentFailsCleanly) {
    std::vector<void *> ps;
    sp_block_structs_t st;
    const size_t cap = struct_exhaustion_cap();
    for (;;) {
        ASSERT_SP_OK(sp__pool_block_structs(0, &st));
        if (st.spare == 0 && st.kept == 0 && st.untouched == 0)
            break;
        void *p;
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
        ps.push_back(p);
        ASSERT_LT(ps.size(), cap);
    }
    const size_t reserved = sp_memory_reserved(0);
    const size_t old = sp__arena_set_limit(sp__arena_used());
    void *big = nullptr;
    expect_warnings();
    sp_status_t s = sp_malloc(8 << 20, 0, nullptr, &big);
    (void)sp__arena_set_limit(old);
    EXPECT_NE(s, SP_SUCCESS);
    EXPECT_NE(std::string(sp_last_error()).find("block structs"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(sp_memory_reserved(0), reserved) << "the new segment's memory was given back";
    ASSERT_SP_OK(sp_malloc(8 << 20, 0, nullptr, &big));
    ASSERT_SP_OK(sp_free(big));
    for (void *q : ps)
        ASSERT_SP_OK(sp_free(q));
}

// sp_malloc's and sp_free's fast paths test one word (core.h's sp__fast_off) that counts every
// reason for them to step aside. Each reason must add its share when it begins and take it back
// when it ends: a share left behind would silently keep every call on the whole path for good,
// a share missing would let the fast paths run past a pool route, a callback or history.
static int fast_off() {
    return __atomic_load_n(&sp__fast_off, __ATOMIC_RELAXED);
}

// The hits take the CAS (the bias is gone or off), not the owner's plain stores.
static bool fast_shared() {
    return !sp__alloc_hits_biased();
}

// A thread that exits inside sp_mempool_begin (two nested pools) never calls sp_mempool_end: its
// exit ends the routings for it, with a warning. They used to stay: the pools' use counts at 2
// for good, so sp_mempool_destroy refused them forever, and the fast paths off for every thread.
TEST_F(AllocInternal, ThreadExitingInsideMempoolBeginEndsItsRoutings) {
    expect_warnings();
    ASSERT_SP_OK(sp_init());
    const int rest = fast_off();
    sp_mempool_t *outer = nullptr, *inner = nullptr;
    ASSERT_SP_OK(sp_mempool_create(nullptr, &outer));
    ASSERT_SP_OK(sp_mempool_create(nullptr, &inner));
    sp_status_t s1 = SP_ERR_INTERNAL, s2 = SP_ERR_INTERNAL;
    void *p = nullptr;
    std::thread t([&] {
        s1 = sp_mempool_begin(outer);
        s2 = sp_mempool_begin(inner);
        (void)sp_malloc(1000, 0, nullptr, &p); // routed into inner
    });
    t.join();
    ASSERT_SP_OK(s1);
    ASSERT_SP_OK(s2);
    EXPECT_EQ(sp_mempool_use_count(outer), 1);
    EXPECT_EQ(sp_mempool_use_count(inner), 1);
    EXPECT_EQ(fast_off(), rest);
    EXPECT_EQ(warnings("a thread exited inside sp_mempool_begin"), 2u);
    ASSERT_NE(p, nullptr);
    ASSERT_SP_OK(sp_free(p));
    EXPECT_SP_OK(sp_mempool_destroy(inner));
    EXPECT_SP_OK(sp_mempool_destroy(outer));
    // The thread's routing is gone: this thread's allocations stay in the default pool.
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &p));
    sp_block_info_t bi;
    ASSERT_SP_OK(sp__pool_lookup(p, &bi));
    EXPECT_EQ(bi.pool, sp_default_mempool(0));
    ASSERT_SP_OK(sp_free(p));
}

// A thread that exits inside sp_mempool_begin while another thread runs sp_shutdown: its
// routing's end (the key's destructor) reads the pool's name for its warning, which the shutdown
// frees; it must pass the shutdown gate first, as every call does (ThreadSanitizer reported the
// read racing the free when it did not; without TSan, no crash and sympool starts again).
TEST_F(AllocInternal, ThreadExitingInsideMempoolBeginWhileShutdownRuns) {
    expect_warnings();
    ASSERT_SP_OK(sp_init());
    for (int round = 0; round < 20; round++) {
        ASSERT_SP_OK(sp_init());
        sp_mempool_t *pool = nullptr;
        ASSERT_SP_OK(sp_mempool_create(nullptr, &pool));
        std::atomic<bool> routed{false};
        sp_status_t s = SP_ERR_INTERNAL;
        std::thread t([&] {
            s = sp_mempool_begin(pool);
            routed.store(true);
        });
        while (!routed.load())
            std::this_thread::yield();
        ASSERT_SP_OK(sp_shutdown()); // the thread's exit runs its key's destructor meanwhile
        t.join();
        ASSERT_SP_OK(s);
    }
    ASSERT_SP_OK(sp_init());
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(AllocInternal, FastPathGateCountsEveryReasonAndReturnsToRest) {
    EXPECT_EQ(fast_off(), SP_FAST_NOT_READY);
    ASSERT_SP_OK(sp_init());
    const int rest = fast_off(); // expandable segments from the environment turn the hit off
    EXPECT_TRUE(rest == 0 || rest == SP_FAST_NO_HIT) << rest;

    sp_mempool_t *pool = nullptr, *inner = nullptr;
    ASSERT_SP_OK(sp_mempool_create(nullptr, &pool));
    ASSERT_SP_OK(sp_mempool_create(nullptr, &inner));
    ASSERT_SP_OK(sp_mempool_begin(pool));
    EXPECT_EQ(fast_off(), rest + SP_FAST_REASON);
    ASSERT_SP_OK(sp_mempool_begin(inner)); // nested: the same thread, one share
    EXPECT_EQ(fast_off(), rest + SP_FAST_REASON);
    ASSERT_SP_OK(sp_mempool_end(inner));
    ASSERT_SP_OK(sp_mempool_end(pool));
    EXPECT_EQ(fast_off(), rest);

    sp__callback_enter();
    sp__callback_enter();
    EXPECT_EQ(fast_off(), rest + SP_FAST_REASON);
    sp__callback_leave();
    EXPECT_EQ(fast_off(), rest + SP_FAST_REASON);
    sp__callback_leave();
    EXPECT_EQ(fast_off(), rest);

    sp_history_params_t hp;
    sp_history_params_init(&hp);
    ASSERT_SP_OK(sp_record_memory_history(&hp));
    hp.enabled = SP_HISTORY_STATE; // a change while on: still one share
    ASSERT_SP_OK(sp_record_memory_history(&hp));
    EXPECT_EQ(fast_off(), rest + SP_FAST_REASON);
    hp.enabled = SP_HISTORY_OFF;
    ASSERT_SP_OK(sp_record_memory_history(&hp));
    ASSERT_SP_OK(sp_record_memory_history(&hp));
    EXPECT_EQ(fast_off(), rest);

    // sp_shutdown ends a route and history still on, and sympool is no longer ready.
    ASSERT_SP_OK(sp_mempool_begin(pool));
    hp.enabled = SP_HISTORY_ALL;
    ASSERT_SP_OK(sp_record_memory_history(&hp));
    EXPECT_EQ(fast_off(), rest + 2 * SP_FAST_REASON);
    ASSERT_SP_OK(sp_shutdown());
    EXPECT_EQ(fast_off(), SP_FAST_NOT_READY);
    {
        sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "roundup_power2_divisions:4"}});
        ASSERT_SP_OK(sp_init());
        EXPECT_EQ(fast_off(), SP_FAST_NO_HIT) << "rounding by divisions is not the plain hit's";
        ASSERT_SP_OK(sp_shutdown());
        EXPECT_EQ(fast_off(), SP_FAST_NOT_READY);
    }
    {
        sp::ScopedEnv env({{"SYMPOOL_NO_CACHING", "1"}});
        ASSERT_SP_OK(sp_init());
        EXPECT_EQ(fast_off(), SP_FAST_NO_HIT + SP_FAST_REASON) << "no caching: neither path";
        ASSERT_SP_OK(sp_shutdown());
        EXPECT_EQ(fast_off(), SP_FAST_NOT_READY);
    }
    {
        // The thread cache's frees look in the thread's own table first: with it in force
        // neither call-free form may run (a free_hit would hand a cached block to the pool
        // behind its cache's back).
        sp::ScopedEnv env(
            {{"SYMPOOL_THREAD_CACHE", "64KiB"}, {"SYMPOOL_EXPANDABLE_SEGMENTS", "0"}});
        ASSERT_SP_OK(sp_init());
        EXPECT_EQ(fast_off(), SP_FAST_NO_HIT + SP_FAST_REASON) << "thread cache: neither path";
        ASSERT_SP_OK(sp_shutdown());
        EXPECT_EQ(fast_off(), SP_FAST_NOT_READY);
    }
    ASSERT_SP_OK(sp_init());
    EXPECT_EQ(fast_off(), rest);
}

// SYMPOOL_LOCK_BIAS=0: no lock is biased, every hit takes the CAS from the start, and the
// calls answer as with the bias.
TEST_F(AllocInternal, LockBiasOffTakesTheCasFromTheStart) {
    sp::ScopedEnv env({{"SYMPOOL_LOCK_BIAS", "0"}});
    ASSERT_SP_OK(sp_init());
    EXPECT_TRUE(fast_shared());
    void *p = nullptr, *q = nullptr;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &q));
    EXPECT_EQ(p, q) << "the cached block again";
    ASSERT_SP_OK(sp_free(q));
    EXPECT_TRUE(fast_shared());
    ASSERT_SP_OK(sp_shutdown());
}

// The bias (core_lock.h): sp_init biases the device locks, each to the first thread that takes
// it (here the test's), whose hits then take them with plain stores (no SP_FAST_SHARED share);
// the first call of another thread revokes the bias and adds the share, once; sp_shutdown gives
// it back; a new init biases the new locks again. Every call gives the same answers either way, and
// the blocks stay consistent across the revocation.
TEST_F(AllocInternal, BiasIsRevokedOnceByASecondThreadAndGivenBackAtShutdown) {
    ASSERT_SP_OK(sp_init());
    if (fast_shared()) {
        ASSERT_SP_OK(sp_shutdown());
        GTEST_SKIP() << "no bias here (no membarrier, or another thread of this binary owned it)";
    }
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p)); // growth
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p)); // the owner's hit
    ASSERT_SP_OK(sp_free(p));
    EXPECT_FALSE(fast_shared()) << "the owner's own calls keep the bias";
    ASSERT_SP_OK(sp_shutdown());
    EXPECT_EQ(__atomic_load_n(&sp__fast_off, __ATOMIC_RELAXED), SP_FAST_NOT_READY);
    ASSERT_SP_OK(sp_init());
    EXPECT_FALSE(fast_shared()) << "a new init biases again";
    const int rest = fast_off();
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p)); // this thread takes the lock first: its owner
    ASSERT_SP_OK(sp_free(p));

    void *q = nullptr;
    std::thread other([&] { ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &q)); });
    other.join();
    EXPECT_TRUE(fast_shared()) << "another thread's call revokes the bias";
    EXPECT_EQ(fast_off(), rest);
    void *r = nullptr;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &r)); // the owner, now with the CAS
    EXPECT_NE(r, q);
    ASSERT_SP_OK(sp_free(q)); // the owner frees the other thread's block
    ASSERT_SP_OK(sp_free(r));
    expect_warnings();
    sp_status_t twice = sp_free(r);
    EXPECT_EQ(twice, SP_ERR_INVALID_USAGE) << "a double free is still seen";
    std::thread again([&] {
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &q));
        ASSERT_SP_OK(sp_free(q));
    });
    again.join();
    ASSERT_SP_OK(sp_shutdown());
    EXPECT_EQ(__atomic_load_n(&sp__fast_off, __ATOMIC_RELAXED), SP_FAST_NOT_READY)
        << "no share left behind";
    std::thread stranger([&] {
        ASSERT_SP_OK(sp_init());
        EXPECT_FALSE(fast_shared()) << "a new init biases again";
        void *x = nullptr;
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &x));
        ASSERT_SP_OK(sp_free(x));
        EXPECT_FALSE(fast_shared());
        ASSERT_SP_OK(sp_shutdown());
    });
    stranger.join();
    EXPECT_EQ(__atomic_load_n(&sp__fast_off, __ATOMIC_RELAXED), SP_FAST_NOT_READY);
    ASSERT_SP_OK(sp_init());
    EXPECT_FALSE(fast_shared()) << "the owner's next init biases again";
}

// Two threads taking turns, each turn longer than a streak, so the lock's bias moves to the
// thread whose turn it is and is revoked at the next turn, every turn, and the waiting thread
// takes a pair now and then in the middle of the other's turn: each thread keeps blocks across
// turns and frees some of the other's. Every address handed out is entered in a set of live
// addresses, and taken out before its free: an address handed out while live (a block given
// twice, or a free set changed by two threads at once) shows there. (Addresses only: under the
// CUDA double a block is device memory.) Nothing is left allocated at the end.
TEST_F(AllocInternal, TurnsLongerThanAStreakMoveTheBiasAndKeepEveryBlock) {
    ASSERT_SP_OK(sp_init());
    if (fast_shared()) {
        ASSERT_SP_OK(sp_shutdown());
        GTEST_SKIP() << "no bias here (no membarrier, or another thread of this binary owned it)";
    }
    sp__lock_streak_pin(1024);
    std::mutex live_lock;
    std::set<void *> live;
    std::atomic<int> turn{0}, bad{0}, failed{0};
    std::atomic<int> progress{0}; // the pairs done in this turn by the thread whose turn it is
    auto take = [&](size_t size) -> void * {
        void *q = nullptr;
        if (sp_malloc(size, 0, nullptr, &q) != SP_SUCCESS) {
            failed.fetch_add(1);
            return nullptr;
        }
        std::lock_guard<std::mutex> g(live_lock);
        if (!live.insert(q).second)
            bad.fetch_add(1);
        return q;
    };
    auto give = [&](void *q) {
        {
            std::lock_guard<std::mutex> g(live_lock);
            if (live.erase(q) != 1)
                bad.fetch_add(1);
        }
        if (sp_free(q) != SP_SUCCESS)
            failed.fetch_add(1);
    };
    std::vector<void *> shared_blocks; // handed across turns (the turn's thread alone touches it)
    bool biased_in_a_turn = false;
    const int turns = 24, pairs = 1500;
    auto worker = [&](int id) {
        std::vector<void *> mine;
        unsigned seed = 977u * (unsigned)(id + 1);
        for (int t = id; t < turns; t += 2) {
            // While the other thread has its turn, a pair now and then: a revocation in the
            // middle of its streak or of its bias, with both threads inside sp_malloc at once.
            // Only in the first half of the turn: with an idle core each, yield returns at once
            // and these pairs would come more often than a streak's takes, so no turn would end
            // biased; the second half (750 pairs, 1500 takes) is longer than a streak.
            for (int w = 0; turn.load() != t; w++) {
                if (w % 64 != 63 || progress.load(std::memory_order_relaxed) >= pairs / 2) {
                    std::this_thread::yield();
                    continue;
                }
                if (void *q = take(4096))
                    give(q);
            }
            for (int i = 0; i < pairs; i++) {
                progress.store(i, std::memory_order_relaxed);
                seed = seed * 1103515245u + 12345u;
                void *q = take(512u << ((seed >> 16) % 8)); // 512 B .. 64 KiB
                if (q == nullptr)
                    continue;
                if (i % 97 == 0)
                    mine.push_back(q);
                else
                    give(q);
            }
            if (t >= 2 && !fast_shared())
                biased_in_a_turn = true;
            // Free half of what the other thread left, leave half of this thread's for it.
            std::vector<void *> keep;
            for (size_t k = 0; k < shared_blocks.size(); k++) {
                if (k % 2 == 0)
                    give(shared_blocks[k]);
                else
                    keep.push_back(shared_blocks[k]);
            }
            keep.insert(keep.end(), mine.begin(), mine.end());
            mine.clear();
            shared_blocks.swap(keep);
            progress.store(0, std::memory_order_relaxed);
            turn.store(t + 1);
        }
    };
    std::thread a(worker, 0), b(worker, 1);
    a.join();
    b.join();
    for (void *q : shared_blocks)
        give(q);
    EXPECT_EQ(bad.load(), 0) << "an address handed out while live, or freed twice";
    EXPECT_EQ(failed.load(), 0);
    EXPECT_TRUE(biased_in_a_turn) << "the bias never followed a turn";
    EXPECT_TRUE(live.empty());
    EXPECT_EQ(sp_memory_allocated(0), 0u);
    sp__lock_streak_pin(0);
    ASSERT_SP_OK(sp_shutdown());
}

// Re-biasing (core_lock.h): after another thread's call revoked the bias, a thread that then
// allocates alone gets the lock biased to itself after SP_LOCK_STREAK CAS takes (two a pair), and
// its hits leave the CAS; the first owner's next call revokes again. The blocks stay the same
// blocks throughout (best fit does not depend on the lock's form).
TEST_F(AllocInternal, AThreadThatAllocatesAloneGetsTheBiasBack) {
    ASSERT_SP_OK(sp_init());
    if (fast_shared()) {
        ASSERT_SP_OK(sp_shutdown());
        GTEST_SKIP() << "no bias here (no membarrier, or another thread of this binary owned it)";
    }
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p)); // this thread owns the first bias
    ASSERT_SP_OK(sp_free(p));
    void *first = p;
    sp__lock_streak_pin(1024); // the test counts takes (the streak follows the barrier's cost)
    bool shared_after_revocation = false, biased_after_streak = false;
    int moved = 0;
    std::thread other([&] {
        void *q = nullptr;
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &q)); // revokes
        ASSERT_SP_OK(sp_free(q));
        shared_after_revocation = fast_shared();
        for (int i = 0; i < 1024; i++) { // 2048 takes: a streak
            ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &q));
            moved += q != first;
            ASSERT_SP_OK(sp_free(q));
        }
        biased_after_streak = !fast_shared();
    });
    other.join();
    EXPECT_TRUE(shared_after_revocation);
    EXPECT_TRUE(biased_after_streak) << "the hits take the re-biased copies";
    EXPECT_EQ(moved, 0) << "every pair took the same cached block";
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p)); // revokes the re-bias (its owner ended)
    EXPECT_EQ(p, first);
    ASSERT_SP_OK(sp_free(p));
    EXPECT_TRUE(fast_shared());
    expect_warnings();
    EXPECT_EQ(sp_free(p), SP_ERR_INVALID_USAGE) << "a double free is still seen";
    sp__lock_streak_pin(0);
    ASSERT_SP_OK(sp_shutdown());
    ASSERT_SP_OK(sp_init());
    EXPECT_FALSE(fast_shared()) << "a new init biases again";
}
