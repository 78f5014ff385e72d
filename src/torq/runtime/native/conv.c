/* The native engine's int8 kernels: convolution (any groups / stride / dilation / padding),
 * depthwise convolution and fully connected, each with its requantisation fused, bit-identical
 * to the reference simulator (runtime/kernels + torq/numerics).
 *
 * Exactness: every product sum is computed in integers (u8 x s8 -> int32, VNNI vpdpbusd or
 * plain C), or, for depthwise, in float32 where the caller has proven |every partial sum| < 2**24
 * (then float32 holds each one exactly, in any order). The int8 input x is fed to vpdpbusd as
 * the unsigned byte x + 128 (x ^ 0x80); the constant 128 * sum(w) per output channel is taken
 * off again in ``adj`` (with the bias), so the accumulator is the exact integer. It is wrapped to
 * int32 (as the hardware's register) and requantised by torq/numerics/act.h.
 *
 * Convolution layout: NCHW in and out. The padded input is split in stride "phases" (one per
 * (row, column) residue of the stride), each stored as channel quads [C/4][rows][Wq][4] of
 * bytes; then every tap of the kernel is a constant offset into a phase, and the convolution is
 * a GEMM over the flat output pixel index p = row * Wq + column ("wide" rows: the Wq - OW junk
 * columns are computed and dropped). Lanes are 16 output pixels, registers hold 8 output
 * channels x 1-3 pixel vectors; weights are broadcast 4 bytes (one channel quad) at a time.
 */
#include <stdatomic.h>
#include "common.h"

/* bit 0: AVX512-VNNI kernels; bit 1: depthwise in integers (else float32, bounded weights);
 * bit 2: AMX-INT8 convolution compiled in (usable once torq_amx_init grants the tiles) */
int torq_features(void)
{
#if TORQ_VNNI && defined(__AMX_INT8__) && defined(__AMX_TILE__)
    const int amx = 1;
#else
    const int amx = 0;
#endif
    return TORQ_VNNI | TORQ_DW_INT << 1 | amx << 2;
}

static inline void fill32(uint8_t *d, int n, uint32_t v)
{
    for (int i = 0; i < n; i++)
        memcpy(d + 4 * i, &v, 4);
}

#if TORQ_VNNI
/* 16 pixels of a channel row from pixel q (stride sw 1 or 2; cnt <= 16 of them exist) ^ 0x80;
 * 0 for a missing channel (s NULL: its weights are 0) */
static inline __m128i row16(const int8_t *s, int q, int sw, int cnt)
{
    if (!s)
        return _mm_setzero_si128();
    const __m128i f = _mm_set1_epi8((char)0x80);
    if (sw == 1)
        return _mm_xor_si128(_mm_maskz_loadu_epi8((__mmask16)((1u << cnt) - 1), s + q), f);
    const __m256i v = _mm256_maskz_loadu_epi8((__mmask32)((1ull << (2 * cnt - 1)) - 1), s + 2 * q);
    return _mm_xor_si128(_mm256_cvtepi16_epi8(v), f);
}
#endif

