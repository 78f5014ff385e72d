"""NSS kernels of the torq_hl ops: one factory per op, ``make(step, rtype) -> fn(args, rounding)``.

Every rounding is a ``torq.numerics`` call. Rescaling ops (conv, fully connected, add, mul,
average pool) also carry ``fn.check(args, out, rounding)``: the per-op check ``verify`` uses,
which judges the output that was *executed* (the fused / compiled / table fast path) against
the plain numpy formula of the same mode on the same inputs, and measures how the native NPU
rounding differs from ONNX Runtime's there (and why).
"""
from __future__ import annotations

import numpy as np

from .. import numerics
from ..errors import TorqError
from . import int16, kernels


def _diff(native, ort):
    d = np.abs(native.astype(np.int64) - ort.astype(np.int64))
    mask = d > 0
    return mask, int(d.max(initial=0))


def _checked(fn, reference, causes):
    """Attach ``fn.check(args, out, rounding, ort=None) -> (size, native-vs-ort differing, max LSB,
    causes, mismatches)`` to the step function ``fn`` (whatever fast path it takes).

    ``reference(args, rounding)`` is the plain numpy formula of a mode; ``mismatches`` counts
    elements where the executed ``out`` differs from the reference of its own mode (must be 0);
    the native-vs-ort comparison uses ``out`` for the executed mode and the reference for the
    other; given ``ort``, ONNX Runtime's own output on the same inputs, it is the executed
    ``out`` (either mode) against that: what the run computed is what is judged (an ``ort``-mode
    int16 output is ORT's float path with one rounding, itself within the bound);
    ``causes(args, mask, native, ort)`` classifies the differing elements (tie / near-tie /
    other; for int16 activations float / overflow / other, ``numerics.int16``)."""
    def check(args, out, rounding, ort=None):
        own = reference(args, rounding)
        mismatches = int(np.count_nonzero(np.asarray(own) != np.asarray(out)))
        native = out if rounding == "native" or ort is not None else reference(args, "native")
        if ort is None:
            ort = out if rounding == "ort" else reference(args, "ort")
        native, ort = np.asarray(native), np.asarray(ort).reshape(np.shape(native))
        mask, mx = _diff(native, ort)
        return np.size(out), int(mask.sum()), mx, (causes(args, mask, native, ort) if mask.any() else {}), mismatches
    fn.check = check
    return fn


# ---------------------------------------------------------------- torq_hl kernels

def _rescale(acc, attrs, requant, scale_bias, rounding, rtype):
    """ACT stage shared by conv / fc: native fixed point or ORT float requant (per channel, axis 1;
    ``requant`` is ORT's float32 scale fl32(dq_scale / y_scale)).

    ``acc`` an int64 accumulator, or a ``kernels.AccParts`` (exact accumulator in two parts, fused
    requantisation with the same results)."""
    mult = scale_bias[1::2]
    even = bool(attrs.get("round_ties_even", 0))
    if isinstance(acc, kernels.AccParts):
        if rounding == "native":
            return numerics.act_native_parts(
                acc.acc, acc.extra, mult, attrs["shift_factor"], attrs["output_zp"], attrs["output_min"],
                attrs["output_max"], acc_bound=acc.acc_bound, bound=acc.bound, axis=1, out_dtype=rtype,
                ties_even=even)
        return numerics.requant_ort_parts(
            acc.acc, acc.extra, requant, attrs["output_zp"], attrs["output_min"],
            attrs["output_max"], acc_bound=acc.acc_bound, bound=acc.bound, axis=1, out_dtype=rtype)
    if rounding == "native":
        y = numerics.act_native(acc, mult, attrs["shift_factor"], attrs["output_zp"],
                                   attrs["output_min"], attrs["output_max"], axis=1, ties_even=even)
    else:
        y = numerics.requant_ort(acc, requant, attrs["output_zp"],
                                    attrs["output_min"], attrs["output_max"], axis=1)
    return np.asarray(y).astype(rtype)


