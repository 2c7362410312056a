// test_threads_shutdown.cc: sp_shutdown racing the cold calls of other threads (statistics,
// empty_cache, summaries, snapshots, MemPools, streams). Each such call either runs whole (with
// the allocator it found) or is refused with SP_ERR_INVALID_USAGE; never a use after free (the
// ASan and TSan builds run this too).
#include "alloc_test_util.hpp"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <sympool/mempool.h>
#include <sympool/summary.h>

class ThreadsShutdown : public sp::Test {};

TEST_F(ThreadsShutdown, ColdCallsDuringShutdownRunWholeOrAreRefused) {
    expect_warnings();
    std::atomic<bool> stop{false};
    std::atomic<int> bad{0}, refused{0}, ran{0};
    auto check = [&](sp_status_t s, const char *what) {
        if (s == SP_SUCCESS)
            ran++;
        else if (s == SP_ERR_INVALID_USAGE &&
                 std::string(sp_last_error()).find("while sp_shutdown runs") != std::string::npos)
            refused++;
        else {
            bad++;
            ADD_FAILURE() << what << ": " << sp_status_name(s) << ": " << sp_last_error();
        }
    };
    std::vector<std::thread> ts;
    ts.emplace_back([&] {
        while (!stop) {
            sp_stats_t st;
            check(sp_memory_stats(0, &st), "sp_memory_stats");
            (void)sp_memory_reserved(0);
            (void)sp_backend_name();
            check(sp_reset_peak_memory_stats(0), "sp_reset_peak_memory_stats");
        }
    });
    ts.emplace_back([&] {
        while (!stop) {
            check(sp_empty_cache(), "sp_empty_cache");
            size_t f = 0, t = 0;
            check(sp_get_memory_info(0, &f, &t), "sp_get_memory_info");
        }
    });
    ts.emplace_back([&] {
        char buf[4096];
        while (!stop) {
            check(sp_memory_summary(0, buf, sizeof buf), "sp_memory_summary");
            sp_mempool_t *p = nullptr;
            sp_status_t s = sp_mempool_create(nullptr, &p);
            check(s, "sp_mempool_create");
            if (s == SP_SUCCESS) {
                s = sp_mempool_destroy(p);
                // A pool created before a shutdown is a stale handle after it.
                if (s != SP_SUCCESS && s != SP_ERR_INVALID_USAGE)
                    check(s, "sp_mempool_destroy");
            }
        }
    });
    // Every thread is running its calls before the shutdowns start (a loaded machine may not
    // have scheduled them yet); no sleep, no timing.
    while (ran.load() < 3 && bad.load() == 0)
        std::this_thread::yield();
    for (int i = 0; i < 300; i++) {
        void *p = nullptr;
        ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p)); // a segment for the others to see
        ASSERT_SP_OK(sp_free(p));
        ASSERT_SP_OK(sp_shutdown());
    }
    stop = true;
    for (auto &t : ts)
        t.join();
    EXPECT_EQ(bad.load(), 0);
}

// The pool calls outside pool.h's exemption (queries, routing, sp_default_mempool) take the
// pool's device lock, which lives in what sp_shutdown frees: each must count itself in (or be
// refused) as the cold calls above do. Before they did, this read freed memory (ASan:
// heap-use-after-free in sp_mempool_used_bytes; the plain build aborted or hung).
TEST_F(ThreadsShutdown, PoolQueriesAndRoutingDuringShutdownRunWholeOrAreRefused) {
    expect_warnings();
    std::atomic<bool> stop{false};
    std::atomic<int> bad{0}, ran{0};
    std::thread t([&] {
        while (!stop) {
            sp_mempool_t *d = sp_default_mempool(0); // NULL while a shutdown runs
            if (!d)
                continue;
            (void)sp_mempool_used_bytes(d);
            (void)sp_mempool_total_bytes(d);
            (void)sp_mempool_free_bytes(d);
            (void)sp_mempool_n_free_blocks(d);
            (void)sp_mempool_get_limit(d);
            sp_status_t s = sp_mempool_begin(d);
            if (s == SP_SUCCESS) {
                ran++;
                s = sp_mempool_end(d);
                // The routing a shutdown ended is gone: its end is misuse, nothing worse.
                if (s != SP_SUCCESS && s != SP_ERR_INVALID_USAGE) {
                    bad++;
                    ADD_FAILURE() << "sp_mempool_end: " << sp_status_name(s);
                }
            } else if (s != SP_ERR_INVALID_USAGE) { // refused, or a handle from before it
                bad++;
                ADD_FAILURE() << "sp_mempool_begin: " << sp_status_name(s) << ": "
                              << sp_last_error();
            }
        }
    });
    while (ran.load() < 1 && bad.load() == 0)
        std::this_thread::yield();
    for (int i = 0; i < 300; i++) {
        void *p = nullptr;
        ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
        ASSERT_SP_OK(sp_free(p));
        ASSERT_SP_OK(sp_shutdown());
    }
    stop = true;
    t.join();
    EXPECT_EQ(bad.load(), 0);
}
