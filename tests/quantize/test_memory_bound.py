"""Calibration memory is bounded by what the calibrator really holds: MinMax (the default) keeps
each tensor's range per sample, so a deep model whose tensors times the samples exceed the free
memory still quantizes (DenseNet-121 with the default 100 samples was refused as 16.5 GiB); a
histogram calibrator keeps every tensor of every sample and is refused before allocating.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from torq.errors import TorqError
from torq.gen_config.cli import main
from torq.quantize import memory_bound

SIDE, CH, DEPTH = 32, 8, 30            # 32 KiB a tensor, ~2 MiB of tensors a sample


def _deep(path):
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(DEPTH):
        w = numpy_helper.from_array(rng.normal(0, 0.3, (CH, CH, 1, 1)).astype(np.float32), f"w{i}")
        inits.append(w)
        nodes += [helper.make_node("Conv", [x, w.name], [f"c{i}"]), helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x = f"r{i}"
    g = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CH, SIDE, SIDE])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, CH, SIDE, SIDE])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def _quantize(capsys, tmp_path, monkeypatch, *flags):
    monkeypatch.setattr(memory_bound, "available_bytes", lambda: 100 << 20)    # budget 60 MiB
    out = tmp_path / "q.onnx"
    code = main(["quantize", "--model", str(_deep(tmp_path / "m.onnx")), "-o", str(out), "--num-calib", "100", *flags])
    return code, capsys.readouterr().err.strip(), out


def test_minmax_holds_ranges_not_tensors(capsys, tmp_path, monkeypatch):
    inputs, per_sample = memory_bound.sample_bytes(onnx.load(_deep(tmp_path / "m.onnx")))
    assert inputs == CH * SIDE * SIDE * 4 and 100 * per_sample > 60 << 20     # the old bound refused it
    code, err, out = _quantize(capsys, tmp_path, monkeypatch)
    assert code == 0, err
    assert out.exists()


def test_a_histogram_calibrator_is_refused_before_allocating(capsys, tmp_path, monkeypatch):
    code, err, out = _quantize(capsys, tmp_path, monkeypatch, "--calibrate-method", "entropy")
    assert code == 2 and err.count("\n") == 0 and "every intermediate tensor" in err, err
    _, per_sample = memory_bound.sample_bytes(onnx.load(tmp_path / "m.onnx"))
    assert f"--num-calib {(60 << 20) // per_sample} or fewer" in err and not out.exists()


def test_minmax_still_refuses_inputs_that_do_not_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(memory_bound, "available_bytes", lambda: 5 << 20)      # budget 3 MiB
    m = onnx.load(_deep(tmp_path / "m.onnx"))
    with pytest.raises(TorqError, match="one inference's tensors.*--num-calib [0-9]+ or fewer"):
        memory_bound.check(m, 100, "m.onnx", "--num-calib", keeps_tensors=False)
