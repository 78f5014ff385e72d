"""Float (bf16) contractions and sums for the NSS simulator's reference engine: the model of
``numerics.bf16_arith`` as plain loops over k, vectorised over the outputs.

Each function keeps one fp32 accumulator per output, starts it at +0.0 and applies
``bf16_arith.fma32`` once per k in the model's order (conv: input channel of the group, kh,
kw; matmul: the inner dimension; sums: the window / reduced elements in row-major order). Slow
(a numpy pass per k) but obviously the model: the oracle the native kernels
(runtime/native/float_conv.c) are held to, bit for bit.
"""
from __future__ import annotations

import numpy as np

from ... import numerics

_B = numerics.bf16_arith
_F32 = np.float32


def conv_out_hw(h, w, kernel, pad, stride, dilation) -> tuple[int, int]:
    """Output height / width of a convolution or pool (pad = l, r, t, b)."""
    (kh, kw), (pl, pr, pt, pb) = kernel, pad
    (sh, sw), (dh, dw) = stride, dilation
    return (h + pt + pb - dh * (kh - 1) - 1) // sh + 1, (w + pl + pr - dw * (kw - 1) - 1) // sw + 1


def _padded(x, pad) -> np.ndarray:
    pl, pr, pt, pb = (int(p) for p in pad)
    return np.pad(np.asarray(x, _F32), ((0, 0), (0, 0), (pt, pb), (pl, pr)))


def conv_acc(x, w, pad, stride, dilation, groups) -> np.ndarray:
    """fp32 accumulators [N, O, OH, OW] of a conv (groups, depthwise: groups == C) of x [N, C, H, W]
    with weights w [O, C/groups, KH, KW]: k over (c, kh, kw) as w stores them."""
    w = np.asarray(w, _F32)
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = [int(s) for s in stride], [int(d) for d in dilation]
    oh, ow = conv_out_hw(*np.shape(x)[2:], (kh, kw), pad, (sh, sw), (dh, dw))
    xp = _padded(x, pad)
    base = (np.arange(o) // (o // int(groups))) * cg       # first input channel of each output's group
    acc = np.zeros((xp.shape[0], o, oh, ow), _F32)
    for c in range(cg):
        chans = xp[:, c:c + 1] if int(groups) == 1 else xp[:, base + c]
        for i in range(kh):
            for j in range(kw):
                win = chans[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
                acc = _B.fma32(acc, w[:, c, i, j][None, :, None, None], win)
    return acc


def matmul_acc(x, y) -> np.ndarray:
    """fp32 accumulators of x [..., M, K] @ y [..., K, N] (batch dims broadcast): k = 0 .. K-1."""
    x, y = np.asarray(x, _F32), np.asarray(y, _F32)
    acc = np.zeros(np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) + (x.shape[-2], y.shape[-1]), _F32)
    for k in range(x.shape[-1]):
        acc = _B.fma32(acc, x[..., :, k:k + 1], y[..., k:k + 1, :])
    return acc


def window_acc(x, kernel, stride, pad) -> np.ndarray:
    """Average-pool window sums of x [N, C, H, W] (zero padding): fp32, row-major (kh, kw)."""
    (kh, kw), (sh, sw) = kernel, stride
    oh, ow = conv_out_hw(*np.shape(x)[2:], (kh, kw), pad, (sh, sw), (1, 1))
    xp = _padded(x, pad)
    acc = np.zeros(xp.shape[:2] + (oh, ow), _F32)
    for i in range(kh):
        for j in range(kw):
            acc = acc + xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]   # fp32 IEEE add
    return acc


def axis_acc(x, dims) -> np.ndarray:
    """fp32 sums of x over ``dims`` (the reduced elements in row-major order), shape of x
    without ``dims``."""
    x = np.asarray(x, _F32)
    keep = [d for d in range(x.ndim) if d not in dims]
    moved = np.transpose(x, keep + sorted(dims)).reshape([x.shape[d] for d in keep] + [-1])
    acc = np.zeros(moved.shape[:-1], _F32)
    for k in range(moved.shape[-1]):
        acc = acc + moved[..., k]
    return acc
