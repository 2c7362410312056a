// sym_faults.cc: every collective sympool call gives a clear error on every rank, never a hang
// or a crash, with ranks that skip, add, delay calls or pass bad arguments. Each
// scenario is bounded by SYMPOOL_SYM_TIMEOUT, so a regression fails instead of hanging. The
// calls that are meant to meet the deadline run under a short one (1 s, ShortDeadline); all
// else (the fixture's world, pools, the calls that must succeed or fail at once) under a long
// one (120 s): a round fails when it completes later than its earliest rank's deadline, so under
// 1 s a rank that came a second after another to an ordinary call (a loaded machine) failed. Run at
// 2 and 4 ranks (tests/cmake/symmetric.cmake; not the tests/mpi/test_*.cc glob, so it does not also
// run at 8 oversubscribed ranks).
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>

#include "mpi_util.hpp"

extern "C" {
#include "world/world.h"
#include <sympool/collectives.h>
void sp__sym_test_fail_host(bool on);
void sp__sym_test_pause_before_comms(double seconds);
}

namespace {

bool has(const std::string &msg, const std::string &needle) {
    return msg.find(needle) != std::string::npos;
}

void sleep_s(double s) {
    std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

// The short deadline, for the calls that are meant to meet it (a late or absent rank).
struct ShortDeadline : sp::ScopedEnv {
    ShortDeadline() : sp::ScopedEnv({{"SYMPOOL_SYM_TIMEOUT", "1"}}) {}
};

class SymFaults : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        expect_warnings();
        ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w_));
        rank_ = sp_world_rank(w_);
        n_ = sp_world_size(w_);
    }
    void TearDown() override {
        if (pool_)
            EXPECT_SP_OK(sp_symmetric_mempool_destroy(pool_));
        if (w_)
            EXPECT_SP_OK(sp_world_finalize(w_));
        MPI_Barrier(MPI_COMM_WORLD);
        sp::Test::TearDown();
    }
    void make_pool() { ASSERT_SP_OK(sym_pool_create(w_, "faults", false, &pool_)); }
    sp_world_t *w_ = nullptr;
    sp_mempool_t *pool_ = nullptr;
    int rank_ = -1, n_ = 0;
    sp::ScopedEnv env_{{{"SYMPOOL_SYM_TIMEOUT", "120"}}};
};

// Item 1: an extra sp_symmetric_malloc on one rank meets the others' destroy or empty cache:
// SP_ERR_MISMATCH on every rank, naming both calls; afterwards the ranks are in step again.
TEST_F(SymFaults, ExtraMallocAgainstDestroyOrEmptyCacheIsAMismatchNamingBoth) {
    make_pool();
    void *p = nullptr;
    for (int other = 0; other < 2; other++) {
        sp_status_t s;
        if (rank_ == 0)
            s = sp_symmetric_malloc(pool_, 4096, nullptr, &p);
        else
            s = other == 0 ? sp_symmetric_mempool_destroy(pool_) : sp_symmetric_empty_cache(pool_);
        EXPECT_EQ(s, SP_ERR_MISMATCH) << sp::describe(s);
        std::string msg = sp_last_error();
        EXPECT_TRUE(has(msg, "sp_symmetric_malloc")) << msg;
        EXPECT_TRUE(
            has(msg, other == 0 ? "sp_symmetric_mempool_destroy" : "sp_symmetric_empty_cache"))
            << msg;
        EXPECT_FALSE(has(msg, "#-")) << msg;
    }
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_symmetric_mempool_destroy(pool_));
    pool_ = nullptr;
}

// Item 1, world level: one rank in sp_allreduce while the others create a symmetric pool.
TEST_F(SymFaults, DifferentWorldCallsAreAMismatchNamingBoth) {
    sp_mempool_t *q = nullptr;
    int32_t *buf = nullptr;
    ASSERT_SP_OK(sp_malloc(64, sp_world_device(w_), nullptr, (void **)&buf));
    sp_status_t s = rank_ == 0 ? sp_allreduce(w_, buf, buf, 4, SP_INT32, SP_SUM, nullptr)
                               : sp_symmetric_mempool_create(w_, nullptr, &q);
    EXPECT_EQ(s, SP_ERR_MISMATCH) << sp::describe(s);
    std::string msg = sp_last_error();
    EXPECT_TRUE(has(msg, "sp_allreduce") && has(msg, "sp_symmetric_mempool_create")) << msg;
    EXPECT_EQ(q, nullptr);
    ASSERT_SP_OK(sp_allreduce(w_, buf, buf, 4, SP_INT32, SP_SUM, nullptr)); // in step again
    ASSERT_SP_OK(sp_free(buf));
}

