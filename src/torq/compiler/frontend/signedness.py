"""uint8 activations -> int8, exactly: q_s8 = q_u8 - 128 with zero point zp_s8 = zp_u8 - 128.

Every integer op of a quantized graph computes with (q - zp), which the shift leaves unchanged,
and the requantized output moves by the same 128. torch-mlir would otherwise wrap each uint8
tensor in `x - 128` generics; doing it once at the ONNX level keeps the NPU ops int8-only.
The caller shifts uint8 graph inputs/outputs at the boundary (`numerics.uint8_to_int8`).

Two ONNX Runtime kernels add a zero point in float *before* rounding (QLinearAdd,
QLinearAveragePool), so their float rounding is not shift-invariant; the lowering records the
shift on those ops (`ort_zp_shift`) and the simulator's `ort` mode undoes it for them.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ...numerics import UINT8_SHIFT

# For these ops, which inputs are zero points (a uint8 zero point makes its tensor uint8).
_ZP_INPUTS = {
    "QuantizeLinear": (2,), "DequantizeLinear": (2,),
    "QLinearConv": (2, 5, 7), "QLinearMatMul": (2, 5, 7),
    "QLinearAdd": (2, 5, 7), "QLinearMul": (2, 5, 7), "QGemm": (2, 5, 8),
    "QLinearGlobalAveragePool": (2, 4), "QLinearAveragePool": (2, 4),
    "QLinearSigmoid": (2, 4), "QLinearLeakyRelu": (2, 4),
    "Pad": (2,),   # a uint8 Pad's constant moves with its tensor (compiler/frontend/pool_ceil.py pads with 0 = min)
}


def to_int8(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], list[str], bool]:
    """Return (model with int8 activations, names of uint8 graph inputs, of uint8 graph outputs,
    whether anything was shifted)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    changed = False
    for node in g.node:
        for idx in _ZP_INPUTS.get(node.op_type, ()):
            if idx < len(node.input) and node.input[idx] in inits:
                t = inits[node.input[idx]]
                if t.data_type == TensorProto.UINT8:
                    v = numpy_helper.to_array(t).astype(np.int16) - UINT8_SHIFT
                    t.CopyFrom(numpy_helper.from_array(v.astype(np.int8), t.name))
                    changed = True
    # uint8 activation tensors (graph I/O and value_info) become int8; int8 weights are untouched.
    ins, outs = [], []
    for vi, names in ((g.input, ins), (g.output, outs)):
        for v in vi:
            if v.type.tensor_type.elem_type == TensorProto.UINT8 and v.name not in inits:
                v.type.tensor_type.elem_type = TensorProto.INT8
                names.append(v.name)
                changed = True
    for v in g.value_info:
        if v.type.tensor_type.elem_type == TensorProto.UINT8:
            v.type.tensor_type.elem_type = TensorProto.INT8
    for name, t in inits.items():  # uint8 data initializers (e.g. quantized constants fed to DQ)
        if t.data_type == TensorProto.UINT8 and any(n.op_type == "DequantizeLinear" and n.input[0] == name
                                                    for n in g.node):
            v = numpy_helper.to_array(t).astype(np.int16) - UINT8_SHIFT
            t.CopyFrom(numpy_helper.from_array(v.astype(np.int8), name))
    return (m if changed else model), ins, outs, changed
