// test_api_adversary.cc: reproducers from an adversary of the public C API, each a defect that was
// fixed: the call must give the documented status and message, and change nothing it should not.
// They run on every backend (host, and the cuda doubles), unless a test says otherwise.
#include "alloc_test_util.hpp"

#include <sympool/experimental.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

extern "C" {
#include "pool/device/device.h"
#include "pool/pool.h"
#include "pool/torch.h"
}

using namespace sp;

namespace {

class ApiAdversary : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        expect_warnings();
    }
};

void *const legacy = reinterpret_cast<void *>(uintptr_t(1));     // cudaStreamLegacy
void *const per_thread = reinterpret_cast<void *>(uintptr_t(2)); // cudaStreamPerThread

sp_mempool_t *make_pool() {
    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    sp_mempool_t *pool = nullptr;
    EXPECT_EQ(sp_mempool_create(&params, &pool), SP_SUCCESS) << sp_last_error();
    return pool;
}

} // namespace

// sp_mempool_malloc returns "as sp_malloc", which keys cudaStreamPerThread's blocks nowhere (one
// handle for a different stream on every thread would let one thread take another's block
// unordered) and cudaStreamLegacy's as the default stream's. sp_mempool_malloc skipped that
// mapping: on cuda it cached blocks under the handle 2 (the hazard sp_malloc refuses) and under 1
// apart from NULL's; on host it refused the legacy stream that sp_malloc takes.
TEST_F(ApiAdversary, MempoolMallocTakesCudaPseudoStreamsAsSpMallocDoes) {
    sp_mempool_t *pool = make_pool();
    ASSERT_NE(pool, nullptr);
    sp_stats_t before = snap();
    void *p = reinterpret_cast<void *>(uintptr_t(0xdead));
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, 4096, per_thread, &p), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("cudaStreamPerThread"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(p, reinterpret_cast<void *>(uintptr_t(0xdead))) << "output untouched on failure";
    EXPECT_EQ(diff(before, snap()), "") << "a refused request changes no statistic";
    EXPECT_EQ(sp_mempool_total_bytes(pool), 0u) << "nor the pool";

    ASSERT_SP_OK(sp_mempool_malloc(pool, 1 * MiB, legacy, &p));
    sp_block_info_t info;
    ASSERT_SP_OK(sp__pool_lookup(p, &info));
    EXPECT_EQ(info.stream, nullptr) << "cudaStreamLegacy keys the cache as NULL does";
    ASSERT_SP_OK(sp_free(p));
    void *q = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 1 * MiB, nullptr, &q));
    EXPECT_EQ(q, p) << "a block freed on cudaStreamLegacy is reused on NULL";
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}

// sp_mempool_free_all_blocks with a stream releases that stream's cached segments. The legacy
// stream's blocks are cached as the default stream's, so the legacy handle must release those
// (and only those); the per-thread handle names no one stream and is a bad argument.
TEST_F(ApiAdversary, MempoolFreeAllBlocksTakesCudaPseudoStreamsAsTheCacheKeysThem) {
    sp_mempool_t *pool = make_pool();
    ASSERT_NE(pool, nullptr);
    sp_stream_t side;
    ASSERT_SP_OK(sp_stream_create(0, &side));
    void *a = nullptr, *b = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 1 * MiB, nullptr, &a));
    ASSERT_SP_OK(sp_mempool_malloc(pool, 1 * MiB, side, &b));
    ASSERT_SP_OK(sp_free(a));
    ASSERT_SP_OK(sp_free(b));
    size_t both = sp_mempool_total_bytes(pool);
    ASSERT_GT(both, 0u);

    sp_stats_t before = snap();
    EXPECT_SP_STATUS(sp_mempool_free_all_blocks(pool, per_thread), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("cudaStreamPerThread"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(diff(before, snap()), "") << "nothing released";
    EXPECT_EQ(sp_mempool_total_bytes(pool), both);

    ASSERT_SP_OK(sp_mempool_free_all_blocks(pool, legacy));
    EXPECT_EQ(sp_mempool_total_bytes(pool), both / 2) << "the default stream's segment went";
    ASSERT_SP_OK(sp_mempool_malloc(pool, 1 * MiB, side, &b));
    EXPECT_EQ(sp_mempool_total_bytes(pool), both / 2) << "the side stream's segment stayed";
    ASSERT_SP_OK(sp_free(b));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    ASSERT_SP_OK(sp_stream_destroy(side));
}

// sp_stream_destroy refuses the default stream, and cudaStreamLegacy is that stream (sp_malloc
// keys its blocks as NULL's). On cuda the pseudo handles passed the stream check (CUDA answers
// for them), so the destroy drained every thread's cache, waited for the pending frees, and
// only then failed in cudaStreamDestroy with SP_ERR_DEVICE: a refused call that changed the
// statistics. Both pseudo handles are bad arguments before anything is done.
TEST_F(ApiAdversary, StreamDestroyOfAPseudoStreamIsRefusedBeforeItChangesAnything) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "1MiB"}});
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p)); // idle in this thread's cache: still counted as allocated
    sp_stats_t before = snap();
    EXPECT_SP_STATUS(sp_stream_destroy(legacy), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("default stream"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(diff(before, snap()), "") << "the thread cache was left alone";
    EXPECT_SP_STATUS(sp_stream_destroy(per_thread), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("cudaStreamPerThread"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(diff(before, snap()), "");
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &q));
    EXPECT_EQ(q, p) << "the cached block is still this thread's";
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache()); // the cached block back to the pool (the leak check)
}

