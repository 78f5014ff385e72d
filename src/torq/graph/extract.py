"""Cut a model into standalone ONNX models: one per node (layers) or any node subset (segments).

Both go through the same three steps:
  1. prepare the full model once: batch dim -> 1 (a dynamic/missing first input dim, and that
     symbol everywhere), ONNX shape inference, and constant folding of Constant nodes and
     shape sub-graphs (Shape/Gather/Concat/... whose inputs are all known; the evaluator of
     `shapes.py`, which the compiler folds with too), so that e.g. a
     Reshape's shape input becomes an initializer inside its layer;
  2. for a node subset: external inputs = used - produced (initializers and folded constants
     become initializers, everything else a graph input typed from shape inference); outputs =
     produced tensors read outside the subset or graph outputs;
  3. onnx.checker + strict shape inference on the result, so every layer is a valid model.

Layer ids are ``f"{op_type}_{first output name}"`` verbatim (e.g. ``MaxPool_/foo/MaxPool_output_0``)
so they match the ids of the reference tool's JSON. ``node_index`` counts non-Constant nodes,
the order in which torch-mlir emits ``torch.operator`` ops.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import TorqError, one_line
from .load import load_model
from .shapes import FOLDABLE_OPS, collect_types, eval_node, infer, static_shape
from .walk import node_subgraphs


@dataclass
class Layer:
    """One node as a standalone model. ``id`` = ``<OpType>_<first output>``."""
    id: str
    op_type: str
    node_index: int  # index among the non-Constant nodes of the source model
    node_name: str
    model: onnx.ModelProto = field(repr=False)


@dataclass
class _Prepared:
    model: onnx.ModelProto                    # batch fixed, original node list
    nodes: list[onnx.NodeProto]               # non-Constant nodes, in graph order
    consts: dict[str, np.ndarray]             # folded tensor values (Constant + shape sub-graphs)
    types: dict[str, onnx.TypeProto]          # every known tensor type (after inference)
    inits: dict[str, onnx.TensorProto]        # original initializers
    graph_outputs: set[str]
    consumers: dict[str, list[int]]           # tensor -> indices into graph.node reading it


# ----------------------------------------------------------------------------- preparation

def _fix_batch(m: onnx.ModelProto) -> None:
    """First dim of each graph input -> 1 when dynamic; the same symbol -> 1 wherever it appears."""
    inits = {t.name for t in m.graph.initializer}
    symbols = set()
    for v in m.graph.input:
        if v.name in inits or not v.type.HasField("tensor_type"):
            continue
        shape = v.type.tensor_type.shape
        if v.type.tensor_type.HasField("shape") and len(shape.dim) > 0:
            d0 = shape.dim[0]
            if not d0.HasField("dim_value") or d0.dim_value <= 0:
                if d0.HasField("dim_param"):
                    symbols.add(d0.dim_param)
                d0.Clear()
                d0.dim_value = 1
    if not symbols:
        return
    for v in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        if v.type.HasField("tensor_type"):
            for d in v.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and d.dim_param in symbols:
                    d.Clear()
                    d.dim_value = 1


def _fold_constants(m: onnx.ModelProto, types) -> dict[str, np.ndarray]:
    consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    folded: dict[str, np.ndarray] = {}
    for n in m.graph.node:
        if n.op_type == "Constant":
            try:
                from onnx.reference import ReferenceEvaluator
                g = helper.make_graph([n], "c", [], [helper.make_tensor_value_info(
                    n.output[0], TensorProto.UNDEFINED, None)])
                val = ReferenceEvaluator(helper.make_model(
                    g, opset_imports=list(m.opset_import))).run(None, {})[0]
            except Exception as e:
                raise TorqError(f"Constant node '{n.name or n.output[0]}' cannot be evaluated: "
                                f"{one_line(e, 200)}") from None
            consts[n.output[0]] = folded[n.output[0]] = np.asarray(val)
        elif n.op_type in FOLDABLE_OPS and n.domain in ("", "ai.onnx"):
            outs = eval_node(n, consts, types, m.opset_import)
            if outs is not None:
                for name, val in zip([o for o in n.output if o], outs):
                    consts[name] = folded[name] = val
    return folded


def _probe_types(m: onnx.ModelProto, names: list[str]) -> dict[str, onnx.TypeProto]:
    """Types ONNX shape inference cannot give (com.microsoft ops such as QLinearAdd/QGemm):
    run the model once in ONNX Runtime on zeros and read dtype/shape off the actual tensors."""
    import onnxruntime as ort
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    have = {o.name for o in probe.graph.output}
    for n in names:
        if n not in have:
            probe.graph.output.add().name = n
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    for v in m.graph.input:
        if v.name in inits:
            continue
        tt = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim]
        feeds[v.name] = np.zeros(shape, dtype=helper.tensor_dtype_to_np_dtype(tt.elem_type))
    try:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.log_severity_level = 4
        sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds)
    except Exception:
        return {}  # leave them unknown; _value_info names the tensor if a layer needs it
    found = {}
    for o, arr in zip(sess.get_outputs(), outs):
        if o.name in names and isinstance(arr, np.ndarray):
            found[o.name] = helper.make_tensor_type_proto(
                helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape))
    return found


def _prepare(model) -> _Prepared:
    m = load_model(model)
    _fix_batch(m)
    m = infer(m)
    types = collect_types(m)
    consts = _fold_constants(m, types)
    # Re-infer with the folded values as initializers so shapes behind them become static.
    if consts:
        alt = onnx.ModelProto()
        alt.CopyFrom(m)
        keep = [n for n in alt.graph.node if not all(o in consts for o in n.output if o)]
        del alt.graph.node[:]
        alt.graph.node.extend(keep)
        alt.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
        types.update({k: v for k, v in collect_types(infer(alt)).items() if k not in types
                      or static_shape(types[k]) is None})
    for k, v in consts.items():
        types[k] = helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
    unknown = [o for n in m.graph.node for o in n.output
               if o and (o not in types or static_shape(types[o]) is None)]
    if unknown:
        types.update(_probe_types(m, unknown))
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(m.graph.node):
        for x in set(n.input) | _implicit_inputs(n):
            consumers.setdefault(x, []).append(i)
    return _Prepared(
        model=m, nodes=[n for n in m.graph.node if n.op_type != "Constant"], consts=consts,
        types=types, inits={t.name: t for t in m.graph.initializer},
        graph_outputs={o.name for o in m.graph.output}, consumers=consumers)


def _implicit_inputs(node: onnx.NodeProto) -> set[str]:
    """Outer-scope tensors read inside a node's subgraphs (If/Loop/Scan bodies)."""
    used: set[str] = set()
    for g in node_subgraphs(node):
        defined = {v.name for v in g.input} | {t.name for t in g.initializer}
        defined |= {o for n in g.node for o in n.output}
        for n in g.node:
            used |= {x for x in n.input if x and x not in defined}
            used |= _implicit_inputs(n) - defined
        used |= {o.name for o in g.output} - defined
    return used


