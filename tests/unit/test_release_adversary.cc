// test_release_adversary.cc: seeded random runs over many streams, private MemPools (one lending
// on OOM), recorded streams, stream destroys and per-stream releases on a small emulated device,
// checked after every step against invariants any state must keep: every live block found by its
// pointer (start and interior) with its size, stream and pool; the walk's allocated blocks are
// exactly the live ones; reserved bytes are the sum of the segments' sizes; the statistics agree
// with the walk. The same runs with the old walk of every segment (sp__release_by_walk) must end
// in the same layouts, statistics and history.
#include "alloc_test_util.hpp"
#include "history_test_util.hpp"

#include <sys/mman.h>

#include <sympool/experimental.h>

#include <algorithm>
#include <cstring>
#include <iterator>
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

struct Live {
    void *p;
    size_t size;
    int stream; // -1: the default stream
    int pool;   // 0: default, 1..: private pools
};

bool found_at(const void *p, const void *base) {
    sp_block_info_t info;
    return sp__pool_lookup(p, &info) == SP_SUCCESS && info.block_base == base;
}

struct Walked {
    size_t reserved = 0, allocated = 0, nalloc = 0, segments = 0;
    std::map<uintptr_t, size_t> allocated_blocks; // address -> size
    std::string layout;
    uintptr_t origin = 0;
    uint64_t pool_base = 0; // the first private pool's id less 1 (ids are process-wide)
};

void visit(const sp_segment_view_t *s, void *arg) {
    auto *w = static_cast<Walked *>(arg);
    w->segments++;
    w->reserved += s->total_size;
    size_t sum = 0;
    w->layout += "seg " + std::to_string(s->address - w->origin) + " " +
                 std::to_string(s->total_size) + (s->is_expandable ? " exp" : "") +
                 (s->is_small ? " small" : "") + " p" +
                 std::to_string(s->pool_id.second ? s->pool_id.second - w->pool_base : 0) + ":";
    for (size_t i = 0; i < s->nblocks; i++) {
        const sp_block_view_t &b = s->blocks[i];
        sum += b.size;
        if (i + 1 < s->nblocks) {
            EXPECT_EQ(b.address + b.size, s->blocks[i + 1].address) << "blocks do not tile";
        }
        if (b.state == SP_BLOCK_ACTIVE_ALLOCATED) {
            w->allocated += b.size;
            w->nalloc++;
            w->allocated_blocks[b.address] = b.size;
        }
        w->layout += " " + std::to_string(b.size) + "/" + std::to_string(b.state);
    }
    EXPECT_EQ(sum, s->total_size);
    w->layout += "\n";
}

struct Config {
    const char *conf;
    const char *capacity;
    const char *var = "SYMPOOL_DEBUG_SUBSYS"; // one more option, or a harmless one
    const char *value = "";
    bool history = true; // off: a thread cache keeps blocks only while history is off
};

struct Outcome {
    std::vector<std::string> layouts;
    std::vector<int64_t> stats;
    std::vector<std::string> trace;
    int ooms = 0;
};

class RandomRun {
  public:
    RandomRun(uint64_t seed, bool walk, bool new_streams, bool history = true)
        : rng_(seed), new_streams_(new_streams), history_(history) {
        sp__release_by_walk = walk;
    }
    ~RandomRun() { sp__release_by_walk = false; }

    Outcome go(int steps);

  private:
    void check(const char *what, int step);
    int pick_stream(bool allow_default = true) {
        int k = (int)(rng_() % (streams_.size() + 1)) - 1;
        if (k >= 0 && !alive_[k])
            k = -1;
        if (!allow_default && k < 0) {
            for (size_t i = 0; i < alive_.size(); i++)
                if (alive_[i])
                    return (int)i;
        }
        return k;
    }
    sp_stream_t handle(int k) { return k < 0 ? nullptr : streams_[k]; }
    void record(Outcome &o) {
        Walked w;
        w.pool_base = sp_mempool_id(pools_[1]).second - 1;
        EXPECT_EQ(sp__pool_walk(0, nullptr, visit, &w), SP_SUCCESS);
        o.layouts.push_back(w.layout);
        sp_stats_t st;
        EXPECT_EQ(sp_memory_stats(0, &st), SP_SUCCESS);
        for (size_t s = 0; s < sp_stats_count(); s++)
            o.stats.push_back(sp_stats_value(&st, s));
    }

