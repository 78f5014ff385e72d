"""The NPU's bf16 Quantize / Dequantize fallback against ONNX Runtime's float32 Q/DQ: within the
bound its arithmetic implies (numerics/bf16.py), and a fault just beyond the bound is caught."""
from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from torq import numerics as nx

F32 = np.float32
scales = st.floats(1e-4, 2.0).map(F32)
zps = st.integers(-128, 127)


def _ort_qdq(op: str, x, scale, zp):
    """ONNX Runtime itself running one QuantizeLinear / DequantizeLinear."""
    import onnxruntime as ort
    in_t, out_t = (TensorProto.FLOAT, TensorProto.INT8) if op == "QuantizeLinear" else (TensorProto.INT8, TensorProto.FLOAT)
    g = helper.make_graph([helper.make_node(op, ["x", "s", "z"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", in_t, list(x.shape))],
                          [helper.make_tensor_value_info("y", out_t, list(x.shape))],
                          [numpy_helper.from_array(np.array(scale, F32), "s"), numpy_helper.from_array(np.array(zp, np.int8), "z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_dequantize_bound_holds_for_every_int8_against_ort():
    rng = np.random.default_rng(0)
    q = np.arange(-128, 128, dtype=np.int8)
    worst = 0.0
    for _ in range(40):
        s, zp = F32(10.0 ** rng.uniform(-4, 0.3)), int(rng.integers(-128, 128))
        ort = _ort_qdq("DequantizeLinear", q, s, zp)
        assert np.array_equal(ort, nx.dequantize_ort(q, s, zp))
        npu = nx.dequantize_fallback(q, s, zp)
        d = np.abs(q.astype(np.int64) - zp)
        diff = np.abs(npu.astype(np.float64) - ort)
        assert (diff <= nx.dequantize_fallback_bound(d, s)).all()
        worst = max(worst, float((diff / s).max()))
    assert worst > 1.0            # the bound is needed: bf16 moves a dequantized int8 by > 1 LSB


@settings(max_examples=60, deadline=None)
@given(scales, zps, st.integers(0, 2**31 - 1))
def test_quantize_bound_holds_against_ort(scale, zp, seed):
    rng = np.random.default_rng(seed)
    x = (rng.uniform(-300, 300, 512) * scale).astype(F32)
    ort = _ort_qdq("QuantizeLinear", x, scale, zp).astype(np.int64)
    assert np.array_equal(ort, nx.quantize_ort(x, scale, zp, -128, 127))
    npu = nx.quantize_fallback(x, scale, zp, -128, 127)
    assert (np.abs(npu - ort) <= nx.quantize_fallback_bound(x, scale, zp)).all()


def test_quantize_differs_by_more_than_one_lsb_so_the_bound_matters():
    s, zp = F32(0.0010352317), -128           # found by a scan over scales: 2 LSB
    x = (np.linspace(-300, 300, 60001) * s).astype(F32)
    diff = np.abs(nx.quantize_fallback(x, s, zp, -128, 127) - nx.quantize_ort(x, s, zp, -128, 127))
    assert diff.max() >= 2 and (diff <= nx.quantize_fallback_bound(x, s, zp)).all()


def test_faults_beyond_the_bound_are_caught():
    """A Quantize whose bf16 factor is 2^-5 too large, a Dequantize whose scale is 2^-6 too large:
    both leave the derived bound somewhere (the bound is not so loose that such a fault hides)."""
    s, zp = F32(0.0123), 3
    x = np.linspace(-1.6, 1.6, 4001, dtype=F32)
    factor, bias = nx.bf16_fallback_constants(s, zp, True)
    bad_q = np.clip(nx.float_to_int(nx.bf16_affine(nx.to_bf16(x), factor * (1 + 2 ** -5), bias)), -128, 127)
    ort_q = nx.quantize_ort(x, s, zp, -128, 127)
    assert (np.abs(bad_q - ort_q) > nx.quantize_fallback_bound(x, s, zp)).any()
    q = np.arange(-128, 128)
    bad_dq = nx.bf16_affine((q - zp).astype(F32), nx.to_bf16(F32(s * (1 + 2 ** -6))), 0.0)
    assert (np.abs(bad_dq - nx.dequantize_ort(q, s, zp)) > nx.dequantize_fallback_bound(np.abs(q - zp), s)).any()


def test_fallbacks_are_the_simulators_steps():
    """quantize_fallback / dequantize_fallback compose exactly the per-op functions the NSS runs."""
    s, zp = F32(0.02), -5
    x = np.linspace(-3, 3, 999, dtype=F32)
    f, b = nx.bf16_fallback_constants(s, zp, True)
    steps = np.clip(nx.float_to_int(nx.bf16_affine(nx.to_bf16(x), f, b)), -128, 127)
    assert np.array_equal(nx.quantize_fallback(x, s, zp, -128, 127), steps)
    q = np.arange(-128, 128)
    f, _ = nx.bf16_fallback_constants(s, zp, False)
    assert np.array_equal(nx.dequantize_fallback(q, s, zp), nx.bf16_affine((q - zp).astype(F32), f, 0.0))
