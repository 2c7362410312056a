// test_threads_stress.cc: eight threads doing everything at once for a bounded time:
// malloc/free on two streams, record_stream, MemPool begin/end, snapshots, empty_cache,
// stats, and memory history switched on and off. It asserts only that every call succeeds (or
// fails the way it may, OOM) and that nothing is left allocated; its real check is
// ThreadSanitizer, whose stage runs every `unit` test (scripts/test.sh), and AddressSanitizer.
#include "sp_test.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

using sp::KiB;
using sp::MiB;

namespace {

size_t frames_hook(sp_history_frame_t *f, size_t max, void *) {
    if (max < 1)
        return 0;
    f[0] = {"stress_step", "stress.py", 3};
    return 1;
}

} // namespace

class ThreadsStress : public sp::Test {};

TEST_F(ThreadsStress, EightThreadsEverythingAtOnce) {
    expect_warnings(); // OOMs may happen (the live pool's cache is not released by a retry)
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "2GiB"}});
    ASSERT_SP_OK(sp_init());
    sp_history_set_frames_hook(frames_hook, nullptr);
    sp_stream_t streams[2];
    for (auto &s : streams)
        ASSERT_SP_OK(sp_stream_create(0, &s));
    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    params.name = "stress";
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&params, &pool));
    char dir[] = "/tmp/sp_stress_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);

    std::atomic<bool> stop{false};
    std::atomic<int> errors{0};
    std::vector<std::string> first_error(8);
    auto check = [&](int t, sp_status_t s, const char *what) {
        if (s != SP_SUCCESS && s != SP_ERR_OUT_OF_MEMORY) {
            if (errors.fetch_add(1) == 0)
                first_error[t] = std::string(what) + ": " + sp::describe(s);
        }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; t++) {
        threads.emplace_back([&, t] {
            sp::Lcg r{(unsigned)t * 7919u + 1};
            std::vector<void *> live;
            int step = 0;
            while (!stop.load(std::memory_order_relaxed)) {
                step++;
                unsigned x = r.next();
                switch (t) {
                case 6: { // the observer: dumps, stats, empty_cache
                    sp_stats_t st;
                    check(t, sp_memory_stats(0, &st), "stats");
                    if (step % 8 == 0) {
                        std::string p = std::string(dir) + "/s" + std::to_string(step % 3) +
                                        ((step & 16) ? ".json" : ".pickle");
                        check(t, sp_dump_snapshot(p.c_str()), "dump");
                        check(t, sp_mempool_dump_snapshot(pool, p.c_str()), "pool dump");
                    }
                    check(t, sp_empty_cache(), "empty_cache");
                    check(t, sp_mempool_free_all_blocks(pool, (x & 1) ? streams[0] : nullptr),
                          "free_all_blocks");
                    (void)sp_memory_reserved(0);
                    (void)sp_mempool_used_bytes(pool);
                    std::this_thread::sleep_for(std::chrono::microseconds(200));
                    continue;
                }
                case 7: { // the history switch
                    sp_history_params_t hp;
                    sp_history_params_init(&hp);
                    hp.enabled = (sp_history_enabled_t)(x % 3);
                    hp.context = (sp_history_context_t)((x >> 2) % 4);
                    hp.max_entries = (x & 32) ? 64 : 0;
                    hp.c_stacks = (x & 64) != 0;
                    check(t, sp_record_memory_history(&hp), "history");
                    std::this_thread::sleep_for(std::chrono::microseconds(300));
                    continue;
                }
                default:
                    break;
                }
                bool routed = t < 2 && (x & 3) == 0;
                if (routed)
                    check(t, sp_mempool_begin(pool), "begin");
                size_t size = (x % 8 == 0) ? (x % (6 * MiB)) + 1 : (x % (64 * KiB)) + 1;
                sp_stream_t s = (x & 8) ? streams[t & 1] : nullptr;
                void *p = nullptr;
                sp_status_t st = sp_malloc(size, 0, s, &p);
                check(t, st, "malloc");
                if (routed)
                    check(t, sp_mempool_end(pool), "end");
                if (st == SP_SUCCESS) {
                    if (x & 16)
                        check(t, sp_record_stream(p, streams[(t + 1) & 1]), "record_stream");
                    live.push_back(p);
                }
                if (live.size() > 24 || (x & 0x300) == 0x300) {
                    for (void *q : live)
                        check(t, sp_free(q), "free");
                    live.clear();
                }
            }
            for (void *q : live)
                check(t, sp_free(q), "free");
        });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    stop = true;
    for (auto &th : threads)
        th.join();
    for (auto &e : first_error)
        EXPECT_EQ(e, "");
    EXPECT_EQ(errors.load(), 0);
    sp_history_params_t off;
    sp_history_params_init(&off);
    off.enabled = SP_HISTORY_OFF;
    ASSERT_SP_OK(sp_record_memory_history(&off));
    sp_history_set_frames_hook(nullptr, nullptr);
    for (auto &s : streams) {
        ASSERT_SP_OK(sp_stream_synchronize(s));
        ASSERT_SP_OK(sp_stream_destroy(s));
    }
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    for (const char *n : {"s0", "s1", "s2"})
        for (const char *ext : {".json", ".pickle"})
            unlink((std::string(dir) + "/" + n + ext).c_str());
    EXPECT_EQ(rmdir(dir), 0) << "a dump left a temporary file behind";
    EXPECT_EQ(sp::stat("allocation.all.current"), 0);
}