// sp_x_stream_label refuses the default stream (shown as 0); cudaStreamLegacy's blocks are the
// default stream's, so a label on handle 1 named a stream no snapshot shows. Both pseudo handles
// are refused, as sp_malloc refuses cudaStreamPerThread.
TEST_F(ApiAdversary, StreamLabelOfAPseudoStreamIsRefused) {
    ASSERT_SP_OK(sp_init());
    EXPECT_SP_STATUS(sp_x_stream_label(legacy, 7), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("default stream"), std::string::npos)
        << sp_last_error();
    EXPECT_SP_STATUS(sp_x_stream_label(per_thread, 7), SP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sp_last_error()).find("cudaStreamPerThread"), std::string::npos)
        << sp_last_error();
}

// sp_stream_destroy releases the stream's free segments, so that a malloc on the dead handle
// misses and the miss path's stream check refuses it (AllocBadInput.
// DestroyedStreamIsRefusedAlsoOnACacheHit). A segment that still held a live block stayed, and
// its free remainder stayed cached under the dead handle: sp_malloc on that handle hit it and
// succeeded, and so would a stream of another device that got the handle. While such segments
// exist, every malloc checks its stream; once they are gone, the hits go back to checking none.
TEST_F(ApiAdversary, DestroyedStreamIsRefusedWhileASegmentOfItHoldsALiveBlock) {
    SP_SKIP_UNLESS_HOST(); // a host stream's pointer is invalid once destroyed; CUDA's may be
                           // reused (a stale CUDA handle is undefined behaviour)
    for (bool tc : {false, true}) {
        SCOPED_TRACE(tc ? "with the thread cache" : "without the thread cache");
        sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", tc ? "1MiB" : "0"}});
        sp_stream_t s;
        ASSERT_SP_OK(sp_stream_create(0, &s));
        void *live = nullptr, *big = nullptr;
        ASSERT_SP_OK(sp_malloc(4096, 0, s, &live));   // a small segment, mostly free
        ASSERT_SP_OK(sp_malloc(3 * MiB, 0, s, &big)); // a large one, mostly free
        ASSERT_SP_OK(sp_stream_destroy(s));
        sp_stats_t before = snap();
        void *r = &r;
        EXPECT_SP_STATUS(sp_malloc(4096, 0, s, &r), SP_ERR_INVALID_ARGUMENT);
        EXPECT_SP_STATUS(sp_malloc(3 * MiB, 0, s, &r), SP_ERR_INVALID_ARGUMENT);
        EXPECT_SP_STATUS(sp_mempool_malloc(sp_default_mempool(0), 4096, s, &r),
                         SP_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(r, (void *)&r) << "output untouched";
        EXPECT_EQ(diff(before, snap()), "") << "refusals change nothing";
        ASSERT_SP_OK(sp_free(live)); // freed onto the dead handle's cache (or a thread cache)
        before = snap();
        EXPECT_SP_STATUS(sp_malloc(4096, 0, s, &r), SP_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(r, (void *)&r);
        EXPECT_EQ(diff(before, snap()), "");
        // The default stream and live streams keep working meanwhile.
        void *q = nullptr;
        ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &q));
        ASSERT_SP_OK(sp_free(q));
        ASSERT_SP_OK(sp_free(big));
        ASSERT_SP_OK(sp_empty_cache()); // the dead handle's segments go
        EXPECT_EQ(sp_memory_reserved(0), 0u);
        ASSERT_SP_OK(sp_shutdown());
    }
}

