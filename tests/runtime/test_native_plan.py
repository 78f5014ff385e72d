"""Recorded native runs (runtime/native/plan.py): after the first run of a program a thread
replays its native kernel calls in one C call. The replayed runs must equal the reference engine
on fresh inputs every time (the input's address is patched in), with a step that runs in Python
(a reference fallback) between native segments, both roundings, threads 1 and 2, any batch."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torq.program import Port, Program, Step
from torq.runtime.native import build
from torq.runtime.native import plan as native_plan
from torq.runtime.nss import Simulator

from .test_native_engine import _conv_step

pytestmark = pytest.mark.skipif(build._compiler() is None, reason="no C compiler: the native engine is the reference")


def _chain(rng, n, C, hw, fallback: bool, ties: bool):
    """x -> conv A -> conv B (weights outside int8 when ``fallback``: a reference step) -> conv C
    -> add(C, A) -> y; every conv 3x3 'same', C channels."""
    steps, consts, slot = [], {}, 1
    prev, outs = 0, []
    shape = (n, C, hw, hw)
    for i in range(3):
        attrs, w, sb, op = _conv_step(C, C, (3, 3), (1, 1), (1, 1), [1, 1, 1, 1], 1, int(rng.integers(-5, 5)),
                                      ties, rng=rng)
        if i == 1 and fallback:
            w = w.astype(np.int16) * 3
        consts[slot], consts[slot + 1] = w, sb
        steps.append(Step(op, [slot, slot + 1, prev], slot + 2, attrs, shape, "i8", f"1:{i}", "Conv"))
        prev = slot + 2
        outs.append(prev)
        slot += 3
    add = {"input_zps": [3, -7], "weights": [int(rng.integers(1 << 20, 1 << 21)), int(rng.integers(1 << 20, 1 << 21))],
           "shift_factor": 22, "output_zp": 2, "output_min": -128, "output_max": 127,
           "ort_input_scales": [0.02, 0.03], "ort_output_scale": [0.04], "ort_kernel": "QLinearAdd", "ort_zp_shift": 0}
    steps.append(Step("torq_hl.add", [outs[2], outs[0]], slot, add, shape, "i8", "1:9", "Add"))
    return Program([Port("x", 0, "i8", shape)], [Port("y", slot, "i8", shape)], steps, consts, slot + 1)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 3), C=st.integers(1, 40), hw=st.integers(2, 20),
       fallback=st.booleans(), ties=st.booleans())
def test_replayed_runs_equal_the_reference(seed, n, C, hw, fallback, ties):
    rng = np.random.default_rng(seed)
    p = _chain(rng, n, C, hw, fallback, ties)
    ref, nat = Simulator(p, "reference"), Simulator(p, "native")
    for rounding in ("native", "ort"):
        for threads in (1, 2):
            xs = [rng.integers(-128, 128, (n, C, hw, hw)).astype(np.int8) for _ in range(3)]
            for x in xs + xs[:1]:            # the first run records, the others replay; x0 again last
                want = ref.run([x], rounding)[0]
                got = nat.run([x], rounding, threads=threads)[0]
                assert np.array_equal(got, want), (rounding, threads)
    plans = list(nat._plans.values())
    # add is native in the native rounding only; the fallback conv always runs in Python
    assert max(pl.replayed for pl in plans) == (3 if fallback else 4)
    assert all(pl.replayed <= 4 for pl in plans)


def test_a_stale_input_address_is_caught(monkeypatch):
    """Fault injection: a replay that does not patch the fresh input's address computes on the
    first run's input. The comparison with the reference engine must see it."""
    rng = np.random.default_rng(5)
    p = _chain(rng, 1, 8, 9, False, False)
    ref, nat = Simulator(p, "reference"), Simulator(p, "native")
    x0 = rng.integers(-128, 128, (1, 8, 9, 9)).astype(np.int8)
    nat.run([x0])
    monkeypatch.setattr(native_plan, "_data", lambda a, at=x0.ctypes.data: at)     # every input "is" x0
    x1 = rng.integers(-128, 128, (1, 8, 9, 9)).astype(np.int8)
    assert not np.array_equal(nat.run([x1.copy()])[0], ref.run([x1])[0])


def test_an_input_of_another_layout_records_a_new_plan():
    rng = np.random.default_rng(6)
    p = _chain(rng, 2, 4, 6, True, False)
    ref, nat = Simulator(p, "reference"), Simulator(p, "native")
    x = rng.integers(-128, 128, (2, 4, 6, 12)).astype(np.int8)
    for xin in (np.ascontiguousarray(x[..., ::2]), x[..., ::2], np.ascontiguousarray(x[..., 1::2])):
        assert np.array_equal(nat.run([xin])[0], ref.run([xin])[0])
    assert len(nat._plans) == 2                  # contiguous and strided input: two plans


def test_operands_at_one_address_stay_in_python():
    """add(reshape(a), a): two operands from outside the segment at one address (a view and its
    base) could part in another run; such a segment runs in Python, with the same results."""
    rng = np.random.default_rng(7)
    chain = _chain(rng, 1, 4, 5, False, False)
    conv, add = chain.steps[0], chain.steps[-1]
    shape = conv.shape
    steps = [conv, Step("tensor.reshape", [conv.out], 20, {}, shape, "i8", "1:5", "Reshape"),
             Step(add.op, [20, conv.out], 21, add.attrs, shape, "i8", "1:9", "Add")]
    p = Program(chain.inputs, [Port("y", 21, "i8", shape)], steps, {k: chain.constants[k] for k in conv.args[:2]}, 22)
    ref, nat = Simulator(p, "reference"), Simulator(p, "native")
    for _ in range(3):
        x = rng.integers(-128, 128, shape).astype(np.int8)
        assert np.array_equal(nat.run([x])[0], ref.run([x])[0])
    (plan,) = nat._plans.values()
    assert plan.replayed == 1 and plan.segments[1:] == [1, 2]
