"""The `torq_hl` dialect: integer-only TORQ NPU ops, registered at run time with IRDL.

Operands follow the reference compiler (research torq-compiler.md §3.4): an `init` tensor
(tensor.empty of the result type) first, then constant operands (weights, scale_bias), then data.
Every attribute the NPU needs is on the op; attributes prefixed `ort_` are additions: the float32
quantization parameters (`ort_dq_scale` = fl32(x_scale·w_scale[c]), `ort_output_scale` = y_scale,
...) from which the simulator's `ort` rounding mode reproduces ONNX Runtime's float requantisation
exactly, and from which native-vs-ORT differences are explained.

Semantics (NCHW, int8 activations; see runtime/nss.py and torq/numerics):
  conv2d / depthwise_conv2d: acc = conv(pad(input, value=input_zp), weights) + bias' ;
      scale_bias = [bias'_0, mult_0, bias'_1, mult_1, ...] (i32, 2*O), weights already w - w_zp;
      out = ACT(acc, mult_c, shift_factor, output_zp, output_min, output_max); round_ties_even = 1:
      the ACT's NTE mode, chosen when every channel's rescale is an exact dyadic (numerics.exact_dyadic)
  fully_connected: same with a matmul, weights [O, K]
  add:   t = (a - zp_a) * m_a + (b - zp_b) * m_b  (i64), out = round_shift(t, shift_factor) + output_zp;
         round_ties_even = 1: NTE on t + output_zp·2**shift (ORT rounds after adding its zero point),
         chosen when ORT's float32 ratios are exact (numerics.add_exact_ratios)
  avg_pool2d: acc = sum(input - input_zp) over the window; per-count multiplier (global: one);
         round_ties_even = 1: the ACT's NTE mode where a window's rescale is exact (real ties)
  maxpool2d: integer max over the window (padding never wins)
  table: out = table[input - (-128)]  (256 i32 entries, one per int8 input value)
  mul:   mode "int8": out = ACT((input1 - zp1)·(input2 - zp2), scale_bias[1], shift_factor)  (Mul)
         mode "bf16": out = bf16(input1 · input2 + bias), input2 a bf16 constant (Q/DQ fallback;
         the int8-only attributes are 0 there, the bf16-only `bias` is [] in int8 mode)
  act / mul / fma: the bf16 fallback for standalone Quantize/Dequantize (seed §4.4.2)
  fma:   out = clamp(input * weights + biases, output_min, output_max), integer; weights/biases
         have one entry or one per index of the input's first axis
  reduce: out = sum of input over `dims` (mode "sum"), i32 — with fma, the dynamic-weight
         input-zero-point correction -in_zp·Σw' (seed §4.5.4)
  rescale: out = ACT(input - input_zp, multiplier, shift_factor), one per-tensor rescale (the
         reference's "Rescale via FMA"): an int16 tensor converted to another quantization
  conv2d / depthwise_conv2d / fully_connected / add / avg_pool2d with an i16 input: int16
         activations (A16W8), the byte-plane path of numerics.int16 (same attributes)
  matmul: two activations ([B,] M×K by [B,] K×N, zero points already taken off by fma):
         acc = input1 @ input2 (exact, i32), out = ACT(acc, scale_bias[1], shift_factor)  (Q·Kᵀ)

The same ops carry bf16 (the reference's profile "I:BF16 W:BF16 O:BF16 B:I32"; arithmetic in
torq/numerics/bf16_arith.py): conv2d / depthwise_conv2d / fully_connected take bf16 input and
weights and an f32 bias vector as `scale_bias`, matmul two bf16 activations; `output_min` /
`output_max` hold fp32 bit patterns (the fused clamp, as the reference stores them), the
integer-only attributes are 0 or empty. avg_pool2d / maxpool2d / reduce (mode "sum" | "max" |
"mean", over the input axes `dims`) compute in the float type of their result. bf16 adds:
  elementwise: one linalg body as ALU / ACT nodes, `body` = "%0 = exp bf16 a0; %1 = add bf16 %0 c0"
         (a<i>: operand i, c<j>: constants[j], i<d>: the index along iteration dim d, %k: node k;
         each node rounds to its type); `maps` = per operand [rank, iteration dim per axis
         (-1: a size-1 axis read at 0)], operands broadcast against the iteration space
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar

import numpy as np

I32, I64A, F32A, STR, DENSE = "i32", "i64_array", "f32_array", "str", "dense"

# op name -> (operand names, {attribute: kind})
OPS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "conv2d": (("init", "weights", "scale_bias", "input"), {
        "input_zp": I32, "weight_zp": I32, "output_zp": I32, "output_min": I32, "output_max": I32,
        "shift_factor": I32, "groups": I32, "pad": I64A, "stride": I64A, "dilation": I64A,
        "round_ties_even": I32, "ort_dq_scale": F32A, "ort_output_scale": F32A}),
    "depthwise_conv2d": (("init", "weights", "scale_bias", "input"), {
        "input_zp": I32, "weight_zp": I32, "output_zp": I32, "output_min": I32, "output_max": I32,
        "shift_factor": I32, "groups": I32, "pad": I64A, "stride": I64A, "dilation": I64A,
        "round_ties_even": I32, "ort_dq_scale": F32A, "ort_output_scale": F32A}),
    "fully_connected": (("init", "weights", "scale_bias", "input"), {
        "input_zp": I32, "weight_zp": I32, "output_zp": I32, "output_min": I32, "output_max": I32,
        "shift_factor": I32, "round_ties_even": I32, "ort_dq_scale": F32A, "ort_output_scale": F32A}),
    "add": (("init", "input1", "input2"), {
        "input_zp": I32, "output_zp": I32, "output_min": I32, "output_max": I32, "shift_factor": I32,
        "weights": I64A, "scale_bias": I64A, "input_zps": I64A, "round_ties_even": I32,
        "ort_input_scales": F32A, "ort_output_scale": F32A, "ort_zp_shift": I32, "ort_kernel": STR}),
    "avg_pool2d": (("init", "input"), {
        "input_zp": I32, "output_zp": I32, "output_min": I32, "output_max": I32, "shift_factor": I32,
        "scale_bias": I64A, "kernel": I64A, "stride": I64A, "pad": I64A, "count_include_pad": I32,
        "round_ties_even": I32, "ort_input_scale": F32A, "ort_output_scale": F32A, "ort_zp_shift": I32}),
    "maxpool2d": (("init", "input"), {"kernel": I64A, "stride": I64A, "pad": I64A, "dilation": I64A}),
    "table": (("init", "input"), {"table": I64A}),
    "act": (("init", "input"), {"mode": STR}),
    "mul": (("init", "input1", "input2"), {
        "mode": STR, "input_zps": I64A, "output_zp": I32, "output_min": I32, "output_max": I32,
        "shift_factor": I32, "scale_bias": I64A, "bias": F32A,
        "ort_scales": F32A, "ort_zp": I32, "ort_mode": STR, "ort_zp_shift": I32}),
    "fma": (("init", "input"), {"weights": I64A, "biases": I64A, "output_min": I32, "output_max": I32}),
    "reduce": (("init", "input"), {"mode": STR, "dims": I64A}),
    "rescale": (("init", "input"), {
        "input_zp": I32, "output_zp": I32, "output_min": I32, "output_max": I32, "shift_factor": I32,
        "multiplier": I32, "round_ties_even": I32, "ort_input_scale": F32A, "ort_output_scale": F32A}),
    "matmul": (("init", "input1", "input2"), {
        "output_zp": I32, "output_min": I32, "output_max": I32, "shift_factor": I32, "scale_bias": I64A,
        "ort_dq_scale": F32A, "ort_output_scale": F32A}),
    "elementwise": (("init", "input0", "input1?", "input2?", "input3?"), {"body": STR, "constants": F32A, "maps": I64A}),
}

_IRDL_KIND = {I32: '"#builtin.integer"', I64A: '"#builtin.dense_array"', F32A: '"#builtin.dense_array"',
              STR: '"#builtin.string"'}


def irdl_text() -> str:
    """IRDL source for the dialect: every operand typed `any`, every attribute by its base kind."""
    lines = ["irdl.dialect @torq_hl {"]
    for name, (operands, attrs) in OPS.items():
        lines.append(f"  irdl.operation @{name} {{")
        for i, _ in enumerate(operands):
            lines.append(f"    %o{i} = irdl.any")
        lines.append("    %r = irdl.any")
        for i, kind in enumerate(attrs.values()):
            lines.append(f"    %a{i} = irdl.base {_IRDL_KIND[kind]}")
        ops = ", ".join(f"{n.rstrip('?')}: {'optional ' if n.endswith('?') else ''}%o{i}"
                        for i, n in enumerate(operands))
        lines.append(f"    irdl.operands({ops})")
        if attrs:
            at = ", ".join(f'"{a}" = %a{i}' for i, a in enumerate(attrs))
            lines.append(f"    irdl.attributes {{{at}}}")
        lines.append("    irdl.results(output: %r)")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines)


def register_dialect(ctx) -> None:
    from torch_mlir import ir
    from torch_mlir._mlir_libs._mlir import globals as mlir_globals
    from torch_mlir.dialects import irdl

    with ctx, ir.Location.unknown():
        irdl.load_dialects(ir.Module.parse(irdl_text()))
    # The bindings import `<prefix>.<dialect>` each time they wrap an op and remember only a
    # success: without a module to find, every torq_hl op cost a failed import (~10k of them,
    # 1-2 s, for DenseNet-121). This module is that dialect module (it has no op classes).
    if __package__ not in mlir_globals.dialect_search_modules:
        mlir_globals.append_dialect_search_prefix(__package__)


def make_attr(kind: str, value):
    from torch_mlir import ir

    if kind == I32:
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(32), int(value))
    if kind == I64A:
        return ir.DenseI64ArrayAttr.get(_i64_values(value).tolist())   # tolist: 10x faster than int()
    if kind == F32A:
        return ir.DenseF32ArrayAttr.get([float(v) for v in np.ravel(np.asarray(value, np.float32))])
    if kind == STR:
        return ir.StringAttr.get(str(value))
    raise ValueError(kind)


def read_attr(kind: str, attr):
    """Attribute -> python/numpy value (inverse of make_attr)."""
    if kind == I32:
        return int(attr.value)
    if kind == I64A:
        return np.fromiter(attr, dtype=np.int64, count=len(attr))
    if kind == F32A:
        return np.array(list(attr), dtype=np.float32)
    if kind == STR:
        return str(attr.value)
    raise ValueError(kind)


def _i64_values(value) -> np.ndarray:
    return np.ravel(np.asarray(value, np.int64))


_RECORDED: ContextVar[dict | None] = ContextVar("torq_hl_recorded", default=None)


@contextlib.contextmanager
def recording():
    """Within it, `create` keeps every op's attribute values ({op: (name, values)}), which
    `op_attrs(op, recorded)` returns instead of reading them back: MLIR's bindings read an
    array attribute one Python int at a time, and a per-channel table holds C·256 of them."""
    token = _RECORDED.set({})
    try:
        yield _RECORDED.get()
    finally:
        _RECORDED.reset(token)


def create(name: str, result_type, operands, attrs: dict, loc, ip):
    """Build a torq_hl op; checks every attribute of the op is given, and no stray one."""
    from torch_mlir import ir

    names, kinds = OPS[name]
    required = sum(not n.endswith("?") for n in names)
    if not required <= len(operands) <= len(names):
        raise ValueError(f"torq_hl.{name} takes {names}")
    missing = set(kinds) - set(attrs)
    extra = set(attrs) - set(kinds)
    if missing or extra:
        raise ValueError(f"torq_hl.{name}: missing {sorted(missing)} unexpected {sorted(extra)}")
    arrays = {k: _i64_values(v) for k, v in attrs.items() if kinds[k] == I64A}
    built = {k: make_attr(kinds[k], arrays.get(k, v)) for k, v in attrs.items()}
    if required < len(names):       # optional operands: IRDL wants their segment sizes
        sizes = [1] * required + [int(i < len(operands)) for i in range(required, len(names))]
        built["operandSegmentSizes"] = ir.DenseI32ArrayAttr.get(sizes)
    op = ir.Operation.create(f"torq_hl.{name}", results=[result_type], operands=list(operands),
                             attributes=built, loc=loc, ip=ip)
    recorded = _RECORDED.get()
    if recorded is not None:   # the small ones read back: exactly what the IR holds
        recorded[op] = (op.name, {k: arrays[k].copy() if k in arrays else read_attr(kinds[k], a)
                                  for k, a in built.items() if k in kinds})
    return op


def op_attrs(op, recorded: dict | None = None) -> dict:
    """All attributes of a torq_hl op as python/numpy values (from `recorded`, see `recording`,
    when it holds this op)."""
    hit = recorded.get(op) if recorded else None
    if hit is not None and hit[0] == op.name:
        return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in hit[1].items()}
    name = op.name.split(".", 1)[1]
    _, kinds = OPS[name]
    return {k: read_attr(kind, op.attributes[k]) for k, kind in kinds.items()}
