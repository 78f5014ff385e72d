"""What every lowering rule shares: the rule shape, the match context, and small IR helpers.

A rule (in the style of onnxscript's rewriter rules) is a class with a docstring `pattern`
(`Q ∘ DQ ∘ conv_2d_nchw_fchw_q -> torq_hl.conv2d`), a `match(ctx, q)` that returns a match
object or a `Fail` whose reason reaches the user as the NSS error text, and a `rewrite`.
Every rule is rooted at a quantize generic (the end of a QDQ "sandwich").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import numerics
from .. import linalg_view as L
from .. import recognise as R
from .. import torq_hl


@dataclass
class Fail:
    reason: str
    op: object = None  # the compute op the reason is about (for its location)

    def __bool__(self):
        return False


@dataclass
class Root:
    """A quantize generic: its op, parameters, and the f32 value it quantizes.

    Clamps right before the quantize (an unfused Relu / Clip) are folded into q.lo / q.hi:
    Q is monotone, so Q(min(max(v, lo), hi)) == clamp(Q(v), Q(lo), Q(hi)) exactly."""
    op: object
    q: R.Q
    value: object
    clamps: tuple = ()          # the folded clamp generics (their ops)


class Ctx:
    """Per-module lowering state: constant folder, generic cache, failure reasons."""

    def __init__(self, module, ort_zp_shift: int = 0, onnx_ops: dict | None = None,
                 onnx_names: dict | None = None):
        self.module = module
        self.onnx_ops = onnx_ops or {}    # "LINE:COL" -> ONNX op type (from the import)
        self.onnx_names = onnx_names or {}   # "LINE:COL" -> ONNX node name
        self.folder = L.Folder()
        self.reasons: dict = {}   # id(compute op) -> (op, reason)
        self.float_in_ort: set = set()   # id(compute op) whose bias zero point ≠ 0: ORT runs it in float
        self.ort_zp_shift = ort_zp_shift   # 128 when uint8 activations were shifted (compiler/frontend/signedness.py)
        self.islands = False      # LINE:COLs lowered as bf16 islands (set); False: off; None: a bf16 model
        self._generics: dict = {}  # op -> {force_var: Generic}: each rule reads the same ops again

    def generic(self, op, force_var=()):
        """The `linalg_view.Generic` of a linalg.generic op (None for any other op), memoised:
        its operands stay valid until a rewrite replaces one (`replaced` forgets its users)."""
        if op is None or op.name != "linalg.generic":
            return None
        views = self._generics.setdefault(L.id_of(op), {})
        g = views.get(tuple(force_var))
        if g is None:
            g = views[tuple(force_var)] = L.Generic(op, self.folder, force_var=force_var)
        return g

    def replaced(self, value) -> None:
        """`value` is about to be replaced: the generics reading it must be re-read."""
        for use in value.uses:
            self._generics.pop(L.id_of(use.owner), None)

    def erased(self) -> None:
        """Ops were erased: forget what was read from them (a new op may reuse an address)."""
        self._generics.clear()
        self.folder = L.Folder()

    def producer(self, value):
        return L.producer(value)

    def const(self, value):
        return self.folder.value(value)

    def dequant(self, value, of_constant=False):
        """value = DQ(x): returns (x, scale, zp) or None (of_constant: x may be a constant)."""
        op = L.producer(value)
        g = self.generic(op)
        if g is None:
            return None
        if of_constant and not g.var_inputs:
            ints = [i for i, v in enumerate(g.inputs) if L.element_type(v).startswith("i")]
            if len(ints) < 1:
                return None
            g = self.generic(op, force_var=(ints[0],))
        d = R.as_dequant(g)
        if d is None:
            return None
        return g.inputs[d.source_index], d.scale, d.zp

    def quant_root(self, op) -> Root | None:
        g = self.generic(op)
        if g is None:
            return None
        q = R.as_quant(g)
        if q is None:
            return None
        value, clamps = g.inputs[q.source_index], []
        while True:
            c = self.generic(L.producer(value))
            bounds = R.as_clamp(c) if c is not None else None
            if bounds is None or np.ndim(q.scale) or L.shape_of(c.inputs[c.var_inputs[0]]) != L.shape_of(value):
                break
            for bound, is_lo in ((bounds[0], True), (bounds[1], False)):
                if np.isfinite(bound):
                    qb = int(g.evaluate({g.var_inputs[0]: np.full((1,) * len(g.out_shape), bound, np.float32)},
                                        (1,) * len(g.out_shape)).ravel()[0])
                    q.lo, q.hi = (max(q.lo, qb), q.hi) if is_lo else (q.lo, min(q.hi, qb))
            clamps.append(c.op)
            value = c.inputs[c.var_inputs[0]]
        return Root(op, q, value, tuple(clamps))

    def onnx_op(self, op) -> str:
        """ONNX op type of the torch.operator an op was lowered from ('' if unknown)."""
        return self.onnx_ops.get(L.location_key(op), "")

    def onnx_name(self, op) -> str:
        """ONNX node name of the torch.operator an op was lowered from ('' if unknown)."""
        return self.onnx_names.get(L.location_key(op), "")

    def reason(self, op) -> str | None:
        """The reason recorded for `op` by a rule's `fail`. Operation wrappers may hash
        differently once other ops were rewritten or erased, so equality decides."""
        hit = self.reasons.get(L.id_of(op))
        if hit is None:
            key = L.id_of(op)
            hit = next((v for k, v in self.reasons.items() if k == key), None)
        return hit[1] if hit else None

    def int_const_of_dequant(self, value):
        """value = [broadcast|collapse](DQ(const int)) -> (int array, scale, zp) or None.

        A broadcast may also be a copy generic (body: yield the input), as torch-mlir expands a
        MatMul weight to the batch of a rank-3 activation."""
        op = L.producer(value)
        while op is not None and (op.name in ("linalg.broadcast", "tensor.collapse_shape",
                                             "tensor.expand_shape", "linalg.transpose") or _is_copy(op)):
            if op.name == "linalg.transpose":
                return None
            value = op.operands[0]
            op = L.producer(value)
        dq = self.dequant(value, of_constant=True)
        if dq is None:
            return None
        src, scale, zp = dq
        c = self.const(src)
        if c is None:
            return None
        return c, scale, zp

    def original_bias(self, value, op):
        """i32 bias of a conv init in the accumulator scale: unwrap broadcast and torch-mlir's
        Q(DQ(bias)) round trip, moving the bias into that scale exactly (a ``Fail`` when it is not
        an integer there: ``numerics.bias_to_accumulator``). None when it is not constant."""
        bop = L.producer(value)
        if bop is not None and bop.name == "linalg.broadcast":
            value = bop.operands[0]
        qop = L.producer(value)
        g = self.generic(qop)
        if g is not None and not g.var_inputs and len(g.inputs) == 1:
            g = self.generic(qop, force_var=(0,))         # all-constant: read it as Q(x), x = DQ(bias)
        if g is not None:
            q = R.as_quant(g)
            if q is not None:
                inner = self.int_const_of_dequant(g.inputs[q.source_index])
                if inner is not None:
                    return bias_to_accumulator(self, op, inner[0], inner[2], inner[1], q.scale)
        c = self.const(value)
        return None if c is None else c.astype(np.int64)

    def fail(self, op, reason):
        if op is not None:
            self.reasons[L.id_of(op)] = (op, reason)
        return Fail(reason, op)


def _is_copy(op) -> bool:
    """A one-input linalg.generic whose body only yields that input (a broadcast or a copy)."""
    if op.name != "linalg.generic" or len(op.operands) != 2:
        return False
    body = list(op.regions[0].blocks[0].operations)
    return len(body) == 1 and len(body[0].operands) == 1 and body[0].operands[0] == op.regions[0].blocks[0].arguments[0]


def strip_pad(value):
    """value = tensor.pad(x) with constant padding -> (x, [l, r, t, b], pad value op) else (value, 0s, None)."""
    op = L.producer(value)
    if op is None or op.name != "tensor.pad":
        return value, [0, 0, 0, 0], None
    low = L.attr_ints(op, "static_low")
    high = L.attr_ints(op, "static_high")
    if any(low[:-2]) or any(high[:-2]):
        return value, [0, 0, 0, 0], None
    body = op.regions[0].blocks[0]
    yielded = list(body.operations)[-1].operands[0]
    return op.operands[0], [low[-1], high[-1], low[-2], high[-2]], yielded


def pad_constant(ctx: Ctx, yielded):
    if yielded is None:
        return None
    c = ctx.const(yielded)
    return None if c is None else np.asarray(c).item()


def scalar(x, what: str):
    a = np.asarray(x)
    if a.ndim and not np.all(a == a.ravel()[0]):
        raise ValueError(f"{what} is not per-tensor")
    return a.ravel()[0].item()


def empty(result_type, loc, ip):
    from torch_mlir import ir
    return ir.Operation.create("tensor.empty", results=[result_type], operands=[], loc=loc, ip=ip).results[0]


def constant(array: np.ndarray, mlir_elem: str, loc, ip):
    """arith.constant holding a numpy array with the given element type (i8/i16/i32/i64/f32)."""
    from torch_mlir import ir
    elem = {"i8": ir.IntegerType.get_signless(8), "i16": ir.IntegerType.get_signless(16),
            "i32": ir.IntegerType.get_signless(32), "i64": ir.IntegerType.get_signless(64),
            "f32": ir.F32Type.get()}[mlir_elem]
    np_dt = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "f32": np.float32}[mlir_elem]
    arr = np.ascontiguousarray(np.asarray(array).astype(np_dt))
    t = ir.RankedTensorType.get(list(arr.shape), elem)
    attr = ir.DenseElementsAttr.get(arr, type=t)
    return ir.Operation.create("arith.constant", results=[t], attributes={"value": attr},
                               loc=loc, ip=ip).results[0]


def emit(name: str, root: Root, operands, attrs: dict, loc_op, result_type=None, shape_of=None):
    """Create torq_hl.<name> just before the root quantize, typed like it (or with the element
    type of `result_type` and the shape of `shape_of`), at loc_op's location."""
    from torch_mlir import ir
    ip = ir.InsertionPoint(root.op)
    rtype = root.op.results[0].type
    if result_type is not None:
        rtype = ir.RankedTensorType.get(list(L.shape_of(shape_of)), ir.RankedTensorType(result_type).element_type)
    init = empty(rtype, loc_op.location, ip)
    new = torq_hl.create(name, rtype, [init, *operands], attrs, loc_op.location, ip)
    return new


