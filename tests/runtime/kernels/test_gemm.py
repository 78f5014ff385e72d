"""Exact GEMMs: small ones on one BLAS thread and large ones on every core give the same integers."""
import numpy as np

from torq.runtime.kernels import blas, fc_acc


def test_small_and_large_gemms_give_identical_exact_results(monkeypatch):
    rng = np.random.default_rng(2)
    x = rng.integers(-128, 128, (3, 300)).astype(np.int8)
    w = rng.integers(-127, 128, (40, 300))
    want = x.astype(np.int64) @ w.T
    assert np.array_equal(fc_acc(x, w), want)                          # one BLAS thread
    monkeypatch.setattr(blas, "SMALL_GEMM_MACS", 0)
    assert np.array_equal(fc_acc(x, w), want)                          # process setting
