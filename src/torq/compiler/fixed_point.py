"""The single home of every rounding and scale computation in torq.

Why one module
--------------
torq has to agree bit-for-bit with two different machines:

* the TORQ NPU ("native" mode): the compiler turns every real-valued rescale into an int32
  multiplier and a right shift (``multiplier_and_shift``), and the NSS ACT unit applies it with
  round-to-nearest, ties toward +inf (``act_native``);
* ONNX Runtime's x86 CPU EP ("ort" mode): float32 requantisation with a specific operation
  order, an FMA-contracted constant in QLinearAdd, true division in QuantizeLinear, and so on
  (``*_ort`` helpers; recipes from ``shared/research/numerics-proto.md`` §4, re-verified
  element by element against ORT 1.32 on x86-64 in ``tests/test_kernels_vs_ort.py``; the
  QLinearAdd broadcast variants were refined there, see ``add_ort``).

A one-ulp change in the order of two float32 multiplications, or a different tie rule, shows up
as a 1-LSB mismatch somewhere in a ResNet. If the compiler (which stores multipliers in
``scale_bias``), the simulator (which applies them) and the comparison harness (which explains
differences) each had their own copy of this arithmetic, they would drift apart silently. So
every function that decides how a number is rounded lives here, and everything else imports it.
The module is numpy, the standard library and a few numba-compiled loops (``jit``; no ORT, no
MLIR), so the simulator can use it at full speed and the tests can hold it against real ONNX
Runtime. Each compiled loop is the same formula as its numpy reference (``act_native``,
``requant_ort``, ``add_native_mults``' int64 path), checked element for element by the tests.

Conventions
-----------
* Accumulators are integer numpy arrays (int64 on the Python side); they already include the
  bias. Channel axis defaults to 1 (NCHW, or [N, O] for fully connected / matmul columns).
* "q" ranges are explicit (``qmin``, ``qmax``), so every helper works for int8, uint8 and int16
  outputs alike; uint8 values are simply handled as plain integers 0..255 with their zero point.
* Scales come in as float32 values (the ONNX initialisers). Where a float64 value is needed
  (native mode) it is computed from the exact float32 values.
* Every returned quantised array is int64 (ready for ``.astype(np.int8)`` etc.).
"""
from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Iterable, Sequence

import numpy as np

__all__ = [
    "INT32_MIN", "INT32_MAX", "MAX_SHIFT", "SHIFT_STEP", "ZERO_SCALE_SHIFT",
    "llround", "multiplier_and_shift", "per_channel_multipliers", "native_conv_scale",
    "rescale_multipliers", "scale_multipliers", "act_native", "act_native_parts", "ntp_shift",
    "ort_conv_scale", "ort_qgemm_scale", "requant_ort", "requant_ort_parts", "fma32",
    "ort_broadcast_mode",
    "add_ort", "add_multipliers", "add_native",
    "avgpool_native", "global_avgpool_ort", "avgpool_ort",
    "quantize_ort", "dequantize_ort",
    "to_bf16", "f64_to_bf16", "quantize_bf16_native", "dequantize_bf16_native",
    "exact_ratio", "classify_real", "classify_rescale_diff", "explain_diffs", "explain_add_diffs",
]

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
MAX_SHIFT = 60          # QuantPatternUtils kMaxShift
SHIFT_STEP = 4          # "The Torq hardware requires the shift amount to be a multiple of 4"
ZERO_SCALE_SHIFT = 28   # computeMultiplierAndShift(0) -> (0, 28)

_F32 = np.float32
_F64 = np.float64
_F53_INT = 1 << 53


def jit(fn):
    """``fn`` compiled with numba on its first call (nopython, GIL released, cached on disk).

    The simulator's per-element loops (rescale, Winograd transforms) are written as plain
    loops over one element's formula, so each is one pass over memory instead of numpy's chain
    of temporaries. numba is imported on first use: importing the compiler never pays for it."""
    compiled = None

    @functools.wraps(fn)
    def call(*args):
        nonlocal compiled
        if compiled is None:
            import numba
            try:
                compiled = numba.njit(cache=True, nogil=True)(fn)
            except RuntimeError:            # no writable cache location: compile per process
                compiled = numba.njit(nogil=True)(fn)
        return compiled(*args)
    return call


# ---------------------------------------------------------------------------------------------
# Native (NPU) fixed point
# ---------------------------------------------------------------------------------------------

def llround(x: float) -> int:
    """C ``llround``: round half away from zero, computed exactly for any finite double.

    ``math.floor(x + 0.5)`` is *not* exact (0.49999999999999994 + 0.5 rounds to 1.0 in double);
    ``x - floor(x)`` is exact for every double, so the tie test below is exact.
    """
    if not math.isfinite(x):
        raise ValueError(f"llround of non-finite value {x!r}")
    a = abs(x)
    n = math.floor(a)              # Python int, exact
    if a - n >= 0.5:               # exact: the fractional part of a double is representable
        n += 1
    return -n if x < 0 else n


