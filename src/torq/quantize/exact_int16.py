"""Scales on which ONNX Runtime's float32 arithmetic for int16 layers is exact:
`Q ∘ op(DQ x, DQ w) -> same` with every scale around it dyadic, where x or the output is int16.

ORT has no integer kernel for 16-bit activations: it runs such a layer as DequantizeLinear →
float32 op → QuantizeLinear. With ordinary scales its dequantized values, sums and quotient
round, so ~1e-3 of an int16 writer's outputs and ~1e-5 of an int16 reader's land 1 LSB away
from the exact value the NPU computes; the int8 layers behind amplify any one of them, and a
mixed-precision model then loses top-1 agreement with ORT on near-tie images (docs/a16w8.md).

Every one of those float32 steps is exact when
  * every activation scale on an int16 op's inputs and output is a power of two, the int16 ones
    with ``HEADROOM_BITS`` of headroom (the calibrated range spans 2**(15 - HEADROOM_BITS)
    steps: 16 times finer than int8 still, and small enough that a reader's accumulator stays
    far below 2**24);
  * its weight scales are ``m·2**k`` with an ``WEIGHT_BITS``-bit ``m`` (moved up by < 1/2**(WEIGHT_BITS-1));
  * its int32 bias is on the grid ``xs·ws``;
then ``x·xs``, ``w·ws``, each product and each partial sum are small multiples of one power of
two (exact in float32 in any order, with or without FMA), and the quotient by a power-of-two
output scale is exact: ORT rounds the exact value half to even, as the NPU does with its exact
dyadic multiplier. Data movement between such tensors keeps one scale (the closure below), and
the int8 layers and Adds next to a moved tensor are matched to it afterwards by ``exact_scales``
(which is told to leave these scales where they are).
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from ..numerics import dq_scale
from .exact_adds import graph_index
from .precision import MOVES

_F32 = np.float32
HEADROOM_BITS = 4        # int16 tensors use 2**12 steps of their range: int12 precision, exact sums
WEIGHT_BITS = 2          # weight scale mantissas 1 or 1.5 (x 2**k): at most 1/3 coarser, ~0.2 bit on average
_OPS = {"Conv": 1, "Gemm": 1, "MatMul": 1, "Add": 2, "AveragePool": 1, "GlobalAveragePool": 1}
_WIDE = (onnx.TensorProto.INT16, onnx.TensorProto.UINT16)


def exact_int16_scales(qmodel: onnx.ModelProto, fp32: onnx.ModelProto | None = None
                       ) -> tuple[onnx.ModelProto, set[str]]:
    """A copy of the QDQ model with the scales around its int16 ops made dyadic (module
    docstring), and the names of the activation scale initializers it fixed (for
    ``exact_scales(keep=...)``). A model without int16 activations comes back unchanged."""
    m = onnx.ModelProto()
    m.CopyFrom(qmodel)
    g = m.graph
    inits, producer, consumers = graph_index(g)
    zps = _zero_points(g, inits)
    sites = [s for s in (_site(n, inits, producer, consumers, zps) for n in g.node) if s is not None]
    if not sites:
        return m, set()
    fixed = _closure({name for _, scales in sites for name in scales}, g, producer, consumers)
    for name in sorted(fixed):
        _snap_activation(inits, name, zps.get(name, ()))
    floats = {t.name: t for t in fp32.graph.initializer} if fp32 is not None else {}
    for n, _ in sites:
        if n.op_type in ("Conv", "Gemm", "MatMul"):
            _snap_weights(n, inits, producer, floats)
    _rebias(g, inits, producer)
    return m, fixed


def _zero_points(g, inits) -> dict[str, set[str]]:
    """{activation scale initializer: the zero-point initializers used with it}."""
    out: dict[str, set[str]] = {}
    for n in g.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[0] not in inits and len(n.input) > 1:
            out.setdefault(n.input[1], set()).update(n.input[2:3])
    return out


def _wide(scale: str, inits, zps) -> bool:
    return any(z in inits and inits[z].data_type in _WIDE for z in zps.get(scale, ()))


def _site(n, inits, producer, consumers, zps):
    """(node, its activation scale names) of a ``Q ∘ op ∘ DQ`` with an int16 input or output."""
    k = _OPS.get(n.op_type)
    if k is None or n.domain not in ("", "ai.onnx"):
        return None
    dqs = [producer.get(i) for i in n.input[:k]]
    outs = consumers.get(n.output[0], [])
    if any(d is None or d.op_type != "DequantizeLinear" or d.input[0] in inits for d in dqs) \
            or len(outs) != 1 or outs[0].op_type != "QuantizeLinear":
        return None
    if k == 1 and n.op_type in ("Conv", "Gemm", "MatMul"):
        w = producer.get(n.input[1])
        if w is None or w.op_type != "DequantizeLinear" or w.input[0] not in inits:
            return None
    scales = [d.input[1] for d in dqs] + [outs[0].input[1]]
    if not all(s in inits and numpy_helper.to_array(inits[s]).size == 1 for s in scales):
        return None
    return (n, scales) if any(_wide(s, inits, zps) for s in scales) else None


def _closure(names: set[str], g, producer, consumers) -> set[str]:
    """``names`` plus every activation scale joined to one of them through data movement
    (``DQ -> Reshape / MaxPool / ... -> Q``: ORT keeps one scale across such an op)."""
    edges: dict[str, set[str]] = {}
    for n in g.node:
        if n.op_type not in MOVES:
            continue
        ins = [producer[i].input[1] for i in n.input if i in producer and producer[i].op_type == "DequantizeLinear"]
        outs = [q.input[1] for o in n.output for q in consumers.get(o, []) if q.op_type == "QuantizeLinear"]
        for a in ins + outs:
            edges.setdefault(a, set()).update(ins + outs)
    found, todo = set(), list(names)
    while todo:
        s = todo.pop()
        if s not in found:
            found.add(s)
            todo.extend(edges.get(s, ()))
    return found


def _snap_activation(inits, name: str, zp_names) -> None:
    """The scale ``name`` up to a power of two (int16: with the headroom), its zero points moved
    so that real 0 stays where it was (rounded)."""
    s = float(numpy_helper.to_array(inits[name]).reshape(-1)[0])
    wide = any(z in inits and inits[z].data_type in _WIDE for z in zp_names)
    new = math.ldexp(1.0, math.ceil(math.log2(s)) + (HEADROOM_BITS if wide else 0))
    inits[name].CopyFrom(numpy_helper.from_array(np.asarray(new, _F32).reshape(inits[name].dims), name))
    for z in zp_names:
        if z in inits:
            zp = numpy_helper.to_array(inits[z])
            info = np.iinfo(zp.dtype)
            moved = np.clip(np.rint(zp.astype(np.float64) * s / new), info.min, info.max).astype(zp.dtype)
            inits[z].CopyFrom(numpy_helper.from_array(moved, z))


def dyadic_ceil(v: np.ndarray, bits: int = WEIGHT_BITS) -> np.ndarray:
    """The smallest ``m·2**k >= v`` with a ``bits``-bit integer ``m`` (element-wise, v > 0)."""
    v = np.asarray(v, np.float64)
    e = np.floor(np.log2(v)) - (bits - 1)
    return np.ceil(v / 2.0 ** e) * 2.0 ** e


def _snap_weights(n, inits, producer, floats) -> None:
    """The layer's weight scales onto the ``WEIGHT_BITS`` grid, its int8 weights re-quantized
    (from the fp32 weights when known)."""
    dqw = producer[n.input[1]]
    w_name, s_name = dqw.input[0], dqw.input[1]
    zp = numpy_helper.to_array(inits[dqw.input[2]]) if len(dqw.input) > 2 and dqw.input[2] in inits else None
    w_q = numpy_helper.to_array(inits[w_name])
    if w_q.dtype != np.int8 or (zp is not None and np.any(zp != 0)):
        return
    ws = numpy_helper.to_array(inits[s_name]).astype(np.float64)
    new = dyadic_ceil(ws).astype(_F32)
    if np.array_equal(new, ws.astype(_F32)):
        return
    axis = next((a.i for a in dqw.attribute if a.name == "axis"), 1)
    shape = [1] * w_q.ndim
    if ws.size > 1:
        shape[axis % w_q.ndim] = ws.size
    base = w_name[:-len("_quantized")] if w_name.endswith("_quantized") else None
    if base in floats and numpy_helper.to_array(floats[base]).shape == w_q.shape:
        w = numpy_helper.to_array(floats[base]).astype(np.float64)
    else:
        w = w_q.astype(np.float64) * ws.reshape(shape)
    w_new = np.clip(np.rint(w / new.astype(np.float64).reshape(shape)), -127, 127).astype(np.int8)
    inits[w_name].CopyFrom(numpy_helper.from_array(w_new, w_name))
    inits[s_name].CopyFrom(numpy_helper.from_array(new.reshape(ws.shape), s_name))


def _rebias(g, inits, producer) -> None:
    """Every Conv / Gemm / MatMul int32 bias whose scale is no longer ``fl32(xs·ws)``
    re-quantized to it (its input or weight scale moved)."""
    for n in g.node:
        if n.op_type not in ("Conv", "Gemm") or len(n.input) < 3 or n.input[2] not in producer:
            continue
        dqx, dqw, dqb = (producer.get(i) for i in n.input[:3])
        if any(d is None or d.op_type != "DequantizeLinear" for d in (dqx, dqw, dqb)) \
                or not all(i in inits for i in dqb.input[:2]) or dqx.input[1] not in inits:
            continue
        b = numpy_helper.to_array(inits[dqb.input[0]])
        old = numpy_helper.to_array(inits[dqb.input[1]]).astype(np.float64).reshape(-1)
        want = dq_scale(numpy_helper.to_array(inits[dqx.input[1]]).reshape(-1)[0],
                        numpy_helper.to_array(inits[dqw.input[1]]).reshape(-1))
        scale = numpy_helper.to_array(inits[dqb.input[1]])
        if b.dtype != np.int32 or want.size != scale.size or want.size not in (1, b.size) \
                or np.array_equal(want, old.astype(_F32)):
            continue
        real = b.astype(np.float64) * (old if old.size == b.size else old[0])
        q = np.clip(np.rint(real / want.astype(np.float64).reshape(-1)), -2 ** 31, 2 ** 31 - 1).astype(np.int32)
        inits[dqb.input[0]].CopyFrom(numpy_helper.from_array(q, dqb.input[0]))
        inits[dqb.input[1]].CopyFrom(numpy_helper.from_array(want.astype(_F32).reshape(scale.shape), dqb.input[1]))
