"""Pooling kernels: average-pool window sums (exact integers) and max pool."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...numerics.loops import pair
from .gemm import _pads, conv_out_size


def _window_view(xp, kernel, stride, dilation, OH, OW):
    kh, kw = kernel
    sh, sw = stride
    dh, dw = dilation
    sN, sC, sH, sW = xp.strides
    N, C = xp.shape[:2]
    return as_strided(xp, shape=(N, C, OH, OW, kh, kw),
                      strides=(sN, sC, sH * sh, sW * sw, sH * dh, sW * dw), writeable=False)


def pool_sum(x, kernel, stride, pad_lrtb=(0, 0, 0, 0), count_include_pad: bool = False,
             zp: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Average-pool window sums of (x - zp), and the divisor of every output position.

    Returns ``(sums int64 [N, C, OH, OW], counts int64 [OH, OW])``. Padded positions contribute
    0 (they hold zp); ``counts`` is kh*kw when ``count_include_pad`` else the number of valid
    (non-padded) positions of each window.
    """
    x = np.asarray(x)
    N, C, H, W = x.shape
    kh, kw = pair(kernel)
    sh, sw = pair(stride)
    pl, pr, pt, pb = _pads(pad_lrtb)
    OH = conv_out_size(H, kh, sh, 1, pt, pb)
    OW = conv_out_size(W, kw, sw, 1, pl, pr)
    if (kh, kw) == (H, W) and not any((pl, pr, pt, pb)):     # global: one window, no padding
        sums = x.reshape(N, C, H * W).sum(axis=2, dtype=np.int64) - int(zp) * H * W
        return sums.reshape(N, C, 1, 1), np.full((1, 1), H * W, dtype=np.int64)
    d = np.zeros((N, C, H + pt + pb, W + pl + pr), dtype=np.int32)
    inner = d[:, :, pt:pt + H, pl:pl + W]
    inner[...] = x
    inner -= int(zp)
    if kh * kw <= 25:
        s = np.zeros((N, C, OH, OW), dtype=np.int32)
        for i in range(kh):
            for j in range(kw):
                s += d[:, :, i:i + sh * (OH - 1) + 1:sh, j:j + sw * (OW - 1) + 1:sw]
        sums = s.astype(np.int64)
    else:
        sums = _window_view(d, (kh, kw), (sh, sw), (1, 1), OH, OW).sum(axis=(4, 5),
                                                                       dtype=np.int64)
    if count_include_pad:
        counts = np.full((OH, OW), kh * kw, dtype=np.int64)
    else:
        hs = np.arange(OH) * sh - pt
        ws = np.arange(OW) * sw - pl
        rows = np.minimum(hs + kh, H) - np.maximum(hs, 0)
        cols = np.minimum(ws + kw, W) - np.maximum(ws, 0)
        counts = (rows[:, None] * cols[None, :]).astype(np.int64)
    return sums, counts


def maxpool(x, kernel, stride, pad_lrtb=(0, 0, 0, 0), dilation=1) -> np.ndarray:
    """Max pool (NCHW, ceil_mode 0); padded positions are ignored (filled with the dtype's
    minimum, i.e. -inf for the max). Result has x's dtype."""
    x = np.asarray(x)
    N, C, H, W = x.shape
    kh, kw = pair(kernel)
    sh, sw = pair(stride)
    dh, dw = pair(dilation)
    pl, pr, pt, pb = _pads(pad_lrtb)
    OH = conv_out_size(H, kh, sh, dh, pt, pb)
    OW = conv_out_size(W, kw, sw, dw, pl, pr)
    low = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
    xp = np.full((N, C, H + pt + pb, W + pl + pr), low, dtype=x.dtype)
    xp[:, :, pt:pt + H, pl:pl + W] = x
    if kh * kw <= 25:
        # separable: max over the kernel columns (every padded row used), then over its rows
        rows = xp[:, :, :sh * (OH - 1) + dh * (kh - 1) + 1]
        r = None
        for j in range(kw):
            sl = rows[:, :, :, j * dw:j * dw + sw * (OW - 1) + 1:sw]
            r = sl.copy() if r is None else np.maximum(r, sl, out=r)
        out = None
        for i in range(kh):
            sl = r[:, :, i * dh:i * dh + sh * (OH - 1) + 1:sh]
            out = sl.copy() if out is None else np.maximum(out, sl, out=out)
        return out
    return _window_view(xp, (kh, kw), (sh, sw), (dh, dw), OH, OW).max(axis=(4, 5))
