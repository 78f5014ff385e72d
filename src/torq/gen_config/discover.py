"""``torq-gen-config discover``: which executor (NSS / CSS / HOST) can run each layer.

Each layer is cut from the fp32 model, quantized on its own (``--quantize``; lone Relu/Flatten/...
wrapped in Q/DQ), run by ONNX Runtime as reference and by each executor in nss -> css -> host
order, compared, and recorded. Both JSON files are rewritten atomically after every layer, and
results are cached by content, so an interrupted discover simply resumes.
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .._version import __version__
from ..errors import TorqError
from . import layer_test, mapping, schema
from .cache import ResultCache
from .executors import EXECUTOR_ORDER
from .options import (QuantSettings, add_common_args, cache_dir, check_output_dir, parse_executors,
                      quant_settings)


@dataclass
class DiscoverOptions:
    model: Path
    output_dir: Path = Path(".")
    quant: QuantSettings = field(default_factory=QuantSettings)
    skip_mode: bool = False
    skip_executors: list = field(default_factory=list)
    skip_ops: list = field(default_factory=list)
    dedup: bool = False
    timing_runs: int = 0
    recommend_by_timing: bool = False
    subgraph: tuple = (None, None)
    recompute_cache: bool = False
    debug_ir: str | None = None
    repro_dir: str | None = None
    rounding: str = "native"
    argv: list = field(default_factory=list)
    jobs: int = 1
    save_bf16_model: str | None = None


@dataclass
class Context:
    opts: DiscoverOptions
    report: dict
    path: Path
    cache: ResultCache
    computed: int = 0


def model_and_layers(model_path: Path, quant: QuantSettings, subgraph=(None, None), lazy: bool = False):
    """(layers, report-name suffix, the model the executor map is for). Layers are cut from the
    *prepared* fp32 model (the recipe's front end, and under ``--quantize`` its CLE / bias
    correction), the graph the whole-model quantization starts from, so each layer discover tests
    is the layer the whole-model compile sees. ``lazy``: the third item is a function that builds
    the model (discover may find its map in the cache)."""
    from ..graph import extract_segment
    prepared = prepared_fp32(model_path, quant)
    layers, suffix = select_layers(prepared, subgraph)

    def build():
        base = extract_segment(prepared, [lay.node_index for lay in layers]) if suffix else prepared
        if quant.auto_convert_bf16:
            from ..graph.bf16 import convert_to_bf16
            return convert_to_bf16(base)
        if not quant.quantize:
            return base
        from ..quantize.calibration import make_reader
        from ..quantize.recipe import quantize_prepared
        return quantize_prepared(quant.recipe, base, make_reader(base, quant.recipe), where=str(model_path))
    return layers, suffix, (build if lazy else build())


_PREPARED: dict = {}


def prepared_fp32(model_path: Path, quant: QuantSettings):
    """The model as loaded, after the recipe's fp32 steps (none for an already quantized model).
    Cached per file state and settings: discover and its per-layer calibration share one."""
    from ..graph.load import is_quantized, load_model
    st = Path(model_path).stat()
    key = (str(Path(model_path).resolve()), st.st_mtime_ns, st.st_size, quant)
    if key not in _PREPARED:
        model = load_model(model_path)
        if not is_quantized(model):
            from ..quantize.recipe import front_end, load_fp32, prepare
            model, _ = load_fp32(model, str(model_path))
            model = prepare(quant.recipe, model) if quant.quantize else front_end(quant.recipe, model)
        _PREPARED.clear()
        _PREPARED[key] = model
    return _PREPARED[key]


def layer_places(layers, build_full, key: dict, recompute: bool) -> list:
    """``mapping.map_layers`` of the (quantized) full model, cached by fingerprint: a warm
    discover neither re-quantizes nor re-imports the full model."""
    import hashlib
    import json
    from ..fileio import atomic_write_json
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    path = cache_dir() / "maps" / f"{digest}.json"
    if path.exists() and not recompute:
        try:
            return [tuple(p) for p in json.loads(path.read_text())]
        except (OSError, ValueError):
            pass
    places = mapping.map_layers([lay.op_type for lay in layers], locations(build_full()))
    try:
        atomic_write_json(path, places)
    except OSError:
        pass
    return places


def select_layers(fp32, subgraph):
    """All layers, or those from --subgraph-from to --subgraph-to (inclusive) and the file suffix."""
    from ..graph import extract_layers
    layers = extract_layers(fp32)
    lo, hi = subgraph
    if lo is None and hi is None:
        return layers, ""
    a = _layer_index(layers, lo, "--subgraph-from") if lo is not None else 0
    b = _layer_index(layers, hi, "--subgraph-to") if hi is not None else len(layers) - 1
    if a > b:
        raise TorqError(f"--subgraph-from ({a}) comes after --subgraph-to ({b})")
    return layers[a:b + 1], f"_subgraph_{a}_{b}"


def _layer_index(layers, selector: str, flag: str) -> int:
    """A non-Constant node index, a layer id, a node name or an output tensor name."""
    sel = str(selector)
    if sel.isdigit():
        if int(sel) >= len(layers):
            raise TorqError(f"{flag} {sel}: out of range (the model has {len(layers)} layers)")
        return int(sel)
    for i, lay in enumerate(layers):
        if sel in (lay.id, lay.node_name) or sel in {o.name for o in lay.model.graph.output}:
            return i
    raise TorqError(f"{flag} '{sel}': no such node (use an index, node name, <OpType>_<output> or output name)")


def locations(model) -> list:
    """[(onnx op, LINE:COL)] of the full model's imported MLIR ([] when it does not import)."""
    from .executors import ExecutorError, frontend
    try:
        return frontend(model).operator_locations
    except ExecutorError:
        return []


