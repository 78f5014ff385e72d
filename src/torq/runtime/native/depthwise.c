/* The native engine's depthwise convolution and fully connected layer (see conv.c for the
 * exactness rules). Depthwise: with AVX512-VBMI in integers (below); else in float32, exact
 * because the caller checked 128 * sum|w| < 2**24 per channel. Fully connected: 16 output
 * channels per vector. */
#include "common.h"

/* Depthwise in integers: the taps of a kernel are packed four to a dword ("quads"), each quad
 * reading its pixels from at most two 64-byte windows of the u8 phase images (x ^ 0x80, as in
 * conv.c); vpermb / vpermt2b lays the four tap pixels of each of 16 output pixels side by side
 * and one vpdpbusd adds their four products. Which tap sits in which slot, and the byte
 * indices, are computed by the caller (runtime/native/ops.py, ``_dw_quads``). */
typedef struct {
    int32_t nq;                 /* quads */
    const int32_t *win;         /* [nq][4]: phase and offset of window A, of window B (phase -1: none) */
    const uint8_t *idx;         /* [nq][64] byte indices into A (0..63) or B (64..127) */
    const int32_t *wq;          /* [C][nq] four int8 weights per quad (0 in an empty slot) */
} torq_dwq;


/* ------------------------------------------------------------------ depthwise convolution */

#if TORQ_VNNI
/* P vectors of 16 outputs from wide index p0: sum over taps of w[t] * phase pixels (exact),
 * requantised; P a constant at each call so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void
dw_vectors(const float *ph, const torq_geom *g, const float *w, int p0, int P, __m512i adj, int c,
           const torq_rq *q, __m128i *res)
{
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int t = 0; t < g->T; t++) {
        const float *src = ph + (size_t)g->tap_ph[t] * g->Lph + g->tap_off[t] + p0;
        const __m512 wv = _mm512_set1_ps(w[t]);
        for (int k = 0; k < P; k++)
            acc[k] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(src + 16 * k), acc[k]);   /* exact */
    }
    for (int k = 0; k < P; k++)
        res[k] = requant16(_mm512_add_epi32(_mm512_cvtps_epi32(acc[k]), adj), c, q);
}

static void dw_vectors_n(const float *ph, const torq_geom *g, const float *w, int p0, int P, __m512i adj, int c,
                         const torq_rq *q, __m128i *res)
{
    switch (P) {
    case 4: dw_vectors(ph, g, w, p0, 4, adj, c, q, res); break;
    case 3: dw_vectors(ph, g, w, p0, 3, adj, c, q, res); break;
    case 2: dw_vectors(ph, g, w, p0, 2, adj, c, q, res); break;
    default: dw_vectors(ph, g, w, p0, 1, adj, c, q, res); break;
    }
}
#endif

