"""MatMul of two int8 activations (attention's Q·Kᵀ and softmax·V) -> torq_hl.matmul.

    Q ∘ DQ ∘ [expand] ∘ quantized_(batch_)matmul(x, y, zx, zy)    -> [expand] ∘ matmul(fma(x), fma(y))
    Q ∘ [expand] ∘ (batch_)matmul([collapse] DQ(x), [collapse] DQ(y))  (the unfused form)  -> the same

Neither operand is a constant (those are `fully_connected`). The NPU has no zero-point input on
its matmul, so each non-zero zero point is taken off first, `fma(v, 1, -z)` into i16 (as the
reference compiler's Mul lowering does); the accumulator Σ_k (x−zx)(y−zy) is then exact in i32,
and the rescale is fully_connected's: (multiplier, shift) of fl32(xs·ys)/ys_out for the NPU,
ORT's QLinearMatMul float requant fl32(fl32(xs·ys)/ys_out) in `ort` mode.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import numerics
from .. import linalg_view as L
from .. import recognise as R
from .. import torq_hl
from .common import INT32_MAX, Ctx, Root, empty, scalar

_FUSED = ("linalg.quantized_matmul", "linalg.quantized_batch_matmul")
_FLOAT = ("linalg.matmul", "linalg.batch_matmul")


@dataclass
class MatMulMatch:
    mm: object              # the linalg matmul (location source)
    x: object               # int8 activations, [B,] M×K and [B,] K×N
    y: object
    zx: int
    zy: int
    dq_scale: np.float32    # fl32(xs·ys): the DequantizeLinear scale of the i32 product
    expanded: bool          # torch-mlir ran a rank-4 matmul collapsed: expand the result back
    collapses: tuple = (None, None)   # unfused form: the collapse_shape of each DQ'd operand


def _expanded_matmul(value):
    """(matmul op, expanded?) behind `value`, looking through torch-mlir's expand of a rank-4 result."""
    op = L.producer(value)
    if op is not None and op.name == "tensor.expand_shape":
        inner = L.producer(op.operands[0])
        if inner is not None and inner.name in _FUSED + _FLOAT:
            return inner, True
    return op, False


def _collapse_of(value):
    """The collapse_shape producing `value` (torch-mlir's rank-4 → rank-3 batch operand), or None."""
    op = L.producer(value)
    return op if op is not None and op.name == "tensor.collapse_shape" else None


def _fused(ctx: Ctx, root: Root):
    g = ctx.generic(L.producer(root.value))
    d = R.as_dequant(g) if g is not None else None
    if d is None or np.any(np.asarray(d.zp) != 0):
        return None
    mm, expanded = _expanded_matmul(g.inputs[d.source_index])
    if mm is None or mm.name not in _FUSED:
        return None
    x, y, zx_v, zy_v, _ = mm.operands
    if ctx.const(y) is not None or ctx.const(x) is not None:
        return None                         # a weight: fully_connected's
    zx, zy = ctx.const(zx_v), ctx.const(zy_v)
    if zx is None or zy is None:
        return ctx.fail(mm, "zero points are not compile-time constants")
    return MatMulMatch(mm, x, y, int(zx), int(zy), np.float32(scalar(d.scale, "matmul output scale")), expanded)


def _unfused(ctx: Ctx, root: Root):
    mm, expanded = _expanded_matmul(root.value)
    if mm is None or mm.name not in _FLOAT:
        return None
    operands, collapses = [], []
    for v in mm.operands[:2]:
        c = _collapse_of(v) if expanded else None
        dq = ctx.dequant(c.operands[0] if c is not None else v)
        if dq is None:
            return None                     # a dequantized weight (fully_connected) or float data
        operands.append(dq)
        collapses.append(c)
    (x, xs, zx), (y, ys, zy) = operands
    if any(np.ndim(v) for v in (xs, zx, ys, zy)):
        return ctx.fail(mm, "activation scale/zero point is not per-tensor")
    return MatMulMatch(mm, x, y, int(zx), int(zy), numerics.dq_scale(xs, ys), expanded, tuple(collapses))


