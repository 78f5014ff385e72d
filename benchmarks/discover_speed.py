"""Wall time of ``discover --quantize --full-integer --skip-mode`` on the ResNet-18 architecture
(cold cache, warm cache) and of ``run``, side by side with the reference tool's style (every
layer compiled by IREE for every executor), measured on a few layers and extrapolated.

    PYTHONPATH=src python benchmarks/discover_speed.py [--hw 224] [--format hybrid] [--sample 3] [--jobs 1]

Prints seconds and the ratio reference-style / ours. Uses a fresh cache folder per run.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def _discover(model: Path, out: Path, fmt: str, jobs: int = 1):
    from torq.gen_config.discover import DiscoverOptions, run_discovery
    from torq.gen_config.options import QuantSettings
    from torq.quantize import Recipe
    opts = DiscoverOptions(model=model, output_dir=out, skip_mode=True,
                           quant=QuantSettings(quantize=True, recipe=Recipe(full_integer=True, format=fmt)), jobs=jobs)
    t0 = time.perf_counter()
    report, _ = run_discovery(opts)
    return time.perf_counter() - t0, report, opts


def _reference_style(model: Path, fmt: str, sample: int) -> tuple[float, int]:
    """Per layer: quantize + import + IREE compile for nss/css/host (3 compiles) + run; extrapolate."""
    from torq.gen_config.layer_test import prepare
    from torq.gen_config.options import QuantSettings
    from torq.quantize import Recipe
    from torq.graph import extract_layers
    from torq.gen_config.executors import iree
    layers = extract_layers(model)
    quant = QuantSettings(quantize=True, recipe=Recipe(full_integer=True, format=fmt))
    picks = layers[:: max(1, len(layers) // sample)][:sample]
    t0 = time.perf_counter()
    for layer in picks:
        p = prepare(layer.model, quant)
        if p.compiled is None:
            continue
        for backend in ("llvm-cpu", "vmvx", "llvm-cpu"):   # nss, css, host: one IREE compile each
            module = iree.compile_module(p.compiled.ir("linalg"), backend, None)
            module.run(p.compiled.feed(p.inputs))
    per_layer = (time.perf_counter() - t0) / len(picks)
    return per_layer * len(layers), len(layers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", type=int, default=224)
    ap.add_argument("--format", default="hybrid")
    ap.add_argument("--sample", type=int, default=3, help="layers timed for the reference-style estimate")
    ap.add_argument("--jobs", type=int, default=1, help="discover --jobs (worker processes)")
    args = ap.parse_args()
    from torq.fileio import save_model
    from torq.gen_config.run import RunOptions, run_full
    from torq.zoo import resnet18
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = str(tmp / "cache")
        model = save_model(resnet18(args.hw), tmp / "resnet18.onnx")
        cold, report, opts = _discover(model, tmp, args.format, args.jobs)
        warm, _, _ = _discover(model, tmp, args.format, args.jobs)
        t0 = time.perf_counter()
        report, _ = run_full(RunOptions(model, tmp, opts.quant))
        run_s = time.perf_counter() - t0
        ref, n = _reference_style(model, args.format, args.sample)
    s = report["discovery_report"]["summary"]
    m = report["full_model_metrics"]
    print(f"ResNet-18 ({args.hw}x{args.hw}, {args.format}, full-integer, skip-mode): {n} layers, "
          f"NSS {s['recommended_counts']['nss']}, CSS {s['recommended_counts']['css']}, HOST {s['recommended_counts']['host']}")
    print(f"discover cold  {cold:7.1f} s   (--jobs {args.jobs})")
    print(f"discover warm  {warm:7.1f} s   (cold / warm = {cold / warm:.1f}x)")
    print(f"run            {run_s:7.1f} s   max |Δ| {m['max_abs_lsb']:g} LSB, passed={m['passed']}")
    print(f"reference style (3 IREE compiles per layer, {args.sample} layers extrapolated) {ref:7.1f} s   "
          f"reference / ours cold = {ref / cold:.1f}x")


if __name__ == "__main__":
    main()
