"""An independent implementation of torq's documented bf16 arithmetic (numerics/bf16_arith.py,
issue 18's model), for the tests: plain Python / numpy, exact rationals, and no call into
``torq.numerics``.

Where torq rounds with bit operations and accumulates with FMAs (C, AVX-512) or float64 steps
(numpy), this rounds with arithmetic (``frexp`` / ``rint``) and takes every accumulation step
as an exact rational rounded to the nearest fp32: two routes to the same documented numbers,
so agreement bit for bit means something.

The model: acc = +0.0; for k in the stated order acc = fl32(acc + w_k x_k) (exact product, one
rounding); conv k over (input channel of the group, kh, kw), matmul over the inner dimension,
sums over the window / the reduced elements in row-major order; then fl32(acc + bias), clamp,
bf16 (RNE).
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

BF16_MAX = float.fromhex("0x1.fe00000000000p+127")


def bf16(x) -> np.ndarray:
    """Round to nearest even on 8 significant bits (bf16), by arithmetic on float64."""
    x = np.asarray(x, np.float64)
    out = np.empty_like(x)
    for i, v in np.ndenumerate(x):
        if v == 0 or not math.isfinite(v):
            out[i] = v
            continue
        _, e = math.frexp(v)                      # v = m * 2**e, 0.5 <= |m| < 1
        ulp = 2.0 ** max(e - 8, -133)             # 8 significant bits; bf16 subnormals below 2**-126
        r = float(np.rint(v / ulp)) * ulp         # rint: ties to even; v / ulp is exact
        out[i] = math.copysign(math.inf, v) if abs(r) > BF16_MAX else r
    return out.astype(np.float32)


def f32(value: Fraction) -> np.float32:
    """The float32 nearest an exact rational (ties to the even significand)."""
    c = np.float32(float(value))
    cands = [c, np.nextafter(c, np.float32(np.inf)), np.nextafter(c, np.float32(-np.inf))]
    cands = [k for k in cands if math.isfinite(float(k))]
    best = min(abs(Fraction(float(k)) - value) for k in cands)
    near = [k for k in cands if abs(Fraction(float(k)) - value) == best]
    if len(near) > 1:
        near = [k for k in near if int(np.array([k], np.float32).view(np.uint32)[0]) % 2 == 0]
    return np.float32(near[0])


def ordered_dot(a, b) -> np.float32:
    """The model's accumulator: acc = 0; acc = fl32(acc + a_k * b_k) for k in ravel order."""
    acc = np.float32(0.0)
    for u, v in zip(np.ravel(a), np.ravel(b)):
        acc = f32(Fraction(float(acc)) + Fraction(float(u)) * Fraction(float(v)))
    return acc


def ordered_sum(values) -> np.float32:
    """acc = 0; acc = fl32(acc + v) for v in ravel order (pools and means)."""
    return ordered_dot(values, np.ones(np.size(values)))


def act(acc, bias, lo=-math.inf, hi=math.inf, to_bf16=True) -> np.float32:
    """ACT: fl32(acc + bias), clamp, round to bf16."""
    y = np.float32(np.float32(acc) + np.float32(bias))
    y = np.float32(min(max(float(y), lo), hi))
    return bf16(y)[()] if to_bf16 else y


def conv2d(x, w, b, stride=(1, 1), pad=(0, 0, 0, 0), groups=1, lo=-math.inf, hi=math.inf, dilation=(1, 1)):
    """NCHW conv (pads l, r, t, b with zeros), the model's arithmetic per output."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    pl, pr, pt, pb = pad
    dh, dw = dilation
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow), np.float32)
    per = o // groups
    for i in range(n):
        for oc in range(o):
            g = oc // per
            for r in range(oh):
                for q in range(ow):
                    r0, q0 = r * stride[0], q * stride[1]
                    win = xp[i, g * cg:(g + 1) * cg, r0:r0 + dh * (kh - 1) + 1:dh, q0:q0 + dw * (kw - 1) + 1:dw]
                    out[i, oc, r, q] = act(ordered_dot(win, w[oc]), b[oc], lo, hi)
    return out


def matmul(x, y, to_bf16=True):
    """[M, K] @ [K, N]: the ordered fp32 dot products, then bf16."""
    out = np.zeros((x.shape[0], y.shape[1]), np.float32)
    for i in range(x.shape[0]):
        for j in range(y.shape[1]):
            out[i, j] = act(ordered_dot(x[i], y[:, j]), 0.0, to_bf16=to_bf16)
    return out


def fn(f, x):
    """An ACT function: f in float64, rounded to fp32, then to bf16."""
    return bf16(np.array([np.float32(f(float(v))) for v in np.ravel(x)], np.float32)).reshape(np.shape(x))


def sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v)) if v > -700 else 0.0


def avgpool(x, kernel, stride, pad=(0, 0, 0, 0), include_pad=True):
    n, c, h, w = x.shape
    pl, pr, pt, pb = pad
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh, ow = (h + pt + pb - kernel[0]) // stride[0] + 1, (w + pl + pr - kernel[1]) // stride[1] + 1
    out = np.zeros((n, c, oh, ow), np.float32)
    for idx in np.ndindex(n, c, oh, ow):
        i, ch, r, q = idx
        r0, q0 = r * stride[0], q * stride[1]
        win = xp[i, ch, r0:r0 + kernel[0], q0:q0 + kernel[1]]
        rows = min(r0 + kernel[0], h + pt) - max(r0, pt)
        cols = min(q0 + kernel[1], w + pl) - max(q0, pl)
        count = kernel[0] * kernel[1] if include_pad else rows * cols
        out[idx] = bf16(np.float32(ordered_sum(win)) / np.float32(count))[()]
    return out