// Item 2: a rank late to create (after the others timed out): SP_ERR_TIMEOUT on every rank,
// the late one included, no crash in finalize, and the world works afterwards.
TEST_F(SymFaults, LateCreateTimesOutEverywhereAndFinalizeIsSafe) {
    sp_mempool_t *q = nullptr;
    if (rank_ == n_ - 1)
        sleep_s(2.5);
    auto t0 = std::chrono::steady_clock::now();
    sp_status_t s;
    {
        ShortDeadline d;
        s = sp_symmetric_mempool_create(w_, nullptr, &q);
    }
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(s, SP_ERR_TIMEOUT) << sp::describe(s);
    std::string msg = sp_last_error();
    EXPECT_TRUE(has(msg, "sp_symmetric_mempool_create")) << msg;
    // Bounds with room for a loaded machine that still tell the regressions apart: a late rank
    // that waited for its own deadline takes 1 s or more; an early one that waited for the late
    // one, 2.5 s or more; one that did not wait at all, about nothing.
    if (rank_ == n_ - 1) {
        EXPECT_LT(dt, 0.9) << "the late rank learns at once that the others gave up";
    } else {
        EXPECT_GT(dt, 0.1);
        EXPECT_LT(dt, 2.3);
    }
    EXPECT_EQ(q, nullptr);
    MPI_Barrier(MPI_COMM_WORLD); // the early ranks wait for the late one outside sympool
    int32_t *buf = nullptr;
    ASSERT_SP_OK(sp_malloc(64, sp_world_device(w_), nullptr, (void **)&buf));
    buf[0] = 1;
    ASSERT_SP_OK(sp_allreduce(w_, buf, buf, 1, SP_INT32, SP_SUM, nullptr));
    EXPECT_EQ(buf[0], n_);
    ASSERT_SP_OK(sp_free(buf));
    ASSERT_SP_OK(sp_world_finalize(w_)); // the abandoned round was completed by the late rank
    w_ = nullptr;
}

// Item 3: the deadline's range.
TEST_F(SymFaults, TimeoutRangeZeroAndInfMeanNoDeadlineAndHugeValuesAreRejected) {
    {
        sp::ScopedEnv e({{"SYMPOOL_SYM_TIMEOUT", "1e11"}});
        EXPECT_EQ(sp__agree_timeout_s(), 60.0) << "rejected: the default stays";
        EXPECT_GE(warnings("SYMPOOL_SYM_TIMEOUT"), 1u);
    }
    {
        sp::ScopedEnv e({{"SYMPOOL_SYM_TIMEOUT", "1e99"}});
        EXPECT_EQ(sp__agree_timeout_s(), 60.0);
    }
    for (const char *forever : {"0", "inf", "INF"}) {
        sp::ScopedEnv e({{"SYMPOOL_SYM_TIMEOUT", forever}});
        EXPECT_EQ(sp__agree_timeout_s(), 0.0) << forever;
        // A collective call works under "no deadline".
        int32_t *buf = nullptr;
        ASSERT_SP_OK(sp_malloc(64, sp_world_device(w_), nullptr, (void **)&buf));
        buf[0] = rank_;
        ASSERT_SP_OK(sp_allreduce(w_, buf, buf, 1, SP_INT32, SP_MAX, nullptr));
        EXPECT_EQ(buf[0], n_ - 1);
        ASSERT_SP_OK(sp_free(buf));
    }
    sp::ScopedEnv e({{"SYMPOOL_SYM_TIMEOUT", "31536000"}}); // one year: accepted, no overflow
    EXPECT_EQ(sp__agree_timeout_s(), 31536000.0);
    make_pool();
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
}

