"""Read linalg-on-tensors as quantization semantics.

torch-mlir emits every QuantizeLinear / DequantizeLinear / elementwise op as a `linalg.generic`
whose body is a little arith program. `body_tree` turns that program into an expression tree in
which everything that does not depend on a non-constant input is folded to a numpy constant;
`recognise.as_dequant` / `as_quant` then read the shapes that matter off those trees.

Constants (arith.constant, and anything computed from constants only: transposes, broadcasts,
reshapes, generics on constants) are folded with numpy in the exact MLIR dtypes.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..isa import ELEMENT_TYPES
from ..numerics import to_bf16

_NP = {**ELEMENT_TYPES, "index": np.int64}   # bf16 values are held in float32 arrays (numerics.to_bf16)


def np_dtype(mlir_type) -> type:
    s = str(mlir_type)
    if s.startswith("tensor<"):
        s = s[:-1].rsplit("x", 1)[-1] if "x" in s else s[7:-1]
    if s not in _NP:
        raise NotImplementedError(f"element type {s}")
    return _NP[s]


def shape_of(value) -> tuple[int, ...]:
    from torch_mlir import ir
    return tuple(ir.RankedTensorType(value.type).shape)


def element_type(value) -> str:
    from torch_mlir import ir
    t = value.type
    if isinstance(t, ir.RankedTensorType) or str(t).startswith("tensor<"):
        return str(ir.RankedTensorType(t).element_type)
    return str(t)


def producer(value):
    """The Operation that defines `value`, or None for block arguments."""
    from torch_mlir import ir
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def op_name(op) -> str:
    return op.operation.name if op is not None else ""


def attr_ints(op, name) -> list[int]:
    a = op.attributes[name]
    try:
        return [int(v) for v in np.array(a).ravel()]
    except Exception:  # noqa: BLE001 - DenseI64ArrayAttr
        return [int(v) for v in a]


def location_key(op) -> str:
    """'LINE:COL' of the op's (file) location, or '?'."""
    m = re.search(r":(\d+):(\d+)", str(op.location))
    return f"{m.group(1)}:{m.group(2)}" if m else "?"


# ---------------------------------------------------------------- constants

def attr_to_numpy(attr, mlir_type):
    from torch_mlir import ir
    if isinstance(attr, ir.DenseElementsAttr) or isinstance(attr, (ir.DenseIntElementsAttr, ir.DenseFPElementsAttr)):
        shape = tuple(ir.RankedTensorType(mlir_type).shape)
        dt = np_dtype(mlir_type)
        if str(ir.RankedTensorType(mlir_type).element_type) == "bf16":
            return bf16_dense(attr, shape)
        if attr.is_splat:
            v = attr.get_splat_value()
            return np.full(shape, _scalar(v), dtype=dt)
        return np.array(attr).astype(dt, copy=False).reshape(shape)
    if isinstance(attr, ir.IntegerAttr):
        return np.array(attr.value, dtype=np_dtype(mlir_type))
    if isinstance(attr, ir.FloatAttr):
        return np.array(attr.value, dtype=np_dtype(mlir_type))
    raise NotImplementedError(f"constant attribute {attr}")


def bf16_dense(attr, shape) -> np.ndarray:
    """A bf16 dense attribute as float32 values (the bindings' buffer protocol has no bf16): read
    from its text, ``dense<"0x...">`` (little-endian bit patterns), a splat or a value list."""
    text = str(attr)
    body = text[text.index("<") + 1:text.rindex("> :")].strip()
    if body.startswith('"0x'):
        bits = np.frombuffer(bytes.fromhex(body[3:-1]), dtype="<u2")
        vals = (bits.astype(np.uint32) << 16).view(np.float32)
    else:
        toks = re.findall(r"0x[0-9A-Fa-f]+|[-+]?(?:inf|nan|[0-9.]+(?:[eE][-+]?[0-9]+)?)", body)
        vals = np.array([np.array([int(t, 16) << 16], np.uint32).view(np.float32)[0] if t.startswith("0x")
                         else np.float32(t) for t in toks], np.float32)
        vals = to_bf16(vals)        # decimals print with 7 digits: the nearest bf16 is the value
    n = int(np.prod(shape)) if shape else 1
    if vals.size not in (1, n):
        return _bad_dense(text)
    return np.broadcast_to(vals.reshape(-1)[:n] if vals.size == n else vals.reshape(()), (n,)).reshape(shape).copy()


def _bad_dense(text):
    raise NotImplementedError(f"bf16 constant {text[:60]}")


