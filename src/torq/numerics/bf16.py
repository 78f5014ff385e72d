"""The NPU's bf16 fallback for a standalone QuantizeLinear / DequantizeLinear, step by step.

The compiler emits the fallback as NPU ops (``compiler/patterns/quant_fallback.py``) and the
simulator executes each with the functions below, so this is the one model of it:

    Quantize:    act f2f (f32 -> bf16, RNE), mul ``bf16_affine(x, bf16(1/s), bf16(zp))``,
                 act f2i (``float_to_int``), fma clamp to [qmin, qmax]
    Dequantize:  fma ``q - zp`` (integer), act i2f (exact: |q - zp| <= 255 fits bf16's 8 bits),
                 mul ``bf16_affine(q - zp, bf16(s), 0)``, act f2f (bf16 -> f32, exact)

``bf16_affine`` rounds twice (after the product and after the add), as two separate bf16
operations; the constants come from ``bf16_fallback_constants``. (Dequantize subtracts the zero
point before the product: a bias -zp*s after it cancels catastrophically near q = zp.)

How far that is from ONNX Runtime (float32 Q/DQ) -- the bound the arithmetic implies, with
``u = 2^-8`` the unit roundoff of bf16 (8-bit significand, round to nearest: |bf16(v) - v| <= u|v|):

    Dequantize, d = q - zp (exact: |d| <= 256 fits bf16's significand):
      NPU  y = bf16(d * bf16(s)) = d·s·(1+e1)(1+e2),   ORT  y = fl32(d·s) = d·s·(1+e3),
      |e1|,|e2| <= u, |e3| <= 2^-24   =>   |y_npu - y_ort| <= |d|·|s|·(2u + u^2 + 2^-23)
      (the 2^-23 also covers ORT's rounding of a neighbouring q; |d| > 256 adds one more u)
      -- up to ~2 LSB at |d| = 255: bf16 has 8 bits, an int8 value needs all 8.

    Quantize, t = x/s + zp:
      NPU  p = bf16(bf16(x) * bf16(fl32(1/s))) = (x/s)(1+e)^3(1+2^-24),  a = bf16(fl32(p + zp)),
           q = clamp(rne(a));   ORT  q = clamp(rne(fl32(x/s)) + zp)
      |a - t| <= |x/s|·E3 + |p + zp|·E2,  E3 = (1+u)^3(1+2^-24) - 1,  E2 = (1+u)(1+2^-24) - 1,
      two roundings to integers add 1, clamping only shrinks differences:
      |q_npu - q_ort| <= floor(1 + |x/s|·(E3 + 2^-24) + (|t| + |x/s|·E3)·E2)
      -- up to 4 LSB for |x/s| ~ 255 (a Relu output with zp -128), 3 for symmetric int8.

``quantize_fallback`` / ``dequantize_fallback`` compose the steps (the same functions the
simulator runs, op by op); ``*_bound`` are the bounds above, held against ORT in the tests and
used by discover to tell an explained bf16 difference from a wrong result.
"""
from __future__ import annotations

import numpy as np

__all__ = ["to_bf16", "bf16_affine", "float_to_int", "bf16_fallback_constants", "BF16_UNIT_ROUNDOFF", "BF16_ISLAND_TOL",
           "BF16_ISLAND_REL", "island_beyond",
           "quantize_fallback", "dequantize_fallback", "quantize_fallback_bound", "dequantize_fallback_bound"]

BF16_UNIT_ROUNDOFF = 2.0 ** -8

#: A bf16 island's int8 result (an op with no integer form, e.g. Softmax, run in bf16 between the
#: fallbacks above) against ONNX Runtime's float32 one, from the same int8 inputs, in LSB, per
#: rounding mode. ``ort`` (the fallbacks compute ORT's float32 Q/DQ): only the island's float32
#: evaluation differs from ORT's kernel (exp table, summation order), a rounding step: 1 LSB.
#: ``native``: the Dequantize product rounds to bf16 (2^-8 relative, see below) and the Quantize
#: goes through bf16 (up to 3-4 LSB in the worst case of its bound, far below it in practice):
#: measured max 2 LSB over Softmax heads of 2-1000 classes, a channel LayerNorm and PP-OCR cls
#: (``benchmarks/island_lsb.py``, docs/bf16.md). But bf16 carries a logit with an error that
#: grows with its magnitude (the reference dequantizes into bf16 too, and runs Softmax wholly in
#: bf16: QuantizePattern.cpp, SoftmaxPattern.cpp), so beyond 2 LSB an element still passes by
#: the reference tool's float rule, |a-b| <= fp_max_tol (0.01) * (|a|+|b|) on the dequantized
#: values: ``island_beyond``.
BF16_ISLAND_TOL = {"ort": 1, "native": 2}
BF16_ISLAND_REL = 0.01


