"""MaxPool ``ceil_mode=1`` → ``ceil_mode=0`` with explicit end padding: same windows, ORT's size.

ONNX Runtime drops a ceil-mode window that would start past the input and its leading pad
(``(out − 1)·stride ≥ in + pad_begin``, PyTorch's rule). ONNX shape inference (onnx 1.23) keeps
it, so a model typed by ONNX declares one row/column more than ORT computes, and torch-mlir
20261001 then fails to cast its (ORT-sized) result to the declared type — with padding, or
with a stride larger than the kernel. A max ignores padded cells, so the same windows in floor
mode only need the end padding stretched to the last window ORT keeps:

    pad_end' = (out − 1)·stride + (kernel − 1)·dilation + 1 − in − pad_begin

The shapes declared downstream of a rewritten pool are dropped and re-inferred.

The pads move to an explicit constant ``Pad`` before the pool (−inf for float, the dtype's
minimum for int8/uint8: same maxima, every window keeps a real cell) when an end pad reaches
the kernel (dilated pools; ORT refuses such pool pads) or when an integer (QOperator) pool's
pads are asymmetric: torch-mlir pads those through a float −1.8e308, which is no int8 value.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: the padding value that never wins a max, per element type
_PAD_MIN = {TensorProto.FLOAT: np.float32(-np.inf), TensorProto.INT8: np.int8(-128),
            TensorProto.UINT8: np.uint8(0)}


def ort_output_size(size: int, kernel: int, stride: int, dilation: int, begin: int, end: int) -> int:
    """Output extent of a ceil-mode pool as ONNX Runtime computes it (the last window starts
    inside the input or its leading pad)."""
    out = -(-(size + begin + end - (kernel - 1) * dilation - 1) // stride) + 1
    return out - 1 if (out - 1) * stride >= size + begin else out


def floor_pads(shape: list[int], attrs: dict) -> list[int]:
    """The ``pads`` that give ``attrs``' ceil-mode windows and ORT's size in floor mode."""
    kernel = list(attrs["kernel_shape"])
    rank = len(kernel)
    strides = list(attrs.get("strides", [1] * rank))
    dilations = list(attrs.get("dilations", [1] * rank))
    pads = list(attrs.get("pads", [0] * 2 * rank))
    ends = []
    for i in range(rank):
        size, k, s, d, b = shape[i], kernel[i], strides[i], dilations[i], pads[i]
        out = ort_output_size(size, k, s, d, b, pads[rank + i])
        ends.append(max(0, (out - 1) * s + (k - 1) * d + 1 - size - b))
    return pads[:rank] + ends


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _is_ceil_pool(node: onnx.NodeProto) -> bool:
    a = _attrs(node)
    return (node.op_type == "MaxPool" and node.domain in ("", "ai.onnx") and a.get("ceil_mode", 0) == 1
            and a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET") and "kernel_shape" in a)


def _downstream(g: onnx.GraphProto, root: onnx.NodeProto) -> set[str]:
    """Every tensor computed from the outputs of ``root`` (nodes are in topological order)."""
    tainted = set(root.output)
    for n in g.node:
        if tainted.intersection(n.input):
            tainted.update(n.output)
    return tainted


def _forget_shapes(g: onnx.GraphProto, names: set[str]) -> None:
    """Drop the declared shapes of ``names`` (value_info, and the dims of graph outputs)."""
    keep = [v for v in g.value_info if v.name not in names]
    del g.value_info[:]
    g.value_info.extend(keep)
    for out in g.output:
        if out.name in names:
            out.type.tensor_type.ClearField("shape")


def _shapes(m: onnx.ModelProto) -> dict[str, tuple[list[int], int]]:
    """Tensor name -> (static shape, element type), by ONNX shape inference."""
    g = onnx.shape_inference.infer_shapes(m).graph
    out = {}
    for v in [*g.input, *g.value_info, *g.output]:
        dims = v.type.tensor_type.shape.dim
        if v.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            out[v.name] = ([d.dim_value for d in dims], v.type.tensor_type.elem_type)
    return out


def _needs_explicit_pad(pads: list[int], kernel: list[int], elem: int) -> bool:
    r = len(kernel)
    return any(e >= k for e, k in zip(pads[r:], kernel)) or (elem != TensorProto.FLOAT and pads[:r] != pads[r:])


def _explicit_pad(g: onnx.GraphProto, node: onnx.NodeProto, pads: list[int], elem: int) -> onnx.NodeProto:
    """A constant ``Pad`` of ``node``'s input with ``_PAD_MIN``; the pool keeps no pads."""
    base = f"{node.name or node.output[0]}_ceil_pad"
    r = len(pads) // 2
    g.initializer.extend([numpy_helper.from_array(np.array([0, 0, *pads[:r], 0, 0, *pads[r:]], np.int64),
                                                  f"{base}_pads"),
                          numpy_helper.from_array(np.array(_PAD_MIN[elem]), f"{base}_value")])
    pad = helper.make_node("Pad", [node.input[0], f"{base}_pads", f"{base}_value"], [f"{base}_out"],
                           name=base, mode="constant")
    node.input[0] = pad.output[0]
    kept = [a for a in node.attribute if a.name != "pads"]
    del node.attribute[:]
    node.attribute.extend(kept)
    return pad


def ceil_pools_to_floor(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every ceil-mode MaxPool in floor form (see module doc); unchanged if none.

    One shape inference, plus two per pool whose declared output was mis-sized (its downstream
    shapes are forgotten and re-inferred so that later pools see their true input size)."""
    if not any(_is_ceil_pool(n) for n in model.graph.node):
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    shapes, changed = _shapes(m), False
    for out in [n.output[0] for n in g.node if _is_ceil_pool(n)]:
        node = next(n for n in g.node if out in n.output)   # _insert_before rebuilds g.node
        shape, elem = shapes.get(node.input[0], (None, None))
        if not shape or len(shape) < 3:
            continue   # untyped: left to the compiler (a clean error if torch-mlir mis-sizes it)
        pads = floor_pads(shape[2:], _attrs(node))
        explicit = _needs_explicit_pad(pads, list(_attrs(node)["kernel_shape"]), elem)
        if explicit and (elem not in _PAD_MIN or _opset(m) < 11):
            continue
        kept = [a for a in node.attribute if a.name not in ("ceil_mode", "pads")]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute("pads", pads)])
        mis_sized = shapes.get(node.output[0], ([],))[0][2:] != _floor_size(shape[2:], _attrs(node))
        if mis_sized:
            _forget_shapes(g, _downstream(g, node))
        if explicit:
            _insert_before(g, node.output[0], _explicit_pad(g, node, pads, elem))
        if mis_sized:
            shapes = _shapes(m)
        changed |= mis_sized or explicit
    return onnx.shape_inference.infer_shapes(m) if changed else m


def _insert_before(g: onnx.GraphProto, output: str, new: onnx.NodeProto) -> None:
    """Put ``new`` right before the node writing ``output``."""
    nodes = []
    for n in g.node:
        nodes += [new, n] if output in n.output else [n]
    del g.node[:]
    g.node.extend(nodes)


def _opset(m: onnx.ModelProto) -> int:
    return next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)


def _floor_size(spatial: list[int], attrs: dict) -> list[int]:
    k = list(attrs["kernel_shape"])
    r = len(k)
    s, d, p = attrs.get("strides", [1] * r), attrs.get("dilations", [1] * r), attrs.get("pads", [0] * 2 * r)
    return [(spatial[i] + p[i] + p[r + i] - (k[i] - 1) * d[i] - 1) // s[i] + 1 for i in range(r)]
