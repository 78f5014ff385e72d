"""bf16 islands: in an int8 model, the ops with no integer form (Softmax, LayerNorm) run on the NSS in
bf16 between the seed's Quantize/Dequantize fallbacks instead of being refused; verify holds each
island's int8 result to its tolerance and every int8 op, before and after it, bit-exact to ORT."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import torq
from qmodels import model, quantize, weight
from torq.compiler.unsupported import NO_INTEGER_FORM
from torq.verify import verify


def softmax_head(classes=10):
    """x -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Softmax: a classifier's head."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fw"], ["logits"], transB=1),
             helper.make_node("Softmax", ["logits"], ["y"], axis=-1)]
    return model(nodes, [("x", [1, 3, 8, 8])], ["y"], [weight("w", (8, 3, 3, 3), 1), weight("fw", (classes, 8), 2, 2.0)])


def layernorm_between_convs():
    """Conv -> Transpose -> LayerNorm over channels -> Transpose -> Conv: an island with int8 ops after it."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1] * 4),
             helper.make_node("Transpose", ["c0"], ["t0"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t0", "s", "b"], ["ln"], axis=-1),
             helper.make_node("Transpose", ["ln"], ["t1"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["t1", "w1"], ["y"])]
    return model(nodes, [("x", [1, 3, 6, 6])], ["y"],
                 {"w0": rng.normal(0, .4, (8, 3, 3, 3)), "s": 1 + 0.2 * rng.normal(size=8), "b": rng.normal(0, .1, 8),
                  "w1": rng.normal(0, .3, (4, 8, 1, 1))})


_Q: dict = {}


def compiled(kind: str, fmt: str, islands: bool = True):
    key = (kind, fmt)
    if key not in _Q:
        m, shape = (softmax_head(), [1, 3, 8, 8]) if kind == "softmax" else (layernorm_between_convs(), [1, 3, 6, 6])
        _Q[key] = quantize(m, {"x": shape}, fmt=fmt, full_integer=False)
    return torq.compile(_Q[key], bf16_islands=islands)


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_a_softmax_head_runs_whole_on_the_nss_as_a_bf16_island(fmt):
    c = compiled("softmax", fmt)
    assert c.report.unsupported == [], [str(u) for u in c.report.unsupported]
    assert c.report.islands_line() == "1 op in bf16 (no integer form): Softmax ×1"
    (isl,) = c.islands
    assert isl.onnx_op == "Softmax" and len(isl.inputs) == 1 and len(isl.outputs) == 1
    r = verify(c, seed=0)
    assert r.ok and {d.mode for d in r.islands} == {"native", "ort"}
    assert all(d.max_lsb <= 2 for d in r.islands)                # measured: benchmarks/island_lsb.py
    assert [o.exact for o in r.handed_on if o.mode == "ort"] == [True, True]   # the output and the logits
    assert "bf16 island Softmax" in str(r.islands[0]) and "beyond the tolerance" in str(r.islands[0])


def test_a_layernorm_island_keeps_the_int8_conv_after_it_bit_exact():
    c = compiled("layernorm", "qdq")
    assert c.report.unsupported == [] and c.report.islands_line() == \
        "1 op in bf16 (no integer form): LayerNormalization ×1"
    r = verify(c, seed=1)
    assert r.ok, [str(d) for d in r.islands]
    ort = [o for o in r.handed_on if o.mode == "ort"]
    assert len(ort) == 2 and all(o.exact for o in ort)            # graph output after the island, its input


def test_islands_off_refuses_with_the_reason():
    c = compiled("softmax", "qdq", islands=False)
    causes = [u for u in c.report.unsupported if not u.consequence]
    assert [u.onnx_op for u in causes] == ["Softmax"]
    assert causes[0].why == NO_INTEGER_FORM["Softmax"] + " (bf16 islands are off)"
    assert c.islands == [] and c.report.islands_line() == ""


def _island_mul(c):
    """The Quantize fallback's bf16 mul that ends the island: (its step, the slot of its factor)."""
    by_out = {st.out: st for st in c.program.steps}
    st = by_out[c.islands[0].outputs[0][0]]                     # fma clamp
    while st.op != "torq_hl.mul":
        st = by_out[st.args[0]]
    return st, st.args[1]


