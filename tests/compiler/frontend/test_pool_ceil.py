"""MaxPool ceil_mode=1 canonicalized to floor mode with ORT's output size (compiler/frontend/pool_ceil.py).

ORT drops a ceil-mode window that would start past the input and its leading pad; ONNX shape
inference does not, and torch-mlir then failed on the declared type (padded input, or stride >
kernel). Checked against real ONNX Runtime: the floor-mode fp32 model gives ORT's exact
output, and the quantized model compiles whole with `ort` rounding bit-exact."""
from __future__ import annotations

import numpy as np
import onnx
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from onnx import helper

import torq
from qmodels import model, run
from torq.compiler import compile as torq_compile
from torq.compiler.frontend.pool_ceil import ceil_pools_to_floor, floor_pads, ort_output_size
from torq.verify import verify

FAST = settings(max_examples=60, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=6, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow])


@st.composite
def pools(draw):
    """(H, W, kernel, strides, dilations, pads) with ORT's limits (pads below the kernel)."""
    k = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    d = [draw(st.sampled_from([1, 1, 2])) if k[i] > 1 else 1 for i in range(2)]
    s = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    pads = [draw(st.integers(0, k[i % 2] - 1)) for i in range(4)]
    hw = [draw(st.integers((k[i] - 1) * d[i] + 1, 9)) for i in range(2)]
    return hw, k, s, d, pads


def _pool_model(hw, k, s, d, pads, before=()):
    node = helper.make_node("MaxPool", ["p_in"], ["z"], kernel_shape=k, strides=s, dilations=d, pads=pads,
                            ceil_mode=1)
    return model([*before, node], [("p_in" if not before else "x", [1, 2, *hw])], ["z"])


@FAST
@given(pools(), st.integers(0, 2**16))
def test_floor_form_equals_ort_ceil_mode(pool, seed):
    hw, k, s, d, pads = pool
    m = _pool_model(hw, k, s, d, pads)
    x = np.random.default_rng(seed).standard_normal((1, 2, *hw)).astype(np.float32)
    want = run(m, {"p_in": x})["z"]
    assert list(want.shape[2:]) == [ort_output_size(hw[i], k[i], s[i], d[i], pads[i], pads[i + 2])
                                    for i in range(2)]
    floor = ceil_pools_to_floor(m)
    node = floor.graph.node[-1]
    assert node.op_type == "MaxPool" and all(a.name != "ceil_mode" for a in node.attribute)
    pads = floor_pads(hw, {"kernel_shape": k, "strides": s, "dilations": d, "pads": pads})
    if any(e >= kk for e, kk in zip(pads[2:], k)):   # only a dilated pool's end pad reaches its kernel
        assert d != [1, 1] and [n.op_type for n in floor.graph.node] == ["Pad", "MaxPool"]
    onnx.checker.check_model(floor, full_check=True)
    declared = [x.dim_value for x in floor.graph.output[0].type.tensor_type.shape.dim]
    assert declared == list(want.shape)          # the declared type follows ORT now
    np.testing.assert_array_equal(run(floor, {"p_in": x})["z"], want)


def test_the_two_cases_torch_mlir_mis_sized():
    """Stride past the kernel (last window starts after the input) and a padded input whose last
    ceil window would start in the end pad: ORT drops that window; the floor form agrees."""
    assert ort_output_size(6, 2, 3, 1, 0, 0) == 2    # ceil formula says 3
    assert ort_output_size(5, 2, 2, 1, 1, 1) == 3    # ceil formula says 4
    assert floor_pads([6, 6], {"kernel_shape": [2, 2], "strides": [3, 3]}) == [0, 0, 0, 0]
    assert floor_pads([5, 5], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]}) == [1, 1, 0, 0]
    assert floor_pads([7, 7], {"kernel_shape": [2, 2], "strides": [2, 2]}) == [0, 0, 1, 1]


