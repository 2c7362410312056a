// sym_threads.cc: symmetric growth holds no pool or device lock while ranks wait for each other
// Two threads each grow their own symmetric pool, in opposite orders on the
// two ranks, and both succeed well inside the deadline (with the device lock held across a
// growth, as before, each rank's first growth would wait for the other rank's second, which
// waits for the lock: a deadlock until the deadline). And an sp_malloc from a third thread
// completes while a growth waits for a late rank. The lateness is placed inside the growth
// (after the call's first rounds) with symmetric/'s test hook sp__sym_test_set_grow_delay.
// And the local queries on a pool's buffers (and a collective on them) answer while another
// thread's call on that pool waits for a late rank.
// Run at 2 ranks with MPI_THREAD_MULTIPLE (registered in tests/cmake/symmetric.cmake; not part
// of the tests/mpi/test_*.cc glob).
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "mpi_util.hpp"

extern "C" {
#include <sympool/collectives.h>
}

extern "C" void sp__sym_test_set_grow_delay(double seconds);
extern "C" uint64_t sp__agree_rounds(void);
extern "C" size_t sp__sym_retired_count(void);

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
    // Rank 0's second thread: a symmetric malloc of 4 KiB on pool "a", returned once its
    // agreement round has started (its call holds the pool until rank 1's next call on it).
    std::thread malloc_holding_the_pool(void **out, sp_status_t *got) {
        uint64_t r0 = sp__agree_rounds();
        std::thread t(
            [this, out, got] { *got = sp_symmetric_malloc(pool_[0], 4096, nullptr, out); });
        while (sp__agree_rounds() == r0)
            std::this_thread::yield();
        return t;
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

// The local queries on a symmetric buffer (sp_symmetric_window, sp_symmetric_peer_ptr, and the
// window probe every host collective makes before it moves data) answer while another thread's
// call on the same pool waits for a late rank. Rank 1 makes its matching sp_symmetric_malloc
// only after rank 0's queries have answered, so a query that waited for the pool's call (its
// lock was held across the agreement round) would leave that call to time out: no timing here,
// the order of events decides.
TEST_F(SymThreads, QueriesAnswerWhileACallOnThePoolWaitsForALateRank) {
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "10"}});
    void *buf = nullptr, *next = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_[0], 4096, nullptr, &buf));
    // A peer's pointer on the host backend (the mpi registrar maps peers); on cuda NCCL 2.28 maps
    // none, so the query asks for this rank's own byte (the same lookup, under the same lock).
    const bool host = std::string(sp_backend_name()) == "host";
    const int peer = host ? (mpi_rank() + 1) % 2 : mpi_rank();
    MPI_Barrier(MPI_COMM_WORLD);
    int token = 0;
    if (mpi_rank() == 0) {
        sp_status_t got = SP_ERR_INTERNAL;
        std::thread a = malloc_holding_the_pool(&next, &got);
        sp_window_info_t wi{};
        void *pp = nullptr;
        EXPECT_SP_OK(sp_symmetric_window(buf, &wi));
        EXPECT_SP_OK(sp_symmetric_peer_ptr(buf, peer, &pp));
        EXPECT_NE(pp, nullptr);
        MPI_Send(&token, 1, MPI_INT, 1, 77, MPI_COMM_WORLD);
        a.join();
        EXPECT_EQ(got, SP_SUCCESS) << sp_status_name(got);
    } else if (mpi_rank() == 1) {
        MPI_Recv(&token, 1, MPI_INT, 0, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        EXPECT_SP_OK(sp_symmetric_malloc(pool_[0], 4096, nullptr, &next));
    }
    if (next)
        EXPECT_SP_OK(sp_free(next));
    EXPECT_SP_OK(sp_free(buf));
}

