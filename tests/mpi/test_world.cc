// test_world.cc: the MPI world under mpirun (2, 4, 8 ranks). mpi_main.cc has already called
// MPI_Init, so these tests also check that sp_world_init neither re-initializes nor finalizes
// MPI it did not initialize. (The path where sympool initializes MPI itself is
// tests/cmake/symmetric_world_init.c, registered by tests/cmake/symmetric.cmake.)
#include <mpi.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "mpi_util.hpp"

extern "C" {
#include "core/core.h"
#include "world/world.h"
#include <sympool/history.h>
}

namespace {

class World : public sp::Test {};

TEST_F(World, InitOnCallersMpiDuplicatesTheCommunicator) {
    sp_world_t *w = nullptr;
    ASSERT_SP_OK(sp_world_init(nullptr, nullptr, &w));
    EXPECT_EQ(sp_world_rank(w), mpi_rank());
    EXPECT_EQ(sp_world_size(w), mpi_size());
    int cmp = MPI_UNEQUAL;
    MPI_Comm_compare(sp__world_comm(w), MPI_COMM_WORLD, &cmp);
    EXPECT_EQ(cmp, MPI_CONGRUENT) << "the world must use its own duplicate, not the caller's comm";
    // Local rank and size agree with MPI's own shared-memory split.
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, mpi_rank(), MPI_INFO_NULL, &node);
    int lr = -1, ls = 0;
    MPI_Comm_rank(node, &lr);
    MPI_Comm_size(node, &ls);
    MPI_Comm_free(&node);
    EXPECT_EQ(sp_world_local_rank(w), lr);
    EXPECT_EQ(sp__world_local_size(w), ls);
    ASSERT_GT(sp_device_count(), 0);
    EXPECT_EQ(sp_world_device(w), lr % sp_device_count());
    EXPECT_EQ(sp__world_node_rank_of(w, mpi_rank()), lr);
    EXPECT_EQ(sp__world_node_rank_of(w, -1), -1);
    EXPECT_EQ(sp__world_node_rank_of(w, mpi_size()), -1);
    EXPECT_EQ(sp__world_is_cuda(w), sp::on_gpu());
    if (!sp::on_gpu()) {
        EXPECT_EQ(sp__world_nccl_comm(w), nullptr);
    }
    // The world's communicator works and reports errors instead of aborting.
    int one = 1, sum = 0;
    ASSERT_EQ(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, sp__world_comm(w)), MPI_SUCCESS);
    EXPECT_EQ(sum, mpi_size());
    MPI_Errhandler eh;
    MPI_Comm_get_errhandler(sp__world_comm(w), &eh);
    EXPECT_EQ(eh, MPI_ERRORS_RETURN);
    MPI_Errhandler_free(&eh);
    ASSERT_SP_OK(sp_world_finalize(w));
    int finalized = 1;
    MPI_Finalized(&finalized);
    EXPECT_EQ(finalized, 0) << "sp_world_finalize finalized MPI it did not initialize";
}

TEST_F(World, FromCommUsesTheCallersCommunicator) {
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, mpi_rank() % 2, mpi_rank(), &half);
    sp_world_t *w = nullptr;
    ASSERT_SP_OK(sp_world_from_comm(half, &w));
    int hr = -1, hs = 0;
    MPI_Comm_rank(half, &hr);
    MPI_Comm_size(half, &hs);
    EXPECT_EQ(sp_world_rank(w), hr);
    EXPECT_EQ(sp_world_size(w), hs);
    EXPECT_LE(sp_world_local_rank(w), hr);
    ASSERT_SP_OK(sp_world_finalize(w));
    MPI_Comm_free(&half);
}

