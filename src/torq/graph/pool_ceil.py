"""MaxPool ``ceil_mode=1`` → ``ceil_mode=0`` with explicit end padding: same windows, ORT's size.

ONNX Runtime drops a ceil-mode window that would start past the input and its leading pad
(``(out − 1)·stride ≥ in + pad_begin``, PyTorch's rule). ONNX shape inference (onnx 1.23) keeps
it, so a model typed by ONNX declares one row/column more than ORT computes, and torch-mlir
20261001 then fails to cast its (ORT-sized) result to the declared type — with padding, or
with a stride larger than the kernel. A max ignores padded cells, so the same windows in floor
mode only need the end padding stretched to the last window ORT keeps:

    pad_end' = (out − 1)·stride + (kernel − 1)·dilation + 1 − in − pad_begin

which ORT accepts while it stays below the kernel (always, for dilation 1). The shapes declared
downstream of a rewritten pool are dropped and re-inferred.
"""
from __future__ import annotations

import onnx
from onnx import helper


def ort_output_size(size: int, kernel: int, stride: int, dilation: int, begin: int, end: int) -> int:
    """Output extent of a ceil-mode pool as ONNX Runtime computes it (the last window starts
    inside the input or its leading pad)."""
    out = -(-(size + begin + end - (kernel - 1) * dilation - 1) // stride) + 1
    return out - 1 if (out - 1) * stride >= size + begin else out


def floor_pads(shape: list[int], attrs: dict) -> list[int] | None:
    """The ``pads`` that give ``attrs``' ceil-mode windows and ORT's size in floor mode, or None
    when ORT would refuse them (an end pad not below the kernel)."""
    kernel = list(attrs["kernel_shape"])
    rank = len(kernel)
    strides = list(attrs.get("strides", [1] * rank))
    dilations = list(attrs.get("dilations", [1] * rank))
    pads = list(attrs.get("pads", [0] * 2 * rank))
    ends = []
    for i in range(rank):
        size, k, s, d, b = shape[i], kernel[i], strides[i], dilations[i], pads[i]
        out = ort_output_size(size, k, s, d, b, pads[rank + i])
        end = max(0, (out - 1) * s + (k - 1) * d + 1 - size - b)
        if end >= k:
            return None
        ends.append(end)
    return pads[:rank] + ends


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _is_ceil_pool(node: onnx.NodeProto) -> bool:
    a = _attrs(node)
    return (node.op_type == "MaxPool" and node.domain in ("", "ai.onnx") and a.get("ceil_mode", 0) == 1
            and a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET") and "kernel_shape" in a)


def _downstream(g: onnx.GraphProto, roots: list[onnx.NodeProto]) -> set[str]:
    """Every tensor computed from the outputs of ``roots`` (nodes are in topological order)."""
    tainted = {o for n in roots for o in n.output}
    for n in g.node:
        if tainted.intersection(n.input):
            tainted.update(n.output)
    return tainted


def _input_shape(m: onnx.ModelProto, name: str) -> list[int] | None:
    g = onnx.shape_inference.infer_shapes(m).graph
    for v in [*g.input, *g.value_info, *g.output]:
        if v.name == name and v.type.tensor_type.HasField("shape"):
            dims = v.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                return [d.dim_value for d in dims]
    return None


def ceil_pools_to_floor(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every ceil-mode MaxPool in floor form (see module doc); unchanged if none."""
    pools = [n for n in model.graph.node if _is_ceil_pool(n)]
    if not pools:
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    stale = _downstream(g, [n for n in g.node if _is_ceil_pool(n)])
    keep = [v for v in g.value_info if v.name not in stale]
    del g.value_info[:]
    g.value_info.extend(keep)
    for out in g.output:
        if out.name in stale:
            out.type.tensor_type.ClearField("shape")
    for node in [n for n in g.node if _is_ceil_pool(n)]:   # in order: each sees its input re-typed
        shape = _input_shape(m, node.input[0])
        pads = floor_pads(shape[2:], _attrs(node)) if shape and len(shape) > 2 else None
        if pads is None:
            continue   # left to the compiler (a clean error if torch-mlir mis-sizes it)
        kept = [a for a in node.attribute if a.name not in ("ceil_mode", "pads")]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute("pads", pads)])
    return onnx.shape_inference.infer_shapes(m)   # also types the outputs whose shape was dropped
