"""``make realworld``: the whole workflow on real pretrained models, as a user runs it.

    python benchmarks/realworld.py [--models effnet,onet | --zoo resnet18,...] [--flags qdq,qdq-pc,qoperator]
                                   [--eval-limit 100] [--out build/realworld] [--json FILE [--resume]]
                                   [--dedup-layers] [--timeout S]
    python benchmarks/realworld.py --json FILE --table [MORE.json ...]   (the markdown table of the rows)

For every model of the corpus (``benchmarks/models/corpus.py``: real weights from registry
packages) and every flag set (qdq, qdq per-channel, qoperator), the CLI commands a user types:

  torq-gen-config quantize        -> q.onnx
  torq-compile q.onnx --verify-against-ort
  torq-gen-config discover --quantize ... --skip-mode
  torq-gen-config run --quantize ...
  torq-gen-config evaluate        (models with labelled data: FP32 / INT8 / NSS top-1)

with the product's default recipe (``recipe.RECOMMENDED``) in three formats: ``--per-tensor``
(qdq), nothing (qdq-pc: the default itself), ``--quant-format qoperator``. One table: model x flags:
lowered (torq_hl ops, ops left off the NSS), verify, discover's NSS
share, "discover = compile" (the layers discover puts off the NSS are the ops the whole-model compile
refuses), run (beyond tolerance, run again with ``--rounding ort``: native rounding or a wrong
result?; PASS says the largest output difference), top-1 (evaluate's default recipe: the qdq-pc row's),
seconds. Exit 1 unless every
row holds: verify PASS with nothing unsupported, discover and run exit 0, discover = compile, and
no "internal error" in any output.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The product default (``recipe.RECOMMENDED``: what a user gets with no recipe flag) in three
#: formats: per-tensor QDQ, per-channel QDQ (the default itself), QOperator
FLAGS = {"qdq": ["--per-tensor"], "qdq-pc": [], "qoperator": ["--quant-format", "qoperator"]}
CLI = [sys.executable, "-m", "torq.gen_config.cli"]
COMPILE = [sys.executable, "-m", "torq.compile_cli"]


@dataclass
class Row:
    model: str
    flags: str
    lowered: int = 0
    unsupported: int = 0
    limits: list = field(default_factory=list)     # ops off the NSS by design (no exact integer form: Softmax)
    verify: str = "-"
    nss: int = 0
    layers: int = 0
    folded: int = 0
    discover_rc: int | None = None
    disagree: list = field(default_factory=list)   # layers discover and the whole-model compile judge apart
    run: str = "-"
    top1: str = "-"
    seconds: float = 0.0
    errors: list = field(default_factory=list)
    recipe: str = "?"                              # the default recipe the row ran on (rows outlive defaults)

    def holds(self) -> bool:
        """verify PASS with nothing unsupported (a model whose only refusals are documented limits
        cannot be verified whole: its run, with those ops on CSS, is the proof), discover and run
        exit 0, no internal error, and discover's verdict is the whole-model compile's."""
        verified = self.verify == "PASS" or (self.limits and self.unsupported == len(self.limits))
        return (verified and self.unsupported == len(self.limits) and self.discover_rc == 0
                and self.run.startswith("PASS") and not self.errors and not self.disagree)


def step(cmd: list, log: Path, timeout: int) -> tuple[int, str]:
    """Run one CLI command; its output is appended to ``log``; (exit code, stdout + stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    try:
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env)
        rc, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = -9, f"{e.stdout or ''}{e.stderr or ''}\ntimeout after {timeout} s"
    with log.open("a") as f:
        f.write(f"$ {' '.join(str(c) for c in cmd)}\n{out}\n[exit {rc}, {time.perf_counter() - t0:.1f} s]\n\n")
    return rc, out


