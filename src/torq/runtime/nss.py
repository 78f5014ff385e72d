"""The NSS simulator: executes a lowered module (torq_hl ops + data movement) with numpy.

It computes only from the module: weights, scale_bias, zero points and shifts are read from the
ops' attributes and constant operands. It never calls ONNX Runtime or IREE: it is the independent
implementation they are checked against. Any op that is neither torq_hl nor data movement is
refused at load time with "not supported on NSS: <op> at LINE:COL: <reason>".

Two rounding modes:
  native  what the NPU computes (fixed-point multiplier, round half toward +inf; bf16 fallbacks)
  ort     what ONNX Runtime's x86 CPU EP computes for the same quantized ops (float requant, RNE)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import numerics
from ..compiler import linalg_view as L
from ..compiler import torq_hl
from ..compiler.lowering import DATA_MOVEMENT, Unsupported, func_ops
from ..errors import TorqError
from . import kernels

ROUNDING_MODES = ("native", "ort")


@dataclass
class Step:
    fn: object          # fn(args: list[np.ndarray], rounding: str) -> np.ndarray
    args: list          # slots of the operands it reads
    out: int            # slot it writes
    name: str
    location: str
    explain: object = None  # explain(args, ort_out) -> (size, differing, max LSB, causes) for rescaling ops


class NssProgram:
    """A lowered module compiled once into a list of numpy steps; `run` executes it."""

    def __init__(self, module, unsupported_reasons: list[Unsupported] | None = None):
        self.slots: dict = {}
        self.consts: dict[int, np.ndarray] = {}
        self.steps: list[Step] = []
        reasons = {(u.op, u.location): u for u in (unsupported_reasons or [])}
        ops = func_ops(module)
        func = [o for o in module.body.operations if o.operation.name == "func.func"][0]
        self.n_inputs = len(func.regions[0].blocks[0].arguments)
        for i in range(self.n_inputs):
            self.slots[("arg", i)] = i
        self._next = self.n_inputs
        self.outputs: list[int] = []
        self.output_dtypes = []
        bad = []
        folder = L.Folder()
        for op in ops:
            name = op.name
            if name == "func.return":
                self.outputs = [self._slot(v) for v in op.operands]
                self.output_dtypes = [L.np_dtype(v.type) for v in op.operands]
                continue
            if not (name.startswith("torq_hl.") or name in DATA_MOVEMENT):
                loc = L.location_key(op)
                bad.append(reasons.get((name, loc)) or Unsupported(name, loc, "no torq_hl lowering"))
                for r in op.results:
                    self._new_slot(r)
                continue
            out = self._new_slot(op.results[0])
            if name == "arith.constant":
                self.consts[out] = folder.value(op.results[0])
                continue
            if name == "tensor.empty":
                continue
            fn, args = self._compile(op, folder)
            self.steps.append(Step(fn, [self._slot(a) for a in args], out, name, L.location_key(op),
                                   getattr(fn, "explain", None)))
        if bad:
            raise TorqError(str(bad[0]) + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))

    # -- slots
    def _key(self, value):
        op = L.producer(value)
        if op is None:
            return ("arg", value.arg_number)
        return (L.id_of(op), value.result_number)

    def _slot(self, value):
        return self.slots[self._key(value)]

    def _new_slot(self, value):
        s = self._next
        self._next += 1
        self.slots[self._key(value)] = s
        return s

    # -- op compilation
    def _compile(self, op, folder):
        name = op.name
        rshape = L.shape_of(op.results[0])
        rtype = L.np_dtype(op.results[0].type)
        if name.startswith("torq_hl."):
            return _TORQ[name[8:]](op, folder, rtype), list(op.operands)[1:]
        if name == "tensor.pad":
            low, high = L.attr_ints(op, "static_low"), L.attr_ints(op, "static_high")
            yielded = list(op.regions[0].blocks[0].operations)[-1].operands[0]
            value = folder.value(yielded)
            if value is None:
                raise TorqError(f"not supported on NSS: tensor.pad at {L.location_key(op)}: non-constant padding")
            widths = list(zip(low, high))
            return (lambda a, r: np.pad(a[0], widths, constant_values=value)), [op.operands[0]]
        if name in ("tensor.collapse_shape", "tensor.expand_shape", "tensor.reshape", "tensor.cast"):
            return (lambda a, r: a[0].reshape(rshape)), [op.operands[0]]
        if name == "linalg.transpose":
            perm = L.attr_ints(op, "permutation")
            return (lambda a, r: np.ascontiguousarray(np.transpose(a[0], perm))), [op.operands[0]]
        if name == "linalg.broadcast":
            dims = tuple(L.attr_ints(op, "dimensions"))
            return (lambda a, r: np.broadcast_to(np.expand_dims(a[0], dims), rshape).copy()), [op.operands[0]]
        if name == "linalg.fill":
            return (lambda a, r: np.full(rshape, a[0], dtype=rtype)), [op.operands[0]]
        if name == "tensor.extract_slice":
            off, size, stride = (L.attr_ints(op, k) for k in ("static_offsets", "static_sizes", "static_strides"))
            if len(op.operands) > 1:
                raise TorqError(f"not supported on NSS: tensor.extract_slice at {L.location_key(op)}: dynamic slice")
            sl = tuple(slice(o, o + s * st, st) for o, s, st in zip(off, size, stride))
            return (lambda a, r: a[0][sl].reshape(rshape)), [op.operands[0]]
        if name == "tensor.concat":
            dim = int(op.attributes["dim"].value)
            return (lambda a, r: np.concatenate(a, axis=dim)), list(op.operands)
        raise TorqError(f"not supported on NSS: {name} at {L.location_key(op)}: no simulator kernel")

    # -- execution
    def run(self, inputs: list[np.ndarray], rounding: str = "native", explain: bool = False):
        """Execute; with explain=True (ort rounding) also return, per rescaling op, how the native
        NPU result differs from ORT's on the very same inputs: [OpDiff]."""
        if rounding not in ROUNDING_MODES:
            raise TorqError(f"--rounding must be one of {', '.join(ROUNDING_MODES)}, not {rounding!r}")
        if len(inputs) != self.n_inputs:
            raise TorqError(f"the model takes {self.n_inputs} inputs, got {len(inputs)}")
        env: list = [None] * self._next
        env[:self.n_inputs] = inputs
        for s, v in self.consts.items():
            env[s] = v
        diffs = []
        for st in self.steps:
            args = [env[a] for a in st.args]
            env[st.out] = st.fn(args, rounding)
            if explain and st.explain is not None:
                diffs.append(OpDiff(st.name, st.location, *st.explain(args, env[st.out])))
        outs = [np.asarray(env[o]).astype(dt, copy=False) for o, dt in zip(self.outputs, self.output_dtypes)]
        return (outs, diffs) if explain else outs


