"""mac_count as the reference tool counts it, on hand-computed shapes."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from torq.graph.macs import model_macs


def _model(node, inputs, outputs, inits=()):
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                          [numpy_helper.from_array(np.zeros(s, np.float32), n) for n, s in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_conv_grouped_depthwise_and_transpose():
    conv = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4, group=2)
    assert model_macs(_model(conv, [("x", [1, 4, 8, 8])], [("y", [1, 6, 8, 8])], [("w", [6, 2, 3, 3])])) == 6 * 64 * 18
    dw = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4, group=4)
    assert model_macs(_model(dw, [("x", [1, 4, 8, 8])], [("y", [1, 4, 4, 4])], [("w", [4, 1, 3, 3])])) == 64 * 9
    ct = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    assert model_macs(_model(ct, [("x", [1, 4, 5, 5])], [("y", [1, 3, 10, 10])], [("w", [4, 3, 2, 2])])) == 100 * 12


def test_gemm_matmul_and_zero_and_unknown():
    gemm = helper.make_node("Gemm", ["a", "b"], ["y"], transB=1)
    assert model_macs(_model(gemm, [("a", [2, 5])], [("y", [2, 7])], [("b", [7, 5])])) == 2 * 5 * 7
    mm = helper.make_node("MatMul", ["a", "b"], ["y"])
    assert model_macs(_model(mm, [("a", [3, 4, 5])], [("y", [3, 4, 6])], [("b", [5, 6])])) == 72 * 5
    relu = helper.make_node("Relu", ["a"], ["y"])
    assert model_macs(_model(relu, [("a", [2, 5])], [("y", [2, 5])])) == 0
    dyn = helper.make_node("MatMul", ["a", "b"], ["y"])
    assert model_macs(_model(dyn, [("a", ["n", 5])], [("y", ["n", 6])], [("b", [5, 6])])) is None
