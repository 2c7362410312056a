// test_history_annotations.cc: external annotations (PyTorch's recordAnnotation, what
// torch.profiler.record_function's scopes leave in a snapshot's "external_annotations") and
// sp_x_history_stamp (the time `sympool replay --snapshot` gives its entries).
//  - kept only while recording, in one buffer for every device bounded by max_entries (STATE: 1),
//    cleared by every sp_record_memory_history call, as PyTorch's annotation buffer;
//  - a snapshot lists them oldest first as {"stage", "name", "device", "time_us"}, the key order
//    of PyTorch's own snapshots (14 real traces here);
//  - bad arguments record nothing.
#include "sp_test.hpp"

#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" {
#include "pool/device/device.h"
#include "pool/history.h"
#include "sympool/experimental.h"
}

namespace {

sp_status_t record(sp_history_enabled_t en, size_t max_entries = 0) {
    sp_history_params_t p;
    sp_history_params_init(&p);
    p.enabled = en;
    p.max_entries = max_entries;
    return sp_record_memory_history(&p);
}

struct Annot {
    int device;
    int64_t time_us;
    std::string stage, name;
};

std::vector<Annot> annotations() {
    sp__annotation_t *a = nullptr;
    size_t n = 0;
    EXPECT_EQ(sp__history_annotations(&a, &n), SP_SUCCESS);
    std::vector<Annot> out;
    for (size_t i = 0; i < n; i++)
        out.push_back({a[i].device, a[i].time_us, a[i].stage, a[i].name});
    sp__history_annotations_free(a, n);
    return out;
}

std::vector<std::string> names() {
    std::vector<std::string> out;
    for (auto &a : annotations())
        out.push_back(a.name);
    return out;
}

int64_t wall_us() {
    struct timeval tv;
    gettimeofday(&tv, nullptr);
    return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

std::string dump_json() {
    char path[] = "/tmp/sp_hist_annot_XXXXXX.json";
    int fd = mkstemps(path, 5);
    EXPECT_GE(fd, 0);
    close(fd);
    EXPECT_EQ(sp_dump_snapshot(path), SP_SUCCESS) << sp_last_error();
    std::ifstream f(path);
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    unlink(path);
    return s;
}

} // namespace

class HistoryAnnotations : public sp::Test {
  protected:
    void TearDown() override {
        sp_x_history_stamp(-1);
        (void)record(SP_HISTORY_OFF);
        sp::Test::TearDown();
    }
};

TEST_F(HistoryAnnotations, SnapshotListsThemWithPyTorchsKeys) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    int64_t before = wall_us();
    ASSERT_SP_OK(sp_history_record_annotation(0, "START", "Optimizer.step#AdamW.step"));
    ASSERT_SP_OK(sp_history_record_annotation(0, "END", "Optimizer.step#AdamW.step"));
    int64_t after = wall_us();
    auto a = annotations();
    ASSERT_EQ(a.size(), 2u);
    EXPECT_EQ(a[0].stage, "START");
    EXPECT_EQ(a[1].stage, "END");
    EXPECT_EQ(a[0].device, 0);
    // history's clock, mapped to the Unix epoch as the trace entries' times are
    EXPECT_GE(a[0].time_us, before - 1000);
    EXPECT_LE(a[1].time_us, after + 1000);
    EXPECT_LE(a[0].time_us, a[1].time_us);
    // The snapshot: the keys in PyTorch's order and types. (Each copy maps ticks to microseconds
    // anew, so the time is checked against the wall clock, not against the copy above.)
    std::string s = dump_json();
    std::string want = "\"external_annotations\":[{\"stage\":\"START\",\"name\":\"Optimizer.step#"
                       "AdamW.step\",\"device\":0,\"time_us\":";
    size_t at = s.find(want);
    ASSERT_NE(at, std::string::npos) << s.substr(s.find("external_annotations"));
    long long t = std::atoll(s.c_str() + at + want.size());
    EXPECT_GE(t, before - 1000);
    EXPECT_LE(t, after + 1000);
    EXPECT_NE(s.find("},{\"stage\":\"END\",\"name\":\"Optimizer.step#AdamW.step\",\"device\":0,"
                     "\"time_us\":",
                     at),
              std::string::npos);
}

TEST_F(HistoryAnnotations, OffRecordsNothing) {
    ASSERT_SP_OK(record(SP_HISTORY_OFF));
    ASSERT_SP_OK(sp_history_record_annotation(0, "START", "x"));
    EXPECT_EQ(sp__history_annotations_held(), 0u);
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    ASSERT_SP_OK(sp_history_record_annotation(0, "START", "x"));
    EXPECT_EQ(sp__history_annotations_held(), 1u);
    ASSERT_SP_OK(record(SP_HISTORY_OFF));
    EXPECT_EQ(sp__history_annotations_held(), 0u) << "off clears them";
    EXPECT_NE(dump_json().find("\"external_annotations\":[]"), std::string::npos);
}

