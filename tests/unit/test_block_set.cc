// test_block_set.cc: the free set (pool/block_set.h; on this branch the s26-bset prototype, a
// two-level B+-tree of copied keys) against a sorted reference: every lookup gives the
// reference's lower_bound and predecessor whether the last place answers or the search does,
// and after every change (in-place key changes included) the set's walk from `min` is the
// reference's order and its entries hold their blocks' keys (sp__bset_check, debug builds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

extern "C" {
#include "pool/block_set.h"
}

namespace {

struct Key {
    uintptr_t stream;
    size_t size;
    uint64_t seq;
    uintptr_t addr;
};

// Structs link by refs into the struct arena (pool/block.h), so the fixture's live there too:
// zeroed, never given back (a few hundred KB per test).
template <class T> struct ArenaArray {
    T *p;
    size_t n;
    explicit ArenaArray(size_t count)
        : p(static_cast<T *>(sp__arena_take(count * sizeof(T)))), n(count) {
        if (!p)
            std::abort();
    }
    T &operator[](size_t i) { return p[i]; }
    size_t size() const { return n; }
    T *begin() { return p; }
    T *end() { return p + n; }
};

struct Fixture {
    ArenaArray<sp_segment_t> segs;
    ArenaArray<sp_block_t> blocks;
    sp_block_set_t set{};

    // streams: how many streams the segments spread over (1: the set's one-stream walks).
    // base: the first block's address (addresses above 4 GiB exercise the high half of the
    // one-stream walks' (size, address) keys).
    Fixture(size_t n, bool by_seq, uint32_t seed, unsigned streams = 3, uintptr_t base = 0x100000)
        : segs(24), blocks(n) {
        set.by_seq = by_seq;
        std::mt19937 rng(seed);
        for (size_t i = 0; i < segs.size(); i++) {
            segs[i].seq = (i * 5) % segs.size(); // seq order differs from address order
            segs[i].stream = (sp_stream_t)(uintptr_t)(0x10 * (i % streams)); // its blocks' too
        }
        for (size_t i = 0; i < n; i++) {
            sp_block_t &b = blocks[i];
            b.addr = base + i * 512;
            b.size = 512 * (1 + rng() % 6); // few sizes: many equal keys up to the tie-break
            b.seg = sp__ptr_ref(&segs[rng() % segs.size()]);
        }
    }

    bool less(const sp_block_t *a, const sp_block_t *b) const {
        return sp__bset_cmp(set.by_seq, a, b) < 0;
    }

    // The reference: the blocks in the set, sorted.
    std::vector<sp_block_t *> sorted() {
        std::vector<sp_block_t *> v;
        for (auto &b : blocks)
            if (b.in_set)
                v.push_back(&b);
        std::sort(v.begin(), v.end(), [this](auto *a, auto *b) { return less(a, b); });
        return v;
    }

    void check() {
        std::vector<sp_block_t *> ref = sorted();
        ASSERT_EQ(set.count, ref.size());
        sp__bset_check(&set);
        ASSERT_EQ(set.min, ref.empty() ? nullptr : ref.front());
        size_t i = 0;
        for (sp_block_t *b = set.min; b; b = sp__bset_succ(&set, b), i++) {
            ASSERT_LT(i, ref.size());
            ASSERT_EQ(b, ref[i]);
            ASSERT_EQ(sp__bset_pred(&set, b), i ? ref[i - 1] : nullptr);
        }
        ASSERT_EQ(i, ref.size());
    }

