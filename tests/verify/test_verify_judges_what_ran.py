"""verify judges the outputs the simulator executed (its fused / compiled fast paths), not a
recomputation: a fault injected into a compiled rescale loop makes it fail."""
from __future__ import annotations

import numpy as np
import pytest

import torq
from torq import numerics
from torq.runtime.native import ops as native_ops
from torq.runtime.nss import Simulator
from torq.verify import verify


@pytest.fixture(scope="module")
def compiled():
    from qmodels import conv_model, quantize
    rng = np.random.default_rng(2)
    m = conv_model(rng, 4, 8, 3, 1, 1, [1, 1, 1, 1], 1, True, False, (10, 10))
    return torq.compile(quantize(m, {"x": [1, 4, 10, 10]}, "qdq"))


def _faulty(orig, kind, calls):
    def loop(*args, **kwargs):
        orig(*args, **kwargs)
        out = args[-1]
        calls.append(1)
        if kind == "one element":
            out[0, 0, 0, 0] = out[0, 0, 0, 0] + 1 if out[0, 0, 0, 0] < 127 else 0
        else:
            out //= 2
    return loop


def test_clean_run_passes(compiled):
    res = verify(compiled, modes=("native", "ort"))
    assert res.ok
    assert {od.mode for od in res.op_diffs} == {"native", "ort"}
    assert all(od.mismatches == 0 for od in res.op_diffs)


@pytest.mark.parametrize("kind", ["one element", "halve"])
@pytest.mark.parametrize("loop,faulty_mode", [("native.act_loop", "native"), ("ort.requant_ort_loop", "ort")])
def test_fault_in_a_fast_path_fails_verify(compiled, monkeypatch, kind, loop, faulty_mode):
    monkeypatch.setattr(compiled, "_simulator", Simulator(compiled.program, "reference"))   # numpy fast paths
    module, name = loop.split(".")
    mod = getattr(numerics, module)
    calls: list = []
    monkeypatch.setattr(mod, name, _faulty(getattr(mod, name), kind, calls))
    for modes in [("native",), ("ort",), ("native", "ort")]:
        calls.clear()
        res = verify(compiled, modes=modes)
        ran_faulty = faulty_mode in modes
        assert bool(calls) == ran_faulty                # the fast path really ran (or not)
        assert res.ok is not ran_faulty, (modes, res.op_diffs)
        if ran_faulty:
            bad = [od for od in res.op_diffs if od.mode == faulty_mode and not od.explained]
            assert bad and bad[0].op == "torq_hl.conv2d" and bad[0].mismatches >= 1
            if kind == "one element":
                assert bad[0].mismatches == 1
            out = next(o for o in res.outputs if o.mode == faulty_mode)
            if kind == "halve":                         # the whole-model comparison sees it too
                assert not out.exact and out.max_lsb > 1
            elif faulty_mode == "ort":
                assert not out.exact


def test_native_difference_beyond_one_lsb_fails(compiled, monkeypatch):
    """A native rescale off by 2 LSB against ORT fails even though the check's reference agrees
    with it (a wrong multiplier in the program, say): the ±1 LSB rule is judged op by op."""
    from torq.runtime import ops
    monkeypatch.setattr(compiled, "_simulator", Simulator(compiled.program, "reference"))
    orig = ops._rescale

    def off_by_two(acc, attrs, requant, scale_bias, rounding, rtype):
        y = orig(acc, attrs, requant, scale_bias, rounding, rtype)
        return np.clip(y.astype(np.int64) + 2, -128, 127).astype(rtype) if rounding == "native" else y
    monkeypatch.setattr(ops, "_rescale", off_by_two)
    res = verify(compiled, modes=("native",))
    assert not res.ok
    od = next(od for od in res.op_diffs if od.op == "torq_hl.conv2d")
    assert od.mismatches == 0 and od.max_lsb == 2 and not od.explained


@pytest.mark.skipif(native_ops.library() is None, reason="native engine unavailable")
@pytest.mark.parametrize("mode", ["native", "ort"])
def test_fault_in_a_native_kernel_fails_verify(compiled, monkeypatch, mode):
    """The native engine's conv output is judged against the reference formula too."""
    monkeypatch.setattr(compiled, "_simulator", Simulator(compiled.program, "native"))
    orig = native_ops.ConvNative.__call__

    def faulty(self, x, rounding):
        out = orig(self, x, rounding)
        if rounding == mode:
            out[0, 0, 0, 0] = out[0, 0, 0, 0] + 1 if out[0, 0, 0, 0] < 127 else 0
        return out
    monkeypatch.setattr(native_ops.ConvNative, "__call__", faulty)
    assert verify(compiled, modes=("native", "ort")).ok is False
    res = verify(compiled, modes=(mode,))
    bad = [od for od in res.op_diffs if not od.explained]
    assert not res.ok and bad[0].op == "torq_hl.conv2d" and bad[0].mismatches == 1
