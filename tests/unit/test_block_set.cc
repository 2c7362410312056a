// test_block_set.cc: the free set (pool/block_set.h) against a sorted reference: every lookup
// gives the reference's lower_bound and predecessor whether the hint answers or the root walk
// does, and after every change the tree (or each size class's tree, every block in the tree of
// its class) is a balanced search tree with right parent links whose first block is `min`, its
// in-order walk the reference's order.
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
    bool wide; // sizes over many classes, several sizes a class (else 512 B to 3 KiB: exact ones)
    std::mt19937 size_rng;

    // streams: how many streams the segments spread over (1: the set's one-stream walks).
    // base: the first block's address (addresses above 4 GiB exercise the high half of the
    // one-stream walks' (size, address) keys). classes: the set gets its class table (a pool's
    // set does), which a one-stream, non-symmetric set uses. min_classes: the set's (1: classes
    // from the first block, the form most of these tests look at; 0: a pool's, the default).
    Fixture(size_t n, bool by_seq, uint32_t seed, unsigned streams = 3, uintptr_t base = 0x100000,
            bool classes = false, bool wide_sizes = false, uint8_t min_classes = 1)
        : segs(24), blocks(n), wide(wide_sizes), size_rng(seed + 99) {
        set.by_seq = by_seq;
        if (classes && !sp__bset_init_classes(&set))
            std::abort();
        if (min_classes)
            set.min_classes = min_classes;
        std::mt19937 rng(seed);
        for (size_t i = 0; i < segs.size(); i++) {
            segs[i].seq = (i * 5) % segs.size(); // seq order differs from address order
            segs[i].stream = (sp_stream_t)(uintptr_t)(0x10 * (i % streams)); // its blocks' too
        }
        for (size_t i = 0; i < n; i++) {
            sp_block_t &b = blocks[i];
            b.addr = base + i * (wide ? 1ull << 30 : 512); // room for the wide sizes
            b.size = draw_size(rng);
            b.seg = sp__ptr_ref(&segs[rng() % segs.size()]);
        }
    }
    ~Fixture() { sp__bset_free_classes(&set); }

    // Few sizes, many equal keys up to the tie-break; wide: 512 B to 64 MiB, log-spread, from a
    // few dozen values so that equal sizes (ties by address) are common in every class too.
    size_t draw_size(std::mt19937 &rng) {
        if (!wide)
            return 512 * (1 + rng() % 6);
        unsigned bits = rng() % 17; // up to 2^17 units of 512 B
        size_t u = (1ull << bits) + (rng() % 3) * (((1ull << bits) >> 4) + 1); // same class often
        return 512 * u;
    }
    size_t next_size() { return wide ? draw_size(size_rng) : 512 * (1 + size_rng() % 8); }

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

    // Each tree valid, each block in its class's tree (classes), the bitmap right.
    void check_trees() {
        if (!set.classes) {
            check_tree(sp__blk0(set.root), nullptr);
            return;
        }
        EXPECT_EQ(set.root, 0u);
        for (unsigned c = 0; c < SP_BSET_CLASSES; c++) {
            sp_block_t *r = sp__blk0(set.cls->root[c]);
            EXPECT_EQ((set.cls->bits[c / 64] >> (c % 64)) & 1, r ? 1u : 0u) << "class " << c;
            check_tree(r, nullptr);
            std::vector<const sp_block_t *> st{r};
            while (!st.empty()) {
                const sp_block_t *n = st.back();
                st.pop_back();
                if (!n)
                    continue;
                EXPECT_EQ(sp__bset_class(n->size), c);
                st.push_back(sp__blk0(n->left));
                st.push_back(sp__blk0(n->right));
            }
        }
        for (unsigned w = 0; w < SP_BSET_WORDS; w++)
            EXPECT_EQ((set.cls->top >> w) & 1, set.cls->bits[w] ? 1u : 0u);
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
        // The classes' form holds one stream, so its count of min's stream is its count or not
        // known (0: a one-tree set of several streams down to one block takes the form):
        // sp__bset_remove counts a block out of it without reading a stream.
        if (set.classes && set.lead != 0) {
            ASSERT_EQ(set.lead, set.count);
        }
        check_trees();
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
        // With classes the predecessor may be left out (NULL) when it lies in a class below the
        // answer's (a remainder that keeps the answer's class sorts above it anyway), or when
        // there is no answer.
        bool left_out = pred == nullptr && set.classes && want_pred &&
                        (!want || sp__bset_class(want_pred->size) < sp__bset_class(want->size));
        if (!left_out) {
            ASSERT_EQ(pred, want_pred);
        }
        ASSERT_EQ(sp__bset_lower_bound(&set, (sp_stream_t)stream, size), want);
    }
};

