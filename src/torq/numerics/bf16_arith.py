"""The NPU's bf16 arithmetic as torq simulates it: one model, each choice cited or marked *ours*.

A bf16 model on the NSS is the bf16 linalg torch-mlir makes of it, op by op; every op computes
as below and rounds its result to its own element type (``bf16``: round to nearest, ties to
even, on the upper 16 bits of the fp32 value, ``to_bf16``; ``f32``: IEEE fp32). Citations are
to ``synaptics-torq/torq-compiler``.

Contractions (conv2d, depthwise_conv2d, fully_connected, matmul; average pools and sum
reductions add the same way, with weights 1):
  * operands bf16, products exact: a bf16 x bf16 product has at most 16 significant bits.
    (TorqHLToTorqHW/Conv2DPattern.cpp: kernel profile "I:BF16 W:BF16 O:BF16 B:I32", ALU and
    ACT in the BF number format, ``act_sum_bits = 32``.)
  * accumulation: ``acc = fl32(exact sum of the products)``, the exact sum rounded once to
    fp32. *Ours*: the reference does not publish the order in which the ALU adds partial
    sums; the exact sum is what every order approximates (it differs from any fp32-ordered sum
    by at most K fp32 ulps) and the only order-free choice, so a fast kernel (BLAS, any
    blocking) and an independent implementation agree on it bit for bit. ``exact_finish``
    computes it: a float64 sum (products exact in float64), a rigorous error bound, and an
    exact recomputation of the rare outputs the bound cannot settle.
  * bias: ``y = fl32(acc + b)`` with an fp32 bias (Conv2DPattern.cpp: "No scale for bf16 so 4
    byte bias is enough"; linalg: the accumulator's init is ``extf(bias)``, f32).
  * fused activation: ``y = min(max(y, lo), hi)`` with fp32 bounds (LinalgToTorqHL
    PatternUtils.cpp: a bf16 conv's ``output_min/max`` hold fp32 bit patterns, 0xff800000 /
    0x7f800000 when there is no clamp; Relu/Relu6/Clip fold into them). The bounds come from
    bf16 constants, so clamping before or after the final rounding is the same.
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

Pools and means: max is exact; an average (AveragePool, GlobalAveragePool, ReduceMean) is the
exact sum rounded to fp32, divided by the count in fp32, rounded once to the result type
(*ours*: torch-mlir's linalg sums in bf16 and divides in bf16, a rounding per addend and two
per output; the reference's reduce_mean / avg_pool2d do not say how they round).
"""
from __future__ import annotations

import math

import numpy as np

from .bf16 import to_bf16
from .loops import jit

__all__ = ["round_to", "finish", "exact_sum_f32", "exact_finish", "sum_bound", "unary", "binary",
           "UNARY", "BINARY", "F32_MIN_BITS", "F32_MAX_BITS", "clamp_bits"]

_F32 = np.float32
F32_MIN_BITS, F32_MAX_BITS = -0x00800000, 0x7F800000     # -inf / +inf as int32 bit patterns (0xff800000)
_GAMMA_SLACK = 1.0 + 2.0 ** -40                          # covers the rounding of v +- bound itself


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


def exact_sum_f32(products) -> np.float32:
    """fl32 of the exact sum of float64 values (exact bf16 products): correctly rounded.

    ``math.fsum`` gives the float64 nearest the exact sum S; its fp32 rounding is S's unless it
    lands exactly on an fp32 midpoint (float64 holds every fp32 midpoint), where the sign of the
    exact residual S - s decides."""
    p = [float(v) for v in np.ravel(products)]
    if not all(math.isfinite(v) for v in p):
        with np.errstate(all="ignore"):
            return _F32(np.sum(np.asarray(p, np.float64)))
    s = math.fsum(p)
    r = _F32(s)
    if not math.isfinite(float(r)) or float(r) == s:
        return r
    lo, hi = (r, np.nextafter(r, _F32(np.inf))) if float(r) < s else (np.nextafter(r, _F32(-np.inf)), r)
    if s != (float(lo) + float(hi)) / 2:
        return r
    resid = math.fsum(p + [-s])
    return r if resid == 0 else (hi if resid > 0 else lo)


def sum_bound(n_terms: int, abs_sum) -> np.ndarray:
    """Rigorous bound on |float64 sum - exact sum| of ``n_terms`` exact terms whose absolute
    values add up to at most ``abs_sum`` (any order): gamma_n * abs_sum, u = 2^-53."""
    u = 2.0 ** -53
    gamma = n_terms * u / (1 - n_terms * u) if n_terms > 1 else 0.0
    return np.asarray(abs_sum, np.float64) * (gamma * _GAMMA_SLACK) + 1e-300


