// test_threads_adversary.cc: races the other threaded suites leave out: a MemPool destroyed
// while other threads allocate in it (directly and routed), statistics, peaks and snapshots
// read while several devices allocate, the thread cache's owner exiting while another thread
// frees its blocks, and sp_shutdown with threads that hold cached blocks. Suites are named
// Threads* (ThreadSanitizer runs them); every wait is bounded by a watchdog.
#include "alloc_test_util.hpp"

extern "C" {
#include "pool/history.h"
#include "sympool/experimental.h"
}

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sympool/mempool.h>

using sp::KiB;
using sp::MiB;

class ThreadsAdversary : public sp::Test {};

// One thread destroys pools while two others allocate in them (sp_mempool_malloc and a routed
// sp_malloc). Each malloc either gets a block or is refused because the pool was destroyed;
// a destroy is refused only while a thread routes into the pool. Every block frees, and the
// destroyed pools' segments go back at sp_empty_cache.
TEST_F(ThreadsAdversary, MempoolDestroyedWhileOthersAllocateInIt) {
    expect_warnings();
    sp::Watchdog wd;
    ASSERT_SP_OK(sp_init());
    std::atomic<sp_mempool_t *> cur{nullptr};
    std::atomic<bool> stop{false};
    std::atomic<int> bad{0};
    std::mutex err_mu;
    std::string first_err;
    auto fail = [&](const char *what, sp_status_t s) {
        if (bad.fetch_add(1) == 0) {
            std::lock_guard<std::mutex> g(err_mu);
            first_err = std::string(what) + ": " + sp::describe(s) + ": " + sp_last_error();
        }
    };
    std::vector<std::thread> ts;
    for (int t = 0; t < 2; t++) {
        ts.emplace_back([&, t] {
            sp::Lcg r{(unsigned)t + 11u};
            std::vector<void *> live;
            while (!stop.load()) {
                sp_mempool_t *p = cur.load();
                if (!p)
                    continue;
                size_t size = (r.next() % (3 * MiB)) + 1;
                void *ptr = nullptr;
                sp_status_t s;
                if (t == 0) {
                    s = sp_mempool_malloc(p, size, nullptr, &ptr);
                } else {
                    s = sp_mempool_begin(p);
                    if (s == SP_SUCCESS) {
                        s = sp_malloc(size, 0, nullptr, &ptr);
                        sp_status_t e = sp_mempool_end(p);
                        if (e != SP_SUCCESS)
                            fail("end", e);
                    }
                }
                if (s == SP_SUCCESS)
                    live.push_back(ptr);
                else if (s != SP_ERR_INVALID_USAGE && s != SP_ERR_OUT_OF_MEMORY)
                    fail("malloc", s);
                if (live.size() > 8) {
                    for (void *q : live)
                        if (sp_free(q) != SP_SUCCESS)
                            fail("free", SP_ERR_INVALID_USAGE);
                    live.clear();
                }
            }
            for (void *q : live)
                if (sp_free(q) != SP_SUCCESS)
                    fail("free", SP_ERR_INVALID_USAGE);
        });
    }
    for (int i = 0; i < 200; i++) {
        sp_mempool_t *p = nullptr;
        ASSERT_SP_OK(sp_mempool_create(nullptr, &p));
        cur.store(p);
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        sp_status_t s;
        // Refused only while the router is between its begin and its end.
        while ((s = sp_mempool_destroy(p)) == SP_ERR_INVALID_USAGE &&
               std::string(sp_last_error()).find("still routed") != std::string::npos)
            std::this_thread::yield();
        ASSERT_SP_OK(s);
        EXPECT_EQ(sp_mempool_begin(p), SP_ERR_INVALID_USAGE);
    }
    stop = true;
    for (auto &th : ts)
        th.join();
    EXPECT_EQ(bad.load(), 0) << first_err;
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp::stat("allocation.all.current"), 0);
    EXPECT_EQ(sp::stat("segment.all.current"), 0);
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), 0);
}

