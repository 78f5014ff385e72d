"""bf16 / f32 linalg.generic ops -> torq_hl.elementwise and torq_hl.reduce (bf16 models).

    generic{parallel}(x, y, ...) -> torq_hl.elementwise{body, constants, maps}(x, y, ...)
    generic{reduction}(x) with body out + f(x) | max(out, f(x)) -> [elementwise f] -> torq_hl.reduce

The body becomes ALU / ACT nodes (``Body``), each rounding to its own element type
(numerics.bf16_arith); a body computing sigmoid as 1/(1+exp(-x)) is one ``sigmoid`` node, as
the reference's SigmoidPattern makes it one table. Operands keep their own shapes; ``maps``
says how each lays on the iteration space (broadcasts and constant-0 axes included).
"""
from __future__ import annotations

import numpy as np

from .. import linalg_view as L
from ..linalg_view import Arg, Index, Node
from .common import Fail, empty

FLOAT = ("bf16", "f32")

_BINARY = {"arith.addf": "add", "arith.subf": "sub", "arith.mulf": "mul", "arith.divf": "div",
           "arith.maximumf": "max", "arith.maxnumf": "max", "arith.minimumf": "min", "arith.minnumf": "min",
           "math.powf": "pow", "arith.addi": "iadd", "arith.subi": "isub", "arith.muli": "imul",
           "arith.maxsi": "imax", "arith.minsi": "imin", "arith.divsi": "idiv"}
_UNARY = {"arith.negf": "neg", "math.exp": "exp", "math.erf": "erf", "math.tanh": "tanh", "math.sqrt": "sqrt",
          "math.rsqrt": "rsqrt", "math.log": "log", "math.absf": "abs", "math.floor": "floor", "math.ceil": "ceil"}
_CASTS = ("arith.extf", "arith.truncf", "arith.sitofp", "arith.uitofp", "arith.fptosi", "arith.index_cast",
          "arith.extsi", "arith.trunci")
_CMPF = {1: "oeq", 2: "ogt", 3: "oge", 4: "olt", 5: "ole", 6: "one", 8: "ueq", 9: "ugt", 10: "uge", 11: "ult",
         12: "ule", 13: "une"}
_CMPI = {0: "eq", 1: "ne", 2: "slt", 3: "sle", 4: "sgt", 5: "sge"}


def _rtype(node: Node) -> str:
    return node.attr.split("|", 1)[1]


def _pred(node: Node) -> str:
    code = node.attr.split("|")[0].split(":")[0].strip().split()[-1]
    table = _CMPF if node.op == "arith.cmpf" else _CMPI
    return table[int(code)]


def _is_const(x, value=None) -> bool:
    if isinstance(x, (Arg, Node, Index)):
        return False
    a = np.asarray(x)
    return a.size == 1 and (value is None or float(a.ravel()[0]) == value)


def _sigmoid_arg(t):
    """x when ``t`` is 1 / (1 + exp(-x)) (either operand order of the add), else None."""
    if not (isinstance(t, Node) and t.op == "arith.divf" and _is_const(t.args[0], 1.0)):
        return None
    d = t.args[1]
    if not (isinstance(d, Node) and d.op == "arith.addf"):
        return None
    e = d.args[0] if _is_const(d.args[1], 1.0) else d.args[1] if _is_const(d.args[0], 1.0) else None
    if isinstance(e, Node) and e.op == "math.exp" and isinstance(e.args[0], Node) and e.args[0].op == "arith.negf":
        return e.args[0].args[0]
    return None


