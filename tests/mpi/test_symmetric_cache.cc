// test_symmetric_cache.cc: how a symmetric pool's cache stays symmetric when ranks' caches
// differ (a free held by a pending stream event on one rank; no block ever lent on OOM),
// collective growth failure, collective empty cache and destroy, zero registrations in a steady
// loop, and the creation checks. Runs under mpirun at 2, 4, 8 ranks on the host backend.
#include <mpi.h>

#include <string>
#include <vector>

#include "mpi_util.hpp"

extern "C" {
#include "world/world.h"
#include "pool/pool.h"
}

namespace {

class SymmetricCache : public SymPoolTest {
  protected:
    void make(bool use_on_oom = false) { make_pool(/*world_init=*/false, use_on_oom, "cache"); }
    void expect_identical(void *ptr, const std::string &what) {
        sp_window_info_t wi;
        ASSERT_SP_OK(sp_symmetric_window(ptr, &wi));
        long long lo, hi;
        rank_minmax((long long)wi.segment_seq, &lo, &hi);
        EXPECT_EQ(lo, hi) << what << ": segment seq differs across ranks";
        rank_minmax((long long)wi.offset, &lo, &hi);
        EXPECT_EQ(lo, hi) << what << ": offset differs across ranks";
    }
};

// A symmetric pool's blocks are never lent on OOM: a loan to another thread's sp_malloc between
// an agreement and its take made the ranks diverge. use_on_oom is refused at create on every
// rank (no rank keeps a pool), and a rank that runs out never borrows from a symmetric pool.
TEST_F(SymmetricCache, UseOnOomIsRefusedAndBlocksAreNeverLent) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "32MiB"}}); // before the allocator starts
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &world_));
    sp_mempool_t *q = nullptr;
    EXPECT_SP_STATUS(sym_pool_create(world_, "lender", /*use_on_oom=*/true, &q),
                     SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("use_on_oom"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(q, nullptr);
    // Only rank 0 asks: a mismatch on every rank, still no pool.
    EXPECT_NE(sym_pool_create(world_, "lender", mpi_rank() == 0, &q), SP_SUCCESS);
    EXPECT_EQ(q, nullptr);

    ASSERT_SP_OK(sym_pool_create(world_, "cache", false, &pool_));
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4 << 20, nullptr, &p)); // one 20 MiB segment
    ASSERT_SP_OK(sp_free(p));
    if (mpi_rank() == 0) {
        void *big = nullptr, *lent = nullptr;
        ASSERT_SP_OK(sp_malloc(24 << 20, 0, nullptr, &big));
        EXPECT_SP_STATUS(sp_malloc(16 << 20, 0, nullptr, &lent), SP_ERR_OUT_OF_MEMORY);
        EXPECT_EQ(lent, nullptr);
        ASSERT_SP_OK(sp_free(big));
    }
    void *r = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4 << 20, nullptr, &r));
    expect_identical(r, "after an OOM on rank 0");
    ASSERT_SP_OK(sp_free(r));
}

