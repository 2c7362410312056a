// test_callbacks.cc: user code sympool runs (a MemPool's segment allocator, the history frames
// hook, an sp_x_log_set_fn function) may call back into sympool by mistake. The allocator
// callbacks run under the device's allocator lock and the frames hook inside sp_malloc, so such a
// call used to deadlock (or recurse until the stack overflowed); it must be refused with
// SP_ERR_INVALID_USAGE and a message instead, and the outer call must go on unharmed.
#include "sp_test.hpp"

#include <sympool/experimental.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <unistd.h>

using sp::MiB;

namespace {

// What the callback under test does; every status it saw is kept.
std::function<sp_status_t()> g_inner;
std::vector<sp_status_t> g_seen;
std::string g_msg;

void run_inner() {
    if (!g_inner)
        return;
    sp_status_t s = g_inner();
    g_seen.push_back(s);
    if (s != SP_SUCCESS && g_msg.empty())
        g_msg = sp_last_error();
}

void *seg_alloc(size_t size, int, sp_stream_t, void *) {
    run_inner();
    return aligned_alloc(4096, (size + 4095) / 4096 * 4096);
}

void seg_free(void *ptr, size_t, int, sp_stream_t, void *) {
    run_inner();
    free(ptr);
}

class Callbacks : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        expect_warnings(); // the refusals are logged
        g_seen.clear();
        g_msg.clear();
        g_inner = nullptr;
    }
    void TearDown() override {
        g_inner = nullptr;
        sp::Test::TearDown();
    }
    sp_mempool_t *pluggable_pool() {
        static const sp_allocator_t al = {seg_alloc, seg_free, nullptr};
        sp_mempool_params_t params;
        sp_mempool_params_init(&params);
        params.allocator = &al;
        sp_mempool_t *pool = nullptr;
        EXPECT_SP_OK(sp_mempool_create(&params, &pool));
        return pool;
    }
    // The inner call is refused every time the callback ran, naming the call.
    void expect_refused(const char *fn) {
        ASSERT_FALSE(g_seen.empty()) << "the callback never ran";
        for (sp_status_t s : g_seen)
            EXPECT_EQ(s, SP_ERR_INVALID_USAGE) << sp_status_name(s);
        EXPECT_NE(g_msg.find(fn), std::string::npos) << g_msg;
        EXPECT_NE(g_msg.find("inside a callback"), std::string::npos) << g_msg;
    }
};

// Every kind of call a segment allocator might make, from both of its callbacks.
TEST_F(Callbacks, SegmentAllocatorCallingSympoolIsRefused) {
    sp::Watchdog wd; // a deadlock must fail the test, not stall it
    struct Case {
        const char *fn;
        std::function<sp_status_t()> call;
    };
    sp_mempool_t *victim = nullptr;
    const Case cases[] = {
        {"sp_malloc",
         [] {
             void *p = nullptr;
             return sp_malloc(4096, 0, nullptr, &p);
         }},
        {"sp_free", [] { return sp_free(reinterpret_cast<void *>(0x1000)); }},
        {"sp_mempool_malloc",
         [&] {
             void *p = nullptr;
             return sp_mempool_malloc(victim, 4096, nullptr, &p);
         }},
        {"sp_mempool_free_all_blocks", [&] { return sp_mempool_free_all_blocks(victim, nullptr); }},
        {"sp_mempool_destroy", [&] { return sp_mempool_destroy(victim); }},
        {"sp_empty_cache", [] { return sp_empty_cache(); }},
        {"sp_memory_stats",
         [] {
             sp_stats_t st;
             return sp_memory_stats(0, &st);
         }},
        {"sp_memory_summary",
         [] {
             char buf[64] = "";
             return sp_memory_summary(0, buf, sizeof buf);
         }},
        {"sp_dump_snapshot", [] { return sp_dump_snapshot("/tmp/sp_never_written_cb.pickle"); }},
        {"sp_shutdown", [] { return sp_shutdown(); }},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.fn);
        g_seen.clear();
        g_msg.clear();
        sp_mempool_t *pool = pluggable_pool();
        victim = pool;
        g_inner = c.call;
        void *p = nullptr;
        ASSERT_SP_OK(sp_mempool_malloc(pool, MiB, nullptr, &p)); // seg_alloc runs
        ASSERT_NE(p, nullptr);
        sp::touch(p, MiB);
        EXPECT_SP_OK(sp_free(p));
        EXPECT_SP_OK(sp_mempool_free_all_blocks(pool, nullptr)); // seg_free runs
        g_inner = nullptr;
        expect_refused(c.fn);
        EXPECT_EQ(g_seen.size(), 2u);
        EXPECT_SP_OK(sp_mempool_destroy(pool));
    }
    EXPECT_EQ(access("/tmp/sp_never_written_cb.pickle", F_OK), -1);
}

