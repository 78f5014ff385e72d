"""Rewrite ORT-quantized (QOperator) ONNX models into the standard QDQ form torch-mlir imports.

torch-mlir 20261001 cannot lower ``com.microsoft`` contrib ops: ONNX shape inference leaves
their results untyped (imported as ``!torch.none``) and most have no conversion at all
(``QGemm``). It also lowers per-channel ``QLinearConv`` with a bias wrongly: the int32 bias is
cast to f32 without the ``x_scale*w_scale[c]`` factor (llvm/torch-mlir PR #4645). Each rewrite
below replaces one node by DequantizeLinear (DQ) -> float op -> QuantizeLinear (Q) with the
*same* scales, zero points and int32 bias (bias scale = x_scale*w_scale, zero point 0), so the
integer semantics are unchanged; ORT fuses these groups back into the same QLinear kernels.

* ``QLinearAdd -> DQ, DQ, Add, Q`` and ``QLinearMul -> DQ, DQ, Mul, Q``: contrib binary ops,
  untyped after shape inference.
* ``QGemm -> DQ(A), DQ(B), DQ(C), Gemm, [Q]``: no torch-mlir conversion. B is per-channel along
  N (axis 0 if transB else 1). ORT computes ``alpha*a_scale*b_scale*(A'B' + C)``, so C is
  dequantized with scale ``fl32(fl32(alpha*a_scale)*b_scale)`` (= a_scale*b_scale for the
  usual alpha = 1), zero point 0, and Gemm keeps alpha, transA, transB with beta = 1. Without
  y_scale the Gemm output stays float, as QGemm's does.
* ``QLinearGlobalAveragePool -> DQ, GlobalAveragePool, Q`` and
  ``QLinearAveragePool -> DQ, AveragePool, Q`` (pool attributes minus ``channels_last``;
  ``channels_last=1`` is rejected).
* ``QLinearSigmoid -> DQ, Sigmoid, Q``, ``QLinearLeakyRelu -> DQ, LeakyRelu(alpha), Q``,
  ``QLinearSoftmax -> DQ, Softmax(axis), Q``: contrib lookup-table ops.
* ``QLinearConcat -> DQ per input, Concat(axis), Q``: contrib variadic op.
* ``QLinearConv`` with per-channel w_scale ``-> DQ(x), DQ(w, axis 0),
  [DQ(bias, scale fl32(x_scale*w_scale), zp 0)], Conv, Q``: works around the torch-mlir bias
  bug, and keeps the integer weights visible (torch-mlir folds them to float otherwise).
  The same for any QLinearConv with asymmetric pads: torch-mlir's QLinearConv lowering crashes
  (segfault) on them, while the QDQ Conv path pads explicitly; and for 1-D QLinearConv, whose
  quantized aten.convolution torch-mlir cannot legalize. Other per-tensor QLinearConv
  are kept (lowered correctly).
* ``QLinearMatMul`` with per-column b_scale ``-> DQ(a), DQ(b, last axis), MatMul, Q``: torch-mlir
  would fold the per-column scale into float weights and lose the integers. Per-tensor ones stay.
* Any other ``com.microsoft`` op raises TorqError naming the node.

Rewritten nodes keep their output tensor names; new tensors and nodes are named after the
original node. Per-axis DQ needs opset 13 (and torch-mlir imports MaxPool from opset 12), so an
older default-domain opset is converted with onnx.version_converter; the ``com.microsoft`` import is dropped once unused. The result
passes onnx.checker (full check) and carries inferred value_info for every tensor.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ... import numerics
from .pool_ceil import ceil_pools_to_floor
from ...graph.walk import subgraphs
from ...errors import TorqError, one_line

__all__ = ["canonicalize", "REWRITES"]

MS = "com.microsoft"
_PER_AXIS_OPSET = 13
#: ops torch-mlir's ONNX importer converts only from a later default-domain opset than their first
#: (its patterns are registered "since" that version; read from TorchOnnxToTorch/DefaultDomain*.cpp):
#: a model below it is converted up (a Paddle export at opset 11: MaxPool, Softmax)
_IMPORTER_SINCE = {
    "Add": 7, "Mul": 7, "Div": 7, "Greater": 7, "Elu": 6, "Exp": 6, "HardSigmoid": 6, "Selu": 6, "Tile": 6,
    "InstanceNormalization": 6, "Reshape": 5, "Shape": 9, "Upsample": 9, "Concat": 11, "ConvTranspose": 11,
    "Flatten": 11, "Resize": 11, "TopK": 11, "Dropout": 12, "MaxPool": 12, "Ceil": 13, "Floor": 13, "Erf": 13,
    "Less": 13, "Mod": 13, "Loop": 13, "Slice": 13, "Softmax": 13, "Unsqueeze": 13, "ReduceMax": 13,
    "ReduceMin": 13, "ReduceProd": 13, "GatherElements": 13, "GatherND": 13, "NonZero": 13,
    "BatchNormalization": 15, "GreaterOrEqual": 16, "LpPool": 18,
}


@dataclass
class _Ctx:
    """Per-node rewrite state: constants lookup, fresh names, emitted nodes/initializers."""
    node: onnx.NodeProto
    inits: dict
    taken: set
    new_inits: list
    model_opset: int
    nodes: list = field(default_factory=list)
    per_axis: bool = False
    ranks: dict = field(default_factory=dict)   # tensor name -> rank (inferred), for QLinearMatMul

    @property
    def base(self) -> str:
        return self.node.name or self.node.output[0]

    def fail(self, why: str) -> TorqError:
        n = self.node
        return TorqError(f"canonicalize: node {self.base!r} ({n.domain or 'ai.onnx'}.{n.op_type}): {why}")

    def fresh(self, suffix: str) -> str:
        name, i = f"{self.base}_{suffix}", 1
        while name in self.taken:
            name, i = f"{self.base}_{suffix}_{i}", i + 1
        self.taken.add(name)
        return name

    def const(self, name: str) -> np.ndarray:
        if name not in self.inits:
            raise self.fail(f"'{name}' must be a constant initializer")
        return numpy_helper.to_array(self.inits[name])

    def add_init(self, suffix: str, value: np.ndarray) -> str:
        name = self.fresh(suffix)
        self.new_inits.append(numpy_helper.from_array(np.asarray(value), name))
        self.inits[name] = self.new_inits[-1]
        return name

    def scalar(self, name: str) -> str:
        """A 1-element 1-D scale/zero point as a true scalar (ONNX reads 1-D as per-axis)."""
        t = self.inits.get(name)
        if t is None or len(t.dims) == 0 or int(np.prod(t.dims)) != 1:
            return name
        return self.add_init("scalar", numpy_helper.to_array(t).reshape(()))

    def emit(self, op: str, inputs: list, suffix: str, output: str | None = None, **attrs) -> str:
        while inputs and not inputs[-1]:      # trailing optional inputs
            inputs = inputs[:-1]
        out = output or self.fresh(suffix)
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{self.base}/{suffix}", **attrs))
        return out

    def dq(self, x: str, scale: str, zp: str, suffix: str, axis: int | None = None) -> str:
        if axis is None:
            return self.emit("DequantizeLinear", [x, self.scalar(scale), self.scalar(zp) if zp else ""], suffix)
        self.per_axis = True
        if zp in self.inits and scale in self.inits:   # per-axis DQ needs zp shaped like scale
            z, n = numpy_helper.to_array(self.inits[zp]), int(np.prod(self.inits[scale].dims))
            if z.size == 1 and n > 1:
                zp = self.add_init("zp", np.full(n, z.reshape(()), z.dtype))
        return self.emit("DequantizeLinear", [x, scale, zp], suffix, axis=axis)

    def q(self, y: str, scale: str, zp: str, *other_zps: str) -> str:
        if not zp:   # QuantizeLinear without zp makes uint8; the QLinear op keeps its input type
            src = next((z for z in other_zps if z in self.inits), None)
            if src is None:
                raise self.fail("output zero point is omitted and its type is unknown")
            zp = self.add_init("y_zp", np.zeros((), numpy_helper.to_array(self.inits[src]).dtype))
        return self.emit("QuantizeLinear", [y, self.scalar(scale), self.scalar(zp)], "q",
                         output=self.node.output[0])


def _inputs(node: onnx.NodeProto, n: int) -> list:
    return list(node.input) + [""] * (n - len(node.input))


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _binary(op: str):
    def rewrite(cx: _Ctx) -> None:
        a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = _inputs(cx.node, 8)
        y = cx.emit(op, [cx.dq(a, a_s, a_zp, "dq_a"), cx.dq(b, b_s, b_zp, "dq_b")], op.lower())
        cx.q(y, y_s, y_zp, a_zp, b_zp)
    return rewrite


def _unary(op: str):
    def rewrite(cx: _Ctx) -> None:
        x, x_s, x_zp, y_s, y_zp = _inputs(cx.node, 5)
        attrs = _attrs(cx.node)
        if attrs.pop("channels_last", 0):
            raise cx.fail("channels_last=1 is not supported")
        if op == "Softmax":
            attrs = _softmax_attrs(cx, attrs)
        y = cx.emit(op, [cx.dq(x, x_s, x_zp, "dq")], op.lower(), **attrs)
        cx.q(y, y_s, y_zp, x_zp)
    return rewrite


def _softmax_attrs(cx: _Ctx, attrs: dict) -> dict:
    # QLinearSoftmax's `opset` records which Softmax semantics it follows (before 13: the
    # input is coerced to 2-D at `axis`). The emitted Softmax follows the model's opset.
    axis, since = attrs.get("axis", -1), attrs.get("opset", _PER_AXIS_OPSET)
    if (since >= _PER_AXIS_OPSET) != (cx.model_opset >= _PER_AXIS_OPSET) and axis != -1:
        raise cx.fail(f"Softmax semantics of opset {since} differ from the model's opset {cx.model_opset}")
    return {"axis": axis}


def _qgemm(cx: _Ctx) -> None:
    a, a_s, a_zp, b, b_s, b_zp, c, y_s, y_zp = _inputs(cx.node, 9)
    attrs = _attrs(cx.node)
    alpha, trans_a, trans_b = float(attrs.get("alpha", 1.0)), attrs.get("transA", 0), attrs.get("transB", 0)
    bs = cx.const(b_s).astype(np.float32)
    per_ch = bs.size > 1
    inputs = [cx.dq(a, a_s, a_zp, "dq_a"),
              cx.dq(b, b_s, b_zp, "dq_b", axis=(0 if trans_b else 1) if per_ch else None)]
    if c:
        # ORT: y = alpha*a_s*b_s*(acc + C); same float32 product order as its output scale.
        c_scale = numerics.dq_scale(cx.const(a_s).reshape(()), bs.reshape(-1), alpha)
        c_axis = None
        if per_ch:
            c_shape = cx.inits[c].dims if c in cx.inits else None
            if c_shape is None or len(c_shape) not in (1, 2) or c_shape[-1] != bs.size:
                raise cx.fail("per-channel QGemm needs a constant bias C of shape (N,) or (M, N)")
            c_axis = len(c_shape) - 1
        else:
            c_scale = c_scale.reshape(())
        sc = cx.add_init("c_scale", c_scale.astype(np.float32))
        zc = cx.add_init("c_zp", np.zeros(c_scale.shape, np.int32))
        inputs.append(cx.dq(c, sc, zc, "dq_c", axis=c_axis))
    gemm_attrs = {"alpha": alpha, "transA": trans_a, "transB": trans_b}
    if not y_s:
        cx.emit("Gemm", inputs, "gemm", output=cx.node.output[0], **gemm_attrs)
        return
    cx.q(cx.emit("Gemm", inputs, "gemm", **gemm_attrs), y_s, y_zp, a_zp)


def _qconcat(cx: _Ctx) -> None:
    y_s, y_zp, *rest = cx.node.input
    if len(rest) % 3:
        raise cx.fail("inputs after Y_scale, Y_zero_point must be (X, scale, zero point) triples")
    xs = [cx.dq(*rest[i:i + 3], f"dq_{i // 3}") for i in range(0, len(rest), 3)]
    y = cx.emit("Concat", xs, "concat", axis=_attrs(cx.node)["axis"])
    cx.q(y, y_s, y_zp, *rest[2::3])


def _asymmetric_pads(node: onnx.NodeProto) -> bool:
    pads = _attrs(node).get("pads", [])
    half = len(pads) // 2
    return bool(pads) and list(pads[:half]) != list(pads[half:])


def _qlinearconv(cx: _Ctx) -> None:
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias = _inputs(cx.node, 9)
    per_channel = w_s in cx.inits and int(np.prod(cx.inits[w_s].dims)) > 1
    # torch-mlir gets per-tensor ones right, except asymmetric padding, which crashes its
    # QLinearConv lowering (segfault), 1-D ones fail to legalize; per-channel ones lose the bias scale or, without a bias,
    # the integer weights (folded to float); a dynamic w_scale can't be folded.
    one_d = w in cx.inits and len(cx.inits[w].dims) == 3
    if w_s not in cx.inits or not (per_channel or one_d or _asymmetric_pads(cx.node)):
        cx.nodes.append(cx.node)
        return
    ws = cx.const(w_s).astype(np.float32).reshape(-1)
    axis = 0 if per_channel else None
    inputs = [cx.dq(x, x_s, x_zp, "dq_x"), cx.dq(w, w_s, w_zp, "dq_w", axis=axis)]
    if bias:
        b_scale = numerics.dq_scale(cx.const(x_s).reshape(()), ws)          # fl32(x_s * w_s[c])
        b_scale = b_scale if per_channel else b_scale.reshape(())
        sb = cx.add_init("bias_scale", b_scale.astype(np.float32))
        zb = cx.add_init("bias_zp", np.zeros(b_scale.shape, np.int32))
        inputs.append(cx.dq(bias, sb, zb, "dq_bias", axis=axis))
    cx.q(cx.emit("Conv", inputs, "conv", **_attrs(cx.node)), y_s, y_zp, x_zp)


def _qlinearmatmul(cx: _Ctx) -> None:
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = _inputs(cx.node, 8)
    # torch-mlir folds a per-column b_scale into float weights (integers lost), and leaves a
    # rank>2 quantized aten.bmm illegal (also of two activations, attention's Q·Kᵀ): both (and
    # unknown ranks) go through QDQ.
    weight = b in cx.inits
    per_column = weight and b_s in cx.inits and int(np.prod(cx.inits[b_s].dims)) > 1
    batched = cx.ranks.get(a) != 2 or (not weight and cx.ranks.get(b) != 2)
    if (weight and b_s not in cx.inits) or not (per_column or batched):
        cx.nodes.append(cx.node)
        return
    axis = len(cx.inits[b].dims) - 1 if per_column else None
    inputs = [cx.dq(a, a_s, a_zp, "dq_a"), cx.dq(b, b_s, b_zp, "dq_b", axis=axis)]
    cx.q(cx.emit("MatMul", inputs, "matmul"), y_s, y_zp, a_zp)


#: (domain, op_type) -> rewrite; each appends to cx.nodes the nodes that replace cx.node
#: (the last one writes the node's output), or cx.node itself to keep it.
REWRITES = {
    (MS, "QLinearAdd"): _binary("Add"),
    (MS, "QLinearMul"): _binary("Mul"),
    (MS, "QGemm"): _qgemm,
    (MS, "QLinearGlobalAveragePool"): _unary("GlobalAveragePool"),
    (MS, "QLinearAveragePool"): _unary("AveragePool"),
    (MS, "QLinearSigmoid"): _unary("Sigmoid"),
    (MS, "QLinearLeakyRelu"): _unary("LeakyRelu"),
    (MS, "QLinearSoftmax"): _unary("Softmax"),
    (MS, "QLinearConcat"): _qconcat,
    ("", "QLinearConv"): _qlinearconv,
    ("", "QLinearMatMul"): _qlinearmatmul,
}


def _all_names(graph: onnx.GraphProto) -> set:
    names = {t.name for t in list(graph.input) + list(graph.output) + list(graph.value_info)}
    names |= {t.name for t in graph.initializer}
    for n in graph.node:
        names |= set(n.input) | set(n.output) | {n.name}
    return names


def _opset(model: onnx.ModelProto, domain: str) -> int:
    return next((o.version for o in model.opset_import if o.domain == domain
                 or (domain == "" and o.domain == "ai.onnx")), 0)


def canonicalize(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return a copy of `model` with every contrib QLinear op (and per-channel biased
    QLinearConv) rewritten to standard QDQ; see the module docstring for the rewrites. Then
    ceil-mode MaxPools become floor mode with ORT's output size (``pool_ceil``; after the
    rewrites, so that ONNX shape inference types their inputs)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    taken, new_inits, new_nodes, per_axis = _all_names(g), [], [], False
    model_opset = _opset(m, "")
    ranks = _ranks(m) if any(n.op_type == "QLinearMatMul" for n in g.node) else {}
    for node in g.node:
        key = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
        if key[0] == MS and key not in REWRITES:
            raise TorqError(f"canonicalize: node {node.name or node.output[0]!r} ({MS}.{node.op_type}) "
                            "is not supported; re-quantize the model in QDQ format")
        if key not in REWRITES:
            new_nodes.append(node)
            continue
        cx = _Ctx(node, inits, taken, new_inits, model_opset, ranks=ranks)
        REWRITES[key](cx)
        new_nodes.extend(cx.nodes)
        per_axis |= cx.per_axis
    del g.node[:]
    g.node.extend(new_nodes)
    g.initializer.extend(new_inits)
    for n in (n for sub in subgraphs(g) for n in sub.node):   # top-level ones are gone; these sit in If/Loop/Scan bodies
        if n.domain == MS:
            raise TorqError(f"canonicalize: node {n.name or n.output[0]!r} ({MS}.{n.op_type}) inside a "
                            "subgraph is not supported")
    keep = [o for o in m.opset_import if o.domain != MS]
    del m.opset_import[:]
    m.opset_import.extend(keep)
    need = max([_PER_AXIS_OPSET] * per_axis + [_IMPORTER_SINCE.get(n.op_type, 0) for n in g.node if not n.domain])
    if need > model_opset:
        m = _convert_opset(m, need)
    return _check(ceil_pools_to_floor(m))


def _ranks(m: onnx.ModelProto) -> dict:
    """Tensor name -> rank, from ONNX shape inference (what it cannot type is left out)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(m)
    except Exception:  # noqa: BLE001 - onnx raises many types; no ranks, no rank-based rewrite
        return {}
    g = inferred.graph
    return {v.name: len(v.type.tensor_type.shape.dim) for v in [*g.input, *g.value_info, *g.output]
            if v.type.tensor_type.HasField("shape")}


def _convert_opset(m: onnx.ModelProto, version: int) -> onnx.ModelProto:
    from ...graph.opset import at_least
    return at_least(m, version, "canonicalize: the importer (per-channel DequantizeLinear: 13, MaxPool: 12, "
                                "Softmax: 13, ...)")


def _check(m: onnx.ModelProto) -> onnx.ModelProto:
    try:
        onnx.checker.check_model(m, full_check=True)
        return onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise TorqError(f"canonicalize: result fails the ONNX checker: {one_line(e)}") from e
