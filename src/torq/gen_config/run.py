"""``torq-gen-config run``: apply the discovered map to the whole quantized model.

Re-derives the compiler JSON from the report, refuses a report made with other flags or for
another model (fingerprint), splits the model into executor segments (``partition.py``), runs
each on its executor and compares the outputs with ONNX Runtime on the same quantized model.
Out of tolerance, it names the first layer whose output diverges; in a model with int16
activations it judges every layer on ORT's own inputs instead (``layer_judgment``).
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import TorqError
from ..graph.inputs import random_inputs
from . import executors as X
from . import mapping, partition, schema, store
from .discover import model_and_layers
from .compare import BF16_RUN_TOL_FRAC, float_metrics
from .options import QuantSettings, add_common_args, cache_dir, fingerprint_mismatch, quant_settings, use_engine

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
    ray: object = None          # --ray: compile the segments as Ray tasks first


def check_fingerprint(got: dict | None, expected: dict, path: Path) -> None:
    msg = fingerprint_mismatch(got, expected, path.name)
    if msg:
        raise TorqError(msg)


@dataclass
class MapSource:
    """Where the executor map comes from: the report (re-derived), or the compiler JSON alone."""
    path: Path
    report: dict | None = None
    compiler: dict | None = None

    @property
    def fingerprint(self):
        return (self.report if self.report is not None else self.compiler).get("quantization")


def load_map(out_dir: Path, stem: str, suffix: str) -> MapSource:
    found = schema.find_report(out_dir, stem, suffix)
    if found is not None:
        return MapSource(found, report=schema.load(found))
    comp = schema.compiler_path(schema.report_path(out_dir, stem, suffix))
    if comp.exists():
        from . import compiler_json
        return MapSource(comp, compiler=compiler_json.load(comp))
    raise TorqError(f"{schema.report_path(out_dir, stem, suffix)}: no such report (and no compiler JSON "
                    f"{comp.name}); run 'torq-gen-config discover' first")


def relocate(report: dict, layers, places) -> None:
    """Re-align report layers to this model's MLIR: update their ``mlir_location``."""
    if report["ops"] and not any(lay.id in report["ops"] for lay in layers):
        raise TorqError("the report's layers do not match this model's (no common layer id): "
                        "was it discovered for another model?")
    for lay, (_, loc) in zip(layers, places):
        if lay.id in report["ops"]:
            report["ops"][lay.id]["mlir_location"] = loc or lay.op_type


def per_layer(layers, places, assignments: dict) -> list[tuple[str, str, str]]:
    """(layer id, executor, location) of every layer: its assignment, ``nss`` by default (as the
    compiler does for an op without one), ``fused`` when the op has no location of its own."""
    out = []
    for lay, (_, loc) in zip(layers, places):
        ex = assignments.get(loc, {}).get("executor", "nss (default)") if loc else "fused"
        out.append((lay.id, ex, loc or "-"))
    return out


def refuse_unrunnable(report: dict, op_types: dict, opts: RunOptions) -> None:
    """A layer with its own location whose every tested executor failed in discover, and no edit,
    has no executor: the compiler would put it on the NSS by default, where discover saw it fail.
    Refused in one line naming it, instead of a segment failing (or running a layer nobody vetted)."""
    from . import report_text as T
    ops = report["ops"]
    bad = [lid for lid in T.counts(ops)["critical"] if ops[lid].get("recommended_executor") is None
           and "executor" not in (ops[lid].get("edit") or {}) and schema.is_location(ops[lid].get("mlir_location"))]
    if not bad:
        return
    tested = ops[bad[0]]["executors"]
    why = "; ".join(f"{e}: {(r.get('failure_report') or {}).get('reason_code', 'error')}" for e, r in tested.items())
    untested = [e for e in X.EXECUTOR_ORDER if e not in tested]
    more = f" (and {len(bad) - 1} more layer(s) alike)" if len(bad) > 1 else ""
    again = f"; or re-run discover testing {'/'.join(untested)} too" if untested else ""
    raise TorqError(f"layer '{bad[0]}' ({op_types.get(bad[0], '?')}) has no executor: every executor discover "
                    f"tested failed ({why}){more}; assign one with 'torq-gen-config edit --model {opts.model} "
                    f"--output-dir {opts.output_dir} --layer {bad[0]} --executor host'{again}")