// A world on a subset of the job (MPI_Comm_split) ranks its processes within the subset, where
// two processes share each rank. "%r" in a file name (sp_dump_snapshot, SYMPOOL_DEBUG_FILE,
// SYMPOOL_REPORT_FILE) is the launcher's rank (history.h), one per process: it stayed the
// subset world's, so the processes of the two halves wrote each other's snapshot files and logs.
TEST_F(World, FileRankStaysTheJobRankInASubsetWorld) {
    char dir[64] = "/tmp/sp_world_rank_XXXXXX";
    if (mpi_rank() == 0) {
        ASSERT_NE(mkdtemp(dir), nullptr) << std::strerror(errno);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, mpi_rank() % 2, mpi_rank(), &half);
    sp_world_t *w = nullptr;
    ASSERT_SP_OK(sp_world_from_comm(half, &w));
    EXPECT_EQ(sp__process_rank(), mpi_rank()) << "world rank " << sp_world_rank(w);
    std::string pattern = std::string(dir) + "/snap.%r.json";
    ASSERT_SP_OK(sp_dump_snapshot(pattern.c_str()));
    MPI_Barrier(MPI_COMM_WORLD); // every rank's file is written
    std::string mine = std::string(dir) + "/snap." + std::to_string(mpi_rank()) + ".json";
    struct stat st;
    EXPECT_EQ(stat(mine.c_str(), &st), 0) << mine << " is missing";
    ASSERT_SP_OK(sp_world_finalize(w));
    MPI_Comm_free(&half);
    MPI_Barrier(MPI_COMM_WORLD); // every rank has looked
    if (mpi_rank() == 0) {
        for (int r = 0; r < mpi_size(); r++)
            std::remove((std::string(dir) + "/snap." + std::to_string(r) + ".json").c_str());
        EXPECT_EQ(rmdir(dir), 0) << "a file named by another rank is left in " << dir;
    }
}

TEST_F(World, TwoWorldsAtOnce) {
    sp_world_t *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_world_init(nullptr, nullptr, &a));
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &b));
    EXPECT_NE(sp__world_comm(a), sp__world_comm(b));
    ASSERT_SP_OK(sp_world_finalize(a));
    int x = mpi_rank(), m = -1;
    ASSERT_EQ(MPI_Allreduce(&x, &m, 1, MPI_INT, MPI_MAX, sp__world_comm(b)), MPI_SUCCESS);
    EXPECT_EQ(m, mpi_size() - 1);
    ASSERT_SP_OK(sp_world_finalize(b));
}

sp_world_t *g_hook_world = nullptr;
int g_hook_calls = 0;
bool g_hook_comm_ok = false;
bool g_hook_in_step = false;
sp_status_t hook(sp_world_t *w, bool in_step) {
    if (w != g_hook_world)
        return SP_SUCCESS;
    g_hook_calls++;
    g_hook_in_step = in_step;
    // Hooks run while the communicator still works.
    int one = 1, sum = 0;
    g_hook_comm_ok =
        MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, sp__world_comm(w)) == MPI_SUCCESS &&
        sum == sp_world_size(w);
    return SP_SUCCESS;
}

TEST_F(World, FinalizeHooksRunFirst) {
    ASSERT_SP_OK(sp__world_on_finalize(hook));
    ASSERT_SP_OK(sp_world_init(nullptr, nullptr, &g_hook_world));
    ASSERT_SP_OK(sp_world_finalize(g_hook_world));
    g_hook_world = nullptr;
    EXPECT_EQ(g_hook_calls, 1);
    EXPECT_TRUE(g_hook_comm_ok);
    EXPECT_TRUE(g_hook_in_step) << "every rank reached finalize in time";
}

TEST_F(World, HookTableIsBounded) {
    expect_warnings();
    EXPECT_SP_STATUS(sp__world_on_finalize(nullptr), SP_ERR_INVALID_ARGUMENT);
    sp_status_t s = SP_SUCCESS;
    for (int i = 0; i < 16 && s == SP_SUCCESS; i++)
        s = sp__world_on_finalize(hook); // hook ignores worlds other than g_hook_world
    EXPECT_EQ(s, SP_ERR_INTERNAL);
}

