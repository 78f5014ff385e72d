"""Quantized pools.

    Q ∘ pooling_nchw_max ∘ [pad] ∘ DQ             -> torq_hl.maxpool2d   (same in/out qparams;
                                                     ceil_mode=1 as a high-side pad)
                                                  -> maxpool2d, table    (requantizing MaxPool:
                                                     max commutes with the monotonic DQ, so the
                                                     rescale is a 256-entry lookup of Q ∘ DQ)
    Q ∘ divf(N) ∘ pooling_nchw_sum ∘ [pad] ∘ DQ   -> torq_hl.avg_pool2d  (AveragePool with
                                                     count_include_pad=1, GlobalAveragePool;
                                                     no divf when the window is 1x1; or
                                                     count_include_pad=0: N per position)
    pooling_nchw_max(int8) ∘ [pad(int min)]       -> torq_hl.maxpool2d   (QOperator MaxPool, which
                                                     ORT keeps as a plain int8 MaxPool)
    Q ∘ divf(n) ∘ sum over axes R ∘ DQ            -> torq_hl.avg_pool2d  (ReduceMean over any
                                                     axes, attribute or input form: over H, W as is;
                                                     else x transposed so R comes last, reshaped to
                                                     [1, kept, 1, n], one [1, n] window; float
                                                     means chained under one Q: one average)
"""
from __future__ import annotations

import numpy as np

from ... import numerics
from .. import linalg_view as L
from .. import recognise as R
from .common import Ctx, Fail, Root, activation_dtype, emit, lookup_table, pad_constant, scalar, strip_pad


def _window(op):
    return list(L.shape_of(op.operands[1]))


def _tight_pad(op, x, pad) -> list[int]:
    """[l, r, t, b] with the high sides cut to what the declared output reads.

    torch-mlir lowers MaxPool ceil_mode=1 by padding the high sides with a whole stride of -inf
    and declaring the ceil output size; the windows never reach part of that padding, and a
    kernel computing its output size from the padded input would get one row/column too many."""
    (kh, kw), (sh, sw), (dh, dw) = _window(op), L.attr_ints(op, "strides"), L.attr_ints(op, "dilations")
    h, w = L.shape_of(x)[-2:]
    oh, ow = L.shape_of(op.results[0])[-2:]
    l, r, t, b = pad
    r = min(r, max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - w - l))
    b = min(b, max(0, (oh - 1) * sh + (kh - 1) * dh + 1 - h - t))
    return [l, r, t, b]


class QMaxPool:
    """Q ∘ pooling_nchw_max ∘ pad ∘ DQ -> torq_hl.maxpool2d"""

    def match(self, ctx: Ctx, root: Root):
        op = L.producer(root.value)
        if op is None or op.name != "linalg.pooling_nchw_max":
            return None
        xin, pad, padv = strip_pad(op.operands[0])
        if padv is not None and pad_constant(ctx, padv) not in (-np.inf, float("-inf")):
            return ctx.fail(op, "MaxPool padding is not -inf")
        dq = ctx.dequant(xin)
        if dq is None:
            return ctx.fail(op, "MaxPool input is not dequantized from an integer tensor")
        x, xs, xz = dq
        if np.ndim(xs) or np.ndim(xz) or not activation_dtype(L.np_dtype(x.type)) \
                or not activation_dtype(root.q.out_dtype):
            return ctx.fail(op, "MaxPool needs per-tensor int8 / int16 input and output")
        if np.asarray(xs) <= 0:
            return ctx.fail(op, "MaxPool input scale is not positive")
        same = xs == root.q.scale and xz == root.q.zp and L.np_dtype(x.type) is root.q.out_dtype
        if not same and L.np_dtype(x.type) is np.int16:
            return ctx.fail(op, "an int16 MaxPool that requantizes is not lowered")
        return (op, x, pad, None if same else L.producer(op.operands[0] if padv is None else xin))

    def rewrite(self, ctx: Ctx, root: Root, m):
        op, x, pad, dq_op = m
        attrs = dict(kernel=_window(op), stride=L.attr_ints(op, "strides"), pad=_tight_pad(op, x, pad),
                     dilation=L.attr_ints(op, "dilations"))
        if dq_op is None:
            return emit("maxpool2d", root, [x], attrs, op)
        pooled = emit("maxpool2d", root, [x], attrs, op, result_type=x.type, shape_of=op.results[0])
        table = lookup_table(ctx.generic(dq_op), ctx.generic(root.op))
        return emit("table", root, [pooled.results[0]], dict(table=table), op)


