"""NSS simulator speed on ResNet-18 (224x224, batch 1, A8W8 QDQ full-integer), side by side with ORT.

    .venv/bin/python benchmarks/nss_speed.py [--model resnet18|mobilenetv2|effnet|M.onnx] [--per-channel]
                                             [--rounds 7] [--threads 2] [--batch B] [--nss-threads T]

With --batch B every variant runs the model compiled for B images per call (B different
images); times are printed per call and per image, with images/s.

One process, interleaved round-robin: every round runs each variant in turn, so a slow period on
the (noisy, 2-vCPU) host hits all variants alike. Variants:

  ORT fp32                 the float model (the baseline every ratio is against)
  ORT int8 default         the full-integer QDQ model, default session (on x86 ORT fuses only part
                           of an S8S8 QDQ graph and runs the rest as DQ -> fp32 Conv -> Q)
  ORT int8 qdqisint8=1     same model with `session.qdqisint8allowed=1` (all integer kernels; the
                           session torq verifies against)
  NSS native / NSS ort     torq's numpy simulator of the lowered torq_hl program, both roundings,
                           one thread (one core)
  NSS native xT threads    the same B images as T sub-batches side by side (``evaluate``'s
                           ``NssEngine``: Simulator.run_many), T = --nss-threads (default: every
                           core this process may use; the variant is left out when T = 1)

Prints: quantization and compile times, which kernels each ORT int8 session really runs, a
numeric sanity check (NSS `ort` rounding must be bit-exact with the qdqisint8 session), the median
latency of each variant, its ratio to ORT fp32 (median of same-round ratios), and peak RSS.
If NSS native is slower than 2x ORT fp32 (or with --profile) one NSS run is profiled with
cProfile and the top functions by cumulative time are printed; --steps times every NSS step.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

import torq
from torq import zoo
from torq.quantize import io_quant_params

err = Console(stderr=True)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def make_session(model: onnx.ModelProto, threads: int, int8_allowed: bool, optimized: Path | None = None):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if int8_allowed:
        so.add_session_config_entry("session.qdqisint8allowed", "1")
    if optimized is not None:
        so.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def kernel_summary(path: Path) -> str:
    """Op counts of the graph ORT actually runs (saved optimized model)."""
    ops = Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)
    keys = [k for k in ("QLinearConv", "Conv", "QLinearAdd", "Add", "QGemm", "Gemm", "MaxPool",
                        "QLinearGlobalAveragePool", "GlobalAveragePool", "QuantizeLinear",
                        "DequantizeLinear") if ops.get(k)]
    keys += sorted(k for k in ops if k not in keys and ops[k] and not k.startswith("Reorder"))
    return ", ".join(f"{k}×{ops[k]}" for k in keys)


def cpu_summary() -> str:
    """CPU model and the ISA flags that decide ORT's int8 kernels (research perf-anchors §0, §4)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "CPU unknown"
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
    keys = ("avx512f", "avx512_vnni", "avx_vnni", "avx_vnni_int8", "avx512_bf16", "amx_int8")
    return f"CPU {model}; " + " ".join(f"{k}{'+' if k in flags else '-'}" for k in keys)


