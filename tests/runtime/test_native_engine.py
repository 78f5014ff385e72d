"""The native engine against the reference engine (the oracle): bit-identical outputs for
random convolutions / depthwise / fully connected layers, whole models, both roundings, the
AVX512-VNNI and the portable build, any batch split and thread count; per-op fallback."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torq
from torq import numerics, zoo
from torq.errors import TorqError
from torq.program import Port, Program, Step
from torq.runtime import native
from torq.runtime.native import build
from torq.runtime.nss import Simulator

# Where a C compiler exists the native engine must build: a broken build is a failure, not a
# silent fall back to the reference engine.
pytestmark = pytest.mark.skipif(build._compiler() is None, reason="no C compiler: the native engine is the reference")


def test_the_native_engine_builds_and_reports_its_isa():
    assert native.library() is not None, native.why()
    assert native.vnni() == ("avx512_vnni" in build.cpu_flags() and build.isa() == "native")

ISAS = ["native", "portable"]


def _conv_step(O, C, k, stride, dil, pads, groups, zp_in, ties_even, out_range=(-128, 127), rng=None):
    Cg = C // groups
    kh, kw = k
    attrs = {"input_zp": zp_in, "weight_zp": 0, "output_zp": int(rng.integers(-20, 20)),
             "output_min": out_range[0], "output_max": out_range[1], "shift_factor": int(rng.choice([20, 28, 36])),
             "groups": groups, "pad": np.array(pads), "stride": np.array(stride), "dilation": np.array(dil),
             "round_ties_even": int(ties_even),
             "ort_dq_scale": rng.uniform(1e-4, 3e-3, O).astype(np.float32),
             "ort_output_scale": np.array([0.05], np.float32)}
    w = rng.integers(-128, 128, (O, Cg, kh, kw)).astype(np.int8)
    sb = np.zeros(2 * O, np.int32)
    sb[0::2] = rng.integers(-50000, 50000, O)
    shift = attrs["shift_factor"]
    sb[1::2] = rng.integers(1 << (shift - 16), 1 << (shift - 8), O)     # scales 2**-16 .. 2**-8
    op = "torq_hl.depthwise_conv2d" if Cg == 1 and groups == O else "torq_hl.conv2d"
    return attrs, w, sb, op


def _program(x_shape, w, sb, attrs, op, out_shape):
    steps = [Step(op, [1, 2, 0], 3, attrs, tuple(out_shape), "i8", "1:1", "Conv")]
    return Program([Port("x", 0, "i8", tuple(x_shape))], [Port("y", 3, "i8", tuple(out_shape))], steps,
                   {1: w, 2: sb}, 4)


def _out_size(n, k, s, d, p0, p1):
    return (n + p0 + p1 - d * (k - 1) - 1) // s + 1


def _run_both(p, x):
    ref = Simulator(p, "reference")
    for rounding in ("native", "ort"):
        a = ref.run([x], rounding)[0]
        for threads in (2, 1):
            nat = Simulator(p, "native")     # fresh output buffers: an output a kernel misses is not stale-right
            assert nat.engine == "native"
            for _ in range(2):               # step by step (recording), then replayed
                b = nat.run([x], rounding, threads=threads)[0]
                assert b.dtype == a.dtype and np.array_equal(a, b), (rounding, threads)


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), depthwise=st.booleans(), k=st.sampled_from([1, 3, 5]),
       stride=st.sampled_from([1, 2]), dil=st.sampled_from([1, 2]), C=st.integers(1, 20), hw=st.integers(3, 23),
       ties=st.booleans(), n=st.integers(1, 2))
def test_conv_bit_identical(isa, monkeypatch, seed, depthwise, k, stride, dil, C, hw, ties, n):
    monkeypatch.setenv("TORQ_NATIVE_ISA", isa)
    rng = np.random.default_rng(seed)
    groups = C if depthwise else int(rng.choice([g for g in (1, 2, 3) if C % g == 0]))
    O = C if depthwise else groups * int(rng.integers(1, 12))
    pads = [int(v) for v in rng.integers(0, k, 4)]          # (left, right, top, bottom)
    OH = _out_size(hw, k, stride, dil, pads[2], pads[3])
    OW = _out_size(hw + 1, k, stride, dil, pads[0], pads[1])
    if OH <= 0 or OW <= 0:
        return
    attrs, w, sb, op = _conv_step(O, C, (k, k), (stride, stride), (dil, dil), pads, groups,
                                  int(rng.integers(-128, 128)), ties, rng=rng)
    x = rng.integers(-128, 128, (n, C, hw, hw + 1)).astype(np.int8)
    _run_both(_program(x.shape, w, sb, attrs, op, (n, O, OH, OW)), x)


@pytest.mark.parametrize("k, stride, dil, hw", [
    ((3, 3), (1, 1), (1, 1), (5, 150)),     # rows of 150: 10 vectors, register tiles of 8 + 2
    ((3, 3), (2, 2), (1, 1), (9, 300)),     # stride 2 over 64-byte loads
    ((5, 5), (3, 3), (1, 1), (13, 70)),     # stride 3: the scalar gather
    ((1, 7), (1, 1), (1, 9), (3, 90)),      # taps 54 bytes apart: a row split in two windows
    ((7, 2), (1, 2), (2, 1), (20, 33)),
])
def test_depthwise_geometries(k, stride, dil, hw):
    """Depthwise shapes the random test does not reach: long rows, stride 3, taps far apart."""
    rng = np.random.default_rng(sum(k) + sum(hw))
    C = 5
    pads = [1, 2, 0, 1]
    OH = _out_size(hw[0], k[0], stride[0], dil[0], pads[2], pads[3])
    OW = _out_size(hw[1], k[1], stride[1], dil[1], pads[0], pads[1])
    attrs, w, sb, op = _conv_step(C, C, k, stride, dil, pads, C, int(rng.integers(-128, 128)), False, rng=rng)
    x = rng.integers(-128, 128, (1, C, *hw)).astype(np.int8)
    _run_both(_program(x.shape, w, sb, attrs, op, (1, C, OH, OW)), x)


@pytest.mark.parametrize("C, hw, n", [(300, (5, 7), 2), (130, (9, 9), 1), (64, (2, 3), 3)])
def test_depthwise_planes_in_ranges(C, hw, n):
    """Many small channel planes: the threads claim ranges of planes (across images too)."""
    rng = np.random.default_rng(C)
    attrs, w, sb, op = _conv_step(C, C, (3, 3), (1, 1), (1, 1), [1, 1, 1, 1], C, 7, True, rng=rng)
    x = rng.integers(-128, 128, (n, C, *hw)).astype(np.int8)
    _run_both(_program(x.shape, w, sb, attrs, op, (n, C, *hw)), x)


@pytest.mark.parametrize("amx", ["1", "0"])
@pytest.mark.parametrize("Cg, k, stride, pads, hw", [
    (8, 1, 1, [0, 0, 0, 0], (3, 150)),        # rows of 150: the 64-pixel channel-quad packing
    (40, 1, 1, [0, 0, 0, 0], (2, 200)),
    (44, 1, 1, [0, 0, 0, 0], (9, 14)),        # an unpadded 1x1: the planes packed as one row
    (12, 1, 2, [0, 0, 0, 0], (9, 70)),
    (36, 3, 1, [1, 1, 1, 1], (4, 131)),
    (6, 3, 2, [1, 0, 1, 0], (5, 260)),
])
def test_conv_long_rows(amx, monkeypatch, Cg, k, stride, pads, hw):
    """Convolutions over rows long enough for the 64-pixel packing path, VNNI and AMX."""
    monkeypatch.setenv("TORQ_NATIVE_AMX", amx)
    monkeypatch.setattr(build, "_state", {})
    rng = np.random.default_rng(Cg * 1000 + hw[1])
    O = 19
    OH = _out_size(hw[0], k, stride, 1, pads[2], pads[3])
    OW = _out_size(hw[1], k, stride, 1, pads[0], pads[1])
    attrs, w, sb, op = _conv_step(O, Cg, (k, k), (stride, stride), (1, 1), pads, 1, int(rng.integers(-128, 128)),
                                  False, rng=rng)
    x = rng.integers(-128, 128, (1, Cg, *hw)).astype(np.int8)
    _run_both(_program(x.shape, w, sb, attrs, op, (1, O, OH, OW)), x)


@pytest.mark.parametrize("amx", ["1", "0"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), k=st.sampled_from([1, 3]), stride=st.sampled_from([1, 2]),
       dil=st.sampled_from([1, 2]), Cg=st.sampled_from([32, 36, 64, 100]), groups=st.sampled_from([1, 2]),
       Og=st.sampled_from([1, 17, 40, 70, 150]), hw=st.integers(3, 40), n=st.integers(1, 2))
def test_wide_conv_bit_identical(amx, monkeypatch, seed, k, stride, dil, Cg, groups, Og, hw, n):
    """Convolutions with >= 32 input channels per group: AMX-INT8 tiles where the CPU has them
    (TORQ_NATIVE_AMX=1), the VNNI kernel otherwise; both against the reference. Output channels
    up to 150 and maps up to 40 x 43: the threads split whole 32-channel blocks, or pixel ranges."""
    monkeypatch.setenv("TORQ_NATIVE_AMX", amx)
    monkeypatch.setattr(build, "_state", {})            # rebind the library with this setting
    rng = np.random.default_rng(seed)
    C, O = Cg * groups, Og * groups
    pads = [int(v) for v in rng.integers(0, k, 4)]
    OH = _out_size(hw, k, stride, dil, pads[2], pads[3])
    OW = _out_size(hw + 3, k, stride, dil, pads[0], pads[1])
    if OH <= 0 or OW <= 0:
        return
    attrs, w, sb, op = _conv_step(O, C, (k, k), (stride, stride), (dil, dil), pads, groups,
                                  int(rng.integers(-128, 128)), False, rng=rng)
    x = rng.integers(-128, 128, (n, C, hw, hw + 3)).astype(np.int8)
    _run_both(_program(x.shape, w, sb, attrs, op, (n, O, OH, OW)), x)


@pytest.mark.parametrize("isa", ISAS)
def test_fully_connected_bit_identical(isa, monkeypatch):
    monkeypatch.setenv("TORQ_NATIVE_ISA", isa)
    rng = np.random.default_rng(1)
    for M, K, O in ((1, 1280, 1000), (3, 7, 5), (2, 64, 17)):
        attrs, _, sb, _ = _conv_step(O, K, (1, 1), (1, 1), (1, 1), [0] * 4, 1, 0, False, rng=rng)
        w = rng.integers(-128, 128, (O, K)).astype(np.int8)
        steps = [Step("torq_hl.fully_connected", [1, 2, 0], 3, attrs, (M, O), "i8", "1:1", "Gemm")]
        p = Program([Port("x", 0, "i8", (M, K))], [Port("y", 3, "i8", (M, O))], steps, {1: w, 2: sb}, 4)
        _run_both(p, rng.integers(-128, 128, (M, K)).astype(np.int8))


def test_requant_matches_numerics_at_the_edges():
    """kernels.c's requantisation (vector and scalar lanes) == torq.numerics, both modes."""
    rng = np.random.default_rng(2)
    edges = np.array([0, 1, -1, 2**31 - 1, -2**31, 2**24, 2**24 + 1, -2**24 - 1, 12345, -12345], np.int64)
    acc = np.concatenate([edges, rng.integers(-2**31, 2**31, 1000), rng.integers(-3000, 3000, 1000)])
    for shift in (0, 1, 4, 20, 31, 32, 36, 52, 53, 60):      # 32..52: the high-half fast path
        for mult in (1, 3, 2**31 - 1, -(2**31), min(2**31 - 1, 1 << max(0, shift - 8)), min(2**31 - 1, 1 << max(0, shift - 1))):
            for even in (0, 1):
                for zp, lo, hi in ((0, -128, 127), (-128, -128, 127), (17, -5, 90)):
                    want = numerics.act_native(acc, mult, shift, zp, lo, hi, ties_even=bool(even))
                    assert np.array_equal(_c_requant(acc, mult, 1.0, shift, even and shift > 0, zp, lo, hi, 0), want)
    for scale in (np.float32(0.0123), np.float32(2.0**-7), np.float32(1e-9), np.float32(3.5)):
        want = numerics.requant_ort(acc, scale, 3, -128, 127)
        assert np.array_equal(_c_requant(acc, 1, scale, 0, 0, 3, -128, 127, 1), want)