@dataclass
class OpDiff:
    """Native-vs-ORT rounding of one op on identical inputs."""
    op: str
    location: str
    size: int
    differ: int
    max_lsb: int
    causes: dict

    @property
    def explained(self) -> bool:
        return self.max_lsb <= 1 and not self.causes.get("other")


def _diff(native, ort):
    d = np.abs(native.astype(np.int64) - ort.astype(np.int64))
    mask = d > 0
    return mask, int(d.max(initial=0))


# ---------------------------------------------------------------- torq_hl kernels

def _rescale(acc, attrs, scale_bias, rounding, rtype):
    """ACT stage shared by conv / fc: native fixed point or ORT float requant (per channel, axis 1).

    ``acc`` an int64 accumulator, or a ``kernels.AccParts`` (exact accumulator in two parts, fused
    requantisation with the same results)."""
    mult = scale_bias[1::2]
    if isinstance(acc, kernels.AccParts):
        if rounding == "native":
            return numerics.act_native_parts(
                acc.acc, acc.extra, mult, attrs["shift_factor"], attrs["output_zp"], attrs["output_min"],
                attrs["output_max"], acc_bound=acc.acc_bound, bound=acc.bound, axis=1, out_dtype=rtype)
        return numerics.requant_ort_parts(
            acc.acc, acc.extra, attrs["ort_requant_scale"], attrs["output_zp"], attrs["output_min"],
            attrs["output_max"], acc_bound=acc.acc_bound, bound=acc.bound, axis=1, out_dtype=rtype)
    if rounding == "native":
        y = numerics.act_native(acc, mult, attrs["shift_factor"], attrs["output_zp"],
                                   attrs["output_min"], attrs["output_max"], axis=1)
    else:
        y = numerics.requant_ort(acc, attrs["ort_requant_scale"], attrs["output_zp"],
                                    attrs["output_min"], attrs["output_max"], axis=1)
    return np.asarray(y).astype(rtype)


def _with_acc(parts_fn, a, rtype, ys):
    """Step function for accumulate-then-rescale ops, plus its native-vs-ORT explainer.

    ``parts_fn(args)`` returns the accumulator as ``kernels.AccParts``."""
    def fn(args, rounding):
        parts = parts_fn(args)
        if np.dtype(rtype).kind not in "iu":
            return _rescale(parts.int64(axis=1), a, args[1].astype(np.int64), rounding, rtype)
        return _rescale(parts, a, args[1].astype(np.int64), rounding, rtype)

    def explain(args, ort_out):
        acc = parts_fn(args).int64(axis=1)
        native = _rescale(acc, a, args[1].astype(np.int64), "native", rtype)
        mask, mx = _diff(native, ort_out)
        chan = np.nonzero(mask)[1] if acc.ndim > 1 else np.zeros(int(mask.sum()), int)
        dq = a["ort_dq_scale"]
        causes = numerics.explain_diffs(acc[mask], [((float(dq[c]),), (ys,)) for c in chan]) \
            if mask.any() else {}
        return acc.size, int(mask.sum()), mx, causes
    fn.explain = explain
    return fn


