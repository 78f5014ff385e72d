/* bf16 contractions (numerics/bf16_arith.py): conv2d (groups, depthwise, stride, dilation,
 * padding) and matmul / fully connected (batched), bias, clamp and the bf16 rounding fused.
 *
 * Every output is one SIMD lane that walks k = 0..K-1 in the model's order with one FMA per
 * step (numerics/bf16.h): conv k over (input channel of the group, kh, kw) as the weights are
 * stored, matmul k over the inner dimension. Lanes never exchange partial sums, so the blocking
 * (16 pixels or 16 columns per vector, several vectors and output channels per register tile,
 * tiles spread over threads) cannot change a single bit.
 *
 * Convolutions read "phase planes": the zero-padded input split into its stride phases, so each
 * tap of each stride is a contiguous run of a plane (the int8 kernels' layout, in float). Output
 * pixels are indexed "wide" (oh * Wq + ow over the plane's width Wq); columns ow >= OW are
 * computed and dropped. With no padding and stride 1 the input itself is the only plane.
 * Loads past the last needed pixel are masked, so no plane needs slack.
 */
#include <stdint.h>
#include <string.h>
#include "bf16.h"
#include "common.h"

#if defined(__AVX512F__)
#define TORQ_F512 1
#else
#define TORQ_F512 0
#endif

#define FRO 6           /* output channels per weight block (conv) */
#define GRM 4           /* rows per register tile (matmul) */
#define GNV 4           /* 16-column vectors per register tile (matmul) */

typedef struct {
    int32_t N, C, H, W, G, Cg, Og, OH, OW, T;
    int32_t nph, rows, Wq, sh, sw, pt, pl;
    int32_t L;                      /* wide pixels computed: (OH - 1) * Wq + OW */
    int32_t RO, PV;                 /* weight block (channels), 16-pixel vectors per tile */
    int32_t direct;                 /* the input is the plane (no padding, stride 1) */
    int32_t bf16;
    float lo, hi;
    int64_t cstride, phstride;      /* floats between channel planes / between phases */
    const int32_t *ph_ab;           /* [nph][2] row / column residue of each phase */
    const int64_t *tap_off;         /* [T] offset of the tap from the plane base */
} torq_fgeom;

typedef struct {
    const torq_fgeom *g;
    const float *x, *w, *bias, *planes;
    float *out;
    int ntiles, nob;
} fjob;

/* ------------------------------------------------------------------ phase planes */

static void build_chunk(void *ctx, int i)
{
    const fjob *j = ctx;
    const torq_fgeom *g = j->g;
    const int ph = i / g->C, c = i % g->C, a = g->ph_ab[2 * ph], b = g->ph_ab[2 * ph + 1];
    float *dst = (float *)j->planes + ph * g->phstride + c * g->cstride;
    const float *src = j->x + (int64_t)c * g->H * g->W;
    int q0 = g->pl - b <= 0 ? 0 : (g->pl - b + g->sw - 1) / g->sw;    /* q * sw + b - pl >= 0 */
    int q1 = (g->W + g->pl - b + g->sw - 1) / g->sw;                  /* q * sw + b - pl < W */
    q1 = q1 > g->Wq ? g->Wq : q1;
    q0 = q0 > q1 ? q1 : q0;
    for (int r = 0; r < g->rows; r++) {
        float *d = dst + (int64_t)r * g->Wq;
        const int y = r * g->sh + a - g->pt;
        if (y < 0 || y >= g->H) {
            memset(d, 0, sizeof(float) * g->Wq);
            continue;
        }
        const float *s = src + (int64_t)y * g->W + b - g->pl;
        memset(d, 0, sizeof(float) * q0);
        if (g->sw == 1)
            memcpy(d + q0, s + q0, sizeof(float) * (q1 - q0));
        else
            for (int q = q0; q < q1; q++)
                d[q] = s[q * g->sw];
        memset(d + q1, 0, sizeof(float) * (g->Wq - q1));
    }
}