// On the host backend a symmetric segment is an MPI window the backend never sees: growth must
// still stay within SYMPOOL_HOST_CAPACITY, and a rank with a small device fails the growth on
// every rank (OUT_OF_MEMORY, naming it) instead of reserving far past its capacity.
TEST_F(SymmetricCache, GrowthHonoursTheHostCapacityOnEveryRank) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", mpi_rank() == 0 ? "64MiB" : "1GiB"}});
    make();
    void *p = nullptr, *q = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 40 << 20, nullptr, &p)); // fits every device
    // Another 40 MiB while the first is live: 80 MiB would exceed rank 0's 64 MiB.
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 40 << 20, nullptr, &q), SP_ERR_OUT_OF_MEMORY);
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
    if (mpi_rank() == 0) {
        EXPECT_NE(msg.find("SYMPOOL_HOST_CAPACITY"), std::string::npos) << msg;
    }
    EXPECT_EQ(q, nullptr);
    EXPECT_EQ(sp_memory_reserved(sp_world_device(world_)), (size_t)40 << 20);
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 16 << 20, nullptr, &q)); // 56 MiB: within every one
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(SymmetricCache, FreeHeldByPendingEventOnOneRank) {
    SP_SKIP_BELOW_RANKS(2);
    make();
    sp_stream_t s = nullptr;
    ASSERT_SP_OK(sp_stream_create(sp_world_device(world_), &s));
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 1 << 20, nullptr, &p));
    if (mpi_rank() == 0) {
        ASSERT_SP_OK(sp_record_stream(p, s)); // its free waits for stream s on rank 0 only
    }
    ASSERT_SP_OK(sp_free(p));
    sp_sym_counters_t before = sym_counters();
    void *q = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 1 << 20, nullptr, &q));
    sp_sym_counters_t after = sym_counters();
    expect_identical(q, "with a pending free on rank 0");
    EXPECT_EQ(after.growths, before.growths)
        << "completing the pending free must make the caches agree without a growth";
    EXPECT_EQ(after.agreement_rounds - before.agreement_rounds, 2);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_stream_destroy(s));
}

TEST_F(SymmetricCache, EmptyCacheReleasesWhatIsFreeEverywhere) {
    SP_SKIP_BELOW_RANKS(2);
    make();
    std::vector<void *> v(3);
    for (auto &p : v)
        ASSERT_SP_OK(sp_symmetric_malloc(pool_, 12 << 20, nullptr, &p)); // 3 segments
    ASSERT_EQ(sp__pool_segment_count(pool_), 3u);
    sp_sym_counters_t before = sym_counters();
    size_t reserved = sp_memory_reserved(sp_world_device(world_));
    // Rank 1 keeps block 1; everybody frees the rest.
    for (size_t i = 0; i < v.size(); i++)
        if (!(i == 1 && mpi_rank() == 1))
            ASSERT_SP_OK(sp_free(v[i]));
    ASSERT_SP_OK(sp_symmetric_empty_cache(pool_));
    EXPECT_EQ(sp__pool_segment_count(pool_), 1u)
        << "segment 1 is busy on rank 1, so it stays everywhere";
    sp_sym_counters_t after = sym_counters();
    EXPECT_EQ(after.deregistrations - before.deregistrations, 2);
    EXPECT_LT(sp_memory_reserved(sp_world_device(world_)), reserved);
    if (mpi_rank() == 1)
        ASSERT_SP_OK(sp_free(v[1]));
    ASSERT_SP_OK(sp_symmetric_empty_cache(pool_));
    EXPECT_EQ(sp__pool_segment_count(pool_), 0u);
    EXPECT_EQ(sp_mempool_total_bytes(pool_), 0u);
    after = sym_counters();
    EXPECT_EQ(after.registrations - after.deregistrations, 0) << "no registration left";
    // The pool grows again after an empty cache, symmetrically.
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    expect_identical(p, "after empty cache");
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(SymmetricCache, SteadyLoopMakesNoRegistrations) {
    make();
    const size_t sizes[] = {4096, 1 << 20, 5 << 20, 24 << 20, 777};
    auto step = [&]() {
        void *ptrs[5];
        for (int i = 0; i < 5; i++)
            ASSERT_SP_OK(sp_symmetric_malloc(pool_, sizes[i], nullptr, &ptrs[i]));
        for (int i = 4; i >= 0; i--)
            ASSERT_SP_OK(sp_free(ptrs[i]));
    };
    step(); // warm-up grows the segments
    sp_sym_counters_t before = sym_counters();
    for (int it = 0; it < 200; it++)
        step();
    sp_sym_counters_t after = sym_counters();
    EXPECT_EQ(after.registrations - before.registrations, 0);
    EXPECT_EQ(after.growths - before.growths, 0);
    EXPECT_EQ(after.mallocs - before.mallocs, 1000);
    EXPECT_EQ(after.agreement_rounds - before.agreement_rounds, 1000) << "one allreduce per hit";
}

TEST_F(SymmetricCache, OneRankCannotGrowSoNoneDoes) {
    expect_warnings();
    make();
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p)); // a 2 MiB small segment
    if (mpi_rank() == mpi_size() - 1) {
        ASSERT_SP_OK(sp_mempool_set_limit(pool_, 4 << 20)); // too small for a 20 MiB segment
    }
    sp_sym_counters_t before = sym_counters();
    void *q = nullptr;
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 8 << 20, nullptr, &q), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(q, nullptr);
    sp_sym_counters_t after = sym_counters();
    EXPECT_EQ(after.registrations, before.registrations) << "no rank may be left half-grown";
    EXPECT_EQ(sp__pool_segment_count(pool_), 1u);
    ASSERT_SP_OK(sp_mempool_set_limit(pool_, 0));
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 8 << 20, nullptr, &q));
    expect_identical(q, "after the failed growth");
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(SymmetricCache, DestroyIsCollectiveAndRefusesLiveBlocks) {
    expect_warnings();
    make();
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    if (mpi_rank() != 0) {
        ASSERT_SP_OK(sp_free(p));
    }
    EXPECT_SP_STATUS(sp_symmetric_mempool_destroy(pool_), SP_ERR_BUSY);
    EXPECT_NE(std::string(sp_last_error()).find("rank 0 still has live blocks"), std::string::npos)
        << sp_last_error();
    if (mpi_rank() == 0) {
        ASSERT_SP_OK(sp_free(p));
    }
    // Several ranks holding blocks: the message's verb agrees ("ranks 0 and 1 still has" before).
    if (mpi_size() > 1) {
        ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
        EXPECT_SP_STATUS(sp_symmetric_mempool_destroy(pool_), SP_ERR_BUSY);
        EXPECT_NE(std::string(sp_last_error()).find("still have live blocks"), std::string::npos)
            << sp_last_error();
        ASSERT_SP_OK(sp_free(p));
    }
    sp_sym_counters_t before = sym_counters();
    ASSERT_SP_OK(sp_symmetric_mempool_destroy(pool_));
    sp_sym_counters_t after = sym_counters();
    EXPECT_EQ(after.deregistrations - before.deregistrations, 1);
    EXPECT_EQ(after.pools, before.pools - 1);
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, nullptr, &p), SP_ERR_INVALID_USAGE);
    pool_ = nullptr;
}

