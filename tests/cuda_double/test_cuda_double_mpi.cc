// test_cuda_double_mpi.cc: the NCCL paths of sympool (symmetric/reg_nccl.c,
// collectives/coll_nccl.c, the world's communicator) under the CUDA/NCCL doubles, where a GPU
// cannot be made to fail on purpose: failures injected into the doubles on every rank (so no rank
// waits inside NCCL for a peer that already left), out of memory on small double GPUs, and an
// abort. Every rank must get an error, none may hang. Runs under mpirun, each rank on its own
// double GPU (CUDA_DOUBLE_GPUS=4, CUDA_DOUBLE_MEMORY=256MiB).
#include "mpi_util.hpp"

#include <dlfcn.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "collectives/dtype.h"
extern "C" {
#include "world/world.h"
#include <sympool/collectives.h>
void sp__reg_nccl_test_fail_devs(bool on);
void sp__reg_nccl_test_skip_gather(bool on);
void sp__reg_nccl_test_at_ready(void (*hook)(const char *pool));
void sp__reg_nccl_test_at_release(void (*hook)(const char *pool));
void sp__coll_test_at_nccl(void (*hook)(void));
void sp__world_nccl_test_at_drain(void (*hook)(void));
}

namespace {

template <typename F> F hook(const char *name) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return reinterpret_cast<F>(lib ? dlsym(lib, name) : nullptr);
}

// The NCCL double's hooks (exported from libnccl.so.2).
template <typename F> F nccl_hook(const char *name) {
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    return reinterpret_cast<F>(lib ? dlsym(lib, name) : nullptr);
}

long nccl_symmetric_kernels() {
    return nccl_hook<long (*)()>("cuda_double_nccl_symmetric_kernels")();
}

// The double's rule for a call, without running it (cuda_double_nccl_symmetric_rule).
bool nccl_symmetric_rule(sp_world_t *w, sp_coll_kind_t kind, const void *send, const void *recv,
                         size_t count, ncclDataType_t t) {
    return nccl_hook<int (*)(void *, int, const void *, const void *, size_t, int, int)>(
               "cuda_double_nccl_symmetric_rule")(sp__world_nccl_comm(w), int(kind), send, recv,
                                                  count, int(t), int(ncclSum)) != 0;
}

// sympool's rule for the same call (NULL: eligible), without running it either.
const char *sympool_symmetric_rule(sp_world_t *w, sp_coll_kind_t kind, const void *send, void *recv,
                                   size_t count, sp_dtype_t dtype) {
    sp_coll_call_t c = {kind, send, recv, count, dtype, SP_SUM, 0, nullptr};
    return sp__coll_no_symmetric_reason(w, &c);
}

// The first count whose bus bytes (NCCL 2.28.9 src/sym_kernels.cc:306-307: the message's bytes
// for all-reduce, nRanks times them otherwise) reach `limit`.
size_t first_count_at(size_t limit, sp_coll_kind_t kind, size_t elt, size_t nranks) {
    size_t per = elt * (kind == SP_COLL_ALLREDUCE ? 1 : nranks);
    return (limit + per - 1) / per;
}

void inject(const char *fn, int code, int skip = 0) {
    hook<void (*)(const char *, int, int)>("cuda_double_inject")(fn, code, skip);
}

#define NEED_DOUBLE()                                                                              \
    do {                                                                                           \
        if (!hook<void *>("cuda_double_inject") || !sp::on_gpu())                                  \
            GTEST_SKIP() << "runs on the cuda backend under the CUDA doubles only";                \
    } while (0)

class CudaDoubleMpi : public SymPoolTest {};

// A symmetric pool on a world of one node, or the test skips: NCCL 2.28 has symmetric kernels
// within one node only.
#define MAKE_ONE_NODE_POOL(name)                                                                   \
    do {                                                                                           \
        make_pool(false, false, name);                                                             \
        if (sp_world_node_count(world_) != 1)                                                      \
            GTEST_SKIP() << "NCCL 2.28 has symmetric kernels within one node only";                \
    } while (0)

// Copy a host vector into sympool memory and back (device memory is not host memory).
template <typename T> void put(void *dst, const std::vector<T> &v) {
    ASSERT_EQ(cudaMemcpy(dst, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <typename T> std::vector<T> get(const void *src, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}

TEST_F(CudaDoubleMpi, CollectivesOnWindowsAndOffThemWithTheReasonLogged) {
    NEED_DOUBLE();
    sp::ScopedEnv env({{"SYMPOOL_DEBUG", "INFO"}, {"SYMPOOL_DEBUG_SUBSYS", "COLL"}});
    make_pool(false, false, "colls");
    const int n = mpi_size(), r = mpi_rank();
    const size_t count = 1024;
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, count * 4 * n, nullptr, &a));
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, count * 4 * n, nullptr, &b));
    std::vector<float> f(count * n, float(r + 1));
    put(a, f);
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_FLOAT32, SP_SUM, nullptr));
    EXPECT_EQ(get<float>(b, 1)[0], float(n * (n + 1) / 2));
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_FLOAT32, SP_AVG, nullptr));
    EXPECT_FLOAT_EQ(get<float>(b, 1)[0], float(n + 1) / 2);
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_FLOAT64, SP_MAX, nullptr));
    ASSERT_SP_OK(sp_allgather(world_, a, b, count, SP_FLOAT32, nullptr));
    std::vector<float> g = get<float>(b, count * n);
    for (int q = 0; q < n; q++)
        EXPECT_EQ(g[q * count], float(q + 1)) << "allgather block of rank " << q;
    ASSERT_SP_OK(sp_reduce_scatter(world_, a, b, count, SP_FLOAT32, SP_SUM, nullptr));
    ASSERT_SP_OK(sp_broadcast(world_, a, b, count, SP_INT32, 0, nullptr));
    // Off the windows: plain sp_malloc memory.
    void *c = nullptr;
    ASSERT_SP_OK(sp_malloc(count * 4, sp_world_device(world_), nullptr, &c));
    put(c, std::vector<int32_t>(count, r));
    ASSERT_SP_OK(sp_allreduce(world_, c, c, count, SP_INT32, SP_PROD, nullptr));
    ASSERT_SP_OK(sp_allreduce(world_, a, c, count, SP_FLOAT32, SP_SUM, nullptr));
    ASSERT_SP_OK(sp_allreduce(world_, c, a, count, SP_FLOAT32, SP_SUM, nullptr));
    EXPECT_GT(log_.count(SP_LOG_INFO, "not symmetric kernels"), 0u);
    EXPECT_SP_OK(sp_free(c));
    EXPECT_SP_OK(sp_free(a));
    EXPECT_SP_OK(sp_free(b));
}

TEST_F(CudaDoubleMpi, AFailedCollectiveFailsOnEveryRank) {
    NEED_DOUBLE();
    expect_warnings();
    make_pool(false, false, "collfail");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    inject("ncclAllReduce", ncclInternalError); // on every rank, before any rank waits
    sp_status_t s = sp_allreduce(world_, a, a, 16, SP_FLOAT32, SP_SUM, nullptr);
    EXPECT_EQ(s, SP_ERR_NCCL) << sp_last_error();
    EXPECT_NE(std::string(sp_last_error()).find("internal error"), std::string::npos)
        << sp_last_error();
    ASSERT_SP_OK(sp_allreduce(world_, a, a, 16, SP_FLOAT32, SP_SUM, nullptr)); // it recovers
    EXPECT_SP_OK(sp_free(a));
}

TEST_F(CudaDoubleMpi, CollectiveAfterAnAbortSaysWhy) {
    NEED_DOUBLE();
    expect_warnings();
    make_pool(false, false, "aborted");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    MPI_Barrier(MPI_COMM_WORLD);
    sp__world_nccl_abort(world_, "the test aborted it");
    EXPECT_EQ(sp__world_nccl_comm(world_), nullptr);
    sp_status_t s = sp_allreduce(world_, a, a, 16, SP_FLOAT32, SP_SUM, nullptr);
    EXPECT_NE(s, SP_SUCCESS);
    EXPECT_NE(std::string(sp_last_error()).find("the test aborted it"), std::string::npos)
        << sp_last_error();
    // The window went with the communicator: releasing the segment must still work.
    EXPECT_SP_OK(sp_free(a));
    EXPECT_SP_OK(sp_symmetric_empty_cache(pool_));
    void *b = nullptr;
    EXPECT_NE(sp_symmetric_malloc(pool_, 4096, nullptr, &b), SP_SUCCESS)
        << "no communicator, no new window";
}

// The world's NCCL communicator aborted on one rank only (as after a failure there): every rank
// fails the next collective, the aborted one saying why and its peers naming it, and no rank
// enters NCCL. The aborted rank used to return alone after the agreement while its peers went
// into the NCCL collective, where real NCCL waits for it for good (the double's abort flag only
// makes them fail there instead, with a peer-aborted error that names no rank).
TEST_F(CudaDoubleMpi, CommunicatorAbortedOnOneRankFailsEveryRankNamingIt) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    make_pool(false, false, "oneabort");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    const int bad = mpi_size() - 1;
    MPI_Barrier(MPI_COMM_WORLD);
    if (mpi_rank() == bad)
        sp__world_nccl_abort(world_, "the test aborted it here");
    sp_status_t s = sp_allreduce(world_, a, a, 16, SP_FLOAT32, SP_SUM, nullptr);
    std::string msg = sp_last_error();
    if (mpi_rank() == bad) {
        EXPECT_EQ(s, SP_ERR_NOT_SUPPORTED) << msg;
        EXPECT_NE(msg.find("the test aborted it here"), std::string::npos) << msg;
    } else {
        EXPECT_EQ(s, SP_ERR_NCCL) << msg;
        EXPECT_NE(msg.find("rank " + std::to_string(bad) + " has no NCCL communicator"),
                  std::string::npos)
            << msg;
    }
    EXPECT_SP_OK(sp_free(a));
}

// A growth after the world's NCCL communicator was aborted on one rank: every rank fails it
// before any enters NCCL, the aborted rank saying its communicator was aborted and why, its
// peers naming the rank without one. The peers used to say "a rank has no NCCL communicator (no
// NCCL communicator in this world)", their own world's reason, untrue of theirs and naming no
// rank, and the aborted rank only the abort's text (at a real abort the failed registration's
// description), not that its communicator was aborted.
TEST_F(CudaDoubleMpi, GrowthAfterAnAbortOnOneRankFailsEveryRankNamingIt) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    make_pool(false, false, "growabort");
    const int bad = mpi_size() - 1;
    MPI_Barrier(MPI_COMM_WORLD);
    if (mpi_rank() == bad)
        sp__world_nccl_abort(world_, "the test aborted it here");
    void *a = nullptr;
    sp_status_t s = sp_symmetric_malloc(pool_, 4096, nullptr, &a);
    std::string msg = s == SP_SUCCESS ? "" : sp_last_error();
    EXPECT_EQ(s, SP_ERR_NCCL) << msg;
    if (mpi_rank() == bad) {
        EXPECT_NE(msg.find("communicator was aborted"), std::string::npos) << msg;
        EXPECT_NE(msg.find("the test aborted it here"), std::string::npos) << msg;
    } else {
        EXPECT_NE(msg.find("rank " + std::to_string(bad) + " has no NCCL communicator"),
                  std::string::npos)
            << msg;
    }
    if (a)
        EXPECT_SP_OK(sp_free(a));
}