def _llround_pow2(scale: float, s: int) -> int:
    # math.ldexp only changes the exponent: exact (scale < 2**31 and s <= 60, so no overflow;
    # no underflow since s >= 0).
    return llround(math.ldexp(scale, s))


def _check_scale(scale) -> float:
    try:
        v = float(scale)
    except (TypeError, ValueError) as e:
        raise ValueError(f"scale must be a real number, got {scale!r}") from e
    if not math.isfinite(v):
        raise ValueError(f"scale must be finite, got {v!r}")
    if v < 0:
        raise ValueError(f"scale must be >= 0, got {v!r}")
    return v


def multiplier_and_shift(scale: float) -> tuple[int, int]:
    """computeMultiplierAndShift (torq-compiler QuantPatternUtils.cpp), exact.

    * scale == 0 -> (0, 28);
    * scale < 0 or non-finite -> ValueError;
    * otherwise the largest s in {60, 56, ..., 4, 0} whose ``llround(scale * 2**s)`` (half away
      from zero, computed exactly) fits int32; ValueError if none fits (scale >= 2**31 - 0.5).

    ``scale`` may be a Python float or a numpy float32/float64 scalar (widened exactly).
    Seed check: 0.5 -> (134217728, 28).
    """
    v = _check_scale(scale)
    if v == 0.0:
        return 0, ZERO_SCALE_SHIFT
    if v >= 2.0 ** 31:
        raise ValueError(f"scale {v!r} too large: no shift in 0..60 gives an int32 multiplier")
    for s in range(MAX_SHIFT, -1, -SHIFT_STEP):
        m = _llround_pow2(v, s)
        if m <= INT32_MAX:
            return m, s
    raise ValueError(f"scale {v!r} too large: no shift in 0..60 gives an int32 multiplier")


def per_channel_multipliers(scales) -> tuple[np.ndarray, int]:
    """One int32 multiplier per channel and ONE shared shift (torq per-channel extension).

    The shared shift is the smallest of the per-channel ``multiplier_and_shift`` shifts, so every
    channel's multiplier ``llround(scale_c * 2**shift)`` still fits int32. A zero scale gives
    multiplier 0 and does not take part in choosing the shift (its own shift, 28, is an
    arbitrary convention and would only throw away precision of the other channels); if all
    scales are zero the shift is 28.
    """
    sc = np.asarray(scales, dtype=_F64).reshape(-1)
    vals = [_check_scale(s) for s in sc]
    shifts = [multiplier_and_shift(s)[1] for s in vals if s != 0.0]
    shift = min(shifts) if shifts else ZERO_SCALE_SHIFT
    mults = np.array([_llround_pow2(s, shift) if s != 0.0 else 0 for s in vals], dtype=np.int64)
    return mults, shift


def native_conv_scale(xs, ws, ys) -> np.ndarray:
    """Real rescale for native mode, in float64 from the float32 qparams: ``xs * ws / ys``.

    ``float64(xs) * float64(ws)`` is exact (24 + 24 bits); the division rounds once.
    ``ws`` may be per-channel. Returns a float64 scalar array or 1-D array.
    """
    x = _F64(_F32(xs))
    w = np.asarray(ws, dtype=_F32).astype(_F64)
    y = _F64(_F32(ys))
    return (x * w) / y


def rescale_multipliers(xs, ws, ys) -> tuple[np.ndarray | int, int]:
    """(multiplier(s), shift) for a Conv / FC / MatMul rescale ``xs*ws/ys``.

    Per-tensor ``ws`` -> (int, shift); per-channel ``ws`` -> (int64 array, shared shift).
    """
    return scale_multipliers(native_conv_scale(xs, ws, ys))


def scale_multipliers(scale) -> tuple[np.ndarray | int, int]:
    """(multiplier, shift) of a scalar rescale; (int64 multipliers, shared shift) of a vector."""
    s = np.asarray(scale, dtype=_F64)
    if s.ndim == 0:
        return multiplier_and_shift(float(s))
    return per_channel_multipliers(s)


def _bcast(v, ndim: int, axis: int, dtype) -> np.ndarray:
    """Broadcast a scalar, a 1-D per-channel vector (placed on ``axis``), or an array that
    already has ``ndim`` dims (numpy broadcasting), against an ndim-dimensional tensor."""
    a = np.asarray(v, dtype=dtype)
    if a.ndim == 0 or a.ndim == ndim:
        return a
    if a.ndim == 1:
        if ndim == 0:
            raise ValueError("per-channel parameter given for a scalar accumulator")
        shape = [1] * ndim
        shape[axis] = a.shape[0]
        return a.reshape(shape)
    raise ValueError(f"cannot broadcast parameter of shape {a.shape} against a {ndim}-D tensor")