// Steps of a churn: a sixth under ThreadSanitizer, which these one-thread tests give nothing that
// ASan does not, and where ClassesMatchASortedReference's four churns took 90 s (47 s of CPU)
// alone and passed ctest's 120 s limit beside other tests (at a third, 61 s beside a CPU hog).
#if defined(__SANITIZE_THREAD__)
constexpr int kSteps = 1000;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr int kSteps = 1000;
#else
constexpr int kSteps = 6000;
#endif
#else
constexpr int kSteps = 6000;
#endif

void churn(bool by_seq, uint32_t seed, unsigned streams = 3, uintptr_t base = 0x100000,
           bool classes = false, bool wide = false, size_t n = 600, uint8_t min_classes = 1) {
    Fixture f(n, by_seq, seed, streams, base, classes, wide, min_classes);
    std::mt19937 rng(seed * 7 + 1);
    for (int step = 0; step < kSteps; step++) {
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
            size_t old = b->size;
            b->size = f.next_size();
            // With classes, half the time the allocator's forms: across classes sp__bset_reclass
            // (O(1) for a node alone in its class into an empty one, else the class move),
            // within one the class move itself (a merged block past its successor).
            unsigned c = sp__bset_class(old), nc = sp__bset_class(b->size);
            if (f.set.moves && c != nc && rng() % 2)
                sp__bset_reclass(&f.set, b, c, nc);
            else if (f.set.moves && rng() % 2)
                sp__bset_reclass_move(&f.set, b, c, nc);
            else
                sp__bset_move(&f.set, b, old);
            ASSERT_EQ(f.set.hint, b);
        } else if (op < 6 && f.set.hint) {
            // The allocator's pattern: take the best fit, give it back (the hint's cases).
            sp_block_t *h = f.set.hint;
            sp__bset_remove(&f.set, h);
            ASSERT_NO_FATAL_FAILURE(f.check());
            sp__bset_insert(&f.set, h);
        } else {
            ASSERT_NO_FATAL_FAILURE(f.lookup(
                0x10 * (rng() % 4), f.wide && rng() % 2 ? f.next_size() : 512 * (rng() % 8)));
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
    EXPECT_EQ(f.set.root, 0u);
    EXPECT_EQ(f.set.min, nullptr);
    EXPECT_EQ(f.set.lead, 0u);
    for (auto &b : f.blocks)
        EXPECT_EQ(b.bal, 0); // a block out of the set never keeps a balance (-1 is a mark)
}

// Seeds of each churn: three in the plain build, one under a sanitizer, where the reference
// check after every step made these three tests 49 s of the ASan+UBSan suite (a third of it
// still walks every insert, removal, move and lookup form under the sanitizer). SP_TEST_SANITIZED:
// the build's sanitizer, which this file's own flags may leave out (tests/CMakeLists.txt).
#if defined(SP_TEST_SANITIZED) || defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
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

// A one-stream set of a pool (class table given) keeps a tree per size class: inserts, removals
// of arbitrary members, in-place size changes moved between classes, and lookups within a class
// and across empty ones all keep the reference's order; sizes from 512 B to 64 MiB put several
// sizes, and many equal ones (ties by address), in each class. A second stream turns the set
// into one tree (the three-stream churns), and a symmetric set never uses its table.
TEST(BlockSet, ClassesMatchASortedReference) {
    for (uint32_t seed = 1; seed <= kSeeds; seed++) {
        ASSERT_NO_FATAL_FAILURE(churn(false, seed, 1, 0x100000, true, false));
        ASSERT_NO_FATAL_FAILURE(churn(false, seed, 1, (uintptr_t)0x7f3a00000000ull, true, true));
        ASSERT_NO_FATAL_FAILURE(churn(false, seed, 3, 0x100000, true, true));
        ASSERT_NO_FATAL_FAILURE(churn(true, seed, 1, 0x100000, true, true));
        // A pool's threshold on a set of about 12 of 24 blocks: it takes the classes' form at 16
        // and leaves it below 8 again and again.
        ASSERT_NO_FATAL_FAILURE(churn(false, seed, 1, 0x100000, true, true, 24, 0));
    }
}

namespace {
// Block i of fixture f with the given size, address and stream's segment (0: stream 0).
sp_block_t *make(Fixture &f, size_t i, size_t size, uintptr_t addr, size_t seg = 0) {
    sp_block_t *b = &f.blocks[i];
    b->size = size;
    b->addr = addr;
    b->seg = sp__ptr_ref(&f.segs[seg]);
    return b;
}

sp_block_t *fit(Fixture &f, uintptr_t stream, size_t size) {
    sp_block_t *pred = nullptr;
    return sp__bset_find_fit(&f.set, (sp_stream_t)stream, size, &pred);
}
} // namespace

// Within one class the order is still PyTorch's (size, then address): 16 KiB and 16.5 KiB share
// a class (two 512 B units a step there); the smaller size wins though the larger one has the
// lower address, equal sizes go by address whatever the insert order, and a size above the
// class's blocks finds the next non-empty class's first block across empty ones.
TEST(BlockSet, ClassBestFitIsTheSmallestSizeThenTheLowestAddress) {
    Fixture f(8, false, 1, 1, 0x100000, true);
    ASSERT_EQ(sp__bset_class(16384), sp__bset_class(16896));
    ASSERT_LT(sp__bset_class(16896), sp__bset_class(1 << 20));
    sp_block_t *big_low = make(f, 0, 16896, 0x1000000);
    sp_block_t *small_high = make(f, 1, 16384, 0x9000000);
    sp_block_t *small_mid = make(f, 2, 16384, 0x5000000);
    sp_block_t *far = make(f, 3, 1 << 20, 0x2000000);
    for (sp_block_t *b : {big_low, small_high, far, small_mid})
        sp__bset_insert(&f.set, b);
    ASSERT_TRUE(f.set.classes);
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(fit(f, 0, 16384), small_mid);
    EXPECT_EQ(fit(f, 0, 512), small_mid);
    EXPECT_EQ(fit(f, 0, 16385), big_low);
    EXPECT_EQ(fit(f, 0, 16896), big_low);
    EXPECT_EQ(fit(f, 0, 16897), far);
    EXPECT_EQ(sp__bset_lower_bound(&f.set, 0, 16384), small_mid);
    sp__bset_remove(&f.set, small_mid); // an arbitrary member, the hint
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(fit(f, 0, 16384), small_high);
    // small_high grows in place to 1 MiB at a higher address than `far`: it moves to far's class
    // and sorts after it; a lookup for 16 KiB now takes big_low.
    size_t old = small_high->size;
    small_high->size = 1 << 20;
    sp__bset_move(&f.set, small_high, old);
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(fit(f, 0, 16384), big_low);
    EXPECT_EQ(fit(f, 0, 16897), far);
    EXPECT_EQ(sp__bset_succ(&f.set, far), small_high);
    EXPECT_EQ(sp__bset_pred(&f.set, far), big_low);
    EXPECT_EQ(fit(f, 0, (1 << 20) + 512), nullptr);
}

// The class move (sp__bset_reclass_move: a split's remainder or a merged block that leaves its
// class, or a merged block that passes its successor in its class) keeps `min` without the
// successor step the general move takes: the first block grown past the next one in its own
// class, the first block moved up into a later class, a block moved down below the first one
// (from another class and from the first one's), and a block moved between two classes that
// each hold several blocks (walk, rebalance and bitmap; every tree checked by f.check()).
TEST(BlockSet, ClassMovesKeepTheFirstBlock) {
    Fixture f(16, false, 1, 1, 0x100000, true);
    const size_t kib = 1024;
    ASSERT_EQ(sp__bset_class(16 * kib), sp__bset_class(16 * kib + 512));
    ASSERT_LT(sp__bset_class(16 * kib + 512), sp__bset_class(64 * kib));
    sp_block_t *a = make(f, 0, 16 * kib, 0x1000000);       // the first block
    sp_block_t *b = make(f, 1, 16 * kib, 0x2000000);       // a's successor in its class
    sp_block_t *c = make(f, 2, 16 * kib + 512, 0x3000000); // the class's last
    sp_block_t *d = make(f, 3, 64 * kib, 0x4000000);
    sp_block_t *e = make(f, 4, 64 * kib, 0x5000000);
    sp_block_t *g = make(f, 5, 64 * kib + 2 * kib, 0x6000000);
    sp_block_t *h = make(f, 6, 1 << 20, 0x7000000);
    for (sp_block_t *x : {a, b, c, d, e, g, h})
        sp__bset_insert(&f.set, x);
    ASSERT_TRUE(f.set.moves);
    ASSERT_NO_FATAL_FAILURE(f.check());
    ASSERT_EQ(f.set.min, a);
    // a grows within its class past b (a merge): b is first now.
    unsigned ca = sp__bset_class(a->size);
    a->size = 16 * kib + 512;
    sp__bset_reclass_move(&f.set, a, ca, sp__bset_class(a->size));
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.min, b);
    EXPECT_EQ(f.set.hint, a);
    // b, the first block, goes up into d's class (above d and e): a is first.
    unsigned cb = sp__bset_class(b->size);
    b->size = 64 * kib + kib;
    sp__bset_reclass(&f.set, b, cb, sp__bset_class(b->size));
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.min, a);
    EXPECT_EQ(sp__bset_succ(&f.set, e), b);
    // g goes down below every block (a split's remainder into a class below all): g is first.
    unsigned cg = sp__bset_class(g->size);
    g->size = 4 * kib;
    sp__bset_reclass(&f.set, g, cg, sp__bset_class(g->size));
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.min, g);
    // h comes down into the first block's class below it: h is first.
    unsigned ch = sp__bset_class(h->size);
    h->size = 4 * kib;
    h->addr = 0x800000;
    sp__bset_reclass(&f.set, h, ch, sp__bset_class(h->size));
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.min, h);
    // d (not first) moves down into a's class, which holds a and c: the first stays.
    unsigned cd = sp__bset_class(d->size);
    d->size = 16 * kib;
    sp__bset_reclass(&f.set, d, cd, sp__bset_class(d->size));
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.min, h);
    EXPECT_EQ(fit(f, 0, 16 * kib), d);
}

