// test_history.cc: memory history (pool/history.c) and snapshots (pool/snapshot.c): the ring
// buffer, each action recorded at PyTorch's moment with PyTorch's size, streams and pools, stack
// contexts (hook, C frames, interning), and snapshots read back (our reader, python3 when
// present) including the trace replaying backwards to the snapshot state.
#include "sp_test.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "pool/history.h"
#include "sympool/experimental.h"
#include "tests/unit/device_lock_probe.h"
#include "tools/pickle_read.h"
}

namespace {

constexpr size_t MiB = 1024 * 1024;

std::vector<sp__trace_entry_t> trace(int dev = 0) {
    sp__trace_entry_t *e = nullptr;
    size_t n = 0;
    EXPECT_EQ(sp__history_copy(dev, &e, &n), SP_SUCCESS);
    std::vector<sp__trace_entry_t> out(e, e + n);
    sp__history_entries_free(e, n);
    return out;
}

sp_status_t record(sp_history_enabled_t en, size_t max_entries = 0,
                   sp_history_context_t ctx = SP_CONTEXT_NONE, bool c_stacks = false) {
    sp_history_params_t p;
    sp_history_params_init(&p);
    p.enabled = en;
    p.max_entries = max_entries;
    p.context = ctx;
    p.c_stacks = c_stacks;
    return sp_record_memory_history(&p);
}

std::string tempdir() {
    char tmpl[] = "/tmp/sp_history_XXXXXX";
    char *d = mkdtemp(tmpl);
    EXPECT_NE(d, nullptr);
    return d ? d : "/tmp";
}

void remove_tree(const std::string &dir) {
    DIR *d = opendir(dir.c_str());
    if (!d)
        return;
    while (dirent *e = readdir(d))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlink((dir + "/" + e->d_name).c_str());
    closedir(d);
    rmdir(dir.c_str());
}

std::vector<std::string> list_dir(const std::string &dir) {
    std::vector<std::string> out;
    DIR *d = opendir(dir.c_str());
    if (!d)
        return out;
    while (dirent *e = readdir(d))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            out.push_back(e->d_name);
    closedir(d);
    return out;
}

struct Doc {
    pk_doc_t *doc = nullptr;
    explicit Doc(const std::string &path) {
        char err[256] = "";
        EXPECT_TRUE(pk_parse_file(path.c_str(), 1u << 30, nullptr, &doc, err, sizeof(err))) << err;
    }
    ~Doc() { pk_free(doc); }
    const pk_value_t *root() const { return pk_root(doc); }
};

int64_t geti(const pk_value_t *d, const char *k) {
    int64_t v = -1;
    EXPECT_TRUE(pk_get_int(d, k, &v)) << k;
    return v;
}

class History : public sp::Test {};

// Walk a pickle opcode by opcode and require only the opcodes PyTorch's MemoryViz.js unpickler
// handles (reference/pytorch-allocator.md 5.4), protocol 2-4 and LONG1 of at most 8 bytes.
void expect_memoryviz_opcodes(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::string b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto u8 = [&](size_t i) { return (unsigned char)b[i]; };
    auto u32 = [&](size_t i) {
        return (size_t)u8(i) | (size_t)u8(i + 1) << 8 | (size_t)u8(i + 2) << 16 |
               (size_t)u8(i + 3) << 24;
    };
    ASSERT_GE(b.size(), 3u);
    ASSERT_EQ(u8(0), 0x80);
    ASSERT_TRUE(u8(1) >= 2 && u8(1) <= 4) << "MemoryViz.js reads protocols 2-4";
    size_t i = 2;
    bool stopped = false;
    while (i < b.size() && !stopped) {
        unsigned op = u8(i++);
        switch (op) {
        case '}':
        case ']':
        case ')':
        case '(':
        case 'u':
        case 'e':
        case 'a':
        case 's':
        case 0x86:
        case 0x85:
        case 0x87:
        case 'N':
        case 0x88:
        case 0x89:
        case 0x94:
        case 't':
        case 'l':
        case 'd':
            break;
        case 'K':
        case 'h':
        case 'q':
            i += 1;
            break;
        case 'M':
            i += 2;
            break;
        case 'J':
        case 'j':
        case 'r':
            i += 4;
            break;
        case 'G':
        case 0x95:
            i += 8;
            break;
        case 0x8a: {
            size_t n = u8(i);
            ASSERT_LE(n, 8u) << "LONG1 wider than 8 bytes at " << i - 1;
            i += 1 + n;
            break;
        }
        case 0x8c:
            i += 1 + u8(i);
            break;
        case 'X':
            i += 4 + u32(i);
            break;
        case '.':
            stopped = true;
            break;
        default:
            FAIL() << "opcode 0x" << std::hex << op << " at " << std::dec << i - 1
                   << " is not one MemoryViz.js reads";
        }
    }
    EXPECT_TRUE(stopped);
    EXPECT_EQ(i, b.size());
}

// ---- ring buffer ---------------------------------------------------------------------------

TEST_F(History, RingBufferWrapsAndKeepsOrder) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 4));
    sp_mempool_id_t pool = {0, 0};
    for (uintptr_t a = 1; a <= 10; a++)
        sp__history_record(0, SP_TRACE_ALLOC, a, a * 10, 0, pool, 0);
    auto t = trace();
    ASSERT_EQ(t.size(), 4u);
    for (size_t i = 0; i < 4; i++) {
        EXPECT_EQ(t[i].addr, 7 + i) << "oldest first after wrap-around";
        EXPECT_EQ(t[i].size, (7 + i) * 10);
        if (i) {
            EXPECT_GE(t[i].time_us, t[i - 1].time_us);
        }
    }
    EXPECT_GT(t[0].time_us, 1600000000000000ll); // microseconds since the epoch
    // Shrinking keeps the newest entries, in order.
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 2));
    t = trace();
    ASSERT_EQ(t.size(), 2u);
    EXPECT_EQ(t[0].addr, 9u);
    EXPECT_EQ(t[1].addr, 10u);
    // Growing (unbounded) keeps them and appends.
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 0));
    for (uintptr_t a = 11; a <= 13; a++)
        sp__history_record(0, SP_TRACE_FREE_REQUESTED, a, 1, 0, pool, 0);
    t = trace();
    ASSERT_EQ(t.size(), 5u);
    EXPECT_EQ(t[0].addr, 9u);
    EXPECT_EQ(t[4].addr, 13u);
    EXPECT_EQ(t[4].action, SP_TRACE_FREE_REQUESTED);
    // "state" keeps a ring of exactly one entry, whatever max_entries says, as PyTorch does:
    // the newest so far, then each new one.
    ASSERT_SP_OK(record(SP_HISTORY_STATE, 1000));
    t = trace();
    ASSERT_EQ(t.size(), 1u);
    EXPECT_EQ(t[0].addr, 13u);
    sp__history_record(0, SP_TRACE_ALLOC, 14, 1, 0, pool, 0);
    t = trace();
    ASSERT_EQ(t.size(), 1u);
    EXPECT_EQ(t[0].addr, 14u);
    EXPECT_EQ(t[0].action, SP_TRACE_ALLOC);
    // Off clears and stops recording.
    ASSERT_SP_OK(record(SP_HISTORY_OFF));
    EXPECT_EQ(sp__history_active, 0);
    sp__history_record(0, SP_TRACE_ALLOC, 15, 1, 0, pool, 0);
    EXPECT_EQ(trace().size(), 0u);
}