def run_discovery(opts: DiscoverOptions, progress=None) -> tuple[dict, Path]:
    stem = opts.model.stem
    check_output_dir(opts.output_dir)
    layers, suffix, build_full = model_and_layers(opts.model, opts.quant, opts.subgraph, lazy=True)
    if opts.save_bf16_model:
        from ..fileio import save_model
        save_model(build_full(), Path(opts.save_bf16_model))
    path = schema.report_path(opts.output_dir, stem, suffix)
    report = _start_report(path, stem, opts)
    map_key = {"fingerprint": report["quantization"], "layers": [lay.id for lay in layers], "v": __version__}
    places = layer_places(layers, build_full, map_key, opts.recompute_cache)
    ctx = Context(opts, report, path, ResultCache(cache_dir(), opts.recompute_cache))
    plan = _plan(ctx, layers)
    tested = [lay for lay, why in zip(layers, plan) if why == "test"]
    calib = _layer_calibration(opts, tested)
    qkey = dict(report["quantization"], model_sha256=None) if opts.quant.quantize else \
        {"auto_convert_bf16": True} if opts.quant.auto_convert_bf16 else None
    work = [(opts, lay, schema.tolerance(report, lay.id), calib.get(lay.id), qkey) for lay in tested]
    with _results(opts, work) as results:
        for i, (layer, (k, loc), why) in enumerate(zip(layers, places, plan)):
            if progress:
                progress(i, len(layers), layer.id)
            entry = report["ops"].setdefault(layer.id, {"executors": {}})
            entry["_node_index"] = k if opts.quant.quantize else layer.node_index
            entry["_orig_index"] = layer.node_index
            entry["mlir_location"] = loc if loc else layer.op_type
            if opts.quant.quantize:
                from ..quantize.recipe import layer_precision
                entry["precision"] = layer_precision(opts.quant.recipe, layer.node_name)
            _fill(ctx, layer, entry, why, results)
            schema.summarize(report)
            schema.save(report, path)
    if progress:
        progress(len(layers), len(layers), "")
    report["discovery_report"]["summary"].update(computed=ctx.computed, from_cache=ctx.cache.hits)
    schema.save(report, path)
    return report, path


def _layer_calibration(opts: DiscoverOptions, layers) -> dict:
    """With --calibration-data: layer id -> {input name: samples} from the prepared fp32 model."""
    if not (opts.quant.quantize and opts.quant.recipe.calibration_data):
        return {}
    from ..quantize.calibration import make_reader
    from ..quantize.per_layer import layer_samples
    inputs = {lay.id: [v.name for v in lay.model.graph.input
                       if v.name not in {t.name for t in lay.model.graph.initializer}] for lay in layers}
    model = prepared_fp32(opts.model, opts.quant)
    samples = layer_samples(model, {n for names in inputs.values() for n in names},
                            make_reader(model, opts.quant.recipe))
    return {lid: {n: samples[n] for n in names} for lid, names in inputs.items()}


