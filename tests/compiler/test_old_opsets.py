"""Models below the opset torch-mlir's importer knows an op from (a Paddle export at opset 11) are
converted up before import: MaxPool lowers, Softmax runs as a bf16 island (not an import failure)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import torq
from torq.verify import verify


def conv_then(op, opset=11, **attrs):
    w = numpy_helper.from_array(np.random.default_rng(1).normal(0, 0.3, (4, 3, 1, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node(op, ["c"], ["y"], **attrs)]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w]),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    return onnx.shape_inference.infer_shapes(m)


def test_opset11_maxpool_lowers_bit_exact():
    q = torq.quantize(conv_then("MaxPool", kernel_shape=[2, 2], strides=[2, 2]), num_calib=2)
    assert q.opset_import[0].version == 11
    c = torq.compile(q)
    assert c.report.lowered.get("maxpool2d") == 1 and not c.report.unsupported
    assert verify(c, seed=0, modes=("ort",)).ok


def test_opset11_softmax_runs_as_a_bf16_island():
    q = torq.quantize(conv_then("Softmax", axis=1), num_calib=2)
    c = torq.compile(q)
    assert c.report.unsupported == [] and c.report.islands_line() == "1 op in bf16 (no integer form): Softmax ×1"
    assert verify(c, seed=0).ok
    causes = [u for u in torq.compile(q, bf16_islands=False).report.unsupported if not u.consequence]
    assert [u.onnx_op for u in causes] == ["Softmax"] and "no exact integer form" in causes[0].why
