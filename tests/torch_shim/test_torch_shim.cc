// test_torch_shim.cc: sympool.torch's C++ shim (python/sympool/_torch_shim.cpp), compiled against
// a stand-in for c10/util/Exception.h (this folder) and driven the way PyTorch's
// CUDAPluggableAllocator drives it: alloc/free through function pointers of PyTorch's types and
// the private-pool hook through a std::function of PyTorch's exact signature. Checks that a
// sympool OOM becomes c10::OutOfMemoryError (torch.OutOfMemoryError in Python) instead of a NULL
// PyTorch would hand to a tensor, that other failures are c10::Error, and that beginning a private
// pool (CUDA graph capture, use_mem_pool) throws. On the host backend with the torch entry
// points' test lift.
#include "sp_test.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "c10/util/Exception.h"

extern "C" {
#include "pool/torch.h"
#include "sympool/pool.h"
#include "sympool/torch.h"

struct CUstream_st;
void sympool_shim_init(void *malloc_status, void *free, void *record_stream, void *last_error_text,
                       int oom_status, int usage_status);
void *sympool_shim_malloc(size_t size, int device, CUstream_st *stream);
void sympool_shim_free(void *ptr, size_t size, int device, CUstream_st *stream);
void sympool_shim_record_stream(void *ptr, CUstream_st *stream);
}

namespace {

using sp::MiB;
// PyTorch's types: CUDAPluggableAllocator's alloc_fn_/free_fn_ and set_begin_allocate_to_pool's
// FuncType (c10::cuda::MempoolId_t is a pair of unsigned long long).
using alloc_fn = void *(size_t, int, CUstream_st *);
using free_fn = void(void *, size_t, int, CUstream_st *);
using begin_fn = void(int, std::pair<unsigned long long, unsigned long long>,
                      std::function<bool(CUstream_st *)>);
extern "C" begin_fn sympool_shim_begin_allocate_to_pool;

class TorchShim : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        sp__torch_allow_host(true);
        sympool_shim_init((void *)&sp_torch_malloc_status, (void *)&sp_torch_free,
                          (void *)&sp_record_stream, (void *)&sp_last_error, SP_ERR_OUT_OF_MEMORY,
                          SP_ERR_INVALID_USAGE);
    }
    void TearDown() override {
        sp__torch_allow_host(false);
        sp::Test::TearDown();
    }
    std::function<alloc_fn> alloc_ = sympool_shim_malloc;
    std::function<free_fn> free_ = sympool_shim_free;
    // CUDAPluggableAllocator's record_stream_fn_: void(void *ptr, cudaStream_t stream).
    std::function<void(void *, CUstream_st *)> record_stream_ = sympool_shim_record_stream;
};

TEST_F(TorchShim, RoundTripAndZeroSize) {
    SP_SKIP_UNLESS_HOST();
    void *p = alloc_(MiB, 0, nullptr);
    ASSERT_NE(p, nullptr);
    sp::touch(p, MiB);
    free_(p, MiB, 0, nullptr);
    EXPECT_EQ(alloc_(0, 0, nullptr), nullptr); // as PyTorch's raw_alloc(0), not an error
}

TEST_F(TorchShim, OutOfMemoryThrowsOutOfMemoryError) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_CAPACITY", "64MiB"}});
    SP_SKIP_UNLESS_HOST();
    void *live = alloc_(40 * MiB, 0, nullptr);
    ASSERT_NE(live, nullptr);
    std::string what;
    try {
        (void)alloc_(30 * MiB, 0, nullptr);
        ADD_FAILURE() << "an OOM returned instead of throwing";
    } catch (const c10::OutOfMemoryError &e) {
        what = e.what();
    }
    EXPECT_NE(what.find("CUDA out of memory in sympool"), std::string::npos) << what;
    EXPECT_NE(what.find("out of memory on device 0"), std::string::npos) << "sympool's reason";
    free_(live, 40 * MiB, 0, nullptr);
}

TEST_F(TorchShim, OtherFailuresThrowPlainError) {
    expect_warnings();
    SP_SKIP_UNLESS_HOST();
    bool oom = false, error = false;
    try {
        (void)alloc_(4096, sp_device_count() + 3, nullptr);
    } catch (const c10::OutOfMemoryError &) {
        oom = true;
    } catch (const c10::Error &e) {
        error = std::string(e.what()).find("sympool could not allocate") != std::string::npos;
    }
    EXPECT_FALSE(oom) << "an unknown device is not an out-of-memory";
    EXPECT_TRUE(error);
}

// Tensor.record_stream: a use sympool records, or a pointer it does not hold (skipped, as
// PyTorch's allocator skips what it did not allocate), returns; a use it cannot record would
// leave the block reusable under that stream's work, and throws instead.
TEST_F(TorchShim, RecordStreamThrowsWhereTheUseCannotBeRecorded) {
    expect_warnings();
    SP_SKIP_UNLESS_HOST();
    void *p = alloc_(MiB, 0, nullptr);
    ASSERT_NE(p, nullptr);
    sp_stream_t s = nullptr;
    ASSERT_EQ(sp_stream_create(0, &s), SP_SUCCESS);
    EXPECT_NO_THROW(record_stream_(p, static_cast<CUstream_st *>(s)));
    EXPECT_NO_THROW(record_stream_(p, nullptr)); // the allocation stream: nothing to record
    EXPECT_NO_THROW(record_stream_(nullptr, static_cast<CUstream_st *>(s))); // empty storage
    int foreign = 0;
    EXPECT_NO_THROW(record_stream_(&foreign, static_cast<CUstream_st *>(s)));
    // cudaStreamPerThread ((cudaStream_t)0x2): a different stream on every thread.
    std::string what;
    try {
        record_stream_(p, reinterpret_cast<CUstream_st *>(uintptr_t{2}));
        ADD_FAILURE() << "an unrecordable use returned as if recorded";
    } catch (const c10::Error &e) {
        what = e.what();
    }
    EXPECT_NE(what.find("cannot keep the block"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaStreamPerThread"), std::string::npos) << "sympool's reason: " << what;
    free_(p, MiB, 0, nullptr);
    EXPECT_EQ(sp_stream_destroy(s), SP_SUCCESS);
}

// A tensor of device 0 read by a stream of device 1 (a peer copy): PyTorch's own allocator records
// an event on that stream; sympool refuses a stream of another device, so the shim throws.
TEST_F(TorchShim, RecordStreamOfAnotherDeviceThrows) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "2"}});
    SP_SKIP_UNLESS_HOST();
    ASSERT_EQ(sp_device_count(), 2);
    void *p = alloc_(MiB, 0, nullptr);
    ASSERT_NE(p, nullptr);
    sp_stream_t s1 = nullptr;
    ASSERT_EQ(sp_stream_create(1, &s1), SP_SUCCESS);
    EXPECT_THROW(record_stream_(p, static_cast<CUstream_st *>(s1)), c10::Error);
    free_(p, MiB, 0, nullptr);
    EXPECT_EQ(sp_stream_destroy(s1), SP_SUCCESS);
}

TEST_F(TorchShim, BeginningAPrivatePoolThrows) {
    std::function<begin_fn> begin = sympool_shim_begin_allocate_to_pool;
    bool filter_called = false;
    std::string what;
    try {
        begin(0, {1, 0}, [&](CUstream_st *) { return filter_called = true; });
    } catch (const c10::Error &e) {
        what = e.what();
    }
    EXPECT_NE(what.find("CUDA graphs"), std::string::npos) << what;
    EXPECT_NE(what.find("pool (1, 0)"), std::string::npos) << what;
    EXPECT_FALSE(filter_called);
}

} // namespace
