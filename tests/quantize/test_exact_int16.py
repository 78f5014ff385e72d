"""exact_int16: dyadic scales around the int16 ops of a mixed-precision model make ONNX Runtime's
float32 int16 path exact, so the NSS (native rounding) computes ORT's integers bit for bit.

Faults it must catch: the pass left out (ORT's float sums and quotients round), and the NSS
rounding the exact ties of an int16 layer half up instead of to even."""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from torq import numerics, reference
from torq.compiled import compile as torq_compile
from torq.quantize import quantize
from torq.quantize.calibration import ArrayDataReader
from torq.quantize.exact_int16 import dyadic_ceil

INT16 = (("conv1", "int16"), ("dw2", "int16"), ("conv3", "int16"))


def _model(c: int, hw: int, seed: int) -> onnx.ModelProto:
    """x -> conv0 (int8, ReLU6) -> conv1 (1x1, int16 out, ReLU6) -> dw2 (3x3 depthwise, int16 in/out, ReLU6) ->
    conv3 (1x1, int16 in/out, also a graph output) -> add4 (conv3 + conv0: int16 + int8 -> int8)
    -> GAP -> fc (int8 logits)."""
    rng = np.random.default_rng(seed)

    def conv(name, x, ci, co, k, group=1, gain=1.0):
        w = rng.normal(0, gain / np.sqrt(k * k * ci / group), (co, ci // group, k, k)).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}_w"),
                      numpy_helper.from_array(rng.normal(0, 0.2, co).astype(np.float32), f"{name}_b")])
        nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], name=name, group=group,
                                      pads=[k // 2] * 4, kernel_shape=[k, k]))
        return name
    def relu6(x):
        nodes.append(helper.make_node("Clip", [x, "zero", "six"], [f"{x}_relu6"], name=f"{x}_relu6"))
        return f"{x}_relu6"
    nodes, inits = [], [numpy_helper.from_array(np.float32(0), "zero"), numpy_helper.from_array(np.float32(6), "six")]
    y0 = relu6(conv("conv0", "x", 3, c, 3, gain=8.0))          # saturates its ReLU6
    y1 = relu6(conv("conv1", y0, c, 2 * c, 1))
    y3 = conv("conv3", relu6(conv("dw2", y1, 2 * c, 2 * c, 3, group=2 * c)), 2 * c, c, 1)
    nodes += [helper.make_node("Add", [y3, y0], ["add4"], name="add4"),
              helper.make_node("GlobalAveragePool", ["add4"], ["gap"], name="gap"),
              helper.make_node("Flatten", ["gap"], ["flat"], name="flat"),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1)]
    inits += [numpy_helper.from_array(rng.normal(0, 0.3, (10, c)).astype(np.float32), "fc_w"),
              numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "fc_b")]
    g = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10]),
                           helper.make_tensor_value_info("conv3", TensorProto.FLOAT, [1, c, hw, hw])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _quantized(m, seed, **kw):
    hw = m.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    calib = [{"x": np.random.default_rng(seed + i).uniform(-1, 1, (1, 3, hw, hw)).astype(np.float32)}
             for i in range(8)]
    return quantize(m, calibration_data_reader=ArrayDataReader(calib), per_channel=True, full_integer=True,
                    exact_scales=True, precision=INT16, **kw)


def _differing(q, seed, n=4) -> int:
    """Elements where the NSS (native rounding) and ORT differ in the graph outputs (the logits
    and conv3's int16 tensor), over n random full-integer inputs."""
    hw = q.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    c = torq_compile(q)
    rng = np.random.default_rng(seed)
    total = 0
    for _ in range(n):
        x = rng.integers(-128, 128, (1, 3, hw, hw), dtype=np.int8)
        ort = reference.run(q, {"x": x})
        nss = c.simulator.run(c.program.feed({"x": x}), "native")
        for port, got in zip(c.program.outputs, nss):
            total += int(np.count_nonzero(np.asarray(ort[port.name]).reshape(-1) != np.asarray(got).reshape(-1)))
    return total


def _int16_scales(q) -> list[float]:
    inits = {t.name: t for t in q.graph.initializer}
    return [float(numpy_helper.to_array(inits[n.input[1]]).reshape(-1)[0]) for n in q.graph.node
            if n.op_type == "QuantizeLinear" and len(n.input) > 2
            and inits[n.input[2]].data_type == TensorProto.INT16]


def test_mixed_model_is_bit_exact_with_ort():
    q = _quantized(_model(8, 12, 0), 0)
    scales = _int16_scales(q)
    assert len(scales) == 3 and all(math.frexp(s)[0] == 0.5 for s in scales), scales
    assert _differing(q, 0, n=6) == 0