def _with_acc(parts_fn, a, rtype, wide=None, ref_parts=None):
    """Step function for accumulate-then-rescale ops (fused rescale of the two-part accumulator),
    checked against the unfused numpy rescale of the int64 accumulator.

    ``parts_fn(args)`` returns the accumulator as ``kernels.AccParts``; ``ref_parts(args)`` an
    independent one for the check (int16: the direct product, not the byte planes; default
    ``parts_fn``); ``wide(args)`` the (abs_acc, terms) of an op with int16 activations, which ORT
    runs in float (``int16.py``)."""
    ref_parts = ref_parts or parts_fn
    ys = float(a["ort_output_scale"][0])
    requant = numerics.ort_requant_scale(a["ort_dq_scale"], ys)

    def is_wide(args):
        return wide is not None and numerics.int16_involved(args[-1].dtype, np.dtype(rtype))

    def fn(args, rounding):
        parts = parts_fn(args)
        if is_wide(args) and rounding == "ort":          # ORT's float path (the NPU's ACT is int8's)
            return int16.rescale(parts.int64(axis=1), a, args[1].astype(np.int64), rounding, rtype)
        if np.dtype(rtype).kind not in "iu":
            return _rescale(parts.int64(axis=1), a, requant, args[1].astype(np.int64), rounding, rtype)
        return _rescale(parts, a, requant, args[1].astype(np.int64), rounding, rtype)

    def reference(args, rounding):
        if is_wide(args):
            return int16.rescale(ref_parts(args).int64(axis=1), a, args[1].astype(np.int64), rounding, rtype)
        return _rescale(ref_parts(args).int64(axis=1), a, requant, args[1].astype(np.int64), rounding, rtype)

    def causes(args, mask, native, ort):
        acc = ref_parts(args).int64(axis=1)
        if is_wide(args):
            return int16.causes(acc, *wide(args), a, args[1].astype(np.int64), native, ort)
        chan = np.nonzero(mask)[1] if acc.ndim > 1 else np.zeros(int(mask.sum()), int)
        dq = a["ort_dq_scale"]
        return numerics.explain_diffs(acc[mask], [((float(dq[c]),), (ys,)) for c in chan])
    return _checked(fn, reference, causes)


def _cached_plan(make):
    """plan(w, sb): ``make(w, sb)`` built once and reused while the weight and scale_bias operands
    are the same arrays (program constants: the program's lifetime) or hold the same values
    (weights computed at run time from constants). Safe in concurrent runs: the cached
    (w, sb, plan) triple is replaced as a whole."""
    cache = [(None, None, None)]

    def same(a, b):
        return a is b or (b is not None and a.shape == b.shape and a.dtype == b.dtype
                          and np.array_equal(a, b))

    def plan(w, sb):
        cw, csb, p = cache[0]
        if not (same(w, cw) and same(sb, csb)):
            p = make(w, sb)
        cache[0] = (w, sb, p)
        return p
    return plan


def _conv(st, rtype):
    a = st.attrs
    geometry = (list(a["pad"]), a["input_zp"], list(a["stride"]), list(a["dilation"]), a["groups"])
    plan = _cached_plan(lambda w, sb: kernels.ConvPlan(w, sb[0::2].astype(np.int64), *geometry))
    planes = _cached_plan(lambda w, sb: kernels.ByteConv(w, sb[0::2].astype(np.int64), *geometry))

    def parts_fn(args, direct=False):
        w, sb, x = args
        one_d = x.ndim == 3                              # Conv1D runs as 2-D with H = 1
        chosen = planes if x.dtype == np.int16 and not direct else plan  # int16: the two byte planes
        p = chosen(w, sb).parts(x[:, :, None, :] if one_d else x, kernels.thread_workspace())
        return p._replace(acc=p.acc[:, :, 0, :]) if one_d else p

    def wide(args):
        w, sb, x = args
        one_d = x.ndim == 3
        abs_acc = planes(w, sb).abs_acc(x[:, :, None, :] if one_d else x, a["input_zp"])
        return (abs_acc[:, :, 0, :] if one_d else abs_acc), int(np.prod(w.shape[1:]))
    return _with_acc(parts_fn, a, rtype, wide, ref_parts=lambda args: parts_fn(args, direct=True))


def _fc(st, rtype):
    a = st.attrs
    plan = _cached_plan(lambda w, sb: kernels.FcPlan(w, sb[0::2].astype(np.int64)))
    planes = _cached_plan(lambda w, sb: kernels.ByteFc(w, sb[0::2].astype(np.int64), a["input_zp"]))

    def parts_fn(args, direct=False):
        w, sb, x = args
        return (planes if x.dtype == np.int16 and not direct else plan)(w, sb).parts(x)

    def wide(args):
        w, sb, x = args
        return planes(w, sb).abs_acc(x, a["input_zp"]), int(w.shape[1])
    return _with_acc(parts_fn, a, rtype, wide, ref_parts=lambda args: parts_fn(args, direct=True))