size_t hook_calling_malloc(sp_history_frame_t *frames, size_t max, void *) {
    run_inner();
    if (max == 0)
        return 0;
    frames[0].name = "f";
    frames[0].filename = "f.py";
    frames[0].line = 1;
    return 1;
}

// The frames hook runs inside sp_malloc before any lock: a sp_malloc from it recursed until the
// stack overflowed.
TEST_F(Callbacks, FramesHookCallingSympoolIsRefused) {
    sp::Watchdog wd; // a deadlock must fail the test, not stall it
    g_inner = [] {
        void *p = nullptr;
        return sp_malloc(4096, 0, nullptr, &p);
    };
    sp_history_set_frames_hook(hook_calling_malloc, nullptr);
    sp_history_params_t hp;
    sp_history_params_init(&hp);
    ASSERT_SP_OK(sp_record_memory_history(&hp));
    void *p = nullptr;
    EXPECT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    EXPECT_SP_OK(sp_free(p));
    g_inner = nullptr;
    sp_history_set_frames_hook(nullptr, nullptr);
    hp.enabled = SP_HISTORY_OFF;
    EXPECT_SP_OK(sp_record_memory_history(&hp));
    expect_refused("sp_malloc");
}

// A segment allocator that hands out one address every time (or one at the top of the address
// space): the second segment overlapped the first in sympool's segment index, and destroying a
// pool then read freed memory (ASan: heap-use-after-free); a wrapping segment made blocks no
// sp_free could find, so sp_shutdown stayed BUSY for ever. Both are refused and given back now.
struct BadAllocator {
    void *addr = nullptr;
    int allocs = 0, frees = 0;
};

void *bad_alloc(size_t, int, sp_stream_t, void *ctx) {
    auto *b = static_cast<BadAllocator *>(ctx);
    b->allocs++;
    return b->addr;
}

void bad_free(void *ptr, size_t, int, sp_stream_t, void *ctx) {
    auto *b = static_cast<BadAllocator *>(ctx);
    EXPECT_EQ(ptr, b->addr);
    b->frees++;
}

TEST_F(Callbacks, SegmentAllocatorReturningOverlappingMemoryIsRefused) {
    void *arena = aligned_alloc(2 * MiB, 64 * MiB);
    ASSERT_NE(arena, nullptr);
    BadAllocator same;
    same.addr = arena;
    sp_allocator_t al = {bad_alloc, bad_free, &same};
    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    params.allocator = &al;
    sp_mempool_t *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&params, &a));
    ASSERT_SP_OK(sp_mempool_create(&params, &b));
    void *p = nullptr, *q = nullptr, *r = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(a, 1000, nullptr, &p));
    EXPECT_SP_STATUS(sp_mempool_malloc(b, 1000, nullptr, &q), SP_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(sp_last_error()).find("overlaps a segment"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(q, nullptr);
    EXPECT_SP_STATUS(sp_mempool_malloc(a, 3 * MiB, nullptr, &r), SP_ERR_INVALID_USAGE);
    EXPECT_EQ(same.frees, same.allocs - 1) << "every refused segment is given back";
    EXPECT_SP_OK(sp_free(p));
    EXPECT_SP_OK(sp_mempool_destroy(a));
    EXPECT_SP_OK(sp_mempool_destroy(b));
    EXPECT_SP_OK(sp_empty_cache());
    EXPECT_EQ(same.frees, same.allocs);

    BadAllocator top;
    top.addr = reinterpret_cast<void *>(UINTPTR_MAX - 4095);
    al.ctx = &top;
    sp_mempool_t *c = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&params, &c));
    EXPECT_SP_STATUS(sp_mempool_malloc(c, 1000, nullptr, &q), SP_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(sp_last_error()).find("past the end of the address space"),
              std::string::npos)
        << sp_last_error();
    EXPECT_EQ(top.frees, top.allocs);
    EXPECT_SP_OK(sp_mempool_destroy(c));
    EXPECT_SP_OK(sp_shutdown());
    free(arena);
}

size_t hook_overclaiming(sp_history_frame_t *frames, size_t max, void *) {
    frames[0].name = "only";
    frames[0].filename = "one.py";
    frames[0].line = 7;
    return max + 5; // wrote one frame, claims more than it was allowed
}

// Fills the stack below the caller with non-zero bytes, as earlier calls leave it.
__attribute__((noinline)) void dirty_stack() {
    volatile unsigned char junk[16384];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = 0x41;
}