def _c_requant(acc, mult, scale, shift, even, zp, lo, hi, ort):
    adj = np.zeros(1, np.int32)
    m = np.array([mult], np.int32)
    s = np.array([scale], np.float32)
    rq = build.TorqRq(adj.ctypes.data, m.ctypes.data, s.ctypes.data, shift, int(even), zp, lo, hi, ort)
    a32 = acc.astype(np.int32)                        # the kernels see the accumulator wrapped to int32
    out = np.empty(a32.size, np.int8)
    native.library().torq_requant_i8(a32.ctypes.data, a32.size, rq, out.ctypes.data)
    return out.astype(np.int64)


@pytest.mark.parametrize("model", ["mobilenet_v2", "resnet18"])
def test_zoo_models_identical_any_batch_and_threads(model):
    fp32 = getattr(zoo, model)(32)
    q = torq.quantize(fp32, full_integer=True, per_channel=True, num_calib=2)
    from torq.evaluate.engines import with_batch
    c = torq.compile(with_batch(q, 2))
    ref, nat = Simulator(c.program, "reference"), Simulator(c.program, "native")
    rng = np.random.default_rng(3)
    xs = [rng.integers(-128, 128, c.program.inputs[0].shape).astype(np.int8) for _ in range(3)]
    for rounding in ("native", "ort"):
        want = [ref.run([x], rounding)[0] for x in xs]
        for threads in (1, 2):
            got = nat.run_many([[x] for x in xs], rounding, threads=threads)
            assert all(np.array_equal(a, b[0]) for a, b in zip(want, got)), (rounding, threads)


