/* bf16 / f32 elementwise ops and max pool of the native engine (runtime/native/float_ops.py),
 * the reference kernels' values exactly:
 *
 *   torq_binary_f32   out = type(fl32(a op b))     (bf16_arith.binary: op add / sub / mul, one fp32
 *                                                  IEEE operation, then the node's type: bf16 RNE,
 *                                                  numerics/bf16.h)
 *   torq_lut16_f32    out = table[bits(x) >> 16]   (a one-input bf16 body: the 65536 results the
 *                                                  reference computed by its nodes)
 *   torq_gap_f32      a global average pool (float_ops._avgpool with the window = the plane):
 *                     acc = +0, acc = fl32(acc + x) over the plane in row-major order, then
 *                     fl32(acc / HW), then the step's type (bf16 RNE or f32)
 *   torq_maxpool_f32  kernels.maxpool: padding is -inf; the max over the kernel's columns, then
 *                     over its rows, each fold max(r, s) = (r >= s || r is NaN) ? r : s (numpy's
 *                     maximum)
 */
#include <stdint.h>
#include <string.h>
#include "bf16.h"
#include "common.h"

typedef struct {
    const float *a, *b, *table;
    const uint32_t *bits;
    float *out;
    long n;
    int bf16, op;                   /* op: 0 add, 1 sub, 2 mul */
} ejob;

#define ECHUNK 16384

static void binary_chunk(void *ctx, int c)
{
    const ejob *j = ctx;
    const long i0 = (long)c * ECHUNK, i1 = i0 + ECHUNK < j->n ? i0 + ECHUNK : j->n;
    long i = i0;
#if TORQ_F512                       /* the same IEEE operation and rounding, 16 lanes at a time */
    for (; i + 16 <= i1; i += 16) {
        const __m512 a = _mm512_loadu_ps(j->a + i), b = _mm512_loadu_ps(j->b + i);
        const __m512 y = j->op == 0 ? _mm512_add_ps(a, b) : (j->op == 1 ? _mm512_sub_ps(a, b) : _mm512_mul_ps(a, b));
        _mm512_storeu_ps(j->out + i, j->bf16 ? torq_bf16_x16(y) : y);
    }
#endif
    for (; i < i1; i++) {
        const float y = j->op == 0 ? j->a[i] + j->b[i] : (j->op == 1 ? j->a[i] - j->b[i] : j->a[i] * j->b[i]);
        j->out[i] = j->bf16 ? torq_bf16(y) : y;
    }
}

int torq_binary_f32(const float *a, const float *b, float *out, long n, int op, int bf16, int nthreads)
{
    ejob j = {a, b, NULL, NULL, out, n, bf16, op};
    torq_parallel_for((int)((n + ECHUNK - 1) / ECHUNK), binary_chunk, &j, float_threads(n, nthreads));
    return 0;
}

static void lut_chunk(void *ctx, int c)
{
    const ejob *j = ctx;
    const long i0 = (long)c * ECHUNK, i1 = i0 + ECHUNK < j->n ? i0 + ECHUNK : j->n;
    for (long i = i0; i < i1; i++)
        j->out[i] = j->table[j->bits[i] >> 16];
}

int torq_lut16_f32(const float *x, const float *table, float *out, long n, int nthreads)
{
    ejob j = {NULL, NULL, table, (const uint32_t *)x, out, n, 0, 0};
    torq_parallel_for((int)((n + ECHUNK - 1) / ECHUNK), lut_chunk, &j, float_threads(n, nthreads));
    return 0;
}

/* ------------------------------------------------------------------ max pool */

typedef struct {
    const float *x;
    float *out;
    int H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl;
} mjob;

static inline float fmax_np(float r, float s)
{
    return (r >= s || r != r) ? r : s;
}

/* d[q] = fmax_np(d[q], s[q]) for q < n */
static inline void fold_max(float *d, const float *s, int n)
{
    int q = 0;
#if TORQ_F512
    for (; q < n; q += 16) {
        const __mmask16 k = lane_mask(n - q);
        const __m512 r = _mm512_maskz_loadu_ps(k, d + q), v = _mm512_maskz_loadu_ps(k, s + q);
        const __mmask16 keep = _mm512_cmp_ps_mask(r, v, _CMP_GE_OQ) | _mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q);
        _mm512_mask_storeu_ps(d + q, k, _mm512_mask_blend_ps(keep, v, r));
    }
