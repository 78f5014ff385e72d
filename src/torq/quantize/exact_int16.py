"""Scales on which ONNX Runtime's float32 arithmetic for int16 layers is exact:
`Q ∘ op(DQ x, DQ w) -> same` with every scale around it dyadic, where x or the output is int16.

ORT has no integer kernel for 16-bit activations: it runs such a layer as DequantizeLinear →
float32 op → QuantizeLinear. With ordinary scales its dequantized values, sums and quotient
round, so ~1e-3 of an int16 writer's outputs and ~1e-5 of an int16 reader's land 1 LSB away
from the exact value the NPU computes; the int8 layers behind amplify any one of them, and a
mixed-precision model then loses top-1 agreement with ORT on near-tie images (docs/a16w8.md).

Every one of those float32 steps is exact when each scale around an int16 op (Conv / Gemm /
MatMul / Add / average pools with an int16 input or output) is ``m·2**k`` with a small odd ``m``:
  * int16 tensors: a power of two with ``HEADROOM_BITS`` of headroom (the calibrated range spans
    2**(16 - HEADROOM_BITS) steps: 16 times finer than int8 still, and a reader's accumulator
    stays far below 2**24);
  * int8 tensors: ``m`` ∈ {1, 3} (scale 1·2**k or 1.5·2**k, rounded up: at most log2 1.5 = 0.58
    bits of range), a power of two (at most 1 bit) where an Add or pool writes them (their
    quotient must stay dyadic);
  * weights: ``m`` ∈ {1, 3}·(3 where the output's ``m`` is 3 and the input's is not), rounded up;
  * the int32 bias on the grid ``xs·ws``;
so ``x·xs``, ``w·ws``, every product and partial sum (below 2**24 units, in any order, with or
without FMA) and the quotient by the output scale are exact: ORT rounds the exact value half to
even, as the NPU does with its exact dyadic multiplier.

A Relu / Clip that ORT's quantizer folded into a Q's saturation (its range starts at the clip's
0, or ends at its max) must keep clipping: an int8 tensor keeps its zero point at the type's
minimum and rounds its scale *down* onto the grid (ReLU6: 6/256 = 1.5·2**-6, the clip at 5.98),
an int16 tensor gets the Relu / Clip back as a node before its Q (ORT runs it in float, exactly;
the compiler folds it into the output bounds). A site whose clip cannot be kept within 1 % is left
as calibrated (ORT's float path, bounded as before). Data movement between such tensors keeps one
scale (the closure below); the int8 layers and Adds next to a moved tensor are matched to it
afterwards by ``exact_scales``, which leaves these scales where they are.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..numerics import dq_scale
from .exact_adds import graph_index
from .precision import MOVES

_F32 = np.float32
HEADROOM_BITS = 4        # int16 tensors use 2**12 steps of their range: 16x finer than int8, exact sums
CLIP_LOSS = 0.01         # a folded clip may move down by at most 1 % (else the site keeps its scales)
_OPS = {"Conv": 1, "Gemm": 1, "MatMul": 1, "Add": 2, "AveragePool": 1, "GlobalAveragePool": 1}
_SUMS = ("Add", "AveragePool", "GlobalAveragePool")
_WIDE = (onnx.TensorProto.INT16, onnx.TensorProto.UINT16)


def exact_int16_scales(qmodel: onnx.ModelProto, fp32: onnx.ModelProto | None = None
                       ) -> tuple[onnx.ModelProto, set[str]]:
    """A copy of the QDQ model with the scales around its int16 ops made dyadic (module
    docstring), and the names of the activation scale initializers it fixed (for
    ``exact_scales(keep=...)``). A model without int16 activations comes back unchanged.
    ``fp32``: the model that was quantized (its weights, and the Relu / Clip ORT folded)."""
    m = onnx.ModelProto()
    m.CopyFrom(qmodel)
    g = m.graph
    inits, producer, consumers = graph_index(g)
    zps = _zero_points(g, inits)
    sites = [s for s in (_site(n, inits, producer, consumers, zps) for n in g.node) if s is not None]
    clips = _folded_clips(g, producer, fp32)
    tensors: dict[str, list[str]] = {}
    for n in g.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in inits:
            tensors.setdefault(n.input[1], []).append(n.input[0])
    while True:             # drop the sites a scale of which cannot be made dyadic, until none is left
        sums = {scales[-1] for n, scales in sites if n.op_type in _SUMS}
        fixed = _closure({name for _, scales in sites for name in scales}, g, producer, consumers)
        plan = {name: _plan(name, inits, zps.get(name, ()), [clips.get(t) for t in tensors.get(name, [])],
                            name in sums) for name in fixed}
        kept = [(n, scales) for n, scales in sites
                if all(plan[s] is not None for s in _closure(set(scales), g, producer, consumers))]
        if len(kept) == len(sites):
            break
        sites = kept
    if not sites:
        return m, set()
    for name in sorted(fixed):
        if plan[name] is None:          # joined by data movement only to a dropped site: as calibrated
            continue
        new, zp_new = plan[name]
        inits[name].CopyFrom(numpy_helper.from_array(np.asarray(new, _F32).reshape(inits[name].dims), name))
        for z, v in zp_new.items():
            inits[z].CopyFrom(numpy_helper.from_array(v, z))
        if _wide(name, inits, zps):
            for t in tensors.get(name, []):
                if clips.get(t) is not None:
                    _unfold_clip(g, producer, t, clips[t])
    floats = {t.name: t for t in fp32.graph.initializer} if fp32 is not None else {}
    for n, scales in sites:
        if n.op_type in ("Conv", "Gemm", "MatMul"):
            _snap_weights(n, inits, producer, floats, _odd(inits, scales[0]), _odd(inits, scales[-1]))
    _rebias(g, inits, producer)
    return m, {name for name in fixed if plan[name] is not None}


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
    """(node, its activation scale names, output last) of a ``Q ∘ op ∘ DQ`` with an int16 side."""
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


def _folded_clips(g, producer, fp32) -> dict[str, tuple[float, float]]:
    """{tensor: (lo, hi)} of the Relu / Clip outputs of ``fp32`` that the quantized graph makes
    with another op (ORT's quantizer removed them: the Q's saturation clips instead)."""
    if fp32 is None:
        return {}
    consts = {t.name: numpy_helper.to_array(t) for t in fp32.graph.initializer}
    found = {}
    for n in fp32.graph.node:
        if n.op_type not in ("Relu", "Clip") or n.output[0] not in producer \
                or producer[n.output[0]].op_type == n.op_type:
            continue
        attrs = {a.name: a.f for a in n.attribute}
        bounds = [attrs.get("min", -math.inf), attrs.get("max", math.inf)] if n.op_type == "Clip" else [0.0, math.inf]
        for i in (1, 2):
            if n.op_type == "Clip" and len(n.input) > i and n.input[i]:
                v = consts.get(n.input[i])
                bounds[i - 1] = float(v.reshape(-1)[0]) if v is not None and v.size == 1 else math.nan
        if not any(math.isnan(v) for v in bounds):
            found[n.output[0]] = tuple(bounds)
    return found


def _grid(s: float, pow2: bool, up: bool) -> float:
    """The nearest ``m·2**k`` above (``up``) or below ``s``, m ∈ {1, 3} (``pow2``: m = 1)."""
    bits = 1 if pow2 else 2
    e = math.floor(math.log2(s)) - (bits - 1)
    q = s / 2.0 ** e
    return (math.ceil(q) if up else math.floor(q)) * 2.0 ** e


def _plan(name, inits, zp_names, clips, pow2: bool):
    """(new scale, {zero-point initializer: new value}) for one activation scale, or None when a
    clip its Q's saturation implements cannot be kept (module docstring)."""
    s = float(numpy_helper.to_array(inits[name]).reshape(-1)[0])
    zp_arrays = {z: numpy_helper.to_array(inits[z]) for z in zp_names if z in inits}
    if not (s > 0 and math.isfinite(s)) or len({int(v.reshape(-1)[0]) for v in zp_arrays.values()}) > 1:
        return None
    zp = int(next(iter(zp_arrays.values())).reshape(-1)[0]) if zp_arrays else 0
    dtype = next(iter(zp_arrays.values())).dtype if zp_arrays else np.dtype(np.uint8)
    info = np.iinfo(dtype)
    known = [c for c in clips if c is not None]
    if len(set(known)) > 1:
        return None
    clip = known[0] if known else None
    if dtype.itemsize == 2:                       # int16: headroom; a folded clip becomes a node again
        new = math.ldexp(1.0, math.ceil(math.log2(s)) + HEADROOM_BITS)
        return new, {z: np.asarray(np.rint(zp * s / new), dtype).reshape(v.shape) for z, v in zp_arrays.items()}
    top = clip is not None and math.isfinite(clip[1]) and abs((info.max - zp) * s - clip[1]) <= 1e-3 * clip[1]
    new = _grid(s, pow2, up=not top)
    if top and new < s * (1 - CLIP_LOSS):
        return None
    moved = info.min if zp == info.min else int(np.clip(np.rint(zp * s / new), info.min, info.max))
    return new, {z: np.asarray(moved, dtype).reshape(v.shape) for z, v in zp_arrays.items()}