@contextlib.contextmanager
def _results(opts: DiscoverOptions, work: list):
    """Results of ``_test_executors`` in order: in process, or from ``--jobs`` worker processes."""
    if opts.jobs <= 1 or len(work) < 2:
        yield map(_work, work)
        return
    ctx = multiprocessing.get_context("spawn")   # MLIR contexts and numba threads do not survive fork
    with ctx.Pool(min(opts.jobs, len(work))) as pool:
        yield pool.imap(_work, work)


def _work(args):
    return _test_executors(*args)


def _start_report(path: Path, stem: str, opts: DiscoverOptions) -> dict:
    """Keep manual edits of an existing report for the same model and flags; else start fresh."""
    fingerprint = opts.quant.fingerprint(opts.model)
    if path.exists():
        try:
            old = schema.load(path)
        except TorqError:
            old = None
        if old is not None and old.get("quantization") == fingerprint:
            for op in old["ops"].values():
                for ex in opts.skip_executors:
                    op["executors"].pop(ex, None)
            return old
    return schema.new_report(stem, fingerprint)


def _plan(ctx: Context, layers) -> list:
    """Per layer: "skip" (--skip-ops), "constant" (shape arithmetic: every input is a folded
    constant, so the compiler computes it before import and no executor runs it), ("dup", source
    id) (--dedup-layers) or "test"."""
    from ..graph import signature_json
    plan, seen = [], {}
    for layer in layers:
        if layer.op_type in ctx.opts.skip_ops:
            plan.append("skip")
            continue
        g = layer.model.graph
        if not {v.name for v in g.input} - {t.name for t in g.initializer}:
            plan.append("constant")
            continue
        if ctx.opts.dedup:
            sig = signature_json(layer.model)
            if sig in seen:
                plan.append(("dup", seen[sig]))
                continue
            seen[sig] = layer.id
        plan.append("test")
    return plan


def _fill(ctx: Context, layer, entry: dict, why, results) -> None:
    entry.pop("duplicate_of", None)
    entry.pop("skipped", None)
    if why in ("skip", "constant"):
        entry.update(executors={}, recommended_executor=None,
                     skipped="--skip-ops" if why == "skip" else "constant: folded at compile time")
        return
    if why == "test":
        entry["executors"], computed, hits = next(results)
        ctx.computed += computed
        ctx.cache.hits += hits
    else:
        src = ctx.report["ops"][why[1]]
        entry["executors"] = {e: dict(r) for e, r in src["executors"].items()}
        entry["duplicate_of"] = why[1]
    entry["recommended_executor"] = schema.recommend(entry["executors"], ctx.opts.recommend_by_timing)


def _test_executors(opts: DiscoverOptions, layer, tol: dict, calib=None, qkey=None) -> tuple[dict, int, int]:
    """(results per executor, 1 if the layer was tested here else 0, cache hits). Runs in workers.

    Cache key: the layer's bytes + ``qkey`` (quantization flags and calibration data hash) + the
    rest of the flags that change a result."""
    cache = ResultCache(cache_dir(), opts.recompute_cache)
    flags = {"quant": qkey, "tol": tol,
             "timing_runs": opts.timing_runs, "rounding": opts.rounding, "seed": layer_test.SEED}
    key = cache.key(layer.model.SerializeToString(), flags)
    prepared, results = None, {}
    for ex in [e for e in EXECUTOR_ORDER if e not in opts.skip_executors]:
        r = cache.get(key, ex)
        if r is None:
            if prepared is None:
                prepared = layer_test.prepare(layer.model, opts.quant, opts.debug_ir,
                                              layer_test.safe_name(layer.id), calib)
            r = layer_test.run_executor(prepared, ex, tol, cache.root, opts.rounding, opts.timing_runs)
            cache.put(key, ex, r)
        results[ex] = r
        if opts.skip_mode and r["status"] == "success":
            break
    if opts.repro_dir and any(r["status"] != "success" for r in results.values()):
        prepared = prepared or layer_test.prepare(layer.model, opts.quant, None, "layer", calib)
        layer_test.write_repro(Path(opts.repro_dir), layer.id, prepared, results, opts.argv)
    return results, int(prepared is not None), cache.hits