def exact_finish(v64, bound, bias, lo, hi, elem: str, exact_acc, norms=None):
    """Contraction outputs from float64 sums ``v64`` [R, C]: ``finish(fl32(S), bias, lo, hi, elem)``
    of the exact sums S.

    The error bound of ``v64`` is ``bound`` (broadcastable to [R, C]), or, with ``norms = (rn,
    cn, n_terms)``, ``sum_bound(n_terms, rn[r] * cn[c])`` (row and column norms: Cauchy-Schwarz
    bounds sum|w x| by ||w|| ||x||), computed on the fly. ``bias`` is per row ([R, 1]), per
    column ([1, C]) or a scalar. ``f(S) = finish(fl32(S))`` is monotone in S, so where
    ``f(v - bound) == f(v + bound)`` that is f(S); elsewhere (rare) ``exact_acc(rows, cols)``
    returns fl32(S) for those outputs (``exact_sum_f32`` of their products)."""
    if elem not in ("bf16", "f32"):
        raise ValueError(f"contraction result type {elem} is not a float type")
    v = np.ascontiguousarray(np.asarray(v64, np.float64).reshape(np.shape(v64)[0], -1))
    rows, cols = v.shape
    b = np.asarray(bias, _F32)
    br = np.ascontiguousarray(b.reshape(-1)) if b.ndim and b.shape[0] == rows and b.size == rows else np.zeros(0, _F32)
    bc = np.ascontiguousarray(b.reshape(-1)) if b.ndim and b.size == cols and not br.size else np.zeros(0, _F32)
    b0 = _F32(b.reshape(-1)[0]) if b.size == 1 and not (br.size or bc.size) else _F32(0)
    if norms is not None:
        rn, cn, n = norms
        full = np.zeros((0, 0))
        rn, cn = np.ascontiguousarray(rn, np.float64).reshape(-1), np.ascontiguousarray(cn, np.float64).reshape(-1)
        gamma = float(sum_bound(n, 1.0)) - 1e-300
    else:
        full = np.ascontiguousarray(np.broadcast_to(np.asarray(bound, np.float64), np.shape(v64)).reshape(rows, cols))
        rn = cn = np.zeros(0)
        gamma = 0.0
    out, bad = _finish_checked(v, full, rn, cn, gamma, br, bc, b0, _F32(lo), _F32(hi), elem == "bf16")
    if bad.any():
        idx = np.nonzero(bad)
        acc = np.asarray(exact_acc(*idx), _F32)
        bias_at = br[idx[0]] if br.size else bc[idx[1]] if bc.size else b0
        out[idx] = finish(acc, bias_at, lo, hi, elem)
    return out.reshape(np.shape(v64))


@jit
def _finish_checked(v, full, rn, cn, gamma, br, bc, b0, lo, hi, bf16):
    """``f(v)`` per element, and where ``f(v - e) != f(v + e)`` (the bound e cannot settle it).

    Fast path: when v - e and v + e round to the same fp32 accumulator, everything after it is
    the same too; only the (rare) others evaluate f at both ends."""
    out = np.empty(v.shape, np.float32)
    bad = np.zeros(v.shape, np.uint8)
    bits = out.reshape(-1).view(np.uint32)
    alt = np.empty(1, np.float32)
    alt_bits = alt.view(np.uint32)
    n_c = v.shape[1]
    use_full, per_row, per_col = full.shape[0] > 0, br.shape[0] > 0, bc.shape[0] > 0
    for r in range(v.shape[0]):
        g = gamma * rn[r] if not use_full else 0.0
        bias_r = br[r] if per_row else b0
        for c in range(n_c):
            s = v[r, c]
            e = full[r, c] if use_full else g * cn[c] + 1e-300
            bias = bc[c] if per_col else bias_r
            a_lo = np.float32(s - e)
            a_hi = np.float32(s + e)
            t = np.float32(a_lo + bias)
            t = lo if t < lo else (hi if t > hi else t)
            k = r * n_c + c
            out[r, c] = t
            if bf16:
                x = bits[k]
                if (x & np.uint32(0x7F800000)) == np.uint32(0x7F800000) and (x & np.uint32(0x007FFFFF)):
                    bits[k] = (x & np.uint32(0xFFFF0000)) | np.uint32(0x00400000)        # quiet NaN
                else:
                    bits[k] = (x + np.uint32(0x7FFF) + ((x >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
            if a_lo != a_hi:            # rare: the fp32 accumulator itself is in doubt
                t2 = np.float32(a_hi + bias)
                alt[0] = lo if t2 < lo else (hi if t2 > hi else t2)
                if bf16 and alt[0] == alt[0]:
                    x = alt_bits[0]
                    alt_bits[0] = (x + np.uint32(0x7FFF) + ((x >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
                if not (alt[0] == out[r, c] or (alt[0] != alt[0] and out[r, c] != out[r, c])):
                    bad[r, c] = 1       # (by value: -0.0 and +0.0 are the same output)
    return out, bad




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
