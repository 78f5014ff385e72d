"""The issue's "must hold" table: ``discover --quantize --full-integer --quant-format F --skip-mode``
then ``run`` on the ResNet-18 and MobileNetV2 architectures (``torq.zoo``), for qdq, qoperator
and hybrid. Prints, per model x format: layers on NSS / CSS / HOST / none, run max |Δ| (LSB),
top-1 agreement with ORT, pass, and the wall times.

    PYTHONPATH=src python benchmarks/gen_config_zoo.py [--models resnet18,mobilenet_v2] [--jobs 2]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def one(model_path: Path, out: Path, fmt: str, jobs: int) -> dict:
    from torq.gen_config.discover import DiscoverOptions, run_discovery
    from torq.gen_config.options import QuantSettings
    from torq.quantize import Recipe
    from torq.gen_config.run import RunOptions, run_full
    quant = QuantSettings(quantize=True, recipe=Recipe(full_integer=True, format=fmt))
    t0 = time.perf_counter()
    report, _ = run_discovery(DiscoverOptions(model=model_path, output_dir=out, quant=quant, skip_mode=True, jobs=jobs))
    t1 = time.perf_counter()
    report, _ = run_full(RunOptions(model_path, out, quant))
    t2 = time.perf_counter()
    counts = report["discovery_report"]["summary"]["recommended_counts"]
    m = report["full_model_metrics"]
    none = sum(1 for op in report["ops"].values() if not op.get("recommended_executor"))
    return {**counts, "none": none, "layers": len(report["ops"]), "max_lsb": m["max_abs_lsb"],
            "top1": m.get("top1_agreement"), "passed": m["passed"], "discover_s": t1 - t0, "run_s": t2 - t1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--formats", default="hybrid,qdq,qoperator")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args()
    from torq import zoo
    from torq.fileio import save_model
    print("| model | format | layers | nss | css | host | none | run max |Δ| LSB | top-1 | pass | discover s | run s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("TORQ_GEN_CONFIG_CACHE_DIR", str(Path(tmp) / "cache"))
        for name in args.models.split(","):
            path = save_model(getattr(zoo, name)(), Path(tmp) / f"{name}.onnx")
            for fmt in args.formats.split(","):
                r = one(path, Path(tmp) / f"{name}_{fmt}", fmt, args.jobs)
                print(f"| {name} | {fmt} | {r['layers']} | {r['nss']} | {r['css']} | {r['host']} | {r['none']} | "
                      f"{r['max_lsb']:g} | {r['top1']} | {r['passed']} | {r['discover_s']:.1f} | {r['run_s']:.1f} |",
                      flush=True)


if __name__ == "__main__":
    main()