def blas_summary() -> str:
    """numpy's BLAS and the kernel family OpenBLAS runs (OPENBLAS_CORETYPE, read when numpy is
    imported, overrides its CPU detection: "Haswell" means AVX2 kernels even on an AVX-512 CPU,
    about 1.7x slower SGEMM than "SkylakeX" there). Best effort: "?" where it cannot be found."""
    import ctypes
    try:
        name = np.show_config(mode="dicts")["Build Dependencies"]["blas"].get("name", "?")
    except Exception:
        name = "?"
    core = "?"
    try:
        libs = {ln.split()[-1] for ln in Path("/proc/self/maps").read_text().splitlines()
                if "openblas" in ln.rsplit("/", 1)[-1] and ".so" in ln}
        for lib in libs:
            dll = ctypes.CDLL(lib)
            for sym in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                        "openblas_get_corename"):
                fn = getattr(dll, sym, None)
                if fn is not None:
                    fn.restype = ctypes.c_char_p
                    core = fn().decode()
                    break
    except Exception:
        pass
    return (f"numpy BLAS {name}, run-time kernels {core} (OPENBLAS_CORETYPE="
            f"{os.environ.get('OPENBLAS_CORETYPE', 'unset')}), OPENBLAS_NUM_THREADS="
            f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset (all cores)')}")


def timed_calls(fn, min_time: float) -> float:
    """Median seconds per call over >= 1 call and >= min_time seconds."""
    times = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if t1 - start >= min_time:
            return statistics.median(times)


def profile_nss(program, x, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    program.run([x], "native")
    prof.disable()
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("cumulative").print_stats(top)
    lines = out.getvalue().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    total = next((ln.strip() for ln in lines if "function calls" in ln), "")
    root = str(Path(torq.__file__).parent.parent) + os.sep
    site = str(Path(np.__file__).parent.parent) + os.sep

    def short(ln):
        return ln.replace(root, "").replace(site, "")
    return "\n".join([total, *(short(ln) for ln in lines[start:] if ln.strip())])


def step_times(program, x, reps: int, batch: int = 1) -> str:
    """Median time of every NSS step (native rounding) over ``reps`` whole-program runs: totals
    per op kind, then the slowest steps with their operand shapes (per call of ``batch`` images)."""
    per_step: list[list[float]] = [[] for _ in program.kernels]
    shapes: list[str] = [""] * len(program.kernels)
    saved = [st.fn for st in program.kernels]

    def timed(i, fn):
        def run(args, rounding):
            t0 = time.perf_counter()
            out = fn(args, rounding)
            per_step[i].append(time.perf_counter() - t0)
            shapes[i] = " ".join("x".join(map(str, np.shape(a))) for a in args)
            return out
        return run
    try:
        for i, st in enumerate(program.kernels):
            st.fn = timed(i, st.fn)
        for _ in range(reps):
            program.run([x], "native")
    finally:
        for st, fn in zip(program.kernels, saved):
            st.fn = fn
    med = [statistics.median(t) * 1e3 for t in per_step]
    total = sum(med)
    kinds: dict[str, list[float]] = {}
    for st, m in zip(program.kernels, med):
        kinds.setdefault(st.step.op, []).append(m)
    lines = [f"sum of step medians {total:.1f} ms per call of {batch} = {total / batch:.2f} ms per image; per op kind:"]
    for name, ms in sorted(kinds.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"  {name:28s}{len(ms):4d} steps {sum(ms):8.2f} ms {100 * sum(ms) / total:5.1f} %")
    lines.append("slowest steps (operand shapes):")
    for i in sorted(range(len(med)), key=lambda i: -med[i])[:12]:
        lines.append(f"  #{i:<3d} {program.kernels[i].step.op:24s}{med[i]:7.2f} ms  {shapes[i]}")
    return "\n".join(lines)


def load_fp32(name: str, hw: int, batch: int = 1):
    """(fp32 model with batch ``batch``, title) for --model."""
    from torq.evaluate.engines import with_batch
    if name == "resnet18":
        return with_batch(zoo.resnet18(hw), batch), "ResNet-18 stand-in (torq.zoo, random weights)"
    if name == "mobilenetv2":
        return with_batch(zoo.mobilenet_v2(hw), batch), "MobileNetV2 stand-in (torq.zoo, random weights)"
    from torq.quantize.fold import fold_fp32
    if name == "effnet":
        sys.path.insert(0, str(Path(__file__).resolve().parent / "models"))
        from build import build
        path, title = build(only=["effnet"])["effnet"]["model"], "EfficientNet-Lite0 (pretrained, folded)"
    else:
        path, title = name, Path(name).name
    from torq.quantize.dead_channels import zero_dead_channels
    fp32, _ = zero_dead_channels(fold_fp32(onnx.load(path)))     # as `evaluate` quantizes it
    return with_batch(fp32, batch), title


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18", metavar="resnet18|mobilenetv2|effnet|PATH.onnx",
                    help="resnet18 / mobilenetv2: torq.zoo stand-ins (random weights); effnet: the real "
                         "EfficientNet-Lite0 of benchmarks/models/build.py; or any fp32 ONNX file (default resnet18)")
    ap.add_argument("--per-channel", action="store_true", help="per-channel weight quantization")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    ap.add_argument("--threads", type=int, default=2, help="ORT intra_op_num_threads (default 2)")
    ap.add_argument("--hw", type=int, default=224, help="input height = width (default 224)")
    ap.add_argument("--batch", type=int, default=1, help="images per call, every variant (default 1)")
    ap.add_argument("--nss-threads", type=int, default=0, metavar="T",
                    help="threads of the multi-threaded NSS variant (default 0: every usable core)")
    ap.add_argument("--num-calib", type=int, default=16, help="calibration samples (default 16)")
    ap.add_argument("--min-time", type=float, default=0.25,
                    help="seconds of calls per variant per round, at least one call (default 0.25)")
    prof = ap.add_mutually_exclusive_group()
    prof.add_argument("--profile", action="store_true", help="always cProfile one NSS native run")
    prof.add_argument("--no-profile", action="store_true", help="never profile")
    ap.add_argument("--top", type=int, default=10, help="profile lines to print (default 10)")
    ap.add_argument("--steps", action="store_true",
                    help="also time every NSS step (native) and print totals per op kind and the slowest steps")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.threads < 1 or args.batch < 1 or args.nss_threads < 0:
        ap.error("--rounds, --threads and --batch must be >= 1, --nss-threads >= 0")
    from torq.runtime.nss import usable_cores
    nss_threads = min(args.batch, args.nss_threads or usable_cores())

    qname = "per-channel" if args.per_channel else "per-tensor"
    B = args.batch
    fp32, title = load_fp32(args.model, args.hw, B)
    print(f"{title}, {B}x3x{args.hw}x{args.hw}, A8W8 QDQ full-integer "
          f"{qname}, {args.num_calib} calibration samples")
    print(f"ORT {ort.__version__}, intra_op={args.threads}, inter_op=1, ENABLE_ALL; numpy {np.__version__}; "
          f"{os.cpu_count()} CPUs; {args.rounds} interleaved rounds")
    print(cpu_summary())
    print("NSS: " + blas_summary())
    if os.environ.get("OPENBLAS_CORETYPE") and "avx512f+" in cpu_summary():
        print(f"  note: OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} forces those kernels on this AVX-512 CPU; "
              "to measure with the CPU's own run: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "
              ".venv/bin/python benchmarks/nss_speed.py")

    with tempfile.TemporaryDirectory(prefix="torq-nss-speed-") as tmp, Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(), console=err, transient=True) as bar:
        tmp = Path(tmp)
        setup = bar.add_task("build model", total=6)
        bar.update(setup, advance=1, description="quantize")
        t0 = time.perf_counter()
        q = torq.quantize(fp32, full_integer=True, per_channel=args.per_channel, quant_format="qdq",
                          num_calib=args.num_calib)
        t_quant = time.perf_counter() - t0
        bar.update(setup, advance=1, description="compile to torq_hl")
        t0 = time.perf_counter()
        compiled = torq.compile(q)
        t_compile = time.perf_counter() - t0
        if compiled.report.unsupported:
            print("not every op lowered:", *map(str, compiled.report.unsupported), sep="\n  ")
            return 1
        bar.update(setup, advance=1, description="bind NSS kernels")
        t0 = time.perf_counter()
        program = compiled.simulator
        t_program = time.perf_counter() - t0
        engine = None
        if nss_threads > 1:
            from torq.evaluate.engines import NssEngine
            bar.update(setup, advance=1, description=f"compile for {nss_threads} threads")
            engine = NssEngine(q, B, "native", threads=nss_threads)
        else:
            bar.update(setup, advance=1)
        bar.update(setup, advance=1, description="ORT sessions")
        sessions = {
            "ORT fp32": make_session(fp32, args.threads, False),
            "ORT int8 default": make_session(q, args.threads, False, tmp / "int8_default.onnx"),
            "ORT int8 qdqisint8=1": make_session(q, args.threads, True, tmp / "int8_allowed.onnx"),
        }
        kernels = {"ORT int8 default": kernel_summary(tmp / "int8_default.onnx"),
                   "ORT int8 qdqisint8=1": kernel_summary(tmp / "int8_allowed.onnx")}
        bar.update(setup, advance=1)

        # Same image for everyone: a float input, and its int8 image under the model's input qparams.
        xf = np.random.default_rng(0).uniform(-1, 1, (B, 3, args.hw, args.hw)).astype(np.float32)
        iq = io_quant_params(q)["inputs"]["input"]
        xq = np.clip(np.rint(xf / np.float32(iq["scale"])) + iq["zero_point"], -128, 127).astype(np.int8)
        variants = {
            "ORT fp32": lambda: sessions["ORT fp32"].run(None, {"input": xf})[0],
            "ORT int8 default": lambda: sessions["ORT int8 default"].run(None, {"input": xq})[0],
            "ORT int8 qdqisint8=1": lambda: sessions["ORT int8 qdqisint8=1"].run(None, {"input": xq})[0],
            "NSS native": lambda: program.run([xq], "native")[0],
            "NSS ort": lambda: program.run([xq], "ort")[0],
        }
        if engine is not None:
            variants[f"NSS native x{nss_threads} threads"] = lambda: engine(xq)
        warm = bar.add_task("warm-up", total=len(variants))
        outs = {}
        for name, fn in variants.items():
            outs[name] = fn()
            bar.update(warm, advance=1)
        per_round: dict[str, list[float]] = {name: [] for name in variants}
        task = bar.add_task("rounds", total=args.rounds * len(variants))
        for r in range(args.rounds):
            for name, fn in variants.items():
                bar.update(task, description=f"round {r + 1}/{args.rounds}: {name}")
                per_round[name].append(timed_calls(fn, args.min_time))
                bar.update(task, advance=1)
        profile = None
        nss_ratio = statistics.median(n / f for n, f in zip(per_round["NSS native"], per_round["ORT fp32"]))
        if args.profile or (not args.no_profile and nss_ratio > 2.0):
            bar.add_task("cProfile one NSS native run", total=None)
            profile = profile_nss(program, xq, args.top)
        steps = None
        if args.steps:
            bar.add_task("time NSS steps", total=None)
            steps = step_times(program, xq, reps=11, batch=B)

    tm = compiled.timings
    print()
    print(f"quantization (torq.quantize)  {t_quant:7.2f} s")
    print(f"compile (torq.compile)        {t_compile:7.2f} s = ONNX load+import {tm['import_s']:.2f} s"
          f" + linalg {tm['linalg_s']:.2f} s + torq_hl {tm['torq_hl_s']:.2f} s + program {tm['program_s']:.2f} s")
    print(f"NSS kernel binding            {t_program:7.2f} s (first access of compiled.simulator)")
    print("lowered to torq_hl: " + ", ".join(f"{k}×{v}" for k, v in sorted(compiled.report.lowered.items())))
    for name, ks in kernels.items():
        print(f"{name + ' runs:':26s}{ks}")

    ref = outs["ORT int8 qdqisint8=1"].astype(np.int64)
    print("numerics vs ORT int8 qdqisint8=1 (int8 logits):")
    for name in ("NSS ort", "NSS native", *[n for n in outs if "threads" in n], "ORT int8 default"):
        d = np.abs(outs[name].astype(np.int64) - ref)
        verdict = "bit-exact" if not d.any() else f"max |Δ| {int(d.max())} LSB, {int((d > 0).sum())}/{d.size} differ"
        print(f"  {name:24s}{verdict}")
    for name in (n for n in outs if "threads" in n):
        same = np.array_equal(outs[name], outs["NSS native"])
        print(f"  {name} vs NSS native (1 thread): {'identical' if same else 'DIFFERENT'}")

    print()
    print(f"{'variant':26s}{'median ms':>11s}{'min ms':>9s}{'ms/image':>10s}{'images/s':>10s}{'x ORT fp32':>12s}")
    for name, ts in per_round.items():
        ratio = statistics.median(t / f for t, f in zip(ts, per_round["ORT fp32"]))
        med = statistics.median(ts)
        print(f"{name:26s}{med * 1e3:11.1f}{min(ts) * 1e3:9.1f}{med * 1e3 / B:10.2f}{B / med:10.1f}{ratio:12.2f}")
    print("(median over rounds of each round's median call; ratio = median of same-round ratios)")
    print(f"peak RSS {peak_rss_mb():.0f} MB")
    if profile is not None:
        why = "--profile" if args.profile else f"NSS native is {nss_ratio:.1f}x ORT fp32 (> 2x)"
        print()
        print(f"cProfile of one NSS native run ({why}), top {args.top} by cumulative time:")
        print(profile)
    if steps is not None:
        print()
        print("NSS native, per step (median of 11 runs):")
        print(steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