# ----------------------------------------------------------------------------- subset -> model

def _value_info(name: str, p: _Prepared, what: str) -> onnx.ValueInfoProto:
    t = p.types.get(name)
    if t is None or not t.HasField("tensor_type") or t.tensor_type.elem_type == TensorProto.UNDEFINED:
        raise TorqError(f"cannot extract {what}: type of tensor '{name}' is unknown "
                        "(ONNX shape inference could not infer it)")
    vi = onnx.ValueInfoProto()
    vi.name = name
    vi.type.CopyFrom(t)
    return vi


def _build(p: _Prepared, idx: Sequence[int], name: str, all_outputs: bool) -> onnx.ModelProto:
    """Standalone model of graph.node[idx] (indices into the prepared model's full node list)."""
    g = p.model.graph
    nodes = [g.node[i] for i in idx]
    selected = set(idx)
    produced = [o for n in nodes for o in n.output if o]
    produced_set = set(produced)
    ext_inputs: list[str] = []
    for n in nodes:
        for x in list(n.input) + sorted(_implicit_inputs(n)):
            if x and x not in produced_set and x not in ext_inputs:
                ext_inputs.append(x)
    inputs, inits = [], []
    for x in ext_inputs:
        if x in p.inits:
            inits.append(p.inits[x])
        elif x in p.consts:
            inits.append(numpy_helper.from_array(p.consts[x], x))
        else:
            inputs.append(_value_info(x, p, name))
    if all_outputs:
        outs = produced
    else:
        outs = [o for o in produced if o in p.graph_outputs
                or any(c not in selected for c in p.consumers.get(o, []))]
        if not outs:  # dead-end subset: expose what nobody inside reads
            inside = {x for n in nodes for x in n.input}
            outs = [o for o in produced if o not in inside] or produced
    outputs = [_value_info(o, p, name) for o in outs]
    vinfo = [_value_info(o, p, name) for o in produced if o not in outs and o in p.types]
    graph = helper.make_graph(nodes, name, inputs, outputs, inits, value_info=vinfo)
    m = helper.make_model(graph, opset_imports=list(p.model.opset_import),
                          producer_name="torq.graph.extract")
    m.ir_version = p.model.ir_version
    m.functions.extend(p.model.functions)
    try:
        onnx.checker.check_model(m)
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    except Exception as e:
        raise TorqError(f"extracted '{name}' is not a valid ONNX model: "
                        f"{one_line(e)}") from None
    return m