TEST_F(History, UnboundedAndPerDevice) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 0));
    sp_mempool_id_t pool = {0, 0};
    for (uintptr_t a = 1; a <= 5000; a++)
        sp__history_record(0, SP_TRACE_ALLOC, a, 1, 0, pool, 0);
    sp__history_record(2, SP_TRACE_SEGMENT_ALLOC, 77, 2 * MiB, 0, pool, 0);
    auto t = trace();
    ASSERT_EQ(t.size(), 5000u);
    for (size_t i = 0; i < t.size(); i++)
        ASSERT_EQ(t[i].addr, i + 1);
    EXPECT_GE(sp__history_device_count(), 3);
    EXPECT_EQ(trace(1).size(), 0u);
    ASSERT_EQ(trace(2).size(), 1u);
    EXPECT_EQ(trace(2)[0].addr, 77u);
    EXPECT_STREQ(sp__history_action_name(SP_TRACE_OOM), "oom");
    EXPECT_STREQ(sp__history_action_name((sp_trace_action_t)99), "unknown");
}

TEST_F(History, BadParamsChangeNothing) {
    expect_warnings();
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 3));
    EXPECT_SP_STATUS(sp_record_memory_history(nullptr), SP_ERR_INVALID_ARGUMENT);
    sp_history_params_t p;
    sp_history_params_init(&p);
    EXPECT_EQ(p.enabled, SP_HISTORY_ALL);
    EXPECT_EQ(p.context, SP_CONTEXT_ALL);
    EXPECT_EQ(p.max_entries, 0u);
    EXPECT_FALSE(p.c_stacks);
    p.enabled = (sp_history_enabled_t)7;
    EXPECT_SP_STATUS(sp_record_memory_history(&p), SP_ERR_INVALID_ARGUMENT);
    p.enabled = SP_HISTORY_ALL;
    p.context = (sp_history_context_t)9;
    EXPECT_SP_STATUS(sp_record_memory_history(&p), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(sp__history_active, 0); // still recording with the old settings
    sp_mempool_id_t pool = {0, 0};
    for (uintptr_t a = 1; a <= 5; a++)
        sp__history_record(0, SP_TRACE_ALLOC, a, 1, 0, pool, 0);
    EXPECT_EQ(trace().size(), 3u);
}

// ---- actions from the allocator ------------------------------------------------------------

TEST_F(History, EachActionAtItsMomentWithPyTorchSizes) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &p));
    auto t = trace();
    ASSERT_EQ(t.size(), 2u);
    EXPECT_EQ(t[0].action, SP_TRACE_SEGMENT_ALLOC);
    EXPECT_EQ(t[0].size, 2 * MiB); // the small-pool segment
    EXPECT_LE(t[0].addr, (uintptr_t)p);
    EXPECT_EQ(t[1].action, SP_TRACE_ALLOC);
    EXPECT_EQ(t[1].addr, (uintptr_t)p);
    EXPECT_EQ(t[1].size, 1000u); // the request, not the rounded 1024
    uintptr_t seg = t[0].addr;

    void *big = nullptr;
    ASSERT_SP_OK(sp_malloc(5 * MiB + 3, 0, nullptr, &big));
    t = trace();
    ASSERT_EQ(t.size(), 4u);
    EXPECT_EQ(t[2].action, SP_TRACE_SEGMENT_ALLOC);
    EXPECT_EQ(t[2].size, 20 * MiB); // 1-10 MiB requests get a 20 MiB segment
    EXPECT_EQ(t[3].action, SP_TRACE_ALLOC);
    EXPECT_EQ(t[3].size, 5 * MiB + 3);

    ASSERT_SP_OK(sp_free(p));
    t = trace();
    ASSERT_EQ(t.size(), 6u);
    EXPECT_EQ(t[4].action, SP_TRACE_FREE_REQUESTED);
    EXPECT_EQ(t[4].addr, (uintptr_t)p);
    EXPECT_EQ(t[4].size, 1000u); // requested_size
    EXPECT_EQ(t[5].action, SP_TRACE_FREE_COMPLETED);
    EXPECT_EQ(t[5].size, 1000u);
    ASSERT_SP_OK(sp_free(big));
    ASSERT_SP_OK(sp_empty_cache());
    t = trace();
    ASSERT_EQ(t.size(), 10u);
    std::multiset<size_t> freed;
    for (size_t i = 8; i < 10; i++) {
        EXPECT_EQ(t[i].action, SP_TRACE_SEGMENT_FREE);
        freed.insert(t[i].size);
    }
    EXPECT_EQ(freed, (std::multiset<size_t>{2 * MiB, 20 * MiB}));
    bool seen_seg = false;
    for (size_t i = 8; i < 10; i++)
        seen_seg |= t[i].addr == seg;
    EXPECT_TRUE(seen_seg);
}

// sp_malloc and sp_free read the history switch before they take the device's lock (the stack is
// captured outside it). A call that read "off", then waited for the lock while history came on,
// ran unrecorded after the entries other calls made meanwhile: the trace no longer led to the
// snapshot's segments (a free_requested of an address whose last entry was its free_completed).
// As in PyTorch, which reads its switch under the allocator's mutex, such a call is recorded, in
// the lock's order (without a stack: it gathered none).
TEST_F(History, CallWaitingForTheLockWhenHistoryComesOnIsRecorded) {
    void *before = nullptr; // allocated while history is off: its free is the second case
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &before));
    void *p = nullptr;
    for (int kind = 0; kind < 2; kind++) {
        SCOPED_TRACE(kind == 0 ? "sp_malloc" : "sp_free");
        ASSERT_SP_OK(record(SP_HISTORY_OFF));
        sp_probe_device_lock(0);
        std::thread call([&] {
            if (kind == 0)
                EXPECT_SP_OK(sp_malloc(1000, 0, nullptr, &p));
            else
                EXPECT_SP_OK(sp_free(before));
        });
        while (sp_probe_device_lock_waiting(0) == 0) // it read "off" and waits for the lock
            std::this_thread::yield();
        EXPECT_SP_OK(record(SP_HISTORY_ALL)); // takes no device lock
        sp_probe_device_unlock(0);
        call.join();
        uintptr_t addr = kind == 0 ? (uintptr_t)p : (uintptr_t)before;
        sp_trace_action_t want = kind == 0 ? SP_TRACE_ALLOC : SP_TRACE_FREE_REQUESTED;
        size_t found = 0;
        for (const sp__trace_entry_t &e : trace())
            found += e.action == want && e.addr == addr;
        EXPECT_EQ(found, 1u) << "the call that waited is in the trace";
    }
    ASSERT_SP_OK(record(SP_HISTORY_OFF));
    ASSERT_SP_OK(sp_free(p));
}

TEST_F(History, OomRecordsDeviceFreeAndRoundedSize) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    void *big = nullptr, *p = nullptr;
    ASSERT_SP_OK(sp_malloc(40 * MiB, 0, nullptr, &big));
    EXPECT_SP_STATUS(sp_malloc(30 * MiB + 1, 0, nullptr, &p), SP_ERR_OUT_OF_MEMORY);
    auto t = trace();
    ASSERT_FALSE(t.empty());
    EXPECT_EQ(t.back().action, SP_TRACE_OOM);
    EXPECT_EQ(t.back().size, 30 * MiB + 512); // rounded to 512 bytes
    size_t dfree = 0, total = 0;
    ASSERT_SP_OK(sp_get_memory_info(0, &dfree, &total));
    EXPECT_EQ(t.back().addr, dfree); // device_free
    EXPECT_LE(t.back().addr, 24 * MiB);
    ASSERT_SP_OK(sp_free(big));
}