TEST_F(SymmetricCache, MisuseIsRefusedLocally) {
    expect_warnings();
    make();
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_symmetric_malloc(nullptr, 64, nullptr, &p), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_mempool_malloc(pool_, 64, nullptr, &p), SP_ERR_INVALID_USAGE);
    sp_mempool_t *plain = nullptr;
    ASSERT_SP_OK(sp_mempool_create(nullptr, &plain));
    EXPECT_SP_STATUS(sp_symmetric_malloc(plain, 64, nullptr, &p), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(sp_symmetric_empty_cache(plain), SP_ERR_INVALID_USAGE);
    ASSERT_SP_OK(sp_mempool_destroy(plain));
    sp_mempool_params_t prm;
    sp_mempool_params_init(&prm);
    sp_allocator_t a = {};
    prm.allocator = &a;
    sp_mempool_t *q = nullptr;
    EXPECT_SP_STATUS(sp_symmetric_mempool_create(world_, &prm, &q), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_symmetric_mempool_create(nullptr, nullptr, &q), SP_ERR_INVALID_ARGUMENT);
}

TEST_F(SymmetricCache, CreateWithDifferentFlagsIsAMismatch) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &world_));
    sp_mempool_params_t p;
    sp_mempool_params_init(&p);
    p.no_split = mpi_rank() == 0;
    sp_mempool_t *q = nullptr;
    EXPECT_SP_STATUS(sp_symmetric_mempool_create(world_, &p, &q), SP_ERR_MISMATCH);
    EXPECT_EQ(q, nullptr);
    p.no_split = false;
    ASSERT_SP_OK(sp_symmetric_mempool_create(world_, &p, &pool_));
}

