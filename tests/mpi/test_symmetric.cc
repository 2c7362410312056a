// test_symmetric.cc: symmetric MemPools under mpirun (2, 4, 8 ranks, host backend, mpi
// registrar): identical offsets under mixed sizes and rank-specific free orders, blocks lent on
// OOM or held by pending stream events on one rank only, peer pointers, mismatch and skip
// reported on every rank, collective growth failure, collective empty cache and destroy, and
// zero registrations in a steady loop. Every test runs on every rank; the collective calls are
// made in the same order everywhere.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mpi_util.hpp"

extern "C" {
#include "pool/pool.h"
}

namespace {

class Symmetric : public SymPoolTest {
  protected:
    // MPI is already initialized by mpi_main.cc: sp_world_init must neither re-init nor finalize.
    void make(bool use_on_oom = false, const char *name = "sym") {
        make_pool(/*world_init=*/true, use_on_oom, name);
    }
    // Every rank holds ptr at the same (segment, offset) of a segment of the same size.
    void expect_identical(void *ptr, const std::string &what) {
        sp_window_info_t wi;
        ASSERT_SP_OK(sp_symmetric_window(ptr, &wi));
        unsigned long long mine[3] = {wi.segment_seq, wi.offset, wi.segment_size};
        std::vector<unsigned long long> all(3 * (size_t)mpi_size());
        MPI_Allgather(mine, 3, MPI_UNSIGNED_LONG_LONG, all.data(), 3, MPI_UNSIGNED_LONG_LONG,
                      MPI_COMM_WORLD);
        for (int r = 0; r < mpi_size(); r++) {
            EXPECT_EQ(all[3 * r], all[0]) << what << ": segment seq differs on rank " << r;
            EXPECT_EQ(all[3 * r + 1], all[1]) << what << ": offset differs on rank " << r;
            EXPECT_EQ(all[3 * r + 2], all[2]) << what << ": segment size differs on rank " << r;
        }
    }
};

TEST_F(Symmetric, WorldInitKeepsCallersMpi) {
    int provided = -1;
    MPI_Query_thread(&provided);
    make();
    EXPECT_EQ(sp_world_rank(world_), mpi_rank());
    EXPECT_EQ(sp_world_size(world_), mpi_size());
    EXPECT_TRUE(sp_mempool_is_symmetric(pool_));
    EXPECT_SP_OK(sp_symmetric_mempool_destroy(pool_));
    pool_ = nullptr;
    EXPECT_SP_OK(sp_world_finalize(world_));
    world_ = nullptr;
    int finalized = 1, initialized = 0;
    MPI_Finalized(&finalized);
    MPI_Initialized(&initialized);
    EXPECT_EQ(finalized, 0) << "sp_world_finalize finalized an MPI it did not initialize";
    EXPECT_EQ(initialized, 1);
    int q = -1;
    MPI_Query_thread(&q);
    EXPECT_EQ(q, provided) << "sp_world_init re-initialized MPI";
}

TEST_F(Symmetric, MixedSizesIdenticalOffsetsWithRankOrderedFrees) {
    make();
    // Sizes common to every rank (same seed); free order private to each rank.
    std::mt19937 common(12345);
    std::mt19937 mine(1000u + (unsigned)mpi_rank());
    const size_t sizes[] = {512,     1000,          4096,    70000,   262144,
                            1 << 20, (1 << 20) + 1, 3 << 20, 7 << 20, 12 << 20};
    std::vector<void *> live;
    sp_sym_counters_t before = sym_counters();
    int mallocs = 0;
    for (int phase = 0; phase < 12; phase++) {
        int n = 20 + (int)(common() % 10);
        for (int i = 0; i < n; i++) {
            size_t sz = sizes[common() % (sizeof sizes / sizeof sizes[0])] + (common() % 7) * 512;
            void *p = nullptr;
            ASSERT_SP_OK(sp_symmetric_malloc(pool_, sz, nullptr, &p));
            ASSERT_NE(p, nullptr);
            mallocs++;
            // Tag the ends: overlapping blocks would overwrite each other's tags. Through a copy:
            // on a GPU run the block is device memory, which the host cannot write.
            unsigned char tag[16];
            std::memset(tag, phase * 31 + i, sizeof tag);
            sp::copy_in(p, tag, sizeof tag);
            sp::copy_in((char *)p + sz - 16, tag, sizeof tag);
            expect_identical(p, "phase " + std::to_string(phase) + " alloc " + std::to_string(i));
            live.push_back(p);
        }
        // A common subset goes (same indices everywhere), each rank frees it in its own order.
        std::vector<size_t> idx;
        for (size_t i = 0; i < live.size(); i++)
            if (common() % 3 != 0)
                idx.push_back(i);
        std::vector<size_t> order = idx;
        std::shuffle(order.begin(), order.end(), mine);
        for (size_t i : order) {
            ASSERT_SP_OK(sp_free(live[i]));
            live[i] = nullptr;
        }
        live.erase(std::remove(live.begin(), live.end(), nullptr), live.end());
    }
    for (void *p : live)
        ASSERT_SP_OK(sp_free(p));
    sp_sym_counters_t after = sym_counters();
    EXPECT_EQ(after.mallocs - before.mallocs, mallocs);
    // Identical caches agree in one round: rounds beyond one per call come only from growths.
    EXPECT_LE(after.agreement_rounds - before.agreement_rounds,
              mallocs + 2 * (after.growths - before.growths));
    EXPECT_EQ(after.registrations - before.registrations, after.growths - before.growths);
}

// A peer pointer is for the buffer's bytes only: an address in the block's rounding slack (past
// the requested 1000 bytes, inside the 1024-byte block) is out of range, on every rank, this
// one included (it used to be answered, as if those bytes were the caller's), and nothing is
// written to the out-parameter.
TEST_F(Symmetric, PeerPointerInTheRoundingSlackIsOutOfRange) {
    make();
    char *buf = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 1000, nullptr, (void **)&buf));
    for (int r = 0; r < mpi_size(); r++) {
        if (sp_world_node(world_, r) != sp_world_node(world_, mpi_rank()))
            continue;
        void *peer = nullptr;
        expect_warnings();
        for (size_t at : {size_t(1000), size_t(1023)}) {
            void *sentinel = &peer;
            peer = sentinel;
            EXPECT_SP_STATUS(sp_symmetric_peer_ptr(buf + at, r, &peer), SP_ERR_INVALID_ARGUMENT);
            EXPECT_NE(std::string(sp_last_error()).find("1000 requested bytes"), std::string::npos)
                << sp_last_error();
            EXPECT_EQ(peer, sentinel);
        }
        if (r == mpi_rank()) { // the last byte of the buffer still has one, on any registrar
            ASSERT_SP_OK(sp_symmetric_peer_ptr(buf + 999, r, &peer));
            EXPECT_EQ(peer, (void *)(buf + 999));
        }
    }
    ASSERT_SP_OK(sp_free(buf));
}