def _cached_plan(make):
    """plan(w, sb): ``make(w, sb)`` built once and reused while the weight and scale_bias operands
    are the same arrays (program constants: the program's lifetime) or hold the same values
    (weights computed at run time from constants)."""
    cache = {}

    def same(a, b):
        return a is b or (b is not None and a.shape == b.shape and a.dtype == b.dtype
                          and np.array_equal(a, b))

    def plan(w, sb):
        if not (same(w, cache.get("w")) and same(sb, cache.get("sb"))):
            cache.update(plan=make(w, sb))
        cache.update(w=w, sb=sb)
        return cache["plan"]
    return plan


def _scales(a):
    """Add the ORT requant scale fl32(fl32(xs·ws)/ys) (ORT's order) and y_scale to the attrs."""
    ys = float(a["ort_output_scale"][0])
    a["ort_requant_scale"] = numerics.ort_requant_scale(a["ort_dq_scale"], ys)
    return ys


def _conv(op, folder, rtype):
    a = torq_hl.op_attrs(op)
    ys = _scales(a)
    plan = _cached_plan(lambda w, sb: kernels.ConvPlan(
        w, sb[0::2].astype(np.int64), list(a["pad"]), a["input_zp"], list(a["stride"]),
        list(a["dilation"]), a["groups"]))

    def parts_fn(args):
        w, sb, x = args
        one_d = x.ndim == 3                              # Conv1D runs as 2-D with H = 1
        p = plan(w, sb).parts(x[:, :, None, :] if one_d else x)
        return p._replace(acc=p.acc[:, :, 0, :]) if one_d else p
    return _with_acc(parts_fn, a, rtype, ys)


def _fc(op, folder, rtype):
    a = torq_hl.op_attrs(op)
    ys = _scales(a)
    plan = _cached_plan(lambda w, sb: kernels.FcPlan(w, sb[0::2].astype(np.int64)))

    def parts_fn(args):
        w, sb, x = args
        return plan(w, sb).parts(x)
    return _with_acc(parts_fn, a, rtype, ys)


def _binary_ort(recipe, k, x, y, sa, za, sb, zb, sc, a):
    """An ORT binary recipe (QLinearAdd, float Add, QLinearMul) run in ORT's own domain: shifted
    back by k = 128 when the model's uint8 activations were made int8 (graph/signedness.py)."""
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
    run.explain = fn.explain
    return run


def _add(op, folder, rtype):
    a = torq_hl.op_attrs(op)
    za, zb = (int(v) for v in a["input_zps"])
    ma, mb = (int(v) for v in a["weights"])
    sa, sb_ = (np.float32(v) for v in a["ort_input_scales"])
    sc = np.float32(a["ort_output_scale"][0])

    def fn(args, rounding):
        x, y = args
        if rounding == "native":
            out = numerics.add_native_mults(x, y, za, zb, ma, mb, a["shift_factor"], a["output_zp"],
                                               a["output_min"], a["output_max"], out_dtype=rtype)
        else:   # in ORT's own (possibly uint8) domain: its float constant depends on the zero points
            k = a["ort_zp_shift"]
            recipe = numerics.add_ort if a["ort_kernel"] == "QLinearAdd" else numerics.add_float_ort
            out = _binary_ort(recipe, k, x, y, sa, za, sb_, zb, sc, a)
        return np.asarray(out).astype(rtype)

    def explain(args, ort_out):
        native = fn(args, "native")
        mask, mx = _diff(native, ort_out)
        x, y = (np.broadcast_to(v, ort_out.shape) for v in args)
        causes = numerics.explain_add_diffs(x[mask], y[mask], sa, za, sb_, zb, sc) if mask.any() else {}
        return ort_out.size, int(mask.sum()), mx, causes
    fn.explain = explain
    return _pair_table(fn, direct=("native",))


