"""`exact_scales` rounds the shared scale of windowed average pools (`quantize.exact_pools`) so that
ORT's float pool is exact: the NSS's round-half-to-even pool then gives ORT's integers, ties too."""
from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import torq
from torq.quantize.exact_scales import exact_scales
from torq.verify import verify


def _conv_pool_conv(seed: int, kernel) -> onnx.ModelProto:
    from qmodels import model
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["c1"], ["p"], kernel_shape=list(kernel), strides=list(kernel)),
             helper.make_node("Conv", ["p", "w2", "b2"], ["y"], pads=[1, 1, 1, 1])]
    return model(nodes, [("x", [1, 3, 16, 16])], ["y"], {
        "w1": rng.normal(0, 0.4, (8, 3, 3, 3)), "b1": rng.normal(0, 0.2, 8),
        "w2": rng.normal(0, 0.4, (4, 8, 3, 3)), "b2": rng.normal(0, 0.2, 4)})


def _pool_diffs(compiled, seeds=(0, 1)) -> int:
    n = 0
    for s in seeds:
        res = verify(compiled, seed=s, modes=("native", "ort"))
        assert res.ok
        n += sum(od.differ for od in res.op_diffs if od.op == "torq_hl.avg_pool2d" and od.mode == "native")
    return n


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10 ** 6), st.booleans(), st.sampled_from([(2, 2), (4, 4), (2, 1)]), st.sampled_from(["s8", "u8"]))
def test_pool_native_bit_exact(seed, per_channel, kernel, act):
    """QDQ (ORT's quantizer shares the pool's input and output scale; its QOperator pools get an
    output scale of their own, which no small move makes exact: left alone)."""
    from qmodels import quantize
    q = quantize(_conv_pool_conv(seed, kernel), {"x": [1, 3, 16, 16]}, "qdq", per_channel=per_channel, seed=seed,
                 act=act)
    qe = exact_scales(q)
    a, b = ({t.name: numpy_helper.to_array(t) for t in m.graph.initializer} for m in (q, qe))
    s_old, s_new = float(a["c1_scale"]), float(b["c1_scale"])
    bits = 16 - int(np.log2(kernel[0] * kernel[1]))      # 16 - log2(count) significant bits
    assert abs(s_new / s_old - 1) <= 2.0 ** -bits
    mant = np.frexp(np.float64(s_new))[0] * 2.0 ** bits
    assert mant == np.floor(mant)
    compiled = torq.compile(qe)
    assert _pool_diffs(compiled) == 0
    res = verify(compiled, modes=("native", "ort"))
    assert all(o.exact for o in res.outputs), res.outputs


def test_without_the_pass_ties_differ():
    """The same 2x2 model without the activation passes: ORT's float sum breaks some exact ties the
    other way (the pool differs from the NSS on a few outputs); with them, none."""
    from qmodels import quantize
    q = quantize(_conv_pool_conv(4, (2, 2)), {"x": [1, 3, 16, 16]}, "qdq", per_channel=True, seed=4)
    assert _pool_diffs(torq.compile(exact_scales(q, activations=False)), seeds=range(4)) > 0
    assert _pool_diffs(torq.compile(exact_scales(q)), seeds=range(4)) == 0
