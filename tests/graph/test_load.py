"""Safe loading: each kind of bad model file is one clear TorqError naming file/node/tensor."""
import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qmodels import BAD_MODEL_FILES, bad_model_file, model, vi, weight
from torq.errors import TorqError
from torq.examples import build_example_cnn
from torq.graph import is_quantized, load_model


def _err(path_or_model) -> str:
    with pytest.raises(TorqError) as e:
        load_model(path_or_model)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_loads_good_model_and_copies_protos(tmp_path):
    m = build_example_cnn(tmp_path / "m.onnx")
    assert load_model(tmp_path / "m.onnx") == m
    assert load_model(str(tmp_path / "m.onnx")) == m
    copy = load_model(m)
    assert copy == m and copy is not m


@pytest.mark.parametrize("kind, expect", BAD_MODEL_FILES.items())
def test_bad_files(tmp_path, kind, expect):
    p = bad_model_file(tmp_path, kind)
    msg = _err(p)
    assert str(p) in msg and expect in msg


def test_unknown_custom_domain_names_node_and_domain():
    m = model([helper.make_node("Frobnicate", ["x"], ["y"], name="frob0", domain="acme.ops")],
              [vi("x", [1, 4])], [vi("y", [1, 4])],
              opsets=[helper.make_opsetid("", 17), helper.make_opsetid("acme.ops", 1)])
    msg = _err(m)
    assert "frob0" in msg and "acme.ops" in msg


def test_microsoft_domain_is_accepted():
    m = model([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")],
              [vi("x", [1, 4])], [vi("y", [1, 4])],
              opsets=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    load_model(m)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_weights_name_the_initializer(bad):
    w = numpy_helper.to_array(weight("w", (4, 3, 3, 3))).copy()
    w[1, 2, 0, 0] = bad
    m = model([helper.make_node("Conv", ["x", "w"], ["y"])], [vi("x", [1, 3, 8, 8])],
              [vi("y", [1, 4, 6, 6])], [numpy_helper.from_array(w, "w")])
    msg = _err(m)
    assert "'w'" in msg and ("NaN" if np.isnan(bad) else "Inf") in msg


def test_checker_failure_is_a_torq_error():
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r", bogus=1)], [vi("x", [1])], [vi("y", [1])])
    assert "invalid ONNX model" in _err(m)


def _external_model(tmp_path):
    """Example CNN saved with every weight in one external file next to it."""
    d = tmp_path / "model"
    d.mkdir()
    m = build_example_cnn()
    onnx.save_model(m, d / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    return d / "m.onnx", m


def _set_location(path, loc):
    m = onnx.load(path, load_external_data=False)
    t = next(t for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    for e in t.external_data:
        if e.key == "location":
            e.value = loc
    onnx.save(m, path)
    return t.name


def test_external_data_inside_folder_loads(tmp_path):
    path, _ = _external_model(tmp_path)  # (save_model moved that proto's weights out)
    loaded = load_model(path)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.graph.initializer)
    for a, b in zip(loaded.graph.initializer, build_example_cnn().graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


@pytest.mark.parametrize("loc, expect", [
    ("../../etc/passwd", "outside"), ("/etc/passwd", "absolute"), ("missing.bin", "not found"),
])
def test_external_data_escapes_are_rejected(tmp_path, loc, expect):
    path, _ = _external_model(tmp_path)
    name = _set_location(path, loc)
    msg = _err(path)
    assert name in msg and loc in msg and expect in msg


def test_external_data_symlink_pointing_outside_is_rejected(tmp_path):
    path, _ = _external_model(tmp_path)
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"\0" * 100000)
    os.symlink(outside, path.parent / "link.bin")
    name = _set_location(path, "link.bin")
    msg = _err(path)
    assert name in msg and "link.bin" in msg and "outside" in msg


def test_external_data_beyond_end_of_file(tmp_path):
    path, _ = _external_model(tmp_path)
    (path.parent / "weights.bin").write_bytes(b"\0" * 8)
    assert "beyond the end" in _err(path)


def test_is_quantized():
    from torq.quantize import quantize
    fp = build_example_cnn()
    assert not is_quantized(fp)
    assert is_quantized(quantize(fp, quant_format="qdq"))
    assert is_quantized(quantize(fp, quant_format="qoperator", full_integer=True))
    int8_io = model([helper.make_node("Identity", ["x"], ["y"])],
                    [vi("x", [4], onnx.TensorProto.INT8)], [vi("y", [4], onnx.TensorProto.INT8)])
    assert is_quantized(int8_io)
    int8_w = model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [vi("x", [2, 4], onnx.TensorProto.INT8)], [vi("y", [2, 3], onnx.TensorProto.INT32)],
                   [numpy_helper.from_array(np.ones((4, 3), np.int8), "w")])
    assert is_quantized(int8_w)
    quickgelu = model([helper.make_node("QuickGelu", ["x"], ["y"], domain="com.microsoft")],
                      [vi("x", [4])], [vi("y", [4])],
                      opsets=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    assert not is_quantized(quickgelu)  # a float contrib op, despite the leading Q