def ntp_shift(t: np.ndarray, shift) -> np.ndarray:
    """Round-to-nearest, ties toward +inf, divide by 2**shift: ``(t + ((1<<s)>>1)) >> s``.

    ``t`` int64 (modified in place when it is a fresh array you own); ``shift`` scalar or an
    array broadcastable against ``t``. numpy's ``>>`` on int64 is an arithmetic shift (floor).
    """
    s = np.asarray(shift, dtype=np.int64)
    if s.ndim == 0:
        si = int(s)
        if not 0 <= si <= 62:
            raise ValueError(f"shift {si} out of range 0..62")
        if si:
            t += (1 << si) >> 1
            t >>= si
        return t
    if s.min() < 0 or s.max() > 62:
        raise ValueError("shift out of range 0..62")
    t += np.right_shift(np.left_shift(np.int64(1), s), 1)
    t >>= s
    return t


def act_native(acc, mult, shift, out_zp, out_min, out_max, axis: int = 1,
               *, overflow: str = "wrap") -> np.ndarray:
    """The NSS ACT unit (NTP rounding), exactly as the hardware golden formula:

        t = int64(int32(acc)) * mult
        t = (t + ((1 << s) >> 1)) >> s          # round to nearest, ties toward +inf
        q = clamp(t + out_zp, out_min, out_max)

    ``acc`` integer array (already includes the bias). ``mult`` (and ``shift``) are scalars,
    1-D per-channel vectors broadcast along ``axis``, or arrays with acc's ndim (numpy
    broadcasting; used for per-window multipliers of average pools).

    int32 wrap: the hardware adds acc and bias in a 32-bit register, so an accumulator outside
    int32 wraps modulo 2**32 (``overflow="wrap"``, the default, reproduces that). Pass
    ``overflow="raise"`` to get an OverflowError instead (useful when validating a compiler).
    Returns int64.
    """
    a = np.asarray(acc)
    if a.dtype.kind not in "iu":
        raise TypeError(f"act_native needs an integer accumulator, got {a.dtype}")
    a = a.astype(np.int64, copy=False)
    if a.size and (a.min() < INT32_MIN or a.max() > INT32_MAX):
        if overflow == "raise":
            raise OverflowError("accumulator outside int32")
        a = a.astype(np.int32).astype(np.int64)   # two's complement wrap, like the hardware
    m = _bcast(mult, a.ndim, axis, np.int64)
    if m.size and (m.min() < INT32_MIN or m.max() > INT32_MAX):
        raise ValueError("multiplier does not fit int32")
    s = _bcast(shift, a.ndim, axis, np.int64)
    t = np.asarray(a * m)                        # |t| < 2**62: no int64 overflow
    t = ntp_shift(t, s)
    t += int(out_zp)
    np.clip(t, int(out_min), int(out_max), out=t)
    return t


def _split_ok(a: np.ndarray, axis: int, out_dtype, lo: int, hi: int) -> bool:
    """Common preconditions of the fused ``*_parts`` fast paths."""
    if a.ndim == 0 or not -a.ndim <= axis < a.ndim or a.dtype.kind not in "iuf":
        return False
    od = np.dtype(out_dtype)
    if od.kind not in "iu":
        return False
    info = np.iinfo(od)
    return info.min <= lo <= hi <= info.max


def _parts_int64(acc, extra, axis: int) -> np.ndarray:
    a = np.asarray(acc)
    if a.dtype.kind == "f":
        a = a.astype(np.int64)
    else:
        a = a.astype(np.int64, copy=True)
    e = _bcast(np.asarray(extra, dtype=np.int64), a.ndim, axis, np.int64) if a.ndim else extra
    return a + e


def act_native_parts(acc, extra, mult, shift, out_zp, out_min, out_max, *, acc_bound: int,
                     bound: int, axis: int = 1, out_dtype=np.int64) -> np.ndarray:
    """``act_native(acc + extra, mult, shift, out_zp, out_min, out_max, axis)`` cast to
    ``out_dtype``, for an exact accumulator given in two parts, in one compiled pass.

    ``acc`` holds exact integers in any numeric dtype (float32 / float64 from an exact GEMM, or
    an integer dtype); ``extra`` and ``mult`` are scalars or 1-D per-channel vectors along
    ``axis``; the caller guarantees ``|acc| <= acc_bound`` and ``|acc + extra| <= bound``
    (Python ints; see ``torq.runtime.kernels.AccParts``). When the bounds show that the sum fits
    int32 (no wrap), every element is ``act_native``'s formula in int64 (``|sum * m| < 2**62``).
    In every other case (per-element multipliers, possible wrap) act_native runs on the int64
    sum, so the result is always identical.
    """
    a = np.asarray(acc)
    zp, lo, hi = int(out_zp), int(out_min), int(out_max)
    fast = _split_ok(a, axis, out_dtype, lo, hi) and np.ndim(shift) == 0 \
        and 0 <= int(bound) <= INT32_MAX and 0 <= int(acc_bound) <= (1 << 53) and 0 <= int(shift) <= 62
    if fast:
        m = _channel_params(mult, a, axis, np.int64)
        e = _channel_params(extra, a, axis, np.int64)
        fast = (m is not None and e is not None and (not m.size or (
            int(m.max()) <= INT32_MAX and int(m.min()) >= INT32_MIN)))
    if not fast:
        full = _parts_int64(a, extra, axis)
        return np.asarray(act_native(full, mult, shift, zp, lo, hi, axis)).astype(out_dtype)
    out = np.empty(a.shape, dtype=out_dtype)
    _act_loop(_contiguous_rows(_as4d(a, axis)), e, m, int(shift), zp, lo, hi, _as4d(out, axis))
    return out