    std::mt19937_64 rng_;
    bool new_streams_;
    bool history_;
    std::vector<sp_stream_t> streams_;
    std::vector<bool> alive_;
    std::vector<sp_mempool_t *> pools_; // [0] default
    std::vector<Live> live_;
};

void RandomRun::check(const char *what, int step) {
    Walked w;
    ASSERT_EQ(sp__pool_walk(0, nullptr, visit, &w), SP_SUCCESS);
    ASSERT_EQ(w.reserved, sp_memory_reserved(0)) << what << " step " << step;
    ASSERT_EQ((int64_t)w.reserved, stat("reserved_bytes.all.current")) << what << " " << step;
    ASSERT_EQ(w.allocated, sp_memory_allocated(0)) << what << " step " << step;
    ASSERT_EQ(w.nalloc, live_.size()) << what << " step " << step;
    ASSERT_EQ((int64_t)w.nalloc, stat("allocation.all.current")) << what << " step " << step;
    for (const Live &l : live_) {
        auto it = w.allocated_blocks.find((uintptr_t)l.p);
        ASSERT_NE(it, w.allocated_blocks.end()) << what << " step " << step << ": " << l.p;
        sp_block_info_t info;
        ASSERT_SP_OK(sp__pool_lookup(l.p, &info));
        ASSERT_EQ(info.block_base, l.p);
        ASSERT_EQ(info.block_size, it->second);
        ASSERT_EQ(info.requested_size, l.size);
        ASSERT_EQ(info.stream, handle(l.stream));
        ASSERT_EQ(info.pool, pools_[l.pool]);
        ASSERT_SP_OK(sp__pool_lookup((char *)l.p + l.size - 1, &info));
        ASSERT_EQ(info.block_base, l.p) << what << " step " << step << ": interior of " << l.p;
    }
    size_t total = 0;
    for (size_t i = 0; i < pools_.size(); i++)
        total += sp_mempool_total_bytes(pools_[i]);
    ASSERT_EQ(total, w.reserved) << what << " step " << step;
}

