// test_symmetric_timeout.cc: a rank that stops calling is reported by SP_ERR_TIMEOUT (naming the
// call) on the ranks that wait, instead of a hang; the pool is then broken on those ranks and
// refuses further collective calls; sp_world_finalize leaves its registrations to process exit. The
// late rank, when it comes, fails too (SP_ERR_TIMEOUT) and its pool breaks as well. Uses
// SYMPOOL_SYM_TIMEOUT from the environment when set (the dedicated registration in
// tests/cmake/symmetric.cmake sets 1), else sets 1 second itself.
#include <mpi.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "mpi_util.hpp"

namespace {

class SymmetricTimeout : public sp::Test {};

TEST_F(SymmetricTimeout, RankThatStopsCallingIsReportedNotAHang) {
    expect_warnings();
    std::unique_ptr<sp::ScopedEnv> env;
    if (!std::getenv("SYMPOOL_SYM_TIMEOUT"))
        env.reset(new sp::ScopedEnv({{"SYMPOOL_SYM_TIMEOUT", "1"}}));
    else
        EXPECT_EQ(sp__option_source(SP_OPT_SYM_TIMEOUT), SP_OPT_SRC_ENV);
    double limit = sp__option_double(SP_OPT_SYM_TIMEOUT);
    ASSERT_GT(limit, 0.0);
    ASSERT_LE(limit, 10.0) << "this test waits for the timeout: keep it short";

    sp_world_t *w = nullptr;
    sp_mempool_t *pool = nullptr;
    void *p = nullptr;
    {
        // Setup with a generous deadline: on a loaded, oversubscribed machine ranks may reach
        // create more than a second apart. Only call #2 below runs under the short one.
        sp::ScopedEnv setup({{"SYMPOOL_SYM_TIMEOUT", "120"}});
        ASSERT_SP_OK(sp_world_init(nullptr, nullptr, &w));
        ASSERT_SP_OK(sp_symmetric_mempool_create(w, nullptr, &pool));
        ASSERT_SP_OK(sp_symmetric_malloc(pool, 4096, nullptr, &p)); // call #1, everyone
        ASSERT_SP_OK(sp_free(p));
        MPI_Barrier(MPI_COMM_WORLD);
    }
    ASSERT_EQ(sp__option_double(SP_OPT_SYM_TIMEOUT), limit);

    if (mpi_rank() != 0) {
        // Call #2: rank 0 never comes.
        double t0 = MPI_Wtime();
        EXPECT_SP_STATUS(sp_symmetric_malloc(pool, 4096, nullptr, &p), SP_ERR_TIMEOUT);
        double dt = MPI_Wtime() - t0;
        std::string msg = sp_last_error();
        EXPECT_NE(msg.find("call #2"), std::string::npos) << msg;
        EXPECT_NE(msg.find("SYMPOOL_SYM_TIMEOUT"), std::string::npos) << msg;
        EXPECT_GE(dt, limit * 0.9) << "returned before the deadline";
        // Broken: further collective calls are refused at once, naming the cause.
        EXPECT_SP_STATUS(sp_symmetric_malloc(pool, 4096, nullptr, &p), SP_ERR_INVALID_USAGE);
        msg = sp_last_error();
        EXPECT_NE(msg.find("broken by timeout"), std::string::npos) << msg;
        EXPECT_SP_STATUS(sp_symmetric_empty_cache(pool), SP_ERR_INVALID_USAGE);
        EXPECT_SP_STATUS(sp_symmetric_mempool_destroy(pool), SP_ERR_INVALID_USAGE);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (mpi_rank() == 0) {
        // The late rank arrives: its round completes at once against the abandoned
        // contributions, after their deadline, so it fails too (it must not go on alone) and its
        // pool breaks like the others'.
        sp::ScopedEnv late({{"SYMPOOL_SYM_TIMEOUT", "120"}});
        double t0 = MPI_Wtime();
        EXPECT_SP_STATUS(sp_symmetric_malloc(pool, 4096, nullptr, &p), SP_ERR_TIMEOUT);
        EXPECT_LT(MPI_Wtime() - t0, 5.0) << "the late rank learns at once, not at its deadline";
        std::string msg = sp_last_error();
        EXPECT_NE(msg.find("stopped waiting at its deadline"), std::string::npos) << msg;
        EXPECT_SP_STATUS(sp_symmetric_malloc(pool, 4096, nullptr, &p), SP_ERR_INVALID_USAGE);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    // No collective destroy is possible on a broken pool: sp_world_finalize leaves its
    // registered segment to process exit (with a warning) instead of a collective release that
    // could wait for a rank that is gone.
    ASSERT_SP_OK(sp_world_finalize(w));
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool, 4096, nullptr, &p), SP_ERR_INVALID_USAGE);
}

} // namespace
