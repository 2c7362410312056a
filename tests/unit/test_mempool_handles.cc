// test_mempool_handles.cc: MemPool handles are checked before use. A handle
// sympool never gave out is SP_ERR_INVALID_ARGUMENT, a handle whose pool is gone (released by
// sp_shutdown, also after a new initialization) is SP_ERR_INVALID_USAGE; neither is ever read
// through, so AddressSanitizer and UndefinedBehaviorSanitizer stay quiet on every call below.
#include "sp_test.hpp"

#include <cstdint>
#include <cstring>
#include <string>

using sp::MiB;

namespace {

// Every call that takes a pool, with the status each must give for `pool`.
void expect_every_call(sp_mempool_t *pool, sp_status_t want) {
    void *p = &p;
    EXPECT_SP_STATUS(sp_mempool_destroy(pool), want);
    EXPECT_SP_STATUS(sp_mempool_begin(pool), want);
    EXPECT_SP_STATUS(sp_mempool_end(pool), want);
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, 4096, nullptr, &p), want);
    EXPECT_EQ(p, (void *)&p);
    EXPECT_SP_STATUS(sp_mempool_free_all_blocks(pool, nullptr), want);
    EXPECT_SP_STATUS(sp_mempool_set_limit(pool, MiB), want);
    EXPECT_SP_STATUS(sp_mempool_dump_snapshot(pool, "/tmp/sp_never_written.pickle"), want);
    // The queries cannot return a status: they answer zero and leave the reason behind.
    sp_mempool_id_t id = sp_mempool_id(pool);
    EXPECT_EQ(id.first, 0u);
    EXPECT_EQ(id.second, 0u);
    EXPECT_EQ(sp_mempool_use_count(pool), 0);
    EXPECT_FALSE(sp_mempool_is_symmetric(pool));
    EXPECT_EQ(sp_mempool_used_bytes(pool), 0u);
    EXPECT_EQ(sp_mempool_total_bytes(pool), 0u);
    EXPECT_EQ(sp_mempool_free_bytes(pool), 0u);
    EXPECT_EQ(sp_mempool_n_free_blocks(pool), 0u);
    EXPECT_EQ(sp_mempool_get_limit(pool), 0u);
    EXPECT_NE(std::string(sp_last_error()), "");
}

} // namespace

class MempoolHandles : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        expect_warnings();
    }
};

TEST_F(MempoolHandles, GarbageHandlesAreInvalidArguments) {
    // Memory that holds anything at all: a pointer sympool never returned must not be read.
    alignas(64) unsigned char junk[512];
    std::memset(junk, 0xA5, sizeof junk);
    expect_every_call(reinterpret_cast<sp_mempool_t *>(junk), SP_ERR_INVALID_ARGUMENT);
    expect_every_call(reinterpret_cast<sp_mempool_t *>((uintptr_t)0x1000), SP_ERR_INVALID_ARGUMENT);
    // A pointer into a real pool's neighbourhood is still not a handle.
    sp_mempool_t *pool = sp::make_named_pool("real");
    ASSERT_NE(pool, nullptr);
    expect_every_call(reinterpret_cast<sp_mempool_t *>(reinterpret_cast<char *>(pool) + 8),
                      SP_ERR_INVALID_ARGUMENT);
    ASSERT_SP_OK(sp_mempool_destroy(pool));
}

TEST_F(MempoolHandles, NullStaysAnInvalidArgument) {
    expect_every_call(nullptr, SP_ERR_INVALID_ARGUMENT);
}

TEST_F(MempoolHandles, HandleUsedAfterShutdownIsStale) {
    sp_mempool_t *pool = sp::make_named_pool("gone");
    ASSERT_NE(pool, nullptr);
    sp_mempool_t *dflt = sp_default_mempool(0);
    ASSERT_NE(dflt, nullptr);
    ASSERT_SP_OK(sp_shutdown());
    expect_every_call(pool, SP_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(sp_last_error()).find("sp_shutdown"), std::string::npos)
        << sp_last_error();
    expect_every_call(dflt, SP_ERR_INVALID_USAGE);
    // A new session, with new pools: the old handles stay stale and never alias the new ones.
    sp_mempool_t *fresh[8];
    for (auto &f : fresh) {
        f = sp::make_named_pool("fresh");
        ASSERT_NE(f, nullptr);
    }
    expect_every_call(pool, SP_ERR_INVALID_USAGE);
    sp_mempool_t *dflt2 = sp_default_mempool(0);
    ASSERT_NE(dflt2, nullptr);
    EXPECT_EQ(sp_mempool_use_count(dflt2), 1);
    for (auto &f : fresh)
        ASSERT_SP_OK(sp_mempool_destroy(f));
}

TEST_F(MempoolHandles, DestroyedPoolIsInvalidUsageNotACrash) {
    sp_mempool_t *pool = sp::make_named_pool("once");
    ASSERT_NE(pool, nullptr);
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    EXPECT_SP_STATUS(sp_mempool_destroy(pool), SP_ERR_INVALID_USAGE);
    void *p = nullptr;
    EXPECT_SP_STATUS(sp_mempool_malloc(pool, 4096, nullptr, &p), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(sp_mempool_begin(pool), SP_ERR_INVALID_USAGE);
    EXPECT_SP_STATUS(sp_mempool_set_limit(pool, 4096), SP_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(sp_last_error()).find("was destroyed"), std::string::npos)
        << sp_last_error();
    EXPECT_EQ(sp_mempool_get_limit(pool), 0u) << "the refused limit was set anyway";
    // Holding no segment, it was released at the destroy (PyTorch erases a freeable pool once
    // its segments are gone): the queries answer 0 and say why (test_mempool_gc.cc).
    EXPECT_EQ(sp_mempool_id(pool).second, 0u);
    EXPECT_NE(std::string(sp_last_error()).find("destroyed"), std::string::npos) << sp_last_error();
}

TEST_F(MempoolHandles, ValidHandlesStillWork) {
    sp_mempool_t *pool = sp::make_named_pool("ok");
    ASSERT_NE(pool, nullptr);
    void *p = nullptr;
    ASSERT_SP_OK(sp_mempool_malloc(pool, 4096, nullptr, &p));
    EXPECT_EQ(sp_mempool_used_bytes(pool), 4096u);
    EXPECT_EQ(sp_mempool_use_count(pool), 1);
    ASSERT_SP_OK(sp_free(p));
    ASSERT_SP_OK(sp_mempool_free_all_blocks(pool, nullptr));
    ASSERT_SP_OK(sp_mempool_destroy(pool));
    EXPECT_EQ(sp_mempool_use_count(sp_default_mempool(0)), 1);
}
