"""Exact integer accumulation kernels for the NSS simulator (NCHW, pure numpy).

These are the simulator's hot path. Every function returns the *exact* integer result; no
rounding decision is made here (that is ``torq.compiler.fixed_point``'s job).

How exactness is kept while still using BLAS
--------------------------------------------
numpy's integer matmul does not use BLAS and is ~10x slower than float GEMM, so the GEMMs run
in floating point and are made exact by bounding magnitudes:

* The input is first *centred*: ``x' = x - c`` with ``c`` the midpoint of the values present
  (including the pad value), so ``max|x'|`` is at most ~128 even for uint8 activations. The
  shift is undone exactly with the integer term ``c * Σ_k w[o, k]`` (every kernel tap reads a
  real or padded input, so the correction is the same for every output position).
* float32: K is split into chunks of ``floor((2**24 - 1) / (max|x'| * max|w|))`` so that *every*
  partial sum of integer products stays below 2**24 in magnitude. Then each float32 addition
  (or FMA) is exact in any order, whatever BLAS does internally. Chunk results are summed in
  float64 (exact below 2**53) and converted to int64.
* When the chunk would be tiny (< 64, e.g. int16 weights with large |w - w_zp|) the GEMM runs
  in float64 instead (exact while K * max|x'| * max|w| < 2**53); beyond that, int64 matmul.

Depthwise convolutions are computed by summing KH*KW shifted slices (vectorised over channels),
in float32 when KH*KW*max|x'|*max|w| < 2**24, else float64/int64.

Layout: activations [N, C, H, W]; conv weights [O, C/groups, KH, KW]; fc weights [O, K].
``pad_lrtb`` is (left, right, top, bottom) as in ``torq_hl`` ops (ONNX ``pads`` is
[top, left, bottom, right]). Pooling assumes ceil_mode = 0.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

__all__ = ["conv_out_size", "conv2d_acc", "fc_acc", "pool_sum", "maxpool"]

_F24 = (1 << 24) - 1
_F53 = 1 << 53
_MIN_F32_CHUNK = 64
_COLS_BUDGET = 1 << 24      # elements of the im2col buffer per batch block (64 MiB in f32)


def _pair(v) -> tuple[int, int]:
    if np.ndim(v) == 0:
        return int(v), int(v)
    t = tuple(int(i) for i in v)
    if len(t) != 2:
        raise ValueError(f"expected 2 values, got {v!r}")
    return t


def _pads(p) -> tuple[int, int, int, int]:
    if p is None:
        return 0, 0, 0, 0
    t = tuple(int(i) for i in p)
    if len(t) != 4 or min(t) < 0:
        raise ValueError(f"pad_lrtb must be 4 non-negative ints, got {p!r}")
    return t


def conv_out_size(size: int, k: int, stride: int, dilation: int, p0: int, p1: int) -> int:
    """Output extent of a convolution / pooling window (ceil_mode = 0)."""
    return (size + p0 + p1 - dilation * (k - 1) - 1) // stride + 1


def _centre(x: np.ndarray, extra: int | None = None) -> tuple[int, int]:
    """(c, max|x - c|) with c the integer midpoint of x's value range (and ``extra``)."""
    if x.size:
        lo, hi = int(x.min()), int(x.max())
    else:
        lo = hi = 0
    if extra is not None:
        lo, hi = min(lo, int(extra)), max(hi, int(extra))
    c = (lo + hi) // 2
    return c, max(hi - c, c - lo)


def _engine(k: int, mx: int, mw: int):
    """Pick (dtype, chunk) for an exact K-long dot product with |x| <= mx, |w| <= mw."""
    prod = mx * mw
    if prod == 0:
        return np.float32, max(k, 1)
    chunk = _F24 // prod
    if chunk >= min(k, _MIN_F32_CHUNK):
        return np.float32, max(1, min(chunk, k))
    if k * prod < _F53:
        return np.float64, k
    return np.int64, k