# ----------------------------------------------------------------------------- CLI

def register(sub) -> None:
    p = sub.add_parser(
        "discover", help="per-layer executor discovery (NSS / CSS / HOST)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Cut the model into layers, test each on the NSS simulator, CSS (IREE vmvx) and "
                    "HOST (IREE llvm-cpu) against ONNX Runtime, and write\n"
                    "  <output-dir>/torq_gen_config_<stem>.json           (report: every result)\n"
                    "  <output-dir>/torq_gen_config_<stem>_compiler.json  (LINE:COL -> executor)\n"
                    "Integer outputs must match within ±1 LSB, float outputs within fp_max_tol "
                    "(relative). Exit 0 unless some layer runs on no executor.",
        epilog="example: torq-gen-config discover --model m.onnx --quantize --full-integer --skip-mode")
    add_common_args(p)
    p.add_argument("--skip-mode", action="store_true", help="stop at the first success per layer (nss, css, host)")
    p.add_argument("--skip-executors", metavar="LIST", help="comma list of executors never tested, e.g. css,host")
    p.add_argument("--skip-ops", metavar="LIST", help="comma list of ONNX op types to leave unassigned (null)")
    p.add_argument("--dedup-layers", action="store_true",
                   help="layers with the same signature (shapes, dtypes, op attributes) copy the first one's results")
    p.add_argument("--collect-timing", action="store_true", help="time every successful executor run")
    p.add_argument("--timing-runs", type=int, default=3, metavar="N", help="runs averaged with --collect-timing (default 3)")
    p.add_argument("--recommend-by-timing", action="store_true",
                   help="recommend the fastest success instead of the first (implies --collect-timing)")
    p.add_argument("--repro-dir", metavar="DIR", help="a self-contained bundle for every layer that is not a success")
    p.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                   help="test layers in N worker processes (default 1; results and files are identical)")
    p.add_argument("--save-bf16-model", metavar="PATH",
                   help="with --auto-convert-bf16: also write the converted bf16 model (ONNX) to PATH")
    p.set_defaults(func=cmd_discover)


def options_from_args(args) -> DiscoverOptions:
    if args.jobs < 1:
        raise TorqError(f"--jobs must be at least 1 (got {args.jobs})")
    if args.timing_runs < 1:
        raise TorqError(f"--timing-runs must be at least 1 (got {args.timing_runs})")
    model = Path(args.model)
    if not model.is_file():
        raise TorqError(f"--model {model}: no such file")
    timing = args.collect_timing or args.recommend_by_timing
    quant = quant_settings(args)
    if args.save_bf16_model and not quant.auto_convert_bf16:
        raise TorqError("--save-bf16-model needs --auto-convert-bf16")
    return DiscoverOptions(
        model=model, output_dir=Path(args.output_dir), quant=quant, skip_mode=args.skip_mode,
        skip_executors=parse_executors(args.skip_executors, "--skip-executors"),
        skip_ops=[s.strip() for s in (args.skip_ops or "").split(",") if s.strip()],
        dedup=args.dedup_layers, timing_runs=args.timing_runs if timing else 0,
        recommend_by_timing=args.recommend_by_timing, subgraph=(args.subgraph_from, args.subgraph_to),
        recompute_cache=args.recompute_cache, debug_ir=args.debug_ir, repro_dir=args.repro_dir,
        rounding=args.rounding, argv=getattr(args, "argv", sys.argv[1:]), jobs=args.jobs,
        save_bf16_model=args.save_bf16_model)


def cmd_discover(args) -> int:
    from .progress import layer_progress
    from .view import print_table
    opts = options_from_args(args)
    t0 = time.perf_counter()
    with layer_progress("discover") as bar:
        report, path = run_discovery(opts, bar)
    print_table(report)
    s = report["discovery_report"]["summary"]
    print(f"discover: {s['total_layers']} layers in {time.perf_counter() - t0:.1f} s "
          f"({s['computed']} tested, {s['from_cache']} executor results from cache) -> {path}")
    print(f"compiler map -> {schema.compiler_path(path)}")
    return 1 if report["has_critical_failures"] else 0
