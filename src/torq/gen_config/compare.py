"""Layer comparison rules of the reference tool: integers within ±1 LSB, floats by relative error."""
from __future__ import annotations

import numpy as np

INT_TOL = 1
EPSILON = 1e-6


def dq_output_scales(model) -> dict[str, float]:
    """Float outputs produced by a DequantizeLinear with a per-tensor constant scale -> that scale."""
    from onnx import numpy_helper
    inits = {t.name: t for t in model.graph.initializer}
    outs = {o.name for o in model.graph.output}
    scales = {}
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.output[0] in outs and n.input[1] in inits:
            s = np.asarray(numpy_helper.to_array(inits[n.input[1]]))
            if s.size == 1:
                scales[n.output[0]] = float(s)
    return scales


#: bf16 layers and models: an element fails only when it is also off by more than this fraction of
#: the reference tensor's largest magnitude (the reference tool's ``use_abs_tol_gate`` /
#: ``fp_abs_tol_frac``, python/torq/lab/compare.py: "ignoring near-zero cancellation outputs,
#: where small (bf16 ULP-sized) absolute error produces a large relative difference"). 0.01 is
#: ours: a few bf16 ulps (2^-8 relative) of the tensor's range.
BF16_ABS_TOL_FRAC = 0.01
#: a whole bf16 model against the fp32 model: weights rounded to bf16 and every layer's rounding
#: add up (measured on the torchvision zoo: 0.3-1.3 % of max|fp32|), so the gate is wider.
BF16_RUN_TOL_FRAC = 0.05


def compare(ours: dict, ref: dict, fp_max_tol: float, lsb: dict | None = None,
            abs_tol_frac: float | None = None, int_tol: int = INT_TOL, island: bool = False) -> tuple[bool, dict]:
    """(passed, {"max_rel_diff", "max_abs_diff"}) over every output of ``ref``.

    Integer outputs pass when every element is within ``int_tol`` (``INT_TOL``; a layer with a
    bf16 island: ``numerics.BF16_ISLAND_TOL``, and with ``island`` a dequantized element beyond
    it still passes by the relative rule, as ``numerics.island_beyond``); float outputs when every
    ``|a-b| / (|a|+|b|+1e-6) <= fp_max_tol`` -- except dequantized outputs (``lsb``: name ->
    DQ scale), which are int8 values in disguise and get the integer rule in units of their
    scale (a relative test would call a 1-LSB rounding tie near zero a 100% error). With
    ``abs_tol_frac`` (bf16) a float element fails only if it is also off by more than
    ``abs_tol_frac * max|ref|``. A missing output or a shape mismatch fails."""
    lsb = lsb or {}
    ok, max_rel, max_abs = True, 0.0, 0.0
    for name, r in ref.items():
        o = ours.get(name)
        if o is None or np.shape(o) != np.shape(r):
            return False, {"max_rel_diff": float("inf"), "max_abs_diff": float("inf")}
        r64, o64 = np.asarray(r, np.float64), np.asarray(o, np.float64)
        absd = np.abs(r64 - o64)
        rel = absd / (np.abs(r64) + np.abs(o64) + EPSILON)
        max_abs = max(max_abs, float(absd.max(initial=0)))
        max_rel = max(max_rel, float(rel.max(initial=0)))
        if np.issubdtype(np.asarray(r).dtype, np.integer) or np.asarray(r).dtype == bool:
            ok &= bool((absd <= int_tol).all())
        elif name in lsb:
            ok &= bool(((np.rint(absd / lsb[name]) <= int_tol) | (island & (rel <= fp_max_tol))).all())
        else:
            wrong = rel > fp_max_tol
            if abs_tol_frac is not None:
                wrong &= absd > abs_tol_frac * float(np.nanmax(np.abs(r64), initial=0))
            ok &= not bool(wrong.any()) and bool((np.isnan(r64) == np.isnan(o64)).all())
    return ok, {"max_rel_diff": round(max_rel, 6), "max_abs_diff": round(max_abs, 6)}


def float_metrics(ours: dict, ref: dict, tol_frac: float, fp_max_tol: float = 0.01) -> dict:
    """A bf16 model's outputs against the fp32 model's: per output the largest relative and
    absolute differences, how many elements fail the gated rule of ``compare``, and top-1
    agreement of [N, C] score outputs."""
    per, top1, passed = {}, [], True
    for name, r in ref.items():
        r64, o64 = np.asarray(r, np.float64), np.asarray(ours[name], np.float64)
        absd = np.abs(r64 - o64)
        rel = absd / (np.abs(r64) + np.abs(o64) + EPSILON)
        big = float(np.abs(r64).max(initial=0))
        wrong = int(((rel > fp_max_tol) & (absd > tol_frac * big)).sum())
        per[name] = {"max_rel_diff": float(rel.max(initial=0)), "max_abs_diff": float(absd.max(initial=0)),
                     "abs_frac": float(absd.max(initial=0) / big) if big else 0.0, "wrong": wrong, "size": int(r64.size)}
        passed &= wrong == 0
        if r64.ndim == 2 and r64.shape[1] > 1:
            top1.append(float((o64.argmax(1) == r64.argmax(1)).mean()))
    out = {"outputs": per, "fp_max_tol": fp_max_tol, "tolerance_frac": tol_frac, "passed": passed,
           "max_rel_diff": max((o["max_rel_diff"] for o in per.values()), default=0.0)}
    if top1:
        out["top1_agreement"] = min(top1)
    return out
