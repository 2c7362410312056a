// test_pickle.cc: the snapshot writer (core/core_emit.c) byte by byte, and the restricted
// reader (tools/pickle_read.c): round trips, real PyTorch snapshots, and every kind of bad input
// (malformed, truncated, hostile, oversized) giving a clean error with an offset, under a
// deterministic fuzzer.
#include "sp_test.hpp"

#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include "core/core_emit.h"
#include "tools/pickle_read.h"
}

namespace {

using Bytes = std::vector<unsigned char>;

// The skipping reader and the record reader (its hook given a counter for the ids it hands out)
// on one document, skipping "frames": whether each read it, and their messages.
struct TwoReads {
    bool skip_ok, rec_ok;
    std::string skip_err, rec_err;
};
static TwoReads read_skip_and_records(const Bytes &c, pk_record_fn hook) {
    char e1[256] = "", e2[256] = "";
    pk_doc_t *d1 = nullptr, *d2 = nullptr;
    uint64_t taken = 0;
    bool ok1 = pk_parse_skip(c.data(), c.size(), nullptr, "frames", &d1, e1, sizeof e1);
    bool ok2 =
        pk_parse_records(c.data(), c.size(), nullptr, "frames", hook, &taken, &d2, e2, sizeof e2);
    pk_free(d1);
    pk_free(d2);
    return {ok1, ok2, e1, e2};
}

Bytes finish(sp__emit_t *e) {
    char *buf = nullptr;
    size_t len = 0;
    EXPECT_EQ(sp__emit_finish(e, &buf, &len), SP_SUCCESS);
    Bytes out(buf, buf + len);
    free(buf);
    return out;
}

std::string as_string(const Bytes &b) {
    return std::string(b.begin(), b.end());
}

Bytes read_file(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    return Bytes(s.begin(), s.end());
}

std::string data_dir() {
    const char *d = getenv("SP_TEST_DATA_DIR");
    return d ? d : SP_TEST_DATA_DIR_DEFAULT;
}

// Parse; on failure return the error text (and "" on success, with *doc_p set when wanted).
std::string parse(const Bytes &b, pk_doc_t **doc_p = nullptr, const pk_limits_t *lim = nullptr) {
    pk_doc_t *doc = nullptr;
    char err[256] = "";
    if (!pk_parse(b.data(), b.size(), lim, &doc, err, sizeof(err))) {
        EXPECT_EQ(doc, nullptr);
        EXPECT_NE(std::string(err), "");
        return err;
    }
    if (doc_p)
        *doc_p = doc;
    else
        pk_free(doc);
    return "";
}

// The emitter holds 32 open containers in itself and the rest on the heap (the JSON reader
// writes what json.load reads, thousands deep): both forms, and a discard while deep.
TEST(PickleWrite, NestsPastItsOwnArrays) {
    const int deepest = 1000;
    for (int json = 0; json < 2; json++) {
        sp__emit_t e;
        sp__emit_init(&e, json != 0);
        for (int i = 0; i < deepest; i++) {
            sp__emit_list_begin(&e);
            sp__emit_int(&e, i);
        }
        for (int i = 0; i < deepest; i++)
            sp__emit_list_end(&e);
        char *buf = nullptr;
        size_t len = 0;
        ASSERT_EQ(sp__emit_finish(&e, &buf, &len), SP_SUCCESS);
        std::string out(buf, len);
        free(buf);
        if (json) {
            std::string want;
            for (int i = 0; i < deepest; i++)
                want += (i ? ",[" : "[") + std::to_string(i);
            want += std::string(deepest, ']') + "\n";
            EXPECT_EQ(out, want);
            continue;
        }
        pk_doc_t *doc = nullptr;
        ASSERT_EQ(parse(Bytes(out.begin(), out.end()), &doc), "");
        const pk_value_t *v = pk_root(doc);
        int depth = 0;
        while (v->type == PK_LIST && v->u.seq.n == 2 && v->u.seq.items[0]->u.i == depth) {
            v = v->u.seq.items[1];
            depth++;
        }
        EXPECT_EQ(depth, deepest - 1);
        pk_free(doc);
    }
    sp__emit_t e;
    sp__emit_init(&e, false);
    for (int i = 0; i < deepest; i++)
        sp__emit_dict_begin(&e);
    sp__emit_discard(&e); // frees the heap arrays (ASan would say otherwise)
    // Out of memory growing them is out of host memory, as the buffer's is.
    sp__emit_init(&e, false);
    for (int i = 0; i < SP__EMIT_MAX_DEPTH; i++)
        sp__emit_list_begin(&e);
    sp__emit_fault_after(1);
    sp__emit_list_begin(&e);
    sp__emit_fault_after(0);
    for (int i = 0; i <= SP__EMIT_MAX_DEPTH; i++)
        sp__emit_list_end(&e);
    char *buf = nullptr;
    size_t len = 0;
    EXPECT_EQ(sp__emit_finish(&e, &buf, &len), SP_ERR_SYSTEM);
    EXPECT_EQ(buf, nullptr);
}

TEST(PickleWrite, SmallSnapshotOpcodeByOpcode) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_dict_begin(&e);
    sp__emit_key(&e, "segments");
    sp__emit_list_begin(&e);
    sp__emit_dict_begin(&e);
    sp__emit_key(&e, "device");
    sp__emit_int(&e, 0);
    sp__emit_key(&e, "address");
    sp__emit_uint(&e, 0x7f0000000000ull);
    sp__emit_key(&e, "segment_pool_id");
    sp__emit_tuple2(&e, 0, 1);
    sp__emit_key(&e, "is_expandable");
    sp__emit_bool(&e, false);
    sp__emit_key(&e, "frames");
    sp__emit_list_begin(&e);
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    sp__emit_list_end(&e);
    sp__emit_key(&e, "x");
    sp__emit_double(&e, 0.5);
    sp__emit_key(&e, "n");
    sp__emit_none(&e);
    sp__emit_dict_end(&e);
    Bytes b = finish(&e);

    const unsigned char want[] = {
        0x80, 4,                                               // PROTO 4
        '}',  '(',                                             // EMPTY_DICT MARK
        0x8c, 8,   's', 'e', 'g',  'm',  'e',  'n',  't', 's', // SHORT_BINUNICODE "segments"
        ']',  '(',                                             // EMPTY_LIST MARK
        '}',  '(',                                             // EMPTY_DICT MARK
        0x8c, 6,   'd', 'e', 'v',  'i',  'c',  'e',  'K', 0,   // "device" BININT1 0
        0x8c, 7,   'a', 'd', 'd',  'r',  'e',  's',  's',      // "address"
        0x8a, 6,   0,   0,   0,    0,    0x00, 0x7f,           // LONG1 6 bytes 0x7f0000000000
        0x8c, 15,  's', 'e', 'g',  'm',  'e',  'n',  't', '_', 'p', 'o', 'o', 'l', '_',
        'i',  'd', 'K', 0,   'K',  1,    0x86, // TUPLE2 (0, 1)
        0x8c, 13,  'i', 's', '_',  'e',  'x',  'p',  'a', 'n', 'd', 'a', 'b', 'l', 'e',
        0x89,                                             // NEWFALSE
        0x8c, 6,   'f', 'r', 'a',  'm',  'e',  's',  ']', // empty list: no MARK/APPENDS
        'u',                                              // SETITEMS (segment dict)
        'e',                                              // APPENDS (segments list)
        0x8c, 1,   'x', 'G', 0x3f, 0xe0, 0,    0,    0,   0,   0,   0, // BINFLOAT 0.5 big-endian
        0x8c, 1,   'n', 'N',                                           // NONE
        'u',  '.'};                                                    // SETITEMS STOP
    ASSERT_EQ(b.size(), sizeof(want));
    for (size_t i = 0; i < sizeof(want); i++)
        ASSERT_EQ(b[i], want[i]) << "byte " << i;

    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(b, &doc), "");
    const pk_value_t *root = pk_root(doc);
    const pk_value_t *seg = pk_at(pk_get(root, "segments"), 0);
    int64_t v = -1;
    EXPECT_TRUE(pk_get_int(seg, "address", &v));
    EXPECT_EQ(v, 0x7f0000000000ll);
    const pk_value_t *pid = pk_get(seg, "segment_pool_id");
    ASSERT_NE(pid, nullptr);
    EXPECT_EQ(pid->type, PK_TUPLE);
    EXPECT_EQ(pk_len(pid), 2u);
    double x = 0;
    EXPECT_TRUE(pk_num(pk_get(root, "x"), &x));
    EXPECT_EQ(x, 0.5);
    EXPECT_EQ(pk_get(root, "n")->type, PK_NONE);
    pk_free(doc);
}

TEST(PickleWrite, IntegerEncodingsRoundTrip) {
    const int64_t vals[] = {0,
                            1,
                            255,
                            256,
                            65535,
                            65536,
                            -1,
                            -128,
                            -129,
                            INT32_MAX,
                            INT32_MIN,
                            (int64_t)INT32_MAX + 1,
                            (int64_t)INT32_MIN - 1,
                            1ll << 47,
                            -(1ll << 47),
                            INT64_MAX,
                            INT64_MIN};
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_list_begin(&e);
    for (int64_t v : vals)
        sp__emit_int(&e, v);
    sp__emit_list_end(&e);
    Bytes b = finish(&e);
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(b, &doc), "");
    const pk_value_t *l = pk_root(doc);
    ASSERT_EQ(pk_len(l), sizeof(vals) / sizeof(vals[0]));
    for (size_t i = 0; i < pk_len(l); i++) {
        int64_t got = 0;
        ASSERT_TRUE(pk_int(pk_at(l, i), &got));
        EXPECT_EQ(got, vals[i]) << "index " << i;
    }
    pk_free(doc);
    // Exact encodings of the boundaries.
    auto enc = [](int64_t v) {
        sp__emit_t e2;
        sp__emit_init(&e2, false);
        sp__emit_int(&e2, v);
        Bytes out = finish(&e2);
        return Bytes(out.begin() + 2, out.end() - 1); // strip PROTO and STOP
    };
    EXPECT_EQ(enc(255), (Bytes{'K', 255}));
    EXPECT_EQ(enc(256), (Bytes{'M', 0, 1}));
    EXPECT_EQ(enc(-1), (Bytes{'J', 0xff, 0xff, 0xff, 0xff}));
    EXPECT_EQ(enc((int64_t)INT32_MAX + 1), (Bytes{0x8a, 5, 0, 0, 0, 0x80, 0}));
    EXPECT_EQ(enc((int64_t)INT32_MIN - 1), (Bytes{0x8a, 5, 0xff, 0xff, 0xff, 0x7f, 0xff}));
}

TEST(PickleWrite, LargeContainersAreBatchedAndStringsLong) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_list_begin(&e);
    for (int i = 0; i < 2500; i++)
        sp__emit_int(&e, i);
    sp__emit_str(&e, std::string(300, 'a').c_str()); // BINUNICODE
    sp__emit_str(&e, "bad\xff utf8");                // replaced, length kept
    sp__emit_list_end(&e);
    Bytes b = finish(&e);
    size_t appends = 0;
    for (unsigned char c : b)
        appends += c == 'e';
    EXPECT_GE(appends, 3u); // 1000 + 1000 + 502, as CPython batches
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(b, &doc), "");
    const pk_value_t *l = pk_root(doc);
    ASSERT_EQ(pk_len(l), 2502u);
    int64_t v = 0;
    EXPECT_TRUE(pk_int(pk_at(l, 1999), &v));
    EXPECT_EQ(v, 1999);
    EXPECT_EQ(std::string(pk_str(pk_at(l, 2500))), std::string(300, 'a'));
    EXPECT_EQ(std::string(pk_str(pk_at(l, 2501))), "bad? utf8");
    pk_free(doc);
}

TEST(PickleWrite, MemoWritesSharedValuesOnce) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_list_begin(&e);
    sp__emit_list_begin(&e);
    sp__emit_str(&e, "frame");
    sp__emit_list_end(&e);
    uint32_t idx = sp__emit_memoize(&e);
    EXPECT_EQ(idx, 0u);
    for (int i = 0; i < 300; i++)
        sp__emit_memo_get(&e, idx);
    sp__emit_list_end(&e);
    Bytes b = finish(&e);
    // The inner list, MEMOIZE, then BINGET 0 for every later use.
    const unsigned char head[] = {0x80, 4,   ']', '(', ']',  '(', 0x8c, 5,   'f', 'r',
                                  'a',  'm', 'e', 'e', 0x94, 'h', 0,    'h', 0};
    ASSERT_GE(b.size(), sizeof(head));
    for (size_t i = 0; i < sizeof(head); i++)
        EXPECT_EQ(b[i], head[i]) << "byte " << i;
    EXPECT_LT(b.size(), 2 * 300 + 40u);
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(b, &doc), "");
    const pk_value_t *l = pk_root(doc);
    ASSERT_EQ(pk_len(l), 301u);
    EXPECT_EQ(pk_at(l, 300), pk_at(l, 0)); // the same value, by reference
    EXPECT_STREQ(pk_str(pk_at(pk_at(l, 300), 0)), "frame");
    pk_free(doc);
    // JSON has no references: a memoized container is copied, byte for byte; nothing that is
    // not a container just closed can be memoized.
    sp__emit_t j;
    sp__emit_init(&j, true);
    EXPECT_EQ(sp__emit_memoize(&j), UINT32_MAX);
    sp__emit_list_begin(&j);
    sp__emit_dict_begin(&j);
    sp__emit_key(&j, "name");
    sp__emit_str(&j, "f\"x");
    sp__emit_dict_end(&j);
    uint32_t ji = sp__emit_memoize(&j);
    EXPECT_EQ(ji, 0u);
    sp__emit_int(&j, 7);
    EXPECT_EQ(sp__emit_memoize(&j), UINT32_MAX);
    for (int i = 0; i < 2; i++)
        sp__emit_memo_get(&j, ji);
    sp__emit_list_end(&j);
    Bytes jb = finish(&j);
    EXPECT_EQ(std::string(jb.begin(), jb.end()),
              "[{\"name\":\"f\\\"x\"},7,{\"name\":\"f\\\"x\"},{\"name\":\"f\\\"x\"}]\n");
}

TEST(PickleWrite, JsonForm) {
    sp__emit_t e;
    sp__emit_init(&e, true);
    sp__emit_dict_begin(&e);
    sp__emit_key(&e, "a");
    sp__emit_list_begin(&e);
    sp__emit_int(&e, -3);
    sp__emit_uint(&e, UINT64_MAX);
    sp__emit_double(&e, 1.5);
    sp__emit_bool(&e, true);
    sp__emit_none(&e);
    sp__emit_list_end(&e);
    sp__emit_key(&e, "s\"q");
    sp__emit_str(&e, "tab\there\\");
    sp__emit_key(&e, "t");
    sp__emit_tuple2(&e, 0, 7);
    sp__emit_key(&e, "empty");
    sp__emit_dict_begin(&e);
    sp__emit_dict_end(&e);
    sp__emit_dict_end(&e);
    EXPECT_EQ(as_string(finish(&e)),
              "{\"a\":[-3,18446744073709551615,1.5,true,null],\"s\\\"q\":\"tab\\u0009here\\\\\","
              "\"t\":[0,7],\"empty\":{}}\n");
}

// A float in JSON is written as json.dumps writes it (Python's float repr): the shortest digits
// that read back as the value, always in a float's form. "%.17g" wrote 0.0 as "0", which
// json.load (and sp_x_json_to_pickle) read as the int 0, and 0.8 as 0.80000000000000004.
TEST(JsonWrite, FloatsReadBackAsTheSameFloat) {
    const double vals[] = {0.0, -0.0, 0.8, 100.0, 1e15, 1e16, 1e-4, 1e-5, 1.0 / 3, 2.5e-300, 1e22};
    sp__emit_t e;
    sp__emit_init(&e, true);
    sp__emit_list_begin(&e);
    for (double v : vals)
        sp__emit_double(&e, v);
    sp__emit_list_end(&e);
    std::string text = as_string(finish(&e));
    EXPECT_EQ(text, "[0.0,-0.0,0.8,100.0,1000000000000000.0,1e+16,0.0001,1e-05,"
                    "0.3333333333333333,2.5e-300,1e+22]\n");
    // Each reads back as a float (a '.' or an exponent) equal to what was written.
    size_t i = 0;
    for (const char *p = text.c_str() + 1; i < sizeof vals / sizeof vals[0]; i++) {
        size_t n = strcspn(p, ",]");
        std::string num(p, n);
        EXPECT_NE(num.find_first_of(".e"), std::string::npos) << num;
        EXPECT_EQ(strtod(num.c_str(), nullptr), vals[i]) << num;
        p += n + 1;
    }
}

// A Python str in the emitter's C-string form (0xC0 0x80 for U+0000, a surrogate's 3 bytes for a
// lone surrogate) is written as that str: pickle as CPython's pickler writes it (a 0 byte, the
// 'surrogatepass' bytes, the length counting them), JSON as json.dumps escapes it. Both were '?'.
// Other invalid bytes are still '?', one per byte.
TEST(PickleWrite, NulAndLoneSurrogatesAreThePythonStr) {
    const char *s = "a\xc0\x80"
                    "b\xed\xa0\x80"
                    "c\xed\xbf\xbf\xff";
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_str(&e, s);
    std::string p = as_string(finish(&e));
    EXPECT_EQ(p, std::string("\x80\x04\x8c\x0b"
                             "a\0b\xed\xa0\x80"
                             "c\xed\xbf\xbf?.",
                             16));
    sp__emit_init(&e, true);
    sp__emit_dict_begin(&e);
    sp__emit_key(&e, "k\xc0\x80");
    sp__emit_str(&e, s);
    sp__emit_dict_end(&e);
    EXPECT_EQ(as_string(finish(&e)), "{\"k\\u0000\":\"a\\u0000b\\ud800c\\udfff?\"}\n");
}

