"""graph/validate.py: each hostile value is refused with the node and attribute named; sane models pass."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from robustness.mutants import copy, nodes, qconv, qflatten, set_attr
from torq.errors import TorqError
from torq.graph.validate import MAX_OPSET, validate


def conv(**attrs):
    w = numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c", **{"kernel_shape": [3, 3], **attrs})
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def single(op, shape, out_shape=None, **attrs):
    node = helper.make_node(op, ["x"], ["y"], name="n", **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def refused(m, *words):
    with pytest.raises(TorqError) as e:
        validate(m, "m.onnx")
    msg = str(e.value)
    assert msg.startswith("m.onnx: ") and "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_sane_models_pass():
    validate(conv(group=2))
    validate(qconv())
    validate(qconv(per_channel=True))
    validate(qflatten())
    validate(single("Flatten", [1, 2, 3], axis=3))
    validate(single("Softmax", [1, 5], axis=-1))


@pytest.mark.parametrize("attrs, words", [
    ({"group": 0}, ["node 'c' (Conv)", "'group' is 0"]),
    ({"group": -3}, ["'group' is -3"]),
    ({"group": 3}, ["'group' 3 does not divide the 4 output channels"]),
    ({"group": 4}, ["'group' is 4: the input has 4 channels but the weight expects 8"]),
    ({"strides": [0, 1]}, ["'strides' has value 0"]),
    ({"strides": [1, 1, 1]}, ["'strides' has 3 values, expected 2"]),
    ({"dilations": [1, 2**40]}, ["'dilations' has value 1099511627776"]),
    ({"pads": [1, 1, -1, 1]}, ["'pads' has value -1"]),
    ({"pads": [1, 1]}, ["'pads' has 2 values, expected 4"]),
    ({"kernel_shape": [5, 5]}, ["'kernel_shape' [5, 5] does not match the weight's [3, 3]"]),
    ({"auto_pad": "SAME_MIDDLE"}, ["'auto_pad' is 'SAME_MIDDLE'"]),
])
def test_conv_attributes(attrs, words):
    refused(conv(**{"group": 2, **attrs}), *words)


@pytest.mark.parametrize("op, shape, attrs, words", [
    ("Flatten", [1, 2, 3], {"axis": 4}, ["node 'n' (Flatten)", "'axis' is 4", "valid: -3..3"]),
    ("Flatten", [1, 2, 3], {"axis": -2**63}, ["'axis' is -9223372036854775808"]),
    ("Softmax", [1, 5], {"axis": 2}, ["(Softmax)", "valid: -2..1"]),
    ("Concat", [1, 5], {"axis": -3}, ["(Concat)", "'axis' is -3"]),
    ("MaxPool", [1, 2, 4, 4], {"kernel_shape": [0, 2]}, ["(MaxPool)", "'kernel_shape' has value 0"]),
    ("MaxPool", [1, 2, 4, 4], {"kernel_shape": [2, 2], "ceil_mode": 7}, ["'ceil_mode' is 7"]),
    ("MaxPool", [1, 2, 4, 4], {}, ["'kernel_shape' is missing"]),
    ("Transpose", [1, 2, 3], {"perm": [0, 0, 1]}, ["'perm' [0, 0, 1] is not a permutation"]),
    ("Transpose", [1, 2, 3], {"perm": [1, 0]}, ["'perm' [1, 0]"]),
])
def test_axis_and_window_attributes(op, shape, attrs, words):
    refused(single(op, shape, **attrs), *words)


def test_dequantize_axis_and_per_axis_scale():
    m = qconv(per_channel=True)
    dq = next(n for n in nodes(m, "DequantizeLinear") if n.input[0] == "w_quantized")
    bad = copy(m)
    set_attr(next(n for n in nodes(bad, "DequantizeLinear") if n.input[0] == "w_quantized"), "axis", 4)
    refused(bad, f"node '{dq.name}' (DequantizeLinear)", "'axis' is 4, out of range for an input of rank 4")
    bad = copy(m)
    set_attr(next(n for n in nodes(bad, "DequantizeLinear") if n.input[0] == "w_quantized"), "axis", 2)
    refused(bad, "'axis' is 2: the scale has 4 entries but that axis has 3")


@pytest.mark.parametrize("version", [1, 6, MAX_OPSET + 1])
def test_opset_out_of_range(version):
    m = conv(group=2)
    m.opset_import[0].version = version
    refused(m, f"ai.onnx opset {version} is not supported (supported: 10..{MAX_OPSET}")


@pytest.mark.parametrize("dims, words", [([1, 0, 8, 8], ["graph input 'x' has dim 0"]),
                                         ([1, 4, 2**21, 8], ["has dim 2097152"]),
                                         ([64, 4, 2**11, 2**11], ["has 1073741824 elements"])])
def test_input_dims_positive_and_bounded(dims, words):
    m = conv(group=2)
    for d, v in zip(m.graph.input[0].type.tensor_type.shape.dim, dims):
        d.dim_value = v
    refused(m, *words)


def test_value_info_dims():
    m = single("Relu", [1, 2], out_shape=[1, -5])
    refused(m, "value 'y' declares dim -5")


def test_names_are_quoted_on_one_line():
    m = conv(group=0)
    m.graph.node[0].name = "evil\nname"
    assert "node 'evil\\nname' (Conv)" in refused(m)


@pytest.mark.parametrize("value, shown", [(0.0, "is 0"), (-1.0, "is -1"), (1e-45, "is 1.4013e-45"),
                                          (np.inf, "is inf"), (np.nan, "is nan")])
def test_quantization_scales_positive_finite_normal(value, shown):
    m = qconv()
    q = next(n for n in nodes(m, "QuantizeLinear"))
    scale = next(t for t in m.graph.initializer if t.name == q.input[1])
    scale.CopyFrom(numpy_helper.from_array(np.asarray(value, np.float32), scale.name))
    refused(m, f"node '{q.name}' (QuantizeLinear): scale '{scale.name}' {shown} (scales must be finite")


def test_shapes_that_do_not_agree_are_refused_naming_the_node():
    """A MaxPool whose strides changed while the declared shapes did not: ORT loads it (lenient
    merge), then fails inside a later pass; the check names the first node that cannot agree."""
    from robustness.fuzz import seeds
    from torq.graph.validate import check_consistent
    m = copy(seeds()["cnn"][0])
    check_consistent(m, "m.onnx")
    set_attr(nodes(m, "MaxPool")[0], "strides", [3, 2])
    with pytest.raises(TorqError) as e:
        check_consistent(m, "m.onnx")
    msg = str(e.value)
    assert msg.startswith("m.onnx: the graph's shapes do not agree at node 'fc' (Gemm): ") and "\n" not in msg
    assert "64 and 48" in msg