// A rank whose host malloc refuses the table of its node's devices (which a growth gathers over
// the node to see whether NCCL has symmetric support) fails the growth on every rank, before any
// rank registers. It used to skip that gather while its node peers waited in it for good. The
// next growth works.
TEST_F(CudaDoubleMpi, NodeDeviceTableOutOfHostMemoryOnOneRankFailsEveryRank) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    make_pool(false, false, "devtable");
    // The failing rank must share its node (a rank alone there gathers no table): the highest
    // rank of a node with two or more, from the node table every rank holds, so that every rank
    // picks the same one, or skips, on uneven nodes too (3+1 ranks, 1+2+1).
    int bad = -1;
    for (int r = mpi_size() - 1; r >= 0 && bad < 0; r--) {
        int peers = 0;
        for (int q = 0; q < mpi_size(); q++)
            peers += sp_world_node(world_, q) == sp_world_node(world_, r);
        if (peers >= 2)
            bad = r;
    }
    if (bad < 0)
        GTEST_SKIP() << "every rank is alone on its node: none gathers a table";
    if (mpi_rank() == bad)
        sp__reg_nccl_test_fail_devs(true);
    void *a = nullptr;
    sp_status_t s = sp_symmetric_malloc(pool_, 4096, nullptr, &a);
    sp__reg_nccl_test_fail_devs(false);
    std::string msg = sp_last_error();
    EXPECT_EQ(s, SP_ERR_SYSTEM) << msg;
    EXPECT_EQ(a, nullptr);
    if (mpi_rank() == bad) {
        EXPECT_NE(msg.find("out of host memory for the table of this node's devices"),
                  std::string::npos)
            << msg;
    } else {
        EXPECT_NE(msg.find("rank " + std::to_string(bad) + " had no host memory"),
                  std::string::npos)
            << msg;
    }
    EXPECT_EQ(hook<int (*)()>("cuda_double_live_vmm_handles")(), 0) << "nothing was allocated";
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    EXPECT_SP_OK(sp_free(a));
}

// A rank whose round before the gather of the node's GPU table timed out (a round's outcome can
// differ between ranks near SYMPOOL_SYM_TIMEOUT) never joins that gather. Its node peers used to
// wait in it for good (a blocking MPI_Allgather); now they time out there too, naming it, and
// their pool breaks as at any round's timeout, with nothing left allocated. Runs in its own ctest
// (cuda_double.mpi.test_cuda_double_mpi.skip_gather) with a short SYMPOOL_SYM_TIMEOUT.
TEST_F(CudaDoubleMpi, APeerThatNeverJoinsTheNodeGpuTableIsATimeoutNotAHang) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    const double limit = sp__agree_timeout_s();
    if (limit <= 0.0 || limit > 5.0)
        GTEST_SKIP() << "runs with a short SYMPOOL_SYM_TIMEOUT (its own ctest)";
    expect_warnings();
    MAKE_ONE_NODE_POOL("skipgather");
    if (sp__world_local_size(world_) < 2)
        GTEST_SKIP() << "a rank alone on its node gathers no table";
    const int bad = mpi_size() - 1;
    if (mpi_rank() == bad)
        sp__reg_nccl_test_skip_gather(true);
    void *a = nullptr;
    sp_status_t s = sp_symmetric_malloc(pool_, 4096, nullptr, &a);
    sp__reg_nccl_test_skip_gather(false);
    std::string msg = sp_last_error();
    // In step again (the skipping rank returned at once, its peers at their deadline), so that
    // the world's finalize round is not late on one rank.
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ(s, SP_ERR_TIMEOUT) << msg;
    EXPECT_EQ(a, nullptr);
    if (mpi_rank() != bad) {
        EXPECT_NE(msg.find("GPU table"), std::string::npos) << msg;
        EXPECT_NE(msg.find("not every rank arrived"), std::string::npos) << msg;
    }
    EXPECT_EQ(hook<int (*)()>("cuda_double_live_vmm_handles")(), 0) << "the growth's memory freed";
    // Broken on every rank: later calls are refused at once with the saved reason.
    EXPECT_EQ(sp_symmetric_malloc(pool_, 4096, nullptr, &a), SP_ERR_INVALID_USAGE);
    msg = sp_last_error();
    EXPECT_NE(msg.find("pool broken by timeout"), std::string::npos) << msg;
    EXPECT_EQ(sp_symmetric_mempool_destroy(pool_), SP_ERR_INVALID_USAGE);
    pool_ = nullptr; // released at sp_world_finalize
}

// Events of this rank's threads, for the tests that hold a registration's ready round open:
// sp__reg_nccl_test_at_ready's hook, called on a growing thread right before that round, notes
// "<pool> entered", waits for the event the test named for its pool (if any), then notes
// "<pool> at ready". The
// wait is bounded by three SYMPOOL_SYM_TIMEOUTs only so that a lock held across the hook (the
// defect these tests catch) ends in the growth's timeout instead of a hang: no assertion is
// about time.
struct Events {
    std::mutex mu;
    std::condition_variable cv;
    std::set<std::string> seen;
    std::map<std::string, std::string> before; // pool -> the event its ready round waits for
    void note(const std::string &e) {
        std::lock_guard<std::mutex> l(mu);
        seen.insert(e);
        cv.notify_all();
    }
    void wait(const std::string &e, double limit_s = 3 * sp__agree_timeout_s() + 1) {
        std::unique_lock<std::mutex> l(mu);
        cv.wait_for(l, std::chrono::duration<double>(limit_s), [&] { return seen.count(e) != 0; });
    }
    // Until either event (bounded as wait is).
    void wait_any(const std::string &a, const std::string &b,
                  double limit_s = 3 * sp__agree_timeout_s() + 1) {
        std::unique_lock<std::mutex> l(mu);
        cv.wait_for(l, std::chrono::duration<double>(limit_s),
                    [&] { return seen.count(a) != 0 || seen.count(b) != 0; });
    }
};
Events *g_events;
void at_ready(const char *pool) {
    g_events->note(std::string(pool) + " entered");
    auto it = g_events->before.find(pool);
    if (it != g_events->before.end())
        g_events->wait(it->second);
    g_events->note(std::string(pool) + " at ready");
}

// One growth of `pool` by `size` bytes, its status and message kept. It notes both events when
// it returns too, so that nothing waits for a growth that failed before the round.
struct Growth {
    sp_status_t s = SP_ERR_INTERNAL;
    std::string msg;
    void *p = nullptr;
    void run(sp_mempool_t *pool, const char *name, size_t size) {
        s = sp_symmetric_malloc(pool, size, nullptr, &p);
        msg = s == SP_SUCCESS ? "" : sp_last_error();
        g_events->note(std::string(name) + " entered");
        g_events->note(std::string(name) + " at ready");
    }
};

// Two symmetric pools grown at once from two threads, reaching their registrations in opposite
// orders on neighbouring ranks (even ranks "ord_a" first, odd ranks "ord_b" first: the other
// pool's ready round waits for it): both windows register on every rank. With the world's NCCL
// lock held across the ready round, each rank's first pool held it while waiting there for the
// peers' same pool, whose thread waited for the lock held by the other pool: both growths failed
// with SYMPOOL_SYM_TIMEOUT. The sizes differ, so two registrations issued in different orders on
// two ranks fail in the double (2.28 needs equal sizes on every rank) instead of passing unseen.
TEST_F(CudaDoubleMpi, TwoPoolsGrowingInOppositeOrdersOnTwoThreadsBothRegister) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    make_pool(false, false, "ord_a");
    sp_mempool_t *b = nullptr;
    ASSERT_SP_OK(sym_pool_create(world_, "ord_b", false, &b));
    const bool even = mpi_rank() % 2 == 0;
    Events ev;
    ev.before[even ? "ord_b" : "ord_a"] = even ? "ord_a at ready" : "ord_b at ready";
    g_events = &ev;
    sp__reg_nccl_test_at_ready(at_ready);
    Growth ga, gb;
    std::thread ta([&] { ga.run(pool_, "ord_a", 6u << 20); });
    std::thread tb([&] { gb.run(b, "ord_b", 10u << 20); });
    ta.join();
    tb.join();
    sp__reg_nccl_test_at_ready(nullptr);
    EXPECT_EQ(ga.s, SP_SUCCESS) << ga.msg;
    EXPECT_EQ(gb.s, SP_SUCCESS) << gb.msg;
    // Both windows work: a collective on each pool's memory runs on every rank.
    if (ga.p && gb.p) {
        EXPECT_SP_OK(sp_allreduce(world_, ga.p, ga.p, 1024, SP_FLOAT32, SP_SUM, nullptr));
        EXPECT_SP_OK(sp_allreduce(world_, gb.p, gb.p, 1024, SP_FLOAT32, SP_SUM, nullptr));
    }
    if (ga.p)
        EXPECT_SP_OK(sp_free(ga.p));
    if (gb.p)
        EXPECT_SP_OK(sp_free(gb.p));
    EXPECT_SP_OK(sp_symmetric_mempool_destroy(b));
}

// sp__reg_nccl_test_at_release's hook for DeregistrationsAndRegistrationsTakeTurns: on ranks
// but 0 the release of pool "turn_a" waits (one second at most) until pool "turn_b" has grown.
void hold_release_for_b(const char *pool) {
    if (std::strcmp(pool, "turn_a") == 0 && mpi_rank() != 0)
        g_events->wait("turn_b grown", 1.0);
}

// A release on one thread and a growth of another pool on another, on one world: NCCL gives a new
// window's allocation the lowest free place in its big VA space on each rank alone, so the
// released window must be gone on every rank or on none when the new one is registered, or the
// new window gets different places on different ranks (the double fails a symmetric collective
// there, as NCCL's check mode does; NVLS's multicast binding would pair the wrong memory).
// Rank 0 releases pool turn_a's segment, then grows turn_b; the other ranks start turn_b's growth
// at once and hold turn_a's deregistration back until turn_b has grown, or for a second. The
// world's turns put both in one order on every rank, and turn_b's window works.
TEST_F(CudaDoubleMpi, DeregistrationsAndRegistrationsTakeTurns) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    MAKE_ONE_NODE_POOL("turn_a");
    sp_mempool_t *b = nullptr;
    ASSERT_SP_OK(sym_pool_create(world_, "turn_b", false, &b));
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 12 << 20, nullptr, &a)); // a segment of its own
    ASSERT_SP_OK(sp_free(a));
    Events ev;
    g_events = &ev;
    sp__reg_nccl_test_at_release(hold_release_for_b);
    sp_status_t se = SP_ERR_INTERNAL;
    std::thread ta([&] {
        se = sp_symmetric_empty_cache(pool_);
        ev.note("turn_a released");
    });
    if (mpi_rank() == 0)
        ev.wait("turn_a released");
    Growth g;
    g.run(b, "turn_b", 12 << 20);
    ev.note("turn_b grown");
    ta.join();
    sp__reg_nccl_test_at_release(nullptr);
    EXPECT_EQ(se, SP_SUCCESS);
    ASSERT_EQ(g.s, SP_SUCCESS) << g.msg;
    EXPECT_SP_OK(sp_allreduce(world_, g.p, g.p, 1024, SP_FLOAT32, SP_SUM, nullptr));
    EXPECT_SP_OK(sp_free(g.p));
    EXPECT_SP_OK(sp_symmetric_mempool_destroy(b));
}

// A collective on another thread while a growth waits in its registration's ready round: on
// every rank but 0 the growth's ready round waits until this rank's collective has returned,
// and rank 0 starts its collective only once its growth is at that round; the round cannot
// complete before the collectives do, with no timing involved. (The other ranks start theirs
// once their growth is there too, so that no rank's collective waits out a whole growth.) With the
// world's NCCL lock held across that round, rank 0's collective waited for the lock, and the growth
// failed at SYMPOOL_SYM_TIMEOUT.
TEST_F(CudaDoubleMpi, ACollectiveRunsWhileAGrowthWaitsInItsReadyRound) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    make_pool(false, false, "held");
    void *c = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, sp_world_device(world_), nullptr, &c));
    put(c, std::vector<int32_t>(16, 1));
    Events ev;
    if (mpi_rank() != 0)
        ev.before["held"] = "collective done";
    g_events = &ev;
    sp__reg_nccl_test_at_ready(at_ready);
    Growth g;
    std::thread t([&] { g.run(pool_, "held", 6u << 20); });
    ev.wait(mpi_rank() == 0 ? "held at ready" : "held entered");
    sp_status_t sc = sp_allreduce(world_, c, c, 16, SP_INT32, SP_SUM, nullptr);
    std::string msg = sc == SP_SUCCESS ? "" : sp_last_error();
    ev.note("collective done");
    t.join();
    sp__reg_nccl_test_at_ready(nullptr);
    EXPECT_EQ(sc, SP_SUCCESS) << msg;
    EXPECT_EQ(g.s, SP_SUCCESS) << g.msg;
    EXPECT_EQ(get<int32_t>(c, 1)[0], mpi_size());
    if (g.p)
        EXPECT_SP_OK(sp_free(g.p));
    EXPECT_SP_OK(sp_free(c));
}

