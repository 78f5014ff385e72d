"""Per-layer activation precision: which tensors ONNX Runtime quantizes to int8, which to int16.

A *layer* is a compute node (Conv, Gemm, MatMul, Add, pools, ...); its precision is that of the
activation it produces: a layer in int16 writes an int16 tensor, and every layer reading it
reads int16 (the NPU's I16×I8 path, docs/a16w8.md) whatever it writes itself. Nodes that only
move or clip data (Reshape, MaxPool, Concat, Relu, Clip, ...) keep the precision of the layer
that produced their input, as ORT quantizes their output like their input. Graph inputs are
produced at the default precision. In ORT's QDQ graph this is one ``TensorQuantOverrides``
entry per int16 tensor (``quant_type`` QInt16): each tensor still has exactly one Q → DQ pair,
so no conversion between precisions is ever inserted (the compiler lowers those it meets in
other models: a table for int8 → int16, the ACT rescale for int16 → int8).

Why the output and not the input: a layer whose output stays int8 loses the same precision
whatever it computed in; promoting the tensor is what keeps 16 bits into the next layers, and
it is what ``sensitivity`` measures (one layer's output in int8, the rest fp32).

``precision`` everywhere is a mapping {node name: "int8" | "int16"}; nodes not named take the
default. Every node must have a name (``name_nodes`` gives the unnamed ones ``<op>_<index>``).
"""
from __future__ import annotations

from typing import Mapping

import onnx
from onnxruntime.quantization import QuantType

from ..errors import TorqError

PRECISIONS = ("int8", "int16")
QUANT_TYPES = {"int8": QuantType.QInt8, "int16": QuantType.QInt16}
#: Nodes whose output ORT quantizes like their input: they inherit their producer's precision.
MOVES = frozenset({
    "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool", "Relu", "Clip", "Pad",
    "Slice", "Split", "Gather", "Resize", "Concat", "Identity", "DepthToSpace", "SpaceToDepth", "Expand",
    "Tile", "GlobalMaxPool", "ReduceMax", "ReduceMin"})
_SKIP = frozenset({"Constant", "QuantizeLinear", "DequantizeLinear", "Shape", "Size", "ConstantOfShape"})


def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every unnamed node named ``<op_type>_<index>`` (a copy when any is renamed)."""
    if all(n.name for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    taken = {n.name for n in out.graph.node if n.name}
    for i, n in enumerate(out.graph.node):
        if not n.name:
            name, k = f"{n.op_type}_{i}", 0
            while name in taken:
                k += 1
                name = f"{n.op_type}_{i}_{k}"
            n.name = name
            taken.add(name)
    return out


def layers(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes a precision applies to (compute nodes), in graph order."""
    return [n.name for n in model.graph.node if n.op_type not in MOVES and n.op_type not in _SKIP]


#: Ops the NSS lowers with an int16 activation input (docs/a16w8.md: conv2d, depthwise_conv2d,
#: fully_connected, add, avg_pool2d; data movement passes the type on). Anything else reading an
#: int16 tensor (a Sigmoid / HardSwish table, a Mul, a float island) has no int16 form.
INT16_READERS = frozenset({"Conv", "Gemm", "MatMul", "Add", "AveragePool", "GlobalAveragePool"})


