"""Small checker-valid models with one hostile value each (shared by the robustness tests)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from qmodels import conv_model, model, quantize


def qconv(per_channel: bool = False) -> onnx.ModelProto:
    """Conv(4->4, 3x3) + Relu on 1x4x8x8, quantized by ORT (QDQ, full-integer)."""
    m = conv_model(np.random.default_rng(0), 4, 4, 3, 1, 1, [1, 1, 1, 1], 1, True, True, (8, 8))
    return quantize(m, {"x": [1, 4, 8, 8]}, per_channel=per_channel)


def qflatten() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1], name="conv"),
               helper.make_node("Flatten", ["c"], ["y"], axis=1, name="flat")],
              [("x", [1, 4, 4, 4])], ["y"], {"w": rng.normal(size=(4, 4, 1, 1))})
    return quantize(m, {"x": [1, 4, 4, 4]})


def nodes(m: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in m.graph.node if n.op_type == op_type]


def set_attr(node: onnx.NodeProto, name: str, value) -> None:
    for a in node.attribute:
        if a.name == name:
            node.attribute.remove(a)
            break
    node.attribute.append(helper.make_attribute(name, value))


def copy(m: onnx.ModelProto) -> onnx.ModelProto:
    c = onnx.ModelProto()
    c.CopyFrom(m)
    return c


def crash_cases() -> dict[str, tuple[onnx.ModelProto, str]]:
    """name -> (model, the node the error must name): the cases that crashed torch-mlir natively."""
    out = {}
    for g in (0, -1):
        m = qconv()
        conv = nodes(m, "Conv")[0]
        conv.name = "conv1"
        set_attr(conv, "group", g)
        out[f"conv_group_{g}"] = (m, "'conv1' (Conv)")
    m = qconv(per_channel=True)
    dq = next(n for n in nodes(m, "DequantizeLinear") if n.input[0] == "w_quantized")
    dq.name = "w_dq"
    set_attr(dq, "axis", 5)
    out["dequantize_axis_5"] = (m, "'w_dq' (DequantizeLinear)")
    m = qflatten()
    set_attr(nodes(m, "Flatten")[0], "axis", -2**63)
    out["flatten_axis_min_int64"] = (m, "'flat' (Flatten)")
    m = qconv()
    m.opset_import[0].version = 1
    out["opset_1"] = (m, "b_DequantizeLinear")   # the checker names the first node opset 1 lacks
    return out
