"""bf16 NSS kernels, bit for bit against an independent implementation of the documented model
(tests/bf16_model.py: Fractions and arithmetic rounding, no torq.numerics), through the whole
compiler: fp32 ONNX -> bf16 conversion -> torch-mlir -> torq_hl -> Program -> simulator."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import torq
from torq.graph.bf16 import convert_to_bf16, to_fp32

import bf16_model as M

INF = math.inf


def build(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


def nss(fp32_model, feeds):
    """(NSS outputs, the bf16 model's values: initializers and rounded inputs, as float32)."""
    b = convert_to_bf16(fp32_model)
    compiled = torq.compile(b)
    assert not compiled.report.unsupported, compiled.report.unsupported
    twin = to_fp32(b)
    values = {t.name: numpy_helper.to_array(t) for t in twin.graph.initializer}
    values.update({k: M.bf16(v) for k, v in feeds.items()})
    return compiled.run(feeds), values, compiled


def rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def conv_case(rng, c, o, hw, k, stride, pad, groups, relu):
    w = rand(rng, (o, c // groups, k, k), 0.5)
    b = rand(rng, (o,), 0.3)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[stride] * 2, pads=[pad] * 4, group=groups)]
    nodes.append(helper.make_node("Relu", ["c"], ["y"]) if relu else helper.make_node("Identity", ["c"], ["y"]))
    oh = (hw + 2 * pad - k) // stride + 1
    return build(nodes, [("x", [1, c, hw, hw])], [("y", [1, o, oh, oh])], {"w": w, "b": b})


@settings(max_examples=8, deadline=None)
@given(c=st.integers(1, 5), o=st.integers(1, 5), hw=st.integers(3, 7), k=st.sampled_from([1, 2, 3]),
       stride=st.sampled_from([1, 2]), pad=st.sampled_from([0, 1]), relu=st.booleans(), seed=st.integers(0, 99))
def test_conv2d_bit_exact(c, o, hw, k, stride, pad, relu, seed):
    rng = np.random.default_rng(seed)
    model = conv_case(rng, c, o, hw, k, stride, pad, 1, relu)
    x = rand(rng, (1, c, hw, hw))
    out, v, compiled = nss(model, {"x": x})
    lo = 0.0 if relu else -INF
    want = M.conv2d(v["x"], v["w"], v["b"], (stride, stride), (pad,) * 4, 1, lo, INF)
    assert np.array_equal(out["y"], want)
    assert "conv2d" in compiled.report.lowered and "elementwise" not in compiled.report.lowered  # Relu folded


@settings(max_examples=6, deadline=None)
@given(c=st.integers(2, 6), hw=st.integers(3, 8), k=st.sampled_from([3, 5]), stride=st.sampled_from([1, 2]),
       seed=st.integers(0, 99))
def test_depthwise_bit_exact(c, hw, k, stride, seed):
    rng = np.random.default_rng(seed)
    pad = k // 2
    model = conv_case(rng, c, c, hw, k, stride, pad, c, False)
    x = rand(rng, (1, c, hw, hw), 2.0)
    out, v, compiled = nss(model, {"x": x})
    want = M.conv2d(v["x"], v["w"], v["b"], (stride, stride), (pad,) * 4, c)
    assert np.array_equal(out["y"], want)
    assert compiled.report.lowered.get("depthwise_conv2d") == 1


@settings(max_examples=6, deadline=None)
@given(m=st.integers(1, 4), k=st.integers(1, 40), n=st.integers(1, 9), seed=st.integers(0, 99))
def test_gemm_bias_is_a_separate_bf16_add(m, k, n, seed):
    rng = np.random.default_rng(seed)
    w, b = rand(rng, (n, k)), rand(rng, (n,))
    model = build([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], [("x", [m, k])], [("y", [m, n])],
                  {"w": w, "b": b})
    x = rand(rng, (m, k), 3.0)
    out, v, compiled = nss(model, {"x": x})
    fc = M.matmul(v["x"], v["w"].T)                           # fully_connected: bf16(fl32(Σ))
    want = M.bf16(np.float32(fc) + v["b"][None, :])          # then the bias add, rounded to bf16
    assert np.array_equal(out["y"], want)
    assert compiled.report.lowered.get("fully_connected") == 1


def test_matmul_of_two_activations_bit_exact():
    rng = np.random.default_rng(3)
    model = build([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", [2, 5, 7]), ("b", [2, 7, 3])],
                  [("y", [2, 5, 3])], {})
    feeds = {"a": rand(rng, (2, 5, 7), 4.0), "b": rand(rng, (2, 7, 3), 0.01)}
    out, v, compiled = nss(model, feeds)
    want = np.stack([M.matmul(v["a"][i], v["b"][i]) for i in range(2)])
    assert np.array_equal(out["y"], want)
    assert compiled.report.lowered.get("matmul") == 1


@pytest.mark.parametrize("op,f", [("Sigmoid", M.sigmoid), ("Tanh", math.tanh), ("Erf", math.erf),
                                  ("Exp", lambda v: math.exp(v) if v < 88 else math.inf),
                                  ("Sqrt", lambda v: math.sqrt(v) if v >= 0 else math.nan)])
def test_act_functions_round_once(op, f):
    rng = np.random.default_rng(5)
    model = build([helper.make_node(op, ["x"], ["y"])], [("x", [1, 4, 40, 40])], [("y", [1, 4, 40, 40])], {})
    x = rand(rng, (1, 4, 40, 40), 3.0)
    if op == "Sqrt":
        x = np.abs(x)
    out, v, compiled = nss(model, {"x": x})        # 6400 outputs: the 65536-entry table path
    assert np.array_equal(out["y"], M.fn(f, v["x"]), equal_nan=True)


def test_elementwise_nodes_round_each_to_bf16():
    """x / c + y (broadcast), as two ONNX ops: each result rounded to bf16."""
    rng = np.random.default_rng(6)
    model = build([helper.make_node("Div", ["x", "c"], ["d"]), helper.make_node("Add", ["d", "y"], ["z"])],
                  [("x", [2, 3, 4]), ("y", [4])], [("z", [2, 3, 4])], {"c": np.array(3.0)})
    out, v, _ = nss(model, {"x": rand(rng, (2, 3, 4)), "y": rand(rng, (4,))})
    d = M.bf16(np.float32(v["x"]) / np.float32(3.0))
    assert np.array_equal(out["z"], M.bf16(d + v["y"][None, None, :]))


@pytest.mark.parametrize("op,f", [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply)])
def test_binary_op_of_two_activations_rounds_once(op, f):
    """Add / Sub / Mul (same shapes: the native elementwise kernel) and Relu after it (a
    65536-entry table): bf16(fl32(x op y)), then max(., 0)."""
    rng = np.random.default_rng(14)
    model = build([helper.make_node(op, ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["z"])],
                  [("x", [1, 8, 30, 30]), ("y", [1, 8, 30, 30])], [("z", [1, 8, 30, 30])], {})
    feeds = {"x": rand(rng, (1, 8, 30, 30)), "y": rand(rng, (1, 8, 30, 30), 0.01)}
    out, v, compiled = nss(model, feeds)
    for engine in ("native", "reference"):
        (z,) = nss_simulator(compiled, engine).run([v["x"], v["y"]])
        assert np.array_equal(z, np.maximum(M.bf16(f(np.float32(v["x"]), np.float32(v["y"]))), 0)), engine
    assert np.array_equal(out["z"], z)


@pytest.mark.parametrize("include", [0, 1])
def test_average_pool_sums_in_order_and_divides_once(include):
    rng = np.random.default_rng(7)
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4,
                            count_include_pad=include)
    model = build([node], [("x", [1, 3, 9, 9])], [("y", [1, 3, 5, 5])], {})
    out, v, compiled = nss(model, {"x": rand(rng, (1, 3, 9, 9), 10.0)})
    assert np.array_equal(out["y"], M.avgpool(v["x"], (3, 3), (2, 2), (1,) * 4, bool(include)))
    assert compiled.report.lowered.get("avg_pool2d") == 1


