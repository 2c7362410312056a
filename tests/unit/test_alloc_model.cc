// test_alloc_model.cc: a randomized check of the stats bookkeeping against the heap itself.
// Random mallocs (all size classes, three streams, cross-stream uses), frees, stream syncs and
// cache releases; after every step the segment walk must agree with memory_stats: reserved and
// segment counts, allocated/active/requested bytes, inactive_split blocks and bytes, and the
// small/large split. Run with and without max_split_size.
#include "alloc_test_util.hpp"

#include <random>
#include <vector>

extern "C" {
#include "pool/pool.h"
}

using namespace sp;

namespace {

struct Totals {
    int64_t seg[3] = {0, 0, 0}, reserved[3] = {0, 0, 0}, alloc[3] = {0, 0, 0},
            alloc_bytes[3] = {0, 0, 0}, active[3] = {0, 0, 0}, active_bytes[3] = {0, 0, 0},
            split[3] = {0, 0, 0}, split_bytes[3] = {0, 0, 0};
};

void visit(const sp_segment_view_t *s, void *arg) {
    auto *t = static_cast<Totals *>(arg);
    for (int k : {0, s->is_small ? 1 : 2}) {
        t->seg[k]++;
        t->reserved[k] += (int64_t)s->total_size;
        for (size_t i = 0; i < s->nblocks; i++) {
            const sp_block_view_t &b = s->blocks[i];
            if (b.state == SP_BLOCK_ACTIVE_ALLOCATED) {
                t->alloc[k]++;
                t->alloc_bytes[k] += (int64_t)b.size;
            }
            if (b.state != SP_BLOCK_INACTIVE) {
                t->active[k]++;
                t->active_bytes[k] += (int64_t)b.size;
            } else if (s->nblocks > 1) {
                t->split[k]++;
                t->split_bytes[k] += (int64_t)b.size;
            }
        }
    }
}

void check(int step) {
    Totals t;
    ASSERT_EQ(sp__pool_walk(0, nullptr, visit, &t), SP_SUCCESS);
    const char *types[3] = {"all", "small_pool", "large_pool"};
    for (int k = 0; k < 3; k++) {
        auto key = [&](const char *arr) { return std::string(arr) + "." + types[k] + ".current"; };
        ASSERT_EQ(stat(key("segment").c_str()), t.seg[k]) << "step " << step;
        ASSERT_EQ(stat(key("reserved_bytes").c_str()), t.reserved[k]) << "step " << step;
        ASSERT_EQ(stat(key("allocation").c_str()), t.alloc[k]) << "step " << step;
        ASSERT_EQ(stat(key("allocated_bytes").c_str()), t.alloc_bytes[k]) << "step " << step;
        ASSERT_EQ(stat(key("active").c_str()), t.active[k]) << "step " << step;
        ASSERT_EQ(stat(key("active_bytes").c_str()), t.active_bytes[k]) << "step " << step;
        ASSERT_EQ(stat(key("inactive_split").c_str()), t.split[k]) << "step " << step;
        ASSERT_EQ(stat(key("inactive_split_bytes").c_str()), t.split_bytes[k]) << "step " << step;
    }
}

void run_model(unsigned seed) {
    std::mt19937_64 rng(seed);
    sp_stream_t streams[3] = {nullptr, nullptr, nullptr};
    ASSERT_EQ(sp_stream_create(0, &streams[1]), SP_SUCCESS);
    ASSERT_EQ(sp_stream_create(0, &streams[2]), SP_SUCCESS);
    struct Live {
        void *p;
        size_t req;
    };
    std::vector<Live> live;
    int64_t requested = 0;
    for (int step = 0; step < 3000; step++) {
        unsigned op = rng() % 100;
        if (op < 50 || live.empty()) {
            size_t sz;
            switch (rng() % 4) {
            case 0:
                sz = 1 + rng() % 4096;
                break;
            case 1:
                sz = 1 + rng() % (1 << 20);
                break;
            case 2:
                sz = (1 << 20) + rng() % (12 << 20);
                break;
            default:
                sz = 1 + rng() % (40 << 20);
                break;
            }
            void *p = nullptr;
            ASSERT_EQ(sp_malloc(sz, 0, streams[rng() % 3], &p), SP_SUCCESS) << sp_last_error();
            live.push_back({p, sz});
            requested += (int64_t)sz;
            if (rng() % 5 == 0) {
                ASSERT_EQ(sp_record_stream(p, streams[rng() % 3]), SP_SUCCESS);
            }
        } else if (op < 92) {
            size_t i = rng() % live.size();
            ASSERT_EQ(sp_free(live[i].p), SP_SUCCESS);
            requested -= (int64_t)live[i].req;
            live[i] = live.back();
            live.pop_back();
        } else if (op < 97) {
            ASSERT_EQ(sp_stream_synchronize(streams[rng() % 3]), SP_SUCCESS);
        } else {
            ASSERT_EQ(sp_empty_cache(), SP_SUCCESS);
        }
        ASSERT_NO_FATAL_FAILURE(check(step));
        // requested_bytes includes pending frees, so it is >= what the model holds live.
        ASSERT_GE(stat("requested_bytes.all.current"), requested) << "step " << step;
    }
    for (auto &l : live) {
        ASSERT_EQ(sp_free(l.p), SP_SUCCESS);
    }
    ASSERT_EQ(sp_empty_cache(), SP_SUCCESS);
    ASSERT_NO_FATAL_FAILURE(check(-1));
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
    EXPECT_EQ(stat("requested_bytes.all.current"), 0);
    ASSERT_EQ(sp_stream_destroy(streams[1]), SP_SUCCESS);
    ASSERT_EQ(sp_stream_destroy(streams[2]), SP_SUCCESS);
}

} // namespace

class AllocModel : public sp::Test {};

TEST_F(AllocModel, StatsMatchTheHeapDefaultConfig) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64GiB"}});
    run_model(1);
}

TEST_F(AllocModel, StatsMatchTheHeapWithMaxSplitSize) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64GiB"},
                       {"SYMPOOL_ALLOC_CONF", "max_split_size_mb:20,roundup_power2_divisions:4"}});
    run_model(2);
}