def _scalar(v):
    from torch_mlir import ir
    if isinstance(v, ir.IntegerAttr):
        return v.value
    if isinstance(v, ir.FloatAttr):
        return v.value
    return v


class Folder:
    """Memoised numpy values of SSA values computable from constants only (None otherwise)."""

    def __init__(self):
        self._cache: dict = {}

    def value(self, v):
        key = _key(v)
        if key in self._cache:
            return self._cache[key]
        self._cache[key] = None  # cycle guard
        try:
            out = self._compute(v)
        except NotImplementedError:
            out = None
        self._cache[key] = out
        return out

    def _compute(self, v):
        op = producer(v)
        if op is None:
            return None
        name = op.name
        if name == "arith.constant":
            return attr_to_numpy(op.attributes["value"], v.type)
        if name == "linalg.transpose":
            x = self.value(op.operands[0])
            return None if x is None else np.ascontiguousarray(np.transpose(x, attr_ints(op, "permutation")))
        if name == "linalg.broadcast":
            x = self.value(op.operands[0])
            if x is None:
                return None
            out_shape = shape_of(op.results[0])
            dims = attr_ints(op, "dimensions")
            return np.broadcast_to(np.expand_dims(x, tuple(dims)), out_shape).copy()
        if name in ("tensor.collapse_shape", "tensor.expand_shape", "tensor.reshape", "tensor.cast"):
            x = self.value(op.operands[0])
            return None if x is None else x.reshape(shape_of(op.results[0]))
        if name == "linalg.fill":
            x = self.value(op.operands[0])
            return None if x is None else np.full(shape_of(op.results[0]), x, dtype=np_dtype(op.results[0].type))
        if name == "linalg.generic":
            g = Generic(op, self)
            if g.parallel and not g.var_inputs:
                return g.evaluate()
        if name == "tensor.extract":
            x = self.value(op.operands[0])
            idx = [self.value(i) for i in list(op.operands)[1:]]
            return None if x is None or any(i is None for i in idx) else np.asarray(x[tuple(int(i) for i in idx)])
        if name.startswith(("arith.", "math.")) and len(op.results) == 1:   # scalar arithmetic on constants
            args = [self.value(o) for o in op.operands]
            if any(a is None for a in args):
                return None
            attr = str(op.attributes["predicate"]) if "predicate" in op.attributes else ""
            return np.asarray(eval_node(Node(name, tuple(args), attr + "|" + str(op.results[0].type)), {}))
        return None


def _key(v):
    op = producer(v)
    if op is None:     # a block argument (never Value.get_name(): it numbers the whole function)
        return ("arg", v)
    return ("res", id_of(op), v.result_number if hasattr(v, "result_number") else 0)


def id_of(op):
    """Stable identity of an Operation within one module (the bindings create new wrappers)."""
    return op.operation if hasattr(op, "operation") else op


# ---------------------------------------------------------------- generic bodies

@dataclass(frozen=True)
class Arg:
    index: int  # position among the generic's inputs


@dataclass(frozen=True)
class Index:
    dim: int    # linalg.index: the iteration coordinate along `dim` (e.g. a pool's per-position count)


@dataclass(frozen=True)
class Node:
    op: str
    args: tuple
    attr: str = ""