def test_global_average_pool_adds_in_row_major_order():
    rng = np.random.default_rng(15)
    model = build([helper.make_node("GlobalAveragePool", ["x"], ["y"])], [("x", [2, 5, 7, 9])], [("y", [2, 5, 1, 1])], {})
    x = rand(rng, (2, 5, 7, 9), 50.0)
    _, v, compiled = nss(model, {"x": x})
    want = M.bf16([[np.float32(M.ordered_sum(v["x"][i, c])) / np.float32(63) for c in range(5)] for i in range(2)])
    for engine in ("native", "reference"):
        (y,) = nss_simulator(compiled, engine).run([v["x"]])
        assert np.array_equal(y.reshape(2, 5), want), engine


def test_reductions_add_in_row_major_order():
    """ReduceMean over the last axis (LayerNorm's) and ReduceSum over a middle one: sequential fp32
    adds from +0 over the reduced elements in the input's order, on both engines."""
    rng = np.random.default_rng(17)
    model = build([helper.make_node("ReduceMean", ["x"], ["m"], axes=[2], keepdims=1),
                   helper.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=0)],
                  [("x", [2, 7, 30])], [("m", [2, 7, 1]), ("s", [2, 30])], {"ax": np.array([1])})
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([1], np.int64), "ax"))
    x = rand(rng, (2, 7, 30), 20.0)
    x[0, 0] = 0.0
    x[0, 0, :3] = [2.0 ** 24, 1.0, -2.0 ** 24]      # in order: 0 (2^24 + 1 rounds to 2^24); exactly: 1
    _, v, compiled = nss(model, {"x": x})
    x = v["x"]
    assert M.ordered_sum(x[0, 0]) == 0.0
    want_m = M.bf16([[np.float32(M.ordered_sum(x[i, j])) / np.float32(30) for j in range(7)] for i in range(2)])
    want_s = M.bf16([[M.ordered_sum(x[i, :, k]) for k in range(30)] for i in range(2)])
    assert compiled.report.lowered.get("reduce") == 2, compiled.report.lowered
    for engine in ("native", "reference"):
        m, s = nss_simulator(compiled, engine).run([x])
        assert np.array_equal(m.reshape(2, 7), want_m) and np.array_equal(s, want_s), engine


