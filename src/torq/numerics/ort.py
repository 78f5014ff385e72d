"""What ONNX Runtime's x86-64 CPU EP (MLAS, ORT 1.32) computes for quantized ops, bit for bit.

Float32 requantisation with a specific operation order, an FMA-contracted constant in
QLinearAdd, true division in QuantizeLinear, and so on; every recipe here is checked element by
element against real ONNX Runtime in ``tests/runtime/test_kernels_vs_ort.py``. ``fl32(.)`` is
one IEEE float32 operation (numpy float32 arithmetic), RNE is ``np.rint``.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .loops import as4d, bcast, channel_params, contiguous_rows, pair, parts_int64, requant_ort_loop, split_ok
from .native import INT32_MAX

__all__ = ["global_avgpool_scale", "dq_scale", "ort_requant_scale", "requant_ort", "requant_ort_parts", "fma32",
           "ort_broadcast_mode", "add_ort", "add_float_ort", "mul_scale_ort", "mul_ort",
           "global_avgpool_ort", "avgpool_ort", "quantize_ort", "dequantize_ort"]

_F32 = np.float32
_F64 = np.float64
_F53_INT = 1 << 53


def dq_scale(xs, ws, alpha=None) -> np.ndarray:
    """The DequantizeLinear scale of an int32 Conv / MatMul / Gemm result: ``fl32(xs * ws)``
    (QGemm: ``fl32(fl32(alpha * xs) * ws)``), the product ORT and the QDQ graph's bias scale
    use. ``ws`` scalar or per-channel; returns a float32 array (0-d or 1-D)."""
    x = _F32(xs) if alpha is None else _F32(_F32(alpha) * _F32(xs))
    return (x * np.asarray(ws, dtype=_F32)).astype(_F32)


def ort_requant_scale(dq, ys) -> np.ndarray:
    """QLinearConv / QLinearMatMul / QGemm output scale from the dq scale: ``fl32(dq / ys)``."""
    return (np.asarray(dq, dtype=_F32) / _F32(ys)).astype(_F32)


def requant_ort(acc, scale_f32, out_zp, qmin, qmax, axis: int = 1) -> np.ndarray:
    """MlasRequantizeOutput (x86): ``clamp(RNE(fl32(fl32(int32(acc)) * s)), qmin-zp, qmax-zp) + zp``.

    ``acc`` integer array including the bias; it is taken modulo 2**32 like ORT's int32
    accumulator. ``scale_f32`` scalar or per-channel along ``axis``. Clamping in float before
    rounding (as MLAS does) is equivalent to clamping after, since the bounds are integers.
    """
    a = np.asarray(acc).astype(np.int64, copy=False)
    a32 = a.astype(np.int32)
    s = bcast(scale_f32, a.ndim, axis, _F32)
    f = a32.astype(_F32) * s                     # int32 -> f32 is RNE; f32 * f32 -> f32
    f = np.asarray(f, dtype=_F32)
    np.clip(f, _F32(int(qmin) - int(out_zp)), _F32(int(qmax) - int(out_zp)), out=f)
    q = np.rint(f).astype(np.int64)
    q += int(out_zp)
    return q


def requant_ort_parts(acc, extra, scale_f32, out_zp, qmin, qmax, *, acc_bound: int,
                      bound: int, axis: int = 1, out_dtype=np.int64) -> np.ndarray:
    """``requant_ort(acc + extra, scale_f32, out_zp, qmin, qmax, axis)`` cast to ``out_dtype``,
    for an exact accumulator given in two parts (as in ``act_native_parts``), in one compiled
    pass: when ``|acc + extra| <= bound`` fits int32 (ORT's int32 accumulator does not wrap),
    every element is requant_ort's formula (int -> float32 RNE, float32 multiply, clamp, RNE,
    zero point). Otherwise requant_ort runs on the int64 sum.
    """
    a = np.asarray(acc)
    zp, lo, hi = int(out_zp), int(qmin), int(qmax)
    fast = split_ok(a, axis, out_dtype, lo, hi) and 0 <= int(bound) <= INT32_MAX \
        and 0 <= int(acc_bound) <= _F53_INT
    if fast:
        s = channel_params(scale_f32, a, axis, _F32)
        e = channel_params(extra, a, axis, np.int64)
        fast = s is not None and e is not None
    if not fast:
        full = parts_int64(a, extra, axis)
        return np.asarray(requant_ort(full, scale_f32, zp, lo, hi, axis)).astype(out_dtype)
    out = np.empty(a.shape, dtype=out_dtype)
    requant_ort_loop(contiguous_rows(as4d(a, axis)), e, s, zp, lo, hi, as4d(out, axis))
    return out



def fma32(a, b, c) -> np.ndarray:
    """Single-rounding float32 fused multiply-add ``fl32(a*b + c)`` for float32 operands.

    a*b is exact in float64 (24+24 bits). The float64 sum can round; to avoid double rounding
    (f64 then f32) the sum is rounded to *odd* in float64 (TwoSum error term, then step one ulp
    toward the exact value when the RNE result is even), which makes the final float32 RNE
    conversion correct for all finite inputs.
    """
    a64 = np.asarray(a, dtype=_F32).astype(_F64)
    b64 = np.asarray(b, dtype=_F32).astype(_F64)
    c64 = np.asarray(c, dtype=_F32).astype(_F64)
    p = a64 * b64
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)            # TwoSum: exact residual (p + c) - s
    s = np.array(s, dtype=_F64, copy=True)
    err = np.broadcast_to(err, s.shape)
    fix = (err != 0) & ((s.view(np.int64) & 1) == 0) & np.isfinite(s)
    if fix.any():
        s[fix] = np.nextafter(s[fix], np.where(err[fix] > 0, np.inf, -np.inf))
    return s.astype(_F32)


def ort_broadcast_mode(shape_a: Sequence[int], shape_b: Sequence[int]) -> str:
    """Which span function ORT's BroadcastLooper uses for a binary op (single-threaded).

    Mirrors onnxruntime's Broadcaster: walking dims from the innermost, dims where both inputs
    are 1 are skipped (except the last common one); the first remaining dim decides whether an
    input is constant over the innermost span. Returns ``"a_scalar"`` (input 0 is a scalar per
    span; checked first), ``"b_scalar"`` or ``"general"``.
    """
    sa, sb = list(shape_a), list(shape_b)
    if len(sa) == 0 or len(sb) == 0:
        if len(sa) == 0:
            return "a_scalar"
        return "a_scalar" if sa[-1] <= 1 else "b_scalar"
    nmin = min(len(sa), len(sb))
    for i in range(nmin):
        a_i, b_i = sa[-1 - i], sb[-1 - i]
        if max(a_i, b_i) <= 1 and i + 1 < nmin:
            continue
        if not a_i > 1:
            return "a_scalar"
        if not b_i > 1:
            return "b_scalar"
        return "general"
    return "general"  # unreachable


def _cvtps_epi32_sat(t: np.ndarray, qmin: int, qmax: int) -> np.ndarray:
    """``_mm256_cvtps_epi32`` (RNE; NaN / out-of-range -> INT32_MIN) then the saturating packs
    (int32 -> int16 -> int8/uint8), i.e. a clamp to [qmin, qmax]."""
    r = np.rint(np.asarray(t, dtype=_F32)).astype(_F64)
    valid = (r >= -2.0 ** 31) & (r < 2.0 ** 31)   # NaN -> False
    q = np.where(valid, r, -2.0 ** 31).astype(np.int64)
    np.clip(q, int(qmin), int(qmax), out=q)
    return q


def add_ort(a, b, sa, za, sb, zb, sc, zc, qmin, qmax) -> np.ndarray:
    """com.microsoft.QLinearAdd as ORT's x86 (AVX2 / AVX-512 machine) MLAS kernel computes it.

        rA = fl32(sA/sC); rB = fl32(sB/sC)
        F  = fl32(zC - fma32(rA, zA, fl32(rB*zB)))           # compiler-contracted a*b + c*d
        t  = fma32(a, rA, fma32(b, rB, F))
        y  = sat(RNE(t))

    The same formula holds when B is a scalar per span (broadcast [1,C,1,1] or [1]): the kernel
    folds ``b*rB`` into the constant with an FMA, ``fma32(b, rB, F)``, which is the inner FMA
    above. (An unfused ``fl32(F + fl32(b*rB))`` fails on exhaustive (a, b) pairs in ~5 % of
    random scale draws.) When A is the scalar per span, ORT calls the kernel with the inputs
    swapped (B is the vector), so A and B exchange roles everywhere, including in F:
    ``F' = fl32(zC - fma32(rB, zB, fl32(rA*zA)))``, ``t = fma32(b, rB, fma32(a, rA, F'))``.

    ``a``/``b`` integer arrays (numpy-broadcastable); which span path ORT takes is decided from
    their shapes exactly as ORT's single-threaded BroadcastLooper does (``ort_broadcast_mode``).
    """
    a = np.asarray(a)
    b = np.asarray(b)
    mode = ort_broadcast_mode(a.shape, b.shape)
    shape = np.broadcast_shapes(a.shape, b.shape)
    if (math.prod(shape) >= _ADD_TAB_MIN_SIZE and a.dtype.kind in "iu" and b.dtype.kind in "iu"
            and a.size and b.size):
        # y depends on the pair (a, b) only: for int8 / uint8 operands, look it up in a table of
        # the very same formula over every pair (built once per parameter set, then cached)
        lo, n = _ADD_TAB_LO, _ADD_TAB_N
        if lo <= int(a.min()) and int(a.max()) < lo + n and lo <= int(b.min()) and int(b.max()) < lo + n:
            key = (mode, float(_F32(sa)), int(za), float(_F32(sb)), int(zb), float(_F32(sc)), int(zc),
                   int(qmin), int(qmax))
            tab = _ADD_TABLES.get(key)
            if tab is None:
                g = np.arange(lo, lo + n, dtype=_F32)
                tab = _add_ort_formula(np.repeat(g, n), np.tile(g, n), mode, sa, za, sb, zb, sc, zc,
                                       qmin, qmax)
                if len(_ADD_TABLES) >= _ADD_TAB_CACHE:
                    _ADD_TABLES.pop(next(iter(_ADD_TABLES)))
                _ADD_TABLES[key] = tab
            idx = a.astype(np.int64) * n
            idx = idx + b                                  # broadcast to shape
            idx += -lo * n - lo
            return tab.take(idx)
    af = np.broadcast_to(a, shape).astype(_F32)
    bf = np.broadcast_to(b, shape).astype(_F32)
    return _add_ort_formula(af, bf, mode, sa, za, sb, zb, sc, zc, qmin, qmax)


_ADD_TAB_LO, _ADD_TAB_N = -128, 384     # add_ort table domain: a, b in [-128, 255]
_ADD_TAB_MIN_SIZE = 1 << 14             # use (and build) a table from this many outputs on
_ADD_TAB_CACHE = 64                     # tables kept (insertion order, oldest dropped)
_ADD_TABLES: dict = {}


def _add_ort_formula(af, bf, mode, sa, za, sb, zb, sc, zc, qmin, qmax) -> np.ndarray:
    """add_ort on float32 operands of one shape, for a given ORT span mode."""
    rA = _F32(_F32(sa) / _F32(sc))
    rB = _F32(_F32(sb) / _F32(sc))
    fza, fzb, fzc = _F32(int(za)), _F32(int(zb)), _F32(int(zc))
    if mode == "a_scalar":          # MLAS sees (vector = B, scalar = A)
        af, bf, rA, rB, fza, fzb = bf, af, rB, rA, fzb, fza
    F = _F32(fzc - fma32(rA, fza, _F32(rB * fzb))[()])
    t = fma32(af, rA, fma32(bf, rB, F))
    return _cvtps_epi32_sat(t, qmin, qmax)



def global_avgpool_ort(acc, n, xs, ys, zy, qmin, qmax) -> np.ndarray:
    """QLinearGlobalAveragePool (and QLinearAveragePool's global fallback), x86 MLAS:

        s = fl32(xs / fl32(ys * n));  acc = Σx - zx*n (int32)
        y = clamp(RNE(fl32(fl32(acc) * s)), qmin - zy, qmax - zy) + zy
    """
    return requant_ort(acc, global_avgpool_scale(n, xs, ys), zy, qmin, qmax)


def global_avgpool_scale(n, xs, ys) -> np.float32:
    """The float32 requant scale of ORT's global average pool: ``fl32(xs / fl32(ys * n))``."""
    return _F32(_F32(xs) / _F32(_F32(ys) * _F32(int(n))))



def avgpool_ort(x, kernel, stride, pad_lrtb, count_include_pad, xs, zx, ys, zy,
                qmin, qmax) -> np.ndarray:
    """com.microsoft.QLinearAveragePool (NCHW, ceil_mode 0) as ORT computes it.

    If the kernel covers the whole image and there is no padding, ORT takes the global path
    (integer sum, float requant: ``global_avgpool_ort``). Otherwise, per window::

        xf  = fl32(xs * float(x - zx))
        acc = 0.0f; for each valid position in row-major window order: acc = fl32(acc + xf)
        v   = fl32(acc / cnt)     cnt = kh*kw if count_include_pad else (#valid rows)*(#valid cols)
        y   = clamp(RNE(fl32(fl32(v / ys) + zy)), qmin, qmax)

    Padded positions are added as +0.0 in their window slot, which leaves every partial sum of
    the valid values unchanged, so the tap loop below reproduces ORT's summation order exactly.
    """
    x = np.asarray(x)
    N, C, H, W = x.shape
    kh, kw = pair(kernel)
    sh, sw = pair(stride)
    pl, pr, pt, pb = (int(p) for p in pad_lrtb)
    if (kh, kw) == (H, W) and pl == pr == pt == pb == 0:
        acc = x.astype(np.int64).sum(axis=(2, 3), keepdims=True) - int(zx) * H * W
        return global_avgpool_ort(acc, H * W, xs, ys, zy, qmin, qmax)
    OH = (H + pt + pb - kh) // sh + 1
    OW = (W + pl + pr - kw) // sw + 1
    xf = (x.astype(np.int32) - int(zx)).astype(_F32) * _F32(xs)
    xp = np.zeros((N, C, H + pt + pb, W + pl + pr), dtype=_F32)
    xp[:, :, pt:pt + H, pl:pl + W] = xf
    acc = np.zeros((N, C, OH, OW), dtype=_F32)
    for i in range(kh):
        for j in range(kw):
            acc += xp[:, :, i:i + sh * (OH - 1) + 1:sh, j:j + sw * (OW - 1) + 1:sw]
    if count_include_pad:
        cnt = np.full((OH, OW), kh * kw, dtype=_F32)
    else:
        hs = np.arange(OH) * sh - pt
        ws_ = np.arange(OW) * sw - pl
        rows = np.minimum(hs + kh, H) - np.maximum(hs, 0)
        cols = np.minimum(ws_ + kw, W) - np.maximum(ws_, 0)
        cnt = (rows[:, None] * cols[None, :]).astype(_F32)
    v = (acc / cnt).astype(_F32)
    v = (v / _F32(ys)).astype(_F32)
    v = (v + _F32(int(zy))).astype(_F32)
    q = np.rint(v)
    np.clip(q, _F32(int(qmin)), _F32(int(qmax)), out=q)
    return q.astype(np.int64)



def quantize_ort(x_f32, scale, zp, qmin, qmax, axis: int = 1) -> np.ndarray:
    """QuantizeLinear (MLAS x86): ``clamp(RNE(fl32(x / scale)), qmin - zp, qmax - zp) + zp``.

    True float32 division (multiplying by the reciprocal differs on some inputs). ``scale`` /
    ``zp`` scalar or per-axis (1-D along ``axis``). NaN inputs are not modelled (result
    unspecified; MLAS vector and tail paths disagree).
    """
    x = np.asarray(x_f32, dtype=_F32)
    s = bcast(scale, x.ndim, axis, _F32)
    z = bcast(zp, x.ndim, axis, np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.asarray(x / s, dtype=_F32)
    lo = (int(qmin) - z).astype(_F32)
    hi = (int(qmax) - z).astype(_F32)
    v = np.minimum(np.maximum(v, lo), hi)
    return np.rint(v).astype(np.int64) + z


def dequantize_ort(q, scale, zp, axis: int = 1) -> np.ndarray:
    """DequantizeLinear: ``fl32(fl32(q - zp) * scale)`` (float32 result)."""
    qa = np.asarray(q)
    s = bcast(scale, qa.ndim, axis, _F32)
    z = bcast(zp, qa.ndim, axis, np.int64)
    return ((qa.astype(np.int64) - z).astype(_F32) * s).astype(_F32)



def mul_scale_ort(sa, sb, sc) -> np.float32:
    """QLinearMul's float scale: ``fl32(fl32(sa * sb) / sc)``."""
    return _F32(_F32(_F32(sa) * _F32(sb)) / _F32(sc))


def mul_ort(a, b, sa, za, sb, zb, sc, zc, qmin, qmax) -> np.ndarray:
    """QLinearMul as ORT's x86 kernel computes it (checked on all 65,536 int8 pairs with dyadic
    and random scales): the zero point is added in float *before* rounding, unfused:

        y = clamp(RNE(fl32(fl32(fl32(p) * S) + zc)), qmin, qmax),  p = (a - za)(b - zb) (int32)
    """
    p = (np.asarray(a).astype(np.int64) - int(za)) * (np.asarray(b).astype(np.int64) - int(zb))
    t = (p.astype(np.int32).astype(_F32) * mul_scale_ort(sa, sb, sc)).astype(_F32)
    t = (t + _F32(zc)).astype(_F32)
    return np.clip(np.rint(t), int(qmin), int(qmax)).astype(np.int64)



def add_float_ort(a, b, sa, za, sb, zb, sc, zc, qmin, qmax) -> np.ndarray:
    """Add as ONNX Runtime runs it when it does NOT fuse QLinearAdd (e.g. a legacy Sum, or an
    unquantized Relu between the Add and its QuantizeLinear): DQ -> float Add -> Q, bit-exact:
    ``y = QuantizeLinear(fl32(fl32((a - za)·sa) + fl32((b - zb)·sb)), sc, zc)``."""
    fa = dequantize_ort(np.asarray(a).astype(np.int64), sa, za)
    fb = dequantize_ort(np.asarray(b).astype(np.int64), sb, zb)
    return quantize_ort((fa + fb).astype(_F32), sc, zc, qmin, qmax)