// An integer past 64 bits from its decimal text (a JSON snapshot's) is written as CPython's
// pickler writes it: LONG1 with the shortest two's complement, little-endian.
TEST(PickleWrite, IntegerTextIsCPythonsLong) {
    struct Case {
        const char *text;
        std::string want; // after PROTO 4, before STOP
    } cases[] = {
        {"18446744073709551616", std::string("\x8a\x09\0\0\0\0\0\0\0\0\x01", 11)},
        {"-18446744073709551616", std::string("\x8a\x09\0\0\0\0\0\0\0\0\xff", 11)},
        {"-9223372036854775809", "\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\xff"},
        {"1180591620717411303424", std::string("\x8a\x09\0\0\0\0\0\0\0\0\x40", 11)},
        {"-128", "\x8a\x01\x80"},
        {"255", std::string("\x8a\x02\xff\0", 4)},
    };
    for (const Case &c : cases) {
        sp__emit_t e;
        sp__emit_init(&e, false);
        sp__emit_int_text(&e, c.text, strlen(c.text));
        std::string p = as_string(finish(&e));
        EXPECT_EQ(p, "\x80\x04" + c.want + ".") << c.text;
    }
}

TEST(PickleWrite, MisuseIsReported) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_list_begin(&e);
    sp__emit_key(&e, "not in a dict");
    char *buf = nullptr;
    size_t len = 0;
    sp__log_set_fn([](sp_log_level_t, const char *, void *) {}, nullptr);
    EXPECT_NE(sp__emit_finish(&e, &buf, &len), SP_SUCCESS);
    sp__log_set_fn(nullptr, nullptr);
    EXPECT_EQ(buf, nullptr);
}

// ---- reader ---------------------------------------------------------------------------------

TEST(PickleRead, RealPyTorchSnapshot) {
    Bytes b = read_file(data_dir() + "/cs336-2.7b-ctx128-forward-bf16.pickle");
    ASSERT_GT(b.size(), 1000000u);
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(b, &doc), "");
    const pk_value_t *root = pk_root(doc);
    EXPECT_EQ(pk_len(pk_get(root, "segments")), 688u);
    EXPECT_EQ(pk_len(pk_at(pk_get(root, "device_traces"), 0)), 5992u);
    const pk_value_t *e0 = pk_at(pk_at(pk_get(root, "device_traces"), 0), 0);
    EXPECT_STREQ(pk_get_str(e0, "action"), "segment_alloc");
    int64_t size = 0;
    EXPECT_TRUE(pk_get_int(e0, "size", &size));
    EXPECT_EQ(size, 20971520);
    // Memoized frames are shared values, and reachable.
    EXPECT_GT(pk_len(pk_get(e0, "frames")), 10u);
    double gc = -1;
    EXPECT_TRUE(
        pk_num(pk_get(pk_get(root, "allocator_settings"), "garbage_collection_threshold"), &gc));
    EXPECT_EQ(gc, 0.0);
    pk_free(doc);
}

TEST(PickleRead, HostileOpcodesAreRejectedByName) {
    // pickle.dumps(os.system) style: GLOBAL 'os\nsystem' ... REDUCE.
    Bytes global = {0x80, 2, 'c', 'o', 's', '\n', 's', 'y', 's', 't', 'e', 'm', '\n', '.'};
    EXPECT_EQ(parse(global), "pickle: opcode GLOBAL at offset 2 not allowed");
    Bytes reduce = {0x80, 4, ']', ')', 'R', '.'};
    EXPECT_EQ(parse(reduce), "pickle: opcode REDUCE at offset 4 not allowed");
    const struct {
        unsigned char op;
        const char *name;
    } bad[] = {{0x93, "STACK_GLOBAL"}, {'b', "BUILD"},       {'i', "INST"},  {'o', "OBJ"},
               {0x81, "NEWOBJ"},       {0x92, "NEWOBJ_EX"},  {0x82, "EXT1"}, {'P', "PERSID"},
               {'Q', "BINPERSID"},     {0x97, "NEXT_BUFFER"}};
    for (auto &x : bad) {
        Bytes b = {0x80, 4, 'N', x.op, '.'};
        EXPECT_EQ(parse(b), std::string("pickle: opcode ") + x.name + " at offset 3 not allowed");
    }
}

// STOP returns what pickle.load returns: the value on top of the stack above the innermost MARK,
// whatever lies below it or is left open (both were refused: "STOP with 2 values on the stack",
// "STOP with an open MARK"). Skipping and the record hook cannot know what they changed there:
// they ask for the whole read (tr_load then reads it whole).
TEST(PickleRead, StopReturnsTheTopValueAsPickleLoadDoes) {
    struct Case {
        Bytes b;
        int64_t want;
    } cases[] = {
        {{0x80, 4, 'N', 'K', 5, '.'}, 5},
        {{0x80, 4, '(', 'K', 6, '.'}, 6},
        {{0x80, 4, 'K', 1, '(', 'N', 'K', 7, '.'}, 7},
        {{0x80, 4, '}', '(', 'K', 1, 'K', 2, 'K', 8, '.'}, 8},
    };
    auto take = [](void *arg, pk_value_t *const *, size_t, uint64_t *id_p) {
        *id_p = (*(uint64_t *)arg)++;
        return 1;
    };
    for (const Case &c : cases) {
        pk_doc_t *doc = nullptr;
        ASSERT_EQ(parse(c.b, &doc), "");
        int64_t v = 0;
        EXPECT_TRUE(pk_int(pk_root(doc), &v));
        EXPECT_EQ(v, c.want);
        pk_free(doc);
        TwoReads r = read_skip_and_records(c.b, take);
        EXPECT_FALSE(r.skip_ok);
        EXPECT_FALSE(r.rec_ok);
        EXPECT_TRUE(pk_err_whole(r.skip_err.c_str())) << r.skip_err;
        EXPECT_TRUE(pk_err_whole(r.rec_err.c_str())) << r.rec_err;
    }
}

TEST(PickleRead, MalformedInputsGiveOffsets) {
    EXPECT_EQ(parse(Bytes{}), "pickle: empty input at offset 0");
    EXPECT_EQ(parse(Bytes{0x80, 6, 'N', '.'}),
              "pickle: protocol 6 not supported (0-5 are) at offset 0");
    EXPECT_EQ(parse(Bytes{0x80, 4, 'N'}), "pickle: truncated pickle (no STOP) at offset 3");
    EXPECT_EQ(parse(Bytes{0x80, 4, '.'}),
              "pickle: STOP with 0 values on the stack (1 expected) at offset 2");
    EXPECT_EQ(parse(Bytes{0x80, 4, '(', '.'}),
              "pickle: STOP with an open MARK and no value after it at offset 3");
    EXPECT_EQ(parse(Bytes{0x80, 4, 'N', '(', '.'}),
              "pickle: STOP with an open MARK and no value after it at offset 4");
    EXPECT_EQ(parse(Bytes{0x80, 4, 'h', 3, '.'}), "pickle: memo key 3 is not defined at offset 2");
    EXPECT_EQ(parse(Bytes{0x80, 4, 'u', '.'}), "pickle: SETITEMS without MARK at offset 2");
    EXPECT_EQ(parse(Bytes{0x80, 4, ']', '(', 'N', 'u', '.'}),
              "pickle: SETITEMS target is not a dict at offset 5");
    EXPECT_EQ(parse(Bytes{0x80, 4, '}', '(', 'N', 'u', '.'}),
              "pickle: SETITEMS with an odd number of items at offset 5");
    EXPECT_EQ(parse(Bytes{0x80, 4, 'a', '.'}),
              "pickle: APPEND needs 2 values on the stack at offset 2");
    EXPECT_EQ(parse(Bytes{0x80, 4, 'I', '1', 'x', '\n', '.'}),
              "pickle: INT argument '1x' is not a decimal integer (digits after an optional sign; "
              "no pickler writes other forms) at offset 2");
    EXPECT_EQ(parse(Bytes{0x80, 4, 0xff, '.'}), "pickle: unknown opcode 0xff at offset 2");
    // A length that runs past the end.
    EXPECT_EQ(parse(Bytes{0x80, 4, 'X', 0xff, 0xff, 0xff, 0x7f, 'a', '.'}),
              "pickle: truncated string (needs 2147483647 bytes, 2 left) at offset 2");
    EXPECT_EQ(parse(Bytes{0x80, 4, 0x8d, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '.'}),
              "pickle: truncated string (needs 18446744073709551615 bytes, 1 left) at offset 2");
    EXPECT_EQ(parse(Bytes{0x80, 4, 0x95, 0xff, 0, 0, 0, 0, 0, 0, 0, 'N', '.'}),
              "pickle: FRAME of 255 bytes runs past the end at offset 2");
    EXPECT_EQ(parse(Bytes{0x80, 4, 0x8b, 0, 0, 0, 0x80, '.'}),
              "pickle: LONG4 with a negative length at offset 2");
    // A 9-byte LONG1 that still fits (sign extension) is fine.
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(
        parse(Bytes{0x80, 4, 0x8a, 9, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '.'},
              &doc),
        "");
    int64_t v = 0;
    EXPECT_TRUE(pk_int(pk_root(doc), &v));
    EXPECT_EQ(v, -2);
    pk_free(doc);
}

// Every integer in [-2^63, 2^64) keeps its value and signedness; wider ones
// load as PK_BIGINT (the document is not refused) and only the accessors that need a value fail.
TEST(PickleRead, IntegersOfEveryWidthLoad) {
    struct Case {
        Bytes arg; // LONG1 payload
        pk_type_t type;
        int64_t i;
        uint64_t u;
    };
    const Case cases[] = {
        {{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00}, PK_UINT, 0, UINT64_MAX},
        {{0, 0, 0, 0, 0, 0, 0, 0x80, 0x00}, PK_UINT, 0, 1ull << 63},
        {{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, PK_INT, INT64_MAX, 0},
        {{0, 0, 0, 0, 0, 0, 0, 0x80}, PK_INT, INT64_MIN, 0},
        {{0, 0, 0, 0, 0, 0, 0, 0x80, 0xff}, PK_INT, INT64_MIN, 0},
        {{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff}, PK_BIGINT, 0, 0}, // -2^63-1
        {{0, 0, 0, 0, 0, 0, 0, 0, 0x01}, PK_BIGINT, 0, 0},                         // 2^64
        {{}, PK_INT, 0, 0},
        {{0x80}, PK_INT, -128, 0},
    };
    for (const Case &c : cases) {
        Bytes b = {0x80, 4, 0x8a, (unsigned char)c.arg.size()};
        b.insert(b.end(), c.arg.begin(), c.arg.end());
        b.push_back('.');
        pk_doc_t *doc = nullptr;
        ASSERT_EQ(parse(b, &doc), "");
        const pk_value_t *v = pk_root(doc);
        EXPECT_EQ(v->type, c.type);
        int64_t i = 0;
        uint64_t u = 0;
        double d = 0;
        EXPECT_EQ(pk_int(v, &i), c.type == PK_INT);
        EXPECT_EQ(pk_uint(v, &u), c.type == PK_UINT || (c.type == PK_INT && c.i >= 0));
        EXPECT_EQ(pk_num(v, &d), c.type != PK_BIGINT);
        if (c.type == PK_INT) {
            EXPECT_EQ(i, c.i);
        }
        if (c.type == PK_UINT) {
            EXPECT_EQ(u, c.u);
            EXPECT_EQ(d, (double)c.u);
        }
        pk_free(doc);
    }
    // A 300-byte LONG4 inside a dict: the dict loads, the other key is usable.
    Bytes b = {0x80, 4, '}', '(', 'X', 1, 0, 0, 0, 'a', 0x8b, 0x2c, 0x01, 0, 0};
    b.insert(b.end(), 300, 0x11);
    Bytes tail = {'X', 1, 0, 0, 0, 'b', 'K', 7, 'u', '.'};
    b.insert(b.end(), tail.begin(), tail.end());
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(b, &doc), "");
    EXPECT_EQ(pk_get(pk_root(doc), "a")->type, PK_BIGINT);
    EXPECT_EQ(pk_get(pk_root(doc), "a")->u.bits, 300u);
    int64_t i = 0;
    EXPECT_FALSE(pk_get_int(pk_root(doc), "a", &i));
    EXPECT_TRUE(pk_get_int(pk_root(doc), "b", &i));
    EXPECT_EQ(i, 7);
    pk_free(doc);
}

TEST(PickleRead, TextIsNotAPickle) {
    const std::string text = "# sympool\n";
    EXPECT_EQ(parse(Bytes(text.begin(), text.end())),
              "pickle: not a pickle (its first byte, 0x23, is no pickle opcode; a pickle of "
              "protocol 2-5 starts with 0x80, PROTO) at offset 0");
    // A byte that is an opcode: a pickle of protocol 0 or 1 (no PROTO) starts so, and is read.
    // python3's pickle.dumps({"segments": [], "ok": True}) with protocol=0 and protocol=1:
    EXPECT_EQ(parse(Bytes{'h', 3, '.'}), "pickle: memo key 3 is not defined at offset 0");
    const Bytes p0 = {40,  100, 112, 48, 10, 86, 115, 101, 103, 109, 101, 110, 116,
                      115, 10,  112, 49, 10, 40, 108, 112, 50,  10,  115, 86,  111,
                      107, 10,  112, 51, 10, 73, 48,  49,  10,  115, 46};
    const Bytes p1 = {125, 113, 0,   40,  88,  8,  0,  0,   0,  115, 101, 103, 109,
                      101, 110, 116, 115, 113, 1,  93, 113, 2,  88,  2,   0,   0,
                      0,   111, 107, 113, 3,   73, 48, 49,  10, 117, 46};
    for (const Bytes &b : {p0, p1}) {
        pk_doc_t *doc = nullptr;
        ASSERT_EQ(parse(b, &doc), "");
        EXPECT_EQ(pk_len(pk_get(pk_root(doc), "segments")), 0u);
        EXPECT_EQ(pk_get(pk_root(doc), "segments")->type, PK_LIST);
        EXPECT_EQ(pk_get(pk_root(doc), "ok")->type, PK_BOOL);
        EXPECT_TRUE(pk_get(pk_root(doc), "ok")->u.b);
        pk_free(doc);
    }
    EXPECT_STREQ(pk_opcode_name(0x80), "PROTO");
    EXPECT_STREQ(pk_opcode_name(0x98), "READONLY_BUFFER");
    EXPECT_EQ(pk_opcode_name('#'), nullptr);
}

// pickle.load (the C unpickler) has no limit on open MARKs: its stack of them grows. Neither has
// this reader by default, with or without the record hook (which keeps a second array per MARK).
// A list nested 200,000 deep, one MARK per level, as python3's pickle.loads reads it.
TEST(PickleRead, NestingIsBoundOnlyByTheInput) {
    const size_t deepest = 200000;
    Bytes b = {0x80, 4};
    for (size_t i = 0; i < deepest; i++) {
        b.push_back(']');
        b.push_back('(');
    }
    b.push_back('N');
    b.insert(b.end(), deepest, 'e');
    b.push_back('.');
    for (int hook = 0; hook < 2; hook++) {
        pk_doc_t *doc = nullptr;
        char err[256] = "";
        auto fn = [](void *, pk_value_t *const *, size_t, uint64_t *) { return 0; };
        ASSERT_TRUE(pk_parse_records(b.data(), b.size(), nullptr, nullptr, hook ? +fn : nullptr,
                                     nullptr, &doc, err, sizeof(err)))
            << err;
        const pk_value_t *v = pk_root(doc);
        size_t depth = 0;
        while (v->type == PK_LIST && v->u.seq.n == 1) {
            v = v->u.seq.items[0];
            depth++;
        }
        EXPECT_EQ(depth, deepest);
        EXPECT_EQ(v->type, PK_NONE);
        pk_free(doc);
    }
    // Only the end of the input stops a run of MARKs (pickle.load: "Ran out of input").
    Bytes marks = {0x80, 4};
    marks.insert(marks.end(), (size_t)4 << 20, '(');
    EXPECT_EQ(parse(marks), "pickle: truncated pickle (no STOP) at offset 4194306");
}

// Protocol 4 pickles a set and a frozenset with EMPTY_SET, ADDITEMS and FROZENSET (protocols 2
// and 3 with GLOBAL builtins.set and REDUCE, refused as every GLOBAL is). python3's
// pickle.dumps({"a": {1, 2}, "b": frozenset({"x"}), frozenset({3}): [set()]}, protocol=4):
TEST(PickleRead, SetsAsPythonPicklesThem) {
    const Bytes b = {128, 4,   149, 38, 0,  0, 0,   0,   0,   0,   0,   125, 148, 40,  140, 1, 97,
                     148, 143, 148, 40, 75, 1, 75,  2,   144, 140, 1,   98,  148, 40,  140, 1, 120,
                     148, 145, 148, 40, 75, 3, 145, 148, 93,  148, 143, 148, 97,  117, 46};
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(b, &doc), "");
    const pk_value_t *root = pk_root(doc);
    ASSERT_EQ(root->type, PK_DICT);
    ASSERT_EQ(root->u.seq.n, 6u);
    const pk_value_t *a = root->u.seq.items[1], *fb = root->u.seq.items[3];
    const pk_value_t *key = root->u.seq.items[4], *list = root->u.seq.items[5];
    ASSERT_EQ(a->type, PK_SET);
    EXPECT_TRUE(a->unhashable);
    ASSERT_EQ(a->u.seq.n, 2u);
    EXPECT_EQ(a->u.seq.items[1]->u.i, 2);
    ASSERT_EQ(fb->type, PK_SET);
    EXPECT_FALSE(fb->unhashable);
    ASSERT_EQ(fb->u.seq.n, 1u);
    EXPECT_EQ(std::string(fb->u.seq.items[0]->u.str.s), "x");
    EXPECT_EQ(key->type, PK_SET);
    EXPECT_FALSE(key->unhashable);
    ASSERT_EQ(list->type, PK_LIST);
    ASSERT_EQ(list->u.seq.n, 1u);
    EXPECT_EQ(list->u.seq.items[0]->type, PK_SET);
    EXPECT_EQ(list->u.seq.items[0]->u.seq.n, 0u);
    pk_free(doc);
    // Protocol 2 (pickle.dumps({1}, protocol=2) starts so).
    const Bytes p2 = {128, 2,  99, 95,  95,  98,  117, 105, 108, 116, 105, 110,
                      95,  95, 10, 115, 101, 116, 10,  113, 0,   93,  113, 1,
                      75,  1,  97, 133, 113, 2,   82,  113, 3,   46};
    EXPECT_EQ(parse(p2), "pickle: opcode GLOBAL at offset 2 not allowed");
}

