"""torq.numerics: the only home of every scale, multiplier, rounding and recipe in torq.

torq has to agree bit for bit with two machines: the TORQ NPU ("native" rounding) and ONNX
Runtime's x86 CPU EP ("ort" rounding). A one-ulp change in the order of two float32 operations,
or another tie rule, shows up as a 1-LSB mismatch somewhere in a ResNet; if the compiler (which
stores multipliers), the simulator (which applies them) and the tests (which hold them against
ORT) each had a copy of this arithmetic they would drift apart silently. So each fact is one
function here, called by all three.

A leaf package: numpy, the standard library and numba only (no ORT, no MLIR, nothing else from
torq). One module per concern:

  native   NPU fixed point: multiplier/shift (``multiplier_and_shift``, ``conv_rescale``, constant
           channels), ACT unit (NTP) rescale, native Add / Mul / average pool
  ort      ONNX Runtime's recipes: ``dq_scale`` (the float32 product every Conv/MatMul scale
           starts from), requantisation, QLinearAdd / Mul / pools, Quantize/DequantizeLinear
  bf16     the NPU's bf16 Quantize/Dequantize fallback, step by step (and ``to_bf16``), and its
           bound vs ORT
  bf16_arith  the bf16 datapath: contractions, elementwise functions, pools (``numerics.bf16_arith``)
  exact_add  the Add ratios on which ORT's float32 QLinearAdd is exact (NSS == ORT with NTE)
  bias     a bias in the accumulator's scale (the lecture's trap: S_b != S_W·S_X)
  explain  why a native result differs from ORT's (tie / near-tie / other), in exact rationals
  int16    int16 activations x int8 weights: the NPU's byte planes, ORT's float path, their contract
  loops    numba-compiled per-element loops and the layout plumbing they need
  weight_rounding  which integer each int8 weight takes for least layer-output error (GPTQ)
May import: nothing from torq; numpy, numba and the standard library only.
"""
from __future__ import annotations

from . import bf16, bf16_arith, bias, exact_add, explain, int16, loops, native, ort, weight_rounding
from .bf16 import *  # noqa: F401,F403
from .bias import *  # noqa: F401,F403
from .exact_add import *  # noqa: F401,F403
from .explain import *  # noqa: F401,F403
from .int16 import *  # noqa: F401,F403
from .native import *  # noqa: F401,F403
from .ort import *  # noqa: F401,F403

__all__ = [*native.__all__, *ort.__all__, *bf16.__all__, *bias.__all__, *exact_add.__all__, *explain.__all__, *int16.__all__]