def _avgpool(op, folder, rtype):
    a = torq_hl.op_attrs(op)
    rshape = L.shape_of(op.results[0])          # [N, C, 1, 1], or [N, C] for ReduceMean(keepdims=0)
    xs, ys = np.float32(a["ort_input_scale"][0]), np.float32(a["ort_output_scale"][0])
    kernel, stride, pad = list(a["kernel"]), list(a["stride"]), list(a["pad"])

    def fn(args, rounding):
        (x,) = args
        is_global = kernel == list(x.shape[2:]) and not any(pad)
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
        out = numerics.avgpool_native(s, counts, xs, ys, a["output_zp"], a["output_min"], a["output_max"])
        return np.asarray(out).astype(rtype).reshape(rshape)

    def explain(args, ort_out):
        native = fn(args, "native")
        mask, mx = _diff(native, ort_out)
        if not mask.any():
            return ort_out.size, 0, 0, {}
        s, counts = kernels.pool_sum(args[0], kernel, stride, pad, bool(a["count_include_pad"]), a["input_zp"])
        mask = mask.reshape(s.shape)
        cnt = np.broadcast_to(counts, s.shape)[mask]
        causes = numerics.explain_diffs(s[mask], [((float(xs),), (float(ys), int(c))) for c in cnt])
        return ort_out.size, int(mask.sum()), mx, causes
    fn.explain = explain
    return fn


def _maxpool(op, folder, rtype):
    a = torq_hl.op_attrs(op)
    return lambda args, r: kernels.maxpool(args[0], list(a["kernel"]), list(a["stride"]), list(a["pad"]),
                                           list(a["dilation"])).astype(rtype)


def _table(op, folder, rtype):
    table = torq_hl.op_attrs(op)["table"].astype(rtype)
    if table.size == 256:
        return lambda args, r: table[args[0].astype(np.int64) + 128]

    def per_channel(args, r):     # C·256 entries: one table per channel (axis 1)
        x = args[0].astype(np.int64) + 128
        channel = np.arange(x.shape[1]).reshape((1, -1) + (1,) * (x.ndim - 2))
        return table[channel * 256 + x]
    return per_channel


def _act(op, folder, rtype):
    mode = torq_hl.op_attrs(op)["mode"]

    def fn(args, rounding):
        (x,) = args
        if mode == "f2f":   # to or from bf16: rounding only when narrowing, and only on the NPU
            narrowing = str(op.results[0].type).endswith("xbf16>")
            return numerics.to_bf16(x) if (narrowing and rounding == "native") else x.astype(np.float32)
        if mode == "i2f":
            return x.astype(np.float32)
        if mode == "f2i":
            return numerics.float_to_int(x)
        raise TorqError(f"torq_hl.act mode {mode!r} is not simulated")
    return fn


def _mul(op, folder, rtype):
    a = torq_hl.op_attrs(op)
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
            out = numerics.mul_native(x, y, za, zb, mult, shift, a["output_zp"], a["output_min"], a["output_max"])
        else:   # ORT adds the zero point in float before rounding: work in its (uint8) domain
            out = _binary_ort(numerics.mul_ort, k, x, y, sa, za, sb, zb, sc, a)
        return np.asarray(out).astype(rtype)

    def explain(args, ort_out):
        native = fn(args, "native")
        mask, mx = _diff(native, ort_out)
        if not mask.any():
            return ort_out.size, 0, 0, {}
        x, y = (np.broadcast_to(v, ort_out.shape) for v in args)
        p = (x[mask].astype(np.int64) - za) * (y[mask].astype(np.int64) - zb)
        return ort_out.size, int(mask.sum()), mx, numerics.explain_diffs(p, ((float(sa), float(sb)), (float(sc),)))
    fn.explain = explain
    return _pair_table(fn)


def _fma(op, folder, rtype):
    a = torq_hl.op_attrs(op)
    w, b = a["weights"], a["biases"]

    def fn(args, rounding):
        x = args[0]
        if x.dtype.kind == "f":    # bf16/f32 -> int at the end of the Quantize fallback
            x = numerics.float_to_int(x)
        shape = (-1,) + (1,) * (x.ndim - 1)
        y = x.astype(np.int64) * (w.reshape(shape) if w.size > 1 else w[0]) + (b.reshape(shape) if b.size > 1 else b[0])
        return np.clip(y, a["output_min"], a["output_max"]).astype(rtype)
    return fn


def _reduce(op, folder, rtype):
    a = torq_hl.op_attrs(op)
    if a["mode"] != "sum":
        raise TorqError(f"torq_hl.reduce mode {a['mode']!r} is not simulated")
    dims = tuple(int(d) for d in a["dims"])
    return lambda args, r: args[0].astype(np.int64).sum(axis=dims).astype(rtype)


_TORQ = {"conv2d": _conv, "depthwise_conv2d": _conv, "fully_connected": _fc, "add": _add,
         "avg_pool2d": _avgpool, "maxpool2d": _maxpool, "table": _table, "act": _act, "mul": _mul,
         "fma": _fma, "reduce": _reduce}