TEST_F(History, StreamAndPoolFields) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    sp_stream_t s = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    sp_mempool_params_t mp;
    sp_mempool_params_init(&mp);
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sp_mempool_create(&mp, &pool));
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, s, &a));
    ASSERT_SP_OK(sp_mempool_malloc(pool, 8192, nullptr, &b));
    auto t = trace();
    sp_mempool_id_t pid = sp_mempool_id(pool);
    ASSERT_GE(t.size(), 4u);
    bool saw_a = false, saw_b = false;
    for (auto &e : t) {
        if (e.action == SP_TRACE_ALLOC && e.addr == (uintptr_t)a) {
            saw_a = true;
            EXPECT_EQ(e.stream, (uintptr_t)s);
            EXPECT_EQ(e.pool.first, 0u);
            EXPECT_EQ(e.pool.second, 0u);
        }
        if (e.action == SP_TRACE_ALLOC && e.addr == (uintptr_t)b) {
            saw_b = true;
            EXPECT_EQ(e.stream, 0u);
            EXPECT_EQ(e.pool.first, pid.first);
            EXPECT_EQ(e.pool.second, pid.second);
        }
    }
    EXPECT_TRUE(saw_a);
    EXPECT_TRUE(saw_b);

    // A pool's snapshot holds only its segments and its events.
    std::string dir = tempdir();
    ASSERT_SP_OK(sp_mempool_dump_snapshot(pool, (dir + "/pool.pickle").c_str()));
    {
        Doc d(dir + "/pool.pickle");
        const pk_value_t *segs = pk_get(d.root(), "segments");
        ASSERT_EQ(pk_len(segs), 1u);
        const pk_value_t *spid = pk_get(pk_at(segs, 0), "segment_pool_id");
        int64_t second = -1;
        ASSERT_TRUE(pk_int(pk_at(spid, 1), &second));
        EXPECT_EQ((uint64_t)second, pid.second);
        const pk_value_t *tr = pk_at(pk_get(d.root(), "device_traces"), 0);
        for (size_t i = 0; i < pk_len(tr); i++) {
            int64_t addr =
                geti(pk_at(tr, i),
                     pk_get_str(pk_at(tr, i), "action")[0] == 'o' ? "device_free" : "addr");
            EXPECT_NE((uintptr_t)addr, (uintptr_t)a) << "default-pool event in a pool snapshot";
        }
        // The traces are copied before the marker is recorded (PyTorch's order): the last
        // entry is the pool's last action, b's alloc.
        EXPECT_STREQ(pk_get_str(pk_at(tr, pk_len(tr) - 1), "action"), "alloc");
        EXPECT_EQ((uintptr_t)geti(pk_at(tr, pk_len(tr) - 1), "addr"), (uintptr_t)b);
    }
    // The whole-process snapshot has both, and records the stream.
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/all.pickle").c_str()));
    {
        Doc d(dir + "/all.pickle");
        const pk_value_t *segs = pk_get(d.root(), "segments");
        EXPECT_EQ(pk_len(segs), 2u);
        bool stream_seen = false;
        for (size_t i = 0; i < pk_len(segs); i++)
            stream_seen |= (uintptr_t)geti(pk_at(segs, i), "stream") == (uintptr_t)s;
        EXPECT_TRUE(stream_seen);
    }
    remove_tree(dir);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_stream_synchronize(s));
    ASSERT_SP_OK(sp_stream_destroy(s));
}

// sp_x_stream_label: the snapshot shows the label in the stream's segments and trace entries
// (sympool replay: the recorded stream), the handle again once the label is 0, and forgets it
// when the stream is destroyed; the default stream and a stranger's handle take no label.
TEST_F(History, StreamLabelIsWhatSnapshotsShow) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    sp_stream_t s = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    const uint64_t label = 123288560; // a recorded CUDA stream's value
    ASSERT_SP_OK(sp_x_stream_label(s, label));
    void *a = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, s, &a));
    std::string dir = tempdir();
    auto streams = [&](const std::string &path, bool *handle_p) {
        Doc d(path);
        std::set<uint64_t> seen;
        const pk_value_t *segs = pk_get(d.root(), "segments");
        for (size_t i = 0; i < pk_len(segs); i++)
            seen.insert((uint64_t)geti(pk_at(segs, i), "stream"));
        const pk_value_t *tr = pk_at(pk_get(d.root(), "device_traces"), 0);
        for (size_t i = 0; i < pk_len(tr); i++)
            seen.insert((uint64_t)geti(pk_at(tr, i), "stream"));
        *handle_p = seen.count((uint64_t)(uintptr_t)s) != 0;
        return seen.count(label) != 0;
    };
    bool handle = true;
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/labelled.pickle").c_str()));
    EXPECT_TRUE(streams(dir + "/labelled.pickle", &handle)) << "the label is shown";
    EXPECT_FALSE(handle) << "the handle is not";
    ASSERT_SP_OK(sp_x_stream_label(s, 0));
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/plain.pickle").c_str()));
    EXPECT_FALSE(streams(dir + "/plain.pickle", &handle));
    EXPECT_TRUE(handle) << "label 0 shows the handle again";

    expect_warnings();
    EXPECT_EQ(sp_x_stream_label(nullptr, label), SP_ERR_INVALID_ARGUMENT);
    if (!sp::on_gpu()) { // on the cuda backend a handle that is no stream is undefined behaviour
        int not_a_stream = 0;
        EXPECT_EQ(sp_x_stream_label(&not_a_stream, label), SP_ERR_INVALID_ARGUMENT);
    }
    ASSERT_SP_OK(sp_x_stream_label(s, label));
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_stream_synchronize(s));
    ASSERT_SP_OK(sp_empty_cache()); // the stream's segment goes; its events stay in the trace
    ASSERT_SP_OK(sp_stream_destroy(s));
    sp_stream_t t = nullptr;
    ASSERT_SP_OK(sp_stream_create(0, &t)); // may get the destroyed stream's handle
    void *b = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, t, &b));
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/after.pickle").c_str()));
    {
        Doc d(dir + "/after.pickle");
        const pk_value_t *segs = pk_get(d.root(), "segments");
        for (size_t i = 0; i < pk_len(segs); i++)
            EXPECT_NE((uint64_t)geti(pk_at(segs, i), "stream"), label)
                << "a destroyed stream's label stays with it";
    }
    remove_tree(dir);
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_stream_synchronize(t));
    ASSERT_SP_OK(sp_stream_destroy(t));
}

// ---- contexts ------------------------------------------------------------------------------

size_t test_frames(sp_history_frame_t *f, size_t max, void *arg) {
    int *calls = static_cast<int *>(arg);
    (*calls)++;
    if (max < 2)
        return 0;
    f[0] = {"train_step", "train.py", 42};
    f[1] = {"main", "train.py", 7};
    return 2;
}