class Body:
    """A body tree as numbered nodes: ``lines`` ("%k = op type args"), scalar ``constants``."""

    def __init__(self):
        self.lines: list[str] = []
        self.constants: list[float] = []
        self._memo: dict = {}

    def text(self, inputs=()) -> str:
        """"a0:bf16 a1:f32; %0 = ...": the operands' element types, then the nodes."""
        types = " ".join(f"a{i}:{L.element_type(v)}" for i, v in enumerate(inputs))
        return "; ".join(([types] if types else []) + self.lines)

    def ref(self, t) -> str:
        if isinstance(t, Arg):
            return f"a{t.index}"
        if isinstance(t, Index):
            return f"i{t.dim}"
        if not isinstance(t, Node):
            a = np.asarray(t)
            if a.size != 1:
                raise NotImplementedError("a non-scalar constant inside the body")
            self.constants.append(float(a.ravel()[0]))
            return f"c{len(self.constants) - 1}"
        key = id(t)
        if key not in self._memo:
            self._memo[key] = self._node(t)
        return self._memo[key]

    def _node(self, t: Node) -> str:
        x = _sigmoid_arg(t)
        if x is not None:
            return self._emit("sigmoid", _rtype(t), [self.ref(x)])
        if t.op in _BINARY:
            return self._emit(_BINARY[t.op], _rtype(t), [self.ref(a) for a in t.args])
        if t.op in _UNARY:
            return self._emit(_UNARY[t.op], _rtype(t), [self.ref(t.args[0])])
        if t.op in _CASTS:
            return self._emit("cast", _rtype(t), [self.ref(t.args[0])])
        if t.op in ("arith.cmpf", "arith.cmpi"):
            return self._emit(f"cmp.{_pred(t)}", "i1", [self.ref(a) for a in t.args])
        if t.op == "arith.select":
            return self._emit("select", _rtype(t), [self.ref(a) for a in t.args])
        raise NotImplementedError(f"{t.op} in a float body")

    def _emit(self, op: str, elem: str, args: list[str]) -> str:
        self.lines.append(f"%{len(self.lines)} = {op} {elem} {' '.join(args)}")
        return f"%{len(self.lines) - 1}"


def operand_maps(g: L.Generic, indices) -> list[int]:
    """[rank, dim per axis (-1 for a constant-0 axis)] for each listed operand's indexing map."""
    from torch_mlir import ir
    out = []
    for i in indices:
        res = list(g.maps[i].results)
        out.append(len(res))
        for e in res:
            if isinstance(e, ir.AffineDimExpr):
                out.append(e.position)
            elif str(e) == "0":
                out.append(-1)
            else:
                raise NotImplementedError(f"indexing map result {e}")
    return out


def is_float_generic(op) -> bool:
    if op.name != "linalg.generic":
        return False
    types = [L.element_type(v) for v in list(op.operands) + list(op.results)]
    return any(t in FLOAT for t in types)


def lower_elementwise(ctx, op):
    """An all-parallel float generic -> one torq_hl.elementwise (or a Fail with the reason)."""
    if len(op.results) != 1:
        return ctx.fail(op, "a float elementwise body with several results")
    g = L.Generic(op, ctx.folder, force_var=tuple(range(len(op.regions[0].blocks[0].arguments) - 1)))
    try:
        body = Body()
        body.ref(g.tree())
        maps = operand_maps(g, range(len(g.inputs)))
        n = len(g.out_shape)
        if operand_maps(g, [len(g.inputs)]) != [n, *range(n)]:
            return ctx.fail(op, "a float elementwise op writing its result transposed")
    except (NotImplementedError, KeyError, ValueError) as e:
        return ctx.fail(op, f"no torq_hl form for this float computation ({e})")
    if not body.lines:       # the body yields an input or a constant: a copy / broadcast
        body.lines.append(f"%0 = cast {L.element_type(op.results[0])} {body.ref(g.tree())}")
    return emit_op("elementwise", op, g.inputs, dict(body=body.text(g.inputs), constants=body.constants, maps=maps))


def emit_op(name: str, at, operands, attrs: dict, result_type=None):
    """torq_hl.<name>(init, *operands) right before ``at``, typed like its first result."""
    from torch_mlir import ir

    from .. import torq_hl
    ip = ir.InsertionPoint(at)
    rtype = result_type or at.results[0].type
    init = empty(rtype, at.location, ip)
    return torq_hl.create(name, rtype, [init, *operands], attrs, at.location, ip)


# ----------------------------------------------------------------------------- reductions