// Three devices allocate while an observer reads statistics, resets peaks and accumulated
// counters, empties the caches and dumps snapshots. Every copy of statistics is one device's
// at one instant: no current above its peak, no negative current.
TEST_F(ThreadsAdversary, StatsPeaksAndDumpsWhileSeveralDevicesAllocate) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "3"}});
    SP_SKIP_UNLESS_HOST();
    sp::Watchdog wd;
    ASSERT_SP_OK(sp_init());
    char dir[] = "/tmp/sp_adv_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::atomic<bool> stop{false};
    std::atomic<int> bad{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 3; t++) {
        ts.emplace_back([&, t] {
            sp::Lcg r{(unsigned)t * 31u + 7u};
            std::vector<std::pair<void *, int>> live;
            while (!stop.load()) {
                unsigned x = r.next();
                int dev = (int)(x % 3);
                size_t size = (x & 64) ? (x % (4 * MiB)) + 1 : (x % (64 * KiB)) + 1;
                void *p = nullptr;
                sp_status_t s = sp_malloc(size, dev, nullptr, &p);
                if (s == SP_SUCCESS)
                    live.emplace_back(p, dev);
                else
                    bad++;
                if (live.size() > 16) {
                    for (auto &q : live)
                        if (sp_free(q.first) != SP_SUCCESS)
                            bad++;
                    live.clear();
                }
            }
            for (auto &q : live)
                if (sp_free(q.first) != SP_SUCCESS)
                    bad++;
        });
    }
    const char *pairs[][2] = {{"allocated_bytes.all.current", "allocated_bytes.all.peak"},
                              {"reserved_bytes.all.current", "reserved_bytes.all.peak"},
                              {"allocation.all.current", "allocation.all.peak"},
                              {"segment.all.current", "segment.all.peak"},
                              {"active_bytes.all.current", "active_bytes.all.peak"}};
    int inconsistent = 0;
    std::string why;
    for (int step = 0; step < 300; step++) {
        int dev = step % 3;
        sp_stats_t st;
        ASSERT_SP_OK(sp_memory_stats(dev, &st));
        for (auto &kp : pairs) {
            int64_t cur = 0, peak = 0;
            ASSERT_SP_OK(sp_stats_get(&st, kp[0], &cur));
            ASSERT_SP_OK(sp_stats_get(&st, kp[1], &peak));
            if (cur < 0 || cur > peak) {
                if (inconsistent++ == 0)
                    why = std::string(kp[0]) + "=" + std::to_string(cur) + " " + kp[1] + "=" +
                          std::to_string(peak);
            }
        }
        if (step % 5 == 0)
            ASSERT_SP_OK(sp_reset_peak_memory_stats(dev));
        if (step % 7 == 0)
            ASSERT_SP_OK(sp_reset_accumulated_memory_stats(dev));
        if (step % 3 == 0)
            ASSERT_SP_OK(sp_empty_cache());
        if (step % 20 == 0) {
            std::string path = std::string(dir) + "/s" + ((step & 32) ? ".json" : ".pickle");
            ASSERT_SP_OK(sp_dump_snapshot(path.c_str()));
            unlink(path.c_str());
        }
    }
    stop = true;
    for (auto &th : ts)
        th.join();
    EXPECT_EQ(bad.load(), 0);
    EXPECT_EQ(inconsistent, 0) << why;
    EXPECT_EQ(rmdir(dir), 0);
    for (int dev = 0; dev < 3; dev++)
        EXPECT_EQ(sp::stat("allocation.all.current", dev), 0);
}

// After the threads of a cache test are gone: emptied, no thread cache holds an idle block and
// nothing is allocated or requested.
static void expect_nothing_cached_or_live() {
    ASSERT_SP_OK(sp_empty_cache());
    size_t b = 1, n = 1;
    ASSERT_SP_OK(sp_x_thread_cache_idle(0, &b, &n));
    EXPECT_EQ(b, 0u);
    EXPECT_EQ(sp::stat("allocation.all.current"), 0);
    EXPECT_EQ(sp::stat("requested_bytes.all.current"), 0);
}

