"""graph/shapes.py: shape arithmetic folded before import, constant-index Gather as a slice, and
what that buys: a ViT encoder block (exported-style attention) imports and lowers."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from compiler.test_lowering_props import SETTINGS, check_compiled
from qmodels import conv_relu_pool_model, model, quantize, run
from torq import compile as torq_compile
from torq.compiler.lowering import NO_INTEGER_FORM
from torq.verify import verify
from torq.compiler.frontend.fold_shapes import fold_shape_arithmetic, slice_constant_gathers
from vit.attention import encoder_block

SHAPE_OPS = {"Shape", "Concat", "Mod", "Sqrt", "Cast", "Gather", "ConstantOfShape"}


def _x(seed=0):
    return {"x": np.random.default_rng(seed).normal(size=(1, 5, 8)).astype(np.float32)}


def test_folding_leaves_no_shape_arithmetic_and_the_same_function():
    m = encoder_block()
    folded = slice_constant_gathers(fold_shape_arithmetic(m))
    ops = Counter(n.op_type for n in folded.graph.node)
    assert not SHAPE_OPS & set(ops), ops
    assert ops["Slice"] == 3 and ops["Squeeze"] == 1 + 3        # q, k, v: Slice + Squeeze each
    assert ops["Div"] == 1                                       # GELU's x/√2 is data, not shape
    for seed in range(3):
        np.testing.assert_array_equal(run(folded, _x(seed))["y"], run(m, _x(seed))["y"])


def test_nothing_to_fold_returns_the_model_itself():
    m = conv_relu_pool_model()
    assert fold_shape_arithmetic(m) is m
    assert slice_constant_gathers(m) is m


@SETTINGS
@given(st.data())
def test_a_constant_index_gather_is_the_same_slice(data):
    rank = data.draw(st.integers(1, 4))
    shape = [data.draw(st.integers(1, 4)) for _ in range(rank)]
    axis = data.draw(st.integers(-rank, rank - 1))
    i = data.draw(st.integers(-shape[axis], shape[axis] - 1))
    scalar = data.draw(st.booleans())
    idx = helper.make_tensor("i", onnx.TensorProto.INT64, [] if scalar else [1], [i])
    m = model([helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)], [("x", shape)], ["y"], [idx])
    sliced = slice_constant_gathers(m)
    assert "Gather" not in {n.op_type for n in sliced.graph.node}
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    np.testing.assert_array_equal(run(sliced, {"x": x})["y"], run(m, {"x": x})["y"])


@pytest.mark.parametrize("fmt,per_channel", [("qdq", False), ("qdq", True), ("qoperator", False)])
def test_encoder_block_without_softmax_and_layernorm_lowers_whole_and_exact(fmt, per_channel):
    """Every op of the block on the NSS (matmul, fully_connected, add, tables, moves), bit-exact
    with ORT in `ort` rounding; native differences explained."""
    m = encoder_block(layer_norm=False, softmax=False)
    q = quantize(m, {"x": [1, 5, 8]}, fmt, per_channel, "s8", lo=-2, hi=2)
    c = check_compiled(torq_compile(q), "matmul")
    assert c.report.lowered["matmul"] == 2 and c.report.lowered["fully_connected"] == 4


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_encoder_block_runs_whole_with_layernorm_and_softmax_as_bf16_islands(fmt):
    """LayerNorm and Softmax (no exact integer form) run in bf16 between the Q/DQ fallbacks: the
    whole block on the NSS, each island within its tolerance, every int8 op bit-exact (ort)."""
    q = quantize(encoder_block(), {"x": [1, 5, 8]}, fmt, False, "s8")
    c = torq_compile(q)
    assert c.report.unsupported == [], [str(u) for u in c.report.unsupported]
    assert c.report.islands_line() == "3 ops in bf16 (no integer form): LayerNormalization ×2, Softmax ×1"
    r = verify(c, seed=0)
    assert r.ok and len(r.islands) == 6 and c.report.lowered.get("matmul") == 2


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_encoder_block_without_islands_is_unsupported_only_where_no_integer_form_exists(fmt):
    """Islands off: a clean reason for LayerNorm and Softmax (and LayerNorm's constants), nothing
    else off the NSS, no internal error."""
    q = quantize(encoder_block(), {"x": [1, 5, 8]}, fmt, False, "s8")
    c = torq_compile(q, bf16_islands=False)
    reasons = {u.reason for u in c.report.unsupported}
    expected = {f"{op}: {why} (bf16 islands are off)" for op, why in NO_INTEGER_FORM.items()}
    ln_constant = ("DequantizeLinear: a constant (weight or bias) read only by LayerNormalization, which runs "
                   f"off the NSS ({NO_INTEGER_FORM['LayerNormalization']})")
    assert reasons - expected <= {ln_constant}, reasons
    assert {r.split(":")[0] for r in reasons} >= {"LayerNormalization", "Softmax"}
    assert c.report.lowered.get("matmul") == 2


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_class_token_concat_lowers_exactly(fmt):
    """ViT prepends a learned class token: Concat(Expand(token, shape from ConstantOfShape/Where),
    patches) + position embedding. The folded Expand is a constant part of the Concat."""
    c = lambda name, v: helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(v), name))  # noqa: E731
    nodes = [c("shape", np.array([1, -1, -1], np.int64)), c("three", np.array([3], np.int64)),
             helper.make_node("ConstantOfShape", ["three"], ["ones"], value=helper.make_tensor("v", 7, [1], [1])),
             c("minus1", np.array(-1, np.int64)),
             helper.make_node("Mul", ["ones", "minus1"], ["neg"]),
             helper.make_node("Equal", ["shape", "neg"], ["eq"]),
             helper.make_node("Where", ["eq", "ones", "shape"], ["target"]),
             helper.make_node("Expand", ["token", "target"], ["cls"]),
             helper.make_node("Concat", ["cls", "x"], ["seq"], axis=1),
             helper.make_node("Add", ["seq", "pos"], ["y"])]
    rng = np.random.default_rng(3)
    m = model(nodes, [("x", [1, 4, 8])], ["y"], {"token": rng.normal(0, 1, (1, 1, 8)), "pos": rng.normal(0, 0.5, (1, 5, 8))})
    q = quantize(m, {"x": [1, 4, 8]}, fmt, False, "s8", lo=-2, hi=2)
    check_compiled(torq_compile(q), "add")


def test_a_quantized_constant_with_zeros_is_data_not_a_scale():
    """`run` compiles segments of the folded graph, where Q(class token) reads a float initializer:
    its zeros are values, not a zero scale."""
    m = model([helper.make_node("QuantizeLinear", ["c", "s", "z"], ["q"]),
               helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
               helper.make_node("Add", ["x", "d"], ["y"])], [("x", [1, 4])], ["y"],
              [onnx.numpy_helper.from_array(np.array([[0, 0.5, -1, 0]], np.float32), "c"),
               onnx.numpy_helper.from_array(np.float32(0.01), "s"), onnx.numpy_helper.from_array(np.int8(0), "z")])
    from torq.graph.validate import validate
    validate(m, "m")
