"""The native engine's add / global average pool / max pool (runtime/native/eltwise.c) against the
reference engine: bit-identical for random shapes, zero points, multipliers and shifts (both
sides of the 32-bit fast path), windows, strides, dilations and paddings, both roundings."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torq.program import Port, Program, Step
from torq.runtime.native import build
from torq.runtime.nss import Simulator

pytestmark = pytest.mark.skipif(build._compiler() is None, reason="no C compiler: the native engine is the reference")


def _same(steps, consts, ins, out_shape, out_slot, n_slots):
    p = Program([Port(f"x{i}", i, "i8", x.shape) for i, x in enumerate(ins)],
                [Port("y", out_slot, "i8", tuple(out_shape))], steps, consts, n_slots)
    ref, nat = Simulator(p, "reference"), Simulator(p, "native")
    assert nat.native_steps == len(steps)
    for rounding in ("native", "ort"):
        want = ref.run(ins, rounding)[0]
        for threads in (1, 2):
            got = nat.run(ins, rounding, threads=threads)[0]
            assert got.dtype == want.dtype and np.array_equal(got, want), (rounding, threads)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 300), shift=st.sampled_from([0, 7, 20, 31, 32, 36, 52, 60]),
       clamp=st.booleans(), ties=st.booleans())
def test_add(seed, size, shift, clamp, ties):
    """``ties``: NTE (exact Add ratios) with multipliers on a 2**-6 grid, so 1 in 64 sums is an x.5 tie."""
    rng = np.random.default_rng(seed)
    za, zb, zc = (int(v) for v in rng.integers(-128, 128, 3))
    ties = ties and 6 <= shift <= 46
    hi = 1 << min(shift, 31)
    ma, mb = (int(v) for v in rng.integers(-hi + 1, hi, 2))
    if ties:
        ma, mb = (int(v) << (shift - 6) for v in rng.integers(1, min(1 << 12, hi >> (shift - 6)), 2))
    lo_hi = (int(zc), 100) if clamp else (-128, 127)
    attrs = {"input_zps": [za, zb], "weights": [ma, mb], "shift_factor": shift, "output_zp": zc,
             "output_min": max(-128, min(lo_hi[0], 100)), "output_max": lo_hi[1],
             "ort_input_scales": [0.02, 0.03], "ort_output_scale": [0.04], "ort_kernel": "QLinearAdd",
             "ort_zp_shift": 0, "round_ties_even": int(ties)}
    shape = (1, 3, size, 2)
    x, y = (rng.integers(-128, 128, shape).astype(np.int8) for _ in range(2))
    _same([Step("torq_hl.add", [0, 1], 2, attrs, shape, "i8", "1:1", "Add")], {}, [x, y], shape, 2, 3)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), hw=st.tuples(st.integers(1, 12), st.integers(1, 12)), c=st.integers(1, 70),
       ties=st.booleans(), same_scale=st.booleans())
def test_global_avgpool(seed, hw, c, ties, same_scale):
    rng = np.random.default_rng(seed)
    xs = np.float32(rng.uniform(0.01, 0.1))
    ys = xs if same_scale else np.float32(rng.uniform(0.01, 0.1))
    attrs = {"kernel": list(hw), "stride": [1, 1], "pad": [0, 0, 0, 0], "count_include_pad": 0,
             "input_zp": int(rng.integers(-128, 128)), "output_zp": int(rng.integers(-128, 128)),
             "output_min": -128, "output_max": 127, "ort_input_scale": [xs], "ort_output_scale": [ys],
             "ort_zp_shift": 0, "round_ties_even": int(ties)}
    x = rng.integers(-128, 128, (2, c, *hw)).astype(np.int8)
    _same([Step("torq_hl.avg_pool2d", [0], 1, attrs, (2, c, 1, 1), "i8", "1:1", "GlobalAveragePool")], {}, [x],
          (2, c, 1, 1), 1, 2)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.tuples(st.integers(1, 4), st.integers(1, 4)),
       s=st.tuples(st.integers(1, 3), st.integers(1, 3)), d=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       hw=st.tuples(st.integers(1, 20), st.integers(1, 150)), c=st.integers(1, 5))
def test_maxpool(seed, k, s, d, hw, c):
    rng = np.random.default_rng(seed)
    pads = [int(v) for v in rng.integers(0, 2, 4)]              # left, right, top, bottom
    OH = (hw[0] + pads[2] + pads[3] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    OW = (hw[1] + pads[0] + pads[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    if OH <= 0 or OW <= 0:
        return
    attrs = {"kernel": list(k), "stride": list(s), "dilation": list(d), "pad": pads}
    x = rng.integers(-128, 128, (1, c, *hw)).astype(np.int8)
    _same([Step("torq_hl.maxpool2d", [0], 1, attrs, (1, c, OH, OW), "i8", "1:1", "MaxPool")], {}, [x],
          (1, c, OH, OW), 1, 2)