// A set with classes and one block keeps it in no tree (min and the hint): the cached pair's
// key changes (a segment's one free block, 4 MiB cut from 20 MiB and merged back, another class
// each way) touch no tree and no class bit, and lookups, neighbours and changes answer as for a
// tree. A second block puts the first in its class's tree; the removal that leaves one takes
// the last out by the bitmap, even when a merge grew it first (free_block's order).
TEST(BlockSet, ClassesKeepTheirOneBlockInNoTree) {
    Fixture f(8, false, 1, 1, 0x100000, true);
    const size_t mib = 1 << 20;
    sp_block_t *r = make(f, 0, 20 * mib, 0x10000000);
    sp__bset_insert(&f.set, r);
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.cls->top, 0u);
    EXPECT_FALSE(f.set.moves);
    ASSERT_NE(sp__bset_class(20 * mib), sp__bset_class(16 * mib));
    for (int i = 0; i < 3; i++) {
        size_t old = r->size;
        r->size = 16 * mib; // the remainder of a 4 MiB split
        r->addr += 4 * mib;
        sp__bset_move(&f.set, r, old);
        ASSERT_NO_FATAL_FAILURE(f.check());
        EXPECT_EQ(f.set.cls->top, 0u);
        EXPECT_EQ(fit(f, 0, 16 * mib), r);
        EXPECT_EQ(fit(f, 0, 16 * mib + 512), nullptr);
        EXPECT_EQ(sp__bset_lower_bound(&f.set, 0, 512), r);
        EXPECT_EQ(sp__bset_lower_bound(&f.set, 0, 16 * mib + 512), nullptr);
        old = r->size;
        r->size = 20 * mib; // the merge back
        r->addr -= 4 * mib;
        sp__bset_reclass(&f.set, r, sp__bset_class(old), sp__bset_class(r->size));
        ASSERT_NO_FATAL_FAILURE(f.check());
        EXPECT_EQ(f.set.cls->top, 0u);
        EXPECT_EQ(fit(f, 0, 20 * mib), r);
        EXPECT_EQ(sp__bset_succ(&f.set, r), nullptr);
        EXPECT_EQ(sp__bset_pred(&f.set, r), nullptr);
    }
    sp_block_t *s = make(f, 1, 4096, 0x200000);
    sp__bset_insert(&f.set, s);
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_TRUE(f.set.moves);
    EXPECT_EQ(fit(f, 0, 512), s);
    EXPECT_EQ(fit(f, 0, 8192), r);
    // Two classes, each node alone: the O(1) move up, past s (r stays above it), and down
    // below s (r becomes the first block).
    size_t old = r->size;
    r->size = 40 * mib;
    sp__bset_reclass(&f.set, r, sp__bset_class(old), sp__bset_class(r->size));
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(fit(f, 0, 20 * mib + 512), r);
    old = r->size;
    r->size = 2048;
    sp__bset_reclass(&f.set, r, sp__bset_class(old), sp__bset_class(r->size));
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.min, r);
    EXPECT_EQ(fit(f, 0, 2048), r);
    EXPECT_EQ(fit(f, 0, 2560), s);
    old = r->size;
    r->size = 20 * mib;
    sp__bset_reclass(&f.set, r, sp__bset_class(old), sp__bset_class(r->size));
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.min, s);
    // r grows in place, then s leaves (a merge with both neighbours): r is the one block.
    r->size = 24 * mib;
    sp__bset_remove(&f.set, s);
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.cls->top, 0u);
    EXPECT_FALSE(f.set.moves);
    EXPECT_EQ(f.set.hint, r);
    EXPECT_EQ(fit(f, 0, 24 * mib), r);
    EXPECT_EQ(fit(f, 0, 24 * mib + 512), nullptr);
    sp__bset_remove(&f.set, r);
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(f.set.min, nullptr);
    EXPECT_EQ(f.set.hint, nullptr);
    EXPECT_EQ(fit(f, 0, 512), nullptr);
}

