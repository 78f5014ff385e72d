"""--full-integer says which graph I/O it could not make integer, and why."""
from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from qmodels import Reader, model
from qmodels import quantize as ort_quantize
from torq.quantize import quantize
from torq.quantize.full_integer import left_float
from torq.quantize.summary import summary_lines


def conv_then_mean():
    """Conv -> x.mean(3).mean(2) as the graph output (torchvision's backbone tail): ORT leaves
    the means in float, so no DequantizeLinear produces the output."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.5, (4, 3, 1, 1)).astype(np.float32), "w")
    return model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                  helper.make_node("ReduceMean", ["c"], ["m"], name="mean3", axes=[3], keepdims=0),
                  helper.make_node("ReduceMean", ["m"], ["y"], name="mean2", axes=[2], keepdims=0)],
                 [("x", [1, 3, 5, 5])], ["y"], [w])


def test_full_integer_names_the_output_it_left_float():
    """ORT's own QDQ quantizer leaves the tail float; --full-integer on its model says so."""
    fp32 = conv_then_mean()
    q = ort_quantize(fp32, {"x": [1, 3, 5, 5]}, "qdq")
    reasons = left_float(q)
    assert list(reasons) == ["y"] and "ReduceMean 'mean2'" in reasons["y"], reasons
    warn = [ln for ln in summary_lines(fp32, q) if ln.startswith("warning:")]
    assert warn == [f"warning:  --full-integer: {reasons['y']}"]


def test_no_warning_when_every_io_is_integer():
    fp32 = model([helper.make_node("Conv", ["x", "w"], ["y"])], [("x", [1, 3, 5, 5])], ["y"],
                 {"w": np.ones((4, 3, 1, 1), np.float32)})
    q = quantize(fp32, full_integer=True, calibration_data_reader=Reader({"x": [1, 3, 5, 5]}))
    assert left_float(q) == {} and not [ln for ln in summary_lines(fp32, q) if ln.startswith("warning:")]


def test_torq_quantizes_the_float_tail_so_the_output_is_int8():
    q = quantize(conv_then_mean(), quant_format="qdq", full_integer=True,
                 calibration_data_reader=Reader({"x": [1, 3, 5, 5]}))
    assert left_float(q) == {} and q.graph.output[0].type.tensor_type.elem_type == 3   # int8
