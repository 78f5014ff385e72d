"""The native bf16 kernels (runtime/native/float_conv.c) bit for bit against the independent model
(tests/bf16_model.py), over random shapes: groups and depthwise (with multipliers), stride,
dilation, padding, batch, inputs read in place (memory follows them) or copied, 1 and 2 threads,
the AVX-512 and the portable build; matmuls batched and broadcast, with and without bias."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torq.numerics import bf16_arith
from torq.runtime import native
from torq.runtime.native import float_ops
from torq.runtime.native.ops import _Outputs, set_threads

import bf16_model as M

ISAS = ["native", "portable"]


def bf(rng, shape, scale=1.0):
    return M.bf16(rng.standard_normal(shape) * scale)


def with_slack(x):
    """x in memory that float_conv.c may read past (as a native step's output is)."""
    buf = np.zeros(x.size + float_ops.SLACK, np.float32)
    y = buf[:x.size].reshape(x.shape)
    y[...] = x
    return y


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    monkeypatch.setenv("TORQ_NATIVE_ISA", request.param)
    if native.library() is None:
        pytest.skip(native.why())
    assert bool(native.library().torq_float_features()) == (request.param == "native" and "avx512f" in
                                                          native.build.cpu_flags())
    return request.param


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_conv_bit_exact(isa, data):
    d = data.draw
    depthwise = d(st.booleans())
    groups = d(st.integers(1, 3))
    cg = 1 if depthwise else d(st.integers(1, 4))
    og = d(st.integers(1, 2)) if depthwise else d(st.integers(1, 8))
    kh, kw, sh, sw = d(st.integers(1, 3)), d(st.integers(1, 3)), d(st.integers(1, 3)), d(st.integers(1, 2))
    dh, dw = d(st.integers(1, 2)), d(st.integers(1, 2))
    pad = [d(st.integers(0, 2)) for _ in range(4)]
    n, h, w = d(st.integers(1, 2)), d(st.integers(1, 9)), d(st.integers(1, 21))
    oh = (h + pad[2] + pad[3] - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pad[0] + pad[1] - dw * (kw - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        return
    rng = np.random.default_rng(d(st.integers(0, 2 ** 16)))
    c, o = groups * cg, groups * og
    x, wt, b = bf(rng, (n, c, h, w), 3.0), bf(rng, (o, cg, kh, kw)), rng.standard_normal(o).astype(np.float32)
    relu = d(st.booleans())
    attrs = {"groups": groups, "pad": pad, "stride": [sh, sw], "dilation": [dh, dw],
             "output_min": 0 if relu else bf16_arith.F32_MIN_BITS, "output_max": bf16_arith.F32_MAX_BITS}
    set_threads(d(st.integers(1, 2)))
    got = float_ops.FloatConv(wt, b, attrs, depthwise, True)(with_slack(x) if d(st.booleans()) else x)
    want = M.conv2d(x, wt, b, (sh, sw), pad, groups, 0.0 if relu else -math.inf, math.inf, (dh, dw))
    assert got is not None and np.array_equal(got.view(np.uint32), want.view(np.uint32))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 9), k=st.integers(1, 40), n=st.integers(1, 70), batch=st.sampled_from([(), (2,), (2, 3)]),
       broadcast=st.booleans(), bias=st.booleans(), threads=st.integers(1, 2), panels=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_matmul_bit_exact(isa, m, k, n, batch, broadcast, bias, threads, panels, seed):
    rng = np.random.default_rng(seed)
    x, y = bf(rng, batch + (m, k), 2.0), bf(rng, ((1,) if broadcast and batch else batch) + (k, n))
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    set_threads(threads)
    packed = float_ops.pack_panels(y) if panels and y.ndim == 2 else None        # a weight (fully connected)
    got = float_ops._matmul(native.library(), _Outputs(), x, y, b, -math.inf, math.inf, True, packed)
    bshape = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    xb = np.broadcast_to(x, bshape + (m, k)).reshape(-1, m, k)
    yb = np.broadcast_to(y, bshape + (k, n)).reshape(-1, k, n)
    want = np.stack([M.matmul(xi, yi, to_bf16=False) for xi, yi in zip(xb, yb)])
    want = M.bf16(want + (b if bias else np.float32(0))).reshape(got.shape)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_checks_see_one_element_unrounded(isa):
    """The comparison above fails for a conv whose output has one element short of its rounding."""
    rng = np.random.default_rng(4)
    x, w, b = bf(rng, (1, 3, 6, 6)), bf(rng, (4, 3, 3, 3)), rng.standard_normal(4).astype(np.float32)
    attrs = {"groups": 1, "pad": [1] * 4, "stride": [1, 1], "dilation": [1, 1],
             "output_min": bf16_arith.F32_MIN_BITS, "output_max": bf16_arith.F32_MAX_BITS}
    want = M.conv2d(x, w, b, (1, 1), (1,) * 4)
    good = np.array(float_ops.FloatConv(w, b, attrs, False, True)(x))
    raw = float_ops.FloatConv(w, b, attrs, False, False)(x)
    assert np.array_equal(good, want) and not np.array_equal(raw, want)
    i = int(np.flatnonzero(good.ravel() != raw.ravel())[0])
    good.reshape(-1)[i] = raw.reshape(-1)[i]
    assert np.count_nonzero(good != want) == 1


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.tuples(st.integers(1, 3), st.integers(1, 3)), s=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       d=st.tuples(st.integers(1, 2), st.integers(1, 2)), pad=st.lists(st.integers(0, 1), min_size=4, max_size=4),
       hw=st.tuples(st.integers(1, 12), st.integers(1, 40)), nan=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_max_pool_bit_exact(isa, k, s, d, pad, hw, nan, seed):
    """Max over each window with -inf padding, NaN propagating (an independent window loop)."""
    rng = np.random.default_rng(seed)
    x = bf(rng, (2, 3) + hw)
    if nan:
        x[1, 2, rng.integers(hw[0]), rng.integers(hw[1])] = np.nan
    pl, pr, pt, pb = pad
    oh = (hw[0] + pt + pb - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (hw[1] + pl + pr - d[1] * (k[1] - 1) - 1) // s[1] + 1
    if oh < 1 or ow < 1:
        return
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=-np.inf)
    want = np.empty((2, 3, oh, ow), np.float32)
    for p in range(oh):
        for q in range(ow):
            win = xp[:, :, p * s[0]:p * s[0] + d[0] * (k[0] - 1) + 1:d[0], q * s[1]:q * s[1] + d[1] * (k[1] - 1) + 1:d[1]]
            want[:, :, p, q] = np.where(np.isnan(win).any(axis=(2, 3)), np.nan, win.max(axis=(2, 3)))

    class Step:
        attrs = {"kernel": list(k), "stride": list(s), "dilation": list(d), "pad": pad}
        shape = (2, 3, oh, ow)
    set_threads(2)
    got = float_ops.FLOAT_MAKERS["maxpool2d"](Step, lambda args, r: None)([x], "native")
    assert got is not None and np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("depthwise", [False, True])
def test_threads_split_large_jobs_bit_exact(isa, depthwise, monkeypatch):
    """Jobs large enough for both threads (small ones run on one: float_threads) give the
    reference engine's bits (numpy, one pass per k) for any thread count."""
    from torq.runtime.kernels import float_gemm
    monkeypatch.setattr(float_ops.os, "getloadavg", lambda: (0.0, 0.0, 0.0))     # a quiet host: 2 threads
    set_threads(2)
    assert float_ops._threads() == 2
    monkeypatch.setattr(float_ops.os, "getloadavg", lambda: (9.0, 9.0, 9.0))     # oversubscribed: 1
    assert float_ops._threads() == 1
    monkeypatch.setattr(float_ops.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    rng = np.random.default_rng(7)
    c, o = (48, 48) if depthwise else (24, 40)
    x, w = bf(rng, (2, c, 37, 45), 2.0), bf(rng, (o, 1 if depthwise else c, 3, 3))
    b = rng.standard_normal(o).astype(np.float32)
    attrs = {"groups": 1, "pad": [1, 0, 2, 1], "stride": [1, 2], "dilation": [1, 1], "output_min": 0,
             "output_max": bf16_arith.F32_MAX_BITS}
    acc = float_gemm.conv_acc(x, w, attrs["pad"], attrs["stride"], attrs["dilation"], c if depthwise else 1)
    want = bf16_arith.finish(acc, b[None, :, None, None], 0.0, np.inf, "bf16")
    for threads in (1, 2):
        set_threads(threads)
        got = float_ops.FloatConv(w, b, attrs, depthwise, True)(x)
        assert np.array_equal(got, want), threads
    xm, ym = bf(rng, (3, 70, 90)), bf(rng, (90, 130))
    want = bf16_arith.finish(float_gemm.matmul_acc(xm, ym), np.float32(0), -np.inf, np.inf, "bf16")
    for threads in (1, 2):
        set_threads(threads)
        got = float_ops._matmul(native.library(), _Outputs(), xm, ym, None, -math.inf, math.inf, True)
        assert np.array_equal(got, want), threads


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_depthwise_read_in_rows_bit_exact(isa, data):
    """Depthwise layers of stride 2 (kernels to 5x5) and 3x3 ones of stride 1 (any width: several
    64-column tiles) read the input rows in place (float_depthwise.c, geometry ``dwrows``): the
    reference engine's bits, with an infinite weight now and then (a padded tap must still add
    inf * 0 = NaN)."""
    from torq.runtime.kernels import float_gemm
    d = data.draw
    s = d(st.sampled_from([1, 2]))
    kh, kw = d(st.integers(1, 5)), d(st.integers(1, 5))
    pad = [d(st.integers(0, 2)) for _ in range(4)]
    n, c, h = d(st.integers(1, 2)), d(st.integers(1, 12)), d(st.integers(1, 12))
    kh, kw = (3, 3) if s == 1 or d(st.booleans()) else (kh, kw)   # (3x3: float_depthwise.c reuses input rows)
    w = d(st.integers(1, 170))
    oh, ow = (h + pad[2] + pad[3] - kh) // s + 1, (w + pad[0] + pad[1] - kw) // s + 1
    if oh < 1 or ow < 1:
        return
    rng = np.random.default_rng(d(st.integers(0, 2 ** 16)))
    x, wt, b = bf(rng, (n, c, h, w), 3.0), bf(rng, (c, 1, kh, kw)), rng.standard_normal(c).astype(np.float32)
    if d(st.booleans()):
        wt[rng.integers(c), 0, rng.integers(kh), rng.integers(kw)] = np.inf
    attrs = {"groups": c, "pad": pad, "stride": [s, s], "dilation": [1, 1], "output_min": bf16_arith.F32_MIN_BITS,
             "output_max": bf16_arith.F32_MAX_BITS}
    set_threads(d(st.integers(1, 2)))
    elem = d(st.sampled_from(["bf16", "f32"]))          # f32 results show the accumulation order
    conv = float_ops.FloatConv(wt, b, attrs, True, elem == "bf16")
    got = conv(x)
    assert all(geo[0][0].dwrows for geo in conv.geoms.values())       # (the portable build ignores it)
    with np.errstate(invalid="ignore"):
        acc = float_gemm.conv_acc(x, wt, pad, [s, s], [1, 1], c)
        want = bf16_arith.finish(acc, b[None, :, None, None], -np.inf, np.inf, elem)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("s,w", [(1, 12), (2, 70)])
def test_depthwise_read_in_rows_adds_the_padding(isa, s, w):
    """An infinite weight on the corner tap: the outputs whose tap falls on the padding (top row,
    left column) are inf * 0 = NaN in the model, as with zero-filled planes; skipped taps would
    leave them finite."""
    from torq.runtime.kernels import float_gemm
    rng = np.random.default_rng(11)
    x, wt, b = bf(rng, (1, 2, 9, w)), bf(rng, (2, 1, 3, 3)), np.zeros(2, np.float32)
    wt[1, 0, 0, 0] = np.inf
    attrs = {"groups": 2, "pad": [1, 1, 1, 1], "stride": [s, s], "dilation": [1, 1],
             "output_min": bf16_arith.F32_MIN_BITS, "output_max": bf16_arith.F32_MAX_BITS}
    conv = float_ops.FloatConv(wt, b, attrs, True, True)
    got = conv(x)
    assert all(geo[0][0].dwrows for geo in conv.geoms.values())
    with np.errstate(invalid="ignore"):
        want = bf16_arith.finish(float_gemm.conv_acc(x, wt, attrs["pad"], [s, s], [1, 1], 2), b[None, :, None, None],
                                 -np.inf, np.inf, "bf16")
    assert np.isnan(want[0, 1, 0]).all() and np.isnan(want[0, 1, :, 0]).all()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 200), op=st.sampled_from(sorted(float_ops.BINARY_OPS)), bf16=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_binary_bit_exact(isa, n, op, bf16, seed):
    """add / sub / mul (16 lanes at a time, then the tail one by one): fl32(a op b), then bf16
    RNE, on values with ties, infinities, NaNs and subnormal results among them."""
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(n) * 4).astype(np.float32), (rng.standard_normal(n) * 4).astype(np.float32)
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0 + 2.0 ** -8, 3.0 * 2.0 ** -9,
                        2.0 ** -64, -3 * 2.0 ** -67, 3 * 2.0 ** -131, 2.0 ** -126], np.float32)   # subnormal results
    for arr in (a, b):
        k = rng.integers(0, n, n // 4)
        arr[k] = rng.choice(special, k.size)
    out = np.empty(n, np.float32)
    native.library().torq_binary_f32(a.ctypes.data, b.ctypes.data, out.ctypes.data, n, float_ops.BINARY_OPS[op],
                                     int(bf16), 1)
    with np.errstate(all="ignore"):
        y = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](a, b)
    want = M.bf16(y) if bf16 else y
    assert np.array_equal(np.isnan(out), np.isnan(want))
    assert np.array_equal(out.view(np.uint32)[~np.isnan(out)], want.view(np.uint32)[~np.isnan(want)])


def test_binary_rounds_subnormal_results(isa):
    """Products in the subnormal range round on their bits like any other value (a conversion
    that flushes subnormals to zero, as AVX512-BF16's does, must not be taken for them)."""
    a = (2.0 ** -64 * (1 + np.arange(32) / 37)).astype(np.float32)
    b = np.full(32, 2.0 ** -66 * 1.37, np.float32)         # products ~2^-130: bf16 subnormals
    out = np.empty(32, np.float32)
    native.library().torq_binary_f32(a.ctypes.data, b.ctypes.data, out.ctypes.data, 32, float_ops.BINARY_OPS["mul"],
                                     1, 1)
    want = M.bf16(a * b)
    assert np.all(want != 0) and np.all(np.abs(want) < np.finfo(np.float32).tiny)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
