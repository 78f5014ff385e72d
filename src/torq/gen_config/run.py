"""``torq-gen-config run``: apply the discovered map to the whole quantized model.

Re-derives the compiler JSON from the report, refuses a report made with other flags or for
another model (fingerprint), splits the model into executor segments (``partition.py``), runs
each on its executor and compares the outputs with ONNX Runtime on the same quantized model.
Out of tolerance, it names the first layer whose output diverges.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import TorqError
from ..graph.inputs import random_inputs
from . import executors as X
from . import mapping, partition, schema
from .discover import model_and_layers
from .compare import BF16_RUN_TOL_FRAC, float_metrics
from .options import QuantSettings, add_common_args, cache_dir, quant_settings

DEFAULT_TOL_LSB = 5


@dataclass
class RunOptions:
    model: Path
    output_dir: Path = Path(".")
    quant: QuantSettings = field(default_factory=QuantSettings)
    subgraph: tuple = (None, None)
    debug_ir: str | None = None
    rounding: str = "native"
    tolerance_lsb: float = DEFAULT_TOL_LSB
    seed: int = 0
    recompute_cache: bool = False
    tolerance_frac: float = BF16_RUN_TOL_FRAC


def check_fingerprint(report: dict, expected: dict, path: Path) -> None:
    got = report.get("quantization")
    if got is None:
        return  # a reference-tool JSON: nothing to check against (we say so in the CLI output)
    diff = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
    if diff:
        what = ", ".join(f"{k}: report {got.get(k)!r} vs now {expected.get(k)!r}" for k in diff if k != "model_sha256")
        if "model_sha256" in diff:
            what = "the model file changed" + (f"; {what}" if what else "")
        raise TorqError(f"{path} was discovered with different quantization ({what}); rerun discover "
                        "with the same flags, or run with the flags discover used")


def assign(report: dict, layers, locations) -> dict[int, str]:
    """Re-align report layers to this model's MLIR, update mlir_location; node index -> executor."""
    ids = [lay.id for lay in layers]
    known = [i for i in ids if i in report["ops"]]
    if report["ops"] and not known:
        raise TorqError("the report's layers do not match this model's (no common layer id): "
                        "was it discovered for another model?")
    places = mapping.map_layers([lay.op_type for lay in layers], locations)
    for lay, (_, loc) in zip(layers, places):
        if lay.id in report["ops"]:
            report["ops"][lay.id]["mlir_location"] = loc or lay.op_type
    by_loc = {loc: j for j, (_, loc) in enumerate(locations)}
    out = {}
    for loc, a in schema.compiler_config(report)["op_assignments"].items():
        if loc in by_loc:
            out[by_loc[loc]] = a["executor"]
    return out


def execute(c, segs, inputs: dict, opts: RunOptions, stem: str, log=None) -> tuple[dict, list]:
    """Run the segments in order; returns every tensor computed and per-segment timings."""
    from ..graph import extract_segment
    tensors, timings = dict(inputs), []
    graph_outputs = {o.name for o in c.graph.output}
    for i, seg in enumerate(segs):
        model = _drop_dq_outputs(extract_segment(c, seg.nodes), graph_outputs)
        try:
            runnable = segment_runnable(model, seg.executor, opts, f"{stem}.segment{i}_{seg.executor}")
            outs, ms = runnable.run({n: tensors[n] for n in _inputs(model)})
        except X.ExecutorError as e:
            raise TorqError(f"segment {i} ({seg.executor}, {len(seg.groups)} layers) failed "
                            f"[{e.reason_code}]: {e.summary}") from None
        tensors.update(outs)
        timings.append({"segment": i, "executor": seg.executor, "layers": len(seg.groups), "runtime_ms": round(ms, 3)})
        if log:
            log(i + 1, len(segs), f"segment {i} on {seg.executor}")
    return tensors, timings


def segment_runnable(model, executor: str, opts: RunOptions, name: str | None = None):
    """NSS segments come from their cached Program (unless IR is being dumped); CSS/HOST from
    IREE modules cached by the content of their linalg IR."""
    from .executors import nss
    if executor == "nss" and not opts.debug_ir:
        return nss.from_model(model, cache_dir=cache_dir(), rounding=opts.rounding, recompute=opts.recompute_cache)
    compiled = X.frontend(model, debug_ir=opts.debug_ir, name=name)
    return X.build(executor, compiled, cache_dir=cache_dir(), rounding=opts.rounding)


def _inputs(model) -> list[str]:
    inits = {t.name for t in model.graph.initializer}
    return [v.name for v in model.graph.input if v.name not in inits]


def _drop_dq_outputs(model, keep: set):
    """A DQ computed in several segments is not a segment output (boundaries stay int8)."""
    dq = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    outs = [o for o in model.graph.output if o.name not in dq or o.name in keep]
    del model.graph.output[:]
    model.graph.output.extend(outs)
    return model


