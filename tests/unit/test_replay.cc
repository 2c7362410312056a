// test_replay.cc: `sympool replay`'s engine (tools/trace.c, tools/replay.c) on small synthetic
// PyTorch snapshots written with our own writer: seeding (blocks live before recording began),
// PyTorch's reserved timeline, the replayed peaks, OOMs under a capacity, bad traces; and the
// real forward trace end to end.
#include "sp_test.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include "core/core_emit.h"
#include "pool/pool.h"
#include "tools/cli.h"
#include "sympool/experimental.h"
#include "tools/pickle_read.h"
#include "tools/trace.h"
}

namespace {

// The document an emitter holds, as bytes (the emitter is finished).
std::vector<unsigned char> finish(sp__emit_t *e) {
    char *buf = nullptr;
    size_t len = 0;
    EXPECT_EQ(sp__emit_finish(e, &buf, &len), SP_SUCCESS);
    std::vector<unsigned char> out(buf, buf + len);
    free(buf);
    return out;
}

// The loader without stacks (whose reader hands the entries over as it parses them) reads a
// file: b is written to a file at path, loaded and removed.
bool load_from_file(const std::vector<unsigned char> &b, const std::string &path, tr_trace_t *t,
                    char *why, size_t why_len) {
    std::ofstream(path, std::ios::binary).write((const char *)b.data(), (std::streamsize)b.size());
    bool ok = tr_load_opts(path.c_str(), false, t, why, why_len);
    unlink(path.c_str());
    return ok;
}

constexpr uint64_t MiB = 1024 * 1024;

std::string data_dir() {
    const char *d = getenv("SP_TEST_DATA_DIR");
    return d ? d : SP_TEST_DATA_DIR_DEFAULT;
}
constexpr uint64_t SEG_A = 0x7f0010000000ull; // final segment (20 MiB)
constexpr uint64_t SEG_B = 0x7f0020000000ull; // made and released during the trace (2 MiB)
constexpr uint64_t EARLY = 0x7f0030000000ull; // allocated before recording, freed in the trace

struct Ev {
    const char *action;
    uint64_t addr, size;
};

void emit_event(sp__emit_t *e, const Ev &ev, int64_t t) {
    sp__emit_dict_begin(e);
    sp__emit_key(e, "action");
    sp__emit_str(e, ev.action);
    sp__emit_key(e, strcmp(ev.action, "oom") == 0 ? "device_free" : "addr");
    sp__emit_uint(e, ev.addr);
    sp__emit_key(e, "size");
    sp__emit_uint(e, ev.size);
    sp__emit_key(e, "stream");
    sp__emit_int(e, 0);
    sp__emit_key(e, "time_us");
    sp__emit_int(e, t);
    sp__emit_dict_end(e);
}

void emit_block(sp__emit_t *e, uint64_t addr, uint64_t size, uint64_t req, const char *state) {
    sp__emit_dict_begin(e);
    sp__emit_key(e, "address");
    sp__emit_uint(e, addr);
    sp__emit_key(e, "size");
    sp__emit_uint(e, size);
    sp__emit_key(e, "requested_size");
    sp__emit_uint(e, req);
    sp__emit_key(e, "state");
    sp__emit_str(e, state);
    sp__emit_key(e, "frames");
    sp__emit_list_begin(e);
    sp__emit_list_end(e);
    sp__emit_dict_end(e);
}

// The synthetic run (PyTorch's view):
//   before recording: a 4 MiB block at SEG_A (never freed) and a 3000-byte block at EARLY.
//   trace: segment_alloc SEG_B 2 MiB; alloc SEG_B 1000; free EARLY (3000); alloc SEG_A+4MiB
//          2 MiB; free SEG_B; segment_free SEG_B.
//   end: SEG_A (20 MiB) = [4 MiB allocated (seed)] [2 MiB allocated] [14 MiB inactive].
std::vector<unsigned char> synthetic(bool with_bad_event = false) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_dict_begin(&e);
    sp__emit_key(&e, "segments");
    sp__emit_list_begin(&e);
    sp__emit_dict_begin(&e);
    sp__emit_key(&e, "device");
    sp__emit_int(&e, 0);
    sp__emit_key(&e, "address");
    sp__emit_uint(&e, SEG_A);
    sp__emit_key(&e, "total_size");
    sp__emit_uint(&e, 20 * MiB);
    sp__emit_key(&e, "stream");
    sp__emit_int(&e, 0);
    sp__emit_key(&e, "segment_type");
    sp__emit_str(&e, "large");
    sp__emit_key(&e, "blocks");
    sp__emit_list_begin(&e);
    emit_block(&e, SEG_A, 4 * MiB, 4 * MiB, "active_allocated");
    emit_block(&e, SEG_A + 4 * MiB, 2 * MiB, 2 * MiB, "active_allocated");
    emit_block(&e, SEG_A + 6 * MiB, 14 * MiB, 0, "inactive");
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    sp__emit_list_end(&e);
    sp__emit_key(&e, "device_traces");
    sp__emit_list_begin(&e);
    sp__emit_list_begin(&e);
    const Ev evs[] = {{"segment_alloc", SEG_B, 2 * MiB},   {"alloc", SEG_B, 1000},
                      {"free_requested", EARLY, 3000},     {"free_completed", EARLY, 3000},
                      {"alloc", SEG_A + 4 * MiB, 2 * MiB}, {"free_requested", SEG_B, 1000},
                      {"free_completed", SEG_B, 1000},     {"segment_free", SEG_B, 2 * MiB}};
    int64_t t = 1700000000000000ll;
    for (const Ev &ev : evs)
        emit_event(&e, ev, t += 10);
    if (with_bad_event) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "action");
        sp__emit_str(&e, "alloc");
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    return finish(&e);
}

bool load(const std::vector<unsigned char> &b, tr_trace_t *t, std::string *err) {
    pk_doc_t *doc = nullptr;
    char why[256] = "";
    if (!pk_parse(b.data(), b.size(), nullptr, &doc, why, sizeof(why))) {
        *err = why;
        return false;
    }
    bool ok = tr_from_doc(doc, t, why, sizeof(why));
    *err = why;
    return ok;
}

// The synthetic snapshot replayed under the current settings, no snapshot written; the trace is
// freed.
bool replay_synthetic(replay_result_t *r, std::string *why) {
    tr_trace_t t;
    bool ok = load(synthetic(), &t, why);
    if (ok) {
        char buf[256] = "";
        ok = replay_trace(&t, nullptr, r, buf, sizeof(buf));
        *why = buf;
    }
    tr_free(&t);
    return ok;
}

class Replay : public sp::Test {};

// A snapshot with no segments whose device 0's trace is being written: e is ready for its
// entries; the caller closes the two lists and the dict.
static void begin_device0_events(sp__emit_t *e) {
    sp__emit_init(e, false);
    sp__emit_dict_begin(e);
    sp__emit_key(e, "segments");
    sp__emit_list_begin(e);
    sp__emit_list_end(e);
    sp__emit_key(e, "device_traces");
    sp__emit_list_begin(e);
    sp__emit_list_begin(e);
}

TEST_F(Replay, FindsSeedsAndPyTorchReserved) {
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(synthetic(), &t, &err)) << err;
    ASSERT_EQ(t.ndev, 1);
    const tr_device_t &d = t.dev[0];
    EXPECT_EQ(d.nev, 8u);
    // SEG_A existed before recording (no event names it): the starting state, with its live
    // 4 MiB block at its start.
    ASSERT_EQ(d.nstart, 1u);
    EXPECT_EQ(d.start[0].addr, SEG_A);
    EXPECT_EQ(d.start[0].size, 20 * MiB);
    ASSERT_EQ(d.start[0].n, 1u);
    EXPECT_EQ(d.sblocks[d.start[0].first].addr, SEG_A);
    EXPECT_EQ(d.sblocks[d.start[0].first].req, 4 * MiB);
    EXPECT_EQ(d.start_bytes, 20 * MiB);
    // Blocks live at the start: the one in SEG_A, and EARLY (freed without a recorded alloc),
    // which lies in no segment the snapshot knows: it is requested before the first event.
    ASSERT_EQ(d.nseeds, 2u);
    EXPECT_EQ(d.seeds[0].addr, SEG_A);
    EXPECT_TRUE(d.seeds[0].in_start);
    EXPECT_EQ(d.seeds[1].addr, EARLY);
    EXPECT_EQ(d.seeds[1].size, 3000u);
    EXPECT_FALSE(d.seeds[1].in_start);
    EXPECT_EQ(d.seeded_bytes, 4 * MiB + 3000);
    EXPECT_EQ(d.nloose, 1u);
    EXPECT_EQ(d.loose_bytes, 3000u);
    EXPECT_EQ(d.final_reserved, 20 * MiB);
    EXPECT_EQ(d.start_reserved, 20 * MiB);
    EXPECT_EQ(d.peak_reserved, 22 * MiB); // while SEG_B existed
    // 4M+3000 -> +1000 -> -3000 -> +2M -> -1000: peak 6 MiB + 1000.
    EXPECT_EQ(d.peak_requested, 6 * MiB + 1000);
    // The segment_free of SEG_B is the user's empty_cache (nothing allocates after it).
    EXPECT_EQ(d.empty_cache_runs, 1u);
    EXPECT_EQ(d.deferred_frees, 0u);
    tr_free(&t);
}

TEST_F(Replay, ReplaysRequestsInOrder) {
    replay_result_t r;
    std::string why;
    ASSERT_TRUE(replay_synthetic(&r, &why)) << why;
    EXPECT_EQ(r.trace_entries, 8u);
    EXPECT_EQ(r.allocs, 2u);
    EXPECT_EQ(r.frees, 2u);
    EXPECT_EQ(r.events, 4u);
    EXPECT_EQ(r.start_segments, 1u);
    EXPECT_EQ(r.start_blocks, 1u);
    EXPECT_EQ(r.seeded_blocks, 1u);
    EXPECT_EQ(r.skipped_frees, 0u);
    EXPECT_EQ(r.ooms, 0u);
    EXPECT_EQ(r.empty_caches, 1u);
    EXPECT_EQ(r.peak_requested, (int64_t)(6 * MiB + 1000)); // the same requests as PyTorch's
    EXPECT_GE(r.peak_allocated, r.peak_requested);
    EXPECT_GE(r.peak_reserved, r.peak_allocated);
    EXPECT_EQ(r.pytorch_peak_reserved, 22 * MiB);
    EXPECT_EQ(r.trace_peak_requested, 6 * MiB + 1000);
    EXPECT_EQ(r.pytorch_end_allocated, 6 * MiB);    // the two allocated blocks of SEG_A
    EXPECT_EQ(r.end_allocated, (int64_t)(6 * MiB)); // ours, rounded the same way
    // The starting state is PyTorch's 20 MiB segment; the 2 MiB block fits in its free space
    // and the small seed and request need one 2 MiB small segment: PyTorch's 22 MiB. The
    // empty_cache then releases that small segment, as PyTorch's did.
    EXPECT_EQ((uint64_t)r.peak_reserved, r.pytorch_peak_reserved);
    EXPECT_EQ(r.end_reserved, (int64_t)(20 * MiB));
    EXPECT_EQ(r.device_frees, 1);
}

// The recorded run used fixed segments (the snapshot records no settings: PyTorch's default);
// replayed with expandable segments, that layout cannot exist: the starting state is its live
// blocks requested under expandable segments, not the 20 MiB segment with its 16 MiB of cached
// free space, which would otherwise hold the 2 MiB request and set the peak.
TEST_F(Replay, OtherSegmentKindRequestsTheStartingBlocks) {
    sp::ScopedEnv env(
        {{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}, {"SYMPOOL_EXPANDABLE_PAGE", "2MiB"}});
    replay_result_t r;
    std::string why;
    ASSERT_TRUE(replay_synthetic(&r, &why)) << why;
    EXPECT_TRUE(r.start_requested);
    EXPECT_EQ(r.start_segments, 0u);
    EXPECT_EQ(r.start_bytes, 0u);
    EXPECT_EQ(r.start_blocks, 0u);
    EXPECT_EQ(r.seeded_blocks, 2u); // both live blocks, the one in SEG_A included
    EXPECT_EQ(r.seeded_bytes, 4 * MiB + 3000);
    EXPECT_EQ(r.peak_requested, (int64_t)(6 * MiB + 1000)); // the same requests
    // 6 MiB of large blocks in 2 MiB pages and one 2 MiB small page: 8 MiB, not the recorded
    // run's 22 MiB.
    EXPECT_EQ(r.peak_reserved, (int64_t)(8 * MiB));
    EXPECT_EQ(r.end_allocated, (int64_t)(6 * MiB));
}

// With the recorded segment kind the recorded segments are rebuilt.
TEST_F(Replay, SameSegmentKindRebuildsTheRecordedSegments) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:False"}});
    replay_result_t r;
    std::string why;
    ASSERT_TRUE(replay_synthetic(&r, &why)) << why;
    EXPECT_FALSE(r.start_requested);
    EXPECT_EQ(r.start_segments, 1u);
    EXPECT_EQ((uint64_t)r.peak_reserved, r.pytorch_peak_reserved);
}

TEST_F(Replay, WritesOurSnapshotOfTheReplay) {
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(synthetic(), &t, &err)) << err;
    char dir[] = "/tmp/sp_replay_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string out = std::string(dir) + "/r.pickle";
    replay_result_t r;
    char why[256] = "";
    ASSERT_TRUE(replay_trace(&t, out.c_str(), &r, why, sizeof(why))) << why;
    tr_free(&t);
    // Our snapshot is itself a replayable trace: the starting state is state (not allocations
    // at t=0), the trace holds the recorded run's 2 allocs and 2 frees.
    tr_trace_t ours;
    char e2[256] = "";
    ASSERT_TRUE(tr_load(out.c_str(), &ours, e2, sizeof(e2))) << e2;
    size_t allocs = 0, frees = 0;
    for (size_t i = 0; i < ours.dev[0].nev; i++) {
        allocs += ours.dev[0].ev[i].action == TR_ALLOC;
        frees += ours.dev[0].ev[i].action == TR_FREE_REQUESTED;
    }
    EXPECT_EQ(allocs, 2u);
    EXPECT_EQ(frees, 2u);
    // Before our trace: the 20 MiB segment and the small segment of the early block (the
    // seed), which the empty_cache frees.
    EXPECT_EQ(ours.dev[0].nstart, 2u);
    EXPECT_EQ(ours.dev[0].start_bytes, 22 * MiB);
    EXPECT_EQ(ours.dev[0].empty_cache_runs, 1u);
    EXPECT_EQ(ours.dev[0].peak_reserved, 22 * MiB);
    // PyTorch copies the traces before its snapshot records its marker: no dump holds its own.
    EXPECT_NE(ours.dev[0].ev[ours.dev[0].nev - 1].action, TR_SNAPSHOT);
    tr_free(&ours);
    unlink(out.c_str());
    rmdir(dir);
}

TEST_F(Replay, CapacityTurnsIntoCountedOoms) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "16MiB"}});
    replay_result_t r;
    std::string why;
    ASSERT_TRUE(replay_synthetic(&r, &why)) << why;
    EXPECT_GE(r.ooms, 1u); // the 4 MiB seed needs a 20 MiB segment
    EXPECT_LE(r.peak_reserved, (int64_t)(16 * MiB));
}

TEST_F(Replay, BadTracesAreExplained) {
    tr_trace_t t;
    std::string err;
    EXPECT_FALSE(load(synthetic(true), &t, &err));
    EXPECT_EQ(err, "device_traces[0][8] (alloc): missing or bad 'addr' or 'size'");
    tr_free(&t);

    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_list_begin(&e);
    sp__emit_int(&e, 1);
    sp__emit_list_end(&e);
    std::vector<unsigned char> b = finish(&e);
    EXPECT_FALSE(load(b, &t, &err));
    // A list of something else than segment dicts (a pickled list of numbers or tuples) is no
    // legacy snapshot with a bad segment.
    EXPECT_EQ(err, "not a memory snapshot (a list whose item 0 is an int, not a segment dict)");
    tr_free(&t);

    EXPECT_FALSE(load({0x80, 4, 'N', '.'}, &t, &err));
    EXPECT_EQ(err, "not a memory snapshot (top level is not a dict)");
    tr_free(&t);

    char why[256];
    EXPECT_FALSE(tr_load("/nonexistent/x.pickle", &t, why, sizeof(why)));
    EXPECT_NE(std::string(why).find("cannot open"), std::string::npos);
    tr_free(&t);
}

// Mutated snapshots that still parse must load or be refused with a reason, never crash.
TEST_F(Replay, FuzzedSnapshotsLoadOrExplain) {
    std::vector<unsigned char> base = synthetic();
    uint64_t s = 0x12345678abcdefull;
    size_t loaded = 0, refused = 0;
    for (int iter = 0; iter < 3000; iter++) {
        std::vector<unsigned char> b = base;
        for (int m = 0; m < 1 + iter % 4; m++) {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            uint64_t r = s * 0x2545f4914f6cdd1dull;
            b[2 + (size_t)(r % (b.size() - 3))] = (unsigned char)(r >> 32);
        }
        pk_doc_t *doc = nullptr;
        char why[256] = "";
        if (!pk_parse(b.data(), b.size(), nullptr, &doc, why, sizeof(why)))
            continue;
        tr_trace_t t;
        if (tr_from_doc(doc, &t, why, sizeof(why))) {
            loaded++;
        } else {
            refused++;
            EXPECT_NE(why[0], '\0');
        }
        tr_free(&t);
    }
    EXPECT_GT(loaded, 0u);
    EXPECT_GT(refused, 0u);
}

// ---- JSON snapshots -----------------------------------------------------------------------

std::string json_parse(const std::string &text, pk_doc_t **doc_p = nullptr,
                       const char *skip_key = nullptr) {
    char *pk = nullptr;
    size_t len = 0;
    char err[256] = "";
    if (!sp_x_json_to_pickle_skip(text.data(), text.size(), skip_key, &pk, &len, err, sizeof(err)))
        return err;
    pk_doc_t *doc = nullptr;
    bool ok = pk_parse(pk, len, nullptr, &doc, err, sizeof(err));
    free(pk);
    if (!ok)
        return err;
    if (doc_p)
        *doc_p = doc;
    else
        pk_free(doc);
    return "";
}

TEST_F(Replay, JsonValuesTranslate) {
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(json_parse(" {\"a\": [1, -2, 9223372036854775807, 2.5e3, "
                         "true, false, null], \"s\": \"q\\\"\\\\\\/\\n\\u00e9\\ud83d\\ude00\", "
                         "\"e\": {}, \"l\": []} ",
                         &doc),
              "");
    const pk_value_t *root = pk_root(doc);
    const pk_value_t *a = pk_get(root, "a");
    ASSERT_EQ(pk_len(a), 7u);
    int64_t v = 0;
    EXPECT_TRUE(pk_int(pk_at(a, 1), &v));
    EXPECT_EQ(v, -2);
    EXPECT_TRUE(pk_int(pk_at(a, 2), &v));
    EXPECT_EQ(v, INT64_MAX);
    double d = 0;
    EXPECT_TRUE(pk_num(pk_at(a, 3), &d));
    EXPECT_EQ(d, 2500.0);
    EXPECT_EQ(pk_at(a, 4)->type, PK_BOOL);
    EXPECT_EQ(pk_at(a, 6)->type, PK_NONE);
    EXPECT_STREQ(pk_get_str(root, "s"), "q\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");
    EXPECT_EQ(pk_len(pk_get(root, "e")), 0u);
    EXPECT_EQ(pk_get(root, "l")->type, PK_LIST);
    pk_free(doc);
    // Unsigned 64-bit integers keep their value and signedness; wider ones are the int
    // json.load makes, as pickle.load reads it (a LONG of 9 bytes here), which only an
    // exact-integer consumer refuses (they were doubles: pk_num read them, unlike the pickle's).
    ASSERT_EQ(json_parse("[18446744073709551615, 9223372036854775808, -9223372036854775808, "
                         "1180591620717411303424]",
                         &doc),
              "");
    a = pk_root(doc);
    uint64_t u = 0;
    EXPECT_EQ(pk_at(a, 0)->type, PK_UINT);
    EXPECT_TRUE(pk_uint(pk_at(a, 0), &u));
    EXPECT_EQ(u, UINT64_MAX);
    EXPECT_FALSE(pk_int(pk_at(a, 0), &v)) << "2^64-1 does not fit int64";
    EXPECT_TRUE(pk_uint(pk_at(a, 1), &u));
    EXPECT_EQ(u, 1ull << 63);
    EXPECT_TRUE(pk_int(pk_at(a, 2), &v));
    EXPECT_EQ(v, INT64_MIN);
    EXPECT_FALSE(pk_int(pk_at(a, 3), &v));
    EXPECT_EQ(pk_at(a, 3)->type, PK_BIGINT);
    EXPECT_EQ(pk_at(a, 3)->u.bits, 9u);
    EXPECT_FALSE(pk_num(pk_at(a, 3), &d));
    pk_free(doc);
}