@jit
def _act_loop(acc, extra, mult, shift, zp, lo, hi, out):
    """act_native on acc + extra[o] (exact integers, sum within int32), 4-D [pre, O, mid, last];
    ``acc`` may be larger than ``out`` (only ``acc[:, :, :M, :L]`` is read)."""
    r = (np.int64(1) << shift) >> 1
    P, O, M, L = out.shape
    for p in range(P):
        for o in range(O):
            e, m = extra[o], mult[o]
            for i in range(M):
                for j in range(L):
                    t = (((np.int64(acc[p, o, i, j]) + e) * m + r) >> shift) + zp
                    out[p, o, i, j] = min(max(t, lo), hi)


def _channel_params(v, a: np.ndarray, axis: int, dtype) -> np.ndarray | None:
    """A scalar or per-channel parameter as a 1-D vector over a's channel axis (None if it has
    another shape)."""
    arr = np.asarray(v, dtype=dtype)
    C = a.shape[axis]
    if arr.ndim == 0:
        return np.full(C, arr, dtype=dtype)
    if arr.ndim == 1 and arr.size == C:
        return np.ascontiguousarray(arr)
    return None


def _as4d(a: np.ndarray, axis: int) -> np.ndarray:
    """a as [prod(dims before axis), C, prod(dims between), last dim] (a view when numpy can;
    a copy otherwise)."""
    axis %= a.ndim
    pre = math.prod(a.shape[:axis])
    post = a.shape[axis + 1:]
    if len(post) == 0:
        return a.reshape(pre, a.shape[axis], 1, 1)
    return a.reshape(pre, a.shape[axis], math.prod(post[:-1]), post[-1])


def _contiguous_rows(a4: np.ndarray) -> np.ndarray:
    """A C-contiguous 4-D array whose ``[:, :, :M, :L]`` is ``a4`` [P, C, M, L]: ``a4`` itself, or
    the buffer it was sliced from when it is a row/column window of one (the GEMM's "wide"
    layout, an odd Winograd output) -- only the window is ever read -- else a copy.

    Compiled loops need it: numba vectorises loops over C-contiguous arrays only, and a strided
    view runs ~50x slower there."""
    if a4.flags.c_contiguous:
        return a4
    P, C, M, L = a4.shape
    it = a4.itemsize
    s0, s1, s2, s3 = a4.strides
    if s3 == it and s2 > 0 and s2 % it == 0 and s2 >= L * it and s1 % s2 == 0 and s1 >= M * s2 and (
            P == 1 or s0 == C * s1) and (C == 1 or s1 > 0):
        W, Mf = s2 // it, s1 // s2
        return np.lib.stride_tricks.as_strided(a4, (P, C, Mf, W), (C * s1, s1, s2, it), writeable=False)
    return np.ascontiguousarray(a4)


# ---------------------------------------------------------------------------------------------
# ORT mode: what ONNX Runtime's x86-64 CPU EP (MLAS) computes
# ---------------------------------------------------------------------------------------------

def ort_conv_scale(xs, ws, ys) -> np.ndarray:
    """QLinearConv / QLinearMatMul output scale: ``fl32(fl32(xs * ws) / ys)``.

    ``ws`` scalar or per-channel. Returns a float32 (0-d or 1-D) array.
    """
    p = (_F32(xs) * np.asarray(ws, dtype=_F32)).astype(_F32)
    return (p / _F32(ys)).astype(_F32)


def ort_qgemm_scale(alpha, xs, ws, ys) -> np.ndarray:
    """com.microsoft.QGemm output scale: ``fl32(fl32(fl32(alpha * xs) * ws) / ys)``."""
    a = _F32(_F32(alpha) * _F32(xs))
    p = (a * np.asarray(ws, dtype=_F32)).astype(_F32)
    return (p / _F32(ys)).astype(_F32)


