"""Conversions between quantizations of an int16 tensor (mixed precision, A16W8).

    Q ∘ DQ  (int16 source)  -> torq_hl.rescale   (the ACT alone: clamp(round((x − zx)·m / 2**s) + zy))
    Q ∘ DQ  (same type, scale, zero point, full range) -> x   (a no-op round trip: ORT's QDQ graph
                                                       leaves one where a Relu it kept folded away)

An int8 source takes the table rule instead (``table.py``: 256 entries of the Q ∘ DQ chain
itself, int8 or int16 out, exact). The rescale's multiplier and rounding are chosen by
``numerics.requant_rescale`` on all 65,536 inputs against ORT's float recipe.
"""
from __future__ import annotations

import numpy as np

from ... import numerics
from .. import linalg_view as L
from .common import Ctx, Root, activation_dtype, emit, scalar


class QRescale:
    """Q ∘ DQ (int16 input) -> torq_hl.rescale"""

    def match(self, ctx: Ctx, root: Root):
        dq = ctx.dequant(root.value)
        if dq is None:
            return None
        x, xs, xz = dq
        if L.np_dtype(x.type) is not np.int16:
            return None
        if np.ndim(xs) or np.ndim(xz) or np.ndim(root.q.scale) or not activation_dtype(root.q.out_dtype):
            return ctx.fail(L.producer(root.value), "int16 conversion needs per-tensor int8 / int16 quantization")
        return x, float(scalar(xs, "input scale")), int(scalar(xz, "input zero point"))

    def rewrite(self, ctx: Ctx, root: Root, m):
        x, xs, xz = m
        ys, zy = float(root.q.scale), int(root.q.zp)
        mult, shift, even = numerics.requant_rescale(xs, xz, ys, zy, root.q.lo, root.q.hi)
        attrs = dict(input_zp=xz, output_zp=zy, output_min=root.q.lo, output_max=root.q.hi, shift_factor=shift,
                     multiplier=mult, round_ties_even=int(even), ort_input_scale=[xs], ort_output_scale=[ys])
        return emit("rescale", root, [x], attrs, L.producer(root.value))


class QIdentity:
    """Q ∘ DQ with the same quantization -> the integer tensor itself (a tensor.cast no-op)"""

    def match(self, ctx: Ctx, root: Root):
        dq = ctx.dequant(root.value)
        if dq is None:
            return None
        x, xs, xz = dq
        dt = L.np_dtype(x.type)
        if dt is not root.q.out_dtype or not activation_dtype(dt) or np.ndim(xs) or np.ndim(xz) \
                or np.ndim(root.q.scale) or np.ndim(root.q.zp):
            return None
        info = np.iinfo(dt)
        same = xs == root.q.scale and xz == root.q.zp and (root.q.lo, root.q.hi) == (info.min, info.max)
        return x if same else None

    def rewrite(self, ctx: Ctx, root: Root, x):
        from torch_mlir import ir
        return ir.Operation.create("tensor.cast", results=[root.op.results[0].type], operands=[x],
                                   loc=root.op.location, ip=ir.InsertionPoint(root.op))


RULES = [QIdentity(), QRescale()]