// A hook that returns more frames than it wrote (or than it may): the frames it did not write
// were read from uninitialized stack as strings (a crash). They read as "??" now.
TEST_F(Callbacks, FramesHookClaimingTooManyFramesDoesNotCrash) {
    sp::Watchdog wd; // a deadlock must fail the test, not stall it
    sp_history_set_frames_hook(hook_overclaiming, nullptr);
    sp_history_params_t hp;
    sp_history_params_init(&hp);
    ASSERT_SP_OK(sp_record_memory_history(&hp));
    void *p = nullptr;
    dirty_stack();
    EXPECT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    std::string path = "/tmp/sp_cb_frames_" + std::to_string(getpid()) + ".json";
    EXPECT_SP_OK(sp_dump_snapshot(path.c_str()));
    EXPECT_SP_OK(sp_free(p));
    sp_history_set_frames_hook(nullptr, nullptr);
    hp.enabled = SP_HISTORY_OFF;
    EXPECT_SP_OK(sp_record_memory_history(&hp));
    std::string text = sp::read_file(path);
    unlink(path.c_str());
    ASSERT_NE(text, "<missing>") << path;
    EXPECT_NE(text.find(R"({"filename":"one.py","line":7,"name":"only"})"), std::string::npos);
    // The alloc entry's stack: the written frame, then the unwritten ones as unknown.
    size_t at = text.find(R"({"filename":"one.py","line":7,"name":"only"},)");
    ASSERT_NE(at, std::string::npos);
    std::string next = text.substr(at, 200);
    EXPECT_NE(next.find(R"(},{"filename":"??","line":0,"name":"??"})"), std::string::npos) << next;
}

size_t hook_unknown_line(sp_history_frame_t *frames, size_t max, void *) {
    if (max < 2)
        return 0;
    frames[0] = sp_history_frame_t{"unknown", "u.py", -1};
    frames[1] = sp_history_frame_t{"known", "u.py", 3};
    return 2;
}

// A frame line of -1 (a line PyTorch could not tell) is written as PyTorch writes it, its
// unsigned 64-bit form 2^64-1 (PyTorch's line is a uint64_t): it was written as -1, which a
// snapshot of PyTorch's never has. A line of 0 or more is written as it is.
TEST_F(Callbacks, NegativeFrameLineIsWrittenInPyTorchsUnsignedForm) {
    sp_history_set_frames_hook(hook_unknown_line, nullptr);
    sp_history_params_t hp;
    sp_history_params_init(&hp);
    ASSERT_SP_OK(sp_record_memory_history(&hp));
    void *p = nullptr;
    EXPECT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    std::string path = "/tmp/sp_cb_lines_" + std::to_string(getpid()) + ".json";
    EXPECT_SP_OK(sp_dump_snapshot(path.c_str()));
    EXPECT_SP_OK(sp_free(p));
    sp_history_set_frames_hook(nullptr, nullptr);
    hp.enabled = SP_HISTORY_OFF;
    EXPECT_SP_OK(sp_record_memory_history(&hp));
    std::string text = sp::read_file(path);
    unlink(path.c_str());
    ASSERT_NE(text, "<missing>") << path;
    EXPECT_NE(text.find(R"({"filename":"u.py","line":18446744073709551615,"name":"unknown"},)"
                        R"({"filename":"u.py","line":3,"name":"known"})"),
              std::string::npos)
        << text.substr(0, 600);
    EXPECT_EQ(text.find(R"("line":-1)"), std::string::npos);
}

int g_log_lines;
void log_calling_free(int, const char *, void *) {
    g_log_lines++;
    (void)sp_free(reinterpret_cast<void *>(0x2000)); // a bad free: it logs a WARN itself
}

// A log function that calls sympool: the inner call's WARN was logged under the log lock this
// thread already held (deadlock). Now the inner call is refused, its line goes to stderr, and
// the outer call's own message survives.
TEST(CallbacksLog, LogFunctionCallingSympoolDoesNotDeadlock) {
    sp::Watchdog wd; // a deadlock must fail the test, not stall it
    sp_x_log_set_fn(log_calling_free, nullptr);
    g_log_lines = 0;
    sp_status_t s = sp_free(reinterpret_cast<void *>(0x3000));
    std::string msg = sp_last_error();
    sp_x_log_set_fn(nullptr, nullptr);
    EXPECT_EQ(s, SP_ERR_INVALID_USAGE);
    EXPECT_EQ(g_log_lines, 1);
    EXPECT_NE(msg.find("sp_free(0x3000)"), std::string::npos) << msg;
}

int g_self_removing_lines;
void log_removing_itself(int, const char *, void *) {
    g_self_removing_lines++;
    sp_x_log_set_fn(nullptr, nullptr); // one line is enough: uninstall from inside the function
}

// A log function that uninstalls itself (or installs another) from inside: setting the function
// took the log lock this thread already held (deadlock).
TEST(CallbacksLog, LogFunctionMayReplaceItself) {
    sp::Watchdog wd; // a deadlock must fail the test, not stall it
    g_self_removing_lines = 0;
    sp_x_log_set_fn(log_removing_itself, nullptr);
    EXPECT_SP_STATUS(sp_free(reinterpret_cast<void *>(0x4000)), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(sp_free(reinterpret_cast<void *>(0x5000)), SP_ERR_INVALID_USAGE);
    sp_x_log_set_fn(nullptr, nullptr);
    EXPECT_EQ(g_self_removing_lines, 1) << "the second line must not reach the removed function";
}

} // namespace
