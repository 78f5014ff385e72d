"""int16 activations × int8 weights (A16W8): the NPU's byte-plane arithmetic, ONNX Runtime's
float path, and the contract between the two.

The NPU (reference compiler ``TorqHLToTorqHW/Conv2DPattern.cpp``, kernel profile
``I:I16_t W:I8_t``): its ALU multiplies bytes, so an int16 activation ``x = 256·h + l`` enters as
two byte planes, the high byte ``h = x >> 8`` signed and the low byte ``l = x & 0xFF`` unsigned
(``alu_d_unsigned`` marks the LSB lanes). Each plane is convolved with the int8 weights into its
own partial sum, ``P_h = Σ h·w`` and ``P_l = Σ l·w``; the ACT stage adds them with its left
shifts ``act_lsh = {0, 8, 0, 8}`` and the bias in a 32-bit sum (``act_sum_bits = 32``, which
wraps), ``acc = (P_h << 8) + P_l + bias'``, then rescales exactly as for int8 (multiplier, shift,
NTP or NTE, zero point, clamp to the int16 or int8 output range). The padding value ``in_zp``
splits the same way. Mathematically ``acc = Σ x·w + bias'`` modulo 2**32: the byte planes are
how the hardware gets there, and what ``split_bytes`` / ``combine_partials`` simulate.

ONNX Runtime (1.32, CPU EP) has no integer kernel for int16 activations: the QDQ graph runs as
written, DequantizeLinear to float32, the float op (MLAS, FMA, its own summation order),
QuantizeLinear (true division, round half to even). Its output is the exact real value plus
float32 rounding error, which no integer machine reproduces bit for bit.

The contract a checker may rely on (``docs/a16w8.md``):

exact   int8 -> int16 conversion (a 256-entry table of ORT's own float32 recipe), and in the
        ``ort`` rounding mode the elementwise float recipes of int16 -> int8 conversion and
        int16 Add (``requant_float_ort``, ``numerics.add_float_ort``: op for op as ORT runs
        them); MaxPool and data movement (no arithmetic) in every mode.
bounded int16 Conv / depthwise / FC / MatMul / average pool (ORT accumulates in float32) and
        the ``native`` rounding of any int16 rescale. The NSS output is exactly its integer
        formula (checked separately). ORT's output is a rounding of a real number within
        ``float_error_lsb`` of the exact value ``v = acc·dq/ys``: the standard bound of a
        float32 sum of K terms in any order, with or without FMA, ``γ(K+5)·Σ|terms|`` plus the
        final division. An element is *explained* when both outputs lie in ``admissible`` of
        ``v`` with the summed error bounds; anything else is a bug (a 1-bit fault in the MSB/LSB
        path moves outputs by hundreds of LSB; the bound is a few hundredths of an LSB on
        typical layers).
overflow the 32-bit ACT sum wraps where ``|acc| >= 2**31`` (the reference notes TOSA's 48
        bits as a FIXME); the NSS then computes the wrapped value, ORT the saturated one: an
        explained difference of its own category, reported, never silent.
"""
from __future__ import annotations

import numpy as np

from .native import INT32_MAX, INT32_MIN

__all__ = ["INT16_MIN", "INT16_MAX", "ACT_LSH", "split_bytes", "combine_partials", "gamma",
           "float_error_lsb", "rescale_error_lsb", "admissible", "explain_bounded",
           "requant_float_ort", "acc_float_ort", "int16_involved", "requant_rescale"]

INT16_MIN, INT16_MAX = -(1 << 15), (1 << 15) - 1
ACT_LSH = 8             # the ACT's left shift of the MSB partial (act_lsh = {0, 8, 0, 8})
_U = 2.0 ** -24         # float32 unit roundoff
_F32 = np.float32
_F64 = np.float64


def int16_involved(*dtypes) -> bool:
    """True when any of the element types (numpy dtypes or MLIR names) is 16-bit integer: the op
    then runs in ORT's float path (no int16 integer kernels) and on the NPU's byte-plane path."""
    return any(str(d) in ("int16", "i16", "uint16", "ui16") for d in dtypes)


