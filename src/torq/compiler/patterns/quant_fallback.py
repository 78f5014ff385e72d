"""Standalone QuantizeLinear / DequantizeLinear that fused into nothing (seed §4.4.2).

    Q  (f32 -> i8)  -> act f2f (f32->bf16) -> mul (×1/scale, +zp) -> act f2i (bf16->i32) -> fma (clamp -> i8)
    DQ (i8 -> f32)  -> fma (−zp -> i32) -> act i2f (->bf16, exact) -> mul (×scale) -> act f2f (bf16->f32)

The DQ subtracts the zero point in integers first, so the bf16 product is rounded once; a
bias −zp·scale added after the product would cancel catastrophically near q = zp (measured: up
to 39 % relative error against ONNX Runtime).

bf16 arithmetic is lossy on the NPU (native mode); `ort_*` attributes let the `ort` mode compute
what ONNX Runtime's QuantizeLinear / DequantizeLinear compute.
"""
from __future__ import annotations


from ... import numerics
from .. import recognise as R
from .. import torq_hl
from .common import Ctx, Root, empty, scalar


def _retyped(value_type, elem):
    from torch_mlir import ir
    t = ir.RankedTensorType(value_type)
    e = {"bf16": ir.BF16Type.get(), "i32": ir.IntegerType.get_signless(32), "f32": ir.F32Type.get()}[elem]
    return ir.RankedTensorType.get(list(t.shape), e)


def _bf16_factor(value: float, loc, ip):
    """A one-element bf16 constant (the fallback mul's second operand)."""
    from torch_mlir import ir
    t = ir.RankedTensorType.get([1], ir.BF16Type.get())
    attr = ir.DenseElementsAttr.get_splat(t, ir.FloatAttr.get(ir.BF16Type.get(), float(value)))
    return ir.Operation.create("arith.constant", results=[t], attributes={"value": attr}, loc=loc, ip=ip).results[0]


def _bf16_mul(factor, bias, scale, zp, ort_mode):
    return dict(mode="bf16", input_zps=[0, 0], output_zp=0, output_min=0, output_max=0, shift_factor=0,
                scale_bias=[0, 0], bias=[bias], ort_scales=[scale], ort_zp=zp, ort_mode=ort_mode,
                ort_zp_shift=0, round_ties_even=0), factor


def _seq(steps, x, loc, ip):
    for name, rtype, attrs in steps:
        init = empty(rtype, loc, ip)
        operands = [init, x]
        if isinstance(attrs, tuple):          # mul: (attributes, constant factor)
            attrs, factor = attrs
            operands.append(_bf16_factor(factor, loc, ip))
        x = torq_hl.create(name, rtype, operands, attrs, loc, ip).results[0]
    return x


class QuantizeFallback:
    """Q (standalone) -> act f2f, mul, act f2i, fma"""

    def match(self, ctx: Ctx, root: Root):
        try:
            return float(scalar(root.q.scale, "scale")), int(scalar(root.q.zp, "zero point"))
        except ValueError as e:
            return ctx.fail(root.op, f"per-channel QuantizeLinear: {e}")

    def rewrite(self, ctx: Ctx, root: Root, m):
        from torch_mlir import ir
        scale, zp = m
        ip, loc = ir.InsertionPoint(root.op), root.op.location
        t_in = root.value.type
        steps = [("act", _retyped(t_in, "bf16"), dict(mode="f2f")),
                 ("mul", _retyped(t_in, "bf16"), _bf16_mul(*numerics.bf16_fallback_constants(scale, zp, True),
                                                           scale, zp, "quantize")),
                 ("act", _retyped(t_in, "i32"), dict(mode="f2i")),
                 ("fma", root.op.results[0].type, dict(weights=[1], biases=[0], output_min=root.q.lo,
                                                       output_max=root.q.hi))]
        return _seq(steps, root.value, loc, ip).owner


class DequantizeFallback:
    """DQ (standalone) -> fma, act i2f, mul, act f2f"""

    def rewrite(self, ctx: Ctx, g) -> object:
        from torch_mlir import ir
        d = R.as_dequant(g)
        scale, zp = float(scalar(d.scale, "scale")), int(scalar(d.zp, "zero point"))
        op = g.op
        ip, loc = ir.InsertionPoint(op), op.location
        x = g.inputs[d.source_index]
        steps = [("fma", _retyped(x.type, "i32"), dict(weights=[1], biases=[-zp], output_min=-2**31,
                                                       output_max=2**31 - 1)),
                 ("act", _retyped(x.type, "bf16"), dict(mode="i2f")),
                 ("mul", _retyped(x.type, "bf16"), _bf16_mul(*numerics.bf16_fallback_constants(scale, zp, False),
                                                             scale, 0, "dequantize")),
                 ("act", op.results[0].type, dict(mode="f2f"))]
        return _seq(steps, x, loc, ip).owner
