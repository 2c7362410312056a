// test_collectives.cc: sp_allreduce, sp_allgather, sp_reduce_scatter and sp_broadcast under
// mpirun (2, 4, 8 ranks, host backend) against straightforward references computed on every
// rank: every dtype and op, odd counts, in place, data that differs on every rank; fp16/bf16
// against the float result rounded once (bit-exact where the float sum is exact); and every
// argument check returning an error on ALL ranks (a rank that hung would time the test out).
#include "mpi_util.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include <sympool/collectives.h>
void sp__coll_test_fail_scratch(bool on);
void sp__coll_avg_divide(void *buf, size_t n, sp_dtype_t dtype, int nranks);
}

namespace {

const sp_dtype_t kAllTypes[] = {SP_INT8,   SP_UINT8,   SP_INT32,    SP_UINT32,  SP_INT64,
                                SP_UINT64, SP_FLOAT16, SP_BFLOAT16, SP_FLOAT32, SP_FLOAT64};
const sp_redop_t kAllOps[] = {SP_SUM, SP_PROD, SP_MIN, SP_MAX, SP_AVG};
// 8: 64 bytes of an 8-byte type, the most a call's data travels inside the agreement round
// (SP_AGREE_PAYLOAD_MAX); 7 of the 8-byte types and 1 of all fit too, 1001 never does.
const size_t kCounts[] = {1, 7, 8, 1001};

size_t type_size(sp_dtype_t t) {
    switch (t) {
    case SP_INT8:
    case SP_UINT8:
        return 1;
    case SP_FLOAT16:
    case SP_BFLOAT16:
        return 2;
    case SP_INT32:
    case SP_UINT32:
    case SP_FLOAT32:
        return 4;
    default:
        return 8;
    }
}
bool is_unsigned(sp_dtype_t t) {
    return t == SP_UINT8 || t == SP_UINT32 || t == SP_UINT64;
}
bool is_int(sp_dtype_t t) {
    return t <= SP_UINT64;
}
bool is_half(sp_dtype_t t) {
    return t == SP_FLOAT16 || t == SP_BFLOAT16;
}

// fp16 or bf16: the reference codec's format (Fmt, dec16, enc16 in mpi_util.hpp)
Fmt fmt_of(sp_dtype_t t) {
    return t == SP_BFLOAT16 ? Fmt{8, 7} : Fmt{5, 10};
}

// ---- typed access through doubles (all test values are exact in every type) --------------
void put(sp_dtype_t t, void *buf, size_t i, double v) {
    switch (t) {
    case SP_INT8:
        ((int8_t *)buf)[i] = (int8_t)v;
        break;
    case SP_UINT8:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    case SP_INT32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case SP_UINT32:
        ((uint32_t *)buf)[i] = (uint32_t)v;
        break;
    case SP_INT64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case SP_UINT64:
        ((uint64_t *)buf)[i] = (uint64_t)v;
        break;
    case SP_FLOAT16:
    case SP_BFLOAT16:
        ((uint16_t *)buf)[i] = enc16(v, fmt_of(t));
        break;
    case SP_FLOAT32:
        ((float *)buf)[i] = (float)v;
        break;
    case SP_FLOAT64:
        ((double *)buf)[i] = v;
        break;
    }
}
double get(sp_dtype_t t, const void *buf, size_t i) {
    switch (t) {
    case SP_INT8:
        return ((const int8_t *)buf)[i];
    case SP_UINT8:
        return ((const uint8_t *)buf)[i];
    case SP_INT32:
        return ((const int32_t *)buf)[i];
    case SP_UINT32:
        return ((const uint32_t *)buf)[i];
    case SP_INT64:
        return (double)((const int64_t *)buf)[i];
    case SP_UINT64:
        return (double)((const uint64_t *)buf)[i];
    case SP_FLOAT16:
    case SP_BFLOAT16:
        return dec16(((const uint16_t *)buf)[i], fmt_of(t));
    case SP_FLOAT32:
        return ((const float *)buf)[i];
    case SP_FLOAT64:
        return ((const double *)buf)[i];
    }
    return 0;
}

// Per-rank inputs, different on every rank and element; small enough that no sum or product
// overflows int8 at 8 ranks, and exact in every type.
double value(sp_dtype_t t, sp_redop_t op, int rank, size_t i) {
    if (op == SP_PROD) {
        if (rank == 0)
            return 2;
        return (!is_unsigned(t) && (i + (size_t)rank) % 2) ? -1 : 1;
    }
    if (op == SP_MIN || op == SP_MAX) {
        double v = (double)((rank * 5 + (int)(i % 97) * 3) % 11);
        return is_unsigned(t) ? v : v - 5;
    }
    double v = (double)((rank * 13 + (int)(i % 89) * 7) % 9);
    return is_unsigned(t) ? v : v - 4;
}

// v rounded to the type (float types only).
double round_to(sp_dtype_t t, double v) {
    if (is_half(t))
        return dec16(enc16((float)v, fmt_of(t)), fmt_of(t));
    return t == SP_FLOAT32 ? (double)(float)v : v;
}

// ncclAvg's pre-multiplier: 1/n rounded to the type.
double avg_scale(sp_dtype_t t, int n) {
    return round_to(t, 1.0 / n);
}

// The expected reduction of element i over all ranks.
double reference(sp_dtype_t t, sp_redop_t op, int n, size_t i, size_t index_base = 0) {
    double acc = value(t, op, 0, index_base + i);
    for (int r = 1; r < n; r++) {
        double v = value(t, op, r, index_base + i);
        switch (op) {
        case SP_SUM:
        case SP_AVG:
            acc += v;
            break;
        case SP_PROD:
            acc *= v;
            break;
        case SP_MIN:
            acc = std::fmin(acc, v);
            break;
        case SP_MAX:
            acc = std::fmax(acc, v);
            break;
        }
    }
    if (op == SP_AVG) {
        if (is_int(t))
            return std::trunc(acc / n); // integer AVG: truncating division of the sum
        // Floating AVG is ncclAvg: every value times 1/n rounded to the type, each product
        // rounded to the type, then summed as SUM sums (halves: in float, rounded once).
        double s = avg_scale(t, n), sum = 0;
        for (int r = 0; r < n; r++)
            sum += round_to(t, value(t, op, r, index_base + i) * s);
        return t == SP_FLOAT64 ? sum : round_to(t, sum);
    }
    return acc;
}

// How far a correct result may lie from reference(): 0 except for float32/float64 AVG on a rank
// count that is not a power of two. There 1/n is inexact, so the rounded products have more
// bits than the type and every partial sum rounds; MPI may associate the sum in any order
// (MPI_SUM makes no promise for floats), so each of the n - 1 additions may round either way by
// up to half an ulp of a partial sum, which is at most the sum of the magnitudes.
double tolerance(sp_dtype_t t, sp_redop_t op, int n, size_t i, size_t index_base = 0) {
    if (op != SP_AVG || (t != SP_FLOAT32 && t != SP_FLOAT64) || (n & (n - 1)) == 0)
        return 0;
    double s = avg_scale(t, n), mag = 0;
    for (int r = 0; r < n; r++)
        mag += std::fabs(round_to(t, value(t, op, r, index_base + i) * s));
    double eps = t == SP_FLOAT32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53);
    return (double)n * mag * eps; // n - 1 additions and the final rounding, half an ulp each
}

