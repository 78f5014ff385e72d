/* A recorded chain of native kernel calls, run in one call from Python (runtime/native/plan.py).
 *
 * Why: a batch-1 run of MobileNetV2 is ~65 steps of 10-400 us each; binding each step's
 * arguments in Python and crossing ctypes costs ~10 us a step, and between two steps the
 * helper thread of the pool spins with nothing to do. The first run of a program records
 * every kernel call (kind + its arguments); later runs replay the chain here, Python only
 * patching the address of an input that is a fresh array (the program's input, the result of a
 * step that ran in Python). Each row is the kind and the arguments of one call, as 64-bit
 * words: pointers and integers as they are, a float as its bits in the low half. The float
 * (bf16 / f32) kernels take their own thread count: float_ops._threads, load-aware. */
#include <time.h>
#include "common.h"

enum { K_CONV = 1, K_CONV_AMX, K_DW, K_FC, K_ADD, K_GAP, K_MAXPOOL,
       KF_CONV, KF_MATMUL, KF_BINARY, KF_LUT16, KF_MAXPOOL, KF_GAP, KF_FC };

#define WORDS 16

typedef struct {
    int64_t kind;
    int64_t v[WORDS];
} torq_call;

int torq_conv_i8(const int8_t *, int8_t *, const int8_t *, const torq_geom *, const torq_rq *, int);
int torq_conv_amx_i8(const int8_t *, int8_t *, const int8_t *, const torq_geom *, const torq_rq *, int);
int torq_dw_i8(const int8_t *, int8_t *, const float *, const void *, const torq_geom *, const torq_rq *, int);
int torq_fc_i8(const int8_t *, int8_t *, const int8_t *, int, int, int, const torq_rq *);
int torq_add_i8(const int8_t *, const int8_t *, int8_t *, long, int32_t, int32_t, int32_t, int32_t, int, int32_t,
                int32_t, int32_t, int);
int torq_gap_i8(const int8_t *, int8_t *, long, long, int32_t, int64_t, int, int, int32_t, int32_t, int32_t, int,
                float);
int torq_maxpool_i8(const int8_t *, int8_t *, int, const int32_t *, int);
int torq_conv_f32(const float *, float *, const float *, const float *, const void *, int);
int torq_matmul_f32(const float *, const float *, float *, const float *, int, int, int, int, int64_t, int64_t,
                    int64_t, float, float, int, int, int);
int torq_binary_f32(const float *, const float *, float *, long, int, int, int);
int torq_lut16_f32(const float *, const float *, float *, long, int);
int torq_maxpool_f32(const float *, float *, int, int, int, const int32_t *, int);
int torq_gap_f32(const float *, float *, long, long, int, int);

#define P(i) ((void *)(intptr_t)c->v[i])
#define I(i) ((int)c->v[i])

static float as_float(int64_t w)
{
    const uint32_t u = (uint32_t)w;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

#define F(i) as_float(c->v[i])

/* calls[0..n) in order, the int8 kernels on nthreads threads, the float ones on fthreads; the
 * number of calls run (n, or the index of a row of unknown kind). ns, when not NULL, receives
 * each call's wall time (profiling). */
int torq_run_calls(const torq_call *calls, int n, int nthreads, int fthreads, int64_t *ns)
{
    for (int k = 0; k < n; k++) {
        const torq_call *c = calls + k;
        const int64_t t0 = ns ? now_ns() : 0;
        switch (c->kind) {
        case K_CONV:
            torq_conv_i8(P(0), P(1), P(2), P(3), P(4), nthreads);
            break;
        case K_CONV_AMX:
            torq_conv_amx_i8(P(0), P(1), P(2), P(3), P(4), nthreads);
            break;
        case K_DW:
            torq_dw_i8(P(0), P(1), P(2), P(3), P(4), P(5), nthreads);
            break;
        case K_FC:
            torq_fc_i8(P(0), P(1), P(2), I(3), I(4), I(5), P(6));
            break;
        case K_ADD:
            torq_add_i8(P(0), P(1), P(2), (long)c->v[3], I(4), I(5), I(6), I(7), I(8), I(9), I(10), I(11), I(12));
            break;
        case K_GAP:
            torq_gap_i8(P(0), P(1), (long)c->v[2], (long)c->v[3], I(4), c->v[5], I(6), I(7), I(8), I(9), I(10), I(11),
                        as_float(c->v[12]));
            break;
        case K_MAXPOOL:
            torq_maxpool_i8(P(0), P(1), I(2), P(3), nthreads);
            break;
        case KF_CONV:
            torq_conv_f32(P(0), P(1), P(2), P(3), P(4), fthreads);
            break;
        case KF_MATMUL:
        case KF_FC:         /* a matmul whose B is a packed weight: only A is data */
            torq_matmul_f32(P(0), P(1), P(2), P(3), I(4), I(5), I(6), I(7), c->v[8], c->v[9], c->v[10], F(11), F(12),
                            I(13), I(14), fthreads);
            break;
        case KF_BINARY:
            torq_binary_f32(P(0), P(1), P(2), (long)c->v[3], I(4), I(5), fthreads);
            break;
        case KF_LUT16:
            torq_lut16_f32(P(0), P(1), P(2), (long)c->v[3], fthreads);
            break;
        case KF_MAXPOOL:
            torq_maxpool_f32(P(0), P(1), I(2), I(3), I(4), P(5), fthreads);
            break;
        case KF_GAP:
            torq_gap_f32(P(0), P(1), (long)c->v[2], (long)c->v[3], I(4), fthreads);
            break;
        default:
            return k;
        }
        if (ns)
            ns[k] = now_ns() - t0;
    }
    return n;
}