// Item 4: a rank that skips a collective or a statistics call: SP_ERR_TIMEOUT naming the call
// on every rank that arrived, within the deadline; the skipping rank makes the call late, learns
// it timed out, and the world is in step again.
TEST_F(SymFaults, SkippedCollectivesAndStatsTimeOutNamingTheCall) {
    const size_t dev = (size_t)sp_world_device(w_);
    int32_t *buf = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, (int)dev, nullptr, (void **)&buf));
    int32_t *big = nullptr;
    ASSERT_SP_OK(sp_malloc(4096 * (size_t)n_, (int)dev, nullptr, (void **)&big));
    sp_stats_summary_t sum;
    FILE *out = std::tmpfile();
    struct Call {
        const char *name;
        std::function<sp_status_t()> fn;
    } calls[] = {
        {"sp_allreduce", [&] { return sp_allreduce(w_, buf, buf, 4, SP_INT32, SP_SUM, nullptr); }},
        {"sp_allgather", [&] { return sp_allgather(w_, buf, big, 4, SP_INT32, nullptr); }},
        {"sp_reduce_scatter",
         [&] { return sp_reduce_scatter(w_, big, buf, 4, SP_INT32, SP_SUM, nullptr); }},
        {"sp_broadcast", [&] { return sp_broadcast(w_, buf, buf, 4, SP_INT32, 0, nullptr); }},
        {"sp_stats_aggregate", [&] { return sp_stats_aggregate(w_, (int)dev, &sum); }},
        {"sp_stats_report", [&] { return sp_stats_report(w_, (int)dev, out, SP_REPORT_JSON); }},
    };
    for (auto &c : calls) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank_ != 0) {
            ShortDeadline d;
            auto t0 = std::chrono::steady_clock::now();
            sp_status_t s = c.fn();
            double dt =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            EXPECT_EQ(s, SP_ERR_TIMEOUT) << c.name << ": " << sp::describe(s);
            EXPECT_TRUE(has(sp_last_error(), c.name)) << sp_last_error();
            EXPECT_GE(dt, 0.9) << c.name;
            EXPECT_LT(dt, 5.0) << c.name << ": about the 1 s deadline, far below the long one";
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank_ == 0) { // late: the others gave up
            ShortDeadline d;
            sp_status_t s = c.fn();
            EXPECT_EQ(s, SP_ERR_TIMEOUT) << c.name << ": " << sp::describe(s);
        }
        sp_status_t again = c.fn();
        ASSERT_EQ(again, SP_SUCCESS)
            << c.name << ": the ranks are in step again: " << sp::describe(again);
    }
    std::fclose(out);
    ASSERT_SP_OK(sp_free(buf));
    ASSERT_SP_OK(sp_free(big));
}

// Item 5: the ranks that cannot grow are the ones named.
TEST_F(SymFaults, RanksThatCannotGrowAreNamed) {
    make_pool();
    bool limited = rank_ % 2 == 1; // the odd ranks
    if (limited)
        ASSERT_SP_OK(sp_mempool_set_limit(pool_, 1 * sp::MiB));
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 8 * sp::MiB, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    std::string msg = sp_last_error();
    // "rank 1", "ranks 1 and 3", "ranks 1, 3, 5 and 7", ...: every odd rank of this world.
    int nbad = n_ / 2;
    std::string want = nbad == 1 ? "rank " : "ranks ";
    for (int k = 0; k < nbad; k++)
        want += (k == 0 ? "" : k == nbad - 1 ? " and " : ", ") + std::to_string(2 * k + 1);
    // A list too long for one message line may be summed up instead (sp__agree_bad_ranks);
    // up to 16 ranks it always fits.
    std::string summed = std::to_string(nbad) + " ranks (the lowest 1)";
    EXPECT_TRUE(has(msg, "cannot grow on " + want) ||
                (n_ > 16 && has(msg, "cannot grow on " + summed)))
        << msg;
    EXPECT_FALSE(has(msg, "rank 0")) << msg;
    EXPECT_EQ(p, nullptr);
}

// Item 6: sp_mempool_destroy refuses a symmetric pool; the pool keeps working and the
// collective destroy succeeds everywhere.
TEST_F(SymFaults, LocalDestroyOfASymmetricPoolIsRefused) {
    make_pool();
    if (rank_ == 0) {
        EXPECT_SP_STATUS(sp_mempool_destroy(pool_), SP_ERR_INVALID_USAGE);
        EXPECT_TRUE(has(sp_last_error(), "sp_symmetric_mempool_destroy")) << sp_last_error();
    }
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_symmetric_mempool_destroy(pool_));
    pool_ = nullptr;
}

