// test_device.cc: white-box tests of the device backend contract (pool/device/device.h):
// backend selection, the host backend's exact byte budget, fault injection, misuse rejection,
// stream/event ordering and thread safety; and the cuda ops on a GPU (skipped without one).
// Plain ::testing::Test fixtures: these tests sit below the allocator and must not need it.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sp_test.hpp"

extern "C" {
#include "core/core.h"
#include "pool/device/device.h"
}

namespace {

constexpr size_t kGiB = size_t(1) << 30;

// Selects the backend under a given environment and releases it at the end.
class DeviceTest : public ::testing::Test {
  protected:
    void TearDown() override {
        sp__device_reset();
        env_.reset();
        dev_env_.reset();
    }

    // Selects the host backend afresh with the given extra variables in force (until the test
    // ends or the next call).
    void select_host(std::initializer_list<std::pair<const char *, const char *>> vars) {
        sp__device_reset();
        env_.reset();
        if (!dev_env_)
            dev_env_ = std::make_unique<sp::ScopedEnv>(
                std::initializer_list<std::pair<const char *, const char *>>{
                    {"SYMPOOL_DEVICE", "host"}});
        env_ = std::make_unique<sp::ScopedEnv>(vars);
        ASSERT_SP_OK(sp__device_select(&ops_, &caps_));
        ASSERT_STREQ(ops_->name, "host");
    }

    std::unique_ptr<sp::ScopedEnv> dev_env_; // SYMPOOL_DEVICE=host
    std::unique_ptr<sp::ScopedEnv> env_;     // the test's extra variables
    const sp_device_ops_t *ops_ = nullptr;
    sp_device_caps_t caps_{};
};

// ---- selection ------------------------------------------------------------------------------

TEST_F(DeviceTest, AutoPicksHostWithoutGpu) {
    if (sp__device_cuda_available())
        GTEST_SKIP() << "a GPU answers here; auto picks cuda";
    sp::ScopedEnv env({{"SYMPOOL_DEVICE", "auto"}});
    sp__device_reset();
    ASSERT_SP_OK(sp__device_select(&ops_, &caps_));
    EXPECT_STREQ(ops_->name, "host");
    EXPECT_TRUE(caps_.is_emulated);
    EXPECT_TRUE(caps_.has_vmm); // host reservations back expandable segments
    EXPECT_GE(caps_.vmm_granularity, 4096u);
    EXPECT_EQ(caps_.device_count, 1);
    EXPECT_GE(caps_.granularity, 512u);
}

TEST_F(DeviceTest, SelectIsRememberedUntilReset) {
    select_host({{"SYMPOOL_HOST_DEVICES", "2"}});
    EXPECT_EQ(caps_.device_count, 2);
    {
        sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "3"}});
        const sp_device_ops_t *ops = nullptr;
        sp_device_caps_t caps{};
        ASSERT_SP_OK(sp__device_select(&ops, &caps));
        EXPECT_EQ(ops, ops_);
        EXPECT_EQ(caps.device_count, 2) << "selection must not change before reset";
        sp__device_reset();
        ASSERT_SP_OK(sp__device_select(&ops, &caps));
        EXPECT_EQ(caps.device_count, 3) << "after reset the options are read again";
    }
}

TEST_F(DeviceTest, CudaRequestedFailsClearlyWithoutGpu) {
    if (sp__device_cuda_available())
        GTEST_SKIP() << "a GPU answers here";
    sp::ScopedEnv env({{"SYMPOOL_DEVICE", "cuda"}});
    sp__device_reset();
    sp__error_clear();
    const sp_device_ops_t *ops = &sp__device_host_ops; // must stay untouched
    sp_device_caps_t caps{};
    sp_status_t s = sp__device_select(&ops, &caps);
    if (sp__device_cuda_ops() == nullptr) {
        EXPECT_EQ(s, SP_ERR_NOT_SUPPORTED) << sp::describe(s);
        EXPECT_NE(std::string(sp_last_error()).find("without CUDA"), std::string::npos)
            << sp_last_error();
    } else {
        EXPECT_EQ(s, SP_ERR_DEVICE) << sp::describe(s);
        EXPECT_NE(std::string(sp_last_error()).find("cuda"), std::string::npos) << sp_last_error();
    }
    EXPECT_EQ(ops, &sp__device_host_ops);
    // A failed selection is not remembered: fixing the environment lets the next call succeed.
    sp::ScopedEnv fix({{"SYMPOOL_DEVICE", "host"}});
    ASSERT_SP_OK(sp__device_select(&ops, &caps));
    EXPECT_STREQ(ops->name, "host");
}

