"""Compile time of the torchvision zoo, stage by stage, next to ONNX Runtime's session creation.

    python benchmarks/compile_speed.py                              # 10 CNNs × qdq, qdq-pc, qop
    python benchmarks/compile_speed.py --models densenet121 --flags qdq --rounds 5
    python benchmarks/compile_speed.py --baseline /path/to/other/checkout/src   # before/after table

Each model × flag set is quantized once (cached next to the fp32 export as benchmarks/torchvision_zoo.py does:
`build/zoo/<model>.<flags>.onnx`) and then compiled in its own child process: one untimed
warm-up compile of a small model (imports, numba caches), then `--rounds` compiles of the model,
each followed by an ONNX Runtime InferenceSession on the same file (its own "compile"). Stages
are the ones `torq.compile(...).timings` reports:

    import   ONNX load, graph canonicalisation, torch-mlir import + every torch-mlir pipeline
             (torch-onnx -> torch -> linalg, in the isolated child) and the hand-back
    linalg   parsing the child's linalg bytecode in this process
    torq_hl  the LinalgToTorqHL lowering, module verification
    program  emitting the Program (the ONNX -> Program total is what the 5 s budget is about)

Per row: medians over the rounds, the ONNX node count of the quantized model and the op count of
its linalg module (what the lowering walks; DenseNet's concats of every earlier feature map make
it large), milliseconds per node and per linalg op (flat across models = compile time linear in
the model), total / ORT session creation, and whether the slowest round stayed within 5 s.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torchvision_zoo import BUILD, FLAGS, NUM_CALIB, export  # noqa: E402 - the zoo's exports and flag sets

CNNS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
        "efficientnet_b0", "squeezenet1_1", "googlenet", "densenet121", "shufflenet_v2_x1_0"]
STAGES = ("import_s", "linalg_s", "torq_hl_s", "program_s")
BUDGET_S = 5.0


def quantized(name: str, flags: str, folder: Path) -> Path:
    """`folder/<name>.<flags>.onnx`, quantized with the zoo's flag set if not there yet."""
    import torq
    path = folder / f"{name}.{flags}.onnx"
    if not path.exists():
        tmp = path.with_suffix(".tmp.onnx")
        torq.quantize(str(export(name, folder)), str(tmp), num_calib=NUM_CALIB, **FLAGS[flags])
        tmp.replace(path)
    return path


def measure(path: Path, rounds: int) -> dict:
    """Stage medians of `rounds` compiles of `path` (after a warm-up on a small model)."""
    import onnx

    import torq
    from torq.errors import TorqError
    from torq.examples import build_example_cnn
    from torq import reference
    warm = torq.quantize(build_example_cnn(), num_calib=2)
    torq.compile(warm).program
    runs, ort = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        c = torq.compile(str(path))            # Program emitted (or refused) inside
        runs.append({**c.timings, "total_s": time.perf_counter() - t})
        t = time.perf_counter()
        reference.session(onnx.load(str(path)))
        ort.append(time.perf_counter() - t)
    row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    row["max_total_s"] = max(r["total_s"] for r in runs)
    row["ort_session_s"] = statistics.median(ort)
    row["nodes"] = len(onnx.load(str(path), load_external_data=False).graph.node)
    row["torq_hl_ops"] = sum(c.report.lowered.values())
    row["linalg_ops"] = len(re.findall(r"^\s+%\S+ = ", c.ir("linalg"), re.M))   # the IR the lowering walks
    try:
        c.program
        row["unsupported"] = 0
    except TorqError:                              # timed all the same: the lowering ran in full
        row["unsupported"] = len(c.report.unsupported) or 1
    return row