// Item 7: a handle that is not a stream, on one rank: SP_ERR_INVALID_ARGUMENT everywhere.
TEST_F(SymFaults, BadStreamOnOneRankFailsEverywhere) {
    SP_SKIP_ON_GPU("a handle that is not a live CUDA stream is undefined behaviour on the cuda "
                   "backend (CUDA dereferences it)");
    make_pool();
    int not_a_stream = 0;
    sp_stream_t s = rank_ == 1 ? (sp_stream_t)&not_a_stream : nullptr;
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, s, &p), SP_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(has(sp_last_error(), rank_ == 1 ? "not a stream" : "rank 1 rejected"))
        << sp_last_error();
    EXPECT_EQ(p, nullptr);
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
}

// Item 8: sp_world_finalize twice is an error, not a use after free.
TEST_F(SymFaults, DoubleFinalizeIsAnError) {
    ASSERT_SP_OK(sp_world_finalize(w_));
    EXPECT_SP_STATUS(sp_world_finalize(w_), SP_ERR_INVALID_USAGE);
    EXPECT_TRUE(has(sp_last_error(), "not a live world")) << sp_last_error();
    // The accessors answer like NULL, without reading the freed world.
    EXPECT_EQ(sp_world_rank(w_), -1);
    EXPECT_EQ(sp_world_size(w_), 0);
    EXPECT_EQ(sp_world_local_rank(w_), -1);
    EXPECT_EQ(sp_world_device(w_), -1);
    int32_t x = 0;
    EXPECT_SP_STATUS(sp_allreduce(w_, &x, &x, 1, SP_INT32, SP_SUM, nullptr), SP_ERR_INVALID_USAGE);
    w_ = nullptr;
}

// Item 9: after a timeout the saved reason is whole in later calls' messages.
TEST_F(SymFaults, BrokenPoolRepeatsTheWholeReason) {
    make_pool();
    void *p = nullptr;
    if (rank_ != 0) {
        ShortDeadline d;
        EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, nullptr, &p), SP_ERR_TIMEOUT);
        EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, nullptr, &p), SP_ERR_INVALID_USAGE);
        std::string msg = sp_last_error();
        EXPECT_TRUE(has(msg, "pool broken by timeout (sp_symmetric_malloc call #1 on pool "
                             "\"faults\" timed out (SYMPOOL_SYM_TIMEOUT=1 s; 0 = none))"))
            << msg;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank_ == 0) { // late: it learns the others gave up, and its pool breaks too
        ShortDeadline d;
        EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, nullptr, &p), SP_ERR_TIMEOUT);
        EXPECT_SP_STATUS(sp_symmetric_empty_cache(pool_), SP_ERR_INVALID_USAGE);
    }
    EXPECT_SP_STATUS(sp_symmetric_mempool_destroy(pool_), SP_ERR_INVALID_USAGE);
    pool_ = nullptr; // released at sp_world_finalize
}

// As the host backend shows it: releasing a batch of segments costs the same
// agreement rounds whatever its size (the call's round, the free-segment bitmap, one round
// standing for the barrier), not a barrier per segment.
TEST_F(SymFaults, ReleaseBatchIsOneBarrierWhateverItsSize) {
    make_pool();
    for (int nseg : {1, 3}) {
        void *p[3] = {};
        for (int i = 0; i < nseg; i++) // large and live at once: one segment each
            ASSERT_SP_OK(sp_symmetric_malloc(pool_, 12 * sp::MiB, nullptr, &p[i]));
        for (int i = 0; i < nseg; i++)
            ASSERT_SP_OK(sp_free(p[i]));
        sp_sym_counters_t c0 = sym_counters();
        uint64_t r0 = sp__agree_rounds();
        ASSERT_SP_OK(sp_symmetric_empty_cache(pool_));
        uint64_t rounds = sp__agree_rounds() - r0;
        sp_sym_counters_t c1 = sym_counters();
        EXPECT_EQ(c1.deregistrations - c0.deregistrations, nseg);
        EXPECT_EQ(rounds, 3u) << nseg << " segment(s)";
    }
}

