"""How fast ``evaluate`` runs EfficientNet-Lite0 on the ImageNet sample, and where its wall time goes.

    .venv/bin/python benchmarks/evaluate_speed.py [--batch 16] [--limit N] [--threads T]
                                                  [--model PATH --dataset SPEC --calibration SPEC]

Runs ``torq.evaluate.evaluate`` as ``torq-gen-config evaluate`` runs it (the recommended recipe,
``--preprocess resize=256,crop=224,norm=tf``, calibrated on the photos of ``make bench-models``;
the row "effnet" of build/bench-models/manifest.json) and prints, from that one run:

  images/s per path as evaluate measures them (its engine calls: FP32 and INT8 by ONNX Runtime,
  INT8 on the NSS), and each path's time as a multiple of ORT FP32's (below 1: faster);
  the command's wall time in its parts: set-up (reading the model and data list, quantization
  with calibration, compiling), the ORT pass (decoding and preprocessing every image, FP32 and
  INT8 ORT, per-layer SQNR), the NSS pass (decoding every image again, the NSS), the rest
  (report); and images/s of the NSS pass with its decoding counted;
  the host load before and after (a loaded host slows every part).

The issue-20 must-hold is evaluate's INT8 (NSS) figure: >= 250 images/s on 2 cores (goal 400).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MUST_HOLD, GOAL = 250.0, 400.0


def _row() -> dict:
    manifest = REPO / "build" / "bench-models" / "manifest.json"
    if manifest.is_file():
        return json.loads(manifest.read_text()).get("effnet", {})
    return {}


def main(argv=None) -> int:
    row = _row()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=row.get("model", str(REPO / "build" / "bench-models" / "effnet_lite0.onnx")))
    ap.add_argument("--dataset", default=row.get("dataset", str(REPO.parent / "shared" / "data" / "imagenet-sample")))
    ap.add_argument("--calibration", default=row.get("calibration"), help="calibration SPEC (default: the manifest's)")
    ap.add_argument("--preprocess", default=row.get("preprocess", "resize=256,crop=224,norm=tf"))
    ap.add_argument("--batch", type=int, default=16, help="images per NSS call (default 16, as docs/accuracy.md)")
    ap.add_argument("--limit", type=int, help="only the first N images")
    ap.add_argument("--threads", type=int, default=0, help="NSS threads (default 0: every core)")
    args = ap.parse_args(argv)
    if not Path(args.model).is_file() or not args.calibration:
        print(f"{args.model}: not found, or no calibration data (make bench-models)", file=sys.stderr)
        return 2

    from torq.evaluate import EvalOptions, evaluate
    from torq.evaluate import run as ev_run
    from torq.quantize.recipe_flags import load_recipe

    parts: dict = {}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                parts[name] = time.perf_counter() - t0
        return wrapper
    ev_run._run_ort_paths = timed("ORT pass", ev_run._run_ort_paths)
    ev_run._run_nss_path = timed("NSS pass", ev_run._run_nss_path)

    load0 = os.getloadavg()
    recipe = load_recipe("recommended").replace(preprocess=args.preprocess, calibration_data=args.calibration)
    opts = EvalOptions(recipe=recipe, batch=args.batch, limit=args.limit, threads=args.threads, progress=False)
    t0 = time.perf_counter()
    r = evaluate(args.model, args.dataset, options=opts)
    wall = time.perf_counter() - t0
    n = r.images
    print(f"evaluate {Path(args.model).name} on {n} images of {args.dataset}, --batch {args.batch}, "
          f"{os.cpu_count()} CPUs; host load (1, 5, 15 min) before {_load(load0)}, after {_load(os.getloadavg())}")
    print(f"  {'path':22s}{'images/s':>10s}{'time x ORT fp32':>17s}   (evaluate's own figures: engine calls only)")
    for path, label in (("fp32", "FP32 (ORT)"), ("int8_ort", "INT8 (ORT)"), ("int8_nss", "INT8 (NSS native)")):
        print(f"  {label:22s}{r.images_per_s(path):10.1f}{r.seconds[path] / max(r.seconds['fp32'], 1e-9):17.2f}")
    rest = wall - sum(parts.values())
    print(f"  whole command {wall:.1f} s = {n / wall:.1f} images/s: set-up + report {rest:.1f} s, "
          f"ORT pass {parts.get('ORT pass', 0):.1f} s, NSS pass {parts.get('NSS pass', 0):.1f} s "
          f"(= {n / max(parts.get('NSS pass', 0), 1e-9):.1f} images/s with its decoding)")
    nss = r.images_per_s("int8_nss")
    verdict = "holds" if nss >= MUST_HOLD else "DOES NOT hold"
    print(f"must-hold (issue 20) evaluate INT8 (NSS) >= {MUST_HOLD:.0f} images/s: {nss:.1f} -> {verdict}"
          f" (goal {GOAL:.0f}); top-1 NSS {100 * r.accuracy('int8_nss')['top1']:.2f} %, "
          f"NSS vs ORT agreement {100 * r.agreement('int8_nss', 'int8_ort'):.2f} %")
    return 0


def _load(v) -> str:
    return ", ".join(f"{x:.2f}" for x in v)


if __name__ == "__main__":
    sys.exit(main())
