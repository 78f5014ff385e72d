"""NSS kernels of the bf16 / f32 torq_hl ops (bf16 models): ``make(step, rtype) -> fn(args, rounding)``.

The arithmetic is numerics.bf16_arith's, one model for both rounding modes (there is no ORT
recipe to imitate: ONNX Runtime runs the model's fp32 twin). Contractions and sums are the
reference loops of ``kernels/float_gemm.py`` (the native engine runs conv / depthwise /
fully_connected / matmul as compiled kernels instead: runtime/native/float_ops.py, the same
bits); elementwise bodies run node by node, each node rounded to its type. A one-input bf16 body is looked up in a table of its 65536 results (computed by
the same nodes), which is the same function, faster.
"""
from __future__ import annotations

import numpy as np

from .. import numerics
from ..errors import TorqError
from .kernels import float_gemm as G
from .ops import _cached_plan

_B = numerics.bf16_arith
FLOAT_TYPES = ("bf16", "f32")


def _clamp(a):
    return _B.clamp_bits(a["output_min"]), _B.clamp_bits(a["output_max"])


def _conv(st, rtype):
    a = st.attrs
    lo, hi = _clamp(a)
    groups = int(a["groups"])

    def fn(args, rounding):
        w, bias, x = args
        g = w.shape[0] if st.op.endswith("depthwise_conv2d") else groups
        acc = G.conv_acc(x, w, a["pad"], a["stride"], a["dilation"], g)
        return _B.finish(acc, np.asarray(bias, np.float32)[None, :, None, None], lo, hi, st.dtype).reshape(st.shape)
    return fn


def _fc(st, rtype):
    lo, hi = _clamp(st.attrs)

    def fn(args, rounding):
        w, bias, x = args
        acc = G.matmul_acc(x.reshape(-1, x.shape[-1]), np.asarray(w).T)
        return _B.finish(acc, np.asarray(bias, np.float32)[None, :], lo, hi, st.dtype).reshape(st.shape)
    return fn


def _matmul(st, rtype):
    lo, hi = _clamp(st.attrs)

    def fn(args, rounding):
        return _B.finish(G.matmul_acc(*args), np.float32(0), lo, hi, st.dtype).reshape(st.shape)
    return fn


def _avgpool(st, rtype):
    a = st.attrs
    kernel, stride, pad = list(a["kernel"]), list(a["stride"]), list(a["pad"])

    def fn(args, rounding):
        (x,) = args
        acc = G.window_acc(x, kernel, stride, pad)
        counts = _counts(x.shape[2:], kernel, stride, pad, bool(a["count_include_pad"]))
        with np.errstate(all="ignore"):
            y = acc / counts
        return _B.round_to(y, st.dtype).reshape(st.shape)
    return fn


def _counts(hw, kernel, stride, pad, include: bool) -> np.ndarray:
    axes = []
    for size, k, s, lo, hi in ((hw[0], kernel[0], stride[0], pad[2], pad[3]),
                               (hw[1], kernel[1], stride[1], pad[0], pad[1])):
        n_out = (size + lo + hi - k) // s + 1
        start = np.arange(n_out) * s - lo
        axes.append(np.full(n_out, k) if include else np.minimum(start + k, size) - np.maximum(start, 0))
    return np.outer(axes[0], axes[1]).astype(np.float32)


def _reduce(st, rtype):
    a = st.attrs
    dims = tuple(int(d) for d in a["dims"])
    if a["mode"] == "max":
        return lambda args, r: _B.round_to(np.max(args[0], axis=dims), st.dtype).reshape(st.shape)
    if a["mode"] not in ("sum", "mean"):
        raise TorqError(f"torq_hl.reduce mode {a['mode']!r} on floats is not simulated")
    mean = a["mode"] == "mean"

    def fn(args, rounding):
        x = args[0]
        acc = G.axis_acc(x, dims)
        if mean:
            with np.errstate(all="ignore"):
                acc = acc / np.float32(np.prod([x.shape[d] for d in dims]))
        return _B.round_to(acc, st.dtype).reshape(st.shape)
    return fn


# ----------------------------------------------------------------------------- elementwise

def parse_body(text: str) -> tuple[dict, list]:
    """``"a0:bf16 a1:f32; %0 = exp bf16 a0; ..."`` -> ({operand: type}, [(op, type, args)])."""
    parts = [p.strip() for p in text.split(";") if p.strip()]
    types = dict(t.split(":") for t in parts[0].split()) if parts and "=" not in parts[0] else {}
    nodes = []
    for p in parts[1 if types else 0:]:
        _, rhs = p.split("=", 1)
        op, elem, *args = rhs.split()
        nodes.append((op, elem, args))
    return types, nodes


_CMP = {"oeq": np.equal, "ogt": np.greater, "oge": np.greater_equal, "olt": np.less, "ole": np.less_equal,
        "one": np.not_equal, "eq": np.equal, "ne": np.not_equal, "slt": np.less, "sle": np.less_equal,
        "sgt": np.greater, "sge": np.greater_equal}