def test_reduce_mean_and_max_pool():
    rng = np.random.default_rng(8)
    model = build([helper.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3], keepdims=1),
                   helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2])],
                  [("x", [1, 2, 6, 6])], [("m", [1, 2, 1, 1]), ("p", [1, 2, 3, 3])], {})
    out, v, compiled = nss(model, {"x": rand(rng, (1, 2, 6, 6))})
    sums = [M.ordered_sum(v["x"][0, c]) for c in range(2)]
    want = M.bf16([np.float32(s) / np.float32(36) for s in sums]).reshape(1, 2, 1, 1)
    assert np.array_equal(out["m"], want)
    for engine in ("native", "reference"):
        m, _ = nss_simulator(compiled, engine).run([v["x"]])
        assert np.array_equal(m, want), engine
    assert np.array_equal(out["p"], v["x"].reshape(1, 2, 3, 2, 3, 2).max(axis=(3, 5)))


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_an_injected_fault_is_caught(monkeypatch, engine):
    """One element of one conv skips its final bf16 rounding: the bit-exact check must fail."""
    from torq.runtime import nss as nss_module
    rng = np.random.default_rng(9)
    model = conv_case(rng, 3, 4, 5, 3, 1, 1, 1, False)
    x = rand(rng, (1, 3, 5, 5))
    _, v, compiled = nss(model, {"x": x})
    want = M.conv2d(v["x"], v["w"], v["b"], (1, 1), (1,) * 4)
    sim = nss_simulator(compiled, engine)
    (good,) = sim.run([v["x"]])
    assert np.array_equal(good, want)

    real_bind = nss_module.Simulator._bind

    def bind_with_fault(st, engine="reference"):
        k = real_bind(st, engine)
        if not st.op.endswith("conv2d"):
            return k
        unrounded = real_bind(dataclasses.replace(st, dtype="f32"), engine).fn

        def faulty(args, rounding):
            out, raw = np.array(k.fn(args, rounding)), unrounded(args, rounding).reshape(k.step.shape)
            i = int(np.flatnonzero(out.ravel() != raw.ravel())[0])
            out.reshape(-1)[i] = raw.reshape(-1)[i]          # this element skips its bf16 rounding
            return out
        return dataclasses.replace(k, fn=faulty)
    monkeypatch.setattr(nss_module.Simulator, "_bind", staticmethod(bind_with_fault))
    (bad,) = nss_simulator(compiled, engine).run([v["x"]])
    assert np.count_nonzero(bad != want) == 1


