"""Fold shape arithmetic into initializers (`fold_shape_arithmetic`) and turn constant-index
Gathers into slices (`slice_constant_gathers`), so every tensor the importer sees has a static
shape and no index-reading op is left (the evaluator is `graph/shapes.py`).

Exporters compute reshape targets at run time: torch's multi-head attention reads its own
shape (`Shape → Slice → Concat → Reshape`), the attention scale is `Sqrt(Cast(Shape[-1]))`,
ViT's class token goes through `ConstantOfShape → Equal → Where → Expand`. ONNX shape inference
cannot see through all of it (e.g. `Mod` on the sliced shape), leaves the Reshape's result
rank-unknown, and torch-mlir then refuses the first Transpose of it. For the static batch-1
graph the compiler builds, all of it is a constant: `fold_shape_arithmetic` evaluates every
node that depends only on constants and static shapes (`FOLDABLE_OPS`; Q/DQ never, a
DequantizeLinear of a constant IS an int8 weight), re-runs shape inference and repeats until
nothing more folds.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...graph.shapes import FOLDABLE_OPS, constant_value, eval_node, infer_types, static_shape

__all__ = ["fold_shape_arithmetic", "slice_constant_gathers"]

_MAX_ROUNDS = 8     # each round folds what the previous round's shape inference made static


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
