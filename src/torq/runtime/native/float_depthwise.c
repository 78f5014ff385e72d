/* bf16 / f32 depthwise convolution (one input and one output channel per group, dilation 1,
 * stride 1 or 2) read straight from the input rows: no padded phase planes.
 *
 * Why: float_conv.c builds each channel's padded stride-phase planes before its taps run; for a
 * depthwise layer that copy costs as much as the 9 taps (MobileNetV2's 17 depthwise layers ran at
 * 1-10 GMAC/s against 10-50 for its 1x1 convs). Here each tap loads its 16 input columns with a
 * mask that zeroes the columns outside the image (stride 2: 32 columns, the even ones kept).
 *
 * Same arithmetic as float_conv.c, bit for bit: one lane per output walks the taps in weight
 * order (kh, kw) with one FMA each from +0, padding included (a tap on a row or column outside
 * the image adds w * 0, as the plane's zeros do: an infinite weight still makes NaN), then
 * bias, clamp and bf16 (numerics/bf16.h). Work is split over threads in ranges of channels.
 */
#include <stdint.h>
#include "bf16.h"
#include "common.h"
#include "float_conv.h"

#if TORQ_F512
#define DNV 4           /* 16-column vectors per register tile */

typedef struct {
    const torq_fgeom *g;
    const float *x, *w, *bias;
    float *out;
} dwjob;

/* lanes whose column start + lane lies in [0, W) */
static inline __mmask16 cols_in(int start, int W)
{
    return lane_mask(W - start) & (__mmask16)~lane_mask(-start);
}

/* the input columns of 16 outputs at one tap: p[s * lane] (s = 1 or 2), 0 outside the image (m:
 * the in-image lanes, cols_in, of the one or two 16-column loads; masked lanes are not read) */
static inline __attribute__((always_inline)) __m512 tap_cols(const float *p, const __mmask16 *m, const int s)
{
    if (s == 1)
        return _mm512_maskz_loadu_ps(m[0], p);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(m[0], p), even, _mm512_maskz_loadu_ps(m[1], p + 16));
}

/* output rows [r0, r0 + RB) (those < OH stored) x columns [q0, q0 + 16 * NV) of one channel:
 * RB * NV independent accumulators (a 7-wide plane takes 8 rows at once, a 56-wide one 2) */
static inline __attribute__((always_inline)) void dw_block(const dwjob *j, const float *xc, const float *wc, float *oc,
                                                           __mmask16 m[][DNV][2], float bias, int r0, int q0,
                                                           const int RB, const int NV, const int s)
{
    const torq_fgeom *g = j->g;
    const int kw = g->kw;
    __m512 acc[RB][NV];
    for (int b = 0; b < RB; b++)
        for (int v = 0; v < NV; v++)
            acc[b][v] = _mm512_setzero_ps();
    for (int i = 0; i < g->kh; i++) {
        for (int t = 0; t < kw; t++) {
            const __m512 wv = _mm512_set1_ps(wc[i * kw + t]);
            for (int b = 0; b < RB; b++) {
                const int y = (r0 + b) * s + i - g->pt;
                const float *row = xc + (int64_t)y * g->W + q0 * s - g->pl + t;
                const int inside = y >= 0 && y < g->H;
                for (int v = 0; v < NV; v++) {
                    const __m512 xv = inside ? tap_cols(row + 16 * v * s, m[t][v], s) : _mm512_setzero_ps();
                    acc[b][v] = _mm512_fmadd_ps(wv, xv, acc[b][v]);
                }
            }
        }
    }
    const __m512 bv = _mm512_set1_ps(bias), lo = _mm512_set1_ps(g->lo), hi = _mm512_set1_ps(g->hi);
    for (int b = 0; b < RB && r0 + b < g->OH; b++)
        for (int v = 0; v < NV; v++)
            _mm512_mask_storeu_ps(oc + (int64_t)(r0 + b) * g->OW + 16 * v, lane_mask(g->OW - q0 - 16 * v),
                                  torq_bf16_finish_x16(acc[b][v], bv, lo, hi, g->bf16));
}

/* dw_block for a 3x3 kernel: each input row is loaded once (3 shifted column vectors) and added
 * to every output row of the block that reads it; an accumulator still takes its taps in weight
 * order (input rows ascending = kernel rows ascending, then the 3 columns) */
