// test_mempool_gc.cc: a destroyed MemPool's struct goes once the pool holds no segment (as
// PyTorch erases a freeable private pool at emptyCache once its cudaMalloc count is 0), not at
// sp_shutdown: every create/destroy cycle kept one, and sp_empty_cache walked them all. A pool
// destroyed with a live block stays until that block is freed and its segment released. A handle
// of a released pool stays recognized (SP_ERR_INVALID_USAGE), is never read through, and never
// names a later pool. sp_x_mempool_structs (experimental.h) counts the structs held.
#include "sp_test.hpp"

#include "sympool/experimental.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

using sp::MiB;

namespace {

// Every call that takes a pool refuses a released one as a destroyed one, and reads nothing.
void expect_released(sp_mempool_t *pool) {
    void *p = &p;
    EXPECT_SP_STATUS(sp_mempool_destroy(pool), SP_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(sp_last_error()).find("destroyed"), std::string::npos) << sp_last_error();
    EXPECT_SP_STATUS(sp_mempool_begin(pool), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(sp_mempool_end(pool), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, 4096, nullptr, &p), SP_ERR_INVALID_USAGE);
    EXPECT_EQ(p, (void *)&p);
    EXPECT_SP_STATUS(sp_mempool_free_all_blocks(pool, nullptr), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(sp_mempool_set_limit(pool, MiB), SP_ERR_INVALID_USAGE);
    EXPECT_EQ(sp_mempool_use_count(pool), 0);
    EXPECT_EQ(sp_mempool_total_bytes(pool), 0u);
    EXPECT_EQ(sp_mempool_id(pool).second, 0u);
}

} // namespace

class MempoolGc : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        expect_warnings(); // the refused calls on released handles say why
    }
};

TEST_F(MempoolGc, DestroyedEmptyPoolsAreReleased) {
    ASSERT_NE(sp_default_mempool(0), nullptr); // the default pools exist before the count
    size_t base = sp_x_mempool_structs();
    std::vector<sp_mempool_t *> gone;
    for (int i = 0; i < 2000; i++) {
        sp_mempool_t *pool = sp::make_named_pool(i % 2 ? "cached" : "empty");
        ASSERT_NE(pool, nullptr);
        if (i % 2) { // one cached free segment, which the destroy releases
            void *p = nullptr;
            ASSERT_SP_OK(sp_mempool_malloc(pool, 4096, nullptr, &p));
            ASSERT_SP_OK(sp_free(p));
        }
        ASSERT_SP_OK(sp_mempool_destroy(pool));
        gone.push_back(pool);
    }
    EXPECT_EQ(sp_x_mempool_structs(), base) << "destroyed pools' structs are still held";
    EXPECT_EQ(sp_memory_reserved(0), 0u);
    ASSERT_SP_OK(sp_empty_cache());
    expect_released(gone.front());
    expect_released(gone.back());
    // New pools never take a released pool's handle: the old handle would name them.
    std::set<sp_mempool_t *> old(gone.begin(), gone.end());
    std::vector<sp_mempool_t *> fresh;
    for (int i = 0; i < 64; i++) {
        fresh.push_back(sp::make_named_pool("fresh"));
        ASSERT_NE(fresh.back(), nullptr);
        EXPECT_EQ(old.count(fresh.back()), 0u) << "a new pool got a released pool's handle";
    }
    expect_released(gone.front());
    for (sp_mempool_t *f : fresh)
        ASSERT_SP_OK(sp_mempool_destroy(f));
    EXPECT_EQ(sp_x_mempool_structs(), base);
}

TEST_F(MempoolGc, PoolWithALiveBlockStaysUntilTheBlockIsFreedAndItsSegmentReleased) {
    ASSERT_NE(sp_default_mempool(0), nullptr);
    size_t base = sp_x_mempool_structs();
    sp_mempool_t *pool = sp::make_named_pool("held");
    ASSERT_NE(pool, nullptr);
    void *p = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 4096, nullptr, &p));
    sp_mempool_id_t id = sp_mempool_id(pool);
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_empty_cache()); // the segment holds a live block: it stays, and the pool
    EXPECT_EQ(sp_x_mempool_structs(), base + 1);
    EXPECT_EQ(sp_mempool_id(pool).second, id.second);
    EXPECT_EQ(sp_mempool_used_bytes(pool), 4096u);
    ASSERT_SP_OK(sp_free(p));
    // Freed, its segment is cached until the cache is emptied (PyTorch: a freeable pool's
    // segments go at emptyCache), and the pool with it.
    EXPECT_EQ(sp_x_mempool_structs(), base + 1);
    EXPECT_EQ(sp_mempool_total_bytes(pool), 2 * MiB);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp_x_mempool_structs(), base);
    EXPECT_EQ(sp_memory_reserved(0), 0u);
    expect_released(pool);
}

