"""Quantized Conv3D -> torq_hl.conv2d on a depth-folded input (seed §4.7: "generalization: Conv3D").

    Q ∘ DQ ∘ T ∘ conv_3d_ndhwc_dhwcf_q(T ∘ x, T ∘ w)              (QDQ and QLinearConv alike)
    Q ∘ conv_3d_ncdhw_fcdhw(pad ∘ DQ(x), DQ(w)) + DQ(bias)           (per-channel weights)
      -> T ∘ expand ∘ torq_hl.conv2d ∘ collapse ∘ T ∘ concat(slice_0(x), ..., slice_KD-1(x))

The NPU's conv2d runs a 3-D convolution once depth is folded into channels. Output depth d reads
input depths ``d·sd + kd·dd`` (kd < KD), so with ``x`` the (already padded) NCDHW input

    slice_kd = x[:, :, kd·dd :: sd][:, :, :Do]                          (strided extract_slice)
    X'[n·Do + d, kd·C + c, h, w] = slice_kd[n, c, d, h, w]               (concat on C, T, collapse)
    W'[o, kd·C + c, kh, kw] = W[o, c, kd, kh, kw]

and ``conv2d(X', W')`` sums the same products as the 3-D convolution, in another order -- exact in
the integer accumulator. Padding is the input zero point's: conv2d pads H/W itself, depth gets
constant planes of it concatenated before and after. Zero-point
folding, bias and rescale are conv2d's (``conv.py``), over all C·KD·KH·KW taps. Grouped Conv3D
is refused with the reason (its groups would interleave with the folded depth).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import numerics
from .. import linalg_view as L
from .. import recognise as R
from .common import Ctx, Fail, Root, bias_to_accumulator, constant, empty, folded_bias, pad_constant, rescale, scalar


@dataclass
class Conv3DMatch:
    conv: object
    x: object               # NCDHW int8 input (unpadded)
    pad: list               # [d_lo, d_hi, h_lo, h_hi, w_lo, w_hi], padded with in_zp
    w: np.ndarray           # [O, C, KD, KH, KW] int
    w_zp: int
    in_zp: int
    bias: np.ndarray        # int64 [O], in the accumulator scale
    dq_scale: np.ndarray    # float32 [O]
    stride: list
    dilation: list


def _transposed(value, perm):
    op = L.producer(value)
    if op is not None and op.name == "linalg.transpose" and L.attr_ints(op, "permutation") == perm:
        return op.operands[0]
    return None


class QConv3D:
    """Q ∘ DQ ∘ T ∘ conv_3d_ndhwc_dhwcf_q ∘ T -> T ∘ expand ∘ torq_hl.conv2d ∘ collapse ∘ T ∘ concat(slices)"""

    def match(self, ctx: Ctx, root: Root):
        m = _per_tensor(ctx, root)
        if m is None:
            m = _per_channel(ctx, root)
        if m and (np.ndim(root.q.scale) or root.q.out_dtype is not np.int8):
            return ctx.fail(m.conv, "output quantization is not per-tensor int8")
        return m

    def rewrite(self, ctx: Ctx, root: Root, m: Conv3DMatch):
        from torch_mlir import ir
        ys = np.float32(root.q.scale)
        ip, loc = ir.InsertionPoint(root.op), m.conv.location
        O, C, KD, KH, KW = m.w.shape
        w2 = np.transpose(m.w, (0, 2, 1, 3, 4)).reshape(O, KD * C, KH, KW)      # W'[o, kd·C + c]
        w_adj = w2 - m.w_zp
        bias = folded_bias(ctx, m.conv, m.bias, m.in_zp, w_adj)
        mults, shift, bias, dq_scale, w_adj = rescale(m.dq_scale, ys, w_adj, bias, root.q)
        x2, (N, Do) = _fold_depth(m, KD, loc, ip)
        Ho, Wo = L.shape_of(root.op.results[0])[3:]
        i8 = ir.RankedTensorType(root.op.results[0].type).element_type
        conv_t = ir.RankedTensorType.get([N * Do, O, Ho, Wo], i8)
        attrs = dict(input_zp=m.in_zp, weight_zp=0, output_zp=int(root.q.zp), output_min=root.q.lo,
                     output_max=root.q.hi, shift_factor=shift, groups=1, pad=[*m.pad[4:], *m.pad[2:4]],
                     stride=list(m.stride[1:]), dilation=list(m.dilation[1:]),
                     round_ties_even=int(numerics.rescale_ties_even(m.dq_scale, ys)),
                     ort_dq_scale=dq_scale, ort_output_scale=[ys])
        from .. import torq_hl
        operands = [empty(conv_t, loc, ip), constant(w_adj, "i16" if m.w_zp != 0 else "i8", loc, ip),
                    constant(np.stack([bias, mults], axis=1).reshape(-1), "i32", loc, ip), x2]
        y = torq_hl.create("conv2d", conv_t, operands, attrs, loc, ip).results[0]
        y = _reshape("tensor.expand_shape", y, [N, Do, O, Ho, Wo], [[0, 1], [2], [3], [4]], loc, ip)
        return _transpose(y, [0, 2, 1, 3, 4], loc, ip).owner


def _per_tensor(ctx: Ctx, root: Root):
    """DQ(i32 conv_3d_ndhwc_dhwcf_q) between NCDHW <-> NDHWC transposes (per-tensor weights)."""
    g = ctx.generic(L.producer(root.value))
    d = R.as_dequant(g) if g is not None else None
    if d is None or np.any(np.asarray(d.zp) != 0):
        return None
    acc = _transposed(g.inputs[d.source_index], [0, 4, 1, 2, 3])
    conv = L.producer(acc) if acc is not None else None
    if conv is None or conv.name != "linalg.conv_3d_ndhwc_dhwcf_q":
        return None
    inp, wv, in_zp_v, w_zp_v, init = conv.operands
    x, w = _transposed(inp, [0, 2, 3, 4, 1]), ctx.const(wv)
    in_zp, w_zp = ctx.const(in_zp_v), ctx.const(w_zp_v)
    if x is None or w is None or in_zp is None or w_zp is None:
        return ctx.fail(conv, "Conv3D input is not an NCDHW transpose, or weights / zero points are not constants")
    x, pad = _unpadded(ctx, x, int(in_zp))
    if isinstance(pad, str):
        return ctx.fail(conv, pad)
    bias = ctx.original_bias(init, conv)
    if bias is None:
        return ctx.fail(conv, "bias is not a compile-time constant")
    if isinstance(bias, Fail):
        return bias
    w = np.transpose(w, (4, 3, 0, 1, 2)).astype(np.int64)     # [KD,KH,KW,C,O] -> [O,C,KD,KH,KW]
    O = w.shape[0]
    bias = np.broadcast_to(bias.reshape(-1, O)[0] if bias.size % O == 0 and bias.size else bias, (O,))
    return Conv3DMatch(conv, x, pad, w, int(w_zp), int(in_zp), bias.astype(np.int64),
                       np.full(O, np.float32(scalar(d.scale, "conv output scale")), np.float32),
                       L.attr_ints(conv, "strides"), L.attr_ints(conv, "dilations"))


def _per_channel(ctx: Ctx, root: Root):
    """f32 conv_3d_ncdhw_fcdhw(pad ∘ DQ(x), DQ(w)) + DQ(bias): torch-mlir's per-channel form."""
    conv = L.producer(root.value)
    if conv is None or conv.name != "linalg.conv_3d_ncdhw_fcdhw":
        return None
    inp, wv, init = conv.operands
    xin, pad = _unpadded(ctx, inp, 0.0)
    if isinstance(pad, str):
        return ctx.fail(conv, pad)
    dq, wq = ctx.dequant(xin), ctx.int_const_of_dequant(wv)
    if dq is None or wq is None:
        return ctx.fail(conv, "input is not dequantized from an integer tensor, or weights not from constants")
    (x, xs, in_zp), (w, ws, w_zp) = dq, wq
    O = w.shape[0]
    ws, w_zp = R.channel_vector(ws, 0, O, np.float32), R.channel_vector(w_zp, 0, O, np.int64)
    if ws is None or w_zp is None or np.any(w_zp != w_zp[0]) or np.ndim(xs) or np.ndim(in_zp):
        return ctx.fail(conv, "scales must be per-tensor (input) and per-output-channel (weights, equal zero points)")
    dq_scale = numerics.dq_scale(float(xs), ws)
    bias = np.zeros(O, np.int64)
    bop = L.producer(init)
    if bop is not None and bop.name == "linalg.broadcast":
        bq = ctx.int_const_of_dequant(bop.operands[0])
        if bq is None:
            return ctx.fail(conv, "bias is not a dequantized integer constant")
        bias = bias_to_accumulator(ctx, conv, bq[0].reshape(-1), np.ravel(bq[2]), np.ravel(bq[1]), dq_scale)
        if isinstance(bias, Fail):
            return bias
    elif ctx.const(init) is None or np.any(ctx.const(init) != 0):
        return ctx.fail(conv, "unsupported accumulator initialisation")
    return Conv3DMatch(conv, x, pad, w.astype(np.int64), int(w_zp[0]), int(in_zp), bias, dq_scale,
                       L.attr_ints(conv, "strides"), L.attr_ints(conv, "dilations"))