// The hooks of ACollectiveAndARegistrationReachingNcclInOppositeOrdersBothRun: which NCCL call
// this rank's threads are inside (the double's entry hook), and a registration waiting for this
// rank's collectives that a peer has taken into NCCL already (sympool's).
void note_nccl_entry(const char *fn) {
    if (std::strcmp(fn, "ncclAllReduce") == 0)
        g_events->note("coll in nccl");
    else if (std::strcmp(fn, "ncclCommWindowRegister") == 0)
        g_events->note("reg in nccl");
}
void note_drain() {
    g_events->note("reg waits for collectives");
}
void coll_after_registration() {
    g_events->wait_any("reg in nccl", "reg waits for collectives");
}

// A collective on one thread and a growth on another reach NCCL in opposite orders on different
// ranks: on rank 0 the collective is inside ncclAllReduce before the growth's ready round starts;
// on the other ranks the collective asks for the world's NCCL lock only once the registration is
// inside ncclCommWindowRegister (or waits for that collective). Both NCCL calls wait for the
// peers inside NCCL: the registration always (2.28.9 src/dev_runtime.cc: bootstrapBarrier over
// every rank), a collective at the first use of an algorithm at least (src/enqueue.cc:453,
// src/group.cc:149: connections made at run time, NCCL_RUNTIME_CONNECT=1 by default), and the
// double's always. Ordered by each rank's NCCL lock alone, rank 0's collective held its lock
// waiting for the peers' collective, whose threads waited for the lock their registration held
// while it waited for rank 0's registration: a hang in NCCL (the double fails the calls made in
// different orders, and the growth then aborts the world's communicator). Both must run.
TEST_F(CudaDoubleMpi, ACollectiveAndARegistrationReachingNcclInOppositeOrdersBothRun) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    make_pool(false, false, "race");
    void *c = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, sp_world_device(world_), nullptr, &c));
    put(c, std::vector<float>(1024, 1.0f));
    // A failure takes the double's timeout, not its default two minutes.
    const char *old = getenv("CUDA_DOUBLE_NCCL_TIMEOUT");
    std::string keep = old ? old : "";
    setenv("CUDA_DOUBLE_NCCL_TIMEOUT", "10", 1);
    auto at_enter = nccl_hook<void (*)(void (*)(const char *))>("cuda_double_nccl_at_enter");
    Events ev;
    if (mpi_rank() == 0)
        ev.before["race"] = "coll in nccl";
    g_events = &ev;
    sp__reg_nccl_test_at_ready(at_ready);
    sp__world_nccl_test_at_drain(note_drain);
    at_enter(note_nccl_entry);
    if (mpi_rank() != 0)
        sp__coll_test_at_nccl(coll_after_registration);
    Growth g;
    std::thread t([&] { g.run(pool_, "race", 6u << 20); });
    sp_status_t sc = sp_allreduce(world_, c, c, 1024, SP_FLOAT32, SP_SUM, nullptr);
    std::string msg = sc == SP_SUCCESS ? "" : sp_last_error();
    ev.note("coll in nccl");
    t.join();
    sp__coll_test_at_nccl(nullptr);
    at_enter(nullptr);
    sp__world_nccl_test_at_drain(nullptr);
    sp__reg_nccl_test_at_ready(nullptr);
    if (old)
        setenv("CUDA_DOUBLE_NCCL_TIMEOUT", keep.c_str(), 1);
    else
        unsetenv("CUDA_DOUBLE_NCCL_TIMEOUT");
    EXPECT_EQ(sc, SP_SUCCESS) << msg;
    EXPECT_EQ(g.s, SP_SUCCESS) << g.msg;
    EXPECT_EQ(get<float>(c, 1)[0], float(mpi_size()));
    // The world's communicator is still there: another collective runs.
    EXPECT_SP_OK(sp_allreduce(world_, c, c, 1024, SP_FLOAT32, SP_SUM, nullptr));
    if (g.p)
        EXPECT_SP_OK(sp_free(g.p));
    EXPECT_SP_OK(sp_free(c));
}

TEST_F(CudaDoubleMpi, RegistrationFailureOnEveryRankAbortsAndFrees) {
    NEED_DOUBLE();
    expect_warnings();
    make_pool(false, false, "regfail");
    inject("ncclCommWindowRegister", ncclInvalidUsage);
    void *a = nullptr;
    sp_status_t s = sp_symmetric_malloc(pool_, 4096, nullptr, &a);
    EXPECT_EQ(s, SP_ERR_NCCL) << sp_last_error();
    EXPECT_EQ(a, nullptr);
    EXPECT_EQ(sp__world_nccl_comm(world_), nullptr) << "aborted so that no rank waits in NCCL";
    EXPECT_EQ(hook<int (*)()>("cuda_double_live_vmm_handles")(), 0) << "the memory was freed";
}

TEST_F(CudaDoubleMpi, SymmetricOutOfMemoryRetriesThenNamesTheRanks) {
    NEED_DOUBLE();
    expect_warnings();
    make_pool(false, false, "oom");
    // Two 200 MiB blocks on a 256 MiB double GPU: the second fails on every rank, after one
    // cache release and retry, with the figures.
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, size_t(200) << 20, nullptr, &a));
    sp_status_t s = sp_symmetric_malloc(pool_, size_t(200) << 20, nullptr, &b);
    EXPECT_EQ(s, SP_ERR_OUT_OF_MEMORY) << sp_last_error();
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find("total capacity"), std::string::npos) << msg;
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_symmetric_empty_cache(pool_));
    // One rank's allocation fails once: it releases its cache, retries, and all go on.
    void *plain = nullptr;
    ASSERT_SP_OK(sp_malloc(8 << 20, sp_world_device(world_), nullptr, &plain));
    ASSERT_SP_OK(sp_free(plain)); // cached, to be released by the retry
    if (mpi_rank() == mpi_size() - 1)
        inject("ncclMemAlloc", ncclUnhandledCudaError);
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    EXPECT_SP_OK(sp_free(a));
}

TEST_F(CudaDoubleMpi, ReleaseFailuresAreReportedAndNothingLeaks) {
    NEED_DOUBLE();
    expect_warnings();
    make_pool(false, false, "relfail");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    inject("ncclCommWindowDeregister", ncclInvalidArgument);
    inject("ncclMemFree", ncclUnhandledCudaError);
    sp_status_t s = sp_symmetric_empty_cache(pool_);
    EXPECT_NE(s, SP_SUCCESS) << "a failed deregistration is reported";
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    // The nccl registrar synchronizes the device before deregistering (the segment's stream may
    // have been destroyed by then).
    inject("cudaDeviceSynchronize", cudaErrorInvalidValue);
    EXPECT_NE(sp_symmetric_empty_cache(pool_), SP_SUCCESS);
}

// A release waits for the device first: a rank whose wait fails cannot know its kernels are done
// with the segments, so no rank releases one (a segment gone on some ranks only would leave the
// pool asymmetric), and every rank says so; the next release, the device fine, releases them.
TEST_F(CudaDoubleMpi, AFailedDeviceWaitOnOneRankReleasesNothingAnywhere) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    make_pool(false, false, "waitfail");
    const int dev = sp_world_device(world_);
    sp_device_usage_t u0, u1, u2;
    ASSERT_SP_OK(sp_device_usage(dev, &u0));
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 3 << 20, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_device_usage(dev, &u1));
    ASSERT_GE(u1.reserved, u0.reserved + (3 << 20));
    if (mpi_rank() == 0) {
        inject("cudaDeviceSynchronize", cudaErrorUnknown);
    }
    EXPECT_NE(sp_symmetric_empty_cache(pool_), SP_SUCCESS);
    EXPECT_NE(std::string(sp_last_error()).find("no rank released a segment"), std::string::npos)
        << sp_last_error();
    ASSERT_SP_OK(sp_device_usage(dev, &u2));
    EXPECT_EQ(u2.reserved, u1.reserved) << "released after a failed wait";
    EXPECT_SP_OK(sp_symmetric_empty_cache(pool_));
    ASSERT_SP_OK(sp_device_usage(dev, &u2));
    EXPECT_EQ(u2.reserved, u0.reserved);
}

// A release that fails for one segment on one rank (here its deregistration) goes on with the
// other agreed segments: every rank lets go of the same ones, so the pool stays symmetric.
TEST_F(CudaDoubleMpi, AFailedReleaseOfOneSegmentStillReleasesTheOthersEverywhere) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    make_pool(false, false, "relrest");
    const int dev = sp_world_device(world_);
    sp_device_usage_t u0, u1, u2;
    ASSERT_SP_OK(sp_device_usage(dev, &u0));
    void *a = nullptr, *b = nullptr;
    // Over 10 MiB each: a segment of its own (smaller ones share a 20 MiB segment).
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 12 << 20, nullptr, &a));
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 12 << 20, nullptr, &b));
    sp_window_info_t wa; // the first segment's, whose release fails on rank 0 (undone below)
    ASSERT_SP_OK(sp_symmetric_window(a, &wa));
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_device_usage(dev, &u1));
    ASSERT_GE(u1.reserved, u0.reserved + (24 << 20)) << "two segments";
    if (mpi_rank() == 0) {
        inject("ncclCommWindowDeregister", ncclInvalidArgument);
    }
    const sp_status_t s = sp_symmetric_empty_cache(pool_);
    if (mpi_rank() == 0) {
        EXPECT_NE(s, SP_SUCCESS) << "the failed deregistration is reported";
    }
    ASSERT_SP_OK(sp_device_usage(dev, &u2));
    EXPECT_EQ(u2.reserved, u0.reserved) << "a segment kept on rank " << mpi_rank();
    // What the refusal kept on rank 0 was tried again at the next segment's release, and went.
    EXPECT_EQ(hook<int (*)(const void *)>("cuda_double_device_of")(wa.segment_base), -1)
        << "the first segment's memory is still allocated on rank " << mpi_rank();
}

// The device memory and VMM handles this process holds under the doubles, over its devices.
size_t double_used() {
    size_t u = 0;
    for (int d = 0; d < sp_device_count(); d++)
        u += hook<size_t (*)(int)>("cuda_double_memory_used")(d);
    return u;
}
int double_handles() {
    return hook<int (*)()>("cuda_double_live_vmm_handles")();
}

// A segment's release whose ncclCommWindowDeregister or ncclMemFree NCCL refuses, on every rank:
// SP_ERR_NCCL naming the call (not a warning and success), and the segment is not forgotten:
// what was refused is tried again, so after the pool's destroy and the world's finalize the
// device holds no memory and no VMM handle of it.
class CudaDoubleMpiRefusal : public CudaDoubleMpi {
  protected:
    void refused_release_everywhere(const char *fn, int code) {
        expect_warnings();
        const size_t u0 = double_used();
        const int h0 = double_handles();
        make_pool(false, false, fn);
        void *a = nullptr;
        ASSERT_SP_OK(sp_symmetric_malloc(pool_, 12 << 20, nullptr, &a));
        ASSERT_SP_OK(sp_free(a));
        inject(fn, code);
        const sp_status_t s = sp_symmetric_empty_cache(pool_);
        inject(fn, 0);
        EXPECT_EQ(s, SP_ERR_NCCL) << sp_last_error();
        EXPECT_NE(std::string(sp_last_error()).find(fn), std::string::npos) << sp_last_error();
        const sp_status_t d = sp_symmetric_mempool_destroy(pool_);
        pool_ = nullptr;
        EXPECT_SP_OK(d);
        const sp_status_t f = sp_world_finalize(world_);
        world_ = nullptr;
        EXPECT_SP_OK(f);
        EXPECT_EQ(double_used(), u0) << "device memory kept past destroy and finalize";
        EXPECT_EQ(double_handles(), h0) << "VMM handles kept past destroy and finalize";
    }
};