// got is want, or within tol of it (a NaN is never close).
bool close_to(double got, double want, double tol) {
    return got == want || std::fabs(got - want) <= tol;
}

// A sympool device buffer that frees itself.
struct Buf {
    void *p = nullptr;
    Buf(size_t bytes, int dev) {
        sp_status_t s = sp_malloc(bytes, dev, nullptr, &p);
        EXPECT_EQ(s, SP_SUCCESS) << sp::describe(s);
    }
    ~Buf() { sp_free(p); }
    char *c() { return static_cast<char *>(p); }
};

class Collectives : public WorldTest {
  protected:
    void SetUp() override {
        WorldTest::SetUp();
        // These tests fill and read buffers from the host: the host backend's memory. On a GPU
        // the same calls go to NCCL (coll_nccl.c) on device memory.
        if (sp::on_gpu())
            GTEST_SKIP() << "host-memory reference checks; run on the host backend";
    }
    // True on every rank iff ok on every rank: a failed check ends the test on all ranks
    // together, instead of leaving the others waiting in the next collective.
    bool all_ok(bool ok) {
        int v = ok ? 1 : 0, out = 0;
        MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        return out == 1;
    }
};

// ---- data -------------------------------------------------------------------------------

// SP_AVG's division of the integer sums, at rank counts a job this test cannot start here: by
// the count itself, truncating toward zero (NCCL's FuncSumPostDiv). The count cast to the element
// type made int8's 128 ranks -128 (-128 / -128 = 1, not -1) and uint8's 256 ranks 0 (SIGFPE).
TEST(CollectivesAvg, IntegersDivideByTheRankCountItself) {
    int8_t i8[] = {-128, -127, 127, -1};
    sp__coll_avg_divide(i8, 4, SP_INT8, 128);
    EXPECT_EQ(i8[0], -1);
    EXPECT_EQ(i8[1], 0);
    EXPECT_EQ(i8[2], 0);
    EXPECT_EQ(i8[3], 0);
    int8_t i8b[] = {-127, 100};
    sp__coll_avg_divide(i8b, 2, SP_INT8, 3);
    EXPECT_EQ(i8b[0], -42); // toward zero
    EXPECT_EQ(i8b[1], 33);
    uint8_t u8[] = {255, 200};
    sp__coll_avg_divide(u8, 2, SP_UINT8, 256);
    EXPECT_EQ(u8[0], 0);
    EXPECT_EQ(u8[1], 0);
    uint8_t u8b[] = {200};
    sp__coll_avg_divide(u8b, 1, SP_UINT8, 300); // (uint8_t)300 is 44: 200 / 44 = 4
    EXPECT_EQ(u8b[0], 0);
    uint32_t u32[] = {4000000000u};
    sp__coll_avg_divide(u32, 1, SP_UINT32, 3);
    EXPECT_EQ(u32[0], 1333333333u);
    int32_t i32[] = {INT32_MIN, -7};
    sp__coll_avg_divide(i32, 2, SP_INT32, 2);
    EXPECT_EQ(i32[0], INT32_MIN / 2);
    EXPECT_EQ(i32[1], -3);
    int64_t i64[] = {INT64_MIN};
    sp__coll_avg_divide(i64, 1, SP_INT64, 1000);
    EXPECT_EQ(i64[0], INT64_MIN / 1000);
    uint64_t u64[] = {UINT64_MAX};
    sp__coll_avg_divide(u64, 1, SP_UINT64, 1 << 30);
    EXPECT_EQ(u64[0], UINT64_MAX / (1u << 30));
}

TEST_F(Collectives, AllreduceEveryDtypeOpCountInPlace) {
    for (sp_dtype_t t : kAllTypes)
        for (sp_redop_t op : kAllOps)
            for (size_t count : kCounts)
                for (int in_place = 0; in_place < 2; in_place++) {
                    size_t bytes = count * type_size(t);
                    Buf send(bytes, dev_), recv(bytes, dev_);
                    for (size_t i = 0; i < count; i++)
                        put(t, send.p, i, value(t, op, rank_, i));
                    void *dst = in_place ? send.p : recv.p;
                    sp_status_t s = sp_allreduce(w_, send.p, dst, count, t, op, nullptr);
                    ASSERT_EQ(s, SP_SUCCESS) << sp::describe(s);
                    size_t bad = 0;
                    for (size_t i = 0; i < count; i++) {
                        double want = reference(t, op, n_, i), got = get(t, dst, i);
                        if (!close_to(got, want, tolerance(t, op, n_, i)) && bad++ < 3)
                            ADD_FAILURE() << "dtype " << t << " op " << op << " count " << count
                                          << " in_place " << in_place << " [" << i << "]: got "
                                          << got << " want " << want;
                    }
                    ASSERT_TRUE(all_ok(bad == 0)) << "wrong elements on some rank";
                }
}