def layer_locations(model: Path, fingerprint: dict | None) -> dict[str, str | None]:
    """Layer id -> LINE:COL in the (quantized) full model, for editing a compiler JSON by id."""
    from .discover import locations
    from .options import quant_from_fingerprint
    layers, _, q = model_and_layers(model, quant_from_fingerprint(fingerprint))
    places = mapping.map_layers([lay.op_type for lay in layers], locations(q))
    return {lay.id: loc for lay, (_, loc) in zip(layers, places)}


def coverage_note(report: dict, layers) -> str | None:
    """What ``run`` says when the report does not describe exactly this model's layers."""
    ids = {lay.id for lay in layers}
    missing = [lay.id for lay in layers if lay.id not in report["ops"]]
    ghosts = [i for i in report["ops"] if i not in ids]
    parts = []
    if missing and report["ops"]:
        parts.append(f"the report has {len(ids) - len(missing)} of {len(ids)} layers (the {len(missing)} "
                     f"missing, e.g. {missing[0]!r}, run on the NSS; was discover interrupted?)")
    if ghosts:
        parts.append(f"{len(ghosts)} op id(s) are not layers of this model and are ignored (e.g. {ghosts[0]!r})")
    return "; ".join(parts) or None


def execute(c, segs, inputs: dict, opts: RunOptions, stem: str, log=None) -> tuple[dict, list]:
    """Run the segments in order; returns every tensor computed and per-segment timings."""
    from ..graph import extract_chain
    tensors, timings = dict(inputs), []
    for i, (seg, model) in enumerate(zip(segs, extract_chain(c, [seg.nodes for seg in segs]))):
        if model is None:
            continue                                 # nothing after it reads what it computes
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


def precompile(c, segs, opts: RunOptions, log=None) -> None:
    """``--ray``: compile every segment (NSS program / IREE module) as a Ray task, side by side,
    and put what each task built into this process's cache, where ``execute`` then finds it."""
    from .. import cluster
    from ..fileio import atomic_write_bytes
    from ..graph import extract_chain
    built = [(seg, m) for seg, m in zip(segs, extract_chain(c, [seg.nodes for seg in segs])) if m is not None]
    work = [(str(cache_dir()), os.environ.get("TORQ_ENGINE"), m.SerializeToString(), seg.executor, opts)
            for seg, m in built]
    root = cache_dir()
    for i, files in enumerate(cluster.ordered(compile_segment, work, opts.ray)):
        for rel, data in files:
            if not (root / rel).exists():
                atomic_write_bytes(root / rel, data)
        if log:
            log(i + 1, len(built), f"compiled segment {i} ({built[i][0].executor})")


def compile_segment(cache_root: str, engine, model_bytes: bytes, executor: str, opts: RunOptions) -> list:
    """A Ray task: build one segment's runnable against ``cache_root``; [(cache-relative path,
    bytes)] of the artifact it compiled ([] when it does not compile: ``execute`` reports that)."""
    import onnx
    from .executors import iree, nss
    os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = cache_root
    if engine:
        os.environ["TORQ_ENGINE"] = engine
    model = onnx.load_from_string(model_bytes)
    try:
        segment_runnable(model, executor, opts)
        if executor == "nss":
            path = nss.program_path(model, cache_dir())
        else:
            path = iree.vmfb_path(X.frontend(model).ir("linalg"), iree.BACKENDS[executor], cache_dir())
        return [(str(path.relative_to(cache_dir())), path.read_bytes())]
    except (X.ExecutorError, OSError, TorqError):
        return []


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


def metrics(c, ours: dict, ref: dict, tol: float) -> dict:
    from .compare import dq_output_scales
    per_output, hist, top1, scales = {}, {}, [], dq_output_scales(c)
    for name, r in ref.items():
        d = lsb_distance(ours[name], r, scales.get(name, 1.0))
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


def lsb_distance(ours, ref: np.ndarray, scale: float) -> np.ndarray:
    """|ours − ref| in LSB: integer outputs as they are, float (dequantized) ones over ``scale``."""
    d = np.abs(np.asarray(ours).astype(np.float64) - ref.astype(np.float64))
    return d if np.issubdtype(ref.dtype, np.integer) else d / scale


