"""``torq-gen-config discover``: which executor (NSS / CSS / HOST) can run each layer.

Each layer is cut from the fp32 model, quantized on its own (``--quantize``; lone Relu/Flatten/...
wrapped in Q/DQ), run by ONNX Runtime as reference and by each executor in nss -> css -> host
order, compared, and recorded. Both JSON files are rewritten atomically after every layer, and
results are cached by content, so an interrupted discover simply resumes.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .._version import __version__
from ..errors import TorqError
from ..fileio import refuse_overwrite, safe_name
from ..workers import WorkerPool, cap_jobs
from . import layer_test, mapping, schema, store
from .cache import ResultCache
from .executors import EXECUTOR_ORDER
from .options import (QuantSettings, add_common_args, cache_dir, check_output_dir, parse_executors,
                      note_inert_flags, quant_settings, resolve_model, use_engine)


SAVE_EVERY_S = 1.0
#: Fault injection for tests: ``TORQ_DISCOVER_KILL_AFTER=N`` makes discover SIGKILL itself once N
#: layers are on disk (a discover killed mid-way, at a known point whatever the machine's speed).
_KILL_AFTER = int(os.environ["TORQ_DISCOVER_KILL_AFTER"]) if os.environ.get("TORQ_DISCOVER_KILL_AFTER") else None


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
    fresh: bool = False
    save_bf16_model: str | None = None
    ray: object = None          # --ray: True (local instance) or a cluster address


@dataclass
class Context:
    opts: DiscoverOptions
    report: dict
    path: Path
    cache: ResultCache
    computed: int = 0
    done: dict = field(default_factory=dict)     # layer id -> the executor discover recommends
    saved_at: float = 0.0


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
            from ..graph.input_shape import static_shapes
            from ..quantize.recipe import front_end, load_fp32, prepare, source
            model, _ = source(quant.recipe, model, str(model_path)) if quant.quantize else \
                load_fp32(model, str(model_path), quant.recipe.input_shape)
            static_shapes(model, str(model_path))     # a size still open: say so before cutting layers
            model = prepare(quant.recipe, model, where=str(model_path)) if quant.quantize \
                else front_end(quant.recipe, model, str(model_path))
        _PREPARED.clear()
        _PREPARED[key] = model
    return _PREPARED[key]


def layer_places(layers, build_full, key: dict, recompute: bool) -> list:
    """``mapping.map_layers`` of the (quantized) full model, cached by fingerprint: a warm
    discover neither re-quantizes nor re-imports the full model. A cached map is used only when
    it is sealed for this key and has one valid place per layer (else it is recomputed)."""
    import hashlib
    import json
    from .cache import read_sealed, write_sealed
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    path = cache_dir() / "maps" / f"{digest}.json"
    places = None if recompute else read_sealed(path, "torq-map", digest)
    if _valid_places(places, len(layers)):
        return [tuple(p) for p in places]
    places = mapping.map_layers([lay.op_type for lay in layers], locations(build_full()))
    write_sealed(path, "torq-map", digest, [list(p) for p in places])
    return places


def _valid_places(places, n: int) -> bool:
    return isinstance(places, list) and len(places) == n and all(
        isinstance(p, list) and len(p) == 2
        and (p[0] is None or (isinstance(p[0], int) and not isinstance(p[0], bool) and p[0] >= 0))
        and (p[1] is None or isinstance(p[1], str)) for p in places)


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
    if sel.isascii() and sel.isdigit():
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
    from ..progress import stage
    stem = opts.model.stem
    check_output_dir(opts.output_dir)
    with stage("discover: cutting the model into layers"):
        layers, suffix, build_full = model_and_layers(opts.model, opts.quant, opts.subgraph, lazy=True)
    if opts.save_bf16_model:
        from ..fileio import save_model
        refuse_overwrite(opts.save_bf16_model, "--save-bf16-model", {"--model": opts.model})
        save_model(build_full(), Path(opts.save_bf16_model))
    path = schema.report_path(opts.output_dir, stem, suffix)
    refuse_overwrite(path, "--output-dir", {"--model": opts.model, "--calibration-data": opts.quant.recipe.calibration_data})
    from ..quantize.model_cache import recomputing
    with store.session(path, "discover", exclusive=True), recomputing(opts.recompute_cache):
        return _discover(opts, layers, build_full, path, progress)


def _discover(opts: DiscoverOptions, layers, build_full, path: Path, progress) -> tuple[dict, Path]:
    from ..progress import stage
    report = _start_report(path, opts.model.stem, opts)
    map_key = {"fingerprint": report["quantization"], "layers": [lay.id for lay in layers], "v": __version__}
    with stage("discover: the whole model (quantize, import: each layer's MLIR location)"):
        places = layer_places(layers, build_full, map_key, opts.recompute_cache)
    ctx = Context(opts, report, path, ResultCache(cache_dir(), opts.recompute_cache))
    plan = _plan(ctx, layers)
    tested = [lay for lay, why in zip(layers, plan) if why == "test"]
    with stage("discover: calibration data of each layer"):
        calib = _layer_calibration(opts, tested)
    qkey = dict(report["quantization"], model_sha256=None) if opts.quant.quantize else \
        {"auto_convert_bf16": True} if opts.quant.auto_convert_bf16 else None
    work = [(opts, lay, schema.tolerance(report, lay.id), calib.get(lay.id), qkey) for lay in tested]
    with _results(opts, work) as results:
        for i, (layer, (k, loc), why) in enumerate(zip(layers, places, plan)):
            if progress:
                progress(i, len(layers), layer.id)
            entry = ctx.report["ops"].setdefault(layer.id, {"executors": {}})
            entry["_node_index"] = k if opts.quant.quantize else layer.node_index
            entry["_orig_index"] = layer.node_index
            entry["mlir_location"] = loc if loc else layer.op_type
            _set_macs(entry, layer)
            if opts.quant.quantize:
                from ..quantize.recipe import layer_precision
                entry["precision"] = layer_precision(opts.quant.recipe, layer.node_name)
            _fill(ctx, layer, entry, why, results)
            _save(ctx, final=_KILL_AFTER is not None)
            if _KILL_AFTER is not None and len(ctx.done) >= _KILL_AFTER:
                os.kill(os.getpid(), signal.SIGKILL)     # fault injection: die with N layers on disk
    if progress:
        progress(len(layers), len(layers), "")
    ctx.report["discovery_report"]["summary"].update(computed=ctx.computed, from_cache=ctx.cache.hits)
    _save(ctx, final=True)
    return ctx.report, path


def _save(ctx: Context, final: bool = False) -> None:
    """Merge what discover has so far into the report on disk (at most once a second, and at
    the end): edits made meanwhile are kept, and shown in ``ctx.report``."""
    if not final and time.monotonic() - ctx.saved_at < SAVE_EVERY_S:
        return
    counts = {k: ctx.report["discovery_report"].get("summary", {}).get(k) for k in ("computed", "from_cache")}

    def merge(disk):
        out = store.merge_discovered(disk, ctx.report, ctx.done)
        if final:
            out["discovery_report"]["summary"].update(counts)
        return out
    merged = store.update(ctx.path, merge)
    ctx.report = merged
    ctx.saved_at = time.monotonic()


def _set_macs(entry: dict, layer) -> None:
    """``mac_count`` as the reference writes it (left out when a shape is not static)."""
    from ..graph.macs import model_macs
    n = model_macs(layer.model)
    if n is None:
        entry.pop("mac_count", None)
    else:
        entry["mac_count"] = n


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
    """Results of ``_test_executors`` in order: in process, from ``--jobs`` worker processes
    (a worker that dies is noticed: its layer is retried once, then named in a one-line error),
    or from Ray tasks (``--ray``)."""
    if opts.ray:
        yield _ray_results(opts, work)
        return
    jobs = cap_jobs(opts.jobs, len(work))
    if jobs <= 1 or len(work) < 2:
        yield map(_work, work)
        return
    with WorkerPool(jobs, what="discover") as pool:
        yield pool.map(_work, work, label=lambda w: f"testing layer {w[1].id!r}")


def _work(args):
    return _test_executors(*args)


def _ray_work(cache_root: str, engine: str | None, *args):
    """One layer's test in a Ray worker, against the driver's cache folder (the same one on this
    machine or a shared file system; elsewhere a folder of that name)."""
    os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = cache_root
    if engine:
        os.environ["TORQ_ENGINE"] = engine
    return _test_executors(*args)


def _ray_results(opts: DiscoverOptions, work: list):
    """Layer results from Ray tasks, in order; each is also written to this process's cache (the
    shared truth: a rerun, local or distributed, finds it)."""
    from .. import cluster
    cache = ResultCache(cache_dir(), False)
    args = [(str(cache_dir()), os.environ.get("TORQ_ENGINE"), *w) for w in work]
    for w, (results, computed, hits) in zip(work, cluster.ordered(_ray_work, args, opts.ray)):
        key = _layer_key(cache, *w)
        for ex, r in results.items():
            if not cache.path(key, ex).exists():
                cache.put(key, ex, r)
        yield results, computed, hits


def _start_report(path: Path, stem: str, opts: DiscoverOptions) -> dict:
    """The existing report for the same model and flags, to merge into (its edits are kept);
    a new one when there is none or with ``--fresh`` (the old one kept as ``<report>.json.bak``).
    A report of other flags, or a damaged one, is refused unless ``--fresh``."""
    fingerprint = opts.quant.fingerprint(opts.model)
    try:
        old = store.read(path)
        why = None if old is None else _other_flags(old.get("quantization"), fingerprint)
    except TorqError as e:
        old, why = None, f"it is damaged ({e})"
    if why is not None and not opts.fresh:
        raise TorqError(f"{path} exists and {why}; discover will not replace it: pass --fresh to start "
                        f"over (the old report is kept as {path.name}.bak), or use another --output-dir")
    if opts.fresh and path.exists():
        with store.write_lock(path):
            store.backup(path)
        old = None
    if old is None:
        return schema.new_report(stem, fingerprint)
    for op in old["ops"].values():
        for ex in opts.skip_executors:
            op["executors"].pop(ex, None)
    return old


def _other_flags(got, expected: dict) -> str | None:
    from .options import fingerprint_mismatch
    if got == expected:
        return None
    if not isinstance(got, dict):
        return "has no quantization fingerprint (not made by this discover)"
    return fingerprint_mismatch(got, expected, "it", limit=160, tail="")


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
        ctx.done[layer.id] = None
        return
    if why == "test":
        entry["executors"], computed, hits = next(results)
        ctx.computed += computed
        ctx.cache.hits += hits
    else:
        src = ctx.report["ops"][why[1]]
        entry["executors"] = {e: dict(r) for e, r in src["executors"].items()}
        entry["duplicate_of"] = why[1]
    rec = schema.recommend(entry["executors"], ctx.opts.recommend_by_timing)
    ctx.done[layer.id] = rec
    entry["recommended_executor"] = store.edited_executor(entry, rec)


def _test_executors(opts: DiscoverOptions, layer, tol: dict, calib=None, qkey=None) -> tuple[dict, int, int]:
    """(results per executor, 1 if the layer was tested here else 0, cache hits). Runs in workers.

    Cache key: the layer's bytes + ``qkey`` (quantization flags and calibration data hash) + the
    rest of the flags that change a result."""
    cache = ResultCache(cache_dir(), opts.recompute_cache)
    key = _layer_key(cache, opts, layer, tol, calib, qkey)
    prepared, results = None, {}
    for ex in [e for e in EXECUTOR_ORDER if e not in opts.skip_executors]:
        r = cache.get(key, ex, tol)
        if r is None:
            if prepared is None:
                prepared = layer_test.prepare(layer.model, opts.quant, opts.debug_ir, safe_name(layer.id), calib)
            r = layer_test.run_executor(prepared, ex, tol, cache.root, opts.rounding, opts.timing_runs)
            if r["status"] == "error":
                layer_test.check_host(cache.root)    # a full disk is the machine's fault, not the layer's
            cache.put(key, ex, r)
        results[ex] = r
        if opts.skip_mode and r["status"] == "success":
            break
    if opts.repro_dir and any(r["status"] != "success" for r in results.values()):
        prepared = prepared or layer_test.prepare(layer.model, opts.quant, None, "layer", calib)
        layer_test.write_repro(Path(opts.repro_dir), layer.id, prepared, results, opts.argv)
    return results, int(prepared is not None), cache.hits


def _layer_key(cache: ResultCache, opts: DiscoverOptions, layer, tol: dict, calib=None, qkey=None) -> str:
    flags = {"quant": qkey, "tol": tol,
             "timing_runs": opts.timing_runs, "rounding": opts.rounding, "seed": layer_test.SEED}
    return cache.key(layer.model.SerializeToString(), flags)


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
    p.add_argument("--skip-mode", "--executor-skip-mode", dest="skip_mode", action="store_true",
                   help="stop at the first success per layer (nss, css, host)")
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
                   help="test layers in N worker processes (default 1; at most one per core and per layer; "
                        "results and files are identical)")
    p.add_argument("--fresh", "--force", action="store_true",
                   help="start a new report (the existing one, even of other flags or damaged, is kept as "
                        "<report>.json.bak); without it discover merges into the existing report and keeps "
                        "its edits")
    p.add_argument("--save-bf16-model", metavar="PATH",
                   help="with --auto-convert-bf16: also write the converted bf16 model (ONNX) to PATH")
    p.set_defaults(func=cmd_discover)


def options_from_args(args) -> DiscoverOptions:
    if args.jobs < 1:
        raise TorqError(f"--jobs must be at least 1 (got {args.jobs})")
    if args.ray and args.jobs > 1:
        raise TorqError("--ray and --jobs exclude each other (Ray workers are the jobs)")
    use_engine(args.engine)
    if args.timing_runs < 1:
        raise TorqError(f"--timing-runs must be at least 1 (got {args.timing_runs})")
    model = resolve_model(args.model)
    note_inert_flags(args)
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
        rounding=args.rounding, argv=getattr(args, "argv", sys.argv[1:]), jobs=args.jobs, fresh=args.fresh,
        save_bf16_model=args.save_bf16_model, ray=args.ray)


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