    void lookup(uintptr_t stream, size_t size) {
        std::vector<sp_block_t *> ref = sorted();
        sp_block_t *want = nullptr, *want_pred = nullptr;
        for (sp_block_t *b : ref) {
            uintptr_t s = (uintptr_t)sp__block_stream(b);
            bool below = s < stream || (s == stream && b->size < size);
            if (below) {
                want_pred = b;
            } else {
                want = b;
                break;
            }
        }
        sp_block_t *pred = (sp_block_t *)1;
        sp_block_t *got = sp__bset_find_fit(&set, (sp_stream_t)stream, size, &pred);
        ASSERT_EQ(got, want) << "stream " << stream << " size " << size;
        ASSERT_EQ(pred, want_pred);
        ASSERT_EQ(sp__bset_lower_bound(&set, (sp_stream_t)stream, size), want);
    }
};

void churn(bool by_seq, uint32_t seed, unsigned streams = 3, uintptr_t base = 0x100000) {
    Fixture f(600, by_seq, seed, streams, base);
    std::mt19937 rng(seed * 7 + 1);
    for (int step = 0; step < 6000; step++) {
        unsigned op = rng() % 10;
        if (op < 4) {
            sp_block_t &b = f.blocks[rng() % f.blocks.size()];
            if (b.in_set)
                sp__bset_remove(&f.set, &b);
            else
                sp__bset_insert(&f.set, &b);
        } else if (op == 4 && f.set.count) {
            // The allocator's in-place key changes (a split remainder's smaller size, a merged
            // block's larger one): a block in the set gets another size, and sp__bset_move puts
            // it where it sorts now (whether or not it left its neighbours). Half the time the
            // block was told by its old key (sp__bset_rekey, the allocator's form), half the
            // time found by the set alone (sp__bset_move).
            sp_block_t *b = f.set.min;
            for (unsigned k = rng() % f.set.count; k > 0; k--)
                b = sp__bset_succ(&f.set, b);
            size_t old_size = b->size;
            b->size = 512 * (1 + rng() % 8);
            if (rng() % 2)
                sp__bset_rekey(&f.set, b, old_size, b->addr);
            else
                sp__bset_move(&f.set, b);
        } else if (op < 6 && f.set.count) {
            // The allocator's pattern: take the best fit, give it back (the last place's cases).
            sp_block_t *pred = nullptr;
            sp_block_t *h = sp__bset_find_fit(&f.set, (sp_stream_t)(uintptr_t)(0x10 * (rng() % 3)),
                                              512 * (rng() % 8), &pred);
            if (!h)
                continue;
            sp__bset_remove(&f.set, h);
            ASSERT_NO_FATAL_FAILURE(f.check());
            sp__bset_insert(&f.set, h);
        } else {
            ASSERT_NO_FATAL_FAILURE(f.lookup(0x10 * (rng() % 4), 512 * (rng() % 8)));
        }
        ASSERT_NO_FATAL_FAILURE(f.check()) << "step " << step;
    }
    // Empty it in an order of its own: every removal keeps the tree valid.
    for (auto &b : f.blocks) {
        if (b.in_set) {
            sp__bset_remove(&f.set, &b);
            ASSERT_NO_FATAL_FAILURE(f.check());
        }
    }
    EXPECT_EQ(f.set.count, 0u);
    EXPECT_EQ(f.set.min, nullptr);
    for (auto &b : f.blocks)
        EXPECT_EQ(b.bal, 0); // a block out of the set never keeps a balance (-1 is a mark)
}

// Seeds of each churn: three in the plain build, one under a sanitizer, where the reference
// check after every step made these three tests 49 s of the ASan+UBSan suite (a third of it
// still walks every insert, removal, move and lookup form under the sanitizer).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr uint32_t kSeeds = 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr uint32_t kSeeds = 1;
#else
constexpr uint32_t kSeeds = 3;
#endif
#else
constexpr uint32_t kSeeds = 3;
#endif

} // namespace

TEST(BlockSet, LookupsAndChangesMatchASortedReference) {
    for (uint32_t seed = 1; seed <= kSeeds; seed++)
        ASSERT_NO_FATAL_FAILURE(churn(false, seed));
}

TEST(BlockSet, SymmetricOrderMatchesASortedReference) {
    for (uint32_t seed = 1; seed <= kSeeds; seed++)
        ASSERT_NO_FATAL_FAILURE(churn(true, seed));
}

// Every block on one stream: inserts, removals and lookups take the walks that compare sizes
// and addresses alone; the order must be the same.
TEST(BlockSet, OneStreamWalksMatchASortedReference) {
    for (uint32_t seed = 1; seed <= kSeeds; seed++) {
        ASSERT_NO_FATAL_FAILURE(churn(false, seed, 1));
        ASSERT_NO_FATAL_FAILURE(churn(true, seed, 1));
        // Device-like addresses: the walks' keys carry the address's high bits too.
        ASSERT_NO_FATAL_FAILURE(churn(false, seed, 1, (uintptr_t)0x7f3a00000000ull));
    }
}