TEST_F(History, FramesFromHookAreInternedAndAttached) {
    int calls = 0;
    sp_history_set_frames_hook(test_frames, &calls);
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 0, SP_CONTEXT_ALL));
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &b));
    ASSERT_SP_OK(sp_free(a));
    auto t = trace();
    std::vector<uint32_t> allocs;
    uint32_t freectx = 0;
    for (auto &e : t) {
        if (e.action == SP_TRACE_ALLOC)
            allocs.push_back(e.context);
        if (e.action == SP_TRACE_FREE_REQUESTED)
            freectx = e.context;
    }
    ASSERT_EQ(allocs.size(), 2u);
    EXPECT_NE(allocs[0], 0u);
    EXPECT_EQ(allocs[0], allocs[1]) << "identical stacks intern to one context";
    EXPECT_NE(freectx, 0u) << "context=ALL records frees' stacks";
    const sp__history_frame_t *f = nullptr;
    size_t n = 0;
    sp__history_context_frames(allocs[0], &f, &n);
    ASSERT_EQ(n, 2u);
    EXPECT_STREQ(f[0].name, "train_step");
    EXPECT_STREQ(f[0].filename, "train.py");
    EXPECT_EQ(f[0].line, 42);
    EXPECT_GE(calls, 3);

    // The snapshot shows the frames on the live block and on the trace entries.
    std::string dir = tempdir();
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/s.pickle").c_str()));
    {
        Doc d(dir + "/s.pickle");
        const pk_value_t *seg = pk_at(pk_get(d.root(), "segments"), 0);
        bool found = false;
        const pk_value_t *blocks = pk_get(seg, "blocks");
        for (size_t i = 0; i < pk_len(blocks); i++) {
            const pk_value_t *blk = pk_at(blocks, i);
            if ((uintptr_t)geti(blk, "address") == (uintptr_t)b) {
                found = true;
                EXPECT_STREQ(pk_get_str(blk, "state"), "active_allocated");
                const pk_value_t *fr = pk_get(blk, "frames");
                ASSERT_EQ(pk_len(fr), 2u);
                EXPECT_STREQ(pk_get_str(pk_at(fr, 0), "name"), "train_step");
                EXPECT_EQ(geti(pk_at(fr, 0), "line"), 42);
            }
        }
        EXPECT_TRUE(found);
        const pk_value_t *tr = pk_at(pk_get(d.root(), "device_traces"), 0);
        EXPECT_EQ(pk_len(pk_get(pk_at(tr, 1), "frames")), 2u); // the first alloc
    }
    expect_memoryviz_opcodes(dir + "/s.pickle");
    remove_tree(dir);
    ASSERT_SP_OK(sp_free(b));
    sp_history_set_frames_hook(nullptr, nullptr);
}

// A hook's stack as deep as real PyTorch stacks go (212 frames in the traces here) is kept whole:
// up to 64 frames were, and a replay's snapshot showed shorter stacks than the trace it replayed.
size_t deep_frames(sp_history_frame_t *f, size_t max, void *arg) {
    size_t want = *static_cast<size_t *>(arg), n = want < max ? want : max;
    for (size_t i = 0; i < n; i++)
        f[i] = {"layer", "model.py", (int)i + 1};
    return n;
}

TEST_F(History, DeepHookStacksAreKeptWhole) {
    for (size_t depth : {63, 64, 65, 212, 256}) {
        SCOPED_TRACE(depth);
        sp_history_set_frames_hook(deep_frames, &depth);
        ASSERT_SP_OK(record(SP_HISTORY_ALL, 0, SP_CONTEXT_ALL));
        void *a = nullptr;
        ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &a));
        ASSERT_SP_OK(sp_free(a));
        uint32_t ctx = 0;
        for (auto &e : trace())
            if (e.action == SP_TRACE_ALLOC)
                ctx = e.context;
        const sp__history_frame_t *f = nullptr;
        size_t n = 0;
        sp__history_context_frames(ctx, &f, &n);
        ASSERT_EQ(n, depth);
        EXPECT_EQ(f[depth - 1].line, (int)depth);
        sp_history_set_frames_hook(nullptr, nullptr);
        ASSERT_SP_OK(record(SP_HISTORY_OFF, 0, SP_CONTEXT_ALL));
    }
}

// Stacks of names of every length from 1 to 24 bytes, each changed in one byte at every position
// in turn, and in the line alone: the hash reads the short strings in overlapping pieces, so a
// byte it skipped would make two stacks one context (the compare would catch a collision, but
// only if it looked at every byte too). Each stack, given twice, must intern to one context and
// to none of the others'.
struct OneByteFrames {
    std::string name;
    int line;
};

size_t one_byte_frames(sp_history_frame_t *f, size_t max, void *arg) {
    const OneByteFrames *w = static_cast<const OneByteFrames *>(arg);
    if (max < 2)
        return 0;
    f[0] = {w->name.c_str(), "model.py", w->line};
    f[1] = {"main", "train.py", 7};
    return 2;
}

TEST_F(History, StacksDifferingInOneByteAreDistinctContexts) {
    OneByteFrames w{"", 1};
    sp_history_set_frames_hook(one_byte_frames, &w);
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 0, SP_CONTEXT_ALLOC));
    std::vector<std::pair<std::string, int>> stacks;
    for (size_t len = 1; len <= 24; len++) {
        std::string base(len, 'a');
        stacks.push_back({base, 1});
        stacks.push_back({base, 2});
        for (size_t at = 0; at < len; at++) {
            std::string changed = base;
            changed[at] = 'b';
            stacks.push_back({changed, 1});
        }
    }
    std::map<uint32_t, size_t> owner; // context -> index of the stack that made it
    std::vector<void *> live;         // every block stays live: its context keeps its id
    for (size_t i = 0; i < stacks.size(); i++) {
        w.name = stacks[i].first;
        w.line = stacks[i].second;
        void *p = nullptr, *q = nullptr;
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &q));
        live.push_back(p);
        live.push_back(q);
        uint32_t cp = 0, cq = 0;
        for (auto &e : trace()) {
            if (e.action == SP_TRACE_ALLOC && e.addr == (uintptr_t)p)
                cp = e.context;
            if (e.action == SP_TRACE_ALLOC && e.addr == (uintptr_t)q)
                cq = e.context;
        }
        ASSERT_NE(cp, 0u);
        EXPECT_EQ(cp, cq) << "'" << w.name << "' line " << w.line << " given twice";
        auto seen = owner.find(cp);
        if (seen != owner.end() && seen->second != i)
            ADD_FAILURE() << "'" << w.name << "' line " << w.line << " got the context of '"
                          << stacks[seen->second].first << "' line " << stacks[seen->second].second;
        owner[cp] = i;
    }
    EXPECT_EQ(owner.size(), stacks.size());
    for (void *p : live)
        ASSERT_SP_OK(sp_free(p));
    sp_history_set_frames_hook(nullptr, nullptr);
}

// Stacks that differ in one character that JSON escapes, the same length once escaped, an
// empty stack, control characters and UTF-8 (written raw).
size_t escaped_frames(sp_history_frame_t *f, size_t max, void *arg) {
    static const char *const names[] = {"a\"b", "a\\b", "tab\there", "caf\xc3\xa9 \xe2\x82\xac",
                                        "bell\x01\x1f"};
    unsigned site = (*static_cast<unsigned *>(arg))++ % 6;
    if (site == 5 || max < 3)
        return 0;
    f[0] = {names[site], "m\"od\\el.py", site < 2 ? 1 : (int)site};
    f[1] = {"forward", site > 2 && site % 2 ? "x.py" : "y.py", 10};
    f[2] = {"main", "train.py", 7};
    return 3;
}

std::string json_quoted(const char *s) {
    std::string o = "\"";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            o += '\\';
            o += (char)*p;
        } else if (*p < 0x20) {
            char b[8];
            snprintf(b, sizeof(b), "\\u%04x", *p);
            o += b;
        } else {
            o += (char)*p;
        }
    }
    return o + "\"";
}

// The JSON text of one value starting at s[i] (a list: up to its matching bracket).
std::string json_value_at(const std::string &s, size_t i) {
    size_t j = i;
    int depth = 0;
    bool in_str = false;
    for (; j < s.size(); j++) {
        char c = s[j];
        if (in_str) {
            if (c == '\\')
                j++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            depth++;
        } else if ((c == ']' || c == '}') && --depth == 0) {
            break;
        }
    }
    return s.substr(i, j + 1 - i);
}