// Streams stay apart: a second stream's block turns a class set into one tree ordered by
// stream first, each stream's lookups find only its own blocks, and the set goes back to
// classes once empty.
TEST(BlockSet, ClassesGiveWayToOneTreeForASecondStream) {
    Fixture f(8, false, 1, 2, 0x100000, true); // segs[0]: stream 0, segs[1]: stream 0x10
    sp_block_t *a = make(f, 0, 4096, 0x300000, 0);
    sp_block_t *b = make(f, 1, 8192, 0x100000, 0);
    sp_block_t *c = make(f, 2, 4096, 0x200000, 1);
    sp_block_t *d = make(f, 3, 1024, 0x400000, 1);
    sp__bset_insert(&f.set, a);
    sp__bset_insert(&f.set, b);
    EXPECT_TRUE(f.set.classes);
    EXPECT_EQ(fit(f, 0x10, 512), nullptr); // a stream above every block's
    sp__bset_insert(&f.set, c);
    EXPECT_FALSE(f.set.classes);
    sp__bset_insert(&f.set, d);
    ASSERT_NO_FATAL_FAILURE(f.check());
    EXPECT_EQ(fit(f, 0, 4096), a);
    EXPECT_EQ(fit(f, 0, 4097), b);
    EXPECT_EQ(fit(f, 0x10, 512), d);
    EXPECT_EQ(fit(f, 0x10, 2048), c);
    EXPECT_EQ(sp__bset_succ(&f.set, b), d); // stream 0's last, then stream 0x10's first
    for (sp_block_t *x : {a, c, b, d})
        sp__bset_remove(&f.set, x);
    sp__bset_insert(&f.set, c);
    EXPECT_TRUE(f.set.classes);
    EXPECT_EQ(fit(f, 0, 512), c); // a stream below every block's: the first block
    ASSERT_NO_FATAL_FAILURE(f.check());
}

