// test_host_faults.cc: what the public API does when the host's own resources fail (the heap,
// mmap/mprotect, files), on the host backend. fault_probe.c makes the n-th call to a C library
// function fail; each sweep places that failure at every call an entry point makes in turn
// (n = 1, 2, ... until the call makes fewer than n) and checks the rule for each: the call
// returns a status with a message, or succeeds (a fallback); a failed call changed nothing (the
// stats, the heap blocks the library holds after a shutdown), and the same call works afterwards.
#include "alloc_test_util.hpp"

#include <sympool/experimental.h>

#include <functional>
#include <pthread.h>
#include <string>
#include <thread>
#include <unistd.h>

extern "C" {
#include "fault_probe.h"
}

using namespace sp;

namespace {

struct Step {
    std::function<void()> prep;        // unarmed, before the call
    std::function<sp_status_t()> call; // armed
    std::function<void(bool ok)> undo; // unarmed, after: release what prep and call made
    bool cold = false;                 // the call is the first: no stats are read before it
};

} // namespace

class HostFaults : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        expect_warnings(); // every failure logs one
    }

    // Runs st with the failure at each call in turn (the functions in mask), one run per place.
    void sweep(const char *what, unsigned mask, const Step &st) {
        // The run without a failure: how many calls, and the heap the library keeps after it.
        ASSERT_SP_OK(sp_shutdown());
        st.prep();
        fp_arm(mask, 0, 0);
        ASSERT_SP_OK(st.call());
        long calls = fp_disarm();
        st.undo(true);
        ASSERT_SP_OK(sp_shutdown());
        long base_live = fp_live_blocks();
        long long base_mapped = fp_mapped_bytes();
        for (long n = 1; n <= calls + 1; n++) {
            SCOPED_TRACE(std::string(what) + ", failure at call " + std::to_string(n));
            st.prep();
            sp_stats_t before{};
            if (!st.cold)
                before = snap();
            sp__error_clear();
            fp_arm(mask, n, 0);
            sp_status_t s = st.call();
            fp_disarm();
            bool fired = fp_fired();
            std::string fn = fp_fired_name();
            std::string msg = sp_last_error();
            if (!fired) {
                EXPECT_EQ(s, SP_SUCCESS) << describe(s);
                st.undo(s == SP_SUCCESS);
                ASSERT_SP_OK(sp_shutdown());
                break;
            }
            if (s != SP_SUCCESS) {
                EXPECT_NE(s, SP_ERR_INTERNAL) << fn << ": " << msg;
                EXPECT_FALSE(msg.empty())
                    << fn << " failed: " << sp_status_name(s) << " without a message";
                if (!st.cold) {
                    EXPECT_EQ(diff(before, snap()), "") << fn << " failed: " << describe(s);
                }
                // The same call works once the failure is gone.
                s = st.call();
                EXPECT_EQ(s, SP_SUCCESS) << "after " << fn << ": " << describe(s);
            }
            st.undo(s == SP_SUCCESS);
            sp_status_t sh = sp_shutdown();
            ASSERT_EQ(sh, SP_SUCCESS) << "after " << fn << ": " << describe(sh);
            EXPECT_EQ(fp_live_blocks(), base_live)
                << "heap blocks kept after " << fn << " failed at call " << n;
            EXPECT_EQ(fp_mapped_bytes(), base_mapped)
                << "mappings kept after " << fn << " failed at call " << n;
        }
    }
};

