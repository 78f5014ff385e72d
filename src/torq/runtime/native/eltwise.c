/* The native engine's byte-cheap ops: int8 add (native rounding), global average pool (both
 * roundings) and max pool, bit-identical to the reference kernels (runtime/ops.py, numerics).
 * Each is a single pass over its input; the point is to leave no numpy pass (and its int64
 * temporaries) between two native convolutions. */
#include "common.h"

/* ------------------------------------------------------------------ add, native rounding */

/* out = clamp(((a - za) * mA + (b - zb) * mB + r) >> shift) + zc, r = (1 << shift) >> 1
 * (numerics.add_native_mults; the caller checked |za|, |zb| < 2**16, shift in 0..62).
 * even (NTE, shift in 1..46): t = (a - za) * mA + (b - zb) * mB + (zc << shift) rounded half to
 * even, zc not added after (ORT rounds after adding its zero point) */
int torq_add_i8(const int8_t *a, const int8_t *b, int8_t *out, long n, int32_t za, int32_t zb, int32_t mA,
                int32_t mB, int shift, int32_t zc, int32_t lo, int32_t hi, int even)
{
    long i = 0;
    const int64_t r = (INT64_C(1) << shift) >> 1;
    const int64_t zpre = even ? (int64_t)zc * (INT64_C(1) << shift) : 0, zpost = even ? 0 : zc;
#if TORQ_VNNI
    if (!even && shift >= 32 && shift <= 52) {
        /* |(a - za) mA + (b - zb) mB| < 2**49: the high-half form of act.h, zc in the constant */
        const __m512i rr = _mm512_set1_epi64(r + (int64_t)zc * (INT64_C(1) << shift));
        const __m512i vza = _mm512_set1_epi32(za), vzb = _mm512_set1_epi32(zb);
        const __m512i ma = _mm512_set1_epi32(mA), mb = _mm512_set1_epi32(mB);
        const __m512i vlo = _mm512_set1_epi32(lo), vhi = _mm512_set1_epi32(hi);
        const __m128i sh = _mm_cvtsi32_si128(shift - 32);
        for (; i + 16 <= n; i += 16) {
            const __m512i x = _mm512_sub_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(a + i))), vza);
            const __m512i y = _mm512_sub_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + i))), vzb);
            const __m512i t0 = _mm512_add_epi64(_mm512_add_epi64(_mm512_mul_epi32(x, ma), _mm512_mul_epi32(y, mb)), rr);
            const __m512i t1 = _mm512_add_epi64(_mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(x, 32), ma),
                                                                 _mm512_mul_epi32(_mm512_srli_epi64(y, 32), mb)), rr);
            __m512i v = _mm512_mask_mov_epi32(_mm512_srli_epi64(t0, 32), 0xAAAA, t1);
            v = _mm512_min_epi32(_mm512_max_epi32(_mm512_sra_epi32(v, sh), vlo), vhi);
            _mm_storeu_si128((__m128i *)(out + i), _mm512_cvtepi32_epi8(v));
        }
    } else {                    /* any shift: round and clamp in 64 bits, then pack */
        const __m512i rr = _mm512_set1_epi64(r), z = _mm512_set1_epi64(zpost), zp = _mm512_set1_epi64(zpre);
        const __m512i one = _mm512_set1_epi64(1);
        const __m512i vza = _mm512_set1_epi32(za), vzb = _mm512_set1_epi32(zb);
        const __m512i ma = _mm512_set1_epi32(mA), mb = _mm512_set1_epi32(mB);
        const __m512i vlo = _mm512_set1_epi64(lo), vhi = _mm512_set1_epi64(hi);
        const __m128i sh = _mm_cvtsi32_si128(shift);
        for (; i + 16 <= n; i += 16) {
            const __m512i x = _mm512_sub_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(a + i))), vza);
            const __m512i y = _mm512_sub_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + i))), vzb);
            __m512i t[2];
            t[0] = _mm512_add_epi64(_mm512_mul_epi32(x, ma), _mm512_mul_epi32(y, mb));
            t[1] = _mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(x, 32), ma),
                                    _mm512_mul_epi32(_mm512_srli_epi64(y, 32), mb));
            for (int k = 0; k < 2; k++) {
                if (even) {     /* an exact tie of an even quotient drops below .5 (numerics.nte_shift) */
                    t[k] = _mm512_add_epi64(t[k], zp);
                    const __m512i odd = _mm512_and_si512(_mm512_sra_epi64(t[k], sh), one);
                    t[k] = _mm512_add_epi64(t[k], _mm512_sub_epi64(odd, one));
                }
                t[k] = _mm512_add_epi64(_mm512_sra_epi64(_mm512_add_epi64(t[k], rr), sh), z);
                t[k] = _mm512_min_epi64(_mm512_max_epi64(t[k], vlo), vhi);
            }
            const __m512i v = _mm512_mask_mov_epi32(t[0], 0xAAAA, _mm512_slli_epi64(t[1], 32));
            _mm_storeu_si128((__m128i *)(out + i), _mm512_cvtepi32_epi8(v));
        }
    }
#endif
    for (; i < n; i++) {
        int64_t t = ((int64_t)a[i] - za) * mA + ((int64_t)b[i] - zb) * mB + zpre;
        if (even)
            t += ((t >> shift) & 1) - 1;
        t = ((t + r) >> shift) + zpost;
        out[i] = (int8_t)(t < lo ? lo : (t > hi ? hi : t));
    }
    return 0;
}