TEST(PickleRead, LimitsBoundDepthMemoAndSizes) {
    pk_limits_t lim;
    pk_limits_default(&lim);
    lim.max_depth = 4;
    Bytes deep = {0x80, 4};
    for (int i = 0; i < 5; i++)
        deep.push_back('(');
    deep.push_back('.');
    EXPECT_EQ(parse(deep, nullptr, &lim), "pickle: nesting deeper than 4 at offset 6");
    pk_limits_default(&lim);
    lim.max_memo = 100;
    EXPECT_EQ(parse(Bytes{0x80, 4, 'N', 'r', 0x10, 0x27, 0, 0, '.'}, nullptr, &lim),
              "pickle: memo index 10000 exceeds the limit of 100 at offset 3");
    pk_limits_default(&lim);
    lim.max_str = 4;
    EXPECT_EQ(parse(Bytes{0x80, 4, 0x8c, 5, 'a', 'b', 'c', 'd', 'e', '.'}, nullptr, &lim),
              "pickle: string of 5 bytes exceeds the limit of 4 at offset 2");
    pk_limits_default(&lim);
    lim.max_values = 3;
    EXPECT_EQ(parse(Bytes{0x80, 4, ']', '(', 'N', 'N', 'N', 'e', '.'}, nullptr, &lim),
              "pickle: more than 3 values at offset 6");
    // The default memo bound refuses a huge LONG_BINPUT index instead of allocating for it.
    EXPECT_EQ(parse(Bytes{0x80, 4, 'N', 'r', 0xff, 0xff, 0xff, 0xff, '.'}),
              "pickle: memo index 4294967295 exceeds the limit of 16777216 at offset 3");
}

// A count of values refuses, in the whole-document reader (summary, plot, replay --snapshot),
// what the readers that skip stacks (info, replay) read: they make a fraction of the values. With
// 2^26 by default, a snapshot with stacks past that loaded in one command and not in the other.
// By default nothing counts them now: every opcode that makes a value is at least a byte, so the
// document's size bounds them (as it bounds what pickle.load makes of it).
TEST(PickleRead, DefaultLimitsCountNoValues) {
    Bytes b = {0x80, 4, '}', '(', 0x8c, 6, 'f', 'r', 'a', 'm', 'e', 's', ']', '('};
    for (int i = 0; i < 50; i++)
        b.push_back('N');
    b.insert(b.end(), {'e', 0x8c, 1, 'x', 'K', 1, 'u', '.'});
    pk_limits_t lim;
    pk_limits_default(&lim);
    lim.max_values = 20; // what a count does: the two readers disagree
    EXPECT_EQ(parse(b, nullptr, &lim), "pickle: more than 20 values at offset 31");
    pk_doc_t *d = nullptr;
    char err[256] = "";
    EXPECT_TRUE(pk_parse_skip(b.data(), b.size(), &lim, "frames", &d, err, sizeof err)) << err;
    pk_free(d);
    pk_limits_default(&lim);
    EXPECT_EQ(lim.max_values, SIZE_MAX);
    EXPECT_EQ(parse(b), "");
}

TEST(PickleRead, EveryTruncationFailsCleanly) {
    Bytes b = read_file(data_dir() + "/trace-small-p4.pickle");
    ASSERT_GT(b.size(), 10000u);
    ASSERT_EQ(parse(b), "");
    // Every prefix up to 4 KiB, then a stride through the rest.
    for (size_t n = 0; n < b.size(); n += n < 4096 ? 1 : 97) {
        Bytes p(b.begin(), b.begin() + n);
        std::string err = parse(p);
        ASSERT_NE(err, "") << "prefix " << n;
        ASSERT_NE(err.find("at offset"), std::string::npos) << err;
    }
}

// xorshift64*: deterministic across platforms.
struct Rng {
    uint64_t s;
    uint64_t next() {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 0x2545f4914f6cdd1dull;
    }
    size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }
};

TEST(PickleRead, FuzzMutatedRealTracesAndRandomBytes) {
    Bytes small = read_file(data_dir() + "/trace-small-p4.pickle");
    ASSERT_FALSE(small.empty());
    // Our own writer's output too.
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_dict_begin(&e);
    sp__emit_key(&e, "segments");
    sp__emit_list_begin(&e);
    for (int i = 0; i < 50; i++) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "address");
        sp__emit_uint(&e, 0x7f0000000000ull + (uint64_t)i * 2097152);
        sp__emit_key(&e, "pool");
        sp__emit_tuple2(&e, 0, i);
        sp__emit_key(&e, "name");
        sp__emit_str(&e, "block");
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    sp__emit_dict_end(&e);
    Bytes ours = finish(&e);
    const Bytes *seeds[] = {&small, &ours};
    const unsigned char interesting[] = {'(',  ')', ']', '}',  'u',  'e',  'a',  's',  't', '.',
                                         'h',  'j', 'q', 'r',  0x94, 0x95, 0x8a, 0x8b, 'X', 0x8c,
                                         0x8d, 'c', 'R', 0x80, 0x85, 0x86, 0x87, '0',  '1', '2'};
    Rng rng{0x5eed5eedull};
    size_t ok = 0, failed = 0;
    for (int iter = 0; iter < 3000; iter++) {
        Bytes b = *seeds[iter % 2];
        int kind = (int)rng.below(5);
        int nmut = 1 + (int)rng.below(8);
        for (int m = 0; m < nmut && !b.empty(); m++) {
            size_t at = rng.below(b.size());
            switch (kind) {
            case 0:
                b[at] = (unsigned char)rng.next();
                break; // random byte
            case 1:
                b[at] = interesting[rng.below(sizeof(interesting))];
                break; // opcode byte
            case 2:
                b.erase(b.begin() + (long)at,
                        b.begin() + (long)std::min(b.size(), at + 1 + rng.below(16)));
                break;
            case 3: { // duplicate a slice somewhere else
                size_t from = rng.below(b.size());
                size_t len = std::min(b.size() - from, 1 + rng.below(32));
                Bytes slice(b.begin() + (long)from, b.begin() + (long)(from + len));
                b.insert(b.begin() + (long)at, slice.begin(), slice.end());
                break;
            }
            default:
                b[at] ^= (unsigned char)(1u << rng.below(8));
                break; // bit flip
            }
        }
        pk_doc_t *doc = nullptr;
        char err[256] = "";
        if (pk_parse(b.data(), b.size(), nullptr, &doc, err, sizeof(err))) {
            ok++;
            pk_free(doc);
        } else {
            failed++;
            ASSERT_NE(strstr(err, "at offset"), nullptr) << err;
        }
    }
    // Pure random bytes behind a valid header, and without one.
    for (int iter = 0; iter < 2000; iter++) {
        Bytes b;
        if (iter % 2 == 0) {
            b.push_back(0x80);
            b.push_back(4);
        }
        size_t n = 1 + rng.below(300);
        for (size_t i = 0; i < n; i++)
            b.push_back(iter % 3 == 0 ? interesting[rng.below(sizeof(interesting))]
                                      : (unsigned char)rng.next());
        pk_doc_t *doc = nullptr;
        char err[256] = "";
        if (pk_parse(b.data(), b.size(), nullptr, &doc, err, sizeof(err)))
            pk_free(doc);
        else
            ASSERT_NE(strstr(err, "at offset"), nullptr) << err;
    }
    EXPECT_GT(failed, 100u); // the mutations do hit the checks
    (void)ok;
}

} // namespace

// Fixed keys and names are written once and referred to after (pickle); JSON writes them each
// time. The document reads back the same.
TEST(PickleWrite, StaticStringsAreMemoized) {
    for (bool json : {false, true}) {
        sp__emit_t e;
        sp__emit_init(&e, json);
        sp__emit_list_begin(&e);
        for (int i = 0; i < 3; i++) {
            sp__emit_dict_begin(&e);
            sp__emit_key_static(&e, "action");
            sp__emit_str_static(&e, "free_requested");
            sp__emit_dict_end(&e);
        }
        sp__emit_list_end(&e);
        Bytes b = finish(&e);
        std::string text(b.begin(), b.end());
        size_t n = 0;
        for (size_t at = text.find("free_requested"); at != std::string::npos;
             at = text.find("free_requested", at + 1))
            n++;
        EXPECT_EQ(n, json ? 3u : 1u);
        if (json)
            continue;
        pk_doc_t *doc = nullptr;
        ASSERT_EQ(parse(b, &doc), "");
        for (size_t i = 0; i < 3; i++)
            EXPECT_STREQ(pk_get_str(pk_at(pk_root(doc), i), "action"), "free_requested");
        pk_free(doc);
    }
}

// The one-call pairs write in JSON what the key and value calls write, plain keys and keys
// that need escaping alike.
TEST(PickleWrite, PairsInOneCallWriteTheSameJson) {
    std::string out[2];
    for (int form = 0; form < 2; form++) {
        sp__emit_t e;
        sp__emit_init(&e, true);
        sp__emit_list_begin(&e);
        for (int i = 0; i < 2; i++) {
            sp__emit_dict_begin(&e);
            if (form == 0) {
                sp__emit_key_static(&e, "action");
                sp__emit_str_static(&e, "alloc\"x");
                sp__emit_key_static(&e, "a\"ddr");
                sp__emit_uint(&e, UINT64_MAX - (uint64_t)i);
                sp__emit_key_static(&e, "time_us");
                sp__emit_int(&e, INT64_MIN + i);
            } else {
                sp__emit_kv_str_static(&e, "action", "alloc\"x");
                sp__emit_kv_uint(&e, "a\"ddr", UINT64_MAX - (uint64_t)i);
                sp__emit_kv_int(&e, "time_us", INT64_MIN + i);
            }
            sp__emit_dict_end(&e);
        }
        sp__emit_list_end(&e);
        out[form] = as_string(finish(&e));
    }
    EXPECT_EQ(out[0], out[1]);
    EXPECT_NE(out[1].find("{\"action\":\"alloc\\\"x\",\"a\\\"ddr\":18446744073709551615,"
                          "\"time_us\":-9223372036854775808}"),
              std::string::npos)
        << out[1];
}

// JSON numbers are the decimal digits printf gives, at every digit count and its edges.
TEST(PickleWrite, JsonNumbersAreDecimal) {
    std::vector<uint64_t> us = {0, UINT64_MAX, (uint64_t)INT64_MAX, (uint64_t)INT64_MAX + 1};
    for (uint64_t p = 1; p <= UINT64_MAX / 10; p *= 10)
        for (uint64_t d : {p - 1, p, p + 1, 2 * p + 3, 9 * p + 9})
            us.push_back(d);
    sp__emit_t e;
    sp__emit_init(&e, true);
    sp__emit_list_begin(&e);
    std::string want = "[";
    for (size_t i = 0; i < us.size(); i++) {
        sp__emit_uint(&e, us[i]);
        int64_t neg = us[i] <= (uint64_t)INT64_MAX ? -(int64_t)us[i] : INT64_MIN;
        sp__emit_int(&e, neg);
        char b[64];
        snprintf(b, sizeof b, "%s%llu,%lld", i ? "," : "", (unsigned long long)us[i],
                 (long long)neg);
        want += b;
    }
    sp__emit_list_end(&e);
    want += "]\n";
    EXPECT_EQ(as_string(finish(&e)), want);
}

// A pickle streamed to its file at flush points is the document the buffer would have held,
// byte for byte: across batch boundaries, with containers opened after a flush and left empty,
// and with memo references to values written before a flush.
TEST(PickleWrite, StreamedToAFileIsTheSameDocument) {
    char dir[] = "/tmp/sp_pickle_stream_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string path = std::string(dir) + "/s.pickle";
    Bytes whole;
    for (int streamed = 0; streamed < 2; streamed++) {
        sp__emit_t e;
        sp__emit_init(&e, false);
        sp__atomic_file_t f;
        if (streamed) {
            ASSERT_EQ(sp__file_atomic_open(&f, path.c_str()), SP_SUCCESS);
            sp__emit_to_file(&e, &f);
        }
        sp__emit_dict_begin(&e);
        sp__emit_key_static(&e, "entries");
        sp__emit_list_begin(&e);
        uint32_t shared = UINT32_MAX;
        for (int i = 0; i < 40000; i++) {
            sp__emit_dict_begin(&e);
            sp__emit_kv_str_static(&e, "action", i % 3 ? "alloc" : "free_requested");
            sp__emit_kv_uint(&e, "addr", 0x7f0000000000ull + (uint64_t)i * 512);
            sp__emit_kv_int(&e, "size", i * 7);
            sp__emit_key_static(&e, "frames");
            if (shared == UINT32_MAX) {
                sp__emit_list_begin(&e);
                sp__emit_str(&e, "frame");
                sp__emit_list_end(&e);
                shared = sp__emit_memoize(&e);
            } else {
                sp__emit_memo_get(&e, shared);
            }
            sp__emit_dict_end(&e);
            sp__emit_flush_point(&e);
            if (i % 9999 == 0) { // a container opened right after a flush point, left empty
                sp__emit_list_begin(&e);
                sp__emit_flush_point(&e); // refused: the new list holds nothing yet
                sp__emit_list_end(&e);
            }
        }
        sp__emit_list_end(&e);
        sp__emit_dict_end(&e);
        char *buf = nullptr;
        size_t len = 0;
        ASSERT_EQ(sp__emit_finish(&e, &buf, &len), SP_SUCCESS);
        if (!streamed) {
            whole.assign(buf, buf + len);
            free(buf);
            continue;
        }
        EXPECT_EQ(buf, nullptr);
        EXPECT_EQ(len, whole.size());
        ASSERT_EQ(sp__file_atomic_commit(&f), SP_SUCCESS);
        EXPECT_GT(whole.size(), (size_t)1 << 20) << "the document should span several flushes";
        EXPECT_TRUE(read_file(path) == whole) << "the streamed file differs from the buffer";
    }
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(whole, &doc), "");
    EXPECT_EQ(pk_len(pk_get(pk_root(doc), "entries")), 40000u + 5u);
    pk_free(doc);
    unlink(path.c_str());
    rmdir(dir);
}

// JSON streamed to its file: a memoized value is copied from the memo's own copy, not from
// bytes already handed to the file; two memoized values that differ in one escaped character
// stay apart; a value opened before a flush is not memoized at its end (its bytes are gone),
// so the caller writes it again. The file is the document the buffer holds, and both are the
// text written out by hand.
TEST(JsonWrite, StreamedToAFileIsTheSameDocument) {
    char dir[] = "/tmp/sp_json_stream_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string path = std::string(dir) + "/s.json";
    const char *names[2] = {"a\"b", "a\\b"};
    const std::string quoted[2] = {"\"a\\\"b\"", "\"a\\\\b\""};
    std::string want = "{\"entries\":[";
    for (int i = 0; i < 40000; i++) {
        if (i)
            want += ",";
        want +=
            "{\"addr\":" + std::to_string(i) + ",\"frames\":[" + quoted[i % 2] + ",\"\\u0001\"]}";
    }
    want += "],\"tail\":[\"x\"]}\n";
    for (int streamed = 0; streamed < 2; streamed++) {
        sp__emit_t e;
        sp__emit_init(&e, true);
        sp__atomic_file_t f;
        if (streamed) {
            ASSERT_EQ(sp__file_atomic_open(&f, path.c_str()), SP_SUCCESS);
            sp__emit_to_file(&e, &f);
        }
        sp__emit_dict_begin(&e);
        sp__emit_key_static(&e, "entries");
        sp__emit_list_begin(&e);
        uint32_t memo[2] = {UINT32_MAX, UINT32_MAX};
        for (int i = 0; i < 40000; i++) {
            sp__emit_dict_begin(&e);
            sp__emit_kv_int(&e, "addr", i);
            sp__emit_key_static(&e, "frames");
            if (memo[i % 2] == UINT32_MAX) {
                sp__emit_list_begin(&e);
                sp__emit_str(&e, names[i % 2]);
                sp__emit_str(&e, "\x01");
                sp__emit_list_end(&e);
                memo[i % 2] = sp__emit_memoize(&e);
                ASSERT_NE(memo[i % 2], UINT32_MAX);
            } else {
                sp__emit_memo_get(&e, memo[i % 2]);
            }
            sp__emit_dict_end(&e);
            sp__emit_flush_point(&e);
        }
        sp__emit_list_end(&e);
        // The outer dict was opened before every flush: with a sink it cannot be memoized.
        sp__emit_key_static(&e, "tail");
        sp__emit_list_begin(&e);
        sp__emit_str(&e, "x");
        sp__emit_list_end(&e);
        sp__emit_dict_end(&e);
        if (streamed) {
            EXPECT_EQ(sp__emit_memoize(&e), UINT32_MAX);
        }
        char *buf = nullptr;
        size_t len = 0;
        ASSERT_EQ(sp__emit_finish(&e, &buf, &len), SP_SUCCESS);
        EXPECT_EQ(len, want.size());
        if (!streamed) {
            EXPECT_EQ(std::string(buf, len), want);
            free(buf);
            continue;
        }
        EXPECT_EQ(buf, nullptr);
        ASSERT_EQ(sp__file_atomic_commit(&f), SP_SUCCESS);
        EXPECT_GT(want.size(), (size_t)1 << 20) << "the document should span several flushes";
        EXPECT_EQ(as_string(read_file(path)), want);
    }
    unlink(path.c_str());
    rmdir(dir);
}