def lookup_table(*generics) -> np.ndarray:
    """256-entry int8 -> int8 table: the given one-input elementwise generics (e.g. DQ, f, Q)
    evaluated in order on every int8 value, exactly as the linalg computes them."""
    y = np.arange(-128, 128, dtype=np.int8)
    for g in generics:
        shape = (256,) + (1,) * (len(g.out_shape) - 1)
        y = g.evaluate({g.var_inputs[0]: np.asarray(y).reshape(shape)}, shape).ravel()
    return np.asarray(y).astype(np.int64)


INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def int32_or_fail(ctx: Ctx, op, what: str, values) -> Fail | None:
    """Refuse a folded constant the int32 datapath cannot hold (ORT computes it in int32 and wraps:
    folding it wider would silently give other numbers). Names the first bad value and channel."""
    v = np.asarray(values, np.int64).reshape(-1)
    bad = np.flatnonzero((v < INT32_MIN) | (v > INT32_MAX))
    if not bad.size:
        return None
    return ctx.fail(op, f"{what} {int(v[bad[0]])} (output channel {int(bad[0])}) exceeds int32")


def bias_to_accumulator(ctx: Ctx, op, q_b, zp_b, s_b, s_acc) -> np.ndarray | Fail:
    """The bias as an integer in the accumulator scale (the lecture's trap: its scale need not be
    input_scale·weight_scale), or a ``Fail`` saying why there is none; checked against int32."""
    fail = int32_or_fail(ctx, op, "bias − bias zero point",
                         np.asarray(q_b, np.int64).reshape(-1) - np.asarray(zp_b, np.int64).reshape(-1))
    if fail is not None:
        return fail
    try:
        b = numerics.bias_to_accumulator(q_b, zp_b, s_b, s_acc)
    except ValueError as e:
        return ctx.fail(op, str(e))
    if op is not None and np.any(np.asarray(zp_b) != 0):
        ctx.float_in_ort.add(L.id_of(op))
    fail = int32_or_fail(ctx, op, "bias in the accumulator scale", b)
    return b if fail is None else fail


