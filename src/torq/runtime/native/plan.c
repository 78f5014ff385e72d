/* A recorded chain of native kernel calls, run in one call from Python (runtime/native/plan.py).
 *
 * Why: a batch-1 run of MobileNetV2 is ~65 steps of 10-400 us each; binding each step's
 * arguments in Python and crossing ctypes costs ~10 us a step, and between two steps the
 * helper thread of the pool spins with nothing to do. The first run of a program records
 * every kernel call (kind + its arguments); later runs replay the chain here, Python only
 * patching the address of an input that is a fresh array (the program's input, the result of a
 * step that ran in Python). Each row is the kind and the arguments of one call, as 64-bit
 * words: pointers and integers as they are, a float as its bits in the low half. */
#include <time.h>
#include "common.h"

enum { K_CONV = 1, K_CONV_AMX, K_DW, K_FC, K_ADD, K_GAP, K_MAXPOOL };

#define WORDS 15

typedef struct {
    int64_t kind;
    int64_t v[WORDS];
} torq_call;

int torq_conv_i8(const int8_t *, int8_t *, const int8_t *, const torq_geom *, const torq_rq *, int);
int torq_conv_amx_i8(const int8_t *, int8_t *, const int8_t *, const torq_geom *, const torq_rq *, int);
int torq_dw_i8(const int8_t *, int8_t *, const float *, const void *, const torq_geom *, const torq_rq *, int);
int torq_fc_i8(const int8_t *, int8_t *, const int8_t *, int, int, int, const torq_rq *);
int torq_add_i8(const int8_t *, const int8_t *, int8_t *, long, int32_t, int32_t, int32_t, int32_t, int, int32_t,
                int32_t, int32_t);
int torq_gap_i8(const int8_t *, int8_t *, long, long, int32_t, int64_t, int, int, int32_t, int32_t, int32_t, int,
                float);
int torq_maxpool_i8(const int8_t *, int8_t *, int, const int32_t *, int);

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

/* calls[0..n) in order, kernels on nthreads threads; the number of calls run (n, or the index of
 * a row of unknown kind). ns, when not NULL, receives each call's wall time (profiling). */
int torq_run_calls(const torq_call *calls, int n, int nthreads, int64_t *ns)
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
            torq_add_i8(P(0), P(1), P(2), (long)c->v[3], I(4), I(5), I(6), I(7), I(8), I(9), I(10), I(11));
            break;
        case K_GAP:
            torq_gap_i8(P(0), P(1), (long)c->v[2], (long)c->v[3], I(4), c->v[5], I(6), I(7), I(8), I(9), I(10), I(11),
                        as_float(c->v[12]));
            break;
        case K_MAXPOOL:
            torq_maxpool_i8(P(0), P(1), I(2), P(3), nthreads);
            break;
        default:
            return k;
        }
        if (ns)
            ns[k] = now_ns() - t0;
    }
    return n;
}