def test_a_wrong_island_result_fails_verify():
    """The injected fault: the island's Quantize multiplies by 1.25/scale (a wrong scale)."""
    c = compiled("softmax", "qdq")
    _, factor = _island_mul(c)
    c.program.constants[factor] = np.asarray(c.program.constants[factor], np.float32) * np.float32(1.25)
    c._simulator = None
    r = verify(c, seed=0, modes=("native",))
    assert not r.ok and r.islands[0].beyond > 0


@pytest.mark.parametrize("kind", ["softmax", "layernorm"])
def test_a_wrong_int8_op_still_fails_verify_with_islands(kind):
    """One weight of the last int8 contraction flipped: before the island (the FC making the logits,
    checked against ORT's int8 tensor there) or after it (the conv making the graph output from
    ORT's island result)."""
    c = compiled(kind, "qdq")
    st = [st for st in c.program.steps if st.op in ("torq_hl.conv2d", "torq_hl.fully_connected")][-1]
    w = next(a for a in st.args if a in c.program.constants and np.asarray(c.program.constants[a]).ndim >= 2)
    bad = np.array(c.program.constants[w], copy=True)
    bad.reshape(-1)[0] = 100 if bad.reshape(-1)[0] < 0 else -100
    c.program.constants[w] = bad
    c._simulator = None
    r = verify(c, seed=0, modes=("ort",))
    assert not r.ok and not all(o.exact for o in r.handed_on)


@pytest.mark.parametrize("op,attrs", [("LogSoftmax", {"axis": 1}), ("ReduceL2", {"keepdims": 1})])
def test_other_float_reductions_are_islands_too(op, attrs):
    """What ORT leaves float between a DQ and a Q and int8 has no form for: a row's log-sum-exp, a
    norm (square root of a sum of squares)."""
    m = model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node(op, ["c"], ["y"], **attrs)],
              [("x", [1, 4, 4, 4])], ["y"], [weight("w", (6, 4, 1, 1), 4, 0.5)])
    c = torq.compile(torq.quantize(m, num_calib=4))
    assert c.report.unsupported == [] and c.report.islands_line() == f"1 op in bf16 (no integer form): {op} ×1"
    assert verify(c, seed=2).ok


def test_an_op_whose_result_stays_float_is_no_island():
    """ORT's quantize_static leaves LogSoftmax's output float (no QuantizeLinear after it): there is
    no int8 result to hold to a tolerance, so it is refused, saying why."""
    m = model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("LogSoftmax", ["c"], ["y"], axis=1)],
              [("x", [1, 4, 4, 4])], ["y"], [weight("w", (6, 4, 1, 1), 4, 0.5)])
    c = torq.compile(quantize(m, {"x": [1, 4, 4, 4]}, full_integer=False))
    (cause,) = [u for u in c.report.unsupported if not u.consequence]
    assert cause.onnx_op == "LogSoftmax" and cause.why.endswith("(no bf16 island: it must read dequantized int8 "
                                                                "and feed a QuantizeLinear)"), cause.why
    assert c.islands == []


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_uint8_full_integer_island_writes_the_graph_output(fmt):
    """uint8 activations (shifted to int8 inside) and an island whose Q is the graph output."""
    q = quantize(softmax_head(), {"x": [1, 3, 8, 8]}, fmt=fmt, act="u8", full_integer=True)
    c = torq.compile(q)
    assert c.report.unsupported == [] and c.islands[0].outputs[0][1] == q.graph.output[0].name
    r = verify(c, seed=3)
    assert r.ok and all(d.max_lsb <= 2 for d in r.islands)
