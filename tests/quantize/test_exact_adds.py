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
    ``pool_end``: a 2x2 average pool reads the last Add: that output scale cannot move (the pool's
    exactness, QDQ; its own rescale, QOperator)."""
    from qmodels import model
    rng = np.random.default_rng(seed)
    w = {f"w{i}": rng.normal(0, 0.4, (8, 4 if i == 1 else 8, 3, 3)) for i in range(1, 5)}
    b = {f"b{i}": rng.normal(0, 0.2, 8) for i in range(1, 5)}
    conv = lambda i, x, y: helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [y], pads=[1, 1, 1, 1])  # noqa: E731
    nodes = [conv(1, "x", "c1"), conv(2, "c1", "c2"), helper.make_node("Add", ["c1", "c2"], ["s1"]),
             conv(3, "s1", "c3"), helper.make_node("Add", ["s1", "c3"], ["s2"]),
             helper.make_node("AveragePool", ["s2"], ["y"], kernel_shape=[2, 2], strides=[2, 2]) if pool_end
             else conv(4, "s2", "y")]
    inits = {k: v for k, v in {**w, **b}.items() if not (pool_end and k.endswith("4"))}
    return model(nodes, [("x", [1, 4, 8, 8])], ["y"], inits)


def _quantized(seed, fmt, per_channel, act="s8", pool_end=False):
    from qmodels import quantize
    return quantize(_residual(seed, pool_end), {"x": [1, 4, 8, 8]}, fmt, per_channel=per_channel, act=act, seed=seed)


def _adds(compiled):
    return [st for st in compiled.program.steps if st.op == "torq_hl.add"]


def _activation_scales(q):
    a = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    return {k: float(a[f"{k}_scale"]) for k in ("x", "c1", "c2", "s1", "c3", "s2", "y") if f"{k}_scale" in a}


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


def test_a_graph_input_scale_never_moves():
    """x + conv(x) with int8 graph I/O: the user quantizes x with its declared scale, which stays;
    the Add moves the conv's output and its own instead."""
    from qmodels import model, quantize
    rng = np.random.default_rng(1)
    m = model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
               helper.make_node("Add", ["x", "c"], ["y"])], [("x", [1, 4, 8, 8])], ["y"],
              {"w": rng.normal(0, 0.4, (4, 4, 3, 3)), "b": rng.normal(0, 0.2, 4)})
    for fmt in ("qdq", "qoperator"):
        q = quantize(m, {"x": [1, 4, 8, 8]}, fmt, per_channel=True)
        qe = exact_scales(q)
        assert _input_qparams(qe) == _input_qparams(q), fmt
        compiled = torq.compile(qe)
        assert [st.attrs["round_ties_even"] for st in _adds(compiled)] == [1], fmt
        res = verify(compiled, modes=("native", "ort"))
        assert res.ok and all(o.exact for o in res.outputs), (fmt, res.outputs)


def _squeeze_excite(seed: int) -> onnx.ModelProto:
    """conv -> x · sigmoid(conv(GAP(x))) -> conv: an EfficientNet squeeze-and-excite Mul, whose
    inputs other ops fix (the pool reads x, the sigmoid's table sets its scale): its output moves."""
    from qmodels import model
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c1"], ["g"]),
             helper.make_node("Conv", ["g", "w2", "b2"], ["e"]),
             helper.make_node("Sigmoid", ["e"], ["s"]),
             helper.make_node("Mul", ["c1", "s"], ["m"]),
             helper.make_node("Conv", ["m", "w3", "b3"], ["y"])]
    return model(nodes, [("x", [1, 4, 8, 8])], ["y"], {
        "w1": rng.normal(0, 0.4, (8, 4, 3, 3)), "b1": rng.normal(0, 0.2, 8),
        "w2": rng.normal(0, 0.4, (8, 8, 1, 1)), "b2": rng.normal(0, 0.2, 8),
        "w3": rng.normal(0, 0.4, (4, 8, 1, 1)), "b3": rng.normal(0, 0.2, 4)})


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 10 ** 6), st.sampled_from(["qdq", "qoperator"]), st.booleans())
def test_squeeze_excite_mul_native_bit_exact(seed, fmt, per_channel):
    from qmodels import quantize
    q = quantize(_squeeze_excite(seed), {"x": [1, 4, 8, 8]}, fmt, per_channel=per_channel, seed=seed)
    qe = exact_scales(q)
    a, b = ({t.name: float(numpy_helper.to_array(t)) for t in m.graph.initializer if t.name.endswith("_scale")
             and not t.dims} for m in (q, qe))
    assert a["m_scale"] != b["m_scale"] and abs(b["m_scale"] / a["m_scale"] - 1) <= MAX_CHANGE
    assert all(a[k] == b[k] for k in ("c1_scale", "s_scale"))
    compiled = torq.compile(qe)
    muls = [st for st in compiled.program.steps if st.op == "torq_hl.mul"]
    assert [st.attrs["round_ties_even"] for st in muls] == [1]
    for s in range(2):
        res = verify(compiled, seed=s, modes=("native", "ort"))
        assert res.ok and all(od.differ == 0 for od in res.op_diffs if od.op == "torq_hl.mul"), res.op_diffs
    muls = [st for st in torq.compile(exact_scales(q, activations=False)).program.steps if st.op == "torq_hl.mul"]
    assert [st.attrs["round_ties_even"] for st in muls] == [0]


