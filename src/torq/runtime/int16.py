"""The rescale and the per-op check of accumulating torq_hl ops with int16 activations (A16W8).

``native``: the NPU's ACT on the byte-plane accumulator (32-bit sum, wraps), int16 or int8 out.
``ort``: ONNX Runtime's float path with its summation error replaced by one rounding of the
exact value (``numerics.acc_float_ort``): ORT itself is matched only within the bound of
``numerics.float_error_lsb``, which the check applies to every differing element (the
contract in ``torq.numerics.int16``).
"""
from __future__ import annotations

import numpy as np

from .. import numerics
from ..numerics import int16 as n16


def rescale(acc: np.ndarray, attrs: dict, scale_bias: np.ndarray, rounding: str, rtype) -> np.ndarray:
    """acc (exact int64, bias included) -> output, per channel along axis 1."""
    if rounding == "native":
        y = numerics.act_native(acc, scale_bias[1::2], attrs["shift_factor"], attrs["output_zp"],
                                attrs["output_min"], attrs["output_max"], axis=1,
                                ties_even=bool(attrs.get("round_ties_even", 0)))
    else:
        y = n16.acc_float_ort(acc, attrs["ort_dq_scale"], float(attrs["ort_output_scale"][0]),
                              attrs["output_zp"], attrs["output_min"], attrs["output_max"])
    return np.asarray(y).astype(rtype)


def causes(acc: np.ndarray, abs_acc: np.ndarray, terms: int, attrs: dict, scale_bias: np.ndarray,
           native: np.ndarray, ort: np.ndarray) -> dict:
    """Why native and ort differ, element by element (``numerics.explain_bounded``): the exact
    value v = acc·dq/ys, ORT's float32 error bound plus the NPU multiplier's error."""
    shape = [1] * acc.ndim
    shape[1] = -1
    ys = float(np.float32(attrs["ort_output_scale"][0]))
    dq = np.asarray(attrs["ort_dq_scale"], np.float64).reshape(shape)
    real = dq / ys
    v = acc.astype(np.float64) * real
    err = n16.float_error_lsb(abs_acc, terms, dq, ys, v)
    err = err + n16.rescale_error_lsb(acc, scale_bias[1::2].reshape(shape), attrs["shift_factor"], real)
    return n16.explain_bounded(native, ort, v, err, attrs["output_zp"], attrs["output_min"],
                               attrs["output_max"], acc=acc)


def rescale_parts(st, rtype):
    """torq_hl.rescale as (fn, reference, causes) for ``ops._checked``: native = the ACT on
    x − zx; ort = ORT's DQ → Q float recipe (exact)."""
    a = st.attrs
    xs, ys = float(a["ort_input_scale"][0]), float(a["ort_output_scale"][0])
    zx, zy, lo, hi = a["input_zp"], a["output_zp"], a["output_min"], a["output_max"]

    def fn(args, rounding):
        x = args[0].astype(np.int64)
        if rounding == "native":
            y = numerics.act_native(x - zx, a["multiplier"], a["shift_factor"], zy, lo, hi,
                                    ties_even=bool(a["round_ties_even"]))
        else:
            y = n16.requant_float_ort(x, xs, zx, ys, zy, lo, hi)
        return np.asarray(y).astype(rtype)

    def causes(args, mask, native, ort):
        acc = args[0].astype(np.int64) - zx
        real = float(np.float32(xs)) / float(np.float32(ys))
        v = acc * real
        err = n16.float_error_lsb(0, 0, 1.0, 1.0, v) + n16.rescale_error_lsb(acc, a["multiplier"], a["shift_factor"], real)
        return n16.explain_bounded(native, ort, v, err, zy, lo, hi)
    return fn, fn, causes


def avgpool_ort(sums, counts, xs, ys, zy, lo, hi) -> np.ndarray:
    """The ``ort`` mode of an int16 average pool: ORT's float pool with its summation error
    replaced by one rounding of the exact mean (bounded part of the contract)."""
    mean = (sums.astype(np.float64) * float(np.float32(xs)) / counts).astype(np.float32)
    return numerics.quantize_ort(mean, ys, zy, lo, hi)


def avgpool_causes(sums, abs_sums, counts, xs, ys, zy, lo, hi, native, ort) -> dict:
    """Why an int16 average pool's native and ort outputs differ: v = Σ(x − zx)·xs/(count·ys),
    ORT's float error over ``count`` terms, the NPU multiplier's error (per window size)."""
    dq = float(np.float32(xs)) / np.asarray(counts, np.float64)
    v = sums.astype(np.float64) * dq / float(np.float32(ys))
    err = n16.float_error_lsb(abs_sums, np.asarray(counts), dq, ys, v)
    err = err + np.abs(v) * 2.0 ** -24 + 2.0 ** -30      # the NPU's multiplier: ~31 significant bits
    return n16.explain_bounded(native, ort, v, err, zy, lo, hi)


def add_causes(x, y, sa, za, sb, zb, sc, zc, lo, hi, mults, shift, native, ort) -> dict:
    """Why an int16 Add's native and ort outputs differ: v = ((a − za)·sa + (b − zb)·sb)/sc,
    ORT's elementwise float32 error (two DequantizeLinear, the add, the division) plus the
    NPU multipliers' error."""
    a, b = (np.broadcast_to(np.asarray(t).astype(np.int64), native.shape) for t in (x, y))
    fa, fb, fc = (float(np.float32(s)) for s in (sa, sb, sc))
    ra, rb = fa / fc, fb / fc
    v = (a - za) * ra + (b - zb) * rb
    mag = np.abs(a - za) * ra + np.abs(b - zb) * rb
    err = n16.float_error_lsb(mag, 0, 1.0, 1.0, v) + n16.rescale_error_lsb(a - za, mults[0], shift, ra) \
        + n16.rescale_error_lsb(b - zb, mults[1], shift, rb)
    return n16.explain_bounded(native, ort, v, err, zc, lo, hi)
