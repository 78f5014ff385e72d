"""The native engine against the reference engine on every model at hand, both roundings:
bit-identical outputs or a DIFF line (the zoo half of issue 20's must-hold; the small models
are in `make test`).

    .venv/bin/python benchmarks/native_identity.py [--zoo build/zoo] [--images 2] [--hw 224]

Models: the torq.zoo stand-ins (ResNet-18, MobileNetV2), every ``*.onnx`` in --zoo (``make zoo``
exports the torchvision architectures there) and the benchmark models of ``make bench-models``
(``build/bench-models``). Each is quantized (A8W8 QDQ full-integer, per-channel, 8 synthetic
calibration samples; a model with ops that have no integer form -- LayerNorm, Softmax in ViT and
ConvNeXt -- with those left float and run in bf16 on the NSS), compiled, and run on --images random int8 images by both engines. Prints
per model: steps on native kernels / all steps, identical or not, and the time of each engine.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx

import torq
from torq import zoo
from torq.runtime.nss import Simulator

REPO = Path(__file__).resolve().parents[1]
FLOAT_OPS = ("LayerNormalization", "Softmax")    # left float by ORT, then bf16 on the NSS (int8 + bf16 model)


def models(zoo_dir: Path, bench_dir: Path):
    yield "resnet18 (torq.zoo)", lambda: zoo.resnet18(224)
    yield "mobilenet_v2 (torq.zoo)", lambda: zoo.mobilenet_v2(224)
    for d in (zoo_dir, bench_dir):
        for p in sorted(d.glob("*.onnx")) if d.is_dir() else []:
            yield p.name, (lambda p=p: onnx.load(str(p)))


def check(load, images: int) -> str:
    from torq.evaluate.engines import with_batch
    from torq.quantize.dead_channels import zero_dead_channels
    from torq.quantize.fold import fold_fp32
    t0 = time.perf_counter()
    fp32, _ = zero_dead_channels(fold_fp32(load()))          # the front end `evaluate` uses
    q = torq.quantize(with_batch(fp32, 1), full_integer=True, per_channel=True, num_calib=8)
    c = torq.compile(q)
    kept = [t for t in FLOAT_OPS if any(n.op_type == t for n in fp32.graph.node)]
    if c.report.unsupported and kept:      # LayerNorm / Softmax: no integer form -> bf16 on the NSS
        from torq.graph.bf16 import bf16_float_ops
        q = bf16_float_ops(torq.quantize(with_batch(fp32, 1), full_integer=True, per_channel=True,
                                         num_calib=8, op_types_to_exclude=kept))
        c = torq.compile(q)
    if c.report.unsupported:
        return f"not compiled: {c.report.unsupported[0]}"
    prep = time.perf_counter() - t0
    ref, nat = Simulator(c.program, "reference"), Simulator(c.program, "native")
    rng = np.random.default_rng(0)
    xs = [[rng.integers(-128, 128, p.shape).astype(np.int8) if np.dtype(p.onnx_dtype).kind in "iu"
           else rng.standard_normal(p.shape).astype(np.float32) for p in c.program.inputs] for _ in range(images)]
    diffs, t = [], {"reference": 0.0, "native": 0.0}
    for rounding in ("native", "ort"):
        for x in xs:
            outs = {}
            for name, sim in (("reference", ref), ("native", nat)):
                t1 = time.perf_counter()
                outs[name] = sim.run(x, rounding)
                t[name] += time.perf_counter() - t1
            if not all(np.array_equal(a, b) for a, b in zip(outs["reference"], outs["native"])):
                diffs.append(rounding)
    n = 2 * images
    verdict = "identical" if not diffs else f"DIFFERENT ({', '.join(sorted(set(diffs)))})"
    return (f"{verdict:10s} native steps {nat.native_steps}/{len(nat.kernels)}; per run reference "
            f"{t['reference'] / n * 1e3:.0f} ms, native {t['native'] / n * 1e3:.0f} ms (prepare {prep:.0f} s)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", type=Path, default=REPO / "build" / "zoo")
    ap.add_argument("--bench", type=Path, default=REPO / "build" / "bench-models")
    ap.add_argument("--images", type=int, default=2)
    args = ap.parse_args(argv)
    bad = 0
    for name, load in models(args.zoo, args.bench):
        try:
            line = check(load, args.images)
        except Exception as e:  # noqa: BLE001 - a model the pipeline refuses is reported, not fatal
            line = f"skipped: {type(e).__name__}: {' '.join(str(e).split())[:150]}"
        bad += line.startswith("DIFFERENT")
        print(f"{name:34s} {line}", flush=True)
    print("all identical" if not bad else f"{bad} model(s) DIFFERENT")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