def int8_only_layers(model: onnx.ModelProto) -> dict[str, str]:
    """{layer: why it must stay int8}: a layer whose op has no int16 form on the NSS, or whose
    output such an op reads (``INT16_READERS``; a MatMul only with a constant second operand:
    activation × activation has no int16 × int8 form) or a Concat joins with other tensors."""
    inits = {t.name for t in model.graph.initializer}
    readers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def wide(n) -> bool:
        return n.op_type in INT16_READERS and not (n.op_type == "MatMul" and n.input[1] not in inits)

    def blocker(tensor: str, seen: set) -> str | None:
        for r in readers.get(tensor, []):
            if r.op_type in _SKIP or id(r) in seen:
                continue
            seen.add(id(r))
            if r.op_type == "Concat":       # joins it with other layers' tensors: one type for all
                why = f"Concat {r.name!r} joins it with other tensors (int8 and int16 inputs have no form)"
            elif r.op_type in MOVES:
                why = next((b for o in r.output if (b := blocker(o, seen))), None)
            elif not wide(r):
                why = f"{r.op_type} {r.name!r} reads it and has no int16 form on the NSS"
            else:
                why = None
            if why:
                return why
        return None
    found = {}
    for n in model.graph.node:
        if n.op_type in MOVES or n.op_type in _SKIP or not n.output:
            continue
        why = blocker(n.output[0], set()) if wide(n) else f"its op ({n.op_type}) has no int16 form on the NSS"
        if why:
            found[n.name] = why
    return found


def check_precision(model: onnx.ModelProto, precision: Mapping[str, str], where: str = "model") -> None:
    """One-line TorqError for an unknown node or precision (names the first bad entry)."""
    known = {n.name: n.op_type for n in model.graph.node}
    for name, p in precision.items():
        if p not in PRECISIONS:
            raise TorqError(f"precision of {name!r}: {p!r} is not one of {', '.join(PRECISIONS)}")
        if name not in known:
            raise TorqError(f"{where}: no node named {name!r} (precision is given per node name)")


def resolve(model: onnx.ModelProto, precision: Mapping[str, str], default: str = "int8") -> dict[str, str]:
    """The precision of every node: given, or (data movement) its first activation producer's,
    or the default. Graph order is topological, so one pass suffices."""
    producer_prec: dict[str, str] = {}
    out: dict[str, str] = {}
    inits = {t.name for t in model.graph.initializer}
    for n in model.graph.node:
        if n.name in precision:
            p = precision[n.name]
        elif n.op_type in MOVES:
            srcs = [producer_prec[i] for i in n.input if i and i not in inits and i in producer_prec]
            p = srcs[0] if srcs else default
        else:
            p = default
        out[n.name] = p
        for o in n.output:
            producer_prec[o] = p
    return out


def tensor_overrides(model: onnx.ModelProto, precision: Mapping[str, str], default: str = "int8") -> dict:
    """ORT ``TensorQuantOverrides`` giving each layer's output its precision (module docstring):
    {tensor: [{"quant_type": ...}]} for every float activation not at the default. ``model``: the
    float model ORT quantizes (named nodes, shapes inferred)."""
    check_precision(model, precision)
    node_prec = resolve(model, precision, default)
    floats = _float_tensors(model)
    return {o: [{"quant_type": QUANT_TYPES[node_prec[n.name]]}]
            for n in model.graph.node if node_prec[n.name] != default
            for o in n.output if o in floats}


def _float_tensors(model: onnx.ModelProto) -> set[str]:
    """Activation tensors known to be float (value_info / graph I/O after shape inference)."""
    g = model.graph
    return {v.name for v in [*g.value_info, *g.input, *g.output]
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}


def parse_precision(text: str | None, model: onnx.ModelProto | None = None):
    """``--precision``: ``int8`` / ``int16`` (every layer), ``auto`` (chosen by measurement,
    ``quantize.auto_precision``), or ``NODE=int16,NODE=int16`` (those layers, the rest int8).
    Returns the string for the first three, else a {node: precision} dict."""
    if text is None:
        return "int8"
    t = str(text).strip()
    if t.lower() in ("int8", "int16", "auto"):
        return t.lower()
    out = {}
    for part in t.split(","):
        name, sep, p = part.strip().rpartition("=")
        if not sep or not name or p.strip().lower() not in PRECISIONS:
            raise TorqError(f"--precision {text!r}: expected int8, int16, auto or NODE=int16[,NODE=int8...]")
        out[name] = p.strip().lower()
    if model is not None:
        check_precision(model, out, "--precision")
    return out