def _random_net(kinds, seed: int) -> onnx.ModelProto:
    """conv, then one block per kind: "add" x + conv(x), "se" x · sigmoid(conv(GAP(x))), "pool" a
    2x2 average pool then a conv; a conv at the end."""
    from qmodels import model
    rng = np.random.default_rng(seed)
    inits, nodes, n = {}, [], [0]

    def conv(x, k=3, cin=8):
        n[0] += 1
        w, b, y = f"w{n[0]}", f"b{n[0]}", f"c{n[0]}"
        inits[w], inits[b] = rng.normal(0, 0.4, (8, cin, k, k)), rng.normal(0, 0.2, 8)
        nodes.append(helper.make_node("Conv", [x, w, b], [y], pads=[k // 2] * 4))
        return y
    x = conv("x", cin=4)
    for i, kind in enumerate(kinds):
        if kind == "add":
            nodes.append(helper.make_node("Add", [x, conv(x)], [f"s{i}"]))
        elif kind == "se":
            nodes += [helper.make_node("GlobalAveragePool", [x], [f"g{i}"])]
            nodes += [helper.make_node("Sigmoid", [conv(f"g{i}", k=1)], [f"e{i}"]),
                      helper.make_node("Mul", [x, f"e{i}"], [f"s{i}"])]
        else:
            nodes.append(helper.make_node("AveragePool", [x], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2]))
            x = f"p{i}"
            continue
        x = f"s{i}"
    nodes.append(helper.make_node("Conv", [x, "wy", "by"], ["y"]))
    inits["wy"], inits["by"] = rng.normal(0, 0.4, (4, 8, 1, 1)), rng.normal(0, 0.2, 4)
    return model(nodes, [("x", [1, 4, 16, 16])], ["y"], inits)


@settings(max_examples=8, deadline=None)
@given(st.lists(st.sampled_from(["add", "se", "pool"]), min_size=2, max_size=4), st.integers(0, 10 ** 6),
       st.sampled_from(["qdq", "qoperator"]), st.booleans())
def test_random_networks(kinds, seed, fmt, per_channel):
    """Random chains of residual Adds, squeeze-and-excite Muls and 2x2 pools: every activation scale
    moves within MAX_CHANGE, the Adds and Muls get NTE (all but one at most: three Adds in a row
    before a pool fix both ends of the middle one, which a greedy walk rarely meets), and every op
    with NTE is bit-exact with ORT (op by op, native rounding)."""
    from qmodels import quantize
    q = quantize(_random_net(kinds, seed), {"x": [1, 4, 16, 16]}, fmt, per_channel=per_channel, seed=seed)
    qe = exact_scales(q)
    a, b = ({t.name: float(numpy_helper.to_array(t)) for t in m.graph.initializer if not t.dims
             and t.data_type == onnx.TensorProto.FLOAT} for m in (q, qe))
    assert all(abs(b[k] / a[k] - 1) <= MAX_CHANGE for k in a if not k.startswith(("w", "b")))   # activations
    compiled = torq.compile(qe)
    steps = [st for st in compiled.program.steps if st.op in ("torq_hl.add", "torq_hl.mul")]
    assert len(steps) == sum(k in ("add", "se") for k in kinds)
    assert sum(st.attrs["round_ties_even"] for st in steps) >= len(steps) - 1
    res = verify(compiled, modes=("native", "ort"))
    assert res.ok
    nte = {st.location for st in steps if st.attrs["round_ties_even"]}
    assert all(od.differ == 0 for od in res.op_diffs if od.location in nte), res.op_diffs