def island_beyond(ours, ref, zp: int, mode: str) -> np.ndarray:
    """Which elements of a bf16 island's int8 result ``ours`` are beyond its tolerance against
    ORT's ``ref`` (both int, zero point ``zp``): ``BF16_ISLAND_TOL[mode]`` LSB, and in native
    mode also the reference's relative rule (scale-free on int8: |Δ| <= 0.01 (|a-zp|+|b-zp|))."""
    a, b = np.asarray(ours, np.int64), np.asarray(ref, np.int64)
    d = np.abs(a - b)
    beyond = d > BF16_ISLAND_TOL[mode]
    if mode == "native":
        beyond &= d > BF16_ISLAND_REL * (np.abs(a - zp) + np.abs(b - zp))
    return beyond

_F32 = np.float32


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



def bf16_affine(x, factor, bias) -> np.ndarray:
    """The NPU's bf16 ``mul`` of the Q/DQ fallback: ``bf16(bf16(x * factor) + bias)``."""
    with np.errstate(over="ignore", invalid="ignore"):
        return to_bf16(to_bf16(np.asarray(x, _F32) * _F32(factor)) + _F32(bias))


def float_to_int(x) -> np.ndarray:
    """``act f2i``: float (bf16 or f32) to integer, round half to even, saturating to int32
    (+-inf and out-of-range values clamp; NaN gives 0 -- the hardware's NaN rule is not
    documented). Without saturation +inf would become INT64_MIN and clamp to qmin."""
    with np.errstate(invalid="ignore"):
        r = np.rint(np.asarray(x, dtype=np.float64))
    r = np.clip(np.nan_to_num(r, nan=0.0, posinf=2.0 ** 31 - 1, neginf=-2.0 ** 31), -2.0 ** 31, 2.0 ** 31 - 1)
    return r.astype(np.int64)


def bf16_fallback_constants(scale, zp, quantize: bool) -> tuple[float, float]:
    """(factor, bias) of the fallback ``mul``, both bf16-representable:
    Quantize: x · bf16(1/scale) + bf16(zp);  Dequantize: (q - zp) · bf16(scale) + 0."""
    if quantize:
        return float(to_bf16(_F32(1.0 / float(scale)))), float(to_bf16(_F32(zp)))
    return float(to_bf16(_F32(scale))), 0.0



def quantize_fallback(x, scale, zp, qmin: int, qmax: int) -> np.ndarray:
    """The NPU's whole standalone QuantizeLinear: act f2f, mul, act f2i, fma clamp (int64)."""
    factor, bias = bf16_fallback_constants(scale, zp, True)
    return np.clip(float_to_int(bf16_affine(to_bf16(x), factor, bias)), int(qmin), int(qmax))


def dequantize_fallback(q, scale, zp) -> np.ndarray:
    """The NPU's whole standalone DequantizeLinear: fma q - zp, act i2f, mul, act f2f (float32)."""
    factor, _ = bf16_fallback_constants(scale, zp, False)
    d = np.asarray(q, np.int64) - int(zp)
    return bf16_affine(d.astype(_F32), factor, 0.0)


def dequantize_fallback_bound(d_abs, scale) -> np.ndarray:
    """Largest |dequantize_fallback(q) - DequantizeLinear(q)| for |q - zp| = ``d_abs`` (float64)."""
    u = BF16_UNIT_ROUNDOFF
    d = np.abs(np.asarray(d_abs, np.float64))
    rel = 2 * u + u * u + 2.0 ** -23 + np.where(d > 256, u, 0.0)
    return d * abs(float(scale)) * rel


def quantize_fallback_bound(x, scale, zp) -> np.ndarray:
    """Largest |quantize_fallback(x) - QuantizeLinear(x)| in LSB (int64, per element of ``x``)."""
    u, f32 = BF16_UNIT_ROUNDOFF, 2.0 ** -24
    e3, e2 = (1 + u) ** 3 * (1 + f32) - 1, (1 + u) * (1 + f32) - 1
    v = np.abs(np.asarray(x, np.float64) / abs(float(scale)))
    t = np.abs(np.asarray(x, np.float64) / float(scale) + int(zp))
    with np.errstate(over="ignore", invalid="ignore"):
        b = np.floor(1 + v * (e3 + f32) + (t + v * e3) * e2)
    return np.minimum(np.nan_to_num(b, nan=0.0, posinf=2.0 ** 62), 2.0 ** 62).astype(np.int64)