// A small allreduce travels inside the agreement round and every rank reduces the inputs
// itself: the order must be one fixed order, so that a float sum whose value depends on the
// association comes out bit for bit the same on every rank (and equal to x0 + (x1 + ...)).
TEST_F(Collectives, SmallAllreduceGivesTheSameBitsOnEveryRank) {
    const double mine[4] = {1e16, 1.0, -1e16, 3.0};
    Buf buf(2 * sizeof(double), dev_);
    double *d = static_cast<double *>(buf.p);
    d[0] = mine[rank_ % 4];
    d[1] = rank_ % 2 ? 0.1 : 0.7;
    ASSERT_SP_OK(sp_allreduce(w_, d, d, 2, SP_FLOAT64, SP_SUM, nullptr));
    double want = mine[(n_ - 1) % 4];
    for (int p = n_ - 2; p >= 0; p--)
        want = mine[p % 4] + want;
    EXPECT_EQ(d[0], want);
    std::vector<double> all(2 * (size_t)n_);
    MPI_Allgather(d, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, MPI_COMM_WORLD);
    for (int p = 0; p < n_; p++)
        EXPECT_EQ(std::memcmp(&all[2 * (size_t)p], d, 2 * sizeof(double)), 0) << "rank " << p;
}

TEST_F(Collectives, ReduceScatterEveryDtypeOpCountInPlace) {
    for (sp_dtype_t t : kAllTypes)
        for (sp_redop_t op : kAllOps)
            for (size_t count : kCounts)
                for (int in_place = 0; in_place < 2; in_place++) {
                    size_t sz = type_size(t), total = count * (size_t)n_;
                    Buf send(total * sz, dev_), recv(count * sz, dev_);
                    for (size_t j = 0; j < total; j++)
                        put(t, send.p, j, value(t, op, rank_, j));
                    void *dst = in_place ? send.c() + (size_t)rank_ * count * sz : recv.p;
                    sp_status_t s = sp_reduce_scatter(w_, send.p, dst, count, t, op, nullptr);
                    EXPECT_EQ(s, SP_SUCCESS) << sp::describe(s);
                    ASSERT_TRUE(all_ok(s == SP_SUCCESS));
                    size_t bad = 0;
                    for (size_t i = 0; i < count; i++) {
                        double want = reference(t, op, n_, i, (size_t)rank_ * count);
                        double got = get(t, dst, i);
                        if (!close_to(got, want, tolerance(t, op, n_, i, (size_t)rank_ * count)) &&
                            bad++ < 3)
                            ADD_FAILURE() << "dtype " << t << " op " << op << " count " << count
                                          << " in_place " << in_place << " [" << i << "]: got "
                                          << got << " want " << want;
                    }
                    ASSERT_TRUE(all_ok(bad == 0)) << "wrong elements on some rank";
                }
}

// Raw bytes that differ on every rank and element.
uint8_t pattern(int rank, size_t byte) {
    return (uint8_t)(rank * 37 + byte * 11 + 1);
}

TEST_F(Collectives, AllgatherEveryDtypeCountInPlace) {
    for (sp_dtype_t t : kAllTypes)
        for (size_t count : kCounts)
            for (int in_place = 0; in_place < 2; in_place++) {
                size_t bytes = count * type_size(t);
                Buf send(bytes, dev_), recv(bytes * (size_t)n_, dev_);
                memset(recv.p, 0xee, bytes * (size_t)n_);
                char *src = in_place ? recv.c() + (size_t)rank_ * bytes : send.c();
                for (size_t b = 0; b < bytes; b++)
                    src[b] = (char)pattern(rank_, b);
                ASSERT_SP_OK(sp_allgather(w_, src, recv.p, count, t, nullptr));
                for (int r = 0; r < n_; r++)
                    for (size_t b = 0; b < bytes; b++)
                        ASSERT_EQ((uint8_t)recv.c()[(size_t)r * bytes + b], pattern(r, b))
                            << "dtype " << t << " count " << count << " rank " << r;
            }
}

TEST_F(Collectives, BroadcastEveryDtypeCountRootInPlace) {
    for (sp_dtype_t t : kAllTypes)
        for (size_t count : kCounts)
            for (int root = 0; root < n_; root += (n_ > 2 ? n_ - 1 : 1))
                for (int in_place = 0; in_place < 2; in_place++) {
                    size_t bytes = count * type_size(t);
                    Buf send(bytes, dev_), recv(bytes, dev_);
                    for (size_t b = 0; b < bytes; b++) {
                        send.c()[b] = (char)pattern(rank_, b);
                        recv.c()[b] = (char)pattern(rank_ + 100, b);
                    }
                    void *src = in_place ? recv.p : send.p;
                    if (in_place)
                        memcpy(recv.p, send.p, bytes);
                    // Non-root ranks' send is not used: pass NULL there to show it.
                    ASSERT_SP_OK(sp_broadcast(w_, rank_ == root ? src : nullptr, recv.p, count, t,
                                              root, nullptr));
                    for (size_t b = 0; b < bytes; b++)
                        ASSERT_EQ((uint8_t)recv.c()[b], pattern(root, b))
                            << "dtype " << t << " count " << count << " root " << root;
                }
}

// fp16/bf16 SUM and AVG of random values whose float sum is exact: the result must be the exact
// sum rounded once to nearest-even (and AVG the sum of the values pre-multiplied by the rounded
// 1/n, each product rounded, as ncclAvg does), bit for bit.
TEST_F(Collectives, HalfTypesRoundTheFloatResultOnce) {
    const size_t count = 4099; // odd, and large enough to cover many roundings
    for (sp_dtype_t t : {SP_FLOAT16, SP_BFLOAT16})
        for (sp_redop_t op : {SP_SUM, SP_AVG}) {
            Fmt f = fmt_of(t);
            auto val = [&](int r, size_t i) {
                uint32_t h = (uint32_t)(r * 2654435761u) ^ (uint32_t)(i * 40503u + 17u);
                h ^= h >> 13;
                h *= 0x5bd1e995u;
                h ^= h >> 15;
                // magnitude in [1/8, 8), random sign, rounded to the format: exact in float
                double m = std::ldexp(1.0 + (h & 0xffff) / 65536.0, (int)((h >> 16) % 6) - 3);
                double v = (h >> 31) ? -m : m;
                return dec16(enc16(v, f), f);
            };
            Buf buf(count * 2, dev_);
            for (size_t i = 0; i < count; i++)
                put(t, buf.p, i, val(rank_, i));
            ASSERT_SP_OK(sp_allreduce(w_, buf.p, buf.p, count, t, op, nullptr));
            for (size_t i = 0; i < count; i++) {
                double sum = 0;
                for (int r = 0; r < n_; r++)
                    sum += op == SP_SUM ? val(r, i) : round_to(t, val(r, i) * avg_scale(t, n_));
                double q = sum;
                uint16_t want = enc16(q, f), got = ((uint16_t *)buf.p)[i];
                ASSERT_EQ(got, want)
                    << "dtype " << t << " op " << op << " [" << i << "] sum " << sum;
            }
        }
}

