"""Weight scales on which ONNX Runtime's float arithmetic is exact: `Conv/Gemm/MatMul ∘ DQ -> same, ws'`
(QDQ) and `QLinearConv / QGemm -> same, ws'` (QOperator).

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

First, ``exact_pools`` and ``exact_adds`` move the activation scales of windowed average pools
and around each Add (its output, and inputs that Convs produce) so that ORT's float pool and
QLinearAdd are exact too; the weight pass then matches those Convs to their new activation
scales (and re-quantizes the biases of Convs whose input scale moved).
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from ..numerics import EXACT_GRID_BITS, dq_scale, exact_dyadic, ort_requant_scale, quantize_ort
from .exact_adds import exact_add_scales, graph_index
from .exact_pools import exact_pool_scales

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


def exact_scales(qmodel: onnx.ModelProto, fp32: onnx.ModelProto | None = None, *,
                 activations: bool = True, keep=frozenset()) -> onnx.ModelProto:
    """A copy of the quantized model with every matchable weight scale moved to an exact-dyadic
    requant scale (module docstring): QDQ ``DQ -> Conv/Gemm/MatMul -> Q`` and QOperator
    ``QLinearConv`` / ``QGemm`` (ORT computes their requant scale the same way, ``fl32(fl32(xs·ws)/ys)``).
    ``fp32``: the model that was quantized (its weights, by the quantizer's ``<name>_quantized``
    naming, are re-quantized instead of the int8 values). ``activations``: first move the activation
    scales of average pools and around each Add to values on which ORT's float arithmetic for them
    is exact (``exact_pools``, ``exact_adds``), except the scales named in ``keep`` (``exact_int16``'s)."""
    m = onnx.ModelProto()
    m.CopyFrom(qmodel)
    g = m.graph
    inits, producer, consumers = graph_index(g)
    floats = {t.name: t for t in fp32.graph.initializer} if fp32 is not None else {}

    def layer(n) -> _Layer | None:
        if n.op_type in ("Conv", "Gemm", "MatMul"):
            return _qdq_layer(n, inits, producer, consumers)
        if n.op_type == "QLinearConv" and n.domain in ("", "ai.onnx"):
            return _qlinear_layer(n, inits)
        if n.op_type == "QGemm" and n.domain == "com.microsoft":
            return _qgemm_layer(n, inits)
        return None
    moved: dict = {}
    if activations:
        is_layer = lambda n: layer(n) is not None      # noqa: E731
        moved = exact_pool_scales(m, is_layer, keep)
        moved = {**exact_add_scales(m, is_layer, keep), **moved}   # the Add pass never moves a pool's scale
    for n in g.node:
        found = layer(n)
        if found is not None:
            _rescale(found, inits, floats, moved)
    return m


class _Layer:
    """What the pass needs of one layer, whatever its form: the input/output activation scales,
    the weight's int8 / scale / zero-point initializer names and its int32 bias, if any."""
    def __init__(self, xs, ys, w, ws, wz, axis, bias=None, bias_scale=None, xs_name=None):
        self.xs, self.ys, self.w, self.ws, self.wz, self.axis = xs, ys, w, ws, wz, axis
        self.xs_name = xs_name    # its initializer (the Add pass may have moved it)
        self.bias, self.bias_scale = bias, bias_scale   # bias_scale: its scale's initializer (QDQ), else xs·ws


def _scalar(inits, name):
    if name not in inits:
        return None
    v = numpy_helper.to_array(inits[name])
    return _F32(v.reshape(-1)[0]) if v.size == 1 else None


def _wide(zp_name, inits) -> bool:
    """A 16-bit zero point (int16 activations)."""
    zp = inits.get(zp_name)
    return zp is not None and zp.data_type in (onnx.TensorProto.INT16, onnx.TensorProto.UINT16)


def _qdq_layer(node, inits, producer, consumers) -> _Layer | None:
    dqx, dqw = producer.get(node.input[0]), producer.get(node.input[1])
    outs = consumers.get(node.output[0], [])
    if (dqx is None or dqw is None or dqx.op_type != "DequantizeLinear" or dqw.op_type != "DequantizeLinear"
            or len(outs) != 1 or outs[0].op_type != "QuantizeLinear" or dqw.input[0] not in inits):
        return None
    if any(len(q.input) > 2 and _wide(q.input[2], inits) for q in (dqx, outs[0])):
        return None             # int16 activations: ORT accumulates in float anyway (numerics.int16)
    axis = next((a.i for a in dqw.attribute if a.name == "axis"), 1)
    dqb = producer.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    bias = dqb.input[0] if dqb is not None and dqb.op_type == "DequantizeLinear" \
        and dqb.input[0] in inits and dqb.input[1] in inits else None
    return _Layer(_scalar(inits, dqx.input[1]), _scalar(inits, outs[0].input[1]), dqw.input[0], dqw.input[1],
                  dqw.input[2] if len(dqw.input) > 2 else None, axis, bias, dqb.input[1] if bias else None,
                  dqx.input[1])


def _qlinear_layer(node, inits) -> _Layer | None:
    """QLinearConv(x, xs, xz, w, ws, wz, ys, yz[, B]): B's scale is xs·ws by definition."""
    if len(node.input) < 8 or node.input[3] not in inits or _wide(node.input[2], inits) or _wide(node.input[7], inits):
        return None
    bias = node.input[8] if len(node.input) > 8 and node.input[8] in inits else None
    return _Layer(_scalar(inits, node.input[1]), _scalar(inits, node.input[6]), node.input[3], node.input[4],
                  node.input[5], 0, bias, xs_name=node.input[1])


def _qgemm_layer(node, inits) -> _Layer | None:
    """QGemm(A, as, az, B, bs, bz, C, ys, yz) with alpha 1 and an int8 output: C's scale is as·bs."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if len(node.input) < 9 or not node.input[7] or attrs.get("alpha", 1.0) != 1.0 or node.input[3] not in inits \
            or _wide(node.input[2], inits) or _wide(node.input[8], inits):
        return None
    bias = node.input[6] if node.input[6] in inits else None
    return _Layer(_scalar(inits, node.input[1]), _scalar(inits, node.input[7]), node.input[3], node.input[4],
                  node.input[5], 0 if attrs.get("transB", 0) else 1, bias, xs_name=node.input[1])


def _rescale(layer: _Layer, inits, floats, moved) -> None:
    """Move the layer's weight scales (re-quantizing its weights), and re-quantize its bias to
    ``xs·ws`` when either its weight scales or its input scale (``moved``: by the Add pass) changed."""
    xs, ys = layer.xs, layer.ys
    if xs is None or ys is None or layer.ws not in inits:
        return
    ws = numpy_helper.to_array(inits[layer.ws]).astype(_F32)
    new_ws = _reweigh(layer, inits, floats, ws)
    old_xs = moved.get(layer.xs_name, xs)
    if layer.bias is not None and (new_ws is not ws or old_xs != xs):
        old = inits[layer.bias_scale] if layer.bias_scale else None
        _requantize_bias(inits, layer.bias, numpy_helper.to_array(old) if old is not None else
                         dq_scale(old_xs, ws.reshape(-1)), dq_scale(xs, new_ws.reshape(-1)), layer.bias_scale)


def _reweigh(layer: _Layer, inits, floats, ws):
    """The new weight scales (``ws`` itself when none moves), the int8 weights re-quantized."""
    w_q = numpy_helper.to_array(inits[layer.w])
    zp = numpy_helper.to_array(inits[layer.wz]) if layer.wz in inits else None
    if w_q.dtype != np.int8 or (zp is not None and np.any(zp != 0)):
        return ws
    found = [exact_weight_scale(layer.xs, s, layer.ys) for s in ws.reshape(-1)]
    if all(v is None for v in found):
        return ws
    new_ws = np.array([s if v is None else v for s, v in zip(ws.reshape(-1), found)], _F32).reshape(ws.shape)
    shape = [1] * w_q.ndim
    if ws.size > 1:
        shape[layer.axis % w_q.ndim] = ws.size
    base = layer.w[:-len("_quantized")] if layer.w.endswith("_quantized") else None
    if base in floats and numpy_helper.to_array(floats[base]).shape == w_q.shape:
        w = numpy_helper.to_array(floats[base]).astype(np.float64)
    else:
        w = w_q.astype(np.float64) * ws.reshape(shape)
    w_new = np.clip(np.rint(w / new_ws.reshape(shape).astype(np.float64)), -127, 127).astype(np.int8)
    inits[layer.w].CopyFrom(numpy_helper.from_array(w_new, layer.w))
    inits[layer.ws].CopyFrom(numpy_helper.from_array(new_ws, layer.ws))
    return new_ws


def _requantize_bias(inits, name, old, new_scale, scale_name=None) -> None:
    """The int32 bias ``name`` (scale ``old``) re-quantized to ``new_scale``; ``scale_name``: the
    initializer that holds its scale (QDQ), rewritten too."""
    b = numpy_helper.to_array(inits[name])
    old = np.asarray(old)
    if b.dtype != np.int32 or new_scale.size not in (1, b.size) or old.size != new_scale.size:
        return
    scale = new_scale.astype(_F32).reshape(old.shape)
    real = b.astype(np.float64) * old.astype(np.float64).reshape(-1)
    q = np.clip(np.rint(real / scale.astype(np.float64).reshape(-1)), -2 ** 31, 2 ** 31 - 1).astype(np.int32)
    inits[name].CopyFrom(numpy_helper.from_array(q, name))
    if scale_name:
        inits[scale_name].CopyFrom(numpy_helper.from_array(scale, scale_name))
