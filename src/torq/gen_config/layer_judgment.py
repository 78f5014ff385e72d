"""``run``'s verdict on a model with int16 activations: layer by layer, each on ORT's own inputs.

ONNX Runtime runs int16 QDQ as DequantizeLinear -> float32 op -> QuantizeLinear; no integer
machine reproduces its float32 sums bit for bit, so an int16 layer is *bounded* against ORT, not
exact (docs/a16w8.md, ``numerics.int16``), and one admissible int16 LSB upstream can grow through
the layers after it (deep-sort MobileNetV2 with ``--recipe mixed``: 13 LSB at the output). In
such a model a whole-model difference beyond the tolerance proves nothing by itself, so ``run``
judges each layer (a group of a segment, on its executor) fed ORT's own values at its inputs,
against ORT's own output of that layer:

* an NSS layer with int16 involved must execute its formula and have every element that
  differs from ORT explained by the bounded contract: the simulator's per-op check with ORT's
  output handed in (``verify.ort_judged``, the check ``verify`` applies), outputs it does not
  cover within the tolerance;
* every other layer (int8 on the NSS, any CSS/HOST layer: IREE compiles the same QDQ graph)
  must be within the tolerance, as the whole model is in an int8 model.
"""
from __future__ import annotations

import numpy as np

from ..numerics import int16_involved


def has_int16(model) -> bool:
    """Whether a quantized model has int16 activations: a Q/DQ with a 16-bit zero point."""
    import onnx
    wide = (onnx.TensorProto.INT16, onnx.TensorProto.UINT16)
    types = {t.name: t.data_type for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].HasField("t"):
            types[n.output[0]] = n.attribute[0].t.data_type
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2
               and types.get(n.input[2]) in wide for n in model.graph.node)


def judge_layers(c, segs, inputs: dict, ours: dict, opts, names: dict, scales: dict) -> dict:
    """Every layer of ``segs`` on ORT's own inputs, judged as the module says. ORT exposes its
    integer tensors (``ort_intermediates``) and the graph outputs: a float tensor between layers
    (none under full-integer I/O) is fed from this run and not compared. ``ours``: this run's
    tensors, ``names``: compute node index -> layer id, ``scales``: float output -> its LSB."""
    from ..graph import extract_chain
    from .executors import ExecutorError
    from .run import _inputs, ort_intermediates, segment_runnable
    ort = ort_intermediates(c, inputs)
    known = {**ours, **inputs, **ort}
    steps = [(seg.executor, group) for seg in segs for group in seg.groups]
    rows = []
    for (executor, group), model in zip(steps, extract_chain(c, [g for _, g in steps])):
        if model is None:
            continue
        feed = {n: known[n] for n in _inputs(model)}
        try:
            if executor == "nss":
                row = _judge_nss(model, feed, ort, opts, scales)
            else:
                outs, _ = segment_runnable(model, executor, opts).run(feed)
                row = _within(outs, ort, opts.tolerance_lsb, scales)
                row["int16"] = int16_involved(*(np.asarray(v).dtype for v in (*feed.values(), *outs.values())))
        except ExecutorError as e:       # it ran inside its segment: alone it is not judged, so no PASS
            row = {"max_abs_lsb": 0.0, "differing": 0, "beyond": 0, "int16": False, "ok": False,
                   "error": f"[{e.reason_code}] {e.summary}"}
        rows.append({"layer_id": names.get(group[0], f"node {group[0]}"), "executor": executor, **row})
    failed = next((r for r in rows if not r["ok"]), None)
    return {"passed": failed is None, "failed": failed,
            "int16_layers": [r["layer_id"] for r in rows if r["int16"]],
            "max_abs_lsb": max((r["max_abs_lsb"] for r in rows), default=0.0),
            "explained": sum(r.get("explained", 0) for r in rows),
            "overflow": sum(r.get("overflow", 0) for r in rows),
            "layers": rows}


def _judge_nss(model, feed: dict, ort: dict, opts, scales: dict) -> dict:
    """An NSS layer from its cached Program: int8 within the tolerance; int16 by the per-op check
    with ORT's own output handed to the ops ``verify`` judges against it."""
    from ..runtime.nss import Simulator
    from ..verify import ort_judged
    from .executors import nss
    from .options import cache_dir
    program = nss.cached_program(model, cache_dir=cache_dir(), recompute=opts.recompute_cache)
    sim = Simulator(program)
    wide = int16_involved(*(p.dtype for p in (*program.inputs, *program.outputs)), *(st.dtype for st in program.steps))
    if not wide:
        outs = program.fetch(sim.run(program.feed(feed), opts.rounding))
        return dict(_within(outs, ort, opts.tolerance_lsb, scales), int16=False)
    at = ort_judged(program, sim, ort)
    outs, checks = sim.run(program.feed(feed), opts.rounding, explain=True, ort_at=at)
    outs = program.fetch(outs)
    covered = {p.name for p in program.outputs if p.slot in at}
    row = _within(outs, ort, opts.tolerance_lsb, scales)
    rest = _within({k: v for k, v in outs.items() if k not in covered}, ort, opts.tolerance_lsb, scales)
    bad = [od for od in checks if not od.explained]
    unexplained = rest["beyond"] + sum((od.causes.get("other", 0) + od.mismatches) or od.differ for od in bad)
    explained = sum(od.causes.get("float", 0) + od.causes.get("overflow", 0) for od in checks if od.explained)
    overflow = sum(od.causes.get("overflow", 0) for od in checks)      # the ACT's 32-bit wrap: said, not silent
    return dict(row, beyond=rest["beyond"], int16=True, explained=explained, unexplained=unexplained,
                overflow=overflow, ok=unexplained == 0 and not bad)


def _within(outs: dict, ort: dict, tol: float, scales: dict) -> dict:
    """max |Δ| (LSB), differing and beyond-``tol`` element counts of ``outs`` against ORT's."""
    from .run import lsb_distance
    mx, differ, beyond = 0.0, 0, 0
    for name, v in outs.items():
        r = ort.get(name)
        if r is None:
            continue
        d = lsb_distance(v, r, scales.get(name, 1.0))
        mx = max(mx, float(d.max(initial=0)))
        differ += int((np.rint(d) > 0).sum())
        beyond += int((d > tol).sum())
    return {"max_abs_lsb": mx, "differing": differ, "beyond": beyond, "ok": beyond == 0}