// First in the file: the thread cache makes its thread-specific key once per process, so the
// failure must meet that first making (where an earlier test made it, the test skips).
// pthread_key_create fails with EAGAIN once a process holds PTHREAD_KEYS_MAX keys. The cache
// ignored the failure and stored each thread's cache under key 0 (its key variable's zero):
// another library's key, whose destructor then got the cache at thread exit (GoogleTest's
// ThreadLocal here: a segmentation fault), and whose value the thread lost. Without its key the
// cache is off and allocations take the ordinary path.
TEST_F(HostFaults, ThreadCacheWithoutAKeyLeavesOtherKeysAlone) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "1MiB"}});
    ASSERT_SP_OK(sp_init());
    fp_arm(FP_PTHREAD_KEY, 1, 0);
    std::thread th([] {
        // Key 0 is the process's first key, not ours (GoogleTest's here; ASan's in its build).
        void *before = pthread_getspecific((pthread_key_t)0);
        for (int i = 0; i < 3; i++) {
            void *p = nullptr;
            EXPECT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
            EXPECT_SP_OK(sp_free(p));
        }
        // Read and put back before any assertion: GoogleTest keeps its reporter under key 0.
        void *seen = pthread_getspecific((pthread_key_t)0);
        (void)pthread_setspecific((pthread_key_t)0, before); // its destructor must not see ours
        EXPECT_EQ(seen, before) << "the thread cache was stored under another library's key";
    });
    th.join();
    fp_disarm();
    if (!fp_fired())
        GTEST_SKIP() << "the thread cache's key was made by an earlier test in this process";
    EXPECT_EQ(stat("allocation.all.current"), 0);
    // Later threads still allocate (without a cache).
    std::thread again([] {
        void *before = pthread_getspecific((pthread_key_t)0);
        void *p = nullptr;
        EXPECT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
        EXPECT_SP_OK(sp_free(p));
        void *seen = pthread_getspecific((pthread_key_t)0);
        (void)pthread_setspecific((pthread_key_t)0, before);
        EXPECT_EQ(seen, before);
    });
    again.join();
}

TEST_F(HostFaults, MallocColdStart) {
    void *p = nullptr;
    sweep("sp_malloc cold", FP_ALL,
          {[] {}, [&] { return sp_malloc(4096, 0, nullptr, &p); },
           [&](bool ok) {
               if (ok)
                   EXPECT_SP_OK(sp_free(p));
           }});
}

TEST_F(HostFaults, MallocWarm) {
    void *p = nullptr, *q = nullptr;
    sweep("sp_malloc warm", FP_ALL,
          {[&] { ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &q)); },
           [&] { return sp_malloc(30 * MiB, 0, nullptr, &p); },
           [&](bool ok) {
               if (ok)
                   EXPECT_SP_OK(sp_free(p));
               EXPECT_SP_OK(sp_free(q));
           }});
}

TEST_F(HostFaults, MallocManySmall) {
    std::vector<void *> v(2000);
    void *p = nullptr;
    sweep("sp_malloc many", FP_ALL,
          {[&] {
               for (auto &x : v)
                   ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &x));
           },
           [&] { return sp_malloc(512, 0, nullptr, &p); },
           [&](bool ok) {
               if (ok)
                   EXPECT_SP_OK(sp_free(p));
               for (auto &x : v)
                   EXPECT_SP_OK(sp_free(x));
           }});
}

TEST_F(HostFaults, FreeCrossStream) {
    void *p = nullptr;
    sp_stream_t s1 = nullptr;
    sweep("sp_free recorded", FP_ALL,
          {[&] {
               ASSERT_SP_OK(sp_stream_create(0, &s1));
               ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
               ASSERT_SP_OK(sp_record_stream(p, s1));
           },
           [&] { return sp_free(p); },
           [&](bool ok) {
               if (!ok)
                   EXPECT_SP_OK(sp_free(p));
               EXPECT_SP_OK(sp_stream_synchronize(s1));
               EXPECT_SP_OK(sp_stream_destroy(s1));
           }});
}

TEST_F(HostFaults, RecordStream) {
    void *p = nullptr;
    sp_stream_t s1 = nullptr;
    sweep("sp_record_stream", FP_ALL,
          {[&] {
               ASSERT_SP_OK(sp_stream_create(0, &s1));
               ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
           },
           [&] { return sp_record_stream(p, s1); },
           [&](bool) {
               EXPECT_SP_OK(sp_free(p));
               EXPECT_SP_OK(sp_stream_synchronize(s1));
               EXPECT_SP_OK(sp_stream_destroy(s1));
           }});
}

TEST_F(HostFaults, StreamCreate) {
    sp_stream_t s1 = nullptr;
    sweep("sp_stream_create", FP_ALL,
          {[&] { ASSERT_SP_OK(sp_init()); }, [&] { return sp_stream_create(0, &s1); },
           [&](bool ok) {
               if (ok)
                   EXPECT_SP_OK(sp_stream_destroy(s1));
           }});
}

