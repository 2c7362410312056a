// mpi_util.hpp: helpers shared by the MPI test binaries (tests/mpi/test_*.cc, each linked with
// mpi_main.cc, which has initialized MPI): this process's rank and size in MPI_COMM_WORLD, the
// min and max of a value over the ranks, fixtures that own a world (and a symmetric pool) for one
// test and release them in TearDown, and an independent fp16/bf16 reference codec. Header-only:
// every function is inline, so any test file may include it. No state, no locks.
#ifndef SP_MPI_UTIL_HPP
#define SP_MPI_UTIL_HPP

#include <mpi.h> // before extern "C": the header pulls in C++ bindings

#include <cmath>
#include <cstdint>

#include "sp_test.hpp"

extern "C" {
#include "symmetric/symmetric.h"
#include <sympool/symmetric.h>
#include <sympool/world.h>
}

// ---- MPI_COMM_WORLD as the tests see it ---------------------------------------------------

inline int mpi_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

inline int mpi_size() {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

// min and max of a value over the ranks, in one allreduce (max as the min of the negation).
inline void rank_minmax(long long v, long long *lo, long long *hi) {
    long long in[2] = {v, -v}, out[2];
    MPI_Allreduce(in, out, 2, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    *lo = out[0];
    *hi = -out[1];
}

// This process's symmetric-pool counters summed over its devices.
inline sp_sym_counters_t sym_counters() {
    sp_sym_counters_t c;
    sp__symmetric_counters(-1, &c);
    return c;
}

// A symmetric pool on w with default parameters but its name and use_on_oom (collective).
inline sp_status_t sym_pool_create(sp_world_t *w, const char *name, bool use_on_oom,
                                   sp_mempool_t **pool_p) {
    sp_mempool_params_t p;
    sp_mempool_params_init(&p);
    p.use_on_oom = use_on_oom;
    p.name = name;
    return sp_symmetric_mempool_create(w, &p, pool_p);
}

// ---- fixtures ------------------------------------------------------------------------------

// A world on MPI_COMM_WORLD for the length of one test, with its rank, size and device.
class WorldTest : public sp::Test {
  protected:
    void SetUp() override {
        sp::Test::SetUp();
        ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &w_));
        rank_ = sp_world_rank(w_);
        n_ = sp_world_size(w_);
        dev_ = sp_world_device(w_);
    }
    void TearDown() override {
        if (w_)
            EXPECT_SP_OK(sp_world_finalize(w_));
        sp::Test::TearDown();
    }
    sp_world_t *w_ = nullptr;          // owned; finalized in TearDown unless a test took it
    int rank_ = -1, n_ = 0, dev_ = -1; // of w_
};

// A symmetric pool and its world, made by the test (make_pool) and released in TearDown unless
// the test already released them (and set the pointers to nullptr).
class SymPoolTest : public sp::Test {
  protected:
    void TearDown() override {
        if (pool_) {
            EXPECT_SP_OK(sp_symmetric_mempool_destroy(pool_));
        }
        if (world_) {
            EXPECT_SP_OK(sp_world_finalize(world_));
        }
        sp::Test::TearDown();
    }
    // world_init: the world from sp_world_init on the MPI mpi_main.cc initialized (which it must
    // neither re-initialize nor finalize); otherwise from sp_world_from_comm(MPI_COMM_WORLD).
    void make_pool(bool world_init, bool use_on_oom, const char *name) {
        if (world_init) {
            ASSERT_SP_OK(sp_world_init(nullptr, nullptr, &world_));
        } else {
            ASSERT_SP_OK(sp_world_from_comm(MPI_COMM_WORLD, &world_));
        }
        ASSERT_SP_OK(sym_pool_create(world_, name, use_on_oom, &pool_));
    }
    sp_world_t *world_ = nullptr;  // owned unless nullptr
    sp_mempool_t *pool_ = nullptr; // owned unless nullptr; symmetric, on world_
};

// ---- an independent 16-bit float codec: arithmetic in double, ties to even by nearbyint ----

struct Fmt {
    int ebits, mbits; // exponent and mantissa bits: fp16 {5, 10}, bf16 {8, 7}
};

inline double dec16(uint16_t b, Fmt f) {
    int bias = (1 << (f.ebits - 1)) - 1;
    int e = (b >> f.mbits) & ((1 << f.ebits) - 1);
    int m = b & ((1 << f.mbits) - 1);
    double s = (b & 0x8000) ? -1.0 : 1.0;
    if (e == (1 << f.ebits) - 1)
        return m ? NAN : s * INFINITY;
    if (e == 0)
        return s * std::ldexp((double)m, 1 - bias - f.mbits);
    return s * std::ldexp((double)(m + (1 << f.mbits)), e - bias - f.mbits);
}

// Round a double to the format, ties to even; NaN becomes the quiet NaN of x's sign.
inline uint16_t enc16(double x, Fmt f) {
    int bias = (1 << (f.ebits - 1)) - 1, emin = 1 - bias;
    uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    uint16_t inf = (uint16_t)(sign | (((1 << f.ebits) - 1) << f.mbits));
    if (std::isnan(x))
        return (uint16_t)(inf | (1 << (f.mbits - 1)));
    double a = std::fabs(x);
    if (std::isinf(a))
        return inf;
    if (a == 0)
        return sign;
    int e = std::ilogb(a);
    if (e < emin)
        e = emin;
    double q = std::ldexp(1.0, e - f.mbits);
    double v = std::nearbyint(a / q) * q; // default rounding mode: to nearest, ties to even
    double maxv = (2.0 - std::ldexp(1.0, -f.mbits)) * std::ldexp(1.0, bias);
    if (v > maxv)
        return inf;
    if (v < std::ldexp(1.0, emin))
        return (uint16_t)(sign | (uint16_t)(v / std::ldexp(1.0, emin - f.mbits)));
    int ve = std::ilogb(v);
    int mant = (int)(v / std::ldexp(1.0, ve - f.mbits)) - (1 << f.mbits);
    return (uint16_t)(sign | ((ve + bias) << f.mbits) | mant);
}

#endif // SP_MPI_UTIL_HPP