// Finalize agrees first, with the deadline. A pool a timeout broke on some ranks only: the
// healthy rank must not enter MPI_Win_free alone (it waited there forever); every rank returns
// SP_ERR_TIMEOUT naming the pool, and nothing is released collectively.
TEST_F(SymFaults, FinalizeWithAPoolBrokenOnSomeRanksOnlyFailsEverywhere) {
    make_pool();
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p)); // a registered segment
    ASSERT_SP_OK(sp_free(p));
    if (rank_ != 0) { // rank 0 never comes: the others' pool breaks, rank 0's does not
        ShortDeadline d;
        EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, nullptr, &p), SP_ERR_TIMEOUT);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    sp_status_t s = sp_world_finalize(w_);
    EXPECT_EQ(s, SP_ERR_TIMEOUT) << sp::describe(s);
    std::string msg = sp_last_error();
    EXPECT_TRUE(has(msg, "\"faults\"") && has(msg, "some ranks only")) << msg;
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, nullptr, &p), SP_ERR_INVALID_USAGE);
    w_ = nullptr;
    pool_ = nullptr; // its registration goes with the process
}

// A rank that reaches finalize long after the others: they stop waiting at their deadline
// instead of waiting for it, and it learns at once that they gave up; SP_ERR_TIMEOUT everywhere.
TEST_F(SymFaults, FinalizeWithALateRankTimesOutEverywhere) {
    make_pool();
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    ShortDeadline d;
    if (rank_ == n_ - 1)
        sleep_s(4);
    auto t0 = std::chrono::steady_clock::now();
    sp_status_t s = sp_world_finalize(w_);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(s, SP_ERR_TIMEOUT) << sp::describe(s);
    std::string msg = sp_last_error();
    EXPECT_TRUE(has(msg, "sp_world_finalize") && has(msg, "nothing collective was released"))
        << msg;
    EXPECT_LT(dt, 3.0) << "bounded by SYMPOOL_SYM_TIMEOUT=1, not by the late rank";
    w_ = nullptr;
    pool_ = nullptr;
}

// In step: finalize releases a pool left alive and succeeds.
TEST_F(SymFaults, FinalizeInStepReleasesLivePools) {
    make_pool();
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    sp_sym_counters_t c0 = sym_counters();
    ASSERT_SP_OK(sp_world_finalize(w_));
    EXPECT_EQ(sym_counters().deregistrations - c0.deregistrations, 1);
    w_ = nullptr;
    pool_ = nullptr;
}

// A finalized world's node accessors answer like NULL too (the header's promise for every
// accessor), without reading the freed world.
TEST_F(SymFaults, NodeAccessorsOfAFinalizedWorldAnswerLikeNull) {
    ASSERT_GT(sp_world_local_size(w_), 0);
    ASSERT_GT(sp_world_node_count(w_), 0);
    ASSERT_SP_OK(sp_world_finalize(w_));
    EXPECT_EQ(sp_world_local_size(w_), 0);
    EXPECT_EQ(sp_world_node_count(w_), 0);
    EXPECT_EQ(sp_world_node(w_, 0), -1);
    EXPECT_EQ(sp_world_node_name(w_, 0), nullptr);
    w_ = nullptr;
}

// A create that met another world call on some rank is one error, not an error at every later
// create: the ranks' pool creation numbers stay in step.
TEST_F(SymFaults, CreateAfterACreateMismatchIsInStep) {
    int32_t *buf = nullptr;
    ASSERT_SP_OK(sp_malloc(64, sp_world_device(w_), nullptr, (void **)&buf));
    sp_mempool_t *q = nullptr;
    sp_status_t s = rank_ == 0 ? sp_allreduce(w_, buf, buf, 4, SP_INT32, SP_SUM, nullptr)
                               : sp_symmetric_mempool_create(w_, nullptr, &q);
    EXPECT_EQ(s, SP_ERR_MISMATCH) << sp::describe(s);
    EXPECT_EQ(q, nullptr);
    ASSERT_SP_OK(sp_free(buf));
    ASSERT_NO_FATAL_FAILURE(make_pool());
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
}

// sp_stats_report with another format on one rank (rank 0, the root of the Prometheus gather,
// was left alone in MPI_Gather forever): SP_ERR_MISMATCH on every rank, then in step.
TEST_F(SymFaults, StatsReportFormatsThatDifferAreAMismatch) {
    const int dev = sp_world_device(w_);
    FILE *out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    sp_report_format_t f = rank_ == 0 ? SP_REPORT_PROMETHEUS : SP_REPORT_JSON;
    EXPECT_SP_STATUS(sp_stats_report(w_, dev, out, f), SP_ERR_MISMATCH);
    EXPECT_TRUE(has(sp_last_error(), "format")) << sp_last_error();
    ASSERT_SP_OK(sp_stats_report(w_, dev, out, SP_REPORT_PROMETHEUS));
    std::fclose(out);
}