// A cache emptied by another thread's frees, whose owner exits right after: the last free's
// unlock of the owner's cache lock reads the lock after the store that releases it, so the
// exit must not free the cache until that free is out (it was freed at once: a use after free
// ThreadSanitizer reports here every time, since the threads learn of each other's progress
// through relaxed atomics, which order nothing, and the owner then took only the cache's lock).
TEST_F(ThreadsAdversary, ACacheEmptiedByAnotherThreadOutlivesItsLastUnlock) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "1MiB"}});
    sp::Watchdog wd;
    ASSERT_SP_OK(sp_init());
    for (int round = 0; round < 8; round++) {
        std::vector<void *> handed(64);
        std::atomic<bool> ready{false};
        std::atomic<int> freed{0};
        std::atomic<bool> owner_gone{false};
        std::thread owner([&] {
            // Every block cached, then handed out from the cache: none is idle.
            for (auto &p : handed)
                ASSERT_SP_OK(sp_malloc(4 * KiB, 0, nullptr, &p));
            for (auto p : handed)
                ASSERT_SP_OK(sp_free(p));
            for (auto &p : handed)
                ASSERT_SP_OK(sp_malloc(4 * KiB, 0, nullptr, &p));
            ready.store(true);
            while (freed.load(std::memory_order_relaxed) < (int)handed.size())
                std::this_thread::yield();
        });
        std::thread freer([&] {
            while (!ready.load())
                std::this_thread::yield();
            for (void *p : handed) {
                EXPECT_EQ(sp_free(p), SP_SUCCESS);
                freed.fetch_add(1, std::memory_order_relaxed);
            }
            // Not to exit before the owner: this thread's own exit takes locks the owner's
            // then takes, which would order the last free before the owner's exit.
            while (!owner_gone.load(std::memory_order_relaxed))
                std::this_thread::yield();
        });
        owner.join();
        owner_gone.store(true, std::memory_order_relaxed);
        freer.join();
    }
    expect_nothing_cached_or_live();
}

// With the thread cache on, owners exit while another thread frees the blocks they handed out
// and while a third empties the caches: every block ends up back in the pool, nothing idle.
TEST_F(ThreadsAdversary, CacheOwnersExitWhileOthersFreeTheirBlocks) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "1MiB"}});
    sp::Watchdog wd;
    ASSERT_SP_OK(sp_init());
    std::atomic<bool> stop{false};
    std::thread drainer([&] {
        while (!stop.load()) {
            EXPECT_EQ(sp_empty_cache(), SP_SUCCESS);
            size_t b = 0, n = 0;
            EXPECT_EQ(sp_x_thread_cache_idle(0, &b, &n), SP_SUCCESS);
            std::this_thread::yield();
        }
    });
    for (int round = 0; round < 40; round++) {
        std::vector<void *> handed(32);
        std::atomic<int> ready{0};
        std::thread owner([&] {
            // Fill the cache (free then take back), keep half idle, hand the rest over.
            std::vector<void *> mine(64);
            for (auto &p : mine)
                ASSERT_SP_OK(sp_malloc(4 * KiB, 0, nullptr, &p));
            for (auto p : mine)
                ASSERT_SP_OK(sp_free(p));
            for (auto &p : mine)
                ASSERT_SP_OK(sp_malloc(4 * KiB, 0, nullptr, &p));
            for (int i = 0; i < 32; i++)
                handed[i] = mine[i];
            for (int i = 32; i < 64; i++)
                ASSERT_SP_OK(sp_free(mine[i]));
            ready = 1;
        });
        std::thread freer([&] {
            while (!ready.load())
                std::this_thread::yield();
            for (void *p : handed)
                EXPECT_EQ(sp_free(p), SP_SUCCESS);
        });
        owner.join();
        freer.join();
    }
    stop = true;
    drainer.join();
    expect_nothing_cached_or_live();
}