Outcome RandomRun::go(int steps) {
    Outcome o;
    sp_history_params_t hp;
    sp_history_params_init(&hp);
    hp.enabled = history_ ? SP_HISTORY_ALL : SP_HISTORY_OFF;
    EXPECT_EQ(sp_record_memory_history(&hp), SP_SUCCESS);
    streams_.resize(8);
    alive_.assign(streams_.size(), true);
    for (auto &s : streams_)
        EXPECT_EQ(sp_stream_create(0, &s), SP_SUCCESS);
    std::sort(streams_.begin(), streams_.end(),
              [](sp_stream_t a, sp_stream_t b) { return (uintptr_t)a < (uintptr_t)b; });
    pools_.push_back(sp_default_mempool(0));
    for (int i = 0; i < 2; i++) {
        sp_mempool_params_t params;
        sp_mempool_params_init(&params);
        params.use_on_oom = i == 1;
        sp_mempool_t *p = nullptr;
        EXPECT_EQ(sp_mempool_create(&params, &p), SP_SUCCESS);
        pools_.push_back(p);
    }
    const size_t sizes[] = {512,     4096,     65536,    1 << 20,  (1 << 20) + 4096,
                            3 << 20, 11 << 20, 12 << 20, 26 << 20, 64 << 20};
    for (int step = 0; step < steps; step++) {
        unsigned op = (unsigned)(rng_() % 100);
        const char *what = "";
        if (op < 45 || live_.empty()) {
            what = "malloc";
            int k = pick_stream();
            int pool = (int)(rng_() % 4);
            pool = pool == 3 ? 0 : pool;
            size_t size = sizes[rng_() % (sizeof sizes / sizeof sizes[0])] + rng_() % 4 * 512;
            void *p = nullptr;
            sp_status_t s = pool == 0 ? sp_malloc(size, 0, handle(k), &p)
                                      : sp_mempool_malloc(pools_[pool], size, handle(k), &p);
            if (s == SP_ERR_OUT_OF_MEMORY) {
                o.ooms++;
            } else {
                EXPECT_EQ(s, SP_SUCCESS) << describe(s);
                if (s == SP_SUCCESS) {
                    sp_block_info_t info;
                    EXPECT_SP_OK(sp__pool_lookup(p, &info));
                    // A use_on_oom loan is its lending pool's block.
                    int owner = 0;
                    for (size_t i = 0; i < pools_.size(); i++)
                        if (pools_[i] == info.pool)
                            owner = (int)i;
                    live_.push_back({p, size, k, owner});
                }
            }
        } else if (op < 80) {
            what = "free";
            size_t j = rng_() % live_.size();
            EXPECT_EQ(sp_free(live_[j].p), SP_SUCCESS);
            live_[j] = live_.back();
            live_.pop_back();
        } else if (op < 88) {
            what = "record_stream";
            size_t j = rng_() % live_.size();
            int k = pick_stream();
            EXPECT_EQ(sp_record_stream(live_[j].p, handle(k)), SP_SUCCESS);
        } else if (op < 91) {
            what = "synchronize";
            EXPECT_EQ(sp_stream_synchronize(handle(pick_stream())), SP_SUCCESS);
        } else if (op < 95) {
            what = "free_all_blocks";
            int pool = (int)(rng_() % pools_.size());
            int k = pick_stream(rng_() % 4 == 0);
            EXPECT_EQ(sp_mempool_free_all_blocks(pools_[pool], handle(k)), SP_SUCCESS);
            record(o);
        } else if (op < 98) {
            what = "stream_destroy";
            int k = (int)(rng_() % streams_.size());
            if (!alive_[k])
                continue;
            EXPECT_EQ(sp_stream_destroy(streams_[k]), SP_SUCCESS);
            alive_[k] = false;
            // Live blocks of the destroyed stream stay; they are freed as any other.
            record(o);
            if (new_streams_) {
                EXPECT_EQ(sp_stream_create(0, &streams_[k]), SP_SUCCESS);
                alive_[k] = true;
                for (auto &l : live_)
                    if (l.stream == k)
                        l.stream = -2 - k; // a destroyed stream's block: the old handle
            }
        } else {
            what = "empty_cache";
            EXPECT_EQ(sp_empty_cache(), SP_SUCCESS);
            record(o);
        }
        if (!new_streams_)
            check(what, step);
        if (::testing::Test::HasFatalFailure())
            break;
    }
    // Addresses as offsets from the lowest segment the run made (the arena's base may differ
    // between runs); the layouts were written with absolute addresses: rewrite them.
    sp__trace_entry_t *e = nullptr;
    size_t n = 0;
    EXPECT_EQ(sp__history_copy(0, &e, &n), SP_SUCCESS);
    const uintptr_t origin = sp::segment_origin(e, n);
    for (size_t i = 0; i < n; i++) {
        // An oom entry's address is the device's free bytes, as PyTorch's.
        uintptr_t at = e[i].action == SP_TRACE_OOM ? e[i].addr : e[i].addr - origin;
        o.trace.push_back(std::string(sp__history_action_name(e[i].action)) + " " +
                          std::to_string(at) + " " + std::to_string(e[i].size));
    }
    sp__history_entries_free(e, n);
    for (auto &l : o.layouts)
        l = sp::rebase_layout(l, origin);
    for (auto &l : live_)
        EXPECT_EQ(sp_free(l.p), SP_SUCCESS);
    live_.clear();
    EXPECT_EQ(sp_empty_cache(), SP_SUCCESS);
    for (size_t i = 1; i < pools_.size(); i++)
        EXPECT_EQ(sp_mempool_destroy(pools_[i]), SP_SUCCESS);
    for (size_t k = 0; k < streams_.size(); k++)
        if (alive_[k]) {
            EXPECT_EQ(sp_stream_destroy(streams_[k]), SP_SUCCESS);
        }
    return o;
}

