// test_alloc_events.cc: cross-stream frees. A block used on another stream (sp_record_stream)
// drops allocation/allocated_bytes at free, but stays active and is not reused until that stream
// has passed the free (host: until it is synchronized); the check runs at the next malloc.
// empty_cache and the OOM retry synchronize pending events.
#include "alloc_test_util.hpp"

using namespace sp;

class AllocEvents : public sp::Test {};

TEST_F(AllocEvents, ReuseWaitsForTheOtherStream) {
    SP_SKIP_ON_GPU("host stream model: on a GPU an idle stream's event completes at once");
    sp_stream_t other;
    ASSERT_SP_OK(sp_stream_create(0, &other));
    void *p, *q, *r;
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &p));
    ASSERT_SP_OK(sp_record_stream(p, other));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("allocation.all.current"), 0);
    EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
    EXPECT_EQ(stat("active.all.current"), 1) << "the free is pending";
    EXPECT_EQ(stat("active_bytes.all.current"), 4096);
    EXPECT_EQ(stat("requested_bytes.all.current"), 4096);
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &q));
    EXPECT_NE(q, p) << "the block is reused before the other stream passed the free";
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_stream_synchronize(nullptr)); // the default stream: not the one in use
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &q));
    EXPECT_NE(q, p);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_stream_synchronize(other));
    ASSERT_SP_OK(sp_malloc(4096, 0, nullptr, &r));
    EXPECT_EQ(r, p) << "after the sync the block is free again (and merged back)";
    EXPECT_EQ(stat("active.all.current"), 1);
    EXPECT_EQ(stat("num_sync_all_streams"), 0) << "process_events only queries";
    ASSERT_SP_OK(sp_free(r));
    EXPECT_EQ(stat("inactive_split.all.current"), 0);
    ASSERT_SP_OK(sp_stream_destroy(other));
}

TEST_F(AllocEvents, UseOnTheAllocationStreamIsIgnored) {
    sp_stream_t s;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    void *p, *q;
    ASSERT_SP_OK(sp_malloc(4096, 0, s, &p));
    ASSERT_SP_OK(sp_record_stream(p, s));
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("active.all.current"), 0);
    ASSERT_SP_OK(sp_malloc(4096, 0, s, &q));
    EXPECT_EQ(p, q);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_stream_destroy(s));
}

TEST_F(AllocEvents, EmptyCacheSynchronizesPendingFrees) {
    SP_SKIP_ON_GPU("host stream model: on a GPU an idle stream's event completes at once");
    sp_stream_t a, b;
    ASSERT_SP_OK(sp_stream_create(0, &a));
    ASSERT_SP_OK(sp_stream_create(0, &b));
    void *p;
    ASSERT_SP_OK(sp_malloc(MiB, 0, nullptr, &p));
    ASSERT_SP_OK(sp_record_stream(p, a));
    ASSERT_SP_OK(sp_record_stream(p, b));
    ASSERT_SP_OK(sp_record_stream(p, a)); // recorded once
    ASSERT_SP_OK(sp_free(p));
    EXPECT_EQ(stat("active.all.current"), 1);
    ASSERT_SP_OK(sp_stream_synchronize(a)); // b still holds it
    void *q;
    ASSERT_SP_OK(sp_malloc(MiB, 0, nullptr, &q));
    EXPECT_NE(p, q);
    EXPECT_EQ(stat("active.all.current"), 2);
    ASSERT_SP_OK(sp_free(q));
    ASSERT_SP_OK(sp_empty_cache());
    EXPECT_EQ(stat("active.all.current"), 0);
    EXPECT_EQ(stat("num_sync_all_streams"), 1);
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
    ASSERT_SP_OK(sp_stream_destroy(a));
    ASSERT_SP_OK(sp_stream_destroy(b));
}

TEST_F(AllocEvents, RecordStreamMisuse) {
    expect_warnings();
    int local;
    sp_stream_t s;
    ASSERT_SP_OK(sp_stream_create(0, &s));
    EXPECT_SP_STATUS(sp_record_stream(&local, s), SP_ERR_INVALID_USAGE);
    void *p;
    ASSERT_SP_OK(sp_malloc(512, 0, nullptr, &p));
    // Only the host backend can tell a non-stream: CUDA dereferences any handle it is given
    // (undefined behaviour; a GPU crashes), so on cuda the caller guarantees a live stream.
    if (!sp::on_gpu()) {
        EXPECT_SP_STATUS(sp_record_stream(p, (sp_stream_t)&local), SP_ERR_INVALID_ARGUMENT);
    }
    ASSERT_SP_OK(sp_free(p));
    EXPECT_SP_STATUS(sp_record_stream(p, s), SP_ERR_INVALID_USAGE); // freed block
    ASSERT_SP_OK(sp_stream_destroy(s));
    EXPECT_SP_STATUS(sp_stream_destroy(nullptr), SP_ERR_INVALID_ARGUMENT);
}
