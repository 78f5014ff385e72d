"""The depthwise kernel, tested here only: both loops (planar, channels-last) against a plain
int64 formula for any geometry, stride, dilation, padding, channel multiplier and input type,
batch invariant; the channels-last tap-row sums (3 and 5 taps per kernel row, up to 40
channels, accumulators in a Workspace); and a wrong weight is seen."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmodels import depthwise_ref
from torq.runtime.kernels import ConvPlan, Workspace, depthwise


@pytest.fixture(params=["planar", "channels-last"])
def loop(request, monkeypatch):
    """Force one of the two loops for every plane width."""
    monkeypatch.setattr(depthwise, "_PLANAR_MIN_WIDTH", 0 if request.param == "planar" else 1 << 30)
    return request.param


@st.composite
def cases(draw):
    K = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = tuple(draw(st.integers(0, 3)) for _ in range(4))
    H = draw(st.integers(max(1, (K[0] - 1) * d[0] + 1 - pads[2] - pads[3]), 20))
    W = draw(st.integers(max(1, (K[1] - 1) * d[1] + 1 - pads[0] - pads[1]), 20))
    return dict(xdt=np.int8, wbits=8,     # other types: test_other_types (each is a compilation)
                N=draw(st.integers(1, 3)), C=draw(st.integers(1, 6)), H=H, W=W, K=K, s=s, d=d, pads=pads,
                m=draw(st.integers(1, 3)), seed=draw(st.integers(0, 2**32 - 1)))


def _case(c):
    rng = np.random.default_rng(c["seed"])
    info = np.iinfo(c["xdt"])
    x = rng.integers(info.min, info.max, (c["N"], c["C"], c["H"], c["W"]), endpoint=True).astype(c["xdt"])
    hw = 1 << (c["wbits"] - 1)
    w = rng.integers(-hw + 1, hw, (c["C"] * c["m"], 1, *c["K"]))
    w[rng.random(w.shape) < 0.1] = 0                       # skipped zero taps
    pv = int(rng.integers(info.min, info.max, endpoint=True))
    return x, w, pv


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=cases())
def test_depthwise_loops_are_exact(loop, c):     # the fixture only sets a constant: safe to share
    x, w, pv = _case(c)
    plan = ConvPlan(w, None, c["pads"], pv, c["s"], c["d"], c["C"])
    got = plan(x)
    assert np.array_equal(got, depthwise_ref(x, w, c["pads"], pv, c["s"], c["d"]))
    assert np.array_equal(got[-1:], plan(x[-1:]))          # batch invariant


@pytest.mark.parametrize("xdt,wbits", [(np.uint8, 8), (np.int16, 16)])   # float32, float64 sums
def test_other_types(loop, xdt, wbits):
    c = dict(N=2, C=3, H=9, W=11, K=(3, 5), s=(2, 1), d=(1, 2), pads=(2, 1, 0, 3), m=2, xdt=xdt, wbits=wbits, seed=7)
    x, w, pv = _case(c)
    got = ConvPlan(w, None, c["pads"], pv, c["s"], c["d"], c["C"])(x)
    assert np.array_equal(got, depthwise_ref(x, w, c["pads"], pv, c["s"], c["d"]))


@pytest.mark.parametrize("C,H,K,s", [(8, 112, 3, 2), (16, 56, 5, 1), (64, 14, 5, 1), (96, 7, 5, 2)])
def test_model_sized_planes(loop, C, H, K, s):
    """Planes as large as EfficientNet-Lite0's (several L1 blocks per plane in the planar loop)."""
    rng = np.random.default_rng(H)
    x = rng.integers(-128, 128, (2, C, H, H)).astype(np.int8)
    w = rng.integers(-127, 128, (C, 1, K, K))
    p = (K // 2,) * 4
    assert np.array_equal(ConvPlan(w, None, p, -5, s, 1, C)(x), depthwise_ref(x, w, p, -5, (s, s), (1, 1)))


def test_a_wrong_weight_is_seen(loop):
    """On both loops (the 5-tap rows on the channels-last one), in the very channel it hits."""
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (2, 24, 9, 9)).astype(np.int8)
    w = rng.integers(-127, 128, (24, 1, 5, 5))
    ref = depthwise_ref(x, w, (2, 2, 2, 2), 3, (1, 1), (1, 1))
    bad = w.copy()
    bad[17, 0, 2, 4] += 1
    got = ConvPlan(bad, None, (2, 2, 2, 2), 3, 1, 1, 24)(x)
    assert not np.array_equal(got, ref)
    assert np.array_equal(np.nonzero((got != ref).any(axis=(0, 2, 3)))[0], [17])


@pytest.fixture
def channels_last(monkeypatch):
    monkeypatch.setattr(depthwise, "_PLANAR_MIN_WIDTH", 1 << 30)


@st.composite
def dw_cases(draw):
    KW = draw(st.sampled_from([3, 5, 3, 5, 1, 2, 4, 7]))     # 3 and 5: the tap-row sums
    KH = draw(st.integers(1, 5))
    s = (draw(st.integers(1, 2)), draw(st.integers(1, 3)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = tuple(draw(st.integers(0, 3)) for _ in range(4))
    H = draw(st.integers(max(1, (KH - 1) * d[0] + 1 - pads[2] - pads[3]), 16))
    W = draw(st.integers(max(1, (KW - 1) * d[1] + 1 - pads[0] - pads[1]), 16))
    return dict(N=draw(st.integers(1, 3)), C=draw(st.integers(1, 40)), H=H, W=W, K=(KH, KW), s=s, d=d,
                pads=pads, m=draw(st.integers(1, 2)), seed=draw(st.integers(0, 2**32 - 1)))


def _operands(c):
    rng = np.random.default_rng(c["seed"])
    x = rng.integers(-128, 127, (c["N"], c["C"], c["H"], c["W"]), endpoint=True).astype(np.int8)
    w = rng.integers(-127, 128, (c["C"] * c["m"], 1, *c["K"]))
    w[rng.random(w.shape) < 0.1] = 0
    return x, w, int(rng.integers(-128, 127, endpoint=True))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=dw_cases())
def test_channels_last_tap_rows_are_exact(channels_last, c):
    x, w, pv = _operands(c)
    plan = ConvPlan(w, None, c["pads"], pv, c["s"], c["d"], c["C"])
    ref = depthwise_ref(x, w, c["pads"], pv, c["s"], c["d"])
    got = plan(x)
    assert got.dtype == np.int64 and np.array_equal(got, ref)
    assert np.array_equal(plan(x[-1:]), ref[-1:])                 # batch invariant
    assert np.array_equal(plan.parts(x, Workspace()).int64(), ref)