def _unfold_clip(g, producer, tensor: str, clip) -> None:
    """Put the Relu / Clip ORT folded into ``tensor``'s Q back in front of it (an int16 tensor
    with headroom no longer saturates at the clip)."""
    p = producer[tensor]
    raw = f"{tensor}__torq_unclipped"
    p.output[list(p.output).index(tensor)] = raw
    lo, hi = clip
    bounds = []
    for v, tag in ((lo, "min"), (hi, "max")):
        if math.isfinite(v):
            g.initializer.append(numpy_helper.from_array(np.asarray(v, _F32), f"{tensor}__torq_{tag}"))
            bounds.append(f"{tensor}__torq_{tag}")
        else:
            bounds.append("")
    while bounds and not bounds[-1]:
        bounds.pop()
    node = helper.make_node("Clip", [raw, *bounds], [tensor], name=f"{tensor}__torq_clip")
    nodes = list(g.node)
    g.node.insert(nodes.index(p) + 1, node)
    producer[tensor] = node


def _odd(inits, name: str) -> int:
    """The odd part of a dyadic scale's mantissa (1 or 3 here)."""
    f = Fraction(float(numpy_helper.to_array(inits[name]).reshape(-1)[0]))
    n = f.numerator
    return n // (n & -n)


def dyadic_ceil(v: np.ndarray, bits: int = 2) -> np.ndarray:
    """The smallest ``m·2**k >= v`` with a ``bits``-bit integer ``m`` (element-wise, v > 0)."""
    v = np.asarray(v, np.float64)
    e = np.floor(np.log2(v)) - (bits - 1)
    return np.ceil(v / 2.0 ** e) * 2.0 ** e


