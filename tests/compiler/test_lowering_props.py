"""Property tests: every lowering rule, on random configs, against real ONNX Runtime.

`ort` rounding must be bit-exact with ORT on every element; `native` (the NPU) may differ only
by ±1 LSB at explained rounding ties / near-ties (verify().ok checks both, op by op).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import helper

from qmodels import conv_model, model, quantize
from torq import compile
from torq import compile as torq_compile
from torq.verify import verify
from torq.graph.inputs import random_inputs

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FORMATS = st.sampled_from(["qdq", "qoperator"])
ACTS = st.sampled_from(["s8", "u8"])


def check(q, expect: str | None, seeds=(0, 1)):
    # quantize_static leaves some lone ops (e.g. a QOperator GlobalAveragePool) in float: nothing to lower.
    assume(any(n.op_type in ("QuantizeLinear", "DequantizeLinear") or n.op_type.startswith("QLinear")
               for n in q.graph.node))
    return check_compiled(compile(q), expect, seeds)


def check_compiled(c, expect: str | None, seeds=(0, 1)):
    assert c.report.unsupported == [], [str(u) for u in c.report.unsupported]
    assert expect is None or c.report.lowered.get(expect, 0) >= 1, c.report.lowered
    text = c.ir("torq_hl")
    assert not [ln for ln in text.splitlines() if "linalg." in ln and not any(
        k in ln for k in ("linalg.transpose", "linalg.broadcast", "linalg.fill", "linalg.yield"))], text
    for seed in seeds:
        r = verify(c, seed=seed)
        for o in r.outputs:
            if o.mode == "ort":
                assert o.exact, f"ort rounding differs from ORT: {o}"
        bad = [od for od in r.op_diffs if not od.explained]
        assert not bad, bad
    return c


@SETTINGS
@given(st.data(), FORMATS, ACTS, st.booleans())
def test_conv(data, fmt, act, per_channel):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    kind = data.draw(st.sampled_from(["dense", "depthwise", "grouped"]))
    depthwise = kind == "depthwise"
    cin = data.draw(st.integers(1, 6))
    cout = cin if depthwise else data.draw(st.integers(1, 6))
    group = cin if depthwise else 1
    if kind == "grouped":
        group = data.draw(st.sampled_from([2, 3]))
        cin, cout = group * data.draw(st.integers(1, 3)), group * data.draw(st.integers(1, 3))
    k = data.draw(st.sampled_from([1, 3, 5]))
    stride, dilation = data.draw(st.sampled_from([1, 2])), data.draw(st.sampled_from([1, 2]))
    pads = [data.draw(st.integers(0, 2)) for _ in range(4)]
    span = dilation * (k - 1) + 1
    h, w = data.draw(st.integers(span, span + 9)), data.draw(st.integers(span, span + 9))
    m = conv_model(rng, cin, cout, k, stride, dilation, pads, group,
                   data.draw(st.booleans()), data.draw(st.booleans()), (h, w))
    q = quantize(m, {"x": [1, cin, h, w]}, fmt, per_channel, act, seed=int(rng.integers(1000)),
                 lo=-float(rng.uniform(0.1, 2)), hi=float(rng.uniform(0.1, 3)))
    check(q, "depthwise_conv2d" if group == cin == cout and cin > 1 else "conv2d")


@SETTINGS
@given(st.data(), FORMATS, ACTS, st.booleans())
def test_conv1d(data, fmt, act, per_channel):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    cin, cout, k = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5)), data.draw(st.sampled_from([1, 3, 5]))
    stride, pads = data.draw(st.sampled_from([1, 2])), [data.draw(st.integers(0, 2)) for _ in range(2)]
    n = data.draw(st.integers(k, k + 12))
    w = rng.normal(0, 1 / np.sqrt(cin * k), (cout, cin, k))
    m = model([helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k], strides=[stride], pads=pads)],
              [("x", [1, cin, n])], ["y"], {"w": w, "b": rng.normal(0, 0.2, cout)})
    q = quantize(m, {"x": [1, cin, n]}, fmt, per_channel, act, seed=int(rng.integers(1000)))
    check(q, "conv2d")


@SETTINGS
@given(st.data(), FORMATS, ACTS, st.booleans())
def test_fully_connected(data, fmt, act, per_channel):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    n, k, o = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 40)), data.draw(st.integers(1, 12))
    gemm = data.draw(st.booleans())
    wt = rng.normal(0, 1 / np.sqrt(k), (o, k) if gemm else (k, o))
    if gemm:
        trans = True
        inits = {"w": wt, "b": rng.normal(0, 0.3, o)}
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1 if trans else 0)
    else:
        inits = {"w": wt}
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    m = model([node], [("x", [n, k])], ["y"], inits)
    q = quantize(m, {"x": [n, k]}, fmt, per_channel, act, seed=int(rng.integers(1000)))
    check(q, "fully_connected")


@SETTINGS
@given(st.data(), FORMATS, ACTS, st.sampled_from(["Add", "Mul"]))
def test_add_mul(data, fmt, act, op):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    c, h, w = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9))
    bshape = data.draw(st.sampled_from([[1, c, h, w], [1, c, 1, 1], [1, 1, h, w]]))
    m = model([helper.make_node(op, ["a", "b"], ["y"])], [("a", [1, c, h, w]), ("b", bshape)], ["y"], {})
    q = quantize(m, {"a": [1, c, h, w], "b": bshape}, fmt, False, act, seed=int(rng.integers(1000)),
                 lo=-float(rng.uniform(0.1, 3)), hi=float(rng.uniform(0.1, 3)))
    check(q, op.lower())


@pytest.mark.parametrize("op", ["Add", "Mul"])
@pytest.mark.parametrize("fmt, act", [("qdq", "s8"), ("qdq", "u8"), ("qoperator", "u8")])
def test_large_add_mul_run_through_their_pair_table(monkeypatch, op, fmt, act):
    """Same-shape byte operands of >= 16K elements run through a 256x256 table of the op's own
    recipe: bit-exact with ORT (ort), explained (native), and identical to the direct recipe."""
    from torq.runtime import ops
    shape = [1, 4, 72, 72]                                          # 20736 elements
    m = model([helper.make_node(op, ["a", "b"], ["y"])], [("a", shape), ("b", shape)], ["y"], {})
    c = check_compiled(compile(quantize(m, {"a": shape, "b": shape}, fmt, False, act, seed=3, lo=-2.0, hi=1.5)),
                       op.lower())
    feeds = random_inputs(c.model, seed=5)
    from torq.runtime import kernels
    calls = []
    lookup = kernels.pair_lookup
    monkeypatch.setattr(kernels, "pair_lookup", lambda *a: calls.append(1) or lookup(*a))
    tabled = {r: c.run(feeds, rounding=r) for r in ("native", "ort")}
    assert len(calls) == (1 if op == "Add" else 2)   # the table path really ran (native Add: a loop)
    monkeypatch.setattr(ops, "_PAIR_TABLE_MIN", 1 << 40)
    direct = {r: torq_compile(c.model).run(feeds, rounding=r) for r in ("native", "ort")}
    for r in tabled:
        for name in tabled[r]:
            np.testing.assert_array_equal(tabled[r][name], direct[r][name])


@SETTINGS
@given(st.data(), FORMATS, ACTS)
def test_pools(data, fmt, act):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    kind = data.draw(st.sampled_from(["AveragePool", "GlobalAveragePool", "MaxPool"]))
    c, h, w = data.draw(st.integers(1, 5)), data.draw(st.integers(3, 12)), data.draw(st.integers(3, 12))
    if kind == "GlobalAveragePool":
        node = helper.make_node(kind, ["x"], ["y"])
    else:
        k = data.draw(st.sampled_from([2, 3]))
        pads = [data.draw(st.integers(0, k - 1)) for _ in range(4)] if data.draw(st.booleans()) else [0] * 4
        extra = {"count_include_pad": 1} if kind == "AveragePool" else {}
        node = helper.make_node(kind, ["x"], ["y"], kernel_shape=[k, k], strides=[data.draw(st.sampled_from([1, 2]))] * 2,
                                pads=pads, **extra)
    m = model([node], [("x", [1, c, h, w])], ["y"], {})
    q = quantize(m, {"x": [1, c, h, w]}, fmt, False, act, seed=int(rng.integers(1000)))
    check(q, {"AveragePool": "avg_pool2d", "GlobalAveragePool": "avg_pool2d", "MaxPool": "maxpool2d"}[kind])


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_sigmoid_becomes_a_table(fmt):
    m = model([helper.make_node("Sigmoid", ["x"], ["y"])], [("x", [1, 4, 5, 5])], ["y"], {})
    q = quantize(m, {"x": [1, 4, 5, 5]}, fmt, lo=-4, hi=4)
    c = compile(q)
    assert c.report.unsupported == [] and c.report.lowered.get("table") == 1, c.report.lowered
    r = verify(c)
    # ORT's sigmoid uses its own exp approximation: the 256-entry table must still land within 1 LSB.
    assert all(o.max_lsb <= 1 for o in r.outputs), r.outputs


@SETTINGS
@given(st.data(), ACTS, st.booleans())
def test_reduce_mean_over_hw(data, act, keepdims):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    c, h, w = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9))
    m = model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=int(keepdims))],
              [("x", [1, c, h, w])], ["y"], {})
    q = quantize(m, {"x": [1, c, h, w]}, "qdq", False, act, seed=int(rng.integers(1000)),
                 op_types=["ReduceMean"], lo=-float(rng.uniform(0.1, 2)), hi=float(rng.uniform(0.1, 2)))
    check(q, "avg_pool2d")


@SETTINGS
@given(st.data(), FORMATS, ACTS)
def test_data_movement(data, fmt, act):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    kind = data.draw(st.sampled_from(["Concat", "Transpose", "Flatten", "Reshape"]))
    c, h, w = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5))
    shapes, inits = {"x": [1, c, h, w]}, {}
    if kind == "Concat":
        shapes["b"] = [1, data.draw(st.integers(1, 4)), h, w]
        node = helper.make_node("Concat", ["x", "b"], ["y"], axis=1)
    elif kind == "Transpose":
        node = helper.make_node("Transpose", ["x"], ["y"], perm=list(data.draw(st.permutations([0, 1, 2, 3]))))
    elif kind == "Flatten":
        node = helper.make_node("Flatten", ["x"], ["y"], axis=1)
    else:
        inits["shape"] = np.array([1, c * h, w])
        node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    m = model([node], list(shapes.items()), ["y"], {})
    for k, v in inits.items():   # int64 shape initializer
        m.graph.initializer.append(__import__("onnx").numpy_helper.from_array(v.astype(np.int64), k))
    # widely different input ranges so Concat inputs get their own scales
    q = quantize(m, shapes, fmt, False, act, seed=int(rng.integers(1000)), lo=-float(rng.uniform(0.1, 4)),
                 hi=float(rng.uniform(0.1, 4)), op_types=[kind])
    check(q, None)


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_float_io_uses_the_quantize_dequantize_fallback(fmt):
    """Without --full-integer the graph input Q and output DQ stay: bf16 act/mul/fma sequences.
    `ort` rounding reproduces ORT's QuantizeLinear/DequantizeLinear bit for bit."""
    rng = np.random.default_rng(5)
    q = quantize(conv_model(rng, 3, 4, 3, 1, 1, [1, 1, 1, 1], 1, True, True, (6, 6)), {"x": [1, 3, 6, 6]},
                 fmt, full_integer=False)
    c = compile(q)
    assert c.report.unsupported == [] and c.report.lowered.get("act") and c.report.lowered.get("fma")
    r = verify(c)
    assert all(o.exact for o in r.outputs if o.mode == "ort"), r.outputs
    from torq import reference
    x = random_inputs(q, 0)
    ref = reference.run(q, x)["y"]
    nat = c.run(x, rounding="native")["y"]
    # native: bf16 arithmetic (8-bit mantissa) in the input Q and the output DQ sequences. The DQ
    # computes q·bf16(s) + bf16(-zp·s) with ~3 bf16 roundings of values up to (128 + |zp|)·s.
    inits = {t.name: __import__("onnx").numpy_helper.to_array(t) for t in q.graph.initializer}
    dq = [n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "y"][0]
    s_y, z_y = float(inits[dq.input[1]]), int(inits[dq.input[2]])
    bound = 3 * 2.0 ** -8 * s_y * (128 + abs(z_y)) + 2 * s_y   # + 1 LSB from the bf16 input Q
    assert np.max(np.abs(nat - ref)) <= bound, (np.max(np.abs(nat - ref)), bound)