#if TORQ_DW_INT
/* P <= 8 vectors of 16 outputs from wide index p0, requantised into dst (the last vector
 * masked by tail); P constant at each call, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void
dwq_run(const uint8_t *ph, const torq_geom *g, const torq_dwq *d, const int32_t *wq, int p0, int P, __m512i adj,
        int c, const torq_rq *q, int8_t *dst, __mmask16 tail)
{
    __m512i acc[8];
    for (int k = 0; k < P; k++)
        acc[k] = adj;
    for (int s = 0; s < d->nq; s++) {
        const int32_t *wn = d->win + 4 * s;
        const __m512i idx = _mm512_loadu_si512(d->idx + 64 * s), wv = _mm512_set1_epi32(wq[s]);
        const uint8_t *a = ph + (size_t)wn[0] * g->Lph + wn[1] + p0;
        if (wn[2] < 0) {
            for (int k = 0; k < P; k++)
                acc[k] = _mm512_dpbusd_epi32(acc[k], _mm512_permutexvar_epi8(idx, _mm512_loadu_si512(a + 16 * k)), wv);
        } else {
            const uint8_t *b = ph + (size_t)wn[2] * g->Lph + wn[3] + p0;
            for (int k = 0; k < P; k++)
                acc[k] = _mm512_dpbusd_epi32(acc[k], _mm512_permutex2var_epi8(_mm512_loadu_si512(a + 16 * k), idx,
                                                                              _mm512_loadu_si512(b + 16 * k)), wv);
        }
    }
    for (int k = 0; k < P; k++)
        _mm_mask_storeu_epi8(dst + 16 * k, k == P - 1 ? tail : 0xFFFF, requant16(acc[k], c, q));
}

static void dwq_run_n(const uint8_t *ph, const torq_geom *g, const torq_dwq *d, const int32_t *wq, int p0, int P,
                      __m512i adj, int c, const torq_rq *q, int8_t *dst, __mmask16 tail)
{
    switch (P) {
    case 8: dwq_run(ph, g, d, wq, p0, 8, adj, c, q, dst, tail); break;
    case 7: dwq_run(ph, g, d, wq, p0, 7, adj, c, q, dst, tail); break;
    case 6: dwq_run(ph, g, d, wq, p0, 6, adj, c, q, dst, tail); break;
    case 5: dwq_run(ph, g, d, wq, p0, 5, adj, c, q, dst, tail); break;
    case 4: dwq_run(ph, g, d, wq, p0, 4, adj, c, q, dst, tail); break;
    case 3: dwq_run(ph, g, d, wq, p0, 3, adj, c, q, dst, tail); break;
    case 2: dwq_run(ph, g, d, wq, p0, 2, adj, c, q, dst, tail); break;
    default: dwq_run(ph, g, d, wq, p0, 1, adj, c, q, dst, tail); break;
    }
}

static inline __mmask64 bytes_mask(int n)
{
    return n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
}

/* dst[i] = src[i * sw] ^ 0x80 for i < n */
static void gather_xor(uint8_t *dst, const int8_t *src, int n, int sw)
{
    const __m512i f = _mm512_set1_epi8((char)0x80);
    int i = 0;
    if (sw == 1) {
        for (; i < n; i += 64) {
            const __mmask64 m = bytes_mask(n - i);
            _mm512_mask_storeu_epi8(dst + i, m, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, src + i), f));
        }
        return;
    }
    if (sw == 2) {              /* the low byte of 32 int16 lanes: the even bytes */
        for (; i < n; i += 32) {
            const int cnt = n - i < 32 ? n - i : 32;
            const __m512i v = _mm512_maskz_loadu_epi8(bytes_mask(2 * cnt - 1), src + 2 * i);
            const __m256i e = _mm256_xor_si256(_mm512_cvtepi16_epi8(v), _mm512_castsi512_si256(f));
            _mm256_mask_storeu_epi8(dst + i, (__mmask32)bytes_mask(cnt), e);
        }
        return;
    }
    for (; i < n; i++)
        dst[i] = (uint8_t)src[i * sw] ^ 0x80;
}

/* One channel plane in integers: u8 phases (ph: nph x Lph bytes), requantised rows straight into
 * dst (returns 1), or for planes narrower than a vector into the wide row obuf [Lpad] (returns 0). */
/* The phase images of one plane: the padding is written once per thread and geometry (fresh
 * == 1), the pixels of every plane. */
static void dwq_pack(const int8_t *x, const torq_geom *g, uint8_t *ph, int fresh)
{
    const uint8_t padu = (uint8_t)g->padv ^ 0x80;
    if (fresh)
        memset(ph, padu, (size_t)g->nph * g->Lph);
    for (int k = 0; k < g->nph; k++) {
        const int a = g->ph_ab[2 * k], b = g->ph_ab[2 * k + 1];
        int q0, q1;
        col_range(g, b, &q0, &q1);
        const int r0 = (g->pt - a + g->sh - 1) / g->sh > 0 ? (g->pt - a + g->sh - 1) / g->sh : 0;
        for (int r = r0; r < g->rows; r++) {
            const int y = r * g->sh + a - g->pt;
            if (y >= g->H)
                break;
            gather_xor(ph + (size_t)k * g->Lph + (size_t)r * g->Wq + q0, x + (size_t)y * g->W + q0 * g->sw + b - g->pl,
                       q1 - q0, g->sw);
        }
    }
}

