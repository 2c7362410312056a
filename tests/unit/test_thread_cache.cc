// test_thread_cache.cc: the opt-in per-thread cache (SYMPOOL_THREAD_CACHE). Off by default;
// on, a thread's freed blocks of up to 1 MiB stay allocated in the pool, idle in the thread's
// cache, for its next mallocs of the same rounded size and stream, and go back to the pool on
// sp_empty_cache, before the pool grows, at thread exit, at a walk (snapshot) and at shutdown.
// Suites are named Threads* (ThreadSanitizer runs them).
#include "alloc_test_util.hpp"

extern "C" {
#include "pool/pool.h"
#include "pool/torch.h"
#include "sympool/experimental.h"
#include "sympool/torch.h"
}

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace sp;

namespace {

size_t idle_bytes(int dev = 0) {
    size_t bytes = 0, blocks = 0;
    EXPECT_EQ(sp_x_thread_cache_idle(dev, &bytes, &blocks), SP_SUCCESS);
    return bytes;
}

size_t idle_blocks(int dev = 0) {
    size_t bytes = 0, blocks = 0;
    EXPECT_EQ(sp_x_thread_cache_idle(dev, &bytes, &blocks), SP_SUCCESS);
    return blocks;
}

// A thread that runs each job it is given, in order, and lives until it is told to stop: tests
// need a cache owner that stays alive while another thread acts on its cache.
class Worker {
  public:
    Worker() : th_([this] { loop(); }) {}
    ~Worker() {
        run([this] { stop_ = true; });
        th_.join();
    }
    void run(std::function<void()> fn) {
        std::packaged_task<void()> task(std::move(fn));
        auto done = task.get_future();
        {
            std::lock_guard<std::mutex> g(mu_);
            jobs_.push_back(std::move(task));
        }
        cv_.notify_one();
        done.get();
    }

  private:
    void loop() {
        while (!stop_) {
            std::packaged_task<void()> task;
            {
                std::unique_lock<std::mutex> g(mu_);
                cv_.wait(g, [this] { return !jobs_.empty(); });
                task = std::move(jobs_.front());
                jobs_.erase(jobs_.begin());
            }
            task();
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<std::packaged_task<void()>> jobs_;
    bool stop_ = false;
    std::thread th_;
};

} // namespace

class ThreadsCacheOff : public sp::Test {};
class ThreadsCache : public sp::Test {};

// Off by default: a free goes back to the pool at once and nothing is idle anywhere.
TEST_F(ThreadsCacheOff, DefaultKeepsNothing) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", nullptr}});
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
    EXPECT_EQ(idle_bytes(), 0u);
}

// Expandable segments and roundup divisions leave it off (it serves 512-byte rounding from
// fixed segments only).
// The idle figure's bad input: a device that does not exist and a NULL output are refused with
// a message, and the caller's outputs are left as they were.
TEST_F(ThreadsCacheOff, IdleFigureRefusesBadInput) {
    expect_warnings(); // every refusal is logged
    size_t bytes = 7, blocks = 9;
    EXPECT_EQ(sp_x_thread_cache_idle(-1, &bytes, &blocks), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("device -1"), std::string::npos) << sp_last_error();
    EXPECT_EQ(sp_x_thread_cache_idle(1 << 20, &bytes, &blocks), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(sp_x_thread_cache_idle(0, nullptr, &blocks), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("NULL"), std::string::npos) << sp_last_error();
    EXPECT_EQ(sp_x_thread_cache_idle(0, &bytes, nullptr), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(bytes, 7u);
    EXPECT_EQ(blocks, 9u);
}

TEST_F(ThreadsCacheOff, IgnoredWithRoundupDivisions) {
    sp::ScopedEnv env(
        {{"SYMPOOL_THREAD_CACHE", "1MiB"}, {"SYMPOOL_ALLOC_CONF", "roundup_power2_divisions:4"}});
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(idle_bytes(), 0u);
}

// The same thread's next malloc of the same rounded size takes the idle block back, and neither
// the hit nor the kept free changes any statistic: the block counts as allocated throughout,
// with the size requested when it left the pool. sp_empty_cache gives it back.
TEST_F(ThreadsCache, SameThreadReuseChangesNoStatistic) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "64KiB"}});
    void *p = nullptr, *q = nullptr;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(idle_bytes(), 512u);
    EXPECT_EQ(idle_blocks(), 1u);
    sp_stats_t kept = snap();
    EXPECT_EQ(stat("allocation.all.current"), 1);
    EXPECT_EQ(stat("allocated_bytes.all.current"), 512);
    EXPECT_EQ(stat("active_bytes.all.current"), 512);
    EXPECT_EQ(stat("requested_bytes.all.current"), 512);
    ASSERT_SP_OK(sp_malloc(300, 0, nullptr, &q));
    EXPECT_EQ(q, p);
    EXPECT_EQ(idle_bytes(), 0u);
    EXPECT_EQ(diff(kept, snap()), "");
    ASSERT_SP_OK(sp_free(q));
    EXPECT_EQ(diff(kept, snap()), "");
    // Another rounded size or stream is another class: the pool serves it.
    void *r = nullptr;
    ASSERT_SP_OK(sp_malloc(1024, 0, nullptr, &r));
    EXPECT_NE(r, p);
    ASSERT_SP_OK(sp_free(r));
    EXPECT_EQ(idle_bytes(), 1536u);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(idle_bytes(), 0u);
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("requested_bytes.all.current"), 0);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
    EXPECT_EQ(stat("allocation.all.allocated"), 2); // two pool allocations, one cache hit
}

