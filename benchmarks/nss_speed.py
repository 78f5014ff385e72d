"""NSS speed, both engines, side by side with ONNX Runtime: ResNet-18, MobileNetV2 and
EfficientNet-Lite0 at batch 1 and 8, in one run.

    .venv/bin/python benchmarks/nss_speed.py [--models resnet18,mobilenetv2,effnet] [--batches 1,8]
                                             [--effnet PATH] [--per-tensor] [--rounds 5] [--threads 2]

Prints the CPU and its int8 features, the host load (a loaded host slows every variant, and
2-thread runs most: compare the same-round ratios, not the milliseconds), how long the native
kernels take to build at first use and to load when cached, then per model and batch:

  ORT fp32            the float model (intra_op = --threads)
  ORT int8            the full-integer QDQ model, default session (on x86 ORT fuses only part of an
                      S8S8 QDQ graph and runs the rest as DQ -> fp32 Conv -> Q)
  ORT int8 all-int    the same model with `session.qdqisint8allowed=1` (every kernel integer: the
                      session torq verifies against)
  NSS reference       torq's numpy simulator (``--engine reference``)
  NSS native          the native engine (int8 C kernels, AVX512-VNNI where the CPU has it)

Both NSS variants run as ``evaluate`` runs them (``NssEngine``: a batch as sub-batches side by
side on every core; batch 1 as one call whose native kernels use every core). Every variant is
timed round-robin (each round visits each variant: a slow period hits all alike); the ratios
are medians of same-round ratios. Numerics: the native engine must equal the reference engine
in both roundings, and NSS ``ort`` rounding must equal the all-integer ORT session bit for bit.

ResNet-18 and MobileNetV2 are ``torq.zoo`` stand-ins (random weights: speed only);
EfficientNet-Lite0 is the pretrained model of benchmarks/models/build.py (``make bench-models``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from rich.console import Console

import torq
from torq import zoo
from torq.evaluate.engines import NssEngine, with_batch
from torq.quantize import io_quant_params
from torq.runtime import native

REPO = Path(__file__).resolve().parents[1]
err = Console(stderr=True)
VARIANTS = ("ORT fp32", "ORT int8", "ORT int8 all-int", "NSS reference", "NSS native")


def host_summary() -> list[str]:
    from torq.runtime.native.build import cpu_flags
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next(ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name"))
    except (OSError, StopIteration):
        model = "?"
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    amx = ("" if "amx_int8" not in cpu_flags() else
           " (AMX tiles in use for wide convolutions)" if native.amx() else " (AMX not granted / disabled)")
    return [f"CPU {model}, {os.cpu_count()} CPUs; int8 features: {native.int8_features()}{amx}",
            f"host load average (1, 5, 15 min): {load}   <- ratios are same-round; ms move with load",
            f"ORT {ort.__version__}; numpy {np.__version__}; native engine: " + native_status()]


def native_status() -> str:
    """Build the native kernels into a fresh cache (first use), then load them from it (warm)."""
    from torq.runtime.native import build
    if native.library() is None:
        return f"unavailable ({native.why()}): NSS native = NSS reference"
    old = os.environ.get("TORQ_CACHE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TORQ_CACHE_DIR"] = tmp
        try:
            t0 = time.perf_counter()
            build._load()
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            build._load()
            warm = time.perf_counter() - t0
        finally:
            if old is None:
                os.environ.pop("TORQ_CACHE_DIR")
            else:
                os.environ["TORQ_CACHE_DIR"] = old
    isa = ("AVX512-VNNI" + (" + AMX-INT8" if native.amx() else "")) if native.vnni() else "portable C"
    return f"{isa} kernels; first-use build {cold:.2f} s, cached load {warm * 1e3:.0f} ms"


def load_fp32(name: str, effnet: Path, batch: int):
    """(fp32 model at ``batch``, title), or (None, reason)."""
    if name == "resnet18":
        return with_batch(zoo.resnet18(224), batch), "ResNet-18 stand-in (torq.zoo, random weights)"
    if name == "mobilenetv2":
        return with_batch(zoo.mobilenet_v2(224), batch), "MobileNetV2 stand-in (torq.zoo, random weights)"
    if name == "effnet":
        if not effnet.is_file():
            return None, f"EfficientNet-Lite0: {effnet} not found (make bench-models, or --effnet PATH)"
        from torq.quantize.dead_channels import zero_dead_channels
        from torq.quantize.fold import fold_fp32
        fp32, _ = zero_dead_channels(fold_fp32(onnx.load(str(effnet))))     # as `evaluate` quantizes it
        return with_batch(fp32, batch), "EfficientNet-Lite0 (pretrained)"
    raise SystemExit(f"--models: unknown model {name!r} (resnet18, mobilenetv2, effnet)")


def session(model, threads: int, int8_allowed: bool):
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    if int8_allowed:
        so.add_session_config_entry("session.qdqisint8allowed", "1")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def prepare(fp32, batch: int, args) -> tuple[dict, dict, list[str]]:
    """(variants name -> fn, outputs of the warm-up call, notes on build times and numerics)."""
    t0 = time.perf_counter()
    q = torq.quantize(fp32, full_integer=True, per_channel=not args.per_tensor, quant_format="qdq", num_calib=8)
    t_quant = time.perf_counter() - t0
    xf = np.random.default_rng(0).uniform(-1, 1, (batch, 3, 224, 224)).astype(np.float32)
    iq = io_quant_params(q)["inputs"]["input"]
    xq = np.clip(np.rint(xf / np.float32(iq["scale"])) + iq["zero_point"], -128, 127).astype(np.int8)
    engines, times = {}, {}
    for eng in ("reference", "native"):
        t0 = time.perf_counter()
        engines[eng] = NssEngine(q, batch, "native", threads=args.threads, engine=eng)   # compile + warm-up run
        times[eng] = time.perf_counter() - t0
    sess = {"fp32": session(fp32, args.threads, False), "int8": session(q, args.threads, False),
            "all": session(q, args.threads, True)}
    fns = {"ORT fp32": lambda: sess["fp32"].run(None, {"input": xf})[0],
           "ORT int8": lambda: sess["int8"].run(None, {"input": xq})[0],
           "ORT int8 all-int": lambda: sess["all"].run(None, {"input": xq})[0],
           "NSS reference": lambda: engines["reference"](xq),
           "NSS native": lambda: engines["native"](xq)}
    outs = {k: f() for k, f in fns.items()}
    notes = [f"quantize {t_quant:.1f} s; NSS compile + first run: reference {times['reference']:.2f} s, "
             f"native {times['native']:.2f} s (engine {engines['native'].simulator.engine})",
             numerics(engines, xq, outs)]
    return fns, outs, notes


def numerics(engines: dict, xq: np.ndarray, outs: dict) -> str:
    """Native == reference (both roundings); NSS ort == ORT all-integer session."""
    same = []
    for rounding in ("native", "ort"):
        for e in engines.values():
            e.rounding = rounding
        a, b = engines["reference"](xq), engines["native"](xq)
        same.append(f"{rounding} rounding {'identical' if np.array_equal(a, b) else 'DIFFERENT'}")
        if rounding == "ort":
            exact = np.array_equal(b, outs["ORT int8 all-int"])
        for e in engines.values():
            e.rounding = "native"
    return (f"native vs reference engine: {', '.join(same)}; NSS ort rounding vs ORT all-int: "
            f"{'bit-exact' if exact else 'DIFFERENT'}")


def timed(fn, min_time: float) -> float:
    """Median seconds per call over >= 1 call and >= min_time seconds."""
    times, start = [], time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if t1 - start >= min_time:
            return statistics.median(times)


def measure(fns: dict, rounds: int, min_time: float) -> dict:
    per_round = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            per_round[k].append(timed(fn, min_time))
    return per_round


def ratio(per_round: dict, a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(per_round[a], per_round[b]))


def report(per_round: dict, batch: int) -> list[str]:
    lines = [f"  {'variant':20s}{'ms/call':>9s}{'ms/image':>10s}{'images/s':>10s}{'x ORT fp32':>12s}{'x ORT int8':>12s}"]
    for k, ts in per_round.items():
        med = statistics.median(ts)
        lines.append(f"  {k:20s}{med * 1e3:9.2f}{med * 1e3 / batch:10.2f}{batch / med:10.1f}"
                     f"{ratio(per_round, k, 'ORT fp32'):12.2f}{ratio(per_round, k, 'ORT int8'):12.2f}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,mobilenetv2,effnet", help="comma list (default all three)")
    ap.add_argument("--batches", default="1,8", help="comma list of batch sizes (default 1,8)")
    ap.add_argument("--effnet", type=Path, default=REPO / "build" / "bench-models" / "effnet_lite0.onnx",
                    help="EfficientNet-Lite0 fp32 ONNX (default build/bench-models/effnet_lite0.onnx)")
    ap.add_argument("--per-tensor", action="store_true", help="per-tensor weight scales (default per-channel)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per variant per round (default 0.2)")
    ap.add_argument("--threads", type=int, default=2, help="ORT intra-op threads and NSS cores (default 2)")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    print("\n".join(host_summary()))
    summary = []
    for name in args.models.split(","):
        for batch in batches:
            fp32, title = load_fp32(name, args.effnet, batch)
            if fp32 is None:
                print(f"\n{title}: skipped")
                break
            err.print(f"[dim]{title}, batch {batch}: quantize, compile, warm up[/dim]")
            fns, _, notes = prepare(fp32, batch, args)
            err.print(f"[dim]{title}, batch {batch}: {args.rounds} rounds[/dim]")
            per_round = measure(fns, args.rounds, args.min_time)
            print(f"\n{title}, batch {batch}, 224x224, A8W8 QDQ full-integer "
                  f"{'per-tensor' if args.per_tensor else 'per-channel'}")
            print("\n".join(["  " + n for n in notes] + report(per_round, batch)))
            summary.append((title.split(" (")[0], batch, per_round))
    print("\nsummary (NSS native; ratios are medians of same-round ratios):")
    for title, batch, pr in summary:
        med = statistics.median(pr["NSS native"])
        print(f"  {title:28s} batch {batch}: {med * 1e3:7.2f} ms  {batch / med:7.1f} images/s  "
              f"x ORT fp32 {ratio(pr, 'NSS native', 'ORT fp32'):.2f}  x ORT int8 {ratio(pr, 'NSS native', 'ORT int8'):.2f}  "
              f"x NSS reference {ratio(pr, 'NSS native', 'NSS reference'):.2f}")
    b1 = [(title, ratio(pr, "NSS native", "ORT fp32")) for title, batch, pr in summary if batch == 1]
    if b1:
        print("must-hold (issue 20) NSS native <= 1.0x ORT fp32 at batch 1 (goal 0.5x): "
              + "; ".join(f"{t} {r:.2f} {'holds' if r <= 1.0 else 'DOES NOT hold'}" for t, r in b1))
    print(f"host load average at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
