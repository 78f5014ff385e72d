"""Cross-layer equalization: same fp32 function (ONNX Runtime), equal weight ranges, faults caught."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import torq.quantize.equalize as eq
from torq.errors import TorqError
from torq.quantize.calibration import ArrayDataReader


def _conv(name, x, w, b, group=1, pads=1):
    inputs = [x, f"{name}_w"] + ([f"{name}_b"] if b is not None else [])
    k = w.shape[2]
    node = helper.make_node("Conv", inputs, [f"{name}_y"], name=name, kernel_shape=[k, k],
                            pads=[pads if k > 1 else 0] * 4, group=group)
    inits = [numpy_helper.from_array(w, f"{name}_w")]
    if b is not None:
        inits.append(numpy_helper.from_array(b, f"{name}_b"))
    return node, inits


def _act(kind, x, name):
    if kind == "relu":
        return [helper.make_node("Relu", [x], [f"{name}_a"], name=f"{name}_relu")], []
    if kind.startswith("clip"):
        hi = float(kind[4:] or 6)
        return ([helper.make_node("Clip", [x, f"{name}_lo", f"{name}_hi"], [f"{name}_a"], name=f"{name}_clip")],
                [numpy_helper.from_array(np.array(0, np.float32), f"{name}_lo"),
                 numpy_helper.from_array(np.array(hi, np.float32), f"{name}_hi")])
    return [], []


def chain(weights, acts, groups, channels_in, size=8):
    """x → Conv → act → Conv → act → … with the given weights (O×I/g×k×k), biases N(0, 1)."""
    rng = np.random.default_rng(1)
    nodes, inits, x = [], [], "x"
    for i, (w, g) in enumerate(zip(weights, groups)):
        node, ini = _conv(f"c{i}", x, w, rng.normal(0, 1, len(w)).astype(np.float32), group=g)
        nodes.append(node)
        inits += ini
        x = node.output[0]
        if i < len(acts):
            an, ai = _act(acts[i], x, f"c{i}")
            nodes += an
            inits += ai
            x = an[0].output[0] if an else x
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [1, channels_in, size, size])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, None, None, None])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def spread_weights(rng, shape, spread=100.0):
    """Weights whose output channels differ in range by up to ``spread`` (the depthwise problem)."""
    w = rng.normal(0, 1, shape)
    return (w * np.geomspace(1 / spread, 1, shape[0])[rng.permutation(shape[0])].reshape(-1, 1, 1, 1)
            ).astype(np.float32)


def run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]


def weights(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def inputs(n, c=4, size=8, scale=1.0, seed=2):
    rng = np.random.default_rng(seed)
    return [(rng.normal(0, scale, (1, c, size, size))).astype(np.float32) for _ in range(n)]


def mobilenet_block(rng, acts=("relu", "relu")):
    """expand 1×1 (4→8) → act → depthwise 3×3 (8) → act → project 1×1 (8→5)."""
    ws = [spread_weights(rng, (8, 4, 1, 1)), spread_weights(rng, (8, 1, 3, 3)), spread_weights(rng, (5, 8, 1, 1))]
    return chain(ws, list(acts), [1, 8, 1], 4)


def test_relu_chain_keeps_outputs_and_equalizes_ranges():
    m = mobilenet_block(np.random.default_rng(0))
    r = eq.equalize(m)                                  # no reader: synthetic check inputs
    assert r.pairs == ["c0 -> c1", "c1 -> c2"] and r.skipped == {"c2": "'c2_y' is a graph output"}
    for x in inputs(5, scale=3.0):
        ref, got = run(m, x), run(r.model, x)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    w = weights(r.model)
    for a, b in (("c0_w", "c1_w"), ("c1_w", "c2_w")):
        g = 8 if b == "c1_w" else 1
        np.testing.assert_allclose(eq.out_ranges(w[a]), eq.in_ranges(w[b], g), rtol=1e-4)
    before = weights(m)
    assert eq.out_ranges(before["c1_w"]).max() / eq.out_ranges(before["c1_w"]).min() > 20
    assert eq.out_ranges(w["c1_w"]).max() / eq.out_ranges(w["c1_w"]).min() < \
        eq.out_ranges(before["c1_w"]).max() / eq.out_ranges(before["c1_w"]).min() / 2
    onnx.checker.check_model(r.model)


def test_scale_formula_is_nagels():
    r1, r2 = np.array([4.0, 1.0, 0.0, 2.0]), np.array([1.0, 4.0, 3.0, 0.0])
    s = eq.equalizing_scales(r1, r2)
    np.testing.assert_allclose(s, [2.0, 0.5, 1.0, 1.0])          # sqrt(r1·r2)/r2; 1 where a range is 0
    np.testing.assert_allclose((r1 / s)[:2], (r2 * s)[:2])        # both become sqrt(r1·r2) = 2


def test_in_ranges_of_a_grouped_conv_match_brute_force():
    w = np.random.default_rng(3).normal(0, 1, (6, 2, 3, 3))        # 6 outputs, 3 groups of 2 input channels
    expect = [max(np.abs(w[o, c % 2]).max() for o in range(6) if o // 2 == c // 2) for c in range(6)]
    np.testing.assert_allclose(eq.in_ranges(w, 3), expect)


def test_relu6_pairs_are_bounded_by_calibration_and_exact_on_it():
    rng = np.random.default_rng(4)
    m = mobilenet_block(rng, acts=("clip", "clip"))
    calib = inputs(6, scale=2.0, seed=5)
    r = eq.equalize(m, ArrayDataReader([{"x": x} for x in calib]))
    assert r.pairs == ["c0 -> c1", "c1 -> c2"]
    peaks = eq.channel_maxima(m, ["c0_y", "c1_y"], ArrayDataReader([{"x": x} for x in calib]))
    cut = sum(int((p > 6).sum()) for p in peaks.values())
    assert r.clip_bound_channels == cut > 0                        # some channels do hit the clip ...
    assert cut < 16                                               # ... and some do not
    for x in calib:                                               # exact where the bounds were measured
        ref = run(m, x)
        np.testing.assert_allclose(run(r.model, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    w0, w = weights(m), weights(r.model)
    s = eq.out_ranges(w0["c0_w"]) / eq.out_ranges(w["c0_w"])      # the scale each channel got
    np.testing.assert_allclose(s[peaks["c0_y"] > 6], 1.0, rtol=1e-6)   # clipped channels untouched
    free = peaks["c0_y"] <= 6
    assert np.all(peaks["c0_y"][free] / s[free] <= 6 * (1 + 1e-5))  # the rest still below the clip
    assert np.any(np.abs(s - 1) > 0.1)


def test_relu6_needs_calibration_or_is_skipped():
    m = mobilenet_block(np.random.default_rng(4), acts=("clip", "relu"))
    r = eq.equalize(m)
    assert r.pairs == ["c1 -> c2"]
    assert r.skipped["c0"] == "ReLU6 needs calibration data to show where the clip binds"
    r = eq.equalize(m, ArrayDataReader([{"x": x} for x in inputs(2)]), relu6="skip")
    assert r.skipped["c0"] == "ReLU6 pairs are skipped"
    with pytest.raises(TorqError, match="unknown ReLU6 policy"):
        eq.equalize(m, relu6="relu")


def test_injected_wrong_scale_is_caught(monkeypatch):
    m = mobilenet_block(np.random.default_rng(0))
    good = eq.scale_pair

    def wrong(w1, b1, w2, groups2, s):          # forgets the bias: Conv₁'s channel c is off
        good(w1, None, w2, groups2, s)
    monkeypatch.setattr(eq, "scale_pair", wrong)
    with pytest.raises(TorqError, match="not equivalent"):
        eq.equalize(m)

    def inconsistent(w1, b1, w2, groups2, s):   # Conv₂ gets s², Conv₁ only 1/s
        good(w1, b1, w2, groups2, s)
        good(w1.copy(), None, w2, groups2, s)
    monkeypatch.setattr(eq, "scale_pair", inconsistent)
    with pytest.raises(TorqError, match="changed output 'c2_y' by"):
        eq.equalize(m)


def test_check_equivalent_sees_one_wrong_channel():
    m = mobilenet_block(np.random.default_rng(0))
    r = eq.equalize(m)
    assert r.max_rel_diff < 1e-5
    bad = onnx.ModelProto()
    bad.CopyFrom(r.model)
    t = next(t for t in bad.graph.initializer if t.name == "c1_w")
    w = numpy_helper.to_array(t).copy()
    w[np.argmax(eq.out_ranges(w))] *= 1.05                  # a 5 % error in one channel's scale
    t.CopyFrom(numpy_helper.from_array(w, t.name))
    with pytest.raises(TorqError, match="not equivalent"):
        eq.check_equivalent(m, bad)


def _unchanged(m, r):
    for name, a in weights(m).items():
        np.testing.assert_array_equal(weights(r.model)[name], a, err_msg=name)


def test_shared_weights_are_left_alone():
    rng = np.random.default_rng(6)
    m = chain([spread_weights(rng, (4, 4, 3, 3)), spread_weights(rng, (4, 4, 3, 3))], ["relu"], [1, 1], 4)
    m.graph.node[2].input[1] = "c0_w"                       # c1 reads c0's weight too
    del m.graph.initializer[[t.name for t in m.graph.initializer].index("c1_w")]
    r = eq.equalize(m)
    assert r.pairs == [] and r.skipped["c0"] == "its weight 'c0_w' is shared with another node"
    _unchanged(m, r)


def test_non_conv_consumers_and_branches_are_left_alone():
    rng = np.random.default_rng(7)
    m = chain([spread_weights(rng, (4, 4, 3, 3)), spread_weights(rng, (4, 4, 3, 3))], ["relu"], [1, 1], 4)
    pool = helper.make_node("MaxPool", ["c0_a"], ["p"], name="pool", kernel_shape=[1, 1])
    m.graph.node[2].input[0] = "p"                          # c0 → relu → MaxPool → c1
    m.graph.node.insert(2, pool)
    r = eq.equalize(m)
    assert r.pairs == [] and r.skipped["c0"] == "it feeds MaxPool 'pool', not a Conv"
    _unchanged(m, r)
    m = chain([spread_weights(rng, (4, 4, 3, 3)), spread_weights(rng, (4, 4, 3, 3))], ["relu"], [1, 1], 4)
    m.graph.output.append(helper.make_tensor_value_info("c0_a", TensorProto.FLOAT, None))   # a second reader
    r = eq.equalize(m)
    assert r.pairs == [] and r.skipped["c0"] == "'c0_a' is a graph output"
    _unchanged(m, r)


def test_other_clips_and_run_time_weights_are_left_alone():
    rng = np.random.default_rng(8)
    m = chain([spread_weights(rng, (4, 4, 3, 3)), spread_weights(rng, (4, 4, 3, 3))], ["clip4"], [1, 1], 4)
    r = eq.equalize(m, ArrayDataReader([{"x": x} for x in inputs(2)]))
    assert r.pairs == [] and r.skipped["c0"] == "its output goes through Clip(0.0, 4.0), not Relu or ReLU6"
    _unchanged(m, r)
    m = chain([spread_weights(rng, (4, 4, 3, 3)), spread_weights(rng, (4, 4, 3, 3))], ["relu"], [1, 1], 4)
    m.graph.initializer.remove(next(t for t in m.graph.initializer if t.name == "c1_w"))
    m.graph.input.append(helper.make_tensor_value_info("c1_w", TensorProto.FLOAT, [4, 4, 3, 3]))
    assert eq.find_pairs(m)[1]["c0"] == "its next Conv's weight 'c1_w' is computed at run time"


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.sampled_from([1, 2, "dw"]), st.sampled_from(["relu", "none"]),
       st.integers(0, 2**31 - 1), st.booleans())
def test_property_any_pair_keeps_the_function(mult, groups2, act, seed, bias):
    """Random channel counts, grouped / depthwise second convs, Relu or nothing between."""
    rng = np.random.default_rng(seed)
    c = 2 * mult * (1 if groups2 == "dw" else 2)
    g2 = c if groups2 == "dw" else groups2
    w1 = spread_weights(rng, (c, 3, 3, 3), spread=float(rng.uniform(1, 1000)))
    w2 = spread_weights(rng, (c if groups2 == "dw" else 4, c // g2, 3, 3))
    m = chain([w1, w2], [act], [1, g2], 3)
    if not bias:
        m.graph.node[0].input.pop()
    r = eq.equalize(m)
    assert r.pairs == ["c0 -> c1"]
    x = inputs(1, c=3, scale=2.0, seed=seed % 1000)[0]
    ref = run(m, x)
    np.testing.assert_allclose(run(r.model, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    w = weights(r.model)
    np.testing.assert_allclose(eq.out_ranges(w["c0_w"]), eq.in_ranges(w["c1_w"], g2), rtol=1e-4)