// Peer pointers reach every rank of this node and no rank of another node (one node under a
// plain mpirun; several under tests/multinode/mn-run.sh, where this test runs too). Host loads
// and stores through the mpi registrar's shared segments; on a GPU the nccl registrar refuses
// host peer pointers (test_symmetric_gpu and RegistrarChoiceIsCheckedAtCreate check that).
TEST_F(Symmetric, PeerPointersReadEveryRankOfTheNodeOnly) {
    SP_SKIP_ON_GPU("peer pointers are host loads of the mpi registrar's shared memory");
    make();
    int *buf = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, (void **)&buf));
    buf[0] = 1000 + mpi_rank();
    buf[10] = 2000 + mpi_rank();
    MPI_Barrier(MPI_COMM_WORLD);
    int my_node = sp_world_node(world_, mpi_rank());
    int next_local = -1, reached = 0;
    for (int r = 0; r < mpi_size(); r++) {
        void *peer = nullptr;
        if (sp_world_node(world_, r) != my_node) {
            expect_warnings();
            EXPECT_SP_STATUS(sp_symmetric_peer_ptr(buf, r, &peer), SP_ERR_NOT_SUPPORTED);
            std::string msg = sp_last_error();
            std::string there = sp_world_node_name(world_, sp_world_node(world_, r));
            EXPECT_NE(msg.find("rank " + std::to_string(r) + " is on node"), std::string::npos)
                << msg;
            EXPECT_NE(msg.find("(" + there + ")"), std::string::npos) << msg;
            EXPECT_EQ(peer, nullptr);
            continue;
        }
        ASSERT_SP_OK(sp_symmetric_peer_ptr(buf, r, &peer));
        EXPECT_EQ(*(volatile int *)peer, 1000 + r) << "peer " << r;
        reached++;
        if (r == mpi_rank()) {
            EXPECT_EQ(peer, (void *)buf);
        } else if (next_local < 0 || (next_local < mpi_rank() && r > mpi_rank())) {
            next_local = r;
        }
    }
    EXPECT_EQ(reached, sp_world_local_size(world_));
    // Inside the block too, not only at its start.
    if (next_local >= 0) {
        void *peer = nullptr;
        ASSERT_SP_OK(sp_symmetric_peer_ptr(buf + 10, next_local, &peer));
        EXPECT_EQ(*(volatile int *)peer, 2000 + next_local);
    }
    void *peer = nullptr;
    MPI_Barrier(MPI_COMM_WORLD);
    expect_warnings();
    EXPECT_SP_STATUS(sp_symmetric_peer_ptr(buf, mpi_size(), &peer), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_symmetric_peer_ptr(buf, -1, &peer), SP_ERR_INVALID_ARGUMENT);
    // A pointer in no symmetric buffer is a bad argument too, as the header says (these were
    // SP_ERR_INVALID_USAGE): an ordinary block, and past the end of a symmetric block.
    void *plain = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, sp_world_device(world_), nullptr, &plain));
    EXPECT_SP_STATUS(sp_symmetric_peer_ptr(plain, 0, &peer), SP_ERR_INVALID_ARGUMENT);
    ASSERT_SP_OK(sp_free(plain));
    sp_window_info_t wi;
    ASSERT_SP_OK(sp_symmetric_window(buf + 1, &wi));
    EXPECT_EQ(wi.window, nullptr); // mpi registrar: no NCCL window
    EXPECT_EQ((char *)wi.segment_base + wi.offset, (char *)(buf + 1));
    ASSERT_SP_OK(sp_free(buf));
    EXPECT_SP_STATUS(sp_symmetric_window(buf, &wi), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(sp_symmetric_peer_ptr(buf, 0, &peer), SP_ERR_INVALID_ARGUMENT);
}

