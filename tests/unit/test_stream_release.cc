// test_stream_release.cc: sp_stream_destroy releases the stream's cached segments by looking them
// up in the pools' free sets and unmapped lists (ordered by stream first), not by a walk of every
// segment of the device. Seeded random runs, fixed and expandable segments, several streams,
// streams destroyed with live blocks on them and with free ones of every kind: the lookup must
// release what the walk released, in the walk's order, to the byte.
#include "alloc_test_util.hpp"
#include "history_test_util.hpp"

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "pool/history.h"
#include "pool/pool.h"
extern bool sp__release_by_walk; // pool/release.h (which C++ cannot include: C11 atomics)
}

using namespace sp;

namespace {

struct Outcome {
    std::vector<std::string> layouts; // after each destroy: every segment and its blocks
    std::vector<int64_t> stats;       // after each destroy
    std::vector<std::string> trace;   // the history, addresses as offsets from the first one
};

void note_segment(const sp_segment_view_t *s, void *arg) {
    auto *out = static_cast<std::string *>(arg);
    *out += "seg " + std::to_string(s->address) + " " + std::to_string(s->total_size) +
            (s->is_expandable ? " exp" : "") + (s->is_small ? " small" : "") + ":";
    for (size_t i = 0; i < s->nblocks; i++)
        *out += " " + std::to_string(s->blocks[i].size) + "/" + std::to_string(s->blocks[i].state);
    *out += "\n";
}

Outcome run(uint64_t seed, bool walk) {
    Outcome o;
    sp__release_by_walk = walk;
    sp_history_params_t hp;
    sp_history_params_init(&hp);
    hp.enabled = SP_HISTORY_ALL;
    EXPECT_EQ(sp_record_memory_history(&hp), SP_SUCCESS);
    std::mt19937_64 rng(seed);
    // Six streams made up front (a handle the host backend frees may be handed out again: none
    // is made after a destroy, so no block of a destroyed stream is ever another's).
    std::vector<sp_stream_t> streams(6);
    std::map<uintptr_t, int> stream_index{{0, 0}};
    for (auto &s : streams)
        EXPECT_EQ(sp_stream_create(0, &s), SP_SUCCESS);
    // The free sets order blocks by stream handle first, and what walks them across streams
    // (expandable segments' recycling) goes in that order: index i is the i-th handle in both
    // runs, whatever addresses the handles got.
    std::sort(streams.begin(), streams.end(),
              [](sp_stream_t a, sp_stream_t b) { return (uintptr_t)a < (uintptr_t)b; });
    for (size_t i = 0; i < streams.size(); i++)
        stream_index[(uintptr_t)streams[i]] = (int)i + 1;
    std::vector<bool> alive(streams.size(), true);
    struct Live {
        void *p;
        int stream; // -1: the default stream
    };
    std::vector<Live> live, orphans; // orphans: blocks of destroyed streams, freed at the end
    const size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20, 9 << 20, 12 << 20, 26 << 20};
    for (int i = 0; i < 3000; i++) {
        if (i % 600 == 599) {
            // Destroy a live stream: free about half of its blocks first, so that some of its
            // segments are whole and free and others still hold blocks.
            int k = (int)(rng() % streams.size());
            if (!alive[k])
                continue;
            for (size_t j = 0; j < live.size();) {
                if (live[j].stream == k && rng() % 2) {
                    EXPECT_EQ(sp_free(live[j].p), SP_SUCCESS);
                    live[j] = live.back();
                    live.pop_back();
                } else if (live[j].stream == k) {
                    orphans.push_back(live[j]);
                    live[j] = live.back();
                    live.pop_back();
                } else {
                    j++;
                }
            }
            EXPECT_EQ(sp_stream_destroy(streams[k]), SP_SUCCESS);
            alive[k] = false;
            std::string layout;
            EXPECT_EQ(sp__pool_walk(0, nullptr, note_segment, &layout), SP_SUCCESS);
            o.layouts.push_back(layout); // addresses made offsets below, once the origin is known
            sp_stats_t st;
            EXPECT_EQ(sp_memory_stats(0, &st), SP_SUCCESS);
            for (size_t s = 0; s < sp_stats_count(); s++)
                o.stats.push_back(sp_stats_value(&st, s));
            continue;
        }
        if (live.empty() || rng() % 100 < 55) {
            int k = (int)(rng() % (streams.size() + 1)) - 1;
            if (k >= 0 && !alive[k])
                k = -1;
            void *p = nullptr;
            size_t size = sizes[rng() % (sizeof sizes / sizeof sizes[0])] + rng() % 4 * 512;
            EXPECT_EQ(sp_malloc(size, 0, k < 0 ? nullptr : streams[k], &p), SP_SUCCESS);
            live.push_back({p, k});
        } else {
            size_t j = rng() % live.size();
            EXPECT_EQ(sp_free(live[j].p), SP_SUCCESS);
            live[j] = live.back();
            live.pop_back();
        }
    }
    sp__trace_entry_t *e = nullptr;
    size_t n = 0;
    EXPECT_EQ(sp__history_copy(0, &e, &n), SP_SUCCESS);
    const uintptr_t origin = sp::segment_origin(e, n);
    for (size_t i = 0; i < n; i++)
        o.trace.push_back(std::string(sp__history_action_name(e[i].action)) + " " +
                          std::to_string(e[i].addr - origin) + " " + std::to_string(e[i].size) +
                          " s" + std::to_string(stream_index[e[i].stream]));
    sp__history_entries_free(e, n);
    // The layouts again, with offsets from the same origin (the walk gave absolute addresses).
    for (auto &l : o.layouts)
        l = sp::rebase_layout(l, origin);
    for (auto &l : live)
        EXPECT_EQ(sp_free(l.p), SP_SUCCESS);
    for (auto &l : orphans)
        EXPECT_EQ(sp_free(l.p), SP_SUCCESS);
    EXPECT_EQ(sp_empty_cache(), SP_SUCCESS);
    for (size_t k = 0; k < streams.size(); k++) {
        if (!alive[k])
            continue;
        EXPECT_EQ(sp_stream_destroy(streams[k]), SP_SUCCESS);
    }
    sp__release_by_walk = false;
    return o;
}