// ---- memory ---------------------------------------------------------------------------------

TEST_F(DeviceTest, CapacityIsExact) {
    select_host({{"SYMPOOL_HOST_CAPACITY", "1MiB"}});
    const size_t cap = size_t(1) << 20;
    size_t fr = 0, tot = 0;
    ASSERT_SP_OK(ops_->mem_get_info(0, &fr, &tot));
    EXPECT_EQ(tot, cap);
    EXPECT_EQ(fr, cap);

    void *a = nullptr, *b = nullptr, *c = nullptr;
    ASSERT_SP_OK(ops_->mem_alloc(0, cap - 4096, &a));
    ASSERT_SP_OK(ops_->mem_alloc(0, 4096, &b));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 512, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % caps_.granularity, 0u);
    ASSERT_SP_OK(ops_->mem_get_info(0, &fr, &tot));
    EXPECT_EQ(fr, 0u);
    EXPECT_SP_STATUS(ops_->mem_alloc(0, 1, &c), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(c, nullptr) << "output written on failure";
    EXPECT_EQ(sp__host_live_allocations(0), 2u);
    EXPECT_EQ(sp__host_live_bytes(0), cap);

    std::memset(a, 0xab, cap - 4096); // the memory is really usable
    ASSERT_SP_OK(ops_->mem_free(0, b, 4096));
    ASSERT_SP_OK(ops_->mem_alloc(0, 1, &c));
    ASSERT_SP_OK(ops_->mem_get_info(0, &fr, &tot));
    EXPECT_EQ(fr, 4095u);
    ASSERT_SP_OK(ops_->mem_free(0, c, 1));
    ASSERT_SP_OK(ops_->mem_free(0, a, cap - 4096));
    EXPECT_EQ(sp__host_live_allocations(0), 0u);
    EXPECT_EQ(sp__host_live_bytes(0), 0u);
}

TEST_F(DeviceTest, HugeCapacityCostsNothingUntilTouched) {
    select_host({{"SYMPOOL_HOST_CAPACITY", "141GiB"}});
    size_t fr = 0, tot = 0;
    ASSERT_SP_OK(ops_->mem_get_info(0, &fr, &tot));
    EXPECT_EQ(tot, 141 * kGiB);
    void *p = nullptr;
    ASSERT_SP_OK(ops_->mem_alloc(0, 100 * kGiB, &p));
    static_cast<char *>(p)[0] = 1;
    static_cast<char *>(p)[100 * kGiB - 1] = 2;
    ASSERT_SP_OK(ops_->mem_get_info(0, &fr, &tot));
    EXPECT_EQ(fr, 41 * kGiB);
    ASSERT_SP_OK(ops_->mem_free(0, p, 100 * kGiB));
    EXPECT_EQ(sp__host_live_bytes(0), 0u);
}

