"""Exact accumulation kernels, and ort / native requantisation, against real ONNX Runtime.

Each ORT test builds a single-op QOperator model with onnx.helper, runs it on the CPU EP
(1 intra-op thread, default optimisation level) and checks, element by element:

* ort mode  (torq.runtime.kernels + torq.numerics *_ort helpers) == ORT, bit for bit;
* native mode (multiplier/shift, NTP rounding) within +-1 LSB of ORT, and every differing
  element classified 'tie' or 'near-tie' from the exact real rescale (never 'other').

A slice of the examples uses power-of-two scales so that exact ties (and so native diffs)
really occur. Statistics are printed at the end of the module (``pytest -s``).
"""
from __future__ import annotations

import collections

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import helper, numpy_helper

from torq import numerics as nx
from torq.runtime import kernels

F32 = np.float32
OPSETS = [helper.make_opsetid("", 19), helper.make_opsetid("com.microsoft", 1)]
SETTINGS = dict(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

STATS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


@pytest.fixture(scope="module", autouse=True)
def _report_stats():
    yield
    print("\nnative-vs-ORT statistics (elements):")
    for k, c in sorted(STATS.items()):
        print(f"  {k:28s} " + ", ".join(f"{n}={v}" for n, v in sorted(c.items())))


# ----------------------------------------------------------------------------- ORT plumbing

def _np2onnx(dt) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def run_ort(nodes, inputs: dict, inits: dict, outs: dict) -> list[np.ndarray]:
    """Run a one-op graph; ``outs`` maps output name -> numpy dtype."""
    g_inputs = [helper.make_tensor_value_info(k, _np2onnx(v.dtype), list(v.shape))
                for k, v in inputs.items()]
    g_outputs = [helper.make_tensor_value_info(n, _np2onnx(dt), None) for n, dt in outs.items()]
    out_names = list(outs)
    inits_pb = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    graph = helper.make_graph(nodes, "t", g_inputs, g_outputs, inits_pb)
    model = helper.make_model(graph, opset_imports=OPSETS)
    model.ir_version = 9
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(out_names, inputs)


def qrange(dt) -> tuple[int, int]:
    i = np.iinfo(dt)
    return int(i.min), int(i.max)


def rand_q(rng, shape, dt) -> np.ndarray:
    lo, hi = qrange(dt)
    return rng.integers(lo, hi + 1, size=shape).astype(dt)


def pick_scale(rng, lo_exp, hi_exp, dyadic) -> F32:
    v = 10.0 ** rng.uniform(lo_exp, hi_exp)
    if dyadic:
        v = 2.0 ** round(np.log2(v))
    return F32(v)


def check_native(key, y_ort, y_nat, diff_scales_fn):
    """|native - ORT| <= 1 everywhere and each differing element is a tie / near-tie."""
    y_ort = np.asarray(y_ort).astype(np.int64)
    d = np.asarray(y_nat) - y_ort
    assert np.abs(d).max(initial=0) <= 1, f"{key}: native off by {np.abs(d).max()} LSB"
    idx = np.nonzero(d)
    STATS[key]["elements"] += y_ort.size
    if idx[0].size:
        causes = diff_scales_fn(idx)
        STATS[key].update({k: v for k, v in causes.items() if v})
        assert causes["other"] == 0, f"{key}: unexplained native differences {causes}"


def assert_exact(key, got, ref):
    got = np.asarray(got).astype(np.int64)
    ref = np.asarray(ref).astype(np.int64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    bad = np.count_nonzero(got != ref)
    STATS[key]["ort_mismatch"] += bad
    assert bad == 0, f"{key}: ort-mode recipe differs from ORT on {bad}/{ref.size} elements"


# ----------------------------------------------------------------------------- int64 references

def conv_ref(x, w, b, pads, pv, st_, dl, g):
    """Straightforward int64 convolution (explicit tap loop + einsum per output channel)."""
    N, C, H, W = x.shape
    O, Cg, KH, KW = w.shape
    pl, pr, pt, pb = pads
    xp = np.full((N, C, H + pt + pb, W + pl + pr), pv, np.int64)
    xp[:, :, pt:pt + H, pl:pl + W] = x
    OH = (H + pt + pb - dl[0] * (KH - 1) - 1) // st_[0] + 1
    OW = (W + pl + pr - dl[1] * (KW - 1) - 1) // st_[1] + 1
    out = np.zeros((N, O, OH, OW), np.int64)
    Og = O // g
    for o in range(O):
        gi = o // Og
        for i in range(KH):
            for j in range(KW):
                sl = xp[:, gi * Cg:(gi + 1) * Cg,
                        i * dl[0]:i * dl[0] + st_[0] * (OH - 1) + 1:st_[0],
                        j * dl[1]:j * dl[1] + st_[1] * (OW - 1) + 1:st_[1]]
                out[:, o] += np.einsum("nchw,c->nhw", sl, w[o, :, i, j].astype(np.int64))
    return out + np.asarray(b, np.int64)[None, :, None, None]


@st.composite
def conv_geometry(draw, max_c=24, max_hw=20):
    kind = draw(st.sampled_from(["dense", "dense", "depthwise", "grouped"]))
    if kind == "depthwise":
        C = draw(st.integers(1, 8))
        g = C
        O = C * draw(st.sampled_from([1, 1, 2]))
    elif kind == "grouped":
        g = draw(st.sampled_from([2, 3]))
        C = g * draw(st.integers(1, 4))
        O = g * draw(st.integers(1, 4))
    else:
        g = 1
        C = draw(st.integers(1, max_c))
        O = draw(st.integers(1, max_c))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ekh, ekw = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    pt, pb = draw(st.integers(0, ekh - 1)), draw(st.integers(0, ekh - 1))
    pl, pr = draw(st.integers(0, ekw - 1)), draw(st.integers(0, ekw - 1))
    H = draw(st.integers(max(1, ekh - pt - pb), max_hw))
    W = draw(st.integers(max(1, ekw - pl - pr), max_hw))
    N = draw(st.integers(1, 2))
    return dict(N=N, C=C, O=O, g=g, k=(kh, kw), s=(sh, sw), d=(dh, dw),
                pads=(pl, pr, pt, pb), H=H, W=W)


# ----------------------------------------------------------------------------- accumulators

@settings(max_examples=100, **SETTINGS)
@given(conv_geometry(max_c=12, max_hw=14), st.sampled_from(["u8", "i8"]), st.sampled_from(["i8", "i16big"]),
       st.integers(0, 2 ** 32 - 1))
def test_conv2d_acc_equals_int64_reference(geo, xdt, wkind, seed):
    rng = np.random.default_rng(seed)
    xt = np.uint8 if xdt == "u8" else np.int8
    x = rand_q(rng, (geo["N"], geo["C"], geo["H"], geo["W"]), xt)
    wshape = (geo["O"], geo["C"] // geo["g"], *geo["k"])
    if wkind == "i8":
        w = rand_q(rng, wshape, np.int8).astype(np.int16)
    else:   # large int16 weights force the float64 path
        w = rng.integers(-30000, 30001, size=wshape).astype(np.int16)
    b = rng.integers(-2 ** 20, 2 ** 20, size=geo["O"])
    pv = int(rng.integers(*qrange(xt)))
    got = kernels.conv2d_acc(x, w, b, geo["pads"], pv, geo["s"], geo["d"], geo["g"])
    ref = conv_ref(x, w, b, geo["pads"], pv, geo["s"], geo["d"], geo["g"])
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, ref)


def test_conv2d_acc_chunked_float32_path():
    # K = 64*5*5 = 1600 > chunk 1032 for int8 x int8: several float32 chunks, exact
    rng = np.random.default_rng(1)
    x = rand_q(rng, (1, 64, 9, 9), np.int8)
    x[0, 0, 0, 0] = -128
    w = rand_q(rng, (8, 64, 5, 5), np.int8)
    w[0, 0, 0, 0] = -128
    got = kernels.conv2d_acc(x, w, None, (2, 2, 2, 2), -128, 1, 1, 1)
    np.testing.assert_array_equal(got, conv_ref(x, w, np.zeros(8), (2, 2, 2, 2), -128,
                                                (1, 1), (1, 1), 1))
    # worst case magnitudes everywhere: every product is 128*128
    x = np.full((1, 64, 4, 4), -128, np.int8)
    w = np.full((4, 64, 3, 3), -128, np.int16)
    got = kernels.conv2d_acc(x, w, None, (0, 0, 0, 0), 0, 1, 1, 1)
    assert (got == 64 * 9 * 128 * 128).all()


class _kernel_knobs:
    """Temporarily set the convolution kernels' tuning constants (column mode, block budget)."""

    def __init__(self, **kw):
        self.kw = kw

    def __enter__(self):
        self.old = {k: getattr(kernels.conv, k) for k in self.kw}
        for k, v in self.kw.items():
            setattr(kernels.conv, k, v)

    def __exit__(self, *exc):
        for k, v in self.old.items():
            setattr(kernels.conv, k, v)


def _weights(rng, kind, shape):
    if kind == "i8":
        return rand_q(rng, shape, np.int8).astype(np.int16)
    if kind == "i8max":       # every |w| = 127/128: the float32 chunk bound is tight
        return rng.choice(np.array([-128, 127, -127], np.int16), size=shape)
    if kind == "sparse":      # mostly zeros: Σ|w| << K * max|w|, long chunks
        w = rand_q(rng, shape, np.int8).astype(np.int16)
        w[rng.random(shape) < 0.9] = 0
        return w
    return rng.integers(-30000, 30001, size=shape).astype(np.int16)     # i16big: float64 path


def _assert_exact_bounds(plan):
    """The float32 exactness invariants of every engine a ConvPlan built: per chunk,
    key * max_o Σ_k |w| (direct) or 4*key * max_(xi,nu,o) Σ_c |U| (Winograd) < 2**24, and the
    Winograd int32 accumulator bound 4*key * max_o Σ|U| < 2**31."""
    if plan._weights is not None:
        for key, eng in plan._weights._plans.items():
            if eng.dtype is np.float32:
                for k0, k1, m in eng.chunks:
                    assert key * np.abs(m.astype(np.int64)).sum(axis=-1).max() <= 2 ** 24 - 1
    if plan._wino is not None:
        for key, eng in plan._wino._plans.items():
            if eng is not None:
                assert 4 * key * plan._wino.tot < 2 ** 31
                for c0, c1, u in eng:
                    assert 4 * key * np.abs(u.astype(np.int64)).sum(axis=-1).max() <= 2 ** 24 - 1


def _check_plan(x, w, b, pads, pv, s, d, g):
    """ConvPlan (all column modes / blockings) == int64 reference, and its fused
    requantisation == act_native / requant_ort of the reference accumulator."""
    ref = conv_ref(x, w, b, pads, pv, s, d, g)
    rng = np.random.default_rng(int(np.abs(ref).sum()) % 2 ** 32)
    O = w.shape[0]
    mult = rng.integers(1, 2 ** 31, size=O) if rng.random() < 0.5 else int(rng.integers(1, 2 ** 31))
    shift = int(rng.integers(24, 50))
    scale = (rng.uniform(0.5, 2, O) * 1e-4).astype(F32)
    zp = int(rng.integers(-128, 128))
    for knobs in (dict(_WIDE_MAX_WASTE=0.0, _WINO_MIN_TILES=10 ** 9), dict(_WIDE_MAX_WASTE=1.0),
                  dict(_WIDE_MAX_WASTE=0.05, _COLS_BUDGET=64), dict(_WINO_MIN_TILES=1)):
        with _kernel_knobs(**knobs):
            plan = kernels.ConvPlan(w, b, pads, pv, s, d, g)
            for _ in range(2):                      # a plan is reusable
                got = plan(x)
                assert got.dtype == np.int64
                np.testing.assert_array_equal(got, ref)
            parts = plan.parts(x)
            _assert_exact_bounds(plan)
            assert np.abs(ref).max(initial=0) <= parts.bound
            assert np.abs(np.asarray(parts.acc, np.float64)).max(initial=0) <= parts.acc_bound
            np.testing.assert_array_equal(parts.int64(), ref)
            kw = dict(acc_bound=parts.acc_bound, bound=parts.bound, axis=1, out_dtype=np.int8)
            np.testing.assert_array_equal(
                nx.act_native_parts(parts.acc, parts.extra, mult, shift, zp, -128, 127, **kw),
                nx.act_native(ref, mult, shift, zp, -128, 127).astype(np.int8))
            np.testing.assert_array_equal(
                nx.requant_ort_parts(parts.acc, parts.extra, scale, zp, -128, 127, **kw),
                nx.requant_ort(ref, scale, zp, -128, 127).astype(np.int8))


@settings(max_examples=120, **SETTINGS)
@given(conv_geometry(max_c=20, max_hw=18), st.sampled_from(["u8", "i8", "i16"]),
       st.sampled_from(["i8", "i8max", "sparse", "i16big"]), st.integers(0, 2 ** 32 - 1))
def test_conv_plan_equals_int64_reference(geo, xdt, wkind, seed):
    """The optimised conv path (phases, wide / exact columns, row blocks, float32 chunks,
    float64 / int64 engines, fused requant) on random geometries: 1x1, strides, dilations,
    groups, depthwise, asymmetric pads, batch 2."""
    rng = np.random.default_rng(seed)
    shape = (geo["N"], geo["C"], geo["H"], geo["W"])
    if xdt == "i16":
        x = rng.integers(-3000, 3001, size=shape).astype(np.int16)
        pv = int(rng.integers(-3000, 3001))
    else:
        xt = np.uint8 if xdt == "u8" else np.int8
        x = rand_q(rng, shape, xt)
        pv = int(rng.integers(*qrange(xt)))
    w = _weights(rng, wkind, (geo["O"], geo["C"] // geo["g"], *geo["k"]))
    b = rng.integers(-2 ** 20, 2 ** 20, size=geo["O"])
    _check_plan(x, w, b, geo["pads"], pv, geo["s"], geo["d"], geo["g"])


@pytest.mark.parametrize("case", [
    # (N, C, O, H, W, k, stride, dilation, pads, groups, x kind, w kind)
    (1, 64, 8, 9, 9, 5, 1, 1, (2, 2, 2, 2), 1, "i8", "i8max"),       # K = 1600: 2+ float32 chunks
    (1, 128, 4, 6, 7, 3, 2, 1, (1, 0, 1, 1), 1, "u8", "i8max"),      # chunks + centring + stride 2
    (2, 144, 6, 8, 8, 5, 1, 2, (4, 4, 4, 4), 3, "i8", "i8max"),      # grouped, dilated, chunked
    (1, 512, 16, 3, 3, 3, 1, 1, (1, 1, 1, 1), 1, "i8", "sparse"),    # K = 4608, sparse weights
    (1, 32, 16, 12, 12, 1, 1, 1, (0, 0, 0, 0), 1, "u8", "i8"),       # 1x1: no column buffer
    (1, 32, 16, 12, 12, 1, 2, 1, (0, 0, 0, 0), 1, "i8", "i8"),       # 1x1 stride 2
    (2, 3, 8, 23, 21, 7, 2, 1, (3, 3, 3, 3), 1, "i8", "i8"),         # ResNet stem (odd sizes)
    (1, 8, 8, 10, 10, 3, 1, 1, (1, 1, 1, 1), 8, "u8", "i8"),         # depthwise
    (1, 16, 8, 7, 7, 3, 1, 1, (1, 1, 1, 1), 1, "i16", "i16big"),     # float64 engine
    (1, 4, 3, 5, 5, 3, 1, 1, (1, 1, 1, 1), 1, "i32", "i16big"),      # int64 engine
    (2, 24, 10, 13, 12, 3, 1, 1, (1, 0, 2, 1), 1, "u8", "i8"),       # Winograd, odd sizes
    (1, 512, 8, 6, 7, 3, 1, 1, (1, 1, 1, 1), 1, "i8", "i8"),         # Winograd, chunked
    (1, 64, 8, 9, 9, 3, 1, 1, (1, 1, 1, 1), 1, "i8", "i8"),          # Winograd, int32 stage 1
    (1, 16, 8, 12, 12, 3, 1, 1, (0, 0, 0, 0), 1, "i8", "i8"),        # Winograd, no padding
    (1, 16, 8, 12, 12, 3, 1, 1, (1, 1, 1, 1), 1, "i16", "i8"),       # i16 input: direct fallback
])
def test_conv_plan_paths(case):
    N, C, O, H, W, k, s, d, pads, g, xk, wk = case
    rng = np.random.default_rng(C * 1000 + O)
    if xk == "i32":
        x = rng.integers(-2 ** 28, 2 ** 28, size=(N, C, H, W)).astype(np.int32)
        pv = 2 ** 27
    elif xk == "i16":
        x = rng.integers(-20000, 20001, size=(N, C, H, W)).astype(np.int16)
        pv = -7
    else:
        xt = np.uint8 if xk == "u8" else np.int8
        x = rand_q(rng, (N, C, H, W), xt)
        x.reshape(-1)[0] = qrange(xt)[0]
        pv = int(rng.integers(*qrange(xt)))
    w = _weights(rng, wk, (O, C // g, k, k))
    b = rng.integers(-2 ** 20, 2 ** 20, size=O)
    _check_plan(x, w, b, pads, pv, (s, s), (d, d), g)
    if wk in ("i8max", "sparse"):      # int8 weights: always float32, chunked iff 128*Σ|w| >= 2**24
        plan = kernels.ConvPlan(w, b, pads, pv, s, d, g)
        plan(x)
        (eng,) = plan.weights._plans.values()
        assert eng.dtype is np.float32
        assert (len(eng.chunks) > 1) == (128 * plan.weights.S >= 2 ** 24)
        if wk == "i8max":
            assert len(eng.chunks) > 1
    if k == 3 and s == d == g == 1 and xk != "i32":          # Winograd-eligible
        with _kernel_knobs(_WINO_MIN_TILES=1):
            plan = kernels.ConvPlan(w, b, pads, pv, s, d, g)
            np.testing.assert_array_equal(plan(x), conv_ref(x, w, b, pads, pv, (s, s), (d, d), g))
            (eng,) = plan._wino._plans.values()
            if xk in ("i8", "u8") and wk in ("i8", "sparse"):      # else it may fall back
                assert eng is not None
                assert (len(eng) > 1) == (C == 512 and wk == "i8")


@settings(max_examples=300, **SETTINGS)
@given(st.sampled_from(["f32", "f64", "i64", "i32"]), st.integers(0, 40), st.sampled_from(
    ["per_tensor", "per_channel"]), st.integers(0, 62), st.sampled_from([np.int8, np.uint8, np.int16]),
    st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_requant_parts_equal_reference(kind, mag, mode, shift, out_t, loose, seed):
    """act_native_parts / requant_ort_parts == act_native / requant_ort on acc + extra,
    including accumulators that wrap int32, huge shifts and loose bounds (fallbacks)."""
    rng = np.random.default_rng(seed)
    O = int(rng.integers(1, 9))
    hi_acc = min(2 ** min(mag, 24) if kind == "f32" else 2 ** mag, 2 ** 40)
    acc = rng.integers(-hi_acc, hi_acc + 1, size=(2, O, 5))
    extra = rng.integers(-2 ** min(mag, 33), 2 ** min(mag, 33) + 1, size=O)
    total = acc + extra[None, :, None]
    a = {"f32": F32, "f64": np.float64, "i64": np.int64, "i32": np.int32}[kind]
    if kind == "i32":
        acc = np.clip(acc, -2 ** 31, 2 ** 31 - 1)
        total = acc + extra[None, :, None]
    acc_in = acc.astype(a)
    if kind == "f32":
        assert (acc_in.astype(np.int64) == acc).all()
    acc_bound = int(np.abs(acc).max()) * (3 if loose else 1)
    bound = int(np.abs(total).max()) * (3 if loose else 1)
    mult = rng.integers(0, 2 ** 31, size=O) if mode == "per_channel" else int(rng.integers(0, 2 ** 31))
    qmin, qmax = qrange(out_t)
    zp = int(rng.integers(qmin, qmax + 1))
    kw = dict(acc_bound=acc_bound, bound=bound, axis=1, out_dtype=out_t)
    got = nx.act_native_parts(acc_in, extra, mult, shift, zp, qmin, qmax, **kw)
    assert got.dtype == out_t
    np.testing.assert_array_equal(got, nx.act_native(total, mult, shift, zp, qmin, qmax).astype(out_t))
    scale = (rng.uniform(0.1, 10, O) * 2.0 ** -mag).astype(F32) if mode == "per_channel" \
        else F32(rng.uniform(0.1, 10) * 2.0 ** -mag)
    got = nx.requant_ort_parts(acc_in, extra, scale, zp, qmin, qmax, **kw)
    assert got.dtype == out_t
    np.testing.assert_array_equal(got, nx.requant_ort(total, scale, zp, qmin, qmax).astype(out_t))


@settings(max_examples=200, **SETTINGS)
@given(st.sampled_from([np.int8, np.uint8, np.int16]), st.sampled_from([np.int8, np.uint8]),
       st.integers(0, 2 ** 31 - 1), st.integers(0, 2 ** 31 - 1), st.integers(0, 60), st.booleans(),
       st.integers(0, 2 ** 32 - 1))
def test_add_native_byte_output_equals_int64(xt, out_t, mA, mB, shift, bcast, seed):
    """add_native_mults with a one-byte output (float64 path where exact, int64 otherwise) equals
    the int64 formula, for any multipliers, shift, zero points and a broadcast operand."""
    rng = np.random.default_rng(seed)
    lo, hi = qrange(xt) if xt != np.int16 else (-3000, 3000)
    a = rng.integers(lo, hi + 1, size=(1, 3, 4, 5)).astype(xt)
    b = rng.integers(lo, hi + 1, size=(1, 3, 1, 1) if bcast else a.shape).astype(xt)
    za, zb = (int(v) for v in rng.integers(lo, hi + 1, 2))
    qmin, qmax = qrange(out_t)
    zc = int(rng.integers(qmin, qmax + 1))
    got = nx.add_native_mults(a, b, za, zb, mA, mB, shift, zc, qmin, qmax, out_dtype=out_t)
    want = nx.add_native_mults(a, b, za, zb, mA, mB, shift, zc, qmin, qmax)
    assert got.dtype == out_t and want.dtype == np.int64
    np.testing.assert_array_equal(got, want.astype(out_t))


@pytest.mark.parametrize("window", ["full", "columns", "rows_and_columns", "transposed", "fc_2d", "conv1d_3d"])
def test_parts_rescale_on_strided_accumulators(window):
    """The compiled rescale reads accumulators in the layouts the kernels hand it: whole arrays,
    a column window of a wide GEMM buffer, a row+column window (odd Winograd output), a
    non-contiguous transpose (copied), and 2-D / 3-D accumulators (FC, Conv1D)."""
    rng = np.random.default_rng(3)
    buf = rng.integers(-2 ** 20, 2 ** 20, size=(2, 5, 9, 13)).astype(F32)
    acc = {"full": buf, "columns": buf[..., :10], "rows_and_columns": buf[:, :, :7, :11],
           "transposed": buf.transpose(0, 1, 3, 2), "fc_2d": buf[0, :, 0, :].T,
           "conv1d_3d": buf[:, :, 0, :]}[window]
    O = acc.shape[1]
    extra = rng.integers(-2 ** 20, 2 ** 20, O)
    mult = rng.integers(2 ** 29, 2 ** 31, O)
    scale = rng.uniform(1e-6, 1e-5, O).astype(F32)
    total = acc.astype(np.int64) + extra.reshape([1, O] + [1] * (acc.ndim - 2))
    kw = dict(acc_bound=2 ** 20, bound=2 ** 21, axis=1, out_dtype=np.int8)
    np.testing.assert_array_equal(nx.act_native_parts(acc, extra, mult, 36, 3, -128, 127, **kw),
                                  nx.act_native(total, mult, 36, 3, -128, 127))
    np.testing.assert_array_equal(nx.requant_ort_parts(acc, extra, scale, 3, -128, 127, **kw),
                                  nx.requant_ort(total, scale, 3, -128, 127))


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
@pytest.mark.parametrize("m", [2 ** 31 - 1, -2 ** 31, 1])
@pytest.mark.parametrize("shift", [0, 31, 46, 62])
def test_parts_rescale_at_the_int32_limits(dtype, m, shift):
    """The compiled rescale loops at the edges of their int64 arithmetic: sums acc + extra at
    +-(2**31 - 1), extreme multipliers, shifts 0..62 -- equal to act_native / requant_ort."""
    top = 2 ** 31 - 1
    acc = np.array([top - 5, top - 6, -top + 4, 0, 5, -5, top // 3, -(top // 7), 12345]).reshape(1, 1, -1)
    extra = np.array([5])
    for out_t in (np.int8, np.uint8, np.int16, np.int32):
        qmin, qmax = qrange(out_t) if out_t != np.int32 else (-2 ** 31, 2 ** 31 - 1)
        zp = (qmin + qmax) // 2
        kw = dict(acc_bound=top - 1, bound=top, axis=1, out_dtype=out_t)
        got = nx.act_native_parts(acc.astype(dtype), extra, m, shift, zp, qmin, qmax, **kw)
        want = nx.act_native(acc + 5, m, shift, zp, qmin, qmax).astype(out_t)
        assert got.dtype == out_t
        np.testing.assert_array_equal(got, want)
        scale = np.float32(2.0 ** -shift * abs(m))
        got = nx.requant_ort_parts(acc.astype(dtype), extra, scale, zp, qmin, qmax, **kw)
        np.testing.assert_array_equal(got, nx.requant_ort(acc + 5, scale, zp, qmin, qmax).astype(out_t))


@settings(max_examples=40, **SETTINGS)
@given(st.integers(1, 8), st.integers(1, 3000), st.integers(1, 40), st.booleans(),
       st.sampled_from(["i8", "i16big"]), st.integers(0, 2 ** 32 - 1))
def test_fc_acc_equals_int64_reference(M, K, O, u8, wkind, seed):
    rng = np.random.default_rng(seed)
    x = rand_q(rng, (M, K), np.uint8 if u8 else np.int8)
    if wkind == "i8":
        w = rand_q(rng, (O, K), np.int8).astype(np.int16) - int(rng.integers(-5, 6))
    else:
        w = rng.integers(-32768, 32768, size=(O, K)).astype(np.int16)
    b = rng.integers(-2 ** 20, 2 ** 20, size=O)
    got = kernels.fc_acc(x, w, b)
    ref = np.einsum("mk,ok->mo", x.astype(np.int64), w.astype(np.int64)) + b
    np.testing.assert_array_equal(got, ref)


def test_pool_sum_and_maxpool_small():
    x = np.arange(16, dtype=np.int8).reshape(1, 1, 4, 4)
    s, c = kernels.pool_sum(x, 2, 2, (0, 0, 0, 0), False, 1)
    np.testing.assert_array_equal(s[0, 0], [[6, 14], [38, 46]])
    np.testing.assert_array_equal(c, [[4, 4], [4, 4]])
    s, c = kernels.pool_sum(x, 3, 2, (1, 1, 1, 1), False, 0)
    np.testing.assert_array_equal(c, [[4, 6], [6, 9]])
    assert s[0, 0, 0, 0] == 0 + 1 + 4 + 5
    s2, c2 = kernels.pool_sum(x, 3, 2, (1, 1, 1, 1), True, 0)
    np.testing.assert_array_equal(s2, s)
    assert (c2 == 9).all()
    m = kernels.maxpool(x - 20, 3, 2, (1, 1, 1, 1))
    assert m.dtype == np.int8
    np.testing.assert_array_equal(m[0, 0], [[5 - 20, 7 - 20], [13 - 20, 15 - 20]])


# ----------------------------------------------------------------------------- QLinearConv

def qconv_ort_and_native(x, xs, xz, w, ws, wz, ys, yz, bias, geo, qmin, qmax):
    """What the torq compiler + NSS simulator compute for QLinearConv, in both modes."""
    w_adj = w.astype(np.int16) - np.asarray(wz, np.int16).reshape(-1, 1, 1, 1)
    bias_adj = bias.astype(np.int64) - int(xz) * w_adj.reshape(w.shape[0], -1).sum(axis=1)
    acc = kernels.conv2d_acc(x, w_adj, bias_adj, geo["pads"], int(xz), geo["s"], geo["d"],
                             geo["g"])
    y_ort = nx.requant_ort(acc, nx.ort_requant_scale(nx.dq_scale(xs, ws), ys), int(yz), qmin, qmax, axis=1)
    mult, shift = nx.conv_rescale(nx.dq_scale(xs, ws), ys)
    y_nat = nx.act_native(acc, mult, shift, int(yz), qmin, qmax, axis=1)
    return acc, y_ort, y_nat


@settings(max_examples=250, **SETTINGS)
@given(conv_geometry(), st.sampled_from([np.uint8, np.int8]), st.booleans(),
       st.integers(0, 9), st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_qlinearconv_vs_ort(geo, xt, per_channel, dyadic_roll, with_bias, seed):
    rng = np.random.default_rng(seed)
    dyadic = dyadic_roll < 3
    N, C, O, g = geo["N"], geo["C"], geo["O"], geo["g"]
    x = rand_q(rng, (N, C, geo["H"], geo["W"]), xt)
    w = rng.integers(-127, 128, size=(O, C // g, *geo["k"])).astype(np.int8)
    qmin, qmax = qrange(xt)
    xz = xt(rng.integers(qmin, qmax + 1))
    yz = xt(rng.integers(qmin, qmax + 1))
    xs = pick_scale(rng, -3, -1, dyadic)
    if per_channel:
        ws = np.array([pick_scale(rng, -3, -1.3, dyadic) for _ in range(O)], F32)
        wz = np.zeros(O, np.int8)
    else:
        ws = pick_scale(rng, -3, -1.3, dyadic)
        wz = np.int8(rng.integers(-8, 9) if rng.random() < 0.5 else 0)
    bias = (rng.integers(-20000, 20000, size=O) if with_bias else np.zeros(O)).astype(np.int32)
    # output scale from the accumulator spread, so outputs use the range (some saturate)
    w_adj = w.astype(np.int64) - np.asarray(wz, np.int64).reshape(-1, 1, 1, 1)
    acc_est = conv_ref(x.astype(np.int64) - int(xz), w_adj, bias, geo["pads"], 0, geo["s"],
                       geo["d"], g)
    spread = float(np.abs(acc_est).mean() + 1) * float(xs) * float(np.max(ws))
    ys = pick_scale(rng, np.log10(spread / 60), np.log10(spread / 15), dyadic)

    ky, kx = geo["k"]
    pl, pr, pt, pb = geo["pads"]
    node = helper.make_node(
        "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"] + (["b"] if with_bias else []),
        ["y"], kernel_shape=[ky, kx], strides=list(geo["s"]), dilations=list(geo["d"]),
        pads=[pt, pl, pb, pr], group=g)
    inits = dict(xs=F32(xs), xz=xz, w=w, ws=ws, wz=wz, ys=F32(ys), yz=yz)
    if with_bias:
        inits["b"] = bias
    (y,) = run_ort([node], {"x": x}, inits, {"y": xt})

    acc, y_ort, y_nat = qconv_ort_and_native(x, xs, xz, w, ws, wz, ys, yz, bias, geo, qmin, qmax)
    # zero-point folding (w' = w - wz, bias' = B - xz*Σw', pad with xz) == Σ(x-xz)(w-wz) + B
    np.testing.assert_array_equal(acc, acc_est)
    key = "conv" + ("_po2" if dyadic else "")
    assert_exact(key, y_ort, y)
    wsv = np.broadcast_to(np.asarray(ws, F32), (O,))
    check_native(key, y, y_nat, lambda idx: nx.explain_diffs(
        acc[idx], [((xs, wsv[o]), (ys,)) for o in idx[1]]))


def test_qlinearconv_resnet_layer_vs_ort():
    """One realistic big layer: 3x3 64->64 @56, uint8 activations, per-channel weights."""
    rng = np.random.default_rng(7)
    geo = dict(pads=(1, 1, 1, 1), s=(1, 1), d=(1, 1), g=1)
    x = rng.integers(0, 256, size=(1, 64, 56, 56)).astype(np.uint8)
    w = rng.integers(-127, 128, size=(64, 64, 3, 3)).astype(np.int8)
    ws = (rng.uniform(0.5, 2, 64) * 2e-3).astype(F32)
    xs, ys, xz, yz = F32(0.02), F32(0.9), np.uint8(131), np.uint8(120)
    bias = rng.integers(-5000, 5000, 64).astype(np.int32)
    wz = np.zeros(64, np.int8)
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                            ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    (y,) = run_ort([node], {"x": x}, dict(xs=xs, xz=xz, w=w, ws=ws, wz=wz, ys=ys, yz=yz,
                                          b=bias), {"y": np.uint8})
    acc, y_ort, y_nat = qconv_ort_and_native(x, xs, xz, w, ws, wz, ys, yz, bias, geo, 0, 255)
    assert_exact("conv_resnet", y_ort, y)
    assert 0.05 < np.mean((y > 0) & (y < 255))       # not all saturated
    check_native("conv_resnet", y, y_nat, lambda idx: nx.explain_diffs(
        acc[idx], [((xs, ws[o]), (ys,)) for o in idx[1]]))


# ----------------------------------------------------------------------------- MatMul / QGemm

def _matmul_operands(rng, a_shape, Nn, xt, per_col, dyadic):
    """Random QLinearMatMul / QGemm operands: a [..., K] (xt), b [K, N] int8, zero points, scales
    (per column or per tensor; a per-tensor b zero point half the time) and w' = (b - bz)^T."""
    qmin, qmax = qrange(xt)
    K = a_shape[-1]
    a = rand_q(rng, a_shape, xt)
    b = rng.integers(-127, 128, size=(K, Nn)).astype(np.int8)
    az, yz = xt(rng.integers(qmin, qmax + 1)), xt(rng.integers(qmin, qmax + 1))
    xs = pick_scale(rng, -3, -1, dyadic)
    if per_col:
        bs = np.array([pick_scale(rng, -3, -1.3, dyadic) for _ in range(Nn)], F32)
        bz = np.zeros(Nn, np.int8)
    else:
        bs = pick_scale(rng, -3, -1.3, dyadic)
        bz = np.int8(rng.integers(-8, 9) if rng.random() < 0.5 else 0)
    w_adj = (b.astype(np.int16) - np.asarray(bz, np.int16)).T           # [N, K]
    return a, b, az, yz, xs, bs, bz, w_adj


@settings(max_examples=150, **SETTINGS)
@given(st.integers(1, 16), st.sampled_from([1, 8, 27, 64, 200, 513]), st.integers(1, 40),
       st.sampled_from([np.uint8, np.int8]), st.booleans(), st.booleans(), st.integers(0, 9),
       st.integers(0, 2 ** 32 - 1))
def test_qlinearmatmul_vs_ort(M, K, Nn, xt, per_col, batched, dyadic_roll, seed):
    rng = np.random.default_rng(seed)
    dyadic = dyadic_roll < 3
    qmin, qmax = qrange(xt)
    a, b, az, yz, xs, bs, bz, w_adj = _matmul_operands(rng, (2, M, K) if batched else (M, K), Nn, xt,
                                                       per_col, dyadic)
    bias_adj = -int(az) * w_adj.astype(np.int64).sum(axis=1)
    acc = kernels.fc_acc(a, w_adj, bias_adj)                            # [..., N]
    spread = float(np.abs(acc).mean() + 1) * float(xs) * float(np.max(bs))
    ys = pick_scale(rng, np.log10(spread / 60), np.log10(spread / 15), dyadic)
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    (y,) = run_ort([node], {"a": a}, {"as": xs, "az": az, "b": b, "bs": bs, "bz": bz, "ys": ys,
                                      "yz": yz}, {"y": xt})
    y_ort = nx.requant_ort(acc, nx.ort_requant_scale(nx.dq_scale(xs, bs), ys), int(yz), qmin, qmax, axis=-1)
    key = "matmul" + ("_po2" if dyadic else "")
    assert_exact(key, y_ort, y)
    mult, shift = nx.conv_rescale(nx.dq_scale(xs, bs), ys)
    y_nat = nx.act_native(acc, mult, shift, int(yz), qmin, qmax, axis=-1)
    bsv = np.broadcast_to(np.asarray(bs, F32), (Nn,))
    check_native(key, y, y_nat, lambda idx: nx.explain_diffs(
        acc[idx], [((xs, bsv[n]), (ys,)) for n in idx[-1]]))


@settings(max_examples=150, **SETTINGS)
@given(st.integers(1, 16), st.sampled_from([1, 8, 27, 64, 200, 513]), st.integers(1, 40),
       st.sampled_from([np.uint8, np.int8]), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from([1.0, 1.0, 0.5, 0.7]), st.integers(0, 9), st.integers(0, 2 ** 32 - 1))
def test_qgemm_vs_ort(M, K, Nn, xt, per_col, trans_b, with_bias, alpha, dyadic_roll, seed):
    rng = np.random.default_rng(seed)
    dyadic = dyadic_roll < 3
    qmin, qmax = qrange(xt)
    a, b, az, yz, xs, bs, bz, w_adj = _matmul_operands(rng, (M, K), Nn, xt, per_col, dyadic)
    bias = rng.integers(-20000, 20000, size=Nn).astype(np.int32)
    bias_adj = (bias.astype(np.int64) if with_bias else 0) - int(az) * w_adj.astype(
        np.int64).sum(axis=1)
    acc = kernels.fc_acc(a, w_adj, bias_adj)
    spread = float(np.abs(acc).mean() + 1) * float(xs) * float(np.max(bs)) * alpha
    ys = pick_scale(rng, np.log10(spread / 60), np.log10(spread / 15), dyadic)
    ins = ["a", "as", "az", "b", "bs", "bz", "c" if with_bias else "", "ys", "yz"]
    node = helper.make_node("QGemm", ins, ["y"], domain="com.microsoft", alpha=alpha,
                            transB=int(trans_b))
    inits = {"as": xs, "az": az, "b": b.T.copy() if trans_b else b, "bs": bs, "bz": bz,
             "ys": ys, "yz": yz}
    if with_bias:
        inits["c"] = bias
    (y,) = run_ort([node], {"a": a}, inits, {"y": xt})
    y_ort = nx.requant_ort(acc, nx.ort_requant_scale(nx.dq_scale(xs, bs, alpha), ys), int(yz), qmin, qmax,
                           axis=-1)
    key = "qgemm" + ("_po2" if dyadic else "")
    assert_exact(key, y_ort, y)
    # native: the compiler's rescale of the dq scale fl32(fl32(alpha*xs)*ws) (canonicalize makes
    # QGemm a DQ -> Gemm -> Q whose bias scale is that product)
    mult, shift = nx.conv_rescale(nx.dq_scale(xs, bs, alpha), ys)
    y_nat = nx.act_native(acc, mult, shift, int(yz), qmin, qmax, axis=-1)
    bsv = np.broadcast_to(np.asarray(bs, F32), (Nn,))
    check_native(key, y, y_nat, lambda idx: nx.explain_diffs(
        acc[idx], [((F32(alpha), xs, bsv[n]), (ys,)) for n in idx[-1]]))


# ----------------------------------------------------------------------------- QLinearAdd

ADD_LAYOUTS = {
    "same": ((2, 5, 6, 7), (2, 5, 6, 7)),
    "b_chan": ((2, 5, 6, 7), (1, 5, 1, 1)),
    "a_chan": ((1, 5, 1, 1), (2, 5, 6, 7)),
    "b_scalar": ((2, 5, 6, 7), (1,)),
    "b_rows": ((2, 5, 6, 7), (1, 1, 6, 7)),
    "b_col1": ((2, 5, 6, 7), (2, 5, 6, 1)),
    "a_rows": ((1, 1, 6, 7), (2, 5, 6, 7)),
    "tail1": ((2, 5, 6, 1), (2, 5, 1, 1)),
    "a_0d": ((), (2, 5, 6, 7)),
    "both_1": ((1,), (1,)),
    "chan_chan": ((2, 5, 1, 1), (1, 5, 1, 1)),
    "pairs_general": "pairs",
    "pairs_a_scalar": ((256, 1), (1, 256)),
    "pairs_b_scalar": ((1, 256), (256, 1)),
}


@settings(max_examples=150, **SETTINGS)
@given(st.sampled_from(sorted(ADD_LAYOUTS)), st.sampled_from([np.uint8, np.int8]),
       st.integers(0, 9), st.integers(0, 2 ** 32 - 1))
def test_qlinearadd_vs_ort(layout, xt, dyadic_roll, seed):
    rng = np.random.default_rng(seed)
    dyadic = dyadic_roll < 3
    qmin, qmax = qrange(xt)
    lay = ADD_LAYOUTS[layout]
    allv = np.arange(qmin, qmax + 1)
    if lay == "pairs":              # every (a, b) pair, same shape -> general spans
        a = np.repeat(allv, 256).astype(xt)
        b = np.tile(allv, 256).astype(xt)
    elif layout.startswith("pairs"):
        a = allv.reshape(lay[0]).astype(xt)
        b = allv.reshape(lay[1]).astype(xt)
    else:
        a, b = rand_q(rng, lay[0], xt), rand_q(rng, lay[1], xt)
    za, zb, zc = (xt(rng.integers(qmin, qmax + 1)) for _ in range(3))
    sa, sb = pick_scale(rng, -2.5, -0.5, dyadic), pick_scale(rng, -2.5, -0.5, dyadic)
    sc = F32((float(sa) + float(sb)) * rng.uniform(0.4, 1.5))
    if dyadic:
        sc = F32(2.0 ** round(np.log2(sc)))
    node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"],
                            domain="com.microsoft")
    (y,) = run_ort([node], {"a": a, "b": b},
                   dict(sa=sa, za=za, sb=sb, zb=zb, sc=sc, zc=zc), {"y": xt})
    key = "add" + ("_po2" if dyadic else "")
    y_ort = nx.add_ort(a, b, sa, za, sb, zb, sc, zc, qmin, qmax)
    assert_exact(key, y_ort, y)
    y_nat = nx.add_native_mults(a, b, za, zb, *nx.add_multipliers(sa, sb, sc), zc, qmin, qmax)
    ab, bb = np.broadcast_arrays(a, b)
    check_native(key, y, y_nat, lambda idx: nx.explain_add_diffs(
        ab[idx], bb[idx], sa, za, sb, zb, sc))


@settings(max_examples=60, **SETTINGS)
@given(st.sampled_from(["general", "a_scalar", "b_scalar"]), st.sampled_from([0, 128, 200]),
       st.integers(0, 9), st.integers(0, 2 ** 32 - 1))
def test_add_ort_table_equals_formula(layout, shift, dyadic_roll, seed):
    """add_ort's cached pair table (large int operands) == the float32 / FMA formula; values
    outside the table domain (shift 200) take the formula path."""
    rng = np.random.default_rng(seed)
    big, chan = (2, 8, 33, 32), (1, 8, 1, 1)          # 16896 outputs: table path
    sa_shape, sb_shape = {"general": (big, big), "a_scalar": (chan, big), "b_scalar": (big, chan)}[layout]
    a = rng.integers(-128, 128, size=sa_shape) + shift
    b = rng.integers(-128, 128, size=sb_shape) + shift
    dyadic = dyadic_roll < 3
    sa, sb = pick_scale(rng, -2.5, -0.5, dyadic), pick_scale(rng, -2.5, -0.5, dyadic)
    sc = F32((float(sa) + float(sb)) * rng.uniform(0.4, 1.5))
    za, zb, zc = (int(rng.integers(-128, 128)) + shift for _ in range(3))
    qmin, qmax = -128 + shift, 127 + shift
    got = nx.add_ort(a, b, sa, za, sb, zb, sc, zc, qmin, qmax)
    shape = np.broadcast_shapes(a.shape, b.shape)
    ref = nx.ort._add_ort_formula(np.broadcast_to(a, shape).astype(F32), np.broadcast_to(b, shape).astype(F32),
                              nx.ort_broadcast_mode(a.shape, b.shape), sa, za, sb, zb, sc, zc, qmin, qmax)
    assert got.dtype == np.int64 and got.shape == shape
    np.testing.assert_array_equal(got, ref)


# ----------------------------------------------------------------------------- pools

@settings(max_examples=200, **SETTINGS)
@given(st.sampled_from([np.uint8, np.int8]), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 3), st.integers(1, 3), st.booleans(), st.booleans(), st.integers(0, 4),
       st.integers(0, 9), st.integers(0, 2 ** 32 - 1))
def test_qlinearaveragepool_vs_ort(xt, kh, kw, sh, sw, cip, same_qparams, pad_roll,
                                   global_roll, seed):
    rng = np.random.default_rng(seed)
    qmin, qmax = qrange(xt)
    N, C = int(rng.integers(1, 3)), int(rng.integers(1, 6))
    H, W = int(rng.integers(kh, 13)), int(rng.integers(kw, 13))
    if pad_roll == 0:
        pads = (0, 0, 0, 0)
    else:
        pads = tuple(int(rng.integers(0, k)) for k in (kw, kw, kh, kh))   # l, r, t, b
    if global_roll == 0:            # kernel == image, no pads: ORT's global fallback path
        kh, kw, H, W, pads = H, W, H, W, (0, 0, 0, 0)
    x = rand_q(rng, (N, C, H, W), xt)
    xs = pick_scale(rng, -2.5, -0.5, False)
    xz = xt(rng.integers(qmin, qmax + 1))
    if same_qparams:                 # what quantize_static emits: S = 1/count -> exact ties
        ys, yz = xs, xz
    else:
        ys, yz = pick_scale(rng, -2.5, -0.5, False), xt(rng.integers(qmin, qmax + 1))
    pl, pr, pt, pb = pads
    node = helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"],
                            domain="com.microsoft", kernel_shape=[kh, kw], strides=[sh, sw],
                            pads=[pt, pl, pb, pr], count_include_pad=int(cip))
    (y,) = run_ort([node], {"x": x}, dict(xs=xs, xz=xz, ys=ys, yz=yz), {"y": xt})
    key = "avgpool" + ("_ys=xs" if same_qparams else "")
    y_ort = nx.avgpool_ort(x, (kh, kw), (sh, sw), pads, cip, xs, xz, ys, yz, qmin, qmax)
    assert_exact(key, y_ort, y)
    sums, counts = kernels.pool_sum(x, (kh, kw), (sh, sw), pads, cip, int(xz))
    is_global = (kh, kw) == (H, W) and pads == (0, 0, 0, 0)     # as the runtime decides
    y_nat = nx.avgpool_native(sums, counts, xs, ys, int(yz), qmin, qmax, ties_even=True,
                              zp_before_rounding=not is_global)
    cnt = np.broadcast_to(counts, sums.shape)
    check_native(key, y, y_nat, lambda idx: nx.explain_diffs(
        sums[idx], [((xs,), (ys, int(c))) for c in cnt[idx]]))


@settings(max_examples=100, **SETTINGS)
@given(st.sampled_from([np.uint8, np.int8]), st.integers(1, 16), st.integers(1, 16),
       st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_qlinearglobalaveragepool_vs_ort(xt, H, W, same_qparams, seed):
    rng = np.random.default_rng(seed)
    qmin, qmax = qrange(xt)
    N, C = int(rng.integers(1, 3)), int(rng.integers(1, 64))
    x = rand_q(rng, (N, C, H, W), xt)
    xs = pick_scale(rng, -2.5, -0.5, False)
    xz = xt(rng.integers(qmin, qmax + 1))
    ys, yz = (xs, xz) if same_qparams else (pick_scale(rng, -2.5, -0.5, False),
                                             xt(rng.integers(qmin, qmax + 1)))
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"],
                            domain="com.microsoft", channels_last=0)
    (y,) = run_ort([node], {"x": x}, dict(xs=xs, xz=xz, ys=ys, yz=yz), {"y": xt})
    sums, _ = kernels.pool_sum(x, (H, W), 1, (0, 0, 0, 0), False, int(xz))
    y_ort = nx.global_avgpool_ort(sums, H * W, xs, ys, int(yz), qmin, qmax)
    key = "global_avgpool"
    assert_exact(key, y_ort, y)
    y_nat = nx.avgpool_native(sums, H * W, xs, ys, int(yz), qmin, qmax, ties_even=True)
    check_native(key, y, y_nat, lambda idx: nx.explain_diffs(sums[idx], ((xs,), (ys, H * W))))


@settings(max_examples=100, **SETTINGS)
@given(st.sampled_from([np.uint8, np.int8]), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 3), st.integers(1, 3), st.integers(1, 2), st.integers(1, 2),
       st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_maxpool_int8_vs_ort(xt, kh, kw, sh, sw, dh, dw, padded, seed):
    rng = np.random.default_rng(seed)
    ekh, ekw = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    pads = tuple(int(rng.integers(0, k)) for k in (kw, kw, kh, kh)) if padded else (0, 0, 0, 0)
    pl, pr, pt, pb = pads
    H = int(rng.integers(max(1, ekh - pt - pb), 14))
    W = int(rng.integers(max(1, ekw - pl - pr), 14))
    x = rand_q(rng, (int(rng.integers(1, 3)), int(rng.integers(1, 6)), H, W), xt)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[kh, kw], strides=[sh, sw],
                            dilations=[dh, dw], pads=[pt, pl, pb, pr])
    (y,) = run_ort([node], {"x": x}, {}, {"y": xt})
    got = kernels.maxpool(x, (kh, kw), (sh, sw), pads, (dh, dw))
    assert got.dtype == y.dtype
    assert_exact("maxpool", got, y)


# ----------------------------------------------------------------------------- Q / DQ

def qdq_params(rng, xt, per_axis):
    """(channels, scale, zero point) for a QuantizeLinear / DequantizeLinear test, per-tensor or per-axis."""
    qmin, qmax = qrange(xt)
    C = int(rng.integers(1, 8))
    if per_axis:
        return C, np.array([pick_scale(rng, -3, 0, False) for _ in range(C)], F32), \
            rng.integers(qmin, qmax + 1, size=C).astype(xt)
    return C, pick_scale(rng, -3, 0, False), xt(rng.integers(qmin, qmax + 1))


@settings(max_examples=100, **SETTINGS)
@given(st.sampled_from([np.uint8, np.int8]), st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_quantizelinear_vs_ort(xt, per_axis, seed):
    rng = np.random.default_rng(seed)
    qmin, qmax = qrange(xt)
    C, s, z = qdq_params(rng, xt, per_axis)
    s_b = np.broadcast_to(np.asarray(s, F32), (C,)).reshape(1, C, 1, 1)
    x = (rng.normal(size=(2, C, 5, 7)) * 80 * s_b).astype(F32)
    # exact half-way quotients, huge values and infinities
    x.reshape(-1)[:40] = ((rng.integers(-150, 150, 40) + 0.5) * np.asarray(s, F32).reshape(-1)[0]
                          ).astype(F32)
    x.reshape(-1)[40:44] = [np.inf, -np.inf, 3e38, -3e38]
    if per_axis:
        x[:, :, 0, 0] = ((rng.integers(-150, 150, (2, C)) + 0.5) * s_b[0, :, 0, 0]).astype(F32)
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1)
    (y,) = run_ort([node], {"x": x}, {"s": s, "z": z}, {"y": xt})
    assert_exact("quantize", nx.quantize_ort(x, s, z, qmin, qmax, axis=1), y)
    if not per_axis:
        # NPU bf16 fallback: within the bound its arithmetic implies (numerics/bf16.py)
        qb = nx.quantize_fallback(x, s, z, qmin, qmax)
        d = np.abs(qb - y.astype(np.int64))
        assert (d <= nx.quantize_fallback_bound(x, s, z)).all()
        STATS["quantize_bf16"]["elements"] += d.size
        STATS["quantize_bf16"]["diff"] += int(np.count_nonzero(d))
        STATS["quantize_bf16"]["max_diff"] = max(STATS["quantize_bf16"]["max_diff"], int(d.max()))


@settings(max_examples=100, **SETTINGS)
@given(st.sampled_from([np.uint8, np.int8]), st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_dequantizelinear_vs_ort(xt, per_axis, seed):
    rng = np.random.default_rng(seed)
    qmin, qmax = qrange(xt)
    C, s, z = qdq_params(rng, xt, per_axis)
    q = rand_q(rng, (2, C, 4, 5), xt)
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)
    (y,) = run_ort([node], {"q": q}, {"s": s, "z": z}, {"y": np.float32})
    got = nx.dequantize_ort(q, s, z, axis=1)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), y.view(np.uint32))
    if not per_axis:
        db = nx.dequantize_fallback(q, s, z)
        bound = nx.dequantize_fallback_bound(np.abs(q.astype(np.int64) - int(z)), s)
        assert (np.abs(db.astype(np.float64) - y) <= bound).all()
        STATS["dequantize_bf16"]["elements"] += y.size
        STATS["dequantize_bf16"]["diff"] += int(np.count_nonzero(db != y))
