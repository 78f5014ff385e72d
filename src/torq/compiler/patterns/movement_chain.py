"""A chain of data movement between a dequantize and a quantize moves the int8 data itself.

    Q ∘ m_k ∘ … ∘ m_1 ∘ DQ   -> m_k ∘ … ∘ m_1                  (same qparams)
    Q ∘ m_k ∘ … ∘ m_1 ∘ DQ   -> table(Q ∘ DQ) ∘ m_k ∘ … ∘ m_1   (other qparams: ORT's float
                                                                DQ → move → Q, element by element)
    m_i ∈ {extract_slice, collapse_shape, expand_shape, transpose}

A Gather at a constant index arrives as Slice + Squeeze (`graph/shapes.py`), i.e. extract_slice
then collapse_shape; the single-op cases are `data_movement.py`'s (tried first). Moving values
never changes them, so the requantize (a 256-entry table evaluated from the module's own DQ and
Q generics) can run after the moves, on the moved (smaller or equal) tensor.
"""
from __future__ import annotations

import numpy as np

from .. import linalg_view as L
from .common import Ctx, Root, emit, lookup_table

MOVES = ("tensor.extract_slice", "tensor.collapse_shape", "tensor.expand_shape", "linalg.transpose")


class QMovementChain:
    """Q ∘ (extract_slice | collapse | expand | transpose)+ ∘ DQ -> the same moves on int8"""

    def match(self, ctx: Ctx, root: Root):
        chain, value = [], root.value
        while (op := L.producer(value)) is not None and op.name in MOVES and _static(op):
            chain.append(op)
            value = op.operands[0]
        if not chain:
            return None
        dq = ctx.dequant(value)
        if dq is None:
            return ctx.fail(chain[0], "moved data is not dequantized from an integer tensor")
        x, xs, xz = dq
        dt = L.np_dtype(x.type)
        if np.ndim(xs) or np.ndim(xz) or np.ndim(root.q.scale) or dt not in (np.int8, np.int16) \
                or root.q.out_dtype is not dt:
            return ctx.fail(chain[0], "moved data is not per-tensor int8 / int16")
        info = np.iinfo(dt)
        same = xs == root.q.scale and xz == root.q.zp and (root.q.lo, root.q.hi) == (info.min, info.max)
        if not same and dt is np.int16:
            return ctx.fail(chain[0], "int16 data movement that requantizes is not lowered")
        return list(reversed(chain)), x, None if same else ctx.generic(L.producer(value))

    def rewrite(self, ctx: Ctx, root: Root, m):
        from torch_mlir import ir
        chain, x, dq_generic = m
        ip = ir.InsertionPoint(root.op)
        for op in chain:
            x = _moved(op, x, ip)
        if dq_generic is None:
            return L.producer(x)
        return emit("table", root, [x], dict(table=lookup_table(dq_generic, ctx.generic(root.op))), chain[-1])


def _static(op) -> bool:
    """Only static slices (no SSA offsets/sizes/strides) move as program steps."""
    return op.name != "tensor.extract_slice" or len(op.operands) == 1


def _moved(op, x, ip):
    """`op` re-created on the int8 value `x` (same attributes, int8 result)."""
    from torch_mlir import ir
    from torch_mlir.dialects import linalg

    from .common import empty
    rtype = ir.RankedTensorType.get(list(L.shape_of(op.results[0])), ir.RankedTensorType(x.type).element_type)
    if op.name == "linalg.transpose":
        init = empty(rtype, op.location, ip)
        with op.location, ip:
            t = linalg.transpose(x, outs=[init], permutation=L.attr_ints(op, "permutation"))
        return t if isinstance(t, ir.Value) else t.results[0]
    attrs = {k: op.attributes[k] for k in op.attributes}
    return ir.Operation.create(op.name, results=[rtype], operands=[x], attributes=attrs,
                               loc=op.location, ip=ip).results[0]


RULES = [QMovementChain()]
