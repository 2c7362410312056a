// test_host_faults_mpi.cc: the collective calls when the host's own resources fail, on every
// rank alike (tests/unit/fault_probe.c makes the n-th call to a C library function fail; see
// tests/unit/test_host_faults.cc for the calls of one process).
#include <mpi.h>

#include <pthread.h>
#include <unistd.h>

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
    if (faulty) {
        ASSERT_TRUE(fp_fired());
    }
    EXPECT_EQ(s, SP_ERR_SYSTEM) << sp::describe(s);
    EXPECT_NE(std::string(sp_last_error()).find("host memory"), std::string::npos)
        << sp_last_error();
    if (s == SP_SUCCESS)
        EXPECT_SP_OK(sp_world_finalize(w));
    s = sp_world_from_comm(MPI_COMM_WORLD, &w);
    ASSERT_EQ(s, SP_SUCCESS) << sp::describe(s);
    EXPECT_SP_OK(sp_world_finalize(w));
}

// The collective calls with one rank short of host resources: the failure placed at each call
// that rank makes in turn. The rule for a misbehaving peer: every rank gets the same answer (all
// succeed, or all fail with a message), none hangs or crashes, and the call works afterwards.
class HostFaultsMpiSweep : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        expect_warnings();
    }
    struct Step {
        std::function<void()> prep;
        std::function<sp_status_t()> call;
        std::function<void(bool ok)> undo;
    };
    void sweep(const char *what, int faulty, unsigned mask, const Step &st) {
        bool mine = mpi_rank() == faulty;
        for (long n = 1; n < 100000; n++) {
            SCOPED_TRACE(std::string(what) + ", rank " + std::to_string(faulty) +
                         " failing at call " + std::to_string(n));
            st.prep();
            sp__error_clear();
            if (mine)
                fp_arm(mask, n, 0);
            sp_status_t s = st.call();
            if (mine)
                fp_disarm();
            int fired = mine && fp_fired(), any_fired = 0;
            MPI_Allreduce(&fired, &any_fired, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
            int ok = s == SP_SUCCESS, all_ok = 0, any_ok = 0;
            MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
            MPI_Allreduce(&ok, &any_ok, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
            std::string fn = mine ? fp_fired_name() : "";
            EXPECT_EQ(all_ok, any_ok) << "ranks disagree after " << (mine ? fn : "a peer's fault")
                                      << ": this rank " << sp::describe(s);
            if (!ok) {
                EXPECT_STRNE(sp_last_error(), "") << sp::describe(s);
                EXPECT_NE(s, SP_ERR_INTERNAL) << sp::describe(s);
            }
            st.undo(ok);
            if (!any_fired)
                break;
            if (!all_ok) {
                // The same call works once the failure is gone.
                st.prep();
                s = st.call();
                EXPECT_EQ(s, SP_SUCCESS) << "after " << fn << ": " << sp::describe(s);
                st.undo(s == SP_SUCCESS);
            }
        }
    }
};

TEST_F(HostFaultsMpiSweep, WorldAndCollectives) {
    SP_SKIP_BELOW_RANKS(2);
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "10"}});
    for (int faulty : {0, mpi_size() - 1}) {
        sp_world_t *w = nullptr;
        sweep("sp_world_from_comm", faulty, FP_ALL,
              {[] {}, [&] { return sp_world_from_comm(MPI_COMM_WORLD, &w); },
               [&](bool ok) {
                   if (ok)
                       EXPECT_SP_OK(sp_world_finalize(w));
               }});
        ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w));
        int64_t *buf = nullptr;
        ASSERT_SP_OK(sp_malloc(64 * sizeof(int64_t), sp_world_device(w), nullptr, (void **)&buf));
        sweep("sp_allreduce", faulty, FP_ALL,
              {[] {}, [&] { return sp_allreduce(w, buf, buf, 64, SP_INT64, SP_SUM, nullptr); },
               [](bool) {}});
        sweep("sp_allgather", faulty, FP_ALL,
              {[] {}, [&] { return sp_allgather(w, buf, buf + 8, 1, SP_INT64, nullptr); },
               [](bool) {}});
        sp_stats_summary_t *sum = new sp_stats_summary_t;
        sweep("sp_stats_aggregate", faulty, FP_ALL,
              {[] {}, [&] { return sp_stats_aggregate(w, sp_world_device(w), sum); }, [](bool) {}});
        delete sum;
        for (sp_report_format_t f : {SP_REPORT_TABLE, SP_REPORT_JSON, SP_REPORT_PROMETHEUS}) {
            char *text = nullptr;
            size_t len = 0;
            FILE *out = nullptr;
            sweep("sp_stats_report", faulty, FP_ALL,
                  {[&] { out = open_memstream(&text, &len); },
                   [&] { return sp_stats_report(w, sp_world_device(w), out, f); },
                   [&](bool ok) {
                       fclose(out);
                       if (ok && mpi_rank() == 0) {
                           EXPECT_GT(len, 0u);
                       }
                       free(text);
                       text = nullptr;
                   }});
        }
        ASSERT_SP_OK(sp_free(buf));
        ASSERT_SP_OK(sp_world_finalize(w));
    }
}

