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
 * The last tile of a plane reads up to SLACK floats past the last pixel it needs (lanes whose
 * outputs are dropped): the scratch planes carry that slack, zeroed, and the caller passes an
 * input as its own plane (direct) only when that much memory follows it.
 */
#include <stdint.h>
#include <string.h>
#include "bf16.h"
#include "common.h"
#include "float_conv.h"

#define SLACK 128       /* floats readable past a plane's end (16 * the largest PV) */
#define WPREF 384       /* weights prefetched this many floats ahead (a weight block streams once per tile) */
#define FRO 6           /* output channels per weight block (conv) */
#define GRM 4           /* rows per register tile (matmul) */
#define GNV 4           /* 16-column vectors per register tile (matmul) */


typedef struct {
    const torq_fgeom *g;
    const float *x, *w, *bias, *planes;
    float *out;
    int ntiles, nob, tiles_fastest;
} fjob;

/* the plane of phase ph of input channel c (of the image x) into dst */
static void build_plane(const torq_fgeom *g, const float *x, float *dst, int ph, int c)
{
    const int a = g->ph_ab[2 * ph], b = g->ph_ab[2 * ph + 1];
    const float *src = x + (int64_t)c * g->H * g->W;
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
#if TORQ_F512
        if (g->sw == 1) {           /* one pass of masked vectors: zeros left and right, the row between */
            for (int q = 0; q < g->Wq; q += 16) {
                const __mmask16 in = lane_mask(q1 - q) & (__mmask16)~lane_mask(q0 - q);
                _mm512_mask_storeu_ps(d + q, lane_mask(g->Wq - q), _mm512_maskz_loadu_ps(in, s + q));
            }
            continue;
        }
#endif
        memset(d, 0, sizeof(float) * q0);
        if (g->sw == 1)
            memcpy(d + q0, s + q0, sizeof(float) * (q1 - q0));
        else
            gather_cols(d, s, q0, q1, g->sw);
        memset(d + q1, 0, sizeof(float) * (g->Wq - q1));
    }
}

static void build_chunk(void *ctx, int i)
{
    const fjob *j = ctx;
    const int ph = i / j->g->C, c = i % j->g->C;
    build_plane(j->g, j->x, (float *)j->planes + ph * j->g->phstride + c * j->g->cstride, ph, c);
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
        float *dst = op + (int64_t)r * g->OW + q;
        const float *src = vals + (p - p0);
#if TORQ_F512
        for (int i = 0; i < len; i += 16)
            _mm512_mask_storeu_ps(dst + i, lane_mask(len - i), _mm512_loadu_ps(src + i));
#else
        memcpy(dst, src, sizeof(float) * len);
#endif
        p += len;
    }
}

#if TORQ_F512
/* the first `left` lanes: a tail vector's store mask */
static inline int g_L(const fjob *j)
{
    return j->g->L;
}

/* One register tile: ro output channels x pv vectors of 16 wide pixels from p0. Instantiated
 * per (ro, pv) with exactly sized arrays, which GCC then keeps in registers. */
#define FTILE(RO_, PV_)                                                                          \
    static void ftile_##RO_##_##PV_(const fjob *j, const float *xg, int grp, int ob, int p0)    \
    {                                                                                            \
        const int masked = g_L(j) - p0 < 16 * PV_;                                               \
        __m512 acc[RO_][PV_];                                                                    \
        FTILE_LOOP(RO_, PV_)                                                                     \
        FTILE_STORE(RO_, PV_)                                                                    \
    }