#endif
    for (; q < n; q++)
        d[q] = fmax_np(d[q], s[q]);
}

/* fold row y's kernel columns into cm[0, OW): cm[q] = max over j of padded x[y][q * sw + j * dw]
 * (j in order); the row is first split into its sw column phases (-inf padding), so every j
 * reads a contiguous run */
static void colmax_row(const mjob *m, const float *plane, int y, float *ph, int lph, float *cm)
{
    if (y < 0 || y >= m->H) {
        for (int q = 0; q < m->OW; q++)
            cm[q] = -__builtin_inff();
        return;
    }
    const float *row = plane + (long)y * m->W;
    for (int b = 0; b < m->sw; b++) {
        float *d = ph + b * lph;
        int q0 = m->pl - b <= 0 ? 0 : (m->pl - b + m->sw - 1) / m->sw;    /* q * sw + b - pl >= 0 */
        int q1 = (m->W + m->pl - b + m->sw - 1) / m->sw;                  /* q * sw + b - pl < W */
        q1 = q1 > lph ? lph : q1;
        q0 = q0 > q1 ? q1 : q0;
        for (int q = 0; q < q0; q++)
            d[q] = -__builtin_inff();
        gather_cols(d, row + b - m->pl, q0, q1, m->sw);
        for (int q = q1; q < lph; q++)
            d[q] = -__builtin_inff();
    }
    for (int j = 0; j < m->kw; j++) {
        const float *s = ph + ((j * m->dw) % m->sw) * lph + (j * m->dw) / m->sw;
        if (j == 0)
            memcpy(cm, s, sizeof(float) * m->OW);
        else
            fold_max(cm, s, m->OW);
    }
}

static void maxpool_chunk(void *ctx, int c)
{
    const mjob *m = ctx;
    const float *plane = m->x + (long)c * m->H * m->W;
    const int lph = m->OW + ((m->kw - 1) * m->dw) / m->sw + 1;
    float *ph = (float *)thread_scratch(sizeof(float) * (m->sw * lph + m->OW));
    float *cm = ph + m->sw * lph;
    for (int p = 0; p < m->OH; p++) {
        float *o = m->out + ((long)c * m->OH + p) * m->OW;
        for (int i = 0; i < m->kh; i++) {
            colmax_row(m, plane, p * m->sh + i * m->dh - m->pt, ph, lph, i ? cm : o);
            if (i)
                fold_max(o, cm, m->OW);
        }
    }
}

/* x [planes, H, W] -> out [planes, OH, OW]; geo = kh, kw, sh, sw, dh, dw, pt, pl, OH, OW */
int torq_maxpool_f32(const float *x, float *out, int planes, int H, int W, const int32_t *geo, int nthreads)
{
    mjob m = {x, out, H, W, geo[8], geo[9], geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]};
    torq_parallel_for(planes, maxpool_chunk, &m,
                      float_threads((int64_t)planes * m.OH * m.OW * m.kh * m.kw, nthreads));
    return 0;
}

/* ------------------------------------------------------------------ global average pool */

#define GAP_LANES 16    /* planes summed side by side: independent chains, same order per plane */

typedef struct {
    const float *x;
    float *out;
    long planes, hw;
    int bf16;
} gapjob;

static void gap_chunk(void *ctx, int c)
{
    const gapjob *g = ctx;
    const long p0 = (long)c * GAP_LANES, np = g->planes - p0 < GAP_LANES ? g->planes - p0 : GAP_LANES;
    float acc[GAP_LANES] = {0};
    const float *x = g->x + p0 * g->hw;
    for (long i = 0; i < g->hw; i++)
        for (long l = 0; l < np; l++)
            acc[l] += x[l * g->hw + i];
    const float n = (float)g->hw;
    for (long l = 0; l < np; l++) {
        const float y = acc[l] / n;
        g->out[p0 + l] = g->bf16 ? torq_bf16(y) : y;
    }
}

/* x [planes, hw] -> out [planes]: each plane's mean, as the reference's window sum and division */
int torq_gap_f32(const float *x, float *out, long planes, long hw, int bf16, int nthreads)
{
    gapjob g = {x, out, planes, hw, bf16};
    torq_parallel_for((int)((planes + GAP_LANES - 1) / GAP_LANES), gap_chunk, &g, float_threads(planes * hw, nthreads));
    return 0;
}
