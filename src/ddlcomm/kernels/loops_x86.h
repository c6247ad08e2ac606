/* x86 SIMD reduction loops: AVX2 (+F16C) and AVX-512F (+AVX512-BF16).
 *
 * Each function carries its own target attribute, so the file builds with the
 * compiler's default (baseline x86-64) flags and the module chooses a loop at
 * import from what the CPU reports (see _reduce.c); nothing here runs on a CPU
 * without the features named in its attribute.
 *
 * Every loop reads whole vectors of a and b before it stores the result, so
 * out may be a or b.  The tail (fewer elements than one vector) is copied to
 * zeroed stack buffers, reduced there and copied back, so no loop reads or
 * writes past its arrays and none needs masked byte loads (AVX512BW, which
 * Xeon Phi lacks).
 *
 * float16 and bfloat16 are widened to float32, combined, and rounded back to
 * nearest-even, exactly as the portable loops do: F16C's VCVTPS2PH for
 * float16; for bfloat16, integer rounding (x + 0x7fff + lsb) >> 16, or the
 * AVX512-BF16 instruction VCVTNE2PS2BF16, which flushes subnormal results to
 * zero, so its lanes with a subnormal result are redone with the integer
 * rounding (see bf16_pack_bf16insn).
 */
#ifndef DDLCOMM_LOOPS_X86_H
#define DDLCOMM_LOOPS_X86_H

#include <immintrin.h>

#include "loops_portable.h"

#define DDL_AVX2 __attribute__((target("avx2,f16c")))
#define DDL_AVX512 __attribute__((target("avx512f,avx2,f16c")))
#define DDL_AVX512BF16 __attribute__((target("avx512f,avx512bf16,avx2,f16c")))

/* One loop: VEC holds W elements of T once loaded; LOAD(p) / STORE(p, v) move
 * W elements between memory and a VEC (converting 2-byte floats); OP combines. */
#define DDL_SIMD_LOOP(NAME, TARGET, T, VEC, W, LOAD, STORE, OP)                  \
    TARGET static void NAME(const void *pa, const void *pb, void *po, size_t n)   \
    {                                                                             \
        const T *a = (const T *)pa, *b = (const T *)pb;                           \
        T *o = (T *)po;                                                           \
        size_t i = 0;                                                             \
        for (; i + 4 * (W) <= n; i += 4 * (W)) {                                  \
            VEC a0 = LOAD(a + i), a1 = LOAD(a + i + (W));                         \
            VEC a2 = LOAD(a + i + 2 * (W)), a3 = LOAD(a + i + 3 * (W));           \
            VEC b0 = LOAD(b + i), b1 = LOAD(b + i + (W));                         \
            VEC b2 = LOAD(b + i + 2 * (W)), b3 = LOAD(b + i + 3 * (W));           \
            STORE(o + i, OP(a0, b0));                                             \
            STORE(o + i + (W), OP(a1, b1));                                       \
            STORE(o + i + 2 * (W), OP(a2, b2));                                   \
            STORE(o + i + 3 * (W), OP(a3, b3));                                   \
        }                                                                         \
        for (; i + (W) <= n; i += (W)) {                                          \
            VEC x = LOAD(a + i), y = LOAD(b + i);                                 \
            STORE(o + i, OP(x, y));                                               \
        }                                                                         \
        if (i < n) {                                                              \
            T ta[W], tb[W], to[W];                                                \
            size_t rest = (n - i) * sizeof(T);                                    \
            memset(ta, 0, sizeof ta);                                             \
            memset(tb, 0, sizeof tb);                                             \
            memcpy(ta, a + i, rest);                                              \
            memcpy(tb, b + i, rest);                                              \
            STORE(to, OP(LOAD(ta), LOAD(tb)));                                    \
            memcpy(o + i, to, rest);                                              \
        }                                                                         \
    }

/* ================================================================ AVX2 */
#define L256_PS(p) _mm256_loadu_ps(p)
#define S256_PS(p, v) _mm256_storeu_ps((p), (v))
#define L256_PD(p) _mm256_loadu_pd(p)
#define S256_PD(p, v) _mm256_storeu_pd((p), (v))
#define L256_SI(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define S256_SI(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), (v))

