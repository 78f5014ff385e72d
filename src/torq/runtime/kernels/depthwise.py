"""Exact depthwise convolution accumulators: two compiled loops, one per plane shape.

Both read the integer input directly (centring and padding on the fly, into a small scratch
buffer that stays in cache) and accumulate in float32 when every partial sum is below 2**24
(``KH*KW * max|x - c| * max|w|``: exact), else in float64 / int64.

* planar: large planes (>= ``_PLANAR_MIN_WIDTH`` output columns). Per input plane its stride
  phases are built once; each tap then adds one contiguous run of a phase to the flattened
  "wide" output plane (``Wq - OW`` junk columns per row, never read), which vectorises.
* channels-last: small planes (7x7, 14x14: rows too short to vectorise). The padded image is
  laid out [H, W, C] once per image, and each kernel row of taps adds its weight rows times
  input rows to an output row along the channels, which are many (3 or 5 taps in one pass).
"""
from __future__ import annotations

import numpy as np

from ...numerics.loops import jit
from .gemm import _F24, _F53
from .workspace import empty

_PLANAR_MIN_WIDTH = 28      # output columns from which the planar loop is used
_BLOCK = 2048               # planar: output elements accumulated at a time (8 KiB float32)


def depthwise_acc(x, w64, pads, pad_value, c, mx, mw, stride, dilation, OH, OW, mult, ws=None):
    """Depthwise accumulator without bias [N, O, OH, OW] of (x - c) (pad: value - c); ``w64``
    [O, 1, KH, KW] int64, ``mx`` >= max |x - c| (pad included), ``mw`` = max |w|, output channel
    o reads input channel o // mult. A float / int array, possibly a column window of a wider one
    (in the workspace ``ws`` when given)."""
    O, _, KH, KW = w64.shape
    bound = KH * KW * mx * mw
    dtype = np.float32 if bound <= _F24 else (np.float64 if bound < _F53 else np.int64)
    x = np.ascontiguousarray(x)
    fill = dtype(pad_value - c if any(pads) else 0)
    c = dtype(c)                     # x - c in the sum's type: the conversions vectorise
    if OW >= _PLANAR_MIN_WIDTH:
        return _planar(x, w64.reshape(O, KH, KW).astype(dtype), c, fill, pads, stride, dilation,
                       OH, OW, mult, ws)
    (sh, sw), (dh, dw) = stride, dilation
    pl, pr, pt, pb = pads
    N, C, H, W = x.shape
    xp = empty(ws, "dw_padded", (max(H + pt + pb, (OH - 1) * sh + (KH - 1) * dh + 1),
                                 max(W + pl + pr, (OW - 1) * sw + (KW - 1) * dw + 1), O), dtype)
    acc = np.empty((OW, O), dtype=dtype)
    out = empty(ws, "acc", (N, O, OH, OW), dtype)
    wt = np.ascontiguousarray(w64.reshape(O, KH, KW).transpose(1, 2, 0), dtype=dtype)
    _channels_last(x, wt, c, fill, pt, pl, sh, sw, dh, dw, mult, xp, acc, out)
    return out


def _planar(x, w, c, fill, pads, stride, dilation, OH, OW, mult, ws=None):
    (sh, sw), (dh, dw) = stride, dilation
    pl, pr, pt, pb = pads
    O, KH, KW = w.shape
    mri, mrj = (KH - 1) * dh // sh, (KW - 1) * dw // sw
    Wq = OW + mrj
    Hq = OH + mri + (1 if mrj else 0)           # a slack row for the last row's junk columns
    out = empty(ws, "acc", (x.shape[0], O, OH, Wq), w.dtype)
    scratch = empty(ws, "dw_phases", (sh * sw, Hq * Wq), w.dtype)
    _planar_loop(x, w, c, fill, pt, pl, sh, sw, dh, dw, mult, scratch, out)
    return out[..., :OW] if Wq != OW else out