TEST_F(CudaDoubleMpiRefusal, RefusedDeregistrationIsAnErrorAndLeaksNothing) {
    NEED_DOUBLE();
    refused_release_everywhere("ncclCommWindowDeregister", ncclInvalidUsage);
}

TEST_F(CudaDoubleMpiRefusal, RefusedMemFreeIsAnErrorAndLeaksNothing) {
    NEED_DOUBLE();
    refused_release_everywhere("ncclMemFree", ncclUnhandledCudaError);
}

// A window NCCL never lets go of (its deregistration refused again by the destroy that releases
// nothing and at finalize, right before the communicator goes) goes with the communicator
// (ncclCommDestroy, NCCL 2.28.9 src/init.cc commFree -> ncclDevrFinalize), and its memory is freed
// right after that: a warning says so, finalize succeeds, and the device holds nothing of it.
TEST_F(CudaDoubleMpiRefusal, AWindowNeverDeregisteredGoesWithTheCommunicator) {
    NEED_DOUBLE();
    expect_warnings();
    const size_t u0 = double_used();
    const int h0 = double_handles();
    make_pool(false, false, "nodereg");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 12 << 20, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    inject("ncclCommWindowDeregister", ncclInvalidUsage);
    EXPECT_EQ(sp_symmetric_empty_cache(pool_), SP_ERR_NCCL) << sp_last_error();
    inject("ncclCommWindowDeregister", ncclInvalidUsage); // the destroy's try (it releases nothing)
    const sp_status_t d = sp_symmetric_mempool_destroy(pool_);
    pool_ = nullptr;
    EXPECT_SP_OK(d);
    inject("ncclCommWindowDeregister", ncclInvalidUsage); // finalize's try, too
    const sp_status_t f = sp_world_finalize(world_);
    world_ = nullptr;
    inject("ncclCommWindowDeregister", 0);
    EXPECT_SP_OK(f);
    EXPECT_EQ(warnings("went with the world's communicator"), 1u);
    EXPECT_EQ(double_used(), u0);
    EXPECT_EQ(double_handles(), h0);
}

// A pool (named `name`) whose one cached 12 MiB segment an empty_cache could not let go of on
// rank 0 (its ncclCommWindowDeregister refused): SP_ERR_NCCL there, success elsewhere, and rank 0
// keeps the window and its memory. *u0 and *h0: the device's bytes and VMM handles before.
class CudaDoubleMpiKept : public SymPoolTest {
  protected:
    void refuse_on_rank0(const char *name, size_t *u0, int *h0) {
        make_pool(false, false, name);
        *u0 = double_used();
        *h0 = double_handles();
        void *a = nullptr;
        ASSERT_SP_OK(sp_symmetric_malloc(pool_, 12 << 20, nullptr, &a));
        ASSERT_SP_OK(sp_free(a));
        if (mpi_rank() == 0) {
            inject("ncclCommWindowDeregister", ncclInvalidUsage);
        }
        const sp_status_t s = sp_symmetric_empty_cache(pool_);
        if (mpi_rank() == 0) {
            EXPECT_EQ(s, SP_ERR_NCCL) << sp_last_error();
            EXPECT_GT(double_used(), *u0) << "the refused segment was not kept";
        } else {
            EXPECT_SP_OK(s);
        }
    }
    // A 12 MiB growth, an all-reduce on it (which the double fails where the ranks' windows lie
    // at different places of NCCL's space) and its release; then the device holds what it held
    // before the refusal (u0 bytes, h0 VMM handles).
    void grow_use_release(size_t u0, int h0) {
        void *a = nullptr;
        ASSERT_SP_OK(sp_symmetric_malloc(pool_, 12 << 20, nullptr, &a));
        ASSERT_SP_OK(sp_allreduce(world_, a, a, 1024, SP_FLOAT32, SP_SUM, nullptr));
        ASSERT_SP_OK(sp_free(a));
        ASSERT_SP_OK(sp_symmetric_empty_cache(pool_));
        EXPECT_EQ(double_used(), u0) << "kept on rank " << mpi_rank();
        EXPECT_EQ(double_handles(), h0);
    }
};

// A refusal on one rank is that rank's error only: no rank waits for it, the next collective
// calls go on everywhere, and the next growth on the world frees what that rank kept.
TEST_F(CudaDoubleMpiKept, ARefusedDeregistrationOnOneRankIsFreedByTheNextGrowth) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    size_t u0 = 0;
    int h0 = 0;
    ASSERT_NO_FATAL_FAILURE(refuse_on_rank0("onerefusal", &u0, &h0));
    grow_use_release(u0, h0); // what rank 0 kept goes at the growth
}

// What a refused deregistration kept is tried again by the next sp_symmetric_empty_cache even
// when that call has no segment of its own to release (before, only a release or a growth
// retried it, so a job that stopped growing kept it until sp_world_finalize).
TEST_F(CudaDoubleMpiKept, AnEmptyCacheWithNothingToReleaseRetriesWhatARefusalKept) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    size_t u0 = 0;
    int h0 = 0;
    ASSERT_NO_FATAL_FAILURE(refuse_on_rank0("retrykept", &u0, &h0));
    ASSERT_SP_OK(sp_symmetric_empty_cache(pool_)); // nothing cached: no segment to release
    EXPECT_EQ(double_used(), u0) << "still kept on rank " << mpi_rank();
    EXPECT_EQ(double_handles(), h0);
}

// A window NCCL refuses to let go of on one rank twice (at an empty_cache, and again when the next
// growth tries first) still holds its room in NCCL's big VA space there: NCCL places each new
// window on each rank alone (the lowest free stretch), so a window registered now would get
// another place on that rank than on the others, and the symmetric kernels on it would reach the
// wrong memory (the double fails such a call, as NCCL's check mode does). The growth is refused
// on every rank instead, naming the cause; once the window goes, the pool grows and its
// collectives run, and nothing is left behind.
TEST_F(CudaDoubleMpiKept, NoWindowIsRegisteredWhileTheRanksHoldDifferentRefusedWindows) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    size_t u0 = 0;
    int h0 = 0;
    ASSERT_NO_FATAL_FAILURE(refuse_on_rank0("twicerefused", &u0, &h0));
    if (mpi_rank() == 0) {
        inject("ncclCommWindowDeregister", ncclInvalidUsage); // the growth's try
    }
    void *a = nullptr;
    const sp_status_t g = sp_symmetric_malloc(pool_, 12 << 20, nullptr, &a);
    EXPECT_EQ(g, SP_ERR_NCCL) << "rank " << mpi_rank() << ": " << sp_last_error();
    EXPECT_NE(std::string(sp_last_error())
                  .find("hold different NCCL windows whose deregistration "
                        "NCCL refused (between 0 and 1"),
              std::string::npos)
        << sp_last_error();
    if (g == SP_SUCCESS) { // what registering anyway leads to
        EXPECT_SP_OK(sp_allreduce(world_, a, a, 1024, SP_FLOAT32, SP_SUM, nullptr));
        ASSERT_SP_OK(sp_free(a));
    }
    EXPECT_EQ(double_handles(), h0 + (mpi_rank() == 0 ? 1 : 0)) << "the refused growth kept memory";
    // The next growth's try lets go of the window on rank 0: every rank registers, at one place.
    grow_use_release(u0, h0);
}

// Without symmetric support a "window" is a local registration (NCCL 2.28.9 src/dev_runtime.cc
// :593-597), which takes no place in NCCL's big VA space: one kept on one rank does not stop a
// growth.
TEST_F(CudaDoubleMpiKept, ARefusedLocalRegistrationDoesNotStopAGrowth) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    sp::ScopedEnv env({{"NCCL_WIN_ENABLE", "0"}}); // before the world: NCCL reads it then
    size_t u0 = 0;
    int h0 = 0;
    ASSERT_NO_FATAL_FAILURE(refuse_on_rank0("localkept", &u0, &h0));
    if (mpi_rank() == 0) {
        inject("ncclCommWindowDeregister", ncclInvalidUsage); // the growth's try
    }
    grow_use_release(u0, h0); // and the release's try lets go of it
}

// A refusal inside a destroy, on one rank: the pool is destroyed on every rank all the same
// (kept on one rank, it would be a pool the others no longer have, and finalize would find the
// ranks out of step), that rank says SP_ERR_NCCL, and the world's finalize frees what it kept.
TEST_F(CudaDoubleMpi, ARefusedReleaseInADestroyStillDestroysThePoolEverywhere) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    const size_t u0 = double_used();
    const int h0 = double_handles();
    make_pool(false, false, "destroyrefusal");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 12 << 20, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    if (mpi_rank() == 0) {
        inject("ncclMemFree", ncclUnhandledCudaError);
    }
    const sp_status_t s = sp_symmetric_mempool_destroy(pool_);
    pool_ = nullptr;
    if (mpi_rank() == 0) {
        EXPECT_EQ(s, SP_ERR_NCCL) << sp_last_error();
        EXPECT_NE(std::string(sp_last_error()).find("ncclMemFree"), std::string::npos)
            << sp_last_error();
    } else {
        EXPECT_SP_OK(s);
    }
    const sp_status_t f = sp_world_finalize(world_);
    world_ = nullptr;
    EXPECT_SP_OK(f);
    EXPECT_EQ(double_used(), u0) << "kept past finalize on rank " << mpi_rank();
    EXPECT_EQ(double_handles(), h0);
}

// sympool's symmetric.collectives_eligible counts exactly the calls that NCCL 2.28 runs as
// symmetric kernels (the double counts them by NCCL's rule): sum of floating types but fp64 and
// all-gather of any type on buffers in symmetric windows, and on one node only; a world over
// several nodes counts every call as a fallback and says why.
TEST_F(CudaDoubleMpi, EligibleCollectivesAreTheOnesNcclRunsAsSymmetricKernels) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    ASSERT_NE(nccl_hook<void *>("cuda_double_nccl_symmetric_kernels"), nullptr);
    sp::ScopedEnv env({{"SYMPOOL_DEBUG", "INFO"}, {"SYMPOOL_DEBUG_SUBSYS", "COLL"}});
    make_pool(false, false, "eligible");
    const int n = mpi_size();
    const size_t count = 256;
    void *a = nullptr, *b = nullptr, *c = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, count * 8 * n, nullptr, &a));
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, count * 8 * n, nullptr, &b));
    ASSERT_SP_OK(sp_malloc(count * 8 * n, sp_world_device(world_), nullptr, &c));
    put(a, std::vector<float>(count * n, 1.0f));
    uint64_t e0 = 0, f0 = 0, e1 = 0, f1 = 0;
    sp__world_collective_counts(world_, &e0, &f0);
    const long k0 = nccl_symmetric_kernels();
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_FLOAT32, SP_SUM, nullptr));
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_BFLOAT16, SP_SUM, nullptr));
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_FLOAT32, SP_AVG, nullptr));
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_FLOAT64, SP_SUM, nullptr));
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_INT32, SP_SUM, nullptr));
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_FLOAT32, SP_MAX, nullptr));
    ASSERT_SP_OK(sp_allgather(world_, a, b, count, SP_INT64, nullptr));
    ASSERT_SP_OK(sp_reduce_scatter(world_, a, b, count, SP_FLOAT16, SP_SUM, nullptr));
    ASSERT_SP_OK(sp_broadcast(world_, a, b, count, SP_FLOAT32, 0, nullptr));
    ASSERT_SP_OK(sp_allreduce(world_, a, c, count, SP_FLOAT32, SP_SUM, nullptr));
    ASSERT_SP_OK(sp_allgather(world_, c, b, count, SP_FLOAT32, nullptr));
    sp__world_collective_counts(world_, &e1, &f1);
    const long kernels = nccl_symmetric_kernels() - k0;
    EXPECT_EQ((long)(e1 - e0), kernels) << "sympool's eligible count against NCCL's rule";
    EXPECT_EQ(e1 - e0 + f1 - f0, 11u);
    if (sp_world_node_count(world_) == 1) {
        EXPECT_EQ(kernels, 4) << "f32 and bf16 sum, all-gather, f16 reduce-scatter";
    } else {
        EXPECT_EQ(kernels, 0) << "NCCL 2.28 has symmetric kernels within one node only";
        EXPECT_EQ(log_.count(SP_LOG_INFO, "ranks span several nodes"), 11u);
    }
    EXPECT_SP_OK(sp_free(c));
    EXPECT_SP_OK(sp_free(b));
    EXPECT_SP_OK(sp_free(a));
}

