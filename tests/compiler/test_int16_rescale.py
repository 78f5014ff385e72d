"""The rescale of a conv writing int16 is the exact ``dq/ys``, not ORT's int8 requant scale.

ORT runs an int16 layer as DequantizeLinear -> float Conv -> QuantizeLinear: it never forms the
float32 requant scale ``fl32(dq/ys)`` its fused int8 kernels use, it approximates the exact value
``acc·dq/ys``. Where ``fl32(dq/ys)`` happens to lie on the 2**-16 grid (``numerics.exact_dyadic``,
every float32 above 256 does) the int8 rule would take it as the multiplier and round ties to even:
for an int16 output (|acc·s| up to 2**16) that is up to 2**-9 LSB away from the exact value, and
its ``ties`` are not ties of the real product. (Found in EfficientNet-Lite1 `mixed`: the stem and
head convs, 9 of 32 and 26 of 1280 channels.)
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import torq
from torq import numerics
from torq.numerics.ort import ort_requant_scale

F32 = np.float32
XS = F32(2 / 255)


def _scales():
    """(ws, ys): fl32(fl32(XS·ws)/ys) in [0.5, 1) on the 2**-16 grid, the exact quotient not a dyadic."""
    rng = np.random.default_rng(0)
    while True:
        ws, ys = F32(rng.uniform(0.002, 0.02)), F32(rng.uniform(1e-4, 3e-4))
        dq = F32(XS * ws)
        s32 = ort_requant_scale(dq, ys)
        exact = Fraction(float(dq)) / Fraction(float(ys))
        if 0.5 <= float(s32) < 1 and numerics.exact_dyadic(s32) and (exact * 2 ** 16).denominator != 1:
            return ws, ys


def _conv_to_int16(ws, ys, cin=4):
    w = np.arange(1, cin + 1, dtype=np.int8).reshape(1, cin, 1, 1) * 30
    inits = {"x_s": XS, "x_z": np.int8(0), "w_q": w, "w_s": ws, "w_z": np.int8(0),
             "y_s": ys, "y_z": np.int16(0)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "x_s", "x_z"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["wf"]),
             helper.make_node("Conv", ["xf", "wf"], ["yf"]),
             helper.make_node("QuantizeLinear", ["yf", "y_s", "y_z"], ["y"])]
    g = helper.make_graph(nodes, "conv16", [helper.make_tensor_value_info("x", TensorProto.INT8, [1, cin, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.INT16, [1, 1, 8, 8])],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m


def test_int16_output_conv_takes_the_exact_quotient():
    ws, ys = _scales()
    c = torq.compile(_conv_to_int16(ws, ys))
    (st,) = [s for s in c.program.steps if s.op == "torq_hl.conv2d"]
    sb = [np.asarray(c.program.constants[a]) for a in st.args
          if a in c.program.constants and np.asarray(c.program.constants[a]).dtype == np.int32]
    mult, shift = int(sb[0][1]), st.attrs["shift_factor"]
    dq = F32(XS * ws)
    assert mult == round(Fraction(float(dq)) / Fraction(float(ys)) * 2 ** shift)
    assert mult != round(Fraction(float(ort_requant_scale(dq, ys))) * 2 ** shift)   # the int8 rule's
    assert st.attrs["round_ties_even"] == 0          # no real ties: the exact quotient is not a dyadic


def test_float_path_rescale_rounds_like_the_exact_value():
    """Over every accumulator of an int16 output, the float-path multiplier rounds as the exact
    ``acc·dq/ys`` does several times more often than the int8 rule's ``fl32(dq/ys)`` (which misses ~2**-9 LSB)."""
    ws, ys = _scales()
    dq = F32(XS * ws)
    acc = np.arange(-(1 << 16), 1 << 16, dtype=np.int64)
    num, den = (Fraction(float(dq)) / Fraction(float(ys))).as_integer_ratio()
    exact = np.array([(2 * a * num + den) // (2 * den) for a in acc.tolist()], np.int64)   # NTP of the exact value

    def wrong(float_path):
        m, s = numerics.conv_rescale(np.array([dq]), ys, float_path=float_path)
        got = numerics.act_native(acc, m, s, 0, -(1 << 40), 1 << 40,
                                  ties_even=numerics.rescale_ties_even(np.array([dq]), ys, float_path))
        return int(np.count_nonzero(np.asarray(got).reshape(-1) != exact))
    old, new = wrong(False), wrong(True)
    assert old > 20 and 5 * new < old, (old, new)      # (36, 4): the 31-bit multiplier keeps a few