TEST_F(World, AccessorsAreNullSafeAndArgumentsChecked) {
    expect_warnings();
    EXPECT_EQ(sp_world_rank(nullptr), -1);
    EXPECT_EQ(sp_world_size(nullptr), 0);
    EXPECT_EQ(sp_world_local_rank(nullptr), -1);
    EXPECT_EQ(sp_world_device(nullptr), -1);
    EXPECT_EQ(sp__world_comm(nullptr), MPI_COMM_NULL);
    EXPECT_EQ(sp__world_node_comm(nullptr), MPI_COMM_NULL);
    EXPECT_EQ(sp__world_nccl_comm(nullptr), nullptr);
    EXPECT_FALSE(sp__world_is_cuda(nullptr));
    EXPECT_EQ(sp__world_local_size(nullptr), 0);
    EXPECT_EQ(sp__world_node_rank_of(nullptr, 0), -1);
    EXPECT_SP_STATUS(sp_world_init(nullptr, nullptr, nullptr), SP_ERR_INVALID_ARGUMENT);
    int argc = 0;
    EXPECT_SP_STATUS(sp_world_init(&argc, nullptr, nullptr), SP_ERR_INVALID_ARGUMENT);
    sp_world_t *w = nullptr;
    EXPECT_SP_STATUS(sp_world_from_comm(MPI_COMM_NULL, &w), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_world_from_comm(MPI_COMM_WORLD, nullptr), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_world_finalize(nullptr), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(w, nullptr);
}

// An intercommunicator has no shared-memory split (Open MPI 4.1 crashed in MPI_Comm_split_type
// on one): refused up front, on every rank, before any collective.
TEST_F(World, IntercommunicatorIsRefused) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    MPI_Comm half, inter;
    MPI_Comm_split(MPI_COMM_WORLD, mpi_rank() % 2, mpi_rank(), &half);
    // Each half's leader is its lowest world rank: 0 for the even ranks, 1 for the odd ones.
    MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, mpi_rank() % 2 ? 0 : 1, 7, &inter);
    sp_world_t *w = nullptr;
    EXPECT_SP_STATUS(sp_world_from_comm(inter, &w), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("intercommunicator"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(w, nullptr);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&half);
}

// A rank that passes another communicator than its peers (here rank 0 passes MPI_COMM_SELF)
// never joins their duplicate: they get SP_ERR_TIMEOUT at the deadline, naming what every rank
// must do, instead of waiting in MPI_Comm_dup for good; rank 0's world of one is fine. The
// duplicate the others abandoned stays pending on their communicator, so it is a private one,
// which rank 0 then completes so that no request is left behind.
TEST_F(World, RanksOnDifferentCommunicatorsTimeOutInsteadOfHanging) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    MPI_Comm dupw;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &dupw), MPI_SUCCESS);
    sp_world_t *w = nullptr;
    {
        sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "1"}});
        if (mpi_rank() == 0) {
            ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_SELF, &w));
            EXPECT_EQ(sp_world_size(w), 1);
            EXPECT_SP_OK(sp_world_finalize(w));
        } else {
            double t0 = MPI_Wtime();
            EXPECT_SP_STATUS(sp_world_from_comm(dupw, &w), SP_ERR_TIMEOUT);
            EXPECT_GE(MPI_Wtime() - t0, 0.9) << "returned before the deadline";
            EXPECT_EQ(w, nullptr);
            std::string msg = sp_last_error();
            EXPECT_NE(msg.find("every rank of it must call sp_world_from_comm on it"),
                      std::string::npos)
                << msg;
            EXPECT_NE(msg.find("SYMPOOL_SYM_TIMEOUT"), std::string::npos) << msg;
        }
    }
    if (mpi_rank() == 0) { // the duplicate the others abandoned
        MPI_Comm late;
        ASSERT_EQ(MPI_Comm_dup(dupw, &late), MPI_SUCCESS);
        MPI_Comm_free(&late);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

// A rank that comes after its peers gave up completes its first duplicate against theirs and
// must not go on alone into the next collective step: it times out too, at its own deadline.
TEST_F(World, RankArrivingAfterThePeersGaveUpTimesOutToo) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    MPI_Comm dupw;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &dupw), MPI_SUCCESS);
    sp_world_t *w = nullptr;
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "1"}});
    if (mpi_rank() != 0)
        EXPECT_SP_STATUS(sp_world_from_comm(dupw, &w), SP_ERR_TIMEOUT);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mpi_rank() == 0) {
        EXPECT_SP_STATUS(sp_world_from_comm(dupw, &w), SP_ERR_TIMEOUT);
        EXPECT_NE(std::string(sp_last_error()).find("timed out"), std::string::npos)
            << sp_last_error();
    }
    EXPECT_EQ(w, nullptr);
    MPI_Barrier(MPI_COMM_WORLD);
}

