"""The compiled depthwise loop and the one-BLAS-thread GEMMs against a plain int64 formula."""
import numpy as np
import pytest

from qmodels import depthwise_ref
from torq.runtime.kernels import ConvPlan, blas, fc_acc


@pytest.mark.parametrize("N,C,H,K,s,d,m,pads,xdt,wbits", [
    (2, 8, 13, 3, 1, 1, 1, (1, 1, 1, 1), np.int8, 8),        # float32 path
    (1, 6, 11, 5, 2, 1, 2, (2, 1, 2, 0), np.uint8, 8),       # stride 2, channel multiplier 2
    (3, 4, 9, 3, 1, 2, 1, (2, 2, 2, 2), np.int16, 16),       # dilation, float64 path
    (1, 3, 7, 3, 2, 2, 3, (0, 0, 0, 0), np.int16, 16),
])
def test_depthwise_loop_exact(N, C, H, K, s, d, m, pads, xdt, wbits):
    rng = np.random.default_rng(H * K + m)
    info = np.iinfo(xdt)
    x = rng.integers(info.min, info.max, (N, C, H, H + 1), endpoint=True).astype(xdt)
    w = rng.integers(-(1 << (wbits - 1)) + 1, 1 << (wbits - 1), (C * m, 1, K, K))
    w[0, 0, 0, 0] = 0                                      # a skipped zero tap
    pv = int(x.flat[0])
    got = ConvPlan(w, None, pads, pv, s, d, C)(x)
    assert np.array_equal(got, depthwise_ref(x, w, pads, pv, (s, s), (d, d)))
    # batch > 1: identical per-image results
    for n in range(N):
        assert np.array_equal(got[n:n + 1], ConvPlan(w, None, pads, pv, s, d, C)(x[n:n + 1]))


def test_depthwise_loop_detects_a_wrong_weight():
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (1, 4, 8, 8)).astype(np.int8)
    w = rng.integers(-127, 128, (4, 1, 3, 3))
    bad = w.copy()
    bad[2, 0, 1, 1] += 1
    assert not np.array_equal(ConvPlan(bad, None, (1, 1, 1, 1), 0, 1, 1, 4)(x),
                              depthwise_ref(x, w, (1, 1, 1, 1), 0, (1, 1), (1, 1)))


def test_small_and_large_gemms_give_identical_exact_results(monkeypatch):
    rng = np.random.default_rng(2)
    x = rng.integers(-128, 128, (3, 300)).astype(np.int8)
    w = rng.integers(-127, 128, (40, 300))
    want = x.astype(np.int64) @ w.T
    assert np.array_equal(fc_acc(x, w), want)                          # one BLAS thread
    monkeypatch.setattr(blas, "SMALL_GEMM_MACS", 0)
    assert np.array_equal(fc_acc(x, w), want)                          # process setting
