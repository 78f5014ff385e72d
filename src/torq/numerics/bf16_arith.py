"""The NPU's bf16 arithmetic as torq simulates it: one model, each choice cited or marked *ours*.

A bf16 model on the NSS is the bf16 linalg torch-mlir makes of it, op by op; every op computes
as below and rounds its result to its own element type (``bf16``: round to nearest, ties to
even, on the upper 16 bits of the fp32 value, ``to_bf16``; ``f32``: IEEE fp32). Citations are
to ``synaptics-torq/torq-compiler``.

Contractions (conv2d, depthwise_conv2d, fully_connected, matmul; issue 18: "products exact;
accumulation in fp32 in a stated order; fp32 bias; result rounded to bf16"):
  * operands bf16, products exact: a bf16 x bf16 product has at most 16 significant bits.
    (TorqHLToTorqHW/Conv2DPattern.cpp: kernel profile "I:BF16 W:BF16 O:BF16 B:I32", ALU and
    ACT in the BF number format, ``act_sum_bits = 32``.)
  * accumulation in fp32, in this order (*ours*: the reference does not publish its adder
    order): ``acc = +0.0``; for k = 0 .. K-1: ``acc = fl32(acc + w_k * x_k)``, the exact product
    added with one rounding (``fma32``: an FMA; it equals an fp32 multiply then add whenever
    the product is an fp32 number, i.e. 0 or 2^-133 <= |w_k x_k| < 2^128: every real
    activation, so an unfused datapath gives the same numbers). k runs over
      - conv2d / depthwise_conv2d: (input channel of the group, kh, kw), the order in which the
        weights [O, C/groups, KH, KW] are stored; zero padding takes part (its products never
        change acc, which is never -0.0);
      - fully_connected / matmul: the inner dimension, 0 .. K-1.
    One SIMD lane per output walking k in that order is exactly this, so the native kernels
    (runtime/native/float_conv.c, with numerics/bf16.h) and a plain loop agree bit for bit.
  * bias after the sum: ``y = fl32(acc + b)`` with an fp32 bias (Conv2DPattern.cpp: "No scale
    for bf16 so 4 byte bias is enough"). *Ours*: added by the ACT stage after the sum, as int8
    adds its bias (torch-mlir's linalg starts the accumulator at ``extf(bias)`` instead).
  * fused activation: ``y = min(max(y, lo), hi)`` with fp32 bounds, NaN passing through
    (LinalgToTorqHL PatternUtils.cpp: a bf16 conv's ``output_min/max`` hold fp32 bit patterns,
    0xff800000 / 0x7f800000 when there is no clamp; Relu/Relu6/Clip fold into them). The
    bounds come from bf16 constants, so clamping before or after the final rounding is the same.
  * result: ``bf16(y)`` (profile O:BF16). The reference sets ``RoundingMode::OFF`` for bf16 ("No
    rounding needed"): the integer rescale's rounding is off; the fp32 -> bf16 conversion
    rounds to nearest even (*ours*: the reference does not say which).
  A fully connected layer's bias stays a separate bf16 add, as the reference keeps it
  (PatternUtils.cpp computeBiasForMatmul: "Floating-point matmul/fc lowering keeps explicit
  post-op adds in the graph").

Elementwise (``torq_hl.elementwise``: one node per ALU / ACT op of the linalg body):
  * ``add sub mul div max min``: computed in fp32 (IEEE, round to nearest even), then rounded
    to the node's type. For + - x of two bf16 values this is the correctly rounded bf16 result.
  * ``exp erf tanh sigmoid sqrt rsqrt reciprocal log pow``: f evaluated in float64 on the fp32
    operand, rounded to fp32, then to the node's type. *Ours*: the reference evaluates exp,
    sigmoid, tanh-GELU and the softmax reciprocal with piecewise-linear tables on the bf16 bit
    pattern (ExpPattern.cpp, SigmoidPattern.cpp, GeluPattern.cpp, SoftmaxPattern.cpp:
    ``makeScaledLut``), whose entries we do not reproduce; this is the value they approximate.
    A linalg body that computes sigmoid as 1/(1+exp(-x)) is one ``sigmoid`` node (rounded once),
    as the reference's SigmoidPattern matches that chain to one table.
  * compares and selects (Relu, Clip) are exact; ``extf`` is exact, ``truncf`` rounds to bf16.

Softmax and LayerNorm run op by op as torch-mlir decomposes them, each op by the rules above
(the reference has no LayerNorm pattern, and its SoftmaxOpPattern matches ``linalg.softmax``,
which torch-mlir never emits for ONNX): Softmax = max, subtract, exp, sum, divide in fp32 (the
decomposition upcasts), then one rounding to bf16; LayerNorm = mean, subtract, square, mean,
+eps, rsqrt, multiply in fp32, rounded to bf16, then bf16 x gamma and bf16 + beta.

Pools and means (*ours*: the reference's avg_pool2d / reduce_mean do not say how they round):
max is exact; an average (AveragePool, GlobalAveragePool, ReduceMean) and a sum reduction add
in fp32 like a contraction with weights 1 -- ``acc = +0.0``, then ``acc = fl32(acc + x_k)`` over
the window in row-major (kh, kw) order (padding included: it adds +-0), or over the reduced
elements in the input's row-major order -- then a mean divides in fp32, ``fl32(acc / n)``, and
the result is rounded once to its type (torch-mlir's linalg sums in bf16 and divides in bf16, a
rounding per addend and two per output).
"""
from __future__ import annotations