// A block one thread's cache handed out and another thread frees leaves the first cache (its
// requested size becomes the last caller's) and the freeing thread's cache keeps it; the first
// thread never hands it out again.
TEST_F(ThreadsCache, CrossThreadFreeMovesTheBlock) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "64KiB"}});
    void *p = nullptr;
    {
        Worker a;
        a.run([&] {
            ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
            ASSERT_SP_OK(sp_free(p));
            void *again = nullptr;
            ASSERT_SP_OK(sp_malloc(100, 0, nullptr, &again)); // a's cache: out, asked 100
            ASSERT_EQ(again, p);
        });
        EXPECT_EQ(stat("requested_bytes.all.current"), 512); // as it left the pool
        ASSERT_SP_OK(sp_free(p)); // this thread: out of a's cache, into this one's
        EXPECT_EQ(stat("requested_bytes.all.current"), 100);
        EXPECT_EQ(idle_blocks(), 1u);
        void *other = nullptr;
        a.run([&] {
            ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &other));
            EXPECT_NE(other, p) << "a's cache handed out a block another thread holds";
            ASSERT_SP_OK(sp_free(other));
        });
        void *mine = nullptr;
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &mine));
        EXPECT_EQ(mine, p);
        ASSERT_SP_OK(sp_free(mine));
        EXPECT_EQ(idle_blocks(), 2u);
    }
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("requested_bytes.all.current"), 0);
}

// sp_empty_cache drains every thread's cache, also one whose thread is alive and idle.
TEST_F(ThreadsCache, EmptyCacheDrainsOtherThreads) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "64KiB"}});
    Worker a;
    a.run([] {
        void *p[3];
        for (void *&x : p)
            ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &x));
        for (void *x : p)
            ASSERT_SP_OK(sp_free(x));
    });
    EXPECT_EQ(idle_bytes(), 3 * 4096u);
    EXPECT_EQ(stat("allocation.all.current"), 3);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(idle_bytes(), 0u);
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
    a.run([] { // its cache works on after the drain
        void *p = nullptr;
        ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
        ASSERT_SP_OK(sp_free(p));
    });
    EXPECT_EQ(idle_bytes(), 4096u);
    ASSERT_SP_OK(sp_empty_cache());
}