def lower_reduction(ctx, op):
    """A float reduction generic: ``out = out + f(ins)`` (sum) or ``max(out, f(ins))`` over the
    reduction dims, with a neutral init (0 / -inf) -> [elementwise f] -> torq_hl.reduce."""
    from torch_mlir import ir
    block = op.regions[0].blocks[0]
    n_out = len(op.results)
    n_in = len(block.arguments) - n_out
    if n_out > 1 and any(next(iter(r.uses), None) is not None for r in list(op.results)[1:]):
        return ctx.fail(op, "a reduction whose second result (an arg-max index) is used")
    g = L.Generic(op, ctx.folder, force_var=tuple(range(n_in)))
    yielded = list(block.operations)[-1].operands[0]
    owner = yielded.owner
    comb = None if isinstance(owner, ir.Block) else getattr(owner, "operation", owner)
    out_arg = block.arguments[n_in]
    kinds = {"arith.addf": "sum", "arith.maximumf": "max", "arith.maxnumf": "max"}
    if comb is None or comb.name not in kinds or out_arg not in list(comb.operands):
        return ctx.fail(op, "a reduction other than a float sum or max")
    mode = kinds[comb.name]
    addend = [v for v in comb.operands if v != out_arg][0]
    neutral = 0.0 if mode == "sum" else -np.inf
    init = ctx.const(op.operands[n_in])
    if init is None or not np.all(np.asarray(init, np.float64) == neutral):
        return ctx.fail(op, f"a {mode} reduction whose initial value is not {neutral}")
    its = [str(a) for a in op.attributes["iterator_types"]]
    red = [d for d, s in enumerate(its) if "reduction" in s]
    try:
        tree = g.tree_of(addend)
        out_map = operand_maps(g, [n_in])[1:]
        in_maps = operand_maps(g, range(n_in))
    except NotImplementedError as e:
        return ctx.fail(op, f"no torq_hl form for this reduction ({e})")
    kept = [d for d in out_map if d >= 0]
    if kept != [d for d in range(len(its)) if d not in red]:
        return ctx.fail(op, "a reduction whose result is laid out transposed")
    src = _reduce_source(op, g, tree, in_maps, len(its))
    count = int(np.prod([_iteration_shape(g, in_maps, len(its))[d] for d in red]))
    div = _mean_divide(ctx, op, count) if mode == "sum" else None
    if div is not None:      # sum then divide by the count: one reduce_mean, rounded once
        return div, emit_op("reduce", div, [src], dict(mode="mean", dims=red))
    return op, emit_op("reduce", op, [src], dict(mode=mode, dims=red))


def _mean_divide(ctx, op, count: int):
    """The divide generic reading only this sum and dividing it by ``count``, else None."""
    uses = list(op.results[0].uses)
    user = uses[0].owner if len(uses) == 1 else None
    if user is None or user.name != "linalg.generic" or len(user.results) != 1:
        return None
    g = ctx.generic(user)
    if g is None or not g.parallel or g.var_inputs != [0] or len(g.inputs) != 1:
        return None
    t = g.tree_or_none()
    if not (isinstance(t, Node) and t.op == "arith.divf" and isinstance(t.args[0], Arg)
            and _is_const(t.args[1], float(count))):
        return None
    if L.shape_of(user.results[0]) != L.shape_of(op.results[0]):
        return None
    return user


def _reduce_source(op, g, tree, in_maps, n_dims):
    """The tensor to reduce, laid on the iteration space: an input that already is, else an
    elementwise op computing the addend f there (a copy when f is just a transposed input)."""
    from torch_mlir import ir
    identity = [n_dims, *range(n_dims)]
    if isinstance(tree, Arg):
        pos = _map_offset(in_maps, tree.index)
        if in_maps[pos:pos + 1 + in_maps[pos]] == identity:
            return g.inputs[tree.index]
    body = Body()
    body.ref(tree)
    if not body.lines:
        body.lines.append(f"%0 = cast {L.element_type(g.inputs[tree.index])} {body.ref(tree)}")
    shape = _iteration_shape(g, in_maps, n_dims)
    elem = _ir_elem(body.lines[-1].split()[3])
    new = emit_op("elementwise", op, g.inputs, dict(body=body.text(g.inputs), constants=body.constants, maps=in_maps),
                  result_type=ir.RankedTensorType.get(shape, elem))
    return new.results[0]


def _ir_elem(name: str):
    from torch_mlir import ir
    return {"bf16": ir.BF16Type.get(), "f32": ir.F32Type.get(), "f64": ir.F64Type.get()}[name]


def _map_offset(maps: list, k: int) -> int:
    pos = 0
    for _ in range(k):
        pos += 1 + maps[pos]
    return pos


def _iteration_shape(g, in_maps, n_dims) -> list[int]:
    shape = [1] * n_dims
    pos = 0
    for v in g.inputs:
        rank = in_maps[pos]
        for axis, d in enumerate(in_maps[pos + 1:pos + 1 + rank]):
            if d >= 0:
                shape[d] = max(shape[d], L.shape_of(v)[axis])
        pos += 1 + rank
    return shape


def is_reduction(op) -> bool:
    return any("reduction" in str(a) for a in op.attributes["iterator_types"])


def lower_generic(ctx, op):
    """The float generic rule: reductions, else elementwise. (last op replaced, new op) or a Fail."""
    if is_reduction(op):
        return lower_reduction(ctx, op)
    new = lower_elementwise(ctx, op)
    return new if isinstance(new, Fail) else (op, new)


__all__ = ["lower_generic", "is_float_generic", "emit_op", "Body", "operand_maps", "Fail"]