// A rank descheduled between creation's two duplicates past its peers' deadline: they time out
// on the second duplicate, which its own then completes (their MPI_Barrier progresses the one
// they abandoned). It used to go on alone into MPI_Comm_split_type and wait there for good (the
// watchdog aborts); creation's agreement round makes it time out too, so no rank waits.
TEST_F(World, RankPausedBetweenTheDuplicatesTimesOutToo) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    MPI_Comm dupw;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &dupw), MPI_SUCCESS);
    sp_world_t *w = nullptr;
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "1"}});
    if (mpi_rank() == 1)
        sp__world_test_pause_between_dups(2.5);
    sp_status_t s = sp_world_from_comm(dupw, &w);
    sp__world_test_pause_between_dups(0);
    EXPECT_SP_STATUS(s, SP_ERR_TIMEOUT);
    EXPECT_EQ(w, nullptr);
    MPI_Barrier(MPI_COMM_WORLD);
}

// A rank that cannot get host memory for one of creation's tables (rank 1 here, each table in
// turn) fails creation on every rank: itself with SP_ERR_SYSTEM naming the table, its peers with
// an error naming it. It used to return while its peers waited for it in the next collective
// (the node table's or the GPU table's MPI_Allgather, the device check), for good. A world
// created afterwards works.
TEST_F(World, RankOutOfHostMemoryForCreationTablesFailsEveryRank) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    for (int table = 1; table <= SP_WORLD_TEST_TABLES; table++) {
        SCOPED_TRACE("table " + std::to_string(table));
        sp_world_t *w = nullptr;
        if (mpi_rank() == 1)
            sp__world_test_fail_host_tables(table);
        sp_status_t s = sp_world_from_comm(MPI_COMM_WORLD, &w);
        sp__world_test_fail_host_tables(0);
        EXPECT_SP_STATUS(s, SP_ERR_SYSTEM);
        EXPECT_EQ(w, nullptr);
        std::string msg = sp_last_error();
        if (mpi_rank() == 1) {
            EXPECT_NE(msg.find("out of host memory for the"), std::string::npos) << msg;
        } else {
            EXPECT_NE(msg.find("rank 1 could not"), std::string::npos) << msg;
            EXPECT_NE(msg.find("out of host memory"), std::string::npos) << msg;
        }
        if (w) {
            sp_world_finalize(w);
        }
    }
    sp_world_t *w = nullptr;
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w));
    int one = 1, sum = 0;
    ASSERT_EQ(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, sp__world_comm(w)), MPI_SUCCESS);
    EXPECT_EQ(sum, mpi_size());
    EXPECT_GE(sp_world_node_count(w), 1);
    EXPECT_GE(sp_world_node(w, mpi_rank()), 0);
    EXPECT_NE(sp_world_node_name(w, sp_world_node(w, mpi_rank())), nullptr);
    ASSERT_SP_OK(sp_world_finalize(w));
}