TEST_F(MempoolGc, ReleasedPoolsAreNotWalkedByLaterCalls) {
    // A pool created after many released ones is still found by every walk (stats, empty_cache,
    // free_all_blocks), and the released ones are not: their segments are gone with them.
    ASSERT_NE(sp_default_mempool(0), nullptr);
    size_t base = sp_x_mempool_structs();
    sp_mempool_t *keep = sp::make_named_pool("keep");
    ASSERT_NE(keep, nullptr);
    for (int i = 0; i < 500; i++) {
        sp_mempool_t *pool = sp::make_named_pool("gone");
        ASSERT_NE(pool, nullptr);
        ASSERT_SP_OK(sp_mempool_destroy(pool));
    }
    sp_mempool_t *last = sp::make_named_pool("last");
    ASSERT_NE(last, nullptr);
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(keep, 4096, nullptr, &a));
    ASSERT_SP_OK(sp_mempool_malloc(last, 4096, nullptr, &b));
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    EXPECT_EQ(sp_memory_reserved(0), 4 * MiB);
    ASSERT_SP_OK(sp_mempool_destroy(last));
    ASSERT_SP_OK(sp_mempool_destroy(keep));
    EXPECT_EQ(sp_memory_reserved(0), 0u);
    EXPECT_EQ(sp_x_mempool_structs(), base);
}

TEST_F(MempoolGc, ConcurrentCallsOnHandlesBeingReleased) {
    // Threads query and misuse handles of pools another thread destroys and whose segments a
    // third releases: every call either answers or refuses, none reads a released struct (under
    // ASan/TSan: no use after free, no race), and every pool goes.
    ASSERT_NE(sp_default_mempool(0), nullptr);
    size_t base = sp_x_mempool_structs();
    constexpr int kPools = 600;
    std::vector<std::atomic<sp_mempool_t *>> handles(kPools);
    for (auto &h : handles)
        h.store(nullptr);
    std::atomic<bool> done{false};
    std::vector<std::thread> readers;
    for (int t = 0; t < 2; t++)
        readers.emplace_back([&, t] {
            uint32_t x = 12345u + (uint32_t)t;
            while (!done.load()) {
                x = x * 1103515245u + 12345u;
                sp_mempool_t *pool = handles[(x >> 8) % kPools].load();
                if (!pool)
                    continue;
                (void)sp_mempool_used_bytes(pool);
                (void)sp_mempool_id(pool);
                sp_status_t s = sp_mempool_set_limit(pool, 0);
                EXPECT_TRUE(s == SP_SUCCESS || s == SP_ERR_INVALID_USAGE) << sp::describe(s);
                s = sp_mempool_free_all_blocks(pool, nullptr);
                EXPECT_TRUE(s == SP_SUCCESS || s == SP_ERR_INVALID_USAGE) << sp::describe(s);
            }
        });
    std::thread emptier([&] {
        while (!done.load())
            EXPECT_SP_OK(sp_empty_cache());
    });
    std::vector<void *> live;
    for (int i = 0; i < kPools; i++) {
        sp_mempool_t *pool = sp::make_named_pool("raced");
        ASSERT_NE(pool, nullptr);
        void *p = nullptr;
        ASSERT_SP_OK(sp_mempool_malloc(pool, 4096, nullptr, &p));
        handles[i].store(pool);
        if (i % 3 == 0) {
            live.push_back(p); // destroyed under a live block: freed later
        } else {
            ASSERT_SP_OK(sp_free(p));
        }
        ASSERT_SP_OK(sp_mempool_destroy(pool));
        if (i % 50 == 49) {
            for (void *q : live)
                ASSERT_SP_OK(sp_free(q));
            live.clear();
        }
    }
    for (void *q : live)
        ASSERT_SP_OK(sp_free(q));
    done.store(true);
    for (auto &r : readers)
        r.join();
    emptier.join();
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp_x_mempool_structs(), base);
    EXPECT_EQ(sp_memory_reserved(0), 0u);
}

