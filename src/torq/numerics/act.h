/* torq.numerics in C: the two requantisations of an exact int32 accumulator, for the native
 * engine's compiled kernels (torq/runtime/native/common.h includes this file).
 *
 * Each function is one element's formula of a numpy reference in this package, and the tests
 * (tests/numerics/test_act_c.py) check it element for element against that reference:
 *
 *   torq_act_native   native.act_native   t = int64(acc) * mult; NTE: t += odd(t >> s) - 1;
 *                                         t = (t + ((1 << s) >> 1)) >> s; clamp(t + zp, lo, hi)
 *   torq_requant_ort  ort.requant_ort     f = fl32(fl32(acc) * s); clamp(f, lo - zp, hi - zp);
 *                                         RNE(f) + zp
 *
 * ``acc`` is the accumulator already wrapped to int32 (as the NPU's and ORT's 32-bit registers
 * do). Float operations are single IEEE float32 operations in round-to-nearest-even (the
 * default MXCSR mode); the library is built with -ffp-contract=off, so no multiply-add is ever
 * fused. ``even`` is the ACT's NTE mode, meaningful only for shift > 0 (callers pass 0 else).
 * The *_x16 forms do the same for 16 lanes with AVX-512 and return the 16 int8 results.
 */
#ifndef TORQ_ACT_H
#define TORQ_ACT_H

#include <math.h>
#include <stdint.h>

static inline int32_t torq_act_native(int32_t acc, int64_t mult, int shift, int even, int32_t zp,
                                      int32_t lo, int32_t hi)
{
    int64_t t = (int64_t)acc * mult;              /* |t| < 2**62 */
    if (even)
        t += ((t >> shift) & 1) - 1;
    t = (t + ((INT64_C(1) << shift) >> 1)) >> shift;   /* arithmetic shift: floor */
    t += zp;
    return (int32_t)(t < lo ? lo : (t > hi ? hi : t));
}

static inline int32_t torq_requant_ort(int32_t acc, float scale, int32_t zp, float flo, float fhi)
{
    float f = (float)acc * scale;
    f = f > flo ? f : flo;                         /* numpy clip: maximum, then minimum */
    f = f < fhi ? f : fhi;
    return (int32_t)nearbyintf(f) + zp;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

/* 16 lanes; lane i has multiplier m[i] (int32 lanes). The int64 products of the even and the
 * odd lanes are formed separately (vpmuldq reads the low half of each 64-bit lane), rounded,
 * clamped to [lo, hi] (within int8) and put back together as 16 bytes. */
static inline __m128i torq_act_native_x16(__m512i acc, __m512i m, int shift, int even, int32_t zp, int32_t lo,
                                          int32_t hi)
{
    if (shift >= 32 && shift <= 52) {
        /* t + r + zp * 2**s (|.| < 2**63) >> 32 is an exact int32: take the high halves of the
         * even and odd products (the odd ones are in place), then shift the rest in 32 bits;
         * floor(floor(v / 2**32) / 2**(s - 32)) = floor(v / 2**s). NTE adds bit s of t, less 1
         * (the -1 rides in the constant). */
        const __m512i r = _mm512_set1_epi64(((INT64_C(1) << shift) >> 1) + (int64_t)zp * (INT64_C(1) << shift) - even);
        __m512i t0 = _mm512_mul_epi32(acc, m);
        __m512i t1 = _mm512_mul_epi32(_mm512_srli_epi64(acc, 32), _mm512_srli_epi64(m, 32));
        if (even) {
            const __m128i sh = _mm_cvtsi32_si128(shift);
            const __m512i one = _mm512_set1_epi64(1);
            t0 = _mm512_add_epi64(t0, _mm512_and_si512(_mm512_srl_epi64(t0, sh), one));
            t1 = _mm512_add_epi64(t1, _mm512_and_si512(_mm512_srl_epi64(t1, sh), one));
        }
        t0 = _mm512_add_epi64(t0, r);
        t1 = _mm512_add_epi64(t1, r);
        __m512i v = _mm512_mask_mov_epi32(_mm512_srli_epi64(t0, 32), 0xAAAA, t1);
        v = _mm512_sra_epi32(v, _mm_cvtsi32_si128(shift - 32));
        v = _mm512_min_epi32(_mm512_max_epi32(v, _mm512_set1_epi32(lo)), _mm512_set1_epi32(hi));
        return _mm512_cvtepi32_epi8(v);
    }
    const __m128i sh = _mm_cvtsi32_si128(shift);
    /* the zero point rides along in the rounding constant where zp * 2**s cannot overflow */
    const int fold = shift <= 52;
    const __m512i r = _mm512_set1_epi64(((INT64_C(1) << shift) >> 1) + (fold ? (int64_t)zp * (INT64_C(1) << shift) : 0));
    const __m512i one = _mm512_set1_epi64(1);
    const __m512i z = _mm512_set1_epi64(fold ? 0 : zp), l = _mm512_set1_epi64(lo), h = _mm512_set1_epi64(hi);
    __m512i t[2];
    t[0] = _mm512_mul_epi32(acc, m);
    t[1] = _mm512_mul_epi32(_mm512_srli_epi64(acc, 32), _mm512_srli_epi64(m, 32));
    for (int k = 0; k < 2; k++) {
        if (even)
            t[k] = _mm512_add_epi64(t[k], _mm512_sub_epi64(_mm512_and_si512(_mm512_sra_epi64(t[k], sh), one), one));
        t[k] = _mm512_sra_epi64(_mm512_add_epi64(t[k], r), sh);
        if (!fold)
            t[k] = _mm512_add_epi64(t[k], z);
        t[k] = _mm512_min_epi64(_mm512_max_epi64(t[k], l), h);
    }
    return _mm512_cvtepi32_epi8(_mm512_mask_mov_epi32(t[0], 0xAAAA, _mm512_slli_epi64(t[1], 32)));
}

static inline __m128i torq_requant_ort_x16(__m512i acc, __m512 scale, int32_t zp, float flo, float fhi)
{
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), scale);
    f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(flo)), _mm512_set1_ps(fhi));
    return _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(f), _mm512_set1_epi32(zp)));
}
#endif

#endif
