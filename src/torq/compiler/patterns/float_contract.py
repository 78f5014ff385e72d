"""bf16 contractions and pools -> torq_hl (bf16 models; arithmetic in numerics.bf16_arith).

    truncf ∘ conv_2d_nchw_fchw(pad(x), w, init=extf(bias)) [∘ clamp] -> torq_hl.conv2d
    truncf ∘ depthwise_conv_2d_nchw_chw(...) [∘ clamp]                -> torq_hl.depthwise_conv2d
    truncf ∘ matmul / batch_matmul(x, constant w)                     -> torq_hl.fully_connected
    truncf ∘ matmul / batch_matmul(x, y)                              -> torq_hl.matmul
    pooling_nchw_max(pad(x))                                          -> torq_hl.maxpool2d
    divide ∘ pooling_nchw_sum(pad(x))                                 -> torq_hl.avg_pool2d

The conv's f32 init is its bias (``scale_bias``: one f32 per output channel); the truncf to
bf16 and a following Relu / Relu6 / Clip fold into the op (the reference's profile "I:BF16 W:BF16
O:BF16 B:I32" with fp32 clamp bounds in ``output_min`` / ``output_max``). A clamp is recognised
by value: the generic evaluated on all 65536 bf16 inputs equals ``clip(x, f(-inf), f(+inf))``.
"""
from __future__ import annotations

import numpy as np

from ... import numerics
from .. import linalg_view as L
from .common import constant, strip_pad
from .float_elementwise import emit_op

_B = numerics.bf16_arith
_ALL_BF16 = None


def _all_bf16() -> np.ndarray:
    global _ALL_BF16
    if _ALL_BF16 is None:
        x = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
        _ALL_BF16 = x[~np.isnan(x)]
    return _ALL_BF16


def _single_user(value):
    uses = list(value.uses)
    return uses[0].owner if len(uses) == 1 else None


def _unary_generic(ctx, op, src_elem: str, dst_elem: str):
    """``op`` as a one-input all-parallel generic from ``src_elem`` to ``dst_elem`` (its view)."""
    if op is None or op.name != "linalg.generic" or len(op.results) != 1:
        return None
    g = ctx.generic(op)
    if g is None or not g.parallel or g.var_inputs != [0]:
        return None
    if any(np.size(c) != 1 for c in g.consts.values()):        # other inputs: scalars (Clip's bounds)
        return None
    if L.element_type(g.inputs[0]) != src_elem or L.element_type(op.results[0]) != dst_elem:
        return None
    if L.shape_of(g.inputs[0]) != L.shape_of(op.results[0]):
        return None
    return g


def _is_truncf(ctx, op) -> bool:
    g = _unary_generic(ctx, op, "f32", "bf16")
    t = g.tree_or_none() if g is not None else None
    return t is not None and isinstance(t, L.Node) and t.op == "arith.truncf" and isinstance(t.args[0], L.Arg)


def clamp_bounds(ctx, op):
    """(lo, hi) when the bf16 -> bf16 generic ``op`` is a clamp, else None."""
    g = _unary_generic(ctx, op, "bf16", "bf16")
    if g is None or g.tree_or_none() is None:
        return None
    x = _all_bf16()
    shape = (x.size,) + (1,) * (len(g.out_shape) - 1)
    try:
        y = g.evaluate({0: x.reshape(shape)}, shape).ravel()
    except (NotImplementedError, ValueError):
        return None
    lo, hi = float(y[np.argmin(x)]), float(y[np.argmax(x)])
    if not np.array_equal(y, np.clip(x, lo, hi)):
        return None
    return lo, hi


def _fused_tail(ctx, op):
    """(last op of the fused chain, result type, lo, hi): conv f32 -> [truncf] -> [clamp]."""
    last, lo, hi = op, -np.inf, np.inf
    user = _single_user(op.results[0])
    if user is not None and _is_truncf(ctx, user):
        last = user
        nxt = _single_user(user.results[0])
        bounds = clamp_bounds(ctx, nxt) if nxt is not None else None
        if bounds is not None:
            last, (lo, hi) = nxt, bounds
    return last, lo, hi


def _bits(v: float) -> int:
    return int(np.array([v], np.float32).view(np.int32)[0])


def _float_attrs(lo, hi, **extra):
    return dict(input_zp=0, weight_zp=0, output_zp=0, output_min=_bits(lo), output_max=_bits(hi),
                shift_factor=0, round_ties_even=0, ort_dq_scale=[], ort_output_scale=[], **extra)