// Expandable segments reserve 1.125 x the device each: past the arena's room the host backend
// reserves with mmap, whose addresses differ between runs (under ASan by more than an offset).
// Their runs are compared without addresses: each layout as a sorted set of segment lines, the
// history as actions and sizes. So are runs without history, which give no origin to take the
// addresses from (the arena's base differs between runs).
void strip_addresses(Outcome &o) {
    for (auto &l : o.layouts) {
        std::vector<std::string> lines;
        size_t at = 0;
        while (at < l.size()) {
            size_t nl = l.find('\n', at);
            std::string line = l.substr(at, nl - at);
            size_t sp1 = line.find(' '), sp2 = line.find(' ', sp1 + 1);
            lines.push_back(line.substr(sp2));
            at = nl + 1;
        }
        std::sort(lines.begin(), lines.end());
        l.clear();
        for (auto &line : lines)
            l += line + "\n";
    }
    for (auto &t : o.trace) {
        size_t sp1 = t.find(' '), sp2 = t.find(' ', sp1 + 1);
        t = t.substr(0, sp1) + t.substr(sp2);
    }
}

void compare(const Config &c, int seeds, int steps) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_ARENA", "1"},
                       {"SYMPOOL_ALLOC_CONF", c.conf},
                       {"SYMPOOL_HOST_CAPACITY", c.capacity},
                       {c.var, c.value}});
    ASSERT_EQ(sp_shutdown(), SP_SUCCESS);
    for (int seed = 1; seed <= seeds; seed++) {
        Outcome walked, looked;
        {
            RandomRun r((uint64_t)seed, true, false, c.history);
            walked = r.go(steps);
        }
        ASSERT_FALSE(::testing::Test::HasFatalFailure()) << c.conf << " seed " << seed;
        ASSERT_EQ(sp_shutdown(), SP_SUCCESS);
        {
            RandomRun r((uint64_t)seed, false, false, c.history);
            looked = r.go(steps);
        }
        ASSERT_FALSE(::testing::Test::HasFatalFailure()) << c.conf << " seed " << seed;
        ASSERT_EQ(sp_shutdown(), SP_SUCCESS);
        ASSERT_EQ(walked.layouts.size(), looked.layouts.size());
        if (strstr(c.conf, "expandable") || !c.history) { // without history: no origin

            strip_addresses(walked);
            strip_addresses(looked);
        }
        EXPECT_GT(walked.ooms, 0) << c.conf << " seed " << seed << ": the device never filled";
        for (size_t i = 0; i < walked.layouts.size(); i++) {
            ASSERT_EQ(walked.layouts[i], looked.layouts[i])
                << c.conf << " seed " << seed << ", release " << i;
        }
        for (size_t i = 0; i < walked.stats.size(); i++) {
            ASSERT_EQ(walked.stats[i], looked.stats[i])
                << c.conf << " seed " << seed << ", " << sp_stats_key(i % sp_stats_count());
        }
        ASSERT_EQ(walked.trace.size(), looked.trace.size()) << c.conf << " seed " << seed;
        for (size_t i = 0; i < walked.trace.size(); i++) {
            ASSERT_EQ(walked.trace[i], looked.trace[i])
                << c.conf << " seed " << seed << ", entry " << i;
        }
    }
}

} // namespace

class ReleaseAdversary : public sp::Test {};

TEST_F(ReleaseAdversary, FixedSegmentsKeepEveryInvariantAndMatchTheWalk) {
    SP_SKIP_UNLESS_HOST();
    expect_warnings(); // OOMs on the small device
    compare({"", "512MiB"}, 3, 1000);
}

TEST_F(ReleaseAdversary, ExpandableSegmentsKeepEveryInvariantAndMatchTheWalk) {
    SP_SKIP_UNLESS_HOST();
    expect_warnings();
    compare({"expandable_segments:True", "512MiB"}, 3, 1000);
}

TEST_F(ReleaseAdversary, OversizeBlocksKeepEveryInvariantAndMatchTheWalk) {
    SP_SKIP_UNLESS_HOST();
    expect_warnings();
    compare({"max_split_size_mb:20", "512MiB"}, 2, 1000);
}

TEST_F(ReleaseAdversary, PyTorchPagesKeepEveryInvariantAndMatchTheWalk) {
    SP_SKIP_UNLESS_HOST();
    expect_warnings();
    compare({"expandable_segments:True", "512MiB", "SYMPOOL_EXPANDABLE_PAGE", "0"}, 2, 1000);
    compare({"expandable_segments:True", "512MiB", "SYMPOOL_EXPANDABLE_RECYCLE", "0"}, 2, 1000);
    compare({"expandable_segments:True", "512MiB", "SYMPOOL_EXPANDABLE_BORROW", "0"}, 2, 1000);
}

