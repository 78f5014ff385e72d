"""Which calibration earns its keep: MinMax / Entropy / Percentile × per-tensor / per-channel,
with and without cross-layer equalization (CLE) and bias correction (BC).

    python benchmarks/calibration.py [--only effnet|fmnist|digits ...] [--limit N] [--json OUT]
    python benchmarks/calibration.py --setting minmax:pc:cle:bc --setting minmax:pt:cle-skip

For each benchmark model (benchmarks/models/build.py) and each setting, quantizes with the
row's held-apart calibration images and measures FP32 vs INT8 top-1 on the evaluation images
with ONNX Runtime (the NSS follows INT8-ORT within its measured agreement, see
benchmarks/accuracy.py), all in one run. Prints one table: top-1 %, and the drop vs FP32 in points.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks" / "models"))

METHODS = ("minmax", "entropy", "percentile")
CACHE_BYTES = 1 << 30                      # keep preprocessed evaluation images in memory up to this


def sweep(entry: dict, limit: int | None, num_calib: int, settings) -> dict:
    from torq.evaluate import EvalOptions, load_dataset
    from torq.evaluate.engines import OrtEngine, quantize_input
    from torq.evaluate.run import batches, prepare, split
    from torq.quantize import io_quant_params
    results = {}
    fp32_top1, cached = None, None
    for per_channel, method, equalize, bias_correction in settings:
        opts = EvalOptions().with_changes(preprocess=entry["preprocess"], batch=64, limit=limit,
                                          calibration=entry["calibration"], num_calib=num_calib,
                                          per_channel=per_channel, calibrate_method=method, equalize=equalize,
                                          bias_correction=bias_correction)
        data, calib = split(load_dataset(entry["dataset"]), opts)
        fp32, q, name, shape, _, _ = prepare(entry["model"], data, calib, opts)
        qin = io_quant_params(q)["inputs"][name]
        i8 = OrtEngine(q)
        if fp32_top1 is None:              # same images in every setting: FP32 once
            f = OrtEngine(fp32)
            fp32_top1 = sum(np.sum(np.argmax(f(x), 1) == data.labels[s:s + len(x)])
                            for s, x in batches(data, opts, name, shape)) / len(data)
            if len(data) * np.prod(shape) * 4 <= CACHE_BYTES:      # preprocessed images, reused
                cached = list(batches(data, opts, name, shape))
        hits = 0
        for start, x in cached or batches(data, opts, name, shape):
            labels = data.labels[start:start + len(x)]
            hits += np.sum(_top1(i8(quantize_input(x, qin["scale"], qin["zero_point"]))) == labels)
        key = f"{method} {'per-channel' if per_channel else 'per-tensor'}" + _suffix(equalize, bias_correction)
        results[key] = hits / len(data)
        print(f"  {key}: {100 * hits / len(data):.2f} (fp32 {100 * fp32_top1:.2f})", file=sys.stderr)
    return {"images": len(data), "fp32": float(fp32_top1), "int8_ort": {k: float(v) for k, v in results.items()}}


def _suffix(equalize, bias_correction) -> str:
    cle = {False: "", True: " +CLE", "skip": " +CLE(skip ReLU6)"}[equalize]
    return cle + (" +BC" if bias_correction else "")


def _settings(given):
    """METHOD:pc|pt[:cle|:cle-skip][:bc] -> (per_channel, method, equalize, bias_correction)."""
    if not given:
        return [(pc, m, False, False) for pc in (False, True) for m in METHODS]
    out = []
    for g in given:
        method, granularity, *extra = g.split(":")
        if granularity not in ("pc", "pt") or not set(extra) <= {"cle", "cle-skip", "bc"}:
            raise SystemExit(f"calibration.py: error: --setting {g!r}: expected METHOD:pc|pt[:cle|:cle-skip][:bc]")
        equalize = "skip" if "cle-skip" in extra else "cle" in extra
        out.append((granularity == "pc", method, equalize, "bc" in extra))
    return out


def _top1(logits):
    from torq.evaluate.metrics import topk
    return topk(logits, 1)[:, 0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=["effnet", "fmnist", "digits"])
    ap.add_argument("--limit", type=int)
    ap.add_argument("--num-calib", type=int, default=100)
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--setting", action="append", metavar="METHOD:pc|pt[:cle][:bc]",
                    help="only these settings, e.g. minmax:pc:cle:bc (cle: cross-layer equalization, ReLU6 "
                         "pairs bounded by calibration; cle-skip: ReLU6 pairs left alone; bc: bias correction; "
                         "default: all 3 methods × pt/pc)")
    args = ap.parse_args()
    import onnxruntime as ort
    ort.set_default_logger_severity(3)
    from build import build
    rows = {}
    for name, entry in build(only=args.only or ["effnet", "fmnist"]).items():
        print(f"{name}:", file=sys.stderr)
        rows[name] = sweep(entry, args.limit, args.num_calib, _settings(args.setting))
    settings = list(next(iter(rows.values()))["int8_ort"])
    print("| model | images | FP32 | " + " | ".join(settings) + " |")
    print("|" + "---|" * (3 + len(settings)))
    for name, r in rows.items():
        print(f"| {name} | {r['images']} | {100 * r['fp32']:.2f} | " + " | ".join(
            f"{100 * v:.2f} ({100 * (v - r['fp32']):+.2f})" for v in r["int8_ort"].values()) + " |")
    if args.json:
        from torq.fileio import atomic_write_json
        atomic_write_json(args.json, rows)


if __name__ == "__main__":
    main()
