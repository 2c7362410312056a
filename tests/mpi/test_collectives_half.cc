// test_collectives_half.cc: the fp16/bf16 codec the host collectives reduce with (half.c),
// checked against an independent codec written with double arithmetic: every one of the 65536
// fp16 and bf16 patterns widens exactly; narrowing rounds to nearest-even at every boundary
// (ties, subnormals, the overflow threshold, NaN). Runs under mpirun with the other MPI tests,
// but communicates nothing.
#include "mpi_util.hpp"

#include <cmath>
#include <cstring>
#include <random>

extern "C" {
#include "collectives/dtype.h"
}

namespace {

const Fmt kHalf{5, 10}, kBf16{8, 7};

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

TEST(HalfCodec, EveryPatternWidensExactlyAndNarrowsBack) {
    for (uint32_t b = 0; b < 65536; b++) {
        uint16_t h = (uint16_t)b;
        float fh = sp__half_to_float(h), fb = sp__bf16_to_float(h);
        double rh = dec16(h, kHalf), rb = dec16(h, kBf16);
        if (std::isnan(rh)) {
            ASSERT_TRUE(std::isnan(fh)) << std::hex << b;
            ASSERT_TRUE(std::isnan(sp__half_to_float(sp__float_to_half(fh)))) << std::hex << b;
            ASSERT_EQ(sp__float_to_half(fh) & 0x8000, h & 0x8000) << "NaN keeps its sign";
        } else {
            ASSERT_EQ((double)fh, rh) << std::hex << b;
            ASSERT_EQ(std::signbit(fh), std::signbit(rh)) << std::hex << b;
            ASSERT_EQ(sp__float_to_half(fh), h) << std::hex << b;
        }
        if (std::isnan(rb)) {
            ASSERT_TRUE(std::isnan(fb)) << std::hex << b;
            ASSERT_TRUE(std::isnan(sp__bf16_to_float(sp__float_to_bf16(fb)))) << std::hex << b;
        } else {
            ASSERT_EQ((double)fb, rb) << std::hex << b;
            ASSERT_EQ(sp__float_to_bf16(fb), h) << std::hex << b;
        }
    }
}

// Midpoints between neighbours (ties go to the even one), and points just off them.
TEST(HalfCodec, TiesAndNeighboursRoundToNearestEven) {
    for (Fmt f : {kHalf, kBf16}) {
        bool bf = f.ebits == 8;
        for (uint32_t b = 0; b < 0x7c00u + (bf ? 0x380u : 0); b++) {
            double lo = dec16((uint16_t)b, f), hi = dec16((uint16_t)(b + 1), f);
            if (std::isinf(hi) || std::isnan(hi) || std::isnan(lo))
                break;
            float mid = (float)((lo + hi) / 2); // exact in float for both formats
            if ((double)mid != (lo + hi) / 2)
                continue;
            uint16_t want = (b % 2 == 0) ? (uint16_t)b : (uint16_t)(b + 1);
            uint16_t got = bf ? sp__float_to_bf16(mid) : sp__float_to_half(mid);
            ASSERT_EQ(got, want) << (bf ? "bf16" : "fp16") << " tie above " << std::hex << b;
            float above = std::nextafter(mid, INFINITY), below = std::nextafter(mid, 0.0f);
            ASSERT_EQ(bf ? sp__float_to_bf16(above) : sp__float_to_half(above), (uint16_t)(b + 1));
            ASSERT_EQ(bf ? sp__float_to_bf16(below) : sp__float_to_half(below), (uint16_t)b);
        }
    }
}

TEST(HalfCodec, RandomFloatsMatchTheReference) {
    std::mt19937 rng(1234);
    for (int i = 0; i < 500000; i++) {
        float x = from_bits(rng());
        if (std::isnan(x)) {
            EXPECT_TRUE(std::isnan(sp__half_to_float(sp__float_to_half(x))));
            EXPECT_TRUE(std::isnan(sp__bf16_to_float(sp__float_to_bf16(x))));
            continue;
        }
        ASSERT_EQ(sp__float_to_half(x), enc16(x, kHalf)) << x;
        ASSERT_EQ(sp__float_to_bf16(x), enc16(x, kBf16)) << x;
    }
}

TEST(HalfCodec, Boundaries) {
    EXPECT_EQ(sp__float_to_half(65504.0f), 0x7bffu);   // largest finite
    EXPECT_EQ(sp__float_to_half(65519.996f), 0x7bffu); // just below the threshold
    EXPECT_EQ(sp__float_to_half(65520.0f), 0x7c00u);   // the tie rounds to even: infinity
    EXPECT_EQ(sp__float_to_half(-1e9f), 0xfc00u);
    EXPECT_EQ(sp__float_to_half(std::ldexp(1.0f, -24)), 0x0001u); // smallest subnormal
    EXPECT_EQ(sp__float_to_half(std::ldexp(1.0f, -25)), 0x0000u); // tie to even: zero
    EXPECT_EQ(sp__float_to_half(std::ldexp(1.5f, -25)), 0x0001u);
    EXPECT_EQ(sp__float_to_half(-0.0f), 0x8000u);
    EXPECT_EQ(sp__float_to_half(std::ldexp(1023.5f, -24)), 0x0400u); // rounds up into normal
    EXPECT_EQ(sp__float_to_bf16(from_bits(0x7f7fffffu)), 0x7f80u);   // FLT_MAX -> inf
    EXPECT_EQ(sp__float_to_bf16(from_bits(0x3f808000u)), 0x3f80u);   // tie, even stays
    EXPECT_EQ(sp__float_to_bf16(from_bits(0x3f818000u)), 0x3f82u);   // tie, odd rounds up
    EXPECT_EQ(sp__float_to_bf16(from_bits(0x7f800001u)) & 0x7fc0u, 0x7fc0u); // sNaN -> qNaN
    EXPECT_EQ(sp__float_to_half(from_bits(0x7f800001u)) & 0x7e00u, 0x7e00u);
}

} // namespace
