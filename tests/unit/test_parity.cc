// test_parity.cc: PyTorch semantics its own tests check that sympool's C API carries:
// get_per_process_memory_fraction reads back exactly what was set (1.0 when never set), the
// ALLOC_CONF key per_process_memory_fraction sets it on every device at start-up, and
// _record_memory_history's skip_actions keeps the named actions out of the trace.
#include "alloc_test_util.hpp"

#include <set>
#include <vector>

extern "C" {
#include "core/core.h"
#include "pool/history.h"
#include "sympool/experimental.h"
}

using namespace sp;

class ParityFraction : public sp::Test {};

TEST_F(ParityFraction, GetReturnsWhatWasSet) {
    double f = -1.0;
    ASSERT_SP_OK(sp_get_memory_fraction(0, &f));
    EXPECT_EQ(f, 1.0);
    for (double v : {0.0, 0.123456789, 0.5, 0.999999, 1.0}) {
        ASSERT_SP_OK(sp_set_memory_fraction(v, 0));
        ASSERT_SP_OK(sp_get_memory_fraction(0, &f));
        EXPECT_EQ(f, v); // exactly, not allowed_max / total
    }
    // A refused value changes nothing.
    expect_warnings();
    ASSERT_SP_OK(sp_set_memory_fraction(0.5, 0));
    EXPECT_SP_STATUS(sp_set_memory_fraction(1.5, 0), SP_ERR_INVALID_ARGUMENT);
    ASSERT_SP_OK(sp_get_memory_fraction(0, &f));
    EXPECT_EQ(f, 0.5);
    EXPECT_SP_STATUS(sp_get_memory_fraction(0, nullptr), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_get_memory_fraction(sp_device_count(), &f), SP_ERR_INVALID_ARGUMENT);
}

