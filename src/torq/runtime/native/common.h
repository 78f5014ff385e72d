/* Shared by the native kernels (conv.c, depthwise.c): the requantisation of an accumulator row
 * (torq/numerics/act.h), the structs the Python side fills (runtime/native/ops.py), per-thread
 * scratch, and the in-bounds columns of a stride phase. */
#ifndef TORQ_COMMON_H
#define TORQ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "act.h"
#include "pool.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define TORQ_VNNI 1
#else
#define TORQ_VNNI 0
#endif

#if TORQ_VNNI && defined(__AVX512VBMI__)
#define TORQ_DW_INT 1   /* depthwise in integers (depthwise.c); else in float32 */
#else
#define TORQ_DW_INT 0
#endif

#define R 8             /* output channels per register block */

typedef struct {
    const int32_t *adj;         /* [O] added to the raw dot product (bias, -128 sum w), int32 wrap */
    const int32_t *mult;        /* [O] native multipliers */
    const float *scale;         /* [O] ORT float32 requant scales */
    int32_t shift, even, zp, lo, hi, ort;
} torq_rq;

typedef struct {
    int32_t N, C, H, W;         /* input */
    int32_t G, Cg, Og;          /* groups; input / output channels per group */
    int32_t OH, OW;
    int32_t T, nph;             /* kernel taps; stride phases */
    int32_t rows, Wq;           /* every phase image is rows x Wq pixels */
    int32_t sh, sw, pt, pl;
    int32_t padv;               /* padding value (the input zero point, int8) */
    int32_t L, Lpad, Lph;       /* pixels computed (OH * Wq), rounded up to 16, allocated per phase */
    const int32_t *ph_ab;       /* [nph][2] phase (row, column) residue */
    const int32_t *tap_ph;      /* [T] phase of each tap */
    const int32_t *tap_off;     /* [T] pixel offset of each tap inside its phase */
    int64_t id;                 /* unique in the process (> 0): a scratch buffer's padding is this geometry's */
} torq_geom;

/* A buffer of at least n bytes owned by the calling thread, reused from call to call (no fresh
 * pages per step); the kernels of one call share it with their helpers through the job. */
static inline uint8_t *thread_scratch(size_t n)
{
    static _Thread_local uint8_t *buf;
    static _Thread_local size_t cap;
    if (cap < n) {
        free(buf);
        buf = aligned_alloc(64, (n + 63) / 64 * 64);
        cap = buf ? n : 0;
        if (!buf)
            abort();
    }
    return buf;
}

/* ------------------------------------------------------------------ requantisation of a row */

static inline void requant_row(const int32_t *acc, int n, int o, const torq_rq *q, int8_t *dst)
{
    const int32_t adj = q->adj[o];
    if (q->ort) {
        const float flo = (float)(q->lo - q->zp), fhi = (float)(q->hi - q->zp);
        for (int i = 0; i < n; i++)
            dst[i] = (int8_t)torq_requant_ort((int32_t)((uint32_t)acc[i] + (uint32_t)adj), q->scale[o], q->zp, flo, fhi);
    } else {
        for (int i = 0; i < n; i++)
            dst[i] = (int8_t)torq_act_native((int32_t)((uint32_t)acc[i] + (uint32_t)adj), q->mult[o], q->shift,
                                             q->even, q->zp, q->lo, q->hi);
    }
}

#if TORQ_VNNI
/* 16 accumulators of output channel o (adj included) -> 16 bytes */
static inline __m128i requant16(__m512i acc, int o, const torq_rq *q)
{
    if (q->ort)
        return torq_requant_ort_x16(acc, _mm512_set1_ps(q->scale[o]), q->zp, (float)(q->lo - q->zp),
                                    (float)(q->hi - q->zp));
    return torq_act_native_x16(acc, _mm512_set1_epi32(q->mult[o]), q->shift, q->even, q->zp, q->lo, q->hi);
}
#endif

/* The in-bounds output columns [q0, q1) of a phase row: 0 <= q * sw + b - pl < W. */
static inline void col_range(const torq_geom *g, int b, int *q0, int *q1)
{
    const int lo = g->pl - b;                            /* q * sw >= lo */
    int a0 = lo <= 0 ? 0 : (lo + g->sw - 1) / g->sw;
    int a1 = (g->W + lo + g->sw - 1) / g->sw;            /* q * sw < W + lo */
    if (a1 > g->Wq)
        a1 = g->Wq;
    if (a0 > a1)
        a0 = a1;
    *q0 = a0;
    *q1 = a1;
}

/* ------------------------------------------------------------------ float kernels */

#if defined(__AVX512F__)
#define TORQ_F512 1
#include <immintrin.h>

/* the first `left` lanes: a tail vector's mask */
static inline __mmask16 lane_mask(int left)
{
    return left >= 16 ? 0xFFFF : (left <= 0 ? 0 : (__mmask16)((1u << left) - 1));
}
#else
#define TORQ_F512 0
#endif

/* d[q] = s[q * sw] for q0 <= q < q1 (s[q * sw] in bounds exactly for those q) */
static inline void gather_cols(float *d, const float *s, int q0, int q1, int sw)
{
    int q = q0;
#if TORQ_F512
    if (sw == 2) {
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        for (; q + 16 <= q1; q += 16) {         /* s[2q .. 2q + 30]: the 32nd float is not read */
            const __m512 a = _mm512_loadu_ps(s + 2 * q), b = _mm512_maskz_loadu_ps(0x7FFF, s + 2 * q + 16);
            _mm512_storeu_ps(d + q, _mm512_permutex2var_ps(a, even, b));
        }
    }
#endif
    for (; q < q1; q++)
        d[q] = s[q * sw];
}

/* Threads for a float job of `work` multiply-adds (or elements): below TORQ_PAR_WORK one thread,
 * since handing a few microseconds of work to a helper costs more than it saves, most of all on
 * a loaded host where the helper may not be running (MobileNetV3-small: 212 steps, most tiny) */
#define TORQ_PAR_WORK (1 << 18)
static inline int float_threads(int64_t work, int nthreads)
{
    return work < TORQ_PAR_WORK ? 1 : nthreads;
}

#endif