// fp16/bf16 arithmetic goes through a float scratch of 2^20 elements: counts past it take
// several rounds (allreduce in place, reduce_scatter in place at this rank's slot).
TEST_F(Collectives, HalfTypesAcrossScratchChunks) {
    const size_t count = ((size_t)1 << 20) + 3;
    sp_dtype_t t = SP_BFLOAT16;
    sp_redop_t op = SP_SUM;
    Buf a(count * 2, dev_);
    for (size_t i = 0; i < count; i++)
        put(t, a.p, i, value(t, op, rank_, i));
    ASSERT_SP_OK(sp_allreduce(w_, a.p, a.p, count, t, op, nullptr));
    for (size_t i = 0; i < count; i += 997)
        ASSERT_EQ(get(t, a.p, i), reference(t, op, n_, i)) << i;
    ASSERT_EQ(get(t, a.p, count - 1), reference(t, op, n_, count - 1));

    // The reduce-scatter's input is n_ chunks and more on every rank: at 8 ranks on two cores its
    // arithmetic alone took 13 s of CI's plain stage (s45); the chunking is the same at 2 and 4.
    if (n_ > 4)
        return;
    t = SP_FLOAT16;
    op = SP_AVG;
    Buf rs(count * 2 * (size_t)n_, dev_);
    for (size_t j = 0; j < count * (size_t)n_; j++)
        put(t, rs.p, j, value(t, op, rank_, j));
    char *mine = rs.c() + (size_t)rank_ * count * 2;
    EXPECT_SP_OK(sp_reduce_scatter(w_, rs.p, mine, count, t, op, nullptr));
    size_t bad = 0;
    for (size_t i = 0; i < count; i += 997)
        bad += get(t, mine, i) != reference(t, op, n_, i, (size_t)rank_ * count);
    bad += get(t, mine, count - 1) != reference(t, op, n_, count - 1, (size_t)rank_ * count);
    EXPECT_TRUE(all_ok(bad == 0)) << bad << " wrong elements on this rank";
}

// Infinities, NaN, subnormals, overflow and signed zero through fp16/bf16 reductions.
TEST_F(Collectives, HalfTypesSpecialValues) {
    SP_SKIP_BELOW_RANKS(2);
    for (sp_dtype_t t : {SP_FLOAT16, SP_BFLOAT16}) {
        Fmt f = fmt_of(t);
        double tiny = dec16(1, f);                                     // smallest subnormal
        double big = t == SP_FLOAT16 ? 60000.0 : std::ldexp(1.5, 127); // two of them overflow
        const size_t k = 6;
        Buf sum(k * 2, dev_), mn(k * 2, dev_), mx(k * 2, dev_);
        double in[k] = {rank_ == 0 ? NAN : 1.0,      // NaN propagates
                        rank_ == 0 ? INFINITY : 1.0, // inf + finite = inf
                        rank_ == 0 ? INFINITY : (rank_ == 1 ? -INFINITY : 0.0), // inf - inf
                        tiny,                    // n subnormals add up exactly
                        big,                     // overflow rounds to inf
                        rank_ % 2 ? -0.0 : 0.0}; // -0 < +0 for min/max
        for (size_t i = 0; i < k; i++) {
            put(t, sum.p, i, in[i]);
            put(t, mn.p, i, in[i]);
            put(t, mx.p, i, in[i]);
        }
        ASSERT_SP_OK(sp_allreduce(w_, sum.p, sum.p, k, t, SP_SUM, nullptr));
        ASSERT_SP_OK(sp_allreduce(w_, mn.p, mn.p, k, t, SP_MIN, nullptr));
        ASSERT_SP_OK(sp_allreduce(w_, mx.p, mx.p, k, t, SP_MAX, nullptr));
        EXPECT_TRUE(std::isnan(get(t, sum.p, 0)));
        EXPECT_EQ(get(t, sum.p, 1), INFINITY);
        EXPECT_TRUE(std::isnan(get(t, sum.p, 2)));
        EXPECT_EQ(get(t, sum.p, 3), tiny * n_);
        EXPECT_EQ(get(t, sum.p, 4), INFINITY);
        EXPECT_TRUE(std::isnan(get(t, mn.p, 0)));
        EXPECT_TRUE(std::isnan(get(t, mx.p, 0)));
        EXPECT_EQ(get(t, mx.p, 1), INFINITY);
        EXPECT_EQ(get(t, mn.p, 2), -INFINITY);
        EXPECT_EQ(((uint16_t *)mn.p)[5], 0x8000u); // -0
        EXPECT_EQ(((uint16_t *)mx.p)[5], 0x0000u); // +0
    }
}

// Buffers from a symmetric pool (the training case) work like any sympool buffer.
TEST_F(Collectives, AllreduceOnSymmetricBuffers) {
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sym_pool_create(w_, "grads", /*use_on_oom=*/false, &pool));
    const size_t count = 1001;
    void *buf = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool, count * sizeof(float), nullptr, &buf));
    for (size_t i = 0; i < count; i++)
        ((float *)buf)[i] = (float)(rank_ + 1);
    ASSERT_SP_OK(sp_allreduce(w_, buf, buf, count, SP_FLOAT32, SP_SUM, nullptr));
    for (size_t i = 0; i < count; i++)
        ASSERT_EQ(((float *)buf)[i], (float)(n_ * (n_ + 1) / 2));
    EXPECT_SP_OK(sp_free(buf));
    EXPECT_SP_OK(sp_symmetric_mempool_destroy(pool));
}

// ---- argument checks: every rank returns, every rank reports ----------------------------

// ---- data staged through the backend's copies: the same checks on the cuda backend ----------

// The data tests above read and write buffers from the CPU, which only the host backend allows;
// these stage every buffer with sp::copy_in/copy_out (cudaMemcpy on cuda), so on a GPU they
// check NCCL's results for every dtype, op and in-place form against the same references.
class CollectivesStaged : public WorldTest {
  protected:
    bool all_ok(bool ok) {
        int v = ok ? 1 : 0, out = 0;
        MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        return out == 1;
    }
    void sync() {
        if (sp::on_gpu())
            ASSERT_SP_OK(sp_stream_synchronize(nullptr));
    }
};