TEST_F(ParityFraction, AllocConfKeySetsEveryDeviceAtStart) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "2"},
                       {"SYMPOOL_HOST_CAPACITY", "1GiB"},
                       {"SYMPOOL_ALLOC_CONF", "per_process_memory_fraction:0.25"}});
    SP_SKIP_UNLESS_HOST();
    expect_warnings(); // the OOM below is logged
    for (int d = 0; d < 2; d++) {
        double f = 0.0;
        ASSERT_SP_OK(sp_get_memory_fraction(d, &f));
        EXPECT_EQ(f, 0.25);
    }
    void *p = nullptr;
    // 256 MiB allowed: 240 MiB fits, 300 MiB does not.
    ASSERT_SP_OK(sp_malloc(240 * MiB, 1, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_SP_STATUS(sp_malloc(300 * MiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    // set_per_process_memory_fraction(1.0) lifts it.
    ASSERT_SP_OK(sp_set_memory_fraction(1.0, 0));
    ASSERT_SP_OK(sp_malloc(300 * MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(ParityFraction, AllocConfRefusesPyTorchsBadValues) {
    expect_warnings(); // each refusal is logged
    for (const char *conf :
         {"per_process_memory_fraction:-0.1", "per_process_memory_fraction:1.1",
          "per_process_memory_fraction:half", "pinned_num_register_threads:1024",
          "pinned_num_register_threads:3", "foo:1,bar:2", "garbage_collection_threshold:1.2",
          "max_split_size_mb:2", "release_lock_on_cudamalloc:none"}) {
        SCOPED_TRACE(conf);
        EXPECT_SP_STATUS(sp_x_option_set("SYMPOOL_ALLOC_CONF", conf), SP_ERR_INVALID_ARGUMENT);
    }
    for (const char *conf : {"per_process_memory_fraction:0", "per_process_memory_fraction:1.0",
                             "pinned_num_register_threads:128", "pinned_num_register_threads:1"})
        EXPECT_SP_OK(sp_x_option_set("SYMPOOL_ALLOC_CONF", conf));
    ASSERT_SP_OK(sp_x_option_set("SYMPOOL_ALLOC_CONF", nullptr));
}

class ParityHistory : public sp::Test {
  protected:
    void TearDown() override {
        sp_history_params_t off;
        sp_history_params_init(&off);
        off.enabled = SP_HISTORY_OFF;
        EXPECT_SP_OK(sp_record_memory_history(&off));
        sp::Test::TearDown();
    }
};

static std::set<sp_trace_action_t> actions() {
    sp__trace_entry_t *e = nullptr;
    size_t n = 0;
    EXPECT_EQ(sp__history_copy(0, &e, &n), SP_SUCCESS);
    std::set<sp_trace_action_t> out;
    for (size_t i = 0; i < n; i++)
        out.insert(e[i].action);
    sp__history_entries_free(e, n);
    return out;
}

TEST_F(ParityHistory, SkipActionsAreNeverStored) {
    sp_history_params_t p;
    sp_history_params_init(&p);
    EXPECT_EQ(p.skip_actions, nullptr);
    // With expandable segments on (SYMPOOL_ALLOC_CONF in the environment) the segment entries
    // are segment_map and segment_unmap.
    p.skip_actions = "free_requested,segment_free,segment_unmap";
    ASSERT_SP_OK(sp_record_memory_history(&p));
    void *x = nullptr;
    ASSERT_SP_OK(sp_malloc(64 * KiB, 0, nullptr, &x));
    ASSERT_SP_OK(sp_free(x));
    ASSERT_SP_OK(sp_empty_cache());
    auto a = actions();
    EXPECT_EQ(a.count(SP_TRACE_FREE_REQUESTED), 0u);
    EXPECT_EQ(a.count(SP_TRACE_SEGMENT_FREE) + a.count(SP_TRACE_SEGMENT_UNMAP), 0u);
    EXPECT_EQ(a.count(SP_TRACE_ALLOC), 1u);
    EXPECT_EQ(a.count(SP_TRACE_FREE_COMPLETED), 1u);
    EXPECT_EQ(a.count(SP_TRACE_SEGMENT_ALLOC) + a.count(SP_TRACE_SEGMENT_MAP), 1u);
    // Enabling again without skip_actions records everything.
    p.skip_actions = "";
    ASSERT_SP_OK(sp_record_memory_history(&p));
    ASSERT_SP_OK(sp_malloc(64 * KiB, 0, nullptr, &x));
    ASSERT_SP_OK(sp_free(x));
    EXPECT_EQ(actions().count(SP_TRACE_FREE_REQUESTED), 1u);
}

TEST_F(ParityHistory, UnknownSkipActionIsRefusedAndChangesNothing) {
    expect_warnings();
    sp_history_params_t p;
    sp_history_params_init(&p);
    p.skip_actions = "alloc,frees";
    EXPECT_SP_STATUS(sp_record_memory_history(&p), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("frees"), std::string::npos) << sp_last_error();
    void *x = nullptr;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &x));
    ASSERT_SP_OK(sp_free(x));
    EXPECT_TRUE(actions().empty()) << "recording did not start";
}

// Only the whole list may be empty: an empty name inside it is a malformed list.
TEST_F(ParityHistory, EmptySkipActionNameIsRefused) {
    expect_warnings();
    sp_history_params_t p;
    sp_history_params_init(&p);
    for (const char *text : {"alloc,,free_requested", "alloc,", ",alloc", ","}) {
        SCOPED_TRACE(text);
        p.skip_actions = text;
        EXPECT_SP_STATUS(sp_record_memory_history(&p), SP_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(sp_last_error()).find("empty action name"), std::string::npos)
            << sp_last_error();
    }
    void *x = nullptr;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &x));
    ASSERT_SP_OK(sp_free(x));
    EXPECT_TRUE(actions().empty()) << "recording did not start";
}

// test_cuda.py's test_out_of_memory matches "Tried to allocate 800000000.00 GiB. GPU 0 has a
// total capacity of": the OOM text carries PyTorch's sentences, device index included.
class ParityOom : public sp::Test {};

TEST_F(ParityOom, MessageHasPyTorchsSentences) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "2"}, {"SYMPOOL_HOST_CAPACITY", "1GiB"}});
    SP_SKIP_UNLESS_HOST();
    expect_warnings(); // the OOM is logged
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_malloc(size_t(1024) * 1024 * 1024 * 800000000, 1, nullptr, &p),
                     SP_ERR_OUT_OF_MEMORY);
    std::string msg = sp_last_error();
    // PyTorch's format_size writes 1 GiB as "1024.00 MiB" (its units go up to 1024 of them).
    EXPECT_NE(msg.find("Tried to allocate 800000000.00 GiB. GPU 1 has a total capacity of 1024.00 "
                       "MiB of which 1024.00 MiB is free. Of the allocated memory 0 bytes is "
                       "allocated by sympool, and 0 bytes is reserved by sympool but unallocated."),
              std::string::npos)
        << msg;
}

