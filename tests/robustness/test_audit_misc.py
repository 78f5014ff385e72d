"""The rest of audit 3 (B29, B35) and the held-out fuzz findings: SIGTERM cleans up, small
message bugs, inconsistent or fully dynamic fp32 models and malformed ``torq.io_quant`` metadata
refused in one line, a lowering that loops stopped by its CPU budget."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from robustness.mutants import qconv
from torq.compile_cli import main as compile_main
from torq.fileio import save_model
from torq.gen_config.cli import main as gen_main


def one_line(capsys, code, *needles):
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "error:" in err and "internal" not in err, err
    for n in needles:
        assert n in err, err
    return err


def conv(path, in_shape, out_shape, **attrs):
    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, .3, (4, 4, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], name="c", **attrs),
             helper.make_node("Relu", ["c"], ["y"], name="r")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def test_auto_pad_with_pads_is_refused_fast(tmp_path, capsys):
    path = conv(tmp_path / "vp.onnx", [1, 4, 8, 8], [1, 4, 8, 8], auto_pad="VALID", pads=[1, 1, 1, 1])
    t0 = time.monotonic()
    one_line(capsys, compile_main([str(path), "-o", str(tmp_path / "x.mlir")]), "auto_pad", "'c'")
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("dims", [["N", "C", "H", "W"], [None, None, None, None]])
def test_fully_dynamic_fp32_models_are_refused(tmp_path, capsys, dims):
    path = conv(tmp_path / "d.onnx", dims, [None] * 4, pads=[1, 1, 1, 1])
    one_line(capsys, compile_main([str(path), "-o", str(tmp_path / "x.mlir")]))
    assert not (tmp_path / "x.mlir").exists()


@pytest.mark.parametrize("value", ["not json", "[]", '{"inputs": {"x": {"scale": "s", "zero_point": 0}}}',
                                   '{"inputs": {"x": {"scale": -1, "zero_point": 0}}}', "[" * 5000])
def test_malformed_io_quant_metadata(tmp_path, capsys, value):
    m = qconv()
    for p in list(m.metadata_props):
        if p.key == "torq.io_quant":
            m.metadata_props.remove(p)
    m.metadata_props.add(key="torq.io_quant", value=value)
    save_model(m, tmp_path / "m.onnx")
    capsys.readouterr()                     # (the quantizer's own log lines)
    one_line(capsys, compile_main([str(tmp_path / "m.onnx"), "-o", str(tmp_path / "x.mlir")]), "torq.io_quant")


@pytest.mark.parametrize("value", ["[" * 100000, "{", "[1, 2]"])
def test_a_foreign_precision_stamp_is_ignored(value):
    """``torq.precision`` metadata a model brought along is not our report: read as none."""
    from torq.quantize.precision import PRECISION_KEY, stamped
    m = onnx.ModelProto()
    m.metadata_props.add(key=PRECISION_KEY, value=value)
    assert stamped(m) is None


def test_a_runaway_lowering_is_stopped_by_its_cpu_budget(monkeypatch):
    from torq.compiler import isolation
    from torq.errors import TorqError

    def spin(model):
        while True:
            pass
    monkeypatch.setenv("TORQ_COMPILE_CPU_S", "2")
    monkeypatch.setattr(isolation, "BISECT_BUDGET_S", 0.0)
    t0 = time.monotonic()
    with pytest.raises(TorqError, match="did not finish within 2 s of CPU"):
        isolation.run_isolated(spin, qconv())
    assert time.monotonic() - t0 < 120


def test_subgraph_selector_that_only_looks_like_a_number(tmp_path, capsys):             # B35
    from torq.examples import build_example_cnn
    build_example_cnn(tmp_path / "m.onnx")
    one_line(capsys, gen_main(["discover", "--model", str(tmp_path / "m.onnx"), "--output-dir", str(tmp_path),
                               "--subgraph-from", "²"]), "no such node")


def test_nothing_to_quantize_does_not_suggest_the_format_used(tmp_path, capsys):        # B35
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "relu.onnx")
    err = one_line(capsys, gen_main(["quantize", "--model", str(tmp_path / "relu.onnx"), "-o",
                                     str(tmp_path / "q.onnx")]), "quantized nothing")
    assert "try --quant-format qdq" not in err


def test_sigterm_during_quantize_leaves_no_temp_folder(tmp_path):                       # B29
    from torq.examples import build_cnn20
    build_cnn20(tmp_path / "m.onnx")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    p = subprocess.Popen([sys.executable, "-m", "torq.gen_config.cli", "quantize", "--model", str(tmp_path / "m.onnx"),
                          "-o", str(tmp_path / "q.onnx"), "--num-calib", "200"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None and not list(tmp.glob("torq-quant-*")):
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    if p.returncode == 0:
        pytest.skip("quantize finished before the signal")
    assert p.returncode == -signal.SIGTERM and err.strip().splitlines()[-1] == "torq-gen-config: terminated", err
    assert not [p.name for p in tmp.iterdir() if p.name != ".ses"]      # (.ses: onnxruntime's import)