TEST_F(Symmetric, WindowQueryOnOtherMemoryIsAQuietNo) {
    make();
    // The collectives ask sp_symmetric_window of every buffer: "no" must not log a warning.
    void *plain = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, sp_world_device(world_), nullptr, &plain));
    sp_window_info_t wi;
    EXPECT_SP_STATUS(sp_symmetric_window(plain, &wi), SP_ERR_INVALID_USAGE);
    int local = 0;
    EXPECT_SP_STATUS(sp_symmetric_window(&local, &wi), SP_ERR_INVALID_USAGE);
    EXPECT_EQ(warnings(), 0u);
    ASSERT_SP_OK(sp_free(plain));
}

TEST_F(Symmetric, MismatchedSizeFailsOnEveryRankAndPoolStaysUsable) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    make();
    void *p = nullptr;
    size_t size = mpi_rank() == 1 ? 8192 : 4096;
    double t0 = MPI_Wtime();
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, size, nullptr, &p), SP_ERR_MISMATCH);
    double dt = MPI_Wtime() - t0;
    EXPECT_EQ(p, nullptr);
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find("call #1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("4096"), std::string::npos) << msg;
    EXPECT_NE(msg.find("8192"), std::string::npos) << msg;
    EXPECT_LT(dt, 30.0) << "a mismatch must be reported at once, not by the timeout";
    EXPECT_EQ(sp_mempool_used_bytes(pool_), 0u);
    EXPECT_EQ(sp_mempool_total_bytes(pool_), 0u) << "nothing may be grown on a mismatch";
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    expect_identical(p, "after mismatch");
    ASSERT_SP_OK(sp_free(p));
}

// SIZE_MAX on one rank: the sizes travel as int64 fields, and SIZE_MAX was clamped to INT64_MAX,
// so the mismatch said "sizes from 4096 to 9223372036854775807", a size no rank asked for.
TEST_F(Symmetric, MismatchNamesAHugeSizeAsAsked) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    make();
    void *p = nullptr;
    size_t size = mpi_rank() == 1 ? SIZE_MAX : 4096;
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, size, nullptr, &p), SP_ERR_MISMATCH);
    EXPECT_EQ(p, nullptr);
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find("sizes from 4096 to " + std::to_string(SIZE_MAX) + " bytes"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find(std::to_string(INT64_MAX)), std::string::npos) << msg;
    // Two sizes past INT64_MAX keep their order and value too.
    size = mpi_rank() == 1 ? SIZE_MAX : SIZE_MAX - 1;
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, size, nullptr, &p), SP_ERR_MISMATCH);
    msg = sp_last_error();
    EXPECT_NE(msg.find("sizes from " + std::to_string(SIZE_MAX - 1) + " to " +
                       std::to_string(SIZE_MAX) + " bytes"),
              std::string::npos)
        << msg;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    expect_identical(p, "after a huge mismatch");
    ASSERT_SP_OK(sp_free(p));
}