// PyTorch's OOM text counts the free blocks of private pools (MemPools; its graph_pools) as
// allocated and says so: "... is allocated by PyTorch, with <n> allocated in private pools (e.g.,
// CUDA Graphs), and <reserved - allocated - n> is reserved by PyTorch but unallocated."
TEST_F(ParityOom, FreeBlocksOfPrivatePoolsCountAsAllocated) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "1GiB"}});
    SP_SKIP_UNLESS_HOST();
    expect_warnings(); // the OOMs are logged
    void *p = nullptr, *q = nullptr;
    EXPECT_SP_STATUS(sp_malloc(2 * GiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(std::string(sp_last_error()).find("private pools"), std::string::npos)
        << "said only when a private pool holds free blocks: " << sp_last_error();
    sp_mempool_t *pool = sp::make_named_pool("private");
    ASSERT_NE(pool, nullptr);
    ASSERT_SP_OK(sp_mempool_malloc(pool, 1000, nullptr, &q));
    ASSERT_SP_OK(sp_free(q)); // a free 2 MiB small block, kept by the live pool's cache
    ASSERT_SP_OK(sp_malloc(20 * MiB, 0, nullptr, &q)); // a whole 20 MiB segment, allocated
    EXPECT_SP_STATUS(sp_malloc(2 * GiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(sp_last_error())
                  .find("Of the allocated memory 22.00 MiB is allocated by sympool, with 2.00 MiB "
                        "allocated in private pools (e.g., CUDA Graphs), and 0 bytes is reserved "
                        "by sympool but unallocated."),
              std::string::npos)
        << sp_last_error();
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}

// The size in PyTorch's "Tried to allocate" is alloc_size, what malloc asked the device for
// (get_allocation_size of the rounded request): a small request reads as its 2 MiB segment, one
// under 10 MiB as the 20 MiB segment, a larger one rounded up to 2 MiB; hence the familiar
// "Tried to allocate 20.00 MiB". A request that fits no segment would be told by its own size.
TEST_F(ParityOom, TriedToAllocateNamesTheSegmentSize) {
    // Fixed segments whatever the environment says: expandable ones map 63 MiB in pages (with
    // PyTorch's 20 MiB pages it does not fit this device at all).
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}, {"SYMPOOL_ALLOC_CONF", nullptr}});
    SP_SKIP_UNLESS_HOST();
    expect_warnings(); // each OOM is logged
    void *keep = nullptr, *p = nullptr;
    ASSERT_SP_OK(sp_malloc(63 * MiB, 0, nullptr, &keep)); // 1 MiB of the device is left
    const struct {
        size_t request;
        const char *text;
    } cases[] = {
        {1000, "Tried to allocate 2.00 MiB."},
        {3 * MiB, "Tried to allocate 20.00 MiB."},
        {21 * MiB + 1, "Tried to allocate 22.00 MiB."},
        {40 * MiB, "Tried to allocate 40.00 MiB."},
    };
    for (const auto &k : cases) {
        SCOPED_TRACE(k.request);
        EXPECT_SP_STATUS(sp_malloc(k.request, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
        EXPECT_NE(std::string(sp_last_error()).find(k.text), std::string::npos) << sp_last_error();
    }
    ASSERT_SP_OK(sp_free(keep));
}

// With a memory fraction set, PyTorch's text says how much is allowed, between the device's
// figures and the allocator's: "... of which <free> is free. <allowed_max> allowed; Of the
// allocated memory ...". Without one, nothing is said.
TEST_F(ParityOom, AllowedMemoryWhenAFractionIsSet) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "1GiB"}});
    SP_SKIP_UNLESS_HOST();
    expect_warnings(); // each OOM is logged
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_malloc(2 * GiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(std::string(sp_last_error()).find("allowed;"), std::string::npos) << sp_last_error();
    ASSERT_SP_OK(sp_set_memory_fraction(0.25, 0));
    EXPECT_SP_STATUS(sp_malloc(512 * MiB, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(sp_last_error())
                  .find("is free. 256.00 MiB allowed; Of the allocated memory 0 bytes is "
                        "allocated by sympool"),
              std::string::npos)
        << sp_last_error();
    ASSERT_SP_OK(sp_set_memory_fraction(1.0, 0));
}

// CUDACachingAllocator.cpp's format_size, which writes every figure of the OOM text: a unit is
// used up to and including 1024 of it ("1024 bytes", "1024.00 KiB", "1024.00 MiB"), the next
// one only above; GiB is the largest. A 1 GiB request reads "Tried to allocate 1024.00 MiB".
TEST(ParityFormatSize, UnitsUpToAndIncluding1024OfThem) {
    const struct {
        size_t bytes;
        const char *text;
    } cases[] = {
        {0, "0 bytes"},
        {512, "512 bytes"},
        {1024, "1024 bytes"},
        {1025, "1.00 KiB"},
        {size_t(1) << 20, "1024.00 KiB"},
        {(size_t(1) << 20) + 1, "1.00 MiB"},
        {size_t(20) << 20, "20.00 MiB"},
        {size_t(1) << 30, "1024.00 MiB"},
        {(size_t(1) << 30) + 1, "1.00 GiB"},
        {size_t(1) << 40, "1024.00 GiB"},
    };
    for (const auto &k : cases) {
        char buf[64];
        sp__size_format((double)k.bytes, SP_SIZE_PYTORCH, buf, sizeof buf);
        EXPECT_STREQ(buf, k.text) << k.bytes;
    }
}

// test_memory_plots_metadata: the user metadata set for a device goes into every trace entry
// recorded on it afterwards, until changed; other devices keep theirs.
TEST_F(ParityHistory, UserMetadataTagsLaterEntries) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "2"}});
    SP_SKIP_UNLESS_HOST();
    sp_history_params_t p;
    sp_history_params_init(&p);
    ASSERT_SP_OK(sp_record_memory_history(&p));
    void *x = nullptr;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &x)); // before: no metadata
    ASSERT_SP_OK(sp_history_set_user_metadata(0, "phase 1"));
    ASSERT_SP_OK(sp_free(x));
    ASSERT_SP_OK(sp_malloc(1000, 1, nullptr, &x)); // device 1 has none
    ASSERT_SP_OK(sp_free(x));
    char buf[8];
    size_t n = 0;
    ASSERT_SP_OK(sp_history_get_user_metadata(0, buf, sizeof buf, &n));
    EXPECT_STREQ(buf, "phase 1");
    EXPECT_EQ(n, 7u);
    ASSERT_SP_OK(sp_history_get_user_metadata(0, buf, 4, &n)); // truncated, length still whole
    EXPECT_STREQ(buf, "pha");
    EXPECT_EQ(n, 7u);
    ASSERT_SP_OK(sp_history_set_user_metadata(0, nullptr));
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &x));
    ASSERT_SP_OK(sp_free(x));
    for (int d = 0; d < 2; d++) {
        sp__trace_entry_t *e = nullptr;
        size_t ne = 0;
        ASSERT_SP_OK(sp__history_copy(d, &e, &ne));
        std::vector<std::string> got;
        for (size_t i = 0; i < ne; i++)
            if (e[i].action == SP_TRACE_ALLOC || e[i].action == SP_TRACE_FREE_REQUESTED)
                got.push_back(sp__history_metadata(e[i].meta));
        sp__history_entries_free(e, ne);
        if (d == 0)
            EXPECT_EQ(got, (std::vector<std::string>{"", "phase 1", "", ""}));
        else
            EXPECT_EQ(got, (std::vector<std::string>{"", ""}));
    }
    expect_warnings();
    EXPECT_SP_STATUS(sp_history_set_user_metadata(2, "x"), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_history_get_user_metadata(0, nullptr, 1, &n), SP_ERR_INVALID_ARGUMENT);
    // A text longer than 4096 bytes is kept (PyTorch sets no bound; replay --snapshot carries a
    // trace's own); past 1 MiB it is refused.
    EXPECT_SP_OK(sp_history_set_user_metadata(0, std::string(5000, 'a').c_str()));
    EXPECT_SP_STATUS(sp_history_set_user_metadata(0, std::string((1 << 20) + 1, 'a').c_str()),
                     SP_ERR_INVALID_ARGUMENT);
}