@jit
def _planar_loop(x, w, c, fill, pt, pl, sh, sw, dh, dw, mult, ph, out):
    """out[n, o, r, q] = Σ_ij w[o, i, j] * (xpad[n, o // mult, r*sh + i*dh, q*sw + j*dw] - c) for
    the wide output out [N, O, OH, Wq]. Per input plane its stride phases are built once in
    ``ph`` (ph[a*sw + b, r*Wq + q] = xpad[r*sh + a, q*sw + b] - c, ``fill`` outside the image),
    then every tap adds one contiguous run of a phase to a block of the flattened output plane."""
    N, O, OH, Wq = out.shape
    KH, KW = w.shape[1], w.shape[2]
    L = OH * Wq
    for n in range(N):
        for o in range(O):
            if o % mult == 0:                            # the stride phases of the input plane
                H, W = x.shape[2], x.shape[3]
                for a in range(sh):
                    for b in range(sw):
                        q0 = min(Wq, max(0, -((b - pl) // sw)))          # first q*sw + b - pl >= 0
                        q1 = min(Wq, max(q0, -((b - pl - W) // sw)))     # first q*sw + b - pl >= W
                        for r in range(ph.shape[1] // Wq):
                            y = r * sh + a - pt
                            d = ph[a * sw + b, r * Wq:(r + 1) * Wq]
                            if y < 0 or y >= H:
                                d[:] = fill
                                continue
                            d[:q0] = fill
                            d[q1:] = fill
                            src = x[n, o // mult, y, q0 * sw + b - pl:]
                            dd = d[q0:q1]                # slices from 0, constant strides: vectorises
                            if sw == 1:
                                for q in range(q1 - q0):
                                    dd[q] = src[q] - c
                            elif sw == 2:
                                for q in range(q1 - q0):
                                    dd[q] = src[2 * q] - c
                            else:
                                for q in range(q1 - q0):
                                    dd[q] = src[q * sw] - c
            plane = out[n, o].reshape(L)
            for k0 in range(0, L, _BLOCK):               # a block of the plane stays in L1
                k1 = min(L, k0 + _BLOCK)
                acc = plane[k0:k1]
                acc[:] = 0
                for i in range(KH):
                    ri, a = divmod(i * dh, sh)
                    for j in range(KW):
                        wv = w[o, i, j]
                        if wv == 0:
                            continue
                        rj, b = divmod(j * dw, sw)
                        off = k0 + ri * Wq + rj
                        src = ph[a * sw + b, off:off + k1 - k0]    # a slice: the loop vectorises
                        for k in range(k1 - k0):
                            acc[k] += wv * src[k]


def _channels_last(x, w, c, fill, pt, pl, sh, sw, dh, dw, mult, xp, acc, out):
    """out[n, o, r, q] as in ``_planar_loop``, with w [KH, KW, O]: per image the padded, centred
    input is laid out channels-last in xp [Hp, Wp, O] (input channel o // mult at o), then each
    output row is accumulated in acc [OW, O], one kernel row of taps at a time, along the
    channels."""
    for n in range(x.shape[0]):
        _to_channels_last(x[n], c, fill, pt, pl, mult, xp)
        _channels_last_rows(xp, w, sh, sw, dh, dw, acc, out[n])


@jit
def _to_channels_last(xn, c, fill, pt, pl, mult, xp):
    """xp[y, q, o] = xpad[y, q, o // mult] - c (``fill`` outside the image); xn [C, H, W]."""
    C, H, W = xn.shape
    Hp, Wp = xp.shape[0], xp.shape[1]
    for y in range(Hp):
        for q in range(Wp):
            if y < pt or y >= pt + H or q < pl or q >= pl + W:
                xp[y, q, :] = fill
    xt = xn.reshape(C, H * W)
    for y in range(H):
        for q in range(W):
            dst = xp[pt + y, pl + q]                     # contiguous writes, column reads
            col = xt[:, y * W + q]
            if mult == 1:
                for ch in range(C):
                    dst[ch] = col[ch] - c
            else:
                for ch in range(C):
                    for m in range(mult):
                        dst[ch * mult + m] = col[ch] - c


@jit
def _channels_last_rows(xp, w, sh, sw, dh, dw, acc, out):
    """out [O, OH, OW] from xp [Hp, Wp, O] and w [KH, KW, O]. For 3 and 5 taps per kernel row
    the row's products are summed in one pass over the channels (acc loaded and stored once
    per kernel row instead of once per tap: measured 1.3-1.5x on EfficientNet's 5x5 layers);
    the partial sums stay exact in any order (see depthwise_acc)."""
    O, OH, OW = out.shape
    KH, KW = w.shape[0], w.shape[1]
    for r in range(OH):
        acc[:, :] = 0
        for i in range(KH):
            prow, wi = xp[r * sh + i * dh], w[i]
            if KW == 5:
                w0, w1, w2, w3, w4 = wi[0], wi[1], wi[2], wi[3], wi[4]
                for q in range(OW):
                    b = q * sw
                    s0, s1, s2, s3, s4 = prow[b], prow[b + dw], prow[b + 2 * dw], prow[b + 3 * dw], prow[b + 4 * dw]
                    a = acc[q]
                    for o in range(O):
                        a[o] += w0[o] * s0[o] + w1[o] * s1[o] + w2[o] * s2[o] + w3[o] * s3[o] + w4[o] * s4[o]
            elif KW == 3:
                w0, w1, w2 = wi[0], wi[1], wi[2]
                for q in range(OW):
                    b = q * sw
                    s0, s1, s2 = prow[b], prow[b + dw], prow[b + 2 * dw]
                    a = acc[q]
                    for o in range(O):
                        a[o] += w0[o] * s0[o] + w1[o] * s1[o] + w2[o] * s2[o]
            else:
                for j in range(KW):
                    wr, a0 = wi[j], j * dw
                    for q in range(OW):
                        src, a = prow[q * sw + a0], acc[q]
                        for o in range(O):
                            a[o] += wr[o] * src[o]
        for o in range(O):
            for q in range(OW):
                out[o, r, q] = acc[q, o]