/* d[4q + l] = s_l[q * sw] ^ 0x80 for q < n (4 channel rows into quads; a NULL row gives 0) */
static void interleave4(uint8_t *d, const int8_t *s0, const int8_t *s1, const int8_t *s2, const int8_t *s3, int n,
                        int sw)
{
    int q = 0;
#if TORQ_VNNI
    if (sw == 1 && s0 && s1 && s2 && s3) {  /* 64 pixels: unpacks in each 128-bit lane, then a 4x4 lane transpose */
        const __m512i f = _mm512_set1_epi8((char)0x80);
        for (; q + 64 <= n; q += 64) {
            const __m512i a0 = _mm512_xor_si512(_mm512_loadu_si512(s0 + q), f);
            const __m512i a1 = _mm512_xor_si512(_mm512_loadu_si512(s1 + q), f);
            const __m512i a2 = _mm512_xor_si512(_mm512_loadu_si512(s2 + q), f);
            const __m512i a3 = _mm512_xor_si512(_mm512_loadu_si512(s3 + q), f);
            const __m512i lo01 = _mm512_unpacklo_epi8(a0, a1), hi01 = _mm512_unpackhi_epi8(a0, a1);
            const __m512i lo23 = _mm512_unpacklo_epi8(a2, a3), hi23 = _mm512_unpackhi_epi8(a2, a3);
            const __m512i r0 = _mm512_unpacklo_epi16(lo01, lo23), r1 = _mm512_unpackhi_epi16(lo01, lo23);
            const __m512i r2 = _mm512_unpacklo_epi16(hi01, hi23), r3 = _mm512_unpackhi_epi16(hi01, hi23);
            const __m512i t0 = _mm512_shuffle_i64x2(r0, r1, 0x44), t1 = _mm512_shuffle_i64x2(r2, r3, 0x44);
            const __m512i t2 = _mm512_shuffle_i64x2(r0, r1, 0xEE), t3 = _mm512_shuffle_i64x2(r2, r3, 0xEE);
            _mm512_storeu_si512(d + 4 * q, _mm512_shuffle_i64x2(t0, t1, 0x88));
            _mm512_storeu_si512(d + 4 * q + 64, _mm512_shuffle_i64x2(t0, t1, 0xDD));
            _mm512_storeu_si512(d + 4 * q + 128, _mm512_shuffle_i64x2(t2, t3, 0x88));
            _mm512_storeu_si512(d + 4 * q + 192, _mm512_shuffle_i64x2(t2, t3, 0xDD));
        }
    }
    if (sw <= 2)                /* 16 pixels a step, the last one masked */
        for (; q < n; q += 16) {
            const int cnt = n - q < 16 ? n - q : 16;
            const __m128i a0 = row16(s0, q, sw, cnt), a1 = row16(s1, q, sw, cnt);
            const __m128i a2 = row16(s2, q, sw, cnt), a3 = row16(s3, q, sw, cnt);
            const __m128i lo01 = _mm_unpacklo_epi8(a0, a1), hi01 = _mm_unpackhi_epi8(a0, a1);
            const __m128i lo23 = _mm_unpacklo_epi8(a2, a3), hi23 = _mm_unpackhi_epi8(a2, a3);
            const __m128i o[4] = {_mm_unpacklo_epi16(lo01, lo23), _mm_unpackhi_epi16(lo01, lo23),
                                  _mm_unpacklo_epi16(hi01, hi23), _mm_unpackhi_epi16(hi01, hi23)};
            const __mmask64 m = cnt == 16 ? ~(__mmask64)0 : (((__mmask64)1 << (4 * cnt)) - 1);
            for (int k = 0; k < 4; k++)
                _mm_mask_storeu_epi8(d + 4 * q + 16 * k, (__mmask16)(m >> (16 * k)), o[k]);
        }
#endif
    const int8_t *s[4] = {s0, s1, s2, s3};
    for (; q < n; q++)
        for (int l = 0; l < 4; l++)
            d[4 * q + l] = s[l] ? (uint8_t)s[l][q * sw] ^ 0x80 : 0;
}

/* Phase k, channel quad cq of channels [c0, c0 + Cg) of image x [C][H][W] as u8 quads
 * (x ^ 0x80); channels past Cg are 0 (their weights are 0). */