// Before the pool grows (here: before an OOM), the blocks idle in other threads' caches go back
// and best fit looks again: a device that one small segment fills serves another thread's
// request from them.
TEST_F(ThreadsCache, GrowthDrainsCachesFirst) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "4MiB"}, {"SYMPOOL_HOST_CAPACITY", "2MiB"}});
    void *p[4];
    for (void *&x : p)
        ASSERT_SP_OK(sp_malloc(512 * KiB, 0, nullptr, &x)); // the whole 2 MiB segment
    for (void *x : p)
        ASSERT_SP_OK(sp_free(x));
    EXPECT_EQ(idle_bytes(), 2 * MiB);
    std::thread([] {
        void *q = nullptr;
        EXPECT_EQ(sp_malloc(MiB, 0, nullptr, &q), SP_SUCCESS) << sp_last_error();
        EXPECT_EQ(sp_free(q), SP_SUCCESS);
    }).join();
    EXPECT_EQ(stat("num_ooms"), 0);
    EXPECT_EQ(stat("num_alloc_retries"), 0);
    EXPECT_EQ(stat("segment.all.allocated"), 1);
    ASSERT_SP_OK(sp_empty_cache());
}

// A thread's exit gives its idle blocks back; a block it handed out stays allocated (an ordinary
// block now) until someone frees it.
TEST_F(ThreadsCache, ThreadExitReturnsBlocks) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "64KiB"}});
    void *out = nullptr;
    std::thread([&] {
        void *p[3];
        for (void *&x : p)
            ASSERT_SP_OK(sp_malloc(2048, 0, nullptr, &x));
        for (void *x : p)
            ASSERT_SP_OK(sp_free(x));
        ASSERT_SP_OK(sp_malloc(1800, 0, nullptr, &out)); // a hit: out, asked 1800
    }).join();
    EXPECT_EQ(idle_bytes(), 0u);
    EXPECT_EQ(stat("allocation.all.current"), 1);
    EXPECT_EQ(stat("allocated_bytes.all.current"), 2048);
    EXPECT_EQ(stat("requested_bytes.all.current"), 1800);
    ASSERT_SP_OK(sp_free(out));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("requested_bytes.all.current"), 0);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

// Bounds: idle bytes per thread at most the limit, blocks of at most 1 MiB, at most 16 size
// classes; the rest goes back to the pool at its free.
TEST_F(ThreadsCache, BoundsAreKept) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "2KiB"}});
    std::vector<void *> v(8);
    for (void *&x : v)
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &x));
    for (void *x : v)
        ASSERT_SP_OK(sp_free(x));
    EXPECT_EQ(idle_bytes(), 2048u);
    EXPECT_EQ(stat("allocation.all.current"), 4);
    ASSERT_SP_OK(sp_empty_cache());
    void *big = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &big)); // above the limit
    ASSERT_SP_OK(sp_free(big));
    EXPECT_EQ(stat("allocation.all.current"), 0);
}

TEST_F(ThreadsCache, BoundsAreKeptForSizeAndClasses) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "64MiB"}});
    void *big = nullptr;
    ASSERT_SP_OK(sp_malloc(MiB + 512, 0, nullptr, &big)); // above 1 MiB
    ASSERT_SP_OK(sp_free(big));
    EXPECT_EQ(stat("allocation.all.current"), 0);
    std::vector<void *> v(20);
    for (size_t i = 0; i < v.size(); i++)
        ASSERT_SP_OK(sp_malloc(512 * (i + 1), 0, nullptr, &v[i]));
    for (void *x : v)
        ASSERT_SP_OK(sp_free(x));
    EXPECT_EQ(idle_blocks(), 16u);
    EXPECT_EQ(stat("allocation.all.current"), 16);
    ASSERT_SP_OK(sp_empty_cache());
}