TEST_F(HostFaultsMpiSweep, SymmetricPools) {
    SP_SKIP_BELOW_RANKS(2);
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "10"}});
    sp_world_t *w = nullptr;
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w));
    for (int faulty : {0, mpi_size() - 1}) {
        sp_mempool_t *pool = nullptr;
        sweep("sp_symmetric_mempool_create", faulty, FP_ALL,
              {[] {}, [&] { return sym_pool_create(w, "sym", false, &pool); },
               [&](bool ok) {
                   if (ok)
                       EXPECT_SP_OK(sp_symmetric_mempool_destroy(pool));
               }});
        void *p = nullptr, *q = nullptr;
        sweep("sp_symmetric_malloc", faulty, FP_ALL,
              {[&] {
                   ASSERT_SP_OK(sym_pool_create(w, "sym", false, &pool));
                   ASSERT_SP_OK(sp_symmetric_malloc(pool, 4096, nullptr, &q));
               },
               [&] { return sp_symmetric_malloc(pool, 30 * sp::MiB, nullptr, &p); },
               [&](bool ok) {
                   if (ok)
                       EXPECT_SP_OK(sp_free(p));
                   EXPECT_SP_OK(sp_free(q));
                   EXPECT_SP_OK(sp_symmetric_mempool_destroy(pool));
               }});
        sweep("sp_symmetric_empty_cache", faulty, FP_ALL,
              {[&] {
                   ASSERT_SP_OK(sym_pool_create(w, "sym", false, &pool));
                   ASSERT_SP_OK(sp_symmetric_malloc(pool, 30 * sp::MiB, nullptr, &p));
                   ASSERT_SP_OK(sp_symmetric_malloc(pool, 4096, nullptr, &q));
                   ASSERT_SP_OK(sp_free(p));
               },
               [&] { return sp_symmetric_empty_cache(pool); },
               [&](bool) {
                   EXPECT_SP_OK(sp_free(q));
                   EXPECT_SP_OK(sp_symmetric_mempool_destroy(pool));
               }});
    }
    ASSERT_SP_OK(sp_world_finalize(w));
}

// SYMPOOL_REPORT_FILE at sp_world_finalize with rank 0 short of memory or of disk at each step:
// the previous report file is left whole, or replaced whole, and no temporary is left. (Finalize
// itself fails on every rank when rank 0 has no memory for the symmetric pools' release round,
// which the sweep's rule covers: the same answer everywhere, with a message.)
TEST_F(HostFaultsMpiSweep, ReportFileAtFinalize) {
    SP_SKIP_BELOW_RANKS(2);
    char dir[] = "/tmp/sp_faults_report_XXXXXX";
    std::string path;
    if (mpi_rank() == 0) {
        ASSERT_NE(mkdtemp(dir), nullptr);
        path = std::string(dir) + "/report.json";
    }
    sp::ScopedEnv env({{"SYMPOOL_SYM_TIMEOUT", "10"},
                       {"SYMPOOL_REPORT", "json"},
                       {"SYMPOOL_REPORT_FILE", mpi_rank() == 0 ? path.c_str() : "/nonexistent"}});
    sp_world_t *w = nullptr;
    sweep("SYMPOOL_REPORT_FILE", 0, FP_ALL,
          {[&] {
               if (mpi_rank() == 0) {
                   FILE *f = fopen(path.c_str(), "w");
                   ASSERT_NE(f, nullptr);
                   fputs("old report", f);
                   fclose(f);
               }
               ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w));
           },
           [&] { return sp_world_finalize(w); },
           [&](bool) {
               if (mpi_rank() != 0)
                   return;
               std::string text = sp::read_file(path);
               ASSERT_NE(text, "<missing>");
               bool whole_new = !text.empty() && text[0] == '{' && text.back() == '\n' &&
                                text.find("\"nranks\"") != std::string::npos;
               EXPECT_TRUE(text == "old report" || whole_new) << text.substr(0, 200);
               EXPECT_EQ(sp::list_dir(dir), "report.json\n") << "a temporary was left";
           }});
    if (mpi_rank() == 0) {
        unlink(path.c_str());
        rmdir(dir);
    }
}

} // namespace
