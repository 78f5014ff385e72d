"""Is a layer's difference from ONNX Runtime the bf16 Quantize/Dequantize at its float edges?

Without ``--full-integer`` a layer has float inputs and outputs: the NPU quantizes them with its
bf16 fallback (``numerics.quantize_fallback``) and dequantizes its result the same way, where ONNX
Runtime uses float32. That alone moves the float output by up to a few LSB (the bounds are derived
in ``numerics/bf16.py``), so the ±1 LSB rule would call the NPU's real, fully explained arithmetic
a ``difference``. The judgement here splits the layer at its edges:

  1. the int8 inputs the NPU computes: its Quantize fallback of the float inputs, checked to be
     within ``quantize_fallback_bound`` of ORT's QuantizeLinear;
  2. the integer core (``convert_to_full_integer`` of the layer) run by ONNX Runtime on those
     int8 inputs, the reference of the NPU's integer work;
  3. each float output must be within ``dequantize_fallback_bound`` (plus the ±1 LSB) of ORT's
     DequantizeLinear of that reference, and exactly the NPU's Dequantize fallback of an int8
     value within ±1 LSB of it.

So a difference is explained when every element is bf16 edge rounding plus the ±1 LSB the
integer core is allowed; a wrong core (2 LSB), a wrong edge constant, or anything else is not.
"""
from __future__ import annotations

import numpy as np

from .. import numerics
from .compare import INT_TOL


def _scalar(v):
    a = np.asarray(v)
    return None if a.size != 1 else a.reshape(-1)[0].item()


def _int_range(dtype: str) -> tuple[int, int]:
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def explain(model, inputs: dict, ours: dict, int_tol: int = INT_TOL) -> dict | None:
    """``{"max_lsb": ..., "explained": text}`` when every difference of ``ours`` (the NPU's outputs
    of the quantized layer ``model`` on ``inputs``) is bf16 edge rounding plus ±1 LSB of the core;
    None when the layer has no float edge or some element is beyond that. ``int_tol``: what the
    core may differ by (±1 LSB; a bf16 island's tolerance when the layer has one)."""
    from .. import reference
    from ..graph.io_quant import io_quant_params
    from ..quantize.full_integer import convert_to_full_integer
    try:
        core = convert_to_full_integer(model)
    except Exception:  # noqa: BLE001 - not a Q/DQ-edged model: nothing to explain
        return None
    io = io_quant_params(core)
    params = {**io["inputs"], **io["outputs"]}
    if not params or any(_scalar(p["scale"]) is None or _scalar(p["zero_point"]) is None for p in params.values()):
        return None
    core_inputs, in_lsb = {}, 0
    for name, x in inputs.items():
        p = io["inputs"].get(name)
        if p is None:
            core_inputs[name] = x
            continue
        s, zp, rng = _scalar(p["scale"]), _scalar(p["zero_point"]), _int_range(p["dtype"])
        q = numerics.quantize_fallback(x, s, zp, *rng)
        dq = np.abs(q - numerics.quantize_ort(x, s, zp, *rng))
        if (dq > numerics.quantize_fallback_bound(x, s, zp)).any():
            return None                   # not the bf16 fallback's arithmetic
        in_lsb = max(in_lsb, int(dq.max(initial=0)))
        core_inputs[name] = q.astype(p["dtype"])
    try:
        ref = reference.run(core, core_inputs)
    except Exception:  # noqa: BLE001 - the core alone does not run: not explainable this way
        return None
    worst = 0
    for name, r in ref.items():
        if name not in ours:
            return None
        p = io["outputs"].get(name)
        lsb = _output_lsb(ours[name], r, p, int_tol)
        if lsb is None or lsb > int_tol:
            return None
        worst = max(worst, lsb)
    return {"core_lsb": worst, "input_lsb": in_lsb,
            "explained": f"bf16 Quantize/Dequantize fallback at the float graph edges: the NPU's int8 inputs are "
                         f"within {in_lsb} LSB of ONNX Runtime's (its bound), and every output is the NPU's bf16 "
                         f"Dequantize of an int8 value within ±{worst} LSB of ONNX Runtime's integer core fed them"}


def _output_lsb(ours, ref_q, p, tol: int = INT_TOL) -> int | None:
    """Integer output: largest |Δ|. Float output: the smallest k such that every element equals the
    Dequantize fallback of some q with |q - ref_q| <= k (k <= tol), else None."""
    if p is None:
        if not np.issubdtype(np.asarray(ours).dtype, np.integer):
            return None
        return int(np.abs(np.asarray(ours, np.int64) - np.asarray(ref_q, np.int64)).max(initial=0))
    s, zp = _scalar(p["scale"]), _scalar(p["zero_point"])
    lo, hi = _int_range(p["dtype"])
    o = np.asarray(ours, np.float32)
    q = np.asarray(ref_q, np.int64)
    if o.shape != q.shape:
        return None
    allowed = tol * abs(s) + numerics.dequantize_fallback_bound(np.abs(q - zp) + tol, s)
    if (np.abs(o.astype(np.float64) - numerics.dequantize_ort(q, s, zp)) > allowed).any():
        return None                       # beyond what the bf16 Dequantize can move a ±1 LSB value
    matched = np.zeros(o.shape, bool)
    for k in range(tol + 1):
        for cand in (q - k, q + k):
            matched |= numerics.dequantize_fallback(np.clip(cand, lo, hi), s, zp) == o
        if matched.all():
            return k
    return None