namespace {

// A random run of mallocs (all above 1 MiB, on two streams) and frees on the calling thread: the
// blocks (segment, offset, size), every statistic every 100 calls, and what a second free of a
// freed block answers.
struct LargeRun {
    std::vector<std::array<uint64_t, 3>> blocks;
    std::vector<int64_t> stats;
    sp_status_t twice = SP_SUCCESS;
};

void add_all_stats(LargeRun *r) {
    sp_stats_t st;
    EXPECT_EQ(sp_memory_stats(0, &st), SP_SUCCESS);
    for (size_t i = 0; i < sp_stats_count(); i++)
        r->stats.push_back(sp_stats_value(&st, i));
}

LargeRun large_run(uint64_t seed) {
    sp_stream_t s2;
    EXPECT_EQ(sp_stream_create(0, &s2), SP_SUCCESS);
    std::mt19937_64 rng(seed);
    const size_t sizes[] = {MiB + 1, MiB + 512, 3 * MiB / 2, 2 * MiB, 3 * MiB, 12 * MiB, 24 * MiB};
    std::vector<void *> live;
    LargeRun r;
    for (int i = 0; i < 2000; i++) {
        if (i % 100 == 0)
            add_all_stats(&r);
        if (live.empty() || rng() % 100 < 55) {
            size_t size = sizes[rng() % (sizeof sizes / sizeof sizes[0])] + rng() % 3 * 512;
            void *p = nullptr;
            EXPECT_EQ(sp_malloc(size, 0, rng() % 4 == 0 ? s2 : nullptr, &p), SP_SUCCESS);
            sp_block_info_t bi;
            EXPECT_EQ(sp__pool_lookup(p, &bi), SP_SUCCESS);
            r.blocks.push_back({bi.segment_seq | (uint64_t)bi.segment_size << 20,
                                (uint64_t)((char *)p - (char *)bi.segment_base), bi.block_size});
            live.push_back(p);
        } else {
            size_t k = rng() % live.size();
            EXPECT_EQ(sp_free(live[k]), SP_SUCCESS);
            live[k] = live.back();
            live.pop_back();
        }
    }
    void *last = live.back();
    for (void *p : live)
        EXPECT_EQ(sp_free(p), SP_SUCCESS);
    r.twice = sp_free(last);
    add_all_stats(&r);
    EXPECT_EQ(sp_stream_destroy(s2), SP_SUCCESS);
    return r;
}

} // namespace

// Blocks above 1 MiB never enter a thread cache, so with the cache on their mallocs and frees
// (which take the call-free hits then) end exactly as with it off: the same blocks, every
// statistic, and a double free refused.
TEST_F(ThreadsCache, LargeBlocksEndAsWithTheCacheOff) {
    expect_warnings(); // the double frees
    for (uint64_t seed = 1; seed <= 3; seed++) {
        LargeRun on, off;
        {
            sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "64MiB"}});
            on = large_run(seed);
            ASSERT_SP_OK(sp_shutdown());
        }
        {
            sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", nullptr}});
            off = large_run(seed);
            ASSERT_SP_OK(sp_shutdown());
        }
        EXPECT_EQ(on.twice, SP_ERR_INVALID_USAGE);
        EXPECT_EQ(off.twice, SP_ERR_INVALID_USAGE);
        ASSERT_EQ(on.blocks.size(), off.blocks.size());
        for (size_t i = 0; i < on.blocks.size(); i++)
            ASSERT_EQ(on.blocks[i], off.blocks[i]) << "seed " << seed << ", malloc " << i;
        for (size_t i = 0; i < on.stats.size(); i++)
            ASSERT_EQ(on.stats[i], off.stats[i])
                << "seed " << seed << ", " << sp_stats_key(i % sp_stats_count()) << " (check "
                << i / sp_stats_count() << ")";
    }
}

// Freeing a block that sits idle in a cache is a double free, refused like the pool's.
TEST_F(ThreadsCache, DoubleFreeIsRefused) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "64KiB"}});
    expect_warnings();
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(sp_free(p), SP_ERR_INVALID_USAGE);
    std::thread([&] { EXPECT_EQ(sp_free(p), SP_ERR_INVALID_USAGE); }).join();
    sp_stream_t s;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    EXPECT_EQ(sp_record_stream(p, s), SP_ERR_INVALID_USAGE); // a freed block takes no stream
    // Nor its own stream: that use needs no event, but the block is still not a live one (as
    // with the cache off, where this is the pool's "not allocated").
    EXPECT_EQ(sp_record_stream(p, nullptr), SP_ERR_INVALID_USAGE);
    EXPECT_EQ(sp_record_stream(static_cast<char *>(p) + 256, nullptr), SP_ERR_INVALID_USAGE);
    EXPECT_EQ(idle_blocks(), 1u);
    ASSERT_SP_OK(sp_stream_destroy(s)); // drains the device's caches too
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("allocation.all.current"), 0);
}

