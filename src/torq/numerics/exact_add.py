"""Add ratios on which ONNX Runtime's float32 QLinearAdd is exact (``add_exact_ratios``).

ORT computes QLinearAdd (``ort.add_ort``) as ``RNE(fma(a, rA, fma(b, rB, zC - (rA·zA + rB·zB))))``
with ``rA = fl32(sA/sC)``, ``rB = fl32(sB/sC)``. For ordinary ratios each step rounds, and on a
few outputs in 10**4 the float result lands on the other side of .5 than the exact value: there
the NPU's integer Add (multipliers ``r·2**shift``) and ORT differ by 1 LSB (deep-sort
MobileNetV2: 3 of 18816, 9 LSB at the logits). If both ratios are multiples of ``2**-g`` and
every partial sum stays below ``2**(24-g)``, each float32 step is exact, ORT rounds the exact
value half to even, and the ACT's NTE mode with the multipliers ``r·2**shift`` (exact) computes
the same integers. ``quantize.exact_scales`` moves activation scales so that Adds get there.

QLinearMul likewise (``mul_scale_exact``): ``RNE(fl32(fl32(p)·S) + zC)`` with ``S = fl32(fl32(sA·sB)/sC)``
is exact wherever the output is in range when ``S`` is a multiple of ``2**-16``.

Windowed average pools likewise (``avgpool_exact_scale``): ORT dequantizes each value to float,
sums, divides by the count and by ``ys``; with ``ys = xs`` (ORT's quantizer shares them) a
power-of-two count and ``xs`` of few enough significant bits, every step is exact and the ACT's
NTE (which the compiler already picks for ``xs / (ys·count) = 1/count``) gives ORT's integers.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = ["add_ratios_ort", "add_exact_ratios", "add_grid_bits", "ADD_OPERAND_BOUND", "avgpool_exact_scale",
           "mul_scale_exact", "MUL_GRID_BITS", "float_add_exact"]

ADD_OPERAND_BOUND = 255      # |a|, |b|, |zA|, |zB|, |zC| of int8 / uint8 operands
_F32 = np.float32
_FLOAT32_INT = 1 << 24       # integers (and multiples of 2**-g up to 2**(24-g)) exact in float32


def add_ratios_ort(sa, sb, sc) -> tuple[np.float32, np.float32]:
    """ORT's QLinearAdd ratios ``(fl32(sA/sC), fl32(sB/sC))`` of float32 scales."""
    return _F32(_F32(sa) / _F32(sc)), _F32(_F32(sb) / _F32(sc))


def _partial_bound(ra: float, rb: float) -> float:
    """The largest |partial sum| of ORT's QLinearAdd over int8/uint8 operands and zero points."""
    return ADD_OPERAND_BOUND * (1 + 2 * (ra + rb))


def add_grid_bits(ra: float, rb: float) -> int:
    """The finest grid ``2**-g`` on which ratios ``ra``, ``rb`` keep every partial sum exact."""
    return math.floor(math.log2(_FLOAT32_INT / _partial_bound(ra, rb)))


def add_exact_ratios(sa, sb, sc) -> bool:
    """ORT's float32 QLinearAdd with these scales computes the exact value of every output
    (module docstring): both ratios positive multiples of ``2**-g`` with ``g <= add_grid_bits``."""
    ra, rb = (float(r) for r in add_ratios_ort(sa, sb, sc))
    if not (ra > 0 and rb > 0 and math.isfinite(ra) and math.isfinite(rb)):
        return False
    g = max(Fraction(r).denominator.bit_length() - 1 for r in (ra, rb))
    return _partial_bound(ra, rb) * 2.0 ** g <= _FLOAT32_INT


def float_add_exact(sa, sb, sc, bits_a: int = 16, bits_b: int = 16) -> bool:
    """ORT's *float* Add of two dequantized tensors (the int16 path: DQ → Add → Q) is exact when
    the input scales are ``m·2**k`` with m ∈ {1, 3}, the output scale is a power of two, and the
    sum of the operands (``|x - zp| < 2**bits``) spans at most 24 bits from the finer scale's
    last bit: the quotient by ``sC`` is then exact too, and ORT rounds the exact value half to
    even (``quantize.exact_int16`` makes such scales)."""
    fa, fb, fc = (Fraction(float(_F32(s))) for s in (sa, sb, sc))
    odd = [f.numerator // (f.numerator & -f.numerator) if f > 0 else 0 for f in (fa, fb, fc)]
    if odd[2] != 1 or odd[0] not in (1, 3) or odd[1] not in (1, 3):
        return False
    lsb = [math.log2(f / o) for f, o in zip((fa, fb), odd)]
    top = [k + bits + o.bit_length() - 1 for k, bits, o in zip(lsb, (bits_a, bits_b), odd)]
    return max(top) + 1 - min(lsb) <= 24


def avgpool_exact_scale(xs, count: int) -> np.float32 | None:
    """The float32 nearest ``xs`` on which ORT's windowed average pool (``ort.avgpool_ort``, with
    ``ys = xs`` and ``count`` cells per window) is exact: ``xs·(x - zx)`` (|x - zx| <= 255) and the sum of
    ``count`` of them fit 24 bits, so ``xs`` keeps ``16 - log2(count)`` significant bits;
    dividing by the power-of-two count and by ``ys = xs`` is then exact too. None for a count
    that is not a power of two (``1/count`` is no dyadic)."""
    count = int(count)
    if count < 1 or count & (count - 1) or not (float(xs) > 0 and math.isfinite(float(xs))):
        return None
    bits = 24 - 8 - (count.bit_length() - 1)
    mant, exp = math.frexp(float(_F32(xs)))
    return _F32(math.ldexp(round(math.ldexp(mant, bits)), exp - bits))


MUL_GRID_BITS = 16      # |p·S| < 256 wherever a Mul's output is in range: 24 bits on a 2**-16 grid


def mul_scale_exact(sa, sb, sc) -> bool:
    """ORT's QLinearMul (``ort.mul_ort``) computes the exact ``RNE(p·S + zC)`` wherever the output
    is in range: ``S = fl32(fl32(sA·sB)/sC)`` a positive multiple of ``2**-16``. An in-range output
    has ``|p·S| < 256`` (int8 and uint8 alike), which then has at most 24 significant bits, and so
    has the sum with ``zC``; larger products round monotonically and saturate either way."""
    s = float(_F32(_F32(_F32(sa) * _F32(sb)) / _F32(sc)))
    t = math.ldexp(s, MUL_GRID_BITS)
    return s > 0 and math.isfinite(t) and t == math.floor(t)
