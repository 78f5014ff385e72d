"""Conv3D (seed §4.7) on the NSS: torq_hl.conv2d over a depth-folded input, on random configs
against real ONNX Runtime -- ``ort`` rounding bit-exact, ``native`` within explained ±1 LSB."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from qmodels import model, quantize

from .test_lowering_props import ACTS, FORMATS, SETTINGS, check


def conv3d_model(rng, cin, cout, k, stride, dilation, pads, dhw, bias=True, group=1):
    w = rng.normal(0, 1.0 / np.sqrt(cin // group * int(np.prod(k))), (cout, cin // group, *k))
    inits, ins = {"w": w}, ["x", "w"]
    if bias:
        inits["b"] = rng.normal(0, 0.2, cout)
        ins.append("b")
    node = helper.make_node("Conv", ins, ["y"], kernel_shape=list(k), strides=list(stride),
                            dilations=list(dilation), pads=list(pads), group=group)
    return model([node], [("x", [1, cin, *dhw])], ["y"], inits)


@SETTINGS
@given(st.data(), FORMATS, ACTS, st.booleans())
def test_conv3d(data, fmt, act, per_channel):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    cin, cout = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 5))
    k = [data.draw(st.sampled_from([1, 2, 3])) for _ in range(3)]
    stride = [data.draw(st.sampled_from([1, 2])) for _ in range(3)]
    dilation = [data.draw(st.sampled_from([1, 2])) for _ in range(3)]
    pads = [data.draw(st.integers(0, 2)) for _ in range(6)]
    dhw = [data.draw(st.integers(d * (kk - 1) + 1, d * (kk - 1) + 6)) for kk, d in zip(k, dilation)]
    m = conv3d_model(rng, cin, cout, k, stride, dilation, pads, dhw, bias=data.draw(st.booleans()))
    q = quantize(m, {"x": [1, cin, *dhw]}, fmt, per_channel, act, seed=int(rng.integers(1000)),
                 lo=-float(rng.uniform(0.1, 2)), hi=float(rng.uniform(0.1, 3)))
    c = check(q, "conv2d")
    assert "conv_3d" not in c.ir("torq_hl")


def test_grouped_conv3d_is_an_error_not_a_wrong_result():
    """torch-mlir cannot lower a grouped quantized Conv3D: a one-line error naming the op."""
    import pytest
    import torq
    from torq.errors import TorqError
    rng = np.random.default_rng(0)
    m = conv3d_model(rng, 4, 4, (3, 3, 3), (1, 1, 1), (1, 1, 1), [1] * 6, (4, 5, 5), group=2)
    with pytest.raises(TorqError, match="convolution"):
        torq.compile(quantize(m, {"x": [1, 4, 4, 5, 5]})).run({"x": np.zeros((1, 4, 4, 5, 5), np.int8)})