TEST_F(HistoryAnnotations, BoundedByMaxEntriesOldestOverwritten) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 3));
    for (const char *n : {"a", "b", "c", "d", "e"})
        ASSERT_SP_OK(sp_history_record_annotation(0, "START", n));
    EXPECT_EQ(names(), (std::vector<std::string>{"c", "d", "e"}));
    ASSERT_SP_OK(sp_history_record_annotation(0, "END", "f"));
    EXPECT_EQ(names(), (std::vector<std::string>{"d", "e", "f"}));
}

TEST_F(HistoryAnnotations, StateKeepsOne) {
    ASSERT_SP_OK(record(SP_HISTORY_STATE, 100));
    ASSERT_SP_OK(sp_history_record_annotation(0, "START", "a"));
    ASSERT_SP_OK(sp_history_record_annotation(0, "END", "a"));
    auto a = annotations();
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a[0].stage, "END");
}

TEST_F(HistoryAnnotations, EveryRecordCallClearsThem) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    ASSERT_SP_OK(sp_history_record_annotation(0, "START", "a"));
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 10)); // PyTorch's recordHistory clears on each call
    EXPECT_EQ(sp__history_annotations_held(), 0u);
    ASSERT_SP_OK(sp_history_record_annotation(0, "START", "b"));
    EXPECT_EQ(names(), (std::vector<std::string>{"b"}));
}

TEST_F(HistoryAnnotations, BadArgumentsRecordNothing) {
    expect_warnings();
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    EXPECT_EQ(sp_history_record_annotation(-1, "START", "a"), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("device -1"), std::string::npos);
    EXPECT_EQ(sp_history_record_annotation(sp_device_count(), "START", "a"),
              SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(sp_history_record_annotation(0, nullptr, "a"), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(sp_history_record_annotation(0, "START", nullptr), SP_ERR_INVALID_ARGUMENT);
    std::string big((1u << 20) + 1, 'x');
    EXPECT_EQ(sp_history_record_annotation(0, "START", big.c_str()), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(sp__history_annotations_held(), 0u);
}

TEST_F(HistoryAnnotations, StampGivesEntriesAndAnnotationsTheirTime) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    const int64_t t0 = 1783874495854988; // a recorded time (earlier than now)
    sp_x_history_stamp(t0);
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
    ASSERT_SP_OK(sp_history_record_annotation(0, "START", "s"));
    sp_x_history_stamp(t0 + 5);
    ASSERT_SP_OK(sp_free(p));
    sp_x_history_stamp(-1); // the clock again
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    sp__trace_entry_t *e = nullptr;
    size_t n = 0;
    ASSERT_SP_OK(sp__history_copy(0, &e, &n));
    std::vector<std::pair<sp_trace_action_t, int64_t>> got;
    for (size_t i = 0; i < n; i++)
        got.push_back({e[i].action, e[i].time_us});
    sp__history_entries_free(e, n);
    // stamped: the segment_alloc and alloc at t0, the free's two entries at t0 + 5
    ASSERT_GE(got.size(), 5u);
    size_t k = 0;
    for (; k < got.size() && got[k].first != SP_TRACE_FREE_REQUESTED; k++)
        EXPECT_EQ(got[k].second, t0) << k;
    ASSERT_LT(k + 1, got.size());
    EXPECT_EQ(got[k].second, t0 + 5);
    EXPECT_EQ(got[k + 1].second, t0 + 5);
    // after -1 the clock's time (now, years after t0)
    EXPECT_GT(got.back().second, wall_us() - 60 * 1000000LL);
    auto a = annotations();
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a[0].time_us, t0);
}

// sp_x_history_stamp_next: a time queued for an action goes to the next entry of that action
// (oldest first), before sp_x_history_stamp's; an entry of another action keeps the stamp; -1
// drops what is left; an action PyTorch does not have is refused and queues nothing.
TEST_F(HistoryAnnotations, StampNextGivesEachActionItsQueuedTime) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    const int64_t t0 = 1783874495854988;
    expect_warnings(); // the refusals below say why
    EXPECT_EQ(sp_x_history_stamp_next(9, t0), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(sp_x_history_stamp_next(-2, t0), SP_ERR_INVALID_ARGUMENT);
    sp_x_history_stamp(t0 + 3);                        // the alloc's own
    ASSERT_SP_OK(sp_x_history_stamp_next(3, t0));      // its segment_alloc, 3 us earlier
    ASSERT_SP_OK(sp_x_history_stamp_next(2, t0 + 40)); // the free's completion
    ASSERT_SP_OK(sp_x_history_stamp_next(2, t0 + 50)); // one no entry takes
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
    sp_x_history_stamp(t0 + 10);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_x_history_stamp_next(-1, -1)); // t0 + 50 dropped
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    sp_x_history_stamp(-1);
    sp__trace_entry_t *e = nullptr;
    size_t n = 0;
    ASSERT_SP_OK(sp__history_copy(0, &e, &n));
    std::vector<std::pair<sp_trace_action_t, int64_t>> got;
    for (size_t i = 0; i < n; i++)
        got.push_back({e[i].action, e[i].time_us});
    sp__history_entries_free(e, n);
    std::vector<std::pair<sp_trace_action_t, int64_t>> want = {
        {SP_TRACE_SEGMENT_ALLOC, t0},       {SP_TRACE_ALLOC, t0 + 3},
        {SP_TRACE_FREE_REQUESTED, t0 + 10}, {SP_TRACE_FREE_COMPLETED, t0 + 40},
        {SP_TRACE_ALLOC, t0 + 10},          {SP_TRACE_FREE_REQUESTED, t0 + 10},
        {SP_TRACE_FREE_COMPLETED, t0 + 10}};
    EXPECT_EQ(got, want);
}

