"""numerics.int16: the NPU's byte planes and the float error bound of ORT's int16 path."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torq import numerics as nx
from torq.numerics import int16 as n16

ALL16 = np.arange(-2**15, 2**15, dtype=np.int64)


def test_byte_planes_rebuild_every_int16_value():
    h, low = n16.split_bytes(ALL16.astype(np.int16))
    assert h.dtype == np.int8 and low.dtype == np.uint8
    assert h.min() == -128 and h.max() == 127 and low.min() == 0 and low.max() == 255
    assert np.array_equal(n16.combine_partials(h, low), ALL16)
    assert np.array_equal(n16.combine_partials(h.astype(np.float32), low.astype(np.float32)), ALL16)
    assert [int(v) for v in n16.split_bytes(-32768)] == [-128, 0]
    with pytest.raises(ValueError, match="outside int16"):
        n16.split_bytes(np.array([40000]))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(1, 600), st.integers(0, 2**16), st.floats(1e-5, 1e-2), st.floats(1e-4, 1e-1),
       st.floats(1e-4, 1e-1))
def test_float_error_bound_holds_for_float32_sums_in_any_order(k, seed, xs, ws, ys):
    """ORT's int16 Conv: DQ(x), DQ(w) in float32, K products summed in some order (here: a random
    order, with and without a separate rounding of each product), then Q. The exact value
    differs from every such float32 evaluation by less than float_error_lsb."""
    rng = np.random.default_rng(seed)
    xs, ws, ys = np.float32(xs), np.float32(ws), np.float32(ys)
    x = rng.integers(-2**15, 2**15, k)
    w = rng.integers(-127, 128, k)
    zx = int(rng.integers(-2**15, 2**15))
    b = int(rng.integers(-2**20, 2**20))
    dq = nx.dq_scale(xs, ws)
    acc = int(((x - zx) * w).sum()) + b
    v = acc * float(dq) / float(ys)
    abs_acc = int((np.abs(x - zx) * np.abs(w)).sum()) + abs(b)
    bound = float(n16.float_error_lsb(abs_acc, k, dq, ys, v))
    xf = ((x - zx).astype(np.float32) * xs).astype(np.float32)
    wf = (w.astype(np.float32) * ws).astype(np.float32)
    bf = np.float32(np.float32(b) * dq)
    for trial in range(4):
        order = rng.permutation(k)
        s = bf
        for i in order:
            p = xf[i] * wf[i] if trial % 2 else np.float32(np.float64(xf[i]) * np.float64(wf[i]))
            s = np.float32(s + np.float32(p)) if trial % 2 else np.float32(np.float64(s) + np.float64(p))
        got = float(np.float32(s / ys))
        assert abs(got - v) <= bound, (got, v, bound)


def test_admissible_outputs_and_the_explainer():
    lo, hi = n16.admissible(np.array([10.49, 10.5, -3.2]), np.array([0.02, 0.0, 0.1]), 5, -32768, 32767)
    assert lo.tolist() == [15, 15, 2] and hi.tolist() == [16, 16, 2]
    assert n16.admissible(40000.0, 0.0, 0, -32768, 32767) == (32767, 32767)
    v = np.array([10.49, 7.0, 3.0, 2.0**31 + 5])
    err = np.full(4, 0.02)
    native = np.array([10, 7, 3, -7])
    ort = np.array([11, 7, 9, 32767])
    acc = np.array([10, 7, 3, 2**31 + 5])
    causes = n16.explain_bounded(native, ort, v, err, 0, -32768, 32767, acc=acc)
    assert causes == {"float": 1, "overflow": 1, "other": 1}


def test_requant_rescale_is_exact_where_the_scales_allow():
    """int16 -> int8 with xs/ys = 2**-8 and a short ys mantissa: ORT's float32 products are exact,
    and the ACT reproduces ORT's recipe on all 65,536 inputs. With a 24-bit ys (0.05) ORT's
    DequantizeLinear rounds, so at the exact ties its result goes either way: those are the only
    differences, and each is explained by the float bound; random scales differ at near-ties."""
    for ys, expect in ((0.046875, 0), (0.05, None)):
        ys = np.float32(ys)
        xs = np.float32(ys / 256)
        m, s, even = n16.requant_rescale(xs, 0, ys, 3, -128, 127)
        got = nx.act_native(ALL16, m, s, 3, -128, 127, ties_even=even)
        want = n16.requant_float_ort(ALL16, xs, 0, ys, 3, -128, 127)
        bad = np.flatnonzero(got != want)
        if expect is not None:
            assert bad.size == expect
        v = ALL16 / 256
        assert np.all(v[bad] - np.floor(v[bad]) == 0.5)
        err = n16.float_error_lsb(0, 0, 1.0, 1.0, v)
        assert n16.explain_bounded(got, want, v, err, 3, -128, 127)["other"] == 0
    rng = np.random.default_rng(0)
    for _ in range(5):
        xs, ys, zx = np.float32(rng.uniform(1e-5, 1e-3)), np.float32(rng.uniform(1e-3, 0.1)), int(rng.integers(-300, 300))
        m, s, even = n16.requant_rescale(xs, zx, ys, -7, -128, 127)
        got = nx.act_native(ALL16 - zx, m, s, -7, -128, 127, ties_even=even)
        bad = np.flatnonzero(got != n16.requant_float_ort(ALL16, xs, zx, ys, -7, -128, 127))
        assert bad.size <= 8
        v = (ALL16[bad] - zx) * (float(xs) / float(ys))
        assert np.all(np.abs(v - np.floor(v) - 0.5) < 1e-4)     # each one a near-tie


def test_int16_involved():
    assert nx.int16_involved(np.dtype(np.int16)) and nx.int16_involved("i8", "i16")
    assert not nx.int16_involved(np.dtype(np.int8), "i8", "i32")