// Which fixed strings are referred back to must not depend on where the linker put them: two
// strings at addresses that share a slot of the table are each written once, and the pairs'
// one-call forms write the same bytes as the key and value calls.
TEST(PickleWrite, StaticStringsAtClashingAddressesAreEachWrittenOnce) {
    static char area[64 * 1024];
    auto slot = [](const char *s) { return ((uintptr_t)s >> 3) * 0x9e3779b97f4a7c15ull >> 56; };
    char *a = area, *b = nullptr;
    for (size_t off = 64; off + 16 < sizeof(area) && b == nullptr; off += 8)
        if (slot(area + off) == slot(a))
            b = area + off;
    ASSERT_NE(b, nullptr);
    strcpy(a, "alpha_key");
    strcpy(b, "beta_value");
    Bytes out[2];
    for (int form = 0; form < 2; form++) {
        sp__emit_t e;
        sp__emit_init(&e, false);
        sp__emit_list_begin(&e);
        for (int i = 0; i < 3; i++) {
            sp__emit_dict_begin(&e);
            if (form == 0) {
                sp__emit_key_static(&e, a);
                sp__emit_str_static(&e, b);
                sp__emit_key_static(&e, b);
                sp__emit_uint(&e, 1ull << 63);
                sp__emit_key_static(&e, a);
                sp__emit_int(&e, -5 - i * 100000);
            } else {
                sp__emit_kv_str_static(&e, a, b);
                sp__emit_kv_uint(&e, b, 1ull << 63);
                sp__emit_kv_int(&e, a, -5 - i * 100000);
            }
            sp__emit_dict_end(&e);
        }
        sp__emit_list_end(&e);
        out[form] = finish(&e);
        std::string text = as_string(out[form]);
        for (const char *s : {"alpha_key", "beta_value"}) {
            size_t n = 0;
            for (size_t at = text.find(s); at != std::string::npos; at = text.find(s, at + 1))
                n++;
            EXPECT_EQ(n, 1u) << s << " (form " << form << ")";
        }
    }
    EXPECT_EQ(out[0], out[1]);
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(out[1], &doc), "");
    for (size_t i = 0; i < 3; i++) {
        int64_t v = 0;
        EXPECT_TRUE(pk_get_int(pk_at(pk_root(doc), i), "alpha_key", &v));
        EXPECT_EQ(v, -5 - (int64_t)i * 100000);
    }
    pk_free(doc);
}

// With a record hook, the ints of a dict the hook may take wait in scratch; when it does not
// take it (a segment, a block) they are kept, shared through the int cache like every other
// int, not a value each.
TEST(PickleRead, IntsOfDictsTheHookLeavesAreShared) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_list_begin(&e);
    for (int i = 0; i < 2; i++) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "size");
        sp__emit_int(&e, 123456789);
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    Bytes b = finish(&e);
    auto refuse = [](void *, pk_value_t *const *, size_t, uint64_t *) { return 0; };
    pk_doc_t *doc = nullptr;
    char err[256] = "";
    ASSERT_TRUE(pk_parse_records(b.data(), b.size(), nullptr, nullptr, refuse, nullptr, &doc, err,
                                 sizeof err))
        << err;
    const pk_value_t *root = pk_root(doc);
    const pk_value_t *v0 = pk_get(pk_at(root, 0), "size"), *v1 = pk_get(pk_at(root, 1), "size");
    int64_t n = 0;
    ASSERT_TRUE(pk_int(v0, &n));
    EXPECT_EQ(n, 123456789);
    EXPECT_EQ(v0, v1) << "one value for an int both dicts keep";
    pk_free(doc);
}

// The memo starts sized from the input's length; a pickle that memoizes far more densely (every
// value, 3 bytes each) still grows it, and every reference reads the value memoized under it.
TEST(PickleRead, MemoDenserThanItsFirstSizeGrowsAndKeepsEveryValue) {
    const int n = 40000;
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_list_begin(&e);
    std::vector<uint32_t> idx;
    for (int i = 0; i < n; i++) {
        sp__emit_int(&e, i % 200);
        idx.push_back(sp__emit_memoize(&e));
    }
    for (int i = n - 1; i >= 0; i -= 7)
        sp__emit_memo_get(&e, idx[(size_t)i]);
    sp__emit_list_end(&e);
    Bytes b = finish(&e);
    ASSERT_GT(b.size(), (size_t)64 * 1024) << "large enough for a sized memo";
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(b, &doc), "");
    const pk_value_t *root = pk_root(doc);
    ASSERT_EQ(pk_len(root), (size_t)n + (size_t)(n + 6) / 7);
    int wrong = 0;
    size_t k = (size_t)n;
    for (int i = n - 1; i >= 0; i -= 7, k++) {
        int64_t v = -1;
        if (!pk_int(pk_at(root, k), &v) || v != i % 200)
            wrong++;
    }
    EXPECT_EQ(wrong, 0);
    pk_free(doc);
}

// Lists that grow batch by batch, taking turns: two past the size of an item array with a chunk
// of its own (grown in it, or moved when another took its place), one growing an item at a
// time in the shared chunk and past it, with small lists made between their batches. Every
// reader finds every item where it was written.
TEST(PickleRead, ListsGrownInTurnsKeepEveryItem) {
    const int rounds = 12;
    Bytes b = {0x80, 2, ']', 'q', 0, '(', ']', 'q', 1, ']', 'q', 2, ']', 'q', 3};
    auto int4 = [&b](uint32_t v) {
        b.push_back('J');
        for (int k = 0; k < 4; k++)
            b.push_back((unsigned char)(v >> (8 * k)));
    };
    auto batch = [&](unsigned char list, int n, uint32_t first) {
        b.insert(b.end(), {'h', list, '('});
        for (int i = 0; i < n; i++)
            int4(first + (uint32_t)i);
        b.insert(b.end(), {'e', '0'});
    };
    for (int r = 0; r < rounds; r++) {
        batch(1, 1000, (uint32_t)r * 1000);
        batch(2, 700, 1000000 + (uint32_t)r * 700);
        for (int i = 0; i < 300; i++) { // list 3: an int, then a small list of 3 ints
            b.insert(b.end(), {'h', 3});
            int4(2000000 + (uint32_t)(r * 300 + i));
            b.push_back('a');
            b.insert(b.end(), {']', '('});
            for (int k = 0; k < 3; k++)
                int4((uint32_t)(r * 300 + i) * 3 + (uint32_t)k);
            b.insert(b.end(), {'e', 'a', '0'});
        }
    }
    b.insert(b.end(), {'e', '.'});
    auto refuse = [](void *, pk_value_t *const *, size_t, uint64_t *) { return 0; };
    for (int reader = 0; reader < 3; reader++) {
        SCOPED_TRACE(reader);
        pk_doc_t *doc = nullptr;
        char err[256] = "";
        bool ok = reader == 0 ? pk_parse(b.data(), b.size(), nullptr, &doc, err, sizeof err)
                  : reader == 1
                      ? pk_parse_skip(b.data(), b.size(), nullptr, "frames", &doc, err, sizeof err)
                      : pk_parse_records(b.data(), b.size(), nullptr, "frames", refuse, nullptr,
                                         &doc, err, sizeof err);
        ASSERT_TRUE(ok) << err;
        const pk_value_t *root = pk_root(doc);
        ASSERT_EQ(pk_len(root), 3u);
        const pk_value_t *a = pk_at(root, 0), *c = pk_at(root, 1), *d = pk_at(root, 2);
        ASSERT_EQ(pk_len(a), (size_t)rounds * 1000);
        ASSERT_EQ(pk_len(c), (size_t)rounds * 700);
        ASSERT_EQ(pk_len(d), (size_t)rounds * 600);
        size_t wrong = 0;
        int64_t v = -1;
        for (size_t i = 0; i < pk_len(a); i++)
            wrong += !pk_int(pk_at(a, i), &v) || v != (int64_t)i;
        for (size_t i = 0; i < pk_len(c); i++)
            wrong += !pk_int(pk_at(c, i), &v) || v != 1000000 + (int64_t)i;
        for (size_t i = 0; i < pk_len(d) / 2; i++) {
            wrong += !pk_int(pk_at(d, 2 * i), &v) || v != 2000000 + (int64_t)i;
            const pk_value_t *small = pk_at(d, 2 * i + 1);
            wrong += pk_len(small) != 3;
            for (size_t k = 0; k < 3 && pk_len(small) == 3; k++)
                wrong += !pk_int(pk_at(small, k), &v) || v != (int64_t)(3 * i + k);
        }
        EXPECT_EQ(wrong, 0u);
        pk_free(doc);
    }
}

// A dict with more ints than the record hook's scratch holds at once (999 pairs, the largest
// batch the hook is offered, nested in another dict whose ints are still waiting): the ints past
// it are made in the document instead, and the hook and the document read every one as written.
TEST(PickleRead, DictsWithMoreIntsThanScratchReadEveryInt) {
    auto val = [](int d, int i) { return (int64_t)d * 1000003 - (int64_t)i * 77 - 5; };
    std::vector<std::string> keys; // the emitter memoizes keys by address: one string each
    for (int i = 0; i < 999; i++)
        keys.push_back("k" + std::to_string(i));
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_dict_begin(&e);
    sp__emit_kv_int(&e, "outer0", val(9, 0));
    sp__emit_kv_int(&e, "outer1", val(9, 1));
    sp__emit_key(&e, "inner");
    sp__emit_list_begin(&e);
    for (int d = 0; d < 3; d++) {
        sp__emit_dict_begin(&e);
        for (int i = 0; i < 999; i++)
            sp__emit_kv_int(&e, keys[(size_t)i].c_str(), val(d, i));
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    sp__emit_kv_int(&e, "outer2", val(9, 2));
    sp__emit_dict_end(&e);
    Bytes b = finish(&e);
    struct seen_t {
        int dicts = 0, wrong = 0;
    } seen;
    auto look = [](void *arg, pk_value_t *const *pairs, size_t n, uint64_t *) {
        auto *s = (seen_t *)arg;
        if (n < 2 || strcmp(pk_str(pairs[0]), "k0") != 0)
            return 0;
        int d = s->dicts++;
        for (size_t i = 0; i + 1 < n; i += 2) {
            int64_t v = 0;
            if (!pk_int(pairs[i + 1], &v) || v != (int64_t)d * 1000003 - (int64_t)(i / 2) * 77 - 5)
                s->wrong++;
        }
        return 0;
    };
    pk_doc_t *doc = nullptr;
    char err[256] = "";
    ASSERT_TRUE(
        pk_parse_records(b.data(), b.size(), nullptr, nullptr, look, &seen, &doc, err, sizeof err))
        << err;
    EXPECT_EQ(seen.dicts, 3);
    EXPECT_EQ(seen.wrong, 0);
    const pk_value_t *root = pk_root(doc);
    for (int i = 0; i < 3; i++) {
        char k[16];
        snprintf(k, sizeof k, "outer%d", i);
        int64_t v = 0;
        EXPECT_TRUE(pk_get_int(root, k, &v));
        EXPECT_EQ(v, val(9, i)) << k;
    }
    const pk_value_t *inner = pk_get(root, "inner");
    ASSERT_EQ(pk_len(inner), 3u);
    int wrong = 0;
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < 999; i++) {
            char k[16];
            snprintf(k, sizeof k, "k%d", i);
            int64_t v = 0;
            if (!pk_get_int(pk_at(inner, (size_t)d), k, &v) || v != val(d, i))
                wrong++;
        }
    EXPECT_EQ(wrong, 0);
    pk_free(doc);
}

// The record hook's path reads a trace entry's keys and values in a loop of its own: every cut
// of a trace and every undefined memo reference inside an entry fails there with the message and
// offset the plain reader gives, and whole, both read the same entries.
TEST(PickleRead, RecordsPathFailsWhereThePlainReaderDoes) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_list_begin(&e);
    for (int i = 0; i < 40; i++) {
        sp__emit_dict_begin(&e);
        sp__emit_kv_str_static(&e, "action", i % 2 ? "alloc" : "free_requested");
        sp__emit_kv_uint(&e, "addr", 0x7f0000000000ull + (uint64_t)i * 512);
        sp__emit_kv_int(&e, "size", i % 3 ? 200 + i : 70000 + i);
        sp__emit_kv_int(&e, "stream", i % 5 ? 0 : -1 - i);
        sp__emit_kv_uint(&e, "big", UINT64_MAX - (uint64_t)i);
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    Bytes whole = finish(&e);
    auto take = [](void *arg, pk_value_t *const *pairs, size_t n, uint64_t *id_p) {
        if (n < 2 || pk_str(pairs[0]) == nullptr || strcmp(pk_str(pairs[0]), "action") != 0)
            return 0;
        *id_p = (*(uint64_t *)arg)++;
        return 1;
    };
    auto both = [&](const Bytes &b, std::string *plain, std::string *recs) {
        char e1[256] = "", e2[256] = "";
        pk_doc_t *d1 = nullptr, *d2 = nullptr;
        uint64_t taken = 0;
        bool ok1 = pk_parse_skip(b.data(), b.size(), nullptr, "frames", &d1, e1, sizeof e1);
        bool ok2 = pk_parse_records(b.data(), b.size(), nullptr, "frames", take, &taken, &d2, e2,
                                    sizeof e2);
        *plain = ok1 ? "ok" : e1;
        *recs = ok2 ? "ok" : e2;
        pk_free(d1);
        pk_free(d2);
        return taken;
    };
    std::string plain, recs;
    EXPECT_EQ(both(whole, &plain, &recs), 40u);
    EXPECT_EQ(plain, "ok");
    EXPECT_EQ(recs, "ok");
    for (size_t cut = 1; cut < whole.size(); cut++) {
        Bytes b(whole.begin(), whole.begin() + (long)cut);
        both(b, &plain, &recs);
        EXPECT_EQ(recs, plain) << "cut at " << cut;
    }
    // Every memo reference made undefined in turn (a BINGET's index pointing past the memo).
    for (size_t at = 2; at + 1 < whole.size(); at++) {
        if (whole[at] != 'h')
            continue;
        Bytes b = whole;
        b[at + 1] = 0xfe;
        both(b, &plain, &recs);
        EXPECT_EQ(recs, plain) << "BINGET at " << at;
    }
}

// Skipped stacks made of memo references, as PyTorch writes them: runs of BINGET and
// LONG_BINGET of every length (the reader takes four of one kind at once), one stack longer than
// the reader's first stack (it grows in the middle of a run). The skipping reader reads the
// same entries as the plain one, and every cut fails as in the records path (under ASan: no
// read past the cut).
TEST(PickleRead, SkippedRunsOfMemoReferencesAreReadWhole) {
    Bytes b = {0x80, 4, ']', 0x94, '('};
    auto str = [&](const char *s) {
        b.push_back(0x8c);
        b.push_back((unsigned char)strlen(s));
        b.insert(b.end(), s, s + strlen(s));
        b.push_back(0x94);
    };
    // Entry 0 memoizes the keys, the action and 300 ints (memo 6..305) inside its own stack.
    b.insert(b.end(), {'}', 0x94, '('});
    str("action");
    str("alloc");
    str("frames");
    b.insert(b.end(), {']', 0x94, '('});
    for (int i = 0; i < 300; i++) {
        b.insert(b.end(), {'M', (unsigned char)i, (unsigned char)(i >> 8), 0x94});
    }
    b.insert(b.end(), {'e', 'u'});
    auto ref = [&](size_t idx) {
        if (idx < 256) {
            b.insert(b.end(), {'h', (unsigned char)idx});
        } else {
            b.insert(b.end(), {'j', (unsigned char)idx, (unsigned char)(idx >> 8), 0, 0});
        }
    };
    unsigned seed = 7;
    const int entries = 30;
    for (int k = 1; k < entries; k++) {
        b.insert(b.end(), {'}', 0x94, '('});
        ref(2);
        ref(3);
        ref(4);
        b.insert(b.end(), {']', 0x94, '('});
        int n = k == 15 ? 300 : 1 + k % 23;
        bool longs = k % 2;
        for (int i = 0; i < n;) {
            int run = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 9;
            for (int r = 0; r < run && i < n; r++, i++)
                ref(longs ? 256 + (seed >> 8) % 50 : 6 + (seed >> 4) % 250);
            longs = !longs;
        }
        b.insert(b.end(), {'e', 'u'});
    }
    b.insert(b.end(), {'e', '.'});
    char e1[256] = "", e2[256] = "";
    pk_doc_t *plain = nullptr, *skip = nullptr;
    ASSERT_TRUE(pk_parse(b.data(), b.size(), nullptr, &plain, e1, sizeof e1)) << e1;
    ASSERT_TRUE(pk_parse_skip(b.data(), b.size(), nullptr, "frames", &skip, e2, sizeof e2)) << e2;
    ASSERT_EQ(pk_len(pk_root(skip)), (size_t)entries);
    for (size_t k = 0; k < (size_t)entries; k++) {
        EXPECT_STREQ(pk_get_str(pk_at(pk_root(skip), k), "action"), "alloc");
        EXPECT_EQ(pk_len(pk_get(pk_at(pk_root(plain), k), "frames")),
                  k == 0 || k == 15 ? 300u : 1 + k % 23);
    }
    pk_free(plain);
    pk_free(skip);
    auto take = [](void *arg, pk_value_t *const *, size_t, uint64_t *id_p) {
        *id_p = (*(uint64_t *)arg)++;
        return 1;
    };
    for (size_t cut = 1; cut < b.size(); cut++) {
        TwoReads r = read_skip_and_records(Bytes(b.begin(), b.begin() + (long)cut), take);
        EXPECT_FALSE(r.skip_ok);
        EXPECT_FALSE(r.rec_ok);
        EXPECT_EQ(r.skip_err, r.rec_err) << "cut at " << cut;
    }
}

