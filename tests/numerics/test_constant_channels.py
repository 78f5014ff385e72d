"""Output channels whose weights are all zero (pruned or dead channels) do not choose the shared
shift of a per-channel rescale: ORT gives them weight scale 1.0, thousands of times the live
channels' scales, which used to leave every live multiplier 10-15 bits short."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

import torq
from torq import numerics as nx
from torq.verify import verify


def _want(acc, scale, zp, lo, hi):
    return min(max(math.floor(Fraction(acc) * Fraction(scale) + Fraction(1, 2)) + zp, lo), hi)


def _act(a, m, shift, zp, lo, hi):
    return int(nx.act_native(np.array([a]), m, shift, zp, lo, hi, axis=0)[0])


@settings(max_examples=300, deadline=None)
@given(acc=st.integers(-2**31, 2**31 - 1), scale=st.floats(0, 1e4),
       shift=st.sampled_from(range(0, 61, 4)), zp=st.integers(-128, 127), relu=st.booleans())
def test_constant_channel_gives_the_exact_constant(acc, scale, shift, zp, relu):
    lo, hi = (zp if relu else -128), 127
    solved = nx.constant_channel(acc, scale, shift, zp, lo, hi)
    usual = nx.llround(math.ldexp(scale, shift))
    if usual <= nx.INT32_MAX and _want(acc, Fraction(usual, 2 ** shift), zp, lo, hi) == _want(acc, scale, zp, lo, hi):
        assert solved == (0, usual)       # nothing to solve: the ordinary multiplier
    if abs(acc * scale) <= 256 and 28 <= shift <= 52:
        assert solved is not None         # room for acc·2**k and a multiplier: always solvable
    if solved is None:
        return
    k, m = solved
    assert 0 <= m <= nx.INT32_MAX and nx.INT32_MIN <= acc << k <= nx.INT32_MAX
    assert _act(acc << k, m, shift, zp, lo, hi) == _want(acc, scale, zp, lo, hi)


def test_constant_channel_cases():
    assert nx.constant_channel(0, 20.0, 36, 5, -128, 127) == (0, 0)      # llround(20·2**36) > int32
    assert nx.constant_channel(-500, 20.0, 36, -128, -128, 127) == (0, 0)  # ReLU: clamps to lo
    # saturating constant (1000·20 >> 127): a multiplier below llround(20·2**28) still saturates
    k, m = nx.constant_channel(1000, 20.0, 28, 0, -128, 127)
    assert k == 0 and m < 20 * 2 ** 28 and _act(1000, m, 28, 0, -128, 127) == 127
    # 3·20 = 60 exactly: needs 60·2**36/3 > int32 as multiplier, so the bias becomes 3·2**k
    k, m = nx.constant_channel(3, 20.0, 36, 0, -128, 127)
    assert k > 0 and _act(3 << k, m, 36, 0, -128, 127) == 60
    assert nx.constant_channel(2 ** 30, 3.0 / 2 ** 30, 60, 0, -128, 127) is None   # 2**30·2**k leaves int32


def test_conv_rescale_ignores_constant_channels_for_the_shift():
    live = np.array([0.011, 0.004, 0.02, 0.0007], np.float32)
    dq = np.concatenate([live, [np.float32(0.3)]]).astype(np.float32)   # channel 4: zero weights
    ys = np.float32(0.015)
    old_mults, old_shift = nx.conv_rescale(dq, ys)
    live_mults, live_shift = nx.conv_rescale(live, ys)
    mask = [False] * 4 + [True]
    for b, zp in ((-70, -128), (3, 0), (0, 0)):
        mults, shift, bias, dq2 = nx.conv_rescale_constant_channels(dq, ys, [5, 6, 7, 8, b], mask, zp, -128, 127)
        assert shift == live_shift > old_shift and mults[:4].tolist() == live_mults.tolist()
        assert bias[:4].tolist() == [5, 6, 7, 8] and dq2[:4].tolist() == live.tolist()
        k = int(round(math.log2(b / bias[4]))) if b else 0
        assert bias[4] == b << -k if b else bias[4] == 0
        assert dq2[4] == np.ldexp(dq[4], k)     # ORT's recipe sees the same product acc·dq
        assert _act(bias[4], mults[4], shift, zp, -128, 127) == _want(b, float(dq[4]) / float(ys), zp, -128, 127)
    # per-tensor scale: nothing to do
    m1, s1, b1, d1 = nx.conv_rescale_constant_channels(np.float32(0.01), ys, [1, 2], [True, False], 0, -128, 127)
    assert (m1.tolist(), s1) == (nx.conv_rescale(np.float32(0.01), ys)[0].tolist(), nx.conv_rescale(np.float32(0.01), ys)[1])


def _conv_with_zero_channels(dead, bias_dead):
    from qmodels import conv_model, quantize
    rng = np.random.default_rng(7)
    m = conv_model(rng, 4, 8, 3, 1, 1, [1, 1, 1, 1], 1, True, False, (9, 9))
    inits = {t.name: t for t in m.graph.initializer}
    w, b = numpy_helper.to_array(inits["w"]).copy(), numpy_helper.to_array(inits["b"]).copy()
    w[dead] = 0.0
    b[dead] = bias_dead
    inits["w"].CopyFrom(numpy_helper.from_array(w.astype(np.float32), "w"))
    inits["b"].CopyFrom(numpy_helper.from_array(b.astype(np.float32), "b"))
    return quantize(m, {"x": [1, 4, 9, 9]}, "qdq", per_channel=True)


def _compiled_rescale(compiled):
    from torq.compiler import importer, torq_hl
    from torq.compiler.lowering import func_ops
    module = importer.parse(compiled.ir("torq_hl"))
    with module.context:
        (op,) = [o for o in func_ops(module) if o.name == "torq_hl.conv2d"]
        sb = np.array(op.operands[2].owner.attributes["value"]).astype(np.int64)
        return sb[1::2], torq_hl.op_attrs(op)["shift_factor"]


@pytest.mark.parametrize("bias_dead", [0.0, -0.4, 0.5])
def test_zero_weight_channels_keep_live_precision_and_stay_exact(bias_dead):
    dead = [2, 5]
    q = _conv_with_zero_channels(dead, bias_dead)
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    ws = next(v for k, v in inits.items() if v.ndim == 1 and v.size == 8 and v.dtype == np.float32
              and np.all(v[dead] == 1.0))        # ORT's weight scale 1.0 for an all-zero channel
    assert np.all(ws[[c for c in range(8) if c not in dead]] < 0.1)
    compiled = torq.compile(q)
    mults, shift = _compiled_rescale(compiled)
    live = np.delete(np.arange(8), dead)
    assert mults[live].min() >= 2 ** 24          # ≥ 24 significant bits on every live channel
    res = verify(compiled, modes=("native", "ort"))
    assert res.ok, res.op_diffs
    assert next(o for o in res.outputs if o.mode == "ort").exact
    x = {"x": np.random.default_rng(3).integers(-128, 128, (1, 4, 9, 9), dtype=np.int8)}
    from qmodels import run
    ref = run(q, x)["y"]
    nat = compiled.run(x, "native")["y"]
    assert np.array_equal(nat[:, dead], ref[:, dead])   # the constant channels: exactly ORT's
    assert np.abs(nat.astype(int) - ref.astype(int)).max() <= 1


def test_wrong_constant_channel_multiplier_fails_verify(monkeypatch):
    """Injected fault: a wrong multiplier on the constant channels."""
    orig = nx.constant_channel

    def wrong(acc, scale, shift, zp, lo, hi):       # multiplier 1/8 too large: ~4 LSB off
        k, m = orig(acc, scale, shift, zp, lo, hi)
        return k, m + m // 8
    monkeypatch.setattr(nx.native, "constant_channel", wrong)
    compiled = torq.compile(_conv_with_zero_channels([2, 5], 0.5))
    res = verify(compiled, modes=("native",))
    assert not res.ok


def test_fully_connected_zero_columns_keep_live_precision_and_stay_exact():
    from onnx import helper
    from qmodels import model, quantize, run
    rng = np.random.default_rng(11)
    w = rng.normal(0, 0.3, (6, 16)).astype(np.float32)
    b = rng.normal(0, 0.2, 6).astype(np.float32)
    w[[1, 4]] = 0.0
    b[4] = 0.0
    m = model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], [("x", [2, 16])], ["y"],
              {"w": w, "b": b})
    q = quantize(m, {"x": [2, 16]}, "qdq", per_channel=True)
    compiled = torq.compile(q)
    from torq.compiler import importer, torq_hl
    from torq.compiler.lowering import func_ops
    module = importer.parse(compiled.ir("torq_hl"))
    with module.context:
        (op,) = [o for o in func_ops(module) if o.name == "torq_hl.fully_connected"]
        sb = np.array(op.operands[2].owner.attributes["value"]).astype(np.int64)
    assert sb[1::2][[0, 2, 3, 5]].min() >= 2 ** 24
    res = verify(compiled, modes=("native", "ort"))
    assert res.ok and next(o for o in res.outputs if o.mode == "ort").exact
    x = {"x": rng.integers(-128, 128, (2, 16), dtype=np.int8)}
    ref, nat = run(q, x)["y"], compiled.run(x, "native")["y"]
    assert np.array_equal(nat[:, [1, 4]], ref[:, [1, 4]])
    assert np.abs(nat.astype(int) - ref.astype(int)).max() <= 1