// sp_shutdown while live threads keep idle blocks in their caches: the shutdown takes them back,
// the threads allocate again in the next session and exit without touching the old one.
TEST_F(ThreadsAdversary, ShutdownWhileThreadsHoldCachedBlocks) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "1MiB"}});
    sp::Watchdog wd;
    ASSERT_SP_OK(sp_init());
    std::mutex mu;
    std::condition_variable cv;
    int phase = 0, arrived = 0;
    auto wait_phase = [&](int want) {
        std::unique_lock<std::mutex> g(mu);
        arrived++;
        cv.notify_all();
        cv.wait(g, [&] { return phase >= want; });
    };
    std::vector<std::thread> ts;
    for (int t = 0; t < 3; t++) {
        ts.emplace_back([&] {
            for (int session = 1; session <= 2; session++) {
                std::vector<void *> v(8);
                for (auto &p : v)
                    ASSERT_SP_OK(sp_malloc(8 * KiB, 0, nullptr, &p));
                for (auto p : v)
                    ASSERT_SP_OK(sp_free(p)); // idle in this thread's cache
                wait_phase(session);
            }
        });
    }
    for (int session = 1; session <= 2; session++) {
        {
            std::unique_lock<std::mutex> g(mu);
            cv.wait(g, [&] { return arrived == 3 * session; });
        }
        EXPECT_GT(sp::stat("allocation.all.current"), 0); // the idle blocks
        ASSERT_SP_OK(sp_shutdown());
        ASSERT_SP_OK(sp_init());
        EXPECT_EQ(sp::stat("allocation.all.current"), 0);
        {
            std::lock_guard<std::mutex> g(mu);
            phase = session;
        }
        cv.notify_all();
    }
    for (auto &th : ts)
        th.join();
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp::stat("allocation.all.current"), 0);
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), 0);
}

// Four blocks idle in this thread's cache, then `call`, which must be refused with `want`: the
// blocks stay idle there and every statistic stays as it was.
static void expect_refusal_keeps_thread_cache(const std::function<sp_status_t()> &call,
                                              sp_status_t want) {
    std::vector<void *> v(4);
    for (auto &p : v)
        ASSERT_SP_OK(sp_malloc(16 * KiB, 0, nullptr, &p));
    for (auto p : v)
        ASSERT_SP_OK(sp_free(p)); // idle in this thread's cache
    size_t idle_before = 0, n_before = 0;
    ASSERT_SP_OK(sp_x_thread_cache_idle(0, &idle_before, &n_before));
    ASSERT_EQ(n_before, 4u);
    sp_stats_t before, after;
    ASSERT_SP_OK(sp_memory_stats(0, &before));
    EXPECT_SP_STATUS(call(), want);
    ASSERT_SP_OK(sp_memory_stats(0, &after));
    for (size_t i = 0; i < sp_stats_count(); i++)
        EXPECT_EQ(before.value[i], after.value[i]) << sp_stats_key(i);
    size_t idle_after = 0, n_after = 0;
    ASSERT_SP_OK(sp_x_thread_cache_idle(0, &idle_after, &n_after));
    EXPECT_EQ(n_after, n_before);
    EXPECT_EQ(idle_after, idle_before);
}

// sp_shutdown refused because a block is still allocated releases nothing: the blocks idle in
// the threads' caches stay where they were, and every statistic with them.
TEST_F(ThreadsAdversary, RefusedShutdownLeavesTheThreadCachesAlone) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "1MiB"}});
    expect_warnings(); // the refusal's
    sp::Watchdog wd;
    ASSERT_SP_OK(sp_init());
    void *held = nullptr;
    ASSERT_SP_OK(sp_malloc(1 * KiB, 0, nullptr, &held));
    expect_refusal_keeps_thread_cache([] { return sp_shutdown(); }, SP_ERR_BUSY);
    ASSERT_SP_OK(sp_free(held));
    ASSERT_SP_OK(sp_empty_cache());
}

// A snapshot dump to a path it cannot write is refused before it changes anything: the blocks
// idle in the thread caches stay there (the walk used to give them back to the pool first) and no
// statistic moves; with history on (which the thread caches step aside for), the history gets
// no snapshot marker.
TEST_F(ThreadsAdversary, RefusedSnapshotDumpLeavesTheThreadCachesAndHistoryAlone) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "1MiB"}});
    sp::Watchdog wd;
    expect_warnings(); // the refusals'
    const char *bad = "/nonexistent-sympool-dir/snap.pickle";
    ASSERT_SP_OK(sp_init());
    expect_refusal_keeps_thread_cache([bad] { return sp_dump_snapshot(bad); }, SP_ERR_SYSTEM);

    sp_history_params_t hp;
    sp_history_params_init(&hp);
    ASSERT_SP_OK(sp_record_memory_history(&hp));
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(8 * KiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    sp__trace_entry_t *e = nullptr;
    size_t entries_before = 0, entries_after = 0;
    ASSERT_SP_OK(sp__history_copy(0, &e, &entries_before));
    sp__history_entries_free(e, entries_before);
    ASSERT_GT(entries_before, 0u);
    EXPECT_SP_STATUS(sp_dump_snapshot(bad), SP_ERR_SYSTEM);
    ASSERT_SP_OK(sp__history_copy(0, &e, &entries_after));
    sp__history_entries_free(e, entries_after);
    EXPECT_EQ(entries_after, entries_before) << "a refused dump left a snapshot marker";
    hp.enabled = SP_HISTORY_OFF;
    ASSERT_SP_OK(sp_record_memory_history(&hp));
    ASSERT_SP_OK(sp_empty_cache());
}

