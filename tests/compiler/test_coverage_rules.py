"""Property tests for the zoo-coverage lowerings, against real ONNX Runtime.

Each model is Conv -> <construct> -> 1x1 Conv, so ORT quantizes the construct's input and output
(a construct at the graph output would be left in float). `ort` rounding must be bit-exact with
ORT; `native` may differ only by explained ±1 LSB ties (check_compiled).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from onnx import helper

from qmodels import model, quantize
from torq.compiler import compile as torq_compile
from torq.verify import verify
from torq.graph.unshare_weights import fold_constant_identities

SETTINGS = settings(max_examples=5, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check_compiled(c, expect: str | None, seeds=(0, 1)):
    """Everything lowered (`expect` among it); ort bit-exact, native differences explained."""
    assert c.report.unsupported == [], [str(u) for u in c.report.unsupported]
    assert expect is None or c.report.lowered.get(expect, 0) >= 1, c.report.lowered
    for seed in seeds:
        r = verify(c, seed=seed)
        assert all(o.exact for o in r.outputs if o.mode == "ort"), r.outputs
        assert all(od.explained for od in r.op_diffs), [od for od in r.op_diffs if not od.explained]
    return c


def _sandwich(rng, c, hw, nodes, inits, out_c=None):
    """x -> Conv3x3 -> nodes (reading "c0", writing "z") -> Conv1x1 -> y."""
    out_c = out_c or c
    inits = {"w0": rng.normal(0, 0.3, (c, 3, 3, 3)), "b0": rng.normal(0, 0.1, c),
             "wt": rng.normal(0, 0.3, (out_c, out_c, 1, 1)), **inits}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]), *nodes,
             helper.make_node("Conv", ["z", "wt"], ["y"])]
    return model(nodes, [("x", [1, 3, hw, hw])], ["y"], inits)


def _check(m, hw, fmt, per_channel, expect, seed):
    q = quantize(m, {"x": [1, 3, hw, hw]}, fmt, per_channel, seed=seed, lo=-2.0, hi=2.0)
    return check_compiled(torq_compile(q), expect)


def _elementwise(kind):
    """One-input elementwise constructs ORT runs in float between a DQ and a Q."""
    n = helper.make_node
    return {
        "hardswish": ([n("HardSwish", ["c0"], ["z"])], {}),
        "silu": ([n("Sigmoid", ["c0"], ["s"]), n("Mul", ["c0", "s"], ["z"])], {}),
        "gelu": ([n("Div", ["c0", "sq2"], ["d"]), n("Erf", ["d"], ["e"]), n("Add", ["e", "one"], ["e1"]),
                  n("Mul", ["c0", "e1"], ["m"]), n("Mul", ["m", "half"], ["z"])],
                 {"sq2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}),
        "add_scalar": ([n("Add", ["c0", "k"], ["z"])], {"k": np.float32(1.0)}),
        "mul_scalar": ([n("Mul", ["c0", "k"], ["z"])], {"k": np.float32(0.5)}),
    }[kind]


@SETTINGS
@given(st.data(), st.sampled_from(["hardswish", "silu", "gelu", "add_scalar", "mul_scalar"]),
       st.sampled_from(["qdq", "qoperator"]), st.booleans())
def test_elementwise_chains(data, kind, fmt, per_channel):
    """HardSwish, SiLU, GELU (erf), x+1, x·0.5: tables, adds or muls; nothing left in linalg."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    c, hw = data.draw(st.integers(1, 6)), data.draw(st.integers(3, 8))
    nodes, inits = _elementwise(kind)
    _check(_sandwich(rng, c, hw, nodes, inits), hw, fmt, per_channel, None, int(rng.integers(1000)))


