"""Float islands of a QOperator model, quantized with their calibrated ranges.

ORT's QOperator quantizer only rewrites ops it has a QLinear* kernel for. Between them it leaves
*float islands* that ORT runs in float between a DequantizeLinear and a QuantizeLinear:
HardSwish → squeeze-excite GlobalAveragePool (MobileNetV3), BatchNormalization → Relu →
GlobalAveragePool → Flatten (the DenseNet head). An int8 NPU has no float unit, and in QDQ form
ORT quantizes those very ops. ``quantize_islands`` gives every float activation of an island a
QuantizeLinear → DequantizeLinear pair, so that each island op sits alone between a DQ and a Q:

    DQ → HardSwish → GAP → Q        becomes        DQ → HardSwish → Q → DQ → GAP → Q

A tensor ORT already quantizes for a QLinear* consumer reuses that Q (same scale: the QLinear
op is unchanged); any other gets the range ORT's own calibrator measures for it (same data and
method as the rest of the model) and ORT's activation scale/zero-point rule. The result is a
mixed QOperator + QDQ model: ORT runs it as is, and the compiler lowers each island op with its
QDQ rule (tables, per-channel tables, pools, clamps, data movement).
"""
from __future__ import annotations

import heapq
from collections import defaultdict

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .lone_ops import activation_qparams, calibrated_ranges

_Q, _DQ = "QuantizeLinear", "DequantizeLinear"


def _float_tensors(q: onnx.ModelProto) -> set[str]:
    """Names of the float32 activations of ``q`` (ONNX type inference; contrib ops stay untyped;
    initializers and Constant outputs -- the exporter's scalars, e.g. GELU's 1/√2 -- are not)."""
    try:
        m = onnx.shape_inference.infer_shapes(q)
    except Exception:   # noqa: BLE001 - an untyped graph: fall back to the recorded types
        m = q
    g = m.graph
    typed = list(g.input) + list(g.value_info) + list(g.output)
    consts = {t.name for t in g.initializer} | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    return {v.name for v in typed if v.type.tensor_type.elem_type == TensorProto.FLOAT} - consts


def island_nodes(q: onnx.ModelProto, floats: set[str] | None = None) -> list[onnx.NodeProto]:
    """The nodes ORT left in float: any node but a QuantizeLinear reading a float activation."""
    floats = _float_tensors(q) if floats is None else floats
    return [n for n in q.graph.node if n.op_type != _Q and any(i in floats for i in n.input)]


def unquantized_tensors(q: onnx.ModelProto) -> list[str]:
    """Float activations that some op reads (or the graph outputs) without a DQ in between: not
    a DequantizeLinear's output, and read by something other than a QuantizeLinear. Empty for a
    model that is int8 throughout (its float ops each between a DQ and a Q)."""
    g = q.graph
    floats = _float_tensors(q)
    dq_outputs = {o for n in g.node if n.op_type == _DQ for o in n.output}
    read_raw = {i for n in g.node if n.op_type != _Q for i in n.input} | {o.name for o in g.output}
    names = dict.fromkeys(t for n in island_nodes(q, floats) for t in list(n.input) + list(n.output)
                          if t in floats and t not in dq_outputs and t in read_raw)
    return list(names)


def quantize_islands(q: onnx.ModelProto, fp32: onnx.ModelProto, reader, method,
                     elem: int = TensorProto.INT8) -> onnx.ModelProto:
    """A copy of QOperator model ``q`` whose float islands run on int8 (see module doc).

    ``fp32`` is the model ``q`` was quantized from (island tensors keep their names), ``reader``
    the calibration data (rewound), ``method`` ORT's calibration method."""
    wrap = unquantized_tensors(q)
    if not wrap:
        return q
    m = onnx.ModelProto()
    m.CopyFrom(q)
    g = m.graph
    consumers = defaultdict(list)
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
    existing_q = {t: next((c for c in consumers[t] if c.op_type == _Q), None) for t in wrap}
    need_range = [t for t in wrap if existing_q[t] is None]
    ranges = calibrated_ranges(fp32, reader, method, need_range,
                               sorted({n.op_type for n in island_nodes(q)})) if need_range else {}
    outputs = {o.name for o in g.output}
    after: dict[str, list[onnx.NodeProto]] = defaultdict(list)   # producer output -> new nodes
    for t in wrap:
        src = t
        if t in outputs:   # the graph output keeps its name: the producer writes t__torq_f
            src = f"{t}__torq_f"
            _rename(g, t, src)
        qn = existing_q[t]
        if qn is None:
            scale, zp = activation_qparams(*ranges[t], elem)
            s, z = f"{t}__torq_scale", f"{t}__torq_zp"
            g.initializer.extend([numpy_helper.from_array(np.asarray(scale), s),
                                  numpy_helper.from_array(zp, z)])
            qn = helper.make_node(_Q, [src, s, z], [f"{t}__torq_q"], name=f"{t}__torq_Q")
            after[src].append(qn)
        dq_out = t if t in outputs else f"{t}__torq_dq"
        after[src].append(helper.make_node(_DQ, [qn.output[0], *qn.input[1:]], [dq_out],
                                           name=f"{t}__torq_DQ"))
        for c in consumers[t]:
            if c.op_type != _Q:
                c.input[:] = [dq_out if i in (t, src) else i for i in c.input]
    _insert_after_producers(g, after)
    return m


def _rename(g: onnx.GraphProto, old: str, new: str) -> None:
    for n in g.node:
        n.input[:] = [new if i == old else i for i in n.input]
        n.output[:] = [new if o == old else o for o in n.output]


def _insert_after_producers(g: onnx.GraphProto, after: dict[str, list[onnx.NodeProto]]) -> None:
    """Put each new node list right after the node producing its tensor (graph inputs: first),
    then restore a topological order (a reused Q may come after the producer's other users)."""
    produced = {o for n in g.node for o in n.output}
    nodes = [n for t, ns in after.items() if t not in produced for n in ns]
    for n in g.node:
        nodes.append(n)
        for o in n.output:
            nodes.extend(after.get(o, []))
    del g.node[:]
    g.node.extend(_topological(nodes))


def _topological(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Stable topological order (Kahn; among ready nodes the earliest in ``nodes`` first)."""
    produced_by = {o: k for k, n in enumerate(nodes) for o in n.output}
    users = defaultdict(list)
    missing = [0] * len(nodes)
    for k, n in enumerate(nodes):
        for j in {produced_by[i] for i in n.input if i in produced_by}:
            users[j].append(k)
            missing[k] += 1
    ready = [k for k, c in enumerate(missing) if c == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        k = heapq.heappop(ready)
        out.append(nodes[k])
        for u in users[k]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, u)
    return out