def _binary_ort(recipe, k, x, y, sa, za, sb, zb, sc, a):
    """An ORT binary recipe (QLinearAdd, float Add, QLinearMul) run in ORT's own domain: shifted
    back by k = 128 when the model's uint8 activations were made int8 (compiler/frontend/signedness.py)."""
    return recipe(x.astype(np.int64) + k, y.astype(np.int64) + k, sa, za + k, sb, zb + k, sc,
                  a["output_zp"] + k, a["output_min"] + k, a["output_max"] + k) - k


_PAIR_TABLE_MIN = 1 << 14       # outputs from which a binary byte op runs through its table


def _pair_table(fn, direct=()):
    """Run a binary op ``fn(args, rounding)`` through a 256 x 256 table of ``fn`` itself when both
    operands are same-shaped int8 / uint8 arrays with at least _PAIR_TABLE_MIN elements (except
    in the rounding modes ``direct``, where ``fn`` is a compiled loop already faster than a
    lookup).

    The result of such an op depends only on the pair of input bytes (its recipes are
    elementwise, and ORT's broadcast span mode is "general" for any same-shape pair), so
    evaluating ``fn`` once over all 65536 pairs and looking outputs up gives the identical
    result in one cheap pass. Tables are kept per op, rounding mode and input dtypes."""
    tables = {}

    def run(args, rounding):
        x, y = args
        if (rounding in direct or x.shape != y.shape or x.size < _PAIR_TABLE_MIN
                or x.dtype not in kernels.BYTE_TYPES or y.dtype not in kernels.BYTE_TYPES):
            return fn(args, rounding)
        key = (rounding, x.dtype, y.dtype)
        if key not in tables:
            gx, gy = kernels.byte_grid(x.dtype), kernels.byte_grid(y.dtype)
            tables[key] = np.ascontiguousarray(fn([np.repeat(gx, 256), np.tile(gy, 256)], rounding))
        return kernels.pair_lookup(x, y, tables[key])
    return run


def _int64_args(fn):
    """``fn`` on int64 copies of its operands: the plain numpy path of the binary recipes (their
    compiled loops and lookup tables take 8/16-bit operands only)."""
    return lambda args, rounding: fn([np.asarray(v).astype(np.int64) for v in args], rounding)


def _add(st, rtype):
    a = st.attrs
    za, zb = (int(v) for v in a["input_zps"])
    ma, mb = (int(v) for v in a["weights"])
    sa, sb_ = (np.float32(v) for v in a["ort_input_scales"])
    sc = np.float32(a["ort_output_scale"][0])
    even = bool(a.get("round_ties_even", 0))

    def fn(args, rounding):
        x, y = args
        if rounding == "native":
            out = numerics.add_native_mults(x, y, za, zb, ma, mb, a["shift_factor"], a["output_zp"],
                                            a["output_min"], a["output_max"], out_dtype=rtype, ties_even=even,
                                            zp_after=a["ort_kernel"] != "QLinearAdd")
        else:   # in ORT's own (possibly uint8) domain: its float constant depends on the zero points
            k = a["ort_zp_shift"]
            recipe = numerics.add_ort if a["ort_kernel"] == "QLinearAdd" else numerics.add_float_ort
            out = _binary_ort(recipe, k, x, y, sa, za, sb_, zb, sc, a)
        return np.asarray(out).astype(rtype)

    def causes(args, mask, native, ort):
        if numerics.int16_involved(*(v.dtype for v in args), np.dtype(rtype)):   # ORT's float Add
            return int16.add_causes(*args, sa, za, sb_, zb, sc, a["output_zp"], a["output_min"], a["output_max"],
                                    (ma, mb), a["shift_factor"], native, ort)
        x, y = (np.broadcast_to(v, mask.shape) for v in args)
        return numerics.explain_add_diffs(x[mask], y[mask], sa, za, sb_, zb, sc)
    return _checked(_pair_table(fn, direct=("native",)), _int64_args(fn), causes)