def requant_ort(acc, scale_f32, out_zp, qmin, qmax, axis: int = 1) -> np.ndarray:
    """MlasRequantizeOutput (x86): ``clamp(RNE(fl32(fl32(int32(acc)) * s)), qmin-zp, qmax-zp) + zp``.

    ``acc`` integer array including the bias; it is taken modulo 2**32 like ORT's int32
    accumulator. ``scale_f32`` scalar or per-channel along ``axis``. Clamping in float before
    rounding (as MLAS does) is equivalent to clamping after, since the bounds are integers.
    """
    a = np.asarray(acc).astype(np.int64, copy=False)
    a32 = a.astype(np.int32)
    s = _bcast(scale_f32, a.ndim, axis, _F32)
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
    fast = _split_ok(a, axis, out_dtype, lo, hi) and 0 <= int(bound) <= INT32_MAX \
        and 0 <= int(acc_bound) <= _F53_INT
    if fast:
        s = _channel_params(scale_f32, a, axis, _F32)
        e = _channel_params(extra, a, axis, np.int64)
        fast = s is not None and e is not None
    if not fast:
        full = _parts_int64(a, extra, axis)
        return np.asarray(requant_ort(full, scale_f32, zp, lo, hi, axis)).astype(out_dtype)
    out = np.empty(a.shape, dtype=out_dtype)
    _requant_ort_loop(_contiguous_rows(_as4d(a, axis)), e, s, zp, lo, hi, _as4d(out, axis))
    return out


@jit
def _requant_ort_loop(acc, extra, scale, zp, lo, hi, out):
    """requant_ort on acc + extra[o] (exact integers, sum within int32), 4-D like _act_loop."""
    flo, fhi = np.float32(lo - zp), np.float32(hi - zp)
    P, O, M, L = out.shape
    for p in range(P):
        for o in range(O):
            e, s = extra[o], scale[o]
            for i in range(M):
                for j in range(L):
                    f = np.float32(np.int64(acc[p, o, i, j]) + e) * s
                    f = min(max(f, flo), fhi)
                    out[p, o, i, j] = np.int64(np.rint(f)) + zp


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


def add_multipliers(sa, sb, sc) -> tuple[int, int, int]:
    """Native Add rescale: (mA, mB, shift) with one shared shift.

    rA = sA/sC, rB = sB/sC in float64 from the float32 scales; shift = min(shift(rA), shift(rB))
    in ``multiplier_and_shift`` semantics (so both int32 multipliers fit); mX = llround(rX*2^shift).
    (The reference compiler uses int16 multipliers for Add; torq keeps 32-bit ones.)
    """
    rA = float(_F32(sa)) / float(_F32(sc))
    rB = float(_F32(sb)) / float(_F32(sc))
    (mA, mB), shift = per_channel_multipliers([rA, rB])
    return int(mA), int(mB), int(shift)


def add_native(a, b, sa, za, sb, zb, sc, zc, qmin, qmax) -> np.ndarray:
    """Native (NPU) quantised Add, integer only:

        t = (a - zA)*mA + (b - zB)*mB        (int64, exact)
        q = clamp(((t + ((1<<s)>>1)) >> s) + zC, qmin, qmax)
    """
    mA, mB, shift = add_multipliers(sa, sb, sc)
    return add_native_mults(a, b, za, zb, mA, mB, shift, zc, qmin, qmax)


def add_native_mults(a, b, za, zb, mA, mB, shift, zc, qmin, qmax, out_dtype=np.int64) -> np.ndarray:
    """add_native with the multipliers and shift the compiler stored on the op:
    ``clamp((((a - za)*mA + (b - zb)*mB + r) >> shift) + zc)``, r = (1 << shift) >> 1."""
    a, b = np.asarray(a), np.asarray(b)
    si, zc, lo, hi = int(shift), int(zc), int(qmin), int(qmax)
    if (a.shape == b.shape and a.dtype.kind in "iu" and b.dtype.kind in "iu" and a.dtype.itemsize <= 2
            and b.dtype.itemsize <= 2 and 0 <= si <= 62 and abs(int(mA)) <= INT32_MAX
            and abs(int(mB)) <= INT32_MAX and abs(int(za)) < (1 << 16) and abs(int(zb)) < (1 << 16)):
        out = np.empty(a.shape, dtype=out_dtype)      # |(a - za) * mA| < 2**48: no int64 overflow
        _add_loop(a.reshape(-1), b.reshape(-1), int(za), int(zb), int(mA), int(mB), si, zc, lo, hi,
                  out.reshape(-1))
        return out
    a64 = a.astype(np.int64) - int(za)
    b64 = b.astype(np.int64) - int(zb)
    t = a64 * mA + b64 * mB
    t = ntp_shift(np.array(t, dtype=np.int64), shift)
    t += zc
    np.clip(t, lo, hi, out=t)
    return t.astype(out_dtype, copy=False)


@jit
def _add_loop(a, b, za, zb, mA, mB, shift, zc, lo, hi, out):
    r = (np.int64(1) << shift) >> 1
    for i in range(a.size):
        t = (((np.int64(a[i]) - za) * mA + (np.int64(b[i]) - zb) * mB + r) >> shift) + zc
        out[i] = min(max(t, lo), hi)


# ---------------------------------------------------------------------------------------------
# Average pools
# ---------------------------------------------------------------------------------------------

