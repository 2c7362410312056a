// test_lookup.cc: sp__pool_lookup (interior pointers through the per-segment block index, block
// starts through the pointer map) stays right while blocks split and merge under it, and
// sp_torch_free's single locked lookup frees only block starts.
#include "sp_test.hpp"

#include <vector>

extern "C" {
#include "pool/pool.h"
}

using namespace sp;

class Lookup : public sp::Test {};

TEST_F(Lookup, InteriorPointersFollowSplitsAndMerges) {
    std::vector<void *> b(4000);
    for (auto &p : b)
        ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p)); // one 2 MiB segment, 4000 blocks
    auto check = [&](const char *when) {
        for (size_t i = 0; i < b.size(); i++) {
            if (!b[i])
                continue;
            sp_block_info_t info;
            ASSERT_EQ(sp__pool_lookup((char *)b[i] + 100, &info), SP_SUCCESS)
                << when << " block " << i;
            ASSERT_EQ(info.block_base, b[i]) << when << " block " << i;
            ASSERT_SP_OK(sp__pool_lookup(b[i], &info));
            ASSERT_EQ(info.block_base, b[i]);
        }
    };
    check("first");
    // Free every other block, then merge runs of them, then split them again with other sizes:
    // the index built above goes stale, and every answer must still be right.
    for (size_t i = 0; i < b.size(); i += 2) {
        void *p = b[i];
        b[i] = nullptr;
        ASSERT_SP_OK(sp_free(p));
        sp_block_info_t info;
        EXPECT_SP_STATUS(sp__pool_lookup((char *)p + 8, &info), SP_ERR_INVALID_USAGE);
    }
    check("after frees");
    for (size_t i = 1; i < 2000; i += 2) {
        ASSERT_SP_OK(sp_free(b[i]));
        b[i] = nullptr;
    }
    check("after merges");
    for (size_t i = 0; i < 1000; i++)
        ASSERT_SP_OK(sp_malloc(1024, 0, nullptr, &b[2 * i]));
    check("after new splits");
    for (auto p : b)
        if (p)
            ASSERT_SP_OK(sp_free(p));
}

TEST_F(Lookup, TorchFreeChecksInOneLookupAndFreesOnlyStarts) {
    expect_warnings();
    void *p = sp_torch_malloc(4096, 0, nullptr);
    ASSERT_NE(p, nullptr);
    sp_torch_free((char *)p + 512, 4096, 0, nullptr); // interior: explained, nothing freed
    EXPECT_EQ(stat("allocation.all.current"), 1);
    EXPECT_GE(warnings("inside"), 1u);
    size_t w = warnings();
    sp_torch_free(p, 4096, 0, nullptr);
    EXPECT_EQ(warnings(), w) << "a matching free does not warn";
    EXPECT_EQ(stat("allocation.all.current"), 0);
}

TEST_F(Lookup, TorchFreeWithWrongDeviceStillFrees) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_HOST_DEVICES", "2"}});
    SP_SKIP_UNLESS_HOST();
    void *p = sp_torch_malloc(4096, 1, nullptr);
    ASSERT_NE(p, nullptr);
    sp_torch_free(p, 4096, 0, nullptr);
    EXPECT_GE(warnings("on device 1"), 1u);
    EXPECT_EQ(stat("allocation.all.current", 1), 0);
}
