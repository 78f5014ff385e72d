"""Property tests for what real exports bring: TF-"same" Pads (reading the graph input, with an
explicit constant value that ORT quantizes, before a Conv / pool / nothing), and BatchNorm-folded
"dust" channels in per-channel convs. `ort` rounding bit-exact with ORT, nothing refused."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from qmodels import model, quantize

from .test_lowering_props import check

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def pad_model(rng, c, h, w, pads, value, after):
    """x -> Pad(pads, value) -> [Conv 3x3 | MaxPool 2x2 | AveragePool 2x2 | nothing] -> y."""
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads")]
    ins = ["x", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "pv"))
        ins.append("pv")
    nodes = [helper.make_node("Pad", ins, ["p" if after else "y"], mode="constant")]
    if after == "Conv":
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (4, c, 3, 3)).astype(np.float32), "w"))
        nodes.append(helper.make_node("Conv", ["p", "w"], ["y"], kernel_shape=[3, 3], strides=[2, 2]))
    elif after:
        nodes.append(helper.make_node(after, ["p"], ["y"], kernel_shape=[2, 2], strides=[2, 2]))
    return model(nodes, [("x", [1, c, h, w])], ["y"], inits)


@SETTINGS
@given(st.data(), st.sampled_from(["qdq", "qoperator"]), st.sampled_from(["s8", "u8"]), st.booleans())
def test_pad(data, fmt, act, full_integer):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    after = data.draw(st.sampled_from(["Conv", "MaxPool", "AveragePool", None]))
    c, h, w = data.draw(st.integers(1, 4)), data.draw(st.integers(3, 8)), data.draw(st.integers(3, 8))
    hw = [data.draw(st.integers(0, 2)) for _ in range(4)]          # top, left, bottom, right
    pads = [0, 0, hw[0], hw[1], 0, 0, hw[2], hw[3]]
    if after is None and data.draw(st.booleans()):                   # channel padding too
        pads[1], pads[5] = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
    value = data.draw(st.sampled_from([None, 0.0, 0.5, -1.0])) if after in (None, "MaxPool") else \
        data.draw(st.sampled_from([None, 0.0]))
    m = pad_model(rng, c, h, w, pads, value, after)
    q = quantize(m, {"x": [1, c, h, w]}, fmt, data.draw(st.booleans()), act, seed=int(rng.integers(1000)),
                 lo=-float(rng.uniform(0.1, 2)), hi=float(rng.uniform(0.1, 3)), full_integer=full_integer)
    check(q, None)


def dust_conv_model(rng, cin, cout, k, dust, depthwise, xs):
    """A BN-folded conv: some output channels' weights are dust (1e-9..1e-5 of the layer's) with a
    bias about ±1. ORT then widens their weight scale until the int32 bias fits (its bias lands
    2**31 − 2**17.7 from the limit) and the dust becomes int8 weights of 1..127 (``t``)."""
    group = cin if depthwise else 1
    cout = cin if depthwise else cout
    w = rng.normal(0, 1 / np.sqrt(cin // group * k * k), (cout, cin // group, k, k))
    b = rng.normal(0, 0.2, cout)
    for ch, t in dust:
        b[ch % cout] = rng.choice([-1, 1]) * rng.uniform(0.5, 2)
        d = rng.normal(0, 1, w[ch % cout].shape)
        w[ch % cout] = d / np.abs(d).max() * t * abs(b[ch % cout]) / (2**31 * xs)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], pads=[k // 2] * 4, group=group)
    return model([node], [("x", [1, cin, 6, 6])], ["y"], {"w": w, "b": b}), cout


@SETTINGS
@given(st.data(), st.sampled_from(["qdq", "qoperator"]), st.sampled_from(["s8", "u8"]))
def test_dust_channels_lower_exactly(data, fmt, act):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    depthwise = data.draw(st.booleans())
    cin, k = data.draw(st.integers(1, 6) if depthwise else st.integers(4, 24)), data.draw(st.sampled_from([1, 3]))
    dust = data.draw(st.lists(st.tuples(st.integers(0, 5), st.floats(0.3, 127)), min_size=1, max_size=3))
    lo, hi = -float(rng.uniform(0.1, 2)), float(rng.uniform(0.1, 3))
    m, cout = dust_conv_model(rng, cin, data.draw(st.integers(2, 6)), k, dust, depthwise, (hi - lo) / 255)
    q = quantize(m, {"x": [1, cin, 6, 6]}, fmt, True, act, seed=int(rng.integers(1000)), lo=lo, hi=hi)
    check(q, "depthwise_conv2d" if depthwise and cin > 1 else "conv2d")