// Numbers as json.load reads them. Its grammar ends a number where RFC 8259's does, so "01",
// "1." and "1.e5" are refused at the character after the number (they were read as 1);
// NaN, Infinity, -Infinity and a float past the double range are floats (they were refused);
// an integer is exact up to Python's int() limit of 4300 digits and a float's text may be long
// (both refused past 511 bytes).
TEST_F(Replay, JsonNumbersAreWhatJsonLoadReads) {
    EXPECT_EQ(json_parse("01"), "json: trailing characters at offset 1");
    EXPECT_EQ(json_parse("-01"), "json: trailing characters at offset 2");
    EXPECT_EQ(json_parse("00"), "json: trailing characters at offset 1");
    EXPECT_EQ(json_parse("1."), "json: trailing characters at offset 1");
    EXPECT_EQ(json_parse("1.e5"), "json: trailing characters at offset 1");
    EXPECT_EQ(json_parse("[01]"), "json: expected ',' or ']' at offset 2");
    EXPECT_EQ(json_parse("[1e]"), "json: expected ',' or ']' at offset 2");
    EXPECT_EQ(json_parse("[1e+]"), "json: expected ',' or ']' at offset 2");
    EXPECT_EQ(json_parse("[-Infinity1]"), "json: expected ',' or ']' at offset 10");
    EXPECT_EQ(json_parse("-NaN"), "json: bad number at offset 0");
    EXPECT_EQ(json_parse("[Inf]"), "json: unexpected token at offset 1");
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(
        json_parse("[NaN, Infinity, -Infinity, 1e400, -1E+400, 1e-400, -0.0, 0e0, 1E+2]", &doc),
        "");
    const pk_value_t *a = pk_root(doc);
    double d[9];
    for (size_t i = 0; i < 9; i++) {
        ASSERT_EQ(pk_at(a, i)->type, PK_FLOAT) << i;
        d[i] = pk_at(a, i)->u.f;
    }
    EXPECT_TRUE(std::isnan(d[0]));
    EXPECT_EQ(d[1], HUGE_VAL);
    EXPECT_EQ(d[2], -HUGE_VAL);
    EXPECT_EQ(d[3], HUGE_VAL);
    EXPECT_EQ(d[4], -HUGE_VAL);
    EXPECT_EQ(d[5], 0.0);
    EXPECT_TRUE(d[6] == 0.0 && std::signbit(d[6]));
    EXPECT_EQ(d[7], 0.0);
    EXPECT_EQ(d[8], 100.0);
    pk_free(doc);
    // Integers of any width up to 4300 digits: the width of CPython's pickle of them.
    struct Wide {
        std::string text;
        uint64_t bytes;
    } wide[] = {{"18446744073709551616", 9},
                {"-18446744073709551616", 9},
                {"-9223372036854775809", 9},
                {std::string(4300, '9'), 1786},
                {"-" + std::string(4300, '9'), 1786}};
    for (const Wide &w : wide) {
        ASSERT_EQ(json_parse(w.text, &doc), "") << w.text.substr(0, 30);
        EXPECT_EQ(pk_root(doc)->type, PK_BIGINT);
        EXPECT_EQ(pk_root(doc)->u.bits, w.bytes) << w.text.substr(0, 30);
        pk_free(doc);
    }
    EXPECT_EQ(json_parse(std::string(4301, '9')),
              "json: integer of more than 4300 digits (Python's int() refuses it) at offset 0");
    ASSERT_EQ(json_parse("0." + std::string(600, '0') + "1", &doc), "");
    EXPECT_EQ(pk_root(doc)->u.f, 0.0);
    pk_free(doc);
    ASSERT_EQ(json_parse("1" + std::string(400, '0') + ".5", &doc), "");
    EXPECT_EQ(pk_root(doc)->u.f, HUGE_VAL);
    pk_free(doc);
}

// A real-shaped PyTorch snapshot whose C++ frames carry line 2^64-1 (LONG1, 9
// bytes), with a 2^70 field in one frame and signed extremes in the annotations, loads whole;
// the values are there with their signedness, and the replay runs as on the original file.
TEST_F(Replay, SnapshotWithUnsigned64BitIntegersLoads) {
    tr_trace_t t, orig;
    char err[256] = "";
    ASSERT_TRUE(tr_load((data_dir() + "/trace-small-u64.pickle").c_str(), &t, err, sizeof(err)))
        << err;
    ASSERT_TRUE(tr_load((data_dir() + "/trace-small-p4.pickle").c_str(), &orig, err, sizeof(err)))
        << err;
    const pk_value_t *f0 = pk_at(tr_frames(&t.dev[0], 0), 0);
    ASSERT_NE(f0, nullptr);
    const pk_value_t *line = pk_get(f0, "line");
    ASSERT_NE(line, nullptr);
    EXPECT_EQ(line->type, PK_UINT);
    uint64_t u = 0;
    int64_t i = 0;
    EXPECT_TRUE(pk_get_uint(f0, "line", &u));
    EXPECT_EQ(u, UINT64_MAX);
    EXPECT_FALSE(pk_get_int(f0, "line", &i)) << "refused where an int64 is needed";
    const pk_value_t *huge = pk_get(f0, "huge");
    ASSERT_NE(huge, nullptr);
    EXPECT_EQ(huge->type, PK_BIGINT);
    EXPECT_FALSE(pk_uint(huge, &u));
    double d;
    EXPECT_FALSE(pk_num(huge, &d));
    const pk_value_t *ann = pk_at(pk_get(t.root, "external_annotations"), 0);
    EXPECT_TRUE(pk_get_int(ann, "neg", &i));
    EXPECT_EQ(i, INT64_MIN);
    EXPECT_EQ(pk_get(ann, "negbig")->type, PK_BIGINT);
    // The same events as the original, so the same replay.
    ASSERT_EQ(t.dev[0].nev, orig.dev[0].nev);
    replay_result_t r1, r2;
    ASSERT_TRUE(replay_trace(&t, nullptr, &r1, err, sizeof(err))) << err;
    ASSERT_SP_OK(sp_shutdown());
    ASSERT_TRUE(replay_trace(&orig, nullptr, &r2, err, sizeof(err))) << err;
    EXPECT_EQ(r1.peak_reserved, r2.peak_reserved);
    EXPECT_EQ(r1.events, r2.events);
    tr_free(&t);
    tr_free(&orig);
}

// The events' times and stacks (tr_device_t.at) are kept by a load with stacks, as the file
// has them, and by no other: a load without stacks has the same events, with no times.
TEST_F(Replay, EventTimesAndStacksKeptOnlyWithStacks) {
    tr_trace_t with, without, json;
    char err[256] = "";
    std::string p = data_dir() + "/trace-small-p4.pickle";
    ASSERT_TRUE(tr_load_opts(p.c_str(), true, &with, err, sizeof(err))) << err;
    ASSERT_TRUE(tr_load_opts(p.c_str(), false, &without, err, sizeof(err))) << err;
    const tr_device_t &a = with.dev[0], &b = without.dev[0];
    ASSERT_EQ(a.nev, b.nev);
    ASSERT_NE(a.at, nullptr);
    EXPECT_EQ(b.at, nullptr);
    size_t timed = 0, stacked = 0;
    for (size_t i = 0; i < a.nev; i++) {
        EXPECT_EQ(a.ev[i].action, b.ev[i].action) << i;
        EXPECT_EQ(a.ev[i].addr, b.ev[i].addr) << i;
        EXPECT_EQ(a.ev[i].size, b.ev[i].size) << i;
        EXPECT_EQ(a.ev[i].stream, b.ev[i].stream) << i;
        EXPECT_EQ(a.ev[i].flags, b.ev[i].flags) << i;
        EXPECT_EQ(tr_time_us(&b, i), 0) << i;
        EXPECT_EQ(tr_frames(&b, i), nullptr) << i;
        timed += tr_time_us(&a, i) > 0;
        stacked += tr_frames(&a, i) != nullptr;
    }
    EXPECT_EQ(timed, a.nev);
    EXPECT_GT(stacked, 0u);
    tr_free(&with);
    tr_free(&without);
    // A JSON snapshot's times, each the one its entry holds.
    ASSERT_TRUE(tr_load((data_dir() + "/trace-times-tiny.json").c_str(), &json, err, sizeof(err)))
        << err;
    ASSERT_GE(json.dev[0].nev, 4u);
    EXPECT_EQ(tr_time_us(&json.dev[0], 0), 1783874495850100);
    EXPECT_EQ(tr_time_us(&json.dev[0], 1), 1783874495850103);
    EXPECT_EQ(tr_time_us(&json.dev[0], 3), 1783874495850237);
    tr_free(&json);
}

// What json.load accepts in a string escape and Python's str can hold, U+0000 and lone
// surrogates (a high one not followed by an escaped low one, a low one alone), loads as the str
// json.load makes, held as CPython's pickler writes it (a 0 byte, 'surrogatepass'); they were
// refused ("NUL in string", "lone surrogate").
TEST_F(Replay, JsonNulAndLoneSurrogatesAreTheStrJsonLoadMakes) {
    struct Case {
        const char *json;
        std::string bytes; // the str's UTF-8 ('surrogatepass') bytes
    } cases[] = {
        {"\"a\\u0000b\"", std::string("a\0b", 3)},
        {"\"\\u0000\"", std::string("\0", 1)},
        {"\"\\ud800\"", "\xed\xa0\x80"},
        {"\"\\udc00x\"", "\xed\xb0\x80x"},
        {"\"\\ud800\\u0041\"", "\xed\xa0\x80"
                               "A"},
        {"\"\\ud800\\ud800\\udc00\"", "\xed\xa0\x80\xf0\x90\x80\x80"},
        {"\"\\udbff\\n\"", "\xed\xaf\xbf\n"},
        {"\"\\udc00\\ud800\"", "\xed\xb0\x80\xed\xa0\x80"},
        {"\"\\uD83D\\uDE00\"", "\xf0\x9f\x98\x80"},
    };
    for (const Case &c : cases) {
        pk_doc_t *doc = nullptr;
        ASSERT_EQ(json_parse(c.json, &doc), "") << c.json;
        const pk_value_t *v = pk_root(doc);
        ASSERT_EQ(v->type, PK_STR) << c.json;
        EXPECT_EQ(std::string(v->u.str.s, v->u.str.len), c.bytes) << c.json;
        pk_free(doc);
    }
    // As a key too: a dict key "k\0" is not the key "k".
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(json_parse("{\"k\\u0000\": 1, \"k\": 2}", &doc), "");
    int64_t v = 0;
    EXPECT_TRUE(pk_get_int(pk_root(doc), "k", &v));
    EXPECT_EQ(v, 2);
    EXPECT_EQ(pk_len(pk_root(doc)), 2u);
    pk_free(doc);
}

TEST_F(Replay, JsonErrorsNameOffsets) {
    EXPECT_EQ(json_parse(""), "json: truncated input at offset 0");
    EXPECT_EQ(json_parse("{\"a\" 1}"), "json: expected ':' at offset 5");
    EXPECT_EQ(json_parse("[1,]"), "json: bad number at offset 3");
    EXPECT_EQ(json_parse("[1 2]"), "json: expected ',' or ']' at offset 3");
    EXPECT_EQ(json_parse("{1:2}"), "json: expected a string key at offset 1");
    EXPECT_EQ(json_parse("\"abc"), "json: unterminated string at offset 4");
    // A second escape after a high surrogate is read whole, pair or not (as json.load does).
    EXPECT_EQ(json_parse("\"\\ud800\\u12zz\""), "json: bad \\u escape at offset 12");
    // Raw bytes that are not UTF-8 (RFC 8259 8.1; Python's json.load refuses them) were read
    // as '?' (the emitter's replacement): a name misread, never refused. Valid ones load.
    EXPECT_EQ(json_parse("\"a\xff\""), "json: not UTF-8 at offset 2");
    EXPECT_EQ(json_parse("[\"ab\xc3\"]"), "json: not UTF-8 at offset 4");
    EXPECT_EQ(json_parse("\"\xc0\x80\""), "json: not UTF-8 at offset 1");
    EXPECT_EQ(json_parse("\"\xed\xa0\x80\""), "json: not UTF-8 at offset 1"); // a surrogate
    EXPECT_EQ(json_parse("\"\xf4\x90\x80\x80\""), "json: not UTF-8 at offset 1");
    EXPECT_EQ(json_parse("\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""), "");
    EXPECT_EQ(json_parse("[tru]"), "json: unexpected token at offset 1");
    EXPECT_EQ(json_parse("[1] x"), "json: trailing characters at offset 4");
    // Beyond 64 bits is not an error: an int of any width (JsonNumbersAreWhatJsonLoadReads).
    EXPECT_EQ(json_parse("99999999999999999999"), "");
    EXPECT_EQ(json_parse(std::string(40, '[') + std::string(40, ']')), "");
}

// Values under the skipped key, at any depth, are written as empty lists; every other value is
// as without skipping; and what is malformed inside a skipped value is refused with the same
// message at the same offset (replay without stacks reads JSON so: it must refuse what
// json.load refuses).
TEST_F(Replay, JsonSkippedValuesAreCheckedAndWrittenEmpty) {
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(json_parse("{\"a\": 1, \"frames\": [{\"name\": \"x\", \"line\": 3}], \"b\": "
                         "{\"frames\": \"s\", \"c\": [1, {\"frames\": {\"d\": [true, null, 1.5e3, "
                         "-7, 99999999999999999999, NaN]}}]}, \"frame\": [2], \"z\": \"q\"}",
                         &doc, "frames"),
              "");
    const pk_value_t *root = pk_root(doc);
    int64_t v = 0;
    EXPECT_TRUE(pk_int(pk_get(root, "a"), &v));
    EXPECT_EQ(v, 1);
    const pk_value_t *f = pk_get(root, "frames");
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->type, PK_LIST);
    EXPECT_EQ(pk_len(f), 0u);
    const pk_value_t *b = pk_get(root, "b");
    EXPECT_EQ(pk_get(b, "frames")->type, PK_LIST);
    EXPECT_EQ(pk_len(pk_get(b, "frames")), 0u);
    const pk_value_t *c = pk_get(b, "c");
    ASSERT_EQ(pk_len(c), 2u);
    EXPECT_EQ(pk_len(pk_get(pk_at(c, 1), "frames")), 0u);
    EXPECT_EQ(pk_len(pk_get(root, "frame")), 1u) << "only the key itself is skipped";
    EXPECT_STREQ(pk_get_str(root, "z"), "q");
    pk_free(doc);
    const char *bad[] = {"{\"frames\": [1,]}",
                         "{\"frames\": \"a\xff\"}",
                         "{\"frames\": [tru]}",
                         "{\"frames\": {\"x\" 1}}",
                         "{\"frames\": [",
                         "{\"frames\": \"tab\there\"}",
                         "{\"frames\": 01}",
                         "{\"frames\": [1] x}",
                         "{\"frames\": {\"frames\": [}]}}",
                         "{\"frames\": \"\\ud800\\u12zz\"}"};
    for (const char *text : bad) {
        std::string whole = json_parse(text);
        EXPECT_NE(whole, "") << text;
        EXPECT_EQ(json_parse(text, nullptr, "frames"), whole) << text;
    }
    std::string deep = "{\"frames\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
    EXPECT_EQ(json_parse(deep, nullptr, "frames"), json_parse(deep));
    EXPECT_NE(json_parse(deep), "");
}

// Strings are read sixteen bytes at a time up to the first byte that needs work: a quote, an
// escape, a control character or a multi-byte sequence at every position of the first chunks
// reads as the byte loop reads it, and an error there names its own offset.
TEST_F(Replay, JsonStringsAreReadAlikeWhereverTheirSpecialBytesFall) {
    for (size_t at = 0; at < 40; at++) {
        std::string head(at, 'a'), tail(45 - at, 'b');
        struct {
            std::string raw, decoded;
        } cases[] = {{"\\n", "\n"},
                     {"\\\"", "\""},
                     {"\\u00e9", "\xc3\xa9"},
                     {"\xc3\xa9", "\xc3\xa9"},
                     {"\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80"},
                     {"~\x7f", "~\x7f"}};
        for (auto &k : cases) {
            pk_doc_t *doc = nullptr;
            ASSERT_EQ(json_parse("[\"" + head + k.raw + tail + "\"]", &doc), "") << at;
            const pk_value_t *str = pk_at(pk_root(doc), 0);
            ASSERT_EQ(str->type, PK_STR);
            EXPECT_EQ(std::string(str->u.str.s, str->u.str.len), head + k.decoded + tail) << at;
            pk_free(doc);
        }
        EXPECT_EQ(json_parse("[\"" + head + "\x01" + tail + "\"]"),
                  "json: control character in string at offset " + std::to_string(at + 2));
        EXPECT_EQ(json_parse("[\"" + head + "\xff" + tail + "\"]"),
                  "json: not UTF-8 at offset " + std::to_string(at + 2));
        EXPECT_EQ(json_parse("[\"" + head),
                  "json: unterminated string at offset " + std::to_string(at + 2));
    }
}

// json.load reads nesting as deep as its recursion guard lets it (about 1,000 levels in 3.11,
// thousands in 3.12 and 3.13, tens of thousands in 3.14): all of that is read here, and the
// pickle it becomes too; 100,000 levels and beyond are refused, at once, whatever follows (a
// file of nothing but '[' is a short error, not a stack overflow).
TEST_F(Replay, JsonNestsAsDeepAsJsonLoad) {
    const size_t deepest = 100000;
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(json_parse(std::string(deepest, '[') + "7" + std::string(deepest, ']'), &doc), "");
    const pk_value_t *v = pk_root(doc);
    size_t depth = 0;
    while (v->type == PK_LIST && v->u.seq.n == 1) {
        v = v->u.seq.items[0];
        depth++;
    }
    EXPECT_EQ(depth, deepest);
    EXPECT_EQ(v->type, PK_INT);
    pk_free(doc);
    // Objects, with a sibling after each closing: the loop goes on in the right container.
    std::string obj;
    for (int i = 0; i < 5000; i++)
        obj += "{\"a\": ";
    obj += "[]";
    for (int i = 0; i < 5000; i++)
        obj += ", \"b\": 1}";
    ASSERT_EQ(json_parse(obj, &doc), "");
    v = pk_root(doc);
    depth = 0;
    while (v->type == PK_DICT && v->u.seq.n == 4) {
        EXPECT_EQ(v->u.seq.items[3]->type, PK_INT);
        v = v->u.seq.items[1];
        depth++;
    }
    EXPECT_EQ(depth, 5000u);
    EXPECT_EQ(v->type, PK_LIST);
    pk_free(doc);
    EXPECT_EQ(json_parse(std::string(deepest + 1, '[') + std::string(deepest + 1, ']')),
              "json: nesting deeper than 100000 levels (json.load refuses it) at offset 100000");
    EXPECT_EQ(json_parse(std::string((size_t)20 << 20, '[')),
              "json: nesting deeper than 100000 levels (json.load refuses it) at offset 100000");
    EXPECT_EQ(json_parse(std::string(1000, '[')), "json: truncated input at offset 1000");
    EXPECT_EQ(json_parse("[[1,[]],2"), "json: expected ',' or ']' at offset 9");
    EXPECT_EQ(json_parse("{\"a\":{}, }"), "json: expected a string key at offset 9");
}

TEST_F(Replay, JsonSnapshotLoadsLikeThePickle) {
    ASSERT_SP_OK([] {
        sp_history_params_t p;
        sp_history_params_init(&p);
        return sp_record_memory_history(&p);
    }());
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_malloc(3000, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(12 * MiB, 0, nullptr, &b));
    ASSERT_SP_OK(sp_free(a));
    char dir[] = "/tmp/sp_replay_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string pj = std::string(dir) + "/s.json", pp = std::string(dir) + "/s.pickle";
    ASSERT_SP_OK(sp_dump_snapshot(pj.c_str()));
    ASSERT_SP_OK(sp_dump_snapshot(pp.c_str()));
    tr_trace_t tj, tp;
    char e1[256] = "", e2[256] = "";
    ASSERT_TRUE(tr_load(pj.c_str(), &tj, e1, sizeof(e1))) << e1;
    ASSERT_TRUE(tr_load(pp.c_str(), &tp, e2, sizeof(e2))) << e2;
    EXPECT_EQ(tj.nsegments, tp.nsegments);
    EXPECT_EQ(tj.dev[0].final_reserved, tp.dev[0].final_reserved);
    EXPECT_EQ(tj.dev[0].peak_reserved, tp.dev[0].peak_reserved);
    // The pickle was written one snapshot later: one more `snapshot` entry.
    EXPECT_EQ(tj.dev[0].nev + 1, tp.dev[0].nev);
    for (size_t i = 0; i < tj.dev[0].nev; i++) {
        EXPECT_EQ(tj.dev[0].ev[i].action, tp.dev[0].ev[i].action) << i;
        EXPECT_EQ(tj.dev[0].ev[i].addr, tp.dev[0].ev[i].addr) << i;
        EXPECT_EQ(tj.dev[0].ev[i].size, tp.dev[0].ev[i].size) << i;
    }
    tr_free(&tj);
    tr_free(&tp);
    // A mutated JSON file is refused with a reason or loads; it never crashes.
    std::ifstream f(pj);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    uint64_t s = 42;
    for (int iter = 0; iter < 1500; iter++) {
        std::string m = text;
        for (int k = 0; k < 1 + iter % 3; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            m[(size_t)(s >> 33) % m.size()] = "{}[],:\"0a-e\\ "[(s >> 20) % 14];
        }
        char *pk = nullptr;
        size_t len = 0;
        char err[256] = "";
        if (sp_x_json_to_pickle(m.data(), m.size(), &pk, &len, err, sizeof(err))) {
            pk_doc_t *doc = nullptr;
            if (pk_parse(pk, len, nullptr, &doc, err, sizeof(err)))
                pk_free(doc);
            free(pk);
        } else {
            ASSERT_NE(strstr(err, "at offset"), nullptr) << err;
        }
    }
    unlink(pj.c_str());
    unlink(pp.c_str());
    rmdir(dir);
    ASSERT_SP_OK(sp_free(b));
}

TEST_F(Replay, RealForwardTraceStaysWithinPyTorchsReserved) {
    const char *dd = getenv("SP_TEST_DATA_DIR");
    std::string path =
        std::string(dd ? dd : SP_TEST_DATA_DIR_DEFAULT) + "/cs336-2.7b-ctx128-forward-bf16.pickle";
    tr_trace_t t;
    char why[256] = "";
    ASSERT_TRUE(tr_load(path.c_str(), &t, why, sizeof(why))) << why;
    EXPECT_EQ(t.dev[0].nev, 5992u);
    EXPECT_EQ(t.dev[0].peak_reserved, 24245174272ull); // sum of the final segments
    replay_result_t r;
    ASSERT_TRUE(replay_trace(&t, nullptr, &r, why, sizeof(why))) << why;
    EXPECT_EQ(r.allocs, 2703u);
    EXPECT_EQ(r.frees, 1414u);
    EXPECT_EQ(r.skipped_frees, 0u);
    EXPECT_EQ((uint64_t)r.peak_requested, r.trace_peak_requested);
    EXPECT_LE((uint64_t)r.peak_reserved, r.pytorch_peak_reserved);
    tr_free(&t);
}

} // namespace