namespace {

// ReleaseWaitsForAnAllocationStandingOnTheDroppedPool's segment allocator: its free, when armed,
// has another thread make one gated call (whose leaving releases the waiting slots) and waits
// for it, at most a while: with the fix that call waits for the device lock this free runs under.
std::atomic<bool> g_arm_other{false};
std::thread g_other;

void *plug_alloc(size_t size, int, sp_stream_t, void *) {
    return aligned_alloc(4096, (size + 4095) / 4096 * 4096);
}

void plug_free(void *ptr, size_t, int, sp_stream_t, void *) {
    free(ptr);
    if (!g_arm_other.exchange(false))
        return;
    auto done = std::make_shared<std::atomic<bool>>(false);
    g_other = std::thread([done] {
        (void)sp_mempool_use_count(nullptr); // in and out of the gate: nothing else
        done->store(true);
    });
    for (int i = 0; i < 500 && !done->load(); i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

} // namespace

TEST_F(MempoolGc, ReleaseWaitsForAnAllocationStandingOnTheDroppedPool) {
    // sp_malloc is outside the shutdown gate. Its OOM retry releases the cache of every freeable
    // pool under the device lock; releasing a destroyed pool's last segment drops the pool, and
    // the walk then reads the dropped struct for its `next`. A gated call that another thread
    // leaves meanwhile (here, from inside that segment's free) must not release the slot under
    // the walk: released with its page's other slots, the page reads as zeros, the walk ended
    // there, the next pool's cache stayed, and the allocation failed with OOM.
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "100MiB"}});
    ASSERT_NE(sp_default_mempool(0), nullptr);
    size_t base = sp_x_mempool_structs();
    static const sp_allocator_t al = {plug_alloc, plug_free, nullptr};
    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    params.allocator = &al;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const size_t per = page / 512; // slots of a page (handles.c: SP_HANDLE_SLOT)
    // The first pool of a page, then the rest of that page, in order.
    std::vector<sp_mempool_t *> row;
    for (size_t i = 0; i < per && row.empty(); i++) {
        sp_mempool_t *pool = nullptr;
        ASSERT_SP_OK(sp_mempool_create(&params, &pool));
        if ((uintptr_t)pool % page == 0)
            row.push_back(pool);
        else
            ASSERT_SP_OK(sp_mempool_destroy(pool));
    }
    ASSERT_EQ(row.size(), 1u) << "no pool began a page";
    while (row.size() < per) {
        sp_mempool_t *pool = nullptr;
        ASSERT_SP_OK(sp_mempool_create(&params, &pool));
        ASSERT_EQ((uintptr_t)pool, (uintptr_t)row[0] + 512 * row.size()) << "slots in order";
        row.push_back(pool);
    }
    for (size_t i = 0; i + 1 < per; i++)
        ASSERT_SP_OK(sp_mempool_destroy(row[i])); // empty: released at once
    // The page's last pool: destroyed under a live block, whose free leaves its segment cached.
    sp_mempool_t *last = row.back();
    void *p = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(last, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_mempool_destroy(last));
    ASSERT_SP_OK(sp_free(p));
    // The pool after it in the device's list: 40 MiB cached, of 100.
    sp_mempool_t *after = sp::make_named_pool("after");
    ASSERT_NE(after, nullptr);
    ASSERT_SP_OK(sp_mempool_malloc(after, 40 * MiB, nullptr, &p));
    ASSERT_SP_OK(sp_mempool_destroy(after));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_EQ(sp_memory_reserved(0), 40 * MiB + 2 * MiB);
    // 70 MiB fits only once `after`'s cache is released, which the walk reaches through `last`.
    g_arm_other.store(true);
    void *q = nullptr;
    sp_status_t s = sp_malloc(70 * MiB, 0, nullptr, &q);
    if (g_other.joinable())
        g_other.join();
    EXPECT_FALSE(g_arm_other.load()) << "the walk never released `last`'s segment";
    ASSERT_SP_OK(s);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp_x_mempool_structs(), base);
}