TEST_F(HostFaults, MempoolCreate) {
    sp_mempool_t *pool = nullptr;
    sweep("sp_mempool_create", FP_ALL,
          {[&] { ASSERT_SP_OK(sp_init()); },
           [&] {
               sp_mempool_params_t params;
               sp_mempool_params_init(&params);
               params.name = "grads";
               return sp_mempool_create(&params, &pool);
           },
           [&](bool ok) {
               if (!ok)
                   return;
               // A pool made through a fallback (its free set without size classes) works.
               std::vector<void *> v;
               for (size_t size : {512ul, 4096ul, 1ul << 20, 3ul << 20, 30ul << 20, 512ul}) {
                   void *p = nullptr;
                   EXPECT_SP_OK(sp_mempool_malloc(pool, size, nullptr, &p));
                   v.push_back(p);
               }
               for (size_t i = 0; i < v.size(); i += 2)
                   EXPECT_SP_OK(sp_free(v[i]));
               for (size_t i = 1; i < v.size(); i += 2)
                   EXPECT_SP_OK(sp_free(v[i]));
               EXPECT_SP_OK(sp_mempool_destroy(pool));
           }});
}

TEST_F(HostFaults, MempoolMalloc) {
    sp_mempool_t *pool = nullptr;
    void *p = nullptr;
    sweep("sp_mempool_malloc", FP_ALL,
          {[&] { pool = make_named_pool("grads"); },
           [&] { return sp_mempool_malloc(pool, 1 * MiB, nullptr, &p); },
           [&](bool ok) {
               if (ok)
                   EXPECT_SP_OK(sp_free(p));
               EXPECT_SP_OK(sp_mempool_destroy(pool));
           }});
}

TEST_F(HostFaults, MempoolRouted) {
    sp_mempool_t *pool = nullptr;
    void *p = nullptr;
    sweep("sp_mempool_begin", FP_ALL,
          {[&] { pool = make_named_pool("grads"); },
           [&] {
               sp_status_t s = sp_mempool_begin(pool);
               if (s != SP_SUCCESS)
                   return s;
               s = sp_malloc(1 * MiB, 0, nullptr, &p);
               EXPECT_SP_OK(sp_mempool_end(pool));
               return s;
           },
           [&](bool ok) {
               if (ok)
                   EXPECT_SP_OK(sp_free(p));
               EXPECT_SP_OK(sp_mempool_destroy(pool));
           }});
}

TEST_F(HostFaults, MempoolDestroy) {
    sp_mempool_t *pool = nullptr;
    sweep("sp_mempool_destroy", FP_ALL,
          {[&] {
               pool = make_named_pool("grads");
               void *p;
               ASSERT_SP_OK(sp_mempool_malloc(pool, 1 * MiB, nullptr, &p));
               ASSERT_SP_OK(sp_free(p));
           },
           [&] { return sp_mempool_destroy(pool); }, [&](bool) {}});
}

static void history_on(size_t max_entries = 0) {
    sp_history_params_t hp;
    sp_history_params_init(&hp);
    hp.enabled = SP_HISTORY_ALL;
    hp.context = SP_CONTEXT_ALL;
    hp.c_stacks = true;
    hp.max_entries = max_entries;
    ASSERT_SP_OK(sp_record_memory_history(&hp));
}
static void history_off() {
    sp_history_params_t hp;
    sp_history_params_init(&hp);
    hp.enabled = SP_HISTORY_OFF;
    EXPECT_SP_OK(sp_record_memory_history(&hp));
}

TEST_F(HostFaults, HistoryEnable) {
    sweep("sp_record_memory_history", FP_ALL,
          {[&] { ASSERT_SP_OK(sp_init()); },
           [&] {
               sp_history_params_t hp;
               sp_history_params_init(&hp);
               hp.enabled = SP_HISTORY_ALL;
               hp.context = SP_CONTEXT_ALL;
               hp.c_stacks = true;
               hp.max_entries = 100;
               return sp_record_memory_history(&hp);
           },
           [&](bool) { history_off(); }});
}

TEST_F(HostFaults, HistoryMallocFree) {
    void *p = nullptr;
    sweep("sp_malloc+free with history", FP_ALL,
          {[&] { history_on(); },
           [&] {
               sp_status_t s = sp_malloc(4096, 0, nullptr, &p);
               if (s != SP_SUCCESS)
                   return s;
               s = sp_free(p);
               if (s != SP_SUCCESS) // the block stays live: free it unarmed
                   EXPECT_SP_OK(sp_free(p));
               return s;
           },
           [&](bool) { history_off(); }});
}