static inline __attribute__((always_inline)) void dw_block3(const dwjob *j, const float *xc, const float *wc,
                                                            float *oc, __mmask16 m[][DNV][2], float bias, int r0,
                                                            int q0, const int RB, const int NV, const int s)
{
    const torq_fgeom *g = j->g;
    __m512 acc[RB][NV];
    _Pragma("GCC unroll 32") for (int b = 0; b < RB; b++)
        _Pragma("GCC unroll 32") for (int v = 0; v < NV; v++)
            acc[b][v] = _mm512_setzero_ps();
    _Pragma("GCC unroll 32") for (int yy = 0; yy < (RB - 1) * s + 3; yy++) {
        const int y = r0 * s + yy - g->pt;
        const float *row = xc + (int64_t)y * g->W + q0 * s - g->pl;
        const int inside = y >= 0 && y < g->H;
        __m512 xv[3][NV];
        _Pragma("GCC unroll 32") for (int t = 0; t < 3; t++)
            _Pragma("GCC unroll 32") for (int v = 0; v < NV; v++)
                xv[t][v] = inside ? tap_cols(row + 16 * v * s + t, m[t][v], s) : _mm512_setzero_ps();
        _Pragma("GCC unroll 32") for (int i = 0; i < 3; i++) {
            const int bs = yy - i, b = bs / s;          /* output row b * s + i = yy */
            if (bs < 0 || bs % s || b >= RB)
                continue;
            _Pragma("GCC unroll 32") for (int t = 0; t < 3; t++) {
                const __m512 wv = _mm512_set1_ps(wc[i * 3 + t]);
                _Pragma("GCC unroll 32") for (int v = 0; v < NV; v++)
                    acc[b][v] = _mm512_fmadd_ps(wv, xv[t][v], acc[b][v]);
            }
        }
    }
    const __m512 bv = _mm512_set1_ps(bias), lo = _mm512_set1_ps(g->lo), hi = _mm512_set1_ps(g->hi);
    _Pragma("GCC unroll 32") for (int b = 0; b < RB && r0 + b < g->OH; b++)
        _Pragma("GCC unroll 32") for (int v = 0; v < NV; v++)
            _mm512_mask_storeu_ps(oc + (int64_t)(r0 + b) * g->OW + 16 * v, lane_mask(g->OW - q0 - 16 * v),
                                  torq_bf16_finish_x16(acc[b][v], bv, lo, hi, g->bf16));
}

/* every output row of channel nc, columns [q0, q0 + 16 * NV), stride s both ways */
static inline __attribute__((always_inline)) void dw_cols(const dwjob *j, int nc, int q0, const int NV, const int s)
{
    const torq_fgeom *g = j->g;
    const int c = nc % g->C;
    const float *xc = j->x + (int64_t)nc * g->H * g->W, *wc = j->w + (int64_t)c * g->T;
    float *oc = j->out + (int64_t)nc * g->OH * g->OW + q0;
    __mmask16 m[16][DNV][2];        /* per tap column and vector: the loads' in-image lanes */
    for (int t = 0; t < g->kw; t++)
        for (int v = 0; v < NV; v++) {
            const int start = (q0 + 16 * v) * s + t - g->pl;
            m[t][v][0] = cols_in(start, g->W);
            m[t][v][1] = cols_in(start + 16, g->W);
        }
    const int RB = NV == 1 ? 8 : (NV == 2 ? 4 : 2);
    for (int r0 = 0; r0 < g->OH; r0 += RB) {
        if (g->kh == 3 && g->kw == 3)
            dw_block3(j, xc, wc, oc, m, j->bias[c], r0, q0, RB, NV, s);
        else
            dw_block(j, xc, wc, oc, m, j->bias[c], r0, q0, RB, NV, s);
    }
}

#define DW_COLS(NV_, S_)                                                  \
    static void dw_cols_##NV_##_##S_(const dwjob *j, int nc, int q0)      \
    {                                                                     \
        dw_cols(j, nc, q0, NV_, S_);                                      \
    }
DW_COLS(1, 1) DW_COLS(2, 1) DW_COLS(3, 1) DW_COLS(4, 1) DW_COLS(1, 2) DW_COLS(2, 2) DW_COLS(3, 2) DW_COLS(4, 2)
typedef void (*dw_cols_fn)(const dwjob *, int, int);
static const dw_cols_fn DW_COLS_FNS[2][DNV + 1] = {{0, dw_cols_1_1, dw_cols_2_1, dw_cols_3_1, dw_cols_4_1},
                                                   {0, dw_cols_1_2, dw_cols_2_2, dw_cols_3_2, dw_cols_4_2}};

/* channels [c0, c1) of every image (index n * C + c) */
static void dw_range(void *ctx, int c0, int c1)
{
    const dwjob *j = ctx;
    const torq_fgeom *g = j->g;
    for (int nc = c0; nc < c1; nc++)
        for (int q0 = 0; q0 < g->OW; q0 += 16 * DNV) {
            const int left = (g->OW - q0 + 15) / 16, nv = left < DNV ? left : DNV;
            DW_COLS_FNS[g->sw - 1][nv](j, nc, q0);
        }
}

/* x [N, C, H, W] -> out [N, C, OH, OW]; w packed [C][T] (float_conv.c's layout with Cg = Og = 1) */
int torq_dw_rows_f32(const float *x, float *out, const float *w, const float *bias, const torq_fgeom *g, int nthreads)
{
    dwjob j = {g, x, w, bias, out};
    const int64_t per_channel = (int64_t)g->OH * ((g->OW + 15) / 16) * g->T * g->sw;   /* ~ vector FMAs */
    const int grain = per_channel >= 2048 ? 1 : (int)(2048 / per_channel);           /* ranges of >= ~1-2 us */
    torq_parallel_grain(g->N * g->C, grain, dw_range, &j,
                         float_threads((int64_t)g->N * g->C * g->OH * g->OW * g->T, nthreads));
    return 0;
}
#endif