#: Activation element types the NSS computes with: int8, and int16 (A16W8: the byte-plane path).
ACTIVATION_DTYPES = (np.int8, np.int16)


def activation_dtype(dt) -> bool:
    return any(dt is t for t in ACTIVATION_DTYPES)


def folded_bias(ctx: Ctx, op, bias, in_zp: int, w_adj, wide: bool = False) -> np.ndarray | Fail:
    """b' = b − in_zp·Σw′ per output channel, modulo 2**32 as the int32 register holds it.

    ORT accumulates ``Σ(x − in_zp)·w′ + b`` in int32 and wraps; ``Σx·w′ + b'`` wrapped the same
    way is congruent modulo 2**32, so the ACT sees the very same int32 whatever the range. A
    BatchNorm-folded "dust" channel (weights ~1e-8 of the layer's, int32 bias near its limit)
    is therefore lowered exactly, not refused.

    ``wide`` (int16 input): b' must fit int32 as it is; the accumulator of a large layer may leave
    int32 on extreme inputs, which the ACT's 32-bit sum wraps (``numerics.int16``, "overflow")."""
    w2 = np.asarray(w_adj, np.int64).reshape(len(bias), -1)
    if L.id_of(op) in ctx.float_in_ort:
        fail = _no_wrap_or_fail(ctx, op, bias, in_zp, w2, wide)
        if fail is not None:
            return fail
    folded = np.asarray(bias, np.int64) - int(in_zp) * w2.sum(axis=1)
    if wide:
        fail = int32_or_fail(ctx, op, "folded bias (bias − in_zp·Σw′)", folded)
        return folded if fail is None else fail
    return folded.astype(np.int32).astype(np.int64)


