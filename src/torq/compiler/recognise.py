"""Recognise quantization semantics in `linalg_view` expression trees.

A generic's body, read as a tree (`linalg_view.Generic`), is matched against the shapes torch-mlir
emits for ONNX's quantize ops:

    DQ:  mulf(sitofp(subi(extsi(x), zp)), scale)                  x int  -> f32
    Q:   fptosi(min(max(addf(roundeven(divf(x, scale)), zp), lo), hi))  f32 -> int

plus binary/scalar elementwise ops and clamps (Relu/Clip left between an op and its Q).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .linalg_view import Arg, Generic, Node, _is_var, np_dtype


def squeeze_param(x, dtype):
    """A broadcast constant -> scalar when uniform, else the array kept broadcastable."""
    x = np.asarray(x, dtype=dtype)
    flat = x.ravel()
    if flat.size and np.all(flat == flat[0]):
        return dtype(flat[0])
    return x


def channel_vector(x, axis: int, n: int, dtype):
    """Per-channel values along `axis` from a broadcastable array (scalar -> repeated)."""
    x = np.asarray(x, dtype=dtype)
    if x.ndim == 0:
        return np.full(n, x, dtype=dtype)
    others = tuple(d for d in range(x.ndim) if d != axis)
    v = x
    for d in sorted(others, reverse=True):
        if v.shape[d] != 1:
            first = np.take(v, [0], axis=d)
            if not np.all(v == first):
                raise ValueError("parameter varies along a non-channel axis")
            v = first
    v = v.reshape(-1)
    return np.broadcast_to(v, (n,)).astype(dtype) if v.size in (1, n) else None


def _strip(node, *names):
    while isinstance(node, Node) and node.op in names:
        node = node.args[0]
    return node


@dataclass
class DQ:
    source_index: int   # generic input index of the integer tensor
    scale: object       # float32 scalar or broadcastable array
    zp: object          # int64 scalar or broadcastable array


def as_dequant(g: Generic) -> DQ | None:
    """x_int -> (x - zp) * scale (f32), per-tensor or per-channel."""
    if len(g.var_inputs) != 1 or not g.parallel:
        return None
    t = g.tree_or_none()
    if isinstance(t, Node) and t.op in ("arith.sitofp", "arith.uitofp"):
        t = Node("arith.mulf", (t, np.float32(1)))     # scale 1.0: MLIR folded the multiplication away
    if not (isinstance(t, Node) and t.op == "arith.mulf"):
        return None
    a, b = t.args
    if _is_var(b) and not _is_var(a):
        a, b = b, a
    if _is_var(b) or not (isinstance(a, Node) and a.op in ("arith.sitofp", "arith.uitofp")):
        return None
    inner = _strip(a.args[0], "arith.extsi", "arith.extui")
    zp = 0
    if isinstance(inner, Node) and inner.op == "arith.subi" and not _is_var(inner.args[1]):
        zp = inner.args[1]
        inner = _strip(inner.args[0], "arith.extsi", "arith.extui")
    if not isinstance(inner, Arg):
        return None
    return DQ(inner.index, squeeze_param(b, np.float32), squeeze_param(zp, np.int64))


@dataclass
class Q:
    source_index: int
    scale: object
    zp: object
    lo: int
    hi: int
    out_dtype: type


def as_quant(g: Generic) -> Q | None:
    """f32 -> clamp(roundeven(x / scale) + zp, lo, hi) as int."""
    if len(g.var_inputs) != 1 or not g.parallel:
        return None
    t = g.tree_or_none()
    if not (isinstance(t, Node) and t.op == "arith.fptosi"):
        return None
    x = t.args[0]
    bounds = []
    while isinstance(x, Node) and x.op in ("arith.minimumf", "arith.maximumf") and not _is_var(x.args[1]):
        bounds.append((x.op, float(np.asarray(x.args[1]).ravel()[0])))
        x = x.args[0]
    if not (isinstance(x, Node) and x.op == "arith.addf" and not _is_var(x.args[1])):
        return None
    zp = x.args[1]
    x = x.args[0]
    if not (isinstance(x, Node) and x.op == "math.roundeven"):
        return None
    x = x.args[0]
    if isinstance(x, Arg):
        x = Node("arith.divf", (x, np.float32(1)))      # scale 1.0: MLIR folded the division away
    if not (isinstance(x, Node) and x.op == "arith.divf" and not _is_var(x.args[1]) and isinstance(x.args[0], Arg)):
        return None
    lo = max((v for o, v in bounds if o == "arith.maximumf"), default=-np.inf)
    hi = min((v for o, v in bounds if o == "arith.minimumf"), default=np.inf)
    dt = np_dtype(g.op.results[0].type)
    info = np.iinfo(dt)
    lo = int(max(lo, info.min)) if np.isfinite(lo) else int(info.min)
    hi = int(min(hi, info.max)) if np.isfinite(hi) else int(info.max)
    return Q(x.args[0].index, squeeze_param(x.args[1], np.float32),
             squeeze_param(np.rint(np.asarray(zp, np.float64)), np.int64), lo, hi, dt)


def as_binary(g: Generic, opname: str):
    """Both inputs variable and the body is a single `opname` of the two block args."""
    if len(g.var_inputs) != 2 or not g.parallel:
        return None
    t = g.tree_or_none()
    if isinstance(t, Node) and t.op == opname and all(isinstance(a, Arg) for a in t.args):
        return t.args[0].index, t.args[1].index
    return None


def as_scalar_op(g: Generic, opname: str):
    """One variable input, body = opname(x, const) (e.g. divf by the pool window size)."""
    if len(g.var_inputs) != 1 or not g.parallel:
        return None
    t = g.tree_or_none()
    if isinstance(t, Node) and t.op == opname and isinstance(t.args[0], Arg) and not _is_var(t.args[1]):
        return t.args[0].index, t.args[1]
    return None


# arith.cmpf predicates (as printed integers): x > c keeps x -> max; x < c keeps x -> min
_CMP_MAX = {2, 3, 9, 10}     # ogt oge ugt uge
_CMP_MIN = {4, 5, 11, 12}    # olt ole ult ule


def _pred(node: Node) -> int | None:
    head = node.attr.split("|")[0].strip().split(":")[0].strip()
    return int(head) if head.lstrip("-").isdigit() else None


def as_clamp(g: Generic):
    """One-input elementwise generic computing min(max(x, lo), hi) in any of torch-mlir's spellings
    (maximumf/minimumf, select(cmpf(x, c), x, c) as Relu lowers, or select(cmpf(x, c), c, x) as
    a Clip with tensor bounds does) -> (lo, hi) floats, else None."""
    if len(g.var_inputs) != 1 or not g.parallel:
        return None
    lo, hi = -np.inf, np.inf
    t = g.tree_or_none()
    while not isinstance(t, Arg):
        if not isinstance(t, Node):
            return None
        if t.op in ("arith.maximumf", "arith.minimumf", "arith.maxnumf", "arith.minnumf"):
            x, c = t.args
            if _is_var(c):
                x, c = c, x
            kind = "max" if "max" in t.op else "min"
        elif t.op == "arith.select" and isinstance(t.args[0], Node) and t.args[0].op == "arith.cmpf":
            cmp, a, b = t.args
            p = _pred(cmp)
            ca, cb = cmp.args
            if not (_is_var(ca) and not _is_var(cb)):
                return None
            if a == ca and not _is_var(b) and np.array_equal(np.asarray(b), np.asarray(cb)):
                x, c = a, cb          # x > c ? x : c
                kind = "max" if p in _CMP_MAX else "min" if p in _CMP_MIN else None
            elif b == ca and not _is_var(a) and np.array_equal(np.asarray(a), np.asarray(cb)):
                x, c = b, cb          # x < c ? c : x
                kind = "max" if p in _CMP_MIN else "min" if p in _CMP_MAX else None
            else:
                return None
        else:
            return None
        c = np.asarray(c).ravel()
        if kind is None or c.size == 0 or not np.all(c == c[0]):
            return None
        if kind == "max":
            lo = max(lo, float(c[0]))
        else:
            hi = min(hi, float(c[0]))
        t = x
    return lo, hi