static void pack_phase(const int8_t *x, const torq_geom *g, int c0, uint8_t *ph, int k, int cq, int CQ)
{
    const uint8_t padu = (uint8_t)g->padv ^ 0x80;
    const size_t plane = (size_t)g->Lph * 4;
    {
        {
            const int a = g->ph_ab[2 * k], b = g->ph_ab[2 * k + 1];
            const int nreal = g->Cg - 4 * cq < 4 ? g->Cg - 4 * cq : 4;
            uint8_t pat[4] = {0, 0, 0, 0};
            for (int l = 0; l < nreal; l++)
                pat[l] = padu;
            uint32_t pad32;
            memcpy(&pad32, pat, 4);
            int q0, q1;
            col_range(g, b, &q0, &q1);
            uint8_t *dst = ph + ((size_t)k * CQ + cq) * plane;
            if (nreal == 4 && g->sh == 1 && g->sw == 1 && a == 0 && b == 0 && g->pt == 0 && g->pl == 0
                && g->Wq == g->W && g->rows == g->H) {      /* unpadded, unit stride: the planes are one row */
                const int8_t *s0 = x + (size_t)(c0 + 4 * cq) * g->H * g->W;
                const size_t hw = (size_t)g->H * g->W;
                interleave4(dst, s0, s0 + hw, s0 + 2 * hw, s0 + 3 * hw, (int)hw, 1);
                memset(dst + hw * 4, 0, plane - hw * 4);
                return;
            }
            for (int r = 0; r < g->rows; r++) {
                const int y = r * g->sh + a - g->pt;
                uint8_t *d = dst + (size_t)r * g->Wq * 4;
                if (y < 0 || y >= g->H) {
                    fill32(d, g->Wq, pad32);
                    continue;
                }
                fill32(d, q0, pad32);
                fill32(d + 4 * q1, g->Wq - q1, pad32);
                const int8_t *s[4] = {0, 0, 0, 0};
                for (int l = 0; l < nreal; l++)
                    s[l] = x + ((size_t)(c0 + 4 * cq + l) * g->H + y) * g->W + q0 * g->sw + b - g->pl;
                interleave4(d + 4 * q0, s[0], s[1], s[2], s[3], q1 - q0, g->sw);
            }
            memset(dst + (size_t)g->rows * g->Wq * 4, 0, plane - (size_t)g->rows * g->Wq * 4);
        }
    }
}

#if TORQ_VNNI
/* 16 outputs at pixel p of a row of lim (the output plane itself ends there: masked) */
static inline void tile_store(int8_t *row, int p, int lim, __m128i v)
{
    if (p + 16 <= lim)
        _mm_storeu_si128((__m128i *)(row + p), v);
    else if (p < lim)
        _mm_mask_storeu_epi8(row + p, (__mmask16)((1u << (lim - p)) - 1), v);
}

/* dot products of R channels x P pixel vectors at pixel p0; w [T][CQ][R][4] of this block */
static inline __attribute__((always_inline)) void
tile_vnni(const uint8_t *ph, const torq_geom *g, int CQ, const int8_t *w, int p0, int P, const torq_rq *q,
          int ob, int Og, int8_t *obuf, size_t ostride)
{
    __m512i acc[R][3];
    const size_t plane = (size_t)g->Lph * 4, phstride = plane * CQ;
    for (int r = 0; r < R; r++) {                  /* adj first: int32 sums wrap alike in any order */
        const __m512i a = _mm512_set1_epi32(ob * R + r < Og ? q->adj[ob * R + r] : 0);
        for (int k = 0; k < P; k++)
            acc[r][k] = a;
    }
    for (int t = 0; t < g->T; t++) {
        const uint8_t *xb = ph + g->tap_ph[t] * phstride + (size_t)(g->tap_off[t] + p0) * 4;
        for (int cq = 0; cq < CQ; cq++, xb += plane, w += R * 4) {
            __m512i xv[3];
            for (int k = 0; k < P; k++)
                xv[k] = _mm512_loadu_si512(xb + 64 * k);
            for (int r = 0; r < R; r++) {
                const __m512i wb = _mm512_set1_epi32(((const int32_t *)w)[r]);
                for (int k = 0; k < P; k++)
                    acc[r][k] = _mm512_dpbusd_epi32(acc[r][k], xv[k], wb);
            }
        }
    }
    const torq_rq qq = *q;          /* a local copy: the byte stores below cannot alias it */
    for (int r = 0; r < R; r++) {
        const int o = ob * R + r;
        if (o >= Og)
            break;
        for (int k = 0; k < P; k++)
            tile_store(obuf + (size_t)o * ostride, p0 + 16 * k, (int)ostride, requant16(acc[r][k], o, &qq));
    }
}

