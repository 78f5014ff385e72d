"""`exact_scales` moves the activation scales around each Add (`quantize.exact_adds`) so that ORT's
QLinearAdd is exact: a residual network's native NSS run is then bit-exact with ORT, Adds and
Convs alike, in QDQ and QOperator."""
from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import torq
from torq import numerics as nx
from torq.quantize.exact_adds import MAX_CHANGE
from torq.quantize.exact_scales import exact_scales
from torq.verify import verify


def _residual(seed: int) -> onnx.ModelProto:
    """conv -> (conv) + -> conv -> (prev) + -> conv: one Add of two convs, one of an Add and a conv."""
    from qmodels import model
    rng = np.random.default_rng(seed)
    w = {f"w{i}": rng.normal(0, 0.4, (8, 4 if i == 1 else 8, 3, 3)) for i in range(1, 5)}
    b = {f"b{i}": rng.normal(0, 0.2, 8) for i in range(1, 5)}
    conv = lambda i, x, y: helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [y], pads=[1, 1, 1, 1])  # noqa: E731
    nodes = [conv(1, "x", "c1"), conv(2, "c1", "c2"), helper.make_node("Add", ["c1", "c2"], ["s1"]),
             conv(3, "s1", "c3"), helper.make_node("Add", ["s1", "c3"], ["s2"]), conv(4, "s2", "y")]
    return model(nodes, [("x", [1, 4, 8, 8])], ["y"], {**w, **b})


def _quantized(seed, fmt, per_channel, act="s8"):
    from qmodels import quantize
    return quantize(_residual(seed), {"x": [1, 4, 8, 8]}, fmt, per_channel=per_channel, act=act, seed=seed)


def _adds(compiled):
    return [st for st in compiled.program.steps if st.op == "torq_hl.add"]


def _activation_scales(q):
    a = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    return {k: float(a[f"{k}_scale"]) for k in ("x", "c1", "c2", "s1", "c3", "s2", "y")}


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10 ** 6), st.sampled_from(["qdq", "qoperator"]), st.booleans(), st.sampled_from(["s8", "u8"]))
def test_residual_network_native_bit_exact(seed, fmt, per_channel, act):
    q = _quantized(seed, fmt, per_channel, act)
    assert sum(n.op_type in ("Add", "QLinearAdd") for n in q.graph.node) == 2
    qe = exact_scales(q)
    before, after = _activation_scales(q), _activation_scales(qe)
    assert before.keys() == after.keys() and any(before[k] != after[k] for k in before)
    assert all(abs(after[k] / before[k] - 1) <= MAX_CHANGE for k in before)
    compiled = torq.compile(qe)
    assert [st.attrs["round_ties_even"] for st in _adds(compiled)] == [1, 1]
    for s in range(2):
        res = verify(compiled, seed=s, modes=("native", "ort"))
        assert res.ok and all(o.exact for o in res.outputs), res.outputs
        assert all(od.differ == 0 for od in res.op_diffs), res.op_diffs
    # the pass off (adds=False): the Adds keep the reference compiler's NTP
    assert [st.attrs["round_ties_even"] for st in _adds(torq.compile(exact_scales(q, adds=False)))] == [0, 0]


def test_moved_scales_keep_the_model_s_values():
    """Biases of the convs reading a moved scale are re-quantized: ORT's dequantized output of the
    exact model stays within a few output steps of the original's."""
    from qmodels import rand_input, run
    for fmt in ("qdq", "qoperator"):
        q = _quantized(5, fmt, True)
        qe = exact_scales(q)
        x = {"x": nx.quantize_ort(rand_input([1, 4, 8, 8], 1), *_input_qparams(q), -128, 127).astype(np.int8)}
        ys, zy = _output_qparams(q)
        ys2, zy2 = _output_qparams(qe)
        y = (run(q, x)["y"].astype(np.float64) - zy) * ys
        y2 = (run(qe, x)["y"].astype(np.float64) - zy2) * ys2
        assert np.abs(y2 - y).max() <= 4 * ys, fmt


def _input_qparams(q):
    a = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    return np.float32(a["x_scale"]), int(a["x_zero_point"])


def _output_qparams(q):
    a = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    return float(a["y_scale"]), int(a["y_zero_point"])


def test_a_scale_other_ops_depend_on_does_not_move():
    """The graph input's scale (read by the first conv, set by the user's data) never moves; an Add
    whose two inputs are both fixed keeps its scales when no output scale reaches a match."""
    q = _quantized(3, "qdq", False)
    qe = exact_scales(q)
    assert _input_qparams(qe) == _input_qparams(q)