def avgpool_native(sum_minus_zp, counts, xs, ys, zy, qmin, qmax) -> np.ndarray:
    """Native average pool: integer window sum Σ(x - zx), then one rescale per distinct window
    count: ``multiplier_and_shift(xs / (ys * count))`` applied with ``act_native`` (NTP).

    ``counts`` is a scalar or an array broadcastable (numpy rules) against ``sum_minus_zp``,
    e.g. [OH, OW] for an [N, C, OH, OW] sum.
    """
    acc = np.asarray(sum_minus_zp).astype(np.int64, copy=False)
    cnt = np.asarray(counts, dtype=np.int64)
    uniq, inv = np.unique(cnt.reshape(-1), return_inverse=True)
    ms = [avgpool_multiplier(xs, ys, int(c)) for c in uniq]
    if len(ms) == 1 and cnt.ndim == 0:
        return act_native(acc, ms[0][0], ms[0][1], zy, qmin, qmax)
    shape = (1,) * (acc.ndim - cnt.ndim) + cnt.shape
    mult = np.array([m for m, _ in ms], dtype=np.int64)[inv].reshape(shape)
    shift = np.array([s for _, s in ms], dtype=np.int64)[inv].reshape(shape)
    return act_native(acc, mult, shift, zy, qmin, qmax)


def global_avgpool_ort(acc, n, xs, ys, zy, qmin, qmax) -> np.ndarray:
    """QLinearGlobalAveragePool (and QLinearAveragePool's global fallback), x86 MLAS:

        s = fl32(xs / fl32(ys * n));  acc = Σx - zx*n (int32)
        y = clamp(RNE(fl32(fl32(acc) * s)), qmin - zy, qmax - zy) + zy
    """
    s = _F32(_F32(xs) / _F32(_F32(ys) * _F32(int(n))))
    return requant_ort(acc, s, zy, qmin, qmax)


def pair(v) -> tuple[int, int]:
    """A scalar or 2-sequence (kernel, stride, dilation) as an (h, w) pair of ints."""
    if np.ndim(v) == 0:
        return int(v), int(v)
    t = tuple(int(i) for i in v)
    if len(t) != 2:
        raise ValueError(f"expected 2 values, got {v!r}")
    return t


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


# ---------------------------------------------------------------------------------------------
# QuantizeLinear / DequantizeLinear (ORT) and the NPU's bf16 fallback
# ---------------------------------------------------------------------------------------------