def split_bytes(x) -> tuple[np.ndarray, np.ndarray]:
    """An int16 tensor (or scalar) as its two byte planes: ``(h, l)`` with ``x = 256·h + l``,
    ``h = x >> 8`` in int8 (signed), ``l = x & 0xFF`` in uint8 (unsigned), C-contiguous."""
    a = np.asarray(x)
    if a.dtype != np.int16:
        if a.dtype.kind not in "iu":
            raise TypeError(f"split_bytes needs an integer tensor, got {a.dtype}")
        if a.size and (a.min() < INT16_MIN or a.max() > INT16_MAX):
            raise ValueError("split_bytes: value outside int16")
        a = a.astype(np.int16)
    b = np.ascontiguousarray(a.reshape(-1)).view(np.uint8)   # little-endian: low, high, low, ...
    if np.little_endian:
        low, high = b[0::2], b[1::2]
    else:
        high, low = b[0::2], b[1::2]
    return (np.ascontiguousarray(high).view(np.int8).reshape(a.shape),
            np.ascontiguousarray(low).reshape(a.shape))


def combine_partials(p_high, p_low, out=None):
    """The ACT's sum of the two partial sums, ``P_h·2**8 + P_l`` (act_lsh {0, 8}): exact for
    integer arrays (int64) and for integer-valued float arrays below 2**53 (float64), and for
    scalars / per-channel vectors; the caller adds the bias, the 32-bit wrap is the ACT's
    (``native.act_native``). ``out``: an array to compute in (it may be ``p_high`` itself), for
    a float dtype the caller knows holds every value exactly."""
    h, low = np.asarray(p_high), np.asarray(p_low)
    if out is not None:
        np.multiply(h, 1 << ACT_LSH, out=out)
        return np.add(out, low, out=out)
    if h.dtype.kind == "f" or low.dtype.kind == "f":
        return h.astype(np.float64) * float(1 << ACT_LSH) + low.astype(np.float64)
    return (h.astype(np.int64) << ACT_LSH) + low.astype(np.int64)


def gamma(n) -> np.ndarray:
    """The classic float error factor ``γ(n) = n·u / (1 - n·u)``, u = 2**-24 (float32)."""
    nu = np.asarray(n, _F64) * _U
    if np.any(nu >= 0.5):
        raise ValueError("gamma: too many terms for a float32 error bound")
    return nu / (1.0 - nu)


def float_error_lsb(abs_acc, terms, dq_scale, ys, v) -> np.ndarray:
    """Bound, in output LSB, on |ORT's real value − v| for an int16 op ORT runs in float32.

    ``abs_acc`` = Σ|x − zx|·|w| + |bias| per output (the magnitudes summed), ``terms`` = K (the
    products per output), ``dq_scale`` = fl32(xs·ws) (per output, broadcastable), ``ys`` the
    output scale, ``v`` = acc·dq/ys the exact value. Each term of ORT's sum is rounded up to
    three times before it is added (DequantizeLinear of x and of w, the product; the bias: int
    -> float and the multiplication) and the sum of K + 1 terms in any order adds γ(K); the
    real products use xs·ws where the NSS uses fl32(xs·ws) (one more u); QuantizeLinear's
    division is one more rounding of |v|. Hence γ(K + 5)·abs_acc·dq/ys + 2u·|v|, padded by 2**-40
    for the float64 evaluation of the bound itself."""
    base = np.asarray(abs_acc, _F64) * (np.asarray(dq_scale, _F64) / _F64(_F32(ys)))
    vv = np.abs(np.asarray(v, _F64))
    return gamma(np.asarray(terms) + 5) * base + 2 * _U * vv + 2.0 ** -40 * (vv + 1)


def rescale_error_lsb(acc, mult, shift, real_scale) -> np.ndarray:
    """|acc·mult/2**shift − acc·real_scale| in output LSB: how far the NPU's fixed-point
    multiplier puts its value from the exact one (float64; padded like float_error_lsb)."""
    a = np.abs(np.asarray(acc, _F64))
    d = np.abs(np.ldexp(np.asarray(mult, _F64), -np.asarray(shift, np.int64)) - np.asarray(real_scale, _F64))
    return a * d * (1 + 2.0 ** -40) + 2.0 ** -40


def admissible(v, err, zp, lo, hi) -> tuple[np.ndarray, np.ndarray]:
    """(qmin, qmax): the outputs any rounding (any tie rule) of any real t with |t − v| <= err
    gives after adding the zero point and clamping to [lo, hi]."""
    vv, e = np.asarray(v, _F64), np.asarray(err, _F64)
    q0 = np.ceil(vv - e - 0.5).astype(np.int64) + int(zp)
    q1 = np.floor(vv + e + 0.5).astype(np.int64) + int(zp)
    return np.clip(q0, int(lo), int(hi)), np.clip(q1, int(lo), int(hi))


