"""fp32 -> bf16 model conversion (``--auto-convert-bf16``), and back (the exact fp32 twin).

As the reference tool converts (``python/torq/testing/onnx.py: convert_fp32_to_bf16``): every
FLOAT initializer becomes BFLOAT16, and every FLOAT graph input, output and value_info is
retyped BFLOAT16. Beyond it, so that the result stays one consistent model: FLOAT tensors
inside ``Constant`` / ``ConstantOfShape`` attributes and ``Cast(to=FLOAT)`` follow. Values are
rounded to nearest, ties to even (``numerics.to_bf16``); the reference truncates
(``arr_uint32 >> 16``), which doubles the worst weight error for no gain.

``to_fp32`` (BFLOAT16 -> FLOAT, exact) is the fp32 twin of a bf16 model: the front end checks
and rewrites the twin (the ONNX checker rejects bf16 Conv at the opsets models use, and ONNX
Runtime has no bf16 kernels for most ops), ``retype_from`` gives the result its bf16 types back
(from the bf16 "seeds" of the original: its bf16 initializers, inputs, constants and Casts,
propagated through every op that is not a Cast / QuantizeLinear / DequantizeLinear), and ONNX
Runtime runs the twin as the reference: fp32 arithmetic on exactly the values the model holds.

Mixed int8 + bf16 models (``bf16_float_ops``): in a QDQ model, the float ops ORT left between a
DequantizeLinear and a QuantizeLinear compute in bf16, joined to the int8 parts by Casts; the
Q/DQ keep their fp32 scales (on the NSS: the seed's bf16 Quantize/Dequantize fallback).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from .. import numerics
from .shapes import infer_types
from .walk import subgraphs

__all__ = ["convert_to_bf16", "to_fp32", "is_bf16", "bf16_seeds", "retype_from", "bf16_float_ops"]

_FLOAT, _BF16 = TensorProto.FLOAT, TensorProto.BFLOAT16


def is_bf16(model: onnx.ModelProto) -> bool:
    """True when the model holds bf16 tensors (initializers, graph inputs or outputs)."""
    g = model.graph
    return any(t.data_type == _BF16 for t in g.initializer) or any(
        v.type.tensor_type.elem_type == _BF16 for v in list(g.input) + list(g.output)
        if v.type.HasField("tensor_type"))


def convert_to_bf16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every FLOAT tensor retyped BFLOAT16 (values rounded to nearest even)."""
    return _retype(model, _FLOAT, _BF16)


def to_fp32(model: onnx.ModelProto) -> onnx.ModelProto:
    """The exact fp32 twin of a bf16 model (every BFLOAT16 tensor as FLOAT, same values)."""
    return _retype(model, _BF16, _FLOAT)


def _retype(model: onnx.ModelProto, src: int, dst: int) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for g in subgraphs(m.graph):
        for t in g.initializer:
            _tensor(t, src, dst)
        for v in list(g.input) + list(g.output) + list(g.value_info):
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == src:
                v.type.tensor_type.elem_type = dst
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    _tensor(a.t, src, dst)
                elif a.type == onnx.AttributeProto.TENSORS:
                    for t in a.tensors:
                        _tensor(t, src, dst)
                elif n.op_type == "Cast" and a.name == "to" and a.i == src:
                    a.i = dst
    return m


def _tensor(t: TensorProto, src: int, dst: int) -> None:
    if t.data_type != src:
        return
    if src == _FLOAT:
        bits = numerics.to_bf16(onnx.numpy_helper.to_array(t).astype(np.float32)).view(np.uint32) >> 16
        data = bits.astype(np.uint16)
    else:
        raw = np.frombuffer(t.raw_data, np.uint16) if t.raw_data else np.asarray(t.int32_data, np.uint16)
        data = (raw.astype(np.uint32) << 16).view(np.float32)
    t.ClearField("float_data")
    t.ClearField("int32_data")
    t.raw_data = np.ascontiguousarray(data).tobytes()
    t.data_type = dst


_QDQ = ("QuantizeLinear", "DequantizeLinear")


def bf16_seeds(model: onnx.ModelProto) -> set[str]:
    """Names of the tensors a model types bf16 at their source: initializers, graph inputs,
    constants, Casts to bf16 (the rest follows by propagation, ``retype_from``)."""
    g = model.graph
    seeds = {t.name for t in g.initializer if t.data_type == _BF16}
    seeds |= {v.name for v in g.input if v.type.tensor_type.elem_type == _BF16}
    for n in g.node:
        bf16_attr = any(a.type == onnx.AttributeProto.TENSOR and a.t.data_type == _BF16 for a in n.attribute)
        to_bf16 = n.op_type == "Cast" and any(a.name == "to" and a.i == _BF16 for a in n.attribute)
        if bf16_attr or to_bf16:
            seeds.update(n.output)
    return seeds


