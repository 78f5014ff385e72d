"""Recorded runs of bf16 programs (runtime/native/plan.py): after the first run the float
kernels' calls (conv, depthwise, 1x1 read in place, max pool, add, global average pool, fully
connected, its bias add) replay in one C call. Fresh inputs must give the reference engine's
bits every time; a replay that misses a new input address must be seen; an input read in place
at the recording must not be read so from an array that has no memory after it."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import torq
from torq.graph.bf16 import convert_to_bf16
from torq.runtime.native import build as native_build
from torq.runtime.native import float_ops
from torq.runtime.native import plan as native_plan
from torq.runtime.nss import Simulator

import bf16_model as M

from .test_bf16_kernels import build, rand

pytestmark = pytest.mark.skipif(native_build._compiler() is None, reason="no C compiler: no native engine")


def _net(rng, c, c2, hw, n):
    """conv 3x3 + relu -> 1x1 conv (its input read in place) -> add -> depthwise 3x3 / 2 and max
    pool 2 / 2 -> add -> global average pool -> flatten -> gemm (+ its bias: a broadcast add)."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1] * 4), helper.make_node("Relu", ["c"], ["c1"]),
             helper.make_node("Conv", ["c1", "w2", "b2"], ["c2"]), helper.make_node("Add", ["c1", "c2"], ["a"]),
             helper.make_node("Conv", ["a", "wd", "bd"], ["d"], pads=[1] * 4, strides=[2, 2], group=c2),
             helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Add", ["d", "p"], ["s"]), helper.make_node("GlobalAveragePool", ["s"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]), helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    inits = {"w1": rand(rng, (c2, c, 3, 3), 0.5), "b1": rand(rng, (c2,), 0.3), "w2": rand(rng, (c2, c2, 1, 1), 0.5),
             "b2": rand(rng, (c2,), 0.3), "wd": rand(rng, (c2, 1, 3, 3), 0.5), "bd": rand(rng, (c2,), 0.3),
             "wf": rand(rng, (n, c2), 0.5), "bf": rand(rng, (n,), 0.3)}
    return build(nodes, [("x", [1, c, hw, hw])], [("y", [1, n])], inits)


def _sims(model):
    program = torq.compile(convert_to_bf16(model)).program
    nat = Simulator(program, "native")
    assert nat.engine == "native"
    return Simulator(program, "reference"), nat


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=st.integers(1, 4), c2=st.integers(1, 20), hw=st.sampled_from([4, 6, 10, 16]), n=st.integers(1, 40),
       seed=st.integers(0, 2**16))
def test_replayed_bf16_runs_equal_the_reference(c, c2, hw, n, seed):
    rng = np.random.default_rng(seed)
    ref, nat = _sims(_net(rng, c, c2, hw, n))
    for threads in (1, 2):
        xs = [M.bf16(rand(rng, (1, c, hw, hw))) for _ in range(3)]
        for x in xs + xs[:1]:                # the first run records, the others replay; x0 again last
            assert np.array_equal(nat.run([x.copy()], threads=threads)[0], ref.run([x])[0]), threads
    (plan,) = nat._plans.values()
    # every step but the flatten (data movement, in Python) replays
    assert plan.replayed == len(nat.kernels) - 1, (plan.replayed, [k.step.op for k in nat.kernels])


def test_a_stale_bf16_input_address_is_caught(monkeypatch):
    """Fault injection: a replay that does not patch the fresh input's address computes on the
    first run's input; the comparison with the reference engine must see it."""
    rng = np.random.default_rng(3)
    ref, nat = _sims(_net(rng, 2, 5, 6, 7))
    x0 = M.bf16(rand(rng, (1, 2, 6, 6)))
    nat.run([x0])
    monkeypatch.setattr(native_plan, "_data", lambda a, at=x0.ctypes.data: at)     # every input "is" x0
    x1 = M.bf16(rand(rng, (1, 2, 6, 6)))
    assert not np.array_equal(nat.run([x1.copy()])[0], ref.run([x1])[0])


def test_an_input_read_in_place_needs_memory_after_it_at_replay():
    """A 1x1 conv reads its input in place when SLACK floats follow it (float_conv.c reads past
    the last pixel). Recorded so, a replay on a fresh input without that memory records anew."""
    rng = np.random.default_rng(4)
    model = build([helper.make_node("Conv", ["x", "w", "b"], ["y"])], [("x", [1, 3, 5, 5])], [("y", [1, 4, 5, 5])],
                  {"w": rand(rng, (4, 3, 1, 1)), "b": rand(rng, (4,))})
    ref, nat = _sims(model)
    x = M.bf16(rand(rng, (1, 3, 5, 5)))
    buf = np.zeros(x.size + float_ops.SLACK, np.float32)
    roomy = buf[:x.size].reshape(x.shape)
    roomy[...] = x
    assert float_ops._slack_follows(roomy) and not float_ops._slack_follows(x.copy())
    assert np.array_equal(nat.run([roomy])[0], ref.run([x])[0])
    (first,) = nat._plans.values()
    assert first.replayed == 1
    assert np.array_equal(nat.run([x.copy()])[0], ref.run([x])[0])
    (second,) = nat._plans.values()
    assert second is not first               # recorded anew: not read in place
    roomy2 = buf[:x.size].reshape(x.shape)   # a fresh view of memory with room: replays
    assert np.array_equal(nat.run([roomy2])[0], ref.run([x])[0])
    assert next(iter(nat._plans.values())) is second
