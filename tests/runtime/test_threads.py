"""The simulator on several cores in one process (Simulator.run_many, NssEngine threads): every
call's result is exactly the sequential one, per-image results do not depend on how a batch is
split, the `ort` rounding stays bit-exact with ONNX Runtime, the per-op check still judges what
the threads executed, and the process BLAS setting comes back as it was."""
from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import torq
from torq import numerics, zoo
from torq.evaluate.engines import MAX_SUB_BATCH, NssEngine, OrtEngine, split_batch, with_batch
from torq.runtime.kernels import blas
from torq.runtime.nss import Simulator


@pytest.fixture(scope="module")
def fixed1():
    """MobileNetV2 at 32 px (random weights): conv, depthwise (both loops), add, pool, fc; batch 1."""
    m = with_batch(zoo.mobilenet_v2(32), 1)
    return torq.quantize(m, full_integer=True, per_channel=True, quant_format="qdq", num_calib=4)


@pytest.fixture(scope="module")
def qmodel(fixed1):
    """The same with a symbolic batch (the engines compile it for the sub-batch they choose)."""
    m = onnx.ModelProto()
    m.CopyFrom(fixed1)
    inits = {t.name for t in m.graph.initializer}
    for v in [i for i in m.graph.input if i.name not in inits] + list(m.graph.output):
        v.type.tensor_type.shape.dim[0].Clear()
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    return m


@pytest.fixture(scope="module")
def compiled2(qmodel):
    return torq.compile(with_batch(qmodel, 2))


def _images(n, seed=0):
    return np.random.default_rng(seed).integers(-128, 128, (n, 3, 32, 32)).astype(np.int8)


@pytest.mark.parametrize("rounding", ["native", "ort"])
def test_run_many_is_the_sequential_runs(compiled2, rounding):
    sim = compiled2.simulator
    calls = [[x] for x in _images(10, seed=1).reshape(5, 2, 3, 32, 32)]
    alone = [sim.run(c, rounding) for c in calls]
    together = sim.run_many(calls, rounding, threads=2)
    assert len(together) == len(calls)
    for a, b in zip(alone, together):
        assert len(a) == len(b) == 1 and a[0].dtype == b[0].dtype and np.array_equal(a[0], b[0])
    assert sim.run_many(calls[:1], rounding, threads=2)[0][0].tobytes() == alone[0][0].tobytes()


def test_engine_split_is_batch_invariant_and_ort_exact(qmodel):
    x = _images(7, seed=2)
    single = NssEngine(qmodel, 1, threads=1)(x)
    split = NssEngine(qmodel, 5, threads=2)                  # sub-batches of 3, last one padded
    assert (split.threads, split.sub) == (2, 3)
    assert np.array_equal(split(x), single)
    ort_nss = NssEngine(qmodel, 4, rounding="ort", threads=2)(x)
    ort_ref = OrtEngine(with_batch(qmodel, 7))(x)
    assert ort_nss.dtype == ort_ref.dtype and np.array_equal(ort_nss, ort_ref)
    assert NssEngine(qmodel, 3, threads=8).threads == 3      # never more threads than images


def test_a_lone_call_gets_every_core_inside_its_kernels(qmodel, monkeypatch):
    """Batch 1 is one simulator call: its native kernels get the engine's cores (not one thread,
    as one of several side-by-side sub-batches gets)."""
    seen = []
    for batch, want in ((1, [2]), (4, [1, 1])):
        engine = NssEngine(qmodel, batch, threads=2)
        orig = engine.simulator.run
        monkeypatch.setattr(engine.simulator, "run", lambda *a, **k: seen.append(a[3]) or orig(*a, **k))
        seen.clear()
        engine(_images(batch, seed=5))
        assert seen == want, batch


def test_a_fixed_batch_model_is_compiled_for_its_own_batch(fixed1):
    """Re-batching a fixed-batch model could silently change a batch-specific Reshape: the
    engines run it in its own batch (audit 3, B9: the default --batch 8 on a batch-1 model)."""
    x = _images(5, seed=4)
    engine = NssEngine(fixed1, 4, threads=2)
    assert engine.sub == 1 and engine.threads == 2
    assert np.array_equal(engine(x), NssEngine(fixed1, 1, threads=1)(x))
    assert OrtEngine(fixed1)(x).shape[0] == 5


