"""LinalgToTorqHL: rewrite every quantize-rooted chain with the first rule that matches.

Rules are tried in order on each quantize generic (the end of a QDQ sandwich). What no rule
takes falls back to the bf16 Quantize/Dequantize sequences. The float ops of an ONNX node with no
integer form (``NO_INTEGER_FORM``: Softmax, LayerNorm) then sit between those fallbacks and lower
by the float rules: a bf16 island, as the reference compiler runs them (seed §4.4.2). What is left
after that (any op that is neither torq_hl nor data movement) is "not supported on NSS", with
the reason the closest rule gave.
"""
from __future__ import annotations

import numpy as np

from .. import isa
from . import linalg_view as L
from . import recognise as R
from .patterns import (conv, conv3d, data_movement, elementwise, float_contract, float_elementwise, fully_connected,
                       matmul, movement_chain, pooling, requantize, table)
from .patterns.common import Ctx, Fail, constant
from .patterns.quant_fallback import DequantizeFallback, QuantizeFallback
from .unsupported import NO_INTEGER_FORM, LoweringReport, Unsupported, collect  # noqa: F401 (re-exported)

RULES = [*conv.RULES, *conv3d.RULES, *fully_connected.RULES, *matmul.RULES, *elementwise.RULES, *pooling.RULES,
         *data_movement.RULES, *movement_chain.RULES, *table.RULES, *requantize.RULES]
# Rules rooted at an integer compute op rather than a quantize (ops ORT already runs on int8).
OP_RULES = [*pooling.OP_RULES]



def func_ops(module):
    """Operations of the (single) function body, in order."""
    funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
    if len(funcs) != 1:
        raise ValueError("expected exactly one function in the module")
    return [op.operation for op in funcs[0].regions[0].blocks[0].operations]


def _replace(ctx: Ctx, old_op, new_op):
    ctx.replaced(old_op.results[0])
    old_op.results[0].replace_all_uses_with(new_op.results[0])


def dce(module) -> None:
    """Erase ops whose results are unused (everything here is side-effect free). One pass from
    the end reaches the fixpoint: an op's users (or the ops whose regions use it) come after it
    in the block, so they are gone by the time it is looked at."""
    for op in reversed(func_ops(module)):
        if op.name == "func.return" or not len(op.results):
            continue
        if all(next(iter(r.uses), None) is None for r in op.results):
            op.erase()


def lower(module, ort_zp_shift: int = 0, onnx_ops: dict | None = None, float_ops: bool = False,
          onnx_names: dict | None = None, islands=False) -> LoweringReport:
    """Rewrite `module` (linalg-on-tensors) in place into torq_hl + data movement.

    ort_zp_shift: 128 when the ONNX model's uint8 activations were shifted to int8 (signedness).
    onnx_ops: "LINE:COL" -> ONNX op type, to know which ONNX Runtime kernel the reference runs;
    onnx_names: "LINE:COL" -> ONNX node name, to name the node an unsupported op comes from.
    float_ops: a bf16 model: its float linalg ops become bf16 / f32 torq_hl ops (FLOAT_RULES);
    islands: the LINE:COLs of the nodes without an integer form (``islands.bracketed``) whose float
    ops do too in an int8 model (bf16 islands); False: islands off."""
    from torch_mlir import ir
    with module.context, ir.Location.unknown():
        ctx = Ctx(module, ort_zp_shift, onnx_ops, onnx_names)
        ctx.islands = None if float_ops else (set(islands) if islands is not False else False)
        return _lower(module, ctx, float_ops)


def _lower_float(ctx: Ctx, module, only=None) -> None:
    """The float rules, op by op in order: a named contraction / pool (which may fold the truncf
    and clamp after it), else a float linalg.generic (elementwise or reduction). ``only``: a
    predicate on the ops to take (the island ops of an int8 model), else all."""
    for op in func_ops(module):
        if not op.results or all(next(iter(r.uses), None) is None for r in op.results):
            continue            # folded into an earlier op (or dead)
        if only is not None and not only(op):
            continue
        if op.name in float_contract.NAMED:
            m = float_contract.NAMED[op.name](ctx, op)
            if not isinstance(m, Fail):
                last, new = m
                _replace(ctx, last, new)
        elif float_elementwise.is_float_generic(op):
            if ctx.generic(op) is not None and not ctx.generic(op).var_inputs:
                continue        # computed from constants: folded (below) if still read
            m = float_elementwise.lower_generic(ctx, op)
            if not isinstance(m, Fail):
                _replace(ctx, *m)


