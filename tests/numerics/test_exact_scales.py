"""Weight scales on which ORT's float requantization is exact (`torq.quantize.exact_scales`) make
the NPU's native rounding (multiplier from that scale, NTE in the ACT) bit-exact with ORT."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

import torq
from torq import numerics as nx
from torq.numerics import loops
from torq.quantize.exact_scales import exact_scales, exact_weight_scale
from torq.runtime.nss import Simulator
from torq.verify import verify

F32 = np.float32


@settings(max_examples=300, deadline=None)
@given(st.floats(-3, 0), st.floats(-4, -1), st.floats(-3, 0))
def test_exact_weight_scale(lxs, lws, lys):
    """A scale found is within 5 % and makes ORT's requant scale exact. Not every triple has one:
    the float32 quotient can step over every grid point near ``s`` (e.g. xs=10**-0.5,
    ws=10**-3.03125, ys=10**-0.99999), and then the channel keeps its scale."""
    xs, ws, ys = F32(10 ** lxs), F32(10 ** lws), F32(10 ** lys)
    c = exact_weight_scale(xs, ws, ys)
    if c is None:
        return
    assert abs(c / ws - 1) <= 0.05
    assert nx.exact_dyadic(F32(F32(xs * c) / ys))


def test_exact_weight_scale_is_found_almost_always():
    """Over a seeded sweep of scales whose grid steps are < 0.75 % of ``s``, at most 1 % of the
    triples find no exact scale (measured: 1 of 1102)."""
    rng = np.random.default_rng(0)
    found = total = 0
    for lxs, lws, lys in rng.uniform((-3, -4, -3), (0, -1, 0), (2000, 3)):
        xs, ws, ys = F32(10 ** lxs), F32(10 ** lws), F32(10 ** lys)
        if float(F32(F32(xs * ws) / ys)) < 2e-3:     # 2**-16 steps > 0.75 % of s: may be out of reach
            continue
        total += 1
        found += exact_weight_scale(xs, ws, ys) is not None
    assert total > 1000 and found >= 0.99 * total


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from([0, 4, 16, 28, 36]))
def test_nte_loop_matches_the_formula(seed, shift):
    rng = np.random.default_rng(seed)
    acc = rng.integers(-2 ** 20, 2 ** 20, (2, 3, 4, 5)).astype(np.int64)
    extra = rng.integers(-1000, 1000, 3)
    mult = rng.integers(0, 2 ** 31 - 1, 3) if shift else rng.integers(0, 3, 3)
    if shift:                                   # force exact ties: power-of-two multiplier, odd multiples
        k = min(shift - 1, 30)
        mult[0] = 1 << k
        acc[0, 0, 0, :3] = np.array([1, 3, -3]) * (1 << (shift - 1 - k)) - extra[0]
    out = np.empty(acc.shape, np.int64)
    loops.act_loop(acc, extra, mult, shift, 5, -128, 127, out, True)
    want = nx.act_native(acc + extra[None, :, None, None], mult, shift, 5, -128, 127, ties_even=True)
    np.testing.assert_array_equal(out, want)
    t = (acc + extra[None, :, None, None]) * mult[None, :, None, None]
    exact = np.round(t / 2.0 ** shift) if shift < 40 else None   # numpy rounds half to even
    if exact is not None and np.all(np.abs(t) < 2 ** 52):
        np.testing.assert_array_equal(want, np.clip(exact + 5, -128, 127))


def _model(per_channel, seed, cin=3, cout=6, k=3, depthwise=False, gemm=False, fmt="qdq"):
    from onnx import helper
    from qmodels import conv_model, model, quantize
    rng = np.random.default_rng(seed)
    if gemm:
        m = model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], [("x", [2, 24])], ["y"],
                  {"w": rng.normal(0, 0.3, (10, 24)).astype(F32), "b": rng.normal(0, 0.2, 10).astype(F32)})
        return quantize(m, {"x": [2, 24]}, fmt, per_channel=per_channel, seed=seed)
    group = cin if depthwise else 1
    m = conv_model(rng, cin, cin if depthwise else cout, k, 1, 1, [1, 1, 1, 1], group, True, True, (9, 9))
    return quantize(m, {"x": [1, cin, 9, 9]}, fmt, per_channel=per_channel, seed=seed)


def _ops(compiled, names=("torq_hl.conv2d", "torq_hl.depthwise_conv2d", "torq_hl.fully_connected")):
    return [st for st in compiled.program.steps if st.op in names]


@settings(max_examples=18, deadline=None)
@given(st.booleans(), st.integers(0, 10 ** 6),
       st.sampled_from(["conv", "depthwise", "gemm", "qlinearconv", "qlinear depthwise", "qgemm"]))
def test_exact_scales_make_native_bit_exact_with_ort(per_channel, seed, kind):
    """QDQ Conv / depthwise / Gemm and QOperator QLinearConv (plain and depthwise) / QGemm."""
    q = _model(per_channel, seed, depthwise=kind.endswith("depthwise"), gemm=kind.endswith("gemm"),
               fmt="qoperator" if kind.startswith("q") else "qdq")
    assert kind.startswith("q") == any(n.op_type in ("QLinearConv", "QGemm") for n in q.graph.node)
    qe = exact_scales(q)
    compiled = torq.compile(qe)
    assert all(st.attrs["round_ties_even"] == 1 for st in _ops(compiled))
    for s in range(3):
        res = verify(compiled, seed=s, modes=("native", "ort"))
        assert res.ok
        assert all(o.exact for o in res.outputs), res.outputs        # native too: 0 LSB
        assert all(od.differ == 0 for od in res.op_diffs if od.mode == "native"), res.op_diffs
    # an unchanged model keeps the reference compiler's NTP and its explained 1-LSB differences
    assert all(st.attrs["round_ties_even"] == 0 for st in _ops(torq.compile(q)))


def test_weights_and_bias_keep_their_values():
    q = _model(True, 3)
    qe = exact_scales(q)
    a = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in qe.graph.initializer}
    w, s, s2 = a["w_quantized"], a["w_scale"], b["w_scale"]
    assert not np.array_equal(s, s2) and np.all(np.abs(s2 / s - 1) <= 0.05)
    real_old = w * s[:, None, None, None]
    real_new = b["w_quantized"] * s2[:, None, None, None]
    assert np.all(np.abs(real_new - real_old) <= 0.5 * s2[:, None, None, None] + 0.5 * s[:, None, None, None])
    bias_old = a["b_quantized"] * a["b_quantized_scale"]
    bias_new = b["b_quantized"] * b["b_quantized_scale"]
    np.testing.assert_allclose(bias_new, bias_old, atol=float(b["b_quantized_scale"].max()))


def test_qlinearconv_weights_and_bias_keep_their_values():
    """QLinearConv's int32 bias has no scale of its own (xs·ws): it is re-quantized to xs·ws'."""
    q = _model(True, 3, fmt="qoperator")
    qe = exact_scales(q)
    a = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in qe.graph.initializer}
    s, s2 = a["w_scale"], b["w_scale"]
    assert not np.array_equal(s, s2) and np.all(np.abs(s2 / s - 1) <= 0.05)
    xs = a["x_scale"]
    bias_old, bias_new = a["b_quantized"] * nx.dq_scale(xs, s), b["b_quantized"] * nx.dq_scale(xs, s2)
    assert not np.array_equal(a["b_quantized"], b["b_quantized"])
    np.testing.assert_allclose(bias_new, bias_old, atol=float(nx.dq_scale(xs, s2).max()))


def _dyadic_conv():
    """A hand-made QDQ conv with power-of-two scales: requant scale 2**-5, so 1 in 32 outputs is
    an exact x.5 tie."""
    from onnx import TensorProto, helper
    from qmodels import model
    rng = np.random.default_rng(0)
    c = lambda name, v: numpy_helper.from_array(np.asarray(v), name)   # noqa: E731
    inits = [c("xs", F32(2 ** -4)), c("xz", np.int8(3)), c("w", rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)),
             c("ws", F32(2 ** -3)), c("wz", np.int8(0)), c("b", rng.integers(-500, 500, 8).astype(np.int32)),
             c("bs", F32(2 ** -7)), c("bz", np.int32(0)), c("ys", F32(2 ** -2)), c("yz", np.int8(-5))]
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"]),
             helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bf"]),
             helper.make_node("Conv", ["xf", "wf", "bf"], ["cf"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["cf", "ys", "yz"], ["y"])]
    m = model(nodes, [("x", [1, 4, 9, 9], TensorProto.INT8)],
              [helper.make_tensor_value_info("y", TensorProto.INT8, [1, 8, 9, 9])], {})
    m.graph.initializer.extend(inits)
    return m


def test_power_of_two_scales_are_exact_and_nte_matters(monkeypatch):
    """Dyadic scales as given (no pass needed): NTE chosen, native bit-exact with ORT. Injected
    fault: the ACT back to NTP (round half up) — the real ties go the other way and verify's
    per-op check and the whole-model comparison see it."""
    compiled = torq.compile(_dyadic_conv())
    assert [st.attrs["round_ties_even"] for st in _ops(compiled)] == [1]
    res = verify(compiled, modes=("native", "ort"))
    assert res.ok and all(o.exact for o in res.outputs)
    act_loop = nx.native.act_loop          # the fault is in the reference engine's numpy/numba ACT
    monkeypatch.setattr(compiled, "_simulator", Simulator(compiled.program, "reference"))
    monkeypatch.setattr(nx.native, "act_loop", lambda *args, ties_even=False: act_loop(*args))
    monkeypatch.setattr(nx.native, "nte_shift", nx.native.ntp_shift)
    bad = verify(compiled, modes=("native",))
    (od,) = bad.op_diffs
    assert od.differ > 0 and od.causes["tie"] == od.differ
    assert not bad.outputs[0].exact


def test_quantize_api_and_cli_flag(tmp_path, capsys):
    """torq.quantize(..., exact_scales=True) and `torq-gen-config quantize --exact-scales`: every
    Conv's ORT requant scale is an exact dyadic."""
    import onnx
    from qmodels import conv_model
    from torq.gen_config.cli import main
    m = conv_model(np.random.default_rng(2), 3, 6, 3, 1, 1, [1, 1, 1, 1], 1, True, True, (9, 9))
    src = tmp_path / "m.onnx"
    onnx.save(m, src)

    def scales(q):
        a = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
        return nx.ort_requant_scale(nx.dq_scale(a["x_scale"], a["w_scale"]), a["y_scale"])
    q = torq.quantize(str(src), per_channel=True, exact_scales=True)
    assert np.all(nx.exact_dyadic(scales(q)))
    assert not np.all(nx.exact_dyadic(scales(torq.quantize(str(src), per_channel=True))))
    assert main(["quantize", "--model", str(src), "--per-channel", "--exact-scales", "-o", str(tmp_path / "q.onnx")]) == 0
    assert "exact_scales=True" in capsys.readouterr().out
    assert np.all(nx.exact_dyadic(scales(onnx.load(tmp_path / "q.onnx"))))