/* ------------------------------------------------------------------ conv tiles */

/* finished wide pixels [p0, end) of one output channel -> the [OH, OW] output plane */
static inline void store_wide(const torq_fgeom *g, float *op, const float *vals, int p0, int end)
{
    int p = p0;
    while (p < end) {
        const int r = p / g->Wq, q = p % g->Wq;
        if (q >= g->OW) {
            p += g->Wq - q;
            continue;
        }
        const int len = (g->OW - q < end - p) ? g->OW - q : end - p;
        memcpy(op + (int64_t)r * g->OW + q, vals + (p - p0), sizeof(float) * len);
        p += len;
    }
}

#if TORQ_F512
static inline __attribute__((always_inline)) void
ftile(const fjob *j, int grp, int ob, int p0, const int ro, const int pv, const int masked)
{
    const torq_fgeom *g = j->g;
    const float *wb = j->w + ((int64_t)grp * j->nob + ob) * g->Cg * g->T * g->RO;
    const int rem = g->L - p0;
    __mmask16 mk[8];
    __m512 acc[FRO][8];
    for (int v = 0; v < pv; v++) {
        const int left = rem - 16 * v;
        mk[v] = left >= 16 ? 0xFFFF : (left <= 0 ? 0 : (__mmask16)((1u << left) - 1));
        for (int o = 0; o < ro; o++)
            acc[o][v] = _mm512_setzero_ps();
    }
    for (int c = 0; c < g->Cg; c++) {
        const float *xc = j->planes + (int64_t)(grp * g->Cg + c) * g->cstride + p0;
        for (int t = 0; t < g->T; t++, wb += g->RO) {
            const float *xp = xc + g->tap_off[t];
            __m512 xv[8];
            for (int v = 0; v < pv; v++)
                xv[v] = masked ? _mm512_maskz_loadu_ps(mk[v], xp + 16 * v) : _mm512_loadu_ps(xp + 16 * v);
            for (int o = 0; o < ro; o++) {
                const __m512 wv = _mm512_set1_ps(wb[o]);
                for (int v = 0; v < pv; v++)
                    acc[o][v] = _mm512_fmadd_ps(wv, xv[v], acc[o][v]);
            }
        }
    }
    const __m512 lo = _mm512_set1_ps(g->lo), hi = _mm512_set1_ps(g->hi);
    const int end = masked ? g->L : p0 + 16 * pv;
    for (int o = 0; o < ro; o++) {
        const int oc = grp * g->Og + ob * g->RO + o;
        float *op = j->out + (int64_t)oc * g->OH * g->OW;
        const __m512 bv = _mm512_set1_ps(j->bias[oc]);
        float tmp[128];
        for (int v = 0; v < pv; v++) {
            const __m512 y = torq_bf16_finish_x16(acc[o][v], bv, lo, hi, g->bf16);
            if (g->Wq == g->OW)
                _mm512_mask_storeu_ps(op + p0 + 16 * v, mk[v], y);
            else
                _mm512_storeu_ps(tmp + 16 * v, y);
        }
        if (g->Wq != g->OW)
            store_wide(g, op, tmp, p0, end);
    }
}

#define FT(RO_, PV_)                                                                             \
    static void ftile_##RO_##_##PV_(const fjob *j, int grp, int ob, int p0, int masked)          \
    {                                                                                            \
        if (masked)                                                                              \
            ftile(j, grp, ob, p0, RO_, PV_, 1);                                                  \
        else                                                                                     \
            ftile(j, grp, ob, p0, RO_, PV_, 0);                                                  \
    }
FT(1, 8) FT(1, 4) FT(2, 4) FT(3, 4) FT(4, 4) FT(5, 4) FT(6, 4)
typedef void (*ftile_fn)(const fjob *, int, int, int, int);
static const ftile_fn FTILES[FRO + 1] = {0, ftile_1_4, ftile_2_4, ftile_3_4, ftile_4_4, ftile_5_4, ftile_6_4};