#define FTILE_LOOP(RO_, PV_)                                                             \
    {                                                                                            \
        const torq_fgeom *g = j->g;                                                              \
        const float *wb = j->w + ((int64_t)grp * j->nob + ob) * g->Cg * g->T * g->RO;           \
        for (int v = 0; v < PV_; v++) {                                                          \
            for (int o = 0; o < RO_; o++)                                                        \
                acc[o][v] = _mm512_setzero_ps();                                                 \
        }                                                                                        \
        for (int c = 0; c < g->Cg; c++) {                                                        \
            const float *xc = xg + (int64_t)c * g->cstride + p0;                                 \
            for (int t = 0; t < g->T; t++, wb += g->RO) {                                        \
                const float *xp = xc + g->tap_off[t];                                            \
                _mm_prefetch((const char *)(wb + WPREF), _MM_HINT_T0);                           \
                __m512 xv[PV_];                                                                  \
                for (int v = 0; v < PV_; v++)                                                    \
                    xv[v] = _mm512_loadu_ps(xp + 16 * v);                                        \
                for (int o = 0; o < RO_; o++) {                                                  \
                    const __m512 wv = _mm512_set1_ps(wb[o]);                                     \
                    for (int v = 0; v < PV_; v++)                                                \
                        acc[o][v] = _mm512_fmadd_ps(wv, xv[v], acc[o][v]);                       \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }

/* finish (bias, clamp, bf16) each accumulator by value and store it: straight into the output
 * plane when its rows are the wide rows, else through tmp and store_wide */
#define FTILE_STORE(RO_, PV_)                                                                    \
    {                                                                                            \
        const torq_fgeom *g = j->g;                                                              \
        const __m512 lo = _mm512_set1_ps(g->lo), hi = _mm512_set1_ps(g->hi);                    \
        const int end = masked ? g->L : p0 + 16 * PV_;                                           \
        float tmp[16 * PV_];                                                                     \
        for (int o = 0; o < RO_; o++) {                                                          \
            const int oc = grp * g->Og + ob * g->RO + o;                                         \
            float *op = j->out + (int64_t)oc * g->OH * g->OW;                                    \
            const __m512 bv = _mm512_set1_ps(j->bias[oc]);                                       \
            for (int v = 0; v < PV_; v++) {                                                      \
                const __m512 y = torq_bf16_finish_x16(acc[o][v], bv, lo, hi, g->bf16);           \
                if (g->Wq == g->OW)                                                              \
                    _mm512_mask_storeu_ps(op + p0 + 16 * v, lane_mask(g->L - p0 - 16 * v), y);   \
                else                                                                             \
                    _mm512_storeu_ps(tmp + 16 * v, y);                                           \
            }                                                                                    \
            if (g->Wq != g->OW)                                                                  \
                store_wide(g, op, tmp, p0, end);                                                 \
        }                                                                                        \
    }

/* every (channels, vectors) a tile may need: a plane's last tile takes only the vectors it covers */
FTILE(1, 1) FTILE(1, 2) FTILE(1, 3) FTILE(1, 4) FTILE(1, 5) FTILE(1, 6) FTILE(1, 7) FTILE(1, 8)
FTILE(2, 1) FTILE(2, 2) FTILE(2, 3) FTILE(2, 4) FTILE(3, 1) FTILE(3, 2) FTILE(3, 3) FTILE(3, 4)
FTILE(4, 1) FTILE(4, 2) FTILE(4, 3) FTILE(4, 4) FTILE(5, 1) FTILE(5, 2) FTILE(5, 3) FTILE(5, 4)
FTILE(6, 1) FTILE(6, 2) FTILE(6, 3) FTILE(6, 4)

/* One output row r of one channel (RO == 1) in NV_ vectors, stored straight into the output */
#define FROW(NV_)                                                                                \
    static void frow_##NV_(const fjob *j, const float *xg, int grp, int ob, int r)               \
    {                                                                                            \
        const int p0 = r * j->g->Wq;                                                             \
        __m512 acc[1][NV_];                                                                      \
        FTILE_LOOP(1, NV_)                                                                       \
        const torq_fgeom *g = j->g;                                                              \
        const int oc = grp * g->Og + ob;                                                         \
        float *op = j->out + ((int64_t)oc * g->OH + r) * g->OW;                                  \
        const __m512 bv = _mm512_set1_ps(j->bias[oc]), lo = _mm512_set1_ps(g->lo), hi = _mm512_set1_ps(g->hi); \
        for (int v = 0; v < NV_; v++)                                                            \
            _mm512_mask_storeu_ps(op + 16 * v, lane_mask(g->OW - 16 * v),                        \
                                  torq_bf16_finish_x16(acc[0][v], bv, lo, hi, g->bf16));         \
    }
FROW(1) FROW(2) FROW(3) FROW(4) FROW(5) FROW(6) FROW(7) FROW(8)
typedef void (*frow_fn)(const fjob *, const float *, int, int, int);
static const frow_fn FROWS[9] = {0, frow_1, frow_2, frow_3, frow_4, frow_5, frow_6, frow_7, frow_8};
typedef void (*ftile_fn)(const fjob *, const float *, int, int, int);
static const ftile_fn FTILES[FRO + 1][5] = {
    {0}, {0, ftile_1_1, ftile_1_2, ftile_1_3, ftile_1_4}, {0, ftile_2_1, ftile_2_2, ftile_2_3, ftile_2_4},
    {0, ftile_3_1, ftile_3_2, ftile_3_3, ftile_3_4}, {0, ftile_4_1, ftile_4_2, ftile_4_3, ftile_4_4},
    {0, ftile_5_1, ftile_5_2, ftile_5_3, ftile_5_4}, {0, ftile_6_1, ftile_6_2, ftile_6_3, ftile_6_4}};
static const ftile_fn FTILES8[9] = {0, ftile_1_1, ftile_1_2, ftile_1_3, ftile_1_4, ftile_1_5, ftile_1_6, ftile_1_7,
                                    ftile_1_8};

#else   /* portable: the same lanes and order, one output at a time */

static void ftile_portable(const fjob *j, const float *xg, int grp, int ob, int p0, int end, int ro)
{
    const torq_fgeom *g = j->g;
    float vals[128];
    for (int o = 0; o < ro; o++) {
        const int oc = grp * g->Og + ob * g->RO + o;
        for (int p = p0; p < end; p++) {
            const float *wb = j->w + ((int64_t)grp * j->nob + ob) * g->Cg * g->T * g->RO + o;
            float acc = 0.0f;
            for (int c = 0; c < g->Cg; c++) {
                const float *xc = xg + (int64_t)c * g->cstride + p;
                for (int t = 0; t < g->T; t++, wb += g->RO)
                    acc = torq_fma32(acc, *wb, xc[g->tap_off[t]]);
            }
            vals[p - p0] = torq_bf16_finish(acc, j->bias[oc], g->lo, g->hi, g->bf16);
        }
        store_wide(g, j->out + (int64_t)oc * g->OH * g->OW, vals, p0, end);
    }
}
#endif

/* one tile: ob's output channels of group grp, wide pixels from p0 (xg: the group's planes) */
static inline void conv_tile(const fjob *j, const float *xg, int grp, int ob, int tile)
{
    const torq_fgeom *g = j->g;
    const int p0 = g->rowtile ? tile * g->Wq : tile * 16 * g->PV;
    const int ro = g->Og - ob * g->RO < g->RO ? g->Og - ob * g->RO : g->RO;
#if TORQ_F512
    const int left = (g->L - p0 + 15) / 16, pv = left < g->PV ? left : g->PV;     /* vectors this tile needs */
    if (g->rowtile)
        FROWS[(g->OW + 15) / 16](j, xg, grp, ob, tile);
    else if (g->PV == 8)
        FTILES8[pv](j, xg, grp, ob, p0);
    else
        FTILES[ro][pv](j, xg, grp, ob, p0);
#else
    const int end = g->rowtile ? p0 + g->OW : (p0 + 16 * g->PV < g->L ? p0 + 16 * g->PV : g->L);
    ftile_portable(j, xg, grp, ob, p0, end, ro);
#endif
}

/* planes shared by every chunk: chunk i = (group, output block, tile). Consecutive chunks share
 * a weight block (tiles fastest: a few long output streams) when the weights outweigh the planes
 * or K is short (the stores dominate), else a tile's pixels (output blocks fastest). Measured on
 * MobileNetV2's 1x1 convs: 16 -> 96 at 112x112 1.84 -> 0.95 ms tiles fastest; 144 -> 24 at 56x56
 * 0.40 -> 0.64 ms (1 thread, load ~6) */
static void conv_chunk(void *ctx, int i)
{
    const fjob *j = ctx;
    int ob, tile, grp;
    if (j->tiles_fastest) {
        tile = i % j->ntiles, ob = (i / j->ntiles) % j->nob, grp = i / j->ntiles / j->nob;
    } else {
        ob = i % j->nob, tile = (i / j->nob) % j->ntiles, grp = i / j->nob / j->ntiles;
    }
    conv_tile(j, j->planes + (int64_t)grp * j->g->Cg * j->g->cstride, grp, ob, tile);
}

/* chunks [i0, i1): threads claim ranges of chunks, not single ones -- a 1x1 conv with a short K has
 * chunks of ~0.2 us (16 -> 96 channels at 112x112: 3136 of them), and two threads claiming each
 * one from the pool's shared counter spend more time passing its cache line than computing */
static void conv_range(void *ctx, int i0, int i1)
{
    for (int i = i0; i < i1; i++)
        conv_chunk(ctx, i);
}

#define RANGE_WORK (1 << 17)    /* MACs per range claimed (~3 us): few claims, and no long last range */

/* grouped convs (depthwise...): chunk = one group, its planes built into this thread's scratch
 * and used at once while they are in cache */
static void group_chunk(void *ctx, int grp)
{
    const fjob *j = ctx;
    const torq_fgeom *g = j->g;
    float *xg = (float *)thread_scratch(sizeof(float) * (g->phstride * g->nph + SLACK));
    memset(xg + g->phstride * g->nph, 0, sizeof(float) * SLACK);
    for (int ph = 0; ph < g->nph; ph++)
        for (int c = 0; c < g->Cg; c++)
            build_plane(g, j->x, xg + ph * g->phstride + c * g->cstride, ph, grp * g->Cg + c);
    for (int tile = 0; tile < j->ntiles; tile++)
        for (int ob = 0; ob < j->nob; ob++)
            conv_tile(j, xg, grp, ob, tile);
}

/* x [N, C, H, W] -> out [N, G * Og, OH, OW]; w packed [G][ceil(Og / RO)][Cg][T][RO] */
int torq_conv_f32(const float *x, float *out, const float *w, const float *bias, const torq_fgeom *g,
                  int nthreads)
{
#if TORQ_F512
    if (g->dwrows)
        return torq_dw_rows_f32(x, out, w, bias, g, nthreads);
#endif
    fjob j = {g, NULL, w, bias, NULL, NULL, 0, (g->Og + g->RO - 1) / g->RO, 0};
    j.ntiles = g->rowtile ? g->OH : (g->L + 16 * g->PV - 1) / (16 * g->PV);
    j.tiles_fastest = g->Cg * g->T <= 32 || (int64_t)g->G * g->Og * g->Cg * g->T > (int64_t)g->C * g->cstride * g->nph;
    const int local = g->G > 1 && !g->direct;        /* planes per group, phstride = Cg planes */
    float *planes = NULL;
    if (!g->direct && !local) {
        planes = (float *)thread_scratch(sizeof(float) * (g->phstride * g->nph + SLACK));
        memset(planes + g->phstride * g->nph, 0, sizeof(float) * SLACK);
    }
    nthreads = float_threads((int64_t)g->G * g->Og * g->L * g->Cg * g->T, nthreads);
    for (int n = 0; n < g->N; n++) {
        j.x = x + (int64_t)n * g->C * g->H * g->W;
        j.out = out + (int64_t)n * g->G * g->Og * g->OH * g->OW;
        if (local) {
            torq_parallel_for(g->G, group_chunk, &j, nthreads);
            continue;
        }
        if (g->direct) {
            j.planes = j.x;
        } else {
            j.planes = planes;
            torq_parallel_for(g->nph * g->C, build_chunk, &j, nthreads);
        }
        const int64_t chunk = (int64_t)(g->rowtile ? g->OW : 16 * g->PV) * g->RO * g->Cg * g->T;
        torq_parallel_grain(g->G * j.nob * j.ntiles, chunk >= RANGE_WORK ? 1 : (int)(RANGE_WORK / chunk), conv_range, &j,
                            nthreads);
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
    int packed;                     /* B is [ceil(N / 64)][K][64] (a weight), else [K][N] */
} gjob;

/* B[k][n0 ..]: in a packed B, 64-column panels stream sequentially over k */
static inline const float *b_at(const gjob *j, const float *B, int k, int n0)
{
    return j->packed ? B + ((int64_t)(n0 / 64) * j->K + k) * 64 + n0 % 64 : B + (int64_t)k * j->N + n0;
}

#if TORQ_F512
static inline __attribute__((always_inline)) void
gtile(const gjob *j, const float *A, const float *B, float *C, int m0, int n0, const int rm, const int masked)
{
    __m512 acc[GRM][GNV];
    const int rem = j->N - n0;
    for (int v = 0; v < GNV; v++) {
        for (int r = 0; r < rm; r++)
            acc[r][v] = _mm512_setzero_ps();
    }
    const float *a = A + (int64_t)m0 * j->K;
    for (int k = 0; k < j->K; k++) {
        const float *b = b_at(j, B, k, n0);
        if (j->packed)
            _mm_prefetch((const char *)(b + 8 * 64), _MM_HINT_T0);
        __m512 bv[GNV];
        for (int v = 0; v < GNV; v++)
            bv[v] = masked ? _mm512_maskz_loadu_ps(lane_mask(rem - 16 * v), b + 16 * v) : _mm512_loadu_ps(b + 16 * v);
        for (int r = 0; r < rm; r++) {
            const __m512 av = _mm512_set1_ps(a[(int64_t)r * j->K + k]);
            for (int v = 0; v < GNV; v++)
                acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    for (int v = 0; v < GNV; v++) {
        const __m512 bias = j->bias ? _mm512_maskz_loadu_ps(lane_mask(rem - 16 * v), j->bias + n0 + 16 * v) : _mm512_setzero_ps();
        for (int r = 0; r < rm; r++) {
            float *c = C + (int64_t)(m0 + r) * j->N + n0 + 16 * v;
            const __m512 y = j->bias ? torq_bf16_finish_x16(acc[r][v], bias, lo, hi, j->bf16)
                                     : torq_bf16_finish_x16(acc[r][v], _mm512_setzero_ps(), lo, hi, j->bf16);
            _mm512_mask_storeu_ps(c, lane_mask(rem - 16 * v), y);
        }
    }
}

#define GT(RM_)                                                                                   \
    static void gtile_##RM_##_0(const gjob *j, const float *A, const float *B, float *C, int m0, int n0) \
    {                                                                                             \
        gtile(j, A, B, C, m0, n0, RM_, 0);                                                        \
    }                                                                                             \
    static void gtile_##RM_##_1(const gjob *j, const float *A, const float *B, float *C, int m0, int n0) \
    {                                                                                             \
        gtile(j, A, B, C, m0, n0, RM_, 1);                                                        \
    }                                                                                             \
    static void gtile_##RM_(const gjob *j, const float *A, const float *B, float *C, int m0, int n0, int masked) \
    {                                                                                             \
        (masked ? gtile_##RM_##_1 : gtile_##RM_##_0)(j, A, B, C, m0, n0);                         \
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
                acc = torq_fma32(acc, A[(int64_t)r * j->K + k], *b_at(j, B, k, n));
            C[(int64_t)r * j->N + n] = torq_bf16_finish(acc, j->bias ? j->bias[n] : 0.0f, j->lo, j->hi, j->bf16);
        }
#endif
}

static void gemm_range(void *ctx, int i0, int i1)
{
    for (int i = i0; i < i1; i++)
        gemm_chunk(ctx, i);
}

/* C[b] = finish(A[b] [M, K] @ B[b] [K, N] + bias [N]) for b < batch (batch strides in floats;
 * 0 broadcasts an operand); bias may be NULL; a packed B (one weight, sB = 0) is in 64-column
 * panels, zero-padded to a multiple of 64 columns */
int torq_matmul_f32(const float *A, const float *B, float *C, const float *bias, int batch, int M, int K, int N,
                    int64_t sA, int64_t sB, int64_t sC, float lo, float hi, int bf16, int packed, int nthreads)
{
    gjob j = {A, B, bias, C, M, K, N, (M + GRM - 1) / GRM, (N + 16 * GNV - 1) / (16 * GNV), bf16, sA, sB, sC, lo, hi,
              packed};
    const int64_t chunk = (int64_t)GRM * 16 * GNV * K;
    torq_parallel_grain(batch * j.nmb * j.nnb, chunk >= RANGE_WORK ? 1 : (int)(RANGE_WORK / chunk), gemm_range, &j,
                        float_threads((int64_t)batch * M * N * K, nthreads));
    return 0;
}

int torq_float_features(void)
{
    return TORQ_F512;
}