// sp_torch_segment_free (torch.cuda.MemPool's free) handed any pointer to the device's free, with
// the size the caller gave: a block of sp_torch_malloc or sp_malloc (which lies in a segment
// sympool still holds) was given back under sympool, which later used and freed that memory again
// (on host the next touch crashed: the segment was unmapped); a segment freed twice was freed
// twice. Only a live segment of sp_torch_segment_malloc is freed now, with its recorded size;
// anything else is logged and ignored.
TEST_F(ApiAdversary, TorchSegmentFreeFreesOnlyItsOwnLiveSegments) {
    SP_SKIP_UNLESS_HOST(); // the host backend's own view of its live memory
    ASSERT_SP_OK(sp_init());
    size_t live0 = sp__host_live_bytes(0);
    void *block = nullptr;
    ASSERT_SP_OK(sp_malloc(30 * MiB, 0, nullptr, &block)); // a segment of sympool's cache
    size_t held = sp__host_live_bytes(0);
    sp_torch_segment_free(block, 30 * MiB, 0, nullptr);
    EXPECT_EQ(sp__host_live_bytes(0), held) << "sympool's segment is not PyTorch's to free";
    EXPECT_GE(warnings("not a live segment"), 1u);
    touch(block, 30 * MiB); // still mapped
    ASSERT_SP_OK(sp_free(block));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp__host_live_bytes(0), live0);

    sp__torch_allow_host(true);
    void *seg = sp_torch_segment_malloc(2 * MiB, 0, nullptr);
    sp__torch_allow_host(false);
    ASSERT_NE(seg, nullptr) << sp_last_error();
    sp_torch_segment_free(static_cast<char *>(seg) + 512, 2 * MiB, 0, nullptr); // inside it
    sp_torch_segment_free(seg, 1 * MiB, 0, nullptr); // a wrong size: freed as it was made
    EXPECT_EQ(sp__host_live_bytes(0), live0) << "the whole segment went back";
    EXPECT_EQ(sp__torch_live_segments(), 0);
    size_t before = warnings("not a live segment");
    sp_torch_segment_free(seg, 2 * MiB, 0, nullptr); // twice
    EXPECT_EQ(warnings("not a live segment"), before + 1);
    EXPECT_EQ(sp__host_live_bytes(0), live0);
}

// sp_shutdown ends the host backend, whose fini unmaps every allocation still live, the segments
// of sp_torch_segment_malloc included. The segment registry kept them as live: after the next
// sp_init the addresses are the new session's to hand out again (sympool's own segments among
// them), and a late sp_torch_segment_free of the old segment, found in the registry, freed
// whatever the new session had put there. The ended session's segments are forgotten with it.
TEST_F(ApiAdversary, TorchSegmentOfAnEndedHostSessionIsForgotten) {
    SP_SKIP_UNLESS_HOST(); // the host backend's fini unmaps what is left; CUDA's frees nothing
    ASSERT_SP_OK(sp_init());
    sp__torch_allow_host(true);
    void *old_seg = sp_torch_segment_malloc(2 * MiB, 0, nullptr);
    sp__torch_allow_host(false);
    ASSERT_NE(old_seg, nullptr) << sp_last_error();
    ASSERT_SP_OK(sp_shutdown()); // the host backend unmaps it
    ASSERT_SP_OK(sp_init());
    EXPECT_EQ(sp__torch_live_segments(), 0) << "the ended session's segment is not live";
    // The new session's own memory, at the old segment's address where the kernel gives it
    // again (a 2 MiB segment of sympool's, as the old one).
    size_t live0 = sp__host_live_bytes(0);
    void *block = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &block));
    size_t held = sp__host_live_bytes(0);
    ASSERT_EQ(held - live0, 2 * MiB);
    sp_torch_segment_free(old_seg, 2 * MiB, 0, nullptr); // PyTorch's late free of the old one
    EXPECT_GE(warnings("not a live segment"), 1u);
    EXPECT_EQ(sp__host_live_bytes(0), held) << "nothing of the new session was freed";
    touch(block, 4096);
    ASSERT_SP_OK(sp_free(block));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(sp__host_live_bytes(0), live0);
}