// The lookup the collectives and the symmetric queries check buffers with: a block idle in a
// cache was freed by its caller, so it is no live block (a collective accepted one and wrote
// into it, and the next sp_malloc handed out the written memory).
TEST_F(ThreadsCache, AFreedBlockIdleInACacheIsNoLiveBlock) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "64KiB"}});
    void *p = nullptr;
    sp_block_info_t info;
    ASSERT_SP_OK(sp_malloc(1024, 0, nullptr, &p));
    ASSERT_SP_OK(sp__pool_lookup(p, &info));
    EXPECT_EQ(info.block_base, p);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_EQ(idle_blocks(), 1u);
    EXPECT_EQ(sp__pool_lookup(p, &info), SP_ERR_INVALID_USAGE);
    EXPECT_EQ(sp__pool_lookup(static_cast<char *>(p) + 100, &info), SP_ERR_INVALID_USAGE);
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(1024, 0, nullptr, &q)); // the same block, live again
    ASSERT_EQ(q, p);
    EXPECT_EQ(sp__pool_lookup(q, &info), SP_SUCCESS);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache());
}

// A block with a stream recorded on it leaves the cache: its free waits for the stream as the
// pool's does, and it is not kept.
TEST_F(ThreadsCache, RecordedStreamTakesTheBlockOut) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "64KiB"}});
    sp_stream_t s;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    void *p = nullptr, *q = nullptr;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &q));
    ASSERT_EQ(q, p);
    ASSERT_SP_OK(sp_record_stream(q, s));
    ASSERT_SP_OK(sp_free(q));
    EXPECT_EQ(idle_blocks(), 0u);
    ASSERT_SP_OK(sp_stream_synchronize(s));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("active.all.current"), 0);
    ASSERT_SP_OK(sp_stream_destroy(s));
}

// PyTorch's free names the size its alloc asked for: a block handed out from a cache answers
// with that size, whether its own thread or another frees it (no mismatch WARN, which the
// fixture would fail on).
TEST_F(ThreadsCache, TorchFreeSeesTheLastCallersSize) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "64KiB"}});
    sp__torch_allow_host(true);
    void *p = sp_torch_malloc(100, 0, nullptr);
    ASSERT_NE(p, nullptr);
    sp_torch_free(p, 100, 0, nullptr);
    EXPECT_EQ(idle_blocks(), 1u);
    void *q = sp_torch_malloc(300, 0, nullptr); // a hit
    EXPECT_EQ(q, p);
    sp_torch_free(q, 300, 0, nullptr); // its own thread: the cache's entry answers
    EXPECT_EQ(idle_blocks(), 1u);
    q = sp_torch_malloc(450, 0, nullptr);
    EXPECT_EQ(q, p);
    std::thread([&] { sp_torch_free(q, 450, 0, nullptr); }).join(); // the pool's path answers
    EXPECT_EQ(idle_blocks(), 0u); // the freeing thread kept it, and gave it back at its exit
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("requested_bytes.all.current"), 0);
    sp__torch_allow_host(false);
}

// A snapshot (a walk) shows the pool without the caches: idle blocks go back first.
TEST_F(ThreadsCache, SnapshotDrainsFirst) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "64KiB"}});
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("allocation.all.current"), 1);
    char path[] = "/tmp/sp_tc_snapXXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    sp_mempool_t *pool;
    ASSERT_SP_OK(sp_mempool_create(nullptr, &pool));
    ASSERT_SP_OK(sp_mempool_dump_snapshot(pool, path)); // another pool's: the caches stay
    EXPECT_EQ(idle_blocks(), 1u);
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_dump_snapshot(path));
    unlink(path);
    EXPECT_EQ(idle_blocks(), 0u);
    EXPECT_EQ(stat("allocation.all.current"), 0);
}

