"""Any elementwise function of one int8 tensor becomes a 256-entry lookup table.

    Q ∘ f ∘ DQ  (f: a chain of one-input elementwise generics, e.g. Sigmoid) -> torq_hl.table
    Q ∘ clamp ∘ DQ  (an unfused Relu/Clip, or a requantize)                  -> torq_hl.table
    Q ∘ DQ ∘ g  (g: int8 -> int8 elementwise, e.g. a lone Relu torch-mlir ran on the
                 int8 values as maxsi(x, zp))                                 -> torq_hl.table

The table is computed by evaluating the module's own linalg generics (DQ, f, Q) on all 256
int8 inputs, so it holds exactly what the float reference chain computes.
"""
from __future__ import annotations

import numpy as np

from .. import linalg_view as L
from .common import Ctx, Root, emit, lookup_table


def _same_params(dq, root) -> bool:
    d = L.as_dequant(dq)
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


def _chain(ctx: Ctx, value):
    """Generics from a DQ up to `value`; (dq_generic, [f generics], int8 source, [int8 pre-ops]) or None."""
    chain = []
    while True:
        g = _pointwise(ctx, value)
        if g is None:
            return None
        d = L.as_dequant(g)
        if d is not None and np.size(d.scale) == 1 and np.size(d.zp) == 1:
            return (g, chain[::-1]) + _int8_pre_ops(ctx, g.inputs[d.source_index])
        chain.append(g)
        value = g.inputs[g.var_inputs[0]]


def _int8_pre_ops(ctx: Ctx, value):
    """int8 -> int8 elementwise generics feeding a DQ (folded into the table); (source, [generics])."""
    pre = []
    while L.np_dtype(value.type) is np.int8:
        g = _pointwise(ctx, value)
        if g is None or L.as_dequant(g) is not None \
                or L.np_dtype(g.inputs[g.var_inputs[0]].type) is not np.int8:
            break
        pre.append(g)
        value = g.inputs[g.var_inputs[0]]
    return value, pre[::-1]


class QTable:
    """Q ∘ f ∘ DQ -> torq_hl.table"""

    def match(self, ctx: Ctx, root: Root):
        found = _chain(ctx, root.value)
        if found is None:
            return None
        dq, fs, x, pre = found
        fs = fs + [ctx.generic(c) for c in reversed(root.clamps)]   # the clamps folded into Q, in order
        if not fs and not pre and _same_params(dq, root):
            return None
        if L.np_dtype(x.type) is not np.int8 or root.q.out_dtype is not np.int8 or np.ndim(root.q.scale):
            return ctx.fail((fs[0] if fs else dq).op, "table lookup needs int8 input and output")
        return dq, fs, x, pre

    def rewrite(self, ctx: Ctx, root: Root, m):
        dq, fs, x, pre = m
        table = lookup_table(*pre, dq, *fs, ctx.generic(root.op))
        return emit("table", root, [x], dict(table=table), (fs[-1] if fs else dq).op)


RULES = [QTable()]