def _materialize_float_constants(ctx: Ctx, module, only=None) -> None:
    """A float generic computed from constants only that is still read becomes its value."""
    from torch_mlir import ir
    for op in func_ops(module):
        if only is not None and not only(op):
            continue
        if not float_elementwise.is_float_generic(op) or len(op.results) != 1 \
                or L.element_type(op.results[0]) not in float_elementwise.FLOAT:
            continue
        value = ctx.const(op.results[0])
        if value is None:
            continue
        elem = L.element_type(op.results[0])
        new = float_contract.typed_constant(value, elem, op.location, ir.InsertionPoint(op))
        _replace(ctx, op, new.owner)


def _lower(module, ctx: Ctx, float_ops: bool = False) -> LoweringReport:
    for op in func_ops(module):
        try:
            _lower_root(ctx, op)
        except NotImplementedError as e:    # linalg our reader cannot evaluate: a reason, not a crash
            ctx.fail(op, f"cannot analyse this computation ({e})")
    for op in func_ops(module):
        for rule in OP_RULES:
            m = rule.match_op(ctx, op)
            if m is None or isinstance(m, Fail):
                continue
            _replace(ctx, op, rule.rewrite_op(ctx, op, m))
            break
    dce(module)
    ctx.erased()
    _materialize_constants(ctx, module)
    # Fallbacks: standalone quantize / dequantize generics.
    for op in func_ops(module):
        root = ctx.quant_root(op)
        if root is not None:
            m = QuantizeFallback().match(ctx, root)
            if not isinstance(m, Fail):
                _replace(ctx, root.op, QuantizeFallback().rewrite(ctx, root, m))
            continue
        g = ctx.generic(op)
        d = R.as_dequant(g) if g is not None else None
        if d is not None and L.np_dtype(g.inputs[d.source_index].type) in (np.int8, np.uint8):
            try:
                _replace(ctx, op, DequantizeFallback().rewrite(ctx, g))
            except ValueError as e:     # e.g. a per-channel dequantize feeding an unlowered op
                ctx.fail(op, f"standalone DequantizeLinear: {e}")
    dce(module)
    only = (lambda op: _in_island(ctx, op)) if ctx.islands else None     # (a set: islands on)
    if float_ops or only is not None:
        ctx.erased()
        _lower_float(ctx, module, only)
        dce(module)
        ctx.erased()
        _materialize_float_constants(ctx, module, only)
        dce(module)
    return report(module, ctx)


def _in_island(ctx: Ctx, op) -> bool:
    """An op of a node without an integer form, or a DequantizeLinear of a constant only such
    ops read (LayerNorm's int8 scale: the island takes its exact float value)."""
    if L.location_key(op) in ctx.islands:
        return True
    readers = [u.owner for r in op.results for u in r.uses]
    return ctx.onnx_op(op) == "DequantizeLinear" and bool(readers) and all(
        L.location_key(u) in ctx.islands for u in readers)


def _materialize_constants(ctx: Ctx, module) -> None:
    """A generic computed from constants only that torq_hl ops read (the Q of a scalar constant
    an int8 Add/Mul takes, e.g. GELU's +1 and ·0.5) becomes the arith.constant of its value."""
    from torch_mlir import ir
    for op in func_ops(module):
        if op.name != "linalg.generic" or L.element_type(op.results[0]) not in ("i8", "i16", "i32"):
            continue
        users = [u.owner.name for u in op.results[0].uses]
        if not users or not all(u.startswith("torq_hl.") for u in users):
            continue
        value = ctx.const(op.results[0])
        if value is not None:
            _replace(ctx, op, constant(value, L.element_type(op.results[0]), op.location, ir.InsertionPoint(op)).owner)


def _lower_root(ctx: Ctx, op) -> None:
    """Rewrite the quantize `op` (if it is one) with the first rule that matches it."""
    root = ctx.quant_root(op)
    if root is None:
        return
    for rule in RULES:
        m = rule.match(ctx, root)
        if isinstance(m, Fail) or m is None:
            continue
        try:
            new = rule.rewrite(ctx, root, m)
        except ValueError as e:     # numerics refuses a constant the hardware cannot hold
            new = ctx.fail(root.op, str(e))
        if isinstance(new, Fail):
            continue
        _replace(ctx, root.op, new)
        return


def report(module, ctx: Ctx | None = None) -> LoweringReport:
    return collect(func_ops(module), ctx, isa.runs_on_nss)