static void tile_p1(const uint8_t *ph, const torq_geom *g, int CQ, const int8_t *w, int p0, const torq_rq *q,
                    int ob, int Og, int8_t *obuf, size_t ostride) { tile_vnni(ph, g, CQ, w, p0, 1, q, ob, Og, obuf, ostride); }
static void tile_p2(const uint8_t *ph, const torq_geom *g, int CQ, const int8_t *w, int p0, const torq_rq *q,
                    int ob, int Og, int8_t *obuf, size_t ostride) { tile_vnni(ph, g, CQ, w, p0, 2, q, ob, Og, obuf, ostride); }
static void tile_p3(const uint8_t *ph, const torq_geom *g, int CQ, const int8_t *w, int p0, const torq_rq *q,
                    int ob, int Og, int8_t *obuf, size_t ostride) { tile_vnni(ph, g, CQ, w, p0, 3, q, ob, Og, obuf, ostride); }
#endif

/* Portable form of a tile (16 * P pixels), same results. */
__attribute__((unused)) static void tile_generic(const uint8_t *ph, const torq_geom *g, int CQ, const int8_t *w, int p0, int P,
                         const torq_rq *q, int ob, int Og, int8_t *obuf, size_t ostride)
{
    int32_t acc[R][48];
    const int n = 16 * P;
    const size_t plane = (size_t)g->Lph * 4, phstride = plane * CQ;
    memset(acc, 0, sizeof acc);
    for (int t = 0; t < g->T; t++) {
        const uint8_t *xb = ph + g->tap_ph[t] * phstride + (size_t)(g->tap_off[t] + p0) * 4;
        for (int cq = 0; cq < CQ; cq++, xb += plane, w += R * 4) {
            for (int r = 0; r < R; r++) {
                const int32_t w0 = w[4 * r], w1 = w[4 * r + 1], w2 = w[4 * r + 2], w3 = w[4 * r + 3];
                for (int i = 0; i < n; i++)
                    acc[r][i] += xb[4 * i] * w0 + xb[4 * i + 1] * w1 + xb[4 * i + 2] * w2 + xb[4 * i + 3] * w3;
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const int o = ob * R + r;
        if (o >= Og)
            break;
        requant_row(acc[r], p0 + n <= (int)ostride ? n : (int)ostride - p0, o, q, obuf + (size_t)o * ostride + p0);
    }
}

/* One group of one image, shared by the chunks of its parallel loops. */
typedef struct {
    const int8_t *x, *w;            /* image; this group's packed weights */
    const torq_geom *g;
    torq_rq q;                      /* this group's requantisation */
    uint8_t *ph;
    int8_t *obuf, *out;             /* tiles write obuf (stride ostride); out: the group's planes */
    size_t ostride, wblock;
    int c0, CQ, CQs, OB, ntiles, n3, rest, per;   /* CQs: quad planes per phase; per: tiles per chunk */
    _Alignas(64) atomic_int next;   /* AMX: the next unit to claim (a cache line of its own) */
    char pad[60];
} conv_job;

static void pack_range(void *ctx, int begin, int end)
{
    const conv_job *j = ctx;
    for (int i = begin; i < end; i++)
        pack_phase(j->x, j->g, j->c0, j->ph, i / j->CQ, i % j->CQ, j->CQs);
}

/* quad planes per claim: >= 16 KB of packing */
static int pack_grain(const torq_geom *g)
{
    return 16384 / (g->Lph * 4 + 1) + 1;
}

static void tiles_chunk(void *ctx, int i)
{
    const conv_job *j = ctx;
    const int total = j->OB * j->ntiles, end = (i + 1) * j->per < total ? (i + 1) * j->per : total;
    for (int t = i * j->per; t < end; t++) {
        const int ob = t / j->ntiles, tl = t % j->ntiles;
        const int8_t *w = j->w + (size_t)ob * j->wblock;
        const int p0 = tl * 48, P = tl < j->n3 ? 3 : j->rest;
#if TORQ_VNNI
        if (P == 3)
            tile_p3(j->ph, j->g, j->CQ, w, p0, &j->q, ob, j->g->Og, j->obuf, j->ostride);
        else if (P == 2)
            tile_p2(j->ph, j->g, j->CQ, w, p0, &j->q, ob, j->g->Og, j->obuf, j->ostride);
        else
            tile_p1(j->ph, j->g, j->CQ, w, p0, &j->q, ob, j->g->Og, j->obuf, j->ostride);
#else
        tile_generic(j->ph, j->g, j->CQ, w, p0, P, &j->q, ob, j->g->Og, j->obuf, j->ostride);
#endif
    }
}

static void compact_range(void *ctx, int begin, int end)
{
    const conv_job *j = ctx;
    const torq_geom *g = j->g;
    for (int o = begin; o < end; o++) {
        int8_t *dst = j->out + (size_t)o * g->OH * g->OW;
        for (int r = 0; r < g->OH; r++)
            memcpy(dst + (size_t)r * g->OW, j->obuf + (size_t)o * g->Lpad + (size_t)r * g->Wq, g->OW);
    }
}

/* x [N][C][H][W] int8 -> out [N][G*Og][OH][OW] int8. wpack [G][OB][T][CQ][R][4]; rq indexed by
 * the output channel of the whole layer. Scratch: phases (nph * CQ * Lph * 4 bytes) then the
 * wide output of one group (Og * Lpad bytes). */
int torq_conv_i8(const int8_t *x, int8_t *out, const int8_t *wpack, const torq_geom *g, const torq_rq *rq,
                 int nthreads)
{
    conv_job j;
    const int CQ = (g->Cg + 3) / 4;
    uint8_t *scratch = thread_scratch((size_t)g->nph * CQ * g->Lph * 4 + (size_t)g->Og * g->Lpad);
    j.g = g;
    j.CQ = j.CQs = (g->Cg + 3) / 4;
    j.OB = (g->Og + R - 1) / R;
    j.wblock = (size_t)g->T * j.CQ * R * 4;
    j.ph = scratch;
    const int nvec = g->Lpad / 16;
    j.n3 = nvec / 3;
    j.rest = nvec % 3;
    j.ntiles = j.n3 + (j.rest ? 1 : 0);
    j.per = j.OB * j.ntiles / (nthreads * 8) + 1;
    const int direct = g->Wq == g->OW;      /* rows without junk columns: tiles write the output itself */
    j.ostride = direct ? (size_t)g->L : (size_t)g->Lpad;
    const int O = g->G * g->Og, nchunks = (j.OB * j.ntiles + j.per - 1) / j.per;
    for (int n = 0; n < g->N; n++) {
        for (int gi = 0; gi < g->G; gi++) {
            j.x = x + (size_t)n * g->C * g->H * g->W;
            j.c0 = gi * g->Cg;
            j.w = wpack + (size_t)gi * j.OB * j.wblock;
            j.q = *rq;
            j.q.adj += gi * g->Og;
            j.q.mult += gi * g->Og;
            j.q.scale += gi * g->Og;
            j.out = out + ((size_t)n * O + gi * g->Og) * g->OH * g->OW;
            j.obuf = direct ? j.out : (int8_t *)(scratch + (size_t)g->nph * j.CQ * g->Lph * 4);
            torq_parallel_ranges(g->nph * j.CQ, pack_grain(g), pack_range, &j, nthreads);
            torq_parallel_for(nchunks, tiles_chunk, &j, nthreads);
            if (!direct)
                torq_parallel_ranges(g->Og, 8192 / (g->OH * g->OW + 1) + 1, compact_range, &j, nthreads);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ AMX-INT8 tiles */

/* Where the CPU has AMX-INT8 (and the kernel grants this process the tile state), layers with
 * >= 32 input channels per group run on tiles: C[oc][px] += W[oc][64 channels] . X[16 quads][px]
 * (TDPBSUD: signed weights, unsigned x ^ 0x80), 32 output channels x 32 pixels per unit (four C
 * tiles). The B tiles are the phase quads themselves (row stride one quad plane): the phases
 * get their quad planes rounded up to 16 per phase (the extra planes meet zero weights). */
#if TORQ_VNNI && defined(__AMX_INT8__) && defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* 1 when this process may use the tiles (asked once, by the caller, at load) */
int torq_amx_init(void)
{
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

/* one unit: 32 output channels x 32 pixels, tiles configured */
static inline void amx_unit(const conv_job *j, int u, const torq_rq *q, int32_t cbuf[4][16][16])
{
    const torq_geom *g = j->g;
    const int KB = j->CQs / 16, nvec = g->Lpad / 16, npb = (nvec + 1) / 2;
    const size_t plane = (size_t)g->Lph * 4, phstride = plane * j->CQs;
    const int op = u / npb, pb = u % npb, p0 = pb * 32;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const int8_t *w = j->w + (size_t)op * g->T * KB * 2048;
    for (int t = 0; t < g->T; t++) {
        const uint8_t *xb = j->ph + g->tap_ph[t] * phstride + (size_t)(g->tap_off[t] + p0) * 4;
        for (int kb = 0; kb < KB; kb++, w += 2048, xb += 16 * plane) {
            _tile_loadd(6, xb, plane);
            _tile_loadd(7, xb + 64, plane);
            _tile_loadd(4, w, 64);
            _tile_loadd(5, w + 1024, 64);
            _tile_dpbsud(0, 4, 6);
            _tile_dpbsud(1, 4, 7);
            _tile_dpbsud(2, 5, 6);
            _tile_dpbsud(3, 5, 7);
        }
    }
    _tile_stored(0, cbuf[0], 64);
    _tile_stored(1, cbuf[1], 64);
    _tile_stored(2, cbuf[2], 64);
    _tile_stored(3, cbuf[3], 64);
    for (int a = 0; a < 2; a++)
        for (int r = 0; r < 16; r++) {
            const int o = (op * 2 + a) * 16 + r;
            if (o >= g->Og)
                break;
            const __m512i adj = _mm512_set1_epi32(q->adj[o]);
            for (int b = 0; b < 2 && pb * 2 + b < nvec; b++)
                tile_store(j->obuf + (size_t)o * j->ostride, p0 + 16 * b, (int)j->ostride,
                           requant16(_mm512_add_epi32(_mm512_load_si512(cbuf[2 * a + b][r]), adj), o, q));
        }
}

/* One thread's share of the units (32 channels x 32 pixels each), claimed j->per at a time from
 * the job's counter: the tiles are configured once per thread and job, not per claim. */
static void amx_worker(void *ctx, int i)
{
    (void)i;
    conv_job *j = ctx;
    const torq_geom *g = j->g;
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    int32_t cbuf[4][16][16] __attribute__((aligned(64)));
    const int total = (j->OB + 1) / 2 * ((g->Lpad / 16 + 1) / 2);
    const torq_rq qq = j->q, *q = &qq;
    for (int u0; (u0 = atomic_fetch_add(&j->next, j->per)) < total;)
        for (int u = u0; u < u0 + j->per && u < total; u++)
            amx_unit(j, u, q, cbuf);
    _tile_release();
}

/* As torq_conv_i8, on tiles; wamx [G][OB/2][T][CQ/16][2][16][64] (oc blocks of 16 in pairs,
 * channel quads in blocks of 16, all zero-padded). */
int torq_conv_amx_i8(const int8_t *x, int8_t *out, const int8_t *wamx, const torq_geom *g, const torq_rq *rq,
                     int nthreads)
{
    conv_job j;
    j.g = g;
    j.CQ = (g->Cg + 3) / 4;
    j.CQs = (j.CQ + 15) / 16 * 16;
    j.OB = (g->Og + 15) / 16;                                  /* here: blocks of 16 channels */
    const int OP = (j.OB + 1) / 2, npb = (g->Lpad / 16 + 1) / 2;
    j.wblock = (size_t)OP * g->T * (j.CQs / 16) * 2048;         /* one group's weights */
    uint8_t *scratch = thread_scratch((size_t)g->nph * j.CQs * g->Lph * 4 + (size_t)g->Og * g->Lpad);
    j.ph = scratch;
    /* claims of whole 32-channel blocks where there are enough of them: a claim then writes
     * whole output rows, and two threads never store into the same cache line but at a claim's
     * two ends (claims of a few pixel blocks each made the threads fight over the lines where
     * one channel's row ends and the next one's begins: no gain from a second thread) */
    if (OP < 2 * nthreads && g->L < 1024)
        nthreads = 1;       /* small maps, few channel blocks: a second thread costs more than it computes */
    j.per = OP >= 2 * nthreads ? npb * ((OP + 4 * nthreads - 1) / (4 * nthreads))
                               : (OP * npb + 4 * nthreads - 1) / (4 * nthreads);
    const int direct = g->Wq == g->OW;
    j.ostride = direct ? (size_t)g->L : (size_t)g->Lpad;
    const int O = g->G * g->Og;
    for (int n = 0; n < g->N; n++) {
        for (int gi = 0; gi < g->G; gi++) {
            j.x = x + (size_t)n * g->C * g->H * g->W;
            j.c0 = gi * g->Cg;
            j.w = wamx + (size_t)gi * j.wblock;
            j.q = *rq;
            j.q.adj += gi * g->Og;
            j.q.mult += gi * g->Og;
            j.q.scale += gi * g->Og;
            j.out = out + ((size_t)n * O + gi * g->Og) * g->OH * g->OW;
            j.obuf = direct ? j.out : (int8_t *)(scratch + (size_t)g->nph * j.CQs * g->Lph * 4);
            torq_parallel_ranges(g->nph * j.CQ, pack_grain(g), pack_range, &j, nthreads);
            atomic_store(&j.next, 0);
            torq_parallel_for(nthreads, amx_worker, &j, nthreads);
            if (!direct)
                torq_parallel_ranges(g->Og, 8192 / (g->OH * g->OW + 1) + 1, compact_range, &j, nthreads);
        }
    }
    return 0;
}
#else
int torq_amx_init(void)
{
    return 0;
}

int torq_conv_amx_i8(const int8_t *x, int8_t *out, const int8_t *wamx, const torq_geom *g, const torq_rq *rq,
                     int nthreads)
{
    (void)x, (void)out, (void)wamx, (void)g, (void)rq, (void)nthreads;
    return -1;
}
#endif

/* ------------------------------------------------------------------ numerics check */

/* The requantisation of n accumulators of channel 0 of rq (adj included), through the same code
 * the kernels use (vector and scalar parts): tests hold it against torq.numerics. */
int torq_requant_i8(const int32_t *acc, int n, const torq_rq *rq, int8_t *out)
{
    int i = 0;
#if TORQ_VNNI
    for (; i + 16 <= n; i += 16)
        _mm_storeu_si128((__m128i *)(out + i),
                         requant16(_mm512_add_epi32(_mm512_loadu_si512(acc + i), _mm512_set1_epi32(rq->adj[0])), 0, rq));
#endif
    requant_row(acc + i, n - i, 0, rq, out + i);
    return 0;
}
