"""The NPU's fixed point: int32 multiplier + right shift, ACT unit rounding (NTP).

The compiler turns every real rescale into ``(multiplier, shift)`` (``multiplier_and_shift``,
exactly the reference compiler's computeMultiplierAndShift: the largest multiple-of-4 shift
whose ``llround(scale * 2**shift)`` fits int32), and the ACT unit applies it:

    t = int64(int32(acc)) * mult;  t = (t + ((1 << s) >> 1)) >> s;  q = clamp(t + zp, lo, hi)

i.e. round to nearest, ties toward +inf, on the exact product. Conventions: accumulators are
integer arrays that already include the bias; the channel axis defaults to 1 (NCHW, or [N, O]
for fully connected); ``qmin``/``qmax`` are explicit so int8, uint8 and int16 work alike;
scales come in as float32 values and are widened exactly; results are int64.
"""
from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

from .exact_add import add_exact_ratios, add_ratios_ort, mul_scale_exact
from .loops import act_loop, add_loop, as4d, bcast, channel_params, contiguous_rows, parts_int64, split_ok

__all__ = ["global_avgpool_act", "INT32_MIN", "INT32_MAX", "MAX_SHIFT", "SHIFT_STEP", "ZERO_SCALE_SHIFT", "llround",
           "multiplier_and_shift", "per_channel_multipliers", "conv_rescale",
           "conv_rescale_constant_channels", "constant_channel", "constant_output", "exact_dyadic", "EXACT_GRID_BITS",
           "rescale_ties_even", "ntp_shift",
           "act_native", "act_native_parts", "add_multipliers", "add_native_mults", "mul_multiplier",
           "mul_native", "avgpool_multiplier", "avgpool_native", "nte_shift", "UINT8_SHIFT", "uint8_to_int8",
           "int8_to_uint8"]

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
MAX_SHIFT = 60          # QuantPatternUtils kMaxShift
SHIFT_STEP = 4          # "The Torq hardware requires the shift amount to be a multiple of 4"
ZERO_SCALE_SHIFT = 28   # computeMultiplierAndShift(0) -> (0, 28)

_F32 = np.float32
_F64 = np.float64


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
    # llround(v * 2**s) never decreases with v, so the largest scale has the smallest shift
    # (one search instead of one per channel); equal scales share their multiplier.
    largest = max(vals, default=0.0)
    shift = multiplier_and_shift(largest)[1] if largest != 0.0 else ZERO_SCALE_SHIFT
    mult = {v: _llround_pow2(v, shift) if v != 0.0 else 0 for v in set(vals)}
    return np.array([mult[v] for v in vals], dtype=np.int64), shift


def conv_rescale(dq_scale, ys, float_path: bool = False) -> tuple[np.ndarray, int]:
    """(int64 multiplier per output channel, shared shift) of a Conv / FC / MatMul rescale.

    The reference compiler takes ``scaleFactor = inputScale / outputScale`` where ``inputScale``
    is the DequantizeLinear scale of the i32 result, i.e. the float32 product ``dq_scale``
    (``ort.dq_scale(xs, ws)``, as stored in the QDQ graph), not the exact product ``xs * ws``:
    the division is done in double from the float32 values. Per-tensor scales give a 1-element
    vector.
    """
    return per_channel_multipliers(_rescale_scales(dq_scale, ys, float_path))


def _rescale_scales(dq_scale, ys, float_path: bool = False) -> np.ndarray:
    """The real rescale per channel: ORT's float32 ``fl32(dq / ys)`` where it is an exact dyadic
    (``exact_dyadic``: ORT's float32 products are then exact and an int32 multiplier holds the
    same value, so the NPU computes what ORT computes), else the reference compiler's double
    quotient of the float32 values. ``float_path`` (int16 in or out: ORT runs the op in float and
    never forms ``fl32(dq / ys)``): the double quotient for every channel."""
    from .ort import ort_requant_scale          # ort imports this module: resolved at call time
    dq = np.asarray(dq_scale, dtype=_F32).astype(_F64).reshape(-1)
    quotient = dq / _F64(_F32(ys))
    if float_path:
        return quotient
    s32 = ort_requant_scale(dq_scale, ys).reshape(-1)
    return np.where(exact_dyadic(s32), s32.astype(_F64), quotient)