namespace {

// The child's exit status: 0 when it could allocate everywhere, else the step that failed.
int fork_child_work(sp_mempool_t *pool, const std::string &snap) {
    void *p = nullptr, *q = nullptr, *r = nullptr;
    if (sp_malloc(4 * KiB, 0, nullptr, &p) != SP_SUCCESS)
        return 2;
    if (sp_mempool_malloc(pool, 64 * KiB, nullptr, &q) != SP_SUCCESS)
        return 3;
    if (sp_mempool_begin(pool) != SP_SUCCESS)
        return 4;
    sp_status_t s = sp_malloc(3 * MiB, 0, nullptr, &r);
    if (sp_mempool_end(pool) != SP_SUCCESS || s != SP_SUCCESS)
        return 5;
    if (sp_free(p) != SP_SUCCESS || sp_free(q) != SP_SUCCESS || sp_free(r) != SP_SUCCESS)
        return 6;
    if (sp_empty_cache() != SP_SUCCESS)
        return 7;
    sp_history_params_t hp;
    sp_history_params_init(&hp);
    hp.max_entries = 64;
    if (sp_record_memory_history(&hp) != SP_SUCCESS)
        return 8;
    if (sp_malloc(8 * KiB, 0, nullptr, &p) != SP_SUCCESS || sp_free(p) != SP_SUCCESS)
        return 9;
    if (sp_dump_snapshot(snap.c_str()) != SP_SUCCESS)
        return 10;
    sp_stats_t st;
    if (sp_memory_stats(0, &st) != SP_SUCCESS)
        return 11;
    return 0;
}

int wait_child(pid_t pid) {
    for (int i = 0; i < 5000; i++) {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    return -1;
}

} // namespace

// A worker thread (not the lock's bias owner) forks while the main thread allocates through its
// thread cache, another thread routes into a MemPool and a third switches memory history: each
// child allocates in the default pool and the MemPool, routes, records history and dumps.
TEST_F(ThreadsAdversary, ForkFromAWorkerWhileOthersAreInside) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "256KiB"}, {"SYMPOOL_HOST_CAPACITY", "1GiB"}});
    SP_SKIP_UNLESS_HOST();
    sp::Watchdog wd;
    ASSERT_SP_OK(sp_init());
    void *first = nullptr; // the main thread takes the device lock first: the bias owner
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &first));
    ASSERT_SP_OK(sp_free(first));
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(nullptr, &pool));
    char dir[] = "/tmp/sp_advfork_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::atomic<bool> stop{false};
    std::thread router([&] {
        sp::Lcg r{99};
        while (!stop.load()) {
            if (sp_mempool_begin(pool) != SP_SUCCESS)
                continue;
            void *p = nullptr;
            if (sp_malloc((r.next() % (2 * MiB)) + 1, 0, nullptr, &p) == SP_SUCCESS)
                (void)sp_free(p);
            (void)sp_mempool_end(pool);
        }
    });
    std::thread historian([&] {
        sp::Lcg r{5};
        while (!stop.load()) {
            sp_history_params_t hp;
            sp_history_params_init(&hp);
            unsigned x = r.next();
            hp.enabled = (sp_history_enabled_t)(x % 3);
            hp.max_entries = (x & 8) ? 16 : 256;
            (void)sp_record_memory_history(&hp);
            std::this_thread::sleep_for(std::chrono::microseconds(300));
        }
    });
    std::string codes; // the forker's until it is joined
    int bad = 0;
    std::atomic<bool> forks_done{false};
    std::thread forker([&] {
        for (int i = 0; i < 20; i++) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            std::string snap = std::string(dir) + "/c" + std::to_string(i) + ".pickle";
            pid_t pid = fork();
            if (pid == 0)
                _exit(fork_child_work(pool, snap));
            int rc = pid < 0 ? 99 : wait_child(pid);
            codes += std::to_string(rc) + " ";
            bad += rc != 0;
            unlink(snap.c_str());
        }
        forks_done = true;
    });
    sp::Lcg r{1};
    std::vector<void *> live;
    while (!stop.load()) {
        void *p = nullptr;
        if (sp_malloc((r.next() % (64 * KiB)) + 1, 0, nullptr, &p) == SP_SUCCESS)
            live.push_back(p);
        if (live.size() > 8) {
            for (void *q : live)
                (void)sp_free(q);
            live.clear();
        }
        if (forks_done.load())
            stop = true;
    }
    forker.join();
    stop = true;
    router.join();
    historian.join();
    for (void *q : live)
        ASSERT_SP_OK(sp_free(q));
    rmdir(dir);
    EXPECT_EQ(bad, 0) << "child exit codes (-1: hung): " << codes;
    sp_history_params_t off;
    sp_history_params_init(&off);
    off.enabled = SP_HISTORY_OFF;
    ASSERT_SP_OK(sp_record_memory_history(&off));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_empty_cache());
}

