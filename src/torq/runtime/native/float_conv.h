/* The geometry of one float convolution (runtime/native/float_ops.py fills it: build.TorqFgeom),
 * shared by float_conv.c and float_depthwise.c. */
#ifndef TORQ_FLOAT_CONV_H
#define TORQ_FLOAT_CONV_H

#include <stdint.h>

typedef struct {
    int32_t N, C, H, W, G, Cg, Og, OH, OW, T;
    int32_t nph, rows, Wq, sh, sw, pt, pl;
    int32_t L;                      /* wide pixels computed: (OH - 1) * Wq + OW */
    int32_t RO, PV;                 /* weight block (channels), 16-pixel vectors per tile */
    int32_t direct;                 /* the input is the plane (no padding, stride 1) */
    int32_t bf16;
    int32_t rowtile;                /* a tile is one output row (depthwise: no wide columns to drop) */
    float lo, hi;
    int64_t cstride, phstride;      /* floats between channel planes / between phases */
    const int32_t *ph_ab;           /* [nph][2] row / column residue of each phase */
    const int64_t *tap_off;         /* [T] offset of the tap from the plane base */
    int32_t kh, kw;
    int32_t dwrows;                 /* depthwise (one channel per group), dilation 1, stride 1 or 2 both
                                       ways: float_depthwise.c reads the input rows in place */
    int32_t pad_;
} torq_fgeom;

int torq_dw_rows_f32(const float *x, float *out, const float *w, const float *bias, const torq_fgeom *g, int nthreads);

#endif