TEST_F(ReleaseAdversary, ThreadCacheKeepsEveryInvariantAndMatchesTheWalk) {
    SP_SKIP_UNLESS_HOST();
    expect_warnings();
    compare({"", "512MiB", "SYMPOOL_THREAD_CACHE", "8MiB", false}, 2, 1000);
    compare({"expandable_segments:True", "512MiB", "SYMPOOL_THREAD_CACHE", "8MiB", false}, 2, 1000);
}

TEST_F(ReleaseAdversary, StreamsMadeAgainAfterDestroys) {
    SP_SKIP_UNLESS_HOST();
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "512MiB"}});
    for (int seed = 1; seed <= 4; seed++) {
        RandomRun r((uint64_t)seed, false, true);
        (void)r.go(1500);
        ASSERT_FALSE(::testing::Test::HasFatalFailure());
        ASSERT_EQ(sp_shutdown(), SP_SUCCESS);
    }
}

// ---- the segment index against a model --------------------------------------------------------

namespace {

// A pluggable segment allocator that places segments where it likes inside a reserved range:
// often over the places of segments given back (an insert over tombstones, several at once),
// below and above the live ones (not only at the index's end), and records what it holds.
struct Placer {
    char *base = nullptr;
    size_t span = 0;
    std::mt19937_64 *rng = nullptr;
    std::map<size_t, size_t> held;  // offset -> size, segments handed out and not given back
    std::vector<size_t> given_back; // offsets of segments given back
    bool fits(size_t off, size_t size) const {
        if (off + size > span)
            return false;
        auto it = held.lower_bound(off);
        if (it != held.end() && it->first < off + size)
            return false;
        if (it != held.begin() && std::prev(it)->first + std::prev(it)->second > off)
            return false;
        return true;
    }
    static void *alloc(size_t size, int, sp_stream_t, void *ctx) {
        auto *p = static_cast<Placer *>(ctx);
        const size_t page = 2 << 20;
        for (int tries = 0; tries < 64; tries++) {
            size_t off;
            unsigned how = (unsigned)((*p->rng)() % 4);
            if (how < 2 && !p->given_back.empty()) // over a place given back, or just before it
                off = p->given_back[(*p->rng)() % p->given_back.size()] -
                      (how == 1 ? std::min<size_t>(p->given_back[0], page * ((*p->rng)() % 8)) : 0);
            else
                off = page * ((*p->rng)() % (p->span / page));
            off = off / page * page;
            if (p->fits(off, size)) {
                p->held[off] = size;
                return p->base + off;
            }
        }
        return nullptr; // out of memory, as the pool sees it
    }
    static void free(void *ptr, size_t size, int, sp_stream_t, void *ctx) {
        auto *p = static_cast<Placer *>(ctx);
        size_t off = (size_t)((char *)ptr - p->base);
        auto it = p->held.find(off);
        EXPECT_NE(it, p->held.end());
        if (it == p->held.end())
            return;
        EXPECT_EQ(it->second, size);
        p->held.erase(it);
        p->given_back.push_back(off);
        if (p->given_back.size() > 256)
            p->given_back.erase(p->given_back.begin());
    }
};

} // namespace