TEST_F(HostFaults, HistoryRing) {
    std::vector<void *> v(40);
    void *p = nullptr;
    sweep("sp_malloc with a full ring", FP_ALL,
          {[&] {
               history_on(16);
               for (auto &x : v)
                   ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &x));
           },
           [&] { return sp_malloc(4096, 0, nullptr, &p); },
           [&](bool ok) {
               if (ok)
                   EXPECT_SP_OK(sp_free(p));
               for (auto &x : v)
                   EXPECT_SP_OK(sp_free(x));
               history_off();
           }});
}

TEST_F(HostFaults, EmptyCache) {
    std::vector<void *> v(8);
    sweep("sp_empty_cache", FP_ALL,
          {[&] {
               for (auto &x : v)
                   ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &x));
               for (size_t i = 0; i < v.size(); i += 2)
                   ASSERT_SP_OK(sp_free(v[i]));
           },
           [&] { return sp_empty_cache(); },
           [&](bool) {
               for (size_t i = 1; i < v.size(); i += 2)
                   EXPECT_SP_OK(sp_free(v[i]));
           }});
}

TEST_F(HostFaults, StatsAndSummary) {
    void *p = nullptr;
    std::vector<char> buf(1 << 16);
    sweep("sp_memory_summary", FP_ALL,
          {[&] { ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p)); },
           [&] {
               sp_stats_t st;
               sp_status_t s = sp_memory_stats(0, &st);
               if (s != SP_SUCCESS)
                   return s;
               s = sp_reset_peak_memory_stats(0);
               if (s != SP_SUCCESS)
                   return s;
               return sp_memory_summary(0, buf.data(), buf.size());
           },
           [&](bool) { EXPECT_SP_OK(sp_free(p)); }});
}

TEST_F(HostFaults, Setters) {
    sp_mempool_t *pool = nullptr;
    sweep("setters", FP_ALL,
          {[&] { pool = make_named_pool("grads"); },
           [&] {
               sp_status_t s = sp_set_memory_fraction(0.5, 0);
               if (s != SP_SUCCESS)
                   return s;
               s = sp_mempool_set_limit(pool, 64 * MiB);
               if (s != SP_SUCCESS)
                   return s;
               return sp_x_option_set("SYMPOOL_HOST_CAPACITY", "1GiB");
           },
           [&](bool) { EXPECT_SP_OK(sp_mempool_destroy(pool)); }});
}

namespace {} // namespace

class HostFaultsFiles : public HostFaults {
  protected:
    void SetUp() override {
        HostFaults::SetUp();
        char tmpl[] = "/tmp/sp_faults_XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
    }
    void TearDown() override {
        std::string cmd = "rm -rf " + dir_;
        EXPECT_EQ(system(cmd.c_str()), 0);
        HostFaults::TearDown();
    }
    // A file `name` in the folder holding "old contents"; the step's call must leave it so when it
    // fails, and leave no other file.
    Step keeps_file(const std::string &name, std::function<void()> prep,
                    std::function<sp_status_t(const std::string &)> call,
                    std::function<void(bool)> undo) {
        std::string path = dir_ + "/" + name;
        return {[path, prep] {
                    FILE *f = fopen(path.c_str(), "wb");
                    ASSERT_NE(f, nullptr);
                    fputs("old contents", f);
                    fclose(f);
                    prep();
                },
                [this, path, name, call] {
                    sp_status_t s = call(path);
                    if (s != SP_SUCCESS) {
                        EXPECT_EQ(sp::read_file(path), "old contents") << describe(s);
                        EXPECT_EQ(sp::list_dir(dir_), name + "\n") << describe(s);
                    } else {
                        EXPECT_NE(sp::read_file(path), "old contents");
                    }
                    return s;
                },
                undo};
    }
    void dump_snapshot_sweep(const char *what, const char *name);
    std::string dir_;
};

// sp_dump_snapshot of a file named `name` (its suffix chooses the format) under every fault.
void HostFaultsFiles::dump_snapshot_sweep(const char *what, const char *name) {
    void *p = nullptr;
    sweep(what, FP_ALL,
          keeps_file(
              name,
              [&] {
                  history_on();
                  ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
              },
              [](const std::string &path) { return sp_dump_snapshot(path.c_str()); },
              [&](bool) {
                  EXPECT_SP_OK(sp_free(p));
                  history_off();
              }));
}

TEST_F(HostFaultsFiles, DumpSnapshotPickle) {
    dump_snapshot_sweep("sp_dump_snapshot pickle", "snap.pickle");
}