class Generic:
    """A linalg.generic seen as: inputs (some constant), an expression tree for its yield."""

    def __init__(self, op, folder: Folder, force_var=()):
        """`force_var`: input indices treated as variables even when constant (to read a DQ of a constant)."""
        from torch_mlir import ir
        self.op = op
        self.folder = folder
        n_in = len(op.regions[0].blocks[0].arguments) - len(op.results)   # block args: ins, then outs
        self.inputs = list(op.operands)[:n_in]
        self.out_shape = shape_of(op.results[0])
        its = [str(a) for a in op.attributes["iterator_types"]]
        self.parallel = all("parallel" in s for s in its)
        self.maps = [ir.AffineMapAttr(m).value for m in op.attributes["indexing_maps"]]
        self.consts = {}
        self.var_inputs = []
        for i, v in enumerate(self.inputs):
            c = None if i in force_var else folder.value(v)
            if c is None:
                self.var_inputs.append(i)
            else:
                self.consts[i] = c
        self.block = op.regions[0].blocks[0]
        self._tree = None       # built on first use: every recogniser reads the same tree

    def in_iteration_space(self, i, arr):
        """Input array re-laid on the iteration dims (missing dims as size-1 axes).

        Indexing-map results must be dims, or the constant 0 on a size-1 axis (a broadcast)."""
        from torch_mlir import ir
        m = self.maps[i]
        arr = np.asarray(arr)
        if arr.ndim != len(m.results):
            raise NotImplementedError("rank mismatch")
        dims, keep = [], []
        for k, e in enumerate(m.results):
            if _is_dim(e):
                dims.append(e.position)
                keep.append(k)
            elif str(e) == "0" and arr.shape[k] == 1:
                continue
            else:
                raise NotImplementedError(f"indexing map result {e}")
        arr = arr.reshape([arr.shape[k] for k in keep])
        n = m.n_dims
        order = sorted(range(len(dims)), key=lambda k: dims[k])
        arr = np.transpose(arr, order)
        present = sorted(dims)
        shape = [1] * n
        for k, d in enumerate(present):
            shape[d] = arr.shape[k]
        return arr.reshape(shape)

    def tree(self):
        """Expression tree of the yielded value with constant sub-expressions folded (memoised)."""
        if self._tree is None:
            self._tree = self._build_tree()
        return self._tree

    def tree_of(self, value):
        """Expression tree of one value of the body (e.g. a reduction's addend)."""
        return self._build_tree(value)

    def _build_tree(self, root=None):
        memo = {}
        yield_op = list(self.block.operations)[-1]

        def build(v):
            from torch_mlir import ir
            owner = v.owner
            if isinstance(owner, ir.Block):
                if owner != self.block:
                    raise NotImplementedError("captured block argument")
                i = ir.BlockArgument(v).arg_number
                if i >= len(self.inputs):
                    raise NotImplementedError("generic reads its output")
                if i in self.consts:
                    return self.in_iteration_space(i, self.consts[i])
                return Arg(i)
            op = owner.operation if hasattr(owner, "operation") else owner
            if _outside(op, self.op):
                c = self.folder.value(v)
                if c is None:
                    raise NotImplementedError(f"captured non-constant {op.name}")
                return c
            k = id_of(op)
            if k in memo:
                return memo[k]
            name = op.name
            if name == "arith.constant":
                r = attr_to_numpy(op.attributes["value"], v.type)
            elif name == "linalg.index":
                r = Index(int(op.attributes["dim"].value))
            else:
                kids = tuple(build(o) for o in op.operands)
                attr = str(op.attributes["predicate"]) if "predicate" in op.attributes else ""
                rtype = str(op.results[0].type)
                node = Node(name, kids, attr + "|" + rtype)
                r = node if any(_is_var(c) for c in kids) else eval_node(node, ())
            memo[k] = r
            return r

        return build(yield_op.operands[0] if root is None else root)

    def tree_or_none(self):
        """tree(), or None for a body this reader cannot evaluate (e.g. linalg.index): the
        recognisers then simply do not match, and the op is reported with a reason."""
        try:
            return self.tree()
        except NotImplementedError:
            return None

    def evaluate(self, var_values: dict | None = None, out_shape=None):
        """Numpy result of the generic for given non-constant inputs (all-parallel generics)."""
        env = {}
        for i in self.var_inputs:
            env[i] = self.in_iteration_space(i, var_values[i])
        n = len(self.out_shape)
        for d in range(n):   # linalg.index d: coordinates along d (identity output map)
            env[("index", d)] = np.arange(self.out_shape[d]).reshape([-1 if k == d else 1 for k in range(n)])
        t = self.tree()
        out = eval_node(t, env) if _is_var(t) else t
        out = np.broadcast_to(out, self.out_shape if out_shape is None else out_shape)
        # np.array, not np.ascontiguousarray: the latter turns a rank-0 result into shape (1,)
        return np.array(out, dtype=np_dtype(self.op.results[0].type), order="C")


def _is_dim(e) -> bool:
    from torch_mlir import ir
    return isinstance(e, ir.AffineDimExpr)     # map results come downcast (a cast that fails costs 30 µs)


def _outside(op, generic) -> bool:
    p = op.parent
    while p is not None:
        if id_of(p) == id_of(generic):
            return False
        p = p.parent
    return True


def _is_var(x) -> bool:
    return isinstance(x, (Arg, Node, Index))


def _rtype(node: Node):
    return np_dtype(node.attr.split("|", 1)[1])


def eval_node(t, env):
    """Evaluate an expression tree with numpy, in the MLIR result dtypes (IEEE float32 ops; a bf16
    result is the float32 one rounded to bf16, see numerics.bf16_arith)."""
    r = _eval(t, env)
    return to_bf16(r) if isinstance(t, Node) and t.attr.endswith("|bf16") else r