// NCCL 2.28.9 runs no symmetric kernel at >= 64 GiB of bus bytes (src/sym_kernels.cc:312,
// ncclSymkMask): sympool's rule and the double's agree with it on both sides of the boundary,
// checked on the rules alone (no test can allocate such buffers).
TEST_F(CudaDoubleMpi, SymmetricKernelsEndAt64GiBOfBusBytes) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    MAKE_ONE_NODE_POOL("busbytes");
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &b));
    const size_t n = size_t(mpi_size()), limit = size_t(64) << 30;
    struct Case {
        sp_coll_kind_t kind;
        sp_dtype_t dtype;
        ncclDataType_t t;
        size_t elt;
    } cases[] = {{SP_COLL_ALLREDUCE, SP_FLOAT32, ncclFloat32, 4},
                 {SP_COLL_ALLREDUCE, SP_BFLOAT16, ncclBfloat16, 2},
                 {SP_COLL_ALLGATHER, SP_FLOAT32, ncclFloat32, 4},
                 {SP_COLL_ALLGATHER, SP_INT8, ncclInt8, 1},
                 {SP_COLL_REDUCE_SCATTER, SP_FLOAT16, ncclFloat16, 2}};
    for (const Case &k : cases) {
        const size_t at = first_count_at(limit, k.kind, k.elt, n);
        for (size_t count : {at - 1, at}) {
            const bool symk = count < at;
            const char *why = sympool_symmetric_rule(world_, k.kind, a, b, count, k.dtype);
            EXPECT_EQ(nccl_symmetric_rule(world_, k.kind, a, b, count, k.t), symk)
                << "the double, kind " << k.kind << " count " << count;
            EXPECT_EQ(why == nullptr, symk) << "sympool, kind " << k.kind << " count " << count
                                            << ": " << (why ? why : "eligible");
        }
    }
    EXPECT_SP_OK(sp_free(b));
    EXPECT_SP_OK(sp_free(a));
}

// NCCL_SYM_KERNEL names the one symmetric kernel NCCL 2.28.9 may use (src/sym_kernels.cc:79-102
// kernelMask_user, ANDed into ncclSymkMask at :277): a call of another collective gets none, and
// an LL kernel is dropped at >= 2 GiB of bus bytes (:309). NCCL reads the variable once a process,
// so this test has a process of its own (ctest cuda_double.mpi.test_cuda_double_mpi.sym_kernel)
// with NCCL_SYM_KERNEL=AllGather_LL on every rank; elsewhere it skips.
TEST_F(CudaDoubleMpi, NcclSymKernelNamesTheOnlyKernel) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    const char *k = std::getenv("NCCL_SYM_KERNEL");
    if (!k || std::strcmp(k, "AllGather_LL") != 0)
        GTEST_SKIP() << "runs with NCCL_SYM_KERNEL=AllGather_LL (its own ctest)";
    sp::ScopedEnv env({{"SYMPOOL_DEBUG", "INFO"}, {"SYMPOOL_DEBUG_SUBSYS", "COLL"}});
    MAKE_ONE_NODE_POOL("symkernel");
    const size_t n = size_t(mpi_size()), count = 256;
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, count * 4 * n, nullptr, &a));
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, count * 4 * n, nullptr, &b));
    put(a, std::vector<float>(count * n, 1.0f));
    uint64_t e0 = 0, f0 = 0, e1 = 0, f1 = 0;
    sp__world_collective_counts(world_, &e0, &f0);
    const long k0 = nccl_symmetric_kernels();
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_FLOAT32, SP_SUM, nullptr));
    ASSERT_SP_OK(sp_allgather(world_, a, b, count, SP_FLOAT32, nullptr));
    ASSERT_SP_OK(sp_reduce_scatter(world_, a, b, count, SP_FLOAT32, SP_SUM, nullptr));
    sp__world_collective_counts(world_, &e1, &f1);
    const long kernels = nccl_symmetric_kernels() - k0;
    EXPECT_EQ(kernels, 1) << "the all-gather only";
    EXPECT_EQ((long)(e1 - e0), kernels) << "sympool's eligible count against NCCL's rule";
    EXPECT_EQ(f1 - f0, 2u);
    EXPECT_EQ(log_.count(SP_LOG_INFO, "NCCL_SYM_KERNEL"), 2u);
    // The LL kernel ends below 2 GiB of bus bytes, and with it the call's last kernel.
    const size_t at = first_count_at(size_t(2) << 30, SP_COLL_ALLGATHER, 4, n);
    for (size_t c : {at - 1, at}) {
        const char *why = sympool_symmetric_rule(world_, SP_COLL_ALLGATHER, a, b, c, SP_FLOAT32);
        EXPECT_EQ(nccl_symmetric_rule(world_, SP_COLL_ALLGATHER, a, b, c, ncclFloat32), c < at)
            << "the double, count " << c;
        EXPECT_EQ(why == nullptr, c < at) << "sympool, count " << c << ": " << (why ? why : "");
    }
    EXPECT_SP_OK(sp_free(b));
    EXPECT_SP_OK(sp_free(a));
}

// NCCL_SYM_KERNEL is each process's own: set on one rank only, NCCL 2.28.9 would run a call on
// symmetric kernels on the other ranks and on its regular kernels on that one, which then wait for
// each other. sympool's agreement round sees the ranks disagree and fails the call on every rank
// before NCCL gets it. A call every rank runs on symmetric kernels, but chosen from different sets
// (src/sym_kernels.cc ncclSymkPickKernel picks the fastest kernel its mask leaves: AllGather_ST on
// rank 0, an LL one elsewhere for a small call), would hang as surely: refused too. A call every
// rank runs on NCCL's regular kernels still runs. Its own process
// (ctest cuda_double.mpi.test_cuda_double_mpi.sym_kernel_rank0) sets SP_TEST_SYM_KERNEL_RANK0,
// which rank 0 copies into NCCL_SYM_KERNEL before its first collective; elsewhere it skips.
TEST_F(CudaDoubleMpi, NcclSymKernelOnOneRankOnlyFailsEveryRank) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    const char *k = std::getenv("SP_TEST_SYM_KERNEL_RANK0");
    if (!k)
        GTEST_SKIP() << "runs with SP_TEST_SYM_KERNEL_RANK0=AllGather_ST (its own ctest)";
    expect_warnings();
    const int n = mpi_size(), r = mpi_rank();
    sp::ScopedEnv env({{"NCCL_SYM_KERNEL", r == 0 ? k : nullptr}});
    MAKE_ONE_NODE_POOL("symkernel0");
    const size_t count = 256;
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, count * 4 * n, nullptr, &a));
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, count * 4 * n, nullptr, &b));
    put(a, std::vector<float>(count * n, 1.0f));
    put(b, std::vector<float>(count * n, 0.0f));
    const long k0 = nccl_symmetric_kernels();
    sp_status_t s = sp_allreduce(world_, a, b, count, SP_FLOAT32, SP_SUM, nullptr);
    EXPECT_EQ(s, SP_ERR_MISMATCH) << sp_last_error();
    const std::string m = sp_last_error();
    EXPECT_NE(m.find("on some ranks and not on others"), std::string::npos) << m;
    if (r == 0) {
        EXPECT_NE(m.find("NCCL_SYM_KERNEL"), std::string::npos) << m;
    }
    EXPECT_EQ(get<float>(b, 1)[0], 0.0f) << "no rank moved any data";
    EXPECT_EQ(nccl_symmetric_kernels() - k0, 0) << "nothing reached NCCL";
    // AllGather_ST alone on rank 0, every kernel elsewhere: symmetric kernels on every rank, but
    // not the same ones.
    s = sp_allgather(world_, a, b, count, SP_FLOAT32, nullptr);
    EXPECT_EQ(s, SP_ERR_MISMATCH) << sp_last_error();
    const std::string m2 = sp_last_error();
    EXPECT_NE(m2.find("different symmetric kernels"), std::string::npos) << m2;
    EXPECT_NE(m2.find(r == 0 ? "NCCL_SYM_KERNEL=AllGather_ST" : "NCCL_SYM_KERNEL unset"),
              std::string::npos)
        << m2;
    EXPECT_EQ(get<float>(b, 1)[0], 0.0f) << "no rank moved any data";
    EXPECT_EQ(nccl_symmetric_kernels() - k0, 0) << "nothing reached NCCL";
    // int32 has no symmetric all-reduce kernel: NCCL's regular kernels on every rank.
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_INT32, SP_SUM, nullptr));
    EXPECT_EQ(nccl_symmetric_kernels() - k0, 0);
    EXPECT_SP_OK(sp_free(b));
    EXPECT_SP_OK(sp_free(a));
}

// NCCL's symmetric kernels read every peer's window at the calling rank's offset: a rank passing
// another place of its segment, another segment, or a buffer off the windows would get wrong data
// or hang on NCCL (the double fails it, as "wrong memory or hang"). sympool refuses the call on
// every rank first, moving no data; in-place all-gather and reduce-scatter still run.
TEST_F(CudaDoubleMpi, SymmetricKernelsGetTheSamePlaceOnEveryRankOrAnErrorEverywhere) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    MAKE_ONE_NODE_POOL("places");
    const int n = mpi_size(), r = mpi_rank();
    const size_t count = 256, bytes = count * 4;
    void *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 2 * bytes * n, nullptr, &a));
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 2 * bytes * n, nullptr, &b));
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, size_t(3) << 20, nullptr, &d)); // a segment of its own
    ASSERT_SP_OK(sp_malloc(bytes * n, sp_world_device(world_), nullptr, &c));
    put(a, std::vector<float>(2 * count * n, 1.0f));
    put(b, std::vector<float>(2 * count * n, 0.0f));
    const long k0 = nccl_symmetric_kernels();
    // The recv buffer one element further on the last rank.
    char *shifted = static_cast<char *>(b) + (r == n - 1 ? 4 : 0);
    sp_status_t s = sp_allreduce(world_, a, shifted, count, SP_FLOAT32, SP_SUM, nullptr);
    EXPECT_EQ(s, SP_ERR_MISMATCH) << sp_last_error();
    EXPECT_NE(std::string(sp_last_error()).find("recv buffer lies at different offsets"),
              std::string::npos)
        << sp_last_error();
    EXPECT_EQ(get<float>(b, 1)[0], 0.0f) << "no rank moved any data";
    // Another segment on rank 0, at the same offset (0).
    sp_window_info_t wa, wd;
    ASSERT_SP_OK(sp_symmetric_window(a, &wa));
    ASSERT_SP_OK(sp_symmetric_window(d, &wd));
    ASSERT_NE(wa.segment_seq, wd.segment_seq);
    ASSERT_EQ(wa.offset, wd.offset);
    s = sp_allreduce(world_, r == 0 ? d : a, b, count, SP_FLOAT32, SP_SUM, nullptr);
    EXPECT_EQ(s, SP_ERR_MISMATCH) << sp_last_error();
    EXPECT_NE(std::string(sp_last_error()).find("different symmetric segments"), std::string::npos)
        << sp_last_error();
    // Off the windows on rank 0 only.
    s = sp_allgather(world_, r == 0 ? c : a, b, count, SP_FLOAT32, nullptr);
    EXPECT_EQ(s, SP_ERR_MISMATCH) << sp_last_error();
    EXPECT_NE(std::string(sp_last_error()).find("on some ranks and not on others"),
              std::string::npos)
        << sp_last_error();
    EXPECT_EQ(nccl_symmetric_kernels() - k0, 0) << "nothing reached NCCL";
    // The same places everywhere, in place included: symmetric kernels, right results.
    ASSERT_SP_OK(sp_allreduce(world_, a, b, count, SP_FLOAT32, SP_SUM, nullptr));
    EXPECT_EQ(get<float>(b, 1)[0], float(n));
    put(b, std::vector<float>(count * n, float(r + 1)));
    ASSERT_SP_OK(
        sp_allgather(world_, static_cast<char *>(b) + r * bytes, b, count, SP_FLOAT32, nullptr));
    std::vector<float> g = get<float>(b, count * n);
    for (int q = 0; q < n; q++)
        EXPECT_EQ(g[q * count], float(q + 1)) << "in-place all-gather, block of rank " << q;
    ASSERT_SP_OK(sp_reduce_scatter(world_, a, static_cast<char *>(a) + r * bytes, count, SP_FLOAT32,
                                   SP_SUM, nullptr));
    EXPECT_EQ(nccl_symmetric_kernels() - k0, 3);
    EXPECT_SP_OK(sp_free(d));
    EXPECT_SP_OK(sp_free(c));
    EXPECT_SP_OK(sp_free(b));
    EXPECT_SP_OK(sp_free(a));
}