class QAvgPool:
    """Q ∘ divf(count) ∘ pooling_nchw_sum ∘ pad ∘ DQ -> torq_hl.avg_pool2d"""

    def match(self, ctx: Ctx, root: Root):
        div = L.producer(root.value)
        g = ctx.generic(div)
        hit = R.as_scalar_op(g, "arith.divf") if g is not None else None
        if hit is not None:
            pool, count = L.producer(g.inputs[hit[0]]), np.asarray(hit[1]).ravel()
        elif _per_position_divisor(g):   # count_include_pad=0: the divisor is built from linalg.index
            return self._exclude_pad(ctx, root, g)
        else:   # a 1x1 window: torch-mlir folds the division by 1 away
            pool, count = div, np.ones(1)
        if _summed_dims(pool):
            return self._reduce_mean(ctx, root, pool, count)
        if pool is None or pool.name != "linalg.pooling_nchw_sum":
            return None
        kernel = _window(pool)
        if count.size == 0 or not np.all(count == count[0]) or count[0] != kernel[0] * kernel[1]:
            return ctx.fail(pool, "AveragePool divisor is not the window size (count_include_pad=0 with padding)")
        if L.attr_ints(pool, "dilations") != [1, 1]:
            return ctx.fail(pool, "dilated AveragePool")
        xin, pad, padv = strip_pad(pool.operands[0])
        if padv is not None and pad_constant(ctx, padv) != 0.0:
            return ctx.fail(pool, "AveragePool padding is not zero")
        return _with_include_pad(_averaging(ctx, root, pool, xin, "AveragePool", pad, kernel), 1)

    def _exclude_pad(self, ctx, root, g):
        """AveragePool count_include_pad=0: the divisor generic must give, per output position,
        the number of window cells inside the unpadded input (evaluated, then checked)."""
        pool = L.producer(g.inputs[g.var_inputs[0]])
        kernel, stride = _window(pool), L.attr_ints(pool, "strides")
        xin, pad, padv = strip_pad(pool.operands[0])
        if L.attr_ints(pool, "dilations") != [1, 1] or (padv is not None and pad_constant(ctx, padv) != 0.0):
            return ctx.fail(pool, "dilated AveragePool, or padding that is not zero")
        try:
            recip = g.evaluate({g.var_inputs[0]: np.ones(L.shape_of(pool.results[0]), np.float32)})
        except NotImplementedError as e:
            return ctx.fail(pool, f"AveragePool divisor cannot be read ({e})")
        hw = L.shape_of(xin)[-2:]
        expect = _valid_counts(hw, kernel, stride, pad, L.shape_of(pool.results[0])[-2:])
        if not np.array_equal(np.rint(1 / recip[0, 0]), expect):
            return ctx.fail(pool, "AveragePool divisor is neither the window size nor the valid-cell count")
        return _with_include_pad(_averaging(ctx, root, pool, xin, "AveragePool", pad, kernel), 0)

    def _reduce_mean(self, ctx, root, red, count):
        chain = _mean_chain(ctx, red, count)
        if isinstance(chain, Fail):
            return chain
        src, dims = chain
        shape = L.shape_of(src)
        kept = [d for d in range(len(shape)) if d not in dims]
        n = int(np.prod([shape[d] for d in dims]))
        if len(shape) == 4 and dims == [2, 3]:
            view, kernel = None, list(shape[2:])
        else:        # kept axes first, averaged ones last: [1, Πkept, 1, n], one [1, n] window
            view, kernel = (kept + dims, [1, int(np.prod([shape[d] for d in kept])), 1, n]), [1, n]
        m = _averaging(ctx, root, red, src, "ReduceMean", [0, 0, 0, 0], kernel)
        return m if isinstance(m, Fail) else m + (1, view)

    def rewrite(self, ctx: Ctx, root: Root, m):
        pool, x, xs, xz, pad, kernel, include_pad, *view = m
        if view and view[0] is not None:
            x = _reshaped(x, *view[0], pool.location, root.op)
        ys = float(root.q.scale)
        n = kernel[0] * kernel[1]
        mult, shift = numerics.avgpool_multiplier(xs, ys, n)
        stride = L.attr_ints(pool, "strides") if "strides" in pool.attributes else [1, 1]
        attrs = dict(input_zp=xz, output_zp=int(root.q.zp), output_min=root.q.lo, output_max=root.q.hi,
                     shift_factor=shift, scale_bias=[-n * xz, mult], kernel=kernel,
                     stride=stride, pad=pad, count_include_pad=include_pad, round_ties_even=1,
                     ort_input_scale=[xs], ort_output_scale=[ys], ort_zp_shift=ctx.ort_zp_shift)
        return emit("avg_pool2d", root, [x], attrs, pool)