def _child(name: str, flags: str, folder: Path, rounds: int, timeout: float, src: Path | None = None) -> dict:
    """`measure` in a fresh process; `src`: another checkout's src/ to import torq from."""
    cmd = [sys.executable, __file__, "--one", name, flags, "--build", str(folder), "--rounds", str(rounds)]
    row = {"model": name, "flags": flags}
    env = None
    if src is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timeout > {timeout:g} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return {**row, **json.loads(line)}
    return {**row, "error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:200]}


def print_comparison(pairs: list[tuple[dict, dict]], baseline: Path) -> None:
    """Baseline vs this checkout, each measured in alternating child processes."""
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"ONNX -> Program total (s, medians): baseline {baseline} vs this checkout")
    for col in ("model", "flags", "nodes", "baseline", "now", "speed-up", "baseline ms/node", "now ms/node"):
        t.add_column(col, justify="left" if col in ("model", "flags") else "right")
    for b, r in pairs:
        if "error" in b or "error" in r:
            t.add_row(r["model"], r["flags"], "", "", "", "", "", (b.get("error") or r.get("error"))[:60])
            continue
        t.add_row(r["model"], r["flags"], str(r["nodes"]), f"{b['total_s']:.2f}", f"{r['total_s']:.2f}",
                  f"{b['total_s'] / r['total_s']:.1f}x", f"{1000 * b['total_s'] / b['nodes']:.2f}",
                  f"{1000 * r['total_s'] / r['nodes']:.2f}")
    Console(width=200).print(t)


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title="torq.compile: ONNX -> Program, medians (s)")
    for col in ("model", "flags", "nodes", "linalg ops", "torq_hl ops", "import", "linalg", "torq_hl", "program",
                "total", "ms/node", "ms/linalg op", "ORT session", "total/ORT", "≤ 5 s", "unsupported"):
        t.add_column(col, justify="left" if col in ("model", "flags") else "right")
    for r in rows:
        if "error" in r:
            t.add_row(r["model"], r["flags"], *[""] * 13, r["error"][:60])
            continue
        t.add_row(r["model"], r["flags"], str(r["nodes"]), str(r["linalg_ops"]), str(r["torq_hl_ops"]),
                  *[f"{r[k]:.2f}" for k in STAGES], f"{r['total_s']:.2f}",
                  f"{1000 * r['total_s'] / r['nodes']:.2f}", f"{1000 * r['total_s'] / r['linalg_ops']:.2f}",
                  f"{r['ort_session_s']:.2f}",
                  f"{r['total_s'] / r['ort_session_s']:.1f}x", "yes" if r["max_total_s"] <= BUDGET_S else "NO",
                  str(r["unsupported"] or ""))
    Console(width=200).print(t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(CNNS), help="comma-separated torchvision names")
    ap.add_argument("--flags", default=",".join(FLAGS), help=f"comma-separated of {', '.join(FLAGS)}")
    ap.add_argument("--rounds", type=int, default=3, help="compiles per model × flag set (median)")
    ap.add_argument("--build", type=Path, default=BUILD, help="export/quantize cache (default build/zoo)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per model × flag set")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--baseline", type=Path, metavar="SRC",
                    help="also measure the torq in SRC (another checkout's src/), alternating with this one")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "FLAGS"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(measure(quantized(*a.one, a.build), a.rounds)))
        return 0
    models, flags = a.models.split(","), a.flags.split(",")
    bad = [f for f in flags if f not in FLAGS]
    if bad or a.rounds < 1:
        ap.error(f"unknown flag set: {', '.join(bad)}" if bad else "--rounds must be at least 1")
    if a.baseline and not (a.baseline / "torq" / "__init__.py").is_file():
        ap.error(f"--baseline {a.baseline}: no torq package there (give a checkout's src/ folder)")
    rows, pairs = [], []
    for m in models:
        for f in flags:
            try:
                quantized(m, f, a.build)      # here, once: the child then only compiles
            except Exception as e:  # noqa: BLE001 - a model that cannot be built is a row
                rows.append({"model": m, "flags": f, "error": f"quantize: {str(e).splitlines()[0][:150]}"})
                continue
            if a.baseline:
                pairs.append((_child(m, f, a.build, a.rounds, a.timeout, a.baseline), None))
            rows.append(_child(m, f, a.build, a.rounds, a.timeout))
            if a.baseline:
                pairs[-1] = (pairs[-1][0], rows[-1])
            r = rows[-1]
            print(f"{m:20s} {f:7s} " + (r["error"] if "error" in r else
                  " ".join(f"{k[:-2]} {r[k]:.2f}" for k in (*STAGES, "total_s"))), file=sys.stderr, flush=True)
            if a.json:
                a.json.write_text(json.dumps({"rows": rows, "baseline": [b for b, _ in pairs]}, indent=1))
    print_table(rows)
    if a.baseline:
        print_comparison(pairs, a.baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