def _avgpool(st, rtype):
    a = st.attrs
    rshape = tuple(st.shape)          # [N, C, 1, 1], or [N, C] for ReduceMean(keepdims=0)
    xs, ys = np.float32(a["ort_input_scale"][0]), np.float32(a["ort_output_scale"][0])
    kernel, stride, pad = list(a["kernel"]), list(a["stride"]), list(a["pad"])

    def fn(args, rounding):
        (x,) = args
        is_global = kernel == list(x.shape[2:]) and not any(pad)
        if rounding == "ort" and numerics.int16_involved(x.dtype, np.dtype(rtype)):   # ORT's float pool
            s, counts = kernels.pool_sum(x, kernel, stride, pad, bool(a["count_include_pad"]), a["input_zp"])
            out = int16.avgpool_ort(s, counts, xs, ys, a["output_zp"], a["output_min"], a["output_max"])
            return np.asarray(out).astype(rtype).reshape(rshape)
        if rounding == "ort":
            if is_global:
                n = x.shape[2] * x.shape[3]
                acc = x.astype(np.int64).sum(axis=(2, 3), keepdims=True) - a["input_zp"] * n
                out = numerics.global_avgpool_ort(acc, n, xs, ys, a["output_zp"],
                                                     a["output_min"], a["output_max"])
            else:  # ORT adds the zero point in float before rounding: work in its (uint8) domain
                k = a["ort_zp_shift"]
                out = numerics.avgpool_ort(x.astype(np.int64) + k, kernel, stride, pad, bool(a["count_include_pad"]),
                                              xs, a["input_zp"] + k, ys, a["output_zp"] + k, a["output_min"] + k,
                                              a["output_max"] + k) - k
            return np.asarray(out).astype(rtype).reshape(rshape)
        s, counts = kernels.pool_sum(x, kernel, stride, pad, bool(a["count_include_pad"]), a["input_zp"])
        out = numerics.avgpool_native(s, counts, xs, ys, a["output_zp"], a["output_min"], a["output_max"],
                                      ties_even=bool(a.get("round_ties_even", 0)), zp_before_rounding=not is_global)
        return np.asarray(out).astype(rtype).reshape(rshape)

    def causes(args, mask, native, ort):
        s, counts = kernels.pool_sum(args[0], kernel, stride, pad, bool(a["count_include_pad"]), a["input_zp"])
        if numerics.int16_involved(args[0].dtype, np.dtype(rtype)):
            dev = np.abs(args[0].astype(np.int64) - a["input_zp"])
            abs_sums = kernels.pool_sum(dev, kernel, stride, pad, True, 0)[0]
            return int16.avgpool_causes(s, abs_sums, np.broadcast_to(counts, s.shape), xs, ys, a["output_zp"],
                                        a["output_min"], a["output_max"], native.reshape(s.shape),
                                        ort.reshape(s.shape))
        mask = mask.reshape(s.shape)
        cnt = np.broadcast_to(counts, s.shape)[mask]
        return numerics.explain_diffs(s[mask], [((float(xs),), (float(ys), int(c))) for c in cnt])
    return _checked(fn, fn, causes)     # numpy only: no separate fast path to judge


def _maxpool(st, rtype):
    a = st.attrs
    return lambda args, r: kernels.maxpool(args[0], list(a["kernel"]), list(a["stride"]), list(a["pad"]),
                                           list(a["dilation"])).astype(rtype)


def _table(st, rtype):
    table = st.attrs["table"].astype(rtype)
    if table.size == 256:
        return lambda args, r: table[args[0].astype(np.int64) + 128]

    def per_channel(args, r):     # C·256 entries: one table per channel (axis 1)
        x = args[0].astype(np.int64) + 128
        channel = np.arange(x.shape[1]).reshape((1, -1) + (1,) * (x.ndim - 2))
        return table[channel * 256 + x]
    return per_channel


def _act(st, rtype):
    mode = st.attrs["mode"]

    def fn(args, rounding):
        return convert(args, rounding).astype(rtype, copy=False)

    def convert(args, rounding):
        (x,) = args
        if mode == "f2f":   # to or from bf16: rounding only when narrowing, and only on the NPU
            narrowing = st.dtype == "bf16"
            return numerics.to_bf16(x) if (narrowing and rounding == "native") else x.astype(np.float32)
        if mode == "i2f":
            return x.astype(np.float32)
        if mode == "f2i":
            return numerics.float_to_int(x)
        raise TorqError(f"torq_hl.act mode {mode!r} is not simulated")
    return fn


