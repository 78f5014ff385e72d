"""Shape evaluation on ONNX graphs: shape inference, static shapes, and one node evaluated on
constant inputs. Layer extraction (`extract.py`) and the compiler's shape folding
(`compiler/frontend/fold_shapes.py`) both fold with it.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["FOLDABLE_OPS", "static_shape", "collect_types", "infer", "infer_types", "eval_node", "constant_value"]

#: Ops folded into initializers when all their inputs are constant. Deterministic, cheap, and
#: typical of shape arithmetic; heavy compute (Conv, MatMul, ...) is never folded. Float ones
#: (Sqrt, Div) are IEEE-exact in numpy as in ONNX Runtime's own constant folding.
FOLDABLE_OPS = frozenset({
    "Shape", "Size", "Slice", "Concat", "Gather", "Unsqueeze", "Squeeze", "Cast", "ConstantOfShape",
    "Reshape", "Transpose", "Mul", "Add", "Sub", "Div", "Mod", "Sqrt", "Equal", "Where", "Range",
    "Expand", "Identity", "Flatten", "Neg", "Floor", "Ceil", "Min", "Max", "ReduceProd", "Not",
    "Less", "Greater",
})
_BIG = 4096         # initializers larger than this never feed shape arithmetic's data


def infer(m: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference with data propagation; the model unchanged when inference fails."""
    try:
        return onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001 - onnx raises many types; callers report what stays unknown
        return m


def infer_types(m: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every tensor type shape inference finds, computed on a skeleton of `m`: initializers
    over `_BIG` elements become typed graph inputs (their values never decide a shape, and
    copying 300 MB of ViT weights through the inference would cost seconds)."""
    return collect_types(infer(_skeleton(m)))


def _skeleton(m: onnx.ModelProto) -> onnx.ModelProto:
    big = [t for t in m.graph.initializer if int(np.prod(t.dims)) > _BIG]
    if not big:
        return m
    out = onnx.ModelProto()
    out.ir_version, out.producer_name = m.ir_version, m.producer_name
    out.opset_import.extend(m.opset_import)
    out.functions.extend(m.functions)
    g = out.graph
    g.name = m.graph.name
    g.node.extend(m.graph.node)
    names = {t.name for t in big}
    g.initializer.extend(t for t in m.graph.initializer if t.name not in names)
    g.input.extend(v for v in m.graph.input if v.name not in names)
    g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in big)
    g.output.extend(m.graph.output)
    g.value_info.extend(m.graph.value_info)
    return out


def static_shape(t: onnx.TypeProto | None) -> list[int] | None:
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in t.tensor_type.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(d.dim_value)
    return dims


def collect_types(m: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    g = m.graph
    types = {v.name: v.type for v in list(g.value_info) + list(g.input) + list(g.output)}
    for t in g.initializer:
        types[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return types


def _shape_value(node: onnx.NodeProto, shape: list[int]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(int(np.prod(shape)), dtype=np.int64)
    attrs = {a.name: a.i for a in node.attribute}
    r = len(shape)
    start, end = attrs.get("start", 0), attrs.get("end", r)
    start = max(0, min(r, start + r if start < 0 else start))
    end = max(0, min(r, end + r if end < 0 else end))
    return np.array(shape[start:end], dtype=np.int64)


def eval_node(node: onnx.NodeProto, consts, types: dict[str, onnx.TypeProto],
              opsets) -> list[np.ndarray] | None:
    """Evaluate one foldable node on constant inputs (Shape/Size only need a static shape).

    `consts` maps names to arrays (any mapping: a lazy one avoids converting every weight)."""
    if node.op_type in ("Shape", "Size"):
        shape = static_shape(types.get(node.input[0]))
        return None if shape is None else [_shape_value(node, shape)]
    ins = [x for x in node.input if x]
    if not all(x in consts for x in ins):
        return None
    from onnx.reference import ReferenceEvaluator
    try:
        feeds = {x: consts[x] for x in ins}
        g = helper.make_graph(
            [node], "fold",
            [helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
             for x, v in feeds.items()],
            [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in node.output if o])
        fm = helper.make_model(g, opset_imports=list(opsets))
        outs = ReferenceEvaluator(fm).run(None, feeds)
    except Exception:  # noqa: BLE001 - not foldable after all: leave it as a real node
        return None
    return [np.asarray(o) for o in outs]


def constant_value(n: onnx.NodeProto) -> np.ndarray | None:
    """The value of a Constant node (None for a form this reader does not know)."""
    for a in n.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name in ("value_int", "value_ints"):
            return np.array(a.i if a.name == "value_int" else list(a.ints), np.int64)
        if a.name in ("value_float", "value_floats"):
            return np.array(a.f if a.name == "value_float" else list(a.floats), np.float32)
    return None