// The same for a collective on the pool's buffers: a host all-reduce asks whether its buffers
// are in windows after the ranks agreed, while rank 1 is already moving the data; it must not
// wait for rank 0's other thread, whose call waits for rank 1's next one.
TEST_F(SymThreads, CollectiveOnThePoolsBuffersRunsWhileACallOnThePoolWaits) {
    if (std::string(sp_backend_name()) != "host")
        GTEST_SKIP() << "the test reads and writes its buffers with the CPU (host backend)";
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "10"}});
    const size_t kCount = 4096; // far above what the agreement round carries itself
    float *buf = nullptr;
    void *next = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_[0], kCount * sizeof(float), nullptr, (void **)&buf));
    for (size_t i = 0; i < kCount; i++)
        buf[i] = 1.0f;
    MPI_Barrier(MPI_COMM_WORLD);
    if (mpi_rank() == 0) {
        sp_status_t got = SP_ERR_INTERNAL;
        std::thread a = malloc_holding_the_pool(&next, &got);
        EXPECT_SP_OK(sp_allreduce(w_, buf, buf, kCount, SP_FLOAT32, SP_SUM, nullptr));
        a.join();
        EXPECT_EQ(got, SP_SUCCESS) << sp_status_name(got);
    } else if (mpi_rank() == 1) {
        EXPECT_SP_OK(sp_allreduce(w_, buf, buf, kCount, SP_FLOAT32, SP_SUM, nullptr));
        EXPECT_SP_OK(sp_symmetric_malloc(pool_[0], 4096, nullptr, &next));
    }
    EXPECT_EQ(buf[kCount - 1], 2.0f);
    if (next)
        EXPECT_SP_OK(sp_free(next));
    EXPECT_SP_OK(sp_free(buf));
}

// "Calls on one pool are serialized on this rank": an sp_symmetric_malloc that another thread
// makes while this rank's destroy of the pool waits for a late rank comes after the destroy, so
// it is refused (SP_ERR_INVALID_USAGE), as it is on a rank that makes the two calls in order.
// It waited for the pool's state, which the destroy freed: a use after free (ASan), then a
// call on a freed communicator. The late rank comes 300 ms after the call started waiting; the
// pause only makes the waiting likely, and every order of the two calls must give the refusal.
TEST_F(SymThreads, MallocWaitingForADestroyInAnotherThreadIsRefused) {
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "20"}});
    expect_warnings(); // the refusals
    sp_mempool_t *pool = pool_[0];
    pool_[0] = nullptr; // destroyed here
    void *p = nullptr;
    int token = 0;
    if (mpi_rank() == 0) {
        uint64_t r0 = sp__agree_rounds();
        sp_status_t got = SP_ERR_INTERNAL;
        std::thread late([&] {
            while (sp__agree_rounds() == r0) // the destroy's round started: it holds the pool
                std::this_thread::yield();
            std::thread a([&] { got = sp_symmetric_malloc(pool, 4096, nullptr, &p); });
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            MPI_Send(&token, 1, MPI_INT, 1, 78, MPI_COMM_WORLD); // now rank 1 may destroy
            a.join();
        });
        EXPECT_SP_OK(sp_symmetric_mempool_destroy(pool));
        late.join();
        EXPECT_EQ(got, SP_ERR_INVALID_USAGE) << sp_status_name(got);
    } else if (mpi_rank() == 1) {
        MPI_Recv(&token, 1, MPI_INT, 0, 78, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        EXPECT_SP_OK(sp_symmetric_mempool_destroy(pool));
        EXPECT_SP_STATUS(sp_symmetric_malloc(pool, 4096, nullptr, &p), SP_ERR_INVALID_USAGE);
    }
    EXPECT_EQ(p, nullptr);
}

} // namespace

// sp_world_finalize is made once per world: a second call, even one another thread makes while
// the first runs, is refused without touching anything (world.h). Two threads that finalized one
// world at once both ran its finalize hooks (the release of the symmetric pools, the report's
// round): the pools' states were freed twice ("double free or corruption"), and the two rounds
// each thread made met the peers' out of order (SP_ERR_MISMATCH, SP_ERR_TIMEOUT). Exactly one of
// the two calls succeeds on every rank; the other is SP_ERR_INVALID_USAGE, whichever order the
// threads come in.
TEST_F(SymThreads, ConcurrentFinalizeOfOneWorldRunsOnce) {
    expect_warnings(); // the pools left alive are released at finalize, with a warning
    for (int round = 0; round < 20; round++) { // the threads overlap in some rounds, not in all
        SCOPED_TRACE("round " + std::to_string(round));
        sp_world_t *w = nullptr;
        sp_mempool_t *pool[2] = {nullptr, nullptr};
        ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w));
        ASSERT_SP_OK(sym_pool_create(w, "c", false, &pool[0]));
        ASSERT_SP_OK(sym_pool_create(w, "d", false, &pool[1]));
        void *p = nullptr;
        ASSERT_SP_OK(sp_symmetric_malloc(pool[0], 4096, nullptr, &p));
        ASSERT_SP_OK(sp_free(p));
        std::atomic<int> ready{0};
        sp_status_t got[2] = {SP_ERR_INTERNAL, SP_ERR_INTERNAL};
        std::string msg[2];
        auto finalize = [&](int i) {
            ready.fetch_add(1);
            while (ready.load() < 2) // both threads call at once
                std::this_thread::yield();
            got[i] = sp_world_finalize(w);
            msg[i] = sp_last_error();
        };
        std::thread t0(finalize, 0), t1(finalize, 1);
        t0.join();
        t1.join();
        int ok = (got[0] == SP_SUCCESS) + (got[1] == SP_SUCCESS);
        EXPECT_EQ(ok, 1) << sp_status_name(got[0]) << " (" << msg[0] << "), "
                         << sp_status_name(got[1]) << " (" << msg[1] << ")";
        for (int i = 0; i < 2; i++) {
            if (got[i] != SP_SUCCESS) {
                EXPECT_EQ(got[i], SP_ERR_INVALID_USAGE) << msg[i];
            }
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
}