def _supports(flag: str, command: str) -> bool:
    r = subprocess.run([*CLI, command, "--help"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    return flag in r.stdout


def calibration(entry: dict) -> list:
    """Real calibration images where the corpus has them and the CLI takes them, else synthetic."""
    if entry.get("calibration") and entry.get("preprocess") and _supports("--preprocess", "quantize"):
        return ["--calibration-data", entry["calibration"], "--preprocess", entry["preprocess"]]
    return []


def run_row(name: str, entry: dict, flags: str, out: Path, eval_limit: int, timeout: int,
            discover_args: tuple = ()) -> Row:
    row, work = Row(name, flags, recipe=default_recipe()), out / name / flags
    shutil.rmtree(work, ignore_errors=True)          # a row starts from nothing (discover keeps old reports)
    work.mkdir(parents=True)
    log = work / "log.txt"
    log.write_text("")
    model, q = entry["model"], work / "q.onnx"
    quant = [*FLAGS[flags], *calibration(entry), *entry.get("args", [])]
    t0 = time.perf_counter()
    outputs = []

    def go(cmd):
        rc, text = step(cmd, log, timeout)
        outputs.append(text)
        return rc, text
    rc, text = go([*CLI, "quantize", "--model", model, "-o", q, *quant])
    if rc != 0:
        row.errors.append(f"quantize: {_last_line(text)}")
    else:
        _verify(row, *go([*COMPILE, q, "--verify-against-ort", "-o", work / "q.torq_hl.mlir"]))
    rc, text = go([*CLI, "discover", "--model", model, "--output-dir", work, "--quantize", *quant, "--skip-mode", *discover_args])
    row.discover_rc = rc
    report = _discovered(row, work, Path(model).stem, text)
    if q.exists():
        try:
            refused = whole_model_refusals(row, q)
        except Exception as e:  # noqa: BLE001 - a row, not the end of the table
            row.errors.append(f"compile: {type(e).__name__}: {str(e)[:160]}")
        else:
            if report is not None:
                from torq.gen_config.agreement import disagreements
                row.disagree = disagreements(report, refused)
    rc, text = go([*CLI, "run", "--model", model, "--output-dir", work, "--quantize", *quant])
    row.run = f"PASS {_max_lsb(text)} LSB" if rc == 0 and "run: PASS" in text else f"FAIL ({_last_line(text)})"
    if rc == 0 and "int16 drift explained" in text:      # beyond the tolerance as a whole, every layer holds
        row.run += " (int16 drift explained per layer)"
    if rc == 1 and "run: FAIL: max" in text:    # beyond tolerance: is it the NSS's native rounding?
        rc, ort = go([*CLI, "run", "--model", model, "--output-dir", work, "--quantize", *quant, "--rounding", "ort"])
        row.run = f"FAIL: native {_max_lsb(text)} LSB; --rounding ort: " + \
            (f"PASS {_max_lsb(ort)} LSB" if rc == 0 and "run: PASS" in ort else f"FAIL ({_last_line(ort)})")
    if entry.get("dataset") and eval_limit > 0:
        rc, text = go([*CLI, "evaluate", "--model", model, "--dataset", entry["dataset"], "--preprocess",
                       entry["preprocess"], "--limit", eval_limit, "--output-dir", work / "evaluate",
                       *_calibration_for_eval(entry), *entry.get("args", [])])
        row.top1 = _top1(text) if rc == 0 else f"FAIL ({_last_line(text)})"
    row.seconds = round(time.perf_counter() - t0, 1)
    row.errors += [f"internal error: {_last_line(t)}" for t in outputs if "internal error" in t]
    return row


def _calibration_for_eval(entry: dict) -> list:
    return ["--calibration-data", entry["calibration"]] if entry.get("calibration") else []


def _verify(row: Row, rc: int, text: str) -> None:
    row.verify = "PASS" if rc == 0 and re.search(r"^PASS", text, re.M) else f"FAIL ({_last_line(text)})"


def whole_model_refusals(row: Row, q: Path) -> set[str]:
    """LINE:COL of the ops the whole-model compile of ``q`` refuses (root causes); ``row`` gets the
    torq_hl op count, the number of root causes and the documented limits among them (``NO_INTEGER_FORM``)."""
    sys.path.insert(0, str(ROOT / "src"))
    from torq.compiler import compile as compile_model
    from torq.compiler.unsupported import NO_INTEGER_FORM
    from torq.gen_config.agreement import whole_model_refusals as refusals
    report = compile_model(q).report
    causes = refusals(report)
    row.lowered, row.unsupported = sum(report.lowered.values()), len(causes)
    row.limits = sorted(f"{u.onnx_op} {u.node}" for u in causes.values() if u.onnx_op in NO_INTEGER_FORM)
    return set(causes)


def _discovered(row: Row, work: Path, stem: str, text: str) -> dict | None:
    path = work / f"torq_gen_config_{stem}.json"
    if not path.exists():
        row.errors.append(f"discover: {_last_line(text)}")
        return None
    report = json.loads(path.read_text())
    ops = report["ops"]
    folded = [lid for lid, op in ops.items() if str(op.get("skipped", "")).startswith("constant")]
    recommended = [op.get("recommended_executor") for lid, op in ops.items() if lid not in folded]
    row.folded = len(folded)
    row.layers = len(recommended)
    row.nss = sum(1 for r in recommended if r == "nss")
    return report


def _top1(text: str) -> str:
    found = re.findall(r"^\| (?:FP32|INT8)[^|]*\| ([\d.]+) ", text, re.M)
    return " / ".join(found[:3]) or "see log"


def _max_lsb(text: str) -> str:
    found = re.findall(r"output \S+: max \|Δ\| ([\d.]+) LSB", text)
    return max(found, key=float) if found else "?"


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:160]


def default_recipe() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from torq.quantize.recipe import RECOMMENDED
    return RECOMMENDED


def recipe_line(rows: list[Row]) -> str:
    """Which recipes the rows ran on (the product default when each was measured), for the header."""
    from torq.quantize.recipe import PRESETS
    names = sorted({r.recipe for r in rows} or {default_recipe()})
    said = [f"`{n}` ({PRESETS[n].describe()})" if n in PRESETS else f"`{n}`" for n in names]
    return (f"Recipe: the product default when the row ran ({default_recipe()} now): {'; '.join(said)}; "
            f"flags: " + ", ".join(f"{k} = `{' '.join(v) or '(none)'}`" for k, v in FLAGS.items()))


def table(rows: list[Row]) -> str:
    head = (recipe_line(rows) + "\n\n| model | flags | recipe | lowered (torq_hl / off NSS) | verify "
            "| discover NSS share | discover = compile | run | top-1 FP32/INT8/NSS (qdq-pc recipe) | s |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        share = f"{r.nss}/{r.layers} ({100 * r.nss / r.layers:.0f} %)" if r.layers else "-"
        if r.discover_rc not in (0, None):
            share += f" rc {r.discover_rc}"
        agree = "yes" if not r.disagree else f"no: {len(r.disagree)} ({', '.join(r.disagree[:2])}...)"
        ops = Counter(x.split()[0] for x in r.limits)
        off = f"{r.unsupported}" + (f" ({', '.join(o + (f' ×{n}' if n > 1 else '') for o, n in ops.items())}: "
                                    "no integer form)" if r.limits else "")
        verify = r.verify if r.verify == "PASS" or not r.limits else "whole model: no (limits); run is the proof"
        lines.append(f"| {r.model} | {r.flags} | {r.recipe} | {r.lowered} / {off} | {verify} | {share} | {agree} "
                     f"| {r.run} | {r.top1} | {r.seconds:.0f} |")
    return "\n".join(lines)


def zoo(names: str) -> dict:
    """torchvision architectures as corpus entries (no labelled data, synthetic calibration)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torchvision_zoo
    models = torchvision_zoo.MODELS if names == "all" else names.split(",")
    unknown = [m for m in models if m not in torchvision_zoo.MODELS]
    if unknown:
        raise SystemExit(f"--zoo: unknown model {unknown[0]!r}; choose from {', '.join(torchvision_zoo.MODELS)}")
    return {m: {"model": str(torchvision_zoo.export(m)), "dataset": None, "preprocess": None, "calibration": None}
            for m in models}


def main() -> int:
    sys.path.insert(0, str(ROOT / "benchmarks" / "models"))
    from corpus import DEFAULT_OUT, EXTRA, FROM_BUILD, corpus
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", help=f"comma-separated subset of {','.join(FROM_BUILD + tuple(EXTRA))}")
    ap.add_argument("--zoo", help="torchvision models (seeded random weights, benchmarks/torchvision_zoo.py) "
                    "instead of the corpus: comma-separated names or 'all'")
    ap.add_argument("--flags", default=",".join(FLAGS), help=f"comma-separated subset of {','.join(FLAGS)}")
    ap.add_argument("--eval-limit", type=int, default=100, help="images per evaluate run (0: no evaluate)")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "realworld")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per command (default 3600)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--dedup-layers", action="store_true",
                    help="discover tests one layer of each signature (big models: far fewer per-layer compiles)")
    ap.add_argument("--table", nargs="*", metavar="MORE_JSON", help="print the table of --json's rows and exit "
                    "(no runs); rows of MORE_JSON files replace the same model x flags rows (re-runs)")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --json; run only the others")
    args = ap.parse_args()
    flags = [f.strip() for f in args.flags.split(",") if f.strip()]
    bad = [f for f in flags if f not in FLAGS]
    if bad:
        ap.error(f"--flags: unknown {bad[0]!r}; choose from {', '.join(FLAGS)}")
    rows = [Row(**d) for d in json.loads(args.json.read_text())] if (args.resume or args.table is not None) \
        and args.json and args.json.exists() else []
    if args.table is not None:
        missing = [f for f in args.table if not Path(f).exists()]
        if missing:
            print(f"realworld: no rows yet in {', '.join(missing)}", file=sys.stderr)
        merged = {(r.model, r.flags): r for f in [None, *args.table] if f not in missing
                  for r in (rows if f is None else [Row(**d) for d in json.loads(Path(f).read_text())])}
        print(table(list(merged.values())))
        return 0
    manifest = zoo(args.zoo) if args.zoo else corpus(DEFAULT_OUT, args.models.split(",") if args.models else None)
    done = {(r.model, r.flags) for r in rows}
    for name, entry in manifest.items():
        for f in flags:
            if (name, f) in done:
                continue
            print(f"[realworld] {time.strftime('%H:%M:%S')} {name} {f} ...", file=sys.stderr, flush=True)
            rows.append(run_row(name, entry, f, args.out, args.eval_limit, args.timeout,
                                ("--dedup-layers",) if args.dedup_layers else ()))
            r = rows[-1]
            print(f"[realworld] {time.strftime('%H:%M:%S')} {name} {f}: verify {r.verify}, run {r.run}, "
                  f"{r.seconds:.0f} s" + (f", {'; '.join(r.errors)}" if r.errors else ""), file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps([asdict(x) for x in rows], indent=1) + "\n")
    print(table(rows))
    failed = [r for r in rows if not r.holds()]
    for r in failed:
        print(f"does not hold: {r.model} {r.flags}: verify {r.verify}, unsupported {r.unsupported}, discover rc "
              f"{r.discover_rc}, run {r.run}" + (f", {'; '.join(r.errors)}" if r.errors else "")
              + (f", discover != compile: {' '.join(r.disagree)}" if r.disagree else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