def metrics(c, ours: dict, ref: dict, tol: float) -> dict:
    from .compare import dq_output_scales
    per_output, hist, top1, scales = {}, {}, [], dq_output_scales(c)
    for name, r in ref.items():
        scale = scales.get(name, 1.0) if not np.issubdtype(r.dtype, np.integer) else 1.0
        d = np.abs(ours[name].astype(np.float64) - r.astype(np.float64)) / scale
        lsb = np.rint(d).astype(np.int64)
        per_output[name] = {"max_abs_lsb": float(d.max(initial=0)), "differing": int((lsb > 0).sum()),
                            "size": int(d.size)}
        for v, k in zip(*np.unique(np.minimum(lsb, 10), return_counts=True)):
            key = ">=10" if v >= 10 else str(int(v))
            hist[key] = hist.get(key, 0) + int(k)
        if r.ndim == 2 and r.shape[1] > 1:
            top1.append(float((ours[name].argmax(1) == r.argmax(1)).mean()))
    worst = max((o["max_abs_lsb"] for o in per_output.values()), default=0.0)
    out = {"outputs": per_output, "max_abs_lsb": worst, "lsb_histogram": dict(sorted(hist.items(), key=_hkey)),
           "tolerance_lsb": tol, "passed": worst <= tol}
    if top1:
        out["top1_agreement"] = min(top1)
    return out


def _hkey(item):
    return 99 if item[0].startswith(">") else int(item[0])


def ort_intermediates(c, inputs: dict) -> dict:
    """ONNX Runtime on the canonical model with every node output exposed."""
    import onnx
    from .. import reference
    m = onnx.shape_inference.infer_shapes(c)
    have = {o.name for o in m.graph.output}
    typed = {v.name: v for v in list(m.graph.value_info)}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have and o in typed:
                m.graph.output.append(typed[o])
                have.add(o)
    return reference.run(m, inputs)


def locate_divergence(c, segs, inputs, opts: RunOptions, names: dict, tol: float) -> dict | None:
    """Rerun layer by layer (each compute node with its Q/DQ, on its executor, chained on our own
    outputs) and return the first layer whose integer output is off by more than ``tol`` LSB."""
    from ..graph import extract_segment
    ort = ort_intermediates(c, inputs)
    tensors, graph_outputs = dict(inputs), {o.name for o in c.graph.output}
    for seg in segs:
        for group in seg.groups:
            model = _drop_dq_outputs(extract_segment(c, group), graph_outputs)
            outs, _ = segment_runnable(model, seg.executor, opts).run({n: tensors[n] for n in _inputs(model)})
            tensors.update(outs)
            for name, v in outs.items():
                r = ort.get(name)
                if r is None or not np.issubdtype(r.dtype, np.integer):
                    continue
                d = float(np.abs(v.astype(np.int64) - r.astype(np.int64)).max(initial=0))
                if d > tol:
                    return {"layer_id": names.get(group[0], f"node {group[0]}"), "tensor": name,
                            "max_abs_lsb": d, "executor": seg.executor}
    return None


def c_nodes(c) -> list:
    return [n for n in c.graph.node if n.op_type != "Constant"]


def fp32_model(opts: RunOptions):
    """The fp32 model (or its sub-graph) a bf16 run is compared with."""
    from ..graph import extract_segment
    from ..graph.load import load_model
    from .discover import select_layers
    fp32 = load_model(opts.model)
    layers, suffix = select_layers(fp32, opts.subgraph)
    return extract_segment(fp32, [lay.node_index for lay in layers]) if suffix else fp32


