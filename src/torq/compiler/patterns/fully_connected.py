"""Quantized Gemm / MatMul -> torq_hl.fully_connected.

    Q ∘ [+DQ(bias)] ∘ DQ ∘ quantized_matmul(x, T(w))          -> torq_hl.fully_connected  (per-tensor)
    Q ∘ [+DQ(bias)] ∘ matmul(DQ(x), T(DQ(w)))                 -> torq_hl.fully_connected  (per-channel)
    the same with batch_matmul over a [B, M, K] activation and a broadcast [K, N] weight (MatMul of a
    rank-3/4 activation by a weight)                          -> collapse, fully_connected, expand

Same algebra as the lecture's FC layer (seed 002): q_bias = q_b - Z_X·Σ_k q_W[o, k].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import numerics
from .. import linalg_view as L
from .. import recognise as R
from .. import torq_hl
from .common import (Ctx, Fail, Root, activation_dtype, bias_to_accumulator, constant, emit, empty, float_path,
                     folded_bias, rescale, scalar)


@dataclass
class FCMatch:
    mm: object
    x: object
    w: np.ndarray       # [O, K] int
    w_zp: int
    in_zp: int
    bias: np.ndarray    # int64 [O]
    dq_scale: np.ndarray  # float32 [O] = fl32(xs·ws[o])


def _bias_add(ctx: Ctx, value):
    """value = addf(v, DQ(bias const)) -> (v, (bias ints, bias scale, bias zp)) else (value, None)."""
    g = ctx.generic(L.producer(value))
    if g is None:
        return value, None
    hit = R.as_scalar_op(g, "arith.addf")
    if hit is None or len(g.consts) != 1:
        return value, None
    (ci,) = g.consts
    bq = ctx.int_const_of_dequant(g.inputs[ci])
    if bq is None:
        return value, None
    return g.inputs[g.var_inputs[0]], (bq[0].astype(np.int64).ravel(), bq[1], bq[2])


def _weight_matrix(ctx: Ctx, src):
    """The [K, N] weight of a batch matmul whose [B, K, N] weight is one matrix for every batch.

    torch-mlir broadcasts it with a copy generic ``(d0, d1, d2) -> (d1, d2)`` of a 2-D constant:
    read that constant instead of materialising and comparing B copies (ViT's MLP: 197 × 768 ×
    3072 bytes, 7 of its 16 s of compile time). Anything else is evaluated and checked."""
    op = L.producer(src)
    if op is not None and op.name == "linalg.generic" and len(op.operands) == 2:
        from torch_mlir import ir
        maps = [str(ir.AffineMapAttr(m).value) for m in op.attributes["indexing_maps"]]
        body = list(op.regions[0].blocks[0].operations)
        if (maps[0] == "(d0, d1, d2) -> (d1, d2)" and maps[1] == "(d0, d1, d2) -> (d0, d1, d2)"
                and len(body) == 1 and body[0].name == "linalg.yield"
                and isinstance(body[0].operands[0], ir.BlockArgument)
                and ir.BlockArgument(body[0].operands[0]).arg_number == 0):
            w = ctx.const(op.operands[0])
            if w is not None and w.ndim == 2:
                return w
    w = ctx.const(src)
    if w is None or w.ndim == 2:
        return w
    if w.ndim == 3 and np.all(w == w[:1]):
        return w[0]
    return None


def _unexpanded(op):
    """torch-mlir runs a rank-4 activation's MatMul as a batch matmul over the collapsed leading
    dims and expands the result back: look through that expand_shape."""
    if op is not None and op.name == "tensor.expand_shape":
        inner = L.producer(op.operands[0])
        if inner is not None and inner.name in ("linalg.batch_matmul", "linalg.quantized_batch_matmul"):
            return inner
    return op


def _untransposed(wv):
    """The [K, O] weight operand is usually a transpose of the [O, K] constant: (source, transposed?)."""
    op = L.producer(wv)
    if op is not None and op.name == "linalg.transpose" and L.attr_ints(op, "permutation") == [1, 0]:
        return op.operands[0], True
    return wv, False


class QFullyConnected:
    """Q ∘ (+bias) ∘ DQ ∘ (quantized_)matmul -> torq_hl.fully_connected"""

    def match(self, ctx: Ctx, root: Root):
        v, bq = _bias_add(ctx, root.value)
        g = ctx.generic(L.producer(v))
        mm = _unexpanded(L.producer(v))
        if g is not None:
            d = R.as_dequant(g)
            if d is None or np.any(np.asarray(d.zp) != 0):
                return None
            mm = _unexpanded(L.producer(g.inputs[d.source_index]))
            if mm is None or mm.name not in ("linalg.quantized_matmul", "linalg.quantized_batch_matmul"):
                return None
            x, wv, in_zp_v, w_zp_v, _ = mm.operands
            in_zp, w_zp = ctx.const(in_zp_v), ctx.const(w_zp_v)
            src, transposed = _untransposed(wv)
            w = _weight_matrix(ctx, src)
            if w is None or in_zp is None or w_zp is None:
                return ctx.fail(mm, "weights or zero points are not compile-time constants")
            w = w if transposed else w.T
            O = w.shape[0]
            dq_scale = np.full(O, np.float32(scalar(d.scale, "matmul output scale")), np.float32)
            w_zp, in_zp = int(w_zp), int(in_zp)
        elif mm is not None and mm.name in ("linalg.matmul", "linalg.batch_matmul"):
            xv, wv, _ = mm.operands
            if mm.name == "linalg.batch_matmul" and L.op_name(L.producer(xv)) == "tensor.collapse_shape":
                xv = L.producer(xv).operands[0]      # rank-4 activation: its leading dims collapsed
            dq = ctx.dequant(xv)
            if dq is None:
                return ctx.fail(mm, "input is not dequantized from an integer tensor")
            x, xs, in_zp = dq
            src, transposed = _untransposed(wv)
            wq = ctx.int_const_of_dequant(src)
            if wq is None:
                return ctx.fail(mm, "weights are not dequantized constants")
            w, ws, w_zp = wq
            axis = 0 if transposed else 1
            O = w.shape[axis]
            ws = R.channel_vector(ws, axis, O, np.float32)
            w_zp_v = R.channel_vector(w_zp, axis, O, np.int64)
            if ws is None or np.any(w_zp_v != w_zp_v[0]):
                return ctx.fail(mm, "weight scale/zero point must be per-tensor or per-output-channel")
            w = w if transposed else w.T
            in_zp = int(scalar(in_zp, "input zero point"))
            w_zp = int(w_zp_v[0])
            dq_scale = numerics.dq_scale(scalar(xs, "input scale"), ws)
        else:
            return None
        if w is None or w.ndim != 2:
            return ctx.fail(mm, "the weight differs between batches (a matmul of two activations)")
        if len(L.shape_of(x)) not in (2, 3, 4):
            return ctx.fail(mm, "only 2-D to 4-D matmuls are lowered to fully_connected")
        if bq is None:
            bias = np.zeros(O, np.int64)
        elif bq[0].size != O:
            return ctx.fail(mm, "bias is not one value per output")
        else:   # in the accumulator scale, exactly (the lecture's trap) or refused
            bias = bias_to_accumulator(ctx, mm, bq[0], np.ravel(bq[2]), np.ravel(bq[1]), dq_scale)
            if isinstance(bias, Fail):
                return bias
        if np.ndim(root.q.scale) or not activation_dtype(root.q.out_dtype):
            return ctx.fail(mm, "output quantization is not per-tensor int8 / int16")
        if not activation_dtype(L.np_dtype(x.type)):
            return ctx.fail(mm, "input is neither int8 nor int16")
        return FCMatch(mm, x, w.astype(np.int64), w_zp, in_zp, np.broadcast_to(bias, (O,)).astype(np.int64), dq_scale)

    def rewrite(self, ctx: Ctx, root: Root, m: FCMatch):
        from torch_mlir import ir
        ys = np.float32(root.q.scale)
        w_adj = m.w - m.w_zp
        bias = folded_bias(ctx, m.mm, m.bias, m.in_zp, w_adj,  # q_bias = q_b - Z_X·Σ q_W (lecture)
                           wide=L.np_dtype(m.x.type) is np.int16)
        if isinstance(bias, Fail):
            return bias
        mults, shift, bias, dq_scale, w_adj = rescale(m.dq_scale, ys, w_adj, bias, root.q,
                                                           wide=L.np_dtype(m.x.type) is np.int16)
        ip = ir.InsertionPoint(root.op)
        loc = m.mm.location
        weights = constant(w_adj, "i16" if m.w_zp != 0 else "i8", loc, ip)
        sb = constant(np.stack([bias, mults], axis=1).reshape(-1), "i32", loc, ip)
        attrs = dict(input_zp=m.in_zp, weight_zp=0, output_zp=int(root.q.zp), output_min=root.q.lo,
                     output_max=root.q.hi, shift_factor=shift, round_ties_even=int(numerics.rescale_ties_even(
                         m.dq_scale, ys, float_path(L.np_dtype(m.x.type) is np.int16, root.q))),
                     ort_dq_scale=dq_scale, ort_output_scale=[ys])
        if len(L.shape_of(m.x)) == 2:
            return emit("fully_connected", root, [weights, sb, m.x], attrs, m.mm)
        return _batched(root, weights, sb, m, attrs, ip)


def _batched(root: Root, weights, sb, m: FCMatch, attrs, ip):
    """[..., K] -> collapse [rows, K] -> fully_connected -> expand to the output's [..., N]."""
    from torch_mlir import ir
    x_shape = L.shape_of(m.x)
    rows = int(np.prod(x_shape[:-1]))
    out_t = ir.RankedTensorType(root.op.results[0].type)
    out_shape = list(out_t.shape)
    flat_in = ir.RankedTensorType.get([rows, x_shape[-1]], ir.RankedTensorType(m.x.type).element_type)
    flat_out = ir.RankedTensorType.get([rows, out_shape[-1]], out_t.element_type)
    x2 = ir.Operation.create("tensor.collapse_shape", results=[flat_in], operands=[m.x],
                             attributes={"reassociation": _reassociation(len(x_shape))},
                             loc=m.mm.location, ip=ip).results[0]
    init = empty(flat_out, m.mm.location, ip)
    fc = torq_hl.create("fully_connected", flat_out, [init, weights, sb, x2], attrs, m.mm.location, ip)
    return ir.Operation.create("tensor.expand_shape", results=[out_t], operands=[fc.results[0]],
                               attributes={"reassociation": _reassociation(len(out_shape)),
                                           "static_output_shape": ir.DenseI64ArrayAttr.get(out_shape)},
                               loc=m.mm.location, ip=ip)


def _reassociation(rank: int):
    """[[0, …, rank-2], [rank-1]]: all leading dims <-> the rows of a 2-D matrix."""
    from torch_mlir import ir
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, i) for i in dims])
                             for dims in (list(range(rank - 1)), [rank - 1])])


RULES = [QFullyConnected()]
