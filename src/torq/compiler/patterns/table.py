"""Any elementwise function of one int8 tensor becomes a 256-entry lookup table (int8 or int16
out: an int8 -> int16 conversion at a mixed-precision boundary is one, exact).

    Q ∘ f ∘ DQ  (f: elementwise generics of one DQ'd value, e.g. Sigmoid,
                 HardSwish x·relu6(x+3)/6, GELU x·(1+erf(x/√2))/2, x+1, x·0.5)       -> torq_hl.table
    Q ∘ clamp ∘ DQ  (an unfused Relu/Clip, or a requantize)                  -> torq_hl.table
    Q ∘ DQ ∘ g  (g: int8 -> int8 elementwise, e.g. a lone Relu torch-mlir ran on the
                 int8 values as maxsi(x, zp))                                 -> torq_hl.table

The table is computed by evaluating the module's own linalg generics (DQ, f, Q) on all 256
int8 inputs, so it holds exactly what the float reference chain computes. When f has
per-channel constants (a standalone BatchNormalization, e.g. after a Concat in DenseNet) the
op holds one 256-entry table per channel (axis 1), C·256 entries channel-major.
"""
from __future__ import annotations

import numpy as np

from .. import linalg_view as L
from .. import recognise as R
from .common import Ctx, Root, emit


def _same_params(dq, root) -> bool:
    d = R.as_dequant(dq)
    return np.ndim(d.scale) == 0 and d.scale == root.q.scale and d.zp == root.q.zp


def _pointwise(ctx: Ctx, value):
    """The one-input, same-shape elementwise generic producing `value` (scalar constants only)."""
    op = L.producer(value)
    g = ctx.generic(op)
    if g is None or len(g.var_inputs) != 1 or not g.parallel:
        return None
    if any(np.size(c) != 1 for c in g.consts.values()):
        return None  # per-position constants: not a pure function of the value
    if L.shape_of(g.inputs[g.var_inputs[0]]) != L.shape_of(op.results[0]):
        return None
    return g


def _elementwise_input(g, i, shape) -> bool:
    """Input i of generic g is read element for element (same shape, same map as the output)."""
    return L.shape_of(g.inputs[i]) == shape and str(g.maps[i]) == str(g.maps[-1])


def _per_channel_const(g, i, shape) -> bool:
    """Constant input i is a scalar, or varies along the channel axis (1) only."""
    c = g.in_iteration_space(i, g.consts[i])
    return all(n == 1 for d, n in enumerate(c.shape) if d != 1) and (c.ndim < 2 or c.shape[1] in (1, shape[1]))


def _dag(ctx: Ctx, value):
    """The elementwise generics computing `value` from one per-tensor DQ, e.g. HardSwish's
    x·hardsigmoid(x), GELU's x·(erf(x/√2)+1)/2 or a standalone BatchNormalization: (dq generic,
    [f generics, operands first], int8 source) or None. Constants are scalars or per-channel
    (per-position ones are no function of x and the channel)."""
    shape = L.shape_of(value)
    order, seen, leaves = [], set(), []

    def visit(v) -> bool:
        op = L.producer(v)
        g = ctx.generic(op)
        if g is None or not g.parallel or not g.var_inputs or L.shape_of(op.results[0]) != shape:
            return False
        if L.id_of(op) in seen:
            return True
        seen.add(L.id_of(op))
        d = R.as_dequant(g)
        if d is not None and np.size(d.scale) == 1 and np.size(d.zp) == 1:
            leaves.append(g)
            return _elementwise_input(g, d.source_index, shape)
        if not all(_per_channel_const(g, i, shape) for i in g.consts):
            return False
        if not all(_elementwise_input(g, i, shape) and visit(g.inputs[i]) for i in g.var_inputs):
            return False
        order.append(g)
        return True

    if not visit(value) or len(leaves) != 1:
        return None
    return leaves[0], order, leaves[0].inputs[R.as_dequant(leaves[0]).source_index]


def _int8_pre_ops(ctx: Ctx, value):
    """int8 -> int8 elementwise generics feeding a DQ (folded into the table); (source, [generics])."""
    pre = []
    while L.np_dtype(value.type) is np.int8:
        g = _pointwise(ctx, value)
        if g is None or R.as_dequant(g) is not None \
                or L.np_dtype(g.inputs[g.var_inputs[0]].type) is not np.int8:
            break
        pre.append(g)
        value = g.inputs[g.var_inputs[0]]
    return value, pre[::-1]