@SETTINGS
@given(st.data(), ACTS, st.sampled_from(["Relu", "Clip", None]))
def test_unfused_sum_and_clamp(data, act, clamp):
    """A legacy Sum (ORT quantizes no Sum: DQ, DQ -> float Sum -> [Relu/Clip] -> Q, run unfused in
    float by ORT): the clamp folds into the output range, and `ort` rounding follows ORT's float path."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    c, h, w = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))
    nodes = [helper.make_node("Sum", ["a", "b"], ["s" if clamp else "y"])]
    inits = {}
    if clamp == "Relu":
        nodes.append(helper.make_node("Relu", ["s"], ["y"]))
    elif clamp == "Clip":
        inits = {"lo": np.array(-0.25), "hi": np.array(float(rng.uniform(0.3, 1.5)))}
        nodes.append(helper.make_node("Clip", ["s", "lo", "hi"], ["y"]))
    m = model(nodes, [("a", [1, c, h, w]), ("b", [1, c, h, w])], ["y"], inits)
    q = quantize(m, {"a": [1, c, h, w], "b": [1, c, h, w]}, "qdq", False, act, seed=int(rng.integers(1000)),
                 op_types=["Relu", "Clip", "Conv"] if clamp else ["Sum"], lo=-float(rng.uniform(0.5, 2)),
                 hi=float(rng.uniform(0.5, 2)))
    check(q, "add")