def test_run_many_threads_really_run_the_calls(compiled2, monkeypatch):
    """The calls run in the pool's threads, and a fault injected into a compiled rescale loop in
    those threads only is seen: outputs differ from the clean sequential runs, and the per-op
    check of such a run reports the op that executed something other than its formula (the
    reference engine: the fault goes into its compiled rescale loop)."""
    sim = Simulator(compiled2.program, "reference")
    calls = [[x] for x in _images(8, seed=3).reshape(4, 2, 3, 32, 32)]
    clean = [sim.run(c)[0] for c in calls]
    orig, seen = numerics.native.act_loop, set()

    def faulty(*args, **kwargs):
        orig(*args, **kwargs)
        name = threading.current_thread().name
        seen.add(name)
        if name.startswith("torq-nss"):
            out = args[-1]
            out[0, 0, 0, 0] = out[0, 0, 0, 0] + 1 if out[0, 0, 0, 0] < 127 else 0
    monkeypatch.setattr(numerics.native, "act_loop", faulty)
    outs = [o[0] for o in sim.run_many(calls, threads=2)]
    assert any(n.startswith("torq-nss") for n in seen)
    assert any(not np.array_equal(a, b) for a, b in zip(outs, clean))
    checked = sim.run_many(calls, threads=2, explain=True)
    assert len(checked) == len(calls) and all(len(c) == 2 for c in checked)
    bad = [od for _, diffs in checked for od in diffs if od.mismatches]
    assert bad and not bad[0].explained and bad[0].op.startswith("torq_hl.")
    assert all(od.mismatches == 0 for od in sim.run(calls[0], "native", explain=True)[1])


def test_side_by_side_threads_run_on_a_cpu_each(compiled2):
    """run_many's threads are pinned one CPU each (woken unpinned on a loaded host they were put
    on the caller's CPU and ran one after the other); the caller's own affinity is unchanged."""
    import os
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("one usable CPU")
    sim = Simulator(compiled2.program, "reference")
    first, seen = sim.kernels[0], {}
    orig = first.fn

    def recording(args, rounding):
        seen[threading.current_thread().name] = os.sched_getaffinity(0)
        return orig(args, rounding)
    first.fn = recording
    try:
        sim.run_many([[x] for x in _images(8, seed=6).reshape(4, 2, 3, 32, 32)], threads=2)
    finally:
        first.fn = orig
    assert seen and all(len(cpus) == 1 and cpus <= before for cpus in seen.values())
    assert len(seen) < 2 or len(set().union(*seen.values())) == 2
    assert os.sched_getaffinity(0) == before


def _blas_threads():
    return max(lib["num_threads"] for lib in blas._blas().info())


def test_blas_setting_is_one_thread_inside_and_restored_after(compiled2):
    before = _blas_threads()
    sim = Simulator(compiled2.program, "reference")    # its GEMMs use BLAS; and every run calls every step
    calls = [[x] for x in _images(6, seed=4).reshape(3, 2, 3, 32, 32)]
    seen = []
    first = sim.kernels[0]
    orig = first.fn

    def recording(args, rounding):
        seen.append((threading.current_thread().name, _blas_threads()))
        return orig(args, rounding)
    first.fn = recording
    try:
        sim.run_many(calls, threads=3)
    finally:
        first.fn = orig
    assert len(seen) == 3 and all(n == 1 for _, n in seen)
    assert all(name.startswith("torq-nss") for name, _ in seen)
    assert _blas_threads() == before and not blas._state["active"] and blas._state["pinned"] == 0


def test_run_bookkeeping_with_nested_and_interleaved_threads():
    """Runs entered and left in any interleaving, nested in one thread: the last one out
    leaves no state behind, and while any run is active BLAS stays on one thread."""
    before = _blas_threads()
    entered, inside = threading.Barrier(2), []

    def run():
        with blas.single_thread_run():
            with blas.single_thread_run():                  # nested in the same thread
                entered.wait(timeout=10)
                inside.append(_blas_threads())
            entered.wait(timeout=10)
    with blas.single_thread_run(pinned=True):               # the caller's context, as run_many's
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert inside == [1, 1] and not blas._state["active"].get(threads[0].ident)
    assert _blas_threads() == before and not blas._state["active"] and blas._state["pinned"] == 0


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(1, 300), threads=st.integers(1, 64))
def test_split_batch_covers_the_batch_with_little_padding(batch, threads):
    used, sub = split_batch(batch, threads)
    calls = -(-batch // sub)
    assert 1 <= used <= min(batch, threads) and 1 <= sub <= max(MAX_SUB_BATCH, 1)
    assert calls * sub >= batch and calls * sub - batch < calls      # < one image per call padded
    assert calls >= used and (calls <= used or sub > MAX_SUB_BATCH // 2)