@SETTINGS
@given(st.data(), st.sampled_from(["Mul", "Add"]), st.sampled_from(["qdq", "qoperator"]), st.booleans())
def test_per_channel_constant_operand(data, op, fmt, per_channel):
    """Mul / Add by a (1, C, 1, 1) constant: torq_hl.mul / add with the int8 constant as operand."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    c, hw = data.draw(st.integers(2, 6)), data.draw(st.integers(3, 8))
    k = rng.uniform(0.3, 2, (1, c, 1, 1)) * rng.choice([-1, 1], (1, c, 1, 1))
    m = _sandwich(rng, c, hw, [helper.make_node(op, ["c0", "k"], ["z"])], {"k": k})
    _check(m, hw, fmt, per_channel, op.lower(), int(rng.integers(1000)))


@SETTINGS
@given(st.data(), st.booleans())
def test_standalone_batchnorm(data, per_channel):
    """A BatchNormalization no Conv precedes (DenseNet: after a Concat) -> per-channel table,
    bit-exact in ort mode because the table follows ORT's own float BN formula."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    c, hw = data.draw(st.integers(2, 6)), data.draw(st.integers(3, 8))
    n = helper.make_node
    nodes = [n("Concat", ["c0", "c0"], ["cc"], axis=1),
             n("BatchNormalization", ["cc", "bs", "bb", "bm", "bv"], ["z"])]
    inits = {"bs": rng.uniform(0.5, 2, 2 * c), "bb": rng.normal(0, 0.3, 2 * c),
             "bm": rng.normal(0, 0.3, 2 * c), "bv": rng.uniform(0.3, 2, 2 * c)}
    c_out = _check(_sandwich(rng, c, hw, nodes, inits, out_c=2 * c), hw, "qdq", per_channel, "table",
                   int(rng.integers(1000)))
    assert any("table = array<i64: " in ln and ln.count(",") >= 2 * c * 256 - 1
               for ln in c_out.ir("torq_hl").splitlines()), "expected one 256-entry table per channel"


@SETTINGS
@given(st.data(), st.sampled_from(["qdq", "qoperator"]))
def test_maxpool_ceil_mode(data, fmt):
    """MaxPool ceil_mode=1 without padding (SqueezeNet, GoogLeNet): the NSS output has the ONNX
    (ceil) shape. Windows ORT drops (starting past the input + leading pad) and padded pools:
    tests/compiler/frontend/test_pool_ceil.py (compiler/frontend/pool_ceil.py)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    c, hw = data.draw(st.integers(1, 4)), data.draw(st.integers(4, 11))
    k, s = data.draw(st.sampled_from([2, 3])), data.draw(st.sampled_from([2, 3]))
    assume((-(-(hw - k) // s)) * s < hw)
    m = _sandwich(rng, c, hw, [helper.make_node("MaxPool", ["c0"], ["z"], kernel_shape=[k, k], strides=[s, s],
                                                ceil_mode=1)], {})
    _check(m, hw, fmt, False, "maxpool2d", int(rng.integers(1000)))


def test_identity_shared_weights_are_folded_before_quantizing():
    """The torch exporter shares equal weights through Identity; ORT's QOperator quantizer
    crashed on them ('NoneType' object has no attribute 'data_type')."""
    import onnx

    import torq
    rng = np.random.default_rng(0)
    n = helper.make_node
    m = model([n("Identity", ["b"], ["b2"]), n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
               n("Conv", ["c", "w2", "b2"], ["y"])], [("x", [1, 4, 6, 6])], ["y"],
              {"w": rng.normal(0, 0.3, (4, 4, 3, 3)), "w2": rng.normal(0, 0.3, (4, 4, 1, 1)), "b": np.zeros(4)})
    folded = fold_constant_identities(m)
    assert [x.op_type for x in folded.graph.node] == ["Conv", "Conv"]
    assert [x.op_type for x in m.graph.node][0] == "Identity"          # the input is never modified
    onnx.checker.check_model(folded, full_check=True)
    for fmt, pc in (("qoperator", False), ("qdq", True)):
        q = torq.quantize(m, quant_format=fmt, per_channel=pc, num_calib=2)
        c = torq_compile(q)
        assert not c.report.unsupported, c.report.unsupported


@SETTINGS
@given(st.data(), st.sampled_from(["qdq", "qoperator"]))
def test_avgpool_count_include_pad_0(data, fmt):
    """AveragePool count_include_pad=0 with padding: torch-mlir divides by per-position counts it
    builds with linalg.index (an internal error before); read, checked, lowered with per-position
    divisors."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    c, hw = data.draw(st.integers(1, 4)), data.draw(st.integers(3, 9))
    k, s = data.draw(st.sampled_from([2, 3])), data.draw(st.sampled_from([1, 2]))
    p = data.draw(st.integers(1, k - 1))
    m = _sandwich(rng, c, hw, [helper.make_node("AveragePool", ["c0"], ["z"], kernel_shape=[k, k], strides=[s, s],
                                                pads=[p, p, p, p], count_include_pad=0)], {})
    _check(m, hw, fmt, False, "avg_pool2d", int(rng.integers(1000)))