PRECISION_KEY = "torq.precision"       # model metadata: the auto-precision report (JSON)


def stamp(model: onnx.ModelProto, report: dict) -> onnx.ModelProto:
    """``model`` with ``report`` (``AutoPrecision.to_json()``) in its metadata (replacing any)."""
    import json
    keep = [p for p in model.metadata_props if p.key != PRECISION_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    model.metadata_props.add(key=PRECISION_KEY, value=json.dumps(report))
    return model


def stamped(model: onnx.ModelProto) -> dict | None:
    """The auto-precision report ``stamp`` left on ``model``, or None."""
    import json
    for p in model.metadata_props:
        if p.key == PRECISION_KEY:
            try:
                report = json.loads(p.value)
            except (ValueError, RecursionError):    # a hostile model's metadata is not our report
                return None
            return report if isinstance(report, dict) else None
    return None


def precision_of(qmodel: onnx.ModelProto) -> dict[str, str]:
    """{compute node: "int8" | "int16"} of a QDQ model, read from the graph itself: the type of
    the QuantizeLinear after each node's output (of its input DequantizeLinear when the output
    is not quantized). Nodes without either are left out."""
    g = qmodel.graph
    zp_type = {t.name: t.data_type for t in g.initializer}
    readers: dict[str, list] = {}
    producer = {o: n for n in g.node for o in n.output}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    wide = (onnx.TensorProto.INT16, onnx.TensorProto.UINT16)

    def q_type(node):
        return "int16" if len(node.input) > 2 and zp_type.get(node.input[2]) in wide else "int8"
    out = {}
    for n in g.node:
        if n.op_type in _SKIP or n.op_type in MOVES or not n.output:
            continue
        qs = [r for r in readers.get(n.output[0], []) if r.op_type == "QuantizeLinear"]
        dqs = [producer[i] for i in n.input if i in producer and producer[i].op_type == "DequantizeLinear"
               and producer[i].input[0] not in zp_type]
        if qs:
            out[n.name] = q_type(qs[0])
        elif dqs:
            out[n.name] = q_type(dqs[0])
    return out


def mac_share(qmodel: onnx.ModelProto) -> dict[str, float]:
    """{"int8", "int16", "float": share of the model's multiply-accumulates} (``graph.macs``: Conv /
    Gemm / MatMul weight taps). A layer's MACs run at the width of its *activation input* (the
    DequantizeLinear feeding input 0): an int8-output layer that reads an int16 tensor multiplies
    int16 × int8. Layers whose input or weight is not dequantized count as float."""
    from ..graph.macs import macs_by_node
    qmodel = _batch_of_one(qmodel)
    g = qmodel.graph
    zp_type = {t.name: t.data_type for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    wide = (onnx.TensorProto.INT16, onnx.TensorProto.UINT16)
    macs = macs_by_node(qmodel)
    count = {"int8": 0, "int16": 0, "float": 0}
    for n in g.node:
        m = macs.get(n.name or n.output[0])
        if not m or not n.input:
            continue
        dq = producer.get(n.input[0])
        if n.op_type.startswith(("QLinear", "QGemm")) or n.op_type.endswith("Integer"):
            count["int8"] += m                          # QOperator: int8 in, by construction
        elif not all(i in producer and producer[i].op_type == "DequantizeLinear" for i in n.input[:2]):
            count["float"] += m
        else:
            zp = zp_type.get(dq.input[2]) if len(dq.input) > 2 else onnx.TensorProto.UINT8
            count["int16" if zp in wide else "int8"] += m
    total = sum(count.values()) or 1
    return {k: v / total for k, v in count.items() if v or k == "int8"}


def _batch_of_one(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose inputs' open leading (batch) dim is 1, so shapes infer statically."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    for vi in m.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if dims and not dims[0].dim_value:
            dims[0].dim_value = 1
    return m