// sp_x_history_record_snapshot: the `snapshot` entry a dump appends, alone, with the size given;
// nothing while actions are not recorded; a device that does not exist is refused.
TEST_F(HistoryAnnotations, RecordSnapshotAppendsTheMarkerOnly) {
    expect_warnings(); // the refusal says why
    EXPECT_EQ(sp_x_history_record_snapshot(-1, 0), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(sp_x_history_record_snapshot(sp_device_count(), 0), SP_ERR_INVALID_ARGUMENT);
    ASSERT_SP_OK(sp_x_history_record_snapshot(0, 4096)); // not recording: nothing
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    sp_x_history_stamp(1783874495854988);
    ASSERT_SP_OK(sp_x_history_record_snapshot(0, 48760832));
    sp_x_history_stamp(-1);
    sp__trace_entry_t *e = nullptr;
    size_t n = 0;
    ASSERT_SP_OK(sp__history_copy(0, &e, &n));
    ASSERT_EQ(n, 1u);
    EXPECT_EQ(e[0].action, SP_TRACE_SNAPSHOT);
    EXPECT_EQ(e[0].size, 48760832u);
    EXPECT_EQ(e[0].addr, 0u);
    EXPECT_EQ(e[0].time_us, 1783874495854988);
    sp__history_entries_free(e, n);
}

// An action PyTorch does not have is refused with a negative time too, and changes nothing:
// the queued times stay (it dropped them all and said it succeeded). -1 with a negative time
// (every action) still drops them; -1 with a time names no action to queue it for.
TEST_F(HistoryAnnotations, StampNextRefusesABadActionWithoutDroppingTheQueue) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    const int64_t t0 = 1783874495854988;
    ASSERT_SP_OK(sp_x_history_stamp_next(0, t0)); // the alloc's
    ASSERT_SP_OK(sp_x_history_stamp_next(1, t0 + 1));
    expect_warnings(); // the refusals below say why
    for (int bad : {9, 42, -2}) {
        EXPECT_EQ(sp_x_history_stamp_next(bad, -1), SP_ERR_INVALID_ARGUMENT) << bad;
        EXPECT_NE(std::string(sp_last_error()).find("action"), std::string::npos)
            << sp_last_error();
    }
    EXPECT_EQ(sp_x_history_stamp_next(-1, t0 + 2), SP_ERR_INVALID_ARGUMENT);
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    ASSERT_SP_OK(sp_x_history_stamp_next(-1, -1)); // t0 + 1 dropped
    ASSERT_SP_OK(sp_free(p));
    sp__trace_entry_t *e = nullptr;
    size_t n = 0;
    ASSERT_SP_OK(sp__history_copy(0, &e, &n));
    std::vector<std::pair<sp_trace_action_t, int64_t>> got;
    for (size_t i = 0; i < n; i++)
        if (e[i].action == SP_TRACE_ALLOC || e[i].action == SP_TRACE_FREE_REQUESTED)
            got.push_back({e[i].action, e[i].time_us});
    sp__history_entries_free(e, n);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0], std::make_pair(SP_TRACE_ALLOC, t0)) << "the bad calls dropped its time";
    EXPECT_NE(got[1].second, t0 + 1) << "-1, -1 drops what is queued";
}

// sp_x_history_record_snapshot where the library cannot start (CUDA asked for, no GPU): the
// start's status and message, as sp_malloc's, not "device 0 does not exist (0 device(s))".
TEST_F(HistoryAnnotations, RecordSnapshotSaysWhyTheLibraryCannotStart) {
    if (sp__device_cuda_available())
        GTEST_SKIP() << "a GPU answers here";
    expect_warnings(); // the failed start says why
    sp::ScopedEnv env({{"SYMPOOL_DEVICE", "cuda"}});
    sp__device_reset();
    void *p = nullptr;
    sp_status_t want = sp_malloc(4096, 0, nullptr, &p);
    ASSERT_NE(want, SP_SUCCESS);
    std::string why = sp_last_error();
    sp__error_clear();
    EXPECT_EQ(sp_x_history_record_snapshot(0, 4096), want) << sp_last_error();
    EXPECT_EQ(std::string(sp_last_error()), why);
    sp__device_reset();
}