TEST_F(HostFaultsFiles, DumpSnapshotJson) {
    dump_snapshot_sweep("sp_dump_snapshot json", "snap.json");
}

TEST_F(HostFaultsFiles, MempoolDumpSnapshot) {
    void *p = nullptr;
    sp_mempool_t *pool = nullptr;
    sweep("sp_mempool_dump_snapshot", FP_ALL,
          keeps_file(
              "pool.pickle",
              [&] {
                  history_on();
                  pool = make_named_pool("grads");
                  ASSERT_SP_OK(sp_mempool_malloc(pool, 4096, nullptr, &p));
              },
              [&](const std::string &path) { return sp_mempool_dump_snapshot(pool, path.c_str()); },
              [&](bool) {
                  EXPECT_SP_OK(sp_free(p));
                  EXPECT_SP_OK(sp_mempool_destroy(pool));
                  history_off();
              }));
}

TEST_F(HostFaultsFiles, FileWriteAtomic) {
    sweep("sp_x_file_write_atomic", FP_ALL,
          keeps_file(
              "out.txt", [] { ASSERT_SP_OK(sp_init()); },
              [](const std::string &path) {
                  return sp_x_file_write_atomic(path.c_str(), "new contents", 12);
              },
              [](bool) {}));
}

TEST_F(HostFaults, InitCold) {
    Step st{[] {}, [] { return sp_init(); }, [](bool) {}};
    st.cold = true;
    sweep("sp_init", FP_ALL, st);
}

TEST_F(HostFaults, MallocFirstCall) {
    void *p = nullptr;
    Step st{[] {}, [&] { return sp_malloc(4096, 0, nullptr, &p); },
            [&](bool ok) {
                if (ok)
                    EXPECT_SP_OK(sp_free(p));
            }};
    st.cold = true;
    sweep("sp_malloc first", FP_ALL, st);
}

TEST_F(HostFaults, ExpandableMallocFree) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    void *p = nullptr, *q = nullptr;
    sweep("expandable malloc", FP_ALL,
          {[&] { ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &q)); },
           [&] { return sp_malloc(50 * MiB, 0, nullptr, &p); },
           [&](bool ok) {
               if (ok)
                   EXPECT_SP_OK(sp_free(p));
               EXPECT_SP_OK(sp_free(q));
           }});
    sweep("expandable empty_cache", FP_ALL,
          {[&] {
               ASSERT_SP_OK(sp_malloc(50 * MiB, 0, nullptr, &q));
               ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &p));
               ASSERT_SP_OK(sp_free(q));
           },
           [&] { return sp_empty_cache(); }, [&](bool) { EXPECT_SP_OK(sp_free(p)); }});
}

TEST_F(HostFaults, ThreadCache) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "1MiB"}});
    void *p = nullptr;
    sweep("thread cache", FP_ALL,
          {[&] { ASSERT_SP_OK(sp_init()); },
           [&] {
               sp_status_t s = sp_malloc(4096, 0, nullptr, &p);
               if (s != SP_SUCCESS)
                   return s;
               s = sp_free(p);
               if (s != SP_SUCCESS)
                   EXPECT_SP_OK(sp_free(p));
               if (s == SP_SUCCESS)
                   s = sp_malloc(4096, 0, nullptr, &p);
               if (s == SP_SUCCESS)
                   s = sp_free(p);
               return s;
           },
           [&](bool) {}});
}

TEST_F(HostFaults, HostPlace) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"}});
    void *p = nullptr;
    sweep("sp_x_host_place", FP_ALL,
          {[&] { ASSERT_SP_OK(sp_init()); },
           [&] {
               sp_status_t s = sp_x_host_place(0, 64 * MiB, 0);
               if (s != SP_SUCCESS)
                   return s;
               return sp_malloc(4096, 0, nullptr, &p);
           },
           [&](bool ok) {
               if (ok)
                   EXPECT_SP_OK(sp_free(p));
           }});
}

TEST_F(HostFaults, HistoryStateWithLiveBlocks) {
    std::vector<void *> v(50);
    sweep("history state", FP_ALL,
          {[&] {
               for (auto &x : v)
                   ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &x));
           },
           [&] {
               sp_history_params_t hp;
               sp_history_params_init(&hp);
               hp.enabled = SP_HISTORY_STATE;
               hp.context = SP_CONTEXT_STATE;
               hp.c_stacks = true;
               return sp_record_memory_history(&hp);
           },
           [&](bool) {
               for (auto &x : v)
                   EXPECT_SP_OK(sp_free(x));
               history_off();
           }});
}