// A JSON snapshot writes each distinct stack once and copies its bytes for every later entry,
// while the document goes to its file in pieces: every trace entry's frames must still be its
// own stack, escaped as written in full, after the ring wrapped (contexts interned before the
// wrap used again) and across many flushes.
TEST_F(History, JsonStacksAreEachEntrysOwnAcrossFlushesAndWraps) {
    unsigned site = 0;
    sp_history_set_frames_hook(escaped_frames, &site);
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 4000, SP_CONTEXT_ALL));
    void *live[7] = {};
    for (int i = 0; i < 6000; i++) { // 3 entries per pair: the ring of 4000 wraps 3 times
        if (live[i % 7] != nullptr)
            ASSERT_SP_OK(sp_free(live[i % 7]));
        ASSERT_SP_OK(sp_malloc(512 + (size_t)i % 5 * 4096, 0, nullptr, &live[i % 7]));
    }
    auto t = trace();
    ASSERT_EQ(t.size(), 4000u);
    std::string dir = tempdir();
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/s.json").c_str()));
    std::ifstream f(dir + "/s.json");
    std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_GT(doc.size(), (size_t)1 << 20) << "the document should span several flushes";
    size_t at = doc.find("\"device_traces\":");
    ASSERT_NE(at, std::string::npos);
    const std::string key = "\"frames\":";
    std::set<std::string> distinct;
    for (size_t k = 0; k < t.size(); k++) {
        at = doc.find(key, at);
        ASSERT_NE(at, std::string::npos) << "entry " << k;
        at += key.size();
        const sp__history_frame_t *fr = nullptr;
        size_t n = 0;
        sp__history_context_frames(t[k].context, &fr, &n);
        std::string want = "[";
        for (size_t j = 0; j < n; j++)
            want += std::string(j ? "," : "") + "{\"filename\":" + json_quoted(fr[j].filename) +
                    ",\"line\":" + std::to_string(fr[j].line) +
                    ",\"name\":" + json_quoted(fr[j].name) + "}";
        want += "]";
        ASSERT_EQ(json_value_at(doc, at), want) << "entry " << k;
        distinct.insert(want);
    }
    EXPECT_GE(distinct.size(), 5u) << "the five stacks";
    EXPECT_NE(doc.find("caf\xc3\xa9 \xe2\x82\xac"), std::string::npos) << "UTF-8 written raw";
    remove_tree(dir);
    for (void *p : live)
        ASSERT_SP_OK(sp_free(p));
    sp_history_set_frames_hook(nullptr, nullptr);
}

TEST_F(History, ContextLevels) {
    int calls = 0;
    sp_history_set_frames_hook(test_frames, &calls);
    // NONE: no stacks anywhere, the hook is not even called.
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 0, SP_CONTEXT_NONE));
    void *a = nullptr;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &a));
    ASSERT_SP_OK(sp_free(a));
    for (auto &e : trace())
        EXPECT_EQ(e.context, 0u);
    EXPECT_EQ(calls, 0);
    // STATE: stacks on live blocks only, not on trace entries.
    ASSERT_SP_OK(record(SP_HISTORY_OFF));
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 0, SP_CONTEXT_STATE));
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &a));
    for (auto &e : trace())
        EXPECT_EQ(e.context, 0u);
    EXPECT_EQ(calls, 1);
    // ALLOC: allocations carry stacks; frees do not capture their own.
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 0, SP_CONTEXT_ALLOC));
    ASSERT_SP_OK(sp_free(a));
    EXPECT_EQ(calls, 1);
    void *b = nullptr;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &b));
    EXPECT_EQ(calls, 2);
    EXPECT_NE(trace().back().context, 0u);
    ASSERT_SP_OK(sp_free(b));
    sp_history_set_frames_hook(nullptr, nullptr);
}

TEST_F(History, CStacksAreSymbolized) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 0, SP_CONTEXT_ALLOC, true));
    void *a = nullptr;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &a));
    auto t = trace();
    ASSERT_EQ(t.back().action, SP_TRACE_ALLOC);
    const sp__history_frame_t *f = nullptr;
    size_t n = 0;
    sp__history_context_frames(t.back().context, &f, &n);
    ASSERT_GT(n, 2u);
    bool has_object = false, has_test = false;
    for (size_t i = 0; i < n; i++) {
        ASSERT_NE(f[i].name, nullptr);
        ASSERT_NE(f[i].filename, nullptr);
        has_object |= strstr(f[i].filename, "test_history") != nullptr;
        has_test |= strstr(f[i].name, "testing") != nullptr; // GoogleTest's exported callers
        EXPECT_EQ(strstr(f[i].name, "sp_malloc"), nullptr) << "frame " << i;
    }
    EXPECT_TRUE(has_object) << "frames name the object file they are in";
    EXPECT_TRUE(has_test) << "the callers' functions are named";
    // sympool's own frames (sp_malloc and the helpers under it) are dropped: the stack starts in
    // the caller (this test's body, a local symbol, so shown as an offset).
    EXPECT_NE(strncmp(f[0].name, "sp_", 3), 0) << f[0].name;
    ASSERT_SP_OK(sp_free(a));
}

// ---- snapshots -----------------------------------------------------------------------------

// Walk the trace backwards from the snapshot's blocks, as MemoryViz.js does: every alloc must
// undo a live block and every free_requested a dead one; segment events must match segments.
void expect_replays_backwards(const pk_value_t *root) {
    std::set<int64_t> live, segs;
    const pk_value_t *segments = pk_get(root, "segments");
    for (size_t i = 0; i < pk_len(segments); i++) {
        const pk_value_t *s = pk_at(segments, i);
        segs.insert(geti(s, "address"));
        const pk_value_t *blocks = pk_get(s, "blocks");
        int64_t sum = 0, alloc = 0;
        for (size_t k = 0; k < pk_len(blocks); k++) {
            const pk_value_t *b = pk_at(blocks, k);
            EXPECT_EQ(geti(b, "address"), geti(s, "address") + sum);
            sum += geti(b, "size");
            if (std::string(pk_get_str(b, "state")) == "active_allocated") {
                live.insert(geti(b, "address"));
                alloc += geti(b, "size");
            }
        }
        EXPECT_EQ(sum, geti(s, "total_size"));
        EXPECT_EQ(alloc, geti(s, "allocated_size"));
    }
    const pk_value_t *tr = pk_at(pk_get(root, "device_traces"), 0);
    for (size_t i = pk_len(tr); i-- > 0;) {
        const pk_value_t *e = pk_at(tr, i);
        std::string act = pk_get_str(e, "action");
        if (act == "snapshot" || act == "oom" || act == "free_completed")
            continue;
        int64_t addr = geti(e, "addr");
        if (act == "alloc") {
            EXPECT_EQ(live.erase(addr), 1u) << "alloc at entry " << i << " has no live block";
        } else if (act == "free_requested") {
            EXPECT_TRUE(live.insert(addr).second) << "free at entry " << i << " of a live block";
        } else if (act == "segment_alloc") {
            EXPECT_EQ(segs.erase(addr), 1u) << "segment_alloc at entry " << i << " without segment";
        } else if (act == "segment_free") {
            EXPECT_TRUE(segs.insert(addr).second);
        }
    }
    EXPECT_TRUE(live.empty()) << "blocks live before recording began";
    EXPECT_TRUE(segs.empty()) << "segments before recording began";
}