def _bias(ctx, op, init, channels: int, axis: int):
    """The f32 per-channel bias a contraction's init holds (0 for a zero fill), or None."""
    c = ctx.const(init)
    if c is None:
        return None
    c = np.asarray(c, np.float32)
    if c.ndim == 0:
        return np.full(channels, c, np.float32)
    vec = np.moveaxis(c, axis, 0).reshape(channels, -1)
    if not np.all(vec == vec[:, :1]):
        return None
    return vec[:, 0].copy()


def lower_conv(ctx, op):
    """conv_2d_nchw_fchw / depthwise_conv_2d_nchw_chw on bf16 -> torq_hl.(depthwise_)conv2d."""
    from torch_mlir import ir
    x, w = op.operands[0], op.operands[1]
    if L.element_type(x) != "bf16" or L.element_type(w) != "bf16":
        return ctx.fail(op, "a float convolution whose operands are not bf16")
    wc = ctx.const(w)
    if wc is None:
        return ctx.fail(op, "a bf16 convolution with non-constant weights")
    depthwise = op.name == "linalg.depthwise_conv_2d_nchw_chw"
    out_ch = L.shape_of(op.results[0])[1]
    bias = _bias(ctx, op, op.operands[2], out_ch, 1)
    if bias is None:
        return ctx.fail(op, "a bf16 convolution whose accumulator init is not a per-channel bias")
    src, pad, pad_value = strip_pad(x)
    if pad_value is not None and float(np.asarray(ctx.const(pad_value))) != 0.0:
        return ctx.fail(op, "a bf16 convolution padded with a non-zero value")
    last, lo, hi = _fused_tail(ctx, op)
    ip = ir.InsertionPoint(last)
    if depthwise:
        wc = wc.reshape(wc.shape[0], 1, *wc.shape[1:])
    weights = _bf16_constant(wc, last.location, ip)
    sb = constant(bias, "f32", last.location, ip)
    groups = out_ch if depthwise else 1
    attrs = _float_attrs(lo, hi, groups=groups, pad=pad, stride=L.attr_ints(op, "strides"),
                         dilation=L.attr_ints(op, "dilations"))
    name = "depthwise_conv2d" if depthwise else "conv2d"
    return last, emit_op(name, last, [weights, sb, src], attrs, result_type=_typed(op, last))


def _typed(op, last):
    """The fused op's result type: the contraction's shape in the chain end's element type."""
    from torch_mlir import ir
    elem = ir.RankedTensorType(last.results[0].type).element_type
    return ir.RankedTensorType.get(list(L.shape_of(op.results[0])), elem)


def typed_constant(values, elem: str, loc, ip):
    """arith.constant of float values as ``elem`` ("bf16" or "f32")."""
    if elem == "bf16":
        return _bf16_constant(values, loc, ip)
    return constant(np.asarray(values, np.float32), "f32", loc, ip)