TEST_F(CollectivesStaged, AllreduceAndReduceScatterEveryDtypeOp) {
    const size_t count = 1001;
    for (sp_dtype_t t : kAllTypes)
        for (sp_redop_t op : kAllOps)
            for (int in_place = 0; in_place < 2; in_place++) {
                size_t sz = type_size(t), total = count * (size_t)n_;
                std::vector<char> host(total * sz), out(total * sz);
                // allreduce
                for (size_t i = 0; i < count; i++)
                    put(t, host.data(), i, value(t, op, rank_, i));
                Buf send(count * sz, dev_), recv(count * sz, dev_);
                sp::copy_in(send.p, host.data(), count * sz);
                void *dst = in_place ? send.p : recv.p;
                ASSERT_SP_OK(sp_allreduce(w_, send.p, dst, count, t, op, nullptr));
                sync();
                sp::copy_out(out.data(), dst, count * sz);
                size_t bad = 0;
                for (size_t i = 0; i < count; i++) {
                    double want = reference(t, op, n_, i), got = get(t, out.data(), i);
                    if (!close_to(got, want, tolerance(t, op, n_, i)) && bad++ < 3)
                        ADD_FAILURE()
                            << "allreduce dtype " << t << " op " << op << " in_place " << in_place
                            << " [" << i << "]: got " << got << " want " << want;
                }
                ASSERT_TRUE(all_ok(bad == 0)) << "allreduce: wrong elements on some rank";
                // reduce_scatter
                for (size_t j = 0; j < total; j++)
                    put(t, host.data(), j, value(t, op, rank_, j));
                Buf rs(total * sz, dev_), mine(count * sz, dev_);
                sp::copy_in(rs.p, host.data(), total * sz);
                void *rdst = in_place ? rs.c() + (size_t)rank_ * count * sz : mine.p;
                ASSERT_SP_OK(sp_reduce_scatter(w_, rs.p, rdst, count, t, op, nullptr));
                sync();
                sp::copy_out(out.data(), rdst, count * sz);
                for (size_t i = 0; i < count; i++) {
                    double want = reference(t, op, n_, i, (size_t)rank_ * count);
                    double got = get(t, out.data(), i);
                    if (!close_to(got, want, tolerance(t, op, n_, i, (size_t)rank_ * count)) &&
                        bad++ < 3)
                        ADD_FAILURE()
                            << "reduce_scatter dtype " << t << " op " << op << " in_place "
                            << in_place << " [" << i << "]: got " << got << " want " << want;
                }
                ASSERT_TRUE(all_ok(bad == 0)) << "reduce_scatter: wrong elements on some rank";
            }
}

TEST_F(CollectivesStaged, AllgatherAndBroadcastMoveEveryByte) {
    const size_t bytes = 4099;
    std::vector<char> host(bytes * (size_t)n_), out(bytes * (size_t)n_);
    for (size_t b = 0; b < bytes; b++)
        host[b] = (char)(rank_ * 37 + b * 11 + 1);
    Buf send(bytes, dev_), recv(bytes * (size_t)n_, dev_);
    sp::copy_in(send.p, host.data(), bytes);
    ASSERT_SP_OK(sp_allgather(w_, send.p, recv.p, bytes, SP_UINT8, nullptr));
    sync();
    sp::copy_out(out.data(), recv.p, bytes * (size_t)n_);
    for (int r = 0; r < n_; r++)
        for (size_t b = 0; b < bytes; b += 7)
            ASSERT_EQ((uint8_t)out[(size_t)r * bytes + b], (uint8_t)(r * 37 + b * 11 + 1)) << r;
    int root = n_ - 1;
    ASSERT_SP_OK(
        sp_broadcast(w_, rank_ == root ? send.p : nullptr, recv.p, bytes, SP_UINT8, root, nullptr));
    sync();
    sp::copy_out(out.data(), recv.p, bytes);
    for (size_t b = 0; b < bytes; b++)
        ASSERT_EQ((uint8_t)out[b], (uint8_t)(root * 37 + b * 11 + 1)) << b;
}

// SP_AVG is ncclAvg on both backends (collectives.h): with three ranks, bf16(1/3) = 0.333984375,
// so 100 * bf16(1/3) rounds to 33.5 and three of those sum to 100.5, where sum-then-divide would
// give 100. Integers divide the sum: (7 + 7 + 8) / 3 = 7.
TEST_F(CollectivesStaged, AvgPreMultipliesAsNcclDoesOnThreeRanks) {
    if (n_ < 3)
        GTEST_SKIP() << "needs 3 ranks (1/3 is inexact)";
    int world_rank = rank_;
    MPI_Comm sub = MPI_COMM_NULL;
    ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, world_rank < 3 ? 0 : MPI_UNDEFINED, world_rank, &sub),
              MPI_SUCCESS);
    if (sub == MPI_COMM_NULL) {
        MPI_Barrier(MPI_COMM_WORLD);
        return;
    }
    sp_world_t *w3 = nullptr;
    ASSERT_SP_OK(sp_world_from_comm(sub, &w3));
    uint16_t in16 = enc16(100.0, fmt_of(SP_BFLOAT16)), out16 = 0;
    int32_t in32 = world_rank == 2 ? 8 : 7, out32 = 0;
    Buf b16(2, sp_world_device(w3)), b32(4, sp_world_device(w3));
    sp::copy_in(b16.p, &in16, 2);
    sp::copy_in(b32.p, &in32, 4);
    EXPECT_SP_OK(sp_allreduce(w3, b16.p, b16.p, 1, SP_BFLOAT16, SP_AVG, nullptr));
    EXPECT_SP_OK(sp_allreduce(w3, b32.p, b32.p, 1, SP_INT32, SP_AVG, nullptr));
    sync();
    sp::copy_out(&out16, b16.p, 2);
    sp::copy_out(&out32, b32.p, 4);
    EXPECT_EQ(dec16(out16, fmt_of(SP_BFLOAT16)), 100.5) << "bf16 avg of 100, 100, 100";
    EXPECT_EQ(out32, 7);
    EXPECT_SP_OK(sp_world_finalize(w3));
    MPI_Comm_free(&sub);
    MPI_Barrier(MPI_COMM_WORLD);
}