def explain_bounded(native, ort, v, err, zp, lo, hi, acc=None) -> dict[str, int]:
    """Causes of the elements where ``native`` and ``ort`` differ, for an op whose ORT result is
    a float32 computation of ``v`` with error at most ``err`` (LSB; include the NPU's multiplier
    error too, ``rescale_error_lsb``): ``float`` when both outputs are admissible roundings
    (``admissible``), ``overflow`` where the exact accumulator ``acc`` (when given) leaves int32
    (the ACT's 32-bit sum wraps), ``other`` for anything else (a bug)."""
    n, o = np.asarray(native).astype(np.int64), np.asarray(ort).astype(np.int64)
    diff = n != o
    out = {"float": 0, "overflow": 0, "other": 0}
    if not diff.any():
        return out
    qmin, qmax = admissible(np.broadcast_to(v, diff.shape)[diff], np.broadcast_to(err, diff.shape)[diff],
                            zp, lo, hi)
    ok = (qmin <= n[diff]) & (n[diff] <= qmax) & (qmin <= o[diff]) & (o[diff] <= qmax)
    wrapped = np.zeros_like(ok)
    if acc is not None:
        a = np.broadcast_to(np.asarray(acc), diff.shape)[diff]
        wrapped = ~ok & ((a < INT32_MIN) | (a > INT32_MAX))
    out["float"] = int(ok.sum())
    out["overflow"] = int(wrapped.sum())
    out["other"] = int((~ok & ~wrapped).sum())
    return out


def requant_float_ort(x, xs, zx, ys, zy, lo, hi) -> np.ndarray:
    """QuantizeLinear(DequantizeLinear(x)) as ORT runs a conversion between integer types (int16
    -> int8, int8 -> int16), bit for bit: ``clamp(RNE(fl32(fl32((x − zx)·xs) / ys)) + zy)``."""
    from .ort import dequantize_ort, quantize_ort      # ort imports native only: no cycle
    return quantize_ort(dequantize_ort(np.asarray(x).astype(np.int64), xs, zx), ys, zy, lo, hi)


def acc_float_ort(acc, dq_scale, ys, zp, lo, hi, axis: int = 1) -> np.ndarray:
    """The ``ort`` rounding mode of an int16 accumulation (Conv / FC / pool): ORT's float path
    with its summation error replaced by one rounding of the exact value,
    ``QuantizeLinear(fl32(acc·dq))``. Equal to ORT except within ``float_error_lsb`` of a
    rounding boundary (the bounded part of the contract)."""
    from .loops import bcast
    from .ort import quantize_ort
    a = np.asarray(acc).astype(_F64)
    y = (a * bcast(np.asarray(dq_scale, _F32).astype(_F64), a.ndim, axis, _F64)).astype(_F32)
    return quantize_ort(y, ys, zp, lo, hi)


def requant_rescale(xs, zx, ys, zy, lo, hi) -> tuple[int, int, bool]:
    """(multiplier, shift, ties_even) of the ACT rescale converting an int16 tensor to another
    quantization (int16 -> int8 at a mixed-precision boundary, or a requantization).

    The conversion depends on x alone, so its result is checked here on all 65,536 inputs:
    of ``multiplier_and_shift(xs/ys)`` and its neighbours ±1, in NTP and NTE, the one that
    agrees with ORT's float recipe (``requant_float_ort``) on the most inputs; exact on all of
    them where the scales allow it (e.g. xs/ys a dyadic such as 2**-8)."""
    from .native import act_native, multiplier_and_shift
    m0, shift = multiplier_and_shift(float(_F32(xs)) / float(_F32(ys)))
    x = np.arange(INT16_MIN, INT16_MAX + 1, dtype=np.int64)
    want = requant_float_ort(x, xs, zx, ys, zy, lo, hi)
    best = None
    for m in (m0, m0 - 1, m0 + 1):
        if not 0 <= m <= INT32_MAX:
            continue
        for even in (False, True):
            got = act_native(x - int(zx), m, shift, zy, lo, hi, ties_even=even)
            bad = int(np.count_nonzero(got != want))
            if best is None or bad < best[0]:
                best = (bad, m, even)
    return int(best[1]), int(shift), bool(best[2])