def run_full(opts: RunOptions, log=None) -> tuple[dict, Path]:
    from ..compiler.pipeline import import_graph
    from .. import reference
    layers, suffix, q = model_and_layers(opts.model, opts.quant, opts.subgraph)
    path = schema.report_path(opts.output_dir, opts.model.stem, suffix)
    report = schema.load(path)
    check_fingerprint(report, opts.quant.fingerprint(opts.model), path)
    c = import_graph(q)                          # node k <-> the full model's k-th torch.operator
    full = X.frontend(q, debug_ir=opts.debug_ir, name=opts.model.stem)
    executor_of = assign(report, layers, full.operator_locations)
    schema.save(report, path)                    # re-derived locations + compiler JSON
    segs = partition.segments(c_nodes(c), executor_of)
    bf16 = opts.quant.auto_convert_bf16
    ref_model = fp32_model(opts) if bf16 else q   # bf16: compared with the fp32 model itself
    inputs = random_inputs(ref_model, opts.seed)
    t0 = time.perf_counter()
    tensors, timings = execute(c, segs, inputs, opts, opts.model.stem, log)
    wall = time.perf_counter() - t0
    ref = reference.run(ref_model, inputs)
    ours = {k: tensors[k] for k in ref}
    m = float_metrics(ours, ref, opts.tolerance_frac) if bf16 else metrics(c, ours, ref, opts.tolerance_lsb)
    m.update(rounding=opts.rounding, segments=timings, seed=opts.seed, run_s=round(wall, 3),
             executor_nodes={e: sum(len(s.groups) for s in segs if s.executor == e) for e in X.EXECUTOR_ORDER})
    if not m["passed"] and not bf16:
        by_loc = {op.get("mlir_location"): lid for lid, op in report["ops"].items()}
        names = {j: by_loc.get(loc, f"{op}@{loc}") for j, (op, loc) in enumerate(full.operator_locations)}
        m["first_divergence"] = locate_divergence(c, segs, inputs, opts, names, opts.tolerance_lsb)
    report["full_model_metrics"] = m
    schema.save(report, path)
    return report, path


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run the whole model with the discovered executor map and compare with ONNX Runtime",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Re-derive the compiler JSON from torq_gen_config_<stem>.json, split the quantized model "
                    "into segments by executor, run each (NSS simulator / IREE vmvx / IREE llvm-cpu) and "
                    "compare with ONNX Runtime on the same quantized model. Use the quantization flags of "
                    "discover (a different fingerprint is refused). Exit 0 within tolerance.")
    add_common_args(p)
    p.add_argument("--tolerance-lsb", type=float, default=DEFAULT_TOL_LSB, metavar="N",
                   help=f"largest |Δ| (int8 LSB) accepted on any output (default {DEFAULT_TOL_LSB})")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--tolerance-frac", type=float, default=BF16_RUN_TOL_FRAC, metavar="F",
                   help="--auto-convert-bf16: an output element fails when it is off by more than fp_max_tol "
                        f"relative and by more than F x max|fp32 output| (default {BF16_RUN_TOL_FRAC})")
    p.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    from .progress import layer_progress
    model = Path(args.model)
    if not model.is_file():
        raise TorqError(f"--model {model}: no such file")
    if not args.tolerance_lsb >= 0:
        raise TorqError(f"--tolerance-lsb must be non-negative (got {args.tolerance_lsb})")
    if not 0 <= args.tolerance_frac <= 1:
        raise TorqError(f"--tolerance-frac must be in [0, 1] (got {args.tolerance_frac})")
    opts = RunOptions(model, Path(args.output_dir), quant_settings(args), (args.subgraph_from, args.subgraph_to),
                      args.debug_ir, args.rounding, args.tolerance_lsb, args.seed, args.recompute_cache,
                      args.tolerance_frac)
    with layer_progress("run") as bar:
        report, path = run_full(opts, bar)
    if "quantization" not in report:
        print("run: note: the report has no quantization fingerprint (reference tool JSON); flags not checked")
    m = report["full_model_metrics"]
    segs = ", ".join(f"{s['executor']} ({s['layers']} layers, {s['runtime_ms']:.1f} ms)" for s in m["segments"])
    print(f"run: {len(m['segments'])} segment(s): {segs}")
    if opts.quant.auto_convert_bf16:
        return _print_float(m, path)
    for name, o in m["outputs"].items():
        print(f"  output {name}: max |Δ| {o['max_abs_lsb']:g} LSB, {o['differing']}/{o['size']} differ")
    print("  |Δ| histogram (LSB: count): " + ", ".join(f"{k}: {v}" for k, v in m["lsb_histogram"].items()))
    if "top1_agreement" in m:
        print(f"  top-1 agreement with ONNX Runtime: {m['top1_agreement']:.0%}")
    if m["passed"]:
        print(f"run: PASS (within ±{m['tolerance_lsb']:g} LSB, rounding {m['rounding']}) -> {path}")
        return 0
    d = m.get("first_divergence")
    where = f"; first diverging layer: {d['layer_id']} on {d['executor']} ({d['max_abs_lsb']:g} LSB at {d['tensor']})" if d else ""
    print(f"run: FAIL: max |Δ| {m['max_abs_lsb']:g} LSB > {m['tolerance_lsb']:g}{where}")
    return 1


def _print_float(m: dict, path) -> int:
    """The bf16 run's verdict against the fp32 model."""
    for name, o in m["outputs"].items():
        print(f"  output {name}: max rel diff {o['max_rel_diff']:.4g}, max |Δ| {o['max_abs_diff']:.4g} "
              f"({o['abs_frac']:.2%} of max |fp32|), {o['wrong']}/{o['size']} beyond tolerance")
    if "top1_agreement" in m:
        print(f"  top-1 agreement with fp32 (ONNX Runtime): {m['top1_agreement']:.0%}")
    verdict = "PASS" if m["passed"] else "FAIL"
    print(f"run: {verdict} (bf16 vs fp32: relative {m['fp_max_tol']:g} or within {m['tolerance_frac']:g} x max|fp32|) "
          f"-> {path}")
    return 0 if m["passed"] else 1