def test_injected_wrong_end_pad_is_caught_by_the_ort_check():
    """The check above compares with ORT; one end pad too many adds a window ORT does not have."""
    hw, k, s, d, pads = [7, 7], [3, 3], [2, 2], [1, 1], [0, 0, 0, 0]
    m = _pool_model(hw, k, s, d, pads)
    x = np.random.default_rng(0).standard_normal((1, 2, 7, 7)).astype(np.float32)
    wrong = ceil_pools_to_floor(m)
    bad = [a for a in wrong.graph.node[0].attribute if a.name != "pads"]
    del wrong.graph.node[0].attribute[:]
    wrong.graph.node[0].attribute.extend(bad + [helper.make_attribute("pads", [0, 0, 0, 2])])
    del wrong.graph.output[0].type.tensor_type.shape.dim[:]
    assert run(wrong, {"p_in": x})["z"].shape != run(m, {"p_in": x})["z"].shape


def test_models_without_ceil_pools_are_returned_as_is():
    m = model([helper.make_node("MaxPool", ["p_in"], ["z"], kernel_shape=[2, 2], strides=[2, 2])],
              [("p_in", [1, 1, 4, 4])], ["z"])
    assert ceil_pools_to_floor(m) is m


@SLOW
@given(pools(), st.sampled_from(["qdq", "qoperator"]), st.integers(0, 2**16))
@example(([8, 8], [3, 3], [2, 2], [1, 1], [0, 0, 0, 0]), "qoperator", 0)   # int8 pool, end pad 1: Pad(-128)
@example(([6, 5], [2, 2], [3, 3], [1, 1], [1, 0, 1, 0]), "qoperator", 1)   # windows ORT drops
@example(([5, 5], [2, 2], [2, 2], [1, 1], [1, 1, 1, 1]), "qdq", 2)
def test_quantized_ceil_pools_compile_and_match_ort(pool, fmt, seed):
    """Conv → MaxPool(ceil) → Conv, quantized by torq.quantize (QOperator: an int8 MaxPool):
    nothing unsupported, ort bit-exact."""
    hw, k, s, d, pads = pool
    rng = np.random.default_rng(seed)
    conv = helper.make_node("Conv", ["x", "w0", "b0"], ["p_in"], pads=[1, 1, 1, 1])
    m = model([conv, helper.make_node("MaxPool", ["p_in"], ["z"], kernel_shape=k, strides=s, dilations=d,
                                      pads=pads, ceil_mode=1),
               helper.make_node("Conv", ["z", "wt"], ["y"])],
              [("x", [1, 3, *hw])], ["y"],
              {"w0": rng.normal(0, 0.3, (2, 3, 3, 3)), "b0": rng.normal(0, 0.1, 2),
               "wt": rng.normal(0, 0.3, (2, 2, 1, 1))})
    q = torq.quantize(m, quant_format=fmt, num_calib=4)
    pool_in = next(n for n in q.graph.node if n.op_type == "MaxPool").input[0]
    assert pool_in.endswith("_quantized") == (fmt == "qoperator")     # int8 MaxPool in QOperator
    c = torq_compile(q)
    assert c.report.unsupported == [], [str(u) for u in c.report.unsupported]
    r = verify(c, seed=seed)
    assert all(o.exact for o in r.outputs if o.mode == "ort"), r.outputs
    assert all(od.explained for od in r.op_diffs)


def test_a_chain_of_pools_sees_each_true_input_size():
    """Dilated (explicit Pad) → mis-sized (a dropped window) → mis-sized: each pool is rewritten
    from its input's true size, and the declared output follows ORT."""
    n = helper.make_node
    m = model([n("MaxPool", ["p_in"], ["a"], kernel_shape=[2, 2], strides=[3, 3], dilations=[2, 2],
                 pads=[1, 1, 1, 1], ceil_mode=1),
               n("MaxPool", ["a"], ["b"], kernel_shape=[1, 1], strides=[2, 2], ceil_mode=1),
               n("MaxPool", ["b"], ["z"], kernel_shape=[2, 1], strides=[3, 1], ceil_mode=1)],
              [("p_in", [1, 2, 9, 9])], ["z"])
    x = np.random.default_rng(0).standard_normal((1, 2, 9, 9)).astype(np.float32)
    floor = ceil_pools_to_floor(m)
    assert [x.op_type for x in floor.graph.node] == ["Pad", "MaxPool", "MaxPool", "MaxPool"]
    onnx.checker.check_model(floor, full_check=True)
    want = run(m, {"p_in": x})["z"]
    assert [d.dim_value for d in floor.graph.output[0].type.tensor_type.shape.dim] == list(want.shape)
    np.testing.assert_array_equal(run(floor, {"p_in": x})["z"], want)
