"""Graph-input sizes: ``--input-shape`` parsing, fixing open dims, and the error for a size still open."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from torq.errors import TorqError
from torq.graph.input_shape import parse_input_shape, set_input_shapes, specialise, static_dims


def paddle_style(opset=11):
    """x[-1,3,-1,'?'] -> Conv3x3 -> MaxPool2 -> GlobalAveragePool -> y[-1,4,1,1]: Paddle's open dims."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, -1, "?"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4, 1, 1])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    return m


def dims(v):
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim]


@pytest.mark.parametrize("text, want", [("x=1,3,48,192", "x=1,3,48,192"), (" x = 1, 3,48 ,192", "x=1,3,48,192"),
                                        ("1x3x48x192", "1,3,48,192"), ("a/b:0=2,3", "a/b:0=2,3")])
def test_parse(text, want):
    assert parse_input_shape(text) == want


@pytest.mark.parametrize("text", ["x=", "=1,2", "x=1,0,3", "x=1,-1", "x=a,b", "", "x=1,,2"])
def test_parse_refuses(text):
    with pytest.raises(TorqError, match="--input-shape .*expected NAME=D0,D1"):
        parse_input_shape(text)


def test_set_fixes_open_dims_and_outputs_follow():
    m = set_input_shapes(paddle_style(), ["x=1,3,48,192"])
    assert dims(m.graph.input[0]) == [1, 3, 48, 192]
    assert dims(paddle_style().graph.input[0]) == [-1, 3, -1, "?"]          # the original is untouched
    onnx.checker.check_model(onnx.shape_inference.infer_shapes(m, strict_mode=True))
    unnamed = set_input_shapes(paddle_style(), ["1,3,48,192"])             # one input: the name may be left out
    assert dims(unnamed.graph.input[0]) == [1, 3, 48, 192]


@pytest.mark.parametrize("shape, words", [
    ("y=1,3,8,8", "no graph input 'y'; the inputs are 'x'"),
    ("x=1,3,8", "input 'x' has rank 4, not 3"),
    ("x=1,4,8,8", "axis 1 of input 'x' is 3 in the model, not 4"),
])
def test_set_refuses(shape, words):
    with pytest.raises(TorqError) as e:
        set_input_shapes(paddle_style(), [shape], "m.onnx")
    assert str(e.value).startswith("m.onnx: --input-shape") and words in str(e.value) and "\n" not in str(e.value)


def test_open_batch_is_one_other_open_dims_refused():
    assert static_dims("x", [None, 3, 8, 8]) == [1, 3, 8, 8]
    assert static_dims("x", ["N", 3, 8, 8]) == [1, 3, 8, 8]
    with pytest.raises(TorqError, match=r"^m.onnx: graph input 'x' has no size at axis 3 \(dim 'W'\): give the "
                                        r"size you deploy with, --input-shape x=1,3,8,D3$"):
        static_dims("x", [-1, 3, 8, "W"], "m.onnx")
    with pytest.raises(TorqError, match=r"axis 2 \(dim -1\).*--input-shape x=1,3,D2,D3"):
        specialise(paddle_style(), "m.onnx")


def test_compile_refuses_then_takes_input_shape(tmp_path, capsys):
    """The whole path on a Paddle-style opset-11 model: quantize needs the size, torq-compile of a
    quantized model with open dims says so, and --input-shape makes both work, bit-exact with ORT
    (opset 11's MaxPool is converted up: torch-mlir imports it from opset 12)."""
    import torq
    from torq.compile_cli import main as compile_main
    from torq.gen_config.cli import main as cli
    fp32 = tmp_path / "paddle.onnx"
    onnx.save(paddle_style(), fp32)
    q = tmp_path / "q.onnx"
    assert cli(["quantize", "--model", str(fp32), "-o", str(q)]) == 2
    err = capsys.readouterr().err.strip()
    assert "graph input 'x' has no size at axis 2" in err and "--input-shape x=1,3,D2,D3" in err and "\n" not in err
    assert cli(["quantize", "--model", str(fp32), "-o", str(q), "--input-shape", "x=1,3,16,24"]) == 0
    assert dims(onnx.load(q).graph.input[0]) == [1, 3, 16, 24]
    assert compile_main([str(q), "--verify-against-ort", "--rounding", "ort"]) == 0
    # a model quantized elsewhere, open dims and all
    open_q = tmp_path / "open_q.onnx"
    onnx.save(torq.quantize(set_input_shapes(paddle_style(), ["x=1,3,16,24"]), num_calib=2), open_q)
    m = onnx.load(open_q)
    for d in m.graph.input[0].type.tensor_type.shape.dim[2:]:
        d.Clear()
        d.dim_value = -1
    del m.graph.value_info[:]
    onnx.save(m, open_q)
    capsys.readouterr()
    assert compile_main([str(open_q)]) == 2
    assert "has no size at axis 2" in capsys.readouterr().err
    assert compile_main([str(open_q), "--input-shape", "x=1,3,16,24", "--verify-against-ort", "--rounding", "ort"]) == 0