def retype_from(model: onnx.ModelProto, seeds: set[str]) -> onnx.ModelProto:
    """``model`` (an fp32 twin, shape-inferred) with the ``seeds`` and every float tensor computed
    from a bf16 one by an op other than Cast / Q / DQ retyped (and rounded) to bf16."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.output) + list(g.value_info)}
    types.update({t.name: t.data_type for t in g.initializer})
    if any(o and o not in types for n in g.node for o in n.output):     # e.g. a Gather made Slice + Squeeze
        for name, t in infer_types(m).items():                            # (the chain must carry bf16 through)
            types.setdefault(name, t.tensor_type.elem_type)
    bf16 = {n for n in seeds if types.get(n) == _FLOAT}
    for n in g.node:
        if n.op_type in _QDQ or n.op_type == "Cast":
            continue
        if any(i in bf16 for i in n.input):
            bf16.update(o for o in n.output if types.get(o) == _FLOAT)
    for t in g.initializer:
        if t.name in bf16:
            _tensor(t, _FLOAT, _BF16)
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.name in bf16:
            v.type.tensor_type.elem_type = _BF16
    for n in g.node:
        if n.output and n.output[0] in bf16:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    _tensor(a.t, _FLOAT, _BF16)
                elif n.op_type == "Cast" and a.name == "to":
                    a.i = _BF16
    return m


def bf16_float_ops(qmodel: onnx.ModelProto) -> onnx.ModelProto:
    """A QDQ model whose float ops (every op but Q / DQ / Constant) compute in bf16: their float
    initializers rounded to bf16, a Cast to bf16 after each DequantizeLinear or float graph input
    they read, a Cast to float before each QuantizeLinear or graph output they feed."""
    m = onnx.shape_inference.infer_shapes(qmodel)
    g = m.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.output) + list(g.value_info)}
    types.update({t.name: t.data_type for t in g.initializer})
    if any(o and o not in types for n in g.node for o in n.output):     # e.g. a Gather made Slice + Squeeze
        for name, t in infer_types(m).items():                            # (the chain must carry bf16 through)
            types.setdefault(name, t.tensor_type.elem_type)
    producer = {o: n.op_type for n in g.node for o in n.output}
    readers: dict = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.op_type)
    outs = {o.name for o in g.output}

    def int8_unit(n) -> bool:       # DQ -> op -> Q: ORT runs it on integers (a QDQ node unit)
        return all(producer.get(i) == "DequantizeLinear" for i in n.input if i) and all(
            o not in outs and readers.get(o) and set(readers[o]) == {"QuantizeLinear"} for o in n.output)
    compute = [n for n in g.node if n.op_type not in _QDQ and n.op_type != "Constant" and not int8_unit(n)]
    produced = {o for n in compute for o in n.output if types.get(o) == _FLOAT}
    inits = {t.name for t in g.initializer}
    other_readers = {i for n in g.node if n not in compute for i in n.input}
    seeds = {i for n in compute for i in n.input if i in inits and types.get(i) == _FLOAT and i not in other_readers}
    nodes, made = [], set()
    for n in g.node:
        for k, i in enumerate(n.input):
            if n in compute and types.get(i) == _FLOAT and i not in produced and i not in inits:
                n.input[k] = _cast(nodes, made, i, f"{i}_bf16")       # into the bf16 region
                seeds.add(n.input[k])
            elif n not in compute and i in produced:
                n.input[k] = _cast(nodes, made, i, f"{i}_fp32")       # out of it
        nodes.append(n)
    for o in g.output:
        if o.name in produced:
            inner = f"{o.name}_bf16out"
            for n in nodes:
                n.output[:] = [inner if x == o.name else x for x in n.output]
                n.input[:] = [inner if x == o.name else x for x in n.input]
            nodes.append(_cast_node(inner, o.name))
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    return retype_from(onnx.shape_inference.infer_shapes(m), seeds)


def _cast(nodes: list, made: set, src: str, dst: str) -> str:
    if dst not in made:
        made.add(dst)
        nodes.append(_cast_node(src, dst))
    return dst


def _cast_node(src: str, dst: str) -> onnx.NodeProto:
    """A Cast to FLOAT: typed bf16 by ``retype_from`` when its output is a bf16 seed."""
    return onnx.helper.make_node("Cast", [src], [dst], name=f"cast_{dst}", to=_FLOAT)
