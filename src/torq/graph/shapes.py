"""Fold shape arithmetic into initializers, so every tensor the importer sees has a static shape.

Exporters compute reshape targets at run time: torch's multi-head attention reads its own
shape (`Shape → Slice → Concat → Reshape`), the attention scale is `Sqrt(Cast(Shape[-1]))`,
ViT's class token goes through `ConstantOfShape → Equal → Where → Expand`. ONNX shape inference
cannot see through all of it (e.g. `Mod` on the sliced shape), leaves the Reshape's result
rank-unknown, and torch-mlir then refuses the first Transpose of it. For the static batch-1
graph the compiler builds, all of it is a constant: `fold_shape_arithmetic` evaluates every
node that depends only on constants and static shapes (`FOLDABLE_OPS`; Q/DQ never, a
DequantizeLinear of a constant IS an int8 weight), re-runs shape inference and repeats until
nothing more folds. Layer extraction (`extract.py`) folds with the same evaluator.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["FOLDABLE_OPS", "fold_shape_arithmetic", "slice_constant_gathers", "static_shape", "collect_types", "infer",
           "eval_node"]

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
_MAX_ROUNDS = 8     # each round folds what the previous round's shape inference made static


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


class _Constants(dict):
    """name -> array, initializers converted on first use (a ViT holds 86 M weights)."""

    def __init__(self, g: onnx.GraphProto):
        super().__init__()
        self._inits = {t.name: t for t in g.initializer}

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name) or name in self._inits

    def __missing__(self, name):
        value = self[name] = numpy_helper.to_array(self._inits[name])
        return value


def _foldable(n: onnx.NodeProto, outputs: set[str]) -> bool:
    return (n.op_type in FOLDABLE_OPS and n.domain in ("", "ai.onnx")
            and not any(o in outputs for o in n.output))


def _fold_round(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    """One pass in graph order: name -> value of every node output that is now constant."""
    types = infer_types(m)
    consts = _Constants(m.graph)
    outputs = {o.name for o in m.graph.output}
    folded: dict[str, np.ndarray] = {}
    for n in m.graph.node:
        if n.op_type == "Constant":         # an input of folding, itself left as it is
            v = constant_value(n)
            outs = [v] if v is not None else eval_node(n, {}, types, m.opset_import)
            consts.update(zip(n.output, outs or ()))
        elif _foldable(n, outputs):
            outs = eval_node(n, consts, types, m.opset_import)
            for name, val in zip([o for o in n.output if o], outs or ()):
                consts[name] = folded[name] = val
    return folded


def _has_candidates(m: onnx.ModelProto) -> bool:
    """Cheap test before any shape inference: a Shape/Size, or a foldable node on constants."""
    known = {t.name for t in m.graph.initializer}
    outputs = {o.name for o in m.graph.output}
    for n in m.graph.node:
        if n.op_type == "Constant":
            known.update(n.output)
        elif n.op_type in ("Shape", "Size") or (_foldable(n, outputs) and all(x in known for x in n.input if x)):
            return True
    return False


def _replace(m: onnx.ModelProto, folded: dict[str, np.ndarray]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    keep = [n for n in g.node if not all(o in folded for o in n.output if o)]
    used = {x for n in keep for x in n.input} | {o.name for o in g.output}
    keep = [n for n in keep if n.op_type != "Constant" or any(o in used for o in n.output)]
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in folded.items()
                         if k in used)
    vi = [v for v in g.value_info if v.name not in folded]
    del g.value_info[:]
    g.value_info.extend(vi)
    return out


def fold_shape_arithmetic(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose shape sub-graphs are initializers (the input is never modified;
    returned as is when there is nothing to fold)."""
    if not _has_candidates(model):
        return model
    m = model
    for _ in range(_MAX_ROUNDS):
        folded = _fold_round(m)
        if not folded:
            break
        m = _replace(m, folded)
    return m


def slice_constant_gathers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Gather at one constant index is a slice: `Gather(x, i, axis=a)` -> `Slice(x, [i], [i+1], [a])`,
    then `Squeeze([a])` for a scalar index. Attention picks q, k, v out of one stacked projection
    and ViT its class token this way; torch-mlir turns a Gather into an index-reading generic the
    NPU has no pattern for, but a slice and a squeeze are data movement."""
    indices = _small_constants(model)
    types, nodes, new_inits = None, [], []
    for n in model.graph.node:
        idx = indices.get(n.input[1]) if n.op_type == "Gather" and len(n.input) == 2 else None
        if idx is None or idx.shape not in ((), (1,)):
            nodes.append(n)
            continue
        types = types or infer_types(model)
        shape = static_shape(types.get(n.input[0]))
        if not shape:
            nodes.append(n)
            continue
        axis = next((a.i for a in n.attribute if a.name == "axis"), 0) % len(shape)
        i = int(idx.reshape(-1)[0])
        nodes.extend(_gather_as_slice(n, i + shape[axis] if i < 0 else i, axis, idx.ndim == 0, new_inits))
    if not new_inits:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(new_inits)
    return out


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


def _small_constants(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Values of the initializers and Constant nodes of at most one element (Gather indices)."""
    out = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer if int(np.prod(t.dims)) <= 1}
    for n in m.graph.node:
        v = constant_value(n) if n.op_type == "Constant" else None
        if v is not None and v.size <= 1:
            out[n.output[0]] = v
    return out


def _gather_as_slice(n: onnx.NodeProto, i: int, axis: int, scalar: bool, new_inits: list) -> list:
    base = n.output[0]
    names = [f"{base}__slice_{k}" for k in ("starts", "ends", "axes")]
    for name, v in zip(names, (i, i + 1, axis)):
        new_inits.append(numpy_helper.from_array(np.array([v], np.int64), name))
    if not scalar:
        return [helper.make_node("Slice", [n.input[0], *names], [base], name=n.name)]
    sliced = f"{base}__sliced"
    new_inits.append(numpy_helper.from_array(np.array([axis], np.int64), f"{base}__squeeze_axes"))
    return [helper.make_node("Slice", [n.input[0], *names], [sliced], name=f"{n.name}__slice"),
            helper.make_node("Squeeze", [sliced, f"{base}__squeeze_axes"], [base], name=n.name)]
