"""Unit and property tests of torq.numerics (no ONNX Runtime needed here; the
bit-exact comparisons against real ORT are in test_kernels_vs_ort.py)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from torq import numerics as nx
from torq.runtime import kernels

F32 = np.float32


# --------------------------------------------------------------------------- multiplier_and_shift

def test_seed_and_zero():
    assert nx.multiplier_and_shift(0.5) == (134217728, 28)
    assert nx.multiplier_and_shift(0) == (0, 28)
    assert nx.multiplier_and_shift(0.0) == (0, 28)
    assert nx.multiplier_and_shift(0.125) == (1 << 29, 32)
    assert nx.multiplier_and_shift(1.0) == (1 << 28, 28)
    assert nx.multiplier_and_shift(np.float32(0.5)) == (134217728, 28)


@pytest.mark.parametrize("bad", [-1e-9, -0.5, float("nan"), float("inf"), float("-inf")])
def test_bad_scales_raise(bad):
    with pytest.raises(ValueError):
        nx.multiplier_and_shift(bad)


def test_tiny_and_huge_scales():
    # tiny: even 2**60 cannot lift it to 0.5 -> multiplier 0 at shift 60 (fits int32)
    assert nx.multiplier_and_shift(1e-30) == (0, 60)
    # 2**-61 * 2**60 = 0.5 -> llround half away from zero -> 1
    assert nx.multiplier_and_shift(2.0 ** -61) == (1, 60)
    m, s = nx.multiplier_and_shift(1e-12)
    assert s == 60 and m == round(1e-12 * 2 ** 60)
    assert nx.multiplier_and_shift(1e9) == (1_000_000_000, 0)
    assert nx.multiplier_and_shift(2.0 ** 31 - 1) == (2 ** 31 - 1, 0)
    assert nx.multiplier_and_shift(2.0 ** 31 - 0.75) == (2 ** 31 - 1, 0)    # rounds to 2^31-1
    for big in (2.0 ** 31 - 0.5, 2.0 ** 31, 3e9, 1e300):
        with pytest.raises(ValueError):
            nx.multiplier_and_shift(big)
    # boundary between shifts: 8.0 * 2**28 = 2**31 does not fit, so shift drops to 24
    assert nx.multiplier_and_shift(8.0) == (8 << 24, 24)
    assert nx.multiplier_and_shift(7.999999999)[1] == 24     # llround(...*2^28) = 2^31
    assert nx.multiplier_and_shift(7.99999999)[1] == 28      # 2147483645.3 -> fits


def test_llround_is_exact():
    assert nx.llround(0.49999999999999994) == 0      # floor(x + 0.5) would give 1
    assert nx.llround(2.5) == 3 and nx.llround(-2.5) == -3
    assert nx.llround(-0.5) == -1 and nx.llround(0.5) == 1
    assert nx.llround(4503599627370497.0) == 4503599627370497


def _llround_frac(q: Fraction) -> int:
    n = math.floor(abs(q))
    if abs(q) - n >= Fraction(1, 2):
        n += 1
    return n if q >= 0 else -n


@settings(max_examples=400, deadline=None)
@given(st.floats(min_value=1e-20, max_value=2.0 ** 31 - 0.51, allow_nan=False,
                 allow_infinity=False) | st.floats(min_value=1e-6, max_value=10.0))
def test_multiplier_and_shift_properties(scale):
    m, s = nx.multiplier_and_shift(scale)
    assert s % 4 == 0 and 0 <= s <= 60
    assert -2 ** 31 <= m <= 2 ** 31 - 1
    exact = Fraction(scale) * 2 ** s
    assert m == _llround_frac(exact)
    # m * 2^-s approximates scale within half a unit of 2^-s
    assert abs(Fraction(m, 2 ** s) - Fraction(scale)) <= Fraction(1, 2 ** (s + 1))
    # s is the largest multiple of 4 <= 60 that fits
    if s < 60:
        assert _llround_frac(Fraction(scale) * 2 ** (s + 4)) > 2 ** 31 - 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=1e-7, max_value=4.0), min_size=1, max_size=16),
       st.booleans())
def test_per_channel_multipliers(scales, with_zero):
    if with_zero:
        scales = scales + [0.0]
    mults, shift = nx.per_channel_multipliers(np.array(scales, dtype=np.float32))
    own = [nx.multiplier_and_shift(float(np.float32(s)))[1] for s in scales if s != 0.0]
    assert shift == min(own)
    assert mults.dtype == np.int64 and mults.max() <= 2 ** 31 - 1
    for s, m in zip(scales, mults):
        assert m == _llround_frac(Fraction(float(np.float32(s))) * 2 ** shift)
    if with_zero:
        assert mults[-1] == 0
    assert nx.per_channel_multipliers([0.0, 0.0])[1] == 28


# --------------------------------------------------------------------------- act_native

def test_lecture_example():
    # seed 002: S_W 0.01, q_W [20,-10], S_X 0.05, Z_X 10, q_X [30,14], b 0.3, S_Y 0.004, Z_Y -128
    s_w, s_x, s_y = 0.01, 0.05, 0.004
    q_w = np.array([[20, -10]])
    q_x = np.array([[30, 14]])
    q_b = round(0.3 / (s_w * s_x))
    assert q_b == 600
    q_bias = q_b - 10 * int(q_w.sum())
    assert q_bias == 500
    acc = kernels.fc_acc(q_x, q_w, np.array([q_bias]))
    assert int(acc[0, 0]) == 960
    M = s_w * s_x / s_y
    assert abs(M - 0.125) < 1e-15
    m, s = nx.multiplier_and_shift(0.125)
    assert int(nx.act_native(960, m, s, -128, -128, 127)) == -8
    assert int(nx.act_native(acc, m, s, -128, -128, 127)[0, 0]) == -8
    # second slide: Z_X 4, row [3, -1, 2], q_b 50 -> q_bias 34
    assert 50 - 4 * (3 - 1 + 2) == 34
    acc2 = kernels.fc_acc(np.array([[4, 4, 4]]), np.array([[3, -1, 2]]), np.array([34]))
    assert int(acc2[0, 0]) == 50          # zero-valued input (x == Z_X) leaves only q_b


def test_act_native_ties_toward_plus_inf():
    m, s = nx.multiplier_and_shift(0.5)
    acc = np.array([1, -1, 3, -3, 5, -5, 2, -2])
    got = nx.act_native(acc, m, s, 0, -1000, 1000)
    np.testing.assert_array_equal(got, [1, 0, 2, -1, 3, -2, 1, -1])


def test_act_native_per_channel_and_clamp_and_wrap():
    acc = np.arange(2 * 3 * 2 * 2, dtype=np.int64).reshape(2, 3, 2, 2) * 1000 - 6000
    mults = np.array([1 << 27, 1 << 28, 3 << 27])
    got = nx.act_native(acc, mults, 28, 5, -20, 20)
    exp = np.clip(np.floor(acc * (mults / 2 ** 28)[None, :, None, None] + 0.5) + 5, -20, 20)
    np.testing.assert_array_equal(got, exp)
    # int32 wrap like the hardware's 32-bit accumulator
    big = np.array([2 ** 31 + 10])
    assert int(nx.act_native(big, 1 << 28, 28, 0, -2 ** 40, 2 ** 40)[0]) == -2 ** 31 + 10
    with pytest.raises(OverflowError):
        nx.act_native(big, 1 << 28, 28, 0, -128, 127, overflow="raise")
    # fc layout: channel on axis 1 of [N, O]
    got = nx.act_native(np.array([[10, 10]]), np.array([1 << 28, 1 << 27]), 28, 0, -99, 99)
    np.testing.assert_array_equal(got, [[10, 5]])


@settings(max_examples=200, deadline=None)
@given(st.integers(-2 ** 31, 2 ** 31 - 1), st.floats(min_value=1e-6, max_value=100.0),
       st.integers(-128, 127))
def test_act_native_matches_exact_floor_half(acc, scale, zp):
    m, s = nx.multiplier_and_shift(scale)
    got = int(nx.act_native(np.array([acc]), m, s, zp, -2 ** 62, 2 ** 62)[0])
    assert got == math.floor(Fraction(acc * m, 2 ** s) + Fraction(1, 2)) + zp


# --------------------------------------------------------------------------- ORT-mode helpers

def test_ort_scales_float32_order():
    xs, ws, ys = F32(0.0123), F32(0.00456), F32(0.0789)
    s = nx.ort_requant_scale(nx.dq_scale(xs, ws), ys)
    assert s.dtype == np.float32 and s == F32(F32(xs * ws) / ys)
    s2 = nx.ort_requant_scale(nx.dq_scale(xs, np.array([ws, ws * 2], F32)), ys)
    assert s2.shape == (2,) and s2[0] == s
    g = nx.ort_requant_scale(nx.dq_scale(xs, ws, 0.5), ys)
    assert g == F32(F32(F32(F32(0.5) * xs) * ws) / ys)


def test_requant_ort_basic():
    acc = np.array([[100, -100, 7, 2 ** 25 + 1]])
    got = nx.requant_ort(acc, F32(0.5), 3, -128, 127, axis=1)
    # 50+3, -50+3, RNE(3.5)=4 -> 7, saturated
    np.testing.assert_array_equal(got, [[53, -47, 7, 127]])


def _fma_exact(a, b, c) -> np.float32:
    v = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    # round the exact rational to float32 (RNE) via float64 neighbours with exact checks
    lo = F32(float(v))
    cands = [lo, np.nextafter(lo, F32(np.inf)), np.nextafter(lo, F32(-np.inf))]
    best = min(cands, key=lambda f: (abs(Fraction(float(f)) - v),
                                     int(np.array(f).view(np.uint32)) & 1))
    return best


@settings(max_examples=300, deadline=None)
@given(st.floats(-1e6, 1e6, width=32), st.floats(-1e3, 1e3, width=32),
       st.floats(-1e6, 1e6, width=32))
def test_fma32_single_rounding(a, b, c):
    got = nx.fma32(F32(a), F32(b), F32(c))
    assert got == _fma_exact(a, b, c)


def test_fma32_double_rounding_case():
    # a*b + c lies just above a float32 midpoint; naive f64 rounding lands exactly on it.
    a, b = F32(1 + 2 ** -23), F32(1 + 2 ** -23)         # a*b = 1 + 2^-22 + 2^-46
    c = F32(2 ** -24)                                   # total: 1 + 2^-22 + 2^-24 + 2^-46
    assert nx.fma32(a, b, c) == _fma_exact(a, b, c)
    a2, b2 = F32(1 + 2 ** -12), F32(1 + 2 ** -12)       # 1 + 2^-11 + 2^-24
    c2 = F32(-2 ** -60)
    assert nx.fma32(a2, b2, c2) == _fma_exact(a2, b2, c2)


def test_ort_broadcast_mode():
    m = nx.ort_broadcast_mode
    assert m((1, 8, 4, 4), (1, 8, 4, 4)) == "general"
    assert m((1, 8, 4, 4), (1, 8, 1, 1)) == "b_scalar"
    assert m((1, 8, 1, 1), (1, 8, 4, 4)) == "a_scalar"
    assert m((2, 3), ()) == "b_scalar"
    assert m((), (2, 3)) == "a_scalar"
    assert m((2, 3), (1,)) == "b_scalar"
    assert m((1, 8, 4, 1), (1, 8, 1, 1)) == "b_scalar"        # trailing 1s are skipped
    assert m((1, 8, 1, 1), (1, 8, 1, 1)) == "general"
    assert m((1, 1, 4, 4), (1, 8, 4, 4)) == "general"


def test_add_multipliers_and_native():
    mA, mB, s = nx.add_multipliers(0.5, 0.25, 1.0)
    assert (mA, mB, s) == (1 << 27, 1 << 26, 28)
    # shift comes from the larger ratio
    mA, mB, s = nx.add_multipliers(F32(3.0), F32(0.001), F32(1.0))
    assert s == nx.multiplier_and_shift(3.0)[1] and mA <= 2 ** 31 - 1
    a = np.array([10, 11, -3])
    b = np.array([0, 1, 5])
    got = nx.add_native_mults(a, b, 1, 1, *nx.add_multipliers(0.5, 0.25, 1.0), -2, -128, 127)
    exact = [(x - 1) * 0.5 + (y - 1) * 0.25 for x, y in zip(a, b)]     # 4.5, 5, -1
    np.testing.assert_array_equal(got, [math.floor(v + 0.5) - 2 for v in exact])


def test_avgpool_native_per_count():
    sums = np.array([[[[6, 6], [6, 9]]]])
    counts = np.array([[4, 2], [2, 3]])
    got = nx.avgpool_native(sums, counts, F32(1.0), F32(1.0), 0, -128, 127)
    np.testing.assert_array_equal(got, [[[[2, 3], [3, 3]]]])   # 1.5 -> 2 (NTP), 3, 3, 3


def test_quantize_dequantize_ort():
    x = np.array([0.0, 0.25, -0.25, 0.75, 1e9, -1e9, np.inf, -np.inf], F32)
    q = nx.quantize_ort(x, F32(0.5), 3, -128, 127)
    np.testing.assert_array_equal(q, [3, 3, 3, 5, 127, -128, 127, -128])    # RNE: +-0.5->0, 1.5->2
    d = nx.dequantize_ort(np.array([3, 4, -128], np.int8), F32(0.5), 3)
    assert d.dtype == np.float32
    np.testing.assert_array_equal(d, [0.0, 0.5, -65.5])


# --------------------------------------------------------------------------- bf16

def _bf16_ref(v: float) -> float:
    if math.isnan(v) or math.isinf(v) or v == 0:
        return v
    m, e = math.frexp(v)              # v = m * 2^e, 0.5 <= |m| < 1
    if e - 1 < -126:                  # bf16 subnormal range: quantum 2^-133
        q = Fraction(v) / Fraction(2) ** -133
        return float(round(q) * Fraction(2) ** -133)
    r = round(Fraction(m) * 256)      # 8 significant bits, Python round = half to even
    out = math.ldexp(float(r), e - 8)
    return out if abs(out) < 2.0 ** 128 else math.copysign(math.inf, v)


@settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=False))
def test_to_bf16_matches_reference(v):
    got = float(nx.to_bf16(np.array([v], F32))[0])
    assert got == _bf16_ref(float(F32(v))) or (got == 0 and _bf16_ref(float(F32(v))) == 0)


def test_bf16_specials_and_ties():
    x = np.array([np.nan, np.inf, -np.inf, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 3.4e38], F32)
    r = nx.to_bf16(x)
    assert np.isnan(r[0]) and r[1] == np.inf and r[2] == -np.inf
    assert r[3] == 1.0                       # tie -> even
    assert r[4] == 1.0 + 2 ** -6             # tie -> even (up)
    assert r[5] == np.inf                    # rounds past bf16 max


def test_quantize_bf16_native():
    x = np.array([0.0, 1.0, -1.0, 1.234, 100.0, -1e6], F32)
    q = nx.quantize_fallback(x, F32(0.02), 5, -128, 127)
    assert q.dtype == np.int64
    np.testing.assert_array_equal(q[[0, 1, 2, 5]], [5, 55, -45, -128])
    assert abs(q[3] - (round(1.234 / 0.02) + 5)) <= 1
    assert q[4] == 127
    d = nx.dequantize_fallback(np.array([-128, 0, 5, 127]), F32(0.02), 5)
    ref = (np.array([-128, 0, 5, 127]) - 5) * 0.02
    np.testing.assert_allclose(d, ref, rtol=2 ** -7)
    assert d[2] == 0.0


# --------------------------------------------------------------------------- diff explanation

def test_classify():
    assert nx.classify_real(Fraction(5, 2)) == "tie"
    assert nx.classify_real(Fraction(-5, 2)) == "tie"
    assert nx.classify_real(Fraction(251, 100)) == "other"
    assert nx.classify_real(Fraction(-249, 100)) == "other"
    assert nx.classify_real(Fraction(25001, 10000)) == "near-tie"
    assert nx.classify_real(Fraction(-24999, 10000)) == "near-tie"
    assert nx.classify_real(Fraction(2, 1)) == "other"
    assert nx.classify_rescale_diff(3, 0.5) == "tie"
    assert nx.classify_rescale_diff(3, ((F32(0.1), F32(0.5)), (F32(0.1),))) == "tie"
    xs, ws, ys = F32(0.05), F32(0.01), F32(0.004)
    assert nx.exact_ratio((xs, ws), (ys,)) == Fraction(float(xs)) * Fraction(float(ws)) / Fraction(float(ys))
    res = nx.explain_diffs(np.array([1, 3, 5, 7]), 0.5)
    assert res == {"tie": 4, "near-tie": 0, "other": 0}
    res = nx.explain_diffs(np.array([1, 2]), [0.5, Fraction(1, 3)])
    assert res == {"tie": 1, "near-tie": 0, "other": 1}
    res = nx.explain_add_diffs([3], [1], 0.5, 0, 0.5, 1, 1.0)
    assert res == {"tie": 1, "near-tie": 0, "other": 0}
