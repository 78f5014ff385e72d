"""Multiply-accumulates of a layer, counted the way the reference tool writes ``mac_count``.

One MAC per weight tap per output element (ONNX shapes after inference, batch included):

    Conv / ConvInteger / QLinearConv   prod(output shape) · prod(weight shape[1:])   (groups and
                                       depthwise come out right: weight[1] is C / group)
    ConvTranspose                      prod(input shape) · prod(weight shape[1:])
    Gemm / QGemm                       M · K · N
    MatMul / MatMulInteger / QLinearMatMul   prod(output shape) · K

Every other op counts 0 (an Add or a pool does arithmetic, but no multiply-accumulate of a
weight). A shape that is not static gives ``None``: unknown, not zero. Quantize / Dequantize
nodes around the op (a quantized layer) count 0.
"""
from __future__ import annotations

import onnx

#: op type -> index of its weight input
_CONV_WEIGHT = {"Conv": 1, "ConvInteger": 1, "ConvTranspose": 1, "QLinearConv": 3}
_MATMUL_A = {"MatMul": 0, "MatMulInteger": 0, "QLinearMatMul": 0}
_GEMM = {"Gemm": (0, 1), "QGemm": (0, 3)}


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Tensor name -> static shape (every dim known and positive), from inference + initializers."""
    try:
        g = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - best effort: the declared I/O shapes still count
        g = model.graph
    out = {}
    for vi in (*g.input, *g.output, *g.value_info):
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
            out[vi.name] = [d.dim_value for d in dims]
    for t in g.initializer:
        out[t.name] = list(t.dims)
    return out


def _attr(node, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def node_macs(node: onnx.NodeProto, shapes: dict[str, list[int]]) -> int | None:
    """MACs of one node (0 for ops without weights; None when a needed shape is unknown)."""
    op, ins = node.op_type, list(node.input)
    if op in _CONV_WEIGHT:
        w = shapes.get(ins[_CONV_WEIGHT[op]]) if len(ins) > _CONV_WEIGHT[op] else None
        ref = shapes.get(ins[0] if op == "ConvTranspose" else node.output[0])
        return None if w is None or ref is None else _prod(ref) * _prod(w[1:])
    if op in _GEMM:
        a_i, b_i = _GEMM[op]
        a, b = shapes.get(ins[a_i]), shapes.get(ins[b_i]) if len(ins) > b_i else None
        if a is None or b is None or len(a) != 2 or len(b) != 2:
            return None
        m, k = (a[1], a[0]) if _attr(node, "transA", 0) else (a[0], a[1])
        n = b[0] if _attr(node, "transB", 0) else b[1]
        return int(m) * int(k) * int(n)
    if op in _MATMUL_A:
        a, out = shapes.get(ins[_MATMUL_A[op]]), shapes.get(node.output[0])
        return None if a is None or out is None or not a else _prod(out) * int(a[-1])
    return 0


def model_macs(model: onnx.ModelProto) -> int | None:
    """MACs of every node of a (layer) model; None if any weighted node's shapes are unknown."""
    shapes = _shapes(model)
    total = 0
    for n in model.graph.node:
        m = node_macs(n, shapes)
        if m is None:
            return None
        total += m
    return total


def macs_by_node(model: onnx.ModelProto) -> dict[str, int | None]:
    """{node name (or its first output): MACs} of every node with a weight (``node_macs`` > 0
    or unknown)."""
    shapes = _shapes(model)
    out = {}
    for n in model.graph.node:
        m = node_macs(n, shapes)
        if m != 0:
            out[n.name or n.output[0]] = m
    return out