def quantize_ort(x_f32, scale, zp, qmin, qmax, axis: int = 1) -> np.ndarray:
    """QuantizeLinear (MLAS x86): ``clamp(RNE(fl32(x / scale)), qmin - zp, qmax - zp) + zp``.

    True float32 division (multiplying by the reciprocal differs on some inputs). ``scale`` /
    ``zp`` scalar or per-axis (1-D along ``axis``). NaN inputs are not modelled (result
    unspecified; MLAS vector and tail paths disagree).
    """
    x = np.asarray(x_f32, dtype=_F32)
    s = _bcast(scale, x.ndim, axis, _F32)
    z = _bcast(zp, x.ndim, axis, np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.asarray(x / s, dtype=_F32)
    lo = (int(qmin) - z).astype(_F32)
    hi = (int(qmax) - z).astype(_F32)
    v = np.minimum(np.maximum(v, lo), hi)
    return np.rint(v).astype(np.int64) + z


def dequantize_ort(q, scale, zp, axis: int = 1) -> np.ndarray:
    """DequantizeLinear: ``fl32(fl32(q - zp) * scale)`` (float32 result)."""
    qa = np.asarray(q)
    s = _bcast(scale, qa.ndim, axis, _F32)
    z = _bcast(zp, qa.ndim, axis, np.int64)
    return ((qa.astype(np.int64) - z).astype(_F32) * s).astype(_F32)


def to_bf16(x_f32) -> np.ndarray:
    """Round float32 values to bfloat16 (round to nearest, ties to even, on the upper 16 bits).

    Returns a float32 array holding exactly-representable bf16 values. NaN stays NaN (quieted),
    overflow rounds to +/-inf as IEEE RNE does.
    """
    x = np.asarray(x_f32, dtype=_F32)
    shape = x.shape
    x = np.ascontiguousarray(x).reshape(-1)
    u = x.view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    nan = np.isnan(x)
    if nan.any():
        r = np.where(nan, (u & np.uint32(0xFFFF0000)) | np.uint32(0x00400000), r)
    return np.asarray(r, dtype=np.uint32).view(_F32).reshape(shape)


def f64_to_bf16(v) -> np.ndarray:
    """Round float64 values to bfloat16 with a single rounding (RNE).

    float64 -> float32 is done with round-to-odd (24 bits >= 8 + 2, so the subsequent RNE to
    bf16 equals a direct RNE). Returns float32 values holding bf16 numbers.
    """
    v = np.asarray(v, dtype=_F64)
    with np.errstate(over="ignore"):
        r = v.astype(_F32)
    r = np.array(r, dtype=_F32, copy=True, ndmin=0)
    inexact = (r.astype(_F64) != v) & np.isfinite(v)
    if np.any(inexact):
        # truncate toward zero, then force the lowest mantissa bit to 1 (round to odd)
        over = inexact & (np.abs(r.astype(_F64)) > np.abs(v))
        r = np.where(over, np.nextafter(r, _F32(0)), r).astype(_F32)
        bits = np.ascontiguousarray(r).reshape(-1).view(np.uint32)
        bits = np.where(inexact.reshape(-1), bits | np.uint32(1), bits).astype(np.uint32)
        r = bits.view(_F32).reshape(v.shape)
    return to_bf16(r)


def quantize_bf16_native(x, scale, zp, qmin, qmax) -> np.ndarray:
    """The NPU's standalone QuantizeLinear fallback (QuantizePattern.cpp, seed §4.4.2), in bf16:

    1. act f2f: x (f32) -> bf16 (RNE);
    2. torq_hl.mul by bf16(1/scale) (1/scale taken in double, rounded once to bf16); the
       product of two bf16 values is exact in f32 and is rounded to bf16;
    3. + zp as a bf16 add (exact sum rounded once to bf16) — modelled as two separately rounded
       steps (mul, then add), not as one fused multiply-add;
    4. act f2i: bf16 -> integer, round half to even (our choice: the hardware's exact f2i tie
       rule is not documented; RNE matches the float reference on exact ties);
    5. fma clamp to [qmin, qmax].

    NaN inputs give 0 before the clamp (hardware behaviour not documented). Returns int64.
    """
    xb = to_bf16(np.asarray(x, dtype=_F32))
    inv = f64_to_bf16(1.0 / float(_F32(scale)))
    with np.errstate(over="ignore", invalid="ignore"):
        y = to_bf16((xb * inv).astype(_F32))
        y = f64_to_bf16(y.astype(_F64) + float(int(zp)))
    q = np.rint(y.astype(_F64))
    q = np.where(np.isnan(q), 0.0, q)
    q = np.clip(q, float(qmin), float(qmax))
    return q.astype(np.int64)


def dequantize_bf16_native(q, scale, zp) -> np.ndarray:
    """The NPU's standalone DequantizeLinear fallback, in bf16:

    1. act i2f: q -> bf16 (exact for 8-bit values: |q| <= 256);
    2. torq_hl.mul by bf16(scale) with bias -zp*scale. Modelled as (q - zp) * bf16(scale) with
       ONE rounding to bf16 (|q - zp| <= 255 is exact in bf16, and the product is exact in f32
       before that rounding);
    3. act f2f: bf16 -> f32 (exact).

    Returns float32 (holding bf16 values).
    """
    sb = f64_to_bf16(float(_F32(scale)))
    d = (np.asarray(q).astype(np.int64) - int(zp)).astype(_F32)
    return to_bf16((d * sb).astype(_F32))


# ---------------------------------------------------------------------------------------------
# Explaining native-vs-ORT differences
# ---------------------------------------------------------------------------------------------

_HALF = Fraction(1, 2)
NEAR_TIE = Fraction(1, 1000)


def _frac(v) -> Fraction:
    if isinstance(v, Fraction):
        return v
    if isinstance(v, (int, np.integer)):
        return Fraction(int(v))
    return Fraction(float(v))        # float32 / float64 values are exact rationals


def exact_ratio(num: Iterable = (), den: Iterable = ()) -> Fraction:
    """Product of ``num`` divided by product of ``den``, each float (e.g. a float32 scale)
    taken as the exact rational it represents. ``exact_ratio((xs, ws), (ys,))``."""
    r = Fraction(1)
    for v in num:
        r *= _frac(v)
    for v in den:
        r /= _frac(v)
    return r


def _as_scale(scale) -> Fraction:
    if isinstance(scale, tuple):
        if len(scale) != 2:
            raise ValueError("scale tuple must be (num_parts, den_parts)")
        return exact_ratio(*scale)
    return _frac(scale)


def classify_real(r) -> str:
    """'tie' if frac(r) == 1/2 exactly, 'near-tie' if |frac(r) - 1/2| < 1e-3, else 'other'."""
    r = _frac(r)
    f = r - math.floor(r)
    if f == _HALF:
        return "tie"
    if abs(f - _HALF) < NEAR_TIE:
        return "near-tie"
    return "other"


def classify_rescale_diff(acc, scale) -> str:
    """Classify one differing element from its integer accumulator and the exact real rescale.

    ``scale`` is a Fraction, a float (exact value used), or a ``(num_parts, den_parts)`` tuple
    of floats, e.g. ``((xs, ws_c), (ys,))``. The real output before the zero point is
    ``acc * scale``.
    """
    return classify_real(Fraction(int(acc)) * _as_scale(scale))


def explain_diffs(acc_values, scale) -> dict[str, int]:
    """Count the causes of native-vs-ORT differences.

    ``acc_values``: the accumulators of the differing elements only (any shape, flattened).
    ``scale``: one scale for all (Fraction / float / ``(num, den)`` tuple), or a list / array
    with one such scale per element. Returns ``{'tie': n, 'near-tie': n, 'other': n}``.
    """
    acc = np.asarray(acc_values).reshape(-1)
    out = {"tie": 0, "near-tie": 0, "other": 0}
    per_elem = not (isinstance(scale, (tuple, Fraction, float, int, np.floating, np.integer))
                    or (isinstance(scale, np.ndarray) and scale.ndim == 0))
    if per_elem:
        scales = list(np.asarray(scale, dtype=object).reshape(-1)) \
            if not isinstance(scale, list) else scale
        if len(scales) != acc.size:
            raise ValueError("need one scale per differing element")
        cache: dict = {}
        for a, s in zip(acc.tolist(), scales):
            key = (a, s if not isinstance(s, np.ndarray) else float(s))
            if key not in cache:
                cache[key] = classify_rescale_diff(a, s)
            out[cache[key]] += 1
        return out
    sc = _as_scale(scale)
    vals, counts = np.unique(acc, return_counts=True)
    for a, c in zip(vals.tolist(), counts.tolist()):
        out[classify_real(Fraction(int(a)) * sc)] += int(c)
    return out


def explain_add_diffs(a, b, sa, za, sb, zb, sc) -> dict[str, int]:
    """Like ``explain_diffs`` for Add: real value ((a-zA)*sA + (b-zB)*sB) / sC (exact)."""
    av = np.asarray(a).reshape(-1)
    bv = np.asarray(b).reshape(-1)
    fa, fb, fc = _frac(_F32(sa)), _frac(_F32(sb)), _frac(_F32(sc))
    out = {"tie": 0, "near-tie": 0, "other": 0}
    for x, y in zip(av.tolist(), bv.tolist()):
        r = ((int(x) - int(za)) * fa + (int(y) - int(zb)) * fb) / fc
        out[classify_real(r)] += 1
    return out


# ---------------------------------------------------------------------------------------------
# Multiply (com.microsoft.QLinearMul)
# ---------------------------------------------------------------------------------------------

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


def mul_multiplier(sa, sb, sc) -> tuple[int, int]:
    """Native Mul rescale: (multiplier, shift) for ``sa * sb / sc`` (float64 from float32 qparams)."""
    return multiplier_and_shift(float(_F32(sa)) * float(_F32(sb)) / float(_F32(sc)))


def mul_native(a, b, za, zb, mult, shift, zc, qmin, qmax) -> np.ndarray:
    """NPU Mul: ``clamp(NTP((a - za)(b - zb) * mult >> shift) + zc)`` (exact int64)."""
    p = (np.asarray(a).astype(np.int64) - int(za)) * (np.asarray(b).astype(np.int64) - int(zb))
    return act_native(p, mult, shift, zc, qmin, qmax)


def avgpool_multiplier(xs, ys, count: int) -> tuple[int, int]:
    """Native average-pool rescale for one window size: ``multiplier_and_shift(xs / (ys * count))``."""
    return multiplier_and_shift(float(_F32(xs)) / (float(_F32(ys)) * int(count)))


def bf16_affine(x, factor, bias) -> np.ndarray:
    """The NPU's bf16 ``mul`` of the Q/DQ fallback: ``bf16(bf16(x * factor) + bias)``."""
    return to_bf16(to_bf16(np.asarray(x, _F32) * _F32(factor)) + _F32(bias))


def float_to_int(x) -> np.ndarray:
    """``act f2i``: float (bf16 or f32) to integer, round half to even."""
    return np.rint(np.asarray(x)).astype(np.int64)


def bf16_fallback_constants(scale, zp, quantize: bool) -> tuple[float, float]:
    """(factor, bias) of the fallback ``mul`` (seed §4.4.2), both bf16-representable:
    Quantize: x · bf16(1/scale) + zp;  Dequantize: q · bf16(scale) + bf16(-zp·scale)."""
    if quantize:
        return float(to_bf16(_F32(1.0 / float(scale)))), float(to_bf16(_F32(zp)))
    return float(to_bf16(_F32(scale))), float(to_bf16(_F32(-int(zp) * float(scale))))


def add_float_ort(a, b, sa, za, sb, zb, sc, zc, qmin, qmax) -> np.ndarray:
    """Add as ONNX Runtime runs it when it does NOT fuse QLinearAdd (e.g. a legacy Sum, or an
    unquantized Relu between the Add and its QuantizeLinear): DQ -> float Add -> Q, bit-exact:
    ``y = QuantizeLinear(fl32(fl32((a - za)·sa) + fl32((b - zb)·sb)), sc, zc)``."""
    fa = dequantize_ort(np.asarray(a).astype(np.int64), sa, za)
    fb = dequantize_ort(np.asarray(b).astype(np.int64), sb, zb)
    return quantize_ort((fa + fb).astype(_F32), sc, zc, qmin, qmax)
