"""Quantized convolutions -> torq_hl.conv2d / torq_hl.depthwise_conv2d.

    Q ∘ DQ ∘ conv_2d_nchw_fchw_q ∘ pad                         -> torq_hl.conv2d            (per-tensor)
    Q ∘ DQ ∘ T ∘ depthwise_conv_2d_nhwc_hwc_q ∘ T ∘ pad          -> torq_hl.depthwise_conv2d  (per-tensor)
    Q ∘ conv_2d_nchw_fchw(pad ∘ DQ, DQ(w)) + DQ(bias)          -> torq_hl.conv2d            (per-channel)
    Q ∘ depthwise_conv_2d_nchw_chw(pad ∘ DQ, DQ(w)) + DQ(bias) -> torq_hl.depthwise_conv2d  (per-channel)
    Q ∘ DQ ∘ collapse ∘ conv_2d_ngchw_gfchw_q ∘ expand ∘ pad    -> torq_hl.conv2d{groups=G}    (grouped)
    Q ∘ conv_1d_ncw_fcw(pad ∘ DQ, DQ(w)) + DQ(bias)            -> torq_hl.conv2d on H = 1     (Conv1D)

int16 activations (A16W8) always take the f32 form (torch has no 16-bit quantized type) and
land on the same ops with an i16 input and/or output: the NPU's byte-plane path
(`numerics.int16`); only the folded bias must then fit int32.

torch-mlir fuses only per-tensor operands into the `_q` convs; per-channel ones stay f32 convs
between DQ/Q generics (research mlir-feasibility §7). Both land on the same NPU op: weights
w' = w - w_zp, bias' = bias - in_zp·Σw', padding with in_zp, and a (multiplier, shift) rescale
per output channel (one shared shift), interleaved in scale_bias (seed §4).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import numerics
from .. import linalg_view as L
from .. import recognise as R
from .common import (Ctx, Fail, Root, activation_dtype, bias_to_accumulator, constant, emit, float_path, folded_bias,
                     pad_constant, rescale, scalar, strip_pad)


@dataclass
class ConvMatch:
    op_name: str            # "conv2d" | "depthwise_conv2d"
    conv: object            # the linalg conv op (location source)
    x: object               # int8 input value (unpadded)
    w: np.ndarray           # int weights [O, C/g, KH, KW] (raw, before zp folding)
    w_zp: int
    in_zp: int
    bias: np.ndarray        # int64 [O]
    dq_scale: np.ndarray    # float32 [O]: fl32(x_scale · w_scale[o])
    pad: list
    stride: list
    dilation: list
    groups: int
    w_value: object = None  # dynamic weights: the SSA value (then `w` only carries the shape)


def _unwrap_transpose(value, perm):
    op = L.producer(value)
    if op is not None and op.name == "linalg.transpose" and L.attr_ints(op, "permutation") == perm:
        return op.operands[0]
    return None


def _per_tensor(ctx: Ctx, root: Root):
    """DQ(i32 conv result) chain, per-tensor weights."""
    g = ctx.generic(L.producer(root.value))
    if g is None:
        return None
    d = R.as_dequant(g)
    if d is None or np.any(np.asarray(d.zp) != 0):
        return None
    acc = _untruncated(ctx, g.inputs[d.source_index])
    conv = L.producer(acc)
    if conv is not None and conv.name == "tensor.collapse_shape":       # grouped: [N,G,O/G,H,W]
        conv = L.producer(conv.operands[0])
        if conv is None or conv.name != "linalg.conv_2d_ngchw_gfchw_q":
            return None
        return _grouped(ctx, d, conv)
    if conv is not None and conv.name == "linalg.transpose":
        inner = _unwrap_transpose(acc, [0, 3, 1, 2])
        conv = L.producer(inner) if inner is not None else None
    if conv is None or conv.name not in ("linalg.conv_2d_nchw_fchw_q", "linalg.depthwise_conv_2d_nhwc_hwc_q"):
        return None
    depthwise = conv.name == "linalg.depthwise_conv_2d_nhwc_hwc_q"
    inp, wv, in_zp_v, w_zp_v, init = conv.operands
    in_zp, w_zp = ctx.const(in_zp_v), ctx.const(w_zp_v)
    if in_zp is None or w_zp is None:
        return ctx.fail(conv, "input/weight zero points are not compile-time constants")
    w = ctx.const(wv)
    dynamic = w is None
    if dynamic:
        if depthwise:
            return ctx.fail(conv, "dynamic depthwise weights are not lowered")
        w = np.zeros(L.shape_of(wv), np.int64)     # shape only; values come at run time
    if depthwise:
        inp = _unwrap_transpose(inp, [0, 2, 3, 1])
        if inp is None:
            return ctx.fail(conv, "depthwise input is not an NCHW->NHWC transpose")
        w = np.transpose(w, (2, 0, 1))[:, None]         # [KH,KW,C] -> [C,1,KH,KW]
    x, pad, padv = strip_pad(inp)
    pv = pad_constant(ctx, padv)
    if padv is not None and pv != int(in_zp):
        return ctx.fail(conv, f"padding value {pv} is not the input zero point {int(in_zp)}")
    bias = ctx.original_bias(init, conv)
    if bias is None:
        return ctx.fail(conv, "bias is not a compile-time constant")
    if isinstance(bias, Fail):
        return bias
    if depthwise:  # init broadcast on NHWC output: [1,OH,OW,C] -> per-channel vector
        bias = bias.reshape(-1, bias.shape[-1])[0] if bias.ndim > 1 else bias
    elif bias.ndim > 1:
        bias = bias[0, :, 0, 0]
    O = w.shape[0]
    return ConvMatch("depthwise_conv2d" if depthwise else "conv2d", conv, x, w.astype(np.int64),
                     int(w_zp), int(in_zp), np.broadcast_to(bias, (O,)).astype(np.int64),
                     np.full(O, np.float32(scalar(d.scale, "conv output scale")), np.float32),
                     pad, L.attr_ints(conv, "strides"), L.attr_ints(conv, "dilations"),
                     O if depthwise else 1, wv if dynamic else None)


def _untruncated(ctx: Ctx, value):
    """The i64 accumulator under a trunci-to-i32 generic (torch-mlir's int16 `_q` conv
    accumulates in i64; the truncation wraps like the NPU's 32-bit ACT sum), else value."""
    g = ctx.generic(L.producer(value))
    if g is not None and len(g.var_inputs) == 1 and g.parallel:
        t = g.tree_or_none()
        if isinstance(t, R.Node) and t.op == "arith.trunci" and isinstance(t.args[0], R.Arg):
            return g.inputs[t.args[0].index]
    return value


def _unexpand(value):
    op = L.producer(value)
    return op.operands[0] if op is not None and op.name == "tensor.expand_shape" else None


def _grouped(ctx: Ctx, d, conv):
    inp, wv, in_zp_v, w_zp_v, init = conv.operands
    in_zp, w_zp, w = ctx.const(in_zp_v), ctx.const(w_zp_v), ctx.const(wv)
    if in_zp is None or w_zp is None or w is None:
        return ctx.fail(conv, "weights or zero points are not compile-time constants")
    inp, init = _unexpand(inp), _unexpand(init) or init     # (int16: a fill of the grouped shape)
    if inp is None:
        return ctx.fail(conv, "grouped conv operands are not group reshapes")
    x, pad, padv = strip_pad(inp)
    if padv is not None and pad_constant(ctx, padv) != int(in_zp):
        return ctx.fail(conv, "padding value is not the input zero point")
    G = w.shape[0]
    w = w.reshape(-1, *w.shape[2:])                      # [G, O/G, C/G, KH, KW] -> [O, C/G, KH, KW]
    O = w.shape[0]
    bias = ctx.original_bias(init, conv)
    if bias is None:
        return ctx.fail(conv, "bias is not a compile-time constant")
    if isinstance(bias, Fail):
        return bias
    if bias.ndim == 5:
        bias = bias.reshape(bias.shape[0], O, *bias.shape[3:])
    bias = bias[0, :, 0, 0] if bias.ndim == 4 else bias.reshape(-1)[:O]
    return ConvMatch("conv2d", conv, x, w.astype(np.int64), int(w_zp), int(in_zp), bias.astype(np.int64),
                     np.full(O, np.float32(scalar(d.scale, "conv output scale")), np.float32), pad,
                     L.attr_ints(conv, "strides"), L.attr_ints(conv, "dilations"), G)


def _per_channel(ctx: Ctx, root: Root):
    """f32 conv on DQ(int8) input and DQ(const) weights (torch-mlir's per-channel form)."""
    conv = L.producer(root.value)
    groups = 1
    if conv is not None and conv.name == "tensor.collapse_shape":      # grouped: [N,G,O/G,H,W]
        conv = L.producer(conv.operands[0])
        if conv is None or conv.name != "linalg.conv_2d_ngchw_gfchw":
            return None
        groups = L.shape_of(conv.operands[1])[0]
    if conv is None or conv.name not in ("linalg.conv_2d_nchw_fchw", "linalg.depthwise_conv_2d_nchw_chw",
                                         "linalg.conv_1d_ncw_fcw", "linalg.conv_2d_ngchw_gfchw"):
        return None
    depthwise = conv.name == "linalg.depthwise_conv_2d_nchw_chw"
    one_d = conv.name == "linalg.conv_1d_ncw_fcw"
    inp, wv, init = conv.operands
    if groups > 1:
        inp, init = _unexpand(inp), _unexpand(init) or init      # (no bias: a fill of the grouped shape)
        if inp is None:
            return ctx.fail(conv, "grouped conv operands are not group reshapes")
    xin, pad, padv = strip_pad(inp)
    if padv is not None and pad_constant(ctx, padv) != 0.0:
        return ctx.fail(conv, "padding value is not zero")
    dq = ctx.dequant(xin)
    if dq is None:
        return ctx.fail(conv, "input is not dequantized from an integer tensor")
    x, xs, in_zp = dq
    wq = ctx.int_const_of_dequant(wv)
    if wq is None:
        return ctx.fail(conv, "weights are not dequantized constants")
    w, ws, w_zp = wq
    O = w.shape[0]
    ws = R.channel_vector(ws, 0, O, np.float32)
    w_zp_v = R.channel_vector(w_zp, 0, O, np.int64)
    if ws is None or w_zp_v is None or np.any(w_zp_v != w_zp_v[0]):
        return ctx.fail(conv, "weight scale/zero point must be per-tensor or per-output-channel (equal zero points)")
    if depthwise:
        w = w.reshape(O, 1, *w.shape[-2:])
    stride, dilation = L.attr_ints(conv, "strides"), L.attr_ints(conv, "dilations")
    if one_d:                                            # Conv1D as 2-D with H = 1
        w = w[:, :, None, :]
        stride, dilation = [1, *stride], [1, *dilation]   # strip_pad already gave [l, r, 0, 0]
    bias = np.zeros(O, np.int64)
    bop = L.producer(init)
    if bop is not None and bop.name == "linalg.broadcast":
        bq = ctx.int_const_of_dequant(bop.operands[0])
        if bq is None:
            return ctx.fail(conv, "bias is not a dequantized int32 constant")
        bscale, bzp = R.channel_vector(bq[1], 0, O, np.float32), R.channel_vector(bq[2], 0, O, np.int64)
        if bscale is None or bzp is None:
            return ctx.fail(conv, "bias scale/zero point must be per-tensor or per-output-channel")
        bias = bias_to_accumulator(ctx, conv, bq[0].astype(np.int64).reshape(O), bzp, bscale,
                                   numerics.dq_scale(scalar(xs, "input scale"), ws))
        if isinstance(bias, Fail):
            return bias
    elif ctx.const(init) is None or np.any(ctx.const(init) != 0):
        return ctx.fail(conv, "unsupported accumulator initialisation")
    try:
        xs_s, in_zp_s = scalar(xs, "input scale"), scalar(in_zp, "input zero point")
    except ValueError as e:
        return ctx.fail(conv, str(e))
    dq_scale = numerics.dq_scale(xs_s, ws)
    return ConvMatch("depthwise_conv2d" if depthwise else "conv2d", conv, x, w.astype(np.int64),
                     int(w_zp_v[0]), int(in_zp_s), bias, dq_scale, pad, stride, dilation, O if depthwise else groups)


class QConv2D:
    """Q ∘ DQ ∘ conv(_q) ∘ pad -> torq_hl.conv2d | torq_hl.depthwise_conv2d"""

    def match(self, ctx: Ctx, root: Root):
        m = _per_tensor(ctx, root)
        if m is None:
            m = _per_channel(ctx, root)
        if m is None or not m:
            return m
        if np.ndim(root.q.scale) or np.ndim(root.q.zp):
            return ctx.fail(m.conv, "output quantization is not per-tensor")
        if not activation_dtype(root.q.out_dtype):
            return ctx.fail(m.conv, f"output type {np.dtype(root.q.out_dtype).name} is neither int8 nor int16")
        if not activation_dtype(L.np_dtype(m.x.type)):
            return ctx.fail(m.conv, f"input type {L.np_dtype(m.x.type).name} is neither int8 nor int16")
        return m

    def rewrite(self, ctx: Ctx, root: Root, m: ConvMatch):
        from torch_mlir import ir
        ys = np.float32(root.q.scale)
        ip = ir.InsertionPoint(root.op)
        loc = m.conv.location
        dq_scale = m.dq_scale
        floating = float_path(L.np_dtype(m.x.type) is np.int16, root.q)
        if m.w_value is not None:
            mults, shift = numerics.conv_rescale(m.dq_scale, ys, floating)
            weights, sb = _dynamic_weights(m, mults, loc, ip)
        else:
            w_adj = m.w - m.w_zp                                       # seed §4.3.1
            bias = folded_bias(ctx, m.conv, m.bias, m.in_zp, w_adj,   # §4.3.2 + §4.3.3
                               wide=L.np_dtype(m.x.type) is np.int16)
            if isinstance(bias, Fail):
                return bias
            mults, shift, bias, dq_scale, w_adj = rescale(m.dq_scale, ys, w_adj, bias, root.q,
                                                           wide=L.np_dtype(m.x.type) is np.int16)
            scale_bias = np.stack([bias, mults], axis=1).reshape(-1)   # [b0, m0, b1, m1, ...]
            weights = constant(w_adj, "i16" if m.w_zp != 0 else "i8", loc, ip)
            sb = constant(scale_bias, "i32", loc, ip)
        attrs = dict(input_zp=m.in_zp, weight_zp=0, output_zp=int(root.q.zp), output_min=root.q.lo,
                     output_max=root.q.hi, shift_factor=shift, groups=m.groups, pad=m.pad,
                     stride=m.stride, dilation=m.dilation,
                     round_ties_even=int(numerics.rescale_ties_even(m.dq_scale, ys, floating)),
                     ort_dq_scale=dq_scale, ort_output_scale=[ys])
        return emit(m.op_name, root, [weights, sb, m.x], attrs, m.conv)


def _dynamic_weights(m: ConvMatch, mults, loc, ip):
    """Weights known only at run time (seed §4.5.4): the same folds, as NPU ops instead of constants.

        w'   = fma(w, 1, -w_zp)                      (i16; skipped when w_zp == 0)
        b'   = fma(reduce_sum(w', C·KH·KW), -in_zp, bias)
        scale_bias = interleave(b', multipliers)     (expand, concat, collapse: data movement)
    """
    from torch_mlir import ir
    from torch_mlir.dialects import tensor

    from .. import torq_hl
    from .common import empty

    i16, i32 = ir.IntegerType.get_signless(16), ir.IntegerType.get_signless(32)
    O = m.w.shape[0]

    def op(name, value, shape, elem, **attrs):
        t = ir.RankedTensorType.get(list(shape), elem)
        return torq_hl.create(name, t, [empty(t, loc, ip), value], attrs, loc, ip).results[0]

    w = m.w_value
    if m.w_zp != 0:
        w = op("fma", w, m.w.shape, i16, weights=[1], biases=[-m.w_zp], output_min=-2**15, output_max=2**15 - 1)
    total = op("reduce", w, [O], i32, mode="sum", dims=list(range(1, m.w.ndim)))
    bias = op("fma", total, [O], i32, weights=[-m.in_zp], biases=m.bias, output_min=-2**31, output_max=2**31 - 1)
    col = ir.RankedTensorType.get([O, 1], i32)
    b2 = tensor.ExpandShapeOp(col, bias, [[0, 1]], [], [O, 1], loc=loc, ip=ip).result
    m2 = constant(np.asarray(mults).reshape(O, 1), "i32", loc, ip)
    pairs = tensor.ConcatOp(ir.RankedTensorType.get([O, 2], i32), 1, [b2, m2], loc=loc, ip=ip).result
    sb = tensor.CollapseShapeOp(ir.RankedTensorType.get([2 * O], i32), pairs, [[0, 1]], loc=loc, ip=ip).result
    return w, sb


RULES = [QConv2D()]