def _chunked_matmul(a: np.ndarray, b: np.ndarray, dtype, chunk: int) -> np.ndarray:
    """Exact integer ``a @ b`` (contraction over a's last / b's second-to-last axis), a and b
    already in ``dtype`` holding integers. Returns int64."""
    k = a.shape[-1]
    if dtype is np.int64 or chunk >= k:
        r = np.matmul(a, b)
        return r.astype(np.int64) if r.dtype != np.int64 else r
    acc = None
    for k0 in range(0, k, chunk):
        k1 = min(k, k0 + chunk)
        part = np.matmul(a[..., k0:k1], b[..., k0:k1, :])
        if acc is None:
            acc = part.astype(np.float64)
        else:
            acc += part
    return acc.astype(np.int64)


def _padded(x: np.ndarray, pads, value: int, c: int, dtype) -> np.ndarray:
    """x - c, padded with value - c, in dtype."""
    N, C, H, W = x.shape
    pl, pr, pt, pb = pads
    xp = np.empty((N, C, H + pt + pb, W + pl + pr), dtype=dtype)
    if pt or pb or pl or pr:
        xp.fill(value - c)
    inner = xp[:, :, pt:pt + H, pl:pl + W]
    inner[...] = x
    if c:
        inner -= c
    return xp


def conv2d_acc(x, w, bias=None, pad_lrtb=(0, 0, 0, 0), pad_value: int = 0, stride=1,
               dilation=1, groups: int = 1) -> np.ndarray:
    """Exact integer convolution accumulator (NCHW), int64 [N, O, OH, OW].

    ``x`` raw integer activations [N, C, H, W] (NOT zero-point shifted); ``w`` [O, C/groups,
    KH, KW] integer weights already ``w - w_zp`` (int8 or int16 values); ``bias`` [O] already
    ``bias - in_zp * Σw'`` (or None); padding is filled with ``pad_value`` (= in_zp, so borders
    stay correct). acc[n, o] = Σ_taps xpad * w[o] + bias[o].
    """
    x = np.asarray(x)
    w = np.asarray(w)
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError("conv2d_acc expects x [N,C,H,W] and w [O,C/g,KH,KW]")
    N, C, H, W = x.shape
    O, Cg, KH, KW = w.shape
    g = int(groups)
    if g < 1 or C != Cg * g or O % g:
        raise ValueError(f"bad groups={g} for x channels {C}, w shape {w.shape}")
    pads = _pads(pad_lrtb)
    pl, pr, pt, pb = pads
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    OH = conv_out_size(H, KH, sh, dh, pt, pb)
    OW = conv_out_size(W, KW, sw, dw, pl, pr)
    if OH <= 0 or OW <= 0:
        raise ValueError("convolution output would be empty")
    has_pad = any(pads)
    c, mx = _centre(x, pad_value if has_pad else None)
    w64 = w.astype(np.int64)
    mw = int(np.abs(w64).max()) if w64.size else 0
    extra = np.zeros(O, dtype=np.int64)
    if c:
        extra += c * w64.reshape(O, -1).sum(axis=1)
    if bias is not None:
        extra += np.asarray(bias).astype(np.int64).reshape(O)
    Og = O // g

    if Cg == 1 and g == C:
        acc = _depthwise(x, w64, pads, pad_value, c, mx, mw, (sh, sw), (dh, dw), OH, OW, Og)
    else:
        K = Cg * KH * KW
        dtype, chunk = _engine(K, mx, mw)
        xp = _padded(x, pads, pad_value, c, dtype)
        sN, sC, sH, sW = xp.strides
        view = as_strided(
            xp, shape=(N, g, Cg, KH, KW, OH, OW),
            strides=(sN, Cg * sC, sC, sH * dh, sW * dw, sH * sh, sW * sw), writeable=False)
        wm = np.ascontiguousarray(w64.reshape(g, Og, K).astype(dtype))
        P = OH * OW
        nb = max(1, min(N, _COLS_BUDGET // max(1, g * K * P)))
        acc = np.empty((N, O, OH, OW), dtype=np.int64)
        for n0 in range(0, N, nb):
            n1 = min(N, n0 + nb)
            cols = np.ascontiguousarray(view[n0:n1]).reshape(n1 - n0, g, K, P)
            r = _chunked_matmul(wm, cols, dtype, chunk)       # [nb, g, Og, P]
            acc[n0:n1] = r.reshape(n1 - n0, O, OH, OW)
    acc += extra.reshape(1, O, 1, 1)
    return acc


def _depthwise(x, w64, pads, pad_value, c, mx, mw, stride, dilation, OH, OW, mult):
    N, C, H, W = x.shape
    O, _, KH, KW = w64.shape
    sh, sw = stride
    dh, dw = dilation
    bound = KH * KW * mx * mw
    dtype = np.float32 if bound <= _F24 else (np.float64 if bound < _F53 else np.int64)
    wt = np.ascontiguousarray(w64.reshape(O, KH * KW).T.astype(dtype))   # [taps, O]
    out = np.empty((N, O, OH, OW), dtype=np.int64)
    # Work on blocks of input channels so the padded input, the accumulator and the temporary
    # stay cache-resident (fresh full-size temporaries cost more than the arithmetic).
    per_c = N * mult * max(OH * OW, x.shape[2] * x.shape[3])
    cb = max(1, min(C, (1 << 16) // max(1, per_c)))
    for c0 in range(0, C, cb):
        c1 = min(C, c0 + cb)
        xp = _padded(x[:, c0:c1], pads, pad_value, c, dtype)
        if mult > 1:
            xp = np.repeat(xp, mult, axis=1)      # output channel o reads input channel o // mult
        o0, o1 = c0 * mult, c1 * mult
        acc = np.zeros((N, o1 - o0, OH, OW), dtype=dtype)
        tmp = np.empty_like(acc)
        for i in range(KH):
            for j in range(KW):
                h0, w0 = i * dh, j * dw
                sl = xp[:, :, h0:h0 + sh * (OH - 1) + 1:sh, w0:w0 + sw * (OW - 1) + 1:sw]
                np.multiply(sl, wt[i * KW + j, o0:o1].reshape(1, -1, 1, 1), out=tmp)
                acc += tmp
        out[:, o0:o1] = acc
    return out


def fc_acc(x, w, bias=None) -> np.ndarray:
    """Exact integer fully-connected accumulator: int64 [..., O] = x @ w.T + bias.

    ``x`` raw integer activations [..., K]; ``w`` [O, K] already ``w - w_zp``; ``bias`` [O]
    already ``bias - in_zp * Σ_k w'[o, k]`` (or None). Same exactness rules as ``conv2d_acc``.
    """
    x = np.asarray(x)
    w = np.asarray(w)
    if w.ndim != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"fc_acc: x {x.shape} and w {w.shape} do not match")
    lead = x.shape[:-1]
    K = x.shape[-1]
    O = w.shape[0]
    x2 = x.reshape(-1, K)
    c, mx = _centre(x2)
    w64 = w.astype(np.int64)
    mw = int(np.abs(w64).max()) if w64.size else 0
    dtype, chunk = _engine(K, mx, mw)
    xc = x2.astype(dtype)
    if c:
        xc -= c
    wt = np.ascontiguousarray(w64.T.astype(dtype))        # [K, O]
    acc = _chunked_matmul(xc, wt, dtype, chunk)            # [M, O]
    extra = np.zeros(O, dtype=np.int64)
    if c:
        extra += c * w64.sum(axis=1)
    if bias is not None:
        extra += np.asarray(bias).astype(np.int64).reshape(O)
    acc += extra
    return acc.reshape(*lead, O)


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
    kh, kw = _pair(kernel)
    sh, sw = _pair(stride)
    pl, pr, pt, pb = _pads(pad_lrtb)
    OH = conv_out_size(H, kh, sh, 1, pt, pb)
    OW = conv_out_size(W, kw, sw, 1, pl, pr)
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
    kh, kw = _pair(kernel)
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    pl, pr, pt, pb = _pads(pad_lrtb)
    OH = conv_out_size(H, kh, sh, dh, pt, pb)
    OW = conv_out_size(W, kw, sw, dw, pl, pr)
    low = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
    xp = np.full((N, C, H + pt + pb, W + pl + pr), low, dtype=x.dtype)
    xp[:, :, pt:pt + H, pl:pl + W] = x
    if kh * kw <= 25:
        out = None
        for i in range(kh):
            for j in range(kw):
                h0, w0 = i * dh, j * dw
                sl = xp[:, :, h0:h0 + sh * (OH - 1) + 1:sh, w0:w0 + sw * (OW - 1) + 1:sw]
                if out is None:
                    out = sl.copy()
                else:
                    np.maximum(out, sl, out=out)
        return out
    return _window_view(xp, (kh, kw), (sh, sw), (dh, dw), OH, OW).max(axis=(4, 5))