def _no_wrap_or_fail(ctx: Ctx, op, bias, in_zp: int, w2, wide: bool) -> Fail | None:
    """A nonzero bias zero point keeps ORT from fusing the layer into its int32 kernels: it computes
    in float, where nothing wraps. The int32 accumulator must then hold every input's sum."""
    lo, hi = (-2**15, 2**15 - 1) if wide else (-128, 127)
    b = np.asarray(bias, np.int64)
    ends = (w2 * (lo - int(in_zp)), w2 * (hi - int(in_zp)))
    acc_lo = b + np.minimum(*ends).sum(axis=1)
    acc_hi = b + np.maximum(*ends).sum(axis=1)
    bad = np.flatnonzero((acc_lo < INT32_MIN) | (acc_hi > INT32_MAX))
    if not bad.size:
        return None
    c = int(bad[0])
    return ctx.fail(op, f"with a nonzero bias zero point ONNX Runtime computes this layer in float; the int32 "
                        f"accumulator of output channel {c} spans [{int(acc_lo[c])}, {int(acc_hi[c])}] "
                        "and would wrap where ORT does not")


def rescale(dq_scale, ys, w_adj, bias, q, wide: bool = False):
    """``(multipliers, shift, bias, dq_scale, w_adj)`` of a constant-weight conv / FC:
    ``numerics.conv_rescale_constant_channels``, told which output channels are constant — the
    same output for every int8 input (``numerics.constant_output`` over the accumulator's whole
    range): all-zero weights, or BatchNorm "dust" whose per-channel scale stretched 1e-8 weights
    to ±127. Their weights become 0 (the output does not change), so they neither set the shared
    shift nor cost live channels multiplier bits. ``wide``: the input is int16 (its whole range
    decides what is constant). With int16 in or out (``float_path``) ORT runs the layer in float:
    the live channels' scale is the exact ``dq/ys`` (``numerics.conv_rescale``)."""
    w2 = np.asarray(w_adj, np.int64).reshape(len(bias), -1)
    b = np.asarray(bias, np.int64)
    hi, lo = (32767, -32768) if wide else (127, -128)
    acc_lo = b + np.minimum(hi * w2, lo * w2).sum(axis=1)
    acc_hi = b + np.maximum(hi * w2, lo * w2).sum(axis=1)
    const = numerics.constant_output(dq_scale, ys, acc_lo, acc_hi, int(q.zp), int(q.lo), int(q.hi))
    const |= ~w2.any(axis=1)
    if const.any() and w2[const].any():
        w_adj = np.array(w_adj, copy=True)
        w_adj.reshape(len(bias), -1)[const] = 0
    return (*numerics.conv_rescale_constant_channels(dq_scale, ys, bias, const, int(q.zp), int(q.lo), int(q.hi),
                                                     float_path=float_path(wide, q)), w_adj)


def float_path(wide: bool, q) -> bool:
    """ORT runs the layer DQ -> float op -> Q (no integer kernel): int16 input (``wide``) or output."""
    return bool(wide) or np.dtype(q.out_dtype) == np.int16