import math

import numpy as np

from .bf16 import to_bf16

__all__ = ["round_to", "finish", "fma32", "unary", "binary", "UNARY", "BINARY", "F32_MIN_BITS", "F32_MAX_BITS",
           "clamp_bits"]

_F32 = np.float32
F32_MIN_BITS, F32_MAX_BITS = -0x00800000, 0x7F800000     # -inf / +inf as int32 bit patterns (0xff800000)


def round_to(x, elem: str) -> np.ndarray:
    """``x`` rounded to the element type ``elem`` ("bf16", "f32"; integers cast)."""
    if elem == "bf16":
        return to_bf16(np.asarray(x, _F32))
    if elem == "f32":
        return np.asarray(x, _F32)
    if elem == "f64":
        return np.asarray(x, np.float64)
    return np.asarray(x).astype({"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32,
                                 "i64": np.int64}[elem])


def clamp_bits(bits: int) -> np.float32:
    """An fp32 clamp bound stored as int32 bits (the reference's output_min / output_max)."""
    return np.array([bits & 0xFFFFFFFF], np.uint32).view(_F32)[0]


def finish(acc32, bias, lo, hi, elem: str) -> np.ndarray:
    """The ACT stage of a bf16 contraction: ``round(clamp(fl32(acc + bias), lo, hi))``."""
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.asarray(acc32, _F32) + np.asarray(bias, _F32)
        y = np.minimum(np.maximum(y, _F32(lo)), _F32(hi))
    return round_to(y, elem)


def fma32(acc, a, b) -> np.ndarray:
    """One accumulation step: ``fl32(acc + a * b)`` with the exact product and one rounding.

    For bf16 ``a`` and ``b`` the product is exact in float64 and the float64 sum rounded to
    fp32 is the correctly rounded fp32 sum (53 >= 2 * 24 + 2 bits: double rounding is
    innocuous), so this is an fp32 FMA."""
    with np.errstate(all="ignore"):
        return (np.asarray(acc, _F32).astype(np.float64)
                + np.asarray(a, _F32).astype(np.float64) * np.asarray(b, _F32).astype(np.float64)).astype(_F32)


# ---------------------------------------------------------------------------- elementwise

def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _erf(x):
    return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)


UNARY = {   # name -> float64 function (evaluated on the fp32 operand, rounded once)
    "exp": np.exp, "erf": _erf, "tanh": np.tanh, "sigmoid": _sigmoid, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "reciprocal": lambda x: 1.0 / x, "log": np.log,
    "abs": np.abs, "neg": np.negative, "floor": np.floor, "ceil": np.ceil,
}
BINARY = {  # name -> fp32 operation (IEEE-exact for these in numpy), or float64 for pow
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum, "pow": None,
}


def unary(name: str, x, elem: str) -> np.ndarray:
    """An ACT function node: f in float64 on the fp32 operand, fl32, then the node's type."""
    f = UNARY[name]
    with np.errstate(all="ignore"):
        y = f(np.asarray(x, _F32).astype(np.float64)).astype(_F32)
    return round_to(y, elem)


def binary(name: str, a, b, elem: str) -> np.ndarray:
    """An ALU binary node: the fp32 IEEE result (pow: float64, rounded to fp32), then the type."""
    with np.errstate(all="ignore"):
        if name == "pow":
            y = np.power(np.asarray(a, np.float64), np.asarray(b, np.float64)).astype(_F32)
        else:
            y = BINARY[name](np.asarray(a, _F32), np.asarray(b, _F32))
    return round_to(y, elem)
