"""GPTQ weight rounding (numerics.weight_rounding): integers in range, scales' grid kept, never a
larger layer-output error than nearest rounding, a smaller one when inputs correlate, and exactly
nearest rounding when they do not."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from torq.numerics.weight_rounding import gptq_round, output_error


def _case(seed, g=3, r=16, k=12, corr=0.9):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(g, r, k))
    scale = np.abs(w).max(axis=-1) / 127
    base = rng.normal(size=(g, 4096, 1))
    x = corr * base + (1 - corr) * rng.normal(size=(g, 4096, k))      # strongly correlated inputs
    h = np.swapaxes(x, 1, 2) @ x
    return w, scale, h


@pytest.mark.parametrize("seed", range(4))
def test_never_worse_and_better_on_correlated_inputs(seed):
    w, scale, h = _case(seed)
    q = gptq_round(w, scale, h)
    near = np.clip(np.rint(w / scale[..., None]), -127, 127)
    assert np.all(q == np.rint(q)) and np.abs(q).max() <= 127
    e_q, e_n = output_error(w, q, scale, h), output_error(w, near, scale, h)
    assert np.all(e_q <= e_n)
    assert e_q.sum() < 0.5 * e_n.sum()                 # correlated inputs cancel rounding errors


def test_uncorrelated_inputs_give_nearest_rounding():
    rng = np.random.default_rng(5)
    w = rng.normal(size=(2, 8, 10))
    scale = np.abs(w).max(axis=-1) / 127
    h = np.broadcast_to(np.diag(rng.uniform(1, 2, 10)), (2, 10, 10)).copy()
    assert np.array_equal(gptq_round(w, scale, h), np.clip(np.rint(w / scale[..., None]), -127, 127))


def test_close_to_the_best_rounding_on_tiny_layers():
    """Brute force over every floor/ceil choice of 6 inputs: GPTQ lands near the optimum."""
    w, scale, h = _case(7, g=1, r=6, k=6)
    q = gptq_round(w, scale, h)[0]
    lo = np.floor(w[0] / scale[0][:, None])
    best = np.full(6, np.inf)
    for bits in itertools.product((0, 1), repeat=6):
        cand = lo + np.array(bits)
        best = np.minimum(best, output_error(w, cand[None], scale, h)[0])
    got = output_error(w, q[None], scale, h)[0]
    near = output_error(w, np.rint(w / scale[..., None]), scale, h)[0]
    assert np.all(got >= best * (1 - 1e-9))            # the brute force really is a lower bound
    assert np.sum(got - best) < 0.5 * np.sum(near - best)


def test_dead_inputs_do_not_break_it():
    w, scale, h = _case(3, g=1, r=4, k=5)
    h[:, 2, :] = 0
    h[:, :, 2] = 0
    q = gptq_round(w, scale, h)
    assert np.all(np.isfinite(q)) and np.abs(q).max() <= 127


def test_wide_layers_are_rounded_in_chunks(monkeypatch):
    """Past MAX_INPUTS the inputs are rounded in chunks against H's diagonal blocks: the same
    integers as rounding each chunk alone, and still never worse than nearest on each block."""
    from torq.numerics import weight_rounding as wr
    w, scale, h = _case(11, g=1, r=5, k=12)
    monkeypatch.setattr(wr, "MAX_INPUTS", 4)
    q = wr.gptq_round(w, scale, h)
    for p in np.array_split(np.arange(12), 3):
        alone = wr.gptq_round(w[..., p], scale, h[:, p[:, None], p])
        assert np.array_equal(q[..., p], alone)
        near = np.clip(np.rint(w[..., p] / scale[..., None]), -127, 127)
        hb = h[:, p[:, None], p]
        assert np.all(output_error(w[..., p], q[..., p], scale, hb) <= output_error(w[..., p], near, scale, hb))