TEST_F(World, MpiErrorsBecomeSpErrMpiWithMpisText) {
    expect_warnings();
    EXPECT_SP_OK(sp__world_mpi_status(MPI_SUCCESS, "nothing"));
    EXPECT_SP_STATUS(sp__world_mpi_status(MPI_ERR_COMM, "MPI_Test_thing"), SP_ERR_MPI);
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find("MPI_Test_thing failed"), std::string::npos) << msg;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(MPI_ERR_COMM, text, &len);
    EXPECT_NE(msg.find(text), std::string::npos) << msg;
}

// The agreement's short round travels every value as v and ~v under MPI_MAX: the extremes of
// int64 and negative fields must come back as the exact min and max, the op and call number
// as well, and a failed rank must still be counted and named (the full round that follows).
TEST_F(World, AgreementGivesExactMinAndMaxAndNamesFailedRanks) {
    MPI_Comm comm;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    for (int with_bad : {0, 1}) {
        sp_agree_t a;
        std::memset(&a, 0, sizeof a);
        a.op = SP_AGREE_ALLREDUCE;
        a.callno = 7;
        a.ok = !(with_bad && rank == size - 1);
        a.f[0] = rank == 0 ? INT64_MIN : INT64_MAX;
        a.f[1] = -1 - rank;
        a.f[2] = 42;
        a.f[3] = rank == 1 ? INT64_MAX : 0;
        bool abandoned = true;
        ASSERT_SP_OK(sp__agree(comm, &a, "test round", &abandoned));
        EXPECT_FALSE(abandoned);
        EXPECT_SP_OK(sp__agree_check(&a, "test round"));
        EXPECT_EQ(a.op_lo, SP_AGREE_ALLREDUCE);
        EXPECT_EQ(a.op_hi, SP_AGREE_ALLREDUCE);
        EXPECT_EQ(a.call_lo, 7u);
        EXPECT_EQ(a.call_hi, 7u);
        EXPECT_EQ(a.lo[0], INT64_MIN);
        EXPECT_EQ(a.hi[0], size > 1 ? INT64_MAX : INT64_MIN); // one rank: rank 0's alone
        EXPECT_EQ(a.lo[1], -size);
        EXPECT_EQ(a.hi[1], -1);
        EXPECT_EQ(a.lo[2], 42);
        EXPECT_EQ(a.hi[2], 42);
        EXPECT_EQ(a.lo[3], 0);
        EXPECT_EQ(a.hi[3], size > 1 ? INT64_MAX : 0);
        EXPECT_FALSE(a.late);
        EXPECT_EQ(a.nbad, with_bad);
        EXPECT_EQ(a.bad_lo, with_bad ? size - 1 : -1);
        EXPECT_EQ(a.bad_set[0], with_bad ? 1ull << (size - 1) : 0ull);
    }
    // A rank in another call: both sides are named, on every rank (needs a second rank).
    if (size < 2)
        return;
    sp_agree_t a;
    std::memset(&a, 0, sizeof a);
    a.op = rank == 0 ? SP_AGREE_BROADCAST : SP_AGREE_ALLGATHER;
    a.callno = rank == 0 ? 3 : 4;
    a.ok = true;
    bool abandoned = true;
    ASSERT_SP_OK(sp__agree(comm, &a, "test round", &abandoned));
    EXPECT_EQ(a.op_lo, SP_AGREE_ALLGATHER);
    EXPECT_EQ(a.op_hi, SP_AGREE_BROADCAST);
    EXPECT_EQ(a.call_lo, 3u);
    EXPECT_EQ(a.call_hi, 4u);
    expect_warnings();
    EXPECT_SP_STATUS(sp__agree_check(&a, "test round"), SP_ERR_MISMATCH);
    MPI_Comm_free(&comm);
}