def _mul(st, rtype):
    a = st.attrs
    if a["mode"] == "int8":
        return _int_mul(a, rtype)
    b = np.float32(a["bias"][0])
    s, zp, qmode = np.float32(a["ort_scales"][0]), int(a["ort_zp"]), a["ort_mode"]

    def fn(args, rounding):
        x, factor = args
        if rounding == "native":
            return numerics.bf16_affine(x, factor.reshape(-1)[0], b)
        if qmode == "quantize":   # ORT QuantizeLinear; the clamp comes in the fma that follows
            return numerics.quantize_ort(x, s, zp, -2**31, 2**31 - 1).astype(np.float32)
        return numerics.dequantize_ort(x.astype(np.int64), s, zp)
    return fn


def _int_mul(a, rtype):
    za, zb = (int(v) for v in a["input_zps"])
    sa, sb, sc = (np.float32(v) for v in a["ort_scales"])
    mult, shift, k = int(a["scale_bias"][1]), a["shift_factor"], a["ort_zp_shift"]

    def fn(args, rounding):
        x, y = args
        if rounding == "native":
            out = numerics.mul_native(x, y, za, zb, mult, shift, a["output_zp"], a["output_min"], a["output_max"],
                                      ties_even=bool(a.get("round_ties_even", 0)))
        else:   # ORT adds the zero point in float before rounding: work in its (uint8) domain
            out = _binary_ort(numerics.mul_ort, k, x, y, sa, za, sb, zb, sc, a)
        return np.asarray(out).astype(rtype)

    def causes(args, mask, *_):
        x, y = (np.broadcast_to(v, mask.shape) for v in args)
        p = (x[mask].astype(np.int64) - za) * (y[mask].astype(np.int64) - zb)
        return numerics.explain_diffs(p, ((float(sa), float(sb)), (float(sc),)))
    return _checked(_pair_table(fn), _int64_args(fn), causes)


def _fma(st, rtype):
    a = st.attrs
    w, b = a["weights"], a["biases"]

    def fn(args, rounding):
        x = args[0]
        if x.dtype.kind == "f":    # bf16/f32 -> int at the end of the Quantize fallback
            x = numerics.float_to_int(x)
        shape = (-1,) + (1,) * (x.ndim - 1)
        y = x.astype(np.int64) * (w.reshape(shape) if w.size > 1 else w[0]) + (b.reshape(shape) if b.size > 1 else b[0])
        return np.clip(y, a["output_min"], a["output_max"]).astype(rtype)
    return fn


def _reduce(st, rtype):
    a = st.attrs
    if a["mode"] != "sum":
        raise TorqError(f"torq_hl.reduce mode {a['mode']!r} is not simulated")
    dims = tuple(int(d) for d in a["dims"])
    return lambda args, r: args[0].astype(np.int64).sum(axis=dims).astype(rtype)


def _matmul(st, rtype):
    """Both operands are activations (zero points taken off upstream): an exact accumulator
    (float64 BLAS holds every |acc| < 2**53), then the NPU's ACT or ORT's QLinearMatMul requant."""
    a = st.attrs
    mult, shift = int(a["scale_bias"][1]), a["shift_factor"]
    dq, ys = a["ort_dq_scale"], float(a["ort_output_scale"][0])
    requant = numerics.ort_requant_scale(dq[0], ys)

    def acc(args):
        x, y = (np.asarray(v, np.float64) for v in args)
        return np.matmul(x, y).astype(np.int64)

    def fn(args, rounding):
        if rounding == "native":
            out = numerics.act_native(acc(args), mult, shift, a["output_zp"], a["output_min"], a["output_max"])
        else:
            out = numerics.requant_ort(acc(args), requant, a["output_zp"], a["output_min"], a["output_max"])
        return np.asarray(out).astype(rtype)

    def causes(args, mask, *_):
        return numerics.explain_diffs(acc(args)[mask], ((float(dq[0]),), (ys,)))
    return _checked(fn, fn, causes)


def _rescale16(st, rtype):
    return _checked(*int16.rescale_parts(st, rtype))


OPS = {"conv2d": _conv, "depthwise_conv2d": _conv, "fully_connected": _fc, "add": _add, "rescale": _rescale16,
         "avg_pool2d": _avgpool, "maxpool2d": _maxpool, "table": _table, "act": _act, "mul": _mul,
         "fma": _fma, "reduce": _reduce, "matmul": _matmul}
