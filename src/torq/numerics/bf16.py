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
"""
from __future__ import annotations

import numpy as np

__all__ = ["to_bf16", "bf16_affine", "float_to_int", "bf16_fallback_constants"]

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

