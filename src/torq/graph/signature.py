"""Dedup key of a (layer) model: two layers with equal signatures compile and run identically.

Same fields as the reference tool's ``model_signature`` -- I/O dtypes and shapes, node count,
op types, initializer dtypes and shapes -- PLUS each node's domain and attributes, because two
Convs that differ only in strides/pads/group are not the same layer (the reference tool
wrongly merges them). Weight VALUES are deliberately not part of it: layers are tested with
their own data and the kernel does not depend on the numbers. Constant tensors inside
attributes are keyed by dtype, shape and a content hash (they can change the op's behaviour).
"""
from __future__ import annotations

import hashlib
import json

import onnx
from onnx import AttributeProto


def _shape(t: onnx.TypeProto) -> tuple:
    if not t.HasField("tensor_type"):
        return (t.WhichOneof("value") or "?",)
    tt = t.tensor_type
    if not tt.HasField("shape"):
        return (tt.elem_type, None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    return (tt.elem_type, dims)


def _tensor_key(t: onnx.TensorProto) -> tuple:
    digest = hashlib.sha256(t.SerializeToString(deterministic=True)).hexdigest()[:16]
    return ("tensor", t.data_type, tuple(t.dims), digest)


def _attr_value(a: onnx.AttributeProto):
    if a.type == AttributeProto.FLOAT:
        return a.f
    if a.type == AttributeProto.INT:
        return a.i
    if a.type == AttributeProto.STRING:
        return a.s.decode("utf-8", "replace")
    if a.type == AttributeProto.FLOATS:
        return tuple(a.floats)
    if a.type == AttributeProto.INTS:
        return tuple(a.ints)
    if a.type == AttributeProto.STRINGS:
        return tuple(s.decode("utf-8", "replace") for s in a.strings)
    if a.type == AttributeProto.TENSOR:
        return _tensor_key(a.t)
    if a.type == AttributeProto.TENSORS:
        return tuple(_tensor_key(t) for t in a.tensors)
    if a.type == AttributeProto.GRAPH:
        return ("graph", _graph_sig(a.g))
    if a.type == AttributeProto.GRAPHS:
        return tuple(("graph", _graph_sig(g)) for g in a.graphs)
    if a.type == AttributeProto.TYPE_PROTO:
        return ("type", _shape(a.tp))
    return ("attr", a.type, hashlib.sha256(a.SerializeToString(deterministic=True)).hexdigest()[:16])


def _graph_sig(g: onnx.GraphProto) -> tuple:
    inits = {t.name for t in g.initializer}
    return (
        ("inputs", tuple(_shape(v.type) for v in g.input if v.name not in inits)),
        ("outputs", tuple(_shape(v.type) for v in g.output)),
        ("node_count", len(g.node)),
        ("ops", tuple((n.domain or "", n.op_type) for n in g.node)),
        ("initializers", tuple((t.data_type, tuple(t.dims)) for t in g.initializer)),
        ("attributes", tuple(tuple(sorted((a.name, _attr_value(a)) for a in n.attribute))
                             for n in g.node)),
    )


def signature(model: onnx.ModelProto) -> tuple:
    """Hashable dedup key (nested tuples of ints/floats/strings); ``signature_json`` for JSON."""
    return _graph_sig(model.graph)


def signature_json(model: onnx.ModelProto) -> str:
    """The signature as a canonical JSON string (what a report file stores)."""
    return json.dumps(signature(model), separators=(",", ":"))