#else   /* portable: the same lanes and order, one output at a time */

static void ftile_portable(const fjob *j, int grp, int ob, int p0, int ro)
{
    const torq_fgeom *g = j->g;
    const int end = p0 + 16 * g->PV < g->L ? p0 + 16 * g->PV : g->L;
    float vals[128];
    for (int o = 0; o < ro; o++) {
        const int oc = grp * g->Og + ob * g->RO + o;
        for (int p = p0; p < end; p++) {
            const float *wb = j->w + ((int64_t)grp * j->nob + ob) * g->Cg * g->T * g->RO + o;
            float acc = 0.0f;
            for (int c = 0; c < g->Cg; c++) {
                const float *xc = j->planes + (int64_t)(grp * g->Cg + c) * g->cstride + p;
                for (int t = 0; t < g->T; t++, wb += g->RO)
                    acc = torq_fma32(acc, *wb, xc[g->tap_off[t]]);
            }
            vals[p - p0] = torq_bf16_finish(acc, j->bias[oc], g->lo, g->hi, g->bf16);
        }
        store_wide(g, j->out + (int64_t)oc * g->OH * g->OW, vals, p0, end);
    }
}
#endif

static void conv_chunk(void *ctx, int i)
{
    const fjob *j = ctx;
    const torq_fgeom *g = j->g;
    const int tile = i % j->ntiles, rest = i / j->ntiles, ob = rest % j->nob, grp = rest / j->nob;
    const int p0 = tile * 16 * g->PV;
    const int ro = g->Og - ob * g->RO < g->RO ? g->Og - ob * g->RO : g->RO;
#if TORQ_F512
    const int masked = g->L - p0 < 16 * g->PV;
    if (g->PV == 8)
        ftile_1_8(j, grp, ob, p0, masked);
    else
        FTILES[ro](j, grp, ob, p0, masked);
#else
    ftile_portable(j, grp, ob, p0, ro);
#endif
}

/* x [N, C, H, W] -> out [N, G * Og, OH, OW]; w packed [G][ceil(Og / RO)][Cg][T][RO] */
int torq_conv_f32(const float *x, float *out, const float *w, const float *bias, const torq_fgeom *g,
                  int nthreads)
{
    fjob j = {g, NULL, w, bias, NULL, NULL, 0, (g->Og + g->RO - 1) / g->RO};
    j.ntiles = (g->L + 16 * g->PV - 1) / (16 * g->PV);
    float *planes = g->direct ? NULL : (float *)thread_scratch(sizeof(float) * g->phstride * g->nph);
    for (int n = 0; n < g->N; n++) {
        j.x = x + (int64_t)n * g->C * g->H * g->W;
        j.out = out + (int64_t)n * g->G * g->Og * g->OH * g->OW;
        if (g->direct) {
            j.planes = j.x;
        } else {
            j.planes = planes;
            torq_parallel_for(g->nph * g->C, build_chunk, &j, nthreads);
        }
        torq_parallel_for(g->G * j.nob * j.ntiles, conv_chunk, &j, nthreads);
    }
    return 0;
}

/* ------------------------------------------------------------------ matmul */

typedef struct {
    const float *A, *B, *bias;
    float *C;
    int M, K, N, nmb, nnb, bf16;
    int64_t sA, sB, sC;
    float lo, hi;
} gjob;

