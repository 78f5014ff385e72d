"""Quantized binary elementwise ops.

    Q ∘ addf(DQ(a), DQ(b)) -> torq_hl.add
    Q ∘ mulf(DQ(a), DQ(b)) -> torq_hl.mul  (mode int8: (a - zp_a)(b - zp_b) rescaled by sa·sb/sc)
    (a or b may be an integer constant: Mul/Add by a quantized per-channel or scalar weight)
Add also takes int16 activations (A16W8): ORT then runs DQ → float Add → Q, reproduced exactly
in the `ort` rounding mode (numerics.add_float_ort).

NPU form: t = (a - zp_a)·m_a + (b - zp_b)·m_b, one shared shift, NTP rounding (numerics.add_*).
The reference compiler uses int16 multipliers; we keep int32 ones so the NPU result stays within
rounding ties of ONNX Runtime's QLinearAdd.
"""
from __future__ import annotations

import numpy as np

from ... import numerics
from .. import linalg_view as L
from .. import recognise as R
from .common import Ctx, Root, activation_dtype, emit, scalar


def _broadcastable(a, b, out):
    try:
        return np.broadcast_shapes(a, b) == tuple(out)
    except ValueError:
        return False


class QBinary:
    """Q ∘ <op>f(DQ(a), DQ(b)) -> torq_hl.<op>"""
    arith = ""

    def match(self, ctx: Ctx, root: Root):
        op = L.producer(root.value)
        g = ctx.generic(op)
        if g is None:
            return None
        consts = tuple(g.consts)
        if len(g.var_inputs) == 1 and len(consts) == 1:   # x op DQ(integer constant): a quantized weight
            g = ctx.generic(op, force_var=consts)
        pair = R.as_binary(g, self.arith)
        if pair is None:
            return None
        da, db = (ctx.dequant(g.inputs[i], of_constant=i in consts) for i in pair)
        if da is None or db is None:
            return ctx.fail(op, "an input is not dequantized from an integer tensor")
        try:
            params = [scalar(da[1], "scale"), scalar(da[2], "zero point"),
                      scalar(db[1], "scale"), scalar(db[2], "zero point")]
        except ValueError as e:
            return ctx.fail(op, f"input {e}")
        if not _broadcastable(L.shape_of(da[0]), L.shape_of(db[0]), L.shape_of(root.op.results[0])):
            return ctx.fail(op, "operands are not numpy-broadcastable to the output")
        if np.ndim(root.q.scale) or not activation_dtype(root.q.out_dtype):
            return ctx.fail(op, "output quantization is not per-tensor int8 / int16")
        if not all(activation_dtype(L.np_dtype(v.type)) for v in (da[0], db[0])):
            return ctx.fail(op, "an input is neither int8 nor int16")
        wide = any(L.np_dtype(v.type) is np.int16 for v in (da[0], db[0])) or root.q.out_dtype is np.int16
        if wide and self.arith != "arith.addf":
            return ctx.fail(op, "int16 activations: only Add is lowered (ORT runs a 16-bit Mul in float)")
        return (op, da[0], db[0], params, wide)


class QAdd(QBinary):
    """Q ∘ addf(DQ(a), DQ(b)) -> torq_hl.add"""
    arith = "arith.addf"

    def rewrite(self, ctx: Ctx, root: Root, m):
        op, a, b, (sa, za, sb, zb), wide = m
        sc = float(root.q.scale)
        ma, mb, shift = numerics.add_multipliers(sa, sb, sc)
        # ORT fuses only an ONNX Add straight between DQs and a Q into QLinearAdd
        # (never with int16 activations: ORT has no 16-bit QLinearAdd)
        kernel = "QLinearAdd" if ctx.onnx_op(op) in ("Add", "QLinearAdd", "") and not root.clamps and not wide \
            else "float"
        attrs = dict(input_zp=0, output_zp=int(root.q.zp), output_min=root.q.lo, output_max=root.q.hi,
                     shift_factor=shift, weights=[ma, mb], scale_bias=[-(za * ma + zb * mb), 1],
                     # exact ratios: ORT's QLinearAdd is exact, the ACT's NTE gives its integers
                     # (int16: ORT's float Add is exact on dyadic scales, quantize.exact_int16)
                     round_ties_even=int(numerics.add_exact_ratios(sa, sb, sc) if kernel == "QLinearAdd"
                                         else wide and numerics.float_add_exact(
                                             sa, sb, sc, *(16 if L.np_dtype(v.type) is np.int16 else 8
                                                           for v in (a, b)))),
                     input_zps=[za, zb], ort_input_scales=[sa, sb], ort_output_scale=[sc],
                     ort_zp_shift=ctx.ort_zp_shift, ort_kernel=kernel)
        return emit("add", root, [a, b], attrs, op)


class QMul(QBinary):
    """Q ∘ mulf(DQ(a), DQ(b)) -> torq_hl.mul (mode int8)"""
    arith = "arith.mulf"

    def rewrite(self, ctx: Ctx, root: Root, m):
        op, a, b, (sa, za, sb, zb), _ = m
        sc = float(root.q.scale)
        mult, shift = numerics.mul_multiplier(sa, sb, sc)
        attrs = dict(mode="int8", input_zps=[za, zb], output_zp=int(root.q.zp), output_min=root.q.lo,
                     output_max=root.q.hi, shift_factor=shift, scale_bias=[0, mult], bias=[],
                     # ORT's QLinearMul exact: NTE with the zero point before rounding gives its integers
                     round_ties_even=int(numerics.mul_scale_exact(sa, sb, sc)),
                     ort_scales=[sa, sb, sc], ort_zp=0, ort_mode="mul", ort_zp_shift=ctx.ort_zp_shift)
        return emit("mul", root, [a, b], attrs, op)


RULES = [QAdd(), QMul()]