// NCCL 2.28.9 launches a multi-rank collective with the communicator's device current
// (src/group.cc groupLaunch: cudaSetDevice(comm->cudaDev)), so a NULL stream is that device's
// stream even when the caller has made another device current; the call runs and the caller's
// current device is left as it was.
TEST_F(CudaDoubleMpi, NullStreamIsTheCommunicatorDevicesWhateverDeviceIsCurrent) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    int ndev = 0;
    ASSERT_EQ(cudaGetDeviceCount(&ndev), cudaSuccess);
    if (ndev < 2)
        GTEST_SKIP() << "needs another device to make current";
    make_pool(false, false, "nullstream");
    const int n = mpi_size(), r = mpi_rank();
    const size_t count = 64;
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, count * 4, nullptr, &a));
    put(a, std::vector<float>(count, float(r + 1)));
    const int other = (sp_world_device(world_) + 1) % ndev;
    ASSERT_EQ(cudaSetDevice(other), cudaSuccess);
    sp_status_t s = sp_allreduce(world_, a, a, count, SP_FLOAT32, SP_SUM, nullptr);
    int cur = -1;
    EXPECT_EQ(cudaGetDevice(&cur), cudaSuccess);
    EXPECT_EQ(cur, other);
    ASSERT_EQ(cudaSetDevice(sp_world_device(world_)), cudaSuccess);
    ASSERT_SP_OK(s);
    EXPECT_EQ(get<float>(a, 1)[0], float(n * (n + 1) / 2));
    EXPECT_SP_OK(sp_free(a));
}

// Only the buffers NCCL 2.28.9's symmetric kernels reach on peers must lie at the same place on
// every rank: an all-gather reads its send buffer locally (all_gather.cuh input.localPtr()) and a
// reduce-scatter writes its recv buffer locally (reduce_scatter.cuh output.localPtr()), so those
// may lie anywhere in a window, rank by rank, and the call still runs on symmetric kernels; the
// other buffer of each must still agree.
TEST_F(CudaDoubleMpi, SymmetricKernelsCompareOnlyTheBuffersTheyReachOnPeers) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    MAKE_ONE_NODE_POOL("peerbufs");
    const int n = mpi_size(), r = mpi_rank();
    const size_t count = 256, bytes = count * 4;
    void *a = nullptr, *b = nullptr, *d = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 2 * bytes * n, nullptr, &a));
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 2 * bytes * n, nullptr, &b));
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, size_t(3) << 20, nullptr, &d)); // a segment of its own
    sp_window_info_t wa, wd;
    ASSERT_SP_OK(sp_symmetric_window(a, &wa));
    ASSERT_SP_OK(sp_symmetric_window(d, &wd));
    ASSERT_NE(wa.segment_seq, wd.segment_seq);
    const long k0 = nccl_symmetric_kernels();
    // All-gather: each rank's send at its own offset, rank 0's in another segment.
    char *send = r == 0 ? static_cast<char *>(d) : static_cast<char *>(a) + r * bytes;
    put(send, std::vector<float>(count, float(r + 1)));
    ASSERT_SP_OK(sp_allgather(world_, send, b, count, SP_FLOAT32, nullptr));
    std::vector<float> g = get<float>(b, count * n);
    for (int q = 0; q < n; q++)
        EXPECT_EQ(g[q * count], float(q + 1)) << "all-gather, block of rank " << q;
    // Reduce-scatter: each rank's recv at its own offset, rank 0's in another segment.
    put(a, std::vector<float>(count * n, 1.0f));
    char *recv = r == 0 ? static_cast<char *>(d) : static_cast<char *>(b) + r * bytes;
    ASSERT_SP_OK(sp_reduce_scatter(world_, a, recv, count, SP_FLOAT32, SP_SUM, nullptr));
    EXPECT_EQ(get<float>(recv, 1)[0], float(n));
    EXPECT_EQ(nccl_symmetric_kernels() - k0, 2);
    // The buffer reached on peers still has to agree: all-gather's recv, reduce-scatter's send.
    char *shifted = static_cast<char *>(b) + (r == n - 1 ? 4 : 0);
    sp_status_t s = sp_allgather(world_, a, shifted, count, SP_FLOAT32, nullptr);
    EXPECT_EQ(s, SP_ERR_MISMATCH) << sp_last_error();
    EXPECT_NE(std::string(sp_last_error()).find("recv buffer lies at different offsets"),
              std::string::npos)
        << sp_last_error();
    s = sp_reduce_scatter(world_, r == 0 ? d : a, b, count, SP_FLOAT32, SP_SUM, nullptr);
    EXPECT_EQ(s, SP_ERR_MISMATCH) << sp_last_error();
    EXPECT_NE(std::string(sp_last_error()).find("send buffer is in different symmetric segments"),
              std::string::npos)
        << sp_last_error();
    EXPECT_EQ(nccl_symmetric_kernels() - k0, 2) << "the refused calls reached no NCCL";
    EXPECT_SP_OK(sp_free(d));
    EXPECT_SP_OK(sp_free(b));
    EXPECT_SP_OK(sp_free(a));
}

// Without symmetric support (NCCL_WIN_ENABLE=0 here; GPUs without P2P on a real node) NCCL 2.28
// still returns a window, a local registration on which no symmetric kernel runs: sympool counts
// the calls on it as fallbacks and says why, as NCCL runs them.
TEST_F(CudaDoubleMpi, WindowsWithoutSymmetricSupportAreNotEligible) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    // Before the world: NCCL decides its symmetric support when the communicator is made.
    sp::ScopedEnv env(
        {{"NCCL_WIN_ENABLE", "0"}, {"SYMPOOL_DEBUG", "INFO"}, {"SYMPOOL_DEBUG_SUBSYS", "COLL"}});
    make_pool(false, false, "nosym");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    sp_window_info_t wi;
    ASSERT_SP_OK(sp_symmetric_window(a, &wi));
    EXPECT_NE(wi.window, nullptr) << "2.28 gives a local registration";
    uint64_t e0 = 0, f0 = 0, e1 = 0, f1 = 0;
    sp__world_collective_counts(world_, &e0, &f0);
    const long k0 = nccl_symmetric_kernels();
    ASSERT_SP_OK(sp_allreduce(world_, a, a, 64, SP_FLOAT32, SP_SUM, nullptr));
    // In place: send at this rank's slot of recv (send == recv is that on rank 0 only).
    ASSERT_SP_OK(sp_allgather(world_, static_cast<char *>(a) + (size_t)mpi_rank() * 64, a, 16,
                              SP_FLOAT32, nullptr));
    sp__world_collective_counts(world_, &e1, &f1);
    EXPECT_EQ(nccl_symmetric_kernels() - k0, 0);
    EXPECT_EQ(e1 - e0, 0u);
    EXPECT_EQ(f1 - f0, 2u);
    if (sp_world_node_count(world_) == 1) {
        EXPECT_EQ(log_.count(SP_LOG_INFO, "no symmetric support in this world (NCCL_WIN_ENABLE=0)"),
                  2u);
    }
    EXPECT_SP_OK(sp_free(a));
}

// NCCL decides its symmetric support on each rank (2.28.9 src/init.cc:1376), and its window
// registration is a local one where the support is off (src/dev_runtime.cc:593-597) but ends in a
// barrier over every rank where it is on (:628-629): ranks that differ would wait there for good.
// sympool refuses such a growth on every rank before any enters NCCL (before: rank 0 left its node
// peers in the all-gather of the node's devices).
TEST_F(CudaDoubleMpi, SymmetricSupportDifferingAcrossRanksFailsEveryRank) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    // Before the world: NCCL decides its symmetric support when the communicator is made.
    sp::ScopedEnv env({{"NCCL_WIN_ENABLE", mpi_rank() == 0 ? "0" : "1"}});
    make_pool(false, false, "mixedsupport");
    const int dev = sp_world_device(world_);
    sp_device_usage_t u0, u1;
    ASSERT_SP_OK(sp_device_usage(dev, &u0));
    void *a = nullptr;
    EXPECT_SP_STATUS(sp_symmetric_malloc(pool_, 4096, nullptr, &a), SP_ERR_MISMATCH);
    EXPECT_NE(std::string(sp_last_error()).find("symmetric support differs across ranks"),
              std::string::npos)
        << sp_last_error();
    EXPECT_EQ(a, nullptr);
    ASSERT_SP_OK(sp_device_usage(dev, &u1));
    EXPECT_EQ(u1.reserved, u0.reserved) << "the refused growth kept memory";
}

// NCCL 2.28.9 reads NCCL_WIN_ENABLE and NCCL_CUMEM_ENABLE as integers (src/misc/param.cc:76-94
// ncclLoadParam: strtoll, base 0, so "false" is 0) and has cuMem off at any negative value but -2,
// auto (src/misc/cudawrap.cc:45-49): either way no symmetric support (src/init.cc:1376), so no
// symmetric kernel, and sympool counts no call eligible.
// Ranks started with different CUDA_VISIBLE_DEVICES, where one ordinal names different GPUs (or
// none) in different processes (its own ctests, cuda_double.mpi.test_cuda_double_mpi.visible_*,
// give each rank its list and SP_TEST_VISIBLE_CASE): whether the node's GPUs reach each other by
// P2P goes by their bus ids, as NCCL's own decision does, so every rank gives NCCL's answer and
// the growth works. Judged by the ranks' ordinals, "hidden" (rank 0 sees GPU 0 alone, rank 1 sees
// GPUs 1 and 2 and is on 2, its ordinal 1) had rank 0 ask CUDA about an ordinal it has no device
// of, and "reordered" (rank 0 sees 0,1 and is on 0; rank 1 sees 2,1,0 and is on 1; GPUs 0 and 1
// have no P2P) had rank 1 ask about GPUs 2 and 1: either way the ranks' answers differed, and every
// growth failed as a symmetric support mismatch.
TEST_F(CudaDoubleMpi, SymmetricSupportGoesByTheGpusBusIdsNotTheRanksOrdinals) {
    NEED_DOUBLE();
    const char *c = std::getenv("SP_TEST_VISIBLE_CASE");
    if (!c)
        GTEST_SKIP() << "runs with per-rank CUDA_VISIBLE_DEVICES (its own ctests)";
    SP_SKIP_BELOW_RANKS(2);
    const bool reordered = std::strcmp(c, "reordered") == 0;
    if (reordered)
        expect_warnings(); // "NCCL has no symmetric support in this world"
    MAKE_ONE_NODE_POOL("visible");
    void *a = nullptr;
    ASSERT_EQ(sp_symmetric_malloc(pool_, 4096, nullptr, &a), SP_SUCCESS) << sp_last_error();
    const char *off = sp__world_nccl_no_symmetric(world_);
    if (reordered) {
        ASSERT_NE(off, nullptr);
        EXPECT_NE(std::string(off).find("cannot reach GPU"), std::string::npos) << off;
    } else {
        EXPECT_EQ(off, nullptr) << off;
    }
    // sympool's answer is NCCL's: a collective it counts eligible is one NCCL runs symmetric.
    uint64_t e0 = 0, f0 = 0, e1 = 0, f1 = 0;
    sp__world_collective_counts(world_, &e0, &f0);
    const long k0 = nccl_symmetric_kernels();
    ASSERT_SP_OK(sp_allreduce(world_, a, a, 64, SP_FLOAT32, SP_SUM, nullptr));
    sp__world_collective_counts(world_, &e1, &f1);
    EXPECT_EQ((long)(e1 - e0), nccl_symmetric_kernels() - k0);
    EXPECT_EQ(e1 - e0, reordered ? 0u : 1u);
    EXPECT_SP_OK(sp_free(a));
}