def nss_simulator(compiled, engine):
    from torq.runtime.nss import Simulator
    sim = Simulator(compiled.program, engine=engine)
    assert sim.engine == engine
    return sim


def test_the_accumulation_order_is_the_stated_one():
    """k = 0 .. K-1 with one fp32 rounding per step: 2^24 + 1 - 2^24 is 0 in that order (2^24 + 1
    rounds to 2^24), 1 reversed or summed exactly. Both engines, fully connected and conv."""
    big = 2.0 ** 24
    x = np.array([[big, 1.0, -big]], np.float32)
    w = np.ones((2, 3), np.float32)
    fc = build([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], [("x", [1, 3])], [("y", [1, 2])], {"w": w})
    xc = x.reshape(1, 3, 1, 1)
    conv = build([helper.make_node("Conv", ["x", "w", "b"], ["y"])], [("x", [1, 3, 1, 1])], [("y", [1, 2, 1, 1])],
                 {"w": w.reshape(2, 3, 1, 1), "b": np.zeros(2, np.float32)})
    for model, feed in ((fc, x), (conv, xc)):
        _, _, compiled = nss(model, {"x": feed})
        for engine in ("native", "reference"):
            (y,) = nss_simulator(compiled, engine).run([feed])
            assert np.all(y == 0.0), (engine, y)
        assert M.ordered_dot(x[0], w[0]) == 0.0 and M.ordered_dot(x[0, ::-1], w[0]) == 1.0


def test_gather_at_a_scalar_index_stays_bf16():
    """Attention's q / k / v pick (Gather at a constant scalar index) becomes Slice + Squeeze in the
    front end; the bf16 type follows through the new tensor (was: torch-mlir refused a bf16 value
    cast to the Gather output's fp32 type; vit_b_16's 37 Gather layers and its run failed so)."""
    rng = np.random.default_rng(16)
    model = build([helper.make_node("Gather", ["x", "i"], ["g"], axis=0), helper.make_node("Mul", ["g", "g"], ["y"])],
                  [("x", [3, 5, 1, 8])], [("y", [5, 1, 8])], {"i": np.array(1)})
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array(1, np.int64), "i"))
    out, v, compiled = nss(model, {"x": rand(rng, (3, 5, 1, 8))})
    assert np.array_equal(out["y"], M.bf16(v["x"][1] * v["x"][1]))


def test_rank3_matmul_weight_is_read_at_its_source():
    """MatMul [B, 1, K] x W[K, N] (torchvision ViT's in-projection): torch-mlir broadcasts W over
    the batch; the weight is read once (a fully_connected), not folded into B copies."""
    rng = np.random.default_rng(13)
    w = rand(rng, (16, 24))
    model = build([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [9, 1, 16])], [("y", [9, 1, 24])], {"w": w})
    out, v, compiled = nss(model, {"x": rand(rng, (9, 1, 16))})
    assert compiled.report.lowered == {"fully_connected": 1}
    assert np.array_equal(out["y"].reshape(9, 24), M.matmul(v["x"].reshape(9, 16), v["w"]))