static int dwq_plane(const int8_t *x, const torq_dwq *d, const torq_geom *g, int c, const torq_rq *rq, uint8_t *ph,
                     int fresh, int8_t *obuf, int8_t *dst)
{
    const torq_rq qq = *rq, *q = &qq;   /* a local copy: the byte stores below cannot alias it */
    dwq_pack(x, g, ph, fresh);
    const int32_t *wq = d->wq + (size_t)c * d->nq;
    const __m512i adj = _mm512_set1_epi32(q->adj[c]);
    if (g->OW >= 16) {
        const int nv = (g->OW + 15) / 16;
        const __mmask16 tail = (__mmask16)((1u << (g->OW - 16 * (nv - 1))) - 1);
        for (int r = 0; r < g->OH; r++)
            for (int v0 = 0; v0 < nv; v0 += 8) {
                const int P = nv - v0 < 8 ? nv - v0 : 8;
                dwq_run_n(ph, g, d, wq, r * g->Wq + 16 * v0, P, adj, c, q, dst + (size_t)r * g->OW + 16 * v0,
                          v0 + P == nv ? tail : 0xFFFF);
            }
        return 1;
    }
    for (int p0 = 0; p0 < g->Lpad; p0 += 128) {
        const int P = (g->Lpad - p0) >= 128 ? 8 : (g->Lpad - p0) / 16;
        dwq_run_n(ph, g, d, wq, p0, P, adj, c, q, obuf + p0, 0xFFFF);
    }
    const __mmask16 m = (__mmask16)((1u << g->OW) - 1);
    for (int r = 0; r < g->OH; r++)
        _mm_mask_storeu_epi8(dst + (size_t)r * g->OW, m, _mm_loadu_si128((const __m128i *)(obuf + (size_t)r * g->Wq)));
    return 1;
}

#endif

/* One channel plane: float phases, float accumulation (exact: the caller bounds every partial
 * sum below 2**24), requantised row by row straight into the output plane dst (returns 1), or
 * for planes narrower than a vector into the wide row obuf [Lpad] (returns 0). */
static int dw_plane(const int8_t *x, const float *w, const torq_geom *g, int c, const torq_rq *rq, float *ph,
                    int8_t *obuf, int8_t *dst)
{
    const torq_rq qq = *rq, *q = &qq;   /* a local copy: the byte stores below cannot alias it */
    const float padf = (float)g->padv;
    for (int k = 0; k < g->nph; k++) {
        const int a = g->ph_ab[2 * k], b = g->ph_ab[2 * k + 1];
        float *dst = ph + (size_t)k * g->Lph;
        int q0, q1;
        col_range(g, b, &q0, &q1);
        for (int r = 0; r < g->rows; r++) {
            const int y = r * g->sh + a - g->pt;
            float *d = dst + (size_t)r * g->Wq;
            if (y < 0 || y >= g->H) {
                for (int qq = 0; qq < g->Wq; qq++)
                    d[qq] = padf;
                continue;
            }
            for (int qq = 0; qq < q0; qq++)
                d[qq] = padf;
            for (int qq = q1; qq < g->Wq; qq++)
                d[qq] = padf;
            const int8_t *restrict src = x + (size_t)y * g->W + q0 * g->sw + b - g->pl;
            float *restrict dd = d + q0;
            const int n = q1 - q0;
            int i = 0;
#if TORQ_VNNI
            if (g->sw == 2)             /* even bytes of 32 int16 lanes: sign-extend the low byte */
                for (; i + 16 <= n && 2 * i + 32 <= g->W - (q0 * g->sw + b - g->pl); i += 16) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(src + 2 * i));
                    v = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
                    _mm512_storeu_ps(dd + i, _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(v)));
                }