// Values memoized inside a skipped stack and referenced after it: the strings (short and
// BINUNICODE), and a float the general loop makes in the middle of a skipped stack deeper than
// the reader's first stack (the skipping reader then writes the stack it had only counted) read
// back as the plain reader reads them; a reference right inside the skipped list to a memoized
// dict is skipped with it, one to a memoized string ends the skip as the general loop decides.
TEST(PickleRead, MemoReferencesIntoSkippedStacksReadBack) {
    Bytes b = {0x80, 4, ']', 0x94, '('}; // memo 0: the root list
    size_t memo = 1;
    auto str = [&](const char *s, bool wide) {
        size_t n = strlen(s);
        if (wide) {
            b.insert(b.end(), {'X', (unsigned char)n, (unsigned char)(n >> 8), 0, 0});
        } else {
            b.insert(b.end(), {0x8c, (unsigned char)n});
        }
        b.insert(b.end(), s, s + n);
        b.push_back(0x94);
        return memo++;
    };
    auto ref = [&](size_t idx) {
        if (idx < 256) {
            b.insert(b.end(), {'h', (unsigned char)idx});
        } else {
            b.insert(b.end(), {'j', (unsigned char)idx, (unsigned char)(idx >> 8), 0, 0});
        }
    };
    // Entry 0: {"action": "alloc", "frames": [frame, frame again, 600 refs, 1.5, 40 refs]}
    b.insert(b.end(), {'}', 0x94, '('});
    memo++;
    size_t k_action = str("action", false);
    str("alloc", false);
    size_t k_frames = str("frames", false);
    b.insert(b.end(), {']', 0x94, '('});
    size_t frames0 = memo++;
    b.insert(b.end(), {'}', 0x94, '('});
    size_t frame = memo++;
    size_t k_name = str("name", false);
    size_t fn = str("fn_in_a_skipped_stack", false);
    str("filename", false);
    std::string wide(300, 'w');
    size_t file = str(wide.c_str(), true);
    b.insert(b.end(), {'u'});
    ref(frame);
    for (int i = 0; i < 600; i++)
        ref(i % 2 ? frame : frames0);
    const unsigned char f15[8] = {0x3f, 0xf8, 0, 0, 0, 0, 0, 0}; // 1.5, big-endian
    b.push_back('G');
    b.insert(b.end(), f15, f15 + 8);
    b.push_back(0x94);
    size_t flt = memo++;
    for (int i = 0; i < 40; i++)
        ref(frame);
    b.insert(b.end(), {'e', 'u'});
    // Entry 1: {"action": fn, "name": the wide string, "line": 1.5, "frames": [frame...]}
    b.insert(b.end(), {'}', 0x94, '('});
    memo++;
    ref(k_action);
    ref(fn);
    ref(k_name);
    ref(file);
    str("line", false);
    ref(flt);
    ref(k_frames);
    b.insert(b.end(), {']', 0x94, '('});
    memo++;
    ref(frame);
    ref(frame);
    b.insert(b.end(), {'e', 'u'});
    // Entry 2: {"frames": [fn, file]}: a string right inside the list ends the skip.
    b.insert(b.end(), {'}', 0x94, '('});
    memo++;
    ref(k_frames);
    b.insert(b.end(), {']', 0x94, '('});
    memo++;
    ref(fn);
    const size_t cut = b.size(); // where the variant below goes on
    ref(file);
    b.insert(b.end(), {'e', 'u', 'e', '.'});

    auto keep = [](void *, pk_value_t *const *, size_t, uint64_t *) { return 0; };
    for (int path = 0; path < 3; path++) {
        pk_doc_t *doc = nullptr;
        char err[256] = "";
        bool ok = path == 0 ? pk_parse(b.data(), b.size(), nullptr, &doc, err, sizeof err)
                  : path == 1
                      ? pk_parse_skip(b.data(), b.size(), nullptr, "frames", &doc, err, sizeof err)
                      : pk_parse_records(b.data(), b.size(), nullptr, "frames", keep, nullptr, &doc,
                                         err, sizeof err);
        ASSERT_TRUE(ok) << "path " << path << ": " << err;
        const pk_value_t *root = pk_root(doc);
        ASSERT_EQ(pk_len(root), 3u);
        const pk_value_t *e1 = pk_at(root, 1);
        EXPECT_STREQ(pk_get_str(pk_at(root, 0), "action"), "alloc");
        EXPECT_STREQ(pk_get_str(e1, "action"), "fn_in_a_skipped_stack") << "path " << path;
        EXPECT_STREQ(pk_get_str(e1, "name"), wide.c_str()) << "path " << path;
        double v = 0;
        EXPECT_TRUE(pk_num(pk_get(e1, "line"), &v)) << "path " << path;
        EXPECT_EQ(v, 1.5);
        const pk_value_t *f2 = pk_get(pk_at(root, 2), "frames");
        if (path == 0) {
            EXPECT_EQ(pk_len(pk_get(pk_at(root, 0), "frames")), 643u);
            EXPECT_EQ(pk_len(pk_get(e1, "frames")), 2u);
        } else {
            EXPECT_EQ(pk_get(pk_at(root, 0), "frames"), nullptr) << "path " << path;
            EXPECT_EQ(pk_get(e1, "frames"), nullptr) << "path " << path;
        }
        // Entry 2's list: the string read right inside it ends the skip, but the list itself
        // is the skipped value (its items are dropped, its pair left out).
        if (path == 0) {
            ASSERT_EQ(pk_len(f2), 2u);
            EXPECT_STREQ(pk_str(pk_at(f2, 0)), "fn_in_a_skipped_stack");
        } else {
            EXPECT_EQ(f2, nullptr) << "path " << path;
        }
        pk_free(doc);
    }
    // Entry 2's list with a frame after the string: the skip has ended, so the frame (a value
    // made skipped) is read outside a skipped value, which the skipping readers cannot read as
    // pk_parse does: they refuse the document as one to read whole.
    Bytes v(b.begin(), b.begin() + (std::ptrdiff_t)cut);
    ref(frame);
    v.insert(v.end(), b.end() - 2, b.end()); // the ref just written
    v.insert(v.end(), {'e', 'u', 'e', '.'});
    pk_doc_t *doc = nullptr;
    char err[256] = "";
    ASSERT_TRUE(pk_parse(v.data(), v.size(), nullptr, &doc, err, sizeof err)) << err;
    pk_free(doc);
    for (int path = 1; path < 3; path++) {
        EXPECT_FALSE(
            path == 1 ? pk_parse_skip(v.data(), v.size(), nullptr, "frames", &doc, err, sizeof err)
                      : pk_parse_records(v.data(), v.size(), nullptr, "frames", keep, nullptr, &doc,
                                         err, sizeof err));
        EXPECT_TRUE(pk_err_whole(err)) << err;
        EXPECT_NE(strstr(err, "is a value skipped under \"frames\""), nullptr) << err;
    }
}

// A dict's EMPTY_DICT, MEMOIZE and MARK are read in one step: the limits they meet fail at the
// opcode that meets them, as one at a time.
TEST(PickleRead, DictOpenedAtOnceFailsAtItsOwnOpcode) {
    Bytes b = {0x80, 4};
    for (int i = 0; i < 3; i++)
        b.insert(b.end(), {'}', 0x94, '('});
    pk_limits_t lim;
    pk_limits_default(&lim);
    lim.max_depth = 2;
    pk_doc_t *doc = nullptr;
    char err[256] = "";
    EXPECT_FALSE(pk_parse(b.data(), b.size(), &lim, &doc, err, sizeof err));
    EXPECT_STREQ(err, "pickle: nesting deeper than 2 at offset 10");
    pk_limits_default(&lim);
    lim.max_memo = 1;
    EXPECT_FALSE(pk_parse(b.data(), b.size(), &lim, &doc, err, sizeof err));
    EXPECT_STREQ(err, "pickle: memo index 1 exceeds the limit of 1 at offset 6");
    // Cut right after the MEMOIZE: the dict and its memo are there, no MARK.
    Bytes c = {0x80, 4, '}', 0x94};
    EXPECT_FALSE(pk_parse(c.data(), c.size(), nullptr, &doc, err, sizeof err));
    EXPECT_STREQ(err, "pickle: truncated pickle (no STOP) at offset 4");
}

// LONG1 of every length 0-9, both signs, at the edges of each length (Python's minimal two's
// complement, as pickle writes it), in a list and as values of a dict the record hook takes, and
// the last one with fewer than 8 bytes after it: each reads as its value.
TEST(PickleRead, Long1OfEveryLengthReadsItsValue) {
    std::vector<int64_t> vals = {0, 1, -1, 127, 128, -128, -129, 32767, -32769, 8388608};
    for (int bits = 23; bits <= 62; bits += 8) {
        vals.push_back(((int64_t)1 << bits) + 5);
        vals.push_back(-((int64_t)1 << bits) - 3);
        vals.push_back(((int64_t)1 << bits) - 1);
    }
    vals.push_back(INT64_MAX);
    vals.push_back(INT64_MIN);
    auto long1 = [](Bytes &b, int64_t v) {
        Bytes d;
        int64_t x = v;
        while (
            !(d.size() > 0 && ((x == 0 && !(d.back() & 0x80)) || (x == -1 && (d.back() & 0x80))))) {
            if (v == 0)
                break;
            d.push_back((unsigned char)(x & 0xff));
            x >>= 8;
        }
        b.push_back(0x8a);
        b.push_back((unsigned char)d.size());
        b.insert(b.end(), d.begin(), d.end());
    };
    Bytes list = {0x80, 4, ']', '('};
    for (int64_t v : vals)
        long1(list, v);
    list.insert(list.end(), {'e', '.'});
    char err[256] = "";
    pk_doc_t *doc = nullptr;
    ASSERT_TRUE(pk_parse(list.data(), list.size(), nullptr, &doc, err, sizeof err)) << err;
    ASSERT_EQ(pk_len(pk_root(doc)), vals.size());
    for (size_t i = 0; i < vals.size(); i++) {
        int64_t got = 0;
        EXPECT_TRUE(pk_int(pk_at(pk_root(doc), i), &got));
        EXPECT_EQ(got, vals[i]) << i;
    }
    pk_free(doc);
    // The same values in a trace entry's dict, read by the record path.
    Bytes dict = {0x80, 4, ']', '(', '}', '(', 0x8c, 6};
    dict.insert(dict.end(), {'a', 'c', 't', 'i', 'o', 'n', 0x8c, 1, 'x'});
    for (size_t i = 0; i < vals.size(); i++) {
        dict.insert(dict.end(), {0x8c, 1, (unsigned char)('A' + i % 26)});
        long1(dict, vals[i]);
    }
    dict.insert(dict.end(), {'u', 'e', '.'});
    std::vector<int64_t> seen;
    auto take = [](void *arg, pk_value_t *const *pairs, size_t n, uint64_t *id_p) {
        auto *out = (std::vector<int64_t> *)arg;
        for (size_t k = 3; k < n; k += 2) {
            int64_t v = 0;
            if (!pk_int(pairs[k], &v))
                return -1;
            out->push_back(v);
        }
        *id_p = 0;
        return 1;
    };
    ASSERT_TRUE(pk_parse_records(dict.data(), dict.size(), nullptr, nullptr, take, &seen, &doc, err,
                                 sizeof err))
        << err;
    EXPECT_EQ(seen, vals);
    pk_free(doc);
}

// An int of a trace entry that the memo keeps while another slot still holds it (DUP, MEMOIZE,
// POP: a pickler's own business, legal), in several entries in turn: the hook reads the value
// in that slot every time, and the memo gives it back later.
TEST(PickleRead, EntryIntKeptWhileDuplicatedIsReadByTheHook) {
    Bytes b = {0x80, 4, ']', '('};
    for (int k = 0; k < 3; k++) {
        b.insert(b.end(), {'}', '(', 0x8c, 6, 'a', 'c', 't', 'i', 'o', 'n', 0x8c, 1, 'x'});
        b.insert(b.end(), {0x8c, 4, 's', 'i', 'z', 'e', 'K', (unsigned char)(10 + k)});
        if (k != 1)
            b.insert(b.end(), {'2', 0x94, '0'}); /* DUP, MEMOIZE (memo k == 0 ? 0 : 1), POP */
        b.push_back('u');
    }
    b.insert(b.end(), {'h', 0, 'h', 1, 'e', '.'});
    std::vector<int64_t> seen;
    auto take = [](void *arg, pk_value_t *const *pairs, size_t n, uint64_t *id_p) {
        int64_t v = -1;
        if (n != 4 || !pk_int(pairs[3], &v))
            return -1;
        ((std::vector<int64_t> *)arg)->push_back(v);
        *id_p = 0;
        return 1;
    };
    char err[256] = "";
    pk_doc_t *doc = nullptr;
    ASSERT_TRUE(
        pk_parse_records(b.data(), b.size(), nullptr, nullptr, take, &seen, &doc, err, sizeof err))
        << err;
    EXPECT_EQ(seen, (std::vector<int64_t>{10, 11, 12}));
    int64_t m0 = 0, m1 = 0;
    ASSERT_EQ(pk_len(pk_root(doc)), 5u);
    EXPECT_TRUE(pk_int(pk_at(pk_root(doc), 3), &m0));
    EXPECT_TRUE(pk_int(pk_at(pk_root(doc), 4), &m1));
    EXPECT_EQ(m0, 10);
    EXPECT_EQ(m1, 12);
    pk_free(doc);
}

// A short string written again (not memoized) in every entry, as newer snapshots write
// compile_context's "N/A", is one value of the document: equal strings share it, another
// string does not.
TEST(PickleRead, ShortStringsWrittenAgainAreShared) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_list_begin(&e);
    for (int i = 0; i < 3; i++) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "compile_context");
        sp__emit_str(&e, i < 2 ? "N/A" : "N/B");
        sp__emit_dict_end(&e);
    }
    sp__emit_list_end(&e);
    Bytes b = finish(&e);
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(b, &doc), "");
    const pk_value_t *root = pk_root(doc);
    const char *s0 = pk_get_str(pk_at(root, 0), "compile_context");
    const char *s1 = pk_get_str(pk_at(root, 1), "compile_context");
    const char *s2 = pk_get_str(pk_at(root, 2), "compile_context");
    ASSERT_NE(s0, nullptr);
    EXPECT_STREQ(s0, "N/A");
    EXPECT_EQ(s0, s1) << "equal short strings are one value";
    EXPECT_STREQ(s2, "N/B");
    EXPECT_EQ(pk_at(root, 0)->u.seq.items[0], pk_at(root, 2)->u.seq.items[0]) << "the key";
    pk_free(doc);
}

// The memo's slots are cleared as puts reach them, not when it is allocated (a document sized
// for a memo larger than 1024 slots): a key between two puts far apart is still not defined,
// and the keys put read back, in every reader.
TEST(PickleRead, MemoKeysBetweenFarPutsAreNotDefined) {
    Bytes b = {0x80, 4, 'X'};
    const uint32_t n = 60000; // a document of more than 48 KB: its memo is sized from it
    for (int i = 0; i < 4; i++)
        b.push_back((unsigned char)(n >> (8 * i)));
    b.insert(b.end(), n, 'a');
    // Puts at keys 0 and 2000 (past the memo's first 1250 slots: it grows), gets of both.
    b.insert(b.end(), {'0', ']', 0x94, '(', 'K', 7, 'r', 0xd0, 0x07, 0, 0, 'j', 0xd0, 0x07, 0, 0,
                       'h', 0, 'e'});
    Bytes ok = b;
    ok.push_back('.');
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(ok, &doc), "");
    const pk_value_t *root = pk_root(doc);
    ASSERT_EQ(pk_len(root), 3u);
    int64_t v = 0;
    EXPECT_TRUE(pk_int(pk_at(root, 0), &v) && v == 7);
    EXPECT_TRUE(pk_int(pk_at(root, 1), &v) && v == 7) << "key 2000";
    EXPECT_EQ(pk_at(root, 2), root) << "key 0, the list itself";
    pk_free(doc);
    // Key 1500 lies between the put at 0 and the one at 2000.
    Bytes bad = b;
    bad.insert(bad.end(), {'j', 0xdc, 0x05, 0, 0, '.'});
    std::string want =
        "pickle: memo key 1500 is not defined at offset " + std::to_string(bad.size() - 6);
    EXPECT_EQ(parse(bad), want);
    TwoReads r = read_skip_and_records(
        bad, [](void *arg, pk_value_t *const *, size_t, uint64_t *id_p) -> int {
            *id_p = (*(uint64_t *)arg)++;
            return 1;
        });
    EXPECT_FALSE(r.skip_ok);
    EXPECT_FALSE(r.rec_ok);
    EXPECT_EQ(r.skip_err, want);
    EXPECT_EQ(r.rec_err, want);
}

// True and False are one value each however often they are written (a segment's is_expandable
// is in every segment of a snapshot), and read as what was written.
TEST(PickleRead, BooleansWrittenAgainAreOneValueEach) {
    Bytes b = {0x80, 4, ']', '(', 0x88, 0x89, 0x88, 0x89, 'e', '.'};
    pk_doc_t *doc = nullptr;
    ASSERT_EQ(parse(b, &doc), "");
    const pk_value_t *root = pk_root(doc);
    ASSERT_EQ(pk_len(root), 4u);
    for (size_t i = 0; i < 4; i++) {
        ASSERT_EQ(pk_at(root, i)->type, PK_BOOL);
        EXPECT_EQ(pk_at(root, i)->u.b, i % 2 == 0) << i;
    }
    EXPECT_EQ(pk_at(root, 0), pk_at(root, 2)) << "one True";
    EXPECT_EQ(pk_at(root, 1), pk_at(root, 3)) << "one False";
    EXPECT_NE(pk_at(root, 0), pk_at(root, 1));
    pk_free(doc);
}

namespace {

// Skipping a key: the lists under it are not built and their pairs are left out of the dicts
// (the key reads as absent); the same word elsewhere (a value, a list's item) stays.
TEST(PickleRead, SkippedKeysAreLeftOutOfTheirDicts) {
    sp__emit_t e;
    sp__emit_init(&e, false);
    sp__emit_list_begin(&e);
    for (int i = 0; i < 2; i++) {
        sp__emit_dict_begin(&e);
        sp__emit_key(&e, "addr");
        sp__emit_uint(&e, 0x7f0000000000ull);
        sp__emit_key(&e, "frames");
        sp__emit_list_begin(&e);
        sp__emit_int(&e, 7);
        sp__emit_list_end(&e);
        sp__emit_key(&e, "name");
        sp__emit_str(&e, "frames"); // a value, not a key
        sp__emit_dict_end(&e);
    }
    sp__emit_list_begin(&e);
    sp__emit_str(&e, "frames");
    sp__emit_int(&e, 5);
    sp__emit_list_end(&e);
    sp__emit_list_end(&e);
    Bytes b = finish(&e);
    pk_doc_t *doc = nullptr;
    char err[256] = "";
    ASSERT_TRUE(pk_parse_skip(b.data(), b.size(), nullptr, "frames", &doc, err, sizeof(err)))
        << err;
    const pk_value_t *root = pk_root(doc);
    ASSERT_EQ(pk_len(root), 3u);
    for (size_t i = 0; i < 2; i++) {
        const pk_value_t *d = pk_at(root, i);
        EXPECT_EQ(pk_len(d), 2u); // addr and name
        EXPECT_EQ(pk_get(d, "frames"), nullptr);
        uint64_t a = 0;
        EXPECT_TRUE(pk_get_uint(d, "addr", &a));
        EXPECT_EQ(a, 0x7f0000000000ull);
        EXPECT_STREQ(pk_get_str(d, "name"), "frames");
    }
    int64_t v = 0;
    EXPECT_STREQ(pk_str(pk_at(pk_at(root, 2), 0)), "frames");
    EXPECT_TRUE(pk_int(pk_at(pk_at(root, 2), 1), &v));
    EXPECT_EQ(v, 5);
    pk_free(doc);
    // Without a key it is pk_parse: everything is there.
    ASSERT_TRUE(pk_parse_skip(b.data(), b.size(), nullptr, nullptr, &doc, err, sizeof(err)));
    EXPECT_EQ(pk_len(pk_at(pk_root(doc), 0)), 3u);
    EXPECT_EQ(pk_len(pk_get(pk_at(pk_root(doc), 1), "frames")), 1u);
    pk_free(doc);
}

// The peak resident set of this process in KiB, reset by reset_peak_kib (-1 when the kernel
// offers neither).
long peak_kib() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmHWM:", 0) == 0)
            return std::strtol(line.c_str() + 6, nullptr, 10);
    return -1;
}