DDL_AVX2 static inline __m256 min256_ps(__m256 x, __m256 y)
{   /* MINPS gives y when either is NaN; put x back where x is NaN */
    return _mm256_blendv_ps(_mm256_min_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
DDL_AVX2 static inline __m256 max256_ps(__m256 x, __m256 y)
{
    return _mm256_blendv_ps(_mm256_max_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
DDL_AVX2 static inline __m256d min256_pd(__m256d x, __m256d y)
{
    return _mm256_blendv_pd(_mm256_min_pd(x, y), x, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
}
DDL_AVX2 static inline __m256d max256_pd(__m256d x, __m256d y)
{
    return _mm256_blendv_pd(_mm256_max_pd(x, y), x, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
}
/* 64-bit products modulo 2^64 from 32x32->64 multiplies (AVX2 has no VPMULLQ). */
DDL_AVX2 static inline __m256i mul256_epi64(__m256i x, __m256i y)
{
    __m256i lo = _mm256_mul_epu32(x, y);
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(x, 32), y),
                                     _mm256_mul_epu32(x, _mm256_srli_epi64(y, 32)));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}
DDL_AVX2 static inline __m256i min256_epi64(__m256i x, __m256i y)
{
    return _mm256_blendv_epi8(x, y, _mm256_cmpgt_epi64(x, y));
}
DDL_AVX2 static inline __m256i max256_epi64(__m256i x, __m256i y)
{
    return _mm256_blendv_epi8(y, x, _mm256_cmpgt_epi64(x, y));
}
/* Byte products modulo 256: even bytes from a 16-bit multiply, odd bytes from the high halves. */
DDL_AVX2 static inline __m256i mul256_epu8(__m256i x, __m256i y)
{
    __m256i even = _mm256_and_si256(_mm256_mullo_epi16(x, y), _mm256_set1_epi16(0x00ff));
    __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(x, 8), _mm256_srli_epi16(y, 8));
    return _mm256_or_si256(even, _mm256_slli_epi16(odd, 8));
}

/* float16 <-> float32 by F16C: 8 halves per vector. */
DDL_AVX2 static inline __m256 f16_load256(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
DDL_AVX2 static inline void f16_store256(uint16_t *p, __m256 v)
{
    _mm_storeu_si128((__m128i *)(void *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
/* bfloat16 by integer ops, 16 at a time.  Unpacking with a zero register puts
 * each bfloat16 in the top half of a 32-bit lane (a float32 with the same
 * value): the low unpack holds elements 0-3 and 8-11, the high one 4-7 and
 * 12-15, and the pack of the two rounded halves (also per 128-bit lane) puts
 * them back in order, so no cross-lane shuffle is needed. */
DDL_AVX2 static inline __m256i bf16_round256(__m256 v)
{   /* nearest even: (x + 0x7fff + lsb) >> 16; a NaN keeps its top bits, made quiet */
    __m256i x = _mm256_castps_si256(v);
    __m256i top = _mm256_srli_epi32(x, 16);
    __m256i lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), nan);
}

#define DDL_AVX2_BF16_LOOP(NAME, OP)                                              \
    DDL_AVX2 static void NAME(const void *pa, const void *pb, void *po, size_t n) \
    {                                                                             \
        const uint16_t *a = (const uint16_t *)pa, *b = (const uint16_t *)pb;      \
        uint16_t *o = (uint16_t *)po;                                             \
        const __m256i zero = _mm256_setzero_si256();                              \
        size_t i = 0;                                                             \
        for (;; i += 16) {                                                        \
            uint16_t ta[16], tb[16], to[16];                                      \
            const uint16_t *pa_ = a + i, *pb_ = b + i;                            \
            uint16_t *po_ = o + i;                                                \
            size_t rest = n - i;                                                  \
            __m256i va, vb, r;                                                    \
            if (i >= n)                                                           \
                break;                                                            \
            if (rest < 16) { /* tail: through zeroed stack buffers */             \
                memset(ta, 0, sizeof ta);                                         \
                memset(tb, 0, sizeof tb);                                         \
                memcpy(ta, pa_, rest * 2);                                        \
                memcpy(tb, pb_, rest * 2);                                        \
                pa_ = ta, pb_ = tb, po_ = to;                                     \
            }                                                                     \
            va = L256_SI(pa_);                                                    \
            vb = L256_SI(pb_);                                                    \
            {                                                                     \
                __m256 lo = OP(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, va)), \
                               _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, vb))); \
                __m256 hi = OP(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, va)), \
                               _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, vb))); \
                r = _mm256_packus_epi32(bf16_round256(lo), bf16_round256(hi));    \
            }                                                                     \
            S256_SI(po_, r);                                                      \
            if (rest < 16) {                                                      \
                memcpy(o + i, to, rest * 2);                                      \
                break;                                                            \
            }                                                                     \
        }                                                                         \
    }