// Four threads allocate, free each other's blocks and empty the cache at random; at the end
// every figure balances (ThreadSanitizer checks the locking).
TEST_F(ThreadsCache, StressBalances) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "32KiB"}});
    constexpr int kThreads = 4;
    std::vector<void *> handoff[kThreads];
    std::mutex hmu[kThreads];
    std::atomic<int> failures{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; t++) {
        ts.emplace_back([&, t] {
            unsigned x = 777u + 31u * (unsigned)t;
            std::vector<void *> live;
            for (int i = 0; i < 3000; i++) {
                x = x * 1103515245u + 12345u;
                size_t size = (x >> 20) % 8 == 0 ? 2 * MiB : 1 + (x >> 9) % 8192;
                void *p = nullptr;
                if (sp_malloc(size, 0, nullptr, &p) != SP_SUCCESS) {
                    failures++;
                    continue;
                }
                live.push_back(p);
                if ((x & 3) == 0) { // hand one to the next thread
                    std::lock_guard<std::mutex> g(hmu[(t + 1) % kThreads]);
                    handoff[(t + 1) % kThreads].push_back(live.back());
                    live.pop_back();
                }
                if (live.size() > 12) {
                    if (sp_free(live.front()) != SP_SUCCESS)
                        failures++;
                    live.erase(live.begin());
                }
                {
                    std::lock_guard<std::mutex> g(hmu[t]);
                    for (void *q : handoff[t])
                        if (sp_free(q) != SP_SUCCESS)
                            failures++;
                    handoff[t].clear();
                }
                if ((x & 511) == 5 && sp_empty_cache() != SP_SUCCESS)
                    failures++;
            }
            for (void *q : live)
                if (sp_free(q) != SP_SUCCESS)
                    failures++;
        });
    }
    for (auto &th : ts)
        th.join();
    for (auto &h : handoff)
        for (void *q : h)
            EXPECT_EQ(sp_free(q), SP_SUCCESS);
    EXPECT_EQ(failures.load(), 0);
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(idle_bytes(), 0u);
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("active_bytes.all.current"), 0);
    EXPECT_EQ(stat("requested_bytes.all.current"), 0);
    EXPECT_EQ(stat("inactive_split.all.current"), 0);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

// fork() while threads hit their caches: the child inherits every cache lock free, allocates,
// frees and empties the cache without hanging.
TEST_F(ThreadsCache, ForkWhileThreadsHitTheirCaches) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "64KiB"}, {"SYMPOOL_HOST_CAPACITY", "1GiB"}});
    SP_SKIP_UNLESS_HOST();
    std::atomic<bool> stop{false};
    std::vector<std::thread> workers;
    for (int t = 0; t < 2; t++) {
        workers.emplace_back([&, t] {
            unsigned x = 99u + (unsigned)t;
            while (!stop.load(std::memory_order_relaxed)) {
                x = x * 1103515245u + 12345u;
                void *p = nullptr;
                if (sp_malloc(1 + (x >> 8) % 16384, 0, nullptr, &p) == SP_SUCCESS)
                    (void)sp_free(p);
                if ((x & 4095) == 7)
                    (void)sp_empty_cache();
            }
        });
    }
    int bad = 0;
    for (int i = 0; i < 20; i++) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            void *p = nullptr;
            int rc = sp_malloc(512, 0, nullptr, &p) != SP_SUCCESS    ? 10
                     : sp_free(p) != SP_SUCCESS                      ? 11
                     : sp_empty_cache() != SP_SUCCESS                ? 12
                     : sp_malloc(4096, 0, nullptr, &p) != SP_SUCCESS ? 13
                     : sp_free(p) != SP_SUCCESS                      ? 14
                                                                     : 0;
            _exit(rc);
        }
        int status = 0;
        auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (waitpid(pid, &status, WNOHANG) != pid) {
            if (std::chrono::steady_clock::now() > end) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                status = -1;
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (status != 0)
            bad++;
    }
    stop = true;
    for (auto &w : workers)
        w.join();
    EXPECT_EQ(bad, 0);
    ASSERT_SP_OK(sp_empty_cache());
}
