"""Cost of crash isolation: ResNet-18 compile with torch-mlir in a forked child vs in process.

    .venv/bin/python benchmarks/compile_isolation.py [--rounds 5] [--hw 224]

Builds ResNet-18 (torq.zoo, A8W8 QDQ full-integer, as benchmarks/nss_speed.py), then compiles it
`rounds` times in each mode, interleaved (TORQ_ISOLATE=1 default / 0 in process) so host noise hits
both alike, next to ONNX Runtime creating a session for the same model (its own "compile").
Prints the median of each stage and the ratios isolated / in-process and compile / ORT session.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hw", type=int, default=224)
    args = ap.parse_args(argv)

    import torq
    from torq import zoo
    from torq.compiler import compile as compile_model
    from torq import reference

    with tempfile.TemporaryDirectory() as d:
        fp32 = Path(d) / "resnet18.onnx"
        onnx.save(zoo.resnet18(args.hw), fp32)
        q = torq.quantize(fp32, full_integer=True, num_calib=2)
    compile_model(q)                                   # warm-up: imports, numba caches
    times: dict[str, list[dict[str, float]]] = {"isolated": [], "in-process": []}
    ort_s = []
    for _ in range(args.rounds):
        for mode, flag in (("isolated", "1"), ("in-process", "0")):
            os.environ["TORQ_ISOLATE"] = flag
            t = time.perf_counter()
            c = compile_model(q)
            times[mode].append({**c.timings, "total_s": time.perf_counter() - t})
        t = time.perf_counter()
        reference.session(q)
        ort_s.append(time.perf_counter() - t)
    os.environ.pop("TORQ_ISOLATE", None)

    def med(mode, key):
        return statistics.median(r[key] for r in times[mode])

    keys = list(times["isolated"][0])
    print(f"ResNet-18 {args.hw}x{args.hw}, {args.rounds} interleaved rounds, medians (s)")
    print(f"{'stage':<12}" + "".join(f"{k:>12}" for k in keys))
    for mode in times:
        print(f"{mode:<12}" + "".join(f"{med(mode, k):>12.3f}" for k in keys))
    iso = med("isolated", "import_s") + med("isolated", "linalg_s")
    inp = med("in-process", "import_s") + med("in-process", "linalg_s")
    print(f"torch-mlir import+linalg: isolated {iso:.3f} s, in process {inp:.3f} s, ratio {iso / inp:.2f}x")
    print(f"total compile: isolated/in-process {med('isolated', 'total_s') / med('in-process', 'total_s'):.2f}x; "
          f"isolated compile / ORT session creation ({statistics.median(ort_s):.3f} s) "
          f"{med('isolated', 'total_s') / statistics.median(ort_s):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
