// test_host_faults_mpi.cc: the collective calls when the host's own resources fail, on every
// rank alike (tests/unit/fault_probe.c makes the n-th call to a C library function fail; see
// tests/unit/test_host_faults.cc for the calls of one process).
#include <mpi.h>

#include <pthread.h>

#include <cstdio>
#include <functional>
#include <string>

#include "mpi_util.hpp"

extern "C" {
#include "../unit/fault_probe.h"
#include <sympool/collectives.h>
}

namespace {

class HostFaultsMpi : public sp::Test {};

// First in the binary: the agreement round's buffer key is made once per process, at its first
// round. pthread_key_create fails (EAGAIN) once a process holds PTHREAD_KEYS_MAX keys; the round
// ignored that and kept the thread's buffer under key 0, the process's first key (another
// library's, GoogleTest's here), whose value the thread lost and whose destructor would get the
// buffer. Without its key, a round takes the spare buffers made for a rank short of memory.
TEST_F(HostFaultsMpi, RoundBufferWithoutAKeyLeavesOtherKeysAlone) {
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p)); // the library's own keys made before
    ASSERT_SP_OK(sp_free(p));
    void *before = pthread_getspecific((pthread_key_t)0);
    fp_arm(FP_PTHREAD_KEY, 1, 0);
    sp_world_t *w = nullptr;
    sp_status_t s = sp_world_from_comm(MPI_COMM_WORLD, &w);
    fp_disarm();
    // Read and put back before any assertion: GoogleTest keeps its reporter under key 0.
    void *seen = pthread_getspecific((pthread_key_t)0);
    (void)pthread_setspecific((pthread_key_t)0, before);
    ASSERT_SP_OK(s);
    if (!fp_fired()) {
        ASSERT_SP_OK(sp_world_finalize(w));
        GTEST_SKIP() << "the round's key was made before this test";
    }
    EXPECT_EQ(seen, before) << "the round's buffer was stored under another library's key";
    // The world works: collective calls agree and move data.
    int64_t *buf = nullptr;
    ASSERT_SP_OK(sp_malloc(sizeof(int64_t), sp_world_device(w), nullptr, (void **)&buf));
    int64_t one = 1;
    sp::copy_in(buf, &one, sizeof one);
    for (int i = 0; i < 3; i++) {
        ASSERT_SP_OK(sp_allreduce(w, buf, buf, 1, SP_INT64, SP_SUM, nullptr));
        seen = pthread_getspecific((pthread_key_t)0);
        (void)pthread_setspecific((pthread_key_t)0, before);
        EXPECT_EQ(seen, before);
    }
    int64_t sum = 0;
    sp::copy_out(&sum, buf, sizeof sum);
    int64_t want = 1;
    for (int i = 0; i < 3; i++)
        want *= mpi_size();
    EXPECT_EQ(sum, want);
    ASSERT_SP_OK(sp_free(buf));
    ASSERT_SP_OK(sp_world_finalize(w));
}

// One rank without host memory for its world struct: creation fails on every rank at once, with
// that rank's reason, and the next creation works. The rank returned alone before the
// communicator's duplicates: its peers timed out in theirs, and its next creation completed their
// abandoned duplicate, one collective step behind them, so every later creation timed out too.
TEST_F(HostFaultsMpi, WorldStructShortOfMemoryFailsEveryRankAndTheNextCreationWorks) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "10"}}); // a regression times out, bounded
    sp_world_t *w = nullptr;
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w)); // what creation sets up once, set up
    ASSERT_SP_OK(sp_world_finalize(w));
    bool faulty = mpi_rank() == mpi_size() - 1;
    if (faulty)
        fp_arm(FP_CALLOC, 1, 0); // the world struct: creation's first calloc
    sp_status_t s = sp_world_from_comm(MPI_COMM_WORLD, &w);
    fp_disarm();
    if (faulty)
        ASSERT_TRUE(fp_fired());
    EXPECT_EQ(s, SP_ERR_SYSTEM) << sp::describe(s);
    EXPECT_NE(std::string(sp_last_error()).find("host memory"), std::string::npos)
        << sp_last_error();
    if (s == SP_SUCCESS)
        EXPECT_SP_OK(sp_world_finalize(w));
    s = sp_world_from_comm(MPI_COMM_WORLD, &w);
    ASSERT_EQ(s, SP_SUCCESS) << sp::describe(s);
    EXPECT_SP_OK(sp_world_finalize(w));
}

} // namespace