#endif
#if TORQ_VNNI
            if (g->sw == 1) {
                for (; i + 16 <= n; i += 16)
                    _mm512_storeu_ps(dd + i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + i)))));
                if (i < n) {
                    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
                    _mm512_mask_storeu_ps(dd + i, m, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, src + i))));
                    i = n;
                }
            }
#endif
            for (; i < n; i++)
                dd[i] = (float)src[i * g->sw];
        }
        memset(dst + (size_t)g->rows * g->Wq, 0, ((size_t)g->Lph - (size_t)g->rows * g->Wq) * sizeof(float));
    }
#if TORQ_VNNI
    const __m512i adj = _mm512_set1_epi32(q->adj[c]);
    __m128i res[4];
    if (g->OW >= 16) {
        const int nv = (g->OW + 15) / 16;
        const __mmask16 tail = (__mmask16)((1u << (g->OW - 16 * (nv - 1))) - 1);
        for (int r = 0; r < g->OH; r++) {
            for (int v0 = 0; v0 < nv; v0 += 4) {
                const int P = nv - v0 < 4 ? nv - v0 : 4;
                dw_vectors_n(ph, g, w, r * g->Wq + 16 * v0, P, adj, c, q, res);
                for (int k = 0; k < P; k++)
                    _mm_mask_storeu_epi8(dst + (size_t)r * g->OW + 16 * (v0 + k), v0 + k == nv - 1 ? tail : 0xFFFF,
                                         res[k]);
            }
        }
        return 1;
    }
    for (int p0 = 0; p0 < g->Lpad; p0 += 64) {
        const int P = (g->Lpad - p0) >= 64 ? 4 : (g->Lpad - p0) / 16;
        dw_vectors_n(ph, g, w, p0, P, adj, c, q, res);
        for (int k = 0; k < P; k++)
            _mm_storeu_si128((__m128i *)(obuf + p0 + 16 * k), res[k]);
    }
#else
    int32_t acc[64];
    for (int p0 = 0; p0 < g->Lpad; p0 += 64) {
        const int n = (g->Lpad - p0) >= 64 ? 64 : g->Lpad - p0;
        float f[64] = {0};
        for (int t = 0; t < g->T; t++) {
            const float *src = ph + (size_t)g->tap_ph[t] * g->Lph + g->tap_off[t] + p0;
            for (int i = 0; i < n; i++)
                f[i] += w[t] * src[i];
        }
        for (int i = 0; i < n; i++)
            acc[i] = (int32_t)f[i];
        requant_row(acc, n, c, q, obuf + p0);
    }
#endif
    (void)dst;
    return 0;
}

typedef struct {
    const int8_t *x;
    int8_t *out;
    const float *wf;
    const torq_dwq *dq;
    const torq_geom *g;
    const torq_rq *rq;
} dw_job;

/* channel planes [begin, end) of the batch (plane i = image i / C, channel i % C); each thread
 * keeps its scratch (phases, wide row), and which geometry's padding the integer path's phases
 * hold (written once, not per plane) */