// With a bounded ring the trace starts mid-run: undo what is recorded and require only that each
// undo finds the state it expects (as MemoryViz.js's Allocator State History does).
void expect_replays_backwards_window(const pk_value_t *root) {
    std::set<int64_t> live, segs;
    const pk_value_t *segments = pk_get(root, "segments");
    for (size_t i = 0; i < pk_len(segments); i++) {
        const pk_value_t *s = pk_at(segments, i);
        segs.insert(geti(s, "address"));
        const pk_value_t *blocks = pk_get(s, "blocks");
        int64_t sum = 0;
        for (size_t k = 0; k < pk_len(blocks); k++) {
            const pk_value_t *b = pk_at(blocks, k);
            if (std::string(pk_get_str(b, "state")) != "inactive")
                live.insert(geti(b, "address"));
            sum += geti(b, "size");
        }
        EXPECT_EQ(sum, geti(s, "total_size"));
    }
    const pk_value_t *tr = pk_at(pk_get(root, "device_traces"), 0);
    for (size_t i = pk_len(tr); i-- > 0;) {
        const pk_value_t *e = pk_at(tr, i);
        std::string act = pk_get_str(e, "action");
        if (act == "alloc") {
            ASSERT_EQ(live.erase(geti(e, "addr")), 1u) << "entry " << i;
        } else if (act == "free_completed") {
            ASSERT_TRUE(live.insert(geti(e, "addr")).second) << "entry " << i;
        } else if (act == "segment_alloc") {
            ASSERT_EQ(segs.erase(geti(e, "addr")), 1u) << "entry " << i;
        } else if (act == "segment_free") {
            ASSERT_TRUE(segs.insert(geti(e, "addr")).second) << "entry " << i;
        }
    }
}

TEST_F(History, SnapshotIsConsistentAndReadable) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    std::vector<void *> ptrs;
    for (size_t sz : {1000ul, 3000ul, 600000ul, 3 * MiB, 25 * MiB, 700ul}) {
        void *p = nullptr;
        ASSERT_SP_OK(sp_malloc(sz, 0, nullptr, &p));
        ptrs.push_back(p);
    }
    ASSERT_SP_OK(sp_free(ptrs[1])); // an inactive block inside a split segment
    ASSERT_SP_OK(sp_free(ptrs[4]));
    std::string dir = tempdir();
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/first.pickle").c_str()));
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/snap.pickle").c_str()));
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/snap.json").c_str()));
    {
        // PyTorch copies the traces before snapshot() records its marker: a dump ends with the
        // last action before it (ptrs[4]'s free), and its marker shows in the next dump.
        Doc d(dir + "/first.pickle");
        const pk_value_t *tr = pk_at(pk_get(d.root(), "device_traces"), 0);
        const pk_value_t *last = pk_at(tr, pk_len(tr) - 1);
        EXPECT_STREQ(pk_get_str(last, "action"), "free_completed");
        EXPECT_EQ((uintptr_t)geti(last, "addr"), (uintptr_t)ptrs[4]);
    }
    {
        Doc d(dir + "/snap.pickle");
        const pk_value_t *root = d.root();
        ASSERT_NE(root, nullptr);
        EXPECT_EQ(pk_len(root), 4u);
        const pk_value_t *traces = pk_get(root, "device_traces");
        EXPECT_GE(pk_len(traces), (size_t)sp_device_count());
        const pk_value_t *tr = pk_at(traces, 0);
        const pk_value_t *last = pk_at(tr, pk_len(tr) - 1);
        EXPECT_STREQ(pk_get_str(last, "action"), "snapshot");
        int64_t active = 0;
        const pk_value_t *segs = pk_get(root, "segments");
        for (size_t i = 0; i < pk_len(segs); i++) {
            active += geti(pk_at(segs, i), "active_size");
            const char *st = pk_get_str(pk_at(segs, i), "segment_type");
            ASSERT_NE(st, nullptr);
            EXPECT_TRUE(!strcmp(st, "small") || !strcmp(st, "large"));
        }
        EXPECT_EQ(geti(last, "size"), active);
        const pk_value_t *settings = pk_get(root, "allocator_settings");
        EXPECT_EQ(geti(settings, "max_split_size"), -1);
        EXPECT_EQ(pk_len(pk_get(settings, "roundup_power2_divisions")), 16u);
        EXPECT_NE(pk_get(root, "external_annotations"), nullptr);
        expect_replays_backwards(root);
    }
    expect_memoryviz_opcodes(dir + "/snap.pickle");
    {
        std::ifstream f(dir + "/snap.json");
        std::stringstream ss;
        ss << f.rdbuf();
        EXPECT_EQ(ss.str().rfind("{\"segments\":[{\"device\":0,", 0), 0u);
    }
    if (system("python3 -c 'import json' >/dev/null 2>&1") == 0) {
        std::string cmd =
            "python3 -c \"import pickle,json,sys; s=pickle.load(open(sys.argv[1],'rb')); "
            "j=json.load(open(sys.argv[2])); assert len(s['segments'])==len(j['segments']); "
            "assert s['segments'][0]['segment_pool_id']==(0,0)\" " +
            dir + "/snap.pickle " + dir + "/snap.json";
        EXPECT_EQ(system(cmd.c_str()), 0) << cmd;
    }
    // Atomic: the directory holds exactly the three files, no temporaries.
    auto files = list_dir(dir);
    EXPECT_EQ(files.size(), 3u);
    remove_tree(dir);
    for (size_t i : {0, 2, 3, 5})
        ASSERT_SP_OK(sp_free(ptrs[i]));
}

// An inactive block's requested_size in a snapshot is PyTorch's: what its Block object keeps
// (c10/cuda/CUDACachingAllocator.cpp: free_block merges into the freed object, alloc_found_block
// makes the found object the split's remainder and a new object the allocation, a new segment's
// object starts at 0), not 0. Sizes in one 2 MiB small segment, in address order.
namespace {
struct SnapBlock {
    int64_t size, requested;
    std::string state;
};
// The first segment's blocks and its requested_size, from a dumped snapshot.
std::vector<SnapBlock> snapshot_blocks(const std::string &path, int64_t *seg_requested) {
    Doc d(path);
    const pk_value_t *seg = pk_at(pk_get(d.root(), "segments"), 0);
    *seg_requested = geti(seg, "requested_size");
    std::vector<SnapBlock> out;
    const pk_value_t *blocks = pk_get(seg, "blocks");
    for (size_t i = 0; i < pk_len(blocks); i++) {
        const pk_value_t *b = pk_at(blocks, i);
        out.push_back({geti(b, "size"), geti(b, "requested_size"), pk_get_str(b, "state")});
    }
    return out;
}
} // namespace

TEST_F(History, SnapshotRequestedSizeOfInactiveBlocksIsPyTorchs) {
    void *a, *b, *c, *d, *e;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &a)); // [0, 1024): a new segment, remainder 0
    ASSERT_SP_OK(sp_malloc(3000, 0, nullptr, &b)); // [1024, 4096)
    ASSERT_SP_OK(sp_malloc(5000, 0, nullptr, &c)); // [4096, 9216)
    ASSERT_SP_OK(sp_malloc(700, 0, nullptr, &d));  // [9216, 9728)
    std::string dir = tempdir();
    int64_t segreq = 0;
    ASSERT_SP_OK(sp_free(b)); // freed alone: keeps its own request
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/1.pickle").c_str()));
    auto v = snapshot_blocks(dir + "/1.pickle", &segreq);
    ASSERT_EQ(v.size(), 5u);
    EXPECT_EQ(v[1].state, "inactive");
    EXPECT_EQ(v[1].requested, 3000) << "a freed block keeps its last request";
    EXPECT_EQ(v[4].requested, 0) << "a new segment's remainder";
    EXPECT_EQ(segreq, 1000 + 5000 + 700) << "a segment sums its active blocks only";
    ASSERT_SP_OK(sp_free(c)); // merges into the free block below it: c's request
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/2.pickle").c_str()));
    v = snapshot_blocks(dir + "/2.pickle", &segreq);
    ASSERT_EQ(v.size(), 4u);
    EXPECT_EQ(v[1].size, 3072 + 5120);
    EXPECT_EQ(v[1].requested, 5000) << "a merge keeps the freed block's request (lower kept)";
    ASSERT_SP_OK(sp_free(a)); // merges into the free block above it: a's request
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/3.pickle").c_str()));
    v = snapshot_blocks(dir + "/3.pickle", &segreq);
    ASSERT_EQ(v.size(), 3u);
    EXPECT_EQ(v[0].size, 9216);
    EXPECT_EQ(v[0].requested, 1000) << "a merge keeps the freed block's request (higher kept)";
    ASSERT_SP_OK(sp_malloc(2000, 0, nullptr, &e)); // best fit: the 9216 block, split
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/4.pickle").c_str()));
    v = snapshot_blocks(dir + "/4.pickle", &segreq);
    ASSERT_EQ(v.size(), 4u);
    EXPECT_EQ(v[0].requested, 2000);
    EXPECT_EQ(v[1].size, 9216 - 2048);
    EXPECT_EQ(v[1].state, "inactive");
    EXPECT_EQ(v[1].requested, 1000) << "a split's remainder keeps the found block's request";
    EXPECT_EQ(v[3].requested, 0);
    ASSERT_SP_OK(sp_free(d)); // merges with free blocks on both sides
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/5.pickle").c_str()));
    v = snapshot_blocks(dir + "/5.pickle", &segreq);
    ASSERT_EQ(v.size(), 2u);
    EXPECT_EQ(v[1].requested, 700) << "a merge on both sides keeps the freed block's request";
    EXPECT_EQ(segreq, 2000);
    ASSERT_SP_OK(sp_free(e)); // the whole segment free again: e's request
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/6.pickle").c_str()));
    v = snapshot_blocks(dir + "/6.pickle", &segreq);
    ASSERT_EQ(v.size(), 1u);
    EXPECT_EQ(v[0].requested, 2000);
    EXPECT_EQ(segreq, 0);
    remove_tree(dir);
}