class CollectiveArgs : public Collectives {
  protected:
    void SetUp() override {
        Collectives::SetUp();
        if (IsSkipped())
            return;
        expect_warnings();
    }
    // After a refused call, the ranks are still in step: a real allreduce works.
    void still_in_step() {
        Buf b(64, dev_);
        ((int32_t *)b.p)[0] = 1;
        ASSERT_SP_OK(sp_allreduce(w_, b.p, b.p, 1, SP_INT32, SP_SUM, nullptr));
        EXPECT_EQ(((int32_t *)b.p)[0], n_);
    }
};

TEST_F(CollectiveArgs, NullWorld) {
    int x = 0;
    EXPECT_SP_STATUS(sp_allreduce(nullptr, &x, &x, 1, SP_INT32, SP_SUM, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_allgather(nullptr, &x, &x, 1, SP_INT32, nullptr), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_reduce_scatter(nullptr, &x, &x, 1, SP_INT32, SP_SUM, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_broadcast(nullptr, &x, &x, 1, SP_INT32, 0, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
}

TEST_F(CollectiveArgs, DtypeOpRootRangeAndCountOverflow) {
    Buf b(1024, dev_);
    EXPECT_SP_STATUS(sp_allreduce(w_, b.p, b.p, 4, (sp_dtype_t)42, SP_SUM, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_allreduce(w_, b.p, b.p, 4, SP_INT32, (sp_redop_t)-1, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_reduce_scatter(w_, b.p, b.c() + 512, 4, SP_INT32, (sp_redop_t)9, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_broadcast(w_, b.p, b.p, 4, SP_INT32, n_, nullptr), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_broadcast(w_, b.p, b.p, 4, SP_INT32, -1, nullptr), SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_allreduce(w_, b.p, b.p, SIZE_MAX / 2, SP_INT32, SP_SUM, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_allgather(w_, b.p, b.p, SIZE_MAX / 8 / 2, SP_UINT64, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    still_in_step();
}

TEST_F(CollectiveArgs, CountZeroIsANoOpEvenWithNullBuffers) {
    EXPECT_SP_OK(sp_allreduce(w_, nullptr, nullptr, 0, SP_FLOAT32, SP_SUM, nullptr));
    EXPECT_SP_OK(sp_allgather(w_, nullptr, nullptr, 0, SP_FLOAT32, nullptr));
    EXPECT_SP_OK(sp_reduce_scatter(w_, nullptr, nullptr, 0, SP_FLOAT32, SP_MAX, nullptr));
    EXPECT_SP_OK(sp_broadcast(w_, nullptr, nullptr, 0, SP_FLOAT32, 0, nullptr));
    EXPECT_EQ(warnings(), 0u);
    still_in_step();
}

TEST_F(CollectiveArgs, NullBufferOnOneRankFailsEverywhere) {
    SP_SKIP_BELOW_RANKS(2);
    Buf b(256, dev_);
    void *send = rank_ == 1 ? nullptr : b.p;
    EXPECT_SP_STATUS(sp_allreduce(w_, send, b.p, 8, SP_INT32, SP_SUM, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    if (rank_ != 1) {
        EXPECT_NE(std::string(sp_last_error()).find("rank 1"), std::string::npos)
            << sp_last_error();
    } else {
        EXPECT_NE(std::string(sp_last_error()).find("NULL"), std::string::npos) << sp_last_error();
    }
    still_in_step();
}

// sp_malloc refuses a handle that is not a stream; a collective must too, on every rank, even
// where the backend would never touch the stream (host) and for a no-op count.
TEST_F(CollectiveArgs, BadStreamOnOneRankFailsEverywhere) {
    if (std::string(sp_backend_name()) != "host")
        GTEST_SKIP() << "a garbage handle is only safe to pass on the host backend";
    Buf sb(256, dev_), rb(256, dev_);
    int bad = n_ - 1;
    sp_stream_t garbage = (sp_stream_t)(uintptr_t)0x1234;
    sp_stream_t st = rank_ == bad ? garbage : nullptr;
    for (size_t count : {(size_t)1, (size_t)0}) {
        for (int kind = 0; kind < 4; kind++) {
            sp_status_t s = SP_SUCCESS;
            switch (kind) {
            case 0:
                s = sp_allreduce(w_, sb.p, rb.p, count, SP_INT32, SP_SUM, st);
                break;
            case 1:
                s = sp_broadcast(w_, sb.p, rb.p, count, SP_INT32, 0, st);
                break;
            case 2:
                s = sp_allgather(w_, sb.p, rb.p, count, SP_INT32, st);
                break;
            case 3:
                s = sp_reduce_scatter(w_, sb.p, rb.p, count, SP_INT32, SP_SUM, st);
                break;
            }
            EXPECT_EQ(s, SP_ERR_INVALID_ARGUMENT)
                << "kind " << kind << " count " << count << ": " << sp::describe(s);
            std::string msg = sp_last_error();
            const char *want = rank_ == bad ? "is not a stream" : "rejected its arguments";
            EXPECT_NE(msg.find(want), std::string::npos) << msg;
        }
    }
    // A stream sympool made for this rank's device is accepted.
    sp_stream_t good = nullptr;
    ASSERT_SP_OK(sp_stream_create(dev_, &good));
    EXPECT_SP_OK(sp_allreduce(w_, sb.p, rb.p, 8, SP_INT32, SP_SUM, good));
    EXPECT_SP_OK(sp_stream_destroy(good));
    still_in_step();
}

// A rank that cannot get the host path's scratch (half-precision arithmetic, an in-place
// reduce-scatter, a float AVG reduce-scatter) finds out before the agreement, so every rank fails
// the call: it used to return alone after the agreement while its peers waited in the MPI
// collective for good.
TEST_F(CollectiveArgs, ScratchOutOfHostMemoryOnOneRankFailsEverywhere) {
    const size_t count = 64;
    Buf sb(count * (size_t)n_ * 8, dev_), rb(count * 8, dev_);
    memset(sb.p, 0, count * (size_t)n_ * 8);
    int bad = n_ - 1;
    for (int kind = 0; kind < 4; kind++) {
        SCOPED_TRACE("kind " + std::to_string(kind));
        if (rank_ == bad)
            sp__coll_test_fail_scratch(true);
        sp_status_t s = SP_SUCCESS;
        switch (kind) {
        case 0:
            s = sp_allreduce(w_, sb.p, rb.p, count, SP_FLOAT16, SP_SUM, nullptr);
            break;
        case 1:
            s = sp_reduce_scatter(w_, sb.p, rb.p, count, SP_BFLOAT16, SP_SUM, nullptr);
            break;
        case 2: // in place: this rank's slot of send
            s = sp_reduce_scatter(w_, sb.p, sb.c() + (size_t)rank_ * count * 4, count, SP_INT32,
                                  SP_SUM, nullptr);
            break;
        case 3:
            s = sp_reduce_scatter(w_, sb.p, rb.p, count, SP_FLOAT32, SP_AVG, nullptr);
            break;
        }
        sp__coll_test_fail_scratch(false);
        std::string msg = sp_last_error();
        if (rank_ == bad) {
            EXPECT_EQ(s, SP_ERR_SYSTEM) << sp::describe(s);
            EXPECT_NE(msg.find("out of host memory"), std::string::npos) << msg;
        } else {
            EXPECT_EQ(s, SP_ERR_INVALID_ARGUMENT) << sp::describe(s);
            EXPECT_NE(msg.find("had no host memory"), std::string::npos) << msg;
        }
    }
    still_in_step();
}

TEST_F(CollectiveArgs, ForeignBufferOnOneRankFailsEverywhere) {
    Buf sb(256, dev_), rb(256, dev_);
    std::vector<int32_t> host(64, 0);
    int bad = n_ - 1;
    void *recv = rank_ == bad ? (void *)host.data() : rb.p;
    for (int kind = 0; kind < 4; kind++) {
        sp_status_t s = SP_SUCCESS;
        switch (kind) {
        case 0:
            s = sp_allreduce(w_, sb.p, recv, 8, SP_INT32, SP_SUM, nullptr);
            break;
        case 1:
            s = sp_broadcast(w_, sb.p, recv, 8, SP_INT32, 0, nullptr);
            break;
        case 2:
            s = sp_allgather(w_, sb.p, recv, 1, SP_INT32, nullptr);
            break;
        case 3:
            s = sp_reduce_scatter(w_, sb.p, recv, 1, SP_INT32, SP_SUM, nullptr);
            break;
        }
        EXPECT_EQ(s, SP_ERR_INVALID_ARGUMENT) << "kind " << kind << ": " << sp::describe(s);
        std::string msg = sp_last_error();
        if (rank_ == bad) {
            EXPECT_NE(msg.find("is not sympool device memory of rank " + std::to_string(bad)),
                      std::string::npos)
                << msg;
        } else {
            EXPECT_NE(msg.find("rank " + std::to_string(bad)), std::string::npos) << msg;
        }
    }
    EXPECT_EQ(host[0], 0); // nothing was written into the foreign buffer
    still_in_step();
}

// A block of a symmetric pool whose world was finalized while it was live: the finalize released
// the pool's segments (MPI_Win_free on host), so the block's memory is gone although the block is
// still sympool's until sp_free. A collective took it for sympool device memory and MPI (or the
// fused path's copy) read or wrote the unmapped window: a segfault on that rank.
TEST_F(CollectiveArgs, BlockOfAFinalizedWorldsSymmetricPoolFailsEverywhere) {
    sp_world_t *w2 = nullptr;
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w2));
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sym_pool_create(w2, "gone", false, &pool));
    void *stale = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool, 4096, nullptr, &stale));
    ASSERT_SP_OK(sp_world_finalize(w2)); // warns: it releases the pool's segments under the block
    Buf sb(4096, dev_), rb(4096, dev_);
    int bad = n_ - 1;
    for (size_t count : {(size_t)8, (size_t)1000}) { // inside the agreement round, and not
        for (int kind = 0; kind < 4; kind++) {
            void *send = rank_ == bad && kind % 2 == 0 ? stale : sb.p;
            void *recv = rank_ == bad && kind % 2 == 1 ? stale : rb.p;
            size_t per_rank = kind >= 2 ? count / (size_t)n_ : count;
            sp_status_t s = SP_SUCCESS;
            switch (kind) {
            case 0:
                s = sp_allreduce(w_, send, recv, count, SP_INT32, SP_SUM, nullptr);
                break;
            case 1:
                s = sp_broadcast(w_, send, recv, count, SP_INT32, 0, nullptr);
                break;
            case 2:
                s = sp_reduce_scatter(w_, send, recv, per_rank, SP_INT32, SP_SUM, nullptr);
                break;
            case 3:
                s = sp_allgather(w_, send, recv, per_rank, SP_INT32, nullptr);
                break;
            }
            EXPECT_EQ(s, SP_ERR_INVALID_ARGUMENT)
                << "kind " << kind << " count " << count << ": " << sp::describe(s);
            std::string msg = sp_last_error();
            const std::string want =
                rank_ == bad ? "world was finalized" : "rank " + std::to_string(bad);
            EXPECT_NE(msg.find(want), std::string::npos) << msg;
        }
    }
    EXPECT_SP_OK(sp_free(stale)); // still sympool's block: freeing it is bookkeeping only
    still_in_step();
}

// sp_world_finalize releases the registrations of a symmetric pool left alive, and with them the
// memory under its segments, but pool/'s books kept the free ones: the pool still counted their
// bytes, and the segment index kept their ranges, which a segment mapped later at the same
// address (the next world's window) met: the index's assertion in a Debug build
// (SymThreads.ConcurrentFinalizeOfOneWorldRunsOnce, from its second round). The free ones leave
// the books with their memory now; one holding a live block stays (the test above).
TEST_F(CollectiveArgs, FinalizeTakesAPoolsFreeSegmentsOffTheBooks) {
    sp_world_t *w2 = nullptr;
    ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w2));
    sp_mempool_t *pool = nullptr;
    ASSERT_SP_OK(sym_pool_create(w2, "left", false, &pool));
    void *p = nullptr;
    ASSERT_SP_OK(sp_symmetric_malloc(pool, 4096, nullptr, &p));
    ASSERT_SP_OK(sp_free(p));
    ASSERT_GT(sp_mempool_total_bytes(pool), 0u);
    ASSERT_SP_OK(sp_world_finalize(w2)); // warns: it releases the pool's segments
    EXPECT_EQ(sp_mempool_total_bytes(pool), 0u) << "no segment counted whose memory is gone";
    still_in_step();
}

TEST_F(CollectiveArgs, BufferTooSmallForTheCount) {
    SP_SKIP_BELOW_RANKS(2);
    Buf b(40, dev_); // 10 int32
    EXPECT_SP_STATUS(sp_allreduce(w_, b.p, b.p, 11, SP_INT32, SP_SUM, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    EXPECT_SP_STATUS(sp_allgather(w_, b.p, b.p, 10, SP_INT32, nullptr), SP_ERR_INVALID_ARGUMENT);
    // Interior pointer: 8 int32 starting at element 4 runs past the end.
    EXPECT_SP_STATUS(sp_allreduce(w_, b.c() + 16, b.c() + 16, 8, SP_INT32, SP_SUM, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    still_in_step();
}

TEST_F(CollectiveArgs, OverlapThatIsNotInPlace) {
    SP_SKIP_BELOW_RANKS(2);
    Buf b(4096, dev_);
    // allreduce: recv shifted by one element overlaps send.
    EXPECT_SP_STATUS(sp_allreduce(w_, b.p, b.c() + 4, 16, SP_INT32, SP_SUM, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    // allgather: send inside recv but not at this rank's slot.
    size_t slot = (size_t)((rank_ + 1) % n_) * 16 * 4;
    EXPECT_SP_STATUS(sp_allgather(w_, b.c() + slot, b.p, 16, SP_INT32, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    // reduce_scatter: recv inside send but not at this rank's slot.
    EXPECT_SP_STATUS(sp_reduce_scatter(w_, b.p, b.c() + slot, 16, SP_INT32, SP_SUM, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    // broadcast root: overlapping send and recv (the other ranks learn it from the agreement).
    EXPECT_SP_STATUS(sp_broadcast(w_, b.p, b.c() + 8, 16, SP_INT32, 0, nullptr),
                     SP_ERR_INVALID_ARGUMENT);
    still_in_step();
}

// send == recv is in place for an all-gather or a reduce-scatter on rank 0 only (this rank's
// slot): elsewhere the all-gather's input lies in rank 0's slot of recv. It was taken as in
// place on every rank, and a large all-gather (the MPI path) gave every rank wrong data.
TEST_F(CollectiveArgs, SendEqualsRecvIsInPlaceOnRankZeroOnly) {
    SP_SKIP_BELOW_RANKS(2);
    for (size_t count : {(size_t)4, (size_t)100000}) { // in the agreement round, and not
        Buf b(count * 4 * (size_t)n_, dev_);
        EXPECT_SP_STATUS(sp_allgather(w_, b.p, b.p, count, SP_INT32, nullptr),
                         SP_ERR_INVALID_ARGUMENT);
        if (rank_ != 0) {
            EXPECT_NE(std::string(sp_last_error()).find("send == recv + rank*count"),
                      std::string::npos)
                << sp_last_error();
        }
        EXPECT_SP_STATUS(sp_reduce_scatter(w_, b.p, b.p, count, SP_INT32, SP_SUM, nullptr),
                         SP_ERR_INVALID_ARGUMENT);
        if (rank_ != 0) {
            EXPECT_NE(std::string(sp_last_error()).find("recv == send + rank*recv_count"),
                      std::string::npos)
                << sp_last_error();
        }
    }
    still_in_step();
}

TEST_F(CollectiveArgs, RanksDisagreeOnCountDtypeOpRoot) {
    SP_SKIP_BELOW_RANKS(2);
    Buf b(4096, dev_);
    size_t count = rank_ == 0 ? 9 : 8;
    EXPECT_SP_STATUS(sp_allreduce(w_, b.p, b.p, count, SP_INT32, SP_SUM, nullptr), SP_ERR_MISMATCH);
    EXPECT_NE(std::string(sp_last_error()).find("count"), std::string::npos);
    EXPECT_SP_STATUS(
        sp_allreduce(w_, b.p, b.p, 8, rank_ == 0 ? SP_FLOAT32 : SP_INT32, SP_SUM, nullptr),
        SP_ERR_MISMATCH);
    // Dtypes and ops by name (the message gave the enum's numbers: "smallest 2, largest 8").
    std::string msg = sp_last_error();
    EXPECT_NE(msg.find("int32 to float32"), std::string::npos) << msg;
    EXPECT_NE(msg.find(rank_ == 0 ? "this rank: float32" : "this rank: int32"), std::string::npos)
        << msg;
    EXPECT_SP_STATUS(sp_allreduce(w_, b.p, b.p, 8, SP_INT32, rank_ == 0 ? SP_MAX : SP_SUM, nullptr),
                     SP_ERR_MISMATCH);
    msg = sp_last_error();
    EXPECT_NE(msg.find("sum to max"), std::string::npos) << msg;
    EXPECT_NE(msg.find(rank_ == 0 ? "this rank: max" : "this rank: sum"), std::string::npos) << msg;
    EXPECT_SP_STATUS(sp_broadcast(w_, b.p, b.p, 8, SP_INT32, rank_ == 0 ? 1 : 0, nullptr),
                     SP_ERR_MISMATCH);
    // A small allreduce's agreement record carries its input (up to 64 bytes) and a larger
    // one's none, so the records have different lengths: still a mismatch on every rank, never
    // an MPI truncation error on the ranks that sent the shorter one.
    EXPECT_SP_STATUS(sp_allreduce(w_, b.p, b.p, rank_ == 0 ? 16 : 1, SP_INT32, SP_SUM, nullptr),
                     SP_ERR_MISMATCH);
    EXPECT_SP_STATUS(sp_allreduce(w_, b.p, b.p, rank_ == 0 ? 16 : 512, SP_INT32, SP_SUM, nullptr),
                     SP_ERR_MISMATCH);
    // Zero on one rank only is a disagreement too, not a silent no-op there and a hang elsewhere.
    EXPECT_SP_STATUS(sp_allreduce(w_, b.p, b.p, rank_ == 0 ? 0 : 8, SP_INT32, SP_SUM, nullptr),
                     SP_ERR_MISMATCH);
    still_in_step();
}

} // namespace