def layer_id(node: onnx.NodeProto) -> str:
    """``<OpType>_<first output name>``, unsanitised (the reference tool's id)."""
    return f"{node.op_type}_{node.output[0] if node.output else ''}"


def extract_layers(model: str | os.PathLike | onnx.ModelProto) -> list[Layer]:
    """One standalone, checker-valid model per non-Constant node, in graph order."""
    p = _prepare(model)
    g = p.model.graph
    layers = []
    k = 0
    for i, n in enumerate(g.node):
        if n.op_type == "Constant":
            continue
        lid = layer_id(n)
        layers.append(Layer(id=lid, op_type=n.op_type, node_index=k, node_name=n.name,
                            model=_build(p, [i], lid, all_outputs=True)))
        k += 1
    return layers


def _resolve(p: _Prepared, selectors: Iterable[int | str]) -> list[int]:
    """Map node selectors (non-Constant index, node name, layer id, or output name) to graph indices."""
    g = p.model.graph
    non_const = [i for i, n in enumerate(g.node) if n.op_type != "Constant"]
    by_name: dict[str, int] = {}
    for i in non_const:
        n = g.node[i]
        for key in [o for o in n.output if o] + [layer_id(n), n.name]:
            if key:
                by_name.setdefault(key, i)
    chosen: set[int] = set()
    for s in selectors:
        if isinstance(s, (int, np.integer)) and not isinstance(s, bool):
            if not 0 <= s < len(non_const):
                raise TorqError(f"node index {s} out of range (model has {len(non_const)} "
                                "non-Constant nodes)")
            chosen.add(non_const[int(s)])
        elif isinstance(s, str):
            if s not in by_name:
                raise TorqError(f"no node named '{s}' (use a node index, node name, "
                                "<OpType>_<output> layer id or output tensor name)")
            chosen.add(by_name[s])
        else:
            raise TorqError(f"node selector {s!r} must be an int index or a name")
    if not chosen:
        raise TorqError("extract_segment needs at least one node")
    return sorted(chosen)


def extract_segment(model: str | os.PathLike | onnx.ModelProto,
                    nodes: Iterable[int | str]) -> onnx.ModelProto:
    """A standalone model of an arbitrary node subset (kept in graph order).

    ``nodes``: non-Constant node indices (as ``Layer.node_index``), node names, layer ids or
    output names. Inputs = tensors used but not produced by the subset; outputs = produced
    tensors read outside it or graph outputs. For quantized models, include the weight
    DequantizeLinear nodes of the ops you take (DQ is never folded, it IS the int8 weight)."""
    p = _prepare(model)
    idx = _resolve(p, nodes)
    ids = [layer_id(p.model.graph.node[i]) for i in idx]
    name = f"segment_{ids[0]}" if len(ids) == 1 else f"segment_{ids[0]}__{ids[-1]}"
    return _build(p, idx, name, all_outputs=False)
