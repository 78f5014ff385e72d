"""Weight scales on which ONNX Runtime's float arithmetic is exact: `Conv/Gemm/MatMul ∘ DQ -> same, ws'`.

ORT requantizes a Conv/MatMul accumulator as ``RNE(fl32(fl32(acc) · s))`` with
``s = fl32(fl32(xs·ws)/ys)``. For an ordinary ``s`` the float32 product rounds, and on ~2e-6 of
the outputs it rounds across .5: there ORT and any exact integer rescale (the NPU's ACT) differ
by 1 LSB, and a deep network turns those few differences into top-1 flips on ~1 % of the images.
If ``s`` is a multiple of 2**-16, every product in the int8 output range has at most 24
significant bits: ORT's float result is exact, the NPU holds the same ``s`` exactly as
multiplier·2**-shift, and with round-half-to-even in the ACT both compute the same integers
(`numerics.exact_dyadic`; the compiler picks that multiplier and the NTE mode by itself).

This pass moves each weight scale to the nearest float32 ``ws'`` whose ``s`` is such a multiple
— typically 0.1 %, at most 5 % (very small requant scales) — and
re-quantizes the weights (from the fp32 model's weights when given, else from the int8 ones)
and the int32 bias with the new scales. Channels it cannot match keep their scale.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from ..numerics import EXACT_GRID_BITS, dq_scale, exact_dyadic, ort_requant_scale, quantize_ort

_F32 = np.float32
_SEARCH_ULPS = 4
_GRID_POINTS = 256       # grid points tried on each side of ORT's requant scale
_MAX_CHANGE = 0.05       # a weight scale moves at most 5 % (else the channel keeps its scale)


def exact_weight_scale(xs, ws, ys) -> np.float32 | None:
    """The float32 ``ws'`` nearest ``ws`` (within 5 %) with ``fl32(fl32(xs·ws')/ys)`` an exact
    dyadic (``numerics.exact_dyadic``), or None.

    Walks the grid points t·2**-16 outward from ORT's current scale (nearest first): for each,
    the float32 products ``p`` whose quotient by ``ys`` rounds to exactly that point, then a
    ``ws'`` with ``fl32(xs·ws') == p`` (not every grid point has such a ``p``: the float32
    spacing of ``p`` can step over the window). A smaller ``ws'`` may clip a channel's largest
    weight by that fraction; the re-quantization clips it to ±127."""
    xs, ws, ys = _F32(xs), _F32(ws), _F32(ys)
    s = float(ort_requant_scale(dq_scale(xs, ws), ys))
    if not (s > 0 and math.isfinite(s)):
        return None
    centre = math.ldexp(s, EXACT_GRID_BITS)
    points = sorted(range(max(1, math.floor(centre) - _GRID_POINTS), math.ceil(centre) + _GRID_POINTS + 1),
                    key=lambda t: abs(t - centre))
    for t in points:
        target = _F32(math.ldexp(t, -EXACT_GRID_BITS))
        if abs(float(target) / s - 1) > _MAX_CHANGE:
            break
        p0 = _F32(float(target) * float(ys))
        for p in (p0, np.nextafter(p0, _F32(np.inf)), np.nextafter(p0, _F32(0))):
            if ort_requant_scale(p, ys) != target:
                continue
            c0 = _F32(float(p) / float(xs))
            for k in range(-_SEARCH_ULPS, _SEARCH_ULPS + 1):
                c = _F32(c0 + k * np.spacing(c0))
                if dq_scale(xs, c) == p:
                    return c
    return None


def exact_scales(qmodel: onnx.ModelProto, fp32: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """A copy of the QDQ model with every matchable Conv / Gemm / MatMul weight scale moved to an
    exact-dyadic requant scale (module docstring). ``fp32``: the model that was quantized (its
    weights, by the quantizer's ``<name>_quantized`` naming, are re-quantized instead of the
    int8 values)."""
    m = onnx.ModelProto()
    m.CopyFrom(qmodel)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    floats = {t.name: t for t in fp32.graph.initializer} if fp32 is not None else {}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    for n in g.node:
        if n.op_type in ("Conv", "Gemm", "MatMul"):
            _rescale_layer(n, inits, floats, producer, consumers)
    return m


def _scalar(inits, name):
    if name not in inits:
        return None
    v = numpy_helper.to_array(inits[name])
    return _F32(v.reshape(-1)[0]) if v.size == 1 else None


def _wide(qdq, inits) -> bool:
    """A Quantize/DequantizeLinear with a 16-bit zero point (int16 activations)."""
    zp = inits.get(qdq.input[2]) if len(qdq.input) > 2 else None
    return zp is not None and zp.data_type in (onnx.TensorProto.INT16, onnx.TensorProto.UINT16)


def _rescale_layer(node, inits, floats, producer, consumers) -> bool:
    dqx, dqw = producer.get(node.input[0]), producer.get(node.input[1])
    outs = consumers.get(node.output[0], [])
    if (dqx is None or dqw is None or dqx.op_type != "DequantizeLinear" or dqw.op_type != "DequantizeLinear"
            or len(outs) != 1 or outs[0].op_type != "QuantizeLinear" or dqw.input[0] not in inits):
        return False
    xs, ys = _scalar(inits, dqx.input[1]), _scalar(inits, outs[0].input[1])
    if xs is None or ys is None or dqw.input[1] not in inits or _wide(dqx, inits) or _wide(outs[0], inits):
        return False            # int16 activations: ORT accumulates in float anyway (numerics.int16)
    w_q = numpy_helper.to_array(inits[dqw.input[0]])
    ws = numpy_helper.to_array(inits[dqw.input[1]]).astype(_F32)
    zp = numpy_helper.to_array(inits[dqw.input[2]]) if len(dqw.input) > 2 and dqw.input[2] in inits else None
    if w_q.dtype != np.int8 or (zp is not None and np.any(zp != 0)):
        return False
    found = [exact_weight_scale(xs, s, ys) for s in ws.reshape(-1)]
    if all(v is None for v in found):
        return False
    new_ws = np.array([s if v is None else v for s, v in zip(ws.reshape(-1), found)], _F32).reshape(ws.shape)
    axis = next((a.i for a in dqw.attribute if a.name == "axis"), 1) % w_q.ndim if ws.size > 1 else 0
    shape = [1] * w_q.ndim
    if ws.size > 1:
        shape[axis] = ws.size
    src = dqw.input[0]
    base = src[:-len("_quantized")] if src.endswith("_quantized") else None
    if base in floats and numpy_helper.to_array(floats[base]).shape == w_q.shape:
        w = numpy_helper.to_array(floats[base]).astype(np.float64)
    else:
        w = w_q.astype(np.float64) * ws.reshape(shape)
    w_new = np.clip(np.rint(w / new_ws.reshape(shape).astype(np.float64)), -127, 127).astype(np.int8)
    inits[src].CopyFrom(numpy_helper.from_array(w_new, src))
    inits[dqw.input[1]].CopyFrom(numpy_helper.from_array(new_ws, dqw.input[1]))
    if len(node.input) > 2 and node.input[2]:
        _requantize_bias(producer.get(node.input[2]), inits, dq_scale(xs, new_ws.reshape(-1)))
    return True


def _requantize_bias(dqb, inits, new_scale) -> None:
    if dqb is None or dqb.op_type != "DequantizeLinear" or dqb.input[0] not in inits or dqb.input[1] not in inits:
        return
    b = numpy_helper.to_array(inits[dqb.input[0]])
    old = numpy_helper.to_array(inits[dqb.input[1]])
    if b.dtype != np.int32 or new_scale.size not in (1, b.size) or old.size != new_scale.size:
        return
    scale = new_scale.astype(_F32).reshape(old.shape)
    real = b.astype(np.float64) * old.astype(np.float64).reshape(-1)
    q = np.clip(np.rint(real / scale.astype(np.float64).reshape(-1)), -2 ** 31, 2 ** 31 - 1).astype(np.int32)
    inits[dqb.input[0]].CopyFrom(numpy_helper.from_array(q, dqb.input[0]))
    inits[dqb.input[1]].CopyFrom(numpy_helper.from_array(scale, dqb.input[1]))