def _hkey(item):
    return 99 if item[0].startswith(">") else int(item[0])


def ort_intermediates(c, inputs: dict) -> dict:
    """ONNX Runtime on the canonical model with every integer node output exposed (the ones
    compared). Only those: a float one (a DQ's, a Conv's before its Q) exposed keeps ORT from fusing
    DQ -> Conv -> Q into QLinearConv, and its float Conv then differs from the model's own run
    (PP-OCR cls: outputs [18, -19] instead of [20, -22]), blaming a layer that computes right."""
    import onnx
    from .. import reference
    m = onnx.shape_inference.infer_shapes(c)
    have = {o.name for o in m.graph.output}
    typed = {v.name: v for v in list(m.graph.value_info)}
    ints = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16)
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have and o in typed and typed[o].type.tensor_type.elem_type in ints:
                m.graph.output.append(typed[o])
                have.add(o)
    return reference.run(m, inputs)


def locate_divergence(c, segs, inputs, opts: RunOptions, names: dict, tol: float) -> dict | None:
    """Rerun layer by layer (each compute node with its Q/DQ, on its executor, chained on our own
    outputs) and return the first layer whose integer output is off by more than ``tol`` LSB."""
    from ..graph import extract_chain
    ort = ort_intermediates(c, inputs)
    tensors = dict(inputs)
    steps = [(seg.executor, group) for seg in segs for group in seg.groups]
    for (executor, group), model in zip(steps, extract_chain(c, [g for _, g in steps])):
        if model is None:
            continue
        outs, _ = segment_runnable(model, executor, opts).run({n: tensors[n] for n in _inputs(model)})
        tensors.update(outs)
        for name, v in outs.items():
            r = ort.get(name)
            if r is None or not np.issubdtype(r.dtype, np.integer):
                continue
            d = float(np.abs(v.astype(np.int64) - r.astype(np.int64)).max(initial=0))
            if d > tol:
                return {"layer_id": names.get(group[0], f"node {group[0]}"), "tensor": name,
                        "max_abs_lsb": d, "executor": executor}
    return None


def c_nodes(c) -> list:
    return [n for n in c.graph.node if n.op_type != "Constant"]


def fp32_model(opts: RunOptions):
    """The fp32 model (or its sub-graph) a bf16 run is compared with."""
    from ..graph import extract_segment
    from ..graph.input_shape import set_input_shapes
    from ..graph.load import load_model
    from .discover import select_layers
    fp32 = set_input_shapes(load_model(opts.model), opts.quant.recipe.input_shape, str(opts.model))
    layers, suffix = select_layers(fp32, opts.subgraph)
    return extract_segment(fp32, [lay.node_index for lay in layers]) if suffix else fp32


def run_full(opts: RunOptions, log=None) -> tuple[dict, Path]:
    """Run the whole model with its executor map; returns (report or compiler JSON, its path).
    The metrics go to ``full_model_metrics`` (written back only into a report, under its lock)."""
    from ..progress import stage
    from ..quantize.model_cache import recomputing
    with stage("run: cutting and quantizing the model"), recomputing(opts.recompute_cache):
        layers, suffix, q = model_and_layers(opts.model, opts.quant, opts.subgraph)
    src = load_map(opts.output_dir, opts.model.stem, suffix)   # none, or a damaged one: said first
    if src.report is None:
        return _run(opts, layers, q, src, log)
    with store.session(src.path, "run", exclusive=False):
        src.report = schema.load(src.path)
        return _run(opts, layers, q, src, log)