// sp_history_set_user_metadata, sp_history_get_user_metadata and sp_history_record_annotation
// where the library cannot start (CUDA asked for, no GPU): they checked the device against
// sp_device_count(), which reads 0 then, and answered "device 0 does not exist (0 device(s))"
// (SP_ERR_INVALID_ARGUMENT) instead of why sympool cannot start. They give the start's status
// and message now, as sp_malloc and sp_x_history_record_snapshot do.
TEST_F(ApiAdversary, HistoryMetadataAndAnnotationsSayWhyTheLibraryCannotStart) {
    if (sp__device_cuda_available())
        GTEST_SKIP() << "a GPU answers here";
    sp::ScopedEnv env({{"SYMPOOL_DEVICE", "cuda"}});
    sp__device_reset();
    void *p = nullptr;
    sp_status_t want = sp_malloc(4096, 0, nullptr, &p);
    ASSERT_NE(want, SP_SUCCESS);
    ASSERT_NE(want, SP_ERR_INVALID_ARGUMENT);
    std::string why = sp_last_error();
    char buf[8];
    size_t len = 99;
    EXPECT_EQ(sp_history_set_user_metadata(0, "m"), want) << sp_last_error();
    EXPECT_EQ(std::string(sp_last_error()), why);
    EXPECT_EQ(sp_history_get_user_metadata(0, buf, sizeof buf, &len), want) << sp_last_error();
    EXPECT_EQ(std::string(sp_last_error()), why);
    EXPECT_EQ(len, 99u) << "output untouched";
    EXPECT_EQ(sp_history_record_annotation(0, "START", "scope"), want) << sp_last_error();
    EXPECT_EQ(std::string(sp_last_error()), why);
    sp__device_reset();
}

// With the thread cache on, a freed small block stays allocated to its pool, idle in the
// thread's cache. A free of a pointer inside it said "points 512 bytes inside the allocated
// block at ...": the caller, who freed that block, was told it was still allocated. The message
// says it was freed now; nothing changes either way.
TEST_F(ApiAdversary, InteriorFreeOfABlockIdleInAThreadCacheSaysItWasFreed) {
    sp::ScopedEnv env({{"SYMPOOL_THREAD_CACHE", "1MiB"}});
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p)); // idle in this thread's cache
    size_t idle_bytes = 0, idle_blocks = 0;
    ASSERT_SP_OK(sp_x_thread_cache_idle(0, &idle_bytes, &idle_blocks));
    if (idle_blocks != 1) {
        ASSERT_SP_OK(sp_empty_cache());
        GTEST_SKIP() << "the thread cache is off under these settings (SYMPOOL_ALLOC_CONF)";
    }
    sp_stats_t before = snap();
    EXPECT_SP_STATUS(sp_free(static_cast<char *>(p) + 512), SP_ERR_INVALID_USAGE);
    std::string why = sp_last_error();
    EXPECT_NE(why.find("512 bytes inside the freed (idle in a thread cache) block"),
              std::string::npos)
        << why;
    EXPECT_EQ(why.find("allocated block"), std::string::npos) << why;
    EXPECT_EQ(diff(before, snap()), "");
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &q));
    EXPECT_EQ(q, p) << "the idle block is still this thread's to reuse";
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache());
}

// max_non_split_rounding_mb takes values up to SIZE_MAX / 1 MiB (2^44 - 1): the largest means
// "an oversize request takes any oversize block that fits, whatever it wastes". The oversize
// rule compared the block with size + max_non_split_rounding, which wrapped around there, so
// every oversize block was refused and each request grew a new segment beside the cached one.
TEST_F(ApiAdversary, HugestMaxNonSplitRoundingTakesAnyOversizeBlock) {
    for (const char *mb : {"1048576", "17592186044415"}) {
        SCOPED_TRACE(mb);
        std::string conf = std::string("max_split_size_mb:20,max_non_split_rounding_mb:") + mb;
        sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", conf.c_str()}});
        void *big = nullptr, *p = nullptr;
        ASSERT_SP_OK(sp_malloc(100 * MiB, 0, nullptr, &big));
        ASSERT_SP_OK(sp_free(big)); // one oversize block of 100 MiB cached
        ASSERT_SP_OK(sp_malloc(40 * MiB, 0, nullptr, &p));
        EXPECT_EQ(p, big) << "the cached oversize block was not taken";
        EXPECT_EQ(sp_memory_reserved(0), 100 * MiB);
        EXPECT_EQ(stat("num_device_alloc"), 1);
        ASSERT_SP_OK(sp_free(p));
        ASSERT_SP_OK(sp_shutdown());
    }
}

