"""Mutation fuzzing of the state torq keeps: the result cache, the report, saved Programs.

A small model (Conv on the NSS, Softmax a bf16 island, also run on CSS/HOST through IREE) is
discovered and run once; then each case damages one thing (`state_fuzz.py`) and runs a command on
it in a forked child (`fuzz.run_cli`: memory cap, timeout). Accepted: the reference result (a damaged cache is
recomputed: the report equals the reference), or one clean error line that leaves the report as
it was. Never a signal, a timeout, a traceback, an internal error, or a report torq cannot read.
`make test` runs a few cases of each; TORQ_FUZZ=500 (`make fuzz`) the long run, TORQ_FUZZ_SEED
other mutants, TORQ_FUZZ_ONLY=<case> one case.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from robustness.fuzz import judge, run_cli
from robustness.state_fuzz import copy_tree, damage_file, dumps, mutate_json, mutate_program
from robustness.test_cache_damage import tiny
from torq.cli_util import run_main
from torq.errors import TorqError
from torq.gen_config import schema
from torq.gen_config.cli import main as gen_main

BUDGET = int(os.environ.get("TORQ_FUZZ", "24")) // 3
BASE_SEED = int(os.environ.get("TORQ_FUZZ_SEED", "1000"))
Q = ["--quantize", "--full-integer"]
REPORT = "torq_gen_config_tiny.json"


def cases():
    only = os.environ.get("TORQ_FUZZ_ONLY")
    return [int(only)] if only else range(BUDGET)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(folder with tiny.onnx, cache/ and out/ after discover + run, the reference report)."""
    root = tmp_path_factory.mktemp("state")
    model = tiny(root / "tiny.onnx")
    os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = str(root / "cache")
    try:
        assert gen_main(["discover", "--model", str(model), "--output-dir", str(root / "out"), *Q]) == 0
        assert gen_main(["run", "--model", str(model), "--output-dir", str(root / "out"), *Q]) == 0
    finally:
        os.environ.pop("TORQ_GEN_CONFIG_CACHE_DIR")
    return root, json.loads((root / "out" / REPORT).read_text())


def _run(case, argv, cache):
    old = os.environ.get("TORQ_GEN_CONFIG_CACHE_DIR")
    os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = str(cache)
    try:
        return run_cli(gen_main, argv, case, keep={p.name for p in case.iterdir()} | {"v.html"})
    finally:
        if old is None:
            os.environ.pop("TORQ_GEN_CONFIG_CACHE_DIR")
        else:
            os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = old


def _state_problems(outcome, cmd: str) -> list[str]:
    """fuzz.judge, except that discover and run may exit 1 (documented: a layer on no executor,
    a FAIL) and that they write their files."""
    problems = [p for p in judge(outcome, "torq-gen-config") if not p.startswith("leftover files")]
    if outcome.code == 1 and cmd in ("discover", "run") and not {"internal error", "traceback"} & set(problems):
        problems = [p for p in problems if p != "exit 1"]
    return problems


def test_cache_mutants(base, tmp_path):
    root, ref = base
    findings, tally = [], {}
    for i in cases():
        rng = np.random.default_rng(BASE_SEED + 10_000 + i)
        case = tmp_path / f"case{i}"
        cache = copy_tree(root / "cache", case / "cache")
        files = sorted(p for p in cache.rglob("*") if p.is_file())
        what = damage_file(files[int(rng.integers(len(files)))], rng)
        cmd = "run" if rng.random() < 0.3 else "discover"
        if cmd == "run":
            copy_tree(root / "out", case / "out")
        outcome = _run(case, [cmd, "--model", str(root / "tiny.onnx"), "--output-dir", str(case / "out"), *Q], cache)
        problems = _state_problems(outcome, cmd)
        if outcome.code == 0:
            got = json.loads((case / "out" / REPORT).read_text())
            if got["ops"] != ref["ops"]:
                problems.append("report differs from the reference")
            if cmd == "run" and got["full_model_metrics"]["max_abs_lsb"] != ref["full_model_metrics"]["max_abs_lsb"]:
                problems.append("run's result differs from the reference")
        elif outcome.code is not None:
            problems.append(f"exit {outcome.code} on a damaged cache (it must be recomputed)")
        _count(tally, outcome)
        if problems:
            findings.append(f"cache case {i} [{cmd}] {what}: {', '.join(problems)} | {_tail(outcome)}")
    print(f"state fuzz (cache): {len(list(cases()))} cases, {tally}, {len(findings)} findings")
    assert not findings, "\n".join(findings)


COMMANDS = [["view"], ["view", "--html", "v.html"], ["view", "--layer", "Softmax"], ["view", "--json"],
            ["edit", "--layer", "ALL", "--executor", "css"], ["edit", "--layer", "Conv", "--tolerance-max", "0.5"],
            ["edit", "--list"], ["run", *Q], ["discover", *Q], ["discover", *Q, "--fresh"]]