void compare(const char *conf) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"}, {"SYMPOOL_ALLOC_CONF", conf}});
    ASSERT_EQ(sp_shutdown(), SP_SUCCESS); // both runs start with the settings above
    for (uint64_t seed = 1; seed <= 4; seed++) {
        Outcome walked = run(seed, true);
        ASSERT_EQ(sp_shutdown(), SP_SUCCESS);
        Outcome looked = run(seed, false);
        ASSERT_EQ(sp_shutdown(), SP_SUCCESS);
        ASSERT_FALSE(walked.layouts.empty());
        ASSERT_EQ(walked.layouts.size(), looked.layouts.size());
        for (size_t i = 0; i < walked.layouts.size(); i++)
            ASSERT_EQ(walked.layouts[i], looked.layouts[i])
                << conf << " seed " << seed << ", destroy " << i;
        for (size_t i = 0; i < walked.stats.size(); i++)
            ASSERT_EQ(walked.stats[i], looked.stats[i])
                << conf << " seed " << seed << ", " << sp_stats_key(i % sp_stats_count());
        ASSERT_EQ(walked.trace.size(), looked.trace.size()) << conf << " seed " << seed;
        for (size_t i = 0; i < walked.trace.size(); i++)
            ASSERT_EQ(walked.trace[i], looked.trace[i])
                << conf << " seed " << seed << ", entry " << i;
    }
}

} // namespace

class StreamRelease : public sp::Test {};

TEST_F(StreamRelease, TheLookupReleasesWhatTheWalkDidFixedSegments) {
    SP_SKIP_UNLESS_HOST(); // the arena's addresses make two runs' layouts comparable
    compare("");
}

TEST_F(StreamRelease, TheLookupReleasesWhatTheWalkDidExpandableSegments) {
    SP_SKIP_UNLESS_HOST();
    compare("expandable_segments:True");
}
