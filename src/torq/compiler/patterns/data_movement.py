"""Data movement between a dequantize and a quantize moves int8 data as is.

    Q ∘ collapse_shape ∘ DQ      -> collapse_shape   (Flatten, Reshape; same qparams)
    Q ∘ expand_shape ∘ DQ        -> expand_shape
    Q ∘ transpose ∘ DQ           -> transpose        (Transpose; same qparams)
    Q ∘ pad(DQ, v)               -> pad(x | table(x), Q(v))   (Pad, constant mode: int8 padding;
                                    a Conv/pool reading it takes the padding as its own)
    Q ∘ concat(DQ_i)             -> concat(x_i | table_i(x_i))   (Concat: inputs whose qparams
                                    differ from the output's are requantized by a 256-entry table
                                    of their own Q ∘ DQ, as ORT's QLinearConcat does; a constant
                                    input is quantized by the output's Q at compile time)
"""
from __future__ import annotations

import numpy as np

from .. import linalg_view as L
from .common import Ctx, Root, constant, emit, lookup_table

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


def _same(ctx, dq, root):
    x, xs, xz = dq
    return (np.ndim(xs) == 0 and xs == root.q.scale and xz == root.q.zp
            and L.np_dtype(x.type) is root.q.out_dtype)


class QTranspose:
    """Q ∘ transpose ∘ DQ -> transpose (on the integer tensor)"""

    def match(self, ctx: Ctx, root: Root):
        op = L.producer(root.value)
        if op is None or op.name != "linalg.transpose":
            return None
        dq = ctx.dequant(op.operands[0])
        if dq is None or not _same(ctx, dq, root):
            return ctx.fail(op, "transpose changes the quantization")
        return op, dq[0]

    def rewrite(self, ctx: Ctx, root: Root, m):
        from torch_mlir import ir
        from torch_mlir.dialects import linalg

        from .common import empty
        op, x = m
        ip, rtype = ir.InsertionPoint(root.op), root.op.results[0].type
        init = empty(rtype, op.location, ip)
        with op.location, ip:
            return linalg.transpose(x, outs=[init], permutation=L.attr_ints(op, "permutation")).operation


class QPad:
    """Q ∘ pad(DQ(x), v) -> pad(x | table(x), Q(v))"""

    def match(self, ctx: Ctx, root: Root):
        op = L.producer(root.value)
        if op is None or op.name != "tensor.pad":
            return None
        dq = ctx.dequant(op.operands[0])
        if dq is None or np.ndim(dq[1]) or np.ndim(root.q.scale):
            return ctx.fail(op, "Pad input or output is not a per-tensor dequantized integer tensor")
        value = ctx.const(list(op.regions[0].blocks[0].operations)[-1].operands[0])
        if value is None:
            return ctx.fail(op, "the padding value is not a constant")
        steps = [ctx.generic(c) for c in reversed(root.clamps)] + [ctx.generic(root.op)]
        q_value = int(lookup_values(steps, np.float32(value)))
        requant = None if _same(ctx, dq, root) and not root.clamps else [ctx.generic(L.producer(op.operands[0])), *steps]
        return op, dq[0], q_value, requant

    def rewrite(self, ctx: Ctx, root: Root, m):
        from torch_mlir import ir
        from torch_mlir.dialects import arith, tensor
        op, x, q_value, requant = m
        rtype, ip = root.op.results[0].type, ir.InsertionPoint(root.op)
        if requant is not None:          # other qparams (or a clamp) after the Pad: one table first
            x = emit("table", root, [x], dict(table=lookup_table(*requant)), op,
                     result_type=rtype, shape_of=x).results[0]
        elem = ir.RankedTensorType(rtype).element_type
        with op.location:
            pad = tensor.PadOp(rtype, x, [], [], L.attr_ints(op, "static_low"), L.attr_ints(op, "static_high"), ip=ip)
            block = pad.regions[0].blocks.append(*[ir.IndexType.get()] * len(L.shape_of(x)))
            with ir.InsertionPoint(block):
                tensor.YieldOp(arith.ConstantOp(elem, ir.IntegerAttr.get(elem, q_value)).result)
        return pad.operation


def lookup_values(generics, value) -> np.ndarray:
    """One-input elementwise generics evaluated in order on a scalar, as the linalg computes them."""
    y = np.asarray(value)
    for g in generics:
        shape = (1,) * len(g.out_shape)
        y = g.evaluate({g.var_inputs[0]: np.asarray(y).reshape(shape)}, shape).ravel()[0]
    return y


class QConcat:
    """Q ∘ concat(DQ_i) -> concat(x_i | table_i(x_i))"""

    def match(self, ctx: Ctx, root: Root):
        op = L.producer(root.value)
        if op is None or op.name != "tensor.concat":
            return None
        if np.ndim(root.q.scale) or root.q.out_dtype is not np.int8:
            return ctx.fail(op, "Concat output quantization is not per-tensor int8")
        parts = []
        for v in op.operands:
            if ctx.const(v) is not None:     # a constant part (ViT's class token): quantized at compile time
                parts.append((v, "constant"))
                continue
            dq = ctx.dequant(v)
            if dq is None or np.ndim(dq[1]) or L.np_dtype(dq[0].type) is not np.int8:
                return ctx.fail(op, "a Concat input is not a per-tensor int8 dequantize")
            parts.append((dq[0], None if _same(ctx, dq, root) else ctx.generic(L.producer(v))))
        return op, parts

    def rewrite(self, ctx: Ctx, root: Root, m):
        from torch_mlir import ir
        from torch_mlir.dialects import tensor
        op, parts = m
        qg = ctx.generic(root.op)
        ins = []
        for x, dq_generic in parts:
            if dq_generic == "constant":
                value = ctx.const(x)
                q = qg.evaluate({qg.var_inputs[0]: value}, value.shape)
                x = constant(q, "i8", op.location, ir.InsertionPoint(root.op))
            elif dq_generic is not None:     # requantize this input to the output's parameters
                x = emit("table", root, [x], dict(table=lookup_table(dq_generic, qg)), op,
                         result_type=root.op.results[0].type, shape_of=x).results[0]
            ins.append(x)
        return tensor.ConcatOp(root.op.results[0].type, int(op.attributes["dim"].value), ins,
                               loc=op.location, ip=ir.InsertionPoint(root.op)).operation


RULES = [QReshape(), QTranspose(), QPad(), QConcat()]