def rescale_ties_even(dq_scale, ys, float_path: bool = False) -> bool:
    """The ACT mode of a Conv / FC / MatMul rescale: NTE (round half to even) when a channel's
    ORT requant scale is an exact dyadic — its rescale then has real x.5 ties, which ORT rounds
    to even; the other channels' ~30-bit multipliers of inexact scales practically never tie.
    ``float_path`` (int16 activations): the scale is the exact ``dq/ys`` (``_rescale_scales``),
    and it has real ties wherever that rational is a dyadic (``exact_int16``'s scales: ORT's
    float arithmetic is then exact and rounds those ties to even)."""
    from .ort import ort_requant_scale
    if float_path:
        dens = ((Fraction(float(d)) / Fraction(float(_F32(ys)))).denominator
                for d in np.asarray(dq_scale, _F32).reshape(-1) if d > 0)
        return any(den & (den - 1) == 0 for den in dens)
    return bool(np.any(exact_dyadic(ort_requant_scale(dq_scale, ys))))


EXACT_GRID_BITS = 16    # |acc·s| < 256 on a 2**-16 grid: 24 significant bits, exact in float32


def exact_dyadic(scale) -> np.ndarray:
    """Per element: a positive multiple of 2**-EXACT_GRID_BITS (float32 or float64 values).

    For such a requant scale ORT's ``fl32(acc·s)`` is exact wherever the output is in range
    (|acc·s| < 256 needs at most 24 significant bits), so its rounding is the exact rounding
    (ties to even), which the ACT's NTE mode with the multiplier ``s·2**shift`` reproduces."""
    s = np.asarray(scale, dtype=_F64)
    scaled = np.ldexp(s, EXACT_GRID_BITS)
    return (s > 0) & (scaled == np.floor(scaled))


def conv_rescale_constant_channels(dq_scale, ys, bias, constant, out_zp, out_min, out_max,
                                   float_path: bool = False):
    """``conv_rescale`` for constant weights, where some output channels (``constant``, a mask)
    have all-zero weights: their accumulator is their bias, their output a constant.

    Such channels do not take part in choosing the shared shift. ORT gives an all-zero weight
    channel the weight scale 1.0, often thousands of times the live channels' scales; as the
    largest scale it would set the shift and leave every live multiplier 10-15 bits short
    (EfficientNet-Lite0 with dead channels: median 16 bits instead of 25-29, the main source of
    native-vs-ORT 1-LSB differences). Each constant channel instead gets a bias ``b·2**k`` and a
    multiplier solved so that the ACT unit outputs exactly ``clamp(NTP(b·scale) + zp)``
    (``constant_channel``); its ORT dq scale is divided by ``2**k`` so that ORT's float recipe
    gives the same numbers too (power-of-two scaling is exact in float32). Channels without a
    solution keep taking part, as in ``conv_rescale``.

    Returns ``(multipliers, shift, bias, dq_scale)``, the last two changed (copies) where k > 0.
    """
    scales, bias_in = _rescale_scales(dq_scale, ys, float_path), bias
    mask = np.asarray(constant, bool).reshape(-1)
    if len(scales) < 2 or mask.all() or not mask.any():       # per-tensor: one scale, no outlier
        return (*per_channel_multipliers(scales), bias, dq_scale)
    bias = np.array(bias, dtype=np.int64).reshape(-1)
    dq = np.array(dq_scale, dtype=_F32).reshape(-1)
    mults, shift = per_channel_multipliers(np.where(mask, 0.0, scales))
    for c in np.flatnonzero(mask):
        solved = constant_channel(int(bias[c]), float(scales[c]), shift, out_zp, out_min, out_max)
        if solved is None:
            return (*per_channel_multipliers(scales), np.asarray(bias_in), dq_scale)
        k, mults[c] = solved
        bias[c] <<= k
        dq[c] = np.ldexp(dq[c], -k)
    return mults, shift, bias, dq