def test_folded_relu6_still_clips_and_the_function_holds(monkeypatch):
    """ORT folds each ReLU6 into its Q's saturation. conv0's int8 output keeps it there (zero
    point at -128, scale 6/256 = 1.5·2**-6 rounded down: the clip at 5.98), conv1's int16 output
    gets it back as a Clip node (its range has headroom); the quantized model computes the fp32
    function about as closely as with the calibrated scales."""
    from torq.quantize import exact_int16
    m = _model(8, 12, 0)
    q = _quantized(m, 0)
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    qs = {n.input[0]: n for n in q.graph.node if n.op_type == "QuantizeLinear"}
    y0 = qs["conv0_relu6"]
    assert float(inits[y0.input[1]]) == 6 / 256 and int(inits[y0.input[2]]) == -128
    producer = {o: n for n in q.graph.node for o in n.output}
    clip = producer[qs["conv1_relu6"].input[0]]
    assert clip.op_type == "Clip" and [float(inits[i]) for i in clip.input[1:]] == [0.0, 6.0]
    rng = np.random.default_rng(1)
    xs = [rng.uniform(-1, 1, (1, 3, 12, 12)).astype(np.float32) for _ in range(8)]

    def error(qm):
        io = __import__("torq.graph.io_quant", fromlist=["x"]).io_quant_params(qm)
        (xi,), (yo,) = io["inputs"].values(), [io["outputs"]["logits"]]
        worst = 0.0
        for x in xs:
            xq = np.clip(np.rint(x / xi["scale"]) + xi["zero_point"], -128, 127).astype(np.int8)
            got = (np.asarray(reference.run(qm, {"x": xq})["logits"], np.float64) - yo["zero_point"]) * yo["scale"]
            want = np.asarray(reference.run(m, {"x": x})["logits"])
            worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
        return worst
    exact = error(q)
    monkeypatch.setattr(exact_int16, "exact_int16_scales", lambda q, fp32=None: (q, set()))
    assert exact < 0.1 and exact < 2 * error(_quantized(m, 0)) + 0.02


def test_without_the_pass_ort_and_the_nss_differ(monkeypatch):
    """The fault of leaving the scales as calibrated: ORT's float32 sums and quotients of the
    int16 layers round, and the logits move."""
    from torq.quantize import exact_int16
    monkeypatch.setattr(exact_int16, "exact_int16_scales", lambda q, fp32=None: (q, set()))
    q = _quantized(_model(8, 12, 0), 0)
    assert not all(math.frexp(s)[0] == 0.5 for s in _int16_scales(q))
    assert _differing(q, 0, n=6) > 0


def test_rounding_ties_up_is_caught(monkeypatch):
    """An NSS fault: an int16 layer's exact ties rounded half up (NTP) instead of to even."""
    real = numerics.rescale_ties_even
    monkeypatch.setattr(numerics, "rescale_ties_even", lambda dq, ys, floating=False:
                        False if floating else real(dq, ys))
    q = _quantized(_model(8, 12, 0), 0)
    assert _differing(q, 0, n=6) > 0


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.sampled_from([4, 6, 8, 16]), hw=st.integers(5, 11), seed=st.integers(0, 10 ** 6))
def test_bit_exact_over_shapes_and_weights(c, hw, seed):
    assert _differing(_quantized(_model(c, hw, seed), seed), seed, n=2) == 0


@given(v=st.floats(1e-12, 1e6), bits=st.integers(1, 4))
def test_dyadic_ceil(v, bits):
    d = float(dyadic_ceil(np.array([v]), bits)[0])
    m, e = math.frexp(d)
    assert v <= d < v * (1 + 2.0 ** (1 - bits)) + 1e-300
    assert (m * 2 ** bits) == int(m * 2 ** bits)            # a `bits`-bit mantissa


@settings(max_examples=200, deadline=None)
@given(ea=st.integers(-20, -2), eb=st.integers(-20, -2), ec=st.integers(-14, 0), ma=st.sampled_from([1.0, 1.5]),
       mb=st.sampled_from([1.0, 1.5]), narrow_b=st.booleans(),
       za=st.integers(-2000, 2000), zb=st.integers(-100, 100), zc=st.integers(-128, 127), seed=st.integers(0, 99))
def test_int16_add_on_dyadic_scales_is_ort_exactly(ea, eb, ec, ma, mb, narrow_b, za, zb, zc, seed):
    """The NSS's Add (multipliers, NTE, zero point after rounding) = ORT's DQ -> float Add -> Q,
    bit for bit, wherever ``float_add_exact`` says ORT's float Add is exact (int16 + int16 or
    int16 + int8 operands, scales 1 or 1.5 times a power of two, a power-of-two output)."""
    sa, sb, sc = np.float32(ma * 2.0 ** ea), np.float32(mb * 2.0 ** eb), np.float32(2.0 ** ec)
    if not numerics.float_add_exact(sa, sb, sc, 16, 8 if narrow_b else 16):
        return
    rng = np.random.default_rng(seed)
    a = rng.integers(-2 ** 15, 2 ** 15, 4096).astype(np.int16)
    b = rng.integers(-128, 128, 4096).astype(np.int8) if narrow_b else rng.integers(-2 ** 15, 2 ** 15, 4096).astype(np.int16)
    ma, mb, shift = numerics.add_multipliers(sa, sb, sc)
    nss = numerics.add_native_mults(a, b, za, zb, ma, mb, shift, zc, -128, 127, ties_even=True, zp_after=True)
    ort = numerics.add_float_ort(a, b, sa, za, sb, zb, sc, zc, -128, 127)
    assert np.array_equal(nss, ort)
    wrong = numerics.add_native_mults(a, b, za, zb, ma, mb, shift, zc, -128, 127, ties_even=True, zp_after=False)
    t = (a.astype(np.int64) - za) * ma + (b.astype(np.int64) - zb) * mb
    ties = (t % (1 << shift) == 1 << (shift - 1)) & (ort > -128) & (ort < 127) if shift > 0 else False
    if zc % 2 and np.any(ties):
        assert not np.array_equal(wrong, ort)     # the zero point before rounding flips odd-zp ties
