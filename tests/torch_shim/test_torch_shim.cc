// test_torch_shim.cc: sympool.torch's C++ shim (python/sympool/_torch_shim.cpp), compiled against
// a stand-in for c10/util/Exception.h (this folder) and driven the way PyTorch's
// CUDAPluggableAllocator drives it: alloc/free through function pointers of PyTorch's types and
// the private-pool hook through a std::function of PyTorch's exact signature. Checks that a
// sympool OOM becomes c10::OutOfMemoryError (torch.OutOfMemoryError in Python) instead of a NULL
// PyTorch would hand to a tensor, that other failures are c10::Error, and that beginning a private
// pool (CUDA graph capture, use_mem_pool) throws. On the host backend with the torch entry
// points' test lift.
#include "sp_test.hpp"

#include <functional>
#include <string>
#include <utility>

#include "c10/util/Exception.h"

extern "C" {
#include "pool/torch.h"
#include "sympool/torch.h"

struct CUstream_st;
void sympool_shim_init(void *malloc_status, void *free, void *last_error_text, int oom_status);
void *sympool_shim_malloc(size_t size, int device, CUstream_st *stream);
void sympool_shim_free(void *ptr, size_t size, int device, CUstream_st *stream);
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
                          (void *)&sp_last_error, SP_ERR_OUT_OF_MEMORY);
    }
    void TearDown() override {
        sp__torch_allow_host(false);
        sp::Test::TearDown();
    }
    std::function<alloc_fn> alloc_ = sympool_shim_malloc;
    std::function<free_fn> free_ = sympool_shim_free;
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