TEST_F(DeviceTest, FailAfterNFailsTheNthCallOnce) {
    select_host({{"SYMPOOL_HOST_FAIL_AFTER", "3"}});
    void *p[5] = {};
    ASSERT_SP_OK(ops_->mem_alloc(0, 4096, &p[0]));
    ASSERT_SP_OK(ops_->mem_alloc(0, 4096, &p[1]));
    EXPECT_SP_STATUS(ops_->mem_alloc(0, 4096, &p[2]), SP_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(p[2], nullptr);
    ASSERT_SP_OK(ops_->mem_alloc(0, 4096, &p[3]));
    ASSERT_SP_OK(ops_->mem_alloc(0, 4096, &p[4]));
    EXPECT_EQ(sp__host_live_allocations(0), 4u);
    for (void *q : p)
        if (q)
            ASSERT_SP_OK(ops_->mem_free(0, q, 4096));

    // The count starts again at a new init.
    select_host({{"SYMPOOL_HOST_FAIL_AFTER", "1"}});
    void *q = nullptr;
    EXPECT_SP_STATUS(ops_->mem_alloc(0, 4096, &q), SP_ERR_OUT_OF_MEMORY);
    ASSERT_SP_OK(ops_->mem_alloc(0, 4096, &q));
    ASSERT_SP_OK(ops_->mem_free(0, q, 4096));
}

TEST_F(DeviceTest, DevicesHaveTheirOwnBudgets) {
    select_host({{"SYMPOOL_HOST_DEVICES", "3"}, {"SYMPOOL_HOST_CAPACITY", "64KiB"}});
    ASSERT_EQ(caps_.device_count, 3);
    void *p[3] = {};
    for (int d = 0; d < 3; d++)
        ASSERT_SP_OK(ops_->mem_alloc(d, 64 * 1024, &p[d]));
    void *x = nullptr;
    for (int d = 0; d < 3; d++) {
        EXPECT_SP_STATUS(ops_->mem_alloc(d, 1, &x), SP_ERR_OUT_OF_MEMORY);
        EXPECT_EQ(sp__host_live_allocations(d), 1u);
    }
    // A pointer of device 0 is not a pointer of device 1.
    EXPECT_SP_STATUS(ops_->mem_free(1, p[0], 64 * 1024), SP_ERR_INVALID_USAGE);
    ASSERT_SP_OK(ops_->mem_free(0, p[0], 64 * 1024));
    EXPECT_EQ(sp__host_live_bytes(0), 0u);
    EXPECT_EQ(sp__host_live_bytes(1), 64 * 1024u);
    EXPECT_SP_STATUS(ops_->mem_alloc(1, 1, &x), SP_ERR_OUT_OF_MEMORY);
    ASSERT_SP_OK(ops_->mem_free(1, p[1], 64 * 1024));
    ASSERT_SP_OK(ops_->mem_free(2, p[2], 64 * 1024));
    EXPECT_SP_STATUS(ops_->mem_alloc(3, 1, &x), SP_ERR_INVALID_ARGUMENT);
}

TEST_F(DeviceTest, MisuseIsRejectedAndChangesNothing) {
    select_host({{"SYMPOOL_HOST_CAPACITY", "1MiB"}});
    void *p = nullptr;
    ASSERT_SP_OK(ops_->mem_alloc(0, 8192, &p));
    static_cast<char *>(p)[0] = 42;
    int local = 0;
    EXPECT_SP_STATUS(ops_->mem_free(0, &local, 8192), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(ops_->mem_free(0, static_cast<char *>(p) + 4096, 4096), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(ops_->mem_free(0, p, 4096), SP_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(sp_last_error()).find("8192"), std::string::npos) << sp_last_error();
    EXPECT_EQ(sp__host_live_allocations(0), 1u);
    EXPECT_EQ(sp__host_live_bytes(0), 8192u);
    EXPECT_EQ(static_cast<char *>(p)[0], 42) << "memory still mapped and intact";
    ASSERT_SP_OK(ops_->mem_free(0, p, 8192));
    EXPECT_SP_STATUS(ops_->mem_free(0, p, 8192), SP_ERR_INVALID_USAGE);
    EXPECT_EQ(sp__host_live_allocations(0), 0u);
    EXPECT_EQ(sp__host_live_bytes(0), 0u);

    int junk = 0;
    sp_dev_stream_t s = nullptr;
    int dev = -1;
    EXPECT_SP_STATUS(ops_->stream_device(&junk, &dev), SP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(dev, -1);
    EXPECT_SP_STATUS(ops_->stream_sync(0, &junk), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(ops_->stream_destroy(0, &junk), SP_ERR_INVALID_ARGUMENT);
    bool done = false;
    EXPECT_SP_STATUS(ops_->event_query(0, &junk, &done), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(ops_->event_destroy(0, &junk), SP_ERR_INVALID_ARGUMENT);
    ASSERT_SP_OK(ops_->stream_create(0, &s));
    ASSERT_SP_OK(ops_->stream_destroy(0, s));
    EXPECT_SP_STATUS(ops_->stream_device(s, &dev), SP_ERR_INVALID_ARGUMENT);
}

// mem_free finds, checks and deletes a mapping in one probe of the mapping table. Hundreds of
// mappings (the table grows and its chains collide) freed in a scrambled order: each free of a
// live mapping succeeds, a second free or a wrong size is refused, and what is left stays exact.
// Arena and mmap paths alike (the table is the same, the addresses are not).
TEST_F(DeviceTest, ManyMappingsFreedInAnyOrderStayExact) {
    for (const char *arena : {"1", "0"}) {
        SCOPED_TRACE(std::string("SYMPOOL_HOST_ARENA=") + arena);
        select_host({{"SYMPOOL_HOST_CAPACITY", "1GiB"}, {"SYMPOOL_HOST_ARENA", arena}});
        constexpr size_t kCount = 600;
        std::vector<void *> ptrs(kCount);
        std::vector<size_t> sizes(kCount);
        size_t live_bytes = 0;
        for (size_t i = 0; i < kCount; i++) {
            sizes[i] = 4096 * (1 + i % 5);
            ASSERT_SP_OK(ops_->mem_alloc(0, sizes[i], &ptrs[i]));
            live_bytes += sizes[i];
        }
        std::vector<size_t> order(kCount);
        for (size_t i = 0; i < kCount; i++)
            order[i] = i;
        uint64_t x = 12345; // a fixed scramble (Fisher-Yates with a linear congruential draw)
        for (size_t i = kCount - 1; i > 0; i--) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            std::swap(order[i], order[(x >> 33) % (i + 1)]);
        }
        for (size_t k = 0; k < kCount; k++) {
            size_t i = order[k];
            EXPECT_SP_STATUS(ops_->mem_free(0, ptrs[i], sizes[i] + 4096), SP_ERR_INVALID_USAGE);
            ASSERT_EQ(ops_->mem_free(0, ptrs[i], sizes[i]), SP_SUCCESS)
                << "mapping " << i << ", free " << k << ": " << sp_last_error();
            EXPECT_SP_STATUS(ops_->mem_free(0, ptrs[i], sizes[i]), SP_ERR_INVALID_USAGE);
            live_bytes -= sizes[i];
            ASSERT_EQ(sp__host_live_allocations(0), kCount - k - 1);
            ASSERT_EQ(sp__host_live_bytes(0), live_bytes);
        }
    }
}

TEST_F(DeviceTest, LeftoverMappingsAreReleasedAtReset) {
    select_host({{"SYMPOOL_HOST_CAPACITY", "1MiB"}});
    void *p = nullptr;
    sp_dev_stream_t s = nullptr;
    sp_dev_event_t e = nullptr;
    ASSERT_SP_OK(ops_->mem_alloc(0, 4096, &p));
    ASSERT_SP_OK(ops_->stream_create(0, &s));
    ASSERT_SP_OK(ops_->event_create(0, &e));
    sp__device_reset(); // must not leak (ASan checks) nor crash
    EXPECT_EQ(sp__host_live_allocations(0), 0u);
    select_host({{"SYMPOOL_HOST_CAPACITY", "1MiB"}});
    size_t fr = 0, tot = 0;
    ASSERT_SP_OK(ops_->mem_get_info(0, &fr, &tot));
    EXPECT_EQ(fr, tot);
}

// ---- streams and events ---------------------------------------------------------------------

TEST_F(DeviceTest, EventCompletesOnlyAfterItsStreamIsSynchronized) {
    select_host({{"SYMPOOL_HOST_DEVICES", "2"}});
    sp_dev_stream_t a = nullptr, b = nullptr;
    ASSERT_SP_OK(ops_->stream_create(0, &a));
    ASSERT_SP_OK(ops_->stream_create(1, &b));
    int dev = -1;
    ASSERT_SP_OK(ops_->stream_device(a, &dev));
    EXPECT_EQ(dev, 0);
    ASSERT_SP_OK(ops_->stream_device(b, &dev));
    EXPECT_EQ(dev, 1);

    sp_dev_event_t e = nullptr;
    ASSERT_SP_OK(ops_->event_create(0, &e));
    bool done = false;
    ASSERT_SP_OK(ops_->event_query(0, e, &done));
    EXPECT_TRUE(done) << "a never-recorded event is complete (as in CUDA)";

    ASSERT_SP_OK(ops_->event_record(0, e, a));
    ASSERT_SP_OK(ops_->event_query(0, e, &done));
    EXPECT_FALSE(done);
    ASSERT_SP_OK(ops_->stream_sync(0, nullptr)); // another stream's sync does not help
    ASSERT_SP_OK(ops_->event_query(0, e, &done));
    EXPECT_FALSE(done);
    ASSERT_SP_OK(ops_->stream_sync(0, a));
    ASSERT_SP_OK(ops_->event_query(0, e, &done));
    EXPECT_TRUE(done);

    // A record after the sync waits for the next sync.
    ASSERT_SP_OK(ops_->event_record(0, e, a));
    ASSERT_SP_OK(ops_->event_query(0, e, &done));
    EXPECT_FALSE(done);
    ASSERT_SP_OK(ops_->stream_sync(0, a));
    ASSERT_SP_OK(ops_->event_query(0, e, &done));
    EXPECT_TRUE(done);

    // event_sync completes the stream up to that event only.
    sp_dev_event_t e2 = nullptr;
    ASSERT_SP_OK(ops_->event_create(0, &e2));
    ASSERT_SP_OK(ops_->event_record(0, e, a));
    ASSERT_SP_OK(ops_->event_record(0, e2, a));
    ASSERT_SP_OK(ops_->event_sync(0, e));
    ASSERT_SP_OK(ops_->event_query(0, e, &done));
    EXPECT_TRUE(done);
    ASSERT_SP_OK(ops_->event_query(0, e2, &done));
    EXPECT_FALSE(done);
    ASSERT_SP_OK(ops_->event_sync(0, e2));
    ASSERT_SP_OK(ops_->event_query(0, e2, &done));
    EXPECT_TRUE(done);

    // A stream of device 1 is not a stream of device 0.
    EXPECT_SP_STATUS(ops_->event_record(0, e, b), SP_ERR_INVALID_ARGUMENT);

    // Destroying a stream completes its pending events instead of leaving them dangling.
    ASSERT_SP_OK(ops_->event_record(0, e2, a));
    ASSERT_SP_OK(ops_->stream_destroy(0, a));
    ASSERT_SP_OK(ops_->event_query(0, e2, &done));
    EXPECT_TRUE(done);

    ASSERT_SP_OK(ops_->event_destroy(0, e));
    ASSERT_SP_OK(ops_->event_destroy(0, e2));
    EXPECT_SP_STATUS(ops_->event_destroy(0, e2), SP_ERR_INVALID_ARGUMENT);
    ASSERT_SP_OK(ops_->stream_destroy(1, b));
}

// A stream's destroy completes the live events whose last record is on it, and only those: an
// event recorded again on another stream waits for that one; destroyed (pooled) events and
// events of other streams are not walked for it (the stream counts its events, so a destroy
// with none walks nothing), and none is left pointing at the freed stream (ASan would see it).
TEST_F(DeviceTest, AStreamDestroyCompletesItsOwnEventsOnly) {
    select_host({});
    sp_dev_stream_t a = nullptr, c = nullptr;
    ASSERT_SP_OK(ops_->stream_create(0, &a));
    ASSERT_SP_OK(ops_->stream_create(0, &c));
    std::vector<sp_dev_event_t> on_a(20), moved(5);
    for (auto &e : on_a) {
        ASSERT_SP_OK(ops_->event_create(0, &e));
        ASSERT_SP_OK(ops_->event_record(0, e, a));
        ASSERT_SP_OK(ops_->event_record(0, e, a)); // twice: counted once
    }
    for (auto &e : moved) {
        ASSERT_SP_OK(ops_->event_create(0, &e));
        ASSERT_SP_OK(ops_->event_record(0, e, a));
        ASSERT_SP_OK(ops_->event_record(0, e, c)); // now c's
    }
    for (size_t i = 0; i < on_a.size(); i += 2) // half destroyed (pooled) before the stream
        ASSERT_SP_OK(ops_->event_destroy(0, on_a[i]));
    ASSERT_SP_OK(ops_->stream_destroy(0, a));
    bool done = false;
    for (size_t i = 1; i < on_a.size(); i += 2) {
        ASSERT_SP_OK(ops_->event_query(0, on_a[i], &done));
        EXPECT_TRUE(done) << "event " << i << " of the destroyed stream";
    }
    for (auto e : moved) {
        ASSERT_SP_OK(ops_->event_query(0, e, &done));
        EXPECT_FALSE(done) << "recorded on c last";
    }
    ASSERT_SP_OK(ops_->stream_sync(0, c));
    for (auto e : moved) {
        ASSERT_SP_OK(ops_->event_query(0, e, &done));
        EXPECT_TRUE(done);
    }
    // Pooled events come back unrecorded, and a new stream's destroy completes them again.
    sp_dev_stream_t d = nullptr;
    ASSERT_SP_OK(ops_->stream_create(0, &d));
    std::vector<sp_dev_event_t> again(10);
    for (auto &e : again) {
        ASSERT_SP_OK(ops_->event_create(0, &e));
        ASSERT_SP_OK(ops_->event_record(0, e, d));
    }
    ASSERT_SP_OK(ops_->stream_destroy(0, d));
    for (auto e : again) {
        ASSERT_SP_OK(ops_->event_query(0, e, &done));
        EXPECT_TRUE(done);
        ASSERT_SP_OK(ops_->event_destroy(0, e));
    }
    for (size_t i = 1; i < on_a.size(); i += 2)
        ASSERT_SP_OK(ops_->event_destroy(0, on_a[i]));
    for (auto e : moved)
        ASSERT_SP_OK(ops_->event_destroy(0, e));
    ASSERT_SP_OK(ops_->stream_destroy(0, c));
}

// The free set orders blocks by (stream, size, address) with the stream compared by handle, so
// streams made in turn must compare in that order whatever the heap holds: a handle that was the
// stream's heap struct followed malloc, which hands freed chunks of its size out last freed first
// (the churn below: every stream then sorted below the one made before it, and `sympool replay`
// of a trace with several streams picked other blocks from one build or run to the next). A
// destroyed stream's handle goes to the next stream made, the lowest free first.
TEST_F(DeviceTest, StreamHandlesCompareInTheOrderMadeWhateverTheHeap) {
    select_host({{"SYMPOOL_HOST_DEVICES", "2"}});
    std::vector<void *> churn;
    for (size_t size : {24, 32, 40, 48})
        for (int i = 0; i < 8; i++)
            churn.push_back(malloc(size));
    for (void *p : churn)
        free(p); // freed chunks of every small size, given back newest first
    std::vector<sp_dev_stream_t> s(12);
    for (auto &h : s)
        ASSERT_SP_OK(ops_->stream_create(0, &h));
    for (size_t i = 1; i < s.size(); i++)
        EXPECT_GT((uintptr_t)s[i], (uintptr_t)s[i - 1]) << "stream " << i;
    EXPECT_GT((uintptr_t)s[0], 2u); // neither NULL nor one of CUDA's pseudo handles
    // Destroyed, the handles are free again: the next streams get the lowest first.
    ASSERT_SP_OK(ops_->stream_destroy(0, s[7]));
    ASSERT_SP_OK(ops_->stream_destroy(0, s[3]));
    sp_dev_stream_t a = nullptr, b = nullptr, c = nullptr;
    ASSERT_SP_OK(ops_->stream_create(0, &a));
    ASSERT_SP_OK(ops_->stream_create(0, &b));
    ASSERT_SP_OK(ops_->stream_create(0, &c));
    EXPECT_EQ(a, s[3]);
    EXPECT_EQ(b, s[7]);
    EXPECT_GT((uintptr_t)c, (uintptr_t)s.back());
    s[3] = a;
    s[7] = b;
    s.push_back(c);
    // Another device's streams are told apart from these by their handles alone.
    sp_dev_stream_t other = nullptr;
    ASSERT_SP_OK(ops_->stream_create(1, &other));
    int dev = -1;
    ASSERT_SP_OK(ops_->stream_device(other, &dev));
    EXPECT_EQ(dev, 1);
    for (auto h : s) {
        EXPECT_NE(h, other);
        ASSERT_SP_OK(ops_->stream_device(h, &dev));
        EXPECT_EQ(dev, 0);
    }
    ASSERT_SP_OK(ops_->stream_destroy(1, other));
    for (auto h : s)
        ASSERT_SP_OK(ops_->stream_destroy(0, h));
}

TEST_F(DeviceTest, EventOnDefaultStream) {
    select_host({});
    sp_dev_event_t e = nullptr;
    ASSERT_SP_OK(ops_->event_create(0, &e));
    ASSERT_SP_OK(ops_->event_record(0, e, nullptr));
    bool done = true;
    ASSERT_SP_OK(ops_->event_query(0, e, &done));
    EXPECT_FALSE(done);
    ASSERT_SP_OK(ops_->stream_sync(0, nullptr));
    ASSERT_SP_OK(ops_->event_query(0, e, &done));
    EXPECT_TRUE(done);
    ASSERT_SP_OK(ops_->event_destroy(0, e));
}

TEST_F(DeviceTest, EventsArePooled) {
    select_host({});
    sp_dev_event_t e1 = nullptr, e2 = nullptr;
    ASSERT_SP_OK(ops_->event_create(0, &e1));
    ASSERT_SP_OK(ops_->event_record(0, e1, nullptr));
    ASSERT_SP_OK(ops_->event_destroy(0, e1));
    ASSERT_SP_OK(ops_->event_create(0, &e2));
    EXPECT_EQ(e1, e2) << "a destroyed event is reused";
    bool done = false;
    ASSERT_SP_OK(ops_->event_query(0, e2, &done));
    EXPECT_TRUE(done) << "a reused event starts unrecorded";
    ASSERT_SP_OK(ops_->event_destroy(0, e2));
}

TEST_F(DeviceTest, MemcpyAsyncCopies) {
    select_host({});
    void *p = nullptr;
    ASSERT_SP_OK(ops_->mem_alloc(0, 4096, &p));
    const char msg[] = "sympool";
    ASSERT_SP_OK(ops_->memcpy_async(0, p, msg, sizeof(msg), nullptr));
    EXPECT_STREQ(static_cast<char *>(p), msg);
    ASSERT_SP_OK(ops_->mem_free(0, p, 4096));
}

TEST_F(DeviceTest, ConcurrentAllocFreeKeepsCountsExact) {
    select_host({{"SYMPOOL_HOST_DEVICES", "2"}, {"SYMPOOL_HOST_CAPACITY", "1GiB"}});
    std::vector<std::thread> threads;
    std::vector<int> failures(4, 0);
    for (int t = 0; t < 4; t++) {
        threads.emplace_back([&, t] {
            int d = t % 2;
            sp_dev_stream_t s = nullptr;
            if (ops_->stream_create(d, &s) != SP_SUCCESS)
                failures[t]++;
            for (int i = 0; i < 1000; i++) {
                size_t sz = 4096 * size_t(1 + (i + t) % 7);
                void *p = nullptr;
                if (ops_->mem_alloc(d, sz, &p) != SP_SUCCESS) {
                    failures[t]++;
                    continue;
                }
                static_cast<char *>(p)[0] = char(i);
                sp_dev_event_t e = nullptr;
                bool done = false;
                if (ops_->event_create(d, &e) != SP_SUCCESS ||
                    ops_->event_record(d, e, s) != SP_SUCCESS ||
                    ops_->stream_sync(d, s) != SP_SUCCESS ||
                    ops_->event_query(d, e, &done) != SP_SUCCESS || !done ||
                    ops_->event_destroy(d, e) != SP_SUCCESS)
                    failures[t]++;
                if (ops_->mem_free(d, p, sz) != SP_SUCCESS)
                    failures[t]++;
            }
            if (ops_->stream_destroy(d, s) != SP_SUCCESS)
                failures[t]++;
        });
    }
    for (auto &th : threads)
        th.join();
    for (int t = 0; t < 4; t++)
        EXPECT_EQ(failures[t], 0) << "thread " << t;
    for (int d = 0; d < 2; d++) {
        EXPECT_EQ(sp__host_live_allocations(d), 0u);
        EXPECT_EQ(sp__host_live_bytes(d), 0u);
    }
}

// ---- cuda (GPU only; never compiled out) ----------------------------------------------------

TEST_F(DeviceTest, CudaOps) {
    if (!sp__device_cuda_available())
        GTEST_SKIP() << "no GPU answers here";
    sp::ScopedEnv env({{"SYMPOOL_DEVICE", "cuda"}});
    sp__device_reset();
    ASSERT_SP_OK(sp__device_select(&ops_, &caps_));
    ASSERT_STREQ(ops_->name, "cuda");
    EXPECT_FALSE(caps_.is_emulated);
    EXPECT_EQ(caps_.granularity, 512u);
    ASSERT_GE(caps_.device_count, 1);

    size_t fr = 0, tot = 0;
    ASSERT_SP_OK(ops_->mem_get_info(0, &fr, &tot));
    EXPECT_GT(tot, 0u);
    EXPECT_LE(fr, tot);

    void *p = nullptr;
    ASSERT_SP_OK(ops_->mem_alloc(0, 1 << 20, &p));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    // An impossible request is a quiet OOM, and the sticky error is cleared: later calls work.
    void *huge = nullptr;
    EXPECT_SP_STATUS(ops_->mem_alloc(0, tot * 4, &huge), SP_ERR_OUT_OF_MEMORY);

    sp_dev_stream_t s = nullptr;
    ASSERT_SP_OK(ops_->stream_create(0, &s));
    int dev = -1;
    ASSERT_SP_OK(ops_->stream_device(s, &dev));
    EXPECT_EQ(dev, 0);

    std::vector<char> src(1 << 20, 7), dst(1 << 20, 0);
    ASSERT_SP_OK(ops_->memcpy_async(0, p, src.data(), src.size(), s));
    ASSERT_SP_OK(ops_->memcpy_async(0, dst.data(), p, dst.size(), s));
    sp_dev_event_t e = nullptr;
    ASSERT_SP_OK(ops_->event_create(0, &e));
    ASSERT_SP_OK(ops_->event_record(0, e, s));
    ASSERT_SP_OK(ops_->event_sync(0, e));
    bool done = false;
    ASSERT_SP_OK(ops_->event_query(0, e, &done));
    EXPECT_TRUE(done);
    EXPECT_EQ(dst[12345], 7);
    ASSERT_SP_OK(ops_->event_destroy(0, e));
    sp_dev_event_t e2 = nullptr;
    ASSERT_SP_OK(ops_->event_create(0, &e2));
    EXPECT_EQ(e, e2) << "events are pooled";
    ASSERT_SP_OK(ops_->event_destroy(0, e2));
    ASSERT_SP_OK(ops_->stream_sync(0, s));
    ASSERT_SP_OK(ops_->stream_destroy(0, s));
    ASSERT_SP_OK(ops_->mem_free(0, p, 1 << 20));
}

} // namespace