// sp_shutdown with history still recording entries that carry user metadata: the shutdown used
// to free the metadata tables before clearing the rings, whose entries then dropped their texts'
// references through a NULL table (a segfault). Shut down cleanly, and a new session records.
TEST_F(ParityHistory, ShutdownWhileRecordingEntriesWithMetadata) {
    sp_history_params_t p;
    sp_history_params_init(&p);
    ASSERT_SP_OK(sp_record_memory_history(&p));
    ASSERT_SP_OK(sp_history_set_user_metadata(0, "phase 1"));
    void *x = nullptr;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &x));
    ASSERT_SP_OK(sp_free(x));
    ASSERT_SP_OK(sp_shutdown());
    ASSERT_SP_OK(sp_record_memory_history(&p));
    ASSERT_SP_OK(sp_history_set_user_metadata(0, "phase 2"));
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &x));
    ASSERT_SP_OK(sp_free(x));
    sp__trace_entry_t *e = nullptr;
    size_t ne = 0;
    ASSERT_SP_OK(sp__history_copy(0, &e, &ne));
    std::vector<std::string> got;
    for (size_t i = 0; i < ne; i++)
        if (e[i].action == SP_TRACE_ALLOC)
            got.push_back(sp__history_metadata(e[i].meta));
    sp__history_entries_free(e, ne);
    EXPECT_EQ(got, (std::vector<std::string>{"phase 2"}));
}