TEST_F(CudaDoubleMpi, NcclSwitchesAreReadAsNcclReadsThem) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    const std::pair<const char *, const char *> off[] = {{"NCCL_WIN_ENABLE", "false"},
                                                         {"NCCL_CUMEM_ENABLE", "-1"}};
    for (const auto &v : off) {
        // Before the world: NCCL decides its symmetric support when the communicator is made.
        sp::ScopedEnv env({v});
        make_pool(false, false, "switches");
        void *a = nullptr;
        ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
        uint64_t e0 = 0, f0 = 0, e1 = 0, f1 = 0;
        sp__world_collective_counts(world_, &e0, &f0);
        const long k0 = nccl_symmetric_kernels();
        ASSERT_SP_OK(sp_allreduce(world_, a, a, 64, SP_FLOAT32, SP_SUM, nullptr));
        ASSERT_SP_OK(sp_allgather(world_, static_cast<char *>(a) + (size_t)mpi_rank() * 64, a, 16,
                                  SP_FLOAT32, nullptr)); // in place at this rank's slot
        sp__world_collective_counts(world_, &e1, &f1);
        EXPECT_EQ(nccl_symmetric_kernels() - k0, 0) << v.first << "=" << v.second;
        EXPECT_EQ(e1 - e0, 0u) << v.first << "=" << v.second;
        EXPECT_EQ(f1 - f0, 2u) << v.first << "=" << v.second;
        EXPECT_SP_OK(sp_free(a));
        EXPECT_SP_OK(sp_symmetric_mempool_destroy(pool_));
        EXPECT_SP_OK(sp_world_finalize(world_));
        pool_ = nullptr;
        world_ = nullptr;
    }
}

// Peer pointers on the nccl registrar: none from the host in NCCL 2.28, and to a rank on another
// node none in any release (NCCL maps peers of its own node only): the message names the nodes.
TEST_F(CudaDoubleMpi, PeerPointersNameTheNodeOrTheNcclRelease) {
    NEED_DOUBLE();
    expect_warnings();
    make_pool(false, false, "peers");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    const int me = sp_world_node(world_, mpi_rank());
    for (int r = 0; r < mpi_size(); r++) {
        void *peer = nullptr;
        if (r == mpi_rank()) { // this rank's own byte: the pointer itself, in any release
            ASSERT_SP_OK(sp_symmetric_peer_ptr(a, r, &peer));
            EXPECT_EQ(peer, a);
            continue;
        }
        EXPECT_SP_STATUS(sp_symmetric_peer_ptr(a, r, &peer), SP_ERR_NOT_SUPPORTED);
        std::string msg = sp_last_error();
        if (sp_world_node(world_, r) != me) {
            EXPECT_NE(msg.find("is on node " + std::to_string(sp_world_node(world_, r)) + " (" +
                               sp_world_node_name(world_, sp_world_node(world_, r)) + ")"),
                      std::string::npos)
                << msg;
        } else {
            EXPECT_NE(msg.find("NCCL 2.29"), std::string::npos) << msg;
        }
        EXPECT_EQ(peer, nullptr);
    }
    EXPECT_SP_OK(sp_free(a));
}

// Symmetric segments are ncclMemAlloc memory that sympool reserved: device.used grows by what
// NCCL allocated and device.untracked_bytes does not move; memory sympool did not take
// (cudaMalloc here, as NCCL's own buffers or another library) is untracked, on every rank.
TEST_F(CudaDoubleMpi, SymmetricSegmentsAreTrackedAndOtherMemoryIsNot) {
    NEED_DOUBLE();
    make_pool(false, false, "usage");
    const int dev = sp_world_device(world_);
    sp_device_usage_t u0, u1, u2;
    ASSERT_SP_OK(sp_device_usage(dev, &u0));
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 3 << 20, nullptr, &a));
    ASSERT_SP_OK(sp_device_usage(dev, &u1));
    EXPECT_GE(u1.used, u0.used + (3 << 20));
    EXPECT_EQ(u1.used - u0.used, u1.reserved - u0.reserved) << "the window is sympool's";
    EXPECT_EQ(u1.untracked, u0.untracked);
    void *raw = nullptr;
    const size_t outside = size_t(mpi_rank() + 1) << 20;
    ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&raw, outside), cudaSuccess);
    ASSERT_SP_OK(sp_device_usage(dev, &u2));
    EXPECT_EQ(u2.untracked, u1.untracked + outside);
    sp_stats_summary_t sum;
    ASSERT_SP_OK(sp_stats_aggregate(world_, dev, &sum));
    size_t iu = sp_stats_summary_count();
    for (size_t i = 0; i < sp_stats_summary_count(); i++)
        if (std::strcmp(sp_stats_summary_key(i), "device.untracked_bytes") == 0)
            iu = i;
    ASSERT_LT(iu, sp_stats_summary_count());
    EXPECT_EQ(sum.max_rank[iu], mpi_size() - 1) << "the rank that took the most";
    EXPECT_EQ(cudaFree(raw), cudaSuccess);
    EXPECT_SP_OK(sp_free(a));
}

// A rank under a CUDA graph capture keeps its symmetric segments, so no rank releases any: the
// release's cudaDeviceSynchronize would break the capture (PyTorch's empty_cache releases nothing
// while one is under way). After the capture, the same call releases them on every rank.
TEST_F(CudaDoubleMpi, SymmetricEmptyCacheReleasesNothingWhileARankCaptures) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    make_pool(false, false, "captured");
    const int dev = sp_world_device(world_);
    sp_device_usage_t u0, u1, u2;
    ASSERT_SP_OK(sp_device_usage(dev, &u0));
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 3 << 20, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_device_usage(dev, &u1));
    ASSERT_GE(u1.reserved, u0.reserved + (3 << 20));
    ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    const bool captures = mpi_rank() == 0;
    if (captures) {
        ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    }
    EXPECT_SP_OK(sp_symmetric_empty_cache(pool_));
    ASSERT_SP_OK(sp_device_usage(dev, &u2));
    EXPECT_EQ(u2.reserved, u1.reserved) << "released while rank 0 captured";
    if (captures) {
        cudaGraph_t g = nullptr;
        EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess) << "the release broke the capture";
        if (g)
            (void)cudaGraphDestroy(g);
        (void)cudaGetLastError();
    }
    ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
    EXPECT_SP_OK(sp_symmetric_empty_cache(pool_));
    ASSERT_SP_OK(sp_device_usage(dev, &u2));
    EXPECT_EQ(u2.reserved, u0.reserved) << "not released after the capture";
}

// Rank 0 begins a global-mode capture on the world's device (a blocking stream, so sympool sees
// it through the legacy stream, as cudaStreamIsCapturing reports it); *s_p is the stream.
void begin_capture_on_rank0(int dev, cudaStream_t *s_p) {
    ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(s_p), cudaSuccess);
    if (mpi_rank() == 0) {
        ASSERT_EQ(cudaStreamBeginCapture(*s_p, cudaStreamCaptureModeGlobal), cudaSuccess);
    }
}

// Rank 0 ends the capture, which must still be valid, and both ranks destroy the stream.
void end_capture_on_rank0(cudaStream_t s) {
    if (mpi_rank() == 0) {
        cudaGraph_t g = nullptr;
        EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess) << "the release broke the capture";
        if (g)
            (void)cudaGraphDestroy(g);
        (void)cudaGetLastError();
    }
    ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// A symmetric pool is not destroyed while a rank captures a CUDA graph: its release's
// cudaDeviceSynchronize would break the capture, and the graph may use the memory (PyTorch frees
// no memory a capture may use). Every rank refuses with SP_ERR_BUSY naming the capturing rank,
// nothing is released, and the pool stays usable; after the capture the destroy succeeds.
TEST_F(CudaDoubleMpi, SymmetricDestroyIsRefusedOnEveryRankWhileARankCaptures) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings(); // the refusal is logged
    make_pool(false, false, "capdestroy");
    const int dev = sp_world_device(world_);
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 3 << 20, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    sp_device_usage_t u0, u1;
    ASSERT_SP_OK(sp_device_usage(dev, &u0));
    const sp_sym_counters_t c0 = sym_counters();
    cudaStream_t s = nullptr;
    begin_capture_on_rank0(dev, &s);
    EXPECT_SP_STATUS(sp_symmetric_mempool_destroy(pool_), SP_ERR_BUSY);
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find("rank 0 is capturing a CUDA graph"), std::string::npos) << msg;
    ASSERT_SP_OK(sp_device_usage(dev, &u1));
    EXPECT_EQ(u1.reserved, u0.reserved) << "released while rank 0 captured";
    EXPECT_EQ(u1.used, u0.used) << "memory freed while rank 0 captured";
    EXPECT_EQ(sym_counters().deregistrations, c0.deregistrations);
    end_capture_on_rank0(s);
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 3 << 20, nullptr, &a)); // the kept segment, reused
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_symmetric_mempool_destroy(pool_));
    pool_ = nullptr;
    EXPECT_EQ(sym_counters().deregistrations, c0.deregistrations + 1);
    ASSERT_SP_OK(sp_device_usage(dev, &u1));
    EXPECT_LT(u1.used, u0.used) << "not released after the capture";
}

// sp_world_finalize cannot be refused, so while a rank captures a CUDA graph it releases no
// symmetric pool's registrations on any rank (the release would break the capture, and the graph
// may use the memory): every rank warns, naming the capturing rank, and leaves them to process
// exit, as it does for a pool a timeout broke.
TEST_F(CudaDoubleMpi, WorldFinalizeReleasesNoSymmetricPoolWhileARankCaptures) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    expect_warnings();
    make_pool(false, false, "capfinal");
    const int dev = sp_world_device(world_);
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 3 << 20, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    sp_device_usage_t u0, u1;
    ASSERT_SP_OK(sp_device_usage(dev, &u0));
    const sp_sym_counters_t c0 = sym_counters();
    cudaStream_t s = nullptr;
    begin_capture_on_rank0(dev, &s);
    EXPECT_SP_OK(sp_world_finalize(world_));
    world_ = nullptr;
    pool_ = nullptr; // no longer symmetric: sp_shutdown releases the pool, not the registration
    EXPECT_EQ(warnings("a CUDA graph capture is under way on rank 0"), 1u);
    ASSERT_SP_OK(sp_device_usage(dev, &u1));
    EXPECT_EQ(u1.used, u0.used) << "memory freed while rank 0 captured";
    EXPECT_EQ(sym_counters().deregistrations, c0.deregistrations);
    end_capture_on_rank0(s);
}

