"""The compiled rescale loops on whole small planes (one 49-element row per 7x7 channel) and on
row windows of wider accumulators give exactly the numpy formulas' results."""
import numpy as np
import pytest

from torq import numerics
from torq.numerics import loops


@pytest.mark.parametrize("shape,window", [((3, 5, 7, 7), None), ((2, 4, 14, 14), None), ((2, 3, 6, 9), 7)])
def test_fused_rescale_matches_the_formulas(shape, window):
    rng = np.random.default_rng(sum(shape))
    full = rng.integers(-300000, 300000, shape).astype(np.float32)
    acc = full[..., :window] if window else full                 # a "wide" accumulator's window
    C = shape[1]
    extra = rng.integers(-5000, 5000, C)
    mult = rng.integers(1 << 29, 1 << 30, C)
    whole = acc.astype(np.int64) + extra[None, :, None, None]
    got = numerics.act_native_parts(acc, extra, mult, 38, 3, -128, 127, acc_bound=300000,
                                    bound=305000, axis=1, out_dtype=np.int8)
    assert np.array_equal(got, np.asarray(numerics.act_native(whole, mult, 38, 3, -128, 127, axis=1)))
    scale = (rng.random(C) * 1e-4).astype(np.float32)
    got = numerics.requant_ort_parts(acc, extra, scale, -2, -128, 127, acc_bound=300000, bound=305000,
                                     axis=1, out_dtype=np.int8)
    assert np.array_equal(got, np.asarray(numerics.requant_ort(whole, scale, -2, -128, 127, axis=1)))


def test_planes_are_flattened_only_when_both_sides_are_whole():
    a = np.zeros((1, 2, 7, 9), np.float32)
    out = np.zeros((1, 2, 7, 7), np.int8)
    assert loops.flat_planes(a[..., :7], out)[0].shape == (1, 2, 7, 7)       # a window: rows kept
    assert loops.flat_planes(np.zeros((1, 2, 7, 7), np.float32), out)[1].shape == (1, 2, 1, 49)