TEST_F(HostFaults, HistoryResize) {
    std::vector<void *> v(50);
    sweep("history resize", FP_ALL,
          {[&] {
               history_on(1000);
               for (auto &x : v)
                   ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &x));
           },
           [&] {
               sp_history_params_t hp;
               sp_history_params_init(&hp);
               hp.max_entries = 10;
               return sp_record_memory_history(&hp);
           },
           [&](bool) {
               for (auto &x : v)
                   EXPECT_SP_OK(sp_free(x));
               history_off();
           }});
}

TEST_F(HostFaults, HistoryAnnotationsAndMetadata) {
    sweep("annotation+metadata", FP_ALL,
          {[&] { history_on(); },
           [&] {
               sp_status_t s = sp_history_record_annotation(0, "START", "fwd");
               if (s != SP_SUCCESS)
                   return s;
               return sp_history_set_user_metadata(0, "step 3");
           },
           [&](bool) { history_off(); }});
}

TEST_F(HostFaults, ManyMempools) {
    std::vector<sp_mempool_t *> pools;
    sp_mempool_t *pool = nullptr;
    sweep("many mempools", FP_ALL,
          {[&] {
               for (int i = 0; i < 300; i++)
                   pools.push_back(make_named_pool("p"));
           },
           [&] {
               sp_mempool_params_t params;
               sp_mempool_params_init(&params);
               return sp_mempool_create(&params, &pool);
           },
           [&](bool ok) {
               if (ok)
                   EXPECT_SP_OK(sp_mempool_destroy(pool));
               for (auto x : pools)
                   EXPECT_SP_OK(sp_mempool_destroy(x));
               pools.clear();
           }});
}

// A run of mixed calls (allocations of many sizes on two streams, frees, a MemPool, history,
// empty_cache) with the failure at each call in turn: the call that meets it fails alone, with a
// message; every other call of the run works; what is left is freed and shut down cleanly, and a
// snapshot taken afterwards is whole.
class HostFaultsWorkload : public HostFaults {
  protected:
    struct Result {
        int failed = 0;
        std::string what;
    };
    Result run_once(const std::string &snap_path) {
        Result r;
        auto check = [&](sp_status_t s, const char *what) {
            if (s != SP_SUCCESS) {
                r.failed++;
                r.what += std::string(what) + ": " + describe(s) + "; ";
                EXPECT_NE(s, SP_ERR_INTERNAL) << what << ": " << sp_last_error();
                EXPECT_STRNE(sp_last_error(), "") << what;
            }
            return s == SP_SUCCESS;
        };
        sp::Lcg rng{7};
        sp_stream_t s1 = nullptr;
        while (!check(sp_stream_create(0, &s1), "sp_stream_create")) {
        }
        sp_mempool_t *pool = nullptr;
        sp_mempool_params_t params;
        sp_mempool_params_init(&params);
        params.name = "grads";
        while (!check(sp_mempool_create(&params, &pool), "sp_mempool_create")) {
        }
        std::vector<void *> live;
        for (int i = 0; i < 300; i++) {
            unsigned x = rng.next();
            size_t size = (x & 1) ? 512 * (1 + x % 64) : (size_t)(1 + x % 24) * MiB + x % 4096;
            if (live.size() > 20 || (!live.empty() && x % 3 == 0)) {
                size_t k = (x >> 4) % live.size();
                if (x % 5 == 0)
                    check(sp_record_stream(live[k], s1), "sp_record_stream");
                if (check(sp_free(live[k]), "sp_free")) {
                    live[k] = live.back();
                    live.pop_back();
                }
            } else {
                void *p = nullptr;
                sp_status_t s = (x % 7 == 0)   ? sp_mempool_malloc(pool, size, s1, &p)
                                : (x % 2 == 0) ? sp_malloc(size, 0, s1, &p)
                                               : sp_malloc(size, 0, nullptr, &p);
                if (check(s, "malloc"))
                    live.push_back(p);
            }
            if (i % 97 == 0)
                check(sp_empty_cache(), "sp_empty_cache");
        }
        for (void *p : live)
            while (!check(sp_free(p), "sp_free")) {
            }
        while (!check(sp_stream_synchronize(s1), "sp_stream_synchronize")) {
        }
        while (!check(sp_mempool_destroy(pool), "sp_mempool_destroy")) {
        }
        while (!check(sp_stream_destroy(s1), "sp_stream_destroy")) {
        }
        (void)snap_path;
        return r;
    }