static void dw_planes(void *ctx, int begin, int end)
{
    static _Thread_local struct {
        uint8_t *buf;
        size_t cap;
        int64_t padded;
    } tls;
    __typeof__(tls) *t = &tls;          /* one thread-local lookup per range */
    const dw_job *j = ctx;
    const torq_geom *g = j->g;
    const size_t phb = (size_t)g->nph * g->Lph * sizeof(float), need = phb + g->Lpad + 64;
    if (t->cap < need) {
        free(t->buf);
        t->buf = malloc(need);
        t->cap = t->buf ? need : 0;
        t->padded = 0;
        if (!t->buf)
            abort();
    }
    uint8_t *buf = t->buf;
    for (int i = begin; i < end; i++) {
        const int c = i % g->C;
        int8_t *dst = j->out + (size_t)i * g->OH * g->OW;
#if TORQ_DW_INT
        if (i + 1 < g->N * g->C) {      /* the next plane */
            const char *nx = (const char *)(j->x + (size_t)(i + 1) * g->H * g->W);
            for (size_t o = 0; o < (size_t)g->H * g->W; o += 64)
                _mm_prefetch(nx + o, _MM_HINT_T1);
        }
        const int fresh = t->padded != g->id;
        t->padded = g->id;
        dwq_plane(j->x + (size_t)i * g->H * g->W, j->dq, g, c, j->rq, buf, fresh,
                  (int8_t *)(buf + (size_t)g->nph * g->Lph), dst);
        continue;
#endif
        if (dw_plane(j->x + (size_t)i * g->H * g->W, j->wf + (size_t)c * g->T, g, c, j->rq, (float *)buf,
                     (int8_t *)(buf + phb), dst))
            continue;
        for (int r = 0; r < g->OH; r++)
            memcpy(dst + (size_t)r * g->OW, buf + phb + (size_t)r * g->Wq, g->OW);
    }
}

/* x [N][C][H][W] -> out [N][C][OH][OW]; wf [C][T] float weights (float path), dq the quads
 * (integer path). */
int torq_dw_i8(const int8_t *x, int8_t *out, const float *wf, const torq_dwq *dq, const torq_geom *g,
               const torq_rq *rq, int nthreads)
{
    dw_job j = {x, out, wf, dq, g, rq};
    /* ranges of >= 4096 outputs (a few microseconds): a 7x7 plane alone is ~70 ns of work */
    torq_parallel_ranges(g->N * g->C, 4096 / (g->OH * g->OW + 1) + 1, dw_planes, &j, nthreads);
    return 0;
}

/* ------------------------------------------------------------------ fully connected */

/* x [M][K] int8 -> out [M][O] int8; wpack [O/16][KQ][16][4] (O, K zero-padded). Lanes are 16
 * output channels. */
int torq_fc_i8(const int8_t *x, int8_t *out, const int8_t *wpack, int M, int K, int O, const torq_rq *rq)
{
    const int KQ = (K + 3) / 4, OB = (O + 15) / 16;
    uint8_t *scratch = thread_scratch((size_t)KQ * 4 + 64);
    for (int m = 0; m < M; m++) {
        uint8_t *xq = scratch;
        for (int k = 0; k < KQ * 4; k++)
            xq[k] = k < K ? ((uint8_t)x[(size_t)m * K + k] ^ 0x80) : 0;
        for (int ob = 0; ob < OB; ob++) {
            const int8_t *w = wpack + (size_t)ob * KQ * 64;
            int32_t acc[16];
#if TORQ_VNNI
            __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                            _mm512_setzero_si512()};
            int kq = 0;
            for (; kq + 4 <= KQ; kq += 4)
                for (int j = 0; j < 4; j++)
                    a[j] = _mm512_dpbusd_epi32(a[j], _mm512_set1_epi32(((const int32_t *)xq)[kq + j]),
                                               _mm512_loadu_si512(w + (size_t)(kq + j) * 64));
            for (; kq < KQ; kq++)
                a[0] = _mm512_dpbusd_epi32(a[0], _mm512_set1_epi32(((const int32_t *)xq)[kq]),
                                           _mm512_loadu_si512(w + (size_t)kq * 64));
            _mm512_storeu_si512(acc, _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3])));
#else
            memset(acc, 0, sizeof acc);
            for (int kq = 0; kq < KQ; kq++)
                for (int l = 0; l < 16; l++)
                    for (int j = 0; j < 4; j++)
                        acc[l] += xq[4 * kq + j] * w[(size_t)kq * 64 + 4 * l + j];
#endif
            const int n = O - ob * 16 < 16 ? O - ob * 16 : 16;
            for (int l = 0; l < n; l++) {
                int8_t v;
                requant_row(&acc[l], 1, ob * 16 + l, rq, &v);
                out[(size_t)m * O + ob * 16 + l] = v;
            }
        }
    }
    return 0;
}

