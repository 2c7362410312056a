// test_expandable_stub.cc: until expandable segments are implemented, asking for them
// (SYMPOOL_ALLOC_CONF=expandable_segments:True) warns once that they are not, instead of being
// accepted silently (issue 12 item 13). The expandable-segments work replaces this file with
// tests of the real thing, together with the one warning in pool/ (expandable_unimplemented).
#include "sp_test.hpp"

class ExpandableStub : public sp::Test {};

TEST_F(ExpandableStub, AskingForExpandableSegmentsWarnsOnce) {
    expect_warnings();
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "max_split_size_mb:64,expandable_segments:True"}});
    ASSERT_SP_OK(sp_init());
    void *p = nullptr;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(warnings("expandable_segments"), 1u);
    EXPECT_EQ(warnings("not implemented"), 1u);
    ASSERT_SP_OK(sp_shutdown());
    ASSERT_SP_OK(sp_init());
    EXPECT_EQ(warnings("expandable_segments"), 1u) << "once per process";
    EXPECT_EQ(sp::stat("max_split_size"), 64 * (int64_t)sp::MiB) << "the other keys still apply";
}

TEST_F(ExpandableStub, NoWarningWithoutIt) {
    sp::ScopedEnv env({{"SYMPOOL_ALLOC_CONF", "expandable_segments:False"}});
    ASSERT_SP_OK(sp_init());
    EXPECT_EQ(warnings("expandable_segments"), 0u);
}