    void sweep_workload(const char *what, unsigned mask, const char *snap_name) {
        std::string path = std::string(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") +
                           "/sp_faults_workload_" + std::to_string(getpid()) + "_" + snap_name;
        ASSERT_SP_OK(sp_shutdown());
        history_on(200);
        fp_arm(mask, 0, 0);
        Result base = run_once(path);
        long calls = fp_disarm();
        ASSERT_EQ(base.failed, 0) << base.what;
        ASSERT_SP_OK(sp_dump_snapshot(path.c_str()));
        history_off();
        ASSERT_SP_OK(sp_shutdown());
        long base_live = fp_live_blocks();
        long long base_mapped = fp_mapped_bytes();
        for (long n = 1; n <= calls; n++) {
            SCOPED_TRACE(std::string(what) + ", failure at call " + std::to_string(n));
            history_on(200);
            fp_arm(mask, n, 0);
            Result r = run_once(path);
            fp_disarm();
            EXPECT_LE(r.failed, 1) << r.what;
            sp_status_t s = sp_dump_snapshot(path.c_str());
            EXPECT_EQ(s, SP_SUCCESS) << "after " << fp_fired_name() << ": " << describe(s);
            history_off();
            s = sp_shutdown();
            ASSERT_EQ(s, SP_SUCCESS) << "after " << fp_fired_name() << ": " << describe(s);
            EXPECT_EQ(fp_live_blocks(), base_live)
                << "heap blocks kept after " << fp_fired_name() << " failed at call " << n;
            EXPECT_EQ(fp_mapped_bytes(), base_mapped)
                << "mappings kept after " << fp_fired_name() << " failed at call " << n;
        }
        unlink(path.c_str());
    }
};

TEST_F(HostFaultsWorkload, Default) {
    sweep_workload("workload", FP_HEAP | FP_MMAP | FP_MPROTECT, "a.pickle");
}

TEST_F(HostFaultsWorkload, Expandable) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    sweep_workload("workload expandable", FP_HEAP | FP_MMAP | FP_MPROTECT, "b.json");
}

TEST_F(HostFaultsWorkload, ThreadCacheAndSplitLimits) {
    sp::ScopedEnv env(
        {{"SYMPOOL_THREAD_CACHE", "256KiB"},
         {"SYMPOOL_ALLOC_CONF", "max_split_size_mb:8,garbage_collection_threshold:0.5"}});
    sweep_workload("workload tc", FP_HEAP | FP_MMAP | FP_MPROTECT, "c.pickle");
}

TEST_F(HostFaults, HostArenaMalloc) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"}});
    void *p = nullptr;
    Step st{[] {}, [&] { return sp_malloc(30 * MiB, 0, nullptr, &p); },
            [&](bool ok) {
                if (ok)
                    EXPECT_SP_OK(sp_free(p));
            }};
    st.cold = true;
    sweep("arena malloc first", FP_ALL, st);
}

// A log function is installed (the fixture's capture; the CLI's filters): the failing call's
// message is kept across it. It was kept in a strdup'd copy, and with no heap for the copy the
// call returned its status with sp_last_error() empty: under host memory pressure, every failure
// lost its reason.
TEST_F(HostFaults, MessageKeptAcrossTheLogFunctionWithoutHeap) {
    ASSERT_SP_OK(sp_init());
    int local = 0;
    // The first heap allocation the call makes fails (there was one: the copy).
    fp_arm(FP_HEAP, 1, 0);
    sp_status_t s = sp_free(&local); // not sympool's: refused with a message and a WARN
    fp_disarm();
    EXPECT_EQ(s, SP_ERR_INVALID_USAGE) << describe(s);
    EXPECT_NE(std::string(sp_last_error()), "") << "the message was lost";
    EXPECT_GE(warnings(), 1u) << "the log function ran";
}

// History with a binding's frames (the frames hook) and C stacks, the heap failing at each call
// of an allocation and a free in turn: the calls work (a record without its stack at worst) and
// a snapshot taken afterwards is whole.
static size_t three_frames(sp_history_frame_t *frames, size_t max, void *) {
    static const sp_history_frame_t f[3] = {
        {"forward", "model.py", 12}, {"step", "train.py", 40}, {"<module>", "main.py", -1}};
    size_t n = max < 3 ? max : 3;
    for (size_t i = 0; i < n; i++)
        frames[i] = f[i];
    return n;
}