def _collapsed(op, int_value, ip):
    """`int_value` reshaped by the collapse_shape `op` its dequantized float twin went through."""
    from torch_mlir import ir
    if op is None:
        return int_value
    rtype = ir.RankedTensorType.get(list(L.shape_of(op.results[0])), ir.RankedTensorType(int_value.type).element_type)
    return ir.Operation.create("tensor.collapse_shape", results=[rtype], operands=[int_value],
                               attributes={k: op.attributes[k] for k in op.attributes},
                               loc=op.location, ip=ip).results[0]


class QMatMul:
    """Q ∘ DQ ∘ quantized_(batch_)matmul(x, y) | Q ∘ (batch_)matmul(DQ x, DQ y) -> torq_hl.matmul"""

    def match(self, ctx: Ctx, root: Root):
        m = _fused(ctx, root)
        if m is None:
            m = _unfused(ctx, root)
        if m is None or not m:
            return m
        if np.ndim(root.q.scale) or root.q.out_dtype is not np.int8:
            return ctx.fail(m.mm, "output quantization is not per-tensor int8")
        if any(L.np_dtype(v.type) is not np.int8 for v in (m.x, m.y)):
            return ctx.fail(m.mm, "operands are not int8")
        k = L.shape_of(m.mm.operands[0])[-1]
        bound = k * max(127 - m.zx, m.zx + 128) * max(127 - m.zy, m.zy + 128)
        if bound > INT32_MAX:
            return ctx.fail(m.mm, f"accumulator bound {bound} (K = {k}) exceeds int32")
        return m

    def rewrite(self, ctx: Ctx, root: Root, m: MatMulMatch):
        from torch_mlir import ir
        ys = np.float32(root.q.scale)
        mults, shift = numerics.conv_rescale(np.asarray([m.dq_scale]), ys)
        ip, loc = ir.InsertionPoint(root.op), m.mm.location
        x, y = (_minus_zp(_collapsed(c, v, ip), z, loc, ip) for v, z, c in ((m.x, m.zx, m.collapses[0]),
                                                                            (m.y, m.zy, m.collapses[1])))
        out_t = ir.RankedTensorType(root.op.results[0].type)
        mm_t = ir.RankedTensorType.get(list(L.shape_of(m.mm.results[0])), out_t.element_type)
        attrs = dict(output_zp=int(root.q.zp), output_min=root.q.lo, output_max=root.q.hi, shift_factor=shift,
                     scale_bias=[0, int(mults[0])], ort_dq_scale=[m.dq_scale], ort_output_scale=[ys])
        mm = torq_hl.create("matmul", mm_t, [empty(mm_t, loc, ip), x, y], attrs, loc, ip)
        if not m.expanded:
            return mm
        expand = L.producer(_expanded_matmul_result(root))
        return ir.Operation.create("tensor.expand_shape", results=[out_t], operands=[mm.results[0]],
                                   attributes={k: expand.attributes[k] for k in expand.attributes},
                                   loc=loc, ip=ip)


def _expanded_matmul_result(root: Root):
    """The expand_shape value between the matmul and the root (through the fused form's DQ)."""
    op = L.producer(root.value)
    return op.operands[0] if op.name == "linalg.generic" else root.value


def _minus_zp(value, zp: int, loc, ip):
    """v − zp in i16 (fma), or v itself when zp is 0."""
    if zp == 0:
        return value
    from torch_mlir import ir
    t = ir.RankedTensorType.get(list(L.shape_of(value)), ir.IntegerType.get_signless(16))
    return torq_hl.create("fma", t, [empty(t, loc, ip), value], dict(weights=[1], biases=[-zp],
                          output_min=-2**15, output_max=2**15 - 1), loc, ip).results[0]


RULES = [QMatMul()]