def _mean_chain(ctx: Ctx, red, count):
    """(source value, its averaged axes) of ``divf(count) ∘ sum`` and of float means chained
    under it (ORT leaves QDQ ReduceMeans in float: ``x.mean(3).mean(2)`` is one DQ, two means,
    one Q), or a Fail when a divisor is not the number of elements its sum adds up."""
    src, dims = red.operands[0], _summed_dims(red)
    shape = L.shape_of(src)
    n = int(np.prod([shape[d] for d in dims]))
    if count.size != 1 or count[0] != n:
        return ctx.fail(red, f"ReduceMean divisor {count.ravel()[0]:g} is not the {n} averaged elements")
    g = ctx.generic(L.producer(src))
    hit = R.as_scalar_op(g, "arith.divf") if g is not None else None
    inner = L.producer(g.inputs[hit[0]]) if hit is not None else None
    if not _summed_dims(inner):
        return src, dims
    below = _mean_chain(ctx, inner, np.asarray(hit[1]).ravel())
    if isinstance(below, Fail):
        return below
    src, first = below
    rank = len(L.shape_of(src))
    outer = [d for d in range(rank) if d not in first] if len(shape) < rank else list(range(rank))
    return src, sorted(set(first) | {outer[d] for d in dims})


def _reshaped(x, perm, shape, loc, before):
    """x transposed by ``perm`` (when it moves anything), then reshaped to ``shape`` (data movement)."""
    from torch_mlir import ir
    from torch_mlir.dialects import linalg, tensor

    from .common import constant, empty
    ip = ir.InsertionPoint(before)
    elem = ir.RankedTensorType(x.type).element_type
    if perm != sorted(perm):
        src = L.shape_of(x)
        t = ir.RankedTensorType.get([src[p] for p in perm], elem)
        with loc, ip:
            x = linalg.transpose(x, outs=[empty(t, loc, ip)], permutation=perm)
    target = constant(np.asarray(shape, np.int64), "i64", loc, ip)
    return tensor.ReshapeOp(ir.RankedTensorType.get(list(shape), elem), x, target, loc=loc, ip=ip).result


def _with_include_pad(m, include_pad: int):
    """An _averaging match with its count_include_pad appended (a Fail passes through)."""
    return m if isinstance(m, Fail) else m + (include_pad,)