TEST_F(HostFaultsFiles, HistoryWithFramesHook) {
    void *p = nullptr;
    std::string path = dir_ + "/after.json";
    sweep("history with a frames hook", FP_ALL,
          {[&] {
               sp_history_set_frames_hook(three_frames, nullptr);
               history_on();
           },
           [&] {
               sp_status_t s = sp_malloc(4096, 0, nullptr, &p);
               if (s != SP_SUCCESS)
                   return s;
               s = sp_free(p);
               if (s != SP_SUCCESS)
                   EXPECT_SP_OK(sp_free(p));
               return s;
           },
           [&](bool) {
               EXPECT_SP_OK(sp_dump_snapshot(path.c_str()));
               std::string text = sp::read_file(path);
               char *pickle = nullptr, err[200] = "";
               size_t len = 0;
               EXPECT_TRUE(
                   sp_x_json_to_pickle(text.data(), text.size(), &pickle, &len, err, sizeof err))
                   << err;
               free(pickle);
               history_off();
               sp_history_set_frames_hook(nullptr, nullptr);
           }});
}

// The JSON snapshot reader (the CLI's, sp_x_json_to_pickle) with the heap failing at each of its
// allocations: false with a message and nothing written, or the same pickle as without a failure.
TEST_F(HostFaults, JsonToPickle) {
    std::string json = "{\"segments\": [{\"address\": 1234, \"total_size\": 2097152, \"blocks\": "
                       "[{\"size\": 512, \"state\": \"active_allocated\", \"frames\": [{\"name\": "
                       "\"f\\u00e9\", \"filename\": \"a.py\", \"line\": 3}]}]}], "
                       "\"device_traces\": [[{\"action\": \"alloc\", \"addr\": 1234, \"size\": "
                       "512, \"stream\": 0, \"time_us\": 1.5e3, \"frames\": []}]], \"s\": \"";
    json += std::string(5000, 'x') + "\"}";
    char *base = nullptr, err[200] = "";
    size_t base_len = 0;
    fp_arm(FP_ALL, 0, 0);
    ASSERT_TRUE(sp_x_json_to_pickle(json.data(), json.size(), &base, &base_len, err, sizeof err))
        << err;
    long calls = fp_disarm();
    long live = fp_live_blocks();
    for (long n = 1; n <= calls; n++) {
        SCOPED_TRACE("failure at call " + std::to_string(n));
        char *pickle = (char *)0x1;
        size_t len = 7;
        err[0] = '\0';
        fp_arm(FP_ALL, n, 0);
        bool ok = sp_x_json_to_pickle(json.data(), json.size(), &pickle, &len, err, sizeof err);
        fp_disarm();
        if (ok) {
            EXPECT_EQ(std::string(pickle, len), std::string(base, base_len));
            free(pickle);
        } else {
            EXPECT_STRNE(err, "");
            EXPECT_EQ(pickle, (char *)0x1);
            EXPECT_EQ(len, 7u);
        }
        EXPECT_EQ(fp_live_blocks(), live) << "heap blocks kept after " << fp_fired_name();
    }
    free(base);
}

// The block structs' arena grows (mprotect) as blocks are made: the failure placed at each of
// its first growths. The allocation that needed the room fails with a message, the others work,
// and everything frees.
TEST_F(HostFaults, StructArenaGrowth) {
    for (long n = 1; n <= 3; n++) {
        SCOPED_TRACE("failure at mprotect " + std::to_string(n));
        ASSERT_SP_OK(sp_shutdown());
        std::vector<void *> v;
        int failed = 0;
        fp_arm(FP_MPROTECT, n, 0);
        for (int i = 0; i < 200000; i++) {
            void *p = nullptr;
            sp_status_t s = sp_malloc(512, 0, nullptr, &p);
            if (s != SP_SUCCESS) {
                failed++;
                EXPECT_STRNE(sp_last_error(), "") << describe(s);
                EXPECT_NE(s, SP_ERR_INTERNAL) << describe(s);
                continue;
            }
            v.push_back(p);
        }
        fp_disarm();
        EXPECT_LE(failed, 1);
        for (void *p : v)
            ASSERT_SP_OK(sp_free(p));
        EXPECT_EQ(stat("allocation.all.current"), 0);
    }
}
