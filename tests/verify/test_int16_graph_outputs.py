"""verify on an int16 op writing a graph output (a mixed-precision model whose last layer is int16).

Such an op is judged against ORT's own output only when it reads ORT's own inputs (graph inputs
through data movement). Behind other rescaling ops it reads the NSS's values, which may differ
from ORT's by the admissible ±1 LSB of an int16 op upstream (ORT runs int16 in float32): one
upstream LSB can move an int16 output by hundreds, so ORT's output says nothing about the op
itself there, and it is held to its formula like every other op (EfficientNet-Lite0 with an
int16 classifier failed verify that way). A fault in the op itself is still caught.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qmodels import combine_shift_by_seven
from torq import compile
from torq.quantize import quantize
from torq.verify import verify


def _mlp():
    """x[1,64] -> fc1 (int16 out) -> fc2 (int16 out, the graph output), full-integer."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for name, src, k, n in (("fc1", "x", 64, 128), ("fc2", "fc1", 128, 16)):
        inits += [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), f"{name}_w"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(n)).astype(np.float32), f"{name}_b")]
        nodes.append(helper.make_node("Gemm", [src, f"{name}_w", f"{name}_b"], [name], name=name))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("fc2", TensorProto.FLOAT, [1, 16])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return quantize(m, per_channel=True, full_integer=True, precision=(("fc1", "int16"), ("fc2", "int16")))


def _fcs(c):
    steps = [st for st in c.program.steps if st.op == "torq_hl.fully_connected"]
    assert len(steps) == 2
    return steps


def test_an_upstream_difference_is_not_blamed_on_the_int16_output_op(monkeypatch):
    c = compile(_mlp())
    fc1, fc2 = _fcs(c)
    r = verify(c)
    assert r.ok and r.float_steps == 2
    # every element of fc1 one LSB off (each an admissible int16 difference), handed on to fc2
    sim = c.simulator
    inputs = {"x": np.random.default_rng(0).integers(-128, 128, (1, 64), dtype=np.int8)}
    seen = {fc1.out: None}
    sim.run(c.program.feed(inputs), "native", watch=seen)
    off = np.clip(seen[fc1.out].astype(np.int32) + 1, -32768, 32767).astype(seen[fc1.out].dtype)
    run = sim.run
    monkeypatch.setattr(sim, "run", lambda *a, **k: run(*a, **{**k, "force": {fc1.out: off}}))
    r = verify(c, inputs=inputs)
    out_ops = [od for od in r.op_diffs if od.location == fc2.location]
    assert out_ops and all(od.explained for od in out_ops), out_ops      # fc2 did what it should
    assert any(o.differ for o in r.outputs)                               # (the outputs show the LSB)


@pytest.mark.parametrize("target", ["combine_partials"])
def test_a_fault_in_the_int16_output_op_is_caught(monkeypatch, target):
    import torq.runtime.kernels.byteplanes as bp

    monkeypatch.setattr(bp, target, combine_shift_by_seven)          # act_lsh 7 instead of 8
    c = compile(_mlp())                                    # a fresh compile: plans are built with the fault
    r = verify(c)
    assert not r.ok
    fc2 = _fcs(c)[1]
    out_ops = [od for od in r.op_diffs if od.location == fc2.location and od.mode == "native"]
    assert out_ops and not all(od.explained for od in out_ops)
