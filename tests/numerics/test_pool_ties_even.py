"""Average pools round real ties to even (the ACT's NTE mode) where the rescale is exact: with
ORT's usual ys = xs and a 2×2 window a quarter of the outputs are exact x.5 ties, which ORT
rounds to even and NTP (round half up) rounded the other way half the time."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import torq
from torq import numerics as nx
from torq.verify import verify

from .test_kernels_vs_ort import run_ort


def test_nte_shift():
    t = np.array([5, 6, 7, 10, 14, -6, -10, 9], np.int64)       # /4: 1.25 1.5 1.75 2.5 3.5 -1.5 -2.5 2.25
    assert nx.nte_shift(t.copy(), 2).tolist() == [1, 2, 2, 2, 4, -2, -2, 2]
    assert nx.ntp_shift(t.copy(), 2).tolist() == [1, 2, 2, 3, 4, -1, -2, 2]
    assert nx.nte_shift(t.copy(), 0).tolist() == t.tolist()
    assert nx.nte_shift(t.copy(), np.array([0, 1, 2, 2, 2, 2, 2, 2])).tolist() == [5, 3, 2, 2, 4, -2, -2, 2]


@settings(max_examples=60, deadline=None)
@given(xt=st.sampled_from([np.int8, np.uint8]), k=st.sampled_from([(2, 2), (2, 1), (4, 4), (3, 3)]),
       exp=st.integers(-9, -1), seed=st.integers(0, 2 ** 32 - 1), global_pool=st.booleans())
def test_dyadic_scale_pools_are_bit_exact_with_ort(xt, k, exp, seed, global_pool):
    """xs = ys a power of two: ORT's float arithmetic is exact, so NTE gives ORT's numbers."""
    rng = np.random.default_rng(seed)
    lo, hi = np.iinfo(xt).min, np.iinfo(xt).max
    H, W = (k if global_pool else (k[0] * 8, k[1] * 8))
    x = rng.integers(lo, hi + 1, (2, 3, H, W)).astype(xt)
    xs = np.float32(2.0 ** exp)
    xz, yz = xt(rng.integers(lo, hi + 1)), xt(rng.integers(lo, hi + 1))
    node = helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft",
                            kernel_shape=list(k), strides=list(k))
    (y,) = run_ort([node], {"x": x}, dict(xs=xs, xz=xz, ys=xs, yz=yz), {"y": xt})
    sums, counts = torq.runtime.kernels.pool_sum(x, k, k, (0, 0, 0, 0), False, int(xz))
    args = (sums, counts, xs, xs, int(yz), int(lo), int(hi))
    nte = nx.avgpool_native(*args, ties_even=True, zp_before_rounding=not global_pool)
    np.testing.assert_array_equal(nte, y.astype(np.int64))
    ntp = nx.avgpool_native(*args)
    n = k[0] * k[1]
    unclipped = np.count_nonzero((y > lo) & (y < hi))   # random zero points can clip every output
    if n % 2 == 0 and n <= 4 and not global_pool and unclipped > y.size // 2:
        assert np.count_nonzero(ntp != y) > 0           # many ties: NTP really differs (the test decides)


def test_zero_point_that_does_not_fold_keeps_ntp():
    """ys = 3·xs: a window of 4 gives the scale 1/12, not dyadic: NTP, as before."""
    sums = np.arange(-40, 40).reshape(1, 1, 8, 10)
    a = nx.avgpool_native(sums, 4, np.float32(0.3), np.float32(0.9), 3, -128, 127)
    b = nx.avgpool_native(sums, 4, np.float32(0.3), np.float32(0.9), 3, -128, 127, ties_even=True,
                          zp_before_rounding=True)
    np.testing.assert_array_equal(a, b)


def _conv_avgpool_model(rng):
    from qmodels import model
    w = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    return model(nodes, [("x", [1, 3, 16, 16])], ["y"], {"w": w})


@pytest.fixture(scope="module")
def compiled_pool():
    from qmodels import quantize
    q = quantize(_conv_avgpool_model(np.random.default_rng(4)), {"x": [1, 3, 16, 16]}, "qdq")
    return torq.compile(q)


def test_compiled_avgpool_is_closer_to_ort(compiled_pool):
    res = verify(compiled_pool, modes=("native", "ort"))
    assert res.ok
    pool = next(od for od in res.op_diffs if od.op == "torq_hl.avg_pool2d" and od.mode == "native")
    # quantize_static gives the pool ys = xs (not dyadic): NTE removes the ties ORT rounds to
    # even; what is left are ORT's float32 summation errors near .5
    assert pool.differ < 0.1 * pool.size


def test_fault_rounding_ties_up_again_fails_the_nte_expectation(compiled_pool, monkeypatch):
    """Injected fault: NTE replaced by NTP (round half up) — many more native-vs-ORT differences."""
    res_ok = verify(compiled_pool, modes=("native",))
    ok = next(od for od in res_ok.op_diffs if od.op == "torq_hl.avg_pool2d")
    monkeypatch.setattr(nx.native, "nte_shift", nx.native.ntp_shift)
    res = verify(compiled_pool, modes=("native",))
    bad = next(od for od in res.op_diffs if od.op == "torq_hl.avg_pool2d")
    assert bad.differ > 2 * max(ok.differ, 1)
