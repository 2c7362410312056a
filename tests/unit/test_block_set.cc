// test_block_set.cc: the free set (pool/block_set.h) against a sorted reference: every lookup
// gives the reference's lower_bound and predecessor whether the hint answers or the root walk
// does, and after every change the tree is a balanced search tree with right parent links whose
// first block is `min`, its in-order walk the reference's order.
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

    int check_tree(const sp_block_t *n, const sp_block_t *parent) {
        if (!n)
            return 0;
        EXPECT_EQ(sp__blk0(n->parent), parent);
        EXPECT_TRUE(n->in_set);
        int hl = check_tree(sp__blk0(n->left), n), hr = check_tree(sp__blk0(n->right), n);
        EXPECT_LE(std::abs(hl - hr), 1);
        EXPECT_EQ(n->bal, hr - hl); // the balance kept in the node
        return std::max(hl, hr) + 1;
    }

    void check() {
        std::vector<sp_block_t *> ref = sorted();
        ASSERT_EQ(set.count, ref.size());
        size_t lead = 0; // blocks with the first block's stream: set.lead, where it is known
        for (sp_block_t *b : ref)
            lead += sp__block_stream(b) == sp__block_stream(ref.front());
        if (set.lead != 0) {
            ASSERT_EQ(set.lead, lead);
        }
        check_tree(set.root, nullptr);
        ASSERT_EQ(set.min, ref.empty() ? nullptr : ref.front());
        size_t i = 0;
        for (sp_block_t *b = set.min; b; b = sp__bset_succ(&set, b), i++) {
            ASSERT_LT(i, ref.size());
            ASSERT_EQ(b, ref[i]);
            ASSERT_EQ(sp__bset_pred(&set, b), i ? ref[i - 1] : nullptr);
        }
        ASSERT_EQ(i, ref.size());
        if (set.hint) {
            ASSERT_TRUE(set.hint->in_set);
        }
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
            // block is the hint, as the split remainder of a lookup's answer is.
            sp_block_t *b = f.set.min;
            for (unsigned k = rng() % f.set.count; k > 0; k--)
                b = sp__bset_succ(&f.set, b);
            if (f.set.hint && rng() % 2)
                b = f.set.hint;
            b->size = 512 * (1 + rng() % 8);
            sp__bset_move(&f.set, b);
            ASSERT_EQ(f.set.hint, b);
        } else if (op < 6 && f.set.hint) {
            // The allocator's pattern: take the best fit, give it back (the hint's cases).
            sp_block_t *h = f.set.hint;
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
    EXPECT_EQ(f.set.root, nullptr);
    EXPECT_EQ(f.set.min, nullptr);
    EXPECT_EQ(f.set.lead, 0u);
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
// and addresses alone (block_set.h's sp__bset_one_stream); the order must be the same.
TEST(BlockSet, OneStreamWalksMatchASortedReference) {
    for (uint32_t seed = 1; seed <= kSeeds; seed++) {
        ASSERT_NO_FATAL_FAILURE(churn(false, seed, 1));
        ASSERT_NO_FATAL_FAILURE(churn(true, seed, 1));
        // Device-like addresses: the walks' keys carry the address's high bits too.
        ASSERT_NO_FATAL_FAILURE(churn(false, seed, 1, (uintptr_t)0x7f3a00000000ull));
    }
}

// A set that holds one stream's blocks, then a second stream's, then the first's alone again:
// the walks step off the one-stream form while another stream is in the set and back on once
// it has left; a stream below every other one leads from its first block; the last block of the
// leading stream leaving others behind leaves the count unknown (0). Every lookup and insert
// keeps the reference's order throughout.
TEST(BlockSet, OneStreamFormFollowsTheStreamsInTheSet) {
    Fixture f(400, false, 9, 2); // even segments stream 0, odd ones stream 0x10
    auto low = [&](sp_block_t &b) { return (uintptr_t)sp__block_stream(&b) == 0; };
    uint32_t nlow = 0;
    for (auto &b : f.blocks)
        if (low(b)) {
            sp__bset_insert(&f.set, &b);
            nlow++;
        }
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.lead, nlow);
    EXPECT_TRUE(sp__bset_one_stream(&f.set, 0));
    EXPECT_FALSE(sp__bset_one_stream(&f.set, 0x10));
    for (auto &b : f.blocks)
        if (!low(b)) {
            sp__bset_insert(&f.set, &b);
            ASSERT_NO_FATAL_FAILURE(f.lookup(0, 512 * (b.addr % 7)));
            ASSERT_NO_FATAL_FAILURE(f.lookup(0x10, 512 * (b.addr % 5)));
        }
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.lead, nlow);
    EXPECT_FALSE(sp__bset_one_stream(&f.set, 0));
    for (auto &b : f.blocks)
        if (!low(b))
            sp__bset_remove(&f.set, &b);
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_TRUE(sp__bset_one_stream(&f.set, 0));
    for (size_t i = 0; i < 8; i++)
        ASSERT_NO_FATAL_FAILURE(f.lookup(0, 512 * i));
    // Now the other way round: the leading stream's blocks leave while 0x10's stay, and the
    // count is not known (one-stream walks stay off) until the set is empty again.
    for (auto &b : f.blocks)
        if (!low(b))
            sp__bset_insert(&f.set, &b);
    for (auto &b : f.blocks)
        if (low(b))
            sp__bset_remove(&f.set, &b);
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.lead, 0u);
    EXPECT_FALSE(sp__bset_one_stream(&f.set, 0x10));
    ASSERT_NO_FATAL_FAILURE(f.lookup(0x10, 1024));
    sp_block_t *first_low = nullptr; // a block of the smaller stream leads again
    for (auto &b : f.blocks)
        if (low(b)) {
            first_low = &b;
            break;
        }
    ASSERT_NE(first_low, nullptr);
    sp__bset_insert(&f.set, first_low);
    EXPECT_EQ(f.set.lead, 1u);
    ASSERT_NO_FATAL_FAILURE(f.check());
    sp__bset_remove(&f.set, first_low);
    for (auto &b : f.blocks)
        if (b.in_set)
            sp__bset_remove(&f.set, &b);
    EXPECT_EQ(f.set.count, 0u);
    for (auto &b : f.blocks)
        if (!low(b))
            sp__bset_insert(&f.set, &b);
    EXPECT_TRUE(sp__bset_one_stream(&f.set, 0x10)); // known again from the empty set
    ASSERT_NO_FATAL_FAILURE(f.check());
}