#define DDL_AVX2_OPS(SFX, T, VEC, W, LOAD, STORE, ADD, MUL, MIN, MAX)      \
    DDL_SIMD_LOOP(sum_##SFX##_avx2, DDL_AVX2, T, VEC, W, LOAD, STORE, ADD)         \
    DDL_SIMD_LOOP(prod_##SFX##_avx2, DDL_AVX2, T, VEC, W, LOAD, STORE, MUL)        \
    DDL_SIMD_LOOP(min_##SFX##_avx2, DDL_AVX2, T, VEC, W, LOAD, STORE, MIN)         \
    DDL_SIMD_LOOP(max_##SFX##_avx2, DDL_AVX2, T, VEC, W, LOAD, STORE, MAX)

DDL_AVX2_OPS(f32, float, __m256, 8, L256_PS, S256_PS, _mm256_add_ps, _mm256_mul_ps, min256_ps, max256_ps)
DDL_AVX2_OPS(f64, double, __m256d, 4, L256_PD, S256_PD, _mm256_add_pd, _mm256_mul_pd, min256_pd, max256_pd)
DDL_AVX2_OPS(f16, uint16_t, __m256, 8, f16_load256, f16_store256, _mm256_add_ps, _mm256_mul_ps, min256_ps, max256_ps)
DDL_AVX2_BF16_LOOP(sum_bf16_avx2, _mm256_add_ps)
DDL_AVX2_BF16_LOOP(prod_bf16_avx2, _mm256_mul_ps)
DDL_AVX2_BF16_LOOP(min_bf16_avx2, min256_ps)
DDL_AVX2_BF16_LOOP(max_bf16_avx2, max256_ps)
DDL_AVX2_OPS(i32, int32_t, __m256i, 8, L256_SI, S256_SI, _mm256_add_epi32, _mm256_mullo_epi32, _mm256_min_epi32, _mm256_max_epi32)
DDL_AVX2_OPS(i64, int64_t, __m256i, 4, L256_SI, S256_SI, _mm256_add_epi64, mul256_epi64, min256_epi64, max256_epi64)
DDL_AVX2_OPS(u8, uint8_t, __m256i, 32, L256_SI, S256_SI, _mm256_add_epi8, mul256_epu8, _mm256_min_epu8, _mm256_max_epu8)

/* ================================================================ AVX-512F */
#define L512_PS(p) _mm512_loadu_ps(p)
#define S512_PS(p, v) _mm512_storeu_ps((p), (v))
#define L512_PD(p) _mm512_loadu_pd(p)
#define S512_PD(p, v) _mm512_storeu_pd((p), (v))
#define L512_SI(p) _mm512_loadu_si512((const void *)(p))
#define S512_SI(p, v) _mm512_storeu_si512((void *)(p), (v))

DDL_AVX512 static inline __m512 min512_ps(__m512 x, __m512 y)
{
    return _mm512_mask_mov_ps(_mm512_min_ps(x, y), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}
DDL_AVX512 static inline __m512 max512_ps(__m512 x, __m512 y)
{
    return _mm512_mask_mov_ps(_mm512_max_ps(x, y), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}
DDL_AVX512 static inline __m512d min512_pd(__m512d x, __m512d y)
{
    return _mm512_mask_mov_pd(_mm512_min_pd(x, y), _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q), x);
}
DDL_AVX512 static inline __m512d max512_pd(__m512d x, __m512d y)
{
    return _mm512_mask_mov_pd(_mm512_max_pd(x, y), _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q), x);
}
/* VPMULLQ is AVX512DQ, which Xeon Phi lacks: build 64-bit products from VPMULUDQ. */
DDL_AVX512 static inline __m512i mul512_epi64(__m512i x, __m512i y)
{
    __m512i lo = _mm512_mul_epu32(x, y);
    __m512i cross = _mm512_add_epi64(_mm512_mul_epu32(_mm512_srli_epi64(x, 32), y),
                                     _mm512_mul_epu32(x, _mm512_srli_epi64(y, 32)));
    return _mm512_add_epi64(lo, _mm512_slli_epi64(cross, 32));
}

/* float16: 16 halves per vector (VCVTPH2PS / VCVTPS2PH zmm are AVX-512F). */
DDL_AVX512 static inline __m512 f16_load512(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}
DDL_AVX512 static inline void f16_store512(uint16_t *p, __m512 v)
{
    _mm256_storeu_si256((__m256i *)(void *)p,
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
/* bfloat16, AVX-512F only: widen and shift in; round to nearest even, narrow with VPMOVDW. */
DDL_AVX512 static inline __m512 bf16_load512(const uint16_t *p)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
DDL_AVX512 static inline __m512i bf16_round512(__m512 v)
{
    __m512i x = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), q);
}
DDL_AVX512 static inline void bf16_store512(uint16_t *p, __m512 v)
{
    _mm256_storeu_si256((__m256i *)(void *)p, _mm512_cvtepi32_epi16(bf16_round512(v)));
}

#define DDL_AVX512_OPS(SFX, T, VEC, W, LOAD, STORE, ADD, MUL, MIN, MAX)          \
    DDL_SIMD_LOOP(sum_##SFX##_avx512, DDL_AVX512, T, VEC, W, LOAD, STORE, ADD)     \
    DDL_SIMD_LOOP(prod_##SFX##_avx512, DDL_AVX512, T, VEC, W, LOAD, STORE, MUL)    \
    DDL_SIMD_LOOP(min_##SFX##_avx512, DDL_AVX512, T, VEC, W, LOAD, STORE, MIN)     \
    DDL_SIMD_LOOP(max_##SFX##_avx512, DDL_AVX512, T, VEC, W, LOAD, STORE, MAX)

DDL_AVX512_OPS(f32, float, __m512, 16, L512_PS, S512_PS, _mm512_add_ps, _mm512_mul_ps, min512_ps, max512_ps)
DDL_AVX512_OPS(f64, double, __m512d, 8, L512_PD, S512_PD, _mm512_add_pd, _mm512_mul_pd, min512_pd, max512_pd)
DDL_AVX512_OPS(f16, uint16_t, __m512, 16, f16_load512, f16_store512, _mm512_add_ps, _mm512_mul_ps, min512_ps, max512_ps)
DDL_AVX512_OPS(bf16, uint16_t, __m512, 16, bf16_load512, bf16_store512, _mm512_add_ps, _mm512_mul_ps, min512_ps, max512_ps)
DDL_AVX512_OPS(i32, int32_t, __m512i, 16, L512_SI, S512_SI, _mm512_add_epi32, _mm512_mullo_epi32, _mm512_min_epi32, _mm512_max_epi32)
DDL_AVX512_OPS(i64, int64_t, __m512i, 8, L512_SI, S512_SI, _mm512_add_epi64, mul512_epi64, _mm512_min_epi64, _mm512_max_epi64)
/* uint8 keeps the AVX2 loops at this level: byte ops on zmm need AVX512BW. */

/* ================================================================ AVX512-BF16 */
#if DDL_HAVE_AVX512BF16_INTRINSICS
/* Two float32 vectors -> 32 bfloat16 by VCVTNE2PS2BF16 (nearest even, NaN
 * quietened like the integer rounding).  The instruction treats subnormal
 * inputs as zero; where any lane is a nonzero subnormal (rare: |x| < 2^-126)
 * the pair is rounded with integer ops instead, so results stay exact. */
DDL_AVX512BF16 static inline void bf16_pack_bf16insn(uint16_t *p, __m512 lo, __m512 hi)
{
    const __m512i expo = _mm512_set1_epi32(0x7f800000), mag = _mm512_set1_epi32(0x7fffffff);
    __m512i xl = _mm512_castps_si512(lo), xh = _mm512_castps_si512(hi);
    /* subnormal lanes: exponent bits all 0, magnitude not 0 */
    __mmask16 sl = _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(xl, expo), xl, mag);
    __mmask16 sh = _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(xh, expo), xh, mag);
    if ((sl | sh) == 0) {
        __m512bh r = _mm512_cvtne2ps_pbh(hi, lo);          /* low half of the result from lo */
        _mm512_storeu_si512((void *)p, (__m512i)r);
    } else {
        bf16_store512(p, lo);
        bf16_store512(p + 16, hi);
    }
}

/* 32 elements per step; the rest (at most 31) by the AVX-512F loop TAIL. */
#define DDL_BF16INSN_LOOP(NAME, OP, TAIL)                                         \
    DDL_AVX512BF16 static void NAME(const void *pa, const void *pb, void *po, size_t n) \
    {                                                                             \
        const uint16_t *a = (const uint16_t *)pa, *b = (const uint16_t *)pb;      \
        uint16_t *o = (uint16_t *)po;                                             \
        size_t i = 0;                                                             \
        for (; i + 32 <= n; i += 32) {                                            \
            __m512 a0 = bf16_load512(a + i), a1 = bf16_load512(a + i + 16);       \
            __m512 b0 = bf16_load512(b + i), b1 = bf16_load512(b + i + 16);       \
            bf16_pack_bf16insn(o + i, OP(a0, b0), OP(a1, b1));                    \
        }                                                                         \
        if (i < n)                                                                \
            TAIL(a + i, b + i, o + i, n - i);                                     \
    }
DDL_BF16INSN_LOOP(sum_bf16_bf16insn, _mm512_add_ps, sum_bf16_avx512)
DDL_BF16INSN_LOOP(prod_bf16_bf16insn, _mm512_mul_ps, prod_bf16_avx512)
DDL_BF16INSN_LOOP(min_bf16_bf16insn, min512_ps, min_bf16_avx512)
DDL_BF16INSN_LOOP(max_bf16_bf16insn, max512_ps, max_bf16_avx512)
#endif /* DDL_HAVE_AVX512BF16_INTRINSICS */

#endif /* DDLCOMM_LOOPS_X86_H */