// A pool's set (its default min_classes) keeps one tree while it holds a few blocks (a block
// alone in its class would move between classes on most key changes), takes the classes' form
// at SP_BSET_MIN_CLASSES blocks and gives it up below half of that; lookups agree throughout.
TEST(BlockSet, FewBlocksKeepOneTree) {
    Fixture f(SP_BSET_MIN_CLASSES, false, 1, 1, 0x100000, true, true, 0);
    std::vector<sp_block_t *> in;
    for (size_t i = 0; i < SP_BSET_MIN_CLASSES; i++) {
        sp_block_t *b = make(f, i, 512 * (1 + i * 37), 0x100000 + 0x1000000 * i);
        sp__bset_insert(&f.set, b);
        in.push_back(b);
        ASSERT_NO_FATAL_FAILURE(f.check());
        EXPECT_EQ(f.set.classes, i == 0 || i + 1 == SP_BSET_MIN_CLASSES) << i; // one: no tree
        EXPECT_EQ(fit(f, 0, 512 * 37), in.size() > 1 ? in[1] : nullptr);
    }
    for (size_t i = SP_BSET_MIN_CLASSES; i-- > 0;) {
        sp__bset_remove(&f.set, in[i]);
        ASSERT_NO_FATAL_FAILURE(f.check());
        EXPECT_EQ(f.set.classes, i >= SP_BSET_MIN_CLASSES / 2 || i <= 1) << i;
        EXPECT_EQ(fit(f, 0, 512 * 37), i > 1 ? in[1] : nullptr);
    }
}
