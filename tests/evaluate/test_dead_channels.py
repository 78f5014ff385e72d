"""Dead (dust-weight) conv channels are zeroed so per-channel int32 biases do not saturate."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from torq.quantize import quantize
from torq.quantize.dead_channels import zero_dead_channels


def _model():
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.2, (4, 3, 1, 1)).astype(np.float32)
    w[2] = rng.normal(0, 1e-8, (3, 1, 1))            # what BatchNorm folding leaves of a dead channel
    b = np.array([0.1, -0.2, -1.3, 0.4], np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _bias_q(q):
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    return next(v for k, v in inits.items() if v.dtype == np.int32 and v.shape == (4,))


def test_dead_channel_zeroed_and_bias_no_longer_saturates():
    fp32 = _model()
    fixed, n = zero_dead_channels(fp32)
    assert n == 1
    unfixed = quantize(fp32, per_channel=True, num_calib=4, dead_channels=False)
    assert np.abs(_bias_q(unfixed)).max() > 2**30   # the fault: ~int32 max
    assert np.abs(_bias_q(quantize(fixed, per_channel=True, num_calib=4, dead_channels=False))).max() < 2**20
    assert np.abs(_bias_q(quantize(fp32, per_channel=True, num_calib=4))).max() < 2**20   # the front end's default
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 4, 4)).astype(np.float32)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(run(fp32) - run(fixed)).max() < 1e-6