def constant_output(dq_scale, ys, acc_lo, acc_hi, out_zp, out_min, out_max) -> np.ndarray:
    """Per output channel: does every accumulator in ``[acc_lo, acc_hi]`` give one output, the
    same by ORT's float32 recipe (``requant_ort``) and by the exact ``clamp(NTP(acc·scale) + zp)``
    that ``constant_channel`` reproduces? Both are monotone in acc, so the two ends decide; a
    range leaving int32 (the accumulator would wrap) never does. Such a channel (a BatchNorm
    "dust" channel: weights 1e-8 of its layer's, a bias near the int32 limit) is a constant."""
    from .ort import ort_requant_scale, requant_ort
    lo = np.asarray(acc_lo, np.int64).reshape(-1)
    hi = np.asarray(acc_hi, np.int64).reshape(-1)
    inside = (lo >= INT32_MIN) & (hi <= INT32_MAX)
    s32 = ort_requant_scale(dq_scale, ys).reshape(-1) * np.ones(len(lo), _F32)
    ort = [requant_ort(np.clip(a, INT32_MIN, INT32_MAX)[None], s32, out_zp, out_min, out_max)[0] for a in (lo, hi)]
    scales = _rescale_scales(dq_scale, ys) * np.ones(len(lo))
    zp, qlo, qhi = int(out_zp), int(out_min), int(out_max)

    def exact(acc, c):
        return min(max(math.floor(Fraction(int(acc)) * Fraction(float(scales[c])) + Fraction(1, 2)) + zp, qlo), qhi)
    same = inside & (ort[0] == ort[1])
    for c in np.flatnonzero(same):
        same[c] = exact(lo[c], c) == exact(hi[c], c) == int(ort[0][c])
    return same


