/* Portable reduction loops: plain C, correct on every CPU and compiler.
 *
 * Every loop computes out[i] = a[i] (op) b[i] for i < n.  out may be a or b
 * (each element is read before it is written); partial overlap is refused by
 * the caller.  Elements are read and written through memcpy, so pointers need
 * no alignment; compilers turn that into plain loads and, at -O3, vectorise
 * the loops for the baseline ISA.
 *
 * float16 and bfloat16 are converted to float32, combined in float32 and
 * rounded back to nearest, ties to even.  For +, *, min and max, float32
 * (24 significant bits) is wide enough that this equals the correctly rounded
 * result in the 2-byte format (24 >= 2p + 2 for p = 11 and p = 8).
 */
#ifndef DDLCOMM_LOOPS_PORTABLE_H
#define DDLCOMM_LOOPS_PORTABLE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef void (*ddl_loop)(const void *a, const void *b, void *out, size_t n);

/* ---------------------------------------------------------------- scalars */
static inline uint32_t ddl_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float ddl_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* NaN-propagating min and max, as NumPy's minimum/maximum: a NaN in either
 * operand gives NaN.  Without a NaN, x < y ? x : y is what x86's MINPS does
 * (equal values, e.g. -0 and +0, give y), so every ISA path agrees bit for bit. */
#define DDL_FMIN(x, y) (((x) < (y) || (x) != (x)) ? (x) : (y))
#define DDL_FMAX(x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))
#define DDL_IMIN(x, y) ((x) < (y) ? (x) : (y))
#define DDL_IMAX(x, y) ((x) > (y) ? (x) : (y))

/* IEEE binary16 -> binary32, exact (subnormals, inf and NaN payloads kept). */
static inline float ddl_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1fu)                       /* inf, NaN (a signalling NaN is quietened, as F16C does) */
        return ddl_bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
    if (exp != 0)                           /* normal: rebias 15 -> 127 */
        return ddl_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in float32 */
    return ddl_bits_f32(sign | ddl_f32_bits((float)man * 5.9604644775390625e-08f));
}

/* binary32 -> binary16, round to nearest, ties to even (as F16C's VCVTPS2PH with imm 0). */
static inline uint16_t ddl_float_to_half(float f)
{
    uint32_t x = ddl_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)                   /* NaN: quiet, keep the top of the payload */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u)                  /* >= 65520 (half-way above the largest half): inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) {                /* >= 2^-14: a normal half */
        uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
        return (uint16_t)(sign | ((r - (112u << 23)) >> 13));
    }
    if (ax < 0x33000000u)                   /* < 2^-25: rounds to zero */
        return sign;
    {                                       /* subnormal half: round(|f| * 2^24) */
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;          /* 14 .. 24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u)))
            q++;                            /* q == 0x400 becomes the smallest normal, as it should */
        return (uint16_t)(sign | q);
    }
}

/* bfloat16 is the top half of a float32. */
static inline float ddl_bf16_to_float(uint16_t h) { return ddl_bits_f32((uint32_t)h << 16); }

static inline uint16_t ddl_float_to_bf16(float f)
{
    uint32_t x = ddl_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)    /* NaN: quiet it (what VCVTNEPS2BF16 does) */
        return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* ---------------------------------------------------------------- loops */
/* T: element type; C: type computed in; LOAD/STORE convert; EXPR combines x, y. */
#define DDL_SCALAR_LOOP(NAME, T, C, LOAD, STORE, EXPR)                           \
    static void NAME(const void *pa, const void *pb, void *po, size_t n)          \
    {                                                                             \
        const unsigned char *a = (const unsigned char *)pa;                       \
        const unsigned char *b = (const unsigned char *)pb;                       \
        unsigned char *o = (unsigned char *)po;                                   \
        for (size_t i = 0; i < n; i++) {                                          \
            T ta, tb, to;                                                         \
            memcpy(&ta, a + i * sizeof(T), sizeof(T));                            \
            memcpy(&tb, b + i * sizeof(T), sizeof(T));                            \
            {                                                                     \
                C x = LOAD(ta), y = LOAD(tb);                                     \
                to = STORE(EXPR);                                                 \
            }                                                                     \
            memcpy(o + i * sizeof(T), &to, sizeof(T));                            \
        }                                                                         \
    }

#define DDL_ID(v) (v)
#define DDL_SUM(x, y) ((x) + (y))
#define DDL_PROD(x, y) ((x) * (y))

/* The four ops of one element type. */
#define DDL_SCALAR_OPS(SUFFIX, T, C, LOAD, STORE, MIN, MAX)                      \
    DDL_SCALAR_LOOP(sum_##SUFFIX##_portable, T, C, LOAD, STORE, DDL_SUM(x, y))    \
    DDL_SCALAR_LOOP(prod_##SUFFIX##_portable, T, C, LOAD, STORE, DDL_PROD(x, y))  \
    DDL_SCALAR_LOOP(min_##SUFFIX##_portable, T, C, LOAD, STORE, MIN(x, y))        \
    DDL_SCALAR_LOOP(max_##SUFFIX##_portable, T, C, LOAD, STORE, MAX(x, y))

/* Integers wrap around as NumPy's do: + and * in the unsigned type of the same
 * width (signed overflow is undefined in C), min and max in the signed type. */
#define DDL_TO_U32(v) ((uint32_t)(v))
#define DDL_TO_U64(v) ((uint64_t)(v))
#define DDL_INT_OPS(SUFFIX, T, U)                                                 \
    DDL_SCALAR_LOOP(sum_##SUFFIX##_portable, T, U, (U), (T), DDL_SUM(x, y))       \
    DDL_SCALAR_LOOP(prod_##SUFFIX##_portable, T, U, (U), (T), DDL_PROD(x, y))     \
    DDL_SCALAR_LOOP(min_##SUFFIX##_portable, T, T, DDL_ID, DDL_ID, DDL_IMIN(x, y)) \
    DDL_SCALAR_LOOP(max_##SUFFIX##_portable, T, T, DDL_ID, DDL_ID, DDL_IMAX(x, y))

DDL_SCALAR_OPS(f32, float, float, DDL_ID, DDL_ID, DDL_FMIN, DDL_FMAX)
DDL_SCALAR_OPS(f64, double, double, DDL_ID, DDL_ID, DDL_FMIN, DDL_FMAX)
DDL_SCALAR_OPS(f16, uint16_t, float, ddl_half_to_float, ddl_float_to_half, DDL_FMIN, DDL_FMAX)
DDL_SCALAR_OPS(bf16, uint16_t, float, ddl_bf16_to_float, ddl_float_to_bf16, DDL_FMIN, DDL_FMAX)
DDL_INT_OPS(i32, int32_t, uint32_t)
DDL_INT_OPS(i64, int64_t, uint64_t)
/* uint8: arithmetic in unsigned int, truncated back (wraps modulo 256). */
DDL_SCALAR_LOOP(sum_u8_portable, uint8_t, unsigned, (unsigned), (uint8_t), DDL_SUM(x, y))
DDL_SCALAR_LOOP(prod_u8_portable, uint8_t, unsigned, (unsigned), (uint8_t), DDL_PROD(x, y))
DDL_SCALAR_LOOP(min_u8_portable, uint8_t, uint8_t, DDL_ID, DDL_ID, DDL_IMIN(x, y))
DDL_SCALAR_LOOP(max_u8_portable, uint8_t, uint8_t, DDL_ID, DDL_ID, DDL_IMAX(x, y))

#endif /* DDLCOMM_LOOPS_PORTABLE_H */