def _run(opts: RunOptions, layers, q, src: MapSource, log) -> tuple[dict, Path]:
    from ..compiler.pipeline import import_graph
    from ..progress import stage
    from .. import reference
    check_fingerprint(src.fingerprint, opts.quant.fingerprint(opts.model), src.path)
    with stage("run: importing the whole model"):
        c = import_graph(q)                      # node k <-> the full model's k-th torch.operator
        full = X.frontend(q, debug_ir=opts.debug_ir, name=opts.model.stem)
    places = mapping.map_layers([lay.op_type for lay in layers], full.operator_locations)
    report, note = src.report, None
    if report is not None:
        relocate(report, layers, places)
        mine = {"ops": {lay.id: report["ops"][lay.id] for lay in layers if lay.id in report["ops"]}}
        refuse_unrunnable(mine, {lay.id: lay.op_type for lay in layers}, opts)
        assignments = schema.compiler_config(mine)["op_assignments"]   # another model's ids decide nothing
        note = coverage_note(report, layers)
        locs = {lid: op["mlir_location"] for lid, op in report["ops"].items() if "mlir_location" in op}
        used_map = store.map_digest(report)
        store.update(src.path, lambda disk: _with_locations(disk or report, locs), keep_compiler_extras=True)
    else:
        assignments = src.compiler["op_assignments"]
    by_loc = {loc: j for j, (_, loc) in enumerate(full.operator_locations)}
    executor_of = {by_loc[loc]: a["executor"] for loc, a in assignments.items() if loc in by_loc}
    segs = partition.segments(c_nodes(c), executor_of)
    bf16 = opts.quant.auto_convert_bf16
    ref_model = fp32_model(opts) if bf16 else q   # bf16: compared with the fp32 model itself
    inputs = random_inputs(ref_model, opts.seed)
    if opts.ray:
        precompile(c, segs, opts, log)
    t0 = time.perf_counter()
    tensors, timings = execute(c, segs, inputs, opts, opts.model.stem, log)
    wall = time.perf_counter() - t0
    with stage("run: ONNX Runtime reference"):
        ref = reference.run(ref_model, inputs)
    ours = {k: tensors[k] for k in ref}
    m = float_metrics(ours, ref, opts.tolerance_frac) if bf16 else metrics(c, ours, ref, opts.tolerance_lsb)
    m.update(rounding=opts.rounding, segments=timings, seed=opts.seed, run_s=round(wall, 3),
             executor_nodes={e: sum(len(s.groups) for s in segs if s.executor == e) for e in X.EXECUTOR_ORDER})
    rows = per_layer(layers, places, assignments)
    if not m["passed"] and not bf16:
        from .layer_judgment import has_int16, judge_layers
        ids = {loc: lay_id for lay_id, _, loc in rows}
        names = {j: ids.get(loc, f"{op}@{loc}") for j, (op, loc) in enumerate(full.operator_locations)}
        if has_int16(q):             # int16 layers are bounded, not exact: the whole-model drift proves nothing
            from .compare import dq_output_scales
            with stage("run: judging layer by layer on ORT's inputs (int16 layers: the bounded contract)"):
                m["per_layer"] = judge_layers(c, segs, inputs, tensors, opts, names, dq_output_scales(c))
            m.update(judged="per-layer", passed=m["per_layer"]["passed"])
        else:
            with stage("run: locating the first diverging layer"):
                m["first_divergence"] = locate_divergence(c, segs, inputs, opts, names, opts.tolerance_lsb)
    if report is None:
        return dict(src.compiler, full_model_metrics=dict(m, layers=rows)), src.path
    m["executor_map_sha256"] = used_map
    if note:
        m["warning"] = note

    def with_metrics(disk):
        out = _with_locations(disk or report, locs)
        out["full_model_metrics"] = m            # stale (store) if the map changed meanwhile
        schema.summarize(out)
        return out
    out = store.update(src.path, with_metrics, keep_compiler_extras=True)
    out["full_model_metrics"] = dict(out["full_model_metrics"], layers=rows)   # printed, not stored
    return out, src.path


