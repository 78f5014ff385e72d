"""Scales on which ONNX Runtime's windowed average pool is exact: `Q ∘ AveragePool ∘ DQ` (QDQ)
and `QLinearAveragePool` (QOperator) with ``ys = xs`` -> same, ``xs'`` of 16 - log2(count) bits.

ORT pools in float: ``fl32(xs·(x - zx))`` summed, divided by the count and by ``ys``. A 2×2 window
makes a quarter of the outputs exact x.5 ties, and ORT's float sum breaks some of them either way
(DenseNet-121: 3614 of 100,352 outputs of one pool differed from the NPU's round-half-to-even).
With ``xs`` rounded to 14 significant bits (a 0.003 % move) every float step is exact and the
NPU's NTE gives ORT's integers (``numerics.avgpool_exact_scale``). The scale is shared by the
pool's input and output (and usually by the Conv before it, whose weight scales the weight pass
then re-matches); it moves only when every other reader follows it: Convs the weight pass
re-exactifies, Adds (matched afterwards), other pools, Concats (their requantizations were not
exact to begin with; a 0.003 % change of a near-identity one changes no integer).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ..numerics import avgpool_exact_scale
from .exact_adds import qdq_gap_follows, gap_follows, graph_index

_F32 = np.float32
_FOLLOW = {"Conv", "Gemm", "MatMul", "Add", "AveragePool", "MaxPool", "Concat"}   # DQ readers that follow
_QOPS = {("QLinearConv", ""): (1, 6), ("QGemm", "com.microsoft"): (1, 7), ("QLinearAdd", "com.microsoft"): (1, 4, 6),
         ("QLinearAveragePool", "com.microsoft"): (1, 3), ("QLinearConcat", "com.microsoft"): None,
         ("QLinearGlobalAveragePool", "com.microsoft"): (1,)}


def exact_pool_scales(m: onnx.ModelProto, is_layer, keep=frozenset()) -> dict[str, np.float32]:
    """Round (in place) the shared scale of every windowed average pool with a power-of-two
    window to ``avgpool_exact_scale``; ``is_layer`` as in ``exact_adds.exact_add_scales``.
    ``keep``: scale names that must not move. Returns the old value of every scale initializer it
    changed, by name."""
    g = m.graph
    inits, producer, consumers = graph_index(g)
    moved: dict[str, np.float32] = {}
    for n in g.node:
        site = _site(n, inits, producer, consumers)
        if site is None:
            continue
        name, count = site
        old = _F32(numpy_helper.to_array(inits[name]).reshape(-1)[0])
        new = avgpool_exact_scale(old, count)
        if new is None or new == old or name in moved or name in keep or not _follows(name, g, inits, producer, consumers, is_layer):
            continue
        moved[name] = old
        inits[name].CopyFrom(numpy_helper.from_array(np.asarray(new, _F32).reshape(
            numpy_helper.to_array(inits[name]).shape), name))
    return moved


def _attrs(n) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}


def _site(n, inits, producer, consumers) -> tuple[str, int] | None:
    """(the pool's one scale initializer, cells per window) of a windowed average pool whose
    input and output share a per-tensor scale and whose every window has the same count."""
    if n.op_type == "AveragePool" and n.domain in ("", "ai.onnx"):
        dq, outs = producer.get(n.input[0]), consumers.get(n.output[0], [])
        if dq is None or dq.op_type != "DequantizeLinear" or len(outs) != 1 or outs[0].op_type != "QuantizeLinear":
            return None
        xs, ys = dq.input[1], outs[0].input[1]
    elif n.op_type == "QLinearAveragePool" and n.domain == "com.microsoft" and len(n.input) >= 4:
        xs, ys = n.input[1], n.input[3]
    else:
        return None
    a = _attrs(n)
    if xs != ys or xs not in inits or any(d != 1 for d in inits[xs].dims) or a.get("ceil_mode", 0) \
            or (any(a.get("pads", [])) and not a.get("count_include_pad", 0)):
        return None
    return xs, int(np.prod(a.get("kernel_shape", [0])))


def _follows(name, g, inits, producer, consumers, is_layer) -> bool:
    """Does every reader of this scale follow it (module docstring)?"""
    outputs = {o.name for o in g.output} | {i.name for i in g.input}     # a graph input's int8 scale: the user's
    for n in consumers.get(name, []):
        idx = [i for i, v in enumerate(n.input) if v == name]
        key = (n.op_type, n.domain or "")
        if key in _QOPS:
            allowed = _QOPS[key]
            if (allowed is not None and any(i not in allowed or (i in (1, 4) and n.input[i - 1] in outputs)
                                            for i in idx)) or \
                    (key[0] == "QLinearGlobalAveragePool" and not gap_follows(name, n.input[3], inits)) or \
                    (key[0] in ("QLinearConv", "QGemm") and not is_layer(n)):
                return False
        elif n.op_type == "QuantizeLinear" and idx == [1]:
            p = producer.get(n.input[0])
            if p is None or n.output[0] in outputs or not (p.op_type in ("AveragePool", "MaxPool") or (
                    p.op_type in ("Conv", "Gemm", "MatMul") and is_layer(p))):
                return False
        elif n.op_type == "DequantizeLinear" and idx == [1] and n.input[0] not in inits:
            if n.output[0] in outputs or n.input[0] in outputs or not all(
                    (u.op_type in _FOLLOW and (u.op_type not in ("Conv", "Gemm", "MatMul") or is_layer(u)))
                    or qdq_gap_follows(u, name, inits, consumers) for u in consumers.get(n.output[0], [])):
                return False
        else:
            return False
    return True