#if TORQ_F512
static inline __attribute__((always_inline)) void
gtile(const gjob *j, const float *A, const float *B, float *C, int m0, int n0, const int rm, const int masked)
{
    __mmask16 mk[GNV];
    __m512 acc[GRM][GNV];
    for (int v = 0; v < GNV; v++) {
        const int left = j->N - n0 - 16 * v;
        mk[v] = left >= 16 ? 0xFFFF : (left <= 0 ? 0 : (__mmask16)((1u << left) - 1));
        for (int r = 0; r < rm; r++)
            acc[r][v] = _mm512_setzero_ps();
    }
    const float *a = A + (int64_t)m0 * j->K;
    for (int k = 0; k < j->K; k++) {
        const float *b = B + (int64_t)k * j->N + n0;
        __m512 bv[GNV];
        for (int v = 0; v < GNV; v++)
            bv[v] = masked ? _mm512_maskz_loadu_ps(mk[v], b + 16 * v) : _mm512_loadu_ps(b + 16 * v);
        for (int r = 0; r < rm; r++) {
            const __m512 av = _mm512_set1_ps(a[(int64_t)r * j->K + k]);
            for (int v = 0; v < GNV; v++)
                acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    for (int v = 0; v < GNV; v++) {
        const __m512 bias = j->bias ? _mm512_maskz_loadu_ps(mk[v], j->bias + n0 + 16 * v) : _mm512_setzero_ps();
        for (int r = 0; r < rm; r++) {
            float *c = C + (int64_t)(m0 + r) * j->N + n0 + 16 * v;
            const __m512 y = j->bias ? torq_bf16_finish_x16(acc[r][v], bias, lo, hi, j->bf16)
                                     : torq_bf16_finish_x16(acc[r][v], _mm512_setzero_ps(), lo, hi, j->bf16);
            _mm512_mask_storeu_ps(c, mk[v], y);
        }
    }
}

#define GT(RM_)                                                                                   \
    static void gtile_##RM_(const gjob *j, const float *A, const float *B, float *C, int m0, int n0, int masked) \
    {                                                                                             \
        if (masked)                                                                               \
            gtile(j, A, B, C, m0, n0, RM_, 1);                                                    \
        else                                                                                      \
            gtile(j, A, B, C, m0, n0, RM_, 0);                                                    \
    }
GT(1) GT(2) GT(3) GT(4)
typedef void (*gtile_fn)(const gjob *, const float *, const float *, float *, int, int, int);
static const gtile_fn GTILES[GRM + 1] = {0, gtile_1, gtile_2, gtile_3, gtile_4};
#endif

static void gemm_chunk(void *ctx, int i)
{
    const gjob *j = ctx;
    const int nb = i % j->nnb, rest = i / j->nnb, mb = rest % j->nmb, bt = rest / j->nmb;
    const float *A = j->A + bt * j->sA, *B = j->B + bt * j->sB;
    float *C = j->C + bt * j->sC;
    const int m0 = mb * GRM, n0 = nb * 16 * GNV, rm = j->M - m0 < GRM ? j->M - m0 : GRM;
#if TORQ_F512
    GTILES[rm](j, A, B, C, m0, n0, j->N - n0 < 16 * GNV);
#else
    const int n1 = n0 + 16 * GNV < j->N ? n0 + 16 * GNV : j->N;
    for (int r = m0; r < m0 + rm; r++)
        for (int n = n0; n < n1; n++) {
            float acc = 0.0f;
            for (int k = 0; k < j->K; k++)
                acc = torq_fma32(acc, A[(int64_t)r * j->K + k], B[(int64_t)k * j->N + n]);
            C[(int64_t)r * j->N + n] = torq_bf16_finish(acc, j->bias ? j->bias[n] : 0.0f, j->lo, j->hi, j->bf16);
        }
#endif
}

/* C[b] = finish(A[b] [M, K] @ B[b] [K, N] + bias [N]) for b < batch (batch strides in floats;
 * 0 broadcasts an operand); bias may be NULL */
int torq_matmul_f32(const float *A, const float *B, float *C, const float *bias, int batch, int M, int K, int N,
                    int64_t sA, int64_t sB, int64_t sC, float lo, float hi, int bf16, int nthreads)
{
    gjob j = {A, B, bias, C, M, K, N, (M + GRM - 1) / GRM, (N + 16 * GNV - 1) / (16 * GNV), bf16, sA, sB, sC, lo, hi};
    torq_parallel_for(batch * j.nmb * j.nnb, gemm_chunk, &j, nthreads);
    return 0;
}

int torq_float_features(void)
{
    return TORQ_F512;
}
