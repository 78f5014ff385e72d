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


def compare(ours: dict, ref: dict, fp_max_tol: float, lsb: dict | None = None) -> tuple[bool, dict]:
    """(passed, {"max_rel_diff", "max_abs_diff"}) over every output of ``ref``.

    Integer outputs pass when every element is within ``INT_TOL``; float outputs when every
    ``|a-b| / (|a|+|b|+1e-6) <= fp_max_tol`` -- except dequantized outputs (``lsb``: name ->
    DQ scale), which are int8 values in disguise and get the integer rule in units of their
    scale (a relative test would call a 1-LSB rounding tie near zero a 100% error).
    A missing output or a shape mismatch fails."""
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
            ok &= bool((absd <= INT_TOL).all())
        elif name in lsb:
            ok &= bool((np.rint(absd / lsb[name]) <= INT_TOL).all())
        else:
            ok &= bool((rel <= fp_max_tol).all()) and bool((np.isnan(r64) == np.isnan(o64)).all())
    return ok, {"max_rel_diff": round(max_rel, 6), "max_abs_diff": round(max_abs, 6)}
