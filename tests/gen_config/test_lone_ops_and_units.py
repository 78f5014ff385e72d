"""Per-layer quantization of lone ops, the comparison rule (with injected faults), LCS mapping,
recommendation rules, partition of a model into executor segments."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from torq.errors import TorqError
from torq.gen_config import mapping, schema
from torq.gen_config.compare import compare
from torq.gen_config.layer_test import LAYER_INPUT_RANGE
from torq.graph.inputs import random_inputs
from torq.quantize import quantize
from torq import reference


def _single(op, **attrs):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g", [x], [y])
    return onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_lone_relu_is_refused_without_wrapping():
    with pytest.raises(TorqError, match="quantized nothing"):
        quantize(_single("Relu"))


@pytest.mark.parametrize("op,fmt", [("Relu", "qdq"), ("HardSwish", "qdq"), ("Relu", "qoperator"), ("Flatten", "qoperator"),
                                    ("GlobalAveragePool", "qoperator"), ("HardSigmoid", "qdq")])
def test_lone_op_wrapped_lowers_on_nss_bit_exact(op, fmt):
    import torq
    q = quantize(_single(op), quant_format=fmt, full_integer=True, wrap_lone_ops=True)
    types = [n.op_type for n in q.graph.node]
    assert types == ["DequantizeLinear", op, "QuantizeLinear"]
    assert q.graph.input[0].type.tensor_type.elem_type == TensorProto.INT8
    compiled = torq.compile(q)
    assert not compiled.report.unsupported
    x = random_inputs(q, 1)
    assert np.array_equal(compiled.run(x, rounding="ort")["y"], reference.run(q, x)["y"])


def test_lone_relu_ranges_are_the_calibrated_ones():
    """Relu output range [0, max]: zero point -128 (int8), scale = max/255 of the calibration data."""
    from onnx import numpy_helper
    q = quantize(_single("Relu"), wrap_lone_ops=True)
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    out_q = [n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "y__torq_f"][0]
    assert int(inits[out_q.input[2]]) == -128
    assert 0.98 / 255 < float(inits[out_q.input[1]]) <= 1.0 / 255 + 1e-9   # calibration: uniform [-1, 1)


def test_compare_integer_rule_with_injected_faults():
    ref = {"y": np.array([1, 2, 3], np.int8)}
    assert compare({"y": np.array([2, 1, 3], np.int8)}, ref, 0.01)[0]          # ±1 LSB passes
    ok, diff = compare({"y": np.array([1, 4, 3], np.int8)}, ref, 0.01)           # 2 LSB fails
    assert not ok and diff["max_abs_diff"] == 2
    assert not compare({"y": np.zeros(4, np.int8)}, ref, 0.01)[0]                # shape mismatch
    assert not compare({}, ref, 0.01)[0]                                         # missing output


def test_compare_float_rule_with_injected_fault():
    ref = {"y": np.array([100.0, -1.0], np.float32)}
    assert compare({"y": np.array([101.0, -1.0], np.float32)}, ref, 0.01)[0]   # rel 0.005
    assert not compare({"y": np.array([104.0, -1.0], np.float32)}, ref, 0.01)[0]


def test_compare_dequantized_float_outputs_in_lsb():
    ref = {"y": np.array([0.0, 0.1, 5.0], np.float32)}
    one_lsb = {"y": np.array([0.1, 0.0, 5.1], np.float32)}
    assert not compare(one_lsb, ref, 0.01)[0]                     # relative rule: 100% error at 0
    assert compare(one_lsb, ref, 0.01, {"y": 0.1})[0]             # 1 LSB of a DQ output
    assert not compare({"y": np.array([0.2, 0.1, 5.0], np.float32)}, ref, 0.01, {"y": 0.1})[0]


def test_random_inputs_ranges():
    m = _single("Relu")
    x = random_inputs(m, 0, LAYER_INPUT_RANGE)["x"]
    assert x.dtype == np.float32 and x.min() >= -40 and x.max() < 40 and x.std() > 15
    assert np.array_equal(x, random_inputs(m, 0, LAYER_INPUT_RANGE)["x"])


def test_lcs_alignment_drops_fused_ops():
    layers = ["Conv", "Relu", "Conv", "Relu", "Add", "MaxPool"]
    locs = [("DequantizeLinear", "1:1"), ("QLinearConv", "2:1"), ("QLinearConv", "3:1"),
            ("QuantizeLinear", "4:1"), ("QLinearAdd", "5:1"), ("MaxPool", "6:1")]
    assert mapping.map_layers(layers, locs) == [(0, "2:1"), (None, None), (1, "3:1"), (None, None),
                                                (2, "5:1"), (3, "6:1")]


def test_recommendation_rules():
    ok, diff, err = {"status": "success"}, {"status": "difference"}, {"status": "error"}
    assert schema.recommend({"nss": err, "css": ok, "host": ok}) == "css"
    assert schema.recommend({"nss": diff, "css": err}) == "nss"
    assert schema.recommend({"nss": err, "host": err}) is None
    timed = {"nss": {**ok, "timing": {"runtime_ms": 5.0}}, "host": {**ok, "timing": {"runtime_ms": 1.0}}}
    assert schema.recommend(timed, by_timing=True) == "host" and schema.recommend(timed) == "nss"


def test_partition_duplicates_a_dq_read_on_two_executors():
    from torq.gen_config.partition import segments
    n = helper.make_node
    nodes = [n("DequantizeLinear", ["a", "s", "z"], ["a_f"]), n("Conv", ["a_f", "w"], ["c"]),
             n("QuantizeLinear", ["c", "s", "z"], ["c_q"]), n("DequantizeLinear", ["c_q", "s", "z"], ["c_f"]),
             n("Relu", ["c_f"], ["r"]), n("Add", ["r", "c_f"], ["y"])]
    segs = segments(nodes, {1: "nss", 4: "host", 5: "nss"})
    assert [(s.executor, s.nodes) for s in segs] == [("nss", [0, 1, 2]), ("host", [3, 4]), ("nss", [3, 5])]