_INT = {"iadd": np.add, "isub": np.subtract, "imul": np.multiply, "imax": np.maximum, "imin": np.minimum}


def _node(op, elem, vals):
    if op in _B.UNARY or op == "sigmoid":
        return _B.unary(op, vals[0], elem)
    if op in _B.BINARY:
        return _B.binary(op, vals[0], vals[1], elem)
    if op == "cast":
        x = np.asarray(vals[0])
        if elem in ("bf16", "f32"):
            return _B.round_to(x.astype(np.float32), elem)
        return (np.trunc(x) if x.dtype.kind == "f" else x).astype(np.int64 if elem in ("i64", "index") else
                                                                     numerics_int(elem))
    if op.startswith("cmp."):
        pred = op[4:]
        if pred.startswith("u"):          # unordered: true when either side is NaN
            return _CMP["o" + pred[1:]](vals[0], vals[1]) | np.isnan(vals[0]) | np.isnan(vals[1])
        return _CMP[pred](vals[0], vals[1])
    if op == "select":
        return np.where(vals[0], vals[1], vals[2])
    if op in _INT:
        return _INT[op](vals[0], vals[1])
    if op == "idiv":
        return (np.trunc(np.asarray(vals[0], np.float64) / np.asarray(vals[1], np.float64))).astype(np.int64)
    raise TorqError(f"torq_hl.elementwise node {op!r} is not simulated")


def numerics_int(elem: str):
    return {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32}[elem]


def lay(x, spec: list[int], n: int) -> np.ndarray:
    """An operand laid on the n-dim iteration space by its map ([dim per axis], -1 = size-1 axis)."""
    x = np.asarray(x)
    keep = [k for k, d in enumerate(spec) if d >= 0]
    x = x.reshape([x.shape[k] for k in keep])
    dims = [spec[k] for k in keep]
    order = sorted(range(len(dims)), key=lambda k: dims[k])
    x = np.transpose(x, order)
    shape = [1] * n
    for k, d in enumerate(sorted(dims)):
        shape[d] = x.shape[k]
    return x.reshape(shape)


def _run_nodes(nodes, env):
    for k, (op, elem, refs) in enumerate(nodes):
        env[f"%{k}"] = _node(op, elem, [env[r] for r in refs])
    return env[f"%{len(nodes) - 1}"]


def elementwise_parts(st):
    """(operand types, nodes, constants, operand maps) of a torq_hl.elementwise step."""
    a = st.attrs
    types, nodes = parse_body(a["body"])
    consts = {f"c{j}": np.float32(c) for j, c in enumerate(a["constants"])}
    maps, pos, specs = list(a["maps"]), 0, []
    while pos < len(maps):
        specs.append([int(d) for d in maps[pos + 1:pos + 1 + maps[pos]]])
        pos += 1 + maps[pos]
    return types, nodes, consts, specs


def bf16_table(st, rtype):
    """A one-input bf16 body's 65536 results (computed by its nodes), or None for other bodies."""
    types, nodes, consts, _ = elementwise_parts(st)
    if list(types) != ["a0"] or types["a0"] != "bf16" or any(r.startswith("i") for _, _, refs in nodes for r in refs):
        return None
    grid = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    return np.asarray(_run_nodes(nodes, {"a0": grid, **consts})).astype(rtype)


def _elementwise(st, rtype):
    types, nodes, consts, specs = elementwise_parts(st)
    n, shape = len(st.shape), tuple(st.shape)

    def evaluate(args, rounding=None):
        env = {f"a{i}": lay(x, specs[i], n) for i, x in enumerate(args)}
        for d in range(n):
            env[f"i{d}"] = np.arange(shape[d], dtype=np.int64).reshape([-1 if k == d else 1 for k in range(n)])
        env.update(consts)
        return np.broadcast_to(_run_nodes(nodes, env), shape).astype(rtype)

    table = bf16_table(st, rtype) if int(np.prod(shape)) >= 4096 else None
    if table is not None:
        def lookup(args, rounding=None):
            x = lay(args[0], specs[0], n)
            idx = np.ascontiguousarray(x, np.float32).view(np.uint32) >> 16
            return np.broadcast_to(table[idx], shape).astype(rtype, copy=False)
        return lookup
    return evaluate


FLOAT_OPS = {"conv2d": _conv, "depthwise_conv2d": _conv, "fully_connected": _fc, "matmul": _matmul,
             "avg_pool2d": _avgpool, "reduce": _reduce, "elementwise": _elementwise}


def is_float_step(st) -> bool:
    """A step this module runs: torq_hl.elementwise, or a float-typed op of FLOAT_OPS."""
    name = st.op[8:] if st.op.startswith("torq_hl.") else None
    return name == "elementwise" or (name in FLOAT_OPS and st.dtype in FLOAT_TYPES)