// NCCL's own device memory (a communicator's buffers, taken at its init; modelled by
// CUDA_DOUBLE_NCCL_MEMORY) is what device.untracked_bytes is for: a second world's communicator
// shows there on every rank, in the aggregate too, and goes with the world.
TEST_F(CudaDoubleMpi, NcclCommunicatorMemoryIsUntracked) {
    NEED_DOUBLE();
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &world_));
    const int dev = sp_world_device(world_);
    const size_t nccl_own = size_t(24) << 20;
    sp_device_usage_t u0, u1, u2;
    ASSERT_SP_OK(sp_device_usage(dev, &u0));
    sp_world_t *w2 = nullptr;
    {
        sp::ScopedEnv env({{"CUDA_DOUBLE_NCCL_MEMORY", "24M"}}); // read by the communicator's init
        ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w2));
    }
    ASSERT_SP_OK(sp_device_usage(dev, &u1));
    EXPECT_EQ(u1.untracked, u0.untracked + nccl_own);
    EXPECT_EQ(u1.reserved, u0.reserved);
    sp_stats_summary_t sum;
    ASSERT_SP_OK(sp_stats_aggregate(w2, dev, &sum));
    size_t iu = sp_stats_summary_count();
    for (size_t i = 0; i < sp_stats_summary_count(); i++)
        if (std::strcmp(sp_stats_summary_key(i), "device.untracked_bytes") == 0)
            iu = i;
    ASSERT_LT(iu, sp_stats_summary_count());
    EXPECT_GE(sum.min[iu], (int64_t)nccl_own) << "on every rank";
    ASSERT_SP_OK(sp_world_finalize(w2));
    ASSERT_SP_OK(sp_device_usage(dev, &u2));
    EXPECT_EQ(u2.untracked, u0.untracked);
}

// A refused ncclCommDestroy at finalize is finalize's error, and the communicator does not stay
// behind: it is aborted, which frees it (here its own device memory) without waiting for peers.
TEST_F(CudaDoubleMpi, ARefusedCommunicatorDestroyIsAnErrorAndFreesItAnyway) {
    NEED_DOUBLE();
    expect_warnings();
    const size_t u0 = double_used();
    sp_world_t *w = nullptr;
    {
        sp::ScopedEnv env({{"CUDA_DOUBLE_NCCL_MEMORY", "24M"}}); // read by the communicator's init
        ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w));
    }
    ASSERT_EQ(double_used(), u0 + (size_t(24) << 20)) << "the communicator's own memory";
    inject("ncclCommDestroy", ncclInvalidUsage);
    const sp_status_t f = sp_world_finalize(w);
    inject("ncclCommDestroy", 0);
    EXPECT_EQ(f, SP_ERR_NCCL) << sp_last_error();
    EXPECT_NE(std::string(sp_last_error()).find("ncclCommDestroy failed"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(double_used(), u0) << "the communicator stayed allocated";
}

// The world's NCCL communicator failing to come up on one rank only (a bad NCCL_SOCKET_IFNAME on
// one node, out of memory, a CUDA error): its peers used to wait in ncclCommInitRank for good
// (real NCCL waits in its bootstrap for the missing rank; the double gives up after
// CUDA_DOUBLE_NCCL_TIMEOUT, saying "NCCL would hang here") while the failed rank waited for them
// in an MPI_Allreduce. Now every rank fails creation within SYMPOOL_SYM_TIMEOUT, the waiting ones
// aborting their pending communicator, nothing is left allocated, and a new world works. The
// failure is injected into each NCCL call of the set-up in turn (the old code called
// ncclCommInitRank). Runs in its own ctests (cuda_double.mpi.test_cuda_double_mpi.nccl_init.*)
// with a short SYMPOOL_SYM_TIMEOUT.
TEST_F(CudaDoubleMpi, NcclSetUpFailingOnOneRankFailsEveryRankWithinTheDeadline) {
    NEED_DOUBLE();
    SP_SKIP_BELOW_RANKS(2);
    const double limit = sp__agree_timeout_s();
    if (limit <= 0.0 || limit > 5.0)
        GTEST_SKIP() << "runs with a short SYMPOOL_SYM_TIMEOUT (its own ctest)";
    expect_warnings();
    sp::ScopedEnv env({{"CUDA_DOUBLE_NCCL_MEMORY", "24M"}}); // read by the communicator's init
    const int bad = 1;
    const std::vector<std::vector<const char *>> steps = {
        {"ncclCommInitRank", "ncclCommInitRankConfig"}, {"ncclCommSplit"}};
    for (const auto &fns : steps) {
        SCOPED_TRACE(fns.back());
        const size_t u0 = double_used();
        if (mpi_rank() == bad)
            for (const char *fn : fns)
                inject(fn, ncclUnhandledCudaError);
        sp_world_t *w = nullptr;
        const sp_status_t s = sp_world_from_comm(MPI_COMM_WORLD, &w);
        const std::string msg = sp_last_error();
        for (const char *fn : fns)
            inject(fn, 0);
        EXPECT_NE(s, SP_SUCCESS) << "rank " << mpi_rank();
        EXPECT_EQ(w, nullptr);
        if (w)
            EXPECT_SP_OK(sp_world_finalize(w));
        // Ended by sympool's deadline, not by the double's stand-in for a hang.
        EXPECT_EQ(msg.find("NCCL would hang here"), std::string::npos) << msg;
        if (mpi_rank() == bad) {
            EXPECT_EQ(s, SP_ERR_NCCL) << msg;
            EXPECT_NE(msg.find(fns.back()), std::string::npos) << msg;
        } else {
            EXPECT_TRUE(s == SP_ERR_TIMEOUT || s == SP_ERR_NCCL)
                << sp_status_name(s) << ": " << msg;
            EXPECT_NE(msg.find("rank " + std::to_string(bad)), std::string::npos) << msg;
        }
        EXPECT_EQ(double_used(), u0) << "a communicator's memory stayed allocated";
        // The next world works, on every rank.
        ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w));
        ASSERT_SP_OK(sp_world_finalize(w));
        EXPECT_EQ(double_used(), u0);
    }
}

TEST_F(CudaDoubleMpi, NcclVersionIsLoggedOnce) {
    NEED_DOUBLE();
    // Under CUDA_DOUBLE_NCCL_VERSION (another registration of this binary), the library loaded
    // differs from the headers and the first collective says so at WARN.
    const char *v = std::getenv("CUDA_DOUBLE_NCCL_VERSION");
    if (v)
        expect_warnings();
    make_pool(false, false, "version");
    void *a = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool_, 4096, nullptr, &a));
    ASSERT_SP_OK(sp_allreduce(world_, a, a, 16, SP_FLOAT32, SP_SUM, nullptr));
    if (v) {
        EXPECT_GT(warnings("NCCL"), 0u);
    }
    EXPECT_SP_OK(sp_free(a));
}

// ---- a fault-injection sweep of the NCCL paths
// ---------------------------------------------------

// Each NCCL entry point sympool calls (and the CUDA calls of the symmetric paths), failed once on
// every rank at its 1st..4th call (the same call on every rank, as a failure of the job's NCCL
// would be; a failure on one rank only is what the tests above cover), while a fixed workload
// runs: a world, a symmetric pool, three growths, the four collectives, frees, the pool's release,
// its destruction and the world's finalize. Every step's status is the same on every rank (a rank
// going on alone would wait in NCCL for good), a failure has a message, and after it the test
// releases what it holds; then the device holds what it held before the workload (nothing leaks:
// device memory, VMM handles), and the whole workload run again without the failure succeeds.
const char *const kNcclSweepFns[] = {
    "ncclGetUniqueId",        "ncclCommInitRankConfig",   "ncclCommSplit", "ncclMemAlloc",
    "ncclCommWindowRegister", "ncclCommWindowDeregister", "ncclMemFree",   "ncclAllReduce",
    "ncclAllGather",          "ncclReduceScatter",        "ncclBroadcast", "ncclCommDestroy",
    "cudaDeviceSynchronize",  "cudaStreamSynchronize",
};

struct NcclSweep {
    std::vector<std::string> bad;
    std::string where;
    int failed = 0;
    void note(const std::string &what) { bad.push_back(where + ": " + what); }
    // A step's status on every rank: the same everywhere, a message with a failure.
    bool step(const char *name, sp_status_t s) {
        int mine[2] = {(int)s, -(int)s}, all[2] = {0, 0};
        MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (all[0] != -all[1])
            note(std::string(name) + ": statuses differ across ranks (this rank: " +
                 sp_status_name(s) + ": " + sp_last_error() + ")");
        if (s != SP_SUCCESS) {
            failed++;
            if (!*sp_last_error())
                note(std::string(name) + ": " + sp_status_name(s) + " with no message");
            if (getenv("SP_SWEEP_VERBOSE") && mpi_rank() == 0)
                printf("sweep: %s: %s: %s: %s\n", where.c_str(), name, sp_status_name(s),
                       sp_last_error());
        }
        return all[0] == 0 && all[1] == 0;
    }
};

// The workload; false when a step failed (what it holds is released).
bool nccl_workload(NcclSweep &w) {
    sp_world_t *world = nullptr;
    sp_mempool_t *pool = nullptr;
    void *p[3] = {nullptr, nullptr, nullptr};
    const size_t sizes[3] = {4096, size_t(8) << 20, size_t(40) << 20};
    bool ok = w.step("world", sp_world_from_comm(MPI_COMM_WORLD, &world));
    if (ok)
        ok = w.step("pool", sym_pool_create(world, "sweep", false, &pool));
    for (int i = 0; ok && i < 3; i++)
        ok = w.step("symmetric_malloc", sp_symmetric_malloc(pool, sizes[i], nullptr, &p[i]));
    const int n = mpi_size();
    if (ok)
        ok =
            w.step("allreduce", sp_allreduce(world, p[1], p[1], 1024, SP_FLOAT32, SP_SUM, nullptr));
    if (ok)
        ok = w.step("allgather", sp_allgather(world, p[0], p[1], 256, SP_FLOAT32, nullptr));
    if (ok)
        ok = w.step("reduce_scatter",
                    sp_reduce_scatter(world, p[1], p[2], 1024 / n, SP_FLOAT32, SP_SUM, nullptr));
    if (ok)
        ok = w.step("broadcast", sp_broadcast(world, p[0], p[0], 1024, SP_INT32, 0, nullptr));
    for (void *&q : p)
        if (q) {
            EXPECT_SP_OK(sp_free(q));
            q = nullptr;
        }
    if (pool && ok)
        ok = w.step("symmetric_empty_cache", sp_symmetric_empty_cache(pool));
    if (pool) {
        sp_status_t s = sp_symmetric_mempool_destroy(pool);
        if (!w.step("pool_destroy", s) && s != SP_SUCCESS)
            ok = false;
    }
    if (world) {
        sp_status_t s = sp_world_finalize(world);
        if (!w.step("world_finalize", s) && s != SP_SUCCESS)
            ok = false;
    }
    return ok;
}

TEST_F(CudaDoubleMpi, NcclFaultSweep) {
    NEED_DOUBLE();
    expect_warnings();
    sp::Watchdog dog;
    NcclSweep w;
    const int ndev = sp_device_count();
    auto used = [&] { // over this process's devices
        size_t u = 0;
        for (int d = 0; d < ndev; d++)
            u += hook<size_t (*)(int)>("cuda_double_memory_used")(d);
        return u;
    };
    auto handles = [] { return hook<int (*)()>("cuda_double_live_vmm_handles")(); };
    ASSERT_TRUE(nccl_workload(w)) << "the workload without a failure";
    ASSERT_SP_OK(sp_empty_cache());
    for (const char *fn : kNcclSweepFns)
        for (int k = 0; k < 4; k++) {
            w.where = std::string(fn) + " skip " + std::to_string(k);
            size_t u0 = used();
            int h0 = handles();
            // cudaErrorInvalidValue for the CUDA calls, ncclInvalidUsage for NCCL's.
            inject(fn, fn[0] == 'c' ? (int)cudaErrorInvalidValue : (int)ncclInvalidUsage, k);
            bool ok = nccl_workload(w);
            inject(fn, 0);
            EXPECT_SP_OK(sp_empty_cache());
            if (used() != u0 || handles() != h0)
                w.note("the device holds " + std::to_string((long long)(used() - u0)) +
                       " more bytes and " + std::to_string(handles() - h0) + " more VMM handles");
            if (!ok && !nccl_workload(w))
                w.note("the workload run again failed");
            EXPECT_SP_OK(sp_empty_cache());
        }
    for (const std::string &b : w.bad)
        ADD_FAILURE() << b;
    if (mpi_rank() == 0)
        printf("nccl fault sweep: %zu functions x 4 skips on %d ranks, %d failed steps, %zu "
               "findings\n",
               sizeof kNcclSweepFns / sizeof *kNcclSweepFns, mpi_size(), w.failed, w.bad.size());
}

} // namespace