namespace {

// A general synthetic snapshot: segments (with a pool id and stream), events with streams, and
// allocator_settings.
struct SBlock {
    uint64_t size, req;
    const char *state;
};
struct SSeg {
    uint64_t addr, size, stream, pool;
    const char *type;
    std::vector<SBlock> blocks;
    bool expandable = false;
};
struct SEv {
    const char *action;
    uint64_t addr, size, stream;
    int64_t pool = -1; // >= 0: the entry names its pool (0, pool), as newer PyTorch writes
};

std::vector<unsigned char> snapshot_of(const std::vector<SSeg> &segs, const std::vector<SEv> &evs,
                                       const char *conf, bool expandable) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_dict_begin(&e);
    sp__emit_key(&e, "segments");
    sp__emit_list_begin(&e);
    for (const SSeg &s : segs) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "device");
        sp__emit_int(&e, 0);
        sp__emit_key(&e, "address");
        sp__emit_uint(&e, s.addr);
        sp__emit_key(&e, "total_size");
        sp__emit_uint(&e, s.size);
        sp__emit_key(&e, "stream");
        sp__emit_uint(&e, s.stream);
        sp__emit_key(&e, "segment_type");
        sp__emit_str(&e, s.type);
        sp__emit_key(&e, "segment_pool_id");
        sp__emit_list_begin(&e);
        sp__emit_int(&e, 0);
        sp__emit_uint(&e, s.pool);
        sp__emit_list_end(&e);
        sp__emit_key(&e, "is_expandable");
        sp__emit_bool(&e, s.expandable);
        sp__emit_key(&e, "blocks");
        sp__emit_list_begin(&e);
        uint64_t a = s.addr;
        for (const SBlock &b : s.blocks) {
            emit_block(&e, a, b.size, b.req, b.state);
            a += b.size;
        }
        sp__emit_list_end(&e);
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    sp__emit_key(&e, "device_traces");
    sp__emit_list_begin(&e);
    sp__emit_list_begin(&e);
    for (const SEv &ev : evs) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "action");
        sp__emit_str(&e, ev.action);
        sp__emit_key(&e, "addr");
        sp__emit_uint(&e, ev.addr);
        sp__emit_key(&e, "size");
        sp__emit_uint(&e, ev.size);
        sp__emit_key(&e, "stream");
        sp__emit_uint(&e, ev.stream);
        if (ev.pool >= 0) {
            sp__emit_key(&e, "pool_id");
            sp__emit_list_begin(&e);
            sp__emit_int(&e, 0);
            sp__emit_int(&e, ev.pool);
            sp__emit_list_end(&e);
        }
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    sp__emit_list_end(&e);
    sp__emit_key(&e, "allocator_settings");
    sp__emit_dict_begin(&e);
    sp__emit_key(&e, "PYTORCH_CUDA_ALLOC_CONF");
    sp__emit_str(&e, conf);
    sp__emit_key(&e, "max_split_size");
    sp__emit_int(&e, -1);
    sp__emit_key(&e, "expandable_segments");
    sp__emit_bool(&e, expandable);
    sp__emit_dict_end(&e);
    sp__emit_dict_end(&e);
    return finish(&e);
}

constexpr uint64_t S1 = 0x1000;           // a recorded side stream
constexpr uint64_t X = 0x7e0000000000ull; // addresses of segments made in the trace

// Ten streams, each allocating 30 MiB blocks in its own segments, then the user's empty_cache
// between two rounds: PyTorch peaked at one round's segments (10 x 30 MiB), because the
// empty_cache released the first round's before the second. Without replaying the empty_cache
// the second round (on new streams' cached blocks of other sizes) would add its own.
TEST_F(Replay, EmptyCacheRunsAreReplayed) {
    std::vector<SEv> evs;
    for (int round = 0; round < 2; round++) {
        uint64_t sz = round == 0 ? 30 * MiB : 40 * MiB;
        for (uint64_t s = 1; s <= 10; s++) {
            uint64_t a = X + (uint64_t)round * (1ull << 32) + s * (64 * MiB);
            evs.push_back({"segment_alloc", a, sz, s * 0x100});
            evs.push_back({"alloc", a, sz, s * 0x100});
        }
        for (uint64_t s = 1; s <= 10; s++) {
            uint64_t a = X + (uint64_t)round * (1ull << 32) + s * (64 * MiB);
            evs.push_back({"free_requested", a, sz, s * 0x100});
            evs.push_back({"free_completed", a, sz, s * 0x100});
        }
        for (uint64_t s = 1; s <= 10; s++)
            evs.push_back({"segment_free", X + (uint64_t)round * (1ull << 32) + s * (64 * MiB), sz,
                           s * 0x100});
    }
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(snapshot_of({}, evs, "", false), &t, &err)) << err;
    EXPECT_EQ(t.dev[0].empty_cache_runs, 2u);
    EXPECT_EQ(t.dev[0].nstreams, 11u); // ten and the default stream
    EXPECT_EQ(t.dev[0].peak_reserved, 400 * MiB);
    replay_result_t r;
    char why[256] = "";
    ASSERT_TRUE(replay_trace(&t, nullptr, &r, why, sizeof(why))) << why;
    EXPECT_EQ(r.empty_caches, 2u);
    EXPECT_EQ(r.device_frees, 20);
    EXPECT_EQ((uint64_t)r.peak_reserved, r.pytorch_peak_reserved);
    EXPECT_EQ(r.end_reserved, 0);
    tr_free(&t);
}

// Which free_requested entries wait for a later free_completed, around frees completed at once
// (the next entry), which the analysis takes as one step: a later completion of the same address,
// a completion at once between a deferred free and its own, two requests before two completions.
TEST_F(Replay, FreesCompletedAtOnceLeaveTheDeferredOnesDeferred) {
    const uint64_t A = X, B = X + 64 * MiB, C = X + 128 * MiB, sz = 1 * MiB;
    struct Case {
        const char *what;
        std::vector<SEv> evs;
        size_t deferred;
    };
    const std::vector<Case> cases = {
        {"a deferred free around a pair completed at once",
         {{"alloc", A, sz, S1},
          {"free_requested", A, sz, S1},
          {"alloc", B, sz, 0},
          {"free_requested", B, sz, 0},
          {"free_completed", B, sz, 0},
          {"free_completed", A, sz, S1}},
         1},
        {"a pair, then a second completion of its address",
         {{"alloc", A, sz, 0},
          {"free_requested", A, sz, 0},
          {"free_completed", A, sz, 0},
          {"alloc", B, sz, 0},
          {"free_completed", A, sz, 0},
          {"free_requested", B, sz, 0},
          {"free_completed", B, sz, 0}},
         0},
        {"two requests, then two completions",
         {{"alloc", A, sz, 0},
          {"free_requested", A, sz, 0},
          {"free_requested", A, sz, 0},
          {"free_completed", A, sz, 0},
          {"free_completed", A, sz, 0}},
         0},
        {"pairs of blocks live before the trace, one completed after an allocation",
         {{"free_requested", A, sz, 0},
          {"free_completed", A, sz, 0},
          {"free_requested", B, sz, 0},
          {"alloc", C, sz, 0},
          {"free_completed", B, sz, 0}},
         1},
    };
    for (const Case &c : cases) {
        tr_trace_t t;
        std::string err;
        ASSERT_TRUE(load(snapshot_of({}, c.evs, "", false), &t, &err)) << c.what << ": " << err;
        EXPECT_EQ(t.dev[0].deferred_frees, c.deferred) << c.what;
        size_t flagged = 0;
        for (size_t i = 0; i < t.dev[0].nev; i++)
            flagged += (t.dev[0].ev[i].flags & TR_F_DEFERRED) != 0;
        EXPECT_EQ(flagged, c.deferred) << c.what;
        tr_free(&t);
    }
}

// A block used on another stream: PyTorch's free_completed comes later (after the next
// allocation), so that allocation cannot reuse it and needs a segment of its own.
TEST_F(Replay, DeferredFreesWaitForTheirCompletion) {
    const std::vector<SEv> evs = {{"segment_alloc", X, 20 * MiB, S1},
                                  {"alloc", X, 20 * MiB, S1},
                                  {"free_requested", X, 20 * MiB, S1},
                                  {"segment_alloc", X + 64 * MiB, 20 * MiB, S1},
                                  {"alloc", X + 64 * MiB, 20 * MiB, S1},
                                  {"free_completed", X, 20 * MiB, S1},
                                  {"alloc", X, 20 * MiB, S1},
                                  {"free_requested", X, 20 * MiB, S1},
                                  {"free_completed", X, 20 * MiB, S1},
                                  {"free_requested", X + 64 * MiB, 20 * MiB, S1},
                                  {"free_completed", X + 64 * MiB, 20 * MiB, S1}};
    const std::vector<SSeg> segs = {
        {X, 20 * MiB, S1, 0, "large", {{20 * MiB, 0, "inactive"}}},
        {X + 64 * MiB, 20 * MiB, S1, 0, "large", {{20 * MiB, 0, "inactive"}}}};
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(snapshot_of(segs, evs, "", false), &t, &err)) << err;
    EXPECT_EQ(t.dev[0].deferred_frees, 1u);
    EXPECT_EQ(t.dev[0].nstart, 0u);
    replay_result_t r;
    char why[256] = "";
    ASSERT_TRUE(replay_trace(&t, nullptr, &r, why, sizeof(why))) << why;
    EXPECT_EQ(r.deferred_frees, 1u);
    EXPECT_EQ(r.device_allocs, 2); // an immediate free would have let the second reuse the first
    EXPECT_EQ((uint64_t)r.peak_reserved, r.pytorch_peak_reserved);
    tr_free(&t);
}

// A trace that records its frees as free_completed only (no free_requested: other tools write
// them so, and MemoryViz ends a block there): each ends the block an alloc of the trace made, so
// the replay frees it. A completion whose block no alloc of the trace made (its request fell off
// a full ring) and the completion of a requested free stay what they were.
TEST_F(Replay, CompletionsWithoutRequestsAreTheFrees) {
    const uint64_t A = X, B = X + 64 * MiB;
    const std::vector<SEv> evs = {
        {"free_completed", B, 512, 0}, // its request is not in the trace
        {"segment_alloc", A, 20 * MiB, 0},  {"alloc", A, 20 * MiB, 0},
        {"free_completed", A, 20 * MiB, 0}, {"alloc", A, 20 * MiB, 0},
        {"free_completed", A, 20 * MiB, 0}, {"alloc", A, 20 * MiB, 0},
        {"free_requested", A, 20 * MiB, 0}, {"free_completed", A, 20 * MiB, 0}};
    const std::vector<SSeg> segs = {{A, 20 * MiB, 0, 0, "large", {{20 * MiB, 0, "inactive"}}}};
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(snapshot_of(segs, evs, "", false), &t, &err)) << err;
    const tr_device_t &d = t.dev[0];
    EXPECT_EQ(d.completion_frees, 2u);
    const tr_action_t want[] = {TR_FREE_COMPLETED, TR_SEGMENT_ALLOC,  TR_ALLOC,
                                TR_FREE_REQUESTED, TR_ALLOC,          TR_FREE_REQUESTED,
                                TR_ALLOC,          TR_FREE_REQUESTED, TR_FREE_COMPLETED};
    ASSERT_EQ(d.nev, sizeof(want) / sizeof(want[0]));
    for (size_t i = 0; i < d.nev; i++) {
        EXPECT_EQ(d.ev[i].action, want[i]) << i;
        EXPECT_EQ((d.ev[i].flags & TR_F_COMPLETION) != 0, i == 3 || i == 5) << i;
    }
    EXPECT_EQ(d.nseeds, 0u);
    EXPECT_EQ(d.deferred_frees, 0u);
    EXPECT_EQ(d.peak_requested, 20 * MiB); // not 60 MiB: each block is gone before the next
    EXPECT_EQ(d.peak_reserved, 20 * MiB);
    replay_result_t r;
    char why[256] = "";
    ASSERT_TRUE(replay_trace(&t, nullptr, &r, why, sizeof(why))) << why;
    EXPECT_EQ(r.frees, 3u);
    EXPECT_EQ(r.device_allocs, 1); // every alloc reuses the one segment
    EXPECT_EQ((uint64_t)r.peak_reserved, r.pytorch_peak_reserved);
    EXPECT_EQ(r.end_allocated, 0);
    tr_free(&t);
}

// A block of the starting state that kept a remainder PyTorch did not split off (3 MiB for a
// 2 MiB request: 1 MiB or less is not split in the large pool) is rebuilt at its size, so the
// blocks after it lie where they lay and the segment's free tail is the recorded 13 MiB: a
// 13.5 MiB request then needs a segment of its own, as it did. Rebuilt from the request alone,
// the first block came out 2 MiB and the tail 14 MiB, which took the request.
TEST_F(Replay, StartBlocksKeepTheRemainderPyTorchKept) {
    const uint64_t A = X, B = X + 64 * MiB, big = 13 * MiB + MiB / 2;
    const std::vector<SSeg> segs = {
        {A,
         20 * MiB,
         0,
         0,
         "large",
         {{3 * MiB, 2 * MiB, "active_allocated"},
          {4 * MiB, 4 * MiB, "active_allocated"},
          {13 * MiB, 0, "inactive"}}},
        {B, 14 * MiB, 0, 0, "large", {{14 * MiB, big, "active_allocated"}}}};
    const std::vector<SEv> evs = {{"segment_alloc", B, 14 * MiB, 0}, {"alloc", B, big, 0}};
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(snapshot_of(segs, evs, "", false), &t, &err)) << err;
    ASSERT_EQ(t.dev[0].nstart, 1u);
    EXPECT_EQ(t.dev[0].final_allocated, 21 * MiB);
    replay_result_t r;
    char why[256] = "";
    ASSERT_TRUE(replay_trace(&t, nullptr, &r, why, sizeof(why))) << why;
    EXPECT_EQ(r.start_blocks, 2u);
    EXPECT_EQ(r.pytorch_peak_reserved, 34 * MiB);
    EXPECT_EQ((uint64_t)r.peak_reserved, r.pytorch_peak_reserved);
    EXPECT_EQ((uint64_t)r.end_allocated, r.pytorch_end_allocated); // 3 + 4 + 14 MiB
    EXPECT_EQ(r.peak_requested, (int64_t)(6 * MiB + big));         // the recorded requests
    tr_free(&t);
}

// Blocks live at the start that the trace frees, each rebuilt at the size the trace shows: an
// alloc while the block is live, 1 MiB or less past its rounded request and first in that
// stretch, shows the block held up to it. Four blocks, four cases: the alloc across a 1 MiB
// boundary from the rounded end (the block grows to it), the alloc after the block's free (no
// sign), an alloc exactly at the rounded end (nothing kept), and one inside the same 1 MiB (the
// block grows). Pinned as the kept-remainder pass answers them when it looks allocs up by 1 MiB
// bucket rather than in a sorted list of every alloc.
TEST_F(Replay, StartBlocksKeptRemaindersFromLaterAllocs) {
    const uint64_t B1 = X, B2 = X + 8 * MiB, B3 = X + 16 * MiB, B4 = X + 24 * MiB;
    const uint64_t A1 = B1 + 4 * MiB + 256 * 1024, A2 = B2 + 2 * MiB + 512 + 4096,
                   A3 = B3 + 2 * MiB, A4 = B4 + 2 * MiB + 512 * 1024;
    const std::vector<SSeg> segs = {{X, 64 * MiB, 0, 0, "large", {{64 * MiB, 0, "inactive"}}}};
    const std::vector<SEv> evs = {{"free_requested", B2, 2 * MiB + 100, 0},
                                  {"free_completed", B2, 2 * MiB + 100, 0},
                                  {"alloc", A1, MiB, 0},
                                  {"alloc", A3, MiB, 0},
                                  {"alloc", A4, MiB, 0},
                                  {"alloc", A2, MiB, 0},
                                  {"free_requested", B1, 3 * MiB + MiB / 2, 0},
                                  {"free_completed", B1, 3 * MiB + MiB / 2, 0},
                                  {"free_requested", B3, 2 * MiB, 0},
                                  {"free_completed", B3, 2 * MiB, 0},
                                  {"free_requested", B4, 2 * MiB, 0},
                                  {"free_completed", B4, 2 * MiB, 0},
                                  {"free_requested", A1, MiB, 0},
                                  {"free_completed", A1, MiB, 0},
                                  {"free_requested", A2, MiB, 0},
                                  {"free_completed", A2, MiB, 0},
                                  {"free_requested", A3, MiB, 0},
                                  {"free_completed", A3, MiB, 0},
                                  {"free_requested", A4, MiB, 0},
                                  {"free_completed", A4, MiB, 0}};
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(snapshot_of(segs, evs, "", false), &t, &err)) << err;
    const tr_device_t &d = t.dev[0];
    ASSERT_EQ(d.nstart, 1u);
    ASSERT_EQ(d.nsblocks, 4u);
    EXPECT_EQ(d.sblocks[0].addr, B1);
    EXPECT_EQ(d.sblocks[0].size, A1 - B1);       // 4.25 MiB: the alloc past the 1 MiB boundary
    EXPECT_EQ(d.sblocks[1].size, 2 * MiB + 512); // the alloc came after its free
    EXPECT_EQ(d.sblocks[2].size, 2 * MiB);       // the alloc at its rounded end
    EXPECT_EQ(d.sblocks[3].size, A4 - B4);       // 2.5 MiB
    EXPECT_EQ(d.sblocks[1].req, 2 * MiB + 100);
    tr_free(&t);
}

// A private pool's segment existed before the trace; allocations at its addresses go to a pool
// of ours (not the default pool's cached segment of the same size).
TEST_F(Replay, PrivatePoolsAreRoutedByAddress) {
    const uint64_t P = 0x7d0000000000ull, D = 0x7c0000000000ull;
    const std::vector<SSeg> segs = {{D, 20 * MiB, 0, 0, "large", {{20 * MiB, 0, "inactive"}}},
                                    {P, 20 * MiB, 0, 1, "large", {{20 * MiB, 0, "inactive"}}}};
    const std::vector<SEv> evs = {
        {"alloc", P, 16 * MiB, 0},          {"alloc", D, 16 * MiB, 0},
        {"free_requested", P, 16 * MiB, 0}, {"free_completed", P, 16 * MiB, 0},
        {"free_requested", D, 16 * MiB, 0}, {"free_completed", D, 16 * MiB, 0}};
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(snapshot_of(segs, evs, "", false), &t, &err)) << err;
    ASSERT_EQ(t.dev[0].npools, 1u);
    EXPECT_EQ(t.dev[0].pools[0].second, 1u);
    EXPECT_EQ(t.dev[0].nstart, 2u);
    EXPECT_EQ(t.dev[0].ev[0].pool, 1u);
    EXPECT_EQ(t.dev[0].ev[1].pool, 0u);
    replay_result_t r;
    char why[256] = "";
    ASSERT_TRUE(replay_trace(&t, nullptr, &r, why, sizeof(why))) << why;
    // Both requests fit their own pool's cached segment: nothing new is reserved.
    EXPECT_EQ(r.device_allocs, 0);
    EXPECT_EQ(r.peak_reserved, (int64_t)(40 * MiB));
    tr_free(&t);
}