bool reset_peak_kib() {
    std::ofstream f("/proc/self/clear_refs");
    f << "5";
    f.flush();
    return f.good();
}

// A memo index is bounded (16M slots), but a ten-byte pickle that puts one value under a high
// index must not cost what the slots below it would: they are never written, so they take no
// memory (they took 128 MiB, written as zeros, before the parse failed or ended). The bound is
// 32 MiB, not less: under AddressSanitizer the untouched slots still cost their shadow, an eighth
// of their bytes (16.5 MiB measured), which the unwritten slots themselves do not. Under
// ThreadSanitizer calloc writes its zeros itself (128 MiB measured), so there it says nothing.
TEST(PickleRead, ASparseMemoIndexCostsNoMemoryForTheSlotsBelowIt) {
#if defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "ThreadSanitizer's calloc writes every byte it hands out";
#endif
    if (!reset_peak_kib() || peak_kib() < 0)
        GTEST_SKIP() << "no /proc/self/clear_refs or VmHWM";
    long before = peak_kib();
    EXPECT_EQ(parse(Bytes{0x80, 4, 'N', 'r', 0xfe, 0xff, 0xff, 0x00, 'h', 0, '.'}),
              "pickle: memo key 0 is not defined at offset 8");
    long grew = peak_kib() - before;
    EXPECT_LT(grew, 32 * 1024) << "KiB of peak resident memory for a ten-byte pickle";
}

// A dict the record hook took whole at a SETITEMS of fewer than 1000 pairs that then gets more
// items (legal, but no pickler writes it: they add items after a full batch only): refused with
// a message that says so and that the document is to be read whole (PK_ERR_WHOLE), not as if
// the dict were something else.
TEST(PickleRead, ItemsForADictTheHookTookAreRefusedSayingSo) {
    const Bytes b = {0x80, 4,   '}', '(', 0x8c, 6,    'a', 'c', 't', 'i', 'o', 'n', 0x8c, 5,   'a',
                     'l',  'l', 'o', 'c', 'u',  0x8c, 4,   'a', 'd', 'd', 'r', 'K', 5,    's', '.'};
    EXPECT_EQ(parse(b), "");
    auto take = [](void *, pk_value_t *const *, size_t, uint64_t *id_p) {
        *id_p = 0;
        return 1;
    };
    pk_doc_t *doc = nullptr;
    char err[256] = "";
    EXPECT_FALSE(pk_parse_records(b.data(), b.size(), nullptr, nullptr, take, nullptr, &doc, err,
                                  sizeof err));
    // The items are the dict's: the record reader refuses it as one to read whole (the trace
    // loader then does, and reads the later items as pk_parse does).
    EXPECT_STREQ(err, "pickle: to be read whole: SETITEM adds to a dict the record hook took at "
                      "offset 28");
    EXPECT_TRUE(pk_err_whole(err));
}

// Inside a skipped value nothing is built, but a SETITEMS with an odd number of items is refused
// there as everywhere (the skipping reader took it, so the loaders disagreed on the file).
TEST(PickleRead, OddSetitemsInsideASkippedValueIsRefusedToo) {
    const Bytes b = {0x80, 4,   '}', '(', 0x8c, 6, 'f', 'r', 'a', 'm', 'e',
                     's',  ']', '}', '(', 'K',  1, 'u', 'a', 'u', '.'};
    const char *want = "pickle: SETITEMS with an odd number of items at offset 17";
    EXPECT_EQ(parse(b), want);
    pk_doc_t *doc = nullptr;
    char err[256] = "";
    EXPECT_FALSE(pk_parse_skip(b.data(), b.size(), nullptr, "frames", &doc, err, sizeof err));
    EXPECT_STREQ(err, want);
    pk_free(doc);
}

} // namespace

// A dict's pairs written out (a skipped stack aside), for comparing two readers' views.
static std::string show_pairs(const pk_value_t *const *it, size_t n) {
    std::string s;
    for (size_t i = 0; i + 1 < n; i += 2) {
        const pk_value_t *k = it[i], *v = it[i + 1];
        if (pk_str(k) != nullptr && strcmp(pk_str(k), "frames") == 0 && v->type == PK_NONE)
            continue;
        s += pk_str(k) ? pk_str(k) : "?";
        if (v->type == PK_DICT || v->type == PK_RECORD) { // an entry: a dict here, a record there
            s += "=dict;";
            continue;
        }
        s += "=" + std::to_string((int)v->type) + ":";
        if (v->type == PK_INT)
            s += std::to_string(v->u.i);
        else if (v->type == PK_UINT)
            s += std::to_string(v->u.u);
        else if (v->type == PK_STR)
            s += v->u.str.s;
        else if (v->type == PK_LIST || v->type == PK_TUPLE)
            s += "n" + std::to_string(v->u.seq.n);
        s += ";";
    }
    return s;
}

// A trace entry's dict is read whole from its EMPTY_DICT to its SETITEMS when it has the common
// shape, and by the general loop otherwise (record_fast in pickle_read.c). Every shape here is
// read as the plain reader reads it: the hook sees the pairs the plain reader's dict has (in
// order, the skipped stack aside), values memoized inside an entry (the entry itself, a string,
// an int, the skipped list) read back the same when referenced after it, a dict the hook
// leaves stays a dict, and every cut and every undefined memo reference fails with the plain
// reader's message and offset. The shapes: fresh keys (the general loop's), memo-referenced
// keys (BINGET and LONG_BINGET), MEMOIZE, BINPUT and LONG_BINPUT for the dict and the stack,
// reordered and extra keys, ints of every width (LONG1 of 0, 8 and 9 bytes), a fresh "N/A" each
// entry, a list or dict that is not a skipped stack, stacks of one APPEND, of a MARK ...
// APPENDS, empty, referenced, or starting with a reference to a string, a reference to the dict
// inside itself, a BINPUT over a used slot, a PUT after an int, a FRAME inside an entry.
TEST(PickleRead, WholeRecordsReadAsThePlainReaderReadsThem) {
    Bytes b = {0x80, 4, ']', 0x94, '('}; // memo 0: the root list
    size_t memo = 1;
    auto put = [&](int how) { // 0: MEMOIZE, 1: BINPUT, 2: LONG_BINPUT (at the next index)
        if (how == 0)
            b.push_back(0x94);
        else if (how == 1)
            b.insert(b.end(), {'q', (unsigned char)memo});
        else
            b.insert(b.end(), {'r', (unsigned char)memo, (unsigned char)(memo >> 8), 0, 0});
        return memo++;
    };
    auto ref = [&](size_t idx, bool wide = false) {
        if (idx < 256 && !wide)
            b.insert(b.end(), {'h', (unsigned char)idx});
        else
            b.insert(b.end(), {'j', (unsigned char)idx, (unsigned char)(idx >> 8),
                               (unsigned char)(idx >> 16), 0});
    };
    auto str = [&](const char *s) {
        b.push_back(0x8c);
        b.push_back((unsigned char)strlen(s));
        b.insert(b.end(), s, s + strlen(s));
    };
    auto mstr = [&](const char *s) {
        str(s);
        return put(0);
    };
    auto open_dict = [&](int how) {
        b.push_back('}');
        size_t m = put(how);
        b.push_back('(');
        return m;
    };
    // Entry 0: fresh keys and values (the general loop), memoized for the others.
    open_dict(0);
    size_t k_action = mstr("action"), alloc = mstr("alloc");
    size_t k_addr = mstr("addr");
    b.insert(b.end(), {0x8a, 6, 0, 0x10, 0, 0, 0x7f, 0});
    size_t k_size = mstr("size");
    b.insert(b.end(), {'M', 0, 2});
    size_t k_stream = mstr("stream");
    b.insert(b.end(), {'K', 0});
    size_t k_time = mstr("time_us");
    b.insert(b.end(), {'J', 1, 2, 3, 4});
    size_t k_ctx = mstr("compile_context");
    size_t na = mstr("N/A");
    size_t k_frames = mstr("frames");
    b.push_back(']');
    size_t list0 = put(0);
    b.push_back('(');
    b.push_back('}'); // one frame dict, inside the skipped stack
    size_t frame0 = put(0);
    b.push_back('(');
    str("line");
    b.insert(b.end(), {'K', 7, 'u', 'e'});
    size_t k_extra = mstr("extra"), free_req = mstr("free_requested");
    b.push_back('u');
    // Memo slots referenced after the entries. Not the skipped stacks: one referenced outside
    // its entry sends the whole file to the whole-document reader (PK_ERR_WHOLE), tested apart.
    std::vector<size_t> kept;
    auto common = [&](int variant) { // action, addr, size, stream, time_us, compile_context
        ref(k_action, variant % 3 == 1);
        ref(variant % 2 ? alloc : free_req);
        ref(k_addr, variant % 3 == 2);
        if (variant % 4 == 0)
            b.insert(b.end(), {0x8a, 8, 1, 2, 3, 4, 5, 6, 7, 0x80}); // negative, 8 bytes
        else if (variant % 4 == 1)
            b.insert(b.end(), {0x8a, 0}); // LONG1 of no bytes: 0
        else
            b.insert(b.end(), {0x8a, 5, 0, 0, 0x20, 0x30, 0x7f});
        ref(k_size);
        b.insert(b.end(), {'J', (unsigned char)variant, 0, 1, 0});
        ref(k_stream);
        b.insert(b.end(), {'J', 0xff, 0xff, 0xff, 0xff}); // -1
        ref(k_time);
        b.insert(b.end(), {'M', (unsigned char)variant, 1});
        ref(k_ctx);
        str("N/A"); // a fresh one each entry, as newer snapshots write it
        kept.push_back(put(variant % 3));
    };
    auto frames_refs = [&](int n, int how) { // a skipped stack of n frame references
        ref(k_frames);
        b.push_back(']');
        put(how);
        if (n == 1) {
            ref(frame0);
            b.push_back('a');
        } else if (n > 1) {
            b.push_back('(');
            for (int i = 0; i < n; i++)
                ref(i % 2 ? frame0 : list0, i % 3 == 0);
            b.push_back('e');
        }
    };
    int entries = 1;
    // The common shape, every PUT kind, stacks of 0, 1, 2 and 40 references.
    for (int v = 0; v < 24; v++, entries++) {
        kept.push_back(open_dict(v % 3));
        if (v % 5 == 3) { // frames first, then the rest: keys reordered
            frames_refs(v % 4 == 0 ? 0 : 40, v % 3);
            common(v);
        } else {
            common(v);
            frames_refs(v % 4 == 0 ? 0 : v % 4 == 1 ? 1 : v % 4 == 2 ? 2 : 40, v % 3);
        }
        if (v % 6 == 5) { // an extra key with a memoized value
            ref(k_extra);
            ref(na);
        }
        b.push_back('u');
    }
    // Shapes the general loop reads (each after a common start).
    auto odd = [&](const std::vector<unsigned char> &tail) {
        kept.push_back(open_dict(0));
        common(entries);
        b.insert(b.end(), tail.begin(), tail.end());
        b.push_back('u');
        entries++;
    };
    odd({'h', (unsigned char)k_extra, ']', 0x94, '(', 'K', 1, 'K', 2, 'e'}); // a list of ints
    memo++;
    odd({'h', (unsigned char)k_extra, '}', 0x94, '(', 'h', (unsigned char)k_size, 'K', 3, 'u'});
    memo++;
    odd({'h', (unsigned char)k_extra, 0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
         0});                                         // 2^64 - 1: PK_UINT
    odd({'h', (unsigned char)k_extra, 'K', 9, 0x94}); // an int memoized
    kept.push_back(memo++);
    odd({'h', (unsigned char)k_extra, 'h', (unsigned char)(memo - 5)}); // a slot set above
    {
        size_t self = open_dict(0); // a reference to the dict inside itself
        common(entries);
        ref(k_extra);
        ref(self);
        b.push_back('u');
        kept.push_back(self);
        entries++;
    }
    odd({'h', (unsigned char)k_frames, ']', 0x94, 'h', (unsigned char)k_action, 'a'});
    memo++; // a stack whose first item is a string: the skip ends there
    odd({'h', (unsigned char)k_frames, 'h', (unsigned char)list0});        // a stack referenced
    odd({'h', (unsigned char)k_extra, 'N'});                               // None
    odd({'h', (unsigned char)k_extra, 0x88});                              // True
    odd({'h', (unsigned char)k_extra, 'G', 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}); // a float
    odd({'h', (unsigned char)k_extra, 0x8c, 3, 'n', 'e', 'w'}); // a string not seen before
    odd({'h', (unsigned char)k_extra, 'h', (unsigned char)na, 'q', (unsigned char)na});
    odd({0x95, 0, 0, 0, 0, 0, 0, 0, 0, 'h', (unsigned char)k_extra, 'K', 1}); // FRAME inside
    odd({'K', 5, 'K', 6});                                                    // an int key
    {
        // A LONG_BINPUT past the memo (the general loop grows it), read back with LONG_BINGET;
        size_t far = memo + 65536 + 5; // its low 16 bits: a free slot inside the memo
        b.push_back('}');
        b.insert(b.end(), {'r', (unsigned char)far, (unsigned char)(far >> 8),
                           (unsigned char)(far >> 16), 0});
        memo++; // one more slot set: the next MEMOIZE's index
        b.push_back('(');
        common(entries);
        b.push_back('u');
        kept.push_back(far);
        entries++;
    }
    // A dict the hook leaves a dict (no action).
    kept.push_back(open_dict(1));
    ref(k_size);
    b.insert(b.end(), {'K', 4});
    ref(k_stream);
    b.insert(b.end(), {'K', 0, 'u'});
    entries++;
    // After the entries: a list of references to what was memoized inside them.
    b.push_back(']');
    memo++;
    b.push_back(0x94);
    b.push_back('(');
    for (size_t m : kept)
        ref(m);
    b.insert(b.end(), {'e', 'e', '.'});

    // The hook's view: every dict with an action is taken; its pairs written out, the skipped
    // stack aside (the plain reader leaves that pair out of its dict).
    struct view_t {
        std::vector<std::string> seen;
    };
    auto show = show_pairs;
    auto take = [](void *arg, pk_value_t *const *pairs, size_t n, uint64_t *id_p) {
        auto *w = (view_t *)arg;
        bool act = false;
        for (size_t i = 0; i + 1 < n; i += 2)
            act = act || (pk_str(pairs[i]) != nullptr && strcmp(pk_str(pairs[i]), "action") == 0);
        if (!act)
            return 0;
        *id_p = w->seen.size();
        w->seen.push_back(show_pairs(pairs, n));
        return 1;
    };
    char e1[256] = "", e2[256] = "";
    pk_doc_t *plain = nullptr, *recs = nullptr;
    view_t view;
    ASSERT_TRUE(pk_parse_skip(b.data(), b.size(), nullptr, "frames", &plain, e1, sizeof e1)) << e1;
    ASSERT_TRUE(
        pk_parse_records(b.data(), b.size(), nullptr, "frames", take, &view, &recs, e2, sizeof e2))
        << e2;
    const pk_value_t *pr = pk_root(plain), *rr = pk_root(recs);
    ASSERT_EQ(pk_len(pr), (size_t)entries + 1);
    ASSERT_EQ(pk_len(rr), (size_t)entries + 1);
    ASSERT_EQ(view.seen.size(), (size_t)entries - 1);
    for (size_t i = 0; i < (size_t)entries; i++) {
        const pk_value_t *p = pk_at(pr, i), *r = pk_at(rr, i);
        ASSERT_EQ(p->type, PK_DICT) << i;
        if (i + 1 == (size_t)entries) { // the hook left it
            ASSERT_EQ(r->type, PK_DICT);
            EXPECT_EQ(show(r->u.seq.items, r->u.seq.n), show(p->u.seq.items, p->u.seq.n));
            continue;
        }
        ASSERT_EQ(r->type, PK_RECORD) << i;
        ASSERT_EQ(r->u.u, i) << i;
        EXPECT_EQ(view.seen[i], show(p->u.seq.items, p->u.seq.n)) << "entry " << i;
    }
    // What the entries memoized, referenced after them.
    const pk_value_t *pk = pk_at(pr, (size_t)entries), *rk = pk_at(rr, (size_t)entries);
    ASSERT_EQ(pk_len(pk), kept.size());
    ASSERT_EQ(pk_len(rk), kept.size());
    for (size_t i = 0; i < kept.size(); i++) {
        const pk_value_t *p = pk_at(pk, i), *r = pk_at(rk, i);
        if (p->type == PK_DICT && r->type == PK_RECORD) { // an entry: the same one
            bool same = false;
            for (size_t j = 0; j < (size_t)entries; j++)
                same = same || (pk_at(pr, j) == p && pk_at(rr, j) == r);
            EXPECT_TRUE(same) << "kept " << i;
            continue;
        }
        ASSERT_EQ(r->type, p->type) << "kept " << i << " (memo " << kept[i] << ")";
        if (p->type == PK_STR) {
            EXPECT_STREQ(r->u.str.s, p->u.str.s) << "kept " << i;
        } else if (p->type == PK_INT) {
            EXPECT_EQ(r->u.i, p->u.i) << "kept " << i;
        } else if (p->type == PK_DICT) {
            EXPECT_EQ(show(r->u.seq.items, r->u.seq.n), show(p->u.seq.items, p->u.seq.n));
        }
    }
    pk_free(plain);
    pk_free(recs);
    // Every cut, and every memo reference made undefined in turn, fails as the plain reader does.
    auto count = [](void *arg, pk_value_t *const *pairs, size_t n, uint64_t *id_p) {
        if (n < 2 || pk_str(pairs[0]) == nullptr || strcmp(pk_str(pairs[0]), "action") != 0)
            return 0;
        *id_p = (*(uint64_t *)arg)++;
        return 1;
    };
    auto agree = [&](const Bytes &c, const std::string &where) {
        TwoReads r = read_skip_and_records(c, count);
        EXPECT_EQ(r.skip_ok, r.rec_ok) << where;
        EXPECT_EQ(r.skip_err, r.rec_err) << where;
    };
    for (size_t cut = 1; cut < b.size(); cut++)
        agree(Bytes(b.begin(), b.begin() + (long)cut), "cut at " + std::to_string(cut));
    for (size_t at = 5; at + 1 < b.size(); at++) {
        if (b[at] != 'h')
            continue;
        Bytes c = b;
        c[at + 1] = 0xfe;
        agree(c, "BINGET at " + std::to_string(at));
    }
}

