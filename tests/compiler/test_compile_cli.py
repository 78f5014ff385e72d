"""torq-compile end to end: outputs, verification exit codes, and one-line errors on bad input."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from qmodels import BAD_MODEL_FILES, bad_model_file, conv_model, model, quantize


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "torq.compile_cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def one_line_error(r, *words):
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def qconv(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    m = conv_model(np.random.default_rng(0), 3, 4, 3, 1, 1, [1, 1, 1, 1], 1, True, True, (8, 8))
    path = d / "conv.int8.onnx"
    onnx.save(quantize(m, {"x": [1, 3, 8, 8]}), path)
    return path


def test_help_explains():
    r = run("--help")
    assert r.returncode == 0 and "--verify-against-ort" in r.stdout and "torq_hl" in r.stdout


def test_emit_stages_and_debug_ir(qconv, tmp_path):
    r = run(qconv)
    assert r.returncode == 0 and "torq_hl.conv2d" in r.stdout and "linalg." not in r.stdout
    out = tmp_path / "x.linalg.mlir"
    r = run(qconv, "--emit", "linalg", "-o", out)
    assert r.returncode == 0 and "linalg.conv_2d_nchw_fchw_q" in out.read_text()
    r = run(qconv, "--debug-ir", tmp_path / "ir")
    assert sorted(p.name for p in (tmp_path / "ir").iterdir()) == sorted(
        f"conv.int8.{s}.mlir" for s in ("torch_onnx", "torch", "linalg", "torq_hl"))
    assert "torq_hl.conv2d" in (tmp_path / "ir" / "conv.int8.torq_hl.mlir").read_text()


def test_verify_against_ort_passes(qconv):
    r = run(qconv, "--verify-against-ort", "--seed", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bit-exact" in r.stdout and "PASS" in r.stdout


def test_locations_are_torch_operator_line_col(qconv):
    from torq import compile
    c = compile(qconv)
    conv_loc = [loc for op, loc in c.operator_locations if op == "Conv"]
    line, col = map(int, conv_loc[0].split(":"))
    assert c.ir("torch_onnx").splitlines()[line - 1][col - 1:].startswith("torch.operator \"onnx.Conv\"")
    hl = [st for st in c.program.steps if st.op == "torq_hl.conv2d"]
    assert [st.location for st in hl] == conv_loc   # the NPU op names its ONNX node
    assert [st.onnx_op for st in hl] == ["Conv"]


def test_bad_stage(qconv):
    one_line_error(run(qconv, "--emit", "llvm"), "--emit", "llvm")


@pytest.mark.parametrize("kind, expect", BAD_MODEL_FILES.items())
def test_bad_model_files(tmp_path, kind, expect):
    p = bad_model_file(tmp_path, kind)
    out = tmp_path / "out.mlir"
    one_line_error(run(p, "-o", out), p.name, expect)
    assert not out.exists()


def test_float_model_is_refused(tmp_path):
    m = conv_model(np.random.default_rng(0), 3, 4, 3, 1, 1, [1, 1, 1, 1], 1, True, False, (8, 8))
    p = tmp_path / "fp32.onnx"
    onnx.save(m, p)
    one_line_error(run(p), "fp32.onnx", "quantize")


def test_unsupported_op_is_named_with_its_location(tmp_path):
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", [1, 10])], ["y"], {})
    p = tmp_path / "softmax.int8.onnx"
    onnx.save(quantize(m, {"x": [1, 10]}), p)
    r = run(p, "--verify-against-ort", "--no-bf16-islands")
    line = one_line_error(r, "not supported on NSS:")
    assert __import__("re").search(r" at \d+:\d+: ", line), line
    assert "(bf16 islands are off)" in line, line


def test_an_op_without_integer_form_runs_as_a_bf16_island(tmp_path):
    """By default the same Softmax runs on the NSS in bf16: said in the summary, verified within
    its stated tolerance."""
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", [1, 10])], ["y"], {})
    p = tmp_path / "softmax.int8.onnx"
    onnx.save(quantize(m, {"x": [1, 10]}), p)
    r = run(p, "--verify-against-ort")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 op in bf16 (no integer form): Softmax ×1" in r.stdout and "bf16 island Softmax" in r.stdout
    r = run(p, "-o", tmp_path / "s.mlir")
    assert r.returncode == 0 and "torq-compile: 1 op in bf16 (no integer form): Softmax ×1" in r.stderr
