"""Single-op float ONNX models and ORT quantization for lowering tests (real quantize_static)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from torq.quantize import convert_to_full_integer


def model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return onnx.shape_inference.infer_shapes(m)


class Reader(CalibrationDataReader):
    def __init__(self, shapes: dict, n=4, seed=0, lo=-1.0, hi=1.0):
        rng = np.random.default_rng(seed)
        self.data = [{k: rng.uniform(lo, hi, s).astype(np.float32) for k, s in shapes.items()} for _ in range(n)]
        self.i = 0

    def get_next(self):
        if self.i >= len(self.data):
            return None
        self.i += 1
        return self.data[self.i - 1]


def quantize(m: onnx.ModelProto, shapes: dict, fmt="qdq", per_channel=False, act="s8", seed=0,
             lo=-1.0, hi=1.0, full_integer=True, op_types=None, **extra) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "f.onnx", Path(d) / "q.onnx"
        onnx.save(m, src)
        quantize_static(str(src), str(dst), Reader(shapes, seed=seed, lo=lo, hi=hi),
                        quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                        per_channel=per_channel, op_types_to_quantize=op_types,
                        activation_type=QuantType.QUInt8 if act == "u8" else QuantType.QInt8,
                        weight_type=QuantType.QInt8,
                        extra_options={"ForceQuantizeNoInputCheck": True, **extra})
        q = onnx.load(dst)
    return convert_to_full_integer(q) if full_integer else q


def conv_model(rng, cin, cout, k, stride, dilation, pads, group, bias, relu, hw):
    w = rng.normal(0, 1.0 / np.sqrt(cin // group * k * k), (cout, cin // group, k, k))
    inits = {"w": w}
    ins = ["x", "w"]
    if bias:
        inits["b"] = rng.normal(0, 0.2, cout)
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["c" if relu else "y"], kernel_shape=[k, k], strides=[stride] * 2,
                              dilations=[dilation] * 2, pads=pads, group=group)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    return model(nodes, [("x", [1, cin, hw[0], hw[1]])], ["y"], inits)