// Many distinct texts, each its own entry's, then the early ones again: every entry reads back
// the text that was in force (the texts are looked up by hash; a slot taken for another text, or
// an id handed out twice, shows here).
TEST_F(ParityHistory, ManyUserMetadataTextsEachTagTheirEntry) {
    SP_SKIP_UNLESS_HOST();
    sp_history_params_t p;
    sp_history_params_init(&p);
    p.max_entries = 1 << 16;
    ASSERT_SP_OK(sp_record_memory_history(&p));
    std::vector<std::string> want;
    auto tagged_malloc = [&](const std::string &text) {
        ASSERT_SP_OK(sp_history_set_user_metadata(0, text.c_str()));
        void *x = nullptr;
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &x));
        ASSERT_SP_OK(sp_free(x));
        want.push_back(text);
    };
    for (int i = 0; i < 3000; i++)
        ASSERT_NO_FATAL_FAILURE(tagged_malloc("step " + std::to_string(i)));
    for (int i = 2999; i >= 0; i -= 7)
        ASSERT_NO_FATAL_FAILURE(tagged_malloc("step " + std::to_string(i)));
    ASSERT_NO_FATAL_FAILURE(tagged_malloc(""));
    sp__trace_entry_t *e = nullptr;
    size_t ne = 0;
    ASSERT_SP_OK(sp__history_copy(0, &e, &ne));
    std::vector<std::string> got;
    for (size_t i = 0; i < ne; i++)
        if (e[i].action == SP_TRACE_ALLOC)
            got.push_back(sp__history_metadata(e[i].meta));
    sp__history_entries_free(e, ne);
    EXPECT_EQ(got, want);
}