// A MemPool whose segments are all gone by the end (made and released in the trace): newer
// snapshots name each entry's pool, and its allocation goes to a pool of ours, not to the default
// pool's cached segment that would fit it. Its release (only its segments) leaves the default
// pool's cache alone.
TEST_F(Replay, PrivatePoolWithoutFinalSegmentsIsRoutedByItsId) {
    const uint64_t P = 0x7d0000000000ull, D = 0x7c0000000000ull;
    const std::vector<SSeg> segs = {{D, 20 * MiB, 0, 0, "large", {{20 * MiB, 0, "inactive"}}}};
    const std::vector<SEv> evs = {
        {"segment_alloc", P, 16 * MiB, 0, 1},  {"alloc", P, 16 * MiB, 0, 1},
        {"free_requested", P, 16 * MiB, 0, 1}, {"free_completed", P, 16 * MiB, 0, 1},
        {"segment_free", P, 16 * MiB, 0, 1},   {"alloc", D, 16 * MiB, 0, 0},
        {"free_requested", D, 16 * MiB, 0, 0}, {"free_completed", D, 16 * MiB, 0, 0}};
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(snapshot_of(segs, evs, "", false), &t, &err)) << err;
    ASSERT_EQ(t.dev[0].npools, 1u);
    EXPECT_EQ(t.dev[0].pools[0].second, 1u);
    EXPECT_EQ(t.dev[0].ev[1].pool, 1u);
    EXPECT_EQ(t.dev[0].ev[4].pool, 1u);
    EXPECT_EQ(t.dev[0].ev[5].pool, 0u);
    EXPECT_EQ(t.dev[0].peak_reserved, 36 * MiB);
    replay_result_t r;
    char why[256] = "";
    ASSERT_TRUE(replay_trace(&t, nullptr, &r, why, sizeof(why))) << why;
    EXPECT_EQ(r.device_allocs, 1); // the pool's own segment
    EXPECT_EQ((uint64_t)r.peak_reserved, r.pytorch_peak_reserved);
    EXPECT_EQ(r.device_frees, 1);                  // only the pool's segment went back
    EXPECT_EQ((uint64_t)r.end_reserved, 20 * MiB); // the default pool's stayed cached
    EXPECT_EQ((uint64_t)r.end_reserved, r.pytorch_final_reserved);
    tr_free(&t);
    // Our snapshot of the replay names the pool in its entries too, so replaying it routes alike.
    ASSERT_EQ(sp_shutdown(), SP_SUCCESS); // each replay on a fresh allocator
    ASSERT_TRUE(load(snapshot_of(segs, evs, "", false), &t, &err)) << err;
    std::string out = "replay_pool_" + std::to_string(getpid()) + ".pickle";
    ASSERT_TRUE(replay_trace(&t, out.c_str(), &r, why, sizeof(why))) << why;
    tr_free(&t);
    ASSERT_EQ(sp_shutdown(), SP_SUCCESS);
    bool loaded = tr_load(out.c_str(), &t, why, sizeof(why));
    unlink(out.c_str());
    ASSERT_TRUE(loaded) << why;
    ASSERT_EQ(t.dev[0].npools, 1u);
    size_t named = 0;
    for (size_t i = 0; i < t.dev[0].nev; i++)
        named += t.dev[0].ev[i].pool == 1 && (t.dev[0].ev[i].flags & TR_F_POOL_ID);
    EXPECT_GE(named, 4u); // segment_alloc, alloc, free_requested/completed, segment_free
    ASSERT_TRUE(replay_trace(&t, nullptr, &r, why, sizeof(why))) << why;
    EXPECT_EQ((uint64_t)r.peak_reserved, r.pytorch_peak_reserved);
    EXPECT_EQ(r.device_allocs, 1);
    tr_free(&t);
}

// Expandable segments the trace maps and unmaps: the pages mapped before the first entry are the
// starting state (the final ranges without what the trace mapped, with what it unmapped), with
// the live blocks in them, as for any other segment.
TEST_F(Replay, ExpandableSegmentsStartAsTheyWere) {
    // Replayed with the recorded settings (as `sympool replay` does): the same segment kind.
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:True"}});
    const uint64_t XS = 0x7b0000000000ull, Y = 0x7a0000000000ull;
    // End: XS has 60 MiB mapped: [10 MiB live since before the trace][10 free][20 allocated in
    // the trace][20 free]. The trace mapped XS+20 MiB (40 MiB) and unmapped all of Y (20 MiB,
    // whose 4 MiB block from before the trace it freed first).
    const std::vector<SSeg> segs = {{XS,
                                     60 * MiB,
                                     0,
                                     0,
                                     "large",
                                     {{10 * MiB, 10 * MiB, "active_allocated"},
                                      {10 * MiB, 0, "inactive"},
                                      {20 * MiB, 20 * MiB, "active_allocated"},
                                      {20 * MiB, 0, "inactive"}},
                                     true}};
    const std::vector<SEv> evs = {{"free_requested", Y, 4 * MiB, 0},
                                  {"free_completed", Y, 4 * MiB, 0},
                                  {"segment_unmap", Y, 20 * MiB, 0},
                                  {"segment_map", XS + 20 * MiB, 40 * MiB, 0},
                                  {"alloc", XS + 20 * MiB, 20 * MiB, 0}};
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(snapshot_of(segs, evs, "expandable_segments:True", true), &t, &err)) << err;
    const tr_device_t &d = t.dev[0];
    EXPECT_EQ(d.start_reserved, 40 * MiB);
    ASSERT_EQ(d.nstart, 2u);
    EXPECT_EQ(d.start_bytes, d.start_reserved);
    EXPECT_EQ(d.start[0].addr, Y);
    EXPECT_EQ(d.start[0].size, 20 * MiB);
    EXPECT_EQ(d.start[1].addr, XS);
    EXPECT_EQ(d.start[1].size, 20 * MiB);
    EXPECT_EQ(d.nloose, 0u); // both live blocks are inside the start ranges
    EXPECT_EQ(d.nsblocks, 2u);
    replay_result_t r;
    char why[256] = "";
    ASSERT_TRUE(replay_trace(&t, nullptr, &r, why, sizeof(why))) << why;
    EXPECT_EQ(r.start_segments, 2u);
    EXPECT_EQ(r.start_bytes, r.pytorch_start_reserved);
    EXPECT_EQ(r.start_blocks, 2u);
    EXPECT_EQ(r.skipped_frees, 0u);
    tr_free(&t);
}

// The walk back through maps and unmaps: pages unmapped and mapped again, pages mapped last, and
// a hole the trace opened between two final ranges of one segment (PyTorch reports each mapped
// range as a segment): the start is what was mapped before the first entry, merged.
TEST_F(Replay, ExpandableRangesWalkBackThroughMapsAndUnmaps) {
    const uint64_t Z = 0x790000000000ull, W = 0x780000000000ull;
    const std::vector<SSeg> segs = {
        {Z, 60 * MiB, 0, 0, "large", {{60 * MiB, 0, "inactive"}}, true},
        {W, 20 * MiB, 0, 0, "large", {{20 * MiB, 0, "inactive"}}, true},
        {W + 40 * MiB, 20 * MiB, 0, 0, "large", {{20 * MiB, 0, "inactive"}}, true}};
    const std::vector<SEv> evs = {{"segment_unmap", Z + 20 * MiB, 20 * MiB, 0},
                                  {"segment_map", Z + 20 * MiB, 20 * MiB, 0},
                                  {"segment_map", Z + 40 * MiB, 20 * MiB, 0},
                                  {"segment_unmap", W + 20 * MiB, 20 * MiB, 0}};
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(snapshot_of(segs, evs, "expandable_segments:True", true), &t, &err)) << err;
    const tr_device_t &d = t.dev[0];
    ASSERT_EQ(d.nstart, 2u);
    EXPECT_EQ(d.start[0].addr, W); // the hole closed again: one range
    EXPECT_EQ(d.start[0].size, 60 * MiB);
    EXPECT_EQ(d.start[1].addr, Z);
    EXPECT_EQ(d.start[1].size, 40 * MiB);
    EXPECT_EQ(d.start_bytes, 100 * MiB);
    EXPECT_EQ(d.start_bytes, d.start_reserved);
    tr_free(&t);
}

// allocator_settings become the replay's configuration; per_process_memory_fraction is read
// from the settings string.
TEST_F(Replay, RecordedSettingsTranslate) {
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(snapshot_of({}, {},
                                 "expandable_segments:True,per_process_memory_fraction:0.5,"
                                 "backend:cudaMallocAsync",
                                 true),
                     &t, &err))
        << err;
    EXPECT_TRUE(t.settings.recorded);
    EXPECT_STREQ(t.settings.conf, "expandable_segments:True");
    EXPECT_DOUBLE_EQ(t.settings.fraction, 0.5);
    EXPECT_NE(strstr(t.settings.dropped, "backend:cudaMallocAsync"), nullptr);
    tr_free(&t);
}

} // namespace

namespace {

// Loading without stacks (what a replay without --snapshot does) reads the same trace.
TEST_F(Replay, SkippingFramesLoadsTheSameTrace) {
    for (const char *name :
         {"cs336-2.7b-ctx128-forward-bf16.pickle", "real/sqattn-empty-cache.pickle",
          "real/attention-state-only.pickle", "real/layoutediting-legacy-list.pickle"}) {
        std::string path = data_dir() + "/" + name;
        tr_trace_t a, b;
        char why[256] = "";
        ASSERT_TRUE(tr_load(path.c_str(), &a, why, sizeof(why))) << why;
        ASSERT_TRUE(tr_load_opts(path.c_str(), false, &b, why, sizeof(why))) << why;
        ASSERT_EQ(a.ndev, b.ndev) << name;
        EXPECT_STREQ(a.settings.conf, b.settings.conf) << name;
        for (int d = 0; d < a.ndev; d++) {
            const tr_device_t &x = a.dev[d], &y = b.dev[d];
            ASSERT_EQ(x.nev, y.nev) << name;
            size_t with_frames = 0;
            for (size_t i = 0; i < x.nev; i++) {
                EXPECT_EQ(x.ev[i].action, y.ev[i].action);
                EXPECT_EQ(x.ev[i].addr, y.ev[i].addr);
                EXPECT_EQ(x.ev[i].size, y.ev[i].size);
                EXPECT_EQ(x.ev[i].stream, y.ev[i].stream);
                EXPECT_EQ(x.ev[i].flags, y.ev[i].flags);
                EXPECT_EQ(x.ev[i].pool, y.ev[i].pool);
                EXPECT_EQ(tr_time_us(&y, i), 0); // no times without stacks
                EXPECT_EQ(tr_frames(&y, i), nullptr);
                with_frames += tr_frames(&x, i) != nullptr;
            }
            EXPECT_EQ(with_frames == 0, x.nev == 0) << name << ": the full load keeps the stacks";
            EXPECT_EQ(x.nstart, y.nstart);
            EXPECT_EQ(x.nsblocks, y.nsblocks);
            EXPECT_EQ(x.nseeds, y.nseeds);
            EXPECT_EQ(x.nloose, y.nloose);
            EXPECT_EQ(x.start_bytes, y.start_bytes);
            EXPECT_EQ(x.peak_reserved, y.peak_reserved);
            EXPECT_EQ(x.final_allocated, y.final_allocated);
            // The load without stacks analyses with its shortcuts (one address map, arrays in
            // order left unsorted): the starting state comes out the same, in the same order.
            for (size_t i = 0; i < x.nseeds && i < y.nseeds; i++) {
                EXPECT_EQ(x.seeds[i].addr, y.seeds[i].addr) << name << " seed " << i;
                EXPECT_EQ(x.seeds[i].size, y.seeds[i].size) << name << " seed " << i;
                EXPECT_EQ(x.seeds[i].in_start, y.seeds[i].in_start) << name << " seed " << i;
                EXPECT_EQ(x.seeds[i].pool, y.seeds[i].pool) << name << " seed " << i;
            }
            for (size_t i = 0; i < x.nstart && i < y.nstart; i++) {
                EXPECT_EQ(x.start[i].addr, y.start[i].addr) << name << " segment " << i;
                EXPECT_EQ(x.start[i].size, y.start[i].size) << name << " segment " << i;
                EXPECT_EQ(x.start[i].first, y.start[i].first) << name << " segment " << i;
                EXPECT_EQ(x.start[i].n, y.start[i].n) << name << " segment " << i;
            }
            for (size_t i = 0; i < x.nsblocks && i < y.nsblocks; i++) {
                EXPECT_EQ(x.sblocks[i].addr, y.sblocks[i].addr) << name << " block " << i;
                EXPECT_EQ(x.sblocks[i].size, y.sblocks[i].size) << name << " block " << i;
                EXPECT_EQ(x.sblocks[i].req, y.sblocks[i].req) << name << " block " << i;
            }
        }
        tr_free(&a);
        tr_free(&b);
    }
}

// The address map's in-place lookup and its reservation: a reserved map holds that many keys
// without growing, and a value found is the one later lookups see.
TEST_F(Replay, AddressMapFindsInPlaceAndReservesRoom) {
    tr_map_t m = {};
    EXPECT_EQ(tr_map_find(&m, 512), nullptr);
    ASSERT_TRUE(tr_map_reserve(&m, 5000));
    size_t cap = m.cap;
    EXPECT_GE(cap, 2 * 5000u + 2);
    for (uint64_t k = 1; k <= 5000; k++)
        ASSERT_TRUE(tr_map_put(&m, k << 9, k));
    EXPECT_EQ(m.cap, cap) << "no growth up to the reserved count";
    EXPECT_EQ(m.n, 5000u);
    uintptr_t *v = tr_map_find(&m, 77 << 9);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(*v, 77u);
    *v = 0;
    uintptr_t got = 1;
    EXPECT_TRUE(tr_map_get(&m, 77 << 9, &got));
    EXPECT_EQ(got, 0u);
    EXPECT_EQ(tr_map_find(&m, 5001 << 9), nullptr);
    EXPECT_EQ(tr_map_find(&m, 0), nullptr);
    ASSERT_TRUE(tr_map_reserve(&m, 10)) << "a smaller reservation keeps the map";
    EXPECT_EQ(m.cap, cap);
    got = 0;
    EXPECT_TRUE(tr_map_get(&m, 4999 << 9, &got));
    EXPECT_EQ(got, 4999u);
    tr_map_free(&m);
}

// The address map's upsert: a new key is put with value 0 and said to be new, an old one keeps
// its value for the caller to read and replace; the map grows exactly as puts grow it (so that
// a map filled either way numbers its slots alike); key 0 is refused, as put refuses it.
TEST_F(Replay, AddressMapUpsertPutsOnceAndGrowsAsPut) {
    tr_map_t a = {}, b = {};
    bool added = false;
    EXPECT_EQ(tr_map_upsert(&a, 0, &added), nullptr);
    EXPECT_EQ(a.n, 0u);
    for (uint64_t k = 1; k <= 3000; k++) {
        uint64_t key = (k % 1500 + 1) << 9; // every key twice
        uintptr_t *v = tr_map_upsert(&a, key, &added);
        ASSERT_NE(v, nullptr);
        EXPECT_EQ(added, k <= 1500) << k;
        EXPECT_EQ(*v, added ? 0u : k - 1500) << k;
        *v = k;
        ASSERT_TRUE(tr_map_put(&b, key, k));
        ASSERT_EQ(a.cap, b.cap) << k;
        ASSERT_EQ(a.n, b.n) << k;
    }
    EXPECT_EQ(a.n, 1500u);
    for (size_t i = 0; i < a.cap; i++) {
        EXPECT_EQ(a.slots[i].key, b.slots[i].key) << i;
        EXPECT_EQ(a.slots[i].val, b.slots[i].val) << i;
    }
    tr_map_free(&a);
    tr_map_free(&b);
}

} // namespace

namespace {

// Damaged snapshots load or explain when stacks are skipped too (the skipping path reads the
// same bytes with fewer checks inside the skipped values).
TEST_F(Replay, FuzzedSnapshotsLoadOrExplainWhenSkipping) {
    std::ifstream f(data_dir() + "/trace-small-p4.pickle", std::ios::binary);
    std::vector<unsigned char> orig((std::istreambuf_iterator<char>(f)),
                                    std::istreambuf_iterator<char>());
    ASSERT_GT(orig.size(), 1000u);
    std::string path = "fuzz_skip_" + std::to_string(getpid()) + ".pickle";
    unsigned seed = 12345;
    for (int round = 0; round < 300; round++) {
        std::vector<unsigned char> b = orig;
        for (int k = 0; k < 4; k++) {
            seed = seed * 1103515245u + 12345u;
            b[(seed >> 8) % b.size()] = (unsigned char)(seed >> 24);
        }
        if (round % 7 == 0)
            b.resize(b.size() * (size_t)(round % 5 + 1) / 6);
        pk_doc_t *doc = nullptr;
        char why[256] = "";
        if (pk_parse_skip(b.data(), b.size(), nullptr, "frames", &doc, why, sizeof(why))) {
            tr_trace_t t;
            char e2[256] = "";
            (void)tr_from_doc(doc, &t, e2, sizeof(e2));
            tr_free(&t);
        } else {
            EXPECT_NE(strstr(why, "pickle:"), nullptr) << why;
        }
        // The loader without stacks, whose reader hands the entries over as it parses them.
        if (round % 3 != 0)
            continue;
        std::ofstream(path, std::ios::binary)
            .write((const char *)b.data(), (std::streamsize)b.size());
        tr_trace_t t;
        (void)tr_load_opts(path.c_str(), false, &t, why, sizeof(why));
        tr_free(&t);
    }
    unlink(path.c_str());
}

// Entries handed over while parsing: an int the memo keeps from inside one entry (made a document
// value before its entry's scratch is reused), read back in the next entry, a DUP'd and popped
// value, a nested dict and a tuple in an entry: the same events as the full load.
TEST_F(Replay, HandedOverEntriesKeepWhatTheMemoKeeps) {
    std::vector<unsigned char> b = {0x80, 2};
    auto str = [&b](const std::string &x) {
        b.push_back('X');
        for (int i = 0; i < 4; i++)
            b.push_back((unsigned char)(x.size() >> (8 * i)));
        b.insert(b.end(), x.begin(), x.end());
    };
    auto i32 = [&b](uint32_t v) {
        b.push_back('J');
        for (int i = 0; i < 4; i++)
            b.push_back((unsigned char)(v >> (8 * i)));
    };
    b.insert(b.end(), {'}', '('});
    str("segments");
    b.push_back(']');
    str("device_traces");
    b.insert(b.end(), {']', ']', '('}); // outer list, device 0's list, MARK of its items
    // entry 1: alloc at 0x7f001000 of 0x7f001000 bytes (memoized as 0), a DUP popped again,
    // user_metadata {"k": 5}, pool_id (0, 0)
    b.insert(b.end(), {'}', '('});
    str("action");
    str("alloc");
    str("addr");
    i32(0x7f001000u);
    b.insert(b.end(), {'2', 'q', 0, '0'}); // DUP, memoize the copy, pop it
    str("size");
    b.insert(b.end(), {'h', 0});
    str("user_metadata");
    b.insert(b.end(), {'}', '('});
    str("k");
    b.insert(b.end(), {'K', 5, 'u'});
    str("pool_id");
    b.insert(b.end(), {'K', 0, 'K', 0, 0x86});
    b.push_back('u');
    // entry 2: free_requested at the memoized int, its size 7 (made in the same scratch slots)
    b.insert(b.end(), {'}', '('});
    str("action");
    str("free_requested");
    str("addr");
    b.insert(b.end(), {'h', 0});
    str("size");
    i32(7);
    str("stream");
    b.insert(b.end(), {'K', 0, 'u'});
    b.insert(b.end(), {'e', 'a', 'u', '.'}); // APPENDS entries, APPEND device list, SETITEMS top
    std::string path = "handed_over_" + std::to_string(getpid()) + ".pickle";
    std::ofstream(path, std::ios::binary).write((const char *)b.data(), (std::streamsize)b.size());
    tr_trace_t full, fast;
    char why[256] = "", why2[256] = "";
    bool full_ok = tr_load(path.c_str(), &full, why, sizeof(why));
    bool fast_ok = tr_load_opts(path.c_str(), false, &fast, why2, sizeof(why2));
    unlink(path.c_str());
    ASSERT_TRUE(full_ok) << why;
    ASSERT_TRUE(fast_ok) << why2;
    for (const tr_trace_t *t : {&full, &fast}) {
        ASSERT_EQ(t->ndev, 1);
        ASSERT_EQ(t->dev[0].nev, 2u);
        EXPECT_EQ(t->dev[0].ev[0].action, TR_ALLOC);
        EXPECT_EQ(t->dev[0].ev[0].addr, 0x7f001000u);
        EXPECT_EQ(t->dev[0].ev[0].size, 0x7f001000u);
        EXPECT_EQ(t->dev[0].ev[1].action, TR_FREE_REQUESTED);
        EXPECT_EQ(t->dev[0].ev[1].addr, 0x7f001000u);
        EXPECT_EQ(t->dev[0].ev[1].size, 7u);
    }
    EXPECT_TRUE(fast.dev[0].ev_borrowed); // the handed-over entries are the event array
    tr_free(&full);
    tr_free(&fast);
}

// Every action name PyTorch writes reads as its action, and names that only start or end like
// one (or are one with more after it) are unknown actions, on both load paths.
TEST_F(Replay, ActionNamesAreReadWholly) {
    const std::vector<std::pair<const char *, tr_action_t>> names = {
        {"alloc", TR_ALLOC},
        {"free_requested", TR_FREE_REQUESTED},
        {"free_completed", TR_FREE_COMPLETED},
        {"segment_alloc", TR_SEGMENT_ALLOC},
        {"segment_free", TR_SEGMENT_FREE},
        {"segment_map", TR_SEGMENT_MAP},
        {"segment_unmap", TR_SEGMENT_UNMAP},
        {"snapshot", TR_SNAPSHOT},
        {"oom", TR_OOM},
        {"user_defined", TR_ANNOTATION}, // an annotation (record_function's), as some torch wrote
        {"free", TR_FREE_REQUESTED},     // a request and its completion in one entry (MemoryViz's)
        {"fre", TR_OTHER},
        {"freed", TR_OTHER},
        {"free_", TR_OTHER},
        {"allocs", TR_OTHER},
        {"a", TR_OTHER},
        {"free_re", TR_OTHER},
        {"free_requester", TR_OTHER},
        {"free_xompleted", TR_OTHER},
        {"segment_", TR_OTHER},
        {"segment_zap", TR_OTHER},
        {"segment_mapx", TR_OTHER},
        {"snap", TR_OTHER},
        {"s", TR_OTHER},
        {"oo", TR_OTHER},
        {"user_define", TR_OTHER},
        {"user_definedx", TR_OTHER},
        {"u", TR_OTHER},
        {"", TR_OTHER},
        {"resize", TR_OTHER}};
    sp__emit_t e;
    begin_device0_events(&e);
    for (size_t i = 0; i < names.size(); i++) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "action");
        sp__emit_str(&e, names[i].first);
        sp__emit_key(&e, "addr");
        sp__emit_uint(&e, 0x7f0000000000ull + (uint64_t)i * (4u << 20));
        sp__emit_key(&e, "size");
        sp__emit_uint(&e, 2u << 20);
        sp__emit_key(&e, "device_free");
        sp__emit_uint(&e, 1u << 30);
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    std::vector<unsigned char> b = finish(&e);
    tr_trace_t dict, fast;
    std::string err;
    char why[256] = "";
    ASSERT_TRUE(load(b, &dict, &err)) << err;
    std::string path = "actions_" + std::to_string(getpid()) + ".pickle";
    ASSERT_TRUE(load_from_file(b, path, &fast, why, sizeof(why))) << why;
    ASSERT_EQ(dict.dev[0].nev, names.size());
    ASSERT_EQ(fast.dev[0].nev, names.size());
    for (size_t i = 0; i < names.size(); i++) {
        EXPECT_EQ(dict.dev[0].ev[i].action, names[i].second) << names[i].first;
        EXPECT_EQ(fast.dev[0].ev[i].action, names[i].second) << names[i].first;
    }
    // The one "free" entry is counted as such (info says so), on both load paths.
    EXPECT_EQ(dict.dev[0].free_entries, 1u);
    EXPECT_EQ(fast.dev[0].free_entries, 1u);
    tr_free(&dict);
    tr_free(&fast);
}