def _unpadded(ctx: Ctx, x, in_zp):
    """(input, [d_lo, d_hi, h_lo, h_hi, w_lo, w_hi]) of a tensor.pad on D/H/W with the input zero
    point (0.0 before a dequantized input: the value conv2d and the depth planes pad with), or
    (x, reason)."""
    op = L.producer(x)
    if op is None or op.name != "tensor.pad":
        return x, [0] * 6
    low, high = L.attr_ints(op, "static_low"), L.attr_ints(op, "static_high")
    body = op.regions[0].blocks[0]
    value = pad_constant(ctx, list(body.operations)[-1].operands[0])
    if any(low[:2]) or any(high[:2]) or value is None or value != in_zp:
        return x, f"Conv3D padding (value {value}) is not the input zero point {in_zp} on D/H/W"
    return op.operands[0], [low[2], high[2], low[3], high[3], low[4], high[4]]


def _fold_depth(m: Conv3DMatch, KD: int, loc, ip):
    """X' = collapse(T(concat_C(slice_kd(x padded in depth)))): [N·Do, KD·C, H, W] (module doc)."""
    from torch_mlir import ir
    from torch_mlir.dialects import tensor
    N, C, D, H, W = L.shape_of(m.x)
    elem = ir.RankedTensorType(m.x.type).element_type
    planes = [constant(np.full((N, C, k, H, W), m.in_zp), "i8", loc, ip) for k in m.pad[:1]] + [m.x] + \
             [constant(np.full((N, C, k, H, W), m.in_zp), "i8", loc, ip) for k in m.pad[1:2]]
    planes = [p for p in planes if L.shape_of(p)[2]]
    Dp = D + m.pad[0] + m.pad[1]
    x = planes[0] if len(planes) == 1 else tensor.ConcatOp(ir.RankedTensorType.get([N, C, Dp, H, W], elem), 2,
                                                             planes, loc=loc, ip=ip).result
    sd, dd = m.stride[0], m.dilation[0]
    Do = (Dp - dd * (KD - 1) - 1) // sd + 1
    sl_t = ir.RankedTensorType.get([N, C, Do, H, W], elem)
    slices = [tensor.ExtractSliceOp(sl_t, x, [], [], [], [0, 0, kd * dd, 0, 0], [N, C, Do, H, W],
                                    [1, 1, sd, 1, 1], loc=loc, ip=ip).result for kd in range(KD)]
    cat = slices[0] if KD == 1 else tensor.ConcatOp(ir.RankedTensorType.get([N, KD * C, Do, H, W], elem), 1,
                                                      slices, loc=loc, ip=ip).result
    t = _transpose(cat, [0, 2, 1, 3, 4], loc, ip)
    return _reshape("tensor.collapse_shape", t, [N * Do, KD * C, H, W], [[0, 1], [2], [3], [4]], loc, ip), (N, Do)


def _transpose(x, perm, loc, ip):
    from torch_mlir import ir
    from torch_mlir.dialects import linalg
    shape = L.shape_of(x)
    rtype = ir.RankedTensorType.get([shape[p] for p in perm], ir.RankedTensorType(x.type).element_type)
    with loc, ip:
        t = linalg.transpose(x, outs=[empty(rtype, loc, ip)], permutation=perm)
    return t if isinstance(t, ir.Value) else t.results[0]


def _reshape(name, x, shape, groups, loc, ip):
    from torch_mlir import ir
    i64 = ir.IntegerType.get_signless(64)
    rtype = ir.RankedTensorType.get(list(shape), ir.RankedTensorType(x.type).element_type)
    attrs = {"reassociation": ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, i) for i in g])
                                                for g in groups])}
    if name == "tensor.expand_shape":
        attrs["static_output_shape"] = ir.DenseI64ArrayAttr.get(list(shape))
    return ir.Operation.create(name, results=[rtype], operands=[x], attributes=attrs, loc=loc, ip=ip).results[0]


RULES = [QConv3D()]