// A text is held while something names it (the text in force, a ring entry, a copy's entry) and
// freed after: a program that sets a new text every step keeps only those its ring still holds.
// A copy taken before the ring moved on still reads its texts (ASan sees a freed one read).
TEST_F(ParityHistory, UserMetadataTextsNothingNamesAreFreed) {
    SP_SKIP_UNLESS_HOST();
    const size_t before = sp__history_meta_held();
    for (int i = 0; i < 5000; i++) // history off: only the text in force is held
        ASSERT_SP_OK(sp_history_set_user_metadata(0, ("off " + std::to_string(i)).c_str()));
    EXPECT_EQ(sp__history_meta_held(), before + 1);
    sp_history_params_t p;
    sp_history_params_init(&p);
    p.max_entries = 100;
    ASSERT_SP_OK(sp_record_memory_history(&p));
    auto step = [&](int i) {
        ASSERT_SP_OK(sp_history_set_user_metadata(0, ("step " + std::to_string(i)).c_str()));
        void *x = nullptr;
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &x));
        ASSERT_SP_OK(sp_free(x));
    };
    for (int i = 0; i < 5000; i++)
        ASSERT_NO_FATAL_FAILURE(step(i));
    // The texts the ring's 100 entries name (three entries a step; the one in force among them).
    auto ring_texts = [&](sp__trace_entry_t **e_p, size_t *n_p) {
        std::set<std::string> t;
        EXPECT_SP_OK(sp__history_copy(0, e_p, n_p));
        for (size_t i = 0; i < *n_p; i++)
            t.insert(sp__history_metadata((*e_p)[i].meta));
        return t;
    };
    sp__trace_entry_t *e = nullptr;
    size_t ne = 0;
    std::set<std::string> held = ring_texts(&e, &ne);
    ASSERT_EQ(ne, 100u);
    EXPECT_GE(held.size(), 25u);
    EXPECT_LT(held.size(), 100u);
    EXPECT_EQ(held.count("step 4999"), 1u);
    EXPECT_EQ(sp__history_meta_held(), before + held.size());
    const std::string first = sp__history_metadata(e[0].meta);
    for (int i = 5000; i < 5200; i++) // the ring moves on; the copy's texts stay
        ASSERT_NO_FATAL_FAILURE(step(i));
    sp__trace_entry_t *e2 = nullptr;
    size_t ne2 = 0;
    std::set<std::string> now = ring_texts(&e2, &ne2);
    sp__history_entries_free(e2, ne2);
    EXPECT_EQ(sp__history_meta_held(), before + held.size() + now.size());
    EXPECT_EQ(sp__history_metadata(e[0].meta), first);
    EXPECT_STREQ(sp__history_metadata(e[ne - 1].meta), "step 4999");
    sp__history_entries_free(e, ne);
    EXPECT_EQ(sp__history_meta_held(), before + now.size());
    ASSERT_NO_FATAL_FAILURE(step(4950)); // a freed text set again: held again, read back
    char buf[16];
    ASSERT_SP_OK(sp_history_get_user_metadata(0, buf, sizeof buf, nullptr));
    EXPECT_STREQ(buf, "step 4950");
    ASSERT_SP_OK(sp__history_copy(0, &e, &ne));
    EXPECT_STREQ(sp__history_metadata(e[ne - 1].meta), "step 4950");
    sp__history_entries_free(e, ne);
    sp_history_params_t off;
    sp_history_params_init(&off);
    off.enabled = SP_HISTORY_OFF;
    ASSERT_SP_OK(sp_record_memory_history(&off)); // the ring cleared: the text in force only
    EXPECT_EQ(sp__history_meta_held(), before + 1);
    ASSERT_SP_OK(sp_history_set_user_metadata(0, nullptr));
    EXPECT_EQ(sp__history_meta_held(), before);
}
