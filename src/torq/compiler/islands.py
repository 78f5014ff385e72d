"""Where the bf16 islands of a compiled int8 model meet the int8 parts, in Program slots and
ONNX tensor names.

An island (an op without an integer form, lowered between the bf16 Dequantize and Quantize
fallbacks) reads int8 tensors through DequantizeLinear and writes int8 tensors through
QuantizeLinear. Those int8 tensors exist in ONNX Runtime's run of the same model too, so
`verify` can compare the island's result with ORT's where it is made (the island's own
tolerance), and hand ORT's value on to the int8 ops after it (which stay bit-exact).
"""
from __future__ import annotations

from dataclasses import dataclass, field

#: ONNX ops that only move data: an island may read its DQ / feed its Q through them.
_MOVES = {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity"}


@dataclass
class Island:
    onnx_op: str                                   # "Softmax", "LayerNormalization"
    node: str                                      # the ONNX node's name (its first output when unnamed)
    location: str                                  # its LINE:COL
    inputs: list = field(default_factory=list)     # [(slot, ONNX name)] of the int8 tensors its DQs read
    outputs: list = field(default_factory=list)    # [(slot, ONNX name)] of the int8 tensors its Qs write
    zero_points: dict = field(default_factory=dict)  # output slot -> its Q's zero point (int8 domain)


def bracketed(model, operator_locations, kinds) -> dict:
    """{LINE:COL: op type} of the nodes of ``kinds`` (ops without an integer form) that sit
    between DequantizeLinear and QuantizeLinear: every activation they read is dequantized int8 (or
    a float graph input), every result is quantized to int8 (through data movement only). Those can be bf16 islands:
    their int8 result is what ORT's is compared with; an op whose result stays float is not one."""
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    if len(nodes) != len(operator_locations):
        return {}
    consts = {t.name for t in model.graph.initializer} | {o for n in model.graph.node if n.op_type == "Constant"
                                                          for o in n.output}
    producer = {o: n for n in nodes for o in n.output}
    readers: dict = {}
    for n in nodes:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outs = {o.name for o in model.graph.output}
    consts_or_inputs = consts | {i.name for i in model.graph.input}
    found = {}
    for n, (_, loc) in zip(nodes, operator_locations):
        if n.op_type not in kinds:
            continue
        ins = [i for i in n.input if i and i not in consts_or_inputs]
        reads_int8 = all(_chain(i, lambda t: [producer[t]] if t in producer else [], "DequantizeLinear",
                                        consts_or_inputs, outs) for i in ins)
        if reads_int8 and all(_chain(o, lambda t: readers.get(t, []), "QuantizeLinear", consts, outs)
                              for o in n.output if o):
            found[loc] = n.op_type
    return found


def _chain(t, step, kind: str, consts, outs) -> bool:
    """Every path from tensor ``t`` through data-movement nodes ends at a ``kind`` node (and,
    going forward, never at a graph output)."""
    nxt = step(t)
    if not nxt or (kind == "QuantizeLinear" and t in outs):
        return False
    for m in nxt:
        if m.op_type == kind:
            continue
        if m.op_type not in _MOVES:
            return False
        follow = m.output[:1] if kind == "QuantizeLinear" else [i for i in m.input[:1] if i not in consts]
        if not all(_chain(f, step, kind, consts, outs) for f in follow):
            return False
    return True


def find_islands(program, model, operator_locations, islands: dict) -> list[Island]:
    """The `Island` of each LINE:COL of ``islands`` ({LINE:COL: ONNX op}, the lowering report's)
    in ``program``, compiled from ``model`` (the front end's graph: its k-th non-Constant node is
    the k-th of ``operator_locations``)."""
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    if not islands or len(nodes) != len(operator_locations):
        return []
    loc_of = {id(n): loc for n, (_, loc) in zip(nodes, operator_locations)}
    producer = {o: n for n in nodes for o in n.output}
    readers: dict = {}
    for n in nodes:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    steps: dict = {}
    for st in program.steps:
        steps.setdefault(st.location, []).append(st)
    found = []
    for n, (_, loc) in zip(nodes, operator_locations):
        if loc not in islands:
            continue
        isl = Island(islands[loc], n.name or (n.output[0] if n.output else ""), loc)
        for dq in _ends(n.input, lambda t: [producer[t]] if t in producer else [], "DequantizeLinear"):
            first = steps.get(loc_of[id(dq)], [None])[0]
            if first is not None and first.op == "torq_hl.fma":          # the fallback's q - zp
                isl.inputs.append((first.args[0], dq.input[0]))
        for q in _ends(n.output, lambda t: readers.get(t, []), "QuantizeLinear"):
            last = steps.get(loc_of[id(q)], [None])[-1]
            if last is not None and last.op == "torq_hl.fma":            # the fallback's clamp
                isl.outputs.append((last.out, q.output[0]))
                isl.zero_points[last.out] = _zero_point(model, q)
        found.append(isl)
    return found


def _zero_point(model, q) -> int:
    from onnx import numpy_helper
    inits = {t.name: t for t in model.graph.initializer}
    if len(q.input) < 3 or q.input[2] not in inits:
        return 0
    return int(numpy_helper.to_array(inits[q.input[2]]).reshape(-1)[0])


def _ends(tensors, step, kind: str) -> list:
    """The ``kind`` nodes reached from ``tensors`` (``step``: a tensor's producer or readers)
    through data-movement nodes only."""
    out, todo, seen = [], list(tensors), set()
    while todo:
        t = todo.pop()
        if not t or t in seen:
            continue
        seen.add(t)
        for m in step(t):
            if m.op_type == kind:
                out.append(m)
            elif m.op_type in _MOVES:
                todo.extend(m.output[:1] if kind == "QuantizeLinear" else m.input[:1])
    return out