// cudaStreamLegacy is the default stream: sp_malloc and sp_record_stream take it as NULL on every
// backend, and pool.h says sp_stream_synchronize does too. The host backend refused it there
// ("0x1 is not a valid stream of the host backend", SP_ERR_INVALID_ARGUMENT): a program that
// waits for the legacy stream before reusing memory worked on cuda only. Now it completes the
// default stream's work (on host, every device's, as NULL does).
TEST_F(ApiAdversary, StreamSynchronizeTakesTheLegacyStreamAsTheDefaultStream) {
    sp_stream_t side;
    ASSERT_SP_OK(sp_stream_create(0, &side));
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, side, &p));
    ASSERT_SP_OK(sp_record_stream(p, legacy)); // a use on the default stream
    ASSERT_SP_OK(sp_free(p));                  // reusable once the default stream passes it
    EXPECT_SP_OK(sp_stream_synchronize(legacy));
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, side, &q));
    EXPECT_EQ(q, p) << "the legacy stream's synchronize completed the default stream's use";
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_stream_destroy(side));
    ASSERT_SP_OK(sp_empty_cache());
}

// NULL is an empty tensor's storage: PyTorch's recordStream returns for it at once, as sp_free
// does for NULL. It was refused as "not a live sympool block".
TEST_F(ApiAdversary, RecordStreamOfNullIsANoOp) {
    sp_stream_t side;
    ASSERT_SP_OK(sp_stream_create(0, &side));
    sp_stats_t before = snap();
    EXPECT_SP_OK(sp_record_stream(nullptr, side));
    EXPECT_SP_OK(sp_record_stream(nullptr, nullptr));
    EXPECT_EQ(diff(before, snap()), "");
    ASSERT_SP_OK(sp_stream_destroy(side));
}

// sp_record_stream on a block that was freed is refused, but its message asked "(double free?)",
// a free's mistake: the caller freed once and then used the block. It says so now; nothing is
// recorded either way (the block's later reuse does not wait for the stream).
TEST_F(ApiAdversary, RecordStreamOnAFreedBlockIsNotCalledADoubleFree) {
    sp_stream_t side;
    ASSERT_SP_OK(sp_stream_create(0, &side));
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &p)); // large: no thread cache holds it
    ASSERT_SP_OK(sp_free(p));
    sp_stats_t before = snap();
    EXPECT_SP_STATUS(sp_record_stream(p, side), SP_ERR_INVALID_USAGE);
    std::string why = sp_last_error();
    EXPECT_EQ(why.find("double free"), std::string::npos) << why;
    EXPECT_NE(why.find("not allocated (used after its free?)"), std::string::npos) << why;
    EXPECT_EQ(diff(before, snap()), "");
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &q));
    EXPECT_EQ(q, p) << "reused at once: no use was recorded";
    ASSERT_SP_OK(sp_free(q));
    EXPECT_SP_STATUS(sp_free(q), SP_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(sp_last_error()).find("double free?"), std::string::npos)
        << "a free's message is unchanged";
    ASSERT_SP_OK(sp_stream_destroy(side));
    ASSERT_SP_OK(sp_empty_cache());
}

// sp_set_memory_fraction wrote the fraction it refused with "%g", six significant digits: a value
// just above 1 (1.0000001, or the next double after 1.0) read "1 is outside [0, 1]", a message that
// contradicts itself. It now names the value with the digits that tell it apart from 1; the refusal
// changes nothing (the fraction read back, every statistic).
TEST_F(ApiAdversary, RefusedMemoryFractionIsNamedWithTheDigitsThatMakeItWrong) {
    sp_stats_t before = snap();
    for (double bad : {1.0000001, std::nextafter(1.0, 2.0), -1e-7}) {
        SCOPED_TRACE(bad);
        EXPECT_SP_STATUS(sp_set_memory_fraction(bad, 0), SP_ERR_INVALID_ARGUMENT);
        std::string why = sp_last_error();
        EXPECT_EQ(why.find(": 1 is outside"), std::string::npos) << why;
        EXPECT_EQ(why.find(": -0 is outside"), std::string::npos) << why;
        char text[64];
        std::snprintf(text, sizeof text, "%.17g", bad);
        EXPECT_EQ(std::strtod(why.substr(why.find(": ") + 2).c_str(), nullptr), bad)
            << "the message names the value refused: " << why << " (" << text << ")";
        double f = 0.0;
        ASSERT_SP_OK(sp_get_memory_fraction(0, &f));
        EXPECT_EQ(f, 1.0) << "a refused fraction is not set";
    }
    EXPECT_EQ(diff(before, snap()), "");
}