// Entries handed over while parsing keep what the checks need in a few flag bits and, only for
// an unknown action or a named pool, a side record: every bad entry is refused with the message
// the dict path gives (the unknown action's own name in it), and no event keeps those bits.
TEST_F(Replay, HandedOverEntriesAreCheckedLikeDicts) {
    auto trace = [](int bad) {
        sp__emit_t e;
        begin_device0_events(&e);
        for (int i = 0; i < 6; i++) {
            sp__emit_dict_begin(&e);
            sp__emit_key(&e, "action");
            sp__emit_str(&e, i == 2 ? "weird_action" : i % 2 ? "free_requested" : "alloc");
            sp__emit_key(&e, "addr");
            sp__emit_uint(&e, 0x7f0000000000ull + (uint64_t)(i / 2) * 4096);
            if (!(bad == 1 && i == 4)) {
                sp__emit_key(&e, "size");
                sp__emit_uint(&e, 4096);
            }
            sp__emit_key(&e, "time_us");
            sp__emit_int(&e, bad == 2 && i == 2 ? -5 : 1700000000000000ll + i);
            if (i == 3) {
                sp__emit_key(&e, "pool_id");
                sp__emit_tuple2(&e, 0, 0);
            }
            sp__emit_dict_end(&e);
        }
        sp__emit_list_end(&e);
        sp__emit_list_end(&e);
        sp__emit_dict_end(&e);
        return finish(&e);
    };
    const char *want[] = {"", "device_traces[0][4] (alloc): missing or bad 'addr' or 'size'",
                          ("device_traces[0][2] (weird_action): time_us is not a time in [0, 2^53] "
                           "microseconds")};
    for (int bad = 0; bad < 3; bad++) {
        std::vector<unsigned char> b = trace(bad);
        std::string path = "checked_" + std::to_string(getpid()) + ".pickle";
        tr_trace_t dict, fast;
        std::string err;
        char why[256] = "";
        bool dict_ok = load(b, &dict, &err);
        bool fast_ok = load_from_file(b, path, &fast, why, sizeof(why));
        EXPECT_EQ(dict_ok, bad == 0) << err;
        EXPECT_EQ(fast_ok, bad == 0) << why;
        if (bad > 0) {
            EXPECT_EQ(err, want[bad]);
            EXPECT_EQ(std::string(why), path + ": " + want[bad]);
        } else {
            ASSERT_EQ(fast.dev[0].nev, 6u);
            EXPECT_TRUE(fast.dev[0].ev_borrowed);
            for (size_t i = 0; i < 6; i++) {
                EXPECT_EQ(fast.dev[0].ev[i].flags, dict.dev[0].ev[i].flags) << i;
                EXPECT_EQ(fast.dev[0].ev[i].action, dict.dev[0].ev[i].action) << i;
                EXPECT_EQ(fast.dev[0].ev[i].pool, dict.dev[0].ev[i].pool) << i;
            }
            EXPECT_EQ(fast.dev[0].ev[2].action, TR_OTHER);
            EXPECT_TRUE(fast.dev[0].ev[3].flags & TR_F_POOL_ID);
        }
        tr_free(&dict);
        tr_free(&fast);
    }
}

} // namespace

// The final state's segments and blocks are read in one pass over each dict's pairs: keys in any
// order, a key written twice (the last pair counts, as in a dict), a key of a wanted length that
// is another key, keys written as new strings in one dict and memoized ones in the next.
TEST_F(Replay, FinalStateKeysAreReadInAnyOrderLastOneCounting) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_dict_begin(&e);
    sp__emit_key(&e, "segments");
    sp__emit_list_begin(&e);
    for (int s = 0; s < 3; s++) {
        sp__emit_dict_begin(&e);
        if (s == 1) { // reversed, a decoy of "device"'s length, total_size twice
            sp__emit_key(&e, "total_size");
            sp__emit_uint(&e, 1 * MiB);
            sp__emit_key(&e, "devise");
            sp__emit_int(&e, 7);
        }
        sp__emit_key(&e, "blocks");
        sp__emit_list_begin(&e);
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "state");
        sp__emit_str(&e, "inactive");
        sp__emit_key(&e, "size");
        sp__emit_uint(&e, 2 * MiB);
        sp__emit_key(&e, "state"); // the last one counts
        sp__emit_str(&e, s == 2 ? "inactive" : "active_allocated");
        sp__emit_dict_end(&e);
        sp__emit_list_end(&e);
        sp__emit_key(&e, "total_size");
        sp__emit_uint(&e, (uint64_t)(s + 2) * 2 * MiB);
        sp__emit_key(&e, "address");
        sp__emit_uint(&e, SEG_A + (uint64_t)s * 64 * MiB);
        sp__emit_key(&e, "device");
        sp__emit_int(&e, 0);
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    sp__emit_key(&e, "device_traces");
    sp__emit_list_begin(&e);
    sp__emit_list_begin(&e);
    sp__emit_list_end(&e);
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(finish(&e), &t, &err)) << err;
    ASSERT_EQ(t.ndev, 1);
    const tr_device_t &d = t.dev[0];
    EXPECT_EQ(d.final_reserved, (4 + 6 + 8) * MiB);
    EXPECT_EQ(d.final_allocated, 4 * MiB);
    EXPECT_EQ(d.nstart, 3u);
    EXPECT_EQ(d.nseeds, 2u);
    tr_free(&t);
}

// A snapshot for the two loaders' agreement tests: its segments list written by `segments`;
// `stray` (a block's or a segment's dict) written where none belongs: as the whole document
// (bad 4) or as allocator_settings (bad 3, settings recorded but none known).
static std::vector<unsigned char> stray_snapshot(int bad,
                                                 const std::function<void(sp__emit_t *)> &segments,
                                                 const std::function<void(sp__emit_t *)> &stray) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    if (bad == 4) {
        stray(&e);
        return finish(&e);
    }
    sp__emit_dict_begin(&e);
    sp__emit_key(&e, "segments");
    sp__emit_list_begin(&e);
    segments(&e);
    sp__emit_list_end(&e);
    sp__emit_key(&e, "device_traces");
    sp__emit_list_begin(&e);
    sp__emit_list_begin(&e);
    sp__emit_list_end(&e);
    sp__emit_list_end(&e);
    if (bad == 3) {
        sp__emit_key(&e, "allocator_settings");
        stray(&e);
    }
    sp__emit_dict_end(&e);
    return finish(&e);
}

// Loads trace(bad) for bad 0..4 with the dict loader and with the loader without stacks (from a
// file): 0 and 3 load in both, with the same format, and `check` compares their device 0; the
// others fail in both with want[bad].
static void
expect_loaders_agree(const std::function<std::vector<unsigned char>(int)> &trace,
                     const char *const want[5], const char *stem,
                     const std::function<void(const tr_device_t &, const tr_device_t &)> &check) {
    for (int bad = 0; bad < 5; bad++) {
        std::vector<unsigned char> b = trace(bad);
        std::string path = std::string(stem) + "_" + std::to_string(getpid()) + ".pickle";
        tr_trace_t dict, fast;
        std::string err;
        char why[256] = "";
        bool dict_ok = load(b, &dict, &err);
        bool fast_ok = load_from_file(b, path, &fast, why, sizeof(why));
        bool good = bad == 0 || bad == 3;
        EXPECT_EQ(dict_ok, good) << bad << ": " << err;
        EXPECT_EQ(fast_ok, good) << bad << ": " << why;
        if (!good) {
            EXPECT_EQ(err, want[bad]);
            EXPECT_EQ(std::string(why), path + ": " + want[bad]);
        } else if (dict_ok && fast_ok) {
            EXPECT_STREQ(fast.format, dict.format);
            EXPECT_EQ(std::string(fast.format), bad == 3 ? "snapshot with allocator_settings"
                                                         : "snapshot without allocator_settings "
                                                           "(older torch)");
            check(fast.dev[0], dict.dev[0]);
        }
        tr_free(&dict);
        tr_free(&fast);
    }
}

// The loader without stacks takes the final state's blocks as records: they read as their dicts
// do (the last pair counting, a requested_size past the size read as the size, a block
// without a size refused by its index), and a dict of a block's keys where no block belongs
// (the settings, a segment's blocks, the whole document) reads as the dict it is.
TEST_F(Replay, HandedOverBlocksReadLikeTheirDicts) {
    auto block = [](sp__emit_t *e, const char *state, uint64_t size, int64_t req, bool sized) {
        sp__emit_dict_begin(e);
        sp__emit_key(e, "state");
        sp__emit_str(e, "inactive");
        if (sized) {
            sp__emit_key(e, "size");
            sp__emit_uint(e, size);
        }
        if (req >= 0) {
            sp__emit_key(e, "requested_size");
            sp__emit_int(e, req);
        }
        sp__emit_key(e, "frames");
        sp__emit_list_begin(e);
        sp__emit_list_end(e);
        sp__emit_key(e, "state"); // the last one counts
        sp__emit_str(e, state);
        sp__emit_dict_end(e);
    };
    auto trace = [&](int bad) {
        auto segments = [&](sp__emit_t *e) {
            sp__emit_dict_begin(e);
            sp__emit_key(e, "device");
            sp__emit_int(e, 0);
            sp__emit_key(e, "address");
            sp__emit_uint(e, SEG_A);
            sp__emit_key(e, "total_size");
            sp__emit_uint(e, 8 * MiB);
            sp__emit_key(e, "blocks");
            if (bad == 2) {
                block(e, "active_allocated", MiB, -1, true);
            } else {
                sp__emit_list_begin(e);
                block(e, "active_allocated", 2 * MiB, 1000, true);
                block(e, "inactive", MiB, -1, true);
                block(e, "active_pending_free", 3 * MiB, 4 * MiB, bad != 1);
                block(e, "active_allocated", 2 * MiB, -1, true);
                sp__emit_list_end(e);
            }
            sp__emit_dict_end(e);
        };
        return stray_snapshot(bad, segments, [&](sp__emit_t *e) {
            block(e, bad == 4 ? "active_allocated" : "inactive", MiB, -1, true);
        });
    };
    const char *want[] = {"", "segments[0].blocks[2]: missing or bad 'size' or 'state'",
                          "segments[0].blocks[0]: missing or bad 'size' or 'state'", "",
                          "not a memory snapshot (no 'segments' list)"};
    expect_loaders_agree(trace, want, "blocks", [](const tr_device_t &f, const tr_device_t &d) {
        EXPECT_EQ(f.final_allocated, 4 * MiB);
        EXPECT_EQ(f.final_allocated, d.final_allocated);
        ASSERT_EQ(f.nseeds, 3u);
        ASSERT_EQ(d.nseeds, 3u);
        // 1000 requested; 4 MiB requested of a 3 MiB block reads as its size
        const uint64_t size[] = {1000, 3 * MiB, 2 * MiB}, bsize[] = {2 * MiB, 3 * MiB, 2 * MiB};
        const uint64_t addr[] = {SEG_A, SEG_A + 3 * MiB, SEG_A + 6 * MiB};
        for (size_t i = 0; i < 3; i++) {
            EXPECT_EQ(f.seeds[i].addr, addr[i]) << i;
            EXPECT_EQ(f.seeds[i].size, size[i]) << i;
            EXPECT_EQ(f.seeds[i].bsize, bsize[i]) << i;
            EXPECT_EQ(d.seeds[i].size, f.seeds[i].size) << i;
            EXPECT_EQ(d.seeds[i].bsize, f.seeds[i].bsize) << i;
        }
    });
}

// The final state's segments are taken as records too: every field analyse reads comes out as
// from the dict (a negative stream as a handle, a private pool's id, the segment type, an
// expandable one), a bad device or a missing total_size refused by the segment's index, and a
// segment's dict as the settings or as the document reads as the dict it is.
TEST_F(Replay, HandedOverSegmentsReadLikeTheirDicts) {
    auto segment = [](sp__emit_t *e, int bad, int i) {
        sp__emit_dict_begin(e);
        sp__emit_key(e, "device");
        if (bad == 1 && i == 1)
            sp__emit_str(e, "cuda:0");
        else
            sp__emit_int(e, 0);
        sp__emit_key(e, "address");
        sp__emit_uint(e, SEG_A + (uint64_t)i * 64 * MiB);
        if (!(bad == 2 && i == 2)) {
            sp__emit_key(e, "total_size");
            sp__emit_uint(e, i == 1 ? 2 * MiB : 20 * MiB);
        }
        sp__emit_key(e, "allocated_size");
        sp__emit_uint(e, MiB);
        sp__emit_key(e, "stream");
        sp__emit_int(e, i == 0 ? -3 : 7);
        sp__emit_key(e, "segment_type");
        sp__emit_str(e, i == 1 ? "small" : "large");
        sp__emit_key(e, "segment_pool_id");
        sp__emit_tuple2(e, i == 2 ? 1 : 0, i == 2 ? 5 : 0);
        sp__emit_key(e, "is_expandable");
        sp__emit_bool(e, i == 3);
        sp__emit_key(e, "frames");
        sp__emit_list_begin(e);
        sp__emit_list_end(e);
        sp__emit_key(e, "blocks");
        sp__emit_list_begin(e);
        emit_block(e, SEG_A + (uint64_t)i * 64 * MiB, MiB, 1000, "active_allocated");
        sp__emit_list_end(e);
        sp__emit_key(e, "stream"); // the last one counts
        sp__emit_int(e, i == 0 ? -3 : 9);
        sp__emit_dict_end(e);
    };
    auto trace = [&](int bad) {
        auto segments = [&](sp__emit_t *e) {
            for (int i = 0; i < 4; i++)
                segment(e, bad, i);
        };
        return stray_snapshot(bad, segments,
                              [&](sp__emit_t *e) { segment(e, 0, bad == 4 ? 0 : 1); });
    };
    const char *want[] = {"", "segments[1]: missing or bad 'device'",
                          "segments[2]: missing or bad 'address' or 'total_size'", "",
                          "not a memory snapshot (no 'segments' list)"};
    expect_loaders_agree(trace, want, "segments", [](const tr_device_t &f, const tr_device_t &d) {
        EXPECT_EQ(f.final_reserved, 62 * MiB);
        EXPECT_EQ(f.final_reserved, d.final_reserved);
        EXPECT_EQ(f.nstreams, 3u); // the handle of -3, 9, and the default stream
        EXPECT_EQ(f.nstreams, d.nstreams);
        EXPECT_EQ(f.npools, 1u);
        EXPECT_EQ(f.npools, d.npools);
        ASSERT_EQ(f.nstart, 4u); // three fixed segments and the expandable one's range
        ASSERT_EQ(d.nstart, 4u);
        for (size_t i = 0; i < 4; i++) {
            EXPECT_EQ(f.start[i].addr, SEG_A + i * 64 * MiB) << i;
            EXPECT_EQ(f.start[i].size, d.start[i].size) << i;
            EXPECT_EQ(f.start[i].stream, d.start[i].stream) << i;
            EXPECT_EQ(f.start[i].pool, d.start[i].pool) << i;
            EXPECT_EQ(f.start[i].is_small, d.start[i].is_small) << i;
        }
        EXPECT_EQ(f.start[0].stream, (uint64_t)-3);
        EXPECT_EQ(f.start[1].stream, 9u);
        EXPECT_TRUE(f.start[1].is_small);
        EXPECT_EQ(f.start[2].pool, 1u);
        EXPECT_EQ(f.nseeds, 4u);
        EXPECT_EQ(f.nseeds, d.nseeds);
    });
}

// A dict of more than 1000 items is written in SETITEMS batches of 1000 (CPython's pickler and
// ours): a trace entry with many keys, whose addr and size come in its second batch, loads in
// the loader without stacks as in the dict loader (its reader must not hand the entry over at
// its first batch, which would leave the second one no dict to go to).
TEST_F(Replay, EntriesOfSeveralSetitemsBatchesLoadInBothLoaders) {
    sp__emit_t e;
    begin_device0_events(&e);
    for (int i = 0; i < 3; i++) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "action");
        sp__emit_str(&e, i == 0 ? "alloc" : i == 1 ? "free_requested" : "free_completed");
        for (int k = 0; i == 0 && k < 1200; k++) {
            std::string key = "extra_" + std::to_string(k);
            sp__emit_key(&e, key.c_str());
            sp__emit_int(&e, k);
        }
        sp__emit_key(&e, "addr");
        sp__emit_uint(&e, SEG_A);
        sp__emit_key(&e, "size");
        sp__emit_uint(&e, 4096);
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    std::vector<unsigned char> b = finish(&e);
    std::string path = "batches_" + std::to_string(getpid()) + ".pickle";
    tr_trace_t dict, fast;
    std::string err;
    char why[256] = "";
    ASSERT_TRUE(load(b, &dict, &err)) << err;
    ASSERT_TRUE(load_from_file(b, path, &fast, why, sizeof(why))) << why;
    ASSERT_EQ(fast.dev[0].nev, 3u);
    ASSERT_EQ(dict.dev[0].nev, 3u);
    for (size_t i = 0; i < 3; i++) {
        EXPECT_EQ(fast.dev[0].ev[i].action, dict.dev[0].ev[i].action) << i;
        EXPECT_EQ(fast.dev[0].ev[i].addr, SEG_A) << i;
        EXPECT_EQ(fast.dev[0].ev[i].size, 4096u) << i;
    }
    tr_free(&dict);
    tr_free(&fast);
}

// A final state's segment holds its blocks: blocks that together run past its total_size (each
// one smaller than it), or a segment that runs past the end of the address space, are refused
// by both loaders naming the field, instead of a device whose blocks allocate more than it
// reserves.
TEST_F(Replay, FinalStateBlocksStayInsideTheirSegment) {
    auto trace = [](uint64_t addr, int nblocks) {
        sp__emit_t e;
        sp__emit_init(&e, false);
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "segments");
        sp__emit_list_begin(&e);
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "device");
        sp__emit_int(&e, 0);
        sp__emit_key(&e, "address");
        sp__emit_uint(&e, addr);
        sp__emit_key(&e, "total_size");
        sp__emit_uint(&e, 2 * MiB);
        sp__emit_key(&e, "blocks");
        sp__emit_list_begin(&e);
        for (int i = 0; i < nblocks; i++)
            emit_block(&e, addr + (uint64_t)i * MiB, MiB, MiB, "active_allocated");
        sp__emit_list_end(&e);
        sp__emit_dict_end(&e);
        sp__emit_list_end(&e);
        sp__emit_key(&e, "device_traces");
        sp__emit_list_begin(&e);
        sp__emit_list_end(&e);
        sp__emit_dict_end(&e);
        return finish(&e);
    };
    const struct {
        uint64_t addr;
        int nblocks;
        const char *want; // "" loads
    } cases[] = {
        {SEG_A, 2, ""},
        {SEG_A, 3,
         "segments[0].blocks[2]: size 1048576 at offset 2097152 runs past its segment's "
         "total_size 2097152"},
        {~(uint64_t)0 - MiB + 1, 1,
         "segments[0]: address 0xfffffffffff00000 + total_size 2097152 runs past the end of the "
         "address space"},
    };
    for (const auto &c : cases) {
        std::vector<unsigned char> b = trace(c.addr, c.nblocks);
        std::string path = "inside_" + std::to_string(getpid()) + ".pickle";
        tr_trace_t dict, fast;
        std::string err;
        char why[256] = "";
        bool dict_ok = load(b, &dict, &err);
        bool fast_ok = load_from_file(b, path, &fast, why, sizeof(why));
        bool good = *c.want == '\0';
        EXPECT_EQ(dict_ok, good) << c.nblocks << ": " << err;
        EXPECT_EQ(fast_ok, good) << c.nblocks << ": " << why;
        if (!good) {
            EXPECT_EQ(err, c.want);
            EXPECT_EQ(std::string(why), path + ": " + c.want);
        } else if (dict_ok && fast_ok) {
            EXPECT_EQ(dict.dev[0].final_allocated, 2 * MiB);
            EXPECT_EQ(fast.dev[0].final_allocated, 2 * MiB);
        }
        tr_free(&dict);
        tr_free(&fast);
    }
}