// A rank that finds no host memory for its free-segment bitmap (empty cache, destroy) says so in
// the call's first round: every rank fails the call at once, the peers naming it, and nothing is
// released anywhere (the rank used to return alone after that round while its peers waited in
// the bitmap round for their deadline: SP_ERR_TIMEOUT, and the pool broken). Then in step.
TEST_F(SymFaults, BitmapOutOfHostMemoryOnOneRankFailsEveryRankInTheRound) {
    make_pool();
    const int bad = n_ - 1;
    void *p = nullptr;
    for (int destroy = 0; destroy < 2; destroy++) {
        SCOPED_TRACE(destroy ? "destroy" : "empty cache");
        ASSERT_SP_OK(sp_symmetric_malloc(pool_, 1 << 20, nullptr, &p));
        ASSERT_SP_OK(sp_free(p)); // a segment free on every rank: the round would release it
        size_t held = sp_mempool_total_bytes(pool_);
        ASSERT_GT(held, 0u);
        if (rank_ == bad)
            sp__sym_test_fail_host(true);
        sp_status_t s =
            destroy ? sp_symmetric_mempool_destroy(pool_) : sp_symmetric_empty_cache(pool_);
        sp__sym_test_fail_host(false);
        std::string msg = sp_last_error();
        EXPECT_EQ(s, SP_ERR_SYSTEM) << sp::describe(s);
        EXPECT_TRUE(has(msg, rank_ == bad ? "out of host memory" : "could not prepare")) << msg;
        if (rank_ != bad) {
            EXPECT_TRUE(has(msg, "rank " + std::to_string(bad))) << msg;
        }
        EXPECT_EQ(sp_mempool_total_bytes(pool_), held); // nothing released, nothing destroyed
    }
    // In step, and the pool not broken: the calls work on every rank.
    ASSERT_SP_OK(sp_symmetric_empty_cache(pool_));
    EXPECT_EQ(sp_mempool_total_bytes(pool_), 0u);
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
}

// A rank with no host memory for a new pool's state still takes part in the create's round, as a
// rank that failed: every rank fails the create at once (the peers used to wait for it until
// their deadline, SP_ERR_TIMEOUT), no rank has the pool, and the next create is in step.
TEST_F(SymFaults, CreateOutOfHostMemoryOnOneRankFailsEveryRankInTheRound) {
    const int bad = n_ - 1;
    sp_mempool_t *q = nullptr;
    if (rank_ == bad)
        sp__sym_test_fail_host(true);
    sp_status_t s = sp_symmetric_mempool_create(w_, nullptr, &q);
    sp__sym_test_fail_host(false);
    std::string msg = sp_last_error();
    EXPECT_EQ(q, nullptr);
    if (rank_ == bad) {
        EXPECT_EQ(s, SP_ERR_SYSTEM) << sp::describe(s);
        EXPECT_TRUE(has(msg, "out of host memory")) << msg;
    } else {
        EXPECT_EQ(s, SP_ERR_INVALID_USAGE) << sp::describe(s);
        EXPECT_TRUE(has(msg, "rank " + std::to_string(bad) + " could not create the pool")) << msg;
    }
    ASSERT_NO_FATAL_FAILURE(make_pool());
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
}

// A rank with no host memory for finalize's release round says so in the round's first part:
// every rank fails the finalize at once with its status and releases nothing collectively (the
// rank used to return alone after that part while its peers waited in the bitmap part until
// their deadline). The world is finalized on every rank all the same.
TEST_F(SymFaults, FinalizeOutOfHostMemoryOnOneRankFailsEveryRankInTheRound) {
    make_pool();
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p)); // a registered segment
    ASSERT_SP_OK(sp_free(p));
    const int bad = n_ - 1;
    sp_sym_counters_t c0 = sym_counters();
    if (rank_ == bad)
        sp__sym_test_fail_host(true);
    sp_status_t s = sp_world_finalize(w_);
    sp__sym_test_fail_host(false);
    std::string msg = sp_last_error();
    EXPECT_EQ(s, SP_ERR_SYSTEM) << sp::describe(s);
    EXPECT_TRUE(has(msg, "rank " + std::to_string(bad) + " had no host memory")) << msg;
    EXPECT_EQ(sym_counters().deregistrations - c0.deregistrations, 0);
    EXPECT_SP_STATUS(sp_world_finalize(w_), SP_ERR_INVALID_USAGE); // finalized all the same
    w_ = nullptr;
    pool_ = nullptr; // its registration goes with the process
}