// sp_record_stream passed the backend's stream check straight through: a handle sp_stream_create
// did not make (or one destroyed) left "0x4000 is not a stream of the host backend" in
// sp_last_error() and the WARN line, the one refusal of the pool's calls that did not say which
// call refused what. It names the call and the block now; the status is unchanged and nothing is
// recorded (the block is reused at once after its free).
TEST_F(ApiAdversary, RecordStreamOnABadStreamSaysWhichCallRefusedIt) {
    SP_SKIP_UNLESS_HOST(); // on cuda a handle that is not a live stream is undefined behaviour
    sp_stream_t gone;
    ASSERT_SP_OK(sp_stream_create(0, &gone));
    ASSERT_SP_OK(sp_stream_destroy(gone));
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &p)); // large: no thread cache holds it
    sp_stats_t before = snap();
    for (sp_stream_t bad : {gone, reinterpret_cast<sp_stream_t>(uintptr_t(0xdead0))}) {
        EXPECT_SP_STATUS(sp_record_stream(p, bad), SP_ERR_INVALID_ARGUMENT);
        std::string why = sp_last_error();
        EXPECT_EQ(why.rfind("sp_record_stream(", 0), 0u) << why;
        EXPECT_NE(why.find("is not a stream"), std::string::npos) << why;
    }
    EXPECT_EQ(diff(before, snap()), "");
    ASSERT_SP_OK(sp_free(p));
    void *q = nullptr;
    ASSERT_SP_OK(sp_malloc(3 * MiB, 0, nullptr, &q));
    EXPECT_EQ(q, p) << "reused at once: no use was recorded";
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache());
}

// A device number past the count was refused in the words of the shared check alone ("device 7
// does not exist (the host backend has 1 device(s))"): the only refusals of the pool's calls that
// did not say which call refused, while sp_mempool_create named itself for device -2 and not for
// device 7. Each call that takes a device names itself now; nothing changes.
TEST_F(ApiAdversary, UnknownDeviceRefusalNamesTheCall) {
    const int bad = sp_device_count() + 6;
    sp_stats_t before = snap();
    auto expect_named = [&](const char *call, sp_status_t s) {
        SCOPED_TRACE(call);
        EXPECT_SP_STATUS(s, SP_ERR_INVALID_ARGUMENT);
        std::string why = sp_last_error();
        EXPECT_EQ(
            why.rfind(std::string(call) + ": device " + std::to_string(bad) + " does not exist", 0),
            0u)
            << why;
    };
    void *p = nullptr;
    size_t a = 0, b = 0;
    double f = 0.0;
    sp_stats_t stats;
    sp_device_usage_t usage;
    sp_x_vmm_counters_t vmm;
    sp_stream_t stream = nullptr;
    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    params.device = bad;
    sp_mempool_t *pool = nullptr;
    expect_named("sp_malloc", sp_malloc(64, bad, nullptr, &p));
    expect_named("sp_mempool_create", sp_mempool_create(&params, &pool));
    expect_named("sp_get_memory_info", sp_get_memory_info(bad, &a, &b));
    expect_named("sp_device_usage", sp_device_usage(bad, &usage));
    expect_named("sp_set_memory_fraction", sp_set_memory_fraction(0.5, bad));
    expect_named("sp_get_memory_fraction", sp_get_memory_fraction(bad, &f));
    expect_named("sp_x_empty_cache_device", sp_x_empty_cache_device(bad));
    expect_named("sp_stream_create", sp_stream_create(bad, &stream));
    expect_named("sp_memory_stats", sp_memory_stats(bad, &stats));
    expect_named("sp_reset_peak_memory_stats", sp_reset_peak_memory_stats(bad));
    expect_named("sp_reset_accumulated_memory_stats", sp_reset_accumulated_memory_stats(bad));
    expect_named("sp_x_vmm_counters", sp_x_vmm_counters(bad, &vmm));
    expect_named("sp_x_thread_cache_idle", sp_x_thread_cache_idle(bad, &a, &b));
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(pool, nullptr);
    EXPECT_EQ(stream, nullptr);
    EXPECT_EQ(diff(before, snap()), "");
}