TEST_F(ReleaseAdversary, TheSegmentIndexAnswersAsAModelThroughTombstonesAndSweeps) {
    SP_SKIP_UNLESS_HOST(); // the placer's segments are host addresses
    expect_warnings();     // the placer's OOMs
    const size_t span = (size_t)64 << 30;
    void *region =
        mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(region, MAP_FAILED);
    for (uint64_t seed = 1; seed <= 3; seed++) {
        std::mt19937_64 rng(seed);
        Placer pl;
        pl.base = static_cast<char *>(region);
        pl.span = span;
        pl.rng = &rng;
        sp_allocator_t a = {Placer::alloc, Placer::free, &pl};
        sp_mempool_params_t params;
        sp_mempool_params_init(&params);
        params.allocator = &a;
        std::vector<sp_mempool_t *> pools(2);
        for (auto &p : pools)
            ASSERT_SP_OK(sp_mempool_create(&params, &p));
        std::vector<sp_stream_t> streams(3);
        for (auto &s : streams)
            ASSERT_SP_OK(sp_stream_create(0, &s));
        struct Blk {
            void *p;
            size_t size;
            int pool;
        };
        std::vector<Blk> live;
        const size_t sizes[] = {512, 100 << 10, (1 << 20) + 512, 10 << 20, 22 << 20, 40 << 20};
        for (int step = 0; step < 6000; step++) {
            unsigned op = (unsigned)(rng() % 100);
            if (op < 50 || live.empty()) {
                int k = (int)(rng() % pools.size());
                size_t size = sizes[rng() % (sizeof sizes / sizeof sizes[0])];
                int s = (int)(rng() % 4) - 1;
                void *p = nullptr;
                sp_status_t st =
                    sp_mempool_malloc(pools[k], size, s < 0 ? nullptr : streams[s], &p);
                if (st == SP_SUCCESS)
                    live.push_back({p, size, k});
                else
                    ASSERT_EQ(st, SP_ERR_OUT_OF_MEMORY) << describe(st);
            } else if (op < 90) {
                size_t j = rng() % live.size();
                ASSERT_SP_OK(sp_free(live[j].p));
                live[j] = live.back();
                live.pop_back();
            } else if (op < 97) {
                int s = (int)(rng() % 4) - 1;
                ASSERT_SP_OK(sp_mempool_free_all_blocks(pools[rng() % pools.size()],
                                                        s < 0 ? nullptr : streams[s]));
            } else {
                // A pool destroyed with its blocks live: its segments go back as they empty
                // (sp_empty_cache), a new pool takes its place.
                int k = (int)(rng() % pools.size());
                ASSERT_SP_OK(sp_mempool_destroy(pools[k]));
                ASSERT_SP_OK(sp_mempool_create(&params, &pools[k]));
                for (auto &b : live)
                    if (b.pool == k)
                        b.pool = -1;
                ASSERT_SP_OK(sp_empty_cache());
            }
            if (step % 20 != 0)
                continue;
            // Every live block at its start, middle and end; then addresses anywhere in the
            // range, each answered as the live blocks say.
            std::map<uintptr_t, std::pair<size_t, void *>> blocks; // start -> (size, ptr)
            for (auto &b : live) {
                sp_block_info_t info;
                ASSERT_SP_OK(sp__pool_lookup(b.p, &info));
                ASSERT_EQ(info.block_base, b.p);
                ASSERT_EQ(info.requested_size, b.size);
                ASSERT_TRUE(found_at((char *)b.p + b.size / 2, b.p)) << "step " << step;
                ASSERT_TRUE(found_at((char *)b.p + info.block_size - 1, b.p)) << "step " << step;
                blocks[(uintptr_t)b.p] = {info.block_size, b.p};
            }
            size_t held = 0;
            for (auto &h : pl.held)
                held += h.second;
            ASSERT_EQ(held, sp_memory_reserved(0)) << "step " << step;
            for (int i = 0; i < 200; i++) {
                uintptr_t at;
                if (i % 2 && !pl.given_back.empty()) // inside a place given back
                    at = (uintptr_t)pl.base + pl.given_back[rng() % pl.given_back.size()] +
                         rng() % (2 << 20);
                else if (i % 4 == 0 && !pl.held.empty()) { // inside a held segment
                    auto it = pl.held.begin();
                    std::advance(it, (long)(rng() % pl.held.size()));
                    at = (uintptr_t)pl.base + it->first + rng() % it->second;
                } else
                    at = (uintptr_t)pl.base + rng() % span;
                void *want = nullptr;
                auto it = blocks.upper_bound(at);
                if (it != blocks.begin() && at < std::prev(it)->first + std::prev(it)->second.first)
                    want = std::prev(it)->second.second;
                sp_block_info_t info;
                sp_status_t st = sp__pool_lookup((void *)at, &info);
                if (want) {
                    ASSERT_EQ(st, SP_SUCCESS) << "step " << step << " at " << at;
                    ASSERT_EQ(info.block_base, want) << "step " << step;
                } else {
                    ASSERT_EQ(st, SP_ERR_INVALID_USAGE) << "step " << step << " at " << at;
                }
            }
        }
        // The run gave back enough segments for the index's sweeps (64 tombstones at least).
        EXPECT_GE(pl.given_back.size(), 64u);
        for (auto &b : live)
            ASSERT_SP_OK(sp_free(b.p));
        for (auto p : pools)
            ASSERT_SP_OK(sp_mempool_destroy(p));
        ASSERT_SP_OK(sp_empty_cache());
        EXPECT_TRUE(pl.held.empty());
        for (auto s : streams)
            ASSERT_SP_OK(sp_stream_destroy(s));
        ASSERT_SP_OK(sp_shutdown());
    }
    munmap(region, span);
}

