/*
 * half.c: IEEE binary16 (fp16) and bfloat16 on the host: exact widening to float, rounding back
 * with round-to-nearest-even, and the MIN/MAX MPI_Ops for both (MPI has neither type).
 *
 * Invariants: widening is exact for every bit pattern (subnormals, infinities, NaN payloads);
 * narrowing rounds exactly once, to nearest with ties to even, overflowing to infinity at the
 * IEEE threshold (65520 for fp16) and keeping NaN a (quiet) NaN with its sign. MIN/MAX are
 * commutative and associative on bit patterns so the result does not depend on MPI's reduction
 * order: NaN propagates (of two NaNs the smaller pattern wins), and -0 < +0.
 *
 * No locks: the MPI_Ops are created once under pthread_once and never freed (MPI_Finalize
 * releases them).
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "collectives/dtype.h"

/* ---- scalar conversions ----------------------------------------------------------------- */

static inline uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float sp__half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        /* Zero or subnormal: mant * 2^-24 is exact in float. */
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (exp == 31) /* inf or NaN: keep the payload (the quiet bit 0x200 lands on float's) */
        return bits_float(sign | 0x7f800000u | (mant << 13));
    return bits_float(sign | ((exp - 15u + 127u) << 23) | (mant << 13));
}

uint16_t sp__float_to_half(float f) {
    uint32_t u = float_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        if (a == 0x7f800000u)
            return (uint16_t)(sign | 0x7c00u);
        /* NaN: keep the top payload bits, force the quiet bit so it never becomes inf. */
        return (uint16_t)(sign | 0x7c00u | 0x200u | ((a >> 13) & 0x3ffu));
    }
    if (a >= 0x477ff000u) /* >= 65520: rounds to infinity under round-to-nearest-even */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {
        /* Normal in fp16: rebias the exponent, keep 10 mantissa bits, round on the other 13.
         * A carry out of the mantissa correctly bumps the exponent. */
        uint32_t h = (a - ((127u - 15u) << 23)) >> 13;
        uint32_t rem = a & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    /* Subnormal (or zero) in fp16: count units of 2^-24. value = m * 2^(e-150), so units =
     * m >> (126 - e) with round-to-nearest-even on the bits shifted out. */
    uint32_t e = a >> 23;
    if (e < 102) /* below 2^-25: rounds to zero (exactly 2^-25 ties to even zero, e == 102) */
        return sign;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u)))
        r++; /* 0x400 is the smallest normal: the encoding carries over naturally */
    return (uint16_t)(sign | r);
}

float sp__bf16_to_float(uint16_t b) {
    return bits_float((uint32_t)b << 16);
}

uint16_t sp__float_to_bf16(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: truncate, force the quiet bit */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Round to nearest even on the low 16 bits; overflow carries into inf as IEEE requires. */
    uint32_t bias = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + bias) >> 16);
}

void sp__half_load(const uint16_t *src, float *dst, size_t n, bool is_bf16) {
    if (is_bf16) {
        for (size_t i = 0; i < n; i++)
            dst[i] = sp__bf16_to_float(src[i]);
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = sp__half_to_float(src[i]);
    }
}

void sp__half_store(const float *src, uint16_t *dst, size_t n, bool is_bf16) {
    if (is_bf16) {
        for (size_t i = 0; i < n; i++)
            dst[i] = sp__float_to_bf16(src[i]);
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = sp__float_to_half(src[i]);
    }
}

/* ---- MIN/MAX as MPI_Ops ----------------------------------------------------------------- */

/* One element of MIN (is_max false) or MAX; see the file comment for NaN and signed zero. */
static inline uint16_t pick(uint16_t a, uint16_t b, bool is_bf16, bool is_max) {
    uint16_t quiet = is_bf16 ? 0x0040u : 0x0200u;
    float fa = is_bf16 ? sp__bf16_to_float(a) : sp__half_to_float(a);
    float fb = is_bf16 ? sp__bf16_to_float(b) : sp__half_to_float(b);
    bool na = isnan(fa), nb = isnan(fb);
    if (na || nb) {
        uint16_t qa = (uint16_t)(a | quiet), qb = (uint16_t)(b | quiet);
        if (na && nb)
            return qa < qb ? qa : qb;
        return na ? qa : qb;
    }
    if (fa == fb) /* equal values; differ only as -0/+0 */
        return is_max ? ((a & 0x8000u) ? b : a) : ((a & 0x8000u) ? a : b);
    if (is_max)
        return fa > fb ? a : b;
    return fa < fb ? a : b;
}

#define SP_HALF_OP(name, bf, mx)                                                                   \
    static void name(void *in, void *inout, int *len, MPI_Datatype *type) {                        \
        (void)type;                                                                                \
        const uint16_t *a = in;                                                                    \
        uint16_t *b = inout;                                                                       \
        for (int i = 0; i < *len; i++)                                                             \
            b[i] = pick(a[i], b[i], (bf), (mx));                                                   \
    }
SP_HALF_OP(fp16_min, false, false)
SP_HALF_OP(fp16_max, false, true)
SP_HALF_OP(bf16_min, true, false)
SP_HALF_OP(bf16_max, true, true)

static pthread_once_t ops_once = PTHREAD_ONCE_INIT;
static MPI_Op ops[2][2]; /* [is_bf16][is_max]; written once under ops_once */

static void create_ops(void) {
    MPI_User_function *fns[2][2] = {{fp16_min, fp16_max}, {bf16_min, bf16_max}};
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 2; m++)
            if (MPI_Op_create(fns[b][m], 1, &ops[b][m]) != MPI_SUCCESS)
                ops[b][m] = MPI_OP_NULL;
}

MPI_Op sp__half_minmax_op(bool is_bf16, bool is_max) {
    pthread_once(&ops_once, create_ops);
    return ops[is_bf16 ? 1 : 0][is_max ? 1 : 0];
}
