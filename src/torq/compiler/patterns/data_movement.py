"""Reshapes between a dequantize and a quantize with the same parameters move int8 data as is.

    Q ∘ collapse_shape ∘ DQ  -> collapse_shape   (Flatten, Reshape)
    Q ∘ expand_shape ∘ DQ    -> expand_shape
"""
from __future__ import annotations

import numpy as np

from .. import linalg_view as L
from .common import Ctx, Root

_MOVES = ("tensor.collapse_shape", "tensor.expand_shape")


class QReshape:
    """Q ∘ reshape ∘ DQ -> reshape (on the integer tensor)"""

    def match(self, ctx: Ctx, root: Root):
        op = L.producer(root.value)
        if op is None or op.name not in _MOVES:
            return None
        dq = ctx.dequant(op.operands[0])
        if dq is None:
            return ctx.fail(op, "reshape input is not dequantized from an integer tensor")
        x, xs, xz = dq
        if not (np.all(np.asarray(xs) == root.q.scale) and np.all(np.asarray(xz) == root.q.zp)) \
                or L.np_dtype(x.type) is not root.q.out_dtype:
            return ctx.fail(op, "reshape changes the quantization")
        return op, x

    def rewrite(self, ctx: Ctx, root: Root, m):
        from torch_mlir import ir
        op, x = m
        attrs = {k: op.attributes[k] for k in op.attributes}
        operands = [x] + list(op.operands)[1:]
        return ir.Operation.create(op.name, results=[root.op.results[0].type], operands=operands,
                                   attributes=attrs, loc=op.location, ip=ir.InsertionPoint(root.op))


RULES = [QReshape()]
