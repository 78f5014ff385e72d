"""Mutation fuzzing of `torq-gen-config quantize`, `torq-compile` and `torq-compile --verify-against-ort`.

Every mutant must end in success or one clean error line (exit 2): never a signal, a timeout, a
traceback, an internal error or a leftover file. `make test` runs a small fixed budget; set
TORQ_FUZZ=500 for a long run, TORQ_FUZZ_SEED=<n> for other mutants (each failure line names its
case: reproduce it with TORQ_FUZZ_ONLY=<case> and the same seed)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from robustness.fuzz import int8_seeds, judge, mutate, run_cli, seeds
from torq.compile_cli import main as compile_main
from torq.gen_config.cli import main as gen_config_main

BUDGET = int(os.environ.get("TORQ_FUZZ", "40"))
BASE_SEED = int(os.environ.get("TORQ_FUZZ_SEED", "1000"))


@pytest.fixture(scope="module")
def models():
    return {name: m for name, (m, _) in seeds().items()}, int8_seeds()


def _case(i: int, fp32: dict, int8: dict):
    """(mutant, what, prog, main, argv) of case i: even cases quantize, odd ones compile."""
    rng = np.random.default_rng(BASE_SEED + i)
    if i % 2 == 0:
        name = sorted(fp32)[int(rng.integers(len(fp32)))]
        m, what = mutate(fp32[name], rng)
        flags = [f for f in ("--per-channel", "--full-integer") if rng.random() < 0.5]
        flags += ["--quant-format", ["qdq", "qoperator", "hybrid"][int(rng.integers(3))]]
        return m, f"{name}: {what}", "torq-gen-config", gen_config_main, \
            ["quantize", "--model", "m.onnx", "-o", "out.onnx", "--num-calib", "2", *flags]
    name = sorted(int8)[int(rng.integers(len(int8)))]
    m, what = mutate(int8[name], rng)
    argv = ["m.onnx", "-o", "out.mlir"] if rng.random() < 0.5 else ["m.onnx", "--verify-against-ort",
                                                                    "--rounding", "ort"]
    return m, f"{name}: {what}", "torq-compile", compile_main, argv


def test_fuzz_clis(models, tmp_path):
    fp32, int8 = models
    only = os.environ.get("TORQ_FUZZ_ONLY")
    cases = [int(only)] if only else range(BUDGET)
    findings, outcomes = [], {"ok": 0, "error": 0}
    cwd = os.getcwd()
    for i in cases:
        m, what, prog, main, argv = _case(i, fp32, int8)
        work = tmp_path / f"case{i}"
        work.mkdir()
        with open(work / "m.onnx", "wb") as f:
            f.write(m.SerializeToString())
        os.chdir(work)
        try:
            outcome = run_cli(main, argv, work, keep={"m.onnx"})
        finally:
            os.chdir(cwd)
        problems = judge(outcome, prog)
        outcomes["ok" if outcome.code == 0 else "error"] += 1
        if problems:
            tail = (outcome.stderr.strip().splitlines() or [""])[-1][:300]
            findings.append(f"case {i} [{prog} {' '.join(argv[:2])}] {what}: {', '.join(problems)} | {tail}")
    print(f"fuzz: {len(list(cases))} cases, {outcomes}")
    assert not findings, "\n".join(findings)