def test_report_mutants(base, tmp_path):
    root, _ = base
    findings, tally = [], {}
    for i in cases():
        rng = np.random.default_rng(BASE_SEED + 20_000 + i)
        case = tmp_path / f"case{i}"
        out = copy_tree(root / "out", case / "out")
        target = out / (REPORT if rng.random() < 0.8 else "torq_gen_config_tiny_compiler.json")
        if rng.random() < 0.75:
            doc, what = mutate_json(json.loads(target.read_text()), rng)
            target.write_text(dumps(doc))
            what = f"{target.name}: {what}"
        else:
            what = damage_file(target, rng)
        before = (out / REPORT).read_bytes() if (out / REPORT).is_file() else None
        cmd = COMMANDS[int(rng.integers(len(COMMANDS)))]
        argv = [cmd[0], "--model", str(root / "tiny.onnx"), "--output-dir", str(out),
                *[str(case / a) if a.endswith(".html") else a for a in cmd[1:]]]
        outcome = _run(case, argv, copy_tree(root / "cache", case / "cache"))
        problems = _state_problems(outcome, cmd[0])
        if outcome.code == 2 and cmd[0] in ("edit", "run", "discover") and before is not None \
                and (out / REPORT).read_bytes() != before and "--fresh" not in cmd:
            problems.append("a refused command changed the report")
        if outcome.code in (0, 1) and (out / REPORT).is_file():
            try:
                schema.load(out / REPORT)
            except TorqError as e:
                if cmd[0] not in ("view",):
                    problems.append(f"left an unreadable report ({e})")
        _count(tally, outcome)
        if problems:
            findings.append(f"report case {i} [{' '.join(cmd)}] {what}: {', '.join(problems)} | {_tail(outcome)}")
    print(f"state fuzz (report): {len(list(cases()))} cases, {tally}, {len(findings)} findings")
    assert not findings, "\n".join(findings)


def _load_and_run(argv):
    """A CLI body: load a Program, run it on saved inputs, compare with saved outputs."""
    from torq.program import Program
    from torq.runtime.nss import Simulator

    def body():
        p = Program.load(argv[0])
        with np.load(argv[1]) as z:
            x = {k[2:]: z[k] for k in z.files if k.startswith("x:")}
            ref = {k[2:]: z[k] for k in z.files if k.startswith("y:")}
        out = p.fetch(Simulator(p).run(p.feed(x)))
        same = out.keys() == ref.keys() and all(np.array_equal(out[k], ref[k]) and out[k].dtype == ref[k].dtype
                                                for k in ref)
        print("same" if same else "different")
    return run_main("torq-program", body)


def test_program_mutants(tmp_path):
    from torq import compile as torq_compile
    from torq import program_file
    from torq.quantize import quantize
    from torq.examples import build_example_cnn
    build_example_cnn(tmp_path / "cnn.onnx")                 # a program of several steps
    c = torq_compile(quantize(tmp_path / "cnn.onnx", full_integer=True, num_calib=2))
    path = c.program.save(tmp_path / "m.torq")
    x = {p.name: np.random.default_rng(0).integers(-128, 128, p.shape).astype(p.onnx_dtype) for p in c.program.inputs}
    y = c.run(x)
    np.savez(tmp_path / "io.npz", **{f"x:{k}": v for k, v in x.items()}, **{f"y:{k}": v for k, v in y.items()})
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    manifest = json.loads(bytes(arrays.pop("__manifest__")).decode())
    findings, tally = [], {}
    for i in cases():
        rng = np.random.default_rng(BASE_SEED + 30_000 + i)
        case = tmp_path / f"case{i}"
        case.mkdir()
        m, a, what, reseal = mutate_program(manifest, arrays, rng)
        if reseal and isinstance(m, dict):
            m["sha256"] = program_file._digest(m, a)
        np.savez(case / "t.npz", __manifest__=np.frombuffer(dumps(m).encode(), np.uint8), **a)
        outcome = run_cli(_load_and_run, [str(case / "t.npz"), str(tmp_path / "io.npz")], case, keep={"t.npz"})
        problems = judge(outcome, "torq-program")
        if outcome.code == 0 and "different" in outcome.stdout and not reseal:
            problems.append("a tampered program ran with different outputs (the checksum did not refuse it)")
        _count(tally, outcome)
        if problems:
            findings.append(f"program case {i} {what} (resealed {reseal}): {', '.join(problems)} | {_tail(outcome)}")
    print(f"state fuzz (program): {len(list(cases()))} cases, {tally}, {len(findings)} findings")
    assert not findings, "\n".join(findings)


def _count(tally: dict, outcome) -> None:
    key = "ok" if outcome.code == 0 else "error" if outcome.code == 2 else f"exit {outcome.code}"
    tally[key] = tally.get(key, 0) + 1


def _tail(outcome) -> str:
    return (outcome.stderr.strip().splitlines() or [""])[-1][:300]
