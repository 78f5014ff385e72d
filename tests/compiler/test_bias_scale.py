"""The lecture's trap (seed 002): a bias whose scale is not S_W·S_X.

The NSS adds the bias to the integer accumulator, so it must be an integer in the accumulator
scale. It is moved there exactly, or the layer is refused with the reason -- never compiled as if
the scales were equal. The truth is the ONNX definition (ORT with graph optimisations off: DQ →
float op → Q); ORT's fused integer kernels ignore the bias scale, so the reference runs such a
model unfused.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import torq
from torq.errors import TorqError
from torq import reference

F32 = np.float32
S_X, Z_X, S_W, S_Y, Z_Y = 0.05, 10, 0.01, 0.004, -128


def _model(op_nodes, x_shape, y_shape, inits, name):
    g = helper.make_graph(op_nodes, name, [helper.make_tensor_value_info("x", TensorProto.INT8, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.INT8, y_shape)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _qdq(op, w, w_scale, bias_q, bias_scale, x_shape, y_shape, y_scale=S_Y, y_zp=Z_Y, **attrs):
    inits = {"w_q": np.asarray(w, np.int8), "w_s": np.asarray(w_scale, F32), "w_z": np.zeros(np.shape(w_scale), np.int8),
             "b_q": np.asarray(bias_q), "b_s": np.asarray(bias_scale, F32),
             "b_z": np.zeros(np.shape(bias_scale), np.asarray(bias_q).dtype),
             "x_s": F32(S_X), "x_z": np.int8(Z_X), "y_s": F32(y_scale), "y_z": np.int8(y_zp)}
    axis = {"axis": 0} if np.ndim(w_scale) else {}
    nodes = [helper.make_node("DequantizeLinear", ["x", "x_s", "x_z"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["wf"], **axis),
             helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["bf"], **axis),
             helper.make_node(op, ["xf", "wf", "bf"], ["yf"], **attrs),
             helper.make_node("QuantizeLinear", ["yf", "y_s", "y_z"], ["y"])]
    return _model(nodes, x_shape, y_shape, inits, op.lower())


def lecture_fc(bias_q, bias_scale, w=((20,), (-10,))):
    """The lecture's FC layer: q_W [20, -10] (S_W 0.01), x with S_X 0.05, Z_X 10, S_Y 0.004, Z_Y -128."""
    w = np.asarray(w, np.int8)
    return _qdq("Gemm", w, F32(S_W), bias_q, bias_scale, [1, 2], [1, w.shape[1]])


def onnx_semantics(m, x):
    return reference.run(m, x, reference.session(m, fused=False))["y"]


GRID = {"x": np.random.default_rng(0).integers(-128, 128, (4096, 2)).astype(np.int8)}


def _grid_model(m):
    """The same layer with a batch of 4096 rows (the grid of the seed audit)."""
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    for vi in (m2.graph.input[0], m2.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_value = 4096
    return m2


@pytest.mark.parametrize("case,bias_q,bias_scale", [
    ("int8 bias at |b|/127", np.array([127], np.int8), F32(0.3 / 127)),
    ("int32 bias at 2·S_W·S_X", np.array([300], np.int32), F32(2 * S_W * S_X)),
])
def test_lecture_bias_is_rescaled_exactly(case, bias_q, bias_scale):
    m = lecture_fc(bias_q, bias_scale)
    x = {"x": np.array([[30, 14]], np.int8)}
    assert onnx_semantics(m, x).item() == -8                         # the lecture's answer
    assert torq.compile(m).run(x)["y"].item() == -8, case
    assert reference.run(m, x)["y"].item() == -8                     # the reference runs it unfused
    g = _grid_model(m)
    nss, ref = torq.compile(g).run(GRID)["y"], onnx_semantics(g, GRID)
    assert np.abs(nss.astype(int) - ref.astype(int)).max() <= 1, case   # ±1: NTP vs float rounding
    assert (nss != ref).mean() < 0.05          # ties (M = 0.125 is dyadic): NTP up, float RNE to even


def test_the_fused_ort_kernel_is_what_went_wrong():
    """Why the reference runs such a model unfused: ORT's QGemm adds q_b as if S_b = S_W·S_X."""
    m = lecture_fc(np.array([300], np.int32), F32(2 * S_W * S_X))
    assert reference.bias_scale_mismatch(m) == "Gemm" or reference.bias_scale_mismatch(m)
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.add_session_config_entry("session.qdqisint8allowed", "1")
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": np.array([[30, 14]], np.int8)})[0].item() == -46
    assert reference.bias_scale_mismatch(lecture_fc(np.array([600], np.int32), F32(S_W * S_X))) is None


def test_a_bias_with_no_integer_in_the_accumulator_scale_is_refused():
    m = lecture_fc(np.array([127, 72], np.int8), F32(0.3 / 127), w=((20, 5), (-10, 7)))
    with pytest.raises(TorqError, match=r"bias scale is 4.7244\d* x input_scale·weight_scale.*channel 1: 72 x"):
        torq.compile(m).run({"x": np.array([[30, 14]], np.int8)})


def _conv(bias_q, bias_scale, w_scale):
    rng = np.random.default_rng(3)
    w = rng.integers(-20, 21, (3, 2, 3, 3)).astype(np.int8)
    return _qdq("Conv", w, w_scale, bias_q, bias_scale, [1, 2, 6, 6], [1, 3, 6, 6], y_scale=0.1, y_zp=0,
                kernel_shape=[3, 3], pads=[1] * 4)


@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_bias_at_twice_the_accumulator_scale(per_channel):
    w_scale = np.array([0.01, 0.02, 0.005], F32) if per_channel else F32(S_W)
    acc = np.asarray(F32(S_X) * np.asarray(w_scale, F32), F32)
    m = _conv(np.array([1500, -400, 3333], np.int32), (2 * acc).astype(F32), w_scale)
    x = {"x": np.random.default_rng(1).integers(-128, 128, (1, 2, 6, 6)).astype(np.int8)}
    nss, ref = torq.compile(m).run(x)["y"], onnx_semantics(m, x)
    assert np.abs(nss.astype(int) - ref.astype(int)).max() <= 1
    assert 0.2 < ((nss > -128) & (nss < 127)).mean()                     # mostly unsaturated
    as_if_equal = _conv(np.array([1500, -400, 3333], np.int32), acc, w_scale)   # the trap's result
    assert np.abs(torq.compile(as_if_equal).run(x)["y"].astype(int) - ref.astype(int)).max() > 1


def test_conv_bias_off_the_accumulator_grid_is_refused():
    m = _conv(np.array([150, -40, 33], np.int32), F32(S_X * S_W * 1.37), F32(S_W))
    with pytest.raises(TorqError, match="not an integer in the accumulator scale"):
        torq.compile(m).run({"x": np.zeros((1, 2, 6, 6), np.int8)})