// A value the skipping readers skipped, read again under another key than the skipped one, is
// what they cannot read (the whole document is to be read): the record reader says so too
// where it reads a trace entry in one pass (it handed the skipped value to the hook as the
// entry's addr).
TEST(PickleRead, SkippedValueUnderAnotherKeyIsReadWholeByTheRecordReaderToo) {
    Bytes b = {0x80, 4, ']', 0x94, '('};
    auto str = [&](const char *s) {
        b.push_back(0x8c);
        b.push_back((unsigned char)strlen(s));
        b.insert(b.end(), s, s + strlen(s));
        b.push_back(0x94);
    };
    // Entry 0 (memo 1): action (2) alloc (3) addr (4) 16 frames (5) [] (6, skipped).
    b.insert(b.end(), {'}', 0x94, '('});
    str("action");
    str("alloc");
    str("addr");
    b.insert(b.end(), {'K', 16});
    str("frames");
    b.insert(b.end(), {']', 0x94, 'u'});
    // Entries 1-9 (the common shape, read in one pass), then one whose addr is the stack.
    for (int i = 0; i < 10; i++) {
        b.insert(b.end(), {'}', 0x94, '(', 'h', 2, 'h', 3, 'h', 4});
        if (i < 9)
            b.insert(b.end(), {'K', (unsigned char)(32 + i)});
        else
            b.insert(b.end(), {'h', 6});
        b.insert(b.end(), {'h', 5, 'h', 6, 'u'});
    }
    b.insert(b.end(), {'e', '.'});
    auto count = [](void *arg, pk_value_t *const *pairs, size_t n, uint64_t *id_p) {
        if (n < 2 || pk_str(pairs[0]) == nullptr || strcmp(pk_str(pairs[0]), "action") != 0)
            return 0;
        *id_p = (*(uint64_t *)arg)++;
        return 1;
    };
    TwoReads r = read_skip_and_records(b, count);
    EXPECT_FALSE(r.skip_ok);
    EXPECT_TRUE(pk_err_whole(r.skip_err.c_str())) << r.skip_err;
    EXPECT_FALSE(r.rec_ok);
    EXPECT_EQ(r.rec_err, r.skip_err);
}

// Short strings in whole records come from the string cache only when it holds that very string:
// hundreds of different ones, so that many share a slot of the cache with another, read as the
// plain reader reads them (memoized or not, and referenced again).
TEST(PickleRead, CachedStringsInWholeRecordsAreTheOnesWritten) {
    Bytes b = {0x80, 4, ']', 0x94, '('};
    size_t memo = 1;
    auto mstr = [&](const std::string &s) {
        b.push_back(0x8c);
        b.push_back((unsigned char)s.size());
        b.insert(b.end(), s.begin(), s.end());
        b.push_back(0x94);
        return memo++;
    };
    b.insert(b.end(), {'}', 0x94, '('});
    memo++;
    size_t k_action = mstr("action");
    mstr("alloc");
    size_t k_note = mstr("note");
    mstr("x");
    b.push_back('u');
    std::vector<size_t> notes;
    unsigned seed = 11;
    const int entries = 1500;
    for (int i = 1; i < entries; i++) {
        b.insert(b.end(), {'}', 0x94, '('});
        memo++;
        b.insert(b.end(), {'h', (unsigned char)k_action, 'h', (unsigned char)(k_action + 1)});
        b.insert(b.end(), {'h', (unsigned char)k_note});
        seed = seed * 1103515245u + 12345u;
        unsigned r = (seed >> 8) % 400;
        if (r % 7 == 0 && !notes.empty()) { // a note memoized before
            size_t m = notes[(seed >> 4) % notes.size()];
            b.insert(b.end(), {'j', (unsigned char)m, (unsigned char)(m >> 8), 0, 0});
        } else {
            std::string s = "n" + std::to_string(r);
            b.push_back(0x8c);
            b.push_back((unsigned char)s.size());
            b.insert(b.end(), s.begin(), s.end());
            if (r % 3 == 0) {
                b.push_back(0x94);
                notes.push_back(memo++);
            }
        }
        b.push_back('u');
    }
    b.insert(b.end(), {'e', '.'});
    struct view_t {
        std::vector<std::string> seen;
    } view;
    auto take = [](void *arg, pk_value_t *const *pairs, size_t n, uint64_t *id_p) {
        auto *w = (view_t *)arg;
        *id_p = w->seen.size();
        w->seen.push_back(show_pairs(pairs, n));
        return 1;
    };
    char e1[256] = "", e2[256] = "";
    pk_doc_t *plain = nullptr, *recs = nullptr;
    ASSERT_TRUE(pk_parse_skip(b.data(), b.size(), nullptr, "frames", &plain, e1, sizeof e1)) << e1;
    ASSERT_TRUE(
        pk_parse_records(b.data(), b.size(), nullptr, "frames", take, &view, &recs, e2, sizeof e2))
        << e2;
    ASSERT_EQ(view.seen.size(), (size_t)entries);
    for (size_t i = 0; i < (size_t)entries; i++) {
        const pk_value_t *p = pk_at(pk_root(plain), i);
        ASSERT_EQ(p->type, PK_DICT);
        EXPECT_EQ(view.seen[i], show_pairs(p->u.seq.items, p->u.seq.n)) << "entry " << i;
    }
    pk_free(plain);
    pk_free(recs);
}

namespace {

// A memo reference to a key never set, inside a skipped stack: the skipping readers count such
// references without following them, and loaded the file that pk_parse (and Python) refuse, so
// `info` and `replay` read a snapshot that `plot` and `summary` refused. Every reader refuses it
// now at the same offset: one at a time near the end, in a run of BINGETs or of LONG_BINGETs
// (read eight and four at once), with few memo slots set and with more than 256.
TEST(PickleRead, AReferenceToAnUnsetMemoKeyInASkippedStackIsRefusedByEveryReader) {
    auto doc = [](size_t memoized, bool wide, size_t before, size_t after) {
        Bytes b = {0x80, 4, ']', '('};
        for (size_t i = 0; i < memoized; i++) // memo 0 .. memoized-1: ints in the root list
            b.insert(b.end(), {'K', (unsigned char)i, 0x94});
        b.insert(b.end(), {'}', '(', 0x8c, 6, 'f', 'r', 'a', 'm', 'e', 's', ']', '(', '}'});
        auto ref = [&](size_t idx) {
            if (wide)
                b.insert(b.end(), {'j', (unsigned char)idx, (unsigned char)(idx >> 8), 0, 0});
            else
                b.insert(b.end(), {'h', (unsigned char)idx});
        };
        for (size_t i = 0; i < before; i++)
            ref(0);
        size_t at = b.size();
        ref(memoized); // never set
        for (size_t i = 0; i < after; i++)
            ref(0);
        b.insert(b.end(), {'e', 'u', 'e', '.'});
        return std::make_pair(b, at);
    };
    auto keep = [](void *, pk_value_t *const *, size_t, uint64_t *) { return 0; };
    for (size_t memoized : {1u, 300u})
        for (bool wide : {false, true})
            for (size_t before : {0u, 1u, 5u, 9u})
                for (size_t after : {0u, 20u}) {
                    if (memoized == 300 && !wide)
                        continue; // every BINGET's key is set once 256 slots are
                    auto [b, at] = doc(memoized, wide, before, after);
                    std::string want = "pickle: memo key " + std::to_string(memoized) +
                                       " is not defined at offset " + std::to_string(at);
                    SCOPED_TRACE(std::to_string(memoized) + (wide ? " wide " : " ") +
                                 std::to_string(before) + "/" + std::to_string(after));
                    EXPECT_EQ(parse(b), want);
                    pk_doc_t *d = nullptr;
                    char err[256] = "";
                    EXPECT_FALSE(
                        pk_parse_skip(b.data(), b.size(), nullptr, "frames", &d, err, sizeof err));
                    EXPECT_EQ(std::string(err), want);
                    err[0] = '\0';
                    EXPECT_FALSE(pk_parse_records(b.data(), b.size(), nullptr, "frames", keep,
                                                  nullptr, &d, err, sizeof err));
                    EXPECT_EQ(std::string(err), want);
                }
}

} // namespace

namespace {

// Inside a skipped stack nothing is built, but an APPEND(S) or SETITEM(S) onto a value of the
// wrong kind is refused there as pk_parse refuses it ("target is not a list"): the skipping
// readers took every skipped value for any container and loaded files pk_parse refuses (or
// refused them for another reason). What they counted without looking (a memo reference) may
// still be any container, and what is added to a real one is added.
TEST(PickleRead, AddingToASkippedValueOfTheWrongKindIsRefusedByEveryReader) {
    // {"frames": [<items>]} in a list, the items as given.
    auto doc = [](std::initializer_list<unsigned char> items) {
        Bytes b = {0x80, 4, ']', '(', '}', '(', 0x8c, 6, 'f', 'r', 'a', 'm', 'e', 's', ']', '('};
        b.insert(b.end(), items);
        b.insert(b.end(), {'e', 'u', 'e', '.'});
        return b;
    };
    const struct {
        const char *what;
        Bytes b;
        const char *want; // "" loads
    } cases[] = {
        {"SETITEMS onto an int", doc({'}', '(', 'K', 3, '(', '}', '}', 'u', 'u'}),
         "pickle: SETITEMS target is not a dict at offset 23"},
        {"SETITEMS onto an int (odd)", doc({'}', '(', 'K', 3, '(', '}', 'u', 'u'}),
         "pickle: SETITEMS target is not a dict at offset 22"},
        {"APPEND onto a string", doc({0x8c, 1, 'x', '}', 'a'}),
         "pickle: APPEND target is not a list at offset 20"},
        {"SETITEMS onto a list", doc({']', '(', 'K', 1, 'K', 2, 'u'}),
         "pickle: SETITEMS target is not a dict at offset 22"},
        {"APPENDS onto a dict", doc({'}', '(', 'K', 1, 'e'}),
         "pickle: APPENDS target is not a list at offset 20"},
        {"SETITEM onto a tuple", doc({')', 'K', 1, 'K', 2, 's'}),
         "pickle: SETITEM target is not a dict at offset 21"},
        {"APPENDS onto None", doc({'N', '(', 'K', 1, 'e'}),
         "pickle: APPENDS target is not a list at offset 20"},
        {"APPENDS onto a list made with LIST", doc({'(', 'l', '(', 'K', 1, 'e'}), ""},
        {"SETITEMS onto a dict made with DICT", doc({'(', 'd', '(', 'K', 1, 'K', 2, 'u'}), ""},
        {"APPENDS onto a memoized list", doc({']', 'q', 9, '0', 'h', 9, '(', 'K', 1, 'e', '0'}),
         ""},
    };
    auto keep = [](void *, pk_value_t *const *, size_t, uint64_t *) { return 0; };
    for (const auto &c : cases) {
        SCOPED_TRACE(c.what);
        EXPECT_EQ(parse(c.b), c.want);
        for (int path = 1; path < 3; path++) {
            pk_doc_t *d = nullptr;
            char err[256] = "";
            bool ok = path == 1 ? pk_parse_skip(c.b.data(), c.b.size(), nullptr, "frames", &d, err,
                                                sizeof err)
                                : pk_parse_records(c.b.data(), c.b.size(), nullptr, "frames", keep,
                                                   nullptr, &d, err, sizeof err);
            EXPECT_EQ(ok, *c.want == '\0') << "path " << path << ": " << err;
            if (!ok) {
                EXPECT_STREQ(err, c.want) << "path " << path;
            }
            pk_free(d);
        }
    }
    // Items added to a value that a memo reference pushed inside the stack (which no pickler
    // writes): the skipping readers do not look references up, so they refuse the document as
    // one to read whole, which the trace loader then does.
    Bytes b = doc({'}', ']', 'q', 9, '0', 'h', 9, '(', 'K', 1, 'e', '0', '0'});
    EXPECT_EQ(parse(b), "");
    pk_doc_t *d = nullptr;
    char err[256] = "";
    EXPECT_FALSE(pk_parse_skip(b.data(), b.size(), nullptr, "frames", &d, err, sizeof err));
    EXPECT_STREQ(err, PK_ERR_WHOLE "APPENDS adds to a value a reference inside \"frames\" pushed "
                                   "at offset 26");
}

} // namespace

namespace {

// The one-pass entry reader (record_fast) passes over a stack's run of memo references as
// skip_fast does: a reference in that run to a key never set is refused there too, not handed
// to the hook inside a record (the hook here takes every entry, so a record made past such a
// reference would load the file). Runs short and long (read one, eight and four at a time).
TEST(PickleRead, TheEntryReaderRefusesAnUnsetMemoKeyInAStackRun) {
    for (bool wide : {false, true})
        for (size_t before : {0u, 3u, 9u, 24u}) {
            // [ {"action": "alloc", "frames": []}, {"action": "alloc", "frames": [refs]} ]
            Bytes b = {0x80, 4, ']', 0x94, '(', '}', 0x94, '('}; // memo 0 list, 1 entry
            auto mstr = [&](const char *s) {
                b.push_back(0x8c);
                b.push_back((unsigned char)strlen(s));
                b.insert(b.end(), s, s + strlen(s));
                b.push_back(0x94);
            };
            mstr("action");                      // 2
            mstr("alloc");                       // 3
            mstr("frames");                      // 4
            b.insert(b.end(), {']', 0x94, 'u'}); // 5: entry 1's stack
            b.insert(b.end(), {'}', 0x94, '(', 'h', 2, 'h', 3, 'h', 4, ']', 0x94, '('}); // 6, 7
            auto ref = [&](size_t idx) {
                if (wide)
                    b.insert(b.end(), {'j', (unsigned char)idx, 0, 0, 0});
                else
                    b.insert(b.end(), {'h', (unsigned char)idx});
            };
            ref(1); // the first item: entry 1 (no string, so the stack is skipped)
            for (size_t i = 0; i < before; i++)
                ref(1);
            size_t at = b.size();
            ref(99); // never set
            for (size_t i = 0; i < 8; i++)
                ref(1);
            b.insert(b.end(), {'e', 'u', 'e', '.'});
            auto take = [](void *arg, pk_value_t *const *, size_t, uint64_t *id_p) {
                *id_p = (*(uint64_t *)arg)++;
                return 1;
            };
            uint64_t taken = 0;
            pk_doc_t *d = nullptr;
            char err[256] = "";
            SCOPED_TRACE(std::string(wide ? "wide " : "") + std::to_string(before));
            EXPECT_FALSE(pk_parse_records(b.data(), b.size(), nullptr, "frames", take, &taken, &d,
                                          err, sizeof err));
            EXPECT_EQ(std::string(err),
                      "pickle: memo key 99 is not defined at offset " + std::to_string(at));
            EXPECT_EQ(parse(b),
                      "pickle: memo key 99 is not defined at offset " + std::to_string(at));
        }
}

} // namespace