_BN_BODY = ("arith.subf", "arith.mulf", "arith.mulf", "arith.addf")   # (x - mean)·inv_std·scale + bias


def _batchnorm(ctx: Ctx, fs):
    """fs as torch-mlir spells an inference BatchNormalization -> [(op, per-channel constant)]
    in the order mean, inv_std, scale, bias; else None."""
    if len(fs) != 4 or ctx.onnx_op(fs[-1].op) != "BatchNormalization":
        return None
    out = []
    for g, body in zip(fs, _BN_BODY):
        t = g.tree_or_none()
        if not (isinstance(t, L.Node) and t.op == body and len(g.consts) == 1 and isinstance(t.args[0], L.Arg)):
            return None
        (i, c), = g.consts.items()
        out.append(g.in_iteration_space(i, c))
    return out


def _ort_batchnorm(dq_values, consts):
    """ONNX Runtime's float BatchNormalization: x·s + (bias − mean·s), s = inv_std·scale, in
    float32 without fused multiply-add (bit-identical to its CPU kernel)."""
    mean, inv_std, scale, bias = consts
    s = (inv_std * scale).astype(np.float32)
    return (dq_values * s).astype(np.float32) + (bias - mean * s).astype(np.float32)


def _dag_table(pre, dq, fs, tail, batchnorm=None) -> np.ndarray:
    """tail ∘ fs ∘ dq ∘ pre on every int8 value (fs a DAG, pre and tail chains): 256 entries, or
    C·256 (one table per channel, channel-major) when a constant is per-channel."""
    rank = len(dq.out_shape)
    channels = max([1] + [g.in_iteration_space(i, c).shape[1] for g in fs for i, c in g.consts.items()
                          if rank >= 2])
    shape = (256, channels) + (1,) * (rank - 2) if rank >= 2 else (256,)
    y = np.arange(-128, 128, dtype=np.int8).reshape((256,) + (1,) * (rank - 1))
    for g in pre:
        y = g.evaluate({g.var_inputs[0]: y}, y.shape)
    vals = {L.id_of(dq.op): dq.evaluate({dq.var_inputs[0]: y}, y.shape)}
    if batchnorm is not None:   # the reference runs ORT's own BN kernel, not torch-mlir's decomposition
        vals[L.id_of(fs[-1].op)] = _ort_batchnorm(vals[L.id_of(dq.op)], batchnorm)
        fs = fs[-1:]
    else:
        for g in fs:
            args = {i: vals[L.id_of(L.producer(g.inputs[i]))] for i in g.var_inputs}
            vals[L.id_of(g.op)] = g.evaluate(args, shape)
    y = np.broadcast_to(vals[L.id_of(fs[-1].op)] if fs else vals[L.id_of(dq.op)], shape)
    for g in tail:
        y = g.evaluate({g.var_inputs[0]: y}, shape)
    return np.asarray(y).reshape(256, -1).T.reshape(-1).astype(np.int64)


class QTable:
    """Q ∘ f ∘ DQ -> torq_hl.table"""

    def match(self, ctx: Ctx, root: Root):
        found = _dag(ctx, root.value)
        if found is None:
            return None
        dq, fs, x = found
        x, pre = _int8_pre_ops(ctx, x)
        clamps = [ctx.generic(c) for c in reversed(root.clamps)]   # the clamps folded into Q, in order
        if not fs and not clamps and not pre and _same_params(dq, root):
            return None
        if L.np_dtype(x.type) is not np.int8 or root.q.out_dtype not in (np.int8, np.int16) or np.ndim(root.q.scale):
            return ctx.fail((fs[0] if fs else dq).op, "table lookup needs int8 input and int8 / int16 output")
        return pre, dq, fs, clamps, x

    def rewrite(self, ctx: Ctx, root: Root, m):
        pre, dq, fs, clamps, x = m
        table = _dag_table(pre, dq, fs, [*clamps, ctx.generic(root.op)], _batchnorm(ctx, fs))
        return emit("table", root, [x], dict(table=table), (fs[-1] if fs else dq).op)


RULES = [QTable()]
