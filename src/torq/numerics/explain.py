"""Why a native (NPU) result differs from ONNX Runtime's: exact rational arithmetic.

Each differing element is classified from its integer accumulator and the exact real rescale
(float32 scales taken as the rationals they represent): ``tie`` (the real value is exactly
x.5: NTP rounds up where ORT rounds to even), ``near-tie`` (within 1e-3 of .5: multiplier
quantisation / float32 rounding can land either side) or ``other`` (a bug).
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterable

import numpy as np

__all__ = ["NEAR_TIE", "exact_ratio", "classify_real", "classify_rescale_diff", "explain_diffs",
           "explain_add_diffs"]

_F32 = np.float32

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

