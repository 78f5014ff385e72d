"""fp32 -> bf16 model conversion (``--auto-convert-bf16``), and back (the exact fp32 twin).

As the reference tool converts (``python/torq/testing/onnx.py: convert_fp32_to_bf16``): every
FLOAT initializer becomes BFLOAT16, and every FLOAT graph input, output and value_info is
retyped BFLOAT16. Beyond it, so that the result stays one consistent model: FLOAT tensors
inside ``Constant`` / ``ConstantOfShape`` attributes and ``Cast(to=FLOAT)`` follow. Values are
rounded to nearest, ties to even (``numerics.to_bf16``); the reference truncates
(``arr_uint32 >> 16``), which doubles the worst weight error for no gain.

A bf16 model here has no FLOAT tensor at all: every float is bf16 (integer tensors, e.g. the
int8 side of a mixed model, are untouched). So ``to_fp32`` (BFLOAT16 -> FLOAT, exact) and
``convert_to_bf16`` are inverse on it: the front end checks and rewrites the fp32 twin (the ONNX
checker rejects bf16 Conv at the opsets models use, and ONNX Runtime has no bf16 kernels for
most ops), and ONNX Runtime runs the twin as the reference: fp32 arithmetic on exactly the
values the bf16 model holds.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from .. import numerics
from .walk import subgraphs

__all__ = ["convert_to_bf16", "to_fp32", "is_bf16"]

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
