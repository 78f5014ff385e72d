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


def test_the_bound_counts_the_samples_the_data_has(capsys, tmp_path, monkeypatch):
    """--num-calib is at most: 5 samples on disk under --num-calib 100 are 5 samples held, so a
    histogram calibrator that fits 5 is not refused for 100 (a 91-photo folder under the default
    was refused this way)."""
    _deep(tmp_path / "m.onnx")
    _, per_sample = memory_bound.sample_bytes(onnx.load(tmp_path / "m.onnx"))
    fits = (60 << 20) // per_sample
    assert 5 <= fits < 100
    np.savez(tmp_path / "c.npz", x=np.random.default_rng(0).uniform(0, 1, (5, 1, CH, SIDE, SIDE)).astype(np.float32))
    code, err, out = _quantize(capsys, tmp_path, monkeypatch, "--calibrate-method", "entropy",
                               "--calibration-data", str(tmp_path / "c.npz"))
    assert code == 0 and out.exists(), err


def test_minmax_still_refuses_inputs_that_do_not_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(memory_bound, "available_bytes", lambda: 5 << 20)      # budget 3 MiB
    m = onnx.load(_deep(tmp_path / "m.onnx"))
    with pytest.raises(TorqError, match="one inference's tensors.*--num-calib [0-9]+ or fewer"):
        memory_bound.check(m, 100, "m.onnx", "--num-calib", keeps_tensors=False)


def test_auto_streams_samples_that_fit_one_at_a_time(capsys, tmp_path, monkeypatch):
    """``--precision auto`` with MinMax holds the samples' inputs and one chunk of tensors (its
    sensitivity streams): admitted where holding every tensor would be refused, and its chunks
    are what the budget allows; with a histogram calibrator it is refused as before."""
    from torq.quantize import sensitivity
    from torq.quantize.recipe import keeps_tensors, preset
    assert not keeps_tensors(preset("mixed")) and keeps_tensors(preset("mixed").replace(calibrate_method="entropy"))
    m = onnx.load(_deep(tmp_path / "m.onnx"))
    monkeypatch.setattr(memory_bound, "available_bytes", lambda: 100 << 20)
    with pytest.raises(TorqError, match="every intermediate tensor"):             # what auto was held to
        memory_bound.check(m, 100, "m.onnx", "--num-calib", keeps_tensors=True)
    chunks = sensitivity.chunks
    seen = []
    monkeypatch.setattr(sensitivity, "chunks", lambda *a: seen.append([len(p) for p in chunks(*a)]) or chunks(*a))
    code, err, out = _quantize(capsys, tmp_path, monkeypatch, "--precision", "auto", "--accuracy-budget", "0")
    assert code == 0, err
    assert out.exists()
    inputs, per_sample = memory_bound.sample_bytes(m)
    at_once = min((60 << 20) - 67 * inputs, memory_bound.CHUNK_BYTES) // per_sample    # 67 calibration, 33 held apart
    assert seen and 1 < max(seen[0]) <= at_once < 67 and sum(seen[0]) == 67, seen
    code, err, _ = _quantize(capsys, tmp_path, monkeypatch, "--precision", "auto", "--accuracy-budget", "0",
                             "--calibrate-method", "entropy")
    assert code == 2 and "every intermediate tensor" in err, err


def test_auto_is_refused_when_the_inputs_do_not_fit(capsys, tmp_path, monkeypatch):
    """What auto cannot stream is the samples' inputs (all of them are split and kept): the
    one-line refusal names them and one inference's tensors."""
    monkeypatch.setattr(memory_bound, "available_bytes", lambda: 5 << 20)        # budget 3 MiB < 100 inputs
    code = main(["quantize", "--model", str(_deep(tmp_path / "m.onnx")), "-o", str(tmp_path / "q.onnx"),
                 "--num-calib", "100", "--precision", "auto", "--accuracy-budget", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "one inference's tensors" in err, err
    inputs, per_sample = memory_bound.sample_bytes(onnx.load(tmp_path / "m.onnx"))
    fits = ((3 << 20) - (per_sample - inputs)) // inputs
    assert f"--num-calib {fits} or fewer" in err and "of 32.0 KiB each" in err and not (tmp_path / "q.onnx").exists(), err


def test_tensors_behind_computed_pads_are_counted():
    """A Pad whose pads are computed (as an unfolded EfficientNet-Lite exports them) leaves ONNX's
    shape inference without sizes behind it; ORT's symbolic inference follows the arithmetic."""
    half = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "half")
    w = numpy_helper.from_array(np.ones((CH, CH, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Add", ["half", "half"], ["pads"]),              # 2 on each side
             helper.make_node("Pad", ["x", "pads"], ["p"]), helper.make_node("Conv", ["p", "w"], ["y"])]
    g = helper.make_graph(nodes, "pad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CH, SIDE, SIDE])],
                          [helper.make_empty_tensor_value_info("y")], [half, w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    padded = CH * (SIDE + 4) ** 2 * 4
    assert memory_bound.sample_bytes(m) == (CH * SIDE * SIDE * 4, CH * SIDE * SIDE * 4 + 2 * padded + 8 * 8)