// A thread short of host memory for its agreement round buffer (made at its first round) and for
// the cell a communicator duplicate completes into still takes part in the rounds, through a
// static spare: the calls succeed on every rank. It used to return SP_ERR_SYSTEM without sending
// anything, and its peers waited for it until their deadline (SP_ERR_TIMEOUT).
TEST_F(SymFaults, RoundBufferOutOfHostMemoryStillJoinsTheRound) {
    const int bad = n_ - 1;
    sp_status_t s[4] = {SP_SUCCESS, SP_SUCCESS, SP_SUCCESS, SP_SUCCESS};
    std::string msg;
    // A new thread: its first round allocates its buffer (this thread's exists already).
    std::thread t([&] {
        if (rank_ == bad)
            sp__agree_test_fail_host(true);
        sp_world_t *w2 = nullptr;
        s[0] = sp_world_from_comm(MPI_COMM_WORLD, &w2); // two duplicates, two rounds
        sp_mempool_t *q = nullptr;
        if (s[0] == SP_SUCCESS)
            s[1] = sp_symmetric_mempool_create(w2, nullptr, &q); // rounds and a duplicate
        if (q)
            s[2] = sp_symmetric_mempool_destroy(q);
        if (w2)
            s[3] = sp_world_finalize(w2);
        msg = sp_last_error();
        sp__agree_test_fail_host(false);
    });
    t.join();
    for (int i = 0; i < 4; i++)
        EXPECT_EQ(s[i], SP_SUCCESS) << "step " << i << ": " << sp::describe(s[i]) << ": " << msg;
    // The spares come back after each round: more new threads than there are spares (4), one
    // after the other, each short of memory on the bad rank, all in step.
    for (int i = 0; i < 6; i++) {
        std::thread t2([&] {
            if (rank_ == bad)
                sp__agree_test_fail_host(true);
            sp_stats_summary_t sum;
            s[0] = sp_stats_aggregate(w_, sp_world_device(w_), &sum);
            msg = sp_last_error();
            sp__agree_test_fail_host(false);
        });
        t2.join();
        EXPECT_EQ(s[0], SP_SUCCESS) << "thread " << i << ": " << sp::describe(s[0]) << ": " << msg;
    }
}

// A rank that stops between the create's round and the duplicate of the world's communicator for
// the pool: the duplicate has a deadline, so every rank fails the create with SP_ERR_TIMEOUT (the
// others used to wait in MPI_Comm_dup for as long as the rank stayed away, for ever if it never
// came) and no rank has the pool. The duplicate left pending breaks the world: every later
// collective call fails at once, and finalize frees this rank's part and says why.
TEST_F(SymFaults, PoolCommunicatorDuplicateHasADeadline) {
    const int bad = n_ - 1;
    if (rank_ == bad)
        sp__sym_test_pause_before_comms(3.0); // three times SYMPOOL_SYM_TIMEOUT
    sp_mempool_t *q = nullptr;
    sp_status_t s;
    {
        ShortDeadline d;
        s = sp_symmetric_mempool_create(w_, nullptr, &q);
    }
    sp__sym_test_pause_before_comms(0);
    std::string msg = sp_last_error();
    EXPECT_EQ(s, SP_ERR_TIMEOUT) << sp::describe(s) << ": " << msg;
    EXPECT_EQ(q, nullptr);
    EXPECT_TRUE(has(msg, "duplicating the world's communicator")) << msg;
    EXPECT_TRUE(has(msg, "the world is broken")) << msg;
    s = sp_symmetric_mempool_create(w_, nullptr, &q);
    EXPECT_EQ(s, SP_ERR_INVALID_USAGE) << sp::describe(s);
    EXPECT_TRUE(has(sp_last_error(), "the world is broken")) << sp_last_error();
    EXPECT_EQ(q, nullptr);
    s = sp_world_finalize(w_);
    EXPECT_EQ(s, SP_ERR_INVALID_USAGE) << sp::describe(s);
    EXPECT_TRUE(has(sp_last_error(), "the world is broken")) << sp_last_error();
    EXPECT_SP_STATUS(sp_world_finalize(w_), SP_ERR_INVALID_USAGE); // finalized all the same
    w_ = nullptr;
}

} // namespace