// Two device traces that are one list (a memo reference): the second device's events are read
// as the entries were, not as the first device's analysis left them (its routing into that
// device's private pool), in the loader without stacks as in the dict loader.
TEST_F(Replay, ADeviceTraceSharedWithAnotherReadsAsItsEntries) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_dict_begin(&e);
    sp__emit_key(&e, "segments");
    sp__emit_list_begin(&e);
    sp__emit_dict_begin(&e); // device 0's private pool holds the address the entries name
    sp__emit_key(&e, "device");
    sp__emit_int(&e, 0);
    sp__emit_key(&e, "address");
    sp__emit_uint(&e, SEG_A);
    sp__emit_key(&e, "total_size");
    sp__emit_uint(&e, 2 * MiB);
    sp__emit_key(&e, "segment_pool_id");
    sp__emit_tuple2(&e, 1, 5);
    sp__emit_key(&e, "blocks");
    sp__emit_list_begin(&e);
    emit_block(&e, SEG_A, 2 * MiB, 0, "inactive");
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    sp__emit_list_end(&e);
    sp__emit_key(&e, "device_traces");
    sp__emit_list_begin(&e);
    sp__emit_list_begin(&e);
    const Ev evs[] = {{"alloc", SEG_A, 4096},
                      {"free_requested", SEG_A, 4096},
                      {"free_completed", SEG_A, 4096},
                      {"segment_free", SEG_B, 2 * MiB}};
    for (const Ev &ev : evs)
        emit_event(&e, ev, 1700000000000000ll);
    sp__emit_list_end(&e);
    uint32_t shared = sp__emit_memoize(&e);
    ASSERT_NE(shared, UINT32_MAX);
    sp__emit_memo_get(&e, shared);
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    std::vector<unsigned char> b = finish(&e);
    std::string path = "shared_trace_" + std::to_string(getpid()) + ".pickle";
    tr_trace_t dict, fast;
    std::string err;
    char why[256] = "";
    ASSERT_TRUE(load(b, &dict, &err)) << err;
    ASSERT_TRUE(load_from_file(b, path, &fast, why, sizeof(why))) << why;
    ASSERT_EQ(dict.ndev, 2);
    ASSERT_EQ(fast.ndev, 2);
    EXPECT_EQ(dict.dev[0].ev[0].pool, 1u) << "device 0's alloc goes to its private pool";
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < 4; i++) {
            EXPECT_EQ(fast.dev[d].ev[i].pool, dict.dev[d].ev[i].pool) << d << " " << i;
            EXPECT_EQ(fast.dev[d].ev[i].flags, dict.dev[d].ev[i].flags) << d << " " << i;
        }
    EXPECT_EQ(fast.dev[1].ev[0].pool, 0u) << "device 1 has no private pool";
    tr_free(&dict);
    tr_free(&fast);
}

// A stream that is no snapshot (a character device, a pipe) is refused from its first bytes, not
// read to the 4 GiB bound first (4 GB of memory and seconds for /dev/zero).
TEST_F(Replay, AStreamThatIsNoSnapshotIsRefusedFromItsFirstBytes) {
    tr_trace_t t;
    char why[256] = "";
    EXPECT_FALSE(tr_load_opts("/dev/zero", false, &t, why, sizeof(why)));
    EXPECT_EQ(std::string(why),
              "/dev/zero: not a pickle (nor a JSON snapshot): it starts with byte 0x00, which "
              "is no pickle opcode (a pickle of protocol 2-5 starts with 0x80)");
    tr_free(&t);
}

// Pickles of protocols 0 and 1 (python3's pickle.dumps({"segments": [], "ok": True}) with
// protocol=0 and protocol=1) have no PROTO: they are read, and `info` names their protocol.
TEST_F(Replay, Protocol0And1PicklesAreRead) {
    const std::vector<unsigned char> p0 = {
        40,  100, 112, 48, 10,  86, 115, 101, 103, 109, 101, 110, 116, 115, 10, 112, 49,  10, 40,
        108, 112, 50,  10, 115, 86, 111, 107, 10,  112, 51,  10,  73,  48,  49, 10,  115, 46};
    const std::vector<unsigned char> p1 = {
        125, 113, 0, 40, 88, 8, 0, 0, 0,   115, 101, 103, 109, 101, 110, 116, 115, 113, 1,
        93,  113, 2, 88, 2,  0, 0, 0, 111, 107, 113, 3,   73,  48,  49,  10,  117, 46};
    for (int proto = 0; proto < 2; proto++) {
        tr_trace_t t;
        char why[256] = "";
        std::string path =
            "protocol" + std::to_string(proto) + "_" + std::to_string(getpid()) + ".pickle";
        ASSERT_TRUE(load_from_file(proto ? p1 : p0, path, &t, why, sizeof(why))) << why;
        EXPECT_EQ(t.protocol, proto);
        EXPECT_TRUE(t.pickled);
        EXPECT_EQ(t.nsegments, 0u);
        tr_free(&t);
    }
}

// A trace on many streams (a segment of its own each) gives everything back: a stream's
// destruction releases its cached segments, and the replay now empties the cache once before its
// streams go, where each destruction used to walk every segment still cached (20,000 streams took
// 17.6 s in `sympool summary`, 0.22 s after). What it costs is a benchmark's business, not this
// test's: it checks that every segment comes back, once, whichever way they go.
TEST_F(Replay, ManyStreamsGiveEachSegmentBackOnce) {
    sp__emit_t e;
    begin_device0_events(&e);
    const int n = 2000;
    for (int i = 0; i < n; i++) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "action");
        sp__emit_str(&e, "alloc");
        sp__emit_key(&e, "addr");
        sp__emit_uint(&e, SEG_A + (uint64_t)i * 2 * MiB);
        sp__emit_key(&e, "size");
        sp__emit_uint(&e, 512);
        sp__emit_key(&e, "stream");
        sp__emit_int(&e, 1000 + i);
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(finish(&e), &t, &err)) << err;
    replay_result_t r;
    char why[256] = "";
    ASSERT_TRUE(replay_trace(&t, nullptr, &r, why, sizeof(why))) << why; // gives it all back
    EXPECT_EQ(r.allocs, (size_t)n);
    EXPECT_EQ(r.device_allocs, (int64_t)n) << "a segment of its own per stream";
    EXPECT_EQ(sp_memory_reserved(0), 0u);
    EXPECT_EQ(sp::stat("num_device_free"), (int64_t)n) << "each segment given back once";
    tr_free(&t);
}

// The event loop runs on steps planned before the clock (replay.c's plan_slots): a slot per
// alloc, a stream index per recorded stream, entries that ask nothing of sympool left out. What
// the address map did must still hold: an address allocated again before its free takes the
// address (the earlier block is lost to the events, freed only at the end), its free frees the
// later block, a free of an address nothing holds is skipped, a free_completed with no deferred
// free does nothing, and a stream first seen after others gets a stream of its own.
TEST_F(Replay, PlannedLoopKeepsTheAddressMapsRules) {
    const uint64_t X = SEG_A, Z = SEG_B;
    struct entry {
        const char *action;
        uint64_t addr, size;
        int64_t stream;
    } entries[] = {
        {"alloc", X, 2 * MiB, 7},          // lost: X is allocated again before its free
        {"alloc", X, 4 * MiB, 7},          // takes X
        {"free_completed", Z, 4096, 7},    // nothing deferred: nothing to do
        {"free_requested", X, 4 * MiB, 7}, // the 4 MiB block
        {"alloc", Z, 6 * MiB, 9},          // a second stream, first seen here
        {"alloc", X + 64 * MiB, 512, 0},   // the default stream
        {"free_requested", Z, 6 * MiB, 9},
    };
    sp__emit_t e;
    begin_device0_events(&e);
    for (const entry &en : entries) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "action");
        sp__emit_str(&e, en.action);
        sp__emit_key(&e, "addr");
        sp__emit_uint(&e, en.addr);
        sp__emit_key(&e, "size");
        sp__emit_uint(&e, en.size);
        sp__emit_key(&e, "stream");
        sp__emit_int(&e, en.stream);
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(finish(&e), &t, &err)) << err;
    replay_result_t r;
    char why[256] = "";
    ASSERT_TRUE(replay_trace(&t, nullptr, &r, why, sizeof(why))) << why;
    EXPECT_EQ(r.allocs, 4u);
    EXPECT_EQ(r.frees, 2u);
    EXPECT_EQ(r.events, 6u);
    EXPECT_EQ(r.skipped_frees, 0u);
    EXPECT_EQ(r.ooms, 0u);
    // Left allocated at the end: the lost 2 MiB block and the 512-byte one; at the peak the 6
    // MiB block beside them.
    EXPECT_EQ(r.end_allocated, (int64_t)(2 * MiB + 512));
    EXPECT_EQ(r.peak_allocated, (int64_t)(8 * MiB + 512));
    // A 20 MiB segment for stream 7 (both its blocks), one for stream 9 (the 6 MiB block could
    // have gone into stream 7's free 14 MiB on a shared stream) and a small one.
    EXPECT_EQ(r.device_allocs, 3);
    // replay_trace gave back every block it held, the lost one too (held to the end of the
    // replay, as the figures above show, then freed: a later sp_shutdown finds nothing left).
    std::vector<std::pair<uintptr_t, size_t>> live;
    auto visit = [](const sp_segment_view_t *seg, void *arg) {
        auto *v = static_cast<std::vector<std::pair<uintptr_t, size_t>> *>(arg);
        for (size_t i = 0; i < seg->nblocks; i++)
            if (seg->blocks[i].state == SP_BLOCK_ACTIVE_ALLOCATED)
                v->emplace_back(seg->blocks[i].address, seg->blocks[i].requested_size);
    };
    ASSERT_SP_OK(sp__pool_walk(0, nullptr, visit, &live));
    EXPECT_TRUE(live.empty()) << live.size() << " block(s) left, the first of "
                              << (live.empty() ? 0 : live[0].second) << " bytes";
    for (auto &b : live)
        ASSERT_SP_OK(sp_free((void *)b.first));
    tr_free(&t);
}

// An entry whose pool_id is an int (not the (int, int) pair PyTorch writes): the reader made
// that int in scratch memory that lives only during the hook's call, and the entry's side record
// kept a pointer to it, read after the parse (a use after free under ASan). Both loaders read
// it as no pool, the entry still naming one.
TEST_F(Replay, AnEntrysPoolIdThatIsNoPairReadsAsNoPool) {
    sp__emit_t e;
    begin_device0_events(&e);
    for (int i = 0; i < 3; i++) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "action");
        sp__emit_str(&e, i == 0 ? "alloc" : i == 1 ? "free_requested" : "free_completed");
        sp__emit_key(&e, "addr");
        sp__emit_uint(&e, SEG_A);
        sp__emit_key(&e, "size");
        sp__emit_uint(&e, 4096);
        sp__emit_key(&e, "pool_id");
        sp__emit_int(&e, 5 + i);
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    std::vector<unsigned char> b = finish(&e);
    std::string path = "int_pool_id_" + std::to_string(getpid()) + ".pickle";
    tr_trace_t dict, fast;
    std::string err;
    char why[256] = "";
    ASSERT_TRUE(load(b, &dict, &err)) << err;
    ASSERT_TRUE(load_from_file(b, path, &fast, why, sizeof(why))) << why;
    ASSERT_EQ(fast.dev[0].nev, 3u);
    for (size_t i = 0; i < 3; i++) {
        EXPECT_EQ(fast.dev[0].ev[i].pool, 0u) << i;
        EXPECT_EQ(fast.dev[0].ev[i].pool, dict.dev[0].ev[i].pool) << i;
        EXPECT_EQ(fast.dev[0].ev[i].flags, dict.dev[0].ev[i].flags) << i;
    }
    EXPECT_EQ(fast.dev[0].npools, 0u);
    tr_free(&dict);
    tr_free(&fast);
}

// A device's final segments are apart: two that share addresses (the same segment twice, or one
// running into the next) are refused by both loaders naming both, instead of counting their
// bytes twice as reserved and rebuilding two segments at one address. Adjacent ones load.
TEST_F(Replay, OverlappingFinalSegmentsAreRefused) {
    auto trace = [](uint64_t second, uint64_t size) {
        sp__emit_t e;
        sp__emit_init(&e, false);
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "segments");
        sp__emit_list_begin(&e);
        const uint64_t at[] = {SEG_A + 64 * MiB, second, SEG_A};
        for (uint64_t a : at) {
            sp__emit_dict_begin(&e);
            sp__emit_key(&e, "device");
            sp__emit_int(&e, 0);
            sp__emit_key(&e, "address");
            sp__emit_uint(&e, a);
            sp__emit_key(&e, "total_size");
            sp__emit_uint(&e, size);
            sp__emit_key(&e, "blocks");
            sp__emit_list_begin(&e);
            emit_block(&e, a, size, size, "active_allocated");
            sp__emit_list_end(&e);
            sp__emit_dict_end(&e);
        }
        sp__emit_list_end(&e);
        sp__emit_key(&e, "device_traces");
        sp__emit_list_begin(&e);
        sp__emit_list_end(&e);
        sp__emit_dict_end(&e);
        return finish(&e);
    };
    const struct {
        uint64_t second, size;
        const char *want; // "" loads
    } cases[] = {
        {SEG_A + 2 * MiB, 2 * MiB, ""},
        {SEG_A, 2 * MiB, "segments[2] (address 0x7f0010000000) overlaps segments[1]"},
        {SEG_A - MiB, 2 * MiB, "segments[2] (address 0x7f0010000000) overlaps segments[1]"},
    };
    for (const auto &c : cases) {
        std::vector<unsigned char> b = trace(c.second, c.size);
        std::string path = "overlap_" + std::to_string(getpid()) + ".pickle";
        tr_trace_t dict, fast;
        std::string err;
        char why[256] = "";
        bool dict_ok = load(b, &dict, &err);
        bool fast_ok = load_from_file(b, path, &fast, why, sizeof(why));
        bool good = *c.want == '\0';
        EXPECT_EQ(dict_ok, good) << err;
        EXPECT_EQ(fast_ok, good) << why;
        if (!good) {
            EXPECT_EQ(err, c.want);
            EXPECT_EQ(std::string(why), path + ": " + c.want);
        } else if (dict_ok && fast_ok) {
            EXPECT_EQ(dict.dev[0].final_reserved, 6 * MiB);
        }
        tr_free(&dict);
        tr_free(&fast);
    }
}

// A device's private pools are counted in 16 bits: a trace naming more than 65535 is refused
// saying so (it said "out of memory"). Finding an entry's pool among many is a hash lookup now
// (a scan of them all per entry took 4 s for 65,535 pools); that speed is not timed here.
TEST_F(Replay, MoreThan65535PrivatePoolsAreRefusedSayingSo) {
    auto trace = [](int npools) {
        sp__emit_t e;
        begin_device0_events(&e);
        for (int i = 0; i < npools + 2; i++) {
            sp__emit_dict_begin(&e);
            sp__emit_key(&e, "action");
            sp__emit_str(&e, "alloc");
            sp__emit_key(&e, "addr");
            sp__emit_uint(&e, SEG_A + (uint64_t)i * 512);
            sp__emit_key(&e, "size");
            sp__emit_uint(&e, 512);
            sp__emit_key(&e, "pool_id");
            sp__emit_tuple2(&e, 1, i < npools ? i + 1 : i - npools + 1); // the last two: known
            sp__emit_dict_end(&e);
        }
        sp__emit_list_end(&e);
        sp__emit_list_end(&e);
        sp__emit_dict_end(&e);
        return finish(&e);
    };
    tr_trace_t t;
    std::string err;
    ASSERT_TRUE(load(trace(65535), &t, &err)) << err;
    EXPECT_EQ(t.dev[0].npools, 65535u);
    EXPECT_EQ(t.dev[0].ev[65535].pool, 1u);
    EXPECT_EQ(t.dev[0].ev[65536].pool, 2u);
    tr_free(&t);
    EXPECT_FALSE(load(trace(65536), &t, &err));
    EXPECT_EQ(err, "device_traces[0][65535] (alloc): more than 65535 private pools on device 0");
    tr_free(&t);
}

