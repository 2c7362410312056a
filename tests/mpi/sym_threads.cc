// sym_threads.cc: symmetric growth holds no pool or device lock while ranks wait for each other
// Two threads each grow their own symmetric pool, in opposite orders on the
// two ranks, and both succeed well inside the deadline (with the device lock held across a
// growth, as before, each rank's first growth would wait for the other rank's second, which
// waits for the lock: a deadlock until the deadline). And an sp_malloc from a third thread
// completes while a growth waits for a late rank. The lateness is placed inside the growth
// (after the call's first rounds) with symmetric/'s test hook sp__sym_test_set_grow_delay.
// Run at 2 ranks with MPI_THREAD_MULTIPLE (registered in tests/cmake/symmetric.cmake; not part
// of the tests/mpi/test_*.cc glob).
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "mpi_util.hpp"

extern "C" void sp__sym_test_set_grow_delay(double seconds);

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

class SymThreads : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w_));
        ASSERT_SP_OK(sym_pool_create(w_, "a", false, &pool_[0]));
        ASSERT_SP_OK(sym_pool_create(w_, "b", false, &pool_[1]));
    }
    void TearDown() override {
        for (auto &p : pool_)
            if (p)
                EXPECT_SP_OK(sp_symmetric_mempool_destroy(p));
        if (w_)
            EXPECT_SP_OK(sp_world_finalize(w_));
        sp::Test::TearDown();
    }
    sp_world_t *w_ = nullptr;
    sp_mempool_t *pool_[2] = {nullptr, nullptr};
};

TEST_F(SymThreads, TwoPoolsGrowInOppositeOrdersOnTwoRanks) {
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "20"}});
    const int kGrowths = 3;
    const size_t kSize = 12 * sp::MiB; // large: one segment per live block
    sp_sym_counters_t before = sym_counters();
    // Rank 0 grows pool a first, rank 1 pool b first: the other pool's thread enters each
    // growth 300 ms late, so each rank's first growth waits for the other rank's late thread
    // while that rank's own first growth is under way.
    int first = mpi_rank() % 2;
    std::atomic<int> failures{0};
    double took[2] = {0, 0};
    void *ptrs[2][kGrowths] = {};
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    auto grow = [&](int which) {
        sp__sym_test_set_grow_delay(which != first ? 0.3 : 0.0);
        for (int i = 0; i < kGrowths; i++)
            if (sp_symmetric_malloc(pool_[which], kSize, nullptr, &ptrs[which][i]) != SP_SUCCESS)
                failures++;
        took[which] = since(t0);
        sp__sym_test_set_grow_delay(0.0);
    };
    std::thread ta(grow, 0), tb(grow, 1);
    ta.join();
    tb.join();
    EXPECT_EQ(failures.load(), 0) << sp_last_error();
    for (int which = 0; which < 2; which++) {
        EXPECT_LT(took[which], 5.0) << "pool " << which << ": not well inside the 20 s deadline";
        for (int i = 0; i < kGrowths; i++) {
            sp_window_info_t wi{};
            ASSERT_SP_OK(sp_symmetric_window(ptrs[which][i], &wi));
            long long lo, hi;
            rank_minmax((long long)wi.segment_seq, &lo, &hi);
            EXPECT_EQ(lo, hi) << "pool " << which << " growth " << i;
        }
    }
    sp_sym_counters_t after = sym_counters();
    EXPECT_EQ(after.growths - before.growths, 2 * kGrowths);
    if (mpi_rank() == 0)
        std::printf("sym-threads: opposite-order growths took %.3f s and %.3f s\n", took[0],
                    took[1]);
    for (auto &row : ptrs)
        for (void *p : row)
            ASSERT_SP_OK(sp_free(p));
}

TEST_F(SymThreads, MallocFromAnotherThreadCompletesWhileAGrowthWaits) {
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "20"}});
    const double kLate = 2.0; // rank 1 enters the growth this late
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    void *sym = nullptr;
    std::atomic<bool> grown{false};
    std::thread g([&] {
        sp__sym_test_set_grow_delay(mpi_rank() == 1 ? kLate : 0.0);
        EXPECT_SP_OK(sp_symmetric_malloc(pool_[0], 16 * sp::MiB, nullptr, &sym));
        grown = true;
    });
    double malloc_done = -1;
    if (mpi_rank() == 0) {
        // Let the growth start waiting for rank 1, then allocate new device memory (the device
        // lock and a new segment of the default pool) and free it.
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        auto t1 = Clock::now();
        void *p = nullptr;
        EXPECT_SP_OK(sp_malloc(30 * sp::MiB, sp_world_device(w_), nullptr, &p));
        EXPECT_SP_OK(sp_free(p));
        malloc_done = since(t1);
        EXPECT_FALSE(grown.load()) << "the growth did not wait for the late rank";
    }
    g.join();
    double growth_done = since(t0);
    if (mpi_rank() == 0) {
        EXPECT_LT(malloc_done, 0.5) << "sp_malloc waited for the growth";
        EXPECT_GE(growth_done, kLate * 0.9);
        std::printf("sym-threads: sp_malloc took %.4f s while the growth waited %.3f s\n",
                    malloc_done, growth_done);
    }
    ASSERT_SP_OK(sp_free(sym));
}

} // namespace
