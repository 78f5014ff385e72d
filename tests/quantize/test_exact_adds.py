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


def _residual(seed: int, pool_end: bool = False) -> onnx.ModelProto:
    """conv -> (conv) + -> conv -> (prev) + -> conv: one Add of two convs, one of an Add and a conv.
    ``pool_end``: a global average pool reads the last Add (its output scale cannot move)."""
    from qmodels import model
    rng = np.random.default_rng(seed)
    w = {f"w{i}": rng.normal(0, 0.4, (8, 4 if i == 1 else 8, 3, 3)) for i in range(1, 5)}
    b = {f"b{i}": rng.normal(0, 0.2, 8) for i in range(1, 5)}
    conv = lambda i, x, y: helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [y], pads=[1, 1, 1, 1])  # noqa: E731
    nodes = [conv(1, "x", "c1"), conv(2, "c1", "c2"), helper.make_node("Add", ["c1", "c2"], ["s1"]),
             conv(3, "s1", "c3"), helper.make_node("Add", ["s1", "c3"], ["s2"]),
             helper.make_node("GlobalAveragePool", ["s2"], ["y"]) if pool_end else conv(4, "s2", "y")]
    inits = {k: v for k, v in {**w, **b}.items() if not (pool_end and k.endswith("4"))}
    return model(nodes, [("x", [1, 4, 8, 8])], ["y"], inits)


def _quantized(seed, fmt, per_channel, act="s8", pool_end=False):
    from qmodels import quantize
    return quantize(_residual(seed, pool_end), {"x": [1, 4, 8, 8]}, fmt, per_channel=per_channel, act=act, seed=seed)


def _adds(compiled):
    return [st for st in compiled.program.steps if st.op == "torq_hl.add"]


def _activation_scales(q):
    a = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    return {k: float(a[f"{k}_scale"]) for k in ("x", "c1", "c2", "s1", "c3", "s2", "y")}


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10 ** 6), st.sampled_from(["qdq", "qoperator"]), st.booleans(), st.sampled_from(["s8", "u8"]),
       st.booleans())
def test_residual_network_native_bit_exact(seed, fmt, per_channel, act, pool_end):
    """``pool_end``: the last Add's output scale is fixed (a pool reads it) and one input is the
    first Add's: the first Add chooses its output scale for the second's grid too."""
    q = _quantized(seed, fmt, per_channel, act, pool_end)
    assert sum(n.op_type in ("Add", "QLinearAdd") for n in q.graph.node) == 2
    qe = exact_scales(q)
    before, after = _activation_scales(q), _activation_scales(qe)
    assert before.keys() == after.keys() and any(before[k] != after[k] for k in before)
    assert all(abs(after[k] / before[k] - 1) <= MAX_CHANGE for k in before)
    compiled = torq.compile(qe)
    assert [st.attrs["round_ties_even"] for st in _adds(compiled)] == [1, 1]
    for s in range(2):
        res = verify(compiled, seed=s, modes=("native", "ort"))
        assert res.ok and all(od.differ == 0 for od in res.op_diffs if od.op == "torq_hl.add"), res.op_diffs
        # every rescale exact (the pool only where its own scale is: ORT gives it another output scale)
        assert pool_end or (all(o.exact for o in res.outputs) and all(od.differ == 0 for od in res.op_diffs))
    # the pass off (activations=False): the Adds keep the reference compiler's NTP
    assert [st.attrs["round_ties_even"] for st in _adds(torq.compile(exact_scales(q, activations=False)))] == [0, 0]


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


def _pool_then_add():
    """conv -> max pool -> (conv) +: the pool's output shares its input's scale (QDQ) or sits
    between Q/DQ (QOperator), so the Add's input A cannot move."""
    from qmodels import model
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["p", "c2"], ["y"])]
    return model(nodes, [("x", [1, 4, 8, 8])], ["y"], {
        "w1": rng.normal(0, 0.4, (8, 4, 3, 3)), "b1": rng.normal(0, 0.2, 8),
        "w2": rng.normal(0, 0.4, (8, 8, 3, 3)), "b2": rng.normal(0, 0.2, 8)})


def test_a_scale_another_op_depends_on_does_not_move():
    """The pool's scale stays (it must equal its input's); the Add moves its other input and
    output instead and is exact."""
    from qmodels import quantize
    for fmt, fixed in (("qdq", ("c1_scale",)), ("qoperator", ("c1_scale", "p_scale"))):
        q = quantize(_pool_then_add(), {"x": [1, 4, 8, 8]}, fmt, per_channel=True)
        qe = exact_scales(q)
        a, b = ({t.name: numpy_helper.to_array(t) for t in m.graph.initializer} for m in (q, qe))
        assert all(a[k] == b[k] for k in fixed) and a["y_scale"] != b["y_scale"], fmt
        compiled = torq.compile(qe)
        assert [st.attrs["round_ties_even"] for st in _adds(compiled)] == [1], fmt
        res = verify(compiled, modes=("native", "ort"))
        assert res.ok and all(o.exact for o in res.outputs), (fmt, res.outputs)
