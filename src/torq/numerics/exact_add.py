"""Add ratios on which ONNX Runtime's float32 QLinearAdd is exact (``add_exact_ratios``).

ORT computes QLinearAdd (``ort.add_ort``) as ``RNE(fma(a, rA, fma(b, rB, zC - (rA·zA + rB·zB))))``
with ``rA = fl32(sA/sC)``, ``rB = fl32(sB/sC)``. For ordinary ratios each step rounds, and on a
few outputs in 10**4 the float result lands on the other side of .5 than the exact value: there
the NPU's integer Add (multipliers ``r·2**shift``) and ORT differ by 1 LSB (deep-sort
MobileNetV2: 3 of 18816, 9 LSB at the logits). If both ratios are multiples of ``2**-g`` and
every partial sum stays below ``2**(24-g)``, each float32 step is exact, ORT rounds the exact
value half to even, and the ACT's NTE mode with the multipliers ``r·2**shift`` (exact) computes
the same integers. ``quantize.exact_scales`` moves activation scales so that Adds get there.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = ["add_ratios_ort", "add_exact_ratios", "add_grid_bits", "ADD_OPERAND_BOUND"]

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
