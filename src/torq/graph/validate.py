"""Refuse attribute values that native code downstream would trust blindly.

The ONNX checker looks at types, not values: a Conv with `group=0` or a DequantizeLinear whose
`axis` is out of range is checker-valid, and torch-mlir's converters then divide by zero or index
out of bounds (SIGFPE / SIGSEGV, no message). `validate(model, where)` checks every such value on
the ONNX graph first and raises a one-line TorqError naming the node and the attribute.
"""
from __future__ import annotations

import math
import re

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import TorqError, quote

#: ai.onnx opsets accepted: Q/DQ need 10, the newest is what the installed onnx knows.
MIN_OPSET = 10
MAX_OPSET = onnx.defs.onnx_opset_version()
MAX_DIM = 1 << 20            # one dimension of a graph input / value
MAX_ELEMENTS = 1 << 28       # one graph input (1 GiB of int32)
MAX_WINDOW = 1 << 12         # kernel size, stride, dilation, pad
MAX_RANK = 16

_CONV_WEIGHT = {"Conv": 1, "ConvInteger": 1, "ConvTranspose": 1, "QLinearConv": 3}
_POOLS = {"MaxPool", "AveragePool", "LpPool", "QLinearAveragePool", "MaxUnpool"}
#: Ops whose `axis` indexes their first input (Flatten's may also equal the rank).
_AXIS_OPS = {"Concat", "QuantizeLinear", "DequantizeLinear", "Softmax", "LogSoftmax", "Hardmax",
             "Gather", "GatherElements", "Split", "ArgMax", "ArgMin", "LayerNormalization",
             "Compress", "ScatterElements", "Scatter", "TopK", "Flatten", "QLinearSoftmax"}
_AXES_OPS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
             "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "Squeeze", "Unsqueeze"}