def _with_locations(report: dict, locs: dict) -> dict:
    for lid, loc in locs.items():
        if lid in report["ops"]:
            report["ops"][lid]["mlir_location"] = loc
    return report


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
    from .options import note_inert_flags, resolve_model
    from .progress import layer_progress
    model = resolve_model(args.model)
    note_inert_flags(args)
    if not args.tolerance_lsb >= 0:
        raise TorqError(f"--tolerance-lsb must be non-negative (got {args.tolerance_lsb})")
    if not 0 <= args.tolerance_frac <= 1:
        raise TorqError(f"--tolerance-frac must be in [0, 1] (got {args.tolerance_frac})")
    use_engine(args.engine)
    opts = RunOptions(model, Path(args.output_dir), quant_settings(args), (args.subgraph_from, args.subgraph_to),
                      args.debug_ir, args.rounding, args.tolerance_lsb, args.seed, args.recompute_cache,
                      args.tolerance_frac, args.ray)
    with layer_progress("run", "segments") as bar:
        report, path = run_full(opts, bar)
    if "quantization" not in report:
        print(f"run: note: {path.name} has no quantization fingerprint (reference tool JSON); flags not checked")
    if "ops" not in report:
        print(f"run: using the compiler JSON alone: {path}")
    m = report["full_model_metrics"]
    print_layers(m["layers"])
    if m.get("warning"):
        print(f"run: warning: {m['warning']}")
    if m.get("stale"):
        print("run: note: the executor map changed while run worked (an edit or a discover); these "
              "figures are for the map run used: run again for the new one")
    segs = ", ".join(f"{s['executor']} ({s['layers']} layers, {s['runtime_ms']:.1f} ms)" for s in m["segments"])
    print(f"run: {len(m['segments'])} segment(s): {segs}")
    if "ops" in report:
        from .view import layer_counts
        c = layer_counts(report)
        print(f"run: discover's {c['layers']} layers = {c['ops']} ops of their own + {c['fused']} fused into the op "
              f"before them (e.g. Relu into Conv) + {c['folded']} folded constants")
    if opts.quant.auto_convert_bf16:
        return _print_float(m, path)
    for name, o in m["outputs"].items():
        print(f"  output {name}: max |Δ| {o['max_abs_lsb']:g} LSB, {o['differing']}/{o['size']} differ")
    print("  |Δ| histogram (LSB: count): " + ", ".join(f"{k}: {v}" for k, v in m["lsb_histogram"].items()))
    if "top1_agreement" in m:
        print(f"  top-1 agreement with ONNX Runtime: {m['top1_agreement']:.0%}")
    if m.get("judged") == "per-layer":
        return _print_per_layer(m, path)
    if m["passed"]:
        print(f"run: PASS (within ±{m['tolerance_lsb']:g} LSB, rounding {m['rounding']}) -> {path}")
        return 0
    d = m.get("first_divergence")
    where = f"; first diverging layer: {d['layer_id']} on {d['executor']} ({d['max_abs_lsb']:g} LSB at {d['tensor']})" if d else ""
    print(f"run: FAIL: max |Δ| {m['max_abs_lsb']:g} LSB > {m['tolerance_lsb']:g}{where}")
    return 1


def _print_per_layer(m: dict, path) -> int:
    """The verdict of a model with int16 layers judged layer by layer (``layer_judgment``)."""
    j = m["per_layer"]
    whole = f"whole-model max |Δ| {m['max_abs_lsb']:g} LSB > ±{m['tolerance_lsb']:g}"
    if j["passed"]:
        print(f"run: PASS (int16 drift explained: on ORT's own inputs every layer is within "
              f"±{m['tolerance_lsb']:g} LSB, the {len(j['int16_layers'])} layers with int16 in or out within the "
              f"int16 float bound ({j['explained']} element(s) explained"
              + (f", {j['overflow']} of them at an int32 overflow of the ACT sum" if j.get("overflow") else "")
              + f"); per-layer max |Δ| {j['max_abs_lsb']:g} "
              f"LSB; {whole}; rounding {m['rounding']}) -> {path}")
        return 0
    f = j["failed"]
    if f.get("error"):
        print(f"run: FAIL: layer {f['layer_id']} on {f['executor']} could not be judged alone on ORT's inputs "
              f"({f['error']}); {whole}")
        return 1
    why = (f"{f['unexplained']} element(s) not explained by the int16 bound" if f["int16"] and f["executor"] == "nss"
           else f"{f['beyond']} element(s) beyond ±{m['tolerance_lsb']:g} LSB")
    print(f"run: FAIL: layer {f['layer_id']} on {f['executor']}: {why} (max |Δ| {f['max_abs_lsb']:g} LSB against "
          f"ORT on ORT's own inputs); {whole}")
    return 1


def print_layers(rows) -> None:
    """One line per layer: id, executor, location (the reference prints the executor per layer)."""
    width = max((len(r[0][:60]) for r in rows), default=5)
    print(f"run: executor per layer ({len(rows)} layers):")
    for lid, ex, loc in rows:
        print(f"  {lid[:60]:<{width}}  {ex:<14} {loc}")


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