def constant_channel(acc: int, scale: float, shift: int, out_zp: int, out_min: int,
                     out_max: int) -> tuple[int, int] | None:
    """``(k, m)``: with accumulator ``acc·2**k`` and multiplier ``m`` in [0, INT32_MAX] the ACT
    unit at ``shift`` outputs ``clamp(NTP(acc·scale) + out_zp)`` (exact rationals); or None.

    k = 0 with the usual ``llround(scale·2**shift)`` when that fits and gives the constant;
    otherwise the smallest k (``acc·2**k`` within int32) for which some multiplier does (the
    ACT output is monotonic in the multiplier, so the bounds of the wanted value give it).
    """
    zp, lo, hi = int(out_zp), int(out_min), int(out_max)
    exact = Fraction(acc) * Fraction(_check_scale(scale))
    want = min(max(math.floor(exact + Fraction(1, 2)) + zp, lo), hi)
    half = (1 << shift) >> 1
    # t = floor((a·m + half) / 2**s) must land in [t_lo, t_hi]: the values that clamp to `want`
    t_lo = want - zp if want > lo else None
    t_hi = want - zp if want < hi else None
    for k in range(0, shift + 1):
        a = acc << k
        if not INT32_MIN <= a <= INT32_MAX:
            return None
        usual = _llround_pow2(float(scale), shift - k)
        candidates = [usual, 0, INT32_MAX]
        if a > 0 and t_lo is not None:      # smallest m with t >= t_lo
            candidates.append(-((half - t_lo * (1 << shift)) // a))
        if a < 0 and t_hi is not None:      # smallest m with t <= t_hi
            candidates.append((half - (t_hi + 1) * (1 << shift)) // -a + 1)
        for m in candidates:
            if 0 <= m <= INT32_MAX and min(max(((a * m + half) >> shift) + zp, lo), hi) == want:
                return k, int(m)
        if a == 0:
            return None
    return None


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
               *, overflow: str = "wrap", ties_even: bool = False) -> np.ndarray:
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
    ``ties_even``: the ACT's NTE mode (round half to even), chosen by the compiler where the
    rescale is an exact dyadic (real ties; ORT rounds them to even). Returns int64.
    """
    a = np.asarray(acc)
    if a.dtype.kind not in "iu":
        raise TypeError(f"act_native needs an integer accumulator, got {a.dtype}")
    a = a.astype(np.int64, copy=False)
    if a.size and (a.min() < INT32_MIN or a.max() > INT32_MAX):
        if overflow == "raise":
            raise OverflowError("accumulator outside int32")
        a = a.astype(np.int32).astype(np.int64)   # two's complement wrap, like the hardware
    m = bcast(mult, a.ndim, axis, np.int64)
    if m.size and (m.min() < INT32_MIN or m.max() > INT32_MAX):
        raise ValueError("multiplier does not fit int32")
    s = bcast(shift, a.ndim, axis, np.int64)
    t = np.asarray(a * m)                        # |t| < 2**62: no int64 overflow
    t = nte_shift(t, s) if ties_even else ntp_shift(t, s)
    t += int(out_zp)
    np.clip(t, int(out_min), int(out_max), out=t)
    return t



def act_native_parts(acc, extra, mult, shift, out_zp, out_min, out_max, *, acc_bound: int,
                     bound: int, axis: int = 1, out_dtype=np.int64, ties_even: bool = False) -> np.ndarray:
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
    fast = split_ok(a, axis, out_dtype, lo, hi) and np.ndim(shift) == 0 \
        and 0 <= int(bound) <= INT32_MAX and 0 <= int(acc_bound) <= (1 << 53) and 0 <= int(shift) <= 62
    if fast:
        m = channel_params(mult, a, axis, np.int64)
        e = channel_params(extra, a, axis, np.int64)
        fast = (m is not None and e is not None and (not m.size or (
            int(m.max()) <= INT32_MAX and int(m.min()) >= INT32_MIN)))
    if not fast:
        full = parts_int64(a, extra, axis)
        return np.asarray(act_native(full, mult, shift, zp, lo, hi, axis, ties_even=ties_even)).astype(out_dtype)
    out = np.empty(a.shape, dtype=out_dtype)
    act_loop(contiguous_rows(as4d(a, axis)), e, m, int(shift), zp, lo, hi, as4d(out, axis), ties_even=ties_even)
    return out



def add_multipliers(sa, sb, sc) -> tuple[int, int, int]:
    """Native Add rescale: (mA, mB, shift) with one shared shift.

    rA = sA/sC, rB = sB/sC in float64 from the float32 scales; shift = min(shift(rA), shift(rB))
    in ``multiplier_and_shift`` semantics (so both int32 multipliers fit); mX = llround(rX*2^shift).
    Where ORT's float32 ratios are exact (``add_exact_ratios``) those are taken: mX is then exact
    and the ACT's NTE mode computes ORT's integers.
    (The reference compiler uses int16 multipliers for Add; torq keeps 32-bit ones.)
    """
    rA = float(_F32(sa)) / float(_F32(sc))
    rB = float(_F32(sb)) / float(_F32(sc))
    if add_exact_ratios(sa, sb, sc):    # ORT's float32 ratios are exact dyadics: hold them exactly
        rA, rB = (float(r) for r in add_ratios_ort(sa, sb, sc))
    (mA, mB), shift = per_channel_multipliers([rA, rB])
    return int(mA), int(mB), int(shift)



def add_native_mults(a, b, za, zb, mA, mB, shift, zc, qmin, qmax, out_dtype=np.int64,
                     ties_even: bool = False, zp_after: bool = False) -> np.ndarray:
    """add_native with the multipliers and shift the compiler stored on the op:
    ``clamp((((a - za)*mA + (b - zb)*mB + r) >> shift) + zc)``, r = (1 << shift) >> 1;
    ``ties_even``: the ACT's NTE mode on ``t + (zc << shift)`` (as QLinearAdd rounds ``... + zc``), or on
    ``t`` alone with ``zp_after`` (QuantizeLinear rounds first, then adds zc: ORT's float int16 Add)."""
    a, b = np.asarray(a), np.asarray(b)
    si, zc, lo, hi = int(shift), int(zc), int(qmin), int(qmax)
    if (not (ties_even and zp_after) and a.shape == b.shape and a.dtype.kind in "iu" and b.dtype.kind in "iu" and a.dtype.itemsize <= 2
            and b.dtype.itemsize <= 2 and 0 <= si <= 62 and abs(int(mA)) <= INT32_MAX
            and abs(int(mB)) <= INT32_MAX and abs(int(za)) < (1 << 16) and abs(int(zb)) < (1 << 16)):
        out = np.empty(a.shape, dtype=out_dtype)      # |(a - za) * mA| < 2**48: no int64 overflow
        add_loop(a.reshape(-1), b.reshape(-1), int(za), int(zb), int(mA), int(mB), si, zc, lo, hi,
                 out.reshape(-1), bool(ties_even) and si > 0)
        return out
    a64 = a.astype(np.int64) - int(za)
    b64 = b.astype(np.int64) - int(zb)
    t = np.array(a64 * mA + b64 * mB, dtype=np.int64)
    if ties_even and si > 0:
        t = nte_shift(t, si) + zc if zp_after else nte_shift(t + (zc << si), si)
    else:
        t = ntp_shift(t, si)
        t += zc
    np.clip(t, lo, hi, out=t)
    return t.astype(out_dtype, copy=False)



def mul_multiplier(sa, sb, sc) -> tuple[int, int]:
    """Native Mul rescale: (multiplier, shift) for ``sa * sb / sc`` (float64 from float32 qparams);
    ORT's float32 scale where that is exact (``mul_scale_exact``: the NTE mode then matches ORT)."""
    if mul_scale_exact(sa, sb, sc):
        return multiplier_and_shift(float(_F32(_F32(_F32(sa) * _F32(sb)) / _F32(sc))))
    return multiplier_and_shift(float(_F32(sa)) * float(_F32(sb)) / float(_F32(sc)))


def mul_native(a, b, za, zb, mult, shift, zc, qmin, qmax, ties_even: bool = False) -> np.ndarray:
    """NPU Mul: ``clamp(NTP((a - za)(b - zb) * mult >> shift) + zc)`` (exact int64); ``ties_even``:
    NTE on ``t + (zc << shift)`` (ORT rounds after adding its zero point)."""
    p = (np.asarray(a).astype(np.int64) - int(za)) * (np.asarray(b).astype(np.int64) - int(zb))
    if not (ties_even and int(shift) > 0):
        return act_native(p, mult, shift, zc, qmin, qmax)
    t = nte_shift(np.asarray(p * int(mult) + (int(zc) << int(shift)), np.int64), int(shift))
    return np.clip(t, int(qmin), int(qmax))


def avgpool_multiplier(xs, ys, count: int) -> tuple[int, int]:
    """Native average-pool rescale for one window size: ``multiplier_and_shift(xs / (ys * count))``."""
    return multiplier_and_shift(float(_F32(xs)) / (float(_F32(ys)) * int(count)))



def avgpool_native(sum_minus_zp, counts, xs, ys, zy, qmin, qmax, *, ties_even: bool = False,
                   zp_before_rounding: bool = False) -> np.ndarray:
    """Native average pool: integer window sum Σ(x - zx), then one rescale per distinct window
    count: ``multiplier_and_shift(xs / (ys * count))`` applied by the ACT unit (NTP).

    ``counts`` is a scalar or an array broadcastable (numpy rules) against ``sum_minus_zp``,
    e.g. [OH, OW] for an [N, C, OH, OW] sum.

    ``ties_even``: where a window size's rescale is exact (``xs / (ys·count)`` is the dyadic
    ``mult / 2**shift``, e.g. ys = xs, as ORT's quantizer emits, with a 2×2 window) a quarter of
    the outputs are exact ties, which ORT rounds to even; the ACT unit's NTE mode (round half
    to even) is then used for those windows. ``zp_before_rounding``: ORT's windowed pool rounds
    ``v + zy`` (its global path rounds ``v`` and adds ``zy``): the zero point is then folded into
    the bias (``zy·2**shift / mult``, when that is an integer; NTP otherwise) so that NTE sees
    the same parity as ORT.
    """
    acc = np.asarray(sum_minus_zp).astype(np.int64, copy=False)
    cnt = np.asarray(counts, dtype=np.int64)
    uniq, inv = np.unique(cnt.reshape(-1), return_inverse=True)
    params = [_avgpool_act(xs, ys, int(c), int(zy), ties_even, zp_before_rounding) for c in uniq]
    if not any(nte for *_, nte in params):
        mult, shift = (np.array([p[i] for p in params], dtype=np.int64) for i in (0, 1))
        if len(params) == 1 and cnt.ndim == 0:
            return act_native(acc, mult[0], shift[0], zy, qmin, qmax)
        shape = (1,) * (acc.ndim - cnt.ndim) + cnt.shape
        return act_native(acc, mult[inv].reshape(shape), shift[inv].reshape(shape), zy, qmin, qmax)
    shape = (1,) * (acc.ndim - cnt.ndim) + cnt.shape
    mult, shift, bias, zp, nte = (np.array([p[i] for p in params], dtype=np.int64)[inv].reshape(shape)
                                  for i in range(5))
    t = (acc + bias) * mult
    out = np.where(nte.astype(bool), nte_shift(t.copy(), shift), ntp_shift(t, shift)) + zp
    return np.clip(out, int(qmin), int(qmax))


def global_avgpool_act(xs, ys, count: int, zy: int, ties_even: bool) -> tuple[int, int, bool]:
    """(mult, shift, NTE) of the ACT a global average pool of ``count`` pixels applies to
    Σ(x - zx) (``avgpool_native`` with one window, zero point added after rounding)."""
    m, s, _, _, nte = _avgpool_act(xs, ys, int(count), int(zy), bool(ties_even), False)
    return m, s, bool(nte and s > 0)


@functools.lru_cache(maxsize=1024)
def _avgpool_act(xs, ys, count: int, zy: int, ties_even: bool, zp_before: bool):
    """(mult, shift, bias, zero point added after rounding, 1 if NTE) for one window size
    (cached: the exact-rational test costs more than a global pool's whole rescale)."""
    m, s = avgpool_multiplier(xs, ys, count)
    exact = Fraction(m, 1 << s) == Fraction(float(_F32(xs))) / (Fraction(float(_F32(ys))) * count)
    if not (ties_even and exact and m > 0):
        return m, s, 0, zy, 0
    if not zp_before:
        return m, s, 0, zy, 1
    if (zy << s) % m:
        return m, s, 0, zy, 0
    return m, s, (zy << s) // m, 0, 1


def nte_shift(t: np.ndarray, shift) -> np.ndarray:
    """Round to nearest, ties to even, divide by 2**shift (the ACT unit's NTE mode); ``t`` int64,
    ``shift`` a scalar or an array broadcastable against it (0 = no rounding)."""
    s = np.asarray(shift, dtype=np.int64)
    t += np.where(s > 0, ((t >> s) & 1) - 1, 0)   # an exact tie of an even quotient drops below .5
    return ntp_shift(t, shift)


UINT8_SHIFT = 128


def uint8_to_int8(x) -> np.ndarray:
    """A uint8 tensor as the int8 the NPU computes with: ``x - 128`` (zero points shift alike)."""
    return (np.asarray(x).astype(np.int16) - UINT8_SHIFT).astype(np.int8)


def int8_to_uint8(x) -> np.ndarray:
    """Inverse of ``uint8_to_int8``: ``x + 128`` as uint8."""
    return (np.asarray(x).astype(np.int16) + UINT8_SHIFT).astype(np.uint8)