@pytest.mark.parametrize("value", [np.float32(0.0), np.float32(3.0)])
def test_scalar_constant_keeps_rank_zero(value):
    """A rank-0 constant folds to a rank-0 array (np.ascontiguousarray made it (1,): 'rank mismatch')."""
    rng = np.random.default_rng(1)
    m = _sandwich(rng, 2, 4, [helper.make_node("Add", ["c0", "k"], ["z"])], {"k": value})
    _check(m, 4, "qdq", False, None, 0)


def _conv_relu_conv(rng, batch, bias):
    n = helper.make_node
    return model([n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
                  n("Conv", ["r", "w2"], ["y"])], [("x", [batch, 3, 6, 6])], ["y"],
                 {"w": rng.normal(0, 0.3, (4, 3, 3, 3)), "b": np.full(4, bias), "w2": rng.normal(0, 0.3, (4, 4, 1, 1))})


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_dynamic_batch_is_compiled_for_batch_one(fmt):
    """A model quantized with a dynamic batch ('N') compiles for batch 1 (compiler/frontend/specialise.py);
    it failed with 'negative dimensions are not allowed'."""
    import torq
    m = _conv_relu_conv(np.random.default_rng(0), "N", 0.1)
    q = torq.quantize(m, quant_format=fmt, full_integer=fmt == "qdq", num_calib=2)
    assert q.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    check_compiled(torq_compile(q), "conv2d")


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_activation_scale_exactly_one(fmt):
    """An all-zero activation (Relu of a very negative Conv) gets scale 1.0; MLIR folds x/1.0 and
    x*1.0 away, and the Q/DQ readers must still see a quantize/dequantize."""
    import torq
    q = torq.quantize(_conv_relu_conv(np.random.default_rng(1), 1, -100.0), quant_format=fmt,
                      full_integer=fmt == "qdq", num_calib=2)
    assert any(np.asarray(onnx_numpy(t)).item() == 1.0 for t in q.graph.initializer
               if t.name.endswith("scale") and not t.dims)
    check_compiled(torq_compile(q), "conv2d")


def onnx_numpy(t):
    from onnx import numpy_helper
    return numpy_helper.to_array(t)


@SETTINGS
@given(st.data(), st.sampled_from(["qdq", "qoperator"]), st.booleans())
def test_rank3_and_rank4_matmul_by_weight(data, fmt, per_channel):
    """MatMul of a [B, M, K] or [1, H, W, K] activation by a [K, N] weight (ConvNeXt / ViT linear
    layers): torch-mlir left QLinearMatMul's aten.bmm illegal; now collapse -> fully_connected -> expand."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    lead = [data.draw(st.integers(1, 3)) for _ in range(data.draw(st.sampled_from([2, 3])))]
    k, n = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 8))
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [*lead, k])], ["y"],
              {"w": rng.normal(0, 1 / np.sqrt(k), (k, n))})
    q = quantize(m, {"x": [*lead, k]}, fmt, per_channel, seed=int(rng.integers(1000)))
    check_compiled(torq_compile(q), "fully_connected")


def test_pool_of_a_float_op_is_a_reason_not_an_internal_error():
    """QOperator leaves HardSwish in float, so the squeeze-excite GlobalAveragePool reads a float
    op (MobileNetV3): the pool rule's failure must stay a reason (it raised a TypeError)."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    m = _sandwich(rng, 4, 6, [n("HardSwish", ["c0"], ["h"]), n("GlobalAveragePool", ["h"], ["g"]),
                              n("Mul", ["c0", "g"], ["z"])], {})
    c = torq_compile(quantize(m, {"x": [1, 3, 6, 6]}, "qoperator", False, full_integer=False))
    assert all("not supported on NSS" in str(u) for u in c.report.unsupported)
