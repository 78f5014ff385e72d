"""How much top-1 agreement with ORT a given rate of 1-LSB differences costs.

    python benchmarks/agreement_noise.py [--only fmnist|effnet] [--limit N] [--rates 3e-6,1e-6,3e-7,0]

The NSS in `ort` rounding is bit-exact with ONNX Runtime (100 % agreement). This script adds
random ±1 LSB changes to a fraction `rate` of every conv / fully-connected rescale output (the
ACT stage, `torq.runtime.ops._rescale`, wrapped for the run) and reports the top-1 agreement with
ORT's int8 model over the row's images, one line per rate. Native rounding differs from ORT on
~2.4e-6 of those outputs (`torq-compile --verify-against-ort` counts them), which tells how close
to ORT any executor with that many 1-LSB differences can be on top-1.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks" / "models"))


def noisy_rescale(orig, rate: float, rng, counts: list):
    def rescale(acc, attrs, requant, scale_bias, rounding, rtype):
        y = orig(acc, attrs, requant, scale_bias, rounding, rtype)
        n = rng.binomial(y.size, rate) if rate > 0 else 0
        if n:
            flat = y.reshape(-1).astype(np.int64)
            flat[rng.integers(0, y.size, n)] += rng.choice([-1, 1], n)
            y = np.clip(flat, attrs["output_min"], attrs["output_max"]).astype(y.dtype).reshape(y.shape)
        counts[0] += n
        counts[1] += y.size
        return y
    return rescale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="fmnist", choices=["fmnist", "effnet"])
    ap.add_argument("--limit", type=int, default=2000, help="evaluation images (default 2000)")
    ap.add_argument("--rates", default="3e-6,1e-6,3e-7,0", help="comma-separated change rates")
    args = ap.parse_args()
    import onnxruntime as ort
    ort.set_default_logger_severity(3)
    from build import build

    from torq.evaluate import EvalOptions
    from torq.data.datasets import load_dataset
    from torq.evaluate.engines import NssEngine, OrtEngine, quantize_input
    from torq.evaluate.run import batches, prepare, split
    from torq.quantize import io_quant_params
    from torq.runtime import ops

    entry = build(only=[args.only])[args.only]
    opts = EvalOptions().with_changes(preprocess=entry["preprocess"], calibration=entry["calibration"],
                                      limit=args.limit, batch=16)
    data, calib = split(load_dataset(entry["dataset"]), opts)
    _, q, name, shape, _, _ = prepare(entry["model"], data, calib, opts)
    qin = io_quant_params(q)["inputs"][name]
    xs = [quantize_input(x, qin["scale"], qin["zero_point"]) for _, x in batches(data, opts, name, shape)]
    ort_top1 = np.concatenate([OrtEngine(q)(x) for x in xs]).argmax(1)
    orig = ops._rescale
    try:
        for rate in (float(r) for r in args.rates.split(",")):
            counts = [0, 0]
            ops._rescale = noisy_rescale(orig, rate, np.random.default_rng(0), counts)
            nss = NssEngine(q, opts.batch, rounding="ort", threads=1)
            top1 = np.concatenate([nss(x) for x in xs]).argmax(1)
            print(f"{args.only}: rate {rate:g} ({counts[0]} of {counts[1]} outputs changed): "
                  f"top-1 agreement with ORT {100 * np.mean(top1 == ort_top1):.2f} % over {len(top1)} images")
    finally:
        ops._rescale = orig


if __name__ == "__main__":
    main()