/* ------------------------------------------------------------------ global average pool */

/* x [NC][HW] -> out [NC]: acc = sum(x) - zx * HW (|acc| < 2**31, checked by the caller), then
 * the ACT (native: mult, shift, NTE if even) or ORT's float requant (scale) */
int torq_gap_i8(const int8_t *x, int8_t *out, long NC, long HW, int32_t zx, int64_t mult, int shift, int even,
                int32_t zy, int32_t lo, int32_t hi, int ort, float scale)
{
    for (long c = 0; c < NC; c++) {
        const int8_t *p = x + c * HW;
        int32_t s = 0;
        for (long i = 0; i < HW; i++)
            s += p[i];
        const int32_t acc = s - zx * (int32_t)HW;
        out[c] = (int8_t)(ort ? torq_requant_ort(acc, scale, zy, (float)(lo - zy), (float)(hi - zy))
                              : torq_act_native(acc, mult, shift, even, zy, lo, hi));
    }
    return 0;
}

/* ------------------------------------------------------------------ max pool */

typedef struct {
    const int8_t *x;
    int8_t *out;
    int H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW;
} mp_job;

/* hm[q] = max_j row[q * sw + j * dw] over q < OW (row: the padded input row) */
static void hmax_row(const int8_t *row, int8_t *hm, const mp_job *m)
{
    int q = 0;
#if TORQ_VNNI
    /* whole vectors past OW too: the row has the slack, hm the room (OW rounded up to 64) */
    if (m->sw == 1)
        for (; q < m->OW; q += 64) {
            __m512i v = _mm512_loadu_si512(row + q);
            for (int j = 1; j < m->kw; j++)
                v = _mm512_max_epi8(v, _mm512_loadu_si512(row + q + j * m->dw));
            _mm512_storeu_si512(hm + q, v);
        }
    if (m->sw == 2)             /* the even bytes of 64: the low byte of 32 int16 lanes */
        for (; q < m->OW; q += 32) {
            __m256i v = _mm512_cvtepi16_epi8(_mm512_loadu_si512(row + 2 * q));
            for (int j = 1; j < m->kw; j++)
                v = _mm256_max_epi8(v, _mm512_cvtepi16_epi8(_mm512_loadu_si512(row + 2 * q + j * m->dw)));
            _mm256_storeu_si256((__m256i *)(hm + q), v);
        }
#endif
    for (; q < m->OW; q++) {
        int8_t v = row[q * m->sw];
        for (int j = 1; j < m->kw; j++)
            v = row[q * m->sw + j * m->dw] > v ? row[q * m->sw + j * m->dw] : v;
        hm[q] = v;
    }
}

/* one plane: the horizontal maxima of every input row, then the vertical ones; padding is -128
 * (the reference fills it with int8's minimum: it never wins unless the window is all padding) */
static void mp_chunk(void *ctx, int c)
{
    const mp_job *m = ctx;
    const int Wp = m->pl + m->W + (m->OW - 1) * m->sw + (m->kw - 1) * m->dw + 130;
    const int OWp = (m->OW + 63) / 64 * 64;
    int8_t *row = (int8_t *)thread_scratch((size_t)Wp + (size_t)m->H * OWp + OWp);
    int8_t *hm = row + Wp, *minrow = hm + (size_t)m->H * OWp;
    memset(row, -128, Wp);
    memset(minrow, -128, OWp);
    const int8_t *x = m->x + (size_t)c * m->H * m->W;
    for (int y = 0; y < m->H; y++) {
        memcpy(row + m->pl, x + (size_t)y * m->W, m->W);
        hmax_row(row, hm + (size_t)y * OWp, m);
    }
    int8_t *out = m->out + (size_t)c * m->OH * m->OW;
    for (int r = 0; r < m->OH; r++) {
        const int8_t *src[64];
        int n = 0;
        for (int i = 0; i < m->kh && n < 64; i++) {
            const int y = r * m->sh + i * m->dh - m->pt;
            if (y >= 0 && y < m->H)
                src[n++] = hm + (size_t)y * OWp;
        }
        if (!n)
            src[n++] = minrow;
        int q = 0;
#if TORQ_VNNI
        for (; q < m->OW; q += 64) {
            const __mmask64 k = m->OW - q >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (m->OW - q)) - 1);
            __m512i v = _mm512_loadu_si512(src[0] + q);
            for (int i = 1; i < n; i++)
                v = _mm512_max_epi8(v, _mm512_loadu_si512(src[i] + q));
            _mm512_mask_storeu_epi8(out + (size_t)r * m->OW + q, k, v);
        }
#endif
        for (; q < m->OW; q++) {
            int8_t v = src[0][q];
            for (int i = 1; i < n; i++)
                v = src[i][q] > v ? src[i][q] : v;
            out[(size_t)r * m->OW + q] = v;
        }
    }
}

/* x [NC][H][W] -> out [NC][OH][OW]; geometry as kernels.maxpool (ceil_mode 0, kh <= 64) */
int torq_maxpool_i8(const int8_t *x, int8_t *out, int NC, const int32_t *geo, int nthreads)
{
    mp_job m = {x, out, geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8], geo[9], geo[10],
                geo[11]};
    torq_parallel_for(NC, mp_chunk, &m, nthreads);
    return 0;
}