_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
_TINY = float(np.finfo(np.float32).tiny)
_AUTO_PAD = {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"}


def validate(model: onnx.ModelProto, where: str = "model", min_opset: int = MIN_OPSET) -> None:
    """Raise TorqError for the first attribute, dim or scale native code must not see."""
    _check_opset(model, where, min_opset)
    shapes = _shapes(model)
    _check_input_dims(model, where)
    _check_value_dims(model, where)
    for graph in _graphs(model.graph):
        inits = {t.name: t for t in graph.initializer}
        for i, node in enumerate(graph.node):
            label = f"{where}: node {quote(node.name or (node.output[0] if node.output else f'#{i}'))} " \
                    f"({node.op_type})"
            _check_node(node, shapes, label)
            if _is_quant_op(node):
                _check_scales(node, inits, label)


_INFERENCE_ERROR = re.compile(r"\(op_type:([^,]*), node name: (.*?)\): (?:\[\w+\] )?(.*)")


def check_consistent(model: onnx.ModelProto, where: str = "model") -> None:
    """Refuse a graph whose ops disagree about a shape (a Gemm fed 48 features for 64 weights).

    ONNX Runtime loads such a model while the stale declared shapes paper over the gap, then fails
    inside whichever session first re-infers them. Strict ONNX inference without the declared
    intermediate shapes (which ORT merges leniently) names the first node that cannot agree."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    for o in m.graph.output:
        o.type.tensor_type.ClearField("shape")
    try:
        onnx.shape_inference.infer_shapes(m, strict_mode=True)
    except onnx.shape_inference.InferenceError as e:
        first = next((ln for ln in str(e).splitlines() if ln.strip()), str(e))
        hit = _INFERENCE_ERROR.search(first)
        what = f"node {quote(hit.group(2))} ({hit.group(1)}): {hit.group(3).strip()}" if hit else first.strip()
        raise TorqError(f"{where}: the graph's shapes do not agree at {what} "
                        "(an attribute or shape upstream disagrees with this node)") from None
    except Exception:  # noqa: BLE001 - inference itself failed (size, unknown op): ORT judges later
        pass


def _check_opset(model: onnx.ModelProto, where: str, min_opset: int) -> None:
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise TorqError(f"{where}: the model imports no ai.onnx opset (opset_import)")
    v = versions[0]
    if not min_opset <= v <= MAX_OPSET:
        raise TorqError(f"{where}: ai.onnx opset {v} is not supported (supported: {min_opset}..{MAX_OPSET}; "
                        "convert it with onnx.version_converter)")


def _graphs(g: onnx.GraphProto):
    yield g
    for n in g.node:
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                yield from _graphs(sub)


def _shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    """name -> shape (None for unknown dims) of every value whose rank is known."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - value checks below still run on what the model declares
        inferred = model
    shapes = {}
    for g in _graphs(inferred.graph):
        for t in g.initializer:
            shapes[t.name] = tuple(t.dims)
        for v in list(g.input) + list(g.value_info) + list(g.output):
            tt = v.type.tensor_type
            if v.type.HasField("tensor_type") and tt.HasField("shape"):
                shapes.setdefault(v.name, tuple(d.dim_value if d.HasField("dim_value") else None
                                                for d in tt.shape.dim))
    return shapes


def _check_input_dims(model: onnx.ModelProto, where: str) -> None:
    inits = {t.name for t in model.graph.initializer}
    for v in model.graph.input:
        if v.name in inits or not v.type.HasField("tensor_type"):
            continue
        # Paddle's exports write -1 for "any size": an open dim, as a symbol (graph/input_shape.py)
        dims = [(k, d.dim_value) for k, d in enumerate(v.type.tensor_type.shape.dim)
                if d.HasField("dim_value") and d.dim_value != -1]
        for k, d in dims:
            if not 1 <= d <= MAX_DIM:
                raise TorqError(f"{where}: graph input {quote(v.name)} has dim {d} "
                                f"(each dim must be 1..{MAX_DIM})")
        size = math.prod(d for _, d in dims)
        if size > MAX_ELEMENTS:
            raise TorqError(f"{where}: graph input {quote(v.name)} has {size} elements "
                            f"(at most {MAX_ELEMENTS})")


def _check_value_dims(model: onnx.ModelProto, where: str) -> None:
    for g in _graphs(model.graph):
        for v in list(g.value_info) + list(g.output):
            if not v.type.HasField("tensor_type"):
                continue
            dims = v.type.tensor_type.shape.dim
            if len(dims) > MAX_RANK:
                raise TorqError(f"{where}: value {quote(v.name)} has rank {len(dims)} (at most {MAX_RANK})")
            for d in dims:
                if d.HasField("dim_value") and not -1 <= d.dim_value <= MAX_DIM:     # -1: open (Paddle)
                    raise TorqError(f"{where}: value {quote(v.name)} declares dim {d.dim_value} "
                                    f"(each dim must be 0..{MAX_DIM})")


def _is_quant_op(node: onnx.NodeProto) -> bool:
    return node.op_type in ("QuantizeLinear", "DequantizeLinear", "QGemm") or node.op_type.startswith("QLinear")


def _check_scales(node: onnx.NodeProto, inits: dict, label: str) -> None:
    """Every float constant of a quantized op is a scale: positive, finite, a normal float32
    (except a QuantizeLinear's input: data, e.g. a weight or ViT's folded class token)."""
    for name in node.input[1:] if node.op_type == "QuantizeLinear" else node.input:
        t = inits.get(name)
        if t is None or t.data_type not in _FLOAT_TYPES:
            continue
        values = numpy_helper.to_array(t).astype(np.float64).reshape(-1)
        bad = values[~(np.isfinite(values) & (values >= _TINY))]
        if bad.size:
            raise TorqError(f"{label}: scale {quote(name)} is {bad[0]:g} (scales must be finite and at "
                            f"least {_TINY:.3g})")


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _check_node(node: onnx.NodeProto, shapes: dict, label: str) -> None:
    attrs = _attrs(node)
    rank = _rank(shapes, node.input[0] if node.input else "")
    if node.op_type in _CONV_WEIGHT:
        _check_conv(node, attrs, shapes, label)
    if node.op_type in _CONV_WEIGHT or node.op_type in _POOLS:
        _check_window(node, attrs, rank, label)
    if "axis" in attrs and node.op_type in _AXIS_OPS:
        _check_axis(attrs["axis"], rank, label, "axis", flatten=node.op_type == "Flatten")
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            _check_per_axis(node, attrs["axis"], shapes, label)
    if "axes" in attrs and node.op_type in _AXES_OPS:
        out_rank = rank + len(attrs["axes"]) if rank is not None and node.op_type == "Unsqueeze" else rank
        for a in attrs["axes"]:
            _check_axis(a, out_rank, label, "axes")
        if len(set(attrs["axes"])) != len(attrs["axes"]):
            raise TorqError(f"{label}: attribute 'axes' repeats an axis: {list(attrs['axes'])}")
    if node.op_type == "Transpose" and "perm" in attrs:
        perm = list(attrs["perm"])
        if sorted(perm) != list(range(len(perm))) or (rank is not None and len(perm) != rank):
            raise TorqError(f"{label}: attribute 'perm' {perm} is not a permutation of the input's "
                            f"{rank if rank is not None else len(perm)} axes")
    for flag in ("transA", "transB", "ceil_mode", "keepdims", "count_include_pad", "storage_order"):
        if flag in attrs and attrs[flag] not in (0, 1):
            raise TorqError(f"{label}: attribute {flag!r} is {attrs[flag]} (must be 0 or 1)")


def _rank(shapes: dict, name: str) -> int | None:
    shape = shapes.get(name)
    return None if shape is None else len(shape)


def _check_axis(axis, rank: int | None, label: str, what: str, flatten: bool = False) -> None:
    if not isinstance(axis, int):
        raise TorqError(f"{label}: attribute {what!r} must be an integer")
    hi = (rank if flatten else rank - 1) if rank is not None else MAX_RANK
    lo = -rank if rank is not None else -MAX_RANK
    if not lo <= axis <= hi:
        shown = f"an input of rank {rank}" if rank is not None else "any tensor"
        raise TorqError(f"{label}: attribute {what!r} is {axis}, out of range for {shown} "
                        f"(valid: {lo}..{hi})")


def _check_per_axis(node: onnx.NodeProto, axis: int, shapes: dict, label: str) -> None:
    """A per-axis scale must have one entry per channel of that axis."""
    x, scale = shapes.get(node.input[0]), shapes.get(node.input[1]) if len(node.input) > 1 else None
    if x is None or scale is None or len(scale) != 1 or not x:
        return
    channels = x[axis]
    if channels is not None and scale[0] != channels and scale[0] != 1:
        raise TorqError(f"{label}: attribute 'axis' is {axis}: the scale has {scale[0]} entries but "
                        f"that axis has {channels}")


def _check_conv(node: onnx.NodeProto, attrs: dict, shapes: dict, label: str) -> None:
    group = attrs.get("group", 1)
    if not isinstance(group, int) or group < 1:
        raise TorqError(f"{label}: attribute 'group' is {group} (must be a positive integer)")
    w = shapes.get(node.input[_CONV_WEIGHT[node.op_type]]) if len(node.input) > _CONV_WEIGHT[node.op_type] else None
    x = shapes.get(node.input[0])
    if w is None:
        return
    if len(w) < 3 or any(d is not None and d < 1 for d in w):
        raise TorqError(f"{label}: weight shape {list(w)} is not (out channels, in channels/group, kernel...)")
    transpose = node.op_type == "ConvTranspose"
    out_c = w[1] * group if transpose else w[0]
    in_c = w[0] if transpose else w[1] * group
    if out_c is not None and out_c % group:
        raise TorqError(f"{label}: attribute 'group' {group} does not divide the {out_c} output channels")
    if x is not None and len(x) >= 2 and None not in (x[1], in_c) and x[1] != in_c:
        raise TorqError(f"{label}: attribute 'group' is {group}: the input has {x[1]} channels but "
                        f"the weight expects {in_c}")
    if x is not None and len(x) != len(w):
        raise TorqError(f"{label}: input rank {len(x)} does not match the weight rank {len(w)}")
    ks = attrs.get("kernel_shape")
    if ks is not None and list(ks) != list(w[2:]):
        raise TorqError(f"{label}: attribute 'kernel_shape' {list(ks)} does not match the weight's {list(w[2:])}")


def _check_window(node: onnx.NodeProto, attrs: dict, rank: int | None, label: str) -> None:
    """kernel_shape / strides / dilations / pads: lengths match the spatial rank, values in range."""
    ks = attrs.get("kernel_shape")
    spatial = len(ks) if ks is not None else (rank - 2 if rank is not None else None)
    if node.op_type in _POOLS and node.op_type != "MaxUnpool" and ks is None:
        raise TorqError(f"{label}: attribute 'kernel_shape' is missing")
    if spatial is not None and spatial < 1:
        raise TorqError(f"{label}: needs at least one spatial axis (input rank {rank})")
    for name, lo, n in (("kernel_shape", 1, spatial), ("strides", 1, spatial), ("dilations", 1, spatial),
                        ("pads", 0, None if spatial is None else 2 * spatial),
                        ("output_padding", 0, spatial)):
        vals = attrs.get(name)
        if vals is None:
            continue
        vals = list(vals)
        if n is not None and len(vals) != n:
            raise TorqError(f"{label}: attribute {name!r} has {len(vals)} values, expected {n}")
        bad = [v for v in vals if not lo <= v <= MAX_WINDOW]
        if bad:
            raise TorqError(f"{label}: attribute {name!r} has value {bad[0]} (must be {lo}..{MAX_WINDOW})")
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode(errors="replace") if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad not in _AUTO_PAD:
        raise TorqError(f"{label}: attribute 'auto_pad' is {auto_pad!r} (one of {', '.join(sorted(_AUTO_PAD))})")
    if auto_pad != "NOTSET" and any(attrs.get("pads", ())):
        raise TorqError(f"{label}: attribute 'auto_pad' is {auto_pad} and 'pads' is {list(attrs['pads'])}: "
                        "ONNX allows one or the other, not both")
