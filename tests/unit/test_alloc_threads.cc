// test_alloc_threads.cc: any thread may allocate and free (ThreadSanitizer-friendly: suites are
// named Threads*). Four threads allocate and free mixed sizes, also freeing each other's blocks;
// at the end every counter balances.
#include "alloc_test_util.hpp"

#include <atomic>
#include <thread>
#include <vector>

using namespace sp;

class ThreadsAlloc : public sp::Test {};

TEST_F(ThreadsAlloc, FourThreadsMallocFree) {
    const size_t sizes[] = {512, 3000, 64 * KiB, MiB, 4 * MiB};
    std::atomic<int> failures{0};
    std::vector<std::thread> ts;
    std::vector<void *> handoff[4];
    for (int t = 0; t < 4; t++) {
        ts.emplace_back([&, t] {
            std::vector<void *> live;
            for (int i = 0; i < 4000; i++) {
                void *p = nullptr;
                if (sp_malloc(sizes[(i + t) % 5], 0, nullptr, &p) != SP_SUCCESS || !p) {
                    failures++;
                    continue;
                }
                live.push_back(p);
                if (live.size() > 8) {
                    if (sp_free(live.front()) != SP_SUCCESS)
                        failures++;
                    live.erase(live.begin());
                }
            }
            handoff[t] = live; // freed by another thread below
        });
    }
    for (auto &th : ts)
        th.join();
    ts.clear();
    for (int t = 0; t < 4; t++) {
        ts.emplace_back([&, t] {
            for (void *p : handoff[(t + 1) % 4])
                if (sp_free(p) != SP_SUCCESS)
                    failures++;
        });
    }
    for (auto &th : ts)
        th.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("active_bytes.all.current"), 0);
    EXPECT_EQ(stat("requested_bytes.all.current"), 0);
    EXPECT_EQ(stat("allocation.all.allocated"), 16000);
    EXPECT_EQ(stat("inactive_split.all.current"), 0);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST_F(ThreadsAlloc, RoutingIsPerThread) {
    sp_mempool_t *pool;
    ASSERT_SP_OK(sp_mempool_create(nullptr, &pool));
    ASSERT_SP_OK(sp_mempool_begin(pool));
    void *mine, *theirs = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &mine));
    std::thread th([&] { EXPECT_EQ(sp_malloc(4096, 0, nullptr, &theirs), SP_SUCCESS); });
    th.join();
    ASSERT_SP_OK(sp_mempool_end(pool));
    EXPECT_EQ(sp_mempool_used_bytes(pool), 4096u);
    EXPECT_EQ(sp_mempool_used_bytes(sp_default_mempool(0)), 4096u);
    ASSERT_SP_OK(sp_free(mine));
    ASSERT_SP_OK(sp_free(theirs));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}