def _snap_weights(n, inits, producer, floats, odd_x: int, odd_y: int) -> None:
    """The layer's weight scales up onto ``base·{1, 1.5}·2**k`` (``base`` makes ``xs·ws/ys`` a
    dyadic), its int8 weights re-quantized (from the fp32 weights when known)."""
    dqw = producer[n.input[1]]
    w_name, s_name = dqw.input[0], dqw.input[1]
    zp = numpy_helper.to_array(inits[dqw.input[2]]) if len(dqw.input) > 2 and dqw.input[2] in inits else None
    w_q = numpy_helper.to_array(inits[w_name])
    if w_q.dtype != np.int8 or (zp is not None and np.any(zp != 0)):
        return
    base = odd_y // math.gcd(odd_x, odd_y)
    ws = numpy_helper.to_array(inits[s_name]).astype(np.float64)
    new = (base * dyadic_ceil(ws / base)).astype(_F32)
    if np.array_equal(new, ws.astype(_F32)):
        return
    axis = next((a.i for a in dqw.attribute if a.name == "axis"), 1)
    shape = [1] * w_q.ndim
    if ws.size > 1:
        shape[axis % w_q.ndim] = ws.size
    name = w_name[:-len("_quantized")] if w_name.endswith("_quantized") else None
    if name in floats and numpy_helper.to_array(floats[name]).shape == w_q.shape:
        w = numpy_helper.to_array(floats[name]).astype(np.float64)
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