def test_weights_outside_int8_fall_back_to_the_reference():
    rng = np.random.default_rng(4)
    attrs, w, sb, op = _conv_step(4, 3, (3, 3), (1, 1), (1, 1), [1] * 4, 1, 5, False, rng=rng)
    w = w.astype(np.int16) * 3                           # |w| up to 384: not an int8 kernel
    x = rng.integers(-128, 128, (1, 3, 6, 6)).astype(np.int8)
    _run_both(_program(x.shape, w, sb, attrs, op, (1, 4, 6, 6)), x)


def test_unknown_engine_is_a_one_line_error():
    p = _program((1, 1, 2, 2), np.ones((1, 1, 1, 1), np.int8), np.array([0, 1], np.int32),
                 _conv_step(1, 1, (1, 1), (1, 1), (1, 1), [0] * 4, 1, 0, False, rng=np.random.default_rng(0))[0],
                 "torq_hl.conv2d", (1, 1, 2, 2))
    with pytest.raises(TorqError, match=r"^--engine must be one of native, reference, not 'fast'$"):
        Simulator(p, "fast")


def test_a_failing_build_leaves_the_reference_engine(monkeypatch, tmp_path):
    """A compiler that fails: no library, ``why()`` says so, and a native Simulator runs the
    reference kernels (same results); nothing half-built is left in the cache."""
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setenv("TORQ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_state", {})
    assert native.library() is None and "failed" in native.why()
    rng = np.random.default_rng(3)
    attrs, w, sb, op = _conv_step(4, 4, (3, 3), (1, 1), (1, 1), [1, 1, 1, 1], 1, 0, False, rng=rng)
    x = rng.integers(-128, 128, (1, 4, 5, 5)).astype(np.int8)
    p = _program(x.shape, w, sb, attrs, op, (1, 4, 5, 5))
    sim = Simulator(p, "native")
    assert sim.engine == "reference"
    assert np.array_equal(sim.run([x])[0], Simulator(p, "reference").run([x])[0])
    assert not [f for f in tmp_path.rglob("*") if f.is_file()]