// sp_world_finalize while another thread destroys a symmetric pool of that world: the two calls
// are serialized on the pool's lock, in either order. Finalize's hook listed the pool, waited for
// its lock while the destroy ran, then released and freed the state the destroy had just freed
// ("double free or corruption"); in the other order a destroy that waited for the lock would have
// run on the state finalize freed. Now whichever comes second finds the pool gone: the destroy is
// refused (SP_ERR_INVALID_USAGE) or finalize skips the pool. A rank whose threads come in the
// other order than its peer's meets a deadline instead (SP_ERR_TIMEOUT, bounded here by 10 s).
TEST_F(SymThreads, FinalizeWhileAnotherThreadDestroysAPool) {
    expect_warnings(); // a pool finalize releases, a destroy it refuses
    sp::ScopedEnv deadline({{"SYMPOOL_SYM_TIMEOUT", "10"}});
    for (int round = 0; round < 20; round++) { // the threads overlap in some rounds, not in all
        SCOPED_TRACE("round " + std::to_string(round));
        sp_world_t *w = nullptr;
        sp_mempool_t *pool = nullptr;
        ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w));
        ASSERT_SP_OK(sym_pool_create(w, "e", false, &pool));
        void *p = nullptr;
        ASSERT_SP_OK(sp_symmetric_malloc(pool, 4096, nullptr, &p));
        ASSERT_SP_OK(sp_free(p));
        std::atomic<int> ready{0};
        sp_status_t destroyed = SP_ERR_INTERNAL, finalized = SP_ERR_INTERNAL;
        std::string why;
        auto together = [&ready] {
            ready.fetch_add(1);
            while (ready.load() < 2)
                std::this_thread::yield();
        };
        std::thread t0([&] {
            together();
            destroyed = sp_symmetric_mempool_destroy(pool);
            why = sp_last_error();
        });
        std::thread t1([&] {
            together();
            finalized = sp_world_finalize(w);
        });
        t0.join();
        t1.join();
        EXPECT_TRUE(finalized == SP_SUCCESS || finalized == SP_ERR_TIMEOUT)
            << sp_status_name(finalized);
        EXPECT_EQ(sp_world_rank(w), -1) << "the world is finalized in every case";
        EXPECT_TRUE(destroyed == SP_SUCCESS || destroyed == SP_ERR_INVALID_USAGE ||
                    destroyed == SP_ERR_TIMEOUT)
            << sp_status_name(destroyed) << ": " << why;
        if (destroyed == SP_ERR_INVALID_USAGE) {
            EXPECT_NE(why.find("not a live symmetric pool"), std::string::npos) << why;
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
}

// A destroyed pool's state is kept while another thread's call may still hold it, and no longer:
// a world that creates and destroys symmetric pools in a loop does not keep one state per pool
// until it is finalized (it did: 20 here). With no other call in flight, each destroy frees it.
TEST_F(SymThreads, DestroyedPoolsStatesAreNotKeptUntilTheWorldEnds) {
    const int kCycles = 20;
    size_t before = sp__sym_retired_count();
    for (int i = 0; i < kCycles; i++) {
        sp_mempool_t *p = nullptr;
        ASSERT_SP_OK(sym_pool_create(w_, "cycle", false, &p));
        void *buf = nullptr;
        ASSERT_SP_OK(sp_symmetric_malloc(p, 4096, nullptr, &buf));
        ASSERT_SP_OK(sp_free(buf));
        ASSERT_SP_OK(sp_symmetric_mempool_destroy(p));
    }
    EXPECT_EQ(before, 0u);
    EXPECT_EQ(sp__sym_retired_count(), 0u);
}