namespace {

// A snapshot written opcode by opcode (protocol 4, no FRAME): what no pickler writes but a
// hostile file may. front() opens {"segments": [], "device_traces": [[ and back() closes them.
struct Pk {
    std::vector<unsigned char> b;
    Pk() {
        b.push_back(0x80);
        b.push_back(4);
    }
    Pk &op(std::initializer_list<unsigned char> o) {
        b.insert(b.end(), o);
        return *this;
    }
    Pk &str(const char *s) {
        size_t n = strlen(s);
        b.push_back(0x8c);
        b.push_back((unsigned char)n);
        b.insert(b.end(), s, s + n);
        return *this;
    }
    Pk &u64(uint64_t v) { // LONG1 of 9 bytes: a zero sign byte above any value
        b.insert(b.end(), {0x8a, 9});
        for (int i = 0; i < 8; i++)
            b.push_back((unsigned char)(v >> (8 * i)));
        b.push_back(0);
        return *this;
    }
    Pk &i32(int32_t v) { // BININT
        b.push_back('J');
        for (int i = 0; i < 4; i++)
            b.push_back((unsigned char)((uint32_t)v >> (8 * i)));
        return *this;
    }
    Pk &front() {
        op({'}', '('});
        str("segments").op({']'});
        return str("device_traces").op({']', ']', '('});
    }
    std::vector<unsigned char> back() {
        op({'e', 'a', 'u', '.'});
        return b;
    }
};

// What each loader makes of a file: pk_parse and tr_from_doc (the document whole, as the tests
// read it), the loader without stacks (`info`, `replay`: the reader skips every "frames" value
// and hands the entries over) and the loader with them (`plot`, `summary`, `replay --snapshot`).
struct Loaded {
    bool ok[3];
    std::string err[3]; // without the path
    uint64_t size0[3];  // dev 0's first event's size (when it loaded one)
    size_t nev[3];
    uint64_t final_reserved[3], final_allocated[3]; // dev 0's
    std::string conf[3], format[3];                 // the settings translated, the format
};

Loaded load_all(const std::vector<unsigned char> &b) {
    Loaded r{};
    std::string path = "loaders_" + std::to_string(getpid()) + ".pickle";
    std::ofstream(path, std::ios::binary).write((const char *)b.data(), (std::streamsize)b.size());
    for (int k = 0; k < 3; k++) {
        tr_trace_t t;
        memset(&t, 0, sizeof t);
        char why[512] = "";
        if (k == 0) {
            r.ok[k] = load(b, &t, &r.err[k]);
        } else {
            r.ok[k] = tr_load_opts(path.c_str(), k == 2, &t, why, sizeof why);
            std::string w = why;
            r.err[k] = w.rfind(path + ": ", 0) == 0 ? w.substr(path.size() + 2) : w;
        }
        if (r.ok[k] && t.ndev > 0) {
            r.nev[k] = t.dev[0].nev;
            r.size0[k] = t.dev[0].nev > 0 ? t.dev[0].ev[0].size : 0;
            r.final_reserved[k] = t.dev[0].final_reserved;
            r.final_allocated[k] = t.dev[0].final_allocated;
        }
        if (r.ok[k]) {
            r.conf[k] = t.settings.conf;
            r.format[k] = t.format;
        }
        tr_free(&t);
    }
    unlink(path.c_str());
    return r;
}

// Every loader loads it, with one event of `size` bytes; or every one refuses it with `want`.
void expect_all(const std::vector<unsigned char> &b, const char *want, uint64_t size,
                const std::string &what) {
    Loaded r = load_all(b);
    for (int k = 0; k < 3; k++) {
        SCOPED_TRACE(what + ", loader " + std::to_string(k));
        if (*want == '\0') {
            ASSERT_TRUE(r.ok[k]) << r.err[k];
            EXPECT_EQ(r.nev[k], 1u);
            EXPECT_EQ(r.size0[k], size);
        } else {
            EXPECT_FALSE(r.ok[k]);
            EXPECT_EQ(r.err[k], want);
        }
    }
}

constexpr uint64_t ADDR = 0x7f0000000000ull;

// An alloc entry's dict opened, its action and addr written: the caller adds the rest and 'u'.
Pk &alloc_head(Pk &p) {
    p.op({'}', '('});
    p.str("action").str("alloc").str("addr").u64(ADDR);
    return p;
}

class Loaders : public sp::Test {};

// A key that is no string right after a skipped "frames" value: the reader without stacks took it
// for an item of the stack and skipped on, past the stack's end, through the rest of the entry,
// then dropped the entry's items with it ("no 'action' string", where the other loaders read an
// alloc). Every loader reads the entry now, as pickle means it (a key that is no string is no
// field of an entry). A list whose items are the string "frames" and a list was cut the same way.
TEST_F(Loaders, AKeyThatIsNoStringAfterASkippedStackIsReadAlike) {
    struct Case {
        const char *what;
        std::function<void(Pk &)> after_frames; // the stack and what follows it, up to "size"
    };
    const Case cases[] = {
        {"int key after a stack of frames (APPENDS)",
         [](Pk &p) {
             p.op({']', '(', '}', '('}).str("name").str("f").op({'u', '}', 'e'});
             p.op({'K', 5, 'K', 0});
         }},
        {"None key after a stack of one frame (APPEND)",
         [](Pk &p) {
             p.op({']', '}', '('}).str("name").str("f").op({'u', 'a'});
             p.op({'N', 'K', 0});
         }},
        {"int key after an empty stack, its value a string",
         [](Pk &p) {
             p.op({']', 'K', 5}).str("size");
         }},
        {"tuple key made with a MARK right on top of the stack",
         [](Pk &p) {
             p.op({']', '(', 'K', 1, 'K', 2, 't', 'K', 0});
         }},
        {"tuple key made with TUPLE2",
         [](Pk &p) {
             p.op({']', 'K', 1, 'K', 2, 0x86, 'K', 0});
         }},
        {"bytes key",
         [](Pk &p) {
             p.op({']', 'C', 1, 'x', 'K', 0});
         }},
        {"float key",
         [](Pk &p) {
             p.op({']', 'G', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 'K', 0});
         }},
    };
    for (const Case &c : cases) {
        Pk p;
        p.front();
        alloc_head(p).str("frames");
        c.after_frames(p);
        p.str("size").i32(512).op({'u'});
        expect_all(p.back(), "", 512, c.what);
    }
    // A memoized int as the key: the memo holds 5 (put and popped before the entry).
    Pk m;
    m.front().op({'K', 5, 'q', 200, '0'});
    alloc_head(m).str("frames").op({']', 'h', 200, 'K', 0});
    m.str("size").i32(512).op({'u'});
    expect_all(m.back(), "", 512, "memoized int key");
    // device_traces [["frames", [], 7]]: entries that are no dicts, refused by every loader (the
    // reader without stacks took the list for a skipped stack, skipped the 7 with it and dropped
    // the entries, loading an empty trace). Without the 7 it read them, as the bytes key above.
    for (bool seven : {false, true}) {
        Pk l;
        l.front().str("frames").op({']'});
        if (seven)
            l.op({'K', 7});
        expect_all(l.back(), "device_traces[0][0]: no 'action' string", 0,
                   seven ? "\"frames\", [], 7 as entries" : "\"frames\", [] as entries");
    }
}

// Items added to an entry after its SETITEMS, through a memo reference (SETITEM, or SETITEMS
// after a batch of fewer than 1000 pairs, which no pickler writes): in pickle they are the
// entry's, the later value of a key replacing the earlier one. The reader without stacks had
// handed the entry over at its first SETITEMS and refused the file, while `plot` and `summary`
// read the later size. Every loader reads the later items now.
TEST_F(Loaders, ItemsAddedToAnEntryLaterAreItsItemsInEveryLoader) {
    for (int form = 0; form < 3; form++) {
        Pk p;
        p.front();
        p.op({'}', 'q', 100, '('}).str("action").str("alloc").str("addr").u64(ADDR);
        p.str("size").op({'q', 101}).i32(512).op({'u'});
        // After the entry, inside the entries' MARK: the entry again, a pair, POP.
        p.op({'h', 100});
        if (form == 0)
            p.op({'h', 101}).i32(1024).op({'s'});
        else if (form == 1)
            p.op({'('}).str("stream").i32(0).op({'h', 101}).i32(1024).op({'u'});
        else
            p.op({'(', 'u'}); // nothing added: the items stay the first SETITEMS's
        p.op({'0'});
        expect_all(p.back(), "", form == 2 ? 512 : 1024, "form " + std::to_string(form));
    }
}

// An event whose addr + size runs past 2^64 named no range any allocator has, yet loaded (and
// the analysis skipped it as no range): it is refused now in every loader, as a segment or a
// block of the final state that wraps is. An oom's device_free is no address and is not checked.
TEST_F(Loaders, EventsPastTheEndOfTheAddressSpaceAreRefused) {
    const uint64_t top = 0xfffffffffffff000ull;
    const struct {
        const char *action;
        uint64_t addr, size;
        const char *want;
    } cases[] = {
        {"alloc", top, 8192,
         "device_traces[0][0] (alloc): addr 0xfffffffffffff000 + size 8192 runs past the end of "
         "the address space"},
        {"alloc", top, 4096, // ends at 2^64 exactly: as a segment there, refused
         "device_traces[0][0] (alloc): addr 0xfffffffffffff000 + size 4096 runs past the end of "
         "the address space"},
        {"segment_map", top, 2 * MiB,
         "device_traces[0][0] (segment_map): addr 0xfffffffffffff000 + size 2097152 runs past "
         "the end of the address space"},
        {"free_requested", top, 8192,
         "device_traces[0][0] (free_requested): addr 0xfffffffffffff000 + size 8192 runs past "
         "the end of the address space"},
        {"alloc", top - 4096, 4096, ""},
        {"oom", top, 8192, ""},
    };
    for (const auto &c : cases) {
        Pk p;
        p.front();
        p.op({'}', '('}).str("action").str(c.action);
        p.str(strcmp(c.action, "oom") == 0 ? "device_free" : "addr").u64(c.addr);
        p.str("size").u64(c.size).op({'u'});
        expect_all(p.back(), c.want, c.size, c.action);
    }
}

// A dict the loader without stacks hands over as a trace entry (it has an action string) that is
// also a dict read elsewhere: a block or a segment of the final state, the allocator settings,
// the top level, or (any handed-over dict) the settings' roundup divisions. What the record kept
// cannot say what the dict holds there: the loader without stacks refused a block with an
// action ("missing 'size' or 'state'"), lost settings read from such a dict, and so on, where
// the loaders with stacks read the dict. It reads such a file whole now, as they do.
TEST_F(Loaders, AnEntrysDictReadElsewhereIsReadAlike) {
    const uint64_t seg = 2 * MiB;
    auto seg_head = [&](Pk &p) {
        p.op({'}', '('}).str("device").op({'K', 0}).str("address").u64(ADDR);
        p.str("total_size").i32((int32_t)seg).str("blocks");
    };
    // A block with an action string.
    Pk a;
    a.op({'}', '('}).str("segments").op({']', '('});
    seg_head(a);
    a.op({']', '(', '}', '('}).str("action").str("x").str("address").u64(ADDR);
    a.str("size").i32((int32_t)seg).str("requested_size").i32((int32_t)seg);
    a.str("state").str("active_allocated").op({'u', 'e', 'u', 'e'});
    a.str("device_traces").op({']', 'u', '.'});
    // An entry that is also the settings (max_split_size among its keys).
    Pk b;
    b.op({'}', '('}).str("segments").op({']'}).str("device_traces").op({']', ']', '('});
    b.op({'}', 'q', 100, '('}).str("action").str("alloc").str("addr").u64(ADDR);
    b.str("size").i32(512).str("max_split_size").i32(1 << 30).op({'u', 'e', 'a'});
    b.str("allocator_settings").op({'h', 100, 'u', '.'});
    // A final-state block that is also the settings' roundup divisions.
    Pk c;
    c.op({'}', '('}).str("segments").op({']', '('});
    seg_head(c);
    c.op({']', '(', '}', 'q', 100, '('}).str("state").str("inactive").str("size");
    c.i32((int32_t)seg).str("address").u64(ADDR).op({'u', 'e', 'u', 'e'});
    c.str("device_traces").op({']'}).str("allocator_settings").op({'}', '('});
    c.str("roundup_power2_divisions").op({'h', 100, 'u', 'u', '.'});
    // A segment with an action string.
    Pk d;
    d.op({'}', '('}).str("segments").op({']', '('});
    seg_head(d);
    d.op({']'}).str("action").str("segment_alloc").op({'u', 'e'});
    d.str("device_traces").op({']', 'u', '.'});
    // The top level with an action string.
    Pk e;
    e.op({'}', '('}).str("action").str("alloc").str("segments").op({']', 'u', '.'});
    const struct {
        const char *what;
        std::vector<unsigned char> b;
        uint64_t reserved, allocated;
        const char *conf; // nullptr: not checked beyond agreeing
    } cases[] = {
        {"block with an action", a.b, seg, seg, ""},
        {"entry as the settings", b.b, 0, 0, "max_split_size_mb:1024"},
        {"block as the roundup divisions", c.b, seg, 0, nullptr},
        {"segment with an action", d.b, seg, 0, ""},
        {"top level with an action", e.b, 0, 0, ""},
    };
    for (const auto &cs : cases) {
        Loaded r = load_all(cs.b);
        for (int k = 0; k < 3; k++) {
            SCOPED_TRACE(std::string(cs.what) + ", loader " + std::to_string(k));
            EXPECT_TRUE(r.ok[k]) << r.err[k];
            if (!r.ok[k])
                continue;
            EXPECT_EQ(r.final_reserved[k], cs.reserved);
            EXPECT_EQ(r.final_allocated[k], cs.allocated);
            EXPECT_EQ(r.conf[k], r.conf[0]);
            EXPECT_EQ(r.format[k], r.format[0]);
            if (cs.conf != nullptr) {
                EXPECT_EQ(r.conf[k], cs.conf);
            }
        }
    }
}

// A stream or a segment's blocks of a kind that names none (a string, a float, an int past 64
// bits; blocks that are no list) were read as the default stream and as no blocks, in every
// loader: the replay put those blocks on stream 0 and the starting state lost its blocks. They
// are refused now, naming the field. An int of either sign, and a bool, are streams as before.
TEST_F(Loaders, StreamsAndBlocksOfNoUsableKindAreRefused) {
    auto entry = [](std::function<void(Pk &)> stream) {
        Pk p;
        p.front();
        alloc_head(p).str("size").i32(512).str("stream");
        stream(p);
        p.op({'u'});
        return p.back();
    };
    expect_all(entry([](Pk &p) { p.str("7"); }),
               "device_traces[0][0] (alloc): 'stream' is not an integer (a stream handle)", 0,
               "string stream");
    expect_all(entry([](Pk &p) {
                   p.op({0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 1});
               }),
               "device_traces[0][0] (alloc): 'stream' is not an integer (a stream handle)", 0,
               "stream of 2^64");
    expect_all(entry([](Pk &p) {
                   p.op({'G', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0});
               }),
               "device_traces[0][0] (alloc): 'stream' is not an integer (a stream handle)", 0,
               "float stream");
    expect_all(entry([](Pk &p) { p.i32(-1); }), "", 512, "negative stream");
    expect_all(entry([](Pk &p) { p.op({0x88}); }), "", 512, "bool stream");
    auto segment = [](std::function<void(Pk &)> tail) {
        Pk p;
        p.op({'}', '('}).str("segments").op({']', '(', '}', '('}).str("device").op({'K', 0});
        p.str("address").u64(ADDR).str("total_size").i32(2 * 1024 * 1024);
        tail(p);
        p.op({'u', 'e'}).str("device_traces").op({']', 'u', '.'});
        return p.b;
    };
    auto refused = [](const std::vector<unsigned char> &b, const char *want, const char *what) {
        Loaded r = load_all(b);
        for (int k = 0; k < 3; k++) {
            SCOPED_TRACE(std::string(what) + ", loader " + std::to_string(k));
            EXPECT_FALSE(r.ok[k]);
            EXPECT_EQ(r.err[k], want);
        }
    };
    refused(segment([](Pk &p) { p.str("stream").str("s").str("blocks").op({']'}); }),
            "segments[0]: 'stream' is not an integer (a stream handle)", "segment's stream");
    refused(segment([](Pk &p) {
                p.str("blocks").op({'K', 5});
            }),
            "segments[0]: 'blocks' is not a list", "blocks an int");
    refused(segment([](Pk &p) { p.str("blocks").op({'N'}); }),
            "segments[0]: 'blocks' is not a list", "blocks None");
    Loaded r = load_all(segment([](Pk &p) { p.str("stream").i32(-3).str("blocks").op({']'}); }));
    for (int k = 0; k < 3; k++)
        EXPECT_TRUE(r.ok[k]) << r.err[k];
}

// A segment's is_expandable or segment_type of a kind PyTorch never writes (is_expandable is a
// bool, segment_type the str "small" or "large") was read as not expandable and as large (or
// guessed from the size) without a word. They are refused now, naming the field; absent (older
// snapshots) and PyTorch's own values load as before.
TEST_F(Loaders, SegmentKindAndTypeOfNoUsableKindAreRefused) {
    auto segment = [](std::function<void(Pk &)> field) {
        Pk p;
        p.op({'}', '('}).str("segments").op({']', '(', '}', '('}).str("device").op({'K', 0});
        p.str("address").u64(ADDR).str("total_size").i32(2 * 1024 * 1024);
        field(p);
        p.str("blocks").op({']'});
        p.op({'u', 'e'}).str("device_traces").op({']', 'u', '.'});
        return p.b;
    };
    const char *exp_err = "segments[0]: 'is_expandable' is not a bool";
    const char *type_err = "segments[0]: 'segment_type' is neither \"small\" nor \"large\"";
    struct Case {
        std::function<void(Pk &)> field;
        const char *want; // "" when it loads
        const char *what;
    };
    const Case cases[] = {
        {[](Pk &p) { p.str("is_expandable").str("True"); }, exp_err, "is_expandable 'True'"},
        {[](Pk &p) {
             p.str("is_expandable").op({'K', 1});
         },
         exp_err, "is_expandable 1"},
        {[](Pk &p) { p.str("is_expandable").op({'N'}); }, exp_err, "is_expandable None"},
        {[](Pk &p) {
             p.str("segment_type").op({'K', 1});
         },
         type_err, "segment_type 1"},
        {[](Pk &p) { p.str("segment_type").op({0x88}); }, type_err, "segment_type True"},
        {[](Pk &p) { p.str("segment_type").str("Small"); }, type_err, "segment_type 'Small'"},
        {[](Pk &p) { p.str("is_expandable").op({0x88}); }, "", "is_expandable True"},
        {[](Pk &p) { p.str("is_expandable").op({0x89}); }, "", "is_expandable False"},
        {[](Pk &p) { p.str("segment_type").str("small"); }, "", "segment_type 'small'"},
        {[](Pk &p) { p.str("segment_type").str("large"); }, "", "segment_type 'large'"},
        {[](Pk &) {}, "", "neither present"},
    };
    for (const Case &c : cases) {
        Loaded r = load_all(segment(c.field));
        for (int k = 0; k < 3; k++) {
            SCOPED_TRACE(std::string(c.what) + ", loader " + std::to_string(k));
            EXPECT_EQ(r.ok[k], c.want[0] == '\0');
            EXPECT_EQ(r.err[k], c.want);
        }
    }
}

} // namespace

// A trace's own user_metadata (PyTorch's _set_memory_metadata) is what the replay's entries
// carry: each op's text is set before it, "" again where the trace's is "" (or absent), and the
// alloc's segment_alloc carries the alloc's. Both loaders (the whole document; the entries
// handed over as parsed) read it. The replay used to write "" on every entry.
TEST_F(Replay, ReplaySnapshotCarriesTheTracesUserMetadata) {
    struct MEv {
        const char *action;
        uint64_t addr, size;
        const char *meta; // nullptr: no key
    };
    const MEv evs[] = {
        {"segment_alloc", SEG_A, 2 * MiB, "phase one"},
        {"alloc", SEG_A, 1000, "phase one"},
        {"alloc", SEG_A + 1024, 2000, ""},
        {"alloc", SEG_A + 4096, 3000, nullptr},
        {"free_requested", SEG_A, 1000, "phase two"},
        {"free_completed", SEG_A, 1000, "phase two"},
        {"free_requested", SEG_A + 1024, 2000, "phase one"},
        {"free_completed", SEG_A + 1024, 2000, "phase one"},
        {"free_requested", SEG_A + 4096, 3000, "phase \xc3\xa9 three"},
        {"free_completed", SEG_A + 4096, 3000, "phase \xc3\xa9 three"},
    };
    sp__emit_t e;
    begin_device0_events(&e);
    int64_t t = 1700000000000000ll;
    for (const MEv &ev : evs) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "action");
        sp__emit_str(&e, ev.action);
        sp__emit_key(&e, "addr");
        sp__emit_uint(&e, ev.addr);
        sp__emit_key(&e, "size");
        sp__emit_uint(&e, ev.size);
        sp__emit_key(&e, "stream");
        sp__emit_int(&e, 0);
        sp__emit_key(&e, "time_us");
        sp__emit_int(&e, t += 10);
        if (ev.meta != nullptr) {
            sp__emit_key(&e, "user_metadata");
            sp__emit_str(&e, ev.meta);
        }
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    std::vector<unsigned char> b = finish(&e);
    char dir[] = "/tmp/sp_replay_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    for (int loader = 0; loader < 2; loader++) {
        SCOPED_TRACE(loader == 0 ? "whole document" : "entries handed over");
        tr_trace_t tr;
        memset(&tr, 0, sizeof tr);
        std::string err;
        char why[256] = "";
        if (loader == 0)
            ASSERT_TRUE(load(b, &tr, &err)) << err;
        else
            ASSERT_TRUE(load_from_file(b, std::string(dir) + "/in.pickle", &tr, why, sizeof why))
                << why;
        std::string out = std::string(dir) + "/r.pickle";
        replay_result_t r;
        ASSERT_TRUE(replay_trace(&tr, out.c_str(), &r, why, sizeof(why))) << why;
        tr_free(&tr);
        pk_doc_t *doc = nullptr;
        ASSERT_TRUE(pk_parse_file(out.c_str(), 1u << 30, nullptr, &doc, why, sizeof why)) << why;
        unlink(out.c_str());
        const pk_value_t *entries = pk_at(pk_get(pk_root(doc), "device_traces"), 0);
        // (action, size) -> the metadata its entry carries, in order.
        std::vector<std::string> got;
        for (size_t i = 0; i < pk_len(entries); i++) {
            const pk_value_t *en = pk_at(entries, i);
            const char *act = pk_str(pk_get(en, "action"));
            const char *meta = pk_str(pk_get(en, "user_metadata"));
            int64_t size = 0;
            (void)pk_int(pk_get(en, "size"), &size);
            got.push_back(std::string(act ? act : "?") + " " + std::to_string(size) + " [" +
                          (meta ? meta : "(none)") + "]");
        }
        pk_free(doc);
        const std::vector<std::string> want = {"segment_alloc 2097152 [phase one]",
                                               "alloc 1000 [phase one]",
                                               "alloc 2000 []",
                                               "alloc 3000 []",
                                               "free_requested 1000 [phase two]",
                                               "free_completed 1000 [phase two]",
                                               "free_requested 2000 [phase one]",
                                               "free_completed 2000 [phase one]",
                                               "free_requested 3000 [phase \xc3\xa9 three]",
                                               "free_completed 3000 [phase \xc3\xa9 three]"};
        EXPECT_EQ(got, want);
        // The next replay (no metadata in its trace) starts from "" again.
        char buf[64] = "x";
        ASSERT_EQ(sp_history_get_user_metadata(0, buf, sizeof buf, nullptr), SP_SUCCESS);
        EXPECT_STREQ(buf, "");
    }
    rmdir(dir);
}

namespace {

// A frame dict {name, filename, line} opened and closed (no MEMOIZE: the caller adds one).
Pk &frame_dict(Pk &p, const char *name, unsigned char line) {
    p.op({'}', 0x94, '('}).str("name").str(name).str("filename").str("a.py");
    return p.str("line").op({'K', line, 'u'});
}

// Both file loaders of a pickle: without stacks (`replay`, `info`: the reader skips every
// "frames" value) in t[0], with them (`replay --snapshot`, `plot`) in t[1]; their messages, the
// path taken off, in err[0] and err[1].
struct TwoLoads {
    bool ok[2];
    std::string err[2];
    tr_trace_t t[2];
    explicit TwoLoads(const std::vector<unsigned char> &b) {
        std::string path = "two_loads_" + std::to_string(getpid()) + ".pickle";
        std::ofstream(path, std::ios::binary)
            .write((const char *)b.data(), (std::streamsize)b.size());
        for (int k = 0; k < 2; k++) {
            memset(&t[k], 0, sizeof t[k]);
            char why[512] = "";
            ok[k] = tr_load_opts(path.c_str(), k == 1, &t[k], why, sizeof why);
            std::string w = why;
            err[k] = w.rfind(path + ": ", 0) == 0 ? w.substr(path.size() + 2) : w;
        }
        unlink(path.c_str());
    }
    ~TwoLoads() {
        tr_free(&t[0]);
        tr_free(&t[1]);
    }
};

} // namespace