// Pools are created and destroyed while other threads dump and query the current one, free
// its blocks late (after its destroy), set its limit, and switch history and its options: every
// call either runs or is refused because the pool was destroyed.
TEST_F(ThreadsAdversary, PoolDumpsQueriesAndLateFreesAcrossItsDestroy) {
    expect_warnings();
    sp::Watchdog wd;
    ASSERT_SP_OK(sp_init());
    char dir[] = "/tmp/sp_advdump_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::atomic<sp_mempool_t *> cur{nullptr};
    std::atomic<bool> stop{false};
    std::atomic<int> bad{0};
    std::mutex err_mu;
    std::string first_err;
    auto check = [&](sp_status_t s, const char *what) {
        if (s == SP_SUCCESS || s == SP_ERR_OUT_OF_MEMORY)
            return;
        if (s == SP_ERR_INVALID_USAGE &&
            std::string(sp_last_error()).find("destroyed") != std::string::npos)
            return;
        if (bad.fetch_add(1) == 0) {
            std::lock_guard<std::mutex> g(err_mu);
            first_err = std::string(what) + ": " + sp::describe(s) + ": " + sp_last_error();
        }
    };
    std::vector<std::thread> ts;
    ts.emplace_back([&] { // allocator with late frees
        sp::Lcg r{3};
        std::vector<void *> live;
        while (!stop.load()) {
            sp_mempool_t *p = cur.load();
            if (!p)
                continue;
            void *q = nullptr;
            sp_status_t s = sp_mempool_malloc(p, (r.next() % (3 * MiB)) + 1, nullptr, &q);
            check(s, "mempool_malloc");
            if (s == SP_SUCCESS)
                live.push_back(q);
            if (live.size() > 12) {
                for (void *x : live)
                    check(sp_free(x), "free");
                live.clear();
            }
        }
        for (void *x : live)
            check(sp_free(x), "free");
    });
    ts.emplace_back([&] { // dumps and queries
        int i = 0;
        while (!stop.load()) {
            sp_mempool_t *p = cur.load();
            if (!p)
                continue;
            std::string path = std::string(dir) + "/p" + ((i++ & 1) ? ".json" : ".pickle");
            check(sp_mempool_dump_snapshot(p, path.c_str()), "mempool_dump_snapshot");
            (void)sp_mempool_used_bytes(p);
            (void)sp_mempool_free_bytes(p);
            check(sp_mempool_free_all_blocks(p, nullptr), "free_all_blocks");
            check(sp_mempool_set_limit(p, (i & 2) ? 0 : 64 * MiB), "set_limit");
            if (i % 4 == 0)
                check(sp_dump_snapshot(path.c_str()), "dump_snapshot");
        }
    });
    ts.emplace_back([&] { // history and its options
        sp::Lcg r{17};
        while (!stop.load()) {
            sp_history_params_t hp;
            sp_history_params_init(&hp);
            unsigned x = r.next();
            hp.enabled = (sp_history_enabled_t)(x % 3);
            hp.context = (sp_history_context_t)((x >> 2) % 4);
            hp.max_entries = (x & 32) ? 8 : 1000;
            check(sp_record_memory_history(&hp), "history");
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
    });
    for (int i = 0; i < 150; i++) {
        sp_mempool_t *p = nullptr;
        ASSERT_SP_OK(sp_mempool_create(nullptr, &p));
        cur.store(p);
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        ASSERT_SP_OK(sp_mempool_destroy(p));
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    stop = true;
    for (auto &th : ts)
        th.join();
    EXPECT_EQ(bad.load(), 0) << first_err;
    sp_history_params_t off;
    sp_history_params_init(&off);
    off.enabled = SP_HISTORY_OFF;
    ASSERT_SP_OK(sp_record_memory_history(&off));
    for (const char *n : {"/p.json", "/p.pickle"})
        unlink((std::string(dir) + n).c_str());
    EXPECT_EQ(rmdir(dir), 0) << "a dump left a temporary file behind";
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp::stat("allocation.all.current"), 0);
    EXPECT_EQ(sp::stat("reserved_bytes.all.current"), 0);
}

// Every round starts uninitialized (after sp_shutdown) and six threads make their first calls at
// once, each a different entry point: one initialization, seen whole by all of them.
TEST_F(ThreadsAdversary, FirstCallsRaceTheInitialization) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "256KiB"}, {"SYMPOOL_HOST_DEVICES", "2"}});
    SP_SKIP_UNLESS_HOST();
    sp::Watchdog wd;
    std::atomic<int> bad{0};
    std::mutex err_mu;
    std::string first_err;
    auto check = [&](sp_status_t s, const char *what) {
        if (s == SP_SUCCESS)
            return;
        if (bad.fetch_add(1) == 0) {
            std::lock_guard<std::mutex> g(err_mu);
            first_err = std::string(what) + ": " + sp::describe(s) + ": " + sp_last_error();
        }
    };
    for (int round = 0; round < 30; round++) {
        ASSERT_SP_OK(sp_shutdown());
        std::atomic<int> go{0};
        std::vector<std::thread> ts;
        for (int t = 0; t < 6; t++) {
            ts.emplace_back([&, t] {
                go.fetch_add(1);
                while (go.load() < 6)
                    std::this_thread::yield();
                switch (t) {
                case 0:
                case 1: {
                    for (int i = 0; i < 20; i++) {
                        void *p = nullptr;
                        check(sp_malloc(4 * KiB, t, nullptr, &p), "malloc");
                        check(sp_free(p), "free");
                    }
                    break;
                }
                case 2: {
                    sp_mempool_t *p = nullptr;
                    check(sp_mempool_create(nullptr, &p), "mempool_create");
                    void *q = nullptr;
                    check(sp_mempool_malloc(p, 64 * KiB, nullptr, &q), "mempool_malloc");
                    check(sp_free(q), "free");
                    check(sp_mempool_destroy(p), "mempool_destroy");
                    break;
                }
                case 3: {
                    sp_history_params_t hp;
                    sp_history_params_init(&hp);
                    hp.enabled = (round & 1) ? SP_HISTORY_ALL : SP_HISTORY_OFF;
                    check(sp_record_memory_history(&hp), "history");
                    break;
                }
                case 4: {
                    sp_stats_t st;
                    check(sp_memory_stats(1, &st), "stats");
                    size_t b = 0, n = 0;
                    check(sp_x_thread_cache_idle(0, &b, &n), "idle");
                    break;
                }
                default:
                    check(sp_empty_cache(), "empty_cache");
                    break;
                }
            });
        }
        for (auto &th : ts)
            th.join();
        sp_history_params_t off;
        sp_history_params_init(&off);
        off.enabled = SP_HISTORY_OFF;
        ASSERT_SP_OK(sp_record_memory_history(&off));
    }
    EXPECT_EQ(bad.load(), 0) << first_err;
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp::stat("allocation.all.current"), 0);
}