def _averaging(ctx: Ctx, root: Root, op, x_f, what: str, pad, kernel):
    """Match of an average over windows of DQ(x): (op, x, xs, xz, pad, kernel)."""
    dq = ctx.dequant(x_f)
    if dq is None:
        return ctx.fail(op, f"{what} input is not dequantized from an integer tensor")
    x, xs, xz = dq
    if np.ndim(root.q.scale) or not activation_dtype(root.q.out_dtype) or not activation_dtype(L.np_dtype(x.type)):
        return ctx.fail(op, "input and output quantization are not per-tensor int8 / int16")
    return (op, x, float(scalar(xs, "input scale")), int(scalar(xz, "input zero point")), pad, kernel)


def _per_position_divisor(g) -> bool:
    """A one-input generic over a pooling_nchw_sum whose body reads linalg.index (torch-mlir's
    count_include_pad=0 divisor)."""
    if g is None or len(g.var_inputs) != 1 or L.op_name(L.producer(g.inputs[g.var_inputs[0]])) != "linalg.pooling_nchw_sum":
        return False
    return any(o.operation.name == "linalg.index" for o in g.block.operations)


def _valid_counts(hw, kernel, stride, pad, out_hw) -> np.ndarray:
    """Per output position: window cells inside the unpadded [H, W] input ([l, r, t, b] pads)."""
    def axis(n, k, s, lo, out):
        start = np.arange(out) * s - lo
        return np.minimum(start + k, n) - np.maximum(start, 0)
    rows = axis(hw[0], kernel[0], stride[0], pad[2], out_hw[0])
    cols = axis(hw[1], kernel[1], stride[1], pad[0], out_hw[1])
    return np.outer(rows, cols).astype(np.float64)


def _summed_dims(op) -> list[int] | None:
    """The summed axes of a linalg.generic adding up one float tensor read as is (torch-mlir's
    ReduceMean numerator, any axes), else None."""
    if op is None or op.name != "linalg.generic" or len(op.operands) != 2:
        return None
    its = ["reduction" if "reduction" in str(a) else "parallel" for a in op.attributes["iterator_types"]]
    dims = [d for d, t in enumerate(its) if t == "reduction"]
    from torch_mlir import ir
    identity = ir.AffineMapAttr(op.attributes["indexing_maps"][0]).value == ir.AffineMap.get_identity(len(its))
    body = list(op.regions[0].blocks[0].operations)
    args = list(op.regions[0].blocks[0].arguments)
    if not dims or not identity or len(its) != len(L.shape_of(op.operands[0])):
        return None
    ok = (len(body) == 2 and body[0].operation.name == "arith.addf"
          and {hash(v) for v in body[0].operands} == {hash(a) for a in args})
    return dims if ok else None


class IntMaxPool:
    """pooling_nchw_max(int8, init = fill(int min)) ∘ pad(int min) -> torq_hl.maxpool2d"""

    def match_op(self, ctx: Ctx, op):
        if op.name != "linalg.pooling_nchw_max" or L.np_dtype(op.results[0].type) is not np.int8:
            return None
        x, pad, padv = strip_pad(op.operands[0])
        low = np.iinfo(np.int8).min
        if padv is not None and pad_constant(ctx, padv) != low:
            return ctx.fail(op, "int8 MaxPool padding is not -128")
        init = ctx.const(op.operands[2])
        if init is None or np.any(init != low):
            return ctx.fail(op, "int8 MaxPool does not start from -128")
        return x, pad

    def rewrite_op(self, ctx: Ctx, op, m):
        x, pad = m
        attrs = dict(kernel=_window(op), stride=L.attr_ints(op, "strides"), pad=_tight_pad(op, x, pad),
                     dilation=L.attr_ints(op, "dilations"))
        return emit("maxpool2d", Root(op, None, None), [x], attrs, op)


RULES = [QMaxPool(), QAvgPool()]
OP_RULES = [IntMaxPool()]