// Entries with the keys of the one before, in its order (a trace's entries, as PyTorch writes
// them), are read by the hook from their pairs in place, their four ints at once: each value
// must still read as it says, whatever its kind (a negative stream, one past 2^63, time_us at
// its bound), and a bad addr or time_us is refused as when read whole.
TEST_F(Loaders, EntriesOfTheLastOnesKeysReadAsEachSays) {
    struct E {
        const char *action;
        int64_t addr;    // BININT when it fits 32 bits, else LONG1
        uint64_t size;   // BININT
        bool stream_big; // stream 2^63 + 5 (LONG1, beyond int64_t) instead of stream_small
        int32_t stream_small;
        uint64_t time; // LONG1
    };
    auto entry = [](Pk &p, const E &e) {
        p.op({'}', '('}).str("action").str(e.action).str("addr");
        if (e.addr >= INT32_MIN && e.addr <= INT32_MAX)
            p.i32((int32_t)e.addr);
        else
            p.u64((uint64_t)e.addr);
        p.str("size").i32((int32_t)e.size).str("stream");
        if (e.stream_big)
            p.u64(((uint64_t)1 << 63) + 5);
        else
            p.i32(e.stream_small);
        p.str("time_us").u64(e.time).str("frames").op({']', 'u'});
    };
    const uint64_t t_max = (uint64_t)1 << 53;
    const E good[] = {{"alloc", (int64_t)ADDR, 512, false, 7, 100},
                      {"alloc", (int64_t)ADDR + 4096, 1024, false, -1, 200},
                      {"free_requested", (int64_t)ADDR, 512, true, 0, 300},
                      {"free_completed", (int64_t)ADDR, 512, false, 7, t_max}};
    Pk a;
    a.front();
    for (const E &e : good)
        entry(a, e);
    std::vector<unsigned char> b = a.back();
    TwoLoads l(b);
    tr_trace_t whole;
    std::string err;
    ASSERT_TRUE(load(b, &whole, &err)) << err;
    const tr_trace_t *ts[3] = {&l.t[0], &l.t[1], &whole};
    for (int k = 0; k < 3; k++) {
        SCOPED_TRACE("loader " + std::to_string(k));
        ASSERT_TRUE(k == 2 || l.ok[k]) << l.err[k];
        ASSERT_EQ(ts[k]->ndev, 1);
        ASSERT_EQ(ts[k]->dev[0].nev, 4u);
        const tr_event_t *ev = ts[k]->dev[0].ev;
        for (size_t i = 0; i < 4; i++) {
            SCOPED_TRACE("entry " + std::to_string(i));
            EXPECT_EQ(ev[i].addr, (uint64_t)good[i].addr);
            EXPECT_EQ(ev[i].size, good[i].size);
            EXPECT_EQ(ev[i].stream, good[i].stream_big ? ((uint64_t)1 << 63) + 5
                                                       : (uint64_t)(int64_t)good[i].stream_small);
            // the load without stacks keeps no times (k 0)
            EXPECT_EQ(tr_time_us(&ts[k]->dev[0], i), k == 0 ? 0 : (int64_t)good[i].time);
        }
        EXPECT_EQ(ev[0].action, TR_ALLOC);
        EXPECT_EQ(ev[2].action, TR_FREE_REQUESTED);
        EXPECT_EQ(ev[3].action, TR_FREE_COMPLETED);
    }
    tr_free(&whole);
    // The third entry (of the first two's keys) with a negative addr, or time_us past 2^53.
    struct Bad {
        E e;
        const char *want;
    };
    const Bad bad[] = {
        {{"alloc", -4096, 512, false, 7, 300},
         "device_traces[0][2] (alloc): missing or bad 'addr' or 'size'"},
        {{"alloc", (int64_t)ADDR + 8192, 512, false, 7, t_max + 1},
         "device_traces[0][2] (alloc): time_us is not a time in [0, 2^53] microseconds"},
    };
    for (const Bad &x : bad) {
        Pk p;
        p.front();
        entry(p, good[0]);
        entry(p, good[1]);
        entry(p, x.e);
        expect_all(p.back(), x.want, 0, x.want);
    }
}

// What skipping a "frames" value must keep for the rest of the document (the memo): a dict
// memoized inside one entry's frames list and fetched outside any (here it is the trace's third
// entry) is the entry it is, in the loader that skips stacks too (it reads such a file whole);
// a skipped list fetched again as another entry's "frames", and frame dicts fetched inside
// another frames list, are skipped again without reading the file whole, and read as one list
// and the same dicts with stacks.
TEST_F(Loaders, FramesSkippedKeepWhatTheMemoFetchesLater) {
    // Memo: 0 entry 1, 1 its frames list, 2 frame f, 3 the dict e inside that list, 4 frame g.
    Pk a;
    a.front();
    a.op({'}', 0x94, '('}).str("action").str("alloc").str("addr").u64(ADDR);
    a.str("size").i32(512).str("frames").op({']', 0x94, '('});
    frame_dict(a, "f", 3);
    a.op({'}', 0x94, '('}).str("action").str("alloc").str("addr").u64(ADDR + 4096);
    a.str("size").i32(1024).op({'u'});
    frame_dict(a, "g", 4);
    a.op({'e', 'u'});
    // Entry 2 frees entry 1's block with entry 1's stack, fetched by the memo.
    a.op({'}', '('}).str("action").str("free_requested").str("addr").u64(ADDR);
    a.str("size").i32(512).str("frames").op({'h', 1, 'u'});
    // Entry 4 with a stack of the frame dicts f and g, fetched by the memo.
    a.op({'}', '('}).str("action").str("free_requested").str("addr").u64(ADDR);
    a.str("size").i32(512).str("frames").op({']', '(', 'h', 2, 'h', 4, 'e', 'u'});
    std::vector<unsigned char> shared = Pk(a).back();
    // The same with the dict e, made inside entry 1's frames, as the third entry.
    std::vector<unsigned char> fetched = a.op({'h', 3}).back();

    {
        TwoLoads l(shared);
        for (int k = 0; k < 2; k++) {
            SCOPED_TRACE("shared, frames " + std::to_string(k));
            ASSERT_TRUE(l.ok[k]) << l.err[k];
            ASSERT_EQ(l.t[k].ndev, 1);
            ASSERT_EQ(l.t[k].dev[0].nev, 3u);
            EXPECT_EQ(l.t[k].dev[0].ev[0].action, TR_ALLOC);
            EXPECT_EQ(l.t[k].dev[0].ev[1].action, TR_FREE_REQUESTED);
            EXPECT_EQ(l.t[k].dev[0].ev[2].addr, ADDR);
        }
        // Without stacks none is kept; with them entry 2's is entry 1's list, entry 3's its own
        // list of the same frames.
        const tr_device_t *d0 = &l.t[0].dev[0], *d = &l.t[1].dev[0];
        EXPECT_EQ(tr_frames(d0, 0), nullptr);
        EXPECT_EQ(tr_frames(d0, 1), nullptr);
        EXPECT_EQ(tr_frames(d0, 2), nullptr);
        ASSERT_EQ(pk_len(tr_frames(d, 0)), 3u);
        EXPECT_EQ(tr_frames(d, 1), tr_frames(d, 0));
        ASSERT_EQ(pk_len(tr_frames(d, 2)), 2u);
        EXPECT_EQ(pk_at(tr_frames(d, 2), 0), pk_at(tr_frames(d, 0), 0));
        EXPECT_EQ(pk_at(tr_frames(d, 2), 1), pk_at(tr_frames(d, 0), 2));
        EXPECT_STREQ(pk_get_str(pk_at(tr_frames(d, 2), 1), "name"), "g");
    }
    {
        TwoLoads l(fetched);
        for (int k = 0; k < 2; k++) {
            SCOPED_TRACE("fetched, frames " + std::to_string(k));
            ASSERT_TRUE(l.ok[k]) << l.err[k];
            ASSERT_EQ(l.t[k].ndev, 1);
            ASSERT_EQ(l.t[k].dev[0].nev, 4u);
            const tr_event_t &e = l.t[k].dev[0].ev[3];
            EXPECT_EQ(e.action, TR_ALLOC);
            EXPECT_EQ(e.addr, ADDR + 4096);
            EXPECT_EQ(e.size, 1024u);
        }
    }
}

// Whatever is wrong inside a skipped "frames" value is refused by the loader that skips it with
// the message of the one that reads it (what pickle.load refuses): every cut of the file, a
// memo key never set among a stack's references (one of a run of BINGETs, of LONG_BINGETs, and
// after a MEMOIZE that left a hole), a frame's name that is not UTF-8, a frame dict with an odd
// SETITEMS.
TEST_F(Loaders, WhatIsWrongInsideASkippedStackIsRefusedAsWhenReadWhole) {
    // Memo 0..199: ints; 200: entry 2's list, 201 its frame dict: a stack of eight BINGETs,
    // four LONG_BINGETs, a frame dict, and a run of both again.
    Pk p;
    p.front();
    p.op({'}', '('}).str("action").str("alloc").str("addr").u64(ADDR).str("size").i32(512);
    p.str("frames").op({']', '('});
    for (int i = 0; i < 200; i++)
        p.op({'M', (unsigned char)i, (unsigned char)(i >> 8), 0x94});
    p.op({'e'});
    p.op({'u'});
    p.op({'}', '('}).str("action").str("alloc").str("addr").u64(ADDR + 512).str("size").i32(512);
    p.str("frames").op({']', 0x94, '('});
    const size_t run_h = p.b.size();
    for (int i = 0; i < 8; i++)
        p.op({'h', (unsigned char)(10 + i)});
    const size_t run_j = p.b.size();
    for (int i = 0; i < 4; i++)
        p.op({'j', (unsigned char)(100 + i), 0, 0, 0});
    const size_t frame = p.b.size();
    frame_dict(p, "f", 7);
    const size_t mixed = p.b.size();
    p.op({'h', 20, 'j', 2, 0, 0, 0, 'h', 21, 'j', 1, 0, 0, 0, 'h', 22, 'e', 'u'});
    std::vector<unsigned char> good = p.back();
    {
        TwoLoads l(good);
        ASSERT_TRUE(l.ok[0]) << l.err[0];
        ASSERT_TRUE(l.ok[1]) << l.err[1];
        EXPECT_EQ(l.t[0].dev[0].nev, 2u);
        EXPECT_EQ(pk_len(tr_frames(&l.t[1].dev[0], 1)), 8u + 4u + 1u + 5u);
    }
    auto refused_alike = [](const std::vector<unsigned char> &b, const std::string &what) {
        TwoLoads l(b);
        SCOPED_TRACE(what);
        EXPECT_FALSE(l.ok[0]);
        EXPECT_FALSE(l.ok[1]);
        EXPECT_EQ(l.err[0], l.err[1]);
        return l.err[0];
    };
    for (size_t cut = run_h - 4; cut < good.size() - 4; cut++)
        refused_alike(std::vector<unsigned char>(good.begin(), good.begin() + (long)cut),
                      "cut at " + std::to_string(cut));
    std::vector<unsigned char> b = good;
    b[run_h + 2 * 5 + 1] = 0xfe; // the sixth BINGET: key 254, never set
    EXPECT_EQ(refused_alike(b, "BINGET"),
              "pickle: memo key 254 is not defined at offset " + std::to_string(run_h + 10));
    b = good;
    b[run_j + 5 * 2 + 2] = 0x7f; // the third LONG_BINGET: key 0x7f66
    EXPECT_EQ(refused_alike(b, "LONG_BINGET"), "pickle: memo key " + std::to_string(0x7f66) +
                                                   " is not defined at offset " +
                                                   std::to_string(run_j + 10));
    b = good;
    b[mixed + 4] = 1; // the mixed run's first LONG_BINGET: key 0x102 (258), never set
    EXPECT_EQ(refused_alike(b, "mixed run"),
              "pickle: memo key 258 is not defined at offset " + std::to_string(mixed + 2));
    // A put past the next slot leaves a hole below it: a reference into the hole is refused.
    b = good;
    b.insert(b.begin() + (long)mixed, {'N', 'r', 0x10, 0x27, 0, 0, '0'}); // memo 10000 = None
    {
        TwoLoads l(b); // the mixed run's keys, below the hole: set
        EXPECT_TRUE(l.ok[0]) << l.err[0];
        EXPECT_TRUE(l.ok[1]) << l.err[1];
    }
    // Slots 0..201 and 10000 are set: 203 of them, so that key 202 lies below that count and
    // is still no key set (the count alone cannot tell a hole).
    b[mixed + 7 + 3] = 202; // the mixed run's first LONG_BINGET
    EXPECT_EQ(refused_alike(b, "hole"),
              "pickle: memo key 202 is not defined at offset " + std::to_string(mixed + 7 + 2));
    b = good;
    const size_t name = frame + 3 + 2 + 4 + 2; // the frame's name "f"
    ASSERT_EQ(b[name], 'f');
    b[name] = 0xff;
    EXPECT_NE(refused_alike(b, "name").find("is not UTF-8"), std::string::npos);
    b = good;
    b.insert(b.begin() + (long)(mixed - 1), {'K', 1}); // a seventh item before the SETITEMS
    EXPECT_EQ(refused_alike(b, "odd SETITEMS"),
              "pickle: SETITEMS with an odd number of items at offset " +
                  std::to_string(mixed + 1));
}

namespace {

// A final state's segments as PyTorch pickles them (protocol 4, MEMOIZE): the first writes its
// keys and its "large" and memoizes them, the rest refer to them (the reader's segment path
// takes those: keys that are references, ints of every width, the pool id a TUPLE2, False,
// "frames" the first segment's list again or a fresh one, then the blocks, one (APPEND) or more
// (MARK ... APPENDS)). Segment i: address ADDR + i * 2^24, 2 MiB + i * 4096 bytes, stream i % 3
// (a LONG1 for 2), pool (0, 0) or (1, 7) or (2^40, 3) (LONG1 in the tuple), blocks of 4096
// bytes, the first active.
struct SegPk {
    Pk p;
    std::map<std::string, unsigned char> memo; // what was memoized, by key
    unsigned next = 0;                         // the next MEMOIZE's index
    unsigned char put() {
        p.op({0x94});
        return (unsigned char)next++;
    }
    void key(const char *k) {
        auto it = memo.find(k);
        if (it != memo.end()) {
            p.op({'h', it->second});
        } else {
            p.str(k);
            memo[k] = put();
        }
    }
    void block(uint64_t addr, bool active) {
        p.op({'}'});
        put();
        p.op({'('});
        key("address");
        p.u64(addr);
        key("size");
        p.i32(4096);
        key("requested_size");
        p.i32(4000);
        key("state");
        key(active ? "active_allocated" : "inactive");
        key("frames");
        p.op({']'});
        put();
        p.op({'u'});
    }
    void segment(unsigned i, unsigned nblocks) {
        uint64_t addr = ADDR + ((uint64_t)i << 24), size = (2u << 20) + i * 4096u;
        p.op({'}'});
        put();
        p.op({'('});
        key("device");
        p.op({'K', 0});
        key("address");
        p.u64(addr);
        key("total_size");
        p.i32((int32_t)size);
        key("allocated_size");
        p.op({'M', 0, 0x10}); // 4096, a BININT2
        key("active_size");
        p.op({'K', 0});
        key("requested_size");
        p.op({'K', 0});
        key("stream");
        if (i % 3 == 2)
            p.op({0x8a, 1, 2});
        else
            p.op({'K', (unsigned char)(i % 3)});
        key("segment_type");
        key("large");
        key("segment_pool_id");
        if (i % 4 == 1)
            p.op({'K', 1, 'K', 7, 0x86});
        else if (i % 4 == 3)
            p.op({0x8a, 6, 0, 0, 0, 0, 0, 1, 'K', 3, 0x86});
        else
            p.op({'K', 0, 'K', 0, 0x86});
        put();
        key("is_expandable");
        p.op({0x89});
        key("frames");
        if (i % 2 == 0 && memo.count("frames list") != 0) {
            p.op({'h', memo["frames list"]});
        } else {
            p.op({']'});
            memo["frames list"] = put();
        }
        key("blocks");
        p.op({']'});
        put();
        if (nblocks > 1)
            p.op({'('});
        for (unsigned b = 0; b < nblocks; b++)
            block(addr + 4096u * b, b == 0);
        p.op({nblocks > 1 ? (unsigned char)'e' : (unsigned char)'a', 'u'});
    }
    // {"segments": [segments 0 .. n), "device_traces": [[]]}
    std::vector<unsigned char> snapshot(unsigned n) {
        p.op({'}', '('});
        p.str("segments").op({']', '('});
        for (unsigned i = 0; i < n; i++)
            segment(i, 1 + i % 3);
        p.op({'e'});
        p.str("device_traces").op({']', ']', '('});
        return p.back();
    }
};

// What a loader made of a final state, to compare loaders by (but the free blocks only the
// loader with stacks keeps).
std::string final_state(const tr_trace_t &t) {
    std::ostringstream o;
    o << "segments " << t.nsegments << " ndev " << t.ndev;
    for (int d = 0; d < t.ndev; d++) {
        const tr_device_t &v = t.dev[d];
        o << "\ndev " << d << " reserved " << v.final_reserved << " allocated " << v.final_allocated
          << " start_bytes " << v.start_bytes << " streams " << v.nstreams;
        for (size_t k = 0; k < v.npools; k++)
            o << "\n pool " << v.pools[k].first << "," << v.pools[k].second;
        for (size_t k = 0; k < v.nstart; k++)
            o << "\n seg " << v.start[k].addr << " " << v.start[k].size << " " << v.start[k].stream
              << " pool " << v.start[k].pool << " small " << v.start[k].is_small << " blocks "
              << v.start[k].n;
        for (size_t k = 0; k < v.nsblocks; k++)
            o << "\n block " << v.sblocks[k].addr << " " << v.sblocks[k].size << " "
              << v.sblocks[k].req;
        for (size_t k = 0; k < v.nseeds; k++)
            o << "\n seed " << v.seeds[k].addr << " " << v.seeds[k].size << " " << v.seeds[k].bsize
              << " " << v.seeds[k].stream << " pool " << v.seeds[k].pool;
    }
    return o.str();
}

} // namespace

// The final state's segments, read in place by the loader without stacks (segment after segment
// of one shape: the reader's segment path), are what the whole document says: every segment,
// its pool id, stream and blocks, as the reader of the whole document and the loader with stacks
// read them.
TEST_F(Loaders, SegmentsOfOneShapeReadAsWhole) {
    SegPk s;
    std::vector<unsigned char> b = s.snapshot(12);
    tr_trace_t whole;
    memset(&whole, 0, sizeof whole);
    std::string err;
    ASSERT_TRUE(load(b, &whole, &err)) << err;
    std::string want = final_state(whole);
    EXPECT_EQ(whole.nsegments, 12u);
    ASSERT_EQ(whole.ndev, 1);
    EXPECT_EQ(whole.dev[0].nstart, 12u);
    EXPECT_EQ(whole.dev[0].npools, 2u); // (1, 7) and (2^40, 3)
    tr_free(&whole);
    TwoLoads l(b);
    for (int k = 0; k < 2; k++) {
        SCOPED_TRACE("loader " + std::to_string(k));
        ASSERT_TRUE(l.ok[k]) << l.err[k];
        EXPECT_EQ(final_state(l.t[k]), want);
    }
}

// A final state cut anywhere inside its segments, or with a byte of them changed, is refused or
// read by the loader without stacks as by the reader of the whole document: what the segment
// path cannot take goes to the general loop, which says what is wrong where.
TEST_F(Loaders, SegmentsCutOrChangedAreReadAsWhole) {
    SegPk s;
    std::vector<unsigned char> b = s.snapshot(6);
    // From the second segment on (the first one memoizes the keys) to the end.
    size_t from = 0;
    for (size_t i = 40; i + 1 < b.size() && from == 0; i++)
        if (b[i] == '}' && b[i + 1] == 0x94 && b[i + 2] == '(' && b[i + 3] == 'h')
            from = i;
    ASSERT_NE(from, 0u);
    auto same = [&](const std::vector<unsigned char> &c, const std::string &what) {
        tr_trace_t whole;
        memset(&whole, 0, sizeof whole);
        std::string err;
        bool ok = load(c, &whole, &err);
        std::string want = ok ? final_state(whole) : err;
        tr_free(&whole); // what a refused load made too
        TwoLoads l(c);
        SCOPED_TRACE(what);
        ASSERT_EQ(l.ok[0], ok) << l.err[0] << " / " << err;
        EXPECT_EQ(ok ? final_state(l.t[0]) : l.err[0], want);
    };
    for (size_t cut = from; cut < b.size(); cut++) {
        std::vector<unsigned char> c(b.begin(), b.begin() + (long)cut);
        c.push_back('.');
        same(c, "cut at " + std::to_string(cut));
    }
    const unsigned char repl[] = {'h', 'j', 'K', 'M', 'J', 0x8a, 0x86, 0x85, 0x87, 0x88, 0x89, ']',
                                  '}', '(', 'e', 'a', 'u', 's',  0x94, 'q',  '0',  'N',  0xff};
    for (size_t i = from; i < b.size() - 1; i++)
        for (unsigned char r : repl) {
            if (b[i] == r)
                continue;
            std::vector<unsigned char> c = b;
            c[i] = r;
            same(c, "byte " + std::to_string(i) + " = " + std::to_string(r));
        }
}