// Two pools created in swapped orders (rank 0: A then B, the others B then A) have the same
// creation numbers and flags: both creates succeeded, and each pool's first malloc waited for
// the ranks that were in the other pool until SYMPOOL_SYM_TIMEOUT broke both. Their names differ:
// each create is a mismatch on every rank, and no rank keeps either pool.
TEST_F(SymmetricCache, PoolsCreatedInSwappedOrdersAreAMismatch) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &world_));
    const char *first = mpi_rank() == 0 ? "swap-a" : "swap-b";
    const char *second = mpi_rank() == 0 ? "swap-b" : "swap-a";
    sp_mempool_t *q = nullptr;
    EXPECT_SP_STATUS(sym_pool_create(world_, first, false, &q), SP_ERR_MISMATCH);
    EXPECT_NE(std::string(sp_last_error()).find(std::string("this rank's \"") + first + "\""),
              std::string::npos)
        << sp_last_error();
    EXPECT_EQ(q, nullptr);
    EXPECT_SP_STATUS(sym_pool_create(world_, second, false, &q), SP_ERR_MISMATCH);
    EXPECT_EQ(q, nullptr);
    // In step again: the same name everywhere creates the pool, and it serves.
    ASSERT_SP_OK(sym_pool_create(world_, "swap-a", false, &pool_));
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(SymmetricCache, RegistrarChoiceIsCheckedAtCreate) {
    expect_warnings();
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &world_));
    // Each backend refuses the registrar that cannot serve it, on every rank, and creates nothing:
    // host has no NCCL communicator; cuda hands out device memory, which the mpi registrar's host
    // segments cannot stand in for. The other registrar then serves.
    const bool gpu = sp::on_gpu();
    const char *refused = gpu ? "mpi" : "nccl";
    const char *served = gpu ? "nccl" : "mpi";
    sp_mempool_t *q = nullptr;
    {
        sp::ScopedEnv env({{"SYMPOOL_SYM_REGISTRAR", refused}});
        EXPECT_SP_STATUS(sp_symmetric_mempool_create(world_, nullptr, &q), SP_ERR_NOT_SUPPORTED);
        EXPECT_NE(std::string(sp_last_error()).find(std::string(refused) + " registrar"),
                  std::string::npos)
            << sp_last_error();
        EXPECT_EQ(q, nullptr);
        if (q) // never left behind, even when the expectation above fails
            (void)sp_symmetric_mempool_destroy(q);
    }
    if (gpu && sp__world_nccl_comm(world_) == nullptr)
        GTEST_SKIP() << "sympool was built without NCCL: no registrar serves the cuda backend";
    {
        sp::ScopedEnv env({{"SYMPOOL_SYM_REGISTRAR", served}});
        ASSERT_SP_OK(sp_symmetric_mempool_create(world_, nullptr, &pool_));
    }
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 100, nullptr, &p));
    void *peer = nullptr;
    const int other = (mpi_rank() + 1) % mpi_size();
    if (other == mpi_rank()) { // one rank: its own byte, on either registrar
        EXPECT_SP_OK(sp_symmetric_peer_ptr(p, other, &peer));
        EXPECT_EQ(peer, p);
    } else if (gpu) { // nccl: no host-side peer pointers to other ranks
        EXPECT_SP_STATUS(sp_symmetric_peer_ptr(p, other, &peer), SP_ERR_NOT_SUPPORTED);
    } else { // mpi: load/store peers
        EXPECT_SP_OK(sp_symmetric_peer_ptr(p, other, &peer));
    }
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(SymmetricCache, PoolLeftAliveIsReleasedAtWorldFinalize) {
    expect_warnings();
    make();
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    sp_sym_counters_t before = sym_counters();
    ASSERT_SP_OK(sp_world_finalize(world_));
    world_ = nullptr;
    sp_sym_counters_t after = sym_counters();
    EXPECT_EQ(after.deregistrations - before.deregistrations, 1);
    EXPECT_EQ(after.pools, before.pools - 1);
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, nullptr, &p), SP_ERR_INVALID_USAGE);
    pool_ = nullptr; // sp_shutdown (fixture) drops the pool itself
}

} // namespace