// A size the device cannot hold, the same on every rank: every rank refuses it itself, and its
// message named the pool and the size but not the call ("pool \"sym\": ... bytes is more than
// device 0 holds"), unlike every other argument sp_symmetric_malloc refuses.
TEST_F(Symmetric, SizeTheDeviceCannotHoldNamesTheCall) {
    expect_warnings();
    make();
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, SIZE_MAX, nullptr, &p), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(p, nullptr);
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find("sp_symmetric_malloc call #1 on pool"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(SIZE_MAX) + " bytes is more than device"), std::string::npos)
        << msg;
    EXPECT_EQ(sp_mempool_total_bytes(pool_), 0u);
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    expect_identical(p, "after a size the device cannot hold");
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(Symmetric, SkippedCallFailsOnEveryRank) {
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    make();
    void *p = nullptr;
    // Rank 0 skips the 4096 call: its 65536 call meets the others' 4096 call.
    if (mpi_rank() != 0) {
        EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, nullptr, &p), SP_ERR_MISMATCH);
    }
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 65536, nullptr, &p),
                     mpi_rank() == 0 ? SP_ERR_MISMATCH : SP_SUCCESS);
    if (mpi_rank() == 0) {
        ASSERT_SP_OK(sp_symmetric_malloc(pool_, 65536, nullptr, &p));
    }
    expect_identical(p, "after skip");
    ASSERT_SP_OK(sp_free(p));
    // A bad argument on one rank still takes part: every rank fails that call with
    // SP_ERR_INVALID_ARGUMENT (the others naming the rank), and the next call is in step.
    void **out = mpi_rank() == 0 ? nullptr : &p;
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, nullptr, out), SP_ERR_INVALID_ARGUMENT);
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find(mpi_rank() == 0 ? "ptr_p is NULL" : "rank 0 rejected"), std::string::npos)
        << msg;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    expect_identical(p, "after a bad argument");
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(Symmetric, SkippedCallNamesBothCallNumbers) {
    SP_SKIP_BELOW_RANKS(2); // one rank has no peer to disagree with
    expect_warnings();
    make();
    void *p = nullptr;
    if (mpi_rank() == 0) { // rank 0 makes one call the others do not
        EXPECT_SP_STATUS(sp_symmetric_empty_cache(pool_), SP_ERR_MISMATCH);
        std::string msg = sp_last_error();
        EXPECT_NE(msg.find("sp_symmetric_empty_cache"), std::string::npos) << msg;
        EXPECT_NE(msg.find("sp_symmetric_malloc"), std::string::npos) << msg;
    } else {
        EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, nullptr, &p), SP_ERR_MISMATCH);
    }
    // Resynchronized: the next call works everywhere.
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &p));
    expect_identical(p, "after resync");
    ASSERT_SP_OK(sp_free(p));
}
} // namespace

namespace {

bool has_text(const std::string &s, const char *needle) {
    return s.find(needle) != std::string::npos;
}

} // namespace

// sp_symmetric_malloc keys blocks by stream as sp_malloc does, and so takes CUDA's pseudo handles
// as sp_malloc does: cudaStreamPerThread (a different stream on every thread, which one cache key
// would let another thread take unordered) is a bad argument on every rank, and cudaStreamLegacy
// is the default stream, whose blocks it shares. On cuda both handles passed the stream check
// (CUDA answers for them) and keyed blocks of their own; on host both were refused as foreign.
TEST_F(Symmetric, CudaPseudoStreamsAreTakenAsSpMallocTakesThem) {
    expect_warnings();
    make();
    void *const legacy = reinterpret_cast<void *>(uintptr_t(1));
    void *const per_thread = reinterpret_cast<void *>(uintptr_t(2));
    int bad = mpi_size() - 1;
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, mpi_rank() == bad ? per_thread : nullptr, &p),
                     SP_ERR_INVALID_ARGUMENT);
    std::string msg = sp_last_error();
    EXPECT_TRUE(mpi_rank() == bad ? has_text(msg, "cudaStreamPerThread")
                                  : has_text(msg, "rejected"))
        << msg;
    EXPECT_EQ(p, nullptr);
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, legacy, &p));
    sp_block_info_t info;
    ASSERT_SP_OK(sp__pool_lookup(p, &info));
    EXPECT_EQ(info.stream, nullptr) << "cudaStreamLegacy keys the cache as NULL does";
    ASSERT_SP_OK(sp_free(p));
    void *q = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &q));
    EXPECT_EQ(q, p) << "the legacy stream's block is reused on NULL";
    ASSERT_SP_OK(sp_free(q));
}
