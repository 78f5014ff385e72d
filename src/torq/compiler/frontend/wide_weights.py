"""Int16 activations by per-tensor int8 weights in MatMul / Gemm: a per-axis weight dequantize.

torch-mlir (20261001) fuses ``DQ(x) · DQ(w)`` with per-tensor scales into a quantized
``aten.mm``, which it cannot legalize for ``qint16`` ("failed to legalize operation
'torch.aten.mm'"). A per-axis weight DequantizeLinear (the same scale and zero point repeated
along the output axis) is not fused: the MatMul stays f32 between dequantizes, the form the
fully-connected lowering reads for int16 activations (``numerics.int16``). Same values, same
integer semantics; ONNX Runtime computes the identical float graph.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

_WIDE = (onnx.TensorProto.INT16, onnx.TensorProto.UINT16)


def per_axis_int16_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with the weight dequantize of every int16-activation MatMul / Gemm
    made per-axis (``model`` itself when there is none)."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    edits = []
    for n in g.node:
        if n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2:
            continue
        a, b = (producer.get(v) for v in n.input[:2])
        if not (_dq_of(a, inits, wide=True) and _dq_of(b, inits, wide=False)):
            continue
        w = inits.get(b.input[0])
        scale = numpy_helper.to_array(inits[b.input[1]]) if b.input[1] in inits else None
        if w is None or scale is None or scale.size != 1 or len(w.dims) != 2:
            continue
        trans_b = any(at.name == "transB" and at.i for at in n.attribute)
        axis = 0 if (n.op_type == "Gemm" and trans_b) else 1
        edits.append((b, axis, int(w.dims[axis])))
    if not edits:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = {id_: n for id_, n in enumerate(out.graph.node)}
    index = {id(n): i for i, n in enumerate(model.graph.node)}
    for dq, axis, count in edits:
        _make_per_axis(out, nodes[index[id(dq)]], axis, count)
    return out


def _dq_of(node, inits, wide: bool) -> bool:
    """``node`` is a DequantizeLinear of an activation with a 16-bit zero point (wide) or of an
    initializer (the weight)."""
    if node is None or node.op_type != "DequantizeLinear":
        return False
    if not wide:
        return node.input[0] in inits
    zp = inits.get(node.input[2]) if len(node.input) > 2 else None
    return zp is not None and zp.data_type in _WIDE and node.input[0] not in inits


def _make_per_axis(model: onnx.ModelProto, dq: onnx.NodeProto, axis: int, count: int) -> None:
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    names = {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    for slot, suffix in ((1, "scale"), (2, "zero_point")):
        if len(dq.input) <= slot or not dq.input[slot]:
            continue
        src = numpy_helper.to_array(inits[dq.input[slot]])
        name, k = f"{dq.output[0]}_per_axis_{suffix}", 0
        while name in names:
            k += 1
            name = f"{dq.output[0]}_per_axis_{suffix}_{k}"
        g.initializer.append(numpy_helper.from_array(np.full(count, src.reshape(-1)[0], dtype=src.dtype), name))
        dq.input[slot] = name
    for at in dq.attribute:
        if at.name == "axis":
            at.i = axis
            return
    dq.attribute.append(onnx.helper.make_attribute("axis", axis))
