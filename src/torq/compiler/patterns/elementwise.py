"""Quantized binary elementwise ops.

    Q ∘ addf(DQ(a), DQ(b)) -> torq_hl.add

NPU form: t = (a - zp_a)·m_a + (b - zp_b)·m_b, one shared shift, NTP rounding (fixed_point.add_*).
The reference compiler uses int16 multipliers; we keep int32 ones so the NPU result stays within
rounding ties of ONNX Runtime's QLinearAdd.
"""
from __future__ import annotations

import numpy as np

from .. import fixed_point
from .. import linalg_view as L
from .common import Ctx, Root, emit, scalar


def _broadcastable(a, b, out):
    try:
        return np.broadcast_shapes(a, b) == tuple(out)
    except ValueError:
        return False


class QAdd:
    """Q ∘ addf(DQ(a), DQ(b)) -> torq_hl.add"""

    def match(self, ctx: Ctx, root: Root):
        op = L.producer(root.value)
        g = ctx.generic(op)
        if g is None:
            return None
        pair = L.as_binary(g, "arith.addf")
        if pair is None:
            return None
        da, db = ctx.dequant(g.inputs[pair[0]]), ctx.dequant(g.inputs[pair[1]])
        if da is None or db is None:
            return ctx.fail(op, "an Add input is not dequantized from an integer tensor")
        try:
            params = [scalar(da[1], "scale"), scalar(da[2], "zero point"),
                      scalar(db[1], "scale"), scalar(db[2], "zero point")]
        except ValueError as e:
            return ctx.fail(op, f"Add input {e}")
        if not _broadcastable(L.shape_of(da[0]), L.shape_of(db[0]), L.shape_of(root.op.results[0])):
            return ctx.fail(op, "Add operands are not numpy-broadcastable to the output")
        if np.ndim(root.q.scale) or root.q.out_dtype is not np.int8:
            return ctx.fail(op, "output quantization is not per-tensor int8")
        return (op, da[0], db[0], params)

    def rewrite(self, ctx: Ctx, root: Root, m):
        op, a, b, (sa, za, sb, zb) = m
        sc = float(root.q.scale)
        ma, mb, shift = fixed_point.add_multipliers(sa, sb, sc)
        attrs = dict(input_zp=0, output_zp=int(root.q.zp), output_min=root.q.lo, output_max=root.q.hi,
                     shift_factor=shift, weights=[ma, mb], scale_bias=[-(za * ma + zb * mb), 1],
                     input_zps=[za, zb], ort_input_scales=[sa, sb], ort_output_scale=[sc],
                     ort_zp_shift=ctx.ort_zp_shift)
        return emit("add", root, [a, b], attrs, op)


RULES = [QAdd()]