// A round on comm whose last rank enters `late` after the others (a barrier first): the inputs
// of an allreduce's first round, ready for sp__agree.
sp_agree_t last_rank_late(MPI_Comm comm, int rank, int size, struct timespec late) {
    MPI_Barrier(comm);
    if (rank == size - 1)
        nanosleep(&late, nullptr);
    sp_agree_t a;
    std::memset(&a, 0, sizeof a);
    a.op = SP_AGREE_ALLREDUCE;
    a.callno = 1;
    a.ok = true;
    return a;
}

// A rank waiting in a round for a late peer (the last rank, 1.5 s late here) sleeps between its
// polls once it has waited a while: it used to poll and sched_yield the whole time, which burns
// its core when nothing else is runnable (SYMPOOL_SYM_TIMEOUT allows a minute). Its thread's CPU
// time over the wait is asserted below a quarter of the wait: polling took all of it that the
// scheduler gave, half or more even with every core of a two-core machine busy.
TEST_F(World, RankWaitingForALatePeerSleepsInsteadOfPolling) {
    SP_SKIP_BELOW_RANKS(2);
    MPI_Comm comm;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "30"}});
    sp_agree_t a = last_rank_late(comm, rank, size, {1, 500000000});
    bool abandoned = true;
    struct timespec cpu0, cpu1, wall0, wall1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
    clock_gettime(CLOCK_MONOTONIC, &wall0);
    ASSERT_SP_OK(sp__agree(comm, &a, "test round", &abandoned));
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
    clock_gettime(CLOCK_MONOTONIC, &wall1);
    EXPECT_FALSE(abandoned);
    EXPECT_SP_OK(sp__agree_check(&a, "test round"));
    auto secs = [](const timespec &t0, const timespec &t1) {
        return double(t1.tv_sec - t0.tv_sec) + double(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    };
    double waited = secs(wall0, wall1), cpu = secs(cpu0, cpu1);
    if (rank != size - 1) {
        EXPECT_GT(waited, 1.0) << "the late rank was not late";
        EXPECT_LT(cpu, 0.25 * waited)
            << "a waiting rank used " << cpu << " s of CPU in " << waited << " s";
    }
    MPI_Comm_free(&comm);
}

// The late rule is decided from the round's data, the same on every rank: a rank that enters
// within the margin (a tenth of the timeout here) of a peer's deadline makes the round a timeout
// everywhere. By each rank's own clock at completion, the ranks could split when the round
// completed near that deadline: one timed out at it while a peer that saw the round complete a
// moment earlier went on into the data transfer, and the job hung (3 runs in 15). Here the last
// rank enters 1.9 s into a 2 s timeout: the round completes before rank 0's deadline, and every
// rank still says SP_ERR_TIMEOUT. A next round, entered together, succeeds.
TEST_F(World, ARankEnteringNearAPeersDeadlineTimesOutEveryRank) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    MPI_Comm comm; // never freed: a rank that gave up leaves its request pending on it
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "2"}});
    sp_agree_t a = last_rank_late(comm, rank, size, {1, 900000000});
    bool abandoned = false;
    sp_status_t s = sp__agree(comm, &a, "test round", &abandoned);
    EXPECT_EQ(s, SP_ERR_TIMEOUT) << sp::describe(s) << ": " << sp_last_error();
    int timed_out = s == SP_ERR_TIMEOUT, all = 0;
    MPI_Allreduce(&timed_out, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    EXPECT_EQ(all, 1) << "some rank went on";
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm next; // a fresh one: comm may hold an abandoned round
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &next), MPI_SUCCESS);
    std::memset(&a, 0, sizeof a);
    a.op = SP_AGREE_ALLREDUCE;
    a.callno = 1;
    a.ok = true;
    EXPECT_SP_OK(sp__agree(next, &a, "test round", &abandoned));
    EXPECT_FALSE(a.late);
    MPI_Comm_free(&next);
}

} // namespace