def _bf16_constant(values, loc, ip):
    """arith.constant of bf16 values (float32 holding bf16) -- built from their bit patterns."""
    from torch_mlir import ir
    arr = np.ascontiguousarray(numerics.to_bf16(np.asarray(values, np.float32)))
    bits = (arr.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
    t = ir.RankedTensorType.get(list(arr.shape), ir.BF16Type.get())
    attr = ir.DenseElementsAttr.get(np.ascontiguousarray(bits), type=t)
    return ir.Operation.create("arith.constant", results=[t], attributes={"value": attr}, loc=loc, ip=ip).results[0]


def lower_matmul(ctx, op):
    """matmul [M,K]x[K,N] / batch_matmul [B,M,K]x[B,K,N] on bf16 -> fully_connected | matmul."""
    from torch_mlir import ir
    a, b = op.operands[0], op.operands[1]
    if L.element_type(a) != "bf16" or L.element_type(b) != "bf16":
        return ctx.fail(op, "a float matmul whose operands are not bf16")
    init = ctx.const(op.operands[2])
    if init is None or np.any(np.asarray(init) != 0):
        return ctx.fail(op, "a bf16 matmul accumulating onto a non-zero init")
    last, lo, hi = _fused_tail(ctx, op)
    w = _constant_weight(ctx, b)
    if w is not None:
        ip = ir.InsertionPoint(last)
        weights = _bf16_constant(np.ascontiguousarray(w.T), last.location, ip)
        sb = constant(np.zeros(w.shape[1], np.float32), "f32", last.location, ip)
        return last, emit_op("fully_connected", last, [weights, sb, a], _float_attrs(lo, hi),
                             result_type=_typed(op, last))
    attrs = dict(output_zp=0, output_min=_bits(lo), output_max=_bits(hi), shift_factor=0, scale_bias=[],
                 ort_dq_scale=[], ort_output_scale=[])
    return last, emit_op("matmul", last, [a, b], attrs, result_type=_typed(op, last))


def _constant_weight(ctx, b):
    """The [K, N] constant a matmul's right operand holds for every batch, or None. A weight
    broadcast over the batch (torch-mlir's MatMul of a rank-3 activation: a copy generic or a
    linalg.broadcast) is read at its source: folding the broadcast would build B copies."""
    shape = L.shape_of(b)
    if len(shape) == 2:
        return ctx.const(b)
    op = L.producer(b)
    src = None
    if op is not None and op.name == "linalg.broadcast" and L.attr_ints(op, "dimensions") == [0]:
        src = op.operands[0]
    elif op is not None and op.name == "linalg.generic" and len(op.operands) == 2:
        g = ctx.generic(op, force_var=(0,))
        t = g.tree_or_none() if g is not None else None
        if isinstance(t, L.Arg) and L.shape_of(op.operands[0]) == shape[1:]:
            src = op.operands[0]           # yields its input: a broadcast along the batch
    if src is not None:
        return ctx.const(src)
    if shape[0] == 1:
        c = ctx.const(b)
        return None if c is None else c[0]
    return None


def lower_maxpool(ctx, op):
    x, window = op.operands[0], op.operands[1]
    if L.element_type(x) not in ("bf16", "f32"):
        return ctx.fail(op, "a max pool on integers outside a quantized chain")
    init = ctx.const(op.operands[2])
    if init is None or not np.all(np.isneginf(np.asarray(init, np.float64))):
        return ctx.fail(op, "a float max pool whose init is not -inf")
    src, pad, pv = strip_pad(x)
    if pv is not None and not np.isneginf(float(np.asarray(ctx.const(pv)))):
        src, pad = x, [0, 0, 0, 0]        # padded with a finite value: keep the pad op
    attrs = dict(kernel=list(L.shape_of(window)), stride=L.attr_ints(op, "strides"), pad=pad,
                 dilation=L.attr_ints(op, "dilations"))
    return op, emit_op("maxpool2d", op, [src], attrs)


def lower_avgpool(ctx, op):
    """pooling_nchw_sum followed by its per-position divide -> avg_pool2d (count inferred)."""
    x, window = op.operands[0], op.operands[1]
    init = ctx.const(op.operands[2])
    if init is None or np.any(np.asarray(init) != 0):
        return ctx.fail(op, "a float sum pool whose init is not 0")
    div = _single_user(op.results[0])
    g = ctx.generic(div) if div is not None else None
    if g is None or not g.parallel or g.var_inputs != [0]:
        return ctx.fail(op, "a float sum pool without its divide")
    src, pad, pv = strip_pad(x)
    if pv is not None and float(np.asarray(ctx.const(pv))) != 0.0:
        return ctx.fail(op, "a float average pool padded with a non-zero value")
    kernel, stride = list(L.shape_of(window)), L.attr_ints(op, "strides")
    include = _count_mode(g, L.shape_of(src), kernel, stride, pad)
    if include is None:
        return ctx.fail(div, "a float sum pool divided by something other than its window count")
    attrs = dict(input_zp=0, output_zp=0, output_min=0, output_max=0, shift_factor=0, scale_bias=[],
                 kernel=kernel, stride=stride, pad=pad, count_include_pad=int(include), round_ties_even=0,
                 ort_input_scale=[], ort_output_scale=[], ort_zp_shift=0)
    return div, emit_op("avg_pool2d", div, [src], attrs)


def _count_mode(g, in_shape, kernel, stride, pad):
    """1 / 0 when the divide generic divides by the count including / excluding the padding."""
    for include in (True, False):
        counts = window_counts(in_shape[2:], kernel, stride, pad, include)
        try:
            y = g.evaluate({0: np.broadcast_to(counts, g.out_shape).astype(np.float32)}, g.out_shape)
        except (NotImplementedError, ValueError):
            return None
        if np.all(y == 1):
            return include
    return None


def window_counts(hw, kernel, stride, pad, include: bool) -> np.ndarray:
    """[OH, OW] number of positions each pooling window averages (padding counted or not)."""
    axes = []
    for size, k, s, lo, hi in ((hw[0], kernel[0], stride[0], pad[2], pad[3]),
                               (hw[1], kernel[1], stride[1], pad[0], pad[1])):
        n_out = (size + lo + hi - k) // s + 1
        start = np.arange(n_out) * s - lo
        axes.append(np.full(n_out, k) if include else np.minimum(start + k, size) - np.maximum(start, 0))
    return np.outer(axes[0], axes[1]).astype(np.float32)


NAMED = {"linalg.conv_2d_nchw_fchw": lower_conv, "linalg.depthwise_conv_2d_nchw_chw": lower_conv,
         "linalg.matmul": lower_matmul, "linalg.batch_matmul": lower_matmul,
         "linalg.pooling_nchw_max": lower_maxpool, "linalg.pooling_nchw_sum": lower_avgpool}
