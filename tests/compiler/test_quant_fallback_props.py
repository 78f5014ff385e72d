"""Property tests: the bf16 Quantize / Dequantize fallback lowerings (the joins of a bf16 island) over
random scales, zero points and shapes. ``native`` against a plain model of the seed's steps written
here with ml_dtypes' bfloat16 (not torq.numerics); ``ort`` bit-exact against ONNX Runtime."""
from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import torq
from qmodels import run as ort_run

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
SHAPES = st.lists(st.integers(1, 5), min_size=1, max_size=4)
SCALES = st.floats(-12, 3).map(lambda e: float(np.float32(2.0 ** e * 1.37)))
DTYPES = st.sampled_from([(TensorProto.INT8, np.int8), (TensorProto.UINT8, np.uint8)])


def bf16(x):
    """Round to bfloat16 (nearest, ties to even) by ml_dtypes, back to float32."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def quantize_model_of_the_steps(x, scale, zp, lo, hi, shift=0):
    """act f2f (bf16), mul (x * bf16(1/scale), then + bf16(zp), each rounded to bf16), act f2i (to
    nearest even), fma clamp. ``shift``: uint8 is computed as int8 (zero point and range - 128)."""
    factor = bf16(np.float32(1.0) / np.float32(scale))
    p = bf16(bf16(x) * factor)
    a = bf16(p + bf16(np.float32(zp - shift)))
    return np.clip(np.rint(a.astype(np.float64)), lo - shift, hi - shift).astype(np.int64) + shift


def dequantize_model_of_the_steps(q, scale, zp):
    """fma q - zp (integer), act i2f (exact), mul by bf16(scale) rounded to bf16, act f2f (exact)."""
    d = (q.astype(np.int64) - zp).astype(np.float32)
    return bf16(d * bf16(np.float32(scale)))


def one_node(op, x_type, y_type, shape, scale, zp, zp_type):
    inits = [numpy_helper.from_array(np.asarray(scale, np.float32), "s"),
             helper.make_tensor("z", zp_type, [], [int(zp)])]
    g = helper.make_graph([helper.make_node(op, ["x", "s", "z"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", x_type, shape)],
                          [helper.make_tensor_value_info("y", y_type, shape)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def compiled(op, shape, scale, dtype, data):
    """(model, its compile, the int range, the zero point drawn, an rng) of one Q or DQ node."""
    onnx_t, np_t = dtype
    info = np.iinfo(np_t)
    zp = data.draw(st.integers(int(info.min), int(info.max)))
    x_t, y_t = (TensorProto.FLOAT, onnx_t) if op == "QuantizeLinear" else (onnx_t, TensorProto.FLOAT)
    m = one_node(op, x_t, y_t, shape, scale, zp, onnx_t)
    return m, torq.compile(m), info, zp, np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))


@SETTINGS
@given(shape=SHAPES, scale=SCALES, dtype=DTYPES, data=st.data())
def test_quantize_fallback(shape, scale, dtype, data):
    m, c, info, zp, rng = compiled("QuantizeLinear", shape, scale, dtype, data)
    assert {s.op for s in c.program.steps} >= {"torq_hl.act", "torq_hl.mul", "torq_hl.fma"}
    x = (rng.uniform(-1.5, 1.5, shape) * scale * 256).astype(np.float32)
    x.reshape(-1)[0] = np.float32(scale) * np.float32(2.5)        # a tie for ORT's rounding
    expect = quantize_model_of_the_steps(x, scale, zp, int(info.min), int(info.max), 128 if info.min == 0 else 0)
    assert np.array_equal(c.run({"x": x}, "native")["y"].astype(np.int64), expect)
    assert np.array_equal(c.run({"x": x}, "ort")["y"], ort_run(m, {"x": x})["y"])


@SETTINGS
@given(shape=SHAPES, scale=SCALES, dtype=DTYPES, data=st.data())
def test_dequantize_fallback(shape, scale, dtype, data):
    m, c, info, zp, rng = compiled("DequantizeLinear", shape, scale, dtype, data)
    q = rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype[1])
    got = c.run({"x": q}, "native")["y"]
    assert np.array_equal(got.view(np.int32), dequantize_model_of_the_steps(q, scale, zp).view(np.int32))
    assert np.array_equal(c.run({"x": q}, "ort")["y"].view(np.int32), ort_run(m, {"x": q})["y"].view(np.int32))


def test_a_factor_one_bf16_step_off_is_caught():
    """The injected fault: the compiled Quantize's 1/scale one bf16 step too large; the model here
    must see it (and the unchanged program must match it)."""
    m = one_node("QuantizeLinear", TensorProto.FLOAT, TensorProto.INT8, [4001], 0.013, 3, TensorProto.INT8)
    x = np.linspace(-1.6, 1.6, 4001, dtype=np.float32)
    expect = quantize_model_of_the_steps(x, 0.013, 3, -128, 127)
    c = torq.compile(m)
    assert np.array_equal(c.run({"x": x}, "native")["y"].astype(np.int64), expect)
    mul = next(st for st in c.program.steps if st.op == "torq_hl.mul")
    c.program.constants[mul.args[1]] = np.asarray(c.program.constants[mul.args[1]], np.float32) * np.float32(1 + 2 ** -7)
    c._simulator = None
    assert not np.array_equal(c.run({"x": x}, "native")["y"].astype(np.int64), expect)