// sp_x_free_block_set_requested (the replay's starting state): a free cached block shows the
// value given; an allocated block's start, an address inside a free block and one outside every
// segment are refused and change nothing.
TEST_F(History, FreeBlockSetRequestedSetsOnlyAFreeBlocksStart) {
    void *a, *b;
    ASSERT_SP_OK(sp_malloc(1000, 0, nullptr, &a)); // [0, 1024)
    ASSERT_SP_OK(sp_malloc(3000, 0, nullptr, &b)); // [1024, 4096), the rest free after it
    char *rest = (char *)b + 3072;
    EXPECT_EQ(sp_x_free_block_set_requested(a, 5), SP_ERR_INVALID_USAGE);
    EXPECT_EQ(sp_x_free_block_set_requested(rest + 512, 5), SP_ERR_INVALID_USAGE);
    EXPECT_EQ(sp_x_free_block_set_requested(nullptr, 5), SP_ERR_INVALID_USAGE);
    int x;
    EXPECT_EQ(sp_x_free_block_set_requested(&x, 5), SP_ERR_INVALID_USAGE);
    ASSERT_SP_OK(sp_x_free_block_set_requested(rest, 4 << 20)); // more than its size: allowed
    std::string dir = tempdir();
    int64_t segreq = 0;
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/s.pickle").c_str()));
    auto v = snapshot_blocks(dir + "/s.pickle", &segreq);
    ASSERT_EQ(v.size(), 3u);
    EXPECT_EQ(v[0].requested, 1000) << "a refused call changed nothing";
    EXPECT_EQ(v[2].requested, 4 << 20);
    EXPECT_EQ(segreq, 4000);
    remove_tree(dir);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
}

// With no segment at all the walk visits nothing; the traces were then copied after it, once its
// locks were released, so an allocation made just then (another thread's) was in the trace and
// its segment and block were not: the trace did not replay backwards to the snapshot's state
// (History.ConcurrentDumpsStayConsistent failed so, rarely, under load). The traces are copied at
// the walk's start now, under its locks.
std::atomic<void *> g_after_walk{nullptr};

TEST_F(History, AnAllocationRightAfterAWalkOfNoSegmentIsNotInTheTrace) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    ASSERT_SP_OK(sp_empty_cache());
    sp__snapshot_test_after_walk([] {
        void *p = nullptr;
        if (sp_malloc(4096, 0, nullptr, &p) == SP_SUCCESS)
            g_after_walk = p;
    });
    std::string dir = tempdir();
    std::string path = dir + "/empty.pickle";
    EXPECT_SP_OK(sp_dump_snapshot(path.c_str()));
    sp__snapshot_test_after_walk(nullptr);
    ASSERT_NE(g_after_walk.load(), nullptr) << "the hook did not run";
    {
        Doc d(path);
        ASSERT_NE(d.root(), nullptr);
        EXPECT_EQ(pk_len(pk_get(d.root(), "segments")), 0u);
        expect_replays_backwards(d.root());
    }
    ASSERT_SP_OK(sp_free(g_after_walk.exchange(nullptr)));
    remove_tree(dir);
}

// The `snapshot` marker was recorded once the walk's locks were released: an allocation made in
// between (another thread's, here the hook's) came before the marker in the ring, though the
// snapshot does not show it, so a later dump's state history put it before this snapshot. The
// marker is recorded at the walk's end now, under its locks, as PyTorch records it under the
// allocator's mutex: everything recorded after the snapshot's state comes after its marker.
TEST_F(History, TheSnapshotMarkerPrecedesAnAllocationRightAfterTheWalk) {
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    void *held = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &held)); // a segment for the walk to visit
    sp__snapshot_test_after_walk([] {
        void *p = nullptr;
        if (sp_malloc(8192, 0, nullptr, &p) == SP_SUCCESS)
            g_after_walk = p;
    });
    std::string dir = tempdir();
    EXPECT_SP_OK(sp_dump_snapshot((dir + "/s.pickle").c_str()));
    sp__snapshot_test_after_walk(nullptr);
    ASSERT_NE(g_after_walk.load(), nullptr) << "the hook did not run";
    auto t = trace();
    ptrdiff_t marker = -1, alloc = -1;
    for (size_t i = 0; i < t.size(); i++) {
        if (t[i].action == SP_TRACE_SNAPSHOT)
            marker = (ptrdiff_t)i;
        if (t[i].action == SP_TRACE_ALLOC && t[i].addr == (uintptr_t)g_after_walk.load())
            alloc = (ptrdiff_t)i;
    }
    ASSERT_GE(marker, 0) << "no snapshot marker";
    ASSERT_GE(alloc, 0) << "no entry of the hook's allocation";
    EXPECT_LT(marker, alloc) << "an allocation after the snapshot's state precedes its marker";
    EXPECT_EQ(t[(size_t)marker].size, 4096u) << "the marker's size: the walked active bytes";
    ASSERT_SP_OK(sp_free(g_after_walk.exchange(nullptr)));
    ASSERT_SP_OK(sp_free(held));
    remove_tree(dir);
}

// Allocating threads, a frames hook and repeated dumps at once: every snapshot still replays
// backwards to its own segments (the walk and the trace copy see one state).
TEST_F(History, ConcurrentDumpsStayConsistent) {
    int calls = 0;
    sp_history_set_frames_hook(
        [](sp_history_frame_t *f, size_t max, void *) -> size_t {
            if (max < 1)
                return 0;
            f[0] = {"worker", "worker.py", 1};
            return 1;
        },
        &calls);
    ASSERT_SP_OK(record(SP_HISTORY_ALL, 20000, SP_CONTEXT_ALL));
    std::atomic<bool> stop{false};
    std::vector<std::thread> workers;
    for (int w = 0; w < 3; w++) {
        workers.emplace_back([w, &stop] {
            std::vector<void *> live;
            uint64_t x = 0x9e3779b97f4a7c15ull * (w + 1);
            while (!stop.load()) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if (live.size() < 32 && (x & 1)) {
                    void *p = nullptr;
                    size_t sz = 512 + (size_t)(x % (3 * MiB));
                    if (sp_malloc(sz, 0, nullptr, &p) == SP_SUCCESS)
                        live.push_back(p);
                } else if (!live.empty()) {
                    size_t i = (size_t)(x >> 8) % live.size();
                    sp_free(live[i]);
                    live.erase(live.begin() + (long)i);
                }
                if ((x & 0xff) == 0)
                    sp_empty_cache();
            }
            for (void *p : live)
                sp_free(p);
        });
    }
    std::string dir = tempdir();
    std::vector<std::string> paths;
    for (int i = 0; i < 8; i++) {
        paths.push_back(dir + "/c" + std::to_string(i) + ".pickle");
        EXPECT_SP_OK(sp_dump_snapshot(paths.back().c_str()));
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    stop = true;
    for (auto &t : workers)
        t.join();
    for (const std::string &path : paths) {
        Doc d(path);
        if (d.root() == nullptr)
            break;
        expect_replays_backwards_window(d.root());
    }
    expect_memoryviz_opcodes(paths.back());
    remove_tree(dir);
    sp_history_set_frames_hook(nullptr, nullptr);
}

