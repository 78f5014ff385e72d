"""The numbers of the seeds, through the whole stack: ONNX QDQ model -> torch-mlir -> torq_hl -> NSS.

Lecture 05-2 (seed 002): S_W 0.01, q_W [20, -10], S_X 0.05, Z_X 10, q_X [30, 14], b 0.3,
S_Y 0.004, Z_Y -128  =>  q_b 600, q_bias 500, acc 960, M 0.125, q_Y -8.
Seed 000 §4.5: the w_zp = 0, in_zp = 0 and both-zero special cases.
"""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qmodels import conv_model, quantize
from torq import numerics
from torq import compile
from torq.compiler import torq_hl
from torq.compiler.lowering import func_ops
from torq import reference
from torq.runtime import kernels


def fc_qdq_model(w_q, s_w, s_x, z_x, q_b, s_y, z_y):
    """Full-integer QDQ FC: x_i8 -DQ-> Gemm(DQ(w_i8), DQ(b_i32)) -Q-> y_i8 (w given as [O, K])."""
    o, k = np.asarray(w_q).shape
    f32 = lambda v: np.asarray(v, np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(np.asarray(w_q, np.int8), "w_q"),
             numpy_helper.from_array(f32(s_w), "s_w"), numpy_helper.from_array(np.int8(0), "z_w"),
             numpy_helper.from_array(f32(s_x), "s_x"), numpy_helper.from_array(np.int8(z_x), "z_x"),
             numpy_helper.from_array(np.asarray(q_b, np.int32).reshape(o), "q_b"),
             numpy_helper.from_array(f32(s_w * s_x), "s_b"), numpy_helper.from_array(np.int32(0), "z_b"),
             numpy_helper.from_array(f32(s_y), "s_y"), numpy_helper.from_array(np.int8(z_y), "z_y")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "s_x", "z_x"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w_q", "s_w", "z_w"], ["wf"]),
             helper.make_node("DequantizeLinear", ["q_b", "s_b", "z_b"], ["bf"]),
             helper.make_node("Gemm", ["xf", "wf", "bf"], ["yf"], transB=1),
             helper.make_node("QuantizeLinear", ["yf", "s_y", "z_y"], ["y"])]
    g = helper.make_graph(nodes, "lecture_fc", [helper.make_tensor_value_info("x", TensorProto.INT8, [1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.INT8, [1, o])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


def torq_ops(compiled, name):
    from torq.compiler import importer
    module = importer.parse(compiled.ir("torq_hl"))
    return [op for op in func_ops(module) if op.name == f"torq_hl.{name}"], module


def test_lecture_fc_example_through_the_whole_stack():
    s_w, s_x, s_y = 0.01, 0.05, 0.004
    q_b = round(0.3 / (s_w * s_x))
    assert q_b == 600
    m = fc_qdq_model([[20, -10]], s_w, s_x, 10, [q_b], s_y, -128)
    c = compile(m)
    (fc,), module = torq_ops(c, "fully_connected")
    with module.context:
        attrs = torq_hl.op_attrs(fc)
        w = np.array(fc.operands[1].owner.attributes["value"]).astype(np.int64)
        sb = np.array(fc.operands[2].owner.attributes["value"]).astype(np.int64)
    assert attrs["input_zp"] == 10 and attrs["weight_zp"] == 0 and attrs["output_zp"] == -128
    assert sb[0] == 500                                   # q_bias = q_b - Z_X·Σq_W = 600 - 100
    assert (sb[1], attrs["shift_factor"]) == numerics.multiplier_and_shift(
        float(np.float32(s_w) * np.float32(s_x)) / float(np.float32(s_y)))
    assert abs(sb[1] / 2.0 ** attrs["shift_factor"] - 0.125) < 1e-7       # M = S_W S_X / S_Y
    x = np.array([[30, 14]], np.int8)
    acc = kernels.fc_acc(x, w, sb[0::2])
    assert acc.tolist() == [[960]]                        # 460 + 500
    for mode in ("native", "ort"):
        assert c.run({"x": x}, rounding=mode)["y"].tolist() == [[-8]]
    assert reference.run(m, {"x": x})["y"].tolist() == [[-8]]   # and ONNX Runtime agrees
    # the float check of the lecture: S_Y (q_Y - Z_Y) = 0.48
    assert abs(s_y * (-8 + 128) - 0.48) < 1e-9


def test_lecture_q_bias_34():
    m = fc_qdq_model([[3, -1, 2]], 0.01, 0.05, 4, [50], 0.004, -128)
    (fc,), module = torq_ops(compile(m), "fully_connected")
    with module.context:
        sb = np.array(fc.operands[2].owner.attributes["value"])
    assert sb[0] == 34                                    # 50 - 4·(3 - 1 + 2)


def test_seed_scale_examples():
    assert numerics.multiplier_and_shift(0.5) == (134217728, 28)
    assert numerics.multiplier_and_shift(0.0) == (0, 28)
    with pytest.raises(ValueError):
        numerics.multiplier_and_shift(-0.5)


@pytest.mark.parametrize("case", ["w_zp=0", "in_zp=0", "both=0", "w_zp!=0"])
def test_zero_point_special_cases(case):
    rng = np.random.default_rng(7)
    m = conv_model(rng, 3, 4, 3, 1, 1, [1, 1, 1, 1], 1, True, False, (6, 6))
    extra = {"ActivationSymmetric": case in ("in_zp=0", "both=0"), "WeightSymmetric": case != "w_zp!=0"}
    q = quantize(m, {"x": [1, 3, 6, 6]}, "qdq", lo=-0.3, hi=1.7, **extra)
    c = compile(q)
    (conv,), module = torq_ops(c, "conv2d")
    with module.context:
        a = torq_hl.op_attrs(conv)
        wtype = str(conv.operands[1].type)
    in_zp = a["input_zp"]
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    w_zp = int(next(v for k, v in inits.items() if k.endswith("zero_point") and k.startswith("w")))
    assert (in_zp == 0) == (case in ("in_zp=0", "both=0"))
    assert (w_zp == 0) == (case != "w_zp!=0")
    assert a["weight_zp"] == 0                             # folded into the weights
    assert ("xi16>" in wtype) == (w_zp != 0)              # i16 only when w_zp != 0 (seed §4.3.1)
    r = __import__("torq.verify", fromlist=["verify"]).verify(c)
    assert r.ok, r


def test_zero_point_fold_matches_expansion():
    """correct = conv(x, w) - in_zp·Σw - w_zp·Σx + in_zp·w_zp·K, on integers (seed §4.2)."""
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (1, 3, 5, 5))
    w = rng.integers(-128, 128, (4, 3, 3, 3))
    in_zp, w_zp = 7, -3
    ref = np.einsum("nchw,ochw->no", (x[:, :, :3, :3] - in_zp), (w - w_zp))
    w_adj = w - w_zp
    bias = -in_zp * w_adj.reshape(4, -1).sum(1)
    acc = kernels.conv2d_acc(x[:, :, :3, :3], w_adj, bias, (0, 0, 0, 0), in_zp, 1, 1, 1)
    assert acc.reshape(1, 4).tolist() == ref.tolist()


@pytest.mark.parametrize("lo,hi", [(-1.0, 1.0), (-0.5, 1.5)])   # zero points 0 / non-zero
def test_dynamic_weight_conv(lo, hi):
    """Weights that are a graph input (seed §4.5.4): w' and -in_zp·Σw' computed by NPU ops."""
    from qmodels import model
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
              [("x", [1, 3, 6, 6]), ("w", [4, 3, 3, 3])], ["y"], {})
    q = quantize(m, {"x": [1, 3, 6, 6], "w": [4, 3, 3, 3]}, lo=lo, hi=hi)
    c = compile(q)
    assert c.report.unsupported == []
    assert c.report.lowered.get("reduce") == 1 and c.report.lowered.get("conv2d") == 1
    text = c.ir("torq_hl")
    w_zp = int(re.search(r"conv_2d_nchw_fchw_q.*?%c(-?\d+)_i32, %c(-?\d+)_i32", c.ir("linalg")).group(2))
    assert ("xi16>" in text) == (w_zp != 0)
    for seed in (0, 1):
        r = __import__("torq.verify", fromlist=["verify"]).verify(c, seed=seed)
        assert r.ok and all(o.exact for o in r.outputs), r