// A block recorded on a stream that is destroyed before the block is freed: the destroy finished
// the stream's work, so the free has nothing to wait for on it. It must not hand the destroyed
// handle to the backend (a stale cudaStream_t is undefined behaviour; the host backend warns twice
// and, once a new stream got the same handle, the free waited on that unrelated stream).
TEST_F(ReleaseAdversary, AFreeAfterItsRecordedStreamWasDestroyedWaitsForNothing) {
    SP_SKIP_ON_GPU("the host backend's stream model: events complete when their stream syncs");
    sp_stream_t s = nullptr, other = nullptr;
    void *p = nullptr, *q = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    ASSERT_SP_OK(sp_stream_create(0, &other));
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    ASSERT_SP_OK(sp_malloc(8192, 0, nullptr, &q));
    ASSERT_SP_OK(sp_record_stream(p, s));
    ASSERT_SP_OK(sp_record_stream(p, other)); // a live stream's use stays
    ASSERT_SP_OK(sp_record_stream(q, s));
    ASSERT_SP_OK(sp_stream_destroy(s));
    // Streams made now may get the destroyed one's handle (the host backend's are malloc'd).
    std::vector<sp_stream_t> later(4);
    for (auto &l : later)
        ASSERT_SP_OK(sp_stream_create(0, &l));
    ASSERT_SP_OK(sp_free(q));
    EXPECT_STREQ(sp_last_error(), "");
    EXPECT_EQ(stat("active_bytes.all.current"), 4096) << "q's free waits for nothing";
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("active_bytes.all.current"), 4096) << "p waits for `other`";
    ASSERT_SP_OK(sp_stream_synchronize(other));
    void *r = nullptr;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &r)); // completes the pending free
    ASSERT_SP_OK(sp_free(r));
    EXPECT_EQ(stat("active_bytes.all.current"), 0);
    EXPECT_EQ(warnings(), 0u);
    for (auto l : later)
        ASSERT_SP_OK(sp_stream_destroy(l));
    ASSERT_SP_OK(sp_stream_destroy(other));
}

// sp_mempool_free_all_blocks of the default pool releases every cached segment of the stream (or
// of all streams), as sp_empty_cache and sp_stream_destroy do: blocks idle in thread caches are
// cached blocks to the caller, so they go back first (they kept their segments reserved).
TEST_F(ReleaseAdversary, FreeAllBlocksOfTheDefaultPoolTakesBackThreadCachedBlocks) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "1MiB"}});
    sp_stream_t s = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    for (sp_stream_t which : {s, (sp_stream_t) nullptr}) {
        void *p = nullptr;
        ASSERT_SP_OK(sp_malloc(4096, 0, s, &p));
        ASSERT_SP_OK(sp_free(p)); // idle in this thread's cache
        size_t bytes = 0, blocks = 0;
        ASSERT_SP_OK(sp_x_thread_cache_idle(0, &bytes, &blocks));
        ASSERT_EQ(blocks, 1u);
        ASSERT_EQ(sp_memory_reserved(0), 2 * MiB);
        ASSERT_SP_OK(sp_mempool_free_all_blocks(sp_default_mempool(0), which));
        EXPECT_EQ(sp_memory_reserved(0), 0u) << (which ? "stream s" : "every stream");
        ASSERT_SP_OK(sp_x_thread_cache_idle(0, &bytes, &blocks));
        EXPECT_EQ(blocks, 0u);
    }
    ASSERT_SP_OK(sp_stream_destroy(s));
}
