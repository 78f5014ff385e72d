/* torq.numerics in C: the bf16 contraction arithmetic of numerics/bf16_arith.py, for the native
 * float kernels (torq/runtime/native/float_conv.c). One element's formula each:
 *
 *   torq_fma32        bf16_arith.fma32     acc <- fl32(acc + a*b): the exact product added to the
 *                                          fp32 accumulator with ONE rounding (an FMA). For bf16
 *                                          operands a*b has <= 16 significant bits, so it is exact
 *                                          in float64 and fl32(fl64(acc + a*b)) = fl32(acc + a*b)
 *                                          (53 >= 2*24 + 2: the double rounding is innocuous).
 *                                          Whenever a*b is representable in fp32 (all products
 *                                          from 2^-133 up to 2^128 in magnitude: every real
 *                                          activation) this equals the unfused mul then add.
 *   torq_bf16         bf16.to_bf16         RNE on the upper 16 bits; NaN quieted, keeps its sign
 *   torq_bf16_finish  bf16_arith.finish    y = fl32(acc + bias); y = min(max(y, lo), hi) with
 *                                          NaN passing through (numpy's maximum / minimum); bf16
 *
 * The *_x16 forms do the same on 16 lanes with AVX-512 (_mm512_fmadd_ps is the single-rounding
 * FMA above; vmaxps / vminps return their second operand when one is NaN, so the bound goes
 * first). The library is built with -ffp-contract=off: no other expression is ever fused.
 */
#ifndef TORQ_BF16_H
#define TORQ_BF16_H

#include <stdint.h>
#include <string.h>

static inline float torq_fma32(float acc, float a, float b)
{
    return (float)((double)acc + (double)a * (double)b);
}

static inline float torq_bf16(float y)
{
    uint32_t u;
    memcpy(&u, &y, 4);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu))
        u = (u & 0xFFFF0000u) | 0x00400000u;
    else
        u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&y, &u, 4);
    return y;
}

static inline float torq_bf16_finish(float acc, float bias, float lo, float hi, int bf16)
{
    float y = acc + bias;
    y = lo > y ? lo : y;
    y = hi < y ? hi : y;
    return bf16 ? torq_bf16(y) : y;
}

#if defined(__AVX512F__)
#include <immintrin.h>

static inline __m512 torq_bf16_x16(__m512 y)
{
    const __m512i u = _mm512_castps_si512(y), top = _mm512_set1_epi32((int)0xFFFF0000u);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd), top);
    const __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_and_si512(u, top), _mm512_set1_epi32(0x00400000)));
    return _mm512_castsi512_ps(r);
}

static inline __m512 torq_bf16_finish_x16(__m512 acc, __m512 bias, __m512 lo, __m512 hi, int bf16)
{
    __m512 y = _mm512_add_ps(acc, bias);
    y = _mm512_max_ps(lo, y);
    y = _mm512_min_ps(hi, y);
    return bf16 ? torq_bf16_x16(y) : y;
}
#endif

#endif