namespace {

// What Python's pickle.load (the C unpickler, which PyTorch's viewer loads snapshots with)
// refuses among the data opcodes, every reader refuses at the same opcode, whether the value is
// in a skipped stack or not: a str that is not UTF-8 (BINUNICODE decodes with 'surrogatepass', so
// a lone surrogate is one), a SHORT_BINSTRING that is not ASCII (its str is decoded as ASCII), a
// dict key it cannot hash (TypeError: a list, a dict, a bytearray, a tuple holding one), added by
// SETITEMS, SETITEM or DICT, written there or reached through the memo. The readers kept such
// strings as bytes and such keys as keys no consumer reads. What pickle.load reads, they read:
// each case was checked against CPython 3.11's pickle.loads.
TEST(PickleRead, WhatPickleLoadRefusesEveryReaderRefuses) {
    // [ "k", {"frames": [X]}, X ]: memo 0 is the root list, memo 1 the string "k"; X inside the
    // skipped stack and outside it.
    const Bytes head = {0x80, 4, ']', 0x94, '(', 0x8c, 1,   'k', 0x94, '}', '(',
                        0x8c, 6, 'f', 'r',  'a', 'm',  'e', 's', ']',  '('};
    auto doc = [&](const Bytes &x) {
        Bytes b = head;
        b.insert(b.end(), x.begin(), x.end());
        b.insert(b.end(), {'e', 'u'});
        b.insert(b.end(), x.begin(), x.end());
        b.insert(b.end(), {'e', '.'});
        return b;
    };
    const std::string hash_why = "with a dict key Python cannot hash (a list, a dict, a "
                                 "bytearray, a tuple holding one)";
    const std::string set_why = "with an item Python cannot hash (a list, a dict, a set, a "
                                "bytearray, a tuple holding one)";
    const struct {
        const char *what;
        Bytes x;
        long at;         // the failing opcode's offset in x, -1: loads
        std::string why; // the message before " at offset N"
    } cases[] = {
        {"BINUNICODE not UTF-8",
         {0x8c, 2, 0xff, 'a'},
         0,
         "string is not UTF-8 (byte 0xff at 0 of its 2): pickle.load refuses it"},
        {"a cut sequence",
         {'X', 3, 0, 0, 0, 'a', 0xe2, 0x82},
         0,
         "string is not UTF-8 (byte 0xe2 at 1 of its 3): pickle.load refuses it"},
        {"an overlong NUL",
         {0x8c, 2, 0xc0, 0x80},
         0,
         "string is not UTF-8 (byte 0xc0 at 0 of its 2): pickle.load refuses it"},
        {"an overlong three bytes",
         {0x8c, 3, 0xe0, 0x80, 0x80},
         0,
         "string is not UTF-8 (byte 0xe0 at 0 of its 3): pickle.load refuses it"},
        {"past U+10FFFF",
         {0x8c, 4, 0xf4, 0x90, 0x80, 0x80},
         0,
         "string is not UTF-8 (byte 0xf4 at 0 of its 4): pickle.load refuses it"},
        {"BINUNICODE8 not UTF-8",
         {0x8d, 1, 0, 0, 0, 0, 0, 0, 0, 0x80},
         0,
         "string is not UTF-8 (byte 0x80 at 0 of its 1): pickle.load refuses it"},
        {"a lone surrogate ('surrogatepass')", {0x8c, 3, 0xed, 0xa0, 0x80}, -1, ""},
        {"four bytes", {0x8c, 4, 0xf0, 0x9f, 0x98, 0x80}, -1, ""},
        {"long ASCII then not UTF-8",
         {0x8c, 12, 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 0xff, 'k', 'l'},
         0,
         "string is not UTF-8 (byte 0xff at 9 of its 12): pickle.load refuses it"},
        {"SHORT_BINSTRING not ASCII",
         {'U', 2, 0xc3, 0xa9},
         0,
         "string is not ASCII (byte 0xc3 at 0 of its 2): pickle.load refuses it"},
        {"BINSTRING ASCII", {'T', 2, 0, 0, 0, 'o', 'k'}, -1, ""},
        {"a list key", {'}', '(', ']', 'K', 1, 'u'}, 5, "SETITEMS " + hash_why},
        {"a dict key", {'}', '(', '}', 'K', 1, 'u'}, 5, "SETITEMS " + hash_why},
        {"a bytearray key",
         {'}', '(', 0x96, 1, 0, 0, 0, 0, 0, 0, 0, 'a', 'K', 1, 'u'},
         14,
         "SETITEMS " + hash_why},
        {"a tuple of a list as key", {'}', '(', ']', 0x85, 'K', 1, 'u'}, 6, "SETITEMS " + hash_why},
        {"a tuple of a tuple of a dict",
         {'}', '(', '}', 0x85, 0x85, 'K', 1, 'u'},
         7,
         "SETITEMS " + hash_why},
        {"SETITEM with a list key", {'}', ']', 'K', 1, 's'}, 4, "SETITEM " + hash_why},
        {"DICT with a list key", {'(', ']', 'K', 1, 'd'}, 4, "DICT " + hash_why},
        {"a reference to a list as key",
         {'}', '(', 'h', 0, 'K', 1, 'u'},
         6,
         "SETITEMS " + hash_why},
        {"a list memoized in the stack as key",
         {']', 0x94, '0', '}', '(', 'h', 2, 'K', 1, 'u'},
         9,
         "SETITEMS " + hash_why},
        {"a list key among string keys",
         {'}', '(', 'h', 1, 'K', 1, 0x8c, 1, 'x', 'h', 1, 'h', 0, 'K', 1, 'u'},
         15,
         "SETITEMS " + hash_why},
        {"hashable keys",
         {'}', '(',  'h',  1, 'K', 1, ')', 'K', 2, 'K', 7, 0x85, 'N', 'N', 'K', 3,
          'G', 0x7f, 0xf8, 0, 0,   0, 0,   0,   0, 'K', 4, 'C',  1,   'b', 'N', 'u'},
         -1,
         ""},
        {"a list as a value", {'}', '(', 'h', 1, ']', 'u'}, -1, ""},
        // Protocol 4's sets (EMPTY_SET, ADDITEMS, FROZENSET): read, and refused where
        // pickle.load refuses them (AttributeError: no add(); TypeError: unhashable).
        {"a set and a frozenset",
         {0x8f, '(', 'K', 1, 'K', 2, 0x90, '(', 0x8c, 1, 'x', 0x91},
         -1,
         ""},
        {"ADDITEMS of nothing onto None", {'N', '(', 0x90}, -1, ""},
        {"a frozenset key", {'}', '(', '(', 'K', 1, 0x91, 'N', 'u'}, -1, ""},
        {"a frozenset in a frozenset", {'(', '(', 'K', 1, 0x91, 0x91}, -1, ""},
        {"ADDITEMS onto a list", {']', '(', 'K', 1, 0x90}, 4, "ADDITEMS target is not a set"},
        {"ADDITEMS onto a frozenset",
         {'(', 0x91, '(', 'K', 1, 0x90},
         5,
         "ADDITEMS target is not a set"},
        {"a list in a set", {0x8f, '(', ']', 0x90}, 3, "ADDITEMS " + set_why},
        {"a list in a frozenset", {'(', ']', 0x91}, 2, "FROZENSET " + set_why},
        {"a set in a frozenset", {'(', 0x8f, 0x91}, 2, "FROZENSET " + set_why},
        {"a set key", {'}', '(', 0x8f, 'N', 'u'}, 4, "SETITEMS " + hash_why},
        {"a tuple of a set as key", {'}', '(', 0x8f, 0x85, 'N', 'u'}, 5, "SETITEMS " + hash_why},
    };
    auto keep = [](void *, pk_value_t *const *, size_t, uint64_t *) { return 0; };
    auto take = [](void *arg, pk_value_t *const *, size_t, uint64_t *id_p) {
        *id_p = (*(uint64_t *)arg)++;
        return 1;
    };
    for (const auto &c : cases) {
        SCOPED_TRACE(c.what);
        Bytes b = doc(c.x);
        std::string want =
            c.at < 0 ? "" : "pickle: " + c.why + " at offset " + std::to_string(head.size() + c.at);
        EXPECT_EQ(parse(b), want);
        for (int path = 1; path <= 3; path++) {
            pk_doc_t *d = nullptr;
            char err[256] = "";
            uint64_t ids = 0;
            bool ok = path == 1   ? pk_parse_skip(b.data(), b.size(), nullptr, "frames", &d, err,
                                                  sizeof err)
                      : path == 2 ? pk_parse_records(b.data(), b.size(), nullptr, "frames", keep,
                                                     nullptr, &d, err, sizeof err)
                                  : pk_parse_records(b.data(), b.size(), nullptr, "frames", take,
                                                     &ids, &d, err, sizeof err);
            EXPECT_EQ(ok, want.empty()) << "path " << path << ": " << err;
            if (!ok) {
                EXPECT_EQ(std::string(err), want) << "path " << path;
            }
            pk_free(d);
        }
    }
    // A SHORT_BINSTRING is a str, as pickle.load makes it: a key the consumers read.
    pk_doc_t *d = nullptr;
    ASSERT_EQ(parse(Bytes{0x80, 2, '}', 'U', 1, 'a', 'K', 5, 's', '.'}, &d), "");
    int64_t v = 0;
    EXPECT_TRUE(pk_get_int(pk_root(d), "a", &v));
    EXPECT_EQ(v, 5);
    pk_free(d);
}

// A FRAME is what pickle.load (the C unpickler) makes of it: a length that must be there (else
// "pickle data was truncated"), not a boundary. An opcode whose argument runs past the frame's
// end, or a FRAME inside a frame, loads there; only the pure-Python unpickler (pickle._loads)
// refuses them ("pickle exhausted before end of frame"), and pickle.load is not it. So every
// reader loads them too (checked against CPython 3.11's pickle.loads and pickle.load).
TEST(PickleRead, AFrameIsALengthAsPickleLoadReadsIt) {
    auto frame = [](uint64_t n) {
        Bytes f = {0x95};
        for (int i = 0; i < 8; i++)
            f.push_back((unsigned char)(n >> (8 * i)));
        return f;
    };
    Bytes straddle = {0x80, 4};
    for (unsigned char c : frame(2))
        straddle.push_back(c);
    straddle.insert(straddle.end(), {'J', 1, 0, 0, 0, '.'}); // BININT's argument past the end
    Bytes nested = {0x80, 4};
    for (unsigned char c : frame(12))
        nested.push_back(c);
    for (unsigned char c : frame(2))
        nested.push_back(c);
    nested.insert(nested.end(), {'K', 1, '.'});
    for (const Bytes &b : {straddle, nested}) {
        pk_doc_t *d = nullptr;
        ASSERT_EQ(parse(b, &d), "");
        int64_t v = 0;
        EXPECT_TRUE(pk_int(pk_root(d), &v));
        EXPECT_EQ(v, 1);
        pk_free(d);
    }
    Bytes past = {0x80, 4};
    for (unsigned char c : frame(20))
        past.push_back(c);
    past.insert(past.end(), {'K', 1, '.'});
    EXPECT_EQ(parse(past), "pickle: FRAME of 20 bytes runs past the end at offset 2");
}

// A BINPUT past the next memo index inside a dict the records path takes leaves a hole below
// it, as in the general loop: a skipped stack's reference to the hole is refused in both.
TEST(PickleRead, RecordsPathPutPastTheNextIndexLeavesAHole) {
    Bytes b = {0x80, 4, ']', 0x94, '('};
    // Entry 0 (the general loop: its keys are new): memo 1 dict, 2 "action", 3 "alloc",
    // 4 "frames", 5 its empty stack.
    b.insert(b.end(), {'}',  0x94, '(', 0x8c, 6,   'a', 'c',  't', 'i',  'o',  'n',
                       0x94, 0x8c, 5,   'a',  'l', 'l', 'o',  'c', 0x94, 0x8c, 6,
                       'f',  'r',  'a', 'm',  'e', 's', 0x94, ']', 0x94, 'u'});
    // Entry 1 (the records path): its dict put at 7, past the next index 6.
    b.insert(b.end(), {'}', 'q', 7, '(', 'h', 2, 'h', 3, 'u'});
    // Entry 2: a stack of entry 0 and then the hole twice.
    b.insert(b.end(), {'}', 'q', 8,   '(', 'h', 2,   'h', 3,   'h', 4,   ']',
                       'q', 9,   '(', 'h', 1,   'h', 6,   'h', 6,   'e', 'u'});
    b.insert(b.end(), {'e', '.'});
    auto take = [](void *arg, pk_value_t *const *, size_t, uint64_t *id_p) {
        *id_p = (*(uint64_t *)arg)++;
        return 1;
    };
    TwoReads r = read_skip_and_records(b, take);
    EXPECT_FALSE(r.skip_ok);
    EXPECT_EQ(r.skip_ok, r.rec_ok);
    EXPECT_EQ(r.skip_err, r.rec_err);
}

} // namespace

// Skipped stacks of one long run of BINGETs (the readers take up to eight at once, then sixteen
// more bytes at a time while they are eight more), of every length around those steps and in
// both memo states (under 256 slots set, where every key is compared with the count, and over,
// where a BINGET's key is set without a look): the three readers read the same entries; every
// cut, and a key never set at every place of every run, fail alike (under ASan: no read past
// the cut).
TEST(PickleRead, LongRunsOfBingetsInSkippedStacksReadAsWhole) {
    const int lens[] = {1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 40, 64};
    for (int ints : {100, 300}) {
        SCOPED_TRACE("memoized ints " + std::to_string(ints));
        // Memo 0: the root list, 1..3: "action", "alloc", "frames", 4.. the ints (in the first
        // entry's stack).
        Bytes b = {0x80, 4, ']', 0x94, '('};
        auto str = [&](const char *s) {
            b.push_back(0x8c);
            b.push_back((unsigned char)strlen(s));
            b.insert(b.end(), s, s + strlen(s));
            b.push_back(0x94);
        };
        b.insert(b.end(), {'}', '('});
        str("action");
        str("alloc");
        str("frames");
        b.insert(b.end(), {']', '('});
        for (int i = 0; i < ints; i++)
            b.insert(b.end(), {'M', (unsigned char)i, (unsigned char)(i >> 8), 0x94});
        b.insert(b.end(), {'e', 'u'});
        std::vector<size_t> refs; // every BINGET's offset in the runs
        for (int len : lens) {
            b.insert(b.end(), {'}', '(', 'h', 1, 'h', 2, 'h', 3, ']', '('});
            for (int i = 0; i < len; i++) {
                refs.push_back(b.size());
                b.insert(b.end(), {'h', (unsigned char)(4 + (i * 7) % 96)});
            }
            b.insert(b.end(), {'e', 'u'});
        }
        b.insert(b.end(), {'e', '.'});
        auto take = [](void *arg, pk_value_t *const *, size_t, uint64_t *id_p) {
            *id_p = (*(uint64_t *)arg)++;
            return 1;
        };
        char err[256] = "";
        pk_doc_t *plain = nullptr;
        ASSERT_TRUE(pk_parse(b.data(), b.size(), nullptr, &plain, err, sizeof err)) << err;
        const size_t n = sizeof lens / sizeof lens[0];
        ASSERT_EQ(pk_len(pk_root(plain)), n + 1);
        for (size_t k = 0; k < n; k++)
            EXPECT_EQ(pk_len(pk_get(pk_at(pk_root(plain), k + 1), "frames")), (size_t)lens[k]);
        pk_free(plain);
        // The readers that skip the stacks: every entry, each its own dict.
        pk_doc_t *skip = nullptr, *recs = nullptr;
        ASSERT_TRUE(pk_parse_skip(b.data(), b.size(), nullptr, "frames", &skip, err, sizeof err))
            << err;
        uint64_t taken = 0;
        ASSERT_TRUE(pk_parse_records(b.data(), b.size(), nullptr, "frames", take, &taken, &recs,
                                     err, sizeof err))
            << err;
        EXPECT_EQ(pk_len(pk_root(skip)), n + 1);
        for (size_t k = 0; k <= n; k++)
            EXPECT_STREQ(pk_get_str(pk_at(pk_root(skip), k), "action"), "alloc");
        EXPECT_EQ(pk_len(pk_root(recs)), n + 1);
        EXPECT_EQ(taken, n + 1);
        pk_free(skip);
        pk_free(recs);
        auto plain_err = [](const Bytes &c) {
            char e[256] = "";
            pk_doc_t *d = nullptr;
            EXPECT_FALSE(pk_parse(c.data(), c.size(), nullptr, &d, e, sizeof e));
            pk_free(d);
            return std::string(e);
        };
        for (size_t cut = refs.front(); cut < b.size(); cut++) {
            Bytes c(b.begin(), b.begin() + (long)cut);
            TwoReads r = read_skip_and_records(c, take);
            std::string want = plain_err(c);
            EXPECT_EQ(r.skip_err, want) << "cut at " << cut;
            EXPECT_EQ(r.rec_err, want) << "cut at " << cut;
        }
        // Key 250: never set (under 256 slots), or set (over), at every place of every run.
        for (size_t at : refs) {
            Bytes c = b;
            c[at + 1] = 250;
            TwoReads r = read_skip_and_records(c, take);
            if (ints < 250) {
                std::string want =
                    "pickle: memo key 250 is not defined at offset " + std::to_string(at);
                EXPECT_EQ(plain_err(c), want);
                EXPECT_EQ(r.skip_err, want);
                EXPECT_EQ(r.rec_err, want);
            } else {
                EXPECT_TRUE(r.skip_ok) << r.skip_err;
                EXPECT_TRUE(r.rec_ok) << r.rec_err;
            }
        }
    }
}

// Every dict the record hook takes is a value of the document, counted against max_values as
// any other (record_fast makes it inline): a trace of one more entry needs one more value, and
// one value short of what it needs fails at the value that is one too many.
TEST(PickleRead, TakenDictsCountAgainstTheValueLimit) {
    // As PyTorch's pickler writes a trace: every dict memoized, the keys and the action memo
    // references from the second entry on (the record hook's one-pass path takes those).
    auto trace = [](int entries) {
        Bytes b = {0x80, 4, ']', 0x94, '('}; // memo 0: the list
        auto str = [&](const char *x) {
            b.insert(b.end(), {0x8c, (unsigned char)strlen(x)});
            b.insert(b.end(), x, x + strlen(x));
            b.push_back(0x94);
        };
        b.insert(b.end(), {'}', 0x94, '('}); // memo 1; "action" 2, "alloc" 3, "addr" 4, "size" 5
        str("action");
        str("alloc");
        str("addr");
        b.insert(b.end(), {'K', 0});
        str("size");
        b.insert(b.end(), {'K', 1, 'u'});
        for (int i = 1; i < entries; i++) {
            b.insert(b.end(), {'}', 0x94, '(', 'h', 2, 'h', 3, 'h', 4, 'J', (unsigned char)i,
                               (unsigned char)(i >> 8), 0, 0, 'h', 5, 'K', 1, 'u'});
        }
        b.insert(b.end(), {'e', '.'});
        return b;
    };
    auto take = [](void *, pk_value_t *const *, size_t, uint64_t *id_p) {
        *id_p = 0;
        return 1;
    };
    // The fewest values each loads with.
    auto fewest = [&](const Bytes &b, std::string *short_err) {
        for (size_t m = 1; m < 1000; m++) {
            pk_limits_t lim;
            pk_limits_default(&lim);
            lim.max_values = m;
            char err[256] = "";
            pk_doc_t *d = nullptr;
            bool ok = pk_parse_records(b.data(), b.size(), &lim, "frames", take, nullptr, &d, err,
                                       sizeof err);
            pk_free(d);
            if (ok)
                return m;
            *short_err = err;
        }
        return (size_t)0;
    };
    std::string e50, e51;
    size_t m50 = fewest(trace(50), &e50), m51 = fewest(trace(51), &e51);
    ASSERT_GT(m50, 50u);
    EXPECT_EQ(m51, m50 + 1);
    EXPECT_EQ(e51.rfind("pickle: more than " + std::to_string(m51 - 1) + " values at offset ", 0),
              0u)
        << e51;
}