TEST_F(History, SnapshotWriteFailuresLeaveNothing) {
    expect_warnings();
    std::string dir = tempdir();
    EXPECT_SP_STATUS(sp_dump_snapshot((dir + "/no/such/dir/x.pickle").c_str()), SP_ERR_SYSTEM);
    EXPECT_NE(std::string(sp_last_error()).find("x.pickle"), std::string::npos);
    EXPECT_SP_STATUS(sp_dump_snapshot(""), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_dump_snapshot(nullptr), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_mempool_dump_snapshot(nullptr, (dir + "/y.pickle").c_str()),
                     SP_ERR_INVALID_ARGUMENT);
    // An existing file is replaced whole.
    {
        std::ofstream f(dir + "/old.pickle");
        f << "old contents";
    }
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/old.pickle").c_str()));
    Doc d(dir + "/old.pickle");
    EXPECT_NE(d.root(), nullptr);
    EXPECT_EQ(list_dir(dir).size(), 1u);
    // %p expands to the pid.
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/pid%p.pickle").c_str()));
    struct stat st;
    EXPECT_EQ(stat((dir + "/pid" + std::to_string(getpid()) + ".pickle").c_str(), &st), 0);
    remove_tree(dir);
}

// Snapshots and the log file expand %h/%p/%r with one function and one rank:
// the world's rank once set, else the launcher's variables, else (snapshots only) 0.
TEST_F(History, SnapshotPathExpandsLikeTheLogFile) {
    expect_warnings(); // the over-long path
    std::string dir = tempdir();
    sp::ScopedEnv env({{"OMPI_COMM_WORLD_RANK", nullptr},
                       {"PMIX_RANK", nullptr},
                       {"PMI_RANK", nullptr},
                       {"SLURM_PROCID", nullptr}});
    char want[1024];
    ASSERT_EQ(sp__path_expand((dir + "/s.%h.%p.%r.pickle").c_str(), 0, want, sizeof want),
              SP_EXPAND_OK);
    char host[256];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    std::string shorthost(host);
    shorthost = shorthost.substr(0, shorthost.find('.'));
    EXPECT_EQ(std::string(want),
              dir + "/s." + shorthost + "." + std::to_string(getpid()) + ".0.pickle");
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/s.%h.%p.%r.pickle").c_str()));
    struct stat st;
    EXPECT_EQ(stat(want, &st), 0) << want;
    // A launcher variable that holds no whole rank is passed over for the next (atoi read "7x"
    // as 7 and "x" as 0).
    {
        sp::ScopedEnv junk({{"OMPI_COMM_WORLD_RANK", "x"},
                            {"PMIX_RANK", "7x"},
                            {"PMI_RANK", "99999999999"},
                            {"SLURM_PROCID", "-1"}});
        EXPECT_EQ(sp__path_expand("log%r", -1, want, sizeof want), SP_EXPAND_NO_RANK) << want;
        sp::ScopedEnv slurm({{"SLURM_PROCID", " 5"}});
        ASSERT_EQ(sp__path_expand("log%r", -1, want, sizeof want), SP_EXPAND_OK);
        EXPECT_STREQ(want, "log5");
    }
    // The launcher's rank, then the world's, win over 0; the log file sees the same.
    {
        sp::ScopedEnv launcher({{"PMI_RANK", "6"}});
        ASSERT_SP_OK(sp_dump_snapshot((dir + "/r%r.pickle").c_str()));
        EXPECT_EQ(stat((dir + "/r6.pickle").c_str(), &st), 0);
        sp__log_set_rank(2);
        ASSERT_SP_OK(sp_dump_snapshot((dir + "/r%r.pickle").c_str()));
        EXPECT_EQ(stat((dir + "/r2.pickle").c_str(), &st), 0);
        EXPECT_EQ(sp__path_expand("%r", -1, want, sizeof want), SP_EXPAND_OK);
        EXPECT_STREQ(want, "2");
        sp__log_set_rank(-1);
    }
    EXPECT_EQ(sp__path_expand("log%r", -1, want, sizeof want), SP_EXPAND_NO_RANK)
        << "the log file waits for a rank it does not know";
    std::string longpath(PATH_MAX + 10, 'x');
    EXPECT_SP_STATUS(sp_dump_snapshot(longpath.c_str()), SP_ERR_INVALID_ARGUMENT);
    remove_tree(dir);
}

TEST_F(History, TwoDevicesHaveTheirOwnTraces) {
    sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "2"}});
    ASSERT_EQ(sp_device_count(), 2);
    ASSERT_SP_OK(record(SP_HISTORY_ALL));
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_malloc(1000, 1, nullptr, &a));
    ASSERT_SP_OK(sp_malloc(5000, 0, nullptr, &b));
    ASSERT_EQ(trace(1).size(), 2u);
    EXPECT_EQ(trace(1)[1].addr, (uintptr_t)a);
    ASSERT_EQ(trace(0).size(), 2u);
    EXPECT_EQ(trace(0)[1].addr, (uintptr_t)b);
    std::string dir = tempdir();
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/two.pickle").c_str()));
    {
        Doc d(dir + "/two.pickle");
        const pk_value_t *traces = pk_get(d.root(), "device_traces");
        ASSERT_EQ(pk_len(traces), 2u);
        for (int dev = 0; dev < 2; dev++) {
            const pk_value_t *tr = pk_at(traces, (size_t)dev);
            ASSERT_EQ(pk_len(tr), 2u); // segment_alloc, alloc (this dump's marker comes later)
            EXPECT_EQ((uintptr_t)geti(pk_at(tr, 1), "addr"), (uintptr_t)(dev == 1 ? a : b));
        }
        const pk_value_t *segs = pk_get(d.root(), "segments");
        ASSERT_EQ(pk_len(segs), 2u);
        std::set<int64_t> devs;
        for (size_t i = 0; i < pk_len(segs); i++)
            devs.insert(geti(pk_at(segs, i), "device"));
        EXPECT_EQ(devs, (std::set<int64_t>{0, 1}));
    }
    remove_tree(dir);
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
}

TEST_F(History, SnapshotWithoutHistoryHasEmptyTraces) {
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(1 << 20, 0, nullptr, &p));
    std::string dir = tempdir();
    ASSERT_SP_OK(sp_dump_snapshot((dir + "/s.pickle").c_str()));
    {
        Doc d(dir + "/s.pickle");
        EXPECT_EQ(pk_len(pk_get(d.root(), "segments")), 1u);
        const pk_value_t *traces = pk_get(d.root(), "device_traces");
        ASSERT_GE(pk_len(traces), 1u);
        EXPECT_EQ(pk_len(pk_at(traces, 0)), 0u);
    }
    remove_tree(dir);
    ASSERT_SP_OK(sp_free(p));
}

} // namespace