def _eval(t, env):
    if isinstance(t, Arg):
        return env[t.index]
    if isinstance(t, Index):
        return env[("index", t.dim)]
    if not isinstance(t, Node):
        return t
    a = [eval_node(x, env) for x in t.args]
    name, rt = t.op, _rtype(t)
    with np.errstate(all="ignore"):
        if name in ("arith.extsi", "arith.trunci", "arith.sitofp", "arith.truncf", "arith.extf", "arith.index_cast"):
            return np.asarray(a[0]).astype(rt)
        if name == "arith.extui":
            src = np.asarray(a[0])
            return src.view(np.dtype(src.dtype.str.replace("i", "u"))).astype(rt) if src.dtype.kind == "i" else src.astype(rt)
        if name == "arith.uitofp":
            src = np.asarray(a[0])
            return src.view(np.dtype(src.dtype.str.replace("i", "u"))).astype(rt)
        if name in ("arith.fptosi", "arith.fptoui"):
            return np.trunc(np.asarray(a[0])).astype(rt)
        if name in ("arith.addf", "arith.addi"):
            return np.add(a[0], a[1], dtype=rt)
        if name in ("arith.subf", "arith.subi"):
            return np.subtract(a[0], a[1], dtype=rt)
        if name in ("arith.mulf", "arith.muli"):
            return np.multiply(a[0], a[1], dtype=rt)
        if name == "arith.divf":
            return np.divide(a[0], a[1], dtype=rt)
        if name == "arith.divsi":
            return (np.trunc(np.asarray(a[0], np.float64) / np.asarray(a[1], np.float64))).astype(rt)
        if name in ("arith.maximumf", "arith.maxsi", "arith.maxnumf"):
            return np.maximum(a[0], a[1]).astype(rt)
        if name in ("arith.minimumf", "arith.minsi", "arith.minnumf"):
            return np.minimum(a[0], a[1]).astype(rt)
        if name == "arith.negf":
            return np.negative(a[0]).astype(rt)
        if name == "math.roundeven":
            return np.rint(a[0]).astype(rt)
        if name == "math.round":
            x = np.asarray(a[0])
            return (np.sign(x) * np.floor(np.abs(x) + 0.5)).astype(rt)
        if name == "math.floor":
            return np.floor(a[0]).astype(rt)
        if name in _UNARY_MATH:
            return _UNARY_MATH[name](np.asarray(a[0])).astype(rt)
        if name == "math.powf":
            return np.power(a[0], a[1], dtype=rt)
        if name == "arith.select":
            return np.where(a[0], a[1], a[2]).astype(rt)
        if name == "arith.cmpf":
            return _cmp(t.attr.split("|")[0], a[0], a[1], ordered=True)
        if name == "arith.cmpi":
            return _cmp(t.attr.split("|")[0], a[0], a[1], ordered=False)
    raise NotImplementedError(f"{name} in linalg.generic body")


# Float32 in, float32 out; erf has no numpy ufunc: float64 math.erf rounded once to float32.
_UNARY_MATH = {
    "math.exp": np.exp, "math.tanh": np.tanh, "math.sqrt": np.sqrt, "math.log": np.log,
    "math.absf": np.abs, "math.ceil": np.ceil, "math.trunc": np.trunc,
    "math.rsqrt": lambda x: np.float32(1) / np.sqrt(x),
    "math.erf": lambda x: np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)).astype(np.float64),
}


def _cmp(pred: str, x, y, ordered):
    p = pred.split(":")[0].strip().split()[-1] if pred else ""
    # predicates print as integers (e.g. "2 : i64"); map the common ones
    code = int(p) if p.lstrip("-").isdigit() else None
    if ordered:  # arith.cmpf: 1 oeq 2 ogt 3 oge 4 olt 5 ole 6 one 8 ueq 9 ugt 10 uge 11 ult 12 ule 13 une
        ops = {1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal, 6: np.not_equal,
               8: np.equal, 9: np.greater, 10: np.greater_equal, 11: np.less, 12: np.less_equal, 13: np.not_equal}
    else:  # arith.cmpi: 0 eq 1 ne 2 slt 3 sle 4 sgt 5 sge
        ops = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater, 5: np.greater_equal}
    if code not in ops:
        raise NotImplementedError(f"compare predicate {pred}")
    return ops[code](x, y)

