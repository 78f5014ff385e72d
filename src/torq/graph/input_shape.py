"""Graph-input sizes: what ``--input-shape NAME=D0,D1,...`` fixes, and the one error for a size
still unknown where one is needed.

Exports leave dims open: a symbolic batch ``N`` (torch), ``-1`` on every axis (Paddle), a symbolic
``H``/``W``. The NPU program has static shapes, and calibration, verification and per-layer tests
feed concrete tensors. Axis 0 is the batch: left open, it is 1 (a larger batch runs one sample at
a time). Any other open dim has no size we could guess — a 1 there would turn a 48x192 image into
1x1 and fail far away — so it is an error naming the input, the axis and the flag that sets it.
"""
from __future__ import annotations

import onnx

from ..errors import TorqError, quote

__all__ = ["parse_input_shape", "set_input_shapes", "static_dims", "static_shapes", "specialise"]

FLAG = "--input-shape"


def parse_input_shape(text: str) -> str:
    """``NAME=D0,D1,...`` (or ``D0,D1,...`` for a model with one input), normalised; one-line error."""
    name, sep, dims = str(text).strip().rpartition("=")
    name = name.strip()
    parts = [p.strip() for p in dims.replace("x", ",").split(",")]
    if (sep and not name) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise TorqError(f"{FLAG} {text!r}: expected NAME=D0,D1,... with positive sizes (e.g. "
                        f"{FLAG} x=1,3,224,224; the name may be left out when the model has one input)")
    return f"{name}={','.join(str(int(p)) for p in parts)}" if sep else ",".join(str(int(p)) for p in parts)


def _graph_inputs(model: onnx.ModelProto) -> list:
    inits = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits and v.type.HasField("tensor_type")]


def _open(d) -> bool:
    return not d.HasField("dim_value") or d.dim_value <= 0


def _sizes(model: onnx.ModelProto, shapes, where: str) -> dict[str, list[int]]:
    """{input name: dims} from normalised ``--input-shape`` values, checked against the model."""
    inputs = {v.name: v for v in _graph_inputs(model)}
    out = {}
    for text in shapes:
        name, sep, dims = parse_input_shape(text).rpartition("=")
        if not sep:
            if len(inputs) != 1:
                raise TorqError(f"{where}: {FLAG} {text}: the model has {len(inputs)} inputs "
                                f"({', '.join(map(quote, inputs))}): say which, NAME=D0,D1,...")
            name = next(iter(inputs))
        if name not in inputs:
            raise TorqError(f"{where}: {FLAG} {text}: no graph input {quote(name)}; the inputs are "
                            f"{', '.join(map(quote, inputs))}")
        sizes = [int(p) for p in dims.split(",")]
        have = inputs[name].type.tensor_type.shape.dim
        if len(have) != len(sizes):
            raise TorqError(f"{where}: {FLAG} {text}: input {quote(name)} has rank {len(have)}, not {len(sizes)}")
        for k, (d, s) in enumerate(zip(have, sizes)):
            if not _open(d) and d.dim_value != s:
                raise TorqError(f"{where}: {FLAG} {text}: axis {k} of input {quote(name)} is {d.dim_value} "
                                f"in the model, not {s} (only open dims can be given)")
        out[name] = sizes
    return out


def set_input_shapes(model: onnx.ModelProto, shapes, where: str = "model") -> onnx.ModelProto:
    """A copy of ``model`` with the given inputs' open dims set (``shapes``: ``--input-shape``
    values, or {name: dims}); the outputs' dims of the same symbols follow (their -1 dims become
    unknown), and value_info with open dims is dropped so shape inference re-derives it. ``model`` itself when nothing changes."""
    sizes = shapes if isinstance(shapes, dict) else _sizes(model, shapes, where)
    changes = {(v.name, k): s for v in _graph_inputs(model) for k, (d, s)
               in enumerate(zip(v.type.tensor_type.shape.dim, sizes.get(v.name, ()))) if _open(d)}
    if not changes:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    symbols = {}
    for v in _graph_inputs(out):
        for k, d in enumerate(v.type.tensor_type.shape.dim):
            if (v.name, k) in changes:
                if d.dim_param:
                    symbols[d.dim_param] = changes[v.name, k]
                d.Clear()
                d.dim_value = changes[v.name, k]
    for v in out.graph.output:
        for d in v.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in symbols:
                value = symbols[d.dim_param]
                d.Clear()
                d.dim_value = value
            elif d.HasField("dim_value") and d.dim_value <= 0:
                d.Clear()           # Paddle's -1: unknown, for shape inference to fill
    keep = [v for v in out.graph.value_info if not any(_open(d) for d in v.type.tensor_type.shape.dim)]
    del out.graph.value_info[:]
    out.graph.value_info.extend(keep)
    return out


def static_dims(name: str, dims, where: str = "model") -> list[int]:
    """Concrete sizes for one input's ``dims`` (ints, None/<=0 or a symbol for open): an open
    batch (axis 0) is 1; any other open dim is the one-line error saying how to give it."""
    for k, d in enumerate(dims):
        if k > 0 and not (isinstance(d, int) and d > 0):
            shown = ",".join(str(x) if isinstance(x, int) and x > 0 else ("1" if i == 0 else f"D{i}")
                             for i, x in enumerate(dims))
            what = f"'{d}'" if isinstance(d, str) and d else "-1" if d == -1 else "unknown"
            raise TorqError(f"{where}: graph input {quote(name)} has no size at axis {k} (dim {what}): give the "
                            f"size you deploy with, {FLAG} {name}={shown}")
    return [d if isinstance(d, int) and d > 0 else 1 for d in dims]


def _dims(v) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in v.type.tensor_type.shape.dim]


def static_shapes(model: onnx.ModelProto, where: str = "model") -> dict[str, list[int]]:
    """{input name: concrete dims} (``static_dims`` of each graph input)."""
    return {v.name: static_dims(v.name, _dims(v), where) for v in _graph_inputs(model)}


def specialise(model: onnx.ModelProto, where: str = "model") -> onnx.ModelProto:
    """``model`` with every input static: open batch dims 1, other open dims refused (``static_dims``)."""
    return set_input_shapes(model, static_shapes(model, where))
